/* check_rng.c: Philox4x32-10 against Random123's published known-answer vectors, then the stream layer
 * (determinism, distinct streams, skip-ahead, checkpoint state) and the distributions' moments on 1e6 draws. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsarl/rng.h"

static uint64_t fresh_seed(void)
{
    return (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ULL;
}

START_TEST(test_known_answers)
{
    /* Random123 kat_vectors: philox4x32 10 rounds. */
    static const struct { uint32_t ctr[4], key[2], out[4]; } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint32_t out[4];
        dsarl_philox4x32_10(kat[i].ctr, kat[i].key, out);
        for (int j = 0; j < 4; j++)
            ck_assert_msg(out[j] == kat[i].out[j], "vector %zu word %d: 0x%08x, want 0x%08x", i, j, out[j],
                          kat[i].out[j]);
    }
    /* The stream layout: word i of (seed, stream) is word i%4 of block i/4 with counter {block, stream}. */
    dsarl_rng rng;
    const uint64_t seed = 0x299f31d0a4093822ULL, stream = 0x0370734413198a2eULL, block = 0x05a308d3243f6a88ULL;
    const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream, (uint32_t)(stream >> 32)};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t want[4];
    dsarl_philox4x32_10(ctr, key, want);
    dsarl_rng_init(&rng, seed, stream);
    dsarl_rng_skip(&rng, 4 * block);
    for (int j = 0; j < 4; j++)
        ck_assert_uint_eq(dsarl_rng_next_u32(&rng), want[j]);
    dsarl_rng_init(&rng, 0, 0);
    ck_assert_uint_eq(dsarl_rng_next_u32(&rng), 0x6627e8d5);
    ck_assert_float_eq(dsarl_rng_uniform(&rng), (float)(0xe169c58du >> 8) * 0x1p-24f);
}
END_TEST

START_TEST(test_determinism_streams_skip_and_state)
{
    uint64_t seed = fresh_seed();
    enum { N = 1000 };
    uint32_t a[N], b[N], other[N];
    dsarl_rng r1, r2, r3;
    dsarl_rng_init(&r1, seed, 7);
    dsarl_rng_init(&r2, seed, 7);
    dsarl_rng_init(&r3, seed, 8);
    for (int i = 0; i < N; i++) {
        a[i] = dsarl_rng_next_u32(&r1);
        b[i] = dsarl_rng_next_u32(&r2);
        other[i] = dsarl_rng_next_u32(&r3);
    }
    ck_assert_mem_eq(a, b, sizeof a);
    int same = 0;
    for (int i = 0; i < N; i++)
        same += a[i] == other[i];
    ck_assert_int_lt(same, 3); /* distinct streams: coincidences only, ~N/2^32 expected */
    dsarl_rng seed2;
    dsarl_rng_init(&seed2, seed + 1, 7);
    ck_assert_uint_ne(dsarl_rng_next_u32(&seed2), a[0]);

    /* Skip-ahead from any position equals drawing. */
    for (uint64_t start = 0; start < 9; start++) {
        for (uint64_t k = 0; k < 13; k++) {
            dsarl_rng s;
            dsarl_rng_init(&s, seed, 7);
            for (uint64_t i = 0; i < start; i++)
                dsarl_rng_next_u32(&s);
            dsarl_rng_skip(&s, k);
            ck_assert_uint_eq(dsarl_rng_next_u32(&s), a[start + k]);
        }
    }

    /* Save mid-stream (mid-block and after a normal draw), restore into a fresh generator, continue identically. */
    dsarl_rng src;
    dsarl_rng_init(&src, seed, 3);
    for (int i = 0; i < 5; i++)
        dsarl_rng_next_u32(&src);
    (void)dsarl_rng_normal(&src);
    (void)dsarl_rng_below(&src, 1000);
    dsarl_rng_state saved = dsarl_rng_get_state(&src);
    dsarl_rng resumed;
    memset(&resumed, 0xab, sizeof resumed); /* garbage cache must not leak into the draws */
    dsarl_rng_set_state(&resumed, saved);
    for (int i = 0; i < 50; i++) {
        ck_assert_uint_eq(dsarl_rng_next_u32(&resumed), dsarl_rng_next_u32(&src));
        ck_assert_float_eq(dsarl_rng_normal(&resumed), dsarl_rng_normal(&src));
    }
    ck_assert_uint_eq(dsarl_rng_get_state(&resumed).offset, dsarl_rng_get_state(&src).offset);
    ck_assert_uint_eq(saved.seed, seed);
    ck_assert_uint_eq(saved.stream, 3);
    ck_assert_uint_ge(saved.offset, 8); /* 5 words + 2 for the normal + at least 1 for below */
}
END_TEST

