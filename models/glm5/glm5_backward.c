/* glm5_backward.c: per-token log-probabilities, and the backward pass through every layer and parameter, plus
 * the DSA indexer KL loss with DeepSeek-V3.2's detach semantics.
 *
 * Gradients follow transformers' autograd graph: the top-k choices (indexer and router) are not differentiated,
 * the routing weights are (through the sigmoid and the norm_topk_prob denominator), and the indexer is outside
 * the LM graph (HF runs it under no_grad). The indexer loss sees detached inputs (h, q_resid, and the attention
 * it distils), so its gradient reaches only wq_b, wk, k_norm and weights_proj of full layers. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "glm5_cp.h"
#include "glm5_pass.h"

// targets (T) int32 and dlogprobs (T) float32 in one block (the log-probs are computed into dlogprobs' room).
static int alloc_targets(glm5_pass *p, glm5_grad_bufs *g, dsarl_error *err)
{
    DSARL_TRY(glm5_pass_alloc(p, (size_t)(2 * p->T) * sizeof(int32_t), (void **)&g->targets, err));
    g->dlogprobs = (float *)(g->targets + p->T);
    return DSARL_OK;
}

// Everything of grad_bufs but the targets block (alloc_targets, which the training forward allocates first).
static int alloc_grad_bufs(glm5_pass *p, glm5_grad_bufs *g, dsarl_error *err)
{
    const glm5_config *c = &p->m->cfg;
    int64_t T = p->T, Ts = p->T_sp, C = c->hidden_size, H = glm5_local_heads(p->m);
    int64_t V = glm5_stage_is_last(p->m) ? glm5_local_vocab(p->m) : 0; // logits live on the LM head's stage only
    int64_t K = c->num_experts_per_tok, E = c->n_routed_experts, N = Ts * K, kvr = c->kv_lora_rank;
    int64_t dqk = kvr + c->qk_rope_head_dim, qr = c->q_lora_rank, nI = c->index_n_heads, dI = c->index_head_dim;
    bool headwise = p->form == DSARL_DSA_FORM_HEADWISE;
    // head-major staging (H, T, glm5_head_stage) where the form needs it (see alloc_head_layout in glm5_forward.c)
    int64_t stage = !headwise || p->m->indexer_loss_coeff > 0.0f ? H * T * glm5_head_stage(c) : 0;
    // the form's own buffers (the other form's are left at one byte)
    int64_t qk = c->qk_head_dim, nv = c->qk_nope_head_dim + c->v_head_dim;
    int64_t Tk = glm5_key_rows(p); // the keys' rows: every key of the batch under cp
    int64_t abs_rows = headwise ? 0 : T * H, hw_rows = headwise ? Tk * H : 0;
    int64_t q_abs_rows = headwise && p->m->indexer_loss_coeff > 0.0f ? T * H : 0;
    int64_t inner_rows = T * c->intermediate_size;
    int64_t R = glm5_moe_rows(p->m, Ts); // this rank's routed rows, with padding room where padded (glm5_pass.h)
    int64_t moe_rows = glm5_moe_act_rows(p->m, Ts) * c->moe_intermediate_size;
    int64_t sh_rows = T * c->moe_intermediate_size * c->n_shared_experts;
    inner_rows = inner_rows > moe_rows ? inner_rows : moe_rows;
    inner_rows = inner_rows > sh_rows ? inner_rows : sh_rows;
    size_t e = p->m->elem, f = sizeof(float);
    struct { void **ptr; size_t bytes; } plan[] = {
        {(void **)&g->dlogits, p->head_rows * V * f}, {(void **)&g->drouter, Ts * E * f},
        {(void **)&g->dscale, R * f}, {(void **)&g->droute_w, N * f}, {(void **)&g->iw_grad, T * nI * f},
        {(void **)&g->ilosses, glm5_built_layers(c) * T * f}, {(void **)&g->idloss, T * f},
        {&g->dx, Ts * C * e}, {&g->dh, Ts * C * e}, {&g->dh2, Ts * C * e}, {&g->dtmp, Ts * C * e},
        {&g->dattn, T * H * c->v_head_dim * e}, {&g->dout_latent, abs_rows * kvr * e},
        {&g->dq_abs, abs_rows * dqk * e}, {&g->dk_heads, hw_rows * qk * e}, {&g->dv_heads, hw_rows * c->v_head_dim * e},
        {&g->dkv_heads, hw_rows * nv * e}, {&g->dk_sum, (headwise ? Tk * qk : 0) * e}, {&g->ones, hw_rows * e},
        {&g->q_abs, q_abs_rows * dqk * e},
        {&g->dkv, T * dqk * e}, {&g->dq, T * H * c->qk_head_dim * e}, {&g->dqr, T * qr * e}, {&g->dqa, T * qr * e},
        {&g->dlat, T * kvr * e}, {&g->dlatn, T * kvr * e}, {&g->dckv, T * dqk * e},
        {&g->s3, stage * e},
        {&g->dact, inner_rows * e}, {&g->dgu, 2 * inner_rows * e}, {&g->dexp, R * C * e}, {&g->dxin, R * C * e},
        {&g->diq, T * nI * dI * e}, {&g->dik, T * dI * e}, {&g->dik_raw, T * dI * e}, {&g->diw, T * nI * e},
        {&g->dlogits_s, p->head_rows * V * e}, {&g->drouter_s, T * E * e},
    };
    for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++)
        DSARL_TRY(glm5_pass_alloc(p, plan[i].bytes, plan[i].ptr, err));
    // tensor parallelism: the residual stream's gathered gradients and partial sums (sp; without it every row is
    // local and row-parallel layers write their sums in place), and the indexer loss's every-head queries and lse
    // (the loss distils the attention summed over all heads)
    int32_t tp = p->m->shards.tp_size;
    int64_t heads = p->m->indexer_loss_coeff > 0.0f ? T * H * tp : 0;
    struct { void **ptr; size_t bytes; } tp_plan[] = {
        {&g->dfull, T * C * e}, {&g->dpart, T * C * e}, {&g->q_heads, heads * dqk * e}, {&g->q_stage, heads * dqk * e},
        {(void **)&g->lse_heads, heads * f}, {(void **)&g->lse_stage, heads * f},
    };
    for (size_t i = 0; p->sp && i < sizeof tp_plan / sizeof tp_plan[0]; i++)
        DSARL_TRY(glm5_pass_alloc(p, tp_plan[i].bytes, tp_plan[i].ptr, err));
    if (p->cp) { // the key gradients of this rank's queries for every key, before their reduce-scatter
        DSARL_TRY(glm5_pass_alloc(p, (size_t)(p->cp->T_keys * dqk) * e, &g->dkv_all, err));
        DSARL_TRY(glm5_pass_alloc(p, (size_t)(p->cp->T_keys * dI) * e, &g->dik_all, err));
    }
    // the forward's head staging is free while the backward runs (a recomputed layer's forward finishes first)
    g->s1 = p->head_in, g->s2 = p->head_out;
    if (hw_rows > 0) {
        float *one = malloc((size_t)hw_rows * sizeof(float));
        if (!one)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of host memory for the backward");
        for (int64_t i = 0; i < hw_rows; i++)
            one[i] = 1.0f;
        int rc = p->m->dev_ops->upload_f32(p->m->dev, g->ones, p->m->storage, one, (size_t)hw_rows, err);
        free(one);
        DSARL_TRY(rc);
    }
    return DSARL_OK;
}

// A float32 gradient (n) as a storage-dtype GEMM operand: itself on float32 storage, else converted into tmp.
const void *glm5_storage_operand(dsarl_model *m, const float *g32, void *tmp, int64_t n, dsarl_error *err,
                                   int *rc)
{
    if (m->storage == DSARL_DTYPE_F32)
        return g32;
    *rc = m->dev_ops->convert(m->dev, tmp, m->storage, g32, DSARL_DTYPE_F32, n, 1.0f, err);
    return tmp;
}

// dW (out,in) += dy^T x for y = x W^T over n rows.
int glm5_linear_dweight(dsarl_model *m, const void *w, const void *dy, const void *x, int64_t n, int64_t in,
                          int64_t out, dsarl_error *err)
{
    return m->dev_ops->gemm(m->dev, true, false, out, in, n, 1.0f, dy, x, 1.0f, glm5_grad_of(m, w), err);
}

// dx (n,in) = dy W (beta 0: overwrite, 1: accumulate).
int glm5_linear_dinput(dsarl_model *m, void *dx, const void *dy, const void *w, int64_t n, int64_t in,
                         int64_t out, float beta, dsarl_error *err)
{
    return m->dev_ops->gemm(m->dev, false, false, n, in, out, 1.0f, dy, w, beta, dx, err);
}

// Backward of the SwiGLU MLP y = down(swiglu(x gate_up^T)); dx (n,C) accumulated.
static int mlp_backward(dsarl_model *m, glm5_grad_bufs *g, void *dx, const void *dy, const void *x, const void *gu,
                        const void *act, const void *w_gate_up, const void *w_down, int64_t n, int64_t inner,
                        dsarl_error *err)
{
    int64_t C = m->cfg.hidden_size;
    DSARL_TRY(glm5_linear_dinput(m, g->dact, dy, w_down, n, inner, C, 0.0f, err));
    DSARL_TRY(glm5_linear_dweight(m, w_down, dy, act, n, inner, C, err));
    DSARL_TRY(m->dev_ops->swiglu_backward(m->dev, g->dgu, g->dact, gu, n, inner, err));
    DSARL_TRY(glm5_linear_dweight(m, w_gate_up, g->dgu, x, n, C, 2 * inner, err));
    return glm5_linear_dinput(m, dx, g->dgu, w_gate_up, n, C, 2 * inner, 1.0f, err);
}

// The gradient dy (T_sp, C) of this rank's rows gathered over tp into (T, C) (itself without sp).
static int gather_dy(glm5_pass *p, glm5_grad_bufs *g, const void *dy, const void **full, dsarl_error *err)
{
    *full = p->sp ? g->dfull : dy;
    return p->sp ? glm5_sp_gather(p, g->dfull, dy, p->m->cfg.hidden_size, err) : DSARL_OK;
}

// Backward of a tensor-parallel SwiGLU MLP (column-parallel gate/up, row-parallel down) on every row: from the
// local rows' dy (T_sp, C), dx (T_sp, C) accumulated with this rank's block of the sum over tp of the partial input
// gradients.
static int mlp_backward_tp(glm5_pass *p, glm5_grad_bufs *g, void *dx, const void *dy, const void *x, const void *gu,
                           const void *act, const void *w_gate_up, const void *w_down, int64_t inner,
                           dsarl_error *err)
{
    dsarl_model *m = p->m;
    int64_t C = m->cfg.hidden_size;
    if (!p->sp)
        return mlp_backward(m, g, dx, dy, x, gu, act, w_gate_up, w_down, p->T, inner, err);
    const void *dy_full;
    DSARL_TRY(gather_dy(p, g, dy, &dy_full, err));
    DSARL_TRY(m->dev_ops->zero(m->dev, g->dpart, (size_t)(p->T * C) * m->elem, err));
    DSARL_TRY(mlp_backward(m, g, g->dpart, dy_full, x, gu, act, w_gate_up, w_down, p->T, inner, err));
    DSARL_TRY(glm5_sp_reduce(p, g->dtmp, g->dpart, C, err));
    return m->dev_ops->add(m->dev, dx, dx, g->dtmp, p->T_sp * C, err);
}

// MoE layer backward: the shared experts, then the routed experts and the router (glm5_moe.c, on this rank's rows:
// p->T is T_sp around the call, as in the forward); dh2 accumulates.
static int moe_backward(glm5_pass *p, glm5_grad_bufs *g, const glm5_layer_acts *a, const glm5_layer *L,
                        const void *dy, void *dh2, dsarl_error *err)
{
    if (L->mlp_gate_up) {
        glm5_scope(p->m, "moe.shared.bwd");
        DSARL_TRY(mlp_backward_tp(p, g, dh2, dy, a->h2_full, a->sh_gate_up, a->sh_act, L->mlp_gate_up, L->mlp_down,
                                  L->mlp_inner, err));
    }
    int64_t T = p->T;
    p->T = p->T_sp;
    glm5_scope(p->m, "moe.bwd");
    int rc = glm5_moe_backward(p, g, a, L, dy, dh2, err);
    p->T = T;
    return rc;
}

// Absorbed form, from dattn (T, H*v): dq (T, H*qk), dlatn (T, kv_lora) = d rmsnorm(c_kv), the rope key's gradient in
// dkv[:, kv_lora:], and the kv_b_proj gradients (W_UV through the latent output, W_UK through q_abs).
static int absorbed_backward(glm5_pass *p, glm5_grad_bufs *g, const glm5_layer_acts *a, const glm5_layer *L,
                             dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t T = p->T, H = glm5_local_heads(m), nope = c->qk_nope_head_dim;
    int64_t rope = c->qk_rope_head_dim, kvr = c->kv_lora_rank, v = c->v_head_dim;
    int64_t dqk = kvr + rope;
    // attn_h = out_latent_h W_UV_h^T, every head in one batched GEMM over head-major copies (glm5_heads.c);
    // W_UV_h (v, kv_lora) are the last v rows of head h in kv_b_proj, (nope + v) * kv_lora apart
    const void *w_uv = glm5_at(m, L->kv_b_proj, nope * kvr), *w_uk = L->kv_b_proj;
    int64_t w_stride = (nope + v) * kvr;
    DSARL_TRY(glm5_head_gather(p, GLM5_MAP_V_HM, g->s1, g->dattn, err));             // (H, T, v)
    DSARL_TRY(glm5_head_gather(p, GLM5_MAP_LATENT_HM, g->s2, a->out_latent, err));   // (H, T, kv_lora)
    DSARL_TRY(d->gemm_strided_batched(m->dev, true, false, v, kvr, T, 1.0f, g->s1, T * v, g->s2, T * kvr, 1.0f,
                                      glm5_grad_of(m, w_uv), w_stride, H, err));
    DSARL_TRY(d->gemm_strided_batched(m->dev, false, false, T, kvr, v, 1.0f, g->s1, T * v, w_uv, w_stride, 0.0f,
                                      g->s3, T * kvr, H, err));
    DSARL_TRY(glm5_head_gather(p, GLM5_MAP_LATENT_TM, g->dout_latent, g->s3, err));
    // under cp the keys are every rank's (glm5_cp.c): their gradients go back to their owners
    void *dkv = p->cp ? g->dkv_all : g->dkv;
    glm5_scope(m, "attention.core.bwd");
    DSARL_TRY(d->zero(m->dev, dkv, (size_t)(p->batch.n_keys * dqk) * m->elem, err));
    dsarl_dsa_attention_inputs at = {.struct_size = sizeof(at), .q = a->q_abs, .kv = p->cp ? a->kv_all : a->kv,
                                     .n_heads = (int32_t)H, .d_qk = (int32_t)dqk, .d_v = (int32_t)kvr,
                                     .softmax_scale = (float)c->softmax_scale};
    DSARL_TRY(m->dsa_ops->sparse_mla_backward(m->dsa, &p->batch, &at, a->topk, p->topk_width, a->out_latent, a->lse,
                                              g->dout_latent, g->dq_abs, dkv, err));
    if (p->cp)
        DSARL_TRY(glm5_cp_scatter_keys(p, g->dkv, g->dkv_all, dqk, err));
    glm5_scope(m, "attention.proj.bwd");
    // q_abs_h = [q_nope_h W_UK_h | q_rope_h]: dq = [d q_abs_h W_UK_h^T | d q_rope_h], assembled by one gather from
    // s3 = [(H, T, nope) | (T, H, rope)]
    DSARL_TRY(glm5_head_gather(p, GLM5_MAP_DQ_ABS_HM, g->s1, g->dq_abs, err));       // (H, T, kv_lora)
    DSARL_TRY(glm5_head_gather(p, GLM5_MAP_Q_NOPE_HM, g->s2, a->q, err));            // (H, T, nope)
    DSARL_TRY(d->gemm_strided_batched(m->dev, true, false, nope, kvr, T, 1.0f, g->s2, T * nope, g->s1, T * kvr, 1.0f,
                                      glm5_grad_of(m, w_uk), w_stride, H, err));
    DSARL_TRY(d->gemm_strided_batched(m->dev, false, true, T, nope, kvr, 1.0f, g->s1, T * kvr, w_uk, w_stride, 0.0f,
                                      g->s3, T * nope, H, err));
    DSARL_TRY(d->copy_2d(m->dev, glm5_at(m, g->s3, H * T * nope), rope, glm5_at(m, g->dq_abs, kvr), dqk, T * H, rope,
                         err));
    DSARL_TRY(glm5_head_gather(p, GLM5_MAP_DQ, g->dq, g->s3, err));
    return d->copy_2d(m->dev, g->dlatn, kvr, g->dkv, dqk, T, kvr, err);
}

// Headwise form, from dattn (T, H*v): the backend's dq (T, H*qk) directly; dk, dv back through
// [k_nope_h | v_h] = latent_norm kv_b_proj_h^T (kv_b_proj's gradient, dlatn) and k_h[nope:] = k_rope (the sum over
// heads goes to dkv[:, kv_lora:]).
static int headwise_backward(glm5_pass *p, glm5_grad_bufs *g, const glm5_layer_acts *a, const glm5_layer *L,
                             dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t T = p->T, H = glm5_local_heads(m), nope = c->qk_nope_head_dim;
    int64_t rope = c->qk_rope_head_dim, qk = c->qk_head_dim, kvr = c->kv_lora_rank, v = c->v_head_dim;
    int64_t dqk = kvr + rope;
    dsarl_dsa_headwise_inputs hw = {.struct_size = sizeof(hw), .q = a->q, .k = a->k_heads, .v = a->v_heads,
                                    .n_heads = (int32_t)H, .d_qk = (int32_t)qk, .d_v = (int32_t)v,
                                    .softmax_scale = (float)c->softmax_scale};
    glm5_scope(m, "attention.core.bwd");
    DSARL_TRY(m->dsa_ops->headwise_attention_backward(m->dsa, &p->batch, &hw, p->every_key_selected ? NULL : a->topk,
                                                      p->topk_width, a->attn, a->lse, g->dattn, g->dq, g->dk_heads,
                                                      g->dv_heads, err));
    if (p->cp) // the keys are every rank's: their gradients go back to their owners (glm5_cp.c)
        return glm5_cp_headwise_backward(p, g, a, L, err);
    glm5_scope(m, "attention.proj.bwd");
    // back to kv_b_proj's output layout (T, H, nope + v): rows (t, h) of T*H
    DSARL_TRY(d->copy_2d(m->dev, g->dkv_heads, nope + v, g->dk_heads, qk, T * H, nope, err));
    DSARL_TRY(d->copy_2d(m->dev, glm5_at(m, g->dkv_heads, nope), nope + v, g->dv_heads, v, T * H, v, err));
    DSARL_TRY(glm5_linear_dweight(m, L->kv_b_proj, g->dkv_heads, a->latent_norm, T, kvr, H * (nope + v), err));
    DSARL_TRY(glm5_linear_dinput(m, g->dlatn, g->dkv_heads, L->kv_b_proj, T, kvr, H * (nope + v), 0.0f, err));
    // the shared rope key: per token, ones (1,H) x dk (H,qk), a GEMM so the head sum accumulates in float32
    DSARL_TRY(d->gemm_strided_batched(m->dev, false, false, 1, qk, H, 1.0f, g->ones, H, g->dk_heads, H * qk, 0.0f,
                                      g->dk_sum, qk, T, err));
    return d->copy_2d(m->dev, glm5_at(m, g->dkv, kvr), dqk, glm5_at(m, g->dk_sum, nope), qk, T, rope, err);
}

// d of attention output dy (T_sp,C) -> dh1 (T_sp,C) overwritten, weight gradients accumulated. Under tp the
// attention ran on every row for this rank's heads: dy is gathered, and the input gradient of every row is a
// partial sum over heads (so are the gradients of the replicated q_a/kv_a weights, summed after the backward),
// reduced to this rank's rows.
static int attention_backward(glm5_pass *p, glm5_grad_bufs *g, const glm5_layer_acts *a, const glm5_layer *L,
                              const void *dy_local, void *dh1_local, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t T = p->T, C = c->hidden_size, H = glm5_local_heads(m), nope = c->qk_nope_head_dim;
    int64_t rope = c->qk_rope_head_dim, qk = c->qk_head_dim, kvr = c->kv_lora_rank, v = c->v_head_dim;
    int64_t dqk = kvr + rope, qr = c->q_lora_rank;
    float rs = (float)c->attention_scaling;
    const void *dy;
    glm5_scope(m, "attention.proj.bwd");
    DSARL_TRY(gather_dy(p, g, dy_local, &dy, err));
    void *dh1 = p->sp ? g->dpart : dh1_local; // (T, C)
    DSARL_TRY(glm5_linear_dinput(m, g->dattn, dy, L->o_proj, T, H * v, C, 0.0f, err));
    DSARL_TRY(glm5_linear_dweight(m, L->o_proj, dy, a->attn, T, H * v, C, err));
    if (p->form == DSARL_DSA_FORM_HEADWISE)
        DSARL_TRY(headwise_backward(p, g, a, L, err));
    else
        DSARL_TRY(absorbed_backward(p, g, a, L, err));
    glm5_scope(m, "attention.proj.bwd"); // (the cp paths leave the core's class)
    DSARL_TRY(d->rope_backward(m->dev, glm5_at(m, g->dq, nope), glm5_at(m, g->dq, nope), p->positions, m->inv_freq,
                               rs, T, H, H * qk, qk, rope, err));
    DSARL_TRY(glm5_linear_dweight(m, L->q_b_proj, g->dq, a->q_resid, T, qr, H * qk, err));
    DSARL_TRY(glm5_linear_dinput(m, g->dqr, g->dq, L->q_b_proj, T, qr, H * qk, 0.0f, err));
    DSARL_TRY(d->rmsnorm_backward(m->dev, g->dqa, glm5_grad_of(m, L->q_a_norm), g->dqr, a->qa, L->q_a_norm,
                                  a->rstd_qa, T, qr, err));
    DSARL_TRY(glm5_linear_dweight(m, L->q_a_proj, g->dqa, a->h1, T, C, qr, err));
    DSARL_TRY(glm5_linear_dinput(m, dh1, g->dqa, L->q_a_proj, T, C, qr, 0.0f, err));
    // latent: kv = [rmsnorm(c_kv) | rope(k_rope)]; both forms left d rmsnorm(c_kv) in dlatn, d k_rope in dkv
    DSARL_TRY(d->rmsnorm_backward(m->dev, g->dlat, glm5_grad_of(m, L->kv_a_norm), g->dlatn, a->latent, L->kv_a_norm,
                                  a->rstd_kv, T, kvr, err));
    DSARL_TRY(d->copy_2d(m->dev, g->dckv, dqk, g->dlat, kvr, T, kvr, err));
    DSARL_TRY(d->copy_2d(m->dev, glm5_at(m, g->dckv, kvr), dqk, glm5_at(m, g->dkv, kvr), dqk, T, rope, err));
    DSARL_TRY(d->rope_backward(m->dev, glm5_at(m, g->dckv, kvr), glm5_at(m, g->dckv, kvr), p->positions, m->inv_freq,
                               rs, T, 1, dqk, 0, rope, err));
    DSARL_TRY(glm5_linear_dweight(m, L->kv_a_proj, g->dckv, a->h1, T, C, dqk, err));
    DSARL_TRY(glm5_linear_dinput(m, dh1, g->dckv, L->kv_a_proj, T, C, dqk, 1.0f, err));
    return glm5_sp_reduce(p, dh1_local, dh1, C, err);
}

// full (T, H_all, w) = every tp rank's local (T, H, w) heads in rank order (rank r holds heads [r H, (r+1) H)): an
// all-gather (tp, T, H, w) into stage, then one strided copy per rank. w in values of dtype.
static int gather_heads(glm5_pass *p, void *full, void *stage, const void *local, int64_t H, int64_t w,
                        dsarl_dtype dtype, dsarl_error *err)
{
    dsarl_model *m = p->m;
    int32_t tp = m->shards.tp_size;
    int64_t T = p->T, u = (int64_t)(dsarl_dtype_size(dtype) / m->elem); // storage elements per value
    DSARL_TRY(dsarl_device_all_gather(m->dev_ops, m->dev, m->parallel.tp, stage, local, T * H * w, dtype, err));
    for (int32_t r = 0; r < tp; r++)
        DSARL_TRY(m->dev_ops->copy_2d(m->dev, glm5_at(m, full, r * H * w * u), tp * H * w * u,
                                      glm5_at(m, stage, r * T * H * w * u), H * w * u, T, H * w * u, err));
    return DSARL_OK;
}

// Indexer KL loss of one full layer: its per-token losses into g->ilosses row `layer` (summed by backward_pass
// after the loop, one download), its gradient (coeff / T for every token: g->idloss) into the indexer weights.
static int indexer_loss_layer(glm5_pass *p, glm5_grad_bufs *g, const glm5_layer_acts *a, const glm5_layer *L,
                              dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t T = p->T, C = c->hidden_size, H = glm5_local_heads(m), rope = c->qk_rope_head_dim;
    int64_t nI = c->index_n_heads, dI = c->index_head_dim, qr = c->q_lora_rank, dqk = c->kv_lora_rank + rope;
    float rs = (float)c->attention_scaling;
    // the loss distils the absorbed form's attention (q_abs over the latent); the headwise form keeps no q_abs, so
    // it is rebuilt here (its lse equals the absorbed one: the same logits, regrouped)
    glm5_scope(m, "indexer.loss");
    const void *q_abs = a->q_abs;
    if (p->form == DSARL_DSA_FORM_HEADWISE) {
        DSARL_TRY(glm5_absorb_queries(p, L, a->q, g->q_abs, g->s1, g->s2, err));
        q_abs = g->q_abs;
    }
    // its target sums the attention over ALL heads: under tp every rank gathers the others' heads (queries and lse)
    // and computes the same loss on the same rows, so the indexer's gradients are equal on every rank
    const float *lse = a->lse;
    if (m->shards.tp_size > 1) {
        DSARL_TRY(gather_heads(p, g->q_heads, g->q_stage, q_abs, H, dqk, m->storage, err));
        DSARL_TRY(gather_heads(p, g->lse_heads, g->lse_stage, a->lse, H, 1, DSARL_DTYPE_F32, err));
        q_abs = g->q_heads, lse = g->lse_heads, H *= m->shards.tp_size;
    }
    // under cp over every key of the batch (the same global selection as attention), the keys' gradient back to
    // their owners
    dsarl_dsa_attention_inputs at = {.struct_size = sizeof(at), .q = q_abs, .kv = p->cp ? a->kv_all : a->kv,
                                     .n_heads = (int32_t)H, .d_qk = (int32_t)dqk, .d_v = (int32_t)c->kv_lora_rank,
                                     .softmax_scale = (float)c->softmax_scale};
    dsarl_dsa_indexer_inputs in = {.struct_size = sizeof(in), .q = a->iq, .k = p->cp ? a->ik_all : a->ik,
                                   .weights = a->iw_scaled, .n_heads = (int32_t)nI, .head_dim = (int32_t)dI};
    const int32_t *indices = m->indexer_sparse_loss ? a->topk : NULL;
    DSARL_TRY(m->dsa_ops->indexer_loss_forward(m->dsa, &p->batch, &at, lse, &in, indices, p->topk_width,
                                               g->ilosses + (L - m->layers) * T, err));
    void *dik = p->cp ? g->dik_all : g->dik;
    DSARL_TRY(d->zero(m->dev, dik, (size_t)(p->batch.n_keys * dI) * m->elem, err));
    DSARL_TRY(m->dsa_ops->indexer_loss_backward(m->dsa, &p->batch, &at, lse, &in, indices, p->topk_width,
                                                g->idloss, g->diq, dik, g->iw_grad, err));
    if (p->cp)
        DSARL_TRY(glm5_cp_scatter_keys(p, g->dik, g->dik_all, dI, err));
    // weights: iw_scaled = s * (h weights_proj^T); h is detached
    DSARL_TRY(d->convert(m->dev, g->diw, m->storage, g->iw_grad, DSARL_DTYPE_F32, T * nI,
                         (float)(1.0 / sqrt((double)nI) / sqrt((double)dI)), err));
    DSARL_TRY(glm5_linear_dweight(m, L->idx_weights_proj, g->diw, a->h1, T, C, nI, err));
    // queries: iq = rope(q_resid wq_b^T); q_resid is detached
    DSARL_TRY(d->rope_backward(m->dev, g->diq, g->diq, p->positions, m->inv_freq, rs, T, nI, nI * dI, dI, rope, err));
    DSARL_TRY(glm5_linear_dweight(m, L->idx_wq_b, g->diq, a->q_resid, T, qr, nI * dI, err));
    // keys: ik = rope(layernorm(h wk^T))
    DSARL_TRY(d->rope_backward(m->dev, g->dik, g->dik, p->positions, m->inv_freq, rs, T, 1, dI, 0, rope, err));
    DSARL_TRY(d->layernorm_backward(m->dev, g->dik_raw, glm5_grad_of(m, L->idx_k_norm_w),
                                    glm5_grad_of(m, L->idx_k_norm_b), g->dik, a->ik_raw, L->idx_k_norm_w, a->ik_mean,
                                    a->ik_rstd, T, dI, err));
    return glm5_linear_dweight(m, L->idx_wk, g->dik_raw, a->h1, T, C, dI, err);
}

// Uploads the targets (T_real), checked against the vocabulary; *padded: them with -1 (ignored) at the pad rows of
// a padded pass (p->T), the array the vocab-parallel log-softmax reads.
static int upload_targets(glm5_pass *p, glm5_grad_bufs *g, const int32_t *targets, const int32_t **padded,
                          dsarl_error *err)
{
    int64_t T = p->T_real;
    for (int64_t t = 0; t < T; t++)
        if (targets[t] >= p->m->cfg.vocab_size)
            return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: target id %d at position %lld is outside the vocabulary "
                              "[0, %lld)", targets[t], (long long)t, (long long)p->m->cfg.vocab_size);
    *padded = targets;
    if (p->T != T) {
        int32_t *all;
        DSARL_TRY(glm5_pass_host_alloc(p, (size_t)p->T * sizeof(int32_t), (void **)&all, err));
        memcpy(all, targets, (size_t)T * sizeof(int32_t));
        for (int64_t t = T; t < p->T; t++)
            all[t] = -1;
        *padded = all;
    }
    return p->m->dev_ops->copy(p->m->dev, g->targets, *padded, (size_t)p->T * sizeof(int32_t),
                               DSARL_COPY_HOST_TO_DEVICE, err);
}

/* The vocab-parallel log-softmax (tp > 1): rank r holds logits z (T, V/tp) of the ids [r V/tp, (r+1) V/tp). Per row,
 * lse_r = log sum exp over the slice (from the device's own log-probs of local id 0: lse_r = z_0 - logp_0), the
 * (T) lse of every rank are all-gathered and combined in double, lse = log sum_r exp(lse_r); the rank owning the
 * target contributes z_y - lse = logp_local(y) + lse_r - lse, the others 0, all-reduced (SUM) over tp. Only (T)
 * vectors cross ranks; the (T, V) logits never do. Keeps for the backward p->vocab_rest = log sum exp of the OTHER
 * ranks' logits and p->vocab_targets (vocab_parallel_dlogits). logprobs (T) host. */
