/* check_glm5_moe_group.c: MoE routed rows grouped on the device (the ABI 1.7 slot moe_group_padded) against the
 * host grouping, on the CPU device and a tiny glm5.2 model (3 MoE layers, 8 experts, top-2, random weights).
 *
 * The CPU device is not launch-bound, so the model never groups on it by itself: the suite forces the model's
 * launch_bound flag (as a GPU sets it) and swaps the model's device table for copies of the CPU's, one whose slot
 * counts its calls (device grouping) and one without the slot (the host grouping a 1.6 device gets). Both then run
 * the padded batched expert GEMMs, the device with pad = T rows per expert, the host with pad = the largest group;
 * the CPU's own default runs per-expert GEMMs where groups are uneven. The math is the same: each real row goes
 * through the same weights in the same order, and the extra rows are token r mod T at routing weight 0, whose products
 * add exact zeros to outputs and weight gradients. It is not bitwise: OpenBLAS picks its kernel by shape (a GEMM of
 * one row runs as a GEMV, a decode step's usual group), and kernels round their dot products in different orders.
 * So logits, gradients and log-probs are compared within 1e-5 of their largest magnitude (a few float32 ulps of
 * the sums; a wrong row or weight moves them by far more), and the measured differences are printed.
 *
 *   forward_backward   forward_logits and backward, device vs host padded and host default; the slot is called
 *                      once per MoE layer per pass; 65 tokens (past GLM5_MOE_PAD_MAX) stay on the host;
 *                      activation recompute regroups on the device and gives the same gradients bit for bit
 *   decode             the native engine's greedy prefill + decode steps: same tokens and log-probs either way
 *   routing            a batch that records experts groups every layer on the host and records what the host path
 *                      records; a replay of one layer's rows takes that layer to the host, the others stay */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_model_fixture.h"
#include "dsarl/rng.h"
#include "generation_recipes.h"
#include "glm5_ops.h"
#include "glm5_pass.h"
#include "native_generator.h"

static dsarl_error err;
static int group_calls; // calls of the counting slot since the last reset

static int counting_group(dsarl_device *dev, int32_t *rows, int32_t *slot, int32_t *slot_inv, const int32_t *indices,
                          int64_t T, int64_t E, int32_t top_k, int64_t pad, dsarl_error *e)
{
    group_calls++;
    return cpu_moe_group_padded(dev, rows, slot, slot_inv, indices, T, E, top_k, pad, e);
}

static dsarl_device_ops device_ops, host_ops; // the CPU table with the counting slot, and without the slot

typedef enum { DEVICE_GROUPING, HOST_PADDED, HOST_DEFAULT } grouping;

static void use(cpu_model_fixture *f, grouping g)
{
    f->model->dev_ops = g == DEVICE_GROUPING ? &device_ops : &host_ops;
    f->model->launch_bound = g != HOST_DEFAULT;
}

static void open_model(cpu_model_fixture *f)
{
    device_ops = host_ops = dsarl_cpu_device_ops;
    device_ops.moe_group_padded = counting_group;
    host_ops.moe_group_padded = NULL;
    // the generation suites' GLM-5.2 model: IndexShare (F S F S), grouped routing, 3 MoE layers of 8 experts, top-2
    cpu_model_fixture_open(f, &glm5_2_model_ops, recipe_52, "moe_group.yaml", 17);
    ck_assert_int_eq(f->model->cfg.n_routed_experts, 8);
}

static void close_model(cpu_model_fixture *f)
{
    f->model->dev_ops = &dsarl_cpu_device_ops;
    cpu_model_fixture_close(f);
}

// A packed batch of n sequences of random tokens, lengths summing to T.
typedef struct batch {
    int32_t T, B, cu[8], *tokens, *targets;
    float *dlp;
    dsarl_token_batch b;
} batch;

static void make_batch(batch *x, int32_t T, int32_t B, uint64_t seed, int32_t V)
{
    *x = (batch){.T = T, .B = B};
    dsarl_rng rng;
    dsarl_rng_init(&rng, seed, 0);
    x->tokens = malloc(sizeof(int32_t) * (size_t)T), x->targets = malloc(sizeof(int32_t) * (size_t)T);
    x->dlp = malloc(sizeof(float) * (size_t)T);
    for (int32_t s = 0; s <= B; s++)
        x->cu[s] = (int32_t)((int64_t)T * s / B);
    for (int32_t t = 0; t < T; t++) {
        x->tokens[t] = (int32_t)dsarl_rng_below(&rng, (uint64_t)V);
        x->dlp[t] = (float)dsarl_rng_uniform(&rng) - 0.5f;
    }
    for (int32_t s = 0; s < B; s++)
        for (int32_t t = x->cu[s]; t < x->cu[s + 1]; t++)
            x->targets[t] = t + 1 < x->cu[s + 1] ? x->tokens[t + 1] : -1;
    x->b = (dsarl_token_batch){.struct_size = sizeof(dsarl_token_batch), .n_tokens = T, .n_sequences = B,
                               .tokens = x->tokens, .cu_seqlens = x->cu};
}

