/* dsarl/ops/algorithm.h: training loops (kind DSARL_KIND_ALGORITHM), selected by algorithm.name. SDK tier: plugin
 * ABI (docs/sdk.md); algorithms also use the trainer services tier. run is mandatory.
 *
 * The host resolves and validates the recipe, loads and selects every plugin the recipe names, then hands the
 * algorithm a run context; the algorithm owns the loop (data, rollouts, losses, optimizer, checkpoints, logs). */
#ifndef DSARL_OPS_ALGORITHM_H
#define DSARL_OPS_ALGORITHM_H

#include <signal.h>
#include "dsarl/ops/environment.h"
#include "dsarl/ops/generation.h"
#include "dsarl/ops/model.h"

DSARL_BEGIN_DECLS

typedef struct dsarl_run_context {
    uint32_t struct_size;
    const dsarl_host *host;
    const dsarl_node *recipe;                   /* resolved, validated recipe root */
    const dsarl_parallel *parallel;
    const dsarl_model_ops *model_ops;           /* selected by policy.model_family / policy.model_name */
    const dsarl_device_ops *device_ops;         /* selected by runtime.device */
    const dsarl_dsa_ops *dsa_ops;               /* selected by ...model_overrides.dsa_kernel_backend */
    const dsarl_generation_ops *generation_ops; /* selected by policy.generation.backend, or NULL */
    /* Environments by name (env.<name> sections that a dataset selects). */
    const dsarl_environment_ops *const *environment_ops;
    const char *const *environment_names;
    int32_t n_environments;
    volatile sig_atomic_t *stop_requested;      /* set by SIGINT/SIGTERM: finish the step, checkpoint, return */
} dsarl_run_context;

typedef struct dsarl_algorithm_ops {
    dsarl_ops_common common;

    /* Runs the whole job; returns 0 when it finished or stopped cleanly. */
    int (*run)(const dsarl_run_context *ctx, dsarl_error *err);

    void *reserved[8];
} dsarl_algorithm_ops;

DSARL_END_DECLS

#endif /* DSARL_OPS_ALGORITHM_H */
