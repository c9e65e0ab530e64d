/* cuda_profile.cu: an op-level profile of the CUDA device, on with the recipe key runtime.cuda_profile=true.
 *
 * Every ops-table slot that queues GPU work goes through a wrapper here (cuda_ops.c). With profiling off the
 * wrapper is one branch and a call. With it on, a pair of events brackets the op on the compute stream and the
 * host time of the call is taken; at each synchronize (and when the event pool fills) the pairs are read back and
 * summed per label. Labels name the op, and for GEMMs the shape class (rows rounded to a power of two, columns,
 * inner size, transposes), so per-head and per-expert loops show up as such. At destroy the table is printed to
 * stderr, largest GPU time first, with the GPU time between the first and the last event of the run: what the
 * device ops do not account for there ran elsewhere (a DSA plugin's kernels on the same stream) or the GPU
 * idled (waiting for the host).
 *
 * Op classes (the profile_scope slot, ABI 1.7): the model names the class of the work it queues next
 * ("attention.core", "moe", ...; NULL: "(unscoped)"). Each change of class records one event on the compute
 * stream; the GPU timeline between two consecutive changes is the span of the class that was current, so a DSA
 * plugin's kernels, collectives and the GPU's idle time (the host preparing the next launch) inside it count to
 * it. The device ops' own bracketed time is summed per class too (ops ms): span minus ops is what ran outside the
 * device ops or idled. Scopes do not nest: a change replaces the current class, and setting the current class
 * again is no change. The class table starts at the first change; work queued before it is in the op table only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cuda_common.cuh"
#include "cuda_profile.h"

#define PROF_EVENTS 4096 /* event pairs in flight before a forced drain */
#define PROF_LABELS 512
#define PROF_LABEL_LEN 64
#define PROF_SCOPE_EVENTS CUDA_PROFILE_SCOPE_EVENTS /* scope changes in flight before a forced drain */
#define PROF_CLASSES 64

typedef struct prof_label {
    char name[PROF_LABEL_LEN];
    int64_t calls;
    double gpu_ms, host_ms;
} prof_label;

typedef struct prof_state {
    cudaEvent_t start[PROF_EVENTS], end[PROF_EVENTS];
    int label_of[PROF_EVENTS];
    int class_of[PROF_EVENTS]; /* the op class current when the op was queued, -1 before the first scope */
    int n_pending;
    prof_label labels[PROF_LABELS];
    int n_labels;
    cudaEvent_t first, last; /* the run's first and latest bracket ends */
    bool have_first;
    double dropped;
    /* op classes: the pending scope changes, each starting the span of scope_class[i] */
    cudaEvent_t scope_ev[PROF_SCOPE_EVENTS];
    int scope_class[PROF_SCOPE_EVENTS];
    int n_scope_pending;
    cudaEvent_t scope_open; /* the latest change read back: the span of open_class runs on from it */
    int open_class;         /* -1 before the first change is read back */
    cudaEvent_t scope_first, scope_end; /* the run's first change; the end mark of close */
    bool have_scope;
    int current;            /* the class of the work queued now (host order) */
    cuda_profile_class classes[PROF_CLASSES];
    int n_classes;
    double scope_total_ms;  /* the first change to the latest one read back */
    double scope_dropped;
} prof_state;

static double host_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void cuda_profile_open(dsarl_device *dev, int on)
{
    if (!on)
        return;
    prof_state *p = (prof_state *)calloc(1, sizeof(prof_state));
    if (!p)
        return;
    for (int i = 0; i < PROF_EVENTS; i++)
        if (cudaEventCreate(&p->start[i]) != cudaSuccess || cudaEventCreate(&p->end[i]) != cudaSuccess) {
            fprintf(stderr, "device cuda: runtime.cuda_profile: cannot create events; profiling off\n");
            free(p); /* the events made so far are freed with the context */
            return;
        }
    for (int i = 0; i < PROF_SCOPE_EVENTS; i++)
        if (cudaEventCreate(&p->scope_ev[i]) != cudaSuccess) {
            fprintf(stderr, "device cuda: runtime.cuda_profile: cannot create events; profiling off\n");
            free(p);
            return;
        }
    cudaEventCreate(&p->first);
    cudaEventCreate(&p->last);
    cudaEventCreate(&p->scope_open);
    cudaEventCreate(&p->scope_first);
    cudaEventCreate(&p->scope_end);
    p->classes[0].name = "(unscoped)"; /* class 0: NULL, between passes */
    p->n_classes = 1;
    p->open_class = -1;
    dev->profile = p;
}

