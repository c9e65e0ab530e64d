#!/usr/bin/env bash
# test_dp_sft.sh BUILD_DIR SOURCE_DIR MPIEXEC: data-parallel SFT through `dsarl run` under mpirun against the
# one-process run of the tiny GLM-5.2 / GLM-5.1 SFT recipes (random init, so the loss and gradients are large; the
# LR schedule spans 3 steps whatever sft.max_num_steps is, so a 2-step run resumed to 3 is the 3-step run):
#   - DP2 with the distributed optimizer, DP2 without it, DP4, CP2 and CP2 x DP2 log the same loss, grad norm, token counts and
#     validation loss/accuracy per step as one process, and the weights of their step-3 checkpoints agree;
#   - with a trained MTP layer, DP2 logs the same MTP loss and trains the same weights as one process;
#   - a DP2 run stopped after 2 steps and resumed (optimizer shards per rank) to 3 equals the uninterrupted run;
#   - a batch that does not split into whole microbatches per rank, and a validation batch that does not split over
#     dp, are refused naming their keys before any model is built.
set -uo pipefail
build=$1 src=$2 mpiexec=$3
dsarl="$build/bin/dsarl"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpi=("$mpiexec" --oversubscribe)
"$mpiexec" --version 2>/dev/null | grep -q "Open MPI\|OpenRTE" || mpi=("$mpiexec")
fail() { echo "FAIL: $*"; exit 1; }

recipe="$src/configs/recipes/llm/sft-glm5.2-tiny.yaml"
common=(sft.val_period=0 sft.val_at_start=false sft.val_at_end=true sft.val_global_batch_size=8
        sft.val_micro_batch_size=2 policy.train_global_batch_size=8 policy.train_micro_batch_size=2 runtime.device=cpu
        policy.megatron_cfg.model_overrides.dsa_kernel_backend=reference
        policy.megatron_cfg.scheduler.lr_warmup_iters=0 policy.megatron_cfg.scheduler.lr_decay_iters=3
        checkpointing.save_period=1 checkpointing.keep_top_k=null)

# run NAME NP ARGS...: one `dsarl run` (under mpirun when NP > 1), logs in $tmp/NAME, checkpoints in $tmp/NAME.ck
run() {
  local name=$1 np=$2
  shift 2
  local launch=()
  [ "$np" -gt 1 ] && launch=("${mpi[@]}" -np "$np")
  (cd "$tmp" && "${launch[@]}" "$dsarl" run "$recipe" "${common[@]}" "logger.log_dir=$tmp/$name" \
      "checkpointing.checkpoint_dir=$tmp/$name.ck" "cluster.gpus_per_node=$np" "$@") >"$tmp/$name.log" 2>&1 ||
    { local rc=$?; cat "$tmp/$name.log"; fail "$name exited $rc"; }
}
same() { python3 "$src/tests/cli/dp_compare.py" metrics "$tmp/$1" "$tmp/$2" "${3:-}" || fail "$1 and $2 differ"; }
same_weights() {
  python3 "$src/tests/cli/dp_compare.py" weights "$tmp/$1.ck/step_3/policy/weights" \
    "$tmp/$2.ck/step_3/policy/weights" ${3:-} || fail "the weights of $1 and $2 differ"
}

run one 1 sft.max_num_steps=3
run dp2 2 sft.max_num_steps=3
same one dp2
same_weights one dp2
[ -f "$tmp/dp2.ck/step_3/policy/optimizer/optimizer.shard1-of-2.safetensors" ] || fail "no optimizer shard 1"
run dp2_replicated 2 sft.max_num_steps=3 \
  +policy.megatron_cfg.distributed_data_parallel_config.use_distributed_optimizer=false
same one dp2_replicated
same_weights one dp2_replicated
[ -f "$tmp/dp2_replicated.ck/step_3/policy/optimizer/optimizer.safetensors" ] || fail "no unsharded optimizer file"
run dp4 4 sft.max_num_steps=3
same one dp4
same_weights one dp4

