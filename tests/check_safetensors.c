/* check_safetensors.c: the reader against a file the Python reference stack wrote, bit-exact round trips for every
 * dtype, byte-identical output to the Python writer, one clean error per malformed-file class (and no crash on
 * truncations and corrupted headers), and -- when python3 has torch + safetensors -- Python reading our file. */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dsarl/fileutil.h"
#include "dsarl/safetensors.h"

#define FIXTURE DSARL_SOURCE_DIR "/tests/fixtures/safetensors/python_fixture.safetensors"
#define EXPECTED DSARL_SOURCE_DIR "/tests/fixtures/safetensors/python_fixture.expected.txt"

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
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dsarl-check-safetensors-XXXXXX");
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

static uint64_t element_bits(const dsarl_tensor *t, int64_t i)
{
    size_t size = dsarl_dtype_size(t->dtype);
    uint64_t v = 0;
    memcpy(&v, (const unsigned char *)t->data + (size_t)i * size, size); /* little-endian host */
    return v;
}

START_TEST(test_reads_python_fixture)
{
    dsarl_error err = {0};
    dsarl_safetensors_file *f = NULL;
    ck_assert_msg(dsarl_safetensors_open(FIXTURE, &f, &err) == DSARL_OK, "%s", err.message);
    ck_assert_uint_eq(dsarl_safetensors_count(f), 11);
    for (size_t i = 1; i < dsarl_safetensors_count(f); i++)
        ck_assert_int_lt(strcmp(dsarl_safetensors_name(f, i - 1), dsarl_safetensors_name(f, i)), 0);
    ck_assert_ptr_null(dsarl_safetensors_name(f, 11));
    ck_assert_str_eq(dsarl_safetensors_metadata(f, "format"), "pt");
    ck_assert_ptr_null(dsarl_safetensors_metadata(f, "absent"));
    ck_assert_uint_eq(dsarl_safetensors_metadata_count(f), 1);

    FILE *expected = fopen(EXPECTED, "r");
    ck_assert_ptr_nonnull(expected);
    char name[128], dtype_name[16];
    int ndim, lines = 0;
    while (fscanf(expected, "%127s %15s %d", name, dtype_name, &ndim) == 3) {
        dsarl_tensor t;
        ck_assert_msg(dsarl_safetensors_get(f, name, &t, &err) == DSARL_OK, "%s", err.message);
        ck_assert_int_eq(t.dtype, dsarl_dtype_from_name(dtype_name));
        ck_assert_int_eq(t.ndim, ndim);
        for (int d = 0; d < ndim; d++) {
            long long dim;
            ck_assert_int_eq(fscanf(expected, "%lld", &dim), 1);
            ck_assert_int_eq(t.shape[d], dim);
        }
        long long count;
        ck_assert_int_eq(fscanf(expected, "%lld", &count), 1);
        ck_assert_int_eq(dsarl_tensor_numel(&t), count);
        for (long long i = 0; i < count; i++) {
            unsigned long long bits;
            ck_assert_int_eq(fscanf(expected, "%llx", &bits), 1);
            ck_assert_msg(element_bits(&t, i) == bits, "%s[%lld] = 0x%llx, Python wrote 0x%llx", name, i,
                          (unsigned long long)element_bits(&t, i), bits);
        }
        lines++;
    }
    fclose(expected);
    ck_assert_int_eq(lines, 11);
    dsarl_tensor t;
    ck_assert_int_eq(dsarl_safetensors_get(f, "lm_head.weight", &t, &err), DSARL_E_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err.message, "python_fixture.safetensors: no tensor named 'lm_head.weight'"));
    ck_assert(!dsarl_safetensors_has(f, "lm_head.weight"));
    ck_assert(dsarl_safetensors_has(f, "ints.i64"));
    dsarl_safetensors_close(f);
}
END_TEST

