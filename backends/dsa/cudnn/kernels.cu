/* kernels.cu: the small kernels around the cuDNN graphs: gathering packed segments into zero-padded [B, S, row]
 * buffers and back, lse <-> Stats layout, the top-k bias, page-table compaction and rows without an index.
 * All launch on the legacy default stream, like cuDNN's handle and the tilelang kernels. */
#include "cuda_common.cuh"
#include "cudnn_dsa.h"

#define cdnCheckLaunch(what, err)                                                                               \
    do {                                                                                                        \
        cudaError_t cdn_launch_rc_ = cudaGetLastError();                                                        \
        if (cdn_launch_rc_ != cudaSuccess)                                                                      \
            return dsarl_error_set((err), DSARL_E_DEVICE, __FILE__, __LINE__, "dsa cudnn: launching %s failed: %s", \
                                   (what), cudaGetErrorString(cdn_launch_rc_));                                 \
    } while (0)

// dst (n, S, row) bf16 from the packed rows of each segment; zeros past its length. One thread per element.
template <typename Src>
static __global__ void gather_kernel(bf16 *dst, const Src *src, const int32_t *segments, int64_t S, int64_t row,
                                     int64_t total)
{
    GRID_STRIDE(i, total)
    {
        int64_t c = i % row, r = (i / row) % S, b = i / (row * S);
        int32_t offset = segments[2 * b], length = segments[2 * b + 1];
        dst[i] = r < length ? __float2bfloat16(ldf(src + (offset + r) * row + c)) : __float2bfloat16(0.0f);
    }
}

// The same for bf16 rows whose width is a multiple of 8: 16-byte copies.
static __global__ void gather_vec_kernel(uint4 *dst, const uint4 *src, const int32_t *segments, int64_t S,
                                         int64_t row_vec, int64_t total)
{
    GRID_STRIDE(i, total)
    {
        int64_t c = i % row_vec, r = (i / row_vec) % S, b = i / (row_vec * S);
        int32_t offset = segments[2 * b], length = segments[2 * b + 1];
        dst[i] = r < length ? src[(offset + r) * row_vec + c] : make_uint4(0, 0, 0, 0);
    }
}

template <typename Dst>
static __global__ void scatter_kernel(Dst *dst, const bf16 *src, const int32_t *segments, int64_t S, int64_t row,
                                      int64_t total)
{
    GRID_STRIDE(i, total)
    {
        int64_t c = i % row, r = (i / row) % S, b = i / (row * S);
        int32_t offset = segments[2 * b], length = segments[2 * b + 1];
        if (r < length)
            stf(dst + (offset + r) * row + c, __bfloat162float(src[i]));
    }
}

static __global__ void scatter_vec_kernel(uint4 *dst, const uint4 *src, const int32_t *segments, int64_t S,
                                          int64_t row_vec, int64_t total)
{
    GRID_STRIDE(i, total)
    {
        int64_t c = i % row_vec, r = (i / row_vec) % S, b = i / (row_vec * S);
        int32_t offset = segments[2 * b], length = segments[2 * b + 1];
        if (r < length)
            dst[(offset + r) * row_vec + c] = src[i];
    }
}

int cdn_gather_segments(void *stream, void *dst, const void *src, int src_f32, const int32_t *segments, int n_entries,
                        int64_t S, int64_t row, dsarl_error *err)
{
    int64_t total = (int64_t)n_entries * S * row;
    if (total <= 0)
        return DSARL_OK;
    if (!src_f32 && row % 8 == 0 && ((uintptr_t)src | (uintptr_t)dst) % 16 == 0) {
        int64_t vec = total / 8;
        gather_vec_kernel<<<grid_for(vec, 256), 256, 0, (cudaStream_t)stream>>>((uint4 *)dst, (const uint4 *)src,
                                                                                segments, S, row / 8, vec);
    } else if (src_f32) {
        gather_kernel<float><<<grid_for(total, 256), 256, 0, (cudaStream_t)stream>>>((bf16 *)dst, (const float *)src,
                segments, S, row, total);
    } else {
        gather_kernel<bf16><<<grid_for(total, 256), 256, 0, (cudaStream_t)stream>>>((bf16 *)dst, (const bf16 *)src,
                segments, S, row, total);
    }
    cdnCheckLaunch("the segment gather", err);
    return DSARL_OK;
}

