/* check_tokenizer.c: the byte tokenizer by hand, the BPE loader against Hugging Face tokenizers' own encodings
 * (tests/fixtures/tokenizer, built by tools/make_tokenizer_fixture.py), round trips on random text, chat
 * templates, and the loader's refusals. */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsarl/fileutil.h"
#include "dsarl/json.h"
#include "dsarl/tokenizer.h"

#define FIXTURES DSARL_SOURCE_DIR "/tests/fixtures/tokenizer"
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static dsarl_tokenizer *load_ok(const char *name)
{
    dsarl_tokenizer *tok = NULL;
    dsarl_error err = {0};
    ck_assert_msg(dsarl_tokenizer_load(name, &tok, &err) == 0, "%s", err.message);
    return tok;
}

static void assert_round_trip(const dsarl_tokenizer *tok, const char *s, size_t len)
{
    int32_t *ids;
    size_t n;
    char *back;
    size_t back_len;
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_tokenizer_encode(tok, s, len, &ids, &n, &err), 0);
    ck_assert_int_eq(dsarl_tokenizer_decode(tok, ids, n, 0, &back, &back_len, &err), 0);
    ck_assert_uint_eq(back_len, len);
    ck_assert_msg(memcmp(back, s, len) == 0, "round trip changed '%.*s' into '%s'", (int)len, s, back);
    free(ids);
    free(back);
}

START_TEST(test_byte_tokenizer)
{
    dsarl_tokenizer *tok = load_ok("byte");
    ck_assert_str_eq(dsarl_tokenizer_kind(tok), "byte");
    ck_assert_int_eq(dsarl_tokenizer_vocab_size(tok), 260);
    ck_assert_int_eq(dsarl_tokenizer_bos_id(tok), 256);
    ck_assert_int_eq(dsarl_tokenizer_eos_id(tok), 257);
    ck_assert_int_eq(dsarl_tokenizer_pad_id(tok), 258);
    ck_assert_int_eq(dsarl_tokenizer_token_to_id(tok, "<|sep|>"), 259);
    ck_assert_str_eq(dsarl_tokenizer_id_to_token(tok, 'A'), "A");
    ck_assert_str_eq(dsarl_tokenizer_id_to_token(tok, '\n'), "<0x0A>");
    ck_assert_int_eq(dsarl_tokenizer_token_to_id(tok, "<0xE9>"), 0xE9);
    ck_assert_ptr_null(dsarl_tokenizer_id_to_token(tok, 260));
    ck_assert(dsarl_tokenizer_is_special(tok, 257) && !dsarl_tokenizer_is_special(tok, 'a'));

    const char *text = "Hi \xc3\xa9<|eos|>!";
    int32_t *ids;
    size_t n;
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_tokenizer_encode(tok, text, strlen(text), &ids, &n, &err), 0);
    const int32_t expected[] = {'H', 'i', ' ', 0xC3, 0xA9, 257, '!'};
    ck_assert_uint_eq(n, 7);
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(ids[i], expected[i]);
    char *back;
    ck_assert_int_eq(dsarl_tokenizer_decode(tok, ids, n, 1, &back, NULL, &err), 0);
    ck_assert_str_eq(back, "Hi \xc3\xa9!");
    free(back);
    free(ids);
    const int32_t bad[] = {5, 260};
    ck_assert_int_eq(dsarl_tokenizer_decode(tok, bad, 2, 0, &back, NULL, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "id 260 at position 1"), "%s", err.message);
    dsarl_tokenizer_free(tok);
}
END_TEST

