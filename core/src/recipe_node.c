/* recipe_node.c: the recipe tree (nodes, scalar typing) and the read API plugins use (dsarl/recipe.h). */
#include "recipe_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- origins and nodes ----------------------------------------------------------------------------------- */

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

int recipe_node_set_origin(dsarl_node *node, const dsarl_origin *origin)
{
    dsarl_origin copy = {.kind = DSARL_ORIGIN_BUILTIN};
    if (origin) {
        copy = *origin;
        copy.file = dup_or_null(origin->file);
        copy.text = dup_or_null(origin->text);
        if ((origin->file && !copy.file) || (origin->text && !copy.text)) {
            free((char *)copy.file);
            free((char *)copy.text);
            return DSARL_E_NOMEM;
        }
    }
    free((char *)node->origin.file);
    free((char *)node->origin.text);
    node->origin = copy;
    return DSARL_OK;
}

int recipe_node_set_origin_deep(dsarl_node *node, const dsarl_origin *origin)
{
    DSARL_TRY(recipe_node_set_origin(node, origin));
    for (size_t i = 0; i < node->count; i++)
        DSARL_TRY(recipe_node_set_origin_deep(node->items[i], origin));
    return DSARL_OK;
}

dsarl_node *recipe_node_new(dsarl_node_type type, const dsarl_origin *origin)
{
    dsarl_node *node = calloc(1, sizeof *node);
    if (!node)
        return NULL;
    node->type = type;
    node->origin.kind = DSARL_ORIGIN_BUILTIN;
    if (recipe_node_set_origin(node, origin) < 0) {
        free(node);
        return NULL;
    }
    return node;
}

static void free_value(dsarl_node *node)
{
    for (size_t i = 0; i < node->count; i++)
        recipe_node_free(node->items[i]);
    free(node->items);
    free(node->text);
    node->items = NULL;
    node->text = NULL;
    node->count = node->capacity = 0;
}

void recipe_node_free(dsarl_node *node)
{
    if (!node)
        return;
    free_value(node);
    free(node->key);
    free((char *)node->origin.file);
    free((char *)node->origin.text);
    free(node);
}

dsarl_node *recipe_node_copy(const dsarl_node *node)
{
    dsarl_node *copy = recipe_node_new(node->type, &node->origin);
    if (!copy)
        return NULL;
    copy->bool_value = node->bool_value;
    copy->int_value = node->int_value;
    copy->float_value = node->float_value;
    copy->resolve_state = node->resolve_state;
    if (node->text && !(copy->text = strdup(node->text)))
        goto fail;
    for (size_t i = 0; i < node->count; i++) {
        dsarl_node *child = recipe_node_copy(node->items[i]);
        if (!child || recipe_node_append(copy, node->items[i]->key, child) < 0) {
            recipe_node_free(child);
            goto fail;
        }
    }
    return copy;
fail:
    recipe_node_free(copy);
    return NULL;
}

int recipe_node_append(dsarl_node *parent, const char *key, dsarl_node *child)
{
    if (parent->count == parent->capacity) {
        size_t capacity = parent->capacity ? parent->capacity * 2 : 8;
        dsarl_node **items = realloc(parent->items, capacity * sizeof *items);
        if (!items)
            return DSARL_E_NOMEM;
        parent->items = items;
        parent->capacity = capacity;
    }
    free(child->key);
    child->key = NULL;
    if (key && !(child->key = strdup(key)))
        return DSARL_E_NOMEM;
    child->parent = parent;
    parent->items[parent->count++] = child;
    return DSARL_OK;
}

long recipe_map_index(const dsarl_node *map, const char *key)
{
    if (!map || map->type != DSARL_NODE_MAP)
        return -1;
    for (size_t i = 0; i < map->count; i++)
        if (strcmp(map->items[i]->key, key) == 0)
            return (long)i;
    return -1;
}

int recipe_node_replace_at(dsarl_node *parent, size_t i, dsarl_node *child)
{
    dsarl_node *old = parent->items[i];
    free(child->key);
    child->key = old->key;
    old->key = NULL;
    child->parent = parent;
    parent->items[i] = child;
    recipe_node_free(old);
    return DSARL_OK;
}

