/* dsa_reference.h: internals of the reference DSA backend, shared by its sources, entry.c and the unit tests
 * (which link the object library dsarl-dsa-reference-objects and call these functions without dlopen).
 *
 * Conventions of this backend (the oracle every other DSA backend is held to):
 * - Host memory, float32 storage; every dot product, softmax and gradient sum is accumulated in double and rounded
 *   to float32 once, when stored.
 * - indexer_topk writes the selected keys in descending score order (ties: lower key index first), then -1.
 * - Index slots: -1 is an empty slot; any other value must lie in the query's [key_start, key_end) or the call
 *   fails. A key listed twice in one row counts twice (each slot is one softmax term, as in FlashMLA's reference),
 *   in the attention forward, its backward and the sparse indexer loss alike; indexer_topk never produces that.
 * - sparse_mla_backward and the sparse-mode indexer loss use the lse they are given (as the CUDA kernels do), so
 *   an oracle comparison isolates the op under test; the dense-mode indexer loss recomputes the dense lse. */
#ifndef DSARL_DSA_REFERENCE_H
#define DSARL_DSA_REFERENCE_H

#include <stdint.h>
#include "dsarl/ops/dsa.h"

/* The ops table registered as (dsa, "reference"). */
extern const dsarl_dsa_ops dsarl_dsa_reference_ops;

/* --- the ops (documented in dsarl/ops/dsa.h) ----------------------------------------------------------------- */
int dsa_reference_create(const dsarl_device_ops *device_ops, dsarl_device *dev, const dsarl_node *recipe,
                         dsarl_dsa_context **out, dsarl_error *err);
void dsa_reference_destroy(dsarl_dsa_context *ctx);
int dsa_reference_indexer_topk(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, const dsarl_dsa_indexer_inputs *in,
                               int32_t topk, int32_t *indices, float *scores, dsarl_error *err);
int dsa_reference_sparse_mla_forward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                     const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk,
                                     void *out, float *lse, dsarl_error *err);
int dsa_reference_sparse_mla_backward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                      const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk,
                                      const void *out, const float *lse, const void *dout, void *dq, void *dkv,
                                      dsarl_error *err);
int dsa_reference_indexer_loss_forward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                       const dsarl_dsa_attention_inputs *attn, const float *lse,
                                       const dsarl_dsa_indexer_inputs *indexer, const int32_t *indices, int32_t topk,
                                       float *loss, dsarl_error *err);
int dsa_reference_indexer_loss_backward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                        const dsarl_dsa_attention_inputs *attn, const float *lse,
                                        const dsarl_dsa_indexer_inputs *indexer, const int32_t *indices, int32_t topk,
                                        const float *dloss, void *dq_index, void *dk_index, float *dweights,
                                        dsarl_error *err);
/* ABI 1.1 optional ops: the per-head (non-absorbed) form. The reference backend serves both forms and prefers the
 * absorbed one (the model's default). */
dsarl_dsa_form dsa_reference_preferred_form(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, int32_t topk);
int dsa_reference_headwise_attention_forward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                             const dsarl_dsa_headwise_inputs *in, const int32_t *indices, int32_t topk,
                                             void *out, float *lse, dsarl_error *err);
int dsa_reference_headwise_attention_backward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                              const dsarl_dsa_headwise_inputs *in, const int32_t *indices, int32_t topk,
                                              const void *out, const float *lse, const void *dout, void *dq, void *dk,
                                              void *dv, dsarl_error *err);

/* --- argument checks (validate.c): each fails with one sentence naming the argument and what would be valid --- */
/* Checks the ranges: 0 <= key_start[t] <= key_end[t] <= n_keys and key_end - key_start <= max_keys_per_query. */
int dsa_ref_check_batch(const char *op, const dsarl_dsa_batch *batch, dsarl_error *err);
/* Checks sizes and pointers of the attention operands (d_v <= d_qk, positive sizes, finite scale). */
int dsa_ref_check_attention(const char *op, const dsarl_dsa_batch *batch, const dsarl_dsa_attention_inputs *in,
                            dsarl_error *err);
/* Checks sizes and pointers of the per-head attention operands (positive sizes, finite scale). */
int dsa_ref_check_headwise(const char *op, const dsarl_dsa_batch *batch, const dsarl_dsa_headwise_inputs *in,
                           dsarl_error *err);
