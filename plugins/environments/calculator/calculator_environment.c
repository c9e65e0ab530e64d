/* calculator_environment.c: the "calculator" environment, a sandboxed tool for multi-turn rollouts.
 *
 * In a turn the policy either calls the tool, writing "<calc>EXPR</calc>" (the last such call of the turn counts),
 * and gets "<result>VALUE</result>" (or "<result>error: WHY</result>") appended to the conversation, or answers
 * with "Answer: N", which ends the episode with reward 1 when N equals the ground truth, else 0. The tool is an
 * integer expression evaluator over the text (calculator_eval.c): no shell, no files, no network. score() judges
 * the final answer alone, so the environment also serves single-turn runs and validation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calculator_eval.h"

enum { OBSERVATION_MAX = 96 }; /* "<result>error: ...</result>" or a 64-bit value */

struct dsarl_environment {
    char *observations; /* (capacity, OBSERVATION_MAX): the last step's texts */
    size_t capacity;
};

static const dsarl_key_spec calculator_keys[] = {
    {"env.calculator", DSARL_KEY_MAP, NULL, "settings of the calculator tool environment (none yet)",
     DSARL_KEY_OWNED | DSARL_KEY_NULLABLE},
};

static int calculator_create(const dsarl_node *recipe, const dsarl_node *section, dsarl_environment **out,
                             dsarl_error *err)
{
    (void)recipe, (void)section;
    dsarl_environment *env = calloc(1, sizeof *env);
    if (!env)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "calculator environment: out of memory");
    *out = env;
    return 0;
}

static void calculator_destroy(dsarl_environment *env)
{
    if (env)
        free(env->observations);
    free(env);
}

/* Reward and verdict of a final answer against the ground truth. */
static void judge(const char *response, const char *truth, float *reward, dsarl_verdict *verdict)
{
    int64_t want, got;
    const char *why;
    if (!truth || calculator_eval(truth, strlen(truth), &want, &why) != 0) {
        *reward = 0.0f;
        *verdict = DSARL_VERDICT_VERIFIER_FAILED;
        return;
    }
    bool right = response && calculator_last_answer(response, &got) == 0 && got == want;
    *reward = right ? 1.0f : 0.0f;
    *verdict = right ? DSARL_VERDICT_CORRECT : DSARL_VERDICT_WRONG;
}

static int calculator_score(dsarl_environment *env, size_t n, const char *const *responses,
                            const char *const *ground_truths, float *rewards, dsarl_verdict *verdicts, dsarl_error *err)
{
    (void)env, (void)err;
    for (size_t i = 0; i < n; i++)
        judge(responses[i], ground_truths[i], &rewards[i], &verdicts[i]);
    return 0;
}

static int calculator_step(dsarl_environment *env, size_t n, const char *const *responses,
                           const char *const *ground_truths, const int32_t *turns, const char **observations,
                           uint8_t *done, float *rewards, dsarl_verdict *verdicts, int32_t *tool_calls,
                           int32_t *invalid_tool_calls, dsarl_error *err)
{
    (void)turns;
    if (n > env->capacity) {
        char *grown = realloc(env->observations, n * OBSERVATION_MAX);
        if (!grown)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "calculator environment: out of memory for %zu observations", n);
        env->observations = grown, env->capacity = n;
    }
    for (size_t i = 0; i < n; i++) {
        const char *text = responses[i] ? responses[i] : "";
        char *obs = env->observations + i * OBSERVATION_MAX;
        const char *open = NULL;
        for (const char *at = strstr(text, "<calc>"); at; at = strstr(at + 1, "<calc>"))
            open = at;
        if (tool_calls)
            tool_calls[i] = open != NULL;
        if (invalid_tool_calls)
            invalid_tool_calls[i] = 0;
        if (!open) {
            done[i] = 1;
            observations[i] = NULL;
            judge(text, ground_truths[i], &rewards[i], &verdicts[i]);
            continue;
        }
        done[i] = 0;
        const char *expr = open + strlen("<calc>"), *close = strstr(expr, "</calc>");
        int64_t value;
        const char *why = "no closing </calc>";
        if (close && calculator_eval(expr, (size_t)(close - expr), &value, &why) == 0) {
            snprintf(obs, OBSERVATION_MAX, "<result>%lld</result>", (long long)value);
        } else {
            snprintf(obs, OBSERVATION_MAX, "<result>error: %s</result>", why);
            if (invalid_tool_calls)
                invalid_tool_calls[i] = 1;
        }
        observations[i] = obs;
    }
    return 0;
}

const dsarl_environment_ops calculator_environment_ops = {
    .common = DSARL_OPS_COMMON_RANKED(dsarl_environment_ops, DSARL_KIND_ENVIRONMENT, "calculator",
                                      "multi-turn integer calculator tool (<calc>EXPR</calc> -> <result>V</result>), "
                                      "reward 1 for the right 'Answer: N'",
                                      calculator_keys, DSARL_RANK_PRIMARY),
    .create = calculator_create,
    .destroy = calculator_destroy,
    .score = calculator_score,
    .step = calculator_step,
};
