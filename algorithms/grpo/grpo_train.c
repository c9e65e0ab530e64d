/* grpo_train.c: the GRPO loop in NeMo RL's order (reference section 3.1):
 *   dataloader -> chat template + tokenizer -> each prompt repeated num_generations_per_prompt times
 *   -> generation (colocated: the policy's own weights) -> environment rewards -> scaling / shaping
 *   -> advantages (+ dynamic sampling, overlong filtering) -> pack THD -> old log-probs (+ reference log-probs when
 *   the KL coefficient is > 0) -> per train_global_batch_size slice: microbatches of ClippedPGLoss + backward,
 *   gradient clip, AdamW -> metrics -> validation -> checkpoint -> stop conditions.
 * Everything random is derived from (grpo.seed, step) or restored from the checkpoint, so a resumed CPU run is
 * bit-identical to an uninterrupted one. Positions follow the model's convention: logprob j of a sequence scores
 * its token j + 1, so every per-token array here is indexed by model position. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsarl/checkpoint.h"
#include "dsarl/dataset.h"
#include "dsarl/log.h"
#include "dsarl/metrics.h"
#include "dsarl/optimizer.h"
#include "dsarl/tokenizer.h"
#include "dsarl/trainer.h"
#include "grpo_train.h"

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

/* Settings the loop reads besides grpo_config. */
typedef struct loop_options {
    int64_t micro_batch, logprob_batch;
    int64_t max_total_len, max_input_len, max_new_tokens;
    float temperature, top_p, val_temperature, val_top_p;
    int32_t top_k, val_top_k;
    int32_t stop_ids[16];
    int32_t n_stop_ids;
    const char *stop_strings[16];
    int32_t n_stop_strings;
    bool shuffle;
    int64_t num_val_samples_to_print;
    const char *tokenizer_name, *chat_template;
} loop_options;

/* One rollout: a prompt, one response, and everything the loss and the logs need about it. */
typedef struct rollout {
    const dsarl_example *example;
    char *prompt_text;
    int32_t *prompt;       /* (prompt_len) */
    int32_t prompt_len;
    int32_t *response;     /* (response_len) */
    float *response_lp;    /* (response_len) generation log-probs */
    int32_t response_len;
    uint8_t truncated;     /* max_new_tokens ended it */
    uint8_t prompt_cut;    /* the prompt was longer than data.max_input_seq_length */
    char *response_text;
    float reward;          /* after scaling and shaping */
    float raw_reward;
    dsarl_verdict verdict;
    float advantage;
    float loss_multiplier;
} rollout;

typedef struct rollout_set {
    rollout *items;
    int64_t n, cap;
} rollout_set;

typedef struct trainer {
    const dsarl_run_context *ctx;
    const dsarl_node *root;
    grpo_config cfg;
    loop_options opt;
    dsarl_optimizer_params adam;
    dsarl_checkpoint_config ckpt;
    dsarl_metrics_config log_cfg;
    dsarl_session session;     /* device, DSA, policy, tokenizer, metrics; the pointers below borrow from it */
    dsarl_model *model, *reference;
    dsarl_generator *engine;
    dsarl_tokenizer *tok;
    dsarl_dataset *train_set, *val_set;
    dsarl_dataloader *loader;
    const dsarl_environment_ops *env_ops;
    dsarl_environment *env;
    dsarl_metrics *log;
    int64_t per_round;         /* prompts per dataloader batch */
    int64_t step;              /* completed training steps */
    int64_t consumed_samples;
    double train_time_s;       /* summed over resumes */
    int64_t verifier_failures; /* this step */
    dsarl_pass_counts passes;  /* this step */
} trainer;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* splitmix64: independent seeds for (grpo.seed, purpose, step) without a stored generator. */
static uint64_t mix_seed(uint64_t seed, uint64_t purpose, uint64_t step)
{
    uint64_t z = seed ^ (purpose * 0x9E3779B97F4A7C15ull) ^ (step * 0xBF58476D1CE4E5B9ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void rollout_free(rollout *r)
{
    free(r->prompt_text);
    free(r->prompt);
    free(r->response);
    free(r->response_lp);
    free(r->response_text);
    memset(r, 0, sizeof *r);
}

static void rollout_set_free(rollout_set *s)
{
    for (int64_t i = 0; i < s->n; i++)
        rollout_free(&s->items[i]);
    free(s->items);
    memset(s, 0, sizeof *s);
}

static rollout *rollout_set_push(rollout_set *s)
{
    if (s->n == s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 64;
        rollout *p = realloc(s->items, sizeof *p * (size_t)cap);
        if (!p)
            return NULL;
        s->items = p;
        s->cap = cap;
    }
    rollout *r = &s->items[s->n++];
    memset(r, 0, sizeof *r);
    return r;
}

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
    return tr->env_ops->create(tr->root, dsarl_node_get(tr->root, path), &tr->env, err);
}

static void trainer_free(trainer *tr)
{
    const dsarl_run_context *ctx = tr->ctx;
    if (tr->engine)
        ctx->generation_ops->destroy(tr->engine);
    if (tr->reference)
        ctx->model_ops->destroy(tr->reference);
    dsarl_session_close(&tr->session);
    if (tr->env)
        tr->env_ops->destroy(tr->env);
    dsarl_dataloader_free(tr->loader);
    dsarl_dataset_free(tr->train_set);
    dsarl_dataset_free(tr->val_set);
}

/* Everything that reads only the recipe runs first, so a bad value fails before any model is built. */
static int trainer_check_recipe(trainer *tr, dsarl_error *err)
{
    DSARL_TRY(grpo_config_from_recipe(tr->root, &tr->cfg, err));
    DSARL_TRY(read_options(tr, err));
    DSARL_TRY(dsarl_optimizer_params_from_recipe(tr->root, &tr->adam, err));
    DSARL_TRY(dsarl_checkpoint_config_from_recipe(tr->root, &tr->ckpt, err));
    memset(&tr->log_cfg, 0, sizeof tr->log_cfg);
    DSARL_TRY(dsarl_metrics_config_from_recipe(tr->root, &tr->log_cfg, err));
    return DSARL_OK;
}

static int trainer_open(trainer *tr, dsarl_error *err)
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
    if (!tr->cfg.skip_reference_policy_logprobs)
        DSARL_TRY(dsarl_session_create_model(&tr->session, &tr->reference, err)); /* the initial weights, frozen */
    if (ctx->generation_ops)
        DSARL_TRY(ctx->generation_ops->create(tr->root, ctx->model_ops, tr->model, &tr->engine, err));
    return DSARL_OK;
}

