/* cuda_device.h: the CUDA device plugin's internals (bf16 storage, fp32 math; cuBLASLt GEMMs; one kernel per op).
 *
 * Included by C (the ops table, the entry, the tests) and by the .cu files, so it holds only C declarations. Every
 * function implements the dsarl_device_ops slot of the same name (documented in dsarl/ops/device.h); they are
 * exported from the object library so tests call them without dlopen.
 *
 * Streams: `compute` runs every kernel and GEMM, `copies` runs host<->device transfers. `compute` is what the
 * stream() slot (ABI 1.2) hands out, so a DSA plugin's kernels queue in order with the device's own work. Both
 * stay blocking streams, so a 1.0/1.1 plugin that launches on the legacy default stream is still ordered. */
#ifndef DSARL_CUDA_DEVICE_H
#define DSARL_CUDA_DEVICE_H

#include "dsarl/ops/device.h"

DSARL_BEGIN_DECLS

/* A test that links the CPU device too (which defines its own struct dsarl_device) defines
 * DSARL_CUDA_DEVICE_OPAQUE and sees the CUDA instance only through pointers. */
#ifndef DSARL_CUDA_DEVICE_OPAQUE
#define CUDA_GEMM_LANES 4 /* side streams of gemm_grouped */

/* One device allocation of the caching allocator. */
typedef struct cuda_block {
    void *ptr;
    size_t bytes;
} cuda_block;

struct dsarl_device {
    int f32;                  /* 1: float32 storage (runtime.cuda_storage_dtype=f32); 0: bf16 (the default) */
    int ordinal;              /* the CUDA device this instance runs on (local rank modulo the visible count) */
    int sm_count;             /* multiprocessors, for persistent grids */
    int sm90;                 /* compute capability 9.0: the wgmma kernels run */
    int grouped_wgmma;        /* runtime.cuda_grouped_gemm: 0 lanes (default), 1 auto, 2 wgmma wherever it applies */
    void *compute;            /* cudaStream_t: kernels and GEMMs */
    void *copies;             /* cudaStream_t: host<->device transfers */
    void *copy_done;          /* cudaEvent_t: orders compute after a copy */
    void *compute_done;       /* cudaEvent_t: orders a copy after queued compute */
    void *lt;                 /* cublasLtHandle_t */
    void *blas;               /* cublasHandle_t (fallback when cuBLASLt offers no algorithm) */
    void *gemm_workspace;     /* device bytes for cuBLASLt */
    size_t gemm_workspace_bytes;
    void *scratch;            /* device scratch for reductions and fp32 accumulators (grows, never shrinks) */
    size_t scratch_bytes;
    int *flag;                /* device int: set by kernels that find a bad input (token id out of range) */
    void *host_staging;       /* host buffer for dtype conversion on upload/download */
    size_t host_staging_bytes;
    uint64_t seed;
    /* Caching allocator (cuda_memory.cu): a model pass allocates and frees the same few hundred buffers every
     * step; cudaMalloc/cudaFree (which synchronizes the device) each time cost more than the kernels. */
    struct cuda_block *live;  /* allocations handed out: pointer and rounded size */
    size_t n_live, cap_live;
    struct cuda_block *cached; /* freed blocks kept for reuse (stream-ordered: every kernel runs on `compute`) */
    size_t n_cached, cap_cached, cached_bytes;
    size_t live_bytes, peak_live_bytes; /* bytes handed out now, and their high-water mark */
    size_t peak_held_bytes;   /* high-water mark of live + cached: what the allocator held from the driver at once */
    void *gemm_algos;         /* cuda_gemm.cu: cuBLASLt algorithms by problem (direct-mapped cache) */
    void *profile;            /* cuda_profile.cu: op timings under runtime.cuda_profile=true, else NULL */
    /* NCCL (cuda_comm.c): one communicator per process group, made at the group's first collective */
    struct cuda_nccl_comm *nccl; /* (n_nccl) group -> ncclComm_t */
    size_t n_nccl, cap_nccl;
    const dsarl_group *nccl_inflight; /* group of the latest NCCL call not yet waited for (NULL: none) */
    const char *nccl_inflight_what;   /* that call's name, for the watchdog's message */
    int nccl_failed;          /* an NCCL call failed: destroy aborts the communicators instead of a clean destroy */
    int local_rank, local_size; /* this process on its host (NCCL needs one GPU per rank) */
    /* cuda_gemm.cu: the side streams gemm_grouped spreads a MoE layer's expert products over, made at its first
     * call (a product of a few hundred rows fills a fraction of the GPU; several at once fill it) */
    void *lanes[CUDA_GEMM_LANES];     /* cudaStream_t */
    void *lane_done[CUDA_GEMM_LANES]; /* cudaEvent_t: the lane's work, for compute to wait on */
    void *lane_fork;                  /* cudaEvent_t: compute's work so far, for the lanes to wait on */
    void *lane_ws[CUDA_GEMM_LANES];   /* each lane's cuBLASLt workspace (gemm_workspace_bytes) */
    int lane;                         /* where lt_matmul queues: 0 the compute stream, i lanes[i - 1] */
};
#endif

