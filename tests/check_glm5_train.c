/* check_glm5_train.c: the training pass (train_forward + train_backward) of the glm_moe_dsa model: its log-probs
 * equal forward_logprobs bit for bit, its gradients and indexer loss equal backward's, train_backward without a
 * pending pass fails, and the backward runs no second forward: a counting DSA table around the reference backend
 * sees one attention forward per layer and one indexer top-k per full layer over a whole training step. The op
 * classes the model names through the device's profile_scope slot (a recording CPU table) cover the training step
 * and a decode step class by class, and every model op ends its class. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_device.h"
#include "dsa_reference.h"
#include "glm5_ops.h"
#include "recipe_internal.h"

static const char *recipe_text =
    "policy:\n"
    "  model_config:\n"
    "    vocab_size: 48\n    hidden_size: 16\n    intermediate_size: 24\n    moe_intermediate_size: 6\n"
    "    num_hidden_layers: 3\n    num_attention_heads: 2\n    num_key_value_heads: 2\n    q_lora_rank: 12\n"
    "    kv_lora_rank: 8\n    qk_nope_head_dim: 4\n    qk_rope_head_dim: 4\n    v_head_dim: 6\n"
    "    n_routed_experts: 8\n    num_experts_per_tok: 2\n    n_group: 2\n    topk_group: 2\n    index_topk: 3\n"
    "    index_head_dim: 8\n    index_n_heads: 3\n    first_k_dense_replace: 1\n    index_topk_pattern: FSF\n"
    "    n_shared_experts: 1\n    initializer_range: 0.35\n"
    "  megatron_cfg:\n    model_overrides:\n      dsa_indexer_loss_coeff: 0.25\n"
    "      dsa_attention_form: absorbed\n";

enum { LAYERS = 3, FULL_LAYERS = 2, V = 48, MAX_T = 40 };

// The reference backend with its attention forward and indexer top-k counted.
static int n_attention, n_topk;
static dsarl_dsa_ops counting_ops;

static int counted_topk(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, const dsarl_dsa_indexer_inputs *in,
                        int32_t topk, int32_t *indices, float *scores, dsarl_error *err)
{
    n_topk++;
    return dsarl_dsa_reference_ops.indexer_topk(ctx, batch, in, topk, indices, scores, err);
}

static int counted_attention(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                             const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk, void *out,
                             float *lse, dsarl_error *err)
{
    n_attention++;
    return dsarl_dsa_reference_ops.sparse_mla_forward(ctx, batch, in, indices, topk, out, lse, err);
}

static dsarl_device *dev;
static dsarl_dsa_context *dsa;
static dsarl_recipe *recipe;
static dsarl_model *model;
static dsarl_error err;
static const dsarl_model_ops *ops = &glm5_2_model_ops;

// A fresh random batch: B sequences of random lengths and tokens, next-token targets (-1 at each end).
static int32_t tokens[MAX_T], targets[MAX_T], cu[8];
static float dlogprobs[MAX_T];
static dsarl_token_batch batch;

static void random_batch(unsigned seed, int B, float logit_scale)
{
    srand(seed);
    cu[0] = 0;
    for (int b = 0; b < B; b++)
        cu[b + 1] = cu[b] + 3 + rand() % 7;
    ck_assert_int_le(cu[B], MAX_T);
    for (int t = 0; t < cu[B]; t++) {
        tokens[t] = rand() % V;
        dlogprobs[t] = (float)rand() / (float)RAND_MAX - 0.3f;
    }
    for (int b = 0; b < B; b++)
        for (int t = cu[b]; t < cu[b + 1]; t++)
            targets[t] = t + 1 < cu[b + 1] ? tokens[t + 1] : -1;
    batch = (dsarl_token_batch){.struct_size = sizeof batch, .n_tokens = cu[B], .n_sequences = B, .tokens = tokens,
                                .cu_seqlens = cu, .logit_scale = logit_scale};
}

static void setup(void)
{
    ck_assert_int_eq(dsarl_recipe_load_string(recipe_text, "train.yaml", &recipe, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(recipe, &err), 0);
    dsarl_device_config dc = {.struct_size = sizeof(dc), .threads = 1};
    ck_assert_int_eq(cpu_create(&dc, &dev, &err), 0);
    counting_ops = dsarl_dsa_reference_ops;
    counting_ops.indexer_topk = counted_topk;
    counting_ops.sparse_mla_forward = counted_attention;
    ck_assert_int_eq(counting_ops.create(&dsarl_cpu_device_ops, dev, NULL, &dsa, &err), 0);
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(recipe),
                             .device_ops = &dsarl_cpu_device_ops, .device = dev, .dsa_ops = &counting_ops,
                             .dsa = dsa, .seed = 29};
    ck_assert_msg(ops->create(&mc, &model, &err) == 0, "%s", err.message);
    ck_assert(DSARL_MODEL_HAS(ops, train_forward) && DSARL_MODEL_HAS(ops, train_backward));
}

static void teardown(void)
{
    ops->destroy(model);
    counting_ops.destroy(dsa);
    cpu_destroy(dev);
    dsarl_recipe_free(recipe);
}

// Every gradient of the model, tensor after tensor, into a new zeroed buffer of n_weights floats (the tensors'
// elements fill its front: the buffer layout may leave gaps between tensors).
static float *all_grads(void)
{
    float *g = calloc((size_t)model->n_weights, sizeof(float)), *at = g;
    for (int64_t i = 0; i < ops->parameter_tensors(model); i++) {
        ck_assert_int_eq(ops->read_parameter(model, i, NULL, at, &err), 0);
        at += model->params[i].numel;
    }
    return g;
}

static void logprobs_equal_forward_logprobs(float logit_scale)
{
    for (unsigned seed = 1; seed <= 3; seed++) {
        random_batch(seed, 2 + (int)seed, logit_scale);
        float want[MAX_T], got[MAX_T];
        ck_assert_msg(ops->forward_logprobs(model, &batch, targets, want, &err) == 0, "%s", err.message);
        ck_assert_msg(ops->train_forward(model, &batch, targets, got, &err) == 0, "%s", err.message);
        ck_assert_mem_eq(want, got, (size_t)batch.n_tokens * sizeof(float));
        double sum = 0;
        for (int t = 0; t < batch.n_tokens; t++)
            sum += fabs(got[t]);
        ck_assert(sum > 0.1); // not an all-zero answer (a few targets are -1, most are not)
    }
}

START_TEST(test_logprobs_equal_forward_logprobs) { logprobs_equal_forward_logprobs(1.0f); }
END_TEST

START_TEST(test_tempered_logprobs_equal_forward_logprobs) { logprobs_equal_forward_logprobs(1.0f / 0.7f); }
END_TEST

/* train_forward + train_backward accumulates what backward does, indexer loss included; a second train_forward
 * on another batch releases the first pass, so the backward that follows is of the second batch only. */
