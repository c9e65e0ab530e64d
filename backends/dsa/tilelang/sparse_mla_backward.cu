/* sparse_mla_backward.cu: backward of the sparse MLA forward (TileLang examples/deepseek_v32 sparse_mla_bwd).
 * Role: the CUDA-core fp32 path (float32 storage, dims that are not multiples of 16, every GPU), tested on the H200
 * by check_dsa_tilelang through runtime.tilelang_sparse_mla=cuda_core (docs/gpu.md).
 *
 * With the forward's out and lse, for query t, head h and valid slot s:
 *   p(s)  = exp(softmax_scale * q[t,h,:] . kv[s,:] - lse[t,h]),   Delta = out[t,h,:] . dout[t,h,:]
 *   dP(s) = p(s) (dout[t,h,:] . kv[s,:d_v] - Delta)
 *   dq[t,h]      = softmax_scale sum_s dP(s) kv[s,:]                           (overwritten)
 *   dkv[s]      += softmax_scale dP(s) q[t,h,:]  ;  dkv[s,:d_v] += p(s) dout[t,h,:]   (accumulated)
 * One block per (query, group of heads), KV tiles through shared memory as in the forward; dq accumulates in
 * shared fp32; each tile's dkv rows (summed over the group's heads first) go to an fp32 accumulator with atomics,
 * which is added to the bf16 dkv once at the end, so dkv is rounded to bf16 once per call. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "tilelang_common.cuh"

/* The Hopper wgmma backward (sparse_mla_backward_sm90.cu): taken for the shapes it serves unless
 * DSARL_TILELANG_NO_SM90 is set. */
extern "C" int tilelang_sparse_mla_backward_sm90(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                                 const dsarl_dsa_attention_inputs *in, const int32_t *indices,
                                                 int32_t topk, const void *out, const float *lse, const void *dout,
                                                 void *dq, float *dkv_acc, int *used, dsarl_error *err);

#define MLA_THREADS 256
#define MLA_HEAD_GROUP 16

// Shared layout, floats: q (HG, d_qk) | dout (HG, d_v) | kv tile (KT, d_qk+1) | dq (HG, d_qk) | p, dP (HG, KT) |
// lse, delta (HG); plus KT int32 slot indices.
static size_t backward_shared_bytes(int hg, int kt, int d_qk, int d_v)
{
    return ((size_t)hg * d_qk * 2 + (size_t)hg * d_v + (size_t)kt * (d_qk + 1) + 2 * (size_t)hg * kt +
            2 * (size_t)hg) * sizeof(float) + (size_t)kt * sizeof(int32_t);
}

template <typename Storage>
static __global__ void sparse_mla_backward_kernel(Storage *dq, float *dkv_acc, const Storage *q, const Storage *kv,
                                                  const int32_t *indices, const Storage *out, const float *lse,
                                                  const Storage *dout, int topk, int n_heads, int d_qk, int d_v,
                                                  float scale, int hg, int kt)
{
    extern __shared__ float shared[];
    const int ld = d_qk + 1;
    float *q_s = shared, *do_s = q_s + hg * d_qk, *kv_s = do_s + hg * d_v, *dq_s = kv_s + kt * ld;
    float *p_s = dq_s + hg * d_qk, *dp_s = p_s + hg * kt, *lse_s = dp_s + hg * kt, *delta_s = lse_s + hg;
    int32_t *idx_s = (int32_t *)(delta_s + hg);
    const int64_t t = blockIdx.x;
    const int h0 = blockIdx.y * hg, heads = min(hg, n_heads - h0), tid = threadIdx.x;
    const int32_t *sel = indices + t * topk;

    for (int i = tid; i < heads * d_qk; i += blockDim.x) {
        q_s[i] = ldf(q + (t * n_heads + h0) * d_qk + i);
        dq_s[i] = 0.0f;
    }
    for (int i = tid; i < heads * d_v; i += blockDim.x)
        do_s[i] = ldf(dout + (t * n_heads + h0) * d_v + i);
    // Delta per head: one warp per head
    const int lane = tid & 31, warp = tid >> 5, n_warps = blockDim.x >> 5;
    for (int h = warp; h < heads; h += n_warps) {
        const Storage *o = out + (t * n_heads + h0 + h) * d_v, *d = dout + (t * n_heads + h0 + h) * d_v;
        float s = 0.0f;
        for (int c = lane; c < d_v; c += 32)
            s += ldf(o + c) * ldf(d + c);
        s = warp_sum(s);
        if (lane == 0) {
            delta_s[h] = s;
            lse_s[h] = lse[t * n_heads + h0 + h];
        }
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
            float p = 0.0f, dp = 0.0f;
            if (idx_s[j] >= 0 && lse_s[h] != INFINITY) {
                const float *qh = q_s + h * d_qk, *kj = kv_s + j * ld, *doh = do_s + h * d_v;
                float dot = 0.0f, dov = 0.0f;
                for (int c = 0; c < d_qk; c++)
                    dot += qh[c] * kj[c];
                for (int c = 0; c < d_v; c++)
                    dov += doh[c] * kj[c];
                p = expf(scale * dot - lse_s[h]);
                dp = p * (dov - delta_s[h]);
            }
            p_s[i] = p;
            dp_s[i] = dp;
        }
        __syncthreads();
        for (int i = tid; i < heads * d_qk; i += blockDim.x) {
            int h = i / d_qk, c = i % d_qk;
            const float *dph = dp_s + h * kt;
            float a = 0.0f;
            for (int j = 0; j < kt; j++)
                a += dph[j] * kv_s[j * ld + c];
            dq_s[i] += a;
        }
        for (int i = tid; i < kt * d_qk; i += blockDim.x) {
            int j = i / d_qk, c = i % d_qk;
            if (idx_s[j] < 0)
                continue;
            float g = 0.0f;
            for (int h = 0; h < heads; h++) {
                g += scale * dp_s[h * kt + j] * q_s[h * d_qk + c];
                if (c < d_v)
                    g += p_s[h * kt + j] * do_s[h * d_v + c];
            }
            atomicAdd(dkv_acc + (int64_t)idx_s[j] * d_qk + c, g);
        }
    }
    __syncthreads();
    for (int i = tid; i < heads * d_qk; i += blockDim.x)
        stf(dq + (t * n_heads + h0) * d_qk + i, scale * dq_s[i]);
}

