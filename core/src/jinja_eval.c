/* jinja_eval.c: runs a compiled chat template. Scoping follows Jinja: a for loop body gets a fresh scope every
 * iteration (a `set` inside it is gone after the iteration), `if` makes none, a macro call sees the template's
 * top level and its own parameters, and a namespace() is the one value a `set` can change from inside a loop.
 * Undefined names render as "" and are falsy, but reading an attribute of one is an error, as in Jinja.
 * Work is bounded: loop iterations and macro calls share one budget, macro calls nest to a fixed depth, every
 * string and the output are capped, and the values of one render live in an arena with a byte limit. */
#include "jinja_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FRAME_INLINE 4 /* most scopes bind a loop variable and `loop`: no second allocation */

typedef struct frame {
    struct frame *parent;
    const char **names;
    jv **vals;
    size_t n, cap;
    const char *inline_names[FRAME_INLINE];
    jv *inline_vals[FRAME_INLINE];
} frame;

struct jinja_ctx {
    const jinja_template *t;
    jinja_arena *arena;
    jinja_limits lim;
    int64_t iterations;
    int depth;
    frame *root;
    dsarl_error *err;
    int rc;
};

enum { EXEC_OK = 0, EXEC_BREAK = 1, EXEC_CONTINUE = 2, EXEC_ERROR = -1 };

jinja_limits jinja_default_limits(void)
{
    return (jinja_limits){
        .max_output = (size_t)16 << 20, .max_memory = (size_t)256 << 20, .max_iterations = 200000, .max_depth = 64};
}

/* ---- context services -------------------------------------------------------------------------------------- */

jinja_arena *jinja_ctx_arena(jinja_ctx *c)
{
    return c->arena;
}
size_t jinja_ctx_string_limit(const jinja_ctx *c)
{
    return c->lim.max_output;
}
int jinja_ctx_failed(const jinja_ctx *c)
{
    return c->rc;
}

jv *jinja_ctx_fail(jinja_ctx *c, const jnode *at, int code, const char *fmt, ...)
{
    if (c->rc == 0) {
        char what[768];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
        c->rc = DSARL_FAIL(c->err, code, "chat template %s: line %d: %s", c->t->name, at ? at->line : 0, what);
    }
    return NULL;
}

jv *jinja_ctx_oom(jinja_ctx *c, const jnode *at)
{
    if (jinja_arena_used(c->arena) + 4096 >= c->lim.max_memory)
        return jinja_ctx_fail(c, at, DSARL_E_INVALID,
                              "the template's values passed %zu MiB; it is too large or "
                              "loops without end",
                              c->lim.max_memory >> 20);
    return jinja_ctx_fail(c, at, DSARL_E_NOMEM, "out of memory");
}

int jinja_ctx_count_iterations(jinja_ctx *c, const jnode *at, int64_t n)
{
    if (n < 0 || n > c->lim.max_iterations - c->iterations) {
        jinja_ctx_fail(c, at, DSARL_E_INVALID,
                       "the template ran more than %lld loop iterations and macro calls; "
                       "it loops without end or its input is too large",
                       (long long)c->lim.max_iterations);
        return -1;
    }
    c->iterations += n;
    return 0;
}

jv *jinja_ctx_take(jinja_ctx *c, const jnode *at, jbuf *b)
{
    jv *v = NULL;
    if (b->over)
        jinja_ctx_fail(c, at, DSARL_E_INVALID, "a string or the output passed %zu bytes (the render's limit)",
                       b->limit);
    else if (b->oom)
        jinja_ctx_oom(c, at);
    else if (!(v = jv_string(c->arena, b->data ? b->data : "", b->len)))
        jinja_ctx_oom(c, at);
    free(b->data);
    memset(b, 0, sizeof *b);
    return v;
}

static jbuf new_buf(const jinja_ctx *c)
{
    return (jbuf){.limit = c->lim.max_output};
}

/* ---- scopes ----------------------------------------------------------------------------------------------- */

static frame *frame_new(jinja_ctx *c, frame *parent)
{
    frame *f = jinja_alloc(c->arena, sizeof *f);
    if (f) {
        f->parent = parent;
        f->names = f->inline_names;
        f->vals = f->inline_vals;
        f->cap = FRAME_INLINE;
    }
    return f;
}

static int frame_set(jinja_ctx *c, frame *f, const char *name, jv *v)
{
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) {
            f->vals[i] = v;
            return 0;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        const char **names = jinja_alloc(c->arena, cap * sizeof *names);
        jv **vals = jinja_alloc(c->arena, cap * sizeof *vals);
        if (!names || !vals)
            return -1;
        if (f->n) {
            memcpy(names, f->names, f->n * sizeof *names);
            memcpy(vals, f->vals, f->n * sizeof *vals);
        }
        f->names = names;
        f->vals = vals;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n++] = v;
    return 0;
}

static jv *lookup(jinja_ctx *c, frame *f, const char *name)
{
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (!strcmp(f->names[i], name))
                return f->vals[i];
    int g = jinja_global_index(name);
    if (g >= 0) {
        jv *v = jv_new(c->arena, JV_BUILTIN);
        if (v)
            v->u.builtin = g;
        return v;
    }
    return jv_new(c->arena, JV_UNDEFINED);
}

