/* check_grpo_reward_kl.c: grpo_reward_kl_mean (algorithms/grpo/grpo_advantage.c), the value behind the
 * train/kl_in_reward metric of Reinforce++ with use_kl_in_reward: the masked token mean of NeMo's clamped KL
 * estimator, against values derived by hand in the comments, and against Reinforce++'s own advantages, whose
 * per-token KL share it must reproduce. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "grpo.h"

/* Two sequences. Sequence 0 trains tokens 0 and 1 (token 2 is masked out); sequence 1 is sample-masked.
 *   token 0: lp -1, lp_ref -1.5: logr = -0.5; k1 = 0.5, k2 = 0.125, k3 = exp(-0.5) - 1 + 0.5 = 0.1065306597
 *   token 1: lp 0, lp_ref -30: logr clamped to -20; k1 = 20, k2 = 200, k3 = 19 + exp(-20): each clamped to 10
 * so the means are k1 (0.5 + 10) / 2 = 5.25, k2 (0.125 + 10) / 2 = 5.0625, k3 (0.1065306597 + 10) / 2. */
START_TEST(test_hand_values)
{
    const int32_t cu[] = {0, 3, 4};
    const float token_mask[] = {1, 1, 0, 1};
    const float sample_mask[] = {1, 0};
    const float lp[] = {-1.0f, 0.0f, -2.0f, -1.0f};
    const float lp_ref[] = {-1.5f, -30.0f, -7.0f, -9.0f};
    ck_assert_double_eq_tol(grpo_reward_kl_mean(GRPO_KL_K1, 2, cu, token_mask, sample_mask, lp, lp_ref), 5.25, 1e-7);
    ck_assert_double_eq_tol(grpo_reward_kl_mean(GRPO_KL_K2, 2, cu, token_mask, sample_mask, lp, lp_ref), 5.0625,
                            1e-7);
    ck_assert_double_eq_tol(grpo_reward_kl_mean(GRPO_KL_K3, 2, cu, token_mask, sample_mask, lp, lp_ref),
                            (0.1065306597 + 10.0) / 2.0, 1e-7);
    const float none[] = {0, 0};
    ck_assert_double_eq(grpo_reward_kl_mean(GRPO_KL_K3, 2, cu, token_mask, none, lp, lp_ref), 0.0);
}
END_TEST

/* With every reward equal and minus_baseline, a Reinforce++ token advantage before normalisation is
 * -kl_coef * k_t, so the normalised one is (mean_k - k_t) / std_k: the mean reported must be the one that makes
 * the advantages of the trained tokens sum to zero after adding it back, i.e. mean_t(k_t) from the same k_t. */
START_TEST(test_matches_reinforce_pp)
{
    srand((unsigned)time(NULL));
    enum { S = 6, L = 7, T = S * L };
    int32_t cu[S + 1];
    float token_mask[T], sample_mask[S], lp[T], lp_ref[T], adv[T], rewards[S];
    for (int s = 0; s <= S; s++)
        cu[s] = s * L;
    for (int s = 0; s < S; s++)
        sample_mask[s] = s == 2 ? 0.0f : 1.0f, rewards[s] = 0.5f;
    for (int t = 0; t < T; t++) {
        token_mask[t] = rand() % 4 ? 1.0f : 0.0f;
        lp[t] = -(float)(rand() % 1000) / 250.0f;
        lp_ref[t] = lp[t] + ((float)(rand() % 1000) - 500.0f) / 400.0f;
    }
    token_mask[0] = token_mask[1] = 1.0f; /* two trained tokens at least, with different KLs below */
    lp[0] = -1.0f, lp_ref[0] = -1.5f, lp[1] = -1.0f, lp_ref[1] = -0.2f;
    grpo_advantage_config cfg = {.minus_baseline = true, .advantage_clip_low = -INFINITY,
                                 .advantage_clip_high = INFINITY};
    const double coef = 0.3;
    dsarl_error err = {0};
    ck_assert_int_eq(grpo_reinforce_pp_advantages(&cfg, rewards, 2, 3, cu, token_mask, sample_mask, coef, GRPO_KL_K3,
                                                  lp, lp_ref, adv, &err), 0);
    double mean_k = grpo_reward_kl_mean(GRPO_KL_K3, S, cu, token_mask, sample_mask, lp, lp_ref);
    /* adv_t = (mean_k - k_t) coef / (coef std_k): two trained tokens give std_k from their k's and adv's */
    double k0 = exp(-0.5) - 1.0 + 0.5, k1 = exp(0.8) - 1.0 - 0.8;
    double std_k = (k1 - k0) / (adv[0] - adv[1]);
    ck_assert_double_eq_tol(adv[0] * std_k, mean_k - k0, 1e-4);
    ck_assert_double_eq_tol(adv[1] * std_k, mean_k - k1, 1e-4);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("grpo_reward_kl");
    TCase *tc = tcase_create("mean");
    tcase_add_test(tc, test_hand_values);
    tcase_add_loop_test(tc, test_matches_reinforce_pp, 0, 4);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
