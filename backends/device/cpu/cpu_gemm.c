/* cpu_gemm.c: row-major GEMMs through OpenBLAS cblas_sgemm. */
#include <cblas.h>
#include "cpu_device.h"

int cpu_gemm(dsarl_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
             const void *a, const void *b, float beta, void *c, dsarl_error *err)
{
    if (m < 0 || n < 0 || k < 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cpu: gemm needs m, n, k >= 0, got %lld, %lld, %lld",
                          (long long)m, (long long)n, (long long)k);
    if (m == 0 || n == 0)
        return DSARL_OK;
    if (k == 0) { /* BLAS leaves C untouched for k = 0 only when beta = 1; make beta*C explicit */
        float *cf = c;
        for (int64_t i = 0; i < m * n; i++)
            cf[i] = beta == 0.0f ? 0.0f : beta * cf[i];
        return DSARL_OK;
    }
    // leading dimensions of the stored (row-major) matrices
    int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)m,
                (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)n);
    return DSARL_OK;
}

int cpu_gemm_strided_batched(dsarl_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                             float alpha, const void *a, int64_t stride_a, const void *b, int64_t stride_b,
                             float beta, void *c, int64_t stride_c, int64_t batch, dsarl_error *err)
{
    for (int64_t i = 0; i < batch; i++)
        DSARL_TRY(cpu_gemm(dev, trans_a, trans_b, m, n, k, alpha, (const float *)a + i * stride_a,
                           (const float *)b + i * stride_b, beta, (float *)c + i * stride_c, err));
    return DSARL_OK;
}

int cpu_gemm_f32out(dsarl_device *dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const void *a, const void *b, float beta, float *c, dsarl_error *err)
{
    return cpu_gemm(dev, trans_a, trans_b, m, n, k, alpha, a, b, beta, c, err); // storage is float32 already
}

int cpu_convert(dsarl_device *dev, void *dst, dsarl_dtype dst_dtype, const void *src, dsarl_dtype src_dtype,
                int64_t n, float alpha, dsarl_error *err)
{
    (void)dev;
    if (dst_dtype != DSARL_DTYPE_F32 || src_dtype != DSARL_DTYPE_F32)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cpu: convert handles float32 only (the storage dtype), got "
                          "dtypes %d -> %d", (int)src_dtype, (int)dst_dtype);
    const float *s = src;
    float *d = dst;
    for (int64_t i = 0; i < n; i++)
        d[i] = alpha * s[i];
    return DSARL_OK;
}
