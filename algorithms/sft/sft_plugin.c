/* sft_plugin.c: entry of dsarl-algorithm-sft.so. Registers the algorithm ops table "sft" with its recipe keys (its
 * own, then the checkpointing, optimizer, logger and dataset keys it reads through libdsarl). */
#include "dsarl/ops/algorithm.h"
#include "sft.h"

/* n_keys is filled by sft_init: the joined table lives in sft_config.c and is built at run time. */
static dsarl_algorithm_ops sft_ops = {
    .common = DSARL_OPS_COMMON_KEYS_RANKED(dsarl_algorithm_ops, DSARL_KIND_ALGORITHM, "sft",
                                           "supervised fine-tuning on prompt/answer pairs (NeMo RL's SFT): "
                                           "answer-token NLL", NULL, 0, DSARL_RANK_SECONDARY),
    .run = sft_run,
};

static int sft_init(const dsarl_host *host, dsarl_error *err)
{
    DSARL_TRY(sft_recipe_keys(&sft_ops.common.keys, &sft_ops.common.n_keys, err));
    return host->register_ops(host, DSARL_KIND_ALGORITHM, &sft_ops.common, err);
}

DSARL_PLUGIN_DEFINE("algorithm-sft", "0.1.0", "Supervised fine-tuning (NeMo RL semantics)", sft_init)
