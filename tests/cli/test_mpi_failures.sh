#!/usr/bin/env bash
# test_mpi_failures.sh BUILD_DIR SOURCE_DIR MPIEXEC [MPIEXEC_FLAGS...]: a multi-process job never hangs on a broken
# rank. Three cases, each must end the whole job quickly with a message naming the rank:
#   1. a rank stalls before a collective: the peer's watchdog ends the job after runtime.collective_timeout_s;
#   2. a rank is killed (SIGKILL) in the middle of `dsarl run`: the launcher ends the others and names it;
#   3. every rank refuses a bad layout: each prints its rank and the reason, exit status non-zero.
set -uo pipefail
build=$1 src=$2 mpiexec=$3
shift 3
flags=("$@")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# 1. the watchdog
start=$(date +%s)
timeout 60 "$mpiexec" -np 2 "${flags[@]}" "$build/tests/mpi_stall_probe" 2 >"$tmp/stall.log" 2>&1
rc=$? elapsed=$(( $(date +%s) - start ))
cat "$tmp/stall.log"
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "stalled peer: exit status $rc (124 = the job hung)"
[ $elapsed -lt 30 ] || fail "stalled peer: the job took ${elapsed}s to end"
grep -q "rank 0: barrier on group world (2 ranks) has not completed after" "$tmp/stall.log" ||
  fail "stalled peer: no watchdog message naming rank 0 and the barrier"
grep -q "the barrier returned" "$tmp/stall.log" && fail "the barrier returned without the stalled rank"

# 2. SIGKILL of rank 1 during a run
recipe="$src/configs/recipes/llm/grpo-glm5.2-tiny.yaml"
args=(cluster.gpus_per_node=2 grpo.max_num_steps=1000 grpo.val_at_start=false grpo.val_period=0
      grpo.val_at_end=false checkpointing.enabled=false logger.log_dir="$tmp/logs" runtime.device=cpu)
timeout 120 "$mpiexec" -np 2 "${flags[@]}" "$build/bin/dsarl" run "$recipe" "${args[@]}" >"$tmp/kill.log" 2>&1 &
job=$!
victim=""
for _ in $(seq 1 100); do # wait for rank 1 to start stepping
  victim=$(pgrep -f "OMPI_COMM_WORLD_RANK=1" 2>/dev/null | head -n1)
  [ -z "$victim" ] && for p in $(pgrep -f "$build/bin/dsarl run"); do
    [ "$(tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -c '^OMPI_COMM_WORLD_RANK=1$')" = 1 ] && victim=$p
  done
  [ -n "$victim" ] && grep -q "step 1/" "$tmp/kill.log" 2>/dev/null && break
  sleep 0.2
done
[ -n "$victim" ] || { cat "$tmp/kill.log"; fail "could not find rank 1's process"; }
start=$(date +%s)
kill -9 "$victim"
wait $job
rc=$? elapsed=$(( $(date +%s) - start ))
tail -n 20 "$tmp/kill.log"
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "killed rank: exit status $rc (124 = the job hung)"
[ $elapsed -lt 60 ] || fail "killed rank: the job took ${elapsed}s to end"
grep -qiE "rank 1 .*(killed|signal 9)|process rank 1" "$tmp/kill.log" || fail "killed rank: no message naming rank 1"

# 3. a layout the processes do not fit
timeout 60 "$mpiexec" -np 2 "${flags[@]}" "$build/bin/dsarl" run "$recipe" cluster.gpus_per_node=2 \
  policy.megatron_cfg.expert_model_parallel_size=3 runtime.device=cpu >"$tmp/layout.log" 2>&1
rc=$?
cat "$tmp/layout.log"
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "bad layout: exit status $rc"
grep -q "dsarl: rank [01]: error: policy.megatron_cfg.expert_model_parallel_size 3 does not divide the 2 ranks" \
  "$tmp/layout.log" || fail "bad layout: no one-line refusal naming the rank and the key"
echo "mpi failure handling ok"
