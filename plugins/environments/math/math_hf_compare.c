/* math_hf_compare.c: the rules of math_hf_compare.h, in the order math-verify's grader applies them. */
#include "math_hf_compare.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An operand of a comparison: one expression node, or a difference a - b of two (relations compare lhs - rhs). */
typedef struct side {
    const mx_arena *ar;
    int a, b; /* b < 0: just a */
} side;

#define NPOINTS 4

static double complex side_eval(side s, int point)
{
    double complex v = mx_eval(s.ar, s.a, point);
    if (s.b >= 0)
        v -= mx_eval(s.ar, s.b, point);
    return v;
}

static int side_has_symbols(side s) { return mx_has_symbols(s.ar, s.a) || (s.b >= 0 && mx_has_symbols(s.ar, s.b)); }

static int close_tight(double complex x, double complex y)
{
    if (isinf(creal(x)) || isinf(creal(y)))
        return creal(x) == creal(y) && cimag(x) == cimag(y);
    if (isnan(creal(x)) || isnan(creal(y)) || isnan(cimag(x)) || isnan(cimag(y)))
        return 0;
    double scale = fmax(1.0, fmax(cabs(x), cabs(y)));
    return cabs(x - y) <= 1e-12 * scale;
}

/* round(x, 6) == round(y, 6) on the real parts (sympy's Float.round); complex values must match exactly. */
static int round6_equal(double complex x, double complex y)
{
    if (!isfinite(creal(x)) || !isfinite(creal(y)))
        return creal(x) == creal(y);
    if (fabs(cimag(x) - cimag(y)) > 1e-6)
        return 0;
    double a = creal(x), b = creal(y);
    if (fabs(a) < 1e12 && fabs(b) < 1e12)
        return nearbyint(a * 1e6) == nearbyint(b * 1e6);
    return fabs(a - b) <= 1e-15 * fmax(fabs(a), fabs(b));
}

/* Expressions with symbols: equal at every point where both are defined, and defined somewhere. */
static int symbolic_equal(side g, side p)
{
    int defined = 0;
    for (int k = 0; k < NPOINTS; k++) {
        double complex x = side_eval(g, k), y = side_eval(p, k);
        int fx = isfinite(creal(x)) && isfinite(cimag(x)), fy = isfinite(creal(y)) && isfinite(cimag(y));
        if (fx != fy)
            return 0;
        if (!fx)
            continue;
        defined++;
        double scale = fmax(1.0, fmax(cabs(x), cabs(y)));
        if (cabs(x - y) > 1e-9 * scale)
            return 0;
    }
    return defined > 0;
}

/* sympy_numeric_eq followed by sympy_symbolic_eq. */
static int expr_equal(side g, side p)
{
    int g_atomic = g.b < 0 && mx_is_atomic_number(g.ar, g.a), p_atomic = p.b < 0 && mx_is_atomic_number(p.ar, p.a);
    int g_sym = side_has_symbols(g), p_sym = side_has_symbols(p);
    if (g_atomic || p_atomic) {
        int g_float = g_atomic && mx_is_atomic_float(g.ar, g.a), p_float = p_atomic && mx_is_atomic_float(p.ar, p.a);
        if (g_float || p_float) {
            if (!g_sym && !p_sym && round6_equal(side_eval(g, 0), side_eval(p, 0)))
                return 1;
        } else if (g_atomic && p_atomic && mx_is_atomic_integer(g.ar, g.a) && mx_is_atomic_integer(p.ar, p.a)) {
            /* 9% equals 9: the percent is dropped when both sides are integers */
            const mx_node *x = &g.ar->nodes[g.a], *y = &p.ar->nodes[p.a];
            if (x->kind == MX_PCT)
                x = &g.ar->nodes[x->a];
            if (y->kind == MX_PCT)
                y = &p.ar->nodes[y->a];
            if (x->q.ok && y->q.ok)
                return x->q.num == y->q.num;
            return x->f == y->f;
        } else if (!g_sym && !p_sym) {
            mq a = g.b < 0 ? mx_exact(g.ar, g.a, 1) : (mq){0, 1, 0};
            mq b = p.b < 0 ? mx_exact(p.ar, p.a, 1) : (mq){0, 1, 0};
            if (a.ok && b.ok)
                return a.num == b.num && a.den == b.den;
            /* a rational against a float expression: sympy's Rational == Float is exact, and simplify(a - b)
             * leaves a tiny nonzero Float; so 11/26 is not 11/26. */
            int floats = (g.b < 0 ? mx_has_floats(g.ar, g.a) : 1) || (p.b < 0 ? mx_has_floats(p.ar, p.a) : 1);
            double complex x = side_eval(g, 0), y = side_eval(p, 0);
            if (floats ? (x == y) : close_tight(x, y))
                return 1;
        }
    } else if (!g_sym && !p_sym) {
        if (close_tight(side_eval(g, 0), side_eval(p, 0)))
            return 1;
        return 0;
    }
    if (!g_sym && !p_sym)
        return 0;
    return symbolic_equal(g, p);
}

