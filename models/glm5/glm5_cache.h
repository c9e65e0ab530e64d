/* glm5_cache.h: the KV cache of cached inference (generation). Internal to models/glm5.
 *
 * Per layer and per cached token it holds what the DSA ops read as keys, nothing expanded: the MLA latent
 * kv = [rmsnorm(c_kv) | rope(k_rope)] (kv_lora + rope values, the absorbed-form key AND value) and, on layers whose
 * indexer is "full", the indexer key (index_head_dim, after LayerNorm and RoPE). Shared (IndexShare) layers keep no
 * indexer keys: they reuse the previous full layer's top-k, as in training. Slot s owns the rows
 * [s * max_tokens, (s + 1) * max_tokens) of every layer's arrays, so a query's eligible keys are one contiguous
 * range, exactly as in a packed training batch. */
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
    int32_t *lengths;      // host (n_slots): tokens held per slot
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

#endif /* DSARL_GLM5_CACHE_H */