static void batch_free(batch *x) { free(x->tokens), free(x->targets), free(x->dlp); }

// Logits (T, V) and the gradients of sum_t dlp[t] logprob[t] (n_weights floats) of one grouping; counts the calls.
static void run(cpu_model_fixture *f, grouping g, batch *x, float *logits, float *grads, int *calls)
{
    use(f, g);
    group_calls = 0;
    ck_assert_msg(f->ops->forward_logits(f->model, &x->b, logits, &err) == 0, "%s", err.message);
    ck_assert_int_eq(f->ops->zero_grad(f->model, &err), 0);
    ck_assert_msg(f->ops->backward(f->model, &x->b, x->targets, x->dlp, NULL, &err) == 0, "%s", err.message);
    memcpy(grads, f->model->grads, sizeof(float) * (size_t)f->model->n_weights); // float32 storage on the cpu
    *calls = group_calls;
}

static double max_abs_diff(const float *a, const float *b, int64_t n, double *scale)
{
    double d = 0.0, s = 0.0;
    for (int64_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - b[i])), s = fmax(s, fabs((double)b[i]));
    *scale = s;
    return d;
}

#define TOL 1e-5 // of the largest magnitude: a few float32 ulps of the sums (see the top of the file)

// Logits and gradients of the device grouping against one host grouping; prints whether they are bitwise equal.
static void expect_same(const float *logits, const float *want_logits, int64_t n, const float *grads,
                        const float *want_grads, int64_t W, int32_t T, const char *what)
{
    double scale_l, scale_g;
    double dl = max_abs_diff(logits, want_logits, n, &scale_l), dg = max_abs_diff(grads, want_grads, W, &scale_g);
    printf("forward_backward: T %d, device grouping vs %s: logits differ by %.3g (largest %.3g), gradients by %.3g "
           "(largest %.3g)%s\n", T, what, dl, scale_l, dg, scale_g, dl == 0.0 && dg == 0.0 ? ", bitwise equal" : "");
    ck_assert(scale_l > 0.0 && scale_g > 0.0);
    ck_assert_msg(dl <= TOL * scale_l && dg <= TOL * scale_g, "device grouping vs %s: logits %.3g, gradients %.3g",
                  what, dl, dg);
}

START_TEST(forward_backward)
{
    cpu_model_fixture f;
    open_model(&f);
    int32_t V = f.model->cfg.vocab_size;
    int64_t W = f.model->n_weights;
    for (int c = 0; c < 2; c++) {
        batch x;
        make_batch(&x, c ? 65 : 23, c ? 2 : 3, 40 + (uint64_t)c, V);
        int64_t n = (int64_t)x.T * V;
        float *logits[3], *grads[3];
        int calls[3];
        for (int g = 0; g < 3; g++) {
            logits[g] = malloc(sizeof(float) * (size_t)n), grads[g] = malloc(sizeof(float) * (size_t)W);
            run(&f, (grouping)g, &x, logits[g], grads[g], &calls[g]);
        }
        // one grouping per MoE layer in each of the two passes (forward_logits, backward's forward) up to
        // GLM5_MOE_PAD_MAX tokens; none past it
        ck_assert_int_eq(calls[DEVICE_GROUPING], x.T <= GLM5_MOE_PAD_MAX ? 2 * 3 : 0);
        ck_assert_int_eq(calls[HOST_PADDED] + calls[HOST_DEFAULT], 0);
        if (x.T > GLM5_MOE_PAD_MAX) // the same host path with or without the slot
            ck_assert_mem_eq(logits[DEVICE_GROUPING], logits[HOST_PADDED], sizeof(float) * (size_t)n);
        for (int g = HOST_PADDED; g <= HOST_DEFAULT; g++)
            expect_same(logits[DEVICE_GROUPING], logits[g], n, grads[DEVICE_GROUPING], grads[g], W, x.T,
                        g == HOST_PADDED ? "host padded" : "host default");
        if (c == 0) { // activation recompute regroups each layer on the device, to the same rows
            f.model->activation_recompute = true;
            float *again = malloc(sizeof(float) * (size_t)W);
            int recomputed_calls;
            run(&f, DEVICE_GROUPING, &x, logits[HOST_DEFAULT], again, &recomputed_calls);
            f.model->activation_recompute = false;
            ck_assert_int_gt(recomputed_calls, 2 * 3);
            ck_assert_mem_eq(again, grads[DEVICE_GROUPING], sizeof(float) * (size_t)W);
            free(again);
        }
        for (int g = 0; g < 3; g++)
            free(logits[g]), free(grads[g]);
        batch_free(&x);
    }
    close_model(&f);
}
END_TEST

