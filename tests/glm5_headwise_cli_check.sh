#!/bin/sh
# `dsarl run` with policy.megatron_cfg.model_overrides.dsa_attention_form end to end on the cpu device (reference
# DSA backend): the tiny SFT recipe for 3 steps in the absorbed and the forced per-head form logs the same loss,
# gradient norm and indexer loss; 2 tiny GRPO steps in the per-head form give token_mult_prob_error 1 (the training
# pass's per-head log-probabilities equal the absorbed cached decode's of the same samples); a bad value exits 3
# naming the key. Usage: glm5_headwise_cli_check.sh BUILD_DIR SOURCE_DIR. Skipped (77) without the generation
# plugin.
set -eu
build=$1 src=$2
[ -e "$build/lib/dsarl/plugins/dsarl-generation-native.so" ] || { echo "no generation plugin built; skipped"; exit 77; }
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
key=policy.megatron_cfg.model_overrides.dsa_attention_form
for form in absorbed headwise; do
  "$build/bin/dsarl" run "$src/configs/recipes/llm/sft-glm5.2-tiny.yaml" sft.max_num_steps=3 sft.val_period=0 \
    sft.val_at_start=false sft.val_at_end=false policy.megatron_cfg.scheduler.lr_warmup_iters=1 \
    checkpointing.enabled=false runtime.threads=1 logger.log_dir="$d/sft-$form" "+$key=$form" 2> "$d/sft-$form.log" ||
    { cat "$d/sft-$form.log"; exit 1; }
done
python3 - "$d/sft-absorbed/exp_001/metrics.jsonl" "$d/sft-headwise/exp_001/metrics.jsonl" <<'PY'
import json, sys
absorbed, headwise = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert [r["step"] for r in absorbed] == [1, 2, 3] == [r["step"] for r in headwise], (absorbed, headwise)
worst = 0.0
for a, h in zip(absorbed, headwise):
    for k in ("train/loss", "train/grad_norm", "train/indexer_loss"):
        gap = abs(a[k] - h[k]) / abs(a[k])
        worst = max(worst, gap)
        assert a[k] > 0 and gap < 1e-5, (k, a[k], h[k])
print("sft: absorbed vs headwise loss / grad norm / indexer loss, worst relative difference %.3g" % worst)
PY
"$build/bin/dsarl" run "$src/configs/recipes/llm/grpo-glm5.2-tiny.yaml" grpo.max_num_steps=2 grpo.val_period=0 \
  grpo.val_at_start=false grpo.val_at_end=false policy.model_name=null checkpointing.enabled=false runtime.threads=1 \
  logger.log_dir="$d/grpo" "+$key=headwise" 2> "$d/grpo.log" || { cat "$d/grpo.log"; exit 1; }
python3 - "$d/grpo/exp_001/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == [1, 2], rows
for r in rows:
    assert abs(r["train/token_mult_prob_error"] - 1.0) <= 1e-5, r["train/token_mult_prob_error"]
print("grpo headwise: token_mult_prob_error", [r["train/token_mult_prob_error"] for r in rows])
PY
status=0
"$build/bin/dsarl" run "$src/configs/recipes/llm/sft-glm5.2-tiny.yaml" checkpointing.enabled=false \
  logger.log_dir="$d/bad" "+$key=fused" 2> "$d/bad.log" || status=$?
[ $status -eq 3 ] || { cat "$d/bad.log"; echo "a bad $key exited $status, not 3"; exit 1; }
grep -q "$key must be auto, absorbed or headwise" "$d/bad.log" || { cat "$d/bad.log"; exit 1; }
echo "glm5_headwise_cli: ok"
