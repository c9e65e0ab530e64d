/* tilelang_common.cuh: checked CUDA calls with this backend's message prefix, plus the cuda device's bf16 helpers
 * and block reductions (shared from backends/device/cuda/cuda_common.cuh). */
#ifndef DSARL_TILELANG_COMMON_CUH
#define DSARL_TILELANG_COMMON_CUH

#include "cuda_common.cuh"
#include "tilelang.h"

#define tlCheck(call, err)                                                                                      \
    do {                                                                                                        \
        cudaError_t tl_check_rc_ = (call);                                                                      \
        if (tl_check_rc_ != cudaSuccess)                                                                        \
            return dsarl_error_set((err), DSARL_E_DEVICE, __FILE__, __LINE__, "dsa tilelang: %s failed: %s",   \
                                   #call, cudaGetErrorString(tl_check_rc_));                                    \
    } while (0)

#define tlCheckLaunch(what, err)                                                                                \
    do {                                                                                                        \
        cudaError_t tl_launch_rc_ = cudaGetLastError();                                                         \
        if (tl_launch_rc_ != cudaSuccess)                                                                       \
            return dsarl_error_set((err), DSARL_E_DEVICE, __FILE__, __LINE__,                                   \
                                   "dsa tilelang: launching %s failed: %s", (what),                             \
                                   cudaGetErrorString(tl_launch_rc_));                                          \
    } while (0)

/* Raises a kernel's dynamic shared-memory limit when it needs more than the default 48 KiB. */
#define tlSharedLimit(kernel, bytes, err)                                                                       \
    do {                                                                                                        \
        if ((bytes) > 48 * 1024)                                                                                \
            tlCheck(cudaFuncSetAttribute((kernel), cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(bytes)),  \
                    err);                                                                                       \
    } while (0)

#define TL_MAX_SHARED (220 * 1024)

/* Launches kernel<S> on the legacy default stream with S the storage type (float when f32 is non-zero, else bf16);
 * the arguments may name S. */
#define TL_LAUNCH(f32, kernel, grid, block, shmem, ...)                                                         \
    do {                                                                                                        \
        if (f32) {                                                                                              \
            typedef float S;                                                                                    \
            kernel<S><<<(grid), (block), (shmem)>>>(__VA_ARGS__);                                               \
        } else {                                                                                                \
            typedef bf16 S;                                                                                     \
            kernel<S><<<(grid), (block), (shmem)>>>(__VA_ARGS__);                                               \
        }                                                                                                       \
    } while (0)

/* Raises the shared-memory limit of both storage instantiations of a kernel template. */
#define tlSharedLimitT(kernel, bytes, err)                                                                      \
    do {                                                                                                        \
        tlSharedLimit(kernel<float>, bytes, err);                                                               \
        tlSharedLimit(kernel<bf16>, bytes, err);                                                                \
    } while (0)

/* dst (n, storage) += acc (n) fp32 (flushes a key-gradient accumulator). Defined in context.cu. */
int tilelang_flush_accumulator(const dsarl_dsa_context *ctx, void *dst, const float *acc, int64_t n,
                               dsarl_error *err);

#endif /* DSARL_TILELANG_COMMON_CUH */
