/* distill_loss.c: the teacher's top-k selection and NeMo RL's DistillationLossFn with its gradient, on the host.
 *
 * Per valid position t (mask > 0), over the teacher's k tokens j:
 *   lt_j = tl_j - logsumexp(tl)                     teacher log-probs renormalised over its top k
 *   ls_j = lp_j - logsumexp(lp)                     student, renormalised (zero_outside_topk false)
 *   ls_j = lp_j                                     student, full vocabulary (zero_outside_topk true, forward only)
 *   forward = sum_j pt_j (lt_j - ls_j), reverse = sum_j ps_j (ls_j - lt_j)
 *   loss = sum_t mask_t * KL_t / global_valid_toks
 * and the gradient by hand: d forward / d ls_j = -pt_j, d reverse / d ls_j = ps_j (ls_j - lt_j + 1), then through
 * the renormalisation d / d lp_i = g_i - ps_i sum_j g_j. */
#include <math.h>
#include <stdlib.h>

#include "distill.h"

void distill_topk(const float *logits, int64_t V, int32_t k, int32_t *idx, float *val)
{
    /* insertion into a sorted list of k: V is a vocabulary and k small, and a strict > keeps the lower index of
     * a tie ahead */
    int32_t n = 0;
    for (int64_t v = 0; v < V; v++) {
        float x = logits[v];
        if (n == k && !(x > val[k - 1]))
            continue;
        int32_t at = n < k ? n++ : k - 1;
        while (at > 0 && x > val[at - 1]) {
            val[at] = val[at - 1];
            idx[at] = idx[at - 1];
            at--;
        }
        val[at] = x;
        idx[at] = (int32_t)v;
    }
}

static double logsumexp(const float *x, int32_t k)
{
    double m = -INFINITY, s = 0.0;
    for (int32_t j = 0; j < k; j++)
        m = fmax(m, (double)x[j]);
    for (int32_t j = 0; j < k; j++)
        s += exp((double)x[j] - m);
    return m + log(s);
}

int distill_loss(const distill_loss_config *cfg, const distill_loss_inputs *in, double *loss, float *grad,
                 distill_loss_metrics *metrics, dsarl_error *err)
{
    if (in->k < 1 || in->n_positions < 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "distillation loss: k must be >= 1 (got %d) and T >= 0", in->k);
    if (cfg->zero_outside_topk && cfg->kl_type != DISTILL_KL_FORWARD)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "loss_fn.zero_outside_topk with a reverse or mixed KL is not "
                          "supported yet (its tail entropy needs the whole vocabulary): use kl_type forward or "
                          "zero_outside_topk false");
    const int32_t k = in->k;
    const double w = cfg->kl_type == DISTILL_KL_FORWARD ? 1.0 : cfg->kl_type == DISTILL_KL_REVERSE ? 0.0
                                                                                               : cfg->mixed_kl_weight;
    const double norm = in->global_valid_toks > 0.0 ? in->global_valid_toks : 1.0;
    double total = 0.0, fwd_sum = 0.0, rev_sum = 0.0, mass_sum = 0.0;
    double ls[256], lt[256], g[256];
    if (k > 256)
        return DSARL_FAIL(err, DSARL_E_INVALID, "distillation loss: k = %d is above the 256 supported", k);
    for (int64_t t = 0; t < in->n_positions; t++) {
        const float *lp = in->lp_student + t * k, *tl = in->teacher_logits + t * k;
        float *gt = grad ? grad + t * k : NULL;
        double m = in->mask[t];
        if (m == 0.0) {
            for (int32_t j = 0; gt && j < k; j++)
                gt[j] = 0.0f;
            continue;
        }
        double lse_t = logsumexp(tl, k), lse_s = cfg->zero_outside_topk ? 0.0 : logsumexp(lp, k);
        double fwd = 0.0, rev = 0.0, mass = 0.0;
        for (int32_t j = 0; j < k; j++) {
            lt[j] = (double)tl[j] - lse_t;
            ls[j] = (double)lp[j] - lse_s;
            double pt = exp(lt[j]), ps = exp(ls[j]);
            fwd += pt * (lt[j] - ls[j]);
            rev += ps * (ls[j] - lt[j]);
            mass += exp((double)lp[j]);
            g[j] = w * -pt + (1.0 - w) * ps * (ls[j] - lt[j] + 1.0);
        }
        total += m * (w * fwd + (1.0 - w) * rev);
        fwd_sum += m * fwd, rev_sum += m * rev, mass_sum += m * mass;
        if (!gt)
            continue;
        double gsum = 0.0;
        for (int32_t j = 0; j < k; j++)
            gsum += g[j];
        for (int32_t j = 0; j < k; j++) {
            double d = cfg->zero_outside_topk ? g[j] : g[j] - exp(ls[j]) * gsum;
            gt[j] = (float)(m * d / norm);
        }
    }
    *loss = total / norm;
    if (metrics)
        *metrics = (distill_loss_metrics){.loss = total / norm, .forward_kl = fwd_sum / norm,
                                          .reverse_kl = rev_sum / norm, .student_topk_mass = mass_sum / norm};
    return DSARL_OK;
}
