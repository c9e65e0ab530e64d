/* glm5_pass.h: the buffers of one forward (and backward) pass over a packed batch. Internal to models/glm5.
 *
 * Inference keeps one set of layer activations and reuses it layer after layer; training keeps one set per
 * layer so the backward pass can read every layer's inputs. */
#ifndef DSARL_GLM5_PASS_H
#define DSARL_GLM5_PASS_H

#include "glm5_cache.h"
#include "glm5_model.h"

/* Names the op class of the device work queued from now on (a profiling device attributes its GPU time, DSA
 * kernels included, to it: runtime.cuda_profile, docs/performance.md), or ends it (NULL). A string literal.
 * Classes do not nest: a change replaces the current class, so a caller whose callee changed it sets its own
 * again before queuing more; a model op ends with NULL, so the host's time between calls is "(unscoped)". The
 * classes: setup, embedding, norm, attention.proj, attention.core, kv_cache, indexer, moe, moe.shared, mlp.dense,
 * lm_head, mtp, pipeline (backward: the same with .bwd; indexer.loss), optimizer.*. */
static inline void glm5_scope(const dsarl_model *m, const char *name)
{
    dsarl_device_profile_scope(m->dev_ops, m->dev, name);
}

// Activations of one decoder layer (T tokens; Ts = T_sp rows of the residual stream on this rank, T / tp under
// sequence parallelism, else T; H = this rank's heads; K = experts per token; N = Ts*K routed rows).
typedef struct glm5_layer_acts {
    void *x_in, *x_mid;                        // (Ts,C): layer input, after attention
    void *h1;                                  // (T,C): the input norm of every row (gathered over tp)
    void *h2, *h2_full;                        // (Ts,C) the post-attention norm; (T,C) gathered (== h2 without sp)
    float *rstd1, *rstd2;                      // (Ts)
    float *rstd_qa, *rstd_kv;                  // (T)
    void *qa, *q_resid;                        // (T, q_lora)
    void *q;                                   // (T, H*qk) rope slices rotated
    void *ckv;                                 // (T, kv_lora + rope) rope slice rotated
    void *latent, *latent_norm;                // (T, kv_lora)
    void *kv;                                  // (T, d_qk)
    void *q_abs;                               // absorbed form: (T, H, d_qk)
    void *out_latent;                          // absorbed form: (T, H, kv_lora)
    void *k_heads, *v_heads;                   // headwise form: (T, H, qk) [k_nope_h | k_rope], (T, H, v)
    float *lse;                                // (T, H)
    void *attn;                                // (T, H*v)
    void *iq, *ik_raw, *ik;                    // (T, nI*dI), (T, dI), (T, dI)
    float *ik_mean, *ik_rstd;                  // (T)
    float *iw_scaled;                          // (T, nI)
    int32_t *topk;                             // (T, index_topk)
    void *gate_up, *act;                       // dense MLP (T, 2I), (T, I); routed experts (N, 2I), (N, I)
    void *sh_gate_up, *sh_act;                 // shared experts (T, 2Is), (T, Is)
    void *expert_in, *expert_out;              // (N, C)
    float *router_logits, *router_probs;       // (Ts, E): routed experts see this rank's rows
    int32_t *route_idx;                        // (Ts, K)
    float *route_w;                            // (Ts, K)
    int32_t *rows;                             // (R) token of each routed row, grouped by expert
    int32_t *slot, *slot_inv;                  // (R) t*K + k of each routed row (N: a padding row), and (N) the
                                               // row of each t*K + k (rows, slot, slot_inv: one device block)
    float *row_scale;                          // (R) its routing weight (0 for padding rows)
    int64_t *count;                            // host (E+1): first row of each expert (without padding); not
                                               // filled when the device grouped the layer (moe_group_padded)
    int64_t moe_rows;                          // R: routed rows N, or E * moe_pad with padding
    int64_t moe_pad;                           // rows per expert when padded (one batched GEMM), else 0
    struct glm5_moe_ep *ep;                    // expert parallelism: the layer's dispatch (glm5_moe.c), or NULL
    void *kv_all, *ik_all;                     // context parallelism: (T_keys, d_qk), (T_keys, dI) every key of
                                               // the batch gathered over cp in global order (glm5_cp.c), else NULL
} glm5_layer_acts;

