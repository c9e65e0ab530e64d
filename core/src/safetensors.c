/* safetensors.c: zero-copy reader (mmap + the reference implementation's validation) and atomic writer.
 *
 * The reader copies the parsed header into plain arrays (names sorted for binary search) and drops the JSON, so
 * an open file costs one mapping plus a few bytes per tensor. */
#include "dsarl/safetensors.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsarl/fileutil.h"
#include "dsarl/json.h"

typedef struct tensor_info {
    char *name;
    dsarl_dtype dtype;
    int32_t ndim;
    int64_t shape[DSARL_TENSOR_MAX_DIMS];
    uint64_t begin, end; /* byte range inside the data region */
} tensor_info;

struct dsarl_safetensors_file {
    char *path;
    void *map;
    size_t map_size;
    const unsigned char *data; /* start of the data region inside the mapping */
    uint64_t data_size;
    tensor_info *tensors; /* sorted by name */
    size_t count;
    char **meta_keys;
    char **meta_values;
    size_t meta_count;
};

static uint64_t read_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void write_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static int compare_by_name(const void *a, const void *b)
{
    return strcmp(((const tensor_info *)a)->name, ((const tensor_info *)b)->name);
}

static int compare_by_offsets(const void *a, const void *b)
{
    const tensor_info *x = *(const tensor_info *const *)a, *y = *(const tensor_info *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

/* Writes "[2, 3]" for an info's shape into buf. */
static const char *info_shape_str(const tensor_info *t, char *buf, size_t size)
{
    dsarl_tensor view;
    memset(&view, 0, sizeof view);
    view.ndim = t->ndim;
    memcpy(view.shape, t->shape, sizeof view.shape);
    return dsarl_tensor_shape_str(&view, buf, size);
}

/* Parses one header entry into t (name already set); every failure names the file and the tensor. */
static int parse_entry(const char *path, const char *name, json_t *entry, tensor_info *t, uint64_t data_size,
                       dsarl_error *err)
{
    if (!json_is_object(entry))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor '%s' header entry must be an object, got %s", path, name,
                          dsarl_json_type_name(entry));
    json_t *dtype = json_object_get(entry, "dtype");
    json_t *shape = json_object_get(entry, "shape");
    json_t *offsets = json_object_get(entry, "data_offsets");
    if (!json_is_string(dtype))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor '%s' needs a string 'dtype', got %s", path, name,
                          dsarl_json_type_name(dtype));
    const char *dtype_name = json_string_value(dtype);
    /* Only the safetensors spellings are valid inside a file; dsarl's lowercase names are for recipes. */
    t->dtype = dsarl_dtype_from_name(dtype_name);
    if (t->dtype == DSARL_DTYPE_INVALID || !isupper((unsigned char)dtype_name[0]))
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "%s: tensor '%s' has dtype '%s', supported are F64, F32, F16, BF16, F8_E4M3, I64, I32, I8, U8, "
                          "BOOL",
                          path, name, dtype_name);
    if (!json_is_array(shape))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor '%s' needs a 'shape' array, got %s", path, name,
                          dsarl_json_type_name(shape));
    size_t ndim = json_array_size(shape);
    if (ndim > DSARL_TENSOR_MAX_DIMS)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "%s: tensor '%s' has %zu dimensions, dsarl supports at most %d",
                          path, name, ndim, DSARL_TENSOR_MAX_DIMS);
    t->ndim = (int32_t)ndim;
    uint64_t numel = 1;
    int overflow = 0;
    for (size_t d = 0; d < DSARL_TENSOR_MAX_DIMS; d++) {
        if (d >= ndim) {
            t->shape[d] = 1;
            continue;
        }
        json_t *dim = json_array_get(shape, d);
        if (!json_is_integer(dim) || json_integer_value(dim) < 0)
            return DSARL_FAIL(err, DSARL_E_INVALID,
                              "%s: tensor '%s' shape entry %zu must be a non-negative integer", path, name, d);
        t->shape[d] = (int64_t)json_integer_value(dim);
        uint64_t dimension = (uint64_t)t->shape[d];
        if (dimension && numel > (uint64_t)INT64_MAX / dimension)
            overflow = 1;
        else
            numel *= dimension;
    }
    size_t elem = dsarl_dtype_size(t->dtype);
    if (overflow || numel > UINT64_MAX / elem)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor '%s' shape is too large to address", path, name);
    uint64_t nbytes = numel * elem;
    if (!json_is_array(offsets) || json_array_size(offsets) != 2 || !json_is_integer(json_array_get(offsets, 0)) ||
        !json_is_integer(json_array_get(offsets, 1)) || json_integer_value(json_array_get(offsets, 0)) < 0 ||
        json_integer_value(json_array_get(offsets, 1)) < 0)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "%s: tensor '%s' needs 'data_offsets' [begin, end] of two non-negative integers", path,
                          name);
    t->begin = (uint64_t)json_integer_value(json_array_get(offsets, 0));
    t->end = (uint64_t)json_integer_value(json_array_get(offsets, 1));
    if (t->begin > t->end)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor '%s' data_offsets [%llu, %llu] end before they begin",
                          path, name, (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end - t->begin != nbytes) {
        char shape_buf[160];
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor '%s' data_offsets [%llu, %llu] do not match shape %s of %s "
                          "(%llu bytes)", path, name, (unsigned long long)t->begin, (unsigned long long)t->end,
                          info_shape_str(t, shape_buf, sizeof shape_buf), dtype_name, (unsigned long long)nbytes);
    }
    if (t->end > data_size)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "%s: tensor '%s' data_offsets [%llu, %llu] run past the end of the %llu-byte data region "
                          "(file truncated?)", path, name, (unsigned long long)t->begin, (unsigned long long)t->end,
                          (unsigned long long)data_size);
    return DSARL_OK;
}

