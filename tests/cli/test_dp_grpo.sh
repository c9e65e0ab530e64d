#!/usr/bin/env bash
# test_dp_grpo.sh BUILD_DIR SOURCE_DIR MPIEXEC: data-parallel GRPO through `dsarl run` under mpirun against the
# one-process run of the same tiny GLM-5.2 / GLM-5.1 recipe. Rewards come from the overlong shaping on responses
# that end early (stop ids 0..14 of the byte tokenizer), so advantages, the loss and the gradient are not zero.
#   - DP2 with the distributed optimizer, DP2 without it, DP4 and DP2 with a reference-policy KL penalty (two
#     optimizer slices per step, so old log-probs come from their own pass): every logged train/val metric of every step
#     (reward, loss, grad norm, token counts, advantages ...; timings excepted) equals the one-process run's, and
#     the sample dumps are the same;
#   - with a trained MTP layer and routing replay, DP2 logs the same MTP loss as one process, and in both runs the
#     trainer's log-probs are the engine's to float rounding at every step (the replayed rows cross ranks);
#   - checkpoints under DP2: a run stopped after 2 steps and resumed to 3 equals the uninterrupted one-process run,
#     and the step directory holds one optimizer shard per rank;
#   - each refusal of a batch that does not split over dp (and of routing replay under context parallelism) names its
#     keys, and fails before any model is built;
#   - routing replay under expert parallelism (EP2), tensor parallelism with sequence parallelism (TP2) and pipeline
#     parallelism (PP2) logs what one process logs, the trainer agreeing with the engine.
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
        policy.train_micro_batch_size=2 grpo.val_period=0 grpo.val_at_start=false grpo.val_at_end=true
        grpo.val_batch_size=4 grpo.max_val_samples=4 grpo.val_num_generations_per_prompt=2 runtime.device=cpu
        policy.megatron_cfg.model_overrides.dsa_kernel_backend=reference
        grpo.reward_shaping.enabled=true grpo.reward_shaping.overlong_buffer_length=12
        grpo.reward_shaping.max_response_length=16 "policy.generation.stop_token_ids=[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14]"
        checkpointing.enabled=false)

# run NAME NP ARGS...: one `dsarl run` (under mpirun when NP > 1) logging into $tmp/NAME
run() {
  local name=$1 np=$2
  shift 2
  local launch=()
  [ "$np" -gt 1 ] && launch=("${mpi[@]}" -np "$np")
  (cd "$tmp" && "${launch[@]}" "$dsarl" run "$recipe" "${common[@]}" "logger.log_dir=$tmp/$name" \
      "cluster.gpus_per_node=$np" "$@") >"$tmp/$name.log" 2>&1 || { local rc=$?; cat "$tmp/$name.log"; fail "$name exited $rc"; }
}

# same A B [STEP]: metrics.jsonl of runs A and B agree (only step STEP when given), and so do the sample dumps
same() { python3 "$src/tests/cli/dp_compare.py" metrics "$tmp/$1" "$tmp/$2" "${3:-}" || fail "$1 and $2 differ"; }

# --- DP against one process: GLM-5.2 ------------------------------------------------------------------------------
run one 1 grpo.max_num_steps=2
grep -q '"train/grad_norm": [1-9]\|"train/grad_norm": 0\.[0-9]*[1-9]' "$tmp"/one/exp_*/metrics.jsonl || fail "no gradient"
python3 -c "
import glob, json, sys
r = [json.loads(l) for l in open(glob.glob('$tmp/one/exp_*/metrics.jsonl')[0])]
assert all(x['train/advantages/max'] > 0 and x['train/loss'] != 0 for x in r), 'the runs train on nothing: ' + str(r)
" || fail "the reference run has no advantages"
run dp2 2 grpo.max_num_steps=2
same one dp2
grep -q "distributed optimizer" "$tmp/dp2.log" || fail "dp2 did not shard the optimizer"
run dp2_replicated 2 grpo.max_num_steps=2 \
  +policy.megatron_cfg.distributed_data_parallel_config.use_distributed_optimizer=false
same one dp2_replicated
run dp4 4 grpo.max_num_steps=2
same one dp4
# a trained MTP layer: each microbatch's MTP loss counts its response tokens over the slice's valid tokens, so
# DP2 logs the same train/mtp_loss (and everything else) as one process. With routing replay: the trainer scores
# every token through the experts and keys the engine chose, whichever rank generated it (the rows cross ranks with
# the rollout gather), so each run's gen_kl_error is float rounding at every step. Without replay a top-k near-tie
# that the engine's and the trainer's GEMM shapes round apart (the BLAS picks kernels by shape and by machine) can
# score one token through other keys in one layout only: this DP2 run without replay does so at step 2 on some
# machines (gen_kl_error 2e-6 against 1e-14), while the comparison of layouts alone passes where the rounding
# lines up. The MTP depths, which no cached pass runs, are neither recorded nor replayed.
mtp=(grpo.max_num_steps=3 +policy.model_config.num_nextn_predict_layers=1 +policy.megatron_cfg.mtp_num_layers=1
     +policy.router_replay.enabled=true +policy.dsa_index_replay.enabled=true)
run mtp_one 1 "${mtp[@]}"
run mtp_dp2 2 "${mtp[@]}"
grep -q '"train/mtp_loss"' "$tmp"/mtp_one/exp_*/metrics.jsonl || fail "no train/mtp_loss logged"
same mtp_one mtp_dp2
for r in mtp_one mtp_dp2; do
  python3 "$src/tests/cli/dp_compare.py" agree "$tmp/$r" || fail "$r: the trainer disagrees with the engine"
