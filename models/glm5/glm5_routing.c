/* glm5_routing.c: routing replay (dsarl_token_batch.replay_experts / replay_indices). A cached pass records, per
 * new token, the experts each MoE layer routed it to and the keys each full-indexer layer selected for it; a
 * training pass given those rows uses them instead of its own top-k, so the trainer's experts and attended keys are
 * the engine's even where the two round differently.
 *
 * Experts: the discrete choice is replayed, the routing weights are not: they are recomputed from this pass's own
 * router scores at the replayed experts (sigmoid, norm_topk_prob, routed_scaling_factor), so the router's gradient
 * flows through them as Megatron's routing replay does. Keys: the indexer still scores every key (its KL loss is
 * computed as usual); only the set the attention reads is replaced.
 *
 * Both run on the host: one download of the layer's choice (the MoE grouping downloads it anyway) and, when a row
 * is replayed, one download of the scores and one upload. Positions are relative to the token's sequence, so rows
 * recorded in a paged or contiguous cache replay in a packed training batch.
 *
 * The rows cover the trunk's layers only (glm5_routing_shape). The MTP depths (glm5_mtp.c) are never recorded nor
 * replayed: no cached pass runs them (the engine decodes with the trunk alone), so there is no engine choice to
 * agree with, and their input at position i (h_i with the embedding of t_{i+k}) is the training pass's own. A
 * depth routes and selects keys by its own scores in every pass, and its forward and backward share that choice
 * through its activations. */
#include <stdlib.h>
#include <string.h>
#include "glm5_pass.h"

/* The caller's row of the MoE's local row 0: under sequence parallelism a training pass's MoE routes the rows
 * tp_rank x T_sp .. of the padded batch (p->T is T_sp around the call), otherwise every row from 0. */
static int64_t expert_row_base(const glm5_pass *p)
{
    return p->sp ? (int64_t)p->m->shards.tp_rank * p->T_sp : 0;
}

/* How many of the MoE's p->T local rows from base are the caller's (the rest pad the batch to a multiple of tp). */
static int64_t expert_rows(const glm5_pass *p, int64_t base)
{
    const int64_t left = p->T_real - base;
    return left < 0 ? 0 : left < p->T ? left : p->T;
}

// Whether layer is an MTP depth (after the trunk's layers): its routing has no row (see above).
static bool mtp_depth(const dsarl_model *m, int32_t layer)
{
    return layer >= m->cfg.num_hidden_layers;
}

// Ordinal of trunk layer among the layers with flag set (mlp_sparse or indexer_full), in model order.
static int32_t ordinal(const unsigned char *flags, int32_t layer)
{
    int32_t n = 0;
    for (int32_t i = 0; i < layer; i++)
        n += flags[i] != 0;
    return n;
}

int glm5_routing_shape(const dsarl_model *m, dsarl_routing_shape *out, dsarl_error *err)
{
    if (!out || out->struct_size < sizeof(*out))
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: routing_shape needs a dsarl_routing_shape with struct_size "
                          ">= %zu", sizeof(*out));
    const glm5_config *c = &m->cfg;
    int32_t L = c->num_hidden_layers;
    out->moe_layers = ordinal(c->mlp_sparse, L);
    out->experts_per_token = out->moe_layers ? c->num_experts_per_tok : 0;
    out->index_layers = ordinal(c->indexer_full, L);
    out->index_topk = out->index_layers ? c->index_topk : 0;
    return DSARL_OK;
}

