/* check_dsa_mla_bwd_sm90.c: the Hopper wgmma sparse MLA backward of the tilelang backend
 * (sparse_mla_backward_sm90.cu, the default; runtime.tilelang_sparse_mla=wmma takes the WMMA kernel) against the
 * reference backend on fresh random inputs at GLM-5 dims (d_qk 576 = 512 + 64, d_v 512).
 *
 * Inputs are drawn in float32 and rounded to bf16 once; out and lse come from the reference forward (out rounded
 * to bf16, as the device stores it), dout is random. The reference backward (double accumulation) runs on the same
 * values as float32 host arrays, split over host threads by query rows (each thread its own dkv, summed after).
 * Cases: 64, 128, 16 and 80 heads (16 and 80 pad their last group of 64; the per-query kernel declines 8 heads);
 * topk 64, 100 (a partial last tile), 256 and 2048; ragged causal packs where early rows have fewer eligible keys than topk;
 * decode-style ranges into a longer key array (one empty); unsorted slots, -1 holes anywhere, repeated keys within
 * a row (the reductions must sum them), a case where every row draws its 256 slots from 5 keys, rows with no
 * valid slot, and rows whose valid keys fill only the first slots (the trailing -1 tiles are skipped). Each case
 * runs twice:
 *   - the kernel directly (tilelang_sparse_mla_backward_sm90, which must take the shape) into a zeroed fp32
 *     accumulator: dq (poisoned with NaN first) and the raw key gradient against the reference;
 *   - the entry point tilelang_sparse_mla_backward (the sm90 kernel: its default) on a dkv pre-filled with
 *     random bf16 values: dq and dkv = prefill + gradient (rows no slot selects must keep the prefill exactly).
 * Comparison: max |got - ref| / max |ref| <= 1e-2 (bf16 operands P and dS, bf16 outputs), the normwise relative
 * error printed beside it; NaN or inf fails. A bigger shape (Tq 512, Tk 8192, H 64, k 2048) checks the new kernel
 * against the previous (WMMA) kernel through the entry point, and that two launches give the same dq bit for bit
 * (dkv's fp32 reductions land in any order, so only dq is compared exactly).
 * Query groups (8, 16 and 32 heads: 64 / H queries per block over the union of their keys): the groups' key lists
 * are checked exactly against the host's, the grouped kernel against the reference on packs, decode windows and
 * repeated keys, and against one block per query (16 heads) or WMMA (8) on a causal 4096-token sequence.
 * DSARL_GPU_BENCH=1 times the kernels (test_bench says which shapes), TFLOP/s with FLOP = 2 T k H (3 d_qk + 2 d_v).
 * CK_RUN_CASE=small runs only the quick cases, CK_RUN_CASE=bench only the timings.
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

/* The kernel under test (sparse_mla_backward_sm90.cu): dq written, the key gradient added into dkv_acc (Tk, 576)
 * fp32; *used = 0 when it does not take the shape. */
int tilelang_sparse_mla_backward_sm90(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                      const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk,
                                      const void *out, const float *lse, const void *dout, void *dq, float *dkv_acc,
                                      int *used, dsarl_error *err);
/* The query groups of 8/16/32 heads (sparse_mla_query_union.cu, sparse_mla_backward_sm90.cu): queries per block,
 * the groups' key lists, and the grouped kernel over them. */
int tilelang_sparse_mla_query_group(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                    const dsarl_dsa_attention_inputs *in, int32_t topk, int *group, dsarl_error *err);
int tilelang_query_union(dsarl_dsa_context *ctx, const int32_t *indices, int32_t topk, int group, int64_t n_queries,
                         int64_t n_keys, int32_t *union_keys, uint8_t *union_mask, int32_t *union_len,
                         dsarl_error *err);
int tilelang_sparse_mla_backward_sm90_grouped(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                              const dsarl_dsa_attention_inputs *in, int32_t topk, int group,
                                              const int32_t *union_keys, const uint8_t *union_mask,
                                              const int32_t *union_len, const void *out, const float *lse,
                                              const void *dout, void *dq, float *dkv_acc, int *used,
                                              dsarl_error *err);

#define D_QK 576
#define D_V 512
#define REF_THREADS 16
#define LOG_PREFIX "check_dsa_mla_bwd_sm90"

static dsarl_device *gpu;
static dsarl_dsa_context *tl;
static dsarl_dsa_context *tl_wmma; /* runtime.tilelang_sparse_mla = wmma: the portable kernels on the H200 */
static dsarl_dsa_context *tl_single; /* runtime.tilelang_mla_query_groups = false: one block per query */
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
    tl_single = tilelang_with_keys(gpu, "runtime:\n  tilelang_mla_query_groups: false\n");
    ck_assert_int_eq(tl_single->settings.query_groups, 0);
    cc = (close_check){.gpu = gpu, .label = LOG_PREFIX ":", .width = 58, .norm = 1};
}

