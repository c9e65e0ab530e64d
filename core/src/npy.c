/* npy.c: .npy writer (numpy.save's exact header layout) and a strict reader for the dtypes dsarl uses. */
#include "dsarl/npy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsarl/fileutil.h"

static const char npy_magic[6] = {(char)0x93, 'N', 'U', 'M', 'P', 'Y'};

/* numpy pads so the data starts at a multiple of 64, and reserves room for the first dimension to grow to this
 * many digits (numpy/lib/format.py GROWTH_AXIS_MAX_DIGITS); copying both keeps our files byte-identical. */
#define NPY_ALIGN 64
#define NPY_GROWTH_AXIS_MAX_DIGITS 21

static const char *npy_descr(dsarl_dtype dtype)
{
    switch (dtype) {
    case DSARL_DTYPE_F32: return "<f4";
    case DSARL_DTYPE_F64: return "<f8";
    case DSARL_DTYPE_F16: return "<f2";
    case DSARL_DTYPE_I32: return "<i4";
    case DSARL_DTYPE_I64: return "<i8";
    case DSARL_DTYPE_U8: return "|u1";
    case DSARL_DTYPE_I8: return "|i1";
    case DSARL_DTYPE_BOOL: return "|b1";
    default: return NULL;
    }
}

/* The dtype for a descr; '<', '|' and '=' all mean little-endian / byte-sized on the hosts dsarl runs on. */
static dsarl_dtype dtype_from_descr(const char *descr)
{
    if (descr[0] != '<' && descr[0] != '|' && descr[0] != '=')
        return DSARL_DTYPE_INVALID;
    static const struct { const char *code; dsarl_dtype dtype; } codes[] = {
        {"f4", DSARL_DTYPE_F32}, {"f8", DSARL_DTYPE_F64}, {"f2", DSARL_DTYPE_F16}, {"i4", DSARL_DTYPE_I32},
        {"i8", DSARL_DTYPE_I64}, {"u1", DSARL_DTYPE_U8},  {"i1", DSARL_DTYPE_I8},  {"b1", DSARL_DTYPE_BOOL},
    };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (strcmp(descr + 1, codes[i].code) == 0)
            return codes[i].dtype;
    return DSARL_DTYPE_INVALID;
}

int dsarl_npy_write(const char *path, const dsarl_tensor *t, dsarl_error *err)
{
    if (!path || !t)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_npy_write: path and tensor must not be NULL");
    if (t->device != DSARL_DEVICE_CPU)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: the tensor is on a device; copy it to the CPU before writing",
                          path);
    if (t->ndim < 0 || t->ndim > DSARL_TENSOR_MAX_DIMS)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor ndim %d is out of range 0..%d", path, (int)t->ndim,
                          DSARL_TENSOR_MAX_DIMS);
    int widen_bf16 = t->dtype == DSARL_DTYPE_BF16;
    const char *descr = widen_bf16 ? "<f4" : npy_descr(t->dtype);
    if (!descr)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "%s: dtype '%s' has no .npy form; supported are f32, f64, f16, "
                          "bf16 (written as f32), i32, i64, u8, i8 and bool", path, dsarl_dtype_name(t->dtype));
    size_t numel = (size_t)dsarl_tensor_numel(t);
    if (numel > 0 && !t->data)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: the tensor has no data", path);

    char shape[256];
    size_t used = (size_t)snprintf(shape, sizeof shape, "(");
    for (int32_t d = 0; d < t->ndim; d++)
        used += (size_t)snprintf(shape + used, sizeof shape - used, d ? ", %lld" : "%lld", (long long)t->shape[d]);
    snprintf(shape + used, sizeof shape - used, t->ndim == 1 ? ",)" : ")");
    char header[512];
    int len = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
    if (t->ndim > 0) {
        char first[32];
        int digits = snprintf(first, sizeof first, "%lld", (long long)t->shape[0]);
        for (int i = digits; i < NPY_GROWTH_AXIS_MAX_DIGITS; i++)
            header[len++] = ' ';
    }
    /* Like numpy: pad so magic(6) + version(2) + length(2) + header + '\n' is a multiple of 64 (a full 64 when
     * already aligned). */
    size_t padding = NPY_ALIGN - ((size_t)(10 + len + 1) % NPY_ALIGN);
    memset(header + len, ' ', padding);
    len += (int)padding;
    header[len++] = '\n';

    unsigned char prefix[10];
    memcpy(prefix, npy_magic, 6);
    prefix[6] = 1;
    prefix[7] = 0;
    prefix[8] = (unsigned char)(len & 0xff);
    prefix[9] = (unsigned char)(len >> 8);

    float *widened = NULL;
    const void *payload = t->data;
    size_t payload_bytes = numel * dsarl_dtype_size(t->dtype);
    if (widen_bf16 && numel > 0) {
        widened = malloc(numel * sizeof *widened);
        if (!widened)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory widening %zu bf16 values to f32", path, numel);
        int converted = dsarl_convert_to_f32(widened, t->data, DSARL_DTYPE_BF16, numel, err);
        if (converted != DSARL_OK) {
            free(widened);
            return converted;
        }
        payload = widened;
        payload_bytes = numel * sizeof *widened;
    }
    dsarl_atomic_file f;
    int rc = dsarl_atomic_file_open(&f, path, err);
    if (rc == DSARL_OK) {
        rc = dsarl_atomic_file_write(&f, prefix, sizeof prefix, err);
        if (rc == DSARL_OK)
            rc = dsarl_atomic_file_write(&f, header, (size_t)len, err);
        if (rc == DSARL_OK)
            rc = dsarl_atomic_file_write(&f, payload, payload_bytes, err);
        if (rc == DSARL_OK)
            rc = dsarl_atomic_file_commit(&f, err);
        else
            dsarl_atomic_file_abort(&f);
    }
    free(widened);
    return rc;
}

