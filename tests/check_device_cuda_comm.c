/* check_device_cuda_comm.c: the CUDA device's collectives (NCCL) on fresh random data, bf16 and f32.
 *
 * Under mpirun (-np 1, or one rank per GPU) the group is the world of a data-parallel layout; started alone it is
 * the NULL group (one process, no MPI), which the device serves with a communicator of one. Each slot is called
 * directly (not through the dsarl_device_* helpers, which would skip a group of one), so a world of one still
 * runs NCCL. Inputs are a hash of (run seed, case, world rank, index), so every rank regenerates its peers' inputs
 * and computes the expected result itself; values are multiples of 1/64 below 2 in magnitude, exact in bf16, so a
 * group of one must match exactly and a larger one within bf16 rounding of the sums. The seed is fresh each run
 * (DSARL_TEST_SEED repeats one) and printed. Label gpu; exit status 77 (skipped) without a GPU, or with more ranks
 * on a host than GPUs (NCCL needs one GPU per rank). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm_internal.h"
#include "cuda_device.h"

static dsarl_comm *comm;        /* NULL when started without mpirun */
static dsarl_parallel par;
static const dsarl_group *g;    /* the world group, or NULL (a group of one) */
static dsarl_device *dev;
static uint64_t seed;
static dsarl_error err;

#define OK(call) ck_assert_msg((call) == DSARL_OK, "%s: %s", #call, err.message)

static const dsarl_dtype float_types[] = {DSARL_DTYPE_BF16, DSARL_DTYPE_F32};

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// value i of world rank r's input for case `salt`: k/64 with |k| <= 127 (exact in bf16, f16 and f32)
static float input(int salt, int r, int64_t i)
{
    uint64_t h = mix(seed ^ mix(((uint64_t)salt << 40) ^ ((uint64_t)r << 24) ^ (uint64_t)i));
    return (float)((int64_t)(h % 255) - 127) / 64.0f;
}

static int32_t size_of(void) { return dsarl_group_size(g); }
static int32_t rank_of(void) { return dsarl_group_rank(g); }
static int32_t world_of(int32_t m) { return dsarl_group_world_rank(g, m); }

// A device buffer of n float values in dtype (bf16 or f32), from host floats.
static void *up(const float *h, int64_t n, dsarl_dtype dt)
{
    void *d = NULL;
    OK(cuda_alloc(dev, (size_t)(n > 0 ? n : 1) * dsarl_dtype_size(dt), &d, &err));
    if (n > 0)
        OK(cuda_upload_f32(dev, d, dt, h, (size_t)n, &err));
    return d;
}

static float *down(const void *d, int64_t n, dsarl_dtype dt)
{
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (n > 0)
        OK(cuda_download_f32(dev, h, d, dt, (size_t)n, &err));
    return h;
}

static float *inputs(int salt, int r, int64_t n)
{
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = input(salt, r, i);
    return x;
}

// The tolerance of a reduction over the group: exact for one member (NCCL's size-1 reduction is a copy), bf16 or
// f32 rounding of the partial sums otherwise.
static double tol(dsarl_dtype dt, double want)
{
    if (size_of() == 1)
        return 0.0;
    return (dt == DSARL_DTYPE_BF16 ? 8e-3 * size_of() : 1e-6) * (1.0 + fabs(want));
}

static double rounded(dsarl_dtype dt, double v)
{
    return dt == DSARL_DTYPE_BF16 ? (double)dsarl_bf16_to_f32(dsarl_f32_to_bf16((float)v)) : (double)(float)v;
}

