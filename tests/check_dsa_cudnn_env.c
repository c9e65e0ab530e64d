/* check_dsa_cudnn_env.c: the cudnn DSA backend refuses a malformed DSARL_CUDNN_MAX_SEGMENT or DSARL_CUDNN_DP_CAP
 * with one sentence naming the variable and its value, before it looks at cuDNN or a GPU (so it runs in CI). */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_device.h"
#include "cudnn_dsa.h"

static const char *const variables[] = {"DSARL_CUDNN_MAX_SEGMENT", "DSARL_CUDNN_DP_CAP"};
static const char *const bad_values[] = {"0", "-3", "12abc", "", "1e4", "99999999999999999999"};

START_TEST(test_bad_value_refused)
{
    const char *name = variables[_i % 2], *value = bad_values[_i / 2];
    unsetenv(variables[0]);
    unsetenv(variables[1]);
    setenv(name, value, 1);
    dsarl_dsa_context *ctx = (dsarl_dsa_context *)&ctx; /* must be reset to NULL */
    dsarl_error err = {0};
    int rc = cdn_create(&dsarl_cuda_device_ops, NULL, NULL, &ctx, &err);
    unsetenv(name);
    ck_assert_msg(rc == DSARL_E_INVALID, "%s='%s': rc %d (%s)", name, value, rc, err.message);
    ck_assert_ptr_null(ctx);
    ck_assert_msg(strstr(err.message, name) && strstr(err.message, value) && !strchr(err.message, '\n'),
                  "message does not name %s='%s' in one line: %s", name, value, err.message);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("dsa_cudnn_env");
    TCase *tc = tcase_create("env");
    tcase_add_loop_test(tc, test_bad_value_refused, 0, (int)(2 * sizeof bad_values / sizeof bad_values[0]));
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