/* ---- expressions ------------------------------------------------------------------------------------------ */

static jv *eval(jinja_ctx *c, frame *f, const jnode *n);
static int exec_body(jinja_ctx *c, frame *f, const jnode_list *body, jbuf *out);

static jv *undefined(jinja_ctx *c, const jnode *at)
{
    jv *v = jv_new(c->arena, JV_UNDEFINED);
    return v ? v : jinja_ctx_oom(c, at);
}

/* Python's normalisation of a (possibly negative) index into [0, n), or -1 out of range. */
static int64_t norm_index(int64_t i, size_t n)
{
    if (i < 0)
        i += (int64_t)n;
    return i >= 0 && (uint64_t)i < n ? i : -1;
}

/* loop.index and friends, made when read (a loop of a million items should not build a million dicts). */
static jv *loop_field(jinja_ctx *c, const jnode *at, const jv *loop, const char *name)
{
    jinja_arena *A = c->arena;
    int64_t i = (int64_t)loop->u.loop.index, n = (int64_t)loop->u.loop.items->u.list.n;
    jv **items = loop->u.loop.items->u.list.items;
    if (!strcmp(name, "index"))
        return jv_int(A, i + 1);
    if (!strcmp(name, "index0"))
        return jv_int(A, i);
    if (!strcmp(name, "revindex"))
        return jv_int(A, n - i);
    if (!strcmp(name, "revindex0"))
        return jv_int(A, n - i - 1);
    if (!strcmp(name, "first"))
        return jv_bool(A, i == 0);
    if (!strcmp(name, "last"))
        return jv_bool(A, i + 1 == n);
    if (!strcmp(name, "length"))
        return jv_int(A, n);
    if (!strcmp(name, "depth"))
        return jv_int(A, 1);
    if (!strcmp(name, "depth0"))
        return jv_int(A, 0);
    if (!strcmp(name, "previtem"))
        return i > 0 ? items[i - 1] : jv_new(A, JV_UNDEFINED);
    if (!strcmp(name, "nextitem"))
        return i + 1 < n ? items[i + 1] : jv_new(A, JV_UNDEFINED);
    if (!strcmp(name, "cycle") || !strcmp(name, "changed"))
        return jinja_ctx_fail(c, at, DSARL_E_UNSUPPORTED, "unsupported construct 'loop.%s'", name);
    return jv_new(A, JV_UNDEFINED);
}

static jv *get_item(jinja_ctx *c, const jnode *at, jv *obj, jv *key, bool attribute_first)
{
    if (obj->kind == JV_UNDEFINED)
        return jinja_ctx_fail(c, at, DSARL_E_INVALID, "reading '%s' of an undefined value",
                              key->kind == JV_STRING ? key->u.str.s : "[...]");
    if (key->kind == JV_STRING && attribute_first) {
        jv *m = jinja_get_method(c, obj, key->u.str.s);
        if (m || c->rc)
            return m;
    }
    if (obj->kind == JV_LOOP && key->kind == JV_STRING) {
        jv *v = loop_field(c, at, obj, key->u.str.s);
        if (v || c->rc)
            return v;
    } else if (obj->kind == JV_DICT || obj->kind == JV_NAMESPACE) {
        jv *v = jv_dict_get_value(obj, key);
        if (v)
            return v;
    } else if (obj->kind == JV_LIST && (key->kind == JV_INT || key->kind == JV_BOOL)) {
        int64_t i = norm_index(key->kind == JV_INT ? key->u.i : key->u.b, obj->u.list.n);
        if (i >= 0)
            return obj->u.list.items[i];
    } else if (obj->kind == JV_STRING && (key->kind == JV_INT || key->kind == JV_BOOL)) {
        size_t count = jutf8_count(obj->u.str.s, obj->u.str.n);
        int64_t i = norm_index(key->kind == JV_INT ? key->u.i : key->u.b, count);
        if (i >= 0) {
            size_t a = jutf8_offset(obj->u.str.s, obj->u.str.n, (size_t)i);
            size_t b = jutf8_offset(obj->u.str.s, obj->u.str.n, (size_t)i + 1);
            jv *v = jv_string(c->arena, obj->u.str.s + a, b - a);
            return v ? v : jinja_ctx_oom(c, at);
        }
    }
    if (key->kind == JV_STRING && !attribute_first) {
        jv *m = jinja_get_method(c, obj, key->u.str.s);
        if (m || c->rc)
            return m;
    }
    return undefined(c, at);
}

