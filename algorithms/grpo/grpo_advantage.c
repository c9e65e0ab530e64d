/* grpo_advantage.c: rewards -> advantages (reference section 3.2) and the DAPO reward options (section 3.5):
 * reward scaling, overlong reward shaping, overlong filtering, dynamic sampling.
 *
 * Statistics are accumulated in double: a group of 16 float rewards in {0, 1} gives exactly the values NeMo's
 * float32 torch code gives up to rounding, and the std == 0 test stays exact for identical rewards. */
#include "grpo.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

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

/* GRPO's advantage of every sample of one reward column (stride floats apart in rewards): R - b, divided by
 * (std + 1e-6) under normalize_rewards where std > 0; a group of one gets 0. No clamp. out: (n_groups * G). */
static void grpo_group_advantages(const grpo_advantage_config *cfg, const float *rewards, int64_t stride,
                                  int64_t n_groups, int64_t group_size, float *out)
{
    for (int64_t g = 0; g < n_groups; g++) {
        const float *r = rewards + g * group_size * stride;  // (G) at stride
        double sum = 0.0, sum_sq = 0.0;
        for (int64_t i = 0; i < group_size; i++) {
            sum += r[i * stride];
            sum_sq += (double)r[i * stride] * r[i * stride];
        }
        for (int64_t i = 0; i < group_size; i++) {
            double ri = r[i * stride], b = ri, s = 0.0;  // a group of one: A = 0
            if (group_size > 1)
                sample_stats(sum, sum, sum_sq, ri, ri, group_size, cfg->use_leave_one_out_baseline, &b, &s);
            double a = ri - b;
            // A group without variation is left unnormalised (its advantage is 0 anyway, up to rounding).
            if (cfg->normalize_rewards && s > 0.0)
                a /= s + 1e-6;
            out[g * group_size + i] = (float)a;
        }
    }
}

/* grpo.advantage_clip_low / high. */
static double clip_advantage(const grpo_advantage_config *cfg, double a)
{
    return a < cfg->advantage_clip_low ? cfg->advantage_clip_low : a > cfg->advantage_clip_high ? cfg->advantage_clip_high : a;
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
    grpo_group_advantages(cfg, rewards, 1, n_groups, group_size, advantages);
    for (int64_t i = 0; i < n_groups * group_size; i++)
        advantages[i] = (float)clip_advantage(cfg, advantages[i]);
    return DSARL_OK;
}

int grpo_gdpo_advantages(const grpo_advantage_config *cfg, const float *components, int64_t n_components,
                         int64_t n_groups, int64_t group_size, float *advantages, dsarl_error *err)
{
    if (!cfg || !components || !advantages || n_groups < 1 || group_size < 1)
        return DSARL_FAIL(err, DSARL_E_INVALID, "grpo_gdpo_advantages: bad arguments (n_groups %lld, group_size %lld)",
                          (long long)n_groups, (long long)group_size);
    if (n_components < 2)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "grpo.adv_estimator.name is gdpo but the environment scores %lld reward component(s); GDPO "
                          "needs at least 2 (use the grpo estimator for a single reward)", (long long)n_components);
    if (cfg->n_reward_weights != 0 && cfg->n_reward_weights != n_components)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "grpo.adv_estimator.reward_weights has %lld entries but the environment scores %lld reward "
                          "components; give one weight per component, in the order of the sorted component names",
                          (long long)cfg->n_reward_weights, (long long)n_components);
    const int64_t n = n_groups * group_size;
    for (int64_t i = 0; i < n * n_components; i++)
        if (!isfinite(components[i]))
            return DSARL_FAIL(err, DSARL_E_INVALID, "reward component %lld of sample %lld is %g; rewards must be finite",
                              (long long)(i % n_components), (long long)(i / n_components), (double)components[i]);
    float *part = malloc(sizeof(float) * (size_t)n);
    double *sum = calloc((size_t)n, sizeof(double));
    if (!part || !sum) {
        free(part);
        free(sum);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "grpo_gdpo_advantages: out of memory for %lld samples", (long long)n);
    }
    for (int64_t k = 0; k < n_components; k++) {
        double w = cfg->n_reward_weights ? cfg->reward_weights[k] : 1.0;
        grpo_group_advantages(cfg, components + k, n_components, n_groups, group_size, part);
        for (int64_t i = 0; i < n; i++)
            sum[i] += w * part[i];
    }
    // z-score over the batch; torch's Tensor.std is the unbiased one (NaN for one sample: only the mean goes)
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < n; i++)
        mean += sum[i];
    mean /= (double)n;
    for (int64_t i = 0; i < n; i++)
        var += (sum[i] - mean) * (sum[i] - mean);
    double std = n > 1 ? sqrt(var / (double)(n - 1)) : NAN;
    for (int64_t i = 0; i < n; i++) {
        double a = std > 0.0 ? (sum[i] - mean) / std : sum[i] - mean;
        advantages[i] = (float)clip_advantage(cfg, a);
    }
    free(part);
    free(sum);
    return DSARL_OK;
}

