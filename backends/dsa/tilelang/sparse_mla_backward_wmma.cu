/* sparse_mla_backward_wmma.cu: the tensor-core path of the sparse MLA backward (bf16 storage, d_qk and d_v
 * multiples of 16): the tested portable path of GPUs without wgmma, forced on the H200 by
 * runtime.tilelang_sparse_mla=wmma in check_dsa_mla_bwd_sm90 (docs/gpu.md). The math is sparse_mla_backward.cu's.
 * One block (8 warps) per (query, group of 16 heads); per tile of 64 selected keys, on WMMA 16x16x16 bf16
 * fragments with fp32 accumulation:
 *   S = Q KV^T and dPV = dO V^T (16 x 64)        -> P = exp(scale S - lse), dS = scale P (dPV - Delta)   (fp32)
 *   dQ += dS KV                      (16 x d_qk, fp32 in shared memory)
 *   dKV = dS^T Q + P^T dO            (64 x d_qk: each warp's 16x16 blocks go through a small fp32 scratch to
 *                                     fp32 atomics at the selected rows of the accumulator)
 * P and dS are rounded to bf16 as operands of the last two products (as FlashAttention's backward does). */
#include <math.h>
#include <mma.h>
#include "tilelang_common.cuh"

using namespace nvcuda;

#define WB_THREADS 256
#define WB_WARPS (WB_THREADS / 32)
#define WB_HEADS 16
#define WB_KEYS 64

typedef struct wmma_bwd_layout {
    int ldq, ldo, ldkv, lds, ldp, lddq;
    size_t q, dout, kv, s, dp, p, ds, dq, scratch, stats, idx, total;
} wmma_bwd_layout;

static size_t align128(size_t x) { return (x + 127) / 128 * 128; }

static wmma_bwd_layout make_layout(int d_qk, int d_v)
{
    wmma_bwd_layout L;
    L.ldq = d_qk + 8, L.ldo = d_v + 8, L.ldkv = d_qk + 8, L.lds = WB_KEYS + 4, L.ldp = WB_KEYS + 8;
    L.lddq = d_qk + 4;
    size_t off = 0;
    L.q = off, off = align128(off + (size_t)WB_HEADS * L.ldq * 2);
    L.dout = off, off = align128(off + (size_t)WB_HEADS * L.ldo * 2);
    L.kv = off, off = align128(off + (size_t)WB_KEYS * L.ldkv * 2);
    L.s = off, off = align128(off + (size_t)WB_HEADS * L.lds * 4);
    L.dp = off, off = align128(off + (size_t)WB_HEADS * L.lds * 4);
    L.p = off, off = align128(off + (size_t)WB_HEADS * L.ldp * 2);
    L.ds = off, off = align128(off + (size_t)WB_HEADS * L.ldp * 2);
    L.dq = off, off = align128(off + (size_t)WB_HEADS * L.lddq * 4);
    L.scratch = off, off = align128(off + (size_t)WB_WARPS * 256 * 4);
    L.stats = off, off = align128(off + 2 * WB_HEADS * 4);
    L.idx = off, off = align128(off + WB_KEYS * 4);
    L.total = off;
    return L;
}

