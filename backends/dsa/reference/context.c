/* create/destroy: the reference backend keeps no state (no plans, no workspaces: each op allocates the small
 * per-call buffers it needs), so the context only exists to check that the device is one it can run on. */
#include <stdlib.h>
#include <string.h>
#include "dsa_reference.h"

struct dsarl_dsa_context {
    int reserved;  // no state; a distinct allocation so create/destroy pair like every other backend
};

int dsa_reference_create(const dsarl_device_ops *device_ops, dsarl_device *dev, const dsarl_node *recipe,
                         dsarl_dsa_context **out, dsarl_error *err) {
    if (out == NULL)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa reference create: out is NULL; pass where to store the context");
    *out = NULL;
    // NULL device ops = the caller hands host float32 arrays directly (tests, tools).
    if (device_ops != NULL) {
        const char *name = device_ops->common.name != NULL ? device_ops->common.name : "(unnamed)";
        if (!(dsarl_device_capabilities(device_ops) & DSARL_DEVICE_CAP_HOST_MEMORY))
            return DSARL_FAIL(err, DSARL_E_UNSUPPORTED,
                              "the reference DSA backend runs its plain C loops on host memory; runtime.device=%s "
                              "does not report DSARL_DEVICE_CAP_HOST_MEMORY (choose a DSA backend for that device "
                              "with policy.megatron_cfg.model_overrides.dsa_kernel_backend, or leave it unset)",
                              name);
        if (device_ops->storage_dtype == NULL || dev == NULL || device_ops->storage_dtype(dev) != DSARL_DTYPE_F32)
            return DSARL_FAIL(err, DSARL_E_UNSUPPORTED,
                              "the reference DSA backend needs a host-memory device instance with float32 "
                              "storage; this device %s",
                              dev == NULL ? "instance is NULL" : "does not report float32 storage");
    }
    dsarl_dsa_context *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsa reference create: cannot allocate the context");
    *out = ctx;
    return DSARL_OK;
}

void dsa_reference_destroy(dsarl_dsa_context *ctx) { free(ctx); }