static void teardown(void)
{
    tilelang_destroy(tl);
    tilelang_destroy(tl_wmma);
    tilelang_destroy(tl_single);
    cuda_destroy(gpu);
}

#define MLA_CASE_BACKWARD
#include "mla_sm90_cases.h"

/* --- the reference, threaded over query rows --------------------------------------------------------------- */

typedef struct ref_job {
    const mla_case *c;
    int64_t t0, t1;
    float *out, *lse; /* forward: (Tq, H, d_v), (Tq, H) */
    float *dq, *dkv;  /* backward: (Tq, H, d_qk) shared by rows; (Tk, d_qk) this job's own, zeroed */
    int backward, rc;
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
    const int32_t *idx = c->idx + j->t0 * c->topk;
    if (!j->backward)
        j->rc = dsa_reference_sparse_mla_forward(ref, &b, &in, idx, c->topk, j->out + j->t0 * c->H * D_V,
                                                 j->lse + j->t0 * c->H, &j->err);
    else
        j->rc = dsa_reference_sparse_mla_backward(ref, &b, &in, idx, c->topk, c->out + j->t0 * c->H * D_V,
                                                  c->lse + j->t0 * c->H, c->dout + j->t0 * c->H * D_V,
                                                  j->dq + j->t0 * c->H * D_QK, j->dkv, &j->err);
    dsa_reference_destroy(ref);
    return NULL;
}

/* Runs the reference forward (backward = 0: out, lse) or backward (1: dq, dkv = the summed key gradient). */
static void reference(const mla_case *c, int backward, float *a, float *b)
{
    pthread_t th[REF_THREADS];
    ref_job jobs[REF_THREADS];
    int64_t per = (c->Tq + REF_THREADS - 1) / REF_THREADS;
    int n = 0;
    for (int64_t t0 = 0; t0 < c->Tq; t0 += per, n++) {
        jobs[n] = (ref_job){.c = c, .t0 = t0, .t1 = t0 + per < c->Tq ? t0 + per : c->Tq, .backward = backward};
        if (backward) {
            jobs[n].dq = a;
            jobs[n].dkv = calloc((size_t)(c->Tk * D_QK > 0 ? c->Tk * D_QK : 1), sizeof(float));
            ck_assert_ptr_nonnull(jobs[n].dkv);
        } else {
            jobs[n].out = a, jobs[n].lse = b;
        }
        ck_assert_int_eq(pthread_create(&th[n], NULL, ref_run, &jobs[n]), 0);
    }
    if (backward)
        memset(b, 0, (size_t)(c->Tk * D_QK) * sizeof(float));
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(jobs[i].rc == 0, "reference: %s", jobs[i].err.message);
        if (backward) {
            for (int64_t e = 0; e < c->Tk * D_QK; e++)
                b[e] += jobs[i].dkv[e];
            free(jobs[i].dkv);
        }
    }
}

/* out and lse from the reference forward; out rounded to bf16 as the device stores it. */
static void case_forward(mla_case *c)
{
    int64_t n_out = c->Tq * c->H * D_V;
    c->out = malloc((size_t)n_out * 4), c->lse = malloc((size_t)(c->Tq * c->H) * 4);
    reference(c, 0, c->out, c->lse);
    for (int64_t i = 0; i < n_out; i++)
        c->out[i] = bf16_value(c->out[i]);
    ck_assert_int_eq(cuda_upload_f32(gpu, c->g_out, DSARL_DTYPE_BF16, c->out, (size_t)n_out, &err), 0);
    ck_assert_int_eq(cudaMemcpy(c->g_lse, c->lse, (size_t)(c->Tq * c->H) * 4, cudaMemcpyHostToDevice), cudaSuccess);
}

/* --- launching and comparing ------------------------------------------------------------------------------ */

static void poison_dq(mla_case *c)
{
    ck_assert_int_eq(cudaMemset(c->g_dq, 0xFF, (size_t)(c->Tq * c->H * D_QK) * 2), cudaSuccess); /* bf16 NaN */
}

/* The backward through the entry point, with the sm90 kernel switched on (sm90 = 1) or off. */
static void run_entry(mla_case *c, int sm90)
{
    int rc = tilelang_sparse_mla_backward(sm90 ? tl : tl_wmma, &c->dbatch, &c->din, c->g_idx, c->topk, c->g_out,
                                          c->g_lse, c->g_dout, c->g_dq, c->g_dkv, &err);
    ck_assert_msg(rc == 0, "%s", err.message);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
}

