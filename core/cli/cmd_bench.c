/* cmd_bench.c: `dsarl bench dsa`: the DSA kernels of one backend timed on one device at the shapes, each
 * figure printed beside the machine's ceilings measured in the same run (bf16 GEMM through the device's gemm, a
 * device-to-device copy), the ratio and the target.
 *
 * Both plugins come from the registry, like every other command, so a third-party backend is benchmarked the
 * same way (--backend NAME). Timing uses CUDA events through the driver library (libcuda.so.1, opened with
 * dlopen so the host binary needs no CUDA at build time) on the legacy default stream, which the cuda device's
 * blocking streams are ordered with; without it (a CPU device) the wall clock around a synchronize is used. The
 * L2 cache is flushed (a 256 MiB write) before every timed iteration, outside the timed interval.
 *
 * FLOP conventions (shared/reference/glm5_dsa.md 2.8): sparse MLA forward 2 * Tq * k * H * (d_qk + d_v)
 * (FlashMLA); backward 2 * Tq * k * H * (3 d_qk + 2 d_v) (TileLang's sparse_mla_bwd: five products of a tile);
 * indexer scores 2 * H_I * d_I per causal (query, key) pair (DeepGEMM). */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cli.h"
#include "cmd_bench.h"
#include "dsarl/ops/dsa.h"

typedef struct bench_opts {
    const char *device, *backend;
    int64_t tokens;               // packed query tokens (one causal sequence for the indexer)
    int32_t heads, topk, d_qk, d_v, index_heads, index_dim, iters;
} bench_opts;

void load_events(event_api *ev)
{
    memset(ev, 0, sizeof(*ev));
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return;
    *(void **)&ev->create = dlsym(lib, "cuEventCreate");
    *(void **)&ev->record = dlsym(lib, "cuEventRecord");
    *(void **)&ev->sync = dlsym(lib, "cuEventSynchronize");
    *(void **)&ev->elapsed = dlsym(lib, "cuEventElapsedTime");
    *(void **)&ev->destroy = dlsym(lib, "cuEventDestroy_v2");
    if (!ev->create || !ev->record || !ev->sync || !ev->elapsed || !ev->destroy)
        memset(ev, 0, sizeof(*ev));
}

double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

// Mean milliseconds of fn over iters runs after one warm-up, each run preceded by an L2 flush outside the timing.
int time_op(bench *b, bench_fn fn, void *arg, int iters, double *mean_ms)
{
    DSARL_TRY(fn(b, arg)); // warm-up (first-call setup, autotuning, plan caches)
    void *e0 = NULL, *e1 = NULL;
    bool events = b->ev.create && b->ev.create(&e0, 0) == 0 && b->ev.create(&e1, 0) == 0;
    double total = 0.0;
    for (int i = 0; i < iters; i++) {
        DSARL_TRY(b->d->zero(b->dev, b->flush, b->flush_bytes, &b->err));
        DSARL_TRY(b->d->synchronize(b->dev, &b->err));
        double t0 = now_ms();
        if (events)
            b->ev.record(e0, NULL);
        DSARL_TRY(fn(b, arg));
        if (events)
            b->ev.record(e1, NULL);
        DSARL_TRY(b->d->synchronize(b->dev, &b->err));
        float ms = 0.0f;
        if (events && b->ev.sync(e1) == 0 && b->ev.elapsed(&ms, e0, e1) == 0)
            total += ms;
        else
            total += now_ms() - t0;
    }
    if (e0)
        b->ev.destroy(e0);
    if (e1)
        b->ev.destroy(e1);
    *mean_ms = total / iters;
    return DSARL_OK;
}

// n uniform values in [-scale, scale) from a fixed LCG stream, uploaded in the dtype given.
int upload_random(bench *b, void **dst, dsarl_dtype dtype, int64_t n, float scale, uint64_t seed)
{
    float *host = malloc((size_t)n * sizeof(float));
    if (!host)
        return DSARL_FAIL(&b->err, DSARL_E_NOMEM, "dsarl bench: out of host memory for %lld values", (long long)n);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        host[i] = scale * ((float)(s >> 40) / 8388608.0f - 1.0f);
    }
    size_t bytes = (size_t)n * dsarl_dtype_size(dtype);
    int rc = b->d->alloc(b->dev, bytes, dst, &b->err);
    if (rc == 0)
        rc = b->d->upload_f32(b->dev, *dst, dtype, host, (size_t)n, &b->err);
    free(host);
    return rc;
}