/* The head-layout gathers of glm5_heads.c: each moves a whole (T, H, d) tensor between token-major and head-major
 * layouts, or assembles one from two parts (the second part placed after the first in the same buffer). */
typedef enum glm5_head_map {
    GLM5_MAP_Q_NOPE_HM,  // q (T, H, qk) nope parts -> (H, T, nope)
    GLM5_MAP_Q_ABS,      // [(H, T, kv_lora) | (T, H, rope)] -> q_abs (T, H, kv_lora + rope)
    GLM5_MAP_LATENT_HM,  // (T, H, kv_lora) -> (H, T, kv_lora)
    GLM5_MAP_LATENT_TM,  // (H, T, kv_lora) -> (T, H, kv_lora)
    GLM5_MAP_V_HM,       // (T, H, v) -> (H, T, v)
    GLM5_MAP_V_TM,       // (H, T, v) -> (T, H, v)
    GLM5_MAP_DQ_ABS_HM,  // dq_abs (T, H, kv_lora + rope) latent parts -> (H, T, kv_lora)
    GLM5_MAP_DQ,         // [(H, T, nope) | (T, H, rope)] -> dq (T, H, qk)
    GLM5_MAP_K_HEADS,    // [kv_heads (T, H, nope + v) nope parts | (T, rope) for every head] -> k_heads (T, H, qk)
    GLM5_MAP_COUNT
} glm5_head_map;

