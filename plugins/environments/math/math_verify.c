/* math_verify.c: answer extraction and normalize_final_answer, transcribed from NeMo RL's dapo_math_verifier.py
 * (= verl math_dapo.py = lm-eval minerva_math). Each regex of the Python original is a hand-written scan here; the
 * comment above each says which regex and how re.sub/re.findall would walk it. */
#define _POSIX_C_SOURCE 200809L /* strdup, strndup */
#include "math_verify.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* ---- a growable string ------------------------------------------------------------------------------------- */

typedef struct strbuf {
    char *data;
    size_t len, cap;
    bool oom;
} strbuf;

static void sb_append(strbuf *sb, const char *s, size_t n)
{
    if (sb->oom)
        return;
    if (sb->len + n + 1 > sb->cap) {
        size_t cap = sb->cap ? sb->cap : 64;
        while (cap < sb->len + n + 1)
            cap *= 2;
        char *p = realloc(sb->data, cap);
        if (!p) {
            sb->oom = true;
            return;
        }
        sb->data = p;
        sb->cap = cap;
    }
    memcpy(sb->data + sb->len, s, n);
    sb->len += n;
    sb->data[sb->len] = '\0';
}

static void sb_puts(strbuf *sb, const char *s) { sb_append(sb, s, strlen(s)); }

/* Hands the string over (never NULL unless out of memory); the strbuf is left empty. */
static char *sb_take(strbuf *sb)
{
    if (!sb->oom && !sb->data)
        sb_append(sb, "", 0);
    if (sb->oom) {
        free(sb->data);
        sb->data = NULL;
        return NULL;
    }
    char *s = sb->data;
    sb->data = NULL;
    sb->len = sb->cap = 0;
    return s;
}

/* ---- UTF-8 and Python's notion of whitespace ------------------------------------------------------------- */

/* Bytes in the code point starting at p (1 for an invalid or truncated sequence: it counts as one character). */
static size_t cp_len(const char *p, const char *end)
{
    unsigned char c = (unsigned char)*p;
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (n > (size_t)(end - p))
        return 1;
    for (size_t i = 1; i < n; i++)
        if (((unsigned char)p[i] & 0xC0) != 0x80)
            return 1;
    return n;
}

static uint32_t cp_value(const char *p, size_t n)
{
    const unsigned char *u = (const unsigned char *)p;
    if (n == 1)
        return u[0];
    if (n == 2)
        return ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
    if (n == 3)
        return ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
    return ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) |
           (u[3] & 0x3F);
}

/* str.isspace() for one code point: the set Python's \s and strip() use. */
static bool py_is_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* Byte length of the whitespace code point at p, or 0 when p is not whitespace (or at end). */
static size_t space_at(const char *p, const char *end)
{
    if (p >= end)
        return 0;
    size_t n = cp_len(p, end);
    return py_is_space(cp_value(p, n)) ? n : 0;
}

static bool valid_utf8(const char *s)
{
    const char *end = s + strlen(s);
    for (const char *p = s; p < end;) {
        size_t n = cp_len(p, end);
        if (n == 1 && (unsigned char)*p >= 0x80)
            return false;
        p += n;
    }
    return true;
}

/* ---- normalize_final_answer --------------------------------------------------------------------------------- */

/* Python's s.replace(before, after): every non-overlapping occurrence, left to right. */
static char *replace_all(char *s, const char *before, const char *after)
{
    if (!s || !strstr(s, before))
        return s;
    strbuf out = {0};
    size_t blen = strlen(before);
    const char *p = s;
    for (const char *hit; (hit = strstr(p, before)) != NULL; p = hit + blen) {
        sb_append(&out, p, (size_t)(hit - p));
        sb_puts(&out, after);
    }
    sb_puts(&out, p);
    free(s);
    return sb_take(&out);
}

/* re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", s): '.' stops at '\n', so each line holding two or more '$' becomes
 * "$" + the text between its first two '$' + "$"; other lines are kept. */
static char *keep_first_dollar_span(char *s)
{
    if (!s)
        return NULL;
    strbuf out = {0};
    for (const char *line = s;;) {
        const char *eol = strchr(line, '\n');
        size_t len = eol ? (size_t)(eol - line) : strlen(line);
        const char *d1 = memchr(line, '$', len);
        const char *d2 = d1 ? memchr(d1 + 1, '$', len - (size_t)(d1 + 1 - line)) : NULL;
        if (d2) {
            sb_puts(&out, "$");
            sb_append(&out, d1 + 1, (size_t)(d2 - d1 - 1));
            sb_puts(&out, "$");
        } else {
            sb_append(&out, line, len);
        }
        if (!eol)
            break;
        sb_puts(&out, "\n");
        line = eol + 1;
    }
    free(s);
    return sb_take(&out);
}

