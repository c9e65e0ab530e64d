#!/usr/bin/env bash
# NeMo RL's GLM-5.1 recipe (vendored, unchanged) resolves with the reward it inherits from NeMo RL's base,
# env.math.math_verify_impl: hf_math_verify, and runs one GRPO step at tiny scale with it
# (tests/fixtures/math_verify/grpo-glm5.1-nemo-tiny.yaml replaces only what a one-process CPU run must).
#   test_nemo_hf_math_verify.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1 src=$2
dsarl=$build/bin/dsarl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
nemo="$src/tests/fixtures/nemo_rl/examples/configs/recipes/llm/grpo-glm5.1-64n8g-megatron.yaml"
tiny="$src/tests/fixtures/math_verify/grpo-glm5.1-nemo-tiny.yaml"
[ -f "$nemo" ] && [ -f "$tiny" ] || fail "missing $nemo or $tiny"

# the recipe as NeMo RL ships it: hf_math_verify, from grpo_math_1B.yaml
"$dsarl" config show "$nemo" >"$tmp/show" 2>&1 || fail "config show $nemo: $(tail -n 2 "$tmp/show")"
grep -E "math_verify_impl: hf_math_verify +# .*grpo_math_1B.yaml:[0-9]+:[0-9]+" "$tmp/show" >/dev/null ||
  fail "the NeMo GLM-5.1 recipe does not resolve to hf_math_verify from grpo_math_1B.yaml"
# the tiny overlay keeps it
"$dsarl" config show "$tiny" >"$tmp/show_tiny" 2>&1 || fail "config show $tiny"
grep -E "math_verify_impl: hf_math_verify +# .*grpo_math_1B.yaml" "$tmp/show_tiny" >/dev/null ||
  fail "the tiny overlay changed env.math.math_verify_impl"

# one GRPO step, rewards from hf_math_verify
(cd "$tmp" && "$dsarl" run "$tiny" >"$tmp/run.log" 2>&1) || fail "dsarl run: $(tail -n 3 "$tmp/run.log")"
grep -q "math environment: hf_math_verify" "$tmp/run.log" || fail "the run did not use hf_math_verify"
metrics=$(ls "$tmp"/logs/nemo-glm5.1-tiny/exp_*/metrics.jsonl 2>/dev/null | head -n 1)
[ -n "$metrics" ] || fail "no metrics.jsonl"
python3 - "$metrics" <<'PY' || fail "metrics"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [r for r in rows if r.get("train/reward") is not None]
assert len(steps) == 1, f"expected 1 step, got {len(steps)}"
r = steps[0]
assert 0.0 <= r["train/reward"] <= 1.0 and r.get("train/verifier_failures", 0) == 0, r
PY
echo "nemo glm5.1 recipe with hf_math_verify ok"
