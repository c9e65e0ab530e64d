/* comm.c: process groups over MPI, the host-memory collectives, and the collective watchdog.
 *
 * MPI is initialised only when a launcher started this process (mpirun, srun); each group is an MPI communicator
 * split from the world along the layout's axes (layout.c gives the members, so the groups and the rank arithmetic
 * cannot disagree). Host collectives are blocking MPI calls bracketed by the watchdog: a collective still running
 * after runtime.collective_timeout_s means a peer died, stalled or took another path, and waiting longer would
 * hang the job, so the watchdog names this rank and what it waited for and aborts the job. */
#include "comm_internal.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dsarl/log.h"

#ifdef DSARL_HAVE_MPI
#include <mpi.h>
#endif

struct dsarl_group {
    char name[16];
    int32_t rank, size;
    int32_t *world_ranks; /* (size) */
    struct dsarl_comm *owner;
    /* time this process spent waiting in this group's collectives (watched calls), for the communication share */
    double busy_s;
    int64_t calls;
#ifdef DSARL_HAVE_MPI
    MPI_Comm comm;
#endif
};

struct dsarl_comm {
    int32_t rank, size, local_rank, local_size;
    dsarl_group groups[DSARL_AXIS_COUNT];
    dsarl_group generation; /* every process, training ranks first (built with dedicated generation ranks only) */
    bool built;
    /* watchdog: what this process waits for and since when (one collective at a time per process) */
    pthread_mutex_t lock;
    pthread_t watchdog;
    bool watchdog_running, stopping;
    double timeout_s, busy_since;
    char busy_what[96];
    const dsarl_group *busy_group;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool dsarl_comm_launched(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return true;
    // srun: a job step of more than one task (a batch script itself, or `srun -n 1`, stays one plain process)
    const char *step = getenv("SLURM_STEP_ID"), *tasks = getenv("SLURM_STEP_NUM_TASKS");
    return step && tasks && atoi(tasks) > 1;
}

int32_t dsarl_group_rank(const dsarl_group *g) { return g ? g->rank : 0; }
int32_t dsarl_group_size(const dsarl_group *g) { return g ? g->size : 1; }
const char *dsarl_group_name(const dsarl_group *g) { return g ? g->name : "single"; }
int32_t dsarl_group_world_rank(const dsarl_group *g, int32_t rank)
{
    return g && rank >= 0 && rank < g->size ? g->world_ranks[rank] : rank;
}
int32_t dsarl_comm_world_rank(const dsarl_comm *c) { return c ? c->rank : 0; }
int32_t dsarl_comm_world_size(const dsarl_comm *c) { return c ? c->size : 1; }

/* --- watchdog --------------------------------------------------------------------------------------------- */

void dsarl_group_watch_begin(const dsarl_group *g, const char *what)
{
    if (!g || !g->owner || !g->owner->watchdog_running)
        return;
    dsarl_comm *c = g->owner;
    pthread_mutex_lock(&c->lock);
    snprintf(c->busy_what, sizeof c->busy_what, "%s", what);
    c->busy_group = g;
    c->busy_since = now_s();
    pthread_mutex_unlock(&c->lock);
}

void dsarl_group_watch_end(const dsarl_group *g)
{
    if (!g || !g->owner || !g->owner->watchdog_running)
        return;
    dsarl_comm *c = g->owner;
    pthread_mutex_lock(&c->lock);
    if (c->busy_since > 0) {
        // the group is the caller's own (const to plugins); its counters belong to this process
        dsarl_group *mine = (dsarl_group *)g;
        mine->busy_s += now_s() - c->busy_since;
        mine->calls++;
    }
    c->busy_since = 0;
    pthread_mutex_unlock(&c->lock);
}

void dsarl_group_time(const dsarl_group *g, double *seconds, int64_t *calls)
{
    *seconds = 0, *calls = 0;
    if (!g || !g->owner)
        return;
    pthread_mutex_lock(&g->owner->lock);
    *seconds = g->busy_s, *calls = g->calls;
    pthread_mutex_unlock(&g->owner->lock);
}

#ifdef DSARL_HAVE_MPI
static void *watchdog_main(void *arg)
{
    dsarl_comm *c = arg;
    for (;;) {
        usleep(100 * 1000);
        pthread_mutex_lock(&c->lock);
        bool stop = c->stopping;
        double since = c->busy_since, waited = since > 0 ? now_s() - since : 0;
        if (!stop && since > 0 && waited > c->timeout_s) {
            fprintf(stderr,
                    "dsarl: rank %d: %s on group %s (%d ranks) has not completed after %.0f s "
                    "(runtime.collective_timeout_s): a peer rank died, stalled or took another path; ending the job\n",
                    c->rank, c->busy_what, c->busy_group->name, c->busy_group->size, waited);
            fflush(stderr);
#ifdef DSARL_HAVE_MPI
            MPI_Abort(MPI_COMM_WORLD, 1);
#endif
            _exit(1);
        }
        pthread_mutex_unlock(&c->lock);
        if (stop)
            return NULL;
    }
}

/* --- start-up, groups, shutdown ----------------------------------------------------------------------------- */

static int mpi_fail(dsarl_error *err, int rc, const char *what, const char *file, int line)
{
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return dsarl_error_set(err, DSARL_E_DEVICE, file, line, "MPI: %s failed: %s", what, text);
}
// Checked MPI call with the call's text and file:line.
#define mpiCheck(call)                                                                \
    do {                                                                              \
        int mpi_rc_ = (call);                                                         \
        if (mpi_rc_ != MPI_SUCCESS)                                                   \
            return mpi_fail(err, mpi_rc_, #call, __FILE__, __LINE__);                 \
    } while (0)

int dsarl_comm_init(dsarl_comm **out, dsarl_error *err)
{
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS)
            return mpi_fail(err, rc, "MPI_Init_thread", __FILE__, __LINE__);
    }
    // errors come back as codes, reported as one sentence, instead of MPI aborting on its own
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    dsarl_comm *c = calloc(1, sizeof *c);
    if (!c)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory starting MPI");
    pthread_mutex_init(&c->lock, NULL);
    int rank = 0, size = 1, local_rank = 0, local_size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm node;
    mpiCheck(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
    c->rank = rank, c->size = size, c->local_rank = local_rank, c->local_size = local_size;
    dsarl_log_set_rank(rank, size);
    *out = c;
    return DSARL_OK;
}

/* members: axis < 0 is the generation group (every process); a generation rank's axis groups are itself alone. */
static int build_group(dsarl_comm *c, const dsarl_layout *l, int axis, int32_t *scratch, dsarl_group *g,
                       dsarl_error *err)
{
    int32_t n = 0;
    if (axis < 0)
        for (int32_t r = 0; r < c->size; r++)
            scratch[n++] = r;
    else if (c->rank >= l->world)
        scratch[n++] = c->rank;
    else
        n = dsarl_layout_group_members(l, c->rank, (dsarl_axis)axis, scratch);
    snprintf(g->name, sizeof g->name, "%s", axis < 0 ? "generation" : dsarl_axis_name((dsarl_axis)axis));
    g->owner = c;
    g->size = n;
    if (!(g->world_ranks = malloc((size_t)n * sizeof(int32_t))))
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory building the %s group", g->name);
    memcpy(g->world_ranks, scratch, (size_t)n * sizeof(int32_t));
    g->rank = -1;
    for (int32_t i = 0; i < n; i++)
        if (scratch[i] == c->rank)
            g->rank = i;
    // members are listed in increasing world rank, so the world rank orders each split group as the layout does
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, scratch[0], c->rank, &g->comm));
    int got = -1;
    MPI_Comm_rank(g->comm, &got);
    if (got != g->rank)
        return DSARL_FAIL(err, DSARL_E_INTERNAL, "group %s: MPI rank %d, layout rank %d", g->name, got, g->rank);
    MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
    return DSARL_OK;
}

