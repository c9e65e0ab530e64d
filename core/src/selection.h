/* selection.h: which plugin of each kind a resolved recipe selects, and where that choice came from.
 *
 * The rules (README "Recipes"): model by policy.model_family, else from policy.model_name (a local Hugging Face
 * directory's config.json, or a hub id naming GLM-5.1/GLM-5.2); device by runtime.device (auto = cuda when a
 * cuda device plugin is registered and a GPU is visible, else cpu); dsa by
 * policy.megatron_cfg.model_overrides.dsa_kernel_backend (absent: reference on cpu, tilelang on cuda); generation
 * by policy.generation.backend; algorithm by algorithm.name (absent: grpo, as NeMo RL's run_grpo.py implies);
 * environments by every data.*.env_name (absent: math). */
#ifndef DSARL_SELECTION_H
#define DSARL_SELECTION_H

#include "dsarl/ops/device.h"
#include "dsarl/ops/model.h"
#include "registry.h"
#include "schema.h"

#define DSARL_MAX_ENVIRONMENTS 8

/* One selected plugin name with the place that selected it. */
typedef struct dsarl_choice {
    dsarl_kind kind;
    char name[128];
    char selected_by[512];          /* "recipe.yaml:12:5 (runtime.device)" or "default (runtime.device absent)" */
    const dsarl_ops_common *ops;    /* NULL when no registered plugin has that name */
    char owner[160];                /* "kind/name", for schema tables and default origins */
} dsarl_choice;

typedef struct dsarl_selection {
    dsarl_choice model, device, dsa, generation, algorithm;
    dsarl_choice environments[DSARL_MAX_ENVIRONMENTS];
    int n_environments;
} dsarl_selection;

/* Works out the names the recipe selects and looks each up in reg (ops NULL when absent). Fails only on a
 * malformed selecting key (wrong type, unreadable model directory). */
DSARL_API int dsarl_select_plugins(const dsarl_node *root, const dsarl_registry *reg, dsarl_selection *sel,
                                   dsarl_error *err);

/* The model table whose accepts scores probe highest (NULL when none accepts it); < 0 when an accepts fails. */
DSARL_API int dsarl_select_model_for(const dsarl_registry *reg, const dsarl_model_probe *probe,
                                     const dsarl_ops_common **out, dsarl_error *err);

/* The highest-ranked device table with every DSARL_DEVICE_CAP_* flag of required_caps (0: any) that this machine
 * can run (its available probe), or NULL. */
DSARL_API const dsarl_ops_common *dsarl_select_default_device(const dsarl_registry *reg, uint64_t required_caps);

/* The highest-ranked DSA table whose device_requires the device's capabilities meet, or NULL. */
DSARL_API const dsarl_ops_common *dsarl_select_default_dsa(const dsarl_registry *reg,
                                                           const dsarl_device_ops *device);

/* Fails with the first selected plugin that is missing or refused: "<where>: no dsa plugin named 'x';
 * available: ...". Kinds whose bit is clear in optional_mask (1 << kind) are required. */
DSARL_API int dsarl_selection_require(const dsarl_selection *sel, const dsarl_registry *reg, unsigned optional_mask,
                                      dsarl_error *err);

/* Fills tables (room for DSARL_SELECTION_MAX_TABLES) with the host's own keys (selection, runtime, plugins) and
 * the declared keys of every selected plugin that is available; returns how many. */
DSARL_API size_t dsarl_selection_schema_tables(dsarl_selection *sel, dsarl_schema_table *tables);

#define DSARL_SELECTION_MAX_TABLES (7 + DSARL_MAX_ENVIRONMENTS)

#endif /* DSARL_SELECTION_H */
