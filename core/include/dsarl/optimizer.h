/* dsarl/optimizer.h: the AdamW hyper-parameters of a recipe (policy.megatron_cfg.optimizer, Megatron's names).
 * SDK tier: trainer services (docs/sdk.md): exported by libdsarl, versioned with it; plugins may call them.
 *
 * The optimizer itself runs inside the model (model ops optimizer_step, fp32 master weights and moments on its
 * device); this header turns recipe keys into a checked dsarl_optimizer_params, and holds what every training
 * algorithm (GRPO, SFT) shares around it: Megatron's learning-rate schedule (OptimizerParamScheduler: warm-up, then
 * constant, linear or cosine decay to min_lr) and its gradient-norm clip, with their keys, reader and checks. */
#ifndef DSARL_OPTIMIZER_H
#define DSARL_OPTIMIZER_H

#include <stddef.h>
#include <stdint.h>
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

/* ------------------------------------------------------------------------------------------------------------
 * Learning-rate schedule and gradient clipping (policy.megatron_cfg.optimizer.{lr, min_lr, clip_grad},
 * policy.megatron_cfg.scheduler.*, policy.max_grad_norm). */

typedef enum dsarl_lr_decay_style { DSARL_LR_CONSTANT = 0, DSARL_LR_LINEAR, DSARL_LR_COSINE } dsarl_lr_decay_style;

typedef struct dsarl_lr_schedule {
    uint32_t struct_size;             /* sizeof(dsarl_lr_schedule) of the caller's build */
    double lr;                        /* peak ("max") learning rate */
    double min_lr;                    /* floor of the decay */
    double warmup_init;               /* lr at step 0 of the warm-up (lr_warmup_init) */
    int64_t warmup_iters;             /* linear warm-up length in optimizer steps; 0 = none */
    int64_t decay_iters;              /* the decay reaches min_lr at this step */
    dsarl_lr_decay_style decay_style;
    double max_grad_norm;             /* clip_grad (policy.max_grad_norm when null); 0 = no clipping */
} dsarl_lr_schedule;

/* The keys a schedule reads, in this order: policy.max_grad_norm, optimizer.lr, optimizer.min_lr,
 * optimizer.clip_grad, scheduler.lr_decay_style, scheduler.lr_decay_iters, scheduler.lr_warmup_iters,
 * scheduler.lr_warmup_init. */
#define DSARL_LR_SCHEDULE_N_KEYS 8

/* Caller-owned storage of a schedule key table: the specs point into its strings, so it must outlive every use of
 * the table (an algorithm keeps one static table, filled once). */
typedef struct dsarl_lr_schedule_key_table {
    dsarl_key_spec keys[DSARL_LR_SCHEDULE_N_KEYS];
    char defaults[DSARL_LR_SCHEDULE_N_KEYS][32];
    char decay_iters_doc[160];
} dsarl_lr_schedule_key_table;

/* Fills *table with the schedule keys, their default strings written from *defaults (lr, min_lr, warmup_init,
 * warmup_iters, decay_style, max_grad_norm; clip_grad and lr_decay_iters default to null), and returns its
 * DSARL_LR_SCHEDULE_N_KEYS specs in *n. steps_key names the algorithm's step count that a null lr_decay_iters
 * means (e.g. "grpo.max_num_steps"). */
DSARL_API const dsarl_key_spec *dsarl_lr_schedule_keys(const dsarl_lr_schedule *defaults, const char *steps_key,
                                                       dsarl_lr_schedule_key_table *table, size_t *n);

/* Reads *s from the recipe: keys absent take *defaults, a null lr_decay_iters takes `steps` (the algorithm's step
 * count), clip_grad null or absent takes policy.max_grad_norm (absent: defaults->max_grad_norm; null: 0 = off).
 * Refuses a decay style dsarl does not implement (inverse-square-root, WSD) or does not know. Values are checked
 * by dsarl_lr_schedule_validate. */
DSARL_API int dsarl_lr_schedule_from_recipe(const dsarl_node *root, const dsarl_lr_schedule *defaults, int64_t steps,
                                            dsarl_lr_schedule *s, dsarl_error *err);

/* Refuses, naming the key's location: policy.max_grad_norm or clip_grad < 0, lr not finite or <= 0, min_lr or
 * warmup_init outside [0, lr], warmup_iters < 0, decay_iters < 1 (named as steps_key when lr_decay_iters is
 * null) and warmup_iters >= decay_iters. */
DSARL_API int dsarl_lr_schedule_validate(const dsarl_node *root, const dsarl_lr_schedule *s, const char *steps_key,
                                         dsarl_error *err);

/* Learning rate for the optimizer step that follows `step` completed steps: linear warm-up from warmup_init to
 * lr over warmup_iters, then constant, or linear / cosine decay to min_lr at decay_iters, min_lr after. */
DSARL_API double dsarl_lr_at(const dsarl_lr_schedule *s, int64_t step);

/* Megatron's clip_grad_norm factor: min(1, max_norm / (grad_norm + 1e-6)); 1 when max_norm <= 0 (clipping off).
 * Fails on a non-finite gradient norm (the step would corrupt the weights). */
DSARL_API int dsarl_grad_clip_scale(double grad_norm, double max_norm, double *scale, dsarl_error *err);

DSARL_END_DECLS

#endif /* DSARL_OPTIMIZER_H */
