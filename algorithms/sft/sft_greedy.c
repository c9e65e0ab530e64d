/* sft_greedy.c: greedy decoding for SFT validation, deliberately tiny: no KV cache, every new token reruns the
 * packed sequences through forward_logits (the cost is quadratic in length, fine for short answers). */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include "sft.h"

// The index of the largest logit (the lowest id on ties).
static int32_t argmax(const float *row, int64_t V)
{
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (row[v] > row[best])
            best = v;
    return (int32_t)best;
}

int sft_greedy_complete(const dsarl_model_ops *ops, dsarl_model *model, const dsarl_tokenizer *tok,
                        const sft_sample *samples, int64_t n, int64_t max_new, char **texts, dsarl_error *err)
{
    int64_t V = ops->vocab_size(model), stride = 0, cap = 0;
    int32_t eos = dsarl_tokenizer_eos_id(tok);
    for (int64_t i = 0; i < n; i++) {
        stride = samples[i].prompt_len + max_new > stride ? samples[i].prompt_len + max_new : stride;
        cap += samples[i].prompt_len + max_new;
        texts[i] = NULL;
    }
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(n * stride + 1)); // (n, stride) prompt + generated
    int32_t *len = calloc((size_t)n + 1, sizeof(int32_t)), *gen = calloc((size_t)n + 1, sizeof(int32_t));
    int32_t *tokens = malloc(sizeof(int32_t) * (size_t)(cap + 1)), *cu = malloc(sizeof(int32_t) * (size_t)(n + 1));
    int64_t *row_of = malloc(sizeof(int64_t) * (size_t)(n + 1));
    uint8_t *done = calloc((size_t)n + 1, 1);
    float *logits = malloc(sizeof(float) * (size_t)(cap + 1) * (size_t)V); // (T, V)
    int rc = (!seq || !len || !gen || !tokens || !cu || !row_of || !done || !logits)
                 ? DSARL_FAIL(err, DSARL_E_NOMEM, "sft: out of memory for greedy decoding of %lld samples", (long long)n)
                 : DSARL_OK;
    for (int64_t i = 0; rc == 0 && i < n; i++) {
        memcpy(seq + i * stride, samples[i].tokens, sizeof(int32_t) * (size_t)samples[i].prompt_len);
        len[i] = samples[i].prompt_len;
    }
    for (int64_t k = 0; rc == 0 && k < max_new; k++) {
        // pack the unfinished sequences; each one's next token comes from its last row
        int32_t m = 0;
        cu[0] = 0;
        for (int64_t i = 0; i < n; i++) {
            if (done[i])
                continue;
            memcpy(tokens + cu[m], seq + i * stride, sizeof(int32_t) * (size_t)len[i]);
            cu[m + 1] = cu[m] + len[i];
            row_of[m++] = i;
        }
        if (m == 0)
            break;
        dsarl_token_batch b = {.struct_size = sizeof b, .n_tokens = cu[m], .n_sequences = m, .tokens = tokens,
                               .cu_seqlens = cu};
        rc = ops->forward_logits(model, &b, logits, err);
        for (int32_t j = 0; rc == 0 && j < m; j++) {
            int64_t i = row_of[j];
            int32_t next = argmax(logits + (int64_t)(cu[j + 1] - 1) * V, V);
            seq[i * stride + len[i]++] = next;
            gen[i]++;
            if (next == eos)
                done[i] = 1;
        }
    }
    for (int64_t i = 0; rc == 0 && i < n; i++) {
        const int32_t *out = seq + i * stride + samples[i].prompt_len;
        int32_t n_out = gen[i] - (gen[i] > 0 && out[gen[i] - 1] == eos);
        rc = dsarl_tokenizer_decode(tok, out, (size_t)n_out, 1, &texts[i], NULL, err);
    }
    if (rc)
        for (int64_t i = 0; i < n; i++) {
            free(texts[i]);
            texts[i] = NULL;
        }
    free(seq), free(len), free(gen), free(tokens), free(cu), free(row_of), free(done), free(logits);
    return rc;
}

// [*begin, *end) of s without ASCII whitespace at either end.
static void trim(const char *s, const char **begin, size_t *n)
{
    while (*s && isspace((unsigned char)*s))
        s++;
    size_t k = strlen(s);
    while (k && isspace((unsigned char)s[k - 1]))
        k--;
    *begin = s;
    *n = k;
}

int sft_answer_matches(const char *completion, const char *answer)
{
    const char *a, *b;
    size_t na, nb;
    trim(completion, &a, &na);
    trim(answer, &b, &nb);
    return na == nb && memcmp(a, b, na) == 0;
}
