/* comm_internal.h: the host's side of process groups: MPI start-up, group construction, abort, the watchdog.
 * Not SDK: plugins see only dsarl/comm.h. */
#ifndef DSARL_COMM_INTERNAL_H
#define DSARL_COMM_INTERNAL_H

#include <stdbool.h>
#include "dsarl/comm.h"
#include "dsarl/parallel.h"
#include "layout.h"

typedef struct dsarl_comm dsarl_comm;

/* True when a launcher started this process as one rank of a job (Open MPI's mpirun, PMIx, Slurm's srun): the
 * only case where dsarl initialises MPI. A plain `dsarl run` is one process and never touches MPI. */
DSARL_API bool dsarl_comm_launched(void);

/* Initialises MPI (thread support for the watchdog) and reads the world and the local (same host) ranks. Fails
 * when this dsarl was built without MPI. */
DSARL_API int dsarl_comm_init(dsarl_comm **out, dsarl_error *err);

DSARL_API int32_t dsarl_comm_world_rank(const dsarl_comm *c);
DSARL_API int32_t dsarl_comm_world_size(const dsarl_comm *c);

/* Builds every group of layout l (collective over the world) and fills *out: coordinates, local rank, groups.
 * Starts the watchdog with l->collective_timeout_s. A NULL comm (one process) fills the single layout. */
DSARL_API int dsarl_comm_build(dsarl_comm *c, const dsarl_layout *l, dsarl_parallel *out, dsarl_error *err);

/* Ends the whole job with status (MPI_Abort): called by a rank that failed, after it printed why. */
DSARL_API void dsarl_comm_abort(dsarl_comm *c, int status);

/* Frees the groups and finalises MPI (NULL: nothing). */
DSARL_API void dsarl_comm_finalize(dsarl_comm *c);

#endif /* DSARL_COMM_INTERNAL_H */
