/* check_dsa_indexer_fast.c: the tilelang backend's two-kernel indexer_topk (tensor-core scores of query tiles +
 * per-row radix select, backends/dsa/tilelang/indexer_fast.cuh) against the reference backend on fresh random
 * inputs.
 *
 * Two kinds of input:
 * - exact: q and k small integers, head weights multiples of 1/16, so every dot product and score is exact in
 *   fp32 and in the reference's double, whatever the summation order. Scores then tie often (and always for
 *   duplicated key rows and for rows whose weights are all 0), and the result must equal the reference's exactly:
 *   with scores, the same keys in the same order (descending, ties to the lower index) and the same scores; without,
 *   the same set.
 * - float: uniform bf16 q/k and float32 weights (the check_dsa_tilelang inputs). fp32 accumulation may flip
 *   near-ties against the double reference, so a key outside the reference set is accepted only when its exact
 *   score equals the k-th within a margin, and returned scores must match the exact ones within it, in descending
 *   order. The margin is 1e-4 of the row's largest |score| or 2e-5 of the row's magnitude bound
 *   (sum_j |w_j| ||q_j|| max ||k||), whichever is larger: a row whose scores cancel to ~1e-6 has no useful
 *   relative error of its own.
 * Every case runs without scores (the model's and the bench's call) and with them, under the default kernel
 * configuration and the alternative one kept for timing comparisons (4-warp score tiles, 256-thread select), into
 * outputs poisoned beforehand, and checks every slot: in-range keys, no repeats, -1 / -inf past min(topk,
 * eligible). Shapes: ragged causal packs (rows shorter and longer than topk), topk 16 / 64 / 100 / 256 / 512 / 1000
 * / 2048, n_heads 8 / 16 / 32 / 64, head dims 32 / 64 / 128 (one reference run per case, cut to each topk),
 * decode-style ranges into a 40000-key array (rows longer than the select's shared-memory row, so it reads them
 * from global memory, and one empty row), and packs split into chunks of query rows (runtime.tilelang_indexer_chunk).
 * DSARL_GPU_BENCH=1 adds timings at the shape (8192 causal tokens, 32 x 128, top-2048), first: each kernel
 * alone, the whole op with and without scores, in both configurations, and the row-wise kernel it replaces.
 * Label gpu; exit status 77 (skipped) without a GPU. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime_api.h>
#include "cuda_device.h"
#include "dsa_reference.h"
#include "indexer_fast.h"
#include "tilelang.h"
#include "cuda_test_util.h"
#include "tilelang_test_util.h"

static dsarl_device *gpu;
static dsarl_dsa_context *tl, *ref;
static dsarl_dsa_context *tl_configs[2]; /* use_config's contexts: the default keys and the alternatives */
static dsarl_error err;
static rng stream; /* the run's random inputs (cuda_test_util.h) */

static void setup(void)
{
    dsarl_parallel single = DSARL_PARALLEL_SINGLE;
    dsarl_device_config cfg = {.struct_size = sizeof(cfg), .parallel = &single};
    ck_assert_msg(cuda_create(&cfg, &gpu, &err) == 0, "%s", err.message);
    ck_assert_msg(tilelang_create(&dsarl_cuda_device_ops, gpu, NULL, &tl, &err) == 0, "%s", err.message);
    ck_assert_int_eq(dsa_reference_create(NULL, NULL, NULL, &ref, &err), 0);
    tl_configs[0] = tl;
    tl_configs[1] = tilelang_with_keys(gpu, "runtime:\n  tilelang_score_warps: 4\n  tilelang_select_threads: 256\n");
}

static void teardown(void)
{
    tilelang_destroy(tl_configs[0]);
    tilelang_destroy(tl_configs[1]);
    dsa_reference_destroy(ref);
    cuda_destroy(gpu);
}

/* --- inputs ----------------------------------------------------------------------------------------------- */

