/* dsarl/ops/device.h: layer-level primitives on one kind of processor (kind DSARL_KIND_DEVICE). SDK tier: plugin
 * ABI (docs/sdk.md). Every function slot of ABI 1.0 and 1.1 is MANDATORY (a table leaving one NULL is refused at
 * registration, naming the slot); the 1.2 and later slots are optional, each says what 0/NULL means.
 *
 * Granularity follows llm.c: each entry is a whole layer primitive (with its backward where training needs one),
 * never a per-element call, so a model composes them once and a device plugin implements them once. All pointers
 * are device pointers from alloc(). Activations and parameters use the device's storage dtype (float32 on the
 * CPU, bfloat16 on CUDA); statistics, log-probabilities, losses and optimizer state are always float32; token ids
 * and indices are int32. Backward entries ACCUMULATE into parameter gradients (+=) and OVERWRITE input
 * gradients unless stated. Shapes in comments: T tokens, C channels, V vocabulary, H heads. */
#ifndef DSARL_OPS_DEVICE_H
#define DSARL_OPS_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "dsarl/comm.h"
#include "dsarl/parallel.h"
#include "dsarl/plugin.h"
#include "dsarl/tensor.h"

DSARL_BEGIN_DECLS

typedef struct dsarl_device dsarl_device; /* one device instance, owned by its plugin */

/* Direction of a copy. */
typedef enum dsarl_copy_kind {
    DSARL_COPY_HOST_TO_DEVICE = 0,
    DSARL_COPY_DEVICE_TO_HOST = 1,
    DSARL_COPY_DEVICE_TO_DEVICE = 2,
} dsarl_copy_kind;

typedef struct dsarl_device_config {
    uint32_t struct_size;
    const dsarl_node *recipe;          /* resolved recipe root (runtime.* keys) */
    const dsarl_parallel *parallel;    /* selects the GPU by local rank */
    int32_t threads;                   /* CPU threads for host-side math; 0 = device default */
    uint64_t seed;                     /* base seed for sampling streams */
} dsarl_device_config;

