/* absorbed.c: the absorbed-form ops. The sparse MLA forward runs as cuDNN SDPA_FWD with block-size-1 page tables
 * (cuDNN 9.19's paged-attention forward); everything cuDNN 9.19 cannot express is handed to the tilelang kernels.
 *
 * Paged forward: batch = query token, its H heads packed as H query rows of one head (seq_len_q = H), the page
 * table row = the token's valid top-k indices moved to the front (seq_len_kv = their count), pages of one row of
 * the shared latent array (K = all d_qk columns, V = the first d_v columns of the same rows), Stats = lse.
 * Query tokens run in power-of-two chunks (the binary decomposition of Tq) so plans are reused across batch sizes;
 * the pool is described with a power-of-two page count >= Tk (only the pages the table names are read).
 * A row with no valid index is given one dummy page for cuDNN and then overwritten: out 0, lse +inf.
 * At GLM-5's dims (576/512, heads in groups of 64 or a last group of at least 16, bf16) tilelang's wgmma kernel
 * measured ~5.8x faster than this graph on the H200 at 64 heads and ~6.3x at 16, so those calls go to tilelang
 * (DSARL_CUDNN_PAGED_FORWARD=1 keeps them here, to measure). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "graph.h"
#include "tilelang.h"

// Builds every chunk's plan; fails (with cuDNN's reason in err) when the dims have no engine.
static int paged_plans(cudnn_dsa *c, const dsarl_dsa_batch *batch, const dsarl_dsa_attention_inputs *in,
                       int32_t topk, int64_t *max_workspace, dsarl_error *err)
{
    int64_t pages = next_pow2(batch->n_keys);
    *max_workspace = 0;
    for (int64_t chunk = next_pow2(batch->n_queries); chunk >= 1; chunk >>= 1) {
        if (!(batch->n_queries & chunk))
            continue;
        cdn_paged_shape shape = {.tokens = chunk, .heads = in->n_heads, .d_qk = in->d_qk, .d_v = in->d_v,
                                 .topk = topk, .pages = pages};
        cdn_plan *plan = NULL;
        DSARL_TRY(cdn_paged_plan(c, &shape, &plan, err));
        if (cdn_plan_workspace(plan) > *max_workspace)
            *max_workspace = cdn_plan_workspace(plan);
    }
    return DSARL_OK;
}

// Why the paged route cannot take these operands (NULL when it can): layout conditions, then cuDNN's own verdict
// (a plan per chunk size; a dims combination without an engine fails here with cuDNN's reason in err).
static int paged_usable(cudnn_dsa *c, const dsarl_dsa_batch *batch, const dsarl_dsa_attention_inputs *in,
                        const void *out, const float *lse, int32_t topk, int64_t *cudnn_ws, dsarl_error *err)
{
    if (c->f32)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "float32 storage (the cuDNN graph is bf16)");
    if (in->d_qk == 576 && in->d_v == 512 && tilelang_sparse_mla_sm90_head_groups(in->n_heads) && !c->paged_forced)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "GLM-5 dims with 64-head groups (a last group of 16 or more "
                          "padded): tilelang's wgmma kernel is the faster exact route (docs/performance.md; "
                          "runtime.cudnn_paged_forward=true measures the paged graph here)");
    // every chunk starts at an even token, so these keep each chunk's operands 16-byte aligned
    if (in->d_qk % 8 || in->d_v % 8 || in->n_heads % 4 || topk % 4 ||
        ((uintptr_t)in->q | (uintptr_t)in->kv | (uintptr_t)out | (uintptr_t)lse) % 16)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "the paged graph wants d_qk, d_v multiples of 8, n_heads and "
                          "topk multiples of 4 and 16-byte aligned operands (got d %d/%d, H %d, k %d)", in->d_qk,
                          in->d_v, in->n_heads, topk);
    return paged_plans(c, batch, in, topk, cudnn_ws, err);
}

static int paged_forward(cudnn_dsa *c, const dsarl_dsa_batch *batch, const dsarl_dsa_attention_inputs *in,
                         const int32_t *indices, int32_t topk, void *out, float *lse, int64_t cudnn_ws,
                         dsarl_error *err)
{
    const int64_t T = batch->n_queries, H = in->n_heads;
    size_t table_bytes = align256((size_t)T * (size_t)topk * 4), seq_bytes = align256((size_t)T * 4);
    // + an aligned slot for the last chunks' seq_len arrays (their offsets into the full arrays are not 16-aligned)
    size_t need = table_bytes + 2 * seq_bytes + 2 * 256 + align256((size_t)cudnn_ws);
    void *ws = NULL;
    DSARL_TRY(cdn_workspace(c, need, &ws, err));
    int32_t *table = ws, *seq_kv = (int32_t *)((char *)ws + table_bytes), *seq_q = seq_kv + seq_bytes / 4;
    int32_t *small = seq_q + seq_bytes / 4; // two 256-byte slots
    void *cudnn_workspace = (char *)ws + table_bytes + 2 * seq_bytes + 2 * 256;
    DSARL_TRY(cdn_compact_indices(c->stream, table, seq_kv, seq_q, indices, T, topk, (int32_t)H, err));
    float scale = in->softmax_scale;
    int64_t pages = next_pow2(batch->n_keys), t0 = 0;
    for (int64_t chunk = next_pow2(T); chunk >= 1; chunk >>= 1) {
        if (!(T & chunk))
            continue;
        cdn_paged_shape shape = {.tokens = chunk, .heads = H, .d_qk = in->d_qk, .d_v = in->d_v, .topk = topk,
                                 .pages = pages};
        cdn_plan *plan = NULL;
        DSARL_TRY(cdn_paged_plan(c, &shape, &plan, err));
        int32_t *chunk_kv = seq_kv + t0, *chunk_q = seq_q + t0;
        if (t0 % 4) { // 1 or 2 trailing tokens: copy their seq_len entries to aligned slots
            cudaStream_t st = (cudaStream_t)c->stream;
            cudaError_t rc = cudaMemcpyAsync(small, chunk_kv, (size_t)chunk * 4, cudaMemcpyDeviceToDevice, st);
            if (rc == cudaSuccess)
                rc = cudaMemcpyAsync(small + 64, chunk_q, (size_t)chunk * 4, cudaMemcpyDeviceToDevice, st);
            if (rc != cudaSuccess)
                return DSARL_FAIL(err, DSARL_E_DEVICE, "dsa cudnn sparse_mla_forward: staging seq lengths failed: %s",
                                  cudaGetErrorString(rc));
            chunk_kv = small, chunk_q = small + 64;
        }
        void *ptrs[CDN_N_UIDS] = {0};
        ptrs[CDN_Q] = (char *)in->q + t0 * H * in->d_qk * 2;
        ptrs[CDN_K] = (void *)in->kv, ptrs[CDN_V] = (void *)in->kv;
        ptrs[CDN_O] = (char *)out + t0 * H * in->d_v * 2;
        ptrs[CDN_STATS] = lse + t0 * H;
        ptrs[CDN_SCALE] = &scale;
        ptrs[CDN_PAGE_K] = table + t0 * topk, ptrs[CDN_PAGE_V] = table + t0 * topk;
        ptrs[CDN_SEQ_Q] = chunk_q, ptrs[CDN_SEQ_KV] = chunk_kv;
        for (int u = 0; u < CDN_N_UIDS; u++)
            if (ptrs[u] && u != CDN_SCALE && (uintptr_t)ptrs[u] % 16)
                return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "dsa cudnn sparse_mla_forward: operand %d of the chunk "
                                  "at token %lld is not 16-byte aligned", u, (long long)t0);
        DSARL_TRY(cdn_plan_execute(c, plan, ptrs, cudnn_workspace, err));
        t0 += chunk;
    }
    return cdn_fix_empty_rows(c->stream, out, lse, indices, T, topk, (int32_t)H, in->d_v, err);
}

int cdn_sparse_mla_forward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                           const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk, void *out,
                           float *lse, dsarl_error *err)
{
    cudnn_dsa *c = cdn_ctx(ctx);
    if (!c)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa cudnn sparse_mla_forward: the context is NULL");
    DSARL_TRY(cdn_check_batch("sparse_mla_forward", batch, err));
    DSARL_TRY(cdn_check_attention("sparse_mla_forward", in, err));
    if (!indices || topk <= 0 || !out || !lse)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa cudnn sparse_mla_forward: needs indices (Tq, topk > 0), out and "
                          "lse");
    if (batch->n_queries == 0)
        return DSARL_OK;
    if (batch->n_keys == 0) // nothing to attend: every row is empty
        return cdn_fix_empty_rows(c->stream, out, lse, indices, batch->n_queries, topk, in->n_heads, in->d_v, err);
    char dims[64];
    snprintf(dims, sizeof dims, "%d %d %d %d", in->n_heads, in->d_qk, in->d_v, topk);
    if (strcmp(dims, c->paged_refused) != 0) {
        dsarl_error why;
        dsarl_error_clear(&why);
        int64_t cudnn_ws = 0;
        if (paged_usable(c, batch, in, out, lse, topk, &cudnn_ws, &why) == 0)
            return paged_forward(c, batch, in, indices, topk, out, lse, cudnn_ws, err);
        snprintf(c->paged_refused, sizeof c->paged_refused, "%s", dims);
        dsarl_log(DSARL_LOG_INFO, "dsa cudnn: sparse_mla_forward (H=%d, d=%d/%d, k=%d) hands over to tilelang: %s",
                  in->n_heads, in->d_qk, in->d_v, topk, why.message);
        c->paged_handovers++;
    }
    return c->tl->sparse_mla_forward(c->tilelang, batch, in, indices, topk, out, lse, err);
}

int cdn_sparse_mla_backward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                            const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk,
                            const void *out, const float *lse, const void *dout, void *dq, void *dkv,
                            dsarl_error *err)
{
    cudnn_dsa *c = cdn_ctx(ctx);
    return c->tl->sparse_mla_backward(c->tilelang, batch, in, indices, topk, out, lse, dout, dq, dkv, err);
}

int cdn_indexer_topk(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, const dsarl_dsa_indexer_inputs *in,
                     int32_t topk, int32_t *indices, float *scores, dsarl_error *err)
{
    cudnn_dsa *c = cdn_ctx(ctx);
    return c->tl->indexer_topk(c->tilelang, batch, in, topk, indices, scores, err);
}

int cdn_indexer_loss_forward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                             const dsarl_dsa_attention_inputs *attn, const float *lse,
                             const dsarl_dsa_indexer_inputs *indexer, const int32_t *indices, int32_t topk,
                             float *loss, dsarl_error *err)
{
    cudnn_dsa *c = cdn_ctx(ctx);
    return c->tl->indexer_loss_forward(c->tilelang, batch, attn, lse, indexer, indices, topk, loss, err);
}

int cdn_indexer_loss_backward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                              const dsarl_dsa_attention_inputs *attn, const float *lse,
                              const dsarl_dsa_indexer_inputs *indexer, const int32_t *indices, int32_t topk,
                              const float *dloss, void *dq_index, void *dk_index, float *dweights, dsarl_error *err)
{
    cudnn_dsa *c = cdn_ctx(ctx);
    return c->tl->indexer_loss_backward(c->tilelang, batch, attn, lse, indexer, indices, topk, dloss, dq_index,
                                        dk_index, dweights, err);
}