void recipe_node_remove_at(dsarl_node *parent, size_t i)
{
    recipe_node_free(parent->items[i]);
    memmove(parent->items + i, parent->items + i + 1, (parent->count - i - 1) * sizeof *parent->items);
    parent->count--;
}

void recipe_node_take_value(dsarl_node *dst, dsarl_node *src)
{
    free_value(dst);
    dst->type = src->type;
    dst->text = src->text;
    dst->bool_value = src->bool_value;
    dst->int_value = src->int_value;
    dst->float_value = src->float_value;
    dst->items = src->items;
    dst->count = src->count;
    dst->capacity = src->capacity;
    for (size_t i = 0; i < dst->count; i++)
        dst->items[i]->parent = dst;
    src->text = NULL;
    src->items = NULL;
    src->count = src->capacity = 0;
    recipe_node_free(src);
}

/* ---- scalars ----------------------------------------------------------------------------------------------- */

void recipe_format_float(double v, char *buf, size_t size)
{
    if (isnan(v)) {
        snprintf(buf, size, ".nan");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, size, v < 0 ? "-.inf" : ".inf");
        return;
    }
    // Shortest precision that round-trips, like Python's repr, so config show prints 5e-07 and not 4.99..e-07.
    for (int precision = 1; precision <= 17; precision++) {
        snprintf(buf, size, "%.*g", precision, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    // "1" or "100000" would read back as an int: give it a fraction.
    if (!strpbrk(buf, ".eE") && strlen(buf) + 3 <= size)
        strcat(buf, ".0");
}

static dsarl_node *scalar_with_text(dsarl_node_type type, const char *text, const dsarl_origin *origin)
{
    dsarl_node *node = recipe_node_new(type, origin);
    if (!node)
        return NULL;
    if (!(node->text = strdup(text))) {
        recipe_node_free(node);
        return NULL;
    }
    return node;
}

dsarl_node *recipe_scalar_string(const char *s, const dsarl_origin *origin)
{
    return scalar_with_text(DSARL_NODE_STRING, s, origin);
}

dsarl_node *recipe_scalar_int(int64_t v, const dsarl_origin *origin)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    dsarl_node *node = scalar_with_text(DSARL_NODE_INT, buf, origin);
    if (node) {
        node->int_value = v;
        node->float_value = (double)v;
    }
    return node;
}

dsarl_node *recipe_scalar_float(double v, const dsarl_origin *origin)
{
    char buf[64];
    recipe_format_float(v, buf, sizeof buf);
    dsarl_node *node = scalar_with_text(DSARL_NODE_FLOAT, buf, origin);
    if (node)
        node->float_value = v;
    return node;
}

dsarl_node *recipe_scalar_bool(bool v, const dsarl_origin *origin)
{
    dsarl_node *node = scalar_with_text(DSARL_NODE_BOOL, v ? "true" : "false", origin);
    if (node)
        node->bool_value = v;
    return node;
}

dsarl_node *recipe_scalar_null(const dsarl_origin *origin)
{
    return scalar_with_text(DSARL_NODE_NULL, "null", origin);
}

static bool is_one_of(const char *text, size_t len, const char *const *words)
{
    for (; *words; words++)
        if (strlen(*words) == len && memcmp(*words, text, len) == 0)
            return true;
    return false;
}

