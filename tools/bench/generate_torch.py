#!/usr/bin/env python3
"""tools/bench/generate_torch.py: the transformers peer of `dsarl bench generate`: GlmMoeDsaForCausalLM built from the
same config.json (bf16, sdpa, eager if refused; random init), greedy generate() of B random prompts with its KV
cache, every sequence forced to --new-tokens tokens (min_new_tokens), timed with CUDA events after a warm-up call,
beside the ceilings measured in the same run. Prints a table and a `json:` line with the fields dsarl prints.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_common import Clock, build_model, ceilings, flop_shape, load_config  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "../../configs/bench/glm5.2-3b.json"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--ceiling-iters", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    from transformers import GenerationConfig
    dev = a.device
    gemm, copy_gbs = ceilings(dev, a.ceiling_iters)
    raw, cfg = load_config(a.config)
    model, attn = build_model(cfg, a.attn, dev, a.seed)
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    shape = flop_shape(raw)
    print(f"transformers GlmMoeDsaForCausalLM: {n_params} parameters ({n_params / 1e9:.3f} B); attn {attn}")
    gen = torch.Generator(device="cpu").manual_seed(a.seed)
    ids = torch.randint(0, raw["vocab_size"], (a.batch, a.prompt_len), generator=gen).to(dev)
    gc = GenerationConfig(max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, do_sample=False, use_cache=True,
                          pad_token_id=0, eos_token_id=raw.get("eos_token_id"))
    clock = Clock(dev)
    print(f"{'call':6s} {'ms':>10s} {'new tokens':>14s} {'tokens/s':>12s}")
    total_ms, generated = 0.0, 0
    with torch.no_grad():
        for s in range(a.warmup + a.steps):
            t0 = clock.mark()
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
            t1 = clock.mark()
            ms, n = clock.ms(t0, t1), (out.shape[1] - a.prompt_len) * a.batch
            assert n == a.batch * a.new_tokens, f"{n} new tokens, expected {a.batch * a.new_tokens}"
            print(f"{'warmup' if s < a.warmup else 'timed':6s} {ms:10.1f} {n:14d} {n / ms * 1e3:12.1f}")
            if s >= a.warmup:
                total_ms, generated = total_ms + ms, generated + n
    ms, tok_s = total_ms / a.steps, generated / total_ms * 1e3
    flops = a.batch * 2.0 * (shape["n_lm"] + shape["n_idx"]) * (a.prompt_len + a.new_tokens)
    print(f"generate (batch {a.batch}, prompt {a.prompt_len}, {a.new_tokens} new tokens, greedy, mean of {a.steps}): "
          f"{ms:.1f} ms, {tok_s:.1f} tokens/s")
    print("json: " + json.dumps(dict(
        impl="torch", op="generate", device=dev, backend=f"transformers {attn}", params=n_params,
        active_params=shape["n_lm"], batch=a.batch, prompt_len=a.prompt_len, new_tokens=a.new_tokens,
        ms=round(ms, 3), tokens_per_s=round(tok_s, 1), tflops=round(flops / ms / 1e9, 3),
        gemm_ceiling_tflops=round(gemm, 1), copy_gbs=round(copy_gbs))))


if __name__ == "__main__":
    main()
