#define _POSIX_C_SOURCE 200809L /* clock_gettime */
/* grpo_rollout.c: prompts -> chat template + tokenizer -> each prompt repeated num_generations_per_prompt times
 * -> generation (colocated: the policy's own weights; else the copy grpo_async.c refits) -> environment rewards; dynamic sampling keeps drawing
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
    free(r->routed_experts);
    free(r->routed_indices);
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

/* The ranks generation must keep in step (expert parallelism exchanges tokens inside every MoE layer), or NULL. */
static const dsarl_group *grpo_lockstep_group(const trainer *tr)
{
    const dsarl_parallel *p = tr->ctx->parallel;
    return p && DSARL_PARALLEL_HAS_GROUPS(p) && p->ep_size > 1 ? p->ep : NULL;
}

/* The data-parallel group of the run (NULL in a single process). */
const dsarl_group *grpo_dp_group(const trainer *tr)
{
    const dsarl_parallel *p = tr->ctx->parallel;
    return p && DSARL_PARALLEL_HAS_GROUPS(p) ? p->dp : NULL;
}

/* The ranks that split generation (NULL in a single process). With a generation engine: the data-parallel ranks and
 * their context-parallel peers, which share samples in training but decode apart (cached decode is one token per
 * step: cp has nothing to split there), so each generates its own prompt groups and the gather gives every rank the
 * batch. The built-in sampler reruns whole forward passes, which are collective over cp on one shared batch: there
 * the cp peers sample the same prompts together. */
static const dsarl_group *grpo_rollout_group(const trainer *tr)
{
    const dsarl_parallel *p = tr->ctx->parallel;
    if (!p || !DSARL_PARALLEL_HAS_GROUPS(p))
        return NULL;
    return tr->engine ? p->dp_cp : p->dp;
}

/* Rows [lo, hi) of out->items[first ...] that rollout rank r generates: whole prompt groups, contiguous, the
 * first n % dp ranks one prompt more when n does not divide. */
static void rank_rows(size_t n, int64_t n_gen, int32_t dp, int32_t r, int64_t *lo, int64_t *hi)
{
    *lo = (int64_t)(n * (size_t)r / (size_t)dp) * n_gen;
    *hi = (int64_t)(n * (size_t)(r + 1) / (size_t)dp) * n_gen;
}

enum { TURNS = 5 + DSARL_MAX_REWARD_COMPONENTS }; /* the multi-turn counts follow the reward vector */

void grpo_rollout_pack(const rollout *x, double *m)
{
    m[0] = x->response_len, m[1] = x->truncated, m[2] = x->raw_reward, m[3] = x->verdict;
    m[4] = x->loss_multiplier;
    for (int k = 0; k < DSARL_MAX_REWARD_COMPONENTS; k++)
        m[5 + k] = x->components[k];
    m[TURNS] = x->turns, m[TURNS + 1] = x->env_tokens, m[TURNS + 2] = x->tool_calls;
    m[TURNS + 3] = x->invalid_tool_calls, m[TURNS + 4] = x->ended_by_env;
}

int grpo_rollout_unpack(const trainer *tr, const double *m, const int32_t *tokens, const float *logprobs, rollout *x,
                        dsarl_error *err)
{
    int32_t len = (int32_t)m[0];
    x->response_len = len;
    x->truncated = (uint8_t)m[1];
    x->raw_reward = x->reward = (float)m[2];
    x->verdict = (dsarl_verdict)m[3];
    x->loss_multiplier = (float)m[4];
    for (int k = 0; k < DSARL_MAX_REWARD_COMPONENTS; k++)
        x->components[k] = (float)m[5 + k];
    x->turns = (int32_t)m[TURNS], x->env_tokens = (int32_t)m[TURNS + 1];
    x->tool_calls = (int32_t)m[TURNS + 2], x->invalid_tool_calls = (int32_t)m[TURNS + 3];
    x->ended_by_env = (uint8_t)m[TURNS + 4];
    x->response = malloc(sizeof(int32_t) * (size_t)(len ? len : 1));
    x->response_lp = malloc(sizeof(float) * (size_t)(len ? len : 1));
    if (!x->response || !x->response_lp)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory holding a response of %d tokens", len);
    memcpy(x->response, tokens, sizeof(int32_t) * (size_t)len);
    memcpy(x->response_lp, logprobs, sizeof(float) * (size_t)len);
    return dsarl_tokenizer_decode(tr->tok, x->response, (size_t)len, 1, &x->response_text, NULL, err);
}

size_t grpo_routing_tokens(const rollout *items, int64_t n)
{
    size_t tokens = 0;
    for (int64_t i = 0; i < n; i++)
        tokens += (size_t)(items[i].prompt_len + items[i].response_len);
    return tokens;
}

