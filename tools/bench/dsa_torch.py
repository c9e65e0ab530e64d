#!/usr/bin/env python3
"""tools/bench/dsa_torch.py: the peer of `dsarl bench dsa`: the same DSA operations written as readable PyTorch on
the same shapes and the same inputs' layout, timed the same way (CUDA events, one warm-up, L2 flushed by a 256 MiB
write before every timed iteration), with the same FLOP conventions (docs/conventions.md section 1):

  indexer      scores(t, s) = sum_j w[t, j] * relu(q[t, j] . k[s]) over causal s <= t, then torch.topk(k)
  sparse MLA   gather the k selected latents per query, einsum q.kv, softmax (fp32), einsum p.v   (forward)
               autograd through that forward                                                    (backward)
  headwise     per-head attention over one causal sequence (d 256/256): torch SDPA, is_causal when every row keeps
               all its keys (T <= k), else a boolean mask of each row's most recent k keys     (fwd, autograd bwd)

--tokens takes a comma-separated list (e.g. 2048,8192,32768); a figure that does not fit in memory prints a
`skipped` json line instead of stopping the run.

Prints one `json:` line per figure (impl "torch"), like dsarl's, and a readable table.
"""
import argparse
import json
import math

import torch


def timed(fn, iters, flush):
    """Mean ms of fn over iters runs after a warm-up; the L2 flush runs before each, outside the events."""
    fn()
    total = 0.0
    for _ in range(iters):
        flush.zero_()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        total += start.elapsed_time(end)
    return total / iters


def uniform(gen, shape, scale, dtype):
    return ((torch.rand(shape, generator=gen, device="cuda") * 2 - 1) * scale).to(dtype)


def selected_indices(T, k):
    """Distinct keys per row over the whole array, the walk `dsarl bench dsa` uses: (i * 2654435761 + t * 40503) % T."""
    i = torch.arange(k, device="cuda", dtype=torch.int64)
    t = torch.arange(T, device="cuda", dtype=torch.int64)
    return ((i[None, :] * 2654435761 + t[:, None] * 40503) % T).to(torch.int64)


def indexer_topk(q, k, w, topk, causal):
    # (T, H, D) x (S, D) -> (T, H, S) -> relu, weighted sum over heads (fp32) -> (T, S), causal mask, top-k
    scores = torch.einsum("thd,sd->ths", q, k).relu_()
    scores = torch.einsum("ths,th->ts", scores.float(), w)
    scores.masked_fill_(causal, float("-inf"))
    return torch.topk(scores, topk, dim=-1)


def sparse_mla_forward(q, kv, idx, d_v, scale, chunk):
    """out (T, H, d_v), lse (T, H): each query attends its k gathered latents; chunked over queries for memory."""
    outs, lses = [], []
    for c in range(0, q.shape[0], chunk):
        qc, kvg = q[c:c + chunk], kv[idx[c:c + chunk]]                 # (c, H, d_qk), (c, k, d_qk)
        s = torch.einsum("chd,ckd->chk", qc, kvg).float() * scale       # (c, H, k)
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse[..., None]).to(q.dtype)
        outs.append(torch.einsum("chk,ckd->chd", p, kvg[..., :d_v]))
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def bench_indexer(a, T, gen, flush, emit):
    bf16, nI, dI, k = torch.bfloat16, a.index_heads, a.index_dim, a.topk
    qi, ki, wi = uniform(gen, (T, nI, dI), 1, bf16), uniform(gen, (T, dI), 1, bf16), uniform(gen, (T, nI), 0.2,
                                                                                             torch.float32)
    causal = torch.ones(T, T, dtype=torch.bool, device="cuda").triu_(1)
    ms = timed(lambda: indexer_topk(qi, ki, wi, k, causal), a.iters, flush)
    emit("indexer_topk", f"T={T} causal, {nI}x{dI}, k={k}", ms, 2.0 * nI * dI * T * (T + 1) / 2 / ms / 1e9,
         "<= 2 ms")


def bench_sparse_mla(a, T, gen, flush, emit):
    bf16, H, k = torch.bfloat16, a.heads, a.topk
    q, kv = uniform(gen, (T, H, a.d_qk), 1, bf16), uniform(gen, (T, a.d_qk), 1, bf16)
    idx = selected_indices(T, k)
    scale = 1.0 / math.sqrt(a.d_qk)
    shape = f"T={T} H={H} d={a.d_qk}/{a.d_v} k={k}"
    per_pair = 2.0 * T * k * H
    with torch.no_grad():
        ms = timed(lambda: sparse_mla_forward(q, kv, idx, a.d_v, scale, a.chunk), a.iters, flush)
    emit("sparse_mla_forward", shape, ms, per_pair * (a.d_qk + a.d_v) / ms / 1e9, ">= 450 TFLOP/s")
    q.requires_grad_(True), kv.requires_grad_(True)
    out, _ = sparse_mla_forward(q, kv, idx, a.d_v, scale, a.chunk)
    dout = uniform(gen, out.shape, 1, bf16)
    ms = timed(lambda: torch.autograd.grad(out, (q, kv), dout, retain_graph=True), a.iters, flush)
    emit("sparse_mla_backward", shape, ms, per_pair * (3.0 * a.d_qk + 2.0 * a.d_v) / ms / 1e9, ">= 200 TFLOP/s")