typedef struct indexer_case {
    int nh, hd;
    int exact;              /* small-integer inputs: exact scores, frequent ties */
    float *q, *k, *w;       /* host float32 (bf16-representable q and k) */
    double key_norm_max;    /* the largest ||k_s||: bounds every |q . k_s| with ||q|| */
    dsarl_dsa_indexer_inputs hin, din;
} indexer_case;

static void case_make(indexer_case *c, const test_batch *tb, int nh, int hd, int exact)
{
    int64_t Tq = tb->b.n_queries, Tk = tb->b.n_keys;
    c->nh = nh, c->hd = hd, c->exact = exact;
    c->q = malloc((size_t)(Tq * nh * hd) * 4);
    c->k = malloc((size_t)(Tk * hd) * 4);
    c->w = malloc((size_t)(Tq * nh) * 4);
    for (int64_t i = 0; i < Tq * nh * hd; i++)
        c->q[i] = exact ? (float)(rng_below(&stream, 5) - 2) : bf16_value(rng_sym(&stream));
    for (int64_t i = 0; i < Tk * hd; i++)
        c->k[i] = exact ? (float)(rng_below(&stream, 5) - 2) : bf16_value(rng_sym(&stream));
    for (int64_t i = 0; i < Tq * nh; i++)
        c->w[i] = exact ? (float)(rng_below(&stream, 9) - 4) / 16.0f : 0.2f * rng_sym(&stream);
    if (exact) {
        // adversarial ties: every 5th key row a copy of an earlier one; every 7th query has all weights 0 (every
        // score 0: the lowest key indices win)
        for (int64_t s = 1; s < Tk; s++)
            if (s % 5 == 0)
                memcpy(c->k + s * hd, c->k + (int64_t)rng_below(&stream, (int32_t)s) * hd, (size_t)hd * 4);
        for (int64_t t = 0; t < Tq; t += 7)
            memset(c->w + t * nh, 0, (size_t)nh * 4);
    }
    c->key_norm_max = 0.0;
    for (int64_t s = 0; s < Tk; s++) {
        double sq = 0.0;
        for (int d = 0; d < hd; d++)
            sq += (double)c->k[s * hd + d] * c->k[s * hd + d];
        c->key_norm_max = fmax(c->key_norm_max, sqrt(sq));
    }
    c->hin = (dsarl_dsa_indexer_inputs){.struct_size = sizeof(c->hin), .q = c->q, .k = c->k, .weights = c->w,
                                        .n_heads = nh, .head_dim = hd};
    c->din = c->hin;
    c->din.q = to_gpu_bf16(gpu, c->q, Tq * nh * hd);
    c->din.k = to_gpu_bf16(gpu, c->k, Tk * hd);
    c->din.weights = to_gpu_f32(gpu, c->w, Tq * nh);
}

static void case_free(indexer_case *c)
{
    cuda_free(gpu, (void *)c->din.q), cuda_free(gpu, (void *)c->din.k), cuda_free(gpu, (void *)c->din.weights);
    free(c->q), free(c->k), free(c->w);
}

// Exact score of key s for query t (double), as the reference defines it.
static double exact_score(const indexer_case *c, int64_t t, int32_t s)
{
    double score = 0.0;
    for (int j = 0; j < c->nh; j++) {
        double dot = 0.0;
        for (int d = 0; d < c->hd; d++)
            dot += (double)c->q[(t * c->nh + j) * c->hd + d] * c->k[(int64_t)s * c->hd + d];
        if (dot > 0.0)
            score += (double)c->w[t * c->nh + j] * dot;
    }
    return score;
}

// An upper bound of the magnitudes that add up to row t's scores: sum_j |w_tj| ||q_tj|| max_s ||k_s||. A score's
// fp32 rounding error scales with it, not with the score itself, which cancellation or ReLU can make tiny (a row
// whose only key scores 5.6e-6 has no useful relative error of its own).
static double score_scale(const indexer_case *c, int64_t t)
{
    double scale = 0.0;
    for (int j = 0; j < c->nh; j++) {
        double sq = 0.0;
        for (int d = 0; d < c->hd; d++)
            sq += (double)c->q[(t * c->nh + j) * c->hd + d] * c->q[(t * c->nh + j) * c->hd + d];
        scale += fabs((double)c->w[t * c->nh + j]) * sqrt(sq);
    }
    return scale * c->key_norm_max;
}