/* re.sub(r"(<prefix>)(.*?)(\})", "\\2", s) when greedy is false, r"(<prefix>)(.*)(\})" when true: a prefix
 * ("\text{") is dropped together with the first (lazy) or last (greedy) '}' after it on the same line; scanning
 * resumes after that '}'. A prefix with no '}' after it on its line is kept. */
static char *unwrap_command(char *s, const char *prefix, bool greedy)
{
    if (!s || !strstr(s, prefix))
        return s;
    strbuf out = {0};
    size_t plen = strlen(prefix);
    const char *p = s;
    while (*p) {
        if (strncmp(p, prefix, plen) == 0) {
            const char *body = p + plen;
            const char *eol = strchr(body, '\n');
            size_t len = eol ? (size_t)(eol - body) : strlen(body);
            const char *close = NULL;
            for (size_t i = 0; i < len; i++) {
                if (body[i] == '}') {
                    close = body + i;
                    if (!greedy)
                        break;
                }
            }
            if (close) {
                sb_append(&out, body, (size_t)(close - body));
                p = close + 1;
                continue;
            }
        }
        sb_append(&out, p, 1);
        p++;
    }
    free(s);
    return sb_take(&out);
}

/* re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", s) and re.sub(r"(sqrt)([^{])", "sqrt{\\2}", s): TeX shorthand
 * "\frac12" -> "\frac{1}{2}", "\sqrt2" -> "\sqrt{2}". [^{] takes any code point but '{' (a newline too); '.' any
 * but '\n'. */
static char *expand_shorthand(char *s, const char *command, int n_args)
{
    if (!s || !strstr(s, command))
        return s;
    strbuf out = {0};
    size_t clen = strlen(command);
    const char *end = s + strlen(s);
    const char *p = s;
    while (p < end) {
        if (strncmp(p, command, clen) == 0 && p + clen < end && p[clen] != '{') {
            const char *a = p + clen;
            size_t alen = cp_len(a, end);
            const char *b = a + alen;
            bool ok = true;
            size_t blen = 0;
            if (n_args == 2) {
                ok = b < end && *b != '\n';
                if (ok)
                    blen = cp_len(b, end);
            }
            if (ok) {
                sb_puts(&out, command);
                sb_puts(&out, "{");
                sb_append(&out, a, alen);
                sb_puts(&out, "}");
                if (n_args == 2) {
                    sb_puts(&out, "{");
                    sb_append(&out, b, blen);
                    sb_puts(&out, "}");
                }
                p = b + blen;
                continue;
            }
        }
        sb_append(&out, p, 1);
        p++;
    }
    free(s);
    return sb_take(&out);
}

/* str.strip() in place (returns s). */
static char *py_strip(char *s)
{
    if (!s)
        return NULL;
    char *end = s + strlen(s);
    char *start = s;
    for (size_t n; (n = space_at(start, end)) != 0;)
        start += n;
    // Trailing whitespace: walk code points forward, remembering where the last non-space one ended.
    char *last = start;
    for (char *p = start; p < end;) {
        size_t n = cp_len(p, end);
        if (!py_is_space(cp_value(p, n)))
            last = p + n;
        p += n;
    }
    size_t len = (size_t)(last - start);
    memmove(s, start, len);
    s[len] = '\0';
    return s;
}

/* The two tables of the Python original, in its order (order matters: "an " goes before " "). */
static const char *const substitutions[][2] = {
    {"an ", ""}, {"a ", ""}, {".$", "$"}, {"\\$", ""}, {"\\ ", ""}, {" ", ""}, {"mbox", "text"},
    {",\\text{and}", ","}, {"\\text{and}", ","}, {"\\text{m}", "\\text{}"},
};

static const char *const removed_expressions[] = {
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue", "points",
    "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges", "students",
    "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3",
    "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", "\"", "\\dots",
};

