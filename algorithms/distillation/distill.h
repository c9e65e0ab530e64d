/* distill.h: on-policy distillation as NeMo RL runs it (its distillation algorithm and DistillationLossFn): the
 * student generates responses to the dataset's prompts, a frozen teacher scores every response position with its
 * top-k logits, and the student minimises a KL to the teacher on those k tokens.
 *
 * The loss here is a pure function over host arrays, like grpo.h's: the student's training pass returns its
 * full-vocabulary log-probabilities of the teacher's k tokens at each position (the pass runs the batch k times,
 * copy j targeting the j-th teacher token), this file returns d loss / d those log-probs, and the model's backward
 * takes it from there. Positions follow the model's convention: position t predicts token t + 1. */
#ifndef DSARL_DISTILL_H
#define DSARL_DISTILL_H

#include <stdbool.h>
#include <stdint.h>
#include "dsarl/error.h"
#include "dsarl/ops/algorithm.h"
#include "dsarl/plugin.h"
#include "dsarl/recipe.h"
#include "grpo.h"

/* loss_fn.kl_type */
typedef enum distill_kl_type {
    DISTILL_KL_FORWARD = 0, /* KL(teacher || student): sum_j pt_j (lt_j - ls_j) */
    DISTILL_KL_REVERSE,     /* KL(student || teacher): sum_j ps_j (ls_j - lt_j) */
    DISTILL_KL_MIXED,       /* w * forward + (1 - w) * reverse, w = loss_fn.mixed_kl_weight */
} distill_kl_type;

/* The loss_fn section. */
typedef struct distill_loss_config {
    distill_kl_type kl_type;
    double mixed_kl_weight;  /* weight of the forward KL under "mixed", in [0, 1] */
    bool zero_outside_topk;  /* false: both distributions renormalised over the teacher's k tokens; true: the
                              * student's full-vocabulary log-probs (teacher mass zero outside the k) */
} distill_loss_config;

/* Everything the distillation algorithm reads besides what the shared loop reads (grpo_train_keys). */
typedef struct distill_config {
    grpo_config loop;        /* the distillation.* loop keys mapped onto the GRPO loop's (no advantages, no KL) */
    int64_t topk_logits_k;   /* distillation.topk_logits_k */
    const char *teacher_dir; /* teacher.model_name: a Hugging Face directory the model plugin loads */
    distill_loss_config loss;
} distill_config;

/* Reads and checks the distillation, loss_fn, teacher and policy keys of a resolved recipe (absent keys keep their
 * defaults); a bad value or combination fails naming its key. Reads only the recipe. */
int distill_config_from_recipe(const dsarl_node *root, distill_config *cfg, dsarl_error *err);

/* The recipe keys of algorithm/distillation, then the shared loop's, logger's, checkpointing's, optimizer's and
 * datasets' keys. One static table, joined on the first call; fails (and every later call with it) only if they
 * outgrow it. */
int distill_recipe_keys(const dsarl_key_spec **keys, size_t *n, dsarl_error *err);

/* The k largest of logits (V) in descending order, ties to the lower index: idx (k) and their values val (k).
 * Needs 1 <= k <= V. */
void distill_topk(const float *logits, int64_t V, int32_t k, int32_t *idx, float *val);

/* One microbatch of the loss. global_valid_toks counts the GLOBAL batch's valid positions (sum of mask over every
 * microbatch of the optimizer step), so the microbatch losses and gradients sum to the step's. */
typedef struct distill_loss_inputs {
    int64_t n_positions;          /* T */
    int32_t k;                    /* teacher tokens per position */
    const float *lp_student;      /* (T, k) student log-probs of the teacher's tokens (full vocabulary) */
    const float *teacher_logits;  /* (T, k) the teacher's top-k logits */
    const float *mask;            /* (T) token mask x sample mask: 1 on response positions that train */
    double global_valid_toks;
} distill_loss_inputs;

/* Metrics of one microbatch, already divided by the global count (they add over microbatches). */
typedef struct distill_loss_metrics {
    double loss;        /* the configured KL */
    double forward_kl;  /* KL(teacher || student) over the k tokens, as the loss normalises them */
    double reverse_kl;  /* KL(student || teacher), likewise */
    double student_topk_mass; /* the student's full-vocabulary probability of the teacher's k tokens */
} distill_loss_metrics;

/* NeMo RL's DistillationLossFn on one microbatch: *loss (the masked token mean), grad (T, k) = d loss /
 * d lp_student (may be NULL) and metrics (may be NULL). Masked positions contribute nothing and get gradient 0.
 * Refuses zero_outside_topk with a reverse or mixed KL (its tail entropy term needs the whole vocabulary). */
int distill_loss(const distill_loss_config *cfg, const distill_loss_inputs *in, double *loss, float *grad,
                 distill_loss_metrics *metrics, dsarl_error *err);

/* What a run did, for callers that drive distill_train_run directly (tests). */
typedef struct distill_run_summary {
    int64_t first_step, last_step; /* steps done when the run started (a resumed checkpoint) and when it returned */
    char exp_dir[1024];            /* the logger's experiment directory */
} distill_run_summary;

/* The whole distillation job for a recipe whose keys validated and a run context whose model, device and dsa ops
 * are selected (ctx->generation_ops may be NULL: the built-in sampler generates). summary may be NULL. */
int distill_train_run(const dsarl_run_context *ctx, distill_run_summary *summary, dsarl_error *err);

#endif /* DSARL_DISTILL_H */
