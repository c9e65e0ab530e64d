/* grpo_loss.c: NeMo RL's ClippedPGLossFn (reference section 3.3) with its diagnostics (3.4), forward and the exact
 * gradient with respect to the current policy's per-token log-probabilities.
 *
 * Per valid token t of sequence s (m_t = token_mask * sample_mask):
 *   r     = exp(lp - lp_old)                    force_on_policy_ratio: exp(lp - sg(lp)) = 1, d r / d lp = 1
 *   r_c   = clamp(r, 1 - clip_min, 1 + clip_max)
 *   L     = max(-A r, -A r_c);  A < 0 and dual clip c: L = min(L, -A c)
 *   w     = exp(lp_old - lp_gen), nan/inf -> 0, then truncated (tis / icepop / seq-mask-tis); 1 without correction
 *   KL    = beta * clamp(w_kl * k(clamp(lp_ref - lp, +-in)), +-out)   w_kl = exp(lp - sg(lp)) or exp(lp - lp_gen)
 *   token level:    loss = sum_t m_t (w L + KL) / (global_valid_toks + 1e-8)
 *   sequence level: loss = sum_s sample_mask_s [sum_t tok_t (w L + KL) / (sum_t tok_t + 1e-8)] / (global_valid_seqs + 1e-8)
 * Variants (docs/algorithms.md):
 *   GSPO  (sequence_level_importance_ratios): r = exp(sum_t tok_t (lp - lp_old) / (sum_t tok_t + 1e-8)) for every
 *         token of the sequence, clamped alike, and w = exp(sum_t m_t (lp_old - lp_gen)) per sequence
 *   CISPO (use_cispo):         L = -A sg(r_c) lp          REINFORCE (disable_ppo_ratio): r = r_c = lp, L = -A lp
 *   VAPO  (positive_example_nll_weight mu): loss += mu sum_{t of samples with R > 0} m_t (-lp) / global_positive_toks
 *   use_kl_in_reward: no KL term here (Reinforce++ put it in the advantages); A may be per token (token_advantages)
 * The + 1e-8 are NeMo's masked_mean. Gradients follow torch's autograd rules exactly: max/min split a tie half and
 * half, clamp passes the gradient on its closed interval, nan_to_num zeroes it where it replaced a value, and the
 * KL input clamp detaches w_kl where it is active. All arithmetic is double; the gradient is stored as float. */
#include "grpo.h"

#include <math.h>
#include <stddef.h>

/* The KL estimator k(logr) with logr = log(p_ref / p), and dk / dlogr. */
static double kl_estimate(grpo_kl_type type, double logr, double *dk_dlogr)
{
    switch (type) {
    case GRPO_KL_K1:
        *dk_dlogr = -1.0;
        return -logr;
    case GRPO_KL_K2:
        *dk_dlogr = logr;
        return 0.5 * logr * logr;
    case GRPO_KL_K3:
    default: {
        double e = exp(logr);
        *dk_dlogr = e - 1.0;
        return e - 1.0 - logr;
    }
    }
}

/* exp(x) with torch.nan_to_num(nan=0, posinf=0, neginf=0) applied. */
static double exp_or_zero(double x)
{
    double e = exp(x);
    return isfinite(e) ? e : 0.0;
}

void grpo_loss_metrics_init(grpo_loss_metrics *m)
{
    *m = (grpo_loss_metrics){0};
    m->probs_ratio_min = m->probs_ratio_clamped_min = INFINITY;
    m->probs_ratio_max = m->probs_ratio_clamped_max = -INFINITY;
}