/* Restores the newest complete checkpoint, if any, and opens the metrics. */
static int trainer_start(trainer *tr, dsarl_error *err)
{
    tr->log_cfg.progress = 1; /* redrawn on a terminal, one log line per step otherwise */
    tr->log_cfg.total_steps = tr->cfg.max_num_steps;
    dsarl_trainer_state st;
    DSARL_TRY(dsarl_session_start(&tr->session, &tr->ckpt, tr->loader, &tr->log_cfg, &st, err));
    tr->log = tr->session.log;
    if (st.step < 0)
        return DSARL_OK;
    tr->step = st.step;
    tr->consumed_samples = st.consumed_samples;
    tr->train_time_s = st.total_train_time_s;
    return DSARL_OK;
}

/* --- rollouts ------------------------------------------------------------------------------------------------- */

static int encode_prompt(trainer *tr, const dsarl_example *ex, rollout *r, dsarl_error *err)
{
    DSARL_TRY(dsarl_tokenizer_apply_chat_template(tr->tok, tr->opt.chat_template, ex->messages, ex->n_messages, 1,
                                                  &r->prompt_text, err));
    size_t n;
    DSARL_TRY(dsarl_tokenizer_encode(tr->tok, r->prompt_text, strlen(r->prompt_text), &r->prompt, &n, err));
    if ((int64_t)n > tr->opt.max_input_len) {
        /* NeMo keeps an over-long prompt in the batch, cut short, with loss multiplier 0 */
        n = (size_t)tr->opt.max_input_len;
        r->prompt_cut = 1;
    }
    if (n == 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "a prompt encoded to zero tokens (template '%s')",
                          tr->opt.chat_template);
    r->prompt_len = (int32_t)n;
    return DSARL_OK;
}

/* Generates `n_gen` responses for each of n examples and scores them; appends n * n_gen rollouts (group after
 * group) to out. */
