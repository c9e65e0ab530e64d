/* grpo_schedule.c: the learning-rate schedule of Megatron's OptimizerParamScheduler (the keys NeMo RL's Megatron
 * recipes use) and Megatron's gradient-norm clipping factor. */
#include "grpo.h"

#include <math.h>

static const double pi = 3.14159265358979323846;  // M_PI is not C11

double grpo_lr_at(const grpo_lr_schedule *s, int64_t step)
{
    // Warm-up is checked first and includes its last step, as Megatron's `num_steps <= lr_warmup_steps`.
    if (s->warmup_iters > 0 && step <= s->warmup_iters)
        return s->warmup_init + (s->lr - s->warmup_init) * (double)step / (double)s->warmup_iters;
    if (s->decay_style == GRPO_LR_CONSTANT)
        return s->lr;
    if (step > s->decay_iters)
        return s->min_lr;
    double decay_ratio = (double)(step - s->warmup_iters) / (double)(s->decay_iters - s->warmup_iters);
    double coeff = s->decay_style == GRPO_LR_LINEAR ? 1.0 - decay_ratio : 0.5 * (cos(pi * decay_ratio) + 1.0);
    return s->min_lr + coeff * (s->lr - s->min_lr);
}

int grpo_grad_clip_scale(double grad_norm, double max_norm, double *scale, dsarl_error *err)
{
    if (!isfinite(grad_norm))
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "the gradient norm is %g; applying this step would corrupt the weights (lower the learning "
                          "rate, or check the loss inputs for inf/nan log-probabilities)",
                          grad_norm);
    *scale = 1.0;
    if (max_norm > 0.0) {
        double clip_coeff = max_norm / (grad_norm + 1e-6);
        if (clip_coeff < 1.0)
            *scale = clip_coeff;
    }
    return DSARL_OK;
}
