/* glm5_moe.c: the routed experts of a MoE layer (router, top-k routing, grouped expert GEMMs, weighted combine)
 * and their backward. The shared experts are an ordinary MLP beside them (glm5_forward.c / glm5_backward.c).
 *
 * Tokens are grouped by expert on the host (the counts decide the GEMM shapes); the routing decided in the forward
 * (route_idx, rows, slots) is kept in the layer's activations and reused by the backward, so both see one routing. */
#include <stdlib.h>
#include <string.h>
#include "glm5_pass.h"

int glm5_moe_forward(glm5_pass *p, glm5_layer_acts *a, const glm5_layer *L, void *y, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t T = p->T, C = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    int64_t I = c->moe_intermediate_size, N = T * K;
    // router logits, bias and weights in float32 whatever the storage (transformers routes in fp32): a bf16 logit
    // or bias would move top-k near-ties
    DSARL_TRY(d->gemm_f32out(m->dev, false, true, T, E, C, 1.0f, a->h2, L->router, 0.0f, a->router_logits, err));
    DSARL_TRY(d->moe_route_forward(m->dev, a->route_idx, a->route_w, a->router_probs, a->router_logits,
                                   L->router_bias32, T, E, (int32_t)K, c->n_group, c->topk_group, c->norm_topk_prob,
                                   (float)c->routed_scaling_factor, err));
    // group (token, slot) pairs by expert on the host: the counts decide the GEMM shapes. One download (the expert
    // ids) and one upload (rows, slot, slot_inv: one block) per layer, each a wait for the device.
    int64_t R = glm5_moe_rows_cap(c, T);
    int32_t *idx, *rows;
    int64_t *fill;
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)N * sizeof(int32_t), (void **)&idx, err));
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(2 * R + N) * sizeof(int32_t), (void **)&rows, err));
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)E * sizeof(int64_t), (void **)&fill, err));
    DSARL_TRY(d->copy(m->dev, idx, a->route_idx, (size_t)N * sizeof(int32_t), DSARL_COPY_DEVICE_TO_HOST, err));
    int32_t *slot = rows + R, *slot_inv = rows + 2 * R;
    int64_t *count = a->count, largest = 0;
    memset(count, 0, (size_t)(E + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < N; i++)
        count[idx[i] + 1]++;
    for (int64_t e = 0; e < E; e++) {
        largest = count[e + 1] > largest ? count[e + 1] : largest;
        count[e + 1] += count[e]; // count[e] = first row of expert e
    }
    // small or balanced groups (glm5_moe_pad): expert e's rows at e * pad, the rest of its pad rows read token 0
    // with weight 0 (route_w[N]), so one batched GEMM covers every expert
    a->moe_pad = glm5_moe_pad(m, T, largest);
    a->moe_rows = a->moe_pad ? E * a->moe_pad : N;
    for (int64_t e = 0; e < E; e++)
        fill[e] = a->moe_pad ? e * a->moe_pad : count[e];
    for (int64_t r = 0; r < a->moe_rows; r++)
        rows[r] = 0, slot[r] = (int32_t)N;
    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < K; k++) {
            int64_t r = fill[idx[t * K + k]]++;
            rows[r] = (int32_t)t;
            slot[r] = (int32_t)(t * K + k);
            slot_inv[t * K + k] = (int32_t)r;
        }
    DSARL_TRY(d->copy(m->dev, a->rows, rows, (size_t)(2 * R + N) * sizeof(int32_t), DSARL_COPY_HOST_TO_DEVICE,
                      err));
    // row_scale[r] = route_w[slot[r]] on the device: a gather of float32 values moved as rows of 4 bytes (one or
    // two storage elements), a bit copy
    int64_t rows_used = a->moe_rows, pad = a->moe_pad;
    DSARL_TRY(d->gather_rows(m->dev, a->row_scale, a->route_w, a->slot, rows_used, glm5_f32_units(m), err));
    DSARL_TRY(d->gather_rows(m->dev, a->expert_in, a->h2, a->rows, rows_used, C, err));
    if (pad)
        DSARL_TRY(d->gemm_strided_batched(m->dev, false, true, pad, 2 * I, C, 1.0f, a->expert_in, pad * C,
                                          L->experts_gate_up, 2 * I * C, 0.0f, a->gate_up, pad * 2 * I, E, err));
    for (int64_t e = 0; e < E && !pad; e++) {
        int64_t first = count[e], n = count[e + 1] - count[e];
        if (n > 0)
            DSARL_TRY(glm5_linear(m, glm5_at(m, a->gate_up, first * 2 * I), glm5_at(m, a->expert_in, first * C),
                                  glm5_at(m, L->experts_gate_up, e * 2 * I * C), n, C, 2 * I, err));
    }
    DSARL_TRY(d->swiglu_forward(m->dev, a->act, a->gate_up, rows_used, I, err));
    if (pad)
        DSARL_TRY(d->gemm_strided_batched(m->dev, false, true, pad, C, I, 1.0f, a->act, pad * I, L->experts_down,
                                          C * I, 0.0f, a->expert_out, pad * C, E, err));
    for (int64_t e = 0; e < E && !pad; e++) {
        int64_t first = count[e], n = count[e + 1] - count[e];
        if (n > 0)
            DSARL_TRY(glm5_linear(m, glm5_at(m, a->expert_out, first * C), glm5_at(m, a->act, first * I),
                                  glm5_at(m, L->experts_down, e * C * I), n, I, C, err));
    }
    DSARL_TRY(d->zero(m->dev, y, (size_t)(T * C) * m->elem, err));
    DSARL_TRY(d->scatter_add_rows(m->dev, y, a->expert_out, a->rows, a->row_scale, rows_used, C, err));
    return DSARL_OK;
}