static __global__ void sparse_mla_backward_wmma_kernel(bf16 *dq, float *dkv_acc, const bf16 *q, const bf16 *kv,
                                                       const int32_t *indices, const bf16 *out, const float *lse,
                                                       const bf16 *dout, int topk, int n_heads, int d_qk, int d_v,
                                                       float scale, wmma_bwd_layout L)
{
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *q_s = (bf16 *)(smem + L.q), *do_s = (bf16 *)(smem + L.dout), *kv_s = (bf16 *)(smem + L.kv);
    bf16 *p_s = (bf16 *)(smem + L.p), *ds_s = (bf16 *)(smem + L.ds);
    float *s_s = (float *)(smem + L.s), *dp_s = (float *)(smem + L.dp), *dq_s = (float *)(smem + L.dq);
    float *lse_s = (float *)(smem + L.stats), *delta_s = lse_s + WB_HEADS;
    int32_t *idx_s = (int32_t *)(smem + L.idx);
    const int64_t t = blockIdx.x;
    const int h0 = blockIdx.y * WB_HEADS, heads = min(WB_HEADS, n_heads - h0);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    float *scratch = (float *)(smem + L.scratch) + warp * 256;
    const int32_t *sel = indices + t * topk;
    const int qk_chunks = d_qk / 8, v_chunks = d_v / 8;

    for (int e = tid; e < WB_HEADS * qk_chunks; e += blockDim.x) {
        int h = e / qk_chunks, c = e % qk_chunks;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (h < heads)
            v = reinterpret_cast<const uint4 *>(q + (t * n_heads + h0 + h) * d_qk)[c];
        reinterpret_cast<uint4 *>(q_s + h * L.ldq)[c] = v;
    }
    for (int e = tid; e < WB_HEADS * v_chunks; e += blockDim.x) {
        int h = e / v_chunks, c = e % v_chunks;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (h < heads)
            v = reinterpret_cast<const uint4 *>(dout + (t * n_heads + h0 + h) * d_v)[c];
        reinterpret_cast<uint4 *>(do_s + h * L.ldo)[c] = v;
    }
    for (int e = tid; e < WB_HEADS * d_qk; e += blockDim.x)
        dq_s[(e / d_qk) * L.lddq + e % d_qk] = 0.0f;
    for (int h = warp; h < WB_HEADS; h += WB_WARPS) { /* Delta = out . dout, one warp per head */
        float s = 0.0f;
        if (h < heads) {
            const bf16 *o = out + (t * n_heads + h0 + h) * d_v, *d = dout + (t * n_heads + h0 + h) * d_v;
            for (int c = lane; c < d_v; c += 32)
                s += __bfloat162float(o[c]) * __bfloat162float(d[c]);
        }
        s = warp_sum(s);
        if (lane == 0) {
            delta_s[h] = s;
            lse_s[h] = h < heads ? lse[t * n_heads + h0 + h] : INFINITY;
        }
    }
    for (int base = 0; base < topk; base += WB_KEYS) {
        const int rows = min(WB_KEYS, topk - base);
        __syncthreads();
        for (int j = tid; j < WB_KEYS; j += blockDim.x)
            idx_s[j] = j < rows ? sel[base + j] : -1;
        __syncthreads();
        for (int e = tid; e < WB_KEYS * qk_chunks; e += blockDim.x) {
            int j = e / qk_chunks, c = e % qk_chunks;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (idx_s[j] >= 0)
                v = reinterpret_cast<const uint4 *>(kv + (int64_t)idx_s[j] * d_qk)[c];
            reinterpret_cast<uint4 *>(kv_s + j * L.ldkv)[c] = v;
        }
        __syncthreads();
        { /* warps 0-3: S blocks over d_qk; warps 4-7: dPV blocks over d_v */
            const int jb = warp & 3;
            const bool is_s = warp < 4;
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
            const bf16 *a_base = is_s ? q_s : do_s;
            const int lda = is_s ? L.ldq : L.ldo, depth = is_s ? d_qk : d_v;
            for (int kk = 0; kk < depth; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
                wmma::load_matrix_sync(a, a_base + kk, lda);
                wmma::load_matrix_sync(b, kv_s + jb * 16 * L.ldkv + kk, L.ldkv);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync((is_s ? s_s : dp_s) + jb * 16, acc, L.lds, wmma::mem_row_major);
        }
        __syncthreads();
        for (int e = tid; e < WB_HEADS * WB_KEYS; e += blockDim.x) {
            int h = e / WB_KEYS, j = e % WB_KEYS;
            float p = 0.0f, ds = 0.0f;
            if (idx_s[j] >= 0 && lse_s[h] != INFINITY) {
                p = expf(scale * s_s[h * L.lds + j] - lse_s[h]);
                ds = scale * p * (dp_s[h * L.lds + j] - delta_s[h]);
            }
            p_s[h * L.ldp + j] = __float2bfloat16(p);
            ds_s[h * L.ldp + j] = __float2bfloat16(ds);
        }
        __syncthreads();
        for (int nb = warp; nb < d_qk / 16; nb += WB_WARPS) { /* dQ += dS KV */
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::load_matrix_sync(acc, dq_s + nb * 16, L.lddq, wmma::mem_row_major);
            for (int kk = 0; kk < WB_KEYS; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
                wmma::load_matrix_sync(a, ds_s + kk, L.ldp);
                wmma::load_matrix_sync(b, kv_s + kk * L.ldkv + nb * 16, L.ldkv);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(dq_s + nb * 16, acc, L.lddq, wmma::mem_row_major);
        }
        // dKV blocks (16 keys x 16 columns): dS^T Q (+ P^T dO in the value columns), flushed with atomics
        const int col_blocks = d_qk / 16;
        for (int blk = warp; blk < (WB_KEYS / 16) * col_blocks; blk += WB_WARPS) {
            const int jb = blk / col_blocks, nb = blk % col_blocks;
            if (base + jb * 16 >= topk)
                continue;
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
            wmma::fill_fragment(acc, 0.0f);
            wmma::load_matrix_sync(a, ds_s + jb * 16, L.ldp); /* A(j, h) = dS(h, j) */
            wmma::load_matrix_sync(b, q_s + nb * 16, L.ldq);
            wmma::mma_sync(acc, a, b, acc);
            if (nb * 16 < d_v) {
                wmma::load_matrix_sync(a, p_s + jb * 16, L.ldp);
                wmma::load_matrix_sync(b, do_s + nb * 16, L.ldo);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(scratch, acc, 16, wmma::mem_row_major);
            __syncwarp();
            for (int e = lane; e < 256; e += 32) {
                int j = jb * 16 + e / 16, c = nb * 16 + e % 16;
                if (idx_s[j] >= 0)
                    atomicAdd(dkv_acc + (int64_t)idx_s[j] * d_qk + c, scratch[e]);
            }
            __syncwarp();
        }
    }
    __syncthreads();
    for (int e = tid; e < heads * d_qk; e += blockDim.x)
        dq[(t * n_heads + h0) * d_qk + e] = __float2bfloat16(dq_s[(e / d_qk) * L.lddq + e % d_qk]);
}

int tilelang_sparse_mla_backward_wmma(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                      const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk,
                                      const void *out, const float *lse, const void *dout, void *dq, float *dkv_acc,
                                      int *used, dsarl_error *err)
{
    *used = 0;
    wmma_bwd_layout L = make_layout(in->d_qk, in->d_v);
    if (ctx->f32 || in->d_qk % 16 || in->d_v % 16 || L.total > TL_MAX_SHARED || ((uintptr_t)in->q % 16) ||
        ((uintptr_t)in->kv % 16) || ((uintptr_t)dout % 16) || ctx->settings.sparse_mla == TILELANG_MLA_CUDA_CORE)
        return DSARL_OK;
    tlSharedLimit(sparse_mla_backward_wmma_kernel, L.total, err);
    dim3 grid((unsigned int)batch->n_queries, (unsigned int)((in->n_heads + WB_HEADS - 1) / WB_HEADS));
    sparse_mla_backward_wmma_kernel<<<grid, WB_THREADS, L.total, TL_STREAM(ctx)>>>(
        (bf16 *)dq, dkv_acc, (const bf16 *)in->q, (const bf16 *)in->kv, indices, (const bf16 *)out, lse,
        (const bf16 *)dout, topk, in->n_heads, in->d_qk, in->d_v, in->softmax_scale, L);
    tlCheckLaunch("sparse_mla_backward (wmma)", err);
    *used = 1;
    return DSARL_OK;
}
