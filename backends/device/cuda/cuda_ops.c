/* cuda_ops.c: the CUDA device ops table. Every slot of dsarl_device_ops is implemented. */
#include "cuda_device.h"

static void describe_cuda(void (*emit)(void *ctx, const char *line), void *ctx)
{
    emit(ctx, "storage bf16 (runtime.cuda_storage_dtype=f32: float32), fp32 math and accumulation; statistics, "
              "log-probs, optimizer state in fp32");
    emit(ctx, "gemm: cuBLASLt (bf16 in/out, fp32 compute), cuBLAS fallback; every other op: a CUDA kernel");
    emit(ctx, "GPU = local rank modulo the visible GPUs; a compute stream and a copy stream");
}

static const dsarl_key_spec cuda_keys[] = {
    {.path = "runtime.cuda_storage_dtype", .type = DSARL_KEY_STRING, .default_value = "bf16",
     .doc = "storage of activations and parameters on the cuda device: bf16, or f32 to check a model against the cpu"},
};

const dsarl_device_ops dsarl_cuda_device_ops = {
    .common = {.struct_size = (uint32_t)sizeof(dsarl_device_ops),
               .kind = DSARL_KIND_DEVICE,
               .name = "cuda",
               .description = "NVIDIA GPU: bf16 storage, cuBLASLt GEMMs, CUDA kernels for the layer primitives",
               .keys = cuda_keys, /* the GPU itself comes from the parallel layout */
               .n_keys = DSARL_ARRAY_LEN(cuda_keys),
               .describe = describe_cuda},
    .create = cuda_create,
    .destroy = cuda_destroy,
    .storage_dtype = cuda_storage_dtype,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .zero = cuda_zero,
    .synchronize = cuda_synchronize,
    .upload_f32 = cuda_upload_f32,
    .download_f32 = cuda_download_f32,
    .gemm = cuda_gemm,
    .gemm_strided_batched = cuda_gemm_strided_batched,
    .copy_2d = cuda_copy_2d,
    .add = cuda_add,
    .axpy = cuda_axpy,
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .layernorm_forward = cuda_layernorm_forward,
    .layernorm_backward = cuda_layernorm_backward,
    .rope_forward = cuda_rope_forward,
    .rope_backward = cuda_rope_backward,
    .swiglu_forward = cuda_swiglu_forward,
    .swiglu_backward = cuda_swiglu_backward,
    .moe_route_forward = cuda_moe_route_forward,
    .moe_route_backward = cuda_moe_route_backward,
    .gather_rows = cuda_gather_rows,
    .scatter_add_rows = cuda_scatter_add_rows,
    .scale_rows = cuda_scale_rows,
    .row_dot = cuda_row_dot,
    .logprobs_forward = cuda_logprobs_forward,
    .logprobs_backward = cuda_logprobs_backward,
    .sum_squares = cuda_sum_squares,
    .scale = cuda_scale,
    .sample_tokens = cuda_sample_tokens,
    .adamw_update = cuda_adamw_update,
    .gemm_f32out = cuda_gemm_f32out,
    .convert = cuda_convert,
};
