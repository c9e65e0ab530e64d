/* sparse_mla_backward_sm90.cu: the Hopper (sm_90a) path of the sparse MLA backward for bf16 storage at GLM-5 dims
 * (d_qk 576 = kv_lora 512 + rope 64, d_v 512, heads in groups of 64): the math of sparse_mla_backward.cu (see
 * there) on wgmma tensor-core products with register accumulators, in the forward's design
 * (sparse_mla_forward_sm90.cu; tiles, descriptors and gather shared through sparse_mla_sm90.cuh).
 *
 * One block of two warpgroups per (query token, group of 64 heads); the 64 heads are the M of the products that
 * run over heads, the 64 keys of a tile the M of the key-gradient product. Shared memory (226 KiB): Q (64 x 576)
 * and dO (64 x 512), loaded once; one key tile (64 selected latent rows of 576); P and dS (64 heads x 64 keys,
 * bf16); all in 64 x 64 column blocks with 128B-swizzled rows. Delta = rowsum(dO * O) per head in the prologue.
 * Per tile of 64 slots of the query's top-k:
 *   A. warpgroup 0: S = Q K^T (36 m64n64k16), P = exp2(S scale log2e - lse log2e) (0 at invalid slots) rounded
 *      to bf16 into shared memory; warpgroup 1 meanwhile dP = dO V^T (32 m64n64k16), then, with the bf16 P,
 *      dS = scale P (dP - Delta) into shared memory as bf16 (P and dS are operands of the products below, rounded
 *      as FlashAttention's backward rounds them). One owner per product keeps every descriptor warp-uniform and
 *      each warpgroup reading only its own operands;
 *   B. dQ += dS K: warpgroup w owns dQ columns 256 w .. 256 w + 255 (4 m64n256k16, K's columns N-major), and the
 *      rope columns 512..575 over keys 32 w .. 32 w + 31 of the tile (2 m64n64k16); all of dQ stays in registers
 *      (128 + 32 fp32 per thread) until the end, where the two rope halves are summed through shared memory and dq
 *      written once;
 *   C. the next tile's gather is issued (the key tile is free once B is done; C does not read it), then the tile's
 *      key gradient dKV = dS^T Q + P^T dO (64 keys x 576; the value term on the first 512 columns only) in 64-column
 *      chunks: warpgroup w chunks 4 w .. 4 w + 3 (8 m64n64k16 each: A = dS^T / P^T M-major, B = Q / dO N-major),
 *      warpgroup 0 also the rope chunk 8 (key term only, 4 m64n64k16; splitting it over heads between the two
 *      would send its 64 columns twice, 10% more reductions). Each chunk, summed over the heads in the tensor
 *      cores, goes out with one red.global.add.v4.f32 per 4 elements (lane pairs swap halves by shuffle) into the
 *      fp32 accumulator at the tile's selected keys. Repeated keys are two reductions into one row; invalid slots
 *      (-1, past topk, outside [0, n_keys)) none.
 * The caller zeroes the accumulator and adds it to the bf16 dkv once (tilelang_flush_accumulator).
 * Atomics: one 16-byte reduction per 4 dKV elements per (query, 64 heads), against one fp32 atomic per element per
 * (query, 16 heads) in the WMMA kernel: 16 times fewer reduction instructions and a quarter of the bytes.
 *
 * Resources (nvcc 13.0 -Xptxas -v, sm_90a): 241 registers, 0 bytes stack frame, no spill stores or loads, 2
 * barriers (0 and the named barrier 1 of phase A); 231424 bytes of dynamic shared memory (limit 232448). SASS
 * (cuobjdump --dump-sass): HGMMA.64x64x16.F32.BF16 x 82 (S 36, dP 32, dQ rope 2, dKV loop body 8, dKV rope 4),
 * HGMMA.64x256x16.F32.BF16 x 4 (dQ), REDG.E.ADD.F32x4 for the key gradient; no LDL/STL; no C7520 serialisation.
 * A CPU emulation of this block's shared-memory layouts and descriptor arithmetic (tools/emulate_mla_bwd_sm90.py,
 * canonical SW128 K-/MN-major reads) matches a float64 reference at bf16 rounding (2.7e-3 dq, 2.2e-3 dkv).
 * Heads that are not whole groups of 64 pad the last group with zero rows (lse +inf there, so P and dS are 0 and
 * add nothing to dKV; their dq rows are not stored); it must hold at least 16 real heads
 * (tilelang_sparse_mla_sm90_head_groups).
 * Query groups (the GROUPED instance, 8, 16 and 32 heads): padding would leave 48 of 16 heads' 64 rows idle while
 * the gather and the key-gradient reductions, which cost the same at any head count, bound the block. Instead a
 * block takes the H heads of G = 64 / H consecutive queries (their q, dO, out, lse rows are adjacent, so nothing
 * else changes) and walks the union of their selected keys (sparse_mla_query_union.cu); a row's P is 0 at a key
 * its query did not select, so dS is 0 there too. Each union key is gathered and reduced once per group instead
 * of once per query: causal neighbours select mostly the same keys, so the union is far shorter than G top-k
 * lists (all of them alike while fewer than topk keys are eligible); where queries share no keys the work is what
 * one block per query does. dQ sums in another order than the per-query kernel's (fp32, before one bf16 rounding). 
 * Its rate on the H200 against the WMMA kernel's is in docs/performance.md. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "sparse_mla_sm90.cuh"

#define BW_THREADS 256                              /* two warpgroups */
#define BW_DO SM90_TILE_BYTES                       /* dO: 8 column blocks after Q's 9 */
#define BW_KV (BW_DO + 8 * SM90_BLOCK_BYTES)        /* the key tile */
#define BW_P (BW_KV + SM90_TILE_BYTES)              /* P (64 heads x 64 keys, bf16) */
#define BW_DS (BW_P + SM90_BLOCK_BYTES)             /* dS (64 heads x 64 keys, bf16) */
#define BW_STATS (BW_DS + SM90_BLOCK_BYTES)         /* lse log2e [64], Delta [64], tile keys [2][64] */
#define BW_SHARED (BW_STATS + 4 * 64 * 4 + 1024)    /* + slack to align the base to 1024 bytes: 231424 */

