/* math_latex_parse.c: a recursive-descent reader of answer LaTeX (math_latex_parse.h). Precedence, loosest first:
 * elements separated by ',' or ';'  >  set operations (\cup \cap \setminus)  >  relations (= < > \le \ge \neq
 * \in)  >  + -  >  explicit * / \cdot \times \div  >  unary +-  >  implicit products (the mixed-number rule lives
 * here: an integer followed by a positive rational adds, 2\frac{1}{2} = 5/2)  >  ! and ^  >  atoms. */
#include "math_latex_parse.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct lp {
    const char *s;
    size_t i, n, end; /* parse s[i..end) */
    mx_arena *ar;
    int depth, failed;
} lp;

static int fail(lp *p)
{
    p->failed = 1;
    return -1;
}

static int starts(const lp *p, const char *w)
{
    size_t k = strlen(w);
    return p->i + k <= p->end && memcmp(p->s + p->i, w, k) == 0;
}

/* A command at i, read as latex2sympy2_extended's ANTLR lexer reads it: the longest known token wins and a
 * command needs no delimiter, so \gen is \ge followed by n and \cdota is \cdot a (callers try longer
 * commands first). \in is the exception that must not swallow \infty or \int. */
static int at_cmd(const lp *p, const char *cmd)
{
    size_t k = strlen(cmd);
    if (!starts(p, cmd))
        return 0;
    if (strcmp(cmd, "\\in") == 0 && p->i + k < p->end && (p->s[p->i + k] == 'f' || p->s[p->i + k] == 't'))
        return 0;
    return 1;
}

static void skip_ws(lp *p)
{
    static const char *const spaces[] = {"\\qquad", "\\quad", "\\,", "\\;", "\\:", "\\!", "\\ ", "~", NULL};
    for (;;) {
        while (p->i < p->end && isspace((unsigned char)p->s[p->i]))
            p->i++;
        int hit = 0;
        for (int k = 0; spaces[k]; k++)
            if (at_cmd(p, spaces[k])) {
                p->i += strlen(spaces[k]);
                hit = 1;
                break;
            }
        if (!hit)
            return;
    }
}

static int eat(lp *p, const char *w)
{
    skip_ws(p);
    if (at_cmd(p, w)) {
        p->i += strlen(w);
        return 1;
    }
    return 0;
}

/* Index just past the group that opens at i (one of ( [ { or \{ ), any bracket kind closing it; 0 when
 * unbalanced. Used to find interval ends such as [1, 2). */
static size_t group_end(const lp *p, size_t i, int *top_commas)
{
    int depth = 0;
    *top_commas = 0;
    for (size_t k = i; k < p->end; k++) {
        char c = p->s[k];
        if (c == '\\' && k + 1 < p->end && (p->s[k + 1] == '{' || p->s[k + 1] == '}')) {
            depth += p->s[k + 1] == '{' ? 1 : -1;
            k++;
        } else if (c == '\\' && k + 1 < p->end) {
            k++; /* \, \( and other escapes are not brackets */
        } else if (c == '(' || c == '[' || c == '{') {
            depth++;
        } else if (c == ')' || c == ']' || c == '}') {
            depth--;
        } else if (c == ',' && depth == 1) {
            (*top_commas)++;
        }
        if (depth == 0)
            return k + 1;
    }
    return 0;
}

static int parse_expr(lp *p);
static int parse_elements(lp *p, size_t end, int *first, int *count, int *groups);
static int parse_relation_value(lp *p);

/* ---- numbers -------------------------------------------------------------------------------------------------- */

/* Digits [. digits] at i, read exactly: integers up to 18 digits and decimals as rationals; longer as doubles. */
static int parse_number(lp *p)
{
    size_t st = p->i;
    while (p->i < p->end && isdigit((unsigned char)p->s[p->i]))
        p->i++;
    int is_float = 0;
    if (p->i + 1 < p->end + 1 && p->i < p->end && p->s[p->i] == '.' && p->i + 1 < p->end &&
        isdigit((unsigned char)p->s[p->i + 1])) {
        is_float = 1;
        p->i++;
        while (p->i < p->end && isdigit((unsigned char)p->s[p->i]))
            p->i++;
    }
    if (p->i == st)
        return fail(p);
    char buf[64];
    size_t len = p->i - st;
    if (len >= sizeof buf) {
        /* too long to be exact: keep a double */
        char *tmp = malloc(len + 1);
        if (!tmp)
            return fail(p);
        memcpy(tmp, p->s + st, len);
        tmp[len] = '\0';
        double f = strtod(tmp, NULL);
        free(tmp);
        mq bad = {0, 1, 0};
        return mx_num_q(p->ar, bad, is_float, f);
    }
    memcpy(buf, p->s + st, len);
    buf[len] = '\0';
    int64_t num = 0, den = 1;
    int exact = 1, after = 0;
    for (size_t k = 0; k < len; k++) {
        if (buf[k] == '.') {
            after = 1;
            continue;
        }
        if (__builtin_mul_overflow(num, 10, &num) || __builtin_add_overflow(num, buf[k] - '0', &num))
            exact = 0;
        if (after && __builtin_mul_overflow(den, 10, &den))
            exact = 0;
        if (!exact)
            break;
    }
    mq q = exact ? mq_make(num, den) : (mq){0, 1, 0};
    return mx_num_q(p->ar, q, is_float, strtod(buf, NULL));
}

/* ---- atoms ---------------------------------------------------------------------------------------------------- */

