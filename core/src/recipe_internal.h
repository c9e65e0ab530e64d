/* recipe_internal.h: the host side of recipes (loading, overrides, interpolation, writing), for the host binary
 * and the tests. Plugins only see dsarl/recipe.h.
 *
 * Life of a recipe: dsarl_recipe_load_file (YAML + `defaults:` chain, merged) -> dsarl_recipe_override for each
 * command-line argument -> dsarl_recipe_resolve (OmegaConf `${...}` interpolation) -> schema validation
 * (schema.h, which fills plugin defaults with dsarl_recipe_set_default) -> read through dsarl/recipe.h.
 *
 * Scalar typing is strict and ours, not YAML 1.1's: only plain scalars are typed; `true`/`false` (also `True`,
 * `TRUE`, `False`, `FALSE` as in the YAML 1.2 core schema, which NeMo RL's own files use) are booleans, `yes`,
 * `no`, `on`, `off` stay strings; `null`, `Null`, `NULL`, `~` and the empty scalar are null; decimal integers
 * that fit in 64 bits are ints; `1.5`, `1e-6`, `.inf`, `-.inf`, `.nan` are floats; anything else is a string. */
#ifndef DSARL_RECIPE_INTERNAL_H
#define DSARL_RECIPE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "dsarl/recipe.h"

/* Limits that keep hostile input cheap: nodes one document may expand to (aliases included), and nesting depth. */
#define DSARL_RECIPE_MAX_NODES 1000000
#define DSARL_RECIPE_MAX_DEPTH 64
/* Text bytes interpolation may build in one recipe (strings made from ${...} pieces, copied values). */
#define DSARL_RECIPE_MAX_TEXT_BYTES (64 << 20)
/* Bytes of one recipe file (the largest seed recipe is a few KB). */
#define DSARL_RECIPE_MAX_FILE_BYTES (16 << 20)

/* One node of the tree. Maps keep insertion order; each child of a map carries its key. */
struct dsarl_node {
    dsarl_node_type type;
    char *key;             /* key in the parent map; NULL for list items and the root */
    dsarl_node *parent;    /* NULL for the root */
    char *text;            /* scalars: the string, or the spelling of the number/bool/null; NULL for maps/lists */
    bool bool_value;
    int64_t int_value;
    double float_value;
    dsarl_node **items;    /* maps and lists: children in order */
    size_t count, capacity;
    dsarl_origin origin;   /* origin.file and origin.text are owned by the node */
    int resolve_state;     /* interpolation: 0 untouched, 1 in progress, 2 done */
};

typedef struct dsarl_recipe {
    dsarl_node *root;      /* always a map */
} dsarl_recipe;

/* ---- host API (exported for the host binary and tests) -------------------------------------------------- */

/* Loads a YAML recipe file with its `defaults:` chain (NeMo RL semantics) into *out. */
DSARL_API int dsarl_recipe_load_file(const char *path, dsarl_recipe **out, dsarl_error *err);

/* Loads a recipe from a string; name is used as the file in origins; `defaults` are relative to the cwd. */
DSARL_API int dsarl_recipe_load_string(const char *yaml, const char *name, dsarl_recipe **out, dsarl_error *err);

/* Applies one Hydra override (`a.b=v` existing key, `+a.b=v` new, `++a.b=v` either, `~a.b[=v]` delete); index is
 * its 1-based position. A map value merges into an existing map, as Hydra's OmegaConf.update(merge=True) does. */
DSARL_API int dsarl_recipe_override(dsarl_recipe *r, const char *arg, int index, dsarl_error *err);

/* Resolves every `${...}` interpolation and resolver (mul, add, div, max) in place. */
DSARL_API int dsarl_recipe_resolve(dsarl_recipe *r, dsarl_error *err);

/* The root map of the recipe. */
DSARL_API const dsarl_node *dsarl_recipe_root(const dsarl_recipe *r);

/* Frees the recipe and every node (NULL is fine). */
DSARL_API void dsarl_recipe_free(dsarl_recipe *r);

/* Sets path to the value parsed from flow_yaml when path is absent (creating intermediate maps), with origin
 * "default of <origin_text>". Does nothing when path exists or when a parent on the way is not a map. */
DSARL_API int dsarl_recipe_set_default(dsarl_recipe *r, const char *path, const char *flow_yaml,
                                       const char *origin_text, dsarl_error *err);

/* Writes the tree as block YAML that re-loads to the same values; annotate != 0 ends each value line in
 * `  # <where>`. */
