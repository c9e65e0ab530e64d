/* cpu_ops.c: the CPU device ops table. */
#include "cpu_device.h"

static const dsarl_key_spec cpu_keys[] = {
    {.path = "runtime.threads", .type = DSARL_KEY_INT, .default_value = "0",
     .doc = "CPU threads for OpenBLAS and host math; 0 = one"},
};

const dsarl_device_ops dsarl_cpu_device_ops = {
    .common = DSARL_OPS_COMMON(dsarl_device_ops, DSARL_KIND_DEVICE, "cpu",
                               "float32 host memory, OpenBLAS GEMMs, plain-loop layer primitives", cpu_keys),
    .create = cpu_create,
    .destroy = cpu_destroy,
    .storage_dtype = cpu_storage_dtype,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .synchronize = cpu_synchronize,
    .upload_f32 = cpu_upload_f32,
    .download_f32 = cpu_download_f32,
    .gemm = cpu_gemm,
    .gemm_strided_batched = cpu_gemm_strided_batched,
    .copy_2d = cpu_copy_2d,
    .add = cpu_add,
    .axpy = cpu_axpy,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .moe_route_forward = cpu_moe_route_forward,
    .moe_route_backward = cpu_moe_route_backward,
    .gather_rows = cpu_gather_rows,
    .scatter_add_rows = cpu_scatter_add_rows,
    .row_dot = cpu_row_dot,
    .logprobs_forward = cpu_logprobs_forward,
    .logprobs_backward = cpu_logprobs_backward,
};