int glm5_moe_backward(glm5_pass *p, glm5_grad_bufs *g, const glm5_layer_acts *a, const glm5_layer *L,
                        const void *dy, void *dh2, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t T = p->T, C = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    int64_t I = c->moe_intermediate_size, N = T * K;
    // routed rows: y[t] += w_r * expert_out_r  ->  d expert_out_r = w_r dy[t], d w_r = <dy[t], expert_out_r>;
    // padding rows (a->moe_pad: one batched GEMM per product) have w_r = 0, so their gradients are zero and add
    // nothing to the weight gradients or to dh2
    int64_t R = a->moe_rows, pad = a->moe_pad;
    DSARL_TRY(d->gather_rows(m->dev, g->dexp, dy, a->rows, R, C, err));
    DSARL_TRY(d->row_dot(m->dev, g->dscale, g->dexp, a->expert_out, R, C, err));
    DSARL_TRY(d->scale_rows(m->dev, g->dexp, a->row_scale, R, C, err));
    if (pad) {
        DSARL_TRY(d->gemm_strided_batched(m->dev, false, false, pad, I, C, 1.0f, g->dexp, pad * C, L->experts_down,
                                          C * I, 0.0f, g->dact, pad * I, E, err));
        DSARL_TRY(d->gemm_strided_batched(m->dev, true, false, C, I, pad, 1.0f, g->dexp, pad * C, a->act, pad * I,
                                          1.0f, glm5_grad_of(m, L->experts_down), C * I, E, err));
    }
    for (int64_t e = 0; e < E && !pad; e++) {
        int64_t first = a->count[e], n = a->count[e + 1] - a->count[e];
        if (n == 0)
            continue;
        const void *w_down = glm5_at(m, L->experts_down, e * C * I);
        DSARL_TRY(d->gemm(m->dev, false, false, n, I, C, 1.0f, glm5_at(m, g->dexp, first * C), w_down, 0.0f,
                          glm5_at(m, g->dact, first * I), err));
        DSARL_TRY(d->gemm(m->dev, true, false, C, I, n, 1.0f, glm5_at(m, g->dexp, first * C),
                          glm5_at(m, a->act, first * I), 1.0f, glm5_grad_of(m, w_down), err));
    }
    DSARL_TRY(d->swiglu_backward(m->dev, g->dgu, g->dact, a->gate_up, R, I, err));
    if (pad) {
        DSARL_TRY(d->gemm_strided_batched(m->dev, true, false, 2 * I, C, pad, 1.0f, g->dgu, pad * 2 * I, a->expert_in,
                                          pad * C, 1.0f, glm5_grad_of(m, L->experts_gate_up), 2 * I * C, E, err));
        DSARL_TRY(d->gemm_strided_batched(m->dev, false, false, pad, C, 2 * I, 1.0f, g->dgu, pad * 2 * I,
                                          L->experts_gate_up, 2 * I * C, 0.0f, g->dxin, pad * C, E, err));
    }
    for (int64_t e = 0; e < E && !pad; e++) {
        int64_t first = a->count[e], n = a->count[e + 1] - a->count[e];
        if (n == 0)
            continue;
        const void *w_gu = glm5_at(m, L->experts_gate_up, e * 2 * I * C);
        DSARL_TRY(d->gemm(m->dev, true, false, 2 * I, C, n, 1.0f, glm5_at(m, g->dgu, first * 2 * I),
                          glm5_at(m, a->expert_in, first * C), 1.0f, glm5_grad_of(m, w_gu), err));
        DSARL_TRY(d->gemm(m->dev, false, false, n, C, 2 * I, 1.0f, glm5_at(m, g->dgu, first * 2 * I), w_gu, 0.0f,
                          glm5_at(m, g->dxin, first * C), err));
    }
    DSARL_TRY(d->scatter_add_rows(m->dev, dh2, g->dxin, a->rows, NULL, R, C, err));
    // routing weights back to their (token, slot), then through the router: droute_w[t*K + k] = dscale[its row],
    // a gather of float32 values on the device (no round trip through the host)
    DSARL_TRY(d->gather_rows(m->dev, g->droute_w, g->dscale, a->slot_inv, N, glm5_f32_units(m), err));
    DSARL_TRY(d->moe_route_backward(m->dev, g->drouter, g->droute_w, a->route_idx, a->router_probs, T, E,
                                    (int32_t)K, c->norm_topk_prob, (float)c->routed_scaling_factor, err));
    int rc = 0;
    const void *drouter = glm5_storage_operand(m, g->drouter, g->drouter_s, T * E, err, &rc);
    DSARL_TRY(rc);
    DSARL_TRY(glm5_linear_dweight(m, L->router, drouter, a->h2, T, C, E, err));
    return glm5_linear_dinput(m, dh2, drouter, L->router, T, C, E, 1.0f, err);
}

