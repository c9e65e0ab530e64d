/* check_dsa_mla_sm90.c: the Hopper wgmma sparse MLA forward of the tilelang backend (sparse_mla_forward_sm90.cu)
 * against the reference backend on fresh random inputs at GLM-5 dims (d_qk 576 = 512 + 64, d_v 512).
 *
 * Inputs are drawn in float32 and rounded to bf16 once; the reference (double accumulation) runs on those values as
 * float32 host arrays, split over host threads by query rows so that topk 2048 stays affordable. Cases: 64 and 128
 * heads, 16 and 80 (their last group of 64 padded), 8 declined by the per-query kernel; 8, 16 and 32 heads through
 * query groups too (64 / H queries per block over their keys' union); topk 64, 100 (a partial last tile), 128, 256 and
 * 2048; ragged causal packs where early rows have fewer eligible keys than topk; decode-style ranges into a
 * longer key array (one empty); unsorted slots, -1 holes anywhere, repeated keys, rows with only a few valid keys
 * and one row with none; rows whose valid keys fill only the first slots (the trailing -1 tiles are skipped).
 * out and lse are poisoned (NaN) before every launch. Comparison: ||out - ref|| / ||ref|| and max |out - ref| /
 * max |ref| (bf16 outputs, 1e-2), lse max abs error relative to max(1, max |lse|) (1e-3); +inf lse and zero rows
 * must match exactly. A bigger shape checks the new kernel against the previous (WMMA) kernel and that two launches
 * agree bit for bit.
 * DSARL_GPU_BENCH=1 prints first timings (the performance figures of record come from `dsarl bench dsa`).
 * CK_RUN_CASE=small runs only the quick cases (for compute-sanitizer).
 * Label gpu; exit status 77 (skipped) without a GPU or on a device that is not compute capability 9.0. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "cuda_device.h"
#include "dsa_reference.h"
#include "tilelang.h"
#include "cuda_test_util.h"
#include "tilelang_test_util.h"

/* The kernel under test (sparse_mla_forward_sm90.cu); *used = 0 when it does not take the shape. */
int tilelang_sparse_mla_forward_sm90(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                     const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk,
                                     void *out, float *lse, int *used, dsarl_error *err);
/* Query groups at 8/16/32 heads (the lists themselves are checked exactly by check_dsa_mla_bwd_sm90). */
int tilelang_sparse_mla_query_group(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                    const dsarl_dsa_attention_inputs *in, int32_t topk, int *group, dsarl_error *err);
int tilelang_query_union(dsarl_dsa_context *ctx, const int32_t *indices, int32_t topk, int group, int64_t n_queries,
                         int64_t n_keys, int32_t *union_keys, uint8_t *union_mask, int32_t *union_len,
                         dsarl_error *err);
int tilelang_sparse_mla_forward_sm90_grouped(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                             const dsarl_dsa_attention_inputs *in, int32_t topk, int group,
                                             const int32_t *union_keys, const uint8_t *union_mask,
                                             const int32_t *union_len, void *out, float *lse, int *used,
                                             dsarl_error *err);

#define D_QK 576
#define D_V 512
#define REF_THREADS 16

static dsarl_device *gpu;
static dsarl_dsa_context *tl;
static dsarl_dsa_context *tl_wmma; /* runtime.tilelang_sparse_mla = wmma: the portable kernels on the H200 */
static dsarl_error err;
static rng stream;     /* the run's random inputs (cuda_test_util.h) */
static close_check cc; /* expect_close's device and printed label */

static void setup(void)
{
    dsarl_parallel single = DSARL_PARALLEL_SINGLE;
    dsarl_device_config cfg = {.struct_size = sizeof(cfg), .parallel = &single};
    ck_assert_msg(cuda_create(&cfg, &gpu, &err) == 0, "%s", err.message);
    ck_assert_msg(tilelang_create(&dsarl_cuda_device_ops, gpu, NULL, &tl, &err) == 0, "%s", err.message);
    tl_wmma = tilelang_with_keys(gpu, TL_KEYS_WMMA);
    cc = (close_check){.gpu = gpu, .label = "check_dsa_mla_sm90:", .width = 52, .norm = 1};
}