typedef struct glm5_pass {
    dsarl_model *m;
    int64_t T;                                 // tokens of the pass: attention, indexer and LM head rows
    int64_t T_real;                            // the caller's tokens: T, or under tp a batch that tp does not
                                               // divide, padded by one segment of T - T_real pad tokens (ignored
                                               // targets, outside the indexer loss) so the rows split evenly
    bool sp;                                   // sequence parallel (tp > 1, training and prefill): the residual
                                               // stream, norms and routed experts hold T_sp = T / tp rows, rank r
                                               // rows [r T_sp, (r+1) T_sp); cached decode keeps every row (sp off)
    int64_t T_sp;                              // rows of the residual stream on this rank (T without sp)
    void *part;                                // (T,C) partial sums of row-parallel layers before their reduction
                                               // over tp (NULL without sp: they reduce in place)
    int32_t *vocab_ids;                        // tp > 1: (T) token ids local to this rank's vocabulary slice (0
    float *vocab_mask;                         // outside it) and (T) 1 inside, 0 outside; one device block
    float *vocab_rest;                         // tp > 1, host (T): log sum exp of the other ranks' logits per row
                                               // (the vocab-parallel log-softmax, kept for the backward)
    int32_t *vocab_targets;                    // tp > 1: (T) device targets of the backward's widened rows
    int32_t topk_width;                        // index_topk, or the longest sequence under dense attention
    float logit_scale;                         // LM-head logit factor (1 / temperature; dsarl_token_batch)
    dsarl_dsa_form form;                       // attention form of this pass (cached decode: always absorbed)
    bool every_key_selected;                   // no range is wider than topk_width: each top-k row lists every
                                               // eligible key, so the headwise ops get NULL indices (dense)
    int n_acts;                                // 1 (inference, recompute) or the rank's layers (training), in
                                               // glm5_stage_local_layer order
    glm5_layer_acts *acts;
    bool save;                                 // a backward follows: layers keep what it reads (x_in, x_mid)
    bool recompute;                            // training with activation recompute: layers rerun in backward
    void **x_saved;                            // recompute: (layers) each layer's input (T,C)
    int32_t **topk_saved;                      // recompute: (layers) each layer's top-k (T, topk_width)
    int32_t **stage_topk;                      // pipeline: (chunks) host array, per model chunk the (T,
                                               // topk_width) top-k received with its input when its first layer
                                               // is a shared layer (else NULL); NULL until one is received
    int32_t fwd_chunk, bwd_chunk;              // pipeline: the model chunk the next forward runs (0 up to chunks)
                                               // and the next backward (chunks - 1 down to -1)
    int *chunk_bufs;                           // training without recompute: host (2 chunks), the range of bufs
                                               // holding each chunk's layer activations, allocated as its forward
                                               // starts and freed when its backward ends
    bool staged;                               // pipeline schedule (glm5_pipeline.c): the sends, receives and pp
                                               // reductions are the schedule's, not made inside the pass
    bool input_ready, grad_ready;              // staged: p->x / the backward's dx already hold what the
                                               // neighbour stage sent
    const int32_t *out_topk;                   // staged: the top-k the next stage's first (shared) layer reuses
    void *x;                                   // (T_sp,C) residual stream
    void *h_final;                             // (T,C) final norm output (gathered over tp)
    float *rstd_final;                         // (T_sp)
    float *logits;                             // (head_rows,V/tp) device, float32 whatever the storage: this
                                               // rank's slice of every row, or of one chunk of rows (glm5_head.c)
    int64_t head_rows;                         // rows of logits: T, or policy.logprob_chunk_size when smaller
    void *head_in, *head_out;                  // head-major staging (H, T, glm5_head_stage(cfg)) each
    void *kv_heads;                            // headwise form: (T, H*(nope+v)) latent_norm kv_b_proj^T, then
                                               // (T, rope) room for the shared rope key (k_heads' second part)
    struct glm5_moe_ep_scratch *ep_scratch;    // expert parallelism: buffers every MoE layer reuses (glm5_moe.c)
    int32_t *head_maps[GLM5_MAP_COUNT];        // device rows of the head-layout gathers (the model's), NULL until
                                               // glm5_head_maps_prepare
    void *tmp;                                 // (T,C) scratch
    int32_t *tokens, *positions, *key_start, *key_end; // (T) device
    dsarl_dsa_batch batch;                     // host_cu_seqlens: the pass's own copy (kept for the backward)
    struct glm5_cp *cp;                        // context parallelism (glm5_cp.c): this rank's rows of the batch
                                               // (T = T_real = T_local) and the key gathers; NULL without cp
    struct glm5_mtp *mtp;                      // training with MTP depths (glm5_mtp.c): their forward, kept for
                                               // the backward; NULL otherwise
    dsarl_model_cache *cache;                  // cached inference (glm5_decode.c): keys live in the cache; else NULL
    int32_t *cache_rows;                       // (T) device: the cache row each token's keys are written to
    // paged cache (glm5_forward_paged): each layer's keys are gathered from the blocks into one contiguous key
    // array per call, every sequence's tokens in order, so the DSA ops see the ranges of a contiguous cache
    int32_t *key_rows;                         // (n_key_rows) device: the cache row of each gathered key, or NULL
    int64_t n_key_rows;
    void *key_kv, *key_ik;                     // (n_key_rows, kv_lora + rope), (n_key_rows, index_head_dim)
    bool logits_device;                        // the caller's logits are device memory (forward_paged)
    dsarl_batch_routing routing;               // routing replay / recording of the batch (glm5_routing.c)
    int32_t *routing_key_first;                // host (T): key index of each token's sequence's first token
    void **bufs, **host_bufs;                  // everything allocated, freed by glm5_pass_free
    int n_bufs, n_host, cap_bufs, cap_host;
} glm5_pass;

