/* dataset.c: the example store, NeMo RL-style prompt templates, and building a dataset from a recipe section. */
#include "dataset_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsarl/fileutil.h"

dsarl_dataset *dataset_new(void) { return calloc(1, sizeof(dsarl_dataset)); }

void dataset_free_messages(dsarl_chat_message *messages, size_t n)
{
    for (size_t i = 0; messages && i < n; i++) {
        free((void *)messages[i].role);
        free((void *)messages[i].content);
    }
    free(messages);
}

int dataset_add(dsarl_dataset *ds, dsarl_chat_message *messages, size_t n_messages, char *ground_truth,
                const char *task_name)
{
    char *task = strdup(task_name ? task_name : "math");
    if (ds->n == ds->cap) {
        size_t cap = ds->cap ? ds->cap * 2 : 256;
        dsarl_example *e = realloc(ds->examples, cap * sizeof *e);
        if (e) {
            ds->examples = e;
            ds->cap = cap;
        }
    }
    if (!task || ds->n == ds->cap) {
        free(task);
        dataset_free_messages(messages, n_messages);
        free(ground_truth);
        return DSARL_E_NOMEM;
    }
    ds->examples[ds->n++] = (dsarl_example){.messages = messages, .n_messages = n_messages,
                                            .ground_truth = ground_truth, .task_name = task};
    return 0;
}

size_t dsarl_dataset_size(const dsarl_dataset *ds) { return ds->n; }

const dsarl_example *dsarl_dataset_get(const dsarl_dataset *ds, size_t i) { return i < ds->n ? &ds->examples[i] : NULL; }

void dsarl_dataset_free(dsarl_dataset *ds)
{
    if (!ds)
        return;
    for (size_t i = 0; i < ds->n; i++) {
        dataset_free_messages((dsarl_chat_message *)ds->examples[i].messages, ds->examples[i].n_messages);
        free((void *)ds->examples[i].ground_truth);
        free((void *)ds->examples[i].task_name);
    }
    free(ds->examples);
    free(ds);
}

/* ---- prompt templates ------------------------------------------------------------------------------------- */

/* Python's template.format(problem) for the subset prompt files use: "{}" / "{0}" -> problem, "{{" -> "{",
 * "}}" -> "}". Returns a malloc'd string, or NULL with *bad set to the offset of an unsupported brace. */
static char *format_prompt(const char *tmpl, const char *problem, size_t *bad)
{
    *bad = (size_t)-1;
    size_t plen = strlen(problem), cap = strlen(tmpl) + 1;
    for (const char *p = tmpl; (p = strchr(p, '{')) != NULL; p++)
        cap += plen;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    size_t n = 0;
    for (const char *p = tmpl; *p;) {
        if ((p[0] == '{' && p[1] == '{') || (p[0] == '}' && p[1] == '}')) {
            out[n++] = *p;
            p += 2;
        } else if (strncmp(p, "{}", 2) == 0 || strncmp(p, "{0}", 3) == 0) {
            memcpy(out + n, problem, plen);
            n += plen;
            p += p[1] == '}' ? 2 : 3;
        } else if (*p == '{' || *p == '}') {
            *bad = (size_t)(p - tmpl);
            free(out);
            return NULL;
        } else {
            out[n++] = *p++;
        }
    }
    out[n] = '\0';
    return out;
}

int dsarl_dataset_apply_prompt(dsarl_dataset *ds, const char *prompt_template, const char *system_prompt,
                               const char *where, dsarl_error *err)
{
    if (!where)
        where = "prompt template";
    for (size_t i = 0; i < ds->n; i++) {
        dsarl_example *e = &ds->examples[i];
        dsarl_chat_message *msgs = (dsarl_chat_message *)e->messages;
        if (prompt_template) {
            size_t u = e->n_messages;
            while (u > 0 && strcmp(msgs[u - 1].role, "user") != 0)
                u--;
            if (u == 0)
                return DSARL_FAIL(err, DSARL_E_INVALID, "%s: example %zu has no user message to put into the "
                                  "template", where, i);
            size_t bad;
            char *content = format_prompt(prompt_template, msgs[u - 1].content, &bad);
            if (!content && bad != (size_t)-1)
                return DSARL_FAIL(err, DSARL_E_INVALID, "%s: unsupported brace at offset %zu; a prompt template "
                                  "may hold only {} (or {0}) for the problem and {{ }} for literal braces", where,
                                  bad);
            if (!content)
                return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory", where);
            free((void *)msgs[u - 1].content);
            msgs[u - 1].content = content;
        }
        if (system_prompt) {
            dsarl_chat_message *grown = realloc(msgs, (e->n_messages + 1) * sizeof *grown);
            char *role = strdup("system"), *content = strdup(system_prompt);
            if (!grown || !role || !content) {
                free(role);
                free(content);
                if (grown)
                    e->messages = grown;
                return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory", where);
            }
            memmove(grown + 1, grown, e->n_messages * sizeof *grown);
            grown[0] = (dsarl_chat_message){.role = role, .content = content};
            e->messages = grown;
            e->n_messages++;
        }
    }
    return 0;
}

