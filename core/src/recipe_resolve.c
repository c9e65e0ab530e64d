/* recipe_resolve.c: OmegaConf interpolation, after the command line (so overriding a source key updates every
 * value derived from it, as in NeMo RL).
 *
 *   ${a.b}        absolute path from the root        ${.x}   sibling in the same map     ${..x}  one map up
 *   ${mul:a,b}    NeMo RL's resolvers: add, mul (ints stay ints), div (always a float, as Python's /), max
 *
 * A value that is exactly one interpolation takes the target's type (maps and lists are deep-copied); anything
 * longer is a string. Each node is resolved once, in place; a node being resolved is marked so a reference back
 * to it is reported as a cycle with the whole chain. */
#include "recipe_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RESOLVE_CHAIN 256

typedef struct resolver {
    dsarl_node *root;
    /* what interpolation has made so far (copied nodes, text bytes), against one budget: a few lines that refer to
     * each other can otherwise expand to gigabytes */
    size_t nodes_made, bytes_made;
    dsarl_node *stack[MAX_RESOLVE_CHAIN]; /* nodes being resolved, outermost first (for cycle chains) */
    size_t depth;
    dsarl_error *err;
} resolver;

static int resolve_node(resolver *rs, dsarl_node *node);
static int evaluate_text(resolver *rs, dsarl_node *node, const char *text, size_t len, dsarl_node **out);

static const char *where_of(const dsarl_node *node, char *buf, size_t size)
{
    return dsarl_node_where(node, buf, size);
}

/* Counts what copying node would make into *nodes and *bytes, stopping once either passes its limit. */
static void tally(const dsarl_node *node, size_t *nodes, size_t *bytes)
{
    if (*nodes > DSARL_RECIPE_MAX_NODES || *bytes > DSARL_RECIPE_MAX_TEXT_BYTES)
        return;
    (*nodes)++;
    if (node->text)
        *bytes += strlen(node->text);
    for (size_t i = 0; i < node->count; i++)
        tally(node->items[i], nodes, bytes);
}

static int over_budget(resolver *rs, const dsarl_node *node)
{
    if (rs->nodes_made <= DSARL_RECIPE_MAX_NODES && rs->bytes_made <= DSARL_RECIPE_MAX_TEXT_BYTES)
        return DSARL_OK;
    char where[512];
    return DSARL_FAIL(rs->err, DSARL_E_INVALID, "%s: interpolation expands the recipe past %d nodes or %d MiB of text "
                      "(values that copy each other many times over?)", where_of(node, where, sizeof where),
                      DSARL_RECIPE_MAX_NODES, DSARL_RECIPE_MAX_TEXT_BYTES >> 20);
}

/* Index just past the '}' that closes the "${" at text[start], or 0 when it is not closed. */
static size_t matching_close(const char *text, size_t len, size_t start)
{
    int open = 0;
    for (size_t i = start; i < len; i++) {
        if (text[i] == '$' && i + 1 < len && text[i + 1] == '{') {
            open++;
            i++;
        } else if (text[i] == '}') {
            if (--open == 0)
                return i + 1;
        }
    }
    return 0;
}

static void trim(const char **text, size_t *len)
{
    while (*len && (**text == ' ' || **text == '\t' || **text == '\n'))
        (*text)++, (*len)--;
    while (*len && ((*text)[*len - 1] == ' ' || (*text)[*len - 1] == '\t' || (*text)[*len - 1] == '\n'))
        (*len)--;
}

/* Text of a scalar as Python's str() would put it into a longer string. */
static int scalar_to_text(resolver *rs, dsarl_node *node, const dsarl_node *value, const char *expr, size_t expr_len,
                          const char **out)
{
    char where[512];
    switch (value->type) {
    case DSARL_NODE_NULL: *out = "None"; return DSARL_OK;
    case DSARL_NODE_BOOL: *out = value->bool_value ? "True" : "False"; return DSARL_OK;
    case DSARL_NODE_INT:
    case DSARL_NODE_FLOAT:
    case DSARL_NODE_STRING: *out = value->text; return DSARL_OK;
    default:
        return DSARL_FAIL(rs->err, DSARL_E_INVALID, "%s: '%.*s' is a %s and cannot be embedded in a longer string",
                          where_of(node, where, sizeof where), (int)expr_len, expr,
                          dsarl_node_type_name(value->type));
    }
}

