/* jinja_lex.c: template text -> tokens. Whitespace follows Jinja as transformers configures it:
 *   line endings become "\n" and one trailing newline of the template is dropped (keep_trailing_newline off);
 *   trim_blocks: the first newline after a block or comment tag is removed;
 *   lstrip_blocks: spaces and tabs from the start of a line up to a block or comment tag are removed;
 *   "{%-" / "-%}" (and {{- -}}, {#- -#}) strip all whitespace on that side, "{%+" / "+%}" keep it. */
#include "jinja_internal.h"

#include <ctype.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

typedef struct lexer {
    const char *name;
    const char *src;
    size_t len, pos;
    int line;
    jtok_list *out;
    dsarl_error *err;
} lexer;

static int push(lexer *lx, jtok_kind kind, const char *text, size_t len, int line)
{
    jtok_list *l = lx->out;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        jtok *p = realloc(l->items, cap * sizeof *p);
        if (!p)
            return DSARL_FAIL(lx->err, DSARL_E_NOMEM, "chat template %s: out of memory", lx->name);
        l->items = p;
        l->cap = cap;
    }
    jtok *t = &l->items[l->n];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->line = line;
    t->text = malloc(len + 1);
    if (!t->text)
        return DSARL_FAIL(lx->err, DSARL_E_NOMEM, "chat template %s: out of memory", lx->name);
    if (len)
        memcpy(t->text, text, len);
    t->text[len] = '\0';
    t->len = len;
    l->n++;
    return 0;
}

static int count_lines(const char *s, size_t n)
{
    int lines = 0;
    for (size_t i = 0; i < n; i++)
        lines += s[i] == '\n';
    return lines;
}

/* Length of the whitespace run at s (Python's \s, Unicode-aware). */
static size_t space_run(const char *s, size_t n)
{
    size_t i = 0, k;
    while (i < n && jutf8_space_at(s + i, n - i, &k))
        i += k;
    return i;
}

/* A Python string literal body (between the quotes) decoded as Jinja does (unicode-escape). */
static int decode_string(lexer *lx, const char *s, size_t n, int line)
{
    char *buf = malloc(n + 1);
    if (!buf)
        return DSARL_FAIL(lx->err, DSARL_E_NOMEM, "chat template %s: out of memory", lx->name);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 == n) {
            buf[o++] = s[i];
            continue;
        }
        char c = s[++i];
        const char *simple = strchr("ntr\\'\"abfv0\n", c);
        if (c && simple && c != '0') {
            static const char from[] = "ntr\\'\"abfv";
            static const char to[] = "\n\t\r\\'\"\a\b\f\v";
            if (c != '\n')
                buf[o++] = to[strchr(from, c) - from];
        } else if (c == 'x' || c == 'u' || c == 'U' || (c >= '0' && c <= '7')) {
            int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 3;
            int base = c >= '0' && c <= '7' ? 8 : 16;
            size_t start = base == 8 ? i : i + 1;
            uint32_t cp = 0;
            int got = 0;
            for (size_t j = start; j < n && got < digits; j++, got++) {
                int d = isdigit((unsigned char)s[j])                  ? s[j] - '0'
                        : base == 16 && isxdigit((unsigned char)s[j]) ? tolower((unsigned char)s[j]) - 'a' + 10
                                                                      : -1;
                if (d < 0 || d >= base)
                    break;
                cp = cp * (uint32_t)base + (uint32_t)d;
            }
            if ((base == 16 && got != digits) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
                free(buf);
                return DSARL_FAIL(lx->err, DSARL_E_INVALID,
                                  "chat template %s: line %d: bad \\%c escape in a "
                                  "string literal",
                                  lx->name, line, c);
            }
            i = start + (size_t)got - 1;
            // encode cp as UTF-8 (at most 4 bytes; an escape is at least 2 source bytes, \U 10, so it fits)
            if (cp < 0x80) {
                buf[o++] = (char)cp;
            } else if (cp < 0x800) {
                buf[o++] = (char)(0xC0 | cp >> 6);
                buf[o++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                buf[o++] = (char)(0xE0 | cp >> 12);
                buf[o++] = (char)(0x80 | (cp >> 6 & 0x3F));
                buf[o++] = (char)(0x80 | (cp & 0x3F));
            } else {
                buf[o++] = (char)(0xF0 | cp >> 18);
                buf[o++] = (char)(0x80 | (cp >> 12 & 0x3F));
                buf[o++] = (char)(0x80 | (cp >> 6 & 0x3F));
                buf[o++] = (char)(0x80 | (cp & 0x3F));
            }
        } else {
            buf[o++] = '\\'; // Python keeps an unknown escape as written
            buf[o++] = c;
        }
    }
    int rc = push(lx, JT_STRING, buf, o, line);
    free(buf);
    return rc;
}

static const char *const operators[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "(",
                                        ")",  "[",  "]",  "{",  "}",  ",",  ".", ":", "|", "=", "<", ">", ";"};

