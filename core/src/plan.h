/* plan.h: the per-GPU memory and step-time plan of a recipe (`dsarl plan`), without running anything: the layout's
 * pipeline stages, what each GPU of a stage holds (weights, gradients, optimizer state, activations, communication
 * buffers, the generation cache) and a roofline step time. Pure arithmetic over the model's own plan
 * (dsarl_model_ops.plan) and the recipe's settings: no model shapes here (docs/plan.md gives every formula). */
#ifndef DSARL_PLAN_H
#define DSARL_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include "dsarl/error.h"
#include "dsarl/export.h"
#include "dsarl/ops/model.h"
#include "layout.h"

/* What the recipe says about a step (dsarl_plan_settings_from_recipe reads every field). */
typedef struct dsarl_plan_settings {
    dsarl_layout layout;            /* the training layout (world = the training GPUs) */
    int32_t first_stage_layers;     /* ...num_layers_in_first_pipeline_stage, 0: even split (layout.vpp: model
                                     * chunks per stage, virtual_pipeline_model_parallel_size) */
    int32_t last_stage_layers;      /* ...num_layers_in_last_pipeline_stage, 0: even split */
    int64_t micro_batch;            /* policy.train_micro_batch_size (sequences) */
    int64_t seq_len;                /* policy.max_total_sequence_length (tokens; the packed upper bound) */
    int64_t global_batch;           /* policy.train_global_batch_size (sequences per optimizer step) */
    int64_t logprob_chunk;          /* policy.logprob_chunk_size (tokens of logits at once), 0: the whole sequence */
    bool recompute;                 /* policy.megatron_cfg.activation_checkpointing */
    int32_t grad_bytes;             /* 4 with ...grad_reduce_in_fp32, else 2 (bf16) */
    double optimizer_offload;       /* fraction of the optimizer state on the host (optimizer_cpu_offload) */
    int32_t logprob_passes;         /* forward-only passes per step: previous policy (+ reference) log-probs */
    /* generation */
    bool colocated;                 /* policy.generation.colocated.enabled */
    int32_t gen_gpus;               /* dedicated generation GPUs (colocated: 0) */
    int32_t gen_tp, gen_ep;         /* their layout (tensor, expert parallel; no pipeline) */
    int64_t rollouts;               /* sequences generated per step: num_prompts_per_step x num_generations */
    int64_t prompt_tokens;          /* data.max_input_seq_length */
    int64_t new_tokens;             /* policy.generation.max_new_tokens */
    double gen_memory_utilization;  /* policy.generation.gpu_memory_utilization, 0: unset */
    /* the machine */
    double gpu_bytes;               /* memory of one GPU */
    double reserve_bytes;           /* CUDA context, library workspaces, allocator slack */
    double peak_flops;              /* dense bf16 FLOP/s of one GPU */
    double hbm_bytes_per_s;         /* memory bandwidth of one GPU */
} dsarl_plan_settings;

/* One GPU's memory, in bytes. */
typedef struct dsarl_plan_gpu {
    int64_t params[DSARL_PLAN_SHARD_COUNT]; /* trainable elements held */
    int64_t buffers;
    double weights, grads, optimizer, optimizer_host, activations, comm, cache, reserve;
    double train_total;   /* weights + grads + optimizer + activations + comm + reserve */
    double gen_total;     /* weights + grads + optimizer + cache + reserve (colocated generation) */
    double total;         /* the larger: the GPU's peak */
} dsarl_plan_gpu;

typedef struct dsarl_plan_stage {
    int32_t first_layer, n_layers; /* the first layer of the stage's first chunk; layers over all its chunks */
    int32_t in_flight;     /* micro-batches whose activations the stage holds at once under 1F1B (interleaved:
                            * model-chunk passes, each 1 / vpp of the stage's layers) */
    int32_t topk_in;       /* int32 top-k indices per token its chunks starting on a shared layer receive */
    dsarl_plan_gpu gpu;
} dsarl_plan_stage;

typedef struct dsarl_plan {
    int32_t n_stages;
    dsarl_plan_stage *stages;    /* n_stages, owned (dsarl_plan_free) */
    int32_t vpp;                 /* model chunks per stage (1: no virtual stages) */
    int32_t *starts;             /* (vpp n_stages + 1) first layer of virtual stage chunk * n_stages + stage, owned */
    int32_t worst;               /* the stage whose GPUs need the most */
    double train_tokens_per_rank; /* tokens of one micro-batch on one rank (after CP and sequence parallel) */
    int64_t microbatches;        /* per data-parallel replica per step */
    bool dedicated;              /* generation on its own GPUs: gen below */
    dsarl_plan_gpu gen;          /* one dedicated generation GPU */
    double gen_seqs_per_replica; /* sequences one generation replica caches at once */
} dsarl_plan;

/* Reads the settings from a resolved recipe; layout is the training layout already built from it. The machine
 * fields are left for the caller (defaults: H100 80 GB). */
DSARL_API int dsarl_plan_settings_from_recipe(const dsarl_node *root, const dsarl_layout *layout,
                                              dsarl_plan_settings *s, dsarl_error *err);

/* The first layer of each of pp stages (starts[pp] = n_layers): first/last stage sizes as given (0: even), the
 * rest split evenly; one sentence naming the keys when they do not divide. */
DSARL_API int dsarl_plan_stage_layers(int32_t n_layers, int32_t pp, int32_t first, int32_t last, int32_t *starts,
                                      dsarl_error *err);

/* The first layer of every virtual stage k = chunk * pp + rank of vpp model chunks per rank (starts[vpp * pp] =
 * n_layers): the dsarl_plan_stage_layers split, each rank's layers cut into vpp equal chunks (Megatron's
 * interleaved order); refuses a stage whose layer count vpp does not divide, naming the keys. */
DSARL_API int dsarl_plan_chunk_layers(int32_t n_layers, int32_t pp, int32_t vpp, int32_t first, int32_t last,
                                      int32_t *starts, dsarl_error *err);

/* Refuses a stage starting on a layer the model says cannot start one, naming the stage, the layer and the rule. */
DSARL_API int dsarl_plan_check_stage_starts(const dsarl_model_plan *mp, const int32_t *starts, int32_t pp,
                                            dsarl_error *err);

/* Every stage's GPU memory (train = the model's plan under the training layout; gen = under the dedicated
 * generation layout, NULL when colocated). */
DSARL_API int dsarl_plan_compute(const dsarl_plan_settings *s, const dsarl_model_plan *train,
                                 const dsarl_model_plan *gen, dsarl_plan *out, dsarl_error *err);

/* Refuses a plan whose worst GPU (or generation budget) exceeds the GPU, in one sentence with the number. */
DSARL_API int dsarl_plan_check_fit(const dsarl_plan_settings *s, const dsarl_plan *p, dsarl_error *err);

/* buf = the layer ranges of stage st, one per model chunk ("31-38, 70-77"; one range without virtual stages). */
DSARL_API void dsarl_plan_stage_ranges(const dsarl_plan *p, int32_t st, char *buf, size_t n);

DSARL_API void dsarl_plan_free(dsarl_plan *p);

/* Trainable elements of a GPU summed over shard kinds. */
DSARL_API int64_t dsarl_plan_params(const int64_t params[DSARL_PLAN_SHARD_COUNT]);

#endif /* DSARL_PLAN_H */
