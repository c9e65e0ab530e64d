/* check_testkit.c: the installed test kit (dsarl/testkit.h), used the way an out-of-tree backend author would: only
 * installed headers, the reference DSA backend on the cpu device through the real loader, checked against an
 * independent brute-force top-k (descending score, the lower index first on exactly equal scores). */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dsarl/testkit.h"

#define CK_OK(call)                                                                                                 \
    do {                                                                                                            \
        dsarl_error e_;                                                                                             \
        dsarl_error_clear(&e_);                                                                                     \
        int rc_ = (call);                                                                                           \
        ck_assert_msg(rc_ == 0, "%s failed: %s", #call, e_.message);                                               \
    } while (0)

START_TEST(test_recipe_and_registry)
{
    dsarl_testkit *kit = NULL;
    dsarl_error err;
    ck_assert_int_eq(dsarl_testkit_open("runtime:\n  device: cpu\nx: ${runtime.device}\n", NULL, &kit, &err), 0);
    const dsarl_node *x = dsarl_node_get(dsarl_testkit_recipe(kit), "x");
    ck_assert_ptr_nonnull(x);
    ck_assert_str_eq(dsarl_node_text(x), "cpu"); /* resolved */
    ck_assert_ptr_nonnull(dsarl_testkit_find(kit, DSARL_KIND_DSA, "reference"));
    ck_assert_ptr_null(dsarl_testkit_find(kit, DSARL_KIND_DSA, "no-such-backend"));
    const dsarl_dsa_ops *ops;
    dsarl_dsa_context *ctx;
    const dsarl_device_ops *dev_ops;
    dsarl_device *dev;
    ck_assert_int_eq(dsarl_testkit_device(kit, "cpu", &dev_ops, &dev, &err), 0);
    ck_assert_int_lt(dsarl_testkit_dsa(kit, "no-such-backend", dev_ops, dev, &ops, &ctx, &err), 0);
    ck_assert_msg(strstr(err.message, "no-such-backend") && strstr(err.message, "reference"), "%s", err.message);
    dsarl_testkit_free(kit);
    /* A malformed recipe fails in one line. */
    ck_assert_int_lt(dsarl_testkit_open("a: [1, 2\n", NULL, &kit, &err), 0);
    ck_assert_ptr_null(kit);
    ck_assert_ptr_null(strchr(err.message, '\n'));
}
END_TEST

/* Brute force: the topk best eligible keys of query t, descending, lower index first on equal scores. */
static void brute_topk(const float *q, const float *k, const float *w, int32_t H, int32_t D, int32_t ks, int32_t ke,
                       int32_t topk, int32_t *idx, double *score)
{
    int32_t n = 0;
    for (int32_t s = ks; s < ke; s++) {
        double sc = 0.0;
        for (int32_t j = 0; j < H; j++) {
            double dot = 0.0;
            for (int32_t d = 0; d < D; d++)
                dot += (double)q[j * D + d] * k[s * D + d];
            sc += w[j] * (dot > 0 ? dot : 0.0);
        }
        /* insertion into the sorted prefix */
        int32_t pos = n < topk ? n : topk;
        while (pos > 0 && (sc > score[pos - 1] || (sc == score[pos - 1] && s < idx[pos - 1]))) {
            if (pos < topk) {
                score[pos] = score[pos - 1];
                idx[pos] = idx[pos - 1];
            }
            pos--;
        }
        if (pos < topk) {
            score[pos] = sc;
            idx[pos] = s;
        }
        if (n < topk)
            n++;
    }
    for (int32_t i = n; i < topk; i++) {
        idx[i] = -1;
        score[i] = -INFINITY;
    }
}

START_TEST(test_reference_topk_through_the_kit)
{
    dsarl_testkit *kit = NULL;
    CK_OK(dsarl_testkit_open("runtime: {device: cpu}\n", NULL, &kit, &e_));
    const dsarl_device_ops *dev_ops;
    dsarl_device *dev;
    CK_OK(dsarl_testkit_device(kit, "cpu", &dev_ops, &dev, &e_));
    ck_assert_msg(dsarl_device_capabilities(dev_ops) == 0 ||
                      (dsarl_device_capabilities(dev_ops) & DSARL_DEVICE_CAP_HOST_MEMORY),
                  "cpu device without host memory");
    const dsarl_dsa_ops *ops;
    dsarl_dsa_context *ctx;
    CK_OK(dsarl_testkit_dsa(kit, "reference", dev_ops, dev, &ops, &ctx, &e_));

    enum { T = 14, H = 3, D = 8, TOPK = 4 };
    const int32_t cu[3] = {0, 5, 14}; /* two causal segments */
    int32_t key_start[T], key_end[T];
    for (int32_t s = 0; s < 2; s++)
        for (int32_t t = cu[s]; t < cu[s + 1]; t++) {
            key_start[t] = cu[s];
            key_end[t] = t + 1;
        }
    float q[T * H * D], k[T * D], w[T * H];
    dsarl_testkit_fill_uniform(q, T * H * D, -1.0f, 1.0f, 7, 0);
    dsarl_testkit_fill_uniform(k, T * D, -1.0f, 1.0f, 7, 1);
    dsarl_testkit_fill_uniform(w, T * H, -0.5f, 1.0f, 7, 2);
    memcpy(k + 9 * D, k + 7 * D, D * sizeof(float)); /* keys 7 and 9 score exactly alike: 7 must come first */

    /* Device copies (the cpu device stores float32; upload through the device so the test holds on any). */
    void *dq, *dk;
    float *dw;
    int32_t *dks, *dke, *didx;
    float *dscores;
    CK_OK(dev_ops->alloc(dev, sizeof q, &dq, &e_));
    CK_OK(dev_ops->alloc(dev, sizeof k, &dk, &e_));
    CK_OK(dev_ops->alloc(dev, sizeof w, (void **)&dw, &e_));
    CK_OK(dev_ops->alloc(dev, sizeof key_start, (void **)&dks, &e_));
    CK_OK(dev_ops->alloc(dev, sizeof key_end, (void **)&dke, &e_));
    CK_OK(dev_ops->alloc(dev, T * TOPK * sizeof(int32_t), (void **)&didx, &e_));
    CK_OK(dev_ops->alloc(dev, T * TOPK * sizeof(float), (void **)&dscores, &e_));
    dsarl_dtype st = dev_ops->storage_dtype(dev);
    CK_OK(dev_ops->upload_f32(dev, dq, st, q, T * H * D, &e_));
    CK_OK(dev_ops->upload_f32(dev, dk, st, k, T * D, &e_));
    CK_OK(dev_ops->copy(dev, dw, w, sizeof w, DSARL_COPY_HOST_TO_DEVICE, &e_));
    CK_OK(dev_ops->copy(dev, dks, key_start, sizeof key_start, DSARL_COPY_HOST_TO_DEVICE, &e_));
    CK_OK(dev_ops->copy(dev, dke, key_end, sizeof key_end, DSARL_COPY_HOST_TO_DEVICE, &e_));

    dsarl_dsa_batch batch = {.struct_size = sizeof batch, .n_queries = T, .n_keys = T, .key_start = dks,
                             .key_end = dke, .max_keys_per_query = 9, .host_cu_seqlens = cu, .n_segments = 2};
    dsarl_dsa_indexer_inputs in = {.struct_size = sizeof in, .q = dq, .k = dk, .weights = dw, .n_heads = H,
                                   .head_dim = D};
    CK_OK(ops->indexer_topk(ctx, &batch, &in, TOPK, didx, dscores, &e_));
    CK_OK(dev_ops->synchronize(dev, &e_));
    int32_t idx[T * TOPK];
    float scores[T * TOPK];
    CK_OK(dev_ops->copy(dev, idx, didx, sizeof idx, DSARL_COPY_DEVICE_TO_HOST, &e_));
    CK_OK(dev_ops->copy(dev, scores, dscores, sizeof scores, DSARL_COPY_DEVICE_TO_HOST, &e_));

    int tie_rows = 0;
    for (int32_t t = 0; t < T; t++) {
        int32_t want[TOPK];
        double want_score[TOPK];
        brute_topk(q + t * H * D, k, w + t * H, H, D, key_start[t], key_end[t], TOPK, want, want_score);
        for (int32_t i = 0; i < TOPK; i++) {
            ck_assert_msg(idx[t * TOPK + i] == want[i], "row %d slot %d: index %d, brute force %d", t, i,
                          idx[t * TOPK + i], want[i]);
            if (want[i] < 0)
                ck_assert_msg(isinf(scores[t * TOPK + i]) && scores[t * TOPK + i] < 0, "row %d slot %d", t, i);
            else
                ck_assert_msg(fabs(scores[t * TOPK + i] - want_score[i]) <= 1e-5 * (1.0 + fabs(want_score[i])),
                              "row %d slot %d: score %g, brute force %g", t, i, scores[t * TOPK + i], want_score[i]);
            if (i + 1 < TOPK && want[i] == 7 && want[i + 1] == 9)
                tie_rows++;
        }
    }
    ck_assert_msg(tie_rows > 0, "no row ranks the tied keys 7 and 9 next to each other: the tie is untested");
    dev_ops->free(dev, dq);
    dev_ops->free(dev, dk);
    dev_ops->free(dev, dw);
    dev_ops->free(dev, dks);
    dev_ops->free(dev, dke);
    dev_ops->free(dev, didx);
    dev_ops->free(dev, dscores);
    dsarl_testkit_free(kit);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("testkit");
    TCase *tc = tcase_create("testkit");
    tcase_add_test(tc, test_recipe_and_registry);
    tcase_add_test(tc, test_reference_topk_through_the_kit);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