static int run_rollouts(trainer *tr, const dsarl_example *const *examples, size_t n, int64_t n_gen, float temperature,
                        float top_p, int32_t top_k, uint64_t seed, rollout_set *out, dsarl_error *err)
{
    int64_t first = out->n;
    int64_t total = (int64_t)n * n_gen;
    int rc = DSARL_OK;
    int64_t max_prompt = 0, n_tokens = 0;
    for (size_t p = 0; p < n && rc == DSARL_OK; p++) {
        for (int64_t g = 0; g < n_gen && rc == DSARL_OK; g++) {
            rollout *r = rollout_set_push(out);
            if (!r)
                return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory holding %" PRId64 " rollouts", total);
            r->example = examples[p];
            rc = encode_prompt(tr, examples[p], r, err);
            if (rc == DSARL_OK && r->prompt_len > max_prompt)
                max_prompt = r->prompt_len;
            n_tokens += r->prompt_len;
        }
    }
    if (rc < 0)
        return rc;
    int64_t room = tr->opt.max_total_len - max_prompt;
    if (room < 1)
        return DSARL_FAIL(err, DSARL_E_INVALID, "a prompt of %" PRId64 " tokens leaves no room to generate within "
                          "policy.max_total_sequence_length = %" PRId64 "; lower data.max_input_seq_length",
                          max_prompt, tr->opt.max_total_len);
    int32_t max_new = (int32_t)(tr->opt.max_new_tokens < room ? tr->opt.max_new_tokens : room);
    int32_t *tokens = malloc(sizeof(int32_t) * (size_t)(n_tokens ? n_tokens : 1));
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(total + 1));
    if (!tokens || !cu) {
        free(tokens);
        free(cu);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory packing %" PRId64 " prompts", total);
    }
    cu[0] = 0;
    for (int64_t i = 0; i < total; i++) {
        rollout *r = &out->items[first + i];
        memcpy(tokens + cu[i], r->prompt, sizeof(int32_t) * (size_t)r->prompt_len);
        cu[i + 1] = cu[i] + r->prompt_len;
    }
    dsarl_token_batch prompts = {.struct_size = sizeof prompts, .n_tokens = n_tokens, .n_sequences = (int32_t)total,
                                 .tokens = tokens, .cu_seqlens = cu};
    dsarl_sampling_params sp = {.struct_size = sizeof sp, .temperature = temperature, .top_p = top_p,
                                .top_k = top_k, .max_new_tokens = max_new, .stop_token_ids = tr->opt.stop_ids,
                                .n_stop_token_ids = tr->opt.n_stop_ids, .stop_strings = tr->opt.stop_strings,
                                .n_stop_strings = tr->opt.n_stop_strings, .seed = seed, .tokenizer = tr->tok};
    grpo_completions gen = {0};
    if (tr->engine) {
        dsarl_generation_result res = {.struct_size = sizeof res};
        rc = tr->ctx->generation_ops->generate(tr->engine, &prompts, &sp, &res, err);
        if (rc == DSARL_OK) {
            size_t T = (size_t)res.cu_lengths[total];
            gen.n_sequences = (int32_t)total;
            gen.cu_lengths = malloc(sizeof(int32_t) * (size_t)(total + 1));
            gen.tokens = malloc(sizeof(int32_t) * (T ? T : 1));
            gen.logprobs = malloc(sizeof(float) * (T ? T : 1));
            gen.truncated = malloc((size_t)total);
            if (!gen.cu_lengths || !gen.tokens || !gen.logprobs || !gen.truncated) {
                rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory copying %zu generated tokens", T);
            } else {
                memcpy(gen.cu_lengths, res.cu_lengths, sizeof(int32_t) * (size_t)(total + 1));
                memcpy(gen.tokens, res.tokens, sizeof(int32_t) * T);
                memcpy(gen.logprobs, res.logprobs, sizeof(float) * T);
                memcpy(gen.truncated, res.truncated, (size_t)total);
            }
        }
    } else if (sp.n_stop_strings > 0) {
        rc = DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "policy.generation.stop_strings need a generation plugin "
                        "(policy.generation.backend); the built-in sampler stops on token ids only");
    } else {
        rc = grpo_sample_with_model(tr->ctx->model_ops, tr->model, &prompts, &sp, &gen, err);
    }
    free(tokens);
    free(cu);
    const char **responses = calloc((size_t)total, sizeof(char *));
    const char **truths = calloc((size_t)total, sizeof(char *));
    float *rewards = calloc((size_t)total, sizeof(float));
    dsarl_verdict *verdicts = calloc((size_t)total, sizeof(dsarl_verdict));
    if (rc == DSARL_OK && (!responses || !truths || !rewards || !verdicts))
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory scoring %" PRId64 " responses", total);
    for (int64_t i = 0; i < total && rc == DSARL_OK; i++) {
        rollout *r = &out->items[first + i];
        int32_t len = gen.cu_lengths[i + 1] - gen.cu_lengths[i];
        r->response_len = len;
        r->truncated = gen.truncated[i];
        r->response = malloc(sizeof(int32_t) * (size_t)(len ? len : 1));
        r->response_lp = malloc(sizeof(float) * (size_t)(len ? len : 1));
        if (!r->response || !r->response_lp) {
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory holding a response of %d tokens", len);
            break;
        }
        memcpy(r->response, gen.tokens + gen.cu_lengths[i], sizeof(int32_t) * (size_t)len);
        memcpy(r->response_lp, gen.logprobs + gen.cu_lengths[i], sizeof(float) * (size_t)len);
        rc = dsarl_tokenizer_decode(tr->tok, r->response, (size_t)len, 1, &r->response_text, NULL, err);
        responses[i] = r->response_text;
        truths[i] = r->example->ground_truth;
    }
    grpo_completions_free(&gen);
    if (rc == DSARL_OK)
        rc = tr->env_ops->score(tr->env, (size_t)total, responses, truths, rewards, verdicts, err);
    for (int64_t i = 0; i < total && rc == DSARL_OK; i++) {
        rollout *r = &out->items[first + i];
        r->raw_reward = r->reward = rewards[i];
        r->verdict = verdicts[i];
        r->loss_multiplier = r->prompt_cut ? 0.0f : 1.0f;
        if (verdicts[i] == DSARL_VERDICT_VERIFIER_FAILED)
            tr->verifier_failures++;
    }
    free(responses);
    free(truths);
    free(rewards);
    free(verdicts);
    return rc;
}

/* --- training ------------------------------------------------------------------------------------------------- */

/* The rollouts packed as model input: tokens (T), cu (B + 1), targets (T) = next token or -1, and per position the
 * generation log-prob and the train mask of the response token it predicts. */
typedef struct packed_batch {
    int64_t T, B;
    int32_t *tokens, *cu, *targets; /* cu: the one offset type, the model's */
    float *lp_gen, *mask, *lp_old, *lp_ref, *lp_theta, *grad;
    float *sample_mask, *advantages;
    bool old_from_train; /* on-policy: lp_old is copied from the training pass's own log-probs (ratio exactly 1) */
} packed_batch;

static void packed_free(packed_batch *p)
{
    free(p->tokens);
    free(p->cu);
    free(p->targets);
    free(p->lp_gen);
    free(p->mask);
    free(p->lp_old);
    free(p->lp_ref);
    free(p->lp_theta);
    free(p->grad);
    free(p->sample_mask);
    free(p->advantages);
    memset(p, 0, sizeof *p);
}

