/* dsarl/pipeline.h: how a model's decoder layers are split into pipeline stages (Megatron's rule).
 * SDK tier: plugin ABI (docs/sdk.md); ABI 1.4, virtual stages 1.5.
 *
 * The first and the last stage may take the recipe's policy.megatron_cfg.num_layers_in_first_pipeline_stage /
 * num_layers_in_last_pipeline_stage layers; every other stage takes an equal share of the rest. With
 * virtual_pipeline_model_parallel_size v > 1 (interleaved stages) each pp rank's share is cut into v equal model
 * chunks, and chunk c of rank r is virtual stage c * pp + r: the layers run rank 0's chunk 0, rank 1's chunk 0, ...,
 * rank pp-1's chunk 0, rank 0's chunk 1, and so on. `dsarl plan` and the models split with these functions, so a
 * plan and a run agree on every stage. */
#ifndef DSARL_PIPELINE_H
#define DSARL_PIPELINE_H

#include <stdint.h>
#include "dsarl/error.h"
#include "dsarl/export.h"
#include "dsarl/recipe.h"

DSARL_BEGIN_DECLS

/* ABI 1.4: starts[0..pp] = the first layer of each of pp stages of n_layers (starts[pp] = n_layers), from the
 * recipe's uneven-stage keys (recipe may be NULL: an even split). Refuses, in one sentence naming the keys, a split
 * that does not divide, a stage without layers, and virtual stages (a rank's layers are then not one range: use
 * dsarl_pipeline_chunk_layers). */
DSARL_API int dsarl_pipeline_stage_layers(const dsarl_node *recipe, int32_t n_layers, int32_t pp, int32_t *starts,
                                          dsarl_error *err);

/* ABI 1.5: *vpp = the model chunks per pp rank the recipe asks for (virtual_pipeline_model_parallel_size, null or
 * absent: 1; recipe NULL: 1). Refuses a value below 1 and, as Megatron does, one above 1 when pp is 1. */
DSARL_API int dsarl_pipeline_virtual_stages(const dsarl_node *recipe, int32_t pp, int32_t *vpp, dsarl_error *err);

/* ABI 1.5: starts[0..vpp*pp] = the first layer of every virtual stage k = chunk * pp + rank (starts[vpp*pp] =
 * n_layers): each rank's layers of the dsarl_pipeline_stage_layers split, cut into vpp equal chunks in Megatron's
 * interleaved order. Refuses, naming the keys, what that split refuses and a stage whose layer count vpp does not
 * divide. vpp 1 gives dsarl_pipeline_stage_layers' split. */
DSARL_API int dsarl_pipeline_chunk_layers(const dsarl_node *recipe, int32_t n_layers, int32_t pp, int32_t vpp,
                                          int32_t *starts, dsarl_error *err);

DSARL_END_DECLS

#endif /* DSARL_PIPELINE_H */
