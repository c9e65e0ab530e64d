/* Argument checks shared by every op of the reference DSA backend. The oracle refuses inconsistent inputs instead
 * of guessing, so a caller bug (a range past the key array, an index outside its query's range) surfaces here with
 * the argument named, rather than as a silently different number in a kernel comparison. */
#include <math.h>
#include <stddef.h>
#include "dsa_reference.h"

int dsa_ref_check_batch(const char *op, const dsarl_dsa_batch *batch, dsarl_error *err)
{
    if (batch == NULL)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa reference %s: batch is NULL; pass the query ranges", op);
    if (batch->n_queries < 0 || batch->n_keys < 0 || batch->n_keys > INT32_MAX)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "dsa reference %s: batch.n_queries = %lld and batch.n_keys = %lld must be >= 0 (n_keys "
                          "at most INT32_MAX, since indices are int32)",
                          op, (long long)batch->n_queries, (long long)batch->n_keys);
    if (batch->n_queries > 0 && (batch->key_start == NULL || batch->key_end == NULL))
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "dsa reference %s: batch.key_start and batch.key_end must both be set for %lld queries", op,
                          (long long)batch->n_queries);
    for (int64_t t = 0; t < batch->n_queries; t++) {
        int64_t start = batch->key_start[t], end = batch->key_end[t];
        if (start < 0 || start > end || end > batch->n_keys)
            return DSARL_FAIL(err, DSARL_E_INVALID,
                              "dsa reference %s: query %lld has key range [%lld, %lld); a range must satisfy "
                              "0 <= key_start <= key_end <= n_keys = %lld",
                              op, (long long)t, (long long)start, (long long)end, (long long)batch->n_keys);
        if (end - start > batch->max_keys_per_query)
            return DSARL_FAIL(err, DSARL_E_INVALID,
                              "dsa reference %s: query %lld has %lld eligible keys but batch.max_keys_per_query = "
                              "%d; it must bound key_end - key_start over the batch",
                              op, (long long)t, (long long)(end - start), batch->max_keys_per_query);
    }
    return DSARL_OK;
}

int dsa_ref_check_attention(const char *op, const dsarl_dsa_batch *batch, const dsarl_dsa_attention_inputs *in,
                            dsarl_error *err)
{
    if (in == NULL)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa reference %s: the attention inputs are NULL", op);
    if (in->n_heads <= 0 || in->d_qk <= 0 || in->d_v <= 0 || in->d_v > in->d_qk)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "dsa reference %s: attention n_heads = %d, d_qk = %d, d_v = %d; all must be positive "
                          "and d_v <= d_qk (V is the first d_v columns of kv)",
                          op, in->n_heads, in->d_qk, in->d_v);
    if (!isfinite(in->softmax_scale) || in->softmax_scale <= 0.0f)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "dsa reference %s: attention softmax_scale = %g must be a finite positive number", op,
                          (double)in->softmax_scale);
    if ((batch->n_queries > 0 && in->q == NULL) || (batch->n_keys > 0 && in->kv == NULL))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa reference %s: attention q and kv must be set", op);
    return DSARL_OK;
}

int dsa_ref_check_headwise(const char *op, const dsarl_dsa_batch *batch, const dsarl_dsa_headwise_inputs *in,
                           dsarl_error *err)
{
    if (in == NULL)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa reference %s: the headwise attention inputs are NULL", op);
    if (in->n_heads <= 0 || in->d_qk <= 0 || in->d_v <= 0)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "dsa reference %s: headwise n_heads = %d, d_qk = %d, d_v = %d; all must be positive", op,
                          in->n_heads, in->d_qk, in->d_v);
    if (!isfinite(in->softmax_scale) || in->softmax_scale <= 0.0f)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "dsa reference %s: headwise softmax_scale = %g must be a finite positive number", op,
                          (double)in->softmax_scale);
    if ((batch->n_queries > 0 && in->q == NULL) || (batch->n_keys > 0 && (in->k == NULL || in->v == NULL)))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa reference %s: headwise q, k and v must be set", op);
    return DSARL_OK;
}

int dsa_ref_check_indexer(const char *op, const dsarl_dsa_batch *batch, const dsarl_dsa_indexer_inputs *in,
                          dsarl_error *err)
{
    if (in == NULL)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa reference %s: the indexer inputs are NULL", op);
    if (in->n_heads <= 0 || in->head_dim <= 0)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "dsa reference %s: indexer n_heads = %d and head_dim = %d must both be positive", op,
                          in->n_heads, in->head_dim);
    if ((batch->n_queries > 0 && (in->q == NULL || in->weights == NULL)) || (batch->n_keys > 0 && in->k == NULL))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa reference %s: indexer q, k and weights must be set", op);
    return DSARL_OK;
}

int dsa_ref_check_indices(const char *op, const dsarl_dsa_batch *batch, const int32_t *indices, int32_t topk,
                          dsarl_error *err)
{
    if (topk <= 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa reference %s: topk = %d must be positive", op, topk);
    if (batch->n_queries > 0 && indices == NULL)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa reference %s: indices (Tq, topk) must be set", op);
    for (int64_t t = 0; t < batch->n_queries; t++) {
        const int32_t *row = indices + t * (int64_t)topk;
        for (int32_t i = 0; i < topk; i++) {
            if (row[i] == -1)
                continue;
            if (row[i] < batch->key_start[t] || row[i] >= batch->key_end[t])
                return DSARL_FAIL(err, DSARL_E_INVALID,
                                  "dsa reference %s: indices[%lld][%d] = %d is outside query %lld's key range "
                                  "[%d, %d); a slot holds -1 or an absolute key index of that range",
                                  op, (long long)t, i, row[i], (long long)t, batch->key_start[t], batch->key_end[t]);
        }
    }
    return DSARL_OK;
}
