#!/usr/bin/env python3
"""tools/bench/generate_torch.py: the transformers peer of `dsarl bench generate`: GlmMoeDsaForCausalLM built from the
same config.json (bf16, sdpa, eager if refused; random init), generate() of a batch of random prompts with its KV
cache, timed with CUDA events after a warm-up call, beside the ceilings measured in the same run. Prints a table and
a `json:` line with the fields dsarl prints.

The shapes are `dsarl bench generate`'s: --batch B distinct prompts, or GRPO's --groups P --samples G (each of P
prompts G times in a row; transformers has no prefix sharing, so it prefills every copy); greedy by default (every
sequence forced to --new-tokens tokens with min_new_tokens), or sampled (--temperature > 0, --top-p, --top-k; the
draws seeded by --seed through torch.manual_seed before each call); --stop-at-eos [eos|ID] ends a sequence at the
config's eos_token_id (every id of a list) or at ID, and the mean completion length (up to and with the stop id) is
reported. Prefill time is a call of the same batch with one new token; decode = the call less it.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_common import Clock, build_model, ceilings, flop_shape, load_config  # noqa: E402


def positive(text):
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"needs an integer >= 1, got {text}")
    return v


def top_p_value(text):
    v = float(text)
    if not 0.0 < v <= 1.0:
        raise argparse.ArgumentTypeError(f"needs a number in (0, 1], got {text}")
    return v


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "../../configs/bench/glm5.2-3b.json"))
    ap.add_argument("--batch", type=positive, default=None, help="distinct prompts (default 32)")
    ap.add_argument("--groups", type=positive, default=None, help="distinct prompts of a GRPO batch (P)")
    ap.add_argument("--samples", type=positive, default=1, help="sequences per prompt (G)")
    ap.add_argument("--prompt-len", type=positive, default=128)
    ap.add_argument("--new-tokens", "--max-new-tokens", dest="new_tokens", type=positive, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=top_p_value, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--stop-at-eos", nargs="?", const="eos", default=None, metavar="eos|ID")
    ap.add_argument("--steps", type=positive, default=1)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--ceiling-iters", type=positive, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    if a.temperature < 0 or a.top_k < 0:
        ap.error("--temperature and --top-k need values >= 0")
    if a.groups is not None:
        if a.batch is not None and a.batch != a.groups * a.samples:
            ap.error(f"--batch {a.batch} is not --groups {a.groups} x --samples {a.samples}")
        a.batch = a.groups * a.samples
    else:
        a.batch = 32 if a.batch is None else a.batch
        if a.batch % a.samples:
            ap.error(f"--batch {a.batch} is not a multiple of --samples {a.samples}")
        a.groups = a.batch // a.samples
    return a


def stop_ids(a, raw):
    if a.stop_at_eos is None:
        return []
    if a.stop_at_eos != "eos":
        ids = [int(a.stop_at_eos)]
    else:
        eos = raw.get("eos_token_id")
        if eos is None:
            sys.exit(f"generate_torch.py: --stop-at-eos: {a.config} has no eos_token_id; give the id to stop at")
        ids = eos if isinstance(eos, list) else [eos]
    for i in ids:
        if not 0 <= i < raw["vocab_size"]:
            sys.exit(f"generate_torch.py: --stop-at-eos {i} is outside the vocabulary [0, {raw['vocab_size']})")
    return ids


def completion_lengths(out, prompt_len, stops):
    """Tokens of each row up to and with its first stop id (all of them when none)."""
    new = out[:, prompt_len:]
    n = new.shape[1]
    if not stops:
        return [n] * new.shape[0]
    hit = torch.zeros_like(new, dtype=torch.bool)
    for s in stops:
        hit |= new == s
    lengths = []
    for row in hit.cpu():
        idx = torch.nonzero(row)
        lengths.append(int(idx[0]) + 1 if len(idx) else n)
    return lengths


def main():
    a = parse_args()
    from transformers import GenerationConfig
    dev = a.device
    gemm, copy_gbs = ceilings(dev, a.ceiling_iters)
    raw, cfg = load_config(a.config)
    stops = stop_ids(a, raw)
    model, attn = build_model(cfg, a.attn, dev, a.seed)
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    shape = flop_shape(raw)
    print(f"transformers GlmMoeDsaForCausalLM: {n_params} parameters ({n_params / 1e9:.3f} B); attn {attn}")
    gen = torch.Generator(device="cpu").manual_seed(a.seed)
    prompts = torch.randint(0, raw["vocab_size"], (a.groups, a.prompt_len), generator=gen)
    ids = prompts.repeat_interleave(a.samples, dim=0).to(dev)  # each prompt's samples one after another
    sampling = dict(do_sample=True, temperature=a.temperature, top_p=a.top_p, top_k=a.top_k) \
        if a.temperature > 0 else dict(do_sample=False)

    def config(max_new):
        # without a stop, every sequence runs to max_new (min_new_tokens masks the config's EOS until then)
        least = 1 if stops else max_new
        return GenerationConfig(max_new_tokens=max_new, min_new_tokens=least, use_cache=True, pad_token_id=0,
                                eos_token_id=stops if stops else raw.get("eos_token_id"), **sampling)

    full, first = config(a.new_tokens), config(1)
    clock = Clock(dev)

    def call(gc):
        torch.manual_seed(a.seed)
        t0 = clock.mark()
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
        t1 = clock.mark()
        return clock.ms(t0, t1), completion_lengths(out, a.prompt_len, stops)

    print(f"{'call':6s} {'ms':>10s} {'new tokens':>14s} {'tokens/s':>12s} {'mean len':>10s} {'prefill ms':>12s}")
    total_ms, generated, prefill_ms, decode_steps, longest = 0.0, 0, 0.0, 0.0, 0
    with torch.no_grad():
        for s in range(a.warmup + a.steps):
            ms, lengths = call(full)
            n = sum(lengths)
            if not stops:
                assert n == a.batch * a.new_tokens, f"{n} new tokens, expected {a.batch * a.new_tokens}"
            line = f"{'warmup' if s < a.warmup else 'timed':6s} {ms:10.1f} {n:14d} {n / ms * 1e3:12.1f} " \
                   f"{n / a.batch:10.2f}"
            if s >= a.warmup:
                p_ms, _ = call(first)
                line += f" {p_ms:12.1f}"
                total_ms, generated = total_ms + ms, generated + n
                prefill_ms += p_ms / a.steps
                decode_steps += (max(lengths) - 1) / a.steps
                longest = max(longest, max(lengths))
            print(line)
    ms, tok_s = total_ms / a.steps, generated / total_ms * 1e3
    tokens = generated / a.steps
    mean_len = tokens / a.batch
    decode_ms = max(ms - prefill_ms, 0.0)
    decode_tokens = tokens - a.batch
    decode_tok_s = decode_tokens / decode_ms * 1e3 if decode_ms > 0 else 0.0
    step_ms = decode_ms / decode_steps if decode_steps > 0 else 0.0
    flops = a.batch * 2.0 * (shape["n_lm"] + shape["n_idx"]) * (a.prompt_len + round(mean_len))
    how = f"temperature {a.temperature:g}, top-p {a.top_p:g}, top-k {a.top_k}, seed {a.seed}" if a.temperature > 0 \
        else "greedy"
    stop_text = "stop at " + ",".join(map(str, stops)) if stops else "no stop"
    print(f"generate (batch {a.batch} = {a.groups} prompts x {a.samples} samples, prompt {a.prompt_len}, up to "
          f"{a.new_tokens} new tokens, {how}, {stop_text}, mean of {a.steps}): {ms:.1f} ms, {tok_s:.1f} generated "
          f"tokens/s, mean completion {mean_len:.2f} tokens (longest {longest})")
    print(f"prefill {prefill_ms:.1f} ms (the batch to one new token); decode {decode_ms:.1f} ms, {decode_tokens:.0f} "
          f"tokens in {decode_steps:.0f} steps: {step_ms:.3f} ms/step, {decode_tok_s:.1f} tokens/s")
    print("json: " + json.dumps(dict(
        impl="torch", op="generate", device=dev, backend=f"transformers {attn}", params=n_params,
        active_params=shape["n_lm"], batch=a.batch, prompt_len=a.prompt_len, new_tokens=a.new_tokens,
        ms=round(ms, 3), tokens_per_s=round(tok_s, 1), tflops=round(flops / ms / 1e9, 3),
        gemm_ceiling_tflops=round(gemm, 1), copy_gbs=round(copy_gbs), groups=a.groups, samples=a.samples,
        temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, seed=a.seed, stop_ids=stops,
        tokens=round(tokens, 2), mean_len=round(mean_len, 4), max_len=longest, prefill_ms=round(prefill_ms, 3),
        decode_ms=round(decode_ms, 3), decode_tokens=round(decode_tokens, 2), decode_steps=round(decode_steps, 2),
        decode_step_ms=round(step_ms, 4), decode_tokens_per_s=round(decode_tok_s, 1))))


if __name__ == "__main__":
    main()
