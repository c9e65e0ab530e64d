/* check_glm5_cuda.c: the glm_moe_dsa model on the cuda device with the tilelang DSA backend against the same model
 * on the cpu device with the reference backend: logits, per-token log-probs, the indexer KL loss and every
 * parameter gradient, on a small GLM-5.2-shaped config (dense + MoE layers with grouped routing, a full and an
 * IndexShare-shared indexer layer, index_topk below the sequence lengths, one trained MTP depth), same weights on
 * both.
 *
 * Two cases. float32 storage (runtime.cuda_storage_dtype=f32): every cuda and tilelang kernel on the same math as
 * the CPU, so the differences left are fp32 summation order: logits and log-probs |diff| / max |cpu| <= 1e-4 on
 * every token,
 * each gradient tensor ||cuda - cpu|| / ||cpu|| <= 1e-3, the indexer and MTP losses relative 1e-3.
 * bf16 storage (the default): weights are rounded to bf16 values on both devices first (so the CPU runs fp32 math
 * on the very weights the GPU holds), then activations, gradients and the gradient buffer are bf16 on the GPU
 * while router/LM logits, router bias, indexer head weights, norm statistics and losses stay float32 (gemm_f32out,
 * convert). Each bf16 rounding is <= 2^-9 relative, a few dozen of them in series: per token, logits and log-probs
 * <= 3e-2 of the largest CPU value, with a median <= 1e-2 and at most T/10 tokens over (a router or indexer top-k
 * near-tie that bf16 flips changes that token discretely; float32 storage allows none), the indexer loss 5e-2,
 * all gradients together ||cuda - cpu|| / ||cpu|| <= 5e-2 and each tensor <= 0.25 (a small tensor behind a
 * near-tie top-k choice may flip). A dtype mix-up gives errors of order 1.
 * A third case (built when the cudnn DSA backend is, DSARL_TEST_CUDNN) runs the bf16 case with
 * dsa_kernel_backend=cudnn and dsa_attention_form=headwise on the GPU (cuDNN's per-head graphs in training, its
 * paged absorbed forward where the model runs absorbed), under the same bf16 tolerances.
 * Label gpu; exit 77 (skipped) without a GPU. */
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
#include "dsa_reference.h"
#include "glm5_ops.h"
#include "recipe_internal.h"
#include "tilelang.h"
#ifdef DSARL_TEST_CUDNN
#include "cudnn_dsa.h"
#include "tilelang_test_util.h"
static dsarl_registry *registry; /* holds the tilelang plugin the cudnn backend hands over to */
#endif

static const char *recipe_model =
    "policy:\n"
    "  model_config:\n"
    "    vocab_size: 96\n    hidden_size: 64\n    intermediate_size: 96\n    moe_intermediate_size: 32\n"
    "    num_hidden_layers: 3\n    num_attention_heads: 4\n    num_key_value_heads: 4\n    q_lora_rank: 48\n"
    "    kv_lora_rank: 32\n    qk_nope_head_dim: 16\n    qk_rope_head_dim: 16\n    v_head_dim: 24\n"
    "    n_routed_experts: 16\n    num_experts_per_tok: 4\n    n_group: 4\n    topk_group: 2\n    index_topk: 8\n"
    "    index_head_dim: 32\n    index_n_heads: 4\n    first_k_dense_replace: 1\n    index_topk_pattern: FSF\n"
    "    n_shared_experts: 1\n    initializer_range: 0.1\n    num_nextn_predict_layers: %d\n"
    "  megatron_cfg:\n    mtp_num_layers: %d\n    model_overrides:\n      dsa_indexer_loss_coeff: 0.1\n";

enum { T = 40 };
static const dsarl_model_ops *ops = &glm5_2_model_ops;
static dsarl_recipe *recipe;
static dsarl_device *cpu, *gpu;
static dsarl_dsa_context *ref, *tl;
static dsarl_model *cpu_model, *gpu_model;
static dsarl_error err;
static int32_t tokens[T], targets[T], cu[3] = {0, 17, T};
static float dlogprobs[T];
static int bf16_mode; /* the fixture in use: 1 = bf16 storage, 0 = float32 storage */
static const dsarl_dsa_ops *gpu_dsa_ops = &dsarl_dsa_tilelang_ops; /* the GPU run's DSA backend */
static double tol_logits, tol_iloss, tol_grad_tensor, tol_grad_all;
static rng stream; /* the run's random inputs (cuda_test_util.h) */

static dsarl_token_batch batch = {.struct_size = sizeof(dsarl_token_batch), .n_tokens = T, .n_sequences = 2,
                                  .tokens = tokens, .cu_seqlens = cu};