/* Python slice indices for length n: start, stop, step -> the positions taken. */
static jv *slice(jinja_ctx *c, const jnode *at, jv *obj, jv *a, jv *b, jv *s)
{
    int64_t step = 1;
    if (s && s->kind != JV_NONE) {
        if (s->kind != JV_INT || s->u.i == 0)
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "a slice step must be a nonzero integer");
        step = s->u.i;
    }
    bool is_str = obj->kind == JV_STRING;
    if (!is_str && obj->kind != JV_LIST)
        return obj->kind == JV_UNDEFINED
                   ? jinja_ctx_fail(c, at, DSARL_E_INVALID, "slicing an undefined value")
                   : jinja_ctx_fail(c, at, DSARL_E_INVALID, "cannot slice a %s", jv_type_name(obj));
    int64_t n = (int64_t)(is_str ? jutf8_count(obj->u.str.s, obj->u.str.n) : obj->u.list.n);
    int64_t bound[2];
    jv *ends[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        jv *e = ends[k];
        if (!e || e->kind == JV_NONE) {
            bound[k] = step > 0 ? (k ? n : 0) : (k ? -1 : n - 1);
            continue;
        }
        if (e->kind != JV_INT)
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "slice indices must be integers, not %s", jv_type_name(e));
        int64_t i = e->u.i < 0 ? e->u.i + n : e->u.i;
        if (step > 0)
            i = i < 0 ? 0 : i > n ? n : i;
        else
            i = i < -1 ? -1 : i > n - 1 ? n - 1 : i;
        bound[k] = i;
    }
    jv *out = jv_new(c->arena, is_str ? JV_STRING : JV_LIST);
    jbuf sb = new_buf(c);
    if (!out)
        return jinja_ctx_oom(c, at);
    for (int64_t i = bound[0]; step > 0 ? i < bound[1] : i > bound[1]; i += step) {
        if (is_str) {
            size_t x = jutf8_offset(obj->u.str.s, obj->u.str.n, (size_t)i);
            size_t y = jutf8_offset(obj->u.str.s, obj->u.str.n, (size_t)i + 1);
            jbuf_put(&sb, obj->u.str.s + x, y - x);
        } else if (jv_list_push(c->arena, out, obj->u.list.items[i]) < 0) {
            return jinja_ctx_oom(c, at);
        }
    }
    return is_str ? jinja_ctx_take(c, at, &sb) : out;
}

static bool is_num(const jv *v)
{
    return v->kind == JV_INT || v->kind == JV_FLOAT || v->kind == JV_BOOL;
}
static double num(const jv *v)
{
    return v->kind == JV_FLOAT ? v->u.f : v->kind == JV_INT ? (double)v->u.i : v->u.b;
}
static int64_t inum(const jv *v)
{
    return v->kind == JV_INT ? v->u.i : v->u.b;
}