/* Checks sizes and pointers of the indexer operands. */
int dsa_ref_check_indexer(const char *op, const dsarl_dsa_batch *batch, const dsarl_dsa_indexer_inputs *in,
                          dsarl_error *err);
/* Checks topk > 0 and that every slot of indices (Tq, topk) is -1 or a key of its query's range. */
int dsa_ref_check_indices(const char *op, const dsarl_dsa_batch *batch, const int32_t *indices, int32_t topk,
                          dsarl_error *err);

/* --- shared arithmetic ---------------------------------------------------------------------------------------- */
/* a . b over n float32 values, accumulated in double with eight interleaved partial sums (a fixed order, so the
 * result is deterministic; independent sums let the compiler keep several vector additions in flight). */
static inline double dsa_ref_dot(const float *a, const float *b, int64_t n)
{
    // The tail starts at n rounded down to a multiple of 8 (n >= 0), so both trip counts follow from n alone; a
    // tail resuming from the main loop's counter let GCC at -O3 assume an unbounded tail and reject it
    // (aggressive-loop-optimizations) when n is a known constant.
    double s[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    const int64_t n8 = n - n % 8;
    for (int64_t i = 0; i < n8; i += 8)
        for (int lane = 0; lane < 8; lane++)
            s[lane] += (double)a[i + lane] * (double)b[i + lane];
    for (int64_t i = n8; i < n; i++)
        s[0] += (double)a[i] * (double)b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* Number of slots of one indices row (topk) that hold a key (not -1). */
static inline int32_t dsa_ref_count_valid(const int32_t *row, int32_t topk)
{
    int32_t n = 0;
    for (int32_t i = 0; i < topk; i++)
        n += row[i] >= 0;
    return n;
}

/* Entries needed to list the key set of any query of a call (dsa_ref_row_keys): topk with indices, else the
 * longest range; at least 1 so a buffer of that size can always be allocated. */
static inline int32_t dsa_ref_row_keys_capacity(const dsarl_dsa_batch *batch, const int32_t *indices, int32_t topk)
{
    int32_t n = indices != NULL ? topk : batch->max_keys_per_query;
    return n > 0 ? n : 1;
}

/* The key set S(t) of query t as absolute key indices: the valid slots of its indices row in slot order (a key in
 * two slots is listed twice), or every key of [key_start[t], key_end[t]) when indices is NULL. keys holds
 * dsa_ref_row_keys_capacity entries; returns |S(t)|. */
static inline int32_t dsa_ref_row_keys(const dsarl_dsa_batch *batch, const int32_t *indices, int32_t topk, int64_t t,
                                       int32_t *keys)
{
    int32_t n = 0;
    if (indices != NULL) {
        const int32_t *row = indices + t * topk;
        for (int32_t i = 0; i < topk; i++)
            if (row[i] >= 0)
                keys[n++] = row[i];
    } else {
        for (int32_t s = batch->key_start[t]; s < batch->key_end[t]; s++)
            keys[n++] = s;
    }
    return n;
}

/* --- gradient accumulation into key rows (key_accumulator.c) ------------------------------------------------- */
/* A double-precision shadow of the key rows a batch can touch, [first_key, first_key + n_rows), width columns:
 * gradients from every query are summed here and added to the float32 destination once, so a key's gradient does
 * not depend on how many queries share it. */
typedef struct dsa_ref_key_accumulator {
    double *rows; // (n_rows, width)
    int64_t first_key;
    int64_t n_rows;
    int64_t width;
} dsa_ref_key_accumulator;

/* Allocates a zeroed accumulator covering every key of the batch's ranges. */
int dsa_ref_key_accumulator_init(dsa_ref_key_accumulator *acc, const dsarl_dsa_batch *batch, int64_t width,
                                 dsarl_error *err);
/* The accumulator row of absolute key index key (width doubles). */
static inline double *dsa_ref_key_accumulator_row(dsa_ref_key_accumulator *acc, int64_t key)
{
    return acc->rows + (key - acc->first_key) * acc->width;
}
/* dst (Tk, dst_stride) += the accumulated rows, in the first width columns of each row; then frees acc. */
void dsa_ref_key_accumulator_flush(dsa_ref_key_accumulator *acc, float *dst, int64_t dst_stride);
/* Frees acc without writing anything (error paths). */
void dsa_ref_key_accumulator_free(dsa_ref_key_accumulator *acc);

#endif /* DSARL_DSA_REFERENCE_H */
