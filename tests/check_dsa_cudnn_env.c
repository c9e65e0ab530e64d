/* check_dsa_cudnn_env.c: the cudnn DSA backend refuses a bad value of one of its recipe keys (runtime.cudnn_*), and
 * the tilelang backend (which the cudnn one hands over to, with the same recipe) one of its keys
 * (runtime.tilelang_*), with one sentence naming the key and what is valid, before either looks at cuDNN or a GPU
 * (so it runs in CI); and without the tilelang backend in the registry, cudnn's create refuses in one sentence. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_device.h"
#include "cudnn_dsa.h"
#include "recipe_internal.h"
#include "tilelang.h"

typedef struct bad_key {
    const char *key, *value; /* runtime.<key>: <value> */
    const char *valid;       /* a phrase the message must hold: what would be valid */
} bad_key;

static const bad_key cases[] = {
    {"cudnn_max_segment", "0", "from 1 to"},
    {"cudnn_max_segment", "-3", "from 1 to"},
    {"cudnn_max_segment", "4294967296", "from 1 to"}, /* past INT32_MAX */
    {"cudnn_max_segment", "12abc", NULL},             /* a string: the type error names the key */
    {"cudnn_max_segment", "1.5", NULL},
    {"cudnn_dp_workspace_cap", "0", "from 1 to"},
    {"cudnn_dp_workspace_cap", "-3", "from 1 to"},
    {"cudnn_dp_workspace_cap", "1e4", NULL},
    {"cudnn_paged_forward", "sometimes", NULL},
    {"tilelang_sparse_mla", "fast", "auto | wmma | cuda_core"},
    {"tilelang_indexer", "sm90", "auto | rowwise | cuda_core"},
    {"tilelang_select_threads", "384", "512 or 256"},
    {"tilelang_score_warps", "2", "8 or 4"},
    {"tilelang_indexer_chunk", "10", "64"},
    {"tilelang_mla_query_groups", "sometimes", NULL},
    {"tilelang_mla_forward_query_groups", "often", NULL},
};

START_TEST(test_bad_value_refused)
{
    const bad_key *b = &cases[_i];
    char yaml[256], path[96];
    snprintf(yaml, sizeof yaml, "runtime:\n  %s: %s\n", b->key, b->value);
    snprintf(path, sizeof path, "runtime.%s", b->key);
    dsarl_recipe *r = NULL;
    dsarl_error err = {0};
    ck_assert_msg(dsarl_recipe_load_string(yaml, "bad.yaml", &r, &err) == 0, "%s", err.message);
    dsarl_dsa_context *ctx = (dsarl_dsa_context *)&ctx; /* must be reset to NULL */
    int rc = strncmp(b->key, "cudnn_", 6) == 0
                 ? cdn_create(&dsarl_cuda_device_ops, NULL, dsarl_recipe_root(r), &ctx, &err)
                 : tilelang_create(&dsarl_cuda_device_ops, NULL, dsarl_recipe_root(r), &ctx, &err);
    dsarl_recipe_free(r);
    ck_assert_msg(rc != 0, "%s=%s accepted", path, b->value);
    ck_assert_ptr_null(ctx);
    ck_assert_msg(strstr(err.message, path) && !strchr(err.message, '\n'),
                  "message does not name %s=%s in one line: %s", path, b->value, err.message);
    ck_assert_msg(!b->valid || strstr(err.message, b->valid), "message for %s=%s does not say what is valid ('%s'): %s",
                  path, b->value, b->valid, err.message);
    printf("check_dsa_cudnn_env: %s=%s: %s\n", path, b->value, err.message);
}
END_TEST

// Without a registry holding the tilelang backend, create refuses in one sentence naming what is missing.
START_TEST(test_tilelang_missing_refused)
{
    cdn_set_host(NULL);
    dsarl_dsa_context *ctx = (dsarl_dsa_context *)&ctx;
    dsarl_error err = {0};
    int rc = cdn_create(&dsarl_cuda_device_ops, NULL, NULL, &ctx, &err);
    ck_assert_msg(rc == DSARL_E_UNSUPPORTED, "rc %d (%s)", rc, err.message);
    ck_assert_ptr_null(ctx);
    ck_assert_msg(strstr(err.message, "tilelang") && strstr(err.message, "not loaded") && !strchr(err.message, '\n'),
                  "message does not say tilelang is not loaded, in one line: %s", err.message);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("dsa_cudnn_env");
    TCase *tc = tcase_create("keys");
    tcase_add_loop_test(tc, test_bad_value_refused, 0, (int)(sizeof cases / sizeof cases[0]));
    tcase_add_test(tc, test_tilelang_missing_refused);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
