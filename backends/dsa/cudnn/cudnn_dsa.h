/* cudnn_dsa.h: internals of the cudnn DSA backend: DeepSeek Sparse Attention through cuDNN 9.19's C backend API
 * (cudnnBackend* graphs) on the cuda device, with plain hand-overs to the tilelang kernels where cuDNN has no route.
 *
 * What cuDNN 9.19 can express for DSA on sm_90 was measured on the H200 (docs/gpu.md); the routes this backend
 * takes follow from it (the exact table is CDN_ROUTES below, printed by `dsarl plugins` and logged once per run):
 * - headwise (per-head, non-absorbed) attention, forward and backward: the composite causal SDPA pattern graph
 *   (matmul, scale, [+bias], causal select, softmax with Stats, matmul), which cuDNN's fused-attention engines
 *   match. Segments no longer than index_topk attend densely (DSA selects every earlier key there), so the plain
 *   causal graph is exact; longer segments add a bf16 bias [B,1,S,S] that is 0 on the selected keys and -1e9
 *   elsewhere (built by our kernel from the indices). Segments longer than CDN_MAX_SEGMENT are not served.
 *   Packed segments are gathered into a zero-padded [B, S, H, d] buffer per (length bucket, bias) group, S and B
 *   rounded up to powers of two so a handful of plans serve every pack: causality keeps real queries off the
 *   padded keys, and padded queries carry dO = 0, so they add exactly nothing to dK/dV.
 * - absorbed sparse MLA forward: SDPA_FWD with block-size-1 page tables (the page-table row of a query token is
 *   its compacted top-k list, seq_len_kv its valid count), the heads packed as query rows, Stats giving the lse;
 *   rows without a valid index are written outside cuDNN (out 0, lse +inf). At GLM-5's 576/512 with 64-head
 *   groups (or a padded last group of 16 or more) tilelang's wgmma kernel is several times faster
 *   (docs/performance.md), so that case is handed over (runtime.cudnn_paged_forward=true forces the paged graph).
 * - everything else (absorbed backward, indexer top-k, indexer loss): hand-over to the tilelang backend, whose ops
 *   table create finds in the registry (a tilelang context made with the same device and recipe), so its
 *   improvements reach this backend without a change here; create refuses when tilelang is not loaded.
 *
 * Streams: the handle (cudnnSetStream), our kernels, our copies and the tilelang context all use the device's stream
 * (dsarl_device_ops.stream, ABI 1.2), so device work and DSA work are ordered on one stream.
 * Plans are cached by shape (every engine compiles kernels at plan time); the softmax scale is a by-value scalar, so
 * a new scale needs no new plan. Workspace comes from the cuda device's alloc op and grows as needed. */
#ifndef DSARL_DSA_CUDNN_H
#define DSARL_DSA_CUDNN_H

#include <stddef.h>
#include <stdint.h>
#include "dsarl/ops/dsa.h"

DSARL_BEGIN_DECLS

/* Longest segment the headwise graphs serve (dsa_attention_form: headwise), with or without the bias (the default of
 * runtime.cudnn_max_segment). The fused backward takes a dP workspace of 2 H S^2 bytes (8 GiB at 8192 with 64
 * heads; far more past it), and past 8192 the bias graph's useful rate falls (docs/performance.md), while the
 * absorbed path keeps O(T k) memory. Longer segments make preferred_form answer ABSORBED. */
#define CDN_MAX_SEGMENT 8192
/* Segments of one length bucket per launch: their dP workspaces together stay under this many bytes. */
#define CDN_DP_WORKSPACE_CAP ((int64_t)8 << 30)
#define CDN_STR_(x) #x
#define CDN_STR(x) CDN_STR_(x)