/* A cycle: the chain from the first occurrence of target on the stack back to target. */
static int cycle_error(resolver *rs, dsarl_node *node, const dsarl_node *target)
{
    char chain[DSARL_ERROR_MESSAGE_MAX] = "";
    char path[512], where[512];
    size_t len = 0, first = 0;
    while (first < rs->depth && rs->stack[first] != target)
        first++;
    for (size_t i = first; i < rs->depth && len < sizeof chain; i++)
        len += (size_t)snprintf(chain + len, sizeof chain - len, "%s -> ",
                                dsarl_node_path(rs->stack[i], path, sizeof path));
    if (len < sizeof chain)
        snprintf(chain + len, sizeof chain - len, "%s", dsarl_node_path(target, path, sizeof path));
    return DSARL_FAIL(rs->err, DSARL_E_INVALID, "%s: interpolation cycle: %s", where_of(node, where, sizeof where),
                      chain);
}

/* ${path}: finds the target (absolute, or relative with leading dots), resolves it, and returns a copy. */
static int evaluate_reference(resolver *rs, dsarl_node *node, const char *ref, size_t len, dsarl_node **out)
{
    char where[512], path[512], hint[600] = "";
    const dsarl_node *base = rs->root;
    size_t dots = 0;
    while (dots < len && ref[dots] == '.')
        dots++;
    if (dots > 0) {
        // ${.x} is a sibling: start at the map that holds node; every further dot climbs one map.
        base = node->parent;
        for (size_t i = 1; i < dots && base; i++)
            base = base->parent;
        if (!base)
            return DSARL_FAIL(rs->err, DSARL_E_INVALID, "%s: '${%.*s}' climbs above the top of the recipe",
                              where_of(node, where, sizeof where), (int)len, ref);
    }
    char *rest = strndup(ref + dots, len - dots);
    if (!rest)
        return DSARL_FAIL(rs->err, DSARL_E_NOMEM, "out of memory");
    dsarl_node *target = (dsarl_node *)(rest[0] ? dsarl_node_get(base, rest) : base);
    if (!target) {
        char full[1024];
        if (base != rs->root) {
            dsarl_node_path(base, path, sizeof path);
            snprintf(full, sizeof full, "%s%s%s", path, path[0] ? "." : "", rest);
        } else {
            snprintf(full, sizeof full, "%s", rest);
        }
        char suggestion[512];
        if (recipe_suggest_path(rs->root, full, suggestion, sizeof suggestion))
            snprintf(hint, sizeof hint, "; did you mean '%s'?", suggestion);
        free(rest);
        return DSARL_FAIL(rs->err, DSARL_E_NOT_FOUND, "%s: interpolation '${%.*s}' refers to '%s', which is not in "
                          "the recipe%s", where_of(node, where, sizeof where), (int)len, ref, full, hint);
    }
    free(rest);
    if (target->resolve_state == 1)
        return cycle_error(rs, node, target);
    DSARL_TRY(resolve_node(rs, target));
    if (target->type == DSARL_NODE_STRING && strcmp(target->text, "???") == 0) {
        char target_where[512];
        return DSARL_FAIL(rs->err, DSARL_E_INVALID,
                          "%s: interpolation '${%.*s}': mandatory value missing at %s (??? at %s); set it in the "
                          "recipe or on the command line",
                          where_of(node, where, sizeof where), (int)len, ref, dsarl_node_path(target, path, sizeof path),
                          where_of(target, target_where, sizeof target_where));
    }
    tally(target, &rs->nodes_made, &rs->bytes_made);
    DSARL_TRY(over_budget(rs, node));
    if (!(*out = recipe_node_copy(target)))
        return DSARL_FAIL(rs->err, DSARL_E_NOMEM, "out of memory");
    return DSARL_OK;
}