static int pack_rollouts(const rollout_set *rs, packed_batch *p, dsarl_error *err)
{
    memset(p, 0, sizeof *p);
    p->B = rs->n;
    for (int64_t i = 0; i < rs->n; i++)
        p->T += rs->items[i].prompt_len + rs->items[i].response_len;
    size_t T = (size_t)p->T, B = (size_t)p->B;
    p->tokens = malloc(sizeof(int32_t) * T);
    p->targets = malloc(sizeof(int32_t) * T);
    p->cu = malloc(sizeof(int32_t) * (B + 1));
    p->lp_gen = calloc(T, sizeof(float));
    p->mask = calloc(T, sizeof(float));
    p->lp_old = calloc(T, sizeof(float));
    p->lp_ref = calloc(T, sizeof(float));
    p->lp_theta = calloc(T, sizeof(float));
    p->grad = calloc(T, sizeof(float));
    p->sample_mask = malloc(sizeof(float) * B);
    p->advantages = malloc(sizeof(float) * B);
    if (!p->tokens || !p->targets || !p->cu || !p->lp_gen || !p->mask || !p->lp_old || !p->lp_ref ||
        !p->lp_theta || !p->grad || !p->sample_mask || !p->advantages) {
        packed_free(p);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory packing %zu tokens", T);
    }
    int64_t at = 0;
    p->cu[0] = 0;
    for (int64_t i = 0; i < rs->n; i++) {
        const rollout *r = &rs->items[i];
        int64_t L = r->prompt_len + r->response_len;
        memcpy(p->tokens + at, r->prompt, sizeof(int32_t) * (size_t)r->prompt_len);
        memcpy(p->tokens + at + r->prompt_len, r->response, sizeof(int32_t) * (size_t)r->response_len);
        for (int64_t j = 0; j < L; j++) {
            p->targets[at + j] = j + 1 < L ? p->tokens[at + j + 1] : -1;
            int64_t k = j + 1 - r->prompt_len; /* index of the predicted token within the response */
            if (j + 1 < L && k >= 0) {
                p->mask[at + j] = 1.0f;
                p->lp_gen[at + j] = r->response_lp[k];
            }
        }
        at += L;
        p->cu[i + 1] = (int32_t)at;
        p->sample_mask[i] = r->loss_multiplier;
        p->advantages[i] = r->advantage;
    }
    return DSARL_OK;
}

/* Log-probs of sequences [s0, s1) with a model, written at their positions in out: a forward-only pass, or with
 * train the forward of the training pass whose backward train_microbatch runs next. */
static int logprobs_range(trainer *tr, dsarl_model *model, const packed_batch *p, int64_t s0, int64_t s1, bool train,
                          float *out, dsarl_error *err)
{
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(s1 - s0 + 1));
    if (!cu)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for a microbatch of %" PRId64 " sequences", s1 - s0);
    for (int64_t s = s0; s <= s1; s++)
        cu[s - s0] = p->cu[s] - p->cu[s0];
    int64_t base = p->cu[s0];
    // log-probs of the tempered distribution the rollouts were drawn from (NeMo RL divides the logits likewise)
    dsarl_token_batch b = {.struct_size = sizeof b, .n_tokens = p->cu[s1] - base, .n_sequences = (int32_t)(s1 - s0),
                           .tokens = p->tokens + base, .cu_seqlens = cu, .logit_scale = 1.0f / tr->opt.temperature};
    int rc = train ? dsarl_trainer_train_forward(tr->ctx->model_ops, model, &b, p->targets + base, out + base,
                                                 &tr->passes, err)
                   : dsarl_trainer_forward(tr->ctx->model_ops, model, &b, p->targets + base, out + base, &tr->passes,
                                           err);
    free(cu);
    return rc;
}

static int logprobs_all(trainer *tr, dsarl_model *model, const packed_batch *p, float *out, dsarl_error *err)
{
    for (int64_t s = 0; s < p->B; s += tr->opt.logprob_batch) {
        int64_t e = s + tr->opt.logprob_batch < p->B ? s + tr->opt.logprob_batch : p->B;
        DSARL_TRY(logprobs_range(tr, model, p, s, e, false, out, err));
    }
    return DSARL_OK;
}

/* One microbatch: current log-probs, the loss and its per-token gradient, backward into the gradients. */
static int train_microbatch(trainer *tr, packed_batch *p, int64_t s0, int64_t s1, double valid_toks,
                            double valid_seqs, grpo_loss_metrics *m, float *indexer_loss, dsarl_error *err)
{
    const dsarl_model_ops *ops = tr->ctx->model_ops;
    DSARL_TRY(logprobs_range(tr, tr->model, p, s0, s1, true, p->lp_theta, err));
    int64_t base = p->cu[s0];
    if (p->old_from_train)
        memcpy(p->lp_old + base, p->lp_theta + base, sizeof(float) * (size_t)(p->cu[s1] - base));
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(s1 - s0 + 1));
    if (!cu)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for a microbatch of %" PRId64 " sequences", s1 - s0);
    for (int64_t s = s0; s <= s1; s++)
        cu[s - s0] = p->cu[s] - (int32_t)base;
    grpo_loss_inputs in = {
        .n_tokens = p->cu[s1] - base, .n_seqs = s1 - s0, .cu_seqlens = cu, .lp_theta = p->lp_theta + base,
        .lp_old = tr->cfg.loss.force_on_policy_ratio ? NULL : p->lp_old + base, .lp_gen = p->lp_gen + base,
        .lp_ref = tr->reference ? p->lp_ref + base : NULL, .token_mask = p->mask + base,
        .sample_mask = p->sample_mask + s0, .advantages = p->advantages + s0, .global_valid_toks = valid_toks,
        .global_valid_seqs = valid_seqs};
    double loss;
    grpo_loss_metrics mb;
    int rc = grpo_clipped_pg_loss(&tr->cfg.loss, &in, &loss, p->grad + base, &mb, err);
    if (rc == DSARL_OK) {
        grpo_loss_metrics_add(m, &mb);
        dsarl_token_batch b = {.struct_size = sizeof b, .n_tokens = in.n_tokens, .n_sequences = (int32_t)(s1 - s0),
                               .tokens = p->tokens + base, .cu_seqlens = cu,
                               .logit_scale = 1.0f / tr->opt.temperature};
        float il = 0.0f;
        rc = dsarl_trainer_train_backward(ops, tr->model, &b, p->targets + base, p->grad + base, &il, err);
        *indexer_loss += il;
    }
    free(cu);
    return rc;
}

