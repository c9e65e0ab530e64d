/* cpu_elementwise.c: strided copies, residual adds, token embedding and SwiGLU on float32 host memory. */
#include <math.h>
#include <string.h>
#include "cpu_device.h"

int cpu_copy_2d(dsarl_device *dev, void *dst, int64_t dst_stride, const void *src, int64_t src_stride, int64_t rows,
                int64_t cols, dsarl_error *err)
{
    float *d = dst;
    const float *s = src;
    for (int64_t r = 0; r < rows; r++)
        memmove(d + r * dst_stride, s + r * src_stride, (size_t)cols * sizeof(float));
    return DSARL_OK;
}

int cpu_add(dsarl_device *dev, void *out, const void *a, const void *b, int64_t n, dsarl_error *err)
{
    float *o = out;
    const float *x = a, *y = b;
    for (int64_t i = 0; i < n; i++)
        o[i] = x[i] + y[i];
    return DSARL_OK;
}

int cpu_axpy(dsarl_device *dev, int64_t n, float alpha, const void *x, void *y, dsarl_error *err)
{
    const float *xf = x;
    float *yf = y;
    for (int64_t i = 0; i < n; i++)
        yf[i] += alpha * xf[i];
    return DSARL_OK;
}

int cpu_embedding_forward(dsarl_device *dev, void *out, const int32_t *tokens, const void *wte, int64_t T,
                          int64_t C, int64_t V, dsarl_error *err)
{
    float *o = out;
    const float *w = wte;
    for (int64_t t = 0; t < T; t++) {
        if (tokens[t] < 0 || tokens[t] >= V)
            return DSARL_FAIL(err, DSARL_E_INVALID, "device cpu: token id %d at position %lld is outside the "
                              "vocabulary [0, %lld)", tokens[t], (long long)t, (long long)V);
        memcpy(o + t * C, w + (int64_t)tokens[t] * C, (size_t)C * sizeof(float));
    }
    return DSARL_OK;
}

int cpu_embedding_backward(dsarl_device *dev, void *dwte, const void *dout, const int32_t *tokens, int64_t T,
                           int64_t C, dsarl_error *err)
{
    float *dw = dwte;
    const float *d = dout;
    for (int64_t t = 0; t < T; t++) {
        float *row = dw + (int64_t)tokens[t] * C;
        for (int64_t c = 0; c < C; c++)
            row[c] += d[t * C + c];
    }
    return DSARL_OK;
}

int cpu_swiglu_forward(dsarl_device *dev, void *out, const void *inp, int64_t T, int64_t inner, dsarl_error *err)
{
    float *o = out;
    const float *x = inp;
    for (int64_t t = 0; t < T; t++) {
        const float *gate = x + t * 2 * inner, *up = gate + inner;
        for (int64_t i = 0; i < inner; i++) {
            float g = gate[i];
            o[t * inner + i] = g / (1.0f + expf(-g)) * up[i];
        }
    }
    return DSARL_OK;
}

int cpu_swiglu_backward(dsarl_device *dev, void *dinp, const void *dout, const void *inp, int64_t T, int64_t inner,
                        dsarl_error *err)
{
    float *dx = dinp;
    const float *x = inp, *d = dout;
    for (int64_t t = 0; t < T; t++) {
        const float *gate = x + t * 2 * inner, *up = gate + inner;
        float *dgate = dx + t * 2 * inner, *dup = dgate + inner;
        for (int64_t i = 0; i < inner; i++) {
            float g = gate[i], sig = 1.0f / (1.0f + expf(-g));
            float silu = g * sig;
            // d silu/dg = sig * (1 + g * (1 - sig))
            dgate[i] = d[t * inner + i] * up[i] * sig * (1.0f + g * (1.0f - sig));
            dup[i] = d[t * inner + i] * silu;
        }
    }
    return DSARL_OK;
}
