/* check_dsa_tilelang.c: every op of the tilelang DSA backend (cuda, bf16) against the reference backend (the
 * float32/double oracle) on the same fresh random inputs.
 *
 * Inputs are drawn in float32 and rounded to bf16 once; the reference runs on those values as float32 host arrays,
 * tilelang on them as bf16 device arrays, so differences are tilelang's own: fp32 instead of double accumulation
 * and bf16 rounding of stored outputs. Batches: ragged causal packs (with sequences shorter than topk), decode-style
 * ranges into a longer key array (one empty), random index rows with -1 slots and repeated keys. Comparisons, as
 * max |tilelang - reference| / max |reference|: bf16 outputs (out, dq, dkv, dq_index, dk_index) 1e-2; float32
 * outputs (lse, scores, loss, dweights) 1e-3; top-k as sets: the chosen keys' exact scores must equal the
 * reference's sorted top-k scores (1e-4 relative to the row's largest |score|), a key is only swapped for one whose
 * score ties the k-th within that tolerance, and the order is descending. Each comparison prints its error.
 * Sparse MLA at GLM-5 dims runs both the tensor-core (WMMA) kernels and the CUDA-core ones (a second context with
 * runtime.tilelang_sparse_mla and runtime.tilelang_indexer = cuda_core). DSARL_GPU_BENCH=1 adds first timings at
 * larger shapes. Label gpu; exit status 77
 * (skipped) without a GPU. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime_api.h>
#include "cuda_device.h"
#include "dsa_reference.h"
#include "tilelang.h"
#include "cuda_test_util.h"
#include "tilelang_test_util.h"

static dsarl_device *gpu;
static dsarl_dsa_context *tl, *ref;
static dsarl_dsa_context *tl_cc; /* runtime.tilelang_* = cuda_core: the CUDA-core kernels on the same GPU */
static dsarl_error err;
static rng stream;     /* the run's random inputs (cuda_test_util.h) */
static close_check cc; /* expect_close's device and printed label */

static void setup(void)
{
    dsarl_parallel single = DSARL_PARALLEL_SINGLE;
    dsarl_device_config cfg = {.struct_size = sizeof(cfg), .parallel = &single};
    ck_assert_msg(cuda_create(&cfg, &gpu, &err) == 0, "%s", err.message);
    ck_assert_msg(tilelang_create(&dsarl_cuda_device_ops, gpu, NULL, &tl, &err) == 0, "%s", err.message);
    tl_cc = tilelang_with_keys(gpu, TL_KEYS_CUDA_CORE);
    ck_assert_int_eq(dsa_reference_create(NULL, NULL, NULL, &ref, &err), 0);
    cc = (close_check){.gpu = gpu, .label = "check_dsa_tilelang:", .width = 44};
}

static void teardown(void)
{
    tilelang_destroy(tl);
    tilelang_destroy(tl_cc);
    dsa_reference_destroy(ref);
    cuda_destroy(gpu);
}

/* --- indexer top-k ----------------------------------------------------------------------------------------- */

// Exact score of key s for query t (double), as the reference defines it.
static double index_score(const float *q, const float *k, const float *w, int nh, int hd, int64_t t, int32_t s)
{
    double score = 0.0;
    for (int j = 0; j < nh; j++) {
        double dot = 0.0;
        for (int c = 0; c < hd; c++)
            dot += (double)q[(t * nh + j) * hd + c] * k[(int64_t)s * hd + c];
        if (dot > 0.0)
            score += (double)w[t * nh + j] * dot;
    }
    return score;
}

