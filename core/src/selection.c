/* selection.c: mapping recipe keys to plugin names (rules in selection.h). */
#include "selection.h"
#include "layout.h"

#include "dsarl/hf_hub.h"
#include "dsarl/ops/dsa.h"
#include "dsarl/ops/model.h"

#include <stddef.h>
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

/* The highest-ranked table of kind (rank > 0) that keep() admits, or NULL; ties go to the first registered. */
static const dsarl_ops_common *highest_rank(const dsarl_registry *reg, dsarl_kind kind,
                                            bool (*keep)(const dsarl_ops_common *ops, const void *ctx),
                                            const void *ctx)
{
    const dsarl_ops_common *best = NULL;
    for (size_t i = 0; i < dsarl_registry_ops_count(reg); i++) {
        const dsarl_ops_entry *e = dsarl_registry_ops_at(reg, i);
        if (e->kind != kind || e->ops->rank <= 0 || (keep && !keep(e->ops, ctx)))
            continue;
        if (!best || e->ops->rank > best->rank)
            best = e->ops;
    }
    return best;
}

int dsarl_select_model_for(const dsarl_registry *reg, const dsarl_model_probe *probe, const dsarl_ops_common **out,
                           dsarl_error *err)
{
    *out = NULL;
    int best_score = 0;
    for (size_t i = 0; i < dsarl_registry_ops_count(reg); i++) {
        const dsarl_ops_entry *e = dsarl_registry_ops_at(reg, i);
        const dsarl_model_ops *mo = (const dsarl_model_ops *)e->ops;
        if (e->kind != DSARL_KIND_MODEL || !DSARL_MODEL_HAS(mo, accepts))
            continue;
        int score = mo->accepts(probe, err);
        if (score < 0) {
            char why[sizeof err->message];
            snprintf(why, sizeof why, "%s", err->message);
            return DSARL_FAIL(err, score, "model %s: %s", e->ops->name, why);
        }
        if (score > best_score)
            *out = e->ops, best_score = score;
    }
    return DSARL_OK;
}

/* Asks every model table's accepts about policy.model_name and takes the highest score. */
static int choose_model(const dsarl_node *root, const dsarl_registry *reg, dsarl_choice *choice, dsarl_error *err)
{
    int rc = choose_from_key(root, "policy.model_family", choice, err);
    if (rc)
        return rc < 0 ? rc : 0;
    const dsarl_node *name_node = dsarl_node_get(root, "policy.model_name");
    if (!name_node || dsarl_node_kind(name_node) != DSARL_NODE_STRING) {
        const dsarl_ops_common *best = highest_rank(reg, DSARL_KIND_MODEL, NULL, NULL);
        choose_default(choice, best ? best->name : "(none)",
                       best ? "neither policy.model_family nor policy.model_name is set: the highest-ranked model"
                            : "neither policy.model_family nor policy.model_name is set, and no model plugin has a "
                              "rank");
        return 0;
    }
    const char *model_name = dsarl_node_text(name_node);
    char where[256];
    dsarl_node_where(name_node, where, sizeof where);
    // a hub id found in the Hugging Face cache probes by its config.json; one that is not there probes by name
    // (the session refuses it when the weights are needed)
    char found[4096], config_path[4200];
    const char *revision = NULL;
    DSARL_TRY(dsarl_recipe_string_or(root, "policy.model_revision", NULL, &revision, err));
    dsarl_hf_find(model_name, revision, found, sizeof found);
    snprintf(config_path, sizeof config_path, "%s/config.json", found);
    struct stat st;
    bool has_config = stat(config_path, &st) == 0 && S_ISREG(st.st_mode);
    dsarl_model_probe probe = {.struct_size = sizeof probe, .model_name = model_name,
                               .config_path = has_config ? config_path : NULL, .recipe = root};
    const dsarl_ops_common *best = NULL;
    rc = dsarl_select_model_for(reg, &probe, &best, err);
    if (rc < 0) {
        char why[sizeof err->message];
        snprintf(why, sizeof why, "%s", err->message);
        return DSARL_FAIL(err, rc, "%s (policy.model_name): %s", where, why);
    }
    snprintf(choice->name, sizeof choice->name, "%s", best ? best->name : "(none)");
    if (best)
        snprintf(choice->selected_by, sizeof choice->selected_by, "%s (policy.model_name %s%s)", where,
                 has_config ? config_path : model_name, has_config ? "" : ", by name");
    else
        snprintf(choice->selected_by, sizeof choice->selected_by, "%s (policy.model_name '%s': no model plugin "
                 "accepts it; set policy.model_family)", where, model_name);
    return 0;
}

// Devices with the capabilities *ctx whose probe says this machine can run them (no probe: always).
static bool device_available(const dsarl_ops_common *ops, const void *ctx)
{
    const dsarl_device_ops *d = (const dsarl_device_ops *)ops;
    uint64_t required = *(const uint64_t *)ctx;
    if ((dsarl_device_capabilities(d) & required) != required)
        return false;
    bool probed = d->common.struct_size >= offsetof(dsarl_device_ops, available) + sizeof(d->available) &&
                  d->available;
    char why[256];
    return !probed || d->available(why, sizeof why);
}

