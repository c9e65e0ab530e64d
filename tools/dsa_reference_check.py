#!/usr/bin/env python3
"""Cross-checks the built reference DSA plugin against PyTorch autograd in float64.

The plugin is loaded through its real ABI (dlopen, the exported descriptor, init() with a minimal host table whose
register_ops keeps the ops table), so this also exercises the plugin entry point. The PyTorch side is written the
way Megatron-LM writes DSA (dense masked tensors, glm5_dsa.md section 3.2): masked softmax attention, the indexer
KL loss with its 1e-10 clamps, and gradients by autograd, never by hand. Inputs are fresh random numbers.

    python3 tools/dsa_reference_check.py --plugin build/lib/dsarl/plugins/dsarl-dsa-reference.so [--seed N]

Exit status: 0 all checks pass, 1 a check failed, 77 PyTorch or NumPy is missing (ctest reports "skipped").
"""
import argparse
import ctypes as C
import sys
import time

try:
    import numpy as np
    import torch
except ImportError as exc:  # the C suite does not need them; this cross-check does
    print(f"dsa_reference_check: skipped, {exc}")
    sys.exit(77)

DSARL_KIND_DSA = 2


class Error(C.Structure):
    _fields_ = [("code", C.c_int), ("message", C.c_char * 1024), ("file", C.c_char_p), ("line", C.c_int)]


class OpsCommon(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("kind", C.c_uint32), ("name", C.c_char_p),
                ("description", C.c_char_p), ("keys", C.c_void_p), ("n_keys", C.c_size_t),
                ("describe", C.c_void_p), ("reserved", C.c_void_p * 4)]


class Batch(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("n_queries", C.c_int64), ("n_keys", C.c_int64),
                ("key_start", C.c_void_p), ("key_end", C.c_void_p), ("max_keys_per_query", C.c_int32)]


class IndexerInputs(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("q", C.c_void_p), ("k", C.c_void_p), ("weights", C.c_void_p),
                ("n_heads", C.c_int32), ("head_dim", C.c_int32)]


class AttentionInputs(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("q", C.c_void_p), ("kv", C.c_void_p), ("n_heads", C.c_int32),
                ("d_qk", C.c_int32), ("d_v", C.c_int32), ("softmax_scale", C.c_float)]


P = C.c_void_p
PB, PI, PA, PE = C.POINTER(Batch), C.POINTER(IndexerInputs), C.POINTER(AttentionInputs), C.POINTER(Error)


class DsaOps(C.Structure):
    _fields_ = [("common", OpsCommon),
                ("create", C.CFUNCTYPE(C.c_int, P, P, P, C.POINTER(P), PE)),
                ("destroy", C.CFUNCTYPE(None, P)),
                ("indexer_topk", C.CFUNCTYPE(C.c_int, P, PB, PI, C.c_int32, P, P, PE)),
                ("sparse_mla_forward", C.CFUNCTYPE(C.c_int, P, PB, PA, P, C.c_int32, P, P, PE)),
                ("sparse_mla_backward", C.CFUNCTYPE(C.c_int, P, PB, PA, P, C.c_int32, P, P, P, P, P, PE)),
                ("indexer_loss_forward", C.CFUNCTYPE(C.c_int, P, PB, PA, P, PI, P, C.c_int32, P, PE)),
                ("indexer_loss_backward", C.CFUNCTYPE(C.c_int, P, PB, PA, P, PI, P, C.c_int32, P, P, P, P, PE)),
                ("reserved", P * 8)]


class Host(C.Structure):
    pass


REGISTER = C.CFUNCTYPE(C.c_int, C.POINTER(Host), C.c_int, C.POINTER(OpsCommon), PE)
Host._fields_ = [("struct_size", C.c_uint32), ("abi_major", C.c_uint32), ("abi_minor", C.c_uint32),
                 ("host_version", C.c_char_p), ("host_private", P), ("register_ops", REGISTER),
                 ("find_ops", P), ("log", P), ("reserved", P * 16)]


class Descriptor(C.Structure):
    _fields_ = [("abi_major", C.c_uint32), ("abi_minor", C.c_uint32), ("struct_size", C.c_uint32),
                ("reserved0", C.c_uint32), ("name", C.c_char_p), ("version", C.c_char_p),
                ("build_sig", C.c_char_p), ("description", C.c_char_p),
                ("init", C.CFUNCTYPE(C.c_int, C.POINTER(Host), PE)), ("reserved", P * 8)]