int tilelang_sparse_mla_backward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                 const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk,
                                 const void *out, const float *lse, const void *dout, void *dq, void *dkv,
                                 dsarl_error *err)
{
    DSARL_TRY(tilelang_check_batch("sparse_mla_backward", batch, err));
    DSARL_TRY(tilelang_check_attention("sparse_mla_backward", in, err));
    if (topk <= 0 || (batch->n_queries > 0 && (!indices || !out || !lse || !dout || !dq || !dkv)))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa tilelang sparse_mla_backward: topk = %d must be positive and "
                          "indices, out, lse, dout, dq and dkv set", topk);
    if (batch->n_queries == 0)
        return DSARL_OK;
    int hg = in->n_heads < MLA_HEAD_GROUP ? in->n_heads : MLA_HEAD_GROUP, kt = 32;
    while (kt > 4 && backward_shared_bytes(hg, kt, in->d_qk, in->d_v) > TL_MAX_SHARED)
        kt /= 2;
    size_t shared = backward_shared_bytes(hg, kt, in->d_qk, in->d_v);
    if (shared > TL_MAX_SHARED)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "dsa tilelang sparse_mla_backward: d_qk %d / d_v %d need %zu "
                          "bytes of shared memory, more than %d", in->d_qk, in->d_v, shared, TL_MAX_SHARED);
    int64_t acc_n = batch->n_keys * (int64_t)in->d_qk;
    /* at 8/16/32 heads the sm_90 kernel takes 64 / H queries per block over their keys' union: the lists go after
     * the accumulator in the workspace (keys, lengths, then masks; every part 16-byte aligned) */
    int group = 0;
    DSARL_TRY(tilelang_sparse_mla_query_group(ctx, batch, in, topk, &group, err));
    const size_t acc_bytes = ((size_t)(acc_n > 0 ? acc_n : 1) * sizeof(float) + 15) & ~(size_t)15;
    char *ws;
    DSARL_TRY(tilelang_workspace(ctx, acc_bytes + (group ? tilelang_union_lists_bytes(group, topk, batch->n_queries)
                                                         : 0), (void **)&ws, err));
    float *acc = (float *)ws;
    tlCheck(cudaMemsetAsync(acc, 0, (size_t)acc_n * sizeof(float), TL_STREAM(ctx)), err);
    int used = 0;
    if (group) {
        const tilelang_union_lists u = tilelang_union_lists_at(ws + acc_bytes, group, topk, batch->n_queries);
        DSARL_TRY(tilelang_query_union(ctx, indices, topk, group, batch->n_queries, batch->n_keys, u.keys, u.mask,
                                       u.len, err));
        DSARL_TRY(tilelang_sparse_mla_backward_sm90_grouped(ctx, batch, in, topk, group, u.keys, u.mask, u.len, out,
                                                            lse, dout, dq, acc, &used, err));
    }
    if (!used)
        DSARL_TRY(tilelang_sparse_mla_backward_sm90(ctx, batch, in, indices, topk, out, lse, dout, dq, acc, &used,
                                                    err));
    if (!used)
        DSARL_TRY(tilelang_sparse_mla_backward_wmma(ctx, batch, in, indices, topk, out, lse, dout, dq, acc, &used,
                                                    err));
    if (used)
        return tilelang_flush_accumulator(ctx, dkv, acc, acc_n, err);
    tlSharedLimitT(sparse_mla_backward_kernel, shared, err);
    dim3 grid((unsigned int)batch->n_queries, (unsigned int)((in->n_heads + hg - 1) / hg));
    TL_LAUNCH(ctx->f32, ctx->stream, sparse_mla_backward_kernel, grid, MLA_THREADS, shared, 
        (S *)dq, acc, (const S *)in->q, (const S *)in->kv, indices, (const S *)out, lse,
        (const S *)dout, topk, in->n_heads, in->d_qk, in->d_v, in->softmax_scale, hg, kt);
    tlCheckLaunch("sparse_mla_backward", err);
    return tilelang_flush_accumulator(ctx, dkv, acc, acc_n, err);
}