typedef struct dsarl_device_ops {
    dsarl_ops_common common;

    /* --- lifetime and memory ------------------------------------------------------------------------------ */
    /* Creates a device instance for this process. */
    int (*create)(const dsarl_device_config *config, dsarl_device **out, dsarl_error *err);
    /* Releases everything the instance allocated. */
    void (*destroy)(dsarl_device *dev);
    /* The dtype activations and parameters are stored in on this device. */
    dsarl_dtype (*storage_dtype)(const dsarl_device *dev);
    /* Allocates bytes of device memory (aligned to 256 bytes). */
    int (*alloc)(dsarl_device *dev, size_t bytes, void **out, dsarl_error *err);
    /* Frees memory from alloc(); NULL is a no-op. */
    void (*free)(dsarl_device *dev, void *ptr);
    /* Copies bytes between host and device memory. */
    int (*copy)(dsarl_device *dev, void *dst, const void *src, size_t bytes, dsarl_copy_kind kind,
                dsarl_error *err);
    /* Sets bytes of device memory to zero. */
    int (*zero)(dsarl_device *dev, void *ptr, size_t bytes, dsarl_error *err);
    /* Waits until all queued work is done and reports any asynchronous failure. */
    int (*synchronize)(dsarl_device *dev, dsarl_error *err);
    /* Converts n host float32 values into device storage of dtype (upload of weights, inputs). */
    int (*upload_f32)(dsarl_device *dev, void *dst, dsarl_dtype dtype, const float *src, size_t n, dsarl_error *err);
    /* Converts n device values of dtype into host float32. */
    int (*download_f32)(dsarl_device *dev, float *dst, const void *src, dsarl_dtype dtype, size_t n,
                        dsarl_error *err);

    /* --- dense algebra ------------------------------------------------------------------------------------ */
    /* Row-major C(M,N) = alpha * op(A) op(B) + beta * C, op(A) (M,K), op(B) (K,N); trans_* transposes the stored
     * matrix (A stored (K,M) when trans_a). Storage dtype in and out, float32 accumulation. */
    int (*gemm)(dsarl_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const void *a, const void *b, float beta, void *c, dsarl_error *err);
    /* batch independent gemms with element strides between consecutive A, B and C matrices. */
    int (*gemm_strided_batched)(dsarl_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                float alpha, const void *a, int64_t stride_a, const void *b, int64_t stride_b,
                                float beta, void *c, int64_t stride_c, int64_t batch, dsarl_error *err);

    /* --- layer primitives (norms, RoPE, SwiGLU, MoE routing, log-probs, AdamW, sampling) follow, each with its
     * backward where training needs one. */

    /* Strided 2-D copy: rows x cols elements, consecutive rows dst_stride / src_stride elements apart (head
     * splitting and merging, slices of fused projections). */
    int (*copy_2d)(dsarl_device *dev, void *dst, int64_t dst_stride, const void *src, int64_t src_stride,
                   int64_t rows, int64_t cols, dsarl_error *err);
    /* out = a + b elementwise over n values (residual add); out may alias a or b. */
    int (*add)(dsarl_device *dev, void *out, const void *a, const void *b, int64_t n, dsarl_error *err);
    /* y += alpha * x over n values (gradient accumulation, scaled sums). */
    int (*axpy)(dsarl_device *dev, int64_t n, float alpha, const void *x, void *y, dsarl_error *err);

    /* Token embedding: out (T,C) = wte[tokens[t]] with wte (V,C); tokens (T) int32 device memory, each in [0,V). */
    int (*embedding_forward)(dsarl_device *dev, void *out, const int32_t *tokens, const void *wte, int64_t T,
                             int64_t C, int64_t V, dsarl_error *err);
    /* dwte (V,C) += scatter of dout (T,C) rows by tokens. */
    int (*embedding_backward)(dsarl_device *dev, void *dwte, const void *dout, const int32_t *tokens, int64_t T,
                              int64_t C, dsarl_error *err);

    /* RMSNorm over the last dim: out (T,C) = inp * rstd * weight, rstd (T) float32 = 1/sqrt(mean(inp^2)+eps). */
    int (*rmsnorm_forward)(dsarl_device *dev, void *out, float *rstd, const void *inp, const void *weight,
                           int64_t T, int64_t C, float eps, dsarl_error *err);
    /* Backward of rmsnorm_forward: dinp (T,C) overwritten, dweight (C) accumulated. */
    int (*rmsnorm_backward)(dsarl_device *dev, void *dinp, void *dweight, const void *dout, const void *inp,
                            const void *weight, const float *rstd, int64_t T, int64_t C, dsarl_error *err);
    /* LayerNorm with bias: out (T,C) = (inp - mean) * rstd * weight + bias; mean, rstd (T) float32. */
    int (*layernorm_forward)(dsarl_device *dev, void *out, float *mean, float *rstd, const void *inp,
                             const void *weight, const void *bias, int64_t T, int64_t C, float eps,
                             dsarl_error *err);
    /* Backward of layernorm_forward: dinp (T,C) overwritten, dweight and dbias (C) accumulated. */
    int (*layernorm_backward)(dsarl_device *dev, void *dinp, void *dweight, void *dbias, const void *dout,
                              const void *inp, const void *weight, const float *mean, const float *rstd,
                              int64_t T, int64_t C, dsarl_error *err);

    /* Interleaved RoPE (DeepSeek / GLM, as transformers' apply_rotary_pos_emb_interleave): on each of the T*H
     * slices x = base + t*token_stride + h*head_stride of rope_dim values, pair i = (x[2i], x[2i+1]) is rotated
     * by angle positions[t] * inv_freq[i] and written DE-INTERLEAVED: out[i] = x0 cos - x1 sin,
     * out[i + rope_dim/2] = x1 cos + x0 sin. inp and out share the strides and may alias. positions (T) int32,
     * inv_freq (rope_dim/2) float32, device memory; cos/sin are multiplied by attention_scaling (YaRN). */
    int (*rope_forward)(dsarl_device *dev, void *out, const void *inp, const int32_t *positions,
                        const float *inv_freq, float attention_scaling, int64_t T, int64_t H, int64_t token_stride,
                        int64_t head_stride, int64_t rope_dim, dsarl_error *err);
    /* Backward of rope_forward (the transposed rotation back to the interleaved layout); may alias. */
    int (*rope_backward)(dsarl_device *dev, void *dinp, const void *dout, const int32_t *positions,
                         const float *inv_freq, float attention_scaling, int64_t T, int64_t H,
                         int64_t token_stride, int64_t head_stride, int64_t rope_dim, dsarl_error *err);

    /* SwiGLU: out (T,inner) = silu(gate) * up where inp (T,2*inner) rows are [gate | up]. */
    int (*swiglu_forward)(dsarl_device *dev, void *out, const void *inp, int64_t T, int64_t inner, dsarl_error *err);
    /* Backward of swiglu_forward: dinp (T,2*inner) overwritten. */
    int (*swiglu_backward)(dsarl_device *dev, void *dinp, const void *dout, const void *inp, int64_t T,
                           int64_t inner, dsarl_error *err);

    /* MoE routing (transformers GlmMoeDsaTopkRouter): s = sigmoid(logits (T,E) float32); choice = s + bias (E);
     * keep the topk_group of n_group groups with the largest sum of their top-2 choice values; pick the top_k
     * experts by choice among kept groups; weights = s at those experts, divided by (their sum + 1e-20) when
     * norm_topk_prob, times scaling. indices (T,top_k) int32, weights (T,top_k) float32, probs (T,E) float32 = s
     * (kept for backward). The selection itself carries no gradient. */
    int (*moe_route_forward)(dsarl_device *dev, int32_t *indices, float *weights, float *probs,
                             const float *logits, const float *bias, int64_t T, int64_t E, int32_t top_k,
                             int32_t n_group, int32_t topk_group, bool norm_topk_prob, float scaling,
                             dsarl_error *err);
    /* Backward of moe_route_forward given dweights (T,top_k): dlogits (T,E) float32 overwritten (non-zero only at
     * the selected experts). */
    int (*moe_route_backward)(dsarl_device *dev, float *dlogits, const float *dweights, const int32_t *indices,
                              const float *probs, int64_t T, int64_t E, int32_t top_k, bool norm_topk_prob,
                              float scaling, dsarl_error *err);
    /* Permute: out (n,C) row r = inp (T,C) row rows[r] (tokens grouped by expert). */
    int (*gather_rows)(dsarl_device *dev, void *out, const void *inp, const int32_t *rows, int64_t n, int64_t C,
                       dsarl_error *err);
    /* Unpermute: out (T,C) row rows[r] += scale[r] * inp (n,C) row r; scale (n) float32 or NULL for 1. Rows are
     * applied in order r = 0..n-1, so the result is deterministic. */
    int (*scatter_add_rows)(dsarl_device *dev, void *out, const void *inp, const int32_t *rows,
                            const float *scale, int64_t n, int64_t C, dsarl_error *err);
    /* x (n,C) row r *= scale[r] in place; scale (n) float32 (routing weights applied to permuted gradients). */
    int (*scale_rows)(dsarl_device *dev, void *x, const float *scale, int64_t n, int64_t C, dsarl_error *err);
    /* scale[r] = dot(a row r, b row r) over C for n rows (gradient of the per-row routing weight). */
    int (*row_dot)(dsarl_device *dev, float *out, const void *a, const void *b, int64_t n, int64_t C,
                   dsarl_error *err);

    /* Per-token log-probabilities: logprobs (T) = log_softmax(logits (T,V))[targets[t]]; logits float32;
     * a target < 0 gives 0 (ignored position). */
    int (*logprobs_forward)(dsarl_device *dev, float *logprobs, const float *logits, const int32_t *targets,
                            int64_t T, int64_t V, dsarl_error *err);
    /* Backward of logprobs_forward given dlogprobs (T): dlogits (T,V) float32 overwritten. */
    int (*logprobs_backward)(dsarl_device *dev, float *dlogits, const float *dlogprobs, const float *logits,
                             const int32_t *targets, int64_t T, int64_t V, dsarl_error *err);

    /* --- reductions, sampling ------------------------------------------------------------------- */
    /* out[0] (float32, device) = sum of squares of n values, accumulated in double (gradient norms). */
    int (*sum_squares)(dsarl_device *dev, float *out, const void *x, int64_t n, dsarl_error *err);
    /* x *= alpha over n values in place (gradient clipping, loss scaling). */
    int (*scale)(dsarl_device *dev, void *x, float alpha, int64_t n, dsarl_error *err);
    /* Draws tokens (T) int32 from softmax(logits (T,V) float32 / temperature); row t uses the Philox stream
     * (seed, stream + t) (dsarl/rng.h), so draws are reproducible on every device. temperature <= 0 takes the
     * argmax (ties: the lowest id). */
    int (*sample_tokens)(dsarl_device *dev, int32_t *tokens, const float *logits, int64_t T, int64_t V,
                         float temperature, uint64_t seed, uint64_t stream, dsarl_error *err);

    /* --- optimizer with fp32 master weights ------------------------------------------------------------------ */
    /* One AdamW step (torch.optim.AdamW: decoupled decay, bias correction, eps outside the sqrt; step counted from
     * 1) on n values: g = grad_scale * grad (grad in the storage dtype), master/m/v (float32) updated in place,
     * then the master written back into weight in the storage dtype. weight may equal master (float32 storage,
     * the CPU: the master IS the weight) or be NULL (no write-back). */
    int (*adamw_update)(dsarl_device *dev, float *master, void *weight, const void *grad, float *m, float *v,
                        int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                        float grad_scale, int64_t step, dsarl_error *err);

    /* --- ABI 1.1: float32 where precision needs it (took two reserved slots, so the table kept its size) ------ */
    /* Both are mandatory and this core calls them unconditionally: a 1.0 device plugin (where they read as NULL)
     * is refused at registration naming the slot, rather than crashing in the first training step. */
    /* ABI 1.1, mandatory. As gemm, but C (M,N) is float32 whatever the storage dtype (A, B in storage, fp32
     * accumulation): router and LM-head logits and the indexer head weights stay float32 under bf16 storage. */
    int (*gemm_f32out)(dsarl_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const void *a, const void *b, float beta, float *c, dsarl_error *err);
    /* ABI 1.1, mandatory. dst = alpha * src over n device values, converting between float32 and the storage dtype
     * (either way, or the same type); other dtypes are refused. Float32 gradients enter storage-dtype GEMMs through
     * it. */
    int (*convert)(dsarl_device *dev, void *dst, dsarl_dtype dst_dtype, const void *src, dsarl_dtype src_dtype,
                   int64_t n, float alpha, dsarl_error *err);

    /* --- ABI 1.2 ------------------------------------------------------------------------------------------ */
    /* ABI 1.2, optional (0: unknown, read through dsarl_device_capabilities). What this device is (DSARL_DEVICE_CAP_*
     * flags), so models and DSA backends test capabilities, not names. */
    uint64_t capabilities;
    /* ABI 1.2, optional (NULL: as a NULL stream, each call runs at once). The queue this instance orders its work on:
     * a cudaStream_t for DSARL_DEVICE_CAP_CUDA devices, NULL for a device that runs each call at once. Backends
     * launching their own kernels enqueue them here. */
    void *(*stream)(dsarl_device *dev);
    /* ABI 1.2: whether this machine can run the device now (a GPU visible and usable, ...), asked before any
     * instance exists; when not, why (one sentence) goes into why. The core picks the highest-ranked available
     * device where runtime.device is absent or auto. NULL: available whenever it is loaded. */
    bool (*available)(char *why, size_t why_size);

    /* --- ABI 1.5 (took a reserved slot, so the table kept its size) ---------------------------------------- */
    /* ABI 1.5, optional (NULL: the engine filters on the host and draws with sample_tokens). One draw per row from
     * the sampling distribution of logits (T,V) float32, rewritten in place into its logits by
     * dsarl_sampling_filter_row's rules (dsarl/sampling.h: / temperature, top-k, top-p); row t uses the Philox
     * stream (seed, streams[t]) (streams host (T)) exactly as sample_tokens row 0 of stream streams[t] does.
     * tokens (T) int32 and logprobs (T) float32 (log-softmax of the filtered row at the drawn id, as
     * logprobs_forward) are device memory: only they need to come back. temperature <= 0: the argmax of the raw
     * row (ties: the lowest id), scored under softmax(raw row). */
    int (*sample_filtered)(dsarl_device *dev, int32_t *tokens, float *logprobs, float *logits, int64_t T, int64_t V,
                           float temperature, int32_t top_k, float top_p, uint64_t seed, const uint64_t *streams,
                           dsarl_error *err);

    /* --- ABI 1.7 (took the last two reserved slots, so the table kept its size) ------------------------------ */
    /* ABI 1.7, optional (NULL: no scopes; the caller skips the call). Names the op class of the work queued from now
     * on ("attention", "moe", "lm_head", ...; NULL ends the scope): a profiling device attributes its time, a DSA
     * plugin's kernels on its stream included, to the class. name must outlive the instance (a string literal). */
    void (*profile_scope)(dsarl_device *dev, const char *name);
    /* ABI 1.7, optional (NULL: the model groups on the host). Groups routed (token, slot) pairs by expert on the
     * device, for pad rows per expert: indices (T,top_k) int32 in [0,E); expert e's pairs take rows e*pad .. in
     * token order, rows[r] = token, slot[r] = t*top_k + k, slot_inv[t*top_k + k] = r; an unused row r reads
     * token r mod T (0 when T = 0) with slot T*top_k (a zero routing weight), so no token gathers the zero terms of
     * many padding rows in the combine. A pair past its expert's pad rows (only when pad < T
     * or an expert repeats in a row) gets slot_inv = -1 and no row. rows, slot (E*pad), slot_inv (T*top_k): device
     * int32. Nothing comes back to the host, so a decode step can be captured into a graph. */
    int (*moe_group_padded)(dsarl_device *dev, int32_t *rows, int32_t *slot, int32_t *slot_inv,
                            const int32_t *indices, int64_t T, int64_t E, int32_t top_k, int64_t pad,
                            dsarl_error *err);

    /* --- ABI 1.3: collectives on a process group (dsarl/comm.h), on device memory ---------------------------- */
    /* Optional as a set: a device without them runs single-process layouts only (a layout with any group larger
     * than one is refused when the session opens, naming the slot). Each is collective over the group, ordered on
     * the device's queue like its other calls; ranks are group-local; counts are in values of dtype. Call them
     * through the dsarl_device_* helpers below, which make a NULL group or a group of one a local copy. */
    /* In place: buf (n) = the reduction of every member's buf. */
    int (*all_reduce)(dsarl_device *dev, const dsarl_group *group, void *buf, int64_t n, dsarl_dtype dtype,
                      dsarl_reduce_op op, dsarl_error *err);
    /* out (size * n, rank-major) = every member's in (n). */
    int (*all_gather)(dsarl_device *dev, const dsarl_group *group, void *out, const void *in, int64_t n,
                      dsarl_dtype dtype, dsarl_error *err);
    /* out (n) = the reduction of block `rank` of every member's in (size * n). */
    int (*reduce_scatter)(dsarl_device *dev, const dsarl_group *group, void *out, const void *in, int64_t n,
                          dsarl_dtype dtype, dsarl_reduce_op op, dsarl_error *err);
    /* in holds send_counts[p] values per peer p (rank order, packed); out receives recv_counts[p] from each peer p
     * (rank order, packed). Both count arrays are host memory with size entries (exchange them first). */
    int (*all_to_all)(dsarl_device *dev, const dsarl_group *group, void *out, const int64_t *recv_counts,
                      const void *in, const int64_t *send_counts, dsarl_dtype dtype, dsarl_error *err);
    /* buf (n) = root's buf on every member. */
    int (*broadcast)(dsarl_device *dev, const dsarl_group *group, void *buf, int64_t n, dsarl_dtype dtype,
                     int32_t root, dsarl_error *err);
    /* Point to point with one peer (pipeline stages); a send is matched by the peer's recv of the same n. */
    int (*send)(dsarl_device *dev, const dsarl_group *group, const void *buf, int64_t n, dsarl_dtype dtype,
                int32_t peer, dsarl_error *err);
    int (*recv)(dsarl_device *dev, const dsarl_group *group, void *buf, int64_t n, dsarl_dtype dtype, int32_t peer,
                dsarl_error *err);

    /* --- ABI 1.7 (appended) ------------------------------------------------------------------------------- */
    /* ABI 1.7, optional (NULL: unknown; engines size their caches from their own keys). The device memory free now
     * and in all, in bytes, as the driver reports it (policy.generation.gpu_memory_utilization sizes the paged
     * cache arena from them). */
    int (*memory_info)(dsarl_device *dev, size_t *free_bytes, size_t *total_bytes, dsarl_error *err);
    /* ABI 1.7, optional (NULL: one gemm per group; call it through dsarl_device_gemm_grouped, which loops then).
     * `groups` independent row-major products over the row groups of packed operands, as a MoE layer's experts
     * run: group g holds rows first[g] .. first[g+1] (first: host (groups+1), first[0] = 0, non-decreasing);
     * r_g rows. inner_grouped false: C rows of g (r_g, n) = alpha (A rows of g) (r_g, k) op(B + g stride_b) + beta
     * C rows of g, A stored (rows, k), op(B) (k, n) as gemm's trans_b. inner_grouped true (weight gradients):
     * C + g stride_c (m, n) = alpha (A rows of g)^T (m, r_g) (B rows of g) (r_g, n) + beta (C + g stride_c), A
     * stored (rows, m), B (rows, n), trans_b ignored. The unused size (m, or k) is ignored. Groups may run
     * concurrently; each gives gemm's product to rounding (a device may sum in another order). Storage dtype in
     * and out, fp32 accumulation. */
    int (*gemm_grouped)(dsarl_device *dev, bool inner_grouped, bool trans_b, int64_t groups, const int64_t *first,
                        int64_t m, int64_t n, int64_t k, float alpha, const void *a, const void *b, int64_t stride_b,
                        float beta, void *c, int64_t stride_c, dsarl_error *err);
} dsarl_device_ops;

