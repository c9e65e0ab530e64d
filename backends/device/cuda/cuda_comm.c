/* cuda_comm.c: the CUDA device's collectives (ABI 1.3) on NCCL, queued on the compute stream like every kernel, so a
 * collective is ordered after the work that produced its input and before the work that reads its output, with no
 * host synchronisation in between.
 *
 * Communicators. One ncclComm_t per process group, made lazily at the group's first collective on this device:
 * rank 0 of the group draws a unique id, the core's MPI broadcast over the same group hands it to the others, and
 * every member calls ncclCommInitRank with its group rank. Lazy creation is safe because every call here is
 * collective: all members make the same calls on a group in the same order, so all of them reach the group's first
 * call (and create the communicator there) together. A send/recv pair is collective over the group too (both ends
 * create it at their first call on the group). A NULL group (one process, no MPI) gets a communicator of one from a
 * local id, so each slot also works on a group of one (the GPU tests' case: NCCL refuses two ranks on one GPU).
 * The table lives in the device instance; destroy releases it.
 *
 * Waiting. NCCL calls return once queued; the wait happens where the device waits for its stream (synchronize,
 * a copy to or from the host). While NCCL work is queued, cuda_comm_wait brackets that wait with the core's
 * collective watchdog (a dead peer ends the job after runtime.collective_timeout_s instead of hanging it) and polls
 * ncclCommGetAsyncError: an NCCL failure (a peer's connection lost) aborts the communicators and is returned as an
 * error naming the group, instead of waiting for the watchdog. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */
#include <nccl.h>
#include <cuda_runtime_api.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "cuda_device.h"

struct cuda_nccl_comm {
    const dsarl_group *group; /* NULL: this process alone */
    ncclComm_t comm;
};

/* Returns a DSARL_E_DEVICE error naming the call site, the NCCL call, its group, and NCCL's messages. */
#define ncclCheck(call, dev, g, err)                                                                            \
    do {                                                                                                        \
        ncclResult_t nccl_check_rc_ = (call);                                                                   \
        if (nccl_check_rc_ != ncclSuccess)                                                                      \
            return nccl_fail((dev), (g), nccl_check_rc_, #call, __FILE__, __LINE__, (err));                     \
    } while (0)

#define cudaCheckC(call, err)                                                                                   \
    do {                                                                                                        \
        cudaError_t cuda_check_rc_ = (call);                                                                    \
        if (cuda_check_rc_ != cudaSuccess)                                                                      \
            return dsarl_error_set((err), DSARL_E_DEVICE, __FILE__, __LINE__, "device cuda: %s failed: %s",    \
                                   #call, cudaGetErrorString(cuda_check_rc_));                                  \
    } while (0)

static int nccl_fail(dsarl_device *dev, const dsarl_group *g, ncclResult_t rc, const char *call, const char *file,
                     int line, dsarl_error *err)
{
    dev->nccl_failed = 1;
    const char *last = ncclGetLastError(NULL);
    return dsarl_error_set(err, DSARL_E_DEVICE, file, line, "device cuda: %s on group %s (rank %d of %d) failed: %s%s%s",
                           call, dsarl_group_name(g), dsarl_group_rank(g), dsarl_group_size(g),
                           ncclGetErrorString(rc), last && *last ? ": " : "", last ? last : "");
}

static int nccl_type(dsarl_dtype dtype, ncclDataType_t *out, dsarl_error *err)
{
    switch (dtype) {
    case DSARL_DTYPE_F32: *out = ncclFloat32; return DSARL_OK;
    case DSARL_DTYPE_BF16: *out = ncclBfloat16; return DSARL_OK;
    case DSARL_DTYPE_F16: *out = ncclFloat16; return DSARL_OK;
    case DSARL_DTYPE_F64: *out = ncclFloat64; return DSARL_OK;
    case DSARL_DTYPE_I32: *out = ncclInt32; return DSARL_OK;
    case DSARL_DTYPE_I64: *out = ncclInt64; return DSARL_OK;
    case DSARL_DTYPE_U8:
    case DSARL_DTYPE_BOOL: *out = ncclUint8; return DSARL_OK;
    case DSARL_DTYPE_I8: *out = ncclInt8; return DSARL_OK;
    default: break;
    }
    return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "device cuda: collectives take f32, bf16, f16, f64, i32, i64, u8 and "
                      "i8, got dtype %s", dsarl_dtype_name(dtype));
}

static bool is_float(dsarl_dtype d)
{
    return d == DSARL_DTYPE_F32 || d == DSARL_DTYPE_BF16 || d == DSARL_DTYPE_F16 || d == DSARL_DTYPE_F64;
}

// AVG is ncclAvg (the sum divided by the group size inside the reduction), floating point only as on the host side
// (an integer average would truncate differently from the CPU device's).
static int nccl_op(dsarl_reduce_op op, dsarl_dtype dtype, ncclRedOp_t *out, dsarl_error *err)
{
    switch (op) {
    case DSARL_REDUCE_SUM: *out = ncclSum; return DSARL_OK;
    case DSARL_REDUCE_MAX: *out = ncclMax; return DSARL_OK;
    case DSARL_REDUCE_MIN: *out = ncclMin; return DSARL_OK;
    case DSARL_REDUCE_AVG:
        if (is_float(dtype)) {
            *out = ncclAvg;
            return DSARL_OK;
        }
        break;
    }
    return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "device cuda: reduction %d of dtype %s (average needs a floating-point "
                      "dtype)", (int)op, dsarl_dtype_name(dtype));
}

