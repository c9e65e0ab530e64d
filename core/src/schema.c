/* schema.c: recipe validation against the selected plugins' declared keys (rules in schema.h). */
#include "schema.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SEGMENTS DSARL_RECIPE_MAX_DEPTH

/* One declared key, split into its path segments. */
typedef struct spec_ref {
    const dsarl_key_spec *spec;
    const char *owner;
    char *storage;                 /* the path copy the segments point into */
    const char *segments[MAX_SEGMENTS];
    int n_segments;
} spec_ref;

typedef struct validator {
    dsarl_recipe *recipe;
    spec_ref *specs;
    size_t n_specs;
    dsarl_schema_report *report;
    bool collect;                  /* check-only: problems go to the report instead of stopping */
    dsarl_error *err;
    const char *segments[4 * MAX_SEGMENTS]; /* path of the node being checked */
    char index_text[4 * MAX_SEGMENTS][24];   /* list indices as text */
} validator;

void dsarl_schema_report_init(dsarl_schema_report *report)
{
    memset(report, 0, sizeof *report);
}

static void free_entries(dsarl_schema_entry *entries, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(entries[i].path);
        free(entries[i].where);
        free(entries[i].detail);
    }
    free(entries);
}

void dsarl_schema_report_free(dsarl_schema_report *report)
{
    if (!report)
        return;
    free_entries(report->unused, report->n_unused);
    free_entries(report->problems, report->n_problems);
    dsarl_schema_report_init(report);
}

static int add_entry(dsarl_schema_entry **entries, size_t *n, const dsarl_node *node, const char *detail,
                     dsarl_error *err)
{
    dsarl_schema_entry *grown = realloc(*entries, (*n + 1) * sizeof *grown);
    if (!grown)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
    *entries = grown;
    char path[512], where[512];
    dsarl_schema_entry *e = &grown[*n];
    e->path = strdup(dsarl_node_path(node, path, sizeof path));
    e->where = strdup(dsarl_node_where(node, where, sizeof where));
    e->detail = strdup(detail);
    if (!e->path || !e->where || !e->detail) {
        free(e->path);
        free(e->where);
        free(e->detail);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
    }
    (*n)++;
    return DSARL_OK;
}

