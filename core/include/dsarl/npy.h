/* dsarl/npy.h: NumPy .npy files (format 1.0) for dumping tensors to compare against Python, and reading them back.
 * SDK tier: trainer services (docs/sdk.md): exported by libdsarl, versioned with it; plugins may call them.
 *
 * Supported dtypes: f32 '<f4', f64 '<f8', f16 '<f2', i32 '<i4', i64 '<i8', u8 '|u1', i8 '|i1', bool '|b1'.
 * bf16 has no NumPy dtype, so dsarl_npy_write stores a bf16 tensor as f32 (exact: every bf16 is a float32) and
 * a reader gets '<f4'. The header is laid out exactly as numpy.save writes it, so files are byte-identical. */
#ifndef DSARL_NPY_H
#define DSARL_NPY_H

#include "dsarl/error.h"
#include "dsarl/tensor.h"

DSARL_BEGIN_DECLS

/* Writes a contiguous CPU tensor to path atomically (temp + fsync + rename); C order, little-endian. */
DSARL_API int dsarl_npy_write(const char *path, const dsarl_tensor *t, dsarl_error *err);

/* Reads a C-order little-endian .npy (format 1.x, 2.x or 3.x) of a supported dtype into a malloc'd buffer
 * (*out->data, caller frees) described by *out. Errors name the file and what is wrong. */
DSARL_API int dsarl_npy_read(const char *path, dsarl_tensor *out, dsarl_error *err);

DSARL_END_DECLS

#endif /* DSARL_NPY_H */