static int parse_metadata(const char *path, json_t *meta, dsarl_safetensors_file *f, dsarl_error *err)
{
    if (!json_is_object(meta))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: '__metadata__' must be an object of strings, got %s", path,
                          dsarl_json_type_name(meta));
    size_t n = json_object_size(meta);
    f->meta_keys = calloc(n ? n : 1, sizeof *f->meta_keys);
    f->meta_values = calloc(n ? n : 1, sizeof *f->meta_values);
    if (!f->meta_keys || !f->meta_values)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory reading __metadata__", path);
    const char *key;
    json_t *value;
    json_object_foreach(meta, key, value) {
        if (!json_is_string(value))
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: __metadata__ key '%s' must be a string, got %s", path, key,
                              dsarl_json_type_name(value));
        f->meta_keys[f->meta_count] = strdup(key);
        f->meta_values[f->meta_count] = strdup(json_string_value(value));
        f->meta_count++;
        if (!f->meta_keys[f->meta_count - 1] || !f->meta_values[f->meta_count - 1])
            return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory reading __metadata__", path);
    }
    return DSARL_OK;
}

/* The reference implementation requires the tensors, in offset order, to tile the data region exactly. */
static int check_layout(dsarl_safetensors_file *f, dsarl_error *err)
{
    tensor_info **order = malloc((f->count ? f->count : 1) * sizeof *order);
    if (!order)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory checking tensor offsets", f->path);
    for (size_t i = 0; i < f->count; i++)
        order[i] = &f->tensors[i];
    qsort(order, f->count, sizeof *order, compare_by_offsets);
    uint64_t covered = 0;
    const tensor_info *previous = NULL;
    int rc = DSARL_OK;
    for (size_t i = 0; i < f->count && rc == DSARL_OK; i++) {
        const tensor_info *t = order[i];
        if (t->begin < covered)
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor '%s' data_offsets [%llu, %llu] overlap tensor '%s' "
                            "[%llu, %llu]", f->path, t->name, (unsigned long long)t->begin,
                            (unsigned long long)t->end, previous->name, (unsigned long long)previous->begin,
                            (unsigned long long)previous->end);
        else if (t->begin > covered)
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: bytes [%llu, %llu) of the data region belong to no tensor "
                            "(before tensor '%s'); tensors must cover the data region without gaps", f->path,
                            (unsigned long long)covered, (unsigned long long)t->begin, t->name);
        if (t->end > covered) {
            covered = t->end;
            previous = t;
        } else if (!previous) {
            previous = t;
        }
    }
    free(order);
    if (rc == DSARL_OK && covered != f->data_size)
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: the data region is %llu bytes but the tensors cover only the "
                        "first %llu; tensors must cover it without gaps", f->path,
                        (unsigned long long)f->data_size, (unsigned long long)covered);
    return rc;
}

