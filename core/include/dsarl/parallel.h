/* dsarl/parallel.h: the process's place in the parallel layout (Megatron semantics).
 * SDK tier: plugin ABI (docs/sdk.md).
 *
 * Every size is 1 and every rank 0 in a single-process run. Models shard parameters by these ranks (column/row
 * for TP, by expert for EP, by layer for PP, by token for CP); the product tp*pp*cp*dp is the world size and ep
 * divides dp*cp*tp as in Megatron's expert-data-parallel layout (expert tensor parallelism is 1, so the expert grid
 * is ep x edp x pp with edp = world / (ep * pp)). Ranks follow Megatron's order tp-cp-ep-dp-pp: tp varies fastest
 * (docs/parallel.md). The core fills every field; plugins only read it. */
#ifndef DSARL_PARALLEL_H
#define DSARL_PARALLEL_H

#include <stddef.h>
#include <stdint.h>
#include "dsarl/comm.h"

typedef struct dsarl_parallel {
    uint32_t struct_size;
    int32_t world_rank, world_size;  /* all processes */
    int32_t local_rank, local_size;  /* processes on this host; selects the GPU */
    int32_t tp_rank, tp_size;        /* tensor parallel */
    int32_t pp_rank, pp_size;        /* pipeline parallel */
    int32_t cp_rank, cp_size;        /* context parallel */
    int32_t ep_rank, ep_size;        /* expert parallel */
    int32_t dp_rank, dp_size;        /* data parallel */
    int32_t sequence_parallel;       /* 1 when TP also splits the sequence in norms/dropout regions */
    void *comm;                      /* the world group (a dsarl_group *), NULL in a single process */
    /* ABI 1.3: the process groups (dsarl/comm.h), each NULL in a single process. Data is split over dp (context
     * peers share samples); dense gradients and optimizer shards use dp_cp; expert weights are replicated only
     * over edp; tp_dp_cp is every rank of one pipeline stage (router expert-load counts). */
    const dsarl_group *world, *tp, *pp, *cp, *dp, *dp_cp, *ep, *edp, *tp_dp_cp;
    int32_t edp_rank, edp_size;      /* ABI 1.3: expert data parallel (the replicas of one expert shard) */
    int32_t distributed_optimizer;   /* ABI 1.3: 1 when AdamW state is sharded over dp_cp (use_distributed_optimizer) */
    int32_t overlap_grad_reduce;     /* ABI 1.3: 1 when gradient buckets are reduced as the backward produces them */
    int64_t grad_bucket_elements;    /* ABI 1.3: elements per gradient bucket (0: one bucket) */
    int32_t vpp_size;                /* ABI 1.5: model chunks (virtual pipeline stages) per pp rank, 1 without */
    int32_t reserved0;
    /* ABI 1.6: dedicated generation ranks (policy.generation.colocated.enabled false under one MPI job). The job's
     * processes are the training ranks (world_rank 0 .. world_size - 1 of the groups above) followed by
     * generation_ranks generation ranks. A generation rank sees a one-process layout (world_size 1, its groups of
     * one) with generation_index >= 0; a training rank has generation_index -1. generation is the group of every
     * process of the job (training ranks first, in order): weights, requests and rollouts travel over it. */
    int32_t generation_ranks;        /* 0: generation runs inside the training ranks */
    int32_t generation_index;        /* this process among the generation ranks, -1 on a training rank */
    const dsarl_group *generation;   /* NULL without generation ranks */
} dsarl_parallel;

/* Whether the layout struct p (from any 1.x core) carries the ABI 1.3 groups. */
#define DSARL_PARALLEL_HAS_GROUPS(p) ((p)->struct_size >= offsetof(dsarl_parallel, grad_bucket_elements) + 8)

/* The model chunks per pp rank of layout p (1 from a core older than ABI 1.5, or without virtual stages). */
static inline int32_t dsarl_parallel_vpp(const dsarl_parallel *p)
{
    return p && p->struct_size >= offsetof(dsarl_parallel, vpp_size) + sizeof(int32_t) && p->vpp_size > 1
               ? p->vpp_size : 1;
}

/* The dedicated generation ranks of layout p (0 from a core that predates them). */
static inline int32_t dsarl_parallel_generation_ranks(const dsarl_parallel *p)
{
    return p && p->struct_size >= offsetof(dsarl_parallel, generation) + sizeof(p->generation) ? p->generation_ranks
                                                                                              : 0;
}

/* Whether this process is a dedicated generation rank of layout p. */
static inline int dsarl_parallel_is_generation_rank(const dsarl_parallel *p)
{
    return dsarl_parallel_generation_ranks(p) > 0 && p->generation_index >= 0;
}

/* A single-process layout. */
#define DSARL_PARALLEL_SINGLE                                                                               \
    { .struct_size = sizeof(dsarl_parallel), .world_rank = 0, .world_size = 1, .local_rank = 0,            \
      .local_size = 1, .tp_rank = 0, .tp_size = 1, .pp_rank = 0, .pp_size = 1, .cp_rank = 0, .cp_size = 1,  \
      .ep_rank = 0, .ep_size = 1, .dp_rank = 0, .dp_size = 1, .sequence_parallel = 0, .comm = 0,        \
      .edp_rank = 0, .edp_size = 1, .vpp_size = 1, .generation_ranks = 0, .generation_index = -1,           \
      .generation = 0 }

#endif /* DSARL_PARALLEL_H */