// DSA backends whose device_requires the device's capabilities (*ctx) meet.
static bool dsa_runs_on(const dsarl_ops_common *ops, const void *ctx)
{
    const dsarl_dsa_ops *d = (const dsarl_dsa_ops *)ops;
    uint64_t caps = *(const uint64_t *)ctx;
    if (d->common.struct_size < offsetof(dsarl_dsa_ops, device_requires) + sizeof(d->device_requires))
        return false;
    return d->device_requires != 0 && (d->device_requires & caps) == d->device_requires;
}

const dsarl_ops_common *dsarl_select_default_device(const dsarl_registry *reg, uint64_t required_caps)
{
    return highest_rank(reg, DSARL_KIND_DEVICE, device_available, &required_caps);
}

const dsarl_ops_common *dsarl_select_default_dsa(const dsarl_registry *reg, const dsarl_device_ops *device)
{
    uint64_t caps = device ? dsarl_device_capabilities(device) : 0;
    return highest_rank(reg, DSARL_KIND_DSA, dsa_runs_on, &caps);
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

    DSARL_TRY(choose_model(root, reg, &sel->model, err));

    int rc = choose_from_key(root, "runtime.device", &sel->device, err);
    DSARL_TRY(rc);
    if (rc == 0 || strcmp(sel->device.name, "auto") == 0) {
        const dsarl_ops_common *best = dsarl_select_default_device(reg, 0);
        char because[600];
        snprintf(because, sizeof because, "%s; %s", rc == 0 ? "runtime.device absent: auto" : sel->device.selected_by,
                 best ? "the highest-ranked device this machine can run" : "no loaded device plugin can run here");
        choose_default(&sel->device, best ? best->name : "(none)", because);
    }

    rc = choose_from_key(root, "policy.megatron_cfg.model_overrides.dsa_kernel_backend", &sel->dsa, err);
    DSARL_TRY(rc);
    if (rc == 0) {
        const dsarl_device_ops *dev = (const dsarl_device_ops *)dsarl_registry_find(reg, DSARL_KIND_DEVICE,
                                                                                    sel->device.name);
        const dsarl_ops_common *best = dsarl_select_default_dsa(reg, dev);
        char because[600];
        snprintf(because, sizeof because, "policy.megatron_cfg.model_overrides.dsa_kernel_backend absent: %s %s",
                 best ? "the highest-ranked backend that runs on device" : "no loaded backend runs on device",
                 sel->device.name);
        choose_default(&sel->dsa, best ? best->name : "(none)", because);
    }

    rc = choose_from_key(root, "policy.generation.backend", &sel->generation, err);
    DSARL_TRY(rc);
    if (rc == 0) {
        const dsarl_ops_common *best = highest_rank(reg, DSARL_KIND_GENERATION, NULL, NULL);
        choose_default(&sel->generation, best ? best->name : "native",
                       "policy.generation.backend absent: the highest-ranked");
    }

    rc = choose_from_key(root, "algorithm.name", &sel->algorithm, err);
    DSARL_TRY(rc);
    if (rc == 0) {
        const dsarl_ops_common *best = highest_rank(reg, DSARL_KIND_ALGORITHM, NULL, NULL);
        choose_default(&sel->algorithm, best ? best->name : "grpo", "algorithm.name absent: the highest-ranked");
    }

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
    {"runtime.device", DSARL_KEY_STRING, "auto",
     "device plugin by name, or auto: the highest-ranked device this machine can run", 0},
    {"runtime.threads", DSARL_KEY_INT, "0", "CPU threads for BLAS and host math; 0 = all cores", 0},
    {"runtime.deterministic", DSARL_KEY_BOOL, "true", "bit-identical reruns and resume on the CPU", 0},
    {"plugins", DSARL_KEY_MAP, NULL, "plugin loading", DSARL_KEY_OWNED | DSARL_KEY_NULLABLE},
    {"plugins.path", DSARL_KEY_ANY, "[]", "extra plugin directories (a list, or one ':'-separated string)",
     DSARL_KEY_NULLABLE},
    {"policy.model_family", DSARL_KEY_STRING, NULL,
     "model plugin by name; null = the model plugin that accepts policy.model_name (else the highest-ranked)",
     DSARL_KEY_NULLABLE},
    {"policy.model_name", DSARL_KEY_STRING, NULL,
     "Hugging Face model directory, or a hub id (owner/name) read offline from the Hugging Face cache",
     DSARL_KEY_NULLABLE},
    {"policy.model_revision", DSARL_KEY_STRING, NULL,
     "branch, tag or commit of a hub-id policy.model_name in the cache; null = main", DSARL_KEY_NULLABLE},
    {"policy.tokenizer.chat_template_kwargs", DSARL_KEY_MAP, NULL,
     "extra chat template variables, e.g. {enable_thinking: false}; null = none", DSARL_KEY_NULLABLE},
    {"policy.megatron_cfg.model_overrides.dsa_kernel_backend", DSARL_KEY_STRING, NULL,
     "dsa plugin by name; null = the highest-ranked backend that runs on the device", DSARL_KEY_NULLABLE},
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
    tables[1].owner = "host/dsarl parallel layout";
    tables[1].keys = dsarl_layout_keys;
    tables[1].n_keys = dsarl_layout_n_keys;
    dsarl_choice *all[DSARL_SELECTION_MAX_TABLES] = {&sel->algorithm, &sel->model, &sel->device, &sel->dsa,
                                                     &sel->generation};
    size_t n = 5, used = 2;
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
