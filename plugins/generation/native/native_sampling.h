/* native_sampling.h: the sampling distribution of the native engine, as vLLM builds it (and NeMo RL's
 * "processed_logprobs" score it): logits / temperature, then top-k, then top-p, excluded ids set to -inf. */
#ifndef DSARL_NATIVE_SAMPLING_H
#define DSARL_NATIVE_SAMPLING_H

#include <stdint.h>
#include "dsarl/ops/generation.h"

/* Rewrites one row of raw logits (V) into the logits of the sampling distribution: divided by temperature (> 0;
 * greedy rows are left as they are), then every id below the top_k-th largest value removed (ties kept; top_k <= 0
 * or >= V: off), then the smallest-probability ids removed while the mass of the ids ranked above them is already
 * >= top_p (the most likely id always kept; top_p >= 1: off). Removed ids become -inf. order and scratch are (V)
 * int32 work arrays. */
void native_process_logits(float *row, int64_t V, float temperature, int32_t top_k, float top_p, int32_t *order,
                           int32_t *scratch);

/* Checks params (temperature >= 0, 0 < top_p <= 1, top_k >= -1, max_new_tokens >= 1, stop strings need a
 * tokenizer), naming the field and the valid range in err. */
int native_check_params(const dsarl_sampling_params *params, dsarl_error *err);

#endif /* DSARL_NATIVE_SAMPLING_H */
