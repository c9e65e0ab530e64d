/* context.c: the backend's state (cuDNN handle, the tilelang context it hands over to, plan cache, workspace from
 * the cuda device) and preferred_form. */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include "dsarl/recipe.h"
#include "graph.h"
#include "tilelang.h"

#define cdnCudaCheck(call, err)                                                                                 \
    do {                                                                                                        \
        cudaError_t cdn_rc_ = (call);                                                                           \
        if (cdn_rc_ != cudaSuccess)                                                                             \
            return dsarl_error_set((err), DSARL_E_DEVICE, __FILE__, __LINE__, "dsa cudnn: %s failed: %s", #call, \
                                   cudaGetErrorString(cdn_rc_));                                                \
    } while (0)

/* *out = the recipe key as a whole number in [1, max], or fallback when it is absent (or there is no recipe);
 * anything else is refused with one sentence naming the key, where it was set and its value. */
static int key_positive(const dsarl_node *recipe, const char *key, int64_t fallback, int64_t max, int64_t *out,
                        dsarl_error *err)
{
    *out = fallback;
    if (!recipe)
        return DSARL_OK;
    DSARL_TRY(dsarl_recipe_int_or(recipe, key, fallback, out, err));
    if (*out < 1 || *out > max)
        return dsarl_recipe_fail(recipe, key, err, DSARL_E_INVALID, "must be a whole number from 1 to %lld, got %lld",
                                 (long long)max, (long long)*out);
    return DSARL_OK;
}

static const dsarl_host *registry_host; /* the one static: set by init (cdn_set_host) */

void cdn_set_host(const dsarl_host *host) { registry_host = host; }

int cdn_check_batch(const char *op, const dsarl_dsa_batch *batch, dsarl_error *err)
{
    if (!batch || batch->n_queries < 0 || batch->n_keys < 0 || batch->max_keys_per_query < 0 ||
        (batch->n_queries > 0 && (!batch->key_start || !batch->key_end)))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa cudnn %s: the batch needs n_queries, n_keys, "
                          "max_keys_per_query >= 0 and key_start/key_end (Tq) device arrays", op);
    if (batch->n_keys > INT32_MAX || batch->n_queries > INT32_MAX)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa cudnn %s: n_queries and n_keys must be below 2^31", op);
    return DSARL_OK;
}

int cdn_check_attention(const char *op, const dsarl_dsa_attention_inputs *in, dsarl_error *err)
{
    if (!in || !in->q || !in->kv || in->n_heads <= 0 || in->d_qk <= 0 || in->d_v <= 0 || in->d_v > in->d_qk ||
        !isfinite(in->softmax_scale))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa cudnn %s: attention inputs need q and kv, n_heads > 0, "
                          "0 < d_v <= d_qk and a finite softmax_scale", op);
    return DSARL_OK;
}

// The device's stream (dsarl_device_ops.stream, ABI 1.2), or NULL (legacy default stream) for an older device.
static void *device_stream(const dsarl_device_ops *device_ops, dsarl_device *dev)
{
    if (!device_ops || !dev ||
        device_ops->common.struct_size < offsetof(dsarl_device_ops, stream) + sizeof(device_ops->stream) ||
        !device_ops->stream)
        return NULL;
    return device_ops->stream(dev);
}

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
    int64_t max_segment, cap;
    bool paged = false;
    // benchmarks and tests move the segment bound; tests shrink the dP cap to run one segment per launch
    DSARL_TRY(key_positive(recipe, "runtime.cudnn_max_segment", CDN_MAX_SEGMENT, INT32_MAX, &max_segment, err));
    DSARL_TRY(key_positive(recipe, "runtime.cudnn_dp_workspace_cap", CDN_DP_WORKSPACE_CAP, INT64_MAX, &cap, err));
    if (recipe) // measure the paged graph where tilelang is faster
        DSARL_TRY(dsarl_recipe_bool_or(recipe, "runtime.cudnn_paged_forward", false, &paged, err));
    const dsarl_ops_common *tl_common =
        registry_host && registry_host->find_ops ? registry_host->find_ops(registry_host, DSARL_KIND_DSA, "tilelang")
                                                 : NULL;
    if (!tl_common || tl_common->kind != DSARL_KIND_DSA || tl_common->struct_size < sizeof(dsarl_dsa_ops))
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "the cudnn DSA backend hands what cuDNN cannot run to the tilelang "
                          "DSA backend, which is not loaded (dsarl-dsa-tilelang.so must be on the plugin path)");
    const dsarl_dsa_ops *tl = (const dsarl_dsa_ops *)(const void *)tl_common;
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
    c->max_segment = (int32_t)max_segment;
    c->dp_workspace_cap = cap;
    c->paged_forced = paged;
    c->stream = device_stream(device_ops, dev);
    c->tl = tl;
    cudnnHandle_t handle = NULL;
    cudnnStatus_t st = cudnnCreate(&handle);
    if (st != CUDNN_STATUS_SUCCESS) {
        char last[512] = "";
        cudnnGetLastErrorString(last, sizeof last);
        free(c);
        return DSARL_FAIL(err, DSARL_E_DEVICE, "dsa cudnn create: cudnnCreate failed: %s (%s)",
                          cudnnGetErrorString(st), last);
    }
    c->handle = handle;
    st = cudnnSetStream(handle, (cudaStream_t)c->stream); // the device's stream: one order for all GPU work
    if (st != CUDNN_STATUS_SUCCESS) {
        cudnnDestroy(handle);
        free(c);
        return DSARL_FAIL(err, DSARL_E_DEVICE, "dsa cudnn create: cudnnSetStream failed: %s",
                          cudnnGetErrorString(st));
    }
    if (tl->create(device_ops, dev, recipe, &c->tilelang, err) < 0) {
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
    cudaStreamSynchronize((cudaStream_t)c->stream);
    for (int i = 0; i < c->n_plans; i++)
        cdn_plan_free(c->plans[i]);
    free(c->plans);
    release_workspace(c);
    free(c->host_segments);
    c->tl->destroy(c->tilelang);
    cudnnDestroy((cudnnHandle_t)c->handle);
    free(c);
}

int cdn_workspace(cudnn_dsa *c, size_t bytes, void **out, dsarl_error *err)
{
    if (bytes > c->workspace_bytes) {
        size_t want = bytes + bytes / 4;
        cdnCudaCheck(cudaStreamSynchronize((cudaStream_t)c->stream), err); /* queued work may use the old one */
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

/* One form for training and generation. Cached decode is always absorbed, and training in the per-head form (the
 * cuDNN graphs) rounds differently: on the tiny GRPO recipe (bf16, H200) that measured token_mult_prob_error
 * 1.0016-1.0019 per step, over the 1.001 the issue allows (the absorbed form in both: 1.000000). So every batch
 * gets the absorbed form unless the recipe asks for the per-head one (dsa_attention_form: headwise), which trades
 * that agreement for the fused cuDNN backward (at 8K tokens, 64 heads: 32 ms fwd + bwd against 196 ms absorbed). */
dsarl_dsa_form cdn_preferred_form(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, int32_t topk)
{
    (void)ctx, (void)batch, (void)topk;
    return DSARL_DSA_FORM_ABSORBED;
}