/* calculate_kl(logprobs, reference) as NeMo's Reinforce++ calls it: logr = clamp(lp_ref - lp, +-20), the estimator,
 * then clamp(+-10). */
static double reward_kl(grpo_kl_type type, double lp, double lp_ref)
{
    double logr = lp_ref - lp;
    logr = logr > 20.0 ? 20.0 : logr < -20.0 ? -20.0 : logr;
    double k = type == GRPO_KL_K1 ? -logr : type == GRPO_KL_K2 ? 0.5 * logr * logr : exp(logr) - 1.0 - logr;
    return k > 10.0 ? 10.0 : k < -10.0 ? -10.0 : k;
}

double grpo_reward_kl_mean(grpo_kl_type kl_type, int64_t n_seqs, const int32_t *cu_seqlens, const float *token_mask,
                           const float *sample_mask, const float *lp_policy, const float *lp_ref)
{
    double sum = 0.0, count = 0.0;
    for (int64_t s = 0; s < n_seqs; s++)
        for (int64_t t = cu_seqlens[s]; t < cu_seqlens[s + 1]; t++) {
            double m = (double)token_mask[t] * sample_mask[s];
            if (m != 0.0)
                sum += m * reward_kl(kl_type, lp_policy[t], lp_ref[t]), count += m;
        }
    return count > 0.0 ? sum / count : 0.0;
}

int grpo_reinforce_pp_advantages(const grpo_advantage_config *cfg, const float *rewards, int64_t n_groups,
                                 int64_t group_size, const int32_t *cu_seqlens, const float *token_mask,
                                 const float *sample_mask, double kl_coef, grpo_kl_type kl_type,
                                 const float *lp_policy, const float *lp_ref, float *token_advantages,
                                 dsarl_error *err)
{
    const int64_t n = n_groups * group_size;
    if (!cfg || !rewards || !cu_seqlens || !token_mask || !sample_mask || !token_advantages || n < 1 ||
        (kl_coef != 0.0 && (!lp_policy || !lp_ref)))
        return DSARL_FAIL(err, DSARL_E_INVALID, "grpo_reinforce_pp_advantages: bad arguments");
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(rewards[i]))
            return DSARL_FAIL(err, DSARL_E_INVALID, "reward of sample %lld is %g; a reward must be finite",
                              (long long)i, (double)rewards[i]);
    double sum = 0.0, count = 0.0;
    for (int64_t g = 0; g < n_groups; g++) {
        const float *r = rewards + g * group_size;  // (G)
        double group_sum = 0.0;
        for (int64_t i = 0; i < group_size; i++)
            group_sum += r[i];
        for (int64_t i = 0; i < group_size; i++) {
            const int64_t s = g * group_size + i;
            // a group of one is its own baseline, as NeMo's "no valid responses" case
            double a = cfg->minus_baseline ? r[i] - (group_size > 1 ? group_sum / (double)group_size : r[i]) : r[i];
            for (int64_t t = cu_seqlens[s]; t < cu_seqlens[s + 1]; t++) {
                double at = a - (kl_coef != 0.0 ? kl_coef * reward_kl(kl_type, lp_policy[t], lp_ref[t]) : 0.0);
                token_advantages[t] = (float)at;
                double m = (double)token_mask[t] * sample_mask[s];
                sum += m * at;
                count += m;
            }
        }
    }
    if (!(count > 0.0))
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "Reinforce++ advantages: the batch has no token that trains (every sample masked)");
    const double mean = sum / count;
    double var = 0.0;
    for (int64_t s = 0; s < n; s++)
        for (int64_t t = cu_seqlens[s]; t < cu_seqlens[s + 1]; t++) {
            double d = token_advantages[t] - mean;
            var += (double)token_mask[t] * sample_mask[s] * d * d;
        }
    var /= count;
    const double rstd = 1.0 / sqrt(var > 1e-8 ? var : 1e-8);
    for (int64_t t = 0; t < cu_seqlens[n]; t++)
        token_advantages[t] = (float)clip_advantage(cfg, (token_advantages[t] - mean) * rstd);
    return DSARL_OK;
}

