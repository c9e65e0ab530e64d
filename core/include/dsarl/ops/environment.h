/* dsarl/ops/environment.h (SDK tier: plugin ABI, docs/sdk.md; create, destroy and score are mandatory): reward
 * environments (kind DSARL_KIND_ENVIRONMENT), configured under env.<name> and
 * selected per dataset by data.*.env_name. */
#ifndef DSARL_OPS_ENVIRONMENT_H
#define DSARL_OPS_ENVIRONMENT_H

#include <stddef.h>
#include <stdint.h>
#include "dsarl/plugin.h"

DSARL_BEGIN_DECLS

typedef struct dsarl_environment dsarl_environment;

/* Outcome of verifying one response. */
typedef enum dsarl_verdict {
    DSARL_VERDICT_WRONG = 0,
    DSARL_VERDICT_CORRECT = 1,
    DSARL_VERDICT_VERIFIER_FAILED = 2, /* the verifier could not judge (counted and logged, never a silent 0) */
} dsarl_verdict;

typedef struct dsarl_environment_ops {
    dsarl_ops_common common;

    /* Creates an environment from its recipe section (env.<name>); section may be NULL when absent. */
    int (*create)(const dsarl_node *recipe, const dsarl_node *section, dsarl_environment **out, dsarl_error *err);
    void (*destroy)(dsarl_environment *env);

    /* Scores n responses against their ground truths: rewards[i] and verdicts[i] for each. */
    int (*score)(dsarl_environment *env, size_t n, const char *const *responses, const char *const *ground_truths,
                 float *rewards, dsarl_verdict *verdicts, dsarl_error *err);

    void *reserved[8];
} dsarl_environment_ops;

DSARL_END_DECLS

#endif /* DSARL_OPS_ENVIRONMENT_H */
