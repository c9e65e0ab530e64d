/* grpo_train.h: the GRPO training loop (NeMo RL's grpo_train, section 3.1 of the reference) on top of the math in
 * grpo.h: data -> rollouts -> rewards -> advantages -> log-probs -> clipped-PG microbatches -> AdamW, with
 * validation, metrics, checkpoints and bit-identical resume. Internal to the grpo plugin. */
#ifndef DSARL_GRPO_TRAIN_H
#define DSARL_GRPO_TRAIN_H

#include <stdint.h>
#include "dsarl/ops/algorithm.h"
#include "grpo.h"

/* Completions of one generation call, packed like generation.h's result but owned by the caller (copied out of
 * the engine, or filled by the built-in sampler). */
typedef struct grpo_completions {
    int32_t n_sequences;
    int32_t *cu_lengths;   /* (B + 1) */
    int32_t *tokens;       /* (cu_lengths[B]) */
    float *logprobs;       /* (cu_lengths[B]) */
    uint8_t *truncated;    /* (B) */
    int32_t *cu_routed;    /* routing replay: (B + 1) prefix sums of prompt + completion lengths, or NULL */
    int32_t *routed_experts, *routed_indices; /* (cu_routed[B], width) the engine's rows, or NULL */
} grpo_completions;

/* Frees what a grpo_completions holds and zeroes it. */
void grpo_completions_free(grpo_completions *c);

/* Samples completions with the model itself, no cache: each new token re-runs forward_logits over every active
 * sequence (a slow but exact reference for when no generation plugin is available). Temperature scales the
 * logits, top_k / top_p filter them, and the returned log-probabilities are those of the distribution sampled
 * from; sequence i draws from Philox stream (params->seed, i). Stops at a stop token id (kept) or max_new_tokens; stop strings are not
 * supported here (the native engine handles them). */
int grpo_sample_with_model(const dsarl_model_ops *ops, dsarl_model *model, const dsarl_token_batch *prompts,
                           const dsarl_sampling_params *params, grpo_completions *out, dsarl_error *err);

/* What a run did, for callers that drive grpo_train_run directly (tests). */
typedef struct grpo_run_summary {
    int64_t first_step;          /* steps already done when the run started (resumed checkpoint), else 0 */
    int64_t last_step;           /* steps completed when it returned */
    double first_val_accuracy;   /* NAN when no validation ran */
    double last_val_accuracy;
    char exp_dir[1024];          /* the logger's experiment directory */
} grpo_run_summary;

/* The whole GRPO job for a validated recipe and a run context whose model, device and dsa ops are selected;
 * ctx->generation_ops may be NULL (then grpo_sample_with_model generates). summary may be NULL. */
int grpo_train_run(const dsarl_run_context *ctx, grpo_run_summary *summary, dsarl_error *err);

/* Recipe keys the loop reads beyond grpo_recipe_keys (tokenizer, micro-batches, generation, data limits). */
extern const dsarl_key_spec grpo_train_keys[];
extern const size_t grpo_train_n_keys;

#endif /* DSARL_GRPO_TRAIN_H */
