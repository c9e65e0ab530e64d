/* cuda_gemm_grouped.cu: gemm_grouped (a MoE layer's expert products) as one Hopper (sm_90a) wgmma kernel over all
 * groups, for bf16 storage, so a layer's products cost one launch and no per-expert cuBLASLt plans on the host.
 *
 * The three products of the slot (dsarl/ops/device.h), row-major:
 *   rows, B transposed (forward):         C rows of g (r_g, n) = alpha A rows of g (r_g, k) B_g^T, B_g (n, k)
 *   rows (input gradient):                C rows of g (r_g, n) = alpha A rows of g (r_g, k) B_g,   B_g (k, n)
 *   inner (weight gradient):              C_g (m, n) = alpha (A rows of g)^T (m, r_g) (B rows of g) (r_g, n)
 * each + beta C. One 256-thread block (two warpgroups) per 128 x 128 tile of one group's C: the host lays the
 * groups' tiles end to end (a group's tiles adjacent, so its weights stay in L2) and passes the table by value,
 * so nothing is uploaded. Per 64-deep slice of K, both operand tiles are copied with cp.async into one of three
 * shared-memory stages (the 128B-swizzled 64-row blocks of cuda_wgmma.cuh: K-major tiles keep a row per M or N
 * index, M-/N-major ones a row per K index), two slices ahead of the products; each warpgroup multiplies its 64 rows
 * with four wgmma m64n128k16 and leaves them in flight while the previous slice's retire and the next copy starts. Rows past a group's end and columns past n are zero-filled and never stored. Two
 * blocks fit an SM (96 KiB of stages each), so one block's copies and epilogue run under the other's products.
 * fp32 accumulation; the result rounds once to bf16. It serves n and the reduced dim in multiples of 64 (the
 * MoE dims), at most CUDA_GROUPED_MAX_GROUPS groups; anything else goes to the cuBLASLt lanes (cuda_gemm.cu). */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "cuda_common.cuh"
#include "cuda_wgmma.cuh"

#define GG_TILE 128                   /* output tile: M and N */
#define GG_DEPTH 64                   /* K per stage */
#define GG_STAGES 3
#define GG_THREADS 256
#define GG_BLOCK 8192                 /* one 64-row x 128-byte swizzled block */
#define GG_STAGE_BYTES (4 * GG_BLOCK) /* A tile (2 blocks) + B tile (2 blocks) */
#define GG_SHARED (GG_STAGES * GG_STAGE_BYTES + 1024)

enum { GG_ROWS_BT = 0, GG_ROWS_B = 1, GG_INNER = 2 };

typedef struct grouped_table {
    int32_t first[CUDA_GROUPED_MAX_GROUPS + 1];      /* rows of group g: first[g] .. first[g + 1] */
    int32_t tile_first[CUDA_GROUPED_MAX_GROUPS + 1]; /* blocks of group g: tile_first[g] .. tile_first[g + 1] */
    int32_t groups;
} grouped_table;

#ifdef CUDA_WGMMA_CODE
/* 16-byte chunk `chunk` (0..7) of row `row` (0..63) of a swizzled block */
static __device__ __forceinline__ uint32_t swizzled(int row, int chunk)
{
    return (uint32_t)(row * 128 + ((chunk ^ (row & 7)) << 4));
}

/* A K-major tile of 128 rows x 64 (rows row0.. of a (., ld) matrix, columns col0..): rows past `rows` zero. */
static __device__ __forceinline__ void load_k_major(uint32_t dst, const bf16 *src, int64_t row0, int rows, int64_t ld,
                                                    int64_t col0, int u)
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int idx = u + GG_THREADS * i, row = idx >> 3, chunk = idx & 7;
        const bool ok = row < rows;
        const bf16 *p = ok ? src + (row0 + row) * ld + col0 + chunk * 8 : src;
        cp_async16(dst + (row >> 6) * GG_BLOCK + swizzled(row & 63, chunk), p, ok ? 16 : 0);
    }
}

/* An M-/N-major tile of 64 K-rows x 128 (rows row0.. of a (., ld) matrix, columns col0.. in two 64-wide blocks):
 * K-rows past `rows` and blocks past `cols` zero. */
static __device__ __forceinline__ void load_mn_major(uint32_t dst, const bf16 *src, int64_t row0, int rows,
                                                     int64_t ld, int64_t col0, int64_t cols, int u)
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int idx = u + GG_THREADS * i, row = idx >> 4, blk = (idx >> 3) & 1, chunk = idx & 7;
        const bool ok = row < rows && col0 + blk * 64 < cols;
        const bf16 *p = ok ? src + (row0 + row) * ld + col0 + blk * 64 + chunk * 8 : src;
        cp_async16(dst + blk * GG_BLOCK + swizzled(row, chunk), p, ok ? 16 : 0);
    }
}
#endif