/* Sequence-parallel collectives over the tp group (identities in a single process):
 * glm5_sp_gather: full (T, width) = every rank's local (T_sp, width) rows; without sp, a copy unless they alias.
 * glm5_sp_reduce: local (T_sp, width) = this rank's block of the sum over tp of partial (T, width) (reduce-scatter);
 *   without sp the sum is all-reduced in place in partial (then copied to local unless they alias).
 * glm5_partial_out: where a row-parallel layer writes its partial (T, width) sums for glm5_sp_reduce into local:
 *   p->part under sp, else local itself. width is in storage elements. */
int glm5_sp_gather(glm5_pass *p, void *full, const void *local, int64_t width, dsarl_error *err);
int glm5_sp_reduce(glm5_pass *p, void *local, void *partial, int64_t width, dsarl_error *err);
static inline void *glm5_partial_out(glm5_pass *p, void *local)
{
    return p->sp ? p->part : local;
}

/* Uploads p->vocab_ids and p->vocab_mask (allocated here) for the T token ids of the batch (tp > 1 only). */
int glm5_upload_vocab_ids(glm5_pass *p, const int32_t *tokens, dsarl_error *err);

/* x (T_sp, C) = the embedding rows of the batch's tokens (vocab-parallel under tp: each rank looks up the ids of
 * its slice, the partial rows are summed over tp). */
int glm5_embed(glm5_pass *p, dsarl_error *err);

/* host (rows, V) float32 = the whole rows of the vocab-parallel device logits local (rows, V/tp) of every tp rank
 * (an all-gather: the tool paths forward_logits and cached decode, never training). */
int glm5_gather_vocab(dsarl_model *m, float *host, const float *local, int64_t rows, dsarl_error *err);

/* Pipeline stages (glm5_pipeline.c), for this rank's model chunk c; the send/recv calls are made only where the
 * chunk has that neighbour (virtual stage k talks to k - 1 and k + 1: the previous and next pp rank, the last rank's
 * chunk c to the first rank's chunk c + 1):
 * glm5_stage_input: p->x = the embedding (the first virtual stage) or the previous virtual stage's output;
 *   *prev_topk = the top-k the chunk's first layer reuses when it is a shared layer (received with it), else NULL.
 * glm5_stage_output: sends p->x (and topk when the next virtual stage starts on a shared layer) on.
 * glm5_stage_grad_input / glm5_stage_grad_output: the residual stream's gradient dx (T_sp, C) from the next virtual
 *   stage, to the previous one. */
int glm5_stage_input(glm5_pass *p, int32_t c, const int32_t **prev_topk, dsarl_error *err);
int glm5_stage_output(glm5_pass *p, int32_t c, const int32_t *topk, dsarl_error *err);
int glm5_stage_grad_input(glm5_pass *p, void *dx, dsarl_error *err);
int glm5_stage_grad_output(glm5_pass *p, const void *dx, dsarl_error *err);

/* The top-k received with chunk c's input (NULL when its first layer is not a shared layer). */
static inline const int32_t *glm5_stage_topk(const glm5_pass *p, int32_t c)
{
    return p->stage_topk ? p->stage_topk[c] : NULL;
}

/* Runs the forward pass; save keeps every layer's activations for glm5_backward_pass. Free with
 * glm5_pass_free, also on failure. glm5_pass_begin allocates and uploads everything, glm5_pass_layers then runs
 * the stage's layers (and on the last stage the head): a pipelined stage receives its input in between. Under a
 * pipeline schedule (p->staged) glm5_pass_layers runs one model chunk, p->fwd_chunk, else all of them in turn. */
int glm5_pass_forward(dsarl_model *m, const dsarl_token_batch *batch, bool save, glm5_pass *p, dsarl_error *err);
int glm5_pass_begin(dsarl_model *m, const dsarl_token_batch *batch, bool save, glm5_pass *p, dsarl_error *err);
int glm5_pass_layers(glm5_pass *p, dsarl_error *err);

/* Runs decoder layer i on p->x in place, keeping its activations in a; prev_topk is the previous layer's top-k
 * (NULL for layer 0), which a shared layer reuses. */
