/* check_glm5_grad.c: the glm_moe_dsa backward against central finite differences of the forward, for every
 * parameter tensor of a tiny model with a dense layer, MoE layers (grouped routing), a full and a shared
 * (IndexShare) indexer layer and a top-k smaller than the sequences; and the indexer KL loss: its gradient reaches
 * only the indexer weights (and matches finite differences of the loss), while the LM loss never reaches them.
 *
 * Hard choices (indexer top-k, expert choice) make the loss piecewise smooth; an element whose difference
 * quotients at h and h/2 disagree sits on a kink and is skipped (counted, and required to be rare; glm5_fd.h). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_device.h"
#include "dsa_reference.h"
#include "glm5_fd.h"
#include "glm5_ops.h"
#include "recipe_internal.h"

static const char *recipe_text =
    "policy:\n"
    "  model_config:\n"
    "    vocab_size: 48\n    hidden_size: 16\n    intermediate_size: 24\n    moe_intermediate_size: 6\n"
    "    num_hidden_layers: 3\n    num_attention_heads: 2\n    num_key_value_heads: 2\n    q_lora_rank: 12\n"
    "    kv_lora_rank: 8\n    qk_nope_head_dim: 4\n    qk_rope_head_dim: 4\n    v_head_dim: 6\n"
    "    n_routed_experts: 8\n    num_experts_per_tok: 2\n    n_group: 2\n    topk_group: 2\n    index_topk: 3\n"
    "    index_head_dim: 8\n    index_n_heads: 3\n    first_k_dense_replace: 1\n    index_topk_pattern: FSF\n"
    "    n_shared_experts: 1\n    initializer_range: 0.35\n"
    "  megatron_cfg:\n    model_overrides:\n      dsa_indexer_loss_coeff: 0.0\n";

static dsarl_device *dev;
static dsarl_dsa_context *dsa;
static dsarl_recipe *recipe;
static dsarl_model *model;
static dsarl_error err;
static const dsarl_model_ops *ops = &glm5_2_model_ops;

enum { T = 11 };
static int32_t tokens[T] = {5, 17, 3, 40, 22, 9, 31, 2, 47, 11, 26}, cu[3] = {0, 6, 11};
static int32_t targets[T] = {17, 3, 40, 22, 9, -1, 2, 47, 11, 26, 0};
static float dlogprobs[T];
static dsarl_token_batch batch = {.struct_size = sizeof(dsarl_token_batch), .n_tokens = T, .n_sequences = 2,
                                  .tokens = tokens, .cu_seqlens = cu};

static void setup(void)
{
    ck_assert_int_eq(dsarl_recipe_load_string(recipe_text, "grad.yaml", &recipe, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(recipe, &err), 0);
    dsarl_device_config dc = {.struct_size = sizeof(dc), .threads = 1};
    ck_assert_int_eq(cpu_create(&dc, &dev, &err), 0);
    ck_assert_int_eq(dsarl_dsa_reference_ops.create(&dsarl_cpu_device_ops, dev, NULL, &dsa, &err), 0);
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(recipe),
                             .device_ops = &dsarl_cpu_device_ops, .device = dev, .dsa_ops = &dsarl_dsa_reference_ops,
                             .dsa = dsa, .seed = 11};
    ck_assert_msg(ops->create(&mc, &model, &err) == 0, "%s", err.message);
    // non-zero e_score_correction_bias and norm weights, so their roles are exercised
    for (int64_t i = 0; i < ops->parameter_tensors(model); i++) {
        const char *name;
        int32_t ndim;
        int64_t shape[3];
        ck_assert_int_eq(ops->parameter_info(model, i, &name, &ndim, shape, NULL, &err), 0);
        if (ndim != 1)
            continue;
        float v[64];
        ck_assert_int_eq(ops->read_parameter(model, i, v, NULL, &err), 0);
        for (int64_t j = 0; j < shape[0]; j++)
            v[j] += 0.1f * sinf((float)(7 * i + 3 * j));
        ck_assert_int_eq(ops->write_parameter(model, i, v, &err), 0);
    }
    for (int t = 0; t < T; t++)
        dlogprobs[t] = 0.5f + 0.4f * cosf((float)(3 * t + 1));
}

static void teardown(void)
{
    ops->destroy(model);
    dsarl_dsa_reference_ops.destroy(dsa);
    cpu_destroy(dev);
    dsarl_recipe_free(recipe);
}

// L = sum_t dlogprobs[t] * logprobs[t], or the indexer loss when indexer is set.
static double loss(int indexer)
{
    if (indexer) {
        float il = 0;
        float zeros[T] = {0};
        ck_assert_int_eq(ops->backward(model, &batch, targets, zeros, &il, &err), 0);
        return il;
    }
    float lp[T];
    ck_assert_msg(ops->forward_logprobs(model, &batch, targets, lp, &err) == 0, "%s", err.message);
    double s = 0;
    for (int t = 0; t < T; t++)
        s += (double)dlogprobs[t] * lp[t];
    return s;
}

static int is_indexer(const char *name) { return strstr(name, ".indexer.") != NULL; }

static int fd_indexer; // the loss the differences take: 1 the indexer loss, 0 the LM loss
static double fd_loss(void *user)
{
    (void)user;
    return loss(fd_indexer);
}

static bool pick_all(const glm5_param *p) { (void)p; return true; }
static bool pick_indexer(const glm5_param *p) { return is_indexer(p->name); }

// Central differences on up to `per_tensor` elements of every selected tensor against the analytic gradient.
static void fd_check(int indexer_loss, int only_indexer, int per_tensor, glm5_fd_stats *st)
{
    ck_assert_int_eq(ops->zero_grad(model, &err), 0);
    float zeros[T] = {0};
    ck_assert_int_eq(ops->backward(model, &batch, targets, indexer_loss ? zeros : dlogprobs, NULL, &err), 0);
    float *grads = malloc((size_t)model->n_weights * sizeof(float)); // float32 storage on the cpu device
    memcpy(grads, model->grads, (size_t)model->n_weights * sizeof(float));
    fd_indexer = indexer_loss;
    glm5_fd_check(ops, model, grads, only_indexer ? pick_indexer : pick_all, per_tensor, fd_loss, NULL, st);
    free(grads);
}

START_TEST(test_lm_gradients_every_parameter)
{
    glm5_fd_stats st = {0};
    fd_check(0, 0, 4, &st);
    fprintf(stderr, "LM loss: %d elements checked, %d skipped at kinks, worst relative error %.3g (%s)\n",
            st.checked, st.skipped, st.worst, st.worst_name);
    ck_assert_msg(st.failed == 0, "%d elements disagree; worst %s", st.failed, st.worst_name);
    ck_assert_int_gt(st.checked, 4 * st.skipped);
}
END_TEST

START_TEST(test_lm_loss_never_reaches_indexer)
{
    ck_assert_int_eq(ops->zero_grad(model, &err), 0);
    ck_assert_int_eq(ops->backward(model, &batch, targets, dlogprobs, NULL, &err), 0);
    int n_indexer = 0;
    for (int64_t i = 0; i < ops->parameter_tensors(model); i++) {
        const char *name;
        int32_t ndim;
        int64_t shape[3];
        ck_assert_int_eq(ops->parameter_info(model, i, &name, &ndim, shape, NULL, &err), 0);
        int64_t numel = shape[0] * (ndim > 1 ? shape[1] : 1) * (ndim > 2 ? shape[2] : 1);
        float *g = malloc((size_t)numel * sizeof(float));
        ck_assert_int_eq(ops->read_parameter(model, i, NULL, g, &err), 0);
        double mx = 0;
        for (int64_t j = 0; j < numel; j++)
            mx = fmax(mx, fabs(g[j]));
        if (is_indexer(name))
            n_indexer++, ck_assert_msg(mx == 0.0, "%s got LM gradient %g", name, mx);
        else if (!strstr(name, "e_score_correction_bias"))
            ck_assert_msg(mx > 0.0, "%s got no gradient", name);
        free(g);
    }
    ck_assert_int_eq(n_indexer, 2 * 5); // two full layers, five indexer tensors each; the shared layer has none
}
END_TEST

static void indexer_loss_only_reaches_indexer(int sparse)
{
    model->indexer_loss_coeff = 0.5f;
    model->indexer_sparse_loss = sparse;
    // (1) with the LM loss too, the non-indexer gradients equal those without the indexer loss
    int64_t n = ops->parameter_tensors(model);
    ck_assert_int_eq(ops->zero_grad(model, &err), 0);
    float il = -1;
    ck_assert_int_eq(ops->backward(model, &batch, targets, dlogprobs, &il, &err), 0);
    ck_assert_msg(il > 0.0f && isfinite(il), "indexer loss %g", il);
    float *with = malloc((size_t)model->n_weights * sizeof(float));
    memcpy(with, model->grads, (size_t)model->n_weights * sizeof(float));
    model->indexer_loss_coeff = 0.0f;
    ck_assert_int_eq(ops->zero_grad(model, &err), 0);
    ck_assert_int_eq(ops->backward(model, &batch, targets, dlogprobs, NULL, &err), 0);
    model->indexer_loss_coeff = 0.5f;
    for (int64_t i = 0; i < n; i++) {
        const glm5_param *p = &model->params[i];
        int same = memcmp(with + p->offset, (float *)model->grads + p->offset, (size_t)p->numel * sizeof(float)) == 0;
        if (is_indexer(p->name))
            ck_assert_msg(!same, "%s: the indexer loss did not reach it", p->name);
        else
            ck_assert_msg(same, "%s: the indexer loss leaked into a main-model gradient", p->name);
    }
    free(with);
    // (2) finite differences of the indexer loss for the indexer weights
    glm5_fd_stats st = {0};
    fd_check(1, 1, 6, &st);
    fprintf(stderr, "indexer loss (%s): %d checked, %d skipped, worst %.3g (%s)\n", sparse ? "sparse" : "dense",
            st.checked, st.skipped, st.worst, st.worst_name);
    ck_assert_msg(st.failed == 0, "%d elements disagree; worst %s", st.failed, st.worst_name);
    ck_assert_int_gt(st.checked, 4 * st.skipped);
}

START_TEST(test_indexer_loss_sparse) { indexer_loss_only_reaches_indexer(1); }
END_TEST
START_TEST(test_indexer_loss_dense_warmup) { indexer_loss_only_reaches_indexer(0); }
END_TEST

START_TEST(test_logprobs_match_logits)
{
    float lp[T], logits[T * 48];
    ck_assert_int_eq(ops->forward_logprobs(model, &batch, targets, lp, &err), 0);
    ck_assert_int_eq(ops->forward_logits(model, &batch, logits, &err), 0);
    for (int t = 0; t < T; t++) {
        double z = 0;
        for (int v = 0; v < 48; v++)
            z += exp((double)logits[t * 48 + v]);
        double want = targets[t] < 0 ? 0.0 : logits[t * 48 + targets[t]] - log(z);
        ck_assert_double_eq_tol(lp[t], want, 1e-5);
    }
}
END_TEST

/* batch.logit_scale (1 / sampling temperature): logits, log-probs and every gradient follow the scaled LM head. */
START_TEST(test_tempered_logits_and_gradients)
{
    const float scale = 1.0f / 0.7f;
    float plain[T * 48], scaled[T * 48], lp[T];
    ck_assert_int_eq(ops->forward_logits(model, &batch, plain, &err), 0);
    batch.logit_scale = scale;
    ck_assert_int_eq(ops->forward_logits(model, &batch, scaled, &err), 0);
    ck_assert_int_eq(ops->forward_logprobs(model, &batch, targets, lp, &err), 0);
    for (int t = 0; t < T; t++) {
        double z = 0;
        for (int v = 0; v < 48; v++) {
            ck_assert_double_eq_tol(scaled[t * 48 + v], scale * plain[t * 48 + v], 1e-5);
            z += exp((double)scale * plain[t * 48 + v]);
        }
        double want = targets[t] < 0 ? 0.0 : scale * plain[t * 48 + targets[t]] - log(z);
        ck_assert_double_eq_tol(lp[t], want, 1e-5);
    }
    glm5_fd_stats st = {0};
    fd_check(0, 0, 2, &st);
    batch.logit_scale = 0.0f;
    fprintf(stderr, "tempered LM loss: %d elements checked, %d skipped at kinks, worst relative error %.3g (%s)\n",
            st.checked, st.skipped, st.worst, st.worst_name);
    ck_assert_msg(st.failed == 0, "%d elements disagree; worst %s", st.failed, st.worst_name);
    ck_assert_int_gt(st.checked, 4 * st.skipped);
}
END_TEST

