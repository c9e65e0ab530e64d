/* cuda_memory.cu: lifetime and memory of the CUDA device: the GPU chosen by local rank, a stream per role, plain
 * cudaMalloc allocations (never managed memory), bf16 storage with host-side conversion on upload/download. */
#include <stdlib.h>
#include <string.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include "cuda_common.cuh"

#define GEMM_WORKSPACE_BYTES ((size_t)64 << 20) /* cuBLASLt's recommendation for Hopper is 32 MiB or more */

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
    dsarl_device *dev = (dsarl_device *)calloc(1, sizeof(*dev));
    if (!dev)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "device cuda: out of host memory creating the device");
    dev->ordinal = local_rank % count;
    dev->f32 = f32;
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
    cudaDeviceSynchronize();
    if (dev->blas)
        cublasDestroy((cublasHandle_t)dev->blas);
    if (dev->lt)
        cublasLtDestroy((cublasLtHandle_t)dev->lt);
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

int cuda_alloc(dsarl_device *dev, size_t bytes, void **out, dsarl_error *err)
{
    cudaError_t rc = cudaMalloc(out, bytes ? bytes : 256); /* cudaMalloc bases are 256-byte aligned */
    if (rc != cudaSuccess) {
        cudaGetLastError();
        size_t free_bytes = 0, total = 0;
        cudaMemGetInfo(&free_bytes, &total);
        return DSARL_FAIL(err, rc == cudaErrorMemoryAllocation ? DSARL_E_NOMEM : DSARL_E_DEVICE,
                          "device cuda: cannot allocate %zu bytes on GPU %d (%zu of %zu bytes free): %s", bytes,
                          dev->ordinal, free_bytes, total, cudaGetErrorString(rc));
    }
    return DSARL_OK;
}

void cuda_free(dsarl_device *dev, void *ptr)
{
    if (!ptr)
        return;
    // cudaFree waits for the device; no kernel can still be using ptr afterwards.
    cudaFree(ptr);
}

int cuda_scratch(dsarl_device *dev, size_t bytes, void **out, dsarl_error *err)
{
    if (bytes > dev->scratch_bytes) {
        size_t want = bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : bytes + bytes / 4;
        cudaCheck(cudaStreamSynchronize(CUDA_STREAM(dev)), err); /* queued kernels may still use the old one */
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
    // The caller owns the host buffer as soon as we return: finish the transfer (pageable memory).
    cudaCheck(cudaStreamSynchronize(copies), err);
    return DSARL_OK;
}

int cuda_zero(dsarl_device *dev, void *ptr, size_t bytes, dsarl_error *err)
{
    if (bytes)
        cudaCheck(cudaMemsetAsync(ptr, 0, bytes, CUDA_STREAM(dev)), err);
    return DSARL_OK;
}

int cuda_synchronize(dsarl_device *dev, dsarl_error *err)
{
    cudaCheck(cudaStreamSynchronize((cudaStream_t)dev->copies), err);
    cudaCheck(cudaStreamSynchronize(CUDA_STREAM(dev)), err);
    cudaCheck(cudaGetLastError(), err);
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