// The group's communicator, created at its first use (see the file comment for why that is safe).
static int get_comm(dsarl_device *dev, const dsarl_group *g, ncclComm_t *out, dsarl_error *err)
{
    for (size_t i = 0; i < dev->n_nccl; i++)
        if (dev->nccl[i].group == g) {
            *out = dev->nccl[i].comm;
            return DSARL_OK;
        }
    if (dev->nccl_failed) // a new communicator now would be made by this rank alone, so wait forever
        return DSARL_FAIL(err, DSARL_E_DEVICE, "device cuda: an earlier NCCL failure aborted this device's "
                          "communicators; no collective on group %s can run", dsarl_group_name(g));
    int32_t size = dsarl_group_size(g), rank = dsarl_group_rank(g);
    // NCCL refuses two ranks of one communicator on one GPU; say why before it does, in the layout's terms
    int gpus = cuda_visible_devices();
    if (size > 1 && dev->local_size > gpus)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "device cuda: %d ranks on this host share %d GPU%s, but NCCL "
                          "collectives need one GPU per rank (launch at most %d ranks per host)", dev->local_size,
                          gpus, gpus == 1 ? "" : "s", gpus);
    if (dev->n_nccl == dev->cap_nccl) {
        size_t cap = dev->cap_nccl ? 2 * dev->cap_nccl : 8;
        struct cuda_nccl_comm *t = realloc(dev->nccl, cap * sizeof(*t));
        if (!t)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "device cuda: out of host memory for the NCCL communicators");
        dev->nccl = t, dev->cap_nccl = cap;
    }
    ncclUniqueId id;
    if (rank == 0)
        ncclCheck(ncclGetUniqueId(&id), dev, g, err);
    if (size > 1)
        DSARL_TRY(dsarl_group_broadcast_host(g, &id, (int64_t)sizeof(id), DSARL_DTYPE_U8, 0, err));
    cudaCheckC(cudaSetDevice(dev->ordinal), err); // NCCL binds the communicator to the current device
    ncclComm_t comm = NULL;
    // init blocks until every member joined: a member that never comes is the watchdog's case
    dsarl_group_watch_begin(g, "ncclCommInitRank");
    ncclResult_t rc = ncclCommInitRank(&comm, size, id, rank);
    dsarl_group_watch_end(g);
    ncclCheck(rc, dev, g, err);
    dev->nccl[dev->n_nccl++] = (struct cuda_nccl_comm){.group = g, .comm = comm};
    *out = comm;
    return DSARL_OK;
}