static void setup_with(int bf16, const dsarl_dsa_ops *dsa_ops)
{
    bf16_mode = bf16;
    gpu_dsa_ops = dsa_ops;
    tol_logits = bf16 ? 3e-2 : 1e-4, tol_iloss = bf16 ? 5e-2 : 1e-3;
    tol_grad_tensor = bf16 ? 0.25 : 1e-3, tol_grad_all = bf16 ? 5e-2 : 1e-3;
    char recipe_text[2048];
    // the cudnn case trains in the per-head form its cuDNN graphs serve (the backend's own preference is absorbed)
    // the MTP depth trains in float32 storage only (the model refuses it in bf16), so the bf16 cases run without it
    char model_text[1536];
    snprintf(model_text, sizeof model_text, recipe_model, bf16 ? 0 : 1, bf16 ? 0 : 1);
    snprintf(recipe_text, sizeof recipe_text, "runtime:\n  cuda_storage_dtype: %s\n%s%s", bf16 ? "bf16" : "f32",
             model_text, dsa_ops != &dsarl_dsa_tilelang_ops ? "      dsa_attention_form: headwise\n" : "");
    ck_assert_int_eq(dsarl_recipe_load_string(recipe_text, "glm5_cuda.yaml", &recipe, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(recipe, &err), 0);
    dsarl_parallel single = DSARL_PARALLEL_SINGLE;
    dsarl_device_config dc = {.struct_size = sizeof(dc), .recipe = dsarl_recipe_root(recipe), .parallel = &single,
                              .threads = 1};
    ck_assert_int_eq(cpu_create(&dc, &cpu, &err), 0);
    ck_assert_msg(cuda_create(&dc, &gpu, &err) == 0, "%s", err.message);
    ck_assert_int_eq(cuda_storage_dtype(gpu), bf16 ? DSARL_DTYPE_BF16 : DSARL_DTYPE_F32);
    ck_assert_int_eq(dsarl_dsa_reference_ops.create(&dsarl_cpu_device_ops, cpu, NULL, &ref, &err), 0);
    ck_assert_msg(gpu_dsa_ops->create(&dsarl_cuda_device_ops, gpu, NULL, &tl, &err) == 0, "%s", err.message);
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(recipe),
                             .device_ops = &dsarl_cpu_device_ops, .device = cpu, .dsa_ops = &dsarl_dsa_reference_ops,
                             .dsa = ref, .seed = 29};
    ck_assert_msg(ops->create(&mc, &cpu_model, &err) == 0, "%s", err.message);
    mc.device_ops = &dsarl_cuda_device_ops, mc.device = gpu, mc.dsa_ops = gpu_dsa_ops, mc.dsa = tl;
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
        if (bf16)
            for (int64_t j = 0; j < numel; j++)
                v[j] = bf16_value(v[j]);
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

static void setup_f32(void) { setup_with(0, &dsarl_dsa_tilelang_ops); }
static void setup_bf16(void) { setup_with(1, &dsarl_dsa_tilelang_ops); }
#ifdef DSARL_TEST_CUDNN
static void setup_bf16_cudnn(void)
{
    registry = tilelang_registry();
    cdn_set_host(dsarl_registry_host(registry));
    setup_with(1, &dsarl_dsa_cudnn_ops);
}
#endif

static void teardown(void)
{
    ops->destroy(gpu_model);
    ops->destroy(cpu_model);
    gpu_dsa_ops->destroy(tl);
    dsarl_dsa_reference_ops.destroy(ref);
    cuda_destroy(gpu);
    cpu_destroy(cpu);
    dsarl_recipe_free(recipe);
#ifdef DSARL_TEST_CUDNN
    cdn_set_host(NULL);
    dsarl_registry_free(registry); /* NULL outside the cudnn case */
    registry = NULL;
#endif
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

// Per-token comparison of rows (T, V): err_t = max_v |got - want| / max |want| over the whole array. Prints the
// median, the worst token and the tokens over tol, and checks the median <= tol / 3 and at most `outliers` tokens
// over tol (bf16: a token whose router or indexer top-k flips on a near-tie takes another expert or key, which is
// a discrete change, not an error; a dtype or layout mistake moves every token).
static void check_rows(const char *what, const float *got, const float *want, int64_t V, double tol, int outliers)
{
    double scale = 1e-30, tok_err[T], sorted[T];
    for (int64_t i = 0; i < T * V; i++)
        scale = fmax(scale, fabs(want[i]));
    int over = 0, worst = 0;
    char list[256] = "";
    for (int t = 0; t < T; t++) {
        tok_err[t] = 0.0;
        for (int64_t v = 0; v < V; v++)
            tok_err[t] = fmax(tok_err[t], fabs((double)got[t * V + v] - want[t * V + v]) / scale);
        worst = tok_err[t] > tok_err[worst] ? t : worst;
        if (tok_err[t] > tol) {
            size_t len = strlen(list);
            snprintf(list + len, sizeof list - len, " %d (%.2e)", t, tok_err[t]);
            over++;
        }
    }
    memcpy(sorted, tok_err, sizeof tok_err);
    for (int i = 1; i < T; i++) // insertion sort: T is small
        for (int j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
            double x = sorted[j];
            sorted[j] = sorted[j - 1], sorted[j - 1] = x;
        }
    double median = sorted[T / 2];
    printf("check_glm5_cuda [%s storage]: %s rel err per token: median %.2e, worst %.2e (token %d); %d of %d tokens "
           "over tol %.0e%s%s\n", bf16_mode ? "bf16" : "f32", what, median, tok_err[worst], worst, over, T, tol,
           over ? ":" : "", list);
    ck_assert_msg(median <= tol / 3, "%s: median per-token error %.3g over %.3g", what, median, tol / 3);
    ck_assert_msg(over <= outliers, "%s: %d tokens over %.3g (at most %d allowed)", what, over, tol, outliers);
}

START_TEST(test_logits_and_logprobs)
{
    int64_t V = 96;
    float *lc = malloc(T * V * sizeof(float)), *lg = malloc(T * V * sizeof(float));
    ck_assert_msg(ops->forward_logits(cpu_model, &batch, lc, &err) == 0, "%s", err.message);
    ck_assert_msg(ops->forward_logits(gpu_model, &batch, lg, &err) == 0, "%s", err.message);
    int outliers = bf16_mode ? T / 10 : 0;
    check_rows("logits", lg, lc, V, tol_logits, outliers);
    float pc[T], pg[T];
    ck_assert_msg(ops->forward_logprobs(cpu_model, &batch, targets, pc, &err) == 0, "%s", err.message);
    ck_assert_msg(ops->forward_logprobs(gpu_model, &batch, targets, pg, &err) == 0, "%s", err.message);
    check_rows("log-probs", pg, pc, 1, tol_logits, outliers);
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
    const char *mode = bf16_mode ? "bf16" : "f32";
    printf("check_glm5_cuda [%s storage]: indexer loss cpu %.6g cuda %.6g rel err %.2e (tol %.0e)\n", mode, il_cpu,
           il_gpu, il_err, tol_iloss);
    ck_assert_msg(il_cpu > 0.0f && il_err <= tol_iloss, "indexer loss differs");
    float mtp_cpu = 0.0f, mtp_gpu = 0.0f; // the MTP depth's loss, which the backward added (model op mtp_loss)
    int mtp_trained = !bf16_mode;
    ck_assert_int_eq(ops->mtp_loss(cpu_model, NULL, 0.0, &mtp_cpu), mtp_trained);
    ck_assert_int_eq(ops->mtp_loss(gpu_model, NULL, 0.0, &mtp_gpu), mtp_trained);
    if (mtp_trained) {
        double mtp_err = fabs((double)mtp_gpu - mtp_cpu) / fmax(fabs(mtp_cpu), 1e-30);
        printf("check_glm5_cuda [%s storage]: MTP loss cpu %.6g cuda %.6g rel err %.2e (tol %.0e)\n", mode, mtp_cpu,
               mtp_gpu, mtp_err, tol_iloss);
        ck_assert_msg(mtp_cpu > 0.0f && mtp_err <= tol_iloss, "MTP loss differs");
    }
    int64_t n = ops->parameter_tensors(cpu_model);
    double worst = 0.0, diff_all = 0.0, norm_all = 0.0;
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
        diff_all += diff, norm_all += norm;
        if (e > worst) {
            worst = e;
            snprintf(worst_name, sizeof worst_name, "%s", name);
        }
        ck_assert_msg(e <= tol_grad_tensor, "gradient of %s differs: ||cuda - cpu|| / ||cpu|| = %.3g", name, e);
        checked++;
        free(gc), free(gg);
    }
    double all = sqrt(diff_all / norm_all);
    printf("check_glm5_cuda [%s storage]: %d gradient tensors, all together ||cuda - cpu|| / ||cpu|| %.2e (tol "
           "%.2g), worst tensor %.2e (%s; tol %.2g)\n", mode, checked, all, tol_grad_all, worst, worst_name,
           tol_grad_tensor);
    ck_assert_msg(norm_all > 0.0 && all <= tol_grad_all, "gradients differ: %.3g", all);
}
END_TEST

// The two device ops the model's float32 islands rest on, under bf16 storage: gemm_f32out against the CPU gemm on
// bf16-valued random inputs (a float32 result: only summation order differs), and convert float32 -> bf16 -> float32
// with scales against bf16_value on the host.
START_TEST(test_f32_output_ops)
{
    enum { M = 37, N = 53, K = 70 };
    float a[M * K], b[N * K], want[M * N], got[M * N];
    for (int i = 0; i < M * K; i++)
        a[i] = bf16_value(rng_sym(&stream));
    for (int i = 0; i < N * K; i++)
        b[i] = bf16_value(rng_sym(&stream));
    ck_assert_int_eq(cpu_gemm(cpu, false, true, M, N, K, 0.5f, a, b, 0.0f, want, &err), 0);
    const dsarl_device_ops *d = &dsarl_cuda_device_ops;
    dsarl_dtype st = d->storage_dtype(gpu);
    size_t e = st == DSARL_DTYPE_F32 ? 4 : 2;
    void *da, *db, *dh;
    float *dc, *dback;
    ck_assert_int_eq(d->alloc(gpu, M * K * e, &da, &err), 0);
    ck_assert_int_eq(d->alloc(gpu, N * K * e, &db, &err), 0);
    ck_assert_int_eq(d->alloc(gpu, M * N * e, &dh, &err), 0);
    ck_assert_int_eq(d->alloc(gpu, M * N * 4, (void **)&dc, &err), 0);
    ck_assert_int_eq(d->alloc(gpu, M * N * 4, (void **)&dback, &err), 0);
    ck_assert_int_eq(d->upload_f32(gpu, da, st, a, M * K, &err), 0);
    ck_assert_int_eq(d->upload_f32(gpu, db, st, b, N * K, &err), 0);
    ck_assert_msg(d->gemm_f32out(gpu, false, true, M, N, K, 0.5f, da, db, 0.0f, dc, &err) == 0, "%s", err.message);
    ck_assert_int_eq(d->download_f32(gpu, got, dc, DSARL_DTYPE_F32, M * N, &err), 0);
    double g = max_rel(got, want, M * N);
    printf("check_glm5_cuda [%s storage]: gemm_f32out vs cpu gemm rel err %.2e (tol 1e-5)\n",
           bf16_mode ? "bf16" : "f32", g);
    ck_assert_msg(g <= 1e-5, "gemm_f32out differs: %.3g", g);
    // float32 -> storage (x -3) -> float32 (x -0.25): the host expects round(-3 x) * -0.25
    ck_assert_int_eq(d->convert(gpu, dh, st, dc, DSARL_DTYPE_F32, M * N, -3.0f, &err), 0);
    ck_assert_int_eq(d->convert(gpu, dback, DSARL_DTYPE_F32, dh, st, M * N, -0.25f, &err), 0);
    static float back[M * N]; // from the GPU's own float32 product, so the bf16 rounding points are the same
    ck_assert_int_eq(d->download_f32(gpu, back, dback, DSARL_DTYPE_F32, M * N, &err), 0);
    for (int i = 0; i < M * N; i++) {
        float x = -3.0f * got[i];
        float expect = (bf16_mode ? bf16_value(x) : x) * -0.25f;
        ck_assert_msg(back[i] == expect, "convert[%d]: %g, want %g", i, back[i], expect);
    }
    ck_assert_int_ne(d->convert(gpu, dh, DSARL_DTYPE_I32, dc, DSARL_DTYPE_F32, 4, 1.0f, &err), 0);
    d->free(gpu, da), d->free(gpu, db), d->free(gpu, dh), d->free(gpu, dc), d->free(gpu, dback);
}
END_TEST

int main(void)
{
    if (cuda_visible_devices() == 0) {
        printf("check_glm5_cuda: skipped: no CUDA device is visible\n");
        return 77;
    }
    stream = cuda_test_seed("check_glm5_cuda", 0x9E3779B97F4A7C15ull);
    Suite *s = suite_create("glm5_cuda");
    TCase *f32 = tcase_create("cuda_f32_storage_vs_cpu");
    tcase_add_checked_fixture(f32, setup_f32, teardown);
    tcase_set_timeout(f32, 300);
    tcase_add_test(f32, test_f32_output_ops);
    tcase_add_test(f32, test_logits_and_logprobs);
    tcase_add_test(f32, test_gradients);
    suite_add_tcase(s, f32);
    TCase *bf16 = tcase_create("cuda_bf16_storage_vs_cpu");
    tcase_add_checked_fixture(bf16, setup_bf16, teardown);
    tcase_set_timeout(bf16, 300);
    tcase_add_test(bf16, test_f32_output_ops);
    tcase_add_test(bf16, test_logits_and_logprobs);
    tcase_add_test(bf16, test_gradients);
    suite_add_tcase(s, bf16);
#ifdef DSARL_TEST_CUDNN
    TCase *cudnn = tcase_create("cuda_bf16_cudnn_backend_vs_cpu");
    tcase_add_checked_fixture(cudnn, setup_bf16_cudnn, teardown);
    tcase_set_timeout(cudnn, 300);
    tcase_add_test(cudnn, test_logits_and_logprobs);
    tcase_add_test(cudnn, test_gradients);
    suite_add_tcase(s, cudnn);
#endif
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK); /* CUDA does not survive fork */
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
