/* jinja_parse.c: tokens -> tree, by recursive descent with Jinja's precedence (loosest first):
 *   a if cond else b  <  or  <  and  <  not  <  comparisons, in, not in  <  + -  <  ~  <  * / // %  <  **
 *   <  unary - +  <  postfix (.name [key] [a:b] (args))  with |filter and `is test` after each unary.
 * Everything outside the subset is refused here, at load, naming the construct and its line. */
#include "jinja_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NESTING 200 /* expression and block nesting: a hostile template cannot exhaust the C stack */

typedef struct parser {
    const char *name;
    jtok *toks;
    size_t n, pos;
    jinja_arena *arena;
    int depth;
    dsarl_error *err;
    int rc;
} parser;

static jtok *peek(parser *p)
{
    return &p->toks[p->pos];
}
static jtok *peek_at(parser *p, size_t k)
{
    return &p->toks[p->pos + k < p->n ? p->pos + k : p->n - 1];
}
static jtok *next(parser *p)
{
    jtok *t = &p->toks[p->pos];
    if (p->pos + 1 < p->n)
        p->pos++;
    return t;
}

static bool is_op(const jtok *t, const char *op)
{
    return t->kind == JT_OP && strcmp(t->text, op) == 0;
}
static bool is_name(const jtok *t, const char *name)
{
    return t->kind == JT_NAME && strcmp(t->text, name) == 0;
}

static void *fail(parser *p, int code, int line, const char *fmt, const char *arg)
{
    if (p->rc == 0) {
        char what[512];
        snprintf(what, sizeof what, fmt, arg);
        p->rc = DSARL_FAIL(p->err, code, "chat template %s: line %d: %s", p->name, line, what);
    }
    return NULL;
}

static const char *tok_desc(const jtok *t)
{
    switch (t->kind) {
    case JT_EOF: return "the end of the template";
    case JT_BLOCK_END: return "'%}'";
    case JT_VAR_END: return "'}}'";
    case JT_BLOCK_BEGIN: return "'{%'";
    case JT_VAR_BEGIN: return "'{{'";
    case JT_TEXT: return "template text";
    default: return t->text;
    }
}

static bool expect_op(parser *p, const char *op)
{
    if (is_op(peek(p), op)) {
        next(p);
        return true;
    }
    char what[96];
    snprintf(what, sizeof what, "expected '%s' but found '%%s'", op);
    fail(p, DSARL_E_INVALID, peek(p)->line, what, tok_desc(peek(p)));
    return false;
}

static jnode *node(parser *p, jnode_kind kind, int line)
{
    jnode *n = jinja_alloc(p->arena, sizeof *n);
    if (!n)
        return fail(p, DSARL_E_NOMEM, line, "out of memory%s", "");
    n->kind = kind;
    n->line = line;
    return n;
}

static char *dup(parser *p, const char *s, size_t n)
{
    char *d = jinja_alloc(p->arena, n + 1);
    if (!d)
        return fail(p, DSARL_E_NOMEM, 0, "out of memory%s", "");
    memcpy(d, s, n);
    return d;
}

static bool add(parser *p, jnode_list *l, jnode *item)
{
    if (!item)
        return false;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jnode **q = jinja_alloc(p->arena, cap * sizeof *q);
        if (!q) {
            fail(p, DSARL_E_NOMEM, item->line, "out of memory%s", "");
            return false;
        }
        if (l->n)
            memcpy(q, l->items, l->n * sizeof *q);
        l->items = q;
        l->cap = cap;
    }
    l->items[l->n++] = item;
    return true;
}

static bool add_name(parser *p, jnode *n, const char *name)
{
    char **q = jinja_alloc(p->arena, (n->n_names + 1) * sizeof *q);
    char *d = dup(p, name, strlen(name));
    if (!q || !d)
        return false;
    if (n->n_names)
        memcpy(q, n->names, n->n_names * sizeof *q);
    q[n->n_names++] = d;
    n->names = q;
    return true;
}

