/* check_comm_mpi.c: the process groups and every collective, on host memory (the core's MPI functions) and through
 * the CPU device's ops table, under `mpirun -np 2` and `-np 4`. Each rank's inputs come from a seed of its world
 * rank, so every rank regenerates its peers' inputs and computes the expected result itself; counts differ per
 * peer (zeros included) so a packing or displacement mistake cannot hide. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "dsarl/ops/device.h"

extern const dsarl_device_ops dsarl_cpu_device_ops;

static dsarl_comm *comm;
static dsarl_parallel par;
static dsarl_device *dev;

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// value i of world rank r's input for test `salt`: a float in (-1, 1) that is exact in float32
static float input(int salt, int r, int64_t i)
{
    uint64_t h = mix(((uint64_t)salt << 40) ^ ((uint64_t)r << 24) ^ (uint64_t)i);
    return (float)((int64_t)(h % 2001) - 1000) / 1024.0f;
}

static void fill(float *x, int64_t n, int salt, int r)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = input(salt, r, i);
}

static dsarl_error err;
#define OK(call) ck_assert_msg((call) == DSARL_OK, "%s: %s", #call, err.message)

static void check_reduce(const dsarl_group *g, dsarl_reduce_op op, bool device, int salt)
{
    int64_t n = 1000 + 37 * salt;
    float *x = malloc((size_t)n * sizeof(float));
    fill(x, n, salt, par.world_rank);
    if (device)
        OK(dsarl_device_all_reduce(&dsarl_cpu_device_ops, dev, g, x, n, DSARL_DTYPE_F32, op, &err));
    else
        OK(dsarl_group_all_reduce_host(g, x, n, DSARL_DTYPE_F32, op, &err));
    for (int64_t i = 0; i < n; i++) {
        double want = op == DSARL_REDUCE_MAX ? -2 : op == DSARL_REDUCE_MIN ? 2 : 0;
        for (int32_t m = 0; m < dsarl_group_size(g); m++) {
            float v = input(salt, dsarl_group_world_rank(g, m), i);
            want = op == DSARL_REDUCE_MAX ? fmax(want, v) : op == DSARL_REDUCE_MIN ? fmin(want, v) : want + v;
        }
        if (op == DSARL_REDUCE_AVG)
            want /= dsarl_group_size(g);
        ck_assert_msg(fabs(x[i] - want) <= 1e-6 * (1 + fabs(want)), "%s op %d [%lld]: %g, want %g",
                      dsarl_group_name(g), (int)op, (long long)i, x[i], want);
    }
    free(x);
}

START_TEST(test_groups_of_the_layout)
{
    // every group's members agree with the layout arithmetic, and its rank is this process's coordinate
    ck_assert_int_eq(dsarl_group_size(par.world), par.world_size);
    ck_assert_int_eq(dsarl_group_rank(par.world), par.world_rank);
    ck_assert_int_eq(dsarl_group_size(par.tp), par.tp_size);
    ck_assert_int_eq(dsarl_group_rank(par.tp), par.tp_rank);
    ck_assert_int_eq(dsarl_group_size(par.dp), par.dp_size);
    ck_assert_int_eq(dsarl_group_rank(par.dp), par.dp_rank);
    ck_assert_int_eq(dsarl_group_size(par.ep), par.ep_size);
    ck_assert_int_eq(dsarl_group_rank(par.ep), par.ep_rank);
    ck_assert_int_eq(dsarl_group_size(par.edp), par.edp_size);
    ck_assert_int_eq(dsarl_group_size(par.dp_cp), par.dp_size * par.cp_size);
    // an all-gather of world ranks over each group lists exactly its members
    const dsarl_group *groups[] = {par.world, par.tp, par.pp, par.cp, par.dp, par.dp_cp, par.ep, par.edp,
                                   par.tp_dp_cp};
    for (size_t k = 0; k < sizeof groups / sizeof groups[0]; k++) {
        const dsarl_group *g = groups[k];
        int32_t me = par.world_rank, got[16];
        OK(dsarl_group_all_gather_host(g, got, &me, 1, DSARL_DTYPE_I32, &err));
        for (int32_t m = 0; m < dsarl_group_size(g); m++)
            ck_assert_int_eq(got[m], dsarl_group_world_rank(g, m));
    }
}
END_TEST

START_TEST(test_all_reduce)
{
    const dsarl_group *groups[] = {par.world, par.tp, par.dp, par.ep, par.edp};
    int salt = 1;
    for (size_t k = 0; k < sizeof groups / sizeof groups[0]; k++)
        for (int op = 0; op < 4; op++) {
            check_reduce(groups[k], (dsarl_reduce_op)op, false, salt++);
            check_reduce(groups[k], (dsarl_reduce_op)op, true, salt++);
        }
    // integer and double reductions (token counts, loss sums)
    int64_t counts[3] = {par.world_rank + 1, 10 * par.world_rank, -7};
    OK(dsarl_group_all_reduce_host(par.world, counts, 3, DSARL_DTYPE_I64, DSARL_REDUCE_SUM, &err));
    int64_t n = par.world_size;
    ck_assert_int_eq(counts[0], n * (n + 1) / 2);
    ck_assert_int_eq(counts[1], 10 * n * (n - 1) / 2);
    ck_assert_int_eq(counts[2], -7 * n);
    double d = 0.1 * (par.world_rank + 1);
    OK(dsarl_group_all_reduce_host(par.world, &d, 1, DSARL_DTYPE_F64, DSARL_REDUCE_MAX, &err));
    ck_assert_double_eq_tol(d, 0.1 * n, 1e-15);
    // a bfloat16 reduction on the host is refused in one sentence (the CPU device stores float32)
    uint16_t h[2] = {0, 0};
    ck_assert_int_ne(dsarl_group_all_reduce_host(par.world, h, 2, DSARL_DTYPE_BF16, DSARL_REDUCE_SUM, &err),
                     DSARL_OK);
    ck_assert_ptr_nonnull(strstr(err.message, "reductions take"));
}
END_TEST

START_TEST(test_gather_and_scatter)
{
    for (int device = 0; device < 2; device++) {
        const dsarl_group *g = par.world;
        int32_t size = dsarl_group_size(g), rank = dsarl_group_rank(g);
        int64_t n = 333;
        float *in = malloc((size_t)(size * n) * sizeof(float)), *out = malloc((size_t)(size * n) * sizeof(float));
        // all-gather: block m of out = member m's input
        fill(in, n, 50 + device, par.world_rank);
        if (device)
            OK(dsarl_device_all_gather(&dsarl_cpu_device_ops, dev, g, out, in, n, DSARL_DTYPE_F32, &err));
        else
            OK(dsarl_group_all_gather_host(g, out, in, n, DSARL_DTYPE_F32, &err));
        for (int32_t m = 0; m < size; m++)
            for (int64_t i = 0; i < n; i++)
                ck_assert_float_eq(out[m * n + i], input(50 + device, dsarl_group_world_rank(g, m), i));
        // reduce-scatter: out = sum over members of block `rank` of their input
        fill(in, size * n, 60 + device, par.world_rank);
        if (device)
            OK(dsarl_device_reduce_scatter(&dsarl_cpu_device_ops, dev, g, out, in, n, DSARL_DTYPE_F32,
                                           DSARL_REDUCE_SUM, &err));
        else
            OK(dsarl_group_reduce_scatter_host(g, out, in, n, DSARL_DTYPE_F32, DSARL_REDUCE_SUM, &err));
        for (int64_t i = 0; i < n; i++) {
            double want = 0;
            for (int32_t m = 0; m < size; m++)
                want += input(60 + device, dsarl_group_world_rank(g, m), rank * n + i);
            ck_assert_msg(fabs(out[i] - want) < 1e-5, "reduce_scatter [%lld] %g want %g", (long long)i, out[i], want);
        }
        free(in);
        free(out);
    }
}
END_TEST

// how many values world rank `from` sends world rank `to` in the all-to-all test (zero for some pairs)
static int64_t pair_count(int from, int to) { return (int64_t)((from * 7 + to * 3) % 5) * 11; }

START_TEST(test_all_to_all_per_peer_counts)
{
    for (int device = 0; device < 2; device++) {
        const dsarl_group *g = par.world;
        int32_t size = dsarl_group_size(g);
        int64_t send[16], recv[16], s_total = 0, r_total = 0;
        for (int32_t p = 0; p < size; p++) {
            send[p] = pair_count(par.world_rank, p), recv[p] = pair_count(p, par.world_rank);
            s_total += send[p], r_total += recv[p];
        }
        float *in = malloc((size_t)(s_total + 1) * sizeof(float)), *out = malloc((size_t)(r_total + 1) * sizeof(float));
        // value i of the block for peer p encodes (sender, receiver, i)
        int64_t at = 0;
        for (int32_t p = 0; p < size; p++)
            for (int64_t i = 0; i < send[p]; i++)
                in[at++] = input(70 + device, par.world_rank * 64 + p, i);
        if (device)
            OK(dsarl_device_all_to_all(&dsarl_cpu_device_ops, dev, g, out, recv, in, send, DSARL_DTYPE_F32, &err));
        else
            OK(dsarl_group_all_to_all_host(g, out, recv, in, send, DSARL_DTYPE_F32, &err));
        at = 0;
        for (int32_t p = 0; p < size; p++)
            for (int64_t i = 0; i < recv[p]; i++)
                ck_assert_float_eq(out[at++], input(70 + device, p * 64 + par.world_rank, i));
        free(in);
        free(out);
    }
}
END_TEST

START_TEST(test_broadcast_and_point_to_point)
{
    const dsarl_group *g = par.world;
    int32_t size = dsarl_group_size(g), rank = dsarl_group_rank(g);
    float x[257];
    fill(x, 257, 80, par.world_rank);
    OK(dsarl_device_broadcast(&dsarl_cpu_device_ops, dev, g, x, 257, DSARL_DTYPE_F32, size - 1, &err));
    for (int i = 0; i < 257; i++)
        ck_assert_float_eq(x[i], input(80, dsarl_group_world_rank(g, size - 1), i));
    // a ring: even ranks send first, odd ranks receive first, so the blocking calls pair up
    float mine[100], theirs[100];
    fill(mine, 100, 90, rank);
    int32_t next = (rank + 1) % size, prev = (rank + size - 1) % size;
    if (rank % 2 == 0) {
        OK(dsarl_cpu_device_ops.send(dev, g, mine, 100, DSARL_DTYPE_F32, next, &err));
        OK(dsarl_cpu_device_ops.recv(dev, g, theirs, 100, DSARL_DTYPE_F32, prev, &err));
    } else {
        OK(dsarl_cpu_device_ops.recv(dev, g, theirs, 100, DSARL_DTYPE_F32, prev, &err));
        OK(dsarl_cpu_device_ops.send(dev, g, mine, 100, DSARL_DTYPE_F32, next, &err));
    }
    for (int i = 0; i < 100; i++)
        ck_assert_float_eq(theirs[i], input(90, prev, i));
    // a send to oneself is refused with the group and ranks named
    ck_assert_int_ne(dsarl_group_send_host(g, mine, 1, DSARL_DTYPE_F32, rank, &err), DSARL_OK);
    ck_assert_ptr_nonnull(strstr(err.message, "group world"));
    OK(dsarl_group_barrier(g, &err));
}
END_TEST

int main(void)
{
    dsarl_error_clear(&err);
    if (!dsarl_comm_launched()) {
        fprintf(stderr, "check_comm_mpi runs under mpirun (-np 2 or 4)\n");
        return 77;
    }
    if (dsarl_comm_init(&comm, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return EXIT_FAILURE;
    }
    // -np 4: TP2 x DP2 with EP4 (experts folded over TP and DP); -np 2: TP1 x DP2 with EP2
    int32_t world = dsarl_comm_world_size(comm);
    dsarl_layout l;
    int rc = dsarl_layout_make(world, world >= 4 ? 2 : 1, 1, 1, world, &l, &err);
    l.collective_timeout_s = 60; // a failed assertion on one rank leaves its peers waiting: end the run quickly
    if (rc < 0 || dsarl_comm_build(comm, &l, &par, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return EXIT_FAILURE;
    }
    dsarl_device_config dc = {.struct_size = sizeof dc, .parallel = &par, .threads = 1};
    if (dsarl_cpu_device_ops.create(&dc, &dev, &err) < 0 || !dsarl_device_has_collectives(&dsarl_cpu_device_ops)) {
        fprintf(stderr, "cpu device: %s\n", err.message);
        return EXIT_FAILURE;
    }
    Suite *s = suite_create("comm_mpi");
    TCase *tc = tcase_create("collectives");
    tcase_add_test(tc, test_groups_of_the_layout);
    tcase_add_test(tc, test_all_reduce);
    tcase_add_test(tc, test_gather_and_scatter);
    tcase_add_test(tc, test_all_to_all_per_peer_counts);
    tcase_add_test(tc, test_broadcast_and_point_to_point);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, par.world_rank == 0 ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    // every rank's verdict decides the exit: one failing rank fails the test
    int32_t any = failed;
    dsarl_group_all_reduce_host(par.world, &any, 1, DSARL_DTYPE_I32, DSARL_REDUCE_MAX, &err);
    dsarl_cpu_device_ops.destroy(dev);
    dsarl_comm_finalize(comm);
    return any ? EXIT_FAILURE : EXIT_SUCCESS;
}
