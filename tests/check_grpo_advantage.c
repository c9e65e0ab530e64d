/* check_grpo_advantage.c: GRPO advantages and the DAPO reward options (algorithms/grpo/grpo_advantage.c) against
 * values derived by hand in the comments, and against a naive two-pass (mean, then squared deviations)
 * formulation on fresh random rewards. DSARL_TEST_SEED fixes the seed. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grpo.h"

static uint64_t test_seed, rng_state;

static uint32_t next_u32(void) /* xorshift64*: a test-only generator */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1DULL) >> 32);
}

static void seed_rng(void)
{
    const char *env = getenv("DSARL_TEST_SEED");
    test_seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
    rng_state = test_seed * 0x9E3779B97F4A7C15ULL + 1;
}

static grpo_advantage_config adv_config(bool normalize, bool loo)
{
    return (grpo_advantage_config){.normalize_rewards = normalize, .use_leave_one_out_baseline = loo,
                                   .advantage_clip_low = -INFINITY, .advantage_clip_high = INFINITY};
}

static void assert_advantages(const grpo_advantage_config *cfg, const float *rewards, int64_t n_groups,
                              int64_t group_size, const double *want, const char *what)
{
    float got[64];
    dsarl_error err = {0};
    ck_assert_int_eq(grpo_compute_advantages(cfg, rewards, n_groups, group_size, got, &err), 0);
    for (int64_t i = 0; i < n_groups * group_size; i++)
        ck_assert_msg(fabs(got[i] - want[i]) <= 1e-6 * (1.0 + fabs(want[i])), "%s: sample %lld got %.9g want %.9g",
                      what, (long long)i, (double)got[i], want[i]);
}

/* Rewards [1, 0, 0, 1], group mean baseline b = 0.5; E[R^2] = 0.5, so the Bessel-corrected variance is
 * (0.5 - 0.25) * 4/3 = 1/3 and A = +-0.5 / (sqrt(1/3) + 1e-6) = +-0.8660239. Unnormalised: A = +-0.5. */
START_TEST(test_group_mean_by_hand)
{
    const float r[4] = {1, 0, 0, 1};
    const double a = 0.5 / (sqrt(1.0 / 3.0) + 1e-6);
    grpo_advantage_config cfg = adv_config(true, false);
    assert_advantages(&cfg, r, 1, 4, (const double[]){a, -a, -a, a}, "mean baseline, normalised");
    cfg = adv_config(false, false);
    assert_advantages(&cfg, r, 1, 4, (const double[]){0.5, -0.5, -0.5, 0.5}, "mean baseline");
    // Two groups at once are independent: [2, 0, 1] has mean 1 -> [1, -1, 0]; [3, 3, 3] has no signal -> 0.
    const float r2[6] = {2, 0, 1, 3, 3, 3};
    assert_advantages(&cfg, r2, 2, 3, (const double[]){1, -1, 0, 0, 0, 0}, "two groups");
    // Normalised, [2, 0, 1] has std 1 -> A = [1, -1, 0] / (1 + 1e-6); [3, 3, 3] has std 0 -> left at 0.
    cfg = adv_config(true, false);
    const double n1 = 1.0 / (1.0 + 1e-6);
    assert_advantages(&cfg, r2, 2, 3, (const double[]){n1, -n1, 0, 0, 0, 0}, "two groups normalised");
}
END_TEST

/* Leave-one-out on [1, 0, 0, 1]: for a 1, the others [0, 0, 1] give b = 1/3, E[R^2] = 1/3, variance
 * (1/3 - 1/9) * 3/2 = 1/3; for a 0, the others [1, 0, 1] give b = 2/3, E[R^2] = 2/3, variance (2/3 - 4/9) * 3/2 =
 * 1/3. So A = +-(2/3) / (sqrt(1/3) + 1e-6) = +-1.1547; unnormalised +-2/3.
 * A pair [1, 0]: b = [0, 1]; the std uses one other sample, Bessel's 1/0 gives NaN -> 0, so A = [1, -1] unscaled. */
