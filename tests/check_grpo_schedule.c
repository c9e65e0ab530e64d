/* check_grpo_schedule.c: Megatron's learning-rate schedule and gradient-clipping factor (grpo_schedule.c) against
 * values derived by hand. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grpo.h"

static void assert_lr(const grpo_lr_schedule *s, int64_t step, double want)
{
    double got = grpo_lr_at(s, step);
    ck_assert_msg(fabs(got - want) <= 1e-12 + 1e-9 * want, "lr at step %lld: got %.12g want %.12g", (long long)step,
                  got, want);
}

/* lr 1e-3, min 1e-4, warm-up from 0 over 10 steps, decay to step 110:
 *   warm-up: step 0 -> 0, 5 -> 5e-4, 10 -> 1e-3 (the last warm-up step reaches the peak)
 *   linear: step 60 is half way ((60 - 10) / 100) -> 1e-4 + 0.5 * 9e-4 = 5.5e-4; step 110 -> 1e-4; after -> 1e-4
 *   cosine: step 60 -> coeff 0.5 (cos(pi/2) + 1) = 0.5 -> 5.5e-4; step 35 (a quarter) -> coeff
 *           0.5 (cos(pi/4) + 1) = 0.8535533906 -> 1e-4 + 0.8535533906 * 9e-4 = 8.682e-4
 *   constant: the peak after warm-up, forever. */
START_TEST(test_lr_schedule_by_hand)
{
    grpo_lr_schedule s = {.lr = 1e-3, .min_lr = 1e-4, .warmup_init = 0.0, .warmup_iters = 10, .decay_iters = 110,
                          .decay_style = GRPO_LR_LINEAR};
    assert_lr(&s, 0, 0.0);
    assert_lr(&s, 5, 5e-4);
    assert_lr(&s, 10, 1e-3);
    assert_lr(&s, 60, 5.5e-4);
    assert_lr(&s, 110, 1e-4);
    assert_lr(&s, 500, 1e-4);
    s.decay_style = GRPO_LR_COSINE;
    assert_lr(&s, 60, 5.5e-4);
    assert_lr(&s, 35, 1e-4 + 0.8535533905932737 * 9e-4);
    assert_lr(&s, 110, 1e-4);
    assert_lr(&s, 111, 1e-4);
    s.decay_style = GRPO_LR_CONSTANT;
    assert_lr(&s, 11, 1e-3);
    assert_lr(&s, 100000, 1e-3);
    // Warm-up from lr_warmup_init (the tiny recipes: 1e-4 -> 1e-3 over 2 steps): 1e-4, 5.5e-4, 1e-3.
    grpo_lr_schedule tiny = {.lr = 1e-3, .min_lr = 1e-3, .warmup_init = 1e-4, .warmup_iters = 2, .decay_iters = 1000,
                             .decay_style = GRPO_LR_CONSTANT};
    assert_lr(&tiny, 0, 1e-4);
    assert_lr(&tiny, 1, 5.5e-4);
    assert_lr(&tiny, 2, 1e-3);
    // No warm-up: linear decay starts at the peak.
    grpo_lr_schedule nowarm = {.lr = 2.0, .min_lr = 0.0, .warmup_iters = 0, .decay_iters = 4,
                               .decay_style = GRPO_LR_LINEAR};
    assert_lr(&nowarm, 0, 2.0);
    assert_lr(&nowarm, 1, 1.5);
    assert_lr(&nowarm, 4, 0.0);
}
END_TEST

/* clip factor = min(1, max_norm / (norm + 1e-6)): norm 2, max 1 -> 1 / 2.000001; norm 0.5 -> 1; max 0 -> off. */
START_TEST(test_grad_clip_by_hand)
{
    double scale;
    dsarl_error err = {0};
    ck_assert_int_eq(grpo_grad_clip_scale(2.0, 1.0, &scale, &err), 0);
    ck_assert(fabs(scale - 1.0 / 2.000001) < 1e-15);
    ck_assert_int_eq(grpo_grad_clip_scale(0.5, 1.0, &scale, &err), 0);
    ck_assert(scale == 1.0);
    ck_assert_int_eq(grpo_grad_clip_scale(1e9, 0.0, &scale, &err), 0);
    ck_assert(scale == 1.0);
    ck_assert_int_eq(grpo_grad_clip_scale(NAN, 1.0, &scale, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "gradient norm"));
    ck_assert_int_eq(grpo_grad_clip_scale(INFINITY, 1.0, &scale, &err), DSARL_E_INVALID);
}
END_TEST

static Suite *grpo_schedule_suite(void)
{
    Suite *s = suite_create("grpo_schedule");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_lr_schedule_by_hand);
    tcase_add_test(tc, test_grad_clip_by_hand);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(grpo_schedule_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