/* torch's float32->bfloat16 and numpy's float32->float16 (in the fixture) against dsarl's conversions. */
START_TEST(test_conversions_match_torch_and_numpy)
{
    dsarl_error err = {0};
    dsarl_safetensors_file *f = NULL;
    ck_assert_int_eq(dsarl_safetensors_open(FIXTURE, &f, &err), DSARL_OK);
    dsarl_tensor x, bf, hf;
    ck_assert_int_eq(dsarl_safetensors_get(f, "values.f32", &x, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_safetensors_get(f, "values.bf16_torch", &bf, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_safetensors_get(f, "values.f16_numpy", &hf, &err), DSARL_OK);
    int64_t n = dsarl_tensor_numel(&x);
    ck_assert_int_eq(n, 48);
    for (int64_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, (const char *)x.data + 4 * i, 4);
        uint16_t want_bf = (uint16_t)element_bits(&bf, i), want_hf = (uint16_t)element_bits(&hf, i);
        uint16_t got_bf = dsarl_f32_to_bf16(v), got_hf = dsarl_f32_to_f16(v);
        if (isnan(v)) { /* torch's vectorised path writes 0xffff for NaN, we keep the sign: both must be NaN */
            ck_assert(isnan(dsarl_bf16_to_f32(got_bf)) && isnan(dsarl_bf16_to_f32(want_bf)));
            ck_assert(isnan(dsarl_f16_to_f32(got_hf)) && isnan(dsarl_f16_to_f32(want_hf)));
            continue;
        }
        ck_assert_msg(got_bf == want_bf, "%a: bf16 0x%04x, torch 0x%04x", (double)v, got_bf, want_bf);
        ck_assert_msg(got_hf == want_hf, "%a: f16 0x%04x, numpy 0x%04x", (double)v, got_hf, want_hf);
        ck_assert(dsarl_bf16_to_f32(want_bf) == (float)dsarl_bf16_to_f32(got_bf));
    }
    dsarl_safetensors_close(f);
}
END_TEST

START_TEST(test_rewrite_is_byte_identical_to_python)
{
    dsarl_error err = {0};
    dsarl_safetensors_file *f = NULL;
    ck_assert_int_eq(dsarl_safetensors_open(FIXTURE, &f, &err), DSARL_OK);
    size_t n = dsarl_safetensors_count(f);
    dsarl_safetensors_entry entries[16];
    for (size_t i = 0; i < n; i++) { /* reversed, so the writer's own ordering is what is tested */
        entries[n - 1 - i].name = dsarl_safetensors_name(f, i);
        ck_assert_int_eq(dsarl_safetensors_get(f, entries[n - 1 - i].name, &entries[n - 1 - i].tensor, &err),
                         DSARL_OK);
    }
    const dsarl_safetensors_kv meta[1] = {{"format", "pt"}};
    char *out = tmp_path("rewrite.safetensors");
    ck_assert_msg(dsarl_safetensors_write(out, entries, n, meta, 1, &err) == DSARL_OK, "%s", err.message);
    dsarl_safetensors_close(f);
    void *ours = NULL, *theirs = NULL;
    size_t n_ours = 0, n_theirs = 0;
    ck_assert_int_eq(dsarl_read_file(out, &ours, &n_ours, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_read_file(FIXTURE, &theirs, &n_theirs, &err), DSARL_OK);
    ck_assert_uint_eq(n_ours, n_theirs);
    ck_assert_msg(memcmp(ours, theirs, n_ours) == 0, "our header: %.300s\nPython's:   %.300s", (char *)ours + 8,
                  (char *)theirs + 8);
    free(ours);
    free(theirs);
    free(out);
}
END_TEST

START_TEST(test_round_trip_every_dtype)
{
    static const dsarl_dtype dtypes[] = {DSARL_DTYPE_F32, DSARL_DTYPE_BF16, DSARL_DTYPE_F16,
                                         DSARL_DTYPE_F64, DSARL_DTYPE_I32,  DSARL_DTYPE_I64,
                                         DSARL_DTYPE_U8,  DSARL_DTYPE_I8,   DSARL_DTYPE_BOOL};
    enum { N = sizeof dtypes / sizeof dtypes[0] };
    dsarl_error err = {0};
    dsarl_safetensors_entry entries[N + 2];
    char names[N + 2][32];
    void *buffers[N + 2];
    for (size_t i = 0; i < N + 2; i++) {
        /* Odd random shapes so that sizes are not multiples of 8 and alignment depends on the writer's order. */
        int64_t shape[3] = {1 + next_u32() % 5, 1 + next_u32() % 7, 1 + next_u32() % 3};
        int32_t ndim = (int32_t)(i % 4);
        dsarl_dtype dt = dtypes[i % N];
        if (i == N) /* a scalar */
            ndim = 0;
        if (i == N + 1) { /* and an empty tensor */
            ndim = 2;
            shape[0] = 0;
        }
        snprintf(names[i], sizeof names[i], "layer.%zu.%s", (i * 7) % (N + 2), dsarl_dtype_name(dt));
        ck_assert_int_eq(dsarl_tensor_init(&entries[i].tensor, NULL, dt, ndim, shape, DSARL_DEVICE_CPU, &err),
                         DSARL_OK);
        size_t nbytes = dsarl_tensor_nbytes(&entries[i].tensor);
        buffers[i] = malloc(nbytes + 1);
        for (size_t b = 0; b < nbytes; b++)
            ((unsigned char *)buffers[i])[b] = dt == DSARL_DTYPE_BOOL ? (unsigned char)(next_u32() & 1)
                                                                     : (unsigned char)next_u32();
        entries[i].tensor.data = buffers[i];
        entries[i].name = names[i];
    }
    const dsarl_safetensors_kv meta[2] = {{"format", "pt"}, {"note", "ünïcode \"quoted\""}};
    char *path = tmp_path("round.safetensors");
    ck_assert_msg(dsarl_safetensors_write(path, entries, N + 2, meta, 2, &err) == DSARL_OK, "%s", err.message);
    dsarl_safetensors_file *f = NULL;
    ck_assert_msg(dsarl_safetensors_open(path, &f, &err) == DSARL_OK, "%s", err.message);
    ck_assert_uint_eq(dsarl_safetensors_count(f), N + 2);
    ck_assert_str_eq(dsarl_safetensors_metadata(f, "note"), "ünïcode \"quoted\"");
    for (size_t i = 0; i < N + 2; i++) {
        dsarl_tensor t;
        ck_assert_int_eq(dsarl_safetensors_get(f, names[i], &t, &err), DSARL_OK);
        ck_assert_int_eq(t.dtype, entries[i].tensor.dtype);
        ck_assert_int_eq(t.ndim, entries[i].tensor.ndim);
        ck_assert_mem_eq(t.shape, entries[i].tensor.shape, sizeof t.shape);
        size_t nbytes = dsarl_tensor_nbytes(&t);
        ck_assert_uint_eq(nbytes, dsarl_tensor_nbytes(&entries[i].tensor));
        if (nbytes)
            ck_assert_mem_eq(t.data, buffers[i], nbytes);
        /* The mapping is page aligned, so this checks the file offset: widest dtypes first keeps all aligned. */
        ck_assert_uint_eq((uintptr_t)t.data % dsarl_dtype_size(t.dtype), 0);
        free(buffers[i]);
    }
    dsarl_safetensors_close(f);
    free(path);
}
END_TEST

START_TEST(test_write_errors_leave_nothing)
{
    dsarl_error err = {0};
    float data[6] = {1, 2, 3, 4, 5, 6};
    const int64_t shape[2] = {2, 3};
    dsarl_safetensors_entry e[2];
    ck_assert_int_eq(dsarl_tensor_init(&e[0].tensor, data, DSARL_DTYPE_F32, 2, shape, DSARL_DEVICE_CPU, &err), 0);
    e[1] = e[0];
    e[0].name = "w";
    e[1].name = "w";
    char *path = tmp_path("bad.safetensors");
    ck_assert_int_eq(dsarl_safetensors_write(path, e, 2, NULL, 0, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "tensor name 'w' is given twice"));
    e[1].name = "__metadata__";
    ck_assert_int_eq(dsarl_safetensors_write(path, e, 2, NULL, 0, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "reserved"));
    e[1].name = "v";
    e[1].tensor.device = DSARL_DEVICE_CUDA;
    ck_assert_int_eq(dsarl_safetensors_write(path, e, 2, NULL, 0, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "tensor 'v' is on a device"));
    e[1].tensor.device = DSARL_DEVICE_CPU;
    e[1].tensor.data = NULL;
    ck_assert_int_eq(dsarl_safetensors_write(path, e, 2, NULL, 0, &err), DSARL_E_INVALID);
    e[1].tensor.data = data;
    const dsarl_safetensors_kv dup[2] = {{"a", "1"}, {"a", "2"}};
    ck_assert_int_eq(dsarl_safetensors_write(path, e, 2, dup, 2, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "metadata key 'a'"));
    ck_assert(!dsarl_path_exists(path));
    DIR *d = opendir(tmpdir);
    struct dirent *ent;
    while ((ent = readdir(d)))
        ck_assert_msg(ent->d_name[0] == '.', "left behind: %s", ent->d_name);
    closedir(d);
    free(path);
}
END_TEST

/* Writes le64(strlen(header)) + header + data_len bytes of data to tmpdir/name. */
static char *craft(const char *name, uint64_t header_len_field, const char *header, size_t data_len)
{
    char *path = tmp_path(name);
    size_t hl = strlen(header);
    size_t total = 8 + hl + data_len;
    unsigned char *buf = malloc(total);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(header_len_field >> (8 * i));
    memcpy(buf + 8, header, hl);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + hl + i] = (unsigned char)(i * 29 + 1);
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_write_file_atomic(path, buf, total, &err), DSARL_OK);
    free(buf);
    return path;
}

