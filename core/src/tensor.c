/* tensor.c: dtype tables, tensor descriptors and the exact bf16/fp16 <-> f32 conversions.
 *
 * The 16-bit conversions work on bit patterns rather than through the FPU so that they are exact, independent of
 * the compiler's float16 support, and round to nearest even the same way torch and numpy do. */
#include "dsarl/tensor.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct dtype_info {
    dsarl_dtype dtype;
    size_t size;
    const char *name;             /* dsarl name, lowercase */
    const char *safetensors_name; /* the name safetensors headers use */
} dtype_info;

static const dtype_info dtype_table[] = {
    {DSARL_DTYPE_F32, 4, "f32", "F32"},   {DSARL_DTYPE_BF16, 2, "bf16", "BF16"}, {DSARL_DTYPE_F16, 2, "f16", "F16"},
    {DSARL_DTYPE_F64, 8, "f64", "F64"},   {DSARL_DTYPE_I32, 4, "i32", "I32"},    {DSARL_DTYPE_I64, 8, "i64", "I64"},
    {DSARL_DTYPE_U8, 1, "u8", "U8"},      {DSARL_DTYPE_I8, 1, "i8", "I8"},       {DSARL_DTYPE_BOOL, 1, "bool", "BOOL"},
    {DSARL_DTYPE_F8_E4M3, 1, "f8_e4m3", "F8_E4M3"},
};

#define DTYPE_COUNT (sizeof dtype_table / sizeof dtype_table[0])

static const dtype_info *dtype_lookup(dsarl_dtype dtype)
{
    for (size_t i = 0; i < DTYPE_COUNT; i++)
        if (dtype_table[i].dtype == dtype)
            return &dtype_table[i];
    return NULL;
}

size_t dsarl_dtype_size(dsarl_dtype dtype)
{
    const dtype_info *info = dtype_lookup(dtype);
    return info ? info->size : 0;
}

const char *dsarl_dtype_name(dsarl_dtype dtype)
{
    const dtype_info *info = dtype_lookup(dtype);
    return info ? info->name : "invalid";
}

dsarl_dtype dsarl_dtype_from_name(const char *name)
{
    if (!name)
        return DSARL_DTYPE_INVALID;
    for (size_t i = 0; i < DTYPE_COUNT; i++)
        if (strcmp(name, dtype_table[i].name) == 0 || strcmp(name, dtype_table[i].safetensors_name) == 0)
            return dtype_table[i].dtype;
    return DSARL_DTYPE_INVALID;
}

int dsarl_tensor_init(dsarl_tensor *t, void *data, dsarl_dtype dtype, int32_t ndim, const int64_t *shape,
                      dsarl_device_type device, dsarl_error *err)
{
    if (!t)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_tensor_init: tensor pointer is NULL");
    if (!dtype_lookup(dtype))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_tensor_init: dtype %d is not a known dsarl_dtype", (int)dtype);
    if (ndim < 0 || ndim > DSARL_TENSOR_MAX_DIMS)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_tensor_init: ndim %d is out of range, must be 0..%d", (int)ndim,
                          DSARL_TENSOR_MAX_DIMS);
    if (ndim > 0 && !shape)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_tensor_init: shape is NULL but ndim is %d", (int)ndim);
    for (int32_t d = 0; d < ndim; d++)
        if (shape[d] < 0)
            return DSARL_FAIL(err, DSARL_E_INVALID,
                              "dsarl_tensor_init: dimension %d is %lld, dimensions must be non-negative", (int)d,
                              (long long)shape[d]);
    memset(t, 0, sizeof *t);
    t->data = data;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int32_t d = 0; d < DSARL_TENSOR_MAX_DIMS; d++)
        t->shape[d] = d < ndim ? shape[d] : 1;
    t->device = device;
    t->device_index = 0;
    return DSARL_OK;
}

