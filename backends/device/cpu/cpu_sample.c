/* cpu_sample.c: the device-side sampler (ABI 1.5 sample_filtered) on host memory. Each row is filtered by libdsarl's
 * dsarl_sampling_filter_row, drawn by cpu_sample_tokens at temperature 1 (the filtered row already carries the
 * temperature) or 0 (greedy), and scored by cpu_logprobs_forward: the same calls, in the same order, as the engine
 * that filters on the host, so both give identical ids and log-probs. */
#include <stdlib.h>
#include "cpu_device.h"
#include "dsarl/sampling.h"

int cpu_sample_filtered(dsarl_device *dev, int32_t *tokens, float *logprobs, float *logits, int64_t T, int64_t V,
                        float temperature, int32_t top_k, float top_p, uint64_t seed, const uint64_t *streams,
                        dsarl_error *err)
{
    if (V < 1 || V > INT32_MAX)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cpu: sample_filtered needs a vocabulary of 1 to %d ids, got "
                          "V = %lld", INT32_MAX, (long long)V);
    if (T > 0 && !streams)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cpu: sample_filtered needs one Philox stream per row");
    int32_t *order = malloc((size_t)V * sizeof(int32_t)), *scratch = malloc((size_t)V * sizeof(int32_t));
    int rc = order && scratch ? DSARL_OK
                              : DSARL_FAIL(err, DSARL_E_NOMEM, "device cpu: out of memory for a %lld-id sampling row",
                                           (long long)V);
    float draw_temperature = temperature > 0.0f ? 1.0f : 0.0f;
    for (int64_t t = 0; rc == 0 && t < T; t++) {
        float *row = logits + t * V;
        dsarl_sampling_filter_row(row, V, temperature, top_k, top_p, order, scratch);
        rc = cpu_sample_tokens(dev, tokens + t, row, 1, V, draw_temperature, seed, streams[t], err);
        if (rc == 0)
            rc = cpu_logprobs_forward(dev, logprobs + t, row, tokens + t, 1, V, err);
    }
    free(order), free(scratch);
    return rc;
}
