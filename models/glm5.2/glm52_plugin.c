/* glm52_plugin.c: descriptor and init of dsarl-model-glm5.2.so. */
#include "glm5_ops.h"

const dsarl_model_ops *glm52_table(void);

static int glm52_init(const dsarl_host *host, dsarl_error *err)
{
    return host->register_ops(host, DSARL_KIND_MODEL, &glm52_table()->common, err);
}

DSARL_PLUGIN_DEFINE("model-glm5.2", "0.1.0", "GLM-5.2 glm_moe_dsa model (IndexShare)", glm52_init)