/* The collectives on NCCL (cuda_comm.c), queued on the compute stream; the slots of the same name. */
int cuda_all_reduce(dsarl_device *dev, const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype,
                    dsarl_reduce_op op, dsarl_error *err);
int cuda_all_gather(dsarl_device *dev, const dsarl_group *g, void *out, const void *in, int64_t n, dsarl_dtype dtype,
                    dsarl_error *err);
int cuda_reduce_scatter(dsarl_device *dev, const dsarl_group *g, void *out, const void *in, int64_t n,
                        dsarl_dtype dtype, dsarl_reduce_op op, dsarl_error *err);
int cuda_all_to_all(dsarl_device *dev, const dsarl_group *g, void *out, const int64_t *recv_counts, const void *in,
                    const int64_t *send_counts, dsarl_dtype dtype, dsarl_error *err);
int cuda_broadcast(dsarl_device *dev, const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype, int32_t root,
                   dsarl_error *err);
int cuda_send(dsarl_device *dev, const dsarl_group *g, const void *buf, int64_t n, dsarl_dtype dtype, int32_t peer,
              dsarl_error *err);
int cuda_recv(dsarl_device *dev, const dsarl_group *g, void *buf, int64_t n, dsarl_dtype dtype, int32_t peer,
              dsarl_error *err);
/* Waits for stream (a cudaStream_t of dev) like cudaStreamSynchronize; while NCCL work is queued, under the
 * collective watchdog and polling the communicators for an asynchronous NCCL error (then they are aborted). */
int cuda_comm_wait(dsarl_device *dev, void *stream, dsarl_error *err);
/* Destroys every communicator of dev (after waiting for its queued work); destroy calls it. */
void cuda_comm_destroy(dsarl_device *dev);

/* The registered table (kind device, name "cuda"). */
extern const dsarl_device_ops dsarl_cuda_device_ops;

/* Number of CUDA devices this process can use (0 when there is no driver or no GPU); never fails. */
int cuda_visible_devices(void);

/* Device scratch of at least bytes on dev (stream-ordered reuse: valid until the next call). */
int cuda_scratch(dsarl_device *dev, size_t bytes, void **out, dsarl_error *err);

/* Memory and lifetime (cuda_memory.cu). */
int cuda_create(const dsarl_device_config *config, dsarl_device **out, dsarl_error *err);
void cuda_destroy(dsarl_device *dev);
dsarl_dtype cuda_storage_dtype(const dsarl_device *dev);
int cuda_alloc(dsarl_device *dev, size_t bytes, void **out, dsarl_error *err);
void cuda_free(dsarl_device *dev, void *ptr);
int cuda_copy(dsarl_device *dev, void *dst, const void *src, size_t bytes, dsarl_copy_kind kind, dsarl_error *err);
int cuda_zero(dsarl_device *dev, void *ptr, size_t bytes, dsarl_error *err);
/* Free and total memory of dev's GPU, from cudaMemGetInfo (ABI 1.7). */
int cuda_memory_info(dsarl_device *dev, size_t *free_bytes, size_t *total_bytes, dsarl_error *err);
/* The compute stream (cudaStream_t) every kernel, GEMM and device-side copy of dev is queued on (ABI 1.2). */
void *cuda_stream(dsarl_device *dev);

