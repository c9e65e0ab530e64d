#!/usr/bin/env bash
# test_bench_model.sh BUILD_DIR SOURCE_DIR: `dsarl bench train` and `dsarl bench generate` on the cpu device with the
# tiny GLM-5.2 fixture config: the printed FLOPs of a step equal the count derived here from the config alone (by
# the formula of `dsarl bench train --help`, written independently of the C code, which counts from the model's
# tensors), tokens/s > 0, finite losses, every generated token accounted for, GRPO's shape (--groups x --samples,
# sampled, --stop-at-eos: its json figures consistent with each other and seeded), and bad options refused with one
# error line and exit status 2.
set -uo pipefail
build=$1 src=$2
dsarl="$build/bin/dsarl"
config="$src/tests/fixtures/glm5/glm5.2-tiny/config.json"
failures=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
expect() {
  local want=$1 name=$2; shift 3
  "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  [ "$got" -eq "$want" ] || fail "$name: exit status $got, wanted $want; stderr: $(head -c 600 "$tmp/err")"
}
one_error_line() {
  local n; n=$(grep -c "error" "$tmp/err")
  [ "$n" -eq 1 ] || fail "$1: expected exactly one error line, got $n: $(cat "$tmp/err")"
  grep -q "dsarl bench.*error: .*--" "$tmp/err" || fail "$1: the error does not name the option: $(cat "$tmp/err")"
}

# --- train: 2 sequences x 24 tokens (longer than index_topk 4, so the top-k cap matters) ---------------------------
expect 0 train -- "$dsarl" bench train --device cpu --config "$config" --tokens 24 --batch 2 --steps 2 --warmup 1 \
  --ceiling-iters 1 --seed 3
cp "$tmp/out" "$tmp/train.out"
python3 - "$config" "$tmp/train.out" <<'PY' || fail "train: figures (see above)"
import json, math, sys
c = json.load(open(sys.argv[1]))
rec = [json.loads(l[6:]) for l in open(sys.argv[2]) if l.startswith("json: ") and '"train_step"' in l]
assert len(rec) == 1, f"expected one train_step json line, got {len(rec)}"
r = rec[0]
B, S = 2, 24
# per token matmul weights, layer by layer from the config (tiny fixture: every key present)
C, V, H = c["hidden_size"], c["vocab_size"], c["num_attention_heads"]
nope, rope, v, qr, kvr = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["q_lora_rank"], c["kv_lora_rank"]
attn = C * qr + qr * H * (nope + rope) + C * (kvr + rope) + kvr * H * (nope + v) + H * v * C
sparse = c["n_routed_experts"] * C + (c["num_experts_per_tok"] + c["n_shared_experts"]) * 3 * C * c["moe_intermediate_size"]
dense = 3 * C * c["intermediate_size"]
n_lm = V * C + sum(attn + (sparse if t == "sparse" else dense) for t in c["mlp_layer_types"])
full = c["indexer_types"].count("full")
nI, dI, k = c["index_n_heads"], c["index_head_dim"], c["index_topk"]
n_idx = full * (qr * nI * dI + C * dI + C * nI)
selected = B * sum(min(t + 1, k) for t in range(S))     # keys each query attends (top-k capped)
causal = B * sum(t + 1 for t in range(S))                # keys the indexer scores
L = c["num_hidden_layers"]
want = 6 * n_lm * B * S + 2 * n_idx * B * S + 3 * L * 2 * H * (nope + rope + v) * selected + full * 2 * nI * dI * causal
assert r["flops_per_step"] == want, f"flops_per_step {r['flops_per_step']} != {want} derived from the config"
assert r["active_params"] == n_lm and r["indexer_params"] == n_idx, (r["active_params"], n_lm, r["indexer_params"], n_idx)
assert r["tokens"] == B * S and r["tokens_per_s"] > 0 and r["ms"] > 0, r
assert math.isfinite(r["loss"]) and math.isfinite(r["first_loss"]) and r["loss"] > 0, r
assert abs(r["first_loss"] - math.log(V)) < 0.5, f"random init should start near ln(V) = {math.log(V):.3f}: {r}"
assert r["gemm_ceiling_tflops"] > 0 and r["copy_gbs"] > 0 and 0 < r["mfu"], r
assert any(l.startswith("FLOPs/step = 6*N_lm*T") for l in open(sys.argv[2])), "the formula is not printed"
print(f"train ok: {want} FLOPs/step, {r['tokens_per_s']} tokens/s, loss {r['first_loss']:.4f} -> {r['loss']:.4f}")
PY

