/* dsarl/json.h: thin helpers over jansson for config files (HF config.json, safetensors headers, metrics).
 * SDK tier: none. Exported by libdsarl for the core and in-tree plugins only.
 * NOT INSTALLED: in-tree only (core and in-tree plugins), because it exposes jansson's json_t; the installed SDK
 * includes no jansson header (docs/sdk.md). Out-of-tree plugins use jansson (or any JSON reader) directly.
 *
 * The getters turn a wrong or missing value into one sentence naming the file and key, e.g.
 * "config.json: key 'hidden_size' must be an integer, got string". `where` is that prefix (a file name, optionally
 * with the enclosing key: "config.json: rope_scaling"); NULL leaves it out. Users of this header link jansson. */
#ifndef DSARL_JSON_H
#define DSARL_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "dsarl/error.h"

DSARL_BEGIN_DECLS

/* Parses a JSON file (duplicate keys rejected) into *out (caller json_decref's); errors read "path:line:col: why". */
DSARL_API int dsarl_json_load_file(const char *path, json_t **out, dsarl_error *err);

/* Parses n bytes of JSON text (any top-level value); `name` stands in for the file name in errors. */
DSARL_API int dsarl_json_load_buffer(const char *name, const char *text, size_t n, json_t **out, dsarl_error *err);

/* Writes root as JSON plus a trailing newline, atomically; flags are jansson's json_dumps flags (0: compact). */
DSARL_API int dsarl_json_write_file_atomic(const char *path, const json_t *root, size_t flags, dsarl_error *err);

/* "object", "array", "string", "integer", "real", "boolean" or "null" ("missing" for NULL). */
DSARL_API const char *dsarl_json_type_name(const json_t *value);

/* Reads obj[key] as an integer (a JSON real such as 4096.0 is refused). Missing key: DSARL_E_NOT_FOUND. */
DSARL_API int dsarl_json_get_int(const json_t *obj, const char *key, const char *where, int64_t *out,
                                 dsarl_error *err);

/* Reads obj[key] as a number (integer or real). Missing key: DSARL_E_NOT_FOUND. */
DSARL_API int dsarl_json_get_double(const json_t *obj, const char *key, const char *where, double *out,
                                    dsarl_error *err);

/* Reads obj[key] as true/false. Missing key: DSARL_E_NOT_FOUND. */
DSARL_API int dsarl_json_get_bool(const json_t *obj, const char *key, const char *where, int *out, dsarl_error *err);

/* Reads obj[key] as a string; *out borrows from obj. Missing key: DSARL_E_NOT_FOUND. */
DSARL_API int dsarl_json_get_string(const json_t *obj, const char *key, const char *where, const char **out,
                                    dsarl_error *err);

/* Reads obj[key] as an object or array; *out borrows from obj. Missing key: DSARL_E_NOT_FOUND. */
DSARL_API int dsarl_json_get_object(const json_t *obj, const char *key, const char *where, json_t **out,
                                    dsarl_error *err);
DSARL_API int dsarl_json_get_array(const json_t *obj, const char *key, const char *where, json_t **out,
                                   dsarl_error *err);

/* Optional forms: a missing key or a JSON null yields fallback; a present value of the wrong type is an error. */
DSARL_API int dsarl_json_get_int_or(const json_t *obj, const char *key, const char *where, int64_t fallback,
                                    int64_t *out, dsarl_error *err);
DSARL_API int dsarl_json_get_double_or(const json_t *obj, const char *key, const char *where, double fallback,
                                       double *out, dsarl_error *err);
DSARL_API int dsarl_json_get_bool_or(const json_t *obj, const char *key, const char *where, int fallback, int *out,
                                     dsarl_error *err);
DSARL_API int dsarl_json_get_string_or(const json_t *obj, const char *key, const char *where, const char *fallback,
                                       const char **out, dsarl_error *err);

DSARL_END_DECLS

#endif /* DSARL_JSON_H */
