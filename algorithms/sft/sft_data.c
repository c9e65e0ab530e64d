/* sft_data.c: an example becomes prompt tokens (chat template with the assistant's opening) + answer tokens + EOS,
 * with targets only on the answer. Prompt and answer are encoded separately, as generation sees them: the model
 * continues the rendered prompt's tokens, so that is the boundary it must learn to continue from. */
#include <stdlib.h>
#include <string.h>
#include "sft.h"

void sft_sample_free(sft_sample *s)
{
    free(s->tokens);
    free(s->targets);
    free(s->answer);
    memset(s, 0, sizeof *s);
}

// answer_format with its first "{}" replaced by truth (malloc'd), or NULL when out of memory.
static char *format_answer(const char *answer_format, const char *truth)
{
    const char *hole = strstr(answer_format, "{}");
    size_t head = hole ? (size_t)(hole - answer_format) : strlen(answer_format);
    const char *tail = hole ? hole + 2 : "";
    size_t n = head + strlen(truth) + strlen(tail);
    char *out = malloc(n + 1);
    if (!out)
        return NULL;
    memcpy(out, answer_format, head);
    strcpy(out + head, hole ? truth : "");
    strcat(out, tail);
    return out;
}

int sft_build_sample(const dsarl_tokenizer *tok, const char *chat_template, const char *answer_format,
                     const dsarl_example *ex, int64_t max_seq_len, sft_sample *out, dsarl_error *err)
{
    memset(out, 0, sizeof *out);
    char *prompt_text = NULL;
    int32_t *prompt = NULL, *answer = NULL;
    size_t n_prompt = 0, n_answer = 0;
    int rc = dsarl_tokenizer_apply_chat_template(tok, chat_template, ex->messages, ex->n_messages, 1, &prompt_text,
                                                 err);
    if (rc == 0)
        rc = dsarl_tokenizer_encode(tok, prompt_text, strlen(prompt_text), &prompt, &n_prompt, err);
    if (rc == 0) {
        out->answer = format_answer(answer_format, ex->ground_truth ? ex->ground_truth : "");
        rc = out->answer ? DSARL_OK : DSARL_FAIL(err, DSARL_E_NOMEM, "sft: out of memory building a sample");
    }
    if (rc == 0)
        rc = dsarl_tokenizer_encode(tok, out->answer, strlen(out->answer), &answer, &n_answer, err);
    int32_t eos = dsarl_tokenizer_eos_id(tok);
    size_t n = n_prompt + n_answer + (eos >= 0);
    if (rc == 0 && n_prompt == 0)
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "sft: a prompt rendered with template '%s' encoded to zero tokens",
                        chat_template ? chat_template : "default");
    if (rc == 0 && n > (size_t)max_seq_len)
        n = (size_t)max_seq_len; // cut from the end, as NeMo's SFT truncation keeps the prompt's start
    if (rc == 0) {
        out->tokens = malloc(n * sizeof(int32_t));
        out->targets = malloc(n * sizeof(int32_t));
        if (!out->tokens || !out->targets)
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "sft: out of memory building a sample");
    }
    if (rc == 0) {
        // (n) prompt | answer | EOS, then targets[t] = tokens[t + 1] on the answer part
        for (size_t t = 0; t < n; t++)
            out->tokens[t] = t < n_prompt ? prompt[t] : t < n_prompt + n_answer ? answer[t - n_prompt] : eos;
        out->n = (int32_t)n;
        out->prompt_len = (int32_t)(n_prompt < n ? n_prompt : n);
        for (size_t t = 0; t < n; t++) {
            bool scored = t + 1 < n && t + 1 >= n_prompt;
            out->targets[t] = scored ? out->tokens[t + 1] : -1;
            out->n_answer += scored;
        }
    }
    free(prompt_text);
    free(prompt);
    free(answer);
    if (rc)
        sft_sample_free(out);
    return rc;
}
