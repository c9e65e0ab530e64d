/* dsarl/ops/environment.h (SDK tier: plugin ABI, docs/sdk.md; create, destroy and score are mandatory): reward
 * environments (kind DSARL_KIND_ENVIRONMENT), configured under env.<name> and
 * selected per dataset by data.*.env_name. */
#ifndef DSARL_OPS_ENVIRONMENT_H
#define DSARL_OPS_ENVIRONMENT_H

#include <stdbool.h>
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

    /* --- ABI 1.4: a reward vector per response, for multi-reward advantage estimators (GDPO) ---------------- */
    /* Optional as a pair (NULL: the environment scores one reward). How many components score_components fills
     * (at most DSARL_MAX_REWARD_COMPONENTS) and, through names, their names in ascending strcmp order, valid
     * while env lives. */
    size_t (*reward_components)(const dsarl_environment *env, const char *const **names);
    /* score's outputs plus components[i * n_components + k] = component k of response i's reward. */
    int (*score_components)(dsarl_environment *env, size_t n, const char *const *responses,
                            const char *const *ground_truths, float *rewards, dsarl_verdict *verdicts,
                            float *components, dsarl_error *err);

    /* --- ABI 1.4: multi-turn episodes (grpo.max_rollout_turns > 1) ------------------------------------------- */
    /* One turn of n running episodes. responses[i] is what the policy generated in this turn of episode i,
     * turns[i] the turn's index (0 = the first). The environment sets done[i]; for an episode that goes on it
     * sets observations[i], the text appended to the conversation before the policy's next turn (a tool's
     * result; valid until the next call on env, NULL = none); for one it ends it sets rewards[i] and verdicts[i]
     * as score would for the whole episode. tool_calls[i] and invalid_tool_calls[i] count the tool calls of this
     * turn and those that could not run. NULL: the environment is single-turn. */
    int (*step)(dsarl_environment *env, size_t n, const char *const *responses, const char *const *ground_truths,
                const int32_t *turns, const char **observations, uint8_t *done, float *rewards,
                dsarl_verdict *verdicts, int32_t *tool_calls, int32_t *invalid_tool_calls, dsarl_error *err);
} dsarl_environment_ops;

/* ABI 1.4: the most reward components an environment may report. */
#define DSARL_MAX_REWARD_COMPONENTS 8

/* Whether an environment ops table (any 1.x) runs multi-turn episodes (ABI 1.4 step). */
static inline bool dsarl_environment_has_step(const dsarl_environment_ops *ops)
{
    return ops->common.struct_size >= offsetof(dsarl_environment_ops, step) + sizeof(ops->step) && ops->step;
}

/* Whether an environment ops table (any 1.x) fills the ABI 1.4 reward-vector pair. */
static inline bool dsarl_environment_has_components(const dsarl_environment_ops *ops)
{
    return ops->common.struct_size >= offsetof(dsarl_environment_ops, score_components) + sizeof(ops->score_components) &&
           ops->reward_components && ops->score_components;
}

DSARL_END_DECLS

#endif /* DSARL_OPS_ENVIRONMENT_H */
