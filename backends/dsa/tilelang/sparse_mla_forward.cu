/* sparse_mla_forward.cu: sparse MLA forward in the absorbed MQA form (the latent kv row is both
 * key and value). Role: the CUDA-core fp32 path, the only one for float32 storage (runtime.cuda_storage_dtype=f32,
 * which checks a model against the cpu run) and for dims that are not multiples of 16, on every GPU; tested on the
 * H200 by check_dsa_tilelang through runtime.tilelang_sparse_mla=cuda_core and its odd-dim cases (docs/gpu.md).
 *
 *   logit_h(s) = softmax_scale * q[t,h,:] . kv[s,:]   (all d_qk columns), s over the valid slots of indices[t]
 *   out[t,h,:] = sum_s softmax(logit_h)(s) kv[s,:d_v],  lse[t,h] = log sum_s exp(logit_h(s))
 *
 * One block per (query, group of up to 16 heads). The selected KV rows are gathered in tiles of KT rows into
 * shared memory (fp32, rows padded by one word against bank conflicts) and used by every head of the group; an
 * online softmax (running max m and sum l per head, rescaling the fp32 accumulator) folds in one tile at a time.
 * A row with no valid slot gets out = 0 and lse = +inf. Each slot is one softmax term (a repeated key counts
 * twice), as in the reference. */
#include <math.h>
#include "tilelang_common.cuh"

/* The Hopper wgmma kernel for bf16 at GLM-5 dims (sparse_mla_forward_sm90.cu); *used = 0 without launching when the
 * operands or the device do not fit it. */
extern "C" int tilelang_sparse_mla_forward_sm90(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                                const dsarl_dsa_attention_inputs *in, const int32_t *indices,
                                                int32_t topk, void *out, float *lse, int *used, dsarl_error *err);

#define MLA_THREADS 256
#define MLA_HEAD_GROUP 16

// Shared layout of one block, in floats: q (HG, d_qk) | kv tile (KT, d_qk+1) | acc (HG, d_v) | p (HG, KT) |
// m, l, alpha (HG each); plus KT int32 slot indices.
static size_t forward_shared_bytes(int hg, int kt, int d_qk, int d_v)
{
    return ((size_t)hg * d_qk + (size_t)kt * (d_qk + 1) + (size_t)hg * d_v + (size_t)hg * kt + 3 * (size_t)hg) *
               sizeof(float) + (size_t)kt * sizeof(int32_t);
}

template <typename Storage>
static __global__ void sparse_mla_forward_kernel(Storage *out, float *lse, const Storage *q, const Storage *kv,
                                                 const int32_t *indices, int topk, int n_heads, int d_qk, int d_v,
                                                 float scale, int hg, int kt)
{
    extern __shared__ float shared[];
    const int ld = d_qk + 1;
    float *q_s = shared, *kv_s = q_s + hg * d_qk, *acc = kv_s + kt * ld, *p_s = acc + hg * d_v;
    float *m_s = p_s + hg * kt, *l_s = m_s + hg, *alpha_s = l_s + hg;
    int32_t *idx_s = (int32_t *)(alpha_s + hg);
    const int64_t t = blockIdx.x;
    const int h0 = blockIdx.y * hg, heads = min(hg, n_heads - h0), tid = threadIdx.x;
    const int32_t *sel = indices + t * topk;

    for (int i = tid; i < heads * d_qk; i += blockDim.x)
        q_s[i] = ldf(q + (t * n_heads + h0) * d_qk + i);
    for (int i = tid; i < heads * d_v; i += blockDim.x)
        acc[i] = 0.0f;
    for (int h = tid; h < heads; h += blockDim.x) {
        m_s[h] = -INFINITY;
        l_s[h] = 0.0f;
    }
    for (int base = 0; base < topk; base += kt) {
        const int rows = min(kt, topk - base);
        __syncthreads();
        for (int j = tid; j < kt; j += blockDim.x)
            idx_s[j] = j < rows ? sel[base + j] : -1;
        __syncthreads();
        for (int i = tid; i < kt * d_qk; i += blockDim.x) {
            int j = i / d_qk, c = i % d_qk;
            kv_s[j * ld + c] = idx_s[j] >= 0 ? ldf(kv + (int64_t)idx_s[j] * d_qk + c) : 0.0f;
        }
        __syncthreads();
        for (int i = tid; i < heads * kt; i += blockDim.x) {
            int h = i / kt, j = i % kt;
            float logit = -INFINITY;
            if (idx_s[j] >= 0) {
                const float *qh = q_s + h * d_qk, *kj = kv_s + j * ld;
                float dot = 0.0f;
                for (int c = 0; c < d_qk; c++)
                    dot += qh[c] * kj[c];
                logit = scale * dot;
            }
            p_s[i] = logit;
        }
        __syncthreads();
        for (int h = tid; h < heads; h += blockDim.x) { /* online softmax bookkeeping, one thread per head */
            float *ph = p_s + h * kt, m_old = m_s[h], m_new = m_old;
            for (int j = 0; j < kt; j++)
                m_new = fmaxf(m_new, ph[j]);
            float alpha = 1.0f, sum = 0.0f;
            if (m_new != -INFINITY) {
                alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
                for (int j = 0; j < kt; j++) {
                    ph[j] = ph[j] == -INFINITY ? 0.0f : expf(ph[j] - m_new);
                    sum += ph[j];
                }
            } else {
                for (int j = 0; j < kt; j++)
                    ph[j] = 0.0f;
            }
            m_s[h] = m_new;
            l_s[h] = l_s[h] * alpha + sum;
            alpha_s[h] = alpha;
        }
        __syncthreads();
        for (int i = tid; i < heads * d_v; i += blockDim.x) {
            int h = i / d_v, c = i % d_v;
            const float *ph = p_s + h * kt;
            float a = acc[i] * alpha_s[h];
            for (int j = 0; j < kt; j++)
                a += ph[j] * kv_s[j * ld + c];
            acc[i] = a;
        }
    }
    __syncthreads();
    for (int i = tid; i < heads * d_v; i += blockDim.x) {
        int h = i / d_v;
        stf(out + (t * n_heads + h0) * d_v + i, l_s[h] > 0.0f ? acc[i] / l_s[h] : 0.0f);
    }
    for (int h = tid; h < heads; h += blockDim.x)
        lse[t * n_heads + h0 + h] = l_s[h] > 0.0f ? m_s[h] + logf(l_s[h]) : INFINITY;
}

