/* grpo_train_sample.c: the built-in sampler used when no generation plugin is loaded: every step re-runs the
 * model over the whole prefix, so its log-probabilities are, by construction, those the trainer computes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dsarl/rng.h"
#include "grpo_train.h"

void grpo_completions_free(grpo_completions *c)
{
    free(c->cu_lengths);
    free(c->tokens);
    free(c->logprobs);
    free(c->truncated);
    free(c->cu_routed);
    free(c->routed_experts);
    free(c->routed_indices);
    memset(c, 0, sizeof *c);
}

typedef struct scored_token {
    float logit;
    int32_t id;
} scored_token;

static int by_logit_desc(const void *a, const void *b)
{
    const scored_token *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit < y->logit ? 1 : -1;
    return x->id - y->id; /* ties: lower id first, so the order is total and reproducible */
}

/* Draws one token from row (V) after temperature / top-k / top-p; returns it and its log-probability under the
 * filtered, renormalised distribution. scratch holds V entries. Greedy (temperature <= 0) gives log-prob 0. */
static int32_t sample_row(const float *row, int64_t V, const dsarl_sampling_params *p, dsarl_rng *rng,
                          scored_token *scratch, float *logprob)
{
    if (p->temperature <= 0.0f) {
        int32_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (row[v] > row[best])
                best = (int32_t)v;
        *logprob = 0.0f;
        return best;
    }
    for (int64_t v = 0; v < V; v++)
        scratch[v] = (scored_token){row[v] / p->temperature, (int32_t)v};
    int64_t keep = V;
    bool filtered = (p->top_k > 0 && p->top_k < V) || (p->top_p > 0.0f && p->top_p < 1.0f);
    if (filtered) {
        qsort(scratch, (size_t)V, sizeof *scratch, by_logit_desc);
        if (p->top_k > 0 && p->top_k < V)
            keep = p->top_k;
    }
    double max = -INFINITY;
    for (int64_t i = 0; i < keep; i++)
        max = fmax(max, scratch[i].logit);
    double sum = 0.0;
    for (int64_t i = 0; i < keep; i++)
        sum += exp(scratch[i].logit - max);
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        /* smallest prefix (by probability) whose mass reaches top_p */
        double mass = 0.0;
        int64_t n = 0;
        while (n < keep) {
            mass += exp(scratch[n].logit - max) / sum;
            n++;
            if (mass >= p->top_p)
                break;
        }
        keep = n;
        sum = 0.0;
        for (int64_t i = 0; i < keep; i++)
            sum += exp(scratch[i].logit - max);
    }
    double u = (double)dsarl_rng_uniform(rng) * sum;
    int64_t pick = keep - 1;
    double acc = 0.0;
    for (int64_t i = 0; i < keep; i++) {
        acc += exp(scratch[i].logit - max);
        if (u < acc) {
            pick = i;
            break;
        }
    }
    *logprob = (float)(scratch[pick].logit - max - log(sum));
    return scratch[pick].id;
}

