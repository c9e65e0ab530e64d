/* check_glm5_hf.c: the glm_moe_dsa model against transformers' GlmMoeDsaForCausalLM (eager, fp32) on the tiny
 * fixtures made by tools/glm5_fixtures.py: logits within max relative error 1e-4 (max |ours - HF| / max |HF|),
 * identical greedy tokens and the same parameter gradients as autograd, for glm5.1-style (f32), glm5.2 IndexShare
 * (f16), grouped routing + YaRN + bf16 + fused expert keys. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_device.h"
#include "dsa_reference.h"
#include "dsarl/json.h"
#include "dsarl/npy.h"
#include "glm5_ops.h"

#define FIXTURES DSARL_SOURCE_DIR "/tests/fixtures/glm5/"

static dsarl_device *dev;
static dsarl_dsa_context *dsa;
static dsarl_error err;

static void setup(void)
{
    dsarl_device_config cfg = {.struct_size = sizeof(cfg), .threads = 1};
    ck_assert_int_eq(cpu_create(&cfg, &dev, &err), 0);
    ck_assert_int_eq(dsarl_dsa_reference_ops.create(&dsarl_cpu_device_ops, dev, NULL, &dsa, &err), 0);
}

static void teardown(void)
{
    dsarl_dsa_reference_ops.destroy(dsa);
    cpu_destroy(dev);
}

static dsarl_model *load(glm5_family family, const char *dir)
{
    dsarl_model_config mc = {.struct_size = sizeof(mc), .model_dir = dir, .device_ops = &dsarl_cpu_device_ops,
                             .device = dev, .dsa_ops = &dsarl_dsa_reference_ops, .dsa = dsa};
    dsarl_model *m = NULL;
    int rc = glm5_create_family(family, &mc, &m, &err);
    ck_assert_msg(rc == 0, "load %s: %s", dir, err.message);
    return m;
}

// A float32 .npy through dsarl_npy_read; returns the data and the element count.
static float *read_npy_f32(const char *path, int64_t *n)
{
    dsarl_tensor t;
    ck_assert_msg(dsarl_npy_read(path, &t, &err) == 0, "%s", err.message);
    ck_assert_int_eq(t.dtype, DSARL_DTYPE_F32);
    *n = dsarl_tensor_numel(&t);
    return t.data;
}

static void check_logits(const char *name)
{
    char dir[512], path[600];
    snprintf(dir, sizeof dir, FIXTURES "%s", name);
    dsarl_model *m = load(strstr(name, "5.1") ? GLM5_FAMILY_51 : GLM5_FAMILY_52, dir);
    snprintf(path, sizeof path, "%s/input_ids.json", dir);
    json_t *ids = NULL;
    ck_assert_int_eq(dsarl_json_load_file(path, &ids, &err), 0);
    int32_t B = (int32_t)json_array_size(ids), S = (int32_t)json_array_size(json_array_get(ids, 0));
    int32_t *tokens = malloc((size_t)(B * S) * sizeof(int32_t)), *cu = malloc((size_t)(B + 1) * sizeof(int32_t));
    for (int32_t b = 0; b <= B; b++)
        cu[b] = b * S; // rows packed back to back (THD); each row must still see only itself
    for (int32_t b = 0; b < B; b++)
        for (int32_t s = 0; s < S; s++)
            tokens[b * S + s] = (int32_t)json_integer_value(json_array_get(json_array_get(ids, b), s));
    json_decref(ids);
    int64_t V = m->cfg.vocab_size, n_ref = 0;
    snprintf(path, sizeof path, "%s/logits.npy", dir);
    float *ref = read_npy_f32(path, &n_ref);
    ck_assert_int_eq(n_ref, (int64_t)B * S * V);
    float *got = malloc((size_t)n_ref * sizeof(float));
    dsarl_token_batch batch = {.struct_size = sizeof(batch), .n_tokens = B * S, .n_sequences = B, .tokens = tokens,
                               .cu_seqlens = cu};
    ck_assert_msg(glm5_forward_logits(m, &batch, got, &err) == 0, "%s", err.message);
    double maxref = 0, maxerr = 0;
    for (int64_t i = 0; i < n_ref; i++) {
        maxref = fmax(maxref, fabs(ref[i]));
        maxerr = fmax(maxerr, fabs((double)got[i] - ref[i]));
    }
    fprintf(stderr, "%s: max relative error %.3g over %lld logits\n", name, maxerr / maxref, (long long)n_ref);
    ck_assert_msg(maxref > 0.1, "%s: reference logits are degenerate", name);
    ck_assert_msg(maxerr / maxref < 1e-4, "%s: max relative error %.3g (max abs %.3g, max |ref| %.3g)", name,
                  maxerr / maxref, maxerr, maxref);
    free(tokens), free(cu), free(ref), free(got);
    glm5_model_free(m);
}

static void check_greedy(const char *name)
{
    char dir[512], path[600];
    snprintf(dir, sizeof dir, FIXTURES "%s", name);
    dsarl_model *m = load(strstr(name, "5.1") ? GLM5_FAMILY_51 : GLM5_FAMILY_52, dir);
    snprintf(path, sizeof path, "%s/generate.json", dir);
    json_t *g = NULL;
    ck_assert_int_eq(dsarl_json_load_file(path, &g, &err), 0);
    json_t *prompt = json_object_get(g, "prompt"), *want = json_object_get(g, "tokens");
    int32_t P = (int32_t)json_array_size(prompt), N = (int32_t)json_array_size(want);
    int32_t *seq = malloc((size_t)(P + N) * sizeof(int32_t));
    for (int32_t i = 0; i < P; i++)
        seq[i] = (int32_t)json_integer_value(json_array_get(prompt, (size_t)i));
    int64_t V = m->cfg.vocab_size;
    float *logits = malloc((size_t)((P + N) * V) * sizeof(float));
    for (int32_t step = 0; step < N; step++) { // no-cache recompute of the whole sequence each step
        int32_t T = P + step, cu[2] = {0, T};
        dsarl_token_batch batch = {.struct_size = sizeof(batch), .n_tokens = T, .n_sequences = 1, .tokens = seq,
                                   .cu_seqlens = cu};
        ck_assert_msg(glm5_forward_logits(m, &batch, logits, &err) == 0, "%s", err.message);
        const float *last = logits + (int64_t)(T - 1) * V;
        int32_t best = 0;
        for (int32_t v = 1; v < V; v++)
            best = last[v] > last[best] ? v : best;
        seq[T] = best;
        ck_assert_msg(best == json_integer_value(json_array_get(want, (size_t)step)),
                      "%s: greedy step %d gave %d, transformers %lld", name, step, best,
                      (long long)json_integer_value(json_array_get(want, (size_t)step)));
    }
    json_decref(g);
    free(seq), free(logits);
    glm5_model_free(m);
}

// Gradients of L = sum_t w_t log p(target_t) against transformers' autograd (grads.json): every parameter's L2
// norm and 8 sampled entries; the indexer gets none from the LM loss, as under transformers' no_grad.
static void check_grads(const char *name)
{
    char dir[512], path[600];
    snprintf(dir, sizeof dir, FIXTURES "%s", name);
    dsarl_model *m = load(strstr(name, "5.1") ? GLM5_FAMILY_51 : GLM5_FAMILY_52, dir);
    m->indexer_loss_coeff = 0.0f; // LM loss only, as in the reference
    snprintf(path, sizeof path, "%s/input_ids.json", dir);
    json_t *ids = NULL, *g = NULL;
    ck_assert_int_eq(dsarl_json_load_file(path, &ids, &err), 0);
    snprintf(path, sizeof path, "%s/grads.json", dir);
    ck_assert_int_eq(dsarl_json_load_file(path, &g, &err), 0);
    int32_t B = (int32_t)json_array_size(ids), S = (int32_t)json_array_size(json_array_get(ids, 0)), T = B * S;
    int32_t *tokens = malloc((size_t)T * sizeof(int32_t)), *targets = malloc((size_t)T * sizeof(int32_t));
    int32_t *cu = malloc((size_t)(B + 1) * sizeof(int32_t));
    float *w = malloc((size_t)T * sizeof(float));
    for (int32_t b = 0; b <= B; b++)
        cu[b] = b * S;
    for (int32_t t = 0; t < T; t++) {
        tokens[t] = (int32_t)json_integer_value(json_array_get(json_array_get(ids, (size_t)(t / S)), (size_t)(t % S)));
        targets[t] = (int32_t)json_integer_value(json_array_get(json_object_get(g, "targets"), (size_t)t));
        w[t] = (float)json_real_value(json_array_get(json_object_get(g, "weights"), (size_t)t));
    }
    dsarl_token_batch batch = {.struct_size = sizeof(batch), .n_tokens = T, .n_sequences = B, .tokens = tokens,
                               .cu_seqlens = cu};
    ck_assert_int_eq(glm5_zero_grad(m, &err), 0);
    ck_assert_msg(glm5_backward(m, &batch, targets, w, NULL, &err) == 0, "%s", err.message);
    json_t *tensors = json_object_get(g, "tensors");
    double worst = 0;
    const char *worst_name = "";
    int n_checked = 0;
    for (int64_t i = 0; i < m->n_params; i++) {
        const glm5_param *p = &m->params[i];
        json_t *ref = json_object_get(tensors, p->name);
        if (!p->trainable) {
            ck_assert_ptr_null(ref); // e_score_correction_bias is a buffer in transformers too
            continue;
        }
        ck_assert_msg(ref != NULL, "%s: no reference gradient for %s", name, p->name);
        const float *grad = (const float *)m->grads + p->offset;
        double norm = 0, ref_norm = json_real_value(json_object_get(ref, "norm"));
        for (int64_t j = 0; j < p->numel; j++)
            norm += (double)grad[j] * grad[j];
        norm = sqrt(norm);
        double scale = ref_norm / sqrt((double)p->numel) + 1e-30; // RMS of the reference gradient
        if (ref_norm == 0.0) {
            ck_assert_msg(norm == 0.0, "%s: %s has gradient norm %g, transformers 0", name, p->name, norm);
            continue;
        }
        double e = fabs(norm - ref_norm) / ref_norm;
        for (int k = 0; k < 8; k++) {
            int64_t j = json_integer_value(json_array_get(json_object_get(ref, "indices"), (size_t)k));
            double want = json_real_value(json_array_get(json_object_get(ref, "values"), (size_t)k));
            e = fmax(e, fabs(grad[j] - want) / scale);
        }
        if (e > worst)
            worst = e, worst_name = p->name;
        n_checked++;
    }
    fprintf(stderr, "%s: gradients of %d tensors vs transformers autograd, worst relative error %.3g (%s)\n", name,
            n_checked, worst, worst_name);
    ck_assert_msg(worst < 1e-4, "%s: gradient of %s differs from transformers (relative %g)", name, worst_name, worst);
    json_decref(ids), json_decref(g);
    free(tokens), free(targets), free(cu), free(w);
    glm5_model_free(m);
}

START_TEST(test_glm51_grads) { check_grads("glm5.1-tiny"); }
END_TEST
START_TEST(test_glm52_grads) { check_grads("glm5.2-tiny"); }
END_TEST
START_TEST(test_groups_grads) { check_grads("glm5-groups-bf16"); }
END_TEST

START_TEST(test_glm51_logits) { check_logits("glm5.1-tiny"); }
END_TEST
START_TEST(test_glm52_indexshare_logits) { check_logits("glm5.2-tiny"); }
END_TEST
START_TEST(test_groups_bf16_fused_logits) { check_logits("glm5-groups-bf16"); }
END_TEST
START_TEST(test_glm51_greedy) { check_greedy("glm5.1-tiny"); }
END_TEST
START_TEST(test_glm52_greedy) { check_greedy("glm5.2-tiny"); }
END_TEST
START_TEST(test_groups_greedy) { check_greedy("glm5-groups-bf16"); }
END_TEST

START_TEST(test_glm51_refuses_indexshare_dir)
{
    dsarl_model_config mc = {.struct_size = sizeof(mc), .model_dir = FIXTURES "glm5.2-tiny",
                             .device_ops = &dsarl_cpu_device_ops, .device = dev, .dsa_ops = &dsarl_dsa_reference_ops,
                             .dsa = dsa};
    dsarl_model *m = NULL;
    ck_assert_int_eq(glm5_create_family(GLM5_FAMILY_51, &mc, &m, &err), DSARL_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.message, "glm5.2") && strstr(err.message, "shared"), "%s", err.message);
}
END_TEST

static Suite *glm5_hf_suite(void)
{
    Suite *s = suite_create("glm5_hf");
    TCase *tc = tcase_create("transformers");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_glm51_logits);
    tcase_add_test(tc, test_glm52_indexshare_logits);
    tcase_add_test(tc, test_groups_bf16_fused_logits);
    tcase_add_test(tc, test_glm51_greedy);
    tcase_add_test(tc, test_glm52_greedy);
    tcase_add_test(tc, test_groups_greedy);
    tcase_add_test(tc, test_glm51_refuses_indexshare_dir);
    tcase_add_test(tc, test_glm51_grads);
    tcase_add_test(tc, test_glm52_grads);
    tcase_add_test(tc, test_groups_grads);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(glm5_hf_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
