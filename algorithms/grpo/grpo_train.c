/* grpo_train.c: the GRPO job in NeMo RL's order: options and setup (the trainer session: device, DSA, policy,
 * tokenizer; data, environment, reference policy, generation engine), then per step grpo_train_step (grpo_step.c)
 * -> validation -> checkpoint -> stop conditions (max_num_steps, max_num_epochs, stop_at_validation_metric, a stop
 * signal, checkpoint_must_save_by). Everything random is derived from (grpo.seed, step) or restored from the
 * checkpoint, so a resumed CPU run is bit-identical to an uninterrupted one. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grpo_loop.h"

const dsarl_key_spec grpo_train_keys[] = {
    {"policy.tokenizer.name", DSARL_KEY_STRING, NULL, "\"byte\", a tokenizer.json, or a directory holding one; "
     "null = policy.model_name", DSARL_KEY_NULLABLE},
    {"policy.tokenizer.chat_template", DSARL_KEY_STRING, NULL, "glm | plain | none; null = the tokenizer's default",
     DSARL_KEY_NULLABLE},
    {"policy.train_micro_batch_size", DSARL_KEY_INT, NULL, "sequences per forward/backward microbatch", 0},
    {"policy.logprob_batch_size", DSARL_KEY_INT, NULL, "sequences per log-prob forward; null = train micro batch",
     DSARL_KEY_NULLABLE},
    {"policy.generation.max_new_tokens", DSARL_KEY_INT, NULL, "generated tokens per response at most", 0},
    {"policy.generation.temperature", DSARL_KEY_FLOAT, NULL, "sampling temperature for training rollouts", 0},
    {"policy.generation.top_p", DSARL_KEY_FLOAT, NULL, "nucleus sampling mass; 1 = off", DSARL_KEY_NULLABLE},
    {"policy.generation.top_k", DSARL_KEY_INT, NULL, "top-k sampling; null = off", DSARL_KEY_NULLABLE},
    {"policy.generation.val_temperature", DSARL_KEY_FLOAT, NULL, "validation temperature (0 = greedy)",
     DSARL_KEY_NULLABLE},
    {"policy.generation.val_top_p", DSARL_KEY_FLOAT, NULL, "validation top-p", DSARL_KEY_NULLABLE},
    {"policy.generation.val_top_k", DSARL_KEY_INT, NULL, "validation top-k", DSARL_KEY_NULLABLE},
    {"policy.generation.stop_token_ids", DSARL_KEY_LIST, NULL, "extra stop token ids (EOS always stops)",
     DSARL_KEY_NULLABLE},
    {"policy.generation.stop_strings", DSARL_KEY_LIST, NULL, "strings that end a response (kept in it)",
     DSARL_KEY_NULLABLE},
    {"data.max_input_seq_length", DSARL_KEY_INT, NULL, "longer prompts are truncated and get loss multiplier 0",
     DSARL_KEY_NULLABLE},
    {"data.shuffle", DSARL_KEY_BOOL, NULL, "reshuffle the training prompts every epoch", 0},
};
const size_t grpo_train_n_keys = DSARL_ARRAY_LEN(grpo_train_keys);

/* --- setup ---------------------------------------------------------------------------------------------------- */

