#!/usr/bin/env bash
# test_plan.sh BUILD_DIR SOURCE_DIR: `dsarl plan` on the three seed recipes at full GLM-5.1 / GLM-5.2 size: each
# plans as fitting on an H100 80 GB (exit 0, a "fits:" line, a per-GPU total for every pipeline stage), the
# parameters add up to the model, and a layout that cannot work is refused with exit status 3 and one error line
# carrying the number: virtual stages that do not divide a stage, a model split that does not divide, a GPU too
# small. A stage starting on an IndexShare shared layer plans (it receives the top-k), as runs accept it.
set -uo pipefail
build=$1 src=$2
dsarl="$build/bin/dsarl"
recipes="$src/configs/recipes/llm"
failures=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
run() { # want name args...
  local want=$1 name=$2; shift 2
  "$dsarl" plan "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  [ "$got" -eq "$want" ] || fail "$name: exit status $got, wanted $want; stderr: $(head -c 800 "$tmp/err")"
}
one_error() { # name pattern
  local n; n=$(grep -c "error" "$tmp/err")
  [ "$n" -eq 1 ] || fail "$1: expected one error line, got $n: $(cat "$tmp/err")"
  grep -q -- "$2" "$tmp/err" || fail "$1: '$2' not in: $(cat "$tmp/err")"
}

for r in grpo-glm5.1-64n8g-megatron grpo-glm5.2-64n8g-megatron-6K-colocated grpo-glm5.2-72n8g-megatron-noncolocated; do
  run 0 "$r" "$recipes/$r.yaml"
  cp "$tmp/out" "$tmp/$r.out"
  grep -q "^fits: the worst GPU (stage [0-7], layers [0-9]*-[0-9]*) peaks at [0-9.]* GiB of 80.0 GiB" "$tmp/out" ||
    fail "$r: no fits line: $(cat "$tmp/out")"
  rows=$(grep -cE "^  [0-7]\*? +[0-9.]+ " "$tmp/out")
  [ "$rows" -eq 8 ] || fail "$r: expected 8 per-GPU stage rows, got $rows"
  grep -q "^step time (roofline at 989 TFLOP/s" "$tmp/out" || fail "$r: no step time line"
  [ -s "$tmp/err" ] && fail "$r: unexpected stderr: $(cat "$tmp/err")"
  python3 - "$tmp/out" "$r" <<'PY' || fail "$r: figures (see above)"
import re, sys
out = open(sys.argv[1]).read()
rows = [l.split() for l in out.splitlines() if re.match(r"^  [0-7]\*? +[0-9.]+ ", l)]
for row in rows:
    weights, grads, opt, act, comm, cache, reserve, train, gen, peak = map(float, row[2:12])
    assert abs(weights + grads + opt + act + comm + reserve - train) < 0.35, row
    assert peak == max(train, gen) and 0 < peak < 80, row
total = float(re.search(r"; ([0-9.]+) B trainable parameters", out).group(1))
assert 740 < total < 748, f"GLM-5 has about 744 B parameters, the plan says {total}"
# pipeline stages from the recipe: first and last stage sizes, the middle even
stages = [tuple(map(int, m)) for m in re.findall(r"stage \d: layers (\d+)-(\d+) \((\d+)\)", out)]
assert len(stages) == 8 and stages[0][0] == 0 and stages[-1][1] == 77, stages
assert all(b[0] == a[1] + 1 for a, b in zip(stages, stages[1:])), stages
want = (9, 10, 9) if "glm5.1" in sys.argv[2] else (14, 8, 16)
assert stages[0][2] == want[0] and stages[1][2] == want[1] and stages[-1][2] == want[2], stages
assert "holds experts 4*e .. 4*e+3" in out, "EP64 of 256 experts: 4 per rank"
print(sys.argv[2], "ok:", re.search(r"^fits: .*$", out, re.M).group(0))
PY
done
grep -q "^dedicated generation: 64 GPUs" "$tmp/grpo-glm5.2-72n8g-megatron-noncolocated.out" ||
  fail "noncolocated: no dedicated generation row"
grep -q "64 nodes x 8 GPUs for training" "$tmp/grpo-glm5.2-72n8g-megatron-noncolocated.out" ||
  fail "noncolocated: the 8 generation nodes are not taken off training"

# a stage that starts on a shared layer (GLM-5.2: layers 3, 4, 5 reuse layer 2's top-k) plans as the run takes it:
# the stage receives layer 12's 2048 top-k indices per token with its input
run 0 shared-start "$recipes/grpo-glm5.2-64n8g-megatron-6K-colocated.yaml" \
  policy.megatron_cfg.num_layers_in_first_pipeline_stage=13 policy.megatron_cfg.num_layers_in_last_pipeline_stage=17