static void check_topk(test_batch *tb, int nh, int hd, int32_t topk, const char *what)
{
    int64_t Tq = tb->b.n_queries, Tk = tb->b.n_keys;
    float *q = rand_bf16(&stream, Tq * nh * hd, 1), *k = rand_bf16(&stream, Tk * hd, 1),
          *w = rand_bf16(&stream, Tq * nh, 0.2f);
    dsarl_dsa_indexer_inputs hin = {.struct_size = sizeof(hin), .q = q, .k = k, .weights = w, .n_heads = nh,
                                    .head_dim = hd};
    dsarl_dsa_indexer_inputs din = hin;
    din.q = to_gpu_bf16(gpu, q, Tq * nh * hd);
    din.k = to_gpu_bf16(gpu, k, Tk * hd);
    din.weights = to_gpu_f32(gpu, w, Tq * nh);
    int32_t *ref_idx = malloc((size_t)(Tq * topk) * 4), *gidx = to_gpu_i32(gpu, NULL, Tq * topk);
    float *ref_scores = malloc((size_t)(Tq * topk) * 4), *gscores = to_gpu_f32(gpu, NULL, Tq * topk);
    ck_assert_int_eq(dsa_reference_indexer_topk(ref, &tb->b, &hin, topk, ref_idx, ref_scores, &err), 0);
    ck_assert_msg(tilelang_indexer_topk(tl, &tb->dev, &din, topk, gidx, gscores, &err) == 0, "%s", err.message);
    int32_t *got = from_gpu_i32(gpu, gidx, Tq * topk);
    float *got_scores = from_gpu(gpu, gscores, Tq * topk, DSARL_DTYPE_F32);
    int swapped = 0;
    double worst = 0.0;
    for (int64_t t = 0; t < Tq; t++) {
        int32_t n = tb->key_end[t] - tb->key_start[t], kk = n < topk ? n : topk;
        double row_max = 1e-30;
        for (int32_t i = 0; i < kk; i++)
            row_max = fmax(row_max, fabs(ref_scores[t * topk + i]));
        double tol = 1e-4 * row_max, kth = kk > 0 ? ref_scores[t * topk + kk - 1] : 0.0;
        for (int32_t i = 0; i < topk; i++) {
            int32_t s = got[t * topk + i];
            if (i >= kk) {
                ck_assert_msg(s == -1 && isinf(got_scores[t * topk + i]), "%s: row %lld slot %d should be empty", what,
                              (long long)t, i);
                continue;
            }
            ck_assert_msg(s >= tb->key_start[t] && s < tb->key_end[t], "%s: row %lld slot %d key %d outside [%d, %d)",
                          what, (long long)t, i, s, tb->key_start[t], tb->key_end[t]);
            for (int32_t j = 0; j < i; j++)
                ck_assert_msg(got[t * topk + j] != s, "%s: row %lld lists key %d twice", what, (long long)t, s);
            double exact = index_score(q, k, w, nh, hd, t, s);
            // the reported score is the chosen key's score; sorted values match the reference's top-k
            ck_assert_msg(fabs(got_scores[t * topk + i] - exact) <= tol, "%s: row %lld key %d score %g, exact %g",
                          what, (long long)t, s, got_scores[t * topk + i], exact);
            double diff = fabs(exact - ref_scores[t * topk + i]);
            worst = fmax(worst, diff / row_max);
            ck_assert_msg(diff <= tol, "%s: row %lld rank %d score %g, reference %g", what, (long long)t, i, exact,
                          ref_scores[t * topk + i]);
            if (i > 0)
                ck_assert_msg(got_scores[t * topk + i] <= got_scores[t * topk + i - 1], "%s: row %lld not descending",
                              what, (long long)t);
            int in_ref = 0;
            for (int32_t j = 0; j < kk && !in_ref; j++)
                in_ref = ref_idx[t * topk + j] == s;
            if (!in_ref) { /* only a key tied with the k-th within rounding may replace a reference key */
                swapped++;
                ck_assert_msg(fabs(exact - kth) <= tol, "%s: row %lld picked key %d (score %g) outside the "
                              "reference set (k-th %g)", what, (long long)t, s, exact, kth);
            }
        }
    }
    printf("check_dsa_tilelang: %-44s sorted-score rel err %.2e (tol 1e-4), %d near-tie swaps, %lld rows\n", what,
           worst, swapped, (long long)Tq);
    cuda_free(gpu, (void *)din.q), cuda_free(gpu, (void *)din.k), cuda_free(gpu, (void *)din.weights);
    cuda_free(gpu, gidx), cuda_free(gpu, gscores);
    free(q), free(k), free(w), free(ref_idx), free(ref_scores), free(got), free(got_scores);
}

