/* recipe_override.c: Hydra command-line overrides (`a.b=v`, `+a.b=v`, `++a.b=v`, `~a.b[=v]`) and plugin defaults.
 *
 * As in Hydra's struct mode, a plain `a.b=v` may only change a key that exists, so a typo fails with "did you mean"
 * instead of silently adding a key nobody reads. Values are applied as Hydra does (OmegaConf.update with
 * merge=True): a map value merges into an existing map, anything else replaces. */
#include "recipe_internal.h"

#include <stdlib.h>
#include <string.h>

typedef enum override_op { OVERRIDE_SET, OVERRIDE_ADD, OVERRIDE_FORCE, OVERRIDE_DELETE } override_op;

/* Splits a dotted path into its segments (in place in a copy); returns the count or -1 for an empty segment. */
static int split_path(char *path, char **segments, int max)
{
    int n = 0;
    char *p = path;
    for (;;) {
        char *dot = strchr(p, '.');
        if (dot)
            *dot = '\0';
        if (!*p || n == max)
            return -1;
        segments[n++] = p;
        if (!dot)
            return n;
        p = dot + 1;
    }
}

/* The child of node named by one path segment (map key or list index), or NULL. */
static dsarl_node *child_named(dsarl_node *node, const char *segment)
{
    return (dsarl_node *)dsarl_node_get(node, segment);
}

/* Parses the value part of an override. Hydra reads `a.b=` as the empty string, and a whole `${...}` stays an
 * interpolation even when it holds ": " (which YAML would read as a map). */
static int parse_override_value(const char *text, const dsarl_origin *origin, dsarl_node **out, dsarl_error *err)
{
    size_t len = strlen(text);
    if (len == 0 || (len >= 3 && text[0] == '$' && text[1] == '{' && text[len - 1] == '}')) {
        *out = recipe_scalar_string(text, origin);
        return *out ? DSARL_OK : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
    }
    return recipe_parse_value(text, origin, out, err);
}

/* Appends " ; did you mean 'x'?" to a message buffer when a near key exists. */
static void did_you_mean(const dsarl_node *root, const char *path, char *buf, size_t size)
{
    char suggestion[512];
    buf[0] = '\0';
    if (recipe_suggest_path(root, path, suggestion, sizeof suggestion))
        snprintf(buf, size, "; did you mean '%s'?", suggestion);
}

static int apply(dsarl_recipe *r, override_op op, const char *key, const char *value_text,
                 const dsarl_origin *origin, dsarl_error *err)
{
    char hint[600];
    char where[512];
    dsarl_node *existing = (dsarl_node *)dsarl_node_get(r->root, key);

    if (op == OVERRIDE_SET || op == OVERRIDE_DELETE) {
        if (!existing) {
            did_you_mean(r->root, key, hint, sizeof hint);
            if (op == OVERRIDE_DELETE)
                return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "cannot delete '%s': no such key in the recipe%s", key,
                                  hint);
            return DSARL_FAIL(err, DSARL_E_NOT_FOUND,
                              "key '%s' is not in the recipe%s (use +%s=... to add a new key)", key, hint, key);
        }
    }
    if (op == OVERRIDE_DELETE) {
        if (value_text) {
            dsarl_node *expected = NULL;
            DSARL_TRY(parse_override_value(value_text, origin, &expected, err));
            bool same = dsarl_node_equal(existing, expected);
            recipe_node_free(expected);
            if (!same)
                return DSARL_FAIL(err, DSARL_E_INVALID, "not deleting '%s': its value is '%s' (from %s), not '%s'",
                                  key, existing->text ? existing->text : dsarl_node_type_name(existing->type),
                                  dsarl_node_where(existing, where, sizeof where), value_text);
        }
        dsarl_node *parent = existing->parent;
        size_t i = 0;
        while (parent->items[i] != existing)
            i++;
        recipe_node_remove_at(parent, i);
        return DSARL_OK;
    }
    dsarl_node *value = NULL;
    DSARL_TRY(parse_override_value(value_text, origin, &value, err));
    // Hydra lets `+` through when the key holds null or when the value is a map or list (it merges then).
    if (op == OVERRIDE_ADD && existing && existing->type != DSARL_NODE_NULL && value->type != DSARL_NODE_MAP &&
        value->type != DSARL_NODE_LIST) {
        recipe_node_free(value);
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "key '%s' already exists (set at %s); use %s=... to change it or ++%s=... for either", key,
                          dsarl_node_where(existing, where, sizeof where), key, key);
    }
    // Hydra applies overrides with OmegaConf.update(merge=True): a map value merges into an existing map.
    if (existing && existing->type == DSARL_NODE_MAP && value->type == DSARL_NODE_MAP)
        return recipe_merge_maps(existing, value) < 0 ? DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory") : DSARL_OK;
    if (existing) {
        dsarl_node *parent = existing->parent;
        size_t i = 0;
        while (parent->items[i] != existing)
            i++;
        recipe_node_replace_at(parent, i, value);
        return DSARL_OK;
    }
    // +/++ on a new key: walk down, creating the maps that are missing.
    char *copy = strdup(key);
    char *segments[DSARL_RECIPE_MAX_DEPTH];
    int n = copy ? split_path(copy, segments, DSARL_RECIPE_MAX_DEPTH) : -1;
    int rc = DSARL_OK;
    dsarl_node *node = r->root;
    for (int k = 0; k < n - 1 && rc == DSARL_OK; k++) {
        dsarl_node *next = child_named(node, segments[k]);
        if (!next) {
            if (!(next = recipe_node_new(DSARL_NODE_MAP, origin)) ||
                recipe_node_append(node, segments[k], next) < 0) {
                recipe_node_free(next);
                rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
            }
        } else if (next->type != DSARL_NODE_MAP) {
            char path[512];
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "cannot add '%s': '%s' is a %s (from %s), not a map", key,
                            dsarl_node_path(next, path, sizeof path), dsarl_node_type_name(next->type),
                            dsarl_node_where(next, where, sizeof where));
        }
        node = next;
    }
    if (n <= 0)
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "'%s' is not a dotted key", key);
    if (rc == DSARL_OK && node->type != DSARL_NODE_MAP)
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "cannot add '%s': its parent is a %s, not a map", key,
                        dsarl_node_type_name(node->type));
    if (rc == DSARL_OK && recipe_node_append(node, segments[n - 1], value) < 0)
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
    else if (rc == DSARL_OK)
        value = NULL;
    recipe_node_free(value);
    free(copy);
    return rc;
}