static jv *arith(jinja_ctx *c, const jnode *at, const char *op, jv *x, jv *y)
{
    jinja_arena *A = c->arena;
    jv *r = NULL;
    if (!strcmp(op, "~")) {
        jbuf b = new_buf(c);
        jv_str(&b, x);
        jv_str(&b, y);
        return jinja_ctx_take(c, at, &b);
    }
    if (is_num(x) && is_num(y)) {
        bool ints = x->kind != JV_FLOAT && y->kind != JV_FLOAT;
        int64_t a = ints ? inum(x) : 0, b = ints ? inum(y) : 0, ri;
        double fa = num(x), fb = num(y);
        switch (op[0]) {
        case '+':
            if (ints && __builtin_add_overflow(a, b, &ri))
                goto overflow;
            r = ints ? jv_int(A, ri) : jv_float(A, fa + fb);
            break;
        case '-':
            if (ints && __builtin_sub_overflow(a, b, &ri))
                goto overflow;
            r = ints ? jv_int(A, ri) : jv_float(A, fa - fb);
            break;
        case '*':
            if (op[1] == '*') {
                if (ints && b >= 0) {
                    // by squaring; |a| >= 2 overflows within 63 steps, so a huge exponent ends fast
                    ri = 1;
                    if (a == 0 || a == 1)
                        ri = b == 0 ? 1 : a;
                    else if (a == -1)
                        ri = b % 2 ? -1 : 1;
                    else
                        for (int64_t base = a, e = b; e; e >>= 1) {
                            if ((e & 1) && __builtin_mul_overflow(ri, base, &ri))
                                goto overflow;
                            if (e > 1 && __builtin_mul_overflow(base, base, &base))
                                goto overflow;
                        }
                    r = jv_int(A, ri);
                } else {
                    r = jv_float(A, pow(fa, fb));
                }
                break;
            }
            if (ints && __builtin_mul_overflow(a, b, &ri))
                goto overflow;
            r = ints ? jv_int(A, ri) : jv_float(A, fa * fb);
            break;
        case '/':
            if (fb == 0.0)
                return jinja_ctx_fail(c, at, DSARL_E_INVALID, "division by zero");
            if (op[1] == '/') {
                if (ints) {
                    if (a == INT64_MIN && b == -1)
                        goto overflow;
                    int64_t q = a / b;
                    if ((a % b != 0) && ((a < 0) != (b < 0)))
                        q--;
                    r = jv_int(A, q);
                } else {
                    r = jv_float(A, floor(fa / fb));
                }
            } else {
                r = jv_float(A, fa / fb);
            }
            break;
        case '%':
            if (fb == 0.0)
                return jinja_ctx_fail(c, at, DSARL_E_INVALID, "modulo by zero");
            if (ints) {
                if (b == -1) {
                    r = jv_int(A, 0);
                } else {
                    int64_t m = a % b;
                    if (m != 0 && ((m < 0) != (b < 0)))
                        m += b;
                    r = jv_int(A, m);
                }
            } else {
                double m = fmod(fa, fb);
                if (m != 0 && ((m < 0) != (fb < 0)))
                    m += fb;
                r = jv_float(A, m);
            }
            break;
        }
        return r ? r : jinja_ctx_oom(c, at);
    }
    if (!strcmp(op, "+") && x->kind == JV_STRING && y->kind == JV_STRING) {
        jbuf b = new_buf(c);
        jbuf_put(&b, x->u.str.s, x->u.str.n);
        jbuf_put(&b, y->u.str.s, y->u.str.n);
        return jinja_ctx_take(c, at, &b);
    }
    if (!strcmp(op, "+") && x->kind == JV_LIST && y->kind == JV_LIST) {
        r = jv_new(A, JV_LIST);
        for (size_t i = 0; r && i < x->u.list.n + y->u.list.n; i++) {
            jv *item = i < x->u.list.n ? x->u.list.items[i] : y->u.list.items[i - x->u.list.n];
            if (jv_list_push(A, r, item) < 0)
                r = NULL;
        }
        return r ? r : jinja_ctx_oom(c, at);
    }
    if (!strcmp(op, "*") &&
        (x->kind == JV_STRING || x->kind == JV_LIST || y->kind == JV_STRING || y->kind == JV_LIST)) {
        jv *seq = x->kind == JV_STRING || x->kind == JV_LIST ? x : y, *count = seq == x ? y : x;
        if (count->kind != JV_INT && count->kind != JV_BOOL)
            goto type_error;
        int64_t k = inum(count) < 0 ? 0 : inum(count);
        size_t unit = seq->kind == JV_STRING ? seq->u.str.n : seq->u.list.n * sizeof(jv *);
        if (unit && (uint64_t)k > c->lim.max_output / unit)
            return jinja_ctx_fail(c, at, DSARL_E_INVALID,
                                  "repeating a %s %lld times passes the render's limit "
                                  "of %zu bytes",
                                  jv_type_name(seq), (long long)k, c->lim.max_output);
        if (seq->kind == JV_STRING) {
            jbuf b = new_buf(c);
            for (int64_t i = 0; i < k; i++)
                jbuf_put(&b, seq->u.str.s, seq->u.str.n);
            return jinja_ctx_take(c, at, &b);
        }
        r = jv_new(A, JV_LIST);
        for (int64_t i = 0; r && i < k; i++)
            for (size_t j = 0; r && j < seq->u.list.n; j++)
                if (jv_list_push(A, r, seq->u.list.items[j]) < 0)
                    r = NULL;
        return r ? r : jinja_ctx_oom(c, at);
    }
    if (!strcmp(op, "%") && x->kind == JV_STRING)
        return jinja_ctx_fail(c, at, DSARL_E_UNSUPPORTED,
                              "unsupported construct: printf-style '%%' formatting "
                              "of a string");
type_error:
    if (x->kind == JV_UNDEFINED || y->kind == JV_UNDEFINED)
        return jinja_ctx_fail(c, at, DSARL_E_INVALID, "'%s' on an undefined value", op);
    return jinja_ctx_fail(c, at, DSARL_E_INVALID, "unsupported operand types for %s: '%s' and '%s'", op,
                          jv_type_name(x), jv_type_name(y));
overflow:
    return jinja_ctx_fail(c, at, DSARL_E_UNSUPPORTED, "integer overflow in '%s' (integers are 64-bit here)", op);
}

/* x < y and friends: numbers, strings (UTF-8 byte order is code point order) and lists. */
static int order(jinja_ctx *c, const jnode *at, const char *op, const jv *x, const jv *y, int *out)
{
    if (is_num(x) && is_num(y)) {
        if (x->kind != JV_FLOAT && y->kind != JV_FLOAT)
            *out = (inum(x) > inum(y)) - (inum(x) < inum(y));
        else
            *out = (num(x) > num(y)) - (num(x) < num(y));
        return 0;
    }
    if (x->kind == JV_STRING && y->kind == JV_STRING) {
        size_t n = x->u.str.n < y->u.str.n ? x->u.str.n : y->u.str.n;
        int r = memcmp(x->u.str.s, y->u.str.s, n);
        *out = r ? (r > 0) - (r < 0) : (x->u.str.n > y->u.str.n) - (x->u.str.n < y->u.str.n);
        return 0;
    }
    if (x->kind == JV_LIST && y->kind == JV_LIST) {
        size_t n = x->u.list.n < y->u.list.n ? x->u.list.n : y->u.list.n;
        for (size_t i = 0; i < n; i++) {
            if (jv_equal(x->u.list.items[i], y->u.list.items[i]))
                continue;
            return order(c, at, op, x->u.list.items[i], y->u.list.items[i], out);
        }
        *out = (x->u.list.n > y->u.list.n) - (x->u.list.n < y->u.list.n);
        return 0;
    }
    jinja_ctx_fail(c, at, DSARL_E_INVALID, "'%s' not supported between '%s' and '%s'", op, jv_type_name(x),
                   jv_type_name(y));
    return -1;
}

