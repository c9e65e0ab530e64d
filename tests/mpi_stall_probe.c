/* mpi_stall_probe.c: a two-rank job where rank 1 stalls (sleeps) instead of joining a barrier, as a peer that hung
 * or took another code path would. Rank 0's collective watchdog must end the whole job after the timeout given as
 * argv[1] seconds, naming rank 0 and the collective it waited for (test_mpi_failures.sh checks the message). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "comm_internal.h"

int main(int argc, char **argv)
{
    dsarl_error err;
    dsarl_error_clear(&err);
    dsarl_comm *comm = NULL;
    dsarl_layout l;
    dsarl_parallel par;
    if (dsarl_comm_init(&comm, &err) < 0 || dsarl_layout_make(dsarl_comm_world_size(comm), 1, 1, 1, 1, &l, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return 2;
    }
    l.collective_timeout_s = argc > 1 ? atof(argv[1]) : 2.0;
    if (dsarl_comm_build(comm, &l, &par, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return 2;
    }
    if (par.world_rank == 1) {
        sleep(120); // far past the timeout: the job must not wait for this
        return 0;
    }
    dsarl_group_barrier(par.world, &err);
    fprintf(stderr, "the barrier returned: the watchdog did not fire\n");
    dsarl_comm_finalize(comm);
    return 0;
}
