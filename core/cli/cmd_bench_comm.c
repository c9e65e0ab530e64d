/* cmd_bench_comm.c: `dsarl bench comm`: the device's collectives over the world group at the sizes a GLM-5 step
 * moves, each as algorithm and bus bandwidth beside the ceiling of the link they run over.
 *
 * Launched as `mpirun -np N dsarl bench comm`: the world is one data-parallel group of N ranks (the bench needs no
 * recipe), so the world group is every rank. Each case calls the device's collective slot itself, not the
 * dsarl_device_* helper, so a world of one still goes through the device (NCCL's size-1 collectives are local
 * copies; the CPU device's are no-ops). A case runs once untimed (the CUDA device makes its NCCL communicator
 * there), then the ranks meet at a barrier and run it `iters` times back to back; its time is the slowest rank's
 * mean (the collective is done when the last rank is), from CUDA events on the device's stream or the wall clock
 * around a synchronize.
 *
 * Bandwidths follow nccl-tests (doc/PERFORMANCE.md there): size S is the all-reduce and broadcast buffer, the
 * gathered output of an all-gather, the input of a reduce-scatter and the send buffer of an all-to-all (the ranks'
 * mean, as the routed counts differ); algbw = S / t; busbw = algbw * 2(n-1)/n (all-reduce), * (n-1)/n (all-gather,
 * reduce-scatter, all-to-all), * 1 (broadcast): the bytes each rank's link carries, comparable to its peak. In a
 * world of one the copying collectives still report their algbw (a local copy's rate); the in-place ones
 * (all_reduce, broadcast) move nothing and report 0. */
#include <dlfcn.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "cmd_bench.h"
#include "comm_internal.h"
#include "dsarl/trainer.h"
#include "layout.h"
#include "recipe_internal.h"

#define COMM_MAX_SIZES 16

typedef enum comm_op { OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_TO_ALL, OP_BROADCAST } comm_op;

static const char *const op_names[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"};

/* One timed collective. count: the nccl-tests size in values (see the file comment); for all_to_all, the routed
 * (token, expert) rows of width values each that this rank sends, spread over the ranks by the experts they hold. */
typedef struct comm_case {
    comm_op op;
    char what[64];
    dsarl_dtype dtype;
    int64_t count;
    int64_t tokens, width; /* all_to_all: tokens routed to top_k of n_experts, rows of width values */
    int32_t top_k, n_experts;
} comm_case;

typedef struct comm_opts {
    const char *device;
    const char *sizes; /* model, small, or a list of byte sizes */
    int32_t iters;
} comm_opts;

/* What one case runs on: the buffers, and the per-peer counts of an all_to_all. */
typedef struct comm_run {
    bench *b;
    const dsarl_group *world;
    const comm_case *c;
    void *in, *out;
    int64_t *send_counts, *recv_counts; /* (n) */
} comm_run;

static void print_help(void)
{
    printf("usage: [mpirun -np N] dsarl bench comm [--device NAME] [--sizes model|small|BYTES[,BYTES...]]\n"
           "                                   [--iters 20] [--set runtime.KEY=VALUE ...]\n"
           "\n"
           "Times the device's collectives over the world group (every rank of the mpirun job): all_reduce,\n"
           "all_gather, reduce_scatter, all_to_all and broadcast, and prints each one's algorithm and bus bandwidth\n"
           "(nccl-tests' definitions: busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather,\n"
           "reduce_scatter and all_to_all, x 1 for broadcast) beside the ceiling of the link: the host memcpy\n"
           "bandwidth measured in this run on the cpu device, the NVLink peak on several GPUs.\n"
           "\n"
           "--sizes model (default): GLM-5's collectives: the TP activation (4096 tokens x 6144 hidden, storage\n"
           "  dtype) all-reduced, all-gathered and reduce-scattered (sequence parallel), a gradient bucket of 4e7\n"
           "  float32 values all-reduced and reduce-scattered, a 4e7-value parameter bucket all-gathered and\n"
           "  broadcast, and the MoE dispatch all_to_all of 4096 tokens routed to 8 of 256 experts (6144 wide).\n"
           "--sizes small: the same cases at 64 tokens and 65536-value buckets (a quick check).\n"
           "--sizes 1M,64M,...: every collective at each size (bytes; K, M, G suffixes) in the storage dtype, the\n"
           "  all_to_all split evenly.\n"
           "Without mpirun it runs as a world of one (NCCL's size-1 collectives are local copies; bus bandwidth is 0\n"
           "by definition). The default device is the highest-ranked one that runs here. One `json:` line per case.\n");
}

static int usage(const char *what)
{
    fprintf(stderr, "dsarl bench comm: error: %s; see `dsarl bench comm --help`\n", what);
    return CLI_EXIT_USAGE;
}

// Bytes with an optional K/M/G (powers of 1024) suffix; 0 when the text is not one.
static int64_t parse_bytes(const char *s)
{
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || !(v > 0))
        return 0;
    double unit = 1;
    if (*end == 'K' || *end == 'k')
        unit = 1024, end++;
    else if (*end == 'M' || *end == 'm')
        unit = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        unit = 1024.0 * 1024 * 1024, end++;
    if (*end == 'B' || *end == 'b')
        end++;
    double bytes = v * unit;
    return *end || bytes > 64.0 * 1024 * 1024 * 1024 ? 0 : (int64_t)bytes;
}

