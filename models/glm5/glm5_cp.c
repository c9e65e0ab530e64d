/* glm5_cp.c: context parallelism of the glm5 training and prefill passes (docs/parallel.md).
 *
 * A rank computes everything token-wise (norms, projections, MLPs, experts, LM head) on its own rows only. Attention
 * and the lightning indexer need every earlier key of a query's sequence: the shared latent kv (T, d_qk) and the
 * indexer keys (T, index_head_dim) are all-gathered over cp and put in global order, so top-k indices, key ranges
 * and the ties of the top-k (to the lower index) are those of one process. The backward's key gradients are the
 * transpose: each rank's (T_keys, w) gradient is permuted to rank-major order and reduce-scattered, so every rank
 * gets the sum over all queries for its own keys. */
#include <stdlib.h>
#include <string.h>
#include "glm5_cp.h"

// Chunks of one sequence of n tokens per 2 cp: the padded length is 2 cp times it.
static int64_t chunk_of(int64_t n, int32_t cp)
{
    return (n + 2 * cp - 1) / (2 * cp);
}

int glm5_cp_prepare(glm5_pass *p, const dsarl_token_batch *b, const dsarl_token_batch **padded, dsarl_error *err)
{
    dsarl_model *m = p->m;
    int32_t cp = m->parallel.cp_size, me = m->parallel.cp_rank, tp = m->shards.tp_size, n = b->n_sequences;
    int64_t T = b->n_tokens;
    if (n < 1 || !b->cu_seqlens || !b->tokens || b->cu_seqlens[0] != 0 || b->cu_seqlens[n] != T)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: batch cu_seqlens must start at 0 and end at n_tokens (%lld)",
                          (long long)T);
    int64_t chunks = 0;
    for (int32_t s = 0; s < n; s++) {
        if (b->cu_seqlens[s + 1] < b->cu_seqlens[s])
            return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: batch cu_seqlens must be non-decreasing within [0, %lld] "
                              "(sequence %d)", (long long)T, s);
        chunks += chunk_of(b->cu_seqlens[s + 1] - b->cu_seqlens[s], cp);
    }
    // a rank holds 2 chunks per sequence; under sequence parallelism its rows must split over tp, else one more
    // segment of pad chunks (its own segment: no real token attends to it) makes them
    int64_t extra = 0;
    while ((2 * (chunks + extra)) % tp != 0)
        extra++;
    int32_t segs = n + (extra > 0);
    int64_t T_keys = 2 * cp * (chunks + extra), T_local = 2 * (chunks + extra);
    if (T_keys > INT32_MAX / 2)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: a batch of %lld tokens padded for context parallelism (cp %d) "
                          "is too long for int32 key positions", (long long)T, cp);
    glm5_cp *c;
    DSARL_TRY(glm5_pass_host_alloc(p, sizeof *c, (void **)&c, err));
    p->cp = c;
    c->size = cp, c->rank = me, c->T_caller = T, c->T_keys = T_keys, c->T_local = T_local;
    int32_t *cu, *tokens;
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(segs + 1) * sizeof(int32_t), (void **)&cu, err));
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)T_keys * sizeof(int32_t), (void **)&tokens, err)); // zeroed
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(4 * T_local + T_local) * sizeof(int32_t), (void **)&c->host, err));
    c->caller_row = c->host + 4 * T_local;
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(T > 0 ? T : 1) * sizeof(int32_t), (void **)&c->caller_slot, err));
    int32_t *maps;
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(2 * T_keys) * sizeof(int32_t), (void **)&maps, err));
    // the padded batch in global order: sequence s at cu[s], 2 cp chunk_of(len) long, its tokens then pads (id 0)
    for (int32_t s = 0; s < segs; s++) {
        int64_t len = s < n ? b->cu_seqlens[s + 1] - b->cu_seqlens[s] : 0;
        int64_t L = 2 * cp * (s < n ? chunk_of(len, cp) : extra);
        cu[s + 1] = (int32_t)(cu[s] + L);
        if (len > 0)
            memcpy(tokens + cu[s], b->tokens + b->cu_seqlens[s], (size_t)len * sizeof(int32_t));
        c->max_keys = L > c->max_keys ? (int32_t)L : c->max_keys;
    }
    // rank r's rows: per sequence its chunk r, then chunk 2 cp - 1 - r; maps between global and rank-major rows
    int32_t *to_global = maps, *to_rank_major = maps + T_keys;
    int32_t *tok = c->host, *pos = tok + T_local, *ks = tok + 2 * T_local, *ke = tok + 3 * T_local;
    for (int32_t r = 0; r < cp; r++) {
        int64_t i = 0;
        for (int32_t s = 0; s < segs; s++) {
            int64_t chunk = (cu[s + 1] - cu[s]) / (2 * cp), len = s < n ? b->cu_seqlens[s + 1] - b->cu_seqlens[s] : 0;
            for (int32_t half = 0; half < 2; half++) {
                int64_t first = cu[s] + (half == 0 ? r : 2 * cp - 1 - r) * chunk;
                for (int64_t g = first; g < first + chunk; g++, i++) {
                    int64_t row = r * T_local + i, offset = g - cu[s];
                    to_global[g] = (int32_t)row, to_rank_major[row] = (int32_t)g;
                    if (offset < len)
                        c->caller_slot[b->cu_seqlens[s] + offset] = (int32_t)row;
                    if (r != me)
                        continue;
                    tok[i] = tokens[g], pos[i] = (int32_t)offset, ks[i] = cu[s], ke[i] = (int32_t)g + 1;
                    c->caller_row[i] = offset < len ? (int32_t)(b->cu_seqlens[s] + offset) : -1;
                }
            }
        }
    }
    DSARL_TRY(glm5_pass_alloc(p, (size_t)(2 * T_keys) * sizeof(int32_t), (void **)&c->to_global, err));
    c->to_rank_major = c->to_global + T_keys;
    DSARL_TRY(m->dev_ops->copy(m->dev, c->to_global, maps, (size_t)(2 * T_keys) * sizeof(int32_t),
                               DSARL_COPY_HOST_TO_DEVICE, err));
    int64_t w = m->cfg.kv_lora_rank + m->cfg.qk_rope_head_dim;
    w = m->cfg.index_head_dim > w ? m->cfg.index_head_dim : w;
    DSARL_TRY(glm5_pass_alloc(p, (size_t)(T_keys * w) * m->elem, &c->stage, err));
    c->padded = *b;
    c->padded.struct_size = sizeof(c->padded) < b->struct_size ? sizeof(c->padded) : b->struct_size;
    c->padded.n_tokens = T_keys, c->padded.n_sequences = segs, c->padded.tokens = tokens, c->padded.cu_seqlens = cu;
    p->T = p->T_real = T_local;
    *padded = &c->padded;
    return DSARL_OK;
}

