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
/* Raises kernel's dynamic shared-memory limit to bytes. Always set, not only past 48 KB: the kernel's static shared
 * memory counts against the same default 48 KB, so a dynamic size just under it can still fail the launch. */
#define tlSharedLimit(kernel, bytes, err)                                                                       \
    do {                                                                                                        \
        if ((bytes) > 0)                                                                                        \
            tlCheck(cudaFuncSetAttribute((kernel), cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(bytes)),  \
                    err);                                                                                       \
    } while (0)

#define TL_MAX_SHARED (220 * 1024)

/* The context's stream as a cudaStream_t (the device's, or the legacy default stream). */
#define TL_STREAM(ctx) ((cudaStream_t)(ctx)->stream)

/* Launches kernel<S> on stream with S the storage type (float when f32 is non-zero, else bf16); the arguments may
 * name S. */
#define TL_LAUNCH(f32, stream, kernel, grid, block, shmem, ...)                                                 \
    do {                                                                                                        \
        if (f32) {                                                                                              \
            typedef float S;                                                                                    \
            kernel<S><<<(grid), (block), (shmem), (cudaStream_t)(stream)>>>(__VA_ARGS__);                       \
        } else {                                                                                                \
            typedef bf16 S;                                                                                     \
            kernel<S><<<(grid), (block), (shmem), (cudaStream_t)(stream)>>>(__VA_ARGS__);                       \
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

/* The tensor-core sparse MLA forward (sparse_mla_forward_wmma.cu); sets *used to 0 without launching when the
 * operands do not fit it (float32 storage, dims not multiples of 16, unaligned rows), so the caller falls back. */
int tilelang_sparse_mla_forward_wmma(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                     const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk,
                                     void *out, float *lse, int *used, dsarl_error *err);

/* The tensor-core sparse MLA backward (sparse_mla_backward_wmma.cu): dq written, dkv added into the fp32
 * accumulator dkv_acc (Tk, d_qk); *used = 0 without launching when the operands do not fit it. */
int tilelang_sparse_mla_backward_wmma(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                      const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk,
                                      const void *out, const float *lse, const void *dout, void *dq, float *dkv_acc,
                                      int *used, dsarl_error *err);

/* *group = queries per block of the sm_90 backward's query groups for this shape (64 / n_heads at 8, 16 or 32
 * heads, GLM-5 dims, bf16, compute 9.0, runtime.tilelang_mla_query_groups on), or 0: one block per query. */
extern "C" int tilelang_sparse_mla_query_group(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                               const dsarl_dsa_attention_inputs *in, int32_t topk, int *group,
                                               dsarl_error *err);

/* Power of two the query-union kernel sorts for group x topk slots (its shared memory: 4 bytes each). */
extern "C" size_t tilelang_query_union_sorted(int group, int32_t topk);

/* The query groups' key lists of n_queries queries, carved from workspace bytes: keys (int32) and masks (uint8) of
 * capacity group x topk per group, and each group's length; tilelang_union_lists_bytes is their size. */
typedef struct tilelang_union_lists {
    int32_t *keys, *len;
    uint8_t *mask;
} tilelang_union_lists;
static inline size_t tilelang_union_lists_bytes(int group, int32_t topk, int64_t n_queries)
{
    const size_t groups = (size_t)((n_queries + group - 1) / group), cap = (size_t)group * (size_t)topk;
    return groups * cap * sizeof(int32_t) + ((groups * 4 + 15) & ~(size_t)15) + groups * cap;
}
static inline tilelang_union_lists tilelang_union_lists_at(char *base, int group, int32_t topk, int64_t n_queries)
{
    const size_t groups = (size_t)((n_queries + group - 1) / group), cap = (size_t)group * (size_t)topk;
    const size_t keys_bytes = groups * cap * sizeof(int32_t), len_bytes = (groups * 4 + 15) & ~(size_t)15;
    tilelang_union_lists l = {(int32_t *)base, (int32_t *)(base + keys_bytes), (uint8_t *)(base + keys_bytes + len_bytes)};
    return l;
}

/* Per group of `group` consecutive queries: its key list (union_keys, union_mask, capacity group x topk each, at
 * group x capacity) and length (union_len), from the top-k rows (sparse_mla_query_union.cu). */
extern "C" int tilelang_query_union(dsarl_dsa_context *ctx, const int32_t *indices, int32_t topk, int group,
                                    int64_t n_queries, int64_t n_keys, int32_t *union_keys, uint8_t *union_mask,
                                    int32_t *union_len, dsarl_error *err);

/* The sm_90 forward over query groups (group x n_heads = 64) reading the lists of tilelang_query_union; out and
 * lse written; *used = 0 when it does not take the shape. */
extern "C" int tilelang_sparse_mla_forward_sm90_grouped(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                                        const dsarl_dsa_attention_inputs *in, int32_t topk,
                                                        int group, const int32_t *union_keys,
                                                        const uint8_t *union_mask, const int32_t *union_len,
                                                        void *out, float *lse, int *used, dsarl_error *err);

/* The sm_90 backward over query groups: one block per `group` queries (group x n_heads = 64) reading the lists of
 * tilelang_query_union; dq written, the key gradient added into dkv_acc; *used = 0 when it does not take the shape. */
extern "C" int tilelang_sparse_mla_backward_sm90_grouped(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                                         const dsarl_dsa_attention_inputs *in, int32_t topk,
                                                         int group, const int32_t *union_keys,
                                                         const uint8_t *union_mask, const int32_t *union_len,
                                                         const void *out, const float *lse, const void *dout,
                                                         void *dq, float *dkv_acc, int *used, dsarl_error *err);

#endif /* DSARL_TILELANG_COMMON_CUH */
