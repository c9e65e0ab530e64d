/* sparse_mla_forward_sm90.cu: the Hopper (sm_90a) path of the sparse MLA forward for bf16 storage at GLM-5 dims
 * (d_qk = 576 = kv_lora 512 + rope 64, d_v = 512, heads in groups of 64): same function as sparse_mla_forward.cu
 * (see there), on wgmma tensor-core products with register accumulators, after FlashMLA's sparse prefill shape.
 *
 * One block of two warpgroups per (query token, group of 64 heads); the 64 heads are the M of every product.
 * Shared memory (216 KiB): Q (64 x 576, loaded once) and two buffers of one key tile (64 selected latent rows of
 * 576), all bf16 in column blocks of 64 x 64 whose 128-byte rows are swizzled the way wgmma's 128B mode reads them.
 * Per tile of 64 slots of the query's top-k (buffer i % 2), between two block barriers:
 *   - warpgroup 0 owns the scores: S = Q K^T (64 x 64, 36 wgmma m64n64k16, both operands from shared memory), then
 *     the online softmax in fp32 registers: invalid slots -inf, running max m in log2 units, P = exp2(S - m) rounded
 *     to bf16 into the tile's rope columns (the last 64 x 64 block, free once S is done), the rescale factors
 *     exp2(m_old - m_new) into shared memory, fp32 row sums per thread;
 *   - meanwhile warpgroup 1 gathers the NEXT tile into the other buffer (16-byte cp.async, 8 threads per 1152-byte
 *     row so every warp instruction reads whole 128-byte lines; slots of -1, past topk or outside [0, n_keys)
 *     zero-filled and flagged invalid), so the gather has a whole tile's time to land;
 *   - then each warpgroup rescales its half of O (64 x 256 fp32, 128 registers per thread; skipped by a warp when no
 *     row max moved) and adds P V_half: 4 wgmma m64n256k16 with P (K-major) and the tile's columns 256 w ..
 *     256 w + 255 (N-major) from shared memory.
 * At the end out = O / l (bf16) and lse = m ln 2 + log l; a row with no valid slot gets out 0 and lse +inf. A
 * repeated key is two softmax terms, as in the reference.
 * One owner of S (rather than both warpgroups each scoring 32 keys) reads a third less shared memory per tile and
 * needs no exchange of row maxima (measurably faster: docs/performance.md). The same kernel with the gather removed
 * (every tile from shared memory) was only a little faster, so the limit is the serial chain S -> softmax -> P V
 * inside a tile, where the tensor cores wait for the softmax (no ping-pong between warpgroups yet).
 * Heads that are not whole groups of 64 pad the last group with zero Q rows whose out and lse are never stored; it
 * must hold at least 16 real heads (tilelang_sparse_mla_sm90_head_groups: 16 heads do 4x the products, still
 * well ahead of the WMMA kernel). Shapes that do not fit (other dims, a last group under 16 heads, float32
 * storage, another architecture) stay on the WMMA and CUDA-core kernels. The tile layout, descriptors, wgmma
 * wrappers and the gather are shared with the backward in sparse_mla_sm90.cuh. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "sparse_mla_sm90.cuh"

#define SM90_THREADS 256                           /* two warpgroups */
#define SM90_STATS (3 * SM90_TILE_BYTES)           /* rescale factors [64], row sums [64], valid flags [2][64] */
#define SM90_SHARED (SM90_STATS + 4 * 64 * 4 + 1024) /* + slack to align the base to 1024 bytes */

/* GROUPED: the block's 64 rows are the heads of 64 / heads_per_query consecutive queries (virtual query t = the
 * group, n_heads = 64, rows from t * 64 live below n_rows) over the group's key list (indices, topk = its capacity,
 * union_len its length, union_mask the queries that selected each key: sparse_mla_query_union.cu), a key counting
 * for a row only where the row's query selected it; otherwise one query's top-k row and 64 of its heads. */