START_TEST(test_all_reduce_every_op)
{
    int salt = 1;
    for (size_t t = 0; t < 2; t++)
        for (int op = 0; op < 4; op++, salt++) {
            dsarl_dtype dt = float_types[t];
            int64_t n = 1000 + 37 * salt;
            float *x = inputs(salt, par.world_rank, n);
            void *d = up(x, n, dt);
            OK(cuda_all_reduce(dev, g, d, n, dt, (dsarl_reduce_op)op, &err));
            float *got = down(d, n, dt);
            for (int64_t i = 0; i < n; i++) {
                double want = op == DSARL_REDUCE_MAX ? -4 : op == DSARL_REDUCE_MIN ? 4 : 0;
                for (int32_t m = 0; m < size_of(); m++) {
                    double v = input(salt, world_of(m), i);
                    want = op == DSARL_REDUCE_MAX ? fmax(want, v) : op == DSARL_REDUCE_MIN ? fmin(want, v) : want + v;
                }
                if (op == DSARL_REDUCE_AVG)
                    want /= size_of();
                want = rounded(dt, want);
                ck_assert_msg(fabs(got[i] - want) <= tol(dt, want), "%s op %d [%lld]: %g, want %g",
                              dsarl_dtype_name(dt), op, (long long)i, got[i], want);
            }
            cuda_free(dev, d);
            free(x), free(got);
        }
}
END_TEST

// Every other dtype the slots take, through the raw bytes (counts, token ids, flags, fp16/fp64 statistics).
START_TEST(test_all_reduce_other_dtypes)
{
    int32_t n = 301, size = size_of();
    int64_t *i64 = malloc(n * sizeof(int64_t));
    int32_t *i32 = malloc(n * sizeof(int32_t));
    double *f64 = malloc(n * sizeof(double));
    uint8_t *u8 = malloc(n);
    int8_t *i8 = malloc(n);
    uint16_t *f16 = malloc(n * sizeof(uint16_t));
    for (int32_t i = 0; i < n; i++) {
        int64_t k = (int64_t)(input(40, par.world_rank, i) * 64);
        i64[i] = k * 1000000007ll, i32[i] = (int32_t)k, f64[i] = k / 3.0, u8[i] = (uint8_t)(k + 127);
        i8[i] = (int8_t)(k / 2);
        f16[i] = 0; // filled below: fp16 of k/64
        float v = (float)k / 64.0f;
        // fp16 bits of v (|v| < 2, a multiple of 1/64: normal or zero, exact with a 10-bit mantissa)
        if (v != 0.0f) {
            int e = 0;
            float m = frexpf(fabsf(v), &e); // v = m * 2^e, m in [0.5, 1)
            uint16_t mant = (uint16_t)((m * 2.0f - 1.0f) * 1024.0f + 0.5f);
            f16[i] = (uint16_t)((v < 0 ? 0x8000u : 0u) | (uint16_t)((e - 1 + 15) << 10) | mant);
        }
    }
    struct { void *h; dsarl_dtype dt; dsarl_reduce_op op; } cases[] = {
        {i64, DSARL_DTYPE_I64, DSARL_REDUCE_SUM}, {i32, DSARL_DTYPE_I32, DSARL_REDUCE_MIN},
        {f64, DSARL_DTYPE_F64, DSARL_REDUCE_SUM}, {u8, DSARL_DTYPE_U8, DSARL_REDUCE_MAX},
        {i8, DSARL_DTYPE_I8, DSARL_REDUCE_MIN}, {f16, DSARL_DTYPE_F16, DSARL_REDUCE_SUM},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t bytes = (size_t)n * dsarl_dtype_size(cases[c].dt);
        void *d = NULL, *back = malloc(bytes);
        OK(cuda_alloc(dev, bytes, &d, &err));
        OK(cuda_copy(dev, d, cases[c].h, bytes, DSARL_COPY_HOST_TO_DEVICE, &err));
        OK(cuda_all_reduce(dev, g, d, n, cases[c].dt, cases[c].op, &err));
        OK(cuda_copy(dev, back, d, bytes, DSARL_COPY_DEVICE_TO_HOST, &err));
        for (int32_t i = 0; i < n; i++) {
            // the expected value from every member's k (peers regenerated)
            double want = cases[c].op == DSARL_REDUCE_SUM ? 0 : cases[c].op == DSARL_REDUCE_MAX ? -1e300 : 1e300;
            for (int32_t m = 0; m < size; m++) {
                int64_t k = (int64_t)(input(40, world_of(m), i) * 64);
                double v = cases[c].dt == DSARL_DTYPE_I64   ? (double)k * 1000000007.0
                           : cases[c].dt == DSARL_DTYPE_F64 ? k / 3.0
                           : cases[c].dt == DSARL_DTYPE_U8  ? (double)(k + 127)
                           : cases[c].dt == DSARL_DTYPE_I8  ? (double)(k / 2)
                           : cases[c].dt == DSARL_DTYPE_F16 ? k / 64.0
                                                            : (double)k;
                want = cases[c].op == DSARL_REDUCE_SUM ? want + v : cases[c].op == DSARL_REDUCE_MAX ? fmax(want, v)
                                                                                                    : fmin(want, v);
            }
            double got = 0;
            switch (cases[c].dt) {
            case DSARL_DTYPE_I64: got = (double)((int64_t *)back)[i]; break;
            case DSARL_DTYPE_I32: got = ((int32_t *)back)[i]; break;
            case DSARL_DTYPE_F64: got = ((double *)back)[i]; break;
            case DSARL_DTYPE_U8: got = ((uint8_t *)back)[i]; break;
            case DSARL_DTYPE_I8: got = ((int8_t *)back)[i]; break;
            default: { // fp16 bits back to a double
                uint16_t b = ((uint16_t *)back)[i];
                int e = (b >> 10) & 31;
                got = (b & 0x7fff) == 0 ? 0.0 : ldexp(1.0 + (b & 1023) / 1024.0, e - 15) * ((b & 0x8000) ? -1 : 1);
            }
            }
            double t = cases[c].dt == DSARL_DTYPE_F64 ? 1e-12 * (1 + fabs(want))
                       : cases[c].dt == DSARL_DTYPE_F16 && size > 1 ? 1e-3 * size * (1 + fabs(want)) : 0.0;
            ck_assert_msg(fabs(got - want) <= t, "%s [%d]: %.17g, want %.17g", dsarl_dtype_name(cases[c].dt), i, got,
                          want);
        }
        cuda_free(dev, d);
        free(back);
    }
    // an average of integers is refused in one sentence (it would truncate unlike the CPU device), as is a dtype
    // the slots do not know
    void *d = NULL;
    OK(cuda_alloc(dev, 64, &d, &err));
    ck_assert_int_eq(cuda_all_reduce(dev, g, d, 4, DSARL_DTYPE_I32, DSARL_REDUCE_AVG, &err), DSARL_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.message, "average needs a floating-point"));
    ck_assert_int_eq(cuda_all_reduce(dev, g, d, 4, DSARL_DTYPE_INVALID, DSARL_REDUCE_SUM, &err), DSARL_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.message, "collectives take"));
    cuda_free(dev, d);
    free(i64), free(i32), free(f64), free(u8), free(i8), free(f16);
}
END_TEST