typedef struct step_stats {
    grpo_loss_metrics loss;
    double grad_norm, lr, indexer_loss;
    int64_t n_slices;
} step_stats;

/* The optimizer steps of one training step: one per train_global_batch_size slice of the rollouts. */
static int train_on_batch(trainer *tr, packed_batch *p, step_stats *st, dsarl_error *err)
{
    const dsarl_model_ops *ops = tr->ctx->model_ops;
    int64_t gbs = tr->cfg.train_global_batch_size, mbs = tr->opt.micro_batch;
    grpo_loss_metrics_init(&st->loss);
    st->grad_norm = 0.0;
    st->indexer_loss = 0.0;
    st->n_slices = 0;
    for (int64_t g0 = 0; g0 < p->B; g0 += gbs) {
        int64_t g1 = g0 + gbs < p->B ? g0 + gbs : p->B;
        double valid_toks = 0.0, valid_seqs = 0.0;
        for (int64_t s = g0; s < g1; s++) {
            valid_seqs += p->sample_mask[s];
            for (int64_t t = p->cu[s]; t < p->cu[s + 1]; t++)
                valid_toks += p->mask[t] * p->sample_mask[s];
        }
        DSARL_TRY(ops->zero_grad(tr->model, err));
        grpo_loss_metrics slice;
        grpo_loss_metrics_init(&slice);
        float indexer = 0.0f;
        for (int64_t s = g0; s < g1; s += mbs) {
            int64_t e = s + mbs < g1 ? s + mbs : g1;
            DSARL_TRY(train_microbatch(tr, p, s, e, valid_toks, valid_seqs, &slice, &indexer, err));
        }
        double norm;
        double lr = dsarl_lr_at(&tr->cfg.lr_schedule, ops->optimizer_steps ? ops->optimizer_steps(tr->model) : 0);
        DSARL_TRY(dsarl_trainer_optimizer_step(ops, tr->model, &tr->adam, lr, tr->cfg.lr_schedule.max_grad_norm,
                                               &norm, err));
        /* slice sums are normalised per slice; averaging them gives the step's metric */
        grpo_loss_metrics_add(&st->loss, &slice);
        st->grad_norm += norm;
        st->lr = lr;
        st->indexer_loss += indexer;
        st->n_slices++;
    }
    return DSARL_OK;
}

/* --- one step ------------------------------------------------------------------------------------------------- */

static int set_metric(trainer *tr, const char *name, double v, dsarl_error *err)
{
    return dsarl_metrics_set(tr->log, name, v, err);
}

/* Draws prompt batches and generates until the step's rollouts are complete (one round without dynamic sampling). */
static int collect_rollouts(trainer *tr, rollout_set *rs, int64_t *n_rounds, int64_t *epoch_out, dsarl_error *err)
{
    const grpo_config *c = &tr->cfg;
    int64_t G = c->num_generations_per_prompt;
    grpo_dynamic_sampler ds;
    grpo_dynamic_sampler_init(&ds, c->num_prompts_per_step, G, c->dynamic_sampling_max_gen_batches);
    const dsarl_example **batch = NULL;
    int rc = DSARL_OK;
    *n_rounds = 0;
    for (bool complete = false; !complete && rc == DSARL_OK;) {
        size_t cap = (size_t)ceil((double)c->num_prompts_per_step * (c->use_dynamic_sampling ? c->batch_multiplier : 1));
        free(batch);
        batch = malloc(sizeof *batch * (cap ? cap : 1));
        if (!batch)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for a prompt batch");
        size_t n;
        rc = dsarl_dataloader_next(tr->loader, batch, NULL, &n, epoch_out, err);
        if (rc < 0)
            break;
        uint64_t seed = mix_seed((uint64_t)c->seed, 1 + (uint64_t)*n_rounds, (uint64_t)tr->step);
        if (!c->use_dynamic_sampling) {
            rc = run_rollouts(tr, batch, n, G, tr->opt.temperature, tr->opt.top_p, tr->opt.top_k, seed, rs, err);
            tr->consumed_samples += (int64_t)n * G;
            complete = true;
            (*n_rounds)++;
            break;
        }
        rollout_set round = {0};
        rc = run_rollouts(tr, batch, n, G, tr->opt.temperature, tr->opt.top_p, tr->opt.top_k, seed, &round, err);
        (*n_rounds)++;
        tr->consumed_samples += (int64_t)n * G;
        float *rewards = rc == DSARL_OK ? malloc(sizeof(float) * (size_t)round.n) : NULL;
        uint8_t *take = rc == DSARL_OK ? malloc(n ? n : 1) : NULL;
        if (rc == DSARL_OK && (!rewards || !take))
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for dynamic sampling");
        for (int64_t i = 0; rc == DSARL_OK && i < round.n; i++)
            rewards[i] = round.items[i].raw_reward;
        if (rc == DSARL_OK)
            rc = grpo_dynamic_sampler_add(&ds, rewards, (int64_t)n, take, &complete, err);
        for (size_t g = 0; rc == DSARL_OK && g < n; g++) {
            for (int64_t k = 0; k < G; k++) {
                rollout *src = &round.items[(int64_t)g * G + k];
                if (!take[g])
                    continue;
                rollout *dst = rollout_set_push(rs);
                if (!dst) {
                    rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory collecting rollouts");
                    break;
                }
                *dst = *src;
                memset(src, 0, sizeof *src); /* moved */
            }
        }
        free(rewards);
        free(take);
        rollout_set_free(&round);
    }
    free(batch);
    return rc;
}

