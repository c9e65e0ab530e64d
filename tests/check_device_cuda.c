/* check_device_cuda.c: every CUDA device op against the CPU device's op on the same fresh random inputs.
 *
 * Inputs are drawn in float32 and rounded to bf16 once; the CPU device (float32, the reference) and the CUDA
 * device (bf16 storage, fp32 math) both start from those bf16 values, so the difference is the CUDA op's own
 * rounding: outputs stored in bf16 (relative step 2^-8) and fp32 summation order. Tolerances, as
 * max |cuda - cpu| / max |cpu| over the output: 1e-2 for bf16 outputs (a few bf16 steps), 1e-5 for float32
 * outputs computed from the same inputs (statistics, log-probs, routing), exact for selections (routing indices,
 * argmax sampling). Each comparison prints its measured error. The op-class profile (profile_scope under
 * runtime.cuda_profile=true) is checked on known work: classes, call counts, which class dominates, and spans that
 * add up to the timeline across a forced read-back. Label gpu; exit status 77 (skipped) without a GPU. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_device.h"
#define DSARL_CUDA_DEVICE_OPAQUE /* both plugins define struct dsarl_device */
#include "cuda_device.h"
#include "cuda_profile.h"
#include "recipe_internal.h"
#include "cuda_test_util.h"

static float *copy_floats(const float *a, int64_t n)
{
    float *b = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    memcpy(b, a, (size_t)n * sizeof(float));
    return b;
}

static dsarl_device *gpu, *cpu;
static dsarl_error err;
static rng stream;               /* the run's random inputs (cuda_test_util.h) */
static close_check cc;           /* expect_close's device and printed label (with the storage dtype) */
static dsarl_dtype storage;      /* the GPU's storage dtype in the running test case */
static double storage_tol;       /* tolerance of storage-dtype outputs: 1e-2 for bf16, 1e-5 for f32 */

static void create_devices(const char *recipe_text)
{
    dsarl_recipe *recipe = NULL;
    dsarl_parallel single = DSARL_PARALLEL_SINGLE;
    dsarl_device_config cfg = {.struct_size = sizeof(cfg), .parallel = &single, .threads = 1};
    if (recipe_text) {
        ck_assert_int_eq(dsarl_recipe_load_string(recipe_text, "cuda.yaml", &recipe, &err), 0);
        ck_assert_int_eq(dsarl_recipe_resolve(recipe, &err), 0);
        cfg.recipe = dsarl_recipe_root(recipe);
    }
    ck_assert_msg(cuda_create(&cfg, &gpu, &err) == 0, "%s", err.message);
    cfg.recipe = NULL;
    ck_assert_int_eq(cpu_create(&cfg, &cpu, &err), 0);
    dsarl_recipe_free(recipe);
    storage = cuda_storage_dtype(gpu);
    storage_tol = storage == DSARL_DTYPE_F32 ? 1e-5 : 1e-2;
    cc = (close_check){.gpu = gpu, .width = 28,
                       .label = storage == DSARL_DTYPE_F32 ? "check_device_cuda: f32" : "check_device_cuda: bf16"};
}

// The running case's storage dtype (the shared to_gpu_as takes it as an argument).
static void *to_storage(const float *h, int64_t n) { return to_gpu_as(gpu, h, n, storage); }

static void setup(void) { create_devices(NULL); }
static void setup_f32(void) { create_devices("runtime:\n  cuda_storage_dtype: f32\n"); }
static void setup_profile(void) { create_devices("runtime:\n  cuda_profile: true\n"); }

static void teardown(void)
{
    cuda_destroy(gpu);
    cpu_destroy(cpu);
}

#define F32_TOL 1e-5
#define esz ((int64_t)dsarl_dtype_size(storage)) /* bytes of one storage element */

/* --- GEMM ------------------------------------------------------------------------------------------------ */

START_TEST(test_gemm_all_transposes)
{
    // odd sizes, alpha/beta, and operands one element past an aligned base (cuBLASLt alignment handling)
    int64_t m = 37, n = 53, k = 71;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            float *a = rand_bf16(&stream, m * k + 1, 1), *b = rand_bf16(&stream, k * n + 1, 1),
                  *c = rand_bf16(&stream, m * n + 1, 1);
            char *da = to_storage(a, m * k + 1), *db = to_storage(b, k * n + 1), *dc = to_storage(c, m * n + 1);
            ck_assert_int_eq(cpu_gemm(cpu, ta, tb, m, n, k, 0.5f, a + 1, b + 1, 0.25f, c + 1, &err), 0);
            ck_assert_msg(cuda_gemm(gpu, ta, tb, m, n, k, 0.5f, da + esz, db + esz, 0.25f, dc + esz, &err) == 0, "%s",
                          err.message);
            expect_close(&cc, dc + esz, storage, c + 1, m * n, storage_tol, ta ? (tb ? "gemm TT" : "gemm TN")
                                                                                  : (tb ? "gemm NT" : "gemm NN"));
            cuda_free(gpu, da), cuda_free(gpu, db), cuda_free(gpu, dc);
            free(a), free(b), free(c);
        }
}
END_TEST

// gemm_grouped (ABI 1.7): a MoE layer's products over expert row groups (empty groups among them, and more groups
// than lanes, so the lanes take several each) against one CPU gemm per group, in both modes: rows (forward, the
// input gradient) with and without a transposed B, and inner (weight gradients accumulated with beta 1, and beta 0)
START_TEST(test_gemm_grouped)
{
    int (*grouped)(dsarl_device *, bool, bool, int64_t, const int64_t *, int64_t, int64_t, int64_t, float,
                   const void *, const void *, int64_t, float, void *, int64_t, dsarl_error *) =
        DSARL_DEVICE_SLOT(&dsarl_cuda_device_ops, gemm_grouped);
    ck_assert_ptr_nonnull(grouped);
    enum { G = 9 };
    const int64_t rows_of[G] = {5, 0, 130, 1, 64, 0, 300, 17, 33};
    int64_t first[G + 1] = {0};
    for (int g = 0; g < G; g++)
        first[g + 1] = first[g] + rows_of[g];
    int64_t R = first[G], n = 80, k = 96, m = 48;
    for (int tb = 0; tb <= 1; tb++) { // rows mode: C rows of g (r_g, n) = A rows of g (r_g, k) op(B_g)
        float *a = rand_bf16(&stream, R * k, 1), *b = rand_bf16(&stream, G * k * n, 1);
        float *c = rand_bf16(&stream, R * n, 1);
        void *da = to_storage(a, R * k), *db = to_storage(b, G * k * n), *dc = to_storage(c, R * n);
        for (int g = 0; g < G; g++)
            if (rows_of[g] > 0)
                ck_assert_int_eq(cpu_gemm(cpu, false, tb, rows_of[g], n, k, 0.5f, a + first[g] * k, b + g * k * n, 0.0f,
                                          c + first[g] * n, &err), 0);
        ck_assert_msg(grouped(gpu, false, tb, G, first, 0, n, k, 0.5f, da, db, k * n, 0.0f, dc, 0, &err) == 0, "%s",
                      err.message);
        expect_close(&cc, dc, storage, c, R * n, storage_tol,
                     tb ? "gemm_grouped rows, B transposed" : "gemm_grouped rows");
        cuda_free(gpu, da), cuda_free(gpu, db), cuda_free(gpu, dc);
        free(a), free(b), free(c);
    }
    for (int accumulate = 0; accumulate <= 1; accumulate++) { // inner: C_g (m, n) (+)= (A rows of g)^T B rows of g
        float beta = accumulate ? 1.0f : 0.0f;
        float *a = rand_bf16(&stream, R * m, 1), *b = rand_bf16(&stream, R * n, 1);
        float *c = rand_bf16(&stream, G * m * n, 1);
        void *da = to_storage(a, R * m), *db = to_storage(b, R * n), *dc = to_storage(c, G * m * n);
        for (int g = 0; g < G; g++)
            if (rows_of[g] > 0 || beta != 1.0f)
                ck_assert_int_eq(cpu_gemm(cpu, true, false, m, n, rows_of[g], 1.0f, a + first[g] * m, b + first[g] * n,
                                          beta, c + g * m * n, &err), 0);
        ck_assert_msg(grouped(gpu, true, false, G, first, m, n, 0, 1.0f, da, db, 0, beta, dc, m * n, &err) == 0, "%s",
                      err.message);
        expect_close(&cc, dc, storage, c, G * m * n, storage_tol,
                     accumulate ? "gemm_grouped inner, accumulated" : "gemm_grouped inner");
        cuda_free(gpu, da), cuda_free(gpu, db), cuda_free(gpu, dc);
        free(a), free(b), free(c);
    }
    // a decreasing first[] is refused with a sentence naming the group
    int64_t bad[3] = {0, 4, 2};
    ck_assert_int_ne(grouped(gpu, false, false, 2, bad, 0, n, k, 1.0f, NULL, NULL, 0, 0.0f, NULL, 0, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.message, "must not decrease"));
}
END_TEST

