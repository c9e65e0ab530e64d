/* math_expr.c: checked rationals, the answer arena and numeric evaluation (math_expr.h). */
#include "math_expr.h"

#include <math.h>
#include <string.h>

/* ---- rationals in checked int64 ----------------------------------------------------------------------------- */

static int64_t gcd64(int64_t a, int64_t b)
{
    if (a < 0)
        a = -a;
    if (b < 0)
        b = -b;
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static const mq MQ_BAD = {0, 1, 0};

mq mq_make(int64_t num, int64_t den)
{
    if (den == 0 || num == INT64_MIN || den == INT64_MIN)
        return MQ_BAD;
    if (den < 0)
        num = -num, den = -den;
    int64_t g = gcd64(num, den);
    if (g > 1)
        num /= g, den /= g;
    return (mq){num, den, 1};
}

mq mq_int(int64_t v) { return mq_make(v, 1); }

mq mq_add(mq a, mq b)
{
    int64_t x, y, d;
    if (!a.ok || !b.ok || __builtin_mul_overflow(a.num, b.den, &x) || __builtin_mul_overflow(b.num, a.den, &y) ||
        __builtin_add_overflow(x, y, &x) || __builtin_mul_overflow(a.den, b.den, &d))
        return MQ_BAD;
    return mq_make(x, d);
}

mq mq_mul(mq a, mq b)
{
    int64_t n, d;
    if (!a.ok || !b.ok)
        return MQ_BAD;
    int64_t g1 = gcd64(a.num, b.den), g2 = gcd64(b.num, a.den);
    if (g1 == 0)
        g1 = 1;
    if (g2 == 0)
        g2 = 1;
    if (__builtin_mul_overflow(a.num / g1, b.num / g2, &n) || __builtin_mul_overflow(a.den / g2, b.den / g1, &d))
        return MQ_BAD;
    return mq_make(n, d);
}

mq mq_neg(mq a) { return a.ok ? mq_make(-a.num, a.den) : MQ_BAD; }

mq mq_inv(mq a) { return a.ok && a.num != 0 ? mq_make(a.den, a.num) : MQ_BAD; }

mq mq_pow(mq a, int64_t e)
{
    if (!a.ok)
        return MQ_BAD;
    if (e < 0) {
        if (e < -64)
            return MQ_BAD;
        return mq_inv(mq_pow(a, -e));
    }
    if (e > 200 && !(a.den == 1 && (a.num == 0 || a.num == 1 || a.num == -1)))
        return MQ_BAD;
    mq r = mq_int(1);
    for (int64_t k = 0; k < e && r.ok; k++)
        r = mq_mul(r, a);
    return r;
}

double mq_double(mq a) { return a.ok ? (double)a.num / (double)a.den : NAN; }

/* ---- arena ---------------------------------------------------------------------------------------------------- */

void mx_reset(mx_arena *ar)
{
    ar->nnodes = ar->nvals = ar->nitems = ar->nsyms = 0;
    ar->overflow = 0;
}

static int new_node(mx_arena *ar, mx_kind kind)
{
    if (ar->nnodes >= MX_MAX_NODES) {
        ar->overflow = 1;
        return -1;
    }
    mx_node *n = &ar->nodes[ar->nnodes];
    memset(n, 0, sizeof *n);
    n->kind = (uint8_t)kind;
    n->a = n->b = n->sym = -1;
    return ar->nnodes++;
}

int mx_num_q(mx_arena *ar, mq q, int is_float, double f)
{
    int k = new_node(ar, MX_NUM);
    if (k < 0)
        return -1;
    ar->nodes[k].q = q;
    ar->nodes[k].is_float = (uint8_t)is_float;
    ar->nodes[k].f = q.ok ? mq_double(q) : f;
    return k;
}

int mx_num_int(mx_arena *ar, int64_t v) { return mx_num_q(ar, mq_int(v), 0, (double)v); }

int mx_sym(mx_arena *ar, const char *name)
{
    char low[MX_SYMBOL_CHARS];
    size_t n = strlen(name);
    if (n >= sizeof low) {
        ar->overflow = 1;
        return -1;
    }
    for (size_t i = 0; i <= n; i++)
        low[i] = (char)(name[i] >= 'A' && name[i] <= 'Z' ? name[i] + 32 : name[i]);
    int s = -1;
    for (int i = 0; i < ar->nsyms; i++)
        if (strcmp(ar->syms[i], low) == 0)
            s = i;
    if (s < 0) {
        if (ar->nsyms >= MX_MAX_SYMBOLS) {
            ar->overflow = 1;
            return -1;
        }
        s = ar->nsyms++;
        memcpy(ar->syms[s], low, n + 1);
    }
    int k = new_node(ar, MX_SYM);
    if (k >= 0)
        ar->nodes[k].sym = s;
    return k;
}

int mx_leaf(mx_arena *ar, mx_kind kind) { return new_node(ar, kind); }

int mx_bin(mx_arena *ar, mx_kind kind, int a, int b)
{
    if (a < 0 || b < 0)
        return -1;
    int k = new_node(ar, kind);
    if (k >= 0) {
        ar->nodes[k].a = a;
        ar->nodes[k].b = b;
    }
    return k;
}

int mx_neg(mx_arena *ar, int a)
{
    if (a < 0)
        return -1;
    mx_node *n = &ar->nodes[a];
    if (n->kind == MX_NUM) {
        int k = mx_num_q(ar, mq_neg(n->q), n->is_float, -n->f);
        return k;
    }
    return mx_bin(ar, MX_MUL, mx_num_int(ar, -1), a);
}

int mx_div(mx_arena *ar, int a, int b)
{
    if (a < 0 || b < 0)
        return -1;
    return mx_bin(ar, MX_MUL, a, mx_bin(ar, MX_POW, b, mx_num_int(ar, -1)));
}

int mx_call(mx_arena *ar, mx_func f, int a, int b)
{
    if (a < 0)
        return -1;
    int k = new_node(ar, MX_FUNC);
    if (k >= 0) {
        ar->nodes[k].func = (uint8_t)f;
        ar->nodes[k].a = a;
        ar->nodes[k].b = b;
    }
    return k;
}

int mv_new(mx_arena *ar, mv_kind kind)
{
    if (ar->nvals >= MX_MAX_VALUES) {
        ar->overflow = 1;
        return -1;
    }
    mv *v = &ar->vals[ar->nvals];
    memset(v, 0, sizeof *v);
    v->kind = (uint8_t)kind;
    v->expr = v->lo = v->hi = v->lhs = v->rhs = -1;
    return ar->nvals++;
}

int mv_expr(mx_arena *ar, int expr)
{
    if (expr < 0)
        return -1;
    int v = mv_new(ar, MV_EXPR);
    if (v >= 0)
        ar->vals[v].expr = expr;
    return v;
}

int mv_push_item(mx_arena *ar, int item)
{
    if (item < 0)
        return -1;
    if (ar->nitems >= MX_MAX_NODES) {
        ar->overflow = 1;
        return -1;
    }
    ar->items[ar->nitems] = item;
    return ar->nitems++;
}

/* ---- predicates ----------------------------------------------------------------------------------------------- */

int mx_is_atomic_number(const mx_arena *ar, int node)
{
    const mx_node *n = &ar->nodes[node];
    if (n->kind == MX_PCT)
        n = &ar->nodes[n->a];
    return n->kind == MX_NUM;
}

int mx_is_atomic_float(const mx_arena *ar, int node)
{
    const mx_node *n = &ar->nodes[node];
    if (n->kind == MX_PCT)
        n = &ar->nodes[n->a];
    return n->kind == MX_NUM && n->is_float;
}

int mx_is_atomic_integer(const mx_arena *ar, int node)
{
    const mx_node *n = &ar->nodes[node];
    if (n->kind == MX_PCT)
        n = &ar->nodes[n->a];
    return n->kind == MX_NUM && !n->is_float && (!n->q.ok || n->q.den == 1) && n->f == floor(n->f);
}

int mx_has_floats(const mx_arena *ar, int node)
{
    if (node < 0)
        return 0;
    const mx_node *n = &ar->nodes[node];
    if (n->kind == MX_NUM)
        return n->is_float || !n->q.ok;
    return mx_has_floats(ar, n->a) || mx_has_floats(ar, n->b);
}

int mx_has_symbols(const mx_arena *ar, int node)
{
    if (node < 0)
        return 0;
    const mx_node *n = &ar->nodes[node];
    if (n->kind == MX_SYM)
        return 1;
    return mx_has_symbols(ar, n->a) || mx_has_symbols(ar, n->b);
}

mq mx_exact(const mx_arena *ar, int node, int pct_as_fraction)
{
    const mx_node *n = &ar->nodes[node];
    switch (n->kind) {
    case MX_NUM: return n->is_float ? MQ_BAD : n->q;
    case MX_ADD: return mq_add(mx_exact(ar, n->a, pct_as_fraction), mx_exact(ar, n->b, pct_as_fraction));
    case MX_MUL: return mq_mul(mx_exact(ar, n->a, pct_as_fraction), mx_exact(ar, n->b, pct_as_fraction));
    case MX_PCT: {
        mq a = mx_exact(ar, n->a, pct_as_fraction);
        return pct_as_fraction ? mq_mul(a, mq_make(1, 100)) : a;
    }
    case MX_POW: {
        mq e = mx_exact(ar, n->b, pct_as_fraction);
        if (!e.ok || e.den != 1)
            return MQ_BAD;
        return mq_pow(mx_exact(ar, n->a, pct_as_fraction), e.num);
    }
    case MX_FUNC:
        if (n->func == MF_FACT) {
            mq a = mx_exact(ar, n->a, pct_as_fraction);
            if (!a.ok || a.den != 1 || a.num < 0 || a.num > 20)
                return MQ_BAD;
            int64_t r = 1;
            for (int64_t k = 2; k <= a.num; k++)
                r *= k;
            return mq_int(r);
        }
        if (n->func == MF_ABS) {
            mq a = mx_exact(ar, n->a, pct_as_fraction);
            return a.ok && a.num < 0 ? mq_neg(a) : a;
        }
        return MQ_BAD;
    default: return MQ_BAD;
    }
}

/* ---- evaluation ----------------------------------------------------------------------------------------------- */

static double sym_value(const char *name, int point)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)(point + 1) * 0x9E3779B97F4A7C15ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    /* symbols are real in math-verify (sympy real=True), not positive: odd points take negative values, so
     * sqrt(x^2) is not x and log(x) + log(y) is not log(xy), as simplify() would not prove them */
    double v = 0.3 + 2.4 * (double)(h >> 11) / 9007199254740992.0;
    return point % 2 ? -v : v;
}

