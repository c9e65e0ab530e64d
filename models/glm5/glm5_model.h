/* glm5_model.h: the glm_moe_dsa implementation behind the glm5.1 and glm5.2 model tables.
 *
 * One model instance owns one float buffer of parameters on its device; every parameter has a spec (its Hugging
 * Face name, shape, offset in the buffer, and how it shards under tensor/expert parallelism). The forward pass
 * composes the device ops and the DSA ops tables only, so the same code runs on every device. */
#ifndef DSARL_GLM5_MODEL_H
#define DSARL_GLM5_MODEL_H

#include "dsarl/ops/model.h"
#include "dsarl/safetensors.h"
#include "glm5_config.h"

/* How a parameter is split across ranks (Megatron semantics): the shard kind decides the split dimension and the
 * group (docs/parallel.md). Heads and intermediate features split contiguously, so a rank's rows (or columns) are
 * one block of the full tensor. */
typedef enum glm5_shard {
    GLM5_SHARD_REPLICATED = 0, /* norms, router, indexer: every TP rank holds it whole */
    GLM5_SHARD_COLUMN = 1,     /* output features split over TP (q_b, kv_b, gate/up projections) */
    GLM5_SHARD_ROW = 2,        /* input features split over TP (o_proj, down projections) */
    GLM5_SHARD_EXPERT = 3,     /* leading expert dimension split over EP */
    GLM5_SHARD_VOCAB = 4,      /* vocabulary rows split over TP (embedding, LM head) */
} glm5_shard;

/* Name of a shard kind ("column", ...). */
const char *glm5_shard_name(glm5_shard shard);

/* The attention form of training/prefill passes (policy.megatron_cfg.model_overrides.dsa_attention_form). Both are
 * the same function: absorbed = MQA over the shared latent (sparse_mla_*), headwise = per-head keys and values from
 * kv_b_proj (headwise_attention_*, the form cuDNN's fused attention serves). Cached decode is always absorbed. */
typedef enum glm5_attention_form {
    GLM5_FORM_AUTO = 0,     /* ask the DSA backend's preferred_form per batch (absorbed when it has none) */
    GLM5_FORM_ABSORBED = 1,
    GLM5_FORM_HEADWISE = 2,
} glm5_attention_form;

/* True when a DSA backend serves the per-head form (both ABI 1.1 headwise ops set). */
static inline bool glm5_dsa_has_headwise(const dsarl_dsa_ops *dsa)
{
    return DSARL_DSA_HAS(dsa, headwise_attention_forward) && DSARL_DSA_HAS(dsa, headwise_attention_backward);
}

/* This rank's place in the tensor- and expert-parallel splits (all 0 of 1 in a single process). */
typedef struct glm5_shards {
    int32_t tp_rank, tp_size;
    int32_t ep_rank, ep_size;
} glm5_shards;

#define GLM5_SHARDS_SINGLE ((glm5_shards){.tp_rank = 0, .tp_size = 1, .ep_rank = 0, .ep_size = 1})

typedef struct glm5_param {
    char name[96];     /* Hugging Face key, e.g. "model.layers.3.mlp.experts.gate_up_proj" (fused experts) */
    int32_t ndim;
    int64_t shape[3];  /* this rank's shard */
    int64_t numel;     /* elements of the shard */
    int64_t full_shape[3]; /* the whole tensor (the Hugging Face shape) */
    int64_t full_numel;
    int32_t shard_dim;     /* the split dimension (0 or 1), or -1 when this rank holds the whole tensor */
    int64_t shard_start;   /* first index of this rank's block along shard_dim */
    int64_t offset;    /* elements into glm5_model.weights */
    glm5_shard shard;
    bool trainable;    /* false for e_score_correction_bias (a buffer updated by load balancing) */
    int32_t layer;     /* decoder layer, or -1 */
    int64_t spec_index; /* position in the whole model's list (every stage's): seeds its random init */
} glm5_param;

/* This rank's pipeline stage (glm5_pipeline.c): decoder layers [first, end) of the model's; the first stage holds
 * the embedding, the last the final norm and LM head (and, with tied embeddings, the embedding too). */