static int upload_i32(bench *b, int32_t **dst, const int32_t *host, int64_t n)
{
    DSARL_TRY(b->d->alloc(b->dev, (size_t)n * sizeof(int32_t), (void **)dst, &b->err));
    return b->d->copy(b->dev, *dst, host, (size_t)n * sizeof(int32_t), DSARL_COPY_HOST_TO_DEVICE, &b->err);
}

int run_gemm(bench *b, void *p)
{
    gemm_args *g = p;
    return b->d->gemm(b->dev, false, true, g->n, g->n, g->n, 1.0f, g->a, g->bm, 0.0f, g->c, &b->err);
}

int run_copy(bench *b, void *p)
{
    copy_args *c = p;
    return b->d->copy(b->dev, c->dst, c->src, c->bytes, DSARL_COPY_DEVICE_TO_DEVICE, &b->err);
}

typedef struct dsa_args {
    dsarl_dsa_batch batch;
    dsarl_dsa_indexer_inputs index;
    dsarl_dsa_attention_inputs attn;
    int32_t topk, *idx;
    void *out, *dout, *dq, *dkv;
    float *lse;
} dsa_args;

static int run_topk(bench *b, void *p)
{
    dsa_args *a = p;
    return b->dsa_ops->indexer_topk(b->dsa, &a->batch, &a->index, a->topk, a->idx, NULL, &b->err);
}
static int run_fwd(bench *b, void *p)
{
    dsa_args *a = p;
    return b->dsa_ops->sparse_mla_forward(b->dsa, &a->batch, &a->attn, a->idx, a->topk, a->out, a->lse, &b->err);
}
static int run_bwd(bench *b, void *p)
{
    dsa_args *a = p;
    return b->dsa_ops->sparse_mla_backward(b->dsa, &a->batch, &a->attn, a->idx, a->topk, a->out, a->lse, a->dout,
                                           a->dq, a->dkv, &b->err);
}

static void print_row(const char *op, const char *shape, double ms, double tflops, double ceiling, const char *target)
{
    printf("%-20s %-44s %9.3f %9.1f %9.1f %7.1f%%  %s\n", op, shape, ms, tflops, ceiling, 100.0 * tflops / ceiling,
           target);
    printf("json: {\"impl\": \"dsarl\", \"op\": \"%s\", \"shape\": \"%s\", \"ms\": %.4f, \"tflops\": %.2f, "
           "\"gemm_ceiling_tflops\": %.1f, \"target\": \"%s\"}\n", op, shape, ms, tflops, ceiling, target);
}

static void free_all(bench *b, void **ptrs, int n)
{
    for (int i = 0; i < n; i++)
        if (ptrs[i])
            b->d->free(b->dev, ptrs[i]);
}