static int contains(jinja_ctx *c, const jnode *at, const jv *item, const jv *seq, bool *out)
{
    *out = false;
    switch (seq->kind) {
    case JV_STRING:
        if (item->kind != JV_STRING) {
            jinja_ctx_fail(c, at, DSARL_E_INVALID, "'in <string>' requires a string on the left, not %s",
                           jv_type_name(item));
            return -1;
        }
        *out = item->u.str.n == 0 || memmem(seq->u.str.s, seq->u.str.n, item->u.str.s, item->u.str.n) != NULL;
        return 0;
    case JV_LIST:
        for (size_t i = 0; i < seq->u.list.n && !*out; i++)
            *out = jv_equal(item, seq->u.list.items[i]);
        return 0;
    case JV_DICT:
    case JV_NAMESPACE: *out = jv_dict_get_value(seq, item) != NULL; return 0;
    case JV_UNDEFINED: return 0;
    default:
        jinja_ctx_fail(c, at, DSARL_E_INVALID, "argument of type '%s' is not iterable", jv_type_name(seq));
        return -1;
    }
}

static jv *compare(jinja_ctx *c, frame *f, const jnode *n)
{
    jv *left = eval(c, f, n->kids.items[0]);
    bool result = true;
    for (size_t i = 0; left && i < n->n_names && result; i++) {
        jv *right = eval(c, f, n->kids.items[i + 1]);
        if (!right)
            return NULL;
        const char *op = n->names[i];
        if (!strcmp(op, "==") || !strcmp(op, "!=")) {
            result = jv_equal(left, right) == (op[0] == '=');
        } else if (!strcmp(op, "in") || !strcmp(op, "notin")) {
            bool in;
            if (contains(c, n, left, right, &in) < 0)
                return NULL;
            result = in == (op[0] == 'i');
        } else {
            int o;
            if (order(c, n, op, left, right, &o) < 0)
                return NULL;
            result = op[0] == '<' ? (op[1] ? o <= 0 : o < 0) : (op[1] ? o >= 0 : o > 0);
        }
        left = right;
    }
    if (!left)
        return NULL;
    jv *v = jv_bool(c->arena, result);
    return v ? v : jinja_ctx_oom(c, n);
}

static int eval_args(jinja_ctx *c, frame *f, const jnode *n, jargs *args)
{
    memset(args, 0, sizeof *args);
    args->n_pos = n->kids.n;
    args->n_kw = n->kids2.n;
    args->pos = jinja_alloc(c->arena, (args->n_pos + 1) * sizeof(jv *));
    args->kw = jinja_alloc(c->arena, (args->n_kw + 1) * sizeof(jv *));
    args->kw_names = n->names;
    if (!args->pos || !args->kw) {
        jinja_ctx_oom(c, n);
        return -1;
    }
    for (size_t i = 0; i < args->n_pos; i++)
        if (!(args->pos[i] = eval(c, f, n->kids.items[i])))
            return -1;
    for (size_t i = 0; i < args->n_kw; i++)
        if (!(args->kw[i] = eval(c, f, n->kids2.items[i])))
            return -1;
    return 0;
}

static jv *call_macro(jinja_ctx *c, const jnode *at, const jnode *m, const jargs *args)
{
    if (c->depth >= c->lim.max_depth)
        return jinja_ctx_fail(c, at, DSARL_E_INVALID, "macro '%s' nests deeper than %d calls", m->str,
                              c->lim.max_depth);
    if (jinja_ctx_count_iterations(c, at, 1) < 0)
        return NULL;
    if (args->n_pos > m->n_names)
        return jinja_ctx_fail(c, at, DSARL_E_INVALID, "macro '%s' takes %zu arguments, %zu given", m->str, m->n_names,
                              args->n_pos);
    frame *f = frame_new(c, c->root);
    if (!f)
        return jinja_ctx_oom(c, at);
    for (size_t k = 0; k < args->n_kw; k++) {
        size_t i = 0;
        while (i < m->n_names && strcmp(m->names[i], args->kw_names[k]))
            i++;
        if (i == m->n_names)
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "macro '%s' takes no argument '%s'", m->str,
                                  args->kw_names[k]);
        if (i < args->n_pos)
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "macro '%s' got argument '%s' twice", m->str,
                                  args->kw_names[k]);
    }
    for (size_t i = 0; i < m->n_names; i++) {
        jv *v = i < args->n_pos ? args->pos[i] : NULL;
        for (size_t k = 0; !v && k < args->n_kw; k++)
            if (!strcmp(m->names[i], args->kw_names[k]))
                v = args->kw[k];
        if (!v) {
            const jnode *def = m->kids2.items[i];
            v = def->kind == JN_BODY ? undefined(c, at) : eval(c, f, def);
        }
        if (!v || frame_set(c, f, m->names[i], v) < 0)
            return v ? jinja_ctx_oom(c, at) : NULL;
    }
    jbuf b = new_buf(c);
    c->depth++;
    int rc = exec_body(c, f, &m->kids, &b);
    c->depth--;
    if (rc < 0) {
        free(b.data);
        return NULL;
    }
    return jinja_ctx_take(c, at, &b);
}