static int read_options(trainer *tr, dsarl_error *err)
{
    const dsarl_node *root = tr->root;
    loop_options *o = &tr->opt;
    DSARL_TRY(dsarl_recipe_int_or(root, "policy.train_micro_batch_size", 4, &o->micro_batch, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "policy.logprob_batch_size", o->micro_batch, &o->logprob_batch, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "policy.max_total_sequence_length", 512, &o->max_total_len, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "data.max_input_seq_length", o->max_total_len, &o->max_input_len, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "policy.generation.max_new_tokens", o->max_total_len, &o->max_new_tokens,
                                  err));
    double t, p, vt, vp;
    int64_t k, vk;
    DSARL_TRY(dsarl_recipe_double_or(root, "policy.generation.temperature", 1.0, &t, err));
    DSARL_TRY(dsarl_recipe_double_or(root, "policy.generation.top_p", 1.0, &p, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "policy.generation.top_k", 0, &k, err));
    DSARL_TRY(dsarl_recipe_double_or(root, "policy.generation.val_temperature", t, &vt, err));
    DSARL_TRY(dsarl_recipe_double_or(root, "policy.generation.val_top_p", p, &vp, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "policy.generation.val_top_k", k, &vk, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "data.shuffle", true, &o->shuffle, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "logger.num_val_samples_to_print", 0, &o->num_val_samples_to_print, err));
    DSARL_TRY(dsarl_recipe_string_or(root, "policy.tokenizer.name", NULL, &o->tokenizer_name, err));
    if (!o->tokenizer_name)
        DSARL_TRY(dsarl_recipe_string_or(root, "policy.model_name", NULL, &o->tokenizer_name, err));
    DSARL_TRY(dsarl_recipe_string_or(root, "policy.tokenizer.chat_template", NULL, &o->chat_template, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "policy.router_replay.enabled", false, &o->router_replay, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "policy.dsa_index_replay.enabled", false, &o->index_replay, err));
    o->temperature = (float)t;
    o->top_p = (float)p;
    o->top_k = (int32_t)k;
    o->val_temperature = (float)vt;
    o->val_top_p = (float)vp;
    o->val_top_k = (int32_t)vk;
#define CHECK(cond, key, ...)                                                                   \
    do {                                                                                        \
        if (!(cond))                                                                            \
            return dsarl_recipe_fail(root, key, err, DSARL_E_INVALID, __VA_ARGS__);             \
    } while (0)
    CHECK(o->micro_batch >= 1, "policy.train_micro_batch_size", "must be >= 1, got %" PRId64, o->micro_batch);
    CHECK(tr->cfg.train_global_batch_size % o->micro_batch == 0, "policy.train_micro_batch_size",
          "must divide policy.train_global_batch_size (%" PRId64 "), got %" PRId64, tr->cfg.train_global_batch_size,
          o->micro_batch);
    /* data parallelism: each rank generates whole prompt groups and trains whole microbatches of every optimizer
     * step, so the run is the one-process run (docs/parallel.md) */
    const dsarl_parallel *par = tr->ctx->parallel;
    int64_t dp = par && par->dp_size > 1 ? par->dp_size : 1;
    CHECK(tr->cfg.num_prompts_per_step % dp == 0, "grpo.num_prompts_per_step",
          "(%" PRId64 ") must be divisible by the data-parallel size %" PRId64 ", so that every rank generates whole "
          "prompt groups", tr->cfg.num_prompts_per_step, dp);
    CHECK(tr->cfg.train_global_batch_size % (dp * o->micro_batch) == 0, "policy.train_global_batch_size",
          "(%" PRId64 ") must be divisible by the data-parallel size %" PRId64 " x policy.train_micro_batch_size "
          "(%" PRId64 "), so that every rank trains whole microbatches of each optimizer step",
          tr->cfg.train_global_batch_size, dp, o->micro_batch);
    int64_t pp = par && par->pp_size > 1 ? par->pp_size : 1, vpp = dsarl_parallel_vpp(par);
    CHECK(vpp == 1 || tr->cfg.train_global_batch_size / (dp * o->micro_batch) % pp == 0,
          "policy.train_global_batch_size", "(%" PRId64 ") makes %" PRId64 " microbatches per data-parallel rank, "
          "which the interleaved schedule (virtual_pipeline_model_parallel_size %" PRId64 ") needs to be a multiple "
          "of pipeline_model_parallel_size %" PRId64 ", as Megatron does", tr->cfg.train_global_batch_size,
          tr->cfg.train_global_batch_size / (dp * o->micro_batch), vpp, pp);
    CHECK(tr->cfg.val_batch_size < 1 || tr->cfg.val_batch_size % dp == 0, "grpo.val_batch_size",
          "(%" PRId64 ") must be divisible by the data-parallel size %" PRId64 ", so that every rank generates an "
          "equal share of each validation batch", tr->cfg.val_batch_size, dp);
    /* the recorded rows follow each rollout's tokens, through the rollout gather under data parallelism (expert
     * parallelism included: a rank routes its own tokens, replayed or not, before they go to the experts' owners;
     * tensor parallelism too: the model takes its sequence-parallel block of the rows; pipeline stages too: each
     * records its own layers and the rows are merged over the stages); context-parallel chunks do not carry them */
    const char *replay_key = o->router_replay ? "policy.router_replay.enabled" : "policy.dsa_index_replay.enabled";
    bool rows_stay = !par || par->cp_size <= 1;
    CHECK(!(o->router_replay || o->index_replay) || rows_stay, replay_key,
          "is true, but routing replay runs in one process or under data, expert, tensor and pipeline parallelism; "
          "this run has %d ranks (tp %d, cp %d, pp %d, ep %d, dp %d): turn it off or set cp to 1", par->world_size,
          par->tp_size, par->cp_size, par->pp_size, par->ep_size, par->dp_size);
    CHECK(!(o->router_replay || o->index_replay) || tr->cfg.max_rollout_turns == 1, replay_key,
          "is true, but routing replay covers single-turn rollouts only; grpo.max_rollout_turns is %" PRId64,
          tr->cfg.max_rollout_turns);
    CHECK(o->num_val_samples_to_print >= 0, "logger.num_val_samples_to_print", "must be >= 0, got %" PRId64,
          o->num_val_samples_to_print);
    CHECK(o->logprob_batch >= 1, "policy.logprob_batch_size", "must be >= 1, got %" PRId64, o->logprob_batch);
    CHECK(o->max_total_len >= 2, "policy.max_total_sequence_length", "must be >= 2, got %" PRId64, o->max_total_len);
    CHECK(o->max_input_len >= 1 && o->max_input_len <= o->max_total_len, "data.max_input_seq_length",
          "must be in [1, policy.max_total_sequence_length = %" PRId64 "], got %" PRId64, o->max_total_len,
          o->max_input_len);
    CHECK(o->max_new_tokens >= 1, "policy.generation.max_new_tokens", "must be >= 1, got %" PRId64,
          o->max_new_tokens);
    CHECK(isfinite(t) && t > 0.0, "policy.generation.temperature", "must be > 0 for training rollouts, got %g", t);
    CHECK(p > 0.0 && p <= 1.0, "policy.generation.top_p", "must be in (0, 1], got %g", p);
    CHECK(k >= -1, "policy.generation.top_k", "must be >= 1, or null / 0 / -1 for off, got %" PRId64, k);
    CHECK(isfinite(vt) && vt >= 0.0, "policy.generation.val_temperature", "must be >= 0 (0 = greedy), got %g", vt);
    CHECK(vp > 0.0 && vp <= 1.0, "policy.generation.val_top_p", "must be in (0, 1], got %g", vp);
    CHECK(o->tokenizer_name != NULL, "policy.tokenizer.name",
          "is needed (\"byte\" for the byte tokenizer, or a tokenizer.json path) when policy.model_name is null");
    const dsarl_node *stops = dsarl_node_get(root, "policy.generation.stop_token_ids");
    if (stops && dsarl_node_kind(stops) == DSARL_NODE_LIST) {
        CHECK(dsarl_node_count(stops) <= 15, "policy.generation.stop_token_ids", "may list at most 15 ids");
        for (size_t i = 0; i < dsarl_node_count(stops); i++) {
            const dsarl_node *c = dsarl_node_child_at(stops, i);
            CHECK(dsarl_node_kind(c) == DSARL_NODE_INT && dsarl_node_as_int(c) >= 0, "policy.generation.stop_token_ids",
                  "must hold non-negative integers (item %zu is not)", i);
            o->stop_ids[o->n_stop_ids++] = (int32_t)dsarl_node_as_int(c);
        }
    }
    const dsarl_node *strs = dsarl_node_get(root, "policy.generation.stop_strings");
    if (strs && dsarl_node_kind(strs) == DSARL_NODE_LIST) {
        CHECK(dsarl_node_count(strs) <= 16, "policy.generation.stop_strings", "may list at most 16 strings");
        for (size_t i = 0; i < dsarl_node_count(strs); i++) {
            const dsarl_node *c = dsarl_node_child_at(strs, i);
            CHECK(dsarl_node_kind(c) == DSARL_NODE_STRING && dsarl_node_text(c)[0], "policy.generation.stop_strings",
                  "must hold non-empty strings (item %zu is not)", i);
            o->stop_strings[o->n_stop_strings++] = dsarl_node_text(c);
        }
    }
#undef CHECK
    return DSARL_OK;
}