int cdn_scatter_segments(void *stream, void *dst, int dst_f32, const void *src, const int32_t *segments,
                         int n_entries, int64_t S, int64_t row, dsarl_error *err)
{
    int64_t total = (int64_t)n_entries * S * row;
    if (total <= 0)
        return DSARL_OK;
    if (!dst_f32 && row % 8 == 0 && ((uintptr_t)src | (uintptr_t)dst) % 16 == 0) {
        int64_t vec = total / 8;
        scatter_vec_kernel<<<grid_for(vec, 256), 256, 0, (cudaStream_t)stream>>>((uint4 *)dst, (const uint4 *)src,
                segments, S, row / 8, vec);
    } else if (dst_f32) {
        scatter_kernel<float><<<grid_for(total, 256), 256, 0, (cudaStream_t)stream>>>((float *)dst, (const bf16 *)src,
                segments, S, row, total);
    } else {
        scatter_kernel<bf16><<<grid_for(total, 256), 256, 0, (cudaStream_t)stream>>>((bf16 *)dst, (const bf16 *)src,
                segments, S, row, total);
    }
    cdnCheckLaunch("the segment scatter", err);
    return DSARL_OK;
}

// stats (n, H, S) <-> lse (T, H)
static __global__ void stats_kernel(float *lse, float *stats, const int32_t *segments, int64_t S, int64_t H,
                                    int64_t total, int to_lse)
{
    GRID_STRIDE(i, total)
    {
        int64_t r = i % S, h = (i / S) % H, b = i / (S * H);
        int32_t offset = segments[2 * b], length = segments[2 * b + 1];
        if (to_lse) {
            if (r < length)
                lse[(offset + r) * H + h] = stats[i];
        } else {
            stats[i] = r < length ? lse[(offset + r) * H + h] : 0.0f;
        }
    }
}

int cdn_scatter_stats(void *stream, float *lse, const float *stats, const int32_t *segments, int n_entries, int64_t S,
                      int64_t H, dsarl_error *err)
{
    int64_t total = (int64_t)n_entries * S * H;
    if (total <= 0)
        return DSARL_OK;
    stats_kernel<<<grid_for(total, 256), 256, 0, (cudaStream_t)stream>>>(lse, (float *)stats, segments, S, H, total, 1);
    cdnCheckLaunch("the lse scatter", err);
    return DSARL_OK;
}

int cdn_gather_stats(void *stream, float *stats, const float *lse, const int32_t *segments, int n_entries, int64_t S,
                     int64_t H, dsarl_error *err)
{
    int64_t total = (int64_t)n_entries * S * H;
    if (total <= 0)
        return DSARL_OK;
    stats_kernel<<<grid_for(total, 256), 256, 0, (cudaStream_t)stream>>>((float *)lse, stats, segments, S, H, total, 0);
    cdnCheckLaunch("the lse gather", err);
    return DSARL_OK;
}

#define CDN_MASKED (-1.0e9f)

// Every row: 0 where DSA keeps every eligible key (r + 1 <= topk) or on padding rows, else -1e9.
static __global__ void bias_fill_kernel(bf16 *bias, const int32_t *segments, int64_t S, int32_t topk, int64_t total)
{
    GRID_STRIDE(i, total)
    {
        int64_t r = (i / S) % S, b = i / (S * S);
        int32_t length = segments[2 * b + 1];
        bias[i] = __float2bfloat16(r >= length || r + 1 <= topk ? 0.0f : CDN_MASKED);
    }
}

// Rows r + 1 > topk: 0 at each selected key (absolute index -> segment-relative), one thread per index slot.
static __global__ void bias_select_kernel(bf16 *bias, const int32_t *indices, int32_t topk, const int32_t *segments,
                                          int64_t S, int64_t total)
{
    GRID_STRIDE(i, total)
    {
        int64_t slot = i % topk, r = (i / topk) % S, b = i / (topk * S);
        int32_t offset = segments[2 * b], length = segments[2 * b + 1];
        if (r >= length || r + 1 <= topk)
            continue;
        int32_t key = indices[(offset + r) * (int64_t)topk + slot] - offset;
        if (key >= 0 && key <= r)
            bias[(b * S + r) * S + key] = __float2bfloat16(0.0f);
    }
}

