#!/usr/bin/env bash
# test_dp_grpo_variants.sh BUILD_DIR SOURCE_DIR MPIEXEC: NeMo RL's GRPO variants whose data cross ranks, under DP2
# against the one-process run (every logged train metric of every step and the sample dumps equal, as
# test_dp_grpo.sh checks plain GRPO): Reinforce++ with the KL in the reward (old and reference log-probs gathered
# before training), GDPO (the reward vectors gathered with the rollouts), and sequence masking with VAPO's NLL term
# (masks and positive-token counts over the global batch), token-level; multi-turn episodes (the turn loop). GSPO, CISPO and REINFORCE keep no state
# across ranks beyond the plain loss's; their near-cancelling sequence-level losses differ from one process by float
# rounding (1e-8 absolute) that dp_compare's relative tolerance would flag, so they are not repeated here.
set -uo pipefail
build=$1 src=$2 mpiexec=$3
dsarl="$build/bin/dsarl"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpi=("$mpiexec" --oversubscribe)
"$mpiexec" --version 2>/dev/null | grep -q "Open MPI\|OpenRTE" || mpi=("$mpiexec")
fail() { echo "FAIL: $*"; exit 1; }

recipe="$src/configs/recipes/llm/grpo-glm5.2-tiny.yaml"
common=(grpo.num_prompts_per_step=4 grpo.num_generations_per_prompt=4 policy.train_global_batch_size=8
        policy.train_micro_batch_size=2 grpo.val_period=0 grpo.val_at_start=false grpo.val_at_end=false
        runtime.device=cpu policy.megatron_cfg.model_overrides.dsa_kernel_backend=reference
        grpo.reward_shaping.enabled=true grpo.reward_shaping.overlong_buffer_length=12
        grpo.reward_shaping.max_response_length=16 "policy.generation.stop_token_ids=[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14]"
        checkpointing.enabled=false grpo.max_num_steps=2)

# run NAME NP ARGS...: one `dsarl run` (under mpirun when NP > 1) logging into $tmp/NAME
run() {
  local name=$1 np=$2
  shift 2
  local launch=()
  [ "$np" -gt 1 ] && launch=("${mpi[@]}" -np "$np")
  (cd "$tmp" && "${launch[@]}" "$dsarl" run "$recipe" "${common[@]}" "logger.log_dir=$tmp/$name" \
      "cluster.gpus_per_node=$np" "$@") >"$tmp/$name.log" 2>&1 || { local rc=$?; cat "$tmp/$name.log"; fail "$name exited $rc"; }
}
same() { python3 "$src/tests/cli/dp_compare.py" metrics "$tmp/$1" "$tmp/$2" || fail "$1 and $2 differ"; }
# pair NAME ARGS...: one process and DP2 with the same overrides agree
pair() {
  local name=$1
  shift
  run "${name}_one" 1 "$@"
  run "${name}_dp2" 2 "$@"
  same "${name}_one" "${name}_dp2"
}

pair rpp_kl ++grpo.adv_estimator.name=reinforce_plus_plus loss_fn.use_kl_in_reward=true \
  loss_fn.reference_policy_kl_penalty=0.05 grpo.skip_reference_policy_logprobs_calculation=false
pair gdpo ++grpo.adv_estimator.name=gdpo "++grpo.adv_estimator.reward_weights=[1.0,0.5]"
# rewards mapped onto [1, 2] before the shaping, so most stay > 0 and the NLL term trains on them
pair masked ++grpo.seq_logprob_error_threshold=1.5 loss_fn.positive_example_nll_weight=0.1 \
  grpo.reward_scaling.enabled=true grpo.reward_scaling.target_min=1.0 grpo.reward_scaling.target_max=2.0
# multi-turn episodes with the calculator environment: the turn loop agrees across ranks (the random policy makes no
# tool call, so the episodes end in their first turn; check_grpo_run covers longer ones in one process)
pair turns grpo.max_rollout_turns=3 ++data.env_name=calculator "++policy.generation.stop_strings=[</calc>]"
grep -q '"train/avg_turns_per_sample"' "$tmp"/turns_one/exp_*/metrics.jsonl || fail "no turn metrics"
grep -q '"train/num_masked_seqs_by_logprob_error"' "$tmp"/masked_one/exp_*/metrics.jsonl || fail "no masking metric"
grep -q '"train/positive_nll_loss": [1-9]' "$tmp"/masked_one/exp_*/metrics.jsonl || fail "the NLL term trained on nothing"
echo "data-parallel GRPO variants equal one process"
