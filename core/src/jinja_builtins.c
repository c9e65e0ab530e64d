/* jinja_builtins.c: the filters, tests, string/dict methods and globals chat templates use, each with Python's
 * (and Jinja's) behaviour: str.split/strip as Python does them on code points, tojson as transformers overrides
 * it (json.dumps, ensure_ascii=False by default, no HTML escaping), namespace(), range(), raise_exception(),
 * strftime_now(). Anything else is refused by name at load (the parser asks the tables below). */
#include "jinja_internal.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const filters[] = {
    "length", "count",   "trim",  "upper",  "lower", "capitalize", "title",  "default",    "d",
    "join",   "tojson",  "items", "first",  "last",  "string",     "int",    "float",      "replace",
    "list",   "reverse", "safe",  "abs",    "map",   "select",     "reject", "selectattr", "rejectattr",
    "indent", "escape",  "e",     "unique", "min",   "max",        "sum",    "round",
};
static const char *const tests[] = {
    "defined", "undefined", "none",     "string",   "number",   "integer", "float", "boolean",     "true",
    "false",   "mapping",   "iterable", "sequence", "callable", "odd",     "even",  "divisibleby", "eq",
    "equalto", "==",        "ne",       "!=",       "lt",       "<",       "le",    "<=",          "gt",
    ">",       "ge",        ">=",       "in",       "sameas",   "lower",   "upper",
};
/* string methods, then dict methods (METHOD_DICT_FIRST on) */
static const char *const methods[] = {
    "startswith", "endswith", "split", "rsplit", "strip",   "lstrip",  "rstrip", "upper", "lower",  "replace", "title",
    "capitalize", "find",     "join",  "count",  "isdigit", "isspace", "items",  "keys",  "values", "get",
};
enum { METHOD_DICT_FIRST = 17 };
static const char *const globals[] = {"range", "namespace", "raise_exception", "strftime_now", "dict"};

static int index_of(const char *const *table, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(table[i], name))
            return (int)i;
    return -1;
}
#define INDEX_OF(table, name) index_of(table, sizeof table / sizeof table[0], name)

bool jinja_is_filter(const char *name)
{
    return INDEX_OF(filters, name) >= 0;
}
bool jinja_is_test(const char *name)
{
    return INDEX_OF(tests, name) >= 0;
}
bool jinja_is_method(const char *name)
{
    return INDEX_OF(methods, name) >= 0;
}
int jinja_global_index(const char *name)
{
    return INDEX_OF(globals, name);
}

/* ---- argument helpers ------------------------------------------------------------------------------------- */

/* The argument at position pos or named name, or NULL when absent. */
static jv *arg(const jargs *a, size_t pos, const char *name)
{
    if (pos < a->n_pos)
        return a->pos[pos];
    for (size_t i = 0; name && i < a->n_kw; i++)
        if (!strcmp(a->kw_names[i], name))
            return a->kw[i];
    return NULL;
}

static int check_args(jinja_ctx *c, const jnode *at, const char *what, const jargs *a, size_t max_pos,
                      const char *const *names)
{
    if (a->n_pos > max_pos)
        return jinja_ctx_fail(c, at, DSARL_E_INVALID, "%s takes at most %zu arguments, %zu given", what, max_pos,
                              a->n_pos),
               -1;
    for (size_t i = 0; i < a->n_kw; i++) {
        bool known = false;
        for (size_t k = 0; names && names[k]; k++)
            known |= !strcmp(names[k], a->kw_names[i]);
        if (!known)
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "%s got an unexpected keyword argument '%s'", what,
                                  a->kw_names[i]),
                   -1;
    }
    return 0;
}

static jv *need_string(jinja_ctx *c, const jnode *at, const char *what, jv *v)
{
    if (v && v->kind == JV_STRING)
        return v;
    return jinja_ctx_fail(c, at, DSARL_E_INVALID, "%s needs a string, not %s", what, v ? jv_type_name(v) : "nothing");
}

static jv *str_of(jinja_ctx *c, const jnode *at, const jv *v)
{
    if (v->kind == JV_STRING)
        return (jv *)v;
    jbuf b = {.limit = jinja_ctx_string_limit(c)};
    jv_str(&b, v);
    return jinja_ctx_take(c, at, &b);
}

static jv *boolean(jinja_ctx *c, const jnode *at, bool b)
{
    jv *v = jv_bool(jinja_ctx_arena(c), b);
    return v ? v : jinja_ctx_oom(c, at);
}

static jv *new_list(jinja_ctx *c, const jnode *at)
{
    jv *v = jv_new(jinja_ctx_arena(c), JV_LIST);
    return v ? v : jinja_ctx_oom(c, at);
}

static jv *push(jinja_ctx *c, const jnode *at, jv *list, jv *item)
{
    if (!item || jv_list_push(jinja_ctx_arena(c), list, item) < 0)
        return jinja_ctx_failed(c) ? NULL : jinja_ctx_oom(c, at);
    return list;
}

static jv *substr(jinja_ctx *c, const jnode *at, const char *s, size_t n)
{
    jv *v = jv_string(jinja_ctx_arena(c), s, n);
    return v ? v : jinja_ctx_oom(c, at);
}

/* ---- strings ---------------------------------------------------------------------------------------------- */

/* Python's str.strip/lstrip/rstrip: whitespace, or any code point of chars. */
static bool strip_match(const char *s, size_t n, const jv *chars, size_t *len)
{
    if (!chars || chars->kind == JV_NONE)
        return jutf8_space_at(s, n, len);
    size_t k = 1;
    while (k < n && ((unsigned char)s[k] & 0xC0) == 0x80)
        k++;
    *len = k;
    return memmem(chars->u.str.s, chars->u.str.n, s, k) != NULL;
}

static jv *strip(jinja_ctx *c, const jnode *at, const jv *s, const jv *chars, bool left, bool right)
{
    if (chars && chars->kind != JV_NONE && chars->kind != JV_STRING)
        return jinja_ctx_fail(c, at, DSARL_E_INVALID, "strip arg must be None or str, not %s", jv_type_name(chars));
    const char *p = s->u.str.s;
    size_t a = 0, b = s->u.str.n, k;
    while (left && a < b && strip_match(p + a, b - a, chars, &k))
        a += k;
    while (right && b > a) {
        size_t start = b - 1;
        while (start > a && ((unsigned char)p[start] & 0xC0) == 0x80)
            start--;
        if (!strip_match(p + start, b - start, chars, &k) || start + k != b)
            break;
        b = start;
    }
    return substr(c, at, p + a, b - a);
}

