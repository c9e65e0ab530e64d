/* headwise.c: per-head (non-absorbed) attention over a causal packed batch through the composite cuDNN graphs.
 *
 * Segments (host_cu_seqlens) are grouped by (length bucket S, needs the top-k bias); a group of n segments becomes a
 * zero-padded [B = next_pow2(n), S, H, d] batch (S = next power of two >= the length, at least 64), so a few plans
 * serve every pack. A group holds at most as many segments as keep the backward's dP workspace (2 H S^2 bytes per
 * segment) under CDN_DP_WORKSPACE_CAP; more segments of one bucket run as several launches of the same plan. Why the padding is exact: causality keeps every real query off the padded keys that follow it;
 * padded queries only ever feed their own discarded outputs in the forward, and in the backward they carry dO = 0
 * (so softmax_sum = 0 and dP = 0), which makes their P^T dO and dS exactly zero: they add nothing to dK or dV.
 * A segment needs the bias when indices are given and it is longer than topk; rows r + 1 <= topk keep every key. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "graph.h"

#define MAX_GROUPS 64

typedef struct group {
    int64_t S;
    int bias;
    int n, n_padded;       // segments, entries after padding to a power of two
    int table_offset;      // first (offset, length) pair of this group in the uploaded table
    cdn_plan *plan;
} group;

static int check_inputs(const char *op, const cudnn_dsa *c, const dsarl_dsa_batch *batch,
                        const dsarl_dsa_headwise_inputs *in, const int32_t *indices, int32_t topk, dsarl_error *err)
{
    if (!c)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa cudnn %s: the context is NULL; create it first", op);
    if (!batch || !batch->host_cu_seqlens || batch->n_segments <= 0 || batch->n_queries != batch->n_keys)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa cudnn %s: the batch must be a causal pack with host_cu_seqlens "
                          "and n_segments > 0 (n_queries == n_keys); decode batches use the absorbed ops", op);
    const int32_t *cu = batch->host_cu_seqlens;
    if (cu[0] != 0 || cu[batch->n_segments] != batch->n_queries)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa cudnn %s: host_cu_seqlens must start at 0 and end at n_queries "
                          "(%lld), got %d .. %d", op, (long long)batch->n_queries, cu[0], cu[batch->n_segments]);
    for (int32_t i = 0; i < batch->n_segments; i++)
        if (cu[i + 1] < cu[i])
            return DSARL_FAIL(err, DSARL_E_INVALID, "dsa cudnn %s: host_cu_seqlens must not decrease (segment %d: "
                              "%d -> %d)", op, i, cu[i], cu[i + 1]);
    if (!in || !in->q || !in->k || !in->v || in->n_heads <= 0 || !isfinite(in->softmax_scale))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa cudnn %s: headwise inputs need q, k, v, n_heads > 0 and a "
                          "finite softmax_scale", op);
    if (in->d_qk < 8 || in->d_qk > 256 || in->d_qk % 8 || in->d_v < 8 || in->d_v > 256 || in->d_v % 8)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "dsa cudnn %s: cuDNN's fused attention graphs need d_qk and d_v "
                          "multiples of 8 in [8, 256], got %d and %d", op, in->d_qk, in->d_v);
    if (indices && topk <= 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa cudnn %s: topk must be positive with indices, got %d", op, topk);
    return DSARL_OK;
}

// Groups the segments, builds (or finds) each group's plan and stages the (offset, length) table on the host.
static int plan_groups(cudnn_dsa *c, const char *op, const dsarl_dsa_batch *batch,
                       const dsarl_dsa_headwise_inputs *in, const int32_t *indices, int32_t topk, int backward,
                       group *groups, int *n_groups, int *table_pairs, dsarl_error *err)
{
    const int32_t *cu = batch->host_cu_seqlens;
    int n = 0;
    int32_t *seg_group = malloc((size_t)batch->n_segments * sizeof(int32_t));
    if (!seg_group)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsa cudnn %s: out of host memory", op);
    for (int32_t i = 0; i < batch->n_segments; i++) {
        int64_t length = cu[i + 1] - cu[i];
        seg_group[i] = -1;
        if (length == 0)
            continue;
        int bias = indices != NULL && length > topk;
        if (length > c->max_segment) {
            free(seg_group);
            return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "dsa cudnn %s: segment %d has %lld tokens, more than the %d "
                              "the cuDNN attention graphs serve (their backward needs 2 H S^2 bytes of workspace); "
                              "use the absorbed form for such batches (dsa_attention_form: auto or absorbed)", op, i,
                              (long long)length, c->max_segment);
        }
        int64_t S = next_pow2(length < 64 ? 64 : length);
        // entries per launch: the backward's dP workspace (2 H S^2 bytes each) stays under the cap
        int64_t per_entry = 2 * (int64_t)in->n_heads * S * S, max_entries = 1;
        while (2 * max_entries * per_entry <= c->dp_workspace_cap)
            max_entries *= 2;
        int g = 0;
        while (g < n && !(groups[g].S == S && groups[g].bias == bias && groups[g].n < max_entries))
            g++;
        if (g == n) {
            if (n == MAX_GROUPS) {
                free(seg_group);
                return DSARL_FAIL(err, DSARL_E_INTERNAL, "dsa cudnn %s: more than %d segment groups", op,
                                  MAX_GROUPS);
            }
            groups[n++] = (group){.S = S, .bias = bias};
        }
        groups[g].n++;
        seg_group[i] = g;
    }
    int pairs = 0;
    for (int g = 0; g < n; g++) {
        groups[g].n_padded = (int)next_pow2(groups[g].n);
        groups[g].table_offset = pairs;
        pairs += groups[g].n_padded;
    }
    if ((size_t)pairs * 2 > c->host_segments_cap) {
        int32_t *grown = realloc(c->host_segments, (size_t)pairs * 2 * sizeof(int32_t));
        if (!grown) {
            free(seg_group);
            return DSARL_FAIL(err, DSARL_E_NOMEM, "dsa cudnn %s: out of host memory", op);
        }
        c->host_segments = grown;
        c->host_segments_cap = (size_t)pairs * 2;
    }
    memset(c->host_segments, 0, (size_t)pairs * 2 * sizeof(int32_t)); // padding entries: offset 0, length 0
    int fill[MAX_GROUPS] = {0};
    for (int32_t i = 0; i < batch->n_segments; i++) {
        int g = seg_group[i];
        if (g < 0)
            continue;
        int32_t *pair = c->host_segments + 2 * (groups[g].table_offset + fill[g]++);
        pair[0] = cu[i];
        pair[1] = cu[i + 1] - cu[i];
    }
    free(seg_group);
    for (int g = 0; g < n; g++) {
        cdn_headwise_shape shape = {.batch = groups[g].n_padded, .seq = groups[g].S, .heads = in->n_heads,
                                    .d_qk = in->d_qk, .d_v = in->d_v, .bias = groups[g].bias, .backward = backward};
        DSARL_TRY(cdn_headwise_plan(c, &shape, &groups[g].plan, err));
    }
    *n_groups = n;
    *table_pairs = pairs;
    return DSARL_OK;
}

// The per-group buffers, carved from one workspace after the segment table.
typedef struct group_buffers {
    void *q, *k, *v, *o, *d_o, *dq, *dk, *dv, *bias, *cudnn;
    float *stats, *softmax_sum;
} group_buffers;

static size_t carve(const group *g, const dsarl_dsa_headwise_inputs *in, int backward, char *base,
                    group_buffers *b)
{
    size_t rows = (size_t)g->n_padded * (size_t)g->S, H = (size_t)in->n_heads;
    size_t qk_bytes = align256(rows * H * (size_t)in->d_qk * 2), v_bytes = align256(rows * H * (size_t)in->d_v * 2);
    size_t stats_bytes = align256(rows * H * 4), off = 0;
#define TAKE(field, bytes)                                          \
    do {                                                            \
        if (base)                                                   \
            b->field = (void *)(base + off);                        \
        off += (bytes);                                             \
    } while (0)
    TAKE(q, qk_bytes);
    TAKE(k, qk_bytes);
    TAKE(v, v_bytes);
    TAKE(o, v_bytes);
    TAKE(stats, stats_bytes);
    if (g->bias)
        TAKE(bias, align256((size_t)g->n_padded * (size_t)g->S * (size_t)g->S * 2));
    if (backward) {
        TAKE(d_o, v_bytes);
        TAKE(dq, qk_bytes);
        TAKE(dk, qk_bytes);
        TAKE(dv, v_bytes);
        TAKE(softmax_sum, stats_bytes);
    }
    TAKE(cudnn, align256((size_t)cdn_plan_workspace(g->plan)));
#undef TAKE
    return off;
}

static int run(dsarl_dsa_context *ctx, const char *op, const dsarl_dsa_batch *batch,
               const dsarl_dsa_headwise_inputs *in, const int32_t *indices, int32_t topk, const void *out,
               const float *lse, const void *dout, void *dq, void *dk, void *dv, int backward, dsarl_error *err)
{
    cudnn_dsa *c = cdn_ctx(ctx);
    DSARL_TRY(check_inputs(op, c, batch, in, indices, topk, err));
    if (batch->n_queries == 0)
        return DSARL_OK;
    group groups[MAX_GROUPS];
    int n_groups = 0, pairs = 0;
    DSARL_TRY(plan_groups(c, op, batch, in, indices, topk, backward, groups, &n_groups, &pairs, err));
    size_t table_bytes = align256((size_t)pairs * 2 * sizeof(int32_t)), need = 0;
    group_buffers b;
    for (int g = 0; g < n_groups; g++) {
        size_t bytes = carve(&groups[g], in, backward, NULL, &b);
        need = bytes > need ? bytes : need;
    }
    void *ws = NULL;
    DSARL_TRY(cdn_workspace(c, table_bytes + need, &ws, err));
    int32_t *table = ws;
    cudaError_t rc = cudaMemcpyAsync(table, c->host_segments, (size_t)pairs * 2 * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, (cudaStream_t)c->stream);
    if (rc != cudaSuccess)
        return DSARL_FAIL(err, DSARL_E_DEVICE, "dsa cudnn %s: uploading the segment table failed: %s", op,
                          cudaGetErrorString(rc));
    const int64_t H = in->n_heads, dqk = in->d_qk, dvv = in->d_v;
    float scale = in->softmax_scale, neg_inf = -INFINITY, one = 1.0f;
    for (int g = 0; g < n_groups; g++) {
        const group *gr = &groups[g];
        memset(&b, 0, sizeof b);
        carve(gr, in, backward, (char *)ws + table_bytes, &b);
        const int32_t *seg = table + 2 * gr->table_offset;
        int nb = gr->n_padded;
        int64_t S = gr->S;
        DSARL_TRY(cdn_gather_segments(c->stream, b.q, in->q, c->f32, seg, nb, S, H * dqk, err));
        DSARL_TRY(cdn_gather_segments(c->stream, b.k, in->k, c->f32, seg, nb, S, H * dqk, err));
        DSARL_TRY(cdn_gather_segments(c->stream, b.v, in->v, c->f32, seg, nb, S, H * dvv, err));
        if (gr->bias)
            DSARL_TRY(cdn_build_bias(c->stream, b.bias, indices, topk, seg, nb, S, err));
        void *ptrs[CDN_N_UIDS] = {0};
        ptrs[CDN_Q] = b.q, ptrs[CDN_K] = b.k, ptrs[CDN_V] = b.v, ptrs[CDN_O] = b.o, ptrs[CDN_STATS] = b.stats;
        ptrs[CDN_SCALE] = &scale, ptrs[CDN_NEG_INF] = &neg_inf, ptrs[CDN_BIAS] = b.bias;
        if (backward) {
            DSARL_TRY(cdn_gather_segments(c->stream, b.o, out, c->f32, seg, nb, S, H * dvv, err));
            DSARL_TRY(cdn_gather_segments(c->stream, b.d_o, dout, c->f32, seg, nb, S, H * dvv, err));
            DSARL_TRY(cdn_gather_stats(c->stream, b.stats, lse, seg, nb, S, H, err));
            ptrs[CDN_DO] = b.d_o, ptrs[CDN_DQ] = b.dq, ptrs[CDN_DK] = b.dk, ptrs[CDN_DV] = b.dv;
            ptrs[CDN_ONE] = &one, ptrs[CDN_SOFTMAX_SUM] = b.softmax_sum;
        }
        DSARL_TRY(cdn_plan_execute(c, gr->plan, ptrs, b.cudnn, err));
        if (backward) {
            DSARL_TRY(cdn_scatter_segments(c->stream, dq, c->f32, b.dq, seg, nb, S, H * dqk, err));
            DSARL_TRY(cdn_scatter_segments(c->stream, dk, c->f32, b.dk, seg, nb, S, H * dqk, err));
            DSARL_TRY(cdn_scatter_segments(c->stream, dv, c->f32, b.dv, seg, nb, S, H * dvv, err));
        } else {
            DSARL_TRY(cdn_scatter_segments(c->stream, (void *)out, c->f32, b.o, seg, nb, S, H * dvv, err));
            DSARL_TRY(cdn_scatter_stats(c->stream, (float *)lse, b.stats, seg, nb, S, H, err));
        }
    }
    return DSARL_OK;
}

int cdn_headwise_forward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, const dsarl_dsa_headwise_inputs *in,
                         const int32_t *indices, int32_t topk, void *out, float *lse, dsarl_error *err)
{
    if (!out || !lse)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa cudnn headwise_attention_forward: out and lse are required");
    return run(ctx, "headwise_attention_forward", batch, in, indices, topk, out, lse, NULL, NULL, NULL, NULL, 0,
               err);
}

int cdn_headwise_backward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, const dsarl_dsa_headwise_inputs *in,
                          const int32_t *indices, int32_t topk, const void *out, const float *lse, const void *dout,
                          void *dq, void *dk, void *dv, dsarl_error *err)
{
    if (!out || !lse || !dout || !dq || !dk || !dv)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa cudnn headwise_attention_backward: out, lse, dout, dq, dk and "
                          "dv are required");
    return run(ctx, "headwise_attention_backward", batch, in, indices, topk, out, lse, dout, dq, dk, dv, 1, err);
}
