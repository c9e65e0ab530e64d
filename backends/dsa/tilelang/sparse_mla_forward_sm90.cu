/* sparse_mla_forward_sm90.cu: the Hopper (sm_90a) path of the sparse MLA forward for bf16 storage at GLM-5 dims
 * (d_qk = 576 = kv_lora 512 + rope 64, d_v = 512, heads in groups of 64): same function as sparse_mla_forward.cu
 * (see there), on wgmma tensor-core products with register accumulators, after FlashMLA's sparse prefill shape.
 *
 * One block of two warpgroups per (query token, group of 64 heads); the 64 heads are the M of every product.
 * Shared memory (216 KiB): Q (64 x 576, loaded once) and two buffers of one key tile (64 selected latent rows of
 * 576), all bf16 in column blocks of 64 x 64 whose 128-byte rows are swizzled the way wgmma's 128B mode reads them.
 * Per tile of 64 slots of the query's top-k (buffer i % 2), between two block barriers:
 *   - warpgroup 0 owns the scores: S = Q K^T (64 x 64, 36 wgmma m64n64k16, both operands from shared memory), then
 *     the online softmax in fp32 registers: invalid slots -inf, running max m in log2 units, P = exp2(S - m) rounded
 *     to bf16 into the tile's rope columns (the last 64 x 64 block, free once S is done), the rescale factors
 *     exp2(m_old - m_new) into shared memory, fp32 row sums per thread;
 *   - meanwhile warpgroup 1 gathers the NEXT tile into the other buffer (16-byte cp.async, 8 threads per 1152-byte
 *     row so every warp instruction reads whole 128-byte lines; slots of -1, past topk or outside [0, n_keys)
 *     zero-filled and flagged invalid), so the gather has a whole tile's time to land;
 *   - then each warpgroup rescales its half of O (64 x 256 fp32, 128 registers per thread; skipped by a warp when no
 *     row max moved) and adds P V_half: 4 wgmma m64n256k16 with P (K-major) and the tile's columns 256 w ..
 *     256 w + 255 (N-major) from shared memory.
 * At the end out = O / l (bf16) and lse = m ln 2 + log l; a row with no valid slot gets out 0 and lse +inf. A
 * repeated key is two softmax terms, as in the reference.
 * One owner of S (rather than both warpgroups each scoring 32 keys) reads a third less shared memory per tile and
 * needs no exchange of row maxima: 502 TFLOP/s against 353 at `dsarl bench dsa` (H200, bf16 GEMM ceiling 793). The
 * same kernel with the gather removed (every tile from shared memory) ran 544 and the gather alone 1.37 ms of its
 * 2.36 ms at Tq 4096, so the limit is the serial chain S -> softmax -> P V inside a tile, where the tensor cores
 * wait for the softmax (no ping-pong between warpgroups yet).
 * Shapes that do not fit (other dims, head counts not a multiple of 64, float32 storage, another architecture)
 * stay on the WMMA and CUDA-core kernels. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "tilelang_common.cuh"

#define SM90_HEADS 64                              /* heads per block: the M of every wgmma */
#define SM90_KEYS 64                               /* selected keys per tile */
#define SM90_DQK 576
#define SM90_DV 512
#define SM90_THREADS 256                           /* two warpgroups */
#define SM90_CHUNKS (SM90_DQK / 8)                 /* 16-byte chunks per row: 72 */
#define SM90_BLOCK_BYTES (64 * 128)                /* one column block: 64 rows x 64 bf16 */
#define SM90_TILE_BYTES (9 * SM90_BLOCK_BYTES)     /* 64 rows x 576 bf16 = 73728 */
#define SM90_ROPE_BLOCK (8 * SM90_BLOCK_BYTES)     /* offset of the rope columns in a tile: P lives there */
#define SM90_STATS (3 * SM90_TILE_BYTES)           /* rescale factors [64], row sums [64], valid flags [2][64] */
#define SM90_SHARED (SM90_STATS + 4 * 64 * 4 + 1024) /* + slack to align the base to 1024 bytes */

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SM90_DEVICE_CODE 1
#endif

/* Byte offset of 16-byte chunk `chunk` (0..71) of row `row` in a 64 x 576 tile: column block chunk / 8, then the
 * 128-byte row, whose chunk index is XORed with row % 8 (the 128B swizzle; blocks are 1024-byte aligned). */
