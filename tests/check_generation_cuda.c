/* check_generation_cuda.c: the generation path on the cuda device against its CPU references.
 *
 *   sampler   the cuda device's sample_filtered against the CPU device's op (itself equal to the host filter,
 *             check_generation_paged) on random float32 rows with ties: greedy, plain temperature, top-k, top-p and
 *             both. The kept sets (finite entries of the filtered rows) and the drawn ids must be equal; log-probs
 *             within relative 1e-5 (double sums in another order). Both draw the same Philox uniform.
 *   paged     the native engine on glm5 (cuda, float32 storage, tilelang DSA) with its paged cache against the
 *             contiguous cache on the same device: the same step batches, so the same tokens; log-probs within
 *             relative 1e-5 (the gathered key array may change kernel tiling).
 * Label gpu, its own executable without fork; exit 77 (skipped) without a GPU. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_device.h"
#define DSARL_CUDA_DEVICE_OPAQUE /* both devices define struct dsarl_device */
#include "cuda_device.h"
#include "cuda_test_util.h"
#include "glm5_ops.h"
#include "native_generator.h"
#include "recipe_internal.h"
#include "tilelang.h"

static const char *recipe_text =
    "runtime:\n  cuda_storage_dtype: f32\n"
    "policy:\n"
    "  model_config:\n"
    "    vocab_size: 96\n    hidden_size: 64\n    intermediate_size: 96\n    moe_intermediate_size: 32\n"
    "    num_hidden_layers: 3\n    num_attention_heads: 4\n    num_key_value_heads: 4\n    q_lora_rank: 48\n"
    "    kv_lora_rank: 32\n    qk_nope_head_dim: 16\n    qk_rope_head_dim: 16\n    v_head_dim: 24\n"
    "    n_routed_experts: 16\n    num_experts_per_tok: 4\n    n_group: 4\n    topk_group: 2\n    index_topk: 8\n"
    "    index_head_dim: 32\n    index_n_heads: 4\n    first_k_dense_replace: 1\n    index_topk_pattern: FSF\n"
    "    n_shared_experts: 1\n    initializer_range: 0.1\n";

static dsarl_recipe *recipe;
static dsarl_device *cpu, *gpu;
static dsarl_error err;
static rng stream;