/* Builds the query groups' key lists on the device and checks them exactly against the host's: per group of
 * `group` queries, the ascending distinct valid keys with the bit of every query that selected each, or, when a
 * query selected a key twice, its queries' valid slots in slot order with their own query's bit. */
static int64_t lists_merged, lists_in_slot_order; /* over the run: both kinds of list must have been checked */

static void union_lists(const mla_case *c, int group, int32_t **ukeys, uint8_t **umask, int32_t **ulen)
{
    const int64_t groups = (c->Tq + group - 1) / group, cap = (int64_t)group * c->topk;
    *ukeys = dev_alloc(gpu, (size_t)(groups * cap) * 4), *umask = dev_alloc(gpu, (size_t)(groups * cap));
    *ulen = dev_alloc(gpu, (size_t)groups * 4);
    ck_assert_msg(tilelang_query_union(tl, c->g_idx, c->topk, group, c->Tq, c->Tk, *ukeys, *umask, *ulen, &err) == 0,
                  "%s", err.message);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    int32_t *keys = from_gpu_i32(gpu, *ukeys, groups * cap), *len = from_gpu_i32(gpu, *ulen, groups);
    uint8_t *mask = malloc((size_t)(groups * cap));
    ck_assert_int_eq(cudaMemcpy(mask, *umask, (size_t)(groups * cap), cudaMemcpyDeviceToHost), cudaSuccess);
    uint8_t *seen = malloc((size_t)(c->Tk > 0 ? c->Tk : 1)); /* per key: the bits of the group's queries */
    int64_t merged = 0, slot_order = 0, total = 0;
    for (int64_t g = 0; g < groups; g++) {
        memset(seen, 0, (size_t)c->Tk);
        int repeated = 0;
        for (int q = 0; q < group && g * group + q < c->Tq; q++)
            for (int32_t s = 0; s < c->topk; s++) {
                const int32_t key = c->idx[(g * group + q) * c->topk + s];
                if (key < 0 || key >= c->Tk)
                    continue;
                repeated |= (seen[key] >> q) & 1;
                seen[key] |= (uint8_t)(1u << q);
            }
        int64_t n = 0;
        const int32_t *gk = keys + g * cap;
        const uint8_t *gm = mask + g * cap;
        if (!repeated) {
            for (int64_t key = 0; key < c->Tk; key++)
                if (seen[key]) {
                    ck_assert_msg(n < len[g] && gk[n] == key && gm[n] == seen[key], "group %lld list entry %lld: "
                                  "key %d mask %u, want key %lld mask %u (length %d)", (long long)g, (long long)n,
                                  n < len[g] ? gk[n] : -1, n < len[g] ? gm[n] : 0, (long long)key, seen[key], len[g]);
                    n++;
                }
            merged++;
        } else {
            for (int q = 0; q < group && g * group + q < c->Tq; q++)
                for (int32_t s = 0; s < c->topk; s++) {
                    const int32_t key = c->idx[(g * group + q) * c->topk + s];
                    if (key < 0 || key >= c->Tk)
                        continue;
                    ck_assert_msg(n < len[g] && gk[n] == key && gm[n] == (1u << q), "group %lld (a repeated key) "
                                  "entry %lld: key %d mask %u, want key %d mask %u", (long long)g, (long long)n,
                                  n < len[g] ? gk[n] : -1, n < len[g] ? gm[n] : 0, key, 1u << q);
                    n++;
                }
            slot_order++;
        }
        ck_assert_msg(len[g] == n, "group %lld list length %d, want %lld", (long long)g, len[g], (long long)n);
        total += n;
    }
    lists_merged += merged, lists_in_slot_order += slot_order;
    printf(LOG_PREFIX ": %d queries per group: %lld merged lists, %lld in slot order (repeated keys), %.2f keys per "
           "query\n", group, (long long)merged, (long long)slot_order, c->Tq ? (double)total / (double)c->Tq : 0.0);
    free(keys), free(len), free(mask), free(seen);
}