/* ---- value shapes --------------------------------------------------------------------------------------------- */

typedef struct ref {
    const mx_arena *ar;
    int v;
} ref;

static const mv *V(ref r) { return &r.ar->vals[r.v]; }

static int is_rel(ref r)
{
    const mv *v = V(r);
    if (v->kind == MV_REL)
        return 1;
    if (v->kind != MV_AND || v->n == 0)
        return 0;
    for (int k = 0; k < v->n; k++)
        if (r.ar->vals[r.ar->items[v->first + k]].kind != MV_REL)
            return 0;
    return 1;
}

static int is_eq(ref r)
{
    const mv *v = V(r);
    if (v->kind == MV_REL)
        return v->rel == MR_EQ;
    if (v->kind != MV_AND || v->n == 0)
        return 0;
    for (int k = 0; k < v->n; k++) {
        const mv *it = &r.ar->vals[r.ar->items[v->first + k]];
        if (it->kind != MV_REL || it->rel != MR_EQ)
            return 0;
    }
    return 1;
}

/* latex2sympy's is_expr_of_only_symbols: symbols joined by + * and ^(-1), no numbers. */
static int only_symbols(const mx_arena *ar, int node)
{
    const mx_node *n = &ar->nodes[node];
    if (n->kind == MX_SYM)
        return !n->is_float; /* f(2) has a number among its arguments */
    if (n->kind == MX_POW)
        return ar->nodes[n->a].kind == MX_SYM && ar->nodes[n->b].kind == MX_NUM && ar->nodes[n->b].q.ok &&
               ar->nodes[n->b].q.num == -1 && ar->nodes[n->b].q.den == 1;
    if (n->kind == MX_ADD || n->kind == MX_MUL)
        return only_symbols(ar, n->a) && only_symbols(ar, n->b);
    return 0;
}

static int first_rel(ref r) { return V(r)->kind == MV_AND ? r.ar->items[V(r)->first] : r.v; }

static int last_rel(ref r) { return V(r)->kind == MV_AND ? r.ar->items[V(r)->first + V(r)->n - 1] : r.v; }

static int is_assignment(ref r)
{
    if (!is_eq(r))
        return 0;
    const mv *lhs = &r.ar->vals[r.ar->vals[first_rel(r)].lhs];
    return lhs->kind == MV_EXPR && only_symbols(r.ar, lhs->expr);
}

static int is_set(ref r)
{
    int k = V(r)->kind;
    return k == MV_SET || k == MV_INTERVAL || k == MV_UNION || k == MV_EMPTYSET || k == MV_NAMEDSET;
}

static int values_equal(ref g, ref p, int depth);

/* Ordered element-wise comparison of n items of each. */
static int items_in_order(ref g, const int *gi, ref p, const int *pi, int n, int depth)
{
    for (int k = 0; k < n; k++)
        if (!values_equal((ref){g.ar, gi[k]}, (ref){p.ar, pi[k]}, depth + 1))
            return 0;
    return 1;
}

/* Order-free: every gold item matched to a distinct predicted one (sympy sorts both sets, then zips). */
static int items_any_order(ref g, const int *gi, ref p, const int *pi, int n, int depth)
{
    if (n > 64)
        return 0;
    uint64_t used = 0;
    for (int k = 0; k < n; k++) {
        int hit = 0;
        for (int j = 0; j < n && !hit; j++)
            if (!(used >> j & 1) && values_equal((ref){g.ar, gi[k]}, (ref){p.ar, pi[j]}, depth + 1)) {
                used |= 1ull << j;
                hit = 1;
            }
        if (!hit)
            return 0;
    }
    return 1;
}

