/* Attention forward in the per-head (non-absorbed) form (dsarl/ops/dsa.h ABI 1.1; glm5_dsa.md section 2.2).
 *
 * Every head h has its own keys and values, k[s,h,:] (d_qk = qk_nope + qk_rope) and v[s,h,:] (d_v); all heads of
 * query t attend to the same key set S(t): the valid slots of its indices row, or every key of
 * [key_start[t], key_end[t]) when indices is NULL (segments no longer than topk, dense warm-up):
 *   logit_h(s) = softmax_scale * q[t,h,:] . k[s,h,:]
 *   p_h(s)     = exp(logit_h(s) - lse_h),  lse_h = log sum_{s in S(t)} exp(logit_h(s))   (natural log)
 *   out[t,h,:] = sum_{s in S(t)} p_h(s) v[s,h,:]
 * With k_h = [c_kv W_UK_h^T | k_rope] and v_h = c_kv W_UV_h^T this equals sparse_mla_forward on the latent followed
 * by W_UV (the absorbed form), up to float rounding. A row with an empty S gets out = 0 and lse = +inf, and a key
 * in two slots is two softmax terms, exactly as in sparse_mla_forward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dsa_reference.h"

int dsa_reference_headwise_attention_forward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                             const dsarl_dsa_headwise_inputs *in, const int32_t *indices, int32_t topk,
                                             void *out, float *lse, dsarl_error *err)
{
    DSARL_TRY(dsa_ref_check_batch("headwise_attention_forward", batch, err));
    DSARL_TRY(dsa_ref_check_headwise("headwise_attention_forward", batch, in, err));
    if (indices != NULL)
        DSARL_TRY(dsa_ref_check_indices("headwise_attention_forward", batch, indices, topk, err));
    if (batch->n_queries > 0 && (out == NULL || lse == NULL))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa reference headwise_attention_forward: out and lse must be set");
    const int32_t n_heads = in->n_heads, d_qk = in->d_qk, d_v = in->d_v;
    const double scale = in->softmax_scale;
    const float *q = in->q; // (Tq, H, d_qk)
    const float *k = in->k; // (Tk, H, d_qk)
    const float *v = in->v; // (Tk, H, d_v)
    float *o = out;         // (Tq, H, d_v)

    const int32_t width = dsa_ref_row_keys_capacity(batch, indices, topk);
    int32_t *keys = malloc((size_t)width * sizeof(int32_t)); // (width) S(t) as absolute key indices
    double *weight = malloc((size_t)width * sizeof(double)); // (width) logits, then probabilities, of one head
    double *acc = malloc((size_t)d_v * sizeof(double));      // (d_v) output of one head
    if (keys == NULL || weight == NULL || acc == NULL) {
        free(keys);
        free(weight);
        free(acc);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsa reference headwise_attention_forward: cannot allocate row buffers");
    }
    for (int64_t t = 0; t < batch->n_queries; t++) {
        const int32_t n = dsa_ref_row_keys(batch, indices, topk, t, keys);
        for (int32_t h = 0; h < n_heads; h++) {
            const float *q_th = q + (t * n_heads + h) * d_qk;
            float *o_th = o + (t * n_heads + h) * d_v;
            if (n == 0) {
                memset(o_th, 0, (size_t)d_v * sizeof(float));
                lse[t * n_heads + h] = INFINITY;
                continue;
            }
            double max_logit = -INFINITY;
            for (int32_t i = 0; i < n; i++) {
                weight[i] = scale * dsa_ref_dot(q_th, k + ((int64_t)keys[i] * n_heads + h) * d_qk, d_qk);
                if (weight[i] > max_logit)
                    max_logit = weight[i];
            }
            double denom = 0.0;
            for (int32_t i = 0; i < n; i++) {
                weight[i] = exp(weight[i] - max_logit);
                denom += weight[i];
            }
            memset(acc, 0, (size_t)d_v * sizeof(double));
            for (int32_t i = 0; i < n; i++) {
                const double p = weight[i] / denom;
                const float *v_sh = v + ((int64_t)keys[i] * n_heads + h) * d_v;
                for (int32_t c = 0; c < d_v; c++)
                    acc[c] += p * (double)v_sh[c];
            }
            for (int32_t c = 0; c < d_v; c++)
                o_th[c] = (float)acc[c];
            lse[t * n_heads + h] = (float)(max_logit + log(denom));
        }
    }
    free(keys);
    free(weight);
    free(acc);
    return DSARL_OK;
}