int glm5_layer_forward(glm5_pass *p, glm5_layer_acts *a, int32_t i, const int32_t *prev_topk, dsarl_error *err);

/* Allocates one layer's activations for p->T tokens and p->topk_width top-k slots. */
int glm5_layer_acts_alloc(glm5_pass *p, glm5_layer_acts *a, dsarl_error *err);

/* Elements per unit of the head-layout gathers: the gcd of the head widths (nope, rope, kv_lora, v). */
int64_t glm5_head_unit(const glm5_config *c);

/* Width of one head-major staging buffer per (head, token): max(nope, kv_lora + rope, v, qk). */
static inline int64_t glm5_head_stage(const glm5_config *c)
{
    int64_t s = c->qk_nope_head_dim > c->v_head_dim ? c->qk_nope_head_dim : c->v_head_dim;
    s = c->kv_lora_rank + c->qk_rope_head_dim > s ? c->kv_lora_rank + c->qk_rope_head_dim : s;
    return c->qk_head_dim > s ? c->qk_head_dim : s;
}

/* Points p->head_maps at the model's maps for p->T, building and uploading them (one copy) when T changed. */
int glm5_head_maps_prepare(glm5_pass *p, dsarl_error *err);

/* out = the gather of src by map k (uploaded before). */
int glm5_head_gather(glm5_pass *p, glm5_head_map k, void *out, const void *src, dsarl_error *err);

/* Absorbed queries q_abs (T, H, kv_lora + rope) = [q_nope_h W_UK_h | q_rope_h] of q (T, H*qk), one batched GEMM
 * over heads; stage_in and stage_out hold (H, T, glm5_head_stage) each; maps Q_NOPE_HM and Q_ABS. */
int glm5_absorb_queries(glm5_pass *p, const glm5_layer *L, const void *q, void *q_abs, void *stage_in,
                        void *stage_out, dsarl_error *err);

/* attn (T, H*v) = out_latent_h W_UV_h^T per head of out_latent (T, H, kv_lora), one batched GEMM; staging as
 * glm5_absorb_queries; maps LATENT_HM and V_TM. */
int glm5_values_from_latent(glm5_pass *p, const glm5_layer *L, const void *out_latent, void *attn, void *stage_in,
                            void *stage_out, dsarl_error *err);

/* Routed experts run as one batched GEMM over every expert, each group padded to the largest, when the padding adds
 * at most 1/GLM5_MOE_PAD_WASTE of the rows (balanced routing: one launch instead of E) or, on a launch-bound device,
 * when the largest group has at most GLM5_MOE_PAD_MAX rows (decode: a few rows per expert, where 2 x E latency-bound
 * GEMMs cost far more than the padding rows; on the host BLAS the padding rows would be real work); else per
 * expert. The host device's per-expert results are then the reference for a GPU's padded ones. */
#define GLM5_MOE_PAD_MAX 64
#define GLM5_MOE_PAD_WASTE 4

/* Rows per expert of the padded layout for T tokens whose largest expert group has `largest` rows, or 0. */
static inline int64_t glm5_moe_pad(const dsarl_model *m, int64_t T, int64_t largest)
{
    int64_t N = T * m->cfg.num_experts_per_tok, E = m->cfg.n_routed_experts;
    bool small = m->launch_bound && largest <= GLM5_MOE_PAD_MAX;
    return small || E * largest * GLM5_MOE_PAD_WASTE <= N * (GLM5_MOE_PAD_WASTE + 1) ? largest : 0;
}

/* Row capacity of the routed-expert buffers for T tokens: the most glm5_moe_pad can ask for, at least N. */
static inline int64_t glm5_moe_rows_cap(const glm5_config *c, int64_t T)
{
    int64_t N = T * c->num_experts_per_tok, E = c->n_routed_experts;
    int64_t waste = (N * (GLM5_MOE_PAD_WASTE + 1) / GLM5_MOE_PAD_WASTE / E) * E, small = E * GLM5_MOE_PAD_MAX;
    waste = waste > N ? waste : N;
    return waste > small ? waste : small;
}