START_TEST(test_all_gather_and_reduce_scatter)
{
    int32_t size = size_of(), rank = rank_of();
    for (size_t t = 0; t < 2; t++) {
        dsarl_dtype dt = float_types[t];
        size_t e = dsarl_dtype_size(dt);
        int64_t n = 333 + (int64_t)t;
        // all-gather: block m of out = member m's input
        float *x = inputs(50 + (int)t, par.world_rank, n);
        void *in = up(x, n, dt), *out = NULL;
        OK(cuda_alloc(dev, (size_t)(size * n) * e, &out, &err));
        OK(cuda_zero(dev, out, (size_t)(size * n) * e, &err));
        OK(cuda_all_gather(dev, g, out, in, n, dt, &err));
        float *got = down(out, size * n, dt);
        for (int32_t m = 0; m < size; m++)
            for (int64_t i = 0; i < n; i++)
                ck_assert_msg(got[m * n + i] == input(50 + (int)t, world_of(m), i), "all_gather %s block %d [%lld]",
                              dsarl_dtype_name(dt), m, (long long)i);
        free(got);
        // in place: this rank's block already sits at its offset of out
        OK(cuda_zero(dev, out, (size_t)(size * n) * e, &err));
        OK(cuda_copy(dev, (char *)out + (size_t)(rank * n) * e, in, (size_t)n * e, DSARL_COPY_DEVICE_TO_DEVICE, &err));
        OK(cuda_all_gather(dev, g, out, (char *)out + (size_t)(rank * n) * e, n, dt, &err));
        got = down(out, size * n, dt);
        for (int32_t m = 0; m < size; m++)
            for (int64_t i = 0; i < n; i++)
                ck_assert_msg(got[m * n + i] == input(50 + (int)t, world_of(m), i), "in-place all_gather %s [%lld]",
                              dsarl_dtype_name(dt), (long long)i);
        free(got), free(x);
        cuda_free(dev, in), cuda_free(dev, out);
        // reduce-scatter: out = the sum over members of block `rank` of their input
        x = inputs(60 + (int)t, par.world_rank, size * n);
        in = up(x, size * n, dt);
        OK(cuda_alloc(dev, (size_t)n * e, &out, &err));
        OK(cuda_reduce_scatter(dev, g, out, in, n, dt, DSARL_REDUCE_SUM, &err));
        got = down(out, n, dt);
        for (int64_t i = 0; i < n; i++) {
            double want = 0;
            for (int32_t m = 0; m < size; m++)
                want += input(60 + (int)t, world_of(m), rank * n + i);
            want = rounded(dt, want);
            ck_assert_msg(fabs(got[i] - want) <= tol(dt, want), "reduce_scatter %s [%lld]: %g, want %g",
                          dsarl_dtype_name(dt), (long long)i, got[i], want);
        }
        free(got), free(x);
        cuda_free(dev, in), cuda_free(dev, out);
    }
}
END_TEST

