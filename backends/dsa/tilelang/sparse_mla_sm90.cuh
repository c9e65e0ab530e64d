/* sparse_mla_sm90.cuh: device helpers shared by the Hopper (sm_90a) sparse MLA kernels, forward
 * (sparse_mla_forward_sm90.cu) and backward (sparse_mla_backward_sm90.cu), at GLM-5 dims (d_qk 576, d_v 512):
 *   - the shared-memory tile layout: 64 rows x 576 bf16 in 9 column blocks of 64 x 64, each 128-byte row swizzled
 *     the way wgmma's 128B mode reads it (16-byte chunk index XOR row % 8; blocks 1024-byte aligned);
 *   - wgmma descriptors and the m64nNk16 bf16 -> fp32 products with register accumulators;
 *   - cp.async, proxy fences and wgmma fences;
 *   - the tile gather: 64 selected latent rows, 8 threads per 1152-byte row, invalid slots zero-filled.
 * Everything device-side is compiled only for sm_90a (SM90_DEVICE_CODE); the host pass sees the constants. */
#ifndef DSARL_TILELANG_SPARSE_MLA_SM90_CUH
#define DSARL_TILELANG_SPARSE_MLA_SM90_CUH

#include <stdint.h>
#include "tilelang_common.cuh"

#define SM90_KEYS 64                               /* selected keys per tile */
#define SM90_DQK 576
#define SM90_DV 512
#define SM90_CHUNKS (SM90_DQK / 8)                 /* 16-byte chunks per row: 72 */
#define SM90_BLOCK_BYTES (64 * 128)                /* one column block: 64 rows x 64 bf16 */
#define SM90_TILE_BYTES (9 * SM90_BLOCK_BYTES)     /* 64 rows x 576 bf16 = 73728 */
#define SM90_ROPE_BLOCK (8 * SM90_BLOCK_BYTES)     /* offset of the rope columns in a tile */

#define SM90_HEAD_GROUP TILELANG_SM90_HEAD_GROUP   /* heads per block (tilelang.h): the M of the products over heads */

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

// D (64 x 64, fp32 registers) (+)= A (64 x 16, smem) B (16 x 64, smem); TA / TB = 0: K-major, 1: M- / N-major.
template <int TA, int TB>
static __device__ __forceinline__ void wgmma_m64n64k16_bf16(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                            int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
                   "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TA), "n"(TB));
}

// D (64 x 32, fp32 registers) (+)= A (64 x 16, smem, K-major) B (16 x 32, smem, K-major).
static __device__ __forceinline__ void wgmma_m64n32k16_bf16_k(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                                              int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
                 "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15])
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

/* Gathers the 64 rows of a tile with NT threads (thread u): 8 threads per row, each 16-byte chunk (u % 8) + 8 k of
 * its rows, so that every warp instruction reads 4 whole 128-byte lines. Rows whose key is -1 or outside
 * [0, n_keys) are zero-filled and flagged invalid: valid[row] is 0 / 1, or with KEYS the key itself / -1 (the
 * backward needs the key to scatter the tile's key gradient). */
template <int NT, bool KEYS = false>
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
            valid[row] = KEYS ? (ok ? key : -1) : (int)ok;
    }
}

/* Tiles of 64 slots a query's top-k list needs: up to its last slot with a key in [0, n_keys), at least 1 (a row
 * with no valid slot runs one all-invalid tile, which gives out 0 and lse +inf). Queries with fewer eligible keys
 * than topk (early causal positions, short decode contexts) end in -1 slots, whose tiles would otherwise be
 * gathered and multiplied as zeros. All NT threads of the block call it (two barriers); *block_last is a
 * __shared__ int of the caller's, not written again. */
template <int NT>
static __device__ __forceinline__ int live_tiles(const int32_t *sel, int topk, int64_t n_keys, int *block_last, int u)
{
    int last = -1;
    for (int slot = u; slot < topk; slot += NT) {
        const int32_t key = sel[slot];
        if (key >= 0 && (int64_t)key < n_keys)
            last = slot;
    }
    last = __reduce_max_sync(0xffffffffu, last);
    if (u == 0)
        *block_last = -1;
    __syncthreads();
    if ((u & 31) == 0)
        atomicMax(block_last, last);
    __syncthreads();
    const int tiles = (*block_last + SM90_KEYS) / SM90_KEYS;
    return tiles > 0 ? tiles : 1;
}
#endif

#endif /* DSARL_TILELANG_SPARSE_MLA_SM90_CUH */