/* The ABI 1.7 slot `name` of a device ops table from any 1.x plugin, or NULL when its struct_size predates it. */
#define DSARL_DEVICE_SLOT(ops, name)                                                                               \
    ((ops)->common.struct_size >= offsetof(dsarl_device_ops, name) + sizeof((ops)->name) ? (ops)->name : NULL)

/* gemm_grouped through the slot, or one gemm per group where the table has none (same results). */
static inline int dsarl_device_gemm_grouped(const dsarl_device_ops *ops, dsarl_device *dev, bool inner_grouped,
                                            bool trans_b, int64_t groups, const int64_t *first, int64_t m, int64_t n,
                                            int64_t k, float alpha, const void *a, const void *b, int64_t stride_b,
                                            float beta, void *c, int64_t stride_c, dsarl_error *err)
{
    int (*grouped)(dsarl_device *, bool, bool, int64_t, const int64_t *, int64_t, int64_t, int64_t, float,
                   const void *, const void *, int64_t, float, void *, int64_t, dsarl_error *) =
        DSARL_DEVICE_SLOT(ops, gemm_grouped);
    if (grouped)
        return grouped(dev, inner_grouped, trans_b, groups, first, m, n, k, alpha, a, b, stride_b, beta, c, stride_c,
                       err);
    size_t e = dsarl_dtype_size(ops->storage_dtype(dev));
    for (int64_t g = 0; g < groups; g++) {
        int64_t r0 = first[g], rows = first[g + 1] - first[g];
        int rc = 0;
        if (inner_grouped && (rows > 0 || beta != 1.0f))
            rc = ops->gemm(dev, true, false, m, n, rows, alpha, (const char *)a + (size_t)(r0 * m) * e,
                           (const char *)b + (size_t)(r0 * n) * e, beta, (char *)c + (size_t)(g * stride_c) * e, err);
        else if (!inner_grouped && rows > 0)
            rc = ops->gemm(dev, false, trans_b, rows, n, k, alpha, (const char *)a + (size_t)(r0 * k) * e,
                           (const char *)b + (size_t)(g * stride_b) * e, beta, (char *)c + (size_t)(r0 * n) * e,
                           err);
        if (rc)
            return rc;
    }
    return DSARL_OK;
}