typedef struct glm5_stage {
    int32_t rank, size;  /* pp rank and size (0 of 1 without pipeline parallelism) */
    int32_t chunks;      /* model chunks (virtual stages) this rank holds: 1, or virtual_pipeline_model_parallel_size */
    int32_t *starts;     /* (chunks * size + 1) the first layer of every virtual stage k = chunk * size + rank
                          * (dsarl_pipeline_chunk_layers; {0, layers} for one stage); owned by the model */
} glm5_stage;

/* Device pointers to one decoder layer's weights (NULL where the layer has none). */
typedef struct glm5_layer {
    void *input_norm, *post_attention_norm;
    void *q_a_proj, *q_a_norm, *q_b_proj, *kv_a_proj, *kv_a_norm, *kv_b_proj, *o_proj;
    void *idx_wq_b, *idx_wk, *idx_k_norm_w, *idx_k_norm_b, *idx_weights_proj;
    void *mlp_gate_up, *mlp_down;          /* dense MLP, or the shared experts of a MoE layer: gate rows then up */
    int64_t mlp_inner;                     /* intermediate size of mlp_gate_up / mlp_down */
    void *router, *router_bias;            /* (E, C), (E) */
    float *router_bias32;                  /* (E) float32 copy the router reads (== router_bias on f32 storage) */
    void *experts_gate_up, *experts_down;  /* (E, 2*moe_inter, C), (E, C, moe_inter) */
    void *enorm, *hnorm, *eh_proj, *head_norm; /* MTP depths only: (C), (C), (C, 2C), shared_head.norm (C) */
    void *mtp_embed, *mtp_head;            /* an MTP depth's own embed_tokens / shared_head.head (V, C), or NULL */
} glm5_layer;

/* What the last glm5_load_hf_weights read on this rank: the bytes of its tensor slices (in the file's dtype),
 * the header bytes of the files it opened, and how many of the directory's files those were. Tests compare it
 * with the rank's share of the model; the loader logs it at debug level. */
typedef struct glm5_hf_read {
    int64_t data_bytes, header_bytes;
    int64_t files_opened, files_listed;
} glm5_hf_read;

/* Tensors of the loaded checkpoint that the model does not build but must not lose: the MTP layers (keys of layers
 * >= num_hidden_layers, which serving engines use for speculative decoding). World rank 0, which writes saves,
 * keeps the files that hold them mapped and writes them back unchanged (their own dtype and bytes) with every save;
 * other ranks keep none. */
typedef struct glm5_extra {
    dsarl_safetensors_file **files;       /* open mappings that hold at least one kept tensor */
    size_t n_files;
    char **names;                          /* the kept keys, in the order the checkpoint lists them */
    size_t *file_of;                       /* (n) index into files */
    size_t n;
} glm5_extra;

void glm5_extra_free(glm5_extra *x);

