/* cpu_logprobs.c: per-token log-probabilities of target tokens (and cross-entropy = -logprob) with backward. */
#include <math.h>
#include <string.h>
#include "cpu_device.h"

// log(sum exp(row)) with the max subtracted, in double.
static double row_logsumexp(const float *row, int64_t V)
{
    float m = row[0];
    for (int64_t v = 1; v < V; v++)
        m = row[v] > m ? row[v] : m;
    double s = 0.0;
    for (int64_t v = 0; v < V; v++)
        s += exp((double)row[v] - m);
    return m + log(s);
}

int cpu_logprobs_forward(dsarl_device *dev, float *logprobs, const float *logits, const int32_t *targets, int64_t T,
                         int64_t V, dsarl_error *err)
{
    for (int64_t t = 0; t < T; t++) {
        if (targets[t] >= V)
            return DSARL_FAIL(err, DSARL_E_INVALID, "device cpu: target id %d at position %lld is outside the "
                              "vocabulary [0, %lld)", targets[t], (long long)t, (long long)V);
        const float *row = logits + t * V;
        logprobs[t] = targets[t] < 0 ? 0.0f : (float)((double)row[targets[t]] - row_logsumexp(row, V));
    }
    return DSARL_OK;
}

int cpu_logprobs_backward(dsarl_device *dev, float *dlogits, const float *dlogprobs, const float *logits,
                          const int32_t *targets, int64_t T, int64_t V, dsarl_error *err)
{
    for (int64_t t = 0; t < T; t++) {
        float *drow = dlogits + t * V;
        if (targets[t] < 0) {
            memset(drow, 0, (size_t)V * sizeof(float));
            continue;
        }
        const float *row = logits + t * V;
        double lse = row_logsumexp(row, V), g = dlogprobs[t];
        // d logp_y / d z_v = [v == y] - softmax(z)_v
        for (int64_t v = 0; v < V; v++)
            drow[v] = (float)(-g * exp((double)row[v] - lse));
        drow[targets[t]] += (float)g;
    }
    return DSARL_OK;
}
