/* jinja_value.c: the values a chat template computes with, their arena, and how Python prints them (str(),
 * repr() and json.dumps as transformers' tojson calls it), so rendered text matches transformers byte for byte. */
#include "jinja_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena ------------------------------------------------------------------------------------------------ */

typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t used, size;
    max_align_t data[];
} arena_chunk;

struct jinja_arena {
    arena_chunk *head;
    size_t total, limit;
};

jinja_arena *jinja_arena_new(size_t limit)
{
    jinja_arena *a = calloc(1, sizeof *a);
    if (a)
        a->limit = limit;
    return a;
}

void jinja_arena_free(jinja_arena *a)
{
    if (!a)
        return;
    for (arena_chunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(a);
}

size_t jinja_arena_used(const jinja_arena *a)
{
    return a->total;
}

void *jinja_alloc(jinja_arena *a, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (n == 0)
        n = sizeof(max_align_t);
    if (n > a->limit || a->total > a->limit - n)
        return NULL;
    arena_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > 65536 ? n : 65536;
        c = malloc(sizeof *c + size);
        if (!c)
            return NULL;
        c->size = size;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    a->total += n;
    memset(p, 0, n);
    return p;
}

/* ---- construction ----------------------------------------------------------------------------------------- */

jv *jv_new(jinja_arena *a, jv_kind kind)
{
    jv *v = jinja_alloc(a, sizeof *v);
    if (v)
        v->kind = kind;
    return v;
}

jv *jv_string(jinja_arena *a, const char *s, size_t n)
{
    jv *v = jv_new(a, JV_STRING);
    char *copy = v ? jinja_alloc(a, n + 1) : NULL;
    if (!copy)
        return NULL;
    if (n)
        memcpy(copy, s, n);
    v->u.str.s = copy;
    v->u.str.n = n;
    return v;
}

jv *jv_int(jinja_arena *a, int64_t i)
{
    jv *v = jv_new(a, JV_INT);
    if (v)
        v->u.i = i;
    return v;
}

jv *jv_float(jinja_arena *a, double f)
{
    jv *v = jv_new(a, JV_FLOAT);
    if (v)
        v->u.f = f;
    return v;
}

jv *jv_bool(jinja_arena *a, bool b)
{
    jv *v = jv_new(a, JV_BOOL);
    if (v)
        v->u.b = b;
    return v;
}

/* Grows an arena array of pointers to hold one more (the old block is left to the arena). */
static int grow(jinja_arena *a, jv ***items, size_t n, size_t *cap)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 4;
    jv **p = jinja_alloc(a, c * sizeof *p);
    if (!p)
        return -1;
    if (n)
        memcpy(p, *items, n * sizeof *p);
    *items = p;
    *cap = c;
    return 0;
}

int jv_list_push(jinja_arena *a, jv *list, jv *item)
{
    if (grow(a, &list->u.list.items, list->u.list.n, &list->u.list.cap) < 0)
        return -1;
    list->u.list.items[list->u.list.n++] = item;
    return 0;
}

int jv_dict_set(jinja_arena *a, jv *dict, jv *key, jv *val)
{
    for (size_t i = 0; i < dict->u.dict.n; i++)
        if (jv_equal(dict->u.dict.keys[i], key)) {
            dict->u.dict.vals[i] = val;
            return 0;
        }
    size_t cap = dict->u.dict.cap;
    if (grow(a, &dict->u.dict.keys, dict->u.dict.n, &cap) < 0 ||
        grow(a, &dict->u.dict.vals, dict->u.dict.n, &dict->u.dict.cap) < 0)
        return -1;
    dict->u.dict.keys[dict->u.dict.n] = key;
    dict->u.dict.vals[dict->u.dict.n++] = val;
    return 0;
}

jv *jv_dict_get(const jv *dict, const char *key, size_t n)
{
    for (size_t i = 0; i < dict->u.dict.n; i++) {
        const jv *k = dict->u.dict.keys[i];
        if (k->kind == JV_STRING && k->u.str.n == n && memcmp(k->u.str.s, key, n) == 0)
            return dict->u.dict.vals[i];
    }
    return NULL;
}

