/* cuda_norm.cu: RMSNorm and LayerNorm (with bias) over the last dim, forward and backward. One block per row;
 * statistics in fp32. Weight gradients are summed over rows in an fp32 scratch (atomics), then added to the bf16
 * gradient once, so they are rounded to bf16 once per call. */
#include <math.h>
#include "cuda_common.cuh"

#define NORM_THREADS 256

static unsigned int row_blocks(int64_t T) { return (unsigned int)(T < 65535 ? T : 65535); }

template <typename Storage>
static __global__ void rmsnorm_forward_kernel(Storage *out, float *rstd, const Storage *inp, const Storage *weight,
                                              int64_t T, int64_t C, float eps)
{
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const Storage *x = inp + t * C;
        float ss = 0.0f;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
            ss += ldf(x + c) * ldf(x + c);
        float r = rsqrtf(block_sum(ss) / (float)C + eps);
        if (threadIdx.x == 0)
            rstd[t] = r;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
            stf(out + t * C + c, ldf(weight + c) * (ldf(x + c) * r));
    }
}

// dinp = r w d - r^3 x (sum_j w_j d_j x_j) / C;  dweight_acc += d x r
template <typename Storage>
static __global__ void rmsnorm_backward_kernel(Storage *dinp, float *dweight_acc, const Storage *dout,
                                               const Storage *inp, const Storage *weight, const float *rstd, int64_t T,
                                               int64_t C)
{
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const Storage *x = inp + t * C, *d = dout + t * C;
        float r = rstd[t], dot = 0.0f;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
            dot += ldf(weight + c) * ldf(d + c) * ldf(x + c);
        float coef = r * r * r * block_sum(dot) / (float)C;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float xc = ldf(x + c), dc = ldf(d + c);
            stf(dinp + t * C + c, r * ldf(weight + c) * dc - coef * xc);
            atomicAdd(dweight_acc + c, dc * xc * r);
        }
    }
}

// dst (n) bf16 += acc (n) fp32
template <typename Storage>
static __global__ void accumulate_kernel(Storage *dst, const float *acc, int64_t n)
{
    GRID_STRIDE(i, n) { stf(dst + i, ldf(dst + i) + acc[i]); }
}

int cuda_rmsnorm_forward(dsarl_device *dev, void *out, float *rstd, const void *inp, const void *weight, int64_t T,
                         int64_t C, float eps, dsarl_error *err)
{
    if (T <= 0 || C <= 0)
        return DSARL_OK;
    STORAGE_LAUNCH(dev, rmsnorm_forward_kernel, row_blocks(T), NORM_THREADS, 0, 
        (S *)out, rstd, (const S *)inp, (const S *)weight, T, C, eps);
    cudaCheckLaunch("rmsnorm_forward", err);
    return DSARL_OK;
}

int cuda_rmsnorm_backward(dsarl_device *dev, void *dinp, void *dweight, const void *dout, const void *inp,
                          const void *weight, const float *rstd, int64_t T, int64_t C, dsarl_error *err)
{
    if (T <= 0 || C <= 0)
        return DSARL_OK;
    float *acc;
    DSARL_TRY(cuda_scratch(dev, (size_t)C * sizeof(float), (void **)&acc, err));
    cudaCheck(cudaMemsetAsync(acc, 0, (size_t)C * sizeof(float), CUDA_STREAM(dev)), err);
    STORAGE_LAUNCH(dev, rmsnorm_backward_kernel, row_blocks(T), NORM_THREADS, 0, 
        (S *)dinp, acc, (const S *)dout, (const S *)inp, (const S *)weight, rstd, T, C);
    cudaCheckLaunch("rmsnorm_backward", err);
    STORAGE_LAUNCH(dev, accumulate_kernel, grid_for(C, 256), 256, 0, (S *)dweight, acc, C);
    cudaCheckLaunch("rmsnorm_backward dweight", err);
    return DSARL_OK;
}