static int label_index(prof_state *p, const char *name)
{
    for (int i = 0; i < p->n_labels; i++)
        if (!strcmp(p->labels[i].name, name))
            return i;
    if (p->n_labels == PROF_LABELS)
        return PROF_LABELS - 1; /* the last label collects the overflow */
    snprintf(p->labels[p->n_labels].name, PROF_LABEL_LEN, "%s", p->n_labels == PROF_LABELS - 1 ? "(other)" : name);
    return p->n_labels++;
}

// Reads back every pending pair (waits for the last one).
static void drain_ops(dsarl_device *dev, prof_state *p)
{
    if (!p->n_pending)
        return;
    cudaEventSynchronize(p->end[p->n_pending - 1]);
    for (int i = 0; i < p->n_pending; i++) {
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, p->start[i], p->end[i]) == cudaSuccess) {
            p->labels[p->label_of[i]].gpu_ms += ms;
            if (p->class_of[i] >= 0)
                p->classes[p->class_of[i]].ops_ms += ms;
        } else {
            p->dropped += 1;
        }
    }
    cudaEventRecord(p->last, CUDA_STREAM(dev));
    p->n_pending = 0;
}

// Reads back every pending scope change (waits for the last one): each closes the span begun by the one before
// it, the first the span open since the previous drain. The last one stays open in scope_open (its handle is
// swapped out of the pool), so the spans telescope across drains.
static void drain_scopes(prof_state *p)
{
    int n = p->n_scope_pending;
    if (!n)
        return;
    cudaEventSynchronize(p->scope_ev[n - 1]);
    for (int i = 0; i < n; i++) {
        cudaEvent_t from = i ? p->scope_ev[i - 1] : p->scope_open;
        int c = i ? p->scope_class[i - 1] : p->open_class;
        float ms = 0.0f;
        if (c < 0) // the run's first change: no span before it
            continue;
        if (cudaEventElapsedTime(&ms, from, p->scope_ev[i]) == cudaSuccess)
            p->classes[c].span_ms += ms;
        else
            p->scope_dropped += 1;
    }
    float total = 0.0f;
    if (cudaEventElapsedTime(&total, p->scope_first, p->scope_ev[n - 1]) == cudaSuccess)
        p->scope_total_ms = total;
    cudaEvent_t open = p->scope_open;
    p->scope_open = p->scope_ev[n - 1], p->scope_ev[n - 1] = open;
    p->open_class = p->scope_class[n - 1];
    p->n_scope_pending = 0;
}

void cuda_profile_drain(dsarl_device *dev)
{
    prof_state *p = (prof_state *)dev->profile;
    if (!p)
        return;
    drain_ops(dev, p);
    drain_scopes(p);
}

// The class of name: NULL is class 0; names are string literals, so the pointer usually matches.
static int class_index(prof_state *p, const char *name)
{
    if (!name)
        return 0;
    for (int i = 1; i < p->n_classes; i++)
        if (p->classes[i].name == name)
            return i;
    for (int i = 1; i < p->n_classes; i++)
        if (!strcmp(p->classes[i].name, name))
            return i;
    if (p->n_classes == PROF_CLASSES)
        return PROF_CLASSES - 1; /* the last class collects the overflow */
    p->classes[p->n_classes].name = p->n_classes == PROF_CLASSES - 1 ? "(other)" : name;
    return p->n_classes++;
}