#ifdef SM90_DEVICE_CODE
/* bar.sync on a barrier other than __syncthreads' 0, for count threads (both warpgroups, from their own branches) */
static __device__ __forceinline__ void named_barrier_sync(int id, int count)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/* sum of the 8 products of two 16-byte bf16 chunks, in fp32 */
static __device__ __forceinline__ float dot8_bf16(uint4 a, uint4 b)
{
    const __nv_bfloat162 *x = (const __nv_bfloat162 *)&a, *y = (const __nv_bfloat162 *)&b;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 u = __bfloat1622float2(x[i]), v = __bfloat1622float2(y[i]);
        s += u.x * v.x + u.y * v.y;
    }
    return s;
}

/* *dst += v, four fp32 lanes in one reduction (sm_90); dst 16-byte aligned. */
static __device__ __forceinline__ void red_add_v4(float *dst, float a, float b, float c, float d)
{
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(a), "f"(b), "f"(c), "f"(d)
                 : "memory");
}

/* Adds a 64 keys x 64 columns accumulator chunk (c[4 j + {0,1 | 2,3}] at rows r0 | r1, columns 8 j + cq + {0,1})
 * into the rows of the fp32 key-gradient accumulator: lane pairs swap halves so that each lane holds 4
 * consecutive columns of one row (even lanes row r0, odd lanes row r1), then one 16-byte reduction each.
 * dst = that row's column cq - 2 odd of the chunk; nothing for an invalid slot (key < 0). */
static __device__ __forceinline__ void scatter_chunk(float *dst, const float (&c)[32], int key, int odd)
{
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float send0 = odd ? c[4 * j] : c[4 * j + 2], send1 = odd ? c[4 * j + 1] : c[4 * j + 3];
        const float x = __shfl_xor_sync(0xffffffffu, send0, 1), y = __shfl_xor_sync(0xffffffffu, send1, 1);
        if (key >= 0) {
            if (odd)
                red_add_v4(dst + 8 * j, x, y, c[4 * j + 2], c[4 * j + 3]);
            else
                red_add_v4(dst + 8 * j, c[4 * j], c[4 * j + 1], x, y);
        }
    }
}
#endif

/* GROUPED: the block's 64 rows are the heads of 64 / heads_per_query consecutive queries (virtual query t = the
 * group, n_heads = 64, rows from t * 64 live below n_rows) and its keys are the group's list (indices, topk = its
 * capacity, union_len its length, union_mask which of the queries selected each key:
 * sparse_mla_query_union.cu); otherwise one query's top-k row and a group of 64 of its heads. */
