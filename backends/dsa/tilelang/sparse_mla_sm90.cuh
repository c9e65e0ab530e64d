/* sparse_mla_sm90.cuh: device helpers shared by the Hopper (sm_90a) sparse MLA kernels, forward
 * (sparse_mla_forward_sm90.cu) and backward (sparse_mla_backward_sm90.cu), at GLM-5 dims (d_qk 576, d_v 512):
 *   - the shared-memory tile layout: 64 rows x 576 bf16 in 9 column blocks of 64 x 64, each 128-byte row swizzled
 *     the way wgmma's 128B mode reads it (16-byte chunk index XOR row % 8; blocks 1024-byte aligned);
 *   - (wgmma descriptors, products, copies and fences: the cuda device's cuda_wgmma.cuh);
 *   - the tile gather: 64 selected latent rows, 8 threads per 1152-byte row, invalid slots zero-filled.
 * Everything device-side is compiled only for sm_90a (SM90_DEVICE_CODE); the host pass sees the constants. */
#ifndef DSARL_TILELANG_SPARSE_MLA_SM90_CUH
#define DSARL_TILELANG_SPARSE_MLA_SM90_CUH

#include <stdint.h>
#include "tilelang_common.cuh"
#include "cuda_wgmma.cuh" /* descriptors, copies, fences, wgmma products */

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

/* *yes = 1 when the current CUDA device has compute capability 9.0 (the sm_90a kernels run there). */
static inline int sm90_device(int *yes, dsarl_error *err)
{
    int device = 0, major = 0, minor = 0;
    *yes = 0;
    tlCheck(cudaGetDevice(&device), err);
    tlCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), err);
    tlCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), err);
    *yes = major == 9 && minor == 0;
    return DSARL_OK;
}

/* Byte offset of 16-byte chunk `chunk` (0..71) of row `row` in a 64 x 576 tile: column block chunk / 8, then the
 * 128-byte row, whose chunk index is XORed with row % 8 (the 128B swizzle; blocks are 1024-byte aligned). */
static __device__ __forceinline__ uint32_t tile_offset(int row, int chunk)
{
    return (uint32_t)((chunk >> 3) * SM90_BLOCK_BYTES + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

#ifdef SM90_DEVICE_CODE
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