static void add_case(comm_case *cases, int *n, comm_op op, const char *what, dsarl_dtype dtype, int64_t count)
{
    comm_case *c = &cases[(*n)++];
    memset(c, 0, sizeof *c);
    c->op = op, c->dtype = dtype, c->count = count;
    snprintf(c->what, sizeof c->what, "%s", what);
}

static void add_dispatch(comm_case *cases, int *n, dsarl_dtype dtype, int64_t tokens, int64_t width)
{
    comm_case *c = &cases[(*n)++];
    memset(c, 0, sizeof *c);
    c->op = OP_ALL_TO_ALL, c->dtype = dtype, c->tokens = tokens, c->width = width, c->top_k = 8,
    c->n_experts = 256;
    snprintf(c->what, sizeof c->what, "MoE dispatch %" PRId64 " tok top-8/256 x %" PRId64, tokens, width);
}

// The cases of --sizes: GLM-5's (model, small) or a sweep of byte sizes. Returns how many, or -1 (bad --sizes).
static int make_cases(const char *sizes, dsarl_dtype storage, comm_case *cases, int cap)
{
    int n = 0;
    bool model = !strcmp(sizes, "model"), small = !strcmp(sizes, "small");
    if (model || small) {
        int64_t T = model ? 4096 : 64, hidden = 6144, bucket = model ? 40000000 : 65536;
        char act[64], sp[64], grad[64], param[64], count[24];
        if (bucket >= 1000000)
            snprintf(count, sizeof count, "%gM", (double)bucket / 1e6);
        else
            snprintf(count, sizeof count, "%" PRId64, bucket);
        snprintf(act, sizeof act, "TP activation %" PRId64 " x %" PRId64, T, hidden);
        snprintf(sp, sizeof sp, "SP activation %" PRId64 " x %" PRId64, T, hidden);
        snprintf(grad, sizeof grad, "gradient bucket %s values", count);
        snprintf(param, sizeof param, "parameter bucket %s values", count);
        add_case(cases, &n, OP_ALL_REDUCE, act, storage, T * hidden);
        add_case(cases, &n, OP_ALL_REDUCE, grad, DSARL_DTYPE_F32, bucket);
        add_case(cases, &n, OP_ALL_GATHER, sp, storage, T * hidden);           // sequence parallel: gather T
        add_case(cases, &n, OP_ALL_GATHER, param, storage, bucket);            // distributed optimizer
        add_case(cases, &n, OP_REDUCE_SCATTER, sp, storage, T * hidden);       // sequence parallel: scatter T
        add_case(cases, &n, OP_REDUCE_SCATTER, grad, DSARL_DTYPE_F32, bucket); // distributed optimizer
        add_dispatch(cases, &n, storage, T, hidden);
        add_case(cases, &n, OP_BROADCAST, param, storage, bucket); // weights from rank 0
        return n;
    }
    char *copy = strdup(sizes);
    if (!copy)
        return -1;
    for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int64_t bytes = parse_bytes(tok);
        if (bytes <= 0 || n + 5 > cap) {
            free(copy);
            return -1;
        }
        int64_t values = bytes / (int64_t)dsarl_dtype_size(storage);
        char what[64];
        snprintf(what, sizeof what, "sweep %s", tok);
        for (int op = OP_ALL_REDUCE; op <= OP_BROADCAST; op++) {
            add_case(cases, &n, (comm_op)op, what, storage, values > 0 ? values : 1);
            if (op == OP_ALL_TO_ALL)
                cases[n - 1].width = 1; // even split of count values (no routing)
        }
    }
    free(copy);
    return n;
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

