/* tilelang.h: internals of the tilelang DSA backend: hand-written tiled CUDA kernels in TileLang's style for every
 * op of dsarl/ops/dsa.h, on the cuda device (bf16 storage, fp32 math and accumulation).
 *
 * C declarations only (included by the ops table, the entry and the tests). Every kernel, memset and copy runs on
 * the stream the device hands out (dsarl_device_ops.stream, ABI 1.2), so the model's device ops and this backend's
 * kernels are ordered on one stream; a device without the slot leaves the legacy default stream (NULL).
 *
 * What the kernels are (their measured rates on the H200 are in docs/performance.md; the paths and the keys that
 * force them in docs/gpu.md):
 * - indexer_topk (indexer_fast.cuh): bf16 with 8/16/32/64 heads and 16-multiple head dims runs two kernels per chunk
 *   of query rows: query tiles (8 warps x 64 query-head columns) scored against 64-key tiles read once per tile
 *   (cp.async double buffer, ldmatrix + mma.sync m16n8k16, fp32 accumulators; ReLU, head weights and the head sum
 *   in registers) into a workspace of order-preserving keys (eligible part only; rows with <= k keys skipped when
 *   no scores are wanted), then one block per row: an exact 4-pass radix select (warp-aggregated histograms, the
 *   row in shared memory) and an ordered compaction, ties to the lower key index; key order without scores, a
 *   bitonic sort into descending order with them. Other storage/shapes keep the fused row-wise kernel (one block
 *   per row, WMMA or CUDA-core scores, the same select). Fast path: wgmma with the epilogue overlapped (mma.sync
 *   leaves ReLU, weights, the head reduction and the stores on the issue slots of the warps that feed the tensor
 *   cores), and the select fused into the scoring blocks.
 * - sparse_mla_forward: bf16 at GLM-5 dims (d_qk 576, d_v 512, heads in groups of 64) on Hopper runs the wgmma
 *   kernel (sparse_mla_forward_sm90.cu, FlashMLA's sparse prefill shape): one block of two warpgroups per (query,
 *   64 heads), Q resident in shared memory, the top-k in tiles of 64 latent rows gathered by cp.async into two
 *   swizzled buffers (the next tile lands while this one is computed); warpgroup 0 owns S = Q K^T and the online
 *   softmax, both warpgroups add P V into their halves of O held in registers. Its limit: the in-tile chain
 *   S -> softmax -> P V (no warpgroup ping-pong yet), then the gather. Other shapes, and GPUs without wgmma: one
 *   block per (query, group of 32 / 16 heads) with WMMA 16x16x16 products, or CUDA-core fp32 kernels for other
 *   dims and float32 storage.
 * - sparse_mla_backward: one block per (query, group of 16 heads); the selected KV rows go through shared memory in
 *   tiles of 64 and are reused by every head of the group; WMMA 16x16x16 bf16 products with fp32 accumulation
 *   (CUDA-core fp32 kernels for other dims and float32 storage); dq in shared fp32 and dkv accumulated with fp32
 *   atomics at the selected rows. bf16 at GLM-5 dims on Hopper takes the wgmma kernel instead
 *   (sparse_mla_backward_sm90.cu, the forward's shape): one block of two warpgroups per (query, 64 heads), Q and dO
 *   resident in shared memory, per tile of 64 keys S and dP by wgmma (one warpgroup each), P and dS in bf16, dQ in
 *   registers for the whole top-k, and the tile's dKV (64 keys x 576, summed over the 64 heads in the tensor cores)
 *   sent with 16-byte red.global.add.v4.f32 reductions into the fp32 accumulator; the next tile is gathered while
 *   dKV is computed. Both sm90 kernels pad a last group of 16-63 heads with zero rows;
 *   runtime.tilelang_sparse_mla=wmma takes the WMMA kernels, =cuda_core the CUDA-core ones.
 * - indexer loss: one block per query row; the set's target and indexer distributions in a per-block workspace. */
#ifndef DSARL_DSA_TILELANG_H
#define DSARL_DSA_TILELANG_H

