/* glm5_forward.c: the glm_moe_dsa forward pass on a packed THD batch, composed from device and DSA ops.
 *
 * Attention runs in the absorbed MQA form: per head, q_nope is multiplied into the latent space by W_UK (the
 * first qk_nope rows of that head in kv_b_proj), so every head attends over one shared key/value latent
 * kv = [rmsnorm(c_kv) | rope(k_rope)] (d_qk = kv_lora + rope, d_v = kv_lora); the latent output is brought back
 * to v_head_dim by W_UV. This equals transformers' expanded form up to float rounding. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "glm5_model.h"

#define GLM5_MAX_BUFFERS 64

// Per-call device buffers, freed together.
typedef struct workspace {
    dsarl_model *m;
    void *bufs[GLM5_MAX_BUFFERS];
    int n;
} workspace;

static int ws_alloc(workspace *ws, size_t bytes, void **out, dsarl_error *err)
{
    if (ws->n == GLM5_MAX_BUFFERS)
        return DSARL_FAIL(err, DSARL_E_INTERNAL, "glm5: forward workspace has more than %d buffers",
                          GLM5_MAX_BUFFERS);
    DSARL_TRY(ws->m->dev_ops->alloc(ws->m->dev, bytes ? bytes : 1, out, err));
    ws->bufs[ws->n++] = *out;
    return DSARL_OK;
}

static void ws_free(workspace *ws)
{
    for (int i = 0; i < ws->n; i++)
        ws->m->dev_ops->free(ws->m->dev, ws->bufs[i]);
    ws->n = 0;
}

// Activation buffers of one forward call, sized for T tokens.
typedef struct acts {
    void *x, *h, *attn_out, *mlp_out;          // (T,C)
    float *rstd, *mean;                        // (T)
    void *qa, *q_resid;                        // (T, q_lora)
    void *q;                                   // (T, H*qk_head_dim)
    void *ckv;                                 // (T, kv_lora + rope)
    void *latent, *latent_norm;                // (T, kv_lora)
    void *kv;                                  // (T, d_qk)
    void *q_abs;                               // (T, H, d_qk)
    void *head_in, *head_out;                  // (T, max(nope, kv_lora, v)) per-head staging
    void *out_latent;                          // (T, H, kv_lora)
    float *lse;                                // (T, H)
    void *attn;                                // (T, H*v)
    void *iq;                                  // (T, nI*dI)
    void *ik, *ik_raw;                          // (T, dI)
    void *iw;                                  // (T, nI) raw head weights
    float *iw_scaled;                          // (T, nI)
    int32_t *topk;                             // (T, index_topk)
    void *gate_up;                             // (max(T, T*top_k), 2*max inner)
    void *act;                                 // (max(T, T*top_k), max inner)
    void *expert_in, *expert_out;              // (T*top_k, C)
    float *router_logits, *router_probs;       // (T, E)
    int32_t *route_idx;                        // (T, top_k)
    float *route_w;                            // (T, top_k)
    int32_t *rows;                             // (T*top_k) tokens grouped by expert
    float *row_scale;                          // (T*top_k)
    int32_t *tokens, *positions, *key_start, *key_end; // (T)
} acts;

static int64_t max3(int64_t a, int64_t b, int64_t c)
{
    int64_t m = a > b ? a : b;
    return m > c ? m : c;
}

static int alloc_acts(workspace *ws, const glm5_config *c, int64_t T, acts *a, dsarl_error *err)
{
    size_t e = ws->m->elem, f = sizeof(float), i4 = sizeof(int32_t);
    int64_t H = c->num_attention_heads, C = c->hidden_size, dqk = c->kv_lora_rank + c->qk_rope_head_dim;
    int64_t K = c->num_experts_per_tok, E = c->n_routed_experts;
    int64_t inner = max3(c->intermediate_size, c->moe_intermediate_size * c->n_shared_experts,
                         c->moe_intermediate_size);
    int64_t rows = T * K > T ? T * K : T;
    struct { void **p; size_t bytes; } plan[] = {
        {&a->x, T * C * e}, {&a->h, T * C * e}, {&a->attn_out, T * C * e}, {&a->mlp_out, T * C * e},
        {(void **)&a->rstd, T * f}, {(void **)&a->mean, T * f},
        {&a->qa, T * c->q_lora_rank * e}, {&a->q_resid, T * c->q_lora_rank * e},
        {&a->q, T * H * c->qk_head_dim * e}, {&a->ckv, T * dqk * e},
        {&a->latent, T * c->kv_lora_rank * e}, {&a->latent_norm, T * c->kv_lora_rank * e}, {&a->kv, T * dqk * e},
        {&a->q_abs, T * H * dqk * e},
        {&a->head_in, T * max3(c->qk_nope_head_dim, c->kv_lora_rank, c->v_head_dim) * e},
        {&a->head_out, T * max3(c->qk_nope_head_dim, c->kv_lora_rank, c->v_head_dim) * e},
        {&a->out_latent, T * H * c->kv_lora_rank * e}, {(void **)&a->lse, T * H * f},
        {&a->attn, T * H * c->v_head_dim * e},
        {&a->iq, T * (int64_t)c->index_n_heads * c->index_head_dim * e}, {&a->ik, T * c->index_head_dim * e}, {&a->ik_raw, T * c->index_head_dim * e},
        {&a->iw, T * c->index_n_heads * e}, {(void **)&a->iw_scaled, T * c->index_n_heads * f},
        {(void **)&a->topk, T * (int64_t)c->index_topk * i4},
        {&a->gate_up, rows * 2 * inner * e}, {&a->act, rows * inner * e},
        {&a->expert_in, rows * C * e}, {&a->expert_out, rows * C * e},
        {(void **)&a->router_logits, T * E * f}, {(void **)&a->router_probs, T * E * f},
        {(void **)&a->route_idx, T * K * i4}, {(void **)&a->route_w, T * K * f},
        {(void **)&a->rows, rows * i4}, {(void **)&a->row_scale, rows * f},
        {(void **)&a->tokens, T * i4}, {(void **)&a->positions, T * i4}, {(void **)&a->key_start, T * i4},
        {(void **)&a->key_end, T * i4},
    };
    for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++)
        DSARL_TRY(ws_alloc(ws, plan[i].bytes, plan[i].p, err));
    return DSARL_OK;
}

// y (T,out) = x (T,in) W^T with W (out,in), as nn.Linear.
static int linear(dsarl_model *m, void *y, const void *x, const void *w, int64_t T, int64_t in, int64_t out,
                  dsarl_error *err)
{
    return m->dev_ops->gemm(m->dev, false, true, T, out, in, 1.0f, x, w, 0.0f, y, err);
}

// SwiGLU MLP on rows (n, C): gate_up (2*inner, C) rows [gate | up], down (C, inner).
static int swiglu_mlp(dsarl_model *m, acts *a, void *y, const void *x, const void *gate_up, const void *down,
                      int64_t n, int64_t inner, dsarl_error *err)
{
    const dsarl_device_ops *d = m->dev_ops;
    int64_t C = m->cfg.hidden_size;
    DSARL_TRY(linear(m, a->gate_up, x, gate_up, n, C, 2 * inner, err));
    DSARL_TRY(d->swiglu_forward(m->dev, a->act, a->gate_up, n, inner, err));
    return linear(m, y, a->act, down, n, inner, C, err);
}

static int moe_forward(dsarl_model *m, acts *a, const glm5_layer *L, int64_t T, dsarl_error *err)
{
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t C = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size;
    // router in float32: on float32 devices the storage GEMM is already fp32 (transformers routes in fp32)
    DSARL_TRY(linear(m, a->router_logits, a->h, L->router, T, C, E, err));
    DSARL_TRY(d->moe_route_forward(m->dev, a->route_idx, a->route_w, a->router_probs, a->router_logits,
                                   L->router_bias, T, E, (int32_t)K, c->n_group, c->topk_group, c->norm_topk_prob,
                                   (float)c->routed_scaling_factor, err));
    // group (token, slot) pairs by expert on the host: the counts decide the GEMM shapes
    int32_t *idx = malloc((size_t)(T * K) * sizeof(int32_t));
    float *w = malloc((size_t)(T * K) * sizeof(float));
    int32_t *rows = malloc((size_t)(T * K) * sizeof(int32_t));
    float *scale = malloc((size_t)(T * K) * sizeof(float));
    int64_t *count = calloc((size_t)E + 1, sizeof(int64_t));
    int rc = (!idx || !w || !rows || !scale || !count)
                 ? DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory routing %lld tokens", (long long)T)
                 : DSARL_OK;
    if (rc == 0)
        rc = d->copy(m->dev, idx, a->route_idx, (size_t)(T * K) * sizeof(int32_t), DSARL_COPY_DEVICE_TO_HOST, err);
    if (rc == 0)
        rc = d->copy(m->dev, w, a->route_w, (size_t)(T * K) * sizeof(float), DSARL_COPY_DEVICE_TO_HOST, err);
    if (rc == 0) {
        for (int64_t i = 0; i < T * K; i++)
            count[idx[i] + 1]++;
        for (int64_t e = 0; e < E; e++)
            count[e + 1] += count[e]; // count[e] = first row of expert e
        int64_t *fill = malloc((size_t)E * sizeof(int64_t));
        if (!fill)
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory routing");
        else {
            memcpy(fill, count, (size_t)E * sizeof(int64_t));
            for (int64_t t = 0; t < T; t++)
                for (int64_t k = 0; k < K; k++) {
                    int64_t r = fill[idx[t * K + k]]++;
                    rows[r] = (int32_t)t;
                    scale[r] = w[t * K + k];
                }
            free(fill);
        }
    }
    if (rc == 0)
        rc = d->copy(m->dev, a->rows, rows, (size_t)(T * K) * sizeof(int32_t), DSARL_COPY_HOST_TO_DEVICE, err);
    if (rc == 0)
        rc = d->copy(m->dev, a->row_scale, scale, (size_t)(T * K) * sizeof(float), DSARL_COPY_HOST_TO_DEVICE, err);
    if (rc == 0)
        rc = d->gather_rows(m->dev, a->expert_in, a->h, a->rows, T * K, C, err);
    for (int64_t e = 0; e < E && rc == 0; e++) {
        int64_t first = count[e], n = count[e + 1] - count[e];
        if (n == 0)
            continue;
        rc = linear(m, glm5_at(m, a->gate_up, first * 2 * I), glm5_at(m, a->expert_in, first * C),
                    glm5_at(m, L->experts_gate_up, e * 2 * I * C), n, C, 2 * I, err);
    }
    if (rc == 0)
        rc = d->swiglu_forward(m->dev, a->act, a->gate_up, T * K, I, err);
    for (int64_t e = 0; e < E && rc == 0; e++) {
        int64_t first = count[e], n = count[e + 1] - count[e];
        if (n == 0)
            continue;
        rc = linear(m, glm5_at(m, a->expert_out, first * C), glm5_at(m, a->act, first * I),
                    glm5_at(m, L->experts_down, e * C * I), n, I, C, err);
    }
    if (rc == 0)
        rc = d->zero(m->dev, a->mlp_out, (size_t)(T * C) * m->elem, err);
    if (rc == 0)
        rc = d->scatter_add_rows(m->dev, a->mlp_out, a->expert_out, a->rows, a->row_scale, T * K, C, err);
    free(idx), free(w), free(rows), free(scale), free(count);
    DSARL_TRY(rc);
    if (L->mlp_gate_up) { // shared experts see the same normed input and add to the routed sum
        DSARL_TRY(swiglu_mlp(m, a, a->attn_out, a->h, L->mlp_gate_up, L->mlp_down, T, L->mlp_inner, err));
        DSARL_TRY(d->add(m->dev, a->mlp_out, a->mlp_out, a->attn_out, T * C, err));
    }
    return DSARL_OK;
}

static int attention_forward(dsarl_model *m, acts *a, const glm5_layer *L, const dsarl_dsa_batch *batch,
                             int64_t T, int first_layer, dsarl_error *err)
{
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t C = c->hidden_size, H = c->num_attention_heads, nope = c->qk_nope_head_dim;
    int64_t rope = c->qk_rope_head_dim, qk = c->qk_head_dim, kvr = c->kv_lora_rank, v = c->v_head_dim;
    int64_t dqk = kvr + rope, qr = c->q_lora_rank;
    float rs = (float)m->cfg.attention_scaling;

    // queries: q_resid = rmsnorm(q_a_proj h) (also the indexer's input), q = q_b_proj q_resid, per head [nope|rope]
    DSARL_TRY(linear(m, a->qa, a->h, L->q_a_proj, T, C, qr, err));
    DSARL_TRY(d->rmsnorm_forward(m->dev, a->q_resid, a->rstd, a->qa, L->q_a_norm, T, qr, 1e-6f, err));
    DSARL_TRY(linear(m, a->q, a->q_resid, L->q_b_proj, T, qr, H * qk, err));
    DSARL_TRY(d->rope_forward(m->dev, glm5_at(m, a->q, nope), glm5_at(m, a->q, nope), a->positions, m->inv_freq, rs,
                              T, H, H * qk, qk, rope, err));
    // shared latent: kv = [rmsnorm(c_kv) | rope(k_rope)]
    DSARL_TRY(linear(m, a->ckv, a->h, L->kv_a_proj, T, C, dqk, err));
    DSARL_TRY(d->copy_2d(m->dev, a->latent, kvr, a->ckv, dqk, T, kvr, err));
    DSARL_TRY(d->rmsnorm_forward(m->dev, a->latent_norm, a->rstd, a->latent, L->kv_a_norm, T, kvr, 1e-6f, err));
    DSARL_TRY(d->rope_forward(m->dev, glm5_at(m, a->ckv, kvr), glm5_at(m, a->ckv, kvr), a->positions, m->inv_freq,
                              rs, T, 1, dqk, 0, rope, err));
    DSARL_TRY(d->copy_2d(m->dev, a->kv, dqk, a->latent_norm, kvr, T, kvr, err));
    DSARL_TRY(d->copy_2d(m->dev, glm5_at(m, a->kv, kvr), dqk, glm5_at(m, a->ckv, kvr), dqk, T, rope, err));
    // absorbed queries: q_abs[:, h] = [q_nope_h W_UK_h | q_rope_h]
    for (int64_t h = 0; h < H; h++) {
        const void *w_uk = glm5_at(m, L->kv_b_proj, h * (nope + v) * kvr); // (nope, kv_lora)
        DSARL_TRY(d->copy_2d(m->dev, a->head_in, nope, glm5_at(m, a->q, h * qk), H * qk, T, nope, err));
        DSARL_TRY(d->gemm(m->dev, false, false, T, kvr, nope, 1.0f, a->head_in, w_uk, 0.0f, a->head_out, err));
        DSARL_TRY(d->copy_2d(m->dev, glm5_at(m, a->q_abs, h * dqk), H * dqk, a->head_out, kvr, T, kvr, err));
        DSARL_TRY(d->copy_2d(m->dev, glm5_at(m, a->q_abs, h * dqk + kvr), H * dqk, glm5_at(m, a->q, h * qk + nope),
                             H * qk, T, rope, err));
    }
    // lightning indexer on full layers; shared layers reuse the previous full layer's top-k
    if (L->idx_wq_b) {
        int64_t nI = c->index_n_heads, dI = c->index_head_dim;
        DSARL_TRY(linear(m, a->iq, a->q_resid, L->idx_wq_b, T, qr, nI * dI, err));
        DSARL_TRY(linear(m, a->ik_raw, a->h, L->idx_wk, T, C, dI, err));
        DSARL_TRY(d->layernorm_forward(m->dev, a->ik, a->mean, a->rstd, a->ik_raw, L->idx_k_norm_w, L->idx_k_norm_b, T,
                                       dI, 1e-6f, err));
        DSARL_TRY(d->rope_forward(m->dev, a->iq, a->iq, a->positions, m->inv_freq, rs, T, nI, nI * dI, dI, rope,
                                  err));
        DSARL_TRY(d->rope_forward(m->dev, a->ik, a->ik, a->positions, m->inv_freq, rs, T, 1, dI, 0, rope, err));
        DSARL_TRY(linear(m, a->iw, a->h, L->idx_weights_proj, T, C, nI, err));
        // both scales folded into the head weights: n_heads^-1/2 * head_dim^-1/2
        DSARL_TRY(d->zero(m->dev, a->iw_scaled, (size_t)(T * nI) * sizeof(float), err));
        DSARL_TRY(d->axpy(m->dev, T * nI, (float)(1.0 / sqrt((double)nI) / sqrt((double)dI)), a->iw, a->iw_scaled,
                          err));
        dsarl_dsa_indexer_inputs in = {.struct_size = sizeof(in), .q = a->iq, .k = a->ik, .weights = a->iw_scaled,
                                       .n_heads = (int32_t)nI, .head_dim = (int32_t)dI};
        DSARL_TRY(m->dsa_ops->indexer_topk(m->dsa, batch, &in, c->index_topk, a->topk, NULL, err));
    } else if (first_layer) {
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: layer 0 is a shared indexer layer with no earlier top-k");
    }
    dsarl_dsa_attention_inputs at = {.struct_size = sizeof(at), .q = a->q_abs, .kv = a->kv, .n_heads = (int32_t)H,
                                     .d_qk = (int32_t)dqk, .d_v = (int32_t)kvr,
                                     .softmax_scale = (float)c->softmax_scale};
    DSARL_TRY(m->dsa_ops->sparse_mla_forward(m->dsa, batch, &at, a->topk, c->index_topk, a->out_latent, a->lse, err));
    // back from the latent: attn[:, h] = out_latent_h W_UV_h^T
    for (int64_t h = 0; h < H; h++) {
        const void *w_uv = glm5_at(m, L->kv_b_proj, (h * (nope + v) + nope) * kvr); // (v, kv_lora)
        DSARL_TRY(d->copy_2d(m->dev, a->head_in, kvr, glm5_at(m, a->out_latent, h * kvr), H * kvr, T, kvr, err));
        DSARL_TRY(d->gemm(m->dev, false, true, T, v, kvr, 1.0f, a->head_in, w_uv, 0.0f, a->head_out, err));
        DSARL_TRY(d->copy_2d(m->dev, glm5_at(m, a->attn, h * v), H * v, a->head_out, v, T, v, err));
    }
    return linear(m, a->attn_out, a->attn, L->o_proj, T, H * v, C, err);
}

// Uploads token ids, positions within each sequence and the causal key ranges of the packed batch.
static int upload_batch(dsarl_model *m, acts *a, const dsarl_token_batch *b, dsarl_dsa_batch *db, dsarl_error *err)
{
    int64_t T = b->n_tokens;
    if (b->n_sequences < 1 || !b->cu_seqlens || b->cu_seqlens[0] != 0 || b->cu_seqlens[b->n_sequences] != T)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: batch cu_seqlens must start at 0 and end at n_tokens (%lld)",
                          (long long)T);
    int32_t *host = malloc((size_t)(3 * T) * sizeof(int32_t));
    if (!host)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory for the batch");
    int32_t *pos = host, *ks = host + T, *ke = host + 2 * T, max_len = 0;
    for (int32_t s = 0; s < b->n_sequences; s++) {
        int32_t lo = b->cu_seqlens[s], hi = b->cu_seqlens[s + 1];
        if (hi < lo) {
            free(host);
            return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: batch cu_seqlens must be non-decreasing (sequence %d)", s);
        }
        max_len = hi - lo > max_len ? hi - lo : max_len;
        for (int32_t t = lo; t < hi; t++)
            pos[t] = t - lo, ks[t] = lo, ke[t] = t + 1;
    }
    const dsarl_device_ops *d = m->dev_ops;
    int rc = d->copy(m->dev, a->tokens, b->tokens, (size_t)T * 4, DSARL_COPY_HOST_TO_DEVICE, err);
    if (rc == 0)
        rc = d->copy(m->dev, a->positions, pos, (size_t)T * 4, DSARL_COPY_HOST_TO_DEVICE, err);
    if (rc == 0)
        rc = d->copy(m->dev, a->key_start, ks, (size_t)T * 4, DSARL_COPY_HOST_TO_DEVICE, err);
    if (rc == 0)
        rc = d->copy(m->dev, a->key_end, ke, (size_t)T * 4, DSARL_COPY_HOST_TO_DEVICE, err);
    free(host);
    *db = (dsarl_dsa_batch){.struct_size = sizeof(*db), .n_queries = T, .n_keys = T, .key_start = a->key_start,
                            .key_end = a->key_end, .max_keys_per_query = max_len};
    return rc;
}

int glm5_forward_logits(dsarl_model *m, const dsarl_token_batch *batch, float *logits, dsarl_error *err)
{
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t T = batch->n_tokens, C = c->hidden_size, V = c->vocab_size;
    if (T <= 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: forward needs at least one token, got %lld", (long long)T);
    workspace ws = {.m = m};
    acts a;
    dsarl_dsa_batch db;
    void *logits_dev = NULL;
    int rc = alloc_acts(&ws, c, T, &a, err);
    if (rc == 0)
        rc = ws_alloc(&ws, (size_t)(T * V) * m->elem, &logits_dev, err);
    if (rc == 0)
        rc = upload_batch(m, &a, batch, &db, err);
    if (rc == 0)
        rc = d->embedding_forward(m->dev, a.x, a.tokens, m->embed, T, C, V, err);
    float eps = (float)c->rms_norm_eps;
    for (int32_t i = 0; i < c->num_hidden_layers && rc == 0; i++) {
        const glm5_layer *L = &m->layers[i];
        rc = d->rmsnorm_forward(m->dev, a.h, a.rstd, a.x, L->input_norm, T, C, eps, err);
        if (rc == 0)
            rc = attention_forward(m, &a, L, &db, T, i == 0, err);
        if (rc == 0)
            rc = d->add(m->dev, a.x, a.x, a.attn_out, T * C, err);
        if (rc == 0)
            rc = d->rmsnorm_forward(m->dev, a.h, a.rstd, a.x, L->post_attention_norm, T, C, eps, err);
        if (rc == 0)
            rc = c->mlp_sparse[i] ? moe_forward(m, &a, L, T, err)
                                  : swiglu_mlp(m, &a, a.mlp_out, a.h, L->mlp_gate_up, L->mlp_down, T, L->mlp_inner,
                                               err);
        if (rc == 0)
            rc = d->add(m->dev, a.x, a.x, a.mlp_out, T * C, err);
    }
    if (rc == 0)
        rc = d->rmsnorm_forward(m->dev, a.h, a.rstd, a.x, m->final_norm, T, C, eps, err);
    if (rc == 0)
        rc = linear(m, logits_dev, a.h, m->lm_head, T, C, V, err);
    if (rc == 0)
        rc = d->download_f32(m->dev, logits, logits_dev, m->storage, (size_t)(T * V), err);
    if (rc == 0)
        rc = d->synchronize(m->dev, err);
    ws_free(&ws);
    return rc;
}