static void teardown(void)
{
    tilelang_destroy(tl);
    tilelang_destroy(tl_wmma);
    cuda_destroy(gpu);
}

#include "mla_sm90_cases.h"

/* --- the reference, threaded over query rows --------------------------------------------------------------- */

typedef struct ref_job {
    const mla_case *c;
    int64_t t0, t1;
    float *out, *lse;
    int rc;
    dsarl_error err;
} ref_job;

static void *ref_run(void *p)
{
    ref_job *j = p;
    const mla_case *c = j->c;
    dsarl_dsa_context *ref = NULL;
    j->rc = dsa_reference_create(NULL, NULL, NULL, &ref, &j->err);
    if (j->rc)
        return NULL;
    dsarl_dsa_batch b = c->hbatch;
    b.n_queries = j->t1 - j->t0;
    b.key_start = c->start + j->t0, b.key_end = c->end + j->t0;
    dsarl_dsa_attention_inputs in = c->hin;
    in.q = c->q + j->t0 * c->H * D_QK;
    j->rc = dsa_reference_sparse_mla_forward(ref, &b, &in, c->idx + j->t0 * c->topk, c->topk,
                                             j->out + j->t0 * c->H * D_V, j->lse + j->t0 * c->H, &j->err);
    dsa_reference_destroy(ref);
    return NULL;
}

static void reference_forward(const mla_case *c, float *out, float *lse)
{
    pthread_t th[REF_THREADS];
    ref_job jobs[REF_THREADS];
    int64_t per = (c->Tq + REF_THREADS - 1) / REF_THREADS;
    int n = 0;
    for (int64_t t0 = 0; t0 < c->Tq; t0 += per, n++) {
        jobs[n] = (ref_job){.c = c, .t0 = t0, .t1 = t0 + per < c->Tq ? t0 + per : c->Tq, .out = out, .lse = lse};
        ck_assert_int_eq(pthread_create(&th[n], NULL, ref_run, &jobs[n]), 0);
    }
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(jobs[i].rc == 0, "reference: %s", jobs[i].err.message);
    }
}

/* --- launching and comparing ------------------------------------------------------------------------------ */

static void poison(mla_case *c)
{
    ck_assert_int_eq(cudaMemset(c->g_out, 0xFF, (size_t)(c->Tq * c->H * D_V) * 2), cudaSuccess); /* bf16 NaN */
    ck_assert_int_eq(cudaMemset(c->g_lse, 0xFF, (size_t)(c->Tq * c->H) * 4), cudaSuccess);        /* f32 NaN */
}

static void run_sm90(mla_case *c)
{
    int used = 0;
    poison(c);
    ck_assert_msg(tilelang_sparse_mla_forward_sm90(tl, &c->dbatch, &c->din, c->g_idx, c->topk, c->g_out, c->g_lse,
                                                   &used, &err) == 0, "%s", err.message);
    ck_assert_msg(used, "the sm90 kernel did not take H %d, topk %d", c->H, c->topk);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
}

/* The grouped kernel (64 / H queries per block) over the query-union lists of the case's rows. */
static void run_grouped(mla_case *c, int group)
{
    const int64_t groups = (c->Tq + group - 1) / group, cap = (int64_t)group * c->topk;
    int32_t *ukeys = dev_alloc(gpu, (size_t)(groups * cap) * 4), *ulen = dev_alloc(gpu, (size_t)groups * 4);
    uint8_t *umask = dev_alloc(gpu, (size_t)(groups * cap));
    ck_assert_msg(tilelang_query_union(tl, c->g_idx, c->topk, group, c->Tq, c->Tk, ukeys, umask, ulen, &err) == 0,
                  "%s", err.message);
    int used = 0;
    poison(c);
    ck_assert_msg(tilelang_sparse_mla_forward_sm90_grouped(tl, &c->dbatch, &c->din, c->topk, group, ukeys, umask, ulen,
                                                           c->g_out, c->g_lse, &used, &err) == 0, "%s", err.message);
    ck_assert_msg(used, "the grouped sm90 forward did not take H %d, topk %d", c->H, c->topk);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    cuda_free(gpu, ukeys), cuda_free(gpu, umask), cuda_free(gpu, ulen);
}

