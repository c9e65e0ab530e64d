/* math_hf_verify.c: extraction and normalisation for hf_math_verify (math_hf_verify.h). The patterns below are
 * written from math-verify 0.9's and latex2sympy2_extended 1.11's documented extraction targets and
 * normalisation steps, so that the same text is found in the same order; math_regex.h runs them with Python's
 * backtracking semantics. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include "math_hf_verify.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "math_expr.h"
#include "math_hf_compare.h"
#include "math_latex_parse.h"
#include "math_regex.h"

/* ---- a growable byte string ------------------------------------------------------------------------------------ */

typedef struct sbuf {
    char *d;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 128;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *d = realloc(b->d, cap);
        if (!d) {
            b->oom = 1;
            return;
        }
        b->d = d;
        b->cap = cap;
    }
    memcpy(b->d + b->n, s, n);
    b->n += n;
    b->d[b->n] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

static void sb_fmt(sbuf *b, const char *a, const char *x, const char *c)
{
    sb_str(b, a);
    sb_str(b, x);
    sb_str(b, c);
}

static char *sb_done(sbuf *b)
{
    if (!b->oom && !b->d)
        sb_add(b, "", 0);
    if (b->oom) {
        free(b->d);
        return NULL;
    }
    return b->d;
}

/* ---- the patterns ---------------------------------------------------------------------------------------------- */

#define OPS "\\+\\-\\*\xc3\x97\\/\\^\\(\\)\xc3\xb7"
#define ALL_EXPR "[\\d\\.\\s" OPS "]"
#define EXPR_RE "(?P<expr>-?\\(?-?\\d" ALL_EXPR "*[" OPS "]" ALL_EXPR "+\\)?)"
#define NUMBER_RE                                                                                                  \
    "(?<!\\d)(?:(?P<integer1>-?[1-9]\\d{0,2}(?:[ ,]\\d{3})+)(?P<decimal1>\\.\\d+)?|(?P<integer2>-?\\d+)"          \
    "(?P<decimal2>[.,]\\d+)|(?P<decimal3>\\.\\d+)|(?P<integer3>-?\\d+))"                                           \
    "(?P<percent>\\s*(?:%|[Pp]ercent|\\s*[Pp]ercentage|\\s*[Pp]ct))?"
#define CURRENCY "$€£¥₹₽₪₩₫฿₡₢₣₤₥₦₧₨₩₪₫₭₮₯₰₱₲₳₴₵₶₷₸₹₺₻₼₽₾₿"
#define EXPR_PREFIX "(?:^|\\s|\\=)(?:\\*\\*)?"
#define EXPR_SUFFIX "(?:\\*\\*)?(?:\\.|,|:|\\s|\\)|\\$|$)"
#define EXPR_WITH_ANCHORS "(?:" EXPR_PREFIX EXPR_RE EXPR_SUFFIX ")"
#define NUMBER_WITH_ANCHORS "(?:" EXPR_PREFIX "[" CURRENCY "]?" NUMBER_RE ")"
#define EXPR_OR_NUMBER "(?:" EXPR_WITH_ANCHORS "|" NUMBER_WITH_ANCHORS ")"

/* One LaTeX environment ($$..$$, \[..\], $..$, \(..\), [..] between spaces, a bare \frac{1}{2}) with an optional
 * percent sign; boxed: the environment must contain a \boxed{...}. Group names carry prefix. */
static void latex_env(sbuf *b, const char *prefix, int boxed)
{
    const char *base[5] = {"(?:[^$]|\\$(?!\\$))", "(?:[^\\\\]|\\\\(?!\\]))", "(?:\\\\[$]|[^\\n$])",
                           "(?:[^\\\\\\n]|\\\\(?!\\)))", "[^\\n\\]\\[]"};
    char content[5][256];
    for (int k = 0; k < 5; k++) {
        if (boxed)
            snprintf(content[k], sizeof content[k], "%s*?\\\\boxed{%s+?}%s*?", base[k], base[k], base[k]);
        else
            snprintf(content[k], sizeof content[k], "%s+?", base[k]);
    }
    sb_str(b, "(?:(?:");
    sb_fmt(b, "(?<!\\\\)\\$\\$(?P<", prefix, "latexDisplayDollar>");
    sb_fmt(b, content[0], ")(?<!\\\\)\\$\\$", "|");
    sb_fmt(b, "(?<!\\\\)\\\\\\[(?P<", prefix, "latexDisplayBracket>");
    sb_fmt(b, content[1], ")(?<!\\\\)\\\\\\]", "|");
    sb_fmt(b, "(?<!\\\\|\\d)\\$(?P<", prefix, "latexInlineDollar>");
    sb_fmt(b, content[2], ")(?<!\\\\)\\$", "|");
    sb_fmt(b, "(?<!\\\\)\\\\\\((?P<", prefix, "latexInlineParenthesis>");
    sb_fmt(b, content[3], ")(?<!\\\\)\\\\\\)", "|");
    sb_fmt(b, "\\s\\[(?P<", prefix, "latexInlineBracket>");
    sb_fmt(b, content[4], ")\\]\\s", "");
    if (!boxed)
        sb_fmt(b, "|(?P<", prefix, "latexFraction>-?\\\\frac{-?\\d+(?:[.,]\\d+)?}{-?\\d+(?:[.,]\\d+)?})");
    sb_fmt(b, ")\\s*(?P<", prefix, "percent>(?:\\\\?%|[Pp]ercent|[Pp]ercentage|[Pp]ct))?)");
}

/* Up to six environments joined by ',', 'and', 'or'. */
static void latex_envs(sbuf *b, int boxed)
{
    if (!boxed)
        sb_str(b, "(?:");
    latex_env(b, "first_", boxed);
    for (int i = 1; i <= 5; i++) {
        char prefix[16];
        snprintf(prefix, sizeof prefix, "next%d_", i);
        sb_str(b, boxed ? "\\s*(?:\\s*(?:,?and|,?or|,)\\s*" : "(?:\\s*(?:,?and|,?or|,)\\s*");
        latex_env(b, prefix, boxed);
        sb_str(b, ")?");
    }
    if (!boxed)
        sb_str(b, ")");
}

