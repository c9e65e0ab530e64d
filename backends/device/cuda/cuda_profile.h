/* cuda_profile.h: the op-level profile of the CUDA device (cuda_profile.cu), on with runtime.cuda_profile=true: per-op
 * (and per GEMM shape class) GPU time from events around each op, host time of each call, and per op class (the
 * profile_scope slot) the GPU timeline between its scope changes, printed at destroy. */
#ifndef DSARL_CUDA_PROFILE_H
#define DSARL_CUDA_PROFILE_H

#include "cuda_device.h"

DSARL_BEGIN_DECLS

/* Turns profiling on for dev when on (runtime.cuda_profile=true). */
void cuda_profile_open(dsarl_device *dev, int on);
/* Reads back the pending event pairs (called by synchronize). */
void cuda_profile_drain(dsarl_device *dev);
/* Prints the table to stderr and frees the state (called by destroy). */
void cuda_profile_close(dsarl_device *dev);
/* The profile_scope slot (ABI 1.7): the work queued from now on belongs to op class name (a string that outlives
 * dev; NULL: "(unscoped)"). A change replaces the current class (no nesting). One branch when profiling is off. */
void cuda_profile_scope(dsarl_device *dev, const char *name);

/* Scope changes queued before a forced read-back (a wait for the GPU to reach the last of them). */
#define CUDA_PROFILE_SCOPE_EVENTS 4096

/* One op class's totals. span_ms: the GPU timeline between each change to the class and the next change (its own
 * ops, a DSA plugin's kernels, collectives, idle GPU); ops_ms: the bracketed device ops' GPU time inside it; calls:
 * the changes to it. */
typedef struct cuda_profile_class {
    const char *name;
    int64_t calls;
    double span_ms, ops_ms;
} cuda_profile_class;

/* For tests: reads back what is pending (waits for the GPU), copies the first max classes (class 0 is
 * "(unscoped)") into out and returns how many there are (0 when profiling is off or no scope was set);
 * *total_ms = the GPU time from the first scope change to the latest one. The span still open after the latest
 * change is not in them (set the scope to NULL first to close the last real one). */
int cuda_profile_classes(dsarl_device *dev, cuda_profile_class *out, int max, double *total_ms);

/* Brackets one op: begin returns the slot to pass to end with the label. */
int cuda_profile_begin(dsarl_device *dev, double *t0);
void cuda_profile_end(dsarl_device *dev, int slot, double t0, const char *label);

/* Ops-table wrappers: the cuda_* op of the same name, timed when profiling is on. */
int cuda_prof_gemm(dsarl_device *dev, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                   const void *b, float beta, void *c, dsarl_error *err);
int cuda_prof_gemm_strided_batched(dsarl_device *dev, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                                   const void *a, int64_t sa, const void *b, int64_t sb, float beta, void *c,
                                   int64_t sc, int64_t batch, dsarl_error *err);
int cuda_prof_gemm_f32out(dsarl_device *dev, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                          const void *a, const void *b, float beta, float *c, dsarl_error *err);
int cuda_prof_copy(dsarl_device *dev, void *dst, const void *src, size_t bytes, dsarl_copy_kind kind,
                   dsarl_error *err);
int cuda_prof_zero(dsarl_device *dev, void *ptr, size_t bytes, dsarl_error *err);
int cuda_prof_copy_2d(dsarl_device *dev, void *dst, int64_t ds, const void *src, int64_t ss, int64_t rows,
                      int64_t cols, dsarl_error *err);
int cuda_prof_add(dsarl_device *dev, void *out, const void *a, const void *b, int64_t n, dsarl_error *err);
int cuda_prof_axpy(dsarl_device *dev, int64_t n, float alpha, const void *x, void *y, dsarl_error *err);
int cuda_prof_convert(dsarl_device *dev, void *dst, dsarl_dtype dd, const void *src, dsarl_dtype sd, int64_t n,
                      float alpha, dsarl_error *err);
int cuda_prof_embedding_forward(dsarl_device *dev, void *out, const int32_t *tokens, const void *wte, int64_t T,
                                int64_t C, int64_t V, dsarl_error *err);
int cuda_prof_embedding_backward(dsarl_device *dev, void *dwte, const void *dout, const int32_t *tokens, int64_t T,
                                 int64_t C, dsarl_error *err);
int cuda_prof_rmsnorm_forward(dsarl_device *dev, void *out, float *rstd, const void *inp, const void *w, int64_t T,
                              int64_t C, float eps, dsarl_error *err);
int cuda_prof_rmsnorm_backward(dsarl_device *dev, void *dinp, void *dw, const void *dout, const void *inp,
                               const void *w, const float *rstd, int64_t T, int64_t C, dsarl_error *err);