int dsarl_comm_build(dsarl_comm *c, const dsarl_layout *l, dsarl_parallel *out, dsarl_error *err)
{
    if (!c) {
        dsarl_parallel single = DSARL_PARALLEL_SINGLE;
        *out = single;
        return DSARL_OK;
    }
    if (c->built)
        return DSARL_FAIL(err, DSARL_E_INVALID, "the process groups are built once per run");
    if (l->world + l->generation != c->size)
        return DSARL_FAIL(err, DSARL_E_INTERNAL, "layout for %d + %d ranks in a world of %d", l->world, l->generation,
                          c->size);
    int32_t *scratch = malloc((size_t)c->size * sizeof(int32_t));
    if (!scratch)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory building the process groups");
    int rc = DSARL_OK;
    for (int a = 0; a < DSARL_AXIS_COUNT && rc == DSARL_OK; a++)
        rc = build_group(c, l, a, scratch, &c->groups[a], err);
    if (rc == DSARL_OK && l->generation > 0)
        rc = build_group(c, l, -1, scratch, &c->generation, err);
    free(scratch);
    DSARL_TRY(rc);
    c->built = true;
    if (c->rank < l->world) {
        dsarl_layout_coords(l, c->rank, out);
    } else { // a generation rank generates alone: a one-process layout (its groups are itself)
        dsarl_parallel single = DSARL_PARALLEL_SINGLE;
        *out = single;
    }
    out->generation_ranks = l->generation;
    out->generation_index = c->rank < l->world ? -1 : c->rank - l->world;
    out->generation = l->generation > 0 ? &c->generation : NULL;
    out->local_rank = c->local_rank, out->local_size = c->local_size;
    dsarl_group *g = c->groups;
    out->comm = &g[DSARL_AXIS_WORLD];
    out->world = &g[DSARL_AXIS_WORLD], out->tp = &g[DSARL_AXIS_TP], out->pp = &g[DSARL_AXIS_PP];
    out->cp = &g[DSARL_AXIS_CP], out->dp = &g[DSARL_AXIS_DP], out->dp_cp = &g[DSARL_AXIS_DP_CP];
    out->ep = &g[DSARL_AXIS_EP], out->edp = &g[DSARL_AXIS_EDP], out->tp_dp_cp = &g[DSARL_AXIS_TP_DP_CP];
    c->timeout_s = l->collective_timeout_s;
    if (c->size > 1 && pthread_create(&c->watchdog, NULL, watchdog_main, c) == 0)
        c->watchdog_running = true;
    return DSARL_OK;
}

