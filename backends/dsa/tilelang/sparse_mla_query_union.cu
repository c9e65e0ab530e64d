/* sparse_mla_query_union.cu: the key lists of query groups, for the sm_90 sparse MLA backward at 8, 16 and 32
 * heads (sparse_mla_backward_sm90.cu). There a block's 64 rows are the heads of G = 64 / H consecutive queries, so
 * every key tile is read once and every key-gradient row is reduced once for the whole group instead of once per
 * query: the kernel needs, per group, the keys any of its queries selected and which of them did.
 *
 * One block per group. Each valid slot (key in [0, n_keys)) of the G queries' top-k rows becomes the code
 * key * 8 + q (q the query's place in the group), invalid ones 0xffffffff; a bitonic sort in shared memory orders
 * them, so one key's codes are adjacent and ordered by q. Two outcomes:
 *   - no code repeats (no query selected a key twice, the indexer's case): the group's list is the ascending
 *     distinct keys, each with a mask of the queries that selected it (bit q);
 *   - some query selected a key twice: the forward counts such a key once per slot, which one mask bit cannot
 *     say, so the list is the G rows' valid slots in slot order, each with its own query's bit alone (as much work
 *     as one block per query, and exact).
 * Written: keys and masks at group * capacity (capacity = G * topk), and the list's length. */
#include <stdint.h>
#include "tilelang_common.cuh"

#define UNION_THREADS 1024
#define UNION_INVALID 0xffffffffu

/* Ascending bitonic sort of n codes in shared memory (n a power of two); every thread of the block calls it. */
static __device__ void sort_codes(uint32_t *codes, int n)
{
    for (int size = 2; size <= n; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const int j = i ^ stride;
                if (j > i) {
                    const uint32_t a = codes[i], b = codes[j];
                    if ((a > b) == ((i & size) == 0)) {
                        codes[i] = b;
                        codes[j] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
}

static __global__ void __launch_bounds__(UNION_THREADS)
query_union_kernel(int32_t *union_keys, uint8_t *union_mask, int32_t *union_len, const int32_t *indices, int topk,
                   int group, int64_t n_queries, int64_t n_keys, int n_sorted)
{
    extern __shared__ uint32_t codes[]; // (n_sorted)
    __shared__ int repeated;
    const int64_t g = blockIdx.x, t0 = g * group;
    const int cap = group * topk;
    int32_t *keys_out = union_keys + g * cap;
    uint8_t *mask_out = union_mask + g * cap;
    if (threadIdx.x == 0)
        repeated = 0;
    for (int i = threadIdx.x; i < n_sorted; i += blockDim.x) {
        uint32_t code = UNION_INVALID;
        const int q = i / topk;
        if (i < cap && t0 + q < n_queries) {
            const int32_t key = indices[(t0 + q) * topk + i % topk];
            if (key >= 0 && (int64_t)key < n_keys)
                code = ((uint32_t)key << 3) | (uint32_t)q;
        }
        codes[i] = code;
    }
    __syncthreads();
    sort_codes(codes, n_sorted);
    int total = 0, written = 0;
    for (int base = 0; base < n_sorted; base += blockDim.x) {
        const int i = base + threadIdx.x;
        const uint32_t c = i < n_sorted ? codes[i] : UNION_INVALID;
        if (c != UNION_INVALID && i > 0 && codes[i - 1] == c)
            repeated = 1; // benign race: every writer stores 1
    }
    __syncthreads();
    if (!repeated) {
        for (int base = 0; base < n_sorted; base += blockDim.x) { // ascending distinct keys with their masks
            const int i = base + threadIdx.x;
            const uint32_t c = i < n_sorted ? codes[i] : UNION_INVALID;
            const int first = c != UNION_INVALID && (i == 0 || (codes[i - 1] >> 3) != (c >> 3));
            const int at = written + block_exclusive_count(first, &total);
            if (first) {
                uint32_t mask = 0;
                for (int j = i; j < n_sorted && j < i + group && (codes[j] >> 3) == (c >> 3); j++)
                    mask |= 1u << (codes[j] & 7u);
                keys_out[at] = (int32_t)(c >> 3);
                mask_out[at] = (uint8_t)mask;
            }
            written += total;
        }
    } else {
        for (int base = 0; base < cap; base += blockDim.x) { // every valid slot, its own query's bit
            const int i = base + threadIdx.x, q = i / topk;
            int32_t key = -1;
            if (i < cap && t0 + q < n_queries)
                key = indices[(t0 + q) * topk + i % topk];
            const int valid = key >= 0 && (int64_t)key < n_keys;
            const int at = written + block_exclusive_count(valid, &total);
            if (valid) {
                keys_out[at] = key;
                mask_out[at] = (uint8_t)(1u << q);
            }
            written += total;
        }
    }
    if (threadIdx.x == 0)
        union_len[g] = written;
}

extern "C" size_t tilelang_query_union_sorted(int group, int32_t topk)
{
    size_t n = 1;
    while (n < (size_t)group * (size_t)topk)
        n <<= 1;
    return n;
}

extern "C" int tilelang_query_union(dsarl_dsa_context *ctx, const int32_t *indices, int32_t topk, int group,
                                    int64_t n_queries, int64_t n_keys, int32_t *union_keys, uint8_t *union_mask,
                                    int32_t *union_len, dsarl_error *err)
{
    const int64_t groups = (n_queries + group - 1) / group;
    if (groups == 0)
        return DSARL_OK;
    const size_t n_sorted = tilelang_query_union_sorted(group, topk);
    const size_t shared = n_sorted * sizeof(uint32_t);
    tlSharedLimit(query_union_kernel, shared, err);
    query_union_kernel<<<(unsigned int)groups, UNION_THREADS, shared, TL_STREAM(ctx)>>>(
        union_keys, union_mask, union_len, indices, topk, group, n_queries, n_keys, (int)n_sorted);
    tlCheckLaunch("sparse_mla_backward query union", err);
    return DSARL_OK;
}
