/* math_environment.c: the "math" environment: reward 1.0 for a correct answer, 0.0 otherwise (NeMo RL's
 * MathEnvironment; verl's -1/1 is not used). A response the verifier cannot judge gets reward 0.0 and verdict
 * DSARL_VERDICT_VERIFIER_FAILED, is counted (math_environment_failures) and logged, never passed off as WRONG. */
#include <stdlib.h>
#include <string.h>

#include "dsarl/log.h"
#include "math_hf_verify.h"
#include "math_verify.h"

struct dsarl_environment {
    math_verify_mode mode;
    math_hf_verifier *hf; /* hf_math_verify's compiled patterns and arenas (NULL in the other modes) */
    uint64_t failures;    /* verifier failures since create */
};

static const dsarl_key_spec math_keys[] = {
    {"env.math", DSARL_KEY_MAP, NULL, "settings of the math reward environment",
     DSARL_KEY_OWNED | DSARL_KEY_NULLABLE},
    {"env.math.num_workers", DSARL_KEY_INT, "1",
     "NeMo RL's number of verifier worker actors; ignored: dsarl verifies in-process", DSARL_KEY_IGNORED},
    {"env.math.math_verify_impl", DSARL_KEY_STRING, "hf_math_verify",
     "answer checker: hf_math_verify (Hugging Face math-verify's extraction and equivalence, NeMo RL's default) | "
     "dapo_math_verify (last 'Answer:' line, normalised, exact match) | boxed (last \\boxed{})", 0},
};

static int math_create(const dsarl_node *recipe, const dsarl_node *section, dsarl_environment **out,
                       dsarl_error *err)
{
    (void)section; /* keys are read by path from the root so errors name their full path */
    *out = NULL;
    const char *impl = "hf_math_verify";
    if (recipe)
        DSARL_TRY(dsarl_recipe_string_or(recipe, "env.math.math_verify_impl", "hf_math_verify", &impl, err));
    math_verify_mode mode;
    if (strcmp(impl, "hf_math_verify") == 0) {
        mode = MATH_VERIFY_HF;
    } else if (strcmp(impl, "dapo_math_verify") == 0) {
        mode = MATH_VERIFY_DAPO;
    } else if (strcmp(impl, "boxed") == 0) {
        mode = MATH_VERIFY_BOXED;
    } else {
        return dsarl_recipe_fail(recipe, "env.math.math_verify_impl", err, DSARL_E_INVALID,
                                 "must be hf_math_verify, dapo_math_verify or boxed, got '%s'", impl);
    }
    dsarl_environment *env = calloc(1, sizeof *env);
    if (!env)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "math environment: out of memory");
    env->mode = mode;
    if (mode == MATH_VERIFY_HF) {
        char why[256];
        env->hf = math_hf_create(why, sizeof why);
        if (!env->hf) {
            free(env);
            return DSARL_FAIL(err, DSARL_E_NOMEM, "math environment: hf_math_verify: %s", why);
        }
    }
    dsarl_log(DSARL_LOG_INFO, "math environment: %s", impl);
    *out = env;
    return 0;
}

static void math_destroy(dsarl_environment *env)
{
    if (env)
        math_hf_destroy(env->hf);
    free(env);
}

/* hf_math_verify on one response; the same input checks as math_verify_one. */
static void hf_verify_one(dsarl_environment *env, const char *response, const char *truth, dsarl_verdict *verdict,
                          const char **why)
{
    *why = NULL;
    if (!truth)
        *why = "the example has no ground truth";
    else if (!response)
        *why = "the response is missing (NULL)";
    else if (strlen(truth) > MATH_VERIFY_MAX_GROUND_TRUTH)
        *why = "the ground truth is longer than 1024 bytes";
    if (*why) {
        *verdict = DSARL_VERDICT_VERIFIER_FAILED;
        return;
    }
    int rc = math_hf_verify(env->hf, response, truth, why);
    *verdict = rc == MATH_HF_CORRECT ? DSARL_VERDICT_CORRECT
               : rc == MATH_HF_WRONG ? DSARL_VERDICT_WRONG
                                     : DSARL_VERDICT_VERIFIER_FAILED;
}

/* Logs the 1st..5th failure, then every power of two, so a broken dataset is loud but not a flood. */
static void log_failure(const dsarl_environment *env, size_t i, const char *why)
{
    uint64_t k = env->failures;
    if (k <= 5 || (k & (k - 1)) == 0)
        dsarl_log(DSARL_LOG_WARN, "math environment: verifier failed on response %zu of the batch: %s (failure %llu "
                  "so far; reward 0, verdict verifier_failed)", i, why, (unsigned long long)k);
}

static int math_score(dsarl_environment *env, size_t n, const char *const *responses,
                      const char *const *ground_truths, float *rewards, dsarl_verdict *verdicts, dsarl_error *err)
{
    if (n > 0 && (!responses || !ground_truths || !rewards || !verdicts))
        return DSARL_FAIL(err, DSARL_E_INVALID, "math environment: score() needs non-NULL responses, "
                          "ground_truths, rewards and verdicts arrays for n = %zu", n);
    for (size_t i = 0; i < n; i++) {
        const char *why = NULL;
        if (env->mode == MATH_VERIFY_HF)
            hf_verify_one(env, responses[i], ground_truths[i], &verdicts[i], &why);
        else
            DSARL_TRY(math_verify_one(env->mode, responses[i], ground_truths[i], &verdicts[i], &why, err));
        rewards[i] = verdicts[i] == DSARL_VERDICT_CORRECT ? 1.0f : 0.0f;
        if (verdicts[i] == DSARL_VERDICT_VERIFIER_FAILED) {
            env->failures++;
            log_failure(env, i, why);
        }
    }
    return 0;
}

/* ABI 1.4 reward vector, sorted by name: "correctness" (the reward itself) and "format" (1 when the response
 * writes its answer the way the verifier looks for it: an "Answer:" line, or a \boxed{} in boxed mode), the two
 * signals a multi-reward estimator such as GDPO can weigh separately. */
static const char *const math_component_names[] = {"correctness", "format"};

static size_t math_reward_components(const dsarl_environment *env, const char *const **names)
{
    (void)env;
    if (names)
        *names = math_component_names;
    return 2;
}

static int math_score_components(dsarl_environment *env, size_t n, const char *const *responses,
                                 const char *const *ground_truths, float *rewards, dsarl_verdict *verdicts,
                                 float *components, dsarl_error *err)
{
    DSARL_TRY(math_score(env, n, responses, ground_truths, rewards, verdicts, err));
    if (n > 0 && !components)
        return DSARL_FAIL(err, DSARL_E_INVALID, "math environment: score_components() needs a components array");
    const char *marker = env->mode == MATH_VERIFY_BOXED ? "\\boxed{" : "Answer:";
    for (size_t i = 0; i < n; i++) {
        components[2 * i] = rewards[i];
        components[2 * i + 1] = strstr(responses[i], marker) ? 1.0f : 0.0f;
    }
    return 0;
}

uint64_t math_environment_failures(const dsarl_environment *env) { return env ? env->failures : 0; }

const dsarl_environment_ops math_environment_ops = {
    .common = DSARL_OPS_COMMON_RANKED(dsarl_environment_ops, DSARL_KIND_ENVIRONMENT, "math",
                                      "math answers (reward 1/0): NeMo RL's hf_math_verify or dapo_math_verify, or the "
                                      "last \\boxed{}",
                                      math_keys, DSARL_RANK_PRIMARY),
    .create = math_create,
    .destroy = math_destroy,
    .score = math_score,
    .reward_components = math_reward_components,
    .score_components = math_score_components,
};