size_t grpo_routing_pack(const trainer *tr, const rollout *items, int64_t n, int kind, int32_t *dst)
{
    const size_t w = (size_t)(kind ? tr->replay_w_indices : tr->replay_w_experts);
    size_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        const rollout *x = &items[i];
        const size_t tokens = (size_t)(x->prompt_len + x->response_len);
        const int32_t *rows = kind ? x->routed_indices : x->routed_experts;
        if (rows)
            memcpy(dst + at * w, rows, sizeof(int32_t) * tokens * w);
        else // not recorded: -1, the trainer routes those tokens by its own scores
            memset(dst + at * w, 0xff, sizeof(int32_t) * tokens * w);
        at += tokens;
    }
    return at;
}

int grpo_routing_unpack(const trainer *tr, rollout *items, int64_t n, int kind, const int32_t *src, dsarl_error *err)
{
    const size_t w = (size_t)(kind ? tr->replay_w_indices : tr->replay_w_experts);
    size_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        rollout *x = &items[i];
        const size_t tokens = (size_t)(x->prompt_len + x->response_len);
        int32_t **rows = kind ? &x->routed_indices : &x->routed_experts;
        if (!(*rows = malloc(sizeof(int32_t) * (tokens ? tokens : 1) * w)))
            return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory holding the routing of %zu tokens", tokens);
        memcpy(*rows, src + at * w, sizeof(int32_t) * tokens * w);
        at += tokens;
    }
    return DSARL_OK;
}

/* Routing replay: the engine's rows of every rollout (prompt + response tokens, trainer.replay_w_* int32 each, one
 * gather per kind) from the rank that generated it. Runs after the rollouts' lengths are gathered, so every rank
 * knows every rank's token count and unpacks each one's block (padded to the largest) without another exchange. */
static int gather_routing(trainer *tr, rollout_set *out, int64_t first, size_t n, int64_t n_gen, dsarl_error *err)
{
    const size_t width[2] = {(size_t)tr->replay_w_experts, (size_t)tr->replay_w_indices};
    if (!width[0] && !width[1])
        return DSARL_OK;
    const dsarl_group *g = grpo_rollout_group(tr);
    int32_t dp = dsarl_group_size(g), me = dsarl_group_rank(g);
    size_t max_tokens = 1;
    for (int32_t r = 0; r < dp; r++) {
        int64_t a, b;
        rank_rows(n, n_gen, dp, r, &a, &b);
        size_t tokens = grpo_routing_tokens(out->items + first + a, b - a);
        max_tokens = tokens > max_tokens ? tokens : max_tokens;
    }
    int64_t lo, hi;
    rank_rows(n, n_gen, dp, me, &lo, &hi);
    int rc = DSARL_OK;
    for (int kind = 0; kind < 2 && rc == DSARL_OK; kind++) {
        size_t w = width[kind];
        if (!w)
            continue;
        int32_t *mine = malloc(sizeof(int32_t) * max_tokens * w);
        int32_t *all = malloc(sizeof(int32_t) * (size_t)dp * max_tokens * w);
        if (!mine || !all)
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory gathering the routing of %zu tokens of %d ranks",
                            max_tokens, dp);
        if (rc == DSARL_OK) {
            grpo_routing_pack(tr, out->items + first + lo, hi - lo, kind, mine);
            rc = dsarl_group_all_gather_host(g, all, mine, (int64_t)(max_tokens * w), DSARL_DTYPE_I32, err);
        }
        for (int32_t r = 0; r < dp && rc == DSARL_OK; r++) {
            int64_t a, b;
            rank_rows(n, n_gen, dp, r, &a, &b);
            if (r != me)
                rc = grpo_routing_unpack(tr, out->items + first + a, b - a, kind, all + (size_t)r * max_tokens * w,
                                         err);
        }
        free(mine);
        free(all);
    }
    return rc;
}

/* Fills the rollouts generated by the other data-parallel ranks: every rank sends its rows' response lengths,
 * flags, rewards and verdicts, then their tokens and log-probs (each padded to the largest rank's count, as an
 * all-gather needs equal blocks), then, under routing replay, their routing rows; texts are decoded here from the
 * tokens. Afterwards every rank holds the whole batch in the one-process order. */
