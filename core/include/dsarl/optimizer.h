/* dsarl/optimizer.h: the AdamW hyper-parameters of a recipe (policy.megatron_cfg.optimizer, Megatron's names).
 *
 * The optimizer itself runs inside the model (model ops optimizer_step, fp32 master weights and moments on its
 * device); this header only turns recipe keys into a checked dsarl_optimizer_params. The learning-rate schedule
 * and the gradient-clip factor are the algorithm's (grpo.h: grpo_lr_at, grpo_grad_clip_scale). */
#ifndef DSARL_OPTIMIZER_H
#define DSARL_OPTIMIZER_H

#include <stddef.h>
#include "dsarl/error.h"
#include "dsarl/ops/model.h"
#include "dsarl/plugin.h"
#include "dsarl/recipe.h"

DSARL_BEGIN_DECLS

/* The optimizer keys read here (optimizer, weight_decay, adam_beta1, adam_beta2, adam_eps) with Megatron/NeMo
 * defaults (adam, 0.01, 0.9, 0.999, 1e-8), for an algorithm's key table. */
DSARL_API const dsarl_key_spec *dsarl_optimizer_keys(size_t *n);

/* Fills *p from the recipe: betas, eps and weight decay; lr = policy.megatron_cfg.optimizer.lr (5e-6 when
 * absent) and grad_scale = 1 for the caller to replace per step. Refuses, naming the key's location, any
 * optimizer but "adam", betas outside [0, 1), eps <= 0 and weight decay < 0. */
DSARL_API int dsarl_optimizer_params_from_recipe(const dsarl_node *root, dsarl_optimizer_params *p,
                                                 dsarl_error *err);

DSARL_END_DECLS

#endif /* DSARL_OPTIMIZER_H */
