#define _POSIX_C_SOURCE 200809L /* clock_gettime */
/* grpo_batch.c: the step's rollouts -> the ONE batch the rest of the step reads: packed THD tokens and per-token
 * arrays for the log-prob passes and the loss, per-sequence rewards, lengths and masks that the advantage code
 * (scaling, shaping, advantages, overlong filtering) updates in place. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpo_loop.h"

/* train/reward_components/<name>: the batch mean of each reward component GDPO normalises separately. */
static int log_component_means(trainer *tr, const packed_batch *p, dsarl_error *err)
{
    const char *const *names = NULL;
    size_t k = tr->env_ops->reward_components(tr->env, &names);
    for (int64_t c = 0; c < p->n_components && (size_t)c < k && names; c++) {
        double sum = 0.0;
        for (int64_t i = 0; i < p->B; i++)
            sum += p->components[i * p->n_components + c];
        char key[160];
        snprintf(key, sizeof key, "train/reward_components/%s", names[c]);
        DSARL_TRY(grpo_set_metric(tr, key, p->B > 0 ? sum / (double)p->B : 0.0, err));
    }
    return DSARL_OK;
}

int grpo_batch_advantages(trainer *tr, packed_batch *p, dsarl_error *err)
{
    const grpo_config *c = &tr->cfg;
    int64_t n = p->B, G = c->num_generations_per_prompt;
    memcpy(p->reward, p->raw_reward, sizeof(float) * (size_t)n);
    grpo_scale_rewards(&c->reward_scaling, p->reward, n);
    DSARL_TRY(grpo_shape_rewards(&c->reward_shaping, p->reward, p->response_len, p->truncated, n, err));
    if (c->advantage.estimator == GRPO_ESTIMATOR_GDPO) {
        DSARL_TRY(grpo_gdpo_advantages(&c->advantage, p->components, p->n_components, n / G, G, p->advantages, err));
        DSARL_TRY(log_component_means(tr, p, err));
    }
    else if (c->advantage.estimator == GRPO_ESTIMATOR_GRPO)
        DSARL_TRY(grpo_compute_advantages(&c->advantage, p->reward, n / G, G, p->advantages, err));
    /* Reinforce++ normalises over the tokens that train: grpo_batch_late_advantages, once the masks are final */
    if (c->overlong_filtering)
        grpo_overlong_filter(p->truncated, p->sample_mask, n);
    return DSARL_OK;
}

bool grpo_needs_old_logprobs_early(const grpo_config *cfg)
{
    return !isnan(cfg->seq_logprob_error_threshold) ||
           (cfg->advantage.estimator == GRPO_ESTIMATOR_REINFORCE_PP && cfg->loss.use_kl_in_reward);
}

int grpo_batch_late_advantages(trainer *tr, const rollout_set *rs, packed_batch *p, dsarl_error *err)
{
    const grpo_config *c = &tr->cfg;
    int64_t n = p->B, G = c->num_generations_per_prompt;
    if (!isnan(c->seq_logprob_error_threshold)) {
        grpo_seq_logprob_error_mask(c->seq_logprob_error_threshold, n, p->cu, p->mask, p->lp_old, p->lp_gen,
                                    p->reward, p->sample_mask, &p->seq_error);
        p->has_seq_error = true;
    }
    if (c->advantage.estimator == GRPO_ESTIMATOR_REINFORCE_PP) {
        p->token_adv = malloc(sizeof(float) * (size_t)(p->T ? p->T : 1));
        if (!p->token_adv)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for %" PRId64 " token advantages", p->T);
        double kl_coef = c->loss.use_kl_in_reward ? c->loss.reference_policy_kl_penalty : 0.0;
        DSARL_TRY(grpo_reinforce_pp_advantages(&c->advantage, p->reward, n / G, G, p->cu, p->mask, p->sample_mask,
                                               kl_coef, c->loss.kl_type, p->lp_old, tr->reference ? p->lp_ref : NULL,
                                               p->token_adv, err));
        if (kl_coef != 0.0 && tr->reference)
            DSARL_TRY(grpo_set_metric(tr, "train/kl_in_reward",
                                      grpo_reward_kl_mean(c->loss.kl_type, n, p->cu, p->mask, p->sample_mask,
                                                          p->lp_old, p->lp_ref), err));
        /* the per-sequence value logged and dumped: the mean over its trained tokens */
        for (int64_t s = 0; s < n; s++) {
            double sum = 0.0, cnt = 0.0;
            for (int64_t t = p->cu[s]; t < p->cu[s + 1]; t++)
                sum += p->mask[t] * p->token_adv[t], cnt += p->mask[t];
            p->advantages[s] = cnt > 0.0 ? (float)(sum / cnt) : 0.0f;
        }
    }
    if (!isnan(c->malformed_thinking_advantage) || !isnan(c->invalid_tool_call_advantage)) {
        const char **prompts = malloc(sizeof(char *) * (size_t)(n ? n : 1));
        const char **responses = malloc(sizeof(char *) * (size_t)(n ? n : 1));
        if (!prompts || !responses) {
            free(prompts);
            free(responses);
            return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for %" PRId64 " responses", n);
        }
        for (int64_t s = 0; s < n; s++)
            prompts[s] = rs->items[s].prompt_text, responses[s] = rs->items[s].response_text;
        grpo_apply_message_penalties(&c->advantage, c->invalid_tool_call_advantage, c->malformed_thinking_advantage,
                                     n, prompts, responses, p->cu, p->advantages, p->token_adv, &p->penalties);
        free(prompts);
        free(responses);
    }
    return DSARL_OK;
}

