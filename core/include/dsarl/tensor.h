/* dsarl/tensor.h: a small dense tensor descriptor shared by the core and every plugin.
 * SDK tier: trainer services (docs/sdk.md), except dsarl_dtype and its size/name helpers, which the plugin ABI
 * uses (ops/device.h) and which follow the ABI's rules.
 *
 * A dsarl_tensor does not own its memory: arenas, mmapped files and device plugins do. Tensors are contiguous
 * and row-major; shape[0] is the slowest dimension. */
#ifndef DSARL_TENSOR_H
#define DSARL_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include "dsarl/error.h"

DSARL_BEGIN_DECLS

/* Element types. Numbering is part of the ABI: append only. */
typedef enum dsarl_dtype {
    DSARL_DTYPE_INVALID = 0,
    DSARL_DTYPE_F32 = 1,
    DSARL_DTYPE_BF16 = 2,
    DSARL_DTYPE_F16 = 3,
    DSARL_DTYPE_F64 = 4,
    DSARL_DTYPE_I32 = 5,
    DSARL_DTYPE_I64 = 6,
    DSARL_DTYPE_U8 = 7,
    DSARL_DTYPE_I8 = 8,
    DSARL_DTYPE_BOOL = 9,
    DSARL_DTYPE_F8_E4M3 = 10, /* ABI 1.4: float8 e4m3fn (no infinities; S.1111.111 is NaN), as FP8 checkpoints
                               * store weights; read-only: converts to float32, not from it */
} dsarl_dtype;

/* Where a tensor's bytes live. */
typedef enum dsarl_device_type {
    DSARL_DEVICE_CPU = 0,
    DSARL_DEVICE_CUDA = 1,
} dsarl_device_type;

#define DSARL_TENSOR_MAX_DIMS 8

/* bf16 and fp16 are stored as their raw 16 bits on the host. */
typedef uint16_t dsarl_bf16;
typedef uint16_t dsarl_fp16;

typedef struct dsarl_tensor {
    void *data;                             /* first element; NULL for a shape-only descriptor */
    dsarl_dtype dtype;
    int32_t ndim;                           /* 0 (scalar) .. DSARL_TENSOR_MAX_DIMS */
    int64_t shape[DSARL_TENSOR_MAX_DIMS];   /* unused dims are 1 */
    dsarl_device_type device;
    int32_t device_index;                   /* CUDA ordinal; 0 on the CPU */
} dsarl_tensor;

/* Bytes per element of dtype, 0 for DSARL_DTYPE_INVALID or an unknown value. */
DSARL_API size_t dsarl_dtype_size(dsarl_dtype dtype);

/* Canonical lowercase name ("f32", "bf16", ...), or "invalid". */
DSARL_API const char *dsarl_dtype_name(dsarl_dtype dtype);

/* Parses a dtype name: dsarl names and safetensors names ("F32", "BF16", "I64", ...); DSARL_DTYPE_INVALID if none. */
DSARL_API dsarl_dtype dsarl_dtype_from_name(const char *name);

/* Fills t as a contiguous descriptor; fails on ndim out of range or a negative dimension. */
DSARL_API int dsarl_tensor_init(dsarl_tensor *t, void *data, dsarl_dtype dtype, int32_t ndim, const int64_t *shape,
                                dsarl_device_type device, dsarl_error *err);

/* Number of elements (1 for a scalar). */
DSARL_API int64_t dsarl_tensor_numel(const dsarl_tensor *t);

/* Number of bytes (numel * dtype size). */
DSARL_API size_t dsarl_tensor_nbytes(const dsarl_tensor *t);

/* Writes "[2, 3, 4]" into buf (always NUL-terminated) and returns buf. */
DSARL_API const char *dsarl_tensor_shape_str(const dsarl_tensor *t, char *buf, size_t size);

/* Exact conversions between bf16/fp16 bits and float (round to nearest even on the way down). */
DSARL_API float dsarl_bf16_to_f32(dsarl_bf16 v);
DSARL_API dsarl_bf16 dsarl_f32_to_bf16(float v);
DSARL_API float dsarl_f16_to_f32(dsarl_fp16 v);
DSARL_API dsarl_fp16 dsarl_f32_to_f16(float v);
/* ABI 1.4: one float8 e4m3fn value (the byte of an FP8 checkpoint) to float32, exactly. */
DSARL_API float dsarl_f8_e4m3_to_f32(uint8_t v);

/* Converts n host elements of src_dtype to float32 (any float or integer dtype); fails on an unknown dtype. */
DSARL_API int dsarl_convert_to_f32(float *dst, const void *src, dsarl_dtype src_dtype, size_t n, dsarl_error *err);

/* Converts n float32 values to dst_dtype (f32, f64, bf16, f16). */
DSARL_API int dsarl_convert_from_f32(void *dst, dsarl_dtype dst_dtype, const float *src, size_t n, dsarl_error *err);

DSARL_END_DECLS

#endif /* DSARL_TENSOR_H */
