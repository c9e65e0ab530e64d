/* The cudnn backend's ops table: every slot of dsarl_dsa_ops, ABI 1.1 included; `routes` says which engine serves
 * each op (cuDNN graph or hand-over to tilelang). */
#include "cudnn_dsa.h"

static void describe_cudnn(void (*emit)(void *ctx, const char *line), void *ctx)
{
    emit(ctx, "cuDNN 9.19 backend-API graphs on the cuda device (bf16, fp32 softmax), plans cached by shape; "
              "hand-overs to the tilelang kernels where cuDNN has no route (see routes)");
}

const dsarl_dsa_ops dsarl_dsa_cudnn_ops = {
    .device_requires = DSARL_DEVICE_CAP_CUDA,
    .common = {.struct_size = (uint32_t)sizeof(dsarl_dsa_ops),
               .kind = DSARL_KIND_DSA,
               .name = "cudnn",
               .rank = DSARL_RANK_SECONDARY,
               .description = "DeepSeek Sparse Attention through cuDNN graphs (fused SDPA fwd/bwd, paged gather), "
                              "tilelang for the rest",
               .keys = NULL, /* the model owns index_topk and the softmax scale */
               .n_keys = 0,
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