/* Finds `'key': ` in the header dict and returns a pointer just past it, or NULL. */
static const char *find_key(const char *header, const char *key)
{
    char pattern[32];
    snprintf(pattern, sizeof pattern, "'%s':", key);
    const char *p = strstr(header, pattern);
    if (!p)
        return NULL;
    p += strlen(pattern);
    while (*p == ' ')
        p++;
    return p;
}

/* Parses the header dict text into dtype and shape. */
static int parse_header(const char *path, const char *header, dsarl_dtype *dtype, int32_t *ndim, int64_t *shape,
                        dsarl_error *err)
{
    const char *p = find_key(header, "descr");
    char descr[16];
    if (!p || *p != '\'' || sscanf(p + 1, "%15[^']", descr) != 1)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: .npy header has no 'descr' string: %s", path, header);
    *dtype = dtype_from_descr(descr);
    if (*dtype == DSARL_DTYPE_INVALID)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "%s: .npy dtype '%s' is not supported; use little-endian f4, f8, "
                          "f2, i4, i8, u1, i1 or b1", path, descr);
    p = find_key(header, "fortran_order");
    if (!p || (strncmp(p, "False", 5) != 0 && strncmp(p, "True", 4) != 0))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: .npy header has no 'fortran_order' True/False", path);
    if (strncmp(p, "True", 4) == 0)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "%s: Fortran-order arrays are not supported; save with "
                          "numpy.ascontiguousarray first", path);
    p = find_key(header, "shape");
    if (!p || *p != '(')
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: .npy header has no 'shape' tuple", path);
    p++;
    *ndim = 0;
    for (;;) {
        while (*p == ' ')
            p++;
        if (*p == ')')
            break;
        char *end;
        long long dim = strtoll(p, &end, 10);
        if (end == p || dim < 0)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: .npy shape entry %d is not a non-negative integer", path,
                              (int)*ndim);
        if (*ndim == DSARL_TENSOR_MAX_DIMS)
            return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "%s: .npy array has more than %d dimensions", path,
                              DSARL_TENSOR_MAX_DIMS);
        shape[(*ndim)++] = dim;
        p = end;
        while (*p == ' ')
            p++;
        if (*p == ',')
            p++;
        else if (*p != ')')
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: .npy shape tuple is malformed", path);
    }
    return DSARL_OK;
}

int dsarl_npy_read(const char *path, dsarl_tensor *out, dsarl_error *err)
{
    if (!path || !out)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_npy_read: path and out must not be NULL");
    void *raw = NULL;
    size_t size = 0;
    DSARL_TRY(dsarl_read_file(path, &raw, &size, err));
    const unsigned char *bytes = raw;
    int rc = DSARL_OK;
    char *header = NULL;
    if (size < 10 || memcmp(bytes, npy_magic, 6) != 0) {
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: not a .npy file (missing the \\x93NUMPY magic)", path);
        goto done;
    }
    unsigned major = bytes[6];
    size_t header_len, header_start;
    if (major == 1) {
        header_len = (size_t)bytes[8] | (size_t)bytes[9] << 8;
        header_start = 10;
    } else if ((major == 2 || major == 3) && size >= 12) {
        header_len = (size_t)bytes[8] | (size_t)bytes[9] << 8 | (size_t)bytes[10] << 16 | (size_t)bytes[11] << 24;
        header_start = 12;
    } else {
        rc = DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "%s: .npy format version %u.%u is not supported (1.0-3.0 are)", path,
                        major, bytes[7]);
        goto done;
    }
    if (header_len > size - header_start) {
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: .npy header length %zu runs past the end of the %zu-byte file",
                        path, header_len, size);
        goto done;
    }
    header = malloc(header_len + 1);
    if (!header) {
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory", path);
        goto done;
    }
    memcpy(header, bytes + header_start, header_len);
    header[header_len] = '\0';
    dsarl_dtype dtype = DSARL_DTYPE_INVALID;
    int32_t ndim = 0;
    int64_t shape[DSARL_TENSOR_MAX_DIMS];
    rc = parse_header(path, header, &dtype, &ndim, shape, err);
    if (rc != DSARL_OK)
        goto done;
    dsarl_tensor t;
    rc = dsarl_tensor_init(&t, NULL, dtype, ndim, shape, DSARL_DEVICE_CPU, err);
    if (rc != DSARL_OK)
        goto done;
    size_t data_start = header_start + header_len;
    size_t nbytes = dsarl_tensor_nbytes(&t);
    if (size - data_start != nbytes) {
        char shape_buf[160];
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: holds %zu data bytes but shape %s of %s needs %zu (truncated?)",
                        path, size - data_start, dsarl_tensor_shape_str(&t, shape_buf, sizeof shape_buf),
                        dsarl_dtype_name(dtype), nbytes);
        goto done;
    }
    /* Move the data to the front of the buffer we already own instead of copying it into a new one. */
    memmove(raw, bytes + data_start, nbytes);
    t.data = raw;
    raw = NULL;
    *out = t;
done:
    free(header);
    free(raw);
    return rc;
}