void grpo_packed_free(packed_batch *p)
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
    free(p->raw_reward);
    free(p->reward);
    free(p->response_len);
    free(p->truncated);
    free(p->sample_mask);
    free(p->advantages);
    free(p->components);
    free(p->token_adv);
    free(p->replay_experts);
    free(p->replay_indices);
    memset(p, 0, sizeof *p);
}

/* The rollouts' routing rows at their packed positions (-1 where a rollout has none: the trainer routes itself). */
static int pack_routing(const trainer *tr, const rollout_set *rs, packed_batch *p, dsarl_error *err)
{
    size_t we = (size_t)tr->replay_w_experts, wi = (size_t)tr->replay_w_indices, T = (size_t)p->T;
    if (we && !(p->replay_experts = malloc(sizeof(int32_t) * (T * we + 1))))
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory packing the routing of %zu tokens", T);
    if (wi && !(p->replay_indices = malloc(sizeof(int32_t) * (T * wi + 1))))
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory packing the routing of %zu tokens", T);
    // the packed sequences are the rollouts' prompt + response tokens end to end, as the rows are laid out
    if (we)
        grpo_routing_pack(tr, rs->items, rs->n, 0, p->replay_experts);
    if (wi)
        grpo_routing_pack(tr, rs->items, rs->n, 1, p->replay_indices);
    return DSARL_OK;
}

int grpo_pack_rollouts(const trainer *tr, const rollout_set *rs, packed_batch *p, dsarl_error *err)
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
    p->advantages = calloc(B, sizeof(float));
    p->raw_reward = malloc(sizeof(float) * B);
    p->reward = malloc(sizeof(float) * B);
    p->response_len = malloc(sizeof(int64_t) * B);
    p->truncated = malloc(B);
    if (!p->tokens || !p->targets || !p->cu || !p->lp_gen || !p->mask || !p->lp_old || !p->lp_ref ||
        !p->lp_theta || !p->grad || !p->sample_mask || !p->advantages || !p->raw_reward || !p->reward || !p->response_len || !p->truncated) {
        grpo_packed_free(p);
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
            /* observation tokens of multi-turn episodes carry NAN log-probs: they do not train */
            if (j + 1 < L && k >= 0 && !isnan(r->response_lp[k])) {
                p->mask[at + j] = 1.0f;
                p->lp_gen[at + j] = r->response_lp[k];
            }
        }
        at += L;
        p->cu[i + 1] = (int32_t)at;
        p->sample_mask[i] = r->loss_multiplier;
        p->raw_reward[i] = r->raw_reward;
        p->response_len[i] = r->response_len;
        p->truncated[i] = r->truncated;
    }
    int rc = pack_routing(tr, rs, p, err);
    if (rc)
        grpo_packed_free(p);
    return rc;
}
