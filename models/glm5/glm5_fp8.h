/* glm5_fp8.h: FP8 checkpoints (DeepSeek-V3 / GLM-5-FP8 style) dequantized on load. Internal to models/glm5.
 *
 * A quantized linear weight W (R, C) is stored as float8 e4m3fn codes q (R, C) plus `<key>_scale_inv`, float32
 * (ceil(R/b0), ceil(C/b1)) for the block size [b0, b1] of config.json's quantization_config.weight_block_size:
 * W[i, j] = q[i, j] * scale_inv[i / b0, j / b1]. */
#ifndef DSARL_GLM5_FP8_H
#define DSARL_GLM5_FP8_H

#include <stdbool.h>
#include <stdint.h>
#include "dsarl/json.h"
#include "dsarl/tensor.h"

/* The quantization scheme of a config.json (hf_config may be NULL): *quantized false without a
 * quantization_config; true with quant_method "fp8", fmt "e4m3" (or absent) and block[] from weight_block_size
 * (default 128 x 128). Any other scheme is refused naming where and the value. */
int glm5_fp8_scheme(const json_t *hf_config, const char *where, bool *quantized, int64_t block[2], dsarl_error *err);

/* True for the name of a scale tensor ("..._scale_inv"), which the loader reads with its weight. */
bool glm5_fp8_is_scale_key(const char *key);

/* Dequantizes `outer` runs of `span` elements, `stride` apart, from element `first` of the 2-D FP8 tensor q into
 * dst (outer * span floats), with scale (checked here: shape from q's and block, F32 or BF16, finite). */
int glm5_fp8_dequantize(float *dst, const dsarl_tensor *q, const dsarl_tensor *scale, const int64_t block[2],
                        int64_t first, int64_t outer, int64_t span, int64_t stride, const char *file,
                        const char *key, dsarl_error *err);

#endif /* DSARL_GLM5_FP8_H */
