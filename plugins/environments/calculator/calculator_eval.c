/* calculator_eval.c: a recursive-descent evaluator for the calculator tool. The expression is the model's text, so
 * everything is bounded: its length, the nesting depth, and every operation is checked for 64-bit overflow. */
#include "calculator_eval.h"

#include <ctype.h>
#include <stdbool.h>
#include <string.h>

typedef struct parser {
    const char *at, *end;
    int depth;
    const char *why;
} parser;

static void skip_space(parser *p)
{
    while (p->at < p->end && (*p->at == ' ' || *p->at == '\t' || *p->at == '\n'))
        p->at++;
}

static bool fail(parser *p, const char *why)
{
    if (!p->why)
        p->why = why;
    return false;
}

static bool parse_sum(parser *p, int64_t *out);

// primary := integer | '(' sum ')' | '-' primary
static bool parse_primary(parser *p, int64_t *out)
{
    skip_space(p);
    if (p->at >= p->end)
        return fail(p, "unexpected end of expression");
    if (*p->at == '-') {
        p->at++;
        int64_t v;
        if (!parse_primary(p, &v))
            return false;
        if (v == INT64_MIN)
            return fail(p, "overflow");
        *out = -v;
        return true;
    }
    if (*p->at == '(') {
        if (++p->depth > CALCULATOR_MAX_DEPTH)
            return fail(p, "nested too deeply");
        p->at++;
        if (!parse_sum(p, out))
            return false;
        skip_space(p);
        if (p->at >= p->end || *p->at != ')')
            return fail(p, "missing ')'");
        p->at++;
        p->depth--;
        return true;
    }
    if (!isdigit((unsigned char)*p->at))
        return fail(p, "expected a number");
    int64_t v = 0;
    while (p->at < p->end && isdigit((unsigned char)*p->at)) {
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, *p->at - '0', &v))
            return fail(p, "overflow");
        p->at++;
    }
    *out = v;
    return true;
}

// product := primary (('*' | '/') primary)*
static bool parse_product(parser *p, int64_t *out)
{
    if (!parse_primary(p, out))
        return false;
    for (;;) {
        skip_space(p);
        if (p->at >= p->end || (*p->at != '*' && *p->at != '/'))
            return true;
        char op = *p->at++;
        int64_t rhs;
        if (!parse_primary(p, &rhs))
            return false;
        if (op == '*') {
            if (__builtin_mul_overflow(*out, rhs, out))
                return fail(p, "overflow");
        } else {
            if (rhs == 0)
                return fail(p, "division by zero");
            if (*out == INT64_MIN && rhs == -1)
                return fail(p, "overflow");
            if (*out % rhs != 0)
                return fail(p, "inexact division");
            *out /= rhs;
        }
    }
}

// sum := product (('+' | '-') product)*
static bool parse_sum(parser *p, int64_t *out)
{
    if (!parse_product(p, out))
        return false;
    for (;;) {
        skip_space(p);
        if (p->at >= p->end || (*p->at != '+' && *p->at != '-'))
            return true;
        char op = *p->at++;
        int64_t rhs;
        if (!parse_product(p, &rhs))
            return false;
        if (op == '+' ? __builtin_add_overflow(*out, rhs, out) : __builtin_sub_overflow(*out, rhs, out))
            return fail(p, "overflow");
    }
}

int calculator_eval(const char *expr, size_t len, int64_t *value, const char **why)
{
    *why = NULL;
    if (len > CALCULATOR_MAX_EXPRESSION) {
        *why = "expression too long";
        return -1;
    }
    parser p = {.at = expr, .end = expr + len};
    int64_t v;
    if (!parse_sum(&p, &v)) {
        *why = p.why;
        return -1;
    }
    skip_space(&p);
    if (p.at != p.end) {
        *why = "unexpected character";
        return -1;
    }
    *value = v;
    return 0;
}

int calculator_last_answer(const char *text, int64_t *value)
{
    const char *last = NULL;
    for (const char *at = strstr(text, "Answer:"); at; at = strstr(at + 1, "Answer:"))
        last = at;
    if (!last)
        return -1;
    const char *at = last + strlen("Answer:");
    while (*at == ' ')
        at++;
    const char *start = at;
    if (*at == '-')
        at++;
    while (isdigit((unsigned char)*at))
        at++;
    const char *why;
    return at > start && calculator_eval(start, (size_t)(at - start), value, &why) == 0 ? 0 : -1;
}
