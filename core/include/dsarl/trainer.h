/* trainer.h: services shared by the training algorithms (GRPO, SFT) and the CLI commands that drive a model.
 * Not part of the plugin ABI: algorithms link libdsarl and call these; nothing here is a plugin slot.
 *   - the session: device -> DSA -> model -> tokenizer with the vocabulary check, then resume and metrics;
 *   - pass accounting: tokens through forward-only passes and through training passes;
 *   - the training pass: train_forward/train_backward when the model has them (ABI 1.2), forward_logprobs then
 *     backward otherwise;
 *   - the optimizer slice tail: data-parallel gradient reduction -> grad norm -> clip -> lr -> step;
 *   - the loop tick's one deadline rule. */
#ifndef DSARL_TRAINER_H
#define DSARL_TRAINER_H

#include "dsarl/checkpoint.h"
#include "dsarl/metrics.h"
#include "dsarl/ops/device.h"
#include "dsarl/ops/dsa.h"
#include "dsarl/optimizer.h"
#include "dsarl/plugin.h"
#include "dsarl/tokenizer.h"

DSARL_BEGIN_DECLS

/* ABI 1.4: the run's guard against non-finite steps. A step whose loss or gradient norm is NaN or infinite is
 * skipped (no update, gradients zeroed) and reported; max_consecutive skipped in a row end the run. */
typedef struct dsarl_nonfinite_guard {
    uint32_t struct_size;       /* sizeof(dsarl_nonfinite_guard) of the caller's build */
    int64_t max_consecutive;    /* policy.max_consecutive_nonfinite_steps (>= 1) */
    int64_t consecutive;        /* optimizer steps skipped in a row so far */
    int64_t skipped;            /* optimizer steps skipped in the whole run (this process) */
    int64_t calls;              /* guarded optimizer steps so far, skipped or not (this process) */
    /* Test hook, never set by a recipe: the guarded calls (1-based, this process) whose gradient norm is replaced
     * by NaN, as a poisoned gradient would make it; from DSARL_TEST_POISON_GRAD="3" or "3-5". 0 = off. */
    int64_t poison_first, poison_last;
} dsarl_nonfinite_guard;

/* ABI 1.4: reads policy.max_consecutive_nonfinite_steps (default 3) and the DSARL_TEST_POISON_GRAD hook. */
DSARL_API int dsarl_nonfinite_guard_from_recipe(const dsarl_node *root, dsarl_nonfinite_guard *guard,
                                                dsarl_error *err);

/* What a session is built from. Only device_ops is required: without dsa_ops the session is a device alone,
 * without model_ops it stops after the DSA backend, without tokenizer it loads none. */
typedef struct dsarl_session_config {
    uint32_t struct_size;                 /* sizeof(dsarl_session_config) of the caller's build */
    const dsarl_host *host;
    const dsarl_node *recipe;             /* resolved recipe root, or NULL (the CLI's fixed settings) */
    const dsarl_parallel *parallel;       /* NULL = a single process */
    uint64_t seed;                        /* device sampling streams and the model's initial weights */
    int32_t threads;                      /* CPU threads; 0 = the device's default */
    const dsarl_device_ops *device_ops;
    const dsarl_dsa_ops *dsa_ops;
    const dsarl_model_ops *model_ops;
    const dsarl_model_ops *model_ops_fallback; /* tried when model_ops refuses the checkpoint (DSARL_E_UNSUPPORTED);
                                                * NULL = none */
    const char *model_dir;                /* Hugging Face directory, or NULL for a recipe-configured model */
    const char *tokenizer;                /* "byte", a tokenizer.json or a directory holding one; NULL = none */
} dsarl_session_config;

/* An open session; dsarl_session_close releases it in reverse order. */
typedef struct dsarl_session {
    dsarl_session_config config;
    dsarl_device *device;
    dsarl_dsa_context *dsa;
    const dsarl_model_ops *model_ops;     /* the ops that built model (config.model_ops or the fallback) */
    dsarl_model *model;
    dsarl_tokenizer *tokenizer;
    dsarl_metrics *log;                   /* set by dsarl_session_start */
    dsarl_nonfinite_guard guard;          /* ABI 1.4: policy.max_consecutive_nonfinite_steps, set by session_open */
    char model_dir[4096];                 /* config.model_dir as found: a hub id becomes its cache snapshot */
    char tokenizer_path[4096];            /* config.tokenizer as found, likewise */
} dsarl_session;

/* Opens device -> DSA -> model -> tokenizer, then checks that the model's vocabulary covers the tokenizer's ids.
 * On failure *s holds what was built; dsarl_session_close releases it. */
DSARL_API int dsarl_session_open(const dsarl_session_config *config, dsarl_session *s, dsarl_error *err);

/* Another model from the session's configuration (a frozen reference policy: the same initial weights); the
 * caller destroys it with s->model_ops->destroy. */
DSARL_API int dsarl_session_create_model(const dsarl_session *s, dsarl_model **out, dsarl_error *err);

/* Resumes from the newest complete checkpoint under ckpt (when enabled; state->step = -1 when there is none or
 * checkpointing is off) and sets loader to its position, then opens the metrics with log_cfg (its resume_step
 * set from the checkpoint) into s->log. Every rank of a multi-process run calls it (each reads its optimizer shard
 * under a distributed optimizer); only world rank 0 opens the metrics, the others get s->log = NULL, on which the
 * dsarl_metrics_* calls do nothing. */