// This rank's send counts of an all_to_all case (values per peer) and, exchanged with the peers, its receive counts.
// Routed dispatch: each token picks top_k distinct experts (a fixed stream per world rank), experts lie in
// contiguous blocks over the ranks, and every (token, expert) row goes to the expert's rank.
static int a2a_counts(comm_run *r, int32_t n, int32_t rank)
{
    const comm_case *c = r->c;
    memset(r->send_counts, 0, (size_t)n * sizeof(int64_t));
    if (c->top_k == 0) { // a sweep: count values split evenly (the remainder to the first peers)
        for (int32_t p = 0; p < n; p++)
            r->send_counts[p] = c->count / n + (p < c->count % n);
    } else {
        uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(rank + 1);
        for (int64_t t = 0; t < c->tokens; t++) {
            int32_t chosen[64];
            for (int32_t k = 0; k < c->top_k; k++) {
                int32_t e = 0;
                bool again = true;
                while (again) { // distinct experts per token
                    e = (int32_t)(lcg(&s) % (uint64_t)c->n_experts);
                    again = false;
                    for (int32_t j = 0; j < k; j++)
                        again |= chosen[j] == e;
                }
                chosen[k] = e;
                r->send_counts[(int64_t)e * n / c->n_experts] += c->width;
            }
        }
    }
    int64_t *ones = malloc((size_t)n * sizeof(int64_t)); // one count to and from each peer
    if (!ones)
        return DSARL_FAIL(&r->b->err, DSARL_E_NOMEM, "dsarl bench comm: out of host memory");
    for (int32_t p = 0; p < n; p++)
        ones[p] = 1;
    int rc = dsarl_group_all_to_all_host(r->world, r->recv_counts, ones, r->send_counts, ones, DSARL_DTYPE_I64,
                                         &r->b->err);
    free(ones);
    return rc;
}

static int run_case(bench *b, void *p)
{
    comm_run *r = p;
    const comm_case *c = r->c;
    int32_t n = dsarl_group_size(r->world);
    switch (c->op) {
    case OP_ALL_REDUCE:
        return b->d->all_reduce(b->dev, r->world, r->in, c->count, c->dtype, DSARL_REDUCE_SUM, &b->err);
    case OP_ALL_GATHER:
        return b->d->all_gather(b->dev, r->world, r->out, r->in, c->count / n, c->dtype, &b->err);
    case OP_REDUCE_SCATTER:
        return b->d->reduce_scatter(b->dev, r->world, r->out, r->in, c->count / n, c->dtype, DSARL_REDUCE_SUM,
                                    &b->err);
    case OP_ALL_TO_ALL:
        return b->d->all_to_all(b->dev, r->world, r->out, r->recv_counts, r->in, r->send_counts, c->dtype, &b->err);
    case OP_BROADCAST:
        return b->d->broadcast(b->dev, r->world, r->in, c->count, c->dtype, 0, &b->err);
    }
    return DSARL_FAIL(&b->err, DSARL_E_INTERNAL, "dsarl bench comm: unknown collective %d", (int)c->op);
}

