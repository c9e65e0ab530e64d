/* generation_recipes.h: the two small random-init models the generation suites run (check_generation,
 * check_generation_paged, check_glm5_moe_group), with byte-tokenizer vocabularies and prompts longer than their
 * index_topk.
 * Header-only: each suite is its own executable. */
#ifndef DSARL_TEST_GENERATION_RECIPES_H
#define DSARL_TEST_GENERATION_RECIPES_H

// IndexShare (F S F S), grouped routing, a dense first layer and top-k 3; vocab of the byte tokenizer
static const char *const recipe_52 =
    "policy:\n"
    "  model_config:\n"
    "    vocab_size: 260\n    hidden_size: 32\n    intermediate_size: 24\n    moe_intermediate_size: 8\n"
    "    num_hidden_layers: 4\n    num_attention_heads: 2\n    num_key_value_heads: 2\n    q_lora_rank: 12\n"
    "    kv_lora_rank: 8\n    qk_nope_head_dim: 4\n    qk_rope_head_dim: 4\n    v_head_dim: 6\n"
    "    n_routed_experts: 8\n    num_experts_per_tok: 2\n    n_group: 2\n    topk_group: 1\n    index_topk: 3\n"
    "    index_head_dim: 8\n    index_n_heads: 3\n    first_k_dense_replace: 1\n    index_topk_pattern: FSFS\n"
    "    n_shared_experts: 1\n    initializer_range: 0.3\n";
// every layer runs its indexer (glm5.1), top-k 4, dense attention off
static const char *const recipe_51 =
    "policy:\n"
    "  model_config:\n"
    "    vocab_size: 260\n    hidden_size: 24\n    intermediate_size: 16\n    moe_intermediate_size: 8\n"
    "    num_hidden_layers: 3\n    num_attention_heads: 3\n    num_key_value_heads: 3\n    q_lora_rank: 8\n"
    "    kv_lora_rank: 8\n    qk_nope_head_dim: 4\n    qk_rope_head_dim: 4\n    v_head_dim: 4\n"
    "    n_routed_experts: 4\n    num_experts_per_tok: 2\n    index_topk: 4\n"
    "    index_head_dim: 8\n    index_n_heads: 2\n    first_k_dense_replace: 1\n"
    "    n_shared_experts: 1\n    initializer_range: 0.3\n";

#endif /* DSARL_TEST_GENERATION_RECIPES_H */
