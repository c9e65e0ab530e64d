/* optimizer.c: AdamW hyper-parameters from policy.megatron_cfg.optimizer, and the learning-rate schedule and
 * gradient clip every training algorithm shares, checked before a run starts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dsarl/optimizer.h"

#define OPT "policy.megatron_cfg.optimizer."

static const dsarl_key_spec optimizer_keys[] = {
    {OPT "optimizer", DSARL_KEY_STRING, "adam", "optimizer: adam (AdamW with decoupled weight decay)", 0},
    {OPT "weight_decay", DSARL_KEY_FLOAT, "0.01", "decoupled weight decay of trainable parameters", 0},
    {OPT "adam_beta1", DSARL_KEY_FLOAT, "0.9", "decay of the first moment", 0},
    {OPT "adam_beta2", DSARL_KEY_FLOAT, "0.999", "decay of the second moment", 0},
    {OPT "adam_eps", DSARL_KEY_FLOAT, "1.0e-8", "added to sqrt(v_hat) in the denominator", 0},
    {"policy.max_consecutive_nonfinite_steps", DSARL_KEY_INT, "3", "a NaN/Inf loss or gradient norm skips the "
     "update; this many skipped steps in a row stop the run (exit status 1)", 0},
};

const dsarl_key_spec *dsarl_optimizer_keys(size_t *n)
{
    *n = DSARL_ARRAY_LEN(optimizer_keys);
    return optimizer_keys;
}

int dsarl_optimizer_params_from_recipe(const dsarl_node *root, dsarl_optimizer_params *p, dsarl_error *err)
{
    memset(p, 0, sizeof *p);
    p->struct_size = (uint32_t)sizeof *p;
    p->grad_scale = 1.0;
    const char *name = "adam";
    DSARL_TRY(dsarl_recipe_string_or(root, OPT "optimizer", "adam", &name, err));
    if (strcmp(name, "adam") != 0)
        return dsarl_recipe_fail(root, OPT "optimizer", err, DSARL_E_UNSUPPORTED,
                                 "must be adam (AdamW, the only optimizer dsarl implements), got \"%s\"", name);
    DSARL_TRY(dsarl_recipe_double_or(root, OPT "lr", 5.0e-6, &p->lr, err));
    DSARL_TRY(dsarl_recipe_double_or(root, OPT "weight_decay", 0.01, &p->weight_decay, err));
    DSARL_TRY(dsarl_recipe_double_or(root, OPT "adam_beta1", 0.9, &p->beta1, err));
    DSARL_TRY(dsarl_recipe_double_or(root, OPT "adam_beta2", 0.999, &p->beta2, err));
    DSARL_TRY(dsarl_recipe_double_or(root, OPT "adam_eps", 1.0e-8, &p->eps, err));
    if (!(p->beta1 >= 0.0 && p->beta1 < 1.0))
        return dsarl_recipe_fail(root, OPT "adam_beta1", err, DSARL_E_INVALID, "must be in [0, 1), got %g", p->beta1);
    if (!(p->beta2 >= 0.0 && p->beta2 < 1.0))
        return dsarl_recipe_fail(root, OPT "adam_beta2", err, DSARL_E_INVALID, "must be in [0, 1), got %g", p->beta2);
    if (!(p->eps > 0.0))
        return dsarl_recipe_fail(root, OPT "adam_eps", err, DSARL_E_INVALID, "must be > 0, got %g", p->eps);
    if (!(p->weight_decay >= 0.0))
        return dsarl_recipe_fail(root, OPT "weight_decay", err, DSARL_E_INVALID, "must be >= 0, got %g",
                                 p->weight_decay);
    if (!(p->lr >= 0.0))
        return dsarl_recipe_fail(root, OPT "lr", err, DSARL_E_INVALID, "must be >= 0, got %g", p->lr);
    return DSARL_OK;
}

/* ------------------------------------------------------------------------------------------------------------
 * Learning-rate schedule (Megatron's OptimizerParamScheduler) and gradient-norm clipping. */

#define SCHED "policy.megatron_cfg.scheduler."

static const double pi = 3.14159265358979323846; // M_PI is not C11

/* Writes a double as YAML flow text the way the key tables spell defaults: the shortest text that reads back
 * exactly, with a ".0" mantissa and a bare exponent (5e-07 -> "5.0e-7", 1 -> "1.0"). */