/* Distinct items of a finite set (sympy's FiniteSet drops repeats). */
static int dedup(ref r, const int *in, int n, int *out)
{
    int m = 0;
    for (int k = 0; k < n; k++) {
        int dup = 0;
        for (int j = 0; j < m && !dup; j++) {
            const mv *a = &r.ar->vals[in[k]], *b = &r.ar->vals[out[j]];
            if (a->kind == MV_EXPR && b->kind == MV_EXPR) {
                const mx_node *x = &r.ar->nodes[a->expr], *y = &r.ar->nodes[b->expr];
                dup = x->kind == MX_NUM && y->kind == MX_NUM && x->is_float == y->is_float && x->q.ok && y->q.ok &&
                      x->q.num == y->q.num && x->q.den == y->q.den;
            }
        }
        if (!dup)
            out[m++] = in[k];
    }
    return m;
}

static int interval_equal(ref g, ref p, int depth)
{
    (void)depth;
    const mv *a = V(g), *b = V(p);
    return a->lopen == b->lopen && a->ropen == b->ropen && expr_equal((side){g.ar, a->lo, -1}, (side){p.ar, b->lo, -1}) &&
           expr_equal((side){g.ar, a->hi, -1}, (side){p.ar, b->hi, -1});
}

/* sympy_compare_sets */
static int sets_equal(ref g, ref p, int depth)
{
    int gi_buf[MX_MAX_VALUES], pi_buf[MX_MAX_VALUES];
    const mv *a = V(g), *b = V(p);
    if (a->kind == MV_INTERVAL && b->kind == MV_INTERVAL)
        return interval_equal(g, p, depth);
    if (a->kind == MV_EMPTYSET && b->kind == MV_EMPTYSET)
        return 1;
    if (a->kind == MV_NAMEDSET && b->kind == MV_NAMEDSET)
        return a->expr == b->expr;
    if (a->kind == MV_UNION && b->kind == MV_UNION) {
        if (a->n != b->n)
            return 0;
        return items_any_order(g, &g.ar->items[a->first], p, &p.ar->items[b->first], a->n, depth);
    }
    /* the item lists of a set or tuple; a non-set is a one-element set */
    int gn, pn;
    const int *gi, *pi;
    int g_set, p_set, g_tuple = a->kind == MV_TUPLE, p_tuple = b->kind == MV_TUPLE;
    int g_single = 0, p_single = 0;
    if (a->kind == MV_SET || a->kind == MV_TUPLE) {
        gi = &g.ar->items[a->first];
        gn = a->n;
        g_set = a->kind == MV_SET;
    } else if (a->kind == MV_INTERVAL || a->kind == MV_UNION || a->kind == MV_EMPTYSET || a->kind == MV_NAMEDSET) {
        gi = NULL, gn = 0, g_set = 1;
    } else {
        gi_buf[0] = g.v;
        gi = gi_buf, gn = 1, g_set = 1, g_single = 1;
    }
    if (b->kind == MV_SET || b->kind == MV_TUPLE) {
        pi = &p.ar->items[b->first];
        pn = b->n;
        p_set = b->kind == MV_SET;
    } else if (b->kind == MV_INTERVAL || b->kind == MV_UNION || b->kind == MV_EMPTYSET || b->kind == MV_NAMEDSET) {
        pi = NULL, pn = 0, p_set = 1;
    } else {
        pi_buf[0] = p.v;
        pi = pi_buf, pn = 1, p_set = 1, p_single = 1;
    }
    (void)g_single;
    (void)p_single;
    if (gi && pi) {
        int gd[MX_MAX_VALUES], pd[MX_MAX_VALUES];
        if (g_set && !g_tuple) {
            gn = dedup(g, gi, gn, gd);
            gi = gd;
        }
        if (p_set && !p_tuple) {
            pn = dedup(p, pi, pn, pd);
            pi = pd;
        }
        if (gn != pn)
            return 0;
        if (g_tuple && p_tuple)
            return items_in_order(g, gi, p, pi, gn, depth);
        if (g_tuple && !p_tuple && b->kind == MV_SET)
            return items_in_order(g, gi, p, pi, gn, depth); /* a written set keeps its order against a tuple */
        return items_any_order(g, gi, p, pi, gn, depth);
    }
    /* an open interval against a pair, compared as the tuple (start, end) */
    if (a->kind == MV_INTERVAL && a->lopen && a->ropen && pi && pn == 2 && (b->kind == MV_SET || b->kind == MV_TUPLE)) {
        const mv *x = &p.ar->vals[pi[0]], *y = &p.ar->vals[pi[1]];
        return x->kind == MV_EXPR && y->kind == MV_EXPR && expr_equal((side){g.ar, a->lo, -1}, (side){p.ar, x->expr, -1}) &&
               expr_equal((side){g.ar, a->hi, -1}, (side){p.ar, y->expr, -1});
    }
    if (b->kind == MV_INTERVAL && b->lopen && b->ropen && gi && gn == 2 && (a->kind == MV_SET || a->kind == MV_TUPLE)) {
        const mv *x = &g.ar->vals[gi[0]], *y = &g.ar->vals[gi[1]];
        return x->kind == MV_EXPR && y->kind == MV_EXPR && expr_equal((side){g.ar, x->expr, -1}, (side){p.ar, b->lo, -1}) &&
               expr_equal((side){g.ar, y->expr, -1}, (side){p.ar, b->hi, -1});
    }
    return 0;
}

