/* cuda_test_util.h: what the GPU suites share (check_device_cuda, check_glm5_cuda, check_dsa_tilelang,
 * check_dsa_cudnn, check_dsa_indexer_fast, check_dsa_mla_sm90, check_dsa_mla_bwd_sm90): the run's seed and random
 * stream (dsa_test_util.h's), bf16-valued random arrays, device buffers up and down, the relative-error check of a
 * device result against a host reference (printed: the logs are grepped for "rel err"), and DSA batches and index
 * rows with their device copies. Every helper takes the device explicitly; failures are Check assertions with the
 * device's message. Header-only: each suite is its own executable. A suite that links the CPU device too defines
 * DSARL_CUDA_DEVICE_OPAQUE and includes cuda_device.h before this header. */
#ifndef DSARL_TEST_CUDA_TEST_UTIL_H
#define DSARL_TEST_CUDA_TEST_UTIL_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime_api.h>

#include "cuda_device.h"
#include "dsa_test_util.h"

/* ------------------------------------------------------------------------------------------------------------
 * The run's seed and random values. */

// Sets the run's seed from DSARL_TEST_SEED, else the suite's fixed seed (so that a GPU run repeats its inputs),
// prints it, and returns the suite's stream.
static inline rng cuda_test_seed(const char *suite, uint64_t fixed_seed) {
    const char *env = getenv("DSARL_TEST_SEED");
    test_seed = env ? strtoull(env, NULL, 0) : fixed_seed;
    printf("%s: DSARL_TEST_SEED=%llu\n", suite, (unsigned long long)test_seed);
    return rng_for(0);
}

// The nearest bf16 value of x (ties to even): what a bf16 device buffer holds for it.
static inline float bf16_value(float x) { return dsarl_bf16_to_f32(dsarl_f32_to_bf16(x)); }

// n values uniform in [-scale, scale), rounded to bf16 so that the host reference and the device see the same numbers.
static inline float *rand_bf16(rng *r, int64_t n, float scale) {
    float *a = random_floats(r, n, scale);
    for (int64_t i = 0; i < n; i++)
        a[i] = bf16_value(a[i]);
    return a;
}

// A copy of x rounded to bf16 (a reference output the device would store in bf16, fed back as an input).
static inline float *round_bf16(const float *x, int64_t n) {
    float *a = zalloc((size_t)n, sizeof(float));
    for (int64_t i = 0; i < n; i++)
        a[i] = bf16_value(x[i]);
    return a;
}

/* ------------------------------------------------------------------------------------------------------------
 * Device buffers. */

static inline void *dev_alloc(dsarl_device *gpu, size_t bytes) {
    dsarl_error e;
    void *d = NULL;
    ck_assert_msg(cuda_alloc(gpu, bytes > 0 ? bytes : 1, &d, &e) == 0, "%s", e.message);
    return d;
}

// n elements of dtype (bf16 or f32) on the device, holding the float32 values h converted (uninitialised if NULL).
static inline void *to_gpu_as(dsarl_device *gpu, const float *h, int64_t n, dsarl_dtype dtype) {
    dsarl_error e;
    void *d = dev_alloc(gpu, (size_t)n * dsarl_dtype_size(dtype));
    if (h)
        ck_assert_msg(cuda_upload_f32(gpu, d, dtype, h, (size_t)n, &e) == 0, "%s", e.message);
    return d;
}

static inline void *to_gpu_bf16(dsarl_device *gpu, const float *h, int64_t n) {
    return to_gpu_as(gpu, h, n, DSARL_DTYPE_BF16);
}

static inline float *to_gpu_f32(dsarl_device *gpu, const float *h, int64_t n) {
    return to_gpu_as(gpu, h, n, DSARL_DTYPE_F32);
}