/* Opens a crafted file and expects failure with `want` in the message. */
static void expect_open_error(const char *header, size_t data_len, int want_code, const char *want)
{
    char *path = craft("crafted.safetensors", strlen(header), header, data_len);
    dsarl_error err = {0};
    dsarl_safetensors_file *f = (dsarl_safetensors_file *)(uintptr_t)1;
    int rc = dsarl_safetensors_open(path, &f, &err);
    ck_assert_msg(rc == want_code, "header %s: rc %d (%s), want %d", header, rc, err.message, want_code);
    ck_assert_ptr_null(f);
    ck_assert_msg(strstr(err.message, want) != NULL, "header %s: message '%s' lacks '%s'", header, err.message, want);
    ck_assert_msg(strncmp(err.message, path, strlen(path)) == 0, "message '%s' does not start with the path",
                  err.message);
    free(path);
}

START_TEST(test_malformed_files_fail_cleanly)
{
    expect_open_error("{\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,12]}}", 12,
                      DSARL_E_INVALID,
                      ": tensor 'lm_head.weight' data_offsets [0, 12] do not match shape [2, 3] of F32 (24 bytes)");
    expect_open_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 12, DSARL_E_INVALID,
                      "tensor 'a' data_offsets [0, 24] run past the end of the 12-byte data region");
    // a dtype dsarl cannot read is bad input for it (exit status 3), real safetensors spelling or not
    expect_open_error("{\"a\":{\"dtype\":\"F8_E5M2\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2,
                      DSARL_E_INVALID, "tensor 'a' has dtype 'F8_E5M2'");
    expect_open_error("{\"a\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, DSARL_E_INVALID,
                      "dtype 'f32'");
    expect_open_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, DSARL_E_INVALID,
                      "tensor 'b' data_offsets [4, 12] overlap tensor 'a' [0, 8]");
    expect_open_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, DSARL_E_INVALID,
                      "bytes [4, 8) of the data region belong to no tensor");
    expect_open_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, DSARL_E_INVALID,
                      "tensors cover only the first 4");
    expect_open_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8, DSARL_E_INVALID,
                      "end before they begin");
    expect_open_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0, DSARL_E_INVALID,
                      "tensor 'a' shape entry 0 must be a non-negative integer");
    expect_open_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, DSARL_E_INVALID, "needs 'data_offsets'");
    expect_open_error("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, DSARL_E_INVALID, "needs a string 'dtype'");
    expect_open_error("{\"a\":[1]}", 0, DSARL_E_INVALID, "header entry must be an object");
    expect_open_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
                      DSARL_E_UNSUPPORTED, "9 dimensions");
    expect_open_error("{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
                      DSARL_E_INVALID, "too large");
    expect_open_error("{\"__metadata__\":{\"format\":1}}", 0, DSARL_E_INVALID, "__metadata__ key 'format'");
    expect_open_error("{\"__metadata__\":[]}", 0, DSARL_E_INVALID, "'__metadata__' must be an object");
    expect_open_error("{\"a\": ", 0, DSARL_E_INVALID, "header is not valid JSON");
    expect_open_error("[1, 2]", 0, DSARL_E_INVALID, "header must be a JSON object");
    expect_open_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},\"a\":{}}", 0,
                      DSARL_E_INVALID, "header is not valid JSON");

    dsarl_error err = {0};
    dsarl_safetensors_file *f = NULL;
    char *path = craft("past.safetensors", 1000, "{}", 40);
    ck_assert_int_eq(dsarl_safetensors_open(path, &f, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "header length 1000 runs past the end of the 50-byte file"));
    free(path);
    path = craft("short.safetensors", 0, "", 0);
    ck_assert_int_eq(truncate(path, 5), 0);
    ck_assert_int_eq(dsarl_safetensors_open(path, &f, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "file is 5 bytes, too short"));
    free(path);
    /* A header length over the limit, in a (sparse) file large enough to hold it. */
    path = craft("huge.safetensors", DSARL_SAFETENSORS_MAX_HEADER + 1ull, "{}", 0);
    ck_assert_int_eq(truncate(path, DSARL_SAFETENSORS_MAX_HEADER + 100ll), 0);
    ck_assert_int_eq(dsarl_safetensors_open(path, &f, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "exceeds the 100000000-byte limit"));
    free(path);
    path = tmp_path("missing.safetensors");
    ck_assert_int_eq(dsarl_safetensors_open(path, &f, &err), DSARL_E_NOT_FOUND);
    free(path);
    /* A valid file with empty header, no tensors, no data. */
    path = craft("empty.safetensors", 8, "{}      ", 0);
    ck_assert_int_eq(dsarl_safetensors_open(path, &f, &err), DSARL_OK);
    ck_assert_uint_eq(dsarl_safetensors_count(f), 0);
    dsarl_safetensors_close(f);
    free(path);
}
END_TEST

