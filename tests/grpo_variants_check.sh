#!/bin/sh
# NeMo RL's GRPO variants through `dsarl run` on the tiny recipe: one short run each (random init; DAPO's overlong
# shaping gives the rewards a spread, two optimizer slices per step make the second one off-policy, a tight clip
# makes the clip fractions nonzero), with a check of what distinguishes the variant from plain GRPO; then the
# combinations NeMo RL forbids, each refused with one line and exit status 3 before any step.
# Usage: grpo_variants_check.sh BUILD_DIR SOURCE_DIR. Skipped (77) without the generation plugin.
set -eu
build=$1 src=$2
[ -e "$build/lib/dsarl/plugins/dsarl-generation-native.so" ] || { echo "no generation plugin built; skipped"; exit 77; }
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
recipe=$src/configs/recipes/llm/grpo-glm5.2-tiny.yaml
common="policy.model_name=null grpo.val_period=0 grpo.val_at_start=false grpo.val_at_end=false runtime.threads=1
        checkpointing.enabled=false grpo.reward_shaping.enabled=true grpo.reward_shaping.max_response_length=16
        grpo.reward_shaping.overlong_buffer_length=12 policy.train_global_batch_size=32
        loss_fn.ratio_clip_min=0.002 loss_fn.ratio_clip_max=0.002"

# run NAME STEPS OVERRIDES...: the metrics land in $d/NAME.jsonl
run() {
  name=$1 steps=$2
  shift 2
  # shellcheck disable=SC2086
  "$build/bin/dsarl" run "$recipe" grpo.max_num_steps="$steps" logger.log_dir="$d/$name" $common "$@" \
    > "$d/$name.out" 2> "$d/$name.err" || { echo "$name: exit status $?"; cat "$d/$name.err"; exit 1; }
  cp "$d/$name/exp_001/metrics.jsonl" "$d/$name.jsonl"
}

run plain 1
run seq_plain 1 loss_fn.token_level_loss=false
run gspo 1 loss_fn.sequence_level_importance_ratios=true loss_fn.token_level_loss=false
run cispo 1 loss_fn.use_cispo=true
run reinforce 1 loss_fn.disable_ppo_ratio=true
run vapo 1 loss_fn.positive_example_nll_weight=0.1 grpo.reward_shaping.enabled=false \
  grpo.reward_scaling.enabled=true grpo.reward_scaling.target_min=0.5
run rpp 2 ++grpo.adv_estimator.name=reinforce_plus_plus
run rpp_kl 2 ++grpo.adv_estimator.name=reinforce_plus_plus loss_fn.use_kl_in_reward=true \
  loss_fn.reference_policy_kl_penalty=0.05 grpo.skip_reference_policy_logprobs_calculation=false
run gdpo 1 ++grpo.adv_estimator.name=gdpo ++grpo.adv_estimator.reward_weights=[1.0,0.5]
run seqmask 1 ++grpo.seq_logprob_error_threshold=1.5
run malformed 1 ++grpo.malformed_thinking_advantage=-1.0 ++grpo.invalid_tool_call_advantage=-5.0

python3 - "$d" <<'PY'
import json, math, sys
d = sys.argv[1]
def rows(name):
    return [json.loads(l) for l in open(f"{d}/{name}.jsonl")]
def m(name, key, step=-1):
    v = rows(name)[step][key]
    assert isinstance(v, (int, float)) and math.isfinite(v), (name, key, v)
    return v
for name in ("plain", "seq_plain", "gspo", "cispo", "reinforce", "vapo", "rpp", "rpp_kl", "gdpo", "seqmask",
             "malformed"):
    for key in ("train/loss", "train/reward", "train/grad_norm", "train/clip_fraction", "train/probs_ratio"):
        m(name, key)
    assert 0.0 <= m(name, "train/clip_fraction") <= 1.0, name
