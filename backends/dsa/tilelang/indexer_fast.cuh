/* indexer_fast.cuh: device helpers of the two-kernel indexer_topk path for bf16 storage (indexer_topk.cu picks
 * it; the launchers are declared in indexer_fast.h).
 *
 *   1. indexer_scores_mma.cu: a block scores a tile of consecutive query rows (64 query x head columns per warp,
 *      8 warps; 4 with DSARL_TILELANG_INDEXER_SCORE_WARPS=4) against key tiles of 64 rows streamed once per query
 *      tile (cp.async double buffer, ldmatrix, mma.sync m16n8k16 bf16 -> fp32); ReLU, head weights and the sum over
 *      heads happen in registers, and only each row's eligible scores are stored, as order-preserving uint32 keys,
 *      in a (rows, ld) workspace.
 *   2. indexer_select.cu: one block per query row: an exact radix select of the k-th best key (4 passes of 8 bits,
 *      warp-aggregated shared-memory histograms, the row staged in shared memory), then an ordered compaction
 *      (every key above the k-th, and the lowest-indexed of those equal to it). Without scores the chosen keys are
 *      written in ascending key order; with scores they are bitonic-sorted into descending score order, ties to the
 *      lower index (as the reference writes them). DSARL_TILELANG_INDEXER_SELECT=v2: 256 threads, the crowded
 *      first pass counted per warp, plain atomics after (kept for timing comparisons).
 * Queries are processed in chunks of rows so the workspace stays bounded. */
#ifndef DSARL_TILELANG_INDEXER_FAST_CUH
#define DSARL_TILELANG_INDEXER_FAST_CUH

#include "indexer_fast.h"
#include "tilelang_common.cuh"

/* Order-preserving map of a float score to uint32 (larger score, larger key; -0 and +0 map to the same key, so
 * the tie rule sees them as equal, as the reference's double comparison does). */
static __device__ __forceinline__ uint32_t indexer_order_key(float f)
{
    uint32_t u = __float_as_uint(f == 0.0f ? 0.0f : f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static __device__ __forceinline__ float indexer_key_value(uint32_t k)
{
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* Orders the kk chosen (key, index) pairs in shared memory by a bitonic sort over n slots (n a power of two >= kk):
 * descending by key, ties by ascending index; slots [kk, n) are padded first so they sort last. Every thread of the
 * block calls it (it synchronises), tid / nthreads being its place in the block. */
__device__ __forceinline__ void indexer_sort_chosen(uint32_t *sort_key, int32_t *sort_idx, int kk, int n, int tid,
                                                    int nthreads)
{
    for (int i = kk + tid; i < n; i += nthreads) {
        sort_key[i] = 0u;
        sort_idx[i] = INT32_MAX;
    }
    __syncthreads();
    for (int size = 2; size <= n; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = tid; i < n; i += nthreads) {
                const int j = i ^ stride;
                if (j > i) {
                    const bool descending = (i & size) == 0;
                    const uint32_t ki = sort_key[i], kj = sort_key[j];
                    const int32_t ii = sort_idx[i], ij = sort_idx[j];
                    const bool j_first = kj > ki || (kj == ki && ij < ii); /* j ranks before i */
                    if (j_first == descending) {
                        sort_key[i] = kj;
                        sort_key[j] = ki;
                        sort_idx[i] = ij;
                        sort_idx[j] = ii;
                    }
                }
            }
            __syncthreads();
        }
    }
}

#endif /* DSARL_TILELANG_INDEXER_FAST_CUH */
