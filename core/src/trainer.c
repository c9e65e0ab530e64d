/* trainer.c: the session, the training pass, the optimizer slice tail and the deadline rule shared by the
 * algorithms and the CLI. */
#include <inttypes.h>
#include <string.h>

#include "dsarl/hf_hub.h"
#include "dsarl/log.h"
#include "dsarl/recipe.h"
#include "dsarl/trainer.h"

static int create_model(const dsarl_session *s, const dsarl_model_ops *ops, dsarl_model **out, dsarl_error *err)
{
    const dsarl_session_config *c = &s->config;
    static const dsarl_parallel single = DSARL_PARALLEL_SINGLE;
    dsarl_model_config mc = {.struct_size = sizeof mc, .host = c->host, .recipe = c->recipe,
                             .model_dir = c->model_dir, .device_ops = c->device_ops, .device = s->device,
                             .dsa_ops = c->dsa_ops, .dsa = s->dsa, .parallel = c->parallel ? c->parallel : &single,
                             .seed = c->seed};
    return ops->create(&mc, out, err);
}

// A model or tokenizer named by hub id is read from the Hugging Face cache at policy.model_revision (the
// tokenizer too when it names the same repository); a local path stays as it is.
static int find_model_files(dsarl_session *s, dsarl_error *err)
{
    const char *revision = NULL;
    if (s->config.recipe)
        DSARL_TRY(dsarl_recipe_string_or(s->config.recipe, "policy.model_revision", NULL, &revision, err));
    const char *model = s->config.model_dir, *tokenizer = s->config.tokenizer;
    if (model) {
        DSARL_TRY(dsarl_hf_resolve(model, revision, "policy.model_name", s->model_dir, sizeof s->model_dir, err));
        s->config.model_dir = s->model_dir;
    }
    if (tokenizer && dsarl_hf_is_hub_id(tokenizer)) {
        const char *tok_revision = model && strcmp(model, tokenizer) == 0 ? revision : NULL;
        DSARL_TRY(dsarl_hf_resolve(tokenizer, tok_revision, "policy.tokenizer.name", s->tokenizer_path,
                                   sizeof s->tokenizer_path, err));
        s->config.tokenizer = s->tokenizer_path;
    }
    return DSARL_OK;
}

int dsarl_session_open(const dsarl_session_config *config, dsarl_session *s, dsarl_error *err)
{
    memset(s, 0, sizeof *s);
    if (!config || config->struct_size < sizeof *config || !config->device_ops)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_session_open: needs a dsarl_session_config with device_ops");
    s->config = *config;
    DSARL_TRY(dsarl_nonfinite_guard_from_recipe(config->recipe, &s->guard, err));
    static const dsarl_parallel single = DSARL_PARALLEL_SINGLE;
    const dsarl_session_config *c = &s->config;
    DSARL_TRY(find_model_files(s, err));
    dsarl_device_config dc = {.struct_size = sizeof dc, .recipe = c->recipe,
                              .parallel = c->parallel ? c->parallel : &single, .threads = c->threads,
                              .seed = c->seed};
    if (dc.parallel->world_size > 1 && !dsarl_device_has_collectives(c->device_ops))
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "device '%s' has no collectives (the ABI 1.3 slots all_reduce ... "
                          "recv), so it runs one process only, but this run has %d ranks", c->device_ops->common.name,
                          dc.parallel->world_size);
    DSARL_TRY(c->device_ops->create(&dc, &s->device, err));
    if (!c->dsa_ops)
        return DSARL_OK;
    DSARL_TRY(c->dsa_ops->create(c->device_ops, s->device, c->recipe, &s->dsa, err));
    if (c->model_ops) {
        s->model_ops = c->model_ops;
        int rc = create_model(s, c->model_ops, &s->model, err);
        if (rc == DSARL_E_UNSUPPORTED && c->model_ops_fallback) {
            s->model_ops = c->model_ops_fallback;
            rc = create_model(s, c->model_ops_fallback, &s->model, err);
        }
        DSARL_TRY(rc);
        const dsarl_parallel *par = dc.parallel;
        if (DSARL_PARALLEL_HAS_GROUPS(par) && dsarl_group_size(par->dp_cp) > 1 &&
            !DSARL_MODEL_HAS(s->model_ops, reduce_gradients))
            return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "model '%s' has no reduce_gradients (ABI 1.3), so it trains "
                              "on one data-parallel rank only, but this run has %d (dp_cp)", s->model_ops->common.name,
                              dsarl_group_size(par->dp_cp));
    }
    if (c->tokenizer) {
        DSARL_TRY(dsarl_tokenizer_load(c->tokenizer, &s->tokenizer, err));
        DSARL_TRY(dsarl_tokenizer_set_chat_kwargs_from_recipe(s->tokenizer, c->recipe,
                                                              "policy.tokenizer.chat_template_kwargs", err));
    }
    if (s->model && s->tokenizer && s->model_ops->vocab_size(s->model) < dsarl_tokenizer_vocab_size(s->tokenizer))
        return DSARL_FAIL(err, DSARL_E_INVALID, "the tokenizer '%s' has %d ids but the model's vocabulary is %" PRId64
                          "; policy.model_config.vocab_size must cover it", c->tokenizer,
                          dsarl_tokenizer_vocab_size(s->tokenizer), s->model_ops->vocab_size(s->model));
    return DSARL_OK;
}