/* Python's str.split(sep=None, maxsplit=-1) (rsplit when from_right). */
static jv *split(jinja_ctx *c, const jnode *at, const jv *s, const jv *sep, const jv *maxsplit, bool from_right)
{
    int64_t max = -1;
    if (maxsplit && maxsplit->kind != JV_NONE) {
        if (maxsplit->kind != JV_INT)
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "split's maxsplit must be an integer");
        max = maxsplit->u.i;
    }
    jv *out = new_list(c, at);
    if (!out)
        return NULL;
    const char *p = s->u.str.s;
    size_t n = s->u.str.n;
    if (sep && sep->kind != JV_NONE) {
        if (sep->kind != JV_STRING)
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "split's separator must be a string");
        size_t m = sep->u.str.n;
        if (m == 0)
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "split: empty separator");
        if (!from_right) {
            size_t start = 0;
            for (int64_t done = 0; max < 0 || done < max; done++) {
                const char *hit = memmem(p + start, n - start, sep->u.str.s, m);
                if (!hit)
                    break;
                if (!push(c, at, out, substr(c, at, p + start, (size_t)(hit - p) - start)))
                    return NULL;
                start = (size_t)(hit - p) + m;
            }
            return push(c, at, out, substr(c, at, p + start, n - start));
        }
        // from the right: collect pieces backwards, then reverse
        size_t end = n;
        for (int64_t done = 0; max < 0 || done < max; done++) {
            size_t hit = end;
            bool found = false;
            while (hit >= m) {
                hit--;
                if (hit + m <= end && memcmp(p + hit, sep->u.str.s, m) == 0) {
                    found = true;
                    break;
                }
                if (hit == 0)
                    break;
            }
            if (!found)
                break;
            if (!push(c, at, out, substr(c, at, p + hit + m, end - hit - m)))
                return NULL;
            end = hit;
        }
        if (!push(c, at, out, substr(c, at, p, end)))
            return NULL;
        for (size_t i = 0, j = out->u.list.n - 1; i < j; i++, j--) {
            jv *t = out->u.list.items[i];
            out->u.list.items[i] = out->u.list.items[j];
            out->u.list.items[j] = t;
        }
        return out;
    }
    // whitespace runs; no empty pieces
    if (from_right && max >= 0)
        return jinja_ctx_fail(c, at, DSARL_E_UNSUPPORTED, "unsupported: rsplit() on whitespace with maxsplit");
    size_t i = 0, k;
    int64_t done = 0;
    for (;;) {
        while (i < n && jutf8_space_at(p + i, n - i, &k))
            i += k;
        if (i >= n)
            break;
        if (max >= 0 && done >= max) {
            size_t end = n - jutf8_trailing_space(p + i, n - i);
            return push(c, at, out, substr(c, at, p + i, end - i));
        }
        size_t start = i;
        while (i < n && !jutf8_space_at(p + i, n - i, &k))
            i += ((unsigned char)p[i] & 0x80) ? (size_t)1 + (((unsigned char)p[i] & 0xE0) == 0xC0   ? 1
                                                             : ((unsigned char)p[i] & 0xF0) == 0xE0 ? 2
                                                                                                    : 3)
                                              : 1;
        if (i > n)
            i = n;
        if (!push(c, at, out, substr(c, at, p + start, i - start)))
            return NULL;
        done++;
    }
    return out;
}

static jv *replace(jinja_ctx *c, const jnode *at, const jv *s, const jv *old, const jv *new, const jv *count)
{
    if (!need_string(c, at, "replace", (jv *)old) || !need_string(c, at, "replace", (jv *)new))
        return NULL;
    int64_t max = count && count->kind == JV_INT ? count->u.i : -1;
    jbuf b = {.limit = jinja_ctx_string_limit(c)};
    const char *p = s->u.str.s;
    size_t n = s->u.str.n, i = 0;
    int64_t done = 0;
    if (old->u.str.n == 0) { // Python inserts new between every character
        size_t chars = jutf8_count(p, n);
        for (size_t k = 0; k <= chars; k++) {
            if (max < 0 || done < max) {
                jbuf_put(&b, new->u.str.s, new->u.str.n);
                done++;
            }
            if (k < chars) {
                size_t x = jutf8_offset(p, n, k), y = jutf8_offset(p, n, k + 1);
                jbuf_put(&b, p + x, y - x);
            }
        }
        return jinja_ctx_take(c, at, &b);
    }
    while (i <= n) {
        const char *hit = (max < 0 || done < max) ? memmem(p + i, n - i, old->u.str.s, old->u.str.n) : NULL;
        if (!hit) {
            jbuf_put(&b, p + i, n - i);
            break;
        }
        jbuf_put(&b, p + i, (size_t)(hit - p) - i);
        jbuf_put(&b, new->u.str.s, new->u.str.n);
        i = (size_t)(hit - p) + old->u.str.n;
        done++;
    }
    return jinja_ctx_take(c, at, &b);
}

/* Simple case mapping of one code point: ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic and fullwidth Latin
 * (Python maps more: other scripts, and special cases such as final sigma, are left as they are). */
