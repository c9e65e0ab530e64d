/* indexer_loss.cu: the indexer KL loss, forward and backward (DeepSeek-V3.2 section 2.1; the reference backend's
 * indexer_loss.c states the math and its sources). For query t over a set S (sparse: the valid slots of the top-k
 * row; dense warm-up: every eligible key):
 *   P(s) = sum_h exp(softmax_scale q[t,h,:] . kv[s,:] - lse_h),  p = P / max(sum_S P, 1e-10)
 *     (lse_h: the given sparse lse in sparse mode; recomputed over S in dense mode or when lse is NULL)
 *   log q(s) = I(t,s) - logsumexp_S I,  loss(t) = sum_{p>0} p (log p - log q)
 *   backward: g(s) = dloss (softmax_S(I)(s) - p(s)); dweights[t,j] = sum_s g relu(qI_j . kI_s);
 *   dq_index[t,j] = sum_s g w_j [qI_j . kI_s > 0] kI_s;  dk_index[s] += sum_j g w_j [..] qI[t,j]
 * One block per query row (persistent grid); the set, P, I and (backward) the raw indexer dots live in the block's
 * workspace rows. dk_index accumulates in fp32 with atomics and is added to the bf16 gradient once. */
#include <math.h>
#include "tilelang_common.cuh"

#define LOSS_THREADS 256
#define LOSS_MAX_HEADS 256

typedef struct loss_args {
    const int32_t *key_start, *key_end, *indices;
    int topk;
    const void *q, *kv; /* attention, (Tq, H, d_qk) and (Tk, d_qk), storage type */
    const float *lse;
    int n_heads, d_qk;
    float scale;
    const void *qi, *ki; /* indexer, (Tq, nI, dI) and (Tk, dI), storage type */
    const float *w;
    int ni, di;
    int64_t max_set;
} loss_args;

template <typename Storage>
static __device__ float dot_storage(const Storage *a, const Storage *b, int n)
{
    float s = 0.0f;
    for (int c = 0; c < n; c++)
        s += ldf(a + c) * ldf(b + c);
    return s;
}

// Fills keys, P (unnormalised), I and (dots != NULL) the indexer dots of row t; returns |S|. Also leaves the
// normaliser and the indexer log-sum-exp in *norm and *lse_i (every thread).
template <typename Storage>
static __device__ int loss_row(const loss_args *a, int64_t t, int32_t *keys, float *target, float *score,
                               float *dots, float *norm, float *lse_i)
{
    __shared__ int n_shared;
    __shared__ float head_lse[LOSS_MAX_HEADS];
    const int tid = threadIdx.x;
    if (a->indices) {
        if (tid == 0) { /* slot order, as the reference lists S */
            int n = 0;
            const int32_t *sel = a->indices + t * a->topk;
            for (int i = 0; i < a->topk; i++)
                if (sel[i] >= 0)
                    keys[n++] = sel[i];
            n_shared = n;
        }
    } else {
        int start = a->key_start[t], n = a->key_end[t] - start;
        n = n < 0 ? 0 : (n > a->max_set ? (int)a->max_set : n);
        for (int i = tid; i < n; i += blockDim.x)
            keys[i] = start + i;
        if (tid == 0)
            n_shared = n;
    }
    __syncthreads();
    const int n = n_shared;
    if (n == 0)
        return 0;
    const Storage *q_all = (const Storage *)a->q, *kv = (const Storage *)a->kv;
    const Storage *qi = (const Storage *)a->qi, *ki = (const Storage *)a->ki;
    const Storage *q_t = q_all + t * a->n_heads * a->d_qk;
    for (int h = 0; h < a->n_heads; h++) {
        if (a->indices && a->lse) {
            if (tid == 0)
                head_lse[h] = a->lse[t * a->n_heads + h];
            continue;
        }
        float m = -INFINITY;
        for (int i = tid; i < n; i += blockDim.x)
            m = fmaxf(m, a->scale * dot_storage(q_t + h * a->d_qk, kv + (int64_t)keys[i] * a->d_qk, a->d_qk));
        m = block_max(m);
        float s = 0.0f;
        for (int i = tid; i < n; i += blockDim.x)
            s += expf(a->scale * dot_storage(q_t + h * a->d_qk, kv + (int64_t)keys[i] * a->d_qk, a->d_qk) - m);
        s = block_sum(s);
        if (tid == 0)
            head_lse[h] = m + logf(s);
    }
    __syncthreads();
    const Storage *qi_t = qi + t * a->ni * a->di;
    float total = 0.0f, smax = -INFINITY;
    for (int i = tid; i < n; i += blockDim.x) {
        const Storage *kv_s = kv + (int64_t)keys[i] * a->d_qk, *ki_s = ki + (int64_t)keys[i] * a->di;
        float P = 0.0f, I = 0.0f;
        for (int h = 0; h < a->n_heads; h++)
            P += expf(a->scale * dot_storage(q_t + h * a->d_qk, kv_s, a->d_qk) - head_lse[h]);
        for (int j = 0; j < a->ni; j++) {
            float d = dot_storage(qi_t + j * a->di, ki_s, a->di);
            if (dots)
                dots[(int64_t)i * a->ni + j] = d;
            if (d > 0.0f)
                I += a->w[t * a->ni + j] * d;
        }
        target[i] = P;
        score[i] = I;
        total += P;
        smax = fmaxf(smax, I);
    }
    total = block_sum(total);
    smax = block_max(smax);
    float se = 0.0f;
    for (int i = tid; i < n; i += blockDim.x)
        se += expf(score[i] - smax);
    se = block_sum(se);
    *norm = total > 1e-10f ? total : 1e-10f;
    *lse_i = smax + logf(se);
    return n;
}

