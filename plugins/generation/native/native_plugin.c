/* native_plugin.c: the descriptor of dsarl-generation-native.so; it registers the generation engine "native". */
#include "native_generator.h"

static int native_init(const dsarl_host *host, dsarl_error *err)
{
    return host->register_ops(host, DSARL_KIND_GENERATION, &native_generation_ops.common, err);
}

DSARL_PLUGIN_DEFINE("generation-native", "0.1.0",
                    "Native rollouts: MLA-latent + indexer-key KV cache, prefill/decode with the training DSA ops",
                    native_init)