static const char *const null_words[] = {"", "~", "null", "Null", "NULL", NULL};
static const char *const true_words[] = {"true", "True", "TRUE", NULL};
static const char *const false_words[] = {"false", "False", "FALSE", NULL};
static const char *const inf_words[] = {".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", NULL};
static const char *const neg_inf_words[] = {"-.inf", "-.Inf", "-.INF", NULL};
static const char *const nan_words[] = {".nan", ".NaN", ".NAN", NULL};

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* [-+]?[0-9]+ */
static bool looks_int(const char *s, size_t len)
{
    size_t i = (len > 0 && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
    if (i == len)
        return false;
    for (; i < len; i++)
        if (!is_digit(s[i]))
            return false;
    return true;
}

/* [-+]?(digits[.digits?]|.digits)([eE][-+]?digits)? with a '.' or an exponent (so strtod's "inf", "nan" and
 * hex floats never sneak in). */
static bool looks_float(const char *s, size_t len)
{
    size_t i = (len > 0 && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
    size_t mantissa_digits = 0;
    bool has_dot = false, has_exp = false;
    while (i < len && is_digit(s[i]))
        i++, mantissa_digits++;
    if (i < len && s[i] == '.') {
        has_dot = true;
        i++;
        while (i < len && is_digit(s[i]))
            i++, mantissa_digits++;
    }
    if (mantissa_digits == 0)
        return false;
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        has_exp = true;
        i++;
        if (i < len && (s[i] == '-' || s[i] == '+'))
            i++;
        size_t exp_digits = 0;
        while (i < len && is_digit(s[i]))
            i++, exp_digits++;
        if (exp_digits == 0)
            return false;
    }
    return i == len && (has_dot || has_exp);
}

dsarl_node_type recipe_plain_type(const char *text)
{
    size_t len = strlen(text);
    if (is_one_of(text, len, null_words))
        return DSARL_NODE_NULL;
    if (is_one_of(text, len, true_words) || is_one_of(text, len, false_words))
        return DSARL_NODE_BOOL;
    if (looks_int(text, len))
        return DSARL_NODE_INT;
    if (looks_float(text, len) || is_one_of(text, len, inf_words) || is_one_of(text, len, neg_inf_words) ||
        is_one_of(text, len, nan_words))
        return DSARL_NODE_FLOAT;
    return DSARL_NODE_STRING;
}

int recipe_scalar_from_plain(const char *text, size_t len, const dsarl_origin *origin, dsarl_node **out,
                             dsarl_error *err)
{
    char *copy = strndup(text, len);
    if (!copy)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory reading a scalar");
    dsarl_node_type type = recipe_plain_type(copy);
    dsarl_node *node = recipe_node_new(type, origin);
    if (!node) {
        free(copy);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory reading a scalar");
    }
    node->text = copy;
    if (type == DSARL_NODE_NULL) {
        // Keep a readable spelling for dsarl_node_text; the empty scalar and ~ both mean null.
        free(node->text);
        if (!(node->text = strdup("null"))) {
            recipe_node_free(node);
            return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory reading a scalar");
        }
    } else if (type == DSARL_NODE_BOOL) {
        node->bool_value = is_one_of(copy, len, true_words);
    } else if (type == DSARL_NODE_INT) {
        errno = 0;
        char *end = NULL;
        long long v = strtoll(copy, &end, 10);
        if (errno == ERANGE || *end != '\0') {
            recipe_node_free(node);
            return DSARL_FAIL(err, DSARL_E_INVALID, "integer '%.*s' does not fit in 64 bits", (int)len, text);
        }
        node->int_value = v;
        node->float_value = (double)v;
    } else if (type == DSARL_NODE_FLOAT) {
        if (is_one_of(copy, len, inf_words)) {
            node->float_value = INFINITY;
        } else if (is_one_of(copy, len, neg_inf_words)) {
            node->float_value = -INFINITY;
        } else if (is_one_of(copy, len, nan_words)) {
            node->float_value = NAN;
        } else {
            errno = 0;
            char *end = NULL;
            double v = strtod(copy, &end);
            // ERANGE on underflow (1e-400 -> 0) is harmless; only an overflow to infinity is refused.
            if (*end != '\0' || (errno == ERANGE && isinf(v))) {
                recipe_node_free(node);
                return DSARL_FAIL(err, DSARL_E_INVALID, "number '%.*s' is out of range for a double", (int)len,
                                  text);
            }
            node->float_value = v;
        }
    }
    *out = node;
    return DSARL_OK;
}

/* ---- comparison and edit distance ---------------------------------------------------------------------------- */

bool dsarl_node_equal(const dsarl_node *a, const dsarl_node *b)
{
    if (!a || !b)
        return a == b;
    if (a->type != b->type)
        return false;
    switch (a->type) {
    case DSARL_NODE_NULL: return true;
    case DSARL_NODE_BOOL: return a->bool_value == b->bool_value;
    case DSARL_NODE_INT: return a->int_value == b->int_value;
    case DSARL_NODE_FLOAT:
        return a->float_value == b->float_value || (isnan(a->float_value) && isnan(b->float_value));
    case DSARL_NODE_STRING: return strcmp(a->text, b->text) == 0;
    case DSARL_NODE_LIST:
        if (a->count != b->count)
            return false;
        for (size_t i = 0; i < a->count; i++)
            if (!dsarl_node_equal(a->items[i], b->items[i]))
                return false;
        return true;
    case DSARL_NODE_MAP:
        if (a->count != b->count)
            return false;
        for (size_t i = 0; i < a->count; i++) {
            long j = recipe_map_index(b, a->items[i]->key);
            if (j < 0 || !dsarl_node_equal(a->items[i], b->items[j]))
                return false;
        }
        return true;
    }
    return false;
}

size_t dsarl_edit_distance(const char *a, const char *b)
{
    size_t n = strlen(a), m = strlen(b);
    size_t *row = malloc((m + 1) * sizeof *row);
    if (!row)
        return (size_t)-1;
    for (size_t j = 0; j <= m; j++)
        row[j] = j;
    for (size_t i = 1; i <= n; i++) {
        size_t diagonal = row[0];
        row[0] = i;
        for (size_t j = 1; j <= m; j++) {
            size_t above = row[j];
            size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            size_t best = diagonal + cost;
            if (above + 1 < best)
                best = above + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diagonal = above;
        }
    }
    size_t d = row[m];
    free(row);
    return d;
}

/* Best candidate so far for a suggestion. */
typedef struct suggestion {
    const char *target;
    size_t best_distance;
    char *best;
    size_t size;
    bool found;
} suggestion;

static void consider(suggestion *s, const char *candidate)
{
    size_t d = dsarl_edit_distance(s->target, candidate);
    if (d < s->best_distance) {
        s->best_distance = d;
        snprintf(s->best, s->size, "%s", candidate);
        s->found = true;
    }
}

static void consider_all_paths(suggestion *s, const dsarl_node *node, char *path, size_t len, size_t cap)
{
    for (size_t i = 0; i < node->count; i++) {
        const dsarl_node *child = node->items[i];
        if (!child->key)
            continue;
        int n = snprintf(path + len, cap - len, "%s%s", len ? "." : "", child->key);
        if (n < 0 || (size_t)n >= cap - len)
            continue;
        consider(s, path);
        if (child->type == DSARL_NODE_MAP)
            consider_all_paths(s, child, path, len + (size_t)n, cap);
        path[len] = '\0';
    }
}

const char *recipe_suggest_path(const dsarl_node *root, const char *path, char *buf, size_t size)
{
    // A typo is "near" when at most a third of the characters (at least 2) differ.
    size_t limit = strlen(path) / 3;
    if (limit < 2)
        limit = 2;
    suggestion s = {.target = path, .best_distance = limit + 1, .best = buf, .size = size};
    // Same level first: the deepest existing parent of path.
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s", path);
    const dsarl_node *parent = NULL;
    char *dot;
    while ((dot = strrchr(prefix, '.'))) {
        *dot = '\0';
        parent = dsarl_node_get(root, prefix);
        if (parent)
            break;
    }
    if (!dot)
        prefix[0] = '\0', parent = root;
    if (parent && parent->type == DSARL_NODE_MAP) {
        char candidate[512];
        for (size_t i = 0; i < parent->count; i++) {
            snprintf(candidate, sizeof candidate, "%s%s%s", prefix, prefix[0] ? "." : "", parent->items[i]->key);
            consider(&s, candidate);
        }
    }
    if (!s.found) {
        char scratch[512] = "";
        consider_all_paths(&s, root, scratch, 0, sizeof scratch);
    }
    return s.found ? buf : NULL;
}

/* ---- the read API (dsarl/recipe.h) ---------------------------------------------------------------------------- */

const dsarl_node *dsarl_node_get(const dsarl_node *root, const char *path)
{
    const dsarl_node *node = root;
    const char *p = path;
    if (!node || !path)
        return NULL;
    while (*p) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        const dsarl_node *next = NULL;
        if (node->type == DSARL_NODE_MAP) {
            for (size_t i = 0; i < node->count; i++)
                if (strlen(node->items[i]->key) == len && memcmp(node->items[i]->key, p, len) == 0)
                    next = node->items[i];
        } else if (node->type == DSARL_NODE_LIST && len > 0) {
            size_t index = 0;
            bool digits = true;
            for (size_t i = 0; i < len; i++) {
                if (!is_digit(p[i]) || index > 100000000) {
                    digits = false;
                    break;
                }
                index = index * 10 + (size_t)(p[i] - '0');
            }
            if (digits && index < node->count)
                next = node->items[index];
        }
        if (!next)
            return NULL;
        node = next;
        p += len;
        if (*p == '.')
            p++;
    }
    return node;
}