START_TEST(test_gradients_equal_backward)
{
    random_batch(7, 4, 1.0f / 0.8f);
    float il_want = 0, il_got = 0, lp[MAX_T];
    ck_assert_int_eq(ops->zero_grad(model, &err), 0);
    ck_assert_msg(ops->backward(model, &batch, targets, dlogprobs, &il_want, &err) == 0, "%s", err.message);
    float *want = all_grads();
    double norm = 0;
    for (int64_t i = 0; i < model->n_weights; i++)
        norm += (double)want[i] * want[i];
    ck_assert(norm > 0 && il_want > 0);

    dsarl_token_batch kept = batch;
    int32_t kept_tokens[MAX_T], kept_targets[MAX_T], kept_cu[8];
    float kept_d[MAX_T];
    memcpy(kept_tokens, tokens, sizeof tokens), memcpy(kept_targets, targets, sizeof targets);
    memcpy(kept_cu, cu, sizeof cu), memcpy(kept_d, dlogprobs, sizeof dlogprobs);
    random_batch(8, 3, 1.0f); // another batch first, released by the next train_forward
    ck_assert_int_eq(ops->zero_grad(model, &err), 0);
    ck_assert_int_eq(ops->train_forward(model, &batch, targets, lp, &err), 0);
    memcpy(tokens, kept_tokens, sizeof tokens), memcpy(targets, kept_targets, sizeof targets);
    memcpy(cu, kept_cu, sizeof cu), memcpy(dlogprobs, kept_d, sizeof dlogprobs);
    batch = kept;
    ck_assert_int_eq(ops->train_forward(model, &batch, targets, lp, &err), 0);
    memset(tokens, 0, sizeof tokens); // the pass keeps its own copies of the batch
    memset(cu, 0, sizeof cu);
    ck_assert_msg(ops->train_backward(model, dlogprobs, &il_got, &err) == 0, "%s", err.message);
    float *got = all_grads();
    ck_assert(il_got == il_want);
    ck_assert_mem_eq(want, got, (size_t)model->n_weights * sizeof(float));
    free(want);
    free(got);
}
END_TEST