template <bool GROUPED>
static __global__ void __launch_bounds__(BW_THREADS, 1)
sparse_mla_backward_sm90_kernel(bf16 *dq, float *dkv_acc, const bf16 *q, const bf16 *kv, const int32_t *indices,
                                const bf16 *out, const float *lse, const bf16 *dout, int topk, int n_heads,
                                int64_t n_keys, float scale, float scale_log2, const uint8_t *union_mask,
                                const int32_t *union_len, int heads_per_query, int64_t n_rows)
{
#ifdef SM90_DEVICE_CODE
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t pad = ((raw + 1023u) & ~1023u) - raw;
    unsigned char *smem = smem_raw + pad;
    const uint32_t q_s = raw + pad, do_s = q_s + BW_DO, kv_s = q_s + BW_KV; // shared addresses
    const uint32_t p_s = q_s + BW_P, ds_s = q_s + BW_DS;
    float *lse_s = (float *)(smem + BW_STATS); // [64] lse in log2 units
    float *delta_s = lse_s + 64;               // [64] rowsum(dO * O)
    int *keys = (int *)(delta_s + 64);         // [2 buffers][64 slots]: the tile's key, -1 when invalid
    __shared__ uint8_t masks[2][64];           // GROUPED: the queries of the group that selected each tile key

    const int64_t t = blockIdx.x;
    const int h0 = blockIdx.y * SM90_HEAD_GROUP, tid = threadIdx.x;
    const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8; // this thread's two rows of every accumulator
    const int cq = 2 * (lane & 3);                       // its column pair within each 8-column group
    const int32_t *sel = indices + t * topk;
    const int n_slots = GROUPED ? union_len[t] : topk; // slots of this block's key list
    // is row r of this block a real (query, head)? GROUPED: the group's last query may be past the batch
    auto row_live = [&](int r) { return GROUPED ? t * 64 + r < n_rows : h0 + r < n_heads; };
    // the union list's masks of tile i's keys into buffer i & 1 (read after the tile's barrier)
    auto load_masks = [&](int i) {
        if (GROUPED && tid < 64)
            masks[i & 1][tid] = i * 64 + tid < n_slots ? union_mask[t * topk + i * 64 + tid] : 0;
    };

    { // Q (64 heads x 576) and dO (64 heads x 512): row tid / 4; rows past n_heads (a partial last group) are zero
        const int row = tid >> 2, live = row_live(row), h = live ? h0 + row : 0;
        const char *src_q = (const char *)(q + (t * n_heads + h) * SM90_DQK);
        const char *src_o = (const char *)(dout + (t * n_heads + h) * SM90_DV);
#pragma unroll
        for (int k = 0; k < SM90_CHUNKS / 4; k++) {
            const int chunk = (tid & 3) + 4 * k;
            cp_async16(q_s + tile_offset(row, chunk), src_q + chunk * 16, live ? 16 : 0);
        }
#pragma unroll
        for (int k = 0; k < SM90_DV / 32; k++) {
            const int chunk = (tid & 3) + 4 * k;
            cp_async16(do_s + tile_offset(row, chunk), src_o + chunk * 16, live ? 16 : 0);
        }
    }
    gather_rows<BW_THREADS, true>(kv_s, keys, kv, sel, 0, n_slots, n_keys, tid);
    load_masks(0);
    cp_async_commit();
    // Delta and lse (log2 units) per head, one warp per head, while the copies land
    for (int h = tid >> 5; h < SM90_HEAD_GROUP; h += BW_THREADS / 32) {
        if (!row_live(h)) { // padding row: lse +inf makes P and dS 0, so it adds nothing to dKV
            if (lane == 0)
                delta_s[h] = 0.0f, lse_s[h] = INFINITY;
            continue;
        }
        const uint4 *o = (const uint4 *)(out + (t * n_heads + h0 + h) * SM90_DV);
        const uint4 *d = (const uint4 *)(dout + (t * n_heads + h0 + h) * SM90_DV);
        float s = dot8_bf16(o[lane], d[lane]) + dot8_bf16(o[lane + 32], d[lane + 32]);
        s = warp_sum(s);
        if (lane == 0) {
            delta_s[h] = s;
            lse_s[h] = lse[t * n_heads + h0 + h] * 1.4426950408889634f; // +inf stays +inf: P = 0
        }
    }
    __shared__ int block_last;
    const int n_tiles = GROUPED ? (n_slots + SM90_KEYS - 1) / SM90_KEYS // an empty list runs no tile: dq 0
                                : live_tiles<BW_THREADS>(sel, topk, n_keys, &block_last, tid); // trailing -1 skipped
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();
    const float lse0 = lse_s[r0], lse1 = lse_s[r1], delta0 = delta_s[r0], delta1 = delta_s[r1];
    // GROUPED: the bit of row r0's / r1's query in a key's mask
    const unsigned bit0 = GROUPED ? 1u << (r0 / heads_per_query) : 0u, bit1 = GROUPED ? 1u << (r1 / heads_per_query) : 0u;

    // descriptors, 128B swizzle. K-major (LBO 16, SBO 1024 per 8 rows): Q, dO, this warpgroup's 32 keys, dS as A of
    // dQ. N-/M-major (LBO 8 KiB per 64-column block, SBO 1024 per 8 rows of K): the tile as B of dQ; dS^T, P^T as A
    // and Q, dO as B of dKV.
    const uint64_t desc_q = smem_desc(q_s, 16, 1024), desc_do = smem_desc(do_s, 16, 1024);
    const uint64_t desc_k = smem_desc(kv_s, 16, 1024);
    const uint64_t desc_ds = smem_desc(ds_s, 16, 1024);
    const uint64_t desc_kn = smem_desc(kv_s + wg * 4 * SM90_BLOCK_BYTES, SM90_BLOCK_BYTES, 1024);
    const uint64_t desc_kr = smem_desc(kv_s + SM90_ROPE_BLOCK, SM90_BLOCK_BYTES, 1024);
    const uint64_t desc_dst = smem_desc(ds_s, SM90_BLOCK_BYTES, 1024), desc_pt = smem_desc(p_s, SM90_BLOCK_BYTES, 1024);
    const uint64_t desc_qn = smem_desc(q_s, SM90_BLOCK_BYTES, 1024), desc_don = smem_desc(do_s, SM90_BLOCK_BYTES, 1024);

    float dqa[128]; // dQ[r0 | r1][256 wg + 8 j + cq + {0,1}] = dqa[4 j + {0,1 | 2,3}]
    float dqr[32];  // dQ[r0 | r1][512 + 8 j + cq + {0,1}] over keys 32 wg .. 32 wg + 31 of every tile
#pragma unroll
    for (int i = 0; i < 128; i++)
        dqa[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; i++)
        dqr[i] = 0.0f;

    for (int i = 0; i < n_tiles; i++) {
        const int *key = keys + (i & 1) * 64;
        const uint8_t *mask = masks[i & 1];

        // A. warpgroup 0: S = Q K^T, then P; warpgroup 1: dP = dO V^T, then dS (64 heads x 64 keys each, K-major
        // operands): acc[4 j + {0,1 | 2,3}] = S or dP [r0 | r1][8 j + cq + {0,1}]
        if (wg == 0) {
            float acc[32];
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < SM90_DQK / 16; kk++) {
                const uint64_t koff = (uint64_t)((((kk >> 2) * SM90_BLOCK_BYTES) + (kk & 3) * 32) >> 4);
                wgmma_m64n64k16_bf16<0, 0>(acc, desc_q + koff, desc_k + koff, kk > 0);
            }
            wgmma_commit();
            wgmma_wait_all();
            fence_regs(acc);
            // P = exp2(S scale log2e - lse log2e), 0 at invalid slots, to shared memory as bf16
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int c = 8 * j + cq; // key slot within the tile
                const bool v0 = key[c] >= 0, v1 = key[c + 1] >= 0;
                // GROUPED: a key counts for a row only if the row's query selected it
                const bool v00 = v0 && (!GROUPED || (mask[c] & bit0)), v01 = v1 && (!GROUPED || (mask[c + 1] & bit0));
                const bool v10 = v0 && (!GROUPED || (mask[c] & bit1)), v11 = v1 && (!GROUPED || (mask[c + 1] & bit1));
                const float p00 = v00 ? exp2f(acc[4 * j] * scale_log2 - lse0) : 0.0f;
                const float p01 = v01 ? exp2f(acc[4 * j + 1] * scale_log2 - lse0) : 0.0f;
                const float p10 = v10 ? exp2f(acc[4 * j + 2] * scale_log2 - lse1) : 0.0f;
                const float p11 = v11 ? exp2f(acc[4 * j + 3] * scale_log2 - lse1) : 0.0f;
                *(__nv_bfloat162 *)(smem + BW_P + r0 * 128 + ((j ^ (r0 & 7)) << 4) + cq * 2) =
                    __floats2bfloat162_rn(p00, p01);
                *(__nv_bfloat162 *)(smem + BW_P + r1 * 128 + ((j ^ (r1 & 7)) << 4) + cq * 2) =
                    __floats2bfloat162_rn(p10, p11);
            }
            named_barrier_sync(1, BW_THREADS); // P written
        } else {
            float acc[32];
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < SM90_DV / 16; kk++) {
                const uint64_t koff = (uint64_t)((((kk >> 2) * SM90_BLOCK_BYTES) + (kk & 3) * 32) >> 4);
                wgmma_m64n64k16_bf16<0, 0>(acc, desc_do + koff, desc_k + koff, kk > 0);
            }
            wgmma_commit();
            wgmma_wait_all();
            fence_regs(acc);
            named_barrier_sync(1, BW_THREADS); // P written
            // dS = scale P (dP - Delta) with the bf16 P that the tensor cores use, to shared memory
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const uint32_t o0 = r0 * 128 + ((j ^ (r0 & 7)) << 4) + cq * 2;
                const uint32_t o1 = r1 * 128 + ((j ^ (r1 & 7)) << 4) + cq * 2;
                const float2 p0 = __bfloat1622float2(*(const __nv_bfloat162 *)(smem + BW_P + o0));
                const float2 p1 = __bfloat1622float2(*(const __nv_bfloat162 *)(smem + BW_P + o1));
                *(__nv_bfloat162 *)(smem + BW_DS + o0) = __floats2bfloat162_rn(
                    scale * p0.x * (acc[4 * j] - delta0), scale * p0.y * (acc[4 * j + 1] - delta0));
                *(__nv_bfloat162 *)(smem + BW_DS + o1) = __floats2bfloat162_rn(
                    scale * p1.x * (acc[4 * j + 2] - delta1), scale * p1.y * (acc[4 * j + 3] - delta1));
            }
        }
        fence_proxy_async();
        __syncthreads(); // P and dS complete

        // B. dQ += dS K: columns 256 wg .. 256 wg + 255 over all 64 keys, rope columns over this warpgroup's keys
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < SM90_KEYS / 16; kk++)
            wgmma_m64n256k16_bf16_mn(dqa, desc_ds + kk * 2, desc_kn + kk * 128, 1);