static int gather_rollouts(trainer *tr, rollout_set *out, int64_t first, size_t n, int64_t n_gen, dsarl_error *err)
{
    const dsarl_group *g = grpo_rollout_group(tr);
    int32_t dp = dsarl_group_size(g), me = dsarl_group_rank(g);
    /* response_len, truncated, raw_reward, verdict, loss_multiplier, the reward vector, the multi-turn counts */
    enum { META = GRPO_ROLLOUT_META };
    int64_t lo, hi, max_rows = 0, my_tokens = 0;
    rank_rows(n, n_gen, dp, me, &lo, &hi);
    for (int32_t r = 0; r < dp; r++) {
        int64_t a, b;
        rank_rows(n, n_gen, dp, r, &a, &b);
        max_rows = b - a > max_rows ? b - a : max_rows;
    }
    for (int64_t i = lo; i < hi; i++)
        my_tokens += out->items[first + i].response_len;
    int64_t max_tokens = my_tokens;
    DSARL_TRY(dsarl_group_all_reduce_host(g, &max_tokens, 1, DSARL_DTYPE_I64, DSARL_REDUCE_MAX, err));
    size_t rows = (size_t)(max_rows ? max_rows : 1), toks = (size_t)(max_tokens ? max_tokens : 1);
    double *meta = calloc(rows * META, sizeof *meta), *all_meta = calloc((size_t)dp * rows * META, sizeof *all_meta);
    int32_t *tok = calloc(toks, sizeof *tok), *all_tok = calloc((size_t)dp * toks, sizeof *all_tok);
    float *lp = calloc(toks, sizeof *lp), *all_lp = calloc((size_t)dp * toks, sizeof *all_lp);
    int rc = meta && all_meta && tok && all_tok && lp && all_lp
                 ? DSARL_OK
                 : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory gathering %zu rollouts of %d ranks", rows, dp);
    int64_t at = 0;
    for (int64_t i = lo; rc == DSARL_OK && i < hi; i++) {
        const rollout *x = &out->items[first + i];
        grpo_rollout_pack(x, meta + (size_t)(i - lo) * META);
        memcpy(tok + at, x->response, sizeof(int32_t) * (size_t)x->response_len);
        memcpy(lp + at, x->response_lp, sizeof(float) * (size_t)x->response_len);
        at += x->response_len;
    }
    if (rc == DSARL_OK)
        rc = dsarl_group_all_gather_host(g, all_meta, meta, (int64_t)rows * META, DSARL_DTYPE_F64, err);
    if (rc == DSARL_OK)
        rc = dsarl_group_all_gather_host(g, all_tok, tok, (int64_t)toks, DSARL_DTYPE_I32, err);
    if (rc == DSARL_OK)
        rc = dsarl_group_all_gather_host(g, all_lp, lp, (int64_t)toks, DSARL_DTYPE_F32, err);
    for (int32_t r = 0; r < dp && rc == DSARL_OK; r++) {
        int64_t a, b, off = 0;
        rank_rows(n, n_gen, dp, r, &a, &b);
        for (int64_t i = a; i < b && rc == DSARL_OK; i++) {
            const double *m = all_meta + ((size_t)r * rows + (size_t)(i - a)) * META;
            int32_t len = (int32_t)m[0];
            if (r != me)
                rc = grpo_rollout_unpack(tr, m, all_tok + (size_t)r * toks + off, all_lp + (size_t)r * toks + off,
                                         &out->items[first + i], err);
            off += len;
        }
    }
    free(meta);
    free(all_meta);
    free(tok);
    free(all_tok);
    free(lp);
    free(all_lp);
    return rc == DSARL_OK ? gather_routing(tr, out, first, n, n_gen, err) : rc;
}

int grpo_check_environment(trainer *tr, dsarl_error *err)
{
    tr->n_components = 0;
    if (tr->cfg.max_rollout_turns > 1 && !dsarl_environment_has_step(tr->env_ops))
        return dsarl_recipe_fail(tr->root, "grpo.max_rollout_turns", err, DSARL_E_INVALID,
                                 "is %lld but environment '%s' is single-turn (no ABI 1.4 step); use 1 or a multi-turn "
                                 "environment such as calculator", (long long)tr->cfg.max_rollout_turns,
                                 tr->env_ops->common.name);
    if (tr->cfg.advantage.estimator != GRPO_ESTIMATOR_GDPO)
        return DSARL_OK;
    if (!dsarl_environment_has_components(tr->env_ops))
        return dsarl_recipe_fail(tr->root, "grpo.adv_estimator.name", err, DSARL_E_INVALID,
                                 "is gdpo but environment '%s' scores a single reward (no ABI 1.4 reward vector); "
                                 "use the grpo estimator", tr->env_ops->common.name);
    size_t k = tr->env_ops->reward_components(tr->env, NULL);
    if (k > DSARL_MAX_REWARD_COMPONENTS)
        return DSARL_FAIL(err, DSARL_E_INVALID, "environment '%s' reports %zu reward components, more than the %d "
                          "the environment ABI allows", tr->env_ops->common.name, k, DSARL_MAX_REWARD_COMPONENTS);
    tr->n_components = (int64_t)k;
    const grpo_advantage_config *a = &tr->cfg.advantage;
    if (a->n_reward_weights != 0 && a->n_reward_weights != tr->n_components)
        return dsarl_recipe_fail(tr->root, "grpo.adv_estimator.reward_weights", err, DSARL_E_INVALID,
                                 "has %lld entries but environment '%s' scores %lld reward components; give one weight "
                                 "per component, in the order of their sorted names", (long long)a->n_reward_weights,
                                 tr->env_ops->common.name, (long long)tr->n_components);
    if (tr->n_components < 2)
        return dsarl_recipe_fail(tr->root, "grpo.adv_estimator.name", err, DSARL_E_INVALID,
                                 "is gdpo but environment '%s' scores %lld reward component(s); GDPO needs at least 2",
                                 tr->env_ops->common.name, (long long)tr->n_components);
    return DSARL_OK;
}

