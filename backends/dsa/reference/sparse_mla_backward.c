/* Backward of the sparse MLA forward (glm5_dsa.md section 2.7; TileLang examples/deepseek_v32 sparse_mla_bwd).
 *
 * With the forward's lse and out as given (as every CUDA kernel takes them), for each query t, head h and valid
 * slot s of S(t):
 *   p(s)    = exp(softmax_scale * q[t,h,:] . kv[s,:] - lse[t,h])
 *   Delta   = out[t,h,:] . dout[t,h,:]                       (= sum_s p(s) dout . V(s))
 *   dP(s)   = p(s) * (dout[t,h,:] . kv[s,:d_v] - Delta)      (gradient wrt the pre-scale logit, times 1)
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
                                      dsarl_error *err) {
    DSARL_TRY(dsa_ref_check_batch("sparse_mla_backward", batch, err));
    DSARL_TRY(dsa_ref_check_attention("sparse_mla_backward", batch, in, err));
    DSARL_TRY(dsa_ref_check_indices("sparse_mla_backward", batch, indices, topk, err));
    if (batch->n_queries > 0 && (out == NULL || lse == NULL || dout == NULL || dq == NULL || dkv == NULL))
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "dsa reference sparse_mla_backward: out, lse, dout, dq and dkv must all be set");
    const int32_t n_heads = in->n_heads, d_qk = in->d_qk, d_v = in->d_v;
    const double scale = in->softmax_scale;
    const float *q = in->q;        // (Tq, H, d_qk)
    const float *kv = in->kv;      // (Tk, d_qk)
    const float *o = out;          // (Tq, H, d_v)
    const float *d_o = dout;       // (Tq, H, d_v)
    float *d_q = dq;               // (Tq, H, d_qk)

    dsa_ref_key_accumulator dkv_acc;  // (keys touched, d_qk)
    DSARL_TRY(dsa_ref_key_accumulator_init(&dkv_acc, batch, d_qk, err));
    double *prob = malloc((size_t)topk * sizeof(double));   // (topk) p(s) of one head
    double *dlogit = malloc((size_t)topk * sizeof(double)); // (topk) dP(s) of one head
    double *dq_acc = malloc((size_t)d_qk * sizeof(double)); // (d_qk)
    if (prob == NULL || dlogit == NULL || dq_acc == NULL) {
        free(prob);
        free(dlogit);
        free(dq_acc);
        dsa_ref_key_accumulator_free(&dkv_acc);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsa reference sparse_mla_backward: cannot allocate row buffers");
    }
    for (int64_t t = 0; t < batch->n_queries; t++) {
        const int32_t *sel = indices + t * topk;
        for (int32_t h = 0; h < n_heads; h++) {
            const int64_t th = t * n_heads + h;
            const float *q_th = q + th * d_qk;
            const float *o_th = o + th * d_v;
            const float *do_th = d_o + th * d_v;
            const double row_lse = lse[th];
            const double delta = dsa_ref_dot(o_th, do_th, d_v);
            memset(dq_acc, 0, (size_t)d_qk * sizeof(double));
            for (int32_t i = 0; i < topk; i++) {
                if (sel[i] < 0 || row_lse == INFINITY) {
                    prob[i] = dlogit[i] = 0.0;
                    continue;
                }
                const float *kv_s = kv + (int64_t)sel[i] * d_qk;
                prob[i] = exp(scale * dsa_ref_dot(q_th, kv_s, d_qk) - row_lse);
                dlogit[i] = prob[i] * (dsa_ref_dot(do_th, kv_s, d_v) - delta);
                for (int32_t c = 0; c < d_qk; c++)
                    dq_acc[c] += dlogit[i] * (double)kv_s[c];
            }
            for (int32_t c = 0; c < d_qk; c++)
                d_q[th * d_qk + c] = (float)(scale * dq_acc[c]);
            for (int32_t i = 0; i < topk; i++) {
                if (prob[i] == 0.0 && dlogit[i] == 0.0)
                    continue;  // an empty slot (or an underflowed probability: nothing to add)
                double *dkv_s = dsa_ref_key_accumulator_row(&dkv_acc, sel[i]);
                const double key_coef = scale * dlogit[i];
                for (int32_t c = 0; c < d_qk; c++)
                    dkv_s[c] += key_coef * (double)q_th[c];
                for (int32_t c = 0; c < d_v; c++)
                    dkv_s[c] += prob[i] * (double)do_th[c];
            }
        }
    }
    dsa_ref_key_accumulator_flush(&dkv_acc, dkv, d_qk);
    free(prob);
    free(dlogit);
    free(dq_acc);
    return DSARL_OK;
}
