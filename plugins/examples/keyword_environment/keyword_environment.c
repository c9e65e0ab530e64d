/* keyword_environment.c: an out-of-tree dsarl plugin, built only against the installed SDK.
 *
 * It registers the environment "keyword": reward 1 when the response contains the ground-truth string (or, when
 * env.keyword.case_sensitive is false, contains it ignoring ASCII case), else 0. Select it from a recipe with
 * data.default.env_name=keyword. Build:
 *
 *     cmake -S . -B build -DCMAKE_PREFIX_PATH=<dsarl prefix> && cmake --build build     (find_package)
 *     cc -shared -fPIC -fvisibility=hidden keyword_environment.c $(pkg-config --cflags --libs dsarl) \
 *        -Wl,--no-undefined -o dsarl-environment-keyword.so                             (pkg-config)
 *
 * then run dsarl with --plugin-path build (or DSARL_PLUGIN_PATH=build). */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <dsarl/ops/environment.h>

typedef struct dsarl_environment {
    bool case_sensitive;
    float reward_correct;
} keyword_env;

static const dsarl_key_spec keyword_keys[] = {
    {"env.keyword", DSARL_KEY_MAP, NULL, "settings of the keyword environment", DSARL_KEY_OWNED | DSARL_KEY_NULLABLE},
    {"env.keyword.case_sensitive", DSARL_KEY_BOOL, "true", "match the keyword with exact case", 0},
    {"env.keyword.reward_correct", DSARL_KEY_FLOAT, "1.0", "reward for a response that contains the keyword", 0},
};

static int keyword_create(const dsarl_node *recipe, const dsarl_node *section, dsarl_environment **out,
                          dsarl_error *err)
{
    (void)section; /* the keys are read by path from the recipe root */
    keyword_env *env = calloc(1, sizeof *env);
    if (!env)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "keyword environment: out of memory");
    double reward = 1.0;
    int rc = dsarl_recipe_bool_or(recipe, "env.keyword.case_sensitive", true, &env->case_sensitive, err);
    if (rc == 0)
        rc = dsarl_recipe_double_or(recipe, "env.keyword.reward_correct", 1.0, &reward, err);
    if (rc < 0) {
        free(env);
        return rc;
    }
    env->reward_correct = (float)reward;
    *out = env;
    return 0;
}

static void keyword_destroy(dsarl_environment *env) { free(env); }

static int contains(const char *haystack, const char *needle, bool case_sensitive)
{
    if (case_sensitive)
        return strstr(haystack, needle) != NULL;
    size_t n = strlen(needle);
    for (const char *h = haystack; *h; h++) {
        size_t i = 0;
        while (i < n && h[i] && tolower((unsigned char)h[i]) == tolower((unsigned char)needle[i]))
            i++;
        if (i == n)
            return 1;
    }
    return n == 0;
}

static int keyword_score(dsarl_environment *env, size_t n, const char *const *responses,
                         const char *const *ground_truths, float *rewards, dsarl_verdict *verdicts, dsarl_error *err)
{
    (void)err; /* scoring a string cannot fail */
    for (size_t i = 0; i < n; i++) {
        if (!responses[i] || !ground_truths[i]) {
            rewards[i] = 0.0f;
            verdicts[i] = DSARL_VERDICT_VERIFIER_FAILED;
            continue;
        }
        int hit = contains(responses[i], ground_truths[i], env->case_sensitive);
        rewards[i] = hit ? env->reward_correct : 0.0f;
        verdicts[i] = hit ? DSARL_VERDICT_CORRECT : DSARL_VERDICT_WRONG;
    }
    return 0;
}

static const dsarl_environment_ops keyword_ops = {
    .common = DSARL_OPS_COMMON(dsarl_environment_ops, DSARL_KIND_ENVIRONMENT, "keyword",
                               "example out-of-tree plugin: reward when the response contains the answer",
                               keyword_keys),
    .create = keyword_create,
    .destroy = keyword_destroy,
    .score = keyword_score,
};

static int keyword_init(const dsarl_host *host, dsarl_error *err)
{
    return host->register_ops(host, DSARL_KIND_ENVIRONMENT, &keyword_ops.common, err);
}

DSARL_PLUGIN_DEFINE("environment-keyword", "1.0.0", "Example environment built out of tree", keyword_init)
