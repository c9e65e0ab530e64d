/* The cudnn backend's ops table: every slot of dsarl_dsa_ops, ABI 1.1 included; `routes` says which engine serves
 * each op (cuDNN graph or hand-over to tilelang). */
#include "cudnn_dsa.h"
#include "tilelang.h"

static void describe_cudnn(void (*emit)(void *ctx, const char *line), void *ctx)
{
    emit(ctx, "cuDNN 9.19 backend-API graphs on the cuda device (bf16, fp32 softmax), plans cached by shape; "
              "hand-overs to the tilelang kernels where cuDNN has no route (see routes)");
    emit(ctx, "runtime.cudnn_max_segment=" CDN_STR(CDN_MAX_SEGMENT) " runtime.cudnn_dp_workspace_cap=8589934592 "
              "runtime.cudnn_paged_forward=false (defaults; runtime.tilelang_* keys reach the hand-overs)");
}

/* Its own keys, and tilelang's: the hand-overs run tilelang's kernels with the same recipe. */
static const dsarl_key_spec cudnn_keys[] = {
    {.path = "runtime.cudnn_max_segment", .type = DSARL_KEY_INT, .default_value = CDN_STR(CDN_MAX_SEGMENT),
     .doc = "longest packed segment the headwise cuDNN graphs serve (tokens, >= 1); longer ones go absorbed"},
    {.path = "runtime.cudnn_dp_workspace_cap", .type = DSARL_KEY_INT, .default_value = "8589934592",
     .doc = "bytes of dP workspace the segments of one headwise launch may take together (>= 1)"},
    {.path = "runtime.cudnn_paged_forward", .type = DSARL_KEY_BOOL, .default_value = "false",
     .doc = "absorbed forward through cuDNN's paged graph even where tilelang's wgmma kernel is faster (measuring)"},
    TILELANG_KEY_SPECS,
};

const dsarl_dsa_ops dsarl_dsa_cudnn_ops = {
    .device_requires = DSARL_DEVICE_CAP_CUDA,
    .common = {.struct_size = (uint32_t)sizeof(dsarl_dsa_ops),
               .kind = DSARL_KIND_DSA,
               .name = "cudnn",
               .rank = DSARL_RANK_SECONDARY,
               .description = "DeepSeek Sparse Attention through cuDNN graphs (fused SDPA fwd/bwd, paged gather), "
                              "tilelang for the rest",
               .keys = cudnn_keys, /* the model owns index_topk and the softmax scale */
               .n_keys = DSARL_ARRAY_LEN(cudnn_keys),
               .describe = describe_cudnn},
    .create = cdn_create,
    .destroy = cdn_destroy,
    .indexer_topk = cdn_indexer_topk,
    .sparse_mla_forward = cdn_sparse_mla_forward,
    .sparse_mla_backward = cdn_sparse_mla_backward,
    .indexer_loss_forward = cdn_indexer_loss_forward,
    .indexer_loss_backward = cdn_indexer_loss_backward,
    .preferred_form = cdn_preferred_form,
    .headwise_attention_forward = cdn_headwise_forward,
    .headwise_attention_backward = cdn_headwise_backward,
    .routes = CDN_ROUTES,
};