int tilelang_sparse_mla_forward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk, void *out,
                                float *lse, dsarl_error *err)
{
    DSARL_TRY(tilelang_check_batch("sparse_mla_forward", batch, err));
    DSARL_TRY(tilelang_check_attention("sparse_mla_forward", in, err));
    if (topk <= 0 || (batch->n_queries > 0 && (!indices || !out || !lse)))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa tilelang sparse_mla_forward: topk = %d must be positive and "
                          "indices, out and lse set", topk);
    if (batch->n_queries == 0)
        return DSARL_OK;
    int used = 0, group = 0;
    /* runtime.tilelang_mla_forward_query_groups: query groups (8/16/32 heads: 64 / H queries per block over their
     * keys' union) where the batch still gives every SM two blocks: a packed prefill or training pass; a decode
     * step's few queries, each of another sequence, keep one block per query (their keys hardly overlap, and fewer
     * blocks would leave SMs idle). Off by default: slower than one block per query where queries share few keys
     * (docs/performance.md) */
    if (ctx->settings.forward_groups)
        DSARL_TRY(tilelang_sparse_mla_query_group(ctx, batch, in, topk, &group, err));
    if (group && batch->n_queries / group >= 2 * (int64_t)ctx->sm_count) {
        char *ws;
        DSARL_TRY(tilelang_workspace(ctx, tilelang_union_lists_bytes(group, topk, batch->n_queries), (void **)&ws,
                                     err));
        const tilelang_union_lists u = tilelang_union_lists_at(ws, group, topk, batch->n_queries);
        DSARL_TRY(tilelang_query_union(ctx, indices, topk, group, batch->n_queries, batch->n_keys, u.keys, u.mask,
                                       u.len, err));
        DSARL_TRY(tilelang_sparse_mla_forward_sm90_grouped(ctx, batch, in, topk, group, u.keys, u.mask, u.len, out,
                                                           lse, &used, err));
        if (used)
            return DSARL_OK;
    }
    DSARL_TRY(tilelang_sparse_mla_forward_sm90(ctx, batch, in, indices, topk, out, lse, &used, err));
    if (used)
        return DSARL_OK;
    DSARL_TRY(tilelang_sparse_mla_forward_wmma(ctx, batch, in, indices, topk, out, lse, &used, err));
    if (used)
        return DSARL_OK;
    int hg = in->n_heads < MLA_HEAD_GROUP ? in->n_heads : MLA_HEAD_GROUP, kt = 32;
    while (kt > 4 && forward_shared_bytes(hg, kt, in->d_qk, in->d_v) > TL_MAX_SHARED)
        kt /= 2;
    size_t shared = forward_shared_bytes(hg, kt, in->d_qk, in->d_v);
    if (shared > TL_MAX_SHARED)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "dsa tilelang sparse_mla_forward: d_qk %d / d_v %d need %zu "
                          "bytes of shared memory, more than %d", in->d_qk, in->d_v, shared, TL_MAX_SHARED);
    tlSharedLimitT(sparse_mla_forward_kernel, shared, err);
    dim3 grid((unsigned int)batch->n_queries, (unsigned int)((in->n_heads + hg - 1) / hg));
    TL_LAUNCH(ctx->f32, ctx->stream, sparse_mla_forward_kernel, grid, MLA_THREADS, shared, (S *)out, lse,
              (const S *)in->q, (const S *)in->kv, indices, topk, in->n_heads, in->d_qk, in->d_v, in->softmax_scale,
              hg, kt);
    tlCheckLaunch("sparse_mla_forward", err);
    return DSARL_OK;
}
