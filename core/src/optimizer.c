/* optimizer.c: AdamW hyper-parameters from policy.megatron_cfg.optimizer, checked before a run starts. */
#include <string.h>
#include "dsarl/optimizer.h"

#define OPT "policy.megatron_cfg.optimizer."

static const dsarl_key_spec optimizer_keys[] = {
    {OPT "optimizer", DSARL_KEY_STRING, "adam", "optimizer: adam (AdamW with decoupled weight decay)", 0},
    {OPT "weight_decay", DSARL_KEY_FLOAT, "0.01", "decoupled weight decay of trainable parameters", 0},
    {OPT "adam_beta1", DSARL_KEY_FLOAT, "0.9", "decay of the first moment", 0},
    {OPT "adam_beta2", DSARL_KEY_FLOAT, "0.999", "decay of the second moment", 0},
    {OPT "adam_eps", DSARL_KEY_FLOAT, "1.0e-8", "added to sqrt(v_hat) in the denominator", 0},
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