done
[ "$(ls -d "$tmp"/dp2/exp_* | wc -l)" -eq 1 ] || fail "more than one rank logged"
# routing and index replay under expert parallelism (EP2 over the two data-parallel ranks): each rank replays its
# own tokens' rows before they go to the experts' owners, so the run logs what one process logs and the trainer
# agrees with the engine at every step
rep=(grpo.max_num_steps=3 +policy.router_replay.enabled=true +policy.dsa_index_replay.enabled=true)
run rep_one 1 "${rep[@]}"
run rep_ep2 2 "${rep[@]}" policy.megatron_cfg.expert_model_parallel_size=2
same rep_one rep_ep2
# and under TP2 with sequence parallelism: each rank's MoE replays its block of the rows (the batch padded to a
# multiple of 2 where it is odd), its indexer every row
run rep_tp2 2 "${rep[@]}" policy.megatron_cfg.tensor_model_parallel_size=2 policy.megatron_cfg.sequence_parallel=true
same rep_one rep_tp2
# and under PP2: the engine's stages each record their own layers, merged over the stages after every cached pass
run rep_pp2 2 "${rep[@]}" policy.megatron_cfg.pipeline_model_parallel_size=2
same rep_one rep_pp2
for r in rep_one rep_ep2 rep_tp2 rep_pp2; do
  python3 "$src/tests/cli/dp_compare.py" agree "$tmp/$r" || fail "$r: the trainer disagrees with the engine"
done

# a reference policy with a KL penalty, log-prob passes of 3 sequences (not a divisor of the shares)
kl=(loss_fn.reference_policy_kl_penalty=0.05 grpo.skip_reference_policy_logprobs_calculation=false
    policy.logprob_batch_size=3)
run one_kl 1 grpo.max_num_steps=2 "${kl[@]}"
run dp2_kl 2 grpo.max_num_steps=2 "${kl[@]}"
same one_kl dp2_kl
grep -q '"train/kl_penalty": [1-9]\|"train/kl_penalty": 0\.0*[1-9]' "$tmp"/one_kl/exp_*/metrics.jsonl ||
  fail "the KL run has no KL penalty"

# --- GLM-5.1 ------------------------------------------------------------------------------------------------------
run one51 1 grpo.max_num_steps=2 policy.model_family=glm5.1 policy.model_config.index_topk_freq=1
run dp2_51 2 grpo.max_num_steps=2 policy.model_family=glm5.1 policy.model_config.index_topk_freq=1
same one51 dp2_51

# --- checkpoints under DP2: stop after 2 steps, resume to 3, equal the uninterrupted one-process run ---------------
run one3 1 grpo.max_num_steps=3
ck=(checkpointing.enabled=true "checkpointing.checkpoint_dir=$tmp/ck" checkpointing.save_period=1
    checkpointing.keep_top_k=null)
run dp2_ck 2 grpo.max_num_steps=2 "${ck[@]}"
for r in 0 1; do
  [ -f "$tmp/ck/step_2/policy/optimizer/optimizer.shard$r-of-2.safetensors" ] || fail "no optimizer shard $r"
done
grep -q "shard0-of-2" "$tmp/ck/step_2/manifest.json" && grep -q "shard1-of-2" "$tmp/ck/step_2/manifest.json" ||
  fail "the manifest does not list both shards"
run dp2_ck 2 grpo.max_num_steps=3 "${ck[@]}"
grep -q "resumed from .*step_2" "$tmp/dp2_ck.log" || { cat "$tmp/dp2_ck.log"; fail "the DP2 run did not resume"; }
same one3 dp2_ck 3
# the same checkpoint refuses a one-process resume: its optimizer state is sharded
(cd "$tmp" && "$dsarl" run "$recipe" "${common[@]}" "logger.log_dir=$tmp/one_ck" grpo.max_num_steps=3 "${ck[@]}") \
  >"$tmp/one_ck.log" 2>&1 && fail "a one-process run resumed a DP2 optimizer shard"
grep -q "data-parallel size" "$tmp/one_ck.log" || { cat "$tmp/one_ck.log"; fail "the layout refusal does not say why"; }

# --- refusals -----------------------------------------------------------------------------------------------------
# refuse NAME WANT ARGS...: a DP2 run exits non-zero with WANT in its output, before any model is built
refuse() {
  local name=$1 want=$2
  shift 2
  (cd "$tmp" && "${mpi[@]}" -np 2 "$dsarl" run "$recipe" "${common[@]}" "logger.log_dir=$tmp/$name" \
      cluster.gpus_per_node=2 grpo.max_num_steps=1 "$@") >"$tmp/$name.log" 2>&1 && fail "$name was not refused"
  grep -qF "$want" "$tmp/$name.log" || { cat "$tmp/$name.log"; fail "$name: no '$want'"; }
  ! grep -q "step 1/" "$tmp/$name.log" || fail "$name trained before refusing"
  echo "refused $name: $(grep -F "$want" "$tmp/$name.log" | head -1 | sed 's/.*ERROR *//')"
}
refuse prompts "must be divisible by the data-parallel size 2, so that every rank generates whole prompt groups" \
  grpo.num_prompts_per_step=3 policy.train_global_batch_size=4
refuse microbatches "must be divisible by the data-parallel size 2 x policy.train_micro_batch_size (8)" \
  policy.train_micro_batch_size=8
refuse validation "must be divisible by the data-parallel size 2, so that every rank generates an equal share" \
  grpo.val_batch_size=3 grpo.max_val_samples=3
refuse replay_cp "routing replay runs in one process or under data, expert, tensor and pipeline parallelism" \
  +policy.router_replay.enabled=true policy.megatron_cfg.context_parallel_size=2 \
  policy.make_sequence_length_divisible_by=4
echo "dp grpo ok"
