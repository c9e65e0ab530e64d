#!/bin/sh
# `dsarl run` of the tiny GRPO recipe end to end (2 steps from random init, TensorBoard on), then a SIGTERM in the
# middle of a longer run: the step in flight finishes, a checkpoint of it is written, the exit status is 130, and a
# rerun resumes from it. Usage: grpo_cli_check.sh BUILD_DIR SOURCE_DIR. Skipped (77) without the generation plugin.
set -eu
build=$1 src=$2
[ -e "$build/lib/dsarl/plugins/dsarl-generation-native.so" ] || { echo "no generation plugin built; skipped"; exit 77; }
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
recipe=$src/configs/recipes/llm/grpo-glm5.2-tiny.yaml
common="policy.model_name=null grpo.max_val_samples=8 grpo.val_batch_size=8 runtime.threads=1
        logger.log_dir=$d/logs checkpointing.checkpoint_dir=$d/ckpt"
# shellcheck disable=SC2086
"$build/bin/dsarl" run "$recipe" grpo.max_num_steps=2 logger.tensorboard_enabled=true $common 2> "$d/log1"
python3 - "$d/logs/exp_001/metrics.jsonl" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == [0, 1, 2], [r["step"] for r in rows]
for r in rows[1:]:
    for k in ("train/reward", "train/loss", "train/mean_gen_length", "timing/train/total_step_time"):
        assert isinstance(r[k], (int, float)) and math.isfinite(r[k]), k
    assert abs(r["train/token_mult_prob_error"] - 1.0) <= 1e-5, r["train/token_mult_prob_error"]
assert "val/accuracy" in rows[0] and "val/accuracy" in rows[2]
PY
[ -f "$d/ckpt/step_2/manifest.json" ]
ls "$d/logs/exp_001/tensorboard/" | grep -q '^events.out.tfevents\.'
[ -f "$d/logs/exp_001/train_data_step2.jsonl" ]

# SIGTERM: finish the step, checkpoint, exit 130; the rerun resumes after it.
rm -rf "$d/ckpt" "$d/logs"
# shellcheck disable=SC2086
"$build/bin/dsarl" run "$recipe" grpo.max_num_steps=200 grpo.val_period=0 grpo.val_at_start=false \
  grpo.val_at_end=false checkpointing.save_period=1000 $common 2> "$d/log2" &
pid=$!
i=0
until [ -s "$d/logs/exp_001/metrics.jsonl" ]; do
  i=$((i + 1)); [ $i -lt 600 ] || { kill -9 $pid; echo "no step logged"; exit 1; }
  sleep 0.1
done
kill -TERM $pid
rc=0; wait $pid || rc=$?
[ $rc -eq 130 ] || { echo "exit status $rc, want 130"; cat "$d/log2"; exit 1; }
last=$(tail -n 1 "$d/logs/exp_001/metrics.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])')
[ -f "$d/ckpt/step_$last/manifest.json" ] || { echo "no checkpoint of step $last"; ls "$d/ckpt"; exit 1; }
grep -q "stop requested" "$d/log2"
# shellcheck disable=SC2086
"$build/bin/dsarl" run "$recipe" grpo.max_num_steps=$((last + 1)) grpo.val_period=0 grpo.val_at_start=false \
  grpo.val_at_end=false $common 2> "$d/log3"
grep -q "resumed from .*step_$last" "$d/log3"
[ "$(wc -l < "$d/logs/exp_001/metrics.jsonl")" -eq $((last + 1)) ]
echo "dsarl run GRPO OK (stopped by SIGTERM after step $last, resumed)"