/* The engine's routing rows of a generate() result into gen (routing replay on), refusing an engine that did not
 * record them. */
static int copy_routing(const trainer *tr, const dsarl_generation_result *res, int64_t local, grpo_completions *gen,
                        dsarl_error *err)
{
    int64_t we = tr->replay_w_experts, wi = tr->replay_w_indices;
    if (we == 0 && wi == 0)
        return DSARL_OK;
    if (!res->cu_routed || (we && !res->routed_experts) || (wi && !res->routed_indices))
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "generation plugin '%s' returned no routing rows; "
                          "policy.router_replay / policy.dsa_index_replay need an engine that records them",
                          tr->ctx->generation_ops->common.name);
    size_t rows = (size_t)res->cu_routed[local];
    gen->cu_routed = malloc(sizeof(int32_t) * (size_t)(local + 1));
    gen->routed_experts = malloc(sizeof(int32_t) * (rows * (size_t)we + 1));
    gen->routed_indices = malloc(sizeof(int32_t) * (rows * (size_t)wi + 1));
    if (!gen->cu_routed || !gen->routed_experts || !gen->routed_indices)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory copying the routing of %zu tokens", rows);
    memcpy(gen->cu_routed, res->cu_routed, sizeof(int32_t) * (size_t)(local + 1));
    if (we)
        memcpy(gen->routed_experts, res->routed_experts, sizeof(int32_t) * rows * (size_t)we);
    if (wi)
        memcpy(gen->routed_indices, res->routed_indices, sizeof(int32_t) * rows * (size_t)wi);
    return DSARL_OK;
}

/* Completions of the packed prompts (this rank's `local` rows) from the generation engine, or the model's own
 * sampler without one; a rank with no rows takes its expert-parallel peers' passes empty-handed. */
static int generate_once(trainer *tr, const dsarl_token_batch *prompts, int64_t local, const dsarl_sampling_params *sp,
                         grpo_completions *gen, dsarl_error *err)
{
    int rc = DSARL_OK;
    if (local == 0 && dsarl_group_size(sp->lockstep) > 1 && tr->engine) {
        /* no prompts here, but expert-parallel peers route tokens to this rank's experts: take every pass with them */
        dsarl_generation_result res = {.struct_size = sizeof res};
        rc = tr->ctx->generation_ops->generate(tr->engine, prompts, sp, &res, err);
        gen->cu_lengths = calloc(1, sizeof(int32_t));
        if (rc == DSARL_OK && !gen->cu_lengths)
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for an empty generation");
    } else if (local == 0) {
        /* more ranks than prompts: nothing to generate here, but the gather below still needs this rank */
        gen->cu_lengths = calloc(1, sizeof(int32_t));
        if (!gen->cu_lengths)
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for an empty generation");
    } else if (tr->engine) {
        dsarl_generation_result res = {.struct_size = sizeof res};
        rc = tr->ctx->generation_ops->generate(tr->engine, prompts, sp, &res, err);
        if (rc == DSARL_OK) {
            size_t T = (size_t)res.cu_lengths[local];
            gen->n_sequences = (int32_t)local;
            gen->cu_lengths = malloc(sizeof(int32_t) * (size_t)(local + 1));
            gen->tokens = malloc(sizeof(int32_t) * (T ? T : 1));
            gen->logprobs = malloc(sizeof(float) * (T ? T : 1));
            gen->truncated = malloc((size_t)local);
            if (!gen->cu_lengths || !gen->tokens || !gen->logprobs || !gen->truncated) {
                rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory copying %zu generated tokens", T);
            } else {
                memcpy(gen->cu_lengths, res.cu_lengths, sizeof(int32_t) * (size_t)(local + 1));
                memcpy(gen->tokens, res.tokens, sizeof(int32_t) * T);
                memcpy(gen->logprobs, res.logprobs, sizeof(float) * T);
                memcpy(gen->truncated, res.truncated, (size_t)local);
                rc = copy_routing(tr, &res, local, gen, err);
            }
        }
    } else if (sp->n_stop_strings > 0) {
        rc = DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "policy.generation.stop_strings need a generation plugin "
                        "(policy.generation.backend); the built-in sampler stops on token ids only");
    } else {
        rc = grpo_sample_with_model(tr->ctx->model_ops, tr->model, prompts, sp, gen, err);
    }
    return rc;
}

