/* glm5_plan.c: the sizes of a glm_moe_dsa config under one rank's layout (dsarl_model_ops.plan, ABI 1.3), for
 * `dsarl plan`: what only the model knows, so the core can sum stages without knowing GLM-5's shapes.
 *
 * Parameters come from the same list the model allocates (glm5_param_specs with this rank's tp/ep shard), bucketed
 * by layer and shard kind. Activation bytes per token are an estimate of what a Megatron-style MLA + MoE layer
 * keeps for its backward in bf16 (docs/plan.md lists the terms); they are not measured from glm5_backward.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "glm5_ops.h"

#define BF16 2.0
#define F32 4.0
#define I32 4.0

static dsarl_plan_shard plan_shard(glm5_shard s)
{
    switch (s) {
    case GLM5_SHARD_COLUMN: return DSARL_PLAN_COLUMN;
    case GLM5_SHARD_ROW: return DSARL_PLAN_ROW;
    case GLM5_SHARD_VOCAB: return DSARL_PLAN_VOCAB;
    case GLM5_SHARD_EXPERT: return DSARL_PLAN_EXPERT;
    default: return DSARL_PLAN_REPLICATED;
    }
}

// Bytes per token (full width, bf16 unless noted) layer i keeps for its backward without recompute: the tensors a
// Megatron MLA + MoE layer saves (inputs of every matmul and norm, the attention output and its log-sum-exp, the
// top-k indices) at the widths of the config.
static double layer_act_bytes(const glm5_config *c, int32_t i, bool indexer_loss)
{
    double C = (double)c->hidden_size, H = c->num_attention_heads;
    double e = 0.0;
    // residual stream in, input norm out, o_proj out, post-attention residual, its norm out
    e += 5.0 * C;
    // q_a out and its norm, q_b out (every head's query), kv_a out (latent + rope key) and its norm
    e += 2.0 * (double)c->q_lora_rank + H * (double)c->qk_head_dim;
    e += (double)(c->kv_lora_rank + c->qk_rope_head_dim) + (double)c->kv_lora_rank;
    // per-head keys and values from kv_b, the attention output (o_proj's input)
    e += H * (double)(c->qk_nope_head_dim + c->v_head_dim) + H * (double)c->v_head_dim;
    double bytes = e * BF16 + H * F32; // + the softmax log-sum-exp per head
    if (c->indexer_full[i]) {
        bytes += (double)c->index_topk * I32; // the selected key indices (shared layers reuse this tensor)
        if (indexer_loss) // the indexer's queries, key and head weights feed its KL loss backward
            bytes += ((double)c->index_n_heads * c->index_head_dim + c->index_head_dim + c->index_n_heads) * BF16;
    }
    if (c->mlp_sparse[i]) {
        double k = c->num_experts_per_tok, M = (double)c->moe_intermediate_size;
        double shared = M * c->n_shared_experts;
        bytes += c->n_routed_experts * F32 + k * (F32 + I32); // router logits, top-k weights and indices
        // dispatched copies of the token, expert gate/up out, SwiGLU out, expert out (for the weighted combine)
        bytes += (k * C + k * 2.0 * M + k * M + k * C) * BF16;
        bytes += (2.0 * shared + shared) * BF16; // shared expert gate/up out, SwiGLU out
    } else {
        double I = (double)c->intermediate_size;
        bytes += (2.0 * I + I) * BF16;
    }
    return bytes;
}

static int plan_family(glm5_family family, const dsarl_model_config *config, const dsarl_parallel *layout,
                       dsarl_model_plan *out, dsarl_error *err)
{
    if (out->struct_size < sizeof(dsarl_model_plan))
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: the plan struct is %u bytes, smaller than the %zu of ABI 1.3",
                          out->struct_size, sizeof(dsarl_model_plan));
    glm5_config cfg;
    DSARL_TRY(glm5_family_config(family, config, &cfg, err));
    out->n_layers = cfg.num_hidden_layers;
    DSARL_TRY(glm5_check_layout(&cfg, layout, err));
    if (out->layer_capacity < cfg.num_hidden_layers || !out->layers)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: the plan has room for %d layers, the model has %d",
                          out->layer_capacity, cfg.num_hidden_layers);
    bool indexer_loss = false;
    if (config->recipe) {
        double coeff = 0.001; // glm5_create_family's default
        DSARL_TRY(dsarl_recipe_double_or(config->recipe, "policy.megatron_cfg.model_overrides.dsa_indexer_loss_coeff",
                                         0.001, &coeff, err));
        indexer_loss = coeff > 0.0;
    }
    glm5_shards shards = GLM5_SHARDS_SINGLE;
    if (layout)
        shards = (glm5_shards){.tp_rank = layout->tp_rank, .tp_size = layout->tp_size, .ep_rank = layout->ep_rank,
                               .ep_size = layout->ep_size};
    glm5_param *specs = NULL;
    int64_t n_specs = 0, n_weights = 0;
    DSARL_TRY(glm5_param_specs(&cfg, &shards, &specs, &n_specs, &n_weights, err));

    memset(out->layers, 0, (size_t)cfg.num_hidden_layers * sizeof(out->layers[0]));
    memset(out->embedding, 0, sizeof out->embedding);
    memset(out->head, 0, sizeof out->head);
    out->total_params = out->total_buffers = 0;
    for (int64_t i = 0; i < n_specs; i++) {
        const glm5_param *p = &specs[i];
        dsarl_plan_shard k = plan_shard(p->shard);
        if (p->trainable)
            out->total_params += p->full_numel;
        else
            out->total_buffers += p->full_numel;
        if (p->layer >= 0) {
            dsarl_model_plan_layer *L = &out->layers[p->layer];
            if (p->trainable)
                L->params[k] += p->numel;
            else
                L->buffers += p->numel;
            // forward matmul FLOPs per token: every 2-D weight once, the routed experts' top-k share
            if (p->trainable && p->ndim == 3)
                L->matmul_flops += 2.0 * (double)(p->full_numel / p->full_shape[0]) * cfg.num_experts_per_tok;
            else if (p->trainable && p->ndim == 2)
                L->matmul_flops += 2.0 * (double)p->full_numel;
        } else if (strcmp(p->name, "model.embed_tokens.weight") == 0) {
            out->embedding[k] += p->numel;
        } else {
            out->head[k] += p->numel; // model.norm.weight, lm_head.weight
        }
    }
    free(specs);

    double C = (double)cfg.hidden_size;
    for (int32_t i = 0; i < cfg.num_hidden_layers; i++) {
        dsarl_model_plan_layer *L = &out->layers[i];
        L->act_bytes = layer_act_bytes(&cfg, i, indexer_loss);
        // full recompute keeps the layer input, and (as glm5's training pass does) every layer's top-k indices, so
        // the rerun forward skips the indexer and selects the same keys
        L->act_bytes_recompute = C * BF16 + (double)cfg.index_topk * I32;
        // the MLA latent and rope key (shared by every head, so each TP rank caches it whole), and on layers that
        // run their indexer its key
        L->cache_bytes = (double)(cfg.kv_lora_rank + cfg.qk_rope_head_dim) * BF16 +
                         (cfg.indexer_full[i] ? (double)cfg.index_head_dim * BF16 : 0.0);
        // the token's top-k copies out and the expert outputs back
        L->dispatch_bytes = cfg.mlp_sparse[i] ? 2.0 * cfg.num_experts_per_tok * C * BF16 : 0.0;
        // any layer may start a stage: one starting on an IndexShare "shared" layer receives the top-k of the full
        // layer before it with its input (glm5_pipeline.c), which Megatron refuses instead
        L->stage_start_ok = 1;
        L->stage_in_topk = i > 0 && !cfg.indexer_full[i] ? cfg.index_topk : 0;
    }
    out->vocab_size = cfg.vocab_size;
    out->n_experts = cfg.n_routed_experts;
    out->experts_per_token = cfg.num_experts_per_tok;
    out->n_heads = cfg.num_attention_heads;
    out->stage_io_bytes = C * BF16;
    out->logits_bytes = (double)cfg.vocab_size * (F32 + F32); // fp32 logits and their gradient
    out->stage_start_rule = NULL;
    int32_t full = glm5_config_full_layers(&cfg), sparse = 0;
    for (int32_t i = 0; i < cfg.num_hidden_layers; i++)
        sparse += cfg.mlp_sparse[i];
    snprintf(out->summary, sizeof out->summary,
             "%d layers (%d MoE, %d running their indexer), hidden %lld, %d heads, %d routed experts (top %d), vocab "
             "%lld", cfg.num_hidden_layers, sparse, full, (long long)cfg.hidden_size, cfg.num_attention_heads,
             cfg.n_routed_experts, cfg.num_experts_per_tok, (long long)cfg.vocab_size);
    return DSARL_OK;
}

int glm5_plan_51(const dsarl_model_config *config, const dsarl_parallel *layout, dsarl_model_plan *out,
                 dsarl_error *err)
{
    return plan_family(GLM5_FAMILY_51, config, layout, out, err);
}

int glm5_plan_52(const dsarl_model_config *config, const dsarl_parallel *layout, dsarl_model_plan *out,
                 dsarl_error *err)
{
    return plan_family(GLM5_FAMILY_52, config, layout, out, err);
}