// Marks NCCL work queued on the compute stream, for the next wait's watchdog bracket.
static void queued(dsarl_device *dev, const dsarl_group *g, const char *what)
{
    dev->nccl_inflight = g;
    dev->nccl_inflight_what = what;
}

static void *at(const void *p, int64_t values, dsarl_dtype dtype)
{
    return (char *)p + (size_t)values * dsarl_dtype_size(dtype);
}

int cuda_all_reduce(dsarl_device *dev, const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype,
                    dsarl_reduce_op op, dsarl_error *err)
{
    // initialised: gcc's -Wmaybe-uninitialized cannot see nccl_type set them through DSARL_TRY
    ncclDataType_t t = ncclFloat32;
    ncclRedOp_t o = ncclSum;
    ncclComm_t c = NULL;
    DSARL_TRY(nccl_type(dtype, &t, err));
    DSARL_TRY(nccl_op(op, dtype, &o, err));
    DSARL_TRY(get_comm(dev, g, &c, err));
    if (n <= 0)
        return DSARL_OK;
    ncclCheck(ncclAllReduce(buf, buf, (size_t)n, t, o, c, (cudaStream_t)dev->compute), dev, g, err);
    queued(dev, g, "NCCL all_reduce");
    return DSARL_OK;
}

int cuda_all_gather(dsarl_device *dev, const dsarl_group *g, void *out, const void *in, int64_t n, dsarl_dtype dtype,
                    dsarl_error *err)
{
    ncclDataType_t t = ncclFloat32;
    ncclComm_t c = NULL;
    DSARL_TRY(nccl_type(dtype, &t, err));
    DSARL_TRY(get_comm(dev, g, &c, err));
    if (n <= 0)
        return DSARL_OK;
    ncclCheck(ncclAllGather(in, out, (size_t)n, t, c, (cudaStream_t)dev->compute), dev, g, err);
    queued(dev, g, "NCCL all_gather");
    return DSARL_OK;
}

int cuda_reduce_scatter(dsarl_device *dev, const dsarl_group *g, void *out, const void *in, int64_t n,
                        dsarl_dtype dtype, dsarl_reduce_op op, dsarl_error *err)
{
    ncclDataType_t t = ncclFloat32;
    ncclRedOp_t o = ncclSum;
    ncclComm_t c = NULL;
    DSARL_TRY(nccl_type(dtype, &t, err));
    DSARL_TRY(nccl_op(op, dtype, &o, err));
    DSARL_TRY(get_comm(dev, g, &c, err));
    if (n <= 0)
        return DSARL_OK;
    ncclCheck(ncclReduceScatter(in, out, (size_t)n, t, o, c, (cudaStream_t)dev->compute), dev, g, err);
    queued(dev, g, "NCCL reduce_scatter");
    return DSARL_OK;
}