static int vocab_parallel_logprobs(glm5_pass *p, const int32_t *targets, float *logprobs, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    int32_t tp = m->shards.tp_size, me = m->shards.tp_rank;
    int64_t T = p->T, Vl = glm5_local_vocab(m), v0 = Vl * me, u = glm5_f32_units(m);
    // host: local targets (-1 where another rank owns the id), zeros, the backward's targets (vocab_parallel_dlogits:
    // the extra column V/tp where another rank owns the id) | z_0, logp_0, logp_local, every lse (tp, T)
    int32_t *ids;
    float *host, *dev;
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(3 * T) * sizeof(int32_t), (void **)&ids, err));
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)((3 + tp) * T) * sizeof(float), (void **)&host, err));
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)T * sizeof(float), (void **)&p->vocab_rest, err));
    DSARL_TRY(glm5_pass_alloc(p, (size_t)(3 * T + (4 + tp) * T) * sizeof(float), (void **)&dev, err));
    for (int64_t t = 0; t < T; t++) {
        bool mine = targets[t] >= v0 && targets[t] < v0 + Vl;
        ids[t] = mine ? (int32_t)(targets[t] - v0) : -1, ids[T + t] = 0;
        ids[2 * T + t] = targets[t] < 0 ? -1 : mine ? ids[t] : (int32_t)Vl;
    }
    int32_t *dids = (int32_t *)dev;
    p->vocab_targets = dids + 2 * T;
    float *dz = dev + 3 * T, *dlp0 = dz + T, *dlp = dz + 2 * T, *dlse = dz + 3 * T, *dall = dz + 4 * T;
    DSARL_TRY(d->copy(m->dev, dids, ids, (size_t)(3 * T) * sizeof(int32_t), DSARL_COPY_HOST_TO_DEVICE, err));
    // z_0 of every row: column 0 of the float32 logits, moved as storage elements
    DSARL_TRY(d->copy_2d(m->dev, dz, u, p->logits, Vl * u, T, u, err));
    DSARL_TRY(d->logprobs_forward(m->dev, dlp0, p->logits, dids + T, T, Vl, err));
    DSARL_TRY(d->logprobs_forward(m->dev, dlp, p->logits, dids, T, Vl, err));
    DSARL_TRY(d->copy(m->dev, host, dz, (size_t)(3 * T) * sizeof(float), DSARL_COPY_DEVICE_TO_HOST, err));
    float *z0 = host, *lp0 = host + T, *lp = host + 2 * T, *all = host + 3 * T;
    for (int64_t t = 0; t < T; t++)
        lp0[t] = z0[t] - lp0[t]; // this rank's lse
    DSARL_TRY(d->copy(m->dev, dlse, lp0, (size_t)T * sizeof(float), DSARL_COPY_HOST_TO_DEVICE, err));
    DSARL_TRY(dsarl_device_all_gather(d, m->dev, m->parallel.tp, dall, dlse, T, DSARL_DTYPE_F32, err));
    DSARL_TRY(d->copy(m->dev, all, dall, (size_t)(tp * T) * sizeof(float), DSARL_COPY_DEVICE_TO_HOST, err));
    for (int64_t t = 0; t < T; t++) {
        double top = all[t];
        for (int32_t r = 1; r < tp; r++)
            top = all[r * T + t] > top ? all[r * T + t] : top;
        double sum = 0.0, rest = 0.0;
        for (int32_t r = 0; r < tp; r++) {
            double e = exp(all[r * T + t] - top);
            sum += e, rest += r == me ? 0.0 : e;
        }
        double lse = top + log(sum);
        p->vocab_rest[t] = (float)(top + log(rest));
        lp[t] = ids[t] >= 0 ? (float)(lp[t] + (double)all[me * T + t] - lse) : 0.0f;
    }
    DSARL_TRY(d->copy(m->dev, dlp, lp, (size_t)T * sizeof(float), DSARL_COPY_HOST_TO_DEVICE, err));
    DSARL_TRY(dsarl_device_all_reduce(d, m->dev, m->parallel.tp, dlp, T, DSARL_DTYPE_F32, DSARL_REDUCE_SUM, err));
    return d->copy(m->dev, logprobs, dlp, (size_t)p->T_real * sizeof(float), DSARL_COPY_DEVICE_TO_HOST, err);
}

