/* tokenizer_chat.c: chat templates. The tokenizer's own Jinja templates (found beside tokenizer.json the way
 * transformers finds them, compiled at load) render through the Jinja subset (jinja_*.c) with the variables
 * transformers passes: messages, tools, documents, add_generation_prompt, the special token strings, then the
 * caller's extra kwargs. The built-ins glm, plain and none stay for tokenizers that bring no template. */
#include "tokenizer_internal.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsarl/fileutil.h"
#include "dsarl/json.h"
#include "dsarl/recipe.h"
#include "jinja_internal.h"

/* A template bigger than this is no chat template (the largest published ones are ~20 KiB). */
#define CHAT_TEMPLATE_MAX_BYTES ((size_t)1 << 20)

struct tokenizer_chat_template {
    char *name;               /* "default", "tool_use", ... */
    jinja_template *compiled; /* NULL when refused */
    dsarl_error error;        /* why it was refused */
};

static const char *const special_keys[7] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                            "pad_token", "cls_token", "mask_token"};

/* ---- loading ---------------------------------------------------------------------------------------------- */

/* Adds or replaces the template called name, compiled from source; a refusal is kept, not returned. */
static int add_template(dsarl_tokenizer *tok, const char *name, const char *origin, const char *source, size_t len,
                        dsarl_error *err)
{
    struct tokenizer_chat_template *t = NULL;
    for (size_t i = 0; i < tok->n_templates; i++)
        if (!strcmp(tok->templates[i].name, name))
            t = &tok->templates[i];
    if (!t) {
        struct tokenizer_chat_template *p = realloc(tok->templates, (tok->n_templates + 1) * sizeof *p);
        if (!p)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "tokenizer: out of memory reading chat templates");
        tok->templates = p;
        t = &p[tok->n_templates++];
        memset(t, 0, sizeof *t);
        if (!(t->name = strdup(name)))
            return DSARL_FAIL(err, DSARL_E_NOMEM, "tokenizer: out of memory reading chat templates");
    }
    jinja_template_free(t->compiled);
    t->compiled = NULL;
    memset(&t->error, 0, sizeof t->error);
    if (len > CHAT_TEMPLATE_MAX_BYTES)
        DSARL_FAIL(&t->error, DSARL_E_INVALID,
                   "chat template %s is %zu bytes, more than the %zu a chat template may "
                   "have",
                   origin, len, CHAT_TEMPLATE_MAX_BYTES);
    else if (jinja_compile(origin, source, len, &t->compiled, &t->error) == DSARL_E_NOMEM)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s", t->error.message);
    return 0;
}

static int add_template_file(dsarl_tokenizer *tok, const char *name, const char *path, dsarl_error *err)
{
    void *data;
    size_t size;
    DSARL_TRY(dsarl_read_file(path, &data, &size, err));
    int rc = add_template(tok, name, path, data, size, err);
    free(data);
    return rc;
}

static int load_config_templates(dsarl_tokenizer *tok, const json_t *config, const char *config_path, dsarl_error *err)
{
    const json_t *ct = json_object_get(config, "chat_template");
    char origin[4200];
    if (!ct || json_is_null(ct))
        return 0;
    if (json_is_string(ct)) {
        snprintf(origin, sizeof origin, "%s chat_template", config_path);
        return add_template(tok, "default", origin, json_string_value(ct), json_string_length(ct), err);
    }
    if (!json_is_array(ct))
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "%s: chat_template must be a string or a list of {\"name\", "
                          "\"template\"} objects, got %s",
                          config_path, dsarl_json_type_name(ct));
    size_t i;
    const json_t *item;
    json_array_foreach(ct, i, item)
    {
        const json_t *name = json_object_get(item, "name"), *text = json_object_get(item, "template");
        if (!json_is_string(name) || !json_is_string(text))
            return DSARL_FAIL(err, DSARL_E_INVALID,
                              "%s: chat_template[%zu] must be an object with string keys "
                              "\"name\" and \"template\"",
                              config_path, i);
        snprintf(origin, sizeof origin, "%s chat_template[%zu] '%s'", config_path, i, json_string_value(name));
        DSARL_TRY(
            add_template(tok, json_string_value(name), origin, json_string_value(text), json_string_length(text), err));
    }
    return 0;
}