/* sympy_compare_relational */
static int rels_equal(ref g, ref p, int depth)
{
    const mv *a = V(g), *b = V(p);
    if (a->kind == MV_AND && b->kind == MV_AND) {
        if (a->n != b->n)
            return 0;
        for (int k = 0; k < a->n; k++)
            if (!rels_equal((ref){g.ar, g.ar->items[a->first + k]}, (ref){p.ar, p.ar->items[b->first + k]}, depth + 1))
                return 0;
        return 1;
    }
    if (a->kind != MV_REL || b->kind != MV_REL)
        return 0;
    const mv *gl = &g.ar->vals[a->lhs], *gr = &g.ar->vals[a->rhs], *pl = &p.ar->vals[b->lhs], *pr = &p.ar->vals[b->rhs];
    if (gl->kind != MV_EXPR || gr->kind != MV_EXPR || pl->kind != MV_EXPR || pr->kind != MV_EXPR)
        return 0;
    side gd = {g.ar, gl->expr, gr->expr};
    if (a->rel == b->rel && expr_equal(gd, (side){p.ar, pl->expr, pr->expr}))
        return 1;
    static const int inverse[] = {[MR_EQ] = MR_EQ, [MR_LT] = MR_GT, [MR_LE] = MR_GE, [MR_GT] = MR_LT,
                                  [MR_GE] = MR_LE, [MR_NE] = -1};
    if (inverse[a->rel] == b->rel && expr_equal(gd, (side){p.ar, pr->expr, pl->expr}))
        return 1;
    return 0;
}

/* A one-variable inequality as an interval (math-verify's as_set when the prediction is a set): x < 3, 3 >= x,
 * a < x < b. Returns an interval value built in a scratch copy, or 0 when the relation is not of that form. */
static int symbols_compare(ref g, ref p);