static jnode *parse_expr(parser *p);
static jnode *parse_or(parser *p);
static jnode *parse_unary(parser *p, bool with_filter);
static jnode *parse_primary(parser *p);

/* ---- expressions ------------------------------------------------------------------------------------------ */

/* Call arguments after '(' up to ')': positional into kids, keyword into kids2 with names. */
static bool parse_call_args(parser *p, jnode *call)
{
    while (!is_op(peek(p), ")")) {
        if (peek(p)->kind == JT_NAME && is_op(peek_at(p, 1), "=")) {
            const char *kw = next(p)->text;
            next(p);
            if (!add_name(p, call, kw) || !add(p, &call->kids2, parse_expr(p)))
                return false;
        } else if (is_op(peek(p), "*") || is_op(peek(p), "**")) {
            fail(p, DSARL_E_UNSUPPORTED, peek(p)->line, "unsupported construct '%s' argument unpacking", peek(p)->text);
            return false;
        } else {
            if (call->kids2.n) {
                fail(p, DSARL_E_INVALID, peek(p)->line, "a positional argument follows a keyword argument%s", "");
                return false;
            }
            if (!add(p, &call->kids, parse_expr(p)))
                return false;
        }
        if (!is_op(peek(p), ","))
            break;
        next(p);
    }
    return expect_op(p, ")");
}

static jnode *parse_subscript(parser *p, jnode *obj, int line)
{
    // obj[key] or obj[a:b:c]
    jnode *parts[3] = {NULL, NULL, NULL};
    int colons = 0;
    for (;;) {
        if (is_op(peek(p), "]"))
            break;
        if (is_op(peek(p), ":")) {
            if (++colons > 2)
                return fail(p, DSARL_E_INVALID, peek(p)->line, "a slice takes at most three parts%s", "");
            next(p);
            continue;
        }
        if (parts[colons])
            return fail(p, DSARL_E_INVALID, peek(p)->line, "expected ':' or ']' but found '%s'", tok_desc(peek(p)));
        if (!(parts[colons] = parse_expr(p)))
            return NULL;
    }
    if (!expect_op(p, "]"))
        return NULL;
    jnode *n = node(p, colons ? JN_SLICE : JN_GETITEM, line);
    if (!n)
        return NULL;
    n->a = obj;
    if (colons) {
        n->b = parts[0];
        n->c = parts[1];
        n->kids.n = 0;
        if (parts[2] && !add(p, &n->kids, parts[2]))
            return NULL;
    } else {
        if (!parts[0])
            return fail(p, DSARL_E_INVALID, line, "empty subscript '[]'%s", "");
        n->b = parts[0];
    }
    return n;
}

static jnode *parse_postfix(parser *p, jnode *n)
{
    while (n) {
        jtok *t = peek(p);
        if (is_op(t, ".")) {
            next(p);
            jtok *name = next(p);
            if (name->kind == JT_INT) { // x.0 is x[0] in Jinja
                jnode *key = node(p, JN_LITERAL, name->line);
                if (!key || !(key->literal = jv_int(p->arena, name->ival)))
                    return fail(p, DSARL_E_NOMEM, name->line, "out of memory%s", "");
                jnode *g = node(p, JN_GETITEM, name->line);
                if (!g)
                    return NULL;
                g->a = n;
                g->b = key;
                n = g;
                continue;
            }
            if (name->kind != JT_NAME)
                return fail(p, DSARL_E_INVALID, name->line, "expected an attribute name after '.' but found '%s'",
                            tok_desc(name));
            if (name->text[0] == '_')
                return fail(p, DSARL_E_UNSUPPORTED, name->line,
                            "unsupported construct: attribute '%s' (names "
                            "starting with '_' are private)",
                            name->text);
            if (is_op(peek(p), "(") && !jinja_is_method(name->text))
                return fail(p, DSARL_E_UNSUPPORTED, name->line, "unsupported method '.%s()'", name->text);
            jnode *g = node(p, JN_GETATTR, name->line);
            if (!g || !(g->str = dup(p, name->text, name->len)))
                return NULL;
            g->len = name->len;
            g->a = n;
            n = g;
        } else if (is_op(t, "[")) {
            next(p);
            n = parse_subscript(p, n, t->line);
        } else if (is_op(t, "(")) {
            next(p);
            jnode *call = node(p, JN_CALL, t->line);
            if (!call)
                return NULL;
            call->a = n;
            if (!parse_call_args(p, call))
                return NULL;
            n = call;
        } else {
            break;
        }
    }
    return n;
}