/* --- the check -------------------------------------------------------------------------------------------- */

// The kernel configurations every case runs under: the defaults (8-warp score tiles, 512-thread select) and the
// alternatives kept for timing comparisons (4-warp tiles, 256-thread select with per-warp first histograms).
// (runtime.tilelang_score_warps = 4 and runtime.tilelang_select_threads = 256; contexts made in setup).
static const char *const config_names[2] = {"default", "4-warp/v2"};

static void use_config(int c) { tl = tl_configs[c]; }

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Runs the op into poisoned outputs (indices 0x5a5a5a5a, scores NaN) and downloads them.
static void run_fast(const test_batch *tb, const indexer_case *c, int32_t topk, int with_scores, int32_t *idx,
                     float *scores)
{
    int64_t n = tb->b.n_queries * topk;
    int32_t *gidx = dev_alloc(gpu, (size_t)n * 4);
    float *gsc = with_scores ? dev_alloc(gpu, (size_t)n * 4) : NULL;
    ck_assert_int_eq(cudaMemset(gidx, 0x5a, (size_t)n * 4), cudaSuccess);
    if (gsc)
        ck_assert_int_eq(cudaMemset(gsc, 0xff, (size_t)n * 4), cudaSuccess);
    ck_assert_msg(tilelang_indexer_topk(tl, &tb->dev, &c->din, topk, gidx, gsc, &err) == 0, "%s", err.message);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    ck_assert_int_eq(cuda_copy(gpu, idx, gidx, (size_t)n * 4, DSARL_COPY_DEVICE_TO_HOST, &err), 0);
    if (gsc)
        ck_assert_int_eq(cuda_copy(gpu, scores, gsc, (size_t)n * 4, DSARL_COPY_DEVICE_TO_HOST, &err), 0);
    cuda_free(gpu, gidx);
    if (gsc)
        cuda_free(gpu, gsc);
}

// The reference's top-k_max rows (descending, ties to the lower index) cut to topk <= k_max: exactly the
// reference's top-k, so one reference run serves every topk of a case (the reference is the slow part).
typedef struct ref_topk {
    int32_t k_max, *idx;
    float *scores;
} ref_topk;

static ref_topk ref_run(const test_batch *tb, const indexer_case *c, int32_t k_max, const char *what)
{
    int64_t Tq = tb->b.n_queries;
    ref_topk r = {.k_max = k_max, .idx = malloc((size_t)(Tq * k_max) * 4), .scores = malloc((size_t)(Tq * k_max) * 4)};
    double t0 = seconds();
    ck_assert_int_eq(dsa_reference_indexer_topk(ref, &tb->b, &c->hin, k_max, r.idx, r.scores, &err), 0);
    printf("check_dsa_indexer_fast: %s: reference top-%d in %.2f s\n", what, k_max, seconds() - t0);
    fflush(stdout);
    return r;
}

