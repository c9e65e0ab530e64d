/* check_json.c: JSON loading with file:line:col errors, typed getters and their messages, atomic writes. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dsarl/fileutil.h"
#include "dsarl/json.h"

static char tmpdir[256];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dsarl-check-json-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void remove_tree(const char *path)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    ck_assert_int_eq(system(cmd), 0);
}

static json_t *parse(const char *text)
{
    dsarl_error err = {0};
    json_t *root = NULL;
    ck_assert_int_eq(dsarl_json_load_buffer("config.json", text, strlen(text), &root, &err), DSARL_OK);
    return root;
}

START_TEST(test_getters_read_values)
{
    json_t *c = parse("{\"hidden_size\": 6144, \"rms_norm_eps\": 1e-05, \"theta\": 10000, \"tie\": false,"
                      " \"model_type\": \"glm_moe_dsa\", \"rope_scaling\": null, \"layers\": [1, 2],"
                      " \"sub\": {\"k\": -3}, \"big\": 9007199254740993}");
    dsarl_error err = {0};
    int64_t i = 0;
    double d = 0;
    int b = -1;
    const char *s = NULL;
    json_t *o = NULL;
    ck_assert_int_eq(dsarl_json_get_int(c, "hidden_size", "config.json", &i, &err), DSARL_OK);
    ck_assert_int_eq(i, 6144);
    ck_assert_int_eq(dsarl_json_get_int(c, "big", "config.json", &i, &err), DSARL_OK);
    ck_assert_int_eq(i, 9007199254740993LL); /* beyond double precision: kept exact */
    ck_assert_int_eq(dsarl_json_get_double(c, "rms_norm_eps", "config.json", &d, &err), DSARL_OK);
    ck_assert(d == 1e-05);
    ck_assert_int_eq(dsarl_json_get_double(c, "theta", "config.json", &d, &err), DSARL_OK); /* integer accepted */
    ck_assert(d == 10000.0);
    ck_assert_int_eq(dsarl_json_get_bool(c, "tie", "config.json", &b, &err), DSARL_OK);
    ck_assert_int_eq(b, 0);
    ck_assert_int_eq(dsarl_json_get_string(c, "model_type", "config.json", &s, &err), DSARL_OK);
    ck_assert_str_eq(s, "glm_moe_dsa");
    ck_assert_int_eq(dsarl_json_get_array(c, "layers", "config.json", &o, &err), DSARL_OK);
    ck_assert_uint_eq(json_array_size(o), 2);
    ck_assert_int_eq(dsarl_json_get_object(c, "sub", "config.json", &o, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_json_get_int(o, "k", "config.json: sub", &i, &err), DSARL_OK);
    ck_assert_int_eq(i, -3);

    /* Optional forms: missing and null give the fallback, present values win. */
    ck_assert_int_eq(dsarl_json_get_int_or(c, "num_layers", "config.json", 78, &i, &err), DSARL_OK);
    ck_assert_int_eq(i, 78);
    ck_assert_int_eq(dsarl_json_get_int_or(c, "hidden_size", "config.json", 78, &i, &err), DSARL_OK);
    ck_assert_int_eq(i, 6144);
    ck_assert_int_eq(dsarl_json_get_string_or(c, "rope_scaling", "config.json", "none", &s, &err), DSARL_OK);
    ck_assert_str_eq(s, "none");
    ck_assert_int_eq(dsarl_json_get_double_or(c, "missing", "config.json", 0.25, &d, &err), DSARL_OK);
    ck_assert(d == 0.25);
    ck_assert_int_eq(dsarl_json_get_bool_or(c, "missing", "config.json", 1, &b, &err), DSARL_OK);
    ck_assert_int_eq(b, 1);
    json_decref(c);
}
END_TEST