struct dsarl_model {
    glm5_config cfg;
    json_t *hf_config;           /* config.json of the loaded directory (kept so save keeps its other keys), or NULL */
    const dsarl_device_ops *dev_ops;
    dsarl_device *dev;
    const dsarl_dsa_ops *dsa_ops;
    dsarl_dsa_context *dsa;
    dsarl_parallel parallel;
    glm5_shards shards;          /* this rank's tensor/expert shard (from parallel) */
    glm5_stage stage;            /* this rank's pipeline stage (every layer without pipeline parallelism) */
    glm5_param *params;
    int64_t n_params, n_weights; /* specs, and float elements in weights */
    void *weights;               /* device buffer holding every parameter */
    void *grads;                 /* same layout as weights; allocated by the first zero_grad/backward */
    float indexer_loss_coeff;    /* policy.megatron_cfg.model_overrides.dsa_indexer_loss_coeff */
    bool indexer_sparse_loss;    /* ...dsa_indexer_use_sparse_loss: KL over the top-k set, else all keys */
    bool dense_attention;        /* ...dsa_dense_attention: every causal key attended (DSA dense warm-up) */
    glm5_attention_form attention_form; /* ...dsa_attention_form: absorbed, headwise, or auto (the backend's) */
    bool activation_recompute;   /* policy.megatron_cfg.activation_checkpointing: keep only layer inputs */
    int64_t logprob_chunk;       /* policy.logprob_chunk_size: LM-head rows at a time (glm5_head.c), 0: all */
    bool launch_bound;           /* device calls cost far more than small GEMMs (DSARL_DEVICE_CAP_LAUNCH_BOUND):
                                  * small expert groups are padded into one batched GEMM (glm5_moe_pad) */
    float mtp_loss_scale;        /* policy.megatron_cfg.mtp_loss_scaling_factor (cfg.mtp_layers > 0) */
    float mtp_loss;              /* the MTP loss of the last training pass (glm5_mtp.c), 0 with MTP off */
    glm5_layer *layers;          /* (glm5_built_layers) the trunk's, then the MTP depths' blocks */
    void *embed, *final_norm, *lm_head;
    float *inv_freq;             /* device (rope_dim/2) */
    float *router_bias32;        /* device (layers, E) float32 router biases when storage is not float32, else NULL:
                                  * a bias decides top-k near-ties, so bf16 rounding would change routing */
    dsarl_dtype storage;         /* the device's storage dtype for weights and activations */
    size_t elem;                 /* its size in bytes */
    struct glm5_optim *optim;    /* AdamW state (glm5_optim.c), NULL until the first optimizer step or load */
    struct glm5_head_maps *head_maps; /* head-layout gather rows for the last pass's token count (glm5_heads.c) */
    struct glm5_train *train;    /* the pending training pass of train_forward (glm5_backward.c), or NULL */
    struct glm5_train **stage_slots; /* pipeline schedule: (glm5_stage_slots) the passes in flight, NULL until used */
    glm5_hf_read hf_read;        /* what the last Hugging Face load read on this rank (glm5_hf_io.c) */
    glm5_extra extra;            /* MTP tensors carried from load to save (glm5_hf_io.c) */
};

/* Attention heads of this rank: tensor parallelism splits them into contiguous blocks (q_b_proj, kv_b_proj rows,
 * o_proj columns). */
static inline int64_t glm5_local_heads(const dsarl_model *m)
{
    return m->cfg.num_attention_heads / m->shards.tp_size;
}

/* Vocabulary rows of this rank (embedding and LM head split by tensor parallelism), from tp_rank times it. */
static inline int64_t glm5_local_vocab(const dsarl_model *m)
{
    return m->cfg.vocab_size / m->shards.tp_size;
}

/* base advanced by n elements of the model's storage dtype. */
static inline void *glm5_at(const dsarl_model *m, const void *base, int64_t n)
{
    return (char *)base + (size_t)n * m->elem;
}

/* Uploads n host float32 values into parameter p from element `at` of it; a router bias also updates the float32
 * copy the router reads. Every write of weights goes through here. */
int glm5_upload_param(dsarl_model *model, const glm5_param *p, int64_t at, const float *host, size_t n,
                      dsarl_error *err);

/* The float32 device copy of router-bias parameter p when the model keeps one (bf16 storage), else NULL. */
float *glm5_param_f32_copy(const dsarl_model *model, const glm5_param *p);

/* Lists every parameter of cfg in buffer order, each as this rank's shard (shards NULL: whole tensors); *out is
 * malloc'ed (caller frees). The layout must have passed glm5_check_layout. */
int glm5_param_specs(const glm5_config *cfg, const glm5_shards *shards, glm5_param **out, int64_t *n_params,
                     int64_t *n_weights, dsarl_error *err);

/* Refuses, in one sentence naming the sizes, a tensor/expert-parallel layout cfg cannot be split by: heads,
 * intermediate sizes and the vocabulary by tp, routed experts by ep. */
int glm5_check_layout(const glm5_config *cfg, const dsarl_parallel *parallel, dsarl_error *err);

/* The group whose members hold replicas of parameter p's gradient, summed before the optimizer step (data-parallel
 * reduction): dp_cp for dense parameters, edp for routed experts (an expert shard is replicated only over edp; its
 * gradient already gathered every token routed to it through the expert all-to-all). NULL in a single process. */
const dsarl_group *glm5_param_dp_group(const dsarl_model *m, const glm5_param *p);

/* Whether this rank adds parameter p's gradient to the global gradient norm's sum of squares (after the gradient
 * reduction every replica holds the same values; each element is counted on exactly one rank of the world). */
bool glm5_param_counts_in_norm(const dsarl_model *m, const glm5_param *p);