START_TEST(test_indexer_topk_packed)
{
    test_batch tb;
    const int32_t lengths[] = {3, 20, 45, 8, 1};
    batch_packed_gpu(gpu, &tb, lengths, 5);
    check_topk(&tb, 4, 64, 16, "indexer_topk ragged pack (4x64, k16)");
    batch_free_gpu(gpu, &tb);
    const int32_t longer[] = {300, 70};
    batch_packed_gpu(gpu, &tb, longer, 2);
    check_topk(&tb, 32, 128, 64, "indexer_topk pack (32x128, k64, tensor cores)");
    check_topk(&tb, 32, 128, 100, "indexer_topk pack (32x128, k100, tensor cores)");
    dsarl_dsa_context *keep = tl;
    tl = tl_cc;
    check_topk(&tb, 32, 128, 100, "indexer_topk pack (32x128, k100, cuda cores)");
    tl = keep;
    batch_free_gpu(gpu, &tb);
}
END_TEST

START_TEST(test_indexer_topk_decode)
{
    test_batch tb;
    batch_decode_gpu(gpu, &stream, &tb, 24, 700, 1);
    check_topk(&tb, 8, 128, 128, "indexer_topk decode ranges (8x128, k128)");
    batch_free_gpu(gpu, &tb);
}
END_TEST

/* --- sparse MLA ------------------------------------------------------------------------------------------- */

typedef struct attn_case {
    float *q, *kv, *out, *lse;
    int32_t *idx;
    dsarl_dsa_attention_inputs hin, din;
    float *g_lse;
    void *g_out;
    int32_t *g_idx;
} attn_case;

static void attn_setup(attn_case *ac, test_batch *tb, int H, int d_qk, int d_v, int32_t topk, int32_t *indices)
{
    int64_t Tq = tb->b.n_queries, Tk = tb->b.n_keys;
    ac->q = rand_bf16(&stream, Tq * H * d_qk, 1);
    ac->kv = rand_bf16(&stream, Tk * d_qk, 1);
    ac->idx = indices;
    ac->hin = (dsarl_dsa_attention_inputs){.struct_size = sizeof(ac->hin), .q = ac->q, .kv = ac->kv, .n_heads = H,
                                           .d_qk = d_qk, .d_v = d_v, .softmax_scale = 1.5f / sqrtf((float)d_qk)};
    ac->din = ac->hin;
    ac->din.q = to_gpu_bf16(gpu, ac->q, Tq * H * d_qk);
    ac->din.kv = to_gpu_bf16(gpu, ac->kv, Tk * d_qk);
    ac->out = malloc((size_t)(Tq * H * d_v) * 4);
    ac->lse = malloc((size_t)(Tq * H) * 4);
    ck_assert_int_eq(cuda_alloc(gpu, (size_t)(Tq * H * d_v) * 2, &ac->g_out, &err), 0);
    ac->g_lse = to_gpu_f32(gpu, NULL, Tq * H);
    ac->g_idx = to_gpu_i32(gpu, indices, Tq * topk);
}

static void attn_free(attn_case *ac)
{
    cuda_free(gpu, (void *)ac->din.q), cuda_free(gpu, (void *)ac->din.kv), cuda_free(gpu, ac->g_out);
    cuda_free(gpu, ac->g_lse), cuda_free(gpu, ac->g_idx);
    free(ac->q), free(ac->kv), free(ac->out), free(ac->lse), free(ac->idx);
}

