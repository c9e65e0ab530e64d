/* glm5_cache.h: the KV cache of cached inference (generation). Internal to models/glm5.
 *
 * Per layer and per cached token it holds what the DSA ops read as keys, nothing expanded: the MLA latent
 * kv = [rmsnorm(c_kv) | rope(k_rope)] (kv_lora + rope values, the absorbed-form key AND value) and, on layers whose
 * indexer is "full", the indexer key (index_head_dim, after LayerNorm and RoPE). Shared (IndexShare) layers keep no
 * indexer keys: they reuse the previous full layer's top-k, as in training. Slot s owns the rows
 * [s * max_tokens, (s + 1) * max_tokens) of every layer's arrays, so a query's eligible keys are one contiguous
 * range, exactly as in a packed training batch.
 *
 * A paged cache (ABI 1.5, block_size > 0) has the same per-layer arrays cut into n_blocks blocks of block_size
 * rows; the engine's block tables say which blocks hold a sequence's tokens. Its forward (glm5_forward_paged)
 * gathers each layer's keys of the call's sequences into one contiguous key array in token order, so the DSA ops,
 * their ranges and their top-k tie order are those of a contiguous cache. */
#ifndef DSARL_GLM5_CACHE_H
#define DSARL_GLM5_CACHE_H

#include "dsarl/ops/model.h"

struct dsarl_model_cache {
    dsarl_model *m;
    int32_t n_slots, max_tokens;
    int64_t n_rows;        // n_slots * max_tokens
    void *memory;          // one device allocation, carved by an arena into the arrays below
    size_t bytes;
    void **kv;             // (layers) each (n_rows, kv_lora + rope) in the storage dtype
    void **ik;             // (layers) each (n_rows, index_head_dim), NULL on shared layers
    int32_t *lengths;      // host (n_slots): tokens held per slot (NULL for a paged cache)
    int32_t n_blocks, block_size; // paged cache: n_rows = n_blocks * block_size; 0 for a contiguous one
};

/* The model ops of the same names (dsarl/ops/model.h). */
int glm5_cache_create(dsarl_model *model, int32_t n_slots, int32_t max_tokens, dsarl_model_cache **out,
                      dsarl_error *err);
void glm5_cache_free(dsarl_model_cache *cache);
int glm5_cache_reset(dsarl_model_cache *cache, dsarl_error *err);
int32_t glm5_cache_length(const dsarl_model_cache *cache, int32_t slot);
/* Under expert parallelism an empty batch (no sequences, no tokens) is a step in which this rank only serves its
 * experts to its ep peers: a generation engine whose sequences finished keeps stepping until every peer's have. */
int glm5_forward_cached(dsarl_model *model, dsarl_model_cache *cache, const dsarl_token_batch *batch,
                        const int32_t *slots, float *logits, dsarl_error *err);

/* ABI 1.5: the paged cache ops (dsarl/ops/model.h). */
int64_t glm5_cache_token_bytes(const dsarl_model *model);
int glm5_paged_cache_create(dsarl_model *model, int32_t n_blocks, int32_t block_size, dsarl_model_cache **out,
                            dsarl_error *err);
int glm5_cache_copy_block(dsarl_model_cache *cache, int32_t src, int32_t dst, int32_t rows, dsarl_error *err);
/* Clears block b of every layer (a block's rows are written once, by adding into zeros). */
int glm5_cache_clear_block(dsarl_model_cache *cache, int32_t b, dsarl_error *err);
int glm5_forward_paged(dsarl_model *model, dsarl_model_cache *cache, const dsarl_token_batch *batch,
                       const dsarl_block_tables *tables, float *logits, dsarl_error *err);

#endif /* DSARL_GLM5_CACHE_H */
