/* check_glm5_cuda.c: the glm_moe_dsa model on the cuda device with the tilelang DSA backend against the same model
 * on the cpu device with the reference backend: logits, per-token log-probs, the indexer KL loss and every
 * parameter gradient, on a small GLM-5.2-shaped config (dense + MoE layers with grouped routing, a full and an
 * IndexShare-shared indexer layer, index_topk below the sequence lengths), same weights on both.
 *
 * The cuda device runs with runtime.cuda_storage_dtype=f32 here: the model keeps router logits, LM logits and
 * router biases in buffers it reads as float32, which only float32 storage provides today (bf16 storage needs the
 * model to keep those in float32 explicitly). So this checks the whole model path through every cuda and tilelang
 * kernel; the differences left are fp32 summation order (cuBLAS, block reductions) against the CPU's float32 /
 * double. Tolerances: logits and log-probs max |diff| / max |cpu| <= 1e-4; each gradient tensor
 * ||cuda - cpu|| / ||cpu|| <= 1e-3; the indexer loss relative 1e-3. Label gpu; exit 77 (skipped) without a GPU. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_device.h"
#define DSARL_CUDA_DEVICE_OPAQUE /* both devices define struct dsarl_device */
#include "cuda_device.h"
#include "dsa_reference.h"
#include "glm5_ops.h"
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
    "    n_shared_experts: 1\n    initializer_range: 0.1\n"
    "  megatron_cfg:\n    model_overrides:\n      dsa_indexer_loss_coeff: 0.1\n";

enum { T = 40 };
static const dsarl_model_ops *ops = &glm5_2_model_ops;
static dsarl_recipe *recipe;
static dsarl_device *cpu, *gpu;
static dsarl_dsa_context *ref, *tl;
static dsarl_model *cpu_model, *gpu_model;
static dsarl_error err;
static int32_t tokens[T], targets[T], cu[3] = {0, 17, T};
static float dlogprobs[T];
static dsarl_token_batch batch = {.struct_size = sizeof(dsarl_token_batch), .n_tokens = T, .n_sequences = 2,
                                  .tokens = tokens, .cu_seqlens = cu};

static void setup(void)
{
    ck_assert_int_eq(dsarl_recipe_load_string(recipe_text, "glm5_cuda.yaml", &recipe, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(recipe, &err), 0);
    dsarl_parallel single = DSARL_PARALLEL_SINGLE;
    dsarl_device_config dc = {.struct_size = sizeof(dc), .recipe = dsarl_recipe_root(recipe), .parallel = &single,
                              .threads = 1};
    ck_assert_int_eq(cpu_create(&dc, &cpu, &err), 0);
    ck_assert_msg(cuda_create(&dc, &gpu, &err) == 0, "%s", err.message);
    ck_assert_int_eq(cuda_storage_dtype(gpu), DSARL_DTYPE_F32);
    ck_assert_int_eq(dsarl_dsa_reference_ops.create(&dsarl_cpu_device_ops, cpu, NULL, &ref, &err), 0);
    ck_assert_msg(dsarl_dsa_tilelang_ops.create(&dsarl_cuda_device_ops, gpu, NULL, &tl, &err) == 0, "%s",
                  err.message);
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(recipe),
                             .device_ops = &dsarl_cpu_device_ops, .device = cpu, .dsa_ops = &dsarl_dsa_reference_ops,
                             .dsa = ref, .seed = 29};
    ck_assert_msg(ops->create(&mc, &cpu_model, &err) == 0, "%s", err.message);
    mc.device_ops = &dsarl_cuda_device_ops, mc.device = gpu, mc.dsa_ops = &dsarl_dsa_tilelang_ops, mc.dsa = tl;
    ck_assert_msg(ops->create(&mc, &gpu_model, &err) == 0, "%s", err.message);
    // identical weights on both (whatever the initialisation does), with non-zero biases and norm weights
    int64_t n = ops->parameter_tensors(cpu_model);
    for (int64_t i = 0; i < n; i++) {
        const char *name;
        int32_t ndim;
        int64_t shape[3];
        ck_assert_int_eq(ops->parameter_info(cpu_model, i, &name, &ndim, shape, NULL, &err), 0);
        int64_t numel = shape[0] * (ndim > 1 ? shape[1] : 1) * (ndim > 2 ? shape[2] : 1);
        float *v = malloc((size_t)numel * sizeof(float));
        ck_assert_int_eq(ops->read_parameter(cpu_model, i, v, NULL, &err), 0);
        if (ndim == 1)
            for (int64_t j = 0; j < numel; j++)
                v[j] += 0.1f * sinf((float)(7 * i + 3 * j));
        ck_assert_int_eq(ops->write_parameter(cpu_model, i, v, &err), 0);
        ck_assert_msg(ops->write_parameter(gpu_model, i, v, &err) == 0, "%s", err.message);
        free(v);
    }
    for (int t = 0; t < T; t++) {
        tokens[t] = (int32_t)((t * 37 + 11) % 96);
        targets[t] = t == 16 ? -1 : (int32_t)((t * 53 + 5) % 96);
        dlogprobs[t] = 0.5f + 0.4f * cosf((float)(3 * t + 1));
    }
}