int cuda_synchronize(dsarl_device *dev, dsarl_error *err);
int cuda_upload_f32(dsarl_device *dev, void *dst, dsarl_dtype dtype, const float *src, size_t n, dsarl_error *err);
int cuda_download_f32(dsarl_device *dev, float *dst, const void *src, dsarl_dtype dtype, size_t n,
                      dsarl_error *err);

/* GEMMs through cuBLASLt, bf16 in and out (gemm_f32out: float32 out), fp32 accumulation (cuda_gemm.cu). */
int cuda_gemm(dsarl_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const void *a, const void *b, float beta, void *c, dsarl_error *err);
int cuda_gemm_strided_batched(dsarl_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                              float alpha, const void *a, int64_t stride_a, const void *b, int64_t stride_b,
                              float beta, void *c, int64_t stride_c, int64_t batch, dsarl_error *err);
int cuda_gemm_f32out(dsarl_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                     const void *a, const void *b, float beta, float *c, dsarl_error *err);
/* The ABI 1.7 slot: a MoE layer's expert products in one call, spread over the lanes (dsarl/ops/device.h). */
/* Most groups cuda_gemm_grouped_wgmma takes in one launch (its table goes by value as a kernel argument). */
#define CUDA_GROUPED_MAX_GROUPS 256

/* gemm_grouped as one sm_90a wgmma kernel (cuda_gemm_grouped.cu) for bf16 storage with n and the reduced dim in
 * multiples of 64; *used = 0 without launching otherwise (the caller takes the cuBLASLt lanes). */
int cuda_gemm_grouped_wgmma(dsarl_device *dev, bool inner_grouped, bool trans_b, int64_t groups, const int64_t *first,
                            int64_t m, int64_t n, int64_t k, float alpha, const void *a, const void *b,
                            int64_t stride_b, float beta, void *c, int64_t stride_c, int *used, dsarl_error *err);

int cuda_gemm_grouped(dsarl_device *dev, bool inner_grouped, bool trans_b, int64_t groups, const int64_t *first,
                      int64_t m, int64_t n, int64_t k, float alpha, const void *a, const void *b, int64_t stride_b,
                      float beta, void *c, int64_t stride_c, dsarl_error *err);
/* Frees the planned GEMMs kept per problem (descriptors, layouts, algorithms) and the lanes; destroy calls it. */
void cuda_gemm_cache_free(dsarl_device *dev);

/* Copies, adds, conversions, SwiGLU (cuda_elementwise.cu). */
int cuda_copy_2d(dsarl_device *dev, void *dst, int64_t dst_stride, const void *src, int64_t src_stride,
                 int64_t rows, int64_t cols, dsarl_error *err);
int cuda_add(dsarl_device *dev, void *out, const void *a, const void *b, int64_t n, dsarl_error *err);
int cuda_axpy(dsarl_device *dev, int64_t n, float alpha, const void *x, void *y, dsarl_error *err);
int cuda_convert(dsarl_device *dev, void *dst, dsarl_dtype dst_dtype, const void *src, dsarl_dtype src_dtype,
                 int64_t n, float alpha, dsarl_error *err);
int cuda_swiglu_forward(dsarl_device *dev, void *out, const void *inp, int64_t T, int64_t inner, dsarl_error *err);
int cuda_swiglu_backward(dsarl_device *dev, void *dinp, const void *dout, const void *inp, int64_t T, int64_t inner,
                         dsarl_error *err);

/* Embedding and row permutations (cuda_rows.cu). */
int cuda_embedding_forward(dsarl_device *dev, void *out, const int32_t *tokens, const void *wte, int64_t T,
                           int64_t C, int64_t V, dsarl_error *err);
int cuda_embedding_backward(dsarl_device *dev, void *dwte, const void *dout, const int32_t *tokens, int64_t T,
                            int64_t C, dsarl_error *err);
int cuda_gather_rows(dsarl_device *dev, void *out, const void *inp, const int32_t *rows, int64_t n, int64_t C,
                     dsarl_error *err);
int cuda_scatter_add_rows(dsarl_device *dev, void *out, const void *inp, const int32_t *rows, const float *scale,
                          int64_t n, int64_t C, dsarl_error *err);
int cuda_scale_rows(dsarl_device *dev, void *x, const float *scale, int64_t n, int64_t C, dsarl_error *err);
int cuda_row_dot(dsarl_device *dev, float *out, const void *a, const void *b, int64_t n, int64_t C,
                 dsarl_error *err);