#pragma unroll
        for (int k2 = 0; k2 < 2; k2++) {
            const int kk = 2 * wg + k2;
            wgmma_m64n64k16_bf16<0, 1>(dqr, desc_ds + kk * 2, desc_kr + kk * 128, 1);
        }
        wgmma_commit();
        wgmma_wait_all();
        fence_regs(dqa);
        fence_regs(dqr);
        __syncthreads(); // both warpgroups are done with the key tile

        // C. the next tile lands while this tile's key gradient is computed and sent
        if (i + 1 < n_tiles) {
            gather_rows<BW_THREADS, true>(kv_s, keys + ((i + 1) & 1) * 64, kv, sel, (i + 1) * SM90_KEYS, n_slots,
                                          n_keys, tid);
            load_masks(i + 1);
        }
        cp_async_commit();
        const int odd = lane & 1;        // lane pairs swap halves: even lanes send row r0, odd lanes row r1
        const int my_key = key[odd ? r1 : r0];
        float *dst_row = dkv_acc + (int64_t)(my_key >= 0 ? my_key : 0) * SM90_DQK + cq - 2 * odd;
        // warpgroup w: column chunks 4 w .. 4 w + 3 (both terms), then the rope chunk 8 (key term only) over heads
        // 32 w .. 32 w + 31, so both warpgroups run the same wgmma sequence (no divergent wgmma path)
