/* native_generator.h: the native generation engine (ops table "native", kind generation). */
#ifndef DSARL_NATIVE_GENERATOR_H
#define DSARL_NATIVE_GENERATOR_H

#include <stdbool.h>
#include "dsarl/ops/generation.h"

/* The registered table. */
extern const dsarl_generation_ops native_generation_ops;

/* The table's functions, callable directly by tests that link the object library. */
int native_create(const dsarl_node *recipe, const dsarl_model_ops *model_ops, dsarl_model *model,
                  dsarl_generator **out, dsarl_error *err);
void native_destroy(dsarl_generator *gen);
int native_generate(dsarl_generator *gen, const dsarl_token_batch *prompts, const dsarl_sampling_params *params,
                    dsarl_generation_result *result, dsarl_error *err);

/* New tokens per prefill call (32768 unless set; <= 0 restores that): a longer batch of prompts is prefilled in
 * pieces, a prompt longer than this split over calls; the paged loop's tokens per step (max_batched_tokens) too.
 * For tests, which check that pieces give the one-pass result. */
void native_set_prefill_tokens(dsarl_generator *gen, int32_t tokens);

/* Continuous batching over a paged cache (native_paged.c), from the recipe's policy.generation keys. */
typedef struct native_paged_config {
    bool enabled;               // the model has the ABI 1.5 paged ops and no recipe turned it off
    int32_t block_size;         // tokens per block (policy.generation.block_size)
    int64_t memory_bytes;       // arena bytes (policy.generation.kv_cache_memory_bytes); 0: sized for the batch
    double memory_utilization;  // fraction of the device's memory in use once the arena is allocated (weights,
                                // buffers and arena; policy.generation.gpu_memory_utilization, (0, 1]); 0: unset.
                                // memory_bytes > 0 wins, as vLLM's kv_cache_memory_bytes does
    int32_t max_num_seqs;       // sequences running at once (policy.generation.max_num_seqs); 0: no bound
    int32_t max_batched_tokens; // tokens per forward step (policy.generation.max_num_batched_tokens)
    bool prefix_sharing;        // equal prompts share one prefill (policy.generation.enable_prefix_caching)
} native_paged_config;

/* What the last paged generate() did (tests count prefill work and preemptions through it). Orders list sequence
 * ids, a sequence admitted again after a preemption once more. */
typedef struct native_paged_stats {
    int64_t forward_calls;      // forward_paged calls
    int64_t tokens_computed;    // tokens through the model, every call together
    int64_t prompt_tokens_computed; // of them, prompt tokens (a shared prefill counts once)
    int64_t preemptions;        // sequences evicted (recomputed later) when blocks ran out
    int64_t mixed_steps;        // forward calls holding both decode tokens and prompt chunks
    int32_t blocks;             // blocks in the arena
    // what the device's memory_info reported when memory_utilization sized the arena (0: it did not)
    size_t memory_free, memory_total;
    int32_t peak_blocks_used;
    int32_t *admitted;          // (n_admitted) sequence ids in admission order
    int32_t n_admitted;
    int32_t *retired;           // (n_retired) sequence ids in the order they finished
    int32_t n_retired;
} native_paged_stats;

/* The engine's paged settings (tests set them directly); enabled without the model's paged ops is refused at the
 * next generate(). */
native_paged_config native_get_paged(const dsarl_generator *gen);
void native_set_paged(dsarl_generator *gen, native_paged_config config);
/* The last paged generate()'s statistics, valid until the next generate() or destroy(). */
const native_paged_stats *native_paged_last_stats(const dsarl_generator *gen);

/* The arena memory_utilization u gives (vLLM's gpu_memory_utilization): floor(u * total - (total - free)) bytes, the
 * fraction u of the device's total memory less what is in use already (weights, buffers), in whole blocks of
 * block_bytes into *blocks. Fails (DSARL_E_INVALID, one sentence naming the key) when that is fewer than
 * need_blocks (of block_size tokens each: one sequence of the batch at full length) or u is outside (0, 1]. */
int native_arena_blocks_for_utilization(double u, size_t free_bytes, size_t total_bytes, int64_t block_bytes,
                                        int32_t block_size, int64_t need_blocks, int64_t *blocks, dsarl_error *err);

/* The Philox stream (dsarl/rng.h) that draws the token of sequence b (its index in the whole batch: the call's
 * sequence_offset plus its row) at completion step s: independent of which other sequences are in the batch or
 * still running, and of how a data-parallel run split the batch. */
uint64_t native_sample_stream(int64_t b, int32_t s);

#endif /* DSARL_NATIVE_GENERATOR_H */