/* A recipe error at node: stops validation, or is recorded when only checking. */
static int problem(validator *v, const dsarl_node *node, const char *fmt, ...) DSARL_PRINTF(3, 4);
static int problem(validator *v, const dsarl_node *node, const char *fmt, ...)
{
    char message[DSARL_ERROR_MESSAGE_MAX - 200], where[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    dsarl_node_where(node, where, sizeof where);
    if (!v->collect)
        return DSARL_FAIL(v->err, DSARL_E_INVALID, "%s: %s", where, message);
    char sentence[DSARL_ERROR_MESSAGE_MAX + 512];
    snprintf(sentence, sizeof sentence, "%s: %s", where, message);
    return add_entry(&v->report->problems, &v->report->n_problems, node, sentence, v->err);
}

static int report_unused(validator *v, const dsarl_node *node, const char *detail)
{
    if (!v->report)
        return DSARL_OK;
    return add_entry(&v->report->unused, &v->report->n_unused, node, detail, v->err);
}

/* ---- declared keys ---------------------------------------------------------------------------------------- */

static int collect_specs(validator *v, const dsarl_schema_table *tables, size_t n_tables)
{
    size_t total = 0;
    for (size_t t = 0; t < n_tables; t++)
        total += tables[t].n_keys;
    v->specs = calloc(total ? total : 1, sizeof *v->specs);
    if (!v->specs)
        return DSARL_FAIL(v->err, DSARL_E_NOMEM, "out of memory");
    for (size_t t = 0; t < n_tables; t++) {
        for (size_t k = 0; k < tables[t].n_keys; k++) {
            const dsarl_key_spec *spec = &tables[t].keys[k];
            spec_ref *ref = &v->specs[v->n_specs];
            if (!spec->path || !spec->path[0])
                return DSARL_FAIL(v->err, DSARL_E_INTERNAL, "%s declares a recipe key with an empty path (entry %zu)",
                                  tables[t].owner, k);
            if (!(ref->storage = strdup(spec->path)))
                return DSARL_FAIL(v->err, DSARL_E_NOMEM, "out of memory");
            ref->spec = spec;
            ref->owner = tables[t].owner;
            v->n_specs++;
            char *p = ref->storage;
            for (;;) {
                char *dot = strchr(p, '.');
                if (dot)
                    *dot = '\0';
                if (!*p || ref->n_segments == MAX_SEGMENTS)
                    return DSARL_FAIL(v->err, DSARL_E_INTERNAL,
                                      "%s declares the malformed recipe key '%s' (empty segment or too deep)",
                                      tables[t].owner, spec->path);
                ref->segments[ref->n_segments++] = p;
                if (!dot)
                    break;
                p = dot + 1;
            }
        }
    }
    return DSARL_OK;
}

static void free_specs(validator *v)
{
    for (size_t i = 0; i < v->n_specs; i++)
        free(v->specs[i].storage);
    free(v->specs);
}

/* Whether the first `depth` segments of the spec match the current node path. */
static bool matches_prefix(const spec_ref *ref, const char *const *segments, int depth)
{
    if (ref->n_segments < depth)
        return false;
    for (int i = 0; i < depth; i++)
        if (strcmp(ref->segments[i], "*") != 0 && strcmp(ref->segments[i], segments[i]) != 0)
            return false;
    return true;
}

/* ---- (a) defaults ------------------------------------------------------------------------------------------ */

/* Applies ref's default under every existing node that matches its segments [0, k). */
static int apply_default_below(validator *v, const spec_ref *ref, const dsarl_node *node, int k, char *path,
                               size_t len, size_t cap)
{
    if (k == ref->n_segments - 1) {
        int n = snprintf(path + len, cap - len, "%s%s", len ? "." : "", ref->segments[k]);
        if (n < 0 || (size_t)n >= cap - len)
            return DSARL_OK;
        int rc = dsarl_recipe_set_default(v->recipe, path, ref->spec->default_value, ref->owner, v->err);
        path[len] = '\0';
        return rc;
    }
    if (node->type != DSARL_NODE_MAP)
        return DSARL_OK;
    if (strcmp(ref->segments[k], "*") != 0) {
        long i = recipe_map_index(node, ref->segments[k]);
        if (i < 0) {
            // Absent parents are created by set_default unless a wildcard is still to come.
            for (int j = k + 1; j < ref->n_segments; j++)
                if (strcmp(ref->segments[j], "*") == 0)
                    return DSARL_OK;
            int n = snprintf(path + len, cap - len, "%s%s", len ? "." : "", ref->segments[k]);
            for (int j = k + 1; j < ref->n_segments && n >= 0; j++)
                n += snprintf(path + len + (size_t)n, cap - len - (size_t)n, ".%s", ref->segments[j]);
            int rc = dsarl_recipe_set_default(v->recipe, path, ref->spec->default_value, ref->owner, v->err);
            path[len] = '\0';
            return rc;
        }
        int n = snprintf(path + len, cap - len, "%s%s", len ? "." : "", ref->segments[k]);
        int rc = apply_default_below(v, ref, node->items[i], k + 1, path, len + (size_t)n, cap);
        path[len] = '\0';
        return rc;
    }
    for (size_t i = 0; i < node->count; i++) {
        int n = snprintf(path + len, cap - len, "%s%s", len ? "." : "", node->items[i]->key);
        if (n < 0 || (size_t)n >= cap - len)
            continue;
        DSARL_TRY(apply_default_below(v, ref, node->items[i], k + 1, path, len + (size_t)n, cap));
        path[len] = '\0';
    }
    return DSARL_OK;
}

static int apply_defaults(validator *v)
{
    char path[1024] = "";
    for (size_t i = 0; i < v->n_specs; i++) {
        const spec_ref *ref = &v->specs[i];
        if (!ref->spec->default_value || strcmp(ref->segments[ref->n_segments - 1], "*") == 0)
            continue;
        int rc = apply_default_below(v, ref, v->recipe->root, 0, path, 0, sizeof path);
        if (rc < 0)
            return rc;
    }
    return DSARL_OK;
}

/* ---- (b, c, d) the walk ------------------------------------------------------------------------------------- */

static const char *key_type_name(dsarl_key_type type)
{
    switch (type) {
    case DSARL_KEY_BOOL: return "bool (true or false)";
    case DSARL_KEY_INT: return "int";
    case DSARL_KEY_FLOAT: return "number";
    case DSARL_KEY_STRING: return "string";
    case DSARL_KEY_LIST: return "list";
    case DSARL_KEY_MAP: return "map";
    case DSARL_KEY_ANY: return "value";
    }
    return "value";
}

static bool type_fits(const dsarl_key_spec *spec, const dsarl_node *node)
{
    if (spec->type == DSARL_KEY_ANY)
        return true;
    // An interpolation that failed to resolve has its own error; its "${...}" text is not a type mistake.
    if (node->type == DSARL_NODE_STRING && node->resolve_state != 2 && strstr(node->text, "${"))
        return true;
    if (node->type == DSARL_NODE_NULL)
        return (spec->flags & DSARL_KEY_NULLABLE) != 0;
    switch (spec->type) {
    case DSARL_KEY_BOOL: return node->type == DSARL_NODE_BOOL;
    case DSARL_KEY_INT: return node->type == DSARL_NODE_INT;
    case DSARL_KEY_FLOAT: return node->type == DSARL_NODE_FLOAT || node->type == DSARL_NODE_INT;
    case DSARL_KEY_STRING: return node->type == DSARL_NODE_STRING;
    case DSARL_KEY_LIST: return node->type == DSARL_NODE_LIST;
    case DSARL_KEY_MAP: return node->type == DSARL_NODE_MAP;
    case DSARL_KEY_ANY: return true;
    }
    return false;
}

/* The path of the current node with the spec's wildcards filled in from it, cut at depth segments. */
static void filled_path(const validator *v, const spec_ref *ref, int depth, char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < depth && i < ref->n_segments; i++) {
        const char *seg = strcmp(ref->segments[i], "*") == 0 ? v->segments[i] : ref->segments[i];
        int n = snprintf(buf + len, size - len, "%s%s", i ? "." : "", seg);
        if (n < 0 || (size_t)n >= size - len)
            return;
        len += (size_t)n;
    }
}