/* Rows of this rank's routed-expert buffers for T tokens (expert_in/out, rows, row_scale, dexp, dxin): the padded
 * capacity, or N = T*K under expert parallelism (no padding there). */
static inline int64_t glm5_moe_rows(const dsarl_model *m, int64_t T)
{
    return m->shards.ep_size > 1 ? T * m->cfg.num_experts_per_tok : glm5_moe_rows_cap(&m->cfg, T);
}

/* Rows the routed experts' activations take in the pass's gate_up/act (and the backward's dact/dgu): the local
 * routed rows, or none under expert parallelism (the owners' activations live in glm5_moe.c's dispatch). */
static inline int64_t glm5_moe_act_rows(const dsarl_model *m, int64_t T)
{
    return m->shards.ep_size > 1 ? 0 : glm5_moe_rows(m, T);
}

/* Storage elements per float32 value: gather_rows moves float32 arrays as rows of this many elements (4 bytes). */
static inline int64_t glm5_f32_units(const dsarl_model *m)
{
    return (int64_t)(sizeof(float) / m->elem);
}

/* Allocates device memory owned by the pass. */
int glm5_pass_alloc(glm5_pass *p, size_t bytes, void **out, dsarl_error *err);

/* Frees everything the pass allocated. */
void glm5_pass_free(glm5_pass *p);

/* Training without recompute: allocates the activations of model chunk c's layers (glm5_pass_begin leaves them to
 * the chunk's forward), or frees them once its backward is done. */
int glm5_pass_chunk_acts(glm5_pass *p, int32_t c, dsarl_error *err);
void glm5_pass_free_chunk_acts(glm5_pass *p, int32_t c);

/* y (T,out) = x (T,in) W^T with W (out,in), as nn.Linear. */
int glm5_linear(dsarl_model *m, void *y, const void *x, const void *w, int64_t T, int64_t in, int64_t out,
                dsarl_error *err);


/* Host scratch freed with the pass. */
int glm5_pass_host_alloc(glm5_pass *p, size_t bytes, void **out, dsarl_error *err);

/* Routing replay (glm5_routing.c). glm5_routing_prepare takes the batch's replay / record rows into p (after the
 * batch upload: key_first (T) host is each token's first key, NULL for a packed training batch) and refuses layouts
 * it cannot serve; glm5_routing_experts replays then records MoE layer `layer`'s expert ids idx (T, K) host (and
 * when it replays, rewrites a->route_idx and a->route_w from the pass's own scores); glm5_routing_indices does the
 * same for a full-indexer layer's a->topk. Both leave an MTP depth's layer (>= num_hidden_layers) alone: the rows
 * cover the trunk's layers only. */
int glm5_routing_shape(const dsarl_model *m, dsarl_routing_shape *out, dsarl_error *err);
int glm5_routing_prepare(glm5_pass *p, const dsarl_token_batch *b, const int32_t *key_first, dsarl_error *err);
int glm5_routing_experts(glm5_pass *p, glm5_layer_acts *a, int32_t layer, int32_t *idx, dsarl_error *err);
/* Whether glm5_routing_experts has work on MoE layer `layer` (the batch records experts, or replays a row of
 * this layer), so the layer's expert ids must come to the host; else the grouping may stay on the device. */
bool glm5_routing_experts_on_host(const glm5_pass *p, int32_t layer);
int glm5_routing_indices(glm5_pass *p, glm5_layer_acts *a, int32_t layer, dsarl_error *err);
/* Under pipeline parallelism, after a cached pass that records: every stage's rows complete (each stage recorded
 * its own layers' columns). Collective over pp; nothing otherwise. */
int glm5_routing_share_stages(glm5_pass *p, dsarl_error *err);