START_TEST(test_uniform_moments)
{
    enum { N = 1000000 };
    float *u = malloc(N * sizeof *u);
    dsarl_rng rng;
    dsarl_rng_init(&rng, fresh_seed(), 1);
    dsarl_rng_fill_uniform(&rng, u, N);
    double sum = 0, sq = 0;
    int low_decile = 0;
    float lo = 1, hi = 0;
    for (int i = 0; i < N; i++) {
        sum += u[i];
        sq += (double)u[i] * u[i];
        low_decile += u[i] < 0.1f;
        lo = u[i] < lo ? u[i] : lo;
        hi = u[i] > hi ? u[i] : hi;
    }
    double mean = sum / N, var = sq / N - mean * mean;
    /* Standard errors: mean sqrt(1/12/N) = 2.9e-4, variance ~ 9e-5, decile count sqrt(N*0.09) = 300. */
    ck_assert_msg(fabs(mean - 0.5) < 1.5e-3, "mean %f", mean);
    ck_assert_msg(fabs(var - 1.0 / 12.0) < 6e-4, "variance %f", var);
    ck_assert_msg(abs(low_decile - N / 10) < 1500, "%d below 0.1", low_decile);
    ck_assert(lo >= 0.0f && hi < 1.0f);
    free(u);
}
END_TEST

START_TEST(test_normal_moments)
{
    enum { N = 1000000 };
    float *z = malloc(N * sizeof *z);
    dsarl_rng rng;
    dsarl_rng_init(&rng, fresh_seed(), 2);
    dsarl_rng_fill_normal(&rng, z, N);
    double sum = 0, sq = 0, cube = 0, quad = 0;
    int within_one = 0;
    for (int i = 0; i < N; i++) {
        double x = z[i];
        ck_assert(isfinite(x));
        sum += x;
        sq += x * x;
        cube += x * x * x;
        quad += x * x * x * x;
        within_one += fabs(x) < 1.0;
    }
    double mean = sum / N, var = sq / N - mean * mean;
    ck_assert_msg(fabs(mean) < 5e-3, "mean %f", mean);           /* se 1e-3 */
    ck_assert_msg(fabs(var - 1.0) < 7e-3, "variance %f", var);    /* se 1.4e-3 */
    ck_assert_msg(fabs(cube / N) < 1.5e-2, "skew %f", cube / N); /* se 2.4e-3 */
    ck_assert_msg(fabs(quad / N - 3.0) < 5e-2, "kurtosis %f", quad / N);
    ck_assert_msg(fabs((double)within_one / N - 0.682689) < 2.5e-3, "P(|z|<1) = %f", (double)within_one / N);

    /* The single-value form is the cosine half of the same pair. */
    dsarl_rng a, b;
    dsarl_rng_init(&a, 99, 5);
    dsarl_rng_init(&b, 99, 5);
    float pair[2];
    dsarl_rng_fill_normal(&a, pair, 2);
    ck_assert_float_eq(dsarl_rng_normal(&b), pair[0]);
    ck_assert_uint_eq(dsarl_rng_get_state(&a).offset, dsarl_rng_get_state(&b).offset);
    free(z);
}
END_TEST

START_TEST(test_below_is_unbiased)
{
    dsarl_rng rng;
    dsarl_rng_init(&rng, fresh_seed(), 4);
    /* n = 3 * 2^30: plain modulo would put half of the mass below 2^30 instead of a third. */
    enum { N = 300000 };
    const uint32_t n = 3u << 30;
    int below = 0;
    for (int i = 0; i < N; i++) {
        uint32_t r = dsarl_rng_below(&rng, n);
        ck_assert_uint_lt(r, n);
        below += r < (1u << 30);
    }
    ck_assert_msg(fabs((double)below / N - 1.0 / 3.0) < 5e-3, "fraction below 2^30: %f", (double)below / N);
    /* Chi-square over 7 bins (6 degrees of freedom; 99.99th percentile ~27.9). */
    int counts[7] = {0};
    for (int i = 0; i < 700000; i++)
        counts[dsarl_rng_below(&rng, 7)]++;
    double chi2 = 0;
    for (int k = 0; k < 7; k++)
        chi2 += (counts[k] - 100000.0) * (counts[k] - 100000.0) / 100000.0;
    ck_assert_msg(chi2 < 27.9, "chi-square %f", chi2);
    ck_assert_uint_eq(dsarl_rng_below(&rng, 1), 0);
    ck_assert_uint_eq(dsarl_rng_below(&rng, 0), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("rng");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_known_answers);
    tcase_add_test(tc, test_determinism_streams_skip_and_state);
    tcase_add_test(tc, test_uniform_moments);
    tcase_add_test(tc, test_normal_moments);
    tcase_add_test(tc, test_below_is_unbiased);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