/* Against the reference: the per-query kernel where it takes the head count, and at 8, 16 and 32 heads the grouped
 * kernel too. */
static void check_case(mla_case *c, const char *what)
{
    char name[160];
    float *out = malloc((size_t)(c->Tq * c->H * D_V) * 4), *lse = malloc((size_t)(c->Tq * c->H) * 4);
    reference_forward(c, out, lse);
    if (tilelang_sparse_mla_sm90_head_groups(c->H)) {
        run_sm90(c);
        snprintf(name, sizeof name, "%s out", what);
        expect_close(&cc, c->g_out, DSARL_DTYPE_BF16, out, c->Tq * c->H * D_V, 1e-2, name);
        snprintf(name, sizeof name, "%s lse", what);
        expect_close_floor(&cc, c->g_lse, DSARL_DTYPE_F32, lse, c->Tq * c->H, 1e-3, 1.0, name);
    }
    int group = 0;
    ck_assert_msg(tilelang_sparse_mla_query_group(tl, &c->dbatch, &c->din, c->topk, &group, &err) == 0, "%s",
                  err.message);
    if (group) {
        run_grouped(c, group);
        snprintf(name, sizeof name, "%s grouped out", what);
        expect_close(&cc, c->g_out, DSARL_DTYPE_BF16, out, c->Tq * c->H * D_V, 1e-2, name);
        snprintf(name, sizeof name, "%s grouped lse", what);
        expect_close_floor(&cc, c->g_lse, DSARL_DTYPE_F32, lse, c->Tq * c->H, 1e-3, 1.0, name);
    }
    free(out), free(lse);
}

START_TEST(test_packed_h64)
{
    mla_case c;
    const int32_t lengths[] = {1, 17, 64, 90, 5};
    case_packed(&c, lengths, 5, 64, 64);
    check_case(&c, "pack 1/17/64/90/5 H64 k64");
    case_free(&c);
    const int32_t one[] = {300};
    case_packed(&c, one, 1, 64, 256);
    check_case(&c, "causal T300 H64 k256");
    case_free(&c);
}
END_TEST

START_TEST(test_packed_h128)
{
    mla_case c;
    const int32_t lengths[] = {33, 120, 2};
    case_packed(&c, lengths, 3, 128, 128);
    check_case(&c, "pack 33/120/2 H128 k128");
    case_free(&c);
    const int32_t lengths2[] = {70, 41};
    case_packed(&c, lengths2, 2, 128, 100);
    check_case(&c, "pack 70/41 H128 k100 (partial tile)");
    case_free(&c);
}
END_TEST

// Head counts that are not whole groups of 64: the last group is padded with zero rows that must never be stored
// (a stray store lands in the next token's heads and fails the comparison); under 16 real heads the kernel declines.
START_TEST(test_padded_heads)
{
    mla_case c;
    const int32_t lengths[] = {33, 70, 2};
    case_packed(&c, lengths, 3, 16, 64);
    check_case(&c, "pack 33/70/2 H16 k64 (one padded group)");
    case_free(&c);
    const int32_t lengths2[] = {41, 90};
    case_packed(&c, lengths2, 2, 80, 100);
    check_case(&c, "pack 41/90 H80 k100 (64 + padded 16)");
    case_free(&c);
    const int32_t lengths3[] = {20};
    case_packed(&c, lengths3, 1, 8, 16);
    int used = 1;
    ck_assert_msg(tilelang_sparse_mla_forward_sm90(tl, &c.dbatch, &c.din, c.g_idx, c.topk, c.g_out, c.g_lse, &used,
                                                   &err) == 0, "%s", err.message);
    ck_assert_msg(!used, "the sm90 kernel took 8 heads (a last group under 16 heads must go to the WMMA kernel)");
    case_free(&c);
}
END_TEST