static int set_special(dsarl_tokenizer *tok, size_t k, const char *text, dsarl_error *err)
{
    free(tok->special_strings[k]);
    tok->special_strings[k] = text ? strdup(text) : NULL;
    if (text && !tok->special_strings[k])
        return DSARL_FAIL(err, DSARL_E_NOMEM, "tokenizer: out of memory");
    return 0;
}

int tokenizer_chat_load(dsarl_tokenizer *tok, const char *dir, const char *config_path, dsarl_error *err)
{
    if (!config_path) { // no config: the ids the tokenizer found stand for bos/eos/pad
        int32_t ids[7] = {tok->bos, tok->eos, -1, -1, tok->pad, -1, -1};
        for (size_t k = 0; k < 7; k++)
            if (ids[k] >= 0 && ids[k] < tok->vocab_size && tok->tokens[ids[k]])
                DSARL_TRY(set_special(tok, k, tok->tokens[ids[k]], err));
    } else {
        json_t *config;
        DSARL_TRY(dsarl_json_load_file(config_path, &config, err));
        int rc = 0;
        for (size_t k = 0; k < 7 && rc == 0; k++) {
            const json_t *v = json_object_get(config, special_keys[k]);
            if (json_is_object(v))
                v = json_object_get(v, "content");
            if (json_is_string(v))
                rc = set_special(tok, k, json_string_value(v), err);
        }
        if (rc == 0)
            rc = load_config_templates(tok, config, config_path, err);
        json_decref(config);
        DSARL_TRY(rc);
    }
    if (!dir)
        return 0;
    char *file = dsarl_path_join(dir, "chat_template.jinja");
    int rc = file ? 0 : DSARL_FAIL(err, DSARL_E_NOMEM, "tokenizer: out of memory");
    if (rc == 0 && dsarl_path_exists(file))
        rc = add_template_file(tok, "default", file, err);
    free(file);
    char *extra = rc == 0 ? dsarl_path_join(dir, "additional_chat_templates") : NULL;
    DIR *d = extra ? opendir(extra) : NULL;
    for (struct dirent *e; rc == 0 && d && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n <= 6 || strcmp(e->d_name + n - 6, ".jinja") != 0)
            continue;
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(n - 6), e->d_name);
        char *path = dsarl_path_join(extra, e->d_name);
        rc = path ? add_template_file(tok, name, path, err) : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
        free(path);
    }
    if (d)
        closedir(d);
    free(extra);
    return rc;
}

void tokenizer_chat_free(dsarl_tokenizer *tok)
{
    for (size_t i = 0; i < tok->n_templates; i++) {
        free(tok->templates[i].name);
        jinja_template_free(tok->templates[i].compiled);
    }
    free(tok->templates);
    for (size_t k = 0; k < 7; k++)
        free(tok->special_strings[k]);
    json_decref(tok->chat_kwargs);
}

/* A recipe value as JSON (scalars keep the type the recipe parser gave them). */
static json_t *node_to_json(const dsarl_node *n, int depth)
{
    if (depth > 64)
        return NULL;
    switch (dsarl_node_kind(n)) {
    case DSARL_NODE_NULL: return json_null();
    case DSARL_NODE_BOOL: return json_boolean(dsarl_node_as_bool(n));
    case DSARL_NODE_INT: return json_integer((json_int_t)dsarl_node_as_int(n));
    case DSARL_NODE_FLOAT: return json_real(dsarl_node_as_double(n));
    case DSARL_NODE_STRING: return json_string(dsarl_node_text(n));
    case DSARL_NODE_LIST: {
        json_t *a = json_array();
        for (size_t i = 0; a && i < dsarl_node_count(n); i++) {
            json_t *x = node_to_json(dsarl_node_child_at(n, i), depth + 1);
            if (!x || json_array_append_new(a, x) < 0) {
                json_decref(a);
                return NULL;
            }
        }
        return a;
    }
    case DSARL_NODE_MAP: {
        json_t *o = json_object();
        for (size_t i = 0; o && i < dsarl_node_count(n); i++) {
            json_t *x = node_to_json(dsarl_node_child_at(n, i), depth + 1);
            if (!x || json_object_set_new(o, dsarl_node_key_at(n, i), x) < 0) {
                json_decref(o);
                return NULL;
            }
        }
        return o;
    }
    }
    return NULL;
}