jv *jv_dict_get_value(const jv *dict, const jv *key)
{
    for (size_t i = 0; i < dict->u.dict.n; i++)
        if (jv_equal(dict->u.dict.keys[i], key))
            return dict->u.dict.vals[i];
    return NULL;
}

jv *jv_from_json(jinja_arena *a, const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_NULL: return jv_new(a, JV_NONE);
    case JSON_TRUE: return jv_bool(a, true);
    case JSON_FALSE: return jv_bool(a, false);
    case JSON_INTEGER: return jv_int(a, (int64_t)json_integer_value(j));
    case JSON_REAL: return jv_float(a, json_real_value(j));
    case JSON_STRING: return jv_string(a, json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        jv *list = jv_new(a, JV_LIST);
        size_t i;
        const json_t *item;
        if (!list)
            return NULL;
        json_array_foreach(j, i, item)
        {
            jv *x = jv_from_json(a, item);
            if (!x || jv_list_push(a, list, x) < 0)
                return NULL;
        }
        return list;
    }
    case JSON_OBJECT: {
        jv *dict = jv_new(a, JV_DICT);
        const char *key;
        const json_t *item;
        if (!dict)
            return NULL;
        json_object_foreach((json_t *)j, key, item)
        {
            jv *k = jv_string(a, key, strlen(key)), *x = jv_from_json(a, item);
            if (!k || !x || jv_dict_set(a, dict, k, x) < 0)
                return NULL;
        }
        return dict;
    }
    }
    return NULL;
}

/* ---- Python semantics ------------------------------------------------------------------------------------- */

bool jv_truthy(const jv *v)
{
    switch (v->kind) {
    case JV_UNDEFINED:
    case JV_NONE: return false;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0.0;
    case JV_STRING: return v->u.str.n != 0;
    case JV_LIST: return v->u.list.n != 0;
    case JV_DICT: return v->u.dict.n != 0;
    default: return true;
    }
}

static bool is_number(const jv *v)
{
    return v->kind == JV_INT || v->kind == JV_FLOAT || v->kind == JV_BOOL;
}

static double as_double(const jv *v)
{
    return v->kind == JV_FLOAT ? v->u.f : v->kind == JV_INT ? (double)v->u.i : (double)v->u.b;
}

bool jv_equal(const jv *x, const jv *y)
{
    if (is_number(x) && is_number(y)) {
        if (x->kind != JV_FLOAT && y->kind != JV_FLOAT) {
            int64_t a = x->kind == JV_INT ? x->u.i : x->u.b, b = y->kind == JV_INT ? y->u.i : y->u.b;
            return a == b;
        }
        return as_double(x) == as_double(y);
    }
    if (x->kind != y->kind)
        return false;
    switch (x->kind) {
    case JV_UNDEFINED:
    case JV_NONE: return true;
    case JV_STRING: return x->u.str.n == y->u.str.n && memcmp(x->u.str.s, y->u.str.s, x->u.str.n) == 0;
    case JV_LIST:
        if (x->u.list.n != y->u.list.n)
            return false;
        for (size_t i = 0; i < x->u.list.n; i++)
            if (!jv_equal(x->u.list.items[i], y->u.list.items[i]))
                return false;
        return true;
    case JV_DICT:
        if (x->u.dict.n != y->u.dict.n)
            return false;
        for (size_t i = 0; i < x->u.dict.n; i++) {
            const jv *other = jv_dict_get_value(y, x->u.dict.keys[i]);
            if (!other || !jv_equal(x->u.dict.vals[i], other))
                return false;
        }
        return true;
    case JV_MACRO: return x->u.macro == y->u.macro;
    default: return x == y;
    }
}

const char *jv_type_name(const jv *v)
{
    static const char *const names[] = {
        "Undefined", "NoneType",         "bool",   "int",        "float", "str", "list", "dict", "Namespace",
        "Macro",     "builtin_function", "method", "LoopContext"};
    if (v->kind == JV_LIST && v->is_tuple)
        return "tuple";
    return names[v->kind];
}