int64_t dsarl_tensor_numel(const dsarl_tensor *t)
{
    int64_t n = 1;
    for (int32_t d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

size_t dsarl_tensor_nbytes(const dsarl_tensor *t)
{
    return (size_t)dsarl_tensor_numel(t) * dsarl_dtype_size(t->dtype);
}

const char *dsarl_tensor_shape_str(const dsarl_tensor *t, char *buf, size_t size)
{
    if (!buf || size == 0)
        return buf;
    size_t used = 0;
    buf[0] = '\0';
    /* snprintf returns the would-be length; clamp so a short buffer truncates instead of overrunning. */
#define SHAPE_APPEND(...)                                                  \
    do {                                                                   \
        if (used < size) {                                                 \
            int wrote_ = snprintf(buf + used, size - used, __VA_ARGS__);   \
            used += wrote_ > 0 ? (size_t)wrote_ : 0;                       \
        }                                                                  \
    } while (0)
    SHAPE_APPEND("[");
    for (int32_t d = 0; d < t->ndim; d++)
        SHAPE_APPEND(d ? ", %lld" : "%lld", (long long)t->shape[d]);
    SHAPE_APPEND("]");
#undef SHAPE_APPEND
    return buf;
}

/* ------------------------------------------------------------------------------------------------------------- */
/* 16-bit floats. */

static uint32_t f32_bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

float dsarl_bf16_to_f32(dsarl_bf16 v)
{
    return f32_from_bits((uint32_t)v << 16);
}

dsarl_bf16 dsarl_f32_to_bf16(float v)
{
    uint32_t u = f32_bits(v);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        /* NaN: truncating could clear every payload bit and turn it into inf, so force the quiet bit. */
        return (dsarl_bf16)((u >> 16) | 0x0040u);
    /* Round to nearest even: add 0x7fff plus the lowest kept bit; a carry into the exponent (including to inf)
     * is exactly the right answer. */
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return (dsarl_bf16)((u + rounding) >> 16);
}

float dsarl_f16_to_f32(dsarl_fp16 v)
{
    uint32_t sign = ((uint32_t)v & 0x8000u) << 16;
    uint32_t exponent = ((uint32_t)v >> 10) & 0x1fu;
    uint32_t mantissa = (uint32_t)v & 0x3ffu;
    if (exponent == 0x1f) /* inf or NaN: payload moves up unchanged, so the quiet bit stays the quiet bit */
        return f32_from_bits(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {
        if (mantissa == 0)
            return f32_from_bits(sign);
        /* Subnormal mantissa * 2^-24: shift until the implicit bit appears, lowering the exponent each time. */
        int32_t e = -14;
        while (!(mantissa & 0x400u)) {
            mantissa <<= 1;
            e--;
        }
        mantissa &= 0x3ffu;
        return f32_from_bits(sign | ((uint32_t)(e + 127) << 23) | (mantissa << 13));
    }
    return f32_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

dsarl_fp16 dsarl_f32_to_f16(float v)
{
    uint32_t u = f32_bits(v);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t magnitude = u & 0x7fffffffu;
    if (magnitude > 0x7f800000u) /* NaN: keep the top payload bits, force quiet so it cannot become inf */
        return (dsarl_fp16)(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    if (magnitude >= 0x477ff000u) /* >= 65520, the midpoint above 65504 (odd mantissa): rounds to inf */
        return (dsarl_fp16)(sign | 0x7c00u);
    if (magnitude < 0x38800000u) { /* below 2^-14: a half subnormal (units of 2^-24) or zero */
        uint32_t exponent = magnitude >> 23;
        /* f32 value = m * 2^(exponent-150); in units of 2^-24 that is m >> (126 - exponent). */
        if (exponent < 102) /* shift >= 25: below a quarter unit, rounds to zero (also f32 zeros/subnormals) */
            return (dsarl_fp16)sign;
        uint32_t m = (magnitude & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - exponent;
        uint32_t result = m >> shift;
        uint32_t remainder = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (remainder > half || (remainder == half && (result & 1u)))
            result++; /* may become 0x400, the smallest normal, which is the right encoding */
        return (dsarl_fp16)(sign | result);
    }
    /* Normal: rebias the exponent (127 -> 15) in place, drop 13 mantissa bits with round to nearest even. */
    uint32_t result = (magnitude - 0x38000000u) >> 13;
    uint32_t remainder = magnitude & 0x1fffu;
    if (remainder > 0x1000u || (remainder == 0x1000u && (result & 1u)))
        result++;
    return (dsarl_fp16)(sign | result);
}

float dsarl_f8_e4m3_to_f32(uint8_t v)
{
    int exponent = (v >> 3) & 15, mantissa = v & 7;
    float magnitude;
    if (exponent == 15 && mantissa == 7)
        magnitude = NAN; // e4m3fn spends its top code on NaN instead of infinities
    else if (exponent == 0)
        magnitude = ldexpf((float)mantissa, -9); // subnormal: mantissa/8 * 2^-6
    else
        magnitude = ldexpf(1.0f + (float)mantissa / 8.0f, exponent - 7);
    return v & 0x80 ? -magnitude : magnitude;
}

/* ------------------------------------------------------------------------------------------------------------- */
/* Bulk conversions. Sources may be unaligned (e.g. inside a file mapping), so elements are read with memcpy. */

int dsarl_convert_to_f32(float *dst, const void *src, dsarl_dtype src_dtype, size_t n, dsarl_error *err)
{
    if (n > 0 && (!dst || !src))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_convert_to_f32: dst or src is NULL for %zu elements", n);
    const unsigned char *bytes = src;
    switch (src_dtype) {
    case DSARL_DTYPE_F32:
        if (n > 0)
            memmove(dst, src, n * sizeof(float));
        return DSARL_OK;
#define CONVERT_EACH(type, expr)                     \
    for (size_t i = 0; i < n; i++) {                 \
        type x;                                      \
        memcpy(&x, bytes + i * sizeof(type), sizeof x); \
        dst[i] = (expr);                             \
    }                                                \
    return DSARL_OK
    case DSARL_DTYPE_BF16: CONVERT_EACH(uint16_t, dsarl_bf16_to_f32(x));
    case DSARL_DTYPE_F16: CONVERT_EACH(uint16_t, dsarl_f16_to_f32(x));
    case DSARL_DTYPE_F64: CONVERT_EACH(double, (float)x);
    case DSARL_DTYPE_I32: CONVERT_EACH(int32_t, (float)x);
    case DSARL_DTYPE_I64: CONVERT_EACH(int64_t, (float)x);
    case DSARL_DTYPE_U8: CONVERT_EACH(uint8_t, (float)x);
    case DSARL_DTYPE_I8: CONVERT_EACH(int8_t, (float)x);
    case DSARL_DTYPE_BOOL: CONVERT_EACH(uint8_t, x ? 1.0f : 0.0f);
    case DSARL_DTYPE_F8_E4M3: CONVERT_EACH(uint8_t, dsarl_f8_e4m3_to_f32(x));
#undef CONVERT_EACH
    default:
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_convert_to_f32: source dtype %d is not a known dsarl_dtype",
                          (int)src_dtype);
    }
}

int dsarl_convert_from_f32(void *dst, dsarl_dtype dst_dtype, const float *src, size_t n, dsarl_error *err)
{
    if (n > 0 && (!dst || !src))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_convert_from_f32: dst or src is NULL for %zu elements", n);
    unsigned char *bytes = dst;
    switch (dst_dtype) {
    case DSARL_DTYPE_F32:
        if (n > 0)
            memmove(dst, src, n * sizeof(float));
        return DSARL_OK;
#define CONVERT_EACH(type, expr)                         \
    for (size_t i = 0; i < n; i++) {                     \
        float x = src[i];                                \
        type y = (expr);                                 \
        memcpy(bytes + i * sizeof(type), &y, sizeof y);  \
    }                                                    \
    return DSARL_OK
    case DSARL_DTYPE_BF16: CONVERT_EACH(uint16_t, dsarl_f32_to_bf16(x));
    case DSARL_DTYPE_F16: CONVERT_EACH(uint16_t, dsarl_f32_to_f16(x));
    case DSARL_DTYPE_F64: CONVERT_EACH(double, (double)x);
#undef CONVERT_EACH
    default:
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED,
                          "dsarl_convert_from_f32: destination dtype '%s' is not supported, use f32, f64, bf16 or f16",
                          dsarl_dtype_name(dst_dtype));
    }
}
