/* rng.c: Philox4x32-10 (Salmon et al. 2011) and the distributions built on its 32-bit words. */
#include "dsarl/rng.h"

#include <math.h>
#include <string.h>

/* Multipliers and Weyl key increments from the paper (Random123's PHILOX_M4x32_* and PHILOX_W32_*). */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void dsarl_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        if (round > 0) { /* the key is bumped between rounds, not before the first */
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

void dsarl_rng_init(dsarl_rng *rng, uint64_t seed, uint64_t stream)
{
    dsarl_rng_state state = {seed, stream, 0};
    dsarl_rng_set_state(rng, state);
}

uint32_t dsarl_rng_next_u32(dsarl_rng *rng)
{
    uint64_t block = rng->state.offset >> 2;
    if (!rng->has_block || rng->cached_block != block) {
        const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)rng->state.stream,
                                 (uint32_t)(rng->state.stream >> 32)};
        const uint32_t key[2] = {(uint32_t)rng->state.seed, (uint32_t)(rng->state.seed >> 32)};
        dsarl_philox4x32_10(ctr, key, rng->block);
        rng->cached_block = block;
        rng->has_block = 1;
    }
    uint32_t word = rng->block[rng->state.offset & 3];
    rng->state.offset++;
    return word;
}

float dsarl_rng_uniform(dsarl_rng *rng)
{
    return (float)(dsarl_rng_next_u32(rng) >> 8) * 0x1p-24f;
}

/* One Box-Muller pair from two words; u1 is taken in (0, 1] so the log is finite. */
static void box_muller(dsarl_rng *rng, float *z0, float *z1)
{
    double u1 = ((double)(dsarl_rng_next_u32(rng) >> 8) + 1.0) * 0x1p-24;
    double u2 = (double)(dsarl_rng_next_u32(rng) >> 8) * 0x1p-24;
    double r = sqrt(-2.0 * log(u1));
    double theta = 6.283185307179586476925286766559 * u2; /* 2 pi */
    *z0 = (float)(r * cos(theta));
    if (z1)
        *z1 = (float)(r * sin(theta));
}

float dsarl_rng_normal(dsarl_rng *rng)
{
    float z;
    box_muller(rng, &z, NULL);
    return z;
}

void dsarl_rng_fill_uniform(dsarl_rng *rng, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = dsarl_rng_uniform(rng);
}

void dsarl_rng_fill_normal(dsarl_rng *rng, float *out, size_t n)
{
    size_t i = 0;
    for (; i + 1 < n; i += 2)
        box_muller(rng, &out[i], &out[i + 1]);
    if (i < n)
        box_muller(rng, &out[i], NULL);
}

uint32_t dsarl_rng_below(dsarl_rng *rng, uint32_t n)
{
    if (n == 0)
        return 0;
    /* Words below 2^32 mod n would make the low residues more likely; reject them (less than half the time). */
    uint32_t threshold = (uint32_t)(-n) % n;
    for (;;) {
        uint32_t r = dsarl_rng_next_u32(rng);
        if (r >= threshold)
            return r % n;
    }
}

void dsarl_rng_skip(dsarl_rng *rng, uint64_t n)
{
    rng->state.offset += n; /* the cached block is re-checked against the new offset on the next draw */
}

dsarl_rng_state dsarl_rng_get_state(const dsarl_rng *rng)
{
    return rng->state;
}

void dsarl_rng_set_state(dsarl_rng *rng, dsarl_rng_state state)
{
    memset(rng, 0, sizeof *rng);
    rng->state = state;
}