static void check_case(mla_case *c, const char *what)
{
    char name[200];
    int64_t n_dq = c->Tq * c->H * D_QK, n_kv = c->Tk * D_QK;
    case_forward(c);
    float *dq = malloc((size_t)n_dq * 4), *grad = malloc((size_t)(n_kv > 0 ? n_kv : 1) * 4);
    reference(c, 1, dq, grad);

    // 1. the kernel itself (one block per query) into a zeroed fp32 accumulator; 8 heads it declines
    int used = 0;
    if (tilelang_sparse_mla_sm90_head_groups(c->H)) {
        poison_dq(c);
        ck_assert_int_eq(cudaMemset(c->g_acc, 0, (size_t)n_kv * 4), cudaSuccess);
        ck_assert_msg(tilelang_sparse_mla_backward_sm90(tl, &c->dbatch, &c->din, c->g_idx, c->topk, c->g_out,
                                                        c->g_lse, c->g_dout, c->g_dq, c->g_acc, &used, &err) == 0,
                      "%s", err.message);
        ck_assert_msg(used, "the sm90 backward did not take H %d, topk %d", c->H, c->topk);
        ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
        snprintf(name, sizeof name, "%s dq", what);
        expect_close(&cc, c->g_dq, DSARL_DTYPE_BF16, dq, n_dq, 1e-2, name);
        snprintf(name, sizeof name, "%s dkv gradient (fp32)", what);
        expect_close(&cc, c->g_acc, DSARL_DTYPE_F32, grad, n_kv, 1e-2, name);
    }
    // 1b. at 8, 16 and 32 heads the grouped kernel over the lists of the query-union kernel (checked exactly)
    int group = 0;
    ck_assert_msg(tilelang_sparse_mla_query_group(tl, &c->dbatch, &c->din, c->topk, &group, &err) == 0, "%s",
                  err.message);
    ck_assert_int_eq(group, (c->H == 8 || c->H == 16 || c->H == 32) && 64 / c->H * c->topk <= 16384 ? 64 / c->H : 0);
    if (group) {
        int32_t *ukeys, *ulen;
        uint8_t *umask;
        union_lists(c, group, &ukeys, &umask, &ulen);
        poison_dq(c);
        ck_assert_int_eq(cudaMemset(c->g_acc, 0, (size_t)n_kv * 4), cudaSuccess);
        used = 0;
        ck_assert_msg(tilelang_sparse_mla_backward_sm90_grouped(tl, &c->dbatch, &c->din, c->topk, group, ukeys, umask,
                                                                ulen, c->g_out, c->g_lse, c->g_dout, c->g_dq,
                                                                c->g_acc, &used, &err) == 0, "%s", err.message);
        ck_assert_msg(used, "the grouped sm90 backward did not take H %d, topk %d", c->H, c->topk);
        ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
        snprintf(name, sizeof name, "%s grouped dq", what);
        expect_close(&cc, c->g_dq, DSARL_DTYPE_BF16, dq, n_dq, 1e-2, name);
        snprintf(name, sizeof name, "%s grouped dkv gradient (fp32)", what);
        expect_close(&cc, c->g_acc, DSARL_DTYPE_F32, grad, n_kv, 1e-2, name);
        cuda_free(gpu, ukeys), cuda_free(gpu, umask), cuda_free(gpu, ulen);
    }

    // 2. the entry point: dkv += gradient on a random prefill of about half the gradient's size
    double gmax = 0.0;
    for (int64_t e = 0; e < n_kv; e++)
        gmax = fmax(gmax, fabs(grad[e]));
    float *prefill = rand_bf16(&stream, n_kv, (float)(0.5 * gmax + 1e-3)),
          *want = malloc((size_t)(n_kv > 0 ? n_kv : 1) * 4);
    for (int64_t e = 0; e < n_kv; e++)
        want[e] = prefill[e] + grad[e];
    ck_assert_int_eq(cuda_upload_f32(gpu, c->g_dkv, DSARL_DTYPE_BF16, prefill, (size_t)n_kv, &err), 0);
    poison_dq(c);
    run_entry(c, 1);
    snprintf(name, sizeof name, "%s entry dq", what);
    expect_close(&cc, c->g_dq, DSARL_DTYPE_BF16, dq, n_dq, 1e-2, name);
    snprintf(name, sizeof name, "%s entry dkv (+=)", what);
    expect_close(&cc, c->g_dkv, DSARL_DTYPE_BF16, want, n_kv, 1e-2, name);
    // rows that no slot selects keep their prefill exactly
    char *touched = calloc((size_t)(c->Tk > 0 ? c->Tk : 1), 1);
    for (int64_t i = 0; i < c->Tq * c->topk; i++)
        if (c->idx[i] >= 0)
            touched[c->idx[i]] = 1;
    float *got = from_gpu(gpu, c->g_dkv, n_kv, DSARL_DTYPE_BF16);
    int64_t untouched = 0;
    for (int64_t k = 0; k < c->Tk; k++) {
        if (touched[k])
            continue;
        untouched++;
        for (int e = 0; e < D_QK; e++)
            ck_assert_msg(got[k * D_QK + e] == prefill[k * D_QK + e], "%s: dkv row %lld (selected by no slot) "
                          "column %d is %g, prefill %g", what, (long long)k, e, got[k * D_QK + e],
                          prefill[k * D_QK + e]);
    }
    printf(LOG_PREFIX ": %-58s %lld unselected dkv rows unchanged\n", what, (long long)untouched);
    free(touched), free(got), free(prefill), free(want), free(dq), free(grad);
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
    case_packed(&c, lengths, 3, 128, 100);
    check_case(&c, "pack 33/120/2 H128 k100 (partial tile)");
    case_free(&c);
    const int32_t lengths2[] = {70, 41};
    case_packed(&c, lengths2, 2, 128, 64);
    check_case(&c, "pack 70/41 H128 k64");
    case_free(&c);
}
END_TEST

