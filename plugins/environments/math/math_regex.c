/* math_regex.c: the matcher of math_regex.h. A pattern is parsed into a small tree, then compiled into
 * instructions (CHAR, CLASS, SPLIT preferring its first branch, SAVE of a capture slot, ...) that a backtracking
 * executor runs with an explicit stack: a SPLIT pushes its second branch, a SAVE pushes the slot's old value so
 * that backtracking restores it. Counted repeats {m,n} are unrolled, which keeps the executor trivial; the
 * patterns hf_math_verify needs stay a few thousand instructions long. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include "math_regex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- UTF-8 ------------------------------------------------------------------------------------------------- */

uint32_t *mre_decode(const char *s, size_t bytes, long *n)
{
    uint32_t *out = malloc((bytes + 1) * sizeof *out);
    if (!out)
        return NULL;
    const unsigned char *u = (const unsigned char *)s;
    long k = 0;
    for (size_t i = 0; i < bytes;) {
        unsigned c = u[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = len > 0 && i + len <= bytes;
        for (size_t j = 1; ok && j < len; j++)
            ok = (u[i + j] & 0xC0) == 0x80;
        if (!ok) {
            out[k++] = 0xFFFD;
            i++;
            continue;
        }
        uint32_t v = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
        for (size_t j = 1; j < len; j++)
            v = (v << 6) | (u[i + j] & 0x3F);
        out[k++] = v;
        i += len;
    }
    *n = k;
    return out;
}

char *mre_encode(const uint32_t *cp, long n)
{
    char *out = malloc((size_t)n * 4 + 1);
    if (!out)
        return NULL;
    size_t k = 0;
    for (long i = 0; i < n; i++) {
        uint32_t c = cp[i];
        if (c < 0x80) {
            out[k++] = (char)c;
        } else if (c < 0x800) {
            out[k++] = (char)(0xC0 | (c >> 6));
            out[k++] = (char)(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            out[k++] = (char)(0xE0 | (c >> 12));
            out[k++] = (char)(0x80 | ((c >> 6) & 0x3F));
            out[k++] = (char)(0x80 | (c & 0x3F));
        } else {
            out[k++] = (char)(0xF0 | (c >> 18));
            out[k++] = (char)(0x80 | ((c >> 12) & 0x3F));
            out[k++] = (char)(0x80 | ((c >> 6) & 0x3F));
            out[k++] = (char)(0x80 | (c & 0x3F));
        }
    }
    out[k] = '\0';
    return out;
}

int mre_is_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static int is_digit(uint32_t c) { return c >= '0' && c <= '9'; }

/* Python's \w, approximated outside ASCII: any non-space code point above U+007F counts as a letter. */
static int is_word(uint32_t c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           (c >= 0x80 && !mre_is_space(c));
}

static uint32_t fold(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* ---- program ----------------------------------------------------------------------------------------------- */

enum { I_CHAR, I_ANY, I_ANYNL, I_CLASS, I_SPLIT, I_JMP, I_SAVE, I_BOL, I_EOL, I_WORDB, I_NWORDB, I_NLOOKAHEAD,
       I_NLOOKBEHIND, I_MATCH };

typedef struct inst {
    uint8_t op, icase;
    int x, y;   /* SPLIT: preferred, other; JMP: x; SAVE: slot; CLASS: class; LOOK: y = continue, x = length */
    uint32_t c; /* CHAR */
} inst;

enum { CB_DIGIT = 1, CB_NDIGIT = 2, CB_SPACE = 4, CB_NSPACE = 8, CB_WORD = 16, CB_NWORD = 32 };

typedef struct cclass {
    int neg;
    unsigned builtins;
    int first, count; /* ranges in prog->ranges */
} cclass;

#define MRE_MAX_GROUPS 128

struct mre_prog {
    inst *code;
    int ncode, capcode;
    cclass *classes;
    int nclasses, capclasses;
    uint32_t (*ranges)[2];
    int nranges, capranges;
    int ngroups;
    char *names[MRE_MAX_GROUPS];
    unsigned flags;
    /* which code points can start a match: first[c] for ASCII c, first_high for anything above; all set when
     * the start is not a fixed set (., negated classes, anchors) */
    uint8_t first[128], first_high, any_start;
};

/* ---- parse tree ---------------------------------------------------------------------------------------------- */

enum { A_CHAR, A_ANY, A_CLASS, A_CAT, A_ALT, A_REP, A_GROUP, A_BOL, A_EOL, A_WORDB, A_NWORDB, A_NLOOK, A_NLOOKB,
       A_EMPTY };

typedef struct ast {
    int kind, icase, cls, min, max, greedy, group;
    uint32_t ch;
    struct ast *child, *next; /* CAT/ALT: children list; REP/GROUP/LOOK: child */
} ast;

typedef struct parser {
    const uint32_t *p;
    long i, n;
    mre_prog *prog;
    int icase;
    char *err;
    size_t errlen;
    int failed;
    ast **all; /* every node, for freeing */
    int nall, capall;
} parser;

static ast *node(parser *ps, int kind)
{
    if (ps->failed)
        return NULL;
    if (ps->nall == ps->capall) {
        int cap = ps->capall ? ps->capall * 2 : 64;
        ast **a = realloc(ps->all, (size_t)cap * sizeof *a);
        if (!a) {
            ps->failed = 1;
            snprintf(ps->err, ps->errlen, "out of memory");
            return NULL;
        }
        ps->all = a;
        ps->capall = cap;
    }
    ast *n = calloc(1, sizeof *n);
    if (!n) {
        ps->failed = 1;
        snprintf(ps->err, ps->errlen, "out of memory");
        return NULL;
    }
    n->kind = kind;
    n->icase = ps->icase;
    n->group = -1;
    ps->all[ps->nall++] = n;
    return n;
}

static void perr(parser *ps, const char *what)
{
    if (!ps->failed)
        snprintf(ps->err, ps->errlen, "regex: %s at offset %ld", what, ps->i);
    ps->failed = 1;
}

static int add_range(parser *ps, uint32_t lo, uint32_t hi)
{
    mre_prog *p = ps->prog;
    if (p->nranges == p->capranges) {
        int cap = p->capranges ? p->capranges * 2 : 32;
        void *r = realloc(p->ranges, (size_t)cap * sizeof *p->ranges);
        if (!r) {
            perr(ps, "out of memory");
            return -1;
        }
        p->ranges = r;
        p->capranges = cap;
    }
    p->ranges[p->nranges][0] = lo;
    p->ranges[p->nranges][1] = hi;
    p->nranges++;
    return 0;
}

static int new_class(parser *ps)
{
    mre_prog *p = ps->prog;
    if (p->nclasses == p->capclasses) {
        int cap = p->capclasses ? p->capclasses * 2 : 16;
        cclass *c = realloc(p->classes, (size_t)cap * sizeof *c);
        if (!c) {
            perr(ps, "out of memory");
            return -1;
        }
        p->classes = c;
        p->capclasses = cap;
    }
    cclass *c = &p->classes[p->nclasses];
    memset(c, 0, sizeof *c);
    c->first = p->nranges;
    return p->nclasses++;
}

static uint32_t escape_char(uint32_t c)
{
    switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    default: return c;
    }
}

static unsigned builtin_of(uint32_t c)
{
    switch (c) {
    case 'd': return CB_DIGIT;
    case 'D': return CB_NDIGIT;
    case 's': return CB_SPACE;
    case 'S': return CB_NSPACE;
    case 'w': return CB_WORD;
    case 'W': return CB_NWORD;
    default: return 0;
    }
}

static ast *parse_class(parser *ps)
{
    /* at the char after '[' */
    int ci = new_class(ps);
    if (ci < 0)
        return NULL;
    cclass *cls = &ps->prog->classes[ci];
    if (ps->i < ps->n && ps->p[ps->i] == '^') {
        cls->neg = 1;
        ps->i++;
    }
    int first = 1;
    while (ps->i < ps->n && (ps->p[ps->i] != ']' || first)) {
        first = 0;
        uint32_t c = ps->p[ps->i++];
        if (c == '\\' && ps->i < ps->n) {
            uint32_t e = ps->p[ps->i++];
            unsigned b = builtin_of(e);
            if (b) {
                ps->prog->classes[ci].builtins |= b;
                continue;
            }
            c = escape_char(e);
        }
        uint32_t hi = c;
        if (ps->i + 1 < ps->n && ps->p[ps->i] == '-' && ps->p[ps->i + 1] != ']') {
            ps->i++;
            hi = ps->p[ps->i++];
            if (hi == '\\' && ps->i < ps->n)
                hi = escape_char(ps->p[ps->i++]);
        }
        if (add_range(ps, c, hi) < 0)
            return NULL;
        ps->prog->classes[ci].count++;
    }
    if (ps->i >= ps->n) {
        perr(ps, "unterminated [");
        return NULL;
    }
    ps->i++; /* ']' */
    ast *a = node(ps, A_CLASS);
    if (a)
        a->cls = ci;
    return a;
}

static ast *parse_alt(parser *ps);

static int parse_int(parser *ps, int *out)
{
    long start = ps->i;
    int v = 0;
    while (ps->i < ps->n && is_digit(ps->p[ps->i]) && v < 100000)
        v = v * 10 + (int)(ps->p[ps->i++] - '0');
    *out = v;
    return ps->i > start;
}

/* A {m}, {m,}, {,n} or {m,n} quantifier at ps->i ('{'); 0 (position unchanged) when the brace is a literal. */
static int parse_braces(parser *ps, int *min, int *max)
{
    long save = ps->i;
    ps->i++;
    int a = 0, b = -1;
    int has_a = parse_int(ps, &a);
    if (ps->i < ps->n && ps->p[ps->i] == '}') {
        if (!has_a) {
            ps->i = save;
            return 0;
        }
        ps->i++;
        *min = *max = a;
        return 1;
    }
    if (ps->i < ps->n && ps->p[ps->i] == ',') {
        ps->i++;
        int has_b = parse_int(ps, &b);
        if (ps->i < ps->n && ps->p[ps->i] == '}' && (has_a || has_b)) {
            ps->i++;
            *min = has_a ? a : 0;
            *max = has_b ? b : -1;
            return 1;
        }
    }
    ps->i = save;
    return 0;
}

static ast *parse_atom(parser *ps)
{
    uint32_t c = ps->p[ps->i++];
    ast *a = NULL;
    switch (c) {
    case '.':
        return node(ps, A_ANY);
    case '^':
        return node(ps, A_BOL);
    case '$':
        return node(ps, A_EOL);
    case '[':
        return parse_class(ps);
    case '(': {
        int kind = A_GROUP, group = -1, saved_icase = ps->icase;
        char name[64] = "";
        if (ps->i < ps->n && ps->p[ps->i] == '?') {
            ps->i++;
            uint32_t k = ps->i < ps->n ? ps->p[ps->i] : 0;
            if (k == ':') {
                ps->i++;
            } else if (k == 'i' && ps->i + 1 < ps->n && ps->p[ps->i + 1] == ':') {
                ps->i += 2;
                ps->icase = 1;
            } else if (k == '!') {
                ps->i++;
                kind = A_NLOOK;
            } else if (k == '<' && ps->i + 1 < ps->n && ps->p[ps->i + 1] == '!') {
                ps->i += 2;
                kind = A_NLOOKB;
            } else if (k == 'P' && ps->i + 1 < ps->n && ps->p[ps->i + 1] == '<') {
                ps->i += 2;
                size_t k2 = 0;
                while (ps->i < ps->n && ps->p[ps->i] != '>' && k2 + 1 < sizeof name)
                    name[k2++] = (char)ps->p[ps->i++];
                name[k2] = '\0';
                if (ps->i >= ps->n || ps->p[ps->i] != '>') {
                    perr(ps, "bad group name");
                    return NULL;
                }
                ps->i++;
                group = ps->prog->ngroups;
            } else {
                perr(ps, "unsupported group kind");
                return NULL;
            }
        } else {
            group = ps->prog->ngroups;
        }
        if (group >= 0) {
            if (group >= MRE_MAX_GROUPS) {
                perr(ps, "too many groups");
                return NULL;
            }
            ps->prog->ngroups++;
            if (name[0]) {
                ps->prog->names[group] = strdup(name);
                if (!ps->prog->names[group]) {
                    perr(ps, "out of memory");
                    return NULL;
                }
            }
        }
        ast *inner = parse_alt(ps);
        ps->icase = saved_icase;
        if (ps->failed)
            return NULL;
        if (ps->i >= ps->n || ps->p[ps->i] != ')') {
            perr(ps, "missing )");
            return NULL;
        }
        ps->i++;
        a = node(ps, kind);
        if (a) {
            a->child = inner;
            a->group = group;
        }
        return a;
    }
    case '\\': {
        if (ps->i >= ps->n) {
            perr(ps, "trailing backslash");
            return NULL;
        }
        uint32_t e = ps->p[ps->i++];
        if (e == 'b')
            return node(ps, A_WORDB);
        if (e == 'B')
            return node(ps, A_NWORDB);
        unsigned b = builtin_of(e);
        if (b) {
            int ci = new_class(ps);
            if (ci < 0)
                return NULL;
            ps->prog->classes[ci].builtins = b;
            a = node(ps, A_CLASS);
            if (a)
                a->cls = ci;
            return a;
        }
        a = node(ps, A_CHAR);
        if (a)
            a->ch = escape_char(e);
        return a;
    }
    default:
        a = node(ps, A_CHAR);
        if (a)
            a->ch = c;
        return a;
    }
}

static ast *parse_cat(parser *ps)
{
    ast *cat = node(ps, A_CAT), *last = NULL;
    while (!ps->failed && ps->i < ps->n && ps->p[ps->i] != '|' && ps->p[ps->i] != ')') {
        ast *a = parse_atom(ps);
        if (!a)
            return NULL;
        for (;;) {
            int min = -2, max = -2;
            if (ps->i >= ps->n)
                break;
            uint32_t q = ps->p[ps->i];
            if (q == '*') {
                min = 0, max = -1, ps->i++;
            } else if (q == '+') {
                min = 1, max = -1, ps->i++;
            } else if (q == '?') {
                min = 0, max = 1, ps->i++;
            } else if (q == '{' && parse_braces(ps, &min, &max)) {
            } else {
                break;
            }
            ast *r = node(ps, A_REP);
            if (!r)
                return NULL;
            r->min = min;
            r->max = max;
            r->greedy = 1;
            if (ps->i < ps->n && ps->p[ps->i] == '?') {
                r->greedy = 0;
                ps->i++;
            }
            r->child = a;
            a = r;
        }
        if (last)
            last->next = a;
        else
            cat->child = a;
        last = a;
    }
    return cat;
}

static ast *parse_alt(parser *ps)
{
    ast *first = parse_cat(ps);
    if (!first || ps->i >= ps->n || ps->p[ps->i] != '|')
        return first;
    ast *alt = node(ps, A_ALT);
    if (!alt)
        return NULL;
    alt->child = first;
    ast *last = first;
    while (!ps->failed && ps->i < ps->n && ps->p[ps->i] == '|') {
        ps->i++;
        ast *b = parse_cat(ps);
        if (!b)
            return NULL;
        last->next = b;
        last = b;
    }
    return alt;
}

/* ---- code generation ---------------------------------------------------------------------------------------- */

static int emit(parser *ps, int op)
{
    mre_prog *p = ps->prog;
    if (ps->failed)
        return -1;
    if (p->ncode == p->capcode) {
        int cap = p->capcode ? p->capcode * 2 : 256;
        inst *c = realloc(p->code, (size_t)cap * sizeof *c);
        if (!c) {
            perr(ps, "out of memory");
            return -1;
        }
        p->code = c;
        p->capcode = cap;
    }
    memset(&p->code[p->ncode], 0, sizeof p->code[0]);
    p->code[p->ncode].op = (uint8_t)op;
    return p->ncode++;
}

/* Fixed match length of a lookbehind body, or -1 when it is not fixed. */
static int fixed_len(const ast *a)
{
    switch (a->kind) {
    case A_CHAR: case A_ANY: case A_CLASS: return 1;
    case A_CAT: {
        int n = 0;
        for (const ast *c = a->child; c; c = c->next) {
            int k = fixed_len(c);
            if (k < 0)
                return -1;
            n += k;
        }
        return n;
    }
    case A_ALT: {
        int n = -2;
        for (const ast *c = a->child; c; c = c->next) {
            int k = fixed_len(c);
            if (k < 0 || (n != -2 && k != n))
                return -1;
            n = k;
        }
        return n;
    }
    case A_GROUP: return fixed_len(a->child);
    case A_REP: return a->min == a->max ? a->min * fixed_len(a->child) : -1;
    default: return 0;
    }
}

static void gen(parser *ps, const ast *a);

static void gen_rep(parser *ps, const ast *a)
{
    for (int k = 0; k < a->min; k++)
        gen(ps, a->child);
    if (a->max < 0) {
        int split = emit(ps, I_SPLIT);
        if (split < 0)
            return;
        gen(ps, a->child);
        int jmp = emit(ps, I_JMP);
        if (jmp < 0)
            return;
        ps->prog->code[jmp].x = split;
        int body = split + 1, out = ps->prog->ncode;
        ps->prog->code[split].x = a->greedy ? body : out;
        ps->prog->code[split].y = a->greedy ? out : body;
        return;
    }
    /* (max - min) optional copies, nested so that skipping one skips the rest */
    int opt = a->max - a->min;
    int *splits = malloc((size_t)(opt > 0 ? opt : 1) * sizeof *splits);
    if (!splits) {
        perr(ps, "out of memory");
        return;
    }
    for (int k = 0; k < opt; k++) {
        splits[k] = emit(ps, I_SPLIT);
        gen(ps, a->child);
    }
    int out = ps->prog->ncode;
    for (int k = 0; k < opt && !ps->failed; k++) {
        int body = splits[k] + 1;
        ps->prog->code[splits[k]].x = a->greedy ? body : out;
        ps->prog->code[splits[k]].y = a->greedy ? out : body;
    }
    free(splits);
}

static void gen(parser *ps, const ast *a)
{
    if (!a || ps->failed)
        return;
    int k;
    switch (a->kind) {
    case A_CHAR:
        k = emit(ps, I_CHAR);
        if (k >= 0) {
            ps->prog->code[k].c = a->icase ? fold(a->ch) : a->ch;
            ps->prog->code[k].icase = (uint8_t)a->icase;
        }
        break;
    case A_ANY: emit(ps, (ps->prog->flags & MRE_DOTALL) ? I_ANYNL : I_ANY); break;
    case A_CLASS:
        k = emit(ps, I_CLASS);
        if (k >= 0) {
            ps->prog->code[k].x = a->cls;
            ps->prog->code[k].icase = (uint8_t)a->icase;
        }
        break;
    case A_CAT:
        for (const ast *c = a->child; c; c = c->next)
            gen(ps, c);
        break;
    case A_ALT: {
        /* SPLIT b1, next; b1; JMP end; next: SPLIT b2, next2; ... */
        int jumps[256], nj = 0;
        for (const ast *c = a->child; c && !ps->failed; c = c->next) {
            if (c->next) {
                int s = emit(ps, I_SPLIT);
                gen(ps, c);
                if (nj >= 256) {
                    perr(ps, "too many alternatives");
                    return;
                }
                jumps[nj++] = emit(ps, I_JMP);
                if (s >= 0) {
                    ps->prog->code[s].x = s + 1;
                    ps->prog->code[s].y = ps->prog->ncode;
                }
            } else {
                gen(ps, c);
            }
        }
        for (int j = 0; j < nj && !ps->failed; j++)
            ps->prog->code[jumps[j]].x = ps->prog->ncode;
        break;
    }
    case A_REP: gen_rep(ps, a); break;
    case A_GROUP:
        if (a->group >= 0) {
            k = emit(ps, I_SAVE);
            if (k >= 0)
                ps->prog->code[k].x = 2 * a->group;
        }
        gen(ps, a->child);
        if (a->group >= 0) {
            k = emit(ps, I_SAVE);
            if (k >= 0)
                ps->prog->code[k].x = 2 * a->group + 1;
        }
        break;
    case A_BOL: emit(ps, I_BOL); break;
    case A_EOL: emit(ps, I_EOL); break;
    case A_WORDB: emit(ps, I_WORDB); break;
    case A_NWORDB: emit(ps, I_NWORDB); break;
    case A_NLOOK:
    case A_NLOOKB: {
        int len = a->kind == A_NLOOKB ? fixed_len(a->child) : 0;
        if (len < 0) {
            perr(ps, "lookbehind needs a fixed length");
            return;
        }
        k = emit(ps, a->kind == A_NLOOK ? I_NLOOKAHEAD : I_NLOOKBEHIND);
        gen(ps, a->child);
        emit(ps, I_MATCH);
        if (k >= 0 && !ps->failed) {
            ps->prog->code[k].x = len;
            ps->prog->code[k].y = ps->prog->ncode;
        }
        break;
    }
    default: break;
    }
}

/* Marks the code points that can be the first one consumed from pc (following SPLIT, JMP, SAVE and assertions
 * without consuming). Returns 0 when the set is unbounded. depth bounds the walk through the SPLIT tree. */
static int first_set(mre_prog *p, int pc, uint8_t *seen, int depth)
{
    if (depth > 2000)
        return 0;
    for (;;) {
        if (seen[pc])
            return 1;
        seen[pc] = 1;
        const inst *in = &p->code[pc];
        switch (in->op) {
        case I_CHAR:
            if (in->c >= 128) {
                p->first_high = 1;
            } else {
                p->first[in->c] = 1;
                if (in->icase && in->c >= 'a' && in->c <= 'z')
                    p->first[in->c - 32] = 1;
            }
            return 1;
        case I_CLASS: {
            const cclass *c = &p->classes[in->x];
            if (c->neg || c->builtins & (CB_NDIGIT | CB_NSPACE | CB_NWORD | CB_WORD))
                return 0;
            if (c->builtins & CB_DIGIT)
                for (int k = '0'; k <= '9'; k++)
                    p->first[k] = 1;
            if (c->builtins & CB_SPACE) {
                for (int k = 0; k < 128; k++)
                    if (mre_is_space((uint32_t)k))
                        p->first[k] = 1;
                p->first_high = 1;
            }
            for (int r = 0; r < c->count; r++) {
                const uint32_t *rg = p->ranges[c->first + r];
                for (uint32_t k = rg[0]; k <= rg[1] && k < 128; k++) {
                    p->first[k] = 1;
                    if (in->icase && ((k | 32) >= 'a' && (k | 32) <= 'z'))
                        p->first[k ^ 32] = 1;
                }
                if (rg[1] >= 128)
                    p->first_high = 1;
            }
            return 1;
        }
        case I_SPLIT:
            if (!first_set(p, in->x, seen, depth + 1))
                return 0;
            pc = in->y;
            continue;
        case I_JMP: pc = in->x; continue;
        case I_SAVE:
        case I_WORDB:
        case I_NWORDB: pc++; continue;
        case I_NLOOKAHEAD:
        case I_NLOOKBEHIND: pc = in->y; continue;
        default: return 0; /* ., anchors, an empty match */
        }
    }
}

static void compute_first(mre_prog *p)
{
    uint8_t *seen = calloc((size_t)p->ncode, 1);
    int bounded = seen && first_set(p, 0, seen, 0);
    free(seen);
    if (!bounded) {
        memset(p->first, 1, sizeof p->first);
        p->first_high = 1;
        p->any_start = 1;
    }
}

void mre_free(mre_prog *prog)
{
    if (!prog)
        return;
    for (int g = 0; g < MRE_MAX_GROUPS; g++)
        free(prog->names[g]);
    free(prog->code);
    free(prog->classes);
    free(prog->ranges);
    free(prog);
}

mre_prog *mre_compile(const char *pattern, unsigned flags, char *err, size_t errlen)
{
    mre_prog *prog = calloc(1, sizeof *prog);
    long n = 0;
    uint32_t *cp = prog ? mre_decode(pattern, strlen(pattern), &n) : NULL;
    if (!cp) {
        free(prog);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    prog->flags = flags;
    prog->ngroups = 1;
    parser ps = {.p = cp, .n = n, .prog = prog, .err = err, .errlen = errlen};
    ast *root = parse_alt(&ps);
    if (!ps.failed && ps.i < ps.n)
        perr(&ps, "unbalanced )");
    if (!ps.failed) {
        gen(&ps, root);
        emit(&ps, I_MATCH);
    }
    for (int i = 0; i < ps.nall; i++)
        free(ps.all[i]);
    free(ps.all);
    free(cp);
    if (ps.failed) {
        mre_free(prog);
        return NULL;
    }
    compute_first(prog);
    return prog;
}

int mre_ngroups(const mre_prog *prog) { return prog->ngroups; }

int mre_group(const mre_prog *prog, const char *name)
{
    for (int g = 1; g < prog->ngroups; g++)
        if (prog->names[g] && strcmp(prog->names[g], name) == 0)
            return g;
    return -1;
}

const char *mre_group_name(const mre_prog *prog, int g)
{
    return g > 0 && g < prog->ngroups ? prog->names[g] : NULL;
}

/* ---- execution --------------------------------------------------------------------------------------------- */

static int class_has(const mre_prog *p, const cclass *c, uint32_t ch)
{
    unsigned b = c->builtins;
    if (((b & CB_DIGIT) && is_digit(ch)) || ((b & CB_NDIGIT) && !is_digit(ch)) ||
        ((b & CB_SPACE) && mre_is_space(ch)) || ((b & CB_NSPACE) && !mre_is_space(ch)) ||
        ((b & CB_WORD) && is_word(ch)) || ((b & CB_NWORD) && !is_word(ch)))
        return 1;
    for (int i = 0; i < c->count; i++) {
        const uint32_t *r = p->ranges[c->first + i];
        if (ch >= r[0] && ch <= r[1])
            return 1;
    }
    return 0;
}

static int class_match(const mre_prog *p, const inst *in, uint32_t ch)
{
    const cclass *c = &p->classes[in->x];
    int hit = class_has(p, c, ch);
    if (!hit && in->icase) {
        uint32_t other = ch >= 'a' && ch <= 'z' ? ch - 32 : ch >= 'A' && ch <= 'Z' ? ch + 32 : ch;
        hit = other != ch && class_has(p, c, other);
    }
    return c->neg ? !hit : hit;
}

typedef struct frame {
    int pc;    /* >= 0: resume here at sp; -1: restore caps[slot] = old */
    int slot;
    long sp;
} frame;

typedef struct stack {
    frame *f;
    long n, cap;
    int heap;
} stack;

static int push(stack *s, int pc, int slot, long sp)
{
    if (s->n == s->cap) {
        /* the first 256 frames live on the C stack of run(); beyond that the stack moves to the heap */
        long cap = s->cap * 2;
        frame *f = s->heap ? realloc(s->f, (size_t)cap * sizeof *f) : malloc((size_t)cap * sizeof *f);
        if (!f)
            return -1;
        if (!s->heap)
            memcpy(f, s->f, (size_t)s->n * sizeof *f);
        s->f = f;
        s->cap = cap;
        s->heap = 1;
    }
    s->f[s->n++] = (frame){pc, slot, sp};
    return 0;
}

/* Runs the program from pc at sp. MRE_MATCH with *end set, MRE_NOMATCH, or MRE_BUDGET (also on out of memory,
 * which the caller reports the same way: the answer cannot be judged). */
static int run(const mre_prog *p, int pc, const uint32_t *t, long len, long sp, long *caps, long *budget,
               long *end)
{
    frame local[256];
    stack st = {local, 0, 256};
    int rc;
    for (;;) {
        if (--*budget < 0) {
            rc = MRE_BUDGET;
            goto done;
        }
        const inst *in = &p->code[pc];
        switch (in->op) {
        case I_CHAR:
            if (sp < len && (in->icase ? fold(t[sp]) : t[sp]) == in->c) {
                pc++, sp++;
                continue;
            }
            goto fail;
        case I_ANY:
            if (sp < len && t[sp] != '\n') {
                pc++, sp++;
                continue;
            }
            goto fail;
        case I_ANYNL:
            if (sp < len) {
                pc++, sp++;
                continue;
            }
            goto fail;
        case I_CLASS:
            if (sp < len && class_match(p, in, t[sp])) {
                pc++, sp++;
                continue;
            }
            goto fail;
        case I_SPLIT:
            if (push(&st, in->y, 0, sp) < 0) {
                rc = MRE_BUDGET;
                goto done;
            }
            pc = in->x;
            continue;
        case I_JMP:
            pc = in->x;
            continue;
        case I_SAVE:
            if (caps) {
                if (push(&st, -1, in->x, caps[in->x]) < 0) {
                    rc = MRE_BUDGET;
                    goto done;
                }
                caps[in->x] = sp;
            }
            pc++;
            continue;
        case I_BOL:
            if (sp == 0) {
                pc++;
                continue;
            }
            goto fail;
        case I_EOL:
            if (sp == len || (sp == len - 1 && t[sp] == '\n')) {
                pc++;
                continue;
            }
            goto fail;
        case I_WORDB:
        case I_NWORDB: {
            int before = sp > 0 && is_word(t[sp - 1]), after = sp < len && is_word(t[sp]);
            if ((before != after) == (in->op == I_WORDB)) {
                pc++;
                continue;
            }
            goto fail;
        }
        case I_NLOOKAHEAD:
        case I_NLOOKBEHIND: {
            long at = in->op == I_NLOOKAHEAD ? sp : sp - in->x, e = 0;
            int sub = MRE_NOMATCH;
            if (at >= 0) {
                sub = run(p, pc + 1, t, len, at, NULL, budget, &e);
                if (sub == MRE_BUDGET) {
                    rc = MRE_BUDGET;
                    goto done;
                }
            }
            if (sub == MRE_MATCH)
                goto fail;
            pc = in->y;
            continue;
        }
        case I_MATCH:
            *end = sp;
            rc = MRE_MATCH;
            goto done;
        }
    fail:
        for (;;) {
            if (st.n == 0) {
                rc = MRE_NOMATCH;
                goto done;
            }
            frame f = st.f[--st.n];
            if (f.pc < 0) {
                caps[f.slot] = f.sp;
                continue;
            }
            pc = f.pc;
            sp = f.sp;
            break;
        }
    }
done:
    if (st.heap)
        free(st.f);
    return rc;
}

int mre_search(const mre_prog *prog, const uint32_t *text, long len, long from, long *caps, long *budget)
{
    int ncap = 2 * prog->ngroups;
    /* positions whose code point cannot start a match are skipped without entering the executor; a match that
     * consumes nothing (start == len) is only possible when the first set is unbounded */
    int unbounded = prog->any_start;
    for (long start = from; start <= len; start++) {
        if (start < len ? !(text[start] < 128 ? prog->first[text[start]] : prog->first_high) : !unbounded)
            continue;
        for (int i = 0; i < ncap; i++)
            caps[i] = -1;
        long end = 0;
        int rc = run(prog, 0, text, len, start, caps, budget, &end);
        if (rc == MRE_BUDGET)
            return MRE_BUDGET;
        if (rc == MRE_MATCH) {
            caps[0] = start;
            caps[1] = end;
            return MRE_MATCH;
        }
    }
    return MRE_NOMATCH;
}
