/* registry.h: the plugin registry of one host process (internal to the host binary and tests).
 *
 * The registry finds plugin files (dsarl-*.so) in its search directories, dlopen()s them RTLD_NOW|RTLD_LOCAL
 * (never unloaded), checks each descriptor and calls its init, which registers ops tables by (kind, name).
 * A file that cannot be used is recorded as refused, with one line naming the file and the reason; it never stops
 * the scan. Search order: recipe plugins.path, --plugin-path, DSARL_PLUGIN_PATH, then lib/dsarl/plugins beside
 * libdsarl. A directory searched earlier wins only in the sense that its plugins register first; a second table
 * with the same (kind, name) is refused naming both files. */
#ifndef DSARL_REGISTRY_H
#define DSARL_REGISTRY_H

#include <stddef.h>
#include "dsarl/plugin.h"

typedef struct dsarl_registry dsarl_registry;

/* One loaded plugin file. */
typedef struct dsarl_plugin_info {
    const char *path;
    const char *name, *version, *description;
    unsigned abi_major, abi_minor;
} dsarl_plugin_info;

/* One registered ops table and the file it came from. */
typedef struct dsarl_ops_entry {
    dsarl_kind kind;
    const dsarl_ops_common *ops;
    const dsarl_plugin_info *plugin;
} dsarl_ops_entry;

/* One file that was refused, with the one-line reason (which names the file). */
typedef struct dsarl_refusal {
    const char *path;
    const char *reason;
} dsarl_refusal;

/* Smallest struct_size an ops table of kind from a plugin of ABI minor may have: the end of the last slot that
 * minor defines (registry_slots.c). */
DSARL_API size_t dsarl_registry_minimum_ops_size(dsarl_kind kind, unsigned minor);

/* Checks an ops table against its kind's slot rules for a plugin of ABI minor: struct_size covers that minor,
 * every mandatory slot is set. Returns 0, or -1 with why (a phrase following "<kind> '<name>' ops table ..."). */
DSARL_API int dsarl_registry_check_slots(dsarl_kind kind, const dsarl_ops_common *ops, unsigned minor, char *why,
                                         size_t why_size);

/* Creates an empty registry whose host table is ready for plugin init functions. */
DSARL_API int dsarl_registry_create(dsarl_registry **out, dsarl_error *err);

/* Appends directories (a ':'-separated list) to the search path; source names where they came from
 * ("recipe plugins.path", "--plugin-path", "DSARL_PLUGIN_PATH", "beside libdsarl"). */
DSARL_API int dsarl_registry_add_search_path(dsarl_registry *reg, const char *dirs, const char *source,
                                             dsarl_error *err);

/* Appends DSARL_PLUGIN_PATH (if set) and the directory beside libdsarl. */
DSARL_API int dsarl_registry_add_default_paths(dsarl_registry *reg, dsarl_error *err);

/* Loads one file; a refusal is recorded (and returned as a negative status with err filled), never fatal. */
DSARL_API int dsarl_registry_load_file(dsarl_registry *reg, const char *path, dsarl_error *err);

/* Scans every search directory in order and loads each dsarl-*.so once (by real path). Refusals are recorded. */
DSARL_API int dsarl_registry_load_all(dsarl_registry *reg, dsarl_error *err);

/* The host table handed to plugin init functions. */
DSARL_API const dsarl_host *dsarl_registry_host(const dsarl_registry *reg);

/* The ops table registered as (kind, name), or NULL. */
DSARL_API const dsarl_ops_common *dsarl_registry_find(const dsarl_registry *reg, dsarl_kind kind, const char *name);

/* Like find, but fails with "<selected_by>: no <kind> plugin named '<name>'; available: a, b" (plus the refusal
 * reason when a file that would have provided it was refused). */
DSARL_API int dsarl_registry_require(const dsarl_registry *reg, dsarl_kind kind, const char *name,
                                     const char *selected_by, const dsarl_ops_common **out, dsarl_error *err);

/* Iteration for `dsarl plugins`. */
DSARL_API size_t dsarl_registry_ops_count(const dsarl_registry *reg);
DSARL_API const dsarl_ops_entry *dsarl_registry_ops_at(const dsarl_registry *reg, size_t i);
DSARL_API size_t dsarl_registry_refusal_count(const dsarl_registry *reg);
DSARL_API const dsarl_refusal *dsarl_registry_refusal_at(const dsarl_registry *reg, size_t i);
DSARL_API size_t dsarl_registry_search_dir_count(const dsarl_registry *reg);
DSARL_API const char *dsarl_registry_search_dir_at(const dsarl_registry *reg, size_t i, const char **source);

/* Frees the registry's bookkeeping; loaded plugins stay resident (CUDA kernels cannot be unregistered safely). */
DSARL_API void dsarl_registry_free(dsarl_registry *reg);

#endif /* DSARL_REGISTRY_H */
