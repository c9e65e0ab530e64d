/* The reference backend's ops table: every slot of dsarl_dsa_ops is implemented, the ABI 1.1 per-head form too.
 * It prefers the absorbed form (its preferred_form always answers so); the model can still force the per-head one
 * (dsa_attention_form: headwise), which is how the per-head path is tested on the cpu device. No routes: every op
 * runs this file's plain C. */
#include "dsa_reference.h"

// One line per op for `dsarl plugins`, saying how each is computed.
static void describe_reference(void (*emit)(void *ctx, const char *line), void *ctx) {
    emit(ctx, "all ops: plain C on the cpu device, float32 storage, double accumulation (the numerical oracle)");
    emit(ctx, "indexer_topk: exact scores of every eligible key, heap selection, descending order, ties to the "
              "lower index");
    emit(ctx, "preferred_form: absorbed; headwise_attention_forward/backward: served too (per-head keys/values)");
}

dsarl_dsa_form dsa_reference_preferred_form(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, int32_t topk) {
    (void)ctx, (void)batch, (void)topk;
    return DSARL_DSA_FORM_ABSORBED;
}

const dsarl_dsa_ops dsarl_dsa_reference_ops = {
    .device_requires = DSARL_DEVICE_CAP_HOST_MEMORY,
    .common = {.struct_size = (uint32_t)sizeof(dsarl_dsa_ops),
               .kind = DSARL_KIND_DSA,
               .name = "reference",
               .rank = DSARL_RANK_FALLBACK,
               .description = "DeepSeek Sparse Attention in plain C (float32, double accumulation): the oracle",
               .keys = NULL,  // reads no recipe keys: the model owns index_topk and the softmax scale
               .n_keys = 0,
               .describe = describe_reference},
    .create = dsa_reference_create,
    .destroy = dsa_reference_destroy,
    .indexer_topk = dsa_reference_indexer_topk,
    .sparse_mla_forward = dsa_reference_sparse_mla_forward,
    .sparse_mla_backward = dsa_reference_sparse_mla_backward,
    .indexer_loss_forward = dsa_reference_indexer_loss_forward,
    .indexer_loss_backward = dsa_reference_indexer_loss_backward,
    .preferred_form = dsa_reference_preferred_form,
    .headwise_attention_forward = dsa_reference_headwise_attention_forward,
    .headwise_attention_backward = dsa_reference_headwise_attention_backward,
    .routes = NULL,
};
