/* dsarl/ops/dsa.h: DeepSeek Sparse Attention kernels (kind DSARL_KIND_DSA), selected by
 * policy.megatron_cfg.model_overrides.dsa_kernel_backend. SDK tier: plugin ABI (docs/sdk.md).
 *
 * Mandatory ops (a table leaving one NULL is refused at registration, naming the slot): create, destroy,
 * indexer_topk, sparse_mla_forward, sparse_mla_backward, indexer_loss_forward, indexer_loss_backward. Everything
 * from ABI 1.1 on is optional; each slot says what NULL means.
 *
 * All ops run on packed token batches. Queries are Tq tokens; keys are Tk entries of a key array (the same packed
 * batch in training/prefill, or the generation engine's latent cache in decode). Query t may attend to keys in
 * [key_start[t], key_end[t]) only: causal packed THD gives key_start = cu_seqlens[i], key_end = t + 1 for query t
 * of sequence i; decode gives the cache range of its sequence. Padding is never inside a range, so it is never
 * attended. Sparse attention uses the absorbed MQA form: one shared key/value latent per key, kv = [c_kv | k_rope]
 * (d_qk = kv_lora + rope), V = kv[:, :d_v] with d_v = kv_lora, the same top-k set for every head.
 * Top-k indices are absolute positions in the key array; slots past the number of eligible keys hold -1.
 * A backend may use the exact shortcut that a row with no more than topk eligible keys attends to all of them.
 * Tensors use the device's storage dtype except indices/ranges (int32) and lse/scores/loss (float32). */
#ifndef DSARL_OPS_DSA_H
#define DSARL_OPS_DSA_H

#include <stddef.h>
#include <stdint.h>
#include "dsarl/ops/device.h"

DSARL_BEGIN_DECLS

typedef struct dsarl_dsa_context dsarl_dsa_context; /* backend state (plans, workspaces), owned by the plugin */

/* The ranges and sizes shared by every op of one call. Pointers are device memory. */
typedef struct dsarl_dsa_batch {
    uint32_t struct_size;
    int64_t n_queries;          /* Tq */
    int64_t n_keys;             /* Tk */
    const int32_t *key_start;   /* (Tq) first eligible key of each query */
    const int32_t *key_end;     /* (Tq) one past the last eligible key of each query */
    int32_t max_keys_per_query; /* upper bound of key_end - key_start over the batch (sizes workspaces) */
    /* ABI 1.1. Host copy of the packed segments for causal prefill/training batches, where queries and keys are
     * the same Tq = Tk tokens and query t of segment i sees keys [cu_seqlens[i], t]; NULL (and 0) otherwise, e.g.
     * in decode. Backends that plan per segment shape (cudnn) need it on the host. */
    const int32_t *host_cu_seqlens; /* (n_segments + 1) */
    int32_t n_segments;
} dsarl_dsa_batch;

/* The lightning indexer's inputs after projection, norm and RoPE. The head weights already carry both scales
 * (n_heads^-1/2 * head_dim^-1/2): score(t,s) = sum_j weights[t,j] * relu(q[t,j,:] . k[s,:]). */
typedef struct dsarl_dsa_indexer_inputs {
    uint32_t struct_size;
    const void *q;        /* (Tq, n_heads, head_dim) */
    const void *k;        /* (Tk, head_dim) */
    const float *weights; /* (Tq, n_heads) float32 */
    int32_t n_heads, head_dim;
} dsarl_dsa_indexer_inputs;

/* Sparse MLA operands in the absorbed form. */
typedef struct dsarl_dsa_attention_inputs {
    uint32_t struct_size;
    const void *q;   /* (Tq, n_heads, d_qk) */
    const void *kv;  /* (Tk, d_qk); V is the first d_v columns */
    int32_t n_heads, d_qk, d_v;
    float softmax_scale;
} dsarl_dsa_attention_inputs;

/* Attention in the per-head (non-absorbed) form, ABI 1.1: every head has its own keys and values, k_h = [c_kv W_UK_h
 * | k_rope] and v_h = c_kv W_UV_h (GLM-5: d_qk = qk_nope + qk_rope = 256, d_v = 256). Algebraically equal to the
 * absorbed form; cuDNN's fused attention graphs exist for it (d <= 256) and not for the absorbed 576/512 backward. */