static uint32_t case_map(uint32_t c, bool upper)
{
    if (upper) {
        if ((c >= 'a' && c <= 'z') || (c >= 0xE0 && c <= 0xFE && c != 0xF7) ||
            (c >= 0x3B1 && c <= 0x3CB && c != 0x3C2) || (c >= 0x430 && c <= 0x44F))
            return c - 0x20;
        if (c == 0x3C2)
            return 0x3A3;
        if (c == 0xFF)
            return 0x178;
        if (c == 0xB5)
            return 0x39C;
        if (c >= 0x450 && c <= 0x45F)
            return c - 0x50;
        if (c >= 0xFF41 && c <= 0xFF5A)
            return c - 0x20;
        if (c == 0x3AC)
            return 0x386;
        if (c >= 0x3AD && c <= 0x3AF)
            return c - 0x25;
        if (c == 0x3CC)
            return 0x38C;
        if (c == 0x3CD || c == 0x3CE)
            return c - 0x3F;
        if (((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) && (c & 1))
            return c - 1;
        if (((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) && !(c & 1))
            return c - 1;
        return c;
    }
    if ((c >= 'A' && c <= 'Z') || (c >= 0xC0 && c <= 0xDE && c != 0xD7) || (c >= 0x391 && c <= 0x3AB && c != 0x3A2) ||
        (c >= 0x410 && c <= 0x42F))
        return c + 0x20;
    if (c == 0x178)
        return 0xFF;
    if (c >= 0x400 && c <= 0x40F)
        return c + 0x50;
    if (c >= 0xFF21 && c <= 0xFF3A)
        return c + 0x20;
    if (c == 0x386)
        return 0x3AC;
    if (c >= 0x388 && c <= 0x38A)
        return c + 0x25;
    if (c == 0x38C)
        return 0x3CC;
    if (c == 0x38E || c == 0x38F)
        return c + 0x3F;
    if (((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) && !(c & 1))
        return c + 1;
    if (((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) && (c & 1))
        return c + 1;
    return c;
}

static bool is_cased(uint32_t c)
{
    return case_map(c, true) != c || case_map(c, false) != c;
}

static uint32_t decode_cp(const char *s, size_t n, size_t *len)
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

static void put_cp(jbuf *b, uint32_t c)
{
    char u[4];
    size_t n;
    if (c < 0x80) {
        u[0] = (char)c;
        n = 1;
    } else if (c < 0x800) {
        u[0] = (char)(0xC0 | c >> 6);
        u[1] = (char)(0x80 | (c & 0x3F));
        n = 2;
    } else if (c < 0x10000) {
        u[0] = (char)(0xE0 | c >> 12);
        u[1] = (char)(0x80 | (c >> 6 & 0x3F));
        u[2] = (char)(0x80 | (c & 0x3F));
        n = 3;
    } else {
        u[0] = (char)(0xF0 | c >> 18);
        u[1] = (char)(0x80 | (c >> 12 & 0x3F));
        u[2] = (char)(0x80 | (c >> 6 & 0x3F));
        u[3] = (char)(0x80 | (c & 0x3F));
        n = 4;
    }
    jbuf_put(b, u, n);
}

/* mode: 'u' upper, 'l' lower, 'c' capitalize (first upper, rest lower), 't' Python's str.title (upper after an
 * uncased character), 'T' Jinja's title filter (upper after whitespace or one of -([{<). ß uppercases to SS. */
static jv *change_case(jinja_ctx *c, const jnode *at, const jv *s, char mode)
{
    jbuf b = {.limit = jinja_ctx_string_limit(c)};
    const char *p = s->u.str.s;
    size_t n = s->u.str.n, len;
    bool start = true;
    for (size_t i = 0; i < n; i += len) {
        uint32_t cp = decode_cp(p + i, n - i, &len);
        bool up = mode == 'u' || ((mode == 'c' || mode == 't' || mode == 'T') && start);
        if (up && cp == 0xDF)
            jbuf_put(&b, mode == 'u' ? "SS" : "Ss", 2);
        else
            put_cp(&b, case_map(cp, up));
        if (mode == 'c')
            start = false;
        else if (mode == 't')
            start = !is_cased(cp);
        else if (mode == 'T') {
            size_t k;
            start = jutf8_space_at(p + i, n - i, &k) || (cp < 0x80 && strchr("-([{<", (int)cp));
        }
    }
    return jinja_ctx_take(c, at, &b);
}

static bool starts_or_ends(const jv *s, const jv *affix, bool end)
{
    if (affix->kind == JV_LIST) {
        for (size_t i = 0; i < affix->u.list.n; i++)
            if (affix->u.list.items[i]->kind == JV_STRING && starts_or_ends(s, affix->u.list.items[i], end))
                return true;
        return false;
    }
    size_t m = affix->u.str.n;
    if (m > s->u.str.n)
        return false;
    return memcmp(s->u.str.s + (end ? s->u.str.n - m : 0), affix->u.str.s, m) == 0;
}

/* ---- sequences -------------------------------------------------------------------------------------------- */

/* A list of what iterating v gives (a dict: its keys; a string: its characters; undefined: nothing). */
static jv *items_of(jinja_ctx *c, const jnode *at, jv *v)
{
    if (v->kind == JV_LIST)
        return v;
    jv *l = new_list(c, at);
    if (!l)
        return NULL;
    if (v->kind == JV_DICT) {
        for (size_t i = 0; i < v->u.dict.n; i++)
            if (!push(c, at, l, v->u.dict.keys[i]))
                return NULL;
    } else if (v->kind == JV_STRING) {
        size_t n = jutf8_count(v->u.str.s, v->u.str.n);
        for (size_t i = 0; i < n; i++) {
            size_t a = jutf8_offset(v->u.str.s, v->u.str.n, i), b = jutf8_offset(v->u.str.s, v->u.str.n, i + 1);
            if (!push(c, at, l, substr(c, at, v->u.str.s + a, b - a)))
                return NULL;
        }
    } else if (v->kind != JV_UNDEFINED) {
        return jinja_ctx_fail(c, at, DSARL_E_INVALID, "'%s' object is not iterable", jv_type_name(v));
    }
    return l;
}

static jv *dict_items(jinja_ctx *c, const jnode *at, jv *d)
{
    jv *l = new_list(c, at);
    for (size_t i = 0; l && i < d->u.dict.n; i++) {
        jv *pair = new_list(c, at);
        if (!pair || !push(c, at, pair, d->u.dict.keys[i]) || !push(c, at, pair, d->u.dict.vals[i]) ||
            !push(c, at, l, pair))
            return NULL;
        pair->is_tuple = true;
    }
    return l;
}

/* Attribute lookup as Jinja's `attribute=` arguments do it: "a.b" walks dicts, numbers index lists. */
static jv *attribute_of(jinja_ctx *c, jv *v, const jv *path)
{
    const char *p = path->u.str.s, *end = p + path->u.str.n;
    while (v && p < end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        size_t n = dot ? (size_t)(dot - p) : (size_t)(end - p);
        if (v->kind == JV_DICT || v->kind == JV_NAMESPACE) {
            v = jv_dict_get(v, p, n);
        } else if (v->kind == JV_LIST && n && isdigit((unsigned char)p[0])) {
            size_t i = (size_t)strtoull(p, NULL, 10);
            v = i < v->u.list.n ? v->u.list.items[i] : NULL;
        } else {
            v = NULL;
        }
        p += n + (dot ? 1 : 0);
    }
    return v ? v : jv_new(jinja_ctx_arena(c), JV_UNDEFINED);
}

/* select/reject/selectattr/rejectattr: keep items whose (attribute's) test result equals keep. */
static jv *select_items(jinja_ctx *c, const jnode *at, jv *v, const jargs *a, bool by_attr, bool keep)
{
    jv *items = items_of(c, at, v);
    jv *out = items ? new_list(c, at) : NULL;
    if (!out)
        return NULL;
    size_t first_test = by_attr ? 1 : 0;
    jv *attr = by_attr ? arg(a, 0, NULL) : NULL;
    if (by_attr && !need_string(c, at, "selectattr's attribute", attr))
        return NULL;
    jv *test = arg(a, first_test, NULL);
    if (test && !need_string(c, at, "select's test name", test))
        return NULL;
    if (test && !jinja_is_test(test->u.str.s))
        return jinja_ctx_fail(c, at, DSARL_E_UNSUPPORTED, "unsupported test '%s' in select", test->u.str.s);
    jargs rest = {.pos = a->n_pos > first_test + 1 ? a->pos + first_test + 1 : NULL,
                  .n_pos = a->n_pos > first_test + 1 ? a->n_pos - first_test - 1 : 0};
    for (size_t i = 0; i < items->u.list.n; i++) {
        jv *x = items->u.list.items[i], *probe = by_attr ? attribute_of(c, x, attr) : x;
        if (!probe)
            return jinja_ctx_oom(c, at);
        bool pass;
        if (test) {
            jv *r = jinja_apply_test(c, at, test->u.str.s, probe, &rest);
            if (!r)
                return NULL;
            pass = r->u.b;
        } else {
            pass = jv_truthy(probe);
        }
        if (pass == keep && !push(c, at, out, x))
            return NULL;
    }
    return out;
}

static jv *map_items(jinja_ctx *c, const jnode *at, jv *v, const jargs *a)
{
    jv *items = items_of(c, at, v);
    jv *out = items ? new_list(c, at) : NULL;
    if (!out)
        return NULL;
    jv *attr = arg(a, a->n_pos, "attribute"), *def = arg(a, a->n_pos, "default");
    jv *filter = a->n_pos ? a->pos[0] : NULL;
    if (!attr && !need_string(c, at, "map's filter name", filter))
        return NULL;
    if (!attr && !jinja_is_filter(filter->u.str.s))
        return jinja_ctx_fail(c, at, DSARL_E_UNSUPPORTED, "unsupported filter '%s' in map", filter->u.str.s);
    jargs rest = {.pos = a->n_pos > 1 ? a->pos + 1 : NULL, .n_pos = a->n_pos > 1 ? a->n_pos - 1 : 0};
    for (size_t i = 0; i < items->u.list.n; i++) {
        jv *x = items->u.list.items[i], *y;
        if (attr) {
            y = attribute_of(c, x, attr);
            if (y && y->kind == JV_UNDEFINED && def)
                y = def;
        } else {
            y = jinja_apply_filter(c, at, filter->u.str.s, x, &rest);
        }
        if (!y || !push(c, at, out, y))
            return jinja_ctx_failed(c) ? NULL : jinja_ctx_oom(c, at);
    }
    return out;
}

static int64_t length_of(const jv *v)
{
    switch (v->kind) {
    case JV_STRING: return (int64_t)jutf8_count(v->u.str.s, v->u.str.n);
    case JV_LIST: return (int64_t)v->u.list.n;
    case JV_DICT:
    case JV_NAMESPACE: return (int64_t)v->u.dict.n;
    case JV_UNDEFINED: return 0;
    default: return -1;
    }
}

/* ---- filters ---------------------------------------------------------------------------------------------- */

static jv *tojson(jinja_ctx *c, const jnode *at, jv *v, const jargs *a)
{
    static const char *const names[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    if (check_args(c, at, "tojson", a, 4, names) < 0)
        return NULL;
    jv *ea = arg(a, 0, "ensure_ascii"), *ind = arg(a, 1, "indent"), *sep = arg(a, 2, "separators");
    jv *sk = arg(a, 3, "sort_keys");
    char indent_buf[64];
    const char *indent = NULL;
    if (ind && ind->kind == JV_INT) {
        int64_t k = ind->u.i < 0 ? 0 : ind->u.i;
        if (k >= (int64_t)sizeof indent_buf)
            return jinja_ctx_fail(c, at, DSARL_E_UNSUPPORTED, "tojson indent %lld is larger than 63", (long long)k);
        memset(indent_buf, ' ', (size_t)k);
        indent_buf[k] = '\0';
        indent = indent_buf;
    } else if (ind && ind->kind == JV_STRING) {
        jv *copy = jv_string(jinja_ctx_arena(c), ind->u.str.s, ind->u.str.n);
        if (!copy)
            return jinja_ctx_oom(c, at);
        indent = copy->u.str.s;
    } else if (ind && ind->kind != JV_NONE) {
        return jinja_ctx_fail(c, at, DSARL_E_INVALID, "tojson indent must be an integer or a string");
    }
    const char *isep = NULL, *ksep = NULL;
    if (sep && sep->kind != JV_NONE) {
        if (sep->kind != JV_LIST || sep->u.list.n != 2 || sep->u.list.items[0]->kind != JV_STRING ||
            sep->u.list.items[1]->kind != JV_STRING)
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "tojson separators must be a pair of strings");
        jv *x = jv_string(jinja_ctx_arena(c), sep->u.list.items[0]->u.str.s, sep->u.list.items[0]->u.str.n);
        jv *y = jv_string(jinja_ctx_arena(c), sep->u.list.items[1]->u.str.s, sep->u.list.items[1]->u.str.n);
        if (!x || !y)
            return jinja_ctx_oom(c, at);
        isep = x->u.str.s;
        ksep = y->u.str.s;
    }
    jbuf b = {.limit = jinja_ctx_string_limit(c)};
    const jv *bad = NULL;
    if (jv_tojson(&b, v, ea && jv_truthy(ea), indent, isep, ksep, sk && jv_truthy(sk), 0, &bad) < 0) {
        free(b.data);
        return jinja_ctx_fail(c, at, DSARL_E_INVALID, "tojson: a %s is not JSON serializable", jv_type_name(bad));
    }
    return jinja_ctx_take(c, at, &b);
}

static jv *to_int(jinja_ctx *c, const jnode *at, jv *v, const jargs *a)
{
    jv *def = arg(a, 0, "default");
    jinja_arena *A = jinja_ctx_arena(c);
    if (v->kind == JV_INT)
        return v;
    if (v->kind == JV_BOOL)
        return jv_int(A, v->u.b);
    if (v->kind == JV_FLOAT && isfinite(v->u.f) && fabs(v->u.f) < 9.2e18)
        return jv_int(A, (int64_t)v->u.f);
    if (v->kind == JV_STRING) {
        char tmp[64];
        size_t n = v->u.str.n < sizeof tmp - 1 ? v->u.str.n : sizeof tmp - 1;
        memcpy(tmp, v->u.str.s, n);
        tmp[n] = '\0';
        char *end;
        long long i = strtoll(tmp, &end, 10);
        while (*end && isspace((unsigned char)*end))
            end++;
        if (end != tmp && !*end && n == v->u.str.n)
            return jv_int(A, i);
        double f = strtod(tmp, &end);
        while (*end && isspace((unsigned char)*end))
            end++;
        if (end != tmp && !*end && isfinite(f) && fabs(f) < 9.2e18 && n == v->u.str.n)
            return jv_int(A, (int64_t)f);
    }
    return def ? def : jv_int(A, 0);
}

static jv *to_float(jinja_ctx *c, const jnode *at, jv *v, const jargs *a)
{
    (void)at;
    jv *def = arg(a, 0, "default");
    jinja_arena *A = jinja_ctx_arena(c);
    if (v->kind == JV_FLOAT)
        return v;
    if (v->kind == JV_INT || v->kind == JV_BOOL)
        return jv_float(A, v->kind == JV_INT ? (double)v->u.i : v->u.b);
    if (v->kind == JV_STRING) {
        char tmp[64];
        size_t n = v->u.str.n < sizeof tmp - 1 ? v->u.str.n : sizeof tmp - 1;
        memcpy(tmp, v->u.str.s, n);
        tmp[n] = '\0';
        char *end;
        double f = strtod(tmp, &end);
        while (*end && isspace((unsigned char)*end))
            end++;
        if (end != tmp && !*end && n == v->u.str.n)
            return jv_float(A, f);
    }
    return def ? def : jv_float(A, 0.0);
}

static jv *indent_filter(jinja_ctx *c, const jnode *at, jv *v, const jargs *a)
{
    jv *s = str_of(c, at, v), *w = arg(a, 0, "width"), *first = arg(a, 1, "first"), *blank = arg(a, 2, "blank");
    if (!s)
        return NULL;
    jbuf pad = {.limit = 4096};
    if (w && w->kind == JV_STRING)
        jbuf_put(&pad, w->u.str.s, w->u.str.n);
    else
        for (int64_t i = 0; i < (w && w->kind == JV_INT ? w->u.i : 4) && i < 4096; i++)
            jbuf_putc(&pad, ' ');
    jbuf b = {.limit = jinja_ctx_string_limit(c)};
    const char *p = s->u.str.s;
    size_t n = s->u.str.n;
    bool first_line = true;
    for (size_t i = 0; i <= n;) {
        const char *nl = memchr(p + i, '\n', n - i);
        size_t end = nl ? (size_t)(nl - p) : n;
        bool empty = end == i;
        if ((!first_line || (first && jv_truthy(first))) && (!empty || (blank && jv_truthy(blank))) && (nl || end > i))
            jbuf_put(&b, pad.data ? pad.data : "", pad.len);
        jbuf_put(&b, p + i, end - i);
        if (!nl)
            break;
        jbuf_putc(&b, '\n');
        i = end + 1;
        first_line = false;
    }
    free(pad.data);
    return jinja_ctx_take(c, at, &b);
}

jv *jinja_apply_filter(jinja_ctx *c, const jnode *at, const char *name, jv *v, const jargs *a)
{
    jinja_arena *A = jinja_ctx_arena(c);
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        int64_t n = length_of(v);
        if (n < 0)
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "object of type '%s' has no len()", jv_type_name(v));
        return jv_int(A, n);
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        jv *def = arg(a, 0, "default_value"), *use_bool = arg(a, 1, "boolean");
        bool missing = v->kind == JV_UNDEFINED || (use_bool && jv_truthy(use_bool) && !jv_truthy(v));
        return missing ? (def ? def : substr(c, at, "", 0)) : v;
    }
    if (!strcmp(name, "tojson"))
        return tojson(c, at, v, a);
    if (!strcmp(name, "safe"))
        return v;
    if (!strcmp(name, "string"))
        return str_of(c, at, v);
    if (!strcmp(name, "int"))
        return to_int(c, at, v, a);
    if (!strcmp(name, "float"))
        return to_float(c, at, v, a);
    if (!strcmp(name, "items")) {
        if (v->kind == JV_UNDEFINED)
            return new_list(c, at);
        if (v->kind != JV_DICT && v->kind != JV_NAMESPACE)
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "items needs a mapping, not %s", jv_type_name(v));
        return dict_items(c, at, v);
    }
    if (!strcmp(name, "list"))
        return items_of(c, at, v);
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        jv *items = items_of(c, at, v);
        if (!items)
            return NULL;
        if (items->u.list.n == 0)
            return jv_new(A, JV_UNDEFINED);
        return items->u.list.items[name[0] == 'f' ? 0 : items->u.list.n - 1];
    }
    if (!strcmp(name, "reverse")) {
        if (v->kind == JV_STRING) {
            jbuf b = {.limit = jinja_ctx_string_limit(c)};
            size_t n = jutf8_count(v->u.str.s, v->u.str.n);
            for (size_t i = n; i-- > 0;) {
                size_t x = jutf8_offset(v->u.str.s, v->u.str.n, i), y = jutf8_offset(v->u.str.s, v->u.str.n, i + 1);
                jbuf_put(&b, v->u.str.s + x, y - x);
            }
            return jinja_ctx_take(c, at, &b);
        }
        jv *items = items_of(c, at, v), *out = items ? new_list(c, at) : NULL;
        for (size_t i = items ? items->u.list.n : 0; out && i-- > 0;)
            if (!push(c, at, out, items->u.list.items[i]))
                return NULL;
        return out;
    }
    if (!strcmp(name, "join")) {
        jv *sep = arg(a, 0, "d"), *attr = arg(a, 1, "attribute");
        jv *items = items_of(c, at, v);
        if (!items)
            return NULL;
        jbuf b = {.limit = jinja_ctx_string_limit(c)};
        for (size_t i = 0; i < items->u.list.n; i++) {
            if (i && sep)
                jv_str(&b, sep);
            jv *x = attr ? attribute_of(c, items->u.list.items[i], attr) : items->u.list.items[i];
            if (!x) {
                free(b.data);
                return jinja_ctx_oom(c, at);
            }
            jv_str(&b, x);
        }
        return jinja_ctx_take(c, at, &b);
    }
    if (!strcmp(name, "map"))
        return map_items(c, at, v, a);
    if (!strcmp(name, "select") || !strcmp(name, "reject"))
        return select_items(c, at, v, a, false, name[0] == 's');
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr"))
        return select_items(c, at, v, a, true, name[0] == 's');
    if (!strcmp(name, "unique")) {
        jv *items = items_of(c, at, v), *out = items ? new_list(c, at) : NULL;
        for (size_t i = 0; out && i < items->u.list.n; i++) {
            bool seen = false;
            for (size_t j = 0; j < out->u.list.n && !seen; j++)
                seen = jv_equal(out->u.list.items[j], items->u.list.items[i]);
            if (!seen && !push(c, at, out, items->u.list.items[i]))
                return NULL;
        }
        return out;
    }
    if (!strcmp(name, "min") || !strcmp(name, "max") || !strcmp(name, "sum")) {
        jv *items = items_of(c, at, v);
        if (!items)
            return NULL;
        if (name[1] == 'u') {
            jv *total = jv_int(A, 0);
            for (size_t i = 0; total && i < items->u.list.n; i++) {
                jv *x = items->u.list.items[i];
                if (x->kind != JV_INT && x->kind != JV_FLOAT && x->kind != JV_BOOL)
                    return jinja_ctx_fail(c, at, DSARL_E_INVALID, "sum of a %s", jv_type_name(x));
                total = total->kind == JV_INT && x->kind != JV_FLOAT
                            ? jv_int(A, total->u.i + (x->kind == JV_INT ? x->u.i : x->u.b))
                            : jv_float(A, (total->kind == JV_INT ? (double)total->u.i : total->u.f) +
                                              (x->kind == JV_FLOAT ? x->u.f
                                               : x->kind == JV_INT ? (double)x->u.i
                                                                   : x->u.b));
            }
            return total;
        }
        if (items->u.list.n == 0)
            return jv_new(A, JV_UNDEFINED);
        jv *best = items->u.list.items[0];
        for (size_t i = 1; i < items->u.list.n; i++) {
            jv *x = items->u.list.items[i];
            bool both_num =
                (x->kind == JV_INT || x->kind == JV_FLOAT) && (best->kind == JV_INT || best->kind == JV_FLOAT);
            bool both_str = x->kind == JV_STRING && best->kind == JV_STRING;
            if (!both_num && !both_str)
                return jinja_ctx_fail(c, at, DSARL_E_INVALID, "%s of mixed types", name);
            int cmp;
            if (both_num) {
                double dx = x->kind == JV_INT ? (double)x->u.i : x->u.f,
                       db = best->kind == JV_INT ? (double)best->u.i : best->u.f;
                cmp = (dx > db) - (dx < db);
            } else {
                size_t n = x->u.str.n < best->u.str.n ? x->u.str.n : best->u.str.n;
                cmp = memcmp(x->u.str.s, best->u.str.s, n);
                if (!cmp)
                    cmp = (x->u.str.n > best->u.str.n) - (x->u.str.n < best->u.str.n);
            }
            if ((name[1] == 'i' && cmp < 0) || (name[1] == 'a' && cmp > 0))
                best = x;
        }
        return best;
    }
    if (!strcmp(name, "abs")) {
        if (v->kind == JV_INT)
            return v->u.i == INT64_MIN ? jinja_ctx_fail(c, at, DSARL_E_UNSUPPORTED, "integer overflow in abs")
                                       : jv_int(A, v->u.i < 0 ? -v->u.i : v->u.i);
        if (v->kind == JV_FLOAT)
            return jv_float(A, fabs(v->u.f));
        return jinja_ctx_fail(c, at, DSARL_E_INVALID, "bad operand type for abs(): '%s'", jv_type_name(v));
    }
    if (!strcmp(name, "round")) {
        jv *prec = arg(a, 0, "precision"), *method = arg(a, 1, "method");
        if (v->kind != JV_INT && v->kind != JV_FLOAT)
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "round needs a number, not %s", jv_type_name(v));
        if (method && !(method->kind == JV_STRING && method->u.str.n == 6 && !memcmp(method->u.str.s, "common", 6)))
            return jinja_ctx_fail(c, at, DSARL_E_UNSUPPORTED, "unsupported: round with a method other than 'common'");
        double scale = pow(10.0, prec && prec->kind == JV_INT ? (double)prec->u.i : 0.0);
        double x = v->kind == JV_INT ? (double)v->u.i : v->u.f;
        return jv_float(A, round(x * scale) / scale);
    }
    if (!strcmp(name, "indent"))
        return indent_filter(c, at, v, a);
    // the rest work on str(v)
    jv *s = str_of(c, at, v);
    if (!s)
        return NULL;
    if (!strcmp(name, "trim"))
        return strip(c, at, s, arg(a, 0, "chars"), true, true);
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "capitalize") || !strcmp(name, "title"))
        return change_case(c, at, s, name[0] == 'u' ? 'u' : name[0] == 'l' ? 'l' : name[0] == 'c' ? 'c' : 'T');
    if (!strcmp(name, "replace"))
        return replace(c, at, s, arg(a, 0, "old"), arg(a, 1, "new"), arg(a, 2, "count"));
    if (!strcmp(name, "escape") || !strcmp(name, "e")) {
        jbuf b = {.limit = jinja_ctx_string_limit(c)};
        for (size_t i = 0; i < s->u.str.n; i++) {
            char ch = s->u.str.s[i];
            const char *rep = ch == '&'    ? "&amp;"
                              : ch == '<'  ? "&lt;"
                              : ch == '>'  ? "&gt;"
                              : ch == '"'  ? "&#34;"
                              : ch == '\'' ? "&#39;"
                                           : NULL;
            if (rep)
                jbuf_put(&b, rep, strlen(rep));
            else
                jbuf_putc(&b, ch);
        }
        return jinja_ctx_take(c, at, &b);
    }
    return jinja_ctx_fail(c, at, DSARL_E_INTERNAL, "filter '%s' is listed but not implemented", name);
}