// logprobs (T_real) host of the pass's logits and the uploaded targets (g->targets; targets (T) on the host).
static int pass_logprobs(glm5_pass *p, glm5_grad_bufs *g, const int32_t *targets, float *logprobs, dsarl_error *err);

// The caller's tokens: the batch's, which a cp pass splits into T_local rows and a padded pass pads.
static int64_t caller_tokens(const glm5_pass *p)
{
    return p->cp ? p->cp->T_caller : p->T_real;
}

// The caller's targets uploaded and, on the LM head's stage, their log-probs (the caller's tokens, host): under cp
// this rank's rows', then all-gathered over cp into the caller's order, so every cp rank of the stage returns all of
// them (a cp group lies inside one pipeline stage; the other stages get them with glm5_stage_share_last).
static int caller_logprobs(glm5_pass *p, glm5_grad_bufs *g, const int32_t *targets, float *logprobs,
                           dsarl_error *err)
{
    float *out = logprobs;
    glm5_scope(p->m, "lm_head");
    if (p->cp) {
        DSARL_TRY(glm5_cp_local_targets(p, targets, &targets, err));
        DSARL_TRY(glm5_pass_host_alloc(p, (size_t)p->T * sizeof(float), (void **)&out, err));
    }
    const int32_t *all_targets = targets;
    DSARL_TRY(upload_targets(p, g, targets, &all_targets, err));
    if (!glm5_stage_is_last(p->m))
        return DSARL_OK;
    DSARL_TRY(pass_logprobs(p, g, all_targets, out, err));
    return p->cp ? glm5_cp_gather_rows(p, logprobs, out, 1, err) : DSARL_OK;
}

