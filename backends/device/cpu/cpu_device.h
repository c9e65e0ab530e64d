/* cpu_device.h: the CPU device plugin's internals (float32 host memory; OpenBLAS for GEMMs).
 *
 * Every entry of dsarl_cpu_device_ops is implemented here with plain loops over float32; the functions are
 * exported from the object library so tests can call them without dlopen. */
#ifndef DSARL_CPU_DEVICE_H
#define DSARL_CPU_DEVICE_H

#include "dsarl/ops/device.h"

struct dsarl_device {
    int32_t threads; /* OpenBLAS threads */
    uint64_t seed;
};

/* The registered table (kind device, name "cpu"). */
extern const dsarl_device_ops dsarl_cpu_device_ops;

/* Memory and lifetime (cpu_memory.c). */
int cpu_create(const dsarl_device_config *config, dsarl_device **out, dsarl_error *err);
void cpu_destroy(dsarl_device *dev);
dsarl_dtype cpu_storage_dtype(const dsarl_device *dev);
int cpu_alloc(dsarl_device *dev, size_t bytes, void **out, dsarl_error *err);
void cpu_free(dsarl_device *dev, void *ptr);
int cpu_copy(dsarl_device *dev, void *dst, const void *src, size_t bytes, dsarl_copy_kind kind, dsarl_error *err);
int cpu_zero(dsarl_device *dev, void *ptr, size_t bytes, dsarl_error *err);
int cpu_synchronize(dsarl_device *dev, dsarl_error *err);
int cpu_upload_f32(dsarl_device *dev, void *dst, dsarl_dtype dtype, const float *src, size_t n, dsarl_error *err);
int cpu_download_f32(dsarl_device *dev, float *dst, const void *src, dsarl_dtype dtype, size_t n, dsarl_error *err);
/* ABI 1.7 memory_info: total = the machine's physical memory, free = /proc/meminfo's MemAvailable (else the free
 * pages sysconf counts). */
int cpu_memory_info(dsarl_device *dev, size_t *free_bytes, size_t *total_bytes, dsarl_error *err);

/* GEMMs through cblas_sgemm (cpu_gemm.c). */
int cpu_gemm(dsarl_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
             const void *a, const void *b, float beta, void *c, dsarl_error *err);
int cpu_gemm_strided_batched(dsarl_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                             float alpha, const void *a, int64_t stride_a, const void *b, int64_t stride_b,
                             float beta, void *c, int64_t stride_c, int64_t batch, dsarl_error *err);
/* float32 output GEMM and dtype conversion (dsarl/ops/device.h): on the CPU storage is float32 already. */
int cpu_gemm_f32out(dsarl_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const void *a, const void *b, float beta, float *c, dsarl_error *err);
int cpu_convert(dsarl_device *dev, void *dst, dsarl_dtype dst_dtype, const void *src, dsarl_dtype src_dtype,
                int64_t n, float alpha, dsarl_error *err);

/* Copies, adds, embedding, SwiGLU (cpu_elementwise.c). */
int cpu_copy_2d(dsarl_device *dev, void *dst, int64_t dst_stride, const void *src, int64_t src_stride, int64_t rows,
                int64_t cols, dsarl_error *err);
int cpu_add(dsarl_device *dev, void *out, const void *a, const void *b, int64_t n, dsarl_error *err);
int cpu_axpy(dsarl_device *dev, int64_t n, float alpha, const void *x, void *y, dsarl_error *err);
int cpu_embedding_forward(dsarl_device *dev, void *out, const int32_t *tokens, const void *wte, int64_t T,
                          int64_t C, int64_t V, dsarl_error *err);
int cpu_embedding_backward(dsarl_device *dev, void *dwte, const void *dout, const int32_t *tokens, int64_t T,
                           int64_t C, dsarl_error *err);
int cpu_swiglu_forward(dsarl_device *dev, void *out, const void *inp, int64_t T, int64_t inner, dsarl_error *err);
int cpu_swiglu_backward(dsarl_device *dev, void *dinp, const void *dout, const void *inp, int64_t T, int64_t inner,
                        dsarl_error *err);

/* Norms (cpu_norm.c). */
int cpu_rmsnorm_forward(dsarl_device *dev, void *out, float *rstd, const void *inp, const void *weight, int64_t T,
                        int64_t C, float eps, dsarl_error *err);
int cpu_rmsnorm_backward(dsarl_device *dev, void *dinp, void *dweight, const void *dout, const void *inp,
                         const void *weight, const float *rstd, int64_t T, int64_t C, dsarl_error *err);
int cpu_layernorm_forward(dsarl_device *dev, void *out, float *mean, float *rstd, const void *inp, const void *weight,
                          const void *bias, int64_t T, int64_t C, float eps, dsarl_error *err);
int cpu_layernorm_backward(dsarl_device *dev, void *dinp, void *dweight, void *dbias, const void *dout,
                           const void *inp, const void *weight, const float *mean, const float *rstd, int64_t T,
                           int64_t C, dsarl_error *err);

