/* calculator_plugin.c: the descriptor of dsarl-environment-calculator.so; it registers the environment
 * "calculator". */
#include "calculator_eval.h"

static int calculator_init(const dsarl_host *host, dsarl_error *err)
{
    return host->register_ops(host, DSARL_KIND_ENVIRONMENT, &calculator_environment_ops.common, err);
}

DSARL_PLUGIN_DEFINE("environment-calculator", "0.1.0", "Calculator tool for multi-turn rollouts (sandboxed)",
                    calculator_init)
