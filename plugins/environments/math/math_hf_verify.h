/* math_hf_verify.h: math_verify_impl: hf_math_verify, NeMo RL's default reward, without Python. NeMo RL wraps the
 * ground truth as \boxed{GT} and calls Hugging Face math-verify with LaTeX extraction for the gold and expression
 * then LaTeX extraction for the response. This reproduces that pipeline:
 *   1. extraction: math-verify's regexes, by priority group (0: "final answer is X. I hope", 50: "final answer ... is
 *      X", $\boxed{X}$-style environments and the last \boxed{...}, 100: "answer: X", 200: "answer ... X", 300: any
 *      $...$, \[...\], \(...\) or plain number / expression); within a group the match ending last is tried
 *      first; the first that parses wins, and the first match's normalised text is kept as a string fallback;
 *   2. normalisation of LaTeX as latex2sympy2_extended's normalize_latex does it (\left/\right, \dfrac, units,
 *      \text{...} words, percent words, \frac12, a/b, ...);
 *   3. parsing (math_latex_parse.h) and comparison (math_hf_compare.h); strings fall back to exact equality.
 * Time and memory are bounded: the response is capped at MATH_HF_MAX_RESPONSE bytes, each answer at a regex step
 * budget and the arena's node budget; past any of them the verdict is a verifier failure, never a hang. */
#ifndef DSARL_MATH_HF_VERIFY_H
#define DSARL_MATH_HF_VERIFY_H

#include <stddef.h>

/* Longest response (bytes) hf_math_verify reads; longer is a verifier failure. */
#define MATH_HF_MAX_RESPONSE (256 * 1024)

/* Regex steps one verification may spend (extraction and normalisation together). */
#define MATH_HF_STEP_BUDGET 40000000L

typedef struct math_hf_verifier math_hf_verifier;

/* The compiled patterns and two answer arenas; NULL when out of memory (err gets a sentence). */
math_hf_verifier *math_hf_create(char *err, size_t errlen);
void math_hf_destroy(math_hf_verifier *v);

enum { MATH_HF_WRONG = 0, MATH_HF_CORRECT = 1, MATH_HF_FAILED = -1 };

/* Judges response against ground_truth as NeMo RL's hf_math_verify does. MATH_HF_FAILED (with *why, static) when
 * the ground truth yields nothing or a budget ran out; math-verify scores both 0. */
int math_hf_verify(math_hf_verifier *v, const char *response, const char *ground_truth, const char **why);

/* The normalised text of the answer math-verify would extract from text (gold = 1: as a ground truth), for
 * tests and diagnostics; malloc'd, NULL when nothing is extracted. */
char *math_hf_extracted(math_hf_verifier *v, const char *text, int gold);

#endif /* DSARL_MATH_HF_VERIFY_H */