DSARL_API int dsarl_recipe_write(const dsarl_recipe *r, FILE *out, int annotate, dsarl_error *err);

/* Writes the recipe (as dsarl_recipe_write) to path atomically: temp file, then rename. */
DSARL_API int dsarl_recipe_write_file(const dsarl_recipe *r, const char *path, int annotate, dsarl_error *err);

/* Deep comparison of two nodes' values (types, scalars, keys and order-insensitive map contents); origins are
 * ignored. For round-trip tests and `~a.b=v`. */
DSARL_API bool dsarl_node_equal(const dsarl_node *a, const dsarl_node *b);

/* Levenshtein distance between two strings (for "did you mean"). */
DSARL_API size_t dsarl_edit_distance(const char *a, const char *b);

/* ---- internal helpers shared by recipe*.c and schema.c (hidden in libdsarl, except the node constructors,
 * which the host and tests use to build trees) ---------------------------------------------------------------- */

/* A new empty node of the given type with a copy of origin (NULL means builtin); NULL when out of memory. */
DSARL_API dsarl_node *recipe_node_new(dsarl_node_type type, const dsarl_origin *origin);

/* Frees a node and its subtree; detaching it from its parent is the caller's job. */
DSARL_API void recipe_node_free(dsarl_node *node);

/* Deep copy (parent and key of the copy are NULL); NULL when out of memory. */
dsarl_node *recipe_node_copy(const dsarl_node *node);

/* Replaces node's origin with a copy of origin; returns 0 or DSARL_E_NOMEM. */
int recipe_node_set_origin(dsarl_node *node, const dsarl_origin *origin);

/* Sets origin on node and every node below it. */
int recipe_node_set_origin_deep(dsarl_node *node, const dsarl_origin *origin);

/* Appends child to a map (with key, copied) or list (key NULL); returns 0 or DSARL_E_NOMEM. */
DSARL_API int recipe_node_append(dsarl_node *parent, const char *key, dsarl_node *child);

/* The index of key in a map, or -1. */
long recipe_map_index(const dsarl_node *map, const char *key);

/* Replaces parent's i-th child by child (the old one is freed); child takes over the old key. */
int recipe_node_replace_at(dsarl_node *parent, size_t i, dsarl_node *child);

/* Removes and frees parent's i-th child. */
void recipe_node_remove_at(dsarl_node *parent, size_t i);

/* Moves the value of src (type, scalar, children) into dst, keeping dst's key, parent and origin; frees src. */
void recipe_node_take_value(dsarl_node *dst, dsarl_node *src);

/* Merges map src into map dst (OmegaConf.merge), consuming src: maps merge key by key, anything else replaces,
 * and a src map with `_override_: true` replaces dst's section whole. Returns 0 or DSARL_E_NOMEM. */
int recipe_merge_maps(dsarl_node *dst, dsarl_node *src);

/* Builds a typed scalar node from the text of a plain YAML scalar (strict rules above). Fails (DSARL_E_INVALID,
 * err holds the reason without location) only for an integer or float out of range. */
int recipe_scalar_from_plain(const char *text, size_t len, const dsarl_origin *origin, dsarl_node **out,
                             dsarl_error *err);

/* The type a plain scalar of this spelling would get (used by the writer to decide when to quote). */
dsarl_node_type recipe_plain_type(const char *text);

/* Makes a string/int/float/bool/null scalar node; NULL when out of memory. */
DSARL_API dsarl_node *recipe_scalar_string(const char *s, const dsarl_origin *origin);
DSARL_API dsarl_node *recipe_scalar_int(int64_t v, const dsarl_origin *origin);
DSARL_API dsarl_node *recipe_scalar_float(double v, const dsarl_origin *origin);
DSARL_API dsarl_node *recipe_scalar_bool(bool v, const dsarl_origin *origin);
DSARL_API dsarl_node *recipe_scalar_null(const dsarl_origin *origin);

/* Shortest spelling of v that reads back as the same double and as a float (".inf", "1.0", "1e-06"). */
void recipe_format_float(double v, char *buf, size_t size);

/* Parses one YAML flow value (override value, plugin default) into a node with the given origin. */
int recipe_parse_value(const char *text, const dsarl_origin *origin, dsarl_node **out, dsarl_error *err);

/* Finds the existing path closest to `path` (same-level keys first, then every full path); NULL if none is
 * near. Returns a pointer into buf. */
const char *recipe_suggest_path(const dsarl_node *root, const char *path, char *buf, size_t size);

#endif /* DSARL_RECIPE_INTERNAL_H */