static int pick_environment(trainer *tr, dsarl_error *err)
{
    const dsarl_run_context *ctx = tr->ctx;
    const char *want = NULL;
    static const char *const keys[] = {"data.train.env_name", "data.env_name", "data.default.env_name"};
    for (size_t i = 0; i < 3 && !want; i++)
        DSARL_TRY(dsarl_recipe_string_or(tr->root, keys[i], NULL, &want, err));
    for (int32_t i = 0; i < ctx->n_environments; i++) {
        if (!want || strcmp(ctx->environment_names[i], want) == 0) {
            tr->env_ops = ctx->environment_ops[i];
            want = ctx->environment_names[i];
            break;
        }
    }
    if (!tr->env_ops)
        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "no environment plugin '%s' was selected for data.*.env_name",
                          want ? want : "(none)");
    char path[256];
    snprintf(path, sizeof path, "env.%s", want);
    DSARL_TRY(tr->env_ops->create(tr->root, dsarl_node_get(tr->root, path), &tr->env, err));
    return grpo_check_environment(tr, err);
}

void grpo_trainer_free(trainer *tr)
{
    const dsarl_run_context *ctx = tr->ctx;
    if (tr->engine)
        ctx->generation_ops->destroy(tr->engine);
    if (tr->gen_model)
        ctx->model_ops->destroy(tr->gen_model);
    if (tr->remote) { // a rank that failed ends the job anyway: stopping the generation rank is for a clean end
        dsarl_error ignored;
        if (grpo_remote_stop(tr, &ignored) < 0)
            dsarl_log(DSARL_LOG_WARN, "stopping the generation rank: %s", ignored.message);
    }
    grpo_async_free(tr);
    if (tr->reference)
        ctx->model_ops->destroy(tr->reference);
    dsarl_session_close(&tr->session);
    if (tr->env)
        tr->env_ops->destroy(tr->env);
    dsarl_dataloader_free(tr->loader);
    dsarl_dataset_free(tr->train_set);
    dsarl_dataset_free(tr->val_set);
}

