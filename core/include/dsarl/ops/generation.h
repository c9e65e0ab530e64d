/* dsarl/ops/generation.h: rollout engines (kind DSARL_KIND_GENERATION), selected by policy.generation.backend.
 * SDK tier: plugin ABI (docs/sdk.md). create, destroy and generate are mandatory.
 * An engine samples completions from a model instance, reading its weights in place when colocated, and returns
 * the per-token log-probabilities it sampled with. */
#ifndef DSARL_OPS_GENERATION_H
#define DSARL_OPS_GENERATION_H

#include <stddef.h>
#include <stdint.h>
#include "dsarl/comm.h"
#include "dsarl/ops/model.h"
#include "dsarl/tokenizer.h"

DSARL_BEGIN_DECLS

typedef struct dsarl_generator dsarl_generator;

/* How completions are drawn (vLLM semantics, NeMo RL's policy.generation keys). The sampling distribution of a
 * step is softmax of the logits divided by temperature, then top-k (ids below the k-th largest removed, ties at it
 * kept), then top-p (ids removed from the least likely up while the mass ranked above them reaches top_p; the most
 * likely id always stays). A sequence ends after a stop token id, its tokenizer's EOS, or the token that completes
 * a stop string (that token is kept in the completion), else after max_new_tokens (truncated). Draws use the
 * Philox stream (seed, sequence index, step), so a result depends only on the seed, the weights and that
 * sequence's prompt: not on the rest of the batch or on which sequences already finished. */
typedef struct dsarl_sampling_params {
    uint32_t struct_size;
    float temperature;        /* 0 = greedy (argmax, ties the lowest id; top-k/top-p ignored) */
    float top_p;              /* in (0, 1]; 1 = off */
    int32_t top_k;            /* 0 or -1 = off */
    int32_t max_new_tokens;   /* >= 1 */
    const int32_t *stop_token_ids; int32_t n_stop_token_ids;  /* e.g. policy.generation.stop_token_ids */
    const char *const *stop_strings; int32_t n_stop_strings;  /* need tokenizer */
    uint64_t seed;
    /* Decodes completions for stop_strings (incrementally: the last tokens' bytes, so it must decode by
     * concatenation, as byte-level tokenizers do); its EOS id, when it has one, also ends a sequence. NULL: no stop
     * strings allowed, stop_token_ids only. Read only when struct_size covers it. */
    const dsarl_tokenizer *tokenizer;
    /* ABI 1.3: the index of the batch's first sequence in the whole batch it belongs to: sequence b draws from the
     * Philox stream of index sequence_offset + b, so a data-parallel rank that samples its share of a batch draws
     * what one process sampling all of it would. Read only when struct_size covers it (0 otherwise). */
    int64_t sequence_offset;
    /* ABI 1.3: the ranks whose model passes exchange data inside a layer (expert parallelism: tokens travel to the
     * experts' owners), so each must run as many model passes as the others: generate keeps taking empty steps
     * (a batch of zero sequences) until every member's sequences have finished, and takes part with no prompts at
     * all (n_sequences 0). NULL or a group of one: this rank's sequences alone decide. Read only when struct_size
     * covers it. */
    const dsarl_group *lockstep;
    /* ABI 1.5: what the engine records per token for routing replay (DSARL_RECORD_* flags; 0 = nothing). An engine
     * or model that cannot record refuses at generate. Read only when struct_size covers it. */
    uint32_t record_routing;
} dsarl_sampling_params;

/* dsarl_sampling_params.record_routing flags. */
#define DSARL_RECORD_EXPERTS 1u /* each MoE layer's routed experts */
#define DSARL_RECORD_INDICES 2u /* each full-indexer layer's selected key positions */

/* The record_routing flags of params from any 1.x caller (0 when it predates the field). */
static inline uint32_t dsarl_sampling_record_routing(const dsarl_sampling_params *p)
{
    return p->struct_size >= offsetof(dsarl_sampling_params, record_routing) + sizeof(p->record_routing)
               ? p->record_routing : 0;
}

/* The lockstep group of params from any 1.x caller (NULL when it predates the field). */
static inline const dsarl_group *dsarl_sampling_lockstep(const dsarl_sampling_params *p)
{
    return p->struct_size >= offsetof(dsarl_sampling_params, lockstep) + sizeof(p->lockstep) ? p->lockstep : NULL;
}

/* The sequence_offset of params from any 1.x caller. */
static inline int64_t dsarl_sampling_sequence_offset(const dsarl_sampling_params *p)
{
    return p->struct_size >= offsetof(dsarl_sampling_params, sequence_offset) + sizeof(p->sequence_offset)
               ? p->sequence_offset : 0;
}

/* Completions for a batch of prompts. Token/log-prob arrays are packed like the prompts, owned by the engine and
 * valid until the next generate() or destroy(). logprobs are NeMo RL's "processed_logprobs": the log-softmax of
 * the sampling distribution's logits (temperature-scaled, top-k/top-p filtered) at the drawn token, computed with
 * the device's log-prob op; greedy scores under softmax(raw logits). With top-k/top-p off they equal the trainer's
 * log-softmax of logits / temperature to float rounding. */
typedef struct dsarl_generation_result {
    uint32_t struct_size;
    int32_t n_sequences;
    const int32_t *cu_lengths;   /* (B + 1) prefix sums of completion lengths */
    const int32_t *tokens;       /* completion tokens */
    const float *logprobs;       /* log-probability of each completion token under the sampling distribution */
    const uint8_t *truncated;    /* (B) 1 when max_new_tokens ended the sequence */
    /* ABI 1.5, filled when params asked record_routing (else NULL; the caller sets struct_size to cover them): rows
     * for every prompt and completion token of each sequence, in the layout of dsarl_token_batch.record_experts
     * (dsarl_model_ops.routing_shape). The last completion token never went through the model: its rows are -1
     * (not recorded), as are the rows of a flag that was not asked. */
    const int32_t *cu_routed;      /* (B + 1) prefix sums of prompt + completion lengths */
    const int32_t *routed_experts; /* (cu_routed[B], moe_layers, experts_per_token) */
    const int32_t *routed_indices; /* (cu_routed[B], index_layers, index_topk) */
} dsarl_generation_result;

typedef struct dsarl_generation_ops {
    dsarl_ops_common common;

    /* Creates an engine that generates with the given model instance, reading its weights in place (colocated:
     * updates by optimizer_step are seen by the next generate()). The model ops must provide cached inference. */
    int (*create)(const dsarl_node *recipe, const dsarl_model_ops *model_ops, dsarl_model *model,
                  dsarl_generator **out, dsarl_error *err);
    void (*destroy)(dsarl_generator *gen);

    /* Samples completions for prompts (a packed batch of non-empty prompts, host memory). The KV cache is sized
     * from the batch (longest prompt + max_new_tokens per sequence, or the engine's own memory setting for a paged
     * cache) and kept for later calls that fit. */
    int (*generate)(dsarl_generator *gen, const dsarl_token_batch *prompts, const dsarl_sampling_params *params,
                    dsarl_generation_result *result, dsarl_error *err);

    void *reserved[8];
} dsarl_generation_ops;

DSARL_END_DECLS

#endif /* DSARL_OPS_GENERATION_H */