int dsarl_session_create_model(const dsarl_session *s, dsarl_model **out, dsarl_error *err)
{
    if (!s->model_ops || !s->dsa)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_session_create_model: the session has no model plugin");
    return create_model(s, s->model_ops, out, err);
}

// The run's world group and the group its optimizer state is sharded over (NULL: not sharded).
static const dsarl_group *world_group(const dsarl_session *s)
{
    const dsarl_parallel *p = s->config.parallel;
    return p && DSARL_PARALLEL_HAS_GROUPS(p) ? p->world : NULL;
}

// Tensor, pipeline or expert parallelism: the ranks of one replica hold different shards of the model.
static bool model_parallel(const dsarl_session *s)
{
    const dsarl_parallel *p = s->config.parallel;
    return p && DSARL_PARALLEL_HAS_GROUPS(p) && (p->tp_size > 1 || p->pp_size > 1 || p->ep_size > 1);
}

// Under model parallelism every rank's optimizer state is its own (one file per world rank); else the
// distributed optimizer's dp_cp shards, or one file.
static const dsarl_group *shard_group(const dsarl_session *s)
{
    const dsarl_parallel *p = s->config.parallel;
    if (model_parallel(s))
        return p->world;
    return p && DSARL_PARALLEL_HAS_GROUPS(p) && p->distributed_optimizer ? p->dp_cp : NULL;
}

int dsarl_session_start(dsarl_session *s, const dsarl_checkpoint_config *ckpt, dsarl_dataloader *loader,
                        dsarl_metrics_config *log_cfg, dsarl_trainer_state *state, dsarl_error *err)
{
    memset(state, 0, sizeof *state);
    state->step = -1;
    log_cfg->resume_step = -1;
    if (ckpt && ckpt->enabled) {
        char dir[4096];
        DSARL_TRY(dsarl_checkpoint_resume_checked(ckpt, s->config.recipe, dsarl_group_rank(world_group(s)) == 0,
                                                  s->model_ops, s->model, loader, state, shard_group(s), dir,
                                                  sizeof dir, err));
        if (state->step >= 0) {
            log_cfg->resume_step = state->step;
            dsarl_log(DSARL_LOG_INFO, "resumed from %s (step %" PRId64 ")", dir, state->step);
        }
    }
    // one process logs: the others compute the same (reduced) metrics and write nothing
    if (dsarl_group_rank(world_group(s)) != 0)
        return DSARL_OK;
    return dsarl_metrics_open(log_cfg, &s->log, err);
}

int dsarl_session_save_checkpoint(const dsarl_session *s, const dsarl_checkpoint_config *ckpt,
                                  const dsarl_trainer_state *state, char *saved_dir, size_t size, dsarl_error *err)
{
    return dsarl_checkpoint_save_group(ckpt, s->model_ops, s->model, state, s->config.recipe, world_group(s),
                                       shard_group(s), dsarl_group_size(world_group(s)) > 1, saved_dir, size, err);
}

void dsarl_session_close(dsarl_session *s)
{
    const dsarl_session_config *c = &s->config;
    dsarl_metrics_close(s->log);
    dsarl_tokenizer_free(s->tokenizer);
    if (s->model)
        s->model_ops->destroy(s->model);
    if (s->dsa)
        c->dsa_ops->destroy(s->dsa);
    if (s->device)
        c->device_ops->destroy(s->device);
    memset(s, 0, sizeof *s);
}

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
    // the data-parallel sum of the gradients (or of this rank's shard of them), before the norm every rank must
    // agree on; free in a single process, and session_open refused a multi-rank run of a model without it
    if (DSARL_MODEL_HAS(ops, reduce_gradients))
        DSARL_TRY(ops->reduce_gradients(model, err));
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
