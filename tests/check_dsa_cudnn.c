/* check_dsa_cudnn.c: every op and route of the cudnn DSA backend (cuda, bf16) against the reference backend (the
 * double-accumulating oracle) on the same fresh random inputs, plus a probe of cuDNN's MoE grouped matmul on sm_90.
 *
 * Inputs are drawn in float32 and rounded to bf16 once; the reference runs on those values as float32 host arrays,
 * cudnn on them as bf16 device arrays. Top-k indices come from the reference indexer (DSA's own selection: rows
 * with no more than topk eligible keys list all of them, which is the shortcut the dense cuDNN route takes).
 * Routes covered: headwise forward/backward through the plain causal graph (segments <= topk, and indices NULL)
 * and the causal + top-k bias graph (topk < segment <= the segment bound), in ragged packs whose segments fall on
 * both sides of topk and of the length buckets, also one segment per launch; the segment bound (moved down with
 * runtime.cudnn_max_segment); preferred_form (absorbed: one form for training and generation); the absorbed forward through the paged graph (random rows with -1 slots, repeated keys and
 * a row with no index; decode ranges; GLM-5 576/512 dims) and its hand-over case; the hand-overs to tilelang
 * (absorbed backward, indexer top-k, indexer loss). Comparisons, as max |cudnn - reference| / max |reference|:
 * bf16 outputs 1e-2, gradients through cuDNN's bf16 P and dS 2e-2, float32 lse and losses 1e-3 (lse +inf rows
 * exactly). Each comparison prints its error. DSARL_GPU_BENCH=1 adds timings. Label gpu; exit 77 without a GPU. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime_api.h>
#include "cuda_device.h"
#include "graph.h"
#include "dsa_reference.h"
#include "cuda_test_util.h"
#include "tilelang_test_util.h"

static dsarl_device *gpu;
static dsarl_dsa_context *cd, *ref;
static dsarl_error err;
static rng stream;     /* the run's random inputs (cuda_test_util.h) */
static close_check cc; /* expect_close's device and printed label */
static const dsarl_dsa_ops *ops = &dsarl_dsa_cudnn_ops;
static dsarl_registry *registry; /* holds the tilelang plugin the cudnn backend hands over to */

static void setup(void)
{
    dsarl_parallel single = DSARL_PARALLEL_SINGLE;
    dsarl_device_config cfg = {.struct_size = sizeof(cfg), .parallel = &single};
    ck_assert_msg(cuda_create(&cfg, &gpu, &err) == 0, "%s", err.message);
    registry = tilelang_registry();
    cdn_set_host(dsarl_registry_host(registry));
    ck_assert_msg(ops->create(&dsarl_cuda_device_ops, gpu, NULL, &cd, &err) == 0, "%s", err.message);
    ck_assert_msg(cdn_ctx(cd)->tl == (const dsarl_dsa_ops *)(const void *)dsarl_registry_find(registry, DSARL_KIND_DSA,
                                                                                            "tilelang"),
                  "the cudnn context does not hand over to the registry's tilelang table");
    ck_assert_msg(cdn_ctx(cd)->stream == cuda_stream(gpu), "the cudnn context is not on the device's stream");
    ck_assert_int_eq(dsa_reference_create(NULL, NULL, NULL, &ref, &err), 0);
    cc = (close_check){.gpu = gpu, .label = "check_dsa_cudnn:", .width = 58};
}

static void teardown(void)
{
    cudnn_dsa *c = cdn_ctx(cd);
    printf("check_dsa_cudnn: %d cuDNN plans built in %.0f ms in all (%.0f ms each)\n", c->plans_built,
           c->plan_build_ms, c->plans_built ? c->plan_build_ms / c->plans_built : 0.0);
    ops->destroy(cd);
    dsa_reference_destroy(ref);
    cuda_destroy(gpu);
    cdn_set_host(NULL);
    dsarl_registry_free(registry);
}

// DSA's selection for the batch: the reference indexer's top-k on random indexer inputs.
static int32_t *indexer_indices(const test_batch *tb, int32_t topk)
{
    int64_t T = tb->b.n_queries, Tk = tb->b.n_keys;
    float *q = rand_bf16(&stream, T * 4 * 32, 1), *k = rand_bf16(&stream, Tk * 32, 1),
          *w = rand_bf16(&stream, T * 4, 0.2f);
    dsarl_dsa_indexer_inputs in = {.struct_size = sizeof(in), .q = q, .k = k, .weights = w, .n_heads = 4,
                                   .head_dim = 32};
    int32_t *idx = malloc((size_t)(T * topk) * 4);
    ck_assert_int_eq(dsa_reference_indexer_topk(ref, &tb->b, &in, topk, idx, NULL, &err), 0);
    free(q), free(k), free(w);
    return idx;
}

/* --- headwise attention ------------------------------------------------------------------------------------- */