/* Parses and validates the header text; fills tensors and metadata of f. */
static int parse_header(dsarl_safetensors_file *f, const char *text, size_t n, dsarl_error *err)
{
    json_t *root = NULL;
    json_error_t jerr;
    root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: header is not valid JSON (line %d, column %d: %s)", f->path,
                          jerr.line, jerr.column, jerr.text);
    int rc = DSARL_OK;
    if (!json_is_object(root)) {
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: header must be a JSON object, got %s", f->path,
                        dsarl_json_type_name(root));
        goto done;
    }
    size_t capacity = json_object_size(root);
    f->tensors = calloc(capacity ? capacity : 1, sizeof *f->tensors);
    if (!f->tensors) {
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory for %zu tensor entries", f->path, capacity);
        goto done;
    }
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        if (strcmp(key, "__metadata__") == 0) {
            rc = parse_metadata(f->path, value, f, err);
        } else {
            tensor_info *t = &f->tensors[f->count];
            t->name = strdup(key);
            if (!t->name) {
                rc = DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory", f->path);
                break;
            }
            f->count++;
            rc = parse_entry(f->path, key, value, t, f->data_size, err);
        }
        if (rc != DSARL_OK)
            break;
    }
    if (rc == DSARL_OK)
        rc = check_layout(f, err);
    if (rc == DSARL_OK)
        qsort(f->tensors, f->count, sizeof *f->tensors, compare_by_name);
done:
    json_decref(root);
    return rc;
}

int dsarl_safetensors_open(const char *path, dsarl_safetensors_file **out, dsarl_error *err)
{
    if (!path || !out)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_safetensors_open: path and out must not be NULL");
    *out = NULL;
    dsarl_safetensors_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory opening safetensors file", path);
    }
    int rc = DSARL_OK;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = DSARL_FAIL(err, errno == ENOENT ? DSARL_E_NOT_FOUND : DSARL_E_IO, "%s: cannot open: %s", path,
                        strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = DSARL_FAIL(err, DSARL_E_IO, "%s: not a regular file", path);
        goto fail;
    }
    uint64_t file_size = (uint64_t)st.st_size;
    unsigned char prefix[8];
    if (file_size < 8 || pread(fd, prefix, 8, 0) != 8) {
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: file is %llu bytes, too short for the 8-byte header length "
                        "(truncated or not a safetensors file)", path, (unsigned long long)file_size);
        goto fail;
    }
    /* Check the length before mapping anything, so a garbage prefix costs nothing. */
    uint64_t header_len = read_le64(prefix);
    if (header_len > DSARL_SAFETENSORS_MAX_HEADER) {
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: header length %llu exceeds the %u-byte limit (not a safetensors "
                        "file?)", path, (unsigned long long)header_len, DSARL_SAFETENSORS_MAX_HEADER);
        goto fail;
    }
    if (header_len > file_size - 8) {
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: header length %llu runs past the end of the %llu-byte file "
                        "(truncated?)", path, (unsigned long long)header_len, (unsigned long long)file_size);
        goto fail;
    }
    f->map_size = (size_t)file_size;
    f->map = mmap(NULL, f->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        rc = DSARL_FAIL(err, DSARL_E_IO, "%s: mmap of %llu bytes failed: %s", path, (unsigned long long)file_size,
                        strerror(errno));
        goto fail;
    }
    close(fd);
    fd = -1;
    f->data = (const unsigned char *)f->map + 8 + header_len;
    f->data_size = file_size - 8 - header_len;
    rc = parse_header(f, (const char *)f->map + 8, (size_t)header_len, err);
    if (rc != DSARL_OK)
        goto fail;
    *out = f;
    return DSARL_OK;
fail:
    if (fd >= 0)
        close(fd);
    dsarl_safetensors_close(f);
    return rc;
}