START_TEST(test_leave_one_out_by_hand)
{
    const float r[4] = {1, 0, 0, 1};
    const double a = (2.0 / 3.0) / (sqrt(1.0 / 3.0) + 1e-6);
    grpo_advantage_config cfg = adv_config(true, true);
    assert_advantages(&cfg, r, 1, 4, (const double[]){a, -a, -a, a}, "leave-one-out, normalised");
    cfg = adv_config(false, true);
    assert_advantages(&cfg, r, 1, 4, (const double[]){2.0 / 3, -2.0 / 3, -2.0 / 3, 2.0 / 3}, "leave-one-out");
    cfg = adv_config(true, true);
    const float pair[2] = {1, 0};
    assert_advantages(&cfg, pair, 1, 2, (const double[]){1, -1}, "leave-one-out pair");
    double baseline[2], std[2];
    grpo_baseline_and_std(pair, NULL, 1, 2, true, baseline, std);
    ck_assert(baseline[0] == 0.0 && baseline[1] == 1.0 && std[0] == 0.0 && std[1] == 0.0);
}
END_TEST

/* Groups of one (b = R, A = 0), groups without variation (std 0: not divided, A = 0), and the clamp. */
START_TEST(test_degenerate_groups_and_clamp)
{
    const float single[3] = {1, 0, 0.5f};
    grpo_advantage_config cfg = adv_config(true, false);
    assert_advantages(&cfg, single, 3, 1, (const double[]){0, 0, 0}, "groups of one");
    const float same[4] = {1, 1, 1, 1};
    assert_advantages(&cfg, same, 1, 4, (const double[]){0, 0, 0, 0}, "identical rewards");
    cfg = adv_config(true, true);
    assert_advantages(&cfg, same, 1, 4, (const double[]){0, 0, 0, 0}, "identical rewards, leave-one-out");
    // Clamp to [-0.5, 0.25] after normalisation: +-0.866 -> 0.25 / -0.5.
    const float r[4] = {1, 0, 0, 1};
    cfg = adv_config(true, false);
    cfg.advantage_clip_low = -0.5;
    cfg.advantage_clip_high = 0.25;
    assert_advantages(&cfg, r, 1, 4, (const double[]){0.25, -0.5, -0.5, 0.25}, "clamped");
    // A non-finite reward is an error naming the sample, never a silent zero.
    float bad[4] = {1, 0, NAN, 1};
    float out[4];
    dsarl_error err = {0};
    ck_assert_int_eq(grpo_compute_advantages(&cfg, bad, 1, 4, out, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "sample 2"));
    ck_assert_int_eq(grpo_compute_advantages(&cfg, r, 0, 4, out, &err), DSARL_E_INVALID);
}
END_TEST

/* Random groups against the naive formulation: baseline = mean of the (other) rewards, std = sqrt(sum of squared
 * deviations from that baseline / (count - 1)), which equals NeMo's (E[R^2] - b^2) * n / (n - 1) form. */
START_TEST(test_random_against_two_pass)
{
    enum { G_MAX = 16, GROUPS = 6 };
    float r[GROUPS * G_MAX], got[GROUPS * G_MAX];
    double baseline[GROUPS * G_MAX], std[GROUPS * G_MAX];
    for (int rep = 0; rep < 40; rep++) {
        int64_t g = 2 + next_u32() % (G_MAX - 1);
        bool loo = next_u32() & 1, normalize = next_u32() & 1, binary = next_u32() & 1;
        if (loo && g < 3)
            g = 3;  // the naive leave-one-out std needs two others
        for (int64_t i = 0; i < GROUPS * g; i++)
            r[i] = binary ? (float)(next_u32() & 1) : (float)((next_u32() % 2001) / 1000.0 - 1.0);
        grpo_advantage_config cfg = adv_config(normalize, loo);
        dsarl_error err = {0};
        ck_assert_int_eq(grpo_compute_advantages(&cfg, r, GROUPS, g, got, &err), 0);
        grpo_baseline_and_std(r, NULL, GROUPS, g, loo, baseline, std);
        for (int64_t k = 0; k < GROUPS; k++)
            for (int64_t i = 0; i < g; i++) {
                const float *grp = r + k * g;
                double sum = 0;
                int64_t count = 0;
                for (int64_t j = 0; j < g; j++)
                    if (!loo || j != i) {
                        sum += grp[j];
                        count++;
                    }
                double b = sum / count, dev = 0;
                for (int64_t j = 0; j < g; j++)
                    if (!loo || j != i)
                        dev += (grp[j] - b) * (grp[j] - b);
                double s = sqrt(dev / (count - 1));
                double a = grp[i] - b;
                if (normalize && s > 1e-12)
                    a /= s + 1e-6;
                int64_t idx = k * g + i;
                ck_assert_msg(fabs(baseline[idx] - b) <= 1e-12, "baseline (seed %llu)", (unsigned long long)test_seed);
                ck_assert_msg(fabs(std[idx] - s) <= 1e-6, "std %.12g vs %.12g (seed %llu)", std[idx], s,
                              (unsigned long long)test_seed);
                ck_assert_msg(fabs(got[idx] - a) <= 1e-5 * (1 + fabs(a)), "advantage %.9g vs %.9g (seed %llu)",
                              (double)got[idx], a, (unsigned long long)test_seed);
            }
    }
}
END_TEST