// Greedy generation of 3 ragged prompts; tokens and log-probs copied out (n: generated tokens in all).
static void generate(cpu_model_fixture *f, grouping g, int32_t *tokens, float *lp, int32_t *n)
{
    use(f, g);
    group_calls = 0;
    int32_t cu[4] = {0, 4, 9, 15}, ptok[15];
    dsarl_rng rng;
    dsarl_rng_init(&rng, 3, 0);
    for (int t = 0; t < 15; t++)
        ptok[t] = 1 + (int32_t)dsarl_rng_below(&rng, 259);
    dsarl_token_batch prompts = {.struct_size = sizeof prompts, .n_tokens = 15, .n_sequences = 3, .tokens = ptok,
                                 .cu_seqlens = cu};
    dsarl_sampling_params sp = {.struct_size = sizeof sp, .temperature = 0.0f, .top_p = 1.0f, .max_new_tokens = 7,
                                .seed = 1};
    dsarl_generator *gen = NULL;
    ck_assert_msg(native_create(NULL, f->ops, f->model, &gen, &err) == 0, "%s", err.message);
    dsarl_generation_result res = {.struct_size = sizeof res};
    ck_assert_msg(native_generate(gen, &prompts, &sp, &res, &err) == 0, "%s", err.message);
    *n = res.cu_lengths[3];
    ck_assert_int_eq(*n, 3 * 7);
    memcpy(tokens, res.tokens, sizeof(int32_t) * (size_t)*n);
    memcpy(lp, res.logprobs, sizeof(float) * (size_t)*n);
    native_destroy(gen);
}

START_TEST(decode)
{
    cpu_model_fixture f;
    open_model(&f);
    int32_t tok[2][21], n[2];
    float lp[2][21];
    generate(&f, DEVICE_GROUPING, tok[0], lp[0], &n[0]);
    int device_calls = group_calls;
    generate(&f, HOST_PADDED, tok[1], lp[1], &n[1]);
    // the prefill and every decode step group each MoE layer on the device
    ck_assert_msg(device_calls >= 3 * 7, "%d groupings on the device", device_calls);
    ck_assert_int_eq(group_calls, 0);
    ck_assert_int_eq(n[0], n[1]);
    ck_assert_mem_eq(tok[0], tok[1], sizeof(int32_t) * (size_t)n[0]);
    double scale, d = max_abs_diff(lp[0], lp[1], n[0], &scale);
    printf("decode: %d greedy tokens equal, log-probs differ by %.3g (largest %.3g)\n", n[0], d, scale);
    ck_assert_msg(d <= TOL * scale, "decode log-probs differ by %.3g", d);
    close_model(&f);
}
END_TEST

START_TEST(routing)
{
    cpu_model_fixture f;
    open_model(&f);
    dsarl_routing_shape sh = {.struct_size = sizeof sh};
    ck_assert_int_eq(f.ops->routing_shape(f.model, &sh, &err), 0);
    ck_assert_int_eq(sh.moe_layers, 3);
    batch x;
    make_batch(&x, 19, 2, 8, f.model->cfg.vocab_size);
    int64_t w = (int64_t)sh.moe_layers * sh.experts_per_token, n = x.T * w;
    int32_t *rec[2];
    float *lp = malloc(sizeof(float) * (size_t)x.T);
    for (int g = 0; g < 2; g++) { // recording: every layer's ids are needed on the host
        rec[g] = malloc(sizeof(int32_t) * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            rec[g][i] = -7;
        use(&f, g ? HOST_PADDED : DEVICE_GROUPING);
        group_calls = 0;
        x.b.record_experts = rec[g];
        ck_assert_msg(f.ops->forward_logprobs(f.model, &x.b, x.targets, lp, &err) == 0, "%s", err.message);
        x.b.record_experts = NULL;
        ck_assert_int_eq(group_calls, 0);
    }
    ck_assert_mem_eq(rec[0], rec[1], sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        ck_assert(rec[0][i] >= 0 && rec[0][i] < 8);
    // replay of the middle MoE layer only (other rows: not recorded): it alone goes to the host
    int32_t *replay = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        replay[i] = (i % w) / sh.experts_per_token == 1 ? rec[0][i] : -1;
    float *lp_replay = malloc(sizeof(float) * (size_t)x.T), *lp_own = malloc(sizeof(float) * (size_t)x.T);
    use(&f, DEVICE_GROUPING);
    group_calls = 0;
    x.b.replay_experts = replay;
    ck_assert_msg(f.ops->forward_logprobs(f.model, &x.b, x.targets, lp_replay, &err) == 0, "%s", err.message);
    x.b.replay_experts = NULL;
    ck_assert_int_eq(group_calls, sh.moe_layers - 1);
    // replaying the model's own choice changes nothing
    ck_assert_msg(f.ops->forward_logprobs(f.model, &x.b, x.targets, lp_own, &err) == 0, "%s", err.message);
    for (int32_t t = 0; t < x.T; t++)
        ck_assert_float_eq_tol(lp_replay[t], lp_own[t], 1e-6);
    free(rec[0]), free(rec[1]), free(replay), free(lp), free(lp_replay), free(lp_own);
    batch_free(&x);
    close_model(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("glm5_moe_group");
    TCase *tc = tcase_create("device_vs_host");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, forward_backward);
    tcase_add_test(tc, decode);
    tcase_add_test(tc, routing);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