// Mean milliseconds of the case over iters back-to-back runs, the slowest rank's (see the file comment).
static int time_case(comm_run *r, int iters, double *ms)
{
    bench *b = r->b;
    DSARL_TRY(run_case(b, r)); // warm-up: communicator set-up, first-touch of the buffers
    DSARL_TRY(b->d->synchronize(b->dev, &b->err));
    void *e0 = NULL, *e1 = NULL, *stream = b->d->stream ? b->d->stream(b->dev) : NULL;
    bool events = b->ev.create && b->ev.create(&e0, 0) == 0 && b->ev.create(&e1, 0) == 0;
    DSARL_TRY(dsarl_group_barrier(r->world, &b->err));
    double t0 = now_ms();
    if (events)
        b->ev.record(e0, stream);
    int rc = DSARL_OK;
    for (int i = 0; i < iters && rc == DSARL_OK; i++)
        rc = run_case(b, r);
    if (events)
        b->ev.record(e1, stream);
    if (rc == DSARL_OK)
        rc = b->d->synchronize(b->dev, &b->err);
    double total = now_ms() - t0;
    float ev_ms = 0.0f;
    if (events && b->ev.sync(e1) == 0 && b->ev.elapsed(&ev_ms, e0, e1) == 0)
        total = ev_ms;
    if (e0)
        b->ev.destroy(e0);
    if (e1)
        b->ev.destroy(e1);
    DSARL_TRY(rc);
    double mean = total / iters;
    DSARL_TRY(dsarl_group_all_reduce_host(r->world, &mean, 1, DSARL_DTYPE_F64, DSARL_REDUCE_MAX, &b->err));
    *ms = mean;
    return DSARL_OK;
}

// The busbw factor of nccl-tests for op over n ranks.
static double bus_factor(comm_op op, int32_t n)
{
    switch (op) {
    case OP_ALL_REDUCE: return 2.0 * (n - 1) / n;
    case OP_BROADCAST: return 1.0;
    default: return (double)(n - 1) / n;
    }
}

// Host memcpy bandwidth (bytes copied per second, the best of a few 256 MiB copies, every rank copying at once as
// in the collectives): the CPU device's ceiling, since its collectives move host memory through MPI's shared-memory
// copies.
static double memcpy_gbs(int iters)
{
    size_t bytes = (size_t)256 << 20;
    char *a = malloc(bytes), *c = malloc(bytes);
    if (!a || !c) {
        free(a), free(c);
        return 0.0;
    }
    memset(a, 1, bytes), memset(c, 2, bytes); // first touch outside the timing
    double best = 1e30;
    for (int i = 0; i < (iters < 3 ? 3 : iters > 10 ? 10 : iters); i++) {
        double t0 = now_ms();
        memcpy(c, a, bytes);
        double ms = now_ms() - t0;
        a[i] = c[bytes - 1 - (size_t)i]; // keeps the copies observable
        best = ms < best ? ms : best;
    }
    free(a), free(c);
    return (double)bytes / best / 1e6;
}

// The GPU's name through the driver library (the host binary links no CUDA); "" when it cannot be read.
static void gpu_name(int ordinal, char *name, size_t size)
{
    name[0] = '\0';
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return;
    int (*init)(unsigned int) = NULL, (*get)(int *, int) = NULL, (*get_name)(char *, int, int) = NULL;
    *(void **)&init = dlsym(lib, "cuInit");
    *(void **)&get = dlsym(lib, "cuDeviceGet");
    *(void **)&get_name = dlsym(lib, "cuDeviceGetName");
    int d = 0;
    if (!init || !get || !get_name || init(0) != 0 || get(&d, ordinal) != 0 || get_name(name, (int)size, d) != 0)
        name[0] = '\0';
    dlclose(lib);
}