/* |filter(args) and `is [not] test args` after a unary expression. */
static jnode *parse_filters_and_tests(parser *p, jnode *n)
{
    while (n) {
        jtok *t = peek(p);
        if (is_op(t, "|")) {
            next(p);
            jtok *name = next(p);
            if (name->kind != JT_NAME)
                return fail(p, DSARL_E_INVALID, name->line, "expected a filter name after '|' but found '%s'",
                            tok_desc(name));
            // dotted filter names do not exist in the subset
            if (!jinja_is_filter(name->text))
                return fail(p, DSARL_E_UNSUPPORTED, name->line, "unsupported filter '%s'", name->text);
            jnode *f = node(p, JN_FILTER, name->line);
            if (!f || !(f->str = dup(p, name->text, name->len)))
                return NULL;
            f->len = name->len;
            f->a = n;
            if (is_op(peek(p), "(")) {
                next(p);
                f->filter_args = true;
                if (!parse_call_args(p, f))
                    return NULL;
            }
            n = f;
        } else if (is_name(t, "is")) {
            next(p);
            bool negated = false;
            if (is_name(peek(p), "not")) {
                next(p);
                negated = true;
            }
            jtok *name = next(p);
            if (name->kind != JT_NAME)
                return fail(p, DSARL_E_INVALID, name->line, "expected a test name after 'is' but found '%s'",
                            tok_desc(name));
            if (!jinja_is_test(name->text))
                return fail(p, DSARL_E_UNSUPPORTED, name->line, "unsupported test 'is %s'", name->text);
            jnode *f = node(p, JN_TEST, name->line);
            if (!f || !(f->str = dup(p, name->text, name->len)))
                return NULL;
            f->len = name->len;
            f->a = n;
            f->negated = negated;
            jtok *q = peek(p);
            if (is_op(q, "(")) {
                next(p);
                f->filter_args = true;
                if (!parse_call_args(p, f))
                    return NULL;
            } else if ((q->kind == JT_NAME || q->kind == JT_STRING || q->kind == JT_INT || q->kind == JT_FLOAT ||
                        is_op(q, "[") || is_op(q, "{")) &&
                       !is_name(q, "else") && !is_name(q, "or") && !is_name(q, "and") && !is_name(q, "if") &&
                       !is_name(q, "is") && !is_name(q, "in") && !is_name(q, "not")) {
                // one argument without parentheses: `x is divisibleby 3`, `x is sameas none`
                jnode *arg = parse_postfix(p, parse_primary(p));
                if (!add(p, &f->kids, arg))
                    return NULL;
            }
            n = f;
        } else {
            break;
        }
    }
    return n;
}

static jnode *literal(parser *p, jv *v, int line)
{
    jnode *n = node(p, JN_LITERAL, line);
    if (!n)
        return NULL;
    if (!v)
        return fail(p, DSARL_E_NOMEM, line, "out of memory%s", "");
    n->literal = v;
    return n;
}