void cuda_profile_scope(dsarl_device *dev, const char *name)
{
    prof_state *p = (prof_state *)dev->profile;
    if (!p)
        return;
    int c = class_index(p, name);
    if (p->have_scope && c == p->current)
        return;
    if (!p->have_scope && c == 0) // nothing to end before the first class
        return;
    if (p->n_scope_pending == PROF_SCOPE_EVENTS)
        drain_scopes(p);
    cudaStream_t s = CUDA_STREAM(dev);
    if (!p->have_scope) {
        cudaEventRecord(p->scope_first, s);
        p->have_scope = true;
    }
    cudaEventRecord(p->scope_ev[p->n_scope_pending], s);
    p->scope_class[p->n_scope_pending++] = c;
    p->classes[c].calls++;
    p->current = c;
}

int cuda_profile_classes(dsarl_device *dev, cuda_profile_class *out, int max, double *total_ms)
{
    prof_state *p = (prof_state *)dev->profile;
    *total_ms = 0.0;
    if (!p || !p->have_scope)
        return 0;
    cuda_profile_drain(dev);
    *total_ms = p->scope_total_ms;
    int n = p->n_classes < max ? p->n_classes : max;
    for (int i = 0; i < n; i++)
        out[i] = p->classes[i];
    return p->n_classes;
}

int cuda_profile_begin(dsarl_device *dev, double *t0)
{
    prof_state *p = (prof_state *)dev->profile;
    if (p->n_pending == PROF_EVENTS)
        drain_ops(dev, p);
    if (!p->have_first) {
        cudaEventRecord(p->first, CUDA_STREAM(dev));
        p->have_first = true;
    }
    cudaEventRecord(p->start[p->n_pending], CUDA_STREAM(dev));
    *t0 = host_ms();
    return p->n_pending;
}

void cuda_profile_end(dsarl_device *dev, int slot, double t0, const char *label)
{
    prof_state *p = (prof_state *)dev->profile;
    cudaEventRecord(p->end[slot], CUDA_STREAM(dev));
    int l = label_index(p, label);
    p->label_of[slot] = l;
    p->class_of[slot] = p->have_scope ? p->current : -1;
    p->labels[l].calls++;
    p->labels[l].host_ms += host_ms() - t0;
    p->n_pending = slot + 1;
}