template <bool GROUPED>
static __global__ void __launch_bounds__(SM90_THREADS, 1)
sparse_mla_forward_sm90_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *kv, const int32_t *indices, int topk,
                               int n_heads, int64_t n_keys, float scale_log2, const uint8_t *union_mask,
                               const int32_t *union_len, int heads_per_query, int64_t n_rows)
{
#ifdef SM90_DEVICE_CODE
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t pad = ((raw + 1023u) & ~1023u) - raw;
    unsigned char *smem = smem_raw + pad;
    const uint32_t q_s = raw + pad, kv_s0 = q_s + SM90_TILE_BYTES; // shared addresses
    float *alpha_s = (float *)(smem + SM90_STATS);                  // [64] this tile's O rescale factors
    float *row_sum = alpha_s + 64;                                  // [64] at the end
    int *valid = (int *)(row_sum + 64);                             // [2 buffers][64 slots]
    __shared__ uint8_t masks[2][64]; // GROUPED: the queries of the group that selected each tile key

    const int64_t t = blockIdx.x;
    const int h0 = blockIdx.y * SM90_HEAD_GROUP, tid = threadIdx.x;
    const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8; // this thread's two head rows of every accumulator
    const int cq = 2 * (lane & 3);                       // its column pair within each 8-column group
    const int32_t *sel = indices + t * topk;
    const int n_slots = GROUPED ? union_len[t] : topk;
    auto row_live = [&](int r) { return GROUPED ? t * 64 + r < n_rows : h0 + r < n_heads; };
    // the masks of tile i's keys into buffer i & 1, by 64 threads u = 0..63 of the block or a warpgroup
    auto load_masks = [&](int i, int u) {
        if (GROUPED && u < 64)
            masks[i & 1][u] = i * 64 + u < n_slots ? union_mask[t * topk + i * 64 + u] : 0;
    };

    { // Q: 64 heads x 576, row tid / 4; rows past n_heads (a partial last group) are zero and never stored
        const int row = tid >> 2, live = row_live(row);
        const char *src = (const char *)(q + ((t * n_heads) + (live ? h0 + row : 0)) * SM90_DQK);
#pragma unroll
        for (int k = 0; k < SM90_CHUNKS / 4; k++) {
            const int chunk = (tid & 3) + 4 * k;
            cp_async16(q_s + tile_offset(row, chunk), src + chunk * 16, live ? 16 : 0);
        }
    }
    gather_rows<SM90_THREADS>(kv_s0, valid, kv, sel, 0, n_slots, n_keys, tid);
    load_masks(0, tid);
    cp_async_commit();
    __shared__ int block_last;
    const int n_tiles = GROUPED ? max(1, (n_slots + SM90_KEYS - 1) / SM90_KEYS) // an empty list: one empty tile
                                : live_tiles<SM90_THREADS>(sel, topk, n_keys, &block_last, tid); // trailing -1 skipped
    const unsigned bit0 = GROUPED ? 1u << (r0 / heads_per_query) : 0u, bit1 = GROUPED ? 1u << (r1 / heads_per_query) : 0u;

    // descriptors: 128B swizzle, K-major (Q, K, P) with 1024-byte 8-row groups; V N-major, 64-column blocks 8 KiB apart
    const uint64_t desc_q = smem_desc(q_s, 16, 1024), desc_k = smem_desc(kv_s0, 16, 1024);
    const uint64_t desc_p = smem_desc(kv_s0 + SM90_ROPE_BLOCK, 16, 1024);
    const uint64_t desc_v = smem_desc(kv_s0 + wg * 4 * SM90_BLOCK_BYTES, SM90_BLOCK_BYTES, 1024);

    float o[128]; // O[r0 | r1][256 wg + 8 j + cq + {0,1}] = o[4 j + {0,1 | 2,3}]
#pragma unroll
    for (int i = 0; i < 128; i++)
        o[i] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f; // warpgroup 0: running max (log2) and partial sums

    for (int i = 0; i < n_tiles; i++) {
        const int buf = i & 1;
        const uint64_t buf_desc = (uint64_t)((buf * SM90_TILE_BYTES) >> 4);
        if (wg == 1 || i == 0)
            cp_async_wait_all(); // tile i: warpgroup 1's copies (everyone's at i = 0)
        fence_proxy_async();
        __syncthreads(); // tile i visible to all; both warpgroups are done with tile i - 1

        float alpha0 = 1.0f, alpha1 = 1.0f;
        if (wg == 0) {
            float s[32]; // S[r0 | r1][8 j + cq + {0,1}] = s[4 j + {0,1 | 2,3}]
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < SM90_DQK / 16; kk++) {
                const uint64_t koff = (uint64_t)((((kk >> 2) * SM90_BLOCK_BYTES) + (kk & 3) * 32) >> 4);
                wgmma_m64n64k16_bf16<0, 0>(s, desc_q + koff, desc_k + buf_desc + koff, kk > 0);
            }
            wgmma_commit();
            wgmma_wait_all();
            fence_regs(s);

            const int *ok = valid + buf * 64;
            const uint8_t *mask = masks[buf];
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = 8 * j + cq + (e & 1);
                    const bool take = ok[c] && (!GROUPED || (mask[c] & (e < 2 ? bit0 : bit1)));
                    const float x = take ? s[4 * j + e] * scale_log2 : -INFINITY;
                    s[4 * j + e] = x;
                    if (e < 2)
                        mx0 = fmaxf(mx0, x);
                    else
                        mx1 = fmaxf(mx1, x);
                }
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
            const float u0 = n0 == -INFINITY ? 0.0f : n0, u1 = n1 == -INFINITY ? 0.0f : n1;
            alpha0 = exp2f(m0 - u0), alpha1 = exp2f(m1 - u1);
            m0 = n0, m1 = n1;
            float sum0 = 0.0f, sum1 = 0.0f;
            unsigned char *p_tile = smem + SM90_TILE_BYTES * (1 + buf) + SM90_ROPE_BLOCK; // P (64 x 64 keys)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float p00 = exp2f(s[4 * j] - u0), p01 = exp2f(s[4 * j + 1] - u0);
                const float p10 = exp2f(s[4 * j + 2] - u1), p11 = exp2f(s[4 * j + 3] - u1);
                sum0 += p00 + p01, sum1 += p10 + p11;
                *(__nv_bfloat162 *)(p_tile + r0 * 128 + ((j ^ (r0 & 7)) << 4) + cq * 2) =
                    __floats2bfloat162_rn(p00, p01);
                *(__nv_bfloat162 *)(p_tile + r1 * 128 + ((j ^ (r1 & 7)) << 4) + cq * 2) =
                    __floats2bfloat162_rn(p10, p11);
            }
            l0 = l0 * alpha0 + sum0, l1 = l1 * alpha1 + sum1;
            if ((lane & 3) == 0)
                alpha_s[r0] = alpha0, alpha_s[r1] = alpha1;
        } else {
            if (i + 1 < n_tiles) { // the next tile, while warpgroup 0 works on this one
                gather_rows<128>(kv_s0 + (buf ^ 1) * SM90_TILE_BYTES, valid + (buf ^ 1) * 64, kv, sel,
                                 (i + 1) * SM90_KEYS, n_slots, n_keys, tid - 128);
                load_masks(i + 1, tid - 128);
            }
            cp_async_commit();
        }
        fence_proxy_async();
        __syncthreads(); // P and the rescale factors written
        if (wg == 1)
            alpha0 = alpha_s[r0], alpha1 = alpha_s[r1];
        if (__any_sync(0xffffffffu, alpha0 != 1.0f || alpha1 != 1.0f)) { /* skip when no row max moved */
#pragma unroll
            for (int j = 0; j < 32; j++) {
                o[4 * j] *= alpha0, o[4 * j + 1] *= alpha0;
                o[4 * j + 2] *= alpha1, o[4 * j + 3] *= alpha1;
            }
        }
        // O_wg += P V_wg: V = the tile's columns 256 wg .. 256 wg + 255, keys along K (N-major B)
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < SM90_KEYS / 16; kk++)
            wgmma_m64n256k16_bf16_mn(o, desc_p + buf_desc + kk * 2, desc_v + buf_desc + kk * 128, 1);
        wgmma_commit();
        wgmma_wait_all();
        fence_regs(o);
    }

    // row sums (warpgroup 0 holds them): over the quad, then shared with warpgroup 1 through shared memory
    if (wg == 0) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        if ((lane & 3) == 0)
            row_sum[r0] = l0, row_sum[r1] = l1;
    }
    __syncthreads();
    l0 = row_sum[r0], l1 = row_sum[r1];
    const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    const bool live0 = row_live(r0), live1 = row_live(r1);
    bf16 *out0 = out + (t * n_heads + h0 + r0) * SM90_DV + wg * 256 + cq;
    bf16 *out1 = out + (t * n_heads + h0 + r1) * SM90_DV + wg * 256 + cq;
    if (live0) {
#pragma unroll
        for (int j = 0; j < 32; j++)
            *(__nv_bfloat162 *)(out0 + 8 * j) = __floats2bfloat162_rn(o[4 * j] * inv0, o[4 * j + 1] * inv0);
    }
    if (live1) {
#pragma unroll
        for (int j = 0; j < 32; j++)
            *(__nv_bfloat162 *)(out1 + 8 * j) = __floats2bfloat162_rn(o[4 * j + 2] * inv1, o[4 * j + 3] * inv1);
    }
    if (wg == 0 && (lane & 3) == 0) {
        if (live0)
            lse[t * n_heads + h0 + r0] = l0 > 0.0f ? m0 * 0.69314718055994531f + logf(l0) : INFINITY;
        if (live1)
            lse[t * n_heads + h0 + r1] = l1 > 0.0f ? m1 * 0.69314718055994531f + logf(l1) : INFINITY;
    }
