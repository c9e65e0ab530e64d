/* cuda_ops.c: the CUDA device ops table. Every slot of dsarl_device_ops is implemented; the slots that queue GPU
 * work go through cuda_profile.h's wrappers (one branch when runtime.cuda_profile is false), except the collectives
 * (cuda_comm.c), whose time depends on the peers more than on this GPU. */
#include "cuda_device.h"
#include "cuda_profile.h"
#include <cuda_runtime_api.h>
#include <stdio.h>

// A GPU is usable when the runtime loads and counts at least one (CUDA_VISIBLE_DEVICES applied).
static bool cuda_available(char *why, size_t why_size)
{
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess || count == 0) {
        snprintf(why, why_size, "no usable GPU (%s)", rc != cudaSuccess ? cudaGetErrorString(rc) : "none visible");
        return false;
    }
    snprintf(why, why_size, "%d GPU%s visible", count, count == 1 ? "" : "s");
    return true;
}

static void describe_cuda(void (*emit)(void *ctx, const char *line), void *ctx)
{
    emit(ctx, "storage bf16 (runtime.cuda_storage_dtype=f32: float32), fp32 math and accumulation; statistics, "
              "log-probs, optimizer state in fp32");
    emit(ctx, "gemm: cuBLASLt (bf16 in/out, fp32 compute), cuBLAS fallback; every other op: a CUDA kernel");
    emit(ctx, "GPU = local rank modulo the visible GPUs; a compute stream (stream(): DSA kernels queue on it) and a "
              "copy stream");
    emit(ctx, "collectives: NCCL, one communicator per process group made at its first collective (one GPU per "
              "rank), on the compute stream");
    emit(ctx, "gemm_grouped: a cuBLASLt GEMM per group over four streams (runtime.cuda_grouped_gemm=auto: one sm_90 "
              "wgmma kernel over all groups for the products it runs faster)");
    emit(ctx, "runtime.cuda_profile=false (true: per-op and per op-class (profile_scope) GPU times at destroy)");
}

static const dsarl_key_spec cuda_keys[] = {
    {.path = "runtime.cuda_storage_dtype", .type = DSARL_KEY_STRING, .default_value = "bf16",
     .doc = "storage of activations and parameters on the cuda device: bf16, or f32 to check a model against the cpu"},
    {.path = "runtime.cuda_grouped_gemm", .type = DSARL_KEY_STRING, .default_value = "lanes",
     .doc = "gemm_grouped (MoE expert products): lanes (one cuBLASLt GEMM per expert over four streams, as the "
             "decode step's products) | auto (the sm_90 wgmma kernel for the products it runs faster, the lanes for "
             "the rest) | wgmma (the kernel wherever it applies: bf16, dims in 64s)"},
    {.path = "runtime.cuda_profile", .type = DSARL_KEY_BOOL, .default_value = "false",
     .doc = "time every device op and op class (the model's profile scopes) on the GPU and print the tables "
             "(largest first) to stderr at destroy"},
};

const dsarl_device_ops dsarl_cuda_device_ops = {
    .capabilities = DSARL_DEVICE_CAP_CUDA | DSARL_DEVICE_CAP_LAUNCH_BOUND,
    .available = cuda_available,
    .common = {.struct_size = (uint32_t)sizeof(dsarl_device_ops),
               .kind = DSARL_KIND_DEVICE,
               .name = "cuda",
               .rank = DSARL_RANK_PRIMARY,
               .description = "NVIDIA GPU: bf16 storage, cuBLASLt GEMMs, CUDA kernels for the layer primitives",
               .keys = cuda_keys, /* the GPU itself comes from the parallel layout */
               .n_keys = DSARL_ARRAY_LEN(cuda_keys),
               .describe = describe_cuda},
    .create = cuda_create,
    .destroy = cuda_destroy,
    .storage_dtype = cuda_storage_dtype,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_prof_copy,
    .zero = cuda_prof_zero,
    .synchronize = cuda_synchronize,
    .upload_f32 = cuda_upload_f32,
    .download_f32 = cuda_download_f32,
    .gemm = cuda_prof_gemm,
    .gemm_strided_batched = cuda_prof_gemm_strided_batched,
    .copy_2d = cuda_prof_copy_2d,
    .add = cuda_prof_add,
    .axpy = cuda_prof_axpy,
    .embedding_forward = cuda_prof_embedding_forward,
    .embedding_backward = cuda_prof_embedding_backward,
    .rmsnorm_forward = cuda_prof_rmsnorm_forward,
    .rmsnorm_backward = cuda_prof_rmsnorm_backward,
    .layernorm_forward = cuda_prof_layernorm_forward,
    .layernorm_backward = cuda_prof_layernorm_backward,
    .rope_forward = cuda_prof_rope_forward,
    .rope_backward = cuda_prof_rope_backward,
    .swiglu_forward = cuda_prof_swiglu_forward,
    .swiglu_backward = cuda_prof_swiglu_backward,
    .moe_route_forward = cuda_prof_moe_route_forward,
    .moe_route_backward = cuda_prof_moe_route_backward,
    .gather_rows = cuda_prof_gather_rows,
    .scatter_add_rows = cuda_prof_scatter_add_rows,
    .scale_rows = cuda_prof_scale_rows,
    .row_dot = cuda_prof_row_dot,
    .logprobs_forward = cuda_prof_logprobs_forward,
    .logprobs_backward = cuda_prof_logprobs_backward,
    .sum_squares = cuda_prof_sum_squares,
    .scale = cuda_prof_scale,
    .sample_tokens = cuda_prof_sample_tokens,
    .adamw_update = cuda_prof_adamw_update,
    .gemm_f32out = cuda_prof_gemm_f32out,
    .convert = cuda_prof_convert,
    .sample_filtered = cuda_prof_sample_filtered,
    .moe_group_padded = cuda_prof_moe_group_padded, /* ABI 1.7 */
    .stream = cuda_stream, /* ABI 1.2 */
    /* ABI 1.3: collectives on NCCL (cuda_comm.c) */
    .all_reduce = cuda_all_reduce,
    .all_gather = cuda_all_gather,
    .reduce_scatter = cuda_reduce_scatter,
    .all_to_all = cuda_all_to_all,
    .broadcast = cuda_broadcast,
    .send = cuda_send,
    .recv = cuda_recv,
    .profile_scope = cuda_profile_scope, /* ABI 1.7: op classes of runtime.cuda_profile */
    .memory_info = cuda_memory_info,     /* ABI 1.7 */
    .gemm_grouped = cuda_prof_gemm_grouped, /* ABI 1.7 */
};