// how many values world rank `from` sends world rank `to` (zero for some pairs of different ranks, never to oneself,
// so a world of one moves its own block)
static int64_t pair_count(int from, int to) { return ((int64_t)((from * 7 + to * 3) % 5) + (from == to)) * 11; }

START_TEST(test_all_to_all_per_peer_counts)
{
    int32_t size = size_of(), me = par.world_rank;
    for (size_t t = 0; t < 2; t++) {
        dsarl_dtype dt = float_types[t];
        int64_t *send = calloc(2 * (size_t)size, sizeof(int64_t)), *recv = send + size, s_total = 0, r_total = 0;
        for (int32_t p = 0; p < size; p++) {
            send[p] = pair_count(me, world_of(p)), recv[p] = pair_count(world_of(p), me);
            s_total += send[p], r_total += recv[p];
        }
        // value i of the block for peer p encodes (sender, receiver, i)
        float *x = malloc((size_t)(s_total + 1) * sizeof(float));
        int64_t at = 0;
        for (int32_t p = 0; p < size; p++)
            for (int64_t i = 0; i < send[p]; i++)
                x[at++] = input(70 + (int)t, me * 64 + world_of(p), i);
        void *in = up(x, s_total, dt), *out = NULL;
        OK(cuda_alloc(dev, (size_t)(r_total + 1) * dsarl_dtype_size(dt), &out, &err));
        OK(cuda_all_to_all(dev, g, out, recv, in, send, dt, &err));
        float *got = down(out, r_total, dt);
        at = 0;
        for (int32_t p = 0; p < size; p++)
            for (int64_t i = 0; i < recv[p]; i++, at++)
                ck_assert_msg(got[at] == input(70 + (int)t, world_of(p) * 64 + me, i),
                              "all_to_all %s from %d [%lld]: %g", dsarl_dtype_name(dt), p, (long long)i, got[at]);
        // a rank that would send itself other than it receives from itself is refused, naming the counts
        send[rank_of()] += 1;
        ck_assert_int_eq(cuda_all_to_all(dev, g, out, recv, in, send, dt, &err), DSARL_E_INVALID);
        ck_assert_ptr_nonnull(strstr(err.message, "sends itself"));
        free(got), free(x), free(send);
        cuda_free(dev, in), cuda_free(dev, out);
    }
}
END_TEST

