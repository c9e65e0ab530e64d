/* math_plugin.c: the descriptor of dsarl-environment-math.so; it registers the environment "math". */
#include "math_verify.h"

static int math_init(const dsarl_host *host, dsarl_error *err)
{
    return host->register_ops(host, DSARL_KIND_ENVIRONMENT, &math_environment_ops.common, err);
}

DSARL_PLUGIN_DEFINE("environment-math", "0.2.0",
                    "Math reward: NeMo RL's hf_math_verify and dapo_math_verify, and a \\boxed{} mode",
                    math_init)
