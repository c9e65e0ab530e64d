/* sparse_mla_forward_wmma.cu: the tensor-core path of the sparse MLA forward (bf16 storage, d_qk and d_v multiples
 * of 16): same math as sparse_mla_forward.cu (see there), with both products on the tensor cores through WMMA
 * (16x16x16 bf16 fragments, fp32 accumulation).
 *
 * Role: the tested portable tensor-core path. It serves every bf16 shape on GPUs without wgmma (Ampere, Ada) and on
 * Hopper the shapes the sm_90 kernel does not take (other dims, a last head group under 16); on the H200 the suites
 * force it at GLM-5 dims with runtime.tilelang_sparse_mla=wmma (check_dsa_mla_sm90's test_old_vs_new, against the
 * wgmma kernel that its other cases check against the reference backend). docs/gpu.md lists the paths.
 *
 * One block (8 warps) per (query, group of hb = 32 heads, or 16 when the model has fewer than 32). Per tile of 64
 * selected keys: the KV rows are gathered into shared memory (bf16, 16-byte copies); the warps compute
 * S = Q KV^T (hb x 64, in 16x16 blocks over d_qk); hb threads run the online softmax on S and write P (bf16); every
 * thread rescales the fp32 output O (hb x d_v, shared) by exp(m_old - m_new); the warps then add P V into O, block
 * by block. P is rounded
 * to bf16 for the second product (as FlashAttention does); the row sums use the fp32 probabilities.
 * Fast path still to come: wgmma (sm_90a) over 64-head tiles with TMA-gathered KV rows, and a pipelined gather. */
#include <math.h>
#include <mma.h>
#include "tilelang_common.cuh"

using namespace nvcuda;

#define WM_THREADS 256
#define WM_MAX_HEADS 32 /* heads per block: 32 when the model has that many (twice the reuse of a KV tile) */
#define WM_KEYS 64

typedef struct wmma_layout {
    int ldq, ldkv, lds, ldp, ldo;                       /* leading dimensions, elements */
    size_t q, kv, s, p, o, stats, idx, total;           /* byte offsets of each region, then the total */
} wmma_layout;

static size_t align128(size_t x) { return (x + 127) / 128 * 128; }

static wmma_layout make_layout(int hb, int d_qk, int d_v)
{
    wmma_layout L;
    L.ldq = d_qk + 8, L.ldkv = d_qk + 8, L.lds = WM_KEYS + 4, L.ldp = WM_KEYS + 8, L.ldo = d_v + 4;
    size_t off = 0;
    L.q = off, off = align128(off + (size_t)hb * L.ldq * 2);
    L.kv = off, off = align128(off + (size_t)WM_KEYS * L.ldkv * 2);
    L.s = off, off = align128(off + (size_t)hb * L.lds * 4);
    L.p = off, off = align128(off + (size_t)hb * L.ldp * 2);
    L.o = off, off = align128(off + (size_t)hb * L.ldo * 4);
    L.stats = off, off = align128(off + 3 * (size_t)hb * 4);
    L.idx = off, off = align128(off + WM_KEYS * 4);
    L.total = off;
    return L;
}