/* One route per line, "op | sizes | engine": what the code below does, op by op. */
#define CDN_ROUTES                                                                                                   \
    "headwise_attention_forward/backward | causal segment <= index_topk (or indices NULL), <= " CDN_STR(              \
        CDN_MAX_SEGMENT) " tokens | cuDNN composite causal SDPA graph (fused fwd + bwd; d_qk, d_v <= 256, multiples " \
    "of 8)\n"                                                                                                        \
    "headwise_attention_forward/backward | index_topk < segment <= " CDN_STR(CDN_MAX_SEGMENT) " | cuDNN composite "   \
    "causal SDPA graph + additive top-k bias [B,1,S,S] (0 selected, -1e9 elsewhere)\n"                              \
    "headwise_attention_forward/backward | segment > " CDN_STR(CDN_MAX_SEGMENT) " | not served (an error naming "    \
    "the segment; use the absorbed form)\n"                                                                           \
    "sparse_mla_forward | absorbed 576/512, heads in groups of 64 (a last group of >= 16 padded), bf16 | hand-over: " \
    "tilelang (its sm_90 wgmma kernel is several times faster than cuDNN's paged graph here; "                 \
    "runtime.cudnn_paged_forward=true takes the graph)\n"                                                            \
    "sparse_mla_forward | other absorbed dims (d_qk, d_v multiples of 8, heads and k multiples of 4), bf16 | cuDNN " \
    "SDPA_FWD with page tables of block size 1 (one per query token = its top-k), heads as query rows, Stats = "    \
    "lse; rows with no index set by our kernel\n"                                                                   \
    "sparse_mla_forward | float32 storage, other head/k counts, or no cuDNN plan | hand-over: tilelang (logged)\n"  \
    "sparse_mla_backward | absorbed, every size | hand-over: tilelang (cuDNN 9.19 has no 576/512 and no sparse "     \
    "backward)\n"                                                                                                    \
    "indexer_topk | every size | hand-over: tilelang (cuDNN 9.19 has no top-k)\n"                                   \
    "indexer_loss_forward/backward | every size | hand-over: tilelang\n"                                            \
    "preferred_form | every batch | absorbed: one form for training and generation (mixed forms measured "        \
    "token_mult_prob_error above the 1.001 bound); the headwise routes run when the recipe sets "                  \
    "dsa_attention_form: headwise\n"

/* The ops table registered as (dsa, "cudnn"). */
extern const dsarl_dsa_ops dsarl_dsa_cudnn_ops;

typedef struct cdn_plan cdn_plan;   /* a finalized execution plan and the uids its variant pack needs */
typedef struct cudnn_dsa cudnn_dsa; /* this backend's context; the ops receive it as dsarl_dsa_context * */

struct cudnn_dsa {
    const dsarl_device_ops *device_ops; /* workspace allocator (NULL: the caller passed raw device arrays) */
    dsarl_device *dev;
    int f32;                            /* the device stores float32 (runtime.cuda_storage_dtype=f32) */
    void *handle;                       /* cudnnHandle_t on the legacy default stream */
    const dsarl_dsa_ops *tl;            /* tilelang's ops table, found through the registry at create */
    dsarl_dsa_context *tilelang;        /* the hand-over target (tilelang's own context) */
    cdn_plan **plans;                   /* cache, searched by key */
    int n_plans, cap_plans;
    void *workspace;                    /* device bytes (grows) */
    size_t workspace_bytes;
    int32_t *host_segments;             /* host staging of (offset, length) pairs */
    size_t host_segments_cap;
    void *stream;                       /* cudaStream_t of the device (dsarl_device_ops.stream), or NULL */
    int32_t max_segment;                /* runtime.cudnn_max_segment (CDN_MAX_SEGMENT; bench, tests move it) */
    int paged_forced;                   /* runtime.cudnn_paged_forward: the paged graph even where tilelang wins */
    int64_t dp_workspace_cap;           /* runtime.cudnn_dp_workspace_cap (CDN_DP_WORKSPACE_CAP; tests shrink it) */
    int paged_handovers;                /* times the absorbed forward was refused by the paged graph (each logged) */
    char paged_refused[64];             /* dims ("H d_qk d_v k") the paged graph refused: not asked again */
    double plan_build_ms;               /* total time spent building plans (reported by the tests) */
    int plans_built;
};

