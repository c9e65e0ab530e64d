/* indexer_fast.h: launchers of the two-kernel indexer_topk path (indexer_fast.cuh describes it). C declarations,
 * so the GPU tests can time each kernel on its own. */
#ifndef DSARL_TILELANG_INDEXER_FAST_H
#define DSARL_TILELANG_INDEXER_FAST_H

#include "tilelang.h"

DSARL_BEGIN_DECLS

/* Whether the tensor-core scores kernel takes these inputs (bf16 storage assumed by the caller): n_heads 8, 16, 32
 * or 64, head_dim a multiple of 16 whose query tile fits in shared memory, q and k 16-byte aligned. */
int tilelang_indexer_scores_mma_fits(const dsarl_dsa_indexer_inputs *in);

/* Scores of query rows [q_begin, q_end) into ws: row t - q_begin holds, at column s - key_start[t], the order key
 * of score(t, s) for every eligible key s (at most max_keys of them); nothing else is written. Rows with no more
 * than skip_upto eligible keys are not scored (pass topk when only indices are wanted, 0 otherwise). */
int tilelang_indexer_scores_mma(const dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                const dsarl_dsa_indexer_inputs *in, int64_t q_begin, int64_t q_end, uint32_t *ws,
                                int64_t ld_ws, int64_t max_keys, int32_t skip_upto, dsarl_error *err);

/* Top-k of query rows [q_begin, q_end) from the workspace written by tilelang_indexer_scores_mma. */
int tilelang_indexer_select(const dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, int64_t q_begin,
                            int64_t q_end, const uint32_t *ws, int64_t ld_ws, int64_t max_keys, int32_t topk,
                            int32_t *indices, float *scores, dsarl_error *err);

DSARL_END_DECLS

#endif /* DSARL_TILELANG_INDEXER_FAST_H */
