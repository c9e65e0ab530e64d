/* Plugin entry of dsarl-dsa-tilelang.so: registers the tilelang DSA ops table as (dsa, "tilelang"). */
#include "tilelang.h"

static int tilelang_init(const dsarl_host *host, dsarl_error *err)
{
    return host->register_ops(host, DSARL_KIND_DSA, &dsarl_dsa_tilelang_ops.common, err);
}

DSARL_PLUGIN_DEFINE("dsa-tilelang", "0.1.0", "DeepSeek Sparse Attention tiled CUDA kernels (sm_90)", tilelang_init)
