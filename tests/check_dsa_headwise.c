/* check_dsa_headwise.c: the reference backend's per-head (non-absorbed) attention ops (ABI 1.1) against its
 * absorbed ops on the same MLA problem, and against a dense per-head softmax attention written here in double.
 *
 * One problem: a random latent c (Tk, kv_lora), a shared rope key k_rope (Tk, rope), per-head projections W_UK
 * (H, nope, kv_lora) and W_UV (H, d_v, kv_lora), per-head queries q = [q_nope | q_rope] (Tq, H, nope + rope) and
 * an output gradient dout (Tq, H, d_v). The per-head form attends with k_h = [c W_UK_h^T | k_rope], v_h = c W_UV_h^T;
 * the absorbed form with q_abs_h = [q_nope_h W_UK_h | q_rope_h] over kv = [c | k_rope] and maps the latent output
 * back with W_UV_h. Both must give the same out and lse, and the same gradients of every underlying tensor
 * (q, c, k_rope, W_UK, W_UV), to float32 rounding. Batches: ragged causal packs with segments shorter and longer
 * than topk, random index rows (-1 slots anywhere, rows with fewer keys than topk, one row with no key), NULL
 * indices (every eligible key), a decode-style batch with an empty range, and GLM-5's head sizes
 * (192 + 64, d_v 256, kv_lora 512). Fresh random inputs each run (DSARL_TEST_SEED=<n> replays one). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsa_reference.h"
#include "dsa_test_util.h"

/* Decode style: arbitrary ranges into a longer key array; query 1's range is empty. */
static void batch_decode(test_batch *tb, rng *r, int64_t n_queries, int32_t n_keys)
{
    batch_alloc(tb, n_queries, n_keys);
    for (int64_t t = 0; t < n_queries; t++) {
        int32_t start = rng_below(r, n_keys);
        int32_t end = t == 1 ? start : start + 1 + rng_below(r, n_keys - start);
        tb->key_start[t] = start, tb->key_end[t] = end;
    }
    batch_set_max(tb);
}

/* Rows listing every eligible key in order, -1 after: what the indexer returns for rows no longer than topk. */
static int32_t *full_indices(const test_batch *tb, int32_t topk)
{
    int32_t *indices = zalloc((size_t)(tb->b.n_queries * topk), sizeof(int32_t));
    for (int64_t t = 0; t < tb->b.n_queries; t++)
        for (int32_t i = 0; i < topk; i++)
            indices[t * topk + i] = tb->key_start[t] + i < tb->key_end[t] ? tb->key_start[t] + i : -1;
    return indices;
}

/* ------------------------------------------------------------------------------------------------------------
 * The MLA problem in both forms. */

typedef struct dims {
    int h, nope, rope, kvr, dv;
} dims;

typedef struct problem {
    dims d;
    int64_t tq, tk;
    float scale;
    float *q, *c, *k_rope, *w_uk, *w_uv, *dout; // the underlying tensors (shapes in the file comment)
    float *k, *v;                               // per-head form: (Tk, H, nope + rope), (Tk, H, dv)
    float *q_abs, *kv;                          // absorbed form: (Tq, H, kvr + rope), (Tk, kvr + rope)
} problem;