/* Copies this rank's shard of parameter p out of the whole tensor full (p->full_numel values) into local. */
void glm5_param_take_shard(const glm5_param *p, const float *full, float *local);

/* Trainable parameters and buffer elements of cfg, without allocating weights. */
int glm5_count_parameters(const glm5_config *cfg, int64_t *trainable, int64_t *buffers, dsarl_error *err);

/* Allocates an instance with uninitialised weights on the given device and DSA backend; under pipeline
 * parallelism only the parameters of this rank's stage, split as recipe says (NULL: evenly). */
int glm5_model_alloc(const glm5_config *cfg, const dsarl_device_ops *dev_ops, dsarl_device *dev,
                     const dsarl_dsa_ops *dsa_ops, dsarl_dsa_context *dsa, const dsarl_parallel *parallel,
                     dsarl_model **out, dsarl_error *err);
int glm5_model_alloc_staged(const glm5_config *cfg, const dsarl_device_ops *dev_ops, dsarl_device *dev,
                            const dsarl_dsa_ops *dsa_ops, dsarl_dsa_context *dsa, const dsarl_parallel *parallel,
                            const dsarl_node *recipe, dsarl_model **out, dsarl_error *err);

/* --- pipeline parallelism (glm5_pipeline.c) ------------------------------------------------------------------- */

/* This rank's stage of cfg under parallel (its model chunks under virtual stages), split as recipe says
 * (dsarl_pipeline_chunk_layers); refuses a layout the model cannot run in one sentence naming the keys. */
int glm5_stage_resolve(const glm5_config *cfg, const dsarl_parallel *parallel, const dsarl_node *recipe,
                       glm5_stage *out, dsarl_error *err);

/* The decoder layers [first, end) of this rank's model chunk c (the whole stage without virtual stages). */
static inline int32_t glm5_chunk_first(const glm5_stage *s, int32_t c) { return s->starts[c * s->size + s->rank]; }
static inline int32_t glm5_chunk_end(const glm5_stage *s, int32_t c) { return s->starts[c * s->size + s->rank + 1]; }

/* Whether this rank's chunk c is the whole pipeline's first virtual stage (it embeds) / its last (the head's). */
static inline bool glm5_chunk_is_first(const dsarl_model *m, int32_t c) { return m->stage.rank == 0 && c == 0; }
static inline bool glm5_chunk_is_last(const dsarl_model *m, int32_t c)
{
    return m->stage.rank == m->stage.size - 1 && c == m->stage.chunks - 1;
}

/* The chunk of this rank holding decoder layer i, or -1 when another rank holds it. */
static inline int32_t glm5_stage_chunk_of(const glm5_stage *s, int32_t i)
{
    for (int32_t c = 0; c < s->chunks; c++)
        if (i >= glm5_chunk_first(s, c) && i < glm5_chunk_end(s, c))
            return c;
    return -1;
}

/* Whether this rank holds decoder layer i / the embedding (first stage: its chunk 0 is virtual stage 0) / the final
 * norm and LM head (last: its last chunk is the last virtual stage). */
static inline bool glm5_stage_has_layer(const dsarl_model *m, int32_t i)
{
    return glm5_stage_chunk_of(&m->stage, i) >= 0;
}
static inline bool glm5_stage_is_first(const dsarl_model *m) { return m->stage.rank == 0; }
static inline bool glm5_stage_is_last(const dsarl_model *m) { return m->stage.rank == m->stage.size - 1; }

/* Decoder layers this rank holds, and layer i's place among them (i held): the index of its activations. */
static inline int32_t glm5_stage_n_layers(const glm5_stage *s)
{
    int32_t n = 0;
    for (int32_t c = 0; c < s->chunks; c++)
        n += glm5_chunk_end(s, c) - glm5_chunk_first(s, c);
    return n;
}
static inline int32_t glm5_stage_local_layer(const glm5_stage *s, int32_t i)
{
    int32_t n = 0;
    for (int32_t c = 0; c < s->chunks; c++) {
        if (i >= glm5_chunk_first(s, c) && i < glm5_chunk_end(s, c))
            return n + i - glm5_chunk_first(s, c);
        n += glm5_chunk_end(s, c) - glm5_chunk_first(s, c);
    }
    return -1;
}

