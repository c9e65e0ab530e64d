/* check_math_hf_verify: hf_math_verify in C. The regex matcher against Python re's documented semantics, the
 * rationals against hand-derived values, and the verifier against verdicts Python math-verify 0.9 gave for the
 * same (response, ground truth) pairs under NeMo RL's configuration (each case below was run through it);
 * pathological inputs end as verifier failures within the budgets. The 10,000-pair agreement is the
 * math_hf_agreement_10k test. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "math_expr.h"
#include "math_hf_verify.h"
#include "math_regex.h"

static int search(const char *pattern, unsigned flags, const char *text, long *start, long *end, char *g1,
                  size_t g1cap)
{
    char err[128];
    mre_prog *p = mre_compile(pattern, flags, err, sizeof err);
    ck_assert_msg(p, "%s: %s", pattern, err);
    long n = 0, caps[64], budget = 1000000;
    uint32_t *cp = mre_decode(text, strlen(text), &n);
    int rc = mre_search(p, cp, n, 0, caps, &budget);
    if (rc == MRE_MATCH) {
        *start = caps[0];
        *end = caps[1];
        if (g1 && mre_ngroups(p) > 1) {
            char *s = caps[2] >= 0 ? mre_encode(cp + caps[2], caps[3] - caps[2]) : NULL;
            snprintf(g1, g1cap, "%s", s ? s : "(unset)");
            free(s);
        }
    }
    free(cp);
    mre_free(p);
    return rc;
}

START_TEST(test_regex_semantics)
{
    long s = 0, e = 0;
    char g[64];
    // greedy takes the most, lazy the least, both leftmost
    ck_assert_int_eq(search("a(.+)b", 0, "xa1b2b", &s, &e, g, sizeof g), MRE_MATCH);
    ck_assert_str_eq(g, "1b2");
    ck_assert_int_eq(search("a(.+?)b", 0, "xa1b2b", &s, &e, g, sizeof g), MRE_MATCH);
    ck_assert_str_eq(g, "1");
    ck_assert_int_eq(s, 1);
    // alternation prefers its first branch even when a later one is longer (not POSIX leftmost-longest)
    ck_assert_int_eq(search("(a|ab)", 0, "ab", &s, &e, g, sizeof g), MRE_MATCH);
    ck_assert_str_eq(g, "a");
    // counted repeats, lazy {0,3}?
    ck_assert_int_eq(search("x(.{0,3}?)y", 0, "x12y", &s, &e, g, sizeof g), MRE_MATCH);
    ck_assert_str_eq(g, "12");
    ck_assert_int_eq(search("x.{0,2}y", 0, "x123y", &s, &e, NULL, 0), MRE_NOMATCH);
    // . skips newlines unless DOTALL
    ck_assert_int_eq(search("a.b", 0, "a\nb", &s, &e, NULL, 0), MRE_NOMATCH);
    ck_assert_int_eq(search("a.b", MRE_DOTALL, "a\nb", &s, &e, NULL, 0), MRE_MATCH);
    // (?i:...) folds only inside the group; lookbehind and lookahead
    ck_assert_int_eq(search("(?i:answer):", 0, "The ANSWER: 3", &s, &e, NULL, 0), MRE_MATCH);
    ck_assert_int_eq(s, 4);
    ck_assert_int_eq(search("(?i:a)B", 0, "ab", &s, &e, NULL, 0), MRE_NOMATCH);
    ck_assert_int_eq(search("(?<!\\\\)\\$(\\d)", 0, "\\$1 $2", &s, &e, g, sizeof g), MRE_MATCH);
    ck_assert_str_eq(g, "2");
    ck_assert_int_eq(search("(\\d+)(?!\\s*=)", 0, "12 = 3", &s, &e, g, sizeof g), MRE_MATCH);
    ck_assert_str_eq(g, "1"); // 12 is followed by " =", so the match backs off to 1 (then 2 is not followed by =)
    // $ matches before a final newline; ^ only at the start
    ck_assert_int_eq(search("5$", 0, "x5\n", &s, &e, NULL, 0), MRE_MATCH);
    ck_assert_int_eq(search("^5", 0, "x5", &s, &e, NULL, 0), MRE_NOMATCH);
    // code points, not bytes: one . per character of "é€"
    ck_assert_int_eq(search("^..$", 0, "\xc3\xa9\xe2\x82\xac", &s, &e, NULL, 0), MRE_MATCH);
    // \b word boundaries, classes with escapes, named groups
    ck_assert_int_eq(search("\\bor\\b", 0, "for or", &s, &e, NULL, 0), MRE_MATCH);
    ck_assert_int_eq(s, 4);
    char err[128];
    mre_prog *p = mre_compile("(?P<num>[\\d.,]+)(?P<pct>%)?", 0, err, sizeof err);
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(mre_group(p, "num"), 1);
    ck_assert_int_eq(mre_group(p, "pct"), 2);
    ck_assert_int_eq(mre_group(p, "nope"), -1);
    mre_free(p);
    // syntax errors are reported, not crashes
    ck_assert_ptr_null(mre_compile("(ab", 0, err, sizeof err));
    ck_assert_ptr_null(mre_compile("(?<!a+)b", 0, err, sizeof err));
}
END_TEST

START_TEST(test_regex_budget)
{
    // catastrophic backtracking: (a+)+b on a run of a's with no b; the budget stops it
    char err[128];
    mre_prog *p = mre_compile("(a+)+b", 0, err, sizeof err);
    ck_assert_ptr_nonnull(p);
    char text[64];
    memset(text, 'a', 40);
    text[40] = '\0';
    long n = 0, caps[8], budget = 200000;
    uint32_t *cp = mre_decode(text, 40, &n);
    ck_assert_int_eq(mre_search(p, cp, n, 0, caps, &budget), MRE_BUDGET);
    free(cp);
    mre_free(p);
}
END_TEST

START_TEST(test_rationals)
{
    mq a = mq_make(6, -4);
    ck_assert(a.ok && a.num == -3 && a.den == 2);
    mq b = mq_add(mq_make(1, 3), mq_make(1, 6));
    ck_assert(b.ok && b.num == 1 && b.den == 2);
    mq c = mq_mul(mq_make(2, 3), mq_make(9, 4));
    ck_assert(c.ok && c.num == 3 && c.den == 2);
    mq d = mq_pow(mq_make(-2, 3), 3);
    ck_assert(d.ok && d.num == -8 && d.den == 27);
    mq e = mq_pow(mq_make(2, 1), -2);
    ck_assert(e.ok && e.num == 1 && e.den == 4);
    ck_assert(!mq_mul(mq_int(INT64_MAX / 2), mq_int(3)).ok);  // overflow is flagged, never wrapped
    ck_assert(!mq_add(mq_int(INT64_MAX), mq_int(1)).ok);
    ck_assert(!mq_make(1, 0).ok);
    ck_assert(!mq_inv(mq_int(0)).ok);
}
END_TEST

typedef struct hf_case {
    const char *response, *truth;
    int python; /* math-verify 0.9's score */
} hf_case;