static int pass_logprobs(glm5_pass *p, glm5_grad_bufs *g, const int32_t *targets, float *logprobs, dsarl_error *err)
{
    dsarl_model *m = p->m;
    if (m->shards.tp_size > 1)
        return vocab_parallel_logprobs(p, targets, logprobs, err);
    // into dlogprobs' room: train_backward overwrites it with the caller's gradients
    DSARL_TRY(glm5_head_logprobs(p, g->dlogprobs, g->targets, err)); // chunk by chunk when chunked
    return m->dev_ops->copy(m->dev, logprobs, g->dlogprobs, (size_t)p->T_real * sizeof(float),
                            DSARL_COPY_DEVICE_TO_HOST, err);
}

/* dlogits (T, V/tp) of the vocab-parallel log-softmax from dlogprobs (T, device): d z_v = g ([v == y] - exp(z_v -
 * lse)). The device's logprobs_backward computes it over a row it normalises itself, so each row gets one more
 * column holding the other ranks' log sum exp (p->vocab_rest): the softmax of (T, V/tp + 1) is then the global
 * softmax on the local columns, and a target owned elsewhere points at the extra column (whose gradient is
 * dropped). */
static int vocab_parallel_dlogits(glm5_pass *p, glm5_grad_bufs *g, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    int64_t T = p->T, Vl = glm5_local_vocab(m), u = glm5_f32_units(m), W = Vl + 1;
    float *aug, *daug, *rest;
    DSARL_TRY(glm5_pass_alloc(p, (size_t)(2 * T * W + T) * sizeof(float), (void **)&aug, err));
    daug = aug + T * W, rest = daug + T * W;
    DSARL_TRY(d->copy(m->dev, rest, p->vocab_rest, (size_t)T * sizeof(float), DSARL_COPY_HOST_TO_DEVICE, err));
    DSARL_TRY(d->copy_2d(m->dev, aug, W * u, p->logits, Vl * u, T, Vl * u, err));
    DSARL_TRY(d->copy_2d(m->dev, aug + Vl, W * u, rest, u, T, u, err));
    DSARL_TRY(d->logprobs_backward(m->dev, daug, g->dlogprobs, aug, p->vocab_targets, T, W, err));
    return d->copy_2d(m->dev, g->dlogits, Vl * u, daug, W * u, T, Vl * u, err);
}