/* policy.logprob_chunk_size: the LM head over row chunks (glm5_head.c) gives the whole pass's log-probs, logits and
 * gradients, with chunks that divide T, that do not, and of one row; the lm_head gradient is summed chunk by chunk,
 * so it agrees to rounding. */
START_TEST(test_logprob_chunks_equal_whole_pass)
{
    random_batch(11, 4, 1.0f / 0.9f);
    int64_t T = batch.n_tokens;
    float want_lp[MAX_T], got_lp[MAX_T], il = 0;
    float *want_logits = malloc((size_t)(T * V) * sizeof(float)), *got_logits = malloc((size_t)(T * V) * sizeof(float));
    ck_assert_int_eq(ops->forward_logprobs(model, &batch, targets, want_lp, &err), 0);
    ck_assert_int_eq(ops->forward_logits(model, &batch, want_logits, &err), 0);
    ck_assert_int_eq(ops->zero_grad(model, &err), 0);
    ck_assert_msg(ops->backward(model, &batch, targets, dlogprobs, &il, &err) == 0, "%s", err.message);
    float *want = all_grads();
    int64_t chunks[] = {T / 2, 7, 1};
    ck_assert(T % 7 != 0 && T / 2 < T);
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        model->logprob_chunk = chunks[c];
        ck_assert_int_eq(ops->forward_logprobs(model, &batch, targets, got_lp, &err), 0);
        ck_assert_int_eq(ops->forward_logits(model, &batch, got_logits, &err), 0);
        for (int64_t t = 0; t < T; t++)
            ck_assert_msg(fabsf(got_lp[t] - want_lp[t]) <= 1e-6f * fabsf(want_lp[t]) + 1e-7f,
                          "chunk %lld: log-prob %lld is %g, whole %g", (long long)chunks[c], (long long)t, got_lp[t],
                          want_lp[t]);
        // A logit is a dot product over the hidden size: BLAS may sum a chunk's rows in another order than the whole
        // pass's (one row goes through gemv, a block through gemm), so the error scales with the logits' magnitude,
        // not with each (possibly cancelled, near-zero) logit.
        double scale = 0, worst = 0;
        for (int64_t i = 0; i < T * V; i++)
            scale = fmax(scale, fabs((double)want_logits[i]));
        for (int64_t i = 0; i < T * V; i++)
            worst = fmax(worst, fabs((double)got_logits[i] - want_logits[i]));
        ck_assert_msg(scale > 0 && worst <= 1e-6 * scale, "chunk %lld: logits differ by %g, largest logit %g",
                      (long long)chunks[c], worst, scale);
        ck_assert_int_eq(ops->zero_grad(model, &err), 0);
        ck_assert_msg(ops->backward(model, &batch, targets, dlogprobs, &il, &err) == 0, "%s", err.message);
        float *got = all_grads();
        double diff = 0, norm = 0;
        for (int64_t i = 0; i < model->n_weights; i++)
            diff += ((double)got[i] - want[i]) * ((double)got[i] - want[i]), norm += (double)want[i] * want[i];
        ck_assert_msg(norm > 0 && sqrt(diff / norm) < 1e-6, "chunk %lld: gradients differ by %g relative",
                      (long long)chunks[c], sqrt(diff / norm));
        free(got);
    }
    model->logprob_chunk = 0;
    free(want), free(want_logits), free(got_logits);
}
END_TEST

