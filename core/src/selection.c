/* selection.c: mapping recipe keys to plugin names (rules in selection.h). */
#include "selection.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Reads a string-or-absent selecting key; fills choice->name/selected_by. Returns 1 when present, 0 when absent
 * (or null), negative on a wrong type. */
static int choose_from_key(const dsarl_node *root, const char *path, dsarl_choice *choice, dsarl_error *err)
{
    const dsarl_node *node = dsarl_node_get(root, path);
    if (!node || dsarl_node_kind(node) == DSARL_NODE_NULL)
        return 0;
    if (dsarl_node_kind(node) != DSARL_NODE_STRING) {
        char where[256];
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: recipe key %s must be a plugin name (a string), got %s '%s'",
                          dsarl_node_where(node, where, sizeof where), path,
                          dsarl_node_type_name(dsarl_node_kind(node)), dsarl_node_text(node) ? dsarl_node_text(node) : "");
    }
    char where[256];
    snprintf(choice->name, sizeof choice->name, "%s", dsarl_node_text(node));
    snprintf(choice->selected_by, sizeof choice->selected_by, "%s (%s)", dsarl_node_where(node, where, sizeof where),
             path);
    return 1;
}

static void choose_default(dsarl_choice *choice, const char *name, const char *why)
{
    snprintf(choice->name, sizeof choice->name, "%s", name);
    snprintf(choice->selected_by, sizeof choice->selected_by, "default (%s)", why);
}

/* A GPU is visible when the NVIDIA control device exists and CUDA_VISIBLE_DEVICES does not hide every GPU. */
static int gpu_visible(void)
{
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (visible && (!*visible || strcmp(visible, "-1") == 0))
        return 0;
    return access("/dev/nvidiactl", F_OK) == 0;
}

/* glm5.2 when the config describes IndexShare (index_topk_pattern, index_topk_freq > 1, or indexer_types with a
 * "shared" layer), else glm5.1. */
static const char *family_from_config(json_t *config)
{
    json_t *pattern = json_object_get(config, "index_topk_pattern");
    if (pattern && !json_is_null(pattern))
        return "glm5.2";
    json_t *freq = json_object_get(config, "index_topk_freq");
    if (json_is_integer(freq) && json_integer_value(freq) > 1)
        return "glm5.2";
    json_t *types = json_object_get(config, "indexer_types");
    size_t i;
    json_t *t;
    json_array_foreach(types, i, t) {
        if (json_is_string(t) && strcmp(json_string_value(t), "shared") == 0)
            return "glm5.2";
    }
    return "glm5.1";
}

static int choose_model(const dsarl_node *root, dsarl_choice *choice, dsarl_error *err)
{
    int rc = choose_from_key(root, "policy.model_family", choice, err);
    if (rc)
        return rc < 0 ? rc : 0;
    const dsarl_node *name_node = dsarl_node_get(root, "policy.model_name");
    if (!name_node || dsarl_node_kind(name_node) != DSARL_NODE_STRING) {
        choose_default(choice, "glm5.2", "neither policy.model_family nor policy.model_name is set");
        return 0;
    }
    const char *model_name = dsarl_node_text(name_node);
    char where[256];
    dsarl_node_where(name_node, where, sizeof where);
    char config_path[4096];
    snprintf(config_path, sizeof config_path, "%s/config.json", model_name);
    struct stat st;
    if (stat(model_name, &st) == 0 && S_ISDIR(st.st_mode)) {
        json_error_t jerr;
        json_t *config = json_load_file(config_path, 0, &jerr);
        if (!config)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s (policy.model_name): cannot read %s: %s (line %d)", where,
                              config_path, jerr.text, jerr.line);
        snprintf(choice->name, sizeof choice->name, "%s", family_from_config(config));
        json_decref(config);
        snprintf(choice->selected_by, sizeof choice->selected_by, "%s (policy.model_name: %s)", where, config_path);
        return 0;
    }
    if (strstr(model_name, "GLM-5.1") || strstr(model_name, "glm-5.1"))
        snprintf(choice->name, sizeof choice->name, "glm5.1");
    else
        snprintf(choice->name, sizeof choice->name, "glm5.2");
    snprintf(choice->selected_by, sizeof choice->selected_by, "%s (policy.model_name '%s')", where, model_name);
    return 0;
}

