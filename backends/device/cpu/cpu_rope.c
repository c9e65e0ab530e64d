/* cpu_rope.c: interleaved RoPE with transformers' de-interleaved output layout (apply_rotary_pos_emb_interleave).
 * Angles are computed as float32 position * inv_freq, then cos/sin in float32, exactly as the reference does. */
#include <math.h>
#include "cpu_device.h"

#define CPU_ROPE_MAX_DIM 1024 /* one slice is staged on the stack so out may alias inp */

static int rope_check(int64_t rope_dim, dsarl_error *err)
{
    if (rope_dim <= 0 || rope_dim % 2 || rope_dim > CPU_ROPE_MAX_DIM)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cpu: rope_dim must be even and in [2, %d], got %lld",
                          CPU_ROPE_MAX_DIM, (long long)rope_dim);
    return DSARL_OK;
}

int cpu_rope_forward(dsarl_device *dev, void *out, const void *inp, const int32_t *positions, const float *inv_freq,
                     float attention_scaling, int64_t T, int64_t H, int64_t token_stride, int64_t head_stride,
                     int64_t rope_dim, dsarl_error *err)
{
    DSARL_TRY(rope_check(rope_dim, err));
    int64_t half = rope_dim / 2;
    float staged[CPU_ROPE_MAX_DIM];
    for (int64_t t = 0; t < T; t++) {
        for (int64_t h = 0; h < H; h++) {
            const float *x = (const float *)inp + t * token_stride + h * head_stride;
            float *y = (float *)out + t * token_stride + h * head_stride;
            for (int64_t i = 0; i < rope_dim; i++)
                staged[i] = x[i];
            for (int64_t i = 0; i < half; i++) {
                float angle = (float)positions[t] * inv_freq[i];
                float c = cosf(angle) * attention_scaling, s = sinf(angle) * attention_scaling;
                float x0 = staged[2 * i], x1 = staged[2 * i + 1];
                y[i] = x0 * c - x1 * s;
                y[i + half] = x1 * c + x0 * s;
            }
        }
    }
    return DSARL_OK;
}

int cpu_rope_backward(dsarl_device *dev, void *dinp, const void *dout, const int32_t *positions,
                      const float *inv_freq, float attention_scaling, int64_t T, int64_t H, int64_t token_stride,
                      int64_t head_stride, int64_t rope_dim, dsarl_error *err)
{
    DSARL_TRY(rope_check(rope_dim, err));
    int64_t half = rope_dim / 2;
    float staged[CPU_ROPE_MAX_DIM];
    for (int64_t t = 0; t < T; t++) {
        for (int64_t h = 0; h < H; h++) {
            const float *dy = (const float *)dout + t * token_stride + h * head_stride;
            float *dx = (float *)dinp + t * token_stride + h * head_stride;
            for (int64_t i = 0; i < rope_dim; i++)
                staged[i] = dy[i];
            for (int64_t i = 0; i < half; i++) {
                float angle = (float)positions[t] * inv_freq[i];
                float c = cosf(angle) * attention_scaling, s = sinf(angle) * attention_scaling;
                float d0 = staged[i], d1 = staged[i + half];
                dx[2 * i] = d0 * c + d1 * s;
                dx[2 * i + 1] = -d0 * s + d1 * c;
            }
        }
    }
    return DSARL_OK;
}