/* Names the op class of the work queued from now on, where the device profiles (NULL ends the scope). */
static inline void dsarl_device_profile_scope(const dsarl_device_ops *ops, dsarl_device *dev, const char *name)
{
    void (*scope)(dsarl_device *, const char *) = DSARL_DEVICE_SLOT(ops, profile_scope);
    if (scope)
        scope(dev, name);
}

/* Whether a device ops table (any 1.x) has the ABI 1.5 device-side sampler. */
static inline bool dsarl_device_has_sample_filtered(const dsarl_device_ops *ops)
{
    return ops->common.struct_size >= offsetof(dsarl_device_ops, sample_filtered) + sizeof(ops->sample_filtered) &&
           ops->sample_filtered != NULL;
}

/* Whether a device ops table (any 1.x) fills the ABI 1.3 collective set. */
static inline bool dsarl_device_has_collectives(const dsarl_device_ops *ops)
{
    return ops->common.struct_size >= offsetof(dsarl_device_ops, recv) + sizeof(ops->recv) && ops->all_reduce &&
           ops->all_gather && ops->reduce_scatter && ops->all_to_all && ops->broadcast && ops->send && ops->recv;
}

/* The collectives as a model or algorithm calls them: a NULL group or a group of one needs no device slot (a
 * copy where out and in differ), a larger group one that dsarl_device_has_collectives confirmed. */
