/* calculator_eval.h: the calculator tool's expression evaluator (internal to the calculator environment). */
#ifndef DSARL_CALCULATOR_EVAL_H
#define DSARL_CALCULATOR_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "dsarl/ops/environment.h"

/* Longest expression the tool evaluates, in bytes, and the deepest parenthesis nesting. */
#define CALCULATOR_MAX_EXPRESSION 256
#define CALCULATOR_MAX_DEPTH 32

/* Evaluates an integer expression of decimal literals, + - * / (exact division only), unary minus and
 * parentheses, with the usual precedence, in 64-bit arithmetic. Returns 0 and *value, or -1 with why (one phrase:
 * "division by zero", "overflow", "unexpected 'x'", ...). Never runs anything: it is a parser over the text only. */
int calculator_eval(const char *expr, size_t len, int64_t *value, const char **why);

/* Parses the last "Answer: <integer>" of text into *value; 0 when found, -1 otherwise. */
int calculator_last_answer(const char *text, int64_t *value);

extern const dsarl_environment_ops calculator_environment_ops;

#endif /* DSARL_CALCULATOR_EVAL_H */