static void teardown(void)
{
    ops->destroy(gpu_model);
    ops->destroy(cpu_model);
    dsarl_dsa_tilelang_ops.destroy(tl);
    dsarl_dsa_reference_ops.destroy(ref);
    cuda_destroy(gpu);
    cpu_destroy(cpu);
    dsarl_recipe_free(recipe);
}

static double max_rel(const float *got, const float *want, int64_t n)
{
    double maxref = 1e-30, maxerr = 0.0;
    for (int64_t i = 0; i < n; i++) {
        maxref = fmax(maxref, fabs(want[i]));
        maxerr = fmax(maxerr, fabs((double)got[i] - want[i]));
    }
    return maxerr / maxref;
}

START_TEST(test_logits_and_logprobs)
{
    int64_t V = 96;
    float *lc = malloc(T * V * sizeof(float)), *lg = malloc(T * V * sizeof(float));
    ck_assert_msg(ops->forward_logits(cpu_model, &batch, lc, &err) == 0, "%s", err.message);
    ck_assert_msg(ops->forward_logits(gpu_model, &batch, lg, &err) == 0, "%s", err.message);
    double e = max_rel(lg, lc, T * V);
    printf("check_glm5_cuda: logits (T=%d, V=%lld) rel err %.2e (tol 1e-4)\n", T, (long long)V, e);
    ck_assert_msg(e <= 1e-4, "logits differ: %.3g", e);
    float pc[T], pg[T];
    ck_assert_msg(ops->forward_logprobs(cpu_model, &batch, targets, pc, &err) == 0, "%s", err.message);
    ck_assert_msg(ops->forward_logprobs(gpu_model, &batch, targets, pg, &err) == 0, "%s", err.message);
    e = max_rel(pg, pc, T);
    printf("check_glm5_cuda: log-probs rel err %.2e (tol 1e-4)\n", e);
    ck_assert_msg(e <= 1e-4, "log-probs differ: %.3g", e);
    free(lc), free(lg);
}
END_TEST

START_TEST(test_gradients)
{
    float il_cpu = 0.0f, il_gpu = 0.0f;
    ck_assert_int_eq(ops->zero_grad(cpu_model, &err), 0);
    ck_assert_int_eq(ops->zero_grad(gpu_model, &err), 0);
    ck_assert_msg(ops->backward(cpu_model, &batch, targets, dlogprobs, &il_cpu, &err) == 0, "%s", err.message);
    ck_assert_msg(ops->backward(gpu_model, &batch, targets, dlogprobs, &il_gpu, &err) == 0, "%s", err.message);
    double il_err = fabs((double)il_gpu - il_cpu) / fmax(fabs(il_cpu), 1e-30);
    printf("check_glm5_cuda: indexer loss cpu %.6g cuda %.6g rel err %.2e (tol 1e-3)\n", il_cpu, il_gpu, il_err);
    ck_assert_msg(il_cpu > 0.0f && il_err <= 1e-3, "indexer loss differs");
    int64_t n = ops->parameter_tensors(cpu_model);
    double worst = 0.0;
    char worst_name[128] = "";
    int checked = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *name;
        int32_t ndim;
        int64_t shape[3];
        int trainable;
        ck_assert_int_eq(ops->parameter_info(cpu_model, i, &name, &ndim, shape, &trainable, &err), 0);
        if (!trainable)
            continue;
        int64_t numel = shape[0] * (ndim > 1 ? shape[1] : 1) * (ndim > 2 ? shape[2] : 1);
        float *gc = malloc((size_t)numel * sizeof(float)), *gg = malloc((size_t)numel * sizeof(float));
        ck_assert_int_eq(ops->read_parameter(cpu_model, i, NULL, gc, &err), 0);
        ck_assert_int_eq(ops->read_parameter(gpu_model, i, NULL, gg, &err), 0);
        double diff = 0.0, norm = 0.0;
        for (int64_t j = 0; j < numel; j++) {
            diff += ((double)gg[j] - gc[j]) * ((double)gg[j] - gc[j]);
            norm += (double)gc[j] * gc[j];
        }
        double e = norm > 0.0 ? sqrt(diff / norm) : sqrt(diff);
        if (e > worst) {
            worst = e;
            snprintf(worst_name, sizeof worst_name, "%s", name);
        }
        ck_assert_msg(e <= 1e-3, "gradient of %s differs: ||cuda - cpu|| / ||cpu|| = %.3g", name, e);
        checked++;
        free(gc), free(gg);
    }
    printf("check_glm5_cuda: %d gradient tensors, worst ||cuda - cpu|| / ||cpu|| %.2e (%s; tol 1e-3)\n", checked,
           worst, worst_name);
}
END_TEST

int main(void)
{
    if (cuda_visible_devices() == 0) {
        printf("check_glm5_cuda: skipped: no CUDA device is visible\n");
        return 77;
    }
    Suite *s = suite_create("glm5_cuda");
    TCase *tc = tcase_create("cuda_vs_cpu");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_logits_and_logprobs);
    tcase_add_test(tc, test_gradients);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK); /* CUDA does not survive fork */
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