static void setup(void)
{
    ck_assert_int_eq(dsarl_recipe_load_string(recipe_text, "gen_cuda.yaml", &recipe, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(recipe, &err), 0);
    dsarl_parallel single = DSARL_PARALLEL_SINGLE;
    dsarl_device_config dc = {.struct_size = sizeof(dc), .recipe = dsarl_recipe_root(recipe), .parallel = &single,
                              .threads = 1};
    ck_assert_int_eq(cpu_create(&dc, &cpu, &err), 0);
    ck_assert_msg(cuda_create(&dc, &gpu, &err) == 0, "%s", err.message);
}

static void teardown(void)
{
    cuda_destroy(gpu);
    cpu_destroy(cpu);
    dsarl_recipe_free(recipe);
}

START_TEST(test_sampler_matches_cpu)
{
    enum { T = 9, V = 3000 };
    float *raw = malloc(T * V * sizeof(float)), *cpu_rows = malloc(T * V * sizeof(float));
    float *gpu_rows = malloc(T * V * sizeof(float));
    for (int64_t i = 0; i < T * V; i++) // eighth steps: many exact ties
        raw[i] = (float)(rng_below(&stream, 64) - 32) * 0.125f;
    uint64_t streams[T];
    for (int32_t t = 0; t < T; t++)
        streams[t] = native_sample_stream(3 * t + 2, t);
    struct { float temperature, top_p; int32_t top_k; } cases[5] = {
        {0.0f, 1.0f, 0}, {1.0f, 1.0f, 0}, {0.7f, 1.0f, 50}, {1.2f, 0.6f, 0}, {0.9f, 0.85f, 200}};
    float *d_rows = dev_alloc(gpu, T * V * sizeof(float)), *d_lp = dev_alloc(gpu, T * sizeof(float));
    int32_t *d_tok = dev_alloc(gpu, T * sizeof(int32_t));
    for (int c = 0; c < 5; c++) {
        memcpy(cpu_rows, raw, T * V * sizeof(float));
        int32_t tok_cpu[T], tok_gpu[T];
        float lp_cpu[T], lp_gpu[T];
        ck_assert_int_eq(dsarl_cpu_device_ops.sample_filtered(cpu, tok_cpu, lp_cpu, cpu_rows, T, V,
                                                               cases[c].temperature, cases[c].top_k, cases[c].top_p,
                                                               5, streams, &err), 0);
        ck_assert_int_eq(cuda_copy(gpu, d_rows, raw, T * V * sizeof(float), DSARL_COPY_HOST_TO_DEVICE, &err), 0);
        ck_assert_msg(dsarl_cuda_device_ops.sample_filtered(gpu, d_tok, d_lp, d_rows, T, V, cases[c].temperature,
                                                            cases[c].top_k, cases[c].top_p, 5, streams, &err) == 0,
                      "%s", err.message);
        ck_assert_int_eq(cuda_copy(gpu, tok_gpu, d_tok, sizeof tok_gpu, DSARL_COPY_DEVICE_TO_HOST, &err), 0);
        ck_assert_int_eq(cuda_copy(gpu, lp_gpu, d_lp, sizeof lp_gpu, DSARL_COPY_DEVICE_TO_HOST, &err), 0);
        ck_assert_int_eq(cuda_copy(gpu, gpu_rows, d_rows, T * V * sizeof(float), DSARL_COPY_DEVICE_TO_HOST, &err), 0);
        for (int32_t t = 0; t < T; t++) {
            int64_t kept_cpu = 0, kept_gpu = 0, differ = 0;
            for (int64_t v = 0; v < V; v++) {
                bool a = isfinite(cpu_rows[t * V + v]), b = isfinite(gpu_rows[t * V + v]);
                kept_cpu += a, kept_gpu += b, differ += a != b;
            }
            ck_assert_msg(differ == 0, "case %d row %d: kept sets differ in %lld ids (cpu keeps %lld, cuda %lld)", c,
                          t, (long long)differ, (long long)kept_cpu, (long long)kept_gpu);
            ck_assert_msg(tok_cpu[t] == tok_gpu[t], "case %d row %d: cuda drew %d, cpu %d", c, t, tok_gpu[t],
                          tok_cpu[t]);
            ck_assert_msg(fabsf(lp_cpu[t] - lp_gpu[t]) <= 1e-5f * fmaxf(1.0f, fabsf(lp_cpu[t])),
                          "case %d row %d: log-prob cuda %.9g, cpu %.9g", c, t, lp_gpu[t], lp_cpu[t]);
        }
        printf("sampler case %d: ids and kept sets equal, log-probs within 1e-5 (rel err)\n", c);
    }
    cuda_free(gpu, d_rows), cuda_free(gpu, d_lp), cuda_free(gpu, d_tok);
    free(raw), free(cpu_rows), free(gpu_rows);
}
END_TEST

START_TEST(test_paged_matches_contiguous_on_cuda)
{
    dsarl_dsa_context *tl = NULL;
    ck_assert_msg(dsarl_dsa_tilelang_ops.create(&dsarl_cuda_device_ops, gpu, NULL, &tl, &err) == 0, "%s",
                  err.message);
    dsarl_model *m = NULL;
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(recipe),
                             .device_ops = &dsarl_cuda_device_ops, .device = gpu, .dsa_ops = &dsarl_dsa_tilelang_ops,
                             .dsa = tl, .seed = 29};
    ck_assert_msg(glm5_2_model_ops.create(&mc, &m, &err) == 0, "%s", err.message);
    int32_t lens[4] = {13, 3, 20, 9}, cu[5] = {0}, tokens[45];
    for (int32_t b = 0; b < 4; b++)
        cu[b + 1] = cu[b] + lens[b];
    for (int32_t t = 0; t < cu[4]; t++)
        tokens[t] = 1 + rng_below(&stream, 95);
    dsarl_token_batch prompts = {.struct_size = sizeof(prompts), .n_tokens = cu[4], .n_sequences = 4,
                                 .tokens = tokens, .cu_seqlens = cu};
    float temps[2] = {0.0f, 0.9f};
    for (int s = 0; s < 2; s++) {
        dsarl_sampling_params sp = {.struct_size = sizeof(sp), .temperature = temps[s], .top_p = 0.95f, .top_k = 40,
                                    .max_new_tokens = 12, .seed = 17};
        dsarl_generator *contiguous = NULL, *paged = NULL;
        ck_assert_int_eq(native_create(NULL, &glm5_2_model_ops, m, &contiguous, &err), 0);
        ck_assert_int_eq(native_create(NULL, &glm5_2_model_ops, m, &paged, &err), 0);
        native_paged_config off = native_get_paged(contiguous), on = native_get_paged(paged);
        ck_assert(on.enabled);
        off.enabled = false, on.block_size = 4;
        native_set_paged(contiguous, off), native_set_paged(paged, on);
        dsarl_generation_result a, b;
        ck_assert_msg(native_generate(contiguous, &prompts, &sp, &a, &err) == 0, "%s", err.message);
        ck_assert_msg(native_generate(paged, &prompts, &sp, &b, &err) == 0, "%s", err.message);
        ck_assert_int_eq(a.cu_lengths[4], b.cu_lengths[4]);
        int32_t identical = 0;
        for (int32_t t = 0; t < a.cu_lengths[4]; t++) {
            ck_assert_msg(a.tokens[t] == b.tokens[t], "temperature %g token %d: paged %d, contiguous %d",
                          (double)temps[s], t, b.tokens[t], a.tokens[t]);
            ck_assert(fabsf(a.logprobs[t] - b.logprobs[t]) <= 1e-5f * fmaxf(1.0f, fabsf(a.logprobs[t])));
            identical += a.logprobs[t] == b.logprobs[t];
        }
        printf("paged vs contiguous on cuda, temperature %g: %d of %d log-probs bit-identical\n", (double)temps[s],
               identical, a.cu_lengths[4]);
        native_destroy(contiguous), native_destroy(paged);
    }
    glm5_2_model_ops.destroy(m);
    dsarl_dsa_tilelang_ops.destroy(tl);
}
END_TEST

int main(void)
{
    if (cuda_visible_devices() == 0) {
        printf("check_generation_cuda: skipped: no CUDA device is visible\n");
        return 77;
    }
    stream = cuda_test_seed("check_generation_cuda", 0x5DEECE66Dull);
    Suite *s = suite_create("generation_cuda");
    TCase *tc = tcase_create("cuda_vs_cpu");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_sampler_matches_cpu);
    tcase_add_test(tc, test_paged_matches_contiguous_on_cuda);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK); /* CUDA does not survive fork */
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