/* Exact ids from Hugging Face tokenizers for each fixture string, and decode back to the string. */
static void check_fixture(const char *name)
{
    json_t *root;
    dsarl_error err = {0};
    ck_assert_msg(dsarl_json_load_file(FIXTURES "/cases.json", &root, &err) == 0, "%s", err.message);
    json_t *entry = json_object_get(root, name);
    ck_assert_ptr_nonnull(entry);
    char dir[512];
    snprintf(dir, sizeof dir, FIXTURES "/%s", name);
    dsarl_tokenizer *tok = load_ok(dir);
    ck_assert_str_eq(dsarl_tokenizer_kind(tok), "bpe");
    ck_assert_int_eq(dsarl_tokenizer_vocab_size(tok), json_integer_value(json_object_get(entry, "vocab_size")));
    json_t *cases = json_object_get(entry, "cases");
    ck_assert_uint_ge(json_array_size(cases), 30);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        json_t *want = json_object_get(c, "ids");
        int32_t *ids;
        size_t n;
        ck_assert_int_eq(dsarl_tokenizer_encode(tok, text, strlen(text), &ids, &n, &err), 0);
        char got[4096] = "", exp[4096] = "";
        for (size_t k = 0; k < n; k++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%d ", ids[k]);
        for (size_t k = 0; k < json_array_size(want); k++)
            snprintf(exp + strlen(exp), sizeof exp - strlen(exp), "%lld ",
                     (long long)json_integer_value(json_array_get(want, k)));
        ck_assert_msg(strcmp(got, exp) == 0, "%s case %zu '%s': got [%s], tokenizers gives [%s]", name, i, text, got,
                      exp);
        char *back;
        ck_assert_int_eq(dsarl_tokenizer_decode(tok, ids, n, 0, &back, NULL, &err), 0);
        ck_assert_str_eq(back, json_string_value(json_object_get(c, "decoded")));
        free(back);
        free(ids);
    }
    dsarl_tokenizer_free(tok);
    json_decref(root);
}

START_TEST(test_glm_style_matches_hf) { check_fixture("glm_style"); }
END_TEST

START_TEST(test_gpt2_style_matches_hf) { check_fixture("gpt2_style"); }
END_TEST

/* decode(encode(s)) == s on fresh random strings mixing ASCII, whitespace runs, digits, 2-4 byte UTF-8 and the
 * special markers (the GPT-2-style tokenizer adds a prefix space, so it is left out). */
START_TEST(test_random_round_trips)
{
    static const char *const atoms[] = {"a", "Z", "q", " ", "  ", "\n", "\t", "\r\n", "7", "42", "'s", "'LL", "!",
                                        "?", "+", "=", "\xc3\xa9", "\xce\xb1", "\xe4\xb8\xad", "\xf0\x9f\x98\x80",
                                        "\xe2\x9c\x93", "Answer:", "<|user|>", "[gMASK]", "<|eos|>", "\xc2\xa0"};
    dsarl_tokenizer *toks[2] = {load_ok("byte"), load_ok(FIXTURES "/glm_style/tokenizer.json")};
    unsigned seed = (unsigned)getpid();
    for (int trial = 0; trial < 300; trial++) {
        char s[1024] = "";
        int parts = 1 + rand_r(&seed) % 40;
        for (int k = 0; k < parts; k++)
            strcat(s, atoms[rand_r(&seed) % ARRAY_LEN(atoms)]);
        for (int t = 0; t < 2; t++)
            assert_round_trip(toks[t], s, strlen(s));
    }
    // Invalid UTF-8 (a model can sample any byte) still round-trips byte for byte.
    const char junk[] = {'a', (char)0xFF, (char)0xC3, ' ', (char)0x80, '1', '2', '3', '4', (char)0xE4, (char)0xB8};
    for (int t = 0; t < 2; t++)
        assert_round_trip(toks[t], junk, sizeof junk);
    dsarl_tokenizer_free(toks[0]);
    dsarl_tokenizer_free(toks[1]);
}
END_TEST

