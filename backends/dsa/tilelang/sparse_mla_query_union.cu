/* sparse_mla_query_union.cu: the key lists of query groups, for the sm_90 sparse MLA backward at 8, 16 and 32
 * heads (sparse_mla_backward_sm90.cu). There a block's 64 rows are the heads of G = 64 / H consecutive queries, so
 * every key tile is read once and every key-gradient row is reduced once for the whole group instead of once per
 * query: the kernel needs, per group, the keys any of its queries selected and which of them did.
 *
 * Two outcomes per group:
 *   - no query selected a key twice (the indexer's case): the group's list is the ascending distinct valid keys
 *     (key in [0, n_keys)), each with a mask of the queries that selected it (bit q, q the query's place in the
 *     group);
 *   - some query selected a key twice: the forward counts such a key once per slot, which one mask bit cannot
 *     say, so the list is the G rows' valid slots in slot order, each with its own query's bit alone (as much work
 *     as one block per query, and exact).
 * Written: keys and masks at group * capacity (capacity = G * topk), and the list's length.
 *
 * One block per group, its slots (G consecutive top-k rows: one contiguous run of indices) held in registers as
 * codes key * 8 + q. A block-wide min and max of the valid keys bound the group's keys, and a presence map in
 * shared memory, one byte per key, covers them in windows of the map's size (48K keys or more): every slot in the
 * window ORs its query's bit into its key's byte (32-bit shared atomics on the containing word; the bit already
 * set means that query selected the key twice), then the warps write the window's non-zero bytes in key order,
 * each warp a contiguous run of the map's words at its offset from a block-wide count. A window after the first
 * starts at the least key left, so gaps between key clusters cost nothing. Causal queries select keys in [0, t]:
 * one window holds a group up to 48K tokens, and every window costs a pass over the slots' registers and a few
 * words of shared memory per thread, far less than sorting them. A group whose keys would take more than
 * UNION_MAX_WINDOWS windows (keys spread thinly over millions of positions) sorts its codes instead (bitonic, in
 * shared memory: one key's codes end up adjacent and ordered by q), as this kernel did for every group before. */
#include <stdint.h>
#include "tilelang_common.cuh"

#define UNION_THREADS 512
#define UNION_WARPS (UNION_THREADS / 32)
#define UNION_INVALID 0xffffffffu  /* an invalid slot's code (its key, code >> 3, is above any valid key) */
#define UNION_MAP_MIN (48 * 1024)  /* bytes (= keys a window) of the presence map at least; 4 such blocks fit an SM */
#define UNION_MAX_WINDOWS 16       /* windows of the map a group takes before it sorts instead */
#define UNION_FULL 0xffffffffu
static_assert(TILELANG_QUERY_UNION_MAX <= 32 * UNION_THREADS, "the widest kernel holds 32 slots a thread");

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

/* Bit 7 of each non-zero byte of w (no carry crosses a byte: (x & 0x7f) + 0x7f <= 0xfe). */
static __device__ __forceinline__ uint32_t nonzero_bytes(uint32_t w)
{
    return (((w & 0x7f7f7f7fu) + 0x7f7f7f7fu) | w) & 0x80808080u;
}

/* The thread's slots j * UNION_THREADS + tid (= q * topk + r) of the group's lim as codes key * 8 + q, invalid ones
 * UNION_INVALID; *lo, *hi: the least and greatest of its valid keys (UNION_INVALID and 0 when none). */
template <int SPT>
static __device__ __forceinline__ void load_codes(uint32_t (&code)[SPT], uint32_t *lo, uint32_t *hi,
                                                  const int32_t *slots, int lim, int topk, uint32_t n_keys)
{
    int q = (int)threadIdx.x / topk, r = (int)threadIdx.x % topk;
    const int step_q = UNION_THREADS / topk, step_r = UNION_THREADS % topk;
    uint32_t least = UNION_INVALID, most = 0;
#pragma unroll
    for (int j = 0; j < SPT; j++) {
        const int i = j * UNION_THREADS + (int)threadIdx.x;
        code[j] = UNION_INVALID;
        if (i < lim) {
            const int32_t key = __ldg(slots + i);
            if ((uint32_t)key < n_keys) { // 0 <= key < n_keys
                code[j] = ((uint32_t)key << 3) | (uint32_t)q;
                least = min(least, (uint32_t)key);
                most = max(most, (uint32_t)key);
            }
        }
        q += step_q, r += step_r;
        if (r >= topk)
            r -= topk, q++;
    }
    *lo = least, *hi = most;
}

/* SPT: slots a thread, so a group's capacity is at most SPT x UNION_THREADS (a power of two, thus at least the
 * sort's n_sorted). map_bytes: the dynamic shared memory, a multiple of 4 and at least 4 n_sorted (the sort's
 * codes). */