/* ---- tests ------------------------------------------------------------------------------------------------ */

jv *jinja_apply_test(jinja_ctx *c, const jnode *at, const char *name, jv *v, const jargs *a)
{
    jv *x = arg(a, 0, NULL);
    bool r;
    if (!strcmp(name, "defined"))
        r = v->kind != JV_UNDEFINED;
    else if (!strcmp(name, "undefined"))
        r = v->kind == JV_UNDEFINED;
    else if (!strcmp(name, "none"))
        r = v->kind == JV_NONE;
    else if (!strcmp(name, "string"))
        r = v->kind == JV_STRING;
    else if (!strcmp(name, "number"))
        r = v->kind == JV_INT || v->kind == JV_FLOAT || v->kind == JV_BOOL;
    else if (!strcmp(name, "integer"))
        r = v->kind == JV_INT;
    else if (!strcmp(name, "float"))
        r = v->kind == JV_FLOAT;
    else if (!strcmp(name, "boolean"))
        r = v->kind == JV_BOOL;
    else if (!strcmp(name, "true") || !strcmp(name, "false"))
        r = v->kind == JV_BOOL && v->u.b == (name[0] == 't');
    else if (!strcmp(name, "mapping"))
        r = v->kind == JV_DICT;
    else if (!strcmp(name, "iterable") || !strcmp(name, "sequence"))
        r = v->kind == JV_STRING || v->kind == JV_LIST || v->kind == JV_DICT || v->kind == JV_UNDEFINED;
    else if (!strcmp(name, "callable"))
        r = v->kind == JV_MACRO || v->kind == JV_BUILTIN || v->kind == JV_METHOD;
    else if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        jv *s = str_of(c, at, v);
        if (!s)
            return NULL;
        bool cased = false, all = true;
        for (size_t i = 0; i < s->u.str.n; i++) {
            unsigned char ch = (unsigned char)s->u.str.s[i];
            if (isalpha(ch)) {
                cased = true;
                all &= name[0] == 'l' ? islower(ch) != 0 : isupper(ch) != 0;
            }
        }
        r = cased && all;
    } else if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (v->kind != JV_INT && v->kind != JV_BOOL)
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "'is %s' needs an integer, not %s", name, jv_type_name(v));
        int64_t i = v->kind == JV_INT ? v->u.i : v->u.b;
        if (name[0] == 'd') {
            if (!x || x->kind != JV_INT || x->u.i == 0)
                return jinja_ctx_fail(c, at, DSARL_E_INVALID, "'is divisibleby' needs a nonzero integer");
            r = x->u.i == -1 || i % x->u.i == 0;
        } else {
            r = (i % 2 != 0) == (name[0] == 'o');
        }
    } else {
        if (!x)
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "'is %s' needs an argument", name);
        if (!strcmp(name, "sameas")) {
            r = v == x || (v->kind == x->kind && (v->kind == JV_NONE || (v->kind == JV_BOOL && v->u.b == x->u.b)));
        } else if (!strcmp(name, "in")) {
            r = false;
            if (x->kind == JV_LIST)
                for (size_t i = 0; i < x->u.list.n && !r; i++)
                    r = jv_equal(v, x->u.list.items[i]);
            else if (x->kind == JV_DICT)
                r = jv_dict_get_value(x, v) != NULL;
            else if (x->kind == JV_STRING && v->kind == JV_STRING)
                r = v->u.str.n == 0 || memmem(x->u.str.s, x->u.str.n, v->u.str.s, v->u.str.n) != NULL;
            else
                return jinja_ctx_fail(c, at, DSARL_E_INVALID, "'is in' needs a sequence, not %s", jv_type_name(x));
        } else if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==")) {
            r = jv_equal(v, x);
        } else if (!strcmp(name, "ne") || !strcmp(name, "!=")) {
            r = !jv_equal(v, x);
        } else {
            // lt le gt ge and their symbols: numbers or strings
            int cmp;
            bool nums = (v->kind == JV_INT || v->kind == JV_FLOAT) && (x->kind == JV_INT || x->kind == JV_FLOAT);
            if (nums) {
                double dv = v->kind == JV_INT ? (double)v->u.i : v->u.f,
                       dx = x->kind == JV_INT ? (double)x->u.i : x->u.f;
                cmp = (dv > dx) - (dv < dx);
            } else if (v->kind == JV_STRING && x->kind == JV_STRING) {
                size_t n = v->u.str.n < x->u.str.n ? v->u.str.n : x->u.str.n;
                cmp = memcmp(v->u.str.s, x->u.str.s, n);
                if (!cmp)
                    cmp = (v->u.str.n > x->u.str.n) - (v->u.str.n < x->u.str.n);
            } else {
                return jinja_ctx_fail(c, at, DSARL_E_INVALID, "'is %s' between '%s' and '%s'", name, jv_type_name(v),
                                      jv_type_name(x));
            }
            bool less = name[0] == 'l' || name[0] == '<', eq = name[1] == 'e' || name[1] == '=';
            r = less ? (eq ? cmp <= 0 : cmp < 0) : (eq ? cmp >= 0 : cmp > 0);
        }
    }
    return boolean(c, at, r);
}

