#!/usr/bin/env bash
# test_errors_catalogue.sh BUILD_DIR SOURCE_DIR: every entry of docs/errors.md, run as written: its exit status and
# its message (a fixed piece of stderr) must be what the catalogue says. The catalogue is the table; this script
# only builds the fixtures the entries name ($W/...) and the helpers they call.
#   CATALOGUE_ONLY=ID[,ID...] runs only those entries; CATALOGUE_SHOW=1 prints each entry's stderr.
set -uo pipefail
build=$(realpath "$1") src=$(realpath "$2")
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export LC_ALL=C
failures=0 ran=0

dsarl() { "$build/bin/dsarl" "$@"; }
TINY="$src/configs/recipes/llm/grpo-glm5.2-tiny.yaml"
SFT="$src/configs/recipes/llm/sft-glm5.2-tiny.yaml"
M="$src/tests/fixtures/glm5/glm5.2-tiny"
FX="$src/tests/fixtures"
# a 4-step SFT run of the tiny model saving steps 2 and 4 (about a second on one core)
SFTARGS="policy.megatron_cfg.scheduler.lr_warmup_iters=1 sft.val_at_start=false sft.max_num_steps=4
 checkpointing.save_period=2 checkpointing.keep_top_k=null logger.log_dir=$W/logs runtime.threads=1"

# --- fixtures the entries name -------------------------------------------------------------------------------
mkdir -p "$W/adir" "$W/tok"
echo "a: 1" >"$W/afile.yaml"
mkfifo "$W/fifo.yaml"
head -c $((17 * 1024 * 1024)) /dev/zero | tr '\0' '#' >"$W/huge.yaml"
printf 'a: 1\na: 2\n' >"$W/dup.yaml"
printf 'base: {x: 1}\nd:\n  <<: {x: 2}\n' >"$W/merge.yaml"
printf 'a: !custom 3\n' >"$W/tag.yaml"
printf 'a: !!int 3\n' >"$W/tagint.yaml"
python3 -c "print('k' * 1100 + ': 1')" >"$W/longkey.yaml"
printf 'a: "caf\xe9"\n' >"$W/latin1.yaml"
python3 -c "print('a: ' + '[' * 300 + ']' * 300)" >"$W/deep.yaml"
printf 'defaults:\n  - nowhere.yaml\nx: 1\n' >"$W/nodefault.yaml"
printf 'a: ${nope.key}\n' >"$W/interp_missing.yaml"
printf 'a: ${b}\nb: ${a}\n' >"$W/interp_cycle.yaml"
python3 - "$W/laughs.yaml" <<'PY'
import sys
lines = ['l0: "' + 'x' * 64 + '"'] + ['l%d: "${l%d}${l%d}${l%d}${l%d}"' % (i, i - 1, i - 1, i - 1, i - 1) for i in range(1, 16)]
open(sys.argv[1], 'w').write('\n'.join(lines) + '\n')
PY
printf -- '- 1\n- 2\n' >"$W/toplist.yaml"
printf '? [a, b]\n: 1\n' >"$W/listkey.yaml"
printf 'x: [1, 2\n' >"$W/unclosed.yaml"
printf 'plugins:\n  path: 7\n' >"$W/plugpath.yaml"
echo '{"input": "1+1", "output": "2"}' >"$W/ok.jsonl"
printf '{"input": "1+1", "output": "2"}\n{"input": \n' >"$W/badline.jsonl"
echo '{"question": "1+1", "output": "2"}' >"$W/nokey.jsonl"
echo '{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}' >"$W/tok/tokenizer.json"
mkdir -p "$W/tokbad" && echo '{"model": ' >"$W/tokbad/tokenizer.json"
# model directories: copies of the tiny fixture, each broken in one way
model() { rm -rf "$W/$1" && cp -r "$M" "$W/$1"; }
model m_noconfig && rm "$W/m_noconfig/config.json"
model m_badjson && echo '{"hidden_size": ' >"$W/m_badjson/config.json"
model m_noweights && rm "$W/m_noweights/model.safetensors"
model m_trunc && truncate -s 4000 "$W/m_trunc/model.safetensors"
model m_hdrlen && printf '\xff\xff\xff\xff\xff\xff\x00\x00' | dd of="$W/m_hdrlen/model.safetensors" conv=notrunc 2>/dev/null
for d in m_negdim m_hugedim m_type m_dtype m_shape; do model $d; done
python3 - "$W" <<'PY'
import json, struct, sys
w = sys.argv[1]
def edit_config(d, **kv):
    p = f"{w}/{d}/config.json"; c = json.load(open(p)); c.update(kv); json.dump(c, open(p, 'w'))
edit_config('m_negdim', hidden_size=-64)
edit_config('m_hugedim', hidden_size=1 << 40)
edit_config('m_type', model_type='llama', architectures=['LlamaForCausalLM'])
def edit_header(d, fn):
    p = f"{w}/{d}/model.safetensors"; b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n]); fn(h); hb = json.dumps(h, separators=(',', ':')).encode()
    hb += b' ' * (n - len(hb)); assert len(hb) == n
    open(p, 'wb').write(struct.pack('<Q', n) + hb + b[8 + n:])