static void check_case(const test_batch *tb, const indexer_case *c, const ref_topk *r, int32_t topk,
                       const char *what)
{
    int64_t Tq = tb->b.n_queries, Tk = tb->b.n_keys;
    int32_t *ref_idx = malloc((size_t)(Tq * topk) * 4), *got = malloc((size_t)(Tq * topk) * 4);
    float *ref_sc = malloc((size_t)(Tq * topk) * 4), *got_sc = malloc((size_t)(Tq * topk) * 4);
    int64_t *mark = malloc((size_t)(Tk > 0 ? Tk : 1) * 8); /* mark[s] = row * 2 + 1 when s is in that row's ref set */
    float *ref_of = malloc((size_t)(Tk > 0 ? Tk : 1) * 4);  /* the reference score of a marked key */
    ck_assert(topk <= r->k_max);
    for (int64_t t = 0; t < Tq; t++) {
        memcpy(ref_idx + t * topk, r->idx + t * r->k_max, (size_t)topk * 4);
        memcpy(ref_sc + t * topk, r->scores + t * r->k_max, (size_t)topk * 4);
    }
    for (int run = 0; run < 4; run++) {
        const int with_scores = run & 1, config = run >> 1;
        use_config(config);
        run_fast(tb, c, topk, with_scores, got, got_sc);
        use_config(0);
        for (int64_t s = 0; s < Tk; s++)
            mark[s] = -1;
        int swaps = 0;
        double worst = 0.0;
        for (int64_t t = 0; t < Tq; t++) {
            const int32_t n = tb->key_end[t] - tb->key_start[t], kk = n < topk ? n : topk;
            const int32_t *gr = got + t * topk, *rr = ref_idx + t * topk;
            const float *gs = got_sc + t * topk, *rs = ref_sc + t * topk;
            double row_max = 1e-30;
            for (int32_t i = 0; i < kk; i++) {
                row_max = fmax(row_max, fabs(rs[i]));
                mark[rr[i]] = t * 2 + 1;
                ref_of[rr[i]] = rs[i];
            }
            // 1e-4 of the row's largest score, or 2e-5 of its magnitude bound (fp32 dot products over hd <= 128
            // terms err by at most hd * 2^-24 = 7.6e-6 of it), whichever is larger
            const double tol = c->exact ? 0.0 : fmax(1e-4 * row_max, 2e-5 * score_scale(c, t));
            const double kth = kk > 0 ? rs[kk - 1] : 0.0;
            for (int32_t i = 0; i < topk; i++) {
                const int32_t s = gr[i];
                if (i >= kk) {
                    ck_assert_msg(s == -1, "%s: row %lld slot %d holds %d, want -1", what, (long long)t, i, s);
                    ck_assert_msg(!with_scores || (isinf(gs[i]) && gs[i] < 0), "%s: row %lld slot %d score %g, "
                                  "want -inf", what, (long long)t, i, gs[i]);
                    continue;
                }
                ck_assert_msg(s >= tb->key_start[t] && s < tb->key_end[t],
                              "%s: row %lld slot %d key %d outside [%d, %d)", what, (long long)t, i, s,
                              tb->key_start[t], tb->key_end[t]);
                ck_assert_msg(mark[s] != t * 2 + 2, "%s: row %lld lists key %d twice", what, (long long)t, s);
                const int in_ref = mark[s] == t * 2 + 1;
                mark[s] = t * 2 + 2; /* seen in this row (no longer counts as an unseen reference key) */
                if (c->exact) {
                    ck_assert_msg(in_ref, "%s: row %lld picked key %d (score %g), not in the reference top %d "
                                  "(k-th %g)", what, (long long)t, s, exact_score(c, t, s), kk, kth);
                    if (with_scores) {
                        ck_assert_msg(s == rr[i], "%s: row %lld slot %d is key %d, reference %d (same scores: the "
                                      "order and the tie rule must agree)", what, (long long)t, i, s, rr[i]);
                        ck_assert_msg(gs[i] == rs[i], "%s: row %lld key %d score %.9g, reference %.9g", what,
                                      (long long)t, s, gs[i], rs[i]);
                    }
                    continue;
                }
                const double score = in_ref ? ref_of[s] : exact_score(c, t, s);
                if (!in_ref) { /* only a key tied with the k-th within rounding may replace a reference key */
                    swaps++;
                    ck_assert_msg(fabs(score - kth) <= tol, "%s: row %lld picked key %d (score %.9g) outside the "
                                  "reference set (k-th %.9g)", what, (long long)t, s, score, kth);
                }
                if (with_scores) {
                    worst = fmax(worst, fabs(gs[i] - score) / row_max);
                    ck_assert_msg(fabs(gs[i] - score) <= tol, "%s: row %lld key %d score %.9g, exact %.9g", what,
                                  (long long)t, s, gs[i], score);
                    ck_assert_msg(fabs(gs[i] - rs[i]) <= tol, "%s: row %lld rank %d score %.9g, reference %.9g", what,
                                  (long long)t, i, gs[i], rs[i]);
                    ck_assert_msg(i == 0 || gs[i] <= gs[i - 1], "%s: row %lld not in descending order at %d", what,
                                  (long long)t, i);
                }
            }
        }
        printf("check_dsa_indexer_fast: %-46s %-9s %-7s %s, %d near-tie swaps, score rel err %.1e, %lld rows\n",
               what, config_names[config], with_scores ? "+scores" : "indices",
               c->exact ? "exact match" : "sets match", swaps, worst, (long long)Tq);
        fflush(stdout);
    }
    free(ref_idx), free(got), free(ref_sc), free(got_sc), free(mark), free(ref_of);
}