template <int SPT, int MIN_BLOCKS>
static __global__ void __launch_bounds__(UNION_THREADS, MIN_BLOCKS)
query_union_kernel(int32_t *union_keys, uint8_t *union_mask, int32_t *union_len, const int32_t *indices, int topk,
                   int group, int64_t n_queries, uint32_t n_keys, int n_sorted, int map_bytes)
{
    extern __shared__ uint32_t smem[]; // the presence map (map_bytes: 4 keys a word, key lo + 4 w + b in byte b)
                                       // or the sort's codes (n_sorted)
    __shared__ uint32_t warp_lo[UNION_WARPS], warp_hi[UNION_WARPS], warp_n[UNION_WARPS];
    __shared__ uint32_t next_lo;
    __shared__ int repeated;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t g = blockIdx.x, t0 = g * group;
    const int cap = group * topk;
    const int64_t rest = (n_queries - t0) * topk; // slots of the group's queries inside the batch
    const int lim = rest < cap ? (int)rest : cap;
    const int32_t *slots = indices + g * cap;      // the group's G top-k rows, one after another
    int32_t *keys_out = union_keys + g * cap;
    uint8_t *mask_out = union_mask + g * cap;

    uint32_t code[SPT], lo, hi;
    load_codes<SPT>(code, &lo, &hi, slots, lim, topk, n_keys);
    lo = __reduce_min_sync(UNION_FULL, lo);
    hi = __reduce_max_sync(UNION_FULL, hi);
    if (lane == 0)
        warp_lo[warp] = lo, warp_hi[warp] = hi;
    if (tid == 0)
        repeated = 0;
    __syncthreads();
    for (int w = 0; w < UNION_WARPS; w++)
        lo = min(lo, warp_lo[w]), hi = max(hi, warp_hi[w]);

    // the map: windows [lo, lo + n) of present keys; lo, hi, n and the outcome are the same in every thread
    int written = 0, sort = 0, slot_order = 0;
    for (int windows = 1; lo <= hi; windows++) { // lo > hi: no valid slot, an empty list
        if (windows > UNION_MAX_WINDOWS) {
            sort = 1;
            break;
        }
        const uint32_t n = min((uint32_t)map_bytes, hi - lo + 1), words = (n + 3) / 4;
        for (uint32_t w = tid; w < words; w += UNION_THREADS)
            smem[w] = 0;
        if (tid == 0)
            next_lo = UNION_INVALID;
        __syncthreads();
        uint32_t beyond = UNION_INVALID; // this thread's least key past the window (invalid slots: above hi)
        int rep = 0;
#pragma unroll
        for (int j = 0; j < SPT; j++) {
            const uint32_t key = code[j] >> 3, off = key - lo; // keys of earlier windows wrap past n
            if (off < n) {
                const uint32_t bit = (1u << (code[j] & 7u)) << (8u * (off & 3u));
                rep |= (atomicOr(&smem[off >> 2], bit) & bit) != 0;
            } else if (key > lo) {
                beyond = min(beyond, key);
            }
        }
        if (rep)
            repeated = 1; // benign race: every writer stores 1
        beyond = __reduce_min_sync(UNION_FULL, beyond);
        if (lane == 0 && beyond <= hi)
            atomicMin(&next_lo, beyond);
        __syncthreads();
        if (repeated) {
            slot_order = 1; // the list from the codes below
            break;
        }
        const uint32_t next = next_lo;
        // warp w compacts words [w0, w1): count its present keys, then write them at the warps' running offset
        const uint32_t seg = (words + 32 * UNION_WARPS - 1) / (32 * UNION_WARPS) * 32;
        const uint32_t w0 = warp * seg, w1 = min(w0 + seg, words);
        uint32_t count = 0;
        for (uint32_t w = w0 + lane; w < w1; w += 32)
            count += __popc(nonzero_bytes(smem[w]));
        count = __reduce_add_sync(UNION_FULL, count);
        if (lane == 0)
            warp_n[warp] = count;
        __syncthreads();
        uint32_t at = 0, total = 0;
        for (int w = 0; w < UNION_WARPS; w++) {
            const uint32_t c = warp_n[w];
            at += w < warp ? c : 0;
            total += c;
        }
        at += (uint32_t)written;
        for (uint32_t w = w0; w < w1; w += 32) { // w0, w1 are the warp's: every lane runs every step
            const uint32_t wi = w + lane, word = wi < w1 ? smem[wi] : 0u, nz = nonzero_bytes(word);
            const uint32_t c = __popc(nz);
            uint32_t incl = c;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const uint32_t v = __shfl_up_sync(UNION_FULL, incl, d);
                if (lane >= d)
                    incl += v;
            }
            uint32_t pos = at + incl - c;
#pragma unroll
            for (int b = 0; b < 4; b++)
                if (nz & (0x80u << (8 * b))) {
                    keys_out[pos] = (int32_t)(lo + 4u * wi + (uint32_t)b);
                    mask_out[pos] = (uint8_t)(word >> (8 * b));
                    pos++;
                }
            at += __shfl_sync(UNION_FULL, incl, 31);
        }
        written += (int)total;
        if (next > hi)
            break;
        lo = next;
        __syncthreads(); // every warp has read the map before the next window clears it
    }

    if (sort) { // after the last window's closing barrier: the map is free
        written = 0;
#pragma unroll
        for (int j = 0; j < SPT; j++)
            if (j * UNION_THREADS + tid < n_sorted)
                smem[j * UNION_THREADS + tid] = code[j];
        __syncthreads();
        uint32_t *codes = smem;
        sort_codes(codes, n_sorted);
        for (int base = 0; base < n_sorted; base += blockDim.x) {
            const int i = base + threadIdx.x;
            const uint32_t c = i < n_sorted ? codes[i] : UNION_INVALID;
            if (c != UNION_INVALID && i > 0 && codes[i - 1] == c)
                repeated = 1; // benign race: every writer stores 1
        }
        __syncthreads();
        if (repeated) { // the slot-order list from the rows again: the codes' registers are not held over the sort
            for (int base = 0; base < lim; base += UNION_THREADS) {
                const int i = base + tid;
                const int32_t key = i < lim ? __ldg(slots + i) : -1;
                const int valid = (uint32_t)key < n_keys;
                int total = 0;
                const int at = written + block_exclusive_count(valid, &total);
                if (valid) {
                    keys_out[at] = key;
                    mask_out[at] = (uint8_t)(1u << (i / topk));
                }
                written += total;
            }
        } else {
            int total = 0;
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
        }
    }

    if (slot_order) { // every valid slot in slot order (j-major, then thread), its own query's bit
        written = 0;
#pragma unroll
        for (int j = 0; j < SPT; j++) {
            if (j * UNION_THREADS >= lim)
                break;
            const int valid = code[j] != UNION_INVALID;
            int total = 0;
            const int at = written + block_exclusive_count(valid, &total);
            if (valid) {
                keys_out[at] = (int32_t)(code[j] >> 3);
                mask_out[at] = (uint8_t)(1u << (code[j] & 7u));
            }
            written += total;
        }
    }
    if (tid == 0)
        union_len[g] = written;
}