/* cuda_create with the recipe keys of yaml (a second instance on the same GPU, its own streams); its return code. */
static int cuda_from_yaml(const char *yaml, dsarl_device **dev)
{
    dsarl_recipe *recipe = NULL;
    ck_assert_int_eq(dsarl_recipe_load_string(yaml, "keys.yaml", &recipe, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(recipe, &err), 0);
    dsarl_parallel single = DSARL_PARALLEL_SINGLE;
    dsarl_device_config cfg = {.struct_size = sizeof(cfg), .parallel = &single, .threads = 1,
                               .recipe = dsarl_recipe_root(recipe)};
    *dev = NULL;
    dsarl_error_clear(&err);
    int rc = cuda_create(&cfg, dev, &err);
    dsarl_recipe_free(recipe);
    return rc;
}

static dsarl_device *cuda_with(const char *yaml)
{
    dsarl_device *dev = NULL;
    ck_assert_msg(cuda_from_yaml(yaml, &dev) == 0, "%s", err.message);
    return dev;
}

/* Bad values of the device's keys are refused at create, in one sentence naming the key and the valid values. */
START_TEST(test_bad_keys_refused)
{
    static const char *const cases[][3] = {{"cuda_grouped_gemm", "fast", "must be auto, wgmma or lanes, got 'fast'"},
                                           {"cuda_storage_dtype", "fp16", "must be bf16 or f32, got 'fp16'"}};
    for (int i = 0; i < 2; i++) {
        char yaml[128];
        snprintf(yaml, sizeof yaml, "runtime:\n  %s: %s\n", cases[i][0], cases[i][1]);
        dsarl_device *dev = NULL;
        ck_assert_int_ne(cuda_from_yaml(yaml, &dev), 0);
        ck_assert_ptr_null(dev);
        ck_assert_msg(strstr(err.message, cases[i][0]) && strstr(err.message, cases[i][2]) &&
                          !strchr(err.message, '\n'), "%s", err.message);
        printf("check_device_cuda: refused %s=%s: %s\n", cases[i][0], cases[i][1], err.message);
    }
}
END_TEST

/* gemm_grouped's wgmma kernel (bf16, n and the reduced dim in 64s) at MoE shapes: ragged groups with empty ones, a
 * group of one row, groups past a 128-row tile, n that ends inside a tile (192, 320), in all three products, against
 * one CPU gemm per group; alpha and beta not 1. The kernel must take these shapes (and decline n = 80). Float32
 * storage: the kernel declines and the lanes run the same cases. */
START_TEST(test_gemm_grouped_wgmma)
{
    enum { G = 10 };
    const int64_t rows_of[G] = {5, 0, 130, 1, 64, 0, 300, 17, 256, 33};
    int64_t first[G + 1] = {0};
    for (int g = 0; g < G; g++)
        first[g + 1] = first[g] + rows_of[g];
    const int64_t R = first[G];
    const int64_t shapes[3][3] = {{192, 2048, 0}, {320, 256, 0}, {192, 320, 0}}; /* n, k (rows) | m, n (inner) */
    int dev_sm90 = 0;
    cudaDeviceGetAttribute(&dev_sm90, cudaDevAttrComputeCapabilityMajor, 0);
    dsarl_device *forced = cuda_with(storage == DSARL_DTYPE_F32 ? "runtime:\n  cuda_grouped_gemm: wgmma\n"
                                                                  "  cuda_storage_dtype: f32\n"
                                                                : "runtime:\n  cuda_grouped_gemm: wgmma\n");
    for (int mode = 0; mode < 4; mode++) { /* rows B^T, rows B, inner beta 0, inner beta 1 */
        const bool inner = mode >= 2, tb = mode == 0;
        const int64_t n = inner ? shapes[2][1] : shapes[mode][0], k = inner ? 0 : shapes[mode][1];
        const int64_t m = inner ? shapes[2][0] : 0;
        const float alpha = 0.5f, beta = inner ? (mode == 3 ? 1.0f : 0.0f) : 0.25f;
        const int64_t na = inner ? R * m : R * k, nb = inner ? R * n : G * k * n, nc = inner ? G * m * n : R * n;
        float *a = rand_bf16(&stream, na, 1), *b = rand_bf16(&stream, nb, 1), *c = rand_bf16(&stream, nc, 1);
        void *da = to_storage(a, na), *db = to_storage(b, nb), *dc = to_storage(c, nc);
        for (int g = 0; g < G; g++) {
            if (inner && (rows_of[g] > 0 || beta != 1.0f))
                ck_assert_int_eq(cpu_gemm(cpu, true, false, m, n, rows_of[g], alpha, a + first[g] * m,
                                          b + first[g] * n, beta, c + g * m * n, &err), 0);
            else if (!inner && rows_of[g] > 0)
                ck_assert_int_eq(cpu_gemm(cpu, false, tb, rows_of[g], n, k, alpha, a + first[g] * k, b + g * k * n,
                                          beta, c + first[g] * n, &err), 0);
        }
        int used = 0;
        ck_assert_msg(cuda_gemm_grouped_wgmma(forced, inner, tb, G, first, m, n, k, alpha, da, db, k * n, beta, dc,
                                              m * n, &used, &err) == 0, "%s", err.message);
        ck_assert_int_eq(used, storage == DSARL_DTYPE_BF16 && dev_sm90 == 9);
        if (!used)
            ck_assert_msg(cuda_gemm_grouped(forced, inner, tb, G, first, m, n, k, alpha, da, db, k * n, beta, dc,
                                            m * n, &err) == 0, "%s", err.message);
        ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess); /* forced queues on its own stream */
        const char *names[4] = {"gemm_grouped wgmma rows, B^T", "gemm_grouped wgmma rows, B",
                                "gemm_grouped wgmma inner", "gemm_grouped wgmma inner, beta 1"};
        expect_close(&cc, dc, storage, c, nc, storage_tol, names[mode]);
        cuda_free(gpu, da), cuda_free(gpu, db), cuda_free(gpu, dc);
        free(a), free(b), free(c);
    }
    int used = 1; /* n = 80 is not a multiple of 64: declined */
    ck_assert_int_eq(cuda_gemm_grouped_wgmma(forced, false, true, G, first, 0, 80, 128, 1.0f, NULL, NULL, 0, 0.0f,
                                             NULL, 0, &used, &err), 0);
    ck_assert_int_eq(used, 0);
    cuda_destroy(forced);
}
END_TEST

/* DSARL_GPU_BENCH=1: the bench config's MoE layer (64 experts, hidden 2048, expert width 512, 8192 tokens x top 8
 * over the experts at random): each of its six grouped products, wgmma kernel against the cuBLASLt lanes. */