static inline cudnn_dsa *cdn_ctx(dsarl_dsa_context *ctx) { return (cudnn_dsa *)(void *)ctx; }

/* The smallest power of two >= x (plans are built for power-of-two sizes, so a few serve every batch). */
static inline int64_t next_pow2(int64_t x)
{
    int64_t p = 1;
    while (p < x)
        p <<= 1;
    return p;
}

/* x rounded up to 256 bytes: workspace carving keeps every tensor cuDNN-aligned. */
static inline size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

/* --- context (context.c) --------------------------------------------------------------------------------------- */
/* The host of the registry that loaded this plugin (set by its init; tests that link the objects set it from a
 * registry of their own). The plugin's one static: create finds the tilelang table through it. */
void cdn_set_host(const dsarl_host *host);
/* Host-side argument checks, one sentence naming the argument and what would be valid. */
int cdn_check_batch(const char *op, const dsarl_dsa_batch *batch, dsarl_error *err);
int cdn_check_attention(const char *op, const dsarl_dsa_attention_inputs *in, dsarl_error *err);
int cdn_create(const dsarl_device_ops *device_ops, dsarl_device *dev, const dsarl_node *recipe,
               dsarl_dsa_context **out, dsarl_error *err);
void cdn_destroy(dsarl_dsa_context *ctx);
/* Device workspace of at least bytes (valid until the next call on the context; growing synchronizes first). */
int cdn_workspace(cudnn_dsa *c, size_t bytes, void **out, dsarl_error *err);
dsarl_dsa_form cdn_preferred_form(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, int32_t topk);

/* --- graphs and plans (graph.c, sdpa_graphs.c) ------------------------------------------------------------------ */
/* Tensor uids of the graphs below (the variant pack binds device pointers to them). */
enum {
    CDN_Q = 1, CDN_K, CDN_V, CDN_O, CDN_STATS, CDN_SCALE, CDN_BIAS, CDN_NEG_INF, CDN_DO, CDN_DQ, CDN_DK, CDN_DV,
    CDN_SOFTMAX_SUM, CDN_ONE, CDN_PAGE_K, CDN_PAGE_V, CDN_SEQ_Q, CDN_SEQ_KV, CDN_N_UIDS
};

/* The composite causal SDPA graph on zero-padded [B, S, H, d] buffers (BSHD), forward or backward, with or without
 * the additive top-k bias; built once per shape and cached. */
typedef struct cdn_headwise_shape {
    int64_t batch, seq, heads, d_qk, d_v;
    int bias, backward;
} cdn_headwise_shape;
int cdn_headwise_plan(cudnn_dsa *c, const cdn_headwise_shape *shape, cdn_plan **out, dsarl_error *err);

/* SDPA_FWD with block-size-1 page tables over a shared latent pool: n query tokens, each with `heads` query rows
 * of d_qk, attending its page-table row of topk pool entries (pool of `pages` rows, V = first d_v columns). */
typedef struct cdn_paged_shape {
    int64_t tokens, heads, d_qk, d_v, topk, pages;
} cdn_paged_shape;
int cdn_paged_plan(cudnn_dsa *c, const cdn_paged_shape *shape, cdn_plan **out, dsarl_error *err);

/* Workspace bytes a plan needs; runs it with ptrs[uid] bound for every uid it uses (host pointers for by-value
 * scalars). */
int64_t cdn_plan_workspace(const cdn_plan *plan);
int cdn_plan_execute(cudnn_dsa *c, const cdn_plan *plan, void *const ptrs[CDN_N_UIDS], void *workspace,
                     dsarl_error *err);
void cdn_plan_free(cdn_plan *plan);

/* --- ops (headwise.c, absorbed.c) -------------------------------------------------------------------------------- */
int cdn_headwise_forward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, const dsarl_dsa_headwise_inputs *in,
                         const int32_t *indices, int32_t topk, void *out, float *lse, dsarl_error *err);