/* ---- methods ---------------------------------------------------------------------------------------------- */

jv *jinja_get_method(jinja_ctx *c, jv *self, const char *name)
{
    int i = INDEX_OF(methods, name);
    if (i < 0 ||
        !((self->kind == JV_STRING && i < METHOD_DICT_FIRST) || (self->kind == JV_DICT && i >= METHOD_DICT_FIRST)))
        return NULL;
    jv *m = jv_new(jinja_ctx_arena(c), JV_METHOD);
    if (!m)
        return jinja_ctx_oom(c, NULL);
    m->u.method.id = i;
    m->u.method.self = self;
    return m;
}

jv *jinja_call_method(jinja_ctx *c, const jnode *at, const jv *method, const jargs *a)
{
    jv *self = method->u.method.self;
    const char *name = methods[method->u.method.id];
    jinja_arena *A = jinja_ctx_arena(c);
    if (a->n_kw && strcmp(name, "split") && strcmp(name, "rsplit"))
        return jinja_ctx_fail(c, at, DSARL_E_INVALID, "%s() takes no keyword arguments", name);
    if (self->kind == JV_DICT) {
        if (!strcmp(name, "items"))
            return dict_items(c, at, self);
        if (!strcmp(name, "keys") || !strcmp(name, "values")) {
            jv *l = new_list(c, at);
            for (size_t i = 0; l && i < self->u.dict.n; i++)
                if (!push(c, at, l, name[0] == 'k' ? self->u.dict.keys[i] : self->u.dict.vals[i]))
                    return NULL;
            return l;
        }
        // get(key, default=None)
        jv *key = arg(a, 0, NULL), *def = arg(a, 1, NULL);
        if (!key)
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "get() needs a key");
        jv *v = jv_dict_get_value(self, key);
        return v ? v : def ? def : jv_new(A, JV_NONE);
    }
    jv *x = arg(a, 0, NULL), *y = arg(a, 1, NULL);
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        if (!x || (x->kind != JV_STRING && x->kind != JV_LIST))
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "%s() needs a string or a tuple of strings", name);
        return boolean(c, at, starts_or_ends(self, x, name[0] == 'e'));
    }
    if (!strcmp(name, "split") || !strcmp(name, "rsplit"))
        return split(c, at, self, arg(a, 0, "sep"), arg(a, 1, "maxsplit"), name[0] == 'r');
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip"))
        return strip(c, at, self, x, name[0] != 'r', name[0] != 'l');
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") || !strcmp(name, "capitalize"))
        return change_case(c, at, self, name[0] == 'u' ? 'u' : name[0] == 'l' ? 'l' : name[0] == 'c' ? 'c' : 't');
    if (!strcmp(name, "replace"))
        return replace(c, at, self, x, y, arg(a, 2, NULL));
    if (!strcmp(name, "find") || !strcmp(name, "count")) {
        if (!need_string(c, at, name, x))
            return NULL;
        if (name[0] == 'f') {
            const char *hit = x->u.str.n ? memmem(self->u.str.s, self->u.str.n, x->u.str.s, x->u.str.n) : self->u.str.s;
            return jv_int(A, hit ? (int64_t)jutf8_count(self->u.str.s, (size_t)(hit - self->u.str.s)) : -1);
        }
        if (x->u.str.n == 0)
            return jv_int(A, (int64_t)jutf8_count(self->u.str.s, self->u.str.n) + 1);
        int64_t n = 0;
        for (const char *p = self->u.str.s, *end = p + self->u.str.n;
             (p = memmem(p, (size_t)(end - p), x->u.str.s, x->u.str.n)); p += x->u.str.n)
            n++;
        return jv_int(A, n);
    }
    if (!strcmp(name, "isdigit") || !strcmp(name, "isspace")) {
        bool r = self->u.str.n > 0;
        for (size_t i = 0; i < self->u.str.n && r; i++)
            r = name[2] == 'd' ? isdigit((unsigned char)self->u.str.s[i]) != 0
                               : isspace((unsigned char)self->u.str.s[i]) != 0;
        return boolean(c, at, r);
    }
    // join(iterable): self is the separator
    jv *items = x ? items_of(c, at, x) : NULL;
    if (!items)
        return jinja_ctx_failed(c) ? NULL : jinja_ctx_fail(c, at, DSARL_E_INVALID, "join() needs an iterable");
    jbuf b = {.limit = jinja_ctx_string_limit(c)};
    for (size_t i = 0; i < items->u.list.n; i++) {
        if (items->u.list.items[i]->kind != JV_STRING) {
            free(b.data);
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "join: item %zu is a %s, not a string", i,
                                  jv_type_name(items->u.list.items[i]));
        }
        if (i)
            jbuf_put(&b, self->u.str.s, self->u.str.n);
        jbuf_put(&b, items->u.list.items[i]->u.str.s, items->u.list.items[i]->u.str.n);
    }
    return jinja_ctx_take(c, at, &b);
}

