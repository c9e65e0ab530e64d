/* check_env_math.c: the "math" environment against hand-made verdicts.
 *
 * Every dapo_math_verify row was also run through the Python original (verl math_dapo.py's compute_score with
 * NeMo RL's 1/0 reward) and agrees with it; rows marked "dsarl" are where dsarl deliberately differs (verifier
 * failures instead of a silent verdict, and the boxed mode, which the Python file does not have). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "dsarl/fileutil.h"
#include "math_verify.h"
#include "recipe_internal.h"

typedef struct verify_case {
    math_verify_mode mode;
    const char *response;
    const char *ground_truth;
    dsarl_verdict expected;
    const char *rule; /* what the row exercises */
} verify_case;

#define D MATH_VERIFY_DAPO
#define B MATH_VERIFY_BOXED
#define OK DSARL_VERDICT_CORRECT
#define NO DSARL_VERDICT_WRONG
#define VF DSARL_VERDICT_VERIFIER_FAILED

static const verify_case cases[] = {
    {D, "Let me think.\nAnswer: 19", "19", OK, "plain Answer: line"},
    {D, "answer: 19", "19", OK, "(?i): lower case"},
    {D, "ANSWER : 19", "19", OK, "whitespace before the colon"},
    {D, "Answer:\n19", "19", OK, "\\s* after the colon crosses a newline"},
    {D, "Answer: 18\nWait.\nAnswer: 19", "19", OK, "the last match wins"},
    {D, "Answer: 18\nWait.\nAnswer: 19", "18", NO, "an earlier answer does not count"},
    {D, "Answer: 19", "20", NO, "wrong number"},
    {D, "The result is 19.", "19", NO, "no Answer: at all"},
    {D, "Answer: $19$", "19", OK, "$...$ unwrapped"},
    {D, "Answer: \\boxed{19}", "19", OK, "\\boxed{} unwrapped"},
    {D, "Answer: 19.", "19", NO, "a trailing '.' is NOT removed (only '.$')"},
    {D, "Answer: x = 19", "19", OK, "text after the last '=' kept"},
    {D, "Answer: 1,234", "1234", OK, "thousands commas dropped from integers"},
    {D, "Answer: 1,234.5", "1234.5", NO, "commas kept when not all digits"},
    {D, "Answer: 5 dollars", "5", OK, "unit word removed"},
    {D, "Answer: 90^\\circ", "90", OK, "^\\circ removed"},
    {D, "Answer: \\text{(B)}", "(B)", OK, "\\text{} unwrapped"},
    {D, "Answer: \\textbf{12}", "12", OK, "\\textbf{} unwrapped"},
    {D, "Answer: \\overline{3}", "3", OK, "\\overline{} unwrapped"},
    {D, "Answer: \\frac12", "\\frac{1}{2}", OK, "\\frac shorthand expanded"},
    {D, "Answer: \\sqrt2", "\\sqrt{2}", OK, "\\sqrt shorthand expanded"},
    {D, "Answer: 0.5", "1/2", NO, "no numeric equivalence in dapo mode"},
    {D, "Answer: \\frac{1}{2}", "1/2", NO, "\\frac{1}{2} and 1/2 differ in dapo mode"},
    {D, "Answer: +3", "3", NO, "a leading '+' is kept in dapo mode"},
    {D, "Final answer: 7", "7", OK, "'answer:' inside a longer phrase"},
    {D, "The answer is: 7", "7", NO, "'answer is:' does not match"},
    {D, "Answer: 19", "19 units", OK, "the ground truth is normalised too"},
    {D, "Answer: an 8", "8", OK, "'an ' removed"},
    {D, "Answer:\xc2\xa0" "42", "42", OK, "U+00A0 is whitespace for \\s"},
    {D, "Answer: 42 \xe2\x9c\x93", "42", NO, "a trailing symbol stays"},
    {D, "Answer: $5$ and $6$", "5", OK, "only the first $...$ span is kept"},
    {D, "Answer: 3\\text{and}4", "3,4", OK, "\\text{and} becomes ','"},
    {D, "Answer:   \n", "19", NO, "an empty answer line"},
    {B, "so the result is \\boxed{19}.", "19", OK, "boxed: plain"},
    {B, "\\boxed{\\frac{1}{2}}", "0.5", OK, "boxed: fraction equals decimal"},
    {B, "\\boxed{0.50}", "1/2", OK, "boxed: decimal equals a/b"},
    {B, "\\boxed{+3}", "3", OK, "boxed: leading '+'"},
    {B, "\\boxed{007}", "7", OK, "boxed: leading zeros"},
    {B, "\\boxed{\\dfrac{2}{4}}", "\\frac{1}{2}", OK, "boxed: \\dfrac and reduction"},
    {B, "\\boxed{-\\frac{3}{4}}", "-0.75", OK, "boxed: negative fraction"},
    {B, "\\boxed{0.5}", "-1/2", NO, "boxed: the sign matters"},
    {B, "first \\boxed{3} then \\boxed{4}", "4", OK, "boxed: the last box wins"},
    {B, "first \\boxed{3} then \\boxed{4}", "3", NO, "boxed: an earlier box does not count"},
    {B, "\\boxed{x^{2}+1}", "x^{2}+1", OK, "boxed: nested braces balanced"},
    {B, "\\boxed{\\frac{1}{2", "1/2", NO, "boxed: unbalanced braces are no answer"},
    {B, "Answer: 19", "19", NO, "boxed: an Answer: line is not read"},
    {B, "\\boxed{1/0}", "1/0", OK, "boxed: not a number, still equal as strings"},
    {D, "Answer: 19", NULL, VF, "dsarl: no ground truth"},
    {D, NULL, "19", VF, "dsarl: no response"},
    {D, "Answer: 19", "", VF, "dsarl: empty ground truth"},
    {D, "Answer: 19", "  \t", VF, "dsarl: blank ground truth"},
    {D, "Answer: 19", "dollars", VF, "dsarl: ground truth normalises to nothing"},
    {D, "Answer: 19", "\xff" "19", VF, "dsarl: ground truth not UTF-8"},
    {B, "\\boxed{}", NULL, VF, "dsarl: boxed mode, no ground truth"},
};

