/* context.c: the backend's state (cuDNN handle, the tilelang context it hands over to, plan cache, workspace from
 * the cuda device) and preferred_form. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include "graph.h"
#include "tilelang.h"

#define cdnCudaCheck(call, err)                                                                                 \
    do {                                                                                                        \
        cudaError_t cdn_rc_ = (call);                                                                           \
        if (cdn_rc_ != cudaSuccess)                                                                             \
            return dsarl_error_set((err), DSARL_E_DEVICE, __FILE__, __LINE__, "dsa cudnn: %s failed: %s", #call, \
                                   cudaGetErrorString(cdn_rc_));                                                \
    } while (0)

int cdn_create(const dsarl_device_ops *device_ops, dsarl_device *dev, const dsarl_node *recipe,
               dsarl_dsa_context **out, dsarl_error *err)
{
    if (!out)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa cudnn create: out is NULL; pass where to store the context");
    *out = NULL;
    if (device_ops && (!device_ops->common.name || strcmp(device_ops->common.name, "cuda") != 0))
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "the cudnn DSA backend runs on the cuda device only; "
                          "runtime.device=%s needs dsa_kernel_backend=reference",
                          device_ops->common.name ? device_ops->common.name : "(unnamed)");
    size_t version = cudnnGetVersion();
    if (version < 91900)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "the cudnn DSA backend needs cuDNN 9.19 or newer at run time, "
                          "found %zu.%zu.%zu (libcudnn.so.9 on LD_LIBRARY_PATH; tools/gpu-env finds a wheel's)",
                          version / 10000, version / 100 % 100, version % 100);
    cudnn_dsa *c = calloc(1, sizeof(*c));
    if (!c)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsa cudnn create: cannot allocate the context");
    c->device_ops = device_ops;
    c->dev = dev;
    c->f32 = device_ops && dev && device_ops->storage_dtype(dev) == DSARL_DTYPE_F32;
    c->max_segment = CDN_MAX_SEGMENT;
    const char *max_segment = getenv("DSARL_CUDNN_MAX_SEGMENT"); // benchmarks and tests move the bound
    if (max_segment && atoi(max_segment) > 0)
        c->max_segment = atoi(max_segment);
    const char *paged = getenv("DSARL_CUDNN_PAGED_FORWARD"); // measure the paged graph where tilelang is faster
    c->paged_forced = paged && strcmp(paged, "1") == 0;
    const char *cap = getenv("DSARL_CUDNN_DP_CAP"); // tests shrink it to run one segment per launch
    c->dp_workspace_cap = cap && atoll(cap) > 0 ? atoll(cap) : CDN_DP_WORKSPACE_CAP;
    cudnnHandle_t handle = NULL;
    cudnnStatus_t st = cudnnCreate(&handle);
    if (st != CUDNN_STATUS_SUCCESS) {
        char last[512] = "";
        cudnnGetLastErrorString(last, sizeof last);
        free(c);
        return DSARL_FAIL(err, DSARL_E_DEVICE, "dsa cudnn create: cudnnCreate failed: %s (%s)",
                          cudnnGetErrorString(st), last);
    }
    c->handle = handle; // default stream: the legacy default stream, which the cuda device's streams block on
    if (tilelang_create(device_ops, dev, recipe, &c->tilelang, err) < 0) {
        cudnnDestroy(handle);
        free(c);
        return -1;
    }
    *out = (dsarl_dsa_context *)(void *)c;
    return DSARL_OK;
}

static void release_workspace(cudnn_dsa *c)
{
    if (!c->workspace)
        return;
    if (c->device_ops)
        c->device_ops->free(c->dev, c->workspace);
    else
        cudaFree(c->workspace);
    c->workspace = NULL;
    c->workspace_bytes = 0;
}

void cdn_destroy(dsarl_dsa_context *ctx)
{
    cudnn_dsa *c = cdn_ctx(ctx);
    if (!c)
        return;
    cudaDeviceSynchronize();
    for (int i = 0; i < c->n_plans; i++)
        cdn_plan_free(c->plans[i]);
    free(c->plans);
    release_workspace(c);
    free(c->host_segments);
    tilelang_destroy(c->tilelang);
    cudnnDestroy((cudnnHandle_t)c->handle);
    free(c);
}

int cdn_workspace(cudnn_dsa *c, size_t bytes, void **out, dsarl_error *err)
{
    if (bytes > c->workspace_bytes) {
        size_t want = bytes + bytes / 4;
        cdnCudaCheck(cudaDeviceSynchronize(), err); /* queued work may still use the old workspace */
        release_workspace(c);
        if (c->device_ops)
            DSARL_TRY(c->device_ops->alloc(c->dev, want, &c->workspace, err));
        else
            cdnCudaCheck(cudaMalloc(&c->workspace, want), err);
        c->workspace_bytes = want;
    }
    *out = c->workspace;
    return DSARL_OK;
}

dsarl_dsa_form cdn_preferred_form(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, int32_t topk)
{
    cudnn_dsa *c = cdn_ctx(ctx);
    // float32 storage keeps the exact absorbed kernels (the cuDNN graphs compute in bf16)
    if (!c || c->f32 || !batch || !batch->host_cu_seqlens || batch->n_segments <= 0)
        return DSARL_DSA_FORM_ABSORBED;
    (void)topk; // the bound holds with or without the bias: the backward's workspace grows as S^2 either way
    for (int32_t i = 0; i < batch->n_segments; i++)
        if (batch->host_cu_seqlens[i + 1] - batch->host_cu_seqlens[i] > c->max_segment)
            return DSARL_DSA_FORM_ABSORBED;
    return DSARL_DSA_FORM_HEADWISE;
}