int glm5_cp_upload_batch(glm5_pass *p, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const glm5_cp *c = p->cp;
    DSARL_TRY(m->dev_ops->copy(m->dev, p->tokens, c->host, (size_t)(4 * c->T_local) * sizeof(int32_t),
                               DSARL_COPY_HOST_TO_DEVICE, err));
    p->batch = (dsarl_dsa_batch){.struct_size = sizeof(p->batch), .n_queries = c->T_local, .n_keys = c->T_keys,
                                 .key_start = p->key_start, .key_end = p->key_end, .max_keys_per_query = c->max_keys,
                                 .host_cu_seqlens = NULL, .n_segments = 0};
    return DSARL_OK;
}

int glm5_cp_gather_keys(glm5_pass *p, void *all, const void *local, int64_t width, dsarl_error *err)
{
    dsarl_model *m = p->m;
    glm5_cp *c = p->cp;
    DSARL_TRY(dsarl_device_all_gather(m->dev_ops, m->dev, m->parallel.cp, c->stage, local, c->T_local * width,
                                      m->storage, err));
    return m->dev_ops->gather_rows(m->dev, all, c->stage, c->to_global, c->T_keys, width, err);
}

int glm5_cp_scatter_keys(glm5_pass *p, void *local, const void *all, int64_t width, dsarl_error *err)
{
    dsarl_model *m = p->m;
    glm5_cp *c = p->cp;
    DSARL_TRY(m->dev_ops->gather_rows(m->dev, c->stage, all, c->to_rank_major, c->T_keys, width, err));
    return dsarl_device_reduce_scatter(m->dev_ops, m->dev, m->parallel.cp, local, c->stage, c->T_local * width,
                                       m->storage, DSARL_REDUCE_SUM, err);
}

