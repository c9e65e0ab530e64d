/* Plugin entry of dsarl-dsa-reference.so: registers the reference DSA ops table as (dsa, "reference"). */
#include "dsa_reference.h"

static int reference_init(const dsarl_host *host, dsarl_error *err)
{
    return host->register_ops(host, DSARL_KIND_DSA, &dsarl_dsa_reference_ops.common, err);
}

DSARL_PLUGIN_DEFINE("dsa-reference", "0.1.0", "DeepSeek Sparse Attention reference kernels (plain C oracle)",
                    reference_init)