/* Pipeline slots of the model's stage ops: pp (1F1B), 2 pp under virtual stages (the interleaved schedule's window). */
static inline int32_t glm5_stage_slots(const glm5_stage *s) { return s->chunks > 1 ? 2 * s->size : s->size; }

/* Whether parameter p (a spec of the whole model) belongs to stage s of cfg. */
bool glm5_stage_holds(const glm5_config *cfg, const glm5_stage *s, const glm5_param *p);

/* Keeps the specs of stage s in params (n of them, in buffer order) and packs their offsets; *n and *n_weights
 * become the stage's counts. */
void glm5_stage_filter_specs(const glm5_config *cfg, const glm5_stage *s, glm5_param *params, int64_t *n,
                             int64_t *n_weights);

/* host (n float32) = the last stage's values, on every rank of the pp group (log-probs, logits). */
int glm5_stage_share_last(dsarl_model *m, float *host, int64_t n, dsarl_error *err);

/* buf (n int32) = its element-wise maximum over the stages (routing rows recorded stage by stage). */
int glm5_stage_max_i32(dsarl_model *m, int32_t *buf, int64_t n, dsarl_error *err);

/* *value = its sum over the stages (the indexer loss of each stage's layers). */
int glm5_stage_sum(dsarl_model *m, double *value, dsarl_error *err);

/* Tied embeddings under pipeline parallelism: the embedding's gradient summed over the first and the last stage
 * (both hold the tensor), before the data-parallel reduction. Nothing otherwise. Collective over pp. */
int glm5_stage_reduce_tied(dsarl_model *m, dsarl_error *err);

/* The whole model's specs as this rank's tp/ep shard (*all = m->params under one stage), and *local (malloc'ed,
 * n_all): each one's index in m->params, or -1 where another stage holds it. The caller frees *all when it is not
 * m->params, and *local. */
int glm5_stage_all_specs(dsarl_model *m, glm5_param **all, int64_t *n_all, int64_t **local, dsarl_error *err);

/* Brings this rank's shard of parameter p (a spec of the whole model) to the first stage for a save: *out = mine
 * where no move is needed (or this rank takes no part), else on the first stage's ranks that take part the copy
 * received into staged (p->numel) from the pp peer that holds it, sent by that peer. Collective over pp. */
int glm5_stage_fetch(dsarl_model *m, const glm5_param *p, const float *mine, float *staged, const float **out,
                     dsarl_error *err);

/* The stage ops of a pipeline schedule (dsarl_model_ops.stage_forward / stage_backward / stage_transfer, ABI 1.4);
 * glm5_stage_release frees every slot still open. */
int glm5_stage_forward(dsarl_model *m, int32_t slot, const dsarl_token_batch *batch, const int32_t *targets,
                       float *logprobs, dsarl_error *err);
int glm5_stage_backward(dsarl_model *m, int32_t slot, const float *dlogprobs, float *indexer_loss,
                        dsarl_error *err);
int glm5_stage_transfer(dsarl_model *m, const dsarl_stage_transfer *t, dsarl_error *err);
void glm5_stage_release(dsarl_model *m);

/* Whether checkpoint key names a tensor of the model that another pipeline stage holds. */
bool glm5_stage_key_elsewhere(const dsarl_model *m, const char *key);

/* Reads policy.megatron_cfg.mtp_num_layers (null or 0: off) and mtp_loss_scaling_factor (default 0.1) from recipe
 * (NULL: off) and turns MTP training on in cfg (glm5_config_enable_mtp), with the depths' own embedding and LM-head
 * copies when model_dir (NULL: a recipe's random model) has them; *scale = the factor. Refuses, in one sentence
 * naming the key, a layout with tp, pp or cp > 1 (data and expert parallelism run it). glm5_mtp.c. */
int glm5_mtp_configure(glm5_config *cfg, const dsarl_node *recipe, const dsarl_parallel *parallel,
                       const char *model_dir, float *scale, dsarl_error *err);

/* *has = whether the Hugging Face directory dir lists tensor key (its model.safetensors header or index). */
int glm5_hf_has_key(const char *dir, const char *key, bool *has, dsarl_error *err);

/* Frees the instance and its device memory. */
void glm5_model_free(dsarl_model *model);