// A negative policy.logprob_chunk_size is refused at create, naming the key.
START_TEST(test_logprob_chunk_refused)
{
    dsarl_recipe *bad = NULL;
    char text[2048];
    snprintf(text, sizeof text, "%s  logprob_chunk_size: -4\n", recipe_text);
    ck_assert_int_eq(dsarl_recipe_load_string(text, "bad.yaml", &bad, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(bad, &err), 0);
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(bad),
                             .device_ops = &dsarl_cpu_device_ops, .device = dev, .dsa_ops = &counting_ops,
                             .dsa = dsa, .seed = 29};
    dsarl_model *m = NULL;
    ck_assert_int_eq(ops->create(&mc, &m, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "policy.logprob_chunk_size") != NULL, "%s", err.message);
    ck_assert_ptr_null(m);
    dsarl_recipe_free(bad);
}
END_TEST

START_TEST(test_backward_without_pass_fails)
{
    random_batch(3, 2, 1.0f);
    float il = 0, lp[MAX_T];
    err = (dsarl_error){0};
    ck_assert_int_ne(ops->train_backward(model, dlogprobs, &il, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.message, "train_forward"));
    // and after one pass's backward: the pass is released, a second backward fails too
    ck_assert_int_eq(ops->train_forward(model, &batch, targets, lp, &err), 0);
    ck_assert_int_eq(ops->train_backward(model, dlogprobs, &il, &err), 0);
    ck_assert_int_ne(ops->train_backward(model, dlogprobs, &il, &err), 0);
}
END_TEST

/* One forward per step: train_forward + train_backward run the attention forward once per layer and the indexer
 * once per full layer (IndexShare pattern FSF), the log-probs-only forward the same, a forward followed by the
 * 1.0 backward (the old training step) twice that. */
START_TEST(test_one_forward_per_step)
{
    random_batch(5, 3, 1.0f);
    float lp[MAX_T], il = 0;
    n_attention = n_topk = 0;
    ck_assert_int_eq(ops->forward_logprobs(model, &batch, targets, lp, &err), 0);
    ck_assert_int_eq(n_attention, LAYERS);
    ck_assert_int_eq(n_topk, FULL_LAYERS);
    n_attention = n_topk = 0;
    ck_assert_int_eq(ops->train_forward(model, &batch, targets, lp, &err), 0);
    ck_assert_int_eq(ops->train_backward(model, dlogprobs, &il, &err), 0);
    ck_assert_int_eq(n_attention, LAYERS);
    ck_assert_int_eq(n_topk, FULL_LAYERS);
    n_attention = n_topk = 0;
    ck_assert_int_eq(ops->forward_logprobs(model, &batch, targets, lp, &err), 0);
    ck_assert_int_eq(ops->backward(model, &batch, targets, dlogprobs, &il, &err), 0);
    ck_assert_int_eq(n_attention, 2 * LAYERS);
    ck_assert_int_eq(n_topk, 2 * FULL_LAYERS);
}
END_TEST


/* --- op classes (profile_scope) ------------------------------------------------------------------------------ */

// The classes glm5 names (glm5_pass.h, docs/performance.md); NULL ends a model op.
static const char *const known_classes[] = {
    "setup", "embedding", "norm", "attention.proj", "attention.core", "kv_cache", "indexer", "moe", "moe.shared",
    "mlp.dense", "lm_head", "mtp", "pipeline", "embedding.bwd", "norm.bwd", "attention.proj.bwd",
    "attention.core.bwd", "indexer.loss", "moe.bwd", "moe.shared.bwd", "mlp.dense.bwd", "lm_head.bwd", "mtp.bwd",
    "optimizer.grad_reduce", "optimizer.grad_norm", "optimizer.adamw", "optimizer.weight_gather",
    "optimizer.zero_grad"};

enum { MAX_SCOPES = 4096 };
static const char *scopes[MAX_SCOPES];
static int n_scopes;

// The CPU device's table has no profile_scope: this copy records what the model names.
static void record_scope(dsarl_device *d, const char *name)
{
    (void)d;
    ck_assert_int_lt(n_scopes, MAX_SCOPES);
    scopes[n_scopes++] = name;
}