DSARL_API int dsarl_session_start(dsarl_session *s, const dsarl_checkpoint_config *ckpt, dsarl_dataloader *loader,
                                  dsarl_metrics_config *log_cfg, dsarl_trainer_state *state, dsarl_error *err);

/* Saves the session's model, state and s->config.recipe as checkpoint step state->step: dsarl_checkpoint_save in a
 * single process, dsarl_checkpoint_save_group over the run's world (optimizer shards over dp_cp under a
 * distributed optimizer) otherwise. Collective: every rank calls it. */
DSARL_API int dsarl_session_save_checkpoint(const dsarl_session *s, const dsarl_checkpoint_config *ckpt,
                                            const dsarl_trainer_state *state, char *saved_dir, size_t size,
                                            dsarl_error *err);

/* Releases the metrics, tokenizer, model, DSA backend and device; a zeroed or partly opened session is fine. */
DSARL_API void dsarl_session_close(dsarl_session *s);

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

/* ABI 1.4: one microbatch of dsarl_trainer_train_microbatches. */
typedef struct dsarl_train_microbatch {
    uint32_t struct_size;
    const dsarl_token_batch *batch;
    const int32_t *targets;  /* (T) next-token ids, < 0 ignored */
    float *logprobs;         /* (T) out: the training pass's log-probs, on every rank */
    float *dlogprobs;        /* (T) the loss callback's d loss / d logprobs (may alias logprobs) */
    float indexer_loss;      /* out: the indexer KL loss of the microbatch (every stage's layers) */
    /* ABI 1.5, for models that train MTP layers (model op mtp_loss): in, token_mask (T, may be NULL) the positions
     * the caller's loss counts and norm_tokens (> 0) the count it divides by (0: the microbatch's own mean); out,
     * mtp_loss the MTP loss the microbatch's backward added (0 without MTP). */
    const float *token_mask;
    double norm_tokens;
    float mtp_loss;
} dsarl_train_microbatch;

/* ABI 1.4: turns mb->logprobs of microbatch `index` into mb->dlogprobs (and whatever the algorithm accumulates:
 * called exactly once per microbatch, in microbatch order, on every rank). */
typedef int (*dsarl_microbatch_loss_fn)(void *user, int32_t index, dsarl_train_microbatch *mb, dsarl_error *err);

/* ABI 1.4: the forward and backward of the n microbatches of one optimizer slice, ACCUMULATING into the
 * gradients; loss turns each one's log-probs into their gradient. One process (or no pipeline): forward, loss,
 * backward per microbatch. Under pipeline parallelism (parallel->pp_size > 1) with a model that has the stage ops:
 * Megatron's 1F1B schedule (pp - 1 - stage warm-up forwards, then one forward one backward, then the cool-down
 * backwards), so a stage holds at most pp microbatches; the last stage calls loss as each forward ends, and the
 * log-probs and indexer losses then reach every pp rank, whose loss calls follow in order. Collective over pp.
 * Counted in counts->train_pass_tokens. */
DSARL_API int dsarl_trainer_train_microbatches(const dsarl_model_ops *ops, dsarl_model *model,
                                               const dsarl_parallel *parallel, dsarl_train_microbatch *mbs,
                                               int32_t n, dsarl_microbatch_loss_fn loss, void *user,
                                               dsarl_pass_counts *counts, dsarl_error *err);

/* The tail of one optimizer slice, after its microbatches accumulated gradients: the data-parallel reduction of the
 * gradients (model op reduce_gradients: a sum over dp_cp, so the loss must be scaled by the GLOBAL token or
 * sequence count), gradient norm (*grad_norm), clip to max_grad_norm (<= 0: off), AdamW step with adam's settings
 * at learning rate lr. Collective over dp_cp when the run has several data-parallel ranks. */
DSARL_API int dsarl_trainer_optimizer_step(const dsarl_model_ops *ops, dsarl_model *model,
                                           const dsarl_optimizer_params *adam, double lr, double max_grad_norm,
                                           double *grad_norm, dsarl_error *err);

/* ABI 1.4: dsarl_trainer_optimizer_step behind the session's guard. A non-finite loss (the caller's value, named
 * loss_name in the report) or gradient norm skips the update: the gradients are zeroed, one warning names the
 * metric (and, in one process, the first parameter whose gradient is not finite) and the optimizer step, *skipped
 * is true and *grad_norm the non-finite norm. The max_consecutive-th skip in a row fails (DSARL_E_INTERNAL: the
 * CLI's exit status 1) naming the key. Collective like dsarl_trainer_optimizer_step (every rank sees the reduced
 * norm, so every rank skips alike). */
DSARL_API int dsarl_session_optimizer_step(dsarl_session *s, const dsarl_optimizer_params *adam, double lr,
                                           double max_grad_norm, const char *loss_name, double loss,
                                           double *grad_norm, bool *skipped, dsarl_error *err);

/* The one deadline rule (checkpointing.checkpoint_must_save_by): true when elapsed_s since this process's run
 * start plus one more step at this run's average step time (elapsed_s / steps_this_run) would pass the deadline.
 * False without a deadline or before the first step of this run. */
DSARL_API bool dsarl_trainer_deadline_near(const dsarl_checkpoint_config *ckpt, double elapsed_s,
                                           int64_t steps_this_run);

DSARL_END_DECLS

#endif /* DSARL_TRAINER_H */
