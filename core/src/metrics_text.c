/* metrics_text.c: growable text buffers and JSON string escaping for the run logger. Model output is arbitrary
 * bytes (a byte tokenizer can decode half a UTF-8 character), so escaping validates UTF-8 and replaces what is not. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics_internal.h"

static int buf_reserve(dsarl_text_buffer *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p)
        return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

int metrics_buf_append(dsarl_text_buffer *b, const char *data, size_t n)
{
    if (buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int metrics_buf_printf(dsarl_text_buffer *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || buf_reserve(b, (size_t)n) < 0)
        return -1;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

/* Length of the valid UTF-8 sequence starting at s (1..4), or 0 when the bytes there are not one (overlongs,
 * surrogates and code points above U+10FFFF are invalid, as in RFC 3629). */
static size_t utf8_sequence_length(const unsigned char *s)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t n;
    unsigned cp;
    if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1Fu; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0Fu; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07u; }
    else return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)  /* also stops at the NUL terminator */
            return 0;
        cp = (cp << 6) | (s[i] & 0x3Fu);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

int dsarl_json_escape_append(dsarl_text_buffer *out, const char *s)
{
    if (metrics_buf_append(out, "\"", 1) < 0)
        return -1;
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    while (*p) {
        unsigned char c = *p;
        int rc = 0;
        if (c == '"') rc = metrics_buf_append(out, "\\\"", 2);
        else if (c == '\\') rc = metrics_buf_append(out, "\\\\", 2);
        else if (c == '\n') rc = metrics_buf_append(out, "\\n", 2);
        else if (c == '\r') rc = metrics_buf_append(out, "\\r", 2);
        else if (c == '\t') rc = metrics_buf_append(out, "\\t", 2);
        else if (c < 0x20 || c == 0x7F) rc = metrics_buf_printf(out, "\\u%04x", c);
        else {
            size_t n = utf8_sequence_length(p);
            if (n == 0) {
                rc = metrics_buf_append(out, "\\ufffd", 6);
                n = 1;
            } else {
                rc = metrics_buf_append(out, (const char *)p, n);
            }
            if (rc < 0)
                return -1;
            p += n;
            continue;
        }
        if (rc < 0)
            return -1;
        p++;
    }
    return metrics_buf_append(out, "\"", 1);
}