int cuda_prof_layernorm_forward(dsarl_device *dev, void *out, float *mean, float *rstd, const void *inp,
                                const void *w, const void *b, int64_t T, int64_t C, float eps, dsarl_error *err);
int cuda_prof_layernorm_backward(dsarl_device *dev, void *dinp, void *dw, void *db, const void *dout,
                                 const void *inp, const void *w, const float *mean, const float *rstd, int64_t T,
                                 int64_t C, dsarl_error *err);
int cuda_prof_rope_forward(dsarl_device *dev, void *out, const void *inp, const int32_t *pos, const float *inv_freq,
                           float scaling, int64_t T, int64_t H, int64_t ts, int64_t hs, int64_t rd, dsarl_error *err);
int cuda_prof_rope_backward(dsarl_device *dev, void *dinp, const void *dout, const int32_t *pos,
                            const float *inv_freq, float scaling, int64_t T, int64_t H, int64_t ts, int64_t hs,
                            int64_t rd, dsarl_error *err);
int cuda_prof_swiglu_forward(dsarl_device *dev, void *out, const void *inp, int64_t T, int64_t inner,
                             dsarl_error *err);
int cuda_prof_swiglu_backward(dsarl_device *dev, void *dinp, const void *dout, const void *inp, int64_t T,
                              int64_t inner, dsarl_error *err);
int cuda_prof_moe_route_forward(dsarl_device *dev, int32_t *idx, float *w, float *probs, const float *logits,
                                const float *bias, int64_t T, int64_t E, int32_t k, int32_t ng, int32_t tg, bool norm,
                                float scaling, dsarl_error *err);
int cuda_prof_moe_route_backward(dsarl_device *dev, float *dlogits, const float *dw, const int32_t *idx,
                                 const float *probs, int64_t T, int64_t E, int32_t k, bool norm, float scaling,
                                 dsarl_error *err);
int cuda_prof_gather_rows(dsarl_device *dev, void *out, const void *inp, const int32_t *rows, int64_t n, int64_t C,
                          dsarl_error *err);
int cuda_prof_scatter_add_rows(dsarl_device *dev, void *out, const void *inp, const int32_t *rows,
                               const float *scale, int64_t n, int64_t C, dsarl_error *err);
int cuda_prof_scale_rows(dsarl_device *dev, void *x, const float *scale, int64_t n, int64_t C, dsarl_error *err);
int cuda_prof_row_dot(dsarl_device *dev, float *out, const void *a, const void *b, int64_t n, int64_t C,
                      dsarl_error *err);
int cuda_prof_logprobs_forward(dsarl_device *dev, float *lp, const float *logits, const int32_t *targets, int64_t T,
                               int64_t V, dsarl_error *err);
int cuda_prof_logprobs_backward(dsarl_device *dev, float *dlogits, const float *dlp, const float *logits,
                                const int32_t *targets, int64_t T, int64_t V, dsarl_error *err);
int cuda_prof_sum_squares(dsarl_device *dev, float *out, const void *x, int64_t n, dsarl_error *err);
int cuda_prof_scale(dsarl_device *dev, void *x, float alpha, int64_t n, dsarl_error *err);
int cuda_prof_sample_tokens(dsarl_device *dev, int32_t *tokens, const float *logits, int64_t T, int64_t V,
                            float temperature, uint64_t seed, uint64_t stream, dsarl_error *err);
int cuda_prof_sample_filtered(dsarl_device *dev, int32_t *tokens, float *logprobs, float *logits, int64_t T,
                              int64_t V, float temperature, int32_t top_k, float top_p, uint64_t seed,
                              const uint64_t *streams, dsarl_error *err);
int cuda_prof_adamw_update(dsarl_device *dev, float *master, void *weight, const void *grad, float *m, float *v,
                           int64_t n, float lr, float b1, float b2, float eps, float wd, float gs, int64_t step,
                           dsarl_error *err);
int cuda_prof_moe_group_padded(dsarl_device *dev, int32_t *rows, int32_t *slot, int32_t *slot_inv,
                               const int32_t *idx, int64_t T, int64_t E, int32_t k, int64_t pad, dsarl_error *err);
int cuda_prof_gemm_grouped(dsarl_device *dev, bool inner, bool tb, int64_t groups, const int64_t *first, int64_t m,
                           int64_t n, int64_t k, float alpha, const void *a, const void *b, int64_t sb, float beta,
                           void *c, int64_t sc, dsarl_error *err);

DSARL_END_DECLS

#endif /* DSARL_CUDA_PROFILE_H */
