/* schema.h: validating a resolved recipe against the recipe keys the selected plugins declare (host side).
 *
 * Each selected ops table contributes one table: its owner ("algorithm/grpo") and its dsarl_key_spec array.
 * Validation (1) fills declared defaults for absent keys (and resolves any interpolation in them), (2) checks types (FLOAT accepts INT, NULLABLE accepts
 * null, ANY accepts anything, a "*" segment matches any one key or list index), (3) refuses undeclared keys below a
 * section some plugin OWNS, with "did you mean", and (4) lists keys nobody reads (undeclared outside owned
 * sections, or declared IGNORED) so `dsarl config show` can show them. A declared MAP/LIST/ANY key with no
 * declared keys below it is taken whole: its contents are used, not checked. */
#ifndef DSARL_SCHEMA_H
#define DSARL_SCHEMA_H

#include <stddef.h>
#include "dsarl/plugin.h"
#include "recipe_internal.h"

/* The keys of one selected plugin table. */
typedef struct dsarl_schema_table {
    const char *owner;           /* "kind/name", e.g. "algorithm/grpo"; names defaults' origins and errors */
    const dsarl_key_spec *keys;
    size_t n_keys;
} dsarl_schema_table;

/* One reported key: its path, where its value came from, and why it is listed. */
typedef struct dsarl_schema_entry {
    char *path;    /* "policy.dtensor_cfg" */
    char *where;   /* "recipe.yaml:12:3" */
    char *detail;  /* unused: "declared by no plugin" / "ignored by algorithm/grpo"; problems: the full sentence */
} dsarl_schema_entry;

/* What validation found besides the first error. Owned by the caller; init before, free after. */
typedef struct dsarl_schema_report {
    dsarl_schema_entry *unused;    /* keys no plugin reads, in recipe order (a whole section counts once) */
    size_t n_unused;
    dsarl_schema_entry *problems;  /* dsarl_schema_check_only: every error, each one sentence with its location */
    size_t n_problems;
} dsarl_schema_report;

/* Empties a report (no allocation). */
DSARL_API void dsarl_schema_report_init(dsarl_schema_report *report);

/* Frees every entry and empties the report. */
DSARL_API void dsarl_schema_report_free(dsarl_schema_report *report);

/* Applies defaults, then checks the recipe; the first error wins ("<where>: ..." in err). report (may be NULL)
 * receives the unused keys. */
DSARL_API int dsarl_schema_validate(dsarl_recipe *r, const dsarl_schema_table *tables, size_t n_tables,
                                    dsarl_schema_report *report, dsarl_error *err);

/* Like validate, but never stops at a recipe error: every problem goes to report->problems (for `config show`).
 * Fails only for an internal reason (out of memory, a malformed declared default). */
DSARL_API int dsarl_schema_check_only(dsarl_recipe *r, const dsarl_schema_table *tables, size_t n_tables,
                                      dsarl_schema_report *report, dsarl_error *err);

#endif /* DSARL_SCHEMA_H */
