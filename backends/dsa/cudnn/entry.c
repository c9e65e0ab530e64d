/* Plugin entry of dsarl-dsa-cudnn.so: registers the cudnn DSA ops table as (dsa, "cudnn"). */
#include "cudnn_dsa.h"

static int cudnn_init(const dsarl_host *host, dsarl_error *err)
{
    cdn_set_host(host); // create finds the tilelang table through it (tilelang may load after this plugin)
    return host->register_ops(host, DSARL_KIND_DSA, &dsarl_dsa_cudnn_ops.common, err);
}

DSARL_PLUGIN_DEFINE("dsa-cudnn", "0.1.0", "DeepSeek Sparse Attention through cuDNN 9.19 graphs (sm_90)", cudnn_init)