/* Norms (cuda_norm.cu). */
int cuda_rmsnorm_forward(dsarl_device *dev, void *out, float *rstd, const void *inp, const void *weight, int64_t T,
                         int64_t C, float eps, dsarl_error *err);
int cuda_rmsnorm_backward(dsarl_device *dev, void *dinp, void *dweight, const void *dout, const void *inp,
                          const void *weight, const float *rstd, int64_t T, int64_t C, dsarl_error *err);
int cuda_layernorm_forward(dsarl_device *dev, void *out, float *mean, float *rstd, const void *inp,
                           const void *weight, const void *bias, int64_t T, int64_t C, float eps, dsarl_error *err);
int cuda_layernorm_backward(dsarl_device *dev, void *dinp, void *dweight, void *dbias, const void *dout,
                            const void *inp, const void *weight, const float *mean, const float *rstd, int64_t T,
                            int64_t C, dsarl_error *err);

/* RoPE (cuda_rope.cu). */
int cuda_rope_forward(dsarl_device *dev, void *out, const void *inp, const int32_t *positions,
                      const float *inv_freq, float attention_scaling, int64_t T, int64_t H, int64_t token_stride,
                      int64_t head_stride, int64_t rope_dim, dsarl_error *err);
int cuda_rope_backward(dsarl_device *dev, void *dinp, const void *dout, const int32_t *positions,
                       const float *inv_freq, float attention_scaling, int64_t T, int64_t H, int64_t token_stride,
                       int64_t head_stride, int64_t rope_dim, dsarl_error *err);

/* MoE routing (cuda_moe.cu). */
int cuda_moe_route_forward(dsarl_device *dev, int32_t *indices, float *weights, float *probs, const float *logits,
                           const float *bias, int64_t T, int64_t E, int32_t top_k, int32_t n_group,
                           int32_t topk_group, bool norm_topk_prob, float scaling, dsarl_error *err);
int cuda_moe_route_backward(dsarl_device *dev, float *dlogits, const float *dweights, const int32_t *indices,
                            const float *probs, int64_t T, int64_t E, int32_t top_k, bool norm_topk_prob,
                            float scaling, dsarl_error *err);
/* ABI 1.7: routed pairs grouped by expert, pad rows each (dsarl/ops/device.h), the CPU device's result exactly;
 * no host sync, no allocation (capture-safe). Ids outside [0, E) get slot_inv = -1 rather than an error. */
int cuda_moe_group_padded(dsarl_device *dev, int32_t *rows, int32_t *slot, int32_t *slot_inv,
                          const int32_t *indices, int64_t T, int64_t E, int32_t top_k, int64_t pad, dsarl_error *err);

/* Log-probabilities (cuda_logprobs.cu). */
int cuda_logprobs_forward(dsarl_device *dev, float *logprobs, const float *logits, const int32_t *targets,
                          int64_t T, int64_t V, dsarl_error *err);
int cuda_logprobs_backward(dsarl_device *dev, float *dlogits, const float *dlogprobs, const float *logits,
                           const int32_t *targets, int64_t T, int64_t V, dsarl_error *err);

/* Optimizer and reductions (cuda_optim.cu); sampling (cuda_sample.cu). */
int cuda_sum_squares(dsarl_device *dev, float *out, const void *x, int64_t n, dsarl_error *err);
int cuda_scale(dsarl_device *dev, void *x, float alpha, int64_t n, dsarl_error *err);
int cuda_adamw_update(dsarl_device *dev, float *master, void *weight, const void *grad, float *m, float *v,
                      int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                      int64_t step, dsarl_error *err);
int cuda_sample_tokens(dsarl_device *dev, int32_t *tokens, const float *logits, int64_t T, int64_t V,
                       float temperature, uint64_t seed, uint64_t stream, dsarl_error *err);
/* ABI 1.5: filter (temperature, top-k, top-p), draw and score on the GPU; streams host (T). */
int cuda_sample_filtered(dsarl_device *dev, int32_t *tokens, float *logprobs, float *logits, int64_t T, int64_t V,
                         float temperature, int32_t top_k, float top_p, uint64_t seed, const uint64_t *streams,
                         dsarl_error *err);

DSARL_END_DECLS

#endif /* DSARL_CUDA_DEVICE_H */
