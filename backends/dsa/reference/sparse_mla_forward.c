/* Sparse MLA forward in the absorbed MQA form (glm5_dsa.md sections 2.4 and 2.7).
 *
 * Every head of query t attends to the same selected keys S(t) (the valid slots of its indices row):
 *   logit_h(s) = softmax_scale * q[t,h,:] . kv[s,:]           over all d_qk = kv_lora + rope columns
 *   p_h(s)     = exp(logit_h(s) - lse_h),  lse_h = log sum_{s in S(t)} exp(logit_h(s))   (natural log)
 *   out[t,h,:] = sum_{s in S(t)} p_h(s) kv[s, :d_v]
 * A row with no valid slot gets out = 0 and lse = +inf (FlashMLA tests/ref.py "lonely_q_mask"), so that
 * exp(logit - lse) = 0 reproduces it in the backward. A key listed in two slots is two softmax terms. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dsa_reference.h"

int dsa_reference_sparse_mla_forward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                     const dsarl_dsa_attention_inputs *in, const int32_t *indices, int32_t topk,
                                     void *out, float *lse, dsarl_error *err)
{
    DSARL_TRY(dsa_ref_check_batch("sparse_mla_forward", batch, err));
    DSARL_TRY(dsa_ref_check_attention("sparse_mla_forward", batch, in, err));
    DSARL_TRY(dsa_ref_check_indices("sparse_mla_forward", batch, indices, topk, err));
    if (batch->n_queries > 0 && (out == NULL || lse == NULL))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa reference sparse_mla_forward: out and lse must be set");
    const int32_t n_heads = in->n_heads, d_qk = in->d_qk, d_v = in->d_v;
    const double scale = in->softmax_scale;
    const float *q = in->q;   // (Tq, H, d_qk)
    const float *kv = in->kv; // (Tk, d_qk)
    float *o = out;           // (Tq, H, d_v)

    double *weight = malloc((size_t)topk * sizeof(double)); // (topk) logits, then probabilities, of one head
    double *acc = malloc((size_t)d_v * sizeof(double));     // (d_v) output of one head
    if (weight == NULL || acc == NULL) {
        free(weight);
        free(acc);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsa reference sparse_mla_forward: cannot allocate row buffers");
    }
    for (int64_t t = 0; t < batch->n_queries; t++) {
        const int32_t *sel = indices + t * topk;
        int has_key = dsa_ref_count_valid(sel, topk) > 0;
        for (int32_t h = 0; h < n_heads; h++) {
            const float *q_th = q + (t * n_heads + h) * d_qk;
            float *o_th = o + (t * n_heads + h) * d_v;
            if (!has_key) {
                memset(o_th, 0, (size_t)d_v * sizeof(float));
                lse[t * n_heads + h] = INFINITY;
                continue;
            }
            double max_logit = -INFINITY;
            for (int32_t i = 0; i < topk; i++) {
                if (sel[i] < 0)
                    continue;
                weight[i] = scale * dsa_ref_dot(q_th, kv + (int64_t)sel[i] * d_qk, d_qk);
                if (weight[i] > max_logit)
                    max_logit = weight[i];
            }
            double denom = 0.0;
            for (int32_t i = 0; i < topk; i++) {
                if (sel[i] < 0)
                    continue;
                weight[i] = exp(weight[i] - max_logit);
                denom += weight[i];
            }
            memset(acc, 0, (size_t)d_v * sizeof(double));
            for (int32_t i = 0; i < topk; i++) {
                if (sel[i] < 0)
                    continue;
                const double p = weight[i] / denom;
                const float *v = kv + (int64_t)sel[i] * d_qk; // V(s) = kv[s, :d_v]
                for (int32_t c = 0; c < d_v; c++)
                    acc[c] += p * (double)v[c];
            }
            for (int32_t c = 0; c < d_v; c++)
                o_th[c] = (float)acc[c];
            lse[t * n_heads + h] = (float)(max_logit + log(denom));
        }
    }
    free(weight);
    free(acc);
    return DSARL_OK;
}