static int advantages_for(trainer *tr, rollout_set *rs, dsarl_error *err)
{
    const grpo_config *c = &tr->cfg;
    int64_t n = rs->n, G = c->num_generations_per_prompt;
    float *rewards = malloc(sizeof(float) * (size_t)n);
    float *adv = malloc(sizeof(float) * (size_t)n);
    int64_t *lengths = malloc(sizeof(int64_t) * (size_t)n);
    uint8_t *truncated = malloc((size_t)n);
    float *mult = malloc(sizeof(float) * (size_t)n);
    int rc = DSARL_OK;
    if (!rewards || !adv || !lengths || !truncated || !mult)
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory computing advantages");
    for (int64_t i = 0; rc == DSARL_OK && i < n; i++) {
        rewards[i] = rs->items[i].raw_reward;
        lengths[i] = rs->items[i].response_len;
        truncated[i] = rs->items[i].truncated;
        mult[i] = rs->items[i].loss_multiplier;
    }
    if (rc == DSARL_OK) {
        grpo_scale_rewards(&c->reward_scaling, rewards, n);
        rc = grpo_shape_rewards(&c->reward_shaping, rewards, lengths, truncated, n, err);
    }
    if (rc == DSARL_OK)
        rc = grpo_compute_advantages(&c->advantage, rewards, n / G, G, adv, err);
    if (rc == DSARL_OK && c->overlong_filtering)
        grpo_overlong_filter(truncated, mult, n);
    for (int64_t i = 0; rc == DSARL_OK && i < n; i++) {
        rs->items[i].reward = rewards[i];
        rs->items[i].advantage = adv[i];
        rs->items[i].loss_multiplier = mult[i];
    }
    free(rewards);
    free(adv);
    free(lengths);
    free(truncated);
    free(mult);
    return rc;
}

static int log_samples(trainer *tr, const char *prefix, int64_t step, const rollout_set *rs, bool with_advantage,
                       dsarl_error *err)
{
    dsarl_metrics_sample *s = malloc(sizeof *s * (size_t)(rs->n ? rs->n : 1));
    if (!s)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory dumping %" PRId64 " samples", rs->n);
    for (int64_t i = 0; i < rs->n; i++)
        s[i] = (dsarl_metrics_sample){rs->items[i].prompt_text, rs->items[i].response_text, rs->items[i].reward,
                                      with_advantage ? rs->items[i].advantage : NAN};
    int rc = dsarl_metrics_write_samples(tr->log, prefix, step, s, (size_t)rs->n, err);
    free(s);
    return rc;
}