START_TEST(test_broadcast_and_point_to_point)
{
    int32_t size = size_of(), rank = rank_of();
    for (size_t t = 0; t < 2; t++) {
        dsarl_dtype dt = float_types[t];
        float *x = inputs(80 + (int)t, par.world_rank, 257);
        void *d = up(x, 257, dt);
        OK(cuda_broadcast(dev, g, d, 257, dt, size - 1, &err));
        float *got = down(d, 257, dt);
        for (int i = 0; i < 257; i++)
            ck_assert_msg(got[i] == input(80 + (int)t, world_of(size - 1), i), "broadcast %s [%d]",
                          dsarl_dtype_name(dt), i);
        ck_assert_int_eq(cuda_broadcast(dev, g, d, 257, dt, size, &err), DSARL_E_INVALID);
        ck_assert_ptr_nonnull(strstr(err.message, "root"));
        free(got), free(x);
        if (size > 1) {
            // a ring: even ranks send first, odd ranks receive first, so the pairs match in order on each stream
            float *mine = inputs(90 + (int)t, par.world_rank, 100);
            void *dm = up(mine, 100, dt), *dr = NULL;
            OK(cuda_alloc(dev, 100 * dsarl_dtype_size(dt), &dr, &err));
            int32_t next = (rank + 1) % size, prev = (rank + size - 1) % size;
            if (rank % 2 == 0) {
                OK(cuda_send(dev, g, dm, 100, dt, next, &err));
                OK(cuda_recv(dev, g, dr, 100, dt, prev, &err));
            } else {
                OK(cuda_recv(dev, g, dr, 100, dt, prev, &err));
                OK(cuda_send(dev, g, dm, 100, dt, next, &err));
            }
            float *theirs = down(dr, 100, dt);
            for (int i = 0; i < 100; i++)
                ck_assert_msg(theirs[i] == input(90 + (int)t, world_of(prev), i), "recv %s [%d]",
                              dsarl_dtype_name(dt), i);
            free(mine), free(theirs);
            cuda_free(dev, dm), cuda_free(dev, dr);
        }
        // a send to oneself or past the group is refused with the group and ranks named
        ck_assert_int_eq(cuda_send(dev, g, d, 1, dt, rank, &err), DSARL_E_INVALID);
        ck_assert_ptr_nonnull(strstr(err.message, dsarl_group_name(g)));
        ck_assert_int_eq(cuda_recv(dev, g, d, 1, dt, size, &err), DSARL_E_INVALID);
        cuda_free(dev, d);
    }
}
END_TEST

// A collective is queued on the compute stream between the kernels around it, with no host wait: x doubled by a
// kernel, summed over the group, then quartered must equal the quartered sum of the doubled inputs.
START_TEST(test_ordered_with_the_kernels)
{
    dsarl_dtype dt = cuda_storage_dtype(dev);
    int64_t n = (int64_t)1 << 20; // large enough that an unordered collective would overlap the kernels
    float *x = inputs(100, par.world_rank, n);
    void *d = up(x, n, dt);
    OK(cuda_scale(dev, d, 2.0f, n, &err));
    OK(cuda_all_reduce(dev, g, d, n, dt, DSARL_REDUCE_SUM, &err));
    OK(cuda_scale(dev, d, 0.25f, n, &err));
    OK(cuda_synchronize(dev, &err));
    float *got = down(d, n, dt);
    for (int64_t i = 0; i < n; i++) {
        double want = 0;
        for (int32_t m = 0; m < size_of(); m++)
            want += 2.0 * input(100, world_of(m), i);
        want = rounded(dt, rounded(dt, want) * 0.25);
        ck_assert_msg(fabs(got[i] - want) <= tol(dt, want), "[%lld]: %g, want %g", (long long)i, got[i], want);
    }
    free(x), free(got);
    cuda_free(dev, d);
}
END_TEST

