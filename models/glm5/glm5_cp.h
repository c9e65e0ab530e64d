/* glm5_cp.h: context parallelism of the glm5 passes (glm5_cp.c). Internal to models/glm5.
 *
 * Every rank of a cp group is handed the same packed batch. Each sequence is padded at its end to a multiple of
 * 2 cp tokens and cut into 2 cp equal chunks; rank r keeps chunks r and 2 cp - 1 - r (Megatron's load-balanced
 * assignment: every rank gets as many early, cheap queries as late, expensive ones). The pass then runs on this
 * rank's rows only (p->T = T_local); attention and the indexer see every key of the padded batch in global order
 * (T_keys rows), gathered over cp, with positions and causal ranges global. */
#ifndef DSARL_GLM5_CP_H
#define DSARL_GLM5_CP_H

#include "glm5_pass.h"

typedef struct glm5_cp {
    int32_t size, rank;
    int64_t T_caller;           // the caller's tokens (the whole packed batch)
    int64_t T_keys;             // tokens of the padded batch, in global order: the key rows of attention
    int64_t T_local;            // this rank's rows, T_keys / cp (a multiple of tp)
    int32_t max_keys;           // the longest padded sequence
    dsarl_token_batch padded;   // the padded batch (global order), whose segments set the dense top-k width
    int32_t *host;              // host (4 T_local): tokens, positions, key_start, key_end of this rank's rows
    int32_t *caller_row;        // host (T_local): the caller's token of each row, -1 for a pad row
    int32_t *caller_slot;       // host (T_caller): each caller token's row in a rank-major (cp, T_local) gather
    int32_t *to_global;         // device (T_keys): the rank-major row of each global row, then
    int32_t *to_rank_major;     //   device (T_keys): the global row of each rank-major row (one block)
    void *stage;                // device (T_keys, max(d_qk, index_head_dim)) rank-major staging of the key gathers
    void *latent;               // headwise form: device (T_keys, kv_lora) every key's normed latent, then its
                                // gradient (allocated by the first use)
} glm5_cp;

/* Key rows of pass p: T_keys under cp, else its T (training and prefill keys are the batch's own tokens). */
static inline int64_t glm5_key_rows(const glm5_pass *p)
{
    return p->cp ? p->cp->T_keys : p->T;
}

/* Lays out this rank's rows of batch b (cp > 1): allocates p->cp (owned by the pass), sets p->T = p->T_real =
 * T_local and *padded to the padded global batch. Refuses a malformed cu_seqlens in one sentence. */
int glm5_cp_prepare(glm5_pass *p, const dsarl_token_batch *b, const dsarl_token_batch **padded, dsarl_error *err);

/* Uploads this rank's tokens, positions and key ranges into p->tokens' block and the gather maps; sets p->batch
 * (Tq = T_local queries over Tk = T_keys keys, no host segments: queries and keys differ). */
int glm5_cp_upload_batch(glm5_pass *p, dsarl_error *err);

/* This rank's token ids (host, T_local; 0 at pad rows). */
static inline const int32_t *glm5_cp_tokens(const glm5_pass *p)
{
    return p->cp->host;
}

/* all (T_keys, width) in global order = every cp rank's local (T_local, width) rows (an all-gather over cp, then one
 * row permutation). width in storage elements. */
int glm5_cp_gather_keys(glm5_pass *p, void *all, const void *local, int64_t width, dsarl_error *err);

/* local (T_local, width) = this rank's rows of the sum over cp of every rank's all (T_keys, width): the transpose of
 * glm5_cp_gather_keys (a permutation, then a reduce-scatter over cp). */
int glm5_cp_scatter_keys(glm5_pass *p, void *local, const void *all, int64_t width, dsarl_error *err);

/* *local = the caller's targets (T_caller, checked against the vocabulary) at this rank's rows, -1 at pad rows
 * (host, owned by the pass). */
int glm5_cp_local_targets(glm5_pass *p, const int32_t *targets, const int32_t **local, dsarl_error *err);

/* *local = the caller's per-token values (T_caller) at this rank's rows, 0 at pad rows (host, owned by the pass). */
int glm5_cp_local_values(glm5_pass *p, const float *caller, const float **local, dsarl_error *err);

/* caller (T_caller, width) host = the rows of every cp rank's local (T_local, width) host rows, in the caller's
 * order (a host all-gather over cp): log-probs (width 1) and forward_logits' rows. */
int glm5_cp_gather_rows(glm5_pass *p, float *caller, const float *local, int64_t width, dsarl_error *err);

/* Headwise form under cp: the per-head keys a->k_heads (T_keys, H, qk) and values a->v_heads (T_keys, H, v) of every
 * key from the gathered latents a->kv_all: [k_nope_h | v_h] = latent_norm kv_b_proj_h^T, k_h = [k_nope_h | k_rope]. */
int glm5_cp_headwise_keys(glm5_pass *p, glm5_layer_acts *a, const glm5_layer *L, dsarl_error *err);

/* Its backward, from the backend's dk_heads (T_keys, H, qk) and dv_heads (T_keys, H, v) of this rank's queries:
 * kv_b_proj's gradient over every key, the latent and rope-key gradients reduce-scattered to their owners, then
 * g->dlatn (T_local, kv_lora) and g->dkv[:, kv_lora:] (the rope key) as the single-process path leaves them. */
int glm5_cp_headwise_backward(glm5_pass *p, glm5_grad_bufs *g, const glm5_layer_acts *a, const glm5_layer *L,
                              dsarl_error *err);

/* dst (T_local) device float32 = value at this rank's real rows, 0 at pad rows (the indexer loss's gradient). */
int glm5_cp_upload_real(glm5_pass *p, float *dst, float value, dsarl_error *err);

/* *loss += sum over full layers of coeff * (sum of the per-token indexer losses of every cp rank's real rows) /
 * T_caller, from ilosses (layers, T_local) device: the one-process value on every cp rank. */
int glm5_cp_sum_indexer_losses(glm5_pass *p, const float *ilosses, double *loss, dsarl_error *err);

#endif /* DSARL_GLM5_CP_H */