static void check_attention(test_batch *tb, int H, int d_qk, int d_v, int32_t topk, int32_t *indices,
                            const char *what)
{
    int64_t Tq = tb->b.n_queries, Tk = tb->b.n_keys;
    char name[128];
    attn_case ac;
    attn_setup(&ac, tb, H, d_qk, d_v, topk, indices);
    ck_assert_int_eq(dsa_reference_sparse_mla_forward(ref, &tb->b, &ac.hin, ac.idx, topk, ac.out, ac.lse, &err),
                     0);
    ck_assert_msg(tilelang_sparse_mla_forward(tl, &tb->dev, &ac.din, ac.g_idx, topk, ac.g_out, ac.g_lse, &err) == 0,
                  "%s", err.message);
    snprintf(name, sizeof name, "%s fwd out", what);
    expect_close(&cc, ac.g_out, DSARL_DTYPE_BF16, ac.out, Tq * H * d_v, 1e-2, name);
    snprintf(name, sizeof name, "%s fwd lse", what);
    expect_close(&cc, ac.g_lse, DSARL_DTYPE_F32, ac.lse, Tq * H, 1e-3, name);

    // backward from the same (bf16-rounded) out and lse on both sides
    float *out16 = round_bf16(ac.out, Tq * H * d_v), *dout = rand_bf16(&stream, Tq * H * d_v, 1);
    float *dkv = rand_bf16(&stream, Tk * d_qk, 0.5f), *dq = malloc((size_t)(Tq * H * d_qk) * 4);
    void *g_out16 = to_gpu_bf16(gpu, out16, Tq * H * d_v), *g_dout = to_gpu_bf16(gpu, dout, Tq * H * d_v),
         *g_dkv = to_gpu_bf16(gpu, dkv, Tk * d_qk);
    void *g_dq = NULL;
    ck_assert_int_eq(cuda_alloc(gpu, (size_t)(Tq * H * d_qk) * 2, &g_dq, &err), 0);
    float *g_lse_ref = to_gpu_f32(gpu, ac.lse, Tq * H);
    ck_assert_int_eq(dsa_reference_sparse_mla_backward(ref, &tb->b, &ac.hin, ac.idx, topk, out16, ac.lse, dout, dq,
                                                       dkv, &err), 0);
    ck_assert_msg(tilelang_sparse_mla_backward(tl, &tb->dev, &ac.din, ac.g_idx, topk, g_out16, g_lse_ref, g_dout,
                                               g_dq, g_dkv, &err) == 0, "%s", err.message);
    snprintf(name, sizeof name, "%s bwd dq", what);
    expect_close(&cc, g_dq, DSARL_DTYPE_BF16, dq, Tq * H * d_qk, 1e-2, name);
    snprintf(name, sizeof name, "%s bwd dkv (+=)", what);
    expect_close(&cc, g_dkv, DSARL_DTYPE_BF16, dkv, Tk * d_qk, 1e-2, name);
    cuda_free(gpu, g_out16), cuda_free(gpu, g_dout), cuda_free(gpu, g_dkv), cuda_free(gpu, g_dq);
    cuda_free(gpu, g_lse_ref);
    free(out16), free(dout), free(dkv), free(dq);
    attn_free(&ac);
}

START_TEST(test_sparse_mla_small)
{
    test_batch tb;
    const int32_t lengths[] = {5, 30, 1, 12};
    batch_packed_gpu(gpu, &tb, lengths, 4);
    check_attention(&tb, 4, 96, 64, 16, random_indices_repeats(&stream, &tb, 16),
                    "sparse_mla pack H4 d96/64 k16 random idx");
    batch_free_gpu(gpu, &tb);
    batch_decode_gpu(gpu, &stream, &tb, 10, 200, 1);
    check_attention(&tb, 3, 40, 32, 24, random_indices_repeats(&stream, &tb, 24), "sparse_mla decode H3 d40/32 k24");
    batch_free_gpu(gpu, &tb);
}
END_TEST

// GLM-5 head dims (d_qk 576 = 512 + 64, d_v 512), 20 heads (a partial head group), indices from the indexer.
START_TEST(test_sparse_mla_glm5_dims)
{
    test_batch tb;
    const int32_t lengths[] = {40, 90};
    batch_packed_gpu(gpu, &tb, lengths, 2);
    int64_t T = tb.b.n_queries;
    int32_t topk = 64;
    float *q = rand_bf16(&stream, T * 4 * 32, 1), *k = rand_bf16(&stream, T * 32, 1),
          *w = rand_bf16(&stream, T * 4, 0.2f);
    dsarl_dsa_indexer_inputs in = {.struct_size = sizeof(in), .q = q, .k = k, .weights = w, .n_heads = 4,
                                   .head_dim = 32};
    int32_t *idx = malloc((size_t)(T * topk) * 4);
    ck_assert_int_eq(dsa_reference_indexer_topk(ref, &tb.b, &in, topk, idx, NULL, &err), 0);
    int32_t *idx2 = malloc((size_t)(T * topk) * 4);
    memcpy(idx2, idx, (size_t)(T * topk) * 4);
    check_attention(&tb, 20, 576, 512, topk, idx, "sparse_mla pack H20 d576/512 k64 (tensor cores)");
    dsarl_dsa_context *keep = tl; /* the CUDA-core kernels on the same shapes */
    tl = tl_cc;
    check_attention(&tb, 20, 576, 512, topk, idx2, "sparse_mla pack H20 d576/512 k64 (cuda cores)");
    tl = keep;
    // 40 heads: the forward's 32-head blocks plus a partial one of 8
    int32_t *idx3 = malloc((size_t)(T * topk) * 4);
    ck_assert_int_eq(dsa_reference_indexer_topk(ref, &tb.b, &in, topk, idx3, NULL, &err), 0);
    check_attention(&tb, 40, 576, 512, topk, idx3, "sparse_mla pack H40 d576/512 k64 (tensor cores)");
    free(q), free(k), free(w);
    batch_free_gpu(gpu, &tb);
}
END_TEST