int cdn_build_bias(void *stream, void *bias, const int32_t *indices, int32_t topk, const int32_t *segments,
                   int n_entries, int64_t S, dsarl_error *err)
{
    int64_t total = (int64_t)n_entries * S * S;
    if (total <= 0)
        return DSARL_OK;
    bias_fill_kernel<<<grid_for(total, 256), 256, 0, (cudaStream_t)stream>>>((bf16 *)bias, segments, S, topk, total);
    cdnCheckLaunch("the top-k bias fill", err);
    int64_t slots = (int64_t)n_entries * S * topk;
    bias_select_kernel<<<grid_for(slots, 256), 256, 0, (cudaStream_t)stream>>>((bf16 *)bias, indices, topk, segments,
                                                                               S, slots);
    cdnCheckLaunch("the top-k bias select", err);
    return DSARL_OK;
}

// One warp per row: valid indices to the front in their order (ballot + prefix count), the rest = first valid.
static __global__ void compact_kernel(int32_t *table, int32_t *seq_kv, int32_t *seq_q, const int32_t *indices,
                                      int64_t T, int32_t topk, int32_t heads)
{
    int lane = threadIdx.x & 31;
    int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t t = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; t < T; t += warps) {
        const int32_t *row = indices + t * topk;
        int32_t *out = table + t * topk;
        int32_t count = 0, first = -1;
        for (int32_t base = 0; base < topk; base += 32) {
            int32_t i = base + lane;
            int32_t v = i < topk ? row[i] : -1;
            unsigned valid = __ballot_sync(0xffffffffu, v >= 0);
            if (first < 0 && valid)
                first = __shfl_sync(0xffffffffu, v, __ffs(valid) - 1);
            if (v >= 0)
                out[count + __popc(valid & ((1u << lane) - 1u))] = v;
            count += __popc(valid);
        }
        __syncwarp();
        int32_t fill = first < 0 ? 0 : first;
        for (int32_t i = count + lane; i < topk; i += 32)
            out[i] = fill;
        if (lane == 0) {
            seq_kv[t] = count > 0 ? count : 1;
            seq_q[t] = heads;
        }
    }
}

int cdn_compact_indices(void *stream, int32_t *table, int32_t *seq_kv, int32_t *seq_q, const int32_t *indices,
                        int64_t T, int32_t topk, int32_t heads, dsarl_error *err)
{
    if (T <= 0)
        return DSARL_OK;
    compact_kernel<<<grid_for(T * 32, 256), 256, 0, (cudaStream_t)stream>>>(table, seq_kv, seq_q, indices, T, topk,
                                                                            heads);
    cdnCheckLaunch("the page-table compaction", err);
    return DSARL_OK;
}

// One block per row: if every slot is -1, out row = 0 and lse = +inf (the contract for a row with nothing to see).
static __global__ void empty_rows_kernel(bf16 *out, float *lse, const int32_t *indices, int64_t T, int32_t topk,
                                         int32_t heads, int32_t d_v)
{
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        int any = 0;
        for (int32_t i = threadIdx.x; i < topk; i += blockDim.x)
            any |= indices[t * topk + i] >= 0;
        if (__syncthreads_or(any))
            continue;
        for (int64_t i = threadIdx.x; i < (int64_t)heads * d_v; i += blockDim.x)
            out[t * heads * d_v + i] = __float2bfloat16(0.0f);
        for (int32_t h = threadIdx.x; h < heads; h += blockDim.x)
            lse[t * heads + h] = __int_as_float(0x7f800000);
    }
}

int cdn_fix_empty_rows(void *stream, void *out, float *lse, const int32_t *indices, int64_t T, int32_t topk,
                       int32_t heads, int32_t d_v, dsarl_error *err)
{
    if (T <= 0)
        return DSARL_OK;
    empty_rows_kernel<<<(unsigned)(T < 65535 * 8 ? T : 65535 * 8), 128, 0, (cudaStream_t)stream>>>((bf16 *)out, lse,
            indices, T, topk, heads, d_v);
    cdnCheckLaunch("the empty-row fix-up", err);
    return DSARL_OK;
}
