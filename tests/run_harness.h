/* run_harness.h: an algorithm run in the test's own process, set up as `dsarl run` sets it up: the recipe loaded,
 * the overrides applied in order (as command-line arguments 1, 2, ...), resolved, the build tree's plugins loaded,
 * the recipe's plugins selected and the recipe validated against their schemas, and a one-process run context
 * filled in. The suites that drive grpo_train_run or the distillation loop directly (check_grpo_run,
 * check_distill_run, check_grpo_tool_episodes) share it. Header-only: each suite is its own executable.
 * Needs _GNU_SOURCE, DSARL_SOURCE_DIR and DSARL_BINARY_DIR (dsarl_add_check_test defines them) and core/src on
 * the include path. */
#ifndef DSARL_TEST_RUN_HARNESS_H
#define DSARL_TEST_RUN_HARNESS_H

#include <check.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsarl/trainer.h"
#include "recipe_internal.h"
#include "registry.h"
#include "selection.h"

typedef struct run_harness {
    dsarl_recipe *recipe;
    dsarl_registry *reg;
    dsarl_selection sel;
    const dsarl_environment_ops *env_ops[DSARL_MAX_ENVIRONMENTS];
    const char *env_names[DSARL_MAX_ENVIRONMENTS];
    dsarl_parallel parallel;
    volatile sig_atomic_t stop;
    dsarl_run_context ctx;
} run_harness;

/* One list of overrides ("key=value", "+key=value", ...). */
typedef struct run_overrides {
    const char *const *items;
    size_t n;
} run_overrides;

/* Opens the run of the recipe at recipe_path (relative to the source tree) with the overrides of lists[0..n_lists)
 * applied in that order (later ones win). The context uses the selected plugins and environments, one process
 * (DSARL_PARALLEL_SINGLE) and h->stop as its stop flag; a test may replace any of them before running. Returns 0,
 * or the first error (err set) with everything opened so far freed again: close only an opened harness. */
static inline int run_harness_open(run_harness *h, const char *recipe_path, const run_overrides *lists,
                                   size_t n_lists, dsarl_error *err)
{
    memset(h, 0, sizeof *h);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", DSARL_SOURCE_DIR, recipe_path);
    int rc = dsarl_recipe_load_file(path, &h->recipe, err);
    int index = 1;
    for (size_t l = 0; rc == 0 && l < n_lists; l++)
        for (size_t i = 0; rc == 0 && i < lists[l].n; i++)
            rc = dsarl_recipe_override(h->recipe, lists[l].items[i], index++, err);
    if (rc == 0)
        rc = dsarl_recipe_resolve(h->recipe, err);
    if (rc == 0)
        rc = dsarl_registry_create(&h->reg, err);
    if (rc == 0)
        rc = dsarl_registry_add_search_path(h->reg, DSARL_BINARY_DIR "/lib/dsarl/plugins", "test", err);
    if (rc == 0)
        rc = dsarl_registry_load_all(h->reg, err);
    const dsarl_node *root = rc == 0 ? dsarl_recipe_root(h->recipe) : NULL;
    if (rc == 0)
        rc = dsarl_select_plugins(root, h->reg, &h->sel, err);
    if (rc == 0) {
        dsarl_schema_table tables[DSARL_SELECTION_MAX_TABLES];
        size_t n = dsarl_selection_schema_tables(&h->sel, tables);
        rc = dsarl_schema_validate(h->recipe, tables, n, NULL, err);
    }
    if (rc < 0) {
        dsarl_registry_free(h->reg);
        dsarl_recipe_free(h->recipe);
        memset(h, 0, sizeof *h);
        return rc;
    }
    for (int i = 0; i < h->sel.n_environments; i++) {
        h->env_ops[i] = (const dsarl_environment_ops *)h->sel.environments[i].ops;
        h->env_names[i] = h->sel.environments[i].name;
    }
    h->parallel = (dsarl_parallel)DSARL_PARALLEL_SINGLE;
    h->ctx = (dsarl_run_context){
        .struct_size = sizeof h->ctx, .host = dsarl_registry_host(h->reg), .recipe = root, .parallel = &h->parallel,
        .model_ops = (const dsarl_model_ops *)h->sel.model.ops,
        .device_ops = (const dsarl_device_ops *)h->sel.device.ops, .dsa_ops = (const dsarl_dsa_ops *)h->sel.dsa.ops,
        .generation_ops = (const dsarl_generation_ops *)h->sel.generation.ops, .environment_ops = h->env_ops,
        .environment_names = h->env_names, .n_environments = h->sel.n_environments, .stop_requested = &h->stop};
    return 0;
}

static inline void run_harness_close(run_harness *h)
{
    dsarl_registry_free(h->reg);
    dsarl_recipe_free(h->recipe);
    memset(h, 0, sizeof *h);
}

/* A fresh directory /tmp/PREFIX_XXXXXX for one test's run (malloc'd; the caller frees it). */
static inline char *run_harness_work_dir(const char *prefix)
{
    char *t = malloc(strlen(prefix) + 16);
    ck_assert_ptr_nonnull(t);
    sprintf(t, "/tmp/%s_XXXXXX", prefix);
    ck_assert_ptr_nonnull(mkdtemp(t));
    return t;
}

/* Removes a run directory, unless the environment variable keep_env is set (debugging: leave it for inspection). */
static inline void run_harness_remove_tree(const char *path, const char *keep_env)
{
    if (keep_env && getenv(keep_env))
        return;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    ck_assert_int_eq(system(cmd), 0);
}

/* A number in a metrics row; fails the test when it is missing or not a number. */
static inline double run_harness_metric(json_t *row, const char *name)
{
    json_t *v = json_object_get(row, name);
    ck_assert_msg(v != NULL && json_is_number(v), "metric %s missing or not a number", name);
    return json_number_value(v);
}

#endif /* DSARL_TEST_RUN_HARNESS_H */
