/* glm5_config.h: the glm_moe_dsa configuration, with the same field names and derivations as transformers'
 * GlmMoeDsaConfig (indexer_types from index_topk_pattern or index_topk_freq/index_skip_topk_offset,
 * mlp_layer_types from first_k_dense_replace, YaRN attention scaling from rope_parameters). */
#ifndef DSARL_GLM5_CONFIG_H
#define DSARL_GLM5_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <jansson.h>
#include "dsarl/error.h"
#include "dsarl/recipe.h"

#define GLM5_MAX_LAYERS 1024

typedef struct glm5_config {
    int64_t vocab_size, hidden_size, intermediate_size, moe_intermediate_size;
    int32_t num_hidden_layers, num_attention_heads;
    int64_t q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    int32_t n_routed_experts, n_shared_experts, num_experts_per_tok, n_group, topk_group;
    bool norm_topk_prob, tie_word_embeddings;
    double routed_scaling_factor, rms_norm_eps;
    int32_t index_topk, index_head_dim, index_n_heads;
    int64_t max_position_embeddings;
    // rope_parameters
    char rope_type[32];
    double rope_theta, rope_factor, rope_mscale, rope_mscale_all_dim, rope_beta_fast, rope_beta_slow;
    int64_t rope_original_max_position;
    // derived, per layer: indexer_full[i] (1 = "full", 0 = "shared"), mlp_sparse[i] (1 = MoE, 0 = dense MLP)
    unsigned char indexer_full[GLM5_MAX_LAYERS], mlp_sparse[GLM5_MAX_LAYERS];
    int32_t first_k_dense_replace;
    int32_t num_nextn_predict_layers; // MTP layers in the checkpoint (saves carry the ones not built)
    int32_t mtp_layers;               // MTP depths built and trained (policy.megatron_cfg.mtp_num_layers), 0: off;
                                      // layer num_hidden_layers + k is depth k + 1 (glm5_mtp.c)
    bool mtp_own_embed, mtp_own_head;  // the trained depths have their own embed_tokens / shared_head.head copies
                                      // (DeepSeek-V3 releases), else they share the trunk's (GLM-5)
    // derived scalars
    int64_t qk_head_dim;       // nope + rope
    double softmax_scale;      // qk_head_dim^-0.5, times mscale^2 under YaRN with mscale_all_dim
    double attention_scaling;  // cos/sin multiplier of the rotary embedding (1 for "default")
} glm5_config;

/* Decoder blocks the model builds: the trunk's layers, then the MTP depths' blocks. */
static inline int32_t glm5_built_layers(const glm5_config *cfg)
{
    return cfg->num_hidden_layers + cfg->mtp_layers;
}

/* Turns on training of the first `layers` MTP depths (policy.megatron_cfg.mtp_num_layers; 0 leaves cfg as it is):
 * each depth's block is a full-indexer DSA layer whose MLP follows first_k_dense_replace like the trunk's. Refuses,
 * in one sentence naming `where`, a checkpoint without MTP layers or fewer than asked for. */
int glm5_config_enable_mtp(glm5_config *cfg, int64_t layers, const char *where, dsarl_error *err);

/* Fills cfg from an HF config object (config.json or the recipe's inline map); `where` prefixes errors
 * ("DIR/config.json"). Refuses unknown indexer types, a shared first layer, and unsupported options. */
int glm5_config_from_json(glm5_config *cfg, const json_t *root, const char *where, dsarl_error *err);

/* Converts a recipe map node (policy.model_config) to a JSON object; *out is a new reference. */
int glm5_recipe_node_to_json(const dsarl_node *node, json_t **out, dsarl_error *err);

/* Builds the config from the recipe: policy.model_config (HF keys) with policy.hf_config_overrides on top. */
int glm5_config_from_recipe(glm5_config *cfg, const dsarl_node *recipe, dsarl_error *err);

/* Writes cfg as an HF config.json object transformers' GlmMoeDsaConfig accepts; *out is a new reference. */
int glm5_config_to_json(const glm5_config *cfg, json_t **out, dsarl_error *err);

/* Rotary inverse frequencies (rope_dim/2 values) for cfg, as transformers computes them. */
void glm5_rope_inv_freq(const glm5_config *cfg, float *inv_freq);

/* Number of layers whose indexer is "full". */
int32_t glm5_config_full_layers(const glm5_config *cfg);

#endif /* DSARL_GLM5_CONFIG_H */
