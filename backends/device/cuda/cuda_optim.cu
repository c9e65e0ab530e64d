/* cuda_optim.cu: AdamW (torch.optim.AdamW semantics) with fp32 master weights and moments, the sum of squares
 * for gradient norms (deterministic: fixed per-block partials in double, then one block), and in-place scaling. */
#include <math.h>
#include "cuda_common.cuh"

#define SUMSQ_BLOCKS 1024
#define SUMSQ_THREADS 256

template <typename Storage>
static __global__ void sum_squares_partial_kernel(double *partial, const Storage *x, int64_t n)
{
    double s = 0.0;
    GRID_STRIDE(i, n) {
        double xi = ldf(x + i);
        s += xi * xi;
    }
    s = block_sum_d(s);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = s;
}

static __global__ void sum_squares_final_kernel(float *out, const double *partial, int n_partial)
{
    double s = 0.0;
    for (int i = threadIdx.x; i < n_partial; i += blockDim.x)
        s += partial[i];
    s = block_sum_d(s);
    if (threadIdx.x == 0)
        out[0] = (float)s;
}

int cuda_sum_squares(dsarl_device *dev, float *out, const void *x, int64_t n, dsarl_error *err)
{
    double *partial;
    DSARL_TRY(cuda_scratch(dev, SUMSQ_BLOCKS * sizeof(double), (void **)&partial, err));
    // The grid is fixed, not sized by n, so the summation order (and the result) is the same on every run.
    STORAGE_LAUNCH(dev, sum_squares_partial_kernel, SUMSQ_BLOCKS, SUMSQ_THREADS, 0, partial, (const S *)x,
                                                                                     n > 0 ? n : 0);
    cudaCheckLaunch("sum_squares", err);
    sum_squares_final_kernel<<<1, SUMSQ_THREADS, 0, CUDA_STREAM(dev)>>>(out, partial, SUMSQ_BLOCKS);
    cudaCheckLaunch("sum_squares final", err);
    return DSARL_OK;
}

template <typename Storage>
static __global__ void scale_inplace_kernel(Storage *x, float alpha, int64_t n)
{
    GRID_STRIDE(i, n) { stf(x + i, alpha * ldf(x + i)); }
}

int cuda_scale(dsarl_device *dev, void *x, float alpha, int64_t n, dsarl_error *err)
{
    if (n <= 0)
        return DSARL_OK;
    STORAGE_LAUNCH(dev, scale_inplace_kernel, grid_for(n, 256), 256, 0, (S *)x, alpha, n);
    cudaCheckLaunch("scale", err);
    return DSARL_OK;
}

// The CPU device's float arithmetic, element by element: g = grad_scale * grad; master *= 1 - lr wd;
// m += (g - m)(1 - beta1) (torch's lerp); v = beta2 v + (1 - beta2) g^2; master -= step_size m / (sqrt(v)/sqrt(c2)
// + eps); the master is then written back to the storage-type weight.
template <typename Storage>
static __global__ void adamw_update_kernel(float *master, Storage *weight, const Storage *grad, float *m, float *v,
                                           int64_t n, float beta1, float beta2, float eps, float decay,
                                           float grad_scale, float step_size, float c2_sqrt)
{
    GRID_STRIDE(i, n) {
        float g = ldf(grad + i) * grad_scale, p = master[i] * decay;
        float mi = m[i] + (g - m[i]) * (1.0f - beta1);
        float vi = v[i] * beta2 + (1.0f - beta2) * g * g;
        p -= step_size * (mi / (sqrtf(vi) / c2_sqrt + eps));
        m[i] = mi;
        v[i] = vi;
        master[i] = p;
        if (weight)
            stf(weight + i, p);
    }
}

int cuda_adamw_update(dsarl_device *dev, float *master, void *weight, const void *grad, float *m, float *v,
                      int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                      int64_t step, dsarl_error *err)
{
    if (step < 1)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cuda: adamw_update step counts from 1, got %lld",
                          (long long)step);
    if (n <= 0)
        return DSARL_OK;
    double c1 = 1.0 - pow((double)beta1, (double)step), c2 = 1.0 - pow((double)beta2, (double)step);
    float step_size = (float)((double)lr / c1), c2_sqrt = (float)sqrt(c2), decay = 1.0f - lr * weight_decay;
    // weight == master only with float32 storage, where the master is the weight: no separate write-back
    void *write_back = weight == (void *)master ? NULL : weight;
    STORAGE_LAUNCH(dev, adamw_update_kernel, grid_for(n, 256), 256, 0, master, (S *)write_back, (const S *)grad, m,
                   v, n, beta1, beta2, eps, decay, grad_scale, step_size, c2_sqrt);
    cudaCheckLaunch("adamw_update", err);
    return DSARL_OK;
}