/* Every truncation of the fixture and a few hundred corrupted headers must fail (or succeed) without a crash or
 * leak; the sanitizer build turns any out-of-bounds access into a failure here. */
START_TEST(test_truncations_and_corruptions_do_not_crash)
{
    dsarl_error err = {0};
    void *bytes = NULL;
    size_t size = 0;
    ck_assert_int_eq(dsarl_read_file(FIXTURE, &bytes, &size, &err), DSARL_OK);
    char *path = tmp_path("mutated.safetensors");
    for (size_t len = 0; len < size; len += 1 + len / 64) {
        ck_assert_int_eq(dsarl_write_file_atomic(path, bytes, len, &err), DSARL_OK);
        dsarl_safetensors_file *f = NULL;
        ck_assert_msg(dsarl_safetensors_open(path, &f, &err) < 0, "truncation to %zu bytes was accepted", len);
    }
    unsigned char *copy = malloc(size);
    uint64_t header_len = 0;
    memcpy(&header_len, bytes, 8);
    int accepted = 0;
    for (int trial = 0; trial < 300; trial++) {
        memcpy(copy, bytes, size);
        size_t at = 8 + next_u32() % header_len;
        copy[at] = (unsigned char)next_u32();
        ck_assert_int_eq(dsarl_write_file_atomic(path, copy, size, &err), DSARL_OK);
        dsarl_safetensors_file *f = NULL;
        if (dsarl_safetensors_open(path, &f, &err) == DSARL_OK) {
            accepted++;
            for (size_t i = 0; i < dsarl_safetensors_count(f); i++) {
                dsarl_tensor t;
                ck_assert_int_eq(dsarl_safetensors_get(f, dsarl_safetensors_name(f, i), &t, &err), DSARL_OK);
                volatile unsigned char sink = 0;
                size_t nbytes = dsarl_tensor_nbytes(&t);
                for (size_t b = 0; b < nbytes; b++) /* touch every byte: must lie inside the mapping */
                    sink ^= ((const unsigned char *)t.data)[b];
                (void)sink;
            }
            dsarl_safetensors_close(f);
        } else {
            ck_assert(strlen(err.message) > 0);
        }
    }
    ck_assert_int_lt(accepted, 300);
    free(copy);
    free(bytes);
    free(path);
}
END_TEST