#pragma unroll 1
        for (int n = 0; n < 4; n++) {
            const int b = 4 * wg + n;
            const uint64_t boff = (uint64_t)((b * SM90_BLOCK_BYTES) >> 4);
            float c[32]; // dKV[key r0 | r1][64 b + 8 j + cq + {0,1}] = c[4 j + {0,1 | 2,3}]
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < SM90_HEAD_GROUP / 16; kk++)
                wgmma_m64n64k16_bf16<1, 1>(c, desc_dst + kk * 128, desc_qn + boff + kk * 128, kk > 0);
#pragma unroll
            for (int kk = 0; kk < SM90_HEAD_GROUP / 16; kk++)
                wgmma_m64n64k16_bf16<1, 1>(c, desc_pt + kk * 128, desc_don + boff + kk * 128, 1);
            wgmma_commit();
            wgmma_wait_all();
            fence_regs(c);
            scatter_chunk(dst_row + 64 * b, c, my_key, odd);
        }
        if (wg == 0) { // the rope chunk (key term only): 4 more steps here against 10% more reductions if split
            const uint64_t boff = (uint64_t)((8 * SM90_BLOCK_BYTES) >> 4);
            float c[32];
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < SM90_HEAD_GROUP / 16; kk++)
                wgmma_m64n64k16_bf16<1, 1>(c, desc_dst + kk * 128, desc_qn + boff + kk * 128, kk > 0);
            wgmma_commit();
            wgmma_wait_all();
            fence_regs(c);
            scatter_chunk(dst_row + 64 * 8, c, my_key, odd);
        }
        cp_async_wait_all();
        fence_proxy_async();
        __syncthreads(); // the next tile and its keys visible; P and dS free
    }

    // rope columns: warpgroup 1's half through shared memory (Q's space, free now) to warpgroup 0
    float *xch = (float *)smem;
    if (wg == 1) {
#pragma unroll
        for (int i = 0; i < 32; i++)
            xch[i * 128 + tid - 128] = dqr[i];
    }
    __syncthreads();
    const bool live0 = row_live(r0), live1 = row_live(r1); // padding rows are not written
    bf16 *dq0 = dq + (t * n_heads + h0 + r0) * SM90_DQK + cq, *dq1 = dq + (t * n_heads + h0 + r1) * SM90_DQK + cq;