void grpo_loss_metrics_add(grpo_loss_metrics *total, const grpo_loss_metrics *mb)
{
    total->loss += mb->loss;
    total->actor_loss += mb->actor_loss;
    total->kl_penalty += mb->kl_penalty;
    total->token_mult_prob_error += mb->token_mult_prob_error;
    total->gen_kl_error += mb->gen_kl_error;
    total->policy_kl_error += mb->policy_kl_error;
    total->js_divergence_error += mb->js_divergence_error;
    total->sampling_importance_ratio += mb->sampling_importance_ratio;
    total->is_oob_ratio += mb->is_oob_ratio;
    total->approx_entropy += mb->approx_entropy;
    total->probs_ratio += mb->probs_ratio;
    total->probs_ratio_clamped += mb->probs_ratio_clamped;
    total->probs_ratio_min = fmin(total->probs_ratio_min, mb->probs_ratio_min);
    total->probs_ratio_max = fmax(total->probs_ratio_max, mb->probs_ratio_max);
    total->probs_ratio_clamped_min = fmin(total->probs_ratio_clamped_min, mb->probs_ratio_clamped_min);
    total->probs_ratio_clamped_max = fmax(total->probs_ratio_clamped_max, mb->probs_ratio_clamped_max);
    total->clip_fraction_low += mb->clip_fraction_low;
    total->clip_fraction_high += mb->clip_fraction_high;
    total->dual_clip_fraction += mb->dual_clip_fraction;
    total->num_valid_samples += mb->num_valid_samples;
    total->positive_nll_loss += mb->positive_nll_loss;
}

void grpo_count_valid(const grpo_loss_inputs *in, double *valid_toks, double *valid_seqs)
{
    double toks = 0.0, seqs = 0.0;
    for (int64_t s = 0; s < in->n_seqs; s++) {
        seqs += in->sample_mask[s];
        for (int64_t t = in->cu_seqlens[s]; t < in->cu_seqlens[s + 1]; t++)
            toks += (double)in->token_mask[t] * in->sample_mask[s];
    }
    *valid_toks = toks;
    *valid_seqs = seqs;
}

double grpo_count_positive_toks(const grpo_loss_inputs *in)
{
    double toks = 0.0;
    for (int64_t s = 0; in->rewards && s < in->n_seqs; s++)
        if (in->rewards[s] > 0.0f)
            for (int64_t t = in->cu_seqlens[s]; t < in->cu_seqlens[s + 1]; t++)
                toks += (double)in->token_mask[t] * in->sample_mask[s];
    return toks;
}

static int check_inputs(const grpo_loss_config *cfg, const grpo_loss_inputs *in, const float *lp_detached,
                        double *loss, dsarl_error *err)
{
    if (!cfg || !in || !loss || !lp_detached)
        return DSARL_FAIL(err, DSARL_E_INVALID, "grpo_clipped_pg_loss: cfg, inputs and loss must be non-NULL");
    if (in->n_tokens < 0 || in->n_seqs < 0 || !in->cu_seqlens)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "grpo_clipped_pg_loss: n_tokens (%lld) and n_seqs (%lld) must be >= 0 and cu_seqlens set",
                          (long long)in->n_tokens, (long long)in->n_seqs);
    if (!in->lp_theta || !in->lp_gen || !in->token_mask || !in->sample_mask || (!in->advantages && !in->token_advantages))
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "grpo_clipped_pg_loss: lp_theta, lp_gen, token_mask, sample_mask and advantages are required");
    if (!in->lp_old && !cfg->force_on_policy_ratio)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "grpo_clipped_pg_loss: lp_old is NULL but loss_fn.force_on_policy_ratio is false");
    if (!in->lp_ref && cfg->reference_policy_kl_penalty != 0.0 && !cfg->use_kl_in_reward)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "grpo_clipped_pg_loss: lp_ref is NULL but loss_fn.reference_policy_kl_penalty is %g",
                          cfg->reference_policy_kl_penalty);
    if (in->cu_seqlens[0] != 0 || in->cu_seqlens[in->n_seqs] != in->n_tokens)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "grpo_clipped_pg_loss: cu_seqlens must start at 0 and end at n_tokens (%lld), got %lld..%lld",
                          (long long)in->n_tokens, (long long)in->cu_seqlens[0],
                          (long long)in->cu_seqlens[in->n_seqs]);
    for (int64_t s = 0; s < in->n_seqs; s++)
        if (in->cu_seqlens[s + 1] < in->cu_seqlens[s])
            return DSARL_FAIL(err, DSARL_E_INVALID,
                              "grpo_clipped_pg_loss: cu_seqlens decreases at sequence %lld (%lld > %lld)", (long long)s,
                              (long long)in->cu_seqlens[s], (long long)in->cu_seqlens[s + 1]);
    if (cfg->positive_example_nll_weight > 0.0 && !in->rewards)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "grpo_clipped_pg_loss: loss_fn.positive_example_nll_weight is %g but no rewards were given",
                          cfg->positive_example_nll_weight);
    if (!(in->global_valid_toks >= 0.0) || !(in->global_valid_seqs >= 0.0))
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "grpo_clipped_pg_loss: global_valid_toks (%g) and global_valid_seqs (%g) must be >= 0",
                          in->global_valid_toks, in->global_valid_seqs);
    return DSARL_OK;
}

