/* dsarl/ops/model.h: a model family (kind DSARL_KIND_MODEL), selected by policy.model_family, or by the
 * model_type in the config.json of policy.model_name.
 *
 * A model instance owns its parameters on one device and runs forward/backward on packed token batches through
 * the device and DSA ops tables it was created with, so the same model code runs on every device. */
#ifndef DSARL_OPS_MODEL_H
#define DSARL_OPS_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "dsarl/ops/device.h"
#include "dsarl/ops/dsa.h"

DSARL_BEGIN_DECLS

typedef struct dsarl_model dsarl_model;
typedef struct dsarl_model_cache dsarl_model_cache; /* a KV cache of one model instance (cached inference) */

/* Everything a model is built from. */
typedef struct dsarl_model_config {
    uint32_t struct_size;
    const dsarl_host *host;
    const dsarl_node *recipe;          /* resolved recipe root */
    const char *model_dir;             /* Hugging Face directory (config.json + safetensors), or NULL to build
                                          from the inline config in the recipe with random init */
    const dsarl_device_ops *device_ops;
    dsarl_device *device;
    const dsarl_dsa_ops *dsa_ops;
    dsarl_dsa_context *dsa;
    const dsarl_parallel *parallel;
    uint64_t seed;                     /* random init */
} dsarl_model_config;

/* A packed batch of token sequences (THD). Host memory. */
typedef struct dsarl_token_batch {
    uint32_t struct_size;
    int64_t n_tokens;            /* T: sum of sequence lengths */
    int32_t n_sequences;         /* B */
    const int32_t *tokens;       /* (T) */
    const int32_t *cu_seqlens;   /* (B + 1) prefix sums of sequence lengths, cu_seqlens[0] = 0 */
    /* ABI 1.1 (took padding; read through dsarl_token_batch_logit_scale): factor on the LM-head logits of
     * forward_logits, forward_logprobs and backward: 1 / the sampling temperature, as NeMo RL's policy divides logits
     * by the generation temperature so that training log-probs match the sampler's. 0 (or a struct_size that does not
     * cover it) means 1. Cached decode ignores it: the generation engine applies its own temperature. */
    float logit_scale;
    /* ABI 1.5 (read through dsarl_token_batch_routing): routing replay, per token rows laid out as
     * dsarl_routing_shape says. A replay row (one layer of one token) whose first entry is < 0 is not recorded: that
     * token routes by its own scores in that layer. NULL: route as usual. Training passes (forward_logprobs,
     * backward, train_forward, stage_forward) replay; cached passes (forward_cached, forward_paged) record. */
    const int32_t *replay_experts; /* (T, moe_layers, experts_per_token) routed expert ids to use instead of top-k */
    const int32_t *replay_indices; /* (T, index_layers, index_topk) selected key positions within the token's own
                                      sequence (0 = its first token), -1 past the selected ones */
    int32_t *record_experts;       /* out (T, moe_layers, experts_per_token): the experts each new token routed to */
    int32_t *record_indices;       /* out (T, index_layers, index_topk): its selected key positions in the order the
                                      attention read them (so a replay sums them in that order), -1 after */
} dsarl_token_batch;

/* The logit factor of a batch from any 1.x caller (see dsarl_token_batch.logit_scale). */
static inline float dsarl_token_batch_logit_scale(const dsarl_token_batch *b)
{
    bool covered = b->struct_size >= offsetof(dsarl_token_batch, logit_scale) + sizeof(b->logit_scale);
    return covered && b->logit_scale > 0.0f ? b->logit_scale : 1.0f;
}

/* ABI 1.5: the routing replay fields of a batch from any 1.x caller (all NULL when it predates them). */
typedef struct dsarl_batch_routing {
    const int32_t *replay_experts, *replay_indices;
    int32_t *record_experts, *record_indices;
} dsarl_batch_routing;