dsarl_node_type dsarl_node_kind(const dsarl_node *node)
{
    return node ? node->type : DSARL_NODE_NULL;
}

const char *dsarl_node_type_name(dsarl_node_type type)
{
    switch (type) {
    case DSARL_NODE_NULL: return "null";
    case DSARL_NODE_BOOL: return "bool";
    case DSARL_NODE_INT: return "int";
    case DSARL_NODE_FLOAT: return "float";
    case DSARL_NODE_STRING: return "string";
    case DSARL_NODE_LIST: return "list";
    case DSARL_NODE_MAP: return "map";
    }
    return "unknown";
}

const dsarl_origin *dsarl_node_origin(const dsarl_node *node)
{
    return node ? &node->origin : NULL;
}

const char *dsarl_node_where(const dsarl_node *node, char *buf, size_t size)
{
    if (!buf || size == 0)
        return "";
    if (!node) {
        snprintf(buf, size, "(nowhere)");
        return buf;
    }
    const dsarl_origin *o = &node->origin;
    switch (o->kind) {
    case DSARL_ORIGIN_FILE: snprintf(buf, size, "%s:%d:%d", o->file ? o->file : "?", o->line, o->column); break;
    case DSARL_ORIGIN_COMMAND_LINE:
        snprintf(buf, size, "command line argument %d '%s'", o->index, o->text ? o->text : "");
        break;
    case DSARL_ORIGIN_DEFAULT: snprintf(buf, size, "default of %s", o->text ? o->text : "?"); break;
    case DSARL_ORIGIN_BUILTIN:
    default: snprintf(buf, size, "built in%s%s", o->text ? " " : "", o->text ? o->text : ""); break;
    }
    return buf;
}