/* --- indexer loss ----------------------------------------------------------------------------------------- */

static void check_loss(test_batch *tb, int H, int d_qk, int nh, int hd, int32_t topk, int sparse, const char *what)
{
    int64_t Tq = tb->b.n_queries, Tk = tb->b.n_keys;
    char name[128];
    attn_case ac;
    int32_t *idx = NULL;
    float *iq = rand_bf16(&stream, Tq * nh * hd, 1), *ik = rand_bf16(&stream, Tk * hd, 1),
          *iw = rand_bf16(&stream, Tq * nh, 0.3f);
    dsarl_dsa_indexer_inputs hin = {.struct_size = sizeof(hin), .q = iq, .k = ik, .weights = iw, .n_heads = nh,
                                    .head_dim = hd};
    if (sparse) {
        idx = malloc((size_t)(Tq * topk) * 4);
        ck_assert_int_eq(dsa_reference_indexer_topk(ref, &tb->b, &hin, topk, idx, NULL, &err), 0);
    } else {
        idx = calloc(1, 4); /* dense warm-up: no indices; a placeholder so the case owns one array either way */
    }
    attn_setup(&ac, tb, H, d_qk, d_qk - 16, sparse ? topk : 1, idx);
    if (sparse) /* the sparse loss takes the sparse attention's lse */
        ck_assert_int_eq(dsa_reference_sparse_mla_forward(ref, &tb->b, &ac.hin, idx, topk, ac.out, ac.lse, &err),
                         0);
    else
        memset(ac.lse, 0, (size_t)(Tq * H) * 4);
    float *g_lse = to_gpu_f32(gpu, ac.lse, Tq * H);
    dsarl_dsa_indexer_inputs din = hin;
    din.q = to_gpu_bf16(gpu, iq, Tq * nh * hd);
    din.k = to_gpu_bf16(gpu, ik, Tk * hd);
    din.weights = to_gpu_f32(gpu, iw, Tq * nh);
    const int32_t *h_idx = sparse ? idx : NULL, *d_idx = sparse ? ac.g_idx : NULL;
    const float *h_lse = sparse ? ac.lse : NULL, *d_lse = sparse ? g_lse : NULL;
    float *loss = malloc((size_t)Tq * 4), *g_loss = to_gpu_f32(gpu, NULL, Tq);
    ck_assert_int_eq(dsa_reference_indexer_loss_forward(ref, &tb->b, &ac.hin, h_lse, &hin, h_idx, topk, loss, &err),
                     0);
    ck_assert_msg(tilelang_indexer_loss_forward(tl, &tb->dev, &ac.din, d_lse, &din, d_idx, topk, g_loss, &err) == 0,
                  "%s", err.message);
    snprintf(name, sizeof name, "%s loss", what);
    expect_close(&cc, g_loss, DSARL_DTYPE_F32, loss, Tq, 1e-3, name);

    float *dloss = rand_bf16(&stream, Tq, 1), *dq = malloc((size_t)(Tq * nh * hd) * 4),
          *dk = rand_bf16(&stream, Tk * hd, 0.3f);
    float *dw = malloc((size_t)(Tq * nh) * 4);
    float *g_dloss = to_gpu_f32(gpu, dloss, Tq), *g_dw = to_gpu_f32(gpu, NULL, Tq * nh);
    void *g_dk = to_gpu_bf16(gpu, dk, Tk * hd), *g_dq = NULL;
    ck_assert_int_eq(cuda_alloc(gpu, (size_t)(Tq * nh * hd) * 2, &g_dq, &err), 0);
    ck_assert_int_eq(dsa_reference_indexer_loss_backward(ref, &tb->b, &ac.hin, h_lse, &hin, h_idx, topk, dloss, dq,
                                                         dk, dw, &err), 0);
    ck_assert_msg(tilelang_indexer_loss_backward(tl, &tb->dev, &ac.din, d_lse, &din, d_idx, topk, g_dloss, g_dq, g_dk,
                                                 g_dw, &err) == 0, "%s", err.message);
    snprintf(name, sizeof name, "%s dq_index", what);
    expect_close(&cc, g_dq, DSARL_DTYPE_BF16, dq, Tq * nh * hd, 1e-2, name);
    snprintf(name, sizeof name, "%s dk_index (+=)", what);
    expect_close(&cc, g_dk, DSARL_DTYPE_BF16, dk, Tk * hd, 1e-2, name);
    snprintf(name, sizeof name, "%s dweights", what);
    expect_close(&cc, g_dw, DSARL_DTYPE_F32, dw, Tq * nh, 1e-3, name);
    cuda_free(gpu, g_lse), cuda_free(gpu, (void *)din.q), cuda_free(gpu, (void *)din.k);
    cuda_free(gpu, (void *)din.weights), cuda_free(gpu, g_loss), cuda_free(gpu, g_dloss), cuda_free(gpu, g_dw);
    cuda_free(gpu, g_dk), cuda_free(gpu, g_dq);
    free(iq), free(ik), free(iw), free(loss), free(dloss), free(dq), free(dk), free(dw);
    attn_free(&ac);
}