static const struct {
    const char *cmd;
    mx_func f;
} funcs[] = {
    {"\\arcsin", MF_ASIN}, {"\\arccos", MF_ACOS}, {"\\arctan", MF_ATAN}, {"\\sinh", MF_SINH}, {"\\cosh", MF_COSH},
    {"\\tanh", MF_TANH}, {"\\sin", MF_SIN}, {"\\cos", MF_COS}, {"\\tan", MF_TAN}, {"\\cot", MF_COT},
    {"\\sec", MF_SEC}, {"\\csc", MF_CSC}, {"\\ln", MF_LOG}, {"\\log", MF_LOG}, {"\\exp", MF_EXP},
};

static const char *const greek[] = {"alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta",
                                    "theta", "vartheta", "iota", "kappa", "lambda", "mu", "nu", "xi", "rho",
                                    "sigma", "tau", "upsilon", "phi", "varphi", "chi", "psi", "omega", "Gamma",
                                    "Delta", "Theta", "Lambda", "Xi", "Sigma", "Phi", "Psi", "Omega", NULL};

/* A braced group {…} parsed as an expression. */
static int parse_braced(lp *p)
{
    skip_ws(p);
    if (p->i < p->end && p->s[p->i] == '{') {
        int commas;
        size_t e = group_end(p, p->i, &commas);
        if (!e)
            return fail(p);
        size_t save_end = p->end;
        p->i++;
        p->end = e - 1;
        int v = parse_expr(p);
        skip_ws(p);
        if (p->i != p->end)
            v = fail(p);
        p->end = save_end;
        p->i = e;
        return v;
    }
    /* \frac12 style single-token argument */
    if (p->i < p->end && isdigit((unsigned char)p->s[p->i])) {
        size_t save = p->end;
        p->end = p->i + 1;
        int v = parse_number(p);
        p->end = save;
        return v;
    }
    if (p->i < p->end && isalpha((unsigned char)p->s[p->i])) {
        char name[2] = {p->s[p->i++], 0};
        return name[0] == 'e' ? mx_leaf(p->ar, MX_E) : mx_sym(p->ar, name);
    }
    return fail(p);
}

static int parse_text(lp *p)
{
    /* \text{...}: latex2sympy reads the words as one lower-cased symbol, spaces dropped and one pair of
     * parentheses around them removed: \text{(A)} is the symbol a, \text{5} the symbol "5" */
    skip_ws(p);
    if (p->i >= p->end || p->s[p->i] != '{')
        return fail(p);
    int commas;
    size_t e = group_end(p, p->i, &commas);
    if (!e)
        return fail(p);
    size_t a = p->i + 1, b = e - 1;
    p->i = e;
    while (a < b && isspace((unsigned char)p->s[a]))
        a++;
    while (b > a && isspace((unsigned char)p->s[b - 1]))
        b--;
    if (b - a >= 2 && p->s[a] == '(' && p->s[b - 1] == ')')
        a++, b--;
    if (a == b || b - a >= MX_SYMBOL_CHARS)
        return fail(p);
    char name[MX_SYMBOL_CHARS];
    size_t k = 0;
    for (size_t j = a; j < b; j++) {
        if (p->s[j] == '{' || p->s[j] == '}' || p->s[j] == '\\')
            return fail(p);
        if (!isspace((unsigned char)p->s[j]))
            name[k++] = p->s[j];
    }
    name[k] = '\0';
    return mx_sym(p->ar, name);
}

/* A subscript after a letter: x_1, x_{12}, becoming part of the symbol's name. */
static void read_subscript(lp *p, char *name, size_t cap)
{
    if (p->i >= p->end || p->s[p->i] != '_')
        return;
    size_t k = strlen(name);
    p->i++;
    if (p->i < p->end && p->s[p->i] == '{') {
        int commas;
        size_t e = group_end(p, p->i, &commas);
        if (!e) {
            p->failed = 1;
            return;
        }
        size_t a = p->i + 1;
        p->i = e;
        if (k + 1 + (e - 1 - a) + 1 > cap) {
            p->failed = 1;
            return;
        }
        name[k++] = '_';
        for (size_t j = a; j < e - 1; j++)
            if (!isspace((unsigned char)p->s[j]))
                name[k++] = p->s[j];
        name[k] = '\0';
    } else if (p->i < p->end && isalnum((unsigned char)p->s[p->i]) && k + 3 < cap) {
        name[k++] = '_';
        name[k++] = p->s[p->i++];
        name[k] = '\0';
    } else {
        p->failed = 1;
    }
}

static int parse_matrix(lp *p, const char *env)
{
    char endtag[40];
    snprintf(endtag, sizeof endtag, "\\end{%s}", env);
    const char *stop = strstr(p->s + p->i, endtag);
    if (!stop || (size_t)(stop - p->s) > p->end)
        return fail(p);
    size_t body_end = (size_t)(stop - p->s);
    int v = mv_new(p->ar, MV_MATRIX);
    if (v < 0)
        return fail(p);
    int rows = 0, cols = -1, cells = 0, first = p->ar->nitems;
    size_t save_end = p->end;
    while (p->i < body_end) {
        /* one cell: up to '&', '\\' or the end */
        size_t k = p->i;
        int depth = 0;
        while (k < body_end) {
            char c = p->s[k];
            if (c == '{')
                depth++;
            else if (c == '}')
                depth--;
            else if (depth == 0 && (c == '&' || (c == '\\' && k + 1 < body_end && p->s[k + 1] == '\\')))
                break;
            k++;
        }
        p->end = k;
        int e = parse_expr(p);
        skip_ws(p);
        if (e < 0 || p->i != k) {
            p->end = save_end;
            return fail(p);
        }
        if (mv_push_item(p->ar, e) < 0) {
            p->end = save_end;
            return fail(p);
        }
        cells++;
        p->end = save_end;
        if (k < body_end && p->s[k] == '&') {
            p->i = k + 1;
            continue;
        }
        rows++;
        if (cols < 0)
            cols = cells;
        else if (cols != cells)
            return fail(p);
        cells = 0;
        p->i = k < body_end ? k + 2 : body_end;
        skip_ws(p);
    }
    if (rows == 0 || cols <= 0)
        return fail(p);
    p->i = body_end + strlen(endtag);
    p->ar->vals[v].first = first;
    p->ar->vals[v].n = rows * cols;
    p->ar->vals[v].rows = rows;
    p->ar->vals[v].cols = cols;
    return -2 - v; /* a value, not an expression: encoded below zero */
}