void dsarl_comm_abort(dsarl_comm *c, int status)
{
    (void)c;
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status ? status : 1);
    _exit(status ? status : 1);
}

void dsarl_comm_finalize(dsarl_comm *c)
{
    if (!c)
        return;
    if (c->watchdog_running) {
        pthread_mutex_lock(&c->lock);
        c->stopping = true;
        pthread_mutex_unlock(&c->lock);
        pthread_join(c->watchdog, NULL);
    }
    for (int a = 0; a < DSARL_AXIS_COUNT; a++) {
        if (c->groups[a].world_ranks)
            MPI_Comm_free(&c->groups[a].comm);
        free(c->groups[a].world_ranks);
    }
    if (c->generation.world_ranks)
        MPI_Comm_free(&c->generation.comm);
    free(c->generation.world_ranks);
    pthread_mutex_destroy(&c->lock);
    free(c);
    MPI_Finalize();
}

/* --- host collectives ----------------------------------------------------------------------------------------- */

static int mpi_type(dsarl_dtype dtype, bool reduce, MPI_Datatype *out, const char *what, dsarl_error *err)
{
    switch (dtype) {
    case DSARL_DTYPE_F32: *out = MPI_FLOAT; return DSARL_OK;
    case DSARL_DTYPE_F64: *out = MPI_DOUBLE; return DSARL_OK;
    case DSARL_DTYPE_I32: *out = MPI_INT32_T; return DSARL_OK;
    case DSARL_DTYPE_I64: *out = MPI_INT64_T; return DSARL_OK;
    default: break;
    }
    if (!reduce) { // moved, never added: any element of the right width will do
        switch (dtype) {
        case DSARL_DTYPE_BF16:
        case DSARL_DTYPE_F16: *out = MPI_UINT16_T; return DSARL_OK;
        case DSARL_DTYPE_U8:
        case DSARL_DTYPE_I8:
        case DSARL_DTYPE_BOOL: *out = MPI_UINT8_T; return DSARL_OK;
        default: break;
        }
    }
    return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "host %s of dtype %d: reductions take f32, f64, i32 and i64", what,
                      (int)dtype);
}

