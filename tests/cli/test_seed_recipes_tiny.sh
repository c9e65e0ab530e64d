#!/usr/bin/env bash
# NeMo RL's three GLM recipes (configs/recipes/llm/*-megatron*.yaml) run end to end at tiny scale through
# tools/run-seed-recipes-tiny: 2 GRPO steps each from a short SFT of our tiny GLM-5.1/5.2, every recipe key kept but
# the model, tokenizer, data, lengths and validation size. Each run must exit 0, train on some samples (non-zero
# rewards), log token_mult_prob_error within 1e-3 of 1 (generation and training share the kernels) and use the
# expected device and DSA backend.
#   test_seed_recipes_tiny.sh BUILD_DIR SOURCE_DIR cpu   # runtime.device=cpu, dsa reference (cudnn needs cuda)
#   test_seed_recipes_tiny.sh BUILD_DIR SOURCE_DIR cuda  # the recipes' own dsa_kernel_backend (cudnn); exit 77
#                                                        # (skipped) without a GPU
set -uo pipefail
build=$1 src=$2 mode=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ "$mode" = cuda ]; then
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "skipped: no GPU visible"
    exit 77
  fi
  args=(runtime.device=cuda)
  want="device cuda, dsa cudnn"
else
  args=(runtime.device=cpu policy.megatron_cfg.model_overrides.dsa_kernel_backend=reference)
  want="device cpu, dsa reference"
fi
# on the cpu the two models' lanes run side by side: the test is the longest of the unit label, so on a 2-core CI
# its wall time is what the label's stage waits for
jobs=1
[ "$mode" = cpu ] && jobs=2
out=$(SEED_JOBS=$jobs "$src/tools/run-seed-recipes-tiny" "$build" "$tmp" "${args[@]}")
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: $rc recipe(s) failed"; exit 1; }
for name in grpo-glm5.1-64n8g-megatron grpo-glm5.2-64n8g-megatron-6K-colocated \
            grpo-glm5.2-72n8g-megatron-noncolocated; do
  line=$(echo "$out" | grep "^$name: ") || { echo "FAIL: no result for $name"; exit 1; }
  echo "$line" | python3 -c '
import re, sys
line, want = sys.stdin.read(), sys.argv[1]
m = re.search(r"exit 0, 2 steps, (\d+) trained samples, mean reward ([0-9.]+), token_mult_prob_error ([0-9.]+)\.\.([0-9.]+), (.*)$", line)
assert m, "unexpected summary: " + line
samples, reward, lo, hi, where = int(m[1]), float(m[2]), float(m[3]), float(m[4]), m[5].strip()
assert samples > 0 and reward > 0, "nothing trained: " + line
assert abs(lo - 1) < 1e-3 and abs(hi - 1) < 1e-3, "token_mult_prob_error off 1: " + line
assert where == want, f"ran on {where!r}, expected {want!r}"
' "$want" || { echo "FAIL: $name"; exit 1; }
done
echo "seed recipes ok ($mode)"