/* Tokens of one {{ ... }} or {% ... %} up to its end marker; *strip_after says whether "-" closed it. */
static int lex_tag(lexer *lx, bool block, bool *strip_after, bool *keep_after)
{
    int depth = 0; // brackets open: "}}" inside a dict literal is no end marker
    const char *s = lx->src;
    for (;;) {
        size_t ws = space_run(s + lx->pos, lx->len - lx->pos);
        lx->line += count_lines(s + lx->pos, ws);
        lx->pos += ws;
        size_t p = lx->pos;
        if (p >= lx->len)
            return DSARL_FAIL(lx->err, DSARL_E_INVALID, "chat template %s: line %d: a %s tag is never closed", lx->name,
                              lx->line, block ? "{%" : "{{");
        const char *end = block ? "%}" : "}}";
        size_t mod = (s[p] == '-' || s[p] == '+') ? 1 : 0;
        if (depth == 0 && p + mod + 2 <= lx->len && memcmp(s + p + mod, end, 2) == 0 &&
            (mod == 0 || block || s[p] == '-')) {
            *strip_after = mod && s[p] == '-';
            *keep_after = mod && s[p] == '+';
            lx->pos = p + mod + 2;
            return push(lx, block ? JT_BLOCK_END : JT_VAR_END, end, 2, lx->line);
        }
        char c = s[p];
        if (c == '\n') { // never reached (whitespace skipped) but keeps lines right if the rule changes
            lx->pos++;
            continue;
        }
        if (isalpha((unsigned char)c) || c == '_') {
            size_t q = p;
            while (q < lx->len && (isalnum((unsigned char)s[q]) || s[q] == '_'))
                q++;
            DSARL_TRY(push(lx, JT_NAME, s + p, q - p, lx->line));
            lx->pos = q;
        } else if (isdigit((unsigned char)c)) {
            size_t q = p;
            bool is_float = false;
            while (q < lx->len && (isdigit((unsigned char)s[q]) || s[q] == '_'))
                q++;
            if (q + 1 < lx->len && s[q] == '.' && isdigit((unsigned char)s[q + 1])) {
                is_float = true;
                q++;
                while (q < lx->len && isdigit((unsigned char)s[q]))
                    q++;
            }
            if (q < lx->len && (s[q] == 'e' || s[q] == 'E')) {
                size_t r = q + 1;
                if (r < lx->len && (s[r] == '+' || s[r] == '-'))
                    r++;
                if (r < lx->len && isdigit((unsigned char)s[r])) {
                    is_float = true;
                    q = r;
                    while (q < lx->len && isdigit((unsigned char)s[q]))
                        q++;
                }
            }
            char num[64];
            size_t k = 0;
            for (size_t i = p; i < q && k + 1 < sizeof num; i++)
                if (s[i] != '_')
                    num[k++] = s[i];
            num[k] = '\0';
            DSARL_TRY(push(lx, is_float ? JT_FLOAT : JT_INT, s + p, q - p, lx->line));
            jtok *t = &lx->out->items[lx->out->n - 1];
            if (is_float) {
                t->fval = strtod(num, NULL);
            } else {
                char *endp;
                long long v = strtoll(num, &endp, 10);
                if (q - p > 18 && v == LLONG_MAX)
                    return DSARL_FAIL(lx->err, DSARL_E_UNSUPPORTED,
                                      "chat template %s: line %d: integer literal "
                                      "%s is larger than 64 bits",
                                      lx->name, lx->line, num);
                t->ival = v;
            }
            lx->pos = q;
        } else if (c == '\'' || c == '"') {
            size_t q = p + 1;
            int line = lx->line;
            while (q < lx->len && s[q] != c) {
                if (s[q] == '\\' && q + 1 < lx->len)
                    q++;
                q++;
            }
            if (q >= lx->len)
                return DSARL_FAIL(lx->err, DSARL_E_INVALID,
                                  "chat template %s: line %d: a string literal is never "
                                  "closed",
                                  lx->name, line);
            DSARL_TRY(decode_string(lx, s + p + 1, q - p - 1, line));
            lx->line += count_lines(s + p, q - p);
            lx->pos = q + 1;
        } else {
            size_t i = 0;
            for (; i < (sizeof operators / sizeof operators[0]); i++) {
                size_t n = strlen(operators[i]);
                if (p + n <= lx->len && memcmp(s + p, operators[i], n) == 0)
                    break;
            }
            if (i == (sizeof operators / sizeof operators[0]))
                return DSARL_FAIL(lx->err, DSARL_E_INVALID,
                                  "chat template %s: line %d: unexpected character '%c' "
                                  "inside a tag",
                                  lx->name, lx->line, c);
            const char *op = operators[i];
            if (op[0] == '(' || op[0] == '[' || op[0] == '{')
                depth++;
            else if ((op[0] == ')' || op[0] == ']' || op[0] == '}') && depth > 0)
                depth--;
            DSARL_TRY(push(lx, JT_OP, op, strlen(op), lx->line));
            lx->pos = p + strlen(op);
        }
    }
}