int glm5_forward_logprobs(dsarl_model *m, const dsarl_token_batch *batch, const int32_t *targets, float *logprobs,
                          dsarl_error *err)
{
    glm5_pass p;
    glm5_grad_bufs g = {0};
    int rc = glm5_pass_forward(m, batch, false, &p, err);
    // only the targets and log-probs of grad_bufs (the rest, dlogits (T, V) float32 among them, is the backward's)
    if (rc == 0)
        rc = alloc_targets(&p, &g, err);
    if (rc == 0)
        rc = caller_logprobs(&p, &g, targets, logprobs, err);
    if (rc == 0) // the stages in turn: every rank returns the last stage's log-probs
        rc = glm5_stage_share_last(m, logprobs, caller_tokens(&p), err);
    glm5_pass_free(&p);
    glm5_scope(m, NULL);
    return rc;
}

// dst (n) float32 device = value in the first `real` entries, 0 after them (pad rows), through one upload.
static int upload_constant(dsarl_model *m, float *dst, float value, int64_t real, int64_t n, dsarl_error *err)
{
    float *host = malloc((size_t)n * sizeof(float));
    if (!host)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory in the indexer loss");
    for (int64_t i = 0; i < n; i++)
        host[i] = i < real ? value : 0.0f;
    int rc = m->dev_ops->copy(m->dev, dst, host, (size_t)n * sizeof(float), DSARL_COPY_HOST_TO_DEVICE, err);
    free(host);
    return rc;
}