static void check_packed(const int32_t *lengths, int n_seq, int nh, int hd, int exact, const int32_t *topks,
                         int n_topk, const char *what)
{
    test_batch tb;
    indexer_case c;
    char name[160];
    batch_packed_gpu(gpu, &tb, lengths, n_seq);
    case_make(&c, &tb, nh, hd, exact);
    ck_assert_msg(tilelang_indexer_scores_mma_fits(&c.din), "%s: the inputs should take the tensor-core path", what);
    int32_t k_max = 0;
    for (int i = 0; i < n_topk; i++)
        k_max = topks[i] > k_max ? topks[i] : k_max;
    ref_topk r = ref_run(&tb, &c, k_max, what);
    for (int i = 0; i < n_topk; i++) {
        snprintf(name, sizeof name, "%s %dx%d k%d", what, nh, hd, topks[i]);
        check_case(&tb, &c, &r, topks[i], name);
    }
    free(r.idx), free(r.scores);
    case_free(&c);
    batch_free_gpu(gpu, &tb);
}

START_TEST(test_exact_ragged)
{
    const int32_t lengths[] = {1, 5, 64, 65, 200, 700, 3, 130};
    const int32_t topks[] = {64, 100};
    check_packed(lengths, 8, 32, 128, 1, topks, 2, "exact ragged pack");
    const int32_t k16[] = {16};
    check_packed(lengths, 8, 16, 32, 1, k16, 1, "exact ragged pack");
    check_packed(lengths, 8, 8, 64, 1, k16, 1, "exact ragged pack");
}
END_TEST

START_TEST(test_exact_long_rows)
{
    const int32_t lengths[] = {1100, 37, 300};
    const int32_t topks[] = {512, 1000};
    check_packed(lengths, 3, 32, 128, 1, topks, 2, "exact pack");
    const int32_t t2048[] = {2200, 9};
    const int32_t k2048[] = {2048};
    check_packed(t2048, 2, 32, 32, 1, k2048, 1, "exact pack");
}
END_TEST

START_TEST(test_float_packs)
{
    const int32_t lengths[] = {2600, 300, 2};
    const int32_t topks[] = {2048, 64};
    check_packed(lengths, 3, 16, 64, 0, topks, 2, "float pack");
    const int32_t mid[] = {600, 90, 17};
    const int32_t k256[] = {256};
    check_packed(mid, 3, 64, 128, 0, k256, 1, "float pack");
    check_packed(mid, 3, 32, 128, 0, k256, 1, "float pack");
}
END_TEST

START_TEST(test_decode_long_ranges)
{
    // 50 queries, windows of 12000..40000 keys: rows beyond the select's 16384-key shared row, and one empty row
    test_batch tb;
    indexer_case c;
    batch_decode_gpu(gpu, &stream, &tb, 50, 40000, 12000);
    case_make(&c, &tb, 8, 64, 0);
    ref_topk r = ref_run(&tb, &c, 2048, "float decode ranges");
    check_case(&tb, &c, &r, 2048, "float decode ranges 8x64 k2048");
    free(r.idx), free(r.scores);
    case_free(&c);
    case_make(&c, &tb, 8, 64, 1);
    r = ref_run(&tb, &c, 512, "exact decode ranges");
    check_case(&tb, &c, &r, 512, "exact decode ranges 8x64 k512");
    free(r.idx), free(r.scores);
    case_free(&c);
    batch_free_gpu(gpu, &tb);
}
END_TEST

