/* cuda_gemm.cu: row-major GEMMs (plain and strided-batched) through cuBLASLt: storage-type operands and result
 * (bf16, or float32 with runtime.cuda_storage_dtype=f32), fp32 accumulation and scalars; gemm_f32out keeps the
 * storage operands but writes a float32 result (logits). cuBLAS is column-major,
 * so the row-major product C = op(A) op(B) is computed as the
 * column-major C^T = op(B)^T op(A)^T, which reads the same bytes without any transpose copy. */
#include <stdlib.h>
#include <string.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include "cuda_common.cuh"

// Largest power of two (<= 256) dividing the address: cuBLASLt must be told operands that are not 256-aligned
// (slices of fused projections, per-expert offsets), or it may pick a kernel that needs the alignment.
static uint32_t alignment_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t align = 256;
    while (align > 2 && (a % align))
        align >>= 1;
    return align;
}

// The stream and cuBLASLt workspace of the lane lt_matmul queues on (dev->lane: 0 the compute stream).
static cudaStream_t gemm_stream(const dsarl_device *dev)
{
    return dev->lane ? (cudaStream_t)dev->lanes[dev->lane - 1] : CUDA_STREAM(dev);
}
static void *gemm_workspace(const dsarl_device *dev)
{
    return dev->lane ? dev->lane_ws[dev->lane - 1] : dev->gemm_workspace;
}

// The column-major product D (rows, cols) = op(X) op(Y) that equals the row-major C = op(A) op(B).
typedef struct lt_problem {
    cublasOperation_t op_x, op_y;
    uint64_t rows, cols, inner;
    uint64_t ldx, ldy, ldd;
} lt_problem;

// cuBLASLt's heuristic query costs 0.1 to 0.3 ms of host time per call (measured on the H200 through the profile of
// cuda_profile.cu: 5354 GEMMs of one 3B-model training step spent 1.6 s in it), far more than most of the model's
// GEMMs (per head, per expert) take on the GPU. Its answer is kept in a direct-mapped table keyed by the problem's
// "class": transposes, types, pointer alignments, each dimension rounded up to a power of two and each leading
// dimension's alignment. The per-expert row counts change every step but stay in their class, so a step reuses the
// algorithms of the last: a new exact shape only builds its descriptors and asks cublasLtMatmulAlgoCheck whether
// the kept algorithm supports it (else the heuristic runs again). The exact shape's descriptors are kept too, so a
// repeated GEMM is one cublasLtMatmul call. The table is freed with the device (cuda_gemm_cache_free).
#define GEMM_ALGO_SLOTS 4096

typedef struct algo_key {
    int32_t op_x, op_y, type, out_type;
    uint64_t rows, cols, inner, ldx, ldy, ldd;
    int64_t batch, stride_x, stride_y, stride_d;
    uint32_t ax, ay, ad, used;
} algo_key;

typedef struct algo_slot {
    algo_key cls, exact;               // the class the algorithm was chosen for; the shape the descriptors describe
    cublasLtMatmulAlgo_t algo;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t lx, ly, ld;
} algo_slot;

