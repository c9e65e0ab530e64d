/* grpo_plugin.c: entry of dsarl-algorithm-grpo.so. Registers the algorithm ops table "grpo" with its recipe keys:
 * the GRPO math keys first (grpo_recipe_keys), then what the loop reads (grpo_train_keys), the logger's,
 * the checkpointing section's, the optimizer's and the datasets'. */
#include <string.h>

#include "dsarl/checkpoint.h"
#include "dsarl/dataset.h"
#include "dsarl/metrics.h"
#include "dsarl/ops/algorithm.h"
#include "dsarl/optimizer.h"
#include "grpo_train.h"

static int grpo_run(const dsarl_run_context *ctx, dsarl_error *err)
{
    return grpo_train_run(ctx, NULL, err);
}

/* all_keys and grpo_ops.common.n_keys are filled by grpo_init before registration (the tables it joins live in libdsarl, so it cannot be a static
 * initializer); large enough for every table with room to grow. */
static dsarl_key_spec all_keys[512];

static dsarl_algorithm_ops grpo_ops = {
    .common = DSARL_OPS_COMMON_KEYS_RANKED(dsarl_algorithm_ops, DSARL_KIND_ALGORITHM, "grpo",
                                           "GRPO (NeMo RL semantics): group advantages, ClippedPGLoss, DAPO options",
                                           all_keys, 0, DSARL_RANK_PRIMARY),
    .run = grpo_run,
};

static size_t append_keys(size_t at, const dsarl_key_spec *keys, size_t n)
{
    for (size_t i = 0; i < n && at < DSARL_ARRAY_LEN(all_keys); i++)
        all_keys[at++] = keys[i];
    return at;
}

static int grpo_init(const dsarl_host *host, dsarl_error *err)
{
    size_t n = 0, k;
    const dsarl_key_spec *t;
    t = grpo_recipe_keys(&k);
    n = append_keys(n, t, k);
    n = append_keys(n, grpo_train_keys, grpo_train_n_keys);
    t = dsarl_metrics_keys(&k);
    n = append_keys(n, t, k);
    t = dsarl_checkpoint_keys(&k);
    n = append_keys(n, t, k);
    t = dsarl_optimizer_keys(&k);
    n = append_keys(n, t, k);
    t = dsarl_dataset_keys(&k);
    n = append_keys(n, t, k);
    if (n == DSARL_ARRAY_LEN(all_keys))
        return DSARL_FAIL(err, DSARL_E_INTERNAL, "algorithm/grpo: more recipe keys than its table holds (%zu)", n);
    grpo_ops.common.n_keys = n; /* the one field that depends on the joined tables */
    return host->register_ops(host, DSARL_KIND_ALGORITHM, &grpo_ops.common, err);
}

DSARL_PLUGIN_DEFINE("algorithm-grpo", "0.1.0", "GRPO algorithm (NeMo RL semantics)", grpo_init)