START_TEST(test_indexer_loss)
{
    test_batch tb;
    const int32_t lengths[] = {6, 40, 25};
    batch_packed_gpu(gpu, &tb, lengths, 3);
    check_loss(&tb, 8, 80, 4, 32, 16, 1, "indexer_loss sparse pack k16");
    check_loss(&tb, 8, 80, 4, 32, 16, 0, "indexer_loss dense pack");
    batch_free_gpu(gpu, &tb);
    batch_decode_gpu(gpu, &stream, &tb, 12, 150, 1);
    check_loss(&tb, 4, 576, 8, 128, 32, 1, "indexer_loss sparse decode d576 8x128 k32");
    batch_free_gpu(gpu, &tb);
}
END_TEST

/* --- first timings (DSARL_GPU_BENCH=1) ------------------------------------------------------------------- */

static double time_ms(int (*run)(void *), void *arg, int reps)
{
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    ck_assert_int_eq(run(arg), 0); /* warm-up */
    cudaEventRecord(a, 0);
    for (int i = 0; i < reps; i++)
        ck_assert_int_eq(run(arg), 0);
    cudaEventRecord(b, 0);
    ck_assert_int_eq(cudaEventSynchronize(b), cudaSuccess);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms / reps;
}

typedef struct bench_args {
    dsarl_dsa_batch *batch;
    dsarl_dsa_indexer_inputs *index;
    dsarl_dsa_attention_inputs *attn;
    int32_t topk, *idx;
    void *out, *dout, *dq, *dkv;
    float *lse, *scores;
} bench_args;

static int run_topk(void *p)
{
    bench_args *b = p;
    return tilelang_indexer_topk(tl, b->batch, b->index, b->topk, b->idx, b->scores, &err);
}
static int run_fwd(void *p)
{
    bench_args *b = p;
    return tilelang_sparse_mla_forward(tl, b->batch, b->attn, b->idx, b->topk, b->out, b->lse, &err);
}
static int run_bwd(void *p)
{
    bench_args *b = p;
    return tilelang_sparse_mla_backward(tl, b->batch, b->attn, b->idx, b->topk, b->out, b->lse, b->dout, b->dq, b->dkv,
                                        &err);
}

