/* cuda_rows.cu: row-wise moves: token embedding (forward and its scatter backward), the MoE permutation
 * (gather_rows) and unpermutation (scatter_add_rows), per-row scaling and per-row dot products.
 *
 * Scatters are deterministic: the block that owns the first occurrence of a destination row sums every source
 * row aimed at it, in source order, in fp32, and adds the total to the bf16 destination once. No atomics, so the
 * result does not depend on scheduling, and a row repeated many times is rounded to bf16 once. (Fast path for
 * later: sort by destination once per step and use segmented sums; the scan below is O(n^2) integer compares.) */
#include <limits.h>
#include "cuda_common.cuh"

#define ROWS_THREADS 256

// Reads the device flag a kernel set on bad input; returns the recorded value (0 = none) and clears it.
static int take_flag(dsarl_device *dev, int *value, dsarl_error *err)
{
    cudaCheck(cudaMemcpyAsync(value, dev->flag, sizeof(int), cudaMemcpyDeviceToHost, CUDA_STREAM(dev)), err);
    cudaCheck(cudaStreamSynchronize(CUDA_STREAM(dev)), err);
    if (*value)
        cudaCheck(cudaMemsetAsync(dev->flag, 0, sizeof(int), CUDA_STREAM(dev)), err);
    return DSARL_OK;
}

template <typename Storage>
static __global__ void embedding_forward_kernel(Storage *out, const int32_t *tokens, const Storage *wte, int64_t T,
                                                int64_t C, int64_t V, int *flag)
{
    GRID_STRIDE(i, T * C) {
        int64_t t = i / C, c = i % C;
        int32_t tok = tokens[t];
        if (tok < 0 || tok >= V) {
            atomicCAS(flag, 0, (int)(t + 1)); /* one bad position is enough for the message */
            continue;
        }
        out[i] = wte[(int64_t)tok * C + c];
    }
}

int cuda_embedding_forward(dsarl_device *dev, void *out, const int32_t *tokens, const void *wte, int64_t T,
                           int64_t C, int64_t V, dsarl_error *err)
{
    if (T * C <= 0)
        return DSARL_OK;
    STORAGE_LAUNCH(dev, embedding_forward_kernel, grid_for(T * C, 256), 256, 0, 
        (S *)out, tokens, (const S *)wte, T, C, V, dev->flag);
    cudaCheckLaunch("embedding_forward", err);
    // One synchronisation per forward pass buys the CPU device's error for a bad token id.
    int bad = 0;
    DSARL_TRY(take_flag(dev, &bad, err));
    if (bad)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cuda: a token id at position %d is outside the vocabulary "
                          "[0, %lld)", bad - 1, (long long)V);
    return DSARL_OK;
}

// out row rows[r] += sum over r' with rows[r'] == rows[r] of scale[r'] * inp row r', summed in fp32 in order of r'.
// Dynamic shared memory: C floats (the row total).
template <typename Storage>
static __global__ void scatter_rows_kernel(Storage *out, const Storage *inp, const int32_t *rows, const float *scale,
                                           int64_t n, int64_t C)
{
    extern __shared__ float total[];              // (C)
    __shared__ int32_t matches[ROWS_THREADS];     // source rows of one chunk, in order
    __shared__ int n_matches;
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        const int32_t dst = rows[r];
        int earlier = 0;
        for (int64_t q = threadIdx.x; q < r && !earlier; q += blockDim.x)
            earlier = rows[q] == dst;
        if (__syncthreads_or(earlier))
            continue; /* an earlier block row owns this destination */
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
            total[c] = 0.0f;
        for (int64_t base = r; base < n; base += blockDim.x) {
            int64_t q = base + threadIdx.x;
            __shared__ unsigned char hit[ROWS_THREADS];
            hit[threadIdx.x] = q < n && rows[q] == dst;
            __syncthreads();
            if (threadIdx.x == 0) { /* keep source order: one thread compacts the chunk */
                int m = 0;
                for (int i = 0; i < (int)blockDim.x; i++)
                    if (hit[i])
                        matches[m++] = (int32_t)(base + i);
                n_matches = m;
            }
            __syncthreads();
            for (int i = 0; i < n_matches; i++) {
                int64_t src = matches[i];
                float a = scale ? scale[src] : 1.0f;
                for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
                    total[c] += a * ldf(inp + src * C + c);
            }
            __syncthreads();
        }
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            Storage *o = out + (int64_t)dst * C + c;
            stf(o, ldf(o) + total[c]);
        }
        __syncthreads();
    }
}

