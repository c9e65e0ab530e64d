/* native_generator.h: the native generation engine (ops table "native", kind generation). */
#ifndef DSARL_NATIVE_GENERATOR_H
#define DSARL_NATIVE_GENERATOR_H

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
 * pieces, a prompt longer than this split over calls. For tests, which check that pieces give the one-pass result. */
void native_set_prefill_tokens(dsarl_generator *gen, int32_t tokens);

/* The Philox stream (dsarl/rng.h) that draws the token of sequence b (its index in the whole batch: the call's
 * sequence_offset plus its row) at completion step s: independent of which other sequences are in the batch or
 * still running, and of how a data-parallel run split the batch. */
uint64_t native_sample_stream(int64_t b, int32_t s);

#endif /* DSARL_NATIVE_GENERATOR_H */