// Valid keys only in the first slots of each row, -1 after (how the indexer fills rows with fewer eligible keys than
// topk): the kernel skips the trailing all-invalid tiles, so the counts straddle tile edges (0, 1, 63, 64, 65, 128,
// 200, 256), and every third row also has a -1 hole before its last key, which must not end the scan.
START_TEST(test_front_packed)
{
    const int32_t counts[8] = {0, 1, 63, 64, 65, 128, 200, 256};
    const int heads[2] = {64, 16};
    for (int hc = 0; hc < 2; hc++) {
        mla_case c = {.Tq = 24, .Tk = 300, .H = heads[hc], .topk = 256};
        c.start = malloc((size_t)c.Tq * 4), c.end = malloc((size_t)c.Tq * 4);
        c.idx = malloc((size_t)(c.Tq * c.topk) * 4);
        for (int64_t t = 0; t < c.Tq; t++) {
            c.start[t] = 0, c.end[t] = (int32_t)c.Tk;
            int32_t *row = c.idx + t * c.topk, n = counts[t % 8];
            fill_index_row(&stream, row, c.topk, 0, (int32_t)c.Tk, n, 0); // n distinct keys at random slots
            int32_t w = 0;                                   // moved to the front, in slot order
            for (int32_t i = 0; i < c.topk; i++)
                if (row[i] >= 0)
                    row[w++] = row[i];
            for (int32_t i = w; i < c.topk; i++)
                row[i] = -1;
            if (t % 3 == 0 && n > 2)
                row[rng_below(&stream, n - 1)] = -1;
        }
        case_inputs(&c);
        check_case(&c, heads[hc] == 64 ? "front-packed rows Tq24 H64 k256" : "front-packed rows Tq24 H16 k256");
        case_free(&c);
    }
}
END_TEST

START_TEST(test_decode_topk2048)
{
    mla_case c;
    case_decode(&c, 20, 6000, 64, 2048);
    check_case(&c, "decode Tq20 Tk6000 H64 k2048");
    case_free(&c);
    case_decode(&c, 12, 3000, 128, 2048);
    check_case(&c, "decode Tq12 Tk3000 H128 k2048");
    case_free(&c);
}
END_TEST

// The entry point dispatches to the new kernel, which agrees with the WMMA kernel and with itself.
// 8, 16 and 32 heads through query groups: ragged packs (sequences and the last group ending inside a group), rows
// with repeated keys (their groups in slot order) and without, decode windows that barely overlap, a row with no
// valid slot.
START_TEST(test_query_groups)
{
    query_group_cases(check_case);
}
END_TEST

// With runtime.tilelang_mla_forward_query_groups on, the entry point groups a causal 4096-token sequence at 16 heads (enough queries for two blocks an SM) and keeps
// one block per query for a 32-query decode batch; both agree with the per-query kernel, and two grouped launches
// give the same out and lse.
START_TEST(test_entry_groups)
{
    dsarl_dsa_context *tl_default = tl;
    tl = tilelang_with_keys(gpu, "runtime:\n  tilelang_mla_forward_query_groups: true\n");
    ck_assert_int_eq(tl->settings.forward_groups, 1);
    mla_case c;
    const int32_t one[] = {4096};
    case_packed_rows(&c, one, 1, 16, 2048, 0);
    const int64_t n_out = c.Tq * c.H * D_V, n_lse = c.Tq * c.H;
    run_sm90(&c);
    float *single = from_gpu(gpu, c.g_out, n_out, DSARL_DTYPE_BF16), *single_lse = from_gpu(gpu, c.g_lse, n_lse,
                                                                                             DSARL_DTYPE_F32);
    float *got[2], *got_lse[2];
    for (int k = 0; k < 2; k++) {
        poison(&c);
        ck_assert_msg(tilelang_sparse_mla_forward(tl, &c.dbatch, &c.din, c.g_idx, c.topk, c.g_out, c.g_lse, &err) ==
                      0, "%s", err.message);
        ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
        got[k] = from_gpu(gpu, c.g_out, n_out, DSARL_DTYPE_BF16), got_lse[k] = from_gpu(gpu, c.g_lse, n_lse,
                                                                                       DSARL_DTYPE_F32);
    }
    ck_assert_msg(memcmp(got[0], got[1], (size_t)n_out * 4) == 0 && memcmp(got_lse[0], got_lse[1], (size_t)n_lse * 4)
                  == 0, "two grouped launches differ (a race)");
    expect_close(&cc, c.g_out, DSARL_DTYPE_BF16, single, n_out, 1e-2, "entry (groups) vs per query T4096 H16 out");
    expect_close_floor(&cc, c.g_lse, DSARL_DTYPE_F32, single_lse, n_lse, 1e-3, 1.0,
                       "entry (groups) vs per query T4096 H16 lse");
    ck_assert_msg(memcmp(got[0], single, (size_t)n_out * 4) != 0, "the entry point did not take the query groups "
                  "(its out equals the per-query kernel's bit for bit)");
    free(single), free(single_lse), free(got[0]), free(got[1]), free(got_lse[0]), free(got_lse[1]);
    case_free(&c);
    case_decode(&c, 32, 6000, 16, 2048); /* decode: the entry must give the per-query kernel's result exactly */
    run_sm90(&c);
    single = from_gpu(gpu, c.g_out, 32 * 16 * D_V, DSARL_DTYPE_BF16);
    poison(&c);
    ck_assert_int_eq(tilelang_sparse_mla_forward(tl, &c.dbatch, &c.din, c.g_idx, c.topk, c.g_out, c.g_lse, &err), 0);
    float *entry = from_gpu(gpu, c.g_out, 32 * 16 * D_V, DSARL_DTYPE_BF16);
    ck_assert_msg(memcmp(single, entry, (size_t)(32 * 16 * D_V) * 4) == 0, "a 32-query decode batch took another "
                  "path than one block per query");
    printf("check_dsa_mla_sm90: the entry groups T4096 H16 and keeps a 32-query decode batch per query\n");
    free(single), free(entry);
    case_free(&c);
    tilelang_destroy(tl);
    tl = tl_default;
}
END_TEST