#else
    __trap();
#endif
}

/* The device and shapes the kernel serves (bf16 at GLM-5 dims, 16-byte aligned rows, compute capability 9.0). */
static int forward_sm90_serves(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                               const dsarl_dsa_attention_inputs *in, const void *out, int *serves, dsarl_error *err)
{
    *serves = 0;
    if (ctx->f32 || in->d_qk != SM90_DQK || in->d_v != SM90_DV || ((uintptr_t)in->q % 16) ||
        ((uintptr_t)in->kv % 16) || ((uintptr_t)out % 16) || batch->n_queries > 0x7fffffff ||
        ctx->settings.sparse_mla != TILELANG_MLA_AUTO)
        return DSARL_OK;
    return sm90_device(serves, err);
}

/* C linkage: the dispatch (sparse_mla_forward.cu) and the test (check_dsa_mla_sm90.c) call it. One block per
 * (query, 64 heads); heads in groups of 64, a last group of at least 16 padded. */
extern "C" int tilelang_sparse_mla_forward_sm90(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                                const dsarl_dsa_attention_inputs *in, const int32_t *indices,
                                                int32_t topk, void *out, float *lse, int *used, dsarl_error *err)
{
    *used = 0;
    int serves = 0;
    DSARL_TRY(forward_sm90_serves(ctx, batch, in, out, &serves, err));
    if (!serves || !tilelang_sparse_mla_sm90_head_groups(in->n_heads))
        return DSARL_OK;
    dim3 grid((unsigned int)batch->n_queries, (unsigned int)tilelang_sparse_mla_sm90_head_groups(in->n_heads));
    const float scale_log2 = in->softmax_scale * 1.4426950408889634f; /* logits in log2 units for exp2 */
    tlSharedLimit(sparse_mla_forward_sm90_kernel<false>, SM90_SHARED, err);
    if (batch->n_queries > 0)
        sparse_mla_forward_sm90_kernel<false><<<grid, SM90_THREADS, SM90_SHARED, TL_STREAM(ctx)>>>(
            (bf16 *)out, lse, (const bf16 *)in->q, (const bf16 *)in->kv, indices, topk, in->n_heads, batch->n_keys,
            scale_log2, NULL, NULL, 0, 0);
    tlCheckLaunch("sparse_mla_forward (sm90 wgmma)", err);
    *used = 1;
    return DSARL_OK;
}