typedef enum { PK_EXPR, PK_LATEX } pkind;

/* Matches one priority group may collect; past it the earliest half is dropped (the latest are tried first). */
#define MAX_MATCHES 2048
#define MATCH_CAPS (2 * 128)

typedef struct match {
    long start, end;
    int pattern;
    long *caps;
} match;

typedef struct pattern {
    mre_prog *prog;
    int priority;
    pkind kind;
} pattern;

#define NORM_MALFORMED 7

struct math_hf_verifier {
    pattern pred[16], gold[8];
    int npred, ngold;
    mre_prog *r_left, *r_right, *permutation, *to_remove, *to_replace, *unit_superscript, *units;
    mre_prog *malformed[NORM_MALFORMED];
    const char *replacement[128]; /* to_replace: group index -> its replacement */
    mx_arena *gold_arena, *pred_arena;
    struct match *matches; /* MAX_MATCHES, with MATCH_CAPS longs each in capstore */
    long *capstore;
    long budget;
    int out_of_budget, oom;
};

/* latex2sympy2_extended's unit words, stripped from the end of an answer ("integer" "point" is one word there). */
static const char *const unit_words[] = {
    "integerpoint", "feet", "sue", "digit", "pound", "meal", "edge", "student", "children ticket", "multiple",
    "east", "degree", "mph", "kmph", "ft", "m square", " m east", "sq m", "deg", "mile", "q .", "monkey", "prime",
    "ratio", "profit of rs", "rd", "o", "gm", "p . m", "lb", "tile", "per", "dm", "lt", "gain", "ab", "way", "west",
    "a .", "b .", "c .", "d .", "e .", "f .", "g .", "h .", "t", "h", "no change", "men", "soldier", "pie", "bc",
    "excess", "st", "inches", "noon", "cent", "by", "gal", "kmh", "c", "acre", "rise", "a . m", "th", "π r 2", "sq",
    "mark", "l", "toy", "coin", "sq . m", "gallon", "° f", "profit", "minw", "yr", "women", "am", "pm", "hr",
    "cu cm", "square", "v â € ™", "are", "rupee", "rounds", "cubic", "cc", "mtr", "s", "ohm", "number", "kmph", "day",
    "hour", "minute", "min", "second", "man", "woman", "sec", "cube", "mt", "sq inch", "mp", "∏ cm ³", "hectare",
    "more", "sec", "unit", "cu . m", "cm 2", "rs .", "rs", "kg", "g", "month", "km", "m", "cm", "mm", "apple",
    "liter", "loss", "yard", "pure", "year", "increase", "decrease", "d", "less", "Surface", "litre", "pi sq m",
    "s .", "metre", "meter", "inch", NULL};

static const struct {
    const char *name, *pattern, *replacement;
} replacements[] = {
    {"math", "\\\\math(?:rm|it|bf)", "\\text"},
    {"text", "\\\\text(?:normal|bf|it|rm)", "\\text"},
    {"frac", "\\\\(?:d|t|c)frac", "\\frac"},
    {"decimal_space", "\\s\\.", " 0."},
    {"decimal_brace", "\\{\\.", "{0."},
    {"approx", "\\~\\=", "\\approx"},
    {"comma", "\\s*\\{\\s*,\\s*\\}", ","},
    {"and_or", "(?<![a-zA-Z])(,?\\s*(?:and|or))(?![a-zA-Z])", ","},
    {"and_or_text", "(,?\\s*\\\\text{\\s*(?:and|or)\\s*})", ","},
    {"backslash_space", "(?<!\\\\)\\\\\\s", " "},
    {"infinity", "infinity", "\\infty"},
    {"dot", ",?(\\\\ldots)", " "},
    {"percentage", "\\s*\\bpercentage\\b", "\\%"},
    {"percentage_in_text", "\\\\text{percentage}", "%"},
    {"percent", "\\s*\\bpercent\\b", "\\%"},
    {"percent_in_text", "\\\\text{percent}", "%"},
    {"pct", "\\s*\\bpct\\b", "\\%"},
    {"pct_in_text", "\\\\text{pct}", "%"},
    {"inf", "((?<!\\\\)inf(?!inity))", "\\infty"},
    {"sqrt", " sqrt", "\\sqrt"},
};

/* Replacement templates: \x01 and \x02 stand for groups 1 and 2. */
static const struct {
    const char *pattern, *tmpl;
} malformed_ops[NORM_MALFORMED] = {
    {"\\^\\s?\\((.*?)\\)", "^{\x01}"},
    {"sqrt\\s?\\((.*?)\\)", "\\sqrt{\x01}"},
    {"\\\\frac\\s?(\\d)\\s?(\\d+)", "\\frac{\x01}{\x02}"},
    {"\\\\log_\\s?(\\d)\\s?(\\d+)", "\\log_{\x01}{\x02}"},
    {"\\\\frac\\s?{(.*?)}\\s?(\\d)", "\\frac{\x01}{\x02}"},
    {"\\\\frac\\s?(\\d)\\s?{(.*?)}", "\\frac{\x01}{\x02}"},
    {"\\\\sqrt\\s?(\\d)", "\\sqrt{\x01}"},
};

static mre_prog *compile(sbuf *pat, unsigned flags, char *err, size_t errlen)
{
    char *s = sb_done(pat);
    memset(pat, 0, sizeof *pat);
    if (!s) {
        snprintf(err, errlen, "hf_math_verify: out of memory building patterns");
        return NULL;
    }
    mre_prog *p = mre_compile(s, flags, err, errlen);
    free(s);
    return p;
}

static mre_prog *compile_str(const char *s, unsigned flags, char *err, size_t errlen)
{
    sbuf b = {0};
    sb_str(&b, s);
    return compile(&b, flags, err, errlen);
}