// Head counts that are not whole groups of 64: the padded rows must add nothing to dKV and never be stored to dq;
// under 16 real heads in the last group the kernel declines.
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
    ck_assert_msg(tilelang_sparse_mla_backward_sm90(tl, &c.dbatch, &c.din, c.g_idx, c.topk, c.g_out, c.g_lse,
                                                    c.g_dout, c.g_dq, c.g_acc, &used, &err) == 0, "%s", err.message);
    ck_assert_msg(!used, "the sm90 backward took 8 heads (a last group under 16 heads must go to the WMMA kernel)");
    case_free(&c);
}
END_TEST

// Every row draws its 256 slots from the same 5 keys (plus holes): many equal keys within a tile, across tiles and
// across queries, all summed by the reductions.
START_TEST(test_repeated_keys)
{
  for (int hc = 0; hc < 2; hc++) { /* 64 heads, and 16 through query groups (every group's list in slot order) */
    mla_case c = {.Tq = 24, .Tk = 40, .H = hc ? 16 : 64, .topk = 256};
    c.start = malloc((size_t)c.Tq * 4), c.end = malloc((size_t)c.Tq * 4), c.idx = malloc((size_t)(c.Tq * c.topk) * 4);
    const int32_t pool[5] = {3, 17, 18, 30, 39};
    for (int64_t t = 0; t < c.Tq; t++) {
        c.start[t] = 0, c.end[t] = (int32_t)c.Tk;
        for (int32_t i = 0; i < c.topk; i++)
            c.idx[t * c.topk + i] = rng_below(&stream, 8) == 0 ? -1 : pool[rng_below(&stream, 5)];
    }
    fill_index_row(&stream, c.idx + 5 * c.topk, c.topk, 0, 0, 0, 0); /* one row with no valid slot */
    case_inputs(&c);
    check_case(&c, hc ? "5 keys x 256 slots Tq24 H16 k256" : "5 keys x 256 slots Tq24 H64 k256");
    case_free(&c);
  }
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

// 8, 16 and 32 heads through query groups (64 / H queries per block over the union of their keys): ragged packs
// whose sequences and last group end inside a group, rows with repeated keys (their groups take the slot-order
// list) and without, decode-style windows that barely overlap, topk 64 to 2048.
START_TEST(test_query_groups)
{
    query_group_cases(check_case);
    ck_assert_msg(lists_merged > 0 && lists_in_slot_order > 0, "both kinds of group list must be checked (merged "
                  "%lld, slot order %lld)", (long long)lists_merged, (long long)lists_in_slot_order);
}
END_TEST

// The query-union lists alone (no attention) where keys lie far apart: a group's keys in clusters over 300K keys
// (several windows of the kernel's presence map) and scattered over 3M keys (more windows than it takes, so it
// sorts), each with and without a repeated key, at 2, 4 and 8 queries per group; exact against the host.
START_TEST(test_union_far_keys)
{
    const int64_t spans[2] = {300000, 3000000};
    for (int sp = 0; sp < 2; sp++)
        for (int group = 2; group <= 8; group *= 2) {
            mla_case c = {.Tq = 3 * group + 1, .Tk = spans[sp], .H = 64 / group, .topk = 512};
            c.idx = malloc((size_t)(c.Tq * c.topk) * 4);
            for (int64_t t = 0; t < c.Tq; t++) {
                int32_t *row = c.idx + t * c.topk;
                for (int32_t i = 0; i < c.topk; i++) {
                    if (rng_below(&stream, 10) == 0) {
                        row[i] = -1;
                        continue;
                    }
                    /* clustered: 4 clusters of 4096 keys at 70K apart; scattered: anywhere */
                    row[i] = sp == 0 ? rng_below(&stream, 4) * 70000 + rng_below(&stream, 4096)
                                     : rng_below(&stream, (int32_t)c.Tk);
                    for (int32_t j = 0; j < i; j++) /* distinct within the row */
                        if (row[j] == row[i]) {
                            row[i] = -1;
                            break;
                        }
                }
            }
            if (group == 4) /* one row repeats a key: its group takes the slot order */
                c.idx[(2 * group) * c.topk + 7] = c.idx[(2 * group) * c.topk + 3] >= 0 ? c.idx[(2 * group) * c.topk + 3]
                                                                                       : 11;
            c.g_idx = to_gpu_i32(gpu, c.idx, c.Tq * c.topk);
            int32_t *ukeys, *ulen;
            uint8_t *umask;
            union_lists(&c, group, &ukeys, &umask, &ulen);
            cuda_free(gpu, ukeys), cuda_free(gpu, umask), cuda_free(gpu, ulen), cuda_free(gpu, c.g_idx);
            free(c.idx);
        }
}
END_TEST

START_TEST(test_decode_topk2048)
{
    mla_case c;
    case_decode(&c, 20, 3000, 64, 2048);
    check_case(&c, "decode Tq20 Tk3000 H64 k2048");
    case_free(&c);
    case_decode(&c, 12, 2500, 128, 2048);
    check_case(&c, "decode Tq12 Tk2500 H128 k2048");
    case_free(&c);
}
END_TEST

/* out and lse from the device forward (verified elsewhere), for the shapes too big for the host reference. */
static void device_forward(mla_case *c)
{
    ck_assert_msg(tilelang_sparse_mla_forward(tl, &c->dbatch, &c->din, c->g_idx, c->topk, c->g_out, c->g_lse, &err) ==
                      0, "%s", err.message);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
}

// The entry point with the new kernel agrees with the WMMA kernel, and dq is the same on two launches.
START_TEST(test_old_vs_new)
{
    mla_case c;
    case_decode(&c, 512, 8192, 64, 2048);
    device_forward(&c);
    int64_t n_dq = c.Tq * c.H * D_QK, n_kv = c.Tk * D_QK;
    float *prefill = rand_bf16(&stream, n_kv, 1.0f);
    ck_assert_int_eq(cuda_upload_f32(gpu, c.g_dkv, DSARL_DTYPE_BF16, prefill, (size_t)n_kv, &err), 0);
    poison_dq(&c);
    run_entry(&c, 0);
    float *old_dq = from_gpu(gpu, c.g_dq, n_dq, DSARL_DTYPE_BF16),
          *old_dkv = from_gpu(gpu, c.g_dkv, n_kv, DSARL_DTYPE_BF16);
    ck_assert_int_eq(cuda_upload_f32(gpu, c.g_dkv, DSARL_DTYPE_BF16, prefill, (size_t)n_kv, &err), 0);
    poison_dq(&c);
    run_entry(&c, 1);
    expect_close(&cc, c.g_dq, DSARL_DTYPE_BF16, old_dq, n_dq, 1e-2, "new vs wmma Tq512 Tk8192 H64 k2048 dq");
    expect_close(&cc, c.g_dkv, DSARL_DTYPE_BF16, old_dkv, n_kv, 1e-2, "new vs wmma Tq512 Tk8192 H64 k2048 dkv (+=)");
    float *first = from_gpu(gpu, c.g_dq, n_dq, DSARL_DTYPE_BF16);
    poison_dq(&c);
    run_entry(&c, 1);
    float *second = from_gpu(gpu, c.g_dq, n_dq, DSARL_DTYPE_BF16);
    ck_assert_msg(memcmp(first, second, (size_t)n_dq * 4) == 0, "two launches of the sm90 backward give different dq "
                  "(a race)");
    printf(LOG_PREFIX ": two launches give the same dq\n");
    free(prefill), free(old_dq), free(old_dkv), free(first), free(second);
    case_free(&c);
}
END_TEST

/* The backward through the entry point on ctx, from a dkv of prefill; dq and dkv downloaded. */
static void entry_on(dsarl_dsa_context *ctx, mla_case *c, const float *prefill, float **dq, float **dkv)
{
    const int64_t n_dq = c->Tq * c->H * D_QK, n_kv = c->Tk * D_QK;
    ck_assert_int_eq(cuda_upload_f32(gpu, c->g_dkv, DSARL_DTYPE_BF16, prefill, (size_t)n_kv, &err), 0);
    poison_dq(c);
    ck_assert_msg(tilelang_sparse_mla_backward(ctx, &c->dbatch, &c->din, c->g_idx, c->topk, c->g_out, c->g_lse,
                                               c->g_dout, c->g_dq, c->g_dkv, &err) == 0, "%s", err.message);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    *dq = from_gpu(gpu, c->g_dq, n_dq, DSARL_DTYPE_BF16);
    *dkv = from_gpu(gpu, c->g_dkv, n_kv, DSARL_DTYPE_BF16);
}

// At 16 and 8 heads on a causal 4096-token sequence, top-2048: the grouped kernel agrees with one block per query
// (16 heads) or the WMMA kernel (8), and gives the same dq on two launches (each block owns its dq rows).
START_TEST(test_groups_vs_single)
{
    const int heads[2] = {16, 8};
    for (int hc = 0; hc < 2; hc++) {
        mla_case c;
        const int32_t one[] = {4096};
        case_packed_rows(&c, one, 1, heads[hc], 2048, 0);
        device_forward(&c);
        const int64_t n_dq = c.Tq * c.H * D_QK, n_kv = c.Tk * D_QK;
        float *prefill = rand_bf16(&stream, n_kv, 1.0f), *dq0, *dkv0, *dq1, *dkv1, *dq2, *dkv2;
        entry_on(heads[hc] == 16 ? tl_single : tl_wmma, &c, prefill, &dq0, &dkv0);
        entry_on(tl, &c, prefill, &dq1, &dkv1);
        entry_on(tl, &c, prefill, &dq2, &dkv2);
        char name[120];
        snprintf(name, sizeof name, "groups vs %s causal T4096 H%d k2048 dq", hc ? "wmma" : "single", heads[hc]);
        cuda_upload_f32(gpu, c.g_dq, DSARL_DTYPE_BF16, dq1, (size_t)n_dq, &err);
        expect_close(&cc, c.g_dq, DSARL_DTYPE_BF16, dq0, n_dq, 1e-2, name);
        snprintf(name, sizeof name, "groups vs %s causal T4096 H%d k2048 dkv (+=)", hc ? "wmma" : "single", heads[hc]);
        cuda_upload_f32(gpu, c.g_dkv, DSARL_DTYPE_BF16, dkv1, (size_t)n_kv, &err);
        expect_close(&cc, c.g_dkv, DSARL_DTYPE_BF16, dkv0, n_kv, 1e-2, name);
        ck_assert_msg(memcmp(dq1, dq2, (size_t)n_dq * 4) == 0, "two launches of the grouped backward give different "
                      "dq at H%d (a race)", heads[hc]);
        free(prefill), free(dq0), free(dkv0), free(dq1), free(dkv1), free(dq2), free(dkv2);
        case_free(&c);
    }
}
END_TEST

/* Mean ms of reps backward calls through the entry point on ctx (after one warm-up). */
static float time_entry(dsarl_dsa_context *ctx, mla_case *c, int reps)
{
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    for (int r = -1; r < reps; r++) { /* r = -1: the warm-up (and the workspace grown) */
        if (r == 0)
            cudaEventRecord(a, 0);
        ck_assert_int_eq(tilelang_sparse_mla_backward(ctx, &c->dbatch, &c->din, c->g_idx, c->topk, c->g_out,
                                                      c->g_lse, c->g_dout, c->g_dq, c->g_dkv, &err), 0);
    }
    cudaEventRecord(b, 0);
    ck_assert_int_eq(cudaEventSynchronize(b), cudaSuccess);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a), cudaEventDestroy(b);
    return ms / (float)reps;
}