/* The probability ratio of one token and its clamp, each with its derivative with respect to the log-ratio x the
 * ratio is built from: x = lp - lp_old per token, or GSPO's sequence mean of it; REINFORCE's "ratio" is lp itself
 * (d / d lp = 1). */
typedef struct token_ratio {
    double ratio, dratio, ratio_c, dratio_c;
} token_ratio;

static token_ratio ratio_of(const grpo_loss_config *cfg, double lp, double lp_sg, double old, double seq_ratio)
{
    token_ratio r;
    if (cfg->force_on_policy_ratio) {
        r.ratio = r.dratio = r.ratio_c = r.dratio_c = exp(lp - lp_sg);  // 1, never clamped
        return r;
    }
    if (cfg->disable_ppo_ratio) {
        r.ratio = r.ratio_c = lp;
        r.dratio = r.dratio_c = 1.0;
        return r;
    }
    const double lo = 1.0 - cfg->ratio_clip_min, hi = 1.0 + cfg->ratio_clip_max;
    r.ratio = cfg->sequence_level_importance_ratios ? seq_ratio : exp(lp - old);
    r.dratio = r.ratio;
    r.ratio_c = r.ratio < lo ? lo : r.ratio > hi ? hi : r.ratio;
    r.dratio_c = (r.ratio >= lo && r.ratio <= hi) ? r.ratio : 0.0;
    return r;
}

/* Truncation of a train/inference IS weight by tis or icepop (seq-mask-tis acts per sequence, elsewhere); *oob is
 * set when the weight was outside the bounds. */
static double truncate_weight(const grpo_loss_config *cfg, double w, bool *oob)
{
    *oob = false;
    if (cfg->truncation == GRPO_TRUNCATION_TIS) {
        *oob = w > cfg->truncation_ratio || w < cfg->truncation_ratio_min;
        return w < cfg->truncation_ratio_min ? cfg->truncation_ratio_min
               : w > cfg->truncation_ratio   ? cfg->truncation_ratio
                                             : w;
    }
    if (cfg->truncation == GRPO_TRUNCATION_ICEPOP && !(w >= cfg->truncation_ratio_min && w <= cfg->truncation_ratio)) {
        *oob = true;
        return 0.0;
    }
    return w;
}

