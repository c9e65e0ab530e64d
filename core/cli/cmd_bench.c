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
 * FLOP conventions (docs/conventions.md section 1): sparse MLA forward 2 * Tq * k * H * (d_qk + d_v)
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
#include "dsarl/trainer.h"
#include "recipe_internal.h"

#define BENCH_MAX_LIST 8

typedef struct bench_opts {
    const char *device;
    const char *backends[BENCH_MAX_LIST]; // DSA backends, timed side by side on the same inputs
    int n_backends;
    int64_t tokens[BENCH_MAX_LIST];       // token counts (one causal sequence for the indexer and headwise ops)
    int n_tokens;
    int32_t heads, topk, d_qk, d_v, index_heads, index_dim, iters, hw_d_qk, hw_d_v;
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
    dsarl_dsa_headwise_inputs head;
    void *hw_out, *hw_dout, *hw_dq, *hw_dk, *hw_dv;
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

static int run_hw_fwd(bench *b, void *p)
{
    dsa_args *a = p;
    return b->dsa_ops->headwise_attention_forward(b->dsa, &a->batch, &a->head, a->idx, a->topk, a->hw_out, a->lse,
                                                  &b->err);
}
static int run_hw_bwd(bench *b, void *p)
{
    dsa_args *a = p;
    return b->dsa_ops->headwise_attention_backward(b->dsa, &a->batch, &a->head, a->idx, a->topk, a->hw_out, a->lse,
                                                   a->hw_dout, a->hw_dq, a->hw_dk, a->hw_dv, &b->err);
}

static void print_row(const char *backend, const char *op, const char *shape, double ms, double tflops,
                      double ceiling, const char *target)
{
    printf("%-10s %-28s %-40s %9.3f %9.1f %9.1f %7.1f%%  %s\n", backend, op, shape, ms, tflops, ceiling,
           100.0 * tflops / ceiling, target);
    printf("json: {\"impl\": \"dsarl\", \"backend\": \"%s\", \"op\": \"%s\", \"shape\": \"%s\", \"ms\": %.4f, "
           "\"tflops\": %.2f, \"gemm_ceiling_tflops\": %.1f, \"target\": \"%s\"}\n", backend, op, shape, ms, tflops,
           ceiling, target);
}

static void free_all(bench *b, void **ptrs, int n)
{
    for (int i = 0; i < n; i++)
        if (ptrs[i])
            b->d->free(b->dev, ptrs[i]);
}

// The machine's ceilings in this run (a GEMM through the device's gemm, a device copy) and the table header.
static int bench_ceilings(bench *b, const bench_opts *o, double *ceiling_out)
{
    dsarl_dtype st = b->d->storage_dtype(b->dev);
    size_t e = dsarl_dtype_size(st);
    int iters = o->iters;
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
    printf("dsarl bench dsa: device %s (storage %s), backends", o->device, dsarl_dtype_name(st));
    for (int i = 0; i < o->n_backends; i++)
        printf("%s %s", i ? "," : "", o->backends[i]);
    printf(", %d timed iterations each (mean), L2 flushed, %s\n", iters, b->ev.create ? "CUDA events" : "wall clock");
    printf("ceilings (this run): %s GEMM 8192^3 %.1f TFLOP/s; device copy %.0f GB/s (read + write)\n",
           dsarl_dtype_name(st), ceiling, copy_gbs);
    printf("json: {\"impl\": \"dsarl\", \"op\": \"ceilings\", \"gemm_tflops\": %.1f, \"copy_gbs\": %.0f}\n", ceiling,
           copy_gbs);
    printf("%-10s %-28s %-40s %9s %9s %9s %8s  %s\n", "backend", "op", "shape", "ms", "TFLOP/s", "ceiling", "ratio",
           "target");
    *ceiling_out = ceiling;
    return DSARL_OK;
}

// Every op of the current backend (b->dsa_ops, named backend) at T tokens.
static int bench_shape(bench *b, const bench_opts *o, const char *backend, int64_t T, double ceiling)
{
    dsarl_dtype st = b->d->storage_dtype(b->dev);
    size_t e = dsarl_dtype_size(st);
    int iters = o->iters, rc = 0, n_owned = 0;
    void *owned[24] = {0};
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
        print_row(backend, "indexer_topk", shape, ms, flops / ms / 1e9, ceiling, "<= 2 ms");
    }
    // headwise (per-head, non-absorbed) attention over the same causal sequence, for backends that serve it (what a
    // recipe with dsa_attention_form: headwise runs): row t selects its most recent min(t + 1, k) keys (the dense
    // causal graph when T <= k, the top-k bias beyond); a size the backend refuses is reported as not served
    if (rc == 0 && DSARL_DSA_HAS(b->dsa_ops, headwise_attention_forward)) {
        int32_t cu[2] = {0, (int32_t)T}, dq_ = o->hw_d_qk, dv_ = o->hw_d_v;
        a.batch.host_cu_seqlens = cu, a.batch.n_segments = 1;
        snprintf(shape, sizeof shape, "S=%lld causal H=%d d=%d/%d k=%d", (long long)T, H, dq_, dv_, k);
        {
            for (int64_t t = 0; t < T; t++)
                for (int32_t i = 0; i < k; i++)
                    idx[t * k + i] = t - i >= 0 ? (int32_t)(t - i) : -1;
            rc = b->d->copy(b->dev, a.idx, idx, (size_t)(T * k) * sizeof(int32_t), DSARL_COPY_HOST_TO_DEVICE, &b->err);
            a.head = (dsarl_dsa_headwise_inputs){.struct_size = sizeof(a.head), .n_heads = H, .d_qk = dq_, .d_v = dv_,
                                                 .softmax_scale = 1.0f / sqrtf((float)dq_)};
            void *hq = NULL, *hk = NULL, *hv = NULL;
            int first = n_owned;
            if (rc == 0)
                rc = upload_random(b, &hq, st, T * H * dq_, 1.0f, 11);
            if (rc == 0)
                owned[n_owned++] = hq, rc = upload_random(b, &hk, st, T * H * dq_, 1.0f, 12);
            if (rc == 0)
                owned[n_owned++] = hk, rc = upload_random(b, &hv, st, T * H * dv_, 1.0f, 13);
            if (rc == 0)
                owned[n_owned++] = hv, rc = upload_random(b, &a.hw_dout, st, T * H * dv_, 1.0f, 14);
            if (rc == 0)
                owned[n_owned++] = a.hw_dout, rc = b->d->alloc(b->dev, (size_t)(T * H * dv_) * e, &a.hw_out, &b->err);
            if (rc == 0)
                owned[n_owned++] = a.hw_out, rc = b->d->alloc(b->dev, (size_t)(T * H * dq_) * e, &a.hw_dq, &b->err);
            if (rc == 0)
                owned[n_owned++] = a.hw_dq, rc = b->d->alloc(b->dev, (size_t)(T * H * dq_) * e, &a.hw_dk, &b->err);
            if (rc == 0)
                owned[n_owned++] = a.hw_dk, rc = b->d->alloc(b->dev, (size_t)(T * H * dv_) * e, &a.hw_dv, &b->err);
            if (rc == 0)
                owned[n_owned++] = a.hw_dv, rc = b->d->alloc(b->dev, (size_t)(T * H) * sizeof(float),
                                                             (void **)&a.lse, &b->err);
            if (rc == 0) {
                owned[n_owned++] = a.lse;
                a.head.q = hq, a.head.k = hk, a.head.v = hv;
                rc = time_op(b, run_hw_fwd, &a, iters, &ms);
            }
            if (rc == DSARL_E_UNSUPPORTED) { // past the backend's bound: say so and go on with the other ops
                printf("%-10s %-28s %-40s not served: %s\n", backend, "headwise_attention", shape, b->err.message);
                printf("json: {\"impl\": \"dsarl\", \"backend\": \"%s\", \"op\": \"headwise_attention_forward\", "
                       "\"shape\": \"%s\", \"skipped\": \"not served (past the backend's segment bound)\"}\n",
                       backend, shape);
                rc = 0, ms = -1.0;
            }
            // useful FLOPs: the selected (query, key) pairs only; backward five products (3 d_qk + 2 d_v)
            double pairs = 0.0;
            for (int64_t t = 0; t < T; t++)
                pairs += (double)(t + 1 < k ? t + 1 : k);
            if (rc == 0 && ms > 0.0)
                print_row(backend, "headwise_attention_forward", shape, ms, 2.0 * H * pairs * (dq_ + dv_) / ms / 1e9,
                          ceiling, "-");
            if (rc == 0 && ms > 0.0)
                rc = time_op(b, run_hw_bwd, &a, iters, &ms);
            if (rc == 0 && ms > 0.0)
                print_row(backend, "headwise_attention_backward", shape, ms,
                          2.0 * H * pairs * (3.0 * dq_ + 2.0 * dv_) / ms / 1e9, ceiling, "-");
            free_all(b, owned + first, n_owned - first); // before the absorbed inputs are allocated
            n_owned = first;
            a.lse = NULL;
        }
        a.batch.host_cu_seqlens = NULL, a.batch.n_segments = 0;
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
        print_row(backend, "sparse_mla_forward", shape, ms, per_pair * (o->d_qk + o->d_v) / ms / 1e9, ceiling, ">= 450 TFLOP/s");
    if (rc == 0)
        rc = time_op(b, run_bwd, &a, iters, &ms);
    if (rc == 0)
        print_row(backend, "sparse_mla_backward", shape, ms, per_pair * (3.0 * o->d_qk + 2.0 * o->d_v) / ms / 1e9, ceiling,
                  ">= 200 TFLOP/s");
    free(start), free(end), free(idx);
    free_all(b, owned, n_owned);
    return rc;
}

static void print_help(void)
{
    printf("usage: dsarl bench dsa [--device NAME] [--backend NAME[,NAME...]] [--tokens 8192[,2048,...]]\n"
           "                       [--heads 64] [--topk 2048] [--d-qk 576] [--d-v 512] [--index-heads 32]\n"
           "                       [--index-dim 128] [--hw-d-qk 256] [--hw-d-v 256] [--iters 5]\n"
           "                       [--set runtime.KEY=VALUE ...]\n"
           "\n"
           "Times each selected DSA backend's indexer top-k, sparse MLA forward and backward (absorbed d-qk/d-v) and,\n"
           "for backends that serve it, the per-head attention forward and backward (hw-d-qk/hw-d-v, one causal\n"
           "sequence: what dsa_attention_form: headwise runs) on the device (plugins from the registry), every\n"
           "backend at every token count on the same inputs, after measuring the device's GEMM and copy ceilings in\n"
           "the same run. Defaults: the highest-ranked CUDA device that runs here and its highest-ranked backend;\n"
           "prints a table (backend, op, ms, TFLOP/s, ceiling, ratio, target) and one `json:` line per figure.\n"
           "--set passes a recipe key to the device and the backends (runtime.tilelang_sparse_mla=wmma, ...).\n"
           "\n"
           "dsarl bench train|generate --help: a whole training step / greedy generation of a model config.\n"
           "dsarl bench comm --help: the device's collectives (under mpirun) against the link's ceiling.\n");
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
    if (strcmp(argv[1], "comm") == 0)
        return cmd_bench_comm(argc, argv, opts);
    if (strcmp(argv[1], "dsa") != 0) {
        fprintf(stderr, "dsarl bench: error: unknown benchmark '%s' (known: dsa, train, generate, comm)\n", argv[1]);
        return CLI_EXIT_USAGE;
    }
    bench_opts o = {.device = NULL, .n_backends = 0, .tokens = {8192}, .n_tokens = 1,
                    .heads = 64, .topk = 2048, .d_qk = 576, .d_v = 512, .index_heads = 32, .index_dim = 128,
                    .iters = 5, .hw_d_qk = 256, .hw_d_v = 256};
    char *lists_owned[2] = {NULL, NULL}; // the split copies of --tokens [0] and --backend [1]
    const char *sets[BENCH_MAX_LIST]; // --set KEY=VALUE, in order
    int n_sets = 0;
    for (int i = 2; i < argc; i += 2) { // every option takes a value (--help returns before its own)
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t x = 0;
        struct { const char *flag; int32_t *dst; int64_t hi; } ints[] = {
            {"--heads", &o.heads, 1024}, {"--topk", &o.topk, 1 << 20}, {"--d-qk", &o.d_qk, 4096},
            {"--d-v", &o.d_v, 4096}, {"--index-heads", &o.index_heads, 1024}, {"--index-dim", &o.index_dim, 4096},
            {"--iters", &o.iters, 1000}, {"--hw-d-qk", &o.hw_d_qk, 4096}, {"--hw-d-v", &o.hw_d_v, 4096},
        };
        int done = 0;
        if (cli_is_help(f)) {
            print_help();
            free(lists_owned[0]), free(lists_owned[1]);
            return CLI_EXIT_OK;
        } else if ((!strcmp(f, "--backend") || !strcmp(f, "--tokens")) && v) {
            // comma-separated lists: every backend runs every token count, on the same inputs
            int backend = f[2] == 'b', count = 0;
            char *copy = strdup(v);
            if (!copy) {
                free(lists_owned[0]), free(lists_owned[1]);
                return CLI_EXIT_USAGE;
            }
            free(lists_owned[backend]); // a repeated flag replaces the earlier list
            lists_owned[backend] = copy;
            for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if (count == BENCH_MAX_LIST) {
                    fprintf(stderr, "dsarl bench dsa: error: %s takes at most %d values\n", f, BENCH_MAX_LIST);
                    free(lists_owned[0]), free(lists_owned[1]);
                    return CLI_EXIT_USAGE;
                }
                if (backend) {
                    o.backends[count++] = tok;
                } else if (parse_int(f, tok, 1, (int64_t)1 << 24, &o.tokens[count++])) {
                    free(lists_owned[0]), free(lists_owned[1]);
                    return CLI_EXIT_USAGE;
                }
            }
            if (backend)
                o.n_backends = count;
            else
                o.n_tokens = count;
            done = count > 0;
        } else if (!strcmp(f, "--device") && v) {
            o.device = v, done = 1;
        } else if (!strcmp(f, "--set") && v && n_sets < BENCH_MAX_LIST) {
            sets[n_sets++] = v, done = 1;
        }
        for (size_t j = 0; !done && j < sizeof ints / sizeof ints[0]; j++)
            if (!strcmp(f, ints[j].flag)) {
                if (parse_int(f, v, 1, ints[j].hi, &x)) {
                    free(lists_owned[0]), free(lists_owned[1]);
                    return CLI_EXIT_USAGE;
                }
                *ints[j].dst = (int32_t)x, done = 1;
            }
        if (!done) {
            fprintf(stderr, "dsarl bench dsa: error: unknown option or missing value '%s'; see --help\n", f);
            free(lists_owned[0]), free(lists_owned[1]);
            return CLI_EXIT_USAGE;
        }
    }
    int bad = o.d_v > o.d_qk;
    for (int i = 0; i < o.n_tokens; i++)
        bad |= o.topk > o.tokens[i];
    if (bad) {
        fprintf(stderr, "dsarl bench dsa: error: needs --topk <= every --tokens value and --d-v <= --d-qk\n");
        free(lists_owned[0]), free(lists_owned[1]);
        return CLI_EXIT_USAGE;
    }
    bench b = {0};
    dsarl_recipe *keys = NULL; // the --set keys, read by the device's and the backends' create
    int rc = dsarl_recipe_load_string("{}\n", "dsarl bench dsa --set", &keys, &b.err);
    for (int i = 0; rc == 0 && i < n_sets; i++) {
        char arg[512];
        snprintf(arg, sizeof arg, "++%s", sets[i]);
        rc = dsarl_recipe_override(keys, arg, i + 1, &b.err);
    }
    dsarl_registry *reg = NULL;
    const dsarl_ops_common *dev_c = NULL;
    const dsarl_dsa_ops *dsa_ops[BENCH_MAX_LIST] = {0};
    dsarl_dsa_context *dsa[BENCH_MAX_LIST] = {0};
    dsarl_session session = {0}; // the device alone: the backends compared are created below, one per --backend
    if (rc == 0)
        rc = cli_open_registry(NULL, opts, &reg, &b.err);
    // defaults by capability and rank: the highest-ranked CUDA device that runs here (timing uses CUDA events),
    // and the highest-ranked backend that runs on it
    if (rc == 0)
        rc = cli_choose_device(reg, "dsarl bench dsa", DSARL_DEVICE_CAP_CUDA, &o.device, &dev_c, &b.err);
    if (rc == 0 && o.n_backends == 0) {
        const dsarl_ops_common *best = NULL;
        rc = cli_choose_dsa(reg, "dsarl bench dsa", dev_c, &o.backends[0], &best, &b.err);
        o.n_backends = rc == 0;
    }
    for (int i = 0; rc == 0 && i < o.n_backends; i++) {
        const dsarl_ops_common *dsa_c = NULL;
        rc = dsarl_registry_require(reg, DSARL_KIND_DSA, o.backends[i], "dsarl bench dsa --backend", &dsa_c, &b.err);
        dsa_ops[i] = (const dsarl_dsa_ops *)dsa_c;
    }
    if (rc == 0) {
        b.d = (const dsarl_device_ops *)dev_c;
        dsarl_session_config sc = {.struct_size = sizeof(sc), .host = dsarl_registry_host(reg),
                                   .recipe = dsarl_recipe_root(keys), .device_ops = b.d};
        rc = dsarl_session_open(&sc, &session, &b.err);
        b.dev = session.device;
    }
    for (int i = 0; rc == 0 && i < o.n_backends; i++)
        rc = dsa_ops[i]->create(b.d, b.dev, dsarl_recipe_root(keys), &dsa[i], &b.err);
    double ceiling = 0.0;
    if (rc == 0) {
        load_events(&b.ev);
        b.flush_bytes = (size_t)256 << 20;
        rc = b.d->alloc(b.dev, b.flush_bytes, &b.flush, &b.err);
    }
    if (rc == 0)
        rc = bench_ceilings(&b, &o, &ceiling);
    for (int t = 0; rc == 0 && t < o.n_tokens; t++)
        for (int i = 0; rc == 0 && i < o.n_backends; i++) {
            b.dsa_ops = dsa_ops[i], b.dsa = dsa[i];
            rc = bench_shape(&b, &o, o.backends[i], o.tokens[t], ceiling);
        }
    if (b.flush)
        b.d->free(b.dev, b.flush);
    for (int i = 0; i < o.n_backends; i++)
        if (dsa[i])
            dsa_ops[i]->destroy(dsa[i]);
    dsarl_session_close(&session);
    dsarl_registry_free(reg);
    dsarl_recipe_free(keys);
    free(lists_owned[0]), free(lists_owned[1]);
    return rc ? cli_fail(&b.err) : CLI_EXIT_OK;
}