// Changes into class name among records [from, to), as a profiling device counts them (a repeat is no change).
static int entries(int from, int to, const char *name)
{
    int n = 0;
    for (int i = from; i < to; i++) {
        bool is = scopes[i] && !strcmp(scopes[i], name);
        bool was = i > from && scopes[i - 1] && !strcmp(scopes[i - 1], name);
        n += is && !was;
    }
    return n;
}

// Records [from, to) of one model op: known classes, and the op's last record NULL (its only one).
static void expect_op_records(int from, int to, const char *op)
{
    ck_assert_msg(to > from && scopes[to - 1] == NULL, "%s: does not end its op class", op);
    for (int i = from; i < to - 1; i++) {
        ck_assert_msg(scopes[i] != NULL, "%s: ends its class at record %d of %d", op, i - from, to - from);
        bool known = false;
        for (size_t k = 0; k < sizeof known_classes / sizeof known_classes[0]; k++)
            known = known || !strcmp(scopes[i], known_classes[k]);
        ck_assert_msg(known, "%s: unknown op class %s", op, scopes[i]);
    }
}

// Whether a class of the backward (.bwd, or the indexer loss) appears among records [from, to).
static bool has_backward_class(int from, int to)
{
    for (int i = from; i < to; i++)
        if (scopes[i] && (strstr(scopes[i], ".bwd") || !strcmp(scopes[i], "indexer.loss")))
            return true;
    return false;
}

/* A training step (train_forward, train_backward, grad_norm, optimizer_step), then a prefill and a decode step
 * through the cache, on a model whose device records its scopes: per layer one attention kernel and one indexer
 * (full, or a shared layer's copy) in each pass, the MoE layers' routed and shared experts and the dense layer in
 * their own classes, the backward in the .bwd classes, the cache's appends in kv_cache. */