/* Appends n tokens (with log-probs, or NAN for an observation's) to a rollout's response. */
static int append_tokens(rollout *r, const int32_t *ids, const float *lp, size_t n, dsarl_error *err)
{
    size_t len = (size_t)r->response_len + n;
    int32_t *tok = realloc(r->response, sizeof(int32_t) * (len ? len : 1));
    if (tok)
        r->response = tok;
    float *l = tok ? realloc(r->response_lp, sizeof(float) * (len ? len : 1)) : NULL;
    if (!tok || !l)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory growing a response to %zu tokens", len);
    r->response_lp = l;
    for (size_t i = 0; i < n; i++) {
        r->response[r->response_len + (int32_t)i] = ids[i];
        r->response_lp[r->response_len + (int32_t)i] = lp ? lp[i] : NAN;
    }
    r->response_len = (int32_t)len;
    return DSARL_OK;
}

/* The turns after the first of this rank's multi-turn episodes rows[0, local): the environment answers each turn
 * (an observation to append, or the end of the episode with its reward), then the episodes still running generate
 * their next turn from prompt + everything so far (re-prefilled). A turn cut at max_new_tokens is answered like
 * any other (the environment judges the partial text). An episode also ends at grpo.max_rollout_turns or when the
 * sequence is full (truncated); those are scored on their whole text. Every rank takes
 * as many turns as the busiest one; a turn's draws come from the Philox streams of the running episodes' positions
 * among all ranks' running episodes, with a per-turn seed, so the result does not depend on the layout. */