static int bench_dsa(bench *b, const bench_opts *o)
{
    dsarl_dtype st = b->d->storage_dtype(b->dev);
    size_t e = dsarl_dtype_size(st);
    int iters = o->iters;
    b->flush_bytes = (size_t)256 << 20;
    DSARL_TRY(b->d->alloc(b->dev, b->flush_bytes, &b->flush, &b->err));

    // ceilings of this machine, in this run
    gemm_args g = {.n = 8192};
    void *owned[16] = {0};
    int n_owned = 0, rc = 0;
    rc = upload_random(b, &g.a, st, g.n * g.n, 1.0f, 1);
    if (rc == 0)
        owned[n_owned++] = g.a, rc = upload_random(b, &g.bm, st, g.n * g.n, 1.0f, 2);
    if (rc == 0)
        owned[n_owned++] = g.bm, rc = b->d->alloc(b->dev, (size_t)(g.n * g.n) * e, &g.c, &b->err);
    double gemm_ms = 0.0, copy_ms = 0.0;
    if (rc == 0)
        owned[n_owned++] = g.c, rc = time_op(b, run_gemm, &g, iters, &gemm_ms);
    copy_args c = {.dst = g.c, .src = g.a, .bytes = (size_t)(g.n * g.n) * e};
    if (rc == 0)
        rc = time_op(b, run_copy, &c, iters, &copy_ms);
    free_all(b, owned, n_owned);
    n_owned = 0;
    DSARL_TRY(rc);
    double ceiling = 2.0 * (double)g.n * g.n * g.n / gemm_ms / 1e9, copy_gbs = 2.0 * (double)c.bytes / copy_ms / 1e6;
    printf("dsarl bench dsa: device %s (storage %s), backend %s, %d timed iterations each (mean), L2 flushed, %s\n",
           o->device, dsarl_dtype_name(st), o->backend, iters, b->ev.create ? "CUDA events" : "wall clock");
    printf("ceilings (this run): %s GEMM 8192^3 %.1f TFLOP/s; device copy %.0f GB/s (read + write)\n",
           dsarl_dtype_name(st), ceiling, copy_gbs);
    printf("json: {\"impl\": \"dsarl\", \"op\": \"ceilings\", \"gemm_tflops\": %.1f, \"copy_gbs\": %.0f}\n", ceiling,
           copy_gbs);
    printf("%-20s %-44s %9s %9s %9s %8s  %s\n", "op", "shape", "ms", "TFLOP/s", "ceiling", "ratio", "target");

    int64_t T = o->tokens;
    int32_t H = o->heads, k = o->topk, nI = o->index_heads, dI = o->index_dim;
    // indexer: one causal sequence of T tokens (query t sees keys [0, t])
    int32_t *start = malloc((size_t)T * sizeof(int32_t)), *end = malloc((size_t)T * sizeof(int32_t));
    int32_t *idx = malloc((size_t)(T * k) * sizeof(int32_t));
    if (!start || !end || !idx) {
        free(start), free(end), free(idx);
        return DSARL_FAIL(&b->err, DSARL_E_NOMEM, "dsarl bench: out of host memory");
    }
    for (int64_t t = 0; t < T; t++)
        start[t] = 0, end[t] = (int32_t)(t + 1);
    dsa_args a = {.topk = k};
    a.batch = (dsarl_dsa_batch){.struct_size = sizeof(a.batch), .n_queries = T, .n_keys = T,
                                .max_keys_per_query = (int32_t)T};
    a.index = (dsarl_dsa_indexer_inputs){.struct_size = sizeof(a.index), .n_heads = nI, .head_dim = dI};
    void *q_i = NULL, *k_i = NULL, *w_i = NULL;
    int32_t *d_start = NULL, *d_end = NULL;
    rc = upload_i32(b, &d_start, start, T);
    if (rc == 0)
        owned[n_owned++] = d_start, rc = upload_i32(b, &d_end, end, T);
    if (rc == 0)
        owned[n_owned++] = d_end, rc = upload_random(b, &q_i, st, T * nI * dI, 1.0f, 3);
    if (rc == 0)
        owned[n_owned++] = q_i, rc = upload_random(b, &k_i, st, T * dI, 1.0f, 4);
    if (rc == 0)
        owned[n_owned++] = k_i, rc = upload_random(b, &w_i, DSARL_DTYPE_F32, T * nI, 0.2f, 5);
    if (rc == 0)
        owned[n_owned++] = w_i, rc = b->d->alloc(b->dev, (size_t)(T * k) * sizeof(int32_t), (void **)&a.idx, &b->err);
    double ms = 0.0;
    char shape[96];
    if (rc == 0) {
        owned[n_owned++] = a.idx;
        a.batch.key_start = d_start, a.batch.key_end = d_end;
        a.index.q = q_i, a.index.k = k_i, a.index.weights = w_i;
        rc = time_op(b, run_topk, &a, iters, &ms);
    }
    if (rc == 0) {
        double flops = 2.0 * nI * dI * (double)T * (double)(T + 1) / 2.0;
        snprintf(shape, sizeof shape, "T=%lld causal, %dx%d, k=%d", (long long)T, nI, dI, k);
        print_row("indexer_topk", shape, ms, flops / ms / 1e9, ceiling, "<= 2 ms");
    }
    // sparse MLA: every query attends k keys chosen over the whole array (FlashMLA's prefill test layout), so the
    // FLOP count is exact; distinct keys per row from an odd-stride walk (T a power of two keeps them distinct)
    for (int64_t t = 0; t < T; t++) {
        start[t] = 0, end[t] = (int32_t)T;
        for (int32_t i = 0; i < k; i++)
            idx[t * k + i] = (int32_t)(((int64_t)i * 2654435761ll + t * 40503ll) % T);
    }
    a.attn = (dsarl_dsa_attention_inputs){.struct_size = sizeof(a.attn), .n_heads = H, .d_qk = o->d_qk,
                                          .d_v = o->d_v, .softmax_scale = 1.0f / sqrtf((float)o->d_qk)};
    void *q = NULL, *kv = NULL;
    if (rc == 0)
        rc = b->d->copy(b->dev, d_end, end, (size_t)T * sizeof(int32_t), DSARL_COPY_HOST_TO_DEVICE, &b->err);
    if (rc == 0)
        rc = b->d->copy(b->dev, a.idx, idx, (size_t)(T * k) * sizeof(int32_t), DSARL_COPY_HOST_TO_DEVICE, &b->err);
    if (rc == 0)
        rc = upload_random(b, &q, st, T * H * o->d_qk, 1.0f, 6);
    if (rc == 0)
        owned[n_owned++] = q, rc = upload_random(b, &kv, st, T * o->d_qk, 1.0f, 7);
    if (rc == 0)
        owned[n_owned++] = kv, rc = upload_random(b, &a.dout, st, T * H * o->d_v, 1.0f, 8);
    if (rc == 0)
        owned[n_owned++] = a.dout, rc = b->d->alloc(b->dev, (size_t)(T * H * o->d_v) * e, &a.out, &b->err);
    if (rc == 0)
        owned[n_owned++] = a.out, rc = b->d->alloc(b->dev, (size_t)(T * H * o->d_qk) * e, &a.dq, &b->err);
    if (rc == 0)
        owned[n_owned++] = a.dq, rc = b->d->alloc(b->dev, (size_t)(T * o->d_qk) * e, &a.dkv, &b->err);
    if (rc == 0)
        owned[n_owned++] = a.dkv, rc = b->d->alloc(b->dev, (size_t)(T * H) * sizeof(float), (void **)&a.lse, &b->err);
    if (rc == 0) {
        owned[n_owned++] = a.lse;
        a.attn.q = q, a.attn.kv = kv;
        rc = b->d->zero(b->dev, a.dkv, (size_t)(T * o->d_qk) * e, &b->err);
    }
    snprintf(shape, sizeof shape, "T=%lld H=%d d=%d/%d k=%d", (long long)T, H, o->d_qk, o->d_v, k);
    double per_pair = 2.0 * (double)T * k * H;
    if (rc == 0)
        rc = time_op(b, run_fwd, &a, iters, &ms);
    if (rc == 0)
        print_row("sparse_mla_forward", shape, ms, per_pair * (o->d_qk + o->d_v) / ms / 1e9, ceiling, ">= 450 TFLOP/s");
    if (rc == 0)
        rc = time_op(b, run_bwd, &a, iters, &ms);
    if (rc == 0)
        print_row("sparse_mla_backward", shape, ms, per_pair * (3.0 * o->d_qk + 2.0 * o->d_v) / ms / 1e9, ceiling,
                  ">= 200 TFLOP/s");
    free(start), free(end), free(idx);
    free_all(b, owned, n_owned);
    return rc;
}

