/* fuzz_tokenizer_encode.c: the text side of the tokenizer against one fixed, valid tokenizer (the GLM-style
 * fixture with a GLM-4.7-style Jinja chat template, embedded at build time and loaded once per process): text
 * encoded and decoded back, arbitrary id sequences decoded, the chat templates rendered around the text, and a
 * conversation given as JSON rendered by the Jinja template. fuzz_tokenizer_load fuzzes the tokenizer.json side.
 * Input: text, then optionally "\n%%\n" and a messages JSON array.
 * Asserted (abort = a finding): decode(encode(text)) == text byte for byte (byte-level BPE loses nothing), every
 * id encode returns maps to a token whose id is that id again, and a Jinja rendering encodes. */
#include "fuzz_common.h"

#include "dsarl/tokenizer.h"
#include "fuzz_tokenizer_fixture.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static dsarl_tokenizer *fixed_tokenizer; // loaded once: loading is fuzz_tokenizer_load's job

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char path[512];
    fuzz_write("tokenizer.json", fuzz_fixture_tokenizer_json, sizeof fuzz_fixture_tokenizer_json, path, sizeof path);
    fuzz_write("tokenizer_config.json", fuzz_fixture_tokenizer_config_json, sizeof fuzz_fixture_tokenizer_config_json,
               path, sizeof path);
    fuzz_write("chat_template.jinja", fuzz_fixture_chat_template_jinja, sizeof fuzz_fixture_chat_template_jinja, path,
               sizeof path);
    dsarl_error err;
    if (dsarl_tokenizer_load(fuzz_scratch_dir(), &fixed_tokenizer, &err) != 0) {
        fprintf(stderr, "fuzz_tokenizer_encode: the embedded fixture does not load: %s\n", err.message);
        abort();
    }
    if (!dsarl_tokenizer_has_chat_template(fixed_tokenizer)) {
        fprintf(stderr, "fuzz_tokenizer_encode: the embedded chat_template.jinja was not picked up\n");
        abort();
    }
    return 0;
}

static void check_round_trip(const dsarl_tokenizer *tok, const char *text, size_t text_n)
{
    int32_t *ids = NULL;
    size_t n_ids = 0;
    dsarl_error err;
    if (dsarl_tokenizer_encode(tok, text, text_n, &ids, &n_ids, &err) != 0) {
        fprintf(stderr, "fuzz_tokenizer_encode: encode failed on %zu bytes: %s\n", text_n, err.message);
        abort();
    }
    char *back = NULL;
    size_t len = 0;
    if (dsarl_tokenizer_decode(tok, ids, n_ids, 0, &back, &len, &err) != 0 || len != text_n ||
        memcmp(back, text, text_n) != 0) {
        fprintf(stderr, "fuzz_tokenizer_encode: decode(encode(text)) differs from the %zu-byte text\n", text_n);
        abort();
    }
    free(back);
    if (dsarl_tokenizer_decode(tok, ids, n_ids, 1, &back, &len, &err) == 0)
        free(back);
    for (size_t i = 0; i < n_ids; i++) {
        const char *piece = dsarl_tokenizer_id_to_token(tok, ids[i]);
        if (!piece || dsarl_tokenizer_token_to_id(tok, piece) != ids[i]) {
            fprintf(stderr, "fuzz_tokenizer_encode: id %d does not map to a token and back\n", (int)ids[i]);
            abort();
        }
        (void)dsarl_tokenizer_is_special(tok, ids[i]);
    }
    free(ids);
}

// The input's bytes read as ids (what a model could emit, in and out of range), decoded both ways.
static void decode_raw_ids(const dsarl_tokenizer *tok, const uint8_t *data, size_t size)
{
    int32_t ids[256];
    size_t n = size / sizeof ids[0] < 256 ? size / sizeof ids[0] : 256;
    memcpy(ids, data, n * sizeof ids[0]);
    for (int skip = 0; skip < 2; skip++) {
        char *back = NULL;
        dsarl_error err;
        if (dsarl_tokenizer_decode(tok, ids, n, skip, &back, NULL, &err) == 0)
            free(back);
        (void)dsarl_tokenizer_id_to_token(tok, n ? ids[0] : -1);
    }
}

static void encode_rendered(const dsarl_tokenizer *tok, char *rendered)
{
    int32_t *ids = NULL;
    size_t n_ids = 0;
    dsarl_error err;
    if (dsarl_tokenizer_encode(tok, rendered, strlen(rendered), &ids, &n_ids, &err) != 0) {
        fprintf(stderr, "fuzz_tokenizer_encode: a rendered template does not encode: %s\n", err.message);
        abort();
    }
    free(ids);
    free(rendered);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const dsarl_tokenizer *tok = fixed_tokenizer;
    size_t text_n, rest;
    fuzz_split(data, size, "\n%%\n", &text_n, &rest);
    const char *text = (const char *)data;
    check_round_trip(tok, text, text_n);
    decode_raw_ids(tok, data, size);

    char *content = strndup(text, text_n);
    if (!content)
        abort();
    dsarl_chat_message msgs[3] = {{.role = "system", .content = "s"}, {.role = "user", .content = content},
                                  {.role = "assistant", .content = "a"}};
    // every template renders; only the tokenizer's own (Jinja) rendering is encoded again: the text's encode is
    // the one above, and the built-in templates add nothing but the markers the Jinja one has too
    const char *templates[] = {"default", "glm", "plain", "none"};
    dsarl_error err;
    for (size_t t = 0; t < 4; t++)
        for (int gen = 0; gen < 2; gen++) {
            char *rendered = NULL;
            if (dsarl_tokenizer_apply_chat_template(tok, templates[t], msgs, gen ? 2 : 3, gen, &rendered, &err) != 0)
                continue;
            if (t == 0 && gen)
                encode_rendered(tok, rendered);
            else
                free(rendered);
        }
    free(content);

    if (rest < size) { // a conversation as JSON, rendered by the tokenizer's Jinja template
        char *messages = strndup((const char *)data + rest, size - rest);
        if (!messages)
            abort();
        char *rendered = NULL;
        if (dsarl_tokenizer_render_chat(tok, "tokenizer", messages, NULL, "{\"clear_thinking\":true}", 1, &rendered,
                                        &err) == 0)
            encode_rendered(tok, rendered);
        free(messages);
    }
    return 0;
}