/* std_rewards feeds only the std (DAPO: the unshaped reward decides which groups have signal). */
START_TEST(test_separate_std_rewards)
{
    const float shaped[3] = {0.5f, -0.25f, 1.0f}, raw[3] = {1, 0, 1};
    double baseline[3], std[3];
    grpo_baseline_and_std(shaped, raw, 1, 3, false, baseline, std);
    // Baseline of the shaped rewards: 1.25 / 3; std of [1, 0, 1]: mean 2/3, E[R^2] 2/3, (2/3 - 4/9) * 3/2 = 1/3.
    for (int i = 0; i < 3; i++) {
        ck_assert(fabs(baseline[i] - 1.25 / 3) < 1e-12);
        ck_assert(fabs(std[i] - sqrt(1.0 / 3)) < 1e-12);
    }
}
END_TEST

/* Reward scaling [0, 1] -> [-1, 1]: 0 -> -1, 1 -> 1, 0.25 -> -0.5; 1.5 and -0.2 are clamped first (2 counted). */
START_TEST(test_reward_scaling_by_hand)
{
    grpo_reward_scaling cfg = {.enabled = true, .source_min = 0, .source_max = 1, .target_min = -1, .target_max = 1};
    float r[5] = {0, 1, 0.25f, 1.5f, -0.2f};
    ck_assert_int_eq(grpo_scale_rewards(&cfg, r, 5), 2);
    const float want[5] = {-1, 1, -0.5f, 1, -1};
    for (int i = 0; i < 5; i++)
        ck_assert_msg(fabs(r[i] - want[i]) < 1e-7, "scaled %d: %g", i, (double)r[i]);
    cfg.enabled = false;
    float keep[2] = {3, -3};
    ck_assert_int_eq(grpo_scale_rewards(&cfg, keep, 2), 0);
    ck_assert(keep[0] == 3 && keep[1] == -3);
}
END_TEST

/* DAPO overlong shaping, max_response_length 20, buffer 4, penalty 1 -> expected length 16:
 * lengths [10, 16, 18, 20, 22] get penalties [0, 0, -0.5, -1, -1.5] (NeMo does not cap beyond the buffer).
 * stop_properly_penalty_coef 0.5 instead: truncated rewards halve, the others stay. */