/* One GRPO step; on return tr->step has advanced and the step's train metrics are recorded (not committed). */
static int train_step(trainer *tr, double *mean_reward, bool *out_of_epochs, dsarl_error *err)
{
    double t0 = now_s();
    rollout_set rs = {0};
    packed_batch p = {0};
    step_stats st;
    int64_t rounds = 0, epoch = 0;
    dsarl_dataloader_state before = dsarl_dataloader_get_state(tr->loader);
    int64_t consumed_before = tr->consumed_samples;
    tr->verifier_failures = 0;
    memset(&tr->passes, 0, sizeof tr->passes);
    /* the loader moves to the next epoch when no full batch is left: stop before generating a batch of an epoch
     * past grpo.max_num_epochs */
    int64_t next_epoch = before.epoch +
                         (before.cursor >= dsarl_dataloader_batches_per_epoch(tr->loader) * tr->per_round);
    *out_of_epochs = next_epoch >= tr->cfg.max_num_epochs;
    if (*out_of_epochs)
        return DSARL_OK;
    int rc = collect_rollouts(tr, &rs, &rounds, &epoch, err);
    if (rc == DSARL_OK && epoch >= tr->cfg.max_num_epochs) {
        /* dynamic sampling drew into an epoch past grpo.max_num_epochs mid-step: put the batch back and stop */
        rollout_set_free(&rs);
        tr->consumed_samples = consumed_before;
        *out_of_epochs = true;
        return dsarl_dataloader_set_state(tr->loader, before, err);
    }
    double t_gen = now_s();
    if (rc == DSARL_OK)
        rc = advantages_for(tr, &rs, err);
    double t_adv = now_s();
    if (rc == DSARL_OK)
        rc = pack_rollouts(&rs, &p, err);
    /* on-policy (the whole batch is one optimizer slice): the weights do not move before the training pass, so
     * its own log-probs are the old ones and no separate forward is needed */
    p.old_from_train = !tr->cfg.loss.force_on_policy_ratio && p.B <= tr->cfg.train_global_batch_size;
    if (rc == DSARL_OK && !tr->cfg.loss.force_on_policy_ratio && !p.old_from_train)
        rc = logprobs_all(tr, tr->model, &p, p.lp_old, err);
    if (rc == DSARL_OK && tr->reference)
        rc = logprobs_all(tr, tr->reference, &p, p.lp_ref, err);
    double t_lp = now_s();
    if (rc == DSARL_OK)
        rc = train_on_batch(tr, &p, &st, err);
    double t_train = now_s();
    if (rc == DSARL_OK) {
        tr->step++;
        int64_t n = rs.n;
        double reward = 0, correct = 0, gen_len = 0, prompt_len = 0, trunc = 0, amin = INFINITY, amax = -INFINITY,
               asum = 0;
        for (int64_t i = 0; i < n; i++) {
            const rollout *r = &rs.items[i];
            reward += r->reward;
            correct += r->verdict == DSARL_VERDICT_CORRECT;
            gen_len += r->response_len;
            prompt_len += r->prompt_len;
            trunc += r->truncated;
            asum += r->advantage;
            amin = fmin(amin, r->advantage);
            amax = fmax(amax, r->advantage);
        }
        double k = (double)st.n_slices;
        const grpo_loss_metrics *m = &st.loss;
        *mean_reward = reward / (double)n;
        struct { const char *name; double v; } rows[] = {
            {"train/reward", reward / (double)n},
            {"train/accuracy", correct / (double)n},
            {"train/loss", m->loss / k},
            {"train/actor_loss", m->actor_loss / k},
            {"train/kl_penalty", m->kl_penalty / k},
            {"train/token_mult_prob_error", m->token_mult_prob_error / k},
            {"train/gen_kl_error", m->gen_kl_error / k},
            {"train/policy_kl_error", m->policy_kl_error / k},
            {"train/js_divergence_error", m->js_divergence_error / k},
            {"train/sampling_importance_ratio", m->sampling_importance_ratio / k},
            {"train/approx_entropy", m->approx_entropy / k},
            {"train/probs_ratio", m->probs_ratio / k},
            {"train/probs_ratio_clamped", m->probs_ratio_clamped / k},
            {"train/clip_fraction", (m->clip_fraction_low + m->clip_fraction_high) / k},
            {"train/clip_fraction_low", m->clip_fraction_low / k},
            {"train/clip_fraction_high", m->clip_fraction_high / k},
            {"train/dual_clip_fraction", m->dual_clip_fraction / k},
            {"train/num_valid_samples", m->num_valid_samples},
            {"train/indexer_loss", st.indexer_loss / k},
            {"train/grad_norm", st.grad_norm / k},
            {"train/lr", st.lr},
            {"train/advantages/mean", asum / (double)n},
            {"train/advantages/min", amin},
            {"train/advantages/max", amax},
            {"train/mean_gen_length", gen_len / (double)n},
            {"train/mean_prompt_length", prompt_len / (double)n},
            {"train/truncation_rate", trunc / (double)n},
            {"train/total_num_tokens", (double)p.T},
            {"train/forward_tokens", (double)tr->passes.forward_tokens},
            {"train/train_pass_tokens", (double)tr->passes.train_pass_tokens},
            {"train/verifier_failures", (double)tr->verifier_failures},
            {"train/dynamic_sampling_num_gen_batches", (double)rounds},
            {"train/epoch", (double)epoch},
            {"timing/train/generation", t_gen - t0},
            {"timing/train/advantage_calculation", t_adv - t_gen},
            {"timing/train/policy_and_reference_logprobs", t_lp - t_adv},
            {"timing/train/policy_training", t_train - t_lp},
            {"timing/train/total_step_time", t_train - t0},
            {"train/tokens_per_sec", (double)p.T / fmax(t_train - t0, 1e-9)},
        };
        for (size_t i = 0; i < DSARL_ARRAY_LEN(rows) && rc == DSARL_OK; i++)
            rc = set_metric(tr, rows[i].name, rows[i].v, err);
        if (tr->verifier_failures)
            dsarl_log(DSARL_LOG_WARN, "step %" PRId64 ": the verifier failed on %" PRId64 " responses (scored 0)",
                      tr->step, tr->verifier_failures);
        if (rc == DSARL_OK)
            rc = log_samples(tr, "train", tr->step, &rs, true, err);
        tr->train_time_s += t_train - t0;
    }
    packed_free(&p);
    rollout_set_free(&rs);
    return rc;
}

/* --- validation ----------------------------------------------------------------------------------------------- */

/* The validation metrics grpo.stop_at_validation_metric can name. */
typedef struct val_result {
    double accuracy, avg_length, pass_k;
} val_result;