// The link's peak (GB/s per direction; 0 when unknown) for the device and world, and a line saying what it is.
static int link_ceiling(bench *b, const comm_opts *o, const dsarl_parallel *par, double *gbs, char *what,
                        size_t size)
{
    bool cuda = (dsarl_device_capabilities(b->d) & DSARL_DEVICE_CAP_CUDA) != 0;
    int32_t n = par->world_size;
    *gbs = 0.0;
    char name[128] = "";
    if (cuda)
        gpu_name(0, name, sizeof name); // the hosts of one job hold one kind of GPU
    if (n == 1) { // no ceiling: nothing crosses a link
        snprintf(what, size, "none: a world of one (%s) has no link; its collectives are local copies (in place: "
                 "nothing to do) and the bus bandwidth is 0 by definition", cuda ? (name[0] ? name : "one GPU")
                 : "one process");
        return DSARL_OK;
    }
    if (!cuda) {
        double copy = memcpy_gbs(o->iters);
        DSARL_TRY(dsarl_group_all_reduce_host(par->world, &copy, 1, DSARL_DTYPE_F64, DSARL_REDUCE_MIN, &b->err));
        snprintf(what, size, "host memcpy %.1f GB/s (256 MiB, bytes copied per second, the slowest rank, all "
                 "copying at once): MPI's shared-memory transport copies through host memory", copy);
        *gbs = copy;
        return DSARL_OK;
    }
    const char *span = par->local_size < n ? "; the ranks span hosts, so the network bounds it first" : "";
    // SXM parts only: the PCIe and NVL boards have bridges or no NVLink, with other peaks
    bool sxm = !strstr(name, "PCIe") && !strstr(name, "NVL");
    if (sxm && (strstr(name, "H100") || strstr(name, "H200"))) {
        snprintf(what, size, "NVLink 4 peak 450 GB/s per direction (%s: 18 links x 25 GB/s)%s", name, span);
        *gbs = 450.0;
    } else if (sxm && strstr(name, "A100")) {
        snprintf(what, size, "NVLink 3 peak 300 GB/s per direction (%s: 12 links x 25 GB/s)%s", name, span);
        *gbs = 300.0;
    } else {
        snprintf(what, size, "unknown link peak for %s (no ratio)", name[0] ? name : "this GPU");
    }
    return DSARL_OK;
}

