/* check_distill_loss.c: DistillationLossFn (algorithms/distillation/distill_loss.c) against values derived by hand
 * in the comments, its gradient against central finite differences of the loss on random inputs, the teacher's
 * top-k selection (ties to the lower index) against a sort, and the refused combinations. DSARL_TEST_SEED fixes
 * the seed. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "distill.h"

static uint64_t test_seed, rng_state;

static uint32_t next_u32(void) /* xorshift64*: a test-only generator */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1DULL) >> 32);
}

static double uniform(double lo, double hi)
{
    return lo + (hi - lo) * (next_u32() / 4294967296.0);
}

static const distill_loss_config forward_cfg = {.kl_type = DISTILL_KL_FORWARD, .mixed_kl_weight = 0.5};
static const distill_loss_config reverse_cfg = {.kl_type = DISTILL_KL_REVERSE, .mixed_kl_weight = 0.5};

#define NEAR(x, want, tol) ck_assert_msg(fabs((double)(x) - (want)) <= (tol), "%s = %.9g, want %.9g", #x, \
                                         (double)(x), (double)(want))

/* One position, k = 2. Teacher logits (ln 3, 0): pt = (3/4, 1/4). Student full-vocabulary log-probs (ln 0.2,
 * ln 0.2), renormalised over the two tokens: ps = (1/2, 1/2).
 *   forward = 3/4 ln(3/2) + 1/4 ln(1/2)            reverse = 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3)
 * Gradients through the renormalisation (d/dlp_i = g_i - ps_i sum g):
 *   forward: g = -pt, sum g = -1                    -> (-3/4 + 1/2, -1/4 + 1/2) = (-1/4, 1/4)
 *   reverse: g_j = ps_j (ls_j - lt_j + 1)           -> (1/2 ln(2/3) - 1/4 ln(4/3), 1/2 ln 2 - 1/4 ln(4/3)) */
START_TEST(test_renormalised_by_hand)
{
    float lp[2] = {logf(0.2f), logf(0.2f)}, tl[2] = {logf(3.0f), 0.0f}, mask[1] = {1.0f}, grad[2];
    distill_loss_inputs in = {.n_positions = 1, .k = 2, .lp_student = lp, .teacher_logits = tl, .mask = mask,
                              .global_valid_toks = 1.0};
    const double fwd = 0.75 * log(1.5) + 0.25 * log(0.5), rev = 0.5 * log(4.0 / 3.0);
    double loss;
    distill_loss_metrics m;
    dsarl_error err = {0};
    ck_assert_int_eq(distill_loss(&forward_cfg, &in, &loss, grad, &m, &err), 0);
    NEAR(loss, fwd, 1e-6);
    NEAR(m.forward_kl, fwd, 1e-6);
    NEAR(m.reverse_kl, rev, 1e-6);
    NEAR(m.student_topk_mass, 0.4, 1e-6);
    NEAR(grad[0], -0.25, 1e-6);
    NEAR(grad[1], 0.25, 1e-6);
    ck_assert_int_eq(distill_loss(&reverse_cfg, &in, &loss, grad, &m, &err), 0);
    NEAR(loss, rev, 1e-6);
    NEAR(grad[0], 0.5 * log(2.0 / 3.0) - 0.25 * log(4.0 / 3.0), 1e-6);
    NEAR(grad[1], 0.5 * log(2.0) - 0.25 * log(4.0 / 3.0), 1e-6);
    distill_loss_config mixed = {.kl_type = DISTILL_KL_MIXED, .mixed_kl_weight = 0.25};
    ck_assert_int_eq(distill_loss(&mixed, &in, &loss, grad, &m, &err), 0);
    NEAR(loss, 0.25 * fwd + 0.75 * rev, 1e-6);
    NEAR(grad[0], 0.25 * -0.25 + 0.75 * (0.5 * log(2.0 / 3.0) - 0.25 * log(4.0 / 3.0)), 1e-6);
}
END_TEST

/* zero_outside_topk with the forward KL: the student's log-probs are the full-vocabulary ones, not renormalised.
 * Student (ln 1/2, ln 1/4), teacher pt = (3/4, 1/4): forward = 3/4 ln(3/4 / 1/2) + 1/4 ln(1/4 / 1/4) = 3/4 ln 1.5,
 * gradient -pt = (-3/4, -1/4). Two positions, the second masked, global_valid_toks 2: half the loss, half the
 * gradient, and zero gradient on the masked one. */
START_TEST(test_zero_outside_topk_and_mask_by_hand)
{
    float lp[4] = {logf(0.5f), logf(0.25f), -1.0f, -2.0f}, tl[4] = {logf(3.0f), 0.0f, 5.0f, 0.0f};
    float mask[2] = {1.0f, 0.0f}, grad[4];
    distill_loss_inputs in = {.n_positions = 2, .k = 2, .lp_student = lp, .teacher_logits = tl, .mask = mask,
                              .global_valid_toks = 2.0};
    distill_loss_config cfg = forward_cfg;
    cfg.zero_outside_topk = true;
    double loss;
    dsarl_error err = {0};
    ck_assert_int_eq(distill_loss(&cfg, &in, &loss, grad, NULL, &err), 0);
    NEAR(loss, 0.5 * 0.75 * log(1.5), 1e-6);
    NEAR(grad[0], -0.375, 1e-6);
    NEAR(grad[1], -0.125, 1e-6);
    ck_assert(grad[2] == 0.0f && grad[3] == 0.0f);
    // the tail entropy term of reverse / mixed KL needs the whole vocabulary: refused, naming the key
    cfg.kl_type = DISTILL_KL_REVERSE;
    ck_assert_int_eq(distill_loss(&cfg, &in, &loss, grad, NULL, &err), DSARL_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.message, "zero_outside_topk"));
}
END_TEST