static int run_turns(trainer *tr, rollout *rows, int64_t local, const dsarl_sampling_params *sp0, float *rewards,
                     dsarl_verdict *verdicts, dsarl_error *err)
{
    const dsarl_environment_ops *eo = tr->env_ops;
    const dsarl_group *dpg = grpo_dp_group(tr);
    const int64_t max_turns = tr->cfg.max_rollout_turns, cap = tr->opt.max_total_len;
    const size_t cnt = (size_t)(local ? local : 1);
    uint8_t *done = calloc(cnt, 1), *sdone = calloc(cnt, 1), *judged = calloc(cnt, 1);
    int32_t *turn_start = calloc(cnt, sizeof(int32_t)), *idx = calloc(cnt, sizeof(int32_t));
    int32_t *turn_of = calloc(cnt, sizeof(int32_t)), *calls = calloc(cnt, sizeof(int32_t));
    int32_t *invalid = calloc(cnt, sizeof(int32_t));
    char **texts = calloc(cnt, sizeof(char *));
    const char **truths = calloc(cnt, sizeof(char *)), **obs = calloc(cnt, sizeof(char *));
    float *srew = calloc(cnt, sizeof(float));
    dsarl_verdict *sver = calloc(cnt, sizeof(dsarl_verdict));
    int32_t dp = dsarl_group_size(dpg), me = dsarl_group_rank(dpg);
    int64_t *counts = calloc((size_t)dp, sizeof(int64_t));
    int rc = done && sdone && judged && turn_start && idx && turn_of && calls && invalid && texts && truths && obs &&
                     srew && sver && counts
                 ? DSARL_OK
                 : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for %" PRId64 " multi-turn episodes", local);
    for (int64_t i = 0; i < local; i++)
        rows[i].turns = 1;
    for (int64_t turn = 0; rc == DSARL_OK; turn++) {
        // the environment's answer to this turn of every running episode
        int64_t m = 0;
        for (int64_t i = 0; i < local && rc == DSARL_OK; i++) {
            if (done[i])
                continue;
            rollout *r = &rows[i];
            idx[m] = (int32_t)i, truths[m] = r->example->ground_truth, turn_of[m] = (int32_t)turn;
            rc = dsarl_tokenizer_decode(tr->tok, r->response + turn_start[i], (size_t)(r->response_len - turn_start[i]),
                                        1, &texts[m], NULL, err);
            m++;
        }
        if (rc == DSARL_OK && m > 0)
            rc = eo->step(tr->env, (size_t)m, (const char *const *)texts, truths, turn_of, obs, sdone, srew, sver,
                          calls, invalid, err);
        for (int64_t k = 0; k < m && rc == DSARL_OK; k++) {
            rollout *r = &rows[idx[k]];
            r->tool_calls += calls[k], r->invalid_tool_calls += invalid[k];
            if (sdone[k]) {
                done[idx[k]] = judged[idx[k]] = 1;
                r->ended_by_env = 1;
                rewards[idx[k]] = srew[k], verdicts[idx[k]] = sver[k];
                continue;
            }
            if (turn + 1 >= max_turns) {
                done[idx[k]] = 1;
                continue;
            }
            int32_t *ids = NULL;
            size_t n_ids = 0;
            if (obs[k] && obs[k][0])
                rc = dsarl_tokenizer_encode(tr->tok, obs[k], strlen(obs[k]), &ids, &n_ids, err);
            // the observation and at least one more generated token must fit the sequence
            if (rc == DSARL_OK && r->prompt_len + r->response_len + (int64_t)n_ids + 1 > cap) {
                r->truncated = 1;
                done[idx[k]] = 1;
            } else if (rc == DSARL_OK) {
                rc = append_tokens(r, ids, NULL, n_ids, err);
                r->env_tokens += (int32_t)n_ids;
            }
            free(ids);
        }
        for (int64_t k = 0; k < m; k++)
            free(texts[k]), texts[k] = NULL;
        if (rc != DSARL_OK)
            break;

        // the next turn of the episodes still running, on every rank as long as any rank has one
        int64_t running = 0, shortest = cap;
        for (int64_t i = 0; i < local; i++)
            if (!done[i]) {
                running++;
                int64_t len = rows[i].prompt_len + rows[i].response_len;
                shortest = len < shortest ? len : shortest;
            }
        /* the most episodes running on any rank, and (negated) the shortest conversation of the whole batch: the
         * engine generates up to the room of that one, and each episode keeps what fits its own room below */
        int64_t agree[2] = {running, -shortest};
        rc = dsarl_group_all_reduce_host(dpg, agree, 2, DSARL_DTYPE_I64, DSARL_REDUCE_MAX, err);
        if (rc == DSARL_OK && dsarl_group_size(sp0->lockstep) > 1)
            rc = dsarl_group_all_reduce_host(sp0->lockstep, agree, 1, DSARL_DTYPE_I64, DSARL_REDUCE_MAX, err);
        if (rc != DSARL_OK || agree[0] == 0)
            break;
        if (rc == DSARL_OK)
            rc = dsarl_group_all_gather_host(dpg, counts, &running, 1, DSARL_DTYPE_I64, err);
        int64_t offset = 0;
        for (int32_t q = 0; q < me; q++)
            offset += counts[q];
        int64_t n_tokens = 0;
        for (int64_t i = 0; i < local; i++)
            if (!done[i])
                n_tokens += rows[i].prompt_len + rows[i].response_len;
        int32_t *tokens = malloc(sizeof(int32_t) * (size_t)(n_tokens ? n_tokens : 1));
        int32_t *cu = malloc(sizeof(int32_t) * (size_t)(running + 1));
        if (rc == DSARL_OK && (!tokens || !cu))
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory packing %" PRId64 " turns", running);
        int64_t b = 0;
        if (rc == DSARL_OK) {
            cu[0] = 0;
            for (int64_t i = 0; i < local; i++) {
                if (done[i])
                    continue;
                const rollout *r = &rows[i];
                memcpy(tokens + cu[b], r->prompt, sizeof(int32_t) * (size_t)r->prompt_len);
                memcpy(tokens + cu[b] + r->prompt_len, r->response, sizeof(int32_t) * (size_t)r->response_len);
                cu[b + 1] = cu[b] + r->prompt_len + r->response_len;
                idx[b++] = (int32_t)i;
            }
        }
        dsarl_token_batch prompts = {.struct_size = sizeof prompts, .n_tokens = n_tokens,
                                     .n_sequences = (int32_t)running, .tokens = tokens, .cu_seqlens = cu};
        dsarl_sampling_params sp = *sp0;
        int64_t room = cap + agree[1];
        sp.max_new_tokens = (int32_t)(room < sp0->max_new_tokens ? room : sp0->max_new_tokens);
        sp.seed = mix_seed(sp0->seed, 0x7475726eu, (uint64_t)turn + 1);  // "turn"
        sp.sequence_offset = offset;
        grpo_completions gen = {0};
        if (rc == DSARL_OK)
            rc = generate_once(tr, &prompts, running, &sp, &gen, err);
        for (int64_t k = 0; k < running && rc == DSARL_OK; k++) {
            rollout *r = &rows[idx[k]];
            turn_start[idx[k]] = r->response_len;
            /* a sequence's draws do not depend on the batch or on max_new_tokens, so cutting a completion at its
             * own room is what generating it alone with that limit gives: a long conversation elsewhere in the
             * batch does not shorten this one's turn */
            int32_t a = gen.cu_lengths[k], e = gen.cu_lengths[k + 1];
            int64_t own = cap - (r->prompt_len + r->response_len);
            bool cut = e - a > own;
            if (cut)
                e = a + (int32_t)own;
            rc = append_tokens(r, gen.tokens + a, gen.logprobs + a, (size_t)(e - a), err);
            r->truncated = gen.truncated[k] || cut;
            r->turns++;
        }
        grpo_completions_free(&gen);
        free(tokens);
        free(cu);
    }
    // episodes the environment did not end: the whole conversation judged as score() would (usually 0: no answer)
    int64_t m = 0;
    for (int64_t i = 0; i < local && rc == DSARL_OK; i++) {
        rollout *r = &rows[i];
        free(r->response_text);
        r->response_text = NULL;
        rc = dsarl_tokenizer_decode(tr->tok, r->response, (size_t)r->response_len, 1, &r->response_text, NULL, err);
        if (rc == DSARL_OK && !judged[i]) {
            idx[m] = (int32_t)i;
            texts[m] = r->response_text, truths[m++] = r->example->ground_truth;
        }
    }
    if (rc == DSARL_OK && m > 0)
        rc = eo->score(tr->env, (size_t)m, (const char *const *)texts, truths, srew, sver, err);
    for (int64_t k = 0; k < m && rc == DSARL_OK; k++)
        rewards[idx[k]] = srew[k], verdicts[idx[k]] = sver[k];
    free(done), free(sdone), free(judged), free(turn_start), free(idx), free(turn_of), free(calls), free(invalid);
    free(texts), free(truths), free(obs), free(srew), free(sver), free(counts);
    return rc;
}

