/* distill_plugin.c: entry of dsarl-algorithm-distillation.so. Registers the algorithm ops table "distillation"
 * (NeMo RL's on-policy distillation) with its recipe keys (distill_config.c). */
#include "distill.h"

static int distill_run(const dsarl_run_context *ctx, dsarl_error *err)
{
    return distill_train_run(ctx, NULL, err);
}

/* n_keys is filled by distill_init: the joined table is built at run time from tables in libdsarl. */
static dsarl_algorithm_ops distill_ops = {
    .common = DSARL_OPS_COMMON_KEYS_RANKED(dsarl_algorithm_ops, DSARL_KIND_ALGORITHM, "distillation",
                                           "on-policy distillation (NeMo RL semantics): a frozen teacher's top-k "
                                           "logits, forward / reverse / mixed KL", NULL, 0, DSARL_RANK_NONE),
    .run = distill_run,
};

static int distill_init(const dsarl_host *host, dsarl_error *err)
{
    DSARL_TRY(distill_recipe_keys(&distill_ops.common.keys, &distill_ops.common.n_keys, err));
    return host->register_ops(host, DSARL_KIND_ALGORITHM, &distill_ops.common, err);
}

DSARL_PLUGIN_DEFINE("algorithm-distillation", "0.1.0", "On-policy distillation (NeMo RL semantics)", distill_init)
