/* check_npy.c: .npy header bytes checked by hand, round trips for every dtype, bf16 widened to f32, clean errors,
 * and -- when python3 has numpy -- numpy loading our files and re-saving them byte-identically, and us reading a
 * file numpy wrote. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsarl/fileutil.h"
#include "dsarl/npy.h"

static char tmpdir[256];
static uint64_t rng_state;

static uint32_t next_u32(void) /* xorshift64*, test-only */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1DULL) >> 32);
}

static void setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dsarl-check-npy-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    rng_state = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ULL + 1;
}

static void teardown(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
}

static char *tmp_path(const char *name)
{
    char *p = dsarl_path_join(tmpdir, name);
    ck_assert_ptr_nonnull(p);
    return p;
}

/* The exact bytes numpy.save writes for a (2, 3) float32 array: 10-byte prefix, header length 118 = 0x76 (the
 * 59-byte dict, 20 spaces reserved for the first dimension to grow to 21 digits, padding to 128, '\n'), then
 * the data. */
START_TEST(test_header_bytes_by_hand)
{
    dsarl_error err = {0};
    float values[6];
    for (int i = 0; i < 6; i++)
        values[i] = (float)(int32_t)next_u32() / 1024.0f;
    const int64_t shape[2] = {2, 3};
    dsarl_tensor t;
    ck_assert_int_eq(dsarl_tensor_init(&t, values, DSARL_DTYPE_F32, 2, shape, DSARL_DEVICE_CPU, &err), DSARL_OK);
    char *path = tmp_path("a.npy");
    ck_assert_int_eq(dsarl_npy_write(path, &t, &err), DSARL_OK);
    void *raw;
    size_t size;
    ck_assert_int_eq(dsarl_read_file(path, &raw, &size, &err), DSARL_OK);
    ck_assert_uint_eq(size, 128 + 24);
    const unsigned char *b = raw;
    static const unsigned char prefix[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0x76, 0x00};
    ck_assert_mem_eq(b, prefix, 10);
    const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    ck_assert_int_eq(strlen(dict), 59);
    ck_assert_mem_eq(b + 10, dict, 59);
    for (size_t i = 69; i < 127; i++)
        ck_assert_msg(b[i] == ' ', "byte %zu is 0x%02x, want a space", i, b[i]);
    ck_assert_int_eq(b[127], '\n');
    ck_assert_mem_eq(b + 128, values, 24);
    free(raw);

    /* 1-D shapes get the trailing comma, scalars an empty tuple. */
    int64_t ids[5] = {1, -2, 3, 1LL << 40, 5};
    const int64_t five[1] = {5};
    ck_assert_int_eq(dsarl_tensor_init(&t, ids, DSARL_DTYPE_I64, 1, five, DSARL_DEVICE_CPU, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_npy_write(path, &t, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_read_file(path, &raw, &size, &err), DSARL_OK);
    const char *dict1 = "{'descr': '<i8', 'fortran_order': False, 'shape': (5,), }";
    ck_assert_mem_eq((char *)raw + 10, dict1, strlen(dict1));
    ck_assert_uint_eq(size, 128 + 40);
    free(raw);
    double scalar = 1.5;
    ck_assert_int_eq(dsarl_tensor_init(&t, &scalar, DSARL_DTYPE_F64, 0, NULL, DSARL_DEVICE_CPU, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_npy_write(path, &t, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_read_file(path, &raw, &size, &err), DSARL_OK);
    const char *dict0 = "{'descr': '<f8', 'fortran_order': False, 'shape': (), }";
    ck_assert_int_eq(strlen(dict0), 55);
    ck_assert_mem_eq((char *)raw + 10, dict0, strlen(dict0));
    ck_assert_uint_eq(size, 128 + 8); /* 10 + 55 + '\n' = 66 > 64, so the data starts at 128 */
    free(raw);
    free(path);
}
END_TEST

START_TEST(test_round_trip_every_dtype)
{
    static const dsarl_dtype dtypes[] = {DSARL_DTYPE_F32, DSARL_DTYPE_F64, DSARL_DTYPE_F16, DSARL_DTYPE_I32,
                                         DSARL_DTYPE_I64, DSARL_DTYPE_U8,  DSARL_DTYPE_I8,  DSARL_DTYPE_BOOL};
    dsarl_error err = {0};
    char *path = tmp_path("rt.npy");
    for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++) {
        int64_t shape[4] = {1 + next_u32() % 4, 1 + next_u32() % 5, 1 + next_u32() % 3, 2};
        int32_t ndim = 1 + (int32_t)(k % 4);
        dsarl_tensor t;
        ck_assert_int_eq(dsarl_tensor_init(&t, NULL, dtypes[k], ndim, shape, DSARL_DEVICE_CPU, &err), DSARL_OK);
        size_t nbytes = dsarl_tensor_nbytes(&t);
        unsigned char *data = malloc(nbytes);
        for (size_t i = 0; i < nbytes; i++)
            data[i] = dtypes[k] == DSARL_DTYPE_BOOL ? (unsigned char)(next_u32() & 1) : (unsigned char)next_u32();
        t.data = data;
        ck_assert_int_eq(dsarl_npy_write(path, &t, &err), DSARL_OK);
        dsarl_tensor back;
        ck_assert_msg(dsarl_npy_read(path, &back, &err) == DSARL_OK, "%s", err.message);
        ck_assert_int_eq(back.dtype, dtypes[k]);
        ck_assert_int_eq(back.ndim, ndim);
        ck_assert_mem_eq(back.shape, t.shape, sizeof t.shape);
        ck_assert_mem_eq(back.data, data, nbytes);
        void *raw;
        size_t size;
        ck_assert_int_eq(dsarl_read_file(path, &raw, &size, &err), DSARL_OK);
        ck_assert_uint_eq((size - nbytes) % 64, 0); /* data starts on a 64-byte boundary */
        free(raw);
        free(back.data);
        free(data);
    }
    free(path);
}
END_TEST

START_TEST(test_bf16_written_as_f32)
{
    dsarl_error err = {0};
    uint16_t bf[7];
    for (int i = 0; i < 7; i++)
        bf[i] = (uint16_t)((next_u32() & 0x3fff) | 0x3c00); /* finite values of moderate size */
    const int64_t shape[1] = {7};
    dsarl_tensor t;
    ck_assert_int_eq(dsarl_tensor_init(&t, bf, DSARL_DTYPE_BF16, 1, shape, DSARL_DEVICE_CPU, &err), DSARL_OK);
    char *path = tmp_path("bf.npy");
    ck_assert_int_eq(dsarl_npy_write(path, &t, &err), DSARL_OK);
    dsarl_tensor back;
    ck_assert_int_eq(dsarl_npy_read(path, &back, &err), DSARL_OK);
    ck_assert_int_eq(back.dtype, DSARL_DTYPE_F32);
    for (int i = 0; i < 7; i++) {
        uint32_t bits;
        memcpy(&bits, (const char *)back.data + 4 * i, 4);
        ck_assert_uint_eq(bits, (uint32_t)bf[i] << 16);
    }
    free(back.data);
    free(path);
}
END_TEST

static void write_raw(const char *path, const void *data, size_t n)
{
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_write_file_atomic(path, data, n, &err), DSARL_OK);
}

static void expect_read_error(const char *path, int code, const char *want)
{
    dsarl_error err = {0};
    dsarl_tensor t;
    int rc = dsarl_npy_read(path, &t, &err);
    ck_assert_msg(rc == code, "rc %d (%s), want %d", rc, err.message, code);
    ck_assert_msg(strstr(err.message, want) != NULL, "'%s' lacks '%s'", err.message, want);
}

/* A v1.0 file with the given dict text, padded to 64, followed by data_len bytes. */
static void write_npy_with_dict(const char *path, const char *dict, size_t data_len)
{
    unsigned char buf[512] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
    size_t len = strlen(dict);
    size_t total = (10 + len + 1 + 63) / 64 * 64;
    size_t header_len = total - 10;
    buf[8] = (unsigned char)header_len;
    buf[9] = (unsigned char)(header_len >> 8);
    memcpy(buf + 10, dict, len);
    memset(buf + 10 + len, ' ', header_len - len - 1);
    buf[total - 1] = '\n';
    memset(buf + total, 0x3f, data_len);
    write_raw(path, buf, total + data_len);
}

START_TEST(test_errors)
{
    dsarl_error err = {0};
    char *path = tmp_path("bad.npy");
    write_npy_with_dict(path, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8);
    expect_read_error(path, DSARL_E_UNSUPPORTED, ".npy dtype '>f4' is not supported");
    write_npy_with_dict(path, "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", 16);
    expect_read_error(path, DSARL_E_UNSUPPORTED, "'<c8'");
    write_npy_with_dict(path, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16);
    expect_read_error(path, DSARL_E_UNSUPPORTED, "Fortran-order");
    write_npy_with_dict(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 20);
    expect_read_error(path, DSARL_E_INVALID, "holds 20 data bytes but shape [2, 3] of f32 needs 24");
    write_npy_with_dict(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", 8);
    expect_read_error(path, DSARL_E_INVALID, "shape entry 1");
    write_npy_with_dict(path, "{'descr': '<f4', 'fortran_order': False}", 0);
    expect_read_error(path, DSARL_E_INVALID, "no 'shape'");
    write_raw(path, "PK\x03\x04 not npy at all", 20);
    expect_read_error(path, DSARL_E_INVALID, "not a .npy file");
    write_raw(path, "\x93NUMPY\x01\x00\xff\x00{}", 12);
    expect_read_error(path, DSARL_E_INVALID, "header length 255 runs past the end");
    /* A numpy-valid file we can read (proves the helper writes good files). */
    write_npy_with_dict(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8);
    dsarl_tensor t;
    ck_assert_int_eq(dsarl_npy_read(path, &t, &err), DSARL_OK);
    free(t.data);

    uint16_t raw[2] = {1, 2};
    const int64_t two[1] = {2};
    ck_assert_int_eq(dsarl_tensor_init(&t, raw, DSARL_DTYPE_F16, 1, two, DSARL_DEVICE_CUDA, &err), DSARL_OK);
    char *dev = tmp_path("dev.npy");
    ck_assert_int_eq(dsarl_npy_write(dev, &t, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "on a device"));
    ck_assert(!dsarl_path_exists(dev));
    free(dev);
    free(path);
}
END_TEST

START_TEST(test_numpy_agrees)
{
    if (system("python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
        printf("check_npy: SKIP test_numpy_agrees: python3 with numpy is not available\n");
        return;
    }
    dsarl_error err = {0};
    /* Our files: numpy must load them, and numpy.save of what it loaded must give the same bytes. */
    float f32[12];
    for (int i = 0; i < 12; i++)
        f32[i] = (float)(int32_t)next_u32() / 4096.0f;
    uint8_t mask[5] = {1, 0, 0, 1, 1};
    int64_t big[1] = {(int64_t)next_u32() << 20};
    const int64_t s0[3] = {2, 3, 2}, s1[1] = {5}, s2[2] = {1, 1};
    dsarl_tensor t[3];
    ck_assert_int_eq(dsarl_tensor_init(&t[0], f32, DSARL_DTYPE_F32, 3, s0, DSARL_DEVICE_CPU, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_tensor_init(&t[1], mask, DSARL_DTYPE_BOOL, 1, s1, DSARL_DEVICE_CPU, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_tensor_init(&t[2], big, DSARL_DTYPE_I64, 2, s2, DSARL_DEVICE_CPU, &err), DSARL_OK);
    char *paths[3] = {tmp_path("f32.npy"), tmp_path("mask.npy"), tmp_path("big.npy")};
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(dsarl_npy_write(paths[i], &t[i], &err), DSARL_OK);
    char *theirs = tmp_path("numpy_wrote.npy");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "python3 -c \"import io, sys\nimport numpy as np\n"
             "for p in sys.argv[1:4]:\n"
             "  a = np.load(p)\n"
             "  b = io.BytesIO(); np.save(b, a)\n"
             "  assert b.getvalue() == open(p, 'rb').read(), p\n"
             "  print(a.dtype, a.shape, a.tobytes().hex())\n"
             "np.save(sys.argv[4], (np.arange(24, dtype=np.float64) * 0.5 - 3).reshape(2, 3, 4))\n"
             "\" '%s' '%s' '%s' '%s'",
             paths[0], paths[1], paths[2], theirs);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char out[4096] = {0};
    size_t got = fread(out, 1, sizeof out - 1, p);
    int status = pclose(p);
    ck_assert_msg(status == 0, "numpy disagreed (status %d): %.*s", status, (int)got, out);
    char want[4096], hex[3][128];
    for (int k = 0; k < 3; k++) {
        size_t n = dsarl_tensor_nbytes(&t[k]);
        for (size_t b = 0; b < n; b++)
            snprintf(hex[k] + 2 * b, 3, "%02x", ((const unsigned char *)t[k].data)[b]);
    }
    snprintf(want, sizeof want, "float32 (2, 3, 2) %s\nbool (5,) %s\nint64 (1, 1) %s\n", hex[0], hex[1], hex[2]);
    ck_assert_str_eq(out, want);

    dsarl_tensor back;
    ck_assert_msg(dsarl_npy_read(theirs, &back, &err) == DSARL_OK, "%s", err.message);
    ck_assert_int_eq(back.dtype, DSARL_DTYPE_F64);
    ck_assert_int_eq(back.ndim, 3);
    ck_assert(back.shape[0] == 2 && back.shape[1] == 3 && back.shape[2] == 4);
    for (int i = 0; i < 24; i++)
        ck_assert(((const double *)back.data)[i] == i * 0.5 - 3);
    free(back.data);
    for (int i = 0; i < 3; i++)
        free(paths[i]);
    free(theirs);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("npy");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_header_bytes_by_hand);
    tcase_add_test(tc, test_round_trip_every_dtype);
    tcase_add_test(tc, test_bf16_written_as_f32);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_numpy_agrees);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