#include "dsarl/ops/dsa.h"

DSARL_BEGIN_DECLS

/* The ops table registered as (dsa, "tilelang"). */
extern const dsarl_dsa_ops dsarl_dsa_tilelang_ops;

/* Kernel choices (runtime.tilelang_* recipe keys, read once at create; docs/gpu.md). */
typedef enum tilelang_mla_kernels {
    TILELANG_MLA_AUTO = 0,      /* wgmma on sm_90 where it applies, else WMMA where shapes fit, else CUDA cores */
    TILELANG_MLA_WMMA = 1,      /* never the wgmma kernels: the portable tensor-core path of other GPUs */
    TILELANG_MLA_CUDA_CORE = 2, /* CUDA-core fp32 kernels only */
} tilelang_mla_kernels;
typedef enum tilelang_indexer_kernels {
    TILELANG_INDEXER_AUTO = 0,      /* mma.sync query tiles + radix select where shapes fit, else row-wise */
    TILELANG_INDEXER_ROWWISE = 1,   /* the fused row-wise kernel (WMMA scores where shapes fit) */
    TILELANG_INDEXER_CUDA_CORE = 2, /* the fused row-wise kernel with CUDA-core scores */
} tilelang_indexer_kernels;

typedef struct tilelang_settings {
    tilelang_mla_kernels sparse_mla;
    tilelang_indexer_kernels indexer;
    int select_threads;    /* 512 (default) or 256 (per-warp first histograms) for the radix select */
    int score_warps;       /* 8 (default) or 4 warps per query tile of the mma.sync indexer scores */
    int64_t indexer_chunk; /* query rows per workspace chunk of the two-kernel indexer; 0 = from the budget */
    int query_groups;      /* sm_90 backward at 8/16/32 heads: one block per 64 / H queries (1) or per query (0) */
    int forward_groups;    /* the same for the forward of packed batches (1), off by default (0) */
} tilelang_settings;

/* The recipe keys of the tilelang backend; the cudnn backend, which hands shapes over to tilelang, declares them
 * too (the same text), so a recipe that selects cudnn may set them. */
#define TILELANG_KEY_SPECS                                                                                       \
    {.path = "runtime.tilelang_sparse_mla", .type = DSARL_KEY_STRING, .default_value = "auto",                  \
     .doc = "tilelang sparse MLA kernels: auto (wgmma on sm_90 at 576/512 bf16, else WMMA) | wmma | cuda_core"}, \
    {.path = "runtime.tilelang_indexer", .type = DSARL_KEY_STRING, .default_value = "auto",                     \
     .doc = "tilelang indexer_topk kernels: auto (mma.sync tiles + radix select) | rowwise | cuda_core"},       \
    {.path = "runtime.tilelang_select_threads", .type = DSARL_KEY_INT, .default_value = "512",                  \
     .doc = "threads per row of the indexer radix select: 512 | 256 (per-warp first histograms)"},              \
    {.path = "runtime.tilelang_score_warps", .type = DSARL_KEY_INT, .default_value = "8",                       \
     .doc = "warps per query tile of the mma.sync indexer scores: 8 | 4"},                                      \
    {.path = "runtime.tilelang_indexer_chunk", .type = DSARL_KEY_INT, .default_value = "0",                     \
     .doc = "query rows per indexer workspace chunk (64 or more; 0 = as many as 256 MiB of scores hold)"},      \
    {.path = "runtime.tilelang_mla_query_groups", .type = DSARL_KEY_BOOL, .default_value = "true",              \
     .doc = "sm_90 sparse MLA backward at 8/16/32 heads: one block per 64/H queries over their keys' union"},    \
    {.path = "runtime.tilelang_mla_forward_query_groups", .type = DSARL_KEY_BOOL, .default_value = "false",     \
     .doc = "the same for the forward of packed batches (measured slower where queries share few keys)"}

/* Reads and checks the runtime.tilelang_* keys of recipe (NULL: the defaults); one sentence naming a bad key. */
int tilelang_read_settings(const dsarl_node *recipe, tilelang_settings *out, dsarl_error *err);

