#!/usr/bin/env bash
# test_plugin_trust.sh BUILD_DIR: plugin loading trusts nothing it cannot vouch for, and says what it skipped.
#   1. a plugin file writable by every user is refused before dlopen (its constructors never run), one line;
#   2. a plugin directory writable by every user (no sticky bit) loads nothing, with a warning;
#   3. a plugins.path entry that does not exist, or is a file, is reported (a typo is not silently ignored);
#   4. a relative plugins.path in a recipe is found beside the recipe file, not in the current directory.
set -uo pipefail
build=$1
dsarl="$build/bin/dsarl"
failures=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
src_plugin="$build/lib/dsarl/plugins/dsarl-environment-math.so"
[ -f "$src_plugin" ] || { echo "FAIL: $src_plugin was not built"; exit 1; }

# 1. a world-writable file
mkdir -p "$tmp/ww_file" && cp "$src_plugin" "$tmp/ww_file/" && chmod 0666 "$tmp/ww_file/dsarl-environment-math.so"
"$dsarl" plugins --plugin-path "$tmp/ww_file" >"$tmp/out1" 2>&1
grep -q "$tmp/ww_file/dsarl-environment-math.so: writable by every user (mode 0666)" "$tmp/out1" ||
  fail "world-writable plugin not refused by name: $(cat "$tmp/out1")"

# 2. a world-writable directory
mkdir -p "$tmp/ww_dir" && cp "$src_plugin" "$tmp/ww_dir/" && chmod 0777 "$tmp/ww_dir"
"$dsarl" plugins --plugin-path "$tmp/ww_dir" >"$tmp/out2" 2>&1
grep -q "plugin directory $tmp/ww_dir (from --plugin-path) is writable by every user (mode 0777)" "$tmp/out2" ||
  fail "world-writable directory not reported: $(cat "$tmp/out2")"
grep -q "$tmp/ww_dir/dsarl-environment-math.so" "$tmp/out2" &&
  fail "a plugin from the world-writable directory was looked at: $(cat "$tmp/out2")"

# 3. missing and non-directory entries
touch "$tmp/not_a_dir"
"$dsarl" plugins --plugin-path "$tmp/missing:$tmp/not_a_dir" >"$tmp/out3" 2>&1
grep -q "plugin directory $tmp/missing (from --plugin-path) does not exist" "$tmp/out3" ||
  fail "missing plugin directory not reported: $(cat "$tmp/out3")"
grep -q "plugin directory $tmp/not_a_dir (from --plugin-path) is not a directory" "$tmp/out3" ||
  fail "non-directory plugin path not reported: $(cat "$tmp/out3")"

# 4. a relative plugins.path resolves beside the recipe: the copy in recipes/plugs is seen (refused as a duplicate of
# the built-in math environment, naming its path), while the current directory has no plugs/
mkdir -p "$tmp/recipes/plugs" "$tmp/elsewhere" && cp "$src_plugin" "$tmp/recipes/plugs/"
printf 'plugins:\n  path: [plugs]\n' >"$tmp/recipes/r.yaml"
(cd "$tmp/elsewhere" && "$dsarl" config show "$tmp/recipes/r.yaml" >"$tmp/out4" 2>&1)
(cd "$tmp/elsewhere" && "$dsarl" --log-level debug config show "$tmp/recipes/r.yaml" >"$tmp/out4d" 2>&1)
grep -q "$tmp/recipes/plugs/dsarl-environment-math.so" "$tmp/out4d" ||
  fail "plugins.path 'plugs' was not looked up beside the recipe: $(cat "$tmp/out4d")"
grep -q "plugin directory plugs " "$tmp/out4" && fail "plugins.path 'plugs' was looked up in the current directory"

[ "$failures" -eq 0 ] && echo "plugin trust checks passed"
exit $((failures > 0))
