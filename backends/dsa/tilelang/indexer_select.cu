/* indexer_select.cu: exact top-k of each query row from the scores workspace (order-preserving uint32 keys).
 *
 * One block per row. The row is staged in shared memory when it fits. A radix select (4 passes of 8 bits, most
 * significant first) finds the k-th largest key exactly and how many keys equal to it belong to the top k; the
 * histograms are warp-aggregated (__match_any_sync: one shared atomic per distinct digit per warp), because the
 * first digit (sign and high exponent bits) puts nearly every score of a row into a handful of bins. An ordered
 * compaction then keeps every key above the k-th and the lowest-indexed keys equal to it (the tie rule): slot of
 * key i = (keys above before i) + min(equal keys before i, equal keys wanted). Without scores the slots are the
 * output (ascending key order, nothing to sort); with scores the chosen keys are bitonic-sorted into descending
 * score order, ties to the lower index. Rows with no more than topk keys take them all. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "indexer_fast.cuh"

#define SEL_ROW_CAP 16384 /* row keys staged in shared memory (64 KB); longer rows are read from global memory */

// Block-wide exclusive counts of two flags before this thread, and their totals.
template <int THREADS>
static __device__ void block_count2(int fa, int fb, int *before_a, int *before_b, int *total_a, int *total_b)
{
    constexpr int SEL_WARPS = THREADS / 32;
    __shared__ int counts[2][SEL_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned int lanes_below = (1u << lane) - 1u;
    const unsigned int ba = __ballot_sync(0xffffffffu, fa), bb = __ballot_sync(0xffffffffu, fb);
    __syncthreads(); /* the previous call's readers are done with counts */
    if (lane == 0) {
        counts[0][warp] = __popc(ba);
        counts[1][warp] = __popc(bb);
    }
    __syncthreads();
    int oa = 0, ob = 0, sa = 0, sb = 0;
    for (int w = 0; w < SEL_WARPS; w++) {
        const int ca = counts[0][w], cb = counts[1][w];
        oa += w < warp ? ca : 0;
        ob += w < warp ? cb : 0;
        sa += ca;
        sb += cb;
    }
    *before_a = oa + __popc(ba & lanes_below);
    *before_b = ob + __popc(bb & lanes_below);
    *total_a = sa;
    *total_b = sb;
}

// Exact k-th largest key of row[0, n) (0 < kk <= n) and how many keys equal to it are among the top kk.
// WARP_HIST: the first pass (sign and high exponent bits: a few crowded bins) counts into one histogram per warp,
// so warps never contend for a bin, and later passes (spread digits, few keys left) use plain shared atomics;
// otherwise every pass is warp-aggregated into one block histogram.
template <int THREADS, bool WARP_HIST>
static __device__ void radix_select(const uint32_t *row, int n, int kk, uint32_t *kth, int *equal_wanted)
{
    constexpr int WARPS = THREADS / 32, COPIES = WARP_HIST ? WARPS : 1;
    __shared__ int hist[COPIES][256];
    __shared__ uint32_t chosen_prefix;
    __shared__ int chosen_need;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    uint32_t prefix = 0, mask = 0;
    int need = kk;
    for (int shift = 24; shift >= 0; shift -= 8) {
        const int copies = WARP_HIST && shift == 24 ? COPIES : 1;
        for (int b = tid; b < copies * 256; b += THREADS)
            hist[b / 256][b % 256] = 0;
        __syncthreads();
        if (WARP_HIST && shift < 24) {
            for (int i = tid; i < n; i += THREADS) {
                const uint32_t key = row[i];
                if ((key & mask) == prefix)
                    atomicAdd(&hist[0][(key >> shift) & 255u], 1);
            }
        } else {
            for (int base = 0; base < n; base += THREADS) { /* uniform trip count: every lane reaches the match */
                const int i = base + tid;
                const uint32_t key = i < n ? row[i] : 0u;
                const bool part = i < n && (key & mask) == prefix;
                const uint32_t digit = part ? (key >> shift) & 255u : 0x100u;
                const unsigned int peers = __match_any_sync(0xffffffffu, digit);
                if (part && lane == __ffs(peers) - 1)
                    atomicAdd(&hist[WARP_HIST ? warp : 0][digit], __popc(peers));
            }
        }
        __syncthreads();
        if (tid < 32) { /* the bin holding the need-th largest: lane owns bins 8 lane .. 8 lane + 7 */
            int c[8], own = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                c[j] = 0;
                for (int w = 0; w < copies; w++)
                    c[j] += hist[w][lane * 8 + j];
                own += c[j];
            }
            int from_here = own; /* keys in bins of this lane and above */
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                const int v = __shfl_down_sync(0xffffffffu, from_here, off);
                from_here += lane + off < 32 ? v : 0;
            }
            const int above = from_here - own;
            if (above < need && from_here >= need) {
                int left = need - above, d = 7;
                for (; d > 0 && c[d] < left; d--)
                    left -= c[d];
                chosen_prefix = prefix | ((uint32_t)(lane * 8 + d) << shift);
                chosen_need = left;
            }
        }
        __syncthreads();
        prefix = chosen_prefix;
        need = chosen_need;
        mask |= 255u << shift;
    }
    *kth = prefix;
    *equal_wanted = need;
}

