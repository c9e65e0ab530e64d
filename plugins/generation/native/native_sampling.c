/* native_sampling.c: the engine's sampling checks; the row filter itself is libdsarl's (dsarl/sampling.h). */
#include <math.h>
#include <stddef.h>
#include <string.h>
#include "dsarl/sampling.h"
#include "native_sampling.h"

void native_process_logits(float *row, int64_t V, float temperature, int32_t top_k, float top_p, int32_t *order,
                           int32_t *scratch)
{
    dsarl_sampling_filter_row(row, V, temperature, top_k, top_p, order, scratch);
}

int native_check_params(const dsarl_sampling_params *p, dsarl_error *err)
{
    if (!p || p->struct_size < offsetof(dsarl_sampling_params, seed) + sizeof(p->seed))
        return DSARL_FAIL(err, DSARL_E_INVALID, "generation native: sampling params are missing or too old "
                          "(struct_size %u)", p ? p->struct_size : 0u);
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return DSARL_FAIL(err, DSARL_E_INVALID, "generation native: temperature must be a finite value >= 0 (0 = "
                          "greedy), got %g", (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return DSARL_FAIL(err, DSARL_E_INVALID, "generation native: top_p must be in (0, 1] (1 = off), got %g",
                          (double)p->top_p);
    if (p->top_k < -1)
        return DSARL_FAIL(err, DSARL_E_INVALID, "generation native: top_k must be >= 1, or 0 / -1 for off, got %d",
                          p->top_k);
    if (p->max_new_tokens < 1)
        return DSARL_FAIL(err, DSARL_E_INVALID, "generation native: max_new_tokens must be >= 1, got %d",
                          p->max_new_tokens);
    if (p->n_stop_token_ids < 0 || (p->n_stop_token_ids > 0 && !p->stop_token_ids))
        return DSARL_FAIL(err, DSARL_E_INVALID, "generation native: stop_token_ids is NULL with n_stop_token_ids %d",
                          p->n_stop_token_ids);
    if (p->n_stop_strings < 0 || (p->n_stop_strings > 0 && !p->stop_strings))
        return DSARL_FAIL(err, DSARL_E_INVALID, "generation native: stop_strings is NULL with n_stop_strings %d",
                          p->n_stop_strings);
    bool has_tok = p->struct_size >= offsetof(dsarl_sampling_params, tokenizer) + sizeof(p->tokenizer) &&
                   p->tokenizer;
    for (int32_t i = 0; i < p->n_stop_strings; i++)
        if (!p->stop_strings[i] || !p->stop_strings[i][0])
            return DSARL_FAIL(err, DSARL_E_INVALID, "generation native: stop string %d is NULL or empty", i);
    if (p->n_stop_strings > 0 && !has_tok)
        return DSARL_FAIL(err, DSARL_E_INVALID, "generation native: %d stop strings were given without a tokenizer "
                          "to decode completions; set dsarl_sampling_params.tokenizer", p->n_stop_strings);
    return DSARL_OK;
}