START_TEST(test_reward_shaping_by_hand)
{
    grpo_reward_shaping cfg = {.enabled = true, .overlong_buffer_length = 4, .overlong_buffer_penalty = 1.0,
                               .max_response_length = 20};
    float r[5] = {1, 1, 1, 1, 1};
    const int64_t len[5] = {10, 16, 18, 20, 22};
    dsarl_error err = {0};
    ck_assert_int_eq(grpo_shape_rewards(&cfg, r, len, NULL, 5, &err), 0);
    const float want[5] = {1, 1, 0.5f, 0, -0.5f};
    for (int i = 0; i < 5; i++)
        ck_assert_msg(fabs(r[i] - want[i]) < 1e-7, "shaped %d: %g", i, (double)r[i]);
    cfg.overlong_buffer_penalty = 2.0;  // penalty scales linearly: length 18 -> -1
    float r2[1] = {1};
    ck_assert_int_eq(grpo_shape_rewards(&cfg, r2, &len[2], NULL, 1, &err), 0);
    ck_assert(fabs(r2[0] - 0.0f) < 1e-7);

    grpo_reward_shaping coef = {.enabled = true, .has_stop_properly_penalty_coef = true,
                                .stop_properly_penalty_coef = 0.5};
    float r3[4] = {1, 1, 0, 0.8f};
    const uint8_t truncated[4] = {0, 1, 0, 1};
    ck_assert_int_eq(grpo_shape_rewards(&coef, r3, NULL, truncated, 4, &err), 0);
    ck_assert(r3[0] == 1.0f && r3[1] == 0.5f && r3[2] == 0.0f && fabs(r3[3] - 0.4f) < 1e-7);
    ck_assert_int_eq(grpo_shape_rewards(&coef, r3, NULL, NULL, 4, &err), DSARL_E_INVALID);
    grpo_reward_shaping off = {.enabled = false};
    float r4[1] = {7};
    ck_assert_int_eq(grpo_shape_rewards(&off, r4, NULL, NULL, 1, &err), 0);
    ck_assert(r4[0] == 7);
}
END_TEST

/* Overlong filtering zeroes the loss multiplier of truncated responses only. */
START_TEST(test_overlong_filter)
{
    const uint8_t truncated[4] = {0, 1, 1, 0};
    float mult[4] = {1, 1, 0.5f, 1};
    ck_assert_int_eq(grpo_overlong_filter(truncated, mult, 4), 2);
    ck_assert(mult[0] == 1 && mult[1] == 0 && mult[2] == 0 && mult[3] == 1);
}
END_TEST

/* Dynamic sampling keeps groups whose rewards differ; the sampler collects them across rounds up to the target
 * and fails, as NeMo's ValueError, once a short batch has used more than max_gen_batches rounds. */
START_TEST(test_dynamic_sampling)
{
    const float r[16] = {1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0.5f, 0.5f, 0.5f, 0.25f};
    uint8_t keep[4];
    ck_assert_int_eq(grpo_groups_with_signal(r, 4, 4, keep), 2);
    ck_assert(keep[0] == 0 && keep[1] == 0 && keep[2] == 1 && keep[3] == 1);

    // Target 3 groups of 2, at most 2 rounds: round 1 gives 1, round 2 none (2 <= 2: keep going), round 3 gives
    // 2 of its 3 groups with signal and completes; the third is surplus (2 samples discarded).
    grpo_dynamic_sampler s;
    grpo_dynamic_sampler_init(&s, 3, 2, 2);
    bool complete;
    uint8_t take[4];
    dsarl_error err = {0};
    ck_assert_int_eq(grpo_dynamic_sampler_add(&s, (const float[]){1, 1, 0, 1}, 2, take, &complete, &err), 0);
    ck_assert(!complete && take[0] == 0 && take[1] == 1 && s.n_groups_taken == 1);
    ck_assert_int_eq(grpo_dynamic_sampler_add(&s, (const float[]){0, 0, 0, 0}, 2, take, &complete, &err), 0);
    ck_assert(!complete && take[0] == 0 && take[1] == 0);
    ck_assert_int_eq(grpo_dynamic_sampler_add(&s, (const float[]){1, 0, 1, 1, 0, 1, 1, 0}, 4, take, &complete, &err),
                     0);
    ck_assert(complete && take[0] == 1 && take[1] == 0 && take[2] == 1 && take[3] == 0);
    ck_assert_int_eq(s.n_groups_taken, 3);
    ck_assert_int_eq(s.n_discarded_valid_samples, 2);
    ck_assert_int_eq(s.n_gen_batches, 3);

    grpo_dynamic_sampler_init(&s, 2, 2, 1);
    ck_assert_int_eq(grpo_dynamic_sampler_add(&s, (const float[]){1, 1, 0, 0}, 2, take, &complete, &err), 0);
    ck_assert(!complete);
    ck_assert_int_eq(grpo_dynamic_sampler_add(&s, (const float[]){1, 0, 0, 0}, 2, take, &complete, &err),
                     DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "grpo.dynamic_sampling_max_gen_batches"));
}
END_TEST