static __device__ __forceinline__ uint32_t tile_offset(int row, int chunk)
{
    return (uint32_t)((chunk >> 3) * SM90_BLOCK_BYTES + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

/* wgmma shared-memory matrix descriptor, 128B swizzle: start address, leading and stride byte offsets (>> 4). */
static __device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFF) << 32) | ((uint64_t)1 << 62);
}

static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

#ifdef SM90_DEVICE_CODE
static __device__ __forceinline__ void cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
static __device__ __forceinline__ void cp_async_wait_all(void)
{
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}
/* Makes this thread's ordinary shared-memory writes visible to the async proxy (wgmma operand reads). */
static __device__ __forceinline__ void fence_proxy_async(void)
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
static __device__ __forceinline__ void wgmma_fence(void)
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void wgmma_commit(void)
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void wgmma_wait_all(void)
{
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
/* Keeps the compiler from moving accumulator reads or writes across a wgmma fence or wait. */
template <int N> static __device__ __forceinline__ void fence_regs(float (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" : "+f"(r[i])::"memory");
}

// D (64 x 256, fp32 registers) (+)= A (64 x 16, smem, K-major) B (16 x 256, smem, N-major).
static __device__ __forceinline__ void wgmma_m64n256k16_bf16_mn(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                                int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
                 "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
                   "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
                   "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                   "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
                   "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
                   "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
                   "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
                   "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
                   "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
                   "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
                   "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
                   "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
                   "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]),
                   "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),
                   "+f"(d[126]), "+f"(d[127])
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D (64 x 64, fp32 registers) (+)= A (64 x 16, smem, K-major) B (16 x 64, smem, K-major).
static __device__ __forceinline__ void wgmma_m64n64k16_bf16_k(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                              int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
                   "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

/* Gathers the 64 rows of a tile with NT threads (thread u): 8 threads per row, each 16-byte chunk (u % 8) + 8 k of
 * its rows, so that every warp instruction reads 4 whole 128-byte lines. Rows whose key is -1 or outside
 * [0, n_keys) are zero-filled and flagged invalid. */
template <int NT>
static __device__ __forceinline__ void gather_rows(uint32_t dst, int *valid, const bf16 *kv, const int32_t *sel,
                                                   int slot0, int topk, int64_t n_keys, int u)
{
#pragma unroll
    for (int pass = 0; pass < SM90_KEYS / (NT / 8); pass++) {
        const int row = pass * (NT / 8) + (u >> 3), slot = slot0 + row;
        const int32_t key = slot < topk ? sel[slot] : -1;
        const bool ok = key >= 0 && (int64_t)key < n_keys;
        const char *src = (const char *)(kv + (ok ? (int64_t)key * SM90_DQK : 0));
#pragma unroll
        for (int k = 0; k < SM90_CHUNKS / 8; k++) {
            const int chunk = (u & 7) + 8 * k;
            cp_async16(dst + tile_offset(row, chunk), src + chunk * 16, ok ? 16 : 0);
        }
        if ((u & 7) == 0)
            valid[row] = ok;
    }
}
#endif

static __global__ void __launch_bounds__(SM90_THREADS, 1)
sparse_mla_forward_sm90_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *kv, const int32_t *indices, int topk,
                               int n_heads, int64_t n_keys, float scale_log2)
{
#ifdef SM90_DEVICE_CODE
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t pad = ((raw + 1023u) & ~1023u) - raw;
    unsigned char *smem = smem_raw + pad;
    const uint32_t q_s = raw + pad, kv_s0 = q_s + SM90_TILE_BYTES; // shared addresses
    float *alpha_s = (float *)(smem + SM90_STATS);                  // [64] this tile's O rescale factors
    float *row_sum = alpha_s + 64;                                  // [64] at the end
    int *valid = (int *)(row_sum + 64);                             // [2 buffers][64 slots]

    const int64_t t = blockIdx.x;
    const int h0 = blockIdx.y * SM90_HEADS, tid = threadIdx.x;
    const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8; // this thread's two head rows of every accumulator
    const int cq = 2 * (lane & 3);                       // its column pair within each 8-column group
    const int32_t *sel = indices + t * topk;
    const int n_tiles = (topk + SM90_KEYS - 1) / SM90_KEYS;

    { // Q: 64 heads x 576, row tid / 4
        const int row = tid >> 2;
        const char *src = (const char *)(q + ((t * n_heads) + h0 + row) * SM90_DQK);
#pragma unroll
        for (int k = 0; k < SM90_CHUNKS / 4; k++) {
            const int chunk = (tid & 3) + 4 * k;
            cp_async16(q_s + tile_offset(row, chunk), src + chunk * 16, 16);
        }
    }
    gather_rows<SM90_THREADS>(kv_s0, valid, kv, sel, 0, topk, n_keys, tid);
    cp_async_commit();

    // descriptors: 128B swizzle, K-major (Q, K, P) with 1024-byte 8-row groups; V N-major, 64-column blocks 8 KiB apart
    const uint64_t desc_q = smem_desc(q_s, 16, 1024), desc_k = smem_desc(kv_s0, 16, 1024);
    const uint64_t desc_p = smem_desc(kv_s0 + SM90_ROPE_BLOCK, 16, 1024);
    const uint64_t desc_v = smem_desc(kv_s0 + wg * 4 * SM90_BLOCK_BYTES, SM90_BLOCK_BYTES, 1024);

    float o[128]; // O[r0 | r1][256 wg + 8 j + cq + {0,1}] = o[4 j + {0,1 | 2,3}]
#pragma unroll
    for (int i = 0; i < 128; i++)
        o[i] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f; // warpgroup 0: running max (log2) and partial sums

    for (int i = 0; i < n_tiles; i++) {
        const int buf = i & 1;
        const uint64_t buf_desc = (uint64_t)((buf * SM90_TILE_BYTES) >> 4);
        if (wg == 1 || i == 0)
            cp_async_wait_all(); // tile i: warpgroup 1's copies (everyone's at i = 0)
        fence_proxy_async();
        __syncthreads(); // tile i visible to all; both warpgroups are done with tile i - 1

        float alpha0 = 1.0f, alpha1 = 1.0f;
        if (wg == 0) {
            float s[32]; // S[r0 | r1][8 j + cq + {0,1}] = s[4 j + {0,1 | 2,3}]
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < SM90_DQK / 16; kk++) {
                const uint64_t koff = (uint64_t)((((kk >> 2) * SM90_BLOCK_BYTES) + (kk & 3) * 32) >> 4);
                wgmma_m64n64k16_bf16_k(s, desc_q + koff, desc_k + buf_desc + koff, kk > 0);
            }
            wgmma_commit();
            wgmma_wait_all();
            fence_regs(s);

            const int *ok = valid + buf * 64;
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float x = ok[8 * j + cq + (e & 1)] ? s[4 * j + e] * scale_log2 : -INFINITY;
                    s[4 * j + e] = x;
                    if (e < 2)
                        mx0 = fmaxf(mx0, x);
                    else
                        mx1 = fmaxf(mx1, x);
                }
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
            const float u0 = n0 == -INFINITY ? 0.0f : n0, u1 = n1 == -INFINITY ? 0.0f : n1;
            alpha0 = exp2f(m0 - u0), alpha1 = exp2f(m1 - u1);
            m0 = n0, m1 = n1;
            float sum0 = 0.0f, sum1 = 0.0f;
            unsigned char *p_tile = smem + SM90_TILE_BYTES * (1 + buf) + SM90_ROPE_BLOCK; // P (64 x 64 keys)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float p00 = exp2f(s[4 * j] - u0), p01 = exp2f(s[4 * j + 1] - u0);
                const float p10 = exp2f(s[4 * j + 2] - u1), p11 = exp2f(s[4 * j + 3] - u1);
                sum0 += p00 + p01, sum1 += p10 + p11;
                *(__nv_bfloat162 *)(p_tile + r0 * 128 + ((j ^ (r0 & 7)) << 4) + cq * 2) =
                    __floats2bfloat162_rn(p00, p01);
                *(__nv_bfloat162 *)(p_tile + r1 * 128 + ((j ^ (r1 & 7)) << 4) + cq * 2) =
                    __floats2bfloat162_rn(p10, p11);
            }
            l0 = l0 * alpha0 + sum0, l1 = l1 * alpha1 + sum1;
            if ((lane & 3) == 0)
                alpha_s[r0] = alpha0, alpha_s[r1] = alpha1;
        } else {
            if (i + 1 < n_tiles) // the next tile, while warpgroup 0 works on this one
                gather_rows<128>(kv_s0 + (buf ^ 1) * SM90_TILE_BYTES, valid + (buf ^ 1) * 64, kv, sel,
                                 (i + 1) * SM90_KEYS, topk, n_keys, tid - 128);
            cp_async_commit();
        }
        fence_proxy_async();
        __syncthreads(); // P and the rescale factors written
        if (wg == 1)
            alpha0 = alpha_s[r0], alpha1 = alpha_s[r1];
        if (__any_sync(0xffffffffu, alpha0 != 1.0f || alpha1 != 1.0f)) { /* skip when no row max moved */
#pragma unroll
            for (int j = 0; j < 32; j++) {
                o[4 * j] *= alpha0, o[4 * j + 1] *= alpha0;
                o[4 * j + 2] *= alpha1, o[4 * j + 3] *= alpha1;
            }
        }
        // O_wg += P V_wg: V = the tile's columns 256 wg .. 256 wg + 255, keys along K (N-major B)
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < SM90_KEYS / 16; kk++)
            wgmma_m64n256k16_bf16_mn(o, desc_p + buf_desc + kk * 2, desc_v + buf_desc + kk * 128, 1);
        wgmma_commit();
        wgmma_wait_all();
        fence_regs(o);
    }

    // row sums (warpgroup 0 holds them): over the quad, then shared with warpgroup 1 through shared memory
    if (wg == 0) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        if ((lane & 3) == 0)
            row_sum[r0] = l0, row_sum[r1] = l1;
    }
    __syncthreads();
    l0 = row_sum[r0], l1 = row_sum[r1];
    const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    bf16 *out0 = out + (t * n_heads + h0 + r0) * SM90_DV + wg * 256 + cq;
    bf16 *out1 = out + (t * n_heads + h0 + r1) * SM90_DV + wg * 256 + cq;