# plain GRPO: ratios near 1 (the second slice is off-policy), the tight clip removes some tokens' gradient
assert 0.9 < m("plain", "train/probs_ratio") < 1.1
assert 0.0 < m("plain", "train/clip_fraction") < 0.5, m("plain", "train/clip_fraction")
# GSPO: one ratio per sequence, clipped as a whole: its loss and clip fraction are not the token ratios'
assert 0.9 < m("gspo", "train/probs_ratio") < 1.1
assert abs(m("gspo", "train/loss") - m("seq_plain", "train/loss")) > 1e-6
assert m("gspo", "train/clip_fraction") != m("seq_plain", "train/clip_fraction")
# CISPO: -A sg(clip(r)) lp, a REINFORCE-sized loss; every token outside the clip counts, whatever A's sign
assert abs(m("cispo", "train/loss") - m("plain", "train/loss")) > 1e-3
assert m("cispo", "train/clip_fraction") > m("plain", "train/clip_fraction")
# REINFORCE: NeMo's probs_ratio is then the mean log-prob, and nothing is clipped
assert m("reinforce", "train/probs_ratio") < 0.0 and m("reinforce", "train/clip_fraction") == 0.0
# VAPO: every reward is 0.5 > 0, the advantages are 0: the loss is 0.1 x the mean NLL, about ln(260) at random init
nll = m("vapo", "train/positive_nll_loss")
assert 4.0 < nll < 7.0, nll
assert abs(m("vapo", "train/loss") - 0.1 * nll) < 1e-4 * nll
assert "train/positive_nll_loss" not in rows("plain")[-1]
# Reinforce++: normalised over tokens, so the per-sequence mean is not 0 as GRPO's; the KL in the reward is 0 at
# step 1 (the policy is the reference) and changes the advantages at step 2; the loss itself has no KL
assert abs(m("plain", "train/advantages/mean")) < 1e-5 and abs(m("rpp", "train/advantages/mean", 0)) > 1e-3
assert m("rpp", "train/advantages/max", 0) == m("rpp_kl", "train/advantages/max", 0)
assert m("rpp", "train/advantages/max", 1) != m("rpp_kl", "train/advantages/max", 1)
assert m("rpp_kl", "train/kl_penalty") == 0.0
# GDPO: the weighted components are z-scored over the batch: mean 0
assert abs(m("gdpo", "train/advantages/mean")) < 1e-5
# sequence masking: the errors are about 1 on-policy, none above 1.5
assert 1.0 <= m("seqmask", "train/mean_seq_mult_prob_error") < 1.01
assert m("seqmask", "train/num_masked_seqs_by_logprob_error") == 0
# message penalties: the byte model writes no <think> or <tool_call> tags, so nothing is penalised, but it is counted
assert m("malformed", "train/malformed_thinking_rate") == 0.0 and m("malformed", "train/num_assistant_messages") == 128
assert m("malformed", "train/invalid_tool_call_rate") == 0.0
assert "train/invalid_tool_call_rate" not in rows("plain")[-1]
print("variant runs OK")
PY

# Refusals: exit status 3, one line naming the key, no step run.
refuse() {
  key=$1
  shift
  rc=0
  # shellcheck disable=SC2086
  "$build/bin/dsarl" run "$recipe" grpo.max_num_steps=1 logger.log_dir="$d/refused" $common "$@" \
    > "$d/refused.out" 2> "$d/refused.err" || rc=$?
  [ $rc -eq 3 ] || { echo "$*: exit status $rc, want 3"; cat "$d/refused.err"; exit 1; }
  [ "$(grep -c 'error' "$d/refused.err")" -eq 1 ] || { echo "$*: not one error line"; cat "$d/refused.err"; exit 1; }
  grep 'error' "$d/refused.err" | grep -q "$key" || { echo "$*: does not name $key"; cat "$d/refused.err"; exit 1; }
  ! grep -q 'step 1' "$d/refused.err" || { echo "$*: a step ran"; exit 1; }
}
refuse loss_fn.token_level_loss loss_fn.sequence_level_importance_ratios=true
refuse loss_fn.disable_ppo_ratio loss_fn.use_cispo=true loss_fn.disable_ppo_ratio=true
refuse loss_fn.ratio_clip_c loss_fn.use_cispo=true loss_fn.ratio_clip_c=3
refuse reinforce_plus_plus loss_fn.use_kl_in_reward=true
refuse grpo.adv_estimator.reward_weights ++grpo.adv_estimator.name=gdpo ++grpo.adv_estimator.reward_weights=[1,2,3]
refuse grpo.seq_logprob_error_threshold ++grpo.seq_logprob_error_threshold=0.5
echo "dsarl run GRPO variants OK"