void math_hf_destroy(math_hf_verifier *v)
{
    if (!v)
        return;
    for (int k = 0; k < v->npred; k++)
        mre_free(v->pred[k].prog);
    for (int k = 0; k < v->ngold; k++)
        mre_free(v->gold[k].prog);
    mre_free(v->r_left);
    mre_free(v->r_right);
    mre_free(v->permutation);
    mre_free(v->to_remove);
    mre_free(v->to_replace);
    mre_free(v->unit_superscript);
    mre_free(v->units);
    for (int k = 0; k < NORM_MALFORMED; k++)
        mre_free(v->malformed[k]);
    free(v->gold_arena);
    free(v->pred_arena);
    free(v->matches);
    free(v->capstore);
    free(v);
}

static int add_pattern(pattern *list, int *n, mre_prog *prog, int priority, pkind kind)
{
    if (!prog)
        return -1;
    list[(*n)++] = (pattern){prog, priority, kind};
    return 0;
}

/* The latex target's patterns in math-verify's order: final answer (0, 50), answer: (100), answer (200), plain
 * (300), then the boxed environment and the bare \boxed{...} (both 50). */
static int add_latex_patterns(pattern *list, int *n, char *err, size_t errlen)
{
    static const char *const heads[] = {"(?i:final answer is)\\:?\\s*", "(?i:final answer.{0,100}?)\\s+is\\:?\\s*",
                                        "(?i:answer)\\:.{0,50}?", "(?i:answer).{0,50}?", ""};
    static const int prio[] = {0, 50, 100, 200, 300};
    for (int k = 0; k < 5; k++) {
        sbuf b = {0};
        sb_str(&b, heads[k]);
        latex_envs(&b, 0);
        if (k == 0)
            sb_str(&b, "\\.?\\s?I hope");
        if (add_pattern(list, n, compile(&b, MRE_DOTALL, err, errlen), prio[k], PK_LATEX) < 0)
            return -1;
    }
    sbuf b = {0};
    latex_envs(&b, 1);
    if (add_pattern(list, n, compile(&b, MRE_DOTALL, err, errlen), 50, PK_LATEX) < 0)
        return -1;
    return add_pattern(list, n, compile_str("(?P<first_latexBoxed>\\\\boxed{.+})", MRE_DOTALL, err, errlen), 50,
                       PK_LATEX);
}

/* Stable sort by priority: math-verify groups patterns by priority, keeping their order inside a group. */
static void sort_patterns(pattern *list, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && list[j - 1].priority > list[j].priority; j--) {
            pattern t = list[j];
            list[j] = list[j - 1];
            list[j - 1] = t;
        }
}

math_hf_verifier *math_hf_create(char *err, size_t errlen)
{
    math_hf_verifier *v = calloc(1, sizeof *v);
    if (!v || !(v->gold_arena = malloc(sizeof *v->gold_arena)) || !(v->pred_arena = malloc(sizeof *v->pred_arena)) ||
        !(v->matches = malloc(MAX_MATCHES * sizeof *v->matches)) ||
        !(v->capstore = malloc((size_t)MAX_MATCHES * MATCH_CAPS * sizeof *v->capstore))) {
        snprintf(err, errlen, "hf_math_verify: out of memory");
        math_hf_destroy(v);
        return NULL;
    }
    /* prediction: the expression target first, then the latex target (NeMo RL's order) */
    static const char *const expr_heads[] = {"(?i:final answer is)\\:?\\s*", "(?i:final answer.{0,100}?)\\s+is\\:?",
                                             "(?i:answer)\\:(?:.{0,100}=\\s*|.{0,50}?)",
                                             "(?i:answer)(?:.{0,100}=\\s*|.{0,50}?)"};
    static const int expr_prio[] = {0, 50, 100, 200};
    int ok = 1;
    for (int k = 0; k < 4 && ok; k++) {
        sbuf b = {0};
        sb_str(&b, expr_heads[k]);
        sb_str(&b, EXPR_OR_NUMBER);
        sb_str(&b, k == 0 ? "\\.?\\s?I hope" : k >= 2 ? "(?!\\s*=)" : "");
        ok = add_pattern(v->pred, &v->npred, compile(&b, 0, err, errlen), expr_prio[k], PK_EXPR) == 0;
    }
    ok = ok && add_pattern(v->pred, &v->npred, compile_str(EXPR_WITH_ANCHORS, 0, err, errlen), 300, PK_EXPR) == 0;
    ok = ok && add_pattern(v->pred, &v->npred, compile_str(NUMBER_WITH_ANCHORS, 0, err, errlen), 300, PK_EXPR) == 0;
    ok = ok && add_latex_patterns(v->pred, &v->npred, err, errlen) == 0;
    ok = ok && add_latex_patterns(v->gold, &v->ngold, err, errlen) == 0;
    if (ok) {
        sort_patterns(v->pred, v->npred);
        sort_patterns(v->gold, v->ngold);
    }
    /* normalisation */
    ok = ok && (v->r_left = compile_str("\\\\m?left(\\\\\\{|\\{|\\\\\\||\\||\\[|\\(|\\\\rbracl|\\\\lgroup|\\\\lbrace|"
                                        "\\\\lbrack|\\\\vert|\\\\lvert|\\\\lceil|\\\\lfloor|\\\\vert|\\\\lvert|"
                                        "\\\\langle|\\\\llcorner|\\\\ulcorner)", 0, err, errlen));
    ok = ok && (v->r_right = compile_str("\\\\m?right(\\\\\\}|\\}|\\\\\\||\\||\\]|\\)|\\\\rbrack|\\\\rgroup|"
                                         "\\\\rbrace|\\\\rbrack|\\\\vert|\\\\rvert|\\\\rceil|\\\\rfloor|\\\\vert|"
                                         "\\\\rvert|\\\\rangle|\\\\lrcorner|\\\\urcorner)", 0, err, errlen));
    ok = ok && (v->permutation = compile_str("\\(([a-zA-Z0-9+\\-*/\\\\ ]+?)\\)_{([a-zA-Z0-9+\\-*/\\\\ ]+?)}", 0,
                                             err, errlen));
    ok = ok && (v->to_remove = compile_str("\\\\mathrm\\{th\\}|\\\\!\\s*|\\\\text\\s*\\{\\s*\\}|\\\\\\$|\\$|"
                                           "(?<!\\\\)[\"\\']|\\\\displaystyle", 0, err, errlen));
    if (ok) {
        sbuf b = {0};
        size_t nr = sizeof replacements / sizeof replacements[0];
        for (size_t k = 0; k < nr; k++) {
            sb_str(&b, k ? "|(?P<" : "(?P<");
            sb_str(&b, replacements[k].name);
            sb_str(&b, ">");
            sb_str(&b, replacements[k].pattern);
            sb_str(&b, ")");
        }
        ok = (v->to_replace = compile(&b, 0, err, errlen)) != NULL;
        for (size_t k = 0; ok && k < nr; k++) {
            int g = mre_group(v->to_replace, replacements[k].name);
            if (g > 0 && g < 128)
                v->replacement[g] = replacements[k].replacement;
        }
    }
    ok = ok && (v->unit_superscript = compile_str("(\\\\(?:text|mbox){.*?})(\\^\\d|\\{\\^\\d\\})?$", 0, err, errlen));
    if (ok) {
        sbuf b = {0};
        sb_str(&b, "(\\d|\\}|\\s)\\s*(?:(?:");
        for (int k = 0; unit_words[k]; k++) {
            if (k)
                sb_str(&b, "|");
            /* re.escape is not applied to the words: '.' stays a wildcard, as in the original list */
            sb_str(&b, unit_words[k]);
        }
        sb_str(&b, ")(?:s|es)?)\\s*$");
        ok = (v->units = compile(&b, 0, err, errlen)) != NULL;
    }
    for (int k = 0; ok && k < NORM_MALFORMED; k++)
        ok = (v->malformed[k] = compile_str(malformed_ops[k].pattern, 0, err, errlen)) != NULL;
    if (!ok) {
        math_hf_destroy(v);
        return NULL;
    }
    return v;
}

