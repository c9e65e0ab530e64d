/* dataset_jsonl.c: DAPO-Math and plain prompt/answer jsonl. One JSON object per line; blank lines are skipped;
 * any other fault fails the whole load with "file:line: key 'k' ...". */
#include "dataset_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "dsarl/fileutil.h"
#include "dsarl/json.h"

/* Reads a {role, content} list at key into a new message array. */
static int read_messages(const json_t *list, const char *path, size_t line, const char *key,
                         dsarl_chat_message **out, size_t *n_out, dsarl_error *err)
{
    size_t n = json_array_size(list);
    if (!json_is_array(list) || n == 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s:%zu: key '%s' must be a non-empty list of {\"role\", "
                          "\"content\"} messages, got %s", path, line, key, dsarl_json_type_name(list));
    dsarl_chat_message *msgs = calloc(n, sizeof *msgs);
    if (!msgs)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s:%zu: out of memory", path, line);
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(list, i);
        const json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        const char *bad = !json_is_object(m) ? "" : !json_is_string(role) ? ".role" : !json_is_string(content) ? ".content" : NULL;
        if (bad) {
            dataset_free_messages(msgs, i);
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s:%zu: key '%s[%zu]%s' must be %s", path, line, key, i, bad,
                              bad[0] ? "a string" : "an object with string role and content");
        }
        msgs[i].role = strdup(json_string_value(role));
        msgs[i].content = strdup(json_string_value(content));
        if (!msgs[i].role || !msgs[i].content) {
            dataset_free_messages(msgs, i + 1);
            return DSARL_FAIL(err, DSARL_E_NOMEM, "%s:%zu: out of memory", path, line);
        }
    }
    *out = msgs;
    *n_out = n;
    return 0;
}

/* A ground truth: a string as is, an integer in decimal (Python's str(int)); anything else is refused. */
static int read_answer(const json_t *v, const char *path, size_t line, const char *key, char **out,
                       dsarl_error *err)
{
    char buf[32];
    const char *s;
    if (json_is_string(v)) {
        s = json_string_value(v);
    } else if (json_is_integer(v)) {
        snprintf(buf, sizeof buf, "%" PRId64, (int64_t)json_integer_value(v));
        s = buf;
    } else {
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s:%zu: key '%s' must be a string or an integer, got %s", path,
                          line, key, v ? dsarl_json_type_name(v) : "nothing (missing)");
    }
    *out = strdup(s);
    return *out ? 0 : DSARL_FAIL(err, DSARL_E_NOMEM, "%s:%zu: out of memory", path, line);
}

typedef struct jsonl_format {
    bool dapo;
    const char *input_key, *output_key;
    const char *task_name;
} jsonl_format;

static int parse_line(dsarl_dataset *ds, const json_t *obj, const char *path, size_t line, const jsonl_format *f,
                      dsarl_error *err)
{
    if (!json_is_object(obj))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s:%zu: each line must be a JSON object, got %s", path, line,
                          dsarl_json_type_name(obj));
    dsarl_chat_message *msgs = NULL;
    size_t n = 0;
    char *answer = NULL;
    if (f->dapo) {
        DSARL_TRY(read_messages(json_object_get(obj, "prompt"), path, line, "prompt", &msgs, &n, err));
        const json_t *rm = json_object_get(obj, "reward_model");
        int rc = json_is_object(rm) ? read_answer(json_object_get(rm, "ground_truth"), path, line,
                                                   "reward_model.ground_truth", &answer, err)
                                    : DSARL_FAIL(err, DSARL_E_INVALID, "%s:%zu: key 'reward_model' must be an "
                                                 "object holding ground_truth, got %s", path, line,
                                                 rm ? dsarl_json_type_name(rm) : "nothing (missing)");
        if (rc < 0) {
            dataset_free_messages(msgs, n);
            return rc;
        }
    } else {
        const json_t *in = json_object_get(obj, f->input_key);
        if (json_is_string(in)) {
            msgs = calloc(1, sizeof *msgs);
            n = 1;
            if (!msgs || !(msgs[0].role = strdup("user")) || !(msgs[0].content = strdup(json_string_value(in)))) {
                dataset_free_messages(msgs, msgs ? 1 : 0);
                return DSARL_FAIL(err, DSARL_E_NOMEM, "%s:%zu: out of memory", path, line);
            }
        } else if (json_is_array(in)) {
            DSARL_TRY(read_messages(in, path, line, f->input_key, &msgs, &n, err));
        } else {
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s:%zu: key '%s' (input_key) must be a string or a list of "
                              "messages, got %s", path, line, f->input_key,
                              in ? dsarl_json_type_name(in) : "nothing (missing)");
        }
        int rc = read_answer(json_object_get(obj, f->output_key), path, line, f->output_key, &answer, err);
        if (rc < 0) {
            dataset_free_messages(msgs, n);
            return rc;
        }
    }
    if (dataset_add(ds, msgs, n, answer, f->task_name) < 0)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s:%zu: out of memory", path, line);
    return 0;
}

static int load_jsonl(const char *path, const jsonl_format *f, dsarl_dataset **out, dsarl_error *err)
{
    *out = NULL;
    void *data;
    size_t size;
    DSARL_TRY(dsarl_read_file(path, &data, &size, err));
    dsarl_dataset *ds = dataset_new();
    if (!ds) {
        free(data);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory", path);
    }
    const char *text = data, *end = text + size;
    size_t line = 0;
    int rc = 0;
    for (const char *p = text; p < end && rc == 0; line++) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        size_t len = eol ? (size_t)(eol - p) : (size_t)(end - p);
        const char *q = p;
        while (q < p + len && (*q == ' ' || *q == '\t' || *q == '\r'))
            q++;
        if (q < p + len) {
            json_error_t jerr;
            json_t *obj = json_loadb(p, len, JSON_REJECT_DUPLICATES, &jerr);
            if (!obj)
                rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s:%zu: not valid JSON (column %d: %s)", path, line + 1,
                                jerr.column, jerr.text);
            else
                rc = parse_line(ds, obj, path, line + 1, f, err);
            json_decref(obj);
        }
        p += len + 1;
    }
    free(data);
    if (rc == 0 && ds->n == 0)
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: holds no examples (every line is blank)", path);
    if (rc < 0) {
        dsarl_dataset_free(ds);
        return rc;
    }
    *out = ds;
    return 0;
}

int dsarl_dataset_load_dapo_jsonl(const char *path, const char *task_name, dsarl_dataset **out, dsarl_error *err)
{
    jsonl_format f = {.dapo = true, .task_name = task_name ? task_name : "math"};
    return load_jsonl(path, &f, out, err);
}

int dsarl_dataset_load_jsonl(const char *path, const char *input_key, const char *output_key, const char *task_name,
                             dsarl_dataset **out, dsarl_error *err)
{
    if (!input_key || !output_key || !input_key[0] || !output_key[0])
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: input_key and output_key must be non-empty key names", path);
    jsonl_format f = {.input_key = input_key, .output_key = output_key, .task_name = task_name ? task_name : "math"};
    return load_jsonl(path, &f, out, err);
}