static inline int dsarl_device_all_reduce(const dsarl_device_ops *ops, dsarl_device *dev, const dsarl_group *g,
                                          void *buf, int64_t n, dsarl_dtype dtype, dsarl_reduce_op op,
                                          dsarl_error *err)
{
    return dsarl_group_size(g) <= 1 || n == 0 ? DSARL_OK : ops->all_reduce(dev, g, buf, n, dtype, op, err);
}
static inline int dsarl_device_all_gather(const dsarl_device_ops *ops, dsarl_device *dev, const dsarl_group *g,
                                          void *out, const void *in, int64_t n, dsarl_dtype dtype, dsarl_error *err)
{
    if (dsarl_group_size(g) <= 1)
        return out == in || n == 0 ? DSARL_OK
                                   : ops->copy(dev, out, in, (size_t)n * dsarl_dtype_size(dtype),
                                               DSARL_COPY_DEVICE_TO_DEVICE, err);
    return ops->all_gather(dev, g, out, in, n, dtype, err);
}
static inline int dsarl_device_reduce_scatter(const dsarl_device_ops *ops, dsarl_device *dev, const dsarl_group *g,
                                              void *out, const void *in, int64_t n, dsarl_dtype dtype,
                                              dsarl_reduce_op op, dsarl_error *err)
{
    if (dsarl_group_size(g) <= 1)
        return out == in || n == 0 ? DSARL_OK
                                   : ops->copy(dev, out, in, (size_t)n * dsarl_dtype_size(dtype),
                                               DSARL_COPY_DEVICE_TO_DEVICE, err);
    return ops->reduce_scatter(dev, g, out, in, n, dtype, op, err);
}
static inline int dsarl_device_all_to_all(const dsarl_device_ops *ops, dsarl_device *dev, const dsarl_group *g,
                                          void *out, const int64_t *recv_counts, const void *in,
                                          const int64_t *send_counts, dsarl_dtype dtype, dsarl_error *err)
{
    if (dsarl_group_size(g) <= 1)
        return out == in || send_counts[0] == 0
                   ? DSARL_OK
                   : ops->copy(dev, out, in, (size_t)send_counts[0] * dsarl_dtype_size(dtype),
                               DSARL_COPY_DEVICE_TO_DEVICE, err);
    return ops->all_to_all(dev, g, out, recv_counts, in, send_counts, dtype, err);
}
static inline int dsarl_device_broadcast(const dsarl_device_ops *ops, dsarl_device *dev, const dsarl_group *g,
                                         void *buf, int64_t n, dsarl_dtype dtype, int32_t root, dsarl_error *err)
{
    return dsarl_group_size(g) <= 1 || n == 0 ? DSARL_OK : ops->broadcast(dev, g, buf, n, dtype, root, err);
}

/* dsarl_device_ops.capabilities flags (ABI 1.2). */
#define DSARL_DEVICE_CAP_HOST_MEMORY 0x1u  /* device pointers are host pointers (plain C kernels can run on them) */
#define DSARL_DEVICE_CAP_CUDA 0x2u         /* device pointers are CUDA device memory; stream() is a cudaStream_t */
#define DSARL_DEVICE_CAP_LAUNCH_BOUND 0x4u /* calls queue kernels with a fixed cost each: batch small work */

/* The capabilities of a device ops table from any 1.x plugin (0 when its struct_size does not cover them). */
static inline uint64_t dsarl_device_capabilities(const dsarl_device_ops *ops)
{
    return ops->common.struct_size >= offsetof(dsarl_device_ops, capabilities) + sizeof(ops->capabilities)
               ? ops->capabilities
               : 0;
}

DSARL_END_DECLS

#endif /* DSARL_OPS_DEVICE_H */
