/* indexer_topk.cu: lightning-indexer scores + causal top-k, and the choice between its two implementations.
 *
 *   I(t,s) = sum_j weights[t,j] * relu(q[t,j,:] . k[s,:])   for s in [key_start[t], key_end[t])
 *
 * bf16 storage with 8/16/32/64 heads and 16-multiple head dims takes the two-kernel path of indexer_fast.cuh: query
 * tiles scored on the tensor cores (mma.sync) into a workspace of order-preserving keys, then one select block per
 * row; the query rows go in chunks so the workspace stays under INDEXER_WS_BUDGET. Everything else (float32 storage,
 * other shapes, DSARL_TILELANG_NO_WMMA or DSARL_TILELANG_INDEXER_ROWWISE set) runs the fused row-wise kernel below.
 *
 * Row-wise kernel: one block per query row (persistent grid). Keys come through shared memory in tiles of 64 rows:
 * with bf16 storage and 16-multiple dims the tile's q.k products run on the tensor cores (WMMA, fp32 accumulation),
 * otherwise each thread scores one (key, group of 4 heads) pair from fp32 copies (q transposed so 4 heads are one
 * 16-byte load). Scores go to the block's own workspace row (max_keys_per_query values: only gridDim rows exist,
 * never a Tq x Tk matrix). Scores are mapped to order-preserving 32-bit keys; a 4-pass radix
 * select (8 bits per pass) finds the exact k-th best key value; every key above it is taken, and among those equal
 * to it the lowest key indices (an ordered block-wide count). The chosen keys are bitonic-sorted in shared memory
 * into descending score order, ties to the lower index, as the reference writes them; -1 / -inf fill the rest. */
#include <math.h>
#include <stdlib.h>
#include <mma.h>
#include "indexer_fast.cuh"

#define TOPK_THREADS 512
#define TOPK_MAX 8192 /* sort buffer of 2 x 8192 x 4 bytes in shared memory */
#define INDEXER_WS_BUDGET ((int64_t)256 << 20) /* bytes of scores per chunk of query rows (8K x 8K causal: 1 chunk) */

