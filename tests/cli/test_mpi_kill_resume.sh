#!/usr/bin/env bash
# test_mpi_kill_resume.sh BUILD_DIR SOURCE_DIR MPIEXEC [MPIEXEC_FLAGS...]: an expert-parallel GRPO run (EP2 folded
# over two data-parallel ranks, so the weights' save gathers the expert shards and each rank writes its own
# optimizer state) is killed with SIGKILL on rank 1 after it checkpointed; the rerun resumes from the newest complete
# checkpoint, and every step it logs after that equals the uninterrupted one-process run (fp32 rounding).
set -uo pipefail
build=$1 src=$2 mpiexec=$3
shift 3
flags=("$@")
tmp=$(mktemp -d)
trap 'pkill -9 -f "$tmp/" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
recipe="$src/configs/recipes/llm/grpo-glm5.2-tiny.yaml"
common=(runtime.device=cpu runtime.threads=1 policy.megatron_cfg.model_overrides.dsa_kernel_backend=reference
        grpo.num_prompts_per_step=4 grpo.num_generations_per_prompt=4 policy.train_global_batch_size=16
        policy.train_micro_batch_size=4 grpo.val_at_start=false grpo.val_at_end=false grpo.val_period=0
        policy.megatron_cfg.scheduler.lr_warmup_iters=0 policy.megatron_cfg.optimizer.lr=1.0e-3
        policy.make_sequence_length_divisible_by=4 grpo.reward_shaping.enabled=true
        grpo.reward_shaping.overlong_buffer_length=12 grpo.reward_shaping.max_response_length=16
        "policy.generation.stop_token_ids=[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14]" policy.generation.max_new_tokens=16)
ep=(cluster.gpus_per_node=2 policy.megatron_cfg.expert_model_parallel_size=2 checkpointing.enabled=true
    "checkpointing.checkpoint_dir=$tmp/ck" checkpointing.save_period=1 checkpointing.keep_top_k=null)

"$build/bin/dsarl" run "$recipe" "${common[@]}" grpo.max_num_steps=5 checkpointing.enabled=false \
  "logger.log_dir=$tmp/one" >"$tmp/one.log" 2>&1 || { tail "$tmp/one.log"; fail "one-process run"; }

# the run to kill: far more steps than it will live for
"$mpiexec" -np 2 "${flags[@]}" "$build/bin/dsarl" run "$recipe" "${common[@]}" "${ep[@]}" grpo.max_num_steps=200 \
  "logger.log_dir=$tmp/killed" >"$tmp/killed.log" 2>&1 &
job=$!
for _ in $(seq 1 300); do [ -f "$tmp/ck/step_2/manifest.json" ] && break; sleep 0.1; done
[ -f "$tmp/ck/step_2/manifest.json" ] || { kill -9 $job; tail "$tmp/killed.log"; fail "no checkpoint of step 2"; }
victim=""
for p in $(pgrep -f "$build/bin/dsarl run"); do
  tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && victim=$p
done
[ -n "$victim" ] || { kill -9 $job; fail "rank 1 not found"; }
kill -9 "$victim"
wait $job && fail "the killed job exited 0"
ls "$tmp/ck"

# the rerun: the same layout, to step 5
"$mpiexec" -np 2 "${flags[@]}" "$build/bin/dsarl" run "$recipe" "${common[@]}" "${ep[@]}" grpo.max_num_steps=5 \
  "logger.log_dir=$tmp/resumed" >"$tmp/resumed.log" 2>&1 || { tail -n 20 "$tmp/resumed.log"; fail "the resumed run"; }
grep -o "resumed from [^ ]* (step [0-9]*)" "$tmp/resumed.log" || fail "the rerun did not resume"
python3 - "$tmp/one" "$tmp/resumed" <<'PY'
import glob, json, sys
def rows(d):
    return {r["step"]: r for f in sorted(glob.glob(d + "/exp_*/metrics.jsonl")) for r in map(json.loads, open(f))
            if r.get("train/loss") is not None}
a, b = rows(sys.argv[1]), rows(sys.argv[2])
assert b and max(b) == 5, f"resumed run logged steps {sorted(b)}"
worst = 0.0
for step, rb in b.items():
    for k, v in a[step].items():
        if k.startswith("timing/") or not isinstance(v, (int, float)) or "per_second" in k or "tokens_per_s" in k:
            continue
        worst = max(worst, abs(v - rb[k]) / max(1e-9, abs(v)))
print(f"resumed steps {sorted(b)}: worst relative difference against one process {worst:.2e}")
assert worst <= 1e-4, worst
PY
[ $? -eq 0 ] || fail "the resumed run differs from the uninterrupted one"
echo "kill and resume ok"
