/* cuda_common.cuh: what every .cu file of the CUDA device plugin shares: checked CUDA/cuBLAS calls that return a
 * dsarl_error (never exit()), bf16 <-> fp32 helpers, launch geometry and block reductions. */
#ifndef DSARL_CUDA_COMMON_CUH
#define DSARL_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "cuda_device.h"

typedef __nv_bfloat16 bf16;

/* Returns a DSARL_E_DEVICE error naming the call site and CUDA's message when call fails. */
#define cudaCheck(call, err)                                                                                    \
    do {                                                                                                        \
        cudaError_t cuda_check_rc_ = (call);                                                                    \
        if (cuda_check_rc_ != cudaSuccess)                                                                      \
            return dsarl_error_set((err), DSARL_E_DEVICE, __FILE__, __LINE__, "device cuda: %s failed: %s",    \
                                   #call, cudaGetErrorString(cuda_check_rc_));                                  \
    } while (0)

/* After a kernel launch: reports a bad launch configuration (the kernel's own faults surface at synchronize). */
#define cudaCheckLaunch(what, err)                                                                              \
    do {                                                                                                        \
        cudaError_t cuda_launch_rc_ = cudaGetLastError();                                                       \
        if (cuda_launch_rc_ != cudaSuccess)                                                                     \
            return dsarl_error_set((err), DSARL_E_DEVICE, __FILE__, __LINE__,                                   \
                                   "device cuda: launching %s failed: %s", (what),                              \
                                   cudaGetErrorString(cuda_launch_rc_));                                        \
    } while (0)

#define CUDA_STREAM(dev) ((cudaStream_t)(dev)->compute)

/* Storage element loads and stores: kernels are templates over the storage type (bf16, or float32 when the
 * device runs with runtime.cuda_storage_dtype=f32) and compute in fp32 either way. */
static inline __device__ float ldf(const bf16 *p) { return __bfloat162float(*p); }
static inline __device__ void stf(bf16 *p, float v) { *p = __float2bfloat16(v); }
static inline __device__ float ldf(const float *p) { return *p; }
static inline __device__ void stf(float *p, float v) { *p = v; }

/* Launches kernel<S> on the device's compute stream with S the device's storage type; the arguments may name S
 * (`(const S *)x`), which is typedef'd in each branch. */
#define STORAGE_LAUNCH(dev, kernel, grid, block, shmem, ...)                                                    \
    do {                                                                                                        \
        if ((dev)->f32) {                                                                                       \
            typedef float S;                                                                                    \
            kernel<S><<<(grid), (block), (shmem), CUDA_STREAM(dev)>>>(__VA_ARGS__);                            \
        } else {                                                                                                \
            typedef bf16 S;                                                                                     \
            kernel<S><<<(grid), (block), (shmem), CUDA_STREAM(dev)>>>(__VA_ARGS__);                            \
        }                                                                                                       \
    } while (0)

/* Bytes of one storage element. */
#define STORAGE_BYTES(dev) ((dev)->f32 ? sizeof(float) : sizeof(bf16))

/* Blocks for n elements at `threads` per block, capped so the grid stays legal (kernels loop grid-stride). */
static inline unsigned int grid_for(int64_t n, int threads)
{
    int64_t blocks = (n + threads - 1) / threads;
    if (blocks < 1)
        blocks = 1;
    return (unsigned int)(blocks > 65535 * 32 ? 65535 * 32 : blocks);
}

static inline __device__ float warp_sum(float v)
{
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

static inline __device__ float warp_max(float v)
{
    for (int off = 16; off > 0; off >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

static inline __device__ double warp_sum_d(double v)
{
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result. */
static inline __device__ float block_sum(float v)
{
    __shared__ float partial[32];
    __syncthreads(); /* partial may still be read by a previous call */
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0)
        partial[warp] = v;
    __syncthreads();
    v = lane < n_warps ? partial[lane] : 0.0f;
    return warp_sum(v);
}

static inline __device__ float block_max(float v)
{
    __shared__ float partial[32];
    __syncthreads();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0)
        partial[warp] = v;
    __syncthreads();
    v = lane < n_warps ? partial[lane] : -INFINITY;
    return warp_max(v);
}

static inline __device__ double block_sum_d(double v)
{
    __shared__ double partial[32];
    __syncthreads();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = warp_sum_d(v);
    if (lane == 0)
        partial[warp] = v;
    __syncthreads();
    v = lane < n_warps ? partial[lane] : 0.0;
    return warp_sum_d(v);
}

// Exclusive count of flags before this thread, over the block (every thread calls it); *total gets the block's
// count.
static inline __device__ int block_exclusive_count(int flag, int *total)
{
    __shared__ int warp_counts[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    unsigned int ballot = __ballot_sync(0xffffffffu, flag);
    int before = __popc(ballot & ((1u << lane) - 1u));
    __syncthreads();
    if (lane == 0)
        warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int offset = 0, sum = 0;
    for (int w = 0; w < n_warps; w++) {
        if (w < warp)
            offset += warp_counts[w];
        sum += warp_counts[w];
    }
    *total = sum;
    return offset + before;
}

/* Copies rows of `row_bytes` bytes: dst row r (dst_pitch bytes apart) = src row rows[r] (or r when rows is NULL;
 * src_pitch bytes apart). Each thread moves one unit of V (uint4: 16 bytes, down to unsigned short), the widest that
 * the pointers, pitches and row size allow (copy_rows picks it), so a narrow strided slice (one head of a fused
 * projection) moves in full transactions instead of the element-wise copy cudaMemcpy2D does for narrow rows. */
template <typename V>
static __global__ void copy_rows_kernel(char *dst, int64_t dst_pitch, const char *src, int64_t src_pitch,
                                        const int32_t *rows, int64_t n_rows, int64_t units_per_row)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_rows * units_per_row;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / units_per_row, u = i - r * units_per_row;
        int64_t from = rows ? rows[r] : r;
        reinterpret_cast<V *>(dst + r * dst_pitch)[u] = reinterpret_cast<const V *>(src + from * src_pitch)[u];
    }
}

static inline void copy_rows(cudaStream_t stream, void *dst, int64_t dst_pitch, const void *src, int64_t src_pitch,
                            const int32_t *rows, int64_t n_rows, int64_t row_bytes)
{
    uintptr_t bits = (uintptr_t)dst | (uintptr_t)src | (uintptr_t)dst_pitch | (uintptr_t)src_pitch |
                     (uintptr_t)row_bytes;
    int unit = bits % 16 == 0 ? 16 : bits % 8 == 0 ? 8 : bits % 4 == 0 ? 4 : 2;
    int64_t units = row_bytes / unit;
    unsigned int grid = grid_for(n_rows * units, 256);
    char *d = (char *)dst;
    const char *s = (const char *)src;
    if (unit == 16)
        copy_rows_kernel<uint4><<<grid, 256, 0, stream>>>(d, dst_pitch, s, src_pitch, rows, n_rows, units);
    else if (unit == 8)
        copy_rows_kernel<uint2><<<grid, 256, 0, stream>>>(d, dst_pitch, s, src_pitch, rows, n_rows, units);
    else if (unit == 4)
        copy_rows_kernel<unsigned int><<<grid, 256, 0, stream>>>(d, dst_pitch, s, src_pitch, rows, n_rows, units);
    else
        copy_rows_kernel<unsigned short><<<grid, 256, 0, stream>>>(d, dst_pitch, s, src_pitch, rows, n_rows, units);
}

#define GRID_STRIDE(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

#endif /* DSARL_CUDA_COMMON_CUH */
