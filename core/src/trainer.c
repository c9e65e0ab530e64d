/* trainer.c: the training pass, the optimizer slice tail and the deadline rule shared by the algorithms. */
#include "dsarl/trainer.h"

int dsarl_trainer_forward(const dsarl_model_ops *ops, dsarl_model *model, const dsarl_token_batch *batch,
                          const int32_t *targets, float *logprobs, dsarl_pass_counts *counts, dsarl_error *err)
{
    DSARL_TRY(ops->forward_logprobs(model, batch, targets, logprobs, err));
    if (counts)
        counts->forward_tokens += batch->n_tokens;
    return DSARL_OK;
}

int dsarl_trainer_train_forward(const dsarl_model_ops *ops, dsarl_model *model, const dsarl_token_batch *batch,
                                const int32_t *targets, float *logprobs, dsarl_pass_counts *counts, dsarl_error *err)
{
    if (DSARL_MODEL_HAS(ops, train_forward) && DSARL_MODEL_HAS(ops, train_backward))
        DSARL_TRY(ops->train_forward(model, batch, targets, logprobs, err));
    else
        DSARL_TRY(ops->forward_logprobs(model, batch, targets, logprobs, err));
    if (counts)
        counts->train_pass_tokens += batch->n_tokens;
    return DSARL_OK;
}

int dsarl_trainer_train_backward(const dsarl_model_ops *ops, dsarl_model *model, const dsarl_token_batch *batch,
                                 const int32_t *targets, const float *dlogprobs, float *indexer_loss,
                                 dsarl_error *err)
{
    if (DSARL_MODEL_HAS(ops, train_forward) && DSARL_MODEL_HAS(ops, train_backward))
        return ops->train_backward(model, dlogprobs, indexer_loss, err);
    return ops->backward(model, batch, targets, dlogprobs, indexer_loss, err);
}

int dsarl_trainer_optimizer_step(const dsarl_model_ops *ops, dsarl_model *model, const dsarl_optimizer_params *adam,
                                 double lr, double max_grad_norm, double *grad_norm, dsarl_error *err)
{
    // a data-parallel all-reduce of the gradients goes here, before the norm every rank must agree on
    double norm, scale;
    DSARL_TRY(ops->grad_norm(model, &norm, err));
    DSARL_TRY(dsarl_grad_clip_scale(norm, max_grad_norm, &scale, err));
    dsarl_optimizer_params op = *adam;
    op.struct_size = sizeof op;
    op.lr = lr;
    op.grad_scale = scale;
    DSARL_TRY(ops->optimizer_step(model, &op, err));
    if (grad_norm)
        *grad_norm = norm;
    return DSARL_OK;
}

bool dsarl_trainer_deadline_near(const dsarl_checkpoint_config *ckpt, double elapsed_s, int64_t steps_this_run)
{
    if (steps_this_run < 1)
        return false;
    return dsarl_checkpoint_deadline_near(ckpt, elapsed_s, elapsed_s / (double)steps_this_run);
}