int glm5_routing_prepare(glm5_pass *p, const dsarl_token_batch *b, const int32_t *key_first, dsarl_error *err)
{
    dsarl_model *m = p->m;
    p->routing = dsarl_token_batch_routing(b);
    const dsarl_batch_routing *r = &p->routing;
    if (!r->replay_experts && !r->replay_indices && !r->record_experts && !r->record_indices)
        return DSARL_OK;
    // cp (chunked sequences) moves tokens away from the caller's rows. tp keeps them: a cached pass runs every
    // row on every rank, and a training pass's MoE routes this rank's sequence-parallel block of them (the rows
    // from tp_rank x T_sp, glm5_routing_experts) while its indexer selects for every row
    if (m->parallel.cp_size > 1)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "glm5: routing replay runs with context_parallel_size 1 only; this "
                          "layout has cp %d", m->parallel.cp_size);
    if (m->stage.size > 1 && (r->record_experts || r->record_indices)) {
        // each stage records its own layers' columns; glm5_routing_share_stages merges them after the pass (an
        // element-wise max over the stages: the owner's id or position >= 0, -1 in every other stage's copy)
        dsarl_routing_shape sh = {.struct_size = sizeof(sh)};
        DSARL_TRY(glm5_routing_shape(m, &sh, err));
        const int64_t we = (int64_t)sh.moe_layers * sh.experts_per_token, wi = (int64_t)sh.index_layers * sh.index_topk;
        if (r->record_experts)
            memset(r->record_experts, 0xff, (size_t)(p->T_real * we) * sizeof(int32_t));
        if (r->record_indices)
            memset(r->record_indices, 0xff, (size_t)(p->T_real * wi) * sizeof(int32_t));
    }
    if ((r->replay_indices || r->record_indices) && m->dense_attention)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "glm5: DSA index replay needs sparse attention; dense attention "
                          "(the DSA warm-up) selects every key, so there is nothing to replay: turn index replay off");
    int32_t *first;
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(p->T > 0 ? p->T : 1) * sizeof(int32_t), (void **)&first, err));
    if (key_first)
        memcpy(first, key_first, (size_t)p->T * sizeof(int32_t));
    else // a packed training batch: a token's keys start at its sequence's first token
        for (int32_t s = 0; s < b->n_sequences; s++)
            for (int32_t t = b->cu_seqlens[s]; t < b->cu_seqlens[s + 1]; t++)
                first[t] = b->cu_seqlens[s];
    p->routing_key_first = first;
    return DSARL_OK;
}

bool glm5_routing_experts_on_host(const glm5_pass *p, int32_t layer)
{
    const dsarl_batch_routing *r = &p->routing;
    if (mtp_depth(p->m, layer)) // as glm5_routing_experts: an MTP depth has no row
        return false;
    if (r->record_experts)
        return true;
    if (!r->replay_experts)
        return false;
    const glm5_config *c = &p->m->cfg;
    int64_t K = c->num_experts_per_tok, ord = ordinal(c->mlp_sparse, layer);
    int64_t stride = (int64_t)ordinal(c->mlp_sparse, c->num_hidden_layers) * K; // glm5_routing_shape's moe_layers
    const int64_t base = expert_row_base(p), rows = expert_rows(p, base);
    for (int64_t t = 0; t < rows; t++)
        if (r->replay_experts[(base + t) * stride + ord * K] >= 0) // a recorded row: glm5_routing_experts replays it
            return true;
    return false;
}

int glm5_routing_experts(glm5_pass *p, glm5_layer_acts *a, int32_t layer, int32_t *idx, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const glm5_config *c = &m->cfg;
    const dsarl_batch_routing *r = &p->routing;
    if (mtp_depth(m, layer))
        return DSARL_OK;
    int64_t T = p->T, E = c->n_routed_experts, K = c->num_experts_per_tok;
    dsarl_routing_shape sh = {.struct_size = sizeof(sh)};
    DSARL_TRY(glm5_routing_shape(m, &sh, err));
    int64_t ord = ordinal(c->mlp_sparse, layer), stride = (int64_t)sh.moe_layers * K;
    const int64_t base = expert_row_base(p), rows = expert_rows(p, base); // local row t is the caller's base + t
    bool replayed = false;
    for (int64_t t = 0; r->replay_experts && t < rows; t++) {
        const int32_t *row = r->replay_experts + (base + t) * stride + ord * K;
        if (row[0] < 0)
            continue; // not recorded: the token keeps its own choice
        for (int64_t k = 0; k < K; k++) {
            if (row[k] < 0 || row[k] >= E)
                return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: replay_experts of token %lld, layer %d, slot %lld "
                                  "is %d; valid experts are [0, %lld)", (long long)t, layer, (long long)k, row[k],
                                  (long long)E);
            for (int64_t j = 0; j < k; j++)
                if (row[j] == row[k])
                    return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: replay_experts of token %lld, layer %d names "
                                      "expert %d twice; a token routes to distinct experts", (long long)t, layer,
                                      row[k]);
        }
        memcpy(idx + t * K, row, (size_t)K * sizeof(int32_t));
        replayed = true;
    }
    if (replayed) { // weights from this pass's scores at the replayed experts (cpu_moe_route_forward's formula)
        const dsarl_device_ops *d = m->dev_ops;
        float *probs, *w;
        DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(T * E) * sizeof(float), (void **)&probs, err));
        DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(T * K) * sizeof(float), (void **)&w, err));
        DSARL_TRY(d->copy(m->dev, probs, a->router_probs, (size_t)(T * E) * sizeof(float), DSARL_COPY_DEVICE_TO_HOST,
                          err));
        for (int64_t t = 0; t < T; t++) {
            float sum = 0.0f;
            for (int64_t k = 0; k < K; k++)
                sum += (w[t * K + k] = probs[t * E + idx[t * K + k]]);
            for (int64_t k = 0; k < K; k++)
                w[t * K + k] = (c->norm_topk_prob ? w[t * K + k] / (sum + 1e-20f) : w[t * K + k]) *
                               (float)c->routed_scaling_factor;
        }
        DSARL_TRY(d->copy(m->dev, a->route_idx, idx, (size_t)(T * K) * sizeof(int32_t), DSARL_COPY_HOST_TO_DEVICE,
                          err));
        DSARL_TRY(d->copy(m->dev, a->route_w, w, (size_t)(T * K) * sizeof(float), DSARL_COPY_HOST_TO_DEVICE, err));
    }
    for (int64_t t = 0; r->record_experts && t < rows; t++) // a cached pass: every row, base 0
        memcpy(r->record_experts + (base + t) * stride + ord * K, idx + t * K, (size_t)K * sizeof(int32_t));
    return DSARL_OK;
}