static void problem_make(problem *pb, rng *r, dims d, int64_t tq, int64_t tk)
{
    memset(pb, 0, sizeof(*pb));
    pb->d = d, pb->tq = tq, pb->tk = tk;
    int dqk = d.nope + d.rope, dabs = d.kvr + d.rope;
    pb->scale = (float)(1.0 / sqrt((double)dqk));
    pb->q = random_floats(r, tq * d.h * dqk, 1.5f);
    pb->c = random_floats(r, tk * d.kvr, 1.0f);
    pb->k_rope = random_floats(r, tk * d.rope, 1.5f);
    pb->w_uk = random_floats(r, (int64_t)d.h * d.nope * d.kvr, (float)(2.0 / sqrt((double)d.kvr)));
    pb->w_uv = random_floats(r, (int64_t)d.h * d.dv * d.kvr, (float)(2.0 / sqrt((double)d.kvr)));
    pb->dout = random_floats(r, tq * d.h * d.dv, 1.0f);
    pb->k = zalloc((size_t)(tk * d.h * dqk), sizeof(float));
    pb->v = zalloc((size_t)(tk * d.h * d.dv), sizeof(float));
    pb->q_abs = zalloc((size_t)(tq * d.h * dabs), sizeof(float));
    pb->kv = zalloc((size_t)(tk * dabs), sizeof(float));
    for (int64_t s = 0; s < tk; s++) {
        const float *c_s = pb->c + s * d.kvr;
        for (int h = 0; h < d.h; h++) {
            float *k_sh = pb->k + (s * d.h + h) * dqk, *v_sh = pb->v + (s * d.h + h) * d.dv;
            for (int j = 0; j < d.nope; j++)
                k_sh[j] = (float)dsa_ref_dot(c_s, pb->w_uk + ((int64_t)h * d.nope + j) * d.kvr, d.kvr);
            memcpy(k_sh + d.nope, pb->k_rope + s * d.rope, (size_t)d.rope * sizeof(float));
            for (int j = 0; j < d.dv; j++)
                v_sh[j] = (float)dsa_ref_dot(c_s, pb->w_uv + ((int64_t)h * d.dv + j) * d.kvr, d.kvr);
        }
        memcpy(pb->kv + s * dabs, c_s, (size_t)d.kvr * sizeof(float));
        memcpy(pb->kv + s * dabs + d.kvr, pb->k_rope + s * d.rope, (size_t)d.rope * sizeof(float));
    }
    for (int64_t t = 0; t < tq; t++)
        for (int h = 0; h < d.h; h++) {
            const float *q_th = pb->q + (t * d.h + h) * dqk;
            float *qa = pb->q_abs + (t * d.h + h) * dabs;
            for (int l = 0; l < d.kvr; l++) {
                double sum = 0.0;
                for (int j = 0; j < d.nope; j++)
                    sum += (double)q_th[j] * pb->w_uk[((int64_t)h * d.nope + j) * d.kvr + l];
                qa[l] = (float)sum;
            }
            memcpy(qa + d.kvr, q_th + d.nope, (size_t)d.rope * sizeof(float));
        }
}

