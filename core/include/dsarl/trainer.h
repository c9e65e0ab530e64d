/* trainer.h: services shared by the training algorithms (GRPO, SFT) and the CLI commands that drive a model.
 * Not part of the plugin ABI: algorithms link libdsarl and call these; nothing here is a plugin slot.
 *   - pass accounting: tokens through forward-only passes and through training passes;
 *   - the training pass: train_forward/train_backward when the model has them (ABI 1.2), forward_logprobs then
 *     backward otherwise;
 *   - the optimizer slice tail: grad norm -> clip -> lr -> step, the one place where a data-parallel gradient
 *     reduction will attach;
 *   - the loop tick's one deadline rule. */
#ifndef DSARL_TRAINER_H
#define DSARL_TRAINER_H

#include "dsarl/checkpoint.h"
#include "dsarl/optimizer.h"
#include "dsarl/plugin.h"

DSARL_BEGIN_DECLS

/* Tokens that went through the model in one step: forward-only passes (old / reference log-probs, evaluation)
 * and training passes (a forward whose activations feed a backward). */
typedef struct dsarl_pass_counts {
    int64_t forward_tokens;
    int64_t train_pass_tokens;
} dsarl_pass_counts;

/* A forward-only log-prob pass (no backward follows): forward_logprobs, counted in counts->forward_tokens
 * (counts may be NULL). */
DSARL_API int dsarl_trainer_forward(const dsarl_model_ops *ops, dsarl_model *model, const dsarl_token_batch *batch,
                                    const int32_t *targets, float *logprobs, dsarl_pass_counts *counts,
                                    dsarl_error *err);

/* The forward of a training pass: per-token log-probs (T) of batch, kept for dsarl_trainer_train_backward with the
 * same batch and targets. One forward per token with train_forward; forward_logprobs otherwise (backward then
 * recomputes it inside the model). Counted in counts->train_pass_tokens. */
DSARL_API int dsarl_trainer_train_forward(const dsarl_model_ops *ops, dsarl_model *model,
                                          const dsarl_token_batch *batch, const int32_t *targets, float *logprobs,
                                          dsarl_pass_counts *counts, dsarl_error *err);

/* The backward of the pass dsarl_trainer_train_forward opened, from dlogprobs (T): ACCUMULATES into the gradients;
 * *indexer_loss (may be NULL) gets the indexer KL loss. */
DSARL_API int dsarl_trainer_train_backward(const dsarl_model_ops *ops, dsarl_model *model,
                                           const dsarl_token_batch *batch, const int32_t *targets,
                                           const float *dlogprobs, float *indexer_loss, dsarl_error *err);

/* The tail of one optimizer slice, after its microbatches accumulated gradients: gradient norm (*grad_norm), clip
 * to max_grad_norm (<= 0: off), AdamW step with adam's settings at learning rate lr. Data-parallel gradient
 * reduction belongs here, before the norm. */
DSARL_API int dsarl_trainer_optimizer_step(const dsarl_model_ops *ops, dsarl_model *model,
                                           const dsarl_optimizer_params *adam, double lr, double max_grad_norm,
                                           double *grad_norm, dsarl_error *err);

/* The one deadline rule (checkpointing.checkpoint_must_save_by): true when elapsed_s since this process's run
 * start plus one more step at this run's average step time (elapsed_s / steps_this_run) would pass the deadline.
 * False without a deadline or before the first step of this run. */
DSARL_API bool dsarl_trainer_deadline_near(const dsarl_checkpoint_config *ckpt, double elapsed_s,
                                           int64_t steps_this_run);

DSARL_END_DECLS

#endif /* DSARL_TRAINER_H */