static int mpi_op(dsarl_reduce_op op, dsarl_dtype dtype, MPI_Op *out, dsarl_error *err)
{
    switch (op) {
    case DSARL_REDUCE_SUM: *out = MPI_SUM; return DSARL_OK;
    case DSARL_REDUCE_MAX: *out = MPI_MAX; return DSARL_OK;
    case DSARL_REDUCE_MIN: *out = MPI_MIN; return DSARL_OK;
    case DSARL_REDUCE_AVG:
        if (dtype == DSARL_DTYPE_F32 || dtype == DSARL_DTYPE_F64) {
            *out = MPI_SUM;
            return DSARL_OK;
        }
        break;
    }
    return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "reduction %d of dtype %d (average needs f32 or f64)", (int)op,
                      (int)dtype);
}

static void divide(void *buf, int64_t n, dsarl_dtype dtype, int32_t by)
{
    if (dtype == DSARL_DTYPE_F32)
        for (int64_t i = 0; i < n; i++)
            ((float *)buf)[i] /= (float)by;
    else
        for (int64_t i = 0; i < n; i++)
            ((double *)buf)[i] /= (double)by;
}

// MPI counts are int: one call moves at most INT_MAX values (reductions and broadcasts go in chunks).
#define CHUNK ((int64_t)1 << 30)

static int fits_int(int64_t n, const char *what, dsarl_error *err)
{
    return n >= 0 && n <= INT_MAX ? DSARL_OK
                                  : DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "host %s of %lld values: at most %d per call",
                                               what, (long long)n, INT_MAX);
}

#define WATCHED(g, what, body)             \
    do {                                   \
        dsarl_group_watch_begin(g, what);  \
        int watched_rc_ = (body);          \
        dsarl_group_watch_end(g);          \
        if (watched_rc_ != MPI_SUCCESS)    \
            return mpi_fail(err, watched_rc_, what, __FILE__, __LINE__); \
    } while (0)

int dsarl_group_all_reduce_host(const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype, dsarl_reduce_op op,
                                dsarl_error *err)
{
    if (!g || g->size == 1 || n == 0)
        return DSARL_OK;
    MPI_Datatype t = MPI_DATATYPE_NULL;
    MPI_Op o = MPI_OP_NULL;
    DSARL_TRY(mpi_type(dtype, true, &t, "all_reduce", err));
    DSARL_TRY(mpi_op(op, dtype, &o, err));
    size_t elem = dsarl_dtype_size(dtype);
    for (int64_t at = 0; at < n; at += CHUNK) {
        int count = (int)(n - at < CHUNK ? n - at : CHUNK);
        WATCHED(g, "all_reduce", MPI_Allreduce(MPI_IN_PLACE, (char *)buf + (size_t)at * elem, count, t, o, g->comm));
    }
    if (op == DSARL_REDUCE_AVG)
        divide(buf, n, dtype, g->size);
    return DSARL_OK;
}

int dsarl_group_all_gather_host(const dsarl_group *g, void *out, const void *in, int64_t n, dsarl_dtype dtype,
                                dsarl_error *err)
{
    size_t elem = dsarl_dtype_size(dtype);
    if (!g || g->size == 1) {
        if (out != in && n)
            memmove(out, in, (size_t)n * elem);
        return DSARL_OK;
    }
    MPI_Datatype t = MPI_DATATYPE_NULL;
    DSARL_TRY(mpi_type(dtype, false, &t, "all_gather", err));
    DSARL_TRY(fits_int(n, "all_gather", err));
    WATCHED(g, "all_gather", MPI_Allgather(in, (int)n, t, out, (int)n, t, g->comm));
    return DSARL_OK;
}

int dsarl_group_reduce_scatter_host(const dsarl_group *g, void *out, const void *in, int64_t n, dsarl_dtype dtype,
                                    dsarl_reduce_op op, dsarl_error *err)
{
    size_t elem = dsarl_dtype_size(dtype);
    if (!g || g->size == 1) {
        if (out != in && n)
            memmove(out, in, (size_t)n * elem);
        return DSARL_OK;
    }
    MPI_Datatype t = MPI_DATATYPE_NULL;
    MPI_Op o = MPI_OP_NULL;
    DSARL_TRY(mpi_type(dtype, true, &t, "reduce_scatter", err));
    DSARL_TRY(mpi_op(op, dtype, &o, err));
    DSARL_TRY(fits_int(n, "reduce_scatter", err));
    WATCHED(g, "reduce_scatter", MPI_Reduce_scatter_block(in, out, (int)n, t, o, g->comm));
    if (op == DSARL_REDUCE_AVG)
        divide(out, n, dtype, g->size);
    return DSARL_OK;
}

