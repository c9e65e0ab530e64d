#!/usr/bin/env bash
# test_cli.sh BUILD_DIR SOURCE_DIR: the dsarl binary end to end: help and version, `plugins`,
# `config show` with overrides and origins, NeMo RL's own GLM recipes unchanged, and the one-line errors and exit
# statuses for bad input.
set -uo pipefail
build=$1 src=$2
dsarl="$build/bin/dsarl"
failures=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
# expect STATUS NAME -- command...: runs the command, checks its exit status, keeps stdout/stderr in $tmp/out,err
expect() {
  local want=$1 name=$2; shift 3
  "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  [ "$got" -eq "$want" ] || fail "$name: exit status $got, wanted $want; stderr: $(head -c 600 "$tmp/err")"
}
contains() { grep -qF -- "$2" "$tmp/$1" || fail "$3: '$2' not in $1: $(head -c 800 "$tmp/$1")"; }
one_error_line() {
  local n; n=$(grep -c "dsarl.*error" "$tmp/err")
  [ "$n" -eq 1 ] || fail "$1: expected exactly one error line, got $n: $(cat "$tmp/err")"
}

# --- version and help ------------------------------------------------------------------------------------------
expect 0 version -- "$dsarl" --version
contains out "plugin ABI 1.7" version
expect 0 help -- "$dsarl" --help
contains out "exit status" help
for sub in "run --help" "plugins --help" "config --help" "config show --help"; do
  expect 0 "help $sub" -- "$dsarl" $sub
  contains out "usage: dsarl" "help $sub"
done
expect 2 no-command -- "$dsarl"
expect 2 unknown-command -- "$dsarl" frobnicate
contains err "unknown command 'frobnicate'" unknown-command
expect 2 bad-log-level -- "$dsarl" --log-level loud plugins
contains err "--log-level needs one of" bad-log-level

# --- plugins ---------------------------------------------------------------------------------------------------
expect 0 plugins -- "$dsarl" plugins
contains out "KIND" plugins
contains out "refused: 0" plugins
contains out "beside libdsarl" plugins
# DSA backends print their route table (which engine serves each op); the reference runs its own code throughout
contains out "routes: every op runs this backend's own kernels" plugins
if [ -e "$build/lib/dsarl/plugins/dsarl-dsa-cudnn.so" ]; then # CUDA builds: cudnn's hand-overs are spelled out
  contains out "routes (op | sizes | engine):" plugins
  contains out "sparse_mla_backward | absorbed, every size | hand-over: tilelang" plugins
  contains out "indexer_topk | every size | hand-over: tilelang" plugins
fi

# --- config show ---------------------------------------------------------------------------------------------
recipe="$src/configs/recipes/llm/grpo-glm5.2-64n8g-megatron-6K-colocated.yaml"
expect 0 config-show -- "$dsarl" config show "$recipe" policy.megatron_cfg.model_overrides.dsa_kernel_backend=tilelang
grep -E "dsa_kernel_backend: tilelang +# command line" "$tmp/out" >/dev/null ||
  fail "config-show: tilelang not annotated as from the command line: $(grep dsa_kernel_backend "$tmp/out")"
grep -E "#   dsa +tilelang +command line" "$tmp/out" >/dev/null ||
  fail "config-show: the dsa selection does not say tilelang from the command line: $(grep '#   dsa' "$tmp/out")"
grep -E "tensor_model_parallel_size: 2 +# .*grpo-glm5.2-64n8g-megatron-6K-colocated.yaml:[0-9]+:[0-9]+" "$tmp/out" \
  >/dev/null || fail "config-show: recipe values are not annotated with file:line:col"
grep -E "reference_policy_kl_type: k3 +# .*grpo_math.yaml:[0-9]+:[0-9]+" "$tmp/out" >/dev/null ||
  fail "config-show: inherited values are not annotated with the base file"
# The shown recipe is valid YAML that loads back to the same values.
sed 's/  *#.*$//' "$tmp/out" | sed '/^$/,$d' >"$tmp/shown.yaml"
expect 0 config-show-roundtrip -- "$dsarl" config show "$tmp/shown.yaml"