START_TEST(test_old_vs_new)
{
    mla_case c;
    case_decode(&c, 1024, 8192, 64, 2048);
    int64_t n_out = c.Tq * c.H * D_V, n_lse = c.Tq * c.H;
    poison(&c);
    ck_assert_msg(tilelang_sparse_mla_forward(tl_wmma, &c.dbatch, &c.din, c.g_idx, c.topk, c.g_out, c.g_lse,
                                              &err) == 0,
                  "%s", err.message);
    float *old_out = from_gpu(gpu, c.g_out, n_out, DSARL_DTYPE_BF16),
          *old_lse = from_gpu(gpu, c.g_lse, n_lse, DSARL_DTYPE_F32);
    poison(&c);
    ck_assert_msg(tilelang_sparse_mla_forward(tl, &c.dbatch, &c.din, c.g_idx, c.topk, c.g_out, c.g_lse, &err) == 0,
                  "%s", err.message);
    expect_close(&cc, c.g_out, DSARL_DTYPE_BF16, old_out, n_out, 1e-2, "new vs wmma Tq1024 H64 k2048 out");
    expect_close_floor(&cc, c.g_lse, DSARL_DTYPE_F32, old_lse, n_lse, 1e-3, 1.0, "new vs wmma Tq1024 H64 k2048 lse");
    float *first = from_gpu(gpu, c.g_out, n_out, DSARL_DTYPE_BF16),
          *first_lse = from_gpu(gpu, c.g_lse, n_lse, DSARL_DTYPE_F32);
    run_sm90(&c);
    float *second = from_gpu(gpu, c.g_out, n_out, DSARL_DTYPE_BF16),
          *second_lse = from_gpu(gpu, c.g_lse, n_lse, DSARL_DTYPE_F32);
    ck_assert_msg(memcmp(first, second, (size_t)n_out * 4) == 0 &&
                      memcmp(first_lse, second_lse, (size_t)n_lse * 4) == 0,
                  "two launches of the sm90 kernel differ (a race)");
    printf("check_dsa_mla_sm90: two launches identical\n");

    if (getenv("DSARL_GPU_BENCH")) {
        cudaEvent_t a, b;
        cudaEventCreate(&a), cudaEventCreate(&b);
        float ms[2] = {0, 0};
        for (int k = 0; k < 2; k++) { /* 0: sm90, 1: wmma */
            dsarl_dsa_context *t = k ? tl_wmma : tl;
            ck_assert_int_eq(tilelang_sparse_mla_forward(t, &c.dbatch, &c.din, c.g_idx, c.topk, c.g_out, c.g_lse,
                                                         &err), 0);
            cudaEventRecord(a, 0);
            for (int r = 0; r < 5; r++)
                ck_assert_int_eq(tilelang_sparse_mla_forward(t, &c.dbatch, &c.din, c.g_idx, c.topk, c.g_out,
                                                             c.g_lse, &err), 0);
            cudaEventRecord(b, 0);
            ck_assert_int_eq(cudaEventSynchronize(b), cudaSuccess);
            cudaEventElapsedTime(&ms[k], a, b);
            ms[k] /= 5;
        }
        double flops = 2.0 * c.Tq * c.H * c.topk * (double)(D_QK + D_V);
        printf("check_dsa_mla_sm90: BENCH sparse_mla_forward Tq1024 Tk8192 H64 k2048: sm90 %.3f ms = %.1f TFLOP/s, "
               "wmma %.3f ms = %.1f TFLOP/s\n", ms[0], flops / ms[0] / 1e9, ms[1], flops / ms[1] / 1e9);
        cudaEventDestroy(a), cudaEventDestroy(b);
    }
    free(old_out), free(old_lse), free(first), free(first_lse), free(second), free(second_lse);
    case_free(&c);
}
END_TEST