/* The routing replay fields of b (see dsarl_token_batch.replay_experts). */
static inline dsarl_batch_routing dsarl_token_batch_routing(const dsarl_token_batch *b)
{
    dsarl_batch_routing r = {NULL, NULL, NULL, NULL};
    if (b->struct_size >= offsetof(dsarl_token_batch, record_indices) + sizeof(b->record_indices))
        r = (dsarl_batch_routing){b->replay_experts, b->replay_indices, b->record_experts, b->record_indices};
    return r;
}

/* ABI 1.5: what a model records and replays per token (dsarl_model_ops.routing_shape): each MoE layer's routed
 * experts and each full-indexer layer's selected keys, layers in model order. */
typedef struct dsarl_routing_shape {
    uint32_t struct_size;
    int32_t moe_layers;        /* layers with routed experts */
    int32_t experts_per_token; /* experts each token routes to in each of them */
    int32_t index_layers;      /* layers whose sparse-attention indexer selects keys (shared layers reuse one) */
    int32_t index_topk;        /* keys selected per token in each of them */
} dsarl_routing_shape;

/* One optimizer step's hyper-parameters (AdamW, torch.optim.AdamW / Megatron Adam with decoupled weight decay).
 * The caller applies the LR schedule and gradient clipping: lr is this step's rate, grad_scale the clip factor
 * (min(1, max_norm / (norm + 1e-6))) times any loss scaling. The optimizer draws no random numbers: its whole
 * state is m, v, the step count (and the fp32 master where storage is not float32), all in optimizer_save. */
typedef struct dsarl_optimizer_params {
    uint32_t struct_size;
    double lr;           /* learning rate of this step */
    double beta1, beta2; /* moment decays (policy.megatron_cfg.optimizer.adam_beta1/2) */
    double eps;          /* added outside the sqrt (adam_eps) */
    double weight_decay; /* decoupled: p -= lr * weight_decay * p, trainable parameters only */
    double grad_scale;   /* every gradient is multiplied by this before the update */
} dsarl_optimizer_params;

/* ABI 1.4: the point-to-point transfers of one step of a pipeline schedule (dsarl_model_ops.stage_transfer), each
 * naming a slot of a microbatch in flight or -1. A schedule pairs them as Megatron's does: a forward send with a
 * backward receive (both with the next stage), a backward send with a forward receive (both with the previous). */
typedef struct dsarl_stage_transfer {
    uint32_t struct_size;
    int32_t send_forward;                /* slot whose stage output goes to the next stage */
    int32_t recv_backward;               /* slot whose output gradient comes from the next stage */
    int32_t send_backward;               /* slot whose input gradient goes to the previous stage (then released) */
    int32_t recv_forward;                /* slot opened here for recv_batch, its input from the previous stage */
    const dsarl_token_batch *recv_batch; /* recv_forward's microbatch (the batch its stage_forward gets) */
} dsarl_stage_transfer;

/* ABI 1.2: what the core knows of a checkpoint before choosing a model family (dsarl_model_ops.accepts). */
typedef struct dsarl_model_probe {
    uint32_t struct_size;
    const char *model_name;   /* policy.model_name as written (a local directory or a hub id), or NULL */
    const char *config_path;  /* model_name/config.json when that file exists, else NULL */
    const dsarl_node *recipe; /* resolved recipe root (an inline policy.model_config) */
} dsarl_model_probe;

/* ABI 1.2: model FLOPs of one pass (dsarl_model_ops.flops). A training step is forward + backward. */
typedef struct dsarl_model_flops {
    uint32_t struct_size;
    double forward;           /* one forward over the batch */
    double backward;          /* its backward (about twice the forward's matmuls, plus the indexer loss) */
    const char *formula;      /* static text: how the plugin counts, printed by benchmarks */
    int64_t matmul_params_per_token; /* weights a token passes through in the LM's matmuls (MoE: its experts' share) */
    int64_t indexer_params;   /* weights of the sparse-attention indexer projections (0 for a dense model) */
    int64_t embedding_params; /* the input embedding: looked up, not multiplied (generation does not read it all) */
    char summary[256];        /* one line on the model's shape for benchmark output ("12 layers, 16 heads ...") */
} dsarl_model_flops;

