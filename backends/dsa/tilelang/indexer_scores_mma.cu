/* indexer_scores_mma.cu: lightning-indexer scores of a tile of query rows on the tensor cores.
 *
 *   score(t,s) = sum_j weights[t,j] * relu(q[t,j,:] . k[s,:])   for s in [key_start[t], key_end[t])
 *
 * The product is a GEMM with keys as M and (query, head) pairs as N: a block holds QB consecutive queries x
 * n_heads = 64 columns per warp of q in shared memory and streams the union of their key ranges through shared memory
 * in tiles of 64 keys (cp.async, double-buffered), so every key tile is read once per query tile instead of once per
 * query row. Each of the 8 (or 4) warps computes 64 keys x 64 columns (64 / n_heads queries) with mma.sync m16n8k16
 * (ldmatrix fragments, fp32 accumulators). In that layout a thread holds two heads of each 8-column tile for two key
 * rows, so ReLU, the head weights and the sum over a query's heads are register work plus two shuffles across the
 * 4 lanes that share a key row; the fp32 sum is stored as an order-preserving key. The order of that sum is the
 * same for every key, so identical keys get bit-identical scores (the select's tie rule then sees a true tie). */
#include <stdlib.h>
#include "indexer_fast.cuh"

#define SC_KEYS 64 /* keys per tile: 4 m-tiles of 16 per warp */
#define SC_COLS 64 /* (query, head) columns per warp: 8 n-tiles of 8 */
#define SC_PAD 8   /* bf16 elements of padding per shared row: ldmatrix's 8 row addresses hit distinct banks */

static __device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared without registers; src_bytes 0 writes zeros (rows past the key range).
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes));
}

static __device__ __forceinline__ void cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::);
}

static __device__ __forceinline__ void cp_async_wait_one(void) /* all but the newest group have landed */
{
    asm volatile("cp.async.wait_group 1;\n" ::);
}

static __device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const bf16 *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