static uint64_t algo_hash(const algo_key *k)
{
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull; // FNV-1a over the key's bytes (the key is zero-initialised, padding too)
    for (size_t i = 0; i < sizeof(*k); i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static uint64_t pow2_at_least(uint64_t x)
{
    uint64_t p = 1;
    while (p < x)
        p <<= 1;
    return p;
}

// Largest power of two (<= 16) dividing x: what a leading dimension allows of vector loads.
static uint64_t ld_class(uint64_t x)
{
    uint64_t a = 16;
    while (a > 1 && x % a)
        a >>= 1;
    return a;
}

static algo_key class_of(const algo_key *exact)
{
    algo_key c = *exact;
    c.rows = pow2_at_least(exact->rows), c.cols = pow2_at_least(exact->cols), c.inner = pow2_at_least(exact->inner);
    c.ldx = ld_class(exact->ldx), c.ldy = ld_class(exact->ldy), c.ldd = ld_class(exact->ldd);
    c.stride_x = exact->stride_x ? (int64_t)ld_class((uint64_t)exact->stride_x) : 0;
    c.stride_y = exact->stride_y ? (int64_t)ld_class((uint64_t)exact->stride_y) : 0;
    c.stride_d = exact->stride_d ? (int64_t)ld_class((uint64_t)exact->stride_d) : 0;
    return c;
}

static void destroy_plan(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t lx, cublasLtMatrixLayout_t ly,
                         cublasLtMatrixLayout_t ld)
{
    if (ld)
        cublasLtMatrixLayoutDestroy(ld);
    if (ly)
        cublasLtMatrixLayoutDestroy(ly);
    if (lx)
        cublasLtMatrixLayoutDestroy(lx);
    if (desc)
        cublasLtMatmulDescDestroy(desc);
}

void cuda_gemm_cache_free(dsarl_device *dev)
{
    algo_slot *slots = (algo_slot *)dev->gemm_algos;
    for (int i = 0; slots && i < GEMM_ALGO_SLOTS; i++)
        if (slots[i].cls.used)
            destroy_plan(slots[i].desc, slots[i].lx, slots[i].ly, slots[i].ld);
    free(slots);
    dev->gemm_algos = NULL;
    for (int i = 0; i < CUDA_GEMM_LANES; i++) {
        if (dev->lanes[i])
            cudaStreamDestroy((cudaStream_t)dev->lanes[i]);
        if (dev->lane_done[i])
            cudaEventDestroy((cudaEvent_t)dev->lane_done[i]);
        cudaFree(dev->lane_ws[i]);
        dev->lanes[i] = dev->lane_done[i] = dev->lane_ws[i] = NULL;
    }
    if (dev->lane_fork)
        cudaEventDestroy((cudaEvent_t)dev->lane_fork);
    dev->lane_fork = NULL;
}

static int lt_matmul(dsarl_device *dev, const lt_problem *pr, float alpha, const void *x, int64_t stride_x,
                     const void *y, int64_t stride_y, float beta, void *d, int64_t stride_d, int64_t batch,
                     bool f32_out, dsarl_error *err)
{
    cublasLtHandle_t lt = (cublasLtHandle_t)dev->lt;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t lx = NULL, ly = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0, rc = DSARL_OK;
    // bf16 storage: bf16 operands, fp32 accumulation. float32 storage: plain fp32 (no TF32), as the CPU computes.
    const cudaDataType_t type = dev->f32 ? CUDA_R_32F : CUDA_R_16BF;
    const cudaDataType_t out_type = f32_out ? CUDA_R_32F : type; // gemm_f32out: bf16 in, float32 C and D
    int32_t batch32 = (int32_t)batch;
    uint32_t ax = alignment_of(x), ay = alignment_of(y), ad = alignment_of(d);
    size_t ws = dev->gemm_workspace_bytes;
    algo_key key;
    memset(&key, 0, sizeof key);
    key.op_x = (int32_t)pr->op_x, key.op_y = (int32_t)pr->op_y, key.type = (int32_t)type;
    key.out_type = (int32_t)out_type, key.rows = pr->rows, key.cols = pr->cols, key.inner = pr->inner;
    key.ldx = pr->ldx, key.ldy = pr->ldy, key.ldd = pr->ldd, key.batch = batch;
    key.stride_x = batch > 1 ? stride_x : 0, key.stride_y = batch > 1 ? stride_y : 0;
    key.stride_d = batch > 1 ? stride_d : 0, key.ax = ax, key.ay = ay, key.ad = ad, key.used = 1;
    algo_key cls = class_of(&key);
    if (!dev->gemm_algos)
        dev->gemm_algos = calloc(GEMM_ALGO_SLOTS, sizeof(algo_slot)); // NULL: no cache, plan every call
    algo_slot *slot = dev->gemm_algos ? (algo_slot *)dev->gemm_algos + algo_hash(&cls) % GEMM_ALGO_SLOTS : NULL;
    bool class_hit = slot && memcmp(&slot->cls, &cls, sizeof cls) == 0;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (class_hit && memcmp(&slot->exact, &key, sizeof key) == 0) { // this very shape before: one call
        st = cublasLtMatmul(lt, slot->desc, &alpha, x, slot->lx, y, slot->ly, &beta, d, slot->ld, d, slot->ld,
                            &slot->algo, gemm_workspace(dev), dev->gemm_workspace_bytes, gemm_stream(dev));
        if (st == CUBLAS_STATUS_SUCCESS)
            return DSARL_OK;
        class_hit = false;
    }
    st = cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &pr->op_x, sizeof(pr->op_x));
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &pr->op_y, sizeof(pr->op_y));
    // stored shapes: X is (rows, inner) unless transposed, Y (inner, cols) unless transposed
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutCreate(&lx, type, pr->op_x == CUBLAS_OP_N ? pr->rows : pr->inner,
                                        pr->op_x == CUBLAS_OP_N ? pr->inner : pr->rows, pr->ldx);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutCreate(&ly, type, pr->op_y == CUBLAS_OP_N ? pr->inner : pr->cols,
                                        pr->op_y == CUBLAS_OP_N ? pr->cols : pr->inner, pr->ldy);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutCreate(&ld, out_type, pr->rows, pr->cols, pr->ldd);
    if (batch > 1) {
        cublasLtMatrixLayout_t layouts[3] = {lx, ly, ld};
        int64_t strides[3] = {stride_x, stride_y, stride_d};
        for (int i = 0; i < 3 && st == CUBLAS_STATUS_SUCCESS; i++) {
            st = cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch32,
                                                  sizeof(batch32));
            if (st == CUBLAS_STATUS_SUCCESS)
                st = cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                      &strides[i], sizeof(strides[i]));
        }
    }
    if (st == CUBLAS_STATUS_SUCCESS && class_hit) { // the class's algorithm, if it supports this exact shape
        cublasLtMatmulHeuristicResult_t check;
        if (cublasLtMatmulAlgoCheck(lt, desc, lx, ly, ld, ld, &slot->algo, &check) == CUBLAS_STATUS_SUCCESS &&
            check.workspaceSize <= dev->gemm_workspace_bytes) {
            heur.algo = slot->algo;
            found = 1;
        }
    }
    if (st == CUBLAS_STATUS_SUCCESS && !found)
        st = cublasLtMatmulPreferenceCreate(&pref);
    if (st == CUBLAS_STATUS_SUCCESS && !found)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    if (st == CUBLAS_STATUS_SUCCESS && !found)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &ax, sizeof(ax));
    if (st == CUBLAS_STATUS_SUCCESS && !found)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ay, sizeof(ay));
    if (st == CUBLAS_STATUS_SUCCESS && !found)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof(ad));
    if (st == CUBLAS_STATUS_SUCCESS && !found)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof(ad));
    if (st == CUBLAS_STATUS_SUCCESS && !found)
        st = cublasLtMatmulAlgoGetHeuristic(lt, desc, lx, ly, ld, ld, pref, 1, &heur, &found);
    if (st == CUBLAS_STATUS_SUCCESS && found > 0)
        st = cublasLtMatmul(lt, desc, &alpha, x, lx, y, ly, &beta, d, ld, d, ld, &heur.algo, gemm_workspace(dev),
                            dev->gemm_workspace_bytes, gemm_stream(dev));
    if (st == CUBLAS_STATUS_SUCCESS && found > 0 && slot) { // the slot keeps this plan (and frees the one it had)
        if (slot->cls.used)
            destroy_plan(slot->desc, slot->lx, slot->ly, slot->ld);
        slot->cls = cls, slot->exact = key, slot->algo = heur.algo;
        slot->desc = desc, slot->lx = lx, slot->ly = ly, slot->ld = ld;
        desc = NULL, lx = ly = ld = NULL;
    }
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
        // No cuBLASLt algorithm for this shape/alignment (or it failed): the classic cuBLAS entry point accepts
        // every legal shape. (Its handle runs on the lane too, then goes back to the compute stream.)
        if (dev->lane)
            cublasSetStream((cublasHandle_t)dev->blas, gemm_stream(dev));
        st = cublasGemmStridedBatchedEx((cublasHandle_t)dev->blas, pr->op_x, pr->op_y, (int)pr->rows, (int)pr->cols,
                                        (int)pr->inner, &alpha, x, type, (int)pr->ldx, stride_x, y,
                                        type, (int)pr->ldy, stride_y, &beta, d, out_type, (int)pr->ldd,
                                        stride_d, (int)batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (dev->lane)
            cublasSetStream((cublasHandle_t)dev->blas, CUDA_STREAM(dev));
        if (st != CUBLAS_STATUS_SUCCESS)
            rc = DSARL_FAIL(err, DSARL_E_DEVICE, "device cuda: %s gemm (%llu x %llu x %llu, batch %lld) failed "
                            "in cuBLASLt and cuBLAS: %s", dev->f32 ? "f32" : "bf16", (unsigned long long)pr->rows,
                            (unsigned long long)pr->cols,
                            (unsigned long long)pr->inner, (long long)batch, cublasGetStatusString(st));
    }
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    destroy_plan(desc, lx, ly, ld);
    return rc;
}