def dtype(h): h['lm_head.weight']['dtype'] = 'Q4'
def shape(h): h['lm_head.weight']['shape'] = [7, 7]
edit_header('m_dtype', dtype)
edit_header('m_shape', shape)
PY
printf '[[1, 2, 3]]' >"$W/ids.json"
python3 -c "print([[1] * 300])" >"$W/ids_long.json"
printf '[[1, 2], [3]]' >"$W/ids_ragged.json"
printf '[[1, 99999]]' >"$W/ids_vocab.json"
ln -s /dev/zero "$W/zero.yaml"
touch "$W/afile"
# plugins
src_plugin="$build/lib/dsarl/plugins/dsarl-environment-math.so"
mkdir -p "$W/ww_plug" "$W/ww_dir" "$W/notelf" && cp "$src_plugin" "$W/ww_plug/" && chmod 0666 "$W/ww_plug/"*.so
cp "$src_plugin" "$W/ww_dir/" && chmod 0777 "$W/ww_dir"
echo "not a shared object" >"$W/notelf/dsarl-environment-fake.so"
# the pristine checkpoints every checkpoint entry copies
dsarl run "$SFT" $SFTARGS checkpointing.checkpoint_dir="$W/ck0" >"$W/ck0.log" 2>&1 ||
  { echo "FAIL: could not make the pristine checkpoints: $(tail -5 "$W/ck0.log")"; exit 1; }

# --- helpers the entries call --------------------------------------------------------------------------------
ck() { rm -rf "$W/$1" && cp -r "$W/ck0" "$W/$1"; } # ck NAME: a fresh copy of step_2 and step_4 at $W/NAME
# remanifest STEP_DIR: rewrite its manifest's sizes and CRC-32s after an edit, so only the edit is wrong
remanifest() {
  python3 - "$1" <<'PY'
import json, sys, zlib, os
d = sys.argv[1]; p = os.path.join(d, 'manifest.json'); m = json.load(open(p))
for f in m['files']:
    b = open(os.path.join(d, f['path']), 'rb').read(); f['size'] = len(b); f['crc32'] = '%08x' % zlib.crc32(b)
json.dump(m, open(p, 'w'))
PY
}
# info STEP_DIR PYTHON: edit training_info.json (as `j`), then remanifest
info() {
  python3 - "$1" "$2" <<'PY'
import json, sys
p = sys.argv[1] + '/training_info.json'; j = json.load(open(p)); exec(sys.argv[2]); json.dump(j, open(p, 'w'))
PY
  remanifest "$1"
}
# sigrun SIGNAL: a long SFT run, interrupted by SIGNAL once its first step is logged; returns its status
sigrun() {
  # a background job of a script starts with SIGINT ignored; the run must see the signal as a user's ^C
  python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
    "$build/bin/dsarl" run "$SFT" $SFTARGS sft.max_num_steps=100000 checkpointing.checkpoint_dir="$W/sig_$1" \
    2>"$W/sig.err" &
  local pid=$! i
  for i in $(seq 1 200); do grep -q "sft step 1/" "$W/sig.err" && break; sleep 0.05; done
  kill -"$1" $pid
  (sleep 60; kill -9 $pid 2>/dev/null) & # never outlive the test if the signal were ignored
  local watchdog=$!
  wait $pid
  local status=$?
  kill $watchdog 2>/dev/null
  cat "$W/sig.err" >&2
  return $status
}

# --- the catalogue -------------------------------------------------------------------------------------------
catalogue="$src/docs/errors.md"
re='^\| `([a-z0-9-]+)` \| (.*) \| ([0-9]+) \| `(.*)` \| `(.*)` \|$'
while IFS= read -r line; do
  [[ $line =~ $re ]] || continue
  id=${BASH_REMATCH[1]} want=${BASH_REMATCH[3]} msg=${BASH_REMATCH[4]} cmd=${BASH_REMATCH[5]}
  cmd=${cmd//\\|/|} msg=${msg//\\|/|} # a table cell spells | as \|
  if [ -n "${CATALOGUE_ONLY:-}" ] && [[ ",$CATALOGUE_ONLY," != *",$id,"* ]]; then continue; fi
  ran=$((ran + 1))
  (cd "$W" && eval "$cmd") >"$W/out" 2>"$W/err" </dev/null
  got=$?
  [ -n "${CATALOGUE_SHOW:-}" ] && { echo "== $id ($got)"; grep -v " INFO " "$W/err" | head -5; }
  if [ "$got" -ne "$want" ]; then
    echo "FAIL $id: exit status $got, the catalogue says $want; stderr: $(grep -v ' INFO ' "$W/err" | head -c 600)"
    failures=$((failures + 1))
  elif ! grep -qF -- "$msg" "$W/err"; then
    echo "FAIL $id: stderr lacks '$msg': $(grep -v ' INFO ' "$W/err" | head -c 600)"
    failures=$((failures + 1))
  fi
done <"$catalogue"
[ "$ran" -ge 1 ] || { echo "FAIL: no catalogue entries found in $catalogue"; exit 1; }
if [ -z "${CATALOGUE_ONLY:-}" ] && [ "$ran" -lt 100 ]; then
  echo "FAIL: the catalogue has $ran entries, fewer than 100"
  failures=$((failures + 1))
fi
echo "errors catalogue: $ran entries, $failures failed"
exit $((failures > 0))
