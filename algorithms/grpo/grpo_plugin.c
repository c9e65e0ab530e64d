/* grpo_plugin.c: entry of dsarl-algorithm-grpo.so. Registers the algorithm ops table "grpo" with its recipe keys:
 * the GRPO math keys first (grpo_recipe_keys), then what the loop reads (grpo_train_keys), the logger's,
 * the checkpointing section's, the optimizer's and the datasets'. */

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

/* all_keys and grpo_ops.common.n_keys are filled by grpo_init before registration (the tables it joins live in
 * libdsarl, so it cannot be a static initializer); large enough for every table with room to grow, and the join
 * fails the load if it ever is not. */
static dsarl_key_spec all_keys[512];

static dsarl_algorithm_ops grpo_ops = {
    .common = DSARL_OPS_COMMON_KEYS_RANKED(dsarl_algorithm_ops, DSARL_KIND_ALGORITHM, "grpo",
                                           "GRPO (NeMo RL semantics): group advantages, ClippedPGLoss, DAPO options",
                                           all_keys, 0, DSARL_RANK_PRIMARY),
    .run = grpo_run,
};

static int grpo_init(const dsarl_host *host, dsarl_error *err)
{
    dsarl_key_list lists[6];
    lists[0].keys = grpo_recipe_keys(&lists[0].n_keys);
    lists[1] = (dsarl_key_list){grpo_train_keys, grpo_train_n_keys};
    lists[2].keys = dsarl_metrics_keys(&lists[2].n_keys);
    lists[3].keys = dsarl_checkpoint_keys(&lists[3].n_keys);
    lists[4].keys = dsarl_optimizer_keys(&lists[4].n_keys);
    lists[5].keys = dsarl_dataset_keys(&lists[5].n_keys);
    /* n_keys is the one field that depends on the joined tables */
    DSARL_TRY(dsarl_key_table_join("algorithm/grpo", lists, DSARL_ARRAY_LEN(lists), all_keys,
                                   DSARL_ARRAY_LEN(all_keys), &grpo_ops.common.n_keys, err));
    return host->register_ops(host, DSARL_KIND_ALGORITHM, &grpo_ops.common, err);
}

DSARL_PLUGIN_DEFINE("algorithm-grpo", "0.1.0", "GRPO algorithm (NeMo RL semantics)", grpo_init)