/* One resolver argument: a nested interpolation, a quoted string, or a plain scalar. */
static int evaluate_argument(resolver *rs, dsarl_node *node, const char *arg, size_t len, dsarl_node **out)
{
    trim(&arg, &len);
    if (len >= 2 && (arg[0] == '\'' || arg[0] == '"') && arg[len - 1] == arg[0]) {
        char *s = strndup(arg + 1, len - 2);
        *out = s ? recipe_scalar_string(s, &node->origin) : NULL;
        free(s);
        return *out ? DSARL_OK : DSARL_FAIL(rs->err, DSARL_E_NOMEM, "out of memory");
    }
    if (memchr(arg, '$', len))
        return evaluate_text(rs, node, arg, len, out);
    int rc = recipe_scalar_from_plain(arg, len, &node->origin, out, rs->err);
    if (rc < 0 && rc != DSARL_E_NOMEM) {
        char where[512];
        dsarl_error_prefix(rs->err, "%s", where_of(node, where, sizeof where));
    }
    return rc;
}

static bool is_number(const dsarl_node *n)
{
    return n->type == DSARL_NODE_INT || n->type == DSARL_NODE_FLOAT;
}

/* ${name:args}: NeMo RL's registered resolvers. */
static int evaluate_resolver(resolver *rs, dsarl_node *node, const char *name, size_t name_len, const char *args,
                             size_t args_len, dsarl_node **out)
{
    char where[512];
    enum { ADD, MUL, DIV, MAX } op;
    if (name_len == 3 && memcmp(name, "add", 3) == 0)
        op = ADD;
    else if (name_len == 3 && memcmp(name, "mul", 3) == 0)
        op = MUL;
    else if (name_len == 3 && memcmp(name, "div", 3) == 0)
        op = DIV;
    else if (name_len == 3 && memcmp(name, "max", 3) == 0)
        op = MAX;
    else
        return DSARL_FAIL(rs->err, DSARL_E_INVALID, "%s: unknown resolver '%.*s'; known resolvers: add, mul, div, max",
                          where_of(node, where, sizeof where), (int)name_len, name);

    // Split at top-level commas (not inside a nested ${...}).
    dsarl_node *values[16];
    size_t n = 0;
    int rc = DSARL_OK;
    size_t start = 0, nesting = 0;
    for (size_t i = 0; i <= args_len && rc == DSARL_OK; i++) {
        if (i < args_len && args[i] == '$' && i + 1 < args_len && args[i + 1] == '{') {
            nesting++;
            i++;
            continue;
        }
        if (i < args_len && args[i] == '}' && nesting) {
            nesting--;
            continue;
        }
        if (i == args_len || (args[i] == ',' && nesting == 0)) {
            if (n == sizeof values / sizeof values[0]) {
                rc = DSARL_FAIL(rs->err, DSARL_E_INVALID, "%s: resolver '%.*s' takes at most 16 arguments",
                                where_of(node, where, sizeof where), (int)name_len, name);
                break;
            }
            rc = evaluate_argument(rs, node, args + start, i - start, &values[n]);
            if (rc == DSARL_OK)
                n++;
            start = i + 1;
        }
    }
    for (size_t i = 0; i < n && rc == DSARL_OK; i++)
        if (!is_number(values[i]))
            rc = DSARL_FAIL(rs->err, DSARL_E_INVALID, "%s: argument %zu of '%.*s' is a %s '%s', not a number",
                            where_of(node, where, sizeof where), i + 1, (int)name_len, name,
                            dsarl_node_type_name(values[i]->type), values[i]->text ? values[i]->text : "");
    if (rc == DSARL_OK && (op == DIV ? n != 2 : n < 1))
        rc = DSARL_FAIL(rs->err, DSARL_E_INVALID, "%s: resolver '%.*s' takes %s, got %zu",
                        where_of(node, where, sizeof where), (int)name_len, name,
                        op == DIV ? "exactly 2 arguments" : "at least 1 argument", n);
    if (rc == DSARL_OK) {
        bool all_int = true;
        for (size_t i = 0; i < n; i++)
            all_int = all_int && values[i]->type == DSARL_NODE_INT;
        *out = NULL;
        if (op == MAX) {
            // Python's max keeps the first largest argument, with its type.
            size_t best = 0;
            for (size_t i = 1; i < n; i++)
                if (dsarl_node_as_double(values[i]) > dsarl_node_as_double(values[best]))
                    best = i;
            *out = values[best]->type == DSARL_NODE_INT ? recipe_scalar_int(values[best]->int_value, &node->origin)
                                                         : recipe_scalar_float(values[best]->float_value, &node->origin);
        } else if (op == DIV) {
            double b = dsarl_node_as_double(values[1]);
            if (b == 0.0)
                rc = DSARL_FAIL(rs->err, DSARL_E_INVALID, "%s: division by zero in '${div:...}'",
                                where_of(node, where, sizeof where));
            else
                *out = recipe_scalar_float(dsarl_node_as_double(values[0]) / b, &node->origin);
        } else if (all_int) {
            int64_t acc = values[0]->int_value;
            for (size_t i = 1; i < n && rc == DSARL_OK; i++) {
                bool overflow = op == ADD ? __builtin_add_overflow(acc, values[i]->int_value, &acc)
                                          : __builtin_mul_overflow(acc, values[i]->int_value, &acc);
                if (overflow)
                    rc = DSARL_FAIL(rs->err, DSARL_E_INVALID, "%s: integer overflow in '${%.*s:...}'",
                                    where_of(node, where, sizeof where), (int)name_len, name);
            }
            if (rc == DSARL_OK)
                *out = recipe_scalar_int(acc, &node->origin);
        } else {
            double acc = dsarl_node_as_double(values[0]);
            for (size_t i = 1; i < n; i++)
                acc = op == ADD ? acc + dsarl_node_as_double(values[i]) : acc * dsarl_node_as_double(values[i]);
            *out = recipe_scalar_float(acc, &node->origin);
        }
        if (rc == DSARL_OK && !*out)
            rc = DSARL_FAIL(rs->err, DSARL_E_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        recipe_node_free(values[i]);
    return rc;
}

/* The inside of one ${...}: a resolver call when a name and ':' come first, else a reference. */
static int evaluate_interpolation(resolver *rs, dsarl_node *node, const char *inner, size_t len, dsarl_node **out)
{
    trim(&inner, &len);
    size_t i = 0;
    while (i < len && (inner[i] == '_' || inner[i] == '.' || (inner[i] >= 'a' && inner[i] <= 'z') ||
                       (inner[i] >= 'A' && inner[i] <= 'Z') || (i > 0 && inner[i] >= '0' && inner[i] <= '9')))
        i++;
    if (i > 0 && i < len && inner[i] == ':' && inner[0] != '.')
        return evaluate_resolver(rs, node, inner, i, inner + i + 1, len - i - 1, out);
    if (len == 0 || memchr(inner, '$', len) || memchr(inner, ':', len)) {
        char where[512];
        return DSARL_FAIL(rs->err, DSARL_E_INVALID, "%s: '${%.*s}' is not a key path (a.b, .x) or a resolver call "
                          "(mul:a,b)", where_of(node, where, sizeof where), (int)len, inner);
    }
    return evaluate_reference(rs, node, inner, len, out);
}

/* A string with interpolations: exactly one ${...} keeps its type, anything longer becomes a string. */
static int evaluate_text(resolver *rs, dsarl_node *node, const char *text, size_t len, dsarl_node **out)
{
    char where[512];
    if (len >= 3 && text[0] == '$' && text[1] == '{' && matching_close(text, len, 0) == len)
        return evaluate_interpolation(rs, node, text + 2, len - 3, out);
    size_t cap = len + 64, used = 0;
    char *buf = malloc(cap);
    if (!buf)
        return DSARL_FAIL(rs->err, DSARL_E_NOMEM, "out of memory");
    int rc = DSARL_OK;
    for (size_t i = 0; i < len && rc == DSARL_OK;) {
        const char *piece = text + i;
        size_t piece_len = 1;
        size_t next = i + 1;
        dsarl_node *value = NULL;
        if (text[i] == '\\' && i + 2 < len && text[i + 1] == '$' && text[i + 2] == '{') {
            piece = "${"; // an escaped \${ is literal text
            piece_len = 2;
            next = i + 3;
        } else if (text[i] == '$' && i + 1 < len && text[i + 1] == '{') {
            size_t close = matching_close(text, len, i);
            if (!close) {
                rc = DSARL_FAIL(rs->err, DSARL_E_INVALID, "%s: '${' without a closing '}' in '%.*s'",
                                where_of(node, where, sizeof where), (int)len, text);
                break;
            }
            if ((rc = evaluate_interpolation(rs, node, text + i + 2, close - i - 3, &value)) < 0)
                break;
            rc = scalar_to_text(rs, node, value, text + i, close - i, &piece);
            piece_len = rc == DSARL_OK ? strlen(piece) : 0;
            next = close;
        }
        rs->bytes_made += piece_len;
        if (rc == DSARL_OK)
            rc = over_budget(rs, node);
        if (rc == DSARL_OK && used + piece_len + 1 > cap) {
            cap = 2 * (used + piece_len + 1);
            char *grown = realloc(buf, cap);
            if (!grown)
                rc = DSARL_FAIL(rs->err, DSARL_E_NOMEM, "out of memory");
            else
                buf = grown;
        }
        if (rc == DSARL_OK) {
            memcpy(buf + used, piece, piece_len);
            used += piece_len;
        }
        recipe_node_free(value);
        i = next;
    }
    if (rc == DSARL_OK) {
        buf[used] = '\0';
        if (!(*out = recipe_scalar_string(buf, &node->origin)))
            rc = DSARL_FAIL(rs->err, DSARL_E_NOMEM, "out of memory");
    }
    free(buf);
    return rc;
}

static int resolve_node(resolver *rs, dsarl_node *node)
{
    if (node->resolve_state == 2)
        return DSARL_OK;
    bool interpolated = node->type == DSARL_NODE_STRING && strstr(node->text, "${");
    bool container = node->type == DSARL_NODE_MAP || node->type == DSARL_NODE_LIST;
    if (!interpolated && !container) {
        node->resolve_state = 2;
        return DSARL_OK;
    }
    if (rs->depth == MAX_RESOLVE_CHAIN) {
        char where[512];
        return DSARL_FAIL(rs->err, DSARL_E_INVALID, "%s: interpolations chain through more than %d values",
                          where_of(node, where, sizeof where), MAX_RESOLVE_CHAIN);
    }
    node->resolve_state = 1;
    rs->stack[rs->depth++] = node;
    int rc = DSARL_OK;
    if (interpolated) {
        dsarl_node *value = NULL;
        rc = evaluate_text(rs, node, node->text, strlen(node->text), &value);
        if (rc == DSARL_OK) {
            // The value keeps the place it was written: config show names the line with the ${...}.
            recipe_node_take_value(node, value);
            for (size_t i = 0; i < node->count && rc == DSARL_OK; i++)
                rc = recipe_node_set_origin_deep(node->items[i], &node->origin);
        }
    } else {
        for (size_t i = 0; i < node->count && rc == DSARL_OK; i++)
            rc = resolve_node(rs, node->items[i]);
    }
    rs->depth--;
    node->resolve_state = rc == DSARL_OK ? 2 : 0;
    return rc;
}

int dsarl_recipe_resolve(dsarl_recipe *r, dsarl_error *err)
{
    resolver *rs = calloc(1, sizeof *rs);
    if (!rs)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
    rs->root = r->root;
    rs->err = err;
    int rc = resolve_node(rs, r->root);
    free(rs);
    return rc;
}
