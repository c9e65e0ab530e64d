#!/bin/sh
# tools/plot turns a metrics.jsonl (with a torn last line) into valid PNG files; skipped (77) without matplotlib.
set -e
# matplotlib from this Python or from tools/install-deps' .venv-tools (tools/plot switches to it by itself)
python3 -c "import matplotlib" 2>/dev/null || [ -x "$1/.venv-tools/bin/python" ] ||
  { echo "matplotlib not installed (tools/install-deps sets up .venv-tools); skipped"; exit 77; }
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
for s in 1 2 3 4 5; do
  printf '{"step": %d, "train/reward": 0.%d, "val/accuracy": 0.%d, "train/kl_penalty": null, "train/token_mult_prob_error": 1.0}\n' $s $s $((s+2)) >> "$d/metrics.jsonl"
done
printf '{"step": 6, "train/rew' >> "$d/metrics.jsonl"
"$1/tools/plot" "$d/metrics.jsonl" --out "$d/png" > "$d/list"
for f in reward val_accuracy prob_error overview; do
  grep -q "$f.png" "$d/list"
  # PNG signature: 89 50 4E 47 0D 0A 1A 0A
  [ "$(head -c 8 "$d/png/$f.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ]
done
! [ -e "$d/png/kl.png" ]   # a panel with no finite value is skipped
! "$1/tools/plot" "$d/missing.jsonl" 2>/dev/null
echo "plot OK"