// DSARL_GPU_BENCH=1: the kernel at `dsarl bench dsa`'s index pattern (2048 distinct keys spread over 8192), Tq 4096,
// timed twice (the spread between equal runs).
START_TEST(test_bench)
{
    if (!getenv("DSARL_GPU_BENCH"))
        return;
    mla_case c;
    case_spread(&c, 4096, 8192, 64, 2048);
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    double flops = 2.0 * c.Tq * c.H * c.topk * (double)(D_QK + D_V);
    for (int rep = 0; rep < 2; rep++) {
        run_sm90(&c); /* warm-up */
        cudaEventRecord(a, 0);
        for (int r = 0; r < 5; r++) {
            int used = 0;
            ck_assert_int_eq(tilelang_sparse_mla_forward_sm90(tl, &c.dbatch, &c.din, c.g_idx, c.topk, c.g_out, c.g_lse,
                                                              &used, &err), 0);
        }
        cudaEventRecord(b, 0);
        ck_assert_int_eq(cudaEventSynchronize(b), cudaSuccess);
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, a, b);
        printf("check_dsa_mla_sm90: BENCH sparse_mla_forward sm90 Tq4096 Tk8192 H64 k2048: %.3f ms = %.1f TFLOP/s\n",
               ms / 5, flops / (ms / 5) / 1e9);
    }
    cudaEventDestroy(a), cudaEventDestroy(b);
    case_free(&c);
}
END_TEST

static Suite *mla_sm90_suite(void)
{
    Suite *s = suite_create("dsa_mla_sm90");
    TCase *small = tcase_create("small"); /* CK_RUN_CASE=small: the quick cases, e.g. under compute-sanitizer */
    tcase_add_checked_fixture(small, setup, teardown);
    tcase_set_timeout(small, 600);
    tcase_add_test(small, test_packed_h64);
    tcase_add_test(small, test_packed_h128);
    tcase_add_test(small, test_padded_heads);
    tcase_add_test(small, test_front_packed);
    tcase_add_test(small, test_query_groups);
    suite_add_tcase(s, small);
    TCase *large = tcase_create("large");
    tcase_add_checked_fixture(large, setup, teardown);
    tcase_set_timeout(large, 600);
    tcase_add_test(large, test_decode_topk2048);
    tcase_add_test(large, test_old_vs_new);
    tcase_add_test(large, test_entry_groups);
    tcase_add_test(large, test_bench);
    suite_add_tcase(s, large);
    return s;
}

int main(void)
{
    int major = 0, minor = 0;
    if (cuda_visible_devices() == 0 || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) || major != 9 || minor != 0) {
        printf("check_dsa_mla_sm90: skipped: no compute capability 9.0 CUDA device is visible\n");
        return 77;
    }
    stream = cuda_test_seed("check_dsa_mla_sm90", 0x9E3779B97F4A7C15ull);
    setvbuf(stdout, NULL, _IOLBF, 0); /* each figure reaches a redirected log at once, also when a timeout kills us */
    SRunner *sr = srunner_create(mla_sm90_suite());
    srunner_set_fork_status(sr, CK_NOFORK); /* CUDA does not survive fork */
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