static int unknown_key(validator *v, const dsarl_node *node, int depth, const spec_ref *owned)
{
    char path[512], section[512], candidate[512], best[512] = "";
    dsarl_node_path(node, path, sizeof path);
    filled_path(v, owned, owned->n_segments, section, sizeof section);
    size_t limit = strlen(path) / 3 < 2 ? 2 : strlen(path) / 3, best_distance = limit + 1;
    for (size_t i = 0; i < v->n_specs; i++) {
        const spec_ref *ref = &v->specs[i];
        if (ref->n_segments < depth || !matches_prefix(ref, v->segments, owned->n_segments))
            continue;
        filled_path(v, ref, depth, candidate, sizeof candidate);
        size_t d = dsarl_edit_distance(path, candidate);
        if (d < best_distance) {
            best_distance = d;
            snprintf(best, sizeof best, "%s", candidate);
        }
    }
    if (best[0])
        return problem(v, node, "unknown key '%s' in section '%s' (owned by %s); did you mean '%s'?", path, section,
                       owned->owner, best);
    return problem(v, node, "unknown key '%s' in section '%s' (owned by %s), which declares no such key", path,
                   section, owned->owner);
}

static int check_node(validator *v, const dsarl_node *node, int depth);

static int check_children(validator *v, const dsarl_node *node, int depth)
{
    if (depth >= (int)(sizeof v->segments / sizeof v->segments[0]))
        return DSARL_OK;
    for (size_t i = 0; i < node->count; i++) {
        if (node->type == DSARL_NODE_MAP) {
            v->segments[depth] = node->items[i]->key;
        } else {
            snprintf(v->index_text[depth], sizeof v->index_text[depth], "%zu", i);
            v->segments[depth] = v->index_text[depth];
        }
        DSARL_TRY(check_node(v, node->items[i], depth + 1));
    }
    return DSARL_OK;
}

