#!/usr/bin/env bash
# test_pp_run.sh BUILD_DIR SOURCE_DIR MPIEXEC: pipeline-parallel SFT through `dsarl run` under mpirun against the
# one-process run of the tiny GLM-5.2 / GLM-5.1 SFT recipes (4 microbatches per step, so the 1F1B schedule has
# warm-up, steady and cool-down steps on both stages):
#   - PP2 (GLM-5.2 2|2, GLM-5.1 split 1|3) logs the same loss, grad norm, token counts and validation loss/accuracy
#     per step as one process, and the weights of their step-3 checkpoints (saved from both stages) agree;
#   - a PP2 run stopped after 2 steps and resumed (each stage reads its own optimizer state) to 3 equals the
#     uninterrupted run;
#   - PP2 x VPP2 (interleaved virtual stages) does the same;
#   - virtual stages and uneven stage sizes that do not divide are refused in one line naming the key, exit
#     status 3, before any step. (GRPO under PP: tests/cli/test_mpi_grpo_layouts.sh's layouts.)
set -uo pipefail
build=$1 src=$2 mpiexec=$3
dsarl="$build/bin/dsarl"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpi=("$mpiexec" --oversubscribe)
"$mpiexec" --version 2>/dev/null | grep -q "Open MPI\|OpenRTE" || mpi=("$mpiexec")
fail() { echo "FAIL: $*"; exit 1; }
P=policy.megatron_cfg

recipe="$src/configs/recipes/llm/sft-glm5.2-tiny.yaml"
common=(sft.val_period=0 sft.val_at_start=false sft.val_at_end=true sft.val_global_batch_size=8
        sft.val_micro_batch_size=2 policy.train_global_batch_size=8 policy.train_micro_batch_size=2 runtime.device=cpu
        $P.model_overrides.dsa_kernel_backend=reference
        $P.scheduler.lr_warmup_iters=0 $P.scheduler.lr_decay_iters=3
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
    "$tmp/$2.ck/step_3/policy/weights" || fail "the weights of $1 and $2 differ"
}

run one 1 sft.max_num_steps=3
run pp2 2 sft.max_num_steps=3 $P.pipeline_model_parallel_size=2
same one pp2
same_weights one pp2
[ -f "$tmp/pp2.ck/step_3/policy/optimizer/optimizer.shard1-of-2.safetensors" ] || fail "no optimizer state of stage 1"
# interleaved: four one-layer chunks, layers 0 and 2 on stage 0, 1 and 3 on stage 1 (saved from both)
run vpp2 2 sft.max_num_steps=3 $P.pipeline_model_parallel_size=2 +$P.virtual_pipeline_model_parallel_size=2
same one vpp2
same_weights one vpp2

# stop after 2 steps and resume to 3 under PP2
run pp2_resume 2 sft.max_num_steps=2 $P.pipeline_model_parallel_size=2
run pp2_resume 2 sft.max_num_steps=3 $P.pipeline_model_parallel_size=2
grep -q "resumed from .*step_2" "$tmp/pp2_resume.log" || { cat "$tmp/pp2_resume.log"; fail "no resume"; }
same one pp2_resume 3
same_weights one pp2_resume

# GLM-5.1, uneven stages
recipe="$src/configs/recipes/llm/sft-glm5.1-tiny.yaml"
run one51 1 sft.max_num_steps=3
run pp2_51 2 sft.max_num_steps=3 $P.pipeline_model_parallel_size=2 $P.num_layers_in_first_pipeline_stage=1
same one51 pp2_51
same_weights one51 pp2_51
recipe="$src/configs/recipes/llm/sft-glm5.2-tiny.yaml"

# refusals: one line naming the key, exit status 3, no step
refuse() {
  local name=$1 want=$2
  shift 2
  (cd "$tmp" && "${mpi[@]}" -np 2 "$dsarl" run "$recipe" "${common[@]}" "logger.log_dir=$tmp/$name" \
      "checkpointing.checkpoint_dir=$tmp/$name.ck" cluster.gpus_per_node=2 sft.max_num_steps=1 \
      $P.pipeline_model_parallel_size=2 "$@") >"$tmp/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 3 ] || { cat "$tmp/$name.log"; fail "$name: exit status $rc, not 3 (bad input)"; }
  grep -qF "$want" "$tmp/$name.log" || { cat "$tmp/$name.log"; fail "$name: no '$want'"; }
  ! grep -q "sft step 1" "$tmp/$name.log" || fail "$name trained before refusing"
  echo "refused $name (exit $rc): $(grep -F "$want" "$tmp/$name.log" | head -1 | sed 's/.*error: *//')"
}
refuse virtual_stages "$P.virtual_pipeline_model_parallel_size 2 does not divide the 3 layers of pipeline stage 0" \
  +$P.virtual_pipeline_model_parallel_size=2 +$P.num_layers_in_first_pipeline_stage=3
refuse uneven "num_layers_in_first_pipeline_stage (4) and num_layers_in_last_pipeline_stage (0) leave 0 layers" \
  +$P.num_layers_in_first_pipeline_stage=4
echo "pp run ok"