// One communicator per group, made at its first collective and reused; the wait after NCCL work clears the mark
// the watchdog bracket keys on.
START_TEST(test_one_communicator_per_group)
{
    void *d = NULL;
    OK(cuda_alloc(dev, 4096, &d, &err));
    OK(cuda_zero(dev, d, 4096, &err));
    OK(cuda_all_reduce(dev, g, d, 1024, DSARL_DTYPE_F32, DSARL_REDUCE_SUM, &err));
    size_t before = dev->n_nccl;
    ck_assert_uint_ge(before, 1); // the group's, made by its first collective (here or in an earlier case)
    for (int i = 0; i < 5; i++)
        OK(cuda_all_reduce(dev, g, d, 1024, DSARL_DTYPE_F32, DSARL_REDUCE_SUM, &err));
    ck_assert_uint_eq(dev->n_nccl, before);
    ck_assert_ptr_nonnull(dev->nccl_inflight_what);
    OK(cuda_synchronize(dev, &err));
    ck_assert_ptr_null(dev->nccl_inflight_what);
    if (comm) { // another group of the layout (tp: this rank alone) gets its own communicator
        OK(cuda_all_reduce(dev, par.tp, d, 1024, DSARL_DTYPE_F32, DSARL_REDUCE_SUM, &err));
        OK(cuda_synchronize(dev, &err));
        ck_assert_uint_eq(dev->n_nccl, before + 1);
    }
    cuda_free(dev, d);
}
END_TEST

int main(void)
{
    dsarl_error_clear(&err);
    int gpus = cuda_visible_devices();
    if (gpus == 0) {
        printf("check_device_cuda_comm: skipped: no CUDA device is visible\n");
        return 77;
    }
    if (dsarl_comm_launched()) {
        if (dsarl_comm_init(&comm, &err) < 0) {
            fprintf(stderr, "%s\n", err.message);
            return EXIT_FAILURE;
        }
        dsarl_layout l;
        int rc = dsarl_layout_make(dsarl_comm_world_size(comm), 1, 1, 1, 1, &l, &err);
        l.collective_timeout_s = 120; // a failed assertion on one rank leaves its peers waiting: end the run
        if (rc < 0 || dsarl_comm_build(comm, &l, &par, &err) < 0) {
            fprintf(stderr, "%s\n", err.message);
            return EXIT_FAILURE;
        }
        g = par.world;
        if (par.local_size > gpus) { // the same on every rank of a host, so they all skip
            printf("check_device_cuda_comm: skipped: %d ranks on this host, %d GPU%s (NCCL: one GPU per rank)\n",
                   par.local_size, gpus, gpus == 1 ? "" : "s");
            dsarl_comm_finalize(comm);
            return 77;
        }
    } else {
        dsarl_parallel single = DSARL_PARALLEL_SINGLE;
        par = single;
        g = NULL;
    }
    // a fresh seed each run unless DSARL_TEST_SEED names one; rank 0's, so every rank draws the same inputs
    const char *env = getenv("DSARL_TEST_SEED");
    seed = env ? strtoull(env, NULL, 0) : mix((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32));
    if (g && dsarl_group_broadcast_host(g, &seed, 8, DSARL_DTYPE_U8, 0, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return EXIT_FAILURE;
    }
    if (par.world_rank == 0)
        printf("check_device_cuda_comm: group %s of %d, DSARL_TEST_SEED=%llu\n", dsarl_group_name(g), size_of(),
               (unsigned long long)seed);
    dsarl_device_config dc = {.struct_size = sizeof dc, .parallel = &par, .threads = 1};
    if (cuda_create(&dc, &dev, &err) < 0 || !dsarl_device_has_collectives(&dsarl_cuda_device_ops)) {
        fprintf(stderr, "cuda device: %s\n", err.message);
        return EXIT_FAILURE;
    }
    Suite *s = suite_create("device_cuda_comm");
    TCase *tc = tcase_create("nccl");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_all_reduce_every_op);
    tcase_add_test(tc, test_all_reduce_other_dtypes);
    tcase_add_test(tc, test_all_gather_and_reduce_scatter);
    tcase_add_test(tc, test_all_to_all_per_peer_counts);
    tcase_add_test(tc, test_broadcast_and_point_to_point);
    tcase_add_test(tc, test_ordered_with_the_kernels);
    tcase_add_test(tc, test_one_communicator_per_group);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, par.world_rank == 0 ? CK_NORMAL : CK_SILENT);
    int32_t failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    // every rank's verdict decides the exit: one failing rank fails the test
    if (g)
        dsarl_group_all_reduce_host(g, &failed, 1, DSARL_DTYPE_I32, DSARL_REDUCE_MAX, &err);
    cuda_destroy(dev);
    dsarl_comm_finalize(comm);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