static int check_node(validator *v, const dsarl_node *node, int depth)
{
    const spec_ref *used = NULL, *ignored = NULL, *owned = NULL;
    bool deeper = false;
    char path[512];
    for (size_t i = 0; i < v->n_specs; i++) {
        const spec_ref *ref = &v->specs[i];
        if (ref->n_segments > depth) {
            deeper = deeper || matches_prefix(ref, v->segments, depth);
            continue;
        }
        if (!matches_prefix(ref, v->segments, ref->n_segments))
            continue;
        if (ref->n_segments < depth) {
            // A section above this node; the deepest owned one names the error.
            if ((ref->spec->flags & DSARL_KEY_OWNED) && (!owned || ref->n_segments > owned->n_segments))
                owned = ref;
            continue;
        }
        if (ref->spec->flags & DSARL_KEY_IGNORED) {
            if (!ignored)
                ignored = ref;
            continue;
        }
        if (!type_fits(ref->spec, node)) {
            return problem(v, node, "recipe key '%s' must be a %s%s (declared by %s: %s), got %s '%s'",
                           dsarl_node_path(node, path, sizeof path), key_type_name(ref->spec->type),
                           (ref->spec->flags & DSARL_KEY_NULLABLE) ? " or null" : "", ref->owner,
                           ref->spec->doc ? ref->spec->doc : "", dsarl_node_type_name(node->type),
                           node->text ? node->text : dsarl_node_type_name(node->type));
        }
        if (!used)
            used = ref;
    }
    if (used) {
        // A declared map with keys declared below it, or one its owner declares OWNED, is checked inside; any
        // other declared map is taken whole.
        bool owned_here = false;
        for (size_t i = 0; i < v->n_specs && !owned_here; i++)
            owned_here = v->specs[i].n_segments == depth && (v->specs[i].spec->flags & DSARL_KEY_OWNED) &&
                         matches_prefix(&v->specs[i], v->segments, depth);
        if ((deeper || owned_here) && (node->type == DSARL_NODE_MAP || node->type == DSARL_NODE_LIST))
            return check_children(v, node, depth);
        return DSARL_OK;
    }
    if (ignored) {
        char detail[256];
        snprintf(detail, sizeof detail, "ignored by %s", ignored->owner);
        return report_unused(v, node, detail);
    }
    if (deeper) {
        if (node->type == DSARL_NODE_MAP || node->type == DSARL_NODE_LIST)
            return check_children(v, node, depth);
        return DSARL_OK;
    }
    if (owned)
        return unknown_key(v, node, depth, owned);
    return report_unused(v, node, "declared by no plugin");
}

static int run(dsarl_recipe *r, const dsarl_schema_table *tables, size_t n_tables, dsarl_schema_report *report,
               bool collect, dsarl_error *err)
{
    if (!r || !r->root || (n_tables && !tables))
        return DSARL_FAIL(err, DSARL_E_INVALID, "schema validation needs a loaded recipe and its key tables");
    if (collect && !report)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_schema_check_only needs a report to fill");
    validator *v = calloc(1, sizeof *v);
    if (!v)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
    v->recipe = r;
    v->report = report;
    v->collect = collect;
    v->err = err;
    int rc = collect_specs(v, tables, n_tables);
    if (rc == DSARL_OK)
        rc = apply_defaults(v);
    // A default may itself interpolate ("${policy.max_total_sequence_length}"); the rest is already resolved.
    // When that fails on a mistyped recipe value, the type error below is the clearer message, so it goes first.
    dsarl_error resolve_err = {0};
    int resolve_rc = rc == DSARL_OK ? dsarl_recipe_resolve(r, &resolve_err) : DSARL_OK;
    if (rc == DSARL_OK)
        rc = check_children(v, r->root, 0);
    if (rc == DSARL_OK && resolve_rc < 0) {
        if (collect) {
            rc = add_entry(&report->problems, &report->n_problems, r->root, resolve_err.message, err);
        } else {
            *err = resolve_err;
            rc = resolve_rc;
        }
    }
    free_specs(v);
    free(v);
    return rc;
}

int dsarl_schema_validate(dsarl_recipe *r, const dsarl_schema_table *tables, size_t n_tables,
                          dsarl_schema_report *report, dsarl_error *err)
{
    return run(r, tables, n_tables, report, false, err);
}

int dsarl_schema_check_only(dsarl_recipe *r, const dsarl_schema_table *tables, size_t n_tables,
                            dsarl_schema_report *report, dsarl_error *err)
{
    return run(r, tables, n_tables, report, true, err);
}
