/* cuda_memory.cu: lifetime and memory of the CUDA device: the GPU chosen by local rank, a stream per role,
 * cudaMalloc allocations kept in a cache for reuse (never managed memory), bf16 storage with host-side conversion on
 * upload/download. */
#include <stdlib.h>
#include <string.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include "cuda_common.cuh"
#include "cuda_profile.h"
#include "dsarl/log.h"

#define GEMM_WORKSPACE_BYTES ((size_t)64 << 20) /* cuBLASLt's recommendation for Hopper is 32 MiB or more */

static void release_cached(dsarl_device *dev);
static void log_peak_memory(dsarl_device *dev);

int cuda_visible_devices(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" so later probes start clean */
        return 0;
    }
    return count;
}

int cuda_create(const dsarl_device_config *config, dsarl_device **out, dsarl_error *err)
{
    int count = cuda_visible_devices();
    if (count == 0)
        return DSARL_FAIL(err, DSARL_E_DEVICE, "device cuda: no CUDA device is visible to this process "
                          "(runtime.device=cuda needs a GPU; use runtime.device=cpu)");
    int local_rank = config && config->parallel ? config->parallel->local_rank : 0;
    // runtime.cuda_storage_dtype: bf16 (training and generation) or f32 (checking a model against the CPU run)
    int f32 = 0;
    if (config && config->recipe) {
        const char *storage = NULL;
        int rc = dsarl_recipe_string_or(config->recipe, "runtime.cuda_storage_dtype", "bf16", &storage, err);
        if (rc)
            return rc;
        if (strcmp(storage, "f32") != 0 && strcmp(storage, "bf16") != 0)
            return dsarl_recipe_fail(config->recipe, "runtime.cuda_storage_dtype", err, DSARL_E_INVALID,
                                     "must be bf16 or f32, got '%s'", storage);
        f32 = strcmp(storage, "f32") == 0;
    }
    bool profile = false; // runtime.cuda_profile: per-op GPU times printed at destroy
    const char *grouped = "lanes"; // runtime.cuda_grouped_gemm: gemm_grouped's kernel
    if (config && config->recipe) {
        int rc = dsarl_recipe_bool_or(config->recipe, "runtime.cuda_profile", false, &profile, err);
        if (rc)
            return rc;
        rc = dsarl_recipe_string_or(config->recipe, "runtime.cuda_grouped_gemm", "lanes", &grouped, err);
        if (rc)
            return rc;
        if (strcmp(grouped, "auto") != 0 && strcmp(grouped, "wgmma") != 0 && strcmp(grouped, "lanes") != 0)
            return dsarl_recipe_fail(config->recipe, "runtime.cuda_grouped_gemm", err, DSARL_E_INVALID,
                                     "must be auto, wgmma or lanes, got '%s'", grouped);
    }
    dsarl_device *dev = (dsarl_device *)calloc(1, sizeof(*dev));
    if (!dev)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "device cuda: out of host memory creating the device");
    dev->ordinal = local_rank % count;
    dev->local_rank = local_rank;
    dev->local_size = config && config->parallel ? config->parallel->local_size : 1;
    dev->f32 = f32;
    dev->grouped_wgmma = strcmp(grouped, "lanes") == 0 ? 0 : strcmp(grouped, "auto") == 0 ? 1 : 2;
    dev->seed = config ? config->seed : 0;
    *out = dev;
    cudaDeviceProp prop;
    cudaStream_t compute = NULL, copies = NULL;
    cudaEvent_t copy_done = NULL, compute_done = NULL;
    cublasLtHandle_t lt = NULL;
    cublasHandle_t blas = NULL;
    int rc = DSARL_OK;
    // Each step records what it made in dev, so cuda_destroy releases a half-built instance.