def load_reference_ops(path):
    """dlopen()s the plugin, runs its init with a host table that keeps what it registers, returns the ops."""
    lib = C.CDLL(path, mode=C.RTLD_LOCAL)
    desc = Descriptor.in_dll(lib, "dsarl_plugin_descriptor_v1")
    registered = {}

    def register_ops(host, kind, ops, err):
        registered[(kind, ops.contents.name.decode())] = C.cast(ops, C.c_void_p).value
        return 0

    callback = REGISTER(register_ops)
    host = Host(struct_size=C.sizeof(Host), abi_major=desc.abi_major, abi_minor=desc.abi_minor,
                host_version=b"dsa_reference_check", register_ops=callback)
    err = Error()
    if desc.init(C.byref(host), C.byref(err)) != 0:
        raise RuntimeError(f"plugin init failed: {err.message.decode()}")
    address = registered[(DSARL_KIND_DSA, "reference")]
    ops = C.cast(address, C.POINTER(DsaOps)).contents
    return lib, callback, ops


def ptr(a):
    return a.ctypes.data_as(C.c_void_p) if a is not None else None


def f32(rng, *shape, scale=1.0):
    return (scale * rng.uniform(-1.0, 1.0, size=shape)).astype(np.float32)


class Case:
    """A batch (ranges), its ctypes descriptor, and the arrays that must outlive the calls."""

    def __init__(self, starts, ends, n_keys):
        self.key_start = np.ascontiguousarray(starts, dtype=np.int32)
        self.key_end = np.ascontiguousarray(ends, dtype=np.int32)
        self.n_queries, self.n_keys = len(starts), n_keys
        self.batch = Batch(C.sizeof(Batch), self.n_queries, n_keys, ptr(self.key_start), ptr(self.key_end),
                           int(max(1, (self.key_end - self.key_start).max(initial=0))))

    def eligible(self):  # (Tq, Tk) bool
        s = np.arange(self.n_keys)[None, :]
        return (s >= self.key_start[:, None]) & (s < self.key_end[:, None])


def packed(lengths):
    starts, ends, first = [], [], 0
    for n in lengths:
        for j in range(n):
            starts.append(first)
            ends.append(first + j + 1)
        first += n
    return Case(starts, ends, first)


def decode(rng, n_queries, n_keys):
    starts = rng.integers(0, n_keys, size=n_queries)
    ends = starts + rng.integers(0, n_keys - starts + 1)
    starts[0], ends[0] = 0, n_keys
    ends[1] = starts[1]  # one empty range
    return Case(starts, ends, n_keys)


class Checker:
    def __init__(self):
        self.failures = 0

    def close(self, what, got, want, rtol, atol):
        got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
        with np.errstate(invalid="ignore"):  # inf - inf where both are -inf padding: handled just below
            bad = ~(np.abs(got - want) <= atol + rtol * np.abs(want))
        both_inf = np.isinf(got) & np.isinf(want) & (np.sign(got) == np.sign(want))
        bad &= ~both_inf
        if bad.any():
            i = np.argwhere(bad)[0]
            print(f"FAIL {what}: {bad.sum()} of {bad.size} entries differ, first at {tuple(i)}: "
                  f"got {got[tuple(i)]!r}, want {want[tuple(i)]!r}")
            self.failures += 1
        else:
            print(f"ok   {what}")

    def equal(self, what, got, want):
        if not np.array_equal(got, want):
            row = int(np.argwhere(got != want)[0][0])
            print(f"FAIL {what}: first difference in row {row}: got {got[row].tolist()}, want {want[row].tolist()}")
            self.failures += 1
        else:
            print(f"ok   {what}")


def check_topk(ck, ops, ctx, case, rng, topk, heads=4, dim=16):
    q, k, w = f32(rng, case.n_queries, heads, dim), f32(rng, case.n_keys, dim), f32(rng, case.n_queries, heads)
    ix = IndexerInputs(C.sizeof(IndexerInputs), ptr(q), ptr(k), ptr(w), heads, dim)
    indices = np.empty((case.n_queries, topk), np.int32)
    scores = np.empty((case.n_queries, topk), np.float32)
    err = Error()
    assert ops.indexer_topk(ctx, C.byref(case.batch), C.byref(ix), topk, ptr(indices), ptr(scores), C.byref(err)) == 0
    t = lambda a: torch.from_numpy(a).double()
    score = (torch.einsum("tjd,sd->tjs", t(q), t(k)).relu() * t(w)[:, :, None]).sum(1)  # (Tq, Tk)
    score = score.masked_fill(~torch.from_numpy(case.eligible()), float("-inf"))
    # A stable descending sort keeps the lower key first among equal scores: the documented order.
    values, order = torch.sort(score, dim=1, descending=True, stable=True)
    n_keep = torch.from_numpy(np.minimum(case.key_end - case.key_start, topk)).long()
    want_idx = np.full((case.n_queries, topk), -1, np.int32)
    want_val = np.full((case.n_queries, topk), -np.inf)
    for row in range(case.n_queries):
        n = int(n_keep[row])
        want_idx[row, :n] = order[row, :n].numpy()
        want_val[row, :n] = values[row, :n].numpy()
    ck.equal(f"indexer_topk indices (Tq={case.n_queries}, topk={topk})", indices, want_idx)
    ck.close(f"indexer_topk scores (Tq={case.n_queries}, topk={topk})", scores, want_val, 1e-6, 1e-6)
    return indices