/* Checks that key is a dotted path with no empty segment and no blank. */
static bool valid_key(const char *key, size_t len)
{
    if (len == 0 || key[0] == '.' || key[len - 1] == '.')
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = key[i];
        if (c == ' ' || c == '\t' || c == '\n' || (c == '.' && key[i + 1] == '.') || c == '~' || c == '+')
            return false;
    }
    return true;
}

int dsarl_recipe_override(dsarl_recipe *r, const char *arg, int index, dsarl_error *err)
{
    const char *p = arg;
    override_op op = OVERRIDE_SET;
    if (p[0] == '~')
        op = OVERRIDE_DELETE, p++;
    else if (p[0] == '+' && p[1] == '+')
        op = OVERRIDE_FORCE, p += 2;
    else if (p[0] == '+')
        op = OVERRIDE_ADD, p++;
    const char *eq = strchr(p, '=');
    size_t key_len = eq ? (size_t)(eq - p) : strlen(p);
    dsarl_origin origin = {.kind = DSARL_ORIGIN_COMMAND_LINE, .text = arg, .index = index};
    if (!eq && op != OVERRIDE_DELETE)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "command line argument %d '%s': expected key=value (or +key=value, ++key=value, ~key)",
                          index, arg);
    if (!valid_key(p, key_len))
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "command line argument %d '%s': '%.*s' is not a dotted key such as policy.precision", index,
                          arg, (int)key_len, p);
    char *key = strndup(p, key_len);
    if (!key)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
    int rc = apply(r, op, key, eq ? eq + 1 : NULL, &origin, err);
    free(key);
    if (rc < 0 && rc != DSARL_E_NOMEM)
        dsarl_error_prefix(err, "command line argument %d '%s'", index, arg);
    return rc;
}

int dsarl_recipe_set_default(dsarl_recipe *r, const char *path, const char *flow_yaml, const char *origin_text,
                             dsarl_error *err)
{
    dsarl_origin origin = {.kind = DSARL_ORIGIN_DEFAULT, .text = origin_text};
    char *copy = strdup(path);
    char *segments[DSARL_RECIPE_MAX_DEPTH];
    int n = copy ? split_path(copy, segments, DSARL_RECIPE_MAX_DEPTH) : -1;
    if (n < 0) {
        free(copy);
        return DSARL_FAIL(err, DSARL_E_INVALID, "default of %s: '%s' is not a dotted key", origin_text, path);
    }
    dsarl_node *node = r->root;
    int k = 0;
    for (; k < n; k++) {
        dsarl_node *next = child_named(node, segments[k]);
        if (!next)
            break;
        node = next;
    }
    // Present, or below a value that is not a map (e.g. `optimizer: null`): the recipe's word stands.
    if (k == n || node->type != DSARL_NODE_MAP) {
        free(copy);
        return DSARL_OK;
    }
    dsarl_node *value = NULL;
    int rc = recipe_parse_value(flow_yaml, &origin, &value, err);
    if (rc < 0) {
        free(copy);
        return dsarl_error_prefix(err, "default of %s for %s", origin_text, path);
    }
    // Build the missing chain off to the side, then hang it in one step.
    dsarl_node *top = value;
    for (int j = n - 1; j > k && rc == DSARL_OK; j--) {
        dsarl_node *map = recipe_node_new(DSARL_NODE_MAP, &origin);
        if (!map || recipe_node_append(map, segments[j], top) < 0) {
            recipe_node_free(map);
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
            break;
        }
        top = map;
    }
    if (rc == DSARL_OK && recipe_node_append(node, segments[k], top) < 0)
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
    if (rc < 0)
        recipe_node_free(top);
    free(copy);
    return rc;
}
