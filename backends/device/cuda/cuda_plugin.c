/* cuda_plugin.c: descriptor and init of dsarl-device-cuda.so. Registering needs no GPU: create() is what fails,
 * with a clear message, on a machine without one. */
#include "cuda_device.h"

static int cuda_plugin_init(const dsarl_host *host, dsarl_error *err)
{
    return host->register_ops(host, DSARL_KIND_DEVICE, &dsarl_cuda_device_ops.common, err);
}

DSARL_PLUGIN_DEFINE("device-cuda", "0.1.0", "CUDA device: bf16 storage, cuBLASLt, CUDA kernels", cuda_plugin_init)