static int parse_postfix(lp *p);

/* A function's argument: (…), {…}, or the implicit product that follows (\sin 2x). */
static int parse_func_arg(lp *p);

static int parse_atom(lp *p)
{
    skip_ws(p);
    if (p->i >= p->end)
        return fail(p);
    if (++p->depth > MLP_MAX_DEPTH)
        return fail(p);
    int v = -1;
    char c = p->s[p->i];
    if (isdigit((unsigned char)c) || (c == '.' && p->i + 1 < p->end && isdigit((unsigned char)p->s[p->i + 1]))) {
        if (c == '.') {
            /* .5 reads as 0.5 */
            p->i++;
            size_t st = p->i;
            while (p->i < p->end && isdigit((unsigned char)p->s[p->i]))
                p->i++;
            char buf[40] = "0.";
            size_t len = p->i - st;
            if (len > 30)
                return fail(p);
            memcpy(buf + 2, p->s + st, len);
            buf[2 + len] = '\0';
            lp sub = {.s = buf, .i = 0, .n = 2 + len, .end = 2 + len, .ar = p->ar};
            v = parse_number(&sub);
        } else {
            v = parse_number(p);
        }
        skip_ws(p);
        if (v >= 0 && (eat(p, "\\%") || eat(p, "%")))
            v = mx_bin(p->ar, MX_PCT, v, mx_num_int(p->ar, 0));
    } else if (c == '(' || c == '[') {
        int commas;
        size_t e = group_end(p, p->i, &commas);
        char close = e ? p->s[e - 1] : 0;
        if (!e || commas || (c == '(' && close != ')') || (c == '[' && close != ']'))
            return fail(p);
        size_t save = p->end;
        p->i++;
        p->end = e - 1;
        v = parse_expr(p);
        skip_ws(p);
        if (p->i != p->end)
            v = fail(p);
        p->end = save;
        p->i = e;
    } else if (c == '{') {
        v = parse_braced(p);
    } else if (c == '|') {
        p->i++;
        const char *bar = memchr(p->s + p->i, '|', p->end - p->i);
        if (!bar)
            return fail(p);
        size_t save = p->end;
        p->end = (size_t)(bar - p->s);
        v = parse_expr(p);
        skip_ws(p);
        if (p->i != p->end)
            v = fail(p);
        p->end = save;
        p->i = (size_t)(bar - p->s) + 1;
        v = mx_call(p->ar, MF_ABS, v, -1);
    } else if (isalpha((unsigned char)c)) {
        char name[MX_SYMBOL_CHARS] = {c, 0};
        p->i++;
        /* d followed by a letter is a differential, one symbol "dx" */
        if (c == 'd' && p->i < p->end && isalpha((unsigned char)p->s[p->i]))
            name[1] = p->s[p->i++];
        read_subscript(p, name, sizeof name);
        if (p->failed)
            return -1;
        if (strcmp(name, "e") == 0) {
            v = mx_leaf(p->ar, MX_E);
        } else if ((c == 'f' || c == 'g' || c == 'h') && !name[1] && p->i < p->end && p->s[p->i] == '(') {
            /* f(x): an undefined function applied, one opaque symbol named by its text (x(x+1) is a product) */
            int commas;
            size_t e = group_end(p, p->i, &commas);
            if (!e || p->s[e - 1] != ')' || e - p->i + 2 >= MX_SYMBOL_CHARS)
                return fail(p);
            size_t k = 1, args_symbols = 1;
            for (size_t j = p->i; j < e; j++) {
                if (!isspace((unsigned char)p->s[j]))
                    name[k++] = p->s[j];
                if (j > p->i && j + 1 < e && !isalpha((unsigned char)p->s[j]) && p->s[j] != ',' &&
                    !isspace((unsigned char)p->s[j]))
                    args_symbols = 0;
            }
            name[k] = '\0';
            p->i = e;
            v = mx_sym(p->ar, name);
            if (v >= 0)
                p->ar->nodes[v].is_float = (uint8_t)!args_symbols;
        } else {
            v = mx_sym(p->ar, name); /* i too: latex2sympy reads it as a symbol */
        }
    } else if (c == '\\') {
        if (eat(p, "\\pi")) {
            v = mx_leaf(p->ar, MX_PI);
        } else if (eat(p, "\\infty")) {
            v = mx_leaf(p->ar, MX_INF);
        } else if (eat(p, "\\frac") || eat(p, "\\dfrac") || eat(p, "\\tfrac") || eat(p, "\\cfrac")) {
            int a = parse_braced(p), b = parse_braced(p);
            if (a < 0 || b < 0)
                return fail(p);
            const mx_node *na = &p->ar->nodes[a], *nb = &p->ar->nodes[b];
            if (mx_is_atomic_integer(p->ar, a) && mx_is_atomic_integer(p->ar, b) && na->kind == MX_NUM &&
                nb->kind == MX_NUM && na->q.ok && nb->q.ok) {
                if (nb->q.num == 0)
                    return fail(p);
                v = mx_num_q(p->ar, mq_mul(na->q, mq_inv(nb->q)), 0, na->f / nb->f);
            } else {
                v = mx_div(p->ar, a, b);
            }
        } else if (eat(p, "\\binom")) {
            int a = parse_braced(p), b = parse_braced(p);
            if (a < 0 || b < 0)
                return fail(p);
            mq qa = mx_exact(p->ar, a, 1), qb = mx_exact(p->ar, b, 1);
            if (qa.ok && qb.ok && qa.den == 1 && qb.den == 1 && qb.num >= 0 && qa.num >= qb.num && qa.num < 62) {
                int64_t r = 1;
                for (int64_t k = 1; k <= qb.num; k++)
                    r = r * (qa.num - qb.num + k) / k;
                v = mx_num_int(p->ar, r);
            } else {
                v = mx_call(p->ar, MF_BINOM, a, b);
            }
        } else if (eat(p, "\\sqrt")) {
            skip_ws(p);
            int idx = -1;
            if (p->i < p->end && p->s[p->i] == '[') {
                int commas;
                size_t e = group_end(p, p->i, &commas);
                if (!e || p->s[e - 1] != ']')
                    return fail(p);
                size_t save = p->end;
                p->i++;
                p->end = e - 1;
                idx = parse_expr(p);
                p->end = save;
                p->i = e;
                if (idx < 0)
                    return fail(p);
            }
            int a = parse_braced(p);
            if (a < 0)
                return fail(p);
            int ex = idx < 0 ? mx_num_q(p->ar, mq_make(1, 2), 0, 0.5) : mx_div(p->ar, mx_num_int(p->ar, 1), idx);
            v = mx_bin(p->ar, MX_POW, a, ex);
        } else if (eat(p, "\\textbf") || eat(p, "\\textit") || eat(p, "\\textrm") || eat(p, "\\textnormal") ||
                   eat(p, "\\text") || eat(p, "\\mbox")) {
            v = parse_text(p);
        } else if (eat(p, "\\lfloor")) {
            v = parse_expr(p);
            if (!eat(p, "\\rfloor"))
                return fail(p);
            v = mx_call(p->ar, MF_FLOOR, v, -1);
        } else if (eat(p, "\\lceil")) {
            v = parse_expr(p);
            if (!eat(p, "\\rceil"))
                return fail(p);
            v = mx_call(p->ar, MF_CEIL, v, -1);
        } else if (eat(p, "\\begin{pmatrix}")) {
            return parse_matrix(p, "pmatrix");
        } else if (eat(p, "\\begin{bmatrix}")) {
            return parse_matrix(p, "bmatrix");
        } else if (eat(p, "\\begin{matrix}")) {
            return parse_matrix(p, "matrix");
        } else {
            size_t nf = sizeof funcs / sizeof funcs[0];
            for (size_t k = 0; k < nf && v < 0; k++) {
                if (!eat(p, funcs[k].cmd))
                    continue;
                int power = -1, base = -1;
                skip_ws(p);
                if (funcs[k].f == MF_LOG && strcmp(funcs[k].cmd, "\\log") == 0 && p->i < p->end &&
                    p->s[p->i] == '_') {
                    p->i++;
                    base = parse_braced(p);
                    if (base < 0)
                        return fail(p);
                } else if (funcs[k].f == MF_LOG && strcmp(funcs[k].cmd, "\\log") == 0) {
                    base = mx_num_int(p->ar, 10); /* latex2sympy reads a bare \log as base 10 */
                }
                skip_ws(p);
                if (p->i < p->end && p->s[p->i] == '^') {
                    p->i++;
                    power = parse_braced(p);
                    if (power < 0)
                        return fail(p);
                }
                int arg = parse_func_arg(p);
                if (arg < 0)
                    return fail(p);
                v = mx_call(p->ar, funcs[k].f, arg, base);
                if (power >= 0)
                    v = mx_bin(p->ar, MX_POW, v, power);
                p->depth--;
                return v;
            }
            if (v < 0) {
                for (int k = 0; greek[k]; k++) {
                    char cmd[24];
                    snprintf(cmd, sizeof cmd, "\\%s", greek[k]);
                    if (eat(p, cmd)) {
                        char name[MX_SYMBOL_CHARS];
                        snprintf(name, sizeof name, "%s", greek[k]);
                        read_subscript(p, name, sizeof name);
                        v = mx_sym(p->ar, name);
                        break;
                    }
                }
            }
            if (v < 0)
                return fail(p);
        }
    } else {
        return fail(p);
    }
    p->depth--;
    return p->failed ? -1 : v;
}