START_TEST(test_specials_and_lookup)
{
    dsarl_tokenizer *glm = load_ok(FIXTURES "/glm_style");
    int32_t eot = dsarl_tokenizer_token_to_id(glm, "<|endoftext|>");
    ck_assert_int_ge(eot, 0);
    ck_assert_int_eq(dsarl_tokenizer_eos_id(glm), eot); // tokenizer_config.json
    ck_assert_int_eq(dsarl_tokenizer_pad_id(glm), eot);
    ck_assert_int_eq(dsarl_tokenizer_bos_id(glm), -1);
    ck_assert(dsarl_tokenizer_is_special(glm, eot));
    ck_assert_str_eq(dsarl_tokenizer_id_to_token(glm, dsarl_tokenizer_token_to_id(glm, "[gMASK]")), "[gMASK]");
    ck_assert_int_eq(dsarl_tokenizer_token_to_id(glm, "no such token"), -1);
    // "Ġ" stands for the space byte in the byte-level alphabet
    ck_assert_int_ge(dsarl_tokenizer_token_to_id(glm, "\xc4\xa0"), 0);
    ck_assert_str_eq(dsarl_tokenizer_default_template(glm), "glm");
    dsarl_tokenizer_free(glm);
    // From the file alone (a copy without tokenizer_config.json beside it), eos is found by name.
    dsarl_tokenizer *gpt2 = load_ok(FIXTURES "/gpt2_style/tokenizer.json");
    ck_assert_int_eq(dsarl_tokenizer_eos_id(gpt2), dsarl_tokenizer_token_to_id(gpt2, "<|endoftext|>"));
    ck_assert_int_eq(dsarl_tokenizer_bos_id(gpt2), -1);
    ck_assert_str_eq(dsarl_tokenizer_default_template(gpt2), "plain");
    dsarl_tokenizer_free(gpt2);
}
END_TEST

START_TEST(test_chat_templates)
{
    dsarl_tokenizer *byte = load_ok("byte"), *glm = load_ok(FIXTURES "/glm_style");
    const dsarl_chat_message msgs[] = {{"system", "Be brief."}, {"user", "What is 2+2?"}};
    char *out;
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_tokenizer_apply_chat_template(byte, NULL, msgs, 2, 1, &out, &err), 0);
    ck_assert_str_eq(out, "System: Be brief.\nUser: What is 2+2?\nAssistant:");
    free(out);
    ck_assert_int_eq(dsarl_tokenizer_apply_chat_template(glm, "default", msgs + 1, 1, 1, &out, &err), 0);
    ck_assert_str_eq(out, "[gMASK]<sop><|user|>\nWhat is 2+2?<|assistant|>\n");
    // the markers encode to their special ids
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(dsarl_tokenizer_encode(glm, out, strlen(out), &ids, &n, &err), 0);
    ck_assert_int_eq(ids[0], dsarl_tokenizer_token_to_id(glm, "[gMASK]"));
    ck_assert_int_eq(ids[1], dsarl_tokenizer_token_to_id(glm, "<sop>"));
    ck_assert_int_eq(ids[2], dsarl_tokenizer_token_to_id(glm, "<|user|>"));
    ck_assert_int_eq(ids[n - 2], dsarl_tokenizer_token_to_id(glm, "<|assistant|>"));
    free(ids);
    free(out);
    ck_assert_int_eq(dsarl_tokenizer_apply_chat_template(glm, "plain", msgs + 1, 1, 0, &out, &err), 0);
    ck_assert_str_eq(out, "User: What is 2+2?\n");
    free(out);
    ck_assert_int_eq(dsarl_tokenizer_apply_chat_template(glm, "none", msgs, 2, 1, &out, &err), 0);
    ck_assert_str_eq(out, "Be brief.What is 2+2?");
    free(out);
    ck_assert_int_eq(dsarl_tokenizer_apply_chat_template(glm, "chatml", msgs, 2, 1, &out, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "'chatml'") && strstr(err.message, "glm, plain"), "%s", err.message);
    dsarl_tokenizer_free(byte);
    dsarl_tokenizer_free(glm);
}
END_TEST

/* Writes the glm fixture with one JSON edit applied (a Python-free way to make broken files). */
static void write_variant(const char *path, const char *from, const char *to)
{
    void *data;
    size_t size;
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_read_file(FIXTURES "/glm_style/tokenizer.json", &data, &size, &err), 0);
    char *text = calloc(1, size + strlen(to) + 1);
    memcpy(text, data, size);
    char *hit = strstr(text, from);
    ck_assert_msg(hit != NULL, "fixture lacks '%s'", from);
    size_t tail = strlen(hit + strlen(from));
    memmove(hit + strlen(to), hit + strlen(from), tail + 1);
    memcpy(hit, to, strlen(to));
    ck_assert_int_eq(dsarl_write_file_atomic(path, text, strlen(text), &err), 0);
    free(text);
    free(data);
}