static void add_environment(dsarl_selection *sel, const dsarl_choice *c)
{
    for (int i = 0; i < sel->n_environments; i++)
        if (strcmp(sel->environments[i].name, c->name) == 0)
            return;
    if (sel->n_environments < DSARL_MAX_ENVIRONMENTS)
        sel->environments[sel->n_environments++] = *c;
}

int dsarl_select_plugins(const dsarl_node *root, const dsarl_registry *reg, dsarl_selection *sel, dsarl_error *err)
{
    memset(sel, 0, sizeof *sel);
    sel->model.kind = DSARL_KIND_MODEL;
    sel->device.kind = DSARL_KIND_DEVICE;
    sel->dsa.kind = DSARL_KIND_DSA;
    sel->generation.kind = DSARL_KIND_GENERATION;
    sel->algorithm.kind = DSARL_KIND_ALGORITHM;

    DSARL_TRY(choose_model(root, &sel->model, err));

    int rc = choose_from_key(root, "runtime.device", &sel->device, err);
    DSARL_TRY(rc);
    if (rc == 0 || strcmp(sel->device.name, "auto") == 0) {
        int cuda = dsarl_registry_find(reg, DSARL_KIND_DEVICE, "cuda") && gpu_visible();
        const char *why = rc == 0 ? "runtime.device absent: auto" : sel->device.selected_by;
        char because[600];
        snprintf(because, sizeof because, "%s; %s", why,
                 cuda ? "a GPU is visible and the cuda device plugin is loaded" : "no usable GPU");
        choose_default(&sel->device, cuda ? "cuda" : "cpu", because);
    }

    rc = choose_from_key(root, "policy.megatron_cfg.model_overrides.dsa_kernel_backend", &sel->dsa, err);
    DSARL_TRY(rc);
    if (rc == 0)
        choose_default(&sel->dsa, strcmp(sel->device.name, "cuda") == 0 ? "tilelang" : "reference",
                       "policy.megatron_cfg.model_overrides.dsa_kernel_backend absent");

    rc = choose_from_key(root, "policy.generation.backend", &sel->generation, err);
    DSARL_TRY(rc);
    if (rc == 0)
        choose_default(&sel->generation, "native", "policy.generation.backend absent");

    rc = choose_from_key(root, "algorithm.name", &sel->algorithm, err);
    DSARL_TRY(rc);
    if (rc == 0)
        choose_default(&sel->algorithm, "grpo", "algorithm.name absent");

    static const char *const env_keys[] = {"data.env_name", "data.default.env_name", "data.train.env_name",
                                           "data.validation.env_name"};
    for (size_t i = 0; i < DSARL_ARRAY_LEN(env_keys); i++) {
        dsarl_choice c = {.kind = DSARL_KIND_ENVIRONMENT};
        rc = choose_from_key(root, env_keys[i], &c, err);
        DSARL_TRY(rc);
        if (rc)
            add_environment(sel, &c);
    }
    if (sel->n_environments == 0) {
        dsarl_choice c = {.kind = DSARL_KIND_ENVIRONMENT};
        choose_default(&c, "math", "no data.*.env_name set");
        add_environment(sel, &c);
    }

    dsarl_choice *all[] = {&sel->model, &sel->device, &sel->dsa, &sel->generation, &sel->algorithm};
    for (size_t i = 0; i < DSARL_ARRAY_LEN(all); i++)
        all[i]->ops = dsarl_registry_find(reg, all[i]->kind, all[i]->name);
    for (int i = 0; i < sel->n_environments; i++)
        sel->environments[i].ops = dsarl_registry_find(reg, DSARL_KIND_ENVIRONMENT, sel->environments[i].name);
    return 0;
}