int grpo_trainer_read_options(trainer *tr, dsarl_error *err)
{
    DSARL_TRY(read_options(tr, err));
    DSARL_TRY(dsarl_optimizer_params_from_recipe(tr->root, &tr->adam, err));
    DSARL_TRY(dsarl_checkpoint_config_from_recipe(tr->root, &tr->ckpt, err));
    memset(&tr->log_cfg, 0, sizeof tr->log_cfg);
    DSARL_TRY(dsarl_metrics_config_from_recipe(tr->root, &tr->log_cfg, err));
    return DSARL_OK;
}

/* Routing replay: the widths of the recorded rows, refusing a run whose model or generation cannot record. */
static int open_replay(trainer *tr, dsarl_error *err)
{
    const loop_options *o = &tr->opt;
    if (!o->router_replay && !o->index_replay)
        return DSARL_OK;
    const char *key = o->router_replay ? "policy.router_replay.enabled" : "policy.dsa_index_replay.enabled";
    const dsarl_model_ops *mo = tr->ctx->model_ops;
    if (!DSARL_MODEL_HAS(mo, routing_shape))
        return dsarl_recipe_fail(tr->root, key, err, DSARL_E_UNSUPPORTED, "is true, but model plugin '%s' cannot "
                                 "record or replay its routing", mo->common.name);
    if (!tr->engine && !tr->remote) // a dedicated generation rank's engine records (grpo_remote.c sends the rows)
        return dsarl_recipe_fail(tr->root, key, err, DSARL_E_UNSUPPORTED, "is true, but the built-in sampler does "
                                 "not record routing; set policy.generation.backend to an engine that does (native)");
    dsarl_routing_shape sh = {.struct_size = sizeof sh};
    DSARL_TRY(mo->routing_shape(tr->model, &sh, err));
    tr->replay_w_experts = o->router_replay ? sh.moe_layers * sh.experts_per_token : 0;
    tr->replay_w_indices = o->index_replay ? sh.index_layers * sh.index_topk : 0;
    return DSARL_OK;
}

/* policy.generation.colocated.enabled false: the engine's own copy of the weights (grpo_trainer_start refits it
 * once the policy is restored), refused where this process cannot hold one. */