const char *dsarl_node_path(const dsarl_node *node, char *buf, size_t size)
{
    if (!buf || size == 0)
        return "";
    buf[0] = '\0';
    // Collect the chain up to the root, then print it top-down.
    const dsarl_node *chain[4 * DSARL_RECIPE_MAX_DEPTH];
    size_t depth = 0;
    for (const dsarl_node *n = node; n && n->parent && depth < sizeof chain / sizeof chain[0]; n = n->parent)
        chain[depth++] = n;
    size_t len = 0;
    for (size_t k = depth; k-- > 0;) {
        const dsarl_node *n = chain[k];
        int written;
        if (n->key) {
            written = snprintf(buf + len, size - len, "%s%s", len ? "." : "", n->key);
        } else {
            size_t index = 0;
            while (index < n->parent->count && n->parent->items[index] != n)
                index++;
            written = snprintf(buf + len, size - len, "%s%zu", len ? "." : "", index);
        }
        if (written < 0 || (size_t)written >= size - len)
            break;
        len += (size_t)written;
    }
    return buf;
}

size_t dsarl_node_count(const dsarl_node *node)
{
    return (node && (node->type == DSARL_NODE_MAP || node->type == DSARL_NODE_LIST)) ? node->count : 0;
}

const char *dsarl_node_key_at(const dsarl_node *node, size_t i)
{
    return (node && node->type == DSARL_NODE_MAP && i < node->count) ? node->items[i]->key : NULL;
}

const dsarl_node *dsarl_node_child_at(const dsarl_node *node, size_t i)
{
    return (node && (node->type == DSARL_NODE_MAP || node->type == DSARL_NODE_LIST) && i < node->count)
               ? node->items[i]
               : NULL;
}

bool dsarl_node_as_bool(const dsarl_node *node)
{
    return node && node->type == DSARL_NODE_BOOL && node->bool_value;
}

int64_t dsarl_node_as_int(const dsarl_node *node)
{
    return (node && node->type == DSARL_NODE_INT) ? node->int_value : 0;
}

double dsarl_node_as_double(const dsarl_node *node)
{
    if (!node)
        return 0.0;
    if (node->type == DSARL_NODE_FLOAT)
        return node->float_value;
    if (node->type == DSARL_NODE_INT)
        return (double)node->int_value;
    return 0.0;
}

const char *dsarl_node_text(const dsarl_node *node)
{
    return node ? node->text : NULL;
}

/* ---- typed lookups ------------------------------------------------------------------------------------------- */