int dsarl_selection_require(const dsarl_selection *sel, const dsarl_registry *reg, unsigned optional_mask,
                            dsarl_error *err)
{
    const dsarl_choice *all[5 + DSARL_MAX_ENVIRONMENTS] = {&sel->algorithm, &sel->device, &sel->dsa, &sel->model,
                                                           &sel->generation};
    size_t n = 5;
    for (int i = 0; i < sel->n_environments; i++)
        all[n++] = &sel->environments[i];
    /* Choices the user made on the command line are checked first: a typo there is the likeliest fault. */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < n; i++) {
            int from_command_line = strncmp(all[i]->selected_by, "command line", 12) == 0;
            if ((optional_mask & (1u << all[i]->kind)) || from_command_line != (pass == 0))
                continue;
            const dsarl_ops_common *ops;
            DSARL_TRY(dsarl_registry_require(reg, all[i]->kind, all[i]->name, all[i]->selected_by, &ops, err));
        }
    }
    return 0;
}

/* The keys the host itself reads: plugin selection, the runtime section and the plugin search path. */
static const dsarl_key_spec host_keys[] = {
    {"algorithm", DSARL_KEY_MAP, NULL, "which training loop runs", DSARL_KEY_OWNED | DSARL_KEY_NULLABLE},
    {"algorithm.name", DSARL_KEY_STRING, "grpo", "algorithm plugin: grpo | sft", 0},
    {"runtime", DSARL_KEY_MAP, NULL, "process-level settings", DSARL_KEY_OWNED | DSARL_KEY_NULLABLE},
    {"runtime.device", DSARL_KEY_STRING, "auto", "device plugin: auto (cuda when a GPU is visible) | cpu | cuda", 0},
    {"runtime.threads", DSARL_KEY_INT, "0", "CPU threads for BLAS and host math; 0 = all cores", 0},
    {"runtime.deterministic", DSARL_KEY_BOOL, "true", "bit-identical reruns and resume on the CPU", 0},
    {"plugins", DSARL_KEY_MAP, NULL, "plugin loading", DSARL_KEY_OWNED | DSARL_KEY_NULLABLE},
    {"plugins.path", DSARL_KEY_ANY, "[]", "extra plugin directories (a list, or one ':'-separated string)",
     DSARL_KEY_NULLABLE},
    {"policy.model_family", DSARL_KEY_STRING, NULL, "model plugin: glm5.1 | glm5.2; null = from policy.model_name",
     DSARL_KEY_NULLABLE},
    {"policy.model_name", DSARL_KEY_STRING, NULL, "Hugging Face model directory or hub id", DSARL_KEY_NULLABLE},
    {"policy.megatron_cfg.model_overrides.dsa_kernel_backend", DSARL_KEY_STRING, NULL,
     "dsa plugin: reference | tilelang | cudnn; null = reference on cpu, tilelang on cuda", DSARL_KEY_NULLABLE},
    {"policy.generation.backend", DSARL_KEY_STRING, "native", "generation plugin", 0},
    {"data.env_name", DSARL_KEY_STRING, NULL, "environment plugin for every dataset", DSARL_KEY_NULLABLE},
    {"data.*.env_name", DSARL_KEY_STRING, NULL, "environment plugin of one dataset (default, train, validation)",
     DSARL_KEY_NULLABLE},
};

size_t dsarl_selection_schema_tables(dsarl_selection *sel, dsarl_schema_table *tables)
{
    tables[0].owner = "host/dsarl";
    tables[0].keys = host_keys;
    tables[0].n_keys = DSARL_ARRAY_LEN(host_keys);
    dsarl_choice *all[DSARL_SELECTION_MAX_TABLES] = {&sel->algorithm, &sel->model, &sel->device, &sel->dsa,
                                                     &sel->generation};
    size_t n = 5, used = 1;
    for (int i = 0; i < sel->n_environments; i++)
        all[n++] = &sel->environments[i];
    for (size_t i = 0; i < n; i++) {
        if (!all[i]->ops)
            continue;
        snprintf(all[i]->owner, sizeof all[i]->owner, "%s/%s", dsarl_kind_name(all[i]->kind), all[i]->name);
        tables[used].owner = all[i]->owner;
        tables[used].keys = all[i]->ops->keys;
        tables[used].n_keys = all[i]->ops->n_keys;
        used++;
    }
    return used;
}