static void format_default(char *out, size_t size, double v)
{
    char shortest[40];
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(shortest, sizeof shortest, "%.*g", digits, v);
        if (strtod(shortest, NULL) == v)
            break;
    }
    char *e = strchr(shortest, 'e');
    char mantissa[40], exponent[16] = "";
    snprintf(mantissa, sizeof mantissa, "%.*s", e ? (int)(e - shortest) : (int)strlen(shortest), shortest);
    if (!strchr(mantissa, '.') && isfinite(v))
        strncat(mantissa, ".0", sizeof mantissa - strlen(mantissa) - 1);
    if (e) {
        int x = atoi(e + 1);
        snprintf(exponent, sizeof exponent, "e%d", x);
    }
    snprintf(out, size, "%s%s", mantissa, exponent);
}

static const char *const decay_style_names[] = {"constant", "linear", "cosine", "inverse-square-root", "WSD"};

const dsarl_key_spec *dsarl_lr_schedule_keys(const dsarl_lr_schedule *defaults, const char *steps_key,
                                             dsarl_lr_schedule_key_table *table, size_t *n)
{
    char(*d)[32] = table->defaults;
    format_default(d[0], sizeof d[0], defaults->max_grad_norm);
    format_default(d[1], sizeof d[1], defaults->lr);
    format_default(d[2], sizeof d[2], defaults->min_lr);
    snprintf(d[3], sizeof d[3], "null");
    snprintf(d[4], sizeof d[4], "%s",
             (unsigned)defaults->decay_style <= DSARL_LR_COSINE ? decay_style_names[defaults->decay_style] : "constant");
    snprintf(d[5], sizeof d[5], "null");
    snprintf(d[6], sizeof d[6], "%lld", (long long)defaults->warmup_iters);
    format_default(d[7], sizeof d[7], defaults->warmup_init);
    snprintf(table->decay_iters_doc, sizeof table->decay_iters_doc, "optimizer steps to reach min_lr; null = %s",
             steps_key);
    const dsarl_key_spec keys[DSARL_LR_SCHEDULE_N_KEYS] = {
        {"policy.max_grad_norm", DSARL_KEY_FLOAT, d[0], "gradient-norm clip; 0 or null = off", DSARL_KEY_NULLABLE},
        {OPT "lr", DSARL_KEY_FLOAT, d[1], "peak learning rate", 0},
        {OPT "min_lr", DSARL_KEY_FLOAT, d[2], "learning rate at the end of the decay", 0},
        {OPT "clip_grad", DSARL_KEY_FLOAT, d[3], "gradient-norm clip; null = policy.max_grad_norm", DSARL_KEY_NULLABLE},
        {SCHED "lr_decay_style", DSARL_KEY_STRING, d[4], "constant | linear | cosine", 0},
        {SCHED "lr_decay_iters", DSARL_KEY_INT, d[5], table->decay_iters_doc, DSARL_KEY_NULLABLE},
        {SCHED "lr_warmup_iters", DSARL_KEY_INT, d[6], "linear warm-up steps", 0},
        {SCHED "lr_warmup_init", DSARL_KEY_FLOAT, d[7], "learning rate at warm-up step 0", 0},
    };
    memcpy(table->keys, keys, sizeof keys);
    *n = DSARL_LR_SCHEDULE_N_KEYS;
    return table->keys;
}

int dsarl_lr_schedule_from_recipe(const dsarl_node *root, const dsarl_lr_schedule *defaults, int64_t steps,
                                  dsarl_lr_schedule *s, dsarl_error *err)
{
    *s = *defaults;
    s->struct_size = (uint32_t)sizeof *s;
    // clip_grad (NeMo's YAML: ${policy.max_grad_norm}) wins when set; null anywhere means no clipping.
    double max_grad_norm;
    DSARL_TRY(dsarl_recipe_double_or(root, "policy.max_grad_norm",
                                     dsarl_node_get(root, "policy.max_grad_norm") ? 0.0 : defaults->max_grad_norm,
                                     &max_grad_norm, err));
    DSARL_TRY(dsarl_recipe_double_or(root, OPT "clip_grad", max_grad_norm, &s->max_grad_norm, err));
    DSARL_TRY(dsarl_recipe_double_or(root, OPT "lr", defaults->lr, &s->lr, err));
    DSARL_TRY(dsarl_recipe_double_or(root, OPT "min_lr", defaults->min_lr, &s->min_lr, err));
    DSARL_TRY(dsarl_recipe_double_or(root, SCHED "lr_warmup_init", defaults->warmup_init, &s->warmup_init, err));
    DSARL_TRY(dsarl_recipe_int_or(root, SCHED "lr_warmup_iters", defaults->warmup_iters, &s->warmup_iters, err));
    DSARL_TRY(dsarl_recipe_int_or(root, SCHED "lr_decay_iters", steps, &s->decay_iters, err));

    const int n_names = (int)DSARL_ARRAY_LEN(decay_style_names);
    const char *style;
    DSARL_TRY(dsarl_recipe_string_or(root, SCHED "lr_decay_style", decay_style_names[defaults->decay_style], &style,
                                     err));
    int i = 0;
    while (i < n_names && strcmp(style, decay_style_names[i]) != 0)
        i++;
    if (i == n_names) {
        char valid[128] = "";
        for (int k = 0; k < n_names; k++) {
            strncat(valid, k ? (k == n_names - 1 ? " or " : ", ") : "", sizeof valid - strlen(valid) - 1);
            strncat(valid, decay_style_names[k], sizeof valid - strlen(valid) - 1);
        }
        return dsarl_recipe_fail(root, SCHED "lr_decay_style", err, DSARL_E_INVALID, "must be %s, got '%s'", valid,
                                 style);
    }
    if (i > DSARL_LR_COSINE)
        return dsarl_recipe_fail(root, SCHED "lr_decay_style", err, DSARL_E_UNSUPPORTED,
                                 "'%s' is not supported yet; use constant, linear or cosine", style);
    s->decay_style = (dsarl_lr_decay_style)i;
    return DSARL_OK;
}