void grpo_seq_logprob_error_mask(double threshold, int64_t n_seqs, const int32_t *cu_seqlens, const float *token_mask,
                                 const float *lp_old, const float *lp_gen, const float *rewards, float *sample_mask,
                                 grpo_seq_error_stats *out)
{
    *out = (grpo_seq_error_stats){0};
    double max = -INFINITY, min = INFINITY, sum = 0.0, kmax = -INFINITY, kmin = INFINITY, ksum = 0.0;
    int64_t n_valid = 0, n_kept = 0, masked_correct = 0;
    for (int64_t s = 0; s < n_seqs; s++) {
        double num = 0.0, den = 0.0;
        for (int64_t t = cu_seqlens[s]; t < cu_seqlens[s + 1]; t++) {
            double m = (double)token_mask[t] * sample_mask[s];
            num += m * exp(fabs((double)lp_gen[t] - lp_old[t]) * m);
            den += m;
        }
        if (!(den > 0.0))
            continue;  // a fully masked sequence has no error and keeps its (zero) mask
        double e = num / (den < 1.0 ? 1.0 : den);
        n_valid++;
        max = fmax(max, e), min = fmin(min, e), sum += e;
        if (!isnan(threshold) && e > threshold) {
            sample_mask[s] = 0.0f;
            out->num_masked++;
            masked_correct += rewards[s] == 1.0f;
            continue;
        }
        n_kept++;
        kmax = fmax(kmax, e), kmin = fmin(kmin, e), ksum += e;
    }
    if (n_valid) {
        out->max = max, out->min = min, out->mean = sum / (double)n_valid;
    }
    if (n_kept) {
        out->max_after = kmax, out->min_after = kmin, out->mean_after = ksum / (double)n_kept;
    }
    out->masked_correct_pct = out->num_masked ? (double)masked_correct / (double)out->num_masked : 0.0;
}

/* Occurrences of needle in text. */
static int64_t count_of(const char *text, const char *needle)
{
    int64_t n = 0;
    size_t len = strlen(needle);
    for (const char *p = text ? strstr(text, needle) : NULL; p; p = strstr(p + len, needle))
        n++;
    return n;
}

bool grpo_malformed_thinking(const char *prompt, const char *response)
{
    int64_t p_open = count_of(prompt, "<think>"), p_close = count_of(prompt, "</think>");
    int64_t r_open = count_of(response, "<think>"), r_close = count_of(response, "</think>");
    if (p_open == p_close)
        return r_open != 0 || r_close != 0;
    if (p_open == p_close + 1)
        return r_open != 0 || r_close != 1;
    return true;
}

bool grpo_invalid_tool_call(const char *response)
{
    static const char *const patterns[] = {"<tool_call>", "</tool_call>", "<function_call>", "</function_call>"};
    for (size_t i = 0; response && i < sizeof patterns / sizeof patterns[0]; i++)
        if (strstr(response, patterns[i]))
            return true;
    return false;
}

void grpo_apply_message_penalties(const grpo_advantage_config *adv, double invalid_tool_call_advantage,
                                  double malformed_thinking_advantage, int64_t n, const char *const *prompts,
                                  const char *const *responses, const int32_t *cu_seqlens, float *advantages,
                                  float *token_advantages, grpo_penalty_counts *counts)
{
    *counts = (grpo_penalty_counts){.assistant_messages = n};
    for (int64_t s = 0; s < n; s++) {
        double a;
        if (!isnan(invalid_tool_call_advantage) && grpo_invalid_tool_call(responses[s])) {
            counts->invalid_tool_calls++;
            a = invalid_tool_call_advantage;
        } else if (!isnan(malformed_thinking_advantage) && grpo_malformed_thinking(prompts[s], responses[s])) {
            counts->malformed_thinking++;
            a = malformed_thinking_advantage;
        } else {
            continue;
        }
        a = clip_advantage(adv, a);  // NeMo clips after the penalties
        advantages[s] = (float)a;
        for (int64_t t = cu_seqlens ? cu_seqlens[s] : 0; token_advantages && cu_seqlens && t < cu_seqlens[s + 1]; t++)
            token_advantages[t] = (float)a;
    }
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