/* GDPO, 2 groups of 2, components (correctness, format) = (1,1) (0,1) | (1,0) (1,1), weights [2, 1], group-mean
 * baseline. Unnormalised: A_correctness = [.5, -.5, 0, 0], A_format = [0, 0, -.5, .5]; weighted sum [1, -1, -.5, .5]
 * has mean 0 and unbiased std sqrt(2.5 / 3): A = sum / 0.9128709. With normalize_rewards each nonzero part is
 * +-0.5 / (sqrt(0.5) + 1e-6) ~ +-0.7071, the sum is a multiple of the same, and the z-score gives the same A. */
START_TEST(test_gdpo_by_hand)
{
    const float comp[8] = {1, 1, 0, 1, 1, 0, 1, 1};
    grpo_advantage_config cfg = adv_config(false, false);
    cfg.n_reward_weights = 2;
    cfg.reward_weights[0] = 2.0;
    cfg.reward_weights[1] = 1.0;
    float a[4];
    dsarl_error err = {0};
    const double sd = sqrt(2.5 / 3.0), want[4] = {1 / sd, -1 / sd, -0.5 / sd, 0.5 / sd};
    for (int normalize = 0; normalize < 2; normalize++) {
        cfg.normalize_rewards = normalize;
        ck_assert_int_eq(grpo_gdpo_advantages(&cfg, comp, 2, 2, 2, a, &err), 0);
        for (int i = 0; i < 4; i++)
            ck_assert_msg(fabs(a[i] - want[i]) < 2e-6, "gdpo (normalize %d) A[%d] = %g, want %g", normalize, i,
                          (double)a[i], want[i]);
    }
    // equal weights (null): sum [.5, -.5, -.5, .5], std sqrt(1 / 3)
    cfg.n_reward_weights = 0;
    cfg.normalize_rewards = false;
    ck_assert_int_eq(grpo_gdpo_advantages(&cfg, comp, 2, 2, 2, a, &err), 0);
    ck_assert(fabs(a[0] - 0.5 / sqrt(1.0 / 3.0)) < 2e-6 && fabs(a[1] + 0.5 / sqrt(1.0 / 3.0)) < 2e-6);
    // all components constant: every part is 0, std 0, only the mean (0) is removed
    const float flat[8] = {1, 0, 1, 0, 1, 0, 1, 0};
    ck_assert_int_eq(grpo_gdpo_advantages(&cfg, flat, 2, 2, 2, a, &err), 0);
    for (int i = 0; i < 4; i++)
        ck_assert(a[i] == 0.0f);
    // refusals: a single component, a weight count that does not match
    ck_assert_int_eq(grpo_gdpo_advantages(&cfg, comp, 1, 2, 4, a, &err), DSARL_E_INVALID);
    ck_assert(strstr(err.message, "at least 2"));
    cfg.n_reward_weights = 3;
    ck_assert_int_eq(grpo_gdpo_advantages(&cfg, comp, 2, 2, 2, a, &err), DSARL_E_INVALID);
    ck_assert(strstr(err.message, "reward_weights has 3 entries"));
}
END_TEST

/* Reinforce++, one group of 3 with rewards [1, 0, 0]; seq 0 has a prompt token (mask 0) and two response tokens,
 * seqs 1 and 2 one each. minus_baseline: a = [2/3, -1/3, -1/3]; token values [2/3, 2/3 | -1/3 | -1/3], mean 1/6,
 * deviations +-1/2, var 1/4: A = [1, 1, -1, -1] on the response tokens. Without the baseline the same (a constant
 * shift). With the KL in the reward (coef 0.5, k3, logr = ln 2 on seq 0's first response token: k = 1 - ln 2) that
 * token's value drops by 0.5 (1 - ln 2) before the normalisation, computed here in two passes. */