/* transformers' _init_weights: normal(0, initializer_range) matrices, ones for norms, zero biases. */
int glm5_model_init_random(dsarl_model *model, uint64_t seed, double initializer_range, dsarl_error *err);

/* The spec named name, or NULL. */
const glm5_param *glm5_model_find_param(const dsarl_model *model, const char *name);

/* Next-token logits (T, V) float32 in host memory for a packed batch (host memory). */
int glm5_forward_logits(dsarl_model *model, const dsarl_token_batch *batch, float *logits, dsarl_error *err);

/* Loads weights from a Hugging Face directory (config.json already parsed into model->cfg). Collective over
 * the world under tensor/expert parallelism: each rank opens only the files that hold its slices and reads only
 * their bytes; every rank returns the first failing rank's error. */
int glm5_load_hf_weights(dsarl_model *model, const char *dir, dsarl_error *err);

/* Reads DIR/config.json into cfg. */
int glm5_read_hf_config(const char *dir, glm5_config *cfg, dsarl_error *err);

/* The gradient of the weight at device pointer w (same offset in the gradient buffer). */
static inline void *glm5_grad_of(const dsarl_model *m, const void *w)
{
    return (char *)m->grads + ((const char *)w - (const char *)m->weights);
}

/* Frees the head-layout maps glm5_heads.c keeps between passes. */
void glm5_head_maps_free(dsarl_model *model);

/* Allocates (first call) and zeroes the gradient buffer. */
int glm5_zero_grad(dsarl_model *model, dsarl_error *err);

/* Per-token log-probabilities of targets (T) into host memory. */
int glm5_forward_logprobs(dsarl_model *model, const dsarl_token_batch *batch, const int32_t *targets,
                          float *logprobs, dsarl_error *err);

/* Forward + backward of sum_t dlogprobs[t] logprobs[t] (+ the indexer loss); accumulates gradients. */
int glm5_backward(dsarl_model *model, const dsarl_token_batch *batch, const int32_t *targets,
                  const float *dlogprobs, float *indexer_loss, dsarl_error *err);

/* The training pass (dsarl_model_ops.train_forward / train_backward): one forward kept for one backward. */
typedef struct glm5_train glm5_train;
int glm5_train_forward(dsarl_model *model, const dsarl_token_batch *batch, const int32_t *targets, float *logprobs,
                       dsarl_error *err);
int glm5_train_backward(dsarl_model *model, const float *dlogprobs, float *indexer_loss, dsarl_error *err);
/* Frees the pending training pass, if any. */
void glm5_train_release(dsarl_model *model);

/* The largest safetensors file a save writes, as transformers' save_pretrained (max_shard_size "5GB"). */
#define GLM5_HF_MAX_FILE_BYTES ((int64_t)5000000000)

/* Writes config.json + model.safetensors (float32, per-expert keys, the whole tensors) into dir, each file
 * atomically; a model over GLM5_HF_MAX_FILE_BYTES is written as model-0000k-of-0000n.safetensors files plus
 * model.safetensors.index.json, written last. Collective over the world under tensor/expert parallelism: world
 * rank 0 gathers the shards of one file at a time and writes it; every rank returns the same status. */
int glm5_save_hf(dsarl_model *model, const char *dir, dsarl_error *err);

/* glm5_save_hf with files of at most max_file_bytes (<= 0: one file whatever the size). */
int glm5_save_hf_files(dsarl_model *model, const char *dir, int64_t max_file_bytes, dsarl_error *err);

/* Optimizer (glm5_optim.c): the model ops of the same names; glm5_optim_free releases the state. */
typedef struct glm5_optim glm5_optim;
void glm5_optim_free(dsarl_model *model);
int glm5_grad_norm(dsarl_model *model, double *norm, dsarl_error *err);
int glm5_optimizer_step(dsarl_model *model, const dsarl_optimizer_params *params, dsarl_error *err);
int64_t glm5_optimizer_steps(const dsarl_model *model);
int glm5_optimizer_save(dsarl_model *model, const char *path, dsarl_error *err);
int glm5_optimizer_load(dsarl_model *model, const char *path, dsarl_error *err);
/* Reloads every weight from a Hugging Face directory (same config); the fp32 master follows. */
int glm5_load_weights(dsarl_model *model, const char *dir, dsarl_error *err);

#endif /* DSARL_GLM5_MODEL_H */