int grpo_clipped_pg_loss_detached(const grpo_loss_config *cfg, const grpo_loss_inputs *in, const float *lp_detached,
                                  double *loss, float *grad_lp_theta, grpo_loss_metrics *metrics, dsarl_error *err)
{
    DSARL_TRY(check_inputs(cfg, in, lp_detached, loss, err));
    grpo_loss_metrics m;
    grpo_loss_metrics_init(&m);
    const double tok_norm = in->global_valid_toks + 1e-8;  // NeMo masked_mean's global normalisation
    const double seq_norm = in->global_valid_seqs + 1e-8;
    // use_kl_in_reward moves the KL into the (Reinforce++) advantages: the loss then has none
    const double beta = cfg->use_kl_in_reward ? 0.0 : cfg->reference_policy_kl_penalty;
    const bool use_kl = beta != 0.0;
    // GSPO: the IS weight is per sequence whenever sequence_level_importance_ratios is set; the ratio is the
    // sequence's only when it is a ratio at all (not forced to 1, not REINFORCE's lp).
    const bool seq_is = cfg->sequence_level_importance_ratios;
    const bool gspo = seq_is && !cfg->force_on_policy_ratio && !cfg->disable_ppo_ratio;
    const double nll_weight = cfg->positive_example_nll_weight;
    const bool use_nll = nll_weight > 0.0 && in->rewards && in->global_positive_toks > 0.0;
    const double ratio_lo = 1.0 - cfg->ratio_clip_min, ratio_hi = 1.0 + cfg->ratio_clip_max;
    double actor_sum = 0.0, kl_sum = 0.0, nll_sum = 0.0;

    if (grad_lp_theta)
        for (int64_t t = 0; t < in->n_tokens; t++)
            grad_lp_theta[t] = 0.0f;

    for (int64_t s = 0; s < in->n_seqs; s++) {
        const int64_t t0 = in->cu_seqlens[s], t1 = in->cu_seqlens[s + 1];
        const double sample = in->sample_mask[s];
        m.num_valid_samples += sample;
        if (sample == 0.0)
            continue;  // the sequence contributes nothing, to the loss or to any metric

        // Per-sequence sums: token count, the seq-mask-tis log IS weight (nan_to_num per token), GSPO's log-ratio
        // mean (over token_mask) and its log IS weight (over token_mask * sample_mask, nan_to_num after exp).
        double n_tok = 0.0, seq_log_is = 0.0, seq_log_ratio = 0.0, seq_lp_diff = 0.0;
        for (int64_t t = t0; t < t1; t++) {
            const double tok = in->token_mask[t];
            if (tok == 0.0)
                continue;
            n_tok += tok;
            double old = cfg->force_on_policy_ratio ? lp_detached[t] : in->lp_old[t];
            double d = old - in->lp_gen[t];
            seq_log_is += isfinite(d) ? tok * d : 0.0;
            seq_lp_diff += tok * sample * d;
            seq_log_ratio += tok * (in->lp_theta[t] - old);
        }
        seq_log_ratio /= n_tok + 1e-8;
        const double seq_ratio = exp(seq_log_ratio);
        // Weight of one token's term in the loss: over global tokens, or a sequence mean over global sequences.
        const double seq_weight = cfg->token_level_loss ? sample / tok_norm : sample / ((n_tok + 1e-8) * seq_norm);

        // seq-mask-tis keeps or drops the whole sequence by the geometric mean of its IS weights.
        double seq_keep = 1.0;
        if (cfg->truncation == GRPO_TRUNCATION_SEQ_MASK) {
            double geo_mean = exp(seq_log_is / (n_tok + 1e-8));
            seq_keep = (geo_mean >= cfg->truncation_ratio_min && geo_mean <= cfg->truncation_ratio) ? 1.0 : 0.0;
            m.is_oob_ratio += sample * (1.0 - seq_keep) / seq_norm;
        }
        // GSPO: one IS weight per sequence, exp of the summed log-weights, truncated as a whole.
        bool seq_w_oob = false;
        const double seq_w = seq_is ? truncate_weight(cfg, exp_or_zero(seq_lp_diff), &seq_w_oob) : 1.0;
        if (seq_is)
            m.sampling_importance_ratio += sample * seq_w / seq_norm;

        double seq_dx = 0.0;  // GSPO: d loss / d (the sequence's mean log-ratio), spread over its tokens below
        for (int64_t t = t0; t < t1; t++) {
            const double tok = in->token_mask[t];
            if (tok == 0.0)
                continue;
            const double diag = tok * sample / tok_norm;  // token-normalised weight of the diagnostics
            const double coef = tok * seq_weight;         // weight of this token's terms in the loss
            const double lp = in->lp_theta[t], lp_sg = lp_detached[t], gen = in->lp_gen[t];
            const double old = cfg->force_on_policy_ratio ? lp_sg : in->lp_old[t];
            const double adv = in->token_advantages ? in->token_advantages[t] : in->advantages[s];
            const token_ratio r = ratio_of(cfg, lp, lp_sg, old, seq_ratio);

            double clip_loss, dclip;  // dclip: d clip_loss / d x (the log-ratio; lp itself for CISPO, REINFORCE)
            if (cfg->use_cispo) {
                // CISPO: the clamped ratio is a constant weight on the REINFORCE term -A lp; the clamp caps the
                // weight instead of removing the gradient.
                // The weight is detached: it is computed from lp_detached (the value of lp_theta under sg).
                const token_ratio r_sg = ratio_of(cfg, lp_sg, lp_sg, old, seq_ratio);
                clip_loss = -adv * r_sg.ratio_c * lp;
                dclip = -adv * r_sg.ratio_c;
                m.clip_fraction_low += r_sg.ratio < ratio_lo ? diag : 0.0;
                m.clip_fraction_high += r_sg.ratio > ratio_hi ? diag : 0.0;
            } else {
                // Pessimistic clipped surrogate; torch.max sends half the gradient each way on a tie.
                const double loss1 = -adv * r.ratio, loss2 = -adv * r.ratio_c;
                if (loss1 > loss2) {
                    clip_loss = loss1;
                    dclip = -adv * r.dratio;
                } else if (loss2 > loss1) {
                    clip_loss = loss2;
                    dclip = -adv * r.dratio_c;
                    m.clip_fraction_low += r.ratio < ratio_lo ? diag : 0.0;
                    m.clip_fraction_high += r.ratio > ratio_hi ? diag : 0.0;
                } else {
                    clip_loss = loss1;
                    dclip = 0.5 * (-adv * r.dratio) + 0.5 * (-adv * r.dratio_c);
                }
                if (cfg->ratio_clip_c > 0.0 && adv < 0.0) {
                    const double loss3 = -adv * cfg->ratio_clip_c;  // constant: no gradient
                    if (loss3 < clip_loss) {
                        clip_loss = loss3;
                        dclip = 0.0;
                        m.dual_clip_fraction += diag;
                    } else if (loss3 == clip_loss) {
                        dclip *= 0.5;
                    }
                }
            }

            // Train/inference importance weight (a constant for autograd: lp_old and lp_gen carry no gradient).
            double w;
            bool oob;
            if (seq_is) {
                w = seq_w;
                oob = seq_w_oob;
            } else {
                w = truncate_weight(cfg, exp_or_zero(old - gen), &oob);
                if (cfg->truncation == GRPO_TRUNCATION_SEQ_MASK)
                    w *= seq_keep;
                m.sampling_importance_ratio += diag * w;
            }
            if (cfg->truncation == GRPO_TRUNCATION_TIS || cfg->truncation == GRPO_TRUNCATION_ICEPOP)
                m.is_oob_ratio += oob ? diag : 0.0;
            const double w_use = cfg->use_importance_sampling_correction ? w : 1.0;

            actor_sum += coef * w_use * clip_loss;
            double grad = 0.0;
            if (gspo)
                seq_dx += coef * w_use * dclip;
            else
                grad = coef * w_use * dclip;

            if (use_kl) {
                // w_kl keeps the score-function gradient: value 1 (or exp(lp - lp_gen)), derivative = its value.
                double w_kl = cfg->use_on_policy_kl_approximation ? exp(lp - gen) : exp(lp - lp_sg);
                double dw_kl = w_kl;
                if (!isfinite(w_kl))
                    w_kl = dw_kl = 0.0;
                double logr = in->lp_ref[t] - lp, dlogr = -1.0;
                if (logr > cfg->kl_input_clamp_value || logr < -cfg->kl_input_clamp_value) {
                    // The clamp is active: no gradient through logr, and w_kl is detached here too.
                    logr = logr > 0.0 ? cfg->kl_input_clamp_value : -cfg->kl_input_clamp_value;
                    dlogr = 0.0;
                    dw_kl = 0.0;
                }
                double dk_dlogr;
                double k = kl_estimate(cfg->kl_type, logr, &dk_dlogr);
                double kl = w_kl * k;
                double dkl = dw_kl * k + w_kl * dk_dlogr * dlogr;
                if (kl > cfg->kl_output_clamp_value || kl < -cfg->kl_output_clamp_value) {
                    kl = kl > 0.0 ? cfg->kl_output_clamp_value : -cfg->kl_output_clamp_value;
                    dkl = 0.0;
                }
                kl_sum += coef * beta * kl;
                grad += coef * beta * dkl;
            }
            if (use_nll && in->rewards[s] > 0.0f) {
                // VAPO: mean NLL over the tokens of positively rewarded samples, always token-normalised
                const double c = tok * sample / in->global_positive_toks;
                nll_sum += c * -lp;
                grad += nll_weight * c * -1.0;
            }
            if (grad_lp_theta)
                grad_lp_theta[t] = (float)grad;

            // Diagnostics (section 3.4), token-normalised over the global batch.
            double dk_unused;
            m.token_mult_prob_error += diag * exp(fabs(gen - old));
            m.gen_kl_error += diag * kl_estimate(cfg->kl_type, old - gen, &dk_unused);
            m.policy_kl_error += diag * kl_estimate(cfg->kl_type, gen - old, &dk_unused);
            double top = fmax(old, gen);
            double log_mix = top + log(0.5 * exp(old - top) + 0.5 * exp(gen - top));
            double kl_old_mix = exp(old - log_mix) - (old - log_mix) - 1.0;
            double kl_gen_mix = exp(gen - log_mix) - (gen - log_mix) - 1.0;
            m.js_divergence_error += diag * (0.5 * kl_old_mix + 0.5 * kl_gen_mix);
            m.approx_entropy -= diag * exp(lp - gen) * lp;
            m.probs_ratio += diag * r.ratio;
            m.probs_ratio_clamped += diag * r.ratio_c;
            m.probs_ratio_min = fmin(m.probs_ratio_min, r.ratio);
            m.probs_ratio_max = fmax(m.probs_ratio_max, r.ratio);
            m.probs_ratio_clamped_min = fmin(m.probs_ratio_clamped_min, r.ratio_c);
            m.probs_ratio_clamped_max = fmax(m.probs_ratio_clamped_max, r.ratio_c);
        }
        // GSPO: x = sum_t tok_t (lp_t - lp_old_t) / (n_tok + 1e-8), so d x / d lp_t = tok_t / (n_tok + 1e-8).
        if (gspo && grad_lp_theta)
            for (int64_t t = t0; t < t1; t++)
                grad_lp_theta[t] += (float)(seq_dx * in->token_mask[t] / (n_tok + 1e-8));
    }
    *loss = actor_sum + kl_sum + nll_weight * nll_sum;
    m.loss = *loss;
    m.actor_loss = actor_sum;
    m.kl_penalty = use_kl ? kl_sum / beta : 0.0;
    m.positive_nll_loss = nll_sum;
    if (metrics)
        *metrics = m;
    return DSARL_OK;
}

int grpo_clipped_pg_loss(const grpo_loss_config *cfg, const grpo_loss_inputs *in, double *loss,
                         float *grad_lp_theta, grpo_loss_metrics *metrics, dsarl_error *err)
{
    return grpo_clipped_pg_loss_detached(cfg, in, in ? in->lp_theta : NULL, loss, grad_lp_theta, metrics, err);
}