/* Generates `n_gen` responses for each of n examples and scores them; appends n * n_gen rollouts (group after
 * group) to out. Under data parallelism each rank generates and scores whole prompt groups of its share, drawing
 * from the streams of their global rows, and the rollouts are then gathered so every rank holds all of them. */
int grpo_run_rollouts(trainer *tr, const dsarl_example *const *examples, size_t n, int64_t n_gen, float temperature,
                        float top_p, int32_t top_k, uint64_t seed, rollout_set *out, dsarl_error *err)
{
    int64_t first = out->n;
    int64_t total = (int64_t)n * n_gen;
    int rc = DSARL_OK;
    int64_t max_prompt = 0;
    /* every rank encodes every prompt (cheap, and the gathered rollouts need them) */
    for (size_t p = 0; p < n && rc == DSARL_OK; p++) {
        for (int64_t g = 0; g < n_gen && rc == DSARL_OK; g++) {
            rollout *r = rollout_set_push(out);
            if (!r)
                return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory holding %" PRId64 " rollouts", total);
            r->example = examples[p];
            rc = encode_prompt(tr, examples[p], r, err);
            if (rc == DSARL_OK && r->prompt_len > max_prompt)
                max_prompt = r->prompt_len;
        }
    }
    if (rc < 0)
        return rc;
    int64_t room = tr->opt.max_total_len - max_prompt;
    if (room < 1)
        return DSARL_FAIL(err, DSARL_E_INVALID, "a prompt of %" PRId64 " tokens leaves no room to generate within "
                          "policy.max_total_sequence_length = %" PRId64 "; lower data.max_input_seq_length",
                          max_prompt, tr->opt.max_total_len);
    if (tr->remote) // a dedicated generation rank generates and scores them (grpo_remote.c)
        return grpo_remote_rollouts(tr, examples, n, n_gen, temperature, top_p, top_k, seed, out, first, err);
    /* max_new comes from the longest prompt of the WHOLE batch, so every rank caps its rows as one process does */
    int32_t max_new = (int32_t)(tr->opt.max_new_tokens < room ? tr->opt.max_new_tokens : room);
    const dsarl_group *dpg = grpo_rollout_group(tr);
    int64_t lo, hi;
    rank_rows(n, n_gen, dsarl_group_size(dpg), dsarl_group_rank(dpg), &lo, &hi);
    int64_t local = hi - lo, n_tokens = 0;
    for (int64_t i = lo; i < hi; i++)
        n_tokens += out->items[first + i].prompt_len;
    int32_t *tokens = malloc(sizeof(int32_t) * (size_t)(n_tokens ? n_tokens : 1));
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(local + 1));
    if (!tokens || !cu) {
        free(tokens);
        free(cu);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory packing %" PRId64 " prompts", local);
    }
    cu[0] = 0;
    for (int64_t i = 0; i < local; i++) {
        rollout *r = &out->items[first + lo + i];
        memcpy(tokens + cu[i], r->prompt, sizeof(int32_t) * (size_t)r->prompt_len);
        cu[i + 1] = cu[i] + r->prompt_len;
    }
    dsarl_token_batch prompts = {.struct_size = sizeof prompts, .n_tokens = n_tokens, .n_sequences = (int32_t)local,
                                 .tokens = tokens, .cu_seqlens = cu};
    dsarl_sampling_params sp = {.struct_size = sizeof sp, .temperature = temperature, .top_p = top_p,
                                .top_k = top_k, .max_new_tokens = max_new, .stop_token_ids = tr->opt.stop_ids,
                                .n_stop_token_ids = tr->opt.n_stop_ids, .stop_strings = tr->opt.stop_strings,
                                .n_stop_strings = tr->opt.n_stop_strings, .seed = seed, .tokenizer = tr->tok,
                                .sequence_offset = lo, .lockstep = grpo_lockstep_group(tr),
                                .record_routing = (tr->replay_w_experts ? DSARL_RECORD_EXPERTS : 0u) |
                                                  (tr->replay_w_indices ? DSARL_RECORD_INDICES : 0u)};
    grpo_completions gen = {0};
    rc = generate_once(tr, &prompts, local, &sp, &gen, err);
    free(tokens);
    free(cu);
    size_t cnt = (size_t)(local ? local : 1);
    const char **responses = calloc(cnt, sizeof(char *));
    const char **truths = calloc(cnt, sizeof(char *));
    float *rewards = calloc(cnt, sizeof(float));
    dsarl_verdict *verdicts = calloc(cnt, sizeof(dsarl_verdict));
    if (rc == DSARL_OK && (!responses || !truths || !rewards || !verdicts))
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory scoring %" PRId64 " responses", local);
    for (int64_t i = 0; i < local && rc == DSARL_OK; i++) {
        rollout *r = &out->items[first + lo + i];
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
        if (gen.cu_routed) { // the rows of prompt + response (the engine's order: the same tokens)
            size_t rows = (size_t)(gen.cu_routed[i + 1] - gen.cu_routed[i]), we = (size_t)tr->replay_w_experts,
                   wi = (size_t)tr->replay_w_indices;
            r->routed_experts = we ? malloc(sizeof(int32_t) * rows * we) : NULL;
            r->routed_indices = wi ? malloc(sizeof(int32_t) * rows * wi) : NULL;
            if ((we && !r->routed_experts) || (wi && !r->routed_indices)) {
                rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory holding the routing of %zu tokens", rows);
                break;
            }
            if (we)
                memcpy(r->routed_experts, gen.routed_experts + (size_t)gen.cu_routed[i] * we, sizeof(int32_t) * rows * we);
            if (wi)
                memcpy(r->routed_indices, gen.routed_indices + (size_t)gen.cu_routed[i] * wi, sizeof(int32_t) * rows * wi);
        }
        rc = dsarl_tokenizer_decode(tr->tok, r->response, (size_t)len, 1, &r->response_text, NULL, err);
        responses[i] = r->response_text;
        truths[i] = r->example->ground_truth;
    }
    grpo_completions_free(&gen);
    float *components = NULL;
    if (rc == DSARL_OK && tr->n_components > 0) {
        components = calloc(cnt * (size_t)tr->n_components, sizeof(float));
        if (!components)
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for %" PRId64 " reward vectors", local);
    }
    if (rc == DSARL_OK && local > 0 && tr->cfg.max_rollout_turns > 1)
        rc = run_turns(tr, &out->items[first + lo], local, &sp, rewards, verdicts, err);
    else if (rc == DSARL_OK && local > 0)
        rc = components ? tr->env_ops->score_components(tr->env, (size_t)local, responses, truths, rewards, verdicts,
                                                        components, err)
                        : tr->env_ops->score(tr->env, (size_t)local, responses, truths, rewards, verdicts, err);
    else if (rc == DSARL_OK && tr->cfg.max_rollout_turns > 1)
        rc = run_turns(tr, &out->items[first + lo], 0, &sp, rewards, verdicts, err); /* the other ranks' turns */
    for (int64_t i = 0; i < local && rc == DSARL_OK; i++) {
        rollout *r = &out->items[first + lo + i];
        r->raw_reward = r->reward = rewards[i];
        r->verdict = verdicts[i];
        r->loss_multiplier = r->prompt_cut ? 0.0f : 1.0f;
        for (int64_t k = 0; components && k < tr->n_components; k++)
            r->components[k] = components[i * tr->n_components + k];
    }
    free(components);
    free(responses);
    free(truths);
    free(rewards);
    free(verdicts);
    /* a failure on one rank must not leave its peers waiting in the gather: agree on the outcome first */
    if (dsarl_group_size(dpg) > 1) {
        int32_t failed = rc != DSARL_OK;
        dsarl_error ignored;
        if (dsarl_group_all_reduce_host(dpg, &failed, 1, DSARL_DTYPE_I32, DSARL_REDUCE_MAX, &ignored) < 0 && !rc)
            rc = DSARL_FAIL(err, ignored.code, "%s", ignored.message);
        if (failed && rc == DSARL_OK)
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "another data-parallel rank failed generating its rollouts (its "
                            "log names why)");
        if (rc == DSARL_OK)
            rc = gather_rollouts(tr, out, first, n, n_gen, err);
    }
    for (int64_t i = 0; i < total && rc == DSARL_OK; i++)
        if (out->items[first + i].verdict == DSARL_VERDICT_VERIFIER_FAILED)
            tr->verifier_failures++;
    return rc;
}

/* Draws prompt batches and generates until the step's rollouts are complete (one round without dynamic sampling). */
int grpo_collect_rollouts(trainer *tr, rollout_set *rs, int64_t *n_rounds, int64_t *epoch_out, dsarl_error *err)
{
    return grpo_collect_rollouts_for(tr, tr->step, rs, n_rounds, epoch_out, err);
}

int grpo_collect_rollouts_for(trainer *tr, int64_t step, rollout_set *rs, int64_t *n_rounds, int64_t *epoch_out,
                              dsarl_error *err)
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
        uint64_t seed = mix_seed((uint64_t)c->seed, 1 + (uint64_t)*n_rounds, (uint64_t)step);
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
