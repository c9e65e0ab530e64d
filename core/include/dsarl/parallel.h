/* dsarl/parallel.h: the process's place in the parallel layout (Megatron semantics).
 * SDK tier: plugin ABI (docs/sdk.md).
 *
 * Every size is 1 and every rank 0 in a single-process run. Models shard parameters by these ranks (column/row
 * for TP, by expert for EP, by layer for PP, by token for CP); the product tp*pp*cp*dp is the world size and ep
 * divides dp*cp*tp as in Megatron's expert-data-parallel layout. */
#ifndef DSARL_PARALLEL_H
#define DSARL_PARALLEL_H

#include <stdint.h>

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
    void *comm;                      /* host-owned communicator handle (MPI/NCCL), NULL in a single process */
} dsarl_parallel;

/* A single-process layout. */
#define DSARL_PARALLEL_SINGLE                                                                               \
    { .struct_size = sizeof(dsarl_parallel), .world_rank = 0, .world_size = 1, .local_rank = 0,            \
      .local_size = 1, .tp_rank = 0, .tp_size = 1, .pp_rank = 0, .pp_size = 1, .cp_rank = 0, .cp_size = 1,  \
      .ep_rank = 0, .ep_size = 1, .dp_rank = 0, .dp_size = 1, .sequence_parallel = 0, .comm = 0 }

#endif /* DSARL_PARALLEL_H */
