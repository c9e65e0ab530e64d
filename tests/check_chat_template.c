/* check_chat_template.c: the Jinja chat-template renderer against transformers' own renderings
 * (tests/fixtures/chat_templates/cases.json, made by tools/make_chat_template_fixture.py) byte for byte; how a
 * tokenizer finds its templates (tokenizer_config.json as a string or a named list, chat_template.jinja,
 * additional_chat_templates/); the refusals of constructs outside the subset, each with its line; and the bounds
 * that turn a hostile template into an error instead of a hang. */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsarl/fileutil.h"
#include "dsarl/recipe.h"
#include "dsarl/tokenizer.h"
#include "recipe_internal.h"

#define FIXTURES DSARL_SOURCE_DIR "/tests/fixtures/chat_templates"
#define GLM_TOKENIZER DSARL_SOURCE_DIR "/tests/fixtures/tokenizer/glm_style/tokenizer.json"
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static dsarl_tokenizer *load_ok(const char *name)
{
    dsarl_tokenizer *tok = NULL;
    dsarl_error err = {0};
    ck_assert_msg(dsarl_tokenizer_load(name, &tok, &err) == 0, "%s", err.message);
    return tok;
}

static json_t *load_cases(void)
{
    json_error_t je;
    json_t *doc = json_load_file(FIXTURES "/cases.json", 0, &je);
    ck_assert_msg(doc != NULL, "cases.json: %s (line %d)", je.text, je.line);
    return doc;
}

/* The first case of a template/conversation/flags combination. */
static json_t *find_case(json_t *doc, const char *tmpl, const char *conv, int agp, int thinking /* -1 unset */)
{
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(doc, "cases"), i, c)
    {
        json_t *kw = json_object_get(c, "kwargs"), *et = json_object_get(kw, "enable_thinking");
        int t = et ? json_is_true(et) : -1;
        if (!strcmp(json_string_value(json_object_get(c, "template")), tmpl) &&
            !strcmp(json_string_value(json_object_get(c, "conversation")), conv) &&
            json_is_true(json_object_get(c, "add_generation_prompt")) == agp && t == thinking)
            return c;
    }
    ck_abort_msg("no case %s/%s/%d/%d in cases.json", tmpl, conv, agp, thinking);
    return NULL;
}

static void assert_same(const char *what, const char *got, const char *want)
{
    if (strcmp(got, want) == 0)
        return;
    size_t k = 0;
    while (got[k] && got[k] == want[k])
        k++;
    size_t from = k > 40 ? k - 40 : 0;
    ck_abort_msg("%s: differs at byte %zu:\n  got  ...%.80s\n  want ...%.80s", what, k, got + from, want + from);
}

START_TEST(test_matches_transformers)
{
    json_t *doc = load_cases();
    dsarl_tokenizer *tok = load_ok("byte");
    json_t *convs = json_object_get(doc, "conversations");
    char *tools = json_dumps(json_object_get(doc, "tools"), JSON_COMPACT);
    size_t i, matched = 0, refused = 0;
    json_t *c;
    json_array_foreach(json_object_get(doc, "cases"), i, c)
    {
        const char *tmpl = json_string_value(json_object_get(c, "template"));
        const char *conv = json_string_value(json_object_get(c, "conversation"));
        char *messages = json_dumps(json_object_get(convs, conv), JSON_COMPACT);
        char *kwargs = json_dumps(json_object_get(c, "kwargs"), JSON_COMPACT);
        char path[1024], what[512];
        snprintf(path, sizeof path, "%s/%s", FIXTURES, tmpl);
        snprintf(what, sizeof what, "case %zu (%s, %s, add_generation_prompt=%d, kwargs %s)", i, tmpl, conv,
                 json_is_true(json_object_get(c, "add_generation_prompt")), kwargs);
        char *out = NULL;
        dsarl_error err = {0};
        int rc =
            dsarl_tokenizer_render_chat(tok, path, messages, json_is_true(json_object_get(c, "tools")) ? tools : NULL,
                                        kwargs, json_is_true(json_object_get(c, "add_generation_prompt")), &out, &err);
        const json_t *expected = json_object_get(c, "expected");
        if (expected) {
            ck_assert_msg(rc == 0, "%s: %s", what, err.message);
            assert_same(what, out, json_string_value(expected));
            matched++;
        } else {
            ck_assert_msg(rc < 0, "%s: transformers refused it (%s) but dsarl rendered '%.200s'", what,
                          json_string_value(json_object_get(c, "error")), out);
            ck_assert_msg(strstr(err.message, "line "), "%s: '%s' names no line", what, err.message);
            refused++;
        }
        free(out);
        free(messages);
        free(kwargs);
    }
    ck_assert_uint_ge(matched, 300); // the corpus is all there
    ck_assert_uint_ge(refused, 2);
    free(tools);
    dsarl_tokenizer_free(tok);
    json_decref(doc);
}
END_TEST