int grpo_sample_with_model(const dsarl_model_ops *ops, dsarl_model *model, const dsarl_token_batch *prompts,
                           const dsarl_sampling_params *params, grpo_completions *out, dsarl_error *err)
{
    memset(out, 0, sizeof *out);
    const int32_t B = prompts->n_sequences;
    const int32_t max_new = params->max_new_tokens;
    const int64_t V = ops->vocab_size(model);
    if (max_new <= 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "policy.generation.max_new_tokens must be > 0, got %d", max_new);
    int64_t max_T = prompts->n_tokens + (int64_t)B * max_new;
    int32_t *gen = malloc(sizeof(int32_t) * (size_t)B * (size_t)max_new);       // (B, max_new)
    float *gen_lp = malloc(sizeof(float) * (size_t)B * (size_t)max_new);        // (B, max_new)
    int32_t *n_gen = calloc((size_t)B, sizeof(int32_t));
    uint8_t *done = calloc((size_t)B, 1);
    int32_t *active = malloc(sizeof(int32_t) * (size_t)B);
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)max_T);
    int32_t *cu = malloc(sizeof(int32_t) * ((size_t)B + 1));
    float *logits = malloc(sizeof(float) * (size_t)max_T * (size_t)V);          // (T, V)
    scored_token *scratch = malloc(sizeof(scored_token) * (size_t)V);
    dsarl_rng *rngs = malloc(sizeof(dsarl_rng) * (size_t)B);
    out->cu_lengths = calloc((size_t)B + 1, sizeof(int32_t));
    out->truncated = calloc((size_t)B, 1);
    int rc = DSARL_OK;
    if (!gen || !gen_lp || !n_gen || !done || !active || !seq || !cu || !logits || !scratch || !rngs ||
        !out->cu_lengths || !out->truncated)
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory sampling %d sequences of up to %d new tokens", B, max_new);
    for (int32_t b = 0; rc == DSARL_OK && b < B; b++)
        dsarl_rng_init(&rngs[b], params->seed, (uint64_t)(dsarl_sampling_sequence_offset(params) + b));
    for (int32_t t = 0; rc == DSARL_OK && t < max_new; t++) {
        // pack every unfinished sequence (prompt + what it generated so far)
        int32_t n_active = 0;
        int64_t T = 0;
        cu[0] = 0;
        for (int32_t b = 0; b < B; b++) {
            if (done[b])
                continue;
            int32_t plen = prompts->cu_seqlens[b + 1] - prompts->cu_seqlens[b];
            memcpy(seq + T, prompts->tokens + prompts->cu_seqlens[b], sizeof(int32_t) * (size_t)plen);
            memcpy(seq + T + plen, gen + (size_t)b * (size_t)max_new, sizeof(int32_t) * (size_t)n_gen[b]);
            T += plen + n_gen[b];
            active[n_active++] = b;
            cu[n_active] = (int32_t)T;
        }
        if (n_active == 0)
            break;
        dsarl_token_batch batch = {.struct_size = sizeof batch, .n_tokens = T, .n_sequences = n_active,
                                   .tokens = seq, .cu_seqlens = cu};
        rc = ops->forward_logits(model, &batch, logits, err);
        for (int32_t a = 0; rc == DSARL_OK && a < n_active; a++) {
            int32_t b = active[a];
            const float *row = logits + (size_t)(cu[a + 1] - 1) * (size_t)V;
            float lp;
            int32_t tok = sample_row(row, V, params, &rngs[b], scratch, &lp);
            gen[(size_t)b * (size_t)max_new + (size_t)n_gen[b]] = tok;
            gen_lp[(size_t)b * (size_t)max_new + (size_t)n_gen[b]] = lp;
            n_gen[b]++;
            for (int32_t s = 0; s < params->n_stop_token_ids; s++)
                if (tok == params->stop_token_ids[s])
                    done[b] = 1;
            if (!done[b] && n_gen[b] == max_new) {
                done[b] = 1;
                out->truncated[b] = 1;
            }
        }
    }
    if (rc == DSARL_OK) {
        for (int32_t b = 0; b < B; b++)
            out->cu_lengths[b + 1] = out->cu_lengths[b] + n_gen[b];
        size_t total = (size_t)out->cu_lengths[B];
        out->tokens = malloc(sizeof(int32_t) * (total ? total : 1));
        out->logprobs = malloc(sizeof(float) * (total ? total : 1));
        if (!out->tokens || !out->logprobs)
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory collecting %zu sampled tokens", total);
        for (int32_t b = 0; rc == DSARL_OK && b < B; b++) {
            memcpy(out->tokens + out->cu_lengths[b], gen + (size_t)b * (size_t)max_new, sizeof(int32_t) * (size_t)n_gen[b]);
            memcpy(out->logprobs + out->cu_lengths[b], gen_lp + (size_t)b * (size_t)max_new,
                   sizeof(float) * (size_t)n_gen[b]);
        }
        out->n_sequences = B;
    }
    free(gen);
    free(gen_lp);
    free(n_gen);
    free(done);
    free(active);
    free(seq);
    free(cu);
    free(logits);
    free(scratch);
    free(rngs);
    if (rc < 0)
        grpo_completions_free(out);
    return rc;
}