START_TEST(test_verdict_table)
{
    ck_assert_uint_ge(DSARL_ARRAY_LEN(cases), 30);
    for (size_t i = 0; i < DSARL_ARRAY_LEN(cases); i++) {
        const verify_case *c = &cases[i];
        dsarl_verdict v = (dsarl_verdict)-1;
        const char *why = NULL;
        dsarl_error err = {0};
        ck_assert_int_eq(math_verify_one(c->mode, c->response, c->ground_truth, &v, &why, &err), 0);
        ck_assert_msg(v == c->expected, "row %zu (%s): verdict %d, expected %d", i, c->rule, v, c->expected);
        if (v == VF)
            ck_assert_msg(why && why[0], "row %zu: a verifier failure must say why", i);
    }
}
END_TEST

/* The tail is 300 code points, not bytes: 280 two-byte characters after the answer keep it in view (570 bytes),
 * 295 push it out; and an answer before 300 ASCII characters is out of view. */
START_TEST(test_tail_counts_code_points)
{
    char in_view[10 + 2 * 280 + 1], out_of_view[10 + 2 * 295 + 1], ascii[11 + 300 + 1], far[400 + 12];
    strcpy(in_view, "Answer: 5\n");
    for (int i = 0; i < 280; i++)
        strcat(in_view, "\xc3\xa9");
    strcpy(out_of_view, "Answer: 5\n");
    for (int i = 0; i < 295; i++)
        strcat(out_of_view, "\xc3\xa9");
    strcpy(ascii, "Answer: 5\n");
    memset(ascii + 10, 'x', 300);
    ascii[310] = '\0';
    memset(far, 'y', 400);
    strcpy(far + 400, "\nAnswer: 5");
    const struct {
        const char *response;
        dsarl_verdict expected;
    } rows[] = {{in_view, OK}, {out_of_view, NO}, {ascii, NO}, {far, OK}};
    for (size_t i = 0; i < DSARL_ARRAY_LEN(rows); i++) {
        dsarl_verdict v;
        ck_assert_int_eq(math_verify_one(D, rows[i].response, "5", &v, NULL, NULL), 0);
        ck_assert_msg(v == rows[i].expected, "tail row %zu: verdict %d", i, v);
    }
}
END_TEST

/* normalize_final_answer itself, values from the Python original. */
START_TEST(test_normalize)
{
    const char *rows[][2] = {
        {"\\frac12", "\\frac{1}{2}"},
        {" 1,000 ", "1000"},
        {"\\text{m}5", "5"},
        {"x=\\$3\\$", "3"},
        {"\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"},
        {"a $2$ b $3$", "2"},
        {"10 cm", "10"},
        {"\\fracab c", "\\frac{a}{b}c"},
        {"\\text{ab", "\\text{ab"},
        {"\\boxed{1}+\\boxed{2}", "1}+\\boxed{2"},
        {"\\sqrt{3}", "\\sqrt{3}"},
        {"\t5\n", "5"},
    };
    for (size_t i = 0; i < DSARL_ARRAY_LEN(rows); i++) {
        char *got = math_normalize_final_answer(rows[i][0]);
        ck_assert_ptr_nonnull(got);
        ck_assert_msg(strcmp(got, rows[i][1]) == 0, "normalize('%s') = '%s', expected '%s'", rows[i][0], got,
                      rows[i][1]);
        free(got);
    }
}
END_TEST

START_TEST(test_same_number)
{
    ck_assert(math_same_number("0.25", "1/4"));
    ck_assert(math_same_number("\\tfrac{6}{8}", ".75"));
    ck_assert(math_same_number("-0", "0"));
    ck_assert(!math_same_number("1/3", "0.333"));
    ck_assert(!math_same_number("1/0", "1/0"));     // not a number
    ck_assert(!math_same_number("1e3", "1000"));    // exponents are not read
    ck_assert(!math_same_number("1234567890123456789", "1234567890123456789")); // over 18 digits: refused
    ck_assert(!math_same_number("", "0"));
}
END_TEST