static __global__ void sparse_mla_forward_wmma_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *kv,
                                                      const int32_t *indices, int topk, int n_heads, int d_qk, int d_v,
                                                      float scale, int hb, wmma_layout L)
{
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *q_s = (bf16 *)(smem + L.q), *kv_s = (bf16 *)(smem + L.kv), *p_s = (bf16 *)(smem + L.p);
    float *s_s = (float *)(smem + L.s), *o_s = (float *)(smem + L.o), *m_s = (float *)(smem + L.stats);
    float *l_s = m_s + hb, *alpha_s = l_s + hb;
    int32_t *idx_s = (int32_t *)(smem + L.idx);
    const int64_t t = blockIdx.x;
    const int h0 = blockIdx.y * hb, heads = min(hb, n_heads - h0);
    const int tid = threadIdx.x, warp = tid >> 5;
    const int32_t *sel = indices + t * topk;
    const int chunks = d_qk / 8; /* 16-byte chunks per row */

    for (int e = tid; e < hb * chunks; e += blockDim.x) {
        int h = e / chunks, c = e % chunks;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (h < heads)
            v = reinterpret_cast<const uint4 *>(q + (t * n_heads + h0 + h) * d_qk)[c];
        reinterpret_cast<uint4 *>(q_s + h * L.ldq)[c] = v;
    }
    for (int e = tid; e < hb * d_v; e += blockDim.x)
        o_s[(e / d_v) * L.ldo + e % d_v] = 0.0f;
    if (tid < hb) {
        m_s[tid] = -INFINITY;
        l_s[tid] = 0.0f;
    }
    for (int base = 0; base < topk; base += WM_KEYS) {
        const int rows = min(WM_KEYS, topk - base);
        __syncthreads();
        for (int j = tid; j < WM_KEYS; j += blockDim.x)
            idx_s[j] = j < rows ? sel[base + j] : -1;
        __syncthreads();
        for (int e = tid; e < WM_KEYS * chunks; e += blockDim.x) {
            int j = e / chunks, c = e % chunks;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (idx_s[j] >= 0)
                v = reinterpret_cast<const uint4 *>(kv + (int64_t)idx_s[j] * d_qk)[c];
            reinterpret_cast<uint4 *>(kv_s + j * L.ldkv)[c] = v;
        }
        __syncthreads();
        for (int blk = warp; blk < (hb / 16) * (WM_KEYS / 16); blk += blockDim.x / 32) { /* S blocks, 16 x 16 */
            const int rb = blk / (WM_KEYS / 16), jb = blk % (WM_KEYS / 16);
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int kk = 0; kk < d_qk; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
                wmma::load_matrix_sync(a, q_s + rb * 16 * L.ldq + kk, L.ldq);
                wmma::load_matrix_sync(b, kv_s + jb * 16 * L.ldkv + kk, L.ldkv);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(s_s + rb * 16 * L.lds + jb * 16, acc, L.lds, wmma::mem_row_major);
        }
        __syncthreads();
        if (tid < hb) { /* online softmax of one head row */
            float *srow = s_s + tid * L.lds, m_old = m_s[tid], m_new = m_old;
            for (int j = 0; j < WM_KEYS; j++) {
                srow[j] = idx_s[j] >= 0 ? scale * srow[j] : -INFINITY;
                m_new = fmaxf(m_new, srow[j]);
            }
            float alpha = 1.0f, sum = 0.0f;
            bf16 *prow = p_s + tid * L.ldp;
            for (int j = 0; j < WM_KEYS; j++) {
                float p = (m_new == -INFINITY || srow[j] == -INFINITY) ? 0.0f : expf(srow[j] - m_new);
                sum += p;
                prow[j] = __float2bfloat16(p);
            }
            if (m_new != -INFINITY)
                alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
            m_s[tid] = m_new;
            l_s[tid] = l_s[tid] * alpha + sum;
            alpha_s[tid] = alpha;
        }
        __syncthreads();
        for (int e = tid; e < hb * d_v; e += blockDim.x) {
            int h = e / d_v;
            o_s[h * L.ldo + e % d_v] *= alpha_s[h];
        }
        __syncthreads();
        for (int blk = warp; blk < (hb / 16) * (d_v / 16); blk += blockDim.x / 32) { /* O blocks, 16 x 16 */
            const int rb = blk / (d_v / 16), nb = blk % (d_v / 16);
            float *o_blk = o_s + rb * 16 * L.ldo + nb * 16;
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::load_matrix_sync(acc, o_blk, L.ldo, wmma::mem_row_major);
            for (int kk = 0; kk < WM_KEYS; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
                wmma::load_matrix_sync(a, p_s + rb * 16 * L.ldp + kk, L.ldp);
                wmma::load_matrix_sync(b, kv_s + kk * L.ldkv + nb * 16, L.ldkv);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(o_blk, acc, L.ldo, wmma::mem_row_major);
        }
    }
    __syncthreads();
    for (int e = tid; e < heads * d_v; e += blockDim.x) {
        int h = e / d_v;
        out[(t * n_heads + h0) * d_v + e] = __float2bfloat16(l_s[h] > 0.0f ? o_s[h * L.ldo + e % d_v] / l_s[h] : 0.0f);
    }
    for (int h = tid; h < heads; h += blockDim.x)
        lse[t * n_heads + h0 + h] = l_s[h] > 0.0f ? m_s[h] + logf(l_s[h]) : INFINITY;
}

int tilelang_sparse_mla_forward_wmma(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                     const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk,
                                     void *out, float *lse, int *used, dsarl_error *err)
{
    *used = 0;
    const int hb = in->n_heads >= WM_MAX_HEADS ? WM_MAX_HEADS : 16;
    wmma_layout L = make_layout(hb, in->d_qk, in->d_v);
    // The tensor-core path needs bf16 storage, 16-multiples, 16-byte aligned rows and fitting shared memory.
    if (ctx->f32 || in->d_qk % 16 || in->d_v % 16 || L.total > TL_MAX_SHARED || ((uintptr_t)in->q % 16) ||
        ((uintptr_t)in->kv % 16) || ctx->settings.sparse_mla == TILELANG_MLA_CUDA_CORE)
        return DSARL_OK;
    tlSharedLimit(sparse_mla_forward_wmma_kernel, L.total, err);
    dim3 grid((unsigned int)batch->n_queries, (unsigned int)((in->n_heads + hb - 1) / hb));
    sparse_mla_forward_wmma_kernel<<<grid, WM_THREADS, L.total, TL_STREAM(ctx)>>>((bf16 *)out, lse, (const bf16 *)in->q,
                                                                  (const bf16 *)in->kv, indices, topk, in->n_heads,
                                                                  in->d_qk, in->d_v, in->softmax_scale, hb, L);
    tlCheckLaunch("sparse_mla_forward (wmma)", err);
    *used = 1;
    return DSARL_OK;
}