static int relation_as_interval(ref g, ref p, int depth)
{
    /* collect (lo, lo_open, hi, hi_open) with a single symbol in the middle */
    const mv *a = V(g);
    int rels[2], nrel = 0;
    if (a->kind == MV_REL) {
        rels[nrel++] = g.v;
    } else if (a->kind == MV_AND && a->n == 2) {
        rels[nrel++] = g.ar->items[a->first];
        rels[nrel++] = g.ar->items[a->first + 1];
    } else {
        return -1;
    }
    int lo = -1, hi = -1, lopen = 1, ropen = 1, var = -1;
    for (int k = 0; k < nrel; k++) {
        const mv *r = &g.ar->vals[rels[k]];
        const mv *l = &g.ar->vals[r->lhs], *rr = &g.ar->vals[r->rhs];
        if (l->kind != MV_EXPR || rr->kind != MV_EXPR || r->rel == MR_EQ || r->rel == MR_NE)
            return -1;
        int lsym = g.ar->nodes[l->expr].kind == MX_SYM, rsym = g.ar->nodes[rr->expr].kind == MX_SYM;
        int x, c, rel = r->rel;
        if (lsym && !mx_has_symbols(g.ar, rr->expr)) {
            x = l->expr, c = rr->expr;
        } else if (rsym && !mx_has_symbols(g.ar, l->expr)) {
            x = rr->expr, c = l->expr;
            rel = rel == MR_LT ? MR_GT : rel == MR_LE ? MR_GE : rel == MR_GT ? MR_LT : MR_LE;
        } else {
            return -1;
        }
        int s = g.ar->nodes[x].sym;
        if (var >= 0 && var != s)
            return -1;
        var = s;
        if (rel == MR_LT || rel == MR_LE) {
            hi = c;
            ropen = rel == MR_LT;
        } else {
            lo = c;
            lopen = rel == MR_GT;
        }
    }
    const mv *b = V(p);
    if (b->kind != MV_INTERVAL)
        return 0;
    (void)depth;
    double complex pl = mx_eval(p.ar, b->lo, 0), ph = mx_eval(p.ar, b->hi, 0);
    int lo_ok = lo < 0 ? (isinf(creal(pl)) && creal(pl) < 0) : (b->lopen == lopen &&
                expr_equal((side){g.ar, lo, -1}, (side){p.ar, b->lo, -1}));
    int hi_ok = hi < 0 ? (isinf(creal(ph)) && creal(ph) > 0) : (b->ropen == ropen &&
                expr_equal((side){g.ar, hi, -1}, (side){p.ar, b->hi, -1}));
    return lo_ok && hi_ok;
}

/* Names of a product of symbols (latex2sympy keeps the written order: \text{even} matches even = e*v*e*n),
 * concatenated, E as "e". 0 when the product holds anything else. */
static int product_name(const mx_arena *ar, int node, char *out, size_t cap)
{
    int stack[64], sp = 0;
    size_t k = 0;
    stack[sp++] = node;
    while (sp) {
        const mx_node *x = &ar->nodes[stack[--sp]];
        const char *name = NULL;
        if (x->kind == MX_MUL) {
            if (sp + 2 > 64)
                return 0;
            stack[sp++] = x->b;
            stack[sp++] = x->a;
            continue;
        }
        if (x->kind == MX_SYM)
            name = ar->syms[x->sym];
        else if (x->kind == MX_E)
            name = "e";
        else
            return 0;
        size_t l = strlen(name);
        if (k + l + 1 > cap)
            return 0;
        memcpy(out + k, name, l);
        k += l;
    }
    out[k] = '\0';
    return 1;
}

/* sympy's str() of a symbol or a plain number (integers and p/q; a Float prints 15 significant digits). 0 for
 * anything else. */
static int simple_str(const mx_arena *ar, int node, char *out, size_t cap)
{
    const mx_node *x = &ar->nodes[node];
    if (x->kind == MX_SYM) {
        snprintf(out, cap, "%s", ar->syms[x->sym]);
        return 1;
    }
    if (x->kind != MX_NUM)
        return 0;
    if (!x->is_float && x->q.ok) {
        if (x->q.den == 1)
            snprintf(out, cap, "%lld", (long long)x->q.num);
        else
            snprintf(out, cap, "%lld/%lld", (long long)x->q.num, (long long)x->q.den);
        return 1;
    }
    if (x->is_float && fabs(x->f) >= 1e-4 && fabs(x->f) < 1e15) {
        int before = x->f == 0 ? 1 : (int)floor(log10(fabs(x->f))) + 1;
        if (before < 1)
            before = 1;
        snprintf(out, cap, "%.*f", 15 - before, x->f);
        return 1;
    }
    return 0;
}