static int parse_func_arg(lp *p)
{
    skip_ws(p);
    if (p->i < p->end && p->s[p->i] == '(')
        return parse_postfix(p);
    /* \sin x, \sin 2x: the implicit product that follows, without + or - */
    return parse_postfix(p);
}

/* exp: atom [^ sup] [!]... ; ^\circ (degrees) is dropped as math-verify does with convert_degrees off. */
static int parse_postfix(lp *p)
{
    int v = parse_atom(p);
    if (v < 0 || v <= -2)
        return v;
    for (;;) {
        skip_ws(p);
        if (p->i < p->end && p->s[p->i] == '^') {
            p->i++;
            skip_ws(p);
            if (eat(p, "\\circ") || eat(p, "{\\circ}")) {
                continue;
            }
            int e;
            if (p->i < p->end && p->s[p->i] == '{') {
                e = parse_braced(p);
            } else if (p->i < p->end && isdigit((unsigned char)p->s[p->i])) {
                size_t save = p->end;
                p->end = p->i + 1;
                e = parse_number(p);
                p->end = save;
            } else {
                e = parse_atom(p);
            }
            if (e < 0)
                return fail(p);
            v = mx_bin(p->ar, MX_POW, v, e);
        } else if (p->i < p->end && p->s[p->i] == '!') {
            p->i++;
            v = mx_call(p->ar, MF_FACT, v, -1);
        } else if (eat(p, "\\%")) {
            v = mx_bin(p->ar, MX_PCT, v, mx_num_int(p->ar, 0));
        } else {
            break;
        }
    }
    return v;
}

