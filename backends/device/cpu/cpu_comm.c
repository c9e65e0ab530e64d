/* cpu_comm.c: the CPU device's collectives. Its device memory is host memory, so each is the core's MPI host
 * collective on the same pointers (every parallel path of a model runs in CI under mpirun on this device). */
#include "cpu_device.h"

int cpu_all_reduce(dsarl_device *dev, const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype,
                   dsarl_reduce_op op, dsarl_error *err)
{
    (void)dev;
    return dsarl_group_all_reduce_host(g, buf, n, dtype, op, err);
}

int cpu_all_gather(dsarl_device *dev, const dsarl_group *g, void *out, const void *in, int64_t n, dsarl_dtype dtype,
                   dsarl_error *err)
{
    (void)dev;
    return dsarl_group_all_gather_host(g, out, in, n, dtype, err);
}

int cpu_reduce_scatter(dsarl_device *dev, const dsarl_group *g, void *out, const void *in, int64_t n,
                       dsarl_dtype dtype, dsarl_reduce_op op, dsarl_error *err)
{
    (void)dev;
    return dsarl_group_reduce_scatter_host(g, out, in, n, dtype, op, err);
}

int cpu_all_to_all(dsarl_device *dev, const dsarl_group *g, void *out, const int64_t *recv_counts, const void *in,
                   const int64_t *send_counts, dsarl_dtype dtype, dsarl_error *err)
{
    (void)dev;
    return dsarl_group_all_to_all_host(g, out, recv_counts, in, send_counts, dtype, err);
}

int cpu_broadcast(dsarl_device *dev, const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype, int32_t root,
                  dsarl_error *err)
{
    (void)dev;
    return dsarl_group_broadcast_host(g, buf, n, dtype, root, err);
}

int cpu_send(dsarl_device *dev, const dsarl_group *g, const void *buf, int64_t n, dsarl_dtype dtype, int32_t peer,
             dsarl_error *err)
{
    (void)dev;
    return dsarl_group_send_host(g, buf, n, dtype, peer, err);
}

int cpu_recv(dsarl_device *dev, const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype, int32_t peer,
             dsarl_error *err)
{
    (void)dev;
    return dsarl_group_recv_host(g, buf, n, dtype, peer, err);
}