// n int32 on the device, holding h (uninitialised if NULL).
static inline int32_t *to_gpu_i32(dsarl_device *gpu, const int32_t *h, int64_t n) {
    dsarl_error e;
    int32_t *d = dev_alloc(gpu, (size_t)n * sizeof(int32_t));
    if (h)
        ck_assert_msg(cuda_copy(gpu, d, h, (size_t)n * sizeof(int32_t), DSARL_COPY_HOST_TO_DEVICE, &e) == 0, "%s",
                      e.message);
    return d;
}

// n float32 values read from d (bf16 or f32), after all queued work (a kernel's fault fails here, not later).
static inline float *from_gpu(dsarl_device *gpu, const void *d, int64_t n, dsarl_dtype dtype) {
    dsarl_error e;
    float *h = zalloc((size_t)n, sizeof(float));
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    ck_assert_msg(cuda_download_f32(gpu, h, d, dtype, (size_t)n, &e) == 0, "%s", e.message);
    return h;
}

static inline int32_t *from_gpu_i32(dsarl_device *gpu, const int32_t *d, int64_t n) {
    dsarl_error e;
    int32_t *h = zalloc((size_t)n, sizeof(int32_t));
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    ck_assert_msg(cuda_copy(gpu, h, d, (size_t)n * sizeof(int32_t), DSARL_COPY_DEVICE_TO_HOST, &e) == 0, "%s",
                  e.message);
    return h;
}

/* ------------------------------------------------------------------------------------------------------------
 * Comparing a device result with a host reference. */

// Where a suite's comparisons read from and how they print.
typedef struct close_check {
    dsarl_device *gpu;
    const char *label; // starts each printed line: the suite's name and a colon
    int width;         // of the printed name column
    int norm;          // also print the normwise error ||got - want|| / ||want|| (the MLA suites)
} close_check;

// Downloads n values of dtype from d and checks max |got - want| <= tol * max(ref_floor, max |want|), printing the
// measured error. A non-finite want (an +inf lse row) must be matched exactly; every other element must be finite.
// ref_floor 1 measures lse-like values absolutely near 0; else 1e-30 (expect_close).
static inline void expect_close_floor(const close_check *cc, const void *d, dsarl_dtype dtype, const float *want,
                                      int64_t n, double tol, double ref_floor, const char *what) {
    float *got = from_gpu(cc->gpu, d, n, dtype);
    double maxref = ref_floor, maxerr = 0.0, num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(want[i])) {
            ck_assert_msg(got[i] == want[i], "%s: element %lld is %g, want %g", what, (long long)i, got[i], want[i]);
            continue;
        }
        ck_assert_msg(isfinite(got[i]), "%s: element %lld is %g, want %g (unwritten or overflow)", what, (long long)i,
                      got[i], want[i]);
        double diff = (double)got[i] - want[i];
        maxref = fmax(maxref, fabs(want[i]));
        maxerr = fmax(maxerr, fabs(diff));
        num += diff * diff;
        den += (double)want[i] * want[i];
    }
    if (cc->norm)
        printf("%s %-*s norm rel err %.2e, max rel err %.2e (tol %.0e, n %lld)\n", cc->label, cc->width, what,
               den > 0.0 ? sqrt(num / den) : sqrt(num), maxerr / maxref, tol, (long long)n);
    else
        printf("%s %-*s rel err %.2e (tol %.0e, n %lld)\n", cc->label, cc->width, what, maxerr / maxref, tol,
               (long long)n);
    ck_assert_msg(maxerr <= tol * maxref, "%s: max abs error %.3g vs max |ref| %.3g (tol %.1g)", what, maxerr, maxref,
                  tol);
    free(got);
}

static inline void expect_close(const close_check *cc, const void *d, dsarl_dtype dtype, const float *want, int64_t n,
                                double tol, const char *what) {
    expect_close_floor(cc, d, dtype, want, n, tol, 1e-30, what);
}

/* ------------------------------------------------------------------------------------------------------------
 * DSA batches with device ranges, and index rows. */