// *loss = sum over full layers (last to first, as the backward visits them) of coeff * mean_t KL(t) over the first
// `real` of T tokens (a padded pass's pad rows are not the caller's), from the per-layer rows of g->ilosses in one
// download.
static int sum_indexer_losses(dsarl_model *m, const glm5_grad_bufs *g, int64_t T, int64_t real, double *loss,
                              dsarl_error *err)
{
    int64_t L = glm5_built_layers(&m->cfg); // the MTP blocks' indexers too
    float *host = malloc((size_t)(L * T) * sizeof(float));
    if (!host)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory in the indexer loss");
    int rc = m->dev_ops->copy(m->dev, host, g->ilosses, (size_t)(L * T) * sizeof(float), DSARL_COPY_DEVICE_TO_HOST,
                              err);
    for (int64_t i = L - 1; rc == 0 && i >= 0; i--) {
        if (!m->layers[i].idx_wq_b)
            continue;
        double sum = 0.0;
        for (int64_t t = 0; t < real; t++)
            sum += host[i * T + t];
        *loss += m->indexer_loss_coeff * sum / (double)real;
    }
    free(host);
    return rc;
}

// The LM head and final norm of the last stage's backward: g->dx (T_sp, C) = the residual stream's gradient from
// dlogprobs (T_real) host; the head's and the norm's weight gradients accumulated.
static int head_backward(dsarl_model *m, glm5_pass *p, glm5_grad_bufs *g, const float *dlogprobs, dsarl_error *err)
{
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t T = p->T, Ts = p->T_sp, C = c->hidden_size, V = glm5_local_vocab(m);
    glm5_scope(m, "lm_head.bwd");
    if (p->cp) // the gradients of this rank's rows (0 at its pad rows)
        DSARL_TRY(glm5_cp_local_values(p, dlogprobs, &dlogprobs, err));
    if (T != p->T_real) // pad rows: no gradient (their targets are ignored too)
        DSARL_TRY(d->zero(m->dev, g->dlogprobs, (size_t)T * sizeof(float), err));
    DSARL_TRY(d->copy(m->dev, g->dlogprobs, dlogprobs, (size_t)p->T_real * sizeof(float), DSARL_COPY_HOST_TO_DEVICE,
                      err));
    // vocab-parallel LM head: every row's input gradient is a partial sum over the vocabulary slices
    void *dh = p->sp ? g->dpart : g->dh;
    if (m->shards.tp_size > 1) {
        DSARL_TRY(vocab_parallel_dlogits(p, g, err));
        if (p->logit_scale != 1.0f) // logits = scale * h W^T: the factor carries into dlogits of the product
            DSARL_TRY(d->convert(m->dev, g->dlogits, DSARL_DTYPE_F32, g->dlogits, DSARL_DTYPE_F32, T * V,
                                 p->logit_scale, err));
        int rc = 0;
        const void *dlogits = glm5_storage_operand(m, g->dlogits, g->dlogits_s, T * V, err, &rc);
        DSARL_TRY(rc);
        DSARL_TRY(glm5_linear_dweight(m, m->lm_head, dlogits, p->h_final, T, C, V, err));
        DSARL_TRY(glm5_linear_dinput(m, dh, dlogits, m->lm_head, T, C, V, 0.0f, err));
    } else { // whole or chunk by chunk (glm5_head.c)
        if (p->mtp && p->head_rows >= T) // the MTP depths' logits took the buffer: the trunk's again
            DSARL_TRY(glm5_head_chunk_logits(p, 0, T, err));
        DSARL_TRY(glm5_head_backward(p, g, dh, err));
    }
    DSARL_TRY(glm5_sp_reduce(p, g->dh, dh, C, err));
    if (p->mtp) // the MTP depths read h_final too: their gradient joins the head's before the final norm's
        DSARL_TRY(glm5_mtp_backward(p, g, err));
    glm5_scope(m, "norm.bwd");
    DSARL_TRY(d->rmsnorm_backward(m->dev, g->dx, glm5_grad_of(m, m->final_norm), g->dh, p->x, m->final_norm,
                                  p->rstd_final, Ts, C, err));
    return DSARL_OK;
}