// c (16x8 fp32) += a (16x16 bf16, row-major) b (16x8 bf16, col-major).
static __device__ __forceinline__ void mma_bf16_16816(float c[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// One key tile (SC_KEYS rows from key `base`, rows at or past `hi` zero-filled) into shared memory: one group.
static __device__ __forceinline__ void load_key_tile(bf16 *dst, const bf16 *k, int64_t base, int64_t hi,
                                                     int head_dim, int ld)
{
    const int chunks = head_dim / 8; /* 16-byte pieces per key row */
    for (int e = threadIdx.x; e < SC_KEYS * chunks; e += blockDim.x) {
        const int j = e / chunks, c = e % chunks;
        const int64_t row = base + j;
        const bf16 *src = k + (row < hi ? row : base) * head_dim + c * 8;
        cp_async16(dst + j * ld + c * 8, src, row < hi ? 16 : 0);
    }
    cp_async_commit();
}

// Shared bytes: q tile (QB * n_heads = warps * 64 rows) and two key tiles, rows of head_dim + SC_PAD bf16.
static size_t scores_shared_bytes(int warps, int head_dim)
{
    return (size_t)(warps * SC_COLS + 2 * SC_KEYS) * (size_t)(head_dim + SC_PAD) * sizeof(bf16);
}

// WARPS 8: one block of 8 warps per SM (174 KB of shared memory at head_dim 128); WARPS 4: two blocks of 4 per SM
// (104 KB each), whose barriers and epilogues interleave, for twice the key-tile reads.
template <int NH, int WARPS>
static __global__ void __launch_bounds__(WARPS * 32, 8 / WARPS)
    indexer_scores_mma_kernel(uint32_t *ws, int64_t ld_ws, const bf16 *q, const bf16 *k, const float *weights,
                              const int32_t *key_start, const int32_t *key_end, int64_t q_begin, int64_t q_end,
                              int head_dim, int64_t max_keys, int32_t skip_upto)
{
    constexpr int QPW = SC_COLS / NH;       /* queries per warp */
    constexpr int QB = WARPS * QPW;         /* queries per block */
    constexpr int THREADS = WARPS * 32;
    constexpr int NT = SC_COLS / 8;         /* n-tiles per warp */
    constexpr int NT_PER_Q = NH / 8;        /* n-tiles per query */
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ int32_t row_start[QB], row_end[QB]; /* eligible keys of each query; empty when not scored */
    __shared__ int32_t tile_lo, tile_hi;           /* union of the block's ranges */
    const int ld = head_dim + SC_PAD, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    bf16 *q_s = (bf16 *)smem;               // (QB * NH, ld): row r * NH + h is head h of query t0 + r
    bf16 *k_s = q_s + QB * NH * ld;         // 2 x (SC_KEYS, ld)

    // Query tiles in reverse order: in a causal pack the last rows have the longest ranges, so they start first.
    const int64_t n_tiles = (q_end - q_begin + QB - 1) / QB;
    const int64_t t0 = q_begin + (n_tiles - 1 - (int64_t)blockIdx.x) * QB;
    if (tid == 0) {
        tile_lo = INT32_MAX;
        tile_hi = INT32_MIN;
    }
    __syncthreads();
    if (tid < QB) {
        const int64_t t = t0 + tid;
        int32_t s = 0, n = 0;
        if (t < q_end) {
            s = key_start[t];
            n = key_end[t] - s;
            n = n < 0 ? 0 : (n > max_keys ? (int32_t)max_keys : n);
            n = n > skip_upto ? n : 0; /* rows that take all their keys need no scores */
        }
        row_start[tid] = s;
        row_end[tid] = s + n;
        if (n > 0) {
            atomicMin(&tile_lo, s);
            atomicMax(&tile_hi, s + n);
        }
    }
    // q tile, zero rows past q_end
    const int chunks = head_dim / 8;
    for (int e = tid; e < QB * NH * chunks; e += THREADS) {
        const int r = e / chunks, c = e % chunks;
        const int64_t t = t0 + r / NH;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (t < q_end)
            v = reinterpret_cast<const uint4 *>(q + (t * NH + r % NH) * head_dim)[c];
        *reinterpret_cast<uint4 *>(q_s + r * ld + c * 8) = v;
    }
    // head weights of this thread's columns: n-tile ni, columns 2 * (lane % 4) and + 1
    float w[NT][2];
#pragma unroll
    for (int ni = 0; ni < NT; ni++) {
        const int64_t t = t0 + warp * QPW + ni / NT_PER_Q;
        const int h = (ni % NT_PER_Q) * 8 + (lane & 3) * 2;
        w[ni][0] = t < q_end ? weights[t * NH + h] : 0.0f;
        w[ni][1] = t < q_end ? weights[t * NH + h + 1] : 0.0f;
    }
    __syncthreads();
    const int64_t lo = tile_lo, hi = tile_hi;
    if (lo >= hi)
        return; /* no row of this tile needs scores (uniform across the block) */

    // ldmatrix row addresses of this lane: A (keys) 16x16 as 4 8x8 matrices (rows 0-7/8-15 x k 0-7/8-15);
    // B (q) two n-tiles x k 0-7/8-15 per x4.
    const int a_row = lane & 15, a_col = (lane >> 4) * 8;
    const int b_row = ((lane >> 4) & 1) * 8 + (lane & 7), b_col = ((lane >> 3) & 1) * 8;
    const bf16 *q_warp = q_s + (warp * SC_COLS + b_row) * ld + b_col;
    const int g = lane >> 2; /* the accumulator rows of this lane: g and g + 8 of each m-tile */

    load_key_tile(k_s, k, lo, hi, head_dim, ld);
    int buf = 0;
    for (int64_t base = lo; base < hi; base += SC_KEYS, buf ^= 1) {
        if (base + SC_KEYS < hi)
            load_key_tile(k_s + (buf ^ 1) * SC_KEYS * ld, k, base + SC_KEYS, hi, head_dim, ld);
        else
            cp_async_commit(); /* an empty group keeps the wait count uniform */
        cp_async_wait_one();
        __syncthreads();
        const bf16 *kt = k_s + buf * SC_KEYS * ld + a_row * ld + a_col;
        float acc[4][NT][4];
#pragma unroll
        for (int mi = 0; mi < 4; mi++)
#pragma unroll
            for (int ni = 0; ni < NT; ni++)
#pragma unroll
                for (int c = 0; c < 4; c++)
                    acc[mi][ni][c] = 0.0f;
        for (int kk = 0; kk < head_dim; kk += 16) {
            uint32_t a[4][4], b[NT][2];
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
                ldmatrix_x4(a[mi], kt + mi * 16 * ld + kk);
#pragma unroll
            for (int nj = 0; nj < NT; nj += 2) {
                uint32_t r[4];
                ldmatrix_x4(r, q_warp + nj * 8 * ld + kk);
                b[nj][0] = r[0], b[nj][1] = r[1], b[nj + 1][0] = r[2], b[nj + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < NT; ni++)
                    mma_bf16_16816(acc[mi][ni], a[mi], b[ni]);
        }
        // Epilogue: per m-tile, this lane's partial sums for key rows g (half 0) and g + 8 (half 1) of each of the
        // warp's queries, completed across the 4 lanes of the row; lane % 4 then stores value v where v % 4 matches.
#pragma unroll
        for (int mi = 0; mi < 4; mi++) {
            float part[QPW][2];
#pragma unroll
            for (int qq = 0; qq < QPW; qq++)
                part[qq][0] = part[qq][1] = 0.0f;
#pragma unroll
            for (int ni = 0; ni < NT; ni++) {
                const int qq = ni / NT_PER_Q;
                part[qq][0] += fmaxf(acc[mi][ni][0], 0.0f) * w[ni][0] + fmaxf(acc[mi][ni][1], 0.0f) * w[ni][1];
                part[qq][1] += fmaxf(acc[mi][ni][2], 0.0f) * w[ni][0] + fmaxf(acc[mi][ni][3], 0.0f) * w[ni][1];
            }
#pragma unroll
            for (int qq = 0; qq < QPW; qq++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    part[qq][h] += __shfl_xor_sync(0xffffffffu, part[qq][h], 1);
                    part[qq][h] += __shfl_xor_sync(0xffffffffu, part[qq][h], 2);
                }
#pragma unroll
            for (int v = 0; v < 2 * QPW; v++) {
                if ((v & 3) != (lane & 3))
                    continue;
                const int qq = v >> 1, half = v & 1, r = warp * QPW + qq;
                const int64_t s = base + mi * 16 + g + half * 8;
                if (s >= row_start[r] && s < row_end[r])
                    ws[(t0 + r - q_begin) * ld_ws + (s - row_start[r])] = indexer_order_key(part[qq][half]);
            }
        }
        __syncthreads(); /* the next iteration's load overwrites this buffer */
    }
}

int tilelang_indexer_scores_mma_fits(const dsarl_dsa_indexer_inputs *in)
{
    const int nh = in->n_heads;
    return (nh == 8 || nh == 16 || nh == 32 || nh == 64) && in->head_dim % 16 == 0 &&
           scores_shared_bytes(8, in->head_dim) <= TL_MAX_SHARED && (uintptr_t)in->q % 16 == 0 &&
           (uintptr_t)in->k % 16 == 0;
}

template <int NH, int WARPS>
static int launch_scores(cudaStream_t stream, const dsarl_dsa_batch *batch, const dsarl_dsa_indexer_inputs *in,
                         int64_t q_begin, int64_t q_end, uint32_t *ws, int64_t ld_ws, int64_t max_keys,
                         int32_t skip_upto, dsarl_error *err)
{
    const int qb = WARPS * (SC_COLS / NH);
    const size_t shared = scores_shared_bytes(WARPS, in->head_dim);
    tlSharedLimit((indexer_scores_mma_kernel<NH, WARPS>), shared, err);
    const int64_t tiles = (q_end - q_begin + qb - 1) / qb;
    indexer_scores_mma_kernel<NH, WARPS><<<(unsigned int)tiles, WARPS * 32, shared, stream>>>(
        ws, ld_ws, (const bf16 *)in->q, (const bf16 *)in->k, in->weights, batch->key_start, batch->key_end, q_begin,
        q_end, in->head_dim, max_keys, skip_upto);
    tlCheckLaunch("indexer scores (mma)", err);
    return DSARL_OK;
}

int tilelang_indexer_scores_mma(const dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                const dsarl_dsa_indexer_inputs *in, int64_t q_begin, int64_t q_end, uint32_t *ws,
                                int64_t ld_ws, int64_t max_keys, int32_t skip_upto, dsarl_error *err)
{
    if (q_end <= q_begin)
        return DSARL_OK;
    const int four = ctx->settings.score_warps == 4; /* runtime.tilelang_score_warps: timing comparisons */
    cudaStream_t st = TL_STREAM(ctx);
    switch (in->n_heads) {
    case 8:
        return four ? launch_scores<8, 4>(st, batch, in, q_begin, q_end, ws, ld_ws, max_keys, skip_upto, err)
                    : launch_scores<8, 8>(st, batch, in, q_begin, q_end, ws, ld_ws, max_keys, skip_upto, err);
    case 16:
        return four ? launch_scores<16, 4>(st, batch, in, q_begin, q_end, ws, ld_ws, max_keys, skip_upto, err)
                    : launch_scores<16, 8>(st, batch, in, q_begin, q_end, ws, ld_ws, max_keys, skip_upto, err);
    case 32:
        return four ? launch_scores<32, 4>(st, batch, in, q_begin, q_end, ws, ld_ws, max_keys, skip_upto, err)
                    : launch_scores<32, 8>(st, batch, in, q_begin, q_end, ws, ld_ws, max_keys, skip_upto, err);
    case 64:
        return four ? launch_scores<64, 4>(st, batch, in, q_begin, q_end, ws, ld_ws, max_keys, skip_upto, err)
                    : launch_scores<64, 8>(st, batch, in, q_begin, q_end, ws, ld_ws, max_keys, skip_upto, err);
    default:
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "dsa tilelang indexer scores: n_heads = %d must be 8, 16, 32 or "
                          "64 for the tensor-core kernel", in->n_heads);
    }
}