/* ---- re.sub ------------------------------------------------------------------------------------------------------ */

static void add_cps(sbuf *b, const uint32_t *cp, long from, long to)
{
    if (to <= from)
        return;
    char *s = mre_encode(cp + from, to - from);
    if (!s) {
        b->oom = 1;
        return;
    }
    sb_str(b, s);
    free(s);
}

/* Python's prog.sub(repl, text): every non-overlapping match left to right, replaced by tmpl (\x01, \x02: groups)
 * or, when tmpl is NULL, by the replacement of the named group that matched. NULL on out of memory or budget. */
static char *re_sub(math_hf_verifier *v, const mre_prog *prog, const char *text, const char *tmpl)
{
    long n = 0;
    uint32_t *cp = mre_decode(text, strlen(text), &n);
    long caps[2 * 128];
    sbuf out = {0};
    if (!cp) {
        v->oom = 1;
        return NULL;
    }
    long pos = 0, copied = 0;
    while (pos <= n) {
        int rc = mre_search(prog, cp, n, pos, caps, &v->budget);
        if (rc == MRE_BUDGET) {
            v->out_of_budget = 1;
            free(cp);
            free(out.d);
            return NULL;
        }
        if (rc != MRE_MATCH)
            break;
        add_cps(&out, cp, copied, caps[0]);
        const char *t = tmpl;
        if (!t) {
            t = "";
            for (int g = 1; g < mre_ngroups(prog) && g < 128; g++)
                if (caps[2 * g] >= 0 && v->replacement[g]) {
                    t = v->replacement[g];
                    break;
                }
            sb_str(&out, t);
        } else {
            for (const char *q = t; *q; q++) {
                if (*q == '\x01' || *q == '\x02') {
                    int g = *q;
                    if (caps[2 * g] >= 0)
                        add_cps(&out, cp, caps[2 * g], caps[2 * g + 1]);
                } else {
                    sb_add(&out, q, 1);
                }
            }
        }
        copied = caps[1];
        pos = caps[1] > caps[0] ? caps[1] : caps[1] + 1;
        if (caps[1] == caps[0] && caps[1] < n)
            add_cps(&out, cp, caps[1], caps[1] + 1), copied = caps[1] + 1;
    }
    add_cps(&out, cp, copied, n);
    free(cp);
    char *r = sb_done(&out);
    if (!r)
        v->oom = 1;
    return r;
}

/* s.replace(a, b) */
static char *str_replace(const char *s, const char *a, const char *b)
{
    sbuf out = {0};
    size_t la = strlen(a);
    const char *p = s;
    for (const char *hit; (hit = strstr(p, a)) != NULL; p = hit + la) {
        sb_add(&out, p, (size_t)(hit - p));
        sb_str(&out, b);
    }
    sb_str(&out, p);
    return sb_done(&out);
}

/* Replaces *s by f(*s) (frees the old one); 0 on success. */
#define STEP(v, s, expr)                                                                                           \
    do {                                                                                                           \
        char *next_ = (expr);                                                                                      \
        free(s);                                                                                                   \
        (s) = next_;                                                                                               \
        if (!(s)) {                                                                                                \
            (v)->oom |= !(v)->out_of_budget;                                                                       \
            return NULL;                                                                                           \
        }                                                                                                          \
    } while (0)

static int utf8_is_space_at(const char *s, size_t *len)
{
    long n = 0;
    size_t k = 1;
    unsigned char c = (unsigned char)*s;
    if (c >= 0x80) {
        k = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
        for (size_t j = 1; j < k; j++)
            if (!s[j])
                k = 1;
    }
    uint32_t *cp = mre_decode(s, k, &n);
    int sp = cp && n == 1 && mre_is_space(cp[0]);
    free(cp);
    *len = k;
    return sp;
}