void dsarl_safetensors_close(dsarl_safetensors_file *f)
{
    if (!f)
        return;
    if (f->map)
        munmap(f->map, f->map_size);
    for (size_t i = 0; i < f->count; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    for (size_t i = 0; i < f->meta_count; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    free(f->path);
    free(f);
}

const char *dsarl_safetensors_path(const dsarl_safetensors_file *f)
{
    return f->path;
}

uint64_t dsarl_safetensors_header_bytes(const dsarl_safetensors_file *f)
{
    return (uint64_t)(f->data - (const unsigned char *)f->map);
}

size_t dsarl_safetensors_count(const dsarl_safetensors_file *f)
{
    return f->count;
}

const char *dsarl_safetensors_name(const dsarl_safetensors_file *f, size_t i)
{
    return i < f->count ? f->tensors[i].name : NULL;
}

static const tensor_info *find(const dsarl_safetensors_file *f, const char *name)
{
    if (!name)
        return NULL;
    tensor_info key;
    key.name = (char *)name;
    return bsearch(&key, f->tensors, f->count, sizeof *f->tensors, compare_by_name);
}

int dsarl_safetensors_has(const dsarl_safetensors_file *f, const char *name)
{
    return find(f, name) != NULL;
}

int dsarl_safetensors_get(const dsarl_safetensors_file *f, const char *name, dsarl_tensor *out, dsarl_error *err)
{
    const tensor_info *t = find(f, name);
    if (!t)
        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s: no tensor named '%s' (the file has %zu tensors)", f->path,
                          name ? name : "(null)", f->count);
    /* The mapping is read-only; the tensor type has no const data, so callers must not write through it. */
    void *data = (void *)(uintptr_t)(f->data + t->begin);
    return dsarl_tensor_init(out, data, t->dtype, t->ndim, t->shape, DSARL_DEVICE_CPU, err);
}

const char *dsarl_safetensors_metadata(const dsarl_safetensors_file *f, const char *key)
{
    for (size_t i = 0; key && i < f->meta_count; i++)
        if (strcmp(f->meta_keys[i], key) == 0)
            return f->meta_values[i];
    return NULL;
}

size_t dsarl_safetensors_metadata_count(const dsarl_safetensors_file *f)
{
    return f->meta_count;
}

void dsarl_safetensors_metadata_at(const dsarl_safetensors_file *f, size_t i, const char **key, const char **value)
{
    if (key)
        *key = i < f->meta_count ? f->meta_keys[i] : NULL;
    if (value)
        *value = i < f->meta_count ? f->meta_values[i] : NULL;
}

/* ------------------------------------------------------------------------------------------------------------- */
/* Writing. */

/* The reference writer orders data by its Dtype enum, largest first; these ranks reproduce that order for the
 * dtypes dsarl knows (BOOL < U8 < I8 < F8_E4M3 < F16 < BF16 < I32 < F32 < F64 < I64). */
static int dtype_rank(dsarl_dtype dtype)
{
    switch (dtype) {
    case DSARL_DTYPE_BOOL: return 0;
    case DSARL_DTYPE_U8: return 1;
    case DSARL_DTYPE_I8: return 2;
    case DSARL_DTYPE_F8_E4M3: return 3;
    case DSARL_DTYPE_F16: return 4;
    case DSARL_DTYPE_BF16: return 5;
    case DSARL_DTYPE_I32: return 6;
    case DSARL_DTYPE_F32: return 7;
    case DSARL_DTYPE_F64: return 8;
    case DSARL_DTYPE_I64: return 9;
    default: return -1;
    }
}

static int compare_for_layout(const void *a, const void *b)
{
    const dsarl_safetensors_entry *x = *(const dsarl_safetensors_entry *const *)a;
    const dsarl_safetensors_entry *y = *(const dsarl_safetensors_entry *const *)b;
    int rx = dtype_rank(x->tensor.dtype), ry = dtype_rank(y->tensor.dtype);
    if (rx != ry)
        return ry - rx;
    return strcmp(x->name, y->name);
}

static int compare_entry_names(const void *a, const void *b)
{
    return strcmp((*(const dsarl_safetensors_entry *const *)a)->name,
                  (*(const dsarl_safetensors_entry *const *)b)->name);
}

static int validate_entries(const char *path, const dsarl_safetensors_entry *entries, size_t n,
                            const dsarl_safetensors_kv *metadata, size_t n_metadata, dsarl_error *err)
{
    for (size_t i = 0; i < n; i++) {
        const dsarl_safetensors_entry *e = &entries[i];
        if (!e->name)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: entry %zu has a NULL name", path, i);
        if (strcmp(e->name, "__metadata__") == 0)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: '__metadata__' is reserved and cannot name a tensor", path);
        if (dtype_rank(e->tensor.dtype) < 0)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor '%s' has invalid dtype %d", path, e->name,
                              (int)e->tensor.dtype);
        if (e->tensor.device != DSARL_DEVICE_CPU)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor '%s' is on a device; copy it to the CPU before "
                              "writing", path, e->name);
        if (e->tensor.ndim < 0 || e->tensor.ndim > DSARL_TENSOR_MAX_DIMS)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor '%s' has ndim %d, must be 0..%d", path, e->name,
                              (int)e->tensor.ndim, DSARL_TENSOR_MAX_DIMS);
        for (int32_t d = 0; d < e->tensor.ndim; d++)
            if (e->tensor.shape[d] < 0)
                return DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor '%s' dimension %d is negative", path, e->name,
                                  (int)d);
        if (!e->tensor.data && dsarl_tensor_nbytes(&e->tensor) > 0)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor '%s' has no data", path, e->name);
    }
    for (size_t i = 0; i < n_metadata; i++) {
        if (!metadata[i].key || !metadata[i].value)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: metadata entry %zu has a NULL key or value", path, i);
        for (size_t j = 0; j < i; j++)
            if (strcmp(metadata[i].key, metadata[j].key) == 0)
                return DSARL_FAIL(err, DSARL_E_INVALID, "%s: metadata key '%s' is given twice", path,
                                  metadata[i].key);
    }
    return DSARL_OK;
}

