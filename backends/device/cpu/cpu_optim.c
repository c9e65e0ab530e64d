/* cpu_optim.c: sum of squares, in-place scaling and token sampling on float32 host memory. */
#include <math.h>
#include "cpu_device.h"
#include "dsarl/rng.h"

int cpu_sum_squares(dsarl_device *dev, float *out, const void *x, int64_t n, dsarl_error *err)
{
    const float *xf = x;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)xf[i] * xf[i];
    out[0] = (float)s;
    return DSARL_OK;
}

int cpu_scale(dsarl_device *dev, void *x, float alpha, int64_t n, dsarl_error *err)
{
    float *xf = x;
    for (int64_t i = 0; i < n; i++)
        xf[i] *= alpha;
    return DSARL_OK;
}

int cpu_sample_tokens(dsarl_device *dev, int32_t *tokens, const float *logits, int64_t T, int64_t V,
                      float temperature, uint64_t seed, uint64_t stream, dsarl_error *err)
{
    if (V < 1)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cpu: sample_tokens needs a vocabulary, got V = %lld",
                          (long long)V);
    for (int64_t t = 0; t < T; t++) {
        const float *row = logits + t * V;
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            best = row[v] > row[best] ? v : best;
        if (temperature <= 0.0f) {
            tokens[t] = (int32_t)best;
            continue;
        }
        // inverse CDF of softmax(row / temperature) at one uniform draw of the row's stream
        dsarl_rng rng;
        dsarl_rng_init(&rng, seed, stream + (uint64_t)t);
        double u = dsarl_rng_uniform(&rng), z = 0.0;
        for (int64_t v = 0; v < V; v++)
            z += exp(((double)row[v] - row[best]) / temperature);
        double target = u * z, acc = 0.0;
        int64_t pick = V - 1;
        for (int64_t v = 0; v < V; v++) {
            acc += exp(((double)row[v] - row[best]) / temperature);
            if (acc > target) {
                pick = v;
                break;
            }
        }
        tokens[t] = (int32_t)pick;
    }
    return DSARL_OK;
}

// torch.optim.AdamW's single-tensor step in float32: the bias corrections are Python floats (double) turned into
// one step size and one sqrt divisor, so the update matches torch to float rounding.
int cpu_adamw_update(dsarl_device *dev, float *master, void *weight, const void *grad, float *m, float *v, int64_t n,
                     float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale, int64_t step,
                     dsarl_error *err)
{
    (void)dev;
    if (step < 1)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cpu: adamw_update step counts from 1, got %lld",
                          (long long)step);
    const float *g = grad;
    float *w = weight;
    double c1 = 1.0 - pow((double)beta1, (double)step), c2 = 1.0 - pow((double)beta2, (double)step);
    float step_size = (float)((double)lr / c1), c2_sqrt = (float)sqrt(c2);
    float decay = 1.0f - lr * weight_decay;
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * grad_scale;
        master[i] *= decay;
        m[i] += (gi - m[i]) * (1.0f - beta1); // torch's lerp
        v[i] = v[i] * beta2 + (1.0f - beta2) * gi * gi;
        float denom = sqrtf(v[i]) / c2_sqrt + eps;
        master[i] -= step_size * (m[i] / denom);
        if (w && w != master)
            w[i] = master[i]; // float32 storage: the write-back is a copy
    }
    return DSARL_OK;
}