/* A tokenizer directory in /tmp with the glm_style tokenizer.json and the files given (name, text pairs). */
static void make_tokenizer_dir(char *dir, const char *const *files, size_t n_files)
{
    strcpy(dir, "/tmp/dsarl_chat_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    ck_assert_int_eq(symlink(GLM_TOKENIZER, path), 0);
    for (size_t i = 0; i + 1 < 2 * n_files; i += 2) {
        dsarl_error err = {0};
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        if (strchr(files[i], '/')) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/%.*s", dir, (int)(strchr(files[i], '/') - files[i]), files[i]);
            mkdir(sub, 0700);
        }
        ck_assert_msg(dsarl_write_file_atomic(path, files[i + 1], strlen(files[i + 1]), &err) == 0, "%s", err.message);
    }
}

static void remove_tokenizer_dir(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static char *read_text(const char *path)
{
    void *data;
    size_t size;
    dsarl_error err = {0};
    ck_assert_msg(dsarl_read_file(path, &data, &size, &err) == 0, "%s", err.message);
    char *s = realloc(data, size + 1);
    s[size] = '\0';
    return s;
}

START_TEST(test_tokenizer_templates)
{
    json_t *doc = load_cases();
    char *glm46 = read_text(FIXTURES "/glm46_style.jinja"), *qwen3 = read_text(FIXTURES "/qwen3_style.jinja");
    // the named-list form, GLM's special tokens as the glm fixture's config names them
    json_t *config = json_pack("{s:s, s:s, s:n, s:[{s:s, s:s}, {s:s, s:s}]}", "eos_token", "<|endoftext|>", "pad_token",
                               "<|endoftext|>", "bos_token", "chat_template", "name", "default", "template", glm46,
                               "name", "tool_use", "template", qwen3);
    char *config_text = json_dumps(config, 0);
    const char *files[] = {"tokenizer_config.json", config_text};
    char dir[64];
    make_tokenizer_dir(dir, files, 1);
    dsarl_tokenizer *tok = load_ok(dir);
    ck_assert_int_eq(dsarl_tokenizer_has_chat_template(tok), 1);
    ck_assert_str_eq(dsarl_tokenizer_default_template(tok), "tokenizer");

    // default = the model's template, with the variables transformers passes (eos_token from the config)
    const dsarl_chat_message user[] = {{"user", "What is 2+2?"}};
    char *out;
    dsarl_error err = {0};
    ck_assert_msg(dsarl_tokenizer_apply_chat_template(tok, "default", user, 1, 1, &out, &err) == 0, "%s", err.message);
    assert_same(
        "default", out,
        json_string_value(json_object_get(find_case(doc, "glm46_style.jinja", "single_user", 1, -1), "expected")));
    free(out);
    ck_assert_int_eq(dsarl_tokenizer_apply_chat_template(tok, NULL, user, 1, 1, &out, &err), 0);
    free(out);
    // chat_template_kwargs reach the template
    ck_assert_msg(dsarl_tokenizer_apply_chat_template_kwargs(tok, "tokenizer", user, 1, 1,
                                                             "{\"enable_thinking\": false}", &out, &err) == 0,
                  "%s", err.message);
    assert_same(
        "enable_thinking", out,
        json_string_value(json_object_get(find_case(doc, "glm46_style.jinja", "single_user", 1, 0), "expected")));
    ck_assert(strstr(out, "<think></think>") != NULL);
    free(out);
    // a named template, and tools picking tool_use as transformers does
    ck_assert_int_eq(dsarl_tokenizer_apply_chat_template(tok, "tool_use", user, 1, 0, &out, &err), 0);
    ck_assert_msg(strncmp(out, "<|im_start|>user\n", 17) == 0, "%s", out);
    free(out);
    ck_assert_int_eq(dsarl_tokenizer_render_chat(tok, NULL, "[{\"role\": \"user\", \"content\": \"x\"}]",
                                                 "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]", NULL, 0,
                                                 &out, &err),
                     0);
    ck_assert_msg(strstr(out, "<tools>\n{\"type\": \"function\"") != NULL, "%s", out);
    free(out);
    // the built-ins still work on this tokenizer; an unknown name lists the tokenizer's
    ck_assert_int_eq(dsarl_tokenizer_apply_chat_template(tok, "glm", user, 1, 1, &out, &err), 0);
    ck_assert_str_eq(out, "[gMASK]<sop><|user|>\nWhat is 2+2?<|assistant|>\n");
    free(out);
    ck_assert_int_eq(dsarl_tokenizer_apply_chat_template(tok, "chatml", user, 1, 1, &out, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "'chatml'") && strstr(err.message, "tool_use"), "%s", err.message);
    dsarl_tokenizer_free(tok);
    remove_tokenizer_dir(dir);

    // chat_template.jinja replaces the config's string; additional_chat_templates/ adds named ones
    json_object_set_new(config, "chat_template", json_string("{{ 'from the config' }}"));
    free(config_text);
    config_text = json_dumps(config, 0);
    const char *files2[] = {"tokenizer_config.json",
                            config_text,
                            "chat_template.jinja",
                            "{{ messages[0].content }}|{{ eos_token }}\n",
                            "additional_chat_templates/short.jinja",
                            "{% for m in messages %}{{ m.role[0] }}{% endfor %}"};
    make_tokenizer_dir(dir, files2, 3);
    tok = load_ok(dir);
    ck_assert_int_eq(dsarl_tokenizer_apply_chat_template(tok, "default", user, 1, 0, &out, &err), 0);
    ck_assert_str_eq(out, "What is 2+2?|<|endoftext|>"); // the file's final newline goes, as in Jinja
    free(out);
    ck_assert_int_eq(dsarl_tokenizer_apply_chat_template(tok, "short", user, 1, 0, &out, &err), 0);
    ck_assert_str_eq(out, "u");
    free(out);
    dsarl_tokenizer_free(tok);
    remove_tokenizer_dir(dir);

    // a template outside the subset loads (the tokenizer stays usable with a built-in) and is refused when asked
    const char *files3[] = {"tokenizer_config.json", "{\"chat_template\": \"ok\\n{% include 'x' %}\"}"};
    make_tokenizer_dir(dir, files3, 1);
    tok = load_ok(dir);
    ck_assert_int_eq(dsarl_tokenizer_apply_chat_template(tok, "plain", user, 1, 0, &out, &err), 0);
    free(out);
    ck_assert_int_eq(dsarl_tokenizer_apply_chat_template(tok, NULL, user, 1, 0, &out, &err), DSARL_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.message, "tokenizer_config.json chat_template") && strstr(err.message, "line 2") &&
                      strstr(err.message, "include"),
                  "%s", err.message);
    dsarl_tokenizer_free(tok);
    remove_tokenizer_dir(dir);

    // no template at all: "tokenizer" is an error, "default" the built-in
    tok = load_ok("byte");
    ck_assert_int_eq(dsarl_tokenizer_has_chat_template(tok), 0);
    ck_assert_int_eq(dsarl_tokenizer_apply_chat_template(tok, "tokenizer", user, 1, 0, &out, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "brings no chat template"), "%s", err.message);
    ck_assert_int_eq(dsarl_tokenizer_render_chat(tok, "plain", "[{\"role\": \"user\", \"content\": [1]}]", NULL, NULL,
                                                 0, &out, &err),
                     DSARL_E_UNSUPPORTED);
    ck_assert_int_eq(dsarl_tokenizer_render_chat(tok, FIXTURES "/glm45_style.jinja", "{\"role\": \"user\"}", NULL, NULL,
                                                 0, &out, &err),
                     DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "messages") && strstr(err.message, "array"), "%s", err.message);
    ck_assert_int_eq(
        dsarl_tokenizer_render_chat(tok, FIXTURES "/glm45_style.jinja", "[]", NULL, "{\"messages\": 1}", 0, &out, &err),
        DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "'messages'"), "%s", err.message);
    dsarl_tokenizer_free(tok);

    free(config_text);
    json_decref(config);
    free(glm46);
    free(qwen3);
    json_decref(doc);
}
END_TEST