#define REFUSE(path, ...) return dsarl_recipe_fail(root, path, err, DSARL_E_INVALID, __VA_ARGS__)

int dsarl_lr_schedule_validate(const dsarl_node *root, const dsarl_lr_schedule *s, const char *steps_key,
                               dsarl_error *err)
{
    // policy.max_grad_norm first: clip_grad usually interpolates it, and the user set the source.
    double max_grad_norm;
    DSARL_TRY(dsarl_recipe_double_or(root, "policy.max_grad_norm", 0.0, &max_grad_norm, err));
    if (!(max_grad_norm >= 0.0))
        REFUSE("policy.max_grad_norm", "must be >= 0 or null (no clipping), got %g", max_grad_norm);
    if (!(s->max_grad_norm >= 0.0))
        REFUSE(OPT "clip_grad", "must be >= 0 or null (no clipping), got %g", s->max_grad_norm);
    if (!(s->lr > 0.0) || !isfinite(s->lr))
        REFUSE(OPT "lr", "must be a finite number > 0, got %g", s->lr);
    if (!(s->min_lr >= 0.0) || s->min_lr > s->lr)
        REFUSE(OPT "min_lr", "must be in [0, lr = %g], got %g", s->lr, s->min_lr);
    if (!(s->warmup_init >= 0.0) || s->warmup_init > s->lr)
        REFUSE(SCHED "lr_warmup_init", "must be in [0, lr = %g], got %g", s->lr, s->warmup_init);
    if (s->warmup_iters < 0)
        REFUSE(SCHED "lr_warmup_iters", "must be >= 0, got %lld", (long long)s->warmup_iters);
    const dsarl_node *decay = dsarl_node_get(root, SCHED "lr_decay_iters");
    const char *decay_key = decay && dsarl_node_kind(decay) != DSARL_NODE_NULL ? SCHED "lr_decay_iters" : steps_key;
    if (s->decay_iters < 1)
        REFUSE(decay_key, "must be > 0 (lr_decay_iters), got %lld", (long long)s->decay_iters);
    if (s->warmup_iters >= s->decay_iters)
        REFUSE(SCHED "lr_warmup_iters",
               "(%lld) must be smaller than the decay length %lld (Megatron's scheduler requires it)",
               (long long)s->warmup_iters, (long long)s->decay_iters);
    return DSARL_OK;
}

double dsarl_lr_at(const dsarl_lr_schedule *s, int64_t step)
{
    // Warm-up is checked first and includes its last step, as Megatron's `num_steps <= lr_warmup_steps`.
    if (s->warmup_iters > 0 && step <= s->warmup_iters)
        return s->warmup_init + (s->lr - s->warmup_init) * (double)step / (double)s->warmup_iters;
    if (s->decay_style == DSARL_LR_CONSTANT)
        return s->lr;
    if (step > s->decay_iters)
        return s->min_lr;
    double decay_ratio = (double)(step - s->warmup_iters) / (double)(s->decay_iters - s->warmup_iters);
    double coeff = s->decay_style == DSARL_LR_LINEAR ? 1.0 - decay_ratio : 0.5 * (cos(pi * decay_ratio) + 1.0);
    return s->min_lr + coeff * (s->lr - s->min_lr);
}

int dsarl_grad_clip_scale(double grad_norm, double max_norm, double *scale, dsarl_error *err)
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