static int validate(trainer *tr, val_result *out, dsarl_error *err)
{
    const grpo_config *c = &tr->cfg;
    double t0 = now_s();
    size_t n_val = dsarl_dataset_size(tr->val_set);
    if (c->max_val_samples >= 0 && (size_t)c->max_val_samples < n_val)
        n_val = (size_t)c->max_val_samples;
    size_t bs = c->val_batch_size > 0 ? (size_t)c->val_batch_size : n_val;
    int64_t k = c->val_num_generations_per_prompt > 0 ? c->val_num_generations_per_prompt : 1;
    rollout_set rs = {0};
    const dsarl_example **batch = malloc(sizeof *batch * (bs ? bs : 1));
    int rc = batch ? DSARL_OK : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for validation");
    for (size_t i = 0; rc == DSARL_OK && i < n_val; i += bs) {
        size_t n = i + bs < n_val ? bs : n_val - i;
        for (size_t j = 0; j < n; j++)
            batch[j] = dsarl_dataset_get(tr->val_set, i + j);
        /* the same seed at every validation: accuracy changes come from the weights, not the draws */
        uint64_t seed = mix_seed((uint64_t)c->seed, 0x7661u, i);
        rc = run_rollouts(tr, batch, n, k, tr->opt.val_temperature, tr->opt.val_top_p, tr->opt.val_top_k, seed, &rs,
                          err);
    }
    free(batch);
    if (rc == DSARL_OK && rs.n > 0) {
        double reward = 0, len = 0, pass = 0;
        for (int64_t i = 0; i < rs.n; i++) {
            reward += rs.items[i].raw_reward;
            len += rs.items[i].response_len;
        }
        for (int64_t g = 0; g < rs.n / k; g++) {
            bool any = false;
            for (int64_t j = 0; j < k; j++)
                any |= rs.items[g * k + j].verdict == DSARL_VERDICT_CORRECT;
            pass += any;
        }
        out->accuracy = reward / (double)rs.n;
        out->avg_length = len / (double)rs.n;
        out->pass_k = pass / (double)(rs.n / k);
        rc = set_metric(tr, "val/accuracy", out->accuracy, err);
        if (rc == DSARL_OK)
            rc = set_metric(tr, "val/avg_length", out->avg_length, err);
        if (rc == DSARL_OK && k > 1)
            rc = set_metric(tr, "val/pass_at_k", out->pass_k, err);
        if (rc == DSARL_OK)
            rc = set_metric(tr, "timing/validation/total_validation_time", now_s() - t0, err);
        if (rc == DSARL_OK)
            rc = log_samples(tr, "val", tr->step, &rs, false, err);
        dsarl_log(DSARL_LOG_INFO, "validation at step %" PRId64 ": accuracy %.4f over %" PRId64 " responses",
                  tr->step, out->accuracy, rs.n);
        int64_t to_print = tr->opt.num_val_samples_to_print;
        for (int64_t i = 0; rc == DSARL_OK && i < to_print && i < rs.n; i++)
            dsarl_log(DSARL_LOG_INFO, "validation sample %" PRId64 ": prompt '%s' response '%s' reward %g", i,
                      rs.items[i].prompt_text, rs.items[i].response_text, rs.items[i].raw_reward);
    }
    rollout_set_free(&rs);
    return rc;
}

/* --- checkpoints and the loop ---------------------------------------------------------------------------------- */

static int save_checkpoint(trainer *tr, double val_accuracy, double train_reward, dsarl_error *err)
{
    dsarl_trainer_state st;
    memset(&st, 0, sizeof st);
    st.step = tr->step;
    st.consumed_samples = tr->consumed_samples;
    st.total_train_time_s = tr->train_time_s;
    DSARL_TRY(dsarl_trainer_state_set_loader(&st, "train", dsarl_dataloader_get_state(tr->loader), err));
    /* rollouts draw from Philox streams keyed by (grpo.seed, step): the seed is the whole sampling state */
    dsarl_rng_state sampling = {.seed = (uint64_t)tr->cfg.seed, .stream = 0, .offset = 0};
    DSARL_TRY(dsarl_trainer_state_set_rng(&st, "sampling", sampling, err));
    if (isfinite(val_accuracy))
        DSARL_TRY(dsarl_trainer_state_set_metric(&st, "val:accuracy", val_accuracy, err));
    if (isfinite(train_reward))
        DSARL_TRY(dsarl_trainer_state_set_metric(&st, "train:reward", train_reward, err));
    char dir[4096];
    return dsarl_checkpoint_save(&tr->ckpt, tr->ctx->model_ops, tr->model, &st, tr->root, dir, sizeof dir, err);
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
    int rc = trainer_check_recipe(&tr, err);
    if (rc == DSARL_OK)
        rc = trainer_open(&tr, err);
    if (rc == DSARL_OK)
        rc = trainer_start(&tr, err);
    sum.first_step = tr.step;
    double val_acc = NAN, reward = NAN;
    val_result vr = {NAN, NAN, NAN};
    if (rc == DSARL_OK && tr.step == 0 && tr.cfg.val_at_start) {
        rc = validate(&tr, &vr, err);
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
        rc = train_step(&tr, &reward, &out_of_epochs, err);
        if (rc < 0)
            break;
        if (out_of_epochs) {
            why = "max_num_epochs reached";
            break;
        }
        bool last = tr.step >= tr.cfg.max_num_steps;
        if (ctx->stop_requested && *ctx->stop_requested) {
            stop = true;
            why = "stop requested (signal)";
        }
        val_acc = NAN;
        bool periodic = tr.cfg.val_period > 0 && tr.step % tr.cfg.val_period == 0 &&
                        (tr.cfg.val_start_at < 0 || tr.step >= tr.cfg.val_start_at);
        if (periodic || (last && tr.cfg.val_at_end)) {
            vr = (val_result){NAN, NAN, NAN};
            rc = validate(&tr, &vr, err);
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
            rc = save_checkpoint(&tr, val_acc, reward, err);
            if (rc < 0)
                break;
            rc = set_metric(&tr, "timing/train/checkpointing", now_s() - t_ck, err);
        }
        if (rc == DSARL_OK)
            rc = dsarl_metrics_commit(tr.log, tr.step, err);
        dsarl_metrics_progress(tr.log, tr.step, reward);
        if (rc == DSARL_OK && tr.ckpt.enabled && !stop && !last &&
            dsarl_trainer_deadline_near(&tr.ckpt, now_s() - t_start, tr.step - sum.first_step)) {
            if (!dsarl_checkpoint_due(&tr.ckpt, tr.step, last))
                rc = save_checkpoint(&tr, val_acc, reward, err);
            stop = true;
            why = "checkpointing.checkpoint_must_save_by is near";
        }
    }
    if (rc == DSARL_OK)
        dsarl_log(DSARL_LOG_INFO, "GRPO finished at step %" PRId64 ": %s", tr.step, why);
    sum.last_step = tr.step;
    if (tr.log)
        snprintf(sum.exp_dir, sizeof sum.exp_dir, "%s", dsarl_metrics_dir(tr.log));
    if (summary)
        *summary = sum;
    trainer_free(&tr);
    return rc;
}