int dsarl_tokenizer_set_chat_kwargs_from_recipe(dsarl_tokenizer *tok, const dsarl_node *root, const char *path,
                                                dsarl_error *err)
{
    const dsarl_node *n = root && path ? dsarl_node_get(root, path) : NULL;
    json_decref(tok->chat_kwargs);
    tok->chat_kwargs = NULL;
    if (!n || dsarl_node_kind(n) == DSARL_NODE_NULL)
        return 0;
    char where[512];
    if (dsarl_node_kind(n) != DSARL_NODE_MAP)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "%s (%s): must be a map of chat template variables such as "
                          "{enable_thinking: false}, got a %s",
                          path, dsarl_node_where(n, where, sizeof where), dsarl_node_type_name(dsarl_node_kind(n)));
    if (!(tok->chat_kwargs = node_to_json(n, 0)))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s (%s): nests deeper than 64 levels or is out of memory", path,
                          dsarl_node_where(n, where, sizeof where));
    return 0;
}

/* ---- choosing ------------------------------------------------------------------------------------------- */

static const struct tokenizer_chat_template *find_template(const dsarl_tokenizer *tok, const char *name)
{
    for (size_t i = 0; i < tok->n_templates; i++)
        if (!strcmp(tok->templates[i].name, name))
            return &tok->templates[i];
    return NULL;
}

int dsarl_tokenizer_has_chat_template(const dsarl_tokenizer *tok)
{
    return tok->n_templates > 0;
}

const char *dsarl_tokenizer_default_template(const dsarl_tokenizer *tok)
{
    return tok->n_templates ? "tokenizer" : tok->default_template;
}

typedef enum builtin_kind { BUILTIN_GLM, BUILTIN_PLAIN, BUILTIN_NONE, NOT_BUILTIN } builtin_kind;

static builtin_kind builtin_of(const char *name)
{
    return !strcmp(name, "glm")     ? BUILTIN_GLM
           : !strcmp(name, "plain") ? BUILTIN_PLAIN
           : !strcmp(name, "none")  ? BUILTIN_NONE
                                    : NOT_BUILTIN;
}

static bool is_template_path(const char *name)
{
    size_t n = strlen(name);
    return n > 6 && strcmp(name + n - 6, ".jinja") == 0;
}

/* What a template name means: a built-in (*builtin), the tokenizer's compiled template (*compiled), or a file
 * compiled now (*owned, the caller frees it). with_tools picks "tool_use" over "default" as transformers does. */
static int resolve(const dsarl_tokenizer *tok, const char *template_name, bool with_tools, builtin_kind *builtin,
                   const jinja_template **compiled, jinja_template **owned, dsarl_error *err)
{
    *builtin = NOT_BUILTIN;
    *compiled = NULL;
    *owned = NULL;
    const char *name = template_name ? template_name : "default";
    if (builtin_of(name) != NOT_BUILTIN) {
        *builtin = builtin_of(name);
        return 0;
    }
    if (is_template_path(name)) {
        void *data;
        size_t size;
        DSARL_TRY(dsarl_read_file(name, &data, &size, err));
        int rc = size > CHAT_TEMPLATE_MAX_BYTES ? DSARL_FAIL(err, DSARL_E_INVALID,
                                                             "chat template %s is %zu bytes, more than the %zu a chat "
                                                             "template may have",
                                                             name, size, CHAT_TEMPLATE_MAX_BYTES)
                                                : jinja_compile(name, data, size, owned, err);
        free(data);
        *compiled = *owned;
        return rc;
    }
    const struct tokenizer_chat_template *t = NULL;
    if (!strcmp(name, "default") || !strcmp(name, "tokenizer")) {
        t = with_tools ? find_template(tok, "tool_use") : NULL;
        if (!t)
            t = find_template(tok, "default");
        if (!t && !strcmp(name, "default")) {
            *builtin = builtin_of(tok->default_template);
            return 0;
        }
        if (!t)
            return DSARL_FAIL(err, DSARL_E_INVALID,
                              "chat template 'tokenizer': this tokenizer brings no chat "
                              "template (no chat_template in tokenizer_config.json, no chat_template.jinja); use "
                              "glm, plain, none or a .jinja file");
    } else if (!(t = find_template(tok, name))) {
        char names[512] = "";
        for (size_t i = 0; i < tok->n_templates; i++) {
            size_t used = strlen(names);
            snprintf(names + used, sizeof names - used, ", %s", tok->templates[i].name);
        }
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "chat template '%s' is unknown; use default, tokenizer, glm, plain, "
                          "none, a .jinja file%s%s",
                          name, tok->n_templates ? " or one of the tokenizer's" : "", names);
    }
    if (!t->compiled) {
        if (err)
            *err = t->error;
        return t->error.code ? t->error.code : DSARL_E_INTERNAL;
    }
    *compiled = t->compiled;
    return 0;
}