static void check_headwise(test_batch *tb, int H, int d_qk, int d_v, int32_t topk, int use_indices, const char *what)
{
    int64_t T = tb->b.n_queries;
    char name[160];
    int32_t *idx = use_indices ? indexer_indices(tb, topk) : NULL;
    float *q = rand_bf16(&stream, T * H * d_qk, 1), *k = rand_bf16(&stream, T * H * d_qk, 1),
          *v = rand_bf16(&stream, T * H * d_v, 1);
    dsarl_dsa_headwise_inputs hin = {.struct_size = sizeof(hin), .q = q, .k = k, .v = v, .n_heads = H, .d_qk = d_qk,
                                     .d_v = d_v, .softmax_scale = 1.5f / sqrtf((float)d_qk)};
    dsarl_dsa_headwise_inputs din = hin;
    din.q = to_gpu_bf16(gpu, q, T * H * d_qk), din.k = to_gpu_bf16(gpu, k, T * H * d_qk);
    din.v = to_gpu_bf16(gpu, v, T * H * d_v);
    int32_t *g_idx = idx ? to_gpu_i32(gpu, idx, T * topk) : NULL;
    float *out = malloc((size_t)(T * H * d_v) * 4), *lse = malloc((size_t)(T * H) * 4);
    void *g_out = to_gpu_bf16(gpu, NULL, T * H * d_v);
    float *g_lse = to_gpu_f32(gpu, NULL, T * H);
    ck_assert_int_eq(dsa_reference_headwise_attention_forward(ref, &tb->b, &hin, idx, topk, out, lse, &err), 0);
    ck_assert_msg(ops->headwise_attention_forward(cd, &tb->dev, &din, g_idx, topk, g_out, g_lse, &err) == 0, "%s",
                  err.message);
    snprintf(name, sizeof name, "%s fwd out", what);
    expect_close(&cc, g_out, DSARL_DTYPE_BF16, out, T * H * d_v, 1e-2, name);
    snprintf(name, sizeof name, "%s fwd lse", what);
    expect_close(&cc, g_lse, DSARL_DTYPE_F32, lse, T * H, 1e-3, name);

    // backward from the same (bf16-rounded) out and the reference lse on both sides
    float *out16 = round_bf16(out, T * H * d_v), *dout = rand_bf16(&stream, T * H * d_v, 1);
    float *dq = malloc((size_t)(T * H * d_qk) * 4), *dk = malloc((size_t)(T * H * d_qk) * 4);
    float *dv = malloc((size_t)(T * H * d_v) * 4);
    void *g_out16 = to_gpu_bf16(gpu, out16, T * H * d_v), *g_dout = to_gpu_bf16(gpu, dout, T * H * d_v);
    void *g_dq = to_gpu_bf16(gpu, NULL, T * H * d_qk), *g_dk = to_gpu_bf16(gpu, NULL, T * H * d_qk),
         *g_dv = to_gpu_bf16(gpu, NULL, T * H * d_v);
    float *g_lse_ref = to_gpu_f32(gpu, lse, T * H);
    ck_assert_int_eq(dsa_reference_headwise_attention_backward(ref, &tb->b, &hin, idx, topk, out16, lse, dout, dq,
                                                               dk, dv, &err), 0);
    ck_assert_msg(ops->headwise_attention_backward(cd, &tb->dev, &din, g_idx, topk, g_out16, g_lse_ref, g_dout, g_dq,
                                                   g_dk, g_dv, &err) == 0, "%s", err.message);
    snprintf(name, sizeof name, "%s bwd dq", what);
    expect_close(&cc, g_dq, DSARL_DTYPE_BF16, dq, T * H * d_qk, 2e-2, name);
    snprintf(name, sizeof name, "%s bwd dk", what);
    expect_close(&cc, g_dk, DSARL_DTYPE_BF16, dk, T * H * d_qk, 2e-2, name);
    snprintf(name, sizeof name, "%s bwd dv", what);
    expect_close(&cc, g_dv, DSARL_DTYPE_BF16, dv, T * H * d_v, 2e-2, name);
    cuda_free(gpu, (void *)din.q), cuda_free(gpu, (void *)din.k), cuda_free(gpu, (void *)din.v);
    cuda_free(gpu, g_idx), cuda_free(gpu, g_out), cuda_free(gpu, g_lse), cuda_free(gpu, g_out16);
    cuda_free(gpu, g_dout), cuda_free(gpu, g_dq), cuda_free(gpu, g_dk), cuda_free(gpu, g_dv), cuda_free(gpu, g_lse_ref);
    free(q), free(k), free(v), free(idx), free(out), free(lse), free(out16), free(dout), free(dq), free(dk), free(dv);
}

