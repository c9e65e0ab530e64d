/* dsarl/ops/generation.h: rollout engines (kind DSARL_KIND_GENERATION), selected by policy.generation.backend.
 * An engine samples completions from a model instance, reading its weights in place when colocated, and returns
 * the per-token log-probabilities it sampled with. */
#ifndef DSARL_OPS_GENERATION_H
#define DSARL_OPS_GENERATION_H

#include <stdint.h>
#include "dsarl/ops/model.h"
#include "dsarl/tokenizer.h"

DSARL_BEGIN_DECLS

typedef struct dsarl_generator dsarl_generator;

typedef struct dsarl_sampling_params {
    uint32_t struct_size;
    float temperature;        /* 0 = greedy */
    float top_p;              /* 1 = off */
    int32_t top_k;            /* 0 or -1 = off */
    int32_t max_new_tokens;
    const int32_t *stop_token_ids; int32_t n_stop_token_ids;
    const char *const *stop_strings; int32_t n_stop_strings;
    uint64_t seed;
    /* Decodes completions for stop_strings (incrementally: the last tokens' bytes, so it must decode by
     * concatenation, as byte-level tokenizers do); its EOS id, when it has one, also ends a sequence. NULL: no stop
     * strings allowed, stop_token_ids only. Read only when struct_size covers it. */
    const dsarl_tokenizer *tokenizer;
} dsarl_sampling_params;

/* Completions for a batch of prompts. Token/log-prob arrays are packed like the prompts, owned by the engine and
 * valid until the next generate() or destroy(). */
typedef struct dsarl_generation_result {
    uint32_t struct_size;
    int32_t n_sequences;
    const int32_t *cu_lengths;   /* (B + 1) prefix sums of completion lengths */
    const int32_t *tokens;       /* completion tokens */
    const float *logprobs;       /* log-probability of each completion token under the sampling distribution */
    const uint8_t *truncated;    /* (B) 1 when max_new_tokens ended the sequence */
} dsarl_generation_result;

typedef struct dsarl_generation_ops {
    dsarl_ops_common common;

    /* Creates an engine that generates with the given model instance. */
    int (*create)(const dsarl_node *recipe, const dsarl_model_ops *model_ops, dsarl_model *model,
                  dsarl_generator **out, dsarl_error *err);
    void (*destroy)(dsarl_generator *gen);

    /* Samples completions for prompts (a packed batch). */
    int (*generate)(dsarl_generator *gen, const dsarl_token_batch *prompts, const dsarl_sampling_params *params,
                    dsarl_generation_result *result, dsarl_error *err);

    void *reserved[8];
} dsarl_generation_ops;

DSARL_END_DECLS

#endif /* DSARL_OPS_GENERATION_H */