static jv *eval_inner(jinja_ctx *c, frame *f, const jnode *n)
{
    jinja_arena *A = c->arena;
    switch (n->kind) {
    case JN_LITERAL: return n->literal;
    case JN_NAME: return lookup(c, f, n->str);
    case JN_LIST:
    case JN_TUPLE: {
        jv *l = jv_new(A, JV_LIST);
        if (!l)
            return jinja_ctx_oom(c, n);
        l->is_tuple = n->kind == JN_TUPLE;
        for (size_t i = 0; i < n->kids.n; i++) {
            jv *x = eval(c, f, n->kids.items[i]);
            if (!x)
                return NULL;
            if (jv_list_push(A, l, x) < 0)
                return jinja_ctx_oom(c, n);
        }
        return l;
    }
    case JN_DICT: {
        jv *d = jv_new(A, JV_DICT);
        if (!d)
            return jinja_ctx_oom(c, n);
        for (size_t i = 0; i + 1 < n->kids.n; i += 2) {
            jv *k = eval(c, f, n->kids.items[i]), *v = k ? eval(c, f, n->kids.items[i + 1]) : NULL;
            if (!v)
                return NULL;
            if (k->kind == JV_LIST || k->kind == JV_DICT || k->kind == JV_UNDEFINED)
                return jinja_ctx_fail(c, n, DSARL_E_INVALID, "a dict key cannot be a %s", jv_type_name(k));
            if (jv_dict_set(A, d, k, v) < 0)
                return jinja_ctx_oom(c, n);
        }
        return d;
    }
    case JN_GETATTR: {
        jv *obj = eval(c, f, n->a);
        if (!obj)
            return NULL;
        if (obj->kind == JV_UNDEFINED)
            return jinja_ctx_fail(c, n, DSARL_E_INVALID, "reading attribute '%s' of an undefined value", n->str);
        jv key = {.kind = JV_STRING, .u.str = {n->str, n->len}};
        return get_item(c, n, obj, &key, true);
    }
    case JN_GETITEM: {
        jv *obj = eval(c, f, n->a), *key = obj ? eval(c, f, n->b) : NULL;
        return key ? get_item(c, n, obj, key, false) : NULL;
    }
    case JN_SLICE: {
        jv *obj = eval(c, f, n->a);
        jv *a = obj && n->b ? eval(c, f, n->b) : NULL, *b = obj && n->c ? eval(c, f, n->c) : NULL;
        jv *s = obj && n->kids.n ? eval(c, f, n->kids.items[0]) : NULL;
        if (!obj || (n->b && !a) || (n->c && !b) || (n->kids.n && !s))
            return NULL;
        return slice(c, n, obj, a, b, s);
    }
    case JN_CALL: {
        jv *callee = eval(c, f, n->a);
        jargs args;
        if (!callee || eval_args(c, f, n, &args) < 0)
            return NULL;
        if (callee->kind == JV_MACRO)
            return call_macro(c, n, callee->u.macro, &args);
        if (callee->kind == JV_BUILTIN)
            return jinja_call_global(c, n, callee->u.builtin, &args);
        if (callee->kind == JV_METHOD)
            return jinja_call_method(c, n, callee, &args);
        if (callee->kind == JV_UNDEFINED)
            return jinja_ctx_fail(c, n, DSARL_E_INVALID, "calling '%s', which is undefined",
                                  n->a->kind == JN_NAME || n->a->kind == JN_GETATTR ? n->a->str : "a value");
        return jinja_ctx_fail(c, n, DSARL_E_INVALID, "'%s' object is not callable", jv_type_name(callee));
    }
    case JN_FILTER: {
        jv *v = eval(c, f, n->a);
        jargs args;
        if (!v || eval_args(c, f, n, &args) < 0)
            return NULL;
        return jinja_apply_filter(c, n, n->str, v, &args);
    }
    case JN_TEST: {
        jv *v = eval(c, f, n->a);
        jargs args;
        if (!v || eval_args(c, f, n, &args) < 0)
            return NULL;
        jv *r = jinja_apply_test(c, n, n->str, v, &args);
        if (r && n->negated)
            r = jv_bool(A, !r->u.b);
        return r ? r : c->rc ? NULL : jinja_ctx_oom(c, n);
    }
    case JN_NEG:
    case JN_POS: {
        jv *v = eval(c, f, n->a);
        if (!v)
            return NULL;
        if (!is_num(v))
            return jinja_ctx_fail(c, n, DSARL_E_INVALID, "bad operand type for unary %c: '%s'",
                                  n->kind == JN_NEG ? '-' : '+', jv_type_name(v));
        if (n->kind == JN_POS)
            return v->kind == JV_BOOL ? jv_int(A, v->u.b) : v;
        if (v->kind == JV_FLOAT)
            return jv_float(A, -v->u.f);
        if (inum(v) == INT64_MIN)
            return jinja_ctx_fail(c, n, DSARL_E_UNSUPPORTED, "integer overflow in unary '-'");
        return jv_int(A, -inum(v));
    }
    case JN_NOT: {
        jv *v = eval(c, f, n->a);
        return v ? jv_bool(A, !jv_truthy(v)) : NULL;
    }
    case JN_AND:
    case JN_OR: {
        jv *l = eval(c, f, n->a);
        if (!l)
            return NULL;
        if (jv_truthy(l) == (n->kind == JN_OR))
            return l;
        return eval(c, f, n->b);
    }
    case JN_BINARY: {
        jv *x = eval(c, f, n->a), *y = x ? eval(c, f, n->b) : NULL;
        return y ? arith(c, n, n->str, x, y) : NULL;
    }
    case JN_COMPARE: return compare(c, f, n);
    case JN_COND: {
        jv *t = eval(c, f, n->a);
        if (!t)
            return NULL;
        if (jv_truthy(t))
            return eval(c, f, n->b);
        return n->c ? eval(c, f, n->c) : undefined(c, n);
    }
    default: return jinja_ctx_fail(c, n, DSARL_E_INTERNAL, "statement node %d evaluated as an expression", n->kind);
    }
}