#pragma unroll
    for (int j = 0; j < 32; j++) {
        if (live0)
            *(__nv_bfloat162 *)(dq0 + 256 * wg + 8 * j) = __floats2bfloat162_rn(dqa[4 * j], dqa[4 * j + 1]);
        if (live1)
            *(__nv_bfloat162 *)(dq1 + 256 * wg + 8 * j) = __floats2bfloat162_rn(dqa[4 * j + 2], dqa[4 * j + 3]);
    }
    if (wg == 0) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float a0 = dqr[4 * j] + xch[(4 * j) * 128 + tid], a1 = dqr[4 * j + 1] + xch[(4 * j + 1) * 128 + tid];
            const float b0 = dqr[4 * j + 2] + xch[(4 * j + 2) * 128 + tid];
            const float b1 = dqr[4 * j + 3] + xch[(4 * j + 3) * 128 + tid];
            if (live0)
                *(__nv_bfloat162 *)(dq0 + SM90_DV + 8 * j) = __floats2bfloat162_rn(a0, a1);
            if (live1)
                *(__nv_bfloat162 *)(dq1 + SM90_DV + 8 * j) = __floats2bfloat162_rn(b0, b1);
        }
    }
#else
    __trap();
#endif
}

/* The shapes and device the kernel serves (compute capability 9.0, bf16 storage, GLM-5 dims, aligned rows). */
static int backward_sm90_serves(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                const dsarl_dsa_attention_inputs *in, int32_t topk, const void *out, const void *dout,
                                const void *dq, const float *dkv_acc, int *serves, dsarl_error *err)
{
    *serves = 0;
    if (ctx->f32 || in->d_qk != SM90_DQK || in->d_v != SM90_DV || topk <= 0 || ((uintptr_t)in->q % 16) ||
        ((uintptr_t)in->kv % 16) || ((uintptr_t)out % 16) || ((uintptr_t)dout % 16) || ((uintptr_t)dq % 4) ||
        ((uintptr_t)dkv_acc % 16) || batch->n_queries > 0x7fffffff || ctx->settings.sparse_mla != TILELANG_MLA_AUTO)
        return DSARL_OK;
    return sm90_device(serves, err);
}

/* C linkage: the dispatch (sparse_mla_backward.cu) and the test (check_dsa_mla_bwd_sm90.c) call it. dq written,
 * the key gradient added into the fp32 accumulator dkv_acc (Tk, 576); *used = 0 without launching when the
 * operands do not fit (other dims or storage, a last head group under 16 heads, unaligned rows, not compute 9.0).
 * One block per (query, 64 heads). */