#define STEP(call)                                                                                              \
    do {                                                                                                        \
        cudaError_t step_rc_ = (call);                                                                          \
        if (step_rc_ != cudaSuccess) {                                                                          \
            rc = DSARL_FAIL(err, DSARL_E_DEVICE, "device cuda: %s failed on GPU %d: %s", #call, dev->ordinal,   \
                            cudaGetErrorString(step_rc_));                                                      \
            goto fail;                                                                                          \
        }                                                                                                       \
    } while (0)
    STEP(cudaSetDevice(dev->ordinal));
    STEP(cudaGetDeviceProperties(&prop, dev->ordinal));
    dev->sm_count = prop.multiProcessorCount;
    dev->sm90 = prop.major == 9 && prop.minor == 0;
    STEP(cudaStreamCreateWithFlags(&compute, cudaStreamDefault));
    dev->compute = compute;
    STEP(cudaStreamCreateWithFlags(&copies, cudaStreamDefault));
    dev->copies = copies;
    STEP(cudaEventCreateWithFlags(&copy_done, cudaEventDisableTiming));
    dev->copy_done = copy_done;
    STEP(cudaEventCreateWithFlags(&compute_done, cudaEventDisableTiming));
    dev->compute_done = compute_done;
    STEP(cudaMalloc(&dev->gemm_workspace, GEMM_WORKSPACE_BYTES));
    dev->gemm_workspace_bytes = GEMM_WORKSPACE_BYTES;
    STEP(cudaMalloc((void **)&dev->flag, sizeof(int)));
    STEP(cudaMemset(dev->flag, 0, sizeof(int)));
#undef STEP
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
        rc = DSARL_FAIL(err, DSARL_E_DEVICE, "device cuda: cublasLtCreate failed on GPU %d", dev->ordinal);
        goto fail;
    }
    dev->lt = lt;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(blas, compute) != CUBLAS_STATUS_SUCCESS) {
        rc = DSARL_FAIL(err, DSARL_E_DEVICE, "device cuda: cublasCreate failed on GPU %d", dev->ordinal);
        goto fail;
    }
    dev->blas = blas;
    cuda_profile_open(dev, profile);
    return DSARL_OK;
fail:
    if (blas)
        cublasDestroy(blas);
    dev->blas = NULL;
    cuda_destroy(dev);
    *out = NULL;
    return rc;
}

void cuda_destroy(dsarl_device *dev)
{
    if (!dev)
        return;
    cudaSetDevice(dev->ordinal);
    cuda_comm_destroy(dev); // first: it waits for queued collectives under the watchdog
    cudaDeviceSynchronize();
    if (dev->peak_held_bytes)
        log_peak_memory(dev);
    cuda_profile_close(dev);
    if (dev->blas)
        cublasDestroy((cublasHandle_t)dev->blas);
    if (dev->lt)
        cublasLtDestroy((cublasLtHandle_t)dev->lt);
    release_cached(dev);
    for (size_t i = 0; i < dev->n_live; i++) /* buffers a caller never freed */
        cudaFree(dev->live[i].ptr);
    free(dev->live);
    free(dev->cached);
    cuda_gemm_cache_free(dev);
    cudaFree(dev->gemm_workspace);
    cudaFree(dev->scratch);
    cudaFree(dev->flag);
    if (dev->copy_done)
        cudaEventDestroy((cudaEvent_t)dev->copy_done);
    if (dev->compute_done)
        cudaEventDestroy((cudaEvent_t)dev->compute_done);
    if (dev->compute)
        cudaStreamDestroy((cudaStream_t)dev->compute);
    if (dev->copies)
        cudaStreamDestroy((cudaStream_t)dev->copies);
    free(dev->host_staging);
    free(dev);
}

dsarl_dtype cuda_storage_dtype(const dsarl_device *dev) { return dev->f32 ? DSARL_DTYPE_F32 : DSARL_DTYPE_BF16; }

