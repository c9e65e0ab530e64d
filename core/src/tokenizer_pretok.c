/* tokenizer_pretok.c: the pre-tokenisation regexes of GPT-2, cl100k (GLM-4/GLM-5, Llama-3) and Qwen2, written
 * out by hand. Each alternative is a function returning the length of its match at p (0: no match); the regex
 * tries them in order at each position and the first that matches wins (leftmost-first alternation, as in
 * Oniguruma and the regex crate). The comments give the backtracking argument where greediness matters. */
#include "tokenizer_internal.h"

#include <string.h>

uint32_t tokenizer_decode_utf8(const char *p, const char *end, size_t *n)
{
    const unsigned char *u = (const unsigned char *)p;
    size_t avail = (size_t)(end - p);
    unsigned char c = u[0];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || len > avail) {
        *n = 1;
        return c;
    }
    for (size_t i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            *n = 1;
            return c;
        }
    }
    *n = len;
    if (len == 1)
        return c;
    if (len == 2)
        return ((uint32_t)(c & 0x1F) << 6) | (u[1] & 0x3F);
    if (len == 3)
        return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
    return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) |
           (u[3] & 0x3F);
}

/* \s: the Unicode White_Space property. */
static bool is_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

typedef enum char_class { CLASS_LETTER, CLASS_NUMBER, CLASS_SPACE, CLASS_OTHER } char_class;

static char_class classify(uint32_t c)
{
    if (is_space(c))
        return CLASS_SPACE;
    if (tokenizer_is_letter(c))
        return CLASS_LETTER;
    if (tokenizer_is_number(c))
        return CLASS_NUMBER;
    return CLASS_OTHER;
}

/* The code point at p and its class; *n = its byte length (0 at end). */
static char_class class_at(const char *p, const char *end, uint32_t *cp, size_t *n)
{
    if (p >= end) {
        *n = 0;
        *cp = 0;
        return CLASS_OTHER;
    }
    *cp = tokenizer_decode_utf8(p, end, n);
    if (*n == 1 && *cp >= 0x80)
        return CLASS_OTHER; // a byte of invalid UTF-8 (e.g. sampled by a model): never a letter or a digit
    return classify(*cp);
}

/* End of the run of code points of class k starting at p, taking at most max of them (0 = no limit). */
static const char *run_end(const char *p, const char *end, char_class k, size_t max)
{
    size_t count = 0;
    while (p < end && (max == 0 || count < max)) {
        uint32_t cp;
        size_t n;
        if (class_at(p, end, &cp, &n) != k)
            break;
        p += n;
        count++;
    }
    return p;
}