# --- generate: 3 prompts x 5 tokens, 6 new tokens each -------------------------------------------------------------
expect 0 generate -- "$dsarl" bench generate --device cpu --config "$config" --batch 3 --prompt-len 5 --new-tokens 6 \
  --ceiling-iters 1
python3 - "$tmp/out" <<'PY' || fail "generate: figures (see above)"
import json, sys
rec = [json.loads(l[6:]) for l in open(sys.argv[1]) if l.startswith("json: ") and '"generate"' in l]
assert len(rec) == 1, f"expected one generate json line, got {len(rec)}"
r = rec[0]
assert (r["batch"], r["prompt_len"], r["new_tokens"]) == (3, 5, 6), r
assert r["tokens_per_s"] > 0 and r["ms"] > 0 and r["floor_tokens_per_s"] > 0, r
assert abs(r["tokens_per_s"] * r["ms"] / 1e3 - 18) < 1e-3 * 18, f"tokens/s x time is not the 18 new tokens: {r}"
print(f"generate ok: {r['tokens_per_s']} tokens/s")
PY

# --- generate, GRPO's shape: 2 prompts x 4 samples, sampled, ended at the config's EOS (id 1 of a vocabulary of 128;
# near-uniform random-init logits draw it about once in 128 tokens, so 200 new tokens stop nearly every sequence) ----
grpo=(--device cpu --config "$config" --groups 2 --samples 4 --prompt-len 8 --max-new-tokens 200 --temperature 1.0
      --top-p 0.95 --top-k 100 --ceiling-iters 1 --steps 2 --seed 7)
expect 0 generate-grpo -- "$dsarl" bench generate "${grpo[@]}" --stop-at-eos
cp "$tmp/out" "$tmp/grpo1.out"
expect 0 generate-grpo-again -- "$dsarl" bench generate "${grpo[@]}" --stop-at-eos eos
cp "$tmp/out" "$tmp/grpo2.out"
expect 0 generate-grpo-id -- "$dsarl" bench generate "${grpo[@]}" --stop-at-eos 5 --warmup 0
cp "$tmp/out" "$tmp/grpo3.out"
python3 - "$tmp/grpo1.out" "$tmp/grpo2.out" "$tmp/grpo3.out" <<'PY' || fail "generate GRPO shape: figures (see above)"
import json, math, sys
def record(path):
    rec = [json.loads(l[6:]) for l in open(path) if l.startswith("json: ") and '"generate"' in l]
    assert len(rec) == 1, f"{path}: expected one generate json line, got {len(rec)}"
    return rec[0]
close = lambda a, b, rel=1e-3: abs(a - b) <= rel * max(abs(a), abs(b), 1e-9)
a, b, c = (record(p) for p in sys.argv[1:])
for r, stops in ((a, [1]), (b, [1]), (c, [5])):
    assert (r["groups"], r["samples"], r["batch"], r["prompt_len"], r["new_tokens"]) == (2, 4, 8, 8, 200), r
    assert (r["temperature"], r["top_p"], r["top_k"], r["seed"], r["stop_ids"]) == (1, 0.95, 100, 7, stops), r
    B = r["batch"]
    assert close(r["tokens"], B * r["mean_len"], 1e-6), f"tokens != batch x mean length: {r}"
    assert 1 <= r["mean_len"] <= r["max_len"] <= r["new_tokens"], r
    assert close(r["tokens_per_s"] * r["ms"] / 1e3, r["tokens"]), f"tokens/s x time != tokens: {r}"
    assert r["prefill_ms"] > 0 and r["decode_ms"] > 0 and close(r["prefill_ms"] + r["decode_ms"], r["ms"]), r
    assert close(r["decode_tokens"], r["tokens"] - B, 1e-6), f"decode tokens != tokens - batch: {r}"
    assert close(r["decode_tokens_per_s"] * r["decode_ms"] / 1e3, r["decode_tokens"]), r
    assert r["decode_steps"] == r["max_len"] - 1, r  # the same draws every call: the longest is the same
    assert close(r["decode_step_ms"] * r["decode_steps"], r["decode_ms"]), r
    assert r["floor_tokens_per_s"] > 0, r
    assert close(r["floor_ratio"], r["decode_tokens_per_s"] / r["floor_tokens_per_s"], 1e-2), r
    assert close(r["floor_tokens_per_s"] * r["floor_ms"] / 1e3, B, 1e-2), f"floor tokens/s x step != batch: {r}"
