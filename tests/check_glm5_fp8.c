/* check_glm5_fp8.c: FP8 checkpoints and MTP layers through the glm5 loader and save, on the fixture made by
 * tools/make_glm5_fp8_fixture.py (block-scaled float8 e4m3fn weights, 16 x 16 blocks with partial ones, one MTP
 * layer). The loaded weights equal the fixture's reference.safetensors, which ml_dtypes dequantized: exactly, since
 * both are one float32 product of the same code and scale; the save writes them unquantized and the MTP tensors
 * back unchanged (dtype, shape, bytes); corrupt scales and schemes the loader does not read are refused in one
 * line naming the file and tensor. */
#define _XOPEN_SOURCE 700 // mkdtemp
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_device.h"
#include "dsa_reference.h"
#include "dsarl/fileutil.h"
#include "dsarl/json.h"
#include "dsarl/safetensors.h"
#include "glm5_ops.h"

#define FP8_DIR DSARL_SOURCE_DIR "/tests/fixtures/glm5/glm5.2-tiny-fp8"

static dsarl_device *dev;
static dsarl_dsa_context *dsa;
static dsarl_error err;
static char tmp[64];

static void setup(void)
{
    dsarl_device_config cfg = {.struct_size = sizeof(cfg), .threads = 1};
    ck_assert_int_eq(cpu_create(&cfg, &dev, &err), 0);
    ck_assert_int_eq(dsarl_dsa_reference_ops.create(&dsarl_cpu_device_ops, dev, NULL, &dsa, &err), 0);
    snprintf(tmp, sizeof tmp, "/tmp/check_glm5_fp8_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmp));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    ck_assert_int_eq(system(cmd), 0);
    dsarl_dsa_reference_ops.destroy(dsa);
    cpu_destroy(dev);
}

static int load(const char *dir, dsarl_model **m)
{
    dsarl_model_config mc = {.struct_size = sizeof(mc), .model_dir = dir, .device_ops = &dsarl_cpu_device_ops,
                             .device = dev, .dsa_ops = &dsarl_dsa_reference_ops, .dsa = dsa};
    *m = NULL;
    return glm5_create_family(GLM5_FAMILY_52, &mc, m, &err);
}

static float *tensor_f32(const dsarl_tensor *t)
{
    size_t n = (size_t)dsarl_tensor_numel(t);
    float *out = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(out);
    ck_assert_int_eq(dsarl_convert_to_f32(out, t->data, t->dtype, n, &err), 0);
    return out;
}

// Next-token logits of a fixed batch of two packed sequences.
static float *logits_of(dsarl_model *m)
{
    int32_t tokens[12], cu[3] = {0, 5, 12};
    for (int i = 0; i < 12; i++)
        tokens[i] = (i * 37 + 11) % 128;
    dsarl_token_batch batch = {.struct_size = sizeof(batch), .n_tokens = 12, .n_sequences = 2, .tokens = tokens,
                               .cu_seqlens = cu};
    float *out = malloc(12 * 128 * sizeof(float));
    ck_assert_msg(glm5_forward_logits(m, &batch, out, &err) == 0, "%s", err.message);
    return out;
}

START_TEST(test_fp8_load_save_equals_reference)
{
    dsarl_model *m = NULL;
    ck_assert_msg(load(FP8_DIR, &m) == 0, "%s", err.message);
    char saved[128];
    snprintf(saved, sizeof saved, "%s/saved", tmp);
    ck_assert_msg(glm5_save_hf(m, saved, &err) == 0, "%s", err.message);
    // every parameter the model builds, as saved (float32), equals the independent dequantization
    dsarl_safetensors_file *ref = NULL, *out = NULL, *src = NULL;
    char path[160];
    ck_assert_int_eq(dsarl_safetensors_open(FP8_DIR "/reference.safetensors", &ref, &err), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", saved);
    ck_assert_msg(dsarl_safetensors_open(path, &out, &err) == 0, "%s", err.message);
    ck_assert_int_eq(dsarl_safetensors_open(FP8_DIR "/model.safetensors", &src, &err), 0);
    size_t n_ref = dsarl_safetensors_count(ref), quantized = 0;
    for (size_t i = 0; i < n_ref; i++) {
        const char *name = dsarl_safetensors_name(ref, i);
        dsarl_tensor want, got, orig;
        ck_assert_int_eq(dsarl_safetensors_get(ref, name, &want, &err), 0);
        ck_assert_msg(dsarl_safetensors_get(out, name, &got, &err) == 0, "saved file lacks %s", name);
        ck_assert_int_eq(got.dtype, DSARL_DTYPE_F32);
        ck_assert_int_eq(dsarl_tensor_numel(&got), dsarl_tensor_numel(&want));
        ck_assert_int_eq(dsarl_safetensors_get(src, name, &orig, &err), 0);
        quantized += orig.dtype == DSARL_DTYPE_F8_E4M3;
        float *w = tensor_f32(&want), *g = tensor_f32(&got);
        for (int64_t k = 0; k < dsarl_tensor_numel(&want); k++)
            ck_assert_msg(w[k] == g[k], "%s[%lld]: loaded %.9g, dequantized %.9g", name, (long long)k, (double)g[k],
                          (double)w[k]);
        free(w), free(g);
    }
    ck_assert_uint_gt(quantized, 80); // the fixture quantizes every linear projection
    // the MTP layer went through unchanged, its FP8 weight and scale included; scales of built weights did not
    size_t mtp = 0;
    for (size_t i = 0; i < dsarl_safetensors_count(src); i++) {
        const char *name = dsarl_safetensors_name(src, i);
        dsarl_tensor a, b;
        ck_assert_int_eq(dsarl_safetensors_get(src, name, &a, &err), 0);
        if (strncmp(name, "model.layers.4.", 15) != 0) {
            if (strstr(name, "_scale_inv"))
                ck_assert_msg(!dsarl_safetensors_has(out, name), "saved file keeps scale %s", name);
            continue;
        }
        mtp++;
        ck_assert_msg(dsarl_safetensors_get(out, name, &b, &err) == 0, "saved file lacks MTP tensor %s", name);
        ck_assert_int_eq(a.dtype, b.dtype);
        ck_assert_int_eq(a.ndim, b.ndim);
        ck_assert_uint_eq(dsarl_tensor_nbytes(&a), dsarl_tensor_nbytes(&b));
        ck_assert_msg(memcmp(a.data, b.data, dsarl_tensor_nbytes(&a)) == 0, "MTP tensor %s changed", name);
    }
    ck_assert_uint_eq(mtp, 5);
    // the config no longer claims FP8; the saved directory loads and computes the same logits, and carries MTP again
    json_t *cfg = NULL;
    snprintf(path, sizeof path, "%s/config.json", saved);
    ck_assert_int_eq(dsarl_json_load_file(path, &cfg, &err), 0);
    ck_assert_ptr_null(json_object_get(cfg, "quantization_config"));
    ck_assert_int_eq(json_integer_value(json_object_get(cfg, "num_nextn_predict_layers")), 1);
    json_decref(cfg);
    dsarl_model *again = NULL;
    ck_assert_msg(load(saved, &again) == 0, "%s", err.message);
    float *a = logits_of(m), *b = logits_of(again);
    for (int i = 0; i < 12 * 128; i++)
        ck_assert_msg(a[i] == b[i], "logit %d: %g vs %g", i, (double)a[i], (double)b[i]);
    char twice[128];
    snprintf(twice, sizeof twice, "%s/twice", tmp);
    ck_assert_int_eq(glm5_save_hf(again, twice, &err), 0);
    dsarl_safetensors_file *out2 = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", twice);
    ck_assert_int_eq(dsarl_safetensors_open(path, &out2, &err), 0);
    ck_assert(dsarl_safetensors_has(out2, "model.layers.4.self_attn.q_a_proj.weight_scale_inv"));
    free(a), free(b);
    dsarl_safetensors_close(out2);
    dsarl_safetensors_close(ref), dsarl_safetensors_close(out), dsarl_safetensors_close(src);
    glm5_model_free(again);
    glm5_model_free(m);
}
END_TEST

/* The saved weights split into several files (an index): the MTP tensors go in the last file and the index names
 * them, so the directory keeps them through a sharded save too. */
START_TEST(test_fp8_sharded_save_keeps_mtp)
{
    dsarl_model *m = NULL;
    ck_assert_msg(load(FP8_DIR, &m) == 0, "%s", err.message);
    char saved[128], path[160];
    snprintf(saved, sizeof saved, "%s/sharded", tmp);
    ck_assert_msg(glm5_save_hf_files(m, saved, 40000, &err) == 0, "%s", err.message);
    json_t *index = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", saved);
    ck_assert_int_eq(dsarl_json_load_file(path, &index, &err), 0);
    const char *file = json_string_value(json_object_get(json_object_get(index, "weight_map"),
                                                         "model.layers.4.eh_proj.weight"));
    ck_assert_ptr_nonnull(file);
    dsarl_model *again = NULL;
    ck_assert_msg(load(saved, &again) == 0, "%s", err.message);
    ck_assert_uint_eq(again->extra.n, 5);
    json_decref(index);
    glm5_model_free(again);
    glm5_model_free(m);
}
END_TEST

// A copy of the fixture with one change: tensor `name` replaced (data NULL: removed), config edited by `config`.
static void write_variant(const char *dir, const char *name, const dsarl_tensor *replace, const char *config_key,
                          json_t *config_value)
{
    ck_assert_int_eq(dsarl_mkdir_p(dir, &err), 0);
    dsarl_safetensors_file *src = NULL;
    ck_assert_int_eq(dsarl_safetensors_open(FP8_DIR "/model.safetensors", &src, &err), 0);
    size_t n = dsarl_safetensors_count(src), k = 0;
    dsarl_safetensors_entry *e = calloc(n, sizeof *e);
    for (size_t i = 0; i < n; i++) {
        const char *key = dsarl_safetensors_name(src, i);
        if (name && strcmp(key, name) == 0) {
            if (!replace)
                continue;
            e[k].name = key, e[k++].tensor = *replace;
            continue;
        }
        e[k].name = key;
        ck_assert_int_eq(dsarl_safetensors_get(src, key, &e[k++].tensor, &err), 0);
    }
    char path[200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    dsarl_safetensors_kv meta[] = {{"format", "pt"}};
    ck_assert_msg(dsarl_safetensors_write(path, e, k, meta, 1, &err) == 0, "%s", err.message);
    free(e);
    dsarl_safetensors_close(src);
    json_t *cfg = NULL;
    ck_assert_int_eq(dsarl_json_load_file(FP8_DIR "/config.json", &cfg, &err), 0);
    if (config_key && config_value)
        json_object_set_new(cfg, config_key, config_value);
    else if (config_key)
        json_object_del(cfg, config_key);
    snprintf(path, sizeof path, "%s/config.json", dir);
    ck_assert_int_eq(dsarl_json_write_file_atomic(path, cfg, JSON_INDENT(2), &err), 0);
    json_decref(cfg);
}

static void expect_refusal(const char *dir, int code, const char *want)
{
    dsarl_model *m = NULL;
    int rc = load(dir, &m);
    ck_assert_msg(rc == code, "%s: rc %d (%s), want %d", dir, rc, err.message, code);
    ck_assert_msg(strstr(err.message, want), "%s: '%s' lacks '%s'", dir, err.message, want);
    ck_assert_ptr_null(strchr(err.message, '\n'));
    ck_assert_ptr_null(m);
}

START_TEST(test_fp8_refusals)
{
    const char *weight = "model.layers.1.self_attn.o_proj.weight"; // (32, 16): scales (2, 1)
    char scale_key[96], dir[128];
    snprintf(scale_key, sizeof scale_key, "%s_scale_inv", weight);
    float scales[4] = {0.01f, 0.02f, 0.03f, 0.04f};
    dsarl_tensor bad_shape;
    ck_assert_int_eq(dsarl_tensor_init(&bad_shape, scales, DSARL_DTYPE_F32, 1, (int64_t[]){4}, DSARL_DEVICE_CPU,
                                       &err), 0);
    snprintf(dir, sizeof dir, "%s/shape", tmp);
    write_variant(dir, scale_key, &bad_shape, NULL, NULL);
    expect_refusal(dir, DSARL_E_INVALID, "'model.layers.1.self_attn.o_proj.weight_scale_inv' must have shape [2, 1]");
    float nan_scales[2] = {0.01f, NAN};
    dsarl_tensor nan_scale;
    ck_assert_int_eq(dsarl_tensor_init(&nan_scale, nan_scales, DSARL_DTYPE_F32, 2, (int64_t[]){2, 1},
                                       DSARL_DEVICE_CPU, &err), 0);
    snprintf(dir, sizeof dir, "%s/nan", tmp);
    write_variant(dir, scale_key, &nan_scale, NULL, NULL);
    expect_refusal(dir, DSARL_E_INVALID, "at block [1, 0] (corrupt FP8 scales");
    snprintf(dir, sizeof dir, "%s/missing", tmp);
    write_variant(dir, scale_key, NULL, NULL, NULL);
    expect_refusal(dir, DSARL_E_NOT_FOUND, "FP8 tensor 'model.layers.1.self_attn.o_proj.weight' has no");
    unsigned char codes[32 * 16];
    for (size_t i = 0; i < sizeof codes; i++)
        codes[i] = (unsigned char)(0x30 + i % 8);
    codes[5 * 16 + 3] = 0xff; // a NaN code
    dsarl_tensor nan_code;
    ck_assert_int_eq(dsarl_tensor_init(&nan_code, codes, DSARL_DTYPE_F8_E4M3, 2, (int64_t[]){32, 16},
                                       DSARL_DEVICE_CPU, &err), 0);
    snprintf(dir, sizeof dir, "%s/nan-code", tmp);
    write_variant(dir, weight, &nan_code, NULL, NULL);
    expect_refusal(dir, DSARL_E_INVALID, "holds a NaN code at [5, 3]");
    snprintf(dir, sizeof dir, "%s/no-scheme", tmp);
    write_variant(dir, NULL, NULL, "quantization_config", NULL);
    expect_refusal(dir, DSARL_E_INVALID, "is F8_E4M3 but config.json has no fp8 quantization_config");
    snprintf(dir, sizeof dir, "%s/awq", tmp);
    write_variant(dir, NULL, NULL, "quantization_config", json_pack("{s:s}", "quant_method", "awq"));
    expect_refusal(dir, DSARL_E_UNSUPPORTED, "quantization_config.quant_method 'awq' is not supported");
    snprintf(dir, sizeof dir, "%s/block", tmp);
    write_variant(dir, NULL, NULL, "quantization_config",
                  json_pack("{s:s, s:[i]}", "quant_method", "fp8", "weight_block_size", 128));
    expect_refusal(dir, DSARL_E_INVALID, "weight_block_size must be a list of two integers");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("glm5_fp8");
    TCase *tc = tcase_create("fp8");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_fp8_load_save_equals_reference);
    tcase_add_test(tc, test_fp8_sharded_save_keeps_mtp);
    tcase_add_test(tc, test_fp8_refusals);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