#pragma unroll
    for (int j = 0; j < 32; j++) {
        *(__nv_bfloat162 *)(out0 + 8 * j) = __floats2bfloat162_rn(o[4 * j] * inv0, o[4 * j + 1] * inv0);
        *(__nv_bfloat162 *)(out1 + 8 * j) = __floats2bfloat162_rn(o[4 * j + 2] * inv1, o[4 * j + 3] * inv1);
    }
    if (wg == 0 && (lane & 3) == 0) {
        lse[t * n_heads + h0 + r0] = l0 > 0.0f ? m0 * 0.69314718055994531f + logf(l0) : INFINITY;
        lse[t * n_heads + h0 + r1] = l1 > 0.0f ? m1 * 0.69314718055994531f + logf(l1) : INFINITY;
    }
#else
    __trap();
#endif
}

/* C linkage: the test (check_dsa_mla_sm90.c) calls it directly. */
extern "C" int tilelang_sparse_mla_forward_sm90(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                                const dsarl_dsa_attention_inputs *in, const int32_t *indices,
                                                int32_t topk, void *out, float *lse, int *used, dsarl_error *err)
{
    *used = 0;
    // bf16 storage at GLM-5 dims, whole 64-head groups, 16-byte aligned rows, a compute capability 9.0 device
    if (ctx->f32 || in->d_qk != SM90_DQK || in->d_v != SM90_DV || in->n_heads % SM90_HEADS ||
        ((uintptr_t)in->q % 16) || ((uintptr_t)in->kv % 16) || ((uintptr_t)out % 16) ||
        batch->n_queries > 0x7fffffff || getenv("DSARL_TILELANG_NO_SM90") || getenv("DSARL_TILELANG_NO_WMMA"))
        return DSARL_OK;
    int device = 0, major = 0, minor = 0;
    tlCheck(cudaGetDevice(&device), err);
    tlCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), err);
    tlCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), err);
    if (major != 9 || minor != 0)
        return DSARL_OK;
    dim3 grid((unsigned int)batch->n_queries, (unsigned int)(in->n_heads / SM90_HEADS));
    const float scale_log2 = in->softmax_scale * 1.4426950408889634f; /* logits in log2 units for exp2 */
    tlSharedLimit(sparse_mla_forward_sm90_kernel, SM90_SHARED, err);
    sparse_mla_forward_sm90_kernel<<<grid, SM90_THREADS, SM90_SHARED>>>((bf16 *)out, lse, (const bf16 *)in->q,
                                                                        (const bf16 *)in->kv, indices, topk,
                                                                        in->n_heads, batch->n_keys, scale_log2);
    tlCheckLaunch("sparse_mla_forward (sm90 wgmma)", err);
    *used = 1;
    return DSARL_OK;
}