template <typename Storage>
static __global__ void indexer_loss_forward_kernel(loss_args a, int64_t Tq, float *loss, float *workspace)
{
    float *target = workspace + (int64_t)blockIdx.x * a.max_set * 3, *score = target + a.max_set;
    int32_t *keys = (int32_t *)(score + a.max_set);
    for (int64_t t = blockIdx.x; t < Tq; t += gridDim.x) {
        float norm = 1.0f, lse_i = 0.0f;
        int n = loss_row<Storage>(&a, t, keys, target, score, NULL, &norm, &lse_i);
        double kl = 0.0;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            double p = (double)target[i] / norm;
            if (p > 0.0)
                kl += p * (log(p) - ((double)score[i] - lse_i));
        }
        kl = block_sum_d(kl);
        if (threadIdx.x == 0)
            loss[t] = n > 0 ? (float)kl : 0.0f;
        __syncthreads();
    }
}

template <typename Storage>
static __global__ void indexer_loss_backward_kernel(loss_args a, int64_t Tq, const float *dloss, Storage *dq_index,
                                                    float *dk_acc, float *dweights, float *workspace)
{
    const int64_t per_block = a.max_set * (3 + (int64_t)a.ni);
    float *target = workspace + (int64_t)blockIdx.x * per_block, *score = target + a.max_set;
    int32_t *keys = (int32_t *)(score + a.max_set);
    float *dots = (float *)(keys + a.max_set);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, n_warps = blockDim.x >> 5;
    for (int64_t t = blockIdx.x; t < Tq; t += gridDim.x) {
        float norm = 1.0f, lse_i = 0.0f;
        int n = loss_row<Storage>(&a, t, keys, target, score, dots, &norm, &lse_i);
        const float *w_t = a.w + t * a.ni;
        const Storage *qi_t = (const Storage *)a.qi + t * a.ni * a.di, *ki = (const Storage *)a.ki;
        float *g = target; /* g(s) replaces P(s) */
        for (int i = tid; i < n; i += blockDim.x)
            g[i] = dloss[t] * (expf(score[i] - lse_i) - target[i] / norm);
        __syncthreads();
        for (int j = warp; j < a.ni; j += n_warps) {
            float s = 0.0f;
            for (int i = lane; i < n; i += 32) {
                float d = dots[(int64_t)i * a.ni + j];
                s += d > 0.0f ? g[i] * d : 0.0f;
            }
            s = warp_sum(s);
            if (lane == 0)
                dweights[t * a.ni + j] = s;
        }
        for (int e = tid; e < a.ni * a.di; e += blockDim.x) {
            int j = e / a.di, c = e % a.di;
            float s = 0.0f;
            for (int i = 0; i < n; i++)
                if (dots[(int64_t)i * a.ni + j] > 0.0f)
                    s += g[i] * ldf(ki + (int64_t)keys[i] * a.di + c);
            stf(dq_index + t * a.ni * a.di + e, s * w_t[j]);
        }
        for (int64_t e = tid; e < (int64_t)n * a.di; e += blockDim.x) {
            int i = (int)(e / a.di), c = (int)(e % a.di);
            float s = 0.0f;
            for (int j = 0; j < a.ni; j++)
                if (dots[(int64_t)i * a.ni + j] > 0.0f)
                    s += w_t[j] * ldf(qi_t + j * a.di + c);
            atomicAdd(dk_acc + (int64_t)keys[i] * a.di + c, g[i] * s);
        }
        __syncthreads();
    }
}

