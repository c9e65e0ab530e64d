/* native_internal.h: the native engine's state, shared by its contiguous (native_generator.c) and paged
 * (native_paged.c) generate loops. Internal to plugins/generation/native. */
#ifndef DSARL_NATIVE_INTERNAL_H
#define DSARL_NATIVE_INTERNAL_H

#include <stdbool.h>
#include "native_generator.h"

struct dsarl_generator {
    const dsarl_model_ops *mo;
    dsarl_model *model;
    const dsarl_device_ops *dev_ops;
    dsarl_device *dev;
    dsarl_model_cache *cache;
    int32_t cache_slots, cache_tokens;   // what the cache was sized for (reused when a batch fits)
    int32_t prefill_tokens;              // new tokens per prefill call (NATIVE_PREFILL_TOKENS)
    // the last result, valid until the next generate() or destroy()
    int32_t *cu_lengths, *tokens;
    float *logprobs;
    uint8_t *truncated;
    native_paged_config paged;           // continuous batching over a paged cache (native_paged.c)
    dsarl_model_cache *paged_cache;      // its arena, kept across calls while big enough
    int32_t paged_blocks, paged_block_size; // what paged_cache holds
    // the device memory paged.memory_utilization sizes the arena from, read once, when the first arena is made
    // (what the process holds by then counts as in use); total 0: not read yet
    size_t util_free, util_total;
    native_paged_stats stats;            // what the last paged generate() did
    int32_t admitted_cap, retired_cap;   // allocated entries of stats.admitted / stats.retired
    // routing recording (dsarl_sampling_params.record_routing) of the last generate(): per sequence rows for
    // rec_stride token positions, rec_w_experts / rec_w_indices int32 each (0: not asked); -1 = not recorded
    int32_t rec_stride, rec_w_experts, rec_w_indices;
    int32_t *rec_experts, *rec_indices;  // (B, rec_stride, w), packed in place by the result
    int32_t *cu_routed;                  // (B + 1)
};

// Per-call state of one generate().
typedef struct run {
    int32_t B, max_new;
    int64_t V;
    float *logits;        // host (B, V): next-token logits of the running sequences, in `running` order
    int32_t *order, *scratch;  // host (V) sampling work arrays
    float *dev_logits;    // device (B, V) processed logits
    int32_t *dev_tokens;  // device (B)
    float *dev_logprobs;  // device (B)
    int32_t *running;     // host (B) sequence ids still generating, ascending
    int32_t *len;         // host (B) completion tokens so far
    int32_t *step_tokens; // host (B) the token drawn this step, per running row
    float *step_lp;       // host (B)
    int32_t *cu;          // host (B + 1) decode batch
    uint64_t *streams;    // host (B) the Philox stream of each row sampled this step
    int32_t stop_window;  // tokens whose text can hold any stop string (its longest byte length)
} run;

/* Whether the newest token of sequence b completed one of p's stop strings (*hit). */
int native_hits_stop_string(const dsarl_generator *g, const run *r, const dsarl_sampling_params *p, int32_t b,
                            int *hit, dsarl_error *err);
/* Whether tok ends a sequence: eos (>= 0) or one of p's stop token ids. */
int native_is_stop_token(const dsarl_sampling_params *p, int32_t eos, int32_t tok);
/* Draws and scores one token for each of n rows of r->dev_logits (raw logits, device) into r->step_tokens /
 * r->step_lp: on the device (sample_filtered) when it has the op, else filtered on the host. streams (n) host. */
int native_sample_rows(dsarl_generator *g, run *r, const dsarl_sampling_params *p, int32_t n, const uint64_t *streams,
                       dsarl_error *err);
/* Copies the routing rows the model recorded for one forward call's tokens into the sequences' buffers: batch row
 * i is sequence ids[i]'s tokens from position ctx[i] on, cu (n + 1) its token offsets. No-op when not recording. */
void native_store_routing(dsarl_generator *g, const int32_t *step_experts, const int32_t *step_indices, int32_t n,
                          const int32_t *ids, const int32_t *ctx, const int32_t *cu);
/* Copies sequence src's routing rows of positions [0, n) to sequence dst (a shared prompt prefill). */
void native_copy_routing(dsarl_generator *g, int32_t src, int32_t dst, int32_t n);

/* The continuous-batching loop over the paged cache: fills g->tokens / logprobs / truncated and r->len. */
int native_generate_paged(dsarl_generator *g, run *r, const dsarl_token_batch *prompts, const dsarl_sampling_params *p,
                          dsarl_error *err);

#endif /* DSARL_NATIVE_INTERNAL_H */