typedef struct dsarl_dsa_headwise_inputs {
    uint32_t struct_size;
    const void *q; /* (Tq, n_heads, d_qk) */
    const void *k; /* (Tk, n_heads, d_qk) */
    const void *v; /* (Tk, n_heads, d_v) */
    int32_t n_heads, d_qk, d_v;
    float softmax_scale;
} dsarl_dsa_headwise_inputs;

/* Which attention form a backend wants the model to use for a batch (preferred_form). */
typedef enum dsarl_dsa_form {
    DSARL_DSA_FORM_ABSORBED = 0, /* sparse_mla_forward/backward on the shared latent */
    DSARL_DSA_FORM_HEADWISE = 1  /* headwise_attention_forward/backward on per-head keys and values */
} dsarl_dsa_form;

typedef struct dsarl_dsa_ops {
    dsarl_ops_common common;

    /* Mandatory. Creates backend state on a device instance (recipe: the resolved root, for backend keys). */
    int (*create)(const dsarl_device_ops *device_ops, dsarl_device *dev, const dsarl_node *recipe,
                  dsarl_dsa_context **out, dsarl_error *err);
    /* Mandatory. Frees what create made. */
    void (*destroy)(dsarl_dsa_context *ctx);

    /* Mandatory. Indexer scores + causal top-k: row t of indices (Tq, topk) int32 holds the k = min(topk,
     * eligible) highest-scoring eligible keys in DESCENDING score order (slot 0 the best), then -1 in the remaining
     * slots; scores (Tq, topk) float32 holds those keys' scores in the same order (-inf at -1 slots), or is NULL
     * when not wanted. Exactly equal scores are ordered, and cut at the k-th place, by the LOWER key index first.
     * The reference backend scores in double and judges ties on the double value; other backends must produce
     * the same order and the same set up to ties that their own score precision creates (scores that differ in
     * double may round equal in float32 or bf16: such a row may differ from the reference only among keys whose
     * scores are equal at the backend's precision). Consumers must not rely on any other order. */
    int (*indexer_topk)(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, const dsarl_dsa_indexer_inputs *in,
                        int32_t topk, int32_t *indices, float *scores, dsarl_error *err);

    /* Mandatory. Sparse attention over the selected keys: out (Tq, H, d_v), lse (Tq, H) natural-log float32
     * (+inf for a row with no valid index, whose output is 0). */
    int (*sparse_mla_forward)(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                              const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk, void *out,
                              float *lse, dsarl_error *err);

    /* Mandatory. Backward of sparse_mla_forward: dq (Tq, H, d_qk) overwritten; dkv (Tk, d_qk) ACCUMULATED (+=) at the
     * selected keys, both the key role (all d_qk columns) and the value role (first d_v columns). */
    int (*sparse_mla_backward)(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                               const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk,
                               const void *out, const float *lse, const void *dout, void *dq, void *dkv,
                               dsarl_error *err);

    /* Mandatory. Indexer KL loss per query token (DeepSeek-V3.2 section 2.1), as the reference backend computes it.
     * The set S of query t: sparse mode (indices != NULL) the non-negative entries of its top-k row (a key listed
     * twice counts twice); dense warm-up (indices == NULL) every eligible key [key_start[t], key_end[t]).
     *   logit_h(s) = softmax_scale * q[t,h,:] . kv[s,:]                    (all d_qk columns, every head h)
     *   P(s)       = sum_h exp(logit_h(s) - lse_h)
     *     lse_h: sparse mode with lse != NULL: the given lse[t,h] (the sparse attention's own normaliser, so P is
     *     the attention's probability mass restricted to S); sparse mode with lse == NULL, and dense mode ALWAYS
     *     (the lse argument is then ignored): log sum_{s in S} exp(logit_h(s)), i.e. each head renormalised over S.
     *   p(s)       = P(s) / max(sum_{s in S} P(s), 1e-10)                  (L1 normalisation over heads and S)
     *   log q(s)   = I(t,s) - log sum_{s' in S} exp(I(t,s')), I(t,s) = sum_j weights[t,j] relu(qI[t,j,:] . kI[s,:])
     *   loss(t)    = sum_{s in S, p(s) > 0} p(s) (log p(s) - log q(s));  an empty S gives 0.
     * No coefficient and no mean over tokens: the model applies those through dloss. loss (Tq) float32. */
    int (*indexer_loss_forward)(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                const dsarl_dsa_attention_inputs *attn, const float *lse,
                                const dsarl_dsa_indexer_inputs *indexer, const int32_t *indices, int32_t topk,
                                float *loss, dsarl_error *err);

    /* Mandatory. Backward of indexer_loss_forward given dloss (Tq), with g(s) = dloss[t] (softmax_S(I)(s) - p(s)):
     * dq_index (Tq, n_heads, head_dim) and dweights (Tq, n_heads) float32 overwritten, dk_index (Tk, head_dim)
     * accumulated. Nothing flows to attn. */
    int (*indexer_loss_backward)(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                 const dsarl_dsa_attention_inputs *attn, const float *lse,
                                 const dsarl_dsa_indexer_inputs *indexer, const int32_t *indices, int32_t topk,
                                 const float *dloss, void *dq_index, void *dk_index, float *dweights,
                                 dsarl_error *err);

    /* ---- ABI 1.1, optional: NULL (or a struct_size that does not cover them, see DSARL_DSA_HAS) means the
     * backend serves the absorbed form only. A plugin built for 1.1 or later must have a table that covers them
     * (the loader's minimum size for that minor), even when it leaves them NULL. ---- */

    /* ABI 1.1, optional (NULL: absorbed). The form the model should use for this causal training/prefill batch
     * (host_cu_seqlens set) with top-k width topk. Generation's cached decode always uses the absorbed form. */
    dsarl_dsa_form (*preferred_form)(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, int32_t topk);

    /* ABI 1.1, optional (NULL: no per-head form). Per-head attention over the causal prefill batch: query t attends
     * to the keys of indices (Tq, topk) as in sparse_mla_forward, or to every eligible key when indices is NULL
     * (segments no longer than topk, dense warm-up). out (Tq, H, d_v), lse (Tq, H) natural-log float32. */
    int (*headwise_attention_forward)(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                      const dsarl_dsa_headwise_inputs *in, const int32_t *indices, int32_t topk,
                                      void *out, float *lse, dsarl_error *err);

    /* ABI 1.1, optional (NULL together with headwise_attention_forward). Backward of headwise_attention_forward: dq
     * (Tq, H, d_qk), dk (Tk, H, d_qk) and dv (Tk, H, d_v) overwritten. */
    int (*headwise_attention_backward)(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                       const dsarl_dsa_headwise_inputs *in, const int32_t *indices, int32_t topk,
                                       const void *out, const float *lse, const void *dout, void *dq, void *dk,
                                       void *dv, dsarl_error *err);

    /* ABI 1.1, optional. Which engine serves each op at which sizes, one route per line ("op | sizes | engine"), e.g.
     * a cuDNN graph or a hand-over to another backend's kernel; printed by `dsarl plugins` and logged once per run.
     * NULL: every op runs this backend's own kernels. */
    const char *routes;

    /* ---- ABI 1.2 ---- */
    /* ABI 1.2, optional (0: no requirement stated; the core then matches by name only). The DSARL_DEVICE_CAP_* flags
     * a device must have for this backend to run on it (reference: host memory; tilelang, cudnn: CUDA). The core
     * picks, among backends whose requirement the device meets, the highest common.rank where the recipe names none.
     */
    uint64_t device_requires;

    void *reserved[3];
} dsarl_dsa_ops;

/* True when a DSA ops table registered under any 1.x ABI has the optional member `field` set. */
#define DSARL_DSA_HAS(ops, field)                                                                                   \
    ((ops)->common.struct_size >= offsetof(dsarl_dsa_ops, field) + sizeof((ops)->field) && (ops)->field != NULL)

DSARL_END_DECLS

#endif /* DSARL_OPS_DSA_H */