/* The node at path when it has one of the wanted types; DSARL_E_NOT_FOUND (absent/null) or a type error. */
static int lookup(const dsarl_node *root, const char *path, dsarl_node_type want, dsarl_node_type also,
                  const char *want_name, const dsarl_node **out, dsarl_error *err)
{
    const dsarl_node *node = dsarl_node_get(root, path);
    *out = node;
    if (!node || node->type == DSARL_NODE_NULL) {
        char where[512];
        if (node)
            return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s: recipe key %s is null but a %s is required",
                              dsarl_node_where(node, where, sizeof where), path, want_name);
        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "recipe key %s is missing; a %s is required", path, want_name);
    }
    if (node->type != want && node->type != also) {
        char where[512];
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: recipe key %s must be a %s, got %s '%s'",
                          dsarl_node_where(node, where, sizeof where), path, want_name,
                          dsarl_node_type_name(node->type), node->text ? node->text : "...");
    }
    return DSARL_OK;
}

int dsarl_recipe_bool(const dsarl_node *root, const char *path, bool *out, dsarl_error *err)
{
    const dsarl_node *node;
    DSARL_TRY(lookup(root, path, DSARL_NODE_BOOL, DSARL_NODE_BOOL, "bool (true or false)", &node, err));
    *out = node->bool_value;
    return DSARL_OK;
}

int dsarl_recipe_int(const dsarl_node *root, const char *path, int64_t *out, dsarl_error *err)
{
    const dsarl_node *node;
    DSARL_TRY(lookup(root, path, DSARL_NODE_INT, DSARL_NODE_INT, "int", &node, err));
    *out = node->int_value;
    return DSARL_OK;
}

int dsarl_recipe_double(const dsarl_node *root, const char *path, double *out, dsarl_error *err)
{
    const dsarl_node *node;
    DSARL_TRY(lookup(root, path, DSARL_NODE_FLOAT, DSARL_NODE_INT, "number", &node, err));
    *out = dsarl_node_as_double(node);
    return DSARL_OK;
}

int dsarl_recipe_string(const dsarl_node *root, const char *path, const char **out, dsarl_error *err)
{
    const dsarl_node *node;
    DSARL_TRY(lookup(root, path, DSARL_NODE_STRING, DSARL_NODE_STRING, "string", &node, err));
    *out = node->text;
    return DSARL_OK;
}

/* The *_or forms: absent or null gives the default, anything else goes through the strict lookup. */
static bool absent_or_null(const dsarl_node *root, const char *path)
{
    const dsarl_node *node = dsarl_node_get(root, path);
    return !node || node->type == DSARL_NODE_NULL;
}

int dsarl_recipe_bool_or(const dsarl_node *root, const char *path, bool def, bool *out, dsarl_error *err)
{
    if (absent_or_null(root, path)) {
        *out = def;
        return DSARL_OK;
    }
    return dsarl_recipe_bool(root, path, out, err);
}

int dsarl_recipe_int_or(const dsarl_node *root, const char *path, int64_t def, int64_t *out, dsarl_error *err)
{
    if (absent_or_null(root, path)) {
        *out = def;
        return DSARL_OK;
    }
    return dsarl_recipe_int(root, path, out, err);
}

int dsarl_recipe_double_or(const dsarl_node *root, const char *path, double def, double *out, dsarl_error *err)
{
    if (absent_or_null(root, path)) {
        *out = def;
        return DSARL_OK;
    }
    return dsarl_recipe_double(root, path, out, err);
}

int dsarl_recipe_string_or(const dsarl_node *root, const char *path, const char *def, const char **out,
                           dsarl_error *err)
{
    if (absent_or_null(root, path)) {
        *out = def;
        return DSARL_OK;
    }
    return dsarl_recipe_string(root, path, out, err);
}

int dsarl_recipe_fail(const dsarl_node *root, const char *path, dsarl_error *err, int code, const char *fmt, ...)
{
    char message[DSARL_ERROR_MESSAGE_MAX];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    const dsarl_node *node = dsarl_node_get(root, path);
    char where[512];
    if (!node)
        return DSARL_FAIL(err, code, "recipe key %s %s", path, message);
    return DSARL_FAIL(err, code, "%s: recipe key %s %s", dsarl_node_where(node, where, sizeof where), path, message);
}
