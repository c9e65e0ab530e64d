/* glm5_plugin.c: descriptor and init of dsarl-model-glm5.so (both glm_moe_dsa families). */
#include "glm5_ops.h"

const dsarl_model_ops *const *glm5_plugin_tables(size_t *n);

static int glm5_init(const dsarl_host *host, dsarl_error *err)
{
    size_t n = 0;
    const dsarl_model_ops *const *tables = glm5_plugin_tables(&n);
    for (size_t i = 0; i < n; i++)
        DSARL_TRY(host->register_ops(host, DSARL_KIND_MODEL, &tables[i]->common, err));
    return DSARL_OK;
}

DSARL_PLUGIN_DEFINE("model-glm5", "0.2.0", "GLM-5 / GLM-5.1 and GLM-5.2 (IndexShare) glm_moe_dsa models", glm5_init)
