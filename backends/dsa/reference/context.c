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
        if (strcmp(name, "cpu") != 0)
            return DSARL_FAIL(err, DSARL_E_UNSUPPORTED,
                              "the reference DSA backend runs on the cpu device only; runtime.device=%s needs "
                              "dsa_kernel_backend=tilelang or cudnn",
                              name);
        if (device_ops->storage_dtype == NULL || dev == NULL || device_ops->storage_dtype(dev) != DSARL_DTYPE_F32)
            return DSARL_FAIL(err, DSARL_E_UNSUPPORTED,
                              "the reference DSA backend needs a cpu device instance with float32 storage; this "
                              "cpu device %s",
                              dev == NULL ? "instance is NULL" : "does not report float32 storage");
    }
    dsarl_dsa_context *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsa reference create: cannot allocate the context");
    *out = ctx;
    return DSARL_OK;
}

void dsa_reference_destroy(dsarl_dsa_context *ctx) { free(ctx); }