static int symbols_compare(ref g, ref p)
{
    int ge = V(g)->expr, pe = V(p)->expr;
    const mx_node *a = &g.ar->nodes[ge], *b = &p.ar->nodes[pe];
    if ((a->kind == MX_SYM && strcmp(g.ar->syms[a->sym], "e") == 0 && b->kind == MX_E) ||
        (b->kind == MX_SYM && strcmp(p.ar->syms[b->sym], "e") == 0 && a->kind == MX_E))
        return 1;
    char name[256], other[256];
    if (a->kind == MX_SYM && b->kind == MX_MUL && product_name(p.ar, pe, name, sizeof name))
        return strcmp(g.ar->syms[a->sym], name) == 0;
    if (b->kind == MX_SYM && a->kind == MX_MUL && product_name(g.ar, ge, name, sizeof name))
        return strcmp(p.ar->syms[b->sym], name) == 0;
    if (a->kind == MX_SYM && b->kind == MX_SYM)
        return strcmp(g.ar->syms[a->sym], p.ar->syms[b->sym]) == 0;
    /* str(gold) == str(pred): the symbol "-85" (from \text{-85}) equals the number -85 */
    return simple_str(g.ar, ge, name, sizeof name) && simple_str(p.ar, pe, other, sizeof other) &&
           strcmp(name, other) == 0;
}

static int matrices_equal(ref g, ref p)
{
    const mv *a = V(g), *b = V(p);
    if (a->rows != b->rows || a->cols != b->cols)
        return 0;
    for (int k = 0; k < a->n; k++)
        if (!expr_equal((side){g.ar, g.ar->items[a->first + k], -1}, (side){p.ar, p.ar->items[b->first + k], -1}))
            return 0;
    return 1;
}

/* sympy_expr_eq */
static int values_equal(ref g, ref p, int depth)
{
    if (depth > 16)
        return 0;
    int g_assign = is_assignment(g), p_assign = is_assignment(p), g_eq = is_eq(g), p_eq = is_eq(p);
    /* an assignment chain x = a = b keeps its first lhs and last rhs; we compare through them directly below */
    if (p_eq && !g_eq) {
        p.v = p.ar->vals[last_rel(p)].rhs;
    } else if (g_assign && !p_eq) {
        g.v = g.ar->vals[last_rel(g)].rhs;
    } else if (g_assign && p_assign) {
        const mv *gf = &g.ar->vals[first_rel(g)], *gl = &g.ar->vals[last_rel(g)];
        const mv *pf = &p.ar->vals[first_rel(p)], *pl = &p.ar->vals[last_rel(p)];
        if (g.ar->vals[gf->lhs].kind != MV_EXPR || p.ar->vals[pf->lhs].kind != MV_EXPR)
            return 0;
        ref gr = {g.ar, gl->rhs}, pr = {p.ar, pl->rhs};
        if (V(gr)->kind != MV_EXPR || V(pr)->kind != MV_EXPR)
            return values_equal((ref){g.ar, gf->lhs}, (ref){p.ar, pf->lhs}, depth + 1) &&
                   values_equal(gr, pr, depth + 1);
        side gd = {g.ar, g.ar->vals[gf->lhs].expr, V(gr)->expr}, pd = {p.ar, p.ar->vals[pf->lhs].expr, V(pr)->expr};
        if (expr_equal(gd, pd))
            return 1;
        side pflip = {p.ar, V(pr)->expr, p.ar->vals[pf->lhs].expr};
        return expr_equal(gd, pflip);
    }
    if (is_rel(g) && is_set(p)) {
        int r = relation_as_interval(g, p, depth);
        if (r >= 0)
            return r;
    }
    const mv *a = V(g), *b = V(p);
    if (is_rel(g) && is_rel(p))
        return rels_equal(g, p, depth);
    if (a->kind == MV_MATRIX || b->kind == MV_MATRIX)
        return a->kind == MV_MATRIX && b->kind == MV_MATRIX && matrices_equal(g, p);
    if (is_set(g) || is_set(p) || a->kind == MV_TUPLE || b->kind == MV_TUPLE)
        return sets_equal(g, p, depth);
    if (a->kind != MV_EXPR || b->kind != MV_EXPR)
        return 0;
    if (g.ar->nodes[a->expr].kind == MX_SYM || p.ar->nodes[b->expr].kind == MX_SYM)
        return symbols_compare(g, p);
    return expr_equal((side){g.ar, a->expr, -1}, (side){p.ar, b->expr, -1});
}

int mhf_values_equal(const mx_arena *g, int gv, const mx_arena *p, int pv)
{
    if (gv < 0 || pv < 0)
        return 0;
    return values_equal((ref){g, gv}, (ref){p, pv}, 0);
}