# a trained MTP layer: each microbatch's MTP loss is its share of the step's mean (divided by the step's answer
# tokens), so DP2 logs the same train/mtp_loss and trains the same weights as one process (the MTP gradient of the
# trunk's small entries rounds differently in the two sums, which AdamW magnifies as under CP: 1e-4 on the weights)
mtp=(sft.max_num_steps=3 +policy.model_config.num_nextn_predict_layers=1 +policy.megatron_cfg.mtp_num_layers=1)
run mtp_one 1 "${mtp[@]}"
run mtp_dp2 2 "${mtp[@]}"
grep -q '"train/mtp_loss"' "$tmp"/mtp_one/exp_*/metrics.jsonl || fail "no train/mtp_loss logged"
same mtp_one mtp_dp2
same_weights mtp_one mtp_dp2 1e-4

# context parallelism: CP2 (the cp peers share samples, dp_cp shards the optimizer), CP2 x DP2. A cp rank sums its
# own tokens' share of each gradient, so the sums round differently than one process's (DP only adds whole
# microbatches, as one process does); AdamW turns that noise on small gradient entries into larger relative
# updates, hence 1e-4 on the weights (the metrics keep 1e-5)
cp=(policy.megatron_cfg.context_parallel_size=2 policy.make_sequence_length_divisible_by=4)
run cp2 2 sft.max_num_steps=3 "${cp[@]}"
same one cp2
same_weights one cp2 1e-4
run cp2_dp2 4 sft.max_num_steps=3 "${cp[@]}"
same one cp2_dp2
same_weights one cp2_dp2 1e-4
run cp2_resume 2 sft.max_num_steps=2 "${cp[@]}"
run cp2_resume 2 sft.max_num_steps=3 "${cp[@]}"
grep -q "resumed from .*step_2" "$tmp/cp2_resume.log" || { cat "$tmp/cp2_resume.log"; fail "no resume under cp"; }
same cp2 cp2_resume 3
same_weights cp2 cp2_resume

# GLM-5.1
recipe="$src/configs/recipes/llm/sft-glm5.1-tiny.yaml"
run one51 1 sft.max_num_steps=3
run dp2_51 2 sft.max_num_steps=3
same one51 dp2_51
same_weights one51 dp2_51
recipe="$src/configs/recipes/llm/sft-glm5.2-tiny.yaml"

# stop after 2 steps and resume to 3 under DP2
run dp2_resume 2 sft.max_num_steps=2
run dp2_resume 2 sft.max_num_steps=3
grep -q "resumed from .*step_2" "$tmp/dp2_resume.log" || { cat "$tmp/dp2_resume.log"; fail "no resume"; }
same one dp2_resume 3
same_weights one dp2_resume

# refusals
refuse() {
  local name=$1 want=$2
  shift 2
  (cd "$tmp" && "${mpi[@]}" -np 2 "$dsarl" run "$recipe" "${common[@]}" "logger.log_dir=$tmp/$name" \
      "checkpointing.checkpoint_dir=$tmp/$name.ck" cluster.gpus_per_node=2 sft.max_num_steps=1 "$@") \
      >"$tmp/$name.log" 2>&1 && fail "$name was not refused"
  grep -qF "$want" "$tmp/$name.log" || { cat "$tmp/$name.log"; fail "$name: no '$want'"; }
  ! grep -q "sft step 1" "$tmp/$name.log" || fail "$name trained before refusing"
  echo "refused $name: $(grep -F "$want" "$tmp/$name.log" | head -1 | sed 's/.*error: *//')"
}
refuse microbatches "policy.train_global_batch_size (8) must be divisible by the data-parallel size 2 x policy.train_micro_batch_size (8)" \
  policy.train_micro_batch_size=8
refuse validation "sft.val_global_batch_size (5) must be divisible by the data-parallel size 2" \
  sft.val_global_batch_size=5 sft.val_micro_batch_size=1
echo "dp sft ok"
