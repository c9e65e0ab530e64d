/* cuda_rope.cu: interleaved RoPE with transformers' de-interleaved output (apply_rotary_pos_emb_interleave). One
 * block per (token, head) slice: the slice is staged in shared memory first, so out may alias inp. Angles are
 * float32 position * inv_freq with float32 cos/sin, as the CPU device computes them. */
#include <math.h>
#include "cuda_common.cuh"

#define ROPE_MAX_DIM 1024

template <typename Storage>
static __global__ void rope_kernel(Storage *out, const Storage *inp, const int32_t *positions, const float *inv_freq,
                                   float scaling, int64_t T, int64_t H, int64_t token_stride, int64_t head_stride,
                                   int64_t rope_dim, int backward)
{
    __shared__ float staged[ROPE_MAX_DIM];
    int64_t half = rope_dim / 2;
    for (int64_t slice = blockIdx.x; slice < T * H; slice += gridDim.x) {
        int64_t t = slice / H, h = slice % H;
        const Storage *x = inp + t * token_stride + h * head_stride;
        Storage *y = out + t * token_stride + h * head_stride;
        for (int64_t i = threadIdx.x; i < rope_dim; i += blockDim.x)
            staged[i] = ldf(x + i);
        __syncthreads();
        for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
            float angle = (float)positions[t] * inv_freq[i];
            float c = cosf(angle) * scaling, s = sinf(angle) * scaling;
            if (!backward) {
                float x0 = staged[2 * i], x1 = staged[2 * i + 1];
                stf(y + i, x0 * c - x1 * s);
                stf(y + i + half, x1 * c + x0 * s);
            } else { /* the transposed rotation, back to the interleaved layout */
                float d0 = staged[i], d1 = staged[i + half];
                stf(y + 2 * i, d0 * c + d1 * s);
                stf(y + 2 * i + 1, -d0 * s + d1 * c);
            }
        }
        __syncthreads();
    }
}

static int rope(dsarl_device *dev, void *out, const void *inp, const int32_t *positions, const float *inv_freq,
                float scaling, int64_t T, int64_t H, int64_t token_stride, int64_t head_stride, int64_t rope_dim,
                int backward, dsarl_error *err)
{
    if (rope_dim <= 0 || rope_dim % 2 || rope_dim > ROPE_MAX_DIM)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cuda: rope_dim must be even and in [2, %d], got %lld",
                          ROPE_MAX_DIM, (long long)rope_dim);
    if (T * H <= 0)
        return DSARL_OK;
    unsigned int blocks = (unsigned int)(T * H < 65535 * 16 ? T * H : 65535 * 16);
    STORAGE_LAUNCH(dev, rope_kernel, blocks, 64, 0, (S *)out, (const S *)inp, positions, inv_freq, scaling,
                                                     T, H, token_stride, head_stride, rope_dim, backward);
    cudaCheckLaunch(backward ? "rope_backward" : "rope_forward", err);
    return DSARL_OK;
}

int cuda_rope_forward(dsarl_device *dev, void *out, const void *inp, const int32_t *positions,
                      const float *inv_freq, float attention_scaling, int64_t T, int64_t H, int64_t token_stride,
                      int64_t head_stride, int64_t rope_dim, dsarl_error *err)
{
    return rope(dev, out, inp, positions, inv_freq, attention_scaling, T, H, token_stride, head_stride, rope_dim, 0,
                err);
}

int cuda_rope_backward(dsarl_device *dev, void *dinp, const void *dout, const int32_t *positions,
                       const float *inv_freq, float attention_scaling, int64_t T, int64_t H, int64_t token_stride,
                       int64_t head_stride, int64_t rope_dim, dsarl_error *err)
{
    return rope(dev, dinp, dout, positions, inv_freq, attention_scaling, T, H, token_stride, head_stride, rope_dim, 1,
                err);
}