START_TEST(test_chunks)
{
    // query rows in chunks of 100 (not a multiple of any query tile) and of 64
    const int32_t lengths[] = {300, 250, 1, 77};
    const int32_t topks[] = {64};
    // the chunked context stands in for the default configuration (check_case switches tl between tl_configs)
    dsarl_dsa_context *keep = tl_configs[0];
    tl = tl_configs[0] = tilelang_with_keys(gpu, "runtime:\n  tilelang_indexer_chunk: 100\n");
    check_packed(lengths, 4, 32, 128, 1, topks, 1, "exact pack, chunks of 100 rows");
    tilelang_destroy(tl_configs[0]);
    tl = tl_configs[0] = tilelang_with_keys(gpu, "runtime:\n  tilelang_indexer_chunk: 64\n");
    check_packed(lengths, 4, 64, 64, 0, topks, 1, "float pack, chunks of 64 rows");
    tilelang_destroy(tl_configs[0]);
    tl = tl_configs[0] = keep;
    const int32_t one[] = {1};
    check_packed(one, 1, 32, 128, 0, topks, 1, "single query");
}
END_TEST

/* --- timings (DSARL_GPU_BENCH=1) -------------------------------------------------------------------------- */

typedef struct bench_args {
    test_batch *tb;
    dsarl_dsa_indexer_inputs *in;
    int32_t topk, *idx;
    float *scores;
    uint32_t *ws;
    int64_t ld_ws;
    int phase; /* 0 the op, 1 scores kernel only, 2 select kernel only */
} bench_args;

// Mean of reps timed runs after one warm-up, CUDA events around each.
static double time_ms(bench_args *b, int reps)
{
    int64_t T = b->tb->b.n_queries, mk = b->tb->b.max_keys_per_query;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    float total = 0.0f;
    for (int r = 0; r <= reps; r++) {
        cudaEventRecord(e0, 0);
        int rc = 0;
        if (b->phase == 0)
            rc = tilelang_indexer_topk(tl, &b->tb->dev, b->in, b->topk, b->idx, b->scores, &err);
        else if (b->phase == 1)
            rc = tilelang_indexer_scores_mma(tl, &b->tb->dev, b->in, 0, T, b->ws, b->ld_ws, mk, b->topk, &err);
        else
            rc = tilelang_indexer_select(tl, &b->tb->dev, 0, T, b->ws, b->ld_ws, mk, b->topk, b->idx, NULL, &err);
        ck_assert_msg(rc == 0, "%s", err.message);
        cudaEventRecord(e1, 0);
        ck_assert_int_eq(cudaEventSynchronize(e1), cudaSuccess);
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, e0, e1);
        if (r > 0)
            total += ms;
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return total / reps;
}