static jnode *parse_primary(parser *p)
{
    jtok *t = next(p);
    if (t->kind == JT_NAME) {
        const char *s = t->text;
        if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "false") || !strcmp(s, "False"))
            return literal(p, jv_bool(p->arena, s[0] == 't' || s[0] == 'T'), t->line);
        if (!strcmp(s, "none") || !strcmp(s, "None"))
            return literal(p, jv_new(p->arena, JV_NONE), t->line);
        jnode *n = node(p, JN_NAME, t->line);
        if (n && (n->str = dup(p, t->text, t->len)))
            n->len = t->len;
        return n;
    }
    if (t->kind == JT_STRING) {
        // adjacent literals concatenate, as in Python
        size_t total = t->len;
        size_t k = p->pos;
        while (k < p->n && p->toks[k].kind == JT_STRING)
            total += p->toks[k++].len;
        char *buf = jinja_alloc(p->arena, total + 1);
        if (!buf)
            return fail(p, DSARL_E_NOMEM, t->line, "out of memory%s", "");
        memcpy(buf, t->text, t->len);
        size_t off = t->len;
        while (peek(p)->kind == JT_STRING) {
            jtok *u = next(p);
            memcpy(buf + off, u->text, u->len);
            off += u->len;
        }
        jv *v = jv_new(p->arena, JV_STRING);
        if (v) {
            v->u.str.s = buf;
            v->u.str.n = total;
        }
        return literal(p, v, t->line);
    }
    if (t->kind == JT_INT)
        return literal(p, jv_int(p->arena, t->ival), t->line);
    if (t->kind == JT_FLOAT)
        return literal(p, jv_float(p->arena, t->fval), t->line);
    if (is_op(t, "(")) {
        if (is_op(peek(p), ")")) {
            next(p);
            jnode *n = node(p, JN_TUPLE, t->line);
            return n;
        }
        jnode *first = parse_expr(p);
        if (!first)
            return NULL;
        if (is_op(peek(p), ")")) {
            next(p);
            return first;
        }
        jnode *tuple = node(p, JN_TUPLE, t->line);
        if (!tuple || !add(p, &tuple->kids, first))
            return NULL;
        while (is_op(peek(p), ",")) {
            next(p);
            if (is_op(peek(p), ")"))
                break;
            if (!add(p, &tuple->kids, parse_expr(p)))
                return NULL;
        }
        return expect_op(p, ")") ? tuple : NULL;
    }
    if (is_op(t, "[")) {
        jnode *list = node(p, JN_LIST, t->line);
        while (list && !is_op(peek(p), "]")) {
            if (!add(p, &list->kids, parse_expr(p)))
                return NULL;
            if (!is_op(peek(p), ","))
                break;
            next(p);
        }
        return list && expect_op(p, "]") ? list : NULL;
    }
    if (is_op(t, "{")) {
        jnode *dict = node(p, JN_DICT, t->line);
        while (dict && !is_op(peek(p), "}")) {
            if (!add(p, &dict->kids, parse_expr(p)) || !expect_op(p, ":") || !add(p, &dict->kids, parse_expr(p)))
                return NULL;
            if (!is_op(peek(p), ","))
                break;
            next(p);
        }
        return dict && expect_op(p, "}") ? dict : NULL;
    }
    return fail(p, DSARL_E_INVALID, t->line, "expected an expression but found '%s'", tok_desc(t));
}

static jnode *parse_unary(parser *p, bool with_filter)
{
    jtok *t = peek(p);
    jnode *n;
    if (++p->depth > MAX_NESTING)
        return fail(p, DSARL_E_UNSUPPORTED, t->line, "expressions nest deeper than %s levels", "200");
    if (is_op(t, "-") || is_op(t, "+")) {
        next(p);
        n = node(p, is_op(t, "-") ? JN_NEG : JN_POS, t->line);
        if (n && !(n->a = parse_unary(p, false)))
            n = NULL;
    } else {
        n = parse_postfix(p, parse_primary(p));
    }
    if (with_filter)
        n = parse_filters_and_tests(p, n);
    p->depth--;
    return n;
}

static jnode *binary(parser *p, const char *op, jnode *l, jnode *r, int line)
{
    if (!l || !r)
        return NULL;
    jnode *n = node(p, JN_BINARY, line);
    if (!n || !(n->str = dup(p, op, strlen(op))))
        return NULL;
    n->a = l;
    n->b = r;
    return n;
}