START_TEST(test_bench)
{
    if (!getenv("DSARL_GPU_BENCH")) {
        printf("check_dsa_tilelang: timings skipped (set DSARL_GPU_BENCH=1)\n");
        return;
    }
    // ceilings measured in this run: a bf16 GEMM through the cuda device (cuBLASLt) and a device-to-device copy
    {
        int64_t n = 8192;
        void *a = NULL, *b = NULL, *c = NULL;
        ck_assert_int_eq(cuda_alloc(gpu, (size_t)(n * n) * 2, &a, &err), 0);
        ck_assert_int_eq(cuda_alloc(gpu, (size_t)(n * n) * 2, &b, &err), 0);
        ck_assert_int_eq(cuda_alloc(gpu, (size_t)(n * n) * 2, &c, &err), 0);
        float *ones = rand_bf16(&stream, n * n, 1);
        ck_assert_int_eq(cuda_upload_f32(gpu, a, DSARL_DTYPE_BF16, ones, (size_t)(n * n), &err), 0);
        ck_assert_int_eq(cuda_upload_f32(gpu, b, DSARL_DTYPE_BF16, ones, (size_t)(n * n), &err), 0);
        free(ones);
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        ck_assert_int_eq(cuda_gemm(gpu, false, true, n, n, n, 1.0f, a, b, 0.0f, c, &err), 0);
        ck_assert_int_eq(cuda_synchronize(gpu, &err), 0);
        cudaEventRecord(e0, 0);
        for (int i = 0; i < 10; i++)
            ck_assert_int_eq(cuda_gemm(gpu, false, true, n, n, n, 1.0f, a, b, 0.0f, c, &err), 0);
        cudaEventRecord(e1, 0);
        ck_assert_int_eq(cudaEventSynchronize(e1), cudaSuccess);
        ck_assert_int_eq(cuda_synchronize(gpu, &err), 0);
        float gemm_ms = 0.0f;
        cudaEventElapsedTime(&gemm_ms, e0, e1);
        cudaEventRecord(e0, 0);
        for (int i = 0; i < 10; i++)
            ck_assert_int_eq(cudaMemcpyAsync(c, a, (size_t)(n * n) * 2, cudaMemcpyDeviceToDevice, 0), cudaSuccess);
        cudaEventRecord(e1, 0);
        ck_assert_int_eq(cudaEventSynchronize(e1), cudaSuccess);
        float copy_ms = 0.0f;
        cudaEventElapsedTime(&copy_ms, e0, e1);
        printf("check_dsa_tilelang: BENCH ceilings: bf16 gemm 8192^3 %.1f TFLOP/s (cuBLASLt via the cuda device); "
               "device copy %.2f TB/s (read + write)\n", 2.0 * n * n * n * 10 / (gemm_ms * 1e9),
               2.0 * (double)(n * n) * 2 * 10 / (copy_ms * 1e9));
        cudaEventDestroy(e0), cudaEventDestroy(e1);
        cuda_free(gpu, a), cuda_free(gpu, b), cuda_free(gpu, c);
    }
    // indexer: 8192 packed tokens (one causal sequence), 32 heads x 128 dims, top-2048
    test_batch tb;
    const int32_t len8k[] = {8192};
    batch_packed_gpu(gpu, &tb, len8k, 1);
    int64_t T = 8192;
    float *q = rand_bf16(&stream, T * 32 * 128, 1), *k = rand_bf16(&stream, T * 128, 1),
          *w = rand_bf16(&stream, T * 32, 0.2f);
    dsarl_dsa_indexer_inputs din = {.struct_size = sizeof(din), .q = to_gpu_bf16(gpu, q, T * 32 * 128),
                                    .k = to_gpu_bf16(gpu, k, T * 128), .weights = to_gpu_f32(gpu, w, T * 32),
                                    .n_heads = 32, .head_dim = 128};
    bench_args b = {.batch = &tb.dev, .index = &din, .topk = 2048, .idx = to_gpu_i32(gpu, NULL, T * 2048)};
    dsarl_dsa_context *keep = tl;
    tl = tl_cc;
    double ms_cc = time_ms(run_topk, &b, 1);
    tl = keep;
    double ms = time_ms(run_topk, &b, 3);
    double flops = 2.0 * 32 * 128 * (double)T * (T + 1) / 2;
    printf("check_dsa_tilelang: BENCH indexer_topk T=8192 causal, 32x128, k=2048: %.2f ms (%.1f TFLOP/s on the "
           "scores; target <= 2 ms; CUDA-core scores %.2f ms)\n", ms, flops / ms / 1e9, ms_cc);
    cuda_free(gpu, (void *)din.q), cuda_free(gpu, (void *)din.k), cuda_free(gpu, (void *)din.weights);
    free(q), free(k), free(w);
    batch_free_gpu(gpu, &tb);

    // sparse MLA: 512 decode-style queries each over 2048 selected keys of a 4096-key array, 64 heads, 576/512
    int64_t Tq = 512, Tk = 4096;
    int H = 64, d_qk = 576, d_v = 512;
    int32_t topk = 2048;
    batch_alloc(&tb, Tq, Tk);
    int32_t *idx = malloc((size_t)(Tq * topk) * 4);
    for (int64_t t = 0; t < Tq; t++) {
        tb.key_start[t] = 0, tb.key_end[t] = (int32_t)Tk;
        for (int32_t i = 0; i < topk; i++)
            idx[t * topk + i] = (int32_t)((i * 2 + t) % Tk);
    }
    batch_set_max(&tb);
    batch_to_gpu(gpu, &tb);
    float *hq = rand_bf16(&stream, Tq * H * d_qk, 1), *hkv = rand_bf16(&stream, Tk * d_qk, 1);
    dsarl_dsa_attention_inputs ain = {.struct_size = sizeof(ain), .q = to_gpu_bf16(gpu, hq, Tq * H * d_qk),
                                      .kv = to_gpu_bf16(gpu, hkv, Tk * d_qk), .n_heads = H, .d_qk = d_qk, .d_v = d_v,
                                      .softmax_scale = 1.0f / sqrtf((float)d_qk)};
    bench_args m = {.batch = &tb.dev, .attn = &ain, .topk = topk, .idx = to_gpu_i32(gpu, idx, Tq * topk),
                    .out = to_gpu_bf16(gpu, hq, Tq * H * d_v), .dout = to_gpu_bf16(gpu, hq, Tq * H * d_v),
                    .dq = to_gpu_bf16(gpu, hq, Tq * H * d_qk), .dkv = to_gpu_bf16(gpu, hkv, Tk * d_qk),
                    .lse = to_gpu_f32(gpu, NULL, Tq * H)};
    keep = tl;
    tl = tl_cc;
    double fwd_cc = time_ms(run_fwd, &m, 1), bwd_cc = time_ms(run_bwd, &m, 1);
    tl = keep;
    double fwd_ms = time_ms(run_fwd, &m, 3);
    double fwd_flops = 2.0 * Tq * H * topk * (double)(d_qk + d_v);
    printf("check_dsa_tilelang: BENCH sparse_mla_forward Tq=512 H=64 d=576/512 k=2048: %.2f ms = %.1f TFLOP/s "
           "(target 450; CUDA-core kernel %.2f ms = %.1f TFLOP/s)\n", fwd_ms, fwd_flops / fwd_ms / 1e9, fwd_cc,
           fwd_flops / fwd_cc / 1e9);
    double bwd_ms = time_ms(run_bwd, &m, 3);
    double bwd_flops = 2.0 * Tq * H * topk * (double)(2 * d_qk + 2 * d_v + d_qk); /* 5 products of the tile */
    printf("check_dsa_tilelang: BENCH sparse_mla_backward Tq=512 H=64 d=576/512 k=2048: %.2f ms = %.1f TFLOP/s "
           "(target 200; CUDA-core kernel %.2f ms = %.1f TFLOP/s)\n", bwd_ms, bwd_flops / bwd_ms / 1e9, bwd_cc,
           bwd_flops / bwd_cc / 1e9);
    cuda_free(gpu, (void *)ain.q), cuda_free(gpu, (void *)ain.kv), cuda_free(gpu, m.idx), cuda_free(gpu, m.out);
    cuda_free(gpu, m.dout), cuda_free(gpu, m.dq), cuda_free(gpu, m.dkv), cuda_free(gpu, m.lse);
    free(hq), free(hkv), free(idx);
    batch_free_gpu(gpu, &tb);
}
END_TEST

static Suite *dsa_tilelang_suite(void)
{
    Suite *s = suite_create("dsa_tilelang");
    TCase *tc = tcase_create("vs_reference");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_indexer_topk_packed);
    tcase_add_test(tc, test_indexer_topk_decode);
    tcase_add_test(tc, test_sparse_mla_small);
    tcase_add_test(tc, test_sparse_mla_glm5_dims);
    tcase_add_test(tc, test_indexer_loss);
    tcase_add_test(tc, test_bench);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    if (cuda_visible_devices() == 0) {
        printf("check_dsa_tilelang: skipped: no CUDA device is visible\n");
        return 77;
    }
    stream = cuda_test_seed("check_dsa_tilelang", 0x853C49E6748FEA9Bull);
    SRunner *sr = srunner_create(dsa_tilelang_suite());
    srunner_set_fork_status(sr, CK_NOFORK); /* CUDA does not survive fork */
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
