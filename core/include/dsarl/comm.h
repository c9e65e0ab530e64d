/* dsarl/comm.h: process groups and the host-memory collectives over MPI. SDK tier: plugin ABI (docs/sdk.md).
 *
 * A run launched by mpirun or srun has one process per GPU (or per CPU slot); the core builds Megatron's process
 * groups from the recipe's parallel sizes (docs/parallel.md) and hands them to every plugin through
 * dsarl_parallel. A group is opaque and owned by the core; it lives until the run ends.
 *
 * Device plugins implement the collectives of dsarl_device_ops on device memory (NCCL on CUDA); the functions
 * here move host memory over MPI: the CPU device's collectives are these, algorithms reduce their host-side
 * metrics with them, and a GPU device bootstraps its NCCL communicator with dsarl_group_broadcast_host. Ranks
 * are group-local (0..size-1). Every call is collective: every member of the group makes it, in the same order.
 * In a single process there are no groups (NULL); every function treats a NULL group as a group of one. */
#ifndef DSARL_COMM_H
#define DSARL_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "dsarl/error.h"
#include "dsarl/export.h"
#include "dsarl/tensor.h"

DSARL_BEGIN_DECLS

typedef struct dsarl_group dsarl_group;

/* Reductions. AVG is SUM divided by the group size (floating-point dtypes only). */
typedef enum dsarl_reduce_op {
    DSARL_REDUCE_SUM = 0,
    DSARL_REDUCE_MAX = 1,
    DSARL_REDUCE_MIN = 2,
    DSARL_REDUCE_AVG = 3,
} dsarl_reduce_op;

/* This process's rank in g (0 for NULL). */
DSARL_API int32_t dsarl_group_rank(const dsarl_group *g);
/* Members of g (1 for NULL). */
DSARL_API int32_t dsarl_group_size(const dsarl_group *g);
/* The group's name: "world", "tp", "pp", "cp", "dp", "dp_cp", "ep", "edp", "tp_dp_cp" ("single" for NULL). */
DSARL_API const char *dsarl_group_name(const dsarl_group *g);
/* The world rank of member `rank` of g. */
DSARL_API int32_t dsarl_group_world_rank(const dsarl_group *g, int32_t rank);

/* In place: buf (n values of dtype) = the reduction over the group. Reductions take F32, F64, I32 and I64. */
DSARL_API int dsarl_group_all_reduce_host(const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype,
                                          dsarl_reduce_op op, dsarl_error *err);
/* out (size * n, rank-major) = every member's in (n); out must not overlap in. */
DSARL_API int dsarl_group_all_gather_host(const dsarl_group *g, void *out, const void *in, int64_t n,
                                          dsarl_dtype dtype, dsarl_error *err);
/* out (n) = the reduction of block `rank` of every member's in (size * n). */
DSARL_API int dsarl_group_reduce_scatter_host(const dsarl_group *g, void *out, const void *in, int64_t n,
                                              dsarl_dtype dtype, dsarl_reduce_op op, dsarl_error *err);
/* Personalised exchange: in holds send_counts[p] values for each peer p in rank order, packed; out receives
 * recv_counts[p] values from each peer p, packed in rank order. Counts are host arrays of size entries, in values. */
DSARL_API int dsarl_group_all_to_all_host(const dsarl_group *g, void *out, const int64_t *recv_counts,
                                          const void *in, const int64_t *send_counts, dsarl_dtype dtype,
                                          dsarl_error *err);
/* buf (n) = root's buf on every member. */
DSARL_API int dsarl_group_broadcast_host(const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype, int32_t root,
                                         dsarl_error *err);
/* Point to point: blocks until the peer has the data (send) or it arrived (recv). */
DSARL_API int dsarl_group_send_host(const dsarl_group *g, const void *buf, int64_t n, dsarl_dtype dtype,
                                    int32_t peer, dsarl_error *err);
DSARL_API int dsarl_group_recv_host(const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype, int32_t peer,
                                    dsarl_error *err);
/* Waits until every member reached it. */
DSARL_API int dsarl_group_barrier(const dsarl_group *g, dsarl_error *err);

/* The collective watchdog: a device plugin whose collectives run asynchronously (NCCL) brackets each wait for
 * their completion with these, so a peer that died or diverged ends the job (naming this rank and what it waited
 * for) after runtime.collective_timeout_s instead of hanging. The host collectives above do it themselves. */
DSARL_API void dsarl_group_watch_begin(const dsarl_group *g, const char *what);
DSARL_API void dsarl_group_watch_end(const dsarl_group *g);

/* Seconds this process has spent inside g's watched collectives (host calls, and device waits a plugin bracketed),
 * and how many: the communication share of a step is the difference over the step divided by its time. */
DSARL_API void dsarl_group_time(const dsarl_group *g, double *seconds, int64_t *calls);

DSARL_END_DECLS

#endif /* DSARL_COMM_H */