/* ABI 1.3: how a parameter is split across ranks (Megatron semantics), for planning (dsarl_model_plan). */
typedef enum dsarl_plan_shard {
    DSARL_PLAN_REPLICATED = 0, /* whole on every TP rank (norms, router, low-rank down-projections) */
    DSARL_PLAN_COLUMN = 1,     /* output features split over TP */
    DSARL_PLAN_ROW = 2,        /* input features split over TP */
    DSARL_PLAN_VOCAB = 3,      /* vocabulary rows split over TP (embedding, LM head) */
    DSARL_PLAN_EXPERT = 4,     /* routed experts split over EP: reduced and sharded over edp, not dp_cp */
    DSARL_PLAN_SHARD_COUNT = 5
} dsarl_plan_shard;

/* ABI 1.3: one decoder layer as one rank holds it (dsarl_model_plan.layers). Activation bytes are per token at the
 * layer's full width (every head and feature): under sequence parallelism a rank holds tokens / (TP x CP) tokens'
 * worth of them, which is also its share of the head-split parts, so the core multiplies by that token count. */
typedef struct dsarl_model_plan_layer {
    int64_t params[DSARL_PLAN_SHARD_COUNT]; /* trainable elements on one rank, by shard kind */
    int64_t buffers;             /* elements that are not trained (router bias), on one rank */
    double act_bytes;            /* per token: what the layer keeps from its forward for its backward */
    double act_bytes_recompute;  /* per token, with activation recompute: what stays between the passes */
    double cache_bytes;          /* per token on every rank holding the layer: the generation cache (not TP-split) */
    double dispatch_bytes;       /* per token: expert all-to-all send + receive buffers of the layer (0: no MoE) */
    double matmul_flops;         /* per token, forward: 2 x the weights a token passes through (MoE: its top-k) */
    int32_t stage_start_ok;      /* 1: a pipeline stage may start at this layer; 0: see stage_start_rule */
    int32_t stage_in_topk;       /* ABI 1.5 (took reserved space): int32 top-k indices per token a stage starting at
                                  * this layer receives with its input (it reuses an earlier layer's selection); 0 */
} dsarl_model_plan_layer;

/* ABI 1.3: what only the model knows of its size under one rank's layout (dsarl_model_ops.plan). The core sums
 * layers over pipeline stages and adds gradients, optimizer state, buffers and the generation cache itself. The
 * caller sets struct_size, layer_capacity and layers; the model sets n_layers always (a capacity below it gets
 * DSARL_E_INVALID after n_layers is set, so a caller may ask with capacity 0 first) and fills the rest. */
typedef struct dsarl_model_plan {
    uint32_t struct_size;
    int32_t n_layers;                   /* out: decoder layers */
    int32_t layer_capacity;             /* in: entries of layers */
    dsarl_model_plan_layer *layers;     /* in: caller-owned; out: layers[0 .. n_layers) */
    int64_t embedding[DSARL_PLAN_SHARD_COUNT]; /* on the first stage: the input embedding, one rank */
    int64_t head[DSARL_PLAN_SHARD_COUNT];      /* on the last stage: final norm and LM head, one rank */
    int64_t total_params;               /* trainable elements of the whole model, unsharded */
    int64_t total_buffers;              /* non-trained elements of the whole model */
    int64_t vocab_size;
    int32_t n_experts;                  /* routed experts of a MoE layer (0: none) */
    int32_t experts_per_token;
    int32_t n_heads;                    /* attention heads (TP splits them) */
    int32_t reserved0;
    double stage_io_bytes;              /* per token: the activation one pipeline stage sends the next */
    double logits_bytes;                /* per token at full vocabulary: LM-head logits and their gradient kept */
    const char *stage_start_rule;       /* static text: why a layer with stage_start_ok 0 cannot start a stage */
    char summary[256];                  /* one line on the model's shape */
} dsarl_model_plan;

/* ABI 1.5: where the sequences of one forward_paged call keep their tokens in a paged cache (host memory). Token j
 * of sequence i lives in row j % block_size of block tables[i * blocks_per_sequence + j / block_size]; a block may
 * appear in several tables (a shared prompt prefix) as long as no two sequences of a call write the same row. */
