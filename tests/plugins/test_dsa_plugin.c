/* test_dsa_plugin.c: an out-of-tree DSA backend built the way a third party would (installed headers only), with
 * one mandatory slot left NULL per build (-DTEST_NULL_LOSS: indexer_loss_forward, -DTEST_NULL_CREATE: create). The
 * loader must refuse it at registration with one line naming the file, kind, table and slot; before that check
 * such a table was listed as usable and the run died on the NULL call. The ops are never called. */
#include "dsarl/ops/dsa.h"

static int t_create(const dsarl_device_ops *device_ops, dsarl_device *dev, const dsarl_node *recipe,
                    dsarl_dsa_context **out, dsarl_error *err)
{
    (void)device_ops, (void)dev, (void)recipe;
    *out = NULL;
    return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "test_dsa_plugin: create is never meant to run");
}

static void t_destroy(dsarl_dsa_context *ctx) { (void)ctx; }

static int t_topk(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, const dsarl_dsa_indexer_inputs *in,
                  int32_t topk, int32_t *indices, float *scores, dsarl_error *err)
{
    (void)ctx, (void)batch, (void)in, (void)topk, (void)indices, (void)scores;
    return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "not implemented");
}

static int t_fwd(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, const dsarl_dsa_attention_inputs *in,
                 const int32_t *indices, int32_t topk, void *out, float *lse, dsarl_error *err)
{
    (void)ctx, (void)batch, (void)in, (void)indices, (void)topk, (void)out, (void)lse;
    return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "not implemented");
}

static int t_bwd(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, const dsarl_dsa_attention_inputs *in,
                 const int32_t *indices, int32_t topk, const void *out, const float *lse, const void *dout, void *dq,
                 void *dkv, dsarl_error *err)
{
    (void)ctx, (void)batch, (void)in, (void)indices, (void)topk, (void)out, (void)lse, (void)dout, (void)dq,
        (void)dkv;
    return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "not implemented");
}

static int t_loss(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, const dsarl_dsa_attention_inputs *attn,
                  const float *lse, const dsarl_dsa_indexer_inputs *indexer, const int32_t *indices, int32_t topk,
                  float *loss, dsarl_error *err)
{
    (void)ctx, (void)batch, (void)attn, (void)lse, (void)indexer, (void)indices, (void)topk, (void)loss;
    return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "not implemented");
}

static int t_loss_bwd(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, const dsarl_dsa_attention_inputs *attn,
                      const float *lse, const dsarl_dsa_indexer_inputs *indexer, const int32_t *indices, int32_t topk,
                      const float *dloss, void *dq_index, void *dk_index, float *dweights, dsarl_error *err)
{
    (void)ctx, (void)batch, (void)attn, (void)lse, (void)indexer, (void)indices, (void)topk, (void)dloss,
        (void)dq_index, (void)dk_index, (void)dweights;
    return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "not implemented");
}

#ifdef TEST_NULL_CREATE
#define CREATE NULL
#else
#define CREATE t_create
#endif
#ifdef TEST_NULL_LOSS
#define LOSS NULL
#else
#define LOSS t_loss
#endif

static const dsarl_dsa_ops test_dsa = {
    .common = DSARL_OPS_COMMON_NOKEYS(dsarl_dsa_ops, DSARL_KIND_DSA, "nullslot", "DSA backend missing one op"),
    .create = CREATE,
    .destroy = t_destroy,
    .indexer_topk = t_topk,
    .sparse_mla_forward = t_fwd,
    .sparse_mla_backward = t_bwd,
    .indexer_loss_forward = LOSS,
    .indexer_loss_backward = t_loss_bwd,
};

static int test_init(const dsarl_host *host, dsarl_error *err)
{
    (void)t_create, (void)t_loss; /* one of them is left out of the table */
    return host->register_ops(host, DSARL_KIND_DSA, &test_dsa.common, err);
}

DSARL_PLUGIN_DEFINE("dsa-nullslot", "0.0.1", "DSA backend with a NULL mandatory op (loader test)", test_init)