START_TEST(test_gemm_grouped_bench)
{
    if (!getenv("DSARL_GPU_BENCH") || storage != DSARL_DTYPE_BF16)
        return;
    dsarl_device *lanes = cuda_with("runtime:\n  cuda_grouped_gemm: lanes\n");
    dsarl_device *kernel = cuda_with("runtime:\n  cuda_grouped_gemm: wgmma\n");
    enum { E = 64 };
    const int64_t C = 2048, I = 512, R = 8192 * 8;
    int64_t first[E + 1] = {0}, count[E] = {0};
    for (int64_t r = 0; r < R; r++)
        count[rng_below(&stream, E)]++;
    for (int e = 0; e < E; e++)
        first[e + 1] = first[e] + count[e];
    struct { const char *name; bool inner, tb; int64_t m, n, k; } p[6] = {
        {"gate/up  x W^T", false, true, 0, 2 * I, C},   {"down     x W^T", false, true, 0, C, I},
        {"d act    dy W", false, false, 0, I, C},       {"d in     dy W", false, false, 0, C, 2 * I},
        {"dW down  dy^T act", true, false, C, I, 0},    {"dW gu    dgu^T in", true, false, 2 * I, C, 0}};
    void *a = dev_alloc(gpu, (size_t)(R * C * 2)), *b = dev_alloc(gpu, (size_t)(E * C * 2 * I * 2));
    void *c = dev_alloc(gpu, (size_t)(R * C * 2) > (size_t)(E * C * 2 * I * 2) ? (size_t)(R * C * 2)
                                                                                : (size_t)(E * C * 2 * I * 2));
    cudaMemset(a, 0x3c, (size_t)(R * C * 2)), cudaMemset(b, 0x3c, (size_t)(E * C * 2 * I * 2));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    for (int i = 0; i < 6; i++) {
        const double flops = 2.0 * R * (p[i].inner ? p[i].m * p[i].n : p[i].n * p[i].k);
        float ms[2];
        for (int which = 0; which < 2; which++) {
            dsarl_device *dev = which ? lanes : kernel;
            for (int r = -1; r < 5; r++) {
                if (r == 0)
                    cudaEventRecord(e0, (cudaStream_t)cuda_stream(dev));
                ck_assert_msg(cuda_gemm_grouped(dev, p[i].inner, p[i].tb, E, first, p[i].m, p[i].n, p[i].k, 1.0f, a, b,
                                                p[i].n * (p[i].k ? p[i].k : 1), p[i].inner ? 1.0f : 0.0f, c,
                                                p[i].m * p[i].n, &err) == 0, "%s", err.message);
            }
            cudaEventRecord(e1, (cudaStream_t)cuda_stream(dev));
            ck_assert_int_eq(cudaEventSynchronize(e1), cudaSuccess);
            cudaEventElapsedTime(&ms[which], e0, e1);
            ms[which] /= 5.0f;
        }
        printf("check_device_cuda: BENCH gemm_grouped %s (64 experts, %lld rows): wgmma %.3f ms = %.1f TFLOP/s, "
               "lanes %.3f ms = %.1f TFLOP/s (%.2fx)\n", p[i].name, (long long)R, ms[0], flops / ms[0] / 1e9, ms[1],
               flops / ms[1] / 1e9, ms[1] / ms[0]);
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cuda_free(gpu, a), cuda_free(gpu, b), cuda_free(gpu, c);
    cuda_destroy(lanes);
    cuda_destroy(kernel);
}
END_TEST

START_TEST(test_gemm_strided_batched)
{
    int64_t m = 24, n = 40, k = 64, batch = 5;
    float *a = rand_bf16(&stream, batch * m * k, 1), *b = rand_bf16(&stream, batch * k * n, 1),
          *c = rand_bf16(&stream, batch * m * n, 1);
    void *da = to_storage(a, batch * m * k), *db = to_storage(b, batch * k * n), *dc = to_storage(c, batch * m * n);
    ck_assert_int_eq(cpu_gemm_strided_batched(cpu, false, true, m, n, k, 1.0f, a, m * k, b, k * n, 0.0f, c, m * n,
                                              batch, &err), 0);
    ck_assert_msg(cuda_gemm_strided_batched(gpu, false, true, m, n, k, 1.0f, da, m * k, db, k * n, 0.0f, dc, m * n,
                                            batch, &err) == 0, "%s", err.message);
    expect_close(&cc, dc, storage, c, batch * m * n, storage_tol, "gemm_strided_batched");
    // k = 0: C = beta * C
    float *c0 = copy_floats(c, m * n);
    for (int64_t i = 0; i < m * n; i++)
        c0[i] *= 0.5f;
    ck_assert_int_eq(cuda_gemm(gpu, false, false, m, n, 0, 1.0f, da, db, 0.5f, dc, &err), 0);
    expect_close(&cc, dc, storage, c0, m * n, storage_tol, "gemm k=0");
    cuda_free(gpu, da), cuda_free(gpu, db), cuda_free(gpu, dc);
    free(a), free(b), free(c), free(c0);
}
END_TEST

/* --- norms ------------------------------------------------------------------------------------------------ */

START_TEST(test_rmsnorm)
{
    int64_t T = 19, C = 300;
    float *x = rand_bf16(&stream, T * C, 2), *w = rand_bf16(&stream, C, 1), *dout = rand_bf16(&stream, T * C, 1),
          *dw = rand_bf16(&stream, C, 1);
    float *out = malloc(T * C * 4), *rstd = malloc(T * 4), *dx = malloc(T * C * 4);
    void *gx = to_storage(x, T * C), *gw = to_storage(w, C), *gdout = to_storage(dout, T * C), *gdw = to_storage(dw, C);
    void *gout = to_storage(x, T * C), *gdx = to_storage(x, T * C);
    float *grstd = to_gpu_f32(gpu, x, T);
    ck_assert_int_eq(cpu_rmsnorm_forward(cpu, out, rstd, x, w, T, C, 1e-5f, &err), 0);
    ck_assert_int_eq(cuda_rmsnorm_forward(gpu, gout, grstd, gx, gw, T, C, 1e-5f, &err), 0);
    expect_close(&cc, gout, storage, out, T * C, storage_tol, "rmsnorm_forward out");
    expect_close(&cc, grstd, DSARL_DTYPE_F32, rstd, T, F32_TOL, "rmsnorm_forward rstd");
    ck_assert_int_eq(cpu_rmsnorm_backward(cpu, dx, dw, dout, x, w, rstd, T, C, &err), 0);
    ck_assert_int_eq(cuda_rmsnorm_backward(gpu, gdx, gdw, gdout, gx, gw, grstd, T, C, &err), 0);
    expect_close(&cc, gdx, storage, dx, T * C, storage_tol, "rmsnorm_backward dinp");
    expect_close(&cc, gdw, storage, dw, C, storage_tol, "rmsnorm_backward dweight (+=)");
    cuda_free(gpu, gx), cuda_free(gpu, gw), cuda_free(gpu, gdout), cuda_free(gpu, gdw), cuda_free(gpu, gout);
    cuda_free(gpu, gdx), cuda_free(gpu, grstd);
    free(x), free(w), free(dout), free(dw), free(out), free(rstd), free(dx);
}
END_TEST

START_TEST(test_layernorm)
{
    int64_t T = 13, C = 128;
    float *x = rand_bf16(&stream, T * C, 2), *w = rand_bf16(&stream, C, 1), *b = rand_bf16(&stream, C, 1),
          *dout = rand_bf16(&stream, T * C, 1);
    float *dw = rand_bf16(&stream, C, 1), *db = rand_bf16(&stream, C, 1);
    for (int64_t i = 0; i < T * C; i++)
        x[i] = bf16_value(x[i] + 0.5f); /* a mean away from 0 */
    float *out = malloc(T * C * 4), *mean = malloc(T * 4), *rstd = malloc(T * 4), *dx = malloc(T * C * 4);
    void *gx = to_storage(x, T * C), *gw = to_storage(w, C), *gb = to_storage(b, C), *gdout = to_storage(dout, T * C);
    void *gdw = to_storage(dw, C), *gdb = to_storage(db, C), *gout = to_storage(x, T * C), *gdx = to_storage(x, T * C);
    float *gmean = to_gpu_f32(gpu, x, T), *grstd = to_gpu_f32(gpu, x, T);
    ck_assert_int_eq(cpu_layernorm_forward(cpu, out, mean, rstd, x, w, b, T, C, 1e-6f, &err), 0);
    ck_assert_int_eq(cuda_layernorm_forward(gpu, gout, gmean, grstd, gx, gw, gb, T, C, 1e-6f, &err), 0);
    expect_close(&cc, gout, storage, out, T * C, storage_tol, "layernorm_forward out");
    expect_close(&cc, gmean, DSARL_DTYPE_F32, mean, T, F32_TOL, "layernorm_forward mean");
    expect_close(&cc, grstd, DSARL_DTYPE_F32, rstd, T, F32_TOL, "layernorm_forward rstd");
    ck_assert_int_eq(cpu_layernorm_backward(cpu, dx, dw, db, dout, x, w, mean, rstd, T, C, &err), 0);
    ck_assert_int_eq(cuda_layernorm_backward(gpu, gdx, gdw, gdb, gdout, gx, gw, gmean, grstd, T, C, &err), 0);
    expect_close(&cc, gdx, storage, dx, T * C, storage_tol, "layernorm_backward dinp");
    expect_close(&cc, gdw, storage, dw, C, storage_tol, "layernorm_backward dweight");
    expect_close(&cc, gdb, storage, db, C, storage_tol, "layernorm_backward dbias");
    cuda_free(gpu, gx), cuda_free(gpu, gw), cuda_free(gpu, gb), cuda_free(gpu, gdout), cuda_free(gpu, gdw);
    cuda_free(gpu, gdb), cuda_free(gpu, gout), cuda_free(gpu, gdx), cuda_free(gpu, gmean), cuda_free(gpu, grstd);
    free(x), free(w), free(b), free(dout), free(dw), free(db), free(out), free(mean), free(rstd), free(dx);
}
END_TEST

/* --- RoPE ------------------------------------------------------------------------------------------------- */

START_TEST(test_rope)
{
    // q-like layout: (T, H, 192) with the rope part in the last 64 columns, rotated in place
    int64_t T = 11, H = 3, head = 192, rope_dim = 64, off = 128;
    float *x = rand_bf16(&stream, T * H * head, 1), *inv = malloc(rope_dim / 2 * 4);
    int32_t pos[11];
    for (int64_t i = 0; i < rope_dim / 2; i++)
        inv[i] = powf(10000.0f, -2.0f * (float)i / (float)rope_dim);
    for (int t = 0; t < T; t++)
        pos[t] = 3 * t + 1000;
    void *gx = to_storage(x, T * H * head);
    float *ginv = to_gpu_f32(gpu, inv, rope_dim / 2);
    int32_t *gpos = to_gpu_i32(gpu, pos, T);
    for (int backward = 0; backward < 2; backward++) {
        float *want = copy_floats(x, T * H * head);
        if (!backward) {
            ck_assert_int_eq(cpu_rope_forward(cpu, want + off, want + off, pos, inv, 1.25f, T, H, H * head, head,
                                              rope_dim, &err), 0);
            ck_assert_int_eq(cuda_rope_forward(gpu, (char *)gx + off * esz, (char *)gx + off * esz, gpos, ginv, 1.25f,
                                               T, H, H * head, head, rope_dim, &err), 0);
        } else {
            ck_assert_int_eq(cpu_rope_backward(cpu, want + off, want + off, pos, inv, 1.25f, T, H, H * head, head,
                                               rope_dim, &err), 0);
            ck_assert_int_eq(cuda_rope_backward(gpu, (char *)gx + off * esz, (char *)gx + off * esz, gpos, ginv, 1.25f,
                                                T, H, H * head, head, rope_dim, &err), 0);
        }
        expect_close(&cc, gx, storage, want, T * H * head, storage_tol,
                     backward ? "rope_backward (in place)" : "rope_forward (in place)");
        free(x);
        x = from_gpu(gpu, gx, T * H * head, storage); /* continue from the device's values */
        free(want);
    }
    cuda_free(gpu, gx), cuda_free(gpu, ginv), cuda_free(gpu, gpos);
    free(x), free(inv);
}
END_TEST

/* --- elementwise, embedding, rows ------------------------------------------------------------------------ */

START_TEST(test_swiglu_add_axpy_copy2d)
{
    int64_t T = 17, inner = 96;
    float *inp = rand_bf16(&stream, T * 2 * inner, 3), *dout = rand_bf16(&stream, T * inner, 1);
    float *out = malloc(T * inner * 4), *dinp = malloc(T * 2 * inner * 4);
    void *ginp = to_storage(inp, T * 2 * inner), *gdout = to_storage(dout, T * inner),
         *gout = to_storage(dout, T * inner);
    void *gdinp = to_storage(inp, T * 2 * inner);
    ck_assert_int_eq(cpu_swiglu_forward(cpu, out, inp, T, inner, &err), 0);
    ck_assert_int_eq(cuda_swiglu_forward(gpu, gout, ginp, T, inner, &err), 0);
    expect_close(&cc, gout, storage, out, T * inner, storage_tol, "swiglu_forward");
    ck_assert_int_eq(cpu_swiglu_backward(cpu, dinp, dout, inp, T, inner, &err), 0);
    ck_assert_int_eq(cuda_swiglu_backward(gpu, gdinp, gdout, ginp, T, inner, &err), 0);
    expect_close(&cc, gdinp, storage, dinp, T * 2 * inner, storage_tol, "swiglu_backward");

    int64_t n = T * inner;
    float *a = rand_bf16(&stream, n, 1), *b = rand_bf16(&stream, n, 1), *sum = malloc(n * 4);
    void *ga = to_storage(a, n), *gb = to_storage(b, n), *gsum = to_storage(a, n);
    ck_assert_int_eq(cpu_add(cpu, sum, a, b, n, &err), 0);
    ck_assert_int_eq(cuda_add(gpu, gsum, ga, gb, n, &err), 0);
    expect_close(&cc, gsum, storage, sum, n, storage_tol, "add");
    ck_assert_int_eq(cpu_axpy(cpu, n, -0.75f, a, b, &err), 0);
    ck_assert_int_eq(cuda_axpy(gpu, n, -0.75f, ga, gb, &err), 0);
    expect_close(&cc, gb, storage, b, n, storage_tol, "axpy");
    // copy_2d: a (T, 40) block out of (T, inner) rows into (T, 50) rows at column 5
    float *dst = rand_bf16(&stream, T * 50, 1);
    void *gdst = to_storage(dst, T * 50);
    ck_assert_int_eq(cpu_copy_2d(cpu, dst + 5, 50, a + 7, inner, T, 40, &err), 0);
    ck_assert_int_eq(cuda_copy_2d(gpu, (char *)gdst + 5 * esz, 50, (char *)ga + 7 * esz, inner, T, 40, &err), 0);
    expect_close(&cc, gdst, storage, dst, T * 50, 0.0, "copy_2d (exact)");
    cuda_free(gpu, ginp), cuda_free(gpu, gdout), cuda_free(gpu, gout), cuda_free(gpu, gdinp), cuda_free(gpu, ga);
    cuda_free(gpu, gb), cuda_free(gpu, gsum), cuda_free(gpu, gdst);
    free(inp), free(dout), free(out), free(dinp), free(a), free(b), free(sum), free(dst);
}
END_TEST

START_TEST(test_embedding)
{
    int64_t T = 300, C = 72, V = 50; /* T > V: many repeated tokens */
    int32_t tokens[300];
    for (int t = 0; t < T; t++)
        tokens[t] = rng_below(&stream, (int32_t)V);
    float *wte = rand_bf16(&stream, V * C, 1), *dout = rand_bf16(&stream, T * C, 1),
          *dwte = rand_bf16(&stream, V * C, 1);
    float *out = malloc(T * C * 4);
    void *gwte = to_storage(wte, V * C), *gdout = to_storage(dout, T * C), *gdwte = to_storage(dwte, V * C);
    void *gout = to_storage(dout, T * C);
    int32_t *gtok = to_gpu_i32(gpu, tokens, T);
    ck_assert_int_eq(cpu_embedding_forward(cpu, out, tokens, wte, T, C, V, &err), 0);
    ck_assert_int_eq(cuda_embedding_forward(gpu, gout, gtok, gwte, T, C, V, &err), 0);
    expect_close(&cc, gout, storage, out, T * C, 0.0, "embedding_forward (exact)");
    ck_assert_int_eq(cpu_embedding_backward(cpu, dwte, dout, tokens, T, C, &err), 0);
    ck_assert_int_eq(cuda_embedding_backward(gpu, gdwte, gdout, gtok, T, C, &err), 0);
    expect_close(&cc, gdwte, storage, dwte, V * C, storage_tol, "embedding_backward (+=)");
    // a token outside the vocabulary is reported, not read
    tokens[123] = (int32_t)V;
    int32_t *gbad = to_gpu_i32(gpu, tokens, T);
    ck_assert_int_eq(cuda_embedding_forward(gpu, gout, gbad, gwte, T, C, V, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "position 123") != NULL, "%s", err.message);
    cuda_free(gpu, gwte), cuda_free(gpu, gdout), cuda_free(gpu, gdwte), cuda_free(gpu, gout), cuda_free(gpu, gtok);
    cuda_free(gpu, gbad);
    free(wte), free(dout), free(dwte), free(out);
}
END_TEST

START_TEST(test_rows)
{
    int64_t T = 40, C = 200, n = 160; /* every token four times, as MoE top-4 */
    int32_t rows[160];
    for (int64_t r = 0; r < n; r++)
        rows[r] = (int32_t)((r * 7 + (r / T)) % T);
    float *inp = rand_bf16(&stream, T * C, 1), *perm = malloc(n * C * 4), *scale = rand_bf16(&stream, n, 1);
    float *acc = rand_bf16(&stream, T * C, 1), *dots = malloc(n * 4), *other = rand_bf16(&stream, n * C, 1);
    void *ginp = to_storage(inp, T * C), *gperm = to_storage(other, n * C), *gacc = to_storage(acc, T * C);
    void *gother = to_storage(other, n * C);
    float *gscale = to_gpu_f32(gpu, scale, n), *gdots = to_gpu_f32(gpu, scale, n);
    int32_t *grows = to_gpu_i32(gpu, rows, n);
    ck_assert_int_eq(cpu_gather_rows(cpu, perm, inp, rows, n, C, &err), 0);
    ck_assert_int_eq(cuda_gather_rows(gpu, gperm, ginp, grows, n, C, &err), 0);
    expect_close(&cc, gperm, storage, perm, n * C, 0.0, "gather_rows (exact)");
    ck_assert_int_eq(cpu_scatter_add_rows(cpu, acc, other, rows, scale, n, C, &err), 0);
    ck_assert_int_eq(cuda_scatter_add_rows(gpu, gacc, gother, grows, gscale, n, C, &err), 0);
    expect_close(&cc, gacc, storage, acc, T * C, storage_tol, "scatter_add_rows (scaled)");
    ck_assert_int_eq(cpu_scatter_add_rows(cpu, acc, other, rows, NULL, n, C, &err), 0);
    ck_assert_int_eq(cuda_scatter_add_rows(gpu, gacc, gother, grows, NULL, n, C, &err), 0);
    expect_close(&cc, gacc, storage, acc, T * C, storage_tol, "scatter_add_rows (unscaled)");
    ck_assert_int_eq(cpu_row_dot(cpu, dots, perm, other, n, C, &err), 0);
    ck_assert_int_eq(cuda_row_dot(gpu, gdots, gperm, gother, n, C, &err), 0);
    expect_close(&cc, gdots, DSARL_DTYPE_F32, dots, n, F32_TOL, "row_dot");
    ck_assert_int_eq(cpu_scale_rows(cpu, perm, scale, n, C, &err), 0);
    ck_assert_int_eq(cuda_scale_rows(gpu, gperm, gscale, n, C, &err), 0);
    expect_close(&cc, gperm, storage, perm, n * C, storage_tol, "scale_rows");
    cuda_free(gpu, ginp), cuda_free(gpu, gperm), cuda_free(gpu, gacc), cuda_free(gpu, gother);
    cuda_free(gpu, gscale), cuda_free(gpu, gdots), cuda_free(gpu, grows);
    free(inp), free(perm), free(scale), free(acc), free(dots), free(other);
}
END_TEST

/* --- MoE routing -------------------------------------------------------------------------------------------- */

START_TEST(test_moe_route)
{
    int64_t T = 50, E = 64;
    int32_t K = 8, n_group = 8, topk_group = 4;
    for (int norm = 0; norm < 2; norm++) {
        float *logits = rand_bf16(&stream, T * E, 4), *bias = rand_bf16(&stream, E, 0.5f),
              *dw = rand_bf16(&stream, T * K, 1);
        float *w = malloc(T * K * 4), *probs = malloc(T * E * 4), *dlogits = malloc(T * E * 4);
        int32_t *idx = malloc(T * K * 4);
        float *glogits = to_gpu_f32(gpu, logits, T * E), *gbias = to_gpu_f32(gpu, bias, E),
              *gdw = to_gpu_f32(gpu, dw, T * K);
        float *gw = to_gpu_f32(gpu, dw, T * K), *gprobs = to_gpu_f32(gpu, logits, T * E),
              *gdlogits = to_gpu_f32(gpu, logits, T * E);
        int32_t *gidx = to_gpu_i32(gpu, idx, T * K);
        ck_assert_int_eq(cpu_moe_route_forward(cpu, idx, w, probs, logits, bias, T, E, K, n_group, topk_group, norm,
                                               2.5f, &err), 0);
        ck_assert_int_eq(cuda_moe_route_forward(gpu, gidx, gw, gprobs, glogits, gbias, T, E, K, n_group, topk_group,
                                                norm, 2.5f, &err), 0);
        int32_t *got = from_gpu_i32(gpu, gidx, T * K);
        for (int64_t i = 0; i < T * K; i++)
            ck_assert_msg(got[i] == idx[i], "moe_route: slot %lld picks expert %d, cpu %d", (long long)i, got[i],
                          idx[i]);
        expect_close(&cc, gw, DSARL_DTYPE_F32, w, T * K, F32_TOL,
                     norm ? "moe_route weights (norm)" : "moe_route weights");
        expect_close(&cc, gprobs, DSARL_DTYPE_F32, probs, T * E, F32_TOL, "moe_route probs");
        ck_assert_int_eq(cpu_moe_route_backward(cpu, dlogits, dw, idx, probs, T, E, K, norm, 2.5f, &err), 0);
        ck_assert_int_eq(cuda_moe_route_backward(gpu, gdlogits, gdw, gidx, gprobs, T, E, K, norm, 2.5f, &err), 0);
        expect_close(&cc, gdlogits, DSARL_DTYPE_F32, dlogits, T * E, F32_TOL, "moe_route_backward");
        cuda_free(gpu, glogits), cuda_free(gpu, gbias), cuda_free(gpu, gdw), cuda_free(gpu, gw);
        cuda_free(gpu, gprobs), cuda_free(gpu, gdlogits), cuda_free(gpu, gidx);
        free(logits), free(bias), free(dw), free(w), free(probs), free(dlogits), free(idx), free(got);
    }
}
END_TEST

/* moe_group_padded: the CUDA grouping equals the CPU device's exactly (rows, slots, slot_inv), at GLM-5's 256 experts
 * and top-8, for decode-sized and larger T, pad = T (no overflow) and pads below the largest group (overflow), with
 * some ids repeated in a row; every output starts stale, so each must be written. Ids outside [0, E), which the
 * CUDA op skips (slot_inv -1) where the CPU op refuses, are checked against the CPU grouping over E + 1 experts with
 * the bad ids moved to expert E: rows of experts below E are unchanged, and the moved pairs must have no row. */
static void group_case(int64_t T, int64_t E, int32_t K, int64_t pad, int bad_every, bool repeats, bool captured)
{
    int64_t N = T * K, Ec = bad_every ? E + 1 : E;
    int32_t *idx = malloc((size_t)(N > 0 ? N : 1) * sizeof(int32_t)), *cpu_idx = malloc((size_t)(N > 0 ? N : 1) * 4);
    for (int64_t t = 0; t < T; t++)
        for (int32_t k = 0; k < K; k++) {
            int32_t e;
            bool again;
            do { // half the draws from a hot set of 12 experts, so groups grow past small pads
                e = rng_below(&stream, 2) ? rng_below(&stream, 12) : rng_below(&stream, (int32_t)E);
                again = false;
                for (int32_t j = 0; j < k && !repeats; j++)
                    again |= idx[t * K + j] == e;
            } while (again);
            idx[t * K + k] = e;
        }
    for (int64_t i = 0; i < N; i++) {
        cpu_idx[i] = idx[i];
        if (bad_every && i % bad_every == 3) {
            idx[i] = (i / bad_every) % 2 ? -5 : (int32_t)(E + 7);
            cpu_idx[i] = (int32_t)E;
        }
    }
    int64_t R = Ec * pad;
    int32_t *rows = malloc((size_t)R * 4), *slot = malloc((size_t)R * 4), *inv = malloc((size_t)(N > 0 ? N : 1) * 4);
    ck_assert_msg(cpu_moe_group_padded(cpu, rows, slot, inv, cpu_idx, T, Ec, K, pad, &err) == 0, "%s", err.message);
    int32_t *stale = malloc((size_t)(R > N ? R : N) * 4 + 4);
    for (int64_t i = 0; i < (R > N ? R : N); i++)
        stale[i] = 0x5a5a5a5a;
    int32_t *gidx = to_gpu_i32(gpu, idx, N), *grows = to_gpu_i32(gpu, stale, E * pad);
    int32_t *gslot = to_gpu_i32(gpu, stale, E * pad), *ginv = to_gpu_i32(gpu, stale, N);
    if (captured) { // no host sync, no allocation: the call records into a graph, which then runs
        cudaStream_t s = (cudaStream_t)cuda_stream(gpu);
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        ck_assert_int_eq(cudaStreamSynchronize(s), cudaSuccess);
        ck_assert_int_eq(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
        int rc = cuda_moe_group_padded(gpu, grows, gslot, ginv, gidx, T, E, K, pad, &err);
        ck_assert_int_eq(cudaStreamEndCapture(s, &graph), cudaSuccess);
        ck_assert_msg(rc == 0, "%s", err.message);
        ck_assert_int_eq(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        ck_assert_int_eq(cudaGraphLaunch(exec, s), cudaSuccess);
        ck_assert_int_eq(cudaStreamSynchronize(s), cudaSuccess);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
    } else {
        ck_assert_msg(cuda_moe_group_padded(gpu, grows, gslot, ginv, gidx, T, E, K, pad, &err) == 0, "%s",
                      err.message);
    }
    int32_t *got_rows = from_gpu_i32(gpu, grows, E * pad), *got_slot = from_gpu_i32(gpu, gslot, E * pad);
    int32_t *got_inv = from_gpu_i32(gpu, ginv, N);
    int64_t dropped = 0;
    for (int64_t r = 0; r < E * pad; r++)
        ck_assert_msg(got_rows[r] == rows[r] && got_slot[r] == slot[r], "moe_group_padded T %lld pad %lld row %lld: "
                      "token %d slot %d, cpu %d %d", (long long)T, (long long)pad, (long long)r, got_rows[r],
                      got_slot[r], rows[r], slot[r]);
    for (int64_t i = 0; i < N; i++) {
        int32_t want = inv[i] >= E * pad ? -1 : inv[i]; // moved to expert E: no row on the GPU
        ck_assert_msg(got_inv[i] == want, "moe_group_padded T %lld pad %lld pair %lld (expert %d): row %d, cpu %d",
                      (long long)T, (long long)pad, (long long)i, idx[i], got_inv[i], want);
        dropped += want < 0;
    }
    printf("check_device_cuda: moe_group_padded T %lld E %lld top_k %d pad %lld%s%s%s: equal to cpu, %lld pairs "
           "without a row\n", (long long)T, (long long)E, K, (long long)pad, repeats ? ", repeats" : "",
           bad_every ? ", ids out of range" : "", captured ? ", graph-captured" : "", (long long)dropped);
    cuda_free(gpu, gidx), cuda_free(gpu, grows), cuda_free(gpu, gslot), cuda_free(gpu, ginv);
    free(idx), free(cpu_idx), free(rows), free(slot), free(inv), free(stale), free(got_rows), free(got_slot);
    free(got_inv);
}

START_TEST(test_moe_group_padded)
{
    const int64_t Ts[] = {1, 3, 17, 64, 300, 2048};
    for (size_t c = 0; c < sizeof Ts / sizeof Ts[0]; c++) {
        int64_t T = Ts[c];
        group_case(T, 256, 8, T, 0, false, false);                          // no overflow
        group_case(T, 256, 8, T > 3 ? T / 3 : 1, 0, false, false);          // overflow past small pads
        group_case(T, 256, 8, T, 0, true, false);                           // repeats overflow at pad = T
    }
    group_case(40, 256, 8, 40, 11, false, false); // ids out of range skipped
    group_case(64, 256, 8, 64, 0, false, true);   // decode-sized, captured into a CUDA graph
    group_case(0, 256, 8, 2, 0, false, false);    // no tokens: every row is padding
    group_case(5, 70000, 2, 1, 0, false, false);  // more experts than one grid's blocks
    ck_assert_int_eq(cuda_moe_group_padded(gpu, NULL, NULL, NULL, NULL, 2, 256, 8, 0, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "moe_group_padded"));
    ck_assert_int_eq(cuda_moe_group_padded(gpu, NULL, NULL, NULL, NULL, 2, (int64_t)1 << 40, 8, 2, &err),
                     DSARL_E_INVALID);
    const dsarl_device_ops *ops = &dsarl_cuda_device_ops;
    ck_assert_ptr_nonnull(DSARL_DEVICE_SLOT(ops, moe_group_padded));
}
END_TEST

/* --- log-probs, optimizer, sampling ---------------------------------------------------------------------- */

START_TEST(test_logprobs)
{
    int64_t T = 9, V = 5000;
    float *logits = rand_bf16(&stream, T * V, 6), *dlp = rand_bf16(&stream, T, 1), *lp = malloc(T * 4),
          *dlogits = malloc(T * V * 4);
    int32_t targets[9];
    for (int t = 0; t < T; t++)
        targets[t] = (int32_t)((t * 1237 + 11) % V);
    targets[4] = -1; /* ignored position */
    float *glogits = to_gpu_f32(gpu, logits, T * V), *gdlp = to_gpu_f32(gpu, dlp, T), *glp = to_gpu_f32(gpu, dlp, T);
    float *gdlogits = to_gpu_f32(gpu, logits, T * V);
    int32_t *gt = to_gpu_i32(gpu, targets, T);
    ck_assert_int_eq(cpu_logprobs_forward(cpu, lp, logits, targets, T, V, &err), 0);
    ck_assert_int_eq(cuda_logprobs_forward(gpu, glp, glogits, gt, T, V, &err), 0);
    expect_close(&cc, glp, DSARL_DTYPE_F32, lp, T, F32_TOL, "logprobs_forward");
    ck_assert_int_eq(cpu_logprobs_backward(cpu, dlogits, dlp, logits, targets, T, V, &err), 0);
    ck_assert_int_eq(cuda_logprobs_backward(gpu, gdlogits, gdlp, glogits, gt, T, V, &err), 0);
    expect_close(&cc, gdlogits, DSARL_DTYPE_F32, dlogits, T * V, F32_TOL, "logprobs_backward");
    targets[2] = (int32_t)V;
    int32_t *gbad = to_gpu_i32(gpu, targets, T);
    ck_assert_int_eq(cuda_logprobs_forward(gpu, glp, glogits, gbad, T, V, &err), DSARL_E_INVALID);
    cuda_free(gpu, glogits), cuda_free(gpu, gdlp), cuda_free(gpu, glp), cuda_free(gpu, gdlogits), cuda_free(gpu, gt);
    cuda_free(gpu, gbad);
    free(logits), free(dlp), free(lp), free(dlogits);
}
END_TEST

START_TEST(test_scale_sum_squares)
{
    int64_t n = 10007;
    // AdamW itself is covered by test_adamw_update; here the reductions over a bf16-rounded parameter vector
    float *p = rand_bf16(&stream, n, 1);
    void *gp = to_storage(p, n);
    float ss = 0.0f, *gss = to_gpu_f32(gpu, &ss, 1);
    ck_assert_int_eq(cpu_sum_squares(cpu, &ss, p, n, &err), 0);
    ck_assert_int_eq(cuda_sum_squares(gpu, gss, gp, n, &err), 0);
    expect_close(&cc, gss, DSARL_DTYPE_F32, &ss, 1, F32_TOL, "sum_squares");
    ck_assert_int_eq(cpu_scale(cpu, p, 0.3f, n, &err), 0);
    ck_assert_int_eq(cuda_scale(gpu, gp, 0.3f, n, &err), 0);
    expect_close(&cc, gp, storage, p, n, storage_tol, "scale");
    cuda_free(gpu, gp), cuda_free(gpu, gss);
    free(p);
}
END_TEST

START_TEST(test_adamw_update)
{
    int64_t n = 5003;
    float *master = rand_bf16(&stream, n, 1), *m = rand_bf16(&stream, n, 0.1f), *v = rand_bf16(&stream, n, 0.1f),
          *w = malloc(n * 4);
    for (int64_t i = 0; i < n; i++)
        v[i] = fabsf(v[i]);
    float *gmaster = to_gpu_f32(gpu, master, n), *gm = to_gpu_f32(gpu, m, n), *gv = to_gpu_f32(gpu, v, n);
    void *gw = to_storage(master, n);
    for (int step = 1; step <= 3; step++) {
        float *g = rand_bf16(&stream, n, 2);
        void *gg = to_storage(g, n);
        ck_assert_int_eq(cpu_adamw_update(cpu, master, w, g, m, v, n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, step,
                                          &err), 0);
        ck_assert_int_eq(cuda_adamw_update(gpu, gmaster, gw, gg, gm, gv, n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f,
                                           step, &err), 0);
        expect_close(&cc, gmaster, DSARL_DTYPE_F32, master, n, F32_TOL, "adamw_update master");
        expect_close(&cc, gm, DSARL_DTYPE_F32, m, n, F32_TOL, "adamw_update m");
        expect_close(&cc, gv, DSARL_DTYPE_F32, v, n, F32_TOL, "adamw_update v");
        expect_close(&cc, gw, storage, w, n, storage_tol, "adamw_update weight write-back");
        cuda_free(gpu, gg), free(g);
    }
    // ranges that start off the vector kernel's alignment: one element in (a scalar head, then the vector path),
    // and a gradient whose address never lines up with the master's (scalar throughout)
    for (int shift = 0; shift <= 1; shift++) {
        int64_t o = 1, len = n - o;
        float *g = rand_bf16(&stream, n + 1, 2);
        void *gg = to_storage(g, n + 1);
        const char *gd = (const char *)gg + (size_t)(o + shift) * (storage == DSARL_DTYPE_F32 ? 4 : 2);
        ck_assert_int_eq(cpu_adamw_update(cpu, master + o, w + o, g + o + shift, m + o, v + o, len, 3e-3f, 0.9f,
                                          0.95f, 1e-8f, 0.1f, 0.5f, 4 + shift, &err), 0);
        char *gwo = (char *)gw + (size_t)o * (storage == DSARL_DTYPE_F32 ? 4 : 2);
        ck_assert_int_eq(cuda_adamw_update(gpu, gmaster + o, gwo, gd, gm + o, gv + o, len, 3e-3f, 0.9f, 0.95f, 1e-8f,
                                           0.1f, 0.5f, 4 + shift, &err), 0);
        expect_close(&cc, gmaster, DSARL_DTYPE_F32, master, n, F32_TOL, "adamw_update master (unaligned range)");
        expect_close(&cc, gm, DSARL_DTYPE_F32, m, n, F32_TOL, "adamw_update m (unaligned range)");
        expect_close(&cc, gv, DSARL_DTYPE_F32, v, n, F32_TOL, "adamw_update v (unaligned range)");
        expect_close(&cc, gw, storage, w, n, storage_tol, "adamw_update weight write-back (unaligned range)");
        cuda_free(gpu, gg), free(g);
    }
    cuda_free(gpu, gmaster), cuda_free(gpu, gm), cuda_free(gpu, gv), cuda_free(gpu, gw);
    free(master), free(m), free(v), free(w);
}
END_TEST

START_TEST(test_sample_tokens)
{
    int64_t T = 64, V = 3001;
    float *logits = rand_bf16(&stream, T * V, 3);
    int32_t *want = malloc(T * 4);
    float *glogits = to_gpu_f32(gpu, logits, T * V);
    int32_t *gtok = to_gpu_i32(gpu, want, T);
    for (int temp = 0; temp < 2; temp++) {
        float temperature = temp ? 0.8f : 0.0f;
        ck_assert_int_eq(cpu_sample_tokens(cpu, want, logits, T, V, temperature, 1234, 77, &err), 0);
        ck_assert_int_eq(cuda_sample_tokens(gpu, gtok, glogits, T, V, temperature, 1234, 77, &err), 0);
        int32_t *got = from_gpu_i32(gpu, gtok, T);
        int same = 0;
        for (int64_t t = 0; t < T; t++)
            same += got[t] == want[t];
        // the same Philox draw inverts the same CDF; only a draw within rounding of a bucket edge may differ
        printf("check_device_cuda: sample_tokens T=%.1f          %d of %lld draws identical to the cpu\n",
               temperature, same, (long long)T);
        ck_assert_int_ge(same, temp ? T - 1 : T);
        free(got);
    }
    cuda_free(gpu, glogits), cuda_free(gpu, gtok);
    free(logits), free(want);
}
END_TEST

START_TEST(test_ops_table_complete)
{
    const dsarl_device_ops *ops = &dsarl_cuda_device_ops;
    ck_assert_int_eq(ops->common.struct_size, sizeof(dsarl_device_ops));
    ck_assert_str_eq(ops->common.name, "cuda");
    const char *first = (const char *)&ops->create, *end = (const char *)&ops->profile_scope;
    for (const char *p = first; p < end; p += sizeof(void (*)(void))) {
        void (*slot)(void);
        memcpy(&slot, p, sizeof slot);
        ck_assert_msg(slot != NULL, "device cuda: slot at byte %td is NULL", p - (const char *)ops);
    }
    ck_assert_int_eq(ops->storage_dtype(gpu), storage);
    ck_assert_int_eq(ops->common.n_keys, 3); // cuda_storage_dtype, cuda_grouped_gemm, cuda_profile
    void *buf = NULL;
    ck_assert_int_eq(ops->alloc(gpu, 1000, &buf, &err), 0);
    ck_assert_int_eq((uintptr_t)buf % 256, 0);
    ops->free(gpu, buf);
}
END_TEST


/* --- op-class profile (profile_scope) ---------------------------------------------------------------------- */

// Without runtime.cuda_profile the slot is a no-op: no class is recorded.
START_TEST(test_profile_scope_off)
{
    const dsarl_device_ops *ops = &dsarl_cuda_device_ops;
    ck_assert_ptr_nonnull(DSARL_DEVICE_SLOT(ops, profile_scope));
    dsarl_device_profile_scope(ops, gpu, "test.off");
    dsarl_device_profile_scope(ops, gpu, NULL);
    cuda_profile_class classes[4];
    double total = -1.0;
    ck_assert_int_eq(cuda_profile_classes(gpu, classes, 4, &total), 0);
    ck_assert(total == 0.0);
}
END_TEST

static const cuda_profile_class *find_class(const cuda_profile_class *c, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(c[i].name, name))
            return &c[i];
    ck_abort_msg("check_device_cuda: profile: no class %s", name);
    return NULL;
}

/* Known work in known classes: tiny adds toggling between two classes until the scope-event pool is one short of
 * full, then large GEMMs in "test.large" (its scope change is the pool's last, so its span is closed only after
 * the forced read-back: a span lost across a drain loses the GEMMs), one tiny add in "test.small", then NULL.
 * The GEMM class must dominate and hold its GEMMs' bracketed time, the call counts must be the changes made, and
 * the spans must add up to the GPU time from the first scope change to the last. */
START_TEST(test_profile_scope_classes)
{
    const dsarl_device_ops *ops = &dsarl_cuda_device_ops;
    int64_t n = 4096, small = 256;
    int gemms = 32;
    float *a = rand_bf16(&stream, n * n, 1), *b = rand_bf16(&stream, n * n, 1), *x = rand_bf16(&stream, small, 1);
    void *da = to_storage(a, n * n), *db = to_storage(b, n * n), *dc = to_storage(NULL, n * n);
    void *dx = to_storage(x, small), *dy = to_storage(NULL, small);
    // the GEMM's first call plans it (host time): outside any scope, which leaves it out of the classes
    ck_assert_msg(ops->gemm(gpu, false, true, n, n, n, 1.0f, da, db, 0.0f, dc, &err) == 0, "%s", err.message);
    ck_assert_int_eq(cuda_synchronize(gpu, &err), 0);
    int toggles = CUDA_PROFILE_SCOPE_EVENTS - 1;
    for (int i = 0; i < toggles; i++) {
        dsarl_device_profile_scope(ops, gpu, i % 2 ? "test.toggle_b" : "test.toggle_a");
        dsarl_device_profile_scope(ops, gpu, i % 2 ? "test.toggle_b" : "test.toggle_a"); // the same: no change
        ck_assert_int_eq(ops->add(gpu, dy, dx, dx, small, &err), 0);
    }
    dsarl_device_profile_scope(ops, gpu, "test.large");
    for (int i = 0; i < gemms; i++)
        ck_assert_msg(ops->gemm(gpu, false, true, n, n, n, 1.0f, da, db, 0.0f, dc, &err) == 0, "%s", err.message);
    dsarl_device_profile_scope(ops, gpu, "test.small"); // the pool is full: read back first
    ck_assert_int_eq(ops->add(gpu, dy, dx, dx, small, &err), 0);
    dsarl_device_profile_scope(ops, gpu, NULL);
    ck_assert_int_eq(cuda_synchronize(gpu, &err), 0);

    cuda_profile_class c[8];
    double total = 0.0;
    int nc = cuda_profile_classes(gpu, c, 8, &total);
    ck_assert_int_eq(nc, 5); // (unscoped), toggle_a, toggle_b, large, small
    const cuda_profile_class *unscoped = find_class(c, nc, "(unscoped)"), *ta = find_class(c, nc, "test.toggle_a"),
                             *tb = find_class(c, nc, "test.toggle_b"), *large = find_class(c, nc, "test.large"),
                             *sm = find_class(c, nc, "test.small");
    ck_assert_int_eq(ta->calls, (toggles + 1) / 2);
    ck_assert_int_eq(tb->calls, toggles / 2);
    ck_assert_int_eq(large->calls, 1);
    ck_assert_int_eq(sm->calls, 1);
    ck_assert_int_eq(unscoped->calls, 1);
    // the span after the last change is still open, and the warm-up GEMM came before the first change
    ck_assert(unscoped->span_ms == 0.0 && unscoped->ops_ms == 0.0);
    double spans = 0.0;
    for (int i = 0; i < nc; i++) {
        printf("check_device_cuda: profile: %-16s calls %5lld span %9.3f ms ops %9.3f ms\n", c[i].name,
               (long long)c[i].calls, c[i].span_ms, c[i].ops_ms);
        // a class's device ops ran inside its spans (event timestamps: allow their resolution)
        ck_assert_msg(c[i].ops_ms <= c[i].span_ms * 1.001 + 0.01, "%s: ops %.3f ms > span %.3f ms", c[i].name,
                      c[i].ops_ms, c[i].span_ms);
        spans += c[i].span_ms;
    }
    printf("check_device_cuda: profile: spans %.3f ms, first to last change %.3f ms\n", spans, total);
    ck_assert(ta->ops_ms > 0.0 && tb->ops_ms > 0.0 && sm->ops_ms > 0.0);
    ck_assert_msg(fabs(spans - total) <= 0.01 * total + 0.05, "spans %.3f ms, first to last %.3f ms", spans, total);
    // 32 GEMMs of 2 n^3 = 137 GFLOP each: milliseconds, against one tiny add
    ck_assert_msg(large->span_ms > 20.0 * sm->span_ms, "large %.3f ms, small %.3f ms", large->span_ms, sm->span_ms);
    ck_assert_msg(large->ops_ms > 0.5 * large->span_ms, "large: ops %.3f ms of a %.3f ms span", large->ops_ms,
                  large->span_ms);
    ck_assert_msg(large->span_ms > 0.05 * total, "large %.3f ms of %.3f ms", large->span_ms, total);
    cuda_free(gpu, da), cuda_free(gpu, db), cuda_free(gpu, dc), cuda_free(gpu, dx), cuda_free(gpu, dy);
    free(a), free(b), free(x);
}
END_TEST

// memory_info (ABI 1.7): the driver's figures, total fixed, and a fresh 1 GiB buffer taken out of the free memory
// (other suites sharing the GPU move it too: half of it is the bound).
START_TEST(test_memory_info)
{
    int (*info)(dsarl_device *, size_t *, size_t *, dsarl_error *) =
        DSARL_DEVICE_SLOT(&dsarl_cuda_device_ops, memory_info);
    ck_assert_ptr_nonnull(info);
    size_t free0 = 0, total0 = 0, free1 = 0, total1 = 0;
    ck_assert_msg(info(gpu, &free0, &total0, &err) == 0, "%s", err.message);
    ck_assert(total0 > ((size_t)1 << 30) && free0 > 0 && free0 <= total0);
    const size_t gib = (size_t)1 << 30;
    void *buf = NULL;
    ck_assert_msg(cuda_alloc(gpu, gib + 12345, &buf, &err) == 0, "%s", err.message); // no cached block this size
    ck_assert_msg(info(gpu, &free1, &total1, &err) == 0, "%s", err.message);
    ck_assert_uint_eq(total1, total0);
    ck_assert_msg(free1 + gib / 2 <= free0, "free %zu -> %zu bytes across a 1 GiB allocation", free0, free1);
    printf("check_device_cuda: memory_info %.2f of %.2f GiB free, %.2f after a 1 GiB buffer\n",
           (double)free0 / (double)gib, (double)total0 / (double)gib, (double)free1 / (double)gib);
    cuda_free(gpu, buf);
}
END_TEST

static void add_tests(TCase *tc)
{
    tcase_add_test(tc, test_ops_table_complete);
    tcase_add_test(tc, test_memory_info);
    tcase_add_test(tc, test_gemm_all_transposes);
    tcase_add_test(tc, test_gemm_strided_batched);
    tcase_add_test(tc, test_gemm_grouped);
    tcase_add_test(tc, test_gemm_grouped_wgmma);
    tcase_add_test(tc, test_gemm_grouped_bench);
    tcase_add_test(tc, test_rmsnorm);
    tcase_add_test(tc, test_layernorm);
    tcase_add_test(tc, test_rope);
    tcase_add_test(tc, test_swiglu_add_axpy_copy2d);
    tcase_add_test(tc, test_embedding);
    tcase_add_test(tc, test_rows);
    tcase_add_test(tc, test_moe_route);
    tcase_add_test(tc, test_moe_group_padded);
    tcase_add_test(tc, test_logprobs);
    tcase_add_test(tc, test_scale_sum_squares);
    tcase_add_test(tc, test_adamw_update);
    tcase_add_test(tc, test_sample_tokens);
    tcase_add_test(tc, test_profile_scope_off);
}

// Every op twice: bf16 storage (the default) and float32 storage (runtime.cuda_storage_dtype=f32); the op-class
// profile once (bf16).
static Suite *device_cuda_suite(void)
{
    Suite *s = suite_create("device_cuda");
    TCase *bf16 = tcase_create("ops_vs_cpu_bf16"), *f32 = tcase_create("ops_vs_cpu_f32");
    TCase *prof = tcase_create("profile_scope");
    tcase_add_checked_fixture(bf16, setup, teardown);
    tcase_add_checked_fixture(f32, setup_f32, teardown);
    tcase_add_checked_fixture(prof, setup_profile, teardown);
    add_tests(bf16);
    add_tests(f32);
    tcase_add_test(prof, test_profile_scope_classes);
    tcase_add_test(prof, test_bad_keys_refused);
    suite_add_tcase(s, bf16);
    suite_add_tcase(s, f32);
    suite_add_tcase(s, prof);
    return s;
}

int main(void)
{
    if (cuda_visible_devices() == 0) {
        printf("check_device_cuda: skipped: no CUDA device is visible\n");
        return 77;
    }
    stream = cuda_test_seed("check_device_cuda", 0x2545F4914F6CDD1Dull);
    SRunner *sr = srunner_create(device_cuda_suite());
    srunner_set_fork_status(sr, CK_NOFORK); /* CUDA does not survive fork */
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
