/* grpo_advantage.c: rewards -> advantages (reference section 3.2) and the DAPO reward options (section 3.5):
 * reward scaling, overlong reward shaping, overlong filtering, dynamic sampling.
 *
 * Statistics are accumulated in double: a group of 16 float rewards in {0, 1} gives exactly the values NeMo's
 * float32 torch code gives up to rounding, and the std == 0 test stays exact for identical rewards. */
#include "grpo.h"

#include <math.h>
#include <stddef.h>

/* Baseline and std of one sample from its group's sums (sum of rewards for the baseline; sum and sum of squares
 * of the std rewards): over the whole group, or over the others for leave-one-out. group_size >= 2. */
static void sample_stats(double sum, double sum_s, double sum_sq, double r, double r_s, int64_t group_size,
                         bool leave_one_out, double *baseline, double *std)
{
    // num_valid counts the samples each baseline averages over: all of them, or all but the sample itself.
    double num_valid = (double)group_size - (leave_one_out ? 1.0 : 0.0);
    double own = leave_one_out ? r : 0.0, own_s = leave_one_out ? r_s : 0.0;
    double own_sq = leave_one_out ? r_s * r_s : 0.0;
    *baseline = (sum - own) / num_valid;
    double mean_s = (sum_s - own_s) / num_valid;
    double mean_sq = (sum_sq - own_sq) / num_valid;
    // Bessel's factor num_valid / (num_valid - 1) is inf for leave-one-out pairs: 0 * inf = NaN -> 0; a variance
    // that rounds negative gives sqrt(<0) = NaN -> 0; both as torch's nan_to_num(0).
    double s = sqrt((mean_sq - mean_s * mean_s) * (num_valid / (num_valid - 1.0)));
    *std = isnan(s) ? 0.0 : s;
}

void grpo_baseline_and_std(const float *rewards, const float *std_rewards, int64_t n_groups, int64_t group_size,
                           bool leave_one_out, double *baseline, double *std)
{
    if (!std_rewards)
        std_rewards = rewards;
    for (int64_t g = 0; g < n_groups; g++) {
        const float *r = rewards + g * group_size;       // (G)
        const float *rs = std_rewards + g * group_size;  // (G)
        double *b = baseline + g * group_size, *sd = std + g * group_size;
        if (group_size <= 1) {
            // NeMo's "no valid responses" case: baseline = reward so the advantage is 0.
            for (int64_t i = 0; i < group_size; i++) {
                b[i] = r[i];
                sd[i] = 0.0;
            }
            continue;
        }
        double sum = 0.0, sum_s = 0.0, sum_sq = 0.0;
        for (int64_t i = 0; i < group_size; i++) {
            sum += r[i];
            sum_s += rs[i];
            sum_sq += (double)rs[i] * rs[i];
        }
        for (int64_t i = 0; i < group_size; i++)
            sample_stats(sum, sum_s, sum_sq, r[i], rs[i], group_size, leave_one_out, &b[i], &sd[i]);
    }
}

int grpo_compute_advantages(const grpo_advantage_config *cfg, const float *rewards, int64_t n_groups,
                            int64_t group_size, float *advantages, dsarl_error *err)
{
    if (!cfg || !rewards || !advantages)
        return DSARL_FAIL(err, DSARL_E_INVALID, "grpo_compute_advantages: cfg, rewards and advantages must be non-NULL");
    if (n_groups < 1 || group_size < 1)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "grpo_compute_advantages: n_groups (%lld) and group_size (%lld) must both be >= 1",
                          (long long)n_groups, (long long)group_size);
    for (int64_t i = 0; i < n_groups * group_size; i++)
        if (!isfinite(rewards[i]))
            return DSARL_FAIL(err, DSARL_E_INVALID,
                              "reward of sample %lld (group %lld) is %g; a reward must be finite (a verifier failure "
                              "must be reported, not passed on as a reward)",
                              (long long)i, (long long)(i / group_size), (double)rewards[i]);
    for (int64_t g = 0; g < n_groups; g++) {
        const float *r = rewards + g * group_size;  // (G)
        double sum = 0.0, sum_sq = 0.0;
        for (int64_t i = 0; i < group_size; i++) {
            sum += r[i];
            sum_sq += (double)r[i] * r[i];
        }
        for (int64_t i = 0; i < group_size; i++) {
            double b = r[i], s = 0.0;  // a group of one: A = 0
            if (group_size > 1)
                sample_stats(sum, sum, sum_sq, r[i], r[i], group_size, cfg->use_leave_one_out_baseline, &b, &s);
            double a = r[i] - b;
            // A group without variation is left unnormalised (its advantage is 0 anyway, up to rounding).
            if (cfg->normalize_rewards && s > 0.0)
                a /= s + 1e-6;
            if (a < cfg->advantage_clip_low)
                a = cfg->advantage_clip_low;
            if (a > cfg->advantage_clip_high)
                a = cfg->advantage_clip_high;
            advantages[g * group_size + i] = (float)a;
        }
    }
    return DSARL_OK;
}