int glm5_layer_backward(glm5_pass *p, glm5_grad_bufs *g, const glm5_layer_acts *a, int32_t i, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_layer *L = &m->layers[i];
    int64_t Ts = p->T_sp, C = m->cfg.hidden_size;
    // MLP branch: x_out = x_mid + mlp(rmsnorm(x_mid)); the residual stream's gradients are this rank's rows
    glm5_scope(m, "norm.bwd");
    DSARL_TRY(d->zero(m->dev, g->dh2, (size_t)(Ts * C) * m->elem, err));
    if (m->cfg.mlp_sparse[i]) {
        DSARL_TRY(moe_backward(p, g, a, L, g->dx, g->dh2, err));
    } else {
        glm5_scope(m, "mlp.dense.bwd");
        DSARL_TRY(mlp_backward_tp(p, g, g->dh2, g->dx, a->h2_full, a->gate_up, a->act, L->mlp_gate_up, L->mlp_down,
                                  L->mlp_inner, err));
    }
    glm5_scope(m, "norm.bwd");
    DSARL_TRY(d->rmsnorm_backward(m->dev, g->dtmp, glm5_grad_of(m, L->post_attention_norm), g->dh2, a->x_mid,
                                  L->post_attention_norm, a->rstd2, Ts, C, err));
    DSARL_TRY(d->add(m->dev, g->dx, g->dx, g->dtmp, Ts * C, err));
    // attention branch: x_mid = x_in + attn(rmsnorm(x_in))
    DSARL_TRY(attention_backward(p, g, a, L, g->dx, g->dh, err));
    glm5_scope(m, "norm.bwd");
    DSARL_TRY(d->rmsnorm_backward(m->dev, g->dtmp, glm5_grad_of(m, L->input_norm), g->dh, a->x_in, L->input_norm,
                                  a->rstd1, Ts, C, err));
    DSARL_TRY(d->add(m->dev, g->dx, g->dx, g->dtmp, Ts * C, err));
    if (L->idx_wq_b && m->indexer_loss_coeff > 0.0f)
        DSARL_TRY(indexer_loss_layer(p, g, a, L, err));
    return DSARL_OK;
}

// Model chunk `chunk`'s backward: from the head (the last virtual stage) or the next virtual stage's gradient, its
// layers last to first, then the gradient on to the previous virtual stage or into the embedding.
static int chunk_backward(dsarl_model *m, glm5_pass *p, glm5_grad_bufs *g, int32_t chunk, const float *dlogprobs,
                          dsarl_error *err)
{
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t T = p->T, Ts = p->T_sp, C = c->hidden_size;
    if (glm5_chunk_is_last(m, chunk))
        DSARL_TRY(head_backward(m, p, g, dlogprobs, err));
    else // the residual stream's gradient from the next pipeline stage
        DSARL_TRY(glm5_stage_grad_input(p, g->dx, err));
    int32_t first = glm5_chunk_first(&m->stage, chunk);
    for (int32_t i = glm5_chunk_end(&m->stage, chunk) - 1; i >= first; i--) {
        glm5_layer_acts *a = &p->acts[p->recompute ? 0 : glm5_stage_local_layer(&m->stage, i)];
        if (p->recompute) { // rerun the layer from its saved input (same top-k: the indexer is deterministic)
            glm5_scope(m, "norm");
            DSARL_TRY(d->copy(m->dev, p->x, p->x_saved[i], (size_t)(Ts * C) * m->elem, DSARL_COPY_DEVICE_TO_DEVICE,
                              err));
            DSARL_TRY(glm5_layer_forward(p, a, i, i > first ? p->topk_saved[i - 1] : glm5_stage_topk(p, chunk), err));
        }
        DSARL_TRY(glm5_layer_backward(p, g, a, i, err));
    }
    glm5_pass_free_chunk_acts(p, chunk); // the chunk's activations are spent
    if (!glm5_chunk_is_first(m, chunk))
        return glm5_stage_grad_output(p, g->dx, err);
    glm5_scope(m, "embedding.bwd");
    if (m->shards.tp_size == 1)
        return d->embedding_backward(m->dev, glm5_grad_of(m, m->embed), g->dx, p->tokens, T, C, err);
    // vocab-parallel: every row's gradient, kept where this rank's slice holds the id
    DSARL_TRY(glm5_sp_gather(p, g->dfull, g->dx, C, err));
    DSARL_TRY(d->scale_rows(m->dev, g->dfull, p->vocab_mask, T, C, err));
    return d->embedding_backward(m->dev, glm5_grad_of(m, m->embed), g->dfull, p->vocab_ids, T, C, err);
}

// The backward of a saved pass whose targets are on the device (g->targets), from dlogprobs (T) host: one model
// chunk, p->bwd_chunk, under a pipeline schedule, else every chunk in turn. The indexer loss is reported once the
// last chunk (chunk 0) is done.
static int backward_pass(dsarl_model *m, glm5_pass *p, glm5_grad_bufs *g, const float *dlogprobs, float *indexer_loss_out,
                         dsarl_error *err)
{
    const dsarl_device_ops *d = m->dev_ops;
    int64_t T = p->T;
    bool indexer_loss = m->indexer_loss_coeff > 0.0f;
    if (indexer_loss)
        glm5_scope(m, "indexer.loss");
    if (indexer_loss && p->cp) // the mean over the caller's tokens: coeff / T_caller at this rank's real rows
        DSARL_TRY(glm5_cp_upload_real(p, g->idloss, m->indexer_loss_coeff / (float)p->cp->T_caller, err));
    else if (indexer_loss) // its gradient: coeff / T for every query token (the mean), the same in every full
        // layer (the MTP blocks' too, whose backward runs inside the head's); 0 at the pad rows of a padded pass
        DSARL_TRY(upload_constant(m, g->idloss, m->indexer_loss_coeff / (float)p->T_real, p->T_real, T, err));
    for (int32_t last = p->staged ? p->bwd_chunk : 0; p->bwd_chunk >= last; p->bwd_chunk--)
        DSARL_TRY(chunk_backward(m, p, g, p->bwd_chunk, dlogprobs, err));
    if (p->bwd_chunk >= 0) // chunks left: their layers' indexer losses are not computed yet
        return d->synchronize(m->dev, err);
    if (indexer_loss)
        glm5_scope(m, "indexer.loss");
    double iloss = 0.0;
    if (indexer_loss && p->cp)
        DSARL_TRY(glm5_cp_sum_indexer_losses(p, g->ilosses, &iloss, err));
    else if (indexer_loss)
        DSARL_TRY(sum_indexer_losses(m, g, T, p->T_real, &iloss, err));
    if (indexer_loss && !p->staged) // every stage's layers (a pipeline schedule sums them at its end)
        DSARL_TRY(glm5_stage_sum(m, &iloss, err));
    if (indexer_loss_out)
        *indexer_loss_out = (float)iloss;
    return d->synchronize(m->dev, err);
}

/* Tensor parallelism leaves the gradients of replicated parameters partial on each rank: the norms and the router
 * saw only this rank's rows, q_a_proj/kv_a_proj and their norms only this rank's heads' share of the gradient. They
 * are summed over tp after the backward, except the indexer's: every rank computed the same whole gradient (same
 * rows, every head gathered), so those are averaged, which keeps them equal. Gradients accumulate across backward
 * calls, so what earlier calls left (already reduced, equal on every rank) is set aside first and added back after
 * the reduction. Packed in one buffer: the summed tensors, then the averaged ones (two collectives). */
static bool replicated_reduced(const glm5_param *p)
{
    return p->trainable && p->shard == GLM5_SHARD_REPLICATED;
}

static bool replicated_averaged(const glm5_param *p)
{
    return strstr(p->name, ".indexer.") != NULL;
}

