/* context.cu: the backend's state (a growable device workspace) and its argument checks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "tilelang_common.cuh"

void *tilelang_device_stream(const dsarl_device_ops *device_ops, dsarl_device *dev)
{
    if (!device_ops || !dev ||
        device_ops->common.struct_size < offsetof(dsarl_device_ops, stream) + sizeof(device_ops->stream) ||
        !device_ops->stream)
        return NULL; /* a 1.0/1.1 device: its streams block on the legacy default stream */
    return device_ops->stream(dev);
}

int tilelang_create(const dsarl_device_ops *device_ops, dsarl_device *dev, const dsarl_node *recipe,
                    dsarl_dsa_context **out, dsarl_error *err)
{
    if (!out)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa tilelang create: out is NULL; pass where to store the context");
    *out = NULL;
    // NULL device ops = the caller hands device bf16 arrays directly (tests, tools); otherwise it must be cuda.
    if (device_ops && (!device_ops->common.name || strcmp(device_ops->common.name, "cuda") != 0))
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "the tilelang DSA backend runs on the cuda device only; "
                          "runtime.device=%s needs dsa_kernel_backend=reference",
                          device_ops->common.name ? device_ops->common.name : "(unnamed)");
    tilelang_settings settings; // before any CUDA call: a bad key is refused without a GPU
    DSARL_TRY(tilelang_read_settings(recipe, &settings, err));
    int device = 0, sms = 0;
    tlCheck(cudaGetDevice(&device), err);
    tlCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), err);
    dsarl_dsa_context *ctx = (dsarl_dsa_context *)calloc(1, sizeof(*ctx));
    if (!ctx)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsa tilelang create: cannot allocate the context");
    ctx->sm_count = sms;
    ctx->settings = settings;
    ctx->stream = tilelang_device_stream(device_ops, dev);
    ctx->f32 = device_ops && dev && device_ops->storage_dtype(dev) == DSARL_DTYPE_F32;
    *out = ctx;
    return DSARL_OK;
}

void tilelang_destroy(dsarl_dsa_context *ctx)
{
    if (!ctx)
        return;
    cudaStreamSynchronize((cudaStream_t)ctx->stream);
    cudaFree(ctx->workspace);
    free(ctx);
}

int tilelang_workspace(dsarl_dsa_context *ctx, size_t bytes, void **out, dsarl_error *err)
{
    if (bytes > ctx->workspace_bytes) {
        size_t want = bytes + bytes / 4;
        tlCheck(cudaStreamSynchronize((cudaStream_t)ctx->stream), err); /* queued kernels may use the old one */
        cudaFree(ctx->workspace);
        ctx->workspace = NULL;
        ctx->workspace_bytes = 0;
        tlCheck(cudaMalloc(&ctx->workspace, want), err);
        ctx->workspace_bytes = want;
    }
    *out = ctx->workspace;
    return DSARL_OK;
}

template <typename Storage>
static __global__ void flush_kernel(Storage *dst, const float *acc, int64_t n)
{
    GRID_STRIDE(i, n) { stf(dst + i, ldf(dst + i) + acc[i]); }
}

int tilelang_flush_accumulator(const dsarl_dsa_context *ctx, void *dst, const float *acc, int64_t n,
                               dsarl_error *err)
{
    if (n <= 0)
        return DSARL_OK;
    TL_LAUNCH(ctx->f32, ctx->stream, flush_kernel, grid_for(n, 256), 256, 0, (S *)dst, acc, n);
    tlCheckLaunch("key-gradient flush", err);
    return DSARL_OK;
}

int tilelang_check_batch(const char *op, const dsarl_dsa_batch *batch, dsarl_error *err)
{
    if (!batch || batch->n_queries < 0 || batch->n_keys < 0 || batch->max_keys_per_query < 0 ||
        (batch->n_queries > 0 && (!batch->key_start || !batch->key_end)))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa tilelang %s: the batch needs n_queries, n_keys, "
                          "max_keys_per_query >= 0 and key_start/key_end (Tq) device arrays", op);
    if (batch->n_keys > INT32_MAX || batch->n_queries > INT32_MAX)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa tilelang %s: n_queries and n_keys must be below 2^31", op);
    return DSARL_OK;
}

int tilelang_check_attention(const char *op, const dsarl_dsa_attention_inputs *in, dsarl_error *err)
{
    if (!in || !in->q || !in->kv || in->n_heads <= 0 || in->d_qk <= 0 || in->d_v <= 0 || in->d_v > in->d_qk ||
        !isfinite(in->softmax_scale))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa tilelang %s: attention inputs need q and kv, n_heads > 0, "
                          "0 < d_v <= d_qk and a finite softmax_scale", op);
    return DSARL_OK;
}

int tilelang_check_indexer(const char *op, const dsarl_dsa_indexer_inputs *in, dsarl_error *err)
{
    if (!in || !in->q || !in->k || !in->weights || in->n_heads <= 0 || in->head_dim <= 0 || in->n_heads > 1024)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa tilelang %s: indexer inputs need q, k and weights, "
                          "0 < n_heads <= 1024 and head_dim > 0", op);
    return DSARL_OK;
}