grep -q "^  stage 1: layers 13-20 (8), receives 2048 top-k indices per token" "$tmp/out" ||
  fail "shared-start: stage 1 does not receive the top-k: $(grep '^  stage' "$tmp/out")"
# interleaved virtual stages: 78 layers = 14 | 8 x 6 | 16 halve into chunks of 7, 4 and 8
run 0 vpp2 "$recipes/grpo-glm5.2-64n8g-megatron-6K-colocated.yaml" +policy.megatron_cfg.virtual_pipeline_model_parallel_size=2
grep -q "^  stage 0: layers 0-6, 39-45 (14), input embedding" "$tmp/out" &&
  grep -q "^  stage 7: layers 31-38, 70-77 (16)" "$tmp/out" ||
  fail "vpp2: chunks not as Megatron cuts them: $(grep '^  stage' "$tmp/out")"
run 3 vpp3 "$recipes/grpo-glm5.2-64n8g-megatron-6K-colocated.yaml" +policy.megatron_cfg.virtual_pipeline_model_parallel_size=3
one_error vpp3 "virtual_pipeline_model_parallel_size 3 does not divide the 14 layers of pipeline stage 0"

# stage sizes that do not leave an even split
run 3 uneven "$recipes/grpo-glm5.1-64n8g-megatron.yaml" policy.megatron_cfg.num_layers_in_first_pipeline_stage=8
one_error uneven "leave 61 layers, which do not split evenly over the other 6"
# experts that do not split over EP (256 over 512 ranks of one stage)
run 3 experts "$recipes/grpo-glm5.1-64n8g-megatron.yaml" policy.megatron_cfg.tensor_model_parallel_size=1 \
  policy.megatron_cfg.pipeline_model_parallel_size=1 policy.megatron_cfg.expert_model_parallel_size=512 \
  policy.train_global_batch_size=512 policy.make_sequence_length_divisible_by=1
one_error experts "routed experts (n_routed_experts) = 256 is not divisible by policy.megatron_cfg.expert_model_parallel_size = 512"
# a layout that does not divide the world
run 3 world "$recipes/grpo-glm5.1-64n8g-megatron.yaml" policy.megatron_cfg.tensor_model_parallel_size=3 \
  policy.make_sequence_length_divisible_by=3
one_error world "= 24 ranks per model replica, which does not divide the 512 processes"
# too small a GPU: the overflow is printed
run 3 small "$recipes/grpo-glm5.1-64n8g-megatron.yaml" --gpu-memory 24
one_error small "the GPUs of pipeline stage 1 (layers 9-18) need [0-9.]* GiB while training, [0-9.]* GiB more than the 24.0 GiB of one GPU"
# no recompute at 128K tokens: the activations overflow
run 3 no-recompute "$recipes/grpo-glm5.2-72n8g-megatron-noncolocated.yaml" policy.megatron_cfg.activation_checkpointing=false
one_error no-recompute "the GPUs of pipeline stage 0 (layers 0-13) need"
# --model-config replaces a recipe's inline config (the tiny recipe planned at full size on 64 x 8 GPUs)
run 0 model-config "$recipes/grpo-glm5.2-tiny.yaml" --model-config "$src/configs/models/GLM-5.2.json" \
  cluster.num_nodes=64 cluster.gpus_per_node=8 policy.megatron_cfg.tensor_model_parallel_size=8 \
  policy.megatron_cfg.expert_model_parallel_size=64 policy.megatron_cfg.sequence_parallel=true \
  policy.make_sequence_length_divisible_by=8 policy.train_micro_batch_size=1
grep -q "(--model-config), its MTP layers not planned: 78 layers (75 MoE, 21 running their indexer)" \
  "$tmp/out" || fail "model-config: the file's config is not the one planned: $(head -3 "$tmp/out")"
# bad options
run 2 option "$recipes/grpo-glm5.1-64n8g-megatron.yaml" --gpu-memory lots
one_error option "dsarl plan: error: --gpu-memory needs a number"
# captured, not piped: under pipefail a grep -q that stops reading early can fail the check with the writer's SIGPIPE
help=$("$dsarl" plan --help) && grep -q "usage: dsarl plan RECIPE" <<<"$help" || fail "help"
help=$("$dsarl" --help) && grep -q "  plan RECIPE" <<<"$help" || fail "dsarl --help does not list plan"

[ "$failures" -eq 0 ] && echo "plan cli: all checks passed"
exit $((failures > 0))