START_TEST(test_reinforce_pp_by_hand)
{
    const float rewards[3] = {1, 0, 0}, sample[3] = {1, 1, 1};
    const int32_t cu[4] = {0, 3, 4, 5};
    const float mask[5] = {0, 1, 1, 1, 1};
    float lp[5] = {-9, -1, -2, -0.5f, -3}, ref[5] = {-9, -1, -2, -0.5f, -3};
    ref[1] = (float)(-1.0 + log(2.0));
    grpo_advantage_config cfg = adv_config(false, false);
    cfg.minus_baseline = true;
    float a[5];
    dsarl_error err = {0};
    for (int base = 0; base < 2; base++) {
        cfg.minus_baseline = base;
        ck_assert_int_eq(grpo_reinforce_pp_advantages(&cfg, rewards, 1, 3, cu, mask, sample, 0.0, GRPO_KL_K3, NULL,
                                                      NULL, a, &err), 0);
        const double want[4] = {1, 1, -1, -1};
        for (int i = 0; i < 4; i++)
            ck_assert_msg(fabs(a[i + 1] - want[i]) < 1e-5, "r++ (minus_baseline %d) A[%d] = %g", base, i + 1,
                          (double)a[i + 1]);
    }
    cfg.minus_baseline = true;
    ck_assert_int_eq(grpo_reinforce_pp_advantages(&cfg, rewards, 1, 3, cu, mask, sample, 0.5, GRPO_KL_K3, lp, ref, a,
                                                  &err), 0);
    double v[4] = {2.0 / 3 - 0.5 * (1.0 - log(2.0)), 2.0 / 3, -1.0 / 3, -1.0 / 3}, mean = 0, var = 0;
    for (int i = 0; i < 4; i++)
        mean += v[i] / 4;
    for (int i = 0; i < 4; i++)
        var += (v[i] - mean) * (v[i] - mean) / 4;
    for (int i = 0; i < 4; i++)
        ck_assert_msg(fabs(a[i + 1] - (v[i] - mean) / sqrt(var)) < 1e-5, "r++ kl A[%d] = %g, want %g", i + 1,
                      (double)a[i + 1], (v[i] - mean) / sqrt(var));
    // every sample masked: refused
    const float none[3] = {0, 0, 0};
    ck_assert_int_eq(grpo_reinforce_pp_advantages(&cfg, rewards, 1, 3, cu, mask, none, 0.0, GRPO_KL_K3, NULL, NULL, a,
                                                  &err), DSARL_E_INVALID);
}
END_TEST

/* Sequence masking by the train/inference error: seq 0's tokens differ by 0.1 and 0.3 (error (e^.1 + e^.3) / 2 =
 * 1.2275), seq 1's not at all (1.0), seq 2 has no valid token. Threshold 1.2 drops seq 0, a correct one. */
START_TEST(test_seq_logprob_error_mask_by_hand)
{
    const int32_t cu[4] = {0, 3, 5, 6};
    const float mask[6] = {0, 1, 1, 1, 1, 0};
    const float old[6] = {-1, -1, -2, -0.5f, -0.7f, -1}, gen[6] = {-5, -1.1f, -1.7f, -0.5f, -0.7f, -3};
    const float rewards[3] = {1, 0, 1};
    const double e0 = (exp(fabs(-1.1 - -1.0)) + exp(fabs(-1.7 - -2.0))) / 2;
    float sample[3] = {1, 1, 1};
    grpo_seq_error_stats st;
    grpo_seq_logprob_error_mask(NAN, 3, cu, mask, old, gen, rewards, sample, &st);
    ck_assert(sample[0] == 1 && sample[1] == 1 && st.num_masked == 0);
    ck_assert_msg(fabs(st.max - e0) < 1e-5 && fabs(st.min - 1.0) < 1e-6 && fabs(st.mean - (e0 + 1) / 2) < 1e-5,
                  "max %g min %g mean %g, want %g 1 %g", st.max, st.min, st.mean, e0, (e0 + 1) / 2);
    grpo_seq_logprob_error_mask(1.2, 3, cu, mask, old, gen, rewards, sample, &st);
    ck_assert(sample[0] == 0 && sample[1] == 1 && sample[2] == 1 && st.num_masked == 1);
    ck_assert(st.masked_correct_pct == 1.0);
    ck_assert(fabs(st.max_after - 1.0) < 1e-6 && fabs(st.mean_after - 1.0) < 1e-6);
    ck_assert(fabs(st.max - e0) < 1e-5); // the before-mask statistics still see seq 0
}
END_TEST