template <typename Storage>
static __global__ void layernorm_forward_kernel(Storage *out, float *mean, float *rstd, const Storage *inp,
                                                const Storage *weight, const Storage *bias, int64_t T, int64_t C,
                                                float eps)
{
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const Storage *x = inp + t * C;
        float s = 0.0f;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
            s += ldf(x + c);
        float m = block_sum(s) / (float)C, v = 0.0f;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
            v += (ldf(x + c) - m) * (ldf(x + c) - m);
        float r = rsqrtf(block_sum(v) / (float)C + eps); /* biased variance, as torch.nn.LayerNorm */
        if (threadIdx.x == 0) {
            mean[t] = m;
            rstd[t] = r;
        }
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
            stf(out + t * C + c, (ldf(x + c) - m) * r * ldf(weight + c) + ldf(bias + c));
    }
}

// acc: (2, C) fp32, dweight then dbias
template <typename Storage>
static __global__ void layernorm_backward_kernel(Storage *dinp, float *acc, const Storage *dout, const Storage *inp,
                                                 const Storage *weight, const float *mean, const float *rstd, int64_t T,
                                                 int64_t C)
{
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const Storage *x = inp + t * C, *d = dout + t * C;
        float m = mean[t], r = rstd[t], g_sum = 0.0f, gx_sum = 0.0f;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float g = ldf(d + c) * ldf(weight + c), xhat = (ldf(x + c) - m) * r;
            g_sum += g;
            gx_sum += g * xhat;
        }
        float g_mean = block_sum(g_sum) / (float)C, gx_mean = block_sum(gx_sum) / (float)C;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float dc = ldf(d + c), g = dc * ldf(weight + c), xhat = (ldf(x + c) - m) * r;
            stf(dinp + t * C + c, r * (g - g_mean - xhat * gx_mean));
            atomicAdd(acc + c, dc * xhat);
            atomicAdd(acc + C + c, dc);
        }
    }
}

int cuda_layernorm_forward(dsarl_device *dev, void *out, float *mean, float *rstd, const void *inp,
                           const void *weight, const void *bias, int64_t T, int64_t C, float eps, dsarl_error *err)
{
    if (T <= 0 || C <= 0)
        return DSARL_OK;
    STORAGE_LAUNCH(dev, layernorm_forward_kernel, row_blocks(T), NORM_THREADS, 0, 
        (S *)out, mean, rstd, (const S *)inp, (const S *)weight, (const S *)bias, T, C, eps);
    cudaCheckLaunch("layernorm_forward", err);
    return DSARL_OK;
}

int cuda_layernorm_backward(dsarl_device *dev, void *dinp, void *dweight, void *dbias, const void *dout,
                            const void *inp, const void *weight, const float *mean, const float *rstd, int64_t T,
                            int64_t C, dsarl_error *err)
{
    if (T <= 0 || C <= 0)
        return DSARL_OK;
    float *acc;
    DSARL_TRY(cuda_scratch(dev, 2 * (size_t)C * sizeof(float), (void **)&acc, err));
    cudaCheck(cudaMemsetAsync(acc, 0, 2 * (size_t)C * sizeof(float), CUDA_STREAM(dev)), err);
    STORAGE_LAUNCH(dev, layernorm_backward_kernel, row_blocks(T), NORM_THREADS, 0, 
        (S *)dinp, acc, (const S *)dout, (const S *)inp, (const S *)weight, mean, rstd, T, C);
    cudaCheckLaunch("layernorm_backward", err);
    STORAGE_LAUNCH(dev, accumulate_kernel, grid_for(C, 256), 256, 0, (S *)dweight, acc, C);
    STORAGE_LAUNCH(dev, accumulate_kernel, grid_for(C, 256), 256, 0, (S *)dbias, acc + C, C);
    cudaCheckLaunch("layernorm_backward dweight/dbias", err);
    return DSARL_OK;
}