int glm5_routing_share_stages(glm5_pass *p, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_batch_routing *r = &p->routing;
    if (m->stage.size <= 1 || (!r->record_experts && !r->record_indices))
        return DSARL_OK;
    dsarl_routing_shape sh = {.struct_size = sizeof(sh)};
    DSARL_TRY(glm5_routing_shape(m, &sh, err));
    const int64_t we = (int64_t)sh.moe_layers * sh.experts_per_token, wi = (int64_t)sh.index_layers * sh.index_topk;
    if (r->record_experts)
        DSARL_TRY(glm5_stage_max_i32(m, r->record_experts, p->T_real * we, err));
    if (r->record_indices)
        DSARL_TRY(glm5_stage_max_i32(m, r->record_indices, p->T_real * wi, err));
    return DSARL_OK;
}

int glm5_routing_indices(glm5_pass *p, glm5_layer_acts *a, int32_t layer, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const dsarl_batch_routing *r = &p->routing;
    if ((!r->replay_indices && !r->record_indices) || mtp_depth(m, layer))
        return DSARL_OK;
    int64_t T = p->T, W = p->topk_width, ord = ordinal(m->cfg.indexer_full, layer);
    dsarl_routing_shape sh = {.struct_size = sizeof(sh)};
    DSARL_TRY(glm5_routing_shape(m, &sh, err));
    int64_t stride = (int64_t)sh.index_layers * W;
    int32_t *topk;
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(T * W) * sizeof(int32_t), (void **)&topk, err));
    DSARL_TRY(d->copy(m->dev, topk, a->topk, (size_t)(T * W) * sizeof(int32_t), DSARL_COPY_DEVICE_TO_HOST, err));
    const int32_t *first = p->routing_key_first;
    const int64_t rows = p->T_real < T ? p->T_real : T; // the caller's rows (tp padding after them)
    bool replayed = false;
    for (int64_t t = 0; r->replay_indices && t < rows; t++) {
        const int32_t *row = r->replay_indices + t * stride + ord * W;
        if (row[0] < 0)
            continue;
        int32_t limit = p->cache ? -1 : (int32_t)(t - first[t]); // training: causal, its own position at most
        for (int64_t j = 0; j < W; j++) {
            if (row[j] >= 0 && limit >= 0 && row[j] > limit)
                return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: replay_indices of token %lld, layer %d, slot %lld "
                                  "is position %d; the token sits at position %d of its sequence and attends to "
                                  "positions [0, %d] only", (long long)t, layer, (long long)j, row[j], limit, limit);
            topk[t * W + j] = row[j] < 0 ? -1 : first[t] + row[j];
        }
        replayed = true;
    }
    if (replayed)
        DSARL_TRY(d->copy(m->dev, a->topk, topk, (size_t)(T * W) * sizeof(int32_t), DSARL_COPY_HOST_TO_DEVICE, err));
    // recorded in the order the attention reads them: a replay then sums the keys in the engine's order, and in
    // bf16 a softmax over the same keys in another order rounds differently
    for (int64_t t = 0; r->record_indices && t < rows; t++) {
        int32_t *out = r->record_indices + t * stride + ord * W, n = 0;
        for (int64_t j = 0; j < W; j++)
            if (topk[t * W + j] >= 0)
                out[n++] = topk[t * W + j] - first[t];
        for (int64_t j = n; j < W; j++)
            out[j] = -1;
    }
    return DSARL_OK;
}
