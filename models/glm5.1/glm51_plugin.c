/* glm51_plugin.c: descriptor and init of dsarl-model-glm5.1.so. */
#include "glm5_ops.h"

const dsarl_model_ops *glm51_table(void);

static int glm51_init(const dsarl_host *host, dsarl_error *err)
{
    return host->register_ops(host, DSARL_KIND_MODEL, &glm51_table()->common, err);
}

DSARL_PLUGIN_DEFINE("model-glm5.1", "0.1.0", "GLM-5 / GLM-5.1 glm_moe_dsa model", glm51_init)
