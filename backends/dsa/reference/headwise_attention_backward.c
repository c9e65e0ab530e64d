/* Backward of the per-head (non-absorbed) attention forward (headwise_attention_forward.c).
 *
 * With the forward's lse and out as given (as the CUDA kernels take them), for each query t, head h and key s of
 * S(t) (the valid index slots, or the whole range when indices is NULL):
 *   p(s)       = exp(softmax_scale * q[t,h,:] . k[s,h,:] - lse[t,h])
 *   Delta      = out[t,h,:] . dout[t,h,:]                       (= sum_s p(s) dout . v(s))
 *   dP(s)      = p(s) * (dout[t,h,:] . v[s,h,:] - Delta)        (gradient wrt the scaled logit)
 *   dq[t,h]    = softmax_scale * sum_s dP(s) k[s,h,:]
 *   dk[s,h]   += softmax_scale * dP(s) q[t,h,:]
 *   dv[s,h]   += p(s) dout[t,h,:]
 * dq, dk and dv are overwritten (keys no query selects get 0). A row whose lse is +inf (no key) contributes
 * nothing and gets dq = 0; a key in two slots gets both slots' contributions, matching the forward. Key gradients
 * are summed in double and rounded to float32 once. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dsa_reference.h"

int dsa_reference_headwise_attention_backward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                              const dsarl_dsa_headwise_inputs *in, const int32_t *indices, int32_t topk,
                                              const void *out, const float *lse, const void *dout, void *dq, void *dk,
                                              void *dv, dsarl_error *err)
{
    DSARL_TRY(dsa_ref_check_batch("headwise_attention_backward", batch, err));
    DSARL_TRY(dsa_ref_check_headwise("headwise_attention_backward", batch, in, err));
    if (indices != NULL)
        DSARL_TRY(dsa_ref_check_indices("headwise_attention_backward", batch, indices, topk, err));
    if ((batch->n_queries > 0 && (out == NULL || lse == NULL || dout == NULL || dq == NULL)) ||
        (batch->n_keys > 0 && (dk == NULL || dv == NULL)))
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "dsa reference headwise_attention_backward: out, lse, dout, dq, dk and dv must all be set");
    const int32_t n_heads = in->n_heads, d_qk = in->d_qk, d_v = in->d_v;
    const double scale = in->softmax_scale;
    const float *q = in->q;  // (Tq, H, d_qk)
    const float *k = in->k;  // (Tk, H, d_qk)
    const float *v = in->v;  // (Tk, H, d_v)
    const float *o = out;    // (Tq, H, d_v)
    const float *d_o = dout; // (Tq, H, d_v)
    float *d_q = dq;         // (Tq, H, d_qk)

    dsa_ref_key_accumulator dk_acc, dv_acc; // (keys touched, H * d_qk), (keys touched, H * d_v)
    DSARL_TRY(dsa_ref_key_accumulator_init(&dk_acc, batch, (int64_t)n_heads * d_qk, err));
    int rc = dsa_ref_key_accumulator_init(&dv_acc, batch, (int64_t)n_heads * d_v, err);
    if (rc != DSARL_OK) {
        dsa_ref_key_accumulator_free(&dk_acc);
        return rc;
    }
    const int32_t width = dsa_ref_row_keys_capacity(batch, indices, topk);
    int32_t *keys = malloc((size_t)width * sizeof(int32_t)); // (width) S(t)
    double *dq_acc = malloc((size_t)d_qk * sizeof(double));  // (d_qk) dq of one head
    if (keys == NULL || dq_acc == NULL) {
        free(keys);
        free(dq_acc);
        dsa_ref_key_accumulator_free(&dk_acc);
        dsa_ref_key_accumulator_free(&dv_acc);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsa reference headwise_attention_backward: cannot allocate row buffers");
    }
    for (int64_t t = 0; t < batch->n_queries; t++) {
        const int32_t n = dsa_ref_row_keys(batch, indices, topk, t, keys);
        for (int32_t h = 0; h < n_heads; h++) {
            const float *q_th = q + (t * n_heads + h) * d_qk;
            const float *do_th = d_o + (t * n_heads + h) * d_v;
            const double row_lse = lse[t * n_heads + h];
            memset(dq_acc, 0, (size_t)d_qk * sizeof(double));
            if (row_lse != INFINITY) {
                const double delta = dsa_ref_dot(o + (t * n_heads + h) * d_v, do_th, d_v);
                for (int32_t i = 0; i < n; i++) {
                    const float *k_sh = k + ((int64_t)keys[i] * n_heads + h) * d_qk;
                    const float *v_sh = v + ((int64_t)keys[i] * n_heads + h) * d_v;
                    const double p = exp(scale * dsa_ref_dot(q_th, k_sh, d_qk) - row_lse);
                    const double dp = p * (dsa_ref_dot(do_th, v_sh, d_v) - delta);
                    if (p == 0.0 && dp == 0.0)
                        continue; // an underflowed probability: nothing to add
                    for (int32_t c = 0; c < d_qk; c++)
                        dq_acc[c] += dp * (double)k_sh[c];
                    double *dk_sh = dsa_ref_key_accumulator_row(&dk_acc, keys[i]) + (int64_t)h * d_qk;
                    double *dv_sh = dsa_ref_key_accumulator_row(&dv_acc, keys[i]) + (int64_t)h * d_v;
                    const double key_coef = scale * dp;
                    for (int32_t c = 0; c < d_qk; c++)
                        dk_sh[c] += key_coef * (double)q_th[c];
                    for (int32_t c = 0; c < d_v; c++)
                        dv_sh[c] += p * (double)do_th[c];
                }
            }
            float *dq_th = d_q + (t * n_heads + h) * d_qk;
            for (int32_t c = 0; c < d_qk; c++)
                dq_th[c] = (float)(scale * dq_acc[c]);
        }
    }
    // overwrite semantics: every key row starts at 0, then the touched span takes its sums
    if (batch->n_keys > 0) {
        memset(dk, 0, (size_t)batch->n_keys * (size_t)n_heads * (size_t)d_qk * sizeof(float));
        memset(dv, 0, (size_t)batch->n_keys * (size_t)n_heads * (size_t)d_v * sizeof(float));
    }
    dsa_ref_key_accumulator_flush(&dk_acc, dk, (int64_t)n_heads * d_qk);
    dsa_ref_key_accumulator_flush(&dv_acc, dv, (int64_t)n_heads * d_v);
    free(keys);
    free(dq_acc);
    return DSARL_OK;
}