// The tiny recipe's dims (d_qk 16 + 8, d_v 16, 4 heads, top-16): segments on both sides of topk and of the
// 64-token bucket, a one-token segment, sparse and dense.
START_TEST(test_headwise_tiny_dims)
{
    test_batch tb;
    const int32_t lengths[] = {5, 30, 1, 12, 70, 16, 17, 100, 3};
    batch_packed_gpu(gpu, &tb, lengths, 9);
    check_headwise(&tb, 4, 24, 16, 16, 1, "headwise ragged pack H4 d24/16 k16 (causal + bias)");
    check_headwise(&tb, 4, 24, 16, 16, 0, "headwise ragged pack H4 d24/16 dense (indices NULL)");
    // one form for training and generation: absorbed unless the recipe asks for headwise (see preferred_form)
    ck_assert_int_eq(ops->preferred_form(cd, &tb.dev, 16), DSARL_DSA_FORM_ABSORBED);
    // the same with one segment per launch (runtime.cudnn_dp_workspace_cap=1): buckets split into several launches
    // of a plan
    dsarl_recipe *r = keys_recipe("runtime:\n  cudnn_dp_workspace_cap: 1\n");
    dsarl_dsa_context *split = NULL, *saved = cd;
    ck_assert_msg(ops->create(&dsarl_cuda_device_ops, gpu, dsarl_recipe_root(r), &split, &err) == 0, "%s",
                  err.message);
    dsarl_recipe_free(r);
    ck_assert_msg(cdn_ctx(split)->dp_workspace_cap == 1, "runtime.cudnn_dp_workspace_cap=1 was not kept");
    cd = split;
    check_headwise(&tb, 4, 24, 16, 16, 1, "headwise ragged pack H4 d24/16 k16, one segment per launch");
    cd = saved;
    ops->destroy(split);
    batch_free_gpu(gpu, &tb);
}
END_TEST

// GLM-5 per-head dims (192 + 64, 256), 8 heads: one segment inside topk, one well past it (bucket 512).
START_TEST(test_headwise_glm5_dims)
{
    test_batch tb;
    const int32_t lengths[] = {40, 300, 64};
    batch_packed_gpu(gpu, &tb, lengths, 3);
    check_headwise(&tb, 8, 256, 256, 64, 1, "headwise pack H8 d256/256 k64 (causal + bias)");
    check_headwise(&tb, 8, 192, 128, 512, 1, "headwise pack H8 d192/128 k512 (all dense)");
    batch_free_gpu(gpu, &tb);
}
END_TEST

// The segment bound: with runtime.cudnn_max_segment=128, a 300-token segment is refused with or without the bias
// (the headwise op fails with a sentence naming it); the default bound serves it.
START_TEST(test_bias_bound)
{
    dsarl_recipe *r = keys_recipe("runtime:\n  cudnn_max_segment: 128\n");
    dsarl_dsa_context *bounded = NULL;
    ck_assert_msg(ops->create(&dsarl_cuda_device_ops, gpu, dsarl_recipe_root(r), &bounded, &err) == 0, "%s",
                  err.message);
    dsarl_recipe_free(r);
    ck_assert_msg(cdn_ctx(bounded)->max_segment == 128, "runtime.cudnn_max_segment=128 was not kept");
    test_batch tb;
    const int32_t lengths[] = {100, 300};
    batch_packed_gpu(gpu, &tb, lengths, 2);
    ck_assert_int_eq(ops->preferred_form(bounded, &tb.dev, 64), DSARL_DSA_FORM_ABSORBED);
    int64_t T = tb.b.n_queries;
    void *q = to_gpu_bf16(gpu, NULL, T * 4 * 32), *out = to_gpu_bf16(gpu, NULL, T * 4 * 32);
    float *lse = to_gpu_f32(gpu, NULL, T * 4);
    int32_t *idx = to_gpu_i32(gpu, NULL, T * 64);
    dsarl_dsa_headwise_inputs in = {.struct_size = sizeof(in), .q = q, .k = q, .v = q, .n_heads = 4, .d_qk = 32,
                                    .d_v = 32, .softmax_scale = 0.1f};
    dsarl_error e2;
    ck_assert_int_eq(ops->headwise_attention_forward(bounded, &tb.dev, &in, idx, 64, out, lse, &e2),
                     DSARL_E_UNSUPPORTED);
    printf("check_dsa_cudnn: past the bias bound: %s\n", e2.message);
    ck_assert_ptr_nonnull(strstr(e2.message, "300 tokens"));
    in.d_qk = 264; // past cuDNN's 256 limit: a sentence, not a crash
    ck_assert_int_eq(ops->headwise_attention_forward(cd, &tb.dev, &in, idx, 64, out, lse, &e2), DSARL_E_UNSUPPORTED);
    cuda_free(gpu, q), cuda_free(gpu, out), cuda_free(gpu, lse), cuda_free(gpu, idx);
    batch_free_gpu(gpu, &tb);
    ops->destroy(bounded);
}
END_TEST

/* --- absorbed sparse MLA ---------------------------------------------------------------------------------- */

