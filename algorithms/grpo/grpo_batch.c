#define _POSIX_C_SOURCE 200809L /* clock_gettime */
/* grpo_batch.c: the step's rollouts -> rewards (scaling, shaping) -> advantages (+ overlong filtering) -> the
 * packed THD batch the log-prob passes and the loss read. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpo_loop.h"

int grpo_batch_advantages(trainer *tr, rollout_set *rs, dsarl_error *err)
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
    free(p->sample_mask);
    free(p->advantages);
    memset(p, 0, sizeof *p);
}

int grpo_pack_rollouts(const rollout_set *rs, packed_batch *p, dsarl_error *err)
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
