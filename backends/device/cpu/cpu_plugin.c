/* cpu_plugin.c: descriptor and init of dsarl-device-cpu.so. */
#include "cpu_device.h"

static int cpu_plugin_init(const dsarl_host *host, dsarl_error *err)
{
    return host->register_ops(host, DSARL_KIND_DEVICE, &dsarl_cpu_device_ops.common, err);
}

DSARL_PLUGIN_DEFINE("device-cpu", "0.1.0", "CPU device: float32, OpenBLAS", cpu_plugin_init)