static int open_generation_copy(trainer *tr, dsarl_error *err)
{
    if (tr->cfg.async.colocated)
        return DSARL_OK;
    const char *key = "policy.generation.colocated.enabled";
    const dsarl_run_context *ctx = tr->ctx;
    const dsarl_model_ops *mo = ctx->model_ops;
    if (!ctx->generation_ops)
        return dsarl_recipe_fail(tr->root, key, err, DSARL_E_UNSUPPORTED, "is false, but no generation plugin is "
                                 "selected: the built-in sampler reads the policy in place; set "
                                 "policy.generation.backend (native)");
    if (!mo->parameter_tensors || !mo->parameter_info || !mo->read_parameter || !mo->write_parameter)
        return dsarl_recipe_fail(tr->root, key, err, DSARL_E_UNSUPPORTED, "is false, but model plugin '%s' cannot "
                                 "read and write its tensors, which the refit of the generation copy needs",
                                 mo->common.name);
    const dsarl_parallel *par = ctx->parallel;
    if (dsarl_parallel_generation_ranks(par) > 0) { // the copy lives on the job's dedicated generation rank
        tr->remote = true;
        return DSARL_OK;
    }
    if (par && par->world_size > 1)
        return dsarl_recipe_fail(tr->root, key, err, DSARL_E_UNSUPPORTED, "is false in a run of %d ranks without "
                                 "a dedicated generation rank: launch the job with dsarl run under mpirun, which "
                                 "gives its last process to generation", par->world_size);
    return dsarl_session_create_model(&tr->session, &tr->gen_model, err);
}

int grpo_trainer_open(trainer *tr, dsarl_error *err)
{
    const dsarl_run_context *ctx = tr->ctx;
    if (!ctx->model_ops || !ctx->device_ops || !ctx->dsa_ops)
        return DSARL_FAIL(err, DSARL_E_INVALID, "GRPO needs a model, a device and a dsa plugin in the run context");
    if (!ctx->model_ops->forward_logprobs || !ctx->model_ops->backward || !ctx->model_ops->optimizer_step ||
        !ctx->model_ops->grad_norm || !ctx->model_ops->zero_grad)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "model plugin '%s' cannot train (no log-probs, backward or "
                          "optimizer step)", ctx->model_ops->common.name);
    const char *model_dir = NULL;
    DSARL_TRY(dsarl_recipe_string_or(tr->root, "policy.model_name", NULL, &model_dir, err));
    dsarl_session_config sc = {.struct_size = sizeof sc, .host = ctx->host, .recipe = tr->root,
                               .parallel = ctx->parallel, .seed = (uint64_t)tr->cfg.seed,
                               .device_ops = ctx->device_ops, .dsa_ops = ctx->dsa_ops, .model_ops = ctx->model_ops,
                               .model_dir = model_dir, .tokenizer = tr->opt.tokenizer_name};
    DSARL_TRY(dsarl_session_open(&sc, &tr->session, err));
    tr->model = tr->session.model;
    tr->tok = tr->session.tokenizer;
    if (!tr->opt.chat_template)
        tr->opt.chat_template = dsarl_tokenizer_default_template(tr->tok);
    int32_t eos = dsarl_tokenizer_eos_id(tr->tok);
    if (eos >= 0 && tr->opt.n_stop_ids < 16)
        tr->opt.stop_ids[tr->opt.n_stop_ids++] = eos;
    DSARL_TRY(dsarl_dataset_from_recipe(tr->root, "data.train", DSARL_SPLIT_TRAIN, &tr->train_set, err));
    DSARL_TRY(dsarl_dataset_from_recipe(tr->root, "data.validation", DSARL_SPLIT_VALIDATION, &tr->val_set, err));
    int64_t per_round = (int64_t)ceil((double)tr->cfg.num_prompts_per_step * tr->cfg.batch_multiplier);
    if (!tr->cfg.use_dynamic_sampling)
        per_round = tr->cfg.num_prompts_per_step;
    tr->per_round = per_round;
    DSARL_TRY(dsarl_dataloader_create(tr->train_set, (size_t)per_round, tr->opt.shuffle, 1, (uint64_t)tr->cfg.seed,
                                      &tr->loader, err));
    DSARL_TRY(pick_environment(tr, err));
    if (tr->serving && !ctx->generation_ops)
        return dsarl_recipe_fail(tr->root, "policy.generation.backend", err, DSARL_E_UNSUPPORTED, "selects no "
                                 "generation plugin, but a dedicated generation rank generates with one (native)");
    if (tr->serving) { // the generation rank: its model is the generation copy, refitted by the trainer
        DSARL_TRY(ctx->generation_ops->create(tr->root, ctx->model_ops, tr->model, &tr->engine, err));
        return open_replay(tr, err); // under routing replay it records the rows it sends with the rollouts
    }
    if (!tr->cfg.skip_reference_policy_logprobs)
        DSARL_TRY(dsarl_session_create_model(&tr->session, &tr->reference, err)); /* the initial weights, frozen */
    DSARL_TRY(open_generation_copy(tr, err));
    if (ctx->generation_ops && !tr->remote)
        DSARL_TRY(ctx->generation_ops->create(tr->root, ctx->model_ops, tr->gen_model ? tr->gen_model : tr->model,
                                              &tr->engine, err));
    DSARL_TRY(grpo_async_open(tr, err));
    return open_replay(tr, err);
}