static const hf_case cases[] = {
    {"\\boxed{2+3}", "5", 1},
    {"\\boxed{\\frac{2}{4}}", "\\frac12", 1},
    {"\\boxed{0.3333333}", "\\frac{1}{3}", 1},        // a decimal rounds to 6 places
    {"\\boxed{1.50001}", "\\frac{3}{2}", 0},
    {"\\boxed{1.5000001}", "\\frac{3}{2}", 1},
    {"\\boxed{1.414}", "\\sqrt{2}", 0},
    {"\\boxed{\\sqrt{8}}", "2\\sqrt{2}", 1},
    {"\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", 1},
    {"\\boxed{x^2+2x+1}", "(x+1)^2", 1},              // symbolic: equal at every point
    {"\\boxed{y^2}", "x^{2}", 0},
    {"\\boxed{(1,2)}", "(1,2)", 1},
    {"\\boxed{1,2}", "(1,2)", 1},                     // an open interval against a pair
    {"\\boxed{2,1}", "(1,2)", 0},
    {"\\boxed{2,1}", "1,2", 1},                       // sets are unordered
    {"\\boxed{(3,2,1)}", "(1,2,3)", 0},               // tuples are not
    {"\\boxed{\\{1,2,2\\}}", "\\{1,2\\}", 1},
    {"\\boxed{(3,4) \\cup (1,2)}", "(1,2)\\cup(3,4)", 1},
    {"\\boxed{[-4, \\infty]}", "[-4, \\infty)", 1},   // an infinite end is open
    {"\\boxed{(2,3)}", "(3,2)", 0},                   // (3, 2) is a tuple, not an interval
    {"\\boxed{x=5}", "5", 1},
    {"\\boxed{5}", "x=5", 1},
    {"\\boxed{y=5}", "x=5", 0},
    {"\\boxed{x<3}", "3>x", 1},
    {"\\boxed{x \\le 3}", "(-\\infty,3]", 0},         // a relation against a set only when the prediction is the set
    {"\\boxed{(1,3)}", "1<x<3", 1},
    {"\\boxed{1<x<3}", "(1,3)", 0},
    {"\\boxed{x=1, y=2}", "x=1,y=2", 1},
    {"\\boxed{50\\%}", "\\frac12", 1},
    {"\\boxed{50\\%}", "50", 1},                      // two integers: the percent is dropped
    {"\\boxed{1,000}", "1000", 1},
    {"\\boxed{1{,}000}", "1000", 1},
    {"\\boxed{10^\\circ}", "10", 1},
    {"\\boxed{10 \\text{ cm}}", "10", 1},
    {"\\boxed{\\$5}", "5", 1},
    {"\\boxed{9.42477796}", "3\\pi", 1},
    {"\\boxed{\\pi}", "3.14", 0},
    {"\\boxed{2\\frac{1}{2}}", "\\frac{5}{2}", 1},   // mixed number
    {"\\boxed{2(3)}", "6", 0},                        // ... which latex2sympy also applies to 2(3) = 5
    {"\\boxed{\\dfrac{5}{2}}", "2.5", 1},
    {"\\boxed{1.0}", "1", 1},
    {"\\boxed{007}", "7", 1},
    {"\\boxed{-0.333333}", "-\\frac{1}{3}", 1},
    {"\\boxed{\\text{Monday}}", "\\text{monday}", 1},
    {"\\boxed{\\textbf{(C)}}", "C", 1},
    {"\\boxed{\\text{-85}}", "-85", 1},               // the symbol "-85" prints as the number
    {"\\boxed{\\log_2 8}", "3", 1},
    {"\\boxed{\\log 4}", "\\ln 4", 0},                // \log is base 10
    {"\\boxed{1e3}", "1000", 0},                      // e is Euler's number: 1 * e * 3
    {"\\boxed{2-i}", "2+i", 0},
    {"\\boxed{1 \\pm \\sqrt{2}}", "1+\\sqrt{2},1-\\sqrt{2}", 1},
    {"\\boxed{\\begin{pmatrix}1\\\\2\\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", 1},
    {"\\boxed{\\frac{1}{2}} and \\boxed{3}", "\\frac{1}{2}", 0}, // both boxes: the set {1/2, 3}
    {"\\boxed{3} \\boxed{4}", "4", 0},
    {"\\boxed{5", "5", 0},                            // unclosed: nothing is extracted
    {"\\boxed{}", "5", 0},
    {"the answer is 5", "5", 1},
    {"Answer: 7", "7", 1},
    {"so x = 3 and then 4", "4", 1},                  // no anchor: the last number
    {"The final answer is $\\frac{3}{4}$. I hope it is correct.", "0.75", 1},
    {"The answer is $\\frac{1}{2}$", "0.5", 1},
    {"Answer: $x = 2$", "2", 1},
    {"so we get 3/4", "0.75", 1},
    {"we get 1,234 apples", "1234", 1},
    {"it is 12.5%", "12.5", 1},
    {"The answer is -11/26.", "-\\frac{11}{26}", 0},  // -11/26. divides by the float 26.0
    {"$\\boxed{5}$ and then 6", "5", 1},
};