/* policy.tokenizer.chat_template_kwargs from a recipe reaches every render; a call's own kwargs win. */
START_TEST(test_recipe_kwargs)
{
    dsarl_recipe *r = NULL;
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_recipe_load_string("policy:\n  tokenizer:\n    chat_template_kwargs:\n"
                                              "      enable_thinking: false\n      depth: 2\n      tag: [a, 1.5]\n",
                                              "kw.yaml", &r, &err),
                     0);
    dsarl_tokenizer *tok = load_ok("byte");
    ck_assert_msg(dsarl_tokenizer_set_chat_kwargs_from_recipe(tok, dsarl_recipe_root(r),
                                                              "policy.tokenizer.chat_template_kwargs", &err) == 0,
                  "%s", err.message);
    const dsarl_chat_message user[] = {{"user", "q"}};
    char *out;
    const char *tmpl = FIXTURES "/glm46_style.jinja";
    ck_assert_int_eq(dsarl_tokenizer_apply_chat_template(tok, tmpl, user, 1, 1, &out, &err), 0);
    ck_assert_str_eq(out, "[gMASK]<sop><|user|>\nq/nothink<|assistant|>\n<think></think>");
    free(out);
    ck_assert_int_eq(
        dsarl_tokenizer_apply_chat_template_kwargs(tok, tmpl, user, 1, 1, "{\"enable_thinking\": true}", &out, &err),
        0);
    ck_assert_str_eq(out, "[gMASK]<sop><|user|>\nq<|assistant|>");
    free(out);
    // the recipe's types survive: an int, a list with a string and a float
    char path[] = "/tmp/dsarl_kw_XXXXXX.jinja";
    int fd = mkstemps(path, 6);
    const char *probe = "{{ depth + 1 }} {{ tag | tojson }} {{ enable_thinking }}";
    ck_assert_int_eq(write(fd, probe, strlen(probe)), (ssize_t)strlen(probe));
    close(fd);
    ck_assert_int_eq(dsarl_tokenizer_apply_chat_template(tok, path, user, 1, 0, &out, &err), 0);
    ck_assert_str_eq(out, "3 [\"a\", 1.5] False");
    free(out);
    unlink(path);
    // absent clears; a scalar is refused naming the key
    ck_assert_int_eq(dsarl_tokenizer_set_chat_kwargs_from_recipe(tok, dsarl_recipe_root(r), "policy.nothing", &err), 0);
    ck_assert_int_eq(dsarl_tokenizer_apply_chat_template(tok, tmpl, user, 1, 1, &out, &err), 0);
    ck_assert_str_eq(out, "[gMASK]<sop><|user|>\nq<|assistant|>");
    free(out);
    ck_assert_int_eq(dsarl_tokenizer_set_chat_kwargs_from_recipe(tok, dsarl_recipe_root(r),
                                                                 "policy.tokenizer.chat_template_kwargs.depth", &err),
                     DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "chat_template_kwargs.depth") && strstr(err.message, "kw.yaml") &&
                      strstr(err.message, "enable_thinking"),
                  "%s", err.message);
    dsarl_tokenizer_free(tok);
    dsarl_recipe_free(r);
}
END_TEST