/* ---- globals ---------------------------------------------------------------------------------------------- */

jv *jinja_call_global(jinja_ctx *c, const jnode *at, int index, const jargs *a)
{
    jinja_arena *A = jinja_ctx_arena(c);
    const char *name = globals[index];
    if (!strcmp(name, "range")) {
        int64_t r[3] = {0, 0, 1};
        if (a->n_pos < 1 || a->n_pos > 3 || a->n_kw)
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "range() takes one to three integer arguments");
        for (size_t i = 0; i < a->n_pos; i++)
            if (a->pos[i]->kind != JV_INT)
                return jinja_ctx_fail(c, at, DSARL_E_INVALID, "range() arguments must be integers, not %s",
                                      jv_type_name(a->pos[i]));
        if (a->n_pos == 1)
            r[1] = a->pos[0]->u.i;
        else
            for (size_t i = 0; i < a->n_pos; i++)
                r[i] = a->pos[i]->u.i;
        if (r[2] == 0)
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "range() step must not be zero");
        double count = ceil(((double)r[1] - (double)r[0]) / (double)r[2]);
        if (count < 0)
            count = 0;
        if (count > 1e15 || jinja_ctx_count_iterations(c, at, (int64_t)count) < 0)
            return jinja_ctx_failed(c) ? NULL : jinja_ctx_fail(c, at, DSARL_E_INVALID, "range() is too long");
        jv *l = new_list(c, at);
        for (int64_t i = 0, v = r[0]; l && i < (int64_t)count; i++, v += r[2])
            if (!push(c, at, l, jv_int(A, v)))
                return NULL;
        return l;
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        jv *ns = jv_new(A, name[0] == 'n' ? JV_NAMESPACE : JV_DICT);
        if (!ns)
            return jinja_ctx_oom(c, at);
        if (a->n_pos > 1 || (a->n_pos == 1 && a->pos[0]->kind != JV_DICT))
            return jinja_ctx_fail(c, at, DSARL_E_INVALID, "%s() takes keyword arguments and at most one dict", name);
        if (a->n_pos == 1)
            for (size_t i = 0; i < a->pos[0]->u.dict.n; i++)
                if (jv_dict_set(A, ns, a->pos[0]->u.dict.keys[i], a->pos[0]->u.dict.vals[i]) < 0)
                    return jinja_ctx_oom(c, at);
        for (size_t i = 0; i < a->n_kw; i++) {
            if (name[0] == 'n' && a->kw_names[i][0] == '_')
                return jinja_ctx_fail(c, at, DSARL_E_INVALID, "namespace attribute '%s' starts with '_'",
                                      a->kw_names[i]);
            jv *k = jv_string(A, a->kw_names[i], strlen(a->kw_names[i]));
            if (!k || jv_dict_set(A, ns, k, a->kw[i]) < 0)
                return jinja_ctx_oom(c, at);
        }
        return ns;
    }
    if (!strcmp(name, "raise_exception")) {
        jv *msg = a->n_pos ? str_of(c, at, a->pos[0]) : NULL;
        if (a->n_pos && !msg)
            return NULL;
        return jinja_ctx_fail(c, at, DSARL_E_INVALID, "the template raised an exception: %.*s",
                              msg ? (int)(msg->u.str.n > 600 ? 600 : msg->u.str.n) : 0, msg ? msg->u.str.s : "");
    }
    // strftime_now(format): the local time, as transformers' datetime.now().strftime
    jv *fmt = a->n_pos == 1 ? a->pos[0] : NULL;
    if (!need_string(c, at, "strftime_now", fmt))
        return NULL;
    char f[256], out[512];
    if (fmt->u.str.n >= sizeof f)
        return jinja_ctx_fail(c, at, DSARL_E_INVALID, "strftime_now format is longer than 255 bytes");
    memcpy(f, fmt->u.str.s, fmt->u.str.n);
    f[fmt->u.str.n] = '\0';
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    size_t n = strftime(out, sizeof out, f, &tm);
    return substr(c, at, out, n);
}