static int by_gpu_time(const void *a, const void *b)
{
    double x = ((const prof_label *)a)->gpu_ms, y = ((const prof_label *)b)->gpu_ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int by_span(const void *a, const void *b)
{
    double x = ((const cuda_profile_class *)a)->span_ms, y = ((const cuda_profile_class *)b)->span_ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

// The per-class table (after the last drain): the open span is closed at a mark recorded now, so the classes
// cover the GPU timeline from the first scope change to the end of the run.
static void print_classes(dsarl_device *dev, prof_state *p)
{
    if (!p->have_scope)
        return;
    cudaEventRecord(p->scope_end, CUDA_STREAM(dev));
    cudaEventSynchronize(p->scope_end);
    float ms = 0.0f, total = 0.0f;
    if (p->open_class >= 0 && cudaEventElapsedTime(&ms, p->scope_open, p->scope_end) == cudaSuccess)
        p->classes[p->open_class].span_ms += ms;
    if (cudaEventElapsedTime(&total, p->scope_first, p->scope_end) == cudaSuccess)
        p->scope_total_ms = total;
    qsort(p->classes, (size_t)p->n_classes, sizeof(cuda_profile_class), by_span);
    double spans = 0.0, ops = 0.0;
    for (int i = 0; i < p->n_classes; i++)
        spans += p->classes[i].span_ms, ops += p->classes[i].ops_ms;
    fprintf(stderr, "cuda profile op classes (profile_scope): %.1f ms of GPU timeline from the first scope to the "
            "end, %.1f ms of it in spans; span = the GPU time between entering the class and the next change (DSA "
            "kernels, collectives and GPU idle inside it included), ops = the device ops' GPU time inside it "
            "(%.1f ms in all)\n", p->scope_total_ms, spans, ops);
    if (p->scope_dropped > 0)
        fprintf(stderr, "cuda profile: %.0f scope spans could not be timed\n", p->scope_dropped);
    fprintf(stderr, "%-32s %9s %11s %7s %11s %7s\n", "class", "calls", "span ms", "share", "ops ms", "ops %");
    for (int i = 0; i < p->n_classes; i++) {
        const cuda_profile_class *c = &p->classes[i];
        if (!c->calls && c->ops_ms == 0.0)
            continue;
        fprintf(stderr, "%-32s %9lld %11.2f %6.1f%% %11.2f %6.1f%%\n", c->name, (long long)c->calls, c->span_ms,
                p->scope_total_ms > 0 ? 100.0 * c->span_ms / p->scope_total_ms : 0.0, c->ops_ms,
                c->span_ms > 0 ? 100.0 * c->ops_ms / c->span_ms : 0.0);
    }
}

void cuda_profile_close(dsarl_device *dev)
{
    prof_state *p = (prof_state *)dev->profile;
    if (!p)
        return;
    cuda_profile_drain(dev);
    float span = 0.0f;
    if (p->have_first) {
        cudaEventRecord(p->last, CUDA_STREAM(dev));
        cudaEventSynchronize(p->last);
        cudaEventElapsedTime(&span, p->first, p->last);
    }
    qsort(p->labels, (size_t)p->n_labels, sizeof(prof_label), by_gpu_time);
    double gpu = 0.0, host = 0.0;
    for (int i = 0; i < p->n_labels; i++)
        gpu += p->labels[i].gpu_ms, host += p->labels[i].host_ms;
    fprintf(stderr, "cuda profile (runtime.cuda_profile): device ops %.1f ms on the GPU, %.1f ms of host time in "
            "their calls; %.1f ms from the first op to the end; the rest ran outside the device ops (DSA kernels) "
            "or the GPU idled\n", gpu, host, (double)span);
    fprintf(stderr, "%-56s %9s %11s %7s %11s\n", "op", "calls", "GPU ms", "GPU %", "host ms");
    for (int i = 0; i < p->n_labels && i < 60; i++)
        fprintf(stderr, "%-56s %9lld %11.2f %6.1f%% %11.2f\n", p->labels[i].name, (long long)p->labels[i].calls,
                p->labels[i].gpu_ms, span > 0 ? 100.0 * p->labels[i].gpu_ms / span : 0.0, p->labels[i].host_ms);
    print_classes(dev, p);
    for (int i = 0; i < PROF_EVENTS; i++)
        cudaEventDestroy(p->start[i]), cudaEventDestroy(p->end[i]);
    for (int i = 0; i < PROF_SCOPE_EVENTS; i++)
        cudaEventDestroy(p->scope_ev[i]);
    cudaEventDestroy(p->first), cudaEventDestroy(p->last);
    cudaEventDestroy(p->scope_open), cudaEventDestroy(p->scope_first), cudaEventDestroy(p->scope_end);
    free(p);
    dev->profile = NULL;
}

/* --- wrappers ------------------------------------------------------------------------------------------------- */

#define PROFILED(label, call)                                                                                   \
    do {                                                                                                        \
        if (!dev->profile)                                                                                      \
            return call;                                                                                        \
        double t0_;                                                                                             \
        int slot_ = cuda_profile_begin(dev, &t0_);                                                              \
        int rc_ = call;                                                                                         \
        cuda_profile_end(dev, slot_, t0_, label);                                                               \
        return rc_;                                                                                             \
    } while (0)

static int64_t pow2_ceil(int64_t x)
{
    int64_t p = 1;
    while (p < x)
        p <<= 1;
    return p;
}

static const char *gemm_label(char *buf, size_t size, const char *op, bool ta, bool tb, int64_t m, int64_t n,
                              int64_t k, int64_t batch)
{
    snprintf(buf, size, "%s%s%s m~%lld n=%lld k=%lld%s", op, ta ? " At" : "", tb ? " Bt" : "",
             (long long)pow2_ceil(m), (long long)n, (long long)k, batch > 1 ? " batched" : "");
    return buf;
}

int cuda_prof_gemm(dsarl_device *dev, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                   const void *b, float beta, void *c, dsarl_error *err)
{
    char l[PROF_LABEL_LEN];
    PROFILED(gemm_label(l, sizeof l, "gemm", ta, tb, m, n, k, 1),
             cuda_gemm(dev, ta, tb, m, n, k, alpha, a, b, beta, c, err));
}

int cuda_prof_gemm_strided_batched(dsarl_device *dev, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                                   const void *a, int64_t sa, const void *b, int64_t sb, float beta, void *c,
                                   int64_t sc, int64_t batch, dsarl_error *err)
{
    char l[PROF_LABEL_LEN];
    PROFILED(gemm_label(l, sizeof l, "gemm", ta, tb, m, n, k, batch),
             cuda_gemm_strided_batched(dev, ta, tb, m, n, k, alpha, a, sa, b, sb, beta, c, sc, batch, err));
}

int cuda_prof_gemm_f32out(dsarl_device *dev, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                          const void *a, const void *b, float beta, float *c, dsarl_error *err)
{
    char l[PROF_LABEL_LEN];
    PROFILED(gemm_label(l, sizeof l, "gemm_f32out", ta, tb, m, n, k, 1),
             cuda_gemm_f32out(dev, ta, tb, m, n, k, alpha, a, b, beta, c, err));
}

int cuda_prof_copy(dsarl_device *dev, void *dst, const void *src, size_t bytes, dsarl_copy_kind kind,
                   dsarl_error *err)
{
    PROFILED(kind == DSARL_COPY_DEVICE_TO_DEVICE ? "copy d2d" : kind == DSARL_COPY_HOST_TO_DEVICE ? "copy h2d"
                                                                                                  : "copy d2h",
             cuda_copy(dev, dst, src, bytes, kind, err));
}

int cuda_prof_zero(dsarl_device *dev, void *ptr, size_t bytes, dsarl_error *err)
{
    PROFILED("zero", cuda_zero(dev, ptr, bytes, err));
}

int cuda_prof_copy_2d(dsarl_device *dev, void *dst, int64_t ds, const void *src, int64_t ss, int64_t rows,
                      int64_t cols, dsarl_error *err)
{
    PROFILED("copy_2d", cuda_copy_2d(dev, dst, ds, src, ss, rows, cols, err));
}

int cuda_prof_add(dsarl_device *dev, void *out, const void *a, const void *b, int64_t n, dsarl_error *err)
{
    PROFILED("add", cuda_add(dev, out, a, b, n, err));
}

int cuda_prof_axpy(dsarl_device *dev, int64_t n, float alpha, const void *x, void *y, dsarl_error *err)
{
    PROFILED("axpy", cuda_axpy(dev, n, alpha, x, y, err));
}

int cuda_prof_convert(dsarl_device *dev, void *dst, dsarl_dtype dd, const void *src, dsarl_dtype sd, int64_t n,
                      float alpha, dsarl_error *err)
{
    PROFILED("convert", cuda_convert(dev, dst, dd, src, sd, n, alpha, err));
}

int cuda_prof_embedding_forward(dsarl_device *dev, void *out, const int32_t *tokens, const void *wte, int64_t T,
                                int64_t C, int64_t V, dsarl_error *err)
{
    PROFILED("embedding_forward", cuda_embedding_forward(dev, out, tokens, wte, T, C, V, err));
}

int cuda_prof_embedding_backward(dsarl_device *dev, void *dwte, const void *dout, const int32_t *tokens, int64_t T,
                                 int64_t C, dsarl_error *err)
{
    PROFILED("embedding_backward", cuda_embedding_backward(dev, dwte, dout, tokens, T, C, err));
}

int cuda_prof_rmsnorm_forward(dsarl_device *dev, void *out, float *rstd, const void *inp, const void *w, int64_t T,
                              int64_t C, float eps, dsarl_error *err)
{
    PROFILED("rmsnorm_forward", cuda_rmsnorm_forward(dev, out, rstd, inp, w, T, C, eps, err));
}

int cuda_prof_rmsnorm_backward(dsarl_device *dev, void *dinp, void *dw, const void *dout, const void *inp,
                               const void *w, const float *rstd, int64_t T, int64_t C, dsarl_error *err)
{
    PROFILED("rmsnorm_backward", cuda_rmsnorm_backward(dev, dinp, dw, dout, inp, w, rstd, T, C, err));
}

int cuda_prof_layernorm_forward(dsarl_device *dev, void *out, float *mean, float *rstd, const void *inp,
                                const void *w, const void *b, int64_t T, int64_t C, float eps, dsarl_error *err)
{
    PROFILED("layernorm_forward", cuda_layernorm_forward(dev, out, mean, rstd, inp, w, b, T, C, eps, err));
}

int cuda_prof_layernorm_backward(dsarl_device *dev, void *dinp, void *dw, void *db, const void *dout,
                                 const void *inp, const void *w, const float *mean, const float *rstd, int64_t T,
                                 int64_t C, dsarl_error *err)
{
    PROFILED("layernorm_backward",
             cuda_layernorm_backward(dev, dinp, dw, db, dout, inp, w, mean, rstd, T, C, err));
}

int cuda_prof_rope_forward(dsarl_device *dev, void *out, const void *inp, const int32_t *pos, const float *inv_freq,
                           float scaling, int64_t T, int64_t H, int64_t ts, int64_t hs, int64_t rd, dsarl_error *err)
{
    PROFILED("rope_forward", cuda_rope_forward(dev, out, inp, pos, inv_freq, scaling, T, H, ts, hs, rd, err));
}

int cuda_prof_rope_backward(dsarl_device *dev, void *dinp, const void *dout, const int32_t *pos,
                            const float *inv_freq, float scaling, int64_t T, int64_t H, int64_t ts, int64_t hs,
                            int64_t rd, dsarl_error *err)
{
    PROFILED("rope_backward", cuda_rope_backward(dev, dinp, dout, pos, inv_freq, scaling, T, H, ts, hs, rd, err));
}

int cuda_prof_swiglu_forward(dsarl_device *dev, void *out, const void *inp, int64_t T, int64_t inner,
                             dsarl_error *err)
{
    PROFILED("swiglu_forward", cuda_swiglu_forward(dev, out, inp, T, inner, err));
}

int cuda_prof_swiglu_backward(dsarl_device *dev, void *dinp, const void *dout, const void *inp, int64_t T,
                              int64_t inner, dsarl_error *err)
{
    PROFILED("swiglu_backward", cuda_swiglu_backward(dev, dinp, dout, inp, T, inner, err));
}

int cuda_prof_moe_route_forward(dsarl_device *dev, int32_t *idx, float *w, float *probs, const float *logits,
                                const float *bias, int64_t T, int64_t E, int32_t k, int32_t ng, int32_t tg, bool norm,
                                float scaling, dsarl_error *err)
{
    PROFILED("moe_route_forward",
             cuda_moe_route_forward(dev, idx, w, probs, logits, bias, T, E, k, ng, tg, norm, scaling, err));
}

int cuda_prof_moe_route_backward(dsarl_device *dev, float *dlogits, const float *dw, const int32_t *idx,
                                 const float *probs, int64_t T, int64_t E, int32_t k, bool norm, float scaling,
                                 dsarl_error *err)
{
    PROFILED("moe_route_backward",
             cuda_moe_route_backward(dev, dlogits, dw, idx, probs, T, E, k, norm, scaling, err));
}

int cuda_prof_gather_rows(dsarl_device *dev, void *out, const void *inp, const int32_t *rows, int64_t n, int64_t C,
                          dsarl_error *err)
{
    PROFILED("gather_rows", cuda_gather_rows(dev, out, inp, rows, n, C, err));
}

int cuda_prof_scatter_add_rows(dsarl_device *dev, void *out, const void *inp, const int32_t *rows,
                               const float *scale, int64_t n, int64_t C, dsarl_error *err)
{
    PROFILED("scatter_add_rows", cuda_scatter_add_rows(dev, out, inp, rows, scale, n, C, err));
}

int cuda_prof_scale_rows(dsarl_device *dev, void *x, const float *scale, int64_t n, int64_t C, dsarl_error *err)
{
    PROFILED("scale_rows", cuda_scale_rows(dev, x, scale, n, C, err));
}

int cuda_prof_row_dot(dsarl_device *dev, float *out, const void *a, const void *b, int64_t n, int64_t C,
                      dsarl_error *err)
{
    PROFILED("row_dot", cuda_row_dot(dev, out, a, b, n, C, err));
}

int cuda_prof_logprobs_forward(dsarl_device *dev, float *lp, const float *logits, const int32_t *targets, int64_t T,
                               int64_t V, dsarl_error *err)
{
    PROFILED("logprobs_forward", cuda_logprobs_forward(dev, lp, logits, targets, T, V, err));
}

int cuda_prof_logprobs_backward(dsarl_device *dev, float *dlogits, const float *dlp, const float *logits,
                                const int32_t *targets, int64_t T, int64_t V, dsarl_error *err)
{
    PROFILED("logprobs_backward", cuda_logprobs_backward(dev, dlogits, dlp, logits, targets, T, V, err));
}

int cuda_prof_sum_squares(dsarl_device *dev, float *out, const void *x, int64_t n, dsarl_error *err)
{
    PROFILED("sum_squares", cuda_sum_squares(dev, out, x, n, err));
}

int cuda_prof_scale(dsarl_device *dev, void *x, float alpha, int64_t n, dsarl_error *err)
{
    PROFILED("scale", cuda_scale(dev, x, alpha, n, err));
}

int cuda_prof_sample_tokens(dsarl_device *dev, int32_t *tokens, const float *logits, int64_t T, int64_t V,
                            float temperature, uint64_t seed, uint64_t stream, dsarl_error *err)
{
    PROFILED("sample_tokens", cuda_sample_tokens(dev, tokens, logits, T, V, temperature, seed, stream, err));
}

int cuda_prof_sample_filtered(dsarl_device *dev, int32_t *tokens, float *logprobs, float *logits, int64_t T,
                              int64_t V, float temperature, int32_t top_k, float top_p, uint64_t seed,
                              const uint64_t *streams, dsarl_error *err)
{
    PROFILED("sample_filtered", cuda_sample_filtered(dev, tokens, logprobs, logits, T, V, temperature, top_k, top_p,
                                                     seed, streams, err));
}

int cuda_prof_adamw_update(dsarl_device *dev, float *master, void *weight, const void *grad, float *m, float *v,
                           int64_t n, float lr, float b1, float b2, float eps, float wd, float gs, int64_t step,
                           dsarl_error *err)
{
    PROFILED("adamw_update", cuda_adamw_update(dev, master, weight, grad, m, v, n, lr, b1, b2, eps, wd, gs, step, err));
}

int cuda_prof_moe_group_padded(dsarl_device *dev, int32_t *rows, int32_t *slot, int32_t *slot_inv,
                               const int32_t *idx, int64_t T, int64_t E, int32_t k, int64_t pad, dsarl_error *err)
{
    PROFILED("moe_group_padded", cuda_moe_group_padded(dev, rows, slot, slot_inv, idx, T, E, k, pad, err));
}

int cuda_prof_gemm_grouped(dsarl_device *dev, bool inner, bool tb, int64_t groups, const int64_t *first, int64_t m,
                           int64_t n, int64_t k, float alpha, const void *a, const void *b, int64_t sb, float beta,
                           void *c, int64_t sc, dsarl_error *err)
{
    char l[PROF_LABEL_LEN];
    if (inner)
        snprintf(l, sizeof l, "gemm_grouped inner m=%lld n=%lld x%lld", (long long)m, (long long)n, (long long)groups);
    else
        snprintf(l, sizeof l, "gemm_grouped rows%s n=%lld k=%lld x%lld", tb ? " Bt" : "", (long long)n, (long long)k,
                 (long long)groups);
    PROFILED(l, cuda_gemm_grouped(dev, inner, tb, groups, first, m, n, k, alpha, a, b, sb, beta, c, sc, err));
}
