/* math_latex_parse.h: LaTeX (already normalised as math-verify normalises it) and plain-text math into the answer
 * shapes of math_expr.h, reading what latex2sympy2_extended reads for contest answers: numbers (leading zeros,
 * decimals, 1,234 thousands), \frac \dfrac \tfrac, mixed numbers (2\frac{1}{2}), \sqrt and \sqrt[n], powers,
 * factorials, \binom, \pi, e, \infty (i is a symbol, as latex2sympy reads it), implicit products, trigonometric and
 * logarithmic functions, |x|, floor and ceiling, \text{...} words, percentages, degrees (dropped), sets \{...\},
 * intervals (a, b] and unions, tuples, a \pm b, relations and chains (a < x < b), x \in S, pmatrix / bmatrix. */
#ifndef DSARL_MATH_LATEX_PARSE_H
#define DSARL_MATH_LATEX_PARSE_H

#include "math_expr.h"

/* Deepest nesting of groups the parser follows before it gives up on an answer. */
#define MLP_MAX_DEPTH 64

/* Parses latex into ar (which the caller reset). Returns a value index, or -1 when latex2sympy would refuse it
 * (or a budget ran out: ar->overflow). Tries the last '='-part of an equation chain as math-verify does. */
int mlp_parse_latex(mx_arena *ar, const char *latex);

/* Parses a plain expression of digits, '.', + - * / ^ ** and parentheses (what math-verify's expression regex
 * extracts and sympy's parse_expr reads). Returns an expression node or -1. */
int mlp_parse_plain(mx_arena *ar, const char *text);

#endif /* DSARL_MATH_LATEX_PARSE_H */