extern "C" int tilelang_sparse_mla_backward_sm90(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                                 const dsarl_dsa_attention_inputs *in, const int32_t *indices,
                                                 int32_t topk, const void *out, const float *lse, const void *dout,
                                                 void *dq, float *dkv_acc, int *used, dsarl_error *err)
{
    *used = 0;
    int serves = 0;
    DSARL_TRY(backward_sm90_serves(ctx, batch, in, topk, out, dout, dq, dkv_acc, &serves, err));
    if (!serves || !tilelang_sparse_mla_sm90_head_groups(in->n_heads))
        return DSARL_OK;
    *used = 1;
    if (batch->n_queries == 0)
        return DSARL_OK;
    dim3 grid((unsigned int)batch->n_queries, (unsigned int)tilelang_sparse_mla_sm90_head_groups(in->n_heads));
    const float scale_log2 = in->softmax_scale * 1.4426950408889634f; /* logits in log2 units for exp2 */
    tlSharedLimit(sparse_mla_backward_sm90_kernel<false>, BW_SHARED, err);
    sparse_mla_backward_sm90_kernel<false><<<grid, BW_THREADS, BW_SHARED, TL_STREAM(ctx)>>>(
        (bf16 *)dq, dkv_acc, (const bf16 *)in->q, (const bf16 *)in->kv, indices, (const bf16 *)out, lse,
        (const bf16 *)dout, topk, in->n_heads, batch->n_keys, in->softmax_scale, scale_log2, NULL, NULL, 0, 0);
    tlCheckLaunch("sparse_mla_backward (sm90 wgmma)", err);
    return DSARL_OK;
}

extern "C" int tilelang_sparse_mla_query_group(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                               const dsarl_dsa_attention_inputs *in, int32_t topk, int *group,
                                               dsarl_error *err)
{
    const int h = in->n_heads;
    *group = 0;
    if (!ctx->settings.query_groups || (h != 8 && h != 16 && h != 32) || batch->n_keys >= ((int64_t)1 << 29) ||
        (int64_t)(SM90_HEAD_GROUP / h) * topk > TILELANG_QUERY_UNION_MAX)
        return DSARL_OK;
    int serves = 0; /* alignment aside (the grouped launch checks it again) */
    DSARL_TRY(backward_sm90_serves(ctx, batch, in, topk, in->q, in->q, in->q, (const float *)in->q, &serves, err));
    *group = serves ? SM90_HEAD_GROUP / h : 0;
    return DSARL_OK;
}

extern "C" int tilelang_sparse_mla_backward_sm90_grouped(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                                         const dsarl_dsa_attention_inputs *in, int32_t topk,
                                                         int group, const int32_t *union_keys,
                                                         const uint8_t *union_mask, const int32_t *union_len,
                                                         const void *out, const float *lse, const void *dout,
                                                         void *dq, float *dkv_acc, int *used, dsarl_error *err)
{
    *used = 0;
    int serves = 0;
    DSARL_TRY(backward_sm90_serves(ctx, batch, in, topk, out, dout, dq, dkv_acc, &serves, err));
    if (!serves || group <= 1 || group * in->n_heads != SM90_HEAD_GROUP)
        return DSARL_OK;
    *used = 1;
    const int64_t groups = (batch->n_queries + group - 1) / group;
    if (groups == 0)
        return DSARL_OK;
    const float scale_log2 = in->softmax_scale * 1.4426950408889634f;
    tlSharedLimit(sparse_mla_backward_sm90_kernel<true>, BW_SHARED, err);
    sparse_mla_backward_sm90_kernel<true><<<(unsigned int)groups, BW_THREADS, BW_SHARED, TL_STREAM(ctx)>>>(
        (bf16 *)dq, dkv_acc, (const bf16 *)in->q, (const bf16 *)in->kv, union_keys, (const bf16 *)out, lse,
        (const bf16 *)dout, group * topk, SM90_HEAD_GROUP, batch->n_keys, in->softmax_scale, scale_log2, union_mask,
        union_len, in->n_heads, batch->n_queries * in->n_heads);
    tlCheckLaunch("sparse_mla_backward (sm90 wgmma, query groups)", err);
    return DSARL_OK;
}