// Sizes are rounded (512 bytes below 1 MiB, 2 MiB above) so a pass's buffers of nearly equal sizes share blocks.
static size_t rounded(size_t bytes)
{
    size_t unit = bytes < ((size_t)1 << 20) ? 512 : ((size_t)2 << 20);
    return (bytes ? bytes : 1) + unit - 1 - ((bytes ? bytes : 1) + unit - 1) % unit;
}

static int push_block(cuda_block **list, size_t *n, size_t *cap, void *ptr, size_t bytes)
{
    if (*n == *cap) {
        size_t grown = *cap ? *cap * 2 : 256;
        cuda_block *l = (cuda_block *)realloc(*list, grown * sizeof(cuda_block));
        if (!l)
            return -1;
        *list = l, *cap = grown;
    }
    (*list)[(*n)++] = (cuda_block){ptr, bytes};
    return 0;
}

// Returns every cached block to the driver (before a retry of a failed cudaMalloc, and at destroy).
static void release_cached(dsarl_device *dev)
{
    if (!dev->n_cached)
        return;
    dsarl_error ignored; // a failure surfaces at the next call; the wait itself is watched if collectives are queued
    cuda_comm_wait(dev, dev->compute, &ignored);
    cudaDeviceSynchronize();
    for (size_t i = 0; i < dev->n_cached; i++)
        cudaFree(dev->cached[i].ptr);
    dev->n_cached = 0;
    dev->cached_bytes = 0;
}

// The allocator's peak counters after a block of `bytes` was handed out (from the cache or the driver).
static void count_live(dsarl_device *dev, size_t bytes)
{
    dev->live_bytes += bytes;
    if (dev->live_bytes > dev->peak_live_bytes)
        dev->peak_live_bytes = dev->live_bytes;
    if (dev->live_bytes + dev->cached_bytes > dev->peak_held_bytes)
        dev->peak_held_bytes = dev->live_bytes + dev->cached_bytes;
}

/* One line at destroy: the allocator's peaks, and the device memory in use then (cudaMemGetInfo: the context,
 * cuBLAS's and cuDNN's workspaces and every cached block included, since the cache is kept to the end). */
static void log_peak_memory(dsarl_device *dev)
{
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
        cudaGetLastError();
        free_bytes = total = 0;
    }
    const double gib = (double)((size_t)1 << 30);
    dsarl_log(DSARL_LOG_INFO, "device cuda: GPU %d peak memory: %.2f GiB in buffers, %.2f GiB held by the allocator; "
              "%.2f of %.2f GiB in use at exit", dev->ordinal, (double)dev->peak_live_bytes / gib,
              (double)dev->peak_held_bytes / gib, (double)(total - free_bytes) / gib, (double)total / gib);
}

int cuda_alloc(dsarl_device *dev, size_t bytes, void **out, dsarl_error *err)
{
    size_t want = rounded(bytes);
    // best fit among cached blocks no more than twice the size (a larger one stays for a larger request)
    size_t best = (size_t)-1;
    for (size_t i = 0; i < dev->n_cached; i++)
        if (dev->cached[i].bytes >= want && dev->cached[i].bytes <= 2 * want &&
            (best == (size_t)-1 || dev->cached[i].bytes < dev->cached[best].bytes))
            best = i;
    if (best != (size_t)-1) {
        cuda_block b = dev->cached[best];
        dev->cached[best] = dev->cached[--dev->n_cached];
        dev->cached_bytes -= b.bytes;
        if (push_block(&dev->live, &dev->n_live, &dev->cap_live, b.ptr, b.bytes)) {
            cudaFree(b.ptr);
            return DSARL_FAIL(err, DSARL_E_NOMEM, "device cuda: out of host memory for the allocator's lists");
        }
        *out = b.ptr;
        count_live(dev, b.bytes);
        return DSARL_OK;
    }
    cudaError_t rc = cudaMalloc(out, want); /* cudaMalloc bases are 256-byte aligned */
    if (rc == cudaErrorMemoryAllocation && dev->n_cached) {
        cudaGetLastError();
        release_cached(dev);
        rc = cudaMalloc(out, want);
    }
    if (rc != cudaSuccess) {
        cudaGetLastError();
        size_t free_bytes = 0, total = 0;
        cudaMemGetInfo(&free_bytes, &total);
        return DSARL_FAIL(err, rc == cudaErrorMemoryAllocation ? DSARL_E_NOMEM : DSARL_E_DEVICE,
                          "device cuda: cannot allocate %zu bytes on GPU %d (%zu of %zu bytes free): %s", bytes,
                          dev->ordinal, free_bytes, total, cudaGetErrorString(rc));
    }
    if (push_block(&dev->live, &dev->n_live, &dev->cap_live, *out, want)) {
        cudaFree(*out);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "device cuda: out of host memory for the allocator's lists");
    }
    count_live(dev, want);
    return DSARL_OK;
}