/* ---- built-ins -------------------------------------------------------------------------------------------- */

typedef struct text_buf {
    char *data;
    size_t len, cap;
    bool oom;
} text_buf;

static void tb_puts(text_buf *b, const char *s)
{
    size_t n = strlen(s);
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n + 1);
    b->len += n;
}

static int render_builtin(builtin_kind kind, const dsarl_chat_message *messages, size_t n_messages,
                          int add_generation_prompt, char **out, dsarl_error *err)
{
    text_buf b = {0};
    tb_puts(&b, "");
    if (kind == BUILTIN_GLM)
        tb_puts(&b, "[gMASK]<sop>");
    for (size_t i = 0; i < n_messages; i++) {
        const char *role = messages[i].role, *content = messages[i].content;
        if (!role || !role[0] || !content) {
            free(b.data);
            return DSARL_FAIL(err, DSARL_E_INVALID, "chat template: message %zu needs a role and a content", i);
        }
        if (kind == BUILTIN_GLM) {
            tb_puts(&b, "<|");
            tb_puts(&b, role);
            tb_puts(&b, "|>\n");
            tb_puts(&b, content);
        } else if (kind == BUILTIN_PLAIN) {
            char capital[2] = {role[0] >= 'a' && role[0] <= 'z' ? (char)(role[0] - 'a' + 'A') : role[0], '\0'};
            tb_puts(&b, capital);
            tb_puts(&b, role + 1);
            tb_puts(&b, ": ");
            tb_puts(&b, content);
            tb_puts(&b, "\n");
        } else {
            tb_puts(&b, content);
        }
    }
    if (add_generation_prompt && kind == BUILTIN_GLM)
        tb_puts(&b, "<|assistant|>\n");
    else if (add_generation_prompt && kind == BUILTIN_PLAIN)
        tb_puts(&b, "Assistant:");
    if (b.oom) {
        free(b.data);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "chat template: out of memory");
    }
    *out = b.data;
    return 0;
}

/* ---- Jinja ------------------------------------------------------------------------------------------------ */

/* transformers copies a message's reasoning under the names templates read: {"thinking": r, **message,
 * "reasoning_content": r}, r the first non-null of reasoning_content, thinking, reasoning. */
static json_t *alias_reasoning(json_t *message)
{
    static const char *const fields[] = {"reasoning_content", "thinking", "reasoning"};
    json_t *r = NULL;
    for (size_t i = 0; i < 3 && !r; i++) {
        json_t *v = json_object_get(message, fields[i]);
        if (v && !json_is_null(v))
            r = v;
    }
    if (!r)
        return json_incref(message);
    json_t *out = json_object();
    const char *key;
    json_t *v;
    if (!out || json_object_set(out, "thinking", r) < 0)
        return json_decref(out), NULL;
    json_object_foreach(message, key, v)
    {
        if (json_object_set(out, key, v) < 0)
            return json_decref(out), NULL;
    }
    if (json_object_set(out, "reasoning_content", r) < 0)
        return json_decref(out), NULL;
    return out;
}

