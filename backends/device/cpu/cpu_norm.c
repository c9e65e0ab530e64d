/* cpu_norm.c: RMSNorm (model norms, MLA latent norms) and LayerNorm with bias (indexer k_norm), with backward.
 * Row statistics accumulate in double so the float32 result is the correctly rounded one for these sizes. */
#include <math.h>
#include "cpu_device.h"

int cpu_rmsnorm_forward(dsarl_device *dev, void *out, float *rstd, const void *inp, const void *weight, int64_t T,
                        int64_t C, float eps, dsarl_error *err)
{
    float *o = out;
    const float *x = inp, *w = weight;
    for (int64_t t = 0; t < T; t++) {
        const float *row = x + t * C;
        double ss = 0.0;
        for (int64_t c = 0; c < C; c++)
            ss += (double)row[c] * row[c];
        float r = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
        rstd[t] = r;
        for (int64_t c = 0; c < C; c++)
            o[t * C + c] = w[c] * (row[c] * r);
    }
    return DSARL_OK;
}

int cpu_rmsnorm_backward(dsarl_device *dev, void *dinp, void *dweight, const void *dout, const void *inp,
                         const void *weight, const float *rstd, int64_t T, int64_t C, dsarl_error *err)
{
    float *dx = dinp, *dw = dweight;
    const float *x = inp, *w = weight, *d = dout;
    for (int64_t t = 0; t < T; t++) {
        const float *row = x + t * C, *drow = d + t * C;
        double r = rstd[t], dot = 0.0; // dot = sum_j w_j d_j x_j
        for (int64_t c = 0; c < C; c++)
            dot += (double)w[c] * drow[c] * row[c];
        double coef = r * r * r * dot / (double)C;
        for (int64_t c = 0; c < C; c++) {
            dx[t * C + c] = (float)(r * w[c] * drow[c] - coef * row[c]);
            dw[c] += (float)(drow[c] * row[c] * r);
        }
    }
    return DSARL_OK;
}

int cpu_layernorm_forward(dsarl_device *dev, void *out, float *mean, float *rstd, const void *inp, const void *weight,
                          const void *bias, int64_t T, int64_t C, float eps, dsarl_error *err)
{
    float *o = out;
    const float *x = inp, *w = weight, *b = bias;
    for (int64_t t = 0; t < T; t++) {
        const float *row = x + t * C;
        double m = 0.0, v = 0.0;
        for (int64_t c = 0; c < C; c++)
            m += row[c];
        m /= (double)C;
        for (int64_t c = 0; c < C; c++)
            v += (row[c] - m) * (row[c] - m);
        v /= (double)C; // biased variance, as torch.nn.LayerNorm
        double r = 1.0 / sqrt(v + (double)eps);
        mean[t] = (float)m;
        rstd[t] = (float)r;
        for (int64_t c = 0; c < C; c++)
            o[t * C + c] = (float)((row[c] - m) * r) * w[c] + b[c];
    }
    return DSARL_OK;
}

int cpu_layernorm_backward(dsarl_device *dev, void *dinp, void *dweight, void *dbias, const void *dout,
                           const void *inp, const void *weight, const float *mean, const float *rstd, int64_t T,
                           int64_t C, dsarl_error *err)
{
    float *dx = dinp, *dw = dweight, *db = dbias;
    const float *x = inp, *w = weight, *d = dout;
    for (int64_t t = 0; t < T; t++) {
        const float *row = x + t * C, *drow = d + t * C;
        double m = mean[t], r = rstd[t], g_mean = 0.0, gx_mean = 0.0;
        for (int64_t c = 0; c < C; c++) {
            double g = (double)drow[c] * w[c], xhat = (row[c] - m) * r;
            g_mean += g;
            gx_mean += g * xhat;
        }
        g_mean /= (double)C;
        gx_mean /= (double)C;
        for (int64_t c = 0; c < C; c++) {
            double g = (double)drow[c] * w[c], xhat = (row[c] - m) * r;
            dx[t * C + c] = (float)(r * (g - g_mean - xhat * gx_mean));
            dw[c] += (float)(drow[c] * xhat);
            db[c] += drow[c];
        }
    }
    return DSARL_OK;
}
