/* cpu_memory.c: lifetime and memory of the CPU device: plain host memory, float32 storage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cblas.h>
#include "cpu_device.h"

/* OpenBLAS's own knob; declared by its cblas.h but not by the netlib one, so declare it here. */
void openblas_set_num_threads(int num_threads);

int cpu_create(const dsarl_device_config *config, dsarl_device **out, dsarl_error *err)
{
    dsarl_device *dev = calloc(1, sizeof(*dev));
    if (!dev)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "device cpu: out of host memory creating the device");
    int64_t threads = config && config->threads > 0 ? config->threads : 0;
    if (threads == 0 && config && config->recipe) {
        int rc = dsarl_recipe_int_or(config->recipe, "runtime.threads", 0, &threads, err);
        if (rc == 0 && (threads < 0 || threads > 4096))
            rc = dsarl_recipe_fail(config->recipe, "runtime.threads", err, DSARL_E_INVALID,
                                   "must be in [0, 4096] (0 = one thread), got %lld", (long long)threads);
        if (rc) {
            free(dev);
            return rc;
        }
    }
    dev->threads = threads > 0 ? (int32_t)threads : 1;
    dev->seed = config ? config->seed : 0;
    openblas_set_num_threads(dev->threads);
    *out = dev;
    return DSARL_OK;
}

void cpu_destroy(dsarl_device *dev) { free(dev); }

dsarl_dtype cpu_storage_dtype(const dsarl_device *dev) { return DSARL_DTYPE_F32; }

int cpu_alloc(dsarl_device *dev, size_t bytes, void **out, dsarl_error *err)
{
    size_t rounded = (bytes + 255) / 256 * 256; /* aligned_alloc wants a multiple of the alignment */
    void *p = aligned_alloc(256, rounded ? rounded : 256);
    if (!p)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "device cpu: cannot allocate %zu bytes of host memory", bytes);
    *out = p;
    return DSARL_OK;
}

void cpu_free(dsarl_device *dev, void *ptr) { free(ptr); }

int cpu_copy(dsarl_device *dev, void *dst, const void *src, size_t bytes, dsarl_copy_kind kind, dsarl_error *err)
{
    if (bytes)
        memmove(dst, src, bytes);
    return DSARL_OK;
}

int cpu_zero(dsarl_device *dev, void *ptr, size_t bytes, dsarl_error *err)
{
    if (bytes)
        memset(ptr, 0, bytes);
    return DSARL_OK;
}

int cpu_synchronize(dsarl_device *dev, dsarl_error *err) { return DSARL_OK; }

int cpu_upload_f32(dsarl_device *dev, void *dst, dsarl_dtype dtype, const float *src, size_t n, dsarl_error *err)
{
    if (dtype != DSARL_DTYPE_F32)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "device cpu: upload_f32 stores f32 only, got dtype %d",
                          (int)dtype);
    if (n)
        memmove(dst, src, n * sizeof(float));
    return DSARL_OK;
}

int cpu_download_f32(dsarl_device *dev, float *dst, const void *src, dsarl_dtype dtype, size_t n, dsarl_error *err)
{
    if (dtype != DSARL_DTYPE_F32)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "device cpu: download_f32 reads f32 only, got dtype %d",
                          (int)dtype);
    if (n)
        memmove(dst, src, n * sizeof(float));
    return DSARL_OK;
}

// MemAvailable of /proc/meminfo in bytes (the kernel's estimate of what can be allocated without swapping: free
// memory plus the reclaimable page cache); 0 when the file or the line is missing (older kernels, not Linux).
static size_t meminfo_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
            break;
    fclose(f);
    return (size_t)kib * 1024;
}

int cpu_memory_info(dsarl_device *dev, size_t *free_bytes, size_t *total_bytes, dsarl_error *err)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0)
        return DSARL_FAIL(err, DSARL_E_DEVICE, "device cpu: sysconf cannot tell the physical memory of this machine");
    size_t total = (size_t)pages * (size_t)page, avail = meminfo_available();
    if (avail == 0) { // no MemAvailable: the free pages alone (the page cache counts as used)
        long free_pages = sysconf(_SC_AVPHYS_PAGES);
        avail = free_pages > 0 ? (size_t)free_pages * (size_t)page : 0;
    }
    *total_bytes = total;
    *free_bytes = avail < total ? avail : total;
    return DSARL_OK;
}
