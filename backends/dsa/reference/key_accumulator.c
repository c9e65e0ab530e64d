/* A double-precision shadow of the key rows a batch touches, so that key gradients (dkv, dk_index), which sum
 * contributions from many queries and heads, are rounded to float32 once. Only the span of keys the batch's ranges
 * cover is allocated: a decode batch into a long cache touches a small window of it. */
#include <stdlib.h>
#include "dsa_reference.h"

int dsa_ref_key_accumulator_init(dsa_ref_key_accumulator *acc, const dsarl_dsa_batch *batch, int64_t width,
                                 dsarl_error *err)
{
    int64_t first = batch->n_keys, last = 0; // [first, last) spans every non-empty range
    for (int64_t t = 0; t < batch->n_queries; t++) {
        if (batch->key_start[t] == batch->key_end[t])
            continue;
        if (batch->key_start[t] < first)
            first = batch->key_start[t];
        if (batch->key_end[t] > last)
            last = batch->key_end[t];
    }
    acc->first_key = first < last ? first : 0;
    acc->n_rows = first < last ? last - first : 0;
    acc->width = width;
    acc->rows = NULL;
    if (acc->n_rows == 0)
        return DSARL_OK;
    acc->rows = calloc((size_t)(acc->n_rows * width), sizeof(double));
    if (acc->rows == NULL)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsa reference: cannot allocate a %lld x %lld double key accumulator",
                          (long long)acc->n_rows, (long long)width);
    return DSARL_OK;
}

void dsa_ref_key_accumulator_flush(dsa_ref_key_accumulator *acc, float *dst, int64_t dst_stride)
{
    for (int64_t r = 0; r < acc->n_rows; r++) {
        float *out = dst + (acc->first_key + r) * dst_stride;
        const double *sum = acc->rows + r * acc->width;
        for (int64_t c = 0; c < acc->width; c++)
            out[c] = (float)((double)out[c] + sum[c]);
    }
    dsa_ref_key_accumulator_free(acc);
}

void dsa_ref_key_accumulator_free(dsa_ref_key_accumulator *acc)
{
    free(acc->rows);
    acc->rows = NULL;
    acc->n_rows = 0;
}