void cuda_free(dsarl_device *dev, void *ptr)
{
    if (!ptr)
        return;
    // the block goes back to the cache, not the driver: work queued on the compute stream that still reads it
    // runs before any later kernel that reuses it (one stream; copies wait for queued compute)
    for (size_t i = dev->n_live; i-- > 0;)
        if (dev->live[i].ptr == ptr) {
            cuda_block b = dev->live[i];
            dev->live[i] = dev->live[--dev->n_live];
            dev->live_bytes -= b.bytes;
            if (push_block(&dev->cached, &dev->n_cached, &dev->cap_cached, b.ptr, b.bytes) == 0)
                dev->cached_bytes += b.bytes;
            else
                cudaFree(b.ptr); // cudaFree waits for the device; nothing can still be using ptr afterwards
            return;
        }
    cudaFree(ptr); /* not ours (cannot happen through the ops table); the driver knows it */
}

/* ABI 1.7 memory_info: the driver's figures for this GPU. Blocks the allocator caches (freed by a caller, kept for
 * reuse) count as in use: the driver sees them allocated. */
int cuda_memory_info(dsarl_device *dev, size_t *free_bytes, size_t *total_bytes, dsarl_error *err)
{
    size_t free_now = 0, total = 0;
    cudaCheck(cudaSetDevice(dev->ordinal), err);
    cudaCheck(cudaMemGetInfo(&free_now, &total), err);
    *free_bytes = free_now, *total_bytes = total;
    return DSARL_OK;
}

int cuda_scratch(dsarl_device *dev, size_t bytes, void **out, dsarl_error *err)
{
    if (bytes > dev->scratch_bytes) {
        size_t want = bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : bytes + bytes / 4;
        DSARL_TRY(cuda_comm_wait(dev, dev->compute, err)); /* queued kernels may still use the old one */
        cudaFree(dev->scratch);
        dev->scratch = NULL;
        dev->scratch_bytes = 0;
        cudaCheck(cudaMalloc(&dev->scratch, want), err);
        dev->scratch_bytes = want;
    }
    *out = dev->scratch;
    return DSARL_OK;
}

int cuda_copy(dsarl_device *dev, void *dst, const void *src, size_t bytes, dsarl_copy_kind kind, dsarl_error *err)
{
    if (bytes == 0)
        return DSARL_OK;
    cudaStream_t compute = CUDA_STREAM(dev), copies = (cudaStream_t)dev->copies;
    if (kind == DSARL_COPY_DEVICE_TO_DEVICE) {
        cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute), err);
        return DSARL_OK;
    }
    if (kind != DSARL_COPY_HOST_TO_DEVICE && kind != DSARL_COPY_DEVICE_TO_HOST)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cuda: copy kind %d is not one of host-to-device (0), "
                          "device-to-host (1), device-to-device (2)", (int)kind);
    // The copy waits for queued compute (it may read its results or overwrite its inputs), and compute queued
    // afterwards waits for the copy.
    cudaCheck(cudaEventRecord((cudaEvent_t)dev->compute_done, compute), err);
    cudaCheck(cudaStreamWaitEvent(copies, (cudaEvent_t)dev->compute_done, 0), err);
    cudaCheck(cudaMemcpyAsync(dst, src, bytes,
                              kind == DSARL_COPY_HOST_TO_DEVICE ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                              copies), err);
    cudaCheck(cudaEventRecord((cudaEvent_t)dev->copy_done, copies), err);
    cudaCheck(cudaStreamWaitEvent(compute, (cudaEvent_t)dev->copy_done, 0), err);
    // The caller owns the host buffer as soon as we return: finish the transfer (pageable memory). The copy waits
    // for queued compute, collectives included, so the wait is cuda_comm_wait's (watched while NCCL work is queued).
    return cuda_comm_wait(dev, copies, err);
}

