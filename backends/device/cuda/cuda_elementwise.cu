/* cuda_elementwise.cu: strided copies, residual adds, axpy, float32 <-> storage conversion and SwiGLU on the storage
 * type (fp32 arithmetic). */
#include <math.h>
#include "cuda_common.cuh"

int cuda_copy_2d(dsarl_device *dev, void *dst, int64_t dst_stride, const void *src, int64_t src_stride,
                 int64_t rows, int64_t cols, dsarl_error *err)
{
    if (rows <= 0 || cols <= 0)
        return DSARL_OK;
    if (dst_stride < cols || src_stride < cols)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cuda: copy_2d strides (dst %lld, src %lld) must be at least "
                          "cols (%lld)", (long long)dst_stride, (long long)src_stride, (long long)cols);
    int64_t e = (int64_t)STORAGE_BYTES(dev);
    copy_rows(CUDA_STREAM(dev), dst, dst_stride * e, src, src_stride * e, NULL, rows, cols * e);
    cudaCheckLaunch("copy_2d", err);
    return DSARL_OK;
}

template <typename Storage>
static __global__ void add_kernel(Storage *out, const Storage *a, const Storage *b, int64_t n)
{
    GRID_STRIDE(i, n) { stf(out + i, ldf(a + i) + ldf(b + i)); }
}

int cuda_add(dsarl_device *dev, void *out, const void *a, const void *b, int64_t n, dsarl_error *err)
{
    if (n <= 0)
        return DSARL_OK;
    STORAGE_LAUNCH(dev, add_kernel, grid_for(n, 256), 256, 0, (S *)out, (const S *)a, (const S *)b, n);
    cudaCheckLaunch("add", err);
    return DSARL_OK;
}

template <typename Storage>
static __global__ void axpy_kernel(int64_t n, float alpha, const Storage *x, Storage *y)
{
    GRID_STRIDE(i, n) { stf(y + i, ldf(y + i) + alpha * ldf(x + i)); }
}

int cuda_axpy(dsarl_device *dev, int64_t n, float alpha, const void *x, void *y, dsarl_error *err)
{
    if (n <= 0)
        return DSARL_OK;
    STORAGE_LAUNCH(dev, axpy_kernel, grid_for(n, 256), 256, 0, n, alpha, (const S *)x, (S *)y);
    cudaCheckLaunch("axpy", err);
    return DSARL_OK;
}

template <typename Dst, typename Src>
static __global__ void convert_kernel(Dst *dst, const Src *src, int64_t n, float alpha)
{
    GRID_STRIDE(i, n) { stf(dst + i, alpha * ldf(src + i)); }
}

int cuda_convert(dsarl_device *dev, void *dst, dsarl_dtype dst_dtype, const void *src, dsarl_dtype src_dtype,
                 int64_t n, float alpha, dsarl_error *err)
{
    dsarl_dtype storage = cuda_storage_dtype(dev);
    bool dst_ok = dst_dtype == DSARL_DTYPE_F32 || dst_dtype == storage;
    bool src_ok = src_dtype == DSARL_DTYPE_F32 || src_dtype == storage;
    if (!dst_ok || !src_ok)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cuda: convert handles float32 and the storage dtype (%d) "
                          "only, got dtypes %d -> %d", (int)storage, (int)src_dtype, (int)dst_dtype);
    if (n <= 0)
        return DSARL_OK;
    unsigned int grid = grid_for(n, 256);
    cudaStream_t st = CUDA_STREAM(dev);
    bool df = dst_dtype == DSARL_DTYPE_F32, sf = src_dtype == DSARL_DTYPE_F32;
    if (df && sf)
        convert_kernel<float, float><<<grid, 256, 0, st>>>((float *)dst, (const float *)src, n, alpha);
    else if (df)
        convert_kernel<float, bf16><<<grid, 256, 0, st>>>((float *)dst, (const bf16 *)src, n, alpha);
    else if (sf)
        convert_kernel<bf16, float><<<grid, 256, 0, st>>>((bf16 *)dst, (const float *)src, n, alpha);
    else
        convert_kernel<bf16, bf16><<<grid, 256, 0, st>>>((bf16 *)dst, (const bf16 *)src, n, alpha);
    cudaCheckLaunch("convert", err);
    return DSARL_OK;
}

// out (T,inner) = silu(gate) * up, inp rows [gate | up]
template <typename Storage>
static __global__ void swiglu_forward_kernel(Storage *out, const Storage *inp, int64_t T, int64_t inner)
{
    GRID_STRIDE(i, T * inner) {
        int64_t t = i / inner, j = i % inner;
        float g = ldf(inp + t * 2 * inner + j), u = ldf(inp + t * 2 * inner + inner + j);
        stf(out + i, g / (1.0f + expf(-g)) * u);
    }
}

template <typename Storage>
static __global__ void swiglu_backward_kernel(Storage *dinp, const Storage *dout, const Storage *inp, int64_t T,
                                              int64_t inner)
{
    GRID_STRIDE(i, T * inner) {
        int64_t t = i / inner, j = i % inner;
        float g = ldf(inp + t * 2 * inner + j), u = ldf(inp + t * 2 * inner + inner + j), d = ldf(dout + i);
        float sig = 1.0f / (1.0f + expf(-g));
        // d silu/dg = sig * (1 + g * (1 - sig))
        stf(dinp + t * 2 * inner + j, d * u * sig * (1.0f + g * (1.0f - sig)));
        stf(dinp + t * 2 * inner + inner + j, d * g * sig);
    }
}

int cuda_swiglu_forward(dsarl_device *dev, void *out, const void *inp, int64_t T, int64_t inner, dsarl_error *err)
{
    if (T * inner <= 0)
        return DSARL_OK;
    STORAGE_LAUNCH(dev, swiglu_forward_kernel, grid_for(T * inner, 256), 256, 0, (S *)out, (const S *)inp,
                                                                                  T, inner);
    cudaCheckLaunch("swiglu_forward", err);
    return DSARL_OK;
}

int cuda_swiglu_backward(dsarl_device *dev, void *dinp, const void *dout, const void *inp, int64_t T, int64_t inner,
                         dsarl_error *err)
{
    if (T * inner <= 0)
        return DSARL_OK;
    STORAGE_LAUNCH(dev, swiglu_backward_kernel, grid_for(T * inner, 256), 256, 0, 
        (S *)dinp, (const S *)dout, (const S *)inp, T, inner);
    cudaCheckLaunch("swiglu_backward", err);
    return DSARL_OK;
}