START_TEST(test_loader_refusals)
{
    dsarl_tokenizer *tok = NULL;
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_tokenizer_load("/nonexistent/tok", &tok, &err), DSARL_E_NOT_FOUND);
    ck_assert_msg(strstr(err.message, "/nonexistent/tok") && strstr(err.message, "'byte'"), "%s", err.message);
    ck_assert_int_eq(dsarl_tokenizer_load(DSARL_SOURCE_DIR "/tests", &tok, &err), DSARL_E_NOT_FOUND);
    ck_assert_msg(strstr(err.message, "no tokenizer.json"), "%s", err.message);

    char path[] = "/tmp/dsarl_tok_XXXXXX.json";
    int fd = mkstemps(path, 5);
    ck_assert_int_ge(fd, 0);
    close(fd);
    const struct {
        const char *from, *to, *expect1, *expect2;
        int code;
    } rows[] = { // a feature dsarl does not implement is bad input for it: exit status 3, like a typo
        {"\"type\": \"BPE\"", "\"type\": \"WordPiece\"", "model", "'WordPiece'", DSARL_E_INVALID},
        {"\\\\p{N}{1,3}", "\\\\p{N}{1,4}", "pre_tokenizer.pretokenizers[0].pattern", "'Regex'", DSARL_E_INVALID},
        {"\"behavior\": \"Isolated\"", "\"behavior\": \"Removed\"", "pretokenizers[0]", "'Removed'",
         DSARL_E_INVALID},
        {"\"byte_fallback\": false", "\"byte_fallback\": true", "model", "'byte_fallback'", DSARL_E_INVALID},
        {"\"lstrip\": false", "\"lstrip\": true", "added_tokens[0]", "lstrip", DSARL_E_INVALID},
        {"\"normalizer\": null", "\"normalizer\": {\"type\": \"Lowercase\"}", "normalizer", "'Lowercase'",
         DSARL_E_INVALID},
        {"\"merges\": [", "\"merges\": [[\"zz\", \"q\"], ", "merges[0]", "first half", DSARL_E_INVALID},
        {"\"merges\": [", "\"merges\": [7, ", "merges[0]", "\"a b\"", DSARL_E_INVALID},
        {"\"vocab\": {", "\"vocab\": [], \"vocab_was\": {", "vocab", "object", DSARL_E_INVALID},
        {"\"decoder\": {", "\"decoder\": 5, \"d\": {", "decoder", "ByteLevel", DSARL_E_INVALID},
        // one added token with a huge id would size the id tables (gigabytes) before the vocabulary check
        {"\"id\": 0,", "\"id\": 1073741823,", "added_tokens[0]", "far past the", DSARL_E_INVALID},
    };
    for (size_t i = 0; i < ARRAY_LEN(rows); i++) {
        write_variant(path, rows[i].from, rows[i].to);
        dsarl_error e = {0};
        int rc = dsarl_tokenizer_load(path, &tok, &e);
        ck_assert_msg(rc == rows[i].code && tok == NULL, "row %zu: rc %d (%s)", i, rc, e.message);
        ck_assert_msg(strstr(e.message, path) && strstr(e.message, rows[i].expect1) &&
                          strstr(e.message, rows[i].expect2),
                      "row %zu: message '%s' should name the file, '%s' and '%s'", i, e.message, rows[i].expect1,
                      rows[i].expect2);
    }
    write_variant(path, "\"model\": {", "\"model\": {,");
    ck_assert_int_eq(dsarl_tokenizer_load(path, &tok, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, path), "%s", err.message);
    unlink(path);
}
END_TEST

static Suite *tokenizer_suite(void)
{
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_byte_tokenizer);
    tcase_add_test(tc, test_glm_style_matches_hf);
    tcase_add_test(tc, test_gpt2_style_matches_hf);
    tcase_add_test(tc, test_random_round_trips);
    tcase_add_test(tc, test_specials_and_lookup);
    tcase_add_test(tc, test_chat_templates);
    tcase_add_test(tc, test_loader_refusals);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(tokenizer_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