static void check_absorbed(test_batch *tb, int H, int d_qk, int d_v, int32_t topk, int32_t *idx, const char *what)
{
    int64_t Tq = tb->b.n_queries, Tk = tb->b.n_keys;
    char name[160];
    float *q = rand_bf16(&stream, Tq * H * d_qk, 1), *kv = rand_bf16(&stream, Tk * d_qk, 1);
    dsarl_dsa_attention_inputs hin = {.struct_size = sizeof(hin), .q = q, .kv = kv, .n_heads = H, .d_qk = d_qk,
                                      .d_v = d_v, .softmax_scale = 1.5f / sqrtf((float)d_qk)};
    dsarl_dsa_attention_inputs din = hin;
    din.q = to_gpu_bf16(gpu, q, Tq * H * d_qk), din.kv = to_gpu_bf16(gpu, kv, Tk * d_qk);
    int32_t *g_idx = to_gpu_i32(gpu, idx, Tq * topk);
    float *out = malloc((size_t)(Tq * H * d_v) * 4), *lse = malloc((size_t)(Tq * H) * 4);
    void *g_out = to_gpu_bf16(gpu, NULL, Tq * H * d_v);
    float *g_lse = to_gpu_f32(gpu, NULL, Tq * H);
    ck_assert_int_eq(dsa_reference_sparse_mla_forward(ref, &tb->b, &hin, idx, topk, out, lse, &err), 0);
    ck_assert_msg(ops->sparse_mla_forward(cd, &tb->dev, &din, g_idx, topk, g_out, g_lse, &err) == 0, "%s",
                  err.message);
    snprintf(name, sizeof name, "%s fwd out", what);
    expect_close(&cc, g_out, DSARL_DTYPE_BF16, out, Tq * H * d_v, 1e-2, name);
    snprintf(name, sizeof name, "%s fwd lse", what);
    expect_close(&cc, g_lse, DSARL_DTYPE_F32, lse, Tq * H, 1e-3, name);

    // the backward is tilelang's (hand-over): same out and lse on both sides, dkv accumulated
    float *out16 = round_bf16(out, Tq * H * d_v), *dout = rand_bf16(&stream, Tq * H * d_v, 1);
    float *dkv = rand_bf16(&stream, Tk * d_qk, 0.5f), *dq = malloc((size_t)(Tq * H * d_qk) * 4);
    void *g_out16 = to_gpu_bf16(gpu, out16, Tq * H * d_v), *g_dout = to_gpu_bf16(gpu, dout, Tq * H * d_v),
         *g_dkv = to_gpu_bf16(gpu, dkv, Tk * d_qk);
    void *g_dq = to_gpu_bf16(gpu, NULL, Tq * H * d_qk);
    float *g_lse_ref = to_gpu_f32(gpu, lse, Tq * H);
    ck_assert_int_eq(dsa_reference_sparse_mla_backward(ref, &tb->b, &hin, idx, topk, out16, lse, dout, dq, dkv,
                                                       &err), 0);
    ck_assert_msg(ops->sparse_mla_backward(cd, &tb->dev, &din, g_idx, topk, g_out16, g_lse_ref, g_dout, g_dq, g_dkv,
                                           &err) == 0, "%s", err.message);
    snprintf(name, sizeof name, "%s bwd dq (tilelang)", what);
    expect_close(&cc, g_dq, DSARL_DTYPE_BF16, dq, Tq * H * d_qk, 1e-2, name);
    snprintf(name, sizeof name, "%s bwd dkv += (tilelang)", what);
    expect_close(&cc, g_dkv, DSARL_DTYPE_BF16, dkv, Tk * d_qk, 1e-2, name);
    cuda_free(gpu, (void *)din.q), cuda_free(gpu, (void *)din.kv), cuda_free(gpu, g_idx), cuda_free(gpu, g_out);
    cuda_free(gpu, g_lse), cuda_free(gpu, g_out16), cuda_free(gpu, g_dout), cuda_free(gpu, g_dkv);
    cuda_free(gpu, g_dq), cuda_free(gpu, g_lse_ref);
    free(q), free(kv), free(out), free(lse), free(out16), free(dout), free(dkv), free(dq), free(idx);
}