static jnode *parse_pow(parser *p)
{
    jnode *l = parse_unary(p, true);
    while (l && is_op(peek(p), "**")) {
        int line = next(p)->line;
        l = binary(p, "**", l, parse_unary(p, true), line);
    }
    return l;
}

static jnode *parse_math2(parser *p)
{
    jnode *l = parse_pow(p);
    while (l && (is_op(peek(p), "*") || is_op(peek(p), "/") || is_op(peek(p), "//") || is_op(peek(p), "%"))) {
        jtok *op = next(p);
        l = binary(p, op->text, l, parse_pow(p), op->line);
    }
    return l;
}

static jnode *parse_concat(parser *p)
{
    jnode *l = parse_math2(p);
    while (l && is_op(peek(p), "~")) {
        int line = next(p)->line;
        l = binary(p, "~", l, parse_math2(p), line);
    }
    return l;
}

static jnode *parse_math1(parser *p)
{
    jnode *l = parse_concat(p);
    while (l && (is_op(peek(p), "+") || is_op(peek(p), "-"))) {
        jtok *op = next(p);
        l = binary(p, op->text, l, parse_concat(p), op->line);
    }
    return l;
}

/* a < b <= c ... as a chain: kids are operands, names the operators ("in", "notin", "==", ...). */
static jnode *parse_compare(parser *p)
{
    jnode *first = parse_math1(p);
    if (!first)
        return NULL;
    jnode *cmp = NULL;
    for (;;) {
        jtok *t = peek(p);
        const char *op = NULL;
        if (t->kind == JT_OP && (!strcmp(t->text, "==") || !strcmp(t->text, "!=") || !strcmp(t->text, "<") ||
                                 !strcmp(t->text, ">") || !strcmp(t->text, "<=") || !strcmp(t->text, ">=")))
            op = t->text;
        else if (is_name(t, "in"))
            op = "in";
        else if (is_name(t, "not") && is_name(peek_at(p, 1), "in"))
            op = "notin";
        if (!op)
            break;
        next(p);
        if (!strcmp(op, "notin"))
            next(p);
        if (!cmp) {
            cmp = node(p, JN_COMPARE, t->line);
            if (!cmp || !add(p, &cmp->kids, first))
                return NULL;
        }
        if (!add_name(p, cmp, op) || !add(p, &cmp->kids, parse_math1(p)))
            return NULL;
    }
    return cmp ? cmp : first;
}

static jnode *parse_not(parser *p)
{
    if (is_name(peek(p), "not")) {
        int line = next(p)->line;
        if (++p->depth > MAX_NESTING)
            return fail(p, DSARL_E_UNSUPPORTED, line, "expressions nest deeper than %s levels", "200");
        jnode *n = node(p, JN_NOT, line);
        if (n && !(n->a = parse_not(p)))
            n = NULL;
        p->depth--;
        return n;
    }
    return parse_compare(p);
}

static jnode *parse_and(parser *p)
{
    jnode *l = parse_not(p);
    while (l && is_name(peek(p), "and")) {
        int line = next(p)->line;
        jnode *n = node(p, JN_AND, line);
        if (!n || !(n->b = parse_not(p)))
            return NULL;
        n->a = l;
        l = n;
    }
    return l;
}

static jnode *parse_or(parser *p)
{
    jnode *l = parse_and(p);
    while (l && is_name(peek(p), "or")) {
        int line = next(p)->line;
        jnode *n = node(p, JN_OR, line);
        if (!n || !(n->b = parse_and(p)))
            return NULL;
        n->a = l;
        l = n;
    }
    return l;
}

/* a if cond else b (else optional: undefined). */
static jnode *parse_expr(parser *p)
{
    if (++p->depth > MAX_NESTING)
        return fail(p, DSARL_E_UNSUPPORTED, peek(p)->line, "expressions nest deeper than %s levels", "200");
    jnode *n = parse_or(p);
    while (n && is_name(peek(p), "if")) {
        int line = next(p)->line;
        jnode *c = node(p, JN_COND, line);
        if (!c || !(c->a = parse_or(p)))
            return NULL;
        c->b = n;
        if (is_name(peek(p), "else")) {
            next(p);
            if (!(c->c = parse_expr(p)))
                return NULL;
        }
        n = c;
    }
    p->depth--;
    return n;
}