static int read_text_file(const char *path, char **out, dsarl_error *err)
{
    void *data;
    size_t size;
    DSARL_TRY(dsarl_read_file(path, &data, &size, err));
    char *s = malloc(size + 1);
    if (!s) {
        free(data);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory", path);
    }
    memcpy(s, data, size);
    s[size] = '\0';
    free(data);
    if (strlen(s) != size) {
        free(s);
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: contains a NUL byte; a prompt file must be text", path);
    }
    *out = s;
    return 0;
}

int dsarl_dataset_apply_prompt_files(dsarl_dataset *ds, const char *prompt_file, const char *system_prompt_file,
                                     dsarl_error *err)
{
    char *tmpl = NULL, *sys = NULL;
    int rc = prompt_file ? read_text_file(prompt_file, &tmpl, err) : 0;
    if (rc == 0 && system_prompt_file)
        rc = read_text_file(system_prompt_file, &sys, err);
    if (rc == 0)
        rc = dsarl_dataset_apply_prompt(ds, tmpl, sys, prompt_file, err);
    free(tmpl);
    free(sys);
    return rc;
}

/* ---- from a recipe ---------------------------------------------------------------------------------------- */

static const dsarl_key_spec dataset_keys[] = {
    {"data.*.dataset_name", DSARL_KEY_STRING, NULL,
     "arithmetic (built in) | DAPOMath17K, DAPOMathAIME2024, dapo (DAPO jsonl at data_path) | null (plain jsonl)",
     DSARL_KEY_NULLABLE},
    {"data.*.data_path", DSARL_KEY_STRING, NULL, "local jsonl file (dsarl downloads nothing)", DSARL_KEY_NULLABLE},
    {"data.*.input_key", DSARL_KEY_STRING, NULL, "plain jsonl: key of the prompt (string or messages); \"input\"",
     DSARL_KEY_NULLABLE},
    {"data.*.output_key", DSARL_KEY_STRING, NULL, "plain jsonl: key of the ground truth; \"output\"",
     DSARL_KEY_NULLABLE},
    {"data.*.seed", DSARL_KEY_INT, NULL, "arithmetic: generator seed", DSARL_KEY_NULLABLE},
    {"data.*.task_name", DSARL_KEY_STRING, NULL, "task name of every example (default math)", DSARL_KEY_NULLABLE},
    {"data.*.prompt_file", DSARL_KEY_STRING, NULL, "template file with {} for the problem (Python str.format)",
     DSARL_KEY_NULLABLE},
    {"data.*.system_prompt_file", DSARL_KEY_STRING, NULL, "file whose text becomes a leading system message",
     DSARL_KEY_NULLABLE},
    {"data.*.arithmetic", DSARL_KEY_MAP, NULL, "knobs of the built-in arithmetic task",
     DSARL_KEY_NULLABLE | DSARL_KEY_OWNED},
    {"data.*.arithmetic.num_examples", DSARL_KEY_INT, NULL, "distinct problems in this split (1024)", 0},
    {"data.*.arithmetic.min_digits", DSARL_KEY_INT, NULL, "fewest digits per operand (1)", 0},
    {"data.*.arithmetic.max_digits", DSARL_KEY_INT, NULL, "most digits per operand (2, at most 9)", 0},
    {"data.*.arithmetic.num_operands", DSARL_KEY_INT, NULL, "operands per problem (2..8)", 0},
    {"data.*.arithmetic.operators", DSARL_KEY_STRING, NULL, "operators to draw from: any of + - * (\"+-\")", 0},
    {"data.*.arithmetic.function", DSARL_KEY_STRING, NULL, "max or min: the problem is that function of the operands "
     "(\"max(4,8,2)\"); null: operators join them", DSARL_KEY_NULLABLE},
    {"data.*.arithmetic.min_answer", DSARL_KEY_INT, NULL, "smallest allowed answer (-1e9)", 0},
    {"data.*.arithmetic.max_answer", DSARL_KEY_INT, NULL, "largest allowed answer (1e9)", 0},
    {"data.*.arithmetic.validation_fraction", DSARL_KEY_FLOAT, NULL, "share of problems held out for validation "
     "(0.1)", 0},
    {"data.*.arithmetic.prompt_format", DSARL_KEY_STRING, NULL, "problem text with {} for the expression", 0},
};