START_TEST(test_python_reads_our_file)
{
    if (system("python3 -c 'import torch, safetensors.torch' >/dev/null 2>&1") != 0) {
        printf("check_safetensors: SKIP test_python_reads_our_file: python3 with torch and safetensors is not "
               "available\n");
        return;
    }
    dsarl_error err = {0};
    float f32[6];
    uint16_t bf16[5];
    int64_t i64[3];
    for (int i = 0; i < 6; i++)
        f32[i] = (float)(int32_t)next_u32() / 65536.0f;
    for (int i = 0; i < 5; i++)
        bf16[i] = dsarl_f32_to_bf16((float)(int32_t)next_u32() / 1e6f);
    for (int i = 0; i < 3; i++)
        i64[i] = (int64_t)((uint64_t)next_u32() << 32 | next_u32());
    dsarl_safetensors_entry e[3];
    const int64_t s0[2] = {2, 3}, s1[1] = {5}, s2[1] = {3};
    ck_assert_int_eq(dsarl_tensor_init(&e[0].tensor, f32, DSARL_DTYPE_F32, 2, s0, DSARL_DEVICE_CPU, &err), 0);
    ck_assert_int_eq(dsarl_tensor_init(&e[1].tensor, bf16, DSARL_DTYPE_BF16, 1, s1, DSARL_DEVICE_CPU, &err), 0);
    ck_assert_int_eq(dsarl_tensor_init(&e[2].tensor, i64, DSARL_DTYPE_I64, 1, s2, DSARL_DEVICE_CPU, &err), 0);
    e[0].name = "model.w";
    e[1].name = "model.b";
    e[2].name = "ids";
    const dsarl_safetensors_kv meta[1] = {{"written_by", "dsarl"}};
    char *path = tmp_path("for_python.safetensors");
    ck_assert_int_eq(dsarl_safetensors_write(path, e, 3, meta, 1, &err), DSARL_OK);
    /* Python prints name, dtype, shape and the raw bytes in hex, one tensor per line, sorted by name. */
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "python3 -c \"import sys\nfrom safetensors import safe_open\nimport torch\n"
             "with safe_open(sys.argv[1], framework='pt') as f:\n"
             "  assert f.metadata() == {'written_by': 'dsarl'}, f.metadata()\n"
             "  for k in sorted(f.keys()):\n"
             "    t = f.get_tensor(k).contiguous()\n"
             "    print(k, str(t.dtype).split('.')[1], list(t.shape), t.view(torch.uint8).numpy().tobytes().hex())\n"
             "\" '%s'", path);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char out[4096] = {0};
    size_t got = fread(out, 1, sizeof out - 1, p);
    int status = pclose(p);
    ck_assert_msg(status == 0, "python failed (status %d): %.*s", status, (int)got, out);
    char want[4096], hex[3][256];
    const void *raw[3] = {i64, bf16, f32};
    const size_t nraw[3] = {sizeof i64, sizeof bf16, sizeof f32};
    for (int k = 0; k < 3; k++) {
        for (size_t b = 0; b < nraw[k]; b++)
            snprintf(hex[k] + 2 * b, 3, "%02x", ((const unsigned char *)raw[k])[b]);
    }
    snprintf(want, sizeof want, "ids int64 [3] %s\nmodel.b bfloat16 [5] %s\nmodel.w float32 [2, 3] %s\n", hex[0],
             hex[1], hex[2]);
    ck_assert_str_eq(out, want);
    free(path);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_reads_python_fixture);
    tcase_add_test(tc, test_conversions_match_torch_and_numpy);
    tcase_add_test(tc, test_rewrite_is_byte_identical_to_python);
    tcase_add_test(tc, test_round_trip_every_dtype);
    tcase_add_test(tc, test_write_errors_leave_nothing);
    tcase_add_test(tc, test_malformed_files_fail_cleanly);
    tcase_add_test(tc, test_truncations_and_corruptions_do_not_crash);
    tcase_add_test(tc, test_python_reads_our_file);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