START_TEST(test_verifier_agrees_with_math_verify)
{
    char err[256];
    math_hf_verifier *v = math_hf_create(err, sizeof err);
    ck_assert_msg(v, "%s", err);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *why = NULL;
        int rc = math_hf_verify(v, cases[i].response, cases[i].truth, &why);
        ck_assert_msg(rc == (cases[i].python ? MATH_HF_CORRECT : MATH_HF_WRONG),
                      "case %zu: response '%s' gold '%s': math-verify says %d, C returned %d (%s)", i,
                      cases[i].response, cases[i].truth, cases[i].python, rc, why ? why : "");
    }
    // the extracted text is the normalised LaTeX of the last box
    char *x = math_hf_extracted(v, "first \\boxed{1} then $\\boxed{\\dfrac{3}{4}}$", 0);
    ck_assert_str_eq(x, "\\frac{3}{4}");
    free(x);
    math_hf_destroy(v);
}
END_TEST

START_TEST(test_pathological_inputs_fail_cleanly)
{
    char err[256];
    math_hf_verifier *v = math_hf_create(err, sizeof err);
    ck_assert_msg(v, "%s", err);
    const char *why = NULL;
    // over the response cap
    size_t big = MATH_HF_MAX_RESPONSE + 10;
    char *s = malloc(big + 1);
    memset(s, '1', big);
    s[big] = '\0';
    ck_assert_int_eq(math_hf_verify(v, s, "1", &why), MATH_HF_FAILED);
    ck_assert_ptr_nonnull(strstr(why, "256 KiB"));
    // deep nesting: the parser's depth limit refuses it (nothing parses, the string fallback differs)
    size_t depth = 5000;
    char *deep = malloc(2 * depth + 16);
    size_t k = 0;
    k += (size_t)sprintf(deep, "\\boxed{");
    for (size_t i = 0; i < depth; i++)
        deep[k++] = '(';
    deep[k++] = '1';
    for (size_t i = 0; i < depth; i++)
        deep[k++] = ')';
    deep[k++] = '}';
    deep[k] = '\0';
    int rc = math_hf_verify(v, deep, "1", &why);
    ck_assert(rc == MATH_HF_WRONG || rc == MATH_HF_FAILED);
    // a long response of dollar signs and digits: bounded, ends with a verdict or a budget failure
    size_t n = 200000;
    for (size_t i = 0; i < n; i++)
        s[i] = "$1 $$\\[("[i % 8];
    s[n] = '\0';
    rc = math_hf_verify(v, s, "1", &why);
    ck_assert(rc == MATH_HF_WRONG || rc == MATH_HF_CORRECT || rc == MATH_HF_FAILED);
    // a ground truth that yields nothing is a verifier failure, not a silent wrong
    ck_assert_int_eq(math_hf_verify(v, "\\boxed{1}", "", &why), MATH_HF_FAILED);
    // and the verifier still works afterwards
    ck_assert_int_eq(math_hf_verify(v, "\\boxed{\\frac{1}{2}}", "0.5", &why), MATH_HF_CORRECT);
    free(deep);
    free(s);
    math_hf_destroy(v);
}
END_TEST

static Suite *hf_suite(void)
{
    Suite *s = suite_create("math_hf_verify");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_regex_semantics);
    tcase_add_test(tc, test_regex_budget);
    tcase_add_test(tc, test_rationals);
    tcase_add_test(tc, test_verifier_agrees_with_math_verify);
    tcase_add_test(tc, test_pathological_inputs_fail_cleanly);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(hf_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
