#define _POSIX_C_SOURCE 200809L /* clock_gettime */
/* grpo_rollout.c: prompts -> chat template + tokenizer -> each prompt repeated num_generations_per_prompt times
 * -> generation (colocated: the policy's own weights) -> environment rewards; dynamic sampling keeps drawing
 * rounds until enough prompt groups have non-zero reward variance. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpo_loop.h"

static void rollout_free(rollout *r)
{
    free(r->prompt_text);
    free(r->prompt);
    free(r->response);
    free(r->response_lp);
    free(r->response_text);
    memset(r, 0, sizeof *r);
}

void grpo_rollout_set_free(rollout_set *s)
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
int grpo_run_rollouts(trainer *tr, const dsarl_example *const *examples, size_t n, int64_t n_gen, float temperature,
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

/* Draws prompt batches and generates until the step's rollouts are complete (one round without dynamic sampling). */
int grpo_collect_rollouts(trainer *tr, rollout_set *rs, int64_t *n_rounds, int64_t *epoch_out, dsarl_error *err)
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
            rc = grpo_run_rollouts(tr, batch, n, G, tr->opt.temperature, tr->opt.top_p, tr->opt.top_k, seed, rs, err);
            tr->consumed_samples += (int64_t)n * G;
            complete = true;
            (*n_rounds)++;
            break;
        }
        rollout_set round = {0};
        rc = grpo_run_rollouts(tr, batch, n, G, tr->opt.temperature, tr->opt.top_p, tr->opt.top_k, seed, &round, err);
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
        grpo_rollout_set_free(&round);
    }
    free(batch);
    return rc;
}
