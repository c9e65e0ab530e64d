#!/bin/sh
# A GRPO run killed with SIGKILL at an arbitrary moment resumes from its last complete checkpoint and, on the CPU,
# ends bit-identical to an uninterrupted run: same weights, same optimizer state, same logged rewards and losses.
# The kill lands after the second checkpoint, at a random point of a later step (possibly mid-save, leaving a
# tmp_step_N behind). Usage: grpo_sigkill_check.sh BUILD_DIR SOURCE_DIR. Skipped (77) without the generation plugin.
set -eu
build=$1 src=$2
[ -e "$build/lib/dsarl/plugins/dsarl-generation-native.so" ] || { echo "no generation plugin built; skipped"; exit 77; }
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
recipe=$src/configs/recipes/llm/grpo-glm5.2-tiny.yaml
steps=6
# launch wait|exec DIR [overrides]: GRPO from random init, a checkpoint every step, no validation. "exec" replaces
# the (background) subshell with dsarl, so $! is dsarl's own pid and SIGKILL reaches dsarl, not a wrapper shell.
launch() {
  mode=$1 dir=$2; shift 2
  set -- run "$recipe" policy.model_name=null grpo.max_num_steps=$steps grpo.val_period=0 \
    grpo.val_at_start=false grpo.val_at_end=false checkpointing.save_period=1 checkpointing.keep_top_k=100 \
    runtime.threads=1 logger.log_dir="$dir/logs" checkpointing.checkpoint_dir="$dir/ckpt" "$@"
  if [ "$mode" = exec ]; then exec "$build/bin/dsarl" "$@"; fi
  "$build/bin/dsarl" "$@"
}
launch wait "$d/a" 2> "$d/a.log" || { echo "uninterrupted run failed:"; cat "$d/a.log"; exit 1; }

launch exec "$d/b" 2> "$d/b1.log" &
pid=$!
i=0
until [ -f "$d/b/ckpt/step_2/manifest.json" ]; do
  i=$((i + 1)); [ $i -lt 1200 ] || { kill -9 $pid; echo "no second checkpoint"; exit 1; }
  sleep 0.05
done
# an arbitrary moment within the next step or two
sleep "0.$(od -An -N1 -tu1 /dev/urandom | tr -d ' ' | cut -c1)"
kill -KILL $pid 2>/dev/null || true
wait $pid 2>/dev/null || true
kill -0 $pid 2>/dev/null && { echo "dsarl ($pid) survived SIGKILL"; exit 1; }
ls "$d/b/ckpt" > "$d/killed_state"
[ -f "$d/b/ckpt/step_$steps/manifest.json" ] && { echo "the run finished before the kill; cannot test"; exit 1; }
launch wait "$d/b" 2> "$d/b2.log" ||
  { echo "resumed run failed (killed state: $(tr '\n' ' ' < "$d/killed_state")):"; cat "$d/b2.log"; exit 1; }
grep -q "resumed from" "$d/b2.log" || { echo "no resume:"; cat "$d/b2.log"; exit 1; }

for f in policy/weights/model.safetensors policy/optimizer/optimizer.safetensors; do
  cmp "$d/a/ckpt/step_$steps/$f" "$d/b/ckpt/step_$steps/$f" ||
    { echo "step_$steps/$f differs after SIGKILL + resume (killed state: $(tr '\n' ' ' < "$d/killed_state"))"; exit 1; }
done
python3 - "$d/a/logs/exp_001/metrics.jsonl" "$d/b/logs/exp_001/metrics.jsonl" <<'PY'
import json, sys
def load(p):
    rows = {}
    for line in open(p):
        r = json.loads(line)
        rows[r["step"]] = {k: v for k, v in r.items() if not k.startswith("timing/") and "per_sec" not in k}
    return rows
a, b = load(sys.argv[1]), load(sys.argv[2])
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
for s in a:
    assert a[s] == b[s], (s, {k: (a[s][k], b[s].get(k)) for k in a[s] if a[s][k] != b[s].get(k)})
PY
echo "SIGKILL + resume bit-identical (killed with checkpoints: $(tr '\n' ' ' < "$d/killed_state"))"