/* str.strip() */
static char *py_strip(const char *s)
{
    size_t len = 0;
    while (*s && utf8_is_space_at(s, &len))
        s += len;
    size_t n = strlen(s), end = 0;
    for (size_t i = 0; i < n;) {
        if (!utf8_is_space_at(s + i, &len))
            end = i + len;
        i += len;
    }
    return strndup(s, end);
}

static long cp_count(const char *s, size_t bytes)
{
    long k = 0;
    for (size_t i = 0; i < bytes; i++)
        k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

static int valid_separator(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ',' || s[i] == ';')
            return 1;
        int before = i == 0 || !(s[i - 1] == '_' || (s[i - 1] >= '0' && s[i - 1] <= '9') ||
                                 ((s[i - 1] | 32) >= 'a' && (s[i - 1] | 32) <= 'z') || (unsigned char)s[i - 1] >= 0x80);
        if (!before)
            continue;
        size_t w = i + 3 <= n && memcmp(s + i, "and", 3) == 0 ? 3 : i + 2 <= n && memcmp(s + i, "or", 2) == 0 ? 2 : 0;
        if (w) {
            char c = i + w < n ? s[i + w] : 0;
            if (!(c == '_' || (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z') || (unsigned char)c >= 0x80))
                return 1;
        }
    }
    return 0;
}

/* latex2sympy2_extended's extract_boxed_content: the last \boxed{...} / \fbox{...} (mode last also keeps
 * boxes right before it when only a separator lies between; mode all keeps every box), joined by ','. */
static char *extract_boxed(const char *text, int mode_last)
{
    size_t n = strlen(text), cur = n, max_pos = n;
    char *results[64];
    int nres = 0;
    long last_boxed_start = -1;
    sbuf out = {0};
    for (;;) {
        long bi = -1, fi = -1;
        for (size_t k = cur; k-- > 0;) {
            if (bi < 0 && k + 6 <= cur && memcmp(text + k, "\\boxed", 6) == 0)
                bi = (long)k;
            if (fi < 0 && k + 5 <= cur && memcmp(text + k, "\\fbox", 5) == 0)
                fi = (long)k;
            if (bi >= 0 && fi >= 0)
                break;
            if (bi >= 0 && (long)k < bi - 5)
                break; /* a later \fbox would already have been seen */
        }
        /* rfind with end cur: the command must start before cur (it may run past it) */
        if (bi < 0 && fi < 0)
            break;
        long start = bi > fi ? bi : fi;
        size_t next = (size_t)start + (bi > fi ? 6 : 5);
        size_t sl = 0;
        while (next < max_pos && utf8_is_space_at(text + next, &sl))
            next += sl;
        if (next >= max_pos)
            break;
        if (text[next] == '{') {
            int depth = 1;
            size_t i = next, close = 0;
            while (i + 1 < max_pos) {
                i++;
                if (text[i] == '{')
                    depth++;
                else if (text[i] == '}' && --depth == 0) {
                    close = i;
                    break;
                }
            }
            if (!close) {
                if (nres == 0 && nres < 64)
                    results[nres++] = strdup(text + next);
                break;
            }
            char *raw = strndup(text + next + 1, close - next - 1);
            char *content = raw ? py_strip(raw) : NULL;
            free(raw);
            if (!content)
                break;
            if (mode_last && last_boxed_start >= 0) {
                const char *between = text + close + 1;
                size_t blen = (size_t)last_boxed_start - (close + 1);
                long bcount = cp_count(between, blen);
                const char *prev = nres ? results[nres - 1] : "";
                int keep = bcount < 10 ||
                           (strcmp(content, prev) != 0 && bcount < 70 && valid_separator(between, blen));
                if (!keep) {
                    free(content);
                    break;
                }
            }
            if ((nres == 0 || strcmp(results[nres - 1], content) != 0) && nres < 64)
                results[nres++] = content;
            else
                free(content);
            last_boxed_start = start;
            max_pos = (size_t)start;
        } else {
            if (nres == 0)
                results[nres++] = strdup(text + next);
            break;
        }
        cur = (size_t)start;
    }
    if (nres == 0)
        return strdup(text);
    for (int k = nres - 1; k >= 0; k--) {
        if (results[k])
            sb_str(&out, results[k]);
        if (k)
            sb_str(&out, ",");
        free(results[k]);
    }
    return sb_done(&out);
}

/* hendrycks' _fix_sqrt: \sqrt3 -> \sqrt{3} */
static char *fix_sqrt(const char *text)
{
    if (!strstr(text, "\\sqrt"))
        return strdup(text);
    sbuf out = {0};
    const char *p = strstr(text, "\\sqrt");
    sb_add(&out, text, (size_t)(p - text));
    while (p) {
        const char *s = p + 5, *next = strstr(s, "\\sqrt");
        size_t len = next ? (size_t)(next - s) : strlen(s);
        size_t sl = 0;
        while (len && utf8_is_space_at(s, &sl))
            s += sl, len -= sl;
        if (len > 0 && *s != '{' && *s != '[') {
            size_t cl = 1;
            while (cl < len && ((unsigned char)s[cl] & 0xC0) == 0x80)
                cl++;
            sb_str(&out, "\\sqrt{");
            sb_add(&out, s, cl);
            sb_str(&out, "}");
            sb_add(&out, s + cl, len - cl);
        } else {
            sb_str(&out, "\\sqrt");
            sb_add(&out, s, len);
        }
        p = next;
    }
    return sb_done(&out);
}

/* hendrycks' _fix_fracs: \frac12 -> \frac{1}{2}, \frac1{2} -> \frac{1}{2} */
static char *fix_fracs(const char *text)
{
    const char *p = strstr(text, "\\frac");
    if (!p)
        return strdup(text);
    sbuf out = {0};
    sb_add(&out, text, (size_t)(p - text));
    while (p) {
        const char *s = p + 5, *next = strstr(s, "\\frac");
        size_t len = next ? (size_t)(next - s) : strlen(s);
        size_t sl = 0;
        while (len && utf8_is_space_at(s, &sl))
            s += sl, len -= sl;
        sb_str(&out, "\\frac");
        /* Python indexes code points; these are ASCII in every case that matters */
        if (len > 0 && s[0] == '{') {
            sb_add(&out, s, len);
        } else if (cp_count(s, len) < 2) {
            free(out.d);
            return strdup(text);
        } else {
            size_t la = 1;
            while (la < len && ((unsigned char)s[la] & 0xC0) == 0x80)
                la++;
            size_t lb = 1;
            while (la + lb < len && ((unsigned char)s[la + lb] & 0xC0) == 0x80)
                lb++;
            const char *a = s, *b = s + la;
            if (*b != '{') {
                sb_str(&out, "{");
                sb_add(&out, a, la);
                sb_str(&out, "}{");
                sb_add(&out, b, lb);
                sb_str(&out, "}");
                sb_add(&out, b + lb, len - la - lb);
            } else {
                sb_str(&out, "{");
                sb_add(&out, a, la);
                sb_str(&out, "}");
                sb_add(&out, b, len - la);
            }
        }
        p = next;
    }
    return sb_done(&out);
}

static int canonical_int(const char *s, size_t n)
{
    size_t i = 0;
    if (i < n && s[i] == '-')
        i++;
    if (i >= n)
        return 0;
    if (s[i] == '0')
        return i + 1 == n && s[0] != '-';
    for (; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

/* hendrycks' _fix_a_slash_b: 2/3 -> \frac{2}{3} (only two canonical integers) */
static char *fix_a_slash_b(const char *text)
{
    const char *slash = strchr(text, '/');
    if (!slash || strchr(slash + 1, '/'))
        return strdup(text);
    size_t la = (size_t)(slash - text), lb = strlen(slash + 1);
    if (!canonical_int(text, la) || !canonical_int(slash + 1, lb))
        return strdup(text);
    sbuf out = {0};
    sb_str(&out, "\\frac{");
    sb_add(&out, text, la);
    sb_str(&out, "}{");
    sb_add(&out, slash + 1, lb);
    sb_str(&out, "}");
    return sb_done(&out);
}

/* \\ before a letter becomes \ (a command written with a doubled backslash), outside matrices. */
static char *fix_command_slash(const char *text)
{
    sbuf out = {0};
    for (const char *p = text; *p; p++) {
        if (p[0] == '\\' && p[1] == '\\' && ((p[2] | 32) >= 'a' && (p[2] | 32) <= 'z')) {
            sb_add(&out, "\\", 1);
            p++;
            continue;
        }
        sb_add(&out, p, 1);
    }
    return sb_done(&out);
}

/* latex2sympy2_extended's normalize_latex with math-verify's LatexExtractionConfig (basic_latex, units,
 * malformed_operators, nits; boxed all or last). Returns malloc'd text, NULL on out of memory or budget. */
static char *normalize_latex(math_hf_verifier *v, const char *text, int boxed_last)
{
    char *s = extract_boxed(text, boxed_last);
    if (!s) {
        v->oom = 1;
        return NULL;
    }
    STEP(v, s, str_replace(s, "\\mathrm{T}", "T"));
    STEP(v, s, str_replace(s, "\\mathrm{d}", "d"));
    STEP(v, s, str_replace(s, "{\\rm d}", "d"));
    STEP(v, s, str_replace(s, "\\left[\\begin{matrix}", "\\begin{bmatrix}"));
    STEP(v, s, str_replace(s, "\\end{matrix}\\right]", "\\end{bmatrix}"));
    STEP(v, s, re_sub(v, v->r_left, s, "\x01"));
    STEP(v, s, re_sub(v, v->r_right, s, "\x01"));
    STEP(v, s, re_sub(v, v->permutation, s, "\\frac{(\x01)!}{((\x01)-(\x02))!}"));
    STEP(v, s, re_sub(v, v->to_remove, s, ""));
    STEP(v, s, re_sub(v, v->to_replace, s, NULL));
    STEP(v, s, str_replace(s, "\n", " "));
    STEP(v, s, str_replace(s, "\t", " "));
    if (!strstr(s, "matrix"))
        STEP(v, s, fix_command_slash(s));
    /* units */
    char *t = re_sub(v, v->unit_superscript, s, "");
    char *ts = t ? py_strip(t) : NULL;
    free(t);
    if (!ts) {
        free(s);
        v->oom |= !v->out_of_budget;
        return NULL;
    }
    if (ts[0] && strcmp(ts, s) != 0) {
        free(s);
        s = ts;
    } else {
        free(ts);
    }
    for (int k = 0; k < 2; k++) {
        char *u = re_sub(v, v->units, s, "\x01");
        if (!u) {
            free(s);
            return NULL;
        }
        if (u[0] && strcmp(u, s) != 0) {
            free(s);
            s = u;
        } else {
            free(u);
        }
    }
    /* nits */
    if (s[0] == '.') {
        sbuf b = {0};
        sb_str(&b, "0");
        sb_str(&b, s);
        STEP(v, s, sb_done(&b));
    }
    if (strcmp(s, "0.5") == 0)
        STEP(v, s, strdup("\\frac{1}{2}"));
    /* malformed operators */
    for (int k = 0; k < NORM_MALFORMED; k++)
        STEP(v, s, re_sub(v, v->malformed[k], s, malformed_ops[k].tmpl));
    STEP(v, s, str_replace(s, " sqrt", "\\sqrt"));
    STEP(v, s, fix_sqrt(s));
    STEP(v, s, fix_fracs(s));
    STEP(v, s, fix_a_slash_b(s));
    STEP(v, s, py_strip(s));
    return s;
}

/* ---- extraction ---------------------------------------------------------------------------------------------- */


/* The text of group g of a match (malloc'd), or NULL when it did not take part. */
static char *group_text(const uint32_t *cp, const long *caps, int g)
{
    if (g < 0 || caps[2 * g] < 0)
        return NULL;
    return mre_encode(cp + caps[2 * g], caps[2 * g + 1] - caps[2 * g]);
}

static int first_group_with_prefix(const mre_prog *prog, const long *caps, const char *prefix)
{
    size_t n = strlen(prefix);
    for (int g = 1; g < mre_ngroups(prog); g++) {
        const char *name = mre_group_name(prog, g);
        if (name && strncmp(name, prefix, n) == 0 && caps[2 * g] >= 0 && caps[2 * g + 1] > caps[2 * g])
            return g;
    }
    return -1;
}

/* Parses a LaTeX match's environments (first_ and next1_ .. next5_) into ar; *fallback gets the first normalised
 * text (or all joined by " and " when several parsed). Returns a value or -1. */
static int extract_latex(math_hf_verifier *v, const pattern *pat, const uint32_t *cp, const long *caps,
                         mx_arena *ar, char **fallback)
{
    int values[6], nv = 0, all_parsed = 1;
    char *strs[6] = {0};
    mx_reset(ar);
    for (int i = 0; i < 6; i++) {
        char prefix[24];
        if (i == 0)
            snprintf(prefix, sizeof prefix, "first_latex");
        else
            snprintf(prefix, sizeof prefix, "next%d_latex", i);
        int g = first_group_with_prefix(pat->prog, caps, prefix);
        if (g < 0)
            continue;
        const char *name = mre_group_name(pat->prog, g);
        const char *us = strchr(name, '_');
        int boxed_last = us && strcmp(us + 1, "latexBoxed") == 0;
        char pct_name[24];
        snprintf(pct_name, sizeof pct_name, "%.*s_percent", (int)(us - name), name);
        int pg = mre_group(pat->prog, pct_name);
        int is_pct = pg > 0 && caps[2 * pg] >= 0 && caps[2 * pg + 1] > caps[2 * pg];
        char *raw = group_text(cp, caps, g);
        char *norm = raw ? normalize_latex(v, raw, boxed_last) : NULL;
        free(raw);
        if (!norm) {
            for (int k = 0; k < nv; k++)
                free(strs[k]);
            return -1;
        }
        int val = mlp_parse_latex(ar, norm);
        if (val >= 0 && is_pct) {
            if (ar->vals[val].kind == MV_EXPR)
                val = mv_expr(ar, mx_bin(ar, MX_PCT, ar->vals[val].expr, mx_num_int(ar, 0)));
            else
                val = -1;
        }
        if (ar->overflow)
            val = -1;
        strs[nv] = norm;
        values[nv++] = val;
        all_parsed &= val >= 0;
    }
    if (nv == 0)
        return -1;
    int result = values[0];
    if (nv > 1 && all_parsed) {
        int items[MX_MAX_VALUES], ni = 0;
        for (int k = 0; k < nv; k++) {
            const mv *x = &ar->vals[values[k]];
            if (x->kind == MV_SET) {
                for (int j = 0; j < x->n && ni < MX_MAX_VALUES; j++)
                    items[ni++] = ar->items[x->first + j];
            } else if (ni < MX_MAX_VALUES) {
                items[ni++] = values[k];
            }
        }
        result = mv_new(ar, MV_SET);
        int first = ar->nitems;
        for (int k = 0; k < ni && result >= 0; k++)
            if (mv_push_item(ar, items[k]) < 0)
                result = -1;
        if (result >= 0) {
            ar->vals[result].first = first;
            ar->vals[result].n = ni;
        }
        sbuf b = {0};
        for (int k = 0; k < nv; k++) {
            if (k)
                sb_str(&b, " and ");
            sb_str(&b, strs[k]);
        }
        *fallback = sb_done(&b);
        for (int k = 0; k < nv; k++)
            free(strs[k]);
    } else {
        *fallback = strs[0];
        for (int k = 1; k < nv; k++)
            free(strs[k]);
    }
    return ar->overflow ? -1 : result;
}

/* A number or expression match: integer / decimal / percent groups, or the expression parsed as sympy would. */
static int extract_expr(const pattern *pat, const uint32_t *cp, const long *caps, mx_arena *ar, char **fallback)
{
    static const char *const ints[] = {"integer1", "integer2", "integer3"};
    static const char *const decs[] = {"decimal1", "decimal2", "decimal3"};
    char *integer = NULL, *decimal = NULL;
    for (int k = 0; k < 3 && !integer; k++) {
        int g = mre_group(pat->prog, ints[k]);
        if (g > 0 && caps[2 * g + 1] > caps[2 * g])
            integer = group_text(cp, caps, g);
    }
    for (int k = 0; k < 3 && !decimal; k++) {
        int g = mre_group(pat->prog, decs[k]);
        if (g > 0 && caps[2 * g + 1] > caps[2 * g])
            decimal = group_text(cp, caps, g);
    }
    int pg = mre_group(pat->prog, "percent");
    int is_pct = pg > 0 && caps[2 * pg + 1] > caps[2 * pg];
    mx_reset(ar);
    if (integer || decimal) {
        sbuf b = {0};
        /* thousands separators out, leading zeros off (an empty integer part is 0) */
        const char *s = integer ? integer : "";
        size_t k = 0;
        char digits[512];
        for (const char *q = s; *q && k + 1 < sizeof digits; q++)
            if (*q != ',' && *q != ' ')
                digits[k++] = *q;
        digits[k] = '\0';
        const char *d = digits;
        while (*d == '0')
            d++;
        sb_str(&b, *d ? d : "0");
        if (decimal) {
            for (char *q = decimal; *q; q++)
                if (*q == ',')
                    *q = '.';
            sb_str(&b, decimal);
        }
        free(integer);
        free(decimal);
        char *num = sb_done(&b);
        if (!num)
            return -1;
        int e = mlp_parse_plain(ar, num);
        *fallback = num;
        if (e < 0)
            return -1;
        if (is_pct)
            e = mx_bin(ar, MX_PCT, e, mx_num_int(ar, 0));
        return ar->overflow ? -1 : mv_expr(ar, e);
    }
    free(integer);
    free(decimal);
    char *expr = group_text(cp, caps, mre_group(pat->prog, "expr"));
    if (!expr || !expr[0]) {
        free(expr);
        return -1;
    }
    *fallback = expr;
    int e = mlp_parse_plain(ar, expr);
    return e < 0 || ar->overflow ? -1 : mv_expr(ar, e);
}

static int cmp_matches(const void *a, const void *b)
{
    const match *x = a, *y = b;
    if (x->end != y->end)
        return x->end > y->end ? -1 : 1;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    return x->pattern < y->pattern ? -1 : x->pattern > y->pattern; /* stable: pattern order, then position */
}

/* math-verify's extract_target_from_pred + parse(fallback_mode="first_match"). *value: the parsed answer or -1;
 * *fallback: the first match's text or NULL. Returns 0, or -1 when a budget ran out or memory did. */
static int extract(math_hf_verifier *v, const char *text, int gold, mx_arena *ar, int *value, char **fallback)
{
    const pattern *pats = gold ? v->gold : v->pred;
    int npats = gold ? v->ngold : v->npred;
    *value = -1;
    *fallback = NULL;
    long n = 0;
    uint32_t *cp = mre_decode(text, strlen(text), &n);
    match *matches = v->matches;
    long *capstore = v->capstore;
    if (!cp) {
        v->oom = 1;
        return -1;
    }
    int rc = 0;
    for (int first = 0; first < npats && *value < 0 && rc == 0;) {
        int last = first;
        while (last < npats && pats[last].priority == pats[first].priority)
            last++;
        int nm = 0;
        for (int k = first; k < last && rc == 0; k++) {
            long pos = 0;
            while (pos <= n) {
                if (nm == MAX_MATCHES) {
                    /* keep the later half: matches are tried from the one ending last */
                    int keep = MAX_MATCHES / 2;
                    for (int j = 0; j < keep; j++) {
                        memcpy(capstore + (size_t)j * MATCH_CAPS, matches[nm - keep + j].caps,
                               MATCH_CAPS * sizeof *capstore);
                        matches[j] = matches[nm - keep + j];
                        matches[j].caps = capstore + (size_t)j * MATCH_CAPS;
                    }
                    nm = keep;
                }
                long *caps = capstore + (size_t)nm * MATCH_CAPS;
                int r = mre_search(pats[k].prog, cp, n, pos, caps, &v->budget);
                if (r == MRE_BUDGET) {
                    v->out_of_budget = 1;
                    rc = -1;
                    break;
                }
                if (r != MRE_MATCH)
                    break;
                matches[nm++] = (match){caps[0], caps[1], k, caps};
                pos = caps[1] > caps[0] ? caps[1] : caps[1] + 1;
            }
        }
        /* stable order: by pattern then start is how they were found; sort keeps it for equal (end, start) */
        qsort(matches, (size_t)nm, sizeof *matches, cmp_matches);
        for (int m = 0; m < nm && rc == 0; m++) {
            char *fb = NULL;
            const pattern *pat = &pats[matches[m].pattern];
            int val = pat->kind == PK_LATEX ? extract_latex(v, pat, cp, matches[m].caps, ar, &fb)
                                            : extract_expr(pat, cp, matches[m].caps, ar, &fb);
            if (v->out_of_budget || v->oom) {
                free(fb);
                rc = -1;
                break;
            }
            if (fb && fb[0] && !*fallback)
                *fallback = fb;
            else
                free(fb);
            if (val >= 0) {
                *value = val;
                break;
            }
        }
        first = last;
    }
    free(cp);
    return rc;
}

char *math_hf_extracted(math_hf_verifier *v, const char *text, int gold)
{
    int value;
    char *fallback = NULL;
    v->budget = MATH_HF_STEP_BUDGET;
    v->out_of_budget = v->oom = 0;
    if (extract(v, text, gold, gold ? v->gold_arena : v->pred_arena, &value, &fallback) < 0) {
        free(fallback);
        return NULL;
    }
    return fallback;
}

static int strings_equal(const char *a, const char *b)
{
    char *x = py_strip(a), *y = py_strip(b);
    int eq = x && y && x[0] && y[0] && strcmp(x, y) == 0;
    free(x);
    free(y);
    return eq;
}

int math_hf_verify(math_hf_verifier *v, const char *response, const char *ground_truth, const char **why)
{
    static const char *dummy;
    if (!why)
        why = &dummy;
    if (strlen(response) > MATH_HF_MAX_RESPONSE) {
        *why = "the response is longer than hf_math_verify's 256 KiB cap";
        return MATH_HF_FAILED;
    }
    v->budget = MATH_HF_STEP_BUDGET;
    v->out_of_budget = v->oom = 0;
    sbuf b = {0};
    sb_str(&b, "\\boxed{");
    sb_str(&b, ground_truth);
    sb_str(&b, "}");
    char *wrapped = sb_done(&b);
    if (!wrapped) {
        *why = "out of memory";
        return MATH_HF_FAILED;
    }
    int gv, pv;
    char *gs = NULL, *ps = NULL;
    int rc = extract(v, wrapped, 1, v->gold_arena, &gv, &gs);
    free(wrapped);
    if (rc == 0 && gv < 0 && !gs) {
        *why = "nothing could be extracted from the ground truth";
        return MATH_HF_FAILED;
    }
    if (rc == 0)
        rc = extract(v, response, 0, v->pred_arena, &pv, &ps);
    if (rc < 0) {
        free(gs);
        free(ps);
        *why = v->oom ? "out of memory" : "the answer exceeded hf_math_verify's regex step budget";
        return MATH_HF_FAILED;
    }
    int correct = (gv >= 0 && pv >= 0 && mhf_values_equal(v->gold_arena, gv, v->pred_arena, pv)) ||
                  (gs && ps && strings_equal(gs, ps));
    free(gs);
    free(ps);
    return correct ? MATH_HF_CORRECT : MATH_HF_WRONG;
}