// Float -> unsigned key with the same order (larger float, larger key).
static __device__ __forceinline__ uint32_t order_key(float f)
{
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static __device__ __forceinline__ float key_value(uint32_t k)
{
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Weighted-ReLU score of key row kr against one group of `hpt` heads (qT is (head_dim, n_heads), so the group's
// query values at one column are adjacent: one 16-byte broadcast load for 4 heads).
template <int HPT>
static __device__ __forceinline__ float group_score(const float *qT, const float *w, const float *kr, int n_heads,
                                                   int head_dim, int g)
{
    float acc[HPT];
    for (int i = 0; i < HPT; i++)
        acc[i] = 0.0f;
    for (int c = 0; c < head_dim; c++) {
        const float kv = kr[c];
        if (HPT == 4) {
            const float4 qv = reinterpret_cast<const float4 *>(qT + (int64_t)c * n_heads)[g];
            acc[0] += qv.x * kv;
            acc[1] += qv.y * kv;
            acc[2] += qv.z * kv;
            acc[3] += qv.w * kv;
        } else {
            acc[0] += qT[(int64_t)c * n_heads + g] * kv;
        }
    }
    float s = 0.0f;
    for (int i = 0; i < HPT; i++)
        s += acc[i] > 0.0f ? w[g * HPT + i] * acc[i] : 0.0f;
    return s;
}

#define TC_KEYS 64

// Shared bytes of the tensor-core scoring region: q (n_heads, head_dim + 8) and a key tile (64, head_dim + 8) in
// bf16, the tile's raw q.k (n_heads, 68) in fp32.
static size_t tc_shared_bytes(int n_heads, int head_dim)
{
    return (size_t)n_heads * (head_dim + 8) * 2 + (size_t)TC_KEYS * (head_dim + 8) * 2 +
           (size_t)n_heads * (TC_KEYS + 4) * 4;
}

// Tensor-core scores of keys [0, n) of one row (bf16 storage, n_heads and head_dim multiples of 16): per tile of
// 64 keys, Q (n_heads x head_dim) K^T on WMMA 16x16x16 fragments into fp32, then each key's weighted ReLU sum
// over heads. The float32-storage instantiation is never launched (the host only picks this path for bf16).
static __device__ void score_row_tc(const float *, const float *, const float *, int, int, int, uint32_t *,
                                    unsigned char *)
{
}

static __device__ void score_row_tc(const bf16 *q_t, const bf16 *k_rows, const float *w_s, int n, int n_heads,
                                    int head_dim, uint32_t *row_keys, unsigned char *region)
{
    using namespace nvcuda;
    const int ld = head_dim + 8, lds = TC_KEYS + 4, chunks = head_dim / 8;
    const int tid = threadIdx.x, warp = tid >> 5, n_warps = blockDim.x >> 5;
    bf16 *q_b = (bf16 *)region, *k_b = q_b + n_heads * ld;
    float *s_f = (float *)(k_b + TC_KEYS * ld);
    __syncthreads();
    for (int e = tid; e < n_heads * chunks; e += blockDim.x)
        reinterpret_cast<uint4 *>(q_b + (e / chunks) * ld)[e % chunks] =
            reinterpret_cast<const uint4 *>(q_t + (e / chunks) * head_dim)[e % chunks];
    for (int base = 0; base < n; base += TC_KEYS) {
        const int rows = min(TC_KEYS, n - base);
        __syncthreads();
        for (int e = tid; e < TC_KEYS * chunks; e += blockDim.x) {
            int j = e / chunks, c = e % chunks;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (j < rows)
                v = reinterpret_cast<const uint4 *>(k_rows + (int64_t)(base + j) * head_dim)[c];
            reinterpret_cast<uint4 *>(k_b + j * ld)[c] = v;
        }
        __syncthreads();
        for (int blk = warp; blk < (n_heads / 16) * (TC_KEYS / 16); blk += n_warps) {
            const int hb = blk / (TC_KEYS / 16), jb = blk % (TC_KEYS / 16);
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int kk = 0; kk < head_dim; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
                wmma::load_matrix_sync(a, q_b + hb * 16 * ld + kk, ld);
                wmma::load_matrix_sync(b, k_b + jb * 16 * ld + kk, ld);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(s_f + hb * 16 * lds + jb * 16, acc, lds, wmma::mem_row_major);
        }
        __syncthreads();
        for (int j = tid; j < rows; j += blockDim.x) {
            float score = 0.0f;
            for (int h = 0; h < n_heads; h++) {
                float dot = s_f[h * lds + j];
                score += dot > 0.0f ? w_s[h] * dot : 0.0f;
            }
            row_keys[base + j] = order_key(score);
        }
    }
}

// Dynamic shared memory (floats unless noted): qT (head_dim, n_heads) | w (n_heads) | key tile (kt, head_dim + 1)
// | partial scores (n_heads / hpt, kt) | sort_key (P) u32 | sort_idx (P) i32.
static size_t topk_shared_bytes(int n_heads, int head_dim, int kt, int hpt, int sort_size)
{
    return ((size_t)head_dim * n_heads + n_heads + (size_t)kt * (head_dim + 1) + (size_t)(n_heads / hpt) * kt) *
               sizeof(float) + (size_t)sort_size * 8;
}

// CUDA-core scores of keys [start, start + n): one tile of kt keys at a time is staged in shared memory, each
// thread scores one (key, head group) pair with consecutive threads on consecutive keys, then the groups are summed.
template <typename Storage>
static __device__ void score_row_cuda_cores(const float *qT, const float *w_s, float *k_s, float *partial,
                                            const Storage *k, int32_t start, int n, int n_heads, int head_dim,
                                            int kt, int hpt, uint32_t *row_keys)
{
    const int tid = threadIdx.x, ldk = head_dim + 1, groups = n_heads / hpt;
    for (int base = 0; base < n; base += kt) {
        const int rows = min(kt, n - base);
        __syncthreads();
        for (int e = tid; e < rows * head_dim; e += blockDim.x) {
            int j = e / head_dim, c = e % head_dim;
            k_s[j * ldk + c] = ldf(k + (int64_t)(start + base + j) * head_dim + c);
        }
        __syncthreads();
        for (int p = tid; p < groups * rows; p += blockDim.x) {
            int j = p % rows, g = p / rows;
            partial[g * kt + j] = hpt == 4 ? group_score<4>(qT, w_s, k_s + j * ldk, n_heads, head_dim, g)
                                           : group_score<1>(qT, w_s, k_s + j * ldk, n_heads, head_dim, g);
        }
        __syncthreads();
        for (int j = tid; j < rows; j += blockDim.x) {
            float score = 0.0f;
            for (int g = 0; g < groups; g++)
                score += partial[g * kt + j];
            row_keys[base + j] = order_key(score);
        }
    }
}

template <typename Storage>
static __global__ void indexer_topk_kernel(int32_t *indices, float *scores, const Storage *q, const Storage *k,
                                           const float *weights, const int32_t *key_start, const int32_t *key_end,
                                           int64_t Tq, int n_heads, int head_dim, int topk, int sort_size, int kt,
                                           int hpt, int tc, size_t tc_offset, uint32_t *workspace,
                                           int64_t max_keys)
{
    extern __shared__ __align__(16) float shared[];
    const int ldk = head_dim + 1, groups = n_heads / hpt; /* key rows padded by a word: no bank conflicts */
    float *qT = shared, *w_s = qT + head_dim * n_heads, *k_s = w_s + n_heads, *partial = k_s + kt * ldk;
    uint32_t *sort_key = (uint32_t *)(partial + groups * kt);
    int32_t *sort_idx = (int32_t *)(sort_key + sort_size);
    __shared__ int hist[256];
    __shared__ uint32_t prefix, prefix_mask;
    __shared__ int remaining, n_above;
    uint32_t *row_keys = workspace + (int64_t)blockIdx.x * max_keys;
    const int tid = threadIdx.x;

    for (int64_t t = blockIdx.x; t < Tq; t += gridDim.x) {
        const int32_t start = key_start[t];
        int n = key_end[t] - start;
        n = n < 0 ? 0 : (n > max_keys ? (int)max_keys : n); /* the workspace row holds max_keys_per_query */
        const int kk = n < topk ? n : topk;
        for (int i = tid; i < n_heads * head_dim; i += blockDim.x) /* transposed: (head_dim, n_heads) */
            qT[(i % head_dim) * n_heads + i / head_dim] = ldf(q + t * n_heads * head_dim + i);
        for (int i = tid; i < n_heads; i += blockDim.x)
            w_s[i] = weights[t * n_heads + i];
        if (tc)
            score_row_tc(q + t * n_heads * head_dim, k + (int64_t)start * head_dim, w_s, n, n_heads, head_dim,
                         row_keys, (unsigned char *)shared + tc_offset);
        else
            score_row_cuda_cores(qT, w_s, k_s, partial, k, start, n, n_heads, head_dim, kt, hpt, row_keys);
        __syncthreads();
        if (tid == 0) {
            prefix = 0;
            prefix_mask = 0;
            remaining = kk;
        }
        __syncthreads();
        // Radix select: after the 4 passes, prefix is the kk-th largest key and remaining how many keys equal to
        // it belong to the top kk.
        for (int shift = 24; shift >= 0 && kk > 0; shift -= 8) {
            for (int b = tid; b < 256; b += blockDim.x)
                hist[b] = 0;
            __syncthreads();
            for (int i = tid; i < n; i += blockDim.x) {
                uint32_t key = row_keys[i];
                if ((key & prefix_mask) == prefix)
                    atomicAdd(&hist[(key >> shift) & 255u], 1);
            }
            __syncthreads();
            if (tid == 0) {
                int need = remaining, b = 255;
                for (; b > 0 && hist[b] < need; b--)
                    need -= hist[b];
                remaining = need;
                prefix |= (uint32_t)b << shift;
                prefix_mask |= 255u << shift;
            }
            __syncthreads();
        }
        const uint32_t kth = prefix;
        const int equal_wanted = remaining;
        // Collect: every key above the threshold (any order, sorted below), then the first equal_wanted keys equal
        // to it in index order.
        if (tid == 0)
            n_above = 0;
        __syncthreads();
        for (int i = tid; i < n && kk > 0; i += blockDim.x)
            if (row_keys[i] > kth) {
                int slot = atomicAdd(&n_above, 1);
                sort_key[slot] = row_keys[i];
                sort_idx[slot] = start + i;
            }
        __syncthreads();
        const int above = n_above;
        int taken = 0;
        for (int base = 0; base < n && taken < equal_wanted; base += blockDim.x) {
            int i = base + tid, total = 0;
            int equal = i < n && row_keys[i] == kth;
            int rank = taken + block_exclusive_count(equal, &total);
            if (equal && rank < equal_wanted) {
                sort_key[above + rank] = kth;
                sort_idx[above + rank] = start + i;
            }
            taken += total;
        }
        indexer_sort_chosen(sort_key, sort_idx, kk, sort_size, tid, blockDim.x);
        for (int i = tid; i < topk; i += blockDim.x) {
            indices[t * topk + i] = i < kk ? sort_idx[i] : -1;
            if (scores)
                scores[t * topk + i] = i < kk ? key_value(sort_key[i]) : -INFINITY;
        }
        __syncthreads();
    }
}

// Scores kernel then select kernel per chunk of query rows; the workspace row of query t holds its eligible keys'
// scores from column 0 (key_start[t]), rows padded to a multiple of 4 keys for the select's 16-byte loads.
static int indexer_topk_two_pass(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                 const dsarl_dsa_indexer_inputs *in, int32_t topk, int32_t *indices, float *scores,
                                 dsarl_error *err)
{
    const int64_t Tq = batch->n_queries;
    const int64_t max_keys = batch->max_keys_per_query > 0 ? batch->max_keys_per_query : 1;
    const int64_t ld_ws = (max_keys + 3) / 4 * 4;
    int64_t rows = INDEXER_WS_BUDGET / (ld_ws * (int64_t)sizeof(uint32_t)) / 64 * 64;
    if (ctx->settings.indexer_chunk > 0) /* tests: force several chunks */
        rows = ctx->settings.indexer_chunk;
    rows = rows < 64 ? 64 : (rows > Tq ? Tq : rows);
    void *ws;
    DSARL_TRY(tilelang_workspace(ctx, (size_t)(rows * ld_ws) * sizeof(uint32_t), &ws, err));
    for (int64_t begin = 0; begin < Tq; begin += rows) {
        const int64_t end = begin + rows < Tq ? begin + rows : Tq;
        DSARL_TRY(tilelang_indexer_scores_mma(ctx, batch, in, begin, end, (uint32_t *)ws, ld_ws, max_keys,
                                              scores ? 0 : topk, err));
        DSARL_TRY(tilelang_indexer_select(ctx, batch, begin, end, (const uint32_t *)ws, ld_ws, max_keys, topk, indices,
                                          scores, err));
    }
    return DSARL_OK;
}

int tilelang_indexer_topk(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, const dsarl_dsa_indexer_inputs *in,
                          int32_t topk, int32_t *indices, float *scores, dsarl_error *err)
{
    DSARL_TRY(tilelang_check_batch("indexer_topk", batch, err));
    DSARL_TRY(tilelang_check_indexer("indexer_topk", in, err));
    if (topk <= 0 || topk > TOPK_MAX || (batch->n_queries > 0 && !indices))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa tilelang indexer_topk: topk = %d must be in [1, %d] and "
                          "indices (Tq, topk) set", topk, TOPK_MAX);
    if (batch->n_queries == 0)
        return DSARL_OK;
    if (!ctx->f32 && ctx->settings.indexer == TILELANG_INDEXER_AUTO &&
        tilelang_indexer_scores_mma_fits(in))
        return indexer_topk_two_pass(ctx, batch, in, topk, indices, scores, err);
    int sort_size = 1;
    while (sort_size < topk)
        sort_size <<= 1;
    const int hpt = in->n_heads % 4 == 0 ? 4 : 1;
    int kt = 64;
    while (kt > 8 && topk_shared_bytes(in->n_heads, in->head_dim, kt, hpt, sort_size) > TL_MAX_SHARED)
        kt /= 2;
    size_t shared = topk_shared_bytes(in->n_heads, in->head_dim, kt, hpt, sort_size);
    // Tensor cores for the scores when the storage is bf16, the dims are 16-multiples and rows 16-byte aligned.
    const size_t tc_offset = (shared + 127) / 128 * 128;
    const int tc = !ctx->f32 && in->n_heads % 16 == 0 && in->head_dim % 16 == 0 && (uintptr_t)in->q % 16 == 0 &&
                   (uintptr_t)in->k % 16 == 0 && tc_offset + tc_shared_bytes(in->n_heads, in->head_dim) <=
                   TL_MAX_SHARED && ctx->settings.indexer != TILELANG_INDEXER_CUDA_CORE;
    if (tc)
        shared = tc_offset + tc_shared_bytes(in->n_heads, in->head_dim);
    if (shared > TL_MAX_SHARED)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "dsa tilelang indexer_topk: n_heads %d x head_dim %d with topk "
                          "%d needs %zu bytes of shared memory, more than %d", in->n_heads, in->head_dim, topk,
                          shared, TL_MAX_SHARED);
    int64_t blocks = batch->n_queries < 2 * ctx->sm_count ? batch->n_queries : 2 * ctx->sm_count;
    int64_t max_keys = batch->max_keys_per_query > 0 ? batch->max_keys_per_query : 1;
    void *ws;
    DSARL_TRY(tilelang_workspace(ctx, (size_t)blocks * (size_t)max_keys * sizeof(uint32_t), &ws, err));
    tlSharedLimitT(indexer_topk_kernel, shared, err);
    TL_LAUNCH(ctx->f32, ctx->stream, indexer_topk_kernel, (unsigned int)blocks, TOPK_THREADS, shared, 
        indices, scores, (const S *)in->q, (const S *)in->k, in->weights, batch->key_start, batch->key_end,
        batch->n_queries, in->n_heads, in->head_dim, topk, sort_size, kt, hpt, tc, tc_offset, (uint32_t *)ws,
        max_keys);
    tlCheckLaunch("indexer_topk", err);
    return DSARL_OK;
}