/* ---- statements ------------------------------------------------------------------------------------------- */

static bool expect_block_end(parser *p)
{
    if (peek(p)->kind == JT_BLOCK_END) {
        next(p);
        return true;
    }
    fail(p, DSARL_E_INVALID, peek(p)->line, "expected '%%}' but found '%s'", tok_desc(peek(p)));
    return false;
}

/* Statements until one of the end tags (names, NULL-terminated); leaves the parser after "{% endtag" so the
 * caller reads the rest of that tag. *which gets the tag that ended it. */
static jnode *parse_body(parser *p, const char *const *ends, const char **which);

static const char *const unsupported_tags[] = {"include", "import",    "from", "extends",    "block",
                                               "call",    "filter",    "with", "autoescape", "do",
                                               "trans",   "pluralize", "print"};

static jnode *parse_statement(parser *p, jtok *name)
{
    int line = name->line;
    const char *tag = name->text;
    if (!strcmp(tag, "if") || !strcmp(tag, "elif")) {
        jnode *n = node(p, JN_IF, line);
        if (!n || !(n->a = parse_expr(p)) || !expect_block_end(p))
            return NULL;
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        const char *which;
        jnode *body = parse_body(p, ends, &which);
        if (!body)
            return NULL;
        n->kids = body->kids;
        if (!strcmp(which, "elif")) {
            jtok elif = {.kind = JT_NAME, .text = (char *)"elif", .line = peek(p)->line};
            if (!(n->b = parse_statement(p, &elif)))
                return NULL;
        } else if (!strcmp(which, "else")) {
            static const char *const end_if[] = {"endif", NULL};
            if (!expect_block_end(p) || !(n->b = parse_body(p, end_if, &which)) || !expect_block_end(p))
                return NULL;
        } else if (!expect_block_end(p)) {
            return NULL;
        }
        return n;
    }
    if (!strcmp(tag, "for")) {
        jnode *n = node(p, JN_FOR, line);
        if (!n)
            return NULL;
        do {
            jtok *target = next(p);
            if (target->kind != JT_NAME)
                return fail(p, DSARL_E_INVALID, target->line, "expected a loop variable name but found '%s'",
                            tok_desc(target));
            if (!add_name(p, n, target->text))
                return NULL;
        } while (is_op(peek(p), ",") && next(p));
        if (!is_name(peek(p), "in"))
            return fail(p, DSARL_E_INVALID, peek(p)->line, "expected 'in' but found '%s'", tok_desc(peek(p)));
        next(p);
        if (!(n->a = parse_or(p))) // Jinja parses the iterable without a bare `if`, which filters the loop
            return NULL;
        if (is_name(peek(p), "if")) {
            next(p);
            if (!(n->b = parse_expr(p)))
                return NULL;
        }
        if (is_name(peek(p), "recursive"))
            return fail(p, DSARL_E_UNSUPPORTED, peek(p)->line, "unsupported construct '%s' loops", "recursive");
        if (!expect_block_end(p))
            return NULL;
        static const char *const ends[] = {"else", "endfor", NULL};
        const char *which;
        jnode *body = parse_body(p, ends, &which);
        if (!body)
            return NULL;
        n->kids = body->kids;
        if (!strcmp(which, "else")) {
            static const char *const end_for[] = {"endfor", NULL};
            jnode *els;
            if (!expect_block_end(p) || !(els = parse_body(p, end_for, &which)))
                return NULL;
            n->kids2 = els->kids;
        }
        return expect_block_end(p) ? n : NULL;
    }
    if (!strcmp(tag, "set")) {
        jtok *target = next(p);
        if (target->kind != JT_NAME)
            return fail(p, DSARL_E_INVALID, target->line, "expected a variable name after 'set' but found '%s'",
                        tok_desc(target));
        jnode *n = node(p, JN_SET, line);
        if (!n || !add_name(p, n, target->text))
            return NULL;
        if (is_op(peek(p), ".")) { // set ns.attr = value
            next(p);
            jtok *attr = next(p);
            if (attr->kind != JT_NAME || attr->text[0] == '_')
                return fail(p, DSARL_E_INVALID, attr->line, "expected an attribute name after '.' but found '%s'",
                            tok_desc(attr));
            if (!(n->str = dup(p, attr->text, attr->len)))
                return NULL;
            n->len = attr->len;
        } else if (is_op(peek(p), ",")) {
            return fail(p, DSARL_E_UNSUPPORTED, line, "unsupported construct '%s' (set of several names)",
                        "set a, b = ...");
        }
        if (peek(p)->kind == JT_BLOCK_END && !n->str) { // {% set x %}...{% endset %}
            next(p);
            static const char *const ends[] = {"endset", NULL};
            const char *which;
            jnode *body = parse_body(p, ends, &which);
            if (!body || !expect_block_end(p))
                return NULL;
            n->kind = JN_SET_BLOCK;
            n->kids = body->kids;
            return n;
        }
        if (!expect_op(p, "=") || !(n->a = parse_expr(p)))
            return NULL;
        if (is_op(peek(p), ","))
            return fail(p, DSARL_E_UNSUPPORTED, peek(p)->line,
                        "unsupported construct '%s' (a tuple without "
                        "parentheses)",
                        "set x = a, b");
        return expect_block_end(p) ? n : NULL;
    }
    if (!strcmp(tag, "macro")) {
        jtok *mname = next(p);
        if (mname->kind != JT_NAME)
            return fail(p, DSARL_E_INVALID, mname->line, "expected a macro name but found '%s'", tok_desc(mname));
        jnode *n = node(p, JN_MACRO, line);
        if (!n || !(n->str = dup(p, mname->text, mname->len)) || !expect_op(p, "("))
            return NULL;
        n->len = mname->len;
        // parameters: names with optional defaults; kids2[i] is the default of names[i] (NULL node = none)
        while (!is_op(peek(p), ")")) {
            jtok *param = next(p);
            if (param->kind != JT_NAME)
                return fail(p, DSARL_E_INVALID, param->line, "expected a macro parameter name but found '%s'",
                            tok_desc(param));
            if (!add_name(p, n, param->text))
                return NULL;
            jnode *def = NULL;
            if (is_op(peek(p), "=")) {
                next(p);
                if (!(def = parse_expr(p)))
                    return NULL;
            } else if (n->kids2.n && n->kids2.items[n->kids2.n - 1]->kind != JN_BODY) {
                return fail(p, DSARL_E_INVALID, param->line,
                            "macro parameter '%s' without a default follows "
                            "one with a default",
                            param->text);
            }
            if (!def && !(def = node(p, JN_BODY, param->line))) // JN_BODY marks "no default"
                return NULL;
            if (!add(p, &n->kids2, def))
                return NULL;
            if (!is_op(peek(p), ","))
                break;
            next(p);
        }
        if (!expect_op(p, ")") || !expect_block_end(p))
            return NULL;
        static const char *const ends[] = {"endmacro", NULL};
        const char *which;
        jnode *body = parse_body(p, ends, &which);
        if (!body)
            return NULL;
        if (peek(p)->kind == JT_NAME) // {% endmacro name %}
            next(p);
        n->kids = body->kids;
        return expect_block_end(p) ? n : NULL;
    }
    if (!strcmp(tag, "break") || !strcmp(tag, "continue")) {
        jnode *n = node(p, tag[0] == 'b' ? JN_BREAK : JN_CONTINUE, line);
        return n && expect_block_end(p) ? n : NULL;
    }
    if (!strcmp(tag, "generation")) { // transformers' assistant-mask marker: renders its body
        if (!expect_block_end(p))
            return NULL;
        static const char *const ends[] = {"endgeneration", NULL};
        const char *which;
        jnode *body = parse_body(p, ends, &which);
        return body && expect_block_end(p) ? body : NULL;
    }
    for (size_t i = 0; i < sizeof unsupported_tags / sizeof unsupported_tags[0]; i++)
        if (!strcmp(tag, unsupported_tags[i]))
            return fail(p, DSARL_E_UNSUPPORTED, line, "unsupported construct '{%% %s %%}'", tag);
    return fail(p, DSARL_E_INVALID, line, "unknown tag '{%% %s %%}' here", tag);
}