/* The forward over query groups (group x n_heads = 64) reading the lists of tilelang_query_union; *used = 0 when
 * it does not take the shape. */
extern "C" int tilelang_sparse_mla_forward_sm90_grouped(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                                        const dsarl_dsa_attention_inputs *in, int32_t topk,
                                                        int group, const int32_t *union_keys,
                                                        const uint8_t *union_mask, const int32_t *union_len,
                                                        void *out, float *lse, int *used, dsarl_error *err)
{
    *used = 0;
    int serves = 0;
    DSARL_TRY(forward_sm90_serves(ctx, batch, in, out, &serves, err));
    if (!serves || group <= 1 || group * in->n_heads != SM90_HEAD_GROUP || topk <= 0)
        return DSARL_OK;
    *used = 1;
    const int64_t groups = (batch->n_queries + group - 1) / group;
    if (groups == 0)
        return DSARL_OK;
    const float scale_log2 = in->softmax_scale * 1.4426950408889634f;
    tlSharedLimit(sparse_mla_forward_sm90_kernel<true>, SM90_SHARED, err);
    sparse_mla_forward_sm90_kernel<true><<<(unsigned int)groups, SM90_THREADS, SM90_SHARED, TL_STREAM(ctx)>>>(
        (bf16 *)out, lse, (const bf16 *)in->q, (const bf16 *)in->kv, union_keys, group * topk, SM90_HEAD_GROUP,
        batch->n_keys, scale_log2, union_mask, union_len, in->n_heads, batch->n_queries * in->n_heads);
    tlCheckLaunch("sparse_mla_forward (sm90 wgmma, query groups)", err);
    return DSARL_OK;
}
