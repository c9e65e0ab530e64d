/* cli.c: option handling, recipe loading and registry set-up shared by the subcommands. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsarl/log.h"

int cli_exit_status(int code)
{
    switch (code) {
    case DSARL_OK: return CLI_EXIT_OK;
    case DSARL_E_INVALID:
    case DSARL_E_NOT_FOUND:
    case DSARL_E_UNSUPPORTED: return CLI_EXIT_INVALID; // a recipe asking for what is not supported (yet) is bad input
    case DSARL_E_ABI: return CLI_EXIT_PLUGIN;
    default: return CLI_EXIT_FAILED;
    }
}

int cli_fail(const dsarl_error *err)
{
    int rank = 0, world = 1;
    dsarl_log_get_rank(&rank, &world);
    if (world > 1) // which rank failed is the first thing a multi-process job's user needs
        fprintf(stderr, "dsarl: rank %d: error: %s\n", rank,
                err->message[0] ? err->message : dsarl_status_name(err->code));
    else
        fprintf(stderr, "dsarl: error: %s\n", err->message[0] ? err->message : dsarl_status_name(err->code));
    if (dsarl_log_get_level() >= DSARL_LOG_DEBUG && err->file)
        fprintf(stderr, "dsarl: (raised at %s:%d)\n", err->file, err->line);
    return cli_exit_status(err->code);
}

int cli_is_help(const char *arg) { return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0; }

/* Matches "--name VALUE" or "--name=VALUE" at argv[*i]; advances *i past the value. */
static int take_valued(int argc, char **argv, int *i, const char *name, const char **value)
{
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0)
        return 0;
    if (argv[*i][n] == '=') {
        *value = argv[*i] + n + 1;
        return 1;
    }
    if (argv[*i][n] != '\0')
        return 0;
    if (*i + 1 >= argc) {
        *value = NULL;
        return 1;
    }
    *value = argv[++*i];
    return 1;
}

int cli_take_global_options(int argc, char **argv, cli_options *opts)
{
    const char *env_level = getenv("DSARL_LOG");
    if (env_level && *env_level) {
        dsarl_log_level level;
        if (dsarl_log_level_parse(env_level, &level) != 0) {
            fprintf(stderr, "dsarl: error: DSARL_LOG='%s' is not a log level; use error, warn, info, debug or trace\n",
                    env_level);
            return -1;
        }
        dsarl_log_set_level(level);
    }
    int kept = 0;
    for (int i = 0; i < argc; i++) {
        const char *value = NULL;
        if (take_valued(argc, argv, &i, "--log-level", &value)) {
            dsarl_log_level level;
            if (!value || dsarl_log_level_parse(value, &level) != 0) {
                fprintf(stderr, "dsarl: error: --log-level needs one of error, warn, info, debug, trace; got '%s'\n",
                        value ? value : "");
                return -1;
            }
            dsarl_log_set_level(level);
            continue;
        }
        if (take_valued(argc, argv, &i, "--plugin-path", &value)) {
            if (!value || !*value) {
                fprintf(stderr, "dsarl: error: --plugin-path needs a directory (or a ':'-separated list)\n");
                return -1;
            }
            opts->plugin_path = value;
            continue;
        }
        argv[kept++] = argv[i];
    }
    return kept;
}

int cli_load_recipe(const char *path, int n_overrides, char **overrides, dsarl_recipe **out, dsarl_error *err)
{
    dsarl_recipe *recipe = NULL;
    DSARL_TRY(dsarl_recipe_load_file(path, &recipe, err));
    for (int i = 0; i < n_overrides; i++) {
        int rc = dsarl_recipe_override(recipe, overrides[i], i + 1, err);
        if (rc < 0) {
            dsarl_recipe_free(recipe);
            return rc;
        }
    }
    int rc = dsarl_recipe_resolve(recipe, err);
    if (rc < 0) {
        dsarl_recipe_free(recipe);
        return rc;
    }
    *out = recipe;
    return 0;
}

/* Adds one plugins.path entry (a directory, or ':'-separated directories) written at item: a relative directory
 * written in a recipe file is found beside that file (as `defaults:` are), one given on the command line from the
 * current directory. */
static int add_recipe_dirs(dsarl_registry *reg, const dsarl_node *item, dsarl_error *err)
{
    const dsarl_origin *o = dsarl_node_origin(item);
    const char *text = dsarl_node_text(item), *slash = o && o->kind == DSARL_ORIGIN_FILE && o->file
                                                            ? strrchr(o->file, '/') : NULL;
    if (!slash)
        return dsarl_registry_add_search_path(reg, text, "recipe plugins.path", err);
    char *copy = strdup(text);
    if (!copy)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
    int rc = DSARL_OK;
    char *save = NULL;
    for (char *dir = strtok_r(copy, ":", &save); dir && rc == DSARL_OK; dir = strtok_r(NULL, ":", &save)) {
        char joined[4096];
        if (dir[0] == '/')
            snprintf(joined, sizeof joined, "%s", dir);
        else if ((size_t)snprintf(joined, sizeof joined, "%.*s/%s", (int)(slash - o->file), o->file, dir) >=
                 sizeof joined)
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "plugins.path entry '%s' is too long", dir);
        if (rc == DSARL_OK)
            rc = dsarl_registry_add_search_path(reg, joined, "recipe plugins.path", err);
    }
    free(copy);
    return rc;
}