static jnode *parse_body(parser *p, const char *const *ends, const char **which)
{
    jnode *body = node(p, JN_BODY, peek(p)->line);
    if (!body)
        return NULL;
    if (++p->depth > MAX_NESTING)
        return fail(p, DSARL_E_UNSUPPORTED, peek(p)->line, "blocks nest deeper than %s levels", "200");
    for (;;) {
        jtok *t = next(p);
        if (t->kind == JT_EOF) {
            if (!ends) {
                p->depth--;
                return body;
            }
            char what[128];
            size_t last = 0;
            while (ends[last + 1])
                last++;
            snprintf(what, sizeof what, "the template ends before '{%% %s %%}'", ends[last]);
            return fail(p, DSARL_E_INVALID, t->line, "%s", what);
        }
        if (t->kind == JT_TEXT) {
            jnode *n = node(p, JN_TEXT, t->line);
            if (!n || !(n->str = dup(p, t->text, t->len)) || !add(p, &body->kids, n))
                return NULL;
            n->len = t->len;
        } else if (t->kind == JT_VAR_BEGIN) {
            jnode *n = node(p, JN_OUTPUT, t->line);
            if (!n || !(n->a = parse_expr(p)))
                return NULL;
            if (peek(p)->kind != JT_VAR_END)
                return fail(p, DSARL_E_INVALID, peek(p)->line, "expected '}}' but found '%s'", tok_desc(peek(p)));
            next(p);
            if (!add(p, &body->kids, n))
                return NULL;
        } else if (t->kind == JT_BLOCK_BEGIN) {
            jtok *name = next(p);
            if (name->kind != JT_NAME)
                return fail(p, DSARL_E_INVALID, name->line, "expected a tag name after '{%%' but found '%s'",
                            tok_desc(name));
            for (size_t i = 0; ends && ends[i]; i++)
                if (!strcmp(name->text, ends[i])) {
                    *which = ends[i];
                    p->depth--;
                    return body;
                }
            if (!strncmp(name->text, "end", 3) || !strcmp(name->text, "elif") || !strcmp(name->text, "else"))
                return fail(p, DSARL_E_INVALID, name->line, "'{%% %s %%}' has no open block to close here", name->text);
            if (!add(p, &body->kids, parse_statement(p, name)))
                return NULL;
        } else {
            return fail(p, DSARL_E_INVALID, t->line, "unexpected '%s'", tok_desc(t));
        }
    }
}

int jinja_compile(const char *name, const char *source, size_t len, jinja_template **out, dsarl_error *err)
{
    *out = NULL;
    jinja_template *t = calloc(1, sizeof *t);
    if (!t || !(t->name = strdup(name)) || !(t->arena = jinja_arena_new((size_t)1 << 30))) {
        jinja_template_free(t);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "chat template %s: out of memory", name);
    }
    jtok_list toks;
    int rc = jinja_lex(name, source, len, &toks, err);
    if (rc == 0) {
        parser p = {t->name, toks.items, toks.n, 0, t->arena, 0, err, 0};
        t->root = parse_body(&p, NULL, NULL);
        rc = p.rc;
        jinja_tokens_free(&toks);
    }
    if (rc) {
        jinja_template_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void jinja_template_free(jinja_template *t)
{
    if (!t)
        return;
    jinja_arena_free(t->arena);
    free(t->name);
    free(t);
}