/* The routed experts of MoE layer L (glm5_moe.c): y (T,C) = sum over the token's top-k experts of the routing weight
 * times the expert's SwiGLU output of a->h2; the routing is kept in a for the backward. */
int glm5_moe_forward(glm5_pass *p, glm5_layer_acts *a, const glm5_layer *L, void *y, dsarl_error *err);

/* Expert parallelism: MoE layer L's dispatch for a rank with no tokens (a: zeroed activations, filled with what
 * the exchanges need), which still serves its experts to the ep peers; nothing without EP. */
int glm5_moe_serve(glm5_pass *p, glm5_layer_acts *a, const glm5_layer *L, dsarl_error *err);

// Backward scratch, sized once per call.
typedef struct glm5_grad_bufs {
    float *dlogits, *dlogprobs, *drouter, *dscale, *droute_w, *iw_grad, *idloss;
    float *ilosses;                                     // (layers, T) per-token indexer KL, summed after the loop
    int32_t *targets;
    void *dx, *dh, *dh2, *dtmp;                         // (T_sp,C) residual-stream rows
    void *dfull, *dpart;                                // sp: (T,C) gathered gradients and partial sums (else
                                                        // NULL: the T_sp = T buffers above serve)
    void *q_heads, *q_stage;                            // tp > 1 with the indexer loss: every head's q_abs
    float *lse_heads, *lse_stage;                       // (T,H_all,d_qk) and lse (T,H_all), and their all-gathers
    void *dattn, *dout_latent, *dq_abs, *dkv, *dq;      // attention (dout_latent, dq_abs: absorbed form only)
    void *dk_heads, *dv_heads, *dkv_heads, *dk_sum;     // headwise form: (T,H,qk), (T,H,v), (T,H*(nope+v)), (T,qk)
    void *ones;                                         // headwise form: (T,H) ones, the head-sum GEMM's left side
    void *q_abs;                                        // headwise form with the indexer loss: (T,H,d_qk)
    void *dqr, *dqa, *dlat, *dlatn, *dckv;
    void *s1, *s2, *s3;                                 // head-major staging (s1, s2: the pass's head_in, head_out)
    void *dact, *dgu, *dexp, *dxin;                     // MLP / experts
    void *diq, *dik, *dik_raw, *diw;                    // indexer
    void *dlogits_s, *drouter_s;                        // dlogits, drouter in the storage dtype (GEMM operands)
    void *dkv_all, *dik_all;                            // cp: (T_keys, d_qk), (T_keys, dI) key gradients of this
                                                        // rank's queries, reduce-scattered to their owners
} glm5_grad_bufs;


/* A training pass (train_forward .. train_backward, or one pipeline slot): the saved forward, its grad_bufs
 * (targets on the device, the rest allocated for the backward). */
struct glm5_train {
    glm5_pass p;
    glm5_grad_bufs g;
    bool grad_bufs_ready;
};

/* The training pass in parts (glm5_backward.c): open = allocate and upload the batch (staged: a pipeline slot,
 * whose transfers the schedule makes); run_forward = the stage's layers, and on the last stage the log-probs (T)
 * host; grad_bufs = the backward's buffers (once); run_backward = the backward, accumulating into the gradients;
 * free releases it. */
int glm5_train_open(dsarl_model *m, const dsarl_token_batch *batch, bool staged, glm5_train **out, dsarl_error *err);
int glm5_train_run_forward(dsarl_model *m, glm5_train *tr, const int32_t *targets, float *logprobs,
                           dsarl_error *err);
int glm5_train_grad_bufs(dsarl_model *m, glm5_train *tr, dsarl_error *err);
int glm5_train_run_backward(dsarl_model *m, glm5_train *tr, const float *dlogprobs, float *indexer_loss,
                            dsarl_error *err);
void glm5_train_free(glm5_train *tr);