START_TEST(test_getter_errors_name_file_and_key)
{
    json_t *c = parse("{\"hidden_size\": \"6144\", \"eps\": \"x\", \"flag\": 1, \"n\": 4096.0, \"name\": 3}");
    dsarl_error err = {0};
    int64_t i;
    double d;
    int b;
    const char *s;
    json_t *o;
    ck_assert_int_eq(dsarl_json_get_int(c, "hidden_size", "config.json", &i, &err), DSARL_E_INVALID);
    ck_assert_str_eq(err.message, "config.json: key 'hidden_size' must be an integer, got string");
    ck_assert_int_eq(dsarl_json_get_int(c, "n", "config.json", &i, &err), DSARL_E_INVALID);
    ck_assert_str_eq(err.message, "config.json: key 'n' must be an integer, got real");
    ck_assert_int_eq(dsarl_json_get_double(c, "eps", "config.json", &d, &err), DSARL_E_INVALID);
    ck_assert_str_eq(err.message, "config.json: key 'eps' must be a number, got string");
    ck_assert_int_eq(dsarl_json_get_bool(c, "flag", "config.json", &b, &err), DSARL_E_INVALID);
    ck_assert_str_eq(err.message, "config.json: key 'flag' must be true or false, got integer");
    ck_assert_int_eq(dsarl_json_get_string(c, "name", "config.json", &s, &err), DSARL_E_INVALID);
    ck_assert_str_eq(err.message, "config.json: key 'name' must be a string, got integer");
    ck_assert_int_eq(dsarl_json_get_object(c, "name", "config.json", &o, &err), DSARL_E_INVALID);
    ck_assert_int_eq(dsarl_json_get_int(c, "vocab_size", "config.json", &i, &err), DSARL_E_NOT_FOUND);
    ck_assert_str_eq(err.message, "config.json: key 'vocab_size' is missing");
    ck_assert_int_eq(dsarl_json_get_int(c, "vocab_size", NULL, &i, &err), DSARL_E_NOT_FOUND);
    ck_assert_str_eq(err.message, "key 'vocab_size' is missing");
    /* Optional getters still refuse a present value of the wrong type. */
    ck_assert_int_eq(dsarl_json_get_int_or(c, "hidden_size", "config.json", 1, &i, &err), DSARL_E_INVALID);
    json_t *arr = parse("[1]");
    ck_assert_int_eq(dsarl_json_get_int(arr, "k", "x.json", &i, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "is array, not an object"));
    json_decref(arr);
    json_decref(c);
}
END_TEST

START_TEST(test_load_file_errors_have_location)
{
    make_tmpdir();
    dsarl_error err = {0};
    json_t *root = NULL;
    char *path = dsarl_path_join(tmpdir, "bad.json");
    const char *bad = "{\n  \"a\": 1,\n  \"b\": ,\n}\n";
    ck_assert_int_eq(dsarl_write_file_atomic(path, bad, strlen(bad), &err), DSARL_OK);
    ck_assert_int_eq(dsarl_json_load_file(path, &root, &err), DSARL_E_INVALID);
    ck_assert_ptr_null(root);
    char want_prefix[512];
    snprintf(want_prefix, sizeof want_prefix, "%s:3:8: ", path);
    ck_assert_msg(strncmp(err.message, want_prefix, strlen(want_prefix)) == 0, "got '%s', want prefix '%s'",
                  err.message, want_prefix);
    const char *dup = "{\"a\": 1, \"a\": 2}";
    ck_assert_int_eq(dsarl_write_file_atomic(path, dup, strlen(dup), &err), DSARL_OK);
    ck_assert_int_eq(dsarl_json_load_file(path, &root, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "duplicate"));
    char *missing = dsarl_path_join(tmpdir, "missing.json");
    ck_assert_int_eq(dsarl_json_load_file(missing, &root, &err), DSARL_E_NOT_FOUND);
    free(missing);
    free(path);
    remove_tree(tmpdir);
}
END_TEST

START_TEST(test_write_and_reload)
{
    make_tmpdir();
    dsarl_error err = {0};
    char *path = dsarl_path_join(tmpdir, "out.json");
    int64_t n = 1000 + rand() % 1000;
    double x = (double)rand() / RAND_MAX + 0.5;
    json_t *root = json_pack("{s:I, s:f, s:s, s:[i,i]}", "n", (json_int_t)n, "x", x, "s", "héllo", "l", 1, 2);
    ck_assert_int_eq(dsarl_json_write_file_atomic(path, root, JSON_INDENT(2) | JSON_SORT_KEYS, &err), DSARL_OK);
    json_decref(root);
    void *text = NULL;
    size_t size = 0;
    ck_assert_int_eq(dsarl_read_file(path, &text, &size, &err), DSARL_OK);
    ck_assert_int_eq(((char *)text)[size - 1], '\n');
    ck_assert_ptr_nonnull(strstr(text, "\n  \"l\": ["));
    free(text);
    json_t *back = NULL;
    ck_assert_int_eq(dsarl_json_load_file(path, &back, &err), DSARL_OK);
    int64_t n2;
    double x2;
    const char *s2;
    ck_assert_int_eq(dsarl_json_get_int(back, "n", path, &n2, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_json_get_double(back, "x", path, &x2, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_json_get_string(back, "s", path, &s2, &err), DSARL_OK);
    ck_assert_int_eq(n2, n);
    ck_assert(x2 == x); /* jansson prints reals with 17 significant digits: exact round trip */
    ck_assert_str_eq(s2, "héllo");
    json_decref(back);
    free(path);
    remove_tree(tmpdir);
}
END_TEST

int main(void)
{
    srand((unsigned)time(NULL));
    Suite *s = suite_create("json");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_getters_read_values);
    tcase_add_test(tc, test_getter_errors_name_file_and_key);
    tcase_add_test(tc, test_load_file_errors_have_location);
    tcase_add_test(tc, test_write_and_reload);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
