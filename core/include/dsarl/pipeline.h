/* dsarl/pipeline.h: how a model's decoder layers are split into pipeline stages (Megatron's rule).
 * SDK tier: plugin ABI (docs/sdk.md); ABI 1.4.
 *
 * The first and the last stage may take the recipe's policy.megatron_cfg.num_layers_in_first_pipeline_stage /
 * num_layers_in_last_pipeline_stage layers; every other stage takes an equal share of the rest. `dsarl plan` and the
 * models split with this one function, so a plan and a run agree on every stage. */
#ifndef DSARL_PIPELINE_H
#define DSARL_PIPELINE_H

#include <stdint.h>
#include "dsarl/error.h"
#include "dsarl/export.h"
#include "dsarl/recipe.h"

DSARL_BEGIN_DECLS

/* ABI 1.4: starts[0..pp] = the first layer of each of pp stages of n_layers (starts[pp] = n_layers), from the
 * recipe's uneven-stage keys (recipe may be NULL: an even split). Refuses, in one sentence naming the keys, a split
 * that does not divide, a stage without layers, and virtual_pipeline_model_parallel_size > 1 (not implemented). */
DSARL_API int dsarl_pipeline_stage_layers(const dsarl_node *recipe, int32_t n_layers, int32_t pp, int32_t *starts,
                                          dsarl_error *err);

DSARL_END_DECLS

#endif /* DSARL_PIPELINE_H */
