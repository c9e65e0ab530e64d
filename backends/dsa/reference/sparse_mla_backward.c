/* Backward of the sparse MLA forward (glm5_dsa.md section 2.7; TileLang examples/deepseek_v32 sparse_mla_bwd).
 *
 * With the forward's lse and out as given (as every CUDA kernel takes them), for each query t, head h and valid
 * slot s of S(t):
 *   p(s)    = exp(softmax_scale * q[t,h,:] . kv[s,:] - lse[t,h])
 *   Delta   = out[t,h,:] . dout[t,h,:]                       (= sum_s p(s) dout . V(s))
 *   dP(s)   = p(s) * (dout[t,h,:] . kv[s,:d_v] - Delta)      (gradient wrt the scaled logit)
 *   dq[t,h] = softmax_scale * sum_s dP(s) kv[s,:]            (all d_qk columns; overwritten)
 *   dkv[s] += softmax_scale * dP(s) q[t,h,:]                 (key role, all d_qk columns)
 *   dkv[s,:d_v] += p(s) dout[t,h,:]                          (value role)
 * A row whose lse is +inf (no valid slot) has p = 0 and contributes nothing; its dq is 0. A key in two slots gets
 * both slots' contributions, matching the forward. dkv sums are kept in double and added to dkv once. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dsa_reference.h"

int dsa_reference_sparse_mla_backward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                      const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk,
                                      const void *out, const float *lse, const void *dout, void *dq, void *dkv,
                                      dsarl_error *err)
{
    DSARL_TRY(dsa_ref_check_batch("sparse_mla_backward", batch, err));
    DSARL_TRY(dsa_ref_check_attention("sparse_mla_backward", batch, in, err));
    DSARL_TRY(dsa_ref_check_indices("sparse_mla_backward", batch, indices, topk, err));
    if (batch->n_queries > 0 && (out == NULL || lse == NULL || dout == NULL || dq == NULL || dkv == NULL))
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "dsa reference sparse_mla_backward: out, lse, dout, dq and dkv must all be set");
    const int32_t n_heads = in->n_heads, d_qk = in->d_qk, d_v = in->d_v;
    const double scale = in->softmax_scale;
    const float *q = in->q;   // (Tq, H, d_qk)
    const float *kv = in->kv; // (Tk, d_qk)
    const float *o = out;     // (Tq, H, d_v)
    const float *d_o = dout;  // (Tq, H, d_v)
    float *d_q = dq;          // (Tq, H, d_qk)

    dsa_ref_key_accumulator dkv_acc; // (keys touched, d_qk)
    DSARL_TRY(dsa_ref_key_accumulator_init(&dkv_acc, batch, d_qk, err));
    const size_t per_query = (size_t)n_heads * (size_t)topk;
    double *prob = malloc(per_query * sizeof(double));                // (H, topk) p(s)
    double *dlogit = malloc(per_query * sizeof(double));              // (H, topk) dP(s)
    double *dq_acc = malloc((size_t)n_heads * d_qk * sizeof(double)); // (H, d_qk)
    if (prob == NULL || dlogit == NULL || dq_acc == NULL) {
        free(prob);
        free(dlogit);
        free(dq_acc);
        dsa_ref_key_accumulator_free(&dkv_acc);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsa reference sparse_mla_backward: cannot allocate row buffers");
    }
    for (int64_t t = 0; t < batch->n_queries; t++) {
        const int32_t *sel = indices + t * topk;
        const float *q_t = q + t * n_heads * d_qk;   // (H, d_qk)
        const float *do_t = d_o + t * n_heads * d_v; // (H, d_v)
        // Pass 1, head by head: p, dP and dq (the key row is in cache from its dot products).
        memset(dq_acc, 0, (size_t)n_heads * d_qk * sizeof(double));
        for (int32_t h = 0; h < n_heads; h++) {
            double *dq_h = dq_acc + (size_t)h * d_qk;
            const double row_lse = lse[t * n_heads + h];
            const double delta = dsa_ref_dot(o + (t * n_heads + h) * d_v, do_t + h * d_v, d_v);
            for (int32_t i = 0; i < topk; i++) {
                double p = 0.0, dp = 0.0;
                if (sel[i] >= 0 && row_lse != INFINITY) {
                    const float *kv_s = kv + (int64_t)sel[i] * d_qk;
                    p = exp(scale * dsa_ref_dot(q_t + h * d_qk, kv_s, d_qk) - row_lse);
                    dp = p * (dsa_ref_dot(do_t + h * d_v, kv_s, d_v) - delta);
                    for (int32_t c = 0; c < d_qk; c++)
                        dq_h[c] += dp * (double)kv_s[c];
                }
                prob[(size_t)h * topk + i] = p;
                dlogit[(size_t)h * topk + i] = dp;
            }
        }
        // Pass 2, slot by slot: one key's gradient row takes every head's contribution while it is in cache.
        for (int32_t i = 0; i < topk; i++) {
            if (sel[i] < 0)
                continue;
            double *dkv_s = dsa_ref_key_accumulator_row(&dkv_acc, sel[i]);
            for (int32_t h = 0; h < n_heads; h++) {
                const double p = prob[(size_t)h * topk + i], dp = dlogit[(size_t)h * topk + i];
                if (p == 0.0 && dp == 0.0)
                    continue; // an empty row (lse = +inf) or an underflowed probability: nothing to add
                const double key_coef = scale * dp;
                const float *q_th = q_t + h * d_qk, *do_th = do_t + h * d_v;
                for (int32_t c = 0; c < d_v; c++) // key role and value role
                    dkv_s[c] += key_coef * (double)q_th[c] + p * (double)do_th[c];
                for (int32_t c = d_v; c < d_qk; c++) // key role only (the rope columns)
                    dkv_s[c] += key_coef * (double)q_th[c];
            }
        }
        for (int64_t c = 0; c < (int64_t)n_heads * d_qk; c++)
            d_q[t * n_heads * d_qk + c] = (float)(scale * dq_acc[c]);
    }
    dsa_ref_key_accumulator_flush(&dkv_acc, dkv, d_qk);
    free(prob);
    free(dlogit);
    free(dq_acc);
    return DSARL_OK;
}