static int bench_case(bench *b, const dsarl_parallel *par, const comm_case *c, int iters, double ceiling)
{
    int32_t n = par->world_size, rank = par->world_rank;
    size_t e = dsarl_dtype_size(c->dtype);
    comm_run r = {.b = b, .world = par->world, .c = c};
    r.send_counts = calloc(2 * (size_t)n, sizeof(int64_t));
    if (!r.send_counts)
        return DSARL_FAIL(&b->err, DSARL_E_NOMEM, "dsarl bench comm: out of host memory");
    r.recv_counts = r.send_counts + n;
    // buffer sizes in values, and the nccl-tests size S in bytes
    int64_t in_values = c->count, out_values = 0;
    double size_bytes = (double)c->count * (double)e;
    int rc = DSARL_OK;
    if (c->op == OP_ALL_GATHER)
        in_values = c->count / n, out_values = in_values * n, size_bytes = (double)out_values * (double)e;
    else if (c->op == OP_REDUCE_SCATTER)
        in_values = c->count / n * n, out_values = c->count / n, size_bytes = (double)in_values * (double)e;
    else if (c->op == OP_ALL_TO_ALL) {
        rc = a2a_counts(&r, n, rank);
        in_values = out_values = 0;
        for (int32_t p = 0; rc == DSARL_OK && p < n; p++)
            in_values += r.send_counts[p], out_values += r.recv_counts[p];
        double mean = (double)in_values * (double)e; // the ranks' mean send bytes
        if (rc == DSARL_OK)
            rc = dsarl_group_all_reduce_host(par->world, &mean, 1, DSARL_DTYPE_F64, DSARL_REDUCE_SUM, &b->err);
        size_bytes = mean / n;
    }
    if (rc == DSARL_OK && in_values > 0)
        rc = upload_random(b, &r.in, c->dtype, in_values, 1.0f, 100 + (uint64_t)rank);
    if (rc == DSARL_OK && out_values > 0)
        rc = b->d->alloc(b->dev, (size_t)out_values * e, &r.out, &b->err);
    double ms = 0.0;
    if (rc == DSARL_OK)
        rc = time_case(&r, iters, &ms);
    if (r.in)
        b->d->free(b->dev, r.in);
    if (r.out)
        b->d->free(b->dev, r.out);
    free(r.send_counts);
    DSARL_TRY(rc);
    double algbw = size_bytes / ms / 1e6, busbw = algbw * bus_factor(c->op, n);
    // in a world of one an in-place collective moves nothing (NCCL returns at once): its time is a launch, not a
    // bandwidth, so both figures are 0 and the row says why
    bool nothing_moves = n == 1 && (c->op == OP_ALL_REDUCE || c->op == OP_BROADCAST);
    if (nothing_moves)
        algbw = busbw = 0.0;
    if (rank == 0) {
        char ratio[16] = "-";
        if (nothing_moves)
            snprintf(ratio, sizeof ratio, "in place");
        else if (ceiling > 0)
            snprintf(ratio, sizeof ratio, "%.1f%%", 100.0 * busbw / ceiling);
        printf("%-15s %-38s %-5s %12.0f %10.3f %11.2f %11.2f %9.1f %7s\n", op_names[c->op], c->what,
               dsarl_dtype_name(c->dtype), size_bytes, ms, algbw, busbw, ceiling, ratio);
        printf("json: {\"impl\": \"dsarl\", \"op\": \"%s\", \"case\": \"%s\", \"dtype\": \"%s\", \"ranks\": %d, "
               "\"bytes\": %.0f, \"ms\": %.6g, \"algbw_gbs\": %.6g, \"busbw_gbs\": %.6g, \"ceiling_gbs\": %.6g%s}\n",
               op_names[c->op], c->what, dsarl_dtype_name(c->dtype), n, size_bytes, ms, algbw, busbw, ceiling,
               nothing_moves ? ", \"note\": \"in place in a world of one: nothing moves\"" : "");
        fflush(stdout);
    }
    return DSARL_OK;
}

static int parse_opts(int argc, char **argv, comm_opts *o, const char **sets, int *n_sets)
{
    for (int i = 2; i < argc; i += 2) { // every option takes a value (--help returns before its own)
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char msg[160];
        if (cli_is_help(f)) {
            print_help();
            return -1;
        }
        if (!v) {
            snprintf(msg, sizeof msg, "%s needs a value", f);
            return usage(msg);
        }
        if (!strcmp(f, "--device")) {
            o->device = v;
        } else if (!strcmp(f, "--sizes")) {
            o->sizes = v;
        } else if (!strcmp(f, "--iters")) {
            char *end = NULL;
            long x = strtol(v, &end, 10);
            if (*end || x < 1 || x > 100000) {
                snprintf(msg, sizeof msg, "--iters needs an integer in [1, 100000], got '%s'", v);
                return usage(msg);
            }
            o->iters = (int32_t)x;
        } else if (!strcmp(f, "--set") && *n_sets < 8) {
            sets[(*n_sets)++] = v;
        } else {
            snprintf(msg, sizeof msg, "unknown option '%s'", f);
            return usage(msg);
        }
    }
    return 0;
}