// tb->dev: tb->b with its ranges copied to device memory (where the ops under test read them).
static inline void batch_to_gpu(dsarl_device *gpu, test_batch *tb) {
    tb->dev = tb->b;
    tb->dev.key_start = to_gpu_i32(gpu, tb->key_start, tb->b.n_queries);
    tb->dev.key_end = to_gpu_i32(gpu, tb->key_end, tb->b.n_queries);
}

// Causal packed THD (dsa_test_util.h's batch_packed), with the device copy.
static inline void batch_packed_gpu(dsarl_device *gpu, test_batch *tb, const int32_t *lengths, int n_seq) {
    batch_packed(tb, lengths, n_seq);
    batch_to_gpu(gpu, tb);
}

// Decode: query t sees its own window of a longer key array, at least min_len keys long and uniform in length and
// place; the middle query's window is empty. With the device copy.
static inline void batch_decode_gpu(dsarl_device *gpu, rng *r, test_batch *tb, int64_t n_queries, int32_t n_keys,
                                    int32_t min_len) {
    batch_alloc(tb, n_queries, n_keys);
    for (int64_t t = 0; t < n_queries; t++) {
        int32_t len = min_len + rng_below(r, n_keys - min_len + 1);
        tb->key_start[t] = rng_below(r, n_keys - len + 1);
        tb->key_end[t] = tb->key_start[t] + len;
    }
    tb->key_end[n_queries / 2] = tb->key_start[n_queries / 2];
    batch_set_max(tb);
    batch_to_gpu(gpu, tb);
}

static inline void batch_free_gpu(dsarl_device *gpu, test_batch *tb) {
    cuda_free(gpu, (void *)tb->dev.key_start);
    cuda_free(gpu, (void *)tb->dev.key_end);
    batch_free(tb);
}

// Random index rows with repeats: each slot a random key of the query's range (so keys repeat within a row, which
// the backward's reductions must sum) or -1 (15%); the last row all -1. dsa_test_util.h's random_indices draws
// distinct keys instead.
static inline int32_t *random_indices_repeats(rng *r, const test_batch *tb, int32_t topk) {
    int64_t tq = tb->b.n_queries;
    int32_t *idx = zalloc((size_t)(tq * topk), sizeof(int32_t));
    for (int64_t t = 0; t < tq; t++)
        for (int32_t i = 0; i < topk; i++) {
            int32_t n = tb->key_end[t] - tb->key_start[t];
            int drop = rng_below(r, 20) < 3 || n == 0 || t == tq - 1;
            idx[t * topk + i] = drop ? -1 : tb->key_start[t] + rng_below(r, n);
        }
    return idx;
}

// One index row: `valid` distinct keys of [start, end) (capped at the range size and topk) in random order at random
// slots, the rest -1; with `repeats`, a few valid slots repeat another slot's key.
static inline void fill_index_row(rng *r, int32_t *row, int32_t topk, int32_t start, int32_t end, int32_t valid,
                                  int repeats) {
    int32_t n = end - start;
    valid = valid < n ? valid : n;
    valid = valid < topk ? valid : topk;
    for (int32_t i = 0; i < topk; i++)
        row[i] = -1;
    // distinct keys: a partial Fisher-Yates shuffle of the range, placed at random free slots
    int32_t *pool = zalloc((size_t)n, sizeof(int32_t));
    for (int32_t i = 0; i < n; i++)
        pool[i] = start + i;
    for (int32_t i = 0; i < valid; i++) {
        int32_t j = i + rng_below(r, n - i), tmp = pool[i];
        pool[i] = pool[j], pool[j] = tmp;
    }
    for (int32_t placed = 0; placed < valid;) {
        int32_t slot = rng_below(r, topk);
        if (row[slot] == -1)
            row[slot] = pool[placed++];
    }
    free(pool);
    if (repeats && valid > 1)
        for (int k = 0; k < 3; k++) { // copy a valid key into another valid slot
            int32_t a = rng_below(r, topk), b = rng_below(r, topk);
            if (row[a] >= 0 && row[b] >= 0)
                row[b] = row[a];
        }
}

#endif /* DSARL_TEST_CUDA_TEST_UTIL_H */
