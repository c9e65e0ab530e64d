/* json.c: jansson loading with file:line:col errors and typed getters whose errors name the file and key. */
#include "dsarl/json.h"

#include <stdlib.h>
#include <string.h>

#include "dsarl/fileutil.h"

int dsarl_json_load_file(const char *path, json_t **out, dsarl_error *err)
{
    if (!path || !out)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_json_load_file: path and out must not be NULL");
    *out = NULL;
    /* Read it ourselves so a missing file is NOT_FOUND with errno's words, not a parse error. */
    void *text = NULL;
    size_t n = 0;
    DSARL_TRY(dsarl_read_file(path, &text, &n, err));
    int rc = dsarl_json_load_buffer(path, text, n, out, err);
    free(text);
    return rc;
}

int dsarl_json_load_buffer(const char *name, const char *text, size_t n, json_t **out, dsarl_error *err)
{
    if (!out || (!text && n > 0))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_json_load_buffer: text and out must not be NULL");
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(text ? text : "", n, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!root)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s:%d:%d: %s", name ? name : "<json>", jerr.line, jerr.column,
                          jerr.text);
    *out = root;
    return DSARL_OK;
}

int dsarl_json_write_file_atomic(const char *path, const json_t *root, size_t flags, dsarl_error *err)
{
    if (!path || !root)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_json_write_file_atomic: path and root must not be NULL");
    char *text = json_dumps(root, flags | JSON_ENCODE_ANY);
    if (!text)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: jansson could not serialize the JSON value (out of memory or a "
                          "non-finite real)", path);
    size_t n = strlen(text);
    char *with_newline = realloc(text, n + 2);
    if (!with_newline) {
        free(text);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory serializing JSON", path);
    }
    with_newline[n] = '\n';
    with_newline[n + 1] = '\0';
    int rc = dsarl_write_file_atomic(path, with_newline, n + 1, err);
    free(with_newline);
    return rc;
}

const char *dsarl_json_type_name(const json_t *value)
{
    if (!value)
        return "missing";
    switch (json_typeof(value)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "real";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    default: return "unknown";
    }
}

/* Looks key up in obj; fails with a message naming where/key when obj is not an object or key is missing. */
static int lookup(const json_t *obj, const char *key, const char *where, json_t **out, dsarl_error *err)
{
    const char *sep = where ? ": " : "";
    where = where ? where : "";
    if (!key)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s%sjson getter called with a NULL key", where, sep);
    if (!json_is_object(obj))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s%scannot read key '%s': the enclosing value is %s, not an object",
                          where, sep, key, dsarl_json_type_name(obj));
    *out = json_object_get(obj, key);
    if (!*out)
        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s%skey '%s' is missing", where, sep, key);
    return DSARL_OK;
}

static int wrong_type(const char *where, const char *key, const char *wanted, const json_t *got, dsarl_error *err)
{
    return DSARL_FAIL(err, DSARL_E_INVALID, "%s%skey '%s' must be %s, got %s", where ? where : "", where ? ": " : "",
                      key, wanted, dsarl_json_type_name(got));
}

int dsarl_json_get_int(const json_t *obj, const char *key, const char *where, int64_t *out, dsarl_error *err)
{
    json_t *v = NULL;
    DSARL_TRY(lookup(obj, key, where, &v, err));
    if (!json_is_integer(v))
        return wrong_type(where, key, "an integer", v, err);
    *out = (int64_t)json_integer_value(v);
    return DSARL_OK;
}

int dsarl_json_get_double(const json_t *obj, const char *key, const char *where, double *out, dsarl_error *err)
{
    json_t *v = NULL;
    DSARL_TRY(lookup(obj, key, where, &v, err));
    if (!json_is_number(v))
        return wrong_type(where, key, "a number", v, err);
    *out = json_number_value(v);
    return DSARL_OK;
}

int dsarl_json_get_bool(const json_t *obj, const char *key, const char *where, int *out, dsarl_error *err)
{
    json_t *v = NULL;
    DSARL_TRY(lookup(obj, key, where, &v, err));
    if (!json_is_boolean(v))
        return wrong_type(where, key, "true or false", v, err);
    *out = json_is_true(v);
    return DSARL_OK;
}

int dsarl_json_get_string(const json_t *obj, const char *key, const char *where, const char **out, dsarl_error *err)
{
    json_t *v = NULL;
    DSARL_TRY(lookup(obj, key, where, &v, err));
    if (!json_is_string(v))
        return wrong_type(where, key, "a string", v, err);
    *out = json_string_value(v);
    return DSARL_OK;
}

int dsarl_json_get_object(const json_t *obj, const char *key, const char *where, json_t **out, dsarl_error *err)
{
    json_t *v = NULL;
    DSARL_TRY(lookup(obj, key, where, &v, err));
    if (!json_is_object(v))
        return wrong_type(where, key, "an object", v, err);
    *out = v;
    return DSARL_OK;
}

int dsarl_json_get_array(const json_t *obj, const char *key, const char *where, json_t **out, dsarl_error *err)
{
    json_t *v = NULL;
    DSARL_TRY(lookup(obj, key, where, &v, err));
    if (!json_is_array(v))
        return wrong_type(where, key, "an array", v, err);
    *out = v;
    return DSARL_OK;
}

/* True when the optional key is absent or null, so the fallback applies; an enclosing non-object is still an
 * error reported by the required getter. */
static int is_absent(const json_t *obj, const char *key)
{
    if (!json_is_object(obj) || !key)
        return 0;
    json_t *v = json_object_get(obj, key);
    return !v || json_is_null(v);
}

int dsarl_json_get_int_or(const json_t *obj, const char *key, const char *where, int64_t fallback, int64_t *out,
                          dsarl_error *err)
{
    if (is_absent(obj, key)) {
        *out = fallback;
        return DSARL_OK;
    }
    return dsarl_json_get_int(obj, key, where, out, err);
}

int dsarl_json_get_double_or(const json_t *obj, const char *key, const char *where, double fallback, double *out,
                             dsarl_error *err)
{
    if (is_absent(obj, key)) {
        *out = fallback;
        return DSARL_OK;
    }
    return dsarl_json_get_double(obj, key, where, out, err);
}

int dsarl_json_get_bool_or(const json_t *obj, const char *key, const char *where, int fallback, int *out,
                           dsarl_error *err)
{
    if (is_absent(obj, key)) {
        *out = fallback;
        return DSARL_OK;
    }
    return dsarl_json_get_bool(obj, key, where, out, err);
}

int dsarl_json_get_string_or(const json_t *obj, const char *key, const char *where, const char *fallback,
                             const char **out, dsarl_error *err)
{
    if (is_absent(obj, key)) {
        *out = fallback;
        return DSARL_OK;
    }
    return dsarl_json_get_string(obj, key, where, out, err);
}