static dsarl_recipe *load(const char *yaml)
{
    dsarl_recipe *r = NULL;
    dsarl_error err = {0};
    ck_assert_msg(dsarl_recipe_load_string(yaml, "test.yaml", &r, &err) == 0, "%s", err.message);
    return r;
}

START_TEST(test_environment_scores_and_counts)
{
    dsarl_recipe *r = load("env:\n  math:\n    num_workers: 4\n    math_verify_impl: dapo_math_verify\n");
    dsarl_environment *env = NULL;
    dsarl_error err = {0};
    const dsarl_environment_ops *ops = &math_environment_ops;
    ck_assert_str_eq(ops->common.name, "math");
    ck_assert_int_eq(ops->create(dsarl_recipe_root(r), dsarl_node_get(dsarl_recipe_root(r), "env.math"), &env, &err),
                     0);
    const char *responses[] = {"Answer: 4", "Answer: 5", "Answer: 4", NULL};
    const char *truths[] = {"4", "4", NULL, "4"};
    float rewards[4] = {-7, -7, -7, -7};
    dsarl_verdict verdicts[4];
    ck_assert_int_eq(ops->score(env, 4, responses, truths, rewards, verdicts, &err), 0);
    ck_assert_float_eq(rewards[0], 1.0f);
    ck_assert_float_eq(rewards[1], 0.0f);
    ck_assert_float_eq(rewards[2], 0.0f);
    ck_assert_float_eq(rewards[3], 0.0f);
    ck_assert_int_eq(verdicts[0], OK);
    ck_assert_int_eq(verdicts[1], NO);
    ck_assert_int_eq(verdicts[2], VF);
    ck_assert_int_eq(verdicts[3], VF);
    ck_assert_uint_eq(math_environment_failures(env), 2);
    ck_assert_int_eq(ops->score(env, 1, &responses[2], &truths[2], rewards, verdicts, &err), 0);
    ck_assert_uint_eq(math_environment_failures(env), 3);
    ops->destroy(env);
    dsarl_recipe_free(r);

    // boxed mode from the recipe, and the default (no section) is hf_math_verify, as in NeMo RL
    r = load("env:\n  math:\n    math_verify_impl: boxed\n");
    ck_assert_int_eq(ops->create(dsarl_recipe_root(r), NULL, &env, &err), 0);
    const char *boxed[] = {"\\boxed{0.5}"};
    const char *half[] = {"1/2"};
    ck_assert_int_eq(ops->score(env, 1, boxed, half, rewards, verdicts, &err), 0);
    ck_assert_int_eq(verdicts[0], OK);
    ops->destroy(env);
    dsarl_recipe_free(r);
    ck_assert_int_eq(ops->create(NULL, NULL, &env, &err), 0);
    ck_assert_int_eq(ops->score(env, 1, boxed, half, rewards, verdicts, &err), 0);
    ck_assert_int_eq(verdicts[0], OK); // hf_math_verify: 0.5 equals 1/2
    const char *answer_line[] = {"Answer: 4"};
    ck_assert_int_eq(ops->score(env, 1, answer_line, half, rewards, verdicts, &err), 0);
    ck_assert_int_eq(verdicts[0], NO);
    ops->destroy(env);
}
END_TEST

START_TEST(test_environment_refuses_bad_impl)
{
    const dsarl_environment_ops *ops = &math_environment_ops;
    dsarl_environment *env = NULL;
    dsarl_error err = {0};
    dsarl_recipe *r = load("env:\n  math:\n    math_verify_impl: sympy\n");
    ck_assert_int_eq(ops->create(dsarl_recipe_root(r), NULL, &env, &err), DSARL_E_INVALID);
    ck_assert_ptr_null(env);
    ck_assert_msg(strstr(err.message, "test.yaml:3") && strstr(err.message, "env.math.math_verify_impl") &&
                      strstr(err.message, "'sympy'") &&
                      strstr(err.message, "hf_math_verify, dapo_math_verify or boxed"),
                  "%s", err.message);
    dsarl_recipe_free(r);
    // keys: env.math is owned, num_workers ignored
    const dsarl_key_spec *keys = ops->common.keys;
    ck_assert_uint_eq(ops->common.n_keys, 3);
    ck_assert_str_eq(keys[0].path, "env.math");
    ck_assert(keys[0].flags & DSARL_KEY_OWNED);
    ck_assert(keys[1].flags & DSARL_KEY_IGNORED);
}
END_TEST

static Suite *env_math_suite(void)
{
    Suite *s = suite_create("env_math");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_verdict_table);
    tcase_add_test(tc, test_tail_counts_code_points);
    tcase_add_test(tc, test_normalize);
    tcase_add_test(tc, test_same_number);
    tcase_add_test(tc, test_environment_scores_and_counts);
    tcase_add_test(tc, test_environment_refuses_bad_impl);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(env_math_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