# Every shipped recipe resolves.
for r in "$src"/configs/recipes/llm/*.yaml; do
  expect 0 "config show $(basename "$r")" -- "$dsarl" config show "$r"
done

# --- NeMo RL's own GLM recipes, unchanged ------------------------------------------------------------------
nemo="$src/tests/fixtures/nemo_rl/examples/configs/recipes/llm"  # vendored (its README.md)
if [ -d "$nemo" ]; then
  for r in "$nemo"/grpo-glm5*.yaml; do
    name=$(basename "$r")
    expect 0 "nemo $name" -- "$dsarl" config show "$r"
    contains out "unused" "nemo $name"
    op="policy.megatron_cfg.model_overrides.dsa_kernel_backend=tilelang"
    case $name in grpo-glm5.1*) op="++$op" ;; esac
    expect 0 "nemo $name override" -- "$dsarl" config show "$r" "$op"
    grep -E "dsa_kernel_backend: tilelang +# command line" "$tmp/out" >/dev/null || fail "nemo $name: override not shown"
  done
else
  fail "$nemo absent: the vendored NeMo RL recipes are missing"
fi

# --- bad input: one line naming the place, non-zero status ------------------------------------------------
expect 3 missing-recipe -- "$dsarl" config show "$tmp/nope.yaml"
contains err "nope.yaml" missing-recipe
one_error_line missing-recipe

expect 3 unknown-override -- "$dsarl" config show "$recipe" grpo.normalise_rewards=false
contains err "grpo.normalise_rewards" unknown-override
contains err "did you mean 'grpo.normalize_rewards'" unknown-override
contains err "command line argument 1" unknown-override
one_error_line unknown-override

printf 'grpo:\n  a: 1\n   b: [2\n' >"$tmp/malformed.yaml"
expect 3 malformed-yaml -- "$dsarl" config show "$tmp/malformed.yaml"
grep -E "malformed.yaml:[0-9]+:[0-9]+" "$tmp/err" >/dev/null || fail "malformed-yaml: no file:line:col: $(cat "$tmp/err")"
one_error_line malformed-yaml

printf 'defaults: b.yaml\nx: 1\n' >"$tmp/a.yaml"
printf 'defaults: a.yaml\ny: 2\n' >"$tmp/b.yaml"
expect 3 include-cycle -- "$dsarl" config show "$tmp/a.yaml"
contains err "a.yaml -> " include-cycle
one_error_line include-cycle

printf 'runtime:\n  device: 3\n' >"$tmp/badtype.yaml"
expect 3 selecting-key-type -- "$dsarl" config show "$tmp/badtype.yaml"
contains err "badtype.yaml:2:" selecting-key-type
contains err "runtime.device" selecting-key-type

printf 'a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\ng: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\n' >"$tmp/bomb.yaml"
start=$(date +%s%N)
expect 3 alias-bomb -- "$dsarl" config show "$tmp/bomb.yaml"
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ "$elapsed_ms" -lt 5000 ] || fail "alias-bomb: took ${elapsed_ms} ms to refuse"
one_error_line alias-bomb

# An unknown key inside a section a plugin owns stops `run` with a suggestion; `config show` lists it as a problem.
tiny="$src/configs/recipes/llm/grpo-glm5.2-tiny.yaml"
expect 3 owned-unknown-key -- "$dsarl" run "$tiny" +runtime.devise=cpu
contains err "runtime.devise" owned-unknown-key
contains err "did you mean 'runtime.device'" owned-unknown-key
contains err "command line argument 1" owned-unknown-key
one_error_line owned-unknown-key
expect 3 owned-wrong-type -- "$dsarl" run "$tiny" runtime.threads=many
contains err "runtime.threads" owned-wrong-type
expect 3 show-lists-problem -- "$dsarl" config show "$tiny" +runtime.devise=cpu
contains out "# problems (\`dsarl run\` stops at the first): 1" show-lists-problem
# Keys the host reads are not reported unused; keys nobody reads are.
grep -E "^#   runtime\.device " "$tmp/out" >/dev/null && fail "runtime.device reported unused"
contains out "# unused keys" show-lists-problem

# `run` stops before heavy work when a selected plugin is missing, naming the key and the available names.
expect 4 missing-plugin -- "$dsarl" run "$recipe" policy.megatron_cfg.model_overrides.dsa_kernel_backend=nosuch
contains err "no dsa plugin named 'nosuch'" missing-plugin
contains err "available:" missing-plugin
contains err "command line argument 1" missing-plugin
expect 2 run-unknown-option -- "$dsarl" run "$recipe" --frobnicate
expect 2 config-keys-bad -- "$dsarl" config keys nonsense

if [ "$failures" -gt 0 ]; then
  echo "$failures CLI check(s) failed" >&2
  exit 1
fi
echo "all CLI checks passed"