// Copies every reduced replicated gradient into packed (to_pack) or back out of it; *n_sum, *n_avg: their sizes.
static int pack_replicated(dsarl_model *m, void *packed, bool to_pack, int64_t *n_sum, int64_t *n_avg,
                           dsarl_error *err)
{
    int64_t at = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t i = 0; i < m->n_params; i++) {
            const glm5_param *p = &m->params[i];
            if (!replicated_reduced(p) || replicated_averaged(p) != (pass == 1))
                continue;
            if (packed) {
                void *grad = glm5_at(m, m->grads, p->offset), *slot = glm5_at(m, packed, at);
                DSARL_TRY(m->dev_ops->copy(m->dev, to_pack ? slot : grad, to_pack ? grad : slot,
                                           (size_t)p->numel * m->elem, DSARL_COPY_DEVICE_TO_DEVICE, err));
            }
            at += p->numel;
        }
        if (pass == 0)
            *n_sum = at;
    }
    *n_avg = at - *n_sum;
    return DSARL_OK;
}

// Sets aside the replicated gradients earlier backward calls left (*saved, owned by the pass) and zeroes them.
static int replicated_grads_begin(glm5_pass *p, void **saved, dsarl_error *err)
{
    dsarl_model *m = p->m;
    int64_t n_sum, n_avg;
    glm5_scope(m, "optimizer.grad_reduce");
    DSARL_TRY(pack_replicated(m, NULL, true, &n_sum, &n_avg, err));
    DSARL_TRY(glm5_pass_alloc(p, (size_t)(2 * (n_sum + n_avg)) * m->elem, saved, err));
    DSARL_TRY(pack_replicated(m, *saved, true, &n_sum, &n_avg, err));
    void *zero = glm5_at(m, *saved, n_sum + n_avg);
    DSARL_TRY(m->dev_ops->zero(m->dev, zero, (size_t)(n_sum + n_avg) * m->elem, err));
    return pack_replicated(m, zero, false, &n_sum, &n_avg, err);
}

// Reduces this backward's replicated gradients over tp and adds back what begin set aside.
static int replicated_grads_end(glm5_pass *p, void *saved, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    int64_t n_sum, n_avg;
    glm5_scope(m, "optimizer.grad_reduce");
    DSARL_TRY(pack_replicated(m, NULL, true, &n_sum, &n_avg, err));
    void *packed = glm5_at(m, saved, n_sum + n_avg); // the second half: begin's zeroes, free again
    DSARL_TRY(pack_replicated(m, packed, true, &n_sum, &n_avg, err));
    DSARL_TRY(dsarl_device_all_reduce(d, m->dev, m->parallel.tp, packed, n_sum, m->storage, DSARL_REDUCE_SUM, err));
    DSARL_TRY(dsarl_device_all_reduce(d, m->dev, m->parallel.tp, glm5_at(m, packed, n_sum), n_avg, m->storage,
                                      DSARL_REDUCE_AVG, err));
    DSARL_TRY(d->add(m->dev, packed, packed, saved, n_sum + n_avg, err));
    DSARL_TRY(pack_replicated(m, packed, false, &n_sum, &n_avg, err));
    return d->synchronize(m->dev, err);
}

void glm5_train_free(glm5_train *tr)
{
    if (!tr)
        return;
    glm5_pass_free(&tr->p);
    free(tr);
}

void glm5_train_release(dsarl_model *m)
{
    glm5_train_free(m->train);
    m->train = NULL;
}

int glm5_train_open(dsarl_model *m, const dsarl_token_batch *batch, bool staged, glm5_train **out, dsarl_error *err)
{
    glm5_train *tr = calloc(1, sizeof *tr);
    if (!tr)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of host memory for a training pass");
    int rc = glm5_pass_begin(m, batch, true, &tr->p, err);
    tr->p.staged = staged;
    if (rc) {
        glm5_train_free(tr);
        return rc;
    }
    *out = tr;
    return DSARL_OK;
}

int glm5_train_run_forward(dsarl_model *m, glm5_train *tr, const int32_t *targets, float *logprobs,
                           dsarl_error *err)
{
    bool first_chunk = tr->p.fwd_chunk == 0;
    DSARL_TRY(glm5_pass_layers(&tr->p, err));
    if (first_chunk)
        DSARL_TRY(alloc_targets(&tr->p, &tr->g, err));
    if (tr->p.fwd_chunk < m->stage.chunks) { // a pipeline schedule runs the other model chunks later
        glm5_scope(m, NULL);
        return DSARL_OK;
    }
    DSARL_TRY(caller_logprobs(&tr->p, &tr->g, targets, logprobs, err));
    // MTP is refused under pipeline and context parallelism, so here the whole model is this rank's
    int rc = m->cfg.mtp_layers > 0 && glm5_stage_is_last(m) ? glm5_mtp_forward(&tr->p, targets, err) : DSARL_OK;
    glm5_scope(m, NULL);
    return rc;
}

int glm5_train_grad_bufs(dsarl_model *m, glm5_train *tr, dsarl_error *err)
{
    if (tr->grad_bufs_ready)
        return DSARL_OK;
    glm5_scope(m, "setup");
    if (!m->grads)
        DSARL_TRY(glm5_zero_grad(m, err));
    DSARL_TRY(alloc_grad_bufs(&tr->p, &tr->g, err));
    tr->grad_bufs_ready = true;
    return DSARL_OK;
}

int glm5_train_run_backward(dsarl_model *m, glm5_train *tr, const float *dlogprobs, float *indexer_loss,
                            dsarl_error *err)
{
    DSARL_TRY(glm5_train_grad_bufs(m, tr, err));
    void *saved = NULL;
    if (m->shards.tp_size > 1)
        DSARL_TRY(replicated_grads_begin(&tr->p, &saved, err));
    DSARL_TRY(backward_pass(m, &tr->p, &tr->g, dlogprobs, indexer_loss, err));
    int rc = m->shards.tp_size > 1 ? replicated_grads_end(&tr->p, saved, err) : DSARL_OK;
    glm5_scope(m, NULL);
    return rc;
}

int glm5_train_forward(dsarl_model *m, const dsarl_token_batch *batch, const int32_t *targets, float *logprobs,
                       dsarl_error *err)
{
    glm5_train_release(m);
    DSARL_TRY(glm5_train_open(m, batch, false, &m->train, err));
    int rc = glm5_train_run_forward(m, m->train, targets, logprobs, err);
    if (rc == 0) // the stages in turn: every rank returns the last stage's log-probs
        rc = glm5_stage_share_last(m, logprobs, caller_tokens(&m->train->p), err);
    if (rc != 0)
        glm5_train_release(m);
    return rc;
}

int glm5_train_backward(dsarl_model *m, const float *dlogprobs, float *indexer_loss, dsarl_error *err)
{
    if (!m->train)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: train_backward needs a pending train_forward (none is "
                          "pending: each train_forward is followed by at most one train_backward)");
    int rc = glm5_train_run_backward(m, m->train, dlogprobs, indexer_loss, err);
    glm5_train_release(m);
    return rc;
}

// The 1.0 backward: a training pass whose log-probs go to a scratch buffer, then its backward.
int glm5_backward(dsarl_model *m, const dsarl_token_batch *batch, const int32_t *targets, const float *dlogprobs,
                  float *indexer_loss, dsarl_error *err)
{
    float *scratch = malloc((size_t)(batch->n_tokens > 0 ? batch->n_tokens : 1) * sizeof(float));
    if (!scratch)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of host memory for %lld log-probs",
                          (long long)batch->n_tokens);
    int rc = glm5_train_forward(m, batch, targets, scratch, err);
    free(scratch);
    return rc != 0 ? rc : glm5_train_backward(m, dlogprobs, indexer_loss, err);
}