int grpo_trainer_start(trainer *tr, dsarl_error *err)
{
    tr->log_cfg.progress = 1; /* redrawn on a terminal, one log line per step otherwise */
    tr->log_cfg.total_steps = tr->cfg.max_num_steps;
    dsarl_trainer_state st;
    DSARL_TRY(dsarl_session_start(&tr->session, &tr->ckpt, tr->loader, &tr->log_cfg, &st, err));
    tr->log = tr->session.log;
    if (tr->gen_model || tr->remote) // the generation copy starts from the policy's weights, restored or initial
        DSARL_TRY(grpo_refit(tr, NULL, err));
    if (st.step < 0)
        return DSARL_OK;
    tr->step = st.step;
    tr->consumed_samples = st.consumed_samples;
    tr->train_time_s = st.total_train_time_s;
    return DSARL_OK;
}

/* --- checkpoints and the loop ---------------------------------------------------------------------------------- */

int grpo_trainer_save_checkpoint(trainer *tr, double val_accuracy, double train_reward, dsarl_error *err)
{
    dsarl_trainer_state st;
    memset(&st, 0, sizeof st);
    st.step = tr->step;
    st.consumed_samples = tr->consumed_samples;
    st.total_train_time_s = tr->train_time_s;
    dsarl_dataloader_state loader = dsarl_dataloader_get_state(tr->loader);
    // async: the queued batches were drawn already; a resumed run redraws them (with the restored weights)
    grpo_async_resume_point(tr, &loader, &st.consumed_samples);
    DSARL_TRY(dsarl_trainer_state_set_loader(&st, "train", loader, err));
    /* rollouts draw from Philox streams keyed by (grpo.seed, step): the seed is the whole sampling state */
    dsarl_rng_state sampling = {.seed = (uint64_t)tr->cfg.seed, .stream = 0, .offset = 0};
    DSARL_TRY(dsarl_trainer_state_set_rng(&st, "sampling", sampling, err));
    if (isfinite(val_accuracy))
        DSARL_TRY(dsarl_trainer_state_set_metric(&st, "val:accuracy", val_accuracy, err));
    if (isfinite(train_reward))
        DSARL_TRY(dsarl_trainer_state_set_metric(&st, "train:reward", train_reward, err));
    char dir[4096];
    return dsarl_session_save_checkpoint(&tr->session, &tr->ckpt, &st, dir, sizeof dir, err);
}

bool grpo_any_rank(const trainer *tr, bool x)
{
    const dsarl_parallel *p = tr->ctx->parallel;
    const dsarl_group *world = p && DSARL_PARALLEL_HAS_GROUPS(p) ? p->world : NULL;
    if (dsarl_group_size(world) <= 1)
        return x;
    int32_t v = x;
    dsarl_error ignored;
    if (dsarl_group_all_reduce_host(world, &v, 1, DSARL_DTYPE_I32, DSARL_REDUCE_MAX, &ignored) < 0)
        return true; // the collective failed: stopping is the only safe choice
    return v != 0;
}

/* grpo.stop_at_validation_metric: the run stops once the named validation metric reaches the threshold (>=).
 * pass_k counts a prompt as passed when any of its val_num_generations_per_prompt responses is correct. */
static bool validation_metric_reached(const trainer *tr, const val_result *v)
{
    const char *name = tr->cfg.stop_at_validation_metric;
    if (!name)
        return false;
    double x = strcmp(name, "pass_k") == 0       ? v->pass_k
               : strcmp(name, "avg_length") == 0 ? v->avg_length
                                                 : v->accuracy;
    return isfinite(x) && x >= tr->cfg.stop_at_validation_threshold;
}

