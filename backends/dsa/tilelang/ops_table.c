/* The tilelang backend's ops table: every slot of dsarl_dsa_ops is implemented. */
#include "tilelang.h"

static void describe_tilelang(void (*emit)(void *ctx, const char *line), void *ctx)
{
    emit(ctx, "all ops: tiled CUDA kernels on the cuda device, bf16 operands, fp32 math and accumulation");
    emit(ctx, "indexer_topk: bf16 with 8/16/32/64 heads and 16-multiple dims: query tiles scored on mma.sync "
              "tensor cores into a chunked workspace, then an exact radix select per row (key order without scores, "
              "descending with scores); else fused row-wise scores + select; ties to the lower index");
    emit(ctx, "sparse_mla: bf16 at 576/512 on sm_90, heads in groups of 64 (a last group of 16 or more padded): "
              "wgmma kernels, one block per (query, 64 heads), the next key tile gathered while the current one "
              "computes, dkv summed over the heads in the tensor cores and added with 16-byte fp32 reductions");
    emit(ctx, "sparse_mla, other shapes: gathered KV tiles in shared memory, WMMA tensor cores for bf16 and "
              "16-multiple dims (CUDA cores otherwise), online softmax; dkv via fp32 atomics");
    char line[320];
    tilelang_settings defaults;
    tilelang_read_settings(NULL, &defaults, NULL);
    tilelang_format_settings(&defaults, line, sizeof line);
    emit(ctx, line);
}

static const dsarl_key_spec tilelang_keys[] = {TILELANG_KEY_SPECS};

const dsarl_dsa_ops dsarl_dsa_tilelang_ops = {
    .device_requires = DSARL_DEVICE_CAP_CUDA,
    .common = {.struct_size = (uint32_t)sizeof(dsarl_dsa_ops),
               .kind = DSARL_KIND_DSA,
               .name = "tilelang",
               .rank = DSARL_RANK_PRIMARY,
               .description = "DeepSeek Sparse Attention as tiled CUDA kernels (bf16, fp32 accumulation, sm_90)",
               .keys = tilelang_keys, /* the model owns index_topk and the softmax scale */
               .n_keys = DSARL_ARRAY_LEN(tilelang_keys),
               .describe = describe_tilelang},
    .create = tilelang_create,
    .destroy = tilelang_destroy,
    .indexer_topk = tilelang_indexer_topk,
    .sparse_mla_forward = tilelang_sparse_mla_forward,
    .sparse_mla_backward = tilelang_sparse_mla_backward,
    .indexer_loss_forward = tilelang_indexer_loss_forward,
    .indexer_loss_backward = tilelang_indexer_loss_backward,
};
