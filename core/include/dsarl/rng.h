/* dsarl/rng.h: Philox4x32-10, the counter-based generator of Salmon et al., "Parallel Random Numbers: As Easy as
 * 1, 2, 3" (SC 2011), bit-compatible with Random123 and curand's Philox.
 * SDK tier: trainer services (docs/sdk.md): exported by libdsarl, versioned with it; plugins may call them.
 *
 * Word i of a stream is word i%4 of philox4x32_10(counter = {block lo, block hi, stream lo, stream hi},
 * key = {seed lo, seed hi}) with block = i/4, so any device kernel can reproduce any draw from (seed, stream, i),
 * skip-ahead is O(1), and the whole state is three integers a checkpoint can store. */
#ifndef DSARL_RNG_H
#define DSARL_RNG_H

#include <stddef.h>
#include <stdint.h>
#include "dsarl/export.h"

DSARL_BEGIN_DECLS

/* Everything needed to resume a generator bit-identically. */
typedef struct dsarl_rng_state {
    uint64_t seed;   /* the Philox key */
    uint64_t stream; /* distinguishes ranks and purposes (sampling, dropout, data order) under one seed */
    uint64_t offset; /* number of 32-bit words drawn so far */
} dsarl_rng_state;

typedef struct dsarl_rng {
    dsarl_rng_state state;
    uint32_t block[4];     /* cached output of block `cached_block` */
    uint64_t cached_block; /* valid only when has_block */
    int has_block;
} dsarl_rng;

/* The raw block function: 10 Philox rounds of counter ctr under key, into out. */
DSARL_API void dsarl_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* Starts stream `stream` of seed `seed` at offset 0. */
DSARL_API void dsarl_rng_init(dsarl_rng *rng, uint64_t seed, uint64_t stream);

/* The next 32 random bits (consumes one word). */
DSARL_API uint32_t dsarl_rng_next_u32(dsarl_rng *rng);

/* Uniform float in [0, 1) with 24 random bits: (word >> 8) * 2^-24 (consumes one word). */
DSARL_API float dsarl_rng_uniform(dsarl_rng *rng);

/* Standard normal by Box-Muller, r*cos(2 pi u2) (consumes two words; the sine half is discarded). */
DSARL_API float dsarl_rng_normal(dsarl_rng *rng);

/* Fills out[0..n) with uniforms, one word each. */
DSARL_API void dsarl_rng_fill_uniform(dsarl_rng *rng, float *out, size_t n);

/* Fills out[0..n) with standard normals using both Box-Muller halves: two words per pair, ceil(n/2) pairs. */
DSARL_API void dsarl_rng_fill_normal(dsarl_rng *rng, float *out, size_t n);

/* Uniform integer in [0, n) without modulo bias (rejection; one or more words). n == 0 returns 0. */
DSARL_API uint32_t dsarl_rng_below(dsarl_rng *rng, uint32_t n);

/* Advances by n words in O(1), exactly as if n words had been drawn. */
DSARL_API void dsarl_rng_skip(dsarl_rng *rng, uint64_t n);

/* The state to store in a checkpoint. */
DSARL_API dsarl_rng_state dsarl_rng_get_state(const dsarl_rng *rng);

/* Resumes from a stored state; the following draws equal those the saved generator would have made. */
DSARL_API void dsarl_rng_set_state(dsarl_rng *rng, dsarl_rng_state state);

DSARL_END_DECLS

#endif /* DSARL_RNG_H */