static jv *eval(jinja_ctx *c, frame *f, const jnode *n)
{
    jv *v = eval_inner(c, f, n);
    if (!v && c->rc == 0)
        jinja_ctx_oom(c, n);
    return v;
}

/* ---- statements ------------------------------------------------------------------------------------------- */

/* The items a for loop walks: a list's items, a dict's keys, a string's characters; nothing for undefined. */
static jv *iterable_items(jinja_ctx *c, const jnode *at, jv *v)
{
    if (v->kind == JV_LIST)
        return v;
    jv *l = jv_new(c->arena, JV_LIST);
    if (!l)
        return jinja_ctx_oom(c, at);
    if (v->kind == JV_DICT) {
        for (size_t i = 0; i < v->u.dict.n; i++)
            if (jv_list_push(c->arena, l, v->u.dict.keys[i]) < 0)
                return jinja_ctx_oom(c, at);
    } else if (v->kind == JV_STRING) {
        size_t count = jutf8_count(v->u.str.s, v->u.str.n);
        for (size_t i = 0; i < count; i++) {
            size_t a = jutf8_offset(v->u.str.s, v->u.str.n, i), b = jutf8_offset(v->u.str.s, v->u.str.n, i + 1);
            jv *ch = jv_string(c->arena, v->u.str.s + a, b - a);
            if (!ch || jv_list_push(c->arena, l, ch) < 0)
                return jinja_ctx_oom(c, at);
        }
    } else if (v->kind != JV_UNDEFINED) {
        return jinja_ctx_fail(c, at, DSARL_E_INVALID, "'%s' object is not iterable", jv_type_name(v));
    }
    return l;
}

static int bind_targets(jinja_ctx *c, const jnode *n, frame *f, jv *item)
{
    if (n->n_names == 1)
        return frame_set(c, f, n->names[0], item) < 0 ? (jinja_ctx_oom(c, n), -1) : 0;
    if (item->kind != JV_LIST || item->u.list.n != n->n_names) {
        jinja_ctx_fail(c, n, DSARL_E_INVALID, "cannot unpack a %s into %zu loop variables", jv_type_name(item),
                       n->n_names);
        return -1;
    }
    for (size_t i = 0; i < n->n_names; i++)
        if (frame_set(c, f, n->names[i], item->u.list.items[i]) < 0) {
            jinja_ctx_oom(c, n);
            return -1;
        }
    return 0;
}

static int exec_for(jinja_ctx *c, frame *f, const jnode *n, jbuf *out)
{
    jinja_arena *A = c->arena;
    jv *seq = eval(c, f, n->a);
    jv *items = seq ? iterable_items(c, n, seq) : NULL;
    if (!items)
        return EXEC_ERROR;
    if (n->b) { // {% for x in xs if cond %}: filter first, so loop.index and loop.length count what is kept
        jv *kept = jv_new(A, JV_LIST);
        if (!kept)
            return jinja_ctx_oom(c, n), EXEC_ERROR;
        for (size_t i = 0; i < items->u.list.n; i++) {
            frame *g = frame_new(c, f);
            if (!g || jinja_ctx_count_iterations(c, n, 1) < 0 || bind_targets(c, n, g, items->u.list.items[i]) < 0)
                return c->rc ? EXEC_ERROR : (jinja_ctx_oom(c, n), EXEC_ERROR);
            jv *keep = eval(c, g, n->b);
            if (!keep)
                return EXEC_ERROR;
            if (jv_truthy(keep) && jv_list_push(A, kept, items->u.list.items[i]) < 0)
                return jinja_ctx_oom(c, n), EXEC_ERROR;
        }
        items = kept;
    }
    size_t count = items->u.list.n;
    for (size_t i = 0; i < count; i++) {
        if (jinja_ctx_count_iterations(c, n, 1) < 0)
            return EXEC_ERROR;
        frame *g = frame_new(c, f);
        jv *loop = jv_new(A, JV_LOOP);
        if (!g || !loop)
            return jinja_ctx_oom(c, n), EXEC_ERROR;
        loop->u.loop.items = items;
        loop->u.loop.index = i;
        if (frame_set(c, g, "loop", loop) < 0)
            return jinja_ctx_oom(c, n), EXEC_ERROR;
        if (bind_targets(c, n, g, items->u.list.items[i]) < 0)
            return EXEC_ERROR;
        int rc = exec_body(c, g, &n->kids, out);
        if (rc == EXEC_ERROR)
            return rc;
        if (rc == EXEC_BREAK)
            break;
    }
    if (count == 0 && n->kids2.n)
        return exec_body(c, f, &n->kids2, out);
    return EXEC_OK;
}