/* Can the text at i start another factor of an implicit product? */
static int starts_factor(lp *p)
{
    skip_ws(p);
    if (p->i >= p->end)
        return 0;
    char c = p->s[p->i];
    if (isalnum((unsigned char)c) || c == '(' || c == '{' || c == '.' )
        return 1;
    if (c == '|')
        return 0;
    if (c == '[')
        return 0;
    if (c != '\\')
        return 0;
    static const char *const not_factor[] = {"\\cdot", "\\times", "\\div", "\\le", "\\ge", "\\lt", "\\gt",
                                             "\\ne", "\\neq", "\\leq", "\\geq", "\\pm", "\\mp", "\\cup", "\\cap",
                                             "\\setminus", "\\in", "\\rfloor", "\\rceil", "\\end", "\\\\",
                                             "\\}", "\\%", "\\approx", NULL};
    for (int k = 0; not_factor[k]; k++)
        if (at_cmd(p, not_factor[k]))
            return 0;
    return 1;
}

/* postfix+ : implicit products, right-associated like latex2sympy's convert_postfix_list. */
static int parse_implicit(lp *p)
{
    int first = parse_postfix(p);
    if (first < 0)
        return first;
    if (!starts_factor(p))
        return first;
    int rest = parse_implicit(p);
    if (rest < 0)
        return rest <= -2 ? fail(p) : -1;
    const mx_node *a = &p->ar->nodes[first], *b = &p->ar->nodes[rest];
    if (a->kind == MX_NUM && mx_is_atomic_integer(p->ar, first) && b->kind == MX_NUM && !b->is_float && b->q.ok &&
        a->q.ok && b->q.num > 0) {
        /* mixed number: 2\frac{1}{2} = 5/2, -2\frac{1}{2} = -5/2 */
        mq whole = mq_mul(a->q, mq_int(b->q.den));
        mq r = a->q.num < 0 ? mq_add(whole, mq_neg(mq_int(b->q.num))) : mq_add(whole, mq_int(b->q.num));
        r = mq_mul(r, mq_make(1, b->q.den));
        return mx_num_q(p->ar, r, 0, mq_double(r));
    }
    return mx_bin(p->ar, MX_MUL, first, rest);
}

static int parse_unary(lp *p)
{
    skip_ws(p);
    if (p->i < p->end && p->s[p->i] == '-') {
        p->i++;
        int v = parse_unary(p);
        return v < 0 ? v : mx_neg(p->ar, v);
    }
    if (p->i < p->end && p->s[p->i] == '+') {
        p->i++;
        return parse_unary(p);
    }
    return parse_implicit(p);
}

static int parse_mul(lp *p)
{
    int v = parse_unary(p);
    while (v >= 0) {
        skip_ws(p);
        if (eat(p, "\\cdot") || eat(p, "\\times") || eat(p, "*") || eat(p, "\xc3\x97") || eat(p, "\xc2\xb7")) {
            int b = parse_unary(p);
            v = b < 0 ? fail(p) : mx_bin(p->ar, MX_MUL, v, b);
        } else if (eat(p, "/") || eat(p, "\\div") || eat(p, "\xc3\xb7")) {
            int b = parse_unary(p);
            v = b < 0 ? fail(p) : mx_div(p->ar, v, b);
        } else {
            break;
        }
    }
    return v;
}

static int parse_add(lp *p)
{
    int v = parse_mul(p);
    while (v >= 0) {
        skip_ws(p);
        if (p->i < p->end && p->s[p->i] == '+') {
            p->i++;
            int b = parse_mul(p);
            v = b < 0 ? fail(p) : mx_bin(p->ar, MX_ADD, v, b);
        } else if (p->i < p->end && p->s[p->i] == '-') {
            p->i++;
            int b = parse_mul(p);
            v = b < 0 ? fail(p) : mx_bin(p->ar, MX_ADD, v, mx_neg(p->ar, b));
        } else {
            break;
        }
    }
    return v;
}

static int parse_expr(lp *p)
{
    if (++p->depth > MLP_MAX_DEPTH)
        return fail(p);
    int v = parse_add(p);
    p->depth--;
    return v;
}

/* ---- sets, relations, elements ---------------------------------------------------------------------------------- */

static int read_rel(lp *p, mv_rel *rel)
{
    skip_ws(p);
    static const struct {
        const char *w;
        mv_rel r;
    } rels[] = {{"\\leq", MR_LE}, {"\\geq", MR_GE}, {"\\le", MR_LE}, {"\\ge", MR_GE}, {"\\neq", MR_NE},
                {"\\ne", MR_NE},  {"\\lt", MR_LT},  {"\\gt", MR_GT}, {"<=", MR_LE},   {">=", MR_GE},
                {"\xe2\x89\xa4", MR_LE}, {"\xe2\x89\xa5", MR_GE}, {"=", MR_EQ}, {"<", MR_LT}, {">", MR_GT}};
    for (size_t k = 0; k < sizeof rels / sizeof rels[0]; k++)
        if (at_cmd(p, rels[k].w)) {
            p->i += strlen(rels[k].w);
            *rel = rels[k].r;
            return 1;
        }
    return 0;
}

static int value_of(lp *p, int e)
{
    if (e <= -2)
        return -2 - e;
    return e < 0 ? -1 : mv_expr(p->ar, e);
}

/* A set operand: \{…\}, an interval or tuple in ( ) / [ ], \emptyset, \mathbb{R}; -1 with position unchanged when
 * the text there is not one. */