double complex mx_eval(const mx_arena *ar, int node, int point)
{
    const mx_node *n = &ar->nodes[node];
    switch (n->kind) {
    case MX_NUM: return n->f;
    case MX_SYM: return sym_value(ar->syms[n->sym], point);
    case MX_PI: return 3.14159265358979323846;
    case MX_E: return 2.71828182845904523536;
    case MX_INF: return INFINITY;
    case MX_ADD:
    case MX_MUL: {
        /* real operands stay real: complex arithmetic would turn -1 * inf into a NaN imaginary part */
        double complex a = mx_eval(ar, n->a, point), b = mx_eval(ar, n->b, point);
        if (cimag(a) == 0 && cimag(b) == 0)
            return n->kind == MX_ADD ? creal(a) + creal(b) : creal(a) * creal(b);
        return n->kind == MX_ADD ? a + b : a * b;
    }
    case MX_PCT: return mx_eval(ar, n->a, point) / 100.0;
    case MX_POW: {
        double complex a = mx_eval(ar, n->a, point), b = mx_eval(ar, n->b, point);
        if (cimag(a) == 0 && cimag(b) == 0) {
            double x = creal(a), y = creal(b);
            if (x >= 0 || y == floor(y))
                return pow(x, y);
            /* a real odd root of a negative number, as sympy's real cube root is not: principal value */
        }
        if (creal(a) == 0 && cimag(a) == 0)
            return creal(b) > 0 ? 0 : NAN;
        return cpow(a, b);
    }
    case MX_FUNC: {
        double complex a = mx_eval(ar, n->a, point);
        switch ((int)n->func) {
        case MF_SIN: return csin(a);
        case MF_COS: return ccos(a);
        case MF_TAN: return ctan(a);
        case MF_COT: return 1.0 / ctan(a);
        case MF_SEC: return 1.0 / ccos(a);
        case MF_CSC: return 1.0 / csin(a);
        case MF_ASIN: return casin(a);
        case MF_ACOS: return cacos(a);
        case MF_ATAN: return catan(a);
        case MF_SINH: return csinh(a);
        case MF_COSH: return ccosh(a);
        case MF_TANH: return ctanh(a);
        case MF_EXP: return cexp(a);
        case MF_ABS: return cabs(a);
        case MF_FLOOR: return floor(creal(a));
        case MF_CEIL: return ceil(creal(a));
        case MF_LOG: {
            double complex l = clog(a);
            if (n->b >= 0)
                l /= clog(mx_eval(ar, n->b, point));
            return l;
        }
        case MF_FACT: return tgamma(creal(a) + 1);
        case MF_BINOM: {
            double x = creal(a), y = creal(mx_eval(ar, n->b, point));
            return tgamma(x + 1) / (tgamma(y + 1) * tgamma(x - y + 1));
        }
        }
        return NAN;
    }
    }
    return NAN;
}