template <typename Storage>
static __global__ void scale_kernel(Storage *c, float beta, int64_t n)
{
    GRID_STRIDE(i, n) { stf(c + i, beta == 0.0f ? 0.0f : beta * ldf(c + i)); }
}

// The row-major product shared by gemm_strided_batched and gemm_f32out (C in storage or float32).
static int row_major_gemm(dsarl_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                          float alpha, const void *a, int64_t stride_a, const void *b, int64_t stride_b, float beta,
                          void *c, int64_t stride_c, int64_t batch, bool f32_out, dsarl_error *err)
{
    if (m < 0 || n < 0 || k < 0 || batch < 0 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cuda: gemm needs 0 <= m, n, k < 2^31 and batch >= 0, got "
                          "m %lld, n %lld, k %lld, batch %lld", (long long)m, (long long)n, (long long)k,
                          (long long)batch);
    if (m == 0 || n == 0 || batch == 0)
        return DSARL_OK;
    if (k == 0) { /* C = beta * C, made explicit: some BLAS paths leave C alone for k = 0 */
        for (int64_t i = 0; i < batch; i++) {
            if (f32_out)
                scale_kernel<float><<<grid_for(m * n, 256), 256, 0, gemm_stream(dev)>>>((float *)c + i * stride_c,
                                                                                        beta, m * n);
            else if (dev->f32)
                scale_kernel<float><<<grid_for(m * n, 256), 256, 0, gemm_stream(dev)>>>((float *)c + i * stride_c,
                                                                                        beta, m * n);
            else
                scale_kernel<bf16><<<grid_for(m * n, 256), 256, 0, gemm_stream(dev)>>>((bf16 *)c + i * stride_c,
                                                                                       beta, m * n);
            cudaCheckLaunch("gemm beta scale", err);
        }
        return DSARL_OK;
    }
    // Row-major C (m,n) = op(A) op(B)  <=>  column-major C^T (n,m) = op(B)^T op(A)^T, where a row-major matrix
    // read column-major is its transpose: X = B with op trans_b, Y = A with op trans_a.
    lt_problem pr;
    pr.op_x = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    pr.op_y = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    pr.rows = (uint64_t)n;
    pr.cols = (uint64_t)m;
    pr.inner = (uint64_t)k;
    pr.ldx = (uint64_t)(trans_b ? k : n);
    pr.ldy = (uint64_t)(trans_a ? m : k);
    pr.ldd = (uint64_t)n;
    return lt_matmul(dev, &pr, alpha, b, stride_b, a, stride_a, beta, c, stride_c, batch, f32_out, err);
}

