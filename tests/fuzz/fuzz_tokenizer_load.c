/* fuzz_tokenizer_load.c: a tokenizer.json loaded, then text encoded, the ids decoded (with and without special
 * tokens) and the built-in chat templates rendered and encoded: what a tokenizer.json does to everything after the
 * load. Input: tokenizer.json, then optionally "\n%%\n" and the text. Seeds are small tokenizers (see
 * make_tokenizer_seeds.py) and options/tokenizer_load caps inputs at 8 KiB: the JSON parse is the cost of an input.
 * fuzz_tokenizer_encode fuzzes the text side against one fixed tokenizer. */
#include "fuzz_common.h"

#include "dsarl/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t json_n, rest;
    fuzz_split(data, size, "\n%%\n", &json_n, &rest);
    char path[512];
    fuzz_write("tokenizer.json", data, json_n, path, sizeof path);
    dsarl_tokenizer *tok = NULL;
    dsarl_error err;
    if (dsarl_tokenizer_load(path, &tok, &err) != 0)
        return 0;
    const char *text = (const char *)data + rest;
    size_t text_n = size - rest;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (dsarl_tokenizer_encode(tok, text, text_n, &ids, &n_ids, &err) == 0) {
        for (int skip = 0; skip < 2; skip++) {
            char *back = NULL;
            size_t len = 0;
            if (dsarl_tokenizer_decode(tok, ids, n_ids, skip, &back, &len, &err) == 0)
                free(back);
        }
        for (size_t i = 0; i < n_ids && i < 64; i++) {
            const char *piece = dsarl_tokenizer_id_to_token(tok, ids[i]);
            if (piece)
                (void)dsarl_tokenizer_token_to_id(tok, piece);
            (void)dsarl_tokenizer_is_special(tok, ids[i]);
        }
        free(ids);
    }
    // ids the model could emit, in and out of range
    int32_t probe[4] = {-1, 0, dsarl_tokenizer_vocab_size(tok) - 1, dsarl_tokenizer_vocab_size(tok)};
    char *back = NULL;
    if (dsarl_tokenizer_decode(tok, probe, 4, 0, &back, NULL, &err) == 0)
        free(back);
    char *content = strndup(text, text_n);
    dsarl_chat_message msgs[2] = {{.role = "system", .content = "s"}, {.role = "user", .content = content}};
    const char *templates[] = {"default", "glm", "plain", "none"};
    for (size_t t = 0; t < 4; t++) {
        char *rendered = NULL;
        if (dsarl_tokenizer_apply_chat_template(tok, templates[t], msgs, 2, 1, &rendered, &err) == 0) {
            if (dsarl_tokenizer_encode(tok, rendered, strlen(rendered), &ids, &n_ids, &err) == 0)
                free(ids);
            free(rendered);
        }
    }
    free(content);
    dsarl_tokenizer_free(tok);
    return 0;
}