int glm5_cp_local_targets(glm5_pass *p, const int32_t *targets, const int32_t **local, dsarl_error *err)
{
    const glm5_cp *c = p->cp;
    for (int64_t t = 0; t < c->T_caller; t++)
        if (targets[t] >= p->m->cfg.vocab_size)
            return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: target id %d at position %lld is outside the vocabulary "
                              "[0, %lld)", targets[t], (long long)t, (long long)p->m->cfg.vocab_size);
    int32_t *out;
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)c->T_local * sizeof(int32_t), (void **)&out, err));
    for (int64_t i = 0; i < c->T_local; i++)
        out[i] = c->caller_row[i] >= 0 ? targets[c->caller_row[i]] : -1;
    *local = out;
    return DSARL_OK;
}

int glm5_cp_local_values(glm5_pass *p, const float *caller, const float **local, dsarl_error *err)
{
    const glm5_cp *c = p->cp;
    float *out;
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)c->T_local * sizeof(float), (void **)&out, err));
    for (int64_t i = 0; i < c->T_local; i++)
        out[i] = c->caller_row[i] >= 0 ? caller[c->caller_row[i]] : 0.0f;
    *local = out;
    return DSARL_OK;
}

int glm5_cp_gather_rows(glm5_pass *p, float *caller, const float *local, int64_t width, dsarl_error *err)
{
    const glm5_cp *c = p->cp;
    float *all = malloc((size_t)(c->T_keys * width) * sizeof(float));
    if (!all)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of host memory gathering %lld rows over cp",
                          (long long)c->T_keys);
    int rc = dsarl_group_all_gather_host(p->m->parallel.cp, all, local, c->T_local * width, DSARL_DTYPE_F32, err);
    for (int64_t t = 0; rc == 0 && t < c->T_caller; t++)
        memcpy(caller + t * width, all + (int64_t)c->caller_slot[t] * width, (size_t)width * sizeof(float));
    free(all);
    return rc;
}

int glm5_cp_upload_real(glm5_pass *p, float *dst, float value, dsarl_error *err)
{
    const glm5_cp *c = p->cp;
    float *host;
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)c->T_local * sizeof(float), (void **)&host, err));
    for (int64_t i = 0; i < c->T_local; i++)
        host[i] = c->caller_row[i] >= 0 ? value : 0.0f;
    return p->m->dev_ops->copy(p->m->dev, dst, host, (size_t)c->T_local * sizeof(float), DSARL_COPY_HOST_TO_DEVICE,
                               err);
}

int glm5_cp_sum_indexer_losses(glm5_pass *p, const float *ilosses, double *loss, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const glm5_cp *c = p->cp;
    int64_t L = m->cfg.num_hidden_layers, T = c->T_local;
    float *host = malloc((size_t)(L * T) * sizeof(float));
    double *sums = calloc((size_t)L, sizeof(double));
    int rc = host && sums ? m->dev_ops->copy(m->dev, host, ilosses, (size_t)(L * T) * sizeof(float),
                                             DSARL_COPY_DEVICE_TO_HOST, err)
                          : DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory in the indexer loss");
    for (int64_t i = 0; rc == 0 && i < L; i++)
        for (int64_t t = 0; t < T; t++)
            sums[i] += c->caller_row[t] >= 0 ? host[i * T + t] : 0.0;
    if (rc == 0) // every cp rank's real rows: the sum over the caller's batch
        rc = dsarl_group_all_reduce_host(m->parallel.cp, sums, L, DSARL_DTYPE_F64, DSARL_REDUCE_SUM, err);
    for (int64_t i = L - 1; rc == 0 && i >= 0; i--) // last to first, as one process sums them
        if (m->layers[i].idx_wq_b)
            *loss += m->indexer_loss_coeff * sums[i] / (double)c->T_caller;
    free(host);
    free(sums);
    return rc;
}