// Per-peer counts as one NCCL group of sends and receives (peers with nothing to move skipped on both ends: the
// count a rank sends to p is the count p receives from it). This rank's own block is a device copy.
int cuda_all_to_all(dsarl_device *dev, const dsarl_group *g, void *out, const int64_t *recv_counts, const void *in,
                    const int64_t *send_counts, dsarl_dtype dtype, dsarl_error *err)
{
    ncclDataType_t t = ncclFloat32;
    ncclComm_t c = NULL;
    DSARL_TRY(nccl_type(dtype, &t, err));
    DSARL_TRY(get_comm(dev, g, &c, err));
    int32_t size = dsarl_group_size(g), rank = dsarl_group_rank(g);
    for (int32_t p = 0; p < size; p++)
        if (send_counts[p] < 0 || recv_counts[p] < 0)
            return DSARL_FAIL(err, DSARL_E_INVALID, "device cuda: all_to_all on group %s: negative count for peer %d",
                              dsarl_group_name(g), p);
    if (send_counts[rank] != recv_counts[rank])
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cuda: all_to_all on group %s: rank %d sends itself %lld "
                          "values but receives %lld", dsarl_group_name(g), rank, (long long)send_counts[rank],
                          (long long)recv_counts[rank]);
    cudaStream_t s = (cudaStream_t)dev->compute;
    int64_t s_at = 0, r_at = 0, self_s = 0, self_r = 0;
    bool any = false;
    ncclCheck(ncclGroupStart(), dev, g, err);
    ncclResult_t rc = ncclSuccess;
    const char *failed = NULL;
    for (int32_t p = 0; p < size && rc == ncclSuccess; p++) {
        if (p == rank) {
            self_s = s_at, self_r = r_at;
        } else {
            if (send_counts[p] > 0) {
                rc = ncclSend(at(in, s_at, dtype), (size_t)send_counts[p], t, p, c, s);
                failed = "ncclSend";
            }
            if (rc == ncclSuccess && recv_counts[p] > 0) {
                rc = ncclRecv(at(out, r_at, dtype), (size_t)recv_counts[p], t, p, c, s);
                failed = "ncclRecv";
            }
            any |= send_counts[p] > 0 || recv_counts[p] > 0;
        }
        s_at += send_counts[p], r_at += recv_counts[p];
    }
    ncclResult_t end = ncclGroupEnd(); // always closed, even after a failed call inside it
    if (rc != ncclSuccess)
        return nccl_fail(dev, g, rc, failed, __FILE__, __LINE__, err);
    ncclCheck(end, dev, g, err);
    if (send_counts[rank] > 0 && at(out, self_r, dtype) != at(in, self_s, dtype))
        cudaCheckC(cudaMemcpyAsync(at(out, self_r, dtype), at(in, self_s, dtype),
                                   (size_t)send_counts[rank] * dsarl_dtype_size(dtype), cudaMemcpyDeviceToDevice, s),
                   err);
    if (any)
        queued(dev, g, "NCCL all_to_all");
    return DSARL_OK;
}

int cuda_broadcast(dsarl_device *dev, const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype, int32_t root,
                   dsarl_error *err)
{
    ncclDataType_t t = ncclFloat32;
    ncclComm_t c = NULL;
    DSARL_TRY(nccl_type(dtype, &t, err));
    if (root < 0 || root >= dsarl_group_size(g))
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cuda: broadcast root %d outside group %s of %d", root,
                          dsarl_group_name(g), dsarl_group_size(g));
    DSARL_TRY(get_comm(dev, g, &c, err));
    if (n <= 0)
        return DSARL_OK;
    ncclCheck(ncclBroadcast(buf, buf, (size_t)n, t, root, c, (cudaStream_t)dev->compute), dev, g, err);
    queued(dev, g, "NCCL broadcast");
    return DSARL_OK;
}

static int check_peer(const dsarl_group *g, int32_t peer, const char *what, dsarl_error *err)
{
    if (peer < 0 || peer >= dsarl_group_size(g) || peer == dsarl_group_rank(g))
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cuda: %s to rank %d of group %s (%d ranks, this is rank %d)",
                          what, peer, dsarl_group_name(g), dsarl_group_size(g), dsarl_group_rank(g));
    return DSARL_OK;
}

int cuda_send(dsarl_device *dev, const dsarl_group *g, const void *buf, int64_t n, dsarl_dtype dtype, int32_t peer,
              dsarl_error *err)
{
    ncclDataType_t t = ncclFloat32;
    ncclComm_t c = NULL;
    DSARL_TRY(nccl_type(dtype, &t, err));
    DSARL_TRY(check_peer(g, peer, "send", err));
    DSARL_TRY(get_comm(dev, g, &c, err));
    if (n <= 0)
        return DSARL_OK;
    ncclCheck(ncclSend(buf, (size_t)n, t, peer, c, (cudaStream_t)dev->compute), dev, g, err);
    queued(dev, g, "NCCL send");
    return DSARL_OK;
}