static int parse_set_atom(lp *p)
{
    skip_ws(p);
    size_t st = p->i;
    if (eat(p, "\\emptyset") || eat(p, "\\varnothing"))
        return mv_new(p->ar, MV_EMPTYSET);
    if (eat(p, "\\mathbb{R}") || eat(p, "\\mathbb{Z}") || eat(p, "\\mathbb{N}") || eat(p, "\\mathbb{Q}") ||
        eat(p, "\\mathbb{C}")) {
        int v = mv_new(p->ar, MV_NAMEDSET);
        if (v >= 0)
            p->ar->vals[v].expr = (unsigned char)p->s[p->i - 2];
        return v;
    }
    if (starts(p, "\\{")) {
        int commas;
        size_t e = group_end(p, p->i, &commas);
        if (!e || e < 2 || p->s[e - 2] != '\\')
            return fail(p);
        if (e - p->i == 4)
            return p->i = e, mv_new(p->ar, MV_EMPTYSET);
        int first, count, groups;
        p->i++; /* parse_elements steps over the '{' of "\{" */
        if (parse_elements(p, e - 2, &first, &count, &groups) < 0)
            return -1;
        p->i = e;
        int v = mv_new(p->ar, MV_SET);
        if (v >= 0) {
            p->ar->vals[v].first = first;
            p->ar->vals[v].n = count;
        }
        return v;
    }
    if (p->i < p->end && (p->s[p->i] == '(' || p->s[p->i] == '[')) {
        int commas;
        size_t e = group_end(p, p->i, &commas);
        if (!e || commas == 0)
            return -1;
        char open = p->s[p->i], close = p->s[e - 1];
        int first, count, groups;
        if (parse_elements(p, e - 1, &first, &count, &groups) < 0)
            return -1;
        p->i = e;
        if (count == 2 && (close == ')' || close == ']')) {
            int lo = p->ar->items[first], hi = p->ar->items[first + 1];
            if (p->ar->vals[lo].kind != MV_EXPR || p->ar->vals[hi].kind != MV_EXPR)
                return fail(p);
            int le = p->ar->vals[lo].expr, he = p->ar->vals[hi].expr;
            int lopen = open == '(', ropen = close == ')';
            /* an empty "interval" is a tuple, as latex2sympy has it: (3, 2) */
            double complex l = mx_eval(p->ar, le, 0), h = mx_eval(p->ar, he, 0);
            int symbolic = mx_has_symbols(p->ar, le) || mx_has_symbols(p->ar, he);
            if (!symbolic && ((lopen && ropen && creal(h) <= creal(l)) || (!lopen && !ropen && creal(h) < creal(l)))) {
                int v = mv_new(p->ar, MV_TUPLE);
                if (v >= 0)
                    p->ar->vals[v].first = first, p->ar->vals[v].n = 2;
                return v;
            }
            /* sympy opens an infinite end: [1, \infty] is [1, \infty) */
            if (!symbolic && isinf(creal(l)))
                lopen = 1;
            if (!symbolic && isinf(creal(h)))
                ropen = 1;
            int v = mv_new(p->ar, MV_INTERVAL);
            if (v >= 0) {
                p->ar->vals[v].lo = le;
                p->ar->vals[v].hi = he;
                p->ar->vals[v].lopen = (uint8_t)lopen;
                p->ar->vals[v].ropen = (uint8_t)ropen;
            }
            return v;
        }
        if (open != '(' || close != ')')
            return fail(p);
        int v = mv_new(p->ar, MV_TUPLE);
        if (v >= 0)
            p->ar->vals[v].first = first, p->ar->vals[v].n = count;
        return v;
    }
    p->i = st;
    return -1;
}

/* Set expressions joined by \cup / \cap, or a relation chain. */
static int parse_element_value(lp *p)
{
    size_t st = p->i;
    int failed_before = p->failed;
    int v = parse_set_atom(p);
    if (v >= 0) {
        for (;;) {
            skip_ws(p);
            if (eat(p, "\\cup")) {
                int b = parse_set_atom(p);
                if (b < 0)
                    return fail(p);
                int u = mv_new(p->ar, MV_UNION);
                if (u < 0)
                    return -1;
                int f = mv_push_item(p->ar, v);
                mv_push_item(p->ar, b);
                p->ar->vals[u].first = f;
                p->ar->vals[u].n = 2;
                v = u;
            } else {
                break;
            }
        }
        skip_ws(p);
        if (p->i >= p->end || p->s[p->i] == ',' || p->s[p->i] == ';')
            return v;
    }
    if (p->failed && !failed_before)
        return -1;
    p->i = st;
    return parse_relation_value(p);
}

static int parse_relation_value(lp *p)
{
    int e = parse_expr(p);
    int lhs = value_of(p, e);
    if (lhs < 0)
        return fail(p);
    skip_ws(p);
    if (eat(p, "\\in")) {
        int rhs = parse_element_value(p);
        if (rhs < 0)
            return fail(p);
        int r = mv_new(p->ar, MV_REL);
        if (r >= 0) {
            p->ar->vals[r].rel = MR_EQ;
            p->ar->vals[r].lhs = lhs;
            p->ar->vals[r].rhs = rhs;
        }
        return r;
    }
    mv_rel rel;
    int rels[16], nrel = 0;
    while (read_rel(p, &rel)) {
        skip_ws(p);
        int rhs_e = parse_expr(p);
        int rhs = value_of(p, rhs_e);
        if (rhs < 0 || nrel >= 16)
            return fail(p);
        int r = mv_new(p->ar, MV_REL);
        if (r < 0)
            return -1;
        p->ar->vals[r].rel = (uint8_t)rel;
        p->ar->vals[r].lhs = lhs;
        p->ar->vals[r].rhs = rhs;
        rels[nrel++] = r;
        lhs = rhs;
    }
    if (nrel == 0)
        return lhs;
    if (nrel == 1)
        return rels[0];
    int a = mv_new(p->ar, MV_AND);
    if (a < 0)
        return -1;
    int f = -1;
    for (int k = 0; k < nrel; k++) {
        int it = mv_push_item(p->ar, rels[k]);
        if (k == 0)
            f = it;
    }
    p->ar->vals[a].first = f;
    p->ar->vals[a].n = nrel;
    return a;
}