const dsarl_key_spec *dsarl_dataset_keys(size_t *n)
{
    *n = sizeof dataset_keys / sizeof *dataset_keys;
    return dataset_keys;
}

/* "<section>.<key>" into buf. */
static const char *key_path(char *buf, size_t size, const char *section, const char *key)
{
    snprintf(buf, size, "%s.%s", section, key);
    return buf;
}

static int read_int_knob(const dsarl_node *root, const char *section, const char *key, int64_t *value,
                         dsarl_error *err)
{
    char path[256];
    snprintf(path, sizeof path, "%s.arithmetic.%s", section, key);
    return dsarl_recipe_int_or(root, path, *value, value, err);
}

static int arithmetic_from_recipe(const dsarl_node *root, const char *section, dsarl_split split,
                                  const char *task_name, dsarl_dataset **out, dsarl_error *err)
{
    dsarl_arithmetic_config cfg;
    dsarl_arithmetic_config_default(&cfg);
    char path[256];
    int64_t seed = (int64_t)cfg.seed, min_digits = cfg.min_digits, max_digits = cfg.max_digits,
            operands = cfg.num_operands;
    DSARL_TRY(dsarl_recipe_int_or(root, key_path(path, sizeof path, section, "seed"), seed, &seed, err));
    DSARL_TRY(read_int_knob(root, section, "num_examples", &cfg.num_examples, err));
    DSARL_TRY(read_int_knob(root, section, "min_digits", &min_digits, err));
    DSARL_TRY(read_int_knob(root, section, "max_digits", &max_digits, err));
    DSARL_TRY(read_int_knob(root, section, "num_operands", &operands, err));
    DSARL_TRY(read_int_knob(root, section, "min_answer", &cfg.min_answer, err));
    DSARL_TRY(read_int_knob(root, section, "max_answer", &cfg.max_answer, err));
    snprintf(path, sizeof path, "%s.arithmetic.operators", section);
    DSARL_TRY(dsarl_recipe_string_or(root, path, cfg.operators, &cfg.operators, err));
    snprintf(path, sizeof path, "%s.arithmetic.function", section);
    DSARL_TRY(dsarl_recipe_string_or(root, path, cfg.function, &cfg.function, err));
    snprintf(path, sizeof path, "%s.arithmetic.prompt_format", section);
    DSARL_TRY(dsarl_recipe_string_or(root, path, cfg.prompt_format, &cfg.prompt_format, err));
    snprintf(path, sizeof path, "%s.arithmetic.validation_fraction", section);
    DSARL_TRY(dsarl_recipe_double_or(root, path, cfg.validation_fraction, &cfg.validation_fraction, err));
    cfg.seed = (uint64_t)seed;
    // Keep the int fields in range before narrowing; the check below gives the sentence.
    cfg.min_digits = min_digits < 0 || min_digits > 100 ? -1 : (int)min_digits;
    cfg.max_digits = max_digits < 0 || max_digits > 100 ? -1 : (int)max_digits;
    cfg.num_operands = operands < 0 || operands > 100 ? -1 : (int)operands;
    if (task_name)
        cfg.task_name = task_name;
    const char *field;
    char why[256];
    if (dataset_arithmetic_check(&cfg, &field, why, sizeof why) < 0) {
        snprintf(path, sizeof path, "%s.arithmetic.%s", section, field);
        if (dsarl_node_get(root, path))
            return dsarl_recipe_fail(root, path, err, DSARL_E_INVALID, "%s", why);
        return DSARL_FAIL(err, DSARL_E_INVALID, "recipe key %s (default) %s", path, why);
    }
    return dsarl_dataset_arithmetic(&cfg, split, out, err);
}