static int exec_node(jinja_ctx *c, frame *f, const jnode *n, jbuf *out)
{
    switch (n->kind) {
    case JN_TEXT: jbuf_put(out, n->str, n->len); break;
    case JN_OUTPUT: {
        jv *v = eval(c, f, n->a);
        if (!v)
            return EXEC_ERROR;
        jv_str(out, v);
        break;
    }
    case JN_BODY: return exec_body(c, f, &n->kids, out);
    case JN_IF:
        for (const jnode *branch = n; branch;) {
            if (branch->kind == JN_BODY)
                return exec_body(c, f, &branch->kids, out);
            jv *t = eval(c, f, branch->a);
            if (!t)
                return EXEC_ERROR;
            if (jv_truthy(t))
                return exec_body(c, f, &branch->kids, out);
            branch = branch->b;
        }
        break;
    case JN_FOR: return exec_for(c, f, n, out);
    case JN_SET: {
        jv *v = eval(c, f, n->a);
        if (!v)
            return EXEC_ERROR;
        if (n->str) {
            jv *ns = lookup(c, f, n->names[0]);
            if (!ns)
                return jinja_ctx_oom(c, n), EXEC_ERROR;
            if (ns->kind != JV_NAMESPACE)
                return jinja_ctx_fail(c, n, DSARL_E_INVALID,
                                      "cannot assign attribute '%s' on '%s', which is a %s "
                                      "and not a namespace()",
                                      n->str, n->names[0], jv_type_name(ns)),
                       EXEC_ERROR;
            jv *key = jv_string(c->arena, n->str, n->len);
            if (!key || jv_dict_set(c->arena, ns, key, v) < 0)
                return jinja_ctx_oom(c, n), EXEC_ERROR;
        } else if (frame_set(c, f, n->names[0], v) < 0) {
            return jinja_ctx_oom(c, n), EXEC_ERROR;
        }
        break;
    }
    case JN_SET_BLOCK: {
        jbuf b = new_buf(c);
        int rc = exec_body(c, f, &n->kids, &b);
        if (rc < 0) {
            free(b.data);
            return rc;
        }
        jv *v = jinja_ctx_take(c, n, &b);
        if (!v || frame_set(c, f, n->names[0], v) < 0)
            return c->rc ? EXEC_ERROR : (jinja_ctx_oom(c, n), EXEC_ERROR);
        break;
    }
    case JN_MACRO: {
        jv *m = jv_new(c->arena, JV_MACRO);
        if (!m || frame_set(c, f, n->str, m) < 0)
            return jinja_ctx_oom(c, n), EXEC_ERROR;
        m->u.macro = n;
        break;
    }
    case JN_BREAK: return EXEC_BREAK;
    case JN_CONTINUE: return EXEC_CONTINUE;
    default:
        return jinja_ctx_fail(c, n, DSARL_E_INTERNAL, "expression node %d run as a statement", n->kind), EXEC_ERROR;
    }
    if (out->over) {
        jinja_ctx_fail(c, n, DSARL_E_INVALID, "the output passed %zu bytes (the render's limit)", out->limit);
        return EXEC_ERROR;
    }
    if (out->oom)
        return jinja_ctx_oom(c, n), EXEC_ERROR;
    return EXEC_OK;
}

static int exec_body(jinja_ctx *c, frame *f, const jnode_list *body, jbuf *out)
{
    for (size_t i = 0; i < body->n; i++) {
        int rc = exec_node(c, f, body->items[i], out);
        if (rc != EXEC_OK)
            return rc;
    }
    return EXEC_OK;
}

int jinja_render(const jinja_template *t, const json_t *vars, const jinja_limits *limits, char **out, size_t *len,
                 dsarl_error *err)
{
    *out = NULL;
    jinja_ctx c = {.t = t, .lim = limits ? *limits : jinja_default_limits(), .err = err};
    if (!(c.arena = jinja_arena_new(c.lim.max_memory)))
        return DSARL_FAIL(err, DSARL_E_NOMEM, "chat template %s: out of memory", t->name);
    frame *context = frame_new(&c, NULL);
    c.root = context ? frame_new(&c, context) : NULL;
    int rc = c.root ? 0 : DSARL_FAIL(err, DSARL_E_NOMEM, "chat template %s: out of memory", t->name);
    const char *key;
    const json_t *value;
    if (rc == 0 && vars) {
        json_object_foreach((json_t *)vars, key, value)
        {
            char *name = jinja_alloc(c.arena, strlen(key) + 1);
            jv *v = name ? jv_from_json(c.arena, value) : NULL;
            if (!v || frame_set(&c, context, strcpy(name, key), v) < 0) {
                rc =
                    DSARL_FAIL(err, DSARL_E_NOMEM, "chat template %s: out of memory converting the variables", t->name);
                break;
            }
        }
    }
    jbuf b = new_buf(&c);
    if (rc == 0 && exec_body(&c, c.root, &t->root->kids, &b) < 0)
        rc = c.rc ? c.rc : DSARL_FAIL(err, DSARL_E_INTERNAL, "chat template %s: render failed", t->name);
    jinja_arena_free(c.arena);
    if (rc == 0 && !b.data)
        jbuf_put(&b, "", 0);
    if (rc == 0 && b.oom)
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "chat template %s: out of memory", t->name);
    if (rc) {
        free(b.data);
        return rc;
    }
    *out = b.data;
    if (len)
        *len = b.len;
    return 0;
}