/* Adds plugins.path from the recipe: a string (':'-separated) or a list of strings. */
static int add_recipe_plugin_path(dsarl_registry *reg, const dsarl_node *root, dsarl_error *err)
{
    const dsarl_node *node = root ? dsarl_node_get(root, "plugins.path") : NULL;
    if (!node || dsarl_node_kind(node) == DSARL_NODE_NULL)
        return 0;
    char where[256];
    dsarl_node_where(node, where, sizeof where);
    if (dsarl_node_kind(node) == DSARL_NODE_STRING)
        return add_recipe_dirs(reg, node, err);
    if (dsarl_node_kind(node) != DSARL_NODE_LIST)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: plugins.path must be a directory or a list of directories", where);
    for (size_t i = 0; i < dsarl_node_count(node); i++) {
        const dsarl_node *item = dsarl_node_child_at(node, i);
        if (dsarl_node_kind(item) != DSARL_NODE_STRING)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: plugins.path item %zu must be a directory (a string)",
                              dsarl_node_where(item, where, sizeof where), i);
        DSARL_TRY(add_recipe_dirs(reg, item, err));
    }
    return 0;
}

int cli_open_registry(const dsarl_node *root, const cli_options *opts, dsarl_registry **out, dsarl_error *err)
{
    dsarl_registry *reg = NULL;
    DSARL_TRY(dsarl_registry_create(&reg, err));
    int rc = add_recipe_plugin_path(reg, root, err);
    if (rc == 0 && opts->plugin_path)
        rc = dsarl_registry_add_search_path(reg, opts->plugin_path, "--plugin-path", err);
    if (rc == 0)
        rc = dsarl_registry_add_default_paths(reg, err);
    if (rc == 0)
        rc = dsarl_registry_load_all(reg, err);
    if (rc < 0) {
        dsarl_registry_free(reg);
        return rc;
    }
    for (size_t i = 0; i < dsarl_registry_refusal_count(reg); i++)
        dsarl_log(DSARL_LOG_WARN, "refused plugin %s", dsarl_registry_refusal_at(reg, i)->reason);
    *out = reg;
    return 0;
}

int cli_open_session(const char *recipe_path, int n_overrides, char **overrides, const cli_options *opts,
                     cli_session *s, dsarl_error *err)
{
    s->recipe = NULL;
    s->registry = NULL;
    int rc = cli_load_recipe(recipe_path, n_overrides, overrides, &s->recipe, err);
    if (rc == 0)
        rc = cli_open_registry(dsarl_recipe_root(s->recipe), opts, &s->registry, err);
    if (rc == 0)
        rc = dsarl_select_plugins(dsarl_recipe_root(s->recipe), s->registry, &s->selection, err);
    if (rc < 0)
        cli_close_session(s);
    return rc;
}

void cli_close_session(cli_session *s)
{
    dsarl_registry_free(s->registry);
    dsarl_recipe_free(s->recipe);
    s->registry = NULL;
    s->recipe = NULL;
}

int cli_choose_device(const dsarl_registry *reg, const char *cmd, uint64_t required_caps, const char **name,
                      const dsarl_ops_common **out, dsarl_error *err)
{
    if (!*name) {
        const dsarl_ops_common *best = dsarl_select_default_device(reg, required_caps);
        if (!best)
            return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s: no loaded device plugin%s can run on this machine; load "
                              "one or name it with --device", cmd, required_caps & DSARL_DEVICE_CAP_CUDA
                              ? " with CUDA (the command times with CUDA events)" : "");
        *name = best->name;
    }
    char where[96];
    snprintf(where, sizeof where, "%s --device", cmd);
    return dsarl_registry_require(reg, DSARL_KIND_DEVICE, *name, where, out, err);
}

int cli_choose_dsa(const dsarl_registry *reg, const char *cmd, const dsarl_ops_common *device, const char **name,
                   const dsarl_ops_common **out, dsarl_error *err)
{
    if (!*name) {
        const dsarl_ops_common *best = dsarl_select_default_dsa(reg, (const dsarl_device_ops *)device);
        if (!best)
            return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s: no loaded DSA backend runs on device %s; name one with "
                              "--backend", cmd, device->name);
        *name = best->name;
    }
    char where[96];
    snprintf(where, sizeof where, "%s --backend", cmd);
    return dsarl_registry_require(reg, DSARL_KIND_DSA, *name, where, out, err);
}
