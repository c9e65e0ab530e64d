/* dsarl/sampling.h: the sampling distribution of one logits row as vLLM builds it (and NeMo RL's
 * "processed_logprobs" score it): logits / temperature, then top-k, then top-p, excluded ids set to -inf.
 * SDK tier: trainer services (docs/sdk.md), exported by libdsarl since ABI 1.5: the generation engine and the CPU
 * device's sample_filtered op share it, so host and device filtering cannot drift apart. */
#ifndef DSARL_SAMPLING_H
#define DSARL_SAMPLING_H

#include <stdint.h>
#include "dsarl/export.h"

DSARL_BEGIN_DECLS

/* Rewrites one row of raw logits (V) into the logits of the sampling distribution: divided by temperature (> 0;
 * greedy rows, temperature <= 0, are left as they are), then every id below the top_k-th largest value removed
 * (ties at it kept; top_k <= 0 or >= V: off), then ids removed, from the least likely up, while the probability
 * mass ranked above them is already >= top_p (the most likely id always kept; top_p >= 1: off). Ranks: larger
 * logit first, the lower id among equals. Removed ids become -inf. order and scratch are (V) int32 work arrays. */
DSARL_API void dsarl_sampling_filter_row(float *row, int64_t V, float temperature, int32_t top_k, float top_p,
                                         int32_t *order, int32_t *scratch);

DSARL_END_DECLS

#endif /* DSARL_SAMPLING_H */