START_TEST(test_malformed_thinking)
{
    const char *off = "User: What is 1+2?\nAssistant:", *on = "User: What is 1+2?\nAssistant:<think>";
    ck_assert(!grpo_malformed_thinking(off, " Answer: 3"));
    ck_assert(grpo_malformed_thinking(off, "<think>hm</think> Answer: 3"));
    ck_assert(grpo_malformed_thinking(off, " Answer: 3</think>"));
    ck_assert(!grpo_malformed_thinking(on, "1 plus 2</think> Answer: 3"));
    ck_assert(grpo_malformed_thinking(on, " Answer: 3"));
    ck_assert(grpo_malformed_thinking(on, "a</think>b</think>"));
    ck_assert(grpo_malformed_thinking(on, "<think>a</think>"));
    ck_assert(grpo_malformed_thinking("x</think>", "Answer: 3"));
}
END_TEST

/* Message-level penalties: a textual tool call wins over malformed thinking; the value is clipped; per-token
 * advantages of a penalised response all take it; untouched responses keep theirs. */
START_TEST(test_message_penalties)
{
    ck_assert(grpo_invalid_tool_call("x <tool_call>{\"name\": \"calc\"}</tool_call>"));
    ck_assert(grpo_invalid_tool_call("<function_call>"));
    ck_assert(!grpo_invalid_tool_call(" Answer: 3 (no tool_call here)"));
    const char *prompts[4] = {"Q:", "Q:", "Q:", "Q:"};
    const char *responses[4] = {" Answer: 3", "<tool_call>", "<think>x</think> Answer: 3", "<tool_call><think>"};
    const int32_t cu[5] = {0, 2, 3, 5, 6};
    float adv[4] = {0.5f, 0.25f, -0.5f, 1.0f}, tadv[6] = {1, 2, 3, 4, 5, 6};
    grpo_advantage_config cfg = adv_config(true, false);
    cfg.advantage_clip_low = -3.0;
    grpo_penalty_counts q;
    grpo_apply_message_penalties(&cfg, -5.0, -1.0, 4, prompts, responses, cu, adv, tadv, &q);
    ck_assert(q.invalid_tool_calls == 2 && q.malformed_thinking == 1 && q.assistant_messages == 4);
    ck_assert(adv[0] == 0.5f && adv[1] == -3.0f && adv[2] == -1.0f && adv[3] == -3.0f);
    ck_assert(tadv[0] == 1 && tadv[1] == 2 && tadv[2] == -3.0f && tadv[3] == -1.0f && tadv[4] == -1.0f &&
              tadv[5] == -3.0f);
    // either penalty off (NaN): those responses keep their advantage
    float adv2[4] = {0.5f, 0.25f, -0.5f, 1.0f};
    grpo_apply_message_penalties(&cfg, NAN, -1.0, 4, prompts, responses, NULL, adv2, NULL, &q);
    ck_assert(q.invalid_tool_calls == 0 && q.malformed_thinking == 2 && adv2[1] == 0.25f && adv2[3] == -1.0f);
}
END_TEST

static Suite *grpo_advantage_suite(void)
{
    Suite *s = suite_create("grpo_advantage");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_group_mean_by_hand);
    tcase_add_test(tc, test_leave_one_out_by_hand);
    tcase_add_test(tc, test_degenerate_groups_and_clamp);
    tcase_add_test(tc, test_random_against_two_pass);
    tcase_add_test(tc, test_separate_std_rewards);
    tcase_add_test(tc, test_reward_scaling_by_hand);
    tcase_add_test(tc, test_reward_shaping_by_hand);
    tcase_add_test(tc, test_overlong_filter);
    tcase_add_test(tc, test_dynamic_sampling);
    tcase_add_test(tc, test_gdpo_by_hand);
    tcase_add_test(tc, test_reinforce_pp_by_hand);
    tcase_add_test(tc, test_seq_logprob_error_mask_by_hand);
    tcase_add_test(tc, test_malformed_thinking);
    tcase_add_test(tc, test_message_penalties);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    seed_rng();
    printf("check_grpo_advantage: seed %llu (set DSARL_TEST_SEED to repeat)\n", (unsigned long long)test_seed);
    SRunner *sr = srunner_create(grpo_advantage_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