START_TEST(test_activation_recompute_same_gradients)
{
    model->indexer_loss_coeff = 0.25f;
    float il_saved = 0, il_recomputed = 0;
    ck_assert_int_eq(ops->zero_grad(model, &err), 0);
    ck_assert_int_eq(ops->backward(model, &batch, targets, dlogprobs, &il_saved, &err), 0);
    float *saved = malloc((size_t)model->n_weights * sizeof(float));
    memcpy(saved, model->grads, (size_t)model->n_weights * sizeof(float));
    model->activation_recompute = true;
    ck_assert_int_eq(ops->zero_grad(model, &err), 0);
    ck_assert_msg(ops->backward(model, &batch, targets, dlogprobs, &il_recomputed, &err) == 0, "%s", err.message);
    model->activation_recompute = false;
    ck_assert(il_saved > 0.0f && il_saved == il_recomputed);
    ck_assert_mem_eq(saved, model->grads, (size_t)model->n_weights * sizeof(float));
    free(saved);
}
END_TEST

static Suite *glm5_grad_suite(void)
{
    Suite *s = suite_create("glm5_grad");
    TCase *tc = tcase_create("grad");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_logprobs_match_logits);
    tcase_add_test(tc, test_lm_loss_never_reaches_indexer);
    tcase_add_test(tc, test_lm_gradients_every_parameter);
    tcase_add_test(tc, test_tempered_logits_and_gradients);
    tcase_add_test(tc, test_indexer_loss_sparse);
    tcase_add_test(tc, test_indexer_loss_dense_warmup);
    tcase_add_test(tc, test_activation_recompute_same_gradients);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(glm5_grad_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