/* 's|'t|'re|'ve|'m|'ll|'d, case-folded (ASCII) when icase. */
static size_t match_contraction(const char *p, const char *end, bool icase)
{
    static const char *const tails[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    if (*p != '\'')
        return 0;
    for (size_t i = 0; i < sizeof tails / sizeof *tails; i++) {
        size_t n = strlen(tails[i]);
        if ((size_t)(end - p) < n + 1)
            continue;
        bool ok = true;
        for (size_t j = 0; j < n && ok; j++) {
            char c = p[1 + j];
            if (icase && c >= 'A' && c <= 'Z')
                c = (char)(c - 'A' + 'a');
            ok = c == tails[i][j];
        }
        if (ok)
            return n + 1;
    }
    return 0;
}

/* " ?K+": an optional ASCII space, then one or more of class K. The space is taken only when K follows it
 * (K is never the space's own class here, so backtracking cannot help otherwise). */
static size_t match_space_then_run(const char *p, const char *end, char_class k)
{
    const char *q = p;
    uint32_t cp;
    size_t n;
    if (*q == ' ' && q + 1 < end && class_at(q + 1, end, &cp, &n) == k)
        q++;
    const char *e = run_end(q, end, k, 0);
    return e > q ? (size_t)(e - p) : 0;
}

/* \s+(?!\S): all the whitespace when it runs to the end of the text; otherwise all but its last code point
 * (so the last one can join the next word as its prefix), which needs at least two. */
static size_t match_space_not_before_word(const char *p, const char *end)
{
    const char *e = p, *last = NULL;
    uint32_t cp;
    size_t n;
    while (e < end && class_at(e, end, &cp, &n) == CLASS_SPACE) {
        last = e;
        e += n;
    }
    if (e == p)
        return 0;
    if (e == end)
        return (size_t)(e - p);
    return last > p ? (size_t)(last - p) : 0;
}

/* \s+ */
static size_t match_space(const char *p, const char *end) { return (size_t)(run_end(p, end, CLASS_SPACE, 0) - p); }

/* \s*[\r\n]+: greedy \s* gives back code points until [\r\n]+ can start, i.e. up to the last '\r' or '\n' of
 * the whitespace run (that one newline, since any newline after it would have been later). */
static size_t match_space_then_newlines(const char *p, const char *end)
{
    const char *e = p, *after_last_newline = NULL;
    uint32_t cp;
    size_t n;
    while (e < end && class_at(e, end, &cp, &n) == CLASS_SPACE) {
        e += n;
        if (cp == '\r' || cp == '\n')
            after_last_newline = e;
    }
    return after_last_newline ? (size_t)(after_last_newline - p) : 0;
}

/* [^\r\n\p{L}\p{N}]?\p{L}+ */
static size_t match_prefixed_letters(const char *p, const char *end)
{
    uint32_t c0, c1;
    size_t n0, n1;
    char_class k0 = class_at(p, end, &c0, &n0);
    if (k0 == CLASS_LETTER)
        return (size_t)(run_end(p, end, CLASS_LETTER, 0) - p);
    if (c0 == '\r' || c0 == '\n' || k0 == CLASS_NUMBER)
        return 0;
    if (class_at(p + n0, end, &c1, &n1) != CLASS_LETTER)
        return 0;
    return (size_t)(run_end(p + n0, end, CLASS_LETTER, 0) - p);
}

/*  ?[^\s\p{L}\p{N}]+[\r\n]* */
static size_t match_symbols_then_newlines(const char *p, const char *end)
{
    size_t m = match_space_then_run(p, end, CLASS_OTHER);
    if (m == 0)
        return 0;
    const char *e = p + m;
    while (e < end && (*e == '\r' || *e == '\n'))
        e++;
    return (size_t)(e - p);
}

static size_t match_gpt2(const char *p, const char *end)
{
    size_t m;
    if ((m = match_contraction(p, end, false)) || (m = match_space_then_run(p, end, CLASS_LETTER)) ||
        (m = match_space_then_run(p, end, CLASS_NUMBER)) || (m = match_space_then_run(p, end, CLASS_OTHER)) ||
        (m = match_space_not_before_word(p, end)) || (m = match_space(p, end)))
        return m;
    return 0;
}

static size_t match_cl100k(const char *p, const char *end, size_t max_digits)
{
    size_t m;
    if ((m = match_contraction(p, end, true)) || (m = match_prefixed_letters(p, end)) ||
        (m = (size_t)(run_end(p, end, CLASS_NUMBER, max_digits) - p)) || (m = match_symbols_then_newlines(p, end)) ||
        (m = match_space_then_newlines(p, end)) || (m = match_space_not_before_word(p, end)) ||
        (m = match_space(p, end)))
        return m;
    return 0;
}

int tokenizer_pretokenize(pretok_pattern pattern, const char *text, size_t len,
                          int (*piece)(void *ctx, const char *start, size_t len), void *ctx)
{
    if (pattern == PRETOK_NONE)
        return len ? piece(ctx, text, len) : 0;
    const char *p = text, *end = text + len;
    while (p < end) {
        size_t m = pattern == PRETOK_GPT2     ? match_gpt2(p, end)
                   : pattern == PRETOK_CL100K ? match_cl100k(p, end, 3)
                                              : match_cl100k(p, end, 1);
        if (m == 0) {
            // Every code point is a letter, number, space or other, so some alternative always matches; keep one
            // code point as its own piece should that ever change ("Isolated": gaps are pieces too).
            tokenizer_decode_utf8(p, end, &m);
        }
        int rc = piece(ctx, p, m);
        if (rc)
            return rc;
        p += m;
    }
    return 0;
}