# an EOS in about 1 of 128 draws: 8 sequences of 200 tokens do not all miss it (p < 1e-5)
assert a["mean_len"] < 200, f"no sequence stopped at the EOS: {a}"
# the draws are seeded: the same run twice makes the same completions
assert (a["tokens"], a["max_len"]) == (b["tokens"], b["max_len"]), (a, b)
calls = [l.split() for l in open(sys.argv[1]) if l.startswith(("warmup ", "timed "))]
assert [c[0] for c in calls] == ["warmup", "timed", "timed"] and len({c[2] for c in calls}) == 1, calls
assert all(close(float(c[4]), a["mean_len"], 1e-2) for c in calls), (calls, a)
print(f"generate GRPO ok: mean length {a['mean_len']} of up to 200, {a['tokens_per_s']} tokens/s, "
      f"decode {a['decode_tokens_per_s']} tokens/s, prefill {a['prefill_ms']:.2f} ms")
PY
shape_line="^generate (batch 8 = 2 prompts x 4 samples, prompt 8, up to 200 new tokens, temperature 1, top-p 0.95, "
shape_line+="top-k 100, seed 7, stop at 1, mean of 2)"
grep -q "$shape_line" "$tmp/grpo1.out" || fail "generate GRPO: the shape line: $(grep '^generate' "$tmp/grpo1.out")"

# --- bad options: one sentence, exit 2 ---------------------------------------------------------------------------
expect 2 bad-tokens -- "$dsarl" bench train --device cpu --config "$config" --tokens 1
one_error_line bad-tokens
expect 2 bad-batch -- "$dsarl" bench generate --device cpu --config "$config" --batch zero
one_error_line bad-batch
expect 2 unknown -- "$dsarl" bench train --frobnicate 3
one_error_line unknown
expect 2 train-only-option -- "$dsarl" bench generate --lr 0.1
one_error_line train-only-option
expect 2 generate-only-option -- "$dsarl" bench train --temperature 1
one_error_line generate-only-option
expect 2 bad-samples -- "$dsarl" bench generate --device cpu --config "$config" --groups 2 --samples 0
one_error_line bad-samples
grep -q -- "--samples needs an integer in \[1, 65536\], got '0'" "$tmp/err" || fail "bad-samples: $(cat "$tmp/err")"
expect 2 bad-top-p -- "$dsarl" bench generate --device cpu --config "$config" --top-p 2
one_error_line bad-top-p
grep -q -- "--top-p needs a number in (0, 1\], got '2'" "$tmp/err" || fail "bad-top-p: $(cat "$tmp/err")"
expect 2 bad-temperature -- "$dsarl" bench generate --device cpu --config "$config" --temperature -0.5
one_error_line bad-temperature
expect 2 batch-not-groups -- "$dsarl" bench generate --device cpu --config "$config" --groups 2 --samples 4 --batch 7
one_error_line batch-not-groups
expect 2 batch-not-multiple -- "$dsarl" bench generate --device cpu --config "$config" --batch 10 --samples 4
one_error_line batch-not-multiple
expect 2 two-lengths -- "$dsarl" bench generate --device cpu --config "$config" --new-tokens 5 --max-new-tokens 6
one_error_line two-lengths
expect 2 bad-stop -- "$dsarl" bench generate --device cpu --config "$config" --stop-at-eos eos1
one_error_line bad-stop
expect 3 stop-outside-vocab -- "$dsarl" bench generate --device cpu --config "$config" --stop-at-eos 128 \
  --ceiling-iters 1
grep -q -- "--stop-at-eos 128 is outside the vocabulary \[0, 128)" "$tmp/err" \
  || fail "stop-outside-vocab: $(cat "$tmp/err")"
expect 2 both-sources -- "$dsarl" bench train --config "$config" --model-dir "$tmp"
one_error_line both-sources
expect 2 missing-value -- "$dsarl" bench train --device
one_error_line missing-value
expect 3 no-such-config -- "$dsarl" bench train --device cpu --config no-such-bench-config
grep -q "is neither a file nor a built-in bench config" "$tmp/err" || fail "no-such-config: $(cat "$tmp/err")"
expect 0 help -- "$dsarl" bench train --help
grep -q "FLOPs\|flops\|MFU" "$tmp/out" || fail "help: $(cat "$tmp/out")"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all bench model checks passed"
