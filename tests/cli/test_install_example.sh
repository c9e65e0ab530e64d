#!/usr/bin/env bash
# test_install_example.sh BUILD_DIR SOURCE_DIR: installs dsarl into a temporary prefix, builds the out-of-tree
# example plugin from plugins/examples/ against that prefix (with find_package and with pkg-config), loads it
# with --plugin-path and selects it with a command-line override.
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
for f in bin/dsarl lib/libdsarl.so include/dsarl/plugin.h include/dsarl/build_config.h include/dsarl/testkit.h \
         lib/pkgconfig/dsarl.pc lib/cmake/dsarl/dsarlConfig.cmake share/dsarl/configs/grpo_math.yaml; do
  [ -e "$prefix/$f" ] || { echo "FAIL: install lacks $f" >&2; exit 1; }
done
# The installed SDK needs no third-party header: json.h (jansson) stays in the tree, nothing installed includes
# jansson or yaml, and every installed header compiles on its own with -Werror.
[ ! -e "$prefix/include/dsarl/json.h" ] || { echo "FAIL: dsarl/json.h (jansson) is installed" >&2; exit 1; }
if grep -rlE '#include *<(jansson|yaml)\.h>' "$prefix/include/dsarl"; then
  echo "FAIL: an installed header includes jansson or yaml" >&2; exit 1
fi
for h in $(cd "$prefix/include" && find dsarl -name '*.h' | sort); do
  printf '#include "%s"\n' "$h" | cc -std=c11 -Wall -Wextra -Werror -fsyntax-only -I"$prefix/include" -x c - ||
    { echo "FAIL: installed $h does not compile alone" >&2; exit 1; }
done

# Programs that link an ASan+UBSan libdsarl must carry the same runtime (it has to come first): in a sanitizer
# build the example and its test are compiled with the build's sanitizer flags, as an out-of-tree user of that
# build would.
san=()
grep -q '^DSARL_SANITIZE:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null && san=(-fsanitize=address,undefined)
# 1. CMake package.
cmake -S "$src/plugins/examples/keyword_environment" -B "$tmp/ex" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_FLAGS="${san[*]:-}" >/dev/null
cmake --build "$tmp/ex" >/dev/null
ctest --test-dir "$tmp/ex" --output-on-failure >/dev/null || { echo "FAIL: the example's ctest failed" >&2; exit 1; }
# 2. pkg-config, the one-line build from the example's header comment.
mkdir -p "$tmp/pc"
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" cc -std=c11 -Wall -Wextra -Werror ${san[@]+"${san[@]}"} -shared -fPIC -fvisibility=hidden \
  "$src/plugins/examples/keyword_environment/keyword_environment.c" \
  $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs dsarl) -Wl,--no-undefined \
  -o "$tmp/pc/dsarl-environment-keyword.so"
# pkg-config --libs carries -lm (the headers' static inline functions reference libm from the plugin itself).
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --libs dsarl | grep -qw -- -lm ||
  { echo "FAIL: pkg-config --libs dsarl lacks -lm" >&2; exit 1; }
# 3. The example's unit test, built against the installed test kit only, passes against the installed plugins.
cc -std=c11 -Wall -Wextra -Werror ${san[@]+"${san[@]}"} "$src/plugins/examples/keyword_environment/test_keyword_environment.c" \
  $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs dsarl) -o "$tmp/test_keyword"
"$tmp/test_keyword" "$tmp/pc" || { echo "FAIL: the example's testkit unit test failed" >&2; exit 1; }

installed="$prefix/bin/dsarl"
abi=$("$installed" --version | sed -n 's/.*plugin ABI \([0-9.]*\).*/\1/p') # the example is built against it
for dir in "$tmp/ex" "$tmp/pc"; do
  out=$("$installed" plugins --plugin-path "$dir")
  # here-strings, not pipes: under pipefail a grep -q that matches in the first chunk of a long echo leaves the
  # echo writing into a closed pipe, and the SIGPIPE fails the check at random
  grep -E "^environment +keyword +1.0.0 +${abi//./\\.} +0 +$dir/dsarl-environment-keyword.so" <<<"$out" >/dev/null ||
    { echo "FAIL: $dir: plugin not listed:"; echo "$out"; exit 1; } >&2
  grep -q "refused: 0" <<<"$out" || { echo "FAIL: refusals:"; echo "$out"; exit 1; } >&2
  # DSARL_PLUGIN_PATH works the same way.
  listed=$(DSARL_PLUGIN_PATH="$dir" "$installed" plugins)
  grep -qE "^environment +keyword" <<<"$listed" ||
    { echo "FAIL: DSARL_PLUGIN_PATH=$dir not searched" >&2; exit 1; }
done

# Selected by a command-line override; its declared keys are listed.
recipe="$prefix/share/dsarl/configs/recipes/llm/grpo-glm5.2-tiny.yaml"
out=$("$installed" config show "$recipe" --plugin-path "$tmp/ex" data.default.env_name=keyword)
grep -E "#   environment +keyword +command line argument 1" <<<"$out" >/dev/null ||
  { echo "FAIL: keyword not selected by the override:"; echo "$out" | tail -12; exit 1; } >&2
grep -q "NOT AVAILABLE.*" <<<"$out" && grep "#   environment" <<<"$out" | grep -q "NOT AVAILABLE" &&
  { echo "FAIL: keyword selected but not available" >&2; exit 1; }
keys=$("$installed" config keys environment/keyword --plugin-path "$tmp/ex")
grep -q "env.keyword.case_sensitive" <<<"$keys" ||
  { echo "FAIL: config keys does not list the plugin's keys" >&2; exit 1; }
# Without the plugin path the same selection is reported as unavailable.
"$installed" config show "$recipe" data.default.env_name=keyword | grep -E "#   environment +keyword" |
  grep -q "NOT AVAILABLE" || { echo "FAIL: missing plugin not reported" >&2; exit 1; }
echo "install + out-of-tree plugin: ok"
