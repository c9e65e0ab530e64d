/* dsa_test_util.h: what the CPU suites of the DSA ops share (check_dsa_reference, check_dsa_headwise; the GPU suites
 * too, through cuda_test_util.h): test-only random numbers (splitmix64 streams from the run's seed, independent of
 * dsarl's own generator), random arrays, packed or hand-made key-range batches and random index rows. Header-only:
 * each suite is its own executable. */
#ifndef DSARL_TEST_DSA_TEST_UTIL_H
#define DSARL_TEST_DSA_TEST_UTIL_H

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dsarl/ops/dsa.h"

/* The run's seed (each suite's main sets it, from DSARL_TEST_SEED or the clock, and prints it). */
static uint64_t test_seed;

typedef struct rng {
    uint64_t state;
} rng;

static inline uint64_t rng_next(rng *r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// A generator for one test: the run's seed mixed with a per-test stream number.
static inline rng rng_for(uint64_t stream) {
    rng r = {test_seed * 0x2545F4914F6CDD1DULL + stream * 0x9E3779B97F4A7C15ULL};
    rng_next(&r);
    return r;
}

// Uniform in [-1, 1).
static inline float rng_sym(rng *r) { return (float)((double)(rng_next(r) >> 11) * 0x1.0p-53 * 2.0 - 1.0); }

// Uniform integer in [0, n).
static inline int32_t rng_below(rng *r, int32_t n) { return (int32_t)(rng_next(r) % (uint64_t)n); }

static inline float *random_floats(rng *r, int64_t n, float amplitude) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(x);
    for (int64_t i = 0; i < n; i++)
        x[i] = amplitude * rng_sym(r);
    return x;
}

static inline void *zalloc(size_t n, size_t size) {
    void *p = calloc(n > 0 ? n : 1, size);
    ck_assert_ptr_nonnull(p);
    return p;
}

/* ------------------------------------------------------------------------------------------------------------
 * Batches and index rows. */

typedef struct test_batch {
    dsarl_dsa_batch b;
    int32_t *key_start, *key_end;  // (Tq)
    int32_t cu[16];                // causal packs: the segments (host_cu_seqlens), else unused
    dsarl_dsa_batch dev;           // the GPU suites: b with its ranges in device memory (cuda_test_util.h)
} test_batch;

static inline void batch_alloc(test_batch *tb, int64_t n_queries, int64_t n_keys) {
    memset(tb, 0, sizeof(*tb));
    tb->key_start = zalloc((size_t)n_queries, sizeof(int32_t));
    tb->key_end = zalloc((size_t)n_queries, sizeof(int32_t));
    tb->b = (dsarl_dsa_batch){.struct_size = sizeof(dsarl_dsa_batch), .n_queries = n_queries, .n_keys = n_keys,
                              .key_start = tb->key_start, .key_end = tb->key_end};
}

static inline void batch_set_max(test_batch *tb) {
    int32_t max = 0;
    for (int64_t t = 0; t < tb->b.n_queries; t++)
        max = tb->key_end[t] - tb->key_start[t] > max ? tb->key_end[t] - tb->key_start[t] : max;
    tb->b.max_keys_per_query = max;
}

// Causal packed THD, with the host copy of the segments the model hands over (ABI 1.1).
static inline void batch_packed(test_batch *tb, const int32_t *lengths, int n_seq) {
    int64_t total = 0;
    for (int i = 0; i < n_seq; i++)
        total += lengths[i];
    batch_alloc(tb, total, total);
    ck_assert_int_lt(n_seq, 16);
    int32_t t = 0;
    for (int i = 0; i < n_seq; i++) {
        tb->cu[i] = t;
        for (int32_t j = 0, first = t; j < lengths[i]; j++, t++)
            tb->key_start[t] = first, tb->key_end[t] = t + 1;
    }
    tb->cu[n_seq] = t;
    tb->b.host_cu_seqlens = tb->cu;
    tb->b.n_segments = n_seq;
    batch_set_max(tb);
}

static inline void batch_free(test_batch *tb) {
    free(tb->key_start);
    free(tb->key_end);
}

// Random index rows: a random subset of distinct keys of the range (min(topk, eligible), one fewer a third of the
// time) scattered over random slots, -1 elsewhere; row empty_row (if >= 0) is all -1.
static inline int32_t *random_indices(rng *r, const test_batch *tb, int32_t topk, int64_t empty_row) {
    int64_t tq = tb->b.n_queries;
    int32_t *indices = zalloc((size_t)(tq * topk), sizeof(int32_t));
    int32_t *pool = zalloc((size_t)tb->b.n_keys, sizeof(int32_t)), *slots = zalloc((size_t)topk, sizeof(int32_t));
    for (int64_t t = 0; t < tq; t++) {
        int32_t n = tb->key_end[t] - tb->key_start[t], k = n < topk ? n : topk;
        if (k > 1 && rng_below(r, 3) == 0)
            k--;
        if (t == empty_row)
            k = 0;
        for (int32_t i = 0; i < n; i++)
            pool[i] = tb->key_start[t] + i;
        for (int32_t i = 0; i < k; i++) {
            int32_t j = i + rng_below(r, n - i), tmp = pool[i];
            pool[i] = pool[j], pool[j] = tmp;
        }
        for (int32_t i = 0; i < topk; i++)
            slots[i] = i;
        for (int32_t i = 0; i < topk; i++) {
            int32_t j = i + rng_below(r, topk - i), tmp = slots[i];
            slots[i] = slots[j], slots[j] = tmp;
        }
        int32_t *row = indices + t * topk;
        for (int32_t i = 0; i < topk; i++)
            row[i] = -1;
        for (int32_t i = 0; i < k; i++)
            row[slots[i]] = pool[i];
    }
    free(pool);
    free(slots);
    return indices;
}

#endif /* DSARL_TEST_DSA_TEST_UTIL_H */