int64_t grpo_scale_rewards(const grpo_reward_scaling *cfg, float *rewards, int64_t n)
{
    if (!cfg->enabled)
        return 0;
    int64_t clamped = 0;
    for (int64_t i = 0; i < n; i++) {
        double r = rewards[i];
        if (r < cfg->source_min || r > cfg->source_max) {
            clamped++;
            r = r < cfg->source_min ? cfg->source_min : cfg->source_max;
        }
        rewards[i] = (float)(cfg->target_min + (r - cfg->source_min) / (cfg->source_max - cfg->source_min) *
                                                   (cfg->target_max - cfg->target_min));
    }
    return clamped;
}

int grpo_shape_rewards(const grpo_reward_shaping *cfg, float *rewards, const int64_t *response_lengths,
                       const uint8_t *truncated, int64_t n, dsarl_error *err)
{
    if (!cfg->enabled)
        return DSARL_OK;
    if (cfg->has_stop_properly_penalty_coef) {
        // The alternative to DAPO's length penalty: scale the reward of responses that never stopped.
        if (!truncated)
            return DSARL_FAIL(err, DSARL_E_INVALID,
                              "grpo_shape_rewards: stop_properly_penalty_coef needs the truncated flags (NULL given)");
        for (int64_t i = 0; i < n; i++)
            if (truncated[i])
                rewards[i] = (float)(rewards[i] * cfg->stop_properly_penalty_coef);
        return DSARL_OK;
    }
    if (!response_lengths)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "grpo_shape_rewards: DAPO overlong shaping needs the response lengths (NULL given)");
    if (cfg->overlong_buffer_length <= 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "grpo_shape_rewards: overlong_buffer_length must be > 0, got %lld",
                          (long long)cfg->overlong_buffer_length);
    double expected = (double)(cfg->max_response_length - cfg->overlong_buffer_length);
    for (int64_t i = 0; i < n; i++) {
        double exceed = (double)response_lengths[i] - expected;
        double penalty = -exceed / (double)cfg->overlong_buffer_length * cfg->overlong_buffer_penalty;
        rewards[i] = (float)(rewards[i] + (penalty < 0.0 ? penalty : 0.0));
    }
    return DSARL_OK;
}

int64_t grpo_overlong_filter(const uint8_t *truncated, float *loss_multiplier, int64_t n)
{
    int64_t filtered = 0;
    for (int64_t i = 0; i < n; i++)
        if (truncated[i]) {
            loss_multiplier[i] = 0.0f;
            filtered++;
        }
    return filtered;
}

int64_t grpo_groups_with_signal(const float *rewards, int64_t n_groups, int64_t group_size, uint8_t *keep)
{
    int64_t kept = 0;
    for (int64_t g = 0; g < n_groups; g++) {
        const float *r = rewards + g * group_size;  // (G)
        // std != 0 exactly when the rewards differ; comparing them avoids E[R^2] - b^2 rounding to a tiny nonzero.
        bool differ = false;
        for (int64_t i = 1; i < group_size && !differ; i++)
            differ = r[i] != r[0];
        keep[g] = differ;
        kept += differ;
    }
    return kept;
}

void grpo_dynamic_sampler_init(grpo_dynamic_sampler *s, int64_t target_groups, int64_t group_size,
                               int64_t max_gen_batches)
{
    s->target_groups = target_groups;
    s->group_size = group_size;
    s->max_gen_batches = max_gen_batches;
    s->n_gen_batches = 0;
    s->n_groups_taken = 0;
    s->n_discarded_valid_samples = 0;
}

int grpo_dynamic_sampler_add(grpo_dynamic_sampler *s, const float *rewards, int64_t n_groups, uint8_t *take,
                             bool *complete, dsarl_error *err)
{
    s->n_gen_batches++;
    grpo_groups_with_signal(rewards, n_groups, s->group_size, take);
    int64_t room = s->target_groups - s->n_groups_taken;
    // Groups arrive in order and the surplus is sliced off the end, as NeMo's batch_cache.slice(0, size).
    for (int64_t g = 0; g < n_groups; g++) {
        if (!take[g])
            continue;
        if (room > 0) {
            room--;
            s->n_groups_taken++;
        } else {
            take[g] = 0;
            s->n_discarded_valid_samples += s->group_size;
        }
    }
    if (s->n_groups_taken >= s->target_groups) {
        *complete = true;
        return DSARL_OK;
    }
    *complete = false;
    // NeMo keeps generating while n_gen_batches <= max_gen_batches and raises ValueError after that.
    if (s->n_gen_batches > s->max_gen_batches)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "dynamic sampling found only %lld of %lld prompt groups with differing rewards after %lld "
                          "generation batches (grpo.dynamic_sampling_max_gen_batches = %lld); the data is too easy or "
                          "too hard for the policy: raise grpo.num_generations_per_prompt, grpo.batch_multiplier or "
                          "the limit",
                          (long long)s->n_groups_taken, (long long)s->target_groups, (long long)s->n_gen_batches,
                          (long long)s->max_gen_batches);
    return DSARL_OK;
}
