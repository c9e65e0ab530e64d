/* parallel_compare.h: what the multi-process model suites (check_glm5_{tp,ep,pp,cp}_mpi.c) share to compare a
 * parallel layout with the one-process run: a seed mixer that every rank computes alike, and the two relative
 * error measures of their tolerances. Header-only: each suite is its own executable. */
#ifndef DSARL_TESTS_PARALLEL_COMPARE_H
#define DSARL_TESTS_PARALLEL_COMPARE_H

#include <math.h>
#include <stdint.h>

// splitmix64's finaliser: a deterministic, well-spread value of x (inputs and seeds equal on every rank).
static inline uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// max_i |a_i - b_i| / max(|b_i|, floor): elementwise, b the reference.
static inline double max_rel(const float *a, const float *b, int64_t n, double floor)
{
    double worst = 0;
    for (int64_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)a[i] - b[i]) / fmax(fabs((double)b[i]), floor));
    return worst;
}

// max_i |a_i - b_i| / max_i |b_i|: against the reference's largest magnitude.
static inline double max_rel_scaled(const float *a, const float *b, int64_t n)
{
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < n; i++)
        diff = fmax(diff, fabs((double)a[i] - b[i])), scale = fmax(scale, fabs((double)b[i]));
    return diff / fmax(scale, 1e-30);
}

#endif /* DSARL_TESTS_PARALLEL_COMPARE_H */
