#!/usr/bin/env python3
# emulate_mla_bwd_sm90.py: no-GPU check of backends/dsa/tilelang/sparse_mla_backward_sm90.cu (needs numpy).
# Emulates sparse_mla_backward_sm90_kernel for one block (query t, 64 heads) on the CPU: shared memory as a byte-
# addressed array of bf16-rounded values, the kernel's own writes (tile_offset, P/dS offsets), and wgmma operand
# reads through the canonical SW128 layouts (K-major: start + (r//8)*SBO + (r%8)*128 + 2k; MN-major: start +
# (mn//64)*LBO + (k//8)*SBO + (k%8)*128 + 2 (mn%64); then XOR of address bits 4-6 with bits 7-9).
import numpy as np
rng = np.random.default_rng(1)
def bf(x): # round to bf16 (nearest even) as float32
    x = np.asarray(x, np.float32); u = x.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32); return u.view(np.float32)
H, DQK, DV, KT = 64, 576, 512, 64
TILE, BLK = 9 * 8192, 8192
BW_DO, BW_KV = TILE, TILE + 8 * BLK
BW_P = BW_KV + TILE; BW_DS = BW_P + BLK
def swz(a): return a ^ (((a >> 7) & 7) << 4)
def tile_offset(row, chunk): return (chunk >> 3) * BLK + row * 128 + (((chunk & 7) ^ (row & 7)) << 4)
smem = np.full(BW_DS + BLK, np.nan, np.float32)  # index = byte address // 2
def put(addr, vals):
    for e, v in enumerate(vals): smem[(addr + 2 * e) // 2] = v
def read_k(start, rows, SBO=1024):   # K-major operand: rows x 16
    r = np.arange(rows)[:, None]; k = np.arange(16)[None, :]
    a = start + (r // 8) * SBO + (r % 8) * 128 + 2 * k
    return smem[swz(a) // 2]
def read_mn(start, mn, LBO, SBO=1024):  # MN-major operand, returned as (mn x 16)
    m = np.arange(mn)[:, None]; k = np.arange(16)[None, :]
    a = start + (m // 64) * LBO + (k // 8) * SBO + (k % 8) * 128 + 2 * (m % 64)
    return smem[swz(a) // 2]

topk, n_keys, scale = 100, 90, 0.25
q = bf(rng.uniform(-1, 1, (H, DQK))); kv = bf(rng.uniform(-1, 1, (n_keys, DQK)))
dout = bf(rng.uniform(-1, 1, (H, DV)))
sel = rng.integers(0, n_keys, topk); sel[rng.random(topk) < 0.1] = -1; sel[5] = sel[70] = sel[71] = 7
# forward for lse/out (fp64)
valid = sel >= 0
S = (q.astype(np.float64) @ kv[np.where(valid, sel, 0)].T.astype(np.float64)) * scale
S[:, ~valid] = -np.inf
lse = np.log(np.exp(S - S.max(1, keepdims=True)).sum(1)) + S.max(1)
P = np.exp(S - lse[:, None]); out = bf(P @ kv[np.where(valid, sel, 0), :DV].astype(np.float64))
# reference backward
Delta = (out.astype(np.float64) * dout).sum(1)
dP = dout.astype(np.float64) @ kv[np.where(valid, sel, 0), :DV].T
dS = P * (dP - Delta[:, None])
ref_dq = scale * dS @ kv[np.where(valid, sel, 0)].astype(np.float64)
ref_dkv = np.zeros((n_keys, DQK))
for i in range(topk):
    if sel[i] >= 0:
        ref_dkv[sel[i]] += scale * dS[:, i] @ q
        ref_dkv[sel[i], :DV] += P[:, i] @ dout

# ---- the kernel ----
for row in range(H):
    for chunk in range(72): put(tile_offset(row, chunk), q[row, 8 * chunk:8 * chunk + 8])
    for chunk in range(64): put(BW_DO + tile_offset(row, chunk), dout[row, 8 * chunk:8 * chunk + 8])
lse2 = (lse * 1.4426950408889634).astype(np.float32)
delta = (out.astype(np.float32) * dout).sum(1).astype(np.float32)
scale_log2 = np.float32(scale * 1.4426950408889634)
dqa = np.zeros((2, H, 256)); dqr = np.zeros((2, H, 64)); acc = np.zeros((n_keys, DQK))
n_tiles = (topk + 63) // 64
def gather(slot0):
    keys = np.full(64, -1)
    for row in range(64):
        slot = slot0 + row; key = sel[slot] if slot < topk else -1
        ok = key >= 0 and key < n_keys
        for chunk in range(72):
            put(BW_KV + tile_offset(row, chunk), kv[key, 8 * chunk:8 * chunk + 8] if ok else np.zeros(8))
        keys[row] = key if ok else -1
    return keys
keys = gather(0)
def koff(kk): return ((kk >> 2) * BLK + (kk & 3) * 32)
for i in range(n_tiles):
    # A: S (wg 0), dP (wg 1)
    s = sum(read_k(koff(kk), 64) @ read_k(BW_KV + koff(kk), 64).T for kk in range(36))
    dp = sum(read_k(BW_DO + koff(kk), 64) @ read_k(BW_KV + koff(kk), 64).T for kk in range(32))
    Pt = np.where((keys >= 0)[None, :], np.exp2(s * scale_log2 - lse2[:, None]), 0.0)
    for r in range(64):
        for j in range(8):
            for cq in (0, 2, 4, 6):
                put(BW_P + r * 128 + ((j ^ (r & 7)) << 4) + cq * 2, bf(Pt[r, 8 * j + cq:8 * j + cq + 2]))
    for r in range(64):
        for j in range(8):
            for cq in (0, 2, 4, 6):
                o = r * 128 + ((j ^ (r & 7)) << 4) + cq * 2
                p = np.array([smem[(BW_P + o) // 2], smem[(BW_P + o) // 2 + 1]])
                d = scale * p * (dp[r, 8 * j + cq:8 * j + cq + 2] - delta[r])
                put(BW_DS + o, bf(d))
    # B: dQ += dS K
    for wg in range(2):
        for kk in range(4):   # m64n256k16: A = dS K-major at +32 kk, B = tile N-major blocks 4 wg.., +2048 kk
            A = read_k(BW_DS + 32 * kk, 64)
            B = read_mn(BW_KV + wg * 4 * BLK + 2048 * kk, 256, BLK)  # (n x k)
            dqa[wg] += A @ B.T
        for k2 in range(2):
            kk = 2 * wg + k2
            dqr[wg] += read_k(BW_DS + 32 * kk, 64) @ read_mn(BW_KV + 8 * BLK + 2048 * kk, 64, BLK).T
    cur = keys.copy()
    if i + 1 < n_tiles: keys = gather((i + 1) * 64)
    # C: dKV chunks
    for wg in range(2):
        chunks = [(4 * wg + n, range(4), True) for n in range(4)] + ([(8, range(4), False)] if wg == 0 else [])
        for b, kks, both in chunks:
            c = np.zeros((64, 64))
            for kk in kks:
                c += read_mn(BW_DS + 2048 * kk, 64, BLK) @ read_mn(b * BLK + 2048 * kk, 64, BLK).T
            if both:
                for kk in range(4):
                    c += read_mn(BW_P + 2048 * kk, 64, BLK) @ read_mn(BW_DO + b * BLK + 2048 * kk, 64, BLK).T
            # scatter, per lane as the kernel does
            for warp in range(4):
                for lane in range(32):
                    r0 = warp * 16 + lane // 4; r1 = r0 + 8; cq = 2 * (lane & 3); odd = lane & 1
                    partner = lane ^ 1; pr0 = warp * 16 + partner // 4; pcq = 2 * (partner & 3)
                    key = cur[r1 if odd else r0]
                    if key < 0: continue
                    for j in range(8):
                        reg = lambda rr, cc, e: c[rr, 8 * j + cc + e]
                        if odd:  # x, y = partner's (even) r1 pair; own r1 pair
                            v = [reg(pr0 + 8, pcq, 0), reg(pr0 + 8, pcq, 1), reg(r1, cq, 0), reg(r1, cq, 1)]
                        else:    # own r0 pair; x, y = partner's (odd) r0 pair
                            v = [reg(r0, cq, 0), reg(r0, cq, 1), reg(pr0, pcq, 0), reg(pr0, pcq, 1)]
                        col = 64 * b + cq - 2 * odd + 8 * j
                        acc[key, col:col + 4] += v
dq = np.zeros((H, DQK))
dq[:, :256] = dqa[0]; dq[:, 256:512] = dqa[1]; dq[:, 512:] = dqr[0] + dqr[1]
dq = bf(dq)
def rel(a, b): return np.abs(a - b).max() / np.abs(b).max()
print("dq max rel err %.2e, dkv max rel err %.2e" % (rel(dq, ref_dq), rel(acc, ref_dkv)))
print("nan in smem reads would have shown as nan:", np.isnan(dq).any(), np.isnan(acc).any())
assert rel(dq, ref_dq) < 1e-2 and rel(acc, ref_dkv) < 1e-2, "the emulated kernel disagrees with the reference"
