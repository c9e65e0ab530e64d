/* dsarl/recipe.h: read access to the resolved recipe, for the core and for plugins.
 * SDK tier: plugin ABI (docs/sdk.md).
 *
 * A recipe is a tree of nodes (maps, lists, scalars) built from YAML files, their `defaults:` chain and the
 * command line. Every node remembers where it came from (file:line:col, a command-line argument, or a plugin's
 * declared default), so an error about a value can always name its origin. Plugins only read; the host owns
 * loading, overriding, interpolation and validation (core/src/recipe_*.h). */
#ifndef DSARL_RECIPE_H
#define DSARL_RECIPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "dsarl/error.h"

DSARL_BEGIN_DECLS

typedef struct dsarl_node dsarl_node;

typedef enum dsarl_node_type {
    DSARL_NODE_NULL = 0,   /* `null`, `~` or an empty plain scalar */
    DSARL_NODE_BOOL = 1,   /* exactly `true` or `false` */
    DSARL_NODE_INT = 2,    /* a plain scalar that parses fully as a 64-bit integer */
    DSARL_NODE_FLOAT = 3,  /* a plain scalar that parses fully as a double (incl. 1e-6, .inf, .nan) */
    DSARL_NODE_STRING = 4, /* any other scalar, and every quoted scalar */
    DSARL_NODE_LIST = 5,
    DSARL_NODE_MAP = 6,
} dsarl_node_type;

/* What kind of place a node came from. */
typedef enum dsarl_origin_kind {
    DSARL_ORIGIN_FILE = 0,         /* a YAML file: file, line, column are set (1-based) */
    DSARL_ORIGIN_COMMAND_LINE = 1, /* an override argument: text and index are set */
    DSARL_ORIGIN_DEFAULT = 2,      /* a plugin's declared default: text names the plugin */
    DSARL_ORIGIN_BUILTIN = 3,      /* set by the host itself */
} dsarl_origin_kind;

typedef struct dsarl_origin {
    dsarl_origin_kind kind;
    const char *file;   /* DSARL_ORIGIN_FILE: path as given (relative paths stay relative) */
    int line, column;   /* DSARL_ORIGIN_FILE: 1-based */
    const char *text;   /* COMMAND_LINE: the argument; DEFAULT: "kind/name" of the declaring plugin */
    int index;          /* COMMAND_LINE: position of the argument among the overrides, 1-based */
} dsarl_origin;

/* The node at a dotted path below root ("policy.generation.temperature"; list items by index: "a.b.0"), or NULL. */
DSARL_API const dsarl_node *dsarl_node_get(const dsarl_node *root, const char *path);

/* The node's type. */
DSARL_API dsarl_node_type dsarl_node_kind(const dsarl_node *node);

/* Short name of a node type ("map", "int", ...). */
DSARL_API const char *dsarl_node_type_name(dsarl_node_type type);

/* Where the node came from. */
DSARL_API const dsarl_origin *dsarl_node_origin(const dsarl_node *node);

/* Formats the origin as "path/to/file.yaml:12:5", "command line argument 2 'a.b=3'" or "default of dsa/tilelang". */
DSARL_API const char *dsarl_node_where(const dsarl_node *node, char *buf, size_t size);

/* The full dotted path of the node from the recipe root ("policy.generation"), "" for the root. */
DSARL_API const char *dsarl_node_path(const dsarl_node *node, char *buf, size_t size);

/* Number of children of a map or list; 0 for scalars. */
DSARL_API size_t dsarl_node_count(const dsarl_node *node);

/* The i-th key of a map (insertion order), or NULL for other types or i out of range. */
DSARL_API const char *dsarl_node_key_at(const dsarl_node *node, size_t i);

/* The i-th child of a map or list, or NULL. */
DSARL_API const dsarl_node *dsarl_node_child_at(const dsarl_node *node, size_t i);

/* Scalar values. Each returns the value when the node has that type; as_double also accepts INT. The text of a
 * scalar (string, or the spelling of a number/bool) is available from dsarl_node_text for every scalar. */
DSARL_API bool dsarl_node_as_bool(const dsarl_node *node);
DSARL_API int64_t dsarl_node_as_int(const dsarl_node *node);
DSARL_API double dsarl_node_as_double(const dsarl_node *node);
DSARL_API const char *dsarl_node_text(const dsarl_node *node);

/* Typed lookups for plugins. Each fails with one sentence naming the key and its origin when the value has the
 * wrong type, and with DSARL_E_NOT_FOUND when the key is absent or null. The *_or forms return def instead of
 * failing when the key is absent or null, but still fail on a wrong type. */
DSARL_API int dsarl_recipe_bool(const dsarl_node *root, const char *path, bool *out, dsarl_error *err);
DSARL_API int dsarl_recipe_int(const dsarl_node *root, const char *path, int64_t *out, dsarl_error *err);
DSARL_API int dsarl_recipe_double(const dsarl_node *root, const char *path, double *out, dsarl_error *err);
DSARL_API int dsarl_recipe_string(const dsarl_node *root, const char *path, const char **out, dsarl_error *err);
DSARL_API int dsarl_recipe_bool_or(const dsarl_node *root, const char *path, bool def, bool *out, dsarl_error *err);
DSARL_API int dsarl_recipe_int_or(const dsarl_node *root, const char *path, int64_t def, int64_t *out,
                                  dsarl_error *err);
DSARL_API int dsarl_recipe_double_or(const dsarl_node *root, const char *path, double def, double *out,
                                     dsarl_error *err);
DSARL_API int dsarl_recipe_string_or(const dsarl_node *root, const char *path, const char *def, const char **out,
                                     dsarl_error *err);

/* Fails with "<where>: recipe key <path> <message>" naming the node's origin; returns code. For range checks a
 * plugin makes on a value it read (e.g. "must be > 0, got -1"). */
DSARL_API int dsarl_recipe_fail(const dsarl_node *root, const char *path, dsarl_error *err, int code,
                                const char *fmt, ...) DSARL_PRINTF(5, 6);

DSARL_END_DECLS

#endif /* DSARL_RECIPE_H */