int cuda_gemm_strided_batched(dsarl_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                              float alpha, const void *a, int64_t stride_a, const void *b, int64_t stride_b,
                              float beta, void *c, int64_t stride_c, int64_t batch, dsarl_error *err)
{
    return row_major_gemm(dev, trans_a, trans_b, m, n, k, alpha, a, stride_a, b, stride_b, beta, c, stride_c, batch,
                          false, err);
}

int cuda_gemm(dsarl_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const void *a, const void *b, float beta, void *c, dsarl_error *err)
{
    return row_major_gemm(dev, trans_a, trans_b, m, n, k, alpha, a, 0, b, 0, beta, c, 0, 1, false, err);
}

int cuda_gemm_f32out(dsarl_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                     const void *a, const void *b, float beta, float *c, dsarl_error *err)
{
    return row_major_gemm(dev, trans_a, trans_b, m, n, k, alpha, a, 0, b, 0, beta, c, 0, 1, true, err);
}

// The lanes, made at the first grouped call; on failure the call runs its groups on the compute stream.
static bool lanes_ready(dsarl_device *dev)
{
    if (dev->lane_fork)
        return true;
    for (int i = 0; i < CUDA_GEMM_LANES; i++) {
        cudaStream_t s = NULL;
        cudaEvent_t e = NULL;
        if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
            cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess ||
            cudaMalloc(&dev->lane_ws[i], dev->gemm_workspace_bytes) != cudaSuccess) {
            if (s)
                cudaStreamDestroy(s);
            if (e)
                cudaEventDestroy(e);
            cudaGetLastError(); // the failure is handled: the compute stream runs the groups
            return false;
        }
        dev->lanes[i] = s, dev->lane_done[i] = e;
    }
    cudaEvent_t fork;
    if (cudaEventCreateWithFlags(&fork, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    dev->lane_fork = fork;
    return true;
}

// Whether group g has a product to run: rows, or (weight gradients) a C that beta rescales even without rows.
static bool group_has_work(bool inner_grouped, float beta, const int64_t *first, int64_t g)
{
    return first[g + 1] > first[g] || (inner_grouped && beta != 1.0f);
}

// One group's product on the current lane (the slot's semantics, dsarl/ops/device.h).
static int grouped_product(dsarl_device *dev, bool inner_grouped, bool trans_b, int64_t g, const int64_t *first,
                           int64_t m, int64_t n, int64_t k, float alpha, const char *a, const char *b,
                           int64_t stride_b, float beta, char *c, int64_t stride_c, size_t e, dsarl_error *err)
{
    int64_t r0 = first[g], rows = first[g + 1] - first[g];
    if (inner_grouped)
        return row_major_gemm(dev, true, false, m, n, rows, alpha, a + (size_t)(r0 * m) * e, 0,
                              b + (size_t)(r0 * n) * e, 0, beta, c + (size_t)(g * stride_c) * e, 0, 1, false, err);
    return row_major_gemm(dev, false, trans_b, rows, n, k, alpha, a + (size_t)(r0 * k) * e, 0,
                          b + (size_t)(g * stride_b) * e, 0, beta, c + (size_t)(r0 * n) * e, 0, 1, false, err);
}

/* The products cuda_gemm_grouped_wgmma takes (runtime.cuda_grouped_gemm) run as its one kernel; the others: the
 * groups with work, spread over the lanes: compute's queued work is recorded (fork), each lane waits for it,
 * takes its groups (largest first, each to the lane with the fewest rows so far: a pure function of the counts), and
 * compute waits for every lane before its next op. So the call is ordered like any other op of the compute stream
 * (the caching allocator's reuse included), and each group's result is the one gemm gives: cuBLASLt picks the
 * same algorithm for a shape whatever the stream. */
int cuda_gemm_grouped(dsarl_device *dev, bool inner_grouped, bool trans_b, int64_t groups, const int64_t *first,
                      int64_t m, int64_t n, int64_t k, float alpha, const void *a, const void *b, int64_t stride_b,
                      float beta, void *c, int64_t stride_c, dsarl_error *err)
{
    if (groups < 0 || (groups > 0 && (!first || first[0] != 0)))
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cuda: gemm_grouped needs groups >= 0 and first[0] = 0, got "
                          "%lld groups", (long long)groups);
    int64_t busy = 0;
    for (int64_t g = 0; g < groups; g++) {
        if (first[g + 1] < first[g])
            return DSARL_FAIL(err, DSARL_E_INVALID, "device cuda: gemm_grouped's first[] must not decrease (group "
                              "%lld: %lld after %lld)", (long long)g, (long long)first[g + 1], (long long)first[g]);
        busy += group_has_work(inner_grouped, beta, first, g);
    }
    int used = 0;
    DSARL_TRY(cuda_gemm_grouped_wgmma(dev, inner_grouped, trans_b, groups, first, m, n, k, alpha, a, b, stride_b,
                                      beta, c, stride_c, &used, err));
    if (used)
        return DSARL_OK;
    size_t e = STORAGE_BYTES(dev);
    const char *ca = (const char *)a, *cb = (const char *)b;
    char *cc = (char *)c;
    if (busy <= 1 || !lanes_ready(dev)) {
        for (int64_t g = 0; g < groups; g++)
            if (group_has_work(inner_grouped, beta, first, g))
                DSARL_TRY(grouped_product(dev, inner_grouped, trans_b, g, first, m, n, k, alpha, ca, cb, stride_b,
                                          beta, cc, stride_c, e, err));
        return DSARL_OK;
    }
    int64_t *order = (int64_t *)malloc((size_t)busy * sizeof(int64_t));
    if (!order)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "device cuda: out of host memory for %lld grouped products",
                          (long long)busy);
    int64_t n_order = 0;
    for (int64_t g = 0; g < groups; g++)
        if (group_has_work(inner_grouped, beta, first, g))
            order[n_order++] = g;
    for (int64_t i = 1; i < n_order; i++) { // insertion sort, largest group first, ties by index (stable)
        int64_t g = order[i], j = i;
        for (; j > 0 && first[order[j - 1] + 1] - first[order[j - 1]] < first[g + 1] - first[g]; j--)
            order[j] = order[j - 1];
        order[j] = g;
    }
    int rc = DSARL_OK;
    cudaStream_t compute = CUDA_STREAM(dev);
    if (cudaEventRecord((cudaEvent_t)dev->lane_fork, compute) != cudaSuccess)
        rc = DSARL_FAIL(err, DSARL_E_DEVICE, "device cuda: gemm_grouped could not record its fork event");
    for (int i = 0; i < CUDA_GEMM_LANES && rc == DSARL_OK; i++)
        if (cudaStreamWaitEvent((cudaStream_t)dev->lanes[i], (cudaEvent_t)dev->lane_fork, 0) != cudaSuccess)
            rc = DSARL_FAIL(err, DSARL_E_DEVICE, "device cuda: gemm_grouped could not order lane %d", i);
    int64_t load[CUDA_GEMM_LANES] = {0};
    for (int64_t i = 0; i < n_order && rc == DSARL_OK; i++) {
        int64_t g = order[i];
        int best = 0;
        for (int l = 1; l < CUDA_GEMM_LANES; l++)
            best = load[l] < load[best] ? l : best;
        load[best] += first[g + 1] - first[g] + 1;
        dev->lane = best + 1;
        rc = grouped_product(dev, inner_grouped, trans_b, g, first, m, n, k, alpha, ca, cb, stride_b, beta, cc,
                             stride_c, e, err);
    }
    dev->lane = 0;
    // join even after a failure: compute must not run ahead of what the lanes were given
    for (int i = 0; i < CUDA_GEMM_LANES; i++) {
        cudaError_t r1 = cudaEventRecord((cudaEvent_t)dev->lane_done[i], (cudaStream_t)dev->lanes[i]);
        cudaError_t r2 = cudaStreamWaitEvent(compute, (cudaEvent_t)dev->lane_done[i], 0);
        if ((r1 != cudaSuccess || r2 != cudaSuccess) && rc == DSARL_OK)
            rc = DSARL_FAIL(err, DSARL_E_DEVICE, "device cuda: gemm_grouped could not join lane %d: %s", i,
                            cudaGetErrorString(r1 != cudaSuccess ? r1 : r2));
    }
    free(order);
    return rc;
}
