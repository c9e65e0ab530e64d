/* check_env_calculator.c: the calculator tool environment (plugins/environments/calculator): the evaluator against
 * hand-computed values and its refusals (overflow, division, depth, length, anything that is not arithmetic), and
 * one multi-turn episode through step(): a tool call, its result, then a final answer judged against the truth. */
#include <check.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "calculator_eval.h"

static int64_t eval_ok(const char *expr)
{
    int64_t v = 0;
    const char *why = NULL;
    ck_assert_msg(calculator_eval(expr, strlen(expr), &v, &why) == 0, "'%s' refused: %s", expr, why);
    return v;
}

static const char *eval_refused(const char *expr)
{
    int64_t v = 0;
    const char *why = NULL;
    ck_assert_msg(calculator_eval(expr, strlen(expr), &v, &why) == -1, "'%s' evaluated to %lld", expr, (long long)v);
    ck_assert(why != NULL);
    return why;
}

START_TEST(test_eval_by_hand)
{
    ck_assert_int_eq(eval_ok("347*29"), 10063);
    ck_assert_int_eq(eval_ok("2+3*4"), 14);          // precedence
    ck_assert_int_eq(eval_ok("(2+3)*4"), 20);
    ck_assert_int_eq(eval_ok(" 10 - 4 - 3 "), 3);    // left associative
    ck_assert_int_eq(eval_ok("-(7*-6)"), 42);        // unary minus
    ck_assert_int_eq(eval_ok("84/4/3"), 7);          // exact division, left to right
    ck_assert_int_eq(eval_ok("9223372036854775807"), INT64_MAX);
    ck_assert(strstr(eval_refused("9223372036854775807+1"), "overflow"));
    ck_assert(strstr(eval_refused("4294967296*4294967296"), "overflow"));
    ck_assert(strstr(eval_refused("1/0"), "division by zero"));
    ck_assert(strstr(eval_refused("7/2"), "inexact"));
    eval_refused("");
    eval_refused("2+");
    eval_refused("(1+2");
    eval_refused("rm -rf /");
    eval_refused("1;2");
    eval_refused("system(1)");
    char deep[2 * CALCULATOR_MAX_DEPTH + 8];
    memset(deep, '(', CALCULATOR_MAX_DEPTH + 1);
    deep[CALCULATOR_MAX_DEPTH + 1] = '1';
    memset(deep + CALCULATOR_MAX_DEPTH + 2, ')', CALCULATOR_MAX_DEPTH + 1);
    deep[2 * CALCULATOR_MAX_DEPTH + 3] = '\0';
    ck_assert(strstr(eval_refused(deep), "deep"));
    char lng[CALCULATOR_MAX_EXPRESSION + 8];
    memset(lng, '1', sizeof lng - 1);
    lng[sizeof lng - 1] = '\0';
    ck_assert(strstr(eval_refused(lng), "long"));
    int64_t v;
    ck_assert(calculator_last_answer("Answer: 3\nno, Answer: -12 final", &v) == 0 && v == -12);
    ck_assert(calculator_last_answer("the answer is 5", &v) == -1);
    ck_assert(calculator_last_answer("Answer: x", &v) == -1);
}
END_TEST

START_TEST(test_episode_through_step)
{
    const dsarl_environment_ops *ops = &calculator_environment_ops;
    dsarl_environment *env = NULL;
    dsarl_error err = {0};
    ck_assert_int_eq(ops->create(NULL, NULL, &env, &err), 0);
    ck_assert(dsarl_environment_has_step(ops) && !dsarl_environment_has_components(ops));
    // turn 0: three episodes: a valid call, an invalid call, a (wrong) direct answer
    const char *turn0[3] = {"let me see <calc>347*29</calc>", "<calc>1/0</calc>", " Answer: 10000"};
    const char *truth[3] = {"10063", "10063", "10063"};
    const int32_t turns[3] = {0, 0, 0};
    const char *obs[3];
    uint8_t done[3];
    float reward[3] = {-1, -1, -1};
    dsarl_verdict verdict[3];
    int32_t calls[3], invalid[3];
    ck_assert_int_eq(ops->step(env, 3, turn0, truth, turns, obs, done, reward, verdict, calls, invalid, &err), 0);
    ck_assert(!done[0] && strcmp(obs[0], "<result>10063</result>") == 0 && calls[0] == 1 && invalid[0] == 0);
    ck_assert(!done[1] && strstr(obs[1], "division by zero") && calls[1] == 1 && invalid[1] == 1);
    ck_assert(done[2] && reward[2] == 0.0f && verdict[2] == DSARL_VERDICT_WRONG && calls[2] == 0);
    // turn 1 of the first episode: the right answer ends it with reward 1
    const char *turn1[1] = {" Answer: 10063"};
    const int32_t t1[1] = {1};
    ck_assert_int_eq(ops->step(env, 1, turn1, truth, t1, obs, done, reward, verdict, calls, invalid, &err), 0);
    ck_assert(done[0] && reward[0] == 1.0f && verdict[0] == DSARL_VERDICT_CORRECT);
    // single-turn score judges the final answer; an unparsable truth is a verifier failure, not a 0
    const char *whole[2] = {"<calc>347*29</calc><result>10063</result> Answer: 10063", " Answer: 1"};
    const char *truths[2] = {"10063", "not a number"};
    ck_assert_int_eq(ops->score(env, 2, whole, truths, reward, verdict, &err), 0);
    ck_assert(reward[0] == 1.0f && verdict[1] == DSARL_VERDICT_VERIFIER_FAILED);
    ops->destroy(env);
}
END_TEST

static Suite *calculator_suite(void)
{
    Suite *s = suite_create("env_calculator");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_eval_by_hand);
    tcase_add_test(tc, test_episode_through_step);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(calculator_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
