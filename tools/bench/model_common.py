"""tools/bench/model_common.py: what train_torch.py and generate_torch.py share: the model built from an HF
config.json (transformers' GlmMoeDsaForCausalLM, random init, bf16), the ceilings measured the way `dsarl bench`
measures them (bf16 GEMM 8192^3 and a device copy, one warm-up, L2 flushed by a 256 MiB write before each timed
run, CUDA events), and the model FLOPs of `dsarl bench train` computed from the config alone:

  6 * N_lm * T + 2 * N_idx * T + 3 * L * 2 * H * (d_qk + d_v) * sum_t min(pos + 1, index_topk)
                               + L_full * 2 * nI * dI * sum_t (pos + 1)

N_lm: matmul weights a token passes through (attention projections, dense MLP, router, shared experts, top_k of the
routed experts, LM head; the embedding and norms excluded); N_idx: the indexers' projections (forward only).
"""
import json
import time

import torch


def load_config(path):
    from transformers import GlmMoeDsaConfig
    raw = json.load(open(path))
    return raw, GlmMoeDsaConfig(**{k: v for k, v in raw.items() if k not in ("architectures", "model_type")})


def build_model(cfg, attn, device, seed):
    """GlmMoeDsaForCausalLM with transformers' random init, in bf16 on device; attn 'sdpa' falls back to 'eager'."""
    from transformers import GlmMoeDsaForCausalLM
    torch.manual_seed(seed)
    try:
        cfg._attn_implementation = attn
        with torch.device(device):
            model = GlmMoeDsaForCausalLM(cfg).to(torch.bfloat16)
    except (ValueError, NotImplementedError) as e:
        print(f"attn_implementation {attn} refused ({e}); using eager")
        attn = "eager"
        cfg._attn_implementation = attn
        with torch.device(device):
            model = GlmMoeDsaForCausalLM(cfg).to(torch.bfloat16)
    return model, attn


class Clock:
    """CUDA events on cuda (marks are recorded in stream order), else the wall clock."""

    def __init__(self, device):
        self.cuda = device == "cuda"

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def ms(self, a, b):
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b)
        return (b - a) * 1e3


def ceilings(device, iters):
    """bf16 GEMM n^3 TFLOP/s and device copy GB/s (read + write), like `dsarl bench` (n 8192; 512 on the CPU)."""
    n = 8192 if device == "cuda" else 512
    clock = Clock(device)
    flush = torch.empty((256 << 20) if device == "cuda" else (1 << 20), dtype=torch.uint8, device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    A = (torch.rand((n, n), generator=gen, device=device) * 2 - 1).to(torch.bfloat16)
    B = (torch.rand((n, n), generator=gen, device=device) * 2 - 1).to(torch.bfloat16)
    dst = torch.empty_like(A)

    def timed(fn):
        fn()
        total = 0.0
        for _ in range(iters):
            flush.zero_()
            if device == "cuda":
                torch.cuda.synchronize()
            a = clock.mark()
            fn()
            b = clock.mark()
            total += clock.ms(a, b)
        return total / iters

    gemm_ms = timed(lambda: torch.matmul(A, B.t()))
    copy_ms = timed(lambda: dst.copy_(A))
    gemm = 2.0 * n ** 3 / gemm_ms / 1e9
    copy_gbs = 2.0 * A.numel() * 2 / copy_ms / 1e6
    del A, B, dst, flush
    import transformers
    info = dict(torch=torch.__version__, transformers=transformers.__version__,
                device=torch.cuda.get_device_name() if device == "cuda" else "cpu")
    print("json: " + json.dumps(dict(impl="torch", op="ceilings", gemm_tflops=round(gemm, 1),
                                     copy_gbs=round(copy_gbs), **info)))
    print(f"ceilings (this run): bf16 GEMM {n}^3 {gemm:.1f} TFLOP/s; device copy {copy_gbs:.0f} GB/s (read + write)")
    return gemm, copy_gbs


def full_layers(raw):
    """Layers that run their indexer, as transformers' GlmMoeDsaConfig derives indexer_types."""
    L = raw.get("num_hidden_layers", 78)
    if raw.get("indexer_types"):
        return sum(t == "full" for t in raw["indexer_types"])
    pattern = raw.get("index_topk_pattern")
    if pattern:
        return sum(p in ("F", "full") for p in pattern)
    freq, offset = max(raw.get("index_topk_freq", 1), 1), raw.get("index_skip_topk_offset", 2)
    return sum(max(i - offset + 1, 0) % freq == 0 for i in range(L))


def flop_shape(raw):
    """N_lm, N_idx and the sizes of the attention terms, from the config's keys (GLM-5 defaults when absent)."""
    g = lambda k, d: raw.get(k, d) if raw.get(k) is not None else d
    C, V, L = g("hidden_size", 6144), g("vocab_size", 154880), g("num_hidden_layers", 78)
    H, nope, rope, v = g("num_attention_heads", 64), g("qk_nope_head_dim", 192), g("qk_rope_head_dim", 64), \
        g("v_head_dim", 256)
    qr, kvr = g("q_lora_rank", 2048), g("kv_lora_rank", 512)
    E, K, I = g("n_routed_experts", 256), g("num_experts_per_tok", 8), g("moe_intermediate_size", 2048)
    shared, dense_I = g("n_shared_experts", 1), g("intermediate_size", 12288)
    nI, dI = g("index_n_heads", 32), g("index_head_dim", 128)
    mlp_types = raw.get("mlp_layer_types") or ["dense" if i < g("first_k_dense_replace", 3) else "sparse"
                                               for i in range(L)]
    attn = C * qr + qr * H * (nope + rope) + C * (kvr + rope) + kvr * H * (nope + v) + H * v * C
    dense = 3 * C * dense_I
    moe = E * C + K * 3 * C * I + shared * 3 * C * I
    n_lm = V * C + sum(attn + (moe if t == "sparse" else dense) for t in mlp_types)
    Lf = full_layers(raw)
    n_idx = Lf * (qr * nI * dI + C * dI + C * nI)
    return dict(n_lm=n_lm, n_idx=n_idx, L=L, Lf=Lf, H=H, d_qk=nope + rope, d_v=v, topk=g("index_topk", 2048),
                nI=nI, dI=dI)


def causal_pairs(n, cap=0):
    if cap <= 0 or cap >= n:
        return n * (n + 1) // 2
    return cap * (cap + 1) // 2 + (n - cap) * cap


def train_flops(raw, batch, seq):
    s = flop_shape(raw)
    T = batch * seq
    return (6 * s["n_lm"] * T + 2 * s["n_idx"] * T
            + 3 * s["L"] * 2 * s["H"] * (s["d_qk"] + s["d_v"]) * batch * causal_pairs(seq, s["topk"])
            + s["Lf"] * 2 * s["nI"] * s["dI"] * batch * causal_pairs(seq)), s