int jinja_lex(const char *name, const char *source, size_t len, jtok_list *out, dsarl_error *err)
{
    memset(out, 0, sizeof *out);
    // Jinja joins source.splitlines() with "\n": \r\n and \r become \n, and a final newline goes.
    char *src = malloc(len + 1);
    if (!src)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "chat template %s: out of memory", name);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (source[i] == '\r') {
            src[n++] = '\n';
            if (i + 1 < len && source[i + 1] == '\n')
                i++;
        } else {
            src[n++] = source[i];
        }
    }
    if (n && src[n - 1] == '\n')
        n--;
    src[n] = '\0';
    lexer lx = {name, src, n, 0, 1, out, err};
    bool line_starting = true, strip_next = false;
    int rc = 0;
    while (rc == 0 && lx.pos < n) {
        if (strip_next) {
            size_t k = space_run(src + lx.pos, n - lx.pos);
            lx.line += count_lines(src + lx.pos, k);
            lx.pos += k;
            strip_next = false;
        }
        // the next tag start
        size_t t = lx.pos;
        while (t + 1 < n && !(src[t] == '{' && (src[t + 1] == '{' || src[t + 1] == '%' || src[t + 1] == '#')))
            t++;
        if (t + 1 >= n)
            t = n;
        size_t text_end = t;
        char kind = t < n ? src[t + 1] : 0;
        char mod = t + 2 < n && (src[t + 2] == '-' || src[t + 2] == '+') ? src[t + 2] : 0;
        if (kind && mod == '-') {
            text_end = lx.pos + (t - lx.pos) - jutf8_trailing_space(src + lx.pos, t - lx.pos);
        } else if (kind && mod != '+' && kind != '{') { // lstrip_blocks
            size_t l = t;
            while (l > lx.pos && src[l - 1] != '\n')
                l--;
            bool after_newline = l > lx.pos || line_starting;
            if (after_newline && l < t && space_run(src + l, t - l) == t - l)
                text_end = l;
        }
        if (text_end > lx.pos)
            rc = push(&lx, JT_TEXT, src + lx.pos, text_end - lx.pos, lx.line);
        lx.line += count_lines(src + lx.pos, t - lx.pos);
        lx.pos = t;
        if (rc || t >= n)
            break;
        lx.pos = t + 2 + (mod ? 1 : 0);
        bool strip_after = false, keep_after = false;
        if (kind == '#') {
            size_t e = lx.pos;
            while (e + 1 < n && !(src[e] == '#' && src[e + 1] == '}'))
                e++;
            if (e + 1 >= n) {
                rc = DSARL_FAIL(err, DSARL_E_INVALID, "chat template %s: line %d: a {# comment is never closed", name,
                                lx.line);
                break;
            }
            strip_after = e > lx.pos && src[e - 1] == '-';
            keep_after = e > lx.pos && src[e - 1] == '+';
            lx.line += count_lines(src + lx.pos, e - lx.pos);
            lx.pos = e + 2;
        } else {
            int start_line = lx.line;
            bool block = kind == '%';
            // {% raw %} would need its own lexer state; refuse it by name
            size_t q = lx.pos + space_run(src + lx.pos, n - lx.pos);
            if (block && q + 3 <= n && memcmp(src + q, "raw", 3) == 0 &&
                (q + 3 == n || !(isalnum((unsigned char)src[q + 3]) || src[q + 3] == '_'))) {
                rc = DSARL_FAIL(err, DSARL_E_UNSUPPORTED,
                                "chat template %s: line %d: unsupported construct "
                                "'{%% raw %%}'",
                                name, lx.line);
                break;
            }
            rc = push(&lx, block ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, block ? "{%" : "{{", 2, start_line);
            if (rc == 0)
                rc = lex_tag(&lx, block, &strip_after, &keep_after);
            if (rc)
                break;
        }
        line_starting = false;
        if (strip_after) {
            strip_next = true;
            size_t k = space_run(src + lx.pos, n - lx.pos);
            line_starting = k > 0 && src[lx.pos + k - 1] == '\n';
        } else if (!keep_after && kind != '{' && lx.pos < n && src[lx.pos] == '\n') { // trim_blocks
            lx.pos++;
            lx.line++;
            line_starting = true;
        }
    }
    if (rc == 0)
        rc = push(&lx, JT_EOF, "", 0, lx.line);
    free(src);
    if (rc)
        jinja_tokens_free(out);
    return rc;
}

void jinja_tokens_free(jtok_list *toks)
{
    for (size_t i = 0; i < toks->n; i++)
        free(toks->items[i].text);
    free(toks->items);
    memset(toks, 0, sizeof *toks);
}