static void problem_free(problem *pb)
{
    float *all[] = {pb->q, pb->c, pb->k_rope, pb->w_uk, pb->w_uv, pb->dout, pb->k, pb->v, pb->q_abs, pb->kv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

/* Results of one form, mapped back to the underlying tensors (double). */
typedef struct results {
    double *out, *lse;         // (Tq, H, dv), (Tq, H)
    double *dq, *dc, *dk_rope; // (Tq, H, nope + rope), (Tk, kvr), (Tk, rope)
    double *dw_uk, *dw_uv;     // (H, nope, kvr), (H, dv, kvr)
} results;

static void results_alloc(results *res, const problem *pb)
{
    dims d = pb->d;
    res->out = zalloc((size_t)(pb->tq * d.h * d.dv), sizeof(double));
    res->lse = zalloc((size_t)(pb->tq * d.h), sizeof(double));
    res->dq = zalloc((size_t)(pb->tq * d.h * (d.nope + d.rope)), sizeof(double));
    res->dc = zalloc((size_t)(pb->tk * d.kvr), sizeof(double));
    res->dk_rope = zalloc((size_t)(pb->tk * d.rope), sizeof(double));
    res->dw_uk = zalloc((size_t)d.h * d.nope * d.kvr, sizeof(double));
    res->dw_uv = zalloc((size_t)d.h * d.dv * d.kvr, sizeof(double));
}

static void results_free(results *res)
{
    free(res->out), free(res->lse), free(res->dq), free(res->dc), free(res->dk_rope), free(res->dw_uk);
    free(res->dw_uv);
}

/* The per-head ops, then the chain rule back through k_h = [c W_UK_h^T | k_rope], v_h = c W_UV_h^T. */
static void run_headwise(const problem *pb, const test_batch *tb, const int32_t *indices, int32_t topk, results *res)
{
    dims d = pb->d;
    int dqk = d.nope + d.rope;
    int64_t tq = pb->tq, tk = pb->tk;
    dsarl_dsa_headwise_inputs in = {.struct_size = sizeof(in),
                                    .q = pb->q,
                                    .k = pb->k,
                                    .v = pb->v,
                                    .n_heads = d.h,
                                    .d_qk = dqk,
                                    .d_v = d.dv,
                                    .softmax_scale = pb->scale};
    float *out = zalloc((size_t)(tq * d.h * d.dv), sizeof(float)), *lse = zalloc((size_t)(tq * d.h), sizeof(float));
    float *dq = zalloc((size_t)(tq * d.h * dqk), sizeof(float));
    float *dk = zalloc((size_t)(tk * d.h * dqk), sizeof(float)), *dv = zalloc((size_t)(tk * d.h * d.dv), sizeof(float));
    for (int64_t i = 0; i < tk * d.h * dqk; i++)
        dk[i] = 1e6f; // overwritten, never accumulated into
    for (int64_t i = 0; i < tk * d.h * d.dv; i++)
        dv[i] = -1e6f;
    dsarl_dsa_context *ctx = NULL;
    dsarl_error err = {0};
    const dsarl_dsa_ops *ops = &dsarl_dsa_reference_ops;
    ck_assert_int_eq(ops->create(NULL, NULL, NULL, &ctx, &err), DSARL_OK);
    ck_assert(DSARL_DSA_HAS(ops, headwise_attention_forward) && DSARL_DSA_HAS(ops, headwise_attention_backward));
    ck_assert_msg(ops->headwise_attention_forward(ctx, &tb->b, &in, indices, topk, out, lse, &err) == 0, "%s",
                  err.message);
    ck_assert_msg(
        ops->headwise_attention_backward(ctx, &tb->b, &in, indices, topk, out, lse, pb->dout, dq, dk, dv, &err) == 0,
        "%s", err.message);
    ops->destroy(ctx);
    for (int64_t i = 0; i < tq * d.h * d.dv; i++)
        res->out[i] = out[i];
    for (int64_t i = 0; i < tq * d.h; i++)
        res->lse[i] = lse[i];
    for (int64_t i = 0; i < tq * d.h * dqk; i++)
        res->dq[i] = dq[i];
    for (int64_t s = 0; s < tk; s++)
        for (int h = 0; h < d.h; h++) {
            const float *dk_sh = dk + (s * d.h + h) * dqk, *dv_sh = dv + (s * d.h + h) * d.dv;
            const float *c_s = pb->c + s * d.kvr;
            for (int j = 0; j < d.nope; j++) {
                const float *w = pb->w_uk + ((int64_t)h * d.nope + j) * d.kvr;
                double *dw = res->dw_uk + ((int64_t)h * d.nope + j) * d.kvr;
                for (int l = 0; l < d.kvr; l++)
                    res->dc[s * d.kvr + l] += (double)dk_sh[j] * w[l], dw[l] += (double)dk_sh[j] * c_s[l];
            }
            for (int j = 0; j < d.dv; j++) {
                const float *w = pb->w_uv + ((int64_t)h * d.dv + j) * d.kvr;
                double *dw = res->dw_uv + ((int64_t)h * d.dv + j) * d.kvr;
                for (int l = 0; l < d.kvr; l++)
                    res->dc[s * d.kvr + l] += (double)dv_sh[j] * w[l], dw[l] += (double)dv_sh[j] * c_s[l];
            }
            for (int j = 0; j < d.rope; j++)
                res->dk_rope[s * d.rope + j] += dk_sh[d.nope + j];
        }
    free(out), free(lse), free(dq), free(dk), free(dv);
}

/* The absorbed ops (indices required), then the chain rule through q_abs and W_UV. */
static void run_absorbed(const problem *pb, const test_batch *tb, const int32_t *indices, int32_t topk, results *res)
{
    dims d = pb->d;
    int dqk = d.nope + d.rope, dabs = d.kvr + d.rope;
    int64_t tq = pb->tq, tk = pb->tk;
    dsarl_dsa_attention_inputs in = {.struct_size = sizeof(in),
                                     .q = pb->q_abs,
                                     .kv = pb->kv,
                                     .n_heads = d.h,
                                     .d_qk = dabs,
                                     .d_v = d.kvr,
                                     .softmax_scale = pb->scale};
    float *out_lat = zalloc((size_t)(tq * d.h * d.kvr), sizeof(float));
    float *lse = zalloc((size_t)(tq * d.h), sizeof(float));
    float *dout_lat = zalloc((size_t)(tq * d.h * d.kvr), sizeof(float));
    float *dq_abs = zalloc((size_t)(tq * d.h * dabs), sizeof(float));
    float *dkv = zalloc((size_t)(tk * dabs), sizeof(float));
    dsarl_dsa_context *ctx = NULL;
    dsarl_error err = {0};
    const dsarl_dsa_ops *ops = &dsarl_dsa_reference_ops;
    ck_assert_int_eq(ops->create(NULL, NULL, NULL, &ctx, &err), DSARL_OK);
    ck_assert_msg(ops->sparse_mla_forward(ctx, &tb->b, &in, indices, topk, out_lat, lse, &err) == 0, "%s", err.message);
    for (int64_t t = 0; t < tq; t++)
        for (int h = 0; h < d.h; h++) {
            const float *ol = out_lat + (t * d.h + h) * d.kvr, *g = pb->dout + (t * d.h + h) * d.dv;
            for (int j = 0; j < d.dv; j++) { // out_h = out_latent_h W_UV_h^T; dW_UV_h += dout_h^T out_latent_h
                const float *w = pb->w_uv + ((int64_t)h * d.dv + j) * d.kvr;
                res->out[(t * d.h + h) * d.dv + j] = dsa_ref_dot(ol, w, d.kvr);
                for (int l = 0; l < d.kvr; l++)
                    res->dw_uv[((int64_t)h * d.dv + j) * d.kvr + l] += (double)g[j] * ol[l];
            }
            for (int l = 0; l < d.kvr; l++) { // dout_latent_h = dout_h W_UV_h
                double sum = 0.0;
                for (int j = 0; j < d.dv; j++)
                    sum += (double)g[j] * pb->w_uv[((int64_t)h * d.dv + j) * d.kvr + l];
                dout_lat[(t * d.h + h) * d.kvr + l] = (float)sum;
            }
            res->lse[t * d.h + h] = lse[t * d.h + h];
        }
    ck_assert_msg(
        ops->sparse_mla_backward(ctx, &tb->b, &in, indices, topk, out_lat, lse, dout_lat, dq_abs, dkv, &err) == 0, "%s",
        err.message);
    ops->destroy(ctx);
    for (int64_t t = 0; t < tq; t++)
        for (int h = 0; h < d.h; h++) {
            const float *dqa = dq_abs + (t * d.h + h) * dabs, *q_th = pb->q + (t * d.h + h) * dqk;
            double *dq = res->dq + (t * d.h + h) * dqk;
            for (int j = 0; j < d.nope; j++) { // q_abs_h = q_nope_h W_UK_h
                const float *w = pb->w_uk + ((int64_t)h * d.nope + j) * d.kvr;
                dq[j] = dsa_ref_dot(dqa, w, d.kvr);
                for (int l = 0; l < d.kvr; l++)
                    res->dw_uk[((int64_t)h * d.nope + j) * d.kvr + l] += (double)q_th[j] * dqa[l];
            }
            for (int j = 0; j < d.rope; j++)
                dq[d.nope + j] = dqa[d.kvr + j];
        }
    for (int64_t s = 0; s < tk; s++) {
        for (int l = 0; l < d.kvr; l++)
            res->dc[s * d.kvr + l] = dkv[s * dabs + l];
        for (int j = 0; j < d.rope; j++)
            res->dk_rope[s * d.rope + j] = dkv[s * dabs + d.kvr + j];
    }
    free(out_lat), free(lse), free(dout_lat), free(dq_abs), free(dkv);
}

/* Dense per-head softmax attention in double over a (Tq, Tk) multiplicity mask: out and lse of the per-head form. */
static void dense_reference(const problem *pb, const int32_t *mask, double *out, double *lse)
{
    dims d = pb->d;
    int dqk = d.nope + d.rope;
    double *logit = zalloc((size_t)pb->tk, sizeof(double));
    for (int64_t t = 0; t < pb->tq; t++)
        for (int h = 0; h < d.h; h++) {
            double m = -INFINITY, sum = 0.0;
            for (int64_t s = 0; s < pb->tk; s++)
                if (mask[t * pb->tk + s]) {
                    double dot = 0.0;
                    for (int c = 0; c < dqk; c++)
                        dot += (double)pb->q[(t * d.h + h) * dqk + c] * pb->k[(s * d.h + h) * dqk + c];
                    logit[s] = pb->scale * dot, m = fmax(m, logit[s]);
                }
            double *o = out + (t * d.h + h) * d.dv;
            memset(o, 0, (size_t)d.dv * sizeof(double));
            lse[t * d.h + h] = INFINITY;
            if (m == -INFINITY)
                continue;
            for (int64_t s = 0; s < pb->tk; s++)
                if (mask[t * pb->tk + s])
                    sum += mask[t * pb->tk + s] * exp(logit[s] - m);
            for (int64_t s = 0; s < pb->tk; s++)
                if (mask[t * pb->tk + s])
                    for (int c = 0; c < d.dv; c++)
                        o[c] += mask[t * pb->tk + s] * exp(logit[s] - m) / sum * pb->v[(s * d.h + h) * d.dv + c];
            lse[t * d.h + h] = m + log(sum);
        }
    free(logit);
}

/* ------------------------------------------------------------------------------------------------------------
 * Comparison. */

static double worst_seen; // largest relative difference over the suite's comparisons, printed at the end

/* max |got - want| / max |want| over n values; +inf entries (lse of empty rows) must match exactly. */
static void assert_same(const char *what, const double *got, const double *want, int64_t n, double tol)
{
    double max_ref = 0.0, max_diff = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (isinf(want[i]) || isinf(got[i])) {
            ck_assert_msg(got[i] == want[i], "%s[%lld]: got %g, want %g (seed %llu)", what, (long long)i, got[i],
                          want[i], (unsigned long long)test_seed);
            continue;
        }
        max_ref = fmax(max_ref, fabs(want[i]));
        max_diff = fmax(max_diff, fabs(got[i] - want[i]));
    }
    ck_assert_msg(max_ref > 1e-3, "%s: the reference is ~0, the comparison checks nothing", what);
    double rel = max_diff / max_ref;
    worst_seen = fmax(worst_seen, rel);
    fprintf(stderr, "  %-8s max |diff| / max |ref| = %.3g\n", what, rel);
    ck_assert_msg(rel <= tol, "%s: relative difference %.3g > %.3g (seed %llu)", what, rel, tol,
                  (unsigned long long)test_seed);
}

static void compare(const char *name, const problem *pb, const results *hw, const results *ab)
{
    dims d = pb->d;
    const double tol = 2e-5; // float32 rounding of the operands of both forms, accumulated over kv_lora terms
    fprintf(stderr, "%s (Tq %lld, H %d, nope %d, rope %d, kv_lora %d, d_v %d):\n", name, (long long)pb->tq, d.h, d.nope,
            d.rope, d.kvr, d.dv);
    assert_same("out", hw->out, ab->out, pb->tq * d.h * d.dv, tol);
    assert_same("lse", hw->lse, ab->lse, pb->tq * d.h, tol);
    assert_same("dq", hw->dq, ab->dq, pb->tq * d.h * (d.nope + d.rope), tol);
    assert_same("dc_kv", hw->dc, ab->dc, pb->tk * d.kvr, tol);
    assert_same("dk_rope", hw->dk_rope, ab->dk_rope, pb->tk * d.rope, tol);
    assert_same("dW_UK", hw->dw_uk, ab->dw_uk, (int64_t)d.h * d.nope * d.kvr, tol);
    assert_same("dW_UV", hw->dw_uv, ab->dw_uv, (int64_t)d.h * d.dv * d.kvr, tol);
}

/* Both forms on one batch: headwise with hw_indices (NULL = every key), absorbed with ab_indices (the same set). */
static void check_forms(const char *name, const problem *pb, const test_batch *tb, const int32_t *hw_indices,
                        const int32_t *ab_indices, int32_t topk)
{
    results hw, ab;
    results_alloc(&hw, pb);
    results_alloc(&ab, pb);
    run_headwise(pb, tb, hw_indices, topk, &hw);
    run_absorbed(pb, tb, ab_indices, topk, &ab);
    compare(name, pb, &hw, &ab);
    // and the forward against dense per-head attention over the same key multiset
    int32_t *mask = zalloc((size_t)(pb->tq * pb->tk), sizeof(int32_t));
    for (int64_t t = 0; t < pb->tq; t++)
        for (int32_t i = 0; i < topk; i++)
            if (ab_indices[t * topk + i] >= 0)
                mask[t * pb->tk + ab_indices[t * topk + i]]++;
    double *out = zalloc((size_t)(pb->tq * pb->d.h * pb->d.dv), sizeof(double));
    double *lse = zalloc((size_t)(pb->tq * pb->d.h), sizeof(double));
    dense_reference(pb, mask, out, lse);
    assert_same("out~dense", hw.out, out, pb->tq * pb->d.h * pb->d.dv, 1e-6);
    assert_same("lse~dense", hw.lse, lse, pb->tq * pb->d.h, 1e-6);
    free(mask), free(out), free(lse);
    results_free(&hw);
    results_free(&ab);
}

static const dims small = {.h = 3, .nope = 6, .rope = 4, .kvr = 10, .dv = 7};

START_TEST(test_ragged_pack_random_indices)
{
    rng r = rng_for(1);
    const int32_t lengths[] = {1, 5, 13, 30, 8}; // around topk 8: shorter, equal, longer
    test_batch tb;
    batch_packed(&tb, lengths, 5);
    problem pb;
    problem_make(&pb, &r, small, tb.b.n_queries, tb.b.n_keys);
    const int32_t topk = 8;
    int32_t *indices = random_indices(&r, &tb, topk, 23); // row 23 has no key: out 0, lse +inf, no gradient
    check_forms("ragged pack, random index rows", &pb, &tb, indices, indices, topk);
    free(indices);
    problem_free(&pb);
    batch_free(&tb);
}
END_TEST

START_TEST(test_null_indices_every_key)
{
    rng r = rng_for(2);
    const int32_t lengths[] = {7, 1, 19, 4};
    test_batch tb;
    batch_packed(&tb, lengths, 4);
    problem pb;
    problem_make(&pb, &r, small, tb.b.n_queries, tb.b.n_keys);
    const int32_t topk = 24; // every segment is shorter: rows hold all their keys, then -1
    int32_t *all = full_indices(&tb, topk);
    check_forms("ragged pack, NULL indices vs absorbed over every key", &pb, &tb, NULL, all, topk);
    // NULL indices and rows listing every key are the same set: the per-head op gives the same numbers
    results a, b;
    results_alloc(&a, &pb);
    results_alloc(&b, &pb);
    run_headwise(&pb, &tb, NULL, topk, &a);
    run_headwise(&pb, &tb, all, topk, &b);
    assert_same("out(NULL~full rows)", a.out, b.out, pb.tq * pb.d.h * pb.d.dv, 0.0);
    assert_same("dc(NULL~full rows)", a.dc, b.dc, pb.tk * pb.d.kvr, 0.0);
    results_free(&a);
    results_free(&b);
    free(all);
    problem_free(&pb);
    batch_free(&tb);
}
END_TEST

START_TEST(test_decode_ranges_empty_row)
{
    rng r = rng_for(3);
    test_batch tb;
    batch_decode(&tb, &r, 6, 40);
    problem pb;
    problem_make(&pb, &r, small, tb.b.n_queries, tb.b.n_keys);
    const int32_t topk = 5;
    int32_t *indices = random_indices(&r, &tb, topk, -1);
    check_forms("decode-style ranges, random index rows", &pb, &tb, indices, indices, topk);
    int32_t *all = full_indices(&tb, tb.b.max_keys_per_query);
    check_forms("decode-style ranges, NULL indices", &pb, &tb, NULL, all, tb.b.max_keys_per_query);
    free(all);
    free(indices);
    problem_free(&pb);
    batch_free(&tb);
}
END_TEST

START_TEST(test_glm5_head_sizes)
{
    rng r = rng_for(4);
    const int32_t lengths[] = {3, 21};
    test_batch tb;
    batch_packed(&tb, lengths, 2);
    problem pb;
    const dims glm5 = {.h = 2, .nope = 192, .rope = 64, .kvr = 512, .dv = 256};
    problem_make(&pb, &r, glm5, tb.b.n_queries, tb.b.n_keys);
    const int32_t topk = 16;
    int32_t *indices = random_indices(&r, &tb, topk, -1);
    check_forms("GLM-5 head sizes (d_qk 256 = 192 + 64, d_v 256, kv_lora 512)", &pb, &tb, indices, indices, topk);
    free(indices);
    problem_free(&pb);
    batch_free(&tb);
}
END_TEST

START_TEST(test_refuses_bad_arguments)
{
    rng r = rng_for(5);
    const int32_t lengths[] = {4, 6};
    test_batch tb;
    batch_packed(&tb, lengths, 2);
    problem pb;
    problem_make(&pb, &r, small, tb.b.n_queries, tb.b.n_keys);
    dsarl_dsa_headwise_inputs in = {.struct_size = sizeof(in),
                                    .q = pb.q,
                                    .k = pb.k,
                                    .v = pb.v,
                                    .n_heads = small.h,
                                    .d_qk = small.nope + small.rope,
                                    .d_v = small.dv,
                                    .softmax_scale = pb.scale};
    float out[10 * 3 * 7], lse[10 * 3];
    dsarl_error err = {0};
    const dsarl_dsa_ops *ops = &dsarl_dsa_reference_ops;
    in.d_v = 0;
    ck_assert_int_eq(ops->headwise_attention_forward(NULL, &tb.b, &in, NULL, 4, out, lse, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "d_v = 0") != NULL, "%s", err.message);
    in.d_v = small.dv;
    int32_t *indices = full_indices(&tb, 4);
    indices[4 * 4 + 1] = 2; // query 4 (segment 2) may not see key 2 of segment 1
    ck_assert_int_eq(ops->headwise_attention_forward(NULL, &tb.b, &in, indices, 4, out, lse, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "indices[4][1]") != NULL, "%s", err.message);
    ck_assert_int_eq(ops->preferred_form(NULL, &tb.b, 4), DSARL_DSA_FORM_ABSORBED);
    ck_assert_ptr_null(ops->routes);
    free(indices);
    problem_free(&pb);
    batch_free(&tb);
}
END_TEST

static Suite *dsa_headwise_suite(void)
{
    Suite *s = suite_create("dsa_headwise");
    TCase *tc = tcase_create("reference");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_ragged_pack_random_indices);
    tcase_add_test(tc, test_null_indices_every_key);
    tcase_add_test(tc, test_decode_ranges_empty_row);
    tcase_add_test(tc, test_glm5_head_sizes);
    tcase_add_test(tc, test_refuses_bad_arguments);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    const char *env = getenv("DSARL_TEST_SEED");
    test_seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
    printf("check_dsa_headwise: DSARL_TEST_SEED=%llu\n", (unsigned long long)test_seed);
    SRunner *sr = srunner_create(dsa_headwise_suite());
    srunner_set_fork_status(sr, CK_NOFORK); // one process, so the worst difference can be printed at the end
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    printf("check_dsa_headwise: worst relative difference headwise vs absorbed/dense %.3g\n", worst_seen);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
