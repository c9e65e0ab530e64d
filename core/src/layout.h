/* layout.h: the parallel layout a recipe asks for (Megatron's sizes and rank order), checked against the world
 * size before anything heavy starts. Pure arithmetic: no MPI here (comm.c builds the groups from it). */
#ifndef DSARL_LAYOUT_H
#define DSARL_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>
#include "dsarl/error.h"
#include "dsarl/export.h"
#include "dsarl/plugin.h"
#include "dsarl/parallel.h"
#include "dsarl/recipe.h"

typedef struct dsarl_layout {
    int32_t world;                 /* training processes (the grids below span them) */
    int32_t generation;            /* dedicated generation processes after them (0: generation in the trainers) */
    int32_t tp, pp, cp, ep, dp;    /* dense grid tp x cp x dp x pp (dp derived) */
    int32_t edp;                   /* expert grid ep x edp x pp (edp derived; expert tensor parallelism 1) */
    int32_t vpp;                   /* model chunks per pp rank (virtual_pipeline_model_parallel_size; 1: none) */
    int32_t num_nodes, gpus_per_node;
    bool sequence_parallel;
    bool distributed_optimizer;
    bool overlap_grad_reduce;
    int64_t bucket_elements;       /* gradient bucket size in elements (0: one bucket per buffer) */
    double collective_timeout_s;   /* the watchdog's limit on one collective */
} dsarl_layout;

/* The recipe keys the layout reads (declared by the host schema). */
DSARL_API extern const dsarl_key_spec dsarl_layout_keys[];
DSARL_API extern const size_t dsarl_layout_n_keys;

/* Reads policy.megatron_cfg.{tensor,pipeline,context,expert,expert_tensor}_model_parallel_size, sequence_parallel,
 * the distributed-optimizer keys, cluster.{num_nodes,gpus_per_node} and runtime.collective_timeout_s, and checks
 * them against world processes: one sentence naming the key and the numbers when they do not fit. world is the
 * training processes (`dsarl plan` takes the generation nodes away before). */
DSARL_API int dsarl_layout_from_recipe(const dsarl_node *root, int32_t world, dsarl_layout *out, dsarl_error *err);

/* The layout of a launched job of `processes`: as dsarl_layout_from_recipe, but a job of more than one process
 * with policy.generation.colocated.enabled false gives its last process to generation (exactly one, as
 * policy.generation.colocated.resources must say; other layouts refused in one sentence): out->world then counts
 * the training processes, out->generation the generation ones. cluster.* counts all processes. */
DSARL_API int dsarl_layout_for_job(const dsarl_node *root, int32_t processes, dsarl_layout *out, dsarl_error *err);

/* A layout of the given sizes with everything else at its default (tests, tools); checked as from_recipe. */
DSARL_API int dsarl_layout_make(int32_t world, int32_t tp, int32_t pp, int32_t cp, int32_t ep, dsarl_layout *out,
                      dsarl_error *err);

/* The coordinates of world rank `rank` (ranks and sizes of every axis; groups left NULL). */
DSARL_API void dsarl_layout_coords(const dsarl_layout *l, int32_t rank, dsarl_parallel *p);

/* The world rank at dense coordinates (tp, cp, dp, pp) and at expert coordinates (ep, edp, pp). */
DSARL_API int32_t dsarl_layout_dense_rank(const dsarl_layout *l, int32_t tp, int32_t cp, int32_t dp, int32_t pp);
DSARL_API int32_t dsarl_layout_expert_rank(const dsarl_layout *l, int32_t ep, int32_t edp, int32_t pp);

/* The process groups, each a set of ranks varying some axes with the others fixed (Megatron's group tokens). */
typedef enum dsarl_axis {
    DSARL_AXIS_WORLD = 0,
    DSARL_AXIS_TP,       /* dense grid: tp */
    DSARL_AXIS_PP,       /* pp (the same sets in both grids) */
    DSARL_AXIS_CP,       /* cp */
    DSARL_AXIS_DP,       /* dp without cp: the batch split */
    DSARL_AXIS_DP_CP,    /* dp-cp: dense gradient reduction and optimizer shards */
    DSARL_AXIS_EP,       /* expert grid: ep */
    DSARL_AXIS_EDP,      /* expert grid: edp (replicas of one expert shard) */
    DSARL_AXIS_TP_DP_CP, /* every rank of one pipeline stage */
    DSARL_AXIS_COUNT
} dsarl_axis;

/* The group's name ("tp", "dp_cp", ...). */
DSARL_API const char *dsarl_axis_name(dsarl_axis axis);

/* The members of rank's group along axis, in increasing world rank (= group rank); returns how many (at most
 * l->world entries written). */
DSARL_API int32_t dsarl_layout_group_members(const dsarl_layout *l, int32_t rank, dsarl_axis axis, int32_t *members);

/* One line describing the layout ("TP2 x CP1 x DP2 x PP1, EP2 x EDP2, sequence parallel"). */
DSARL_API void dsarl_layout_describe(const dsarl_layout *l, char *buf, size_t size);

#endif /* DSARL_LAYOUT_H */
