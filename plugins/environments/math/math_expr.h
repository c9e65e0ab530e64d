/* math_expr.h: the parsed form of one math answer for hf_math_verify: an expression tree (numbers as exact
 * rationals in checked int64 with a double fallback, symbols, pi, e, infinity, +, *, ^, functions) and, above it,
 * the answer's shape (a plain expression, a finite set, a tuple, an interval, a union, a relation, a chain of
 * relations, a matrix). Everything lives in one arena with a node budget, so a pathological answer fails
 * cleanly instead of growing without bound. */
#ifndef DSARL_MATH_EXPR_H
#define DSARL_MATH_EXPR_H

#include <complex.h>
#include <stdint.h>

/* Most expression nodes, values and symbols one answer may build. */
#define MX_MAX_NODES 4096
#define MX_MAX_VALUES 512
#define MX_MAX_SYMBOLS 32
#define MX_SYMBOL_CHARS 48

/* An exact rational num/den (den > 0, lowest terms); ok = 0 once an operation overflowed int64. */
typedef struct mq {
    int64_t num, den;
    int ok;
} mq;

mq mq_int(int64_t v);
mq mq_make(int64_t num, int64_t den); /* normalised; ok = 0 when den == 0 */
mq mq_add(mq a, mq b);
mq mq_mul(mq a, mq b);
mq mq_neg(mq a);
mq mq_inv(mq a);                     /* ok = 0 for 0 */
mq mq_pow(mq a, int64_t e);          /* ok = 0 on overflow or 0^negative */
double mq_double(mq a);

typedef enum mx_kind {
    MX_NUM,  /* q when q.ok, else f; is_float: written with a decimal point (sympy Float) */
    MX_SYM,  /* symbol sym (lower-cased name); is_float set: an applied function f(2), not only symbols */
    MX_PI,
    MX_E,
    MX_INF,  /* +infinity */
    MX_ADD,  /* a + b */
    MX_MUL,  /* a * b */
    MX_POW,  /* a ^ b */
    MX_FUNC, /* func(a), for MF_LOG base b (b < 0: natural) */
    MX_PCT,  /* a percent: a * (1/100), kept apart so that 9% equals 9 as math-verify's integer rule has it */
} mx_kind;

typedef enum mx_func {
    MF_SIN, MF_COS, MF_TAN, MF_COT, MF_SEC, MF_CSC, MF_ASIN, MF_ACOS, MF_ATAN, MF_SINH, MF_COSH, MF_TANH,
    MF_LOG, MF_EXP, MF_ABS, MF_FLOOR, MF_CEIL, MF_FACT, MF_BINOM,
} mx_func;

typedef struct mx_node {
    uint8_t kind, func, is_float;
    int a, b, sym;
    mq q;
    double f;
} mx_node;

typedef enum mv_kind {
    MV_EXPR,     /* expr */
    MV_SET,      /* finite set of items (values), in written order */
    MV_TUPLE,    /* ordered items */
    MV_INTERVAL, /* lo, hi exprs; lopen, ropen */
    MV_UNION,    /* items: sets or intervals */
    MV_REL,      /* lhs rel rhs (values) */
    MV_AND,      /* items: relations (a chain a < x < b) */
    MV_MATRIX,   /* rows x cols exprs in items */
    MV_EMPTYSET,
    MV_NAMEDSET, /* \mathbb{R} and friends: expr holds which letter */
} mv_kind;

typedef enum mv_rel { MR_EQ, MR_LT, MR_LE, MR_GT, MR_GE, MR_NE } mv_rel;

typedef struct mv {
    uint8_t kind, rel, lopen, ropen;
    int expr, lo, hi, lhs, rhs; /* expr nodes (expr, lo, hi) or values (lhs, rhs) */
    int first, n;               /* items[first .. first+n) */
    int rows, cols;
} mv;

typedef struct mx_arena {
    mx_node nodes[MX_MAX_NODES];
    int nnodes;
    mv vals[MX_MAX_VALUES];
    int nvals;
    int items[MX_MAX_NODES];
    int nitems;
    char syms[MX_MAX_SYMBOLS][MX_SYMBOL_CHARS];
    int nsyms;
    int overflow; /* a budget was exceeded: the answer is rejected */
} mx_arena;

void mx_reset(mx_arena *ar);
int mx_num_q(mx_arena *ar, mq q, int is_float, double f); /* -1 when out of nodes (also sets overflow) */
int mx_num_int(mx_arena *ar, int64_t v);
int mx_sym(mx_arena *ar, const char *name);
int mx_leaf(mx_arena *ar, mx_kind kind);
int mx_bin(mx_arena *ar, mx_kind kind, int a, int b);
int mx_neg(mx_arena *ar, int a);   /* numbers fold (-5 stays one number), otherwise (-1) * a */
int mx_div(mx_arena *ar, int a, int b);
int mx_call(mx_arena *ar, mx_func f, int a, int b);
int mv_new(mx_arena *ar, mv_kind kind);
int mv_expr(mx_arena *ar, int expr);
int mv_push_item(mx_arena *ar, int item); /* appends to the items pool; returns its index or -1 */

/* 1 when node is one literal number (or a percent of one): sympy's "atomic Number" test. */
int mx_is_atomic_number(const mx_arena *ar, int node);
/* 1 when that literal was written with a decimal point (sympy Float). */
int mx_is_atomic_float(const mx_arena *ar, int node);
/* 1 when it is an integer literal (or a percent of one). */
int mx_is_atomic_integer(const mx_arena *ar, int node);
/* 1 when the tree contains a decimal (or an inexact) number: sympy then computes in floating point. */
int mx_has_floats(const mx_arena *ar, int node);
/* 1 when the tree contains a symbol. */
int mx_has_symbols(const mx_arena *ar, int node);

/* Exact value of a symbol-free tree of numbers, +, *, integer powers and percents; ok = 0 when not exact. */
mq mx_exact(const mx_arena *ar, int node, int pct_as_fraction);

/* Numeric value with every symbol set from its name and point (a deterministic pseudo-random real with
 * 0.3 <= |value| <= 2.7, negative at odd points); NaN parts for undefined. */
double complex mx_eval(const mx_arena *ar, int node, int point);

#endif /* DSARL_MATH_EXPR_H */
