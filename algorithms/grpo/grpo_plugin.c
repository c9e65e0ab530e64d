/* grpo_plugin.c: entry of dsarl-algorithm-grpo.so. Registers the algorithm ops table "grpo" with its recipe keys.
 * The training loop needs the model and the generation engine (issue 4); until they land, run validates the
 * config, so a recipe's GRPO settings are already checked end to end, and then says plainly what is missing. */
#include "grpo.h"

#include "dsarl/ops/algorithm.h"

static int grpo_run(const dsarl_run_context *ctx, dsarl_error *err)
{
    grpo_config cfg;
    DSARL_TRY(grpo_config_from_recipe(ctx->recipe, &cfg, err));
    return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "the GRPO training loop is not built yet (issue 4): config validated");
}

static const dsarl_algorithm_ops grpo_ops = {
    .common = DSARL_OPS_COMMON_KEYS(dsarl_algorithm_ops, DSARL_KIND_ALGORITHM, "grpo",
                                    "GRPO (NeMo RL semantics): group advantages, ClippedPGLoss, DAPO options",
                                    grpo_recipe_keys, GRPO_N_RECIPE_KEYS),
    .run = grpo_run,
};

static int grpo_init(const dsarl_host *host, dsarl_error *err)
{
    return host->register_ops(host, DSARL_KIND_ALGORITHM, &grpo_ops.common, err);
}

DSARL_PLUGIN_DEFINE("algorithm-grpo", "0.1.0", "GRPO algorithm (NeMo RL semantics)", grpo_init)