static int render_jinja(const dsarl_tokenizer *tok, const jinja_template *t, json_t *messages, json_t *tools,
                        json_t *kwargs, int add_generation_prompt, char **out, dsarl_error *err)
{
    json_t *vars = json_object(), *aliased = json_array();
    int rc = vars && aliased ? 0 : DSARL_FAIL(err, DSARL_E_NOMEM, "chat template: out of memory");
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m)
    {
        if (rc)
            break;
        json_t *a = alias_reasoning(m);
        if (!a || json_array_append_new(aliased, a) < 0)
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "chat template: out of memory");
    }
    if (rc == 0 && (json_object_set(vars, "messages", aliased) < 0 ||
                    json_object_set_new(vars, "tools", tools ? json_incref(tools) : json_null()) < 0 ||
                    json_object_set_new(vars, "documents", json_null()) < 0 ||
                    json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt)) < 0))
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "chat template: out of memory");
    for (size_t k = 0; rc == 0 && k < 7; k++)
        if (tok->special_strings[k] &&
            json_object_set_new(vars, special_keys[k], json_string(tok->special_strings[k])) < 0)
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "chat template: out of memory");
    const char *key;
    json_t *v;
    json_t *sources[2] = {tok->chat_kwargs, kwargs};
    for (int src = 0; src < 2; src++)
        if (rc == 0 && sources[src])
            json_object_foreach(sources[src], key, v)
            {
                if (!strcmp(key, "messages") || !strcmp(key, "tools") || !strcmp(key, "documents") ||
                    !strcmp(key, "add_generation_prompt")) {
                    rc = DSARL_FAIL(err, DSARL_E_INVALID,
                                    "chat template kwargs: '%s' is set by the renderer itself; "
                                    "remove it from the kwargs",
                                    key);
                    break;
                }
                if (json_object_set(vars, key, v) < 0) {
                    rc = DSARL_FAIL(err, DSARL_E_NOMEM, "chat template: out of memory");
                    break;
                }
            }
    if (rc == 0) {
        jinja_limits limits = jinja_default_limits();
        rc = jinja_render(t, vars, &limits, out, NULL, err);
    }
    json_decref(aliased);
    json_decref(vars);
    return rc;
}

static int parse_json_arg(const char *what, const char *text, json_type want, json_t **out, dsarl_error *err)
{
    *out = NULL;
    if (!text)
        return 0;
    json_error_t je;
    json_t *j = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!j)
        return DSARL_FAIL(err, DSARL_E_INVALID, "chat template %s: not JSON (line %d: %s)", what, je.line, je.text);
    if (json_is_null(j))
        return json_decref(j), 0;
    if (json_typeof(j) != want) {
        json_decref(j);
        return DSARL_FAIL(err, DSARL_E_INVALID, "chat template %s: must be a JSON %s", what,
                          want == JSON_ARRAY ? "array" : "object");
    }
    *out = j;
    return 0;
}

static json_t *messages_to_json(const dsarl_chat_message *messages, size_t n_messages, dsarl_error *err)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n_messages; i++) {
        if (!messages[i].role || !messages[i].role[0] || !messages[i].content) {
            json_decref(a);
            DSARL_FAIL(err, DSARL_E_INVALID, "chat template: message %zu needs a role and a content", i);
            return NULL;
        }
        json_t *m = json_pack("{s:s, s:s}", "role", messages[i].role, "content", messages[i].content);
        if (!m || json_array_append_new(a, m) < 0) {
            json_decref(a);
            DSARL_FAIL(err, DSARL_E_NOMEM, "chat template: out of memory");
            return NULL;
        }
    }
    if (!a)
        DSARL_FAIL(err, DSARL_E_NOMEM, "chat template: out of memory");
    return a;
}