def attention_torch(case, q, kv, indices, d_v, scale):
    """Dense masked attention over the selected keys (multiplicity mask), float64, with autograd leaves."""
    counts = np.zeros((case.n_queries, case.n_keys))
    for row in range(case.n_queries):
        for s in indices[row]:
            if s >= 0:
                counts[row, s] += 1
    # Empty rows get finite zero logits (then p = 0): an all -inf row would put NaN into autograd.
    empty_row = torch.from_numpy(counts.sum(1) == 0)
    log_count = torch.from_numpy(np.where(counts > 0, np.log(np.maximum(counts, 1)), -np.inf))
    log_count[empty_row] = 0.0
    logits = scale * torch.einsum("thd,sd->ths", q, kv) + log_count[:, None, :]
    lse = torch.logsumexp(logits, dim=2)
    empty = empty_row[:, None].expand_as(lse)
    p = torch.where(empty[:, :, None], torch.zeros_like(logits), torch.exp(logits - lse[:, :, None]))
    out = torch.einsum("ths,sd->thd", p, kv[:, :d_v])
    return out, torch.where(empty, torch.full_like(lse, float("inf")), lse)


def check_attention(ck, ops, ctx, case, rng, indices, heads=4, d_qk=40, d_v=32):
    topk = indices.shape[1]
    scale = np.float32(1.0 / np.sqrt(d_qk))
    q, kv = f32(rng, case.n_queries, heads, d_qk, scale=2.0), f32(rng, case.n_keys, d_qk, scale=2.0)
    attn = AttentionInputs(C.sizeof(AttentionInputs), ptr(q), ptr(kv), heads, d_qk, d_v, scale)
    out = np.empty((case.n_queries, heads, d_v), np.float32)
    lse = np.empty((case.n_queries, heads), np.float32)
    err = Error()
    assert ops.sparse_mla_forward(ctx, C.byref(case.batch), C.byref(attn), ptr(indices), topk, ptr(out), ptr(lse),
                                  C.byref(err)) == 0, err.message
    g = f32(rng, case.n_queries, heads, d_v)
    dq = np.empty_like(q)
    dkv0 = f32(rng, case.n_keys, d_qk)
    dkv = dkv0.copy()
    assert ops.sparse_mla_backward(ctx, C.byref(case.batch), C.byref(attn), ptr(indices), topk, ptr(out), ptr(lse),
                                   ptr(g), ptr(dq), ptr(dkv), C.byref(err)) == 0, err.message
    tq = torch.from_numpy(q).double().requires_grad_()
    tkv = torch.from_numpy(kv).double().requires_grad_()
    want_out, want_lse = attention_torch(case, tq, tkv, indices, d_v, float(scale))
    (want_out * torch.from_numpy(g).double()).sum().backward()
    tag = f"(Tq={case.n_queries}, Tk={case.n_keys}, topk={topk})"
    ck.close(f"sparse_mla_forward out {tag}", out, want_out.detach().numpy(), 1e-5, 1e-6)
    ck.close(f"sparse_mla_forward lse {tag}", lse, want_lse.detach().numpy(), 1e-6, 1e-6)
    ck.close(f"sparse_mla_backward dq {tag}", dq, tq.grad.numpy(), 1e-4, 1e-5)
    ck.close(f"sparse_mla_backward dkv (accumulated) {tag}", dkv.astype(np.float64) - dkv0, tkv.grad.numpy(),
             1e-4, 1e-5)
    return q, kv, lse, attn