static void print_help(void)
{
    printf("usage: dsarl bench dsa [--device cuda] [--backend tilelang] [--tokens 8192] [--heads 64] [--topk 2048]\n"
           "                       [--d-qk 576] [--d-v 512] [--index-heads 32] [--index-dim 128] [--iters 5]\n"
           "\n"
           "Times the selected DSA backend's indexer top-k, sparse MLA forward and backward on the device (plugins\n"
           "from the registry), after measuring the device's GEMM and copy ceilings in the same run; prints a table\n"
           "(ms, TFLOP/s, ceiling, ratio, target) and one `json:` line per figure.\n"
           "\n"
           "dsarl bench train|generate --help: a whole training step / greedy generation of a model config.\n");
}

static int parse_int(const char *flag, const char *value, int64_t lo, int64_t hi, int64_t *out)
{
    char *endp = NULL;
    long long v = value ? strtoll(value, &endp, 10) : 0;
    if (!value || *endp || v < lo || v > hi) {
        fprintf(stderr, "dsarl bench: error: %s needs an integer in [%lld, %lld], got '%s'\n", flag, (long long)lo,
                (long long)hi, value ? value : "(nothing)");
        return -1;
    }
    *out = v;
    return 0;
}

int cmd_bench(int argc, char **argv, const cli_options *opts)
{
    if (argc < 2 || cli_is_help(argv[1])) {
        print_help();
        return argc < 2 ? CLI_EXIT_USAGE : CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "train") == 0)
        return cmd_bench_train(argc, argv, opts);
    if (strcmp(argv[1], "generate") == 0)
        return cmd_bench_generate(argc, argv, opts);
    if (strcmp(argv[1], "dsa") != 0) {
        fprintf(stderr, "dsarl bench: error: unknown benchmark '%s' (known: dsa, train, generate)\n", argv[1]);
        return CLI_EXIT_USAGE;
    }
    bench_opts o = {.device = "cuda", .backend = "tilelang", .tokens = 8192, .heads = 64, .topk = 2048, .d_qk = 576,
                    .d_v = 512, .index_heads = 32, .index_dim = 128, .iters = 5};
    for (int i = 2; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t x = 0;
        struct { const char *flag; int32_t *dst; int64_t hi; } ints[] = {
            {"--heads", &o.heads, 1024}, {"--topk", &o.topk, 1 << 20}, {"--d-qk", &o.d_qk, 4096},
            {"--d-v", &o.d_v, 4096}, {"--index-heads", &o.index_heads, 1024}, {"--index-dim", &o.index_dim, 4096},
            {"--iters", &o.iters, 1000},
        };
        int done = 0;
        if (cli_is_help(f)) {
            print_help();
            return CLI_EXIT_OK;
        } else if (!strcmp(f, "--device") && v) {
            o.device = v, done = 1;
        } else if (!strcmp(f, "--backend") && v) {
            o.backend = v, done = 1;
        } else if (!strcmp(f, "--tokens")) {
            if (parse_int(f, v, 1, (int64_t)1 << 24, &o.tokens))
                return CLI_EXIT_USAGE;
            done = 1;
        }
        for (size_t j = 0; !done && j < sizeof ints / sizeof ints[0]; j++)
            if (!strcmp(f, ints[j].flag)) {
                if (parse_int(f, v, 1, ints[j].hi, &x))
                    return CLI_EXIT_USAGE;
                *ints[j].dst = (int32_t)x, done = 1;
            }
        if (!done) {
            fprintf(stderr, "dsarl bench dsa: error: unknown option or missing value '%s'; see --help\n", f);
            return CLI_EXIT_USAGE;
        }
        i++;
    }
    if (o.topk > o.tokens || o.d_v > o.d_qk) {
        fprintf(stderr, "dsarl bench dsa: error: needs --topk <= --tokens and --d-v <= --d-qk\n");
        return CLI_EXIT_USAGE;
    }
    bench b = {0};
    dsarl_registry *reg = NULL;
    const dsarl_ops_common *dev_c = NULL, *dsa_c = NULL;
    static const dsarl_parallel single = DSARL_PARALLEL_SINGLE;
    int rc = cli_open_registry(NULL, opts, &reg, &b.err);
    if (rc == 0)
        rc = dsarl_registry_require(reg, DSARL_KIND_DEVICE, o.device, "dsarl bench dsa --device", &dev_c, &b.err);
    if (rc == 0)
        rc = dsarl_registry_require(reg, DSARL_KIND_DSA, o.backend, "dsarl bench dsa --backend", &dsa_c, &b.err);
    if (rc == 0) {
        b.d = (const dsarl_device_ops *)dev_c;
        b.dsa_ops = (const dsarl_dsa_ops *)dsa_c;
        dsarl_device_config dc = {.struct_size = sizeof(dc), .parallel = &single};
        rc = b.d->create(&dc, &b.dev, &b.err);
    }
    if (rc == 0)
        rc = b.dsa_ops->create(b.d, b.dev, NULL, &b.dsa, &b.err);
    if (rc == 0) {
        load_events(&b.ev);
        rc = bench_dsa(&b, &o);
    }
    if (b.flush)
        b.d->free(b.dev, b.flush);
    if (b.dsa)
        b.dsa_ops->destroy(b.dsa);
    if (b.dev)
        b.d->destroy(b.dev);
    dsarl_registry_free(reg);
    return rc ? cli_fail(&b.err) : CLI_EXIT_OK;
}