int cuda_zero(dsarl_device *dev, void *ptr, size_t bytes, dsarl_error *err)
{
    if (bytes)
        cudaCheck(cudaMemsetAsync(ptr, 0, bytes, CUDA_STREAM(dev)), err);
    return DSARL_OK;
}

void *cuda_stream(dsarl_device *dev)
{
    return dev ? dev->compute : NULL;
}

int cuda_synchronize(dsarl_device *dev, dsarl_error *err)
{
    cudaCheck(cudaStreamSynchronize((cudaStream_t)dev->copies), err);
    DSARL_TRY(cuda_comm_wait(dev, dev->compute, err)); // watched while NCCL work is queued
    cudaCheck(cudaGetLastError(), err);
    cuda_profile_drain(dev);
    return DSARL_OK;
}

static int staging(dsarl_device *dev, size_t bytes, dsarl_error *err)
{
    if (bytes <= dev->host_staging_bytes)
        return DSARL_OK;
    void *p = realloc(dev->host_staging, bytes);
    if (!p)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "device cuda: cannot allocate %zu bytes of host staging", bytes);
    dev->host_staging = p;
    dev->host_staging_bytes = bytes;
    return DSARL_OK;
}

int cuda_upload_f32(dsarl_device *dev, void *dst, dsarl_dtype dtype, const float *src, size_t n, dsarl_error *err)
{
    if (dtype == DSARL_DTYPE_F32)
        return cuda_copy(dev, dst, src, n * sizeof(float), DSARL_COPY_HOST_TO_DEVICE, err);
    if (dtype != DSARL_DTYPE_BF16)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "device cuda: upload_f32 stores f32 or bf16, got dtype %s",
                          dsarl_dtype_name(dtype));
    DSARL_TRY(staging(dev, n * sizeof(dsarl_bf16), err));
    dsarl_bf16 *h = (dsarl_bf16 *)dev->host_staging;
    for (size_t i = 0; i < n; i++)
        h[i] = dsarl_f32_to_bf16(src[i]);
    return cuda_copy(dev, dst, h, n * sizeof(dsarl_bf16), DSARL_COPY_HOST_TO_DEVICE, err);
}

int cuda_download_f32(dsarl_device *dev, float *dst, const void *src, dsarl_dtype dtype, size_t n, dsarl_error *err)
{
    if (dtype == DSARL_DTYPE_F32)
        return cuda_copy(dev, dst, src, n * sizeof(float), DSARL_COPY_DEVICE_TO_HOST, err);
    if (dtype != DSARL_DTYPE_BF16)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "device cuda: download_f32 reads f32 or bf16, got dtype %s",
                          dsarl_dtype_name(dtype));
    DSARL_TRY(staging(dev, n * sizeof(dsarl_bf16), err));
    dsarl_bf16 *h = (dsarl_bf16 *)dev->host_staging;
    DSARL_TRY(cuda_copy(dev, h, src, n * sizeof(dsarl_bf16), DSARL_COPY_DEVICE_TO_HOST, err));
    for (size_t i = 0; i < n; i++)
        dst[i] = dsarl_bf16_to_f32(h[i]);
    return DSARL_OK;
}
