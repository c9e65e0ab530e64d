/* math_hf_compare.h: math-verify's equivalence of a gold answer and a predicted one (its grader's sympy_expr_eq),
 * on the parsed shapes of math_expr.h: assignments unwrapped (x = 5 against 5), relations compared as lhs - rhs
 * (also flipped: x < 3 is 3 > x), sets order-free, tuples in order, intervals by ends and openness, an open
 * interval against a pair, a scalar against a one-element set, symbols by name, then numbers: a decimal against
 * anything rounds both to 6 places (1/3 = 0.333333), two integers compare exactly (9% = 9), other constants must
 * be equal (exact rationals, or doubles within 1e-12), and expressions with symbols must agree at several
 * pseudo-random points (relative 1e-9), which stands in for sympy's simplify(a - b) == 0. */
#ifndef DSARL_MATH_HF_COMPARE_H
#define DSARL_MATH_HF_COMPARE_H

#include "math_expr.h"

/* 1 when the predicted value pv (in arena p) matches the gold value gv (in arena g). Not symmetric, as
 * math-verify's verify is not: the gold's shape decides how an assignment or equation is unwrapped. */
int mhf_values_equal(const mx_arena *g, int gv, const mx_arena *p, int pv);

#endif /* DSARL_MATH_HF_COMPARE_H */
