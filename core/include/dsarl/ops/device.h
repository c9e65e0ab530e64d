/* dsarl/ops/device.h: layer-level primitives on one kind of processor (kind DSARL_KIND_DEVICE).
 *
 * Granularity follows llm.c: each entry is a whole layer primitive (with its backward where training needs one),
 * never a per-element call, so a model composes them once and a device plugin implements them once. All pointers
 * are device pointers from alloc(). Activations and parameters use the device's storage dtype (float32 on the
 * CPU, bfloat16 on CUDA); statistics, log-probabilities, losses and optimizer state are always float32; token ids
 * and indices are int32. Backward entries ACCUMULATE into parameter gradients (+=) and OVERWRITE input
 * gradients unless stated. Shapes in comments: T tokens, C channels, V vocabulary, H heads. */
#ifndef DSARL_OPS_DEVICE_H
#define DSARL_OPS_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "dsarl/parallel.h"
#include "dsarl/plugin.h"
#include "dsarl/tensor.h"

DSARL_BEGIN_DECLS

typedef struct dsarl_device dsarl_device; /* one device instance, owned by its plugin */

/* Direction of a copy. */
typedef enum dsarl_copy_kind {
    DSARL_COPY_HOST_TO_DEVICE = 0,
    DSARL_COPY_DEVICE_TO_HOST = 1,
    DSARL_COPY_DEVICE_TO_DEVICE = 2,
} dsarl_copy_kind;

typedef struct dsarl_device_config {
    uint32_t struct_size;
    const dsarl_node *recipe;          /* resolved recipe root (runtime.* keys) */
    const dsarl_parallel *parallel;    /* selects the GPU by local rank */
    int32_t threads;                   /* CPU threads for host-side math; 0 = device default */
    uint64_t seed;                     /* base seed for sampling streams */
} dsarl_device_config;

typedef struct dsarl_device_ops {
    dsarl_ops_common common;

    /* --- lifetime and memory ------------------------------------------------------------------------------ */
    /* Creates a device instance for this process. */
    int (*create)(const dsarl_device_config *config, dsarl_device **out, dsarl_error *err);
    /* Releases everything the instance allocated. */
    void (*destroy)(dsarl_device *dev);
    /* The dtype activations and parameters are stored in on this device. */
    dsarl_dtype (*storage_dtype)(const dsarl_device *dev);
    /* Allocates bytes of device memory (aligned to 256 bytes). */
    int (*alloc)(dsarl_device *dev, size_t bytes, void **out, dsarl_error *err);
    /* Frees memory from alloc(); NULL is a no-op. */
    void (*free)(dsarl_device *dev, void *ptr);
    /* Copies bytes between host and device memory. */
    int (*copy)(dsarl_device *dev, void *dst, const void *src, size_t bytes, dsarl_copy_kind kind,
                dsarl_error *err);
    /* Sets bytes of device memory to zero. */
    int (*zero)(dsarl_device *dev, void *ptr, size_t bytes, dsarl_error *err);
    /* Waits until all queued work is done and reports any asynchronous failure. */
    int (*synchronize)(dsarl_device *dev, dsarl_error *err);
    /* Converts n host float32 values into device storage of dtype (upload of weights, inputs). */
    int (*upload_f32)(dsarl_device *dev, void *dst, dsarl_dtype dtype, const float *src, size_t n, dsarl_error *err);
    /* Converts n device values of dtype into host float32. */
    int (*download_f32)(dsarl_device *dev, float *dst, const void *src, dsarl_dtype dtype, size_t n,
                        dsarl_error *err);

    /* --- dense algebra ------------------------------------------------------------------------------------ */
    /* Row-major C(M,N) = alpha * op(A) op(B) + beta * C, op(A) (M,K), op(B) (K,N); trans_* transposes the stored
     * matrix (A stored (K,M) when trans_a). Storage dtype in and out, float32 accumulation. */
    int (*gemm)(dsarl_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const void *a, const void *b, float beta, void *c, dsarl_error *err);
    /* batch independent gemms with element strides between consecutive A, B and C matrices. */
    int (*gemm_strided_batched)(dsarl_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                float alpha, const void *a, int64_t stride_a, const void *b, int64_t stride_b,
                                float beta, void *c, int64_t stride_c, int64_t batch, dsarl_error *err);

    /* --- layer primitives (norms, RoPE, SwiGLU, MoE routing, log-probs, AdamW, sampling) follow, each with its
     * backward where training needs one. */

    void *reserved[8];
} dsarl_device_ops;

DSARL_END_DECLS

#endif /* DSARL_OPS_DEVICE_H */