/* ---- text buffers ------------------------------------------------------------------------------------------ */

void jbuf_put(jbuf *b, const char *s, size_t n)
{
    if (b->over || b->oom)
        return;
    if (n > b->limit || b->len > b->limit - n) {
        b->over = true;
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void jbuf_putc(jbuf *b, char c)
{
    jbuf_put(b, &c, 1);
}

static void jbuf_printf(jbuf *b, const char *fmt, ...) DSARL_PRINTF(2, 3);
static void jbuf_printf(jbuf *b, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        jbuf_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* ---- UTF-8 ------------------------------------------------------------------------------------------------- */

static uint32_t utf8_at(const char *s, size_t n, size_t *len)
{
    const unsigned char *p = (const unsigned char *)s;
    if (n >= 2 && (p[0] & 0xE0) == 0xC0) {
        *len = 2;
        return (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
    }
    if (n >= 3 && (p[0] & 0xF0) == 0xE0) {
        *len = 3;
        return (uint32_t)(p[0] & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
    }
    if (n >= 4 && (p[0] & 0xF8) == 0xF0) {
        *len = 4;
        return (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 | (uint32_t)(p[2] & 0x3F) << 6 |
               (p[3] & 0x3F);
    }
    *len = 1;
    return p[0];
}

size_t jutf8_count(const char *s, size_t n)
{
    size_t count = 0;
    for (size_t i = 0; i < n; i++)
        count += ((unsigned char)s[i] & 0xC0) != 0x80;
    return count;
}

size_t jutf8_offset(const char *s, size_t n, size_t k)
{
    size_t i = 0;
    for (; i < n && k > 0; k--) {
        i++;
        while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80)
            i++;
    }
    return i;
}

static bool is_space_cp(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool jutf8_space_at(const char *s, size_t n, size_t *len)
{
    if (n == 0)
        return false;
    uint32_t c = utf8_at(s, n, len);
    return is_space_cp(c);
}

size_t jutf8_trailing_space(const char *s, size_t n)
{
    size_t end = n;
    while (end > 0) {
        size_t start = end - 1;
        while (start > 0 && ((unsigned char)s[start] & 0xC0) == 0x80 && end - start < 4)
            start--;
        size_t len;
        if (!jutf8_space_at(s + start, end - start, &len) || len != end - start)
            break;
        end = start;
    }
    return n - end;
}

/* ---- str() and repr() ------------------------------------------------------------------------------------- */

/* Python's repr(float): the shortest digits that read back to the same double; fixed notation for exponents in
 * [-4, 16), scientific otherwise, and always a '.0' or exponent so it reads as a float. */
static void put_float(jbuf *b, double f)
{
    if (isnan(f)) {
        jbuf_put(b, "nan", 3);
        return;
    }
    if (isinf(f)) {
        jbuf_put(b, f < 0 ? "-inf" : "inf", f < 0 ? 4 : 3);
        return;
    }
    char tmp[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f)
            break;
    }
    // tmp is "-d.ddde+XX": split into sign, digits and exponent
    char digits[24];
    size_t nd = 0;
    const char *p = tmp;
    bool neg = *p == '-';
    if (neg)
        p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    if (neg)
        jbuf_putc(b, '-');
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            jbuf_put(b, "0.", 2);
            for (int i = 0; i < -exp10 - 1; i++)
                jbuf_putc(b, '0');
            jbuf_put(b, digits, nd);
        } else {
            for (int i = 0; i <= exp10; i++)
                jbuf_putc(b, (size_t)i < nd ? digits[i] : '0');
            jbuf_putc(b, '.');
            if ((size_t)exp10 + 1 < nd)
                jbuf_put(b, digits + exp10 + 1, nd - (size_t)exp10 - 1);
            else
                jbuf_putc(b, '0');
        }
    } else {
        jbuf_putc(b, digits[0]);
        if (nd > 1) {
            jbuf_putc(b, '.');
            jbuf_put(b, digits + 1, nd - 1);
        }
        jbuf_printf(b, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
}

static void repr_string(jbuf *b, const char *s, size_t n)
{
    bool has_single = memchr(s, '\'', n) != NULL, has_double = memchr(s, '"', n) != NULL;
    char quote = has_single && !has_double ? '"' : '\'';
    jbuf_putc(b, quote);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == quote || c == '\\') {
            jbuf_putc(b, '\\');
            jbuf_putc(b, (char)c);
        } else if (c == '\n') {
            jbuf_put(b, "\\n", 2);
        } else if (c == '\r') {
            jbuf_put(b, "\\r", 2);
        } else if (c == '\t') {
            jbuf_put(b, "\\t", 2);
        } else if (c < 0x20 || c == 0x7F) {
            jbuf_printf(b, "\\x%02x", c);
        } else {
            jbuf_putc(b, (char)c);
        }
    }
    jbuf_putc(b, quote);
}

void jv_repr(jbuf *b, const jv *v)
{
    switch (v->kind) {
    case JV_STRING: repr_string(b, v->u.str.s, v->u.str.n); return;
    case JV_LIST:
        jbuf_putc(b, v->is_tuple ? '(' : '[');
        for (size_t i = 0; i < v->u.list.n; i++) {
            if (i)
                jbuf_put(b, ", ", 2);
            jv_repr(b, v->u.list.items[i]);
        }
        if (v->is_tuple && v->u.list.n == 1)
            jbuf_putc(b, ',');
        jbuf_putc(b, v->is_tuple ? ')' : ']');
        return;
    case JV_DICT:
        jbuf_putc(b, '{');
        for (size_t i = 0; i < v->u.dict.n; i++) {
            if (i)
                jbuf_put(b, ", ", 2);
            jv_repr(b, v->u.dict.keys[i]);
            jbuf_put(b, ": ", 2);
            jv_repr(b, v->u.dict.vals[i]);
        }
        jbuf_putc(b, '}');
        return;
    default: jv_str(b, v);
    }
}

void jv_str(jbuf *b, const jv *v)
{
    switch (v->kind) {
    case JV_UNDEFINED: return;
    case JV_NONE: jbuf_put(b, "None", 4); return;
    case JV_BOOL: jbuf_put(b, v->u.b ? "True" : "False", v->u.b ? 4 : 5); return;
    case JV_INT: jbuf_printf(b, "%lld", (long long)v->u.i); return;
    case JV_FLOAT: put_float(b, v->u.f); return;
    case JV_STRING: jbuf_put(b, v->u.str.s, v->u.str.n); return;
    case JV_LIST:
    case JV_DICT: jv_repr(b, v); return;
    case JV_NAMESPACE:
        jbuf_put(b, "<Namespace ", 11);
        jv_repr(b, &(jv){.kind = JV_DICT, .u.dict = v->u.dict});
        jbuf_putc(b, '>');
        return;
    case JV_MACRO: jbuf_put(b, "<Macro>", 7); return;
    case JV_LOOP: jbuf_put(b, "<LoopContext>", 13); return;
    default: jbuf_put(b, "<built-in function>", 19); return;
    }
}

/* ---- json.dumps ------------------------------------------------------------------------------------------- */

static void put_json_string(jbuf *b, const char *s, size_t n, bool ensure_ascii)
{
    jbuf_putc(b, '"');
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            jbuf_putc(b, '\\');
            jbuf_putc(b, (char)c);
            i++;
        } else if (c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f') {
            char e = c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't' : c == '\b' ? 'b' : 'f';
            jbuf_putc(b, '\\');
            jbuf_putc(b, e);
            i++;
        } else if (c < 0x20 || (ensure_ascii && c == 0x7F)) {
            jbuf_printf(b, "\\u%04x", c);
            i++;
        } else if (c < 0x80 || !ensure_ascii) {
            jbuf_putc(b, (char)c);
            i++;
        } else {
            size_t len;
            uint32_t cp = utf8_at(s + i, n - i, &len);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                jbuf_printf(b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                jbuf_printf(b, "\\u%04x", cp);
            }
            i += len;
        }
    }
    jbuf_putc(b, '"');
}

static void json_newline(jbuf *b, const char *indent, int level)
{
    jbuf_putc(b, '\n');
    for (int i = 0; i < level; i++)
        jbuf_put(b, indent, strlen(indent));
}

static int cmp_keys(const void *x, const void *y)
{
    const jv *a = **(const jv *const *const *)x, *c = **(const jv *const *const *)y;
    size_t n = a->u.str.n < c->u.str.n ? a->u.str.n : c->u.str.n;
    int r = memcmp(a->u.str.s, c->u.str.s, n);
    return r ? r : (a->u.str.n > c->u.str.n) - (a->u.str.n < c->u.str.n);
}

int jv_tojson(jbuf *b, const jv *v, bool ensure_ascii, const char *indent, const char *item_sep, const char *key_sep,
              bool sort_keys, int depth, const jv **bad)
{
    const char *isep = item_sep ? item_sep : indent ? "," : ", ", *ksep = key_sep ? key_sep : ": ";
    if (depth > 200) { // Python raises RecursionError long before this on a self-referencing namespace
        *bad = v;
        return -1;
    }
    switch (v->kind) {
    case JV_NONE: jbuf_put(b, "null", 4); return 0;
    case JV_BOOL: jbuf_put(b, v->u.b ? "true" : "false", v->u.b ? 4 : 5); return 0;
    case JV_INT: jbuf_printf(b, "%lld", (long long)v->u.i); return 0;
    case JV_FLOAT:
        if (isnan(v->u.f))
            jbuf_put(b, "NaN", 3);
        else if (isinf(v->u.f))
            jbuf_put(b, v->u.f < 0 ? "-Infinity" : "Infinity", v->u.f < 0 ? 9 : 8);
        else
            put_float(b, v->u.f);
        return 0;
    case JV_STRING: put_json_string(b, v->u.str.s, v->u.str.n, ensure_ascii); return 0;
    case JV_LIST:
        if (v->u.list.n == 0) {
            jbuf_put(b, "[]", 2);
            return 0;
        }
        jbuf_putc(b, '[');
        for (size_t i = 0; i < v->u.list.n; i++) {
            if (i)
                jbuf_put(b, isep, strlen(isep));
            if (indent)
                json_newline(b, indent, depth + 1);
            if (jv_tojson(b, v->u.list.items[i], ensure_ascii, indent, item_sep, key_sep, sort_keys, depth + 1, bad) <
                0)
                return -1;
        }
        if (indent)
            json_newline(b, indent, depth);
        jbuf_putc(b, ']');
        return 0;
    case JV_DICT: {
        size_t n = v->u.dict.n;
        if (n == 0) {
            jbuf_put(b, "{}", 2);
            return 0;
        }
        // order: insertion, or sorted by key (keys are strings: JSON object keys, or checked below)
        jv ***order = malloc(n * sizeof *order);
        if (!order) {
            b->oom = true;
            return 0;
        }
        for (size_t i = 0; i < n; i++) {
            if (v->u.dict.keys[i]->kind != JV_STRING) {
                *bad = v->u.dict.keys[i];
                free(order);
                return -1;
            }
            order[i] = &v->u.dict.keys[i];
        }
        if (sort_keys)
            qsort(order, n, sizeof order[0], cmp_keys);
        jbuf_putc(b, '{');
        for (size_t k = 0; k < n; k++) {
            size_t i = (size_t)(order[k] - v->u.dict.keys);
            if (k)
                jbuf_put(b, isep, strlen(isep));
            if (indent)
                json_newline(b, indent, depth + 1);
            put_json_string(b, v->u.dict.keys[i]->u.str.s, v->u.dict.keys[i]->u.str.n, ensure_ascii);
            jbuf_put(b, ksep, strlen(ksep));
            if (jv_tojson(b, v->u.dict.vals[i], ensure_ascii, indent, item_sep, key_sep, sort_keys, depth + 1, bad) <
                0) {
                free(order);
                return -1;
            }
        }
        free(order);
        if (indent)
            json_newline(b, indent, depth);
        jbuf_putc(b, '}');
        return 0;
    }
    default: *bad = v; return -1;
    }
}