typedef struct dsarl_block_tables {
    uint32_t struct_size;
    int32_t blocks_per_sequence; /* row stride of tables (>= the blocks any sequence of the call reaches) */
    const int32_t *tables;       /* (B, blocks_per_sequence) block ids in [0, n_blocks) */
    const int32_t *context_lens; /* (B) tokens sequence i already holds: its new tokens are written after them */
} dsarl_block_tables;

typedef struct dsarl_model_ops {
    dsarl_ops_common common;

    /* Mandatory (create through load_weights below are all mandatory except parameter_count_config).
     * Builds a model (weights from config->model_dir, or random from the recipe's inline config). */
    int (*create)(const dsarl_model_config *config, dsarl_model **out, dsarl_error *err);
    void (*destroy)(dsarl_model *model);

    /* Trainable parameter count and non-trained buffer element count (e.g. e_score_correction_bias). */
    int (*parameter_count)(const dsarl_model *model, int64_t *trainable, int64_t *buffers, dsarl_error *err);

    /* Vocabulary size of the LM head. */
    int64_t (*vocab_size)(const dsarl_model *model);

    /* Next-token logits for every position: logits (T, V) float32 host memory. */
    int (*forward_logits)(dsarl_model *model, const dsarl_token_batch *batch, float *logits, dsarl_error *err);

    /* Writes the model in Hugging Face layout (config.json + model.safetensors) into dir, atomically. */
    int (*save)(dsarl_model *model, const char *dir, dsarl_error *err);

    /* --- training ------------------------------------------------------------------------------------------ */
    /* Per-token log-probabilities: logprobs (T) = log softmax(logits[t])[targets[t]] (targets (T) host, the
     * next token of each position; < 0 = ignored, gives 0). Host memory. */
    int (*forward_logprobs)(dsarl_model *model, const dsarl_token_batch *batch, const int32_t *targets,
                            float *logprobs, dsarl_error *err);
    /* Forward + backward of L = sum_t dlogprobs[t] * logprobs[t], plus the DSA indexer KL loss when its
     * coefficient (policy.megatron_cfg.model_overrides.dsa_indexer_loss_coeff) is > 0; ACCUMULATES into the
     * parameter gradients. The indexer loss reaches only the indexer weights (its inputs are detached) and the
     * LM loss never reaches them. indexer_loss (may be NULL) receives coeff * mean over tokens of the KL summed
     * over full layers. */
    int (*backward)(dsarl_model *model, const dsarl_token_batch *batch, const int32_t *targets,
                    const float *dlogprobs, float *indexer_loss, dsarl_error *err);
    /* Sets every parameter gradient to zero. */
    int (*zero_grad)(dsarl_model *model, dsarl_error *err);
    /* Number of parameter tensors (trainable parameters and buffers). */
    int64_t (*parameter_tensors)(const dsarl_model *model);
    /* Name (Hugging Face key, fused 3-D for experts), shape and trainability of tensor i. */
    int (*parameter_info)(const dsarl_model *model, int64_t i, const char **name, int32_t *ndim, int64_t *shape,
                          int *trainable, dsarl_error *err);
    /* Host float32 copies of tensor i's value and gradient (either pointer may be NULL). */
    int (*read_parameter)(dsarl_model *model, int64_t i, float *value, float *grad, dsarl_error *err);
    /* Overwrites tensor i's value from host float32. */
    int (*write_parameter)(dsarl_model *model, int64_t i, const float *value, dsarl_error *err);

    /* Optional: NULL means planning tools cannot size the model without building it.
     * Trainable parameter count and buffer elements of the model config describes (config.json of model_dir, or
     * the recipe's inline config), without building it: for planning full-size models. */
    int (*parameter_count_config)(const dsarl_model_config *config, int64_t *trainable, int64_t *buffers,
                                  dsarl_error *err);

    /* --- optimizer and checkpoints ---------------------------------------------------------------------------- */
    /* Global L2 norm over the gradients of the trainable parameters (buffers excluded), accumulated in double. */
    int (*grad_norm)(dsarl_model *model, double *norm, dsarl_error *err);
    /* One AdamW step over every trainable parameter from the accumulated gradients (fp32 m, v and master weights,
     * allocated and zeroed on the first call); buffers (e_score_correction_bias) are neither decayed nor updated.
     * Gradients are left as they are (call zero_grad before the next accumulation). */
    int (*optimizer_step)(dsarl_model *model, const dsarl_optimizer_params *params, dsarl_error *err);
    /* Optimizer steps taken so far (0 before the first optimizer_step or after loading a fresh state). */
    int64_t (*optimizer_steps)(const dsarl_model *model);
    /* Writes the optimizer state (safetensors: exp_avg.<name>, exp_avg_sq.<name> float32 per trainable tensor,
     * "step" int64, and master.<name> when storage is not float32) to path atomically. */
    int (*optimizer_save)(dsarl_model *model, const char *path, dsarl_error *err);
    /* Restores what optimizer_save wrote into a model built from the same config; a missing or mis-shaped tensor
     * fails naming the file and tensor, leaving the model's optimizer state unchanged. */
    int (*optimizer_load)(dsarl_model *model, const char *path, dsarl_error *err);
    /* Overwrites every parameter and buffer from a Hugging Face directory that save wrote for the same config. */
    int (*load_weights)(dsarl_model *model, const char *dir, dsarl_error *err);

    /* --- cached inference (generation engines), optional: NULL means no generation engine can serve the model (the
     * native engine refuses it at create, naming the slots)
     * ----------------------------------------------------------------- */
    /* Allocates a KV cache of n_slots sequence slots, each holding up to max_tokens tokens (prompt + completion),
     * sized once up front; every slot starts empty. It belongs to model and is freed before it. */
    int (*cache_create)(dsarl_model *model, int32_t n_slots, int32_t max_tokens, dsarl_model_cache **out,
                        dsarl_error *err);
    /* Frees a cache (NULL is fine). */
    void (*cache_free)(dsarl_model_cache *cache);
    /* Empties every slot so the cache can serve a new batch. */
    int (*cache_reset)(dsarl_model_cache *cache, dsarl_error *err);
    /* Appends sequence i of batch (its new tokens, >= 1) to cache slot slots[i] (distinct slots), after what that
     * slot holds, and returns the next-token logits (B, V) float32 host of each sequence's last new token. One
     * call covers prefill (whole prompts into empty slots) and decode (one token per active slot). Runs the same
     * device and DSA ops as forward_logits, attending over the cached keys, so logits equal forward_logits of the
     * whole sequence at that position to float rounding. After a failure the cache must be reset before reuse. */
    int (*forward_cached)(dsarl_model *model, dsarl_model_cache *cache, const dsarl_token_batch *batch,
                          const int32_t *slots, float *logits, dsarl_error *err);
    /* Tokens slot holds (0 for an empty or out-of-range slot). */
    int32_t (*cache_length)(const dsarl_model_cache *cache, int32_t slot);
    /* The device ops table and instance the model runs on (engines sample and score tokens there). */
    void (*device)(const dsarl_model *model, const dsarl_device_ops **ops, dsarl_device **dev);

    /* --- ABI 1.2, all optional (check with DSARL_MODEL_HAS): family probe, FLOP count, one forward per microbatch
     * ------------------------------- */
    /* Whether this table serves the checkpoint probe describes: > 0 is a match score (the core takes the highest,
     * a specific family above a generic one), 0 no, < 0 an error in err (an unreadable config.json). NULL: the
     * table is chosen only by name (policy.model_family). */
    int (*accepts)(const dsarl_model_probe *probe, dsarl_error *err);
    /* Model FLOPs of one forward and one backward over batch for the model config describes, without building
     * it (benchmarks and MFU); the formula is the plugin's and is printed by `dsarl bench train`. */
    int (*flops)(const dsarl_model_config *config, const dsarl_token_batch *batch, dsarl_model_flops *out,
                 dsarl_error *err);
    /* The training forward: per-token log-probs (T) host, as forward_logprobs, from one forward that KEEPS its
     * activations for train_backward. One pass is pending at a time: a new train_forward (or destroy) releases
     * the previous one. */
    int (*train_forward)(dsarl_model *model, const dsarl_token_batch *batch, const int32_t *targets,
                         float *logprobs, dsarl_error *err);
    /* Backward of the pending train_forward from dlogprobs (T) host: as backward (ACCUMULATES into the gradients,
     * adds the indexer KL loss, fills indexer_loss when not NULL) without a second forward; releases the pass.
     * Fails when no pass is pending. */
    int (*train_backward)(dsarl_model *model, const float *dlogprobs, float *indexer_loss, dsarl_error *err);

    /* --- ABI 1.3, optional (check with DSARL_MODEL_HAS; took a reserved slot, so the table kept its size) ------- */
    /* The data-parallel gradient reduction of one optimizer slice, after its microbatches accumulated gradients
     * and before grad_norm: a SUM over the replicas of each weight (the dp_cp group of the model's dsarl_parallel;
     * expert weights over edp) in buckets of parallel.grad_bucket_elements, on the device. With
     * parallel.distributed_optimizer the rank keeps only the sum of its shard of the flattened parameter buffer
     * (a reduce-scatter); grad_norm then reduces the shards' squares and optimizer_step updates the shard and
     * all-gathers the weights. The caller scales the loss by the GLOBAL token or sequence count, so the sum is the
     * one-process gradient. Collective over dp_cp. NULL: the model trains on one data-parallel rank only. */
    int (*reduce_gradients)(dsarl_model *model, dsarl_error *err);

    /* ABI 1.3, optional (took a reserved slot): planning, for `dsarl plan`. */
    /* The sizes of the model config describes as the rank layout describes holds them (its tp/ep sizes and
     * ranks; pp is the core's), without building it: per-layer parameters by shard kind, activation, cache and
     * dispatch bytes per token, the embedding and head. Refuses a layout the model cannot split (heads, vocab,
     * experts) in one sentence naming the key. */
    int (*plan)(const dsarl_model_config *config, const dsarl_parallel *layout, dsarl_model_plan *out,
                dsarl_error *err);

    /* --- ABI 1.4, optional (took reserved slots): the stage ops of a pipeline schedule (the 1F1B schedule of
     * dsarl_trainer_train_microbatches). A slot in [0, pp) holds one microbatch in flight on this stage, from its
     * forward (or the transfer that receives its input) to the transfer that sends its input gradient back (the
     * first stage: to its backward). None of them communicates over pp except stage_transfer.
     * ABI 1.5, virtual stages (dsarl_parallel.vpp_size v > 1, the interleaved schedule): a slot in [0, 2 pp) holds
     * one microbatch through all v of the rank's model chunks; its calls walk them in order, each forward (and the
     * receive before it) the next chunk up from 0, each backward (and the receives and sends around it) the next
     * chunk down from v - 1, and the slot is released after chunk 0's input gradient. The pp group is then a ring:
     * the last stage's chunk c sends to the first stage's chunk c + 1. */
    /* This stage's forward of microbatch slot, kept for stage_backward: from the embedding on the first stage,
     * else from the input stage_transfer received for it; the last stage fills logprobs (T) host, the others
     * leave it untouched. */
    int (*stage_forward)(dsarl_model *model, int32_t slot, const dsarl_token_batch *batch, const int32_t *targets,
                         float *logprobs, dsarl_error *err);
    /* This stage's backward of slot, ACCUMULATING into the gradients: the last stage from dlogprobs (T) host, the
     * others from the gradient stage_transfer received. *indexer_loss (may be NULL) = the indexer KL loss of
     * this stage's layers (the schedule sums the stages). */
    int (*stage_backward)(dsarl_model *model, int32_t slot, const float *dlogprobs, float *indexer_loss,
                          dsarl_error *err);
    /* The sends and receives t lists, with one neighbour stage at a time, in an order that cannot deadlock when
     * the neighbour makes the matching transfer (even stages send first, odd stages receive first). */
    int (*stage_transfer)(dsarl_model *model, const dsarl_stage_transfer *t, dsarl_error *err);

    /* --- ABI 1.5, optional as a set (check with DSARL_MODEL_HAS; cache_token_bytes took the last reserved slot,
     * the others grew the table): paged caches for continuous batching. A paged
     * cache is one arena of n_blocks blocks of block_size token rows (the MLA latent and the indexer keys of every
     * layer this rank holds); the engine owns the block tables and decides which sequence writes which block. The
     * contiguous cache_create/forward_cached above stay as they were.
     * ------------------------------------------------------------------------------------------------------ */
    /* Device bytes one cached token takes on this rank (every layer it holds: latent + rope key, indexer keys):
     * the engine divides its memory budget by block_size x this to size the arena. */
    int64_t (*cache_token_bytes)(const dsarl_model *model);
    /* Allocates a paged cache of n_blocks blocks of block_size tokens, once, up front. Freed with cache_free;
     * cache_reset, forward_cached and cache_length do not apply to it (they refuse it). */
    int (*paged_cache_create)(dsarl_model *model, int32_t n_blocks, int32_t block_size, dsarl_model_cache **out,
                              dsarl_error *err);
    /* As forward_cached, through block tables: sequence i's new tokens (>= 1) are appended after
     * tables->context_lens[i] tokens, into the rows its table names (the caller maps enough blocks), and attend
     * over tokens [0, context_lens[i] + new) of its own table. Logits (B, V) float32 are DEVICE memory, so an
     * engine sampling on the device copies back only the drawn ids. Same arithmetic as forward_cached: a batch
     * equals its contiguous run bit for bit on a device whose ops do not depend on row addresses. */
    int (*forward_paged)(dsarl_model *model, dsarl_model_cache *cache, const dsarl_token_batch *batch,
                         const dsarl_block_tables *tables, float *logits, dsarl_error *err);
    /* Copy-on-write of a shared block: block dst takes the first rows token rows of block src (every layer) and
     * the rest of dst is cleared, ready for its new owner's next tokens. */
    int (*cache_copy_block)(dsarl_model_cache *cache, int32_t src, int32_t dst, int32_t rows, dsarl_error *err);

    /* --- ABI 1.5, optional on its own ------------------------------------------------------------------------- */
    /* Multi-token prediction (policy.megatron_cfg.mtp_num_layers): returns the MTP depths the model trains (0:
     * none, nothing else happens). Between a train_forward and its train_backward it sets how that backward adds
     * the MTP loss to the caller's: depth k's prediction at position i counts when mask (T, may be NULL: every
     * position whose target is not ignored) counts position i + k, whose target is the token it predicts, and each
     * depth's summed cross entropy is divided by norm_tokens (> 0: the count the caller's loss divides by, e.g.
     * the global number of valid tokens; 0: the depth's counted positions of the pass). *loss = that MTP loss
     * (mtp_loss_scaling_factor / depths times the sum over depths); without a pending pass, the last pass's. */
    int32_t (*mtp_loss)(dsarl_model *model, const float *mask, double norm_tokens, float *loss);

    /* ABI 1.5, optional: routing replay (dsarl_token_batch.replay_experts). The per-token shape of
     * the model's recorded routing; NULL: the model neither records nor replays (refused where replay is asked). */
    int (*routing_shape)(const dsarl_model *model, dsarl_routing_shape *out, dsarl_error *err);

    void *reserved[3];
} dsarl_model_ops;

/* True when a model ops table registered under any 1.x ABI has the optional member `field` set. */
#define DSARL_MODEL_HAS(ops, field)                                                                                 \
    ((ops)->common.struct_size >= offsetof(dsarl_model_ops, field) + sizeof((ops)->field) && (ops)->field != NULL)

DSARL_END_DECLS

#endif /* DSARL_OPS_MODEL_H */
