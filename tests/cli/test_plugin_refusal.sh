#!/usr/bin/env bash
# test_plugin_refusal.sh BUILD_DIR: an out-of-tree DSA backend whose table leaves a mandatory op NULL
# (indexer_loss_forward, then create) is refused by `dsarl plugins --plugin-path DIR` with exactly one line that
# names the file, the kind, the table and the slot; the backend is not listed; `dsarl plugins` still exits 0 (it
# reports refusals, it does not fail on them), and selecting the refused backend by name fails with that reason.
set -uo pipefail
build=$1
dsarl="$build/bin/dsarl"
failures=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

for case in null_loss:indexer_loss_forward null_create:create; do
  dir="$build/tests/plugins/dsa_${case%%:*}" slot=${case#*:}
  file="$dir/dsarl-dsa-nullslot.so"
  [ -f "$file" ] || { fail "$slot: test plugin $file was not built"; continue; }
  "$dsarl" plugins --plugin-path "$dir" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ "$rc" -eq 0 ] || fail "$slot: dsarl plugins exited $rc, wanted 0; stderr: $(cat "$tmp/err")"
  # The refusal section: "refused: N" then one indented line per refused file.
  sed -n '/^refused: /,/^$/p' "$tmp/out" | sed -n '2,$p' | grep -v '^$' >"$tmp/refused"
  n=$(grep -c "nullslot" "$tmp/refused")
  [ "$n" -eq 1 ] || fail "$slot: expected one refusal line for the test backend, got $n: $(cat "$tmp/out")"
  line=$(grep "nullslot" "$tmp/refused")
  for word in "$file" "dsa 'nullslot'" "'$slot'" "NULL"; do
    grep -qF -- "$word" <<<"$line" || fail "$slot: refusal line lacks '$word': $line"
  done
  grep -qE '^dsa +nullslot ' "$tmp/out" && fail "$slot: the refused backend is still listed: $(cat "$tmp/out")"
  grep -q "^refused: 0" "$tmp/out" && fail "$slot: output says refused: 0"
done

[ "$failures" -eq 0 ] && echo "plugin refusal checks passed"
exit $((failures > 0))