int grpo_train_run(const dsarl_run_context *ctx, grpo_run_summary *summary, dsarl_error *err)
{
    trainer tr;
    memset(&tr, 0, sizeof tr);
    tr.ctx = ctx;
    tr.root = ctx->recipe;
    grpo_run_summary sum = {.first_val_accuracy = NAN, .last_val_accuracy = NAN};
    double t_start = now_s(); /* checkpoint_must_save_by counts from the start of this process's run */
    /* everything that reads only the recipe runs first, so a bad value fails before any model is built */
    int rc = grpo_config_from_recipe(tr.root, &tr.cfg, err);
    if (rc == DSARL_OK)
        rc = grpo_trainer_read_options(&tr, err);
    tr.serving = dsarl_parallel_is_generation_rank(ctx->parallel);
    if (rc == DSARL_OK)
        rc = grpo_trainer_open(&tr, err);
    if (tr.serving) { // a dedicated generation rank: no training, no logs, no checkpoints
        if (rc == DSARL_OK)
            rc = grpo_remote_serve(&tr, err);
        if (summary)
            *summary = sum;
        grpo_trainer_free(&tr);
        return rc;
    }
    if (rc == DSARL_OK)
        rc = grpo_trainer_start(&tr, err);
    sum.first_step = tr.step;
    double val_acc = NAN, reward = NAN;
    val_result vr = {NAN, NAN, NAN};
    if (rc == DSARL_OK && tr.step == 0 && tr.cfg.val_at_start) {
        rc = grpo_validate(&tr, &vr, err);
        val_acc = vr.accuracy;
        sum.first_val_accuracy = val_acc;
        if (rc == DSARL_OK)
            rc = dsarl_metrics_commit(tr.log, 0, err);
    }
    bool stop = false;
    const char *why = "max_num_steps reached";
    while (rc == DSARL_OK && !stop) {
        if (tr.step >= tr.cfg.max_num_steps)
            break;
        bool out_of_epochs;
        rc = grpo_train_step(&tr, &reward, &out_of_epochs, err);
        if (rc < 0)
            break;
        if (out_of_epochs) {
            why = "max_num_epochs reached";
            break;
        }
        bool last = tr.step >= tr.cfg.max_num_steps;
        if (grpo_any_rank(&tr, ctx->stop_requested && *ctx->stop_requested)) {
            stop = true;
            why = "stop requested (signal)";
        }
        val_acc = NAN;
        bool periodic = tr.cfg.val_period > 0 && tr.step % tr.cfg.val_period == 0 &&
                        (tr.cfg.val_start_at < 0 || tr.step >= tr.cfg.val_start_at);
        if (periodic || (last && tr.cfg.val_at_end)) {
            vr = (val_result){NAN, NAN, NAN};
            rc = grpo_validate(&tr, &vr, err);
            if (rc < 0)
                break;
            val_acc = vr.accuracy;
            if (!isfinite(sum.first_val_accuracy))
                sum.first_val_accuracy = val_acc;
            sum.last_val_accuracy = val_acc;
            if (validation_metric_reached(&tr, &vr)) {
                stop = true;
                why = "stop_at_validation_metric reached";
            }
        }
        double t_ck = now_s();
        if (tr.ckpt.enabled && (dsarl_checkpoint_due(&tr.ckpt, tr.step, last) || stop)) {
            rc = grpo_trainer_save_checkpoint(&tr, val_acc, reward, err);
            if (rc < 0)
                break;
            rc = grpo_set_metric(&tr, "timing/train/checkpointing", now_s() - t_ck, err);
        }
        if (rc == DSARL_OK)
            rc = dsarl_metrics_commit(tr.log, tr.step, err);
        dsarl_metrics_progress(tr.log, tr.step, reward);
        if (rc == DSARL_OK && tr.ckpt.enabled && !stop && !last &&
            grpo_any_rank(&tr, dsarl_trainer_deadline_near(&tr.ckpt, now_s() - t_start, tr.step - sum.first_step))) {
            if (!dsarl_checkpoint_due(&tr.ckpt, tr.step, last))
                rc = grpo_trainer_save_checkpoint(&tr, val_acc, reward, err);
            stop = true;
            why = "checkpointing.checkpoint_must_save_by is near";
        }
    }
    if (rc == DSARL_OK)
        dsarl_log(DSARL_LOG_INFO, "GRPO finished at step %" PRId64 ": %s", tr.step, why);
    sum.last_step = tr.step;
    if (tr.log) // rank 0 only: the others log nothing
        snprintf(sum.exp_dir, sizeof sum.exp_dir, "%s", dsarl_metrics_dir(tr.log));
    if (summary)
        *summary = sum;
    grpo_trainer_free(&tr);
    return rc;
}