char *math_normalize_final_answer(const char *answer)
{
    // final_answer.split("=")[-1]
    const char *eq = strrchr(answer, '=');
    char *s = strdup(eq ? eq + 1 : answer);
    for (size_t i = 0; i < DSARL_ARRAY_LEN(substitutions); i++)
        s = replace_all(s, substitutions[i][0], substitutions[i][1]);
    for (size_t i = 0; i < DSARL_ARRAY_LEN(removed_expressions); i++)
        s = replace_all(s, removed_expressions[i], "");
    s = keep_first_dollar_span(s);
    s = unwrap_command(s, "\\text{", false);
    s = unwrap_command(s, "\\textbf{", false);
    s = unwrap_command(s, "\\overline{", false);
    s = unwrap_command(s, "\\boxed{", true);
    s = expand_shorthand(s, "frac", 2);
    s = expand_shorthand(s, "sqrt", 1);
    s = replace_all(s, "$", "");
    if (!s)
        return NULL;
    // if final_answer.replace(",", "").isdigit(): drop the thousands separators
    bool digits = false, other = false;
    for (const char *p = s; *p; p++) {
        if (*p >= '0' && *p <= '9')
            digits = true;
        else if (*p != ',')
            other = true;
    }
    if (digits && !other)
        s = replace_all(s, ",", "");
    return py_strip(s);
}

/* ---- extraction ------------------------------------------------------------------------------------------- */

/* Start of the last MATH_VERIFY_TAIL_CHARS code points of s (Python's s[-300:]). */
static const char *tail_start(const char *s)
{
    const char *end = s + strlen(s);
    // Count code points from the front (invalid bytes are one each), then skip all but the last TAIL_CHARS.
    size_t total = 0;
    for (const char *p = s; p < end; p += cp_len(p, end))
        total++;
    const char *p = s;
    for (size_t skip = total > MATH_VERIFY_TAIL_CHARS ? total - MATH_VERIFY_TAIL_CHARS : 0; skip > 0; skip--)
        p += cp_len(p, end);
    return p;
}

static bool ascii_ieq(const char *p, const char *word)
{
    for (; *word; p++, word++) {
        char c = *p;
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c != *word)
            return false;
    }
    return true;
}

/* Tries (?i)Answer\s*:\s*([^\n]+) at p; on a match sets the capture [*cap, *cap_end) and returns true. */
static bool match_answer_at(const char *p, const char *end, const char **cap, const char **cap_end)
{
    if ((size_t)(end - p) < 7 || !ascii_ieq(p, "answer"))
        return false;
    const char *q = p + 6;
    for (size_t n; (n = space_at(q, end)) != 0;)
        q += n;
    if (q >= end || *q != ':')
        return false;
    q++;
    // \s* is greedy; ([^\n]+) then needs one non-'\n' code point. After the whitespace run that is the next
    // (non-space) character; at the end of the text the regex backtracks to the last whitespace that is not '\n'.
    const char *last_non_newline = NULL;
    for (size_t n; (n = space_at(q, end)) != 0; q += n)
        if (*q != '\n')
            last_non_newline = q;
    const char *start = q < end ? q : last_non_newline;
    if (!start)
        return false;
    const char *eol = memchr(start, '\n', (size_t)(end - start));
    *cap = start;
    *cap_end = eol ? eol : end;
    return true;
}

char *math_extract_answer_line(const char *response, int *oom)
{
    *oom = 0;
    const char *p = tail_start(response);
    const char *end = p + strlen(p);
    const char *best = NULL, *best_end = NULL;
    // re.findall: matches do not overlap; after one, the scan resumes at its end.
    while (p < end) {
        const char *cap, *cap_end;
        if (match_answer_at(p, end, &cap, &cap_end)) {
            best = cap;
            best_end = cap_end;
            p = cap_end;
        } else {
            p++;
        }
    }
    if (!best)
        return NULL;
    char *s = strndup(best, (size_t)(best_end - best));
    *oom = s == NULL;
    return s;
}

char *math_extract_last_boxed(const char *text, int *oom)
{
    *oom = 0;
    // last_boxed_only_string: rfind("\boxed{"), then walk to the brace that closes it.
    const char *start = NULL;
    for (const char *p = text; (p = strstr(p, "\\boxed{")) != NULL; p++)
        start = p;
    if (!start)
        return NULL;
    const char *body = start + 7;
    int depth = 1;
    for (const char *p = body; *p; p++) {
        if (*p == '{')
            depth++;
        else if (*p == '}' && --depth == 0) {
            char *s = strndup(body, (size_t)(p - body));
            *oom = s == NULL;
            return s;
        }
    }
    return NULL;
}

