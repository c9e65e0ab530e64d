/* test_plugin.c: one source, built several times with different -D flags, giving the plugins the registry tests
 * load: a good one, and one per refusal the loader must report (wrong ABI major, newer minor, wrong build
 * signature, descriptor too small, ops table too small, init failure, duplicate name, no descriptor). */
#include <string.h>

#include "dsarl/ops/environment.h"

#ifndef TEST_ENV_NAME
#define TEST_ENV_NAME "testgood"
#endif

static const dsarl_key_spec test_keys[] = {
    {"env." TEST_ENV_NAME ".reward_correct", DSARL_KEY_FLOAT, "1.0", "reward for a correct answer", 0},
};

static int test_create(const dsarl_node *recipe, const dsarl_node *section, dsarl_environment **out,
                       dsarl_error *err)
{
    *out = NULL;
    return 0;
}

static void test_destroy(dsarl_environment *env) {}

/* Reward 1 when the response equals the ground truth, else 0. */
static int test_score(dsarl_environment *env, size_t n, const char *const *responses,
                      const char *const *ground_truths, float *rewards, dsarl_verdict *verdicts, dsarl_error *err)
{
    for (size_t i = 0; i < n; i++) {
        int ok = strcmp(responses[i], ground_truths[i]) == 0;
        rewards[i] = ok ? 1.0f : 0.0f;
        verdicts[i] = ok ? DSARL_VERDICT_CORRECT : DSARL_VERDICT_WRONG;
    }
    return 0;
}

static const dsarl_environment_ops test_env = {
    .common = DSARL_OPS_COMMON(dsarl_environment_ops, DSARL_KIND_ENVIRONMENT, TEST_ENV_NAME,
                               "exact-match environment for the loader tests", test_keys),
    .create = test_create,
    .destroy = test_destroy,
    .score = test_score,
};

#ifdef TEST_SMALL_OPS
static const dsarl_ops_common small_ops = {.struct_size = 8, .kind = DSARL_KIND_ENVIRONMENT, .name = "small"};
#endif

static int test_init(const dsarl_host *host, dsarl_error *err)
{
#if defined(TEST_INIT_FAILS)
    (void)test_env;
    return DSARL_FAIL(err, DSARL_E_DEVICE, "no device of the kind this test plugin wants");
#elif defined(TEST_SMALL_OPS)
    (void)test_env;
    return host->register_ops(host, DSARL_KIND_ENVIRONMENT, &small_ops, err);
#else
    return host->register_ops(host, DSARL_KIND_ENVIRONMENT, &test_env.common, err);
#endif
}

#ifndef TEST_NO_DESCRIPTOR
#ifndef TEST_ABI_MAJOR
#define TEST_ABI_MAJOR DSARL_ABI_MAJOR
#endif
#ifndef TEST_ABI_MINOR
#define TEST_ABI_MINOR DSARL_ABI_MINOR
#endif
#ifdef TEST_WRONG_BUILD_SIG
#define TEST_BUILD_SIG "abi=1;ptr=32;bf16=u16;cuda=none"
#else
#define TEST_BUILD_SIG DSARL_BUILD_SIG
#endif
#ifndef TEST_DESC_SIZE
#define TEST_DESC_SIZE sizeof(dsarl_plugin_descriptor)
#endif
DSARL_PLUGIN_EXPORT extern const dsarl_plugin_descriptor dsarl_plugin_descriptor_v1;
const dsarl_plugin_descriptor dsarl_plugin_descriptor_v1 = {
    .abi_major = TEST_ABI_MAJOR, .abi_minor = TEST_ABI_MINOR, .struct_size = (uint32_t)(TEST_DESC_SIZE),
    .name = "environment-" TEST_ENV_NAME, .version = "0.0.1", .build_sig = TEST_BUILD_SIG,
    .description = "loader test plugin", .init = test_init};
#else
/* Exported, so the file is a valid shared object that merely lacks the descriptor. */
DSARL_PLUGIN_EXPORT int not_a_dsarl_plugin(void);
int not_a_dsarl_plugin(void) { return (int)((uintptr_t)&test_init & 1u); }
#endif