// Fills the argument block shared by forward and backward after checking the operands.
static int loss_setup(const char *op, dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                      const dsarl_dsa_attention_inputs *attn, const float *lse,
                      const dsarl_dsa_indexer_inputs *indexer, const int32_t *indices, int32_t topk, loss_args *a,
                      int64_t *blocks, dsarl_error *err)
{
    DSARL_TRY(tilelang_check_batch(op, batch, err));
    DSARL_TRY(tilelang_check_attention(op, attn, err));
    DSARL_TRY(tilelang_check_indexer(op, indexer, err));
    if (attn->n_heads > LOSS_MAX_HEADS || (indices && topk <= 0))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa tilelang %s: at most %d attention heads (got %d) and a "
                          "positive topk with indices (got %d)", op, LOSS_MAX_HEADS, attn->n_heads, topk);
    a->key_start = batch->key_start;
    a->key_end = batch->key_end;
    a->indices = indices;
    a->topk = topk;
    a->q = attn->q;
    a->kv = attn->kv;
    a->lse = lse;
    a->n_heads = attn->n_heads;
    a->d_qk = attn->d_qk;
    a->scale = attn->softmax_scale;
    a->qi = indexer->q;
    a->ki = indexer->k;
    a->w = indexer->weights;
    a->ni = indexer->n_heads;
    a->di = indexer->head_dim;
    a->max_set = indices ? topk : (batch->max_keys_per_query > 0 ? batch->max_keys_per_query : 1);
    *blocks = batch->n_queries < 2 * ctx->sm_count ? batch->n_queries : 2 * ctx->sm_count;
    return DSARL_OK;
}

int tilelang_indexer_loss_forward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                  const dsarl_dsa_attention_inputs *attn, const float *lse,
                                  const dsarl_dsa_indexer_inputs *indexer, const int32_t *indices, int32_t topk,
                                  float *loss, dsarl_error *err)
{
    loss_args a;
    int64_t blocks = 0;
    DSARL_TRY(loss_setup("indexer_loss_forward", ctx, batch, attn, lse, indexer, indices, topk, &a, &blocks, err));
    if (batch->n_queries == 0)
        return DSARL_OK;
    if (!loss)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa tilelang indexer_loss_forward: loss (Tq) must be set");
    float *ws;
    DSARL_TRY(tilelang_workspace(ctx, (size_t)blocks * (size_t)a.max_set * 3 * sizeof(float), (void **)&ws, err));
    TL_LAUNCH(ctx->f32, ctx->stream, indexer_loss_forward_kernel, (unsigned int)blocks, LOSS_THREADS, 0, a,
              batch->n_queries, loss, ws);
    tlCheckLaunch("indexer_loss_forward", err);
    return DSARL_OK;
}

int tilelang_indexer_loss_backward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                   const dsarl_dsa_attention_inputs *attn, const float *lse,
                                   const dsarl_dsa_indexer_inputs *indexer, const int32_t *indices, int32_t topk,
                                   const float *dloss, void *dq_index, void *dk_index, float *dweights,
                                   dsarl_error *err)
{
    loss_args a;
    int64_t blocks = 0;
    DSARL_TRY(loss_setup("indexer_loss_backward", ctx, batch, attn, lse, indexer, indices, topk, &a, &blocks, err));
    if (batch->n_queries == 0)
        return DSARL_OK;
    if (!dloss || !dq_index || !dk_index || !dweights)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa tilelang indexer_loss_backward: dloss, dq_index, dk_index and "
                          "dweights must be set");
    int64_t acc_n = batch->n_keys * (int64_t)a.di;
    size_t rows_bytes = (size_t)blocks * (size_t)a.max_set * (3 + (size_t)a.ni) * sizeof(float);
    size_t acc_bytes = (size_t)(acc_n > 0 ? acc_n : 1) * sizeof(float);
    char *ws;
    DSARL_TRY(tilelang_workspace(ctx, rows_bytes + acc_bytes + 256, (void **)&ws, err));
    float *acc = (float *)(ws + (rows_bytes + 255) / 256 * 256);
    tlCheck(cudaMemsetAsync(acc, 0, (size_t)acc_n * sizeof(float), TL_STREAM(ctx)), err);
    TL_LAUNCH(ctx->f32, ctx->stream, indexer_loss_backward_kernel, (unsigned int)blocks, LOSS_THREADS, 0, a,
              batch->n_queries, dloss, (S *)dq_index, acc, dweights, (float *)ws);
    tlCheckLaunch("indexer_loss_backward", err);
    return tilelang_flush_accumulator(ctx, dk_index, acc, acc_n, err);
}