/* ---- rational numbers (boxed mode only) ------------------------------------------------------------------ */

typedef struct rational {
    int64_t num, den; /* reduced, den > 0 */
} rational;

static int64_t gcd64(int64_t a, int64_t b)
{
    if (a < 0)
        a = -a;
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Reads up to 18 decimal digits at *p (at least min_digits); advances *p, adds the digit count to *ndigits. */
static bool read_digits(const char **p, int64_t *value, int *ndigits, int min_digits)
{
    int n = 0;
    while (**p >= '0' && **p <= '9') {
        if (*ndigits + n >= 18)
            return false;
        *value = *value * 10 + (**p - '0');
        (*p)++;
        n++;
    }
    *ndigits += n;
    return n >= min_digits;
}

static bool parse_rational(const char *s, rational *out)
{
    int sign = 1;
    if (*s == '+' || *s == '-')
        sign = *s++ == '-' ? -1 : 1;
    int64_t num = 0, den = 1;
    int nd = 0, dd = 0;
    const char *fracs[] = {"\\frac{", "\\dfrac{", "\\tfrac{"};
    bool matched = false;
    for (size_t i = 0; i < DSARL_ARRAY_LEN(fracs) && !matched; i++) {
        size_t n = strlen(fracs[i]);
        if (strncmp(s, fracs[i], n) != 0)
            continue;
        const char *p = s + n;
        den = 0;
        if (!read_digits(&p, &num, &nd, 1) || strncmp(p, "}{", 2) != 0)
            return false;
        p += 2;
        if (!read_digits(&p, &den, &dd, 1) || strcmp(p, "}") != 0)
            return false;
        matched = true;
    }
    if (!matched) {
        const char *p = s;
        if (!read_digits(&p, &num, &nd, 0))
            return false;
        if (*p == '/') {
            p++;
            den = 0;
            if (nd == 0 || !read_digits(&p, &den, &dd, 1))
                return false;
        } else if (*p == '.') {
            p++;
            int before = nd;
            if (!read_digits(&p, &num, &nd, 0))
                return false;
            for (int k = before; k < nd; k++)
                den *= 10;
        }
        if (*p != '\0' || nd == 0)
            return false;
    }
    if (den == 0)
        return false;
    int64_t g = gcd64(num, den);
    out->num = sign * (num / g);
    out->den = den / g;
    return true;
}

int math_same_number(const char *a, const char *b)
{
    rational x, y;
    return parse_rational(a, &x) && parse_rational(b, &y) && x.num == y.num && x.den == y.den;
}

/* ---- one verdict -------------------------------------------------------------------------------------------- */

int math_verify_one(math_verify_mode mode, const char *response, const char *ground_truth, dsarl_verdict *verdict,
                    const char **why, dsarl_error *err)
{
    const char *reason = NULL;
    if (!ground_truth)
        reason = "the example has no ground truth";
    else if (!response)
        reason = "the response is missing (NULL)";
    else if (strlen(ground_truth) > MATH_VERIFY_MAX_GROUND_TRUTH)
        reason = "the ground truth is longer than 1024 bytes";
    else if (!valid_utf8(ground_truth))
        reason = "the ground truth is not valid UTF-8";
    if (reason) {
        *verdict = DSARL_VERDICT_VERIFIER_FAILED;
        if (why)
            *why = reason;
        return 0;
    }
    char *truth = math_normalize_final_answer(ground_truth);
    if (!truth)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "math environment: out of memory normalising a ground truth");
    if (truth[0] == '\0') {
        free(truth);
        *verdict = DSARL_VERDICT_VERIFIER_FAILED;
        if (why)
            *why = "the ground truth normalises to an empty string";
        return 0;
    }
    int oom = 0;
    char *raw = mode == MATH_VERIFY_BOXED ? math_extract_last_boxed(tail_start(response), &oom)
                                          : math_extract_answer_line(response, &oom);
    char *pred = raw ? math_normalize_final_answer(raw) : NULL;
    if (oom || (raw && !pred)) {
        free(raw);
        free(truth);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "math environment: out of memory extracting an answer");
    }
    bool correct = pred && (strcmp(pred, truth) == 0 || (mode == MATH_VERIFY_BOXED && math_same_number(pred, truth)));
    *verdict = correct ? DSARL_VERDICT_CORRECT : DSARL_VERDICT_WRONG;
    free(pred);
    free(raw);
    free(truth);
    return 0;
}