/* Elements separated by ',' (and ';', which latex2sympy groups into tuples) up to end; a \pm b gives two. */
static int parse_elements(lp *p, size_t end, int *first, int *count, int *groups)
{
    size_t save_end = p->end;
    p->end = end;
    p->i++; /* past the opener (callers position p->i on it); for the top level the caller passes i-1 */
    int vals[256], nv = 0;
    *groups = 1;
    for (;;) {
        skip_ws(p);
        /* one element: up to the next top-level ',' or ';' */
        int commas;
        size_t k = p->i;
        int depth = 0;
        while (k < end) {
            char c = p->s[k];
            if (c == '\\' && k + 1 < end) {
                if (p->s[k + 1] == '{')
                    depth++;
                else if (p->s[k + 1] == '}')
                    depth--;
                k += 2;
                continue;
            }
            if (c == '(' || c == '[' || c == '{')
                depth++;
            else if (c == ')' || c == ']' || c == '}')
                depth--;
            else if (depth == 0 && (c == ',' || c == ';'))
                break;
            k++;
        }
        (void)commas;
        size_t elem_end = k;
        p->end = elem_end;
        /* a \pm b */
        const char *pm = NULL;
        for (size_t j = p->i; j + 3 <= elem_end; j++)
            if (memcmp(p->s + j, "\\pm", 3) == 0 && (j + 3 == elem_end || !isalpha((unsigned char)p->s[j + 3]))) {
                pm = p->s + j;
                break;
            }
        if (pm) {
            size_t pmi = (size_t)(pm - p->s);
            int a = -1;
            skip_ws(p);
            if (p->i < pmi) {
                p->end = pmi;
                a = parse_expr(p);
                skip_ws(p);
                if (a < 0 || p->i != pmi) {
                    p->end = save_end;
                    return fail(p);
                }
            }
            p->end = elem_end;
            p->i = pmi + 3;
            int b = parse_expr(p);
            skip_ws(p);
            if (b < 0 || p->i != elem_end || nv + 2 > 256) {
                p->end = save_end;
                return fail(p);
            }
            int plus = a >= 0 ? mx_bin(p->ar, MX_ADD, a, b) : mx_neg(p->ar, b);
            int minus = a >= 0 ? mx_bin(p->ar, MX_ADD, a, mx_neg(p->ar, b)) : b;
            vals[nv++] = mv_expr(p->ar, plus);
            vals[nv++] = mv_expr(p->ar, minus);
        } else {
            if (p->i >= elem_end) {
                p->end = save_end;
                return fail(p);
            }
            int v = parse_element_value(p);
            skip_ws(p);
            if (v < 0 || p->i != elem_end || nv >= 256) {
                p->end = save_end;
                return fail(p);
            }
            vals[nv++] = v;
        }
        p->end = end;
        if (elem_end >= end)
            break;
        if (p->s[elem_end] == ';')
            (*groups)++;
        p->i = elem_end + 1;
    }
    p->end = save_end;
    *first = p->ar->nitems;
    for (int k = 0; k < nv; k++)
        if (mv_push_item(p->ar, vals[k]) < 0)
            return fail(p);
    *count = nv;
    return 0;
}

/* ^\s*-?\d{1,3}(,\d{3})+(\.\d+)?\s*$ : 1,234,567 is a number, not a set. */
static int comma_number(const char *s, int64_t *out_digits_ok)
{
    const char *p = s;
    while (isspace((unsigned char)*p))
        p++;
    if (*p == '-')
        p++;
    int lead = 0;
    while (isdigit((unsigned char)p[lead]))
        lead++;
    if (lead < 1 || lead > 3)
        return 0;
    p += lead;
    int groups = 0;
    while (p[0] == ',' && isdigit((unsigned char)p[1]) && isdigit((unsigned char)p[2]) &&
           isdigit((unsigned char)p[3]) && !isdigit((unsigned char)p[4])) {
        p += 4;
        groups++;
    }
    if (groups == 0)
        return 0;
    if (*p == '.' && isdigit((unsigned char)p[1])) {
        p++;
        while (isdigit((unsigned char)*p))
            p++;
    }
    while (isspace((unsigned char)*p))
        p++;
    *out_digits_ok = 1;
    return *p == '\0';
}

static int parse_top(mx_arena *ar, const char *latex)
{
    int64_t ok = 0;
    if (comma_number(latex, &ok)) {
        char buf[64];
        size_t k = 0;
        for (const char *p = latex; *p && k + 1 < sizeof buf; p++)
            if (*p != ',' && !isspace((unsigned char)*p))
                buf[k++] = *p;
        buf[k] = '\0';
        lp sub = {.s = buf, .i = 0, .n = k, .end = k, .ar = ar};
        int neg = buf[0] == '-';
        sub.i = (size_t)neg;
        int e = parse_number(&sub);
        if (e < 0 || sub.i != k)
            return -1;
        if (neg)
            e = mx_neg(ar, e);
        return mv_expr(ar, e);
    }
    size_t n = strlen(latex);
    if (n == 0)
        return -1;
    /* a leading \text{...} around everything is fine; parse_elements expects to be positioned on an opener */
    char *buf = malloc(n + 2);
    if (!buf)
        return -1;
    buf[0] = ' ';
    memcpy(buf + 1, latex, n + 1);
    lp p = {.s = buf, .i = 0, .n = n + 1, .end = n + 1, .ar = ar};
    int first, count, groups;
    int rc = parse_elements(&p, n + 1, &first, &count, &groups);
    int v = -1;
    if (rc == 0 && !p.failed && !ar->overflow) {
        if (count == 1) {
            v = ar->items[first];
        } else if (groups > 1 && groups != count) {
            v = -1; /* (a, b; c, d): a set of tuples, which contest answers never are */
        } else {
            v = mv_new(ar, MV_SET);
            if (v >= 0) {
                ar->vals[v].first = first;
                ar->vals[v].n = count;
            }
        }
    }
    free(buf);
    return ar->overflow ? -1 : v;
}