template <int THREADS, bool WARP_HIST>
static __global__ void __launch_bounds__(THREADS)
    indexer_select_kernel(int32_t *indices, float *scores, const uint32_t *ws, int64_t ld_ws,
                          const int32_t *key_start, const int32_t *key_end, int64_t q_begin, int topk,
                          int64_t max_keys, int row_cap, int sort_cap)
{
    extern __shared__ __align__(16) uint32_t sel_shared[];
    uint32_t *row_s = sel_shared;                          // (row_cap) the row's keys
    uint32_t *sort_key = row_s + row_cap;                  // (sort_cap) chosen keys, with scores only
    int32_t *sort_idx = (int32_t *)(sort_key + sort_cap);  // (sort_cap)
    const int tid = threadIdx.x;
    const int64_t t = q_begin + blockIdx.x;
    const int32_t start = key_start[t];
    int64_t n64 = (int64_t)key_end[t] - start;
    const int n = (int)(n64 < 0 ? 0 : (n64 > max_keys ? max_keys : n64));
    const int kk = n < topk ? n : topk;
    const int sorted = scores != NULL;
    int32_t *out = indices + t * topk;

    if (!sorted && kk == n) { /* every eligible key, in key order */
        for (int i = tid; i < topk; i += THREADS)
            out[i] = i < n ? start + i : -1;
        return;
    }
    const uint32_t *g_row = ws + (t - q_begin) * ld_ws, *row = g_row;
    if (n <= row_cap) { /* 16-byte loads: ld_ws is a multiple of 4 */
        for (int i = tid; i < n / 4; i += THREADS)
            reinterpret_cast<uint4 *>(row_s)[i] = reinterpret_cast<const uint4 *>(g_row)[i];
        for (int i = n / 4 * 4 + tid; i < n; i += THREADS)
            row_s[i] = g_row[i];
        row = row_s;
        __syncthreads();
    }
    uint32_t kth = 0;
    int equal_wanted = 0;
    const int take_all = kk == n;
    if (!take_all)
        radix_select<THREADS, WARP_HIST>(row, n, kk, &kth, &equal_wanted);
    const int above_total = kk - equal_wanted;

    // Ordered compaction, stopping once every chosen key has been seen.
    int above_seen = 0, equal_seen = 0;
    for (int base = 0; base < n && (above_seen < above_total || equal_seen < equal_wanted); base += THREADS) {
        const int i = base + tid;
        const uint32_t key = i < n ? row[i] : 0u;
        const int above = i < n && (take_all || key > kth), equal = i < n && !take_all && key == kth;
        int above_before, equal_before, above_sum, equal_sum;
        block_count2<THREADS>(above, equal, &above_before, &equal_before, &above_sum, &equal_sum);
        const int equal_rank = equal_seen + equal_before;
        if (above || (equal && equal_rank < equal_wanted)) {
            const int slot = above_seen + above_before + min(equal_rank, equal_wanted);
            if (sorted) {
                sort_key[slot] = key;
                sort_idx[slot] = start + i;
            } else {
                out[slot] = start + i;
            }
        }
        above_seen += above_sum;
        equal_seen += equal_sum;
    }
    if (!sorted) {
        for (int i = kk + tid; i < topk; i += THREADS)
            out[i] = -1;
        return;
    }
    // Bitonic sort of the kk chosen keys (padded to a power of two), descending by key, ties by ascending index.
    int size_pow2 = 1;
    while (size_pow2 < kk)
        size_pow2 <<= 1;
    indexer_sort_chosen(sort_key, sort_idx, kk, size_pow2, tid, THREADS);
    float *score_row = scores + t * topk;
    for (int i = tid; i < topk; i += THREADS) {
        out[i] = i < kk ? sort_idx[i] : -1;
        score_row[i] = i < kk ? indexer_key_value(sort_key[i]) : -INFINITY;
    }
}

int tilelang_indexer_select(const dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, int64_t q_begin,
                            int64_t q_end, const uint32_t *ws, int64_t ld_ws, int64_t max_keys, int32_t topk,
                            int32_t *indices, float *scores, dsarl_error *err)
{
    if (q_end <= q_begin)
        return DSARL_OK;
    int sort_cap = 0;
    if (scores) {
        sort_cap = 1;
        while (sort_cap < topk)
            sort_cap <<= 1;
    }
    const int row_cap = (int)(max_keys < SEL_ROW_CAP ? max_keys : SEL_ROW_CAP);
    const size_t shared = (size_t)row_cap * sizeof(uint32_t) + (size_t)sort_cap * 8;
    if (shared > TL_MAX_SHARED)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "dsa tilelang indexer select: topk = %d with scores needs %zu "
                          "bytes of shared memory, more than %d", topk, shared, TL_MAX_SHARED);
    if (ctx->settings.select_threads == 256) { /* per-warp first histograms */
        tlSharedLimit((indexer_select_kernel<256, true>), shared, err);
        indexer_select_kernel<256, true><<<(unsigned int)(q_end - q_begin), 256, shared, TL_STREAM(ctx)>>>(
            indices, scores, ws, ld_ws, batch->key_start, batch->key_end, q_begin, topk, max_keys, row_cap,
            sort_cap);
    } else {
        tlSharedLimit((indexer_select_kernel<512, false>), shared, err);
        indexer_select_kernel<512, false><<<(unsigned int)(q_end - q_begin), 512, shared, TL_STREAM(ctx)>>>(
            indices, scores, ws, ld_ws, batch->key_start, batch->key_end, q_begin, topk, max_keys, row_cap,
            sort_cap);
    }
    tlCheckLaunch("indexer top-k select", err);
    return DSARL_OK;
}