// DSARL_GPU_BENCH=1: the kernels through the entry point.
//   - `dsarl bench dsa`'s index pattern (2048 distinct keys spread over 8192), Tq 2048, 64 heads: sm90 twice (the
//     spread between equal runs) and WMMA;
//   - a causal 8192-token sequence (row t: min(t + 1, 2048) of its keys less ~10% holes, drawn at random) at 32, 16
//     and 8 heads: query groups against one block per query (16, 32) or WMMA (8). Useful FLOP = 2 k' H (3 d_qk +
//     2 d_v) over the valid slots k' only.
START_TEST(test_bench)
{
    if (!getenv("DSARL_GPU_BENCH"))
        return;
    mla_case c;
    case_spread(&c, 2048, 8192, 64, 2048);
    device_forward(&c);
    double flops = 2.0 * c.Tq * c.topk * c.H * (3.0 * D_QK + 2.0 * D_V);
    dsarl_dsa_context *ctxs[3] = {tl, tl, tl_wmma};
    for (int k = 0; k < 3; k++) {
        const float ms = time_entry(ctxs[k], &c, k == 2 ? 2 : 5);
        printf(LOG_PREFIX ": BENCH sparse_mla_backward %s Tq2048 Tk8192 H64 k2048: %.3f ms = %.1f TFLOP/s\n",
               k < 2 ? "sm90" : "wmma", ms, flops / ms / 1e9);
    }
    case_free(&c);
    { /* the same index pattern at 16 heads: query groups against one block per query */
        mla_case d;
        case_spread(&d, 8192, 8192, 16, 2048);
        device_forward(&d);
        int32_t *ukeys, *ulen;
        uint8_t *umask;
        union_lists(&d, 4, &ukeys, &umask, &ulen);
        cuda_free(gpu, ukeys), cuda_free(gpu, umask), cuda_free(gpu, ulen);
        flops = 2.0 * d.Tq * d.topk * d.H * (3.0 * D_QK + 2.0 * D_V);
        const float grouped = time_entry(tl, &d, 5), single = time_entry(tl_single, &d, 5);
        printf(LOG_PREFIX ": BENCH sparse_mla_backward spread T8192 H16 k2048: query groups %.3f ms = %.1f TFLOP/s, "
               "one query per block %.3f ms = %.1f TFLOP/s\n", grouped, flops / grouped / 1e9, single,
               flops / single / 1e9);
        case_free(&d);
    }
    const int heads[3] = {32, 16, 8};
    for (int hc = 0; hc < 3; hc++) {
        const int32_t one[] = {8192};
        case_packed_rows(&c, one, 1, heads[hc], 2048, 0);
        device_forward(&c);
        int64_t valid = 0;
        for (int64_t i = 0; i < c.Tq * c.topk; i++)
            valid += c.idx[i] >= 0;
        flops = 2.0 * (double)valid * c.H * (3.0 * D_QK + 2.0 * D_V);
        int32_t *ukeys, *ulen;
        uint8_t *umask;
        union_lists(&c, 64 / heads[hc], &ukeys, &umask, &ulen); /* prints the keys per query of the lists */
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        cudaEventRecord(e0, 0);
        for (int r = 0; r < 5; r++)
            ck_assert_int_eq(tilelang_query_union(tl, c.g_idx, c.topk, 64 / heads[hc], c.Tq, c.Tk, ukeys, umask, ulen,
                                                  &err), 0);
        cudaEventRecord(e1, 0);
        ck_assert_int_eq(cudaEventSynchronize(e1), cudaSuccess);
        float union_ms = 0.0f;
        cudaEventElapsedTime(&union_ms, e0, e1);
        printf(LOG_PREFIX ": BENCH query union kernel causal T8192 H%d k2048: %.3f ms\n", heads[hc], union_ms / 5);
        cudaEventDestroy(e0), cudaEventDestroy(e1);
        cuda_free(gpu, ukeys), cuda_free(gpu, umask), cuda_free(gpu, ulen);
        const float grouped = time_entry(tl, &c, 5), single = time_entry(heads[hc] == 8 ? tl_wmma : tl_single, &c, 3);
        printf(LOG_PREFIX ": BENCH sparse_mla_backward causal T8192 H%d k2048: query groups %.3f ms = %.1f TFLOP/s, "
               "%s %.3f ms = %.1f TFLOP/s (%.2fx)\n", heads[hc], grouped, flops / grouped / 1e9,
               heads[hc] == 8 ? "wmma" : "one query per block", single, flops / single / 1e9, single / grouped);
        case_free(&c);
    }
}
END_TEST

