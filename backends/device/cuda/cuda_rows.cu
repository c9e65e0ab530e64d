/* cuda_rows.cu: row-wise moves: token embedding (forward and its scatter backward), the MoE permutation
 * (gather_rows) and unpermutation (scatter_add_rows), per-row scaling and per-row dot products.
 *
 * Scatters are deterministic: a stable radix sort groups the source rows by destination (keeping source order), and
 * one block per destination sums its rows in fp32 and adds the total to the bf16 destination once. No atomics, so
 * the result does not depend on scheduling, and a row repeated many times is rounded to bf16 once. (The first
 * version found each destination's rows by an O(n^2) scan: 8K tokens x top-8 took milliseconds per call.) */
#include <limits.h>
#include <cub/device/device_radix_sort.cuh>
#include "cuda_common.cuh"

#define ROWS_THREADS 256

// Reads the device flag a kernel set on bad input; returns the recorded value (0 = none) and clears it.
static int take_flag(dsarl_device *dev, int *value, dsarl_error *err)
{
    cudaCheck(cudaMemcpyAsync(value, dev->flag, sizeof(int), cudaMemcpyDeviceToHost, CUDA_STREAM(dev)), err);
    DSARL_TRY(cuda_comm_wait(dev, dev->compute, err)); // watched: collectives may be queued before it
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

// out row keys[i] += sum over the run of equal keys starting at i of scale[src[j]] * inp row src[j], in fp32 in the
// order of j (the stable sort keeps source order within a run), added to the storage-type row once. One block per
// run head; the other blocks return at once.
template <typename Storage>
static __global__ void scatter_sorted_kernel(Storage *out, const Storage *inp, const int32_t *keys,
                                             const int32_t *src, const float *scale, int64_t n, int64_t C)
{
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int32_t dst = keys[i];
        if (i > 0 && keys[i - 1] == dst)
            continue; /* not the head of its run (block-uniform) */
        int64_t end = i + 1;
        while (end < n && keys[end] == dst)
            end++;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float total = 0.0f;
            for (int64_t j = i; j < end; j++) {
                int64_t r = src[j];
                total += (scale ? scale[r] : 1.0f) * ldf(inp + r * C + c);
            }
            Storage *o = out + (int64_t)dst * C + c;
            stf(o, ldf(o) + total);
        }
    }
}

static __global__ void iota_kernel(int32_t *x, int64_t n)
{
    GRID_STRIDE(i, n) { x[i] = (int32_t)i; }
}

// Deterministic scatter: a stable radix sort of (destination, source) pairs, then one fp32 sum per destination in
// source order (as the CPU device adds), so the result depends on neither scheduling nor atomics.
static int scatter_rows(dsarl_device *dev, void *out, const void *inp, const int32_t *rows, const float *scale,
                        int64_t n, int64_t C, const char *what, dsarl_error *err)
{
    if (n <= 0 || C <= 0)
        return DSARL_OK;
    if (n > INT32_MAX)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "device cuda: %s supports at most 2^31 - 1 rows, got %lld", what,
                          (long long)n);
    cudaStream_t stream = CUDA_STREAM(dev);
    size_t temp = 0;
    cudaCheck(cub::DeviceRadixSort::SortPairs(NULL, temp, (const int32_t *)NULL, (int32_t *)NULL,
                                              (const int32_t *)NULL, (int32_t *)NULL, (int)n, 0, 32, stream), err);
    size_t list = ((size_t)n * sizeof(int32_t) + 255) / 256 * 256;
    char *scratch = NULL;
    DSARL_TRY(cuda_scratch(dev, 3 * list + temp, (void **)&scratch, err));
    int32_t *keys = (int32_t *)scratch, *src_in = (int32_t *)(scratch + list), *src = (int32_t *)(scratch + 2 * list);
    iota_kernel<<<grid_for(n, 256), 256, 0, stream>>>(src_in, n);
    cudaCheckLaunch(what, err);
    cudaCheck(cub::DeviceRadixSort::SortPairs(scratch + 3 * list, temp, rows, keys, src_in, src, (int)n, 0, 32,
                                              stream), err);
    unsigned int blocks = (unsigned int)(n < (1 << 20) ? n : (1 << 20));
    STORAGE_LAUNCH(dev, scatter_sorted_kernel, blocks, ROWS_THREADS, 0, (S *)out, (const S *)inp, keys, src, scale,
                   n, C);
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

int cuda_gather_rows(dsarl_device *dev, void *out, const void *inp, const int32_t *rows, int64_t n, int64_t C,
                     dsarl_error *err)
{
    if (n * C <= 0)
        return DSARL_OK;
    int64_t row_bytes = C * (int64_t)STORAGE_BYTES(dev);
    copy_rows(CUDA_STREAM(dev), out, row_bytes, inp, row_bytes, rows, n, row_bytes);
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