def bench_headwise(a, T, gen, flush, emit):
    """Per-head attention, one causal sequence, row t keeping its most recent min(t + 1, k) keys (what
    `dsarl bench dsa` gives the headwise ops); useful FLOPs count only those pairs."""
    bf16, H, k, dq, dv = torch.bfloat16, a.heads, a.topk, a.hw_d_qk, a.hw_d_v
    q, kk = uniform(gen, (1, H, T, dq), 1, bf16), uniform(gen, (1, H, T, dq), 1, bf16)
    v = uniform(gen, (1, H, T, dv), 1, bf16)
    F = torch.nn.functional
    if T <= k:
        attend = lambda: F.scaled_dot_product_attention(q, kk, v, is_causal=True)
        how = "is_causal"
    else:
        t = torch.arange(T, device="cuda")
        mask = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - k)
        attend = lambda: F.scaled_dot_product_attention(q, kk, v, attn_mask=mask)
        how = "bool mask"
    pairs = sum(min(t + 1, k) for t in range(T))
    shape = f"S={T} causal H={H} d={dq}/{dv} k={k} ({how})"
    with torch.no_grad():
        ms = timed(attend, a.iters, flush)
    emit("headwise_attention_forward", shape, ms, 2.0 * H * pairs * (dq + dv) / ms / 1e9, "-")
    q.requires_grad_(True), kk.requires_grad_(True), v.requires_grad_(True)
    out = attend()
    dout = uniform(gen, out.shape, 1, bf16)
    ms = timed(lambda: torch.autograd.grad(out, (q, kk, v), dout, retain_graph=True), a.iters, flush)
    emit("headwise_attention_backward", shape, ms, 2.0 * H * pairs * (3.0 * dq + 2.0 * dv) / ms / 1e9, "-")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="8192", help="comma-separated token counts")
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--d-qk", type=int, default=576)
    ap.add_argument("--d-v", type=int, default=512)
    ap.add_argument("--index-heads", type=int, default=32)
    ap.add_argument("--index-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--hw-d-qk", type=int, default=256)
    ap.add_argument("--hw-d-v", type=int, default=256)
    ap.add_argument("--backend", default=None, help="accepted for the shared command line of run-dsa-bench; unused")
    ap.add_argument("--chunk", type=int, default=512, help="queries per gathered chunk in sparse MLA")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(0)
    bf16 = torch.bfloat16
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    rows = []

    def emit(op, shape, ms, tflops, target, **extra):
        rows.append((op, shape, ms, tflops, target))
        print("json: " + json.dumps(dict(impl="torch", op=op, shape=shape, ms=round(ms, 4), tflops=round(tflops, 2),
                                         target=target, **extra)))

    n = 8192
    A, B = uniform(gen, (n, n), 1, bf16), uniform(gen, (n, n), 1, bf16)
    gemm_ms = timed(lambda: torch.matmul(A, B.t()), a.iters, flush)
    src = uniform(gen, (n, n), 1, bf16)
    dst = torch.empty_like(src)
    copy_ms = timed(lambda: dst.copy_(src), a.iters, flush)
    ceiling = 2.0 * n ** 3 / gemm_ms / 1e9
    copy_gbs = 2.0 * src.numel() * 2 / copy_ms / 1e6
    del A, B, src, dst
    print("json: " + json.dumps(dict(impl="torch", op="ceilings", gemm_tflops=round(ceiling, 1),
                                     copy_gbs=round(copy_gbs), torch=torch.__version__,
                                     device=torch.cuda.get_device_name())))

    for T in [int(t) for t in a.tokens.split(",")]:
        for name, fn in (("indexer", bench_indexer), ("sparse_mla", bench_sparse_mla), ("headwise", bench_headwise)):
            try:
                fn(a, T, gen, flush, emit)
            except RuntimeError as e:  # out of memory, or no SDPA kernel for the mask and dims
                why = str(e).splitlines()[0][:200]
                print("json: " + json.dumps(dict(impl="torch", op=name, shape=f"T={T}", skipped=why)))
            torch.cuda.empty_cache()

    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}: bf16 GEMM 8192^3 {ceiling:.1f} TFLOP/s, "
          f"copy {copy_gbs:.0f} GB/s")
    for op, shp, ms, tf, target in rows:
        print(f"{op:28s} {shp:48s} {ms:9.3f} ms {tf:8.1f} TFLOP/s  {100 * tf / ceiling:5.1f}%  target {target}")


if __name__ == "__main__":
    main()