START_TEST(test_absorbed_paged)
{
    cudnn_dsa *c = cdn_ctx(cd);
    test_batch tb;
    const int32_t lengths[] = {5, 30, 1, 12, 23};
    batch_packed_gpu(gpu, &tb, lengths, 5); // 71 tokens: chunks of 64, 4, 2 and 1
    // the tiny recipe's latent dims: reported either way (cuDNN may have no engine for d 40/32)
    check_absorbed(&tb, 4, 40, 32, 16, random_indices_repeats(&stream, &tb, 16),
                   "absorbed pack H4 d40/32 k16 random idx");
    printf("check_dsa_cudnn: paged graph at d 40/32: %s\n", c->paged_handovers ? c->paged_refused : "cuDNN runs it");
    int before = c->paged_handovers;
    c->paged_forced = 1; // the paged graph itself at GLM-5 dims and 16 heads (unforced, tilelang's kernel takes them)
    check_absorbed(&tb, 16, 576, 512, 32, indexer_indices(&tb, 32), "absorbed pack H16 d576/512 k32 indexer idx");
    c->paged_forced = 0;
    batch_free_gpu(gpu, &tb);
    batch_decode_gpu(gpu, &stream, &tb, 10, 200, 1);
    // 8 heads: tilelang's wgmma kernel declines them, so the paged graph serves them unforced
    check_absorbed(&tb, 8, 576, 512, 24, random_indices_repeats(&stream, &tb, 24),
                   "absorbed decode H8 d576/512 k24 (empty rows)");
    batch_free_gpu(gpu, &tb);
    ck_assert_msg(c->paged_handovers == before, "the GLM-5 576/512 forward was handed over: %s", c->paged_refused);
    // a shape the paged graph does not take (3 heads): handed over to tilelang, still exact
    batch_decode_gpu(gpu, &stream, &tb, 6, 50, 1);
    check_absorbed(&tb, 3, 40, 32, 8, random_indices_repeats(&stream, &tb, 8),
                   "absorbed decode H3 d40/32 k8 (hand-over)");
    batch_free_gpu(gpu, &tb);
    ck_assert_int_eq(c->paged_handovers, before + 1);
    // GLM-5 dims with a 64-head group: handed over to tilelang's wgmma kernel (the faster exact route)
    const int32_t pack[] = {40, 31};
    batch_packed_gpu(gpu, &tb, pack, 2);
    check_absorbed(&tb, 64, 576, 512, 32, indexer_indices(&tb, 32), "absorbed pack H64 d576/512 k32 (tilelang)");
    ck_assert_int_eq(c->paged_handovers, before + 2);
    // and 16 heads, a padded group of the same kernel
    check_absorbed(&tb, 16, 576, 512, 32, indexer_indices(&tb, 32), "absorbed pack H16 d576/512 k32 (tilelang)");
    batch_free_gpu(gpu, &tb);
    ck_assert_int_eq(c->paged_handovers, before + 3);
}
END_TEST

/* --- hand-overs: indexer top-k and loss ------------------------------------------------------------------- */

START_TEST(test_indexer_handover)
{
    test_batch tb;
    const int32_t lengths[] = {6, 40, 25};
    batch_packed_gpu(gpu, &tb, lengths, 3);
    int64_t T = tb.b.n_queries;
    int nh = 4, hd = 32, H = 8, d_qk = 80;
    int32_t topk = 16;
    float *iq = rand_bf16(&stream, T * nh * hd, 1), *ik = rand_bf16(&stream, T * hd, 1),
          *iw = rand_bf16(&stream, T * nh, 0.3f);
    dsarl_dsa_indexer_inputs hin = {.struct_size = sizeof(hin), .q = iq, .k = ik, .weights = iw, .n_heads = nh,
                                    .head_dim = hd};
    dsarl_dsa_indexer_inputs din = hin;
    din.q = to_gpu_bf16(gpu, iq, T * nh * hd), din.k = to_gpu_bf16(gpu, ik, T * hd);
    din.weights = to_gpu_f32(gpu, iw, T * nh);
    int32_t *idx = malloc((size_t)(T * topk) * 4), *g_idx = to_gpu_i32(gpu, NULL, T * topk);
    float *scores = malloc((size_t)(T * topk) * 4), *g_scores = to_gpu_f32(gpu, NULL, T * topk);
    ck_assert_int_eq(dsa_reference_indexer_topk(ref, &tb.b, &hin, topk, idx, scores, &err), 0);
    ck_assert_msg(ops->indexer_topk(cd, &tb.dev, &din, topk, g_idx, g_scores, &err) == 0, "%s", err.message);
    expect_close(&cc, g_scores, DSARL_DTYPE_F32, scores, T * topk, 1e-3, "indexer_topk scores (tilelang)");
    // the sparse indexer loss on the reference's selection and lse
    float *q = rand_bf16(&stream, T * H * d_qk, 1), *kv = rand_bf16(&stream, T * d_qk, 1);
    dsarl_dsa_attention_inputs ahin = {.struct_size = sizeof(ahin), .q = q, .kv = kv, .n_heads = H, .d_qk = d_qk,
                                       .d_v = 64, .softmax_scale = 0.2f};
    dsarl_dsa_attention_inputs adin = ahin;
    adin.q = to_gpu_bf16(gpu, q, T * H * d_qk), adin.kv = to_gpu_bf16(gpu, kv, T * d_qk);
    float *out = malloc((size_t)(T * H * 64) * 4), *lse = malloc((size_t)(T * H) * 4);
    ck_assert_int_eq(dsa_reference_sparse_mla_forward(ref, &tb.b, &ahin, idx, topk, out, lse, &err), 0);
    float *g_lse = to_gpu_f32(gpu, lse, T * H), *loss = malloc((size_t)T * 4), *g_loss = to_gpu_f32(gpu, NULL, T);
    int32_t *g_ref_idx = to_gpu_i32(gpu, idx, T * topk);
    ck_assert_int_eq(dsa_reference_indexer_loss_forward(ref, &tb.b, &ahin, lse, &hin, idx, topk, loss, &err), 0);
    ck_assert_msg(ops->indexer_loss_forward(cd, &tb.dev, &adin, g_lse, &din, g_ref_idx, topk, g_loss, &err) == 0,
                  "%s", err.message);
    expect_close(&cc, g_loss, DSARL_DTYPE_F32, loss, T, 1e-3, "indexer_loss_forward (tilelang)");
    float *dloss = rand_bf16(&stream, T, 1), *dqi = malloc((size_t)(T * nh * hd) * 4),
          *dki = rand_bf16(&stream, T * hd, 0.3f);
    float *dw = malloc((size_t)(T * nh) * 4), *g_dloss = to_gpu_f32(gpu, dloss, T),
          *g_dw = to_gpu_f32(gpu, NULL, T * nh);
    void *g_dki = to_gpu_bf16(gpu, dki, T * hd), *g_dqi = to_gpu_bf16(gpu, NULL, T * nh * hd);
    ck_assert_int_eq(dsa_reference_indexer_loss_backward(ref, &tb.b, &ahin, lse, &hin, idx, topk, dloss, dqi, dki,
                                                         dw, &err), 0);
    ck_assert_msg(ops->indexer_loss_backward(cd, &tb.dev, &adin, g_lse, &din, g_ref_idx, topk, g_dloss, g_dqi, g_dki,
                                             g_dw, &err) == 0, "%s", err.message);
    expect_close(&cc, g_dqi, DSARL_DTYPE_BF16, dqi, T * nh * hd, 1e-2, "indexer_loss_backward dq_index (tilelang)");
    expect_close(&cc, g_dw, DSARL_DTYPE_F32, dw, T * nh, 1e-3, "indexer_loss_backward dweights (tilelang)");
    cuda_free(gpu, (void *)din.q), cuda_free(gpu, (void *)din.k), cuda_free(gpu, (void *)din.weights);
    cuda_free(gpu, g_idx), cuda_free(gpu, g_scores), cuda_free(gpu, (void *)adin.q), cuda_free(gpu, (void *)adin.kv);
    cuda_free(gpu, g_lse), cuda_free(gpu, g_loss), cuda_free(gpu, g_ref_idx), cuda_free(gpu, g_dloss);
    cuda_free(gpu, g_dw), cuda_free(gpu, g_dki), cuda_free(gpu, g_dqi);
    free(iq), free(ik), free(iw), free(idx), free(scores), free(q), free(kv), free(out), free(lse), free(loss);
    free(dloss), free(dqi), free(dki), free(dw);
    batch_free_gpu(gpu, &tb);
}
END_TEST

