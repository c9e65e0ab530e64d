/* dsarl/safetensors.h: reading (zero-copy, mmap) and writing (atomic) Hugging Face safetensors files.
 * SDK tier: trainer services (docs/sdk.md): exported by libdsarl, versioned with it; plugins may call them.
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON {"name": {"dtype", "shape", "data_offsets"},
 * "__metadata__": {string: string}}, then the data region that data_offsets index. A file is accepted only when
 * it passes the reference implementation's checks (known dtypes, sizes that match shapes, tensors that neither
 * overlap nor leave gaps), so what we read is what torch/transformers would read. */
#ifndef DSARL_SAFETENSORS_H
#define DSARL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "dsarl/error.h"
#include "dsarl/tensor.h"

DSARL_BEGIN_DECLS

/* The largest header accepted, like the reference implementation. */
#define DSARL_SAFETENSORS_MAX_HEADER (100u * 1000u * 1000u)

/* An open, validated, memory-mapped file. */
typedef struct dsarl_safetensors_file dsarl_safetensors_file;

/* Maps and validates path; on failure *out is NULL and err names the file (and tensor) at fault. */
DSARL_API int dsarl_safetensors_open(const char *path, dsarl_safetensors_file **out, dsarl_error *err);

/* Unmaps and frees; tensors obtained from the file become invalid. NULL is a no-op. */
DSARL_API void dsarl_safetensors_close(dsarl_safetensors_file *f);

/* The path the file was opened with. */
DSARL_API const char *dsarl_safetensors_path(const dsarl_safetensors_file *f);

/* Bytes before the data region (the 8-byte length plus the header): what opening the file read of it. */
DSARL_API uint64_t dsarl_safetensors_header_bytes(const dsarl_safetensors_file *f);

/* Number of tensors (the __metadata__ entry is not a tensor). */
DSARL_API size_t dsarl_safetensors_count(const dsarl_safetensors_file *f);

/* Name of tensor i in name order (0 <= i < count), or NULL when i is out of range. */
DSARL_API const char *dsarl_safetensors_name(const dsarl_safetensors_file *f, size_t i);

/* 1 if the file has a tensor called name, else 0. */
DSARL_API int dsarl_safetensors_has(const dsarl_safetensors_file *f, const char *name);

/* Describes tensor `name` as a CPU tensor pointing into the read-only mapping (do not write through it; the data
 * is only as aligned as the writer made it). Missing name: DSARL_E_NOT_FOUND naming file and tensor. */
DSARL_API int dsarl_safetensors_get(const dsarl_safetensors_file *f, const char *name, dsarl_tensor *out,
                                    dsarl_error *err);

/* Value of __metadata__[key], or NULL when absent. */
DSARL_API const char *dsarl_safetensors_metadata(const dsarl_safetensors_file *f, const char *key);

/* Number of __metadata__ entries, and entry i (key and value; NULLs when out of range). */
DSARL_API size_t dsarl_safetensors_metadata_count(const dsarl_safetensors_file *f);
DSARL_API void dsarl_safetensors_metadata_at(const dsarl_safetensors_file *f, size_t i, const char **key,
                                             const char **value);

/* One tensor to write: a name and a contiguous CPU tensor whose data holds nbytes(tensor) bytes. */
typedef struct dsarl_safetensors_entry {
    const char *name;
    dsarl_tensor tensor;
} dsarl_safetensors_entry;

/* One __metadata__ string pair. */
typedef struct dsarl_safetensors_kv {
    const char *key;
    const char *value;
} dsarl_safetensors_kv;

/* Writes entries atomically (temp + fsync + rename) in the reference writer's layout: data ordered by dtype,
 * widest first, then by name (so every tensor is aligned to its element size), header padded with spaces to a
 * multiple of 8. Byte-identical to Python safetensors for the same tensors and metadata order. */
DSARL_API int dsarl_safetensors_write(const char *path, const dsarl_safetensors_entry *entries, size_t n_entries,
                                      const dsarl_safetensors_kv *metadata, size_t n_metadata, dsarl_error *err);

DSARL_END_DECLS

#endif /* DSARL_SAFETENSORS_H */