template <int MODE>
static __global__ void __launch_bounds__(GG_THREADS, 2)
grouped_gemm_kernel(const grouped_table tab, int64_t m, int64_t n, int64_t k, float alpha, const bf16 *a,
                    const bf16 *b, int64_t stride_b, float beta, bf16 *c, int64_t stride_c)
{
#ifdef CUDA_WGMMA_CODE
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t base = (raw + 1023u) & ~1023u;
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;

    int lo = 0, hi = tab.groups - 1; // the group whose tiles hold this block
    const int block = (int)blockIdx.x;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (tab.tile_first[mid] <= block)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int g = lo, tile = block - tab.tile_first[g];
    const int64_t r0 = tab.first[g], rg = tab.first[g + 1] - r0;
    const int tiles_n = (int)((n + GG_TILE - 1) / GG_TILE);
    const int64_t tm = (int64_t)(tile / tiles_n) * GG_TILE, tn = (int64_t)(tile % tiles_n) * GG_TILE;
    const int64_t depth = MODE == GG_INNER ? rg : k;
    const int slices = (int)((depth + GG_DEPTH - 1) / GG_DEPTH);

    auto load = [&](int stage, int s) {
        const uint32_t sa = base + stage * GG_STAGE_BYTES, sb = sa + 2 * GG_BLOCK;
        const int64_t kd = (int64_t)s * GG_DEPTH;
        if (MODE == GG_INNER) {
            const int rows = (int)(rg - kd < GG_DEPTH ? rg - kd : GG_DEPTH);
            load_mn_major(sa, a, r0 + kd, rows, m, tm, m, tid);
            load_mn_major(sb, b, r0 + kd, rows, n, tn, n, tid);
        } else {
            const int rows = (int)(rg - tm < GG_TILE ? rg - tm : GG_TILE);
            load_k_major(sa, a, r0 + tm, rows, k, kd, tid);
            if (MODE == GG_ROWS_BT)
                load_k_major(sb, b + g * stride_b, tn, (int)(n - tn < GG_TILE ? n - tn : GG_TILE), k, kd, tid);
            else
                load_mn_major(sb, b + g * stride_b, kd, GG_DEPTH, n, tn, n, tid);
        }
    };

    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++)
        acc[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < GG_STAGES - 1; s++) {
        if (s < slices)
            load(s, s);
        cp_async_commit();
    }
    for (int s = 0; s < slices; s++) {
        cp_async_wait<GG_STAGES - 2>(); // slice s has landed (this thread's copies) ...
        fence_proxy_async();
        __syncthreads(); // ... everyone's
        const uint32_t sa = base + (s % GG_STAGES) * GG_STAGE_BYTES, sb = sa + 2 * GG_BLOCK;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < GG_DEPTH / 16; kk++) {
            if (MODE == GG_INNER) // A M-major: this warpgroup's 64-wide M block, 16 K-rows per step
                wgmma_m64n128k16_bf16<1, 1>(acc, smem_desc(sa + wg * GG_BLOCK + kk * 2048, GG_BLOCK, 1024),
                                            smem_desc(sb + kk * 2048, GG_BLOCK, 1024), 1);
            else if (MODE == GG_ROWS_BT) // A and B K-major: 32 bytes per step along the row
                wgmma_m64n128k16_bf16<0, 0>(acc, smem_desc(sa + wg * GG_BLOCK + kk * 32, 16, 1024),
                                            smem_desc(sb + kk * 32, 16, 1024), 1);
            else
                wgmma_m64n128k16_bf16<0, 1>(acc, smem_desc(sa + wg * GG_BLOCK + kk * 32, 16, 1024),
                                            smem_desc(sb + kk * 2048, GG_BLOCK, 1024), 1);
        }
        wgmma_commit();
        // slice s's products stay in flight while slice s - 1's retire and slice s + 2 is copied into its stage
        wgmma_wait<1>();
        __syncthreads(); // both warpgroups are done with slice s - 1's stage
        if (s + GG_STAGES - 1 < slices)
            load((s + GG_STAGES - 1) % GG_STAGES, s + GG_STAGES - 1);
        cp_async_commit();
    }
    wgmma_wait<0>();
    fence_regs(acc);

    // acc[4 j + {0,1 | 2,3}] = C[row0 | row0 + 8][8 j + cq + {0,1}] of this warpgroup's 64 rows
    const int row0 = wg * 64 + warp * 16 + (lane >> 2), cq = 2 * (lane & 3);
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int64_t row = tm + row0 + 8 * half;
        if (row >= (MODE == GG_INNER ? m : rg))
            continue;
        bf16 *out = MODE == GG_INNER ? c + g * stride_c + row * n : c + (r0 + row) * n;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int64_t col = tn + 8 * j + cq;
            if (col >= n)
                continue;
            float v0 = alpha * acc[4 * j + 2 * half], v1 = alpha * acc[4 * j + 2 * half + 1];
            if (beta != 0.0f) {
                const float2 old = __bfloat1622float2(*(const __nv_bfloat162 *)(out + col));
                v0 += beta * old.x, v1 += beta * old.y;
            }
            *(__nv_bfloat162 *)(out + col) = __floats2bfloat162_rn(v0, v1);
        }
    }