START_TEST(test_routes_table)
{
    ck_assert(DSARL_DSA_HAS(ops, routes));
    ck_assert(DSARL_DSA_HAS(ops, preferred_form));
    ck_assert(DSARL_DSA_HAS(ops, headwise_attention_backward));
    ck_assert_ptr_nonnull(strstr(ops->routes, "sparse_mla_backward | absorbed, every size | hand-over: tilelang"));
    ck_assert_ptr_nonnull(strstr(ops->routes, "<= " CDN_STR(CDN_MAX_SEGMENT)));
}
END_TEST

/* --- MoE grouped matmul probe (not part of the DSA ops; reported, not wired into the model) ---------------- */

// Out[1, T, N] = Token[1, T, K] x Weight[e] over the contiguous token groups of each expert (None mode), bf16 in
// and out, fp32 compute, against a CPU product of the same bf16 values. Prints whether cuDNN 9.19 runs it on sm_90.
START_TEST(test_moe_grouped_matmul_probe)
{
    const int64_t E = 4, K = 64, N = 96, T = 100;
    const int32_t first[4] = {0, 17, 17, 60}; // expert 1 gets no tokens
    float *tok = rand_bf16(&stream, T * K, 1), *w = rand_bf16(&stream, E * K * N, 0.2f),
          *want = calloc((size_t)(T * N), 4);
    for (int64_t t = 0; t < T; t++) {
        int e = 0;
        while (e + 1 < E && first[e + 1] <= t)
            e++;
        for (int64_t n = 0; n < N; n++) {
            double s = 0.0;
            for (int64_t k = 0; k < K; k++)
                s += (double)tok[t * K + k] * w[(e * N + n) * K + k]; // weight (E, K, N), K contiguous
            want[t * N + n] = (float)s;
        }
    }
    void *g_tok = to_gpu_bf16(gpu, tok, T * K), *g_w = to_gpu_bf16(gpu, w, E * K * N),
         *g_out = to_gpu_bf16(gpu, NULL, T * N);
    int32_t *g_first = to_gpu_i32(gpu, first, E);
    cudnn_dsa *c = cdn_ctx(cd);
    cdn_graph g;
    dsarl_error e2;
    dsarl_error_clear(&e2);
    cdn_graph_init(&g, &e2, "MoE grouped matmul probe E=%lld K=%lld N=%lld T=%lld", (long long)E, (long long)K,
                   (long long)N, (long long)T);
    // the layouts of cudnn-frontend's bf16 test: token [1, T, K] row-major, weight [E, K, N] strides {K N, 1, K}
    cudnnBackendDescriptor_t tt = cdn_tensor_nd(&g, CUDNN_DATA_BFLOAT16, 3, (const int64_t[3]){1, T, K},
                                                (const int64_t[3]){T * K, K, 1}, CDN_Q, 0);
    cudnnBackendDescriptor_t wt = cdn_tensor_nd(&g, CUDNN_DATA_BFLOAT16, 3, (const int64_t[3]){E, K, N},
                                                (const int64_t[3]){K * N, 1, K}, CDN_K, 0);
    cudnnBackendDescriptor_t ft = cdn_tensor_nd(&g, CUDNN_DATA_INT32, 3, (const int64_t[3]){E, 1, 1},
                                                (const int64_t[3]){1, 1, 1}, CDN_SEQ_Q, 0);
    cudnnBackendDescriptor_t ot = cdn_tensor_nd(&g, CUDNN_DATA_BFLOAT16, 3, (const int64_t[3]){1, T, N},
                                                (const int64_t[3]){T * N, N, 1}, CDN_O, 0);
    cudnnBackendDescriptor_t op = cdn_new(&g, CUDNN_BACKEND_OPERATION_MOE_GROUPED_MATMUL_DESCRIPTOR);
    cudnnMoeGroupedMatmulMode_t mode = CUDNN_MOE_GROUPED_MATMUL_MODE_NONE;
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    cdn_set(&g, op, CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_MODE, CUDNN_TYPE_MOE_GROUPED_MATMUL_MODE, 1, &mode);
    cdn_set(&g, op, CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    cdn_set(&g, op, CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_TOKEN_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tt);
    cdn_set(&g, op, CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_WEIGHT_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &wt);
    cdn_set(&g, op, CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_FIRST_TOKEN_OFFSET_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
            &ft);
    cdn_set(&g, op, CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_OUTPUT_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ot);
    cdn_finalize(&g, op, "the MoE grouped matmul operation");
    cdn_add_op(&g, op);
    cdn_plan *plan = NULL;
    if (cdn_graph_build_plan(c, &g, "moe probe", &plan) < 0) {
        printf("check_dsa_cudnn: MOE_GROUPED_MATMUL bf16 forward on this GPU: NOT AVAILABLE: %s\n", e2.message);
    } else {
        void *ws = NULL, *ptrs[CDN_N_UIDS] = {0};
        ptrs[CDN_Q] = g_tok, ptrs[CDN_K] = g_w, ptrs[CDN_SEQ_Q] = g_first, ptrs[CDN_O] = g_out;
        ck_assert_int_eq(cdn_workspace(c, (size_t)cdn_plan_workspace(plan) + 16, &ws, &err), 0);
        int rc = cdn_plan_execute(c, plan, ptrs, ws, &e2);
        if (rc < 0)
            printf("check_dsa_cudnn: MOE_GROUPED_MATMUL bf16 forward: plan built (engine %lld) but running failed: "
                   "%s\n", (long long)plan->engine, e2.message);
        else {
            printf("check_dsa_cudnn: MOE_GROUPED_MATMUL bf16 forward runs on this GPU (engine %lld, workspace %lld)\n",
                   (long long)plan->engine, (long long)plan->workspace);
            expect_close(&cc, g_out, DSARL_DTYPE_BF16, want, T * N, 1e-2, "MoE grouped matmul (cuDNN) vs CPU");
        }
        cdn_plan_free(plan);
    }
    cuda_free(gpu, g_tok), cuda_free(gpu, g_w), cuda_free(gpu, g_out), cuda_free(gpu, g_first);
    free(tok), free(w), free(want);
}
END_TEST

/* --- timings (DSARL_GPU_BENCH=1) --------------------------------------------------------------------------- */

static double time_headwise(test_batch *tb, dsarl_dsa_headwise_inputs *in, int32_t *idx, int32_t topk, void *out,
                            float *lse, void *dout, void *dq, void *dk, void *dv, int backward)
{
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    for (int rep = 0; rep < 4; rep++) {
        if (rep == 1)
            cudaEventRecord(a, 0);
        int rc = backward ? ops->headwise_attention_backward(cd, &tb->dev, in, idx, topk, out, lse, dout, dq, dk, dv,
                                                             &err)
                          : ops->headwise_attention_forward(cd, &tb->dev, in, idx, topk, out, lse, &err);
        ck_assert_msg(rc == 0, "%s", err.message);
    }
    cudaEventRecord(b, 0);
    ck_assert_int_eq(cudaEventSynchronize(b), cudaSuccess);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a), cudaEventDestroy(b);
    return ms / 3;
}

