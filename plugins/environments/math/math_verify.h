/* math_verify.h: the answer checkers behind the "math" environment, as plain functions the tests call directly.
 *
 * dapo_math_verify follows NeMo RL's nemo_rl/environments/dapo_math_verifier.py (verl's math_dapo.py, itself
 * lm-eval's Minerva checker) step for step:
 *   1. keep only the last 300 characters (Unicode code points) of the response;
 *   2. take the capture of the LAST non-overlapping match of (?i)Answer\s*:\s*([^\n]+) in that tail (no match:
 *      the response is WRONG, as NeMo's "[INVALID]" prediction never equals a real answer);
 *   3. normalise it and the ground truth with normalize_final_answer (math_normalize_final_answer below);
 *   4. CORRECT iff the two normalised strings are byte-for-byte equal. No numeric equivalence: "0.5" != "1/2",
 *      "\frac{1}{2}" != "1/2", "+3" != "3", "007" != "7", exactly as in NeMo RL.
 * boxed (a dsarl extension, a math_verify-free stand-in for hf_math_verify's \boxed{} reading): the content of the
 * last \boxed{...} (braces balanced) in the same 300-character tail, normalised the same way; CORRECT when the
 * strings are equal OR both read as the same rational number: [+|-] digits[.digits], [+|-]a/b, or
 * [+|-]\frac{a}{b} (also \dfrac, \tfrac) with integer a, b, b != 0, at most 18 digits each.
 * Differences from Python, all outside ASCII: \s and strip() know ASCII whitespace, \x1c-\x1f and the Unicode
 * White_Space set; (?i) folds ASCII only; isdigit() accepts ASCII digits only. Invalid UTF-8 bytes count as one
 * code point each. */
#ifndef DSARL_MATH_VERIFY_H
#define DSARL_MATH_VERIFY_H

#include <stddef.h>
#include <stdint.h>
#include "dsarl/ops/environment.h"

/* How many trailing code points of a response the checkers read (verl: the longest MATH-500 answer is 159). */
#define MATH_VERIFY_TAIL_CHARS 300

/* A ground truth longer than this many bytes is a verifier failure (a data bug, not an answer). */
#define MATH_VERIFY_MAX_GROUND_TRUTH 1024

typedef enum math_verify_mode {
    MATH_VERIFY_DAPO = 0,  /* math_verify_impl: dapo_math_verify */
    MATH_VERIFY_BOXED = 1, /* math_verify_impl: boxed */
    MATH_VERIFY_HF = 2,    /* math_verify_impl: hf_math_verify (math_hf_verify.h; not handled by math_verify_one) */
} math_verify_mode;

/* normalize_final_answer of NeMo RL / verl / lm-eval: a new malloc'd string, or NULL when out of memory. */
char *math_normalize_final_answer(const char *answer);

/* The capture of the last "Answer:" line in the response's tail (malloc'd), or NULL when there is none.
 * *oom is set to 1 when NULL means out of memory. */
char *math_extract_answer_line(const char *response, int *oom);

/* The content of the last balanced \boxed{...} in text (malloc'd), or NULL when there is none or its braces do
 * not close. *oom is set to 1 when NULL means out of memory. */
char *math_extract_last_boxed(const char *text, int *oom);

/* 1 when a and b (already normalised) both read as the same rational number, else 0. */
int math_same_number(const char *a, const char *b);

/* Judges one response. On DSARL_VERDICT_VERIFIER_FAILED, *why (if not NULL) gets a static reason. Returns 0, or
 * DSARL_E_NOMEM with err filled. */
int math_verify_one(math_verify_mode mode, const char *response, const char *ground_truth, dsarl_verdict *verdict,
                    const char **why, dsarl_error *err);

/* The environment's ops table ("math"), registered by the plugin's init. */
extern const dsarl_environment_ops math_environment_ops;

/* How many verifier failures this environment has counted since it was created (also visible per response as
 * DSARL_VERDICT_VERIFIER_FAILED in the verdict array). */
uint64_t math_environment_failures(const dsarl_environment *env);

#endif /* DSARL_MATH_VERIFY_H */
