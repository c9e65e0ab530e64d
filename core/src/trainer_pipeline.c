/* trainer_pipeline.c: the microbatches of one optimizer slice, in the 1F1B pipeline schedule under pipeline
 * parallelism (Megatron's forward_backward_pipelining_without_interleaving), one after another otherwise.
 *
 * Stage s of P runs min(P - 1 - s, n) warm-up forwards, then alternates one forward and one backward, then the
 * cool-down backwards: microbatch i lives in slot i % P of the model's stage ops from its forward (or the receive
 * of its input) to the send of its input gradient, at most P - s at a time. Each point-to-point step is one
 * dsarl_model_ops.stage_transfer pairing what Megatron pairs (a forward send with the next stage's gradient, a
 * gradient send with the previous stage's next input), so the two ends of a link always meet. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "dsarl/trainer.h"

// A microbatch struct of an ABI 1.5 caller has room for the MTP loss (1.4 ones end before it).
static bool has_mtp_loss(const dsarl_train_microbatch *mb)
{
    return mb->struct_size >= offsetof(dsarl_train_microbatch, mtp_loss) + sizeof mb->mtp_loss;
}

// One microbatch after another: forward, loss, backward.
static int run_in_order(const dsarl_model_ops *ops, dsarl_model *model, dsarl_train_microbatch *mbs, int32_t n,
                        dsarl_microbatch_loss_fn loss, void *user, dsarl_pass_counts *counts, dsarl_error *err)
{
    for (int32_t i = 0; i < n; i++) {
        dsarl_train_microbatch *mb = &mbs[i];
        DSARL_TRY(dsarl_trainer_train_forward(ops, model, mb->batch, mb->targets, mb->logprobs, counts, err));
        DSARL_TRY(loss(user, i, mb, err));
        float mtp = 0.0f; // the caller's normalisation of the MTP loss, before the backward adds it
        if (has_mtp_loss(mb) && DSARL_MODEL_HAS(ops, mtp_loss) &&
            ops->mtp_loss(model, mb->token_mask, mb->norm_tokens, &mtp) > 0)
            mb->mtp_loss = mtp;
        DSARL_TRY(dsarl_trainer_train_backward(ops, model, mb->batch, mb->targets, mb->dlogprobs,
                                               &mb->indexer_loss, err));
    }
    return DSARL_OK;
}

typedef struct schedule {
    const dsarl_model_ops *ops;
    dsarl_model *model;
    dsarl_train_microbatch *mbs;
    int32_t n, stages, stage;
    dsarl_microbatch_loss_fn loss;
    void *user;
    float *shared;   // (sum of T) every microbatch's log-probs, kept by the last stage before its loss call (which
                     // may overwrite them with their gradient), then broadcast to the other stages
    int64_t *offset; // (n + 1) where each microbatch's log-probs start in shared
} schedule;

static bool first_stage(const schedule *s) { return s->stage == 0; }
static bool last_stage(const schedule *s) { return s->stage == s->stages - 1; }

// A transfer step; each argument a microbatch index or -1 (and only the ones this stage has a neighbour for).
static int transfer(const schedule *s, int32_t send_fwd, int32_t recv_bwd, int32_t send_bwd, int32_t recv_fwd,
                    dsarl_error *err)
{
    if (last_stage(s))
        send_fwd = recv_bwd = -1;
    if (first_stage(s))
        send_bwd = recv_fwd = -1;
    if (send_fwd < 0 && recv_bwd < 0 && send_bwd < 0 && recv_fwd < 0)
        return DSARL_OK;
    int32_t P = s->stages;
    dsarl_stage_transfer t = {.struct_size = sizeof t, .send_forward = send_fwd < 0 ? -1 : send_fwd % P,
                              .recv_backward = recv_bwd < 0 ? -1 : recv_bwd % P,
                              .send_backward = send_bwd < 0 ? -1 : send_bwd % P,
                              .recv_forward = recv_fwd < 0 ? -1 : recv_fwd % P,
                              .recv_batch = recv_fwd < 0 ? NULL : s->mbs[recv_fwd].batch};
    return s->ops->stage_transfer(s->model, &t, err);
}

// The stage's forward of microbatch i; the last stage turns its log-probs into their gradient at once.
static int forward(const schedule *s, int32_t i, dsarl_error *err)
{
    dsarl_train_microbatch *mb = &s->mbs[i];
    DSARL_TRY(s->ops->stage_forward(s->model, i % s->stages, mb->batch, mb->targets, mb->logprobs, err));
    if (!last_stage(s))
        return DSARL_OK;
    memcpy(s->shared + s->offset[i], mb->logprobs, (size_t)mb->batch->n_tokens * sizeof(float));
    return s->loss(s->user, i, mb, err);
}

static int backward(const schedule *s, int32_t i, dsarl_error *err)
{
    dsarl_train_microbatch *mb = &s->mbs[i];
    return s->ops->stage_backward(s->model, i % s->stages, mb->dlogprobs, &mb->indexer_loss, err);
}

static int run_1f1b(const schedule *s, dsarl_error *err)
{
    int32_t n = s->n, warm = s->stages - 1 - s->stage;
    warm = warm < n ? warm : n;
    int32_t steady = n - warm;
    for (int32_t i = 0; i < warm; i++) {
        DSARL_TRY(transfer(s, -1, -1, -1, i, err));
        DSARL_TRY(forward(s, i, err));
        DSARL_TRY(transfer(s, i, -1, -1, -1, err));
    }
    if (steady > 0)
        DSARL_TRY(transfer(s, -1, -1, -1, warm, err));
    for (int32_t j = 0; j < steady; j++) {
        int32_t f = warm + j; // the forward of this step; j is the oldest microbatch in flight
        DSARL_TRY(forward(s, f, err));
        DSARL_TRY(transfer(s, f, j, -1, -1, err));
        DSARL_TRY(backward(s, j, err));
        DSARL_TRY(transfer(s, -1, -1, j, j + 1 < steady ? f + 1 : -1, err));
    }
    for (int32_t j = steady; j < n; j++) {
        DSARL_TRY(transfer(s, -1, j, -1, -1, err));
        DSARL_TRY(backward(s, j, err));
        DSARL_TRY(transfer(s, -1, -1, j, -1, err));
    }
    return DSARL_OK;
}

// After the schedule: every pp rank gets the last stage's log-probs and every stage's indexer loss, and the stages
// other than the last make their loss calls (the last one made them as its forwards ended).
static int share_results(const schedule *s, const dsarl_group *pp, dsarl_error *err)
{
    double *il = malloc((size_t)(s->n > 0 ? s->n : 1) * sizeof(double));
    int rc = il ? dsarl_group_broadcast_host(pp, s->shared, s->offset[s->n], DSARL_DTYPE_F32, s->stages - 1, err)
                : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for %d indexer losses", s->n);
    for (int32_t i = 0; rc == 0 && i < s->n; i++)
        il[i] = s->mbs[i].indexer_loss;
    if (rc == 0)
        rc = dsarl_group_all_reduce_host(pp, il, s->n, DSARL_DTYPE_F64, DSARL_REDUCE_SUM, err);
    for (int32_t i = 0; rc == 0 && i < s->n; i++) {
        dsarl_train_microbatch *mb = &s->mbs[i];
        mb->indexer_loss = (float)il[i];
        if (!last_stage(s)) {
            memcpy(mb->logprobs, s->shared + s->offset[i], (size_t)mb->batch->n_tokens * sizeof(float));
            rc = s->loss(s->user, i, mb, err);
        }
    }
    free(il);
    return rc;
}

int dsarl_trainer_train_microbatches(const dsarl_model_ops *ops, dsarl_model *model, const dsarl_parallel *par,
                                     dsarl_train_microbatch *mbs, int32_t n, dsarl_microbatch_loss_fn loss,
                                     void *user, dsarl_pass_counts *counts, dsarl_error *err)
{
    if (n < 0 || (n > 0 && (!mbs || !loss)))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_trainer_train_microbatches: needs n >= 0 microbatches and a "
                          "loss callback");
    for (int32_t i = 0; i < n; i++)
        if (mbs[i].struct_size < offsetof(dsarl_train_microbatch, mtp_loss) || !mbs[i].batch || !mbs[i].logprobs ||
            !mbs[i].dlogprobs)
            return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_trainer_train_microbatches: microbatch %d needs an ABI "
                              "1.4 struct with a batch, log-prob and gradient buffers", i);
    for (int32_t i = 0; i < n; i++) {
        mbs[i].indexer_loss = 0.0f;
        if (has_mtp_loss(&mbs[i]))
            mbs[i].mtp_loss = 0.0f;
    }
    bool pipelined = par && DSARL_PARALLEL_HAS_GROUPS(par) && par->pp_size > 1 && par->pp &&
                     DSARL_MODEL_HAS(ops, stage_forward) && DSARL_MODEL_HAS(ops, stage_backward) &&
                     DSARL_MODEL_HAS(ops, stage_transfer);
    // without the stage ops a pipelined model runs its stages in turn inside train_forward / train_backward
    if (!pipelined)
        return run_in_order(ops, model, mbs, n, loss, user, counts, err);
    schedule s = {.ops = ops, .model = model, .mbs = mbs, .n = n, .stages = par->pp_size,
                  .stage = dsarl_group_rank(par->pp), .loss = loss, .user = user};
    if (!(s.offset = malloc((size_t)(n + 1) * sizeof(int64_t))))
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for %d microbatches", n);
    s.offset[0] = 0;
    for (int32_t i = 0; i < n; i++)
        s.offset[i + 1] = s.offset[i] + (mbs[i].batch->n_tokens > 0 ? mbs[i].batch->n_tokens : 0);
    int rc = (s.shared = malloc((size_t)(s.offset[n] + 1) * sizeof(float)))
                 ? DSARL_OK
                 : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for %lld pipeline log-probs", (long long)s.offset[n]);
    if (rc == 0)
        rc = run_1f1b(&s, err);
    if (rc == 0)
        rc = share_results(&s, par->pp, err);
    for (int32_t i = 0; rc == 0 && counts && i < n; i++)
        counts->train_pass_tokens += mbs[i].batch->n_tokens;
    free(s.shared), free(s.offset);
    return rc;
}
