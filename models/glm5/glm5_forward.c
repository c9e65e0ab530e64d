/* glm5_forward.c: the glm_moe_dsa forward pass on a packed THD batch, composed from device and DSA ops.
 *
 * Attention runs in one of two algebraically equal forms (glm5_attention_form; chosen per pass):
 * - absorbed MQA: per head, q_nope is multiplied into the latent space by W_UK (the first qk_nope rows of that
 *   head in kv_b_proj), so every head attends over one shared key/value latent kv = [rmsnorm(c_kv) | rope(k_rope)]
 *   (d_qk = kv_lora + rope, d_v = kv_lora); the latent output is brought back to v_head_dim by W_UV.
 * - headwise (transformers' expanded form): [k_nope_h | v_h] = rmsnorm(c_kv) kv_b_proj_h^T, k_h = [k_nope_h |
 *   rope(k_rope)] (the rope key shared by every head), q_h as projected; per-head attention writes attn directly.
 * Cached decode always uses the absorbed form: the cache holds the latent, not per-head keys.
 *
 * Under tensor parallelism (docs/parallel.md) a rank holds T/tp rows of the residual stream (sequence parallel),
 * gathers the norms to every row before attention and the MLPs, runs its own heads, features and vocabulary slice,
 * and reduce-scatters the row-parallel partial sums back to its rows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "glm5_cp.h"
#include "glm5_pass.h"

// Makes room for one more pointer in a growing list.
static int reserve(void ***list, int n, int *cap, dsarl_error *err)
{
    if (n < *cap)
        return DSARL_OK;
    int grown = *cap ? *cap * 2 : 128;
    void **l = realloc(*list, (size_t)grown * sizeof(void *));
    if (!l)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of host memory for a pass");
    *list = l, *cap = grown;
    return DSARL_OK;
}

int glm5_pass_alloc(glm5_pass *p, size_t bytes, void **out, dsarl_error *err)
{
    DSARL_TRY(reserve(&p->bufs, p->n_bufs, &p->cap_bufs, err));
    DSARL_TRY(p->m->dev_ops->alloc(p->m->dev, bytes ? bytes : 1, out, err));
    p->bufs[p->n_bufs++] = *out;
    return DSARL_OK;
}

int glm5_pass_host_alloc(glm5_pass *p, size_t bytes, void **out, dsarl_error *err)
{
    DSARL_TRY(reserve(&p->host_bufs, p->n_host, &p->cap_host, err));
    if (!(*out = calloc(1, bytes ? bytes : 1)))
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of host memory for a pass");
    p->host_bufs[p->n_host++] = *out;
    return DSARL_OK;
}

void glm5_pass_free(glm5_pass *p)
{
    for (int i = 0; i < p->n_bufs; i++)
        if (p->bufs[i]) // NULL: a chunk's activations, freed already
            p->m->dev_ops->free(p->m->dev, p->bufs[i]);
    for (int i = 0; i < p->n_host; i++)
        free(p->host_bufs[i]);
    free(p->acts);
    free(p->bufs);
    free(p->host_bufs);
    p->bufs = p->host_bufs = NULL;
    p->n_bufs = p->n_host = p->cap_bufs = p->cap_host = 0;
    p->acts = NULL;
}

static int64_t max2(int64_t a, int64_t b) { return a > b ? a : b; }

int glm5_layer_acts_alloc(glm5_pass *p, glm5_layer_acts *a, dsarl_error *err)
{
    const glm5_config *c = &p->m->cfg;
    int64_t T = p->T, Ts = p->T_sp; // attention rows; residual-stream (and routed-expert) rows of this rank
    size_t e = p->m->elem, f = sizeof(float), i4 = sizeof(int32_t);
    int64_t H = glm5_local_heads(p->m), C = c->hidden_size, dqk = c->kv_lora_rank + c->qk_rope_head_dim;
    int64_t K = c->num_experts_per_tok, E = c->n_routed_experts, N = Ts * K, R = glm5_moe_rows(p->m, Ts);
    int64_t nI = c->index_n_heads, dI = c->index_head_dim;
    int64_t dense = max2(c->intermediate_size, c->moe_intermediate_size), sh = c->moe_intermediate_size *
                                                                              c->n_shared_experts;
    // the form's own attention buffers: absorbed queries and latent output, or per-head keys and values
    bool headwise = p->form == DSARL_DSA_FORM_HEADWISE;
    int64_t q_abs = headwise ? 0 : T * H * dqk, out_latent = headwise ? 0 : T * H * c->kv_lora_rank;
    int64_t Tk = glm5_key_rows(p); // the keys' rows: every key of the batch under cp
    int64_t k_heads = headwise ? Tk * H * c->qk_head_dim : 0, v_heads = headwise ? Tk * H * c->v_head_dim : 0;
    struct { void **p; size_t bytes; } plan[] = {
        {&a->x_in, Ts * C * e}, {&a->h1, T * C * e}, {&a->x_mid, Ts * C * e}, {&a->h2, Ts * C * e},
        {(void **)&a->rstd1, Ts * f}, {(void **)&a->rstd2, Ts * f}, {(void **)&a->rstd_qa, T * f},
        {(void **)&a->rstd_kv, T * f}, {&a->qa, T * c->q_lora_rank * e}, {&a->q_resid, T * c->q_lora_rank * e},
        {&a->q, T * H * c->qk_head_dim * e}, {&a->ckv, T * dqk * e}, {&a->latent, T * c->kv_lora_rank * e},
        {&a->latent_norm, T * c->kv_lora_rank * e}, {&a->kv, T * dqk * e}, {&a->q_abs, q_abs * e},
        {&a->out_latent, out_latent * e}, {&a->k_heads, k_heads * e}, {&a->v_heads, v_heads * e},
        {(void **)&a->lse, T * H * f},
        {&a->attn, T * H * c->v_head_dim * e}, {&a->iq, T * nI * dI * e}, {&a->ik_raw, T * dI * e},
        {&a->ik, T * dI * e}, {(void **)&a->ik_mean, T * f}, {(void **)&a->ik_rstd, T * f},
        {(void **)&a->iw_scaled, T * nI * f},
        {(void **)&a->topk, T * (int64_t)p->topk_width * i4},
        {&a->gate_up, max2(T * dense, glm5_moe_act_rows(p->m, Ts) * c->moe_intermediate_size) * 2 * e},
        {&a->act, max2(T * dense, glm5_moe_act_rows(p->m, Ts) * c->moe_intermediate_size) * e},
        {&a->sh_gate_up, T * 2 * sh * e}, {&a->sh_act, T * sh * e},
        {&a->expert_in, R * C * e}, {&a->expert_out, R * C * e},
        {(void **)&a->router_logits, Ts * E * f}, {(void **)&a->router_probs, Ts * E * f},
        {(void **)&a->route_idx, N * i4}, {(void **)&a->route_w, (N + 1) * f},
        {(void **)&a->rows, (2 * R + N) * i4}, {(void **)&a->row_scale, R * f},
    };
    for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++)
        DSARL_TRY(glm5_pass_alloc(p, plan[i].bytes, plan[i].p, err));
    a->slot = a->rows + R, a->slot_inv = a->rows + 2 * R; // one block: one upload per MoE layer
    a->h2_full = a->h2; // every row is local without sp: the gathered norm is the norm
    if (p->sp)
        DSARL_TRY(glm5_pass_alloc(p, (size_t)(T * C) * e, &a->h2_full, err));
    if (p->cp) { // every key of the batch, gathered over cp
        DSARL_TRY(glm5_pass_alloc(p, (size_t)(p->cp->T_keys * dqk) * e, &a->kv_all, err));
        DSARL_TRY(glm5_pass_alloc(p, (size_t)(p->cp->T_keys * dI) * e, &a->ik_all, err));
    }
    // route_w[N] = 0: the routing weight of padding rows (moe_route_forward writes the first N)
    DSARL_TRY(p->m->dev_ops->zero(p->m->dev, a->route_w + N, sizeof(float), err));
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(E + 1) * sizeof(int64_t), (void **)&a->count, err));
    return DSARL_OK;
}

int glm5_linear(dsarl_model *m, void *y, const void *x, const void *w, int64_t T, int64_t in, int64_t out,
                dsarl_error *err)
{
    return m->dev_ops->gemm(m->dev, false, true, T, out, in, 1.0f, x, w, 0.0f, y, err);
}

// SwiGLU MLP on rows (n, C): gate_up (2*inner, C) rows [gate | up], down (C, inner); keeps gu and act.
static int swiglu_mlp(dsarl_model *m, void *y, const void *x, void *gu, void *act, const void *gate_up,
                      const void *down, int64_t n, int64_t inner, dsarl_error *err)
{
    int64_t C = m->cfg.hidden_size;
    DSARL_TRY(glm5_linear(m, gu, x, gate_up, n, C, 2 * inner, err));
    DSARL_TRY(m->dev_ops->swiglu_forward(m->dev, act, gu, n, inner, err));
    return glm5_linear(m, y, act, down, n, inner, C, err);
}

int glm5_sp_gather(glm5_pass *p, void *full, const void *local, int64_t width, dsarl_error *err)
{
    dsarl_model *m = p->m;
    if (!p->sp)
        return full == local ? DSARL_OK
                             : m->dev_ops->copy(m->dev, full, local, (size_t)(p->T * width) * m->elem,
                                                DSARL_COPY_DEVICE_TO_DEVICE, err);
    return dsarl_device_all_gather(m->dev_ops, m->dev, m->parallel.tp, full, local, p->T_sp * width, m->storage,
                                   err);
}

int glm5_sp_reduce(glm5_pass *p, void *local, void *partial, int64_t width, dsarl_error *err)
{
    dsarl_model *m = p->m;
    if (p->sp)
        return dsarl_device_reduce_scatter(m->dev_ops, m->dev, m->parallel.tp, local, partial, p->T_sp * width,
                                           m->storage, DSARL_REDUCE_SUM, err);
    if (m->shards.tp_size > 1) // cached decode: every rank keeps every row
        DSARL_TRY(dsarl_device_all_reduce(m->dev_ops, m->dev, m->parallel.tp, partial, p->T * width, m->storage,
                                          DSARL_REDUCE_SUM, err));
    return partial == local ? DSARL_OK
                            : m->dev_ops->copy(m->dev, local, partial, (size_t)(p->T * width) * m->elem,
                                               DSARL_COPY_DEVICE_TO_DEVICE, err);
}

// MoE layer: the routed experts (glm5_moe.c) plus the shared experts, which see the same normed input. The routed
// experts take this rank's rows: glm5_moe.c routes p->T rows of a->h2, so p->T is T_sp around the call.
static int moe_forward(glm5_pass *p, glm5_layer_acts *a, const glm5_layer *L, void *y, dsarl_error *err)
{
    dsarl_model *m = p->m;
    int64_t T = p->T;
    p->T = p->T_sp;
    glm5_scope(m, "moe");
    int rc = glm5_moe_forward(p, a, L, y, err);
    p->T = T;
    DSARL_TRY(rc);
    if (L->mlp_gate_up) { // column-parallel gate/up, row-parallel down over every row: partial sums over tp
        glm5_scope(m, "moe.shared");
        void *part = glm5_partial_out(p, p->tmp);
        DSARL_TRY(swiglu_mlp(m, part, a->h2_full, a->sh_gate_up, a->sh_act, L->mlp_gate_up, L->mlp_down, p->T,
                             L->mlp_inner, err));
        DSARL_TRY(glm5_sp_reduce(p, p->tmp, part, m->cfg.hidden_size, err));
        DSARL_TRY(m->dev_ops->add(m->dev, y, y, p->tmp, p->T_sp * m->cfg.hidden_size, err));
    }
    return DSARL_OK;
}

// Per-head keys and values of the headwise form from the normed latent a->latent_norm and the rotated shared rope
// key (a->kv's last rope columns): [k_nope_h | v_h] = latent_norm kv_b_proj_h^T, k_h = [k_nope_h | k_rope].
static int headwise_keys(glm5_pass *p, glm5_layer_acts *a, const glm5_layer *L, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t T = p->T, H = glm5_local_heads(m), nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    int64_t kvr = c->kv_lora_rank, v = c->v_head_dim, dqk = kvr + rope;
    if (p->cp) // every key of the batch, from the gathered latents
        return glm5_cp_headwise_keys(p, a, L, err);
    // one GEMM for every head: kv_heads (T, H, nope + v), as transformers' kv_b_proj output
    DSARL_TRY(glm5_linear(m, p->kv_heads, a->latent_norm, L->kv_b_proj, T, kvr, H * (nope + v), err));
    // rows (t, h) of T*H: the value; the key = [its nope part | the shared rope key, the same for every head],
    // one gather from kv_heads with the rope key placed after it
    DSARL_TRY(d->copy_2d(m->dev, a->v_heads, v, glm5_at(m, p->kv_heads, nope), nope + v, T * H, v, err));
    DSARL_TRY(d->copy_2d(m->dev, glm5_at(m, p->kv_heads, T * H * (nope + v)), rope, glm5_at(m, a->kv, kvr), dqk, T,
                         rope, err));
    return glm5_head_gather(p, GLM5_MAP_K_HEADS, a->k_heads, p->kv_heads, err);
}

// Lightning indexer on full layers (top-k into a->topk); shared layers reuse the previous full layer's top-k.
static int indexer_forward(glm5_pass *p, glm5_layer_acts *a, const glm5_layer *L, const int32_t *prev_topk,
                           dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t T = p->T, C = c->hidden_size, rope = c->qk_rope_head_dim, qr = c->q_lora_rank;
    float rs = (float)c->attention_scaling;
    int32_t layer = (int32_t)(L - m->layers);
    size_t topk_bytes = (size_t)(T * p->topk_width) * sizeof(int32_t);
    glm5_scope(m, "indexer");
    if (L->idx_wq_b) {
        int64_t nI = c->index_n_heads, dI = c->index_head_dim;
        DSARL_TRY(glm5_linear(m, a->iq, a->q_resid, L->idx_wq_b, T, qr, nI * dI, err));
        DSARL_TRY(glm5_linear(m, a->ik_raw, a->h1, L->idx_wk, T, C, dI, err));
        DSARL_TRY(d->layernorm_forward(m->dev, a->ik, a->ik_mean, a->ik_rstd, a->ik_raw, L->idx_k_norm_w,
                                       L->idx_k_norm_b, T, dI, 1e-6f, err));
        DSARL_TRY(d->rope_forward(m->dev, a->iq, a->iq, p->positions, m->inv_freq, rs, T, nI, nI * dI, dI, rope,
                                  err));
        DSARL_TRY(d->rope_forward(m->dev, a->ik, a->ik, p->positions, m->inv_freq, rs, T, 1, dI, 0, rope, err));
        // head weights in float32, both scales folded in: n_heads^-1/2 * head_dim^-1/2
        DSARL_TRY(d->gemm_f32out(m->dev, false, true, T, nI, C, (float)(1.0 / sqrt((double)nI) / sqrt((double)dI)),
                                 a->h1, L->idx_weights_proj, 0.0f, a->iw_scaled, err));
        const void *index_keys = a->ik;
        if (p->cp) { // every key of the batch in global order (glm5_cp.c)
            DSARL_TRY(glm5_cp_gather_keys(p, a->ik_all, a->ik, dI, err));
            index_keys = a->ik_all;
        }
        if (p->cache) {
            glm5_scope(m, "kv_cache");
            index_keys = p->cache->ik[layer];
            DSARL_TRY(d->scatter_add_rows(m->dev, p->cache->ik[layer], a->ik, p->cache_rows, NULL, T, dI, err));
            if (p->key_rows) { // paged: every sequence's keys in token order, as a contiguous cache holds them
                DSARL_TRY(d->gather_rows(m->dev, p->key_ik, p->cache->ik[layer], p->key_rows, p->n_key_rows, dI,
                                         err));
                index_keys = p->key_ik;
            }
            glm5_scope(m, "indexer");
        }
        dsarl_dsa_indexer_inputs in = {.struct_size = sizeof(in), .q = a->iq, .k = index_keys,
                                       .weights = a->iw_scaled,
                                       .n_heads = (int32_t)nI, .head_dim = (int32_t)dI};
        DSARL_TRY(m->dsa_ops->indexer_topk(m->dsa, &p->batch, &in, p->topk_width, a->topk, NULL, err));
        return glm5_routing_indices(p, a, layer, err);
    }
    if (!prev_topk)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: a shared indexer layer has no earlier full layer's top-k");
    if (prev_topk != a->topk)
        DSARL_TRY(d->copy(m->dev, a->topk, prev_topk, topk_bytes, DSARL_COPY_DEVICE_TO_DEVICE, err));
    return DSARL_OK;
}

static int attention_forward(glm5_pass *p, glm5_layer_acts *a, const glm5_layer *L, const int32_t *prev_topk,
                             void *y, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t T = p->T, C = c->hidden_size, H = glm5_local_heads(m), nope = c->qk_nope_head_dim;
    int64_t rope = c->qk_rope_head_dim, qk = c->qk_head_dim, kvr = c->kv_lora_rank, v = c->v_head_dim;
    int64_t dqk = kvr + rope, qr = c->q_lora_rank;
    float rs = (float)c->attention_scaling;
    bool headwise = p->form == DSARL_DSA_FORM_HEADWISE;
    if (headwise && p->cache)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: cached decode runs the absorbed attention form only");

    // queries: q_resid = rmsnorm(q_a_proj h) (also the indexer's input), q = q_b_proj q_resid, per head [nope|rope]
    glm5_scope(m, "attention.proj");
    DSARL_TRY(glm5_linear(m, a->qa, a->h1, L->q_a_proj, T, C, qr, err));
    DSARL_TRY(d->rmsnorm_forward(m->dev, a->q_resid, a->rstd_qa, a->qa, L->q_a_norm, T, qr, 1e-6f, err));
    DSARL_TRY(glm5_linear(m, a->q, a->q_resid, L->q_b_proj, T, qr, H * qk, err));
    DSARL_TRY(d->rope_forward(m->dev, glm5_at(m, a->q, nope), glm5_at(m, a->q, nope), p->positions, m->inv_freq, rs,
                              T, H, H * qk, qk, rope, err));
    // shared latent: kv = [rmsnorm(c_kv) | rope(k_rope)]
    DSARL_TRY(glm5_linear(m, a->ckv, a->h1, L->kv_a_proj, T, C, dqk, err));
    DSARL_TRY(d->copy_2d(m->dev, a->latent, kvr, a->ckv, dqk, T, kvr, err));
    DSARL_TRY(d->rmsnorm_forward(m->dev, a->latent_norm, a->rstd_kv, a->latent, L->kv_a_norm, T, kvr, 1e-6f, err));
    DSARL_TRY(d->rope_forward(m->dev, glm5_at(m, a->ckv, kvr), glm5_at(m, a->ckv, kvr), p->positions, m->inv_freq,
                              rs, T, 1, dqk, 0, rope, err));
    DSARL_TRY(d->copy_2d(m->dev, a->kv, dqk, a->latent_norm, kvr, T, kvr, err));
    DSARL_TRY(d->copy_2d(m->dev, glm5_at(m, a->kv, kvr), dqk, glm5_at(m, a->ckv, kvr), dqk, T, rope, err));
    if (p->cp) // every key of the batch in global order (glm5_cp.c)
        DSARL_TRY(glm5_cp_gather_keys(p, a->kv_all, a->kv, dqk, err));
    if (headwise) {
        DSARL_TRY(headwise_keys(p, a, L, err));
        DSARL_TRY(indexer_forward(p, a, L, prev_topk, err));
        // rows no longer than topk attend to every eligible key: NULL indices let the backend run dense causal
        dsarl_dsa_headwise_inputs hw = {.struct_size = sizeof(hw), .q = a->q, .k = a->k_heads, .v = a->v_heads,
                                        .n_heads = (int32_t)H, .d_qk = (int32_t)qk, .d_v = (int32_t)v,
                                        .softmax_scale = (float)c->softmax_scale};
        glm5_scope(m, "attention.core");
        DSARL_TRY(m->dsa_ops->headwise_attention_forward(m->dsa, &p->batch, &hw, p->every_key_selected ? NULL : a->topk,
                                                         p->topk_width, a->attn, a->lse, err));
        glm5_scope(m, "attention.proj");
        return glm5_linear(m, y, a->attn, L->o_proj, T, H * v, C, err);
    }
    // the key array attention reads: this batch's own latents, or (cached inference) the cache they are appended to
    const void *keys = a->kv;
    int32_t layer = (int32_t)(L - m->layers);
    if (p->cp)
        keys = a->kv_all;
    if (p->cache) { // cache rows are zero until written once, so adding writes them exactly
        glm5_scope(m, "kv_cache");
        keys = p->cache->kv[layer];
        DSARL_TRY(d->scatter_add_rows(m->dev, p->cache->kv[layer], a->kv, p->cache_rows, NULL, T, dqk, err));
        if (p->key_rows) { // paged: gathered after the append, so the new tokens' own keys are in it
            DSARL_TRY(d->gather_rows(m->dev, p->key_kv, p->cache->kv[layer], p->key_rows, p->n_key_rows, dqk, err));
            keys = p->key_kv;
        }
    }
    glm5_scope(m, "attention.proj");
    DSARL_TRY(glm5_absorb_queries(p, L, a->q, a->q_abs, p->head_in, p->head_out, err));
    DSARL_TRY(indexer_forward(p, a, L, prev_topk, err));
    dsarl_dsa_attention_inputs at = {.struct_size = sizeof(at), .q = a->q_abs, .kv = keys, .n_heads = (int32_t)H,
                                     .d_qk = (int32_t)dqk, .d_v = (int32_t)kvr,
                                     .softmax_scale = (float)c->softmax_scale};
    glm5_scope(m, "attention.core");
    DSARL_TRY(m->dsa_ops->sparse_mla_forward(m->dsa, &p->batch, &at, a->topk, p->topk_width, a->out_latent, a->lse,
                                             err));
    // back from the latent: attn[:, h] = out_latent_h W_UV_h^T
    glm5_scope(m, "attention.proj");
    DSARL_TRY(glm5_values_from_latent(p, L, a->out_latent, a->attn, p->head_in, p->head_out, err));
    return glm5_linear(m, y, a->attn, L->o_proj, T, H * v, C, err);
}

int glm5_layer_forward(glm5_pass *p, glm5_layer_acts *a, int32_t i, const int32_t *prev_topk, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    const glm5_layer *L = &m->layers[i];
    int64_t T = p->T, Ts = p->T_sp, C = c->hidden_size;
    size_t e = m->elem;
    float eps = (float)c->rms_norm_eps;
    glm5_scope(m, "norm");
    if (p->save) // the layer's inputs are read only by the backward
        DSARL_TRY(d->copy(m->dev, a->x_in, p->x, (size_t)(Ts * C) * e, DSARL_COPY_DEVICE_TO_DEVICE, err));
    // the norm of this rank's rows, gathered: attention projects every row (its heads, over the whole sequence)
    void *h1_local = p->sp ? p->tmp : a->h1;
    DSARL_TRY(d->rmsnorm_forward(m->dev, h1_local, a->rstd1, p->x, L->input_norm, Ts, C, eps, err));
    DSARL_TRY(glm5_sp_gather(p, a->h1, h1_local, C, err));
    // o_proj is row-parallel: each rank's heads give partial (T, C) sums, reduced to this rank's rows
    void *part = glm5_partial_out(p, p->tmp);
    DSARL_TRY(attention_forward(p, a, L, prev_topk, part, err));
    DSARL_TRY(glm5_sp_reduce(p, p->tmp, part, C, err));
    glm5_scope(m, "norm");
    DSARL_TRY(d->add(m->dev, p->x, p->x, p->tmp, Ts * C, err));
    if (p->save)
        DSARL_TRY(d->copy(m->dev, a->x_mid, p->x, (size_t)(Ts * C) * e, DSARL_COPY_DEVICE_TO_DEVICE, err));
    DSARL_TRY(d->rmsnorm_forward(m->dev, a->h2, a->rstd2, p->x, L->post_attention_norm, Ts, C, eps, err));
    DSARL_TRY(glm5_sp_gather(p, a->h2_full, a->h2, C, err));
    // the MLP writes to h_final (free until the final norm): tmp is the shared experts' scratch
    void *y = p->h_final;
    if (c->mlp_sparse[i]) {
        DSARL_TRY(moe_forward(p, a, L, y, err));
    } else { // column-parallel gate/up, row-parallel down: partial sums over tp
        glm5_scope(m, "mlp.dense");
        part = glm5_partial_out(p, y);
        DSARL_TRY(swiglu_mlp(m, part, a->h2_full, a->gate_up, a->act, L->mlp_gate_up, L->mlp_down, T, L->mlp_inner,
                             err));
        DSARL_TRY(glm5_sp_reduce(p, y, part, C, err));
    }
    glm5_scope(m, "norm");
    return d->add(m->dev, p->x, p->x, y, Ts * C, err);
}

int glm5_upload_vocab_ids(glm5_pass *p, const int32_t *tokens, dsarl_error *err)
{
    dsarl_model *m = p->m;
    int64_t T = p->T, Vl = glm5_local_vocab(m), v0 = Vl * m->shards.tp_rank;
    // ids then mask: one host block in the layout of one device block, one upload
    int32_t *host;
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(2 * T) * sizeof(int32_t), (void **)&host, err));
    float *mask = (float *)(host + T);
    for (int64_t t = 0; t < T; t++) {
        bool mine = tokens[t] >= v0 && tokens[t] < v0 + Vl;
        host[t] = mine ? (int32_t)(tokens[t] - v0) : 0, mask[t] = mine ? 1.0f : 0.0f;
    }
    DSARL_TRY(glm5_pass_alloc(p, (size_t)(2 * T) * sizeof(int32_t), (void **)&p->vocab_ids, err));
    p->vocab_mask = (float *)(p->vocab_ids + T);
    return m->dev_ops->copy(m->dev, p->vocab_ids, host, (size_t)(2 * T) * sizeof(int32_t), DSARL_COPY_HOST_TO_DEVICE,
                            err);
}

int glm5_embed(glm5_pass *p, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    int64_t T = p->T, C = m->cfg.hidden_size;
    glm5_scope(m, "embedding");
    if (m->shards.tp_size == 1)
        return d->embedding_forward(m->dev, p->x, p->tokens, m->embed, T, C, m->cfg.vocab_size, err);
    // vocab-parallel: every row looks up its id in this rank's slice (ids outside it give a zero row), summed over
    // tp into this rank's rows
    void *part = glm5_partial_out(p, p->x);
    DSARL_TRY(d->embedding_forward(m->dev, part, p->vocab_ids, m->embed, T, C, glm5_local_vocab(m), err));
    DSARL_TRY(d->scale_rows(m->dev, part, p->vocab_mask, T, C, err));
    return glm5_sp_reduce(p, p->x, part, C, err);
}

// Uploads token ids, positions within each sequence and the causal key ranges of the packed batch.
static int upload_batch(glm5_pass *p, const dsarl_token_batch *b, dsarl_error *err)
{
    dsarl_model *m = p->m;
    int64_t T = b->n_tokens;
    if (b->n_sequences < 1 || !b->cu_seqlens || b->cu_seqlens[0] != 0 || b->cu_seqlens[b->n_sequences] != T)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: batch cu_seqlens must start at 0 and end at n_tokens (%lld)",
                          (long long)T);
    // ids, positions and key ranges: one host block in the layout of the device block p->tokens, one upload
    int32_t *host;
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(4 * T) * sizeof(int32_t), (void **)&host, err));
    memcpy(host, b->tokens, (size_t)T * sizeof(int32_t));
    int32_t *pos = host + T, *ks = host + 2 * T, *ke = host + 3 * T, max_len = 0;
    for (int32_t s = 0; s < b->n_sequences; s++) {
        int32_t lo = b->cu_seqlens[s], hi = b->cu_seqlens[s + 1];
        if (hi < lo || hi > T)
            return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: batch cu_seqlens must be non-decreasing within [0, %lld] "
                              "(sequence %d)", (long long)T, s);
        max_len = hi - lo > max_len ? hi - lo : max_len;
        for (int32_t t = lo; t < hi; t++)
            pos[t] = t - lo, ks[t] = lo, ke[t] = t + 1;
    }
    DSARL_TRY(m->dev_ops->copy(m->dev, p->tokens, host, (size_t)(4 * T) * sizeof(int32_t), DSARL_COPY_HOST_TO_DEVICE,
                               err));
    // the segments on the host for backends that plan per segment shape (ABI 1.1): the pass's own copy, alive
    // until glm5_pass_free, so the backward sees the same array
    int32_t *cu;
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(b->n_sequences + 1) * sizeof(int32_t), (void **)&cu, err));
    memcpy(cu, b->cu_seqlens, (size_t)(b->n_sequences + 1) * sizeof(int32_t));
    p->batch = (dsarl_dsa_batch){.struct_size = sizeof(p->batch), .n_queries = T, .n_keys = T,
                                 .key_start = p->key_start, .key_end = p->key_end, .max_keys_per_query = max_len,
                                 .host_cu_seqlens = cu, .n_segments = b->n_sequences};
    return DSARL_OK;
}

// A batch of T tokens that tp does not divide, with one more segment of pad tokens (id 0) up to the next multiple:
// a segment of its own, so no real token attends to a pad; the caller's rows come first (p->T_real of p->T).
static int pad_batch(glm5_pass *p, const dsarl_token_batch *b, dsarl_token_batch *out, dsarl_error *err)
{
    int32_t tp = p->m->shards.tp_size, n = b->n_sequences;
    int64_t T = b->n_tokens, padded = (T + tp - 1) / tp * tp;
    if (n < 1 || !b->cu_seqlens || !b->tokens || b->cu_seqlens[0] != 0 || b->cu_seqlens[n] != T)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: batch cu_seqlens must start at 0 and end at n_tokens (%lld)",
                          (long long)T);
    int32_t *tokens, *cu;
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)padded * sizeof(int32_t), (void **)&tokens, err)); // zeroed
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(n + 2) * sizeof(int32_t), (void **)&cu, err));
    memcpy(tokens, b->tokens, (size_t)T * sizeof(int32_t));
    memcpy(cu, b->cu_seqlens, (size_t)(n + 1) * sizeof(int32_t));
    cu[n + 1] = (int32_t)padded;
    *out = *b;
    out->struct_size = sizeof(*out) < b->struct_size ? sizeof(*out) : b->struct_size;
    out->n_tokens = padded, out->n_sequences = n + 1, out->tokens = tokens, out->cu_seqlens = cu;
    p->T = padded;
    return DSARL_OK;
}

// The attention form of a training/prefill pass: the recipe's choice, or under auto the backend's preference.
static int choose_form(glm5_pass *p, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_dsa_ops *dsa = m->dsa_ops;
    const char *name = dsa->common.name ? dsa->common.name : "(unnamed)";
    p->form = DSARL_DSA_FORM_ABSORBED;
    // under cp queries and keys differ (no host segments, which the backends' per-segment plans need): auto runs
    // absorbed, whatever the backend prefers
    if (m->attention_form == GLM5_FORM_HEADWISE)
        p->form = DSARL_DSA_FORM_HEADWISE;
    else if (m->attention_form == GLM5_FORM_AUTO && !p->cp && DSARL_DSA_HAS(dsa, preferred_form))
        p->form = dsa->preferred_form(m->dsa, &p->batch, p->topk_width);
    if (p->form != DSARL_DSA_FORM_ABSORBED && p->form != DSARL_DSA_FORM_HEADWISE)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: DSA backend %s answered preferred_form %d; a backend must "
                          "answer DSARL_DSA_FORM_ABSORBED (0) or DSARL_DSA_FORM_HEADWISE (1)", name, (int)p->form);
    if (p->form == DSARL_DSA_FORM_HEADWISE && !glm5_dsa_has_headwise(dsa))
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "glm5: DSA backend %s prefers the headwise attention form but "
                          "has no headwise_attention_forward/backward; it must serve the form it prefers", name);
    p->every_key_selected = p->batch.max_keys_per_query <= p->topk_width;
    return DSARL_OK;
}

// The head-major staging the form needs (the backward's too when save) and the head-layout maps, before any layer.
static int alloc_head_layout(glm5_pass *p, bool save, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const glm5_config *c = &m->cfg;
    int64_t T = p->T, H = glm5_local_heads(m);
    // the headwise form absorbs queries only for the indexer loss (it distils the absorbed attention)
    bool absorbed = p->form == DSARL_DSA_FORM_ABSORBED, indexer_loss = save && m->indexer_loss_coeff > 0.0f;
    int64_t stage = absorbed || indexer_loss ? H * T * glm5_head_stage(c) : 0;
    DSARL_TRY(glm5_pass_alloc(p, (size_t)stage * m->elem, &p->head_in, err));
    DSARL_TRY(glm5_pass_alloc(p, (size_t)stage * m->elem, &p->head_out, err));
    int64_t Tk = glm5_key_rows(p);
    if (!absorbed) // kv_b_proj's output, then the shared rope key (of every key)
        DSARL_TRY(glm5_pass_alloc(p, (size_t)(Tk * H * (c->qk_nope_head_dim + c->v_head_dim) +
                                              Tk * c->qk_rope_head_dim) * m->elem, &p->kv_heads, err));
    return glm5_head_maps_prepare(p, err);
}

int glm5_pass_begin(dsarl_model *m, const dsarl_token_batch *batch, bool save, glm5_pass *p, dsarl_error *err)
{
    const glm5_config *c = &m->cfg;
    int64_t T = batch->n_tokens, C = c->hidden_size, V = glm5_local_vocab(m);
    int32_t tp = m->shards.tp_size;
    memset(p, 0, sizeof(*p));
    glm5_scope(m, "setup"); // the batch's upload, buffers, head maps
    p->m = m, p->T = T, p->logit_scale = dsarl_token_batch_logit_scale(batch);
    p->fwd_chunk = 0, p->bwd_chunk = m->stage.chunks - 1;
    if (T <= 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: forward needs at least one token, got %lld", (long long)T);
    p->T_real = T;
    const dsarl_token_batch *caller = batch; // its routing rows (tp padding and cp chunks make new batches)
    dsarl_token_batch padded;
    if (m->parallel.cp_size > 1) { // context parallel: this rank's chunks of every sequence (glm5_cp.c), T = T_local
        DSARL_TRY(glm5_cp_prepare(p, batch, &batch, err));
        T = p->T;
    } else if (T % tp != 0) { // not divisible into equal sequence-parallel row blocks: pad (policy.make_sequence_
        DSARL_TRY(pad_batch(p, batch, &padded, err)); // length_divisible_by avoids it), T grows
        batch = &padded, T = p->T;
    }
    p->sp = tp > 1, p->T_sp = T / tp;
    // dense attention (DSA warm-up): a top-k as wide as the longest sequence selects every causal key
    p->topk_width = c->index_topk;
    for (int32_t s = 0; m->dense_attention && batch->cu_seqlens && s < batch->n_sequences; s++)
        if (batch->cu_seqlens[s + 1] - batch->cu_seqlens[s] > p->topk_width)
            p->topk_width = batch->cu_seqlens[s + 1] - batch->cu_seqlens[s];
    p->save = save;
    p->recompute = save && m->activation_recompute;
    p->n_acts = save && !p->recompute ? glm5_stage_n_layers(&m->stage) : 1; // this stage's layers
    size_t e = m->elem, i4 = sizeof(int32_t);
    p->head_rows = glm5_head_rows(m, T); // the LM head's logits, whole or a chunk of rows at a time (glm5_head.c)
    struct { void **ptr; size_t bytes; } plan[] = {
        {&p->x, T * C * e}, {&p->h_final, T * C * e}, {(void **)&p->rstd_final, T * sizeof(float)},
        {(void **)&p->logits, (glm5_stage_is_last(m) ? p->head_rows * V : 0) * sizeof(float)}, // the head's stage
        {&p->tmp, T * C * e}, {(void **)&p->tokens, 4 * T * i4}};
    for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++)
        DSARL_TRY(glm5_pass_alloc(p, plan[i].bytes, plan[i].ptr, err));
    if (p->sp) // the row-parallel layers' partial sums before their reduce-scatter
        DSARL_TRY(glm5_pass_alloc(p, (size_t)(T * C) * e, &p->part, err));
    // tokens, positions, key_start, key_end: one block, uploaded at once by upload_batch
    p->positions = p->tokens + T, p->key_start = p->tokens + 2 * T, p->key_end = p->tokens + 3 * T;
    // the batch decides the form, and the form the activation buffers
    DSARL_TRY(p->cp ? glm5_cp_upload_batch(p, err) : upload_batch(p, batch, err));
    if (tp > 1)
        DSARL_TRY(glm5_upload_vocab_ids(p, p->cp ? glm5_cp_tokens(p) : batch->tokens, err));
    DSARL_TRY(choose_form(p, err));
    DSARL_TRY(glm5_routing_prepare(p, caller, NULL, err));
    DSARL_TRY(alloc_head_layout(p, save, err));
    if (!(p->acts = calloc((size_t)p->n_acts, sizeof(glm5_layer_acts))))
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory for activations");
    if (p->n_acts == 1) // one set reused by every layer; a training pass's come with each chunk's forward
        DSARL_TRY(glm5_layer_acts_alloc(p, &p->acts[0], err));
    else
        DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(2 * m->stage.chunks) * sizeof(int), (void **)&p->chunk_bufs,
                                       err));
    if (p->recompute) {
        DSARL_TRY(glm5_pass_host_alloc(p, (size_t)c->num_hidden_layers * sizeof(void *), (void **)&p->x_saved, err));
        DSARL_TRY(glm5_pass_host_alloc(p, (size_t)c->num_hidden_layers * sizeof(int32_t *), (void **)&p->topk_saved, err));
        for (int32_t i = 0; i < c->num_hidden_layers; i++) {
            if (!glm5_stage_has_layer(m, i))
                continue;
            DSARL_TRY(glm5_pass_alloc(p, (size_t)(p->T_sp * C) * e, &p->x_saved[i], err));
            DSARL_TRY(glm5_pass_alloc(p, (size_t)(T * p->topk_width) * sizeof(int32_t), (void **)&p->topk_saved[i],
                                      err));
        }
    }
    return DSARL_OK;
}

int glm5_pass_chunk_acts(glm5_pass *p, int32_t c, dsarl_error *err)
{
    const glm5_stage *st = &p->m->stage;
    if (p->n_acts == 1)
        return DSARL_OK;
    p->chunk_bufs[2 * c] = p->n_bufs;
    for (int32_t i = glm5_chunk_first(st, c); i < glm5_chunk_end(st, c); i++)
        DSARL_TRY(glm5_layer_acts_alloc(p, &p->acts[glm5_stage_local_layer(st, i)], err));
    p->chunk_bufs[2 * c + 1] = p->n_bufs;
    return DSARL_OK;
}

void glm5_pass_free_chunk_acts(glm5_pass *p, int32_t c)
{
    if (p->n_acts == 1)
        return;
    // the chunk's range holds only glm5_layer_acts_alloc's buffers (the layers' own lazy ones come after it)
    for (int i = p->chunk_bufs[2 * c]; i < p->chunk_bufs[2 * c + 1]; i++) {
        p->m->dev_ops->free(p->m->dev, p->bufs[i]);
        p->bufs[i] = NULL;
    }
}

// Model chunk c of this rank: its input (the embedding, or the previous virtual stage's output), its layers, then
// the output to the next virtual stage or, on the last one, the final norm and the logits.
static int chunk_forward(glm5_pass *p, int32_t chunk, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t T = p->T, C = c->hidden_size, V = glm5_local_vocab(m);
    size_t e = m->elem;
    const int32_t *prev_topk = NULL; // the embedding, or the previous pipeline stage's output
    DSARL_TRY(glm5_pass_chunk_acts(p, chunk, err));
    DSARL_TRY(glm5_stage_input(p, chunk, &prev_topk, err));
    for (int32_t i = glm5_chunk_first(&m->stage, chunk); i < glm5_chunk_end(&m->stage, chunk); i++) {
        glm5_layer_acts *a = &p->acts[p->n_acts > 1 ? glm5_stage_local_layer(&m->stage, i) : 0];
        if (p->recompute) {
            glm5_scope(m, "norm");
            DSARL_TRY(d->copy(m->dev, p->x_saved[i], p->x, (size_t)(p->T_sp * C) * e, DSARL_COPY_DEVICE_TO_DEVICE,
                              err));
        }
        DSARL_TRY(glm5_layer_forward(p, a, i, prev_topk, err));
        prev_topk = a->topk;
        if (p->recompute) {
            DSARL_TRY(d->copy(m->dev, p->topk_saved[i], a->topk, (size_t)(T * p->topk_width) * sizeof(int32_t),
                              DSARL_COPY_DEVICE_TO_DEVICE, err));
            prev_topk = p->topk_saved[i];
        }
    }
    if (!glm5_chunk_is_last(m, chunk)) // the next stage takes it from here (no logits)
        return glm5_stage_output(p, chunk, prev_topk, err);
    float eps = (float)c->rms_norm_eps;
    void *h_local = p->sp ? p->tmp : p->h_final;
    glm5_scope(m, "norm");
    DSARL_TRY(d->rmsnorm_forward(m->dev, h_local, p->rstd_final, p->x, m->final_norm, p->T_sp, C, eps, err));
    DSARL_TRY(glm5_sp_gather(p, p->h_final, h_local, C, err));
    if (p->head_rows < T) // chunked: the log-probs and the backward compute the logits chunk by chunk
        return DSARL_OK;
    glm5_scope(m, "lm_head");
    // LM-head logits in float32 (log-softmax over a large vocabulary needs it), times the batch's logit factor;
    // vocab-parallel: this rank's slice of every row
    return m->dev_ops->gemm_f32out(m->dev, false, true, T, V, C, p->logit_scale, p->h_final, m->lm_head, 0.0f,
                                   p->logits, err);
}

int glm5_pass_layers(glm5_pass *p, dsarl_error *err)
{
    int32_t chunks = p->m->stage.chunks;
    if (p->fwd_chunk >= chunks)
        return DSARL_FAIL(err, DSARL_E_INTERNAL, "glm5: the pass ran its %d model chunks already", chunks);
    // a pipeline schedule runs one chunk per call; otherwise the chunks run in turn
    for (int32_t last = p->staged ? p->fwd_chunk : chunks - 1; p->fwd_chunk <= last; p->fwd_chunk++)
        DSARL_TRY(chunk_forward(p, p->fwd_chunk, err));
    return DSARL_OK;
}

int glm5_pass_forward(dsarl_model *m, const dsarl_token_batch *batch, bool save, glm5_pass *p, dsarl_error *err)
{
    DSARL_TRY(glm5_pass_begin(m, batch, save, p, err));
    return glm5_pass_layers(p, err);
}

int glm5_gather_vocab(dsarl_model *m, float *host, const float *local, int64_t rows, dsarl_error *err)
{
    const dsarl_device_ops *d = m->dev_ops;
    int32_t tp = m->shards.tp_size;
    int64_t V = m->cfg.vocab_size, Vl = glm5_local_vocab(m);
    if (tp == 1)
        return d->download_f32(m->dev, host, local, DSARL_DTYPE_F32, (size_t)(rows * V), err);
    // (tp, rows, V/tp) rank-major, then each rank's slice into its columns of (rows, V) on the host
    float *all = NULL, *stage = malloc((size_t)(rows * V) * sizeof(float));
    int rc = stage ? d->alloc(m->dev, (size_t)(rows * V) * sizeof(float), (void **)&all, err)
                   : DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of host memory for %lld logits", (long long)(rows * V));
    if (rc == 0)
        rc = dsarl_device_all_gather(d, m->dev, m->parallel.tp, all, local, rows * Vl, DSARL_DTYPE_F32, err);
    if (rc == 0)
        rc = d->download_f32(m->dev, stage, all, DSARL_DTYPE_F32, (size_t)(rows * V), err);
    for (int32_t r = 0; rc == 0 && r < tp; r++)
        for (int64_t t = 0; t < rows; t++)
            memcpy(host + t * V + r * Vl, stage + (r * rows + t) * Vl, (size_t)Vl * sizeof(float));
    if (all)
        d->free(m->dev, all);
    free(stage);
    return rc;
}

int glm5_forward_logits(dsarl_model *m, const dsarl_token_batch *batch, float *logits, dsarl_error *err)
{
    glm5_pass p;
    int rc = glm5_pass_forward(m, batch, false, &p, err);
    float *rows = logits; // a padded pass has more rows than the caller's, a cp pass other ones
    if (rc == 0 && (p.T != p.T_real || p.cp))
        rc = glm5_pass_host_alloc(&p, (size_t)(p.T * m->cfg.vocab_size) * sizeof(float), (void **)&rows, err);
    bool head = glm5_stage_is_last(m);
    glm5_scope(m, "lm_head");
    if (rc == 0 && head && p.head_rows >= p.T) // a tool path: every rank gets the whole (T, V) rows
        rc = glm5_gather_vocab(m, rows, p.logits, p.T, err);
    for (int64_t r0 = 0; rc == 0 && head && p.head_rows < p.T && r0 < p.T; r0 += p.head_rows) { // chunked (tp 1)
        int64_t n = p.T - r0 < p.head_rows ? p.T - r0 : p.head_rows;
        rc = glm5_head_chunk_logits(&p, r0, n, err);
        if (rc == 0)
            rc = glm5_gather_vocab(m, rows + r0 * m->cfg.vocab_size, p.logits, n, err);
    }
    if (rc == 0 && !p.cp)
        rc = glm5_stage_share_last(m, rows, p.T * m->cfg.vocab_size, err);
    if (rc == 0 && p.cp && head) // a cp group lies inside one stage: the head's gathers its rows, then shares them
        rc = glm5_cp_gather_rows(&p, logits, rows, m->cfg.vocab_size, err);
    if (rc == 0 && p.cp)
        rc = glm5_stage_share_last(m, logits, p.cp->T_caller * m->cfg.vocab_size, err);
    else if (rc == 0 && rows != logits)
        memcpy(logits, rows, (size_t)(p.T_real * m->cfg.vocab_size) * sizeof(float));
    if (rc == 0)
        rc = m->dev_ops->synchronize(m->dev, err);
    glm5_pass_free(&p);
    glm5_scope(m, NULL);
    return rc;
}