int cmd_bench_comm(int argc, char **argv, const cli_options *opts)
{
    comm_opts o = {.device = NULL, .sizes = "model", .iters = 20};
    const char *sets[8];
    int n_sets = 0;
    int prc = parse_opts(argc, argv, &o, sets, &n_sets);
    if (prc)
        return prc < 0 ? CLI_EXIT_OK : prc;
    comm_case probe[COMM_MAX_SIZES * 5];
    if (make_cases(o.sizes, DSARL_DTYPE_F32, probe, COMM_MAX_SIZES * 5) < 0)
        return usage("--sizes takes model, small, or up to 16 byte sizes (1M,64M,...)");
    bench b = {0};
    dsarl_error_clear(&b.err);
    // the layout: every rank one data-parallel replica, so the world group is the whole job
    dsarl_layout layout;
    dsarl_parallel par;
    int32_t world = dsarl_comm_world_size(opts->comm);
    int rc = dsarl_layout_make(world, 1, 1, 1, 1, &layout, &b.err);
    if (rc == 0)
        rc = dsarl_comm_build(opts->comm, &layout, &par, &b.err);
    dsarl_recipe *keys = NULL; // the --set keys, read by the device's create
    if (rc == 0)
        rc = dsarl_recipe_load_string("{}\n", "dsarl bench comm --set", &keys, &b.err);
    for (int i = 0; rc == 0 && i < n_sets; i++) {
        char arg[512];
        snprintf(arg, sizeof arg, "++%s", sets[i]);
        rc = dsarl_recipe_override(keys, arg, i + 1, &b.err);
    }
    dsarl_registry *reg = NULL;
    const dsarl_ops_common *dev_c = NULL;
    dsarl_session session = {0};
    if (rc == 0)
        rc = cli_open_registry(NULL, opts, &reg, &b.err);
    if (rc == 0)
        rc = cli_choose_device(reg, "dsarl bench comm", 0, &o.device, &dev_c, &b.err);
    if (rc == 0 && !dsarl_device_has_collectives((const dsarl_device_ops *)dev_c))
        rc = DSARL_FAIL(&b.err, DSARL_E_UNSUPPORTED, "dsarl bench comm: device %s has no collectives (ABI 1.3 "
                        "all_reduce ... recv)", o.device);
    if (rc == 0) {
        b.d = (const dsarl_device_ops *)dev_c;
        dsarl_session_config sc = {.struct_size = sizeof(sc), .host = dsarl_registry_host(reg),
                                   .recipe = dsarl_recipe_root(keys), .parallel = &par, .device_ops = b.d};
        rc = dsarl_session_open(&sc, &session, &b.err);
        b.dev = session.device;
    }
    double ceiling = 0.0;
    char ceiling_text[256] = "";
    comm_case cases[COMM_MAX_SIZES * 5];
    int n_cases = 0;
    if (rc == 0) {
        if (dsarl_device_capabilities(b.d) & DSARL_DEVICE_CAP_CUDA)
            load_events(&b.ev);
        n_cases = make_cases(o.sizes, b.d->storage_dtype(b.dev), cases, COMM_MAX_SIZES * 5);
        rc = link_ceiling(&b, &o, &par, &ceiling, ceiling_text, sizeof ceiling_text);
    }
    if (rc == 0 && par.world_rank == 0) {
        printf("dsarl bench comm: device %s (storage %s), world group of %d rank%s%s, %d timed iterations each "
               "(back to back, the slowest rank's mean), %s\n", o.device, dsarl_dtype_name(b.d->storage_dtype(b.dev)),
               world, world == 1 ? "" : "s", world == 1 ? " (a world of one: the collectives are local copies)" : "",
               o.iters, b.ev.create ? "CUDA events" : "wall clock");
        printf("ceiling: %s\n", ceiling_text);
        printf("json: {\"impl\": \"dsarl\", \"op\": \"ceilings\", \"device\": \"%s\", \"ranks\": %d, "
               "\"link_gbs\": %.6g}\n", o.device, world, ceiling);
        printf("%-15s %-38s %-5s %12s %10s %11s %11s %9s %7s\n", "collective", "case", "dtype", "bytes", "ms",
               "algbw GB/s", "busbw GB/s", "ceiling", "ratio");
        fflush(stdout);
    }
    for (int i = 0; rc == 0 && i < n_cases; i++)
        rc = bench_case(&b, &par, &cases[i], o.iters, ceiling);
    dsarl_session_close(&session);
    dsarl_registry_free(reg);
    dsarl_recipe_free(keys);
    return rc ? cli_fail(&b.err) : CLI_EXIT_OK;
}
