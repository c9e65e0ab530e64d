/* glm5_fp8.c: block-scaled float8 weights to float32, with the scales checked before any is used. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "glm5_fp8.h"

enum { FP8_BLOCK_MAX = 1 << 20 };

int glm5_fp8_scheme(const json_t *hf_config, const char *where, bool *quantized, int64_t block[2], dsarl_error *err)
{
    *quantized = false;
    block[0] = block[1] = 128;
    const json_t *q = hf_config ? json_object_get(hf_config, "quantization_config") : NULL;
    if (!q || json_is_null(q))
        return DSARL_OK;
    if (!json_is_object(q))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: quantization_config must be an object", where);
    const char *method = json_string_value(json_object_get(q, "quant_method"));
    if (!method || strcmp(method, "fp8") != 0)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "%s: quantization_config.quant_method '%s' is not supported; "
                          "the glm5 loader reads \"fp8\" (block-scaled float8 e4m3 weights) or no quantization",
                          where, method ? method : "(missing)");
    const char *fmt = json_string_value(json_object_get(q, "fmt"));
    if (fmt && strcmp(fmt, "e4m3") != 0)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "%s: quantization_config.fmt '%s' is not supported; valid: "
                          "e4m3", where, fmt);
    const json_t *b = json_object_get(q, "weight_block_size");
    if (b && !json_is_null(b)) {
        if (!json_is_array(b) || json_array_size(b) != 2)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: quantization_config.weight_block_size must be a list of two "
                              "integers, e.g. [128, 128]", where);
        for (size_t i = 0; i < 2; i++) {
            const json_t *v = json_array_get(b, i);
            if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > FP8_BLOCK_MAX)
                return DSARL_FAIL(err, DSARL_E_INVALID, "%s: quantization_config.weight_block_size[%zu] must be an "
                                  "integer in [1, %d]", where, i, FP8_BLOCK_MAX);
            block[i] = json_integer_value(v);
        }
    }
    *quantized = true;
    return DSARL_OK;
}

bool glm5_fp8_is_scale_key(const char *key)
{
    size_t n = strlen(key), s = strlen("_scale_inv");
    return n > s && strcmp(key + n - s, "_scale_inv") == 0;
}

int glm5_fp8_dequantize(float *dst, const dsarl_tensor *q, const dsarl_tensor *scale, const int64_t block[2],
                        int64_t first, int64_t outer, int64_t span, int64_t stride, const char *file,
                        const char *key, dsarl_error *err)
{
    if (q->ndim != 2)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "%s: FP8 tensor '%s' has %d dimensions; block scales are read for "
                          "2-D weights only", file, key, (int)q->ndim);
    int64_t R = q->shape[0], C = q->shape[1];
    int64_t SR = (R + block[0] - 1) / block[0], SC = (C + block[1] - 1) / block[1];
    if (scale->ndim != 2 || scale->shape[0] != SR || scale->shape[1] != SC)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: '%s_scale_inv' must have shape [%lld, %lld] for the [%lld, %lld] "
                          "weight in blocks of %lld x %lld (corrupt FP8 scales)", file, key, (long long)SR,
                          (long long)SC, (long long)R, (long long)C, (long long)block[0], (long long)block[1]);
    if (scale->dtype != DSARL_DTYPE_F32 && scale->dtype != DSARL_DTYPE_BF16)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: '%s_scale_inv' has dtype %s; FP8 scales are F32 or BF16", file,
                          key, dsarl_dtype_name(scale->dtype));
    float *s = malloc((size_t)(SR * SC) * sizeof(float));
    if (!s)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory for the scales of '%s'", file, key);
    int rc = dsarl_convert_to_f32(s, scale->data, scale->dtype, (size_t)(SR * SC), err);
    for (int64_t i = 0; rc == 0 && i < SR * SC; i++)
        if (!isfinite(s[i]))
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: '%s_scale_inv' holds %g at block [%lld, %lld] (corrupt FP8 "
                            "scales: every scale must be finite)", file, key, (double)s[i], (long long)(i / SC),
                            (long long)(i % SC));
    const unsigned char *codes = q->data;
    for (int64_t o = 0; rc == 0 && o < outer; o++) {
        int64_t g = first + o * stride;
        for (int64_t k = 0; k < span; k++, g++) {
            int64_t row = g / C, col = g % C;
            if ((codes[g] & 0x7f) == 0x7f) {
                rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: FP8 tensor '%s' holds a NaN code at [%lld, %lld]", file,
                                key, (long long)row, (long long)col);
                break;
            }
            dst[o * span + k] = dsarl_f8_e4m3_to_f32(codes[g]) * s[(row / block[0]) * SC + col / block[1]];
        }
    }
    free(s);
    return rc;
}