static int scatter_rows(dsarl_device *dev, void *out, const void *inp, const int32_t *rows, const float *scale,
                        int64_t n, int64_t C, const char *what, dsarl_error *err)
{
    if (n <= 0 || C <= 0)
        return DSARL_OK;
    size_t shared = (size_t)C * sizeof(float);
    if (shared > 200 * 1024)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "device cuda: %s supports rows of at most %d columns, got %lld",
                          what, 200 * 1024 / 4, (long long)C);
    if (shared > 48 * 1024) {
        cudaCheck(cudaFuncSetAttribute(scatter_rows_kernel<bf16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)shared), err);
        cudaCheck(cudaFuncSetAttribute(scatter_rows_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)shared), err);
    }
    unsigned int blocks = (unsigned int)(n < 65535 ? n : 65535);
    STORAGE_LAUNCH(dev, scatter_rows_kernel, blocks, ROWS_THREADS, shared, (S *)out, (const S *)inp, rows,
                                                                            scale, n, C);
    cudaCheckLaunch(what, err);
    return DSARL_OK;
}

int cuda_embedding_backward(dsarl_device *dev, void *dwte, const void *dout, const int32_t *tokens, int64_t T,
                            int64_t C, dsarl_error *err)
{
    return scatter_rows(dev, dwte, dout, tokens, NULL, T, C, "embedding_backward", err);
}

int cuda_scatter_add_rows(dsarl_device *dev, void *out, const void *inp, const int32_t *rows, const float *scale,
                          int64_t n, int64_t C, dsarl_error *err)
{
    return scatter_rows(dev, out, inp, rows, scale, n, C, "scatter_add_rows", err);
}

template <typename Storage>
static __global__ void gather_rows_kernel(Storage *out, const Storage *inp, const int32_t *rows, int64_t n, int64_t C)
{
    GRID_STRIDE(i, n * C) { out[i] = inp[(int64_t)rows[i / C] * C + i % C]; }
}

int cuda_gather_rows(dsarl_device *dev, void *out, const void *inp, const int32_t *rows, int64_t n, int64_t C,
                     dsarl_error *err)
{
    if (n * C <= 0)
        return DSARL_OK;
    STORAGE_LAUNCH(dev, gather_rows_kernel, grid_for(n * C, 256), 256, 0, (S *)out, (const S *)inp, rows, n,
                                                                           C);
    cudaCheckLaunch("gather_rows", err);
    return DSARL_OK;
}

template <typename Storage>
static __global__ void scale_rows_kernel(Storage *x, const float *scale, int64_t n, int64_t C)
{
    GRID_STRIDE(i, n * C) { stf(x + i, ldf(x + i) * scale[i / C]); }
}

int cuda_scale_rows(dsarl_device *dev, void *x, const float *scale, int64_t n, int64_t C, dsarl_error *err)
{
    if (n * C <= 0)
        return DSARL_OK;
    STORAGE_LAUNCH(dev, scale_rows_kernel, grid_for(n * C, 256), 256, 0, (S *)x, scale, n, C);
    cudaCheckLaunch("scale_rows", err);
    return DSARL_OK;
}

template <typename Storage>
static __global__ void row_dot_kernel(float *out, const Storage *a, const Storage *b, int64_t n, int64_t C)
{
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        float s = 0.0f;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
            s += ldf(a + r * C + c) * ldf(b + r * C + c);
        s = block_sum(s);
        if (threadIdx.x == 0)
            out[r] = s;
    }
}

int cuda_row_dot(dsarl_device *dev, float *out, const void *a, const void *b, int64_t n, int64_t C,
                 dsarl_error *err)
{
    if (n <= 0)
        return DSARL_OK;
    STORAGE_LAUNCH(dev, row_dot_kernel, (unsigned int)(n < 65535 ? n : 65535), 256, 0, out, (const S *)a,
                                                                                       (const S *)b, n, C);
    cudaCheckLaunch("row_dot", err);
    return DSARL_OK;
}