int dsarl_tokenizer_apply_chat_template_kwargs(const dsarl_tokenizer *tok, const char *template_name,
                                               const dsarl_chat_message *messages, size_t n_messages,
                                               int add_generation_prompt, const char *kwargs_json, char **out,
                                               dsarl_error *err)
{
    *out = NULL;
    builtin_kind builtin;
    const jinja_template *compiled;
    jinja_template *owned;
    DSARL_TRY(resolve(tok, template_name, false, &builtin, &compiled, &owned, err));
    if (builtin != NOT_BUILTIN)
        return render_builtin(builtin, messages, n_messages, add_generation_prompt, out, err);
    json_t *kwargs = NULL, *msgs = NULL;
    int rc = parse_json_arg("kwargs", kwargs_json, JSON_OBJECT, &kwargs, err);
    if (rc == 0 && !(msgs = messages_to_json(messages, n_messages, err)))
        rc = err ? err->code : DSARL_E_INVALID;
    if (rc == 0)
        rc = render_jinja(tok, compiled, msgs, NULL, kwargs, add_generation_prompt, out, err);
    json_decref(msgs);
    json_decref(kwargs);
    jinja_template_free(owned);
    return rc;
}

int dsarl_tokenizer_apply_chat_template(const dsarl_tokenizer *tok, const char *template_name,
                                        const dsarl_chat_message *messages, size_t n_messages,
                                        int add_generation_prompt, char **out, dsarl_error *err)
{
    return dsarl_tokenizer_apply_chat_template_kwargs(tok, template_name, messages, n_messages, add_generation_prompt,
                                                      NULL, out, err);
}

int dsarl_tokenizer_render_chat(const dsarl_tokenizer *tok, const char *template_name, const char *messages_json,
                                const char *tools_json, const char *kwargs_json, int add_generation_prompt, char **out,
                                dsarl_error *err)
{
    *out = NULL;
    json_t *msgs = NULL, *tools = NULL, *kwargs = NULL;
    int rc = parse_json_arg("messages", messages_json ? messages_json : "[]", JSON_ARRAY, &msgs, err);
    if (rc == 0)
        rc = parse_json_arg("tools", tools_json, JSON_ARRAY, &tools, err);
    if (rc == 0)
        rc = parse_json_arg("kwargs", kwargs_json, JSON_OBJECT, &kwargs, err);
    size_t i;
    json_t *m;
    if (rc == 0 && !msgs && !(msgs = json_array()))
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "chat template: out of memory");
    json_array_foreach(msgs, i, m)
    {
        if (rc == 0 && (!json_is_object(m) || !json_is_string(json_object_get(m, "role"))))
            rc = DSARL_FAIL(err, DSARL_E_INVALID,
                            "chat template messages[%zu]: must be an object with a string "
                            "\"role\"",
                            i);
    }
    builtin_kind builtin = NOT_BUILTIN;
    const jinja_template *compiled = NULL;
    jinja_template *owned = NULL;
    if (rc == 0)
        rc = resolve(tok, template_name, tools != NULL, &builtin, &compiled, &owned, err);
    if (rc == 0 && builtin != NOT_BUILTIN) {
        // the built-ins know role and content strings only
        size_t n = json_array_size(msgs);
        dsarl_chat_message *plain = calloc(n ? n : 1, sizeof *plain);
        if (!plain)
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "chat template: out of memory");
        for (i = 0; rc == 0 && i < n; i++) {
            json_t *msg = json_array_get(msgs, i);
            plain[i].role = json_string_value(json_object_get(msg, "role"));
            plain[i].content = json_string_value(json_object_get(msg, "content"));
            if (!plain[i].content)
                rc = DSARL_FAIL(err, DSARL_E_UNSUPPORTED,
                                "chat template '%s': messages[%zu] has no string "
                                "content; the built-in templates render only role and content strings (use the "
                                "tokenizer's own template or a .jinja file)",
                                template_name ? template_name : "default", i);
        }
        if (rc == 0)
            rc = render_builtin(builtin, plain, n, add_generation_prompt, out, err);
        free(plain);
    } else if (rc == 0) {
        rc = render_jinja(tok, compiled, msgs, tools, kwargs, add_generation_prompt, out, err);
    }
    jinja_template_free(owned);
    json_decref(msgs);
    json_decref(tools);
    json_decref(kwargs);
    return rc;
}