int mlp_parse_latex(mx_arena *ar, const char *latex)
{
    int v = parse_top(ar, latex);
    if (v >= 0 || ar->overflow)
        return v;
    /* math-verify retries the last part of an equation chain a = b = c (only without ',' or ';') */
    if (strchr(latex, ',') || strchr(latex, ';'))
        return -1;
    const char *last = NULL;
    int parts = 1;
    for (const char *q = latex; *q; q++)
        if (*q == '=' && (q == latex || (q[-1] != '\\' && q[-1] != '<' && q[-1] != '!' && q[-1] != '>'))) {
            parts++;
            last = q + 1;
        }
    if (parts <= 2 || !last)
        return -1;
    mx_reset(ar);
    return parse_top(ar, last);
}

/* ---- plain expressions (sympy parse_expr of the expression regex's capture) ---------------------------------- */

typedef struct pp {
    const char *s;
    size_t i;
    mx_arena *ar;
    int depth, failed;
} pp;

static int pp_expr(pp *p);

static void pp_ws(pp *p)
{
    while (isspace((unsigned char)p->s[p->i]))
        p->i++;
}

static int pp_atom(pp *p)
{
    pp_ws(p);
    char c = p->s[p->i];
    if (c == '(') {
        if (++p->depth > MLP_MAX_DEPTH)
            return -1;
        p->i++;
        int v = pp_expr(p);
        pp_ws(p);
        if (v < 0 || p->s[p->i] != ')')
            return -1;
        p->i++;
        p->depth--;
        return v;
    }
    if (isdigit((unsigned char)c) || (c == '.' && isdigit((unsigned char)p->s[p->i + 1]))) {
        size_t st = p->i;
        while (isdigit((unsigned char)p->s[p->i]))
            p->i++;
        if (p->s[p->i] == '.') {
            p->i++;
            while (isdigit((unsigned char)p->s[p->i]))
                p->i++;
        }
        size_t len = p->i - st;
        char buf[48];
        if (len + 2 >= sizeof buf)
            return -1;
        size_t k = 0;
        if (p->s[st] == '.')
            buf[k++] = '0';
        memcpy(buf + k, p->s + st, len);
        buf[k + len] = '\0';
        lp sub = {.s = buf, .i = 0, .n = k + len, .end = k + len, .ar = p->ar};
        /* "5." is a float in Python */
        int v = parse_number(&sub);
        if (v >= 0 && buf[k + len - 1] == '.')
            p->ar->nodes[v].is_float = 1;
        return sub.i == k + len || buf[k + len - 1] == '.' ? v : -1;
    }
    return -1;
}

static int pp_unary(pp *p);

static int pp_power(pp *p)
{
    int v = pp_atom(p);
    pp_ws(p);
    if (v >= 0 && p->s[p->i] == '*' && p->s[p->i + 1] == '*') {
        p->i += 2;
        int e = pp_unary(p); /* right-associative, binds tighter than unary minus on its left */
        return e < 0 ? -1 : mx_bin(p->ar, MX_POW, v, e);
    }
    return v;
}

static int pp_unary(pp *p)
{
    pp_ws(p);
    if (p->s[p->i] == '-') {
        p->i++;
        int v = pp_unary(p);
        return v < 0 ? -1 : mx_neg(p->ar, v);
    }
    if (p->s[p->i] == '+') {
        p->i++;
        return pp_unary(p);
    }
    return pp_power(p);
}

static int pp_term(pp *p)
{
    int v = pp_unary(p);
    for (;;) {
        pp_ws(p);
        char c = p->s[p->i];
        if (v < 0)
            return -1;
        if (c == '*' && p->s[p->i + 1] != '*') {
            p->i++;
            int b = pp_unary(p);
            v = b < 0 ? -1 : mx_bin(p->ar, MX_MUL, v, b);
        } else if (c == '/') {
            p->i++;
            int b = pp_unary(p);
            v = b < 0 ? -1 : mx_div(p->ar, v, b);
        } else {
            return v;
        }
    }
}

static int pp_expr(pp *p)
{
    int v = pp_term(p);
    for (;;) {
        pp_ws(p);
        char c = p->s[p->i];
        if (v < 0)
            return -1;
        if (c == '+' || c == '-') {
            p->i++;
            int b = pp_term(p);
            v = b < 0 ? -1 : mx_bin(p->ar, MX_ADD, v, c == '-' ? mx_neg(p->ar, b) : b);
        } else {
            return v;
        }
    }
}

int mlp_parse_plain(mx_arena *ar, const char *text)
{
    /* sympy reads ^ as XOR; math-verify rewrites it to ** first */
    size_t n = strlen(text);
    char *buf = malloc(2 * n + 1);
    if (!buf)
        return -1;
    size_t k = 0;
    for (size_t j = 0; j < n; j++) {
        if (text[j] == '^') {
            buf[k++] = '*';
            buf[k++] = '*';
        } else {
            buf[k++] = text[j] == '\n' ? ' ' : text[j];
        }
    }
    buf[k] = '\0';
    pp p = {.s = buf, .ar = ar};
    int v = pp_expr(&p);
    pp_ws(&p);
    if (p.s[p.i] != '\0')
        v = -1;
    free(buf);
    return ar->overflow ? -1 : v;
}