/* Renders source (written to a temp .jinja) with one user message; returns rc, the message in err. */
static int render_source(const char *source, char **out, dsarl_error *err)
{
    char path[] = "/tmp/dsarl_tmpl_XXXXXX.jinja";
    int fd = mkstemps(path, 6);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, source, strlen(source)), (ssize_t)strlen(source));
    close(fd);
    dsarl_tokenizer *tok = load_ok("byte");
    *out = NULL;
    int rc =
        dsarl_tokenizer_render_chat(tok, path, "[{\"role\": \"user\", \"content\": \"hi\"}]", NULL, NULL, 1, out, err);
    dsarl_tokenizer_free(tok);
    unlink(path);
    return rc;
}

START_TEST(test_refusals)
{
    const struct {
        const char *source, *expect1, *expect2;
        int code;
    } rows[] = {
        {"{% include 'x.jinja' %}", "line 1", "'{% include %}'", DSARL_E_UNSUPPORTED},
        {"a\n{% extends 'base' %}", "line 2", "'{% extends %}'", DSARL_E_UNSUPPORTED},
        {"\n\n{% call m() %}x{% endcall %}", "line 3", "'{% call %}'", DSARL_E_UNSUPPORTED},
        {"{% filter upper %}x{% endfilter %}", "line 1", "'{% filter %}'", DSARL_E_UNSUPPORTED},
        {"x\n{% raw %}{{ y }}{% endraw %}", "line 2", "raw", DSARL_E_UNSUPPORTED},
        {"{{ messages | wordcount }}", "line 1", "unsupported filter 'wordcount'", DSARL_E_UNSUPPORTED},
        {"{%- if x is\nfoo -%}{% endif %}", "line 2", "unsupported test 'is foo'", DSARL_E_UNSUPPORTED},
        {"{{ '{} {}'.format(1, 2) }}", "line 1", "unsupported method '.format()'", DSARL_E_UNSUPPORTED},
        {"{{ messages.__class__ }}", "line 1", "'__class__'", DSARL_E_UNSUPPORTED},
        {"{% for m in messages recursive %}{% endfor %}", "line 1", "recursive", DSARL_E_UNSUPPORTED},
        {"{% set a, b = 1, 2 %}", "line 1", "set of several names", DSARL_E_UNSUPPORTED},
        {"{{ f(*args) }}", "line 1", "argument unpacking", DSARL_E_UNSUPPORTED},
        {"\n{% if true %}open", "line 2", "ends before '{% endif %}'", DSARL_E_INVALID},
        {"{% endfor %}", "line 1", "no open block", DSARL_E_INVALID},
        {"{{ 1 +  }}", "line 1", "expected an expression", DSARL_E_INVALID},
        {"{% frobnicate %}", "line 1", "unknown tag", DSARL_E_INVALID},
        {"{{ 'unclosed }}", "line 1", "never closed", DSARL_E_INVALID},
        {"{{ x", "line 1", "never closed", DSARL_E_INVALID},
        // refused while rendering, still with the line
        {"\n{{ 'a%s' % 1 }}", "line 2", "printf-style", DSARL_E_UNSUPPORTED},
        {"{{ 2 ** 64 }}", "line 1", "integer overflow", DSARL_E_UNSUPPORTED},
        {"{{ messages[0].x.y }}", "line 1", "undefined", DSARL_E_INVALID},
        {"\n\n{{ raise_exception('no system message') }}", "line 3", "no system message", DSARL_E_INVALID},
        {"{% set n = 5 %}{% set n.x = 1 %}", "line 1", "not a namespace()", DSARL_E_INVALID},
        {"{{ 1 / 0 }}", "line 1", "division by zero", DSARL_E_INVALID},
        {"{{ messages | tojson(bad=1) }}", "line 1", "unexpected keyword argument 'bad'", DSARL_E_INVALID},
    };
    for (size_t i = 0; i < ARRAY_LEN(rows); i++) {
        char *out;
        dsarl_error err = {0};
        int rc = render_source(rows[i].source, &out, &err);
        ck_assert_msg(rc == rows[i].code, "row %zu ('%s'): rc %d, '%s'", i, rows[i].source, rc, rc ? err.message : out);
        ck_assert_msg(strstr(err.message, rows[i].expect1) && strstr(err.message, rows[i].expect2) &&
                          strstr(err.message, ".jinja") && !strchr(err.message, '\n'),
                      "row %zu: message '%s' should name the file, '%s' and '%s' on one line", i, err.message,
                      rows[i].expect1, rows[i].expect2);
    }
}
END_TEST