/* Backward of decoder layer i (its activations in a) from g->dx (T_sp, C), the gradient of its output: g->dx
 * becomes the gradient of its input; its weight gradients accumulate, with the indexer loss's when its coefficient
 * is > 0 (g->idloss uploaded). Uses g->dh, dh2, dtmp as scratch. */
int glm5_layer_backward(glm5_pass *p, glm5_grad_bufs *g, const glm5_layer_acts *a, int32_t i, dsarl_error *err);

/* Multi-token prediction in training (glm5_mtp.c), under data and expert parallelism (glm5_mtp_configure).
 * glm5_mtp_forward: after the trunk's log-probs (p->h_final kept), every MTP depth's forward and loss from the
 *   caller's targets (T) host, m->mtp_loss = the loss; p->mtp keeps them for the backward.
 * glm5_mtp_backward: inside the head's backward, once g->dh holds h_final's gradient from the LM head: adds the MTP
 *   loss's gradient to it (the depths', embedding's and LM head's weight gradients accumulate). */
int glm5_mtp_forward(glm5_pass *p, const int32_t *targets, dsarl_error *err);
/* Before the backward: what the MTP loss counts and divides by (the model op mtp_loss, dsarl/ops/model.h; mask
 * (T) may be NULL, norm_tokens 0: each depth's own mean); m->mtp_loss and *loss (may be NULL) = the loss. Returns
 * the depths. */
int glm5_mtp_weigh(glm5_pass *p, const float *mask, double norm_tokens, float *loss);
int glm5_mtp_backward(glm5_pass *p, glm5_grad_bufs *g, dsarl_error *err);

/* Backward of glm5_moe_forward from dy (T,C): expert and router weight gradients accumulated, dh2 (T,C)
 * accumulated with the input gradient. */
int glm5_moe_backward(glm5_pass *p, glm5_grad_bufs *g, const glm5_layer_acts *a, const glm5_layer *L,
                      const void *dy, void *dh2, dsarl_error *err);

/* Linear-layer gradients for y = x W^T over n rows: dW (out,in) += dy^T x; dx (n,in) = dy W (beta 0 overwrites,
 * 1 accumulates). */
int glm5_linear_dweight(dsarl_model *m, const void *w, const void *dy, const void *x, int64_t n, int64_t in,
                        int64_t out, dsarl_error *err);
int glm5_linear_dinput(dsarl_model *m, void *dx, const void *dy, const void *w, int64_t n, int64_t in, int64_t out,
                       float beta, dsarl_error *err);

/* A float32 gradient (n) as a storage-dtype GEMM operand: itself on float32 storage, else converted into tmp (*rc
 * gets a conversion failure). */
const void *glm5_storage_operand(dsarl_model *m, const float *g32, void *tmp, int64_t n, dsarl_error *err, int *rc);

/* The LM head over row chunks (glm5_head.c; policy.logprob_chunk_size).
 * glm5_head_rows: rows of logits a pass of T tokens holds at once: T, or the chunk when tp is 1 and it is smaller.
 * glm5_head_chunk_logits: p->logits (n, V) = logits of rows [r0, r0 + n) of p->h_final.
 * glm5_head_logprobs: logprobs (T) device of targets (T) device, chunk by chunk when p->head_rows < T (else from
 *   the logits glm5_pass_forward left).
 * glm5_head_backward: from g->dlogprobs and g->targets, lm_head's gradient accumulated and dh (T, C) written
 *   (tp 1; the logits of a chunked pass are recomputed). */
int64_t glm5_head_rows(const dsarl_model *m, int64_t T);
int glm5_head_chunk_logits(glm5_pass *p, int64_t r0, int64_t n, dsarl_error *err);
int glm5_head_logprobs(glm5_pass *p, float *logprobs, const int32_t *targets, dsarl_error *err);
int glm5_head_backward(glm5_pass *p, glm5_grad_bufs *g, void *dh, dsarl_error *err);

#endif /* DSARL_GLM5_PASS_H */