/* Appends the settings as one line for describe/routes output ("runtime.tilelang_sparse_mla=auto ..."). */
void tilelang_format_settings(const tilelang_settings *s, char *buf, size_t size);

struct dsarl_dsa_context {
    int f32;                /* the device stores float32 (runtime.cuda_storage_dtype=f32); else bf16 */
    void *stream;           /* cudaStream_t every launch uses: the device's (dsarl_device_ops.stream), or NULL */
    tilelang_settings settings;
    int sm_count;
    void *workspace;        /* device bytes: per-block rows and fp32 key-gradient accumulators (grows) */
    size_t workspace_bytes;
};

/* Blocks per query of the sm_90 sparse MLA kernels for n_heads heads, or 0 when they do not take that count. Heads
 * go in groups of 64 (the M of every wgmma); a last group with fewer is padded with zero rows that are never stored,
 * so it must hold at least 16 real heads (16 heads do 4x the products yet still run far faster than the WMMA kernel:
 * docs/performance.md). The cudnn backend routes by it too. */
#define TILELANG_SM90_HEAD_GROUP 64     /* heads per block of the sm_90 sparse MLA kernels */
#define TILELANG_SM90_MIN_LAST_GROUP 16 /* fewest real heads in a padded last group */
#define TILELANG_QUERY_UNION_MAX 16384  /* most slots (queries per group x topk) a query group's key list takes */
static inline int tilelang_sparse_mla_sm90_head_groups(int n_heads)
{
    const int rest = n_heads % TILELANG_SM90_HEAD_GROUP;
    if (n_heads <= 0 || (rest != 0 && rest < TILELANG_SM90_MIN_LAST_GROUP))
        return 0;
    return (n_heads + TILELANG_SM90_HEAD_GROUP - 1) / TILELANG_SM90_HEAD_GROUP;
}

/* The stream of a device instance (dsarl_device_ops.stream, ABI 1.2), or NULL (legacy default stream) when the
 * ops are NULL or older than 1.2. */
void *tilelang_device_stream(const dsarl_device_ops *device_ops, dsarl_device *dev);

/* Device workspace of at least bytes (valid until the next call on ctx). */
int tilelang_workspace(dsarl_dsa_context *ctx, size_t bytes, void **out, dsarl_error *err);

/* Host-side argument checks, one sentence naming the argument and what would be valid. */
int tilelang_check_batch(const char *op, const dsarl_dsa_batch *batch, dsarl_error *err);
int tilelang_check_attention(const char *op, const dsarl_dsa_attention_inputs *in, dsarl_error *err);
int tilelang_check_indexer(const char *op, const dsarl_dsa_indexer_inputs *in, dsarl_error *err);

int tilelang_create(const dsarl_device_ops *device_ops, dsarl_device *dev, const dsarl_node *recipe,
                    dsarl_dsa_context **out, dsarl_error *err);
void tilelang_destroy(dsarl_dsa_context *ctx);
int tilelang_indexer_topk(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, const dsarl_dsa_indexer_inputs *in,
                          int32_t topk, int32_t *indices, float *scores, dsarl_error *err);
int tilelang_sparse_mla_forward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk, void *out,
                                float *lse, dsarl_error *err);
int tilelang_sparse_mla_backward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                 const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk,
                                 const void *out, const float *lse, const void *dout, void *dq, void *dkv,
                                 dsarl_error *err);
int tilelang_indexer_loss_forward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                  const dsarl_dsa_attention_inputs *attn, const float *lse,
                                  const dsarl_dsa_indexer_inputs *indexer, const int32_t *indices, int32_t topk,
                                  float *loss, dsarl_error *err);
int tilelang_indexer_loss_backward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                   const dsarl_dsa_attention_inputs *attn, const float *lse,
                                   const dsarl_dsa_indexer_inputs *indexer, const int32_t *indices, int32_t topk,
                                   const float *dloss, void *dq_index, void *dk_index, float *dweights,
                                   dsarl_error *err);

DSARL_END_DECLS

#endif /* DSARL_DSA_TILELANG_H */