int dsarl_group_all_to_all_host(const dsarl_group *g, void *out, const int64_t *recv_counts, const void *in,
                                const int64_t *send_counts, dsarl_dtype dtype, dsarl_error *err)
{
    size_t elem = dsarl_dtype_size(dtype);
    if (!g || g->size == 1) {
        if (out != in && send_counts[0])
            memmove(out, in, (size_t)send_counts[0] * elem);
        return DSARL_OK;
    }
    MPI_Datatype t = MPI_DATATYPE_NULL;
    DSARL_TRY(mpi_type(dtype, false, &t, "all_to_all", err));
    int *counts = malloc(4 * (size_t)g->size * sizeof(int));
    if (!counts)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for an all_to_all of %d ranks", g->size);
    int *sc = counts, *sd = counts + g->size, *rc = counts + 2 * g->size, *rd = counts + 3 * g->size;
    int64_t s_at = 0, r_at = 0;
    int status = DSARL_OK;
    for (int32_t p = 0; p < g->size && status == DSARL_OK; p++) {
        if (send_counts[p] < 0 || recv_counts[p] < 0 || s_at + send_counts[p] > INT_MAX ||
            r_at + recv_counts[p] > INT_MAX)
            status = DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "host all_to_all: counts must be >= 0 and total at most %d",
                                INT_MAX);
        sc[p] = (int)send_counts[p], sd[p] = (int)s_at, rc[p] = (int)recv_counts[p], rd[p] = (int)r_at;
        s_at += send_counts[p], r_at += recv_counts[p];
    }
    if (status == DSARL_OK) {
        dsarl_group_watch_begin(g, "all_to_all");
        int mrc = MPI_Alltoallv(in, sc, sd, t, out, rc, rd, t, g->comm);
        dsarl_group_watch_end(g);
        if (mrc != MPI_SUCCESS)
            status = mpi_fail(err, mrc, "all_to_all", __FILE__, __LINE__);
    }
    free(counts);
    return status;
}

int dsarl_group_broadcast_host(const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype, int32_t root,
                               dsarl_error *err)
{
    if (!g || g->size == 1 || n == 0)
        return DSARL_OK;
    if (root < 0 || root >= g->size)
        return DSARL_FAIL(err, DSARL_E_INVALID, "broadcast root %d outside group %s of %d", root, g->name, g->size);
    MPI_Datatype t = MPI_DATATYPE_NULL;
    DSARL_TRY(mpi_type(dtype, false, &t, "broadcast", err));
    size_t elem = dsarl_dtype_size(dtype);
    for (int64_t at = 0; at < n; at += CHUNK) {
        int count = (int)(n - at < CHUNK ? n - at : CHUNK);
        WATCHED(g, "broadcast", MPI_Bcast((char *)buf + (size_t)at * elem, count, t, root, g->comm));
    }
    return DSARL_OK;
}

static int check_peer(const dsarl_group *g, int32_t peer, const char *what, dsarl_error *err)
{
    if (!g || peer < 0 || peer >= g->size || peer == g->rank)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s to rank %d of group %s (%d ranks, this is rank %d)", what, peer,
                          dsarl_group_name(g), dsarl_group_size(g), dsarl_group_rank(g));
    return DSARL_OK;
}

int dsarl_group_send_host(const dsarl_group *g, const void *buf, int64_t n, dsarl_dtype dtype, int32_t peer,
                          dsarl_error *err)
{
    DSARL_TRY(check_peer(g, peer, "send", err));
    MPI_Datatype t = MPI_DATATYPE_NULL;
    DSARL_TRY(mpi_type(dtype, false, &t, "send", err));
    size_t elem = dsarl_dtype_size(dtype);
    for (int64_t at = 0; at < n; at += CHUNK) {
        int count = (int)(n - at < CHUNK ? n - at : CHUNK);
        WATCHED(g, "send", MPI_Send((const char *)buf + (size_t)at * elem, count, t, peer, 0, g->comm));
    }
    return DSARL_OK;
}