static Suite *mla_bwd_sm90_suite(void)
{
    Suite *s = suite_create("dsa_mla_bwd_sm90");
    TCase *small = tcase_create("small"); /* CK_RUN_CASE=small: the quick cases, e.g. under compute-sanitizer */
    tcase_add_checked_fixture(small, setup, teardown);
    tcase_set_timeout(small, 600);
    tcase_add_test(small, test_packed_h64);
    tcase_add_test(small, test_packed_h128);
    tcase_add_test(small, test_padded_heads);
    tcase_add_test(small, test_front_packed);
    tcase_add_test(small, test_repeated_keys);
    tcase_add_test(small, test_query_groups);
    tcase_add_test(small, test_union_far_keys);
    suite_add_tcase(s, small);
    TCase *large = tcase_create("large");
    tcase_add_checked_fixture(large, setup, teardown);
    tcase_set_timeout(large, 600);
    tcase_add_test(large, test_decode_topk2048);
    tcase_add_test(large, test_old_vs_new);
    tcase_add_test(large, test_groups_vs_single);
    suite_add_tcase(s, large);
    TCase *bench = tcase_create("bench"); /* CK_RUN_CASE=bench DSARL_GPU_BENCH=1: the timings alone */
    tcase_add_checked_fixture(bench, setup, teardown);
    tcase_set_timeout(bench, 600);
    tcase_add_test(bench, test_bench);
    suite_add_tcase(s, bench);
    return s;
}

int main(void)
{
    int major = 0, minor = 0;
    if (cuda_visible_devices() == 0 || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) || major != 9 || minor != 0) {
        printf(LOG_PREFIX ": skipped: no compute capability 9.0 CUDA device is visible\n");
        return 77;
    }
    stream = cuda_test_seed(LOG_PREFIX, 0x9E3779B97F4A7C15ull);
    setvbuf(stdout, NULL, _IOLBF, 0); /* each figure reaches a redirected log at once, also when a timeout kills us */
    SRunner *sr = srunner_create(mla_bwd_sm90_suite());
    srunner_set_fork_status(sr, CK_NOFORK); /* CUDA does not survive fork */
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