extern "C" size_t tilelang_query_union_sorted(int group, int32_t topk)
{
    size_t n = 1;
    while (n < (size_t)group * (size_t)topk)
        n <<= 1;
    return n;
}

/* The kernel of SPT slots a thread; MIN_BLOCKS blocks an SM bound its registers (32, 40, 64 at SPT 8, 16, 32). */
template <int SPT, int MIN_BLOCKS>
static int launch_union(dsarl_dsa_context *ctx, int64_t groups, size_t shared, const int32_t *indices, int32_t topk,
                        int group, int64_t n_queries, int64_t n_keys, int n_sorted, int32_t *union_keys,
                        uint8_t *union_mask, int32_t *union_len, dsarl_error *err)
{
    tlSharedLimit((query_union_kernel<SPT, MIN_BLOCKS>), shared, err);
    query_union_kernel<SPT, MIN_BLOCKS><<<(unsigned int)groups, UNION_THREADS, shared, TL_STREAM(ctx)>>>(
        union_keys, union_mask, union_len, indices, topk, group, n_queries, (uint32_t)n_keys, n_sorted, (int)shared);
    tlCheckLaunch("sparse_mla_backward query union", err);
    return DSARL_OK;
}

extern "C" int tilelang_query_union(dsarl_dsa_context *ctx, const int32_t *indices, int32_t topk, int group,
                                    int64_t n_queries, int64_t n_keys, int32_t *union_keys, uint8_t *union_mask,
                                    int32_t *union_len, dsarl_error *err)
{
    if (group < 1 || group > 8)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa tilelang query union: group = %d must be 1 to 8 queries (a "
                          "key's mask is one byte)", group);
    if (topk < 1 || (int64_t)group * topk > TILELANG_QUERY_UNION_MAX)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa tilelang query union: topk = %d must be positive with group x "
                          "topk at most %d", topk, TILELANG_QUERY_UNION_MAX);
    if (n_keys < 0 || n_keys >= ((int64_t)1 << 29))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa tilelang query union: n_keys = %lld must be in [0, 2^29) (a "
                          "code is key * 8 + query)", (long long)n_keys);
    const int64_t groups = (n_queries + group - 1) / group;
    if (groups <= 0)
        return DSARL_OK;
    const int cap = group * topk;
    const size_t n_sorted = tilelang_query_union_sorted(group, topk);
    const size_t shared = n_sorted * sizeof(uint32_t) > UNION_MAP_MIN ? n_sorted * sizeof(uint32_t) : UNION_MAP_MIN;
    if (cap <= 8 * UNION_THREADS)
        return launch_union<8, 4>(ctx, groups, shared, indices, topk, group, n_queries, n_keys, (int)n_sorted,
                                  union_keys, union_mask, union_len, err);
    if (cap <= 16 * UNION_THREADS)
        return launch_union<16, 3>(ctx, groups, shared, indices, topk, group, n_queries, n_keys, (int)n_sorted,
                                   union_keys, union_mask, union_len, err);
    return launch_union<32, 2>(ctx, groups, shared, indices, topk, group, n_queries, n_keys, (int)n_sorted,
                               union_keys, union_mask, union_len, err);
}