def indexer_loss_torch(case, q, kv, scale, indices, qi, ki, w):
    """Megatron-LM dsa_indexer_loss.py in dense tensors: clamps at 1e-10, attention detached."""
    valid = torch.from_numpy(case.eligible())
    if indices is not None:
        selected = np.zeros((case.n_queries, case.n_keys), bool)
        for row in range(case.n_queries):
            selected[row, indices[row][indices[row] >= 0]] = True
        valid = valid & torch.from_numpy(selected)
    neg_inf = torch.tensor(float("-inf"), dtype=torch.float64)
    with torch.no_grad():
        logits = scale * torch.einsum("thd,sd->ths", q, kv)
        logits = torch.where(valid[:, None, :], logits, neg_inf)
        probs = torch.softmax(logits, dim=2).nan_to_num(0.0)  # empty rows: 0
        attn_sum = probs.sum(1)
        p = attn_sum / attn_sum.sum(1, keepdim=True).clamp_min(1e-10)
    score = (torch.einsum("tjd,sd->tjs", qi, ki).relu() * w[:, :, None]).sum(1)
    score = torch.where(valid, score, neg_inf)
    log_q = torch.log_softmax(score, dim=1)
    terms = p * (torch.log(p.clamp_min(1e-10)) - log_q)
    terms = torch.where(valid & (p > 0), terms, torch.zeros_like(terms))
    return terms.sum(1)


def check_indexer_loss(ck, ops, ctx, case, rng, indices, q, kv, lse, attn, heads=4, dim=12):
    topk = indices.shape[1]
    qi, ki, w = f32(rng, case.n_queries, heads, dim), f32(rng, case.n_keys, dim), f32(rng, case.n_queries, heads)
    ix = IndexerInputs(C.sizeof(IndexerInputs), ptr(qi), ptr(ki), ptr(w), heads, dim)
    dloss = f32(rng, case.n_queries)
    err = Error()
    for mode, sel in (("sparse", indices), ("dense", None)):
        loss = np.empty(case.n_queries, np.float32)
        assert ops.indexer_loss_forward(ctx, C.byref(case.batch), C.byref(attn), ptr(lse), C.byref(ix), ptr(sel),
                                        topk, ptr(loss), C.byref(err)) == 0, err.message
        dq = np.full_like(qi, 7.0)
        dw = np.full_like(w, 7.0)
        dk0 = f32(rng, case.n_keys, dim)
        dk = dk0.copy()
        assert ops.indexer_loss_backward(ctx, C.byref(case.batch), C.byref(attn), ptr(lse), C.byref(ix), ptr(sel),
                                         topk, ptr(dloss), ptr(dq), ptr(dk), ptr(dw), C.byref(err)) == 0, err.message
        t = lambda a: torch.from_numpy(a).double().requires_grad_()
        tqi, tki, tw = t(qi), t(ki), t(w)
        want = indexer_loss_torch(case, torch.from_numpy(q).double(), torch.from_numpy(kv).double(),
                                  float(attn.softmax_scale), sel, tqi, tki, tw)
        (want * torch.from_numpy(dloss).double()).sum().backward()
        tag = f"{mode} (Tq={case.n_queries}, topk={topk})"
        ck.close(f"indexer_loss_forward {tag}", loss, want.detach().numpy(), 1e-5, 1e-6)
        ck.close(f"indexer_loss_backward dq_index {tag}", dq, tqi.grad.numpy(), 1e-4, 1e-6)
        ck.close(f"indexer_loss_backward dk_index (accumulated) {tag}", dk.astype(np.float64) - dk0,
                 tki.grad.numpy(), 1e-4, 1e-6)
        ck.close(f"indexer_loss_backward dweights {tag}", dw, tw.grad.numpy(), 1e-4, 1e-6)


