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
// + eps); the master is then written back to the storage-type weight. Both kernels below run exactly this on each
// element, so the vector kernel's results are the scalar kernel's to the bit.
struct adamw_args {
    float beta1, beta2, eps, decay, grad_scale, step_size, c2_sqrt;
};

// One element: master, m, v updated in place; returns the new master.
static __device__ __forceinline__ float adamw_element(float grad, float *master, float *m, float *v,
                                                      const adamw_args a)
{
    float g = grad * a.grad_scale, p = *master * a.decay;
    float mi = *m + (g - *m) * (1.0f - a.beta1);
    float vi = *v * a.beta2 + (1.0f - a.beta2) * g * g;
    p -= a.step_size * (mi / (sqrtf(vi) / a.c2_sqrt + a.eps));
    *m = mi, *v = vi, *master = p;
    return p;
}

// Elements [0, head) and [tail, n): the parts before and after the aligned middle the vector kernel takes.
template <typename Storage>
static __global__ void adamw_update_kernel(float *master, Storage *weight, const Storage *grad, float *m, float *v,
                                           int64_t head, int64_t tail, int64_t n, adamw_args a)
{
    GRID_STRIDE(j, head + (n - tail)) {
        int64_t i = j < head ? j : tail + (j - head);
        float p = adamw_element(ldf(grad + i), master + i, m + i, v + i, a);
        if (weight)
            stf(weight + i, p);
    }
}

// Four storage elements as one load or store (8 bytes of bf16, 16 of float32).
template <typename Storage> struct storage4;
template <> struct storage4<bf16> {
    typedef uint2 type;
    static __device__ __forceinline__ void unpack(type w, float *f)
    {
        __nv_bfloat162 lo = *reinterpret_cast<__nv_bfloat162 *>(&w.x), hi = *reinterpret_cast<__nv_bfloat162 *>(&w.y);
        f[0] = __low2float(lo), f[1] = __high2float(lo), f[2] = __low2float(hi), f[3] = __high2float(hi);
    }
    static __device__ __forceinline__ type pack(const float *f)
    {
        __nv_bfloat162 lo = __floats2bfloat162_rn(f[0], f[1]), hi = __floats2bfloat162_rn(f[2], f[3]);
        type w;
        w.x = *reinterpret_cast<unsigned int *>(&lo), w.y = *reinterpret_cast<unsigned int *>(&hi);
        return w;
    }
};
template <> struct storage4<float> {
    typedef float4 type;
    static __device__ __forceinline__ void unpack(type w, float *f) { f[0] = w.x, f[1] = w.y, f[2] = w.z, f[3] = w.w; }
    static __device__ __forceinline__ type pack(const float *f) { return make_float4(f[0], f[1], f[2], f[3]); }
};

// Groups of four elements of [head, head + 4 n4), every array aligned there for one wide access per group: AdamW is
// bound by its 28 bytes per element (bf16), and two-byte accesses leave much of the bandwidth unused.
template <typename Storage>
static __global__ void adamw_update_vec4_kernel(float *master, Storage *weight, const Storage *grad, float *m, float *v,
                                                int64_t head, int64_t n4, adamw_args a)
{
    typedef typename storage4<Storage>::type wide;
    float4 *master4 = reinterpret_cast<float4 *>(master + head), *m4 = reinterpret_cast<float4 *>(m + head);
    float4 *v4 = reinterpret_cast<float4 *>(v + head);
    const wide *grad4 = reinterpret_cast<const wide *>(grad + head);
    wide *weight4 = weight ? reinterpret_cast<wide *>(weight + head) : NULL;
    GRID_STRIDE(j, n4) {
        float g[4], p[4];
        storage4<Storage>::unpack(grad4[j], g);
        float4 mw = master4[j], mm = m4[j], vv = v4[j];
        float *mf = &mw.x, *mmf = &mm.x, *vf = &vv.x;
        for (int e = 0; e < 4; e++)
            p[e] = adamw_element(g[e], mf + e, mmf + e, vf + e, a);
        master4[j] = mw, m4[j] = mm, v4[j] = vv;
        if (weight4)
            weight4[j] = storage4<Storage>::pack(p);
    }
}

// Elements before the first index where every array is aligned for the vector kernel, or -1 when they never all
// are (their addresses disagree modulo the alignment).
static int64_t aligned_head(const void *const *ptrs, const size_t *elem, const size_t *align, int count, int64_t n)
{
    for (int64_t h = 0; h < 4 && h < n; h++) {
        bool ok = true;
        for (int i = 0; i < count && ok; i++)
            ok = !ptrs[i] || ((uintptr_t)ptrs[i] + (uintptr_t)h * elem[i]) % align[i] == 0;
        if (ok)
            return h;
    }
    return -1;
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
    adamw_args a = {beta1, beta2, eps, 1.0f - lr * weight_decay, grad_scale, (float)((double)lr / c1),
                    (float)sqrt(c2)};
    // weight == master only with float32 storage, where the master is the weight: no separate write-back
    void *write_back = weight == (void *)master ? NULL : weight;
    size_t se = STORAGE_BYTES(dev);
    const void *ptrs[5] = {master, m, v, grad, write_back};
    const size_t elem[5] = {4, 4, 4, se, se}, align[5] = {16, 16, 16, 4 * se, 4 * se};
    int64_t head = aligned_head(ptrs, elem, align, 5, n), n4 = head < 0 ? 0 : (n - head) / 4;
    if (head < 0)
        head = n;
    int64_t tail = head + 4 * n4;
    if (n4 > 0) {
        STORAGE_LAUNCH(dev, adamw_update_vec4_kernel, grid_for(n4, 256), 256, 0, master, (S *)write_back,
                       (const S *)grad, m, v, head, n4, a);
        cudaCheckLaunch("adamw_update", err);
    }
    if (head + (n - tail) > 0) {
        STORAGE_LAUNCH(dev, adamw_update_kernel, grid_for(head + (n - tail), 256), 256, 0, master, (S *)write_back,
                       (const S *)grad, m, v, head, tail, n, a);
        cudaCheckLaunch("adamw_update", err);
    }
    return DSARL_OK;
}