/* RoPE (cpu_rope.c). */
int cpu_rope_forward(dsarl_device *dev, void *out, const void *inp, const int32_t *positions, const float *inv_freq,
                     float attention_scaling, int64_t T, int64_t H, int64_t token_stride, int64_t head_stride,
                     int64_t rope_dim, dsarl_error *err);
int cpu_rope_backward(dsarl_device *dev, void *dinp, const void *dout, const int32_t *positions,
                      const float *inv_freq, float attention_scaling, int64_t T, int64_t H, int64_t token_stride,
                      int64_t head_stride, int64_t rope_dim, dsarl_error *err);

/* MoE routing, permutation (cpu_moe.c). */
int cpu_moe_route_forward(dsarl_device *dev, int32_t *indices, float *weights, float *probs, const float *logits,
                          const float *bias, int64_t T, int64_t E, int32_t top_k, int32_t n_group,
                          int32_t topk_group, bool norm_topk_prob, float scaling, dsarl_error *err);
int cpu_moe_route_backward(dsarl_device *dev, float *dlogits, const float *dweights, const int32_t *indices,
                           const float *probs, int64_t T, int64_t E, int32_t top_k, bool norm_topk_prob,
                           float scaling, dsarl_error *err);
/* ABI 1.7: routed (token, slot) pairs grouped by expert, pad rows each (dsarl/ops/device.h's spec); index values
 * outside [0, E) are refused. */
int cpu_moe_group_padded(dsarl_device *dev, int32_t *rows, int32_t *slot, int32_t *slot_inv, const int32_t *indices,
                         int64_t T, int64_t E, int32_t top_k, int64_t pad, dsarl_error *err);
int cpu_gather_rows(dsarl_device *dev, void *out, const void *inp, const int32_t *rows, int64_t n, int64_t C,
                    dsarl_error *err);
int cpu_scatter_add_rows(dsarl_device *dev, void *out, const void *inp, const int32_t *rows, const float *scale,
                         int64_t n, int64_t C, dsarl_error *err);
int cpu_scale_rows(dsarl_device *dev, void *x, const float *scale, int64_t n, int64_t C, dsarl_error *err);
int cpu_row_dot(dsarl_device *dev, float *out, const void *a, const void *b, int64_t n, int64_t C,
                dsarl_error *err);

/* Log-probabilities (cpu_logprobs.c). */
int cpu_logprobs_forward(dsarl_device *dev, float *logprobs, const float *logits, const int32_t *targets, int64_t T,
                         int64_t V, dsarl_error *err);
int cpu_logprobs_backward(dsarl_device *dev, float *dlogits, const float *dlogprobs, const float *logits,
                          const int32_t *targets, int64_t T, int64_t V, dsarl_error *err);

int cpu_sum_squares(dsarl_device *dev, float *out, const void *x, int64_t n, dsarl_error *err);
int cpu_scale(dsarl_device *dev, void *x, float alpha, int64_t n, dsarl_error *err);
int cpu_adamw_update(dsarl_device *dev, float *master, void *weight, const void *grad, float *m, float *v, int64_t n,
                     float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale, int64_t step,
                     dsarl_error *err);
int cpu_sample_tokens(dsarl_device *dev, int32_t *tokens, const float *logits, int64_t T, int64_t V,
                      float temperature, uint64_t seed, uint64_t stream, dsarl_error *err);
/* ABI 1.5 sample_filtered (cpu_sample.c): dsarl_sampling_filter_row, then sample_tokens and logprobs_forward per
 * row, so the draw equals the host-filtering engine's bit for bit. */
int cpu_sample_filtered(dsarl_device *dev, int32_t *tokens, float *logprobs, float *logits, int64_t T, int64_t V,
                        float temperature, int32_t top_k, float top_p, uint64_t seed, const uint64_t *streams,
                        dsarl_error *err);

/* Collectives on a process group (cpu_comm.c): the core's MPI host collectives. */
int cpu_all_reduce(dsarl_device *dev, const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype,
                   dsarl_reduce_op op, dsarl_error *err);
int cpu_all_gather(dsarl_device *dev, const dsarl_group *g, void *out, const void *in, int64_t n, dsarl_dtype dtype,
                   dsarl_error *err);
int cpu_reduce_scatter(dsarl_device *dev, const dsarl_group *g, void *out, const void *in, int64_t n,
                       dsarl_dtype dtype, dsarl_reduce_op op, dsarl_error *err);
int cpu_all_to_all(dsarl_device *dev, const dsarl_group *g, void *out, const int64_t *recv_counts, const void *in,
                   const int64_t *send_counts, dsarl_dtype dtype, dsarl_error *err);
int cpu_broadcast(dsarl_device *dev, const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype, int32_t root,
                  dsarl_error *err);
int cpu_send(dsarl_device *dev, const dsarl_group *g, const void *buf, int64_t n, dsarl_dtype dtype, int32_t peer,
             dsarl_error *err);
int cpu_recv(dsarl_device *dev, const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype, int32_t peer,
             dsarl_error *err);

#endif /* DSARL_CPU_DEVICE_H */