int glm5_cp_headwise_keys(glm5_pass *p, glm5_layer_acts *a, const glm5_layer *L, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    glm5_cp *cp = p->cp;
    int64_t Tk = cp->T_keys, H = glm5_local_heads(m), nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    int64_t kvr = c->kv_lora_rank, v = c->v_head_dim, qk = c->qk_head_dim, dqk = kvr + rope;
    if (!cp->latent)
        DSARL_TRY(glm5_pass_alloc(p, (size_t)(Tk * kvr) * m->elem, &cp->latent, err));
    // kv_all = [rmsnorm(c_kv) | rope(k_rope)] per key: one GEMM for every head over the latents, (Tk, H, nope + v)
    DSARL_TRY(d->copy_2d(m->dev, cp->latent, kvr, a->kv_all, dqk, Tk, kvr, err));
    DSARL_TRY(glm5_linear(m, p->kv_heads, cp->latent, L->kv_b_proj, Tk, kvr, H * (nope + v), err));
    // rows (t, h) of Tk*H: the value, and the key [its nope part | the key's rope part, the same for every head]
    DSARL_TRY(d->copy_2d(m->dev, a->v_heads, v, glm5_at(m, p->kv_heads, nope), nope + v, Tk * H, v, err));
    DSARL_TRY(d->copy_2d(m->dev, a->k_heads, qk, p->kv_heads, nope + v, Tk * H, nope, err));
    for (int64_t h = 0; h < H; h++)
        DSARL_TRY(d->copy_2d(m->dev, glm5_at(m, a->k_heads, h * qk + nope), H * qk, glm5_at(m, a->kv_all, kvr), dqk,
                             Tk, rope, err));
    return DSARL_OK;
}

int glm5_cp_headwise_backward(glm5_pass *p, glm5_grad_bufs *g, const glm5_layer_acts *a, const glm5_layer *L,
                              dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    glm5_cp *cp = p->cp;
    int64_t Tk = cp->T_keys, H = glm5_local_heads(m), nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    int64_t kvr = c->kv_lora_rank, v = c->v_head_dim, qk = c->qk_head_dim, dqk = kvr + rope;
    // back to kv_b_proj's output layout (Tk, H, nope + v)
    DSARL_TRY(d->copy_2d(m->dev, g->dkv_heads, nope + v, g->dk_heads, qk, Tk * H, nope, err));
    DSARL_TRY(d->copy_2d(m->dev, glm5_at(m, g->dkv_heads, nope), nope + v, g->dv_heads, v, Tk * H, v, err));
    // kv_b_proj over every key (this rank's queries' share; dp_cp sums the shares), then the latents' gradient in
    // the latents' room (the forward's scratch: later layers overwrote it, so it is rebuilt first)
    DSARL_TRY(d->copy_2d(m->dev, cp->latent, kvr, a->kv_all, dqk, Tk, kvr, err));
    DSARL_TRY(glm5_linear_dweight(m, L->kv_b_proj, g->dkv_heads, cp->latent, Tk, kvr, H * (nope + v), err));
    DSARL_TRY(glm5_linear_dinput(m, cp->latent, g->dkv_heads, L->kv_b_proj, Tk, kvr, H * (nope + v), 0.0f, err));
    // the shared rope key: per key, ones (1,H) x dk (H,qk), the head sum accumulated in float32 by the GEMM
    DSARL_TRY(d->gemm_strided_batched(m->dev, false, false, 1, qk, H, 1.0f, g->ones, H, g->dk_heads, H * qk, 0.0f,
                                      g->dk_sum, qk, Tk, err));
    // [d latent | d rope key] of every key, summed over cp into their owners' rows
    DSARL_TRY(d->copy_2d(m->dev, g->dkv_all, dqk, cp->latent, kvr, Tk, kvr, err));
    DSARL_TRY(d->copy_2d(m->dev, glm5_at(m, g->dkv_all, kvr), dqk, glm5_at(m, g->dk_sum, nope), qk, Tk, rope, err));
    DSARL_TRY(glm5_cp_scatter_keys(p, g->dkv, g->dkv_all, dqk, err));
    return d->copy_2d(m->dev, g->dlatn, kvr, g->dkv, dqk, p->T, kvr, err);
}