START_TEST(test_bench)
{
    if (!getenv("DSARL_GPU_BENCH")) {
        printf("check_dsa_cudnn: timings skipped (set DSARL_GPU_BENCH=1)\n");
        return;
    }
    // one causal segment of S tokens, GLM-5 per-head dims 256/256, 64 heads, top-2048 (bias past 2048)
    const int32_t sizes[] = {2048, 8192}; // 8192: the longest segment the cuDNN graphs serve (CDN_MAX_SEGMENT)
    for (int si = 0; si < 2; si++) {
        int32_t S = sizes[si], topk = 2048, H = 64, d = 256;
        test_batch tb;
        batch_packed_gpu(gpu, &tb, &S, 1);
        int32_t *idx = malloc((size_t)S * topk * 4);
        for (int64_t t = 0; t < S; t++) // the most recent topk keys (any valid selection times the same)
            for (int32_t i = 0; i < topk; i++)
                idx[t * topk + i] = t - i >= 0 ? (int32_t)(t - i) : -1;
        int32_t *g_idx = to_gpu_i32(gpu, idx, (int64_t)S * topk);
        int64_t n = (int64_t)S * H * d;
        dsarl_dsa_headwise_inputs in = {.struct_size = sizeof(in), .q = to_gpu_bf16(gpu, NULL, n),
                                        .k = to_gpu_bf16(gpu, NULL, n), .v = to_gpu_bf16(gpu, NULL, n), .n_heads = H,
                                        .d_qk = d, .d_v = d, .softmax_scale = 0.0625f};
        ck_assert_int_eq(cuda_zero(gpu, (void *)in.q, (size_t)n * 2, &err), 0);
        ck_assert_int_eq(cuda_zero(gpu, (void *)in.k, (size_t)n * 2, &err), 0);
        ck_assert_int_eq(cuda_zero(gpu, (void *)in.v, (size_t)n * 2, &err), 0);
        void *out = to_gpu_bf16(gpu, NULL, n), *dout = to_gpu_bf16(gpu, NULL, n), *dq = to_gpu_bf16(gpu, NULL, n),
             *dk = to_gpu_bf16(gpu, NULL, n);
        void *dv = to_gpu_bf16(gpu, NULL, n);
        ck_assert_int_eq(cuda_zero(gpu, dout, (size_t)n * 2, &err), 0);
        float *lse = to_gpu_f32(gpu, NULL, (int64_t)S * H);
        double f = time_headwise(&tb, &in, g_idx, topk, out, lse, NULL, NULL, NULL, NULL, 0);
        double bw = time_headwise(&tb, &in, g_idx, topk, out, lse, dout, dq, dk, dv, 1);
        // useful FLOPs: each query's selected pairs (min(t + 1, topk)) x 2 (d_qk + d_v); bwd counts 2.5x fwd
        double pairs = 0.0;
        for (int64_t t = 0; t < S; t++)
            pairs += (double)(t + 1 < topk ? t + 1 : topk);
        double ff = 2.0 * H * pairs * (2.0 * d);
        printf("check_dsa_cudnn: BENCH headwise S=%d H=%d d=%d/%d k=%d (%s): fwd %.2f ms = %.1f useful TFLOP/s, bwd "
               "%.2f ms = %.1f\n", S, H, d, d, topk, S > topk ? "causal + bias" : "causal", f, ff / f / 1e9, bw,
               2.5 * ff / bw / 1e9);
        cuda_free(gpu, (void *)in.q), cuda_free(gpu, (void *)in.k), cuda_free(gpu, (void *)in.v);
        cuda_free(gpu, out), cuda_free(gpu, dout), cuda_free(gpu, dq), cuda_free(gpu, dk), cuda_free(gpu, dv);
        cuda_free(gpu, lse), cuda_free(gpu, g_idx);
        free(idx);
        batch_free_gpu(gpu, &tb);
    }
}
END_TEST

static Suite *dsa_cudnn_suite(void)
{
    Suite *s = suite_create("dsa_cudnn");
    TCase *tc = tcase_create("vs_reference");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_routes_table);
    tcase_add_test(tc, test_headwise_tiny_dims);
    tcase_add_test(tc, test_headwise_glm5_dims);
    tcase_add_test(tc, test_bias_bound);
    tcase_add_test(tc, test_absorbed_paged);
    tcase_add_test(tc, test_indexer_handover);
    tcase_add_test(tc, test_moe_grouped_matmul_probe);
    tcase_add_test(tc, test_bench);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    if (cuda_visible_devices() == 0) {
        printf("check_dsa_cudnn: skipped: no CUDA device is visible\n");
        return 77;
    }
    stream = cuda_test_seed("check_dsa_cudnn", 0x2545F4914F6CDD1Dull);
    SRunner *sr = srunner_create(dsa_cudnn_suite());
    srunner_set_fork_status(sr, CK_NOFORK); /* CUDA does not survive fork */
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