#else
    __trap();
#endif
}

/* runtime.cuda_grouped_gemm=auto: the products this kernel ran faster than the cuBLASLt lanes on the H200 at the
 * bench config's MoE shapes (docs/performance.md): the forward's (B transposed) and the input gradient's at
 * k >= 2048; the weight gradients and shallower input gradients stay on the lanes. */
static bool auto_takes(bool inner_grouped, bool trans_b, int64_t k)
{
    return !inner_grouped && (trans_b || k >= 2048);
}

int cuda_gemm_grouped_wgmma(dsarl_device *dev, bool inner_grouped, bool trans_b, int64_t groups, const int64_t *first,
                            int64_t m, int64_t n, int64_t k, float alpha, const void *a, const void *b,
                            int64_t stride_b, float beta, void *c, int64_t stride_c, int *used, dsarl_error *err)
{
    *used = 0;
    const int64_t reduced = inner_grouped ? m : k; // the dim tiles cut in 64s besides n
    if (dev->grouped_wgmma == 1 && !auto_takes(inner_grouped, trans_b, k))
        return DSARL_OK;
    if (dev->f32 || !dev->sm90 || !dev->grouped_wgmma || groups <= 0 || groups > CUDA_GROUPED_MAX_GROUPS ||
        n <= 0 || n % 64 || reduced <= 0 || reduced % 64 || first[groups] > INT32_MAX || !isfinite(alpha) ||
        !isfinite(beta) || ((uintptr_t)a % 16) || ((uintptr_t)b % 16) || ((uintptr_t)c % 16) || stride_b % 8 ||
        stride_c % 8)
        return DSARL_OK;
    grouped_table tab;
    memset(&tab, 0, sizeof tab);
    const int64_t tiles_n = (n + GG_TILE - 1) / GG_TILE;
    int64_t tiles = 0;
    for (int64_t g = 0; g < groups; g++) {
        const int64_t rows = first[g + 1] - first[g];
        tab.first[g] = (int32_t)first[g];
        tab.tile_first[g] = (int32_t)tiles;
        if (inner_grouped)
            tiles += rows > 0 || beta != 1.0f ? ((m + GG_TILE - 1) / GG_TILE) * tiles_n : 0;
        else
            tiles += ((rows + GG_TILE - 1) / GG_TILE) * tiles_n;
        if (tiles > INT32_MAX)
            return DSARL_OK;
    }
    tab.first[groups] = (int32_t)first[groups];
    tab.tile_first[groups] = (int32_t)tiles;
    tab.groups = (int32_t)groups;
    *used = 1;
    if (tiles == 0)
        return DSARL_OK;
    const int mode = inner_grouped ? GG_INNER : trans_b ? GG_ROWS_BT : GG_ROWS_B;
    cudaStream_t stream = CUDA_STREAM(dev);
#define GG_LAUNCH(MODE_)                                                                                            \
    do {                                                                                                            \
        cudaCheck(cudaFuncSetAttribute(grouped_gemm_kernel<MODE_>, cudaFuncAttributeMaxDynamicSharedMemorySize,     \
                                       GG_SHARED), err);                                                            \
        grouped_gemm_kernel<MODE_><<<(unsigned int)tiles, GG_THREADS, GG_SHARED, stream>>>(                        \
            tab, m, n, k, alpha, (const bf16 *)a, (const bf16 *)b, stride_b, beta, (bf16 *)c, stride_c);            \
    } while (0)
    if (mode == GG_INNER)
        GG_LAUNCH(GG_INNER);
    else if (mode == GG_ROWS_BT)
        GG_LAUNCH(GG_ROWS_BT);
    else
        GG_LAUNCH(GG_ROWS_B);
#undef GG_LAUNCH
    cudaCheckLaunch("gemm_grouped (wgmma)", err);
    return DSARL_OK;
}