START_TEST(test_bounds)
{
    const struct {
        const char *source, *expect;
    } rows[] = {
        {"{% for i in range(1000000000) %}x{% endfor %}", "loop iterations"},
        {"{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}{% endfor %}{% endfor %}"
         "{% endfor %}",
         "loop iterations"},
        {"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nests deeper than 64"},
        {"{% macro f(n) %}{% if n < 60 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}",
         "loop iterations and macro calls"},
        {"{% for i in range(100000) %}{{ 'abcdefgh' * 100 }}{% endfor %}", "output passed"},
        {"{{ 'x' * 100000000000 }}", "limit"},
        {"{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
         "{% endfor %}{{ ns.s | length }}",
         "passed"},
    };
    for (size_t i = 0; i < ARRAY_LEN(rows); i++) {
        char *out;
        dsarl_error err = {0};
        int rc = render_source(rows[i].source, &out, &err);
        ck_assert_msg(rc == DSARL_E_INVALID, "row %zu: rc %d, '%s'", i, rc, rc ? err.message : "rendered");
        ck_assert_msg(strstr(err.message, rows[i].expect) && strstr(err.message, "line 1"),
                      "row %zu: '%s' should say '%s'", i, err.message, rows[i].expect);
    }
    // nesting deeper than the parser allows is refused before anything runs (no C stack exhaustion)
    char deep[2100] = "{{ ";
    for (int i = 0; i < 1000; i++)
        strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 1000; i++)
        strcat(deep, ")");
    strcat(deep, " }}");
    char *out;
    dsarl_error err = {0};
    ck_assert_int_eq(render_source(deep, &out, &err), DSARL_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.message, "nest deeper"), "%s", err.message);
    // just under the bounds renders
    ck_assert_int_eq(
        render_source("{% for i in range(1000) %}{% for j in range(50) %}{% endfor %}{% endfor %}ok", &out, &err), 0);
    ck_assert_str_eq(out, "ok");
    free(out);
}
END_TEST

static Suite *chat_template_suite(void)
{
    Suite *s = suite_create("chat_template");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_matches_transformers);
    tcase_add_test(tc, test_tokenizer_templates);
    tcase_add_test(tc, test_recipe_kwargs);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_bounds);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(chat_template_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
