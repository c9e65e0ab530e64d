#!/usr/bin/env bash
# One H200 call: gpu suites (4 at a time) beside the main job on cuda with no override, then bench train.
set -uo pipefail
cd "$(dirname "$0")"
out=${OUT:-/tmp/out}; mkdir -p "$out"
start=$(date +%s)
[ -d build-gpu-carry/bin ] || tar -xJf .carry/build.tar.xz
export LD_LIBRARY_PATH="$PWD/.deps/lib:$PWD/build-gpu-carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
eval "$(tools/gpu-env)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
build-gpu-carry/bin/dsarl plugins > "$out/plugins.txt" 2>&1
build-gpu-carry/bin/dsarl config show configs/recipes/llm/grpo-glm5.2-tiny.yaml 2>&1 | grep -iE "device|backend|selected" | head -20 > "$out/selection.txt"
GPU_TEST_JOBS=4 OUT="$out" timeout 400 tools/gpu-run test > "$out/gpu-run-test.log" 2>&1 &
tests=$!
( SKIP_BUILD=1 BUILD_DIR=build-gpu-carry RUN_DIR=/tmp/mainjob timeout 430 tools/run-main-job > "$out/main-job.log" 2>&1;
  echo "main job exit $? after $(( $(date +%s) - start )) s" >> "$out/main-job.log" ) &
main=$!
wait $tests; echo "gpu-run test exit $? after $(( $(date +%s) - start )) s" >> "$out/gpu-run-test.log"
wait $main
cp /tmp/mainjob/grpo/logs/exp_001/metrics.jsonl "$out/main-grpo-metrics.jsonl" 2>/dev/null
cp /tmp/mainjob/sft/logs/exp_001/metrics.jsonl "$out/main-sft-metrics.jsonl" 2>/dev/null
left=$(( 570 - ($(date +%s) - start) ))
echo "left for bench: $left s"
if [ $left -gt 60 ]; then
  timeout $((left - 10)) build-gpu-carry/bin/dsarl bench train --config glm5.2-3b --steps 3 > "$out/bench-train.log" 2>&1
  echo "bench exit $?" >> "$out/bench-train.log"
fi
grep -E "Test +#|tests passed|tests failed|exit" "$out/gpu-run-test.log" | tail -12
tail -6 "$out/main-job.log"
tail -15 "$out/bench-train.log" 2>/dev/null