/* The student's log-probs of k distinct tokens out of V, from random logits (what the model's pass returns). */
static void random_case(int64_t T, int32_t k, int32_t V, float *lp, float *tl, float *mask)
{
    for (int64_t t = 0; t < T; t++) {
        double z[64], m = -INFINITY, s = 0.0;
        for (int32_t v = 0; v < V; v++)
            m = fmax(m, z[v] = uniform(-3.0, 3.0));
        for (int32_t v = 0; v < V; v++)
            s += exp(z[v] - m);
        int32_t perm[64];
        for (int32_t v = 0; v < V; v++)
            perm[v] = v;
        for (int32_t j = 0; j < k; j++) { // the first k of a random permutation
            int32_t r = j + (int32_t)(next_u32() % (uint32_t)(V - j)), x = perm[j];
            perm[j] = perm[r], perm[r] = x;
            lp[t * k + j] = (float)(z[perm[j]] - m - log(s));
            tl[t * k + j] = (float)uniform(-4.0, 4.0);
        }
        mask[t] = next_u32() % 4 ? 1.0f : 0.0f;
    }
}

/* The gradient is the derivative of the loss: central differences on every log-prob, every KL type. */
START_TEST(test_gradient_finite_differences)
{
    enum { T = 6, K = 5, V = 12 };
    const distill_loss_config cfgs[] = {
        {.kl_type = DISTILL_KL_FORWARD, .mixed_kl_weight = 0.5},
        {.kl_type = DISTILL_KL_REVERSE, .mixed_kl_weight = 0.5},
        {.kl_type = DISTILL_KL_MIXED, .mixed_kl_weight = 0.3},
        {.kl_type = DISTILL_KL_FORWARD, .mixed_kl_weight = 0.5, .zero_outside_topk = true},
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        float lp[T * K], tl[T * K], mask[T], grad[T * K];
        random_case(T, K, V, lp, tl, mask);
        double valid = 0.0;
        for (int t = 0; t < T; t++)
            valid += mask[t];
        distill_loss_inputs in = {.n_positions = T, .k = K, .lp_student = lp, .teacher_logits = tl, .mask = mask,
                                  .global_valid_toks = valid + 1.0};
        double loss, up, down;
        dsarl_error err = {0};
        ck_assert_int_eq(distill_loss(&cfgs[c], &in, &loss, grad, NULL, &err), 0);
        ck_assert(loss >= -1e-9); // a KL between two distributions over the same k tokens
        for (int i = 0; i < T * K; i++) {
            const float h = 2e-3f, x = lp[i];
            lp[i] = x + h;
            ck_assert_int_eq(distill_loss(&cfgs[c], &in, &up, NULL, NULL, &err), 0);
            lp[i] = x - h;
            ck_assert_int_eq(distill_loss(&cfgs[c], &in, &down, NULL, NULL, &err), 0);
            lp[i] = x;
            double fd = (up - down) / (double)((x + h) - (x - h));
            ck_assert_msg(fabs(fd - grad[i]) <= 2e-4 + 1e-3 * fabs(fd), "case %zu, entry %d: grad %.7g, fd %.7g",
                          c, i, grad[i], fd);
        }
    }
}
END_TEST

/* Top-k against a stable selection sort on random logits with many ties (values from a small set). */
START_TEST(test_topk_ties_lower_index)
{
    float x[5] = {1.0f, 3.0f, 3.0f, 0.0f, 3.0f}, val[4];
    int32_t idx[4];
    distill_topk(x, 5, 2, idx, val);
    ck_assert(idx[0] == 1 && idx[1] == 2 && val[0] == 3.0f && val[1] == 3.0f);
    distill_topk(x, 5, 4, idx, val);
    ck_assert(idx[0] == 1 && idx[1] == 2 && idx[2] == 4 && idx[3] == 0);
    for (int rep = 0; rep < 50; rep++) {
        enum { V = 40 };
        float z[V], got_v[V];
        int32_t got[V], want[V];
        uint8_t used[V] = {0};
        for (int v = 0; v < V; v++)
            z[v] = (float)(next_u32() % 7);
        int32_t k = 1 + (int32_t)(next_u32() % V);
        distill_topk(z, V, k, got, got_v);
        for (int32_t j = 0; j < k; j++) { // the largest unused value, first index among equals
            int32_t best = -1;
            for (int v = 0; v < V; v++)
                if (!used[v] && (best < 0 || z[v] > z[best]))
                    best = v;
            used[best] = 1;
            want[j] = best;
        }
        for (int32_t j = 0; j < k; j++)
            ck_assert_msg(got[j] == want[j] && got_v[j] == z[want[j]], "k %d, rank %d: %d, want %d", k, j, got[j],
                          want[j]);
    }
}
END_TEST

static Suite *distill_loss_suite(void)
{
    Suite *s = suite_create("distill_loss");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_renormalised_by_hand);
    tcase_add_test(tc, test_zero_outside_topk_and_mask_by_hand);
    tcase_add_test(tc, test_gradient_finite_differences);
    tcase_add_test(tc, test_topk_ties_lower_index);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    const char *env = getenv("DSARL_TEST_SEED");
    test_seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    rng_state = test_seed * 0x9E3779B97F4A7C15ULL + 1;
    printf("check_distill_loss: seed %llu (set DSARL_TEST_SEED to repeat)\n", (unsigned long long)test_seed);
    SRunner *sr = srunner_create(distill_loss_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