int dsarl_group_recv_host(const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype, int32_t peer,
                          dsarl_error *err)
{
    DSARL_TRY(check_peer(g, peer, "recv", err));
    MPI_Datatype t = MPI_DATATYPE_NULL;
    DSARL_TRY(mpi_type(dtype, false, &t, "recv", err));
    size_t elem = dsarl_dtype_size(dtype);
    for (int64_t at = 0; at < n; at += CHUNK) {
        int count = (int)(n - at < CHUNK ? n - at : CHUNK);
        WATCHED(g, "recv",
                MPI_Recv((char *)buf + (size_t)at * elem, count, t, peer, 0, g->comm, MPI_STATUS_IGNORE));
    }
    return DSARL_OK;
}

int dsarl_group_barrier(const dsarl_group *g, dsarl_error *err)
{
    if (!g || g->size == 1)
        return DSARL_OK;
    WATCHED(g, "barrier", MPI_Barrier(g->comm));
    return DSARL_OK;
}

#else /* no MPI in this build: one process only */

int dsarl_comm_init(dsarl_comm **out, dsarl_error *err)
{
    *out = NULL;
    return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "this dsarl was built without MPI, so it cannot run as one rank of "
                      "a multi-process job (install Open MPI's development files and rebuild)");
}

int dsarl_comm_build(dsarl_comm *c, const dsarl_layout *l, dsarl_parallel *out, dsarl_error *err)
{
    (void)c, (void)err;
    dsarl_parallel single = DSARL_PARALLEL_SINGLE;
    *out = single;
    if (l->world != 1)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "a layout of %d processes needs a dsarl built with MPI", l->world);
    return DSARL_OK;
}

void dsarl_comm_abort(dsarl_comm *c, int status)
{
    (void)c;
    _exit(status ? status : 1);
}

void dsarl_comm_finalize(dsarl_comm *c) { (void)c; }

static int single_only(const dsarl_group *g, const char *what, dsarl_error *err)
{
    return !g || g->size == 1 ? DSARL_OK
                              : DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "host %s: this dsarl was built without MPI", what);
}

int dsarl_group_all_reduce_host(const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype, dsarl_reduce_op op,
                                dsarl_error *err)
{
    (void)buf, (void)n, (void)dtype, (void)op;
    return single_only(g, "all_reduce", err);
}
int dsarl_group_all_gather_host(const dsarl_group *g, void *out, const void *in, int64_t n, dsarl_dtype dtype,
                                dsarl_error *err)
{
    if (out != in && n)
        memmove(out, in, (size_t)n * dsarl_dtype_size(dtype));
    return single_only(g, "all_gather", err);
}
int dsarl_group_reduce_scatter_host(const dsarl_group *g, void *out, const void *in, int64_t n, dsarl_dtype dtype,
                                    dsarl_reduce_op op, dsarl_error *err)
{
    (void)op;
    if (out != in && n)
        memmove(out, in, (size_t)n * dsarl_dtype_size(dtype));
    return single_only(g, "reduce_scatter", err);
}
int dsarl_group_all_to_all_host(const dsarl_group *g, void *out, const int64_t *recv_counts, const void *in,
                                const int64_t *send_counts, dsarl_dtype dtype, dsarl_error *err)
{
    (void)recv_counts;
    if (out != in && send_counts[0])
        memmove(out, in, (size_t)send_counts[0] * dsarl_dtype_size(dtype));
    return single_only(g, "all_to_all", err);
}
int dsarl_group_broadcast_host(const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype, int32_t root,
                               dsarl_error *err)
{
    (void)buf, (void)n, (void)dtype, (void)root;
    return single_only(g, "broadcast", err);
}
int dsarl_group_send_host(const dsarl_group *g, const void *buf, int64_t n, dsarl_dtype dtype, int32_t peer,
                          dsarl_error *err)
{
    (void)buf, (void)n, (void)dtype, (void)peer;
    return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "host send on group %s: this dsarl was built without MPI",
                      dsarl_group_name(g));
}
int dsarl_group_recv_host(const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype, int32_t peer,
                          dsarl_error *err)
{
    (void)buf, (void)n, (void)dtype, (void)peer;
    return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "host recv on group %s: this dsarl was built without MPI",
                      dsarl_group_name(g));
}
int dsarl_group_barrier(const dsarl_group *g, dsarl_error *err) { return single_only(g, "barrier", err); }

#endif
