/* glm5_flops.c: model FLOPs of a glm_moe_dsa pass (dsarl_model_ops.flops), for benchmarks and MFU.
 *
 *   forward  = 2 * N_lm * T          N_lm = matmul weights a token passes through: attention projections, dense
 *                                    MLPs, router, shared experts, top_k of n_routed experts (their share of the
 *                                    fused expert tensors), LM head; the embedding lookup and norms do no matmul
 *            + 2 * N_idx * T         the indexer projections (outside the LM graph: forward only)
 *            + L * 2 * H * (d_qk + d_v) * sum_t sel(t)
 *                                    attention in the per-head form over the selected keys only:
 *                                    sel(t) = min(position + 1, index_topk) per query
 *            + L_full * 2 * nI * dI * sum_t (position + 1)
 *                                    indexer scores over every causal key, on the layers that run it
 *   backward = 4 * N_lm * T + 2 * L * 2 * H * (d_qk + d_v) * sum_t sel(t)
 *                                    twice the LM and attention matmuls; the indexer is not differentiated by the LM
 *                                    loss (its KL loss is not counted)
 * Trained MTP depths (policy.megatron_cfg.mtp_num_layers, glm5_mtp.c) count as D more full layers in L and L_full,
 * their eh_proj and block weights in N_lm, and one more LM-head pass each (the shared head's V x C again, or their
 * own copy's). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "glm5_ops.h"

static const char formula[] =
    "FLOPs/step = 6*N_lm*T + 2*N_idx*T + 3*L*2*H*(d_qk+d_v)*sum_t min(pos+1, index_topk) + L_full*2*nI*dI*sum_t "
    "(pos+1)  (N_lm: matmul weights per token, top_k of the routed experts, embedding excluded; N_idx: indexer "
    "projections; L_full: layers running their indexer; trained MTP depths add their blocks to L and L_full, their "
    "weights and one LM-head pass each to N_lm)";

// sum over the queries of one sequence of len tokens of min(position + 1, cap) (cap <= 0: no cap).
static double causal_pairs(int64_t len, int64_t cap)
{
    if (cap <= 0 || cap >= len)
        return (double)len * (double)(len + 1) / 2.0;
    return (double)cap * (double)(cap + 1) / 2.0 + (double)(len - cap) * (double)cap;
}

static int flops_family(glm5_family family, const dsarl_model_config *config, const dsarl_token_batch *batch,
                        dsarl_model_flops *out, dsarl_error *err)
{
    glm5_config cfg;
    DSARL_TRY(glm5_family_config(family, config, &cfg, err));
    float mtp_scale;
    DSARL_TRY(glm5_mtp_configure(&cfg, config->recipe, config->parallel, config->model_dir, &mtp_scale, err));
    glm5_param *specs = NULL;
    int64_t n_params = 0, n_weights = 0;
    DSARL_TRY(glm5_param_specs(&cfg, NULL, &specs, &n_params, &n_weights, err));
    double lm = 0.0, idx = 0.0, embed = 0.0;
    for (int64_t i = 0; i < n_params; i++) {
        const glm5_param *p = &specs[i];
        if (strcmp(p->name, "model.embed_tokens.weight") == 0)
            embed = (double)p->numel;
        if (!p->trainable || p->ndim < 2 || strstr(p->name, "embed_tokens.weight"))
            continue; // norms, biases, buffers and the embedding lookups (an MTP depth's copy too): no matmul
        if (strstr(p->name, ".indexer."))
            idx += (double)p->numel;
        else if (strstr(p->name, ".mlp.experts.") && p->ndim == 3)
            lm += (double)(p->numel / p->shape[0]) * cfg.num_experts_per_tok;
        else
            lm += (double)p->numel;
    }
    free(specs);
    if (!cfg.mtp_own_head) // every MTP depth passes through the shared LM head once more
        lm += (double)cfg.mtp_layers * (double)cfg.vocab_size * (double)cfg.hidden_size;
    double layers = (double)glm5_built_layers(&cfg), full = (double)(glm5_config_full_layers(&cfg) + cfg.mtp_layers);
    double T = (double)batch->n_tokens, sel = 0.0, causal = 0.0;
    for (int32_t b = 0; b < batch->n_sequences; b++) {
        int64_t len = batch->cu_seqlens[b + 1] - batch->cu_seqlens[b];
        sel += causal_pairs(len, cfg.index_topk);
        causal += causal_pairs(len, 0);
    }
    double attn = layers * 2.0 * cfg.num_attention_heads * (double)(cfg.qk_head_dim + cfg.v_head_dim) * sel;
    double scores = full * 2.0 * cfg.index_n_heads * cfg.index_head_dim * causal;
    out->forward = 2.0 * lm * T + 2.0 * idx * T + attn + scores;
    out->backward = 4.0 * lm * T + 2.0 * attn;
    out->formula = formula;
    if (out->struct_size >= offsetof(dsarl_model_flops, summary) + sizeof(out->summary)) {
        out->matmul_params_per_token = (int64_t)lm;
        out->indexer_params = (int64_t)idx;
        out->embedding_params = (int64_t)embed;
        snprintf(out->summary, sizeof out->summary, "%" PRId64 " layers (%" PRId64 " running their indexer), %" PRId64
                 " heads x (%" PRId64 " + %" PRId64 "), top %" PRId64 " of %" PRId64 " experts, index_topk %" PRId64
                 "%s", (int64_t)layers, (int64_t)full,
                 (int64_t)cfg.num_attention_heads, (int64_t)cfg.qk_head_dim, (int64_t)cfg.v_head_dim,
                 (int64_t)cfg.num_experts_per_tok, (int64_t)cfg.n_routed_experts, (int64_t)cfg.index_topk,
                 cfg.mtp_layers > 0 ? " (MTP depths included)" : "");
    }
    return DSARL_OK;
}

int glm5_flops_51(const dsarl_model_config *config, const dsarl_token_batch *batch, dsarl_model_flops *out,
                  dsarl_error *err)
{
    return flops_family(GLM5_FAMILY_51, config, batch, out, err);
}

int glm5_flops_52(const dsarl_model_config *config, const dsarl_token_batch *batch, dsarl_model_flops *out,
                  dsarl_error *err)
{
    return flops_family(GLM5_FAMILY_52, config, batch, out, err);
}
