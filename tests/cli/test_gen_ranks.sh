#!/usr/bin/env bash
# test_gen_ranks.sh BUILD_DIR SOURCE_DIR MPIEXEC: a dedicated generation rank under mpirun
# (policy.generation.colocated.enabled false: the job's last process generates) against the one-process runs of the
# tiny GLM-5.2 recipe. Rewards come from the overlong shaping on responses that end early, so the runs train.
#   - 1 training + 1 generation rank logs every metric (timings excepted) and sample dump bit for bit as the
#     one-process non-colocated run: the generation rank generates the whole batch as that process does, from an
#     exact float32 copy of the weights;
#   - DP2 training + 1 generation rank equals DP2 colocated within dp_compare's 1e-5: the responses, rewards and
#     sample dumps are the same, but colocated DP2 generates each rank's half of the batch, and the engine's
#     log-probs of a batch of 8 sequences differ from those of 16 at float rounding (~5e-8 relative here), which
#     reaches the importance ratio and the loss;
#   - async GRPO (age 1) on the generation rank equals the one-process async run bit for bit, and logs the
#     generation rank's time, the trainer's wait and the overlap;
#   - routing and index replay with the generation rank: it sends the rows it records with the rollouts, so the run
#     logs what the one-process non-colocated replay run logs, bit for bit, and its trainer agrees with the engine;
#   - refusals: a resources count other than one, generation tensor parallelism, model-parallel training, each in
#     one sentence.
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
        checkpointing.enabled=false grpo.max_num_steps=3 loss_fn.use_importance_sampling_correction=true)
# non-colocated, refitted in several buckets, one generation process
nc=(++policy.generation.colocated.enabled=false ++policy.refit_buffer_size_gb=0.000004
    ++policy.generation.colocated.resources.num_nodes=1 ++policy.generation.colocated.resources.gpus_per_node=1)

# run NAME NP ARGS...: one `dsarl run` (under mpirun when NP > 1) logging into $tmp/NAME
run() {
  local name=$1 np=$2
  shift 2
  local launch=()
  [ "$np" -gt 1 ] && launch=("${mpi[@]}" -np "$np")
  (cd "$tmp" && "${launch[@]}" "$dsarl" run "$recipe" "${common[@]}" "logger.log_dir=$tmp/$name" \
      "cluster.gpus_per_node=$np" "$@") >"$tmp/$name.log" 2>&1 || { local rc=$?; cat "$tmp/$name.log"; fail "$name exited $rc"; }
}
cmp_runs() { python3 "$src/tests/cli/dp_compare.py" metrics "$tmp/$1" "$tmp/$2" || fail "$1 and $2 differ"; }

# --- 1 training + 1 generation rank = one process -----------------------------------------------------------------
run one 1 "${nc[@]}"
run gen1 2 "${nc[@]}"
grep -q "1 training processes: .* and 1 dedicated generation rank" "$tmp/gen1.log" || { cat "$tmp/gen1.log"; fail "no generation rank"; }
python3 -c "
import glob, json
r = [json.loads(l) for l in open(glob.glob('$tmp/one/exp_*/metrics.jsonl')[0])]
assert all(x['train/advantages/max'] > 0 and x['train/loss'] != 0 for x in r), 'the runs train on nothing'
g = [json.loads(l) for l in open(glob.glob('$tmp/gen1/exp_*/metrics.jsonl')[0])]
assert all(x['train/refit_buckets'] > 1 and 'timing/train/generation/remote' in x for x in g), g
" || fail "the runs do not train, or the generation rank's refit is not logged"
DP_COMPARE_EXACT=1 cmp_runs one gen1
[ "$(ls -d "$tmp"/gen1/exp_* | wc -l)" -eq 1 ] || fail "the generation rank logged a run of its own"

# --- DP2 training + 1 generation rank = DP2 colocated (and the one-process non-colocated run) ---------------------
run dp2 2
run dp2_gen 3 "${nc[@]}"
grep -q "2 training processes: TP1 x CP1 x DP2" "$tmp/dp2_gen.log" || fail "dp2_gen is not DP2 + a generation rank"
DP_COMPARE_IGNORE=train/refit_buckets cmp_runs dp2 dp2_gen
cmp_runs one dp2_gen

# --- async GRPO on the generation rank = one-process async --------------------------------------------------------
run async_one 1 "${nc[@]}" ++grpo.async_grpo.enabled=true ++grpo.async_grpo.max_trajectory_age_steps=1
run async_gen 2 "${nc[@]}" ++grpo.async_grpo.enabled=true ++grpo.async_grpo.max_trajectory_age_steps=1
DP_COMPARE_EXACT=1 cmp_runs async_one async_gen
python3 -c "
import glob, json
g = [json.loads(l) for l in open(glob.glob('$tmp/async_gen/exp_*/metrics.jsonl')[0])]
assert [x['train/trajectory_age_max'] for x in g] == [0, 1, 1], g
assert all(x['timing/train/generation/overlapped'] >= 0 for x in g), g
print('async overlap per step (s):', [round(x['timing/train/generation/overlapped'], 4) for x in g],
      'trainer waits:', [round(x['timing/train/generation/wait'], 4) for x in g])
" || fail "async on the generation rank: wrong ages or no overlap metrics"

# --- routing and index replay: the generation rank sends the rows it records ------------------------------------
rep=(++policy.router_replay.enabled=true ++policy.dsa_index_replay.enabled=true)
run rep_one 1 "${nc[@]}" "${rep[@]}"
run rep_gen 2 "${nc[@]}" "${rep[@]}"
DP_COMPARE_EXACT=1 cmp_runs rep_one rep_gen
python3 -c "
import glob, json
g = [json.loads(l) for l in open(glob.glob('$tmp/rep_gen/exp_*/metrics.jsonl')[0])]
assert [x['train/routing_replay_coverage'] for x in g] == [1.0] * len(g), g
" || fail "the generation rank's routing rows did not reach the trainer"
for r in rep_one rep_gen; do
  python3 "$src/tests/cli/dp_compare.py" agree "$tmp/$r" || fail "$r: the trainer disagrees with the engine"
done

# --- refusals -----------------------------------------------------------------------------------------------------
# refuse NAME NP WANT ARGS...: the run exits non-zero with WANT in one line of its output, before any step
refuse() {
  local name=$1 np=$2 want=$3
  shift 3
  (cd "$tmp" && "${mpi[@]}" -np "$np" "$dsarl" run "$recipe" "${common[@]}" "logger.log_dir=$tmp/$name" \
      "cluster.gpus_per_node=$np" grpo.max_num_steps=1 "${nc[@]}" "$@") >"$tmp/$name.log" 2>&1 && fail "$name was not refused"
  grep -qF "$want" "$tmp/$name.log" || { cat "$tmp/$name.log"; fail "$name: no '$want'"; }
  ! grep -q "step 1/" "$tmp/$name.log" || fail "$name trained before refusing"
  echo "refused $name: $(grep -F "$want" "$tmp/$name.log" | head -1 | sed 's/.*ERROR *//')"
}
refuse resources 3 "supports exactly one dedicated generation rank" ++policy.generation.colocated.resources.gpus_per_node=2
refuse generation_tp 2 "with a dedicated generation rank, which generates alone" ++policy.generation.tensor_parallel_size=2
refuse training_tp 3 "which holds them only under data parallelism alone" \
  policy.megatron_cfg.tensor_model_parallel_size=2 policy.megatron_cfg.sequence_parallel=true
echo "generation ranks ok"
