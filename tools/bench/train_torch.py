#!/usr/bin/env python3
"""tools/bench/train_torch.py: the transformers peer of `dsarl bench train`: GlmMoeDsaForCausalLM built from the same
config.json (bf16, attn_implementation sdpa, eager if refused; transformers' random init), whole training steps on
random token ids (forward with the mean next-token NLL, backward, gradient clip to 1.0, torch.optim.AdamW with the
trainer's defaults: betas 0.9/0.999, eps 1e-8, weight decay 0.01), timed with CUDA events after warm-up steps,
beside the ceilings measured in the same run. Prints a table and a `json:` line with the fields dsarl prints.

--save DIR writes the random init (before any step) as an HF directory, so `dsarl bench --model-dir DIR` runs the
very same weights.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_common import Clock, build_model, ceilings, load_config, train_flops  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "../../configs/bench/glm5.2-3b.json"))
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per sequence")
    ap.add_argument("--batch", type=int, default=2, help="sequences per step")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--ceiling-iters", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--save", help="write the random init to this directory (HF layout) before training")
    ap.add_argument("--save-only", action="store_true", help="with --save: stop after writing the random init")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = a.device
    if a.save_only and not a.save:
        ap.error("--save-only needs --save DIR")
    gemm, copy_gbs = (0.0, 0.0) if a.save_only else ceilings(dev, a.ceiling_iters)
    raw, cfg = load_config(a.config)
    model, attn = build_model(cfg, a.attn, dev, a.seed)
    if a.save:
        model.save_pretrained(a.save)
        print(f"saved the random init to {a.save}")
        if a.save_only:
            return
    n_params = sum(p.numel() for p in model.parameters())
    flops, shape = train_flops(raw, a.batch, a.tokens)
    experts = getattr(model.config, "_experts_implementation", None)
    print(f"transformers GlmMoeDsaForCausalLM: {n_params} parameters ({n_params / 1e9:.3f} B), N_lm {shape['n_lm']}, "
          f"N_idx {shape['n_idx']}; attn {attn}, experts {experts}; bf16 weights and AdamW state")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    gen = torch.Generator(device="cpu").manual_seed(a.seed)
    ids = torch.randint(0, raw["vocab_size"], (a.batch, a.tokens), generator=gen).to(dev)
    clock = Clock(dev)
    print(f"{'step':6s} {'fwd ms':>10s} {'fwd+bwd ms':>10s} {'optimizer ms':>12s} {'step ms':>10s} {'tokens/s':>12s} "
          f"{'loss':>10s}")
    timed, first_loss = [], None
    for s in range(a.warmup + a.steps):
        t0 = clock.mark()
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss  # mean NLL of the next token
        t1 = clock.mark()
        loss.backward()
        t2 = clock.mark()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = clock.mark()
        r = dict(fwd_ms=clock.ms(t0, t1), fwdbwd_ms=clock.ms(t0, t2), opt_ms=clock.ms(t2, t3), ms=clock.ms(t0, t3),
                 loss=float(loss.detach()))
        first_loss = r["loss"] if first_loss is None else first_loss
        print(f"{'warmup' if s < a.warmup else 'timed':6s} {r['fwd_ms']:10.1f} {r['fwdbwd_ms']:10.1f} "
              f"{r['opt_ms']:12.1f} {r['ms']:10.1f} {a.batch * a.tokens / r['ms'] * 1e3:12.0f} {r['loss']:10.4f}")
        if s >= a.warmup:
            timed.append(r)
    mean = {k: sum(r[k] for r in timed) / len(timed) for k in ("fwd_ms", "fwdbwd_ms", "opt_ms", "ms")}
    T = a.batch * a.tokens
    tok_s, tflops = T / mean["ms"] * 1e3, flops / mean["ms"] / 1e9
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if dev == "cuda" else 0.0
    print(f"FLOPs/step = {flops} (model_common.train_flops)")
    print(f"train step ({a.batch} x {a.tokens} tokens, mean of {a.steps} after {a.warmup} warm-up): {mean['ms']:.1f} "
          f"ms; {tok_s:.0f} tokens/s; {tflops:.1f} TFLOP/s of {gemm:.1f}: MFU {100 * tflops / gemm:.1f}%; loss "
          f"{timed[-1]['loss']:.4f} (first {first_loss:.4f}); peak memory {peak:.1f} GiB")
    print("json: " + json.dumps(dict(
        impl="torch", op="train_step", device=dev, backend=f"transformers {attn}", params=n_params,
        active_params=shape["n_lm"], indexer_params=shape["n_idx"], batch=a.batch, seq=a.tokens, tokens=T,
        ms=round(mean["ms"], 3), fwd_ms=round(mean["fwd_ms"], 3), fwdbwd_ms=round(mean["fwdbwd_ms"], 3),
        opt_ms=round(mean["opt_ms"], 3), tokens_per_s=round(tok_s, 1), flops_per_step=flops,
        tflops=round(tflops, 3), gemm_ceiling_tflops=round(gemm, 1), copy_gbs=round(copy_gbs),
        mfu=round(tflops / gemm, 4), loss=round(timed[-1]["loss"], 6), first_loss=round(first_loss, 6),
        peak_gib=round(peak, 1))))


if __name__ == "__main__":
    main()