START_TEST(test_bench)
{
    if (!getenv("DSARL_GPU_BENCH")) {
        printf("check_dsa_indexer_fast: timings skipped (set DSARL_GPU_BENCH=1)\n");
        return;
    }
    test_batch tb;
    const int32_t len8k[] = {8192};
    batch_packed_gpu(gpu, &tb, len8k, 1);
    int64_t T = 8192;
    float *q = malloc((size_t)(T * 32 * 128) * 4), *k = malloc((size_t)(T * 128) * 4);
    float *w = malloc((size_t)(T * 32) * 4);
    for (int64_t i = 0; i < T * 32 * 128; i++)
        q[i] = rng_sym(&stream);
    for (int64_t i = 0; i < T * 128; i++)
        k[i] = rng_sym(&stream);
    for (int64_t i = 0; i < T * 32; i++)
        w[i] = 0.2f * rng_sym(&stream);
    dsarl_dsa_indexer_inputs din = {.struct_size = sizeof(din), .q = to_gpu_bf16(gpu, q, T * 32 * 128),
                                    .k = to_gpu_bf16(gpu, k, T * 128), .weights = to_gpu_f32(gpu, w, T * 32),
                                    .n_heads = 32, .head_dim = 128};
    bench_args b = {.tb = &tb, .in = &din, .topk = 2048, .idx = dev_alloc(gpu, (size_t)(T * 2048) * 4), .ld_ws = T};
    b.ws = dev_alloc(gpu, (size_t)(T * T) * 4);
    float *scores = dev_alloc(gpu, (size_t)(T * 2048) * 4);
    const double flops = 2.0 * 32 * 128 * (double)T * (T + 1) / 2;
    const double scored = flops * (1.0 - 1.0 / 16.0); /* rows with <= 2048 keys take them all, unscored */
    double ms[2][4];
    for (int c = 0; c < 2; c++) { /* the op, the op with scores, the scores kernel, the select kernel */
        use_config(c);
        for (int phase = 0; phase < 4; phase++) {
            b.phase = phase < 2 ? 0 : phase - 1;
            b.scores = phase == 1 ? scores : NULL;
            ms[c][phase] = time_ms(&b, 5);
        }
        use_config(0);
        printf("check_dsa_indexer_fast: BENCH %-9s indexer_topk T=8192 causal 32x128 k=2048: %.3f ms (%.1f TFLOP/s "
               "on the scores; target <= 2 ms), with scores %.3f ms; scores kernel %.3f ms (%.1f TFLOP/s), select "
               "kernel %.3f ms\n", config_names[c], ms[c][0], flops / ms[c][0] / 1e9, ms[c][1], ms[c][2],
               scored / ms[c][2] / 1e9, ms[c][3]);
        fflush(stdout);
    }
    b.phase = 0;
    b.scores = NULL;
    dsarl_dsa_context *keep = tl;
    tl = tilelang_with_keys(gpu, "runtime:\n  tilelang_indexer: rowwise\n");
    const double rowwise = time_ms(&b, 2);
    tilelang_destroy(tl);
    tl = keep;
    printf("check_dsa_indexer_fast: BENCH row-wise kernel (before) %.3f ms\n", rowwise);
    cuda_free(gpu, (void *)din.q), cuda_free(gpu, (void *)din.k), cuda_free(gpu, (void *)din.weights);
    cuda_free(gpu, b.idx), cuda_free(gpu, b.ws), cuda_free(gpu, scores);
    free(q), free(k), free(w);
    batch_free_gpu(gpu, &tb);
}
END_TEST

static Suite *indexer_fast_suite(void)
{
    Suite *s = suite_create("dsa_indexer_fast");
    TCase *tc = tcase_create("vs_reference");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_bench); /* first: timings come back even if a later case runs out of time */
    tcase_add_test(tc, test_exact_ragged);
    tcase_add_test(tc, test_exact_long_rows);
    tcase_add_test(tc, test_chunks);
    tcase_add_test(tc, test_decode_long_ranges);
    suite_add_tcase(s, tc);
    TCase *floats = tcase_create("float_packs"); /* its own case: CK_RUN_CASE=float_packs runs it alone */
    tcase_add_checked_fixture(floats, setup, teardown);
    tcase_set_timeout(floats, 600);
    tcase_add_test(floats, test_float_packs);
    suite_add_tcase(s, floats);
    return s;
}

int main(void)
{
    if (cuda_visible_devices() == 0) {
        printf("check_dsa_indexer_fast: skipped: no CUDA device is visible\n");
        return 77;
    }
    stream = cuda_test_seed("check_dsa_indexer_fast", 0x9E3779B97F4A7C15ull);
    SRunner *sr = srunner_create(indexer_fast_suite());
    srunner_set_fork_status(sr, CK_NOFORK); /* CUDA does not survive fork */
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