/* The section's own value of key, else data.default's; NULL when neither is set. */
static int section_or_default(const dsarl_node *root, const char *section, const char *key, const char **out,
                              dsarl_error *err)
{
    char path[256];
    DSARL_TRY(dsarl_recipe_string_or(root, key_path(path, sizeof path, section, key), NULL, out, err));
    if (!*out)
        DSARL_TRY(dsarl_recipe_string_or(root, key_path(path, sizeof path, "data.default", key), NULL, out, err));
    return 0;
}

int dsarl_dataset_from_recipe(const dsarl_node *root, const char *section, dsarl_split split, dsarl_dataset **out,
                              dsarl_error *err)
{
    *out = NULL;
    char path[256];
    const char *name = NULL, *data_path = NULL, *task_name = NULL;
    DSARL_TRY(dsarl_recipe_string_or(root, key_path(path, sizeof path, section, "dataset_name"), NULL, &name, err));
    DSARL_TRY(dsarl_recipe_string_or(root, key_path(path, sizeof path, section, "data_path"), NULL, &data_path, err));
    DSARL_TRY(dsarl_recipe_string_or(root, key_path(path, sizeof path, section, "task_name"), NULL, &task_name, err));
    dsarl_dataset *ds = NULL;
    if (name && strcmp(name, "arithmetic") == 0) {
        DSARL_TRY(arithmetic_from_recipe(root, section, split, task_name, &ds, err));
    } else if (name && (strcmp(name, "DAPOMath17K") == 0 || strcmp(name, "DAPOMathAIME2024") == 0 ||
                        strcmp(name, "dapo") == 0)) {
        if (!data_path)
            return dsarl_recipe_fail(root, key_path(path, sizeof path, section, "dataset_name"), err,
                                     DSARL_E_INVALID, "is %s, which dsarl does not download; set %s.data_path "
                                     "to a local DAPO-Math jsonl (prompt messages + reward_model.ground_truth)",
                                     name, section);
        if (dsarl_dataset_load_dapo_jsonl(data_path, task_name, &ds, err) < 0)
            return dsarl_error_prefix(err, "%s.data_path", section);
    } else if (!name || strcmp(name, "ResponseDataset") == 0) {
        if (!data_path)
            return DSARL_FAIL(err, DSARL_E_INVALID, "recipe section %s sets neither dataset_name nor data_path; use "
                              "dataset_name: arithmetic, or data_path: FILE.jsonl with input_key/output_key",
                              section);
        const char *input_key, *output_key;
        DSARL_TRY(dsarl_recipe_string_or(root, key_path(path, sizeof path, section, "input_key"), "input",
                                         &input_key, err));
        DSARL_TRY(dsarl_recipe_string_or(root, key_path(path, sizeof path, section, "output_key"), "output",
                                         &output_key, err));
        if (dsarl_dataset_load_jsonl(data_path, input_key, output_key, task_name, &ds, err) < 0)
            return dsarl_error_prefix(err, "%s.data_path", section);
    } else {
        return dsarl_recipe_fail(root, key_path(path, sizeof path, section, "dataset_name"), err, DSARL_E_INVALID,
                                 "is '%s'; dsarl knows arithmetic, DAPOMath17K, DAPOMathAIME2024, dapo (with "
                                 "data_path) or null/ResponseDataset (plain jsonl at data_path)", name);
    }
    const char *prompt_file = NULL, *system_file = NULL;
    int rc = section_or_default(root, section, "prompt_file", &prompt_file, err);
    if (rc == 0)
        rc = section_or_default(root, section, "system_prompt_file", &system_file, err);
    if (rc == 0 && (prompt_file || system_file))
        rc = dsarl_dataset_apply_prompt_files(ds, prompt_file, system_file, err);
    if (rc < 0) {
        dsarl_dataset_free(ds);
        return rc;
    }
    *out = ds;
    return 0;
}