/* Builds the padded header text for entries in `order`; *out is malloc'd, *out_len a multiple of 8. */
static int build_header(const char *path, const dsarl_safetensors_entry *const *order, size_t n,
                        const dsarl_safetensors_kv *metadata, size_t n_metadata, char **out, size_t *out_len,
                        dsarl_error *err)
{
    json_t *root = json_object();
    int ok = root != NULL;
    if (ok && n_metadata > 0) {
        json_t *meta = json_object();
        ok = meta && json_object_set_new(root, "__metadata__", meta) == 0;
        for (size_t i = 0; ok && i < n_metadata; i++)
            ok = json_object_set_new(meta, metadata[i].key, json_string(metadata[i].value)) == 0;
    }
    uint64_t offset = 0;
    for (size_t i = 0; ok && i < n; i++) {
        const dsarl_tensor *t = &order[i]->tensor;
        char dtype_name[8];
        const char *lower = dsarl_dtype_name(t->dtype);
        size_t k = 0;
        for (; lower[k] && k + 1 < sizeof dtype_name; k++)
            dtype_name[k] = (char)toupper((unsigned char)lower[k]);
        dtype_name[k] = '\0';
        json_t *shape = json_array();
        for (int32_t d = 0; shape && d < t->ndim; d++)
            json_array_append_new(shape, json_integer(t->shape[d]));
        uint64_t nbytes = dsarl_tensor_nbytes(t);
        json_t *entry = json_pack("{s:s, s:o, s:[I,I]}", "dtype", dtype_name, "shape", shape, "data_offsets",
                                  (json_int_t)offset, (json_int_t)(offset + nbytes));
        ok = entry && json_object_set_new(root, order[i]->name, entry) == 0;
        offset += nbytes;
    }
    char *text = ok ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!text)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory building the safetensors header", path);
    size_t len = strlen(text);
    size_t padded = (len + 7) / 8 * 8;
    char *buf = realloc(text, padded + 1);
    if (!buf) {
        free(text);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory building the safetensors header", path);
    }
    memset(buf + len, ' ', padded - len);
    buf[padded] = '\0';
    *out = buf;
    *out_len = padded;
    return DSARL_OK;
}

int dsarl_safetensors_write(const char *path, const dsarl_safetensors_entry *entries, size_t n_entries,
                            const dsarl_safetensors_kv *metadata, size_t n_metadata, dsarl_error *err)
{
    if (!path || (n_entries && !entries) || (n_metadata && !metadata))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_safetensors_write: path, entries and metadata must not be "
                          "NULL when counts are non-zero");
    DSARL_TRY(validate_entries(path, entries, n_entries, metadata, n_metadata, err));
    const dsarl_safetensors_entry **order = malloc((n_entries ? n_entries : 1) * sizeof *order);
    if (!order)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory sorting %zu tensors", path, n_entries);
    for (size_t i = 0; i < n_entries; i++)
        order[i] = &entries[i];
    int rc = DSARL_OK;
    qsort(order, n_entries, sizeof *order, compare_entry_names);
    for (size_t i = 1; i < n_entries && rc == DSARL_OK; i++)
        if (strcmp(order[i - 1]->name, order[i]->name) == 0)
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor name '%s' is given twice", path, order[i]->name);
    qsort(order, n_entries, sizeof *order, compare_for_layout);
    char *header = NULL;
    size_t header_len = 0;
    if (rc == DSARL_OK)
        rc = build_header(path, order, n_entries, metadata, n_metadata, &header, &header_len, err);
    dsarl_atomic_file file;
    if (rc == DSARL_OK)
        rc = dsarl_atomic_file_open(&file, path, err);
    if (rc == DSARL_OK) {
        unsigned char prefix[8];
        write_le64(prefix, header_len);
        rc = dsarl_atomic_file_write(&file, prefix, sizeof prefix, err);
        if (rc == DSARL_OK)
            rc = dsarl_atomic_file_write(&file, header, header_len, err);
        for (size_t i = 0; i < n_entries && rc == DSARL_OK; i++)
            rc = dsarl_atomic_file_write(&file, order[i]->tensor.data, dsarl_tensor_nbytes(&order[i]->tensor), err);
        if (rc == DSARL_OK)
            rc = dsarl_atomic_file_commit(&file, err);
        else
            dsarl_atomic_file_abort(&file);
    }
    free(header);
    free(order);
    return rc;
}
