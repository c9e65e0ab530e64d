/* check_tensor.c: dtype tables, descriptors and the exact bf16/fp16 conversions.
 *
 * The 16-bit conversions are checked three ways: hand-derived bit patterns for every rounding corner, an
 * exhaustive 16 -> 32 -> 16 round trip over all 65536 patterns, and a random sweep against a naive
 * nearest-neighbour search in double precision (ties to even). The torch/numpy cross-check lives in
 * check_safetensors.c, which reads a fixture those libraries wrote. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsarl/tensor.h"

static uint64_t test_seed;
static uint64_t rng_state;

static uint32_t next_u32(void) /* xorshift64*: a test-only generator, independent of dsarl's rng */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1DULL) >> 32);
}

static void seed_rng(void)
{
    const char *env = getenv("DSARL_TEST_SEED");
    test_seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
    rng_state = test_seed * 0x9E3779B97F4A7C15ULL + 1;
}

static uint32_t bits_of(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* float8 e4m3fn codes against values worked out by hand from sign | 4-bit exponent (bias 7) | 3-bit mantissa:
 * subnormals m * 2^-9, no infinities, S.1111.111 NaN; and every positive code above the last in order. */
START_TEST(test_f8_e4m3)
{
    static const struct { uint8_t code; float value; } want[] = {
        {0x00, 0.0f},       {0x01, 0.001953125f}, {0x07, 0.013671875f}, {0x08, 0.015625f}, {0x38, 1.0f},
        {0x3c, 1.5f},       {0x3f, 1.875f},       {0x40, 2.0f},         {0x77, 240.0f},    {0x78, 256.0f},
        {0x7e, 448.0f},     {0xb8, -1.0f},        {0xfe, -448.0f},      {0x81, -0.001953125f},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(dsarl_f8_e4m3_to_f32(want[i].code) == want[i].value, "code 0x%02x: %g, want %g", want[i].code,
                      (double)dsarl_f8_e4m3_to_f32(want[i].code), (double)want[i].value);
    ck_assert(isnan(dsarl_f8_e4m3_to_f32(0x7f)) && isnan(dsarl_f8_e4m3_to_f32(0xff)));
    ck_assert(signbit(dsarl_f8_e4m3_to_f32(0x80)) && dsarl_f8_e4m3_to_f32(0x80) == 0.0f);
    for (int c = 1; c < 0x7f; c++)
        ck_assert(dsarl_f8_e4m3_to_f32((uint8_t)c) > dsarl_f8_e4m3_to_f32((uint8_t)(c - 1)));
    uint8_t codes[3] = {0x38, 0x7e, 0xc0};
    float out[3];
    dsarl_error err;
    ck_assert_int_eq(dsarl_convert_to_f32(out, codes, DSARL_DTYPE_F8_E4M3, 3, &err), 0);
    ck_assert(out[0] == 1.0f && out[1] == 448.0f && out[2] == -2.0f);
}
END_TEST

START_TEST(test_dtype_tables)
{
    static const struct { const char *dsarl, *st; dsarl_dtype dt; size_t size; } want[] = {
        {"f32", "F32", DSARL_DTYPE_F32, 4}, {"bf16", "BF16", DSARL_DTYPE_BF16, 2}, {"f16", "F16", DSARL_DTYPE_F16, 2},
        {"f64", "F64", DSARL_DTYPE_F64, 8}, {"i32", "I32", DSARL_DTYPE_I32, 4},    {"i64", "I64", DSARL_DTYPE_I64, 8},
        {"u8", "U8", DSARL_DTYPE_U8, 1},    {"i8", "I8", DSARL_DTYPE_I8, 1},
        {"bool", "BOOL", DSARL_DTYPE_BOOL, 1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ck_assert_uint_eq(dsarl_dtype_size(want[i].dt), want[i].size);
        ck_assert_str_eq(dsarl_dtype_name(want[i].dt), want[i].dsarl);
        ck_assert_int_eq(dsarl_dtype_from_name(want[i].dsarl), want[i].dt);
        ck_assert_int_eq(dsarl_dtype_from_name(want[i].st), want[i].dt);
    }
    ck_assert_uint_eq(dsarl_dtype_size(DSARL_DTYPE_INVALID), 0);
    ck_assert_uint_eq(dsarl_dtype_size((dsarl_dtype)99), 0);
    ck_assert_str_eq(dsarl_dtype_name((dsarl_dtype)99), "invalid");
    ck_assert_int_eq(dsarl_dtype_from_name("F8_E4M3"), DSARL_DTYPE_F8_E4M3);
    ck_assert_uint_eq(dsarl_dtype_size(DSARL_DTYPE_F8_E4M3), 1);
    ck_assert_int_eq(dsarl_dtype_from_name("F8_E5M2"), DSARL_DTYPE_INVALID);
    ck_assert_int_eq(dsarl_dtype_from_name("float32"), DSARL_DTYPE_INVALID);
    ck_assert_int_eq(dsarl_dtype_from_name(NULL), DSARL_DTYPE_INVALID);
}
END_TEST

START_TEST(test_tensor_init_and_shape)
{
    dsarl_tensor t;
    dsarl_error err = {0};
    float storage[24];
    const int64_t shape[3] = {2, 3, 4};
    ck_assert_int_eq(dsarl_tensor_init(&t, storage, DSARL_DTYPE_BF16, 3, shape, DSARL_DEVICE_CPU, &err), DSARL_OK);
    ck_assert_ptr_eq(t.data, storage);
    ck_assert_int_eq(dsarl_tensor_numel(&t), 24);
    ck_assert_uint_eq(dsarl_tensor_nbytes(&t), 48);
    ck_assert_int_eq(t.shape[3], 1); /* unused dims are 1 */
    ck_assert_int_eq(t.shape[7], 1);
    char buf[64];
    ck_assert_str_eq(dsarl_tensor_shape_str(&t, buf, sizeof buf), "[2, 3, 4]");
    char tiny[5];
    ck_assert_str_eq(dsarl_tensor_shape_str(&t, tiny, sizeof tiny), "[2, ");

    ck_assert_int_eq(dsarl_tensor_init(&t, NULL, DSARL_DTYPE_F64, 0, NULL, DSARL_DEVICE_CPU, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_tensor_numel(&t), 1);
    ck_assert_uint_eq(dsarl_tensor_nbytes(&t), 8);
    ck_assert_str_eq(dsarl_tensor_shape_str(&t, buf, sizeof buf), "[]");

    const int64_t with_zero[2] = {5, 0};
    ck_assert_int_eq(dsarl_tensor_init(&t, NULL, DSARL_DTYPE_I64, 2, with_zero, DSARL_DEVICE_CUDA, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_tensor_numel(&t), 0);
    ck_assert_int_eq(t.device, DSARL_DEVICE_CUDA);

    const int64_t negative[2] = {5, -2};
    ck_assert_int_eq(dsarl_tensor_init(&t, NULL, DSARL_DTYPE_F32, 2, negative, DSARL_DEVICE_CPU, &err),
                     DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "dimension 1 is -2"));
    ck_assert_int_eq(dsarl_tensor_init(&t, NULL, DSARL_DTYPE_F32, 9, shape, DSARL_DEVICE_CPU, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "ndim 9"));
    ck_assert_int_eq(dsarl_tensor_init(&t, NULL, DSARL_DTYPE_INVALID, 1, shape, DSARL_DEVICE_CPU, &err),
                     DSARL_E_INVALID);
}
END_TEST

START_TEST(test_bf16_hand_patterns)
{
    static const struct { uint32_t f32; uint16_t bf16; } cases[] = {
        {0x3f800000, 0x3f80}, /* 1.0 */
        {0x3f808000, 0x3f80}, /* tie, kept bit even: down */
        {0x3f818000, 0x3f82}, /* tie, kept bit odd: up */
        {0x3f808001, 0x3f81}, /* just above the tie: up */
        {0x3f807fff, 0x3f80}, /* just below the tie: down */
        {0xbf818000, 0xbf82}, /* negative tie rounds away from zero like the positive one */
        {0x7f7fffff, 0x7f80}, /* FLT_MAX rounds up to inf */
        {0x7f7f7fff, 0x7f7f}, /* largest value that stays finite */
        {0x7f800000, 0x7f80}, /* inf */
        {0xff800000, 0xff80}, /* -inf */
        {0x80000000, 0x8000}, /* -0 */
        {0x00010000, 0x0001}, /* smallest bf16 subnormal, exact */
        {0x00008000, 0x0000}, /* half of it: tie to even zero */
        {0x00018000, 0x0002}, /* 1.5 units: tie to even 2 */
        {0x007fffff, 0x0080}, /* largest f32 subnormal rounds up to the smallest normal */
        {0x40490fdb, 0x4049}, /* pi */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = dsarl_f32_to_bf16(float_of(cases[i].f32));
        ck_assert_msg(got == cases[i].bf16, "f32 0x%08x -> bf16 0x%04x, want 0x%04x", cases[i].f32, got,
                      cases[i].bf16);
    }
    ck_assert_uint_eq(bits_of(dsarl_bf16_to_f32(0x3f80)), 0x3f800000);
    ck_assert_uint_eq(bits_of(dsarl_bf16_to_f32(0xc049)), 0xc0490000);
    /* A NaN whose payload lives only in the dropped low bits must not turn into inf. */
    uint16_t nan_low = dsarl_f32_to_bf16(float_of(0x7f800001));
    ck_assert(isnan(dsarl_bf16_to_f32(nan_low)));
    ck_assert_uint_eq(nan_low, 0x7fc0);
    uint16_t neg_nan = dsarl_f32_to_bf16(float_of(0xffc12345));
    ck_assert(isnan(dsarl_bf16_to_f32(neg_nan)));
    ck_assert_uint_eq(neg_nan & 0x8000, 0x8000);
}
END_TEST

START_TEST(test_f16_hand_patterns)
{
    static const struct { float f32; uint16_t f16; } cases[] = {
        {1.0f, 0x3c00},         {-2.0f, 0xc000},       {0.5f, 0x3800},        {65504.0f, 0x7bff},
        {65519.99f, 0x7bff},    {65520.0f, 0x7c00},    {1e6f, 0x7c00},        {-1e6f, 0xfc00},
        {0x1p-14f, 0x0400},     {0x1p-24f, 0x0001},    {0x1p-25f, 0x0000},    {0x1.8p-25f, 0x0001},
        {0x3p-25f, 0x0002},     {0x5p-25f, 0x0002},    {0x1.ff8p-15f, 0x03ff}, {0x1.ffap-15f, 0x03ff},
        {0x1.ffcp-15f, 0x0400},
        {0.1f, 0x2e66},         {1.0f / 3.0f, 0x3555}, {-0.0f, 0x8000},       {0x1p-30f, 0x0000},
        {1.0f + 0x1p-11f, 0x3c00}, {1.0f + 0x3p-11f, 0x3c02}, {1.0f + 0x1.01p-11f, 0x3c01},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ck_assert_msg(dsarl_f32_to_f16(cases[i].f32) == cases[i].f16, "case %zu: %a -> f16 0x%04x, want 0x%04x", i,
                      (double)cases[i].f32, dsarl_f32_to_f16(cases[i].f32), cases[i].f16);
    ck_assert_uint_eq(dsarl_f32_to_f16(INFINITY), 0x7c00);
    ck_assert_uint_eq(dsarl_f32_to_f16(-INFINITY), 0xfc00);
    uint16_t nan_low = dsarl_f32_to_f16(float_of(0x7f800001));
    ck_assert_uint_eq(nan_low & 0x7c00, 0x7c00);
    ck_assert_uint_ne(nan_low & 0x03ff, 0);
    ck_assert(dsarl_f16_to_f32(0x0001) == 0x1p-24f);
    ck_assert(dsarl_f16_to_f32(0x03ff) == 0x1.ff8p-15f);
    ck_assert(dsarl_f16_to_f32(0x7bff) == 65504.0f);
    ck_assert(dsarl_f16_to_f32(0xc000) == -2.0f);
    ck_assert(isinf(dsarl_f16_to_f32(0xfc00)) && dsarl_f16_to_f32(0xfc00) < 0);
    ck_assert(isnan(dsarl_f16_to_f32(0x7e00)));
}
END_TEST

START_TEST(test_16bit_exhaustive_round_trip)
{
    for (uint32_t b = 0; b < 0x10000; b++) {
        uint16_t bits = (uint16_t)b;
        float bf = dsarl_bf16_to_f32(bits);
        uint16_t back = dsarl_f32_to_bf16(bf);
        int bf_nan = (bits & 0x7f80) == 0x7f80 && (bits & 0x7f);
        if (bf_nan) {
            ck_assert_msg(isnan(bf) && (back & 0x7f80) == 0x7f80 && (back & 0x7f) && (back & 0x8000) == (bits & 0x8000),
                          "bf16 NaN 0x%04x came back as 0x%04x", bits, back);
        } else {
            ck_assert_msg(back == bits, "bf16 0x%04x -> %a -> 0x%04x", bits, (double)bf, back);
        }
        float hf = dsarl_f16_to_f32(bits);
        uint16_t hback = dsarl_f32_to_f16(hf);
        int h_nan = (bits & 0x7c00) == 0x7c00 && (bits & 0x3ff);
        if (h_nan) {
            ck_assert_msg(isnan(hf) && (hback & 0x7c00) == 0x7c00 && (hback & 0x3ff) &&
                              (hback & 0x8000) == (bits & 0x8000),
                          "f16 NaN 0x%04x came back as 0x%04x", bits, hback);
        } else {
            ck_assert_msg(hback == bits, "f16 0x%04x -> %a -> 0x%04x", bits, (double)hf, hback);
        }
    }
}
END_TEST

/* The value of a non-negative finite f16 bit pattern, computed from the format definition in double. */
static double f16_value_naive(uint32_t k)
{
    uint32_t e = k >> 10, m = k & 0x3ff;
    return e == 0 ? ldexp((double)m, -24) : ldexp((double)(1024 + m), (int)e - 25);
}

/* Round |x| to f16 by bracketing it between consecutive patterns (0x7c00 stands for 65536, the next step). */
static uint16_t f16_round_naive(double ax)
{
    uint32_t lo = 0, hi = 0x7c00;
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (f16_value_naive(mid) <= ax)
            lo = mid;
        else
            hi = mid;
    }
    double vlo = f16_value_naive(lo), vhi = hi == 0x7c00 ? 65536.0 : f16_value_naive(hi);
    if (ax >= vhi) /* at or past 65536 */
        return 0x7c00;
    double dlo = ax - vlo, dhi = vhi - ax;
    if (dlo < dhi || (dlo == dhi && !(lo & 1)))
        return (uint16_t)lo;
    return (uint16_t)hi;
}

START_TEST(test_16bit_random_vs_naive)
{
    seed_rng();
    for (int i = 0; i < 200000; i++) {
        /* Random sign and mantissa; exponents spread over the whole f32 range for bf16 and over f16's range
         * (plus a margin of under- and overflow) for f16. */
        uint32_t u = next_u32();
        if ((u & 0x7f800000) == 0x7f800000)
            continue;
        float x = float_of(u);
        /* bf16 reference: the two bf16 neighbours of |x| and the nearer one, ties to even. */
        uint32_t mag = u & 0x7fffffff;
        uint32_t lo_bits = mag & 0xffff0000u;
        uint32_t exponent = lo_bits >> 23;
        double ulp = ldexp(1.0, (exponent == 0 ? 1 : (int)exponent) - 127 - 7);
        double vlo = (double)float_of(lo_bits), vx = (double)float_of(mag);
        double dlo = vx - vlo, dhi = vlo + ulp - vx;
        uint32_t want = (dlo < dhi || (dlo == dhi && !((lo_bits >> 16) & 1))) ? lo_bits >> 16 : (lo_bits >> 16) + 1;
        want |= (u >> 16) & 0x8000;
        ck_assert_msg(dsarl_f32_to_bf16(x) == want, "seed %llu: f32 0x%08x -> bf16 0x%04x, want 0x%04x",
                      (unsigned long long)test_seed, u, dsarl_f32_to_bf16(x), want);

        uint32_t h_exp = 127 - 27 + next_u32() % 46; /* 2^-27 .. 2^18 */
        uint32_t hu = (u & 0x807fffffu) | (h_exp << 23);
        float hx = float_of(hu);
        uint16_t hwant = (uint16_t)(f16_round_naive(fabs((double)hx)) | ((hu >> 16) & 0x8000));
        ck_assert_msg(dsarl_f32_to_f16(hx) == hwant, "seed %llu: f32 %a -> f16 0x%04x, want 0x%04x",
                      (unsigned long long)test_seed, (double)hx, dsarl_f32_to_f16(hx), hwant);
    }
}
END_TEST

START_TEST(test_bulk_conversions)
{
    dsarl_error err = {0};
    float out[4];
    const double f64[4] = {1.5, -2.25, 1e10, 0.1};
    ck_assert_int_eq(dsarl_convert_to_f32(out, f64, DSARL_DTYPE_F64, 4, &err), DSARL_OK);
    ck_assert(out[0] == 1.5f && out[1] == -2.25f && out[2] == 1e10f && out[3] == 0.1f);
    const int32_t i32[4] = {-7, 0, 123456, 16777217};
    ck_assert_int_eq(dsarl_convert_to_f32(out, i32, DSARL_DTYPE_I32, 4, &err), DSARL_OK);
    ck_assert(out[0] == -7.0f && out[2] == 123456.0f && out[3] == 16777216.0f);
    const int64_t i64[4] = {-3, 1LL << 40, 5, 9};
    ck_assert_int_eq(dsarl_convert_to_f32(out, i64, DSARL_DTYPE_I64, 4, &err), DSARL_OK);
    ck_assert(out[0] == -3.0f && out[1] == 0x1p40f && out[3] == 9.0f);
    const uint8_t u8[4] = {0, 255, 7, 128};
    ck_assert_int_eq(dsarl_convert_to_f32(out, u8, DSARL_DTYPE_U8, 4, &err), DSARL_OK);
    ck_assert(out[1] == 255.0f && out[3] == 128.0f);
    const int8_t i8[4] = {-128, 127, -1, 3};
    ck_assert_int_eq(dsarl_convert_to_f32(out, i8, DSARL_DTYPE_I8, 4, &err), DSARL_OK);
    ck_assert(out[0] == -128.0f && out[2] == -1.0f);
    const uint8_t b[4] = {0, 1, 2, 0};
    ck_assert_int_eq(dsarl_convert_to_f32(out, b, DSARL_DTYPE_BOOL, 4, &err), DSARL_OK);
    ck_assert(out[0] == 0.0f && out[1] == 1.0f && out[2] == 1.0f);
    const uint16_t bf[4] = {0x3f80, 0xc049, 0x7f80, 0x0001};
    ck_assert_int_eq(dsarl_convert_to_f32(out, bf, DSARL_DTYPE_BF16, 4, &err), DSARL_OK);
    ck_assert(out[0] == 1.0f && bits_of(out[1]) == 0xc0490000 && isinf(out[2]) && bits_of(out[3]) == 0x00010000);
    /* Unaligned source, as inside a file mapping. */
    unsigned char raw[1 + 2 * sizeof(float)];
    const float two[2] = {3.25f, -8.5f};
    memcpy(raw + 1, two, sizeof two);
    ck_assert_int_eq(dsarl_convert_to_f32(out, raw + 1, DSARL_DTYPE_F32, 2, &err), DSARL_OK);
    ck_assert(out[0] == 3.25f && out[1] == -8.5f);
    ck_assert_int_eq(dsarl_convert_to_f32(out, raw, (dsarl_dtype)42, 1, &err), DSARL_E_INVALID);

    const float src[4] = {1.0f, 65520.0f, 0x1.8p-25f, -0.1f};
    uint16_t h[4];
    ck_assert_int_eq(dsarl_convert_from_f32(h, DSARL_DTYPE_F16, src, 4, &err), DSARL_OK);
    ck_assert(h[0] == 0x3c00 && h[1] == 0x7c00 && h[2] == 0x0001 && h[3] == 0xae66);
    ck_assert_int_eq(dsarl_convert_from_f32(h, DSARL_DTYPE_BF16, src, 4, &err), DSARL_OK);
    ck_assert(h[0] == 0x3f80 && h[1] == 0x4780 && h[3] == 0xbdcd);
    double d[4];
    ck_assert_int_eq(dsarl_convert_from_f32(d, DSARL_DTYPE_F64, src, 4, &err), DSARL_OK);
    ck_assert(d[3] == (double)-0.1f);
    int32_t refused[4];
    ck_assert_int_eq(dsarl_convert_from_f32(refused, DSARL_DTYPE_I32, src, 4, &err), DSARL_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.message, "'i32'"));
}
END_TEST

static Suite *tensor_suite(void)
{
    Suite *s = suite_create("tensor");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_dtype_tables);
    tcase_add_test(tc, test_f8_e4m3);
    tcase_add_test(tc, test_tensor_init_and_shape);
    tcase_add_test(tc, test_bf16_hand_patterns);
    tcase_add_test(tc, test_f16_hand_patterns);
    tcase_add_test(tc, test_16bit_exhaustive_round_trip);
    tcase_add_test(tc, test_16bit_random_vs_naive);
    tcase_add_test(tc, test_bulk_conversions);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(tensor_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