def check_hf_indexer(ck, ops, ctx, rng, topk=6, seq=24):
    """transformers' GlmMoeDsaIndexer (eager, float64 weights) vs indexer_topk fed with the same projections.

    The indexer's projections (wq_b, wk + k_norm, interleaved RoPE, weights_proj) are the model's job; they are
    taken from the HF module itself, with both scales folded into the weights as dsarl/ops/dsa.h asks. HF scores in
    float32 and torch.topk orders ties arbitrarily, so the selected sets are compared through their sorted scores.
    """
    try:
        from transformers import GlmMoeDsaConfig
        from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as hf
    except ImportError as exc:
        print(f"skip transformers GlmMoeDsaIndexer cross-check: {exc}")
        return
    cfg = GlmMoeDsaConfig(hidden_size=32, index_n_heads=4, index_head_dim=16, qk_rope_head_dim=8,
                          qk_nope_head_dim=8, q_lora_rank=24, kv_lora_rank=16, v_head_dim=8, num_attention_heads=2,
                          num_key_value_heads=2, index_topk=topk, num_hidden_layers=1, vocab_size=16)
    torch.manual_seed(int(rng.integers(1 << 31)))
    indexer = hf.GlmMoeDsaIndexer(cfg, 0).double()
    for param in indexer.parameters():
        torch.nn.init.uniform_(param, -0.5, 0.5)
    batch = 2
    hidden = torch.from_numpy(rng.standard_normal((batch, seq, cfg.hidden_size)))
    q_resid = torch.from_numpy(rng.standard_normal((batch, seq, cfg.q_lora_rank)))
    positions = torch.arange(seq)[None].expand(batch, seq)
    cos, sin = hf.GlmMoeDsaRotaryEmbedding(cfg)(hidden, positions)
    cos, sin = cos.double(), sin.double()
    causal = torch.tril(torch.ones(seq, seq, dtype=torch.bool))[None].expand(batch, seq, seq)
    hf_indices = indexer(hidden, q_resid, (cos, sin), causal, positions).numpy()  # (B, S, topk)

    heads, dim, rope = cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim
    with torch.no_grad():
        q = indexer.wq_b(q_resid).view(batch, seq, heads, dim)
        k = indexer.k_norm(indexer.wk(hidden)).unsqueeze(2)
        q_rot, k_rot = hf.apply_rotary_pos_emb_interleave(q[..., :rope], k[..., :rope], cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q[..., rope:]], dim=-1)
        k = torch.cat([k_rot, k[..., rope:]], dim=-1).squeeze(2)
        w = indexer.weights_proj(hidden) * heads ** -0.5 * dim ** -0.5
    q32 = np.ascontiguousarray(q.reshape(batch * seq, heads, dim).numpy(), dtype=np.float32)
    k32 = np.ascontiguousarray(k.reshape(batch * seq, dim).numpy(), dtype=np.float32)
    w32 = np.ascontiguousarray(w.reshape(batch * seq, heads).numpy(), dtype=np.float32)
    case = packed([seq] * batch)
    ix = IndexerInputs(C.sizeof(IndexerInputs), ptr(q32), ptr(k32), ptr(w32), heads, dim)
    indices = np.empty((case.n_queries, topk), np.int32)
    err = Error()
    assert ops.indexer_topk(ctx, C.byref(case.batch), C.byref(ix), topk, ptr(indices), None, C.byref(err)) == 0
    score = (np.einsum("tjd,sd->tjs", q32.astype(np.float64), k32.astype(np.float64)).clip(min=0.0)
             * w32.astype(np.float64)[:, :, None]).sum(1)  # (Tq, Tk) of the packed batch
    got_values, want_values = [], []
    for b in range(batch):
        for t in range(seq):
            row = b * seq + t
            n = min(topk, t + 1)
            got_values.append(np.sort(score[row, indices[row, :n]]))
            want_values.append(np.sort(score[row, b * seq + hf_indices[b, t, :n]]))
    ck.close("indexer_topk vs transformers GlmMoeDsaIndexer (sorted selected scores)", np.concatenate(got_values),
             np.concatenate(want_values), 1e-5, 1e-6)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plugin", required=True, help="path of dsarl-dsa-reference.so")
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: time-based, printed)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else time.time_ns() % (1 << 32)
    print(f"dsa_reference_check: --seed {seed}")
    rng = np.random.default_rng(seed)
    torch.set_num_threads(1)
    _lib, _callback, ops = load_reference_ops(args.plugin)
    ctx = C.c_void_p()
    err = Error()
    if ops.create(None, None, None, C.byref(ctx), C.byref(err)) != 0:
        print(f"FAIL create: {err.message.decode()}")
        return 1
    ck = Checker()
    cases = [(packed([1, 7, 20]), 5), (packed([1, 7, 20]), 32), (decode(rng, 9, 60), 6)]
    for case, topk in cases:
        indices = check_topk(ck, ops, ctx, case, rng, topk)
        q, kv, lse, attn = check_attention(ck, ops, ctx, case, rng, indices)
        check_indexer_loss(ck, ops, ctx, case, rng, indices, q, kv, lse, attn)
    check_hf_indexer(ck, ops, ctx, rng)
    ops.destroy(ctx)
    print(f"dsa_reference_check: {ck.failures} failure(s)")
    return 1 if ck.failures else 0


if __name__ == "__main__":
    sys.exit(main())
