/* pipeline.c: the pipeline stage split of a recipe (dsarl/pipeline.h), over the one split rule
 * dsarl_plan_chunk_layers that `dsarl plan` uses too. */
#include "dsarl/pipeline.h"

#include "plan.h"

#define MCFG "policy.megatron_cfg."

// An uneven-stage size key: null or absent = 0 (an even split), else in [1, 2^20].
static int stage_size_key(const dsarl_node *recipe, const char *key, int32_t *out, dsarl_error *err)
{
    int64_t v = 0;
    *out = 0;
    if (!recipe)
        return DSARL_OK;
    DSARL_TRY(dsarl_recipe_int_or(recipe, key, 0, &v, err));
    if (v < 0 || v > 1 << 20)
        return dsarl_recipe_fail(recipe, key, err, DSARL_E_INVALID, "must be null or in [1, 1048576], got %lld",
                                 (long long)v);
    *out = (int32_t)v;
    return DSARL_OK;
}

int dsarl_pipeline_virtual_stages(const dsarl_node *recipe, int32_t pp, int32_t *vpp, dsarl_error *err)
{
    int64_t v = 1;
    *vpp = 1;
    if (recipe)
        DSARL_TRY(dsarl_recipe_int_or(recipe, MCFG "virtual_pipeline_model_parallel_size", 1, &v, err));
    if (v < 1 || v > 1 << 20)
        return dsarl_recipe_fail(recipe, MCFG "virtual_pipeline_model_parallel_size", err, DSARL_E_INVALID,
                                 "must be null or in [1, 1048576], got %lld", (long long)v);
    if (v > 1 && pp <= 1)
        return dsarl_recipe_fail(recipe, MCFG "virtual_pipeline_model_parallel_size", err, DSARL_E_INVALID,
                                 "is %lld, but interleaved virtual stages need pipeline_model_parallel_size > 1 (it "
                                 "is %d); set it to null or 1", (long long)v, pp);
    *vpp = (int32_t)v;
    return DSARL_OK;
}

int dsarl_pipeline_stage_layers(const dsarl_node *recipe, int32_t n_layers, int32_t pp, int32_t *starts,
                                dsarl_error *err)
{
    int32_t vpp;
    DSARL_TRY(dsarl_pipeline_virtual_stages(recipe, pp, &vpp, err));
    if (vpp != 1)
        return dsarl_recipe_fail(recipe, MCFG "virtual_pipeline_model_parallel_size", err, DSARL_E_UNSUPPORTED,
                                 "is %d: a rank then holds %d model chunks, which this caller of "
                                 "dsarl_pipeline_stage_layers (built before ABI 1.5) cannot run; set it to null or 1",
                                 vpp, vpp);
    return dsarl_pipeline_chunk_layers(recipe, n_layers, pp, 1, starts, err);
}

int dsarl_pipeline_chunk_layers(const dsarl_node *recipe, int32_t n_layers, int32_t pp, int32_t vpp,
                                int32_t *starts, dsarl_error *err)
{
    int32_t first, last;
    DSARL_TRY(stage_size_key(recipe, MCFG "num_layers_in_first_pipeline_stage", &first, err));
    DSARL_TRY(stage_size_key(recipe, MCFG "num_layers_in_last_pipeline_stage", &last, err));
    return dsarl_plan_chunk_layers(n_layers, pp, vpp, first, last, starts, err);
}