START_TEST(test_profile_scopes)
{
    static dsarl_device_ops scoped;
    scoped = dsarl_cpu_device_ops;
    scoped.profile_scope = record_scope;
    dsarl_model *sm = NULL;
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(recipe), .device_ops = &scoped,
                             .device = dev, .dsa_ops = &counting_ops, .dsa = dsa, .seed = 31};
    ck_assert_msg(ops->create(&mc, &sm, &err) == 0, "%s", err.message);
    random_batch(11, 3, 1.0f);
    float lp[MAX_T], il = 0.0f;
    double norm = 0.0;
    n_scopes = 0;
    ck_assert_msg(ops->train_forward(sm, &batch, targets, lp, &err) == 0, "%s", err.message);
    int fwd = n_scopes;
    ck_assert_msg(ops->train_backward(sm, dlogprobs, &il, &err) == 0, "%s", err.message);
    int bwd = n_scopes;
    ck_assert_msg(ops->grad_norm(sm, &norm, &err) == 0, "%s", err.message);
    int gn = n_scopes;
    dsarl_optimizer_params hp = {.struct_size = sizeof hp, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                                 .grad_scale = 1.0};
    ck_assert_msg(ops->optimizer_step(sm, &hp, &err) == 0, "%s", err.message);
    int opt = n_scopes;
    expect_op_records(0, fwd, "train_forward");
    expect_op_records(fwd, bwd, "train_backward");
    expect_op_records(bwd, gn, "grad_norm");
    expect_op_records(gn, opt, "optimizer_step");
    // forward: layer 0 dense, layers 1-2 MoE; every layer attends once and runs (or copies) the indexer once
    ck_assert_int_eq(entries(0, fwd, "setup"), 1);
    ck_assert_int_eq(entries(0, fwd, "embedding"), 1);
    ck_assert_int_eq(entries(0, fwd, "attention.core"), LAYERS);
    ck_assert_int_eq(entries(0, fwd, "indexer"), LAYERS);
    ck_assert_int_eq(entries(0, fwd, "mlp.dense"), 1);
    ck_assert_int_eq(entries(0, fwd, "moe"), LAYERS - 1);
    ck_assert_int_eq(entries(0, fwd, "moe.shared"), LAYERS - 1);
    ck_assert_int_ge(entries(0, fwd, "attention.proj"), LAYERS);
    ck_assert_int_ge(entries(0, fwd, "norm"), LAYERS);
    ck_assert_int_ge(entries(0, fwd, "lm_head"), 1);
    ck_assert(!has_backward_class(0, fwd));
    // backward (no recompute: no forward class but the buffers' setup)
    ck_assert_int_eq(entries(fwd, bwd, "attention.core.bwd"), LAYERS);
    ck_assert_int_eq(entries(fwd, bwd, "mlp.dense.bwd"), 1);
    ck_assert_int_eq(entries(fwd, bwd, "moe.bwd"), LAYERS - 1);
    ck_assert_int_eq(entries(fwd, bwd, "moe.shared.bwd"), LAYERS - 1);
    ck_assert_int_eq(entries(fwd, bwd, "lm_head.bwd"), 1);
    ck_assert_int_eq(entries(fwd, bwd, "embedding.bwd"), 1);
    ck_assert_int_ge(entries(fwd, bwd, "indexer.loss"), FULL_LAYERS);
    ck_assert_int_ge(entries(fwd, bwd, "attention.proj.bwd"), LAYERS);
    ck_assert_int_eq(entries(fwd, bwd, "attention.core") + entries(fwd, bwd, "moe") + entries(fwd, bwd, "indexer"),
                     0);
    ck_assert_int_eq(entries(bwd, gn, "optimizer.grad_norm"), 1);
    ck_assert_int_eq(entries(gn, opt, "optimizer.adamw"), 1);

    // prefill two prompts into slots 0 and 1, then one decode step
    dsarl_model_cache *cache = NULL;
    ck_assert_msg(ops->cache_create(sm, 2, 16, &cache, &err) == 0, "%s", err.message);
    int32_t prompt[9] = {3, 14, 15, 9, 26, 5, 35, 8, 9}, pcu[3] = {0, 4, 9}, slots[2] = {0, 1}, next[2] = {7, 1};
    int32_t dcu[3] = {0, 1, 2};
    float logits[2 * V];
    dsarl_token_batch pb = {.struct_size = sizeof pb, .n_tokens = 9, .n_sequences = 2, .tokens = prompt,
                            .cu_seqlens = pcu, .logit_scale = 1.0f};
    dsarl_token_batch db = {.struct_size = sizeof db, .n_tokens = 2, .n_sequences = 2, .tokens = next,
                            .cu_seqlens = dcu, .logit_scale = 1.0f};
    ck_assert_msg(ops->forward_cached(sm, cache, &pb, slots, logits, &err) == 0, "%s", err.message);
    int pre = n_scopes;
    ck_assert_msg(ops->forward_cached(sm, cache, &db, slots, logits, &err) == 0, "%s", err.message);
    int dec = n_scopes;
    expect_op_records(opt, pre, "forward_cached (prefill)");
    expect_op_records(pre, dec, "forward_cached (decode)");
    // each layer appends its latents, each full layer its indexer keys
    ck_assert_int_eq(entries(pre, dec, "kv_cache"), LAYERS + FULL_LAYERS);
    ck_assert_int_eq(entries(pre, dec, "attention.core"), LAYERS);
    ck_assert_int_eq(entries(pre, dec, "indexer"), LAYERS + FULL_LAYERS); // resumed after its cache append
    ck_assert_int_eq(entries(pre, dec, "moe"), LAYERS - 1);
    ck_assert_int_eq(entries(pre, dec, "lm_head"), 1);
    ck_assert(!has_backward_class(opt, dec));
    ops->cache_free(cache);
    ops->destroy(sm);
}
END_TEST

static Suite *glm5_train_suite(void)
{
    Suite *s = suite_create("glm5_train");
    TCase *tc = tcase_create("train");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_logprobs_equal_forward_logprobs);
    tcase_add_test(tc, test_tempered_logprobs_equal_forward_logprobs);
    tcase_add_test(tc, test_gradients_equal_backward);
    tcase_add_test(tc, test_backward_without_pass_fails);
    tcase_add_test(tc, test_logprob_chunks_equal_whole_pass);
    tcase_add_test(tc, test_logprob_chunk_refused);
    tcase_add_test(tc, test_one_forward_per_step);
    tcase_add_test(tc, test_profile_scopes);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(glm5_train_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