int cuda_recv(dsarl_device *dev, const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype, int32_t peer,
              dsarl_error *err)
{
    ncclDataType_t t = ncclFloat32;
    ncclComm_t c = NULL;
    DSARL_TRY(nccl_type(dtype, &t, err));
    DSARL_TRY(check_peer(g, peer, "recv", err));
    DSARL_TRY(get_comm(dev, g, &c, err));
    if (n <= 0)
        return DSARL_OK;
    ncclCheck(ncclRecv(buf, (size_t)n, t, peer, c, (cudaStream_t)dev->compute), dev, g, err);
    queued(dev, g, "NCCL recv");
    return DSARL_OK;
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Aborts every communicator (their peers may be gone, so a clean destroy could wait for them forever).
static void abort_all(dsarl_device *dev)
{
    for (size_t i = 0; i < dev->n_nccl; i++)
        ncclCommAbort(dev->nccl[i].comm);
    dev->n_nccl = 0;
    dev->nccl_failed = 1;
}

int cuda_comm_wait(dsarl_device *dev, void *stream, dsarl_error *err)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (!dev->nccl_inflight_what) { // nothing of NCCL's queued since the last wait: the plain wait
        cudaCheckC(cudaStreamSynchronize(s), err);
        return DSARL_OK;
    }
    const dsarl_group *g = dev->nccl_inflight;
    // NCCL work queued: poll the stream and the communicators' asynchronous errors, spinning for the first
    // millisecond (a collective's latency) and then sleeping 50 us between polls so a long wait costs no core
    dsarl_group_watch_begin(g, dev->nccl_inflight_what);
    double t0 = seconds();
    cudaError_t rc;
    while ((rc = cudaStreamQuery(s)) == cudaErrorNotReady) {
        for (size_t i = 0; i < dev->n_nccl; i++) {
            ncclResult_t async = ncclSuccess;
            if (ncclCommGetAsyncError(dev->nccl[i].comm, &async) == ncclSuccess && async != ncclSuccess &&
                async != ncclInProgress) {
                dsarl_group_watch_end(g);
                const dsarl_group *bad = dev->nccl[i].group;
                int status = DSARL_FAIL(err, DSARL_E_DEVICE, "device cuda: NCCL on group %s (rank %d of %d) failed "
                                        "while waiting for %s: %s; the communicators are aborted",
                                        dsarl_group_name(bad), dsarl_group_rank(bad), dsarl_group_size(bad),
                                        dev->nccl_inflight_what, ncclGetErrorString(async));
                abort_all(dev);
                return status;
            }
        }
        if (seconds() - t0 < 1e-3) {
            sched_yield();
        } else {
            struct timespec nap = {0, 50 * 1000};
            nanosleep(&nap, NULL);
        }
    }
    dsarl_group_watch_end(g);
    if (rc != cudaSuccess)
        return DSARL_FAIL(err, DSARL_E_DEVICE, "device cuda: waiting for %s on group %s failed: %s",
                          dev->nccl_inflight_what, dsarl_group_name(g), cudaGetErrorString(rc));
    dev->nccl_inflight = NULL, dev->nccl_inflight_what = NULL;
    return DSARL_OK;
}

void cuda_comm_destroy(dsarl_device *dev)
{
    if (dev->n_nccl == 0) {
        free(dev->nccl);
        dev->nccl = NULL;
        return;
    }
    dsarl_error ignored;
    // queued collectives finish first (or fail: then the communicators are aborted, not destroyed)
    if (dev->compute && cuda_comm_wait(dev, dev->compute, &ignored) != DSARL_OK)
        dev->nccl_failed = 1;
    if (dev->nccl_failed) {
        abort_all(dev);
    } else {
        for (size_t i = 0; i < dev->n_nccl; i++) {
            // destroy finalises the communicator, which may wait on its peers: watched like any collective
            dsarl_group_watch_begin(dev->nccl[i].group, "ncclCommDestroy");
            ncclCommDestroy(dev->nccl[i].comm);
            dsarl_group_watch_end(dev->nccl[i].group);
        }
    }
    free(dev->nccl);
    dev->nccl = NULL;
    dev->n_nccl = dev->cap_nccl = 0;
}