int cdn_headwise_backward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, const dsarl_dsa_headwise_inputs *in,
                          const int32_t *indices, int32_t topk, const void *out, const float *lse, const void *dout,
                          void *dq, void *dk, void *dv, dsarl_error *err);
int cdn_sparse_mla_forward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                           const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk, void *out,
                           float *lse, dsarl_error *err);
int cdn_sparse_mla_backward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                            const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk,
                            const void *out, const float *lse, const void *dout, void *dq, void *dkv,
                            dsarl_error *err);
int cdn_indexer_topk(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, const dsarl_dsa_indexer_inputs *in,
                     int32_t topk, int32_t *indices, float *scores, dsarl_error *err);
int cdn_indexer_loss_forward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                             const dsarl_dsa_attention_inputs *attn, const float *lse,
                             const dsarl_dsa_indexer_inputs *indexer, const int32_t *indices, int32_t topk,
                             float *loss, dsarl_error *err);
int cdn_indexer_loss_backward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                              const dsarl_dsa_attention_inputs *attn, const float *lse,
                              const dsarl_dsa_indexer_inputs *indexer, const int32_t *indices, int32_t topk,
                              const float *dloss, void *dq_index, void *dk_index, float *dweights, dsarl_error *err);

/* --- our kernels (kernels.cu), each on stream (the context's) ---------------------------------------------------- */
/* segments: device (n_entries, 2) int32 (offset, length) pairs; an entry of length 0 is padding.
 * dst (n_entries, S, row) bf16 = src rows [offset, offset + length) of a packed (T, row) array, zeros past length;
 * src is float32 when src_f32, else bf16. */
int cdn_gather_segments(void *stream, void *dst, const void *src, int src_f32, const int32_t *segments, int n_entries,
                        int64_t S, int64_t row, dsarl_error *err);
/* The inverse: packed dst rows [offset, offset + length) = src (n_entries, S, row) bf16 (dst float32 when dst_f32). */
int cdn_scatter_segments(void *stream, void *dst, int dst_f32, const void *src, const int32_t *segments,
                         int n_entries, int64_t S, int64_t row, dsarl_error *err);
/* lse (T, H) from / to stats (n_entries, H, S) float32 (padding rows of stats get 0 when gathering). */
int cdn_scatter_stats(void *stream, float *lse, const float *stats, const int32_t *segments, int n_entries, int64_t S,
                      int64_t H, dsarl_error *err);
int cdn_gather_stats(void *stream, float *stats, const float *lse, const int32_t *segments, int n_entries, int64_t S,
                     int64_t H, dsarl_error *err);
/* bias (n_entries, S, S) bf16: row r of a segment is 0 on every key when r + 1 <= topk (DSA keeps every eligible key
 * there) or r >= length (padding), else 0 on the keys its indices row selects (absolute positions) and -1e9
 * elsewhere. indices (T, topk). */
int cdn_build_bias(void *stream, void *bias, const int32_t *indices, int32_t topk, const int32_t *segments,
                   int n_entries, int64_t S, dsarl_error *err);
/* Page tables for the paged forward: table (T, topk) = each row's valid indices moved to the front (order kept),
 * the rest repeating the first valid one (or 0); seq_kv (T) = the valid count (at least 1); seq_q (T) = heads. */
int cdn_compact_indices(void *stream, int32_t *table, int32_t *seq_kv, int32_t *seq_q, const int32_t *indices,
                        int64_t T, int32_t topk, int32_t heads, dsarl_error *err);
/* Rows whose indices are all -1: out (T, H, d_v) bf16 row = 0, lse (T, H) = +inf. */
int cdn_fix_empty_rows(void *stream, void *out, float *lse, const int32_t *indices, int64_t T, int32_t topk,
                       int32_t heads, int32_t d_v, dsarl_error *err);

DSARL_END_DECLS

#endif /* DSARL_DSA_CUDNN_H */
