/* cpu_moe.c: the GLM-5 / DeepSeek-V3 "noaux_tc" router (sigmoid scores, bias for choosing only, group-limited
 * top-k) with its backward, the padded grouping of routed rows by expert, and the row permutations that group
 * tokens by expert. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_device.h"

// Index of the largest value among n candidates not yet taken; ties go to the lower index (as the DSA ops do).
static int64_t argmax_untaken(const float *v, const unsigned char *taken, int64_t n)
{
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best]))
            best = i;
    return best < 0 ? 0 : best; /* callers always leave an untaken entry; 0 keeps every index in range */
}

int cpu_moe_route_forward(dsarl_device *dev, int32_t *indices, float *weights, float *probs, const float *logits,
                          const float *bias, int64_t T, int64_t E, int32_t top_k, int32_t n_group,
                          int32_t topk_group, bool norm_topk_prob, float scaling, dsarl_error *err)
{
    if (n_group < 1 || E % n_group || topk_group < 1 || topk_group > n_group || top_k < 1 ||
        top_k > (E / n_group) * topk_group)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cpu: moe_route needs n_group dividing n_routed_experts "
                          "(%lld), 1 <= topk_group <= n_group and num_experts_per_tok <= experts in kept groups; got "
                          "n_group %d, topk_group %d, top_k %d", (long long)E, n_group, topk_group, top_k);
    int64_t group_size = E / n_group;
    float *choice = malloc((size_t)E * sizeof(float));
    float *group_score = malloc((size_t)n_group * sizeof(float));
    unsigned char *taken = malloc((size_t)(E > n_group ? E : n_group));
    unsigned char *group_kept = malloc((size_t)n_group);
    if (!choice || !group_score || !taken || !group_kept) {
        free(choice), free(group_score), free(taken), free(group_kept);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "device cpu: out of memory in moe_route_forward");
    }
    for (int64_t t = 0; t < T; t++) {
        const float *lrow = logits + t * E;
        float *prow = probs + t * E;
        for (int64_t e = 0; e < E; e++) {
            prow[e] = 1.0f / (1.0f + expf(-lrow[e]));
            choice[e] = prow[e] + (bias ? bias[e] : 0.0f);
        }
        // group score = sum of the two best choice values in the group (one when a group has one expert)
        for (int32_t g = 0; g < n_group; g++) {
            const float *gv = choice + g * group_size;
            memset(taken, 0, (size_t)group_size);
            int64_t a = argmax_untaken(gv, taken, group_size);
            taken[a] = 1;
            float s = gv[a];
            if (group_size > 1)
                s += gv[argmax_untaken(gv, taken, group_size)];
            group_score[g] = s;
        }
        memset(taken, 0, (size_t)n_group);
        memset(group_kept, 0, (size_t)n_group);
        for (int32_t i = 0; i < topk_group; i++) {
            int64_t g = argmax_untaken(group_score, taken, n_group);
            taken[g] = 1;
            group_kept[g] = 1;
        }
        // experts outside the kept groups are never chosen
        memset(taken, 0, (size_t)E);
        for (int64_t e = 0; e < E; e++)
            if (!group_kept[e / group_size])
                taken[e] = 1;
        float sum = 0.0f;
        for (int32_t k = 0; k < top_k; k++) {
            int64_t e = argmax_untaken(choice, taken, E);
            taken[e] = 1;
            indices[t * top_k + k] = (int32_t)e;
            weights[t * top_k + k] = prow[e];
            sum += prow[e];
        }
        float denom = sum + 1e-20f;
        for (int32_t k = 0; k < top_k; k++) {
            float w = weights[t * top_k + k];
            if (norm_topk_prob)
                w /= denom;
            weights[t * top_k + k] = w * scaling;
        }
    }
    free(choice), free(group_score), free(taken), free(group_kept);
    return DSARL_OK;
}

int cpu_moe_route_backward(dsarl_device *dev, float *dlogits, const float *dweights, const int32_t *indices,
                           const float *probs, int64_t T, int64_t E, int32_t top_k, bool norm_topk_prob,
                           float scaling, dsarl_error *err)
{
    memset(dlogits, 0, (size_t)(T * E) * sizeof(float));
    for (int64_t t = 0; t < T; t++) {
        const int32_t *idx = indices + t * top_k;
        const float *dw = dweights + t * top_k, *prow = probs + t * E;
        double sum = 0.0, dot = 0.0; // dot = sum_k dw_k s_k
        for (int32_t k = 0; k < top_k; k++) {
            sum += prow[idx[k]];
            dot += (double)dw[k] * prow[idx[k]];
        }
        double denom = sum + 1e-20;
        for (int32_t k = 0; k < top_k; k++) {
            double s = prow[idx[k]];
            // w_k = scaling * s_k / denom: the denominator is differentiated too, as in transformers
            double ds = norm_topk_prob ? scaling * (dw[k] / denom - dot / (denom * denom)) : scaling * dw[k];
            dlogits[t * E + idx[k]] += (float)(ds * s * (1.0 - s));
        }
    }
    return DSARL_OK;
}

int cpu_moe_group_padded(dsarl_device *dev, int32_t *rows, int32_t *slot, int32_t *slot_inv, const int32_t *indices,
                         int64_t T, int64_t E, int32_t top_k, int64_t pad, dsarl_error *err)
{
    (void)dev;
    // rows and slots are int32: every row index (E*pad) and the padding slot (T*top_k) must fit
    if (T < 0 || E < 1 || top_k < 1 || pad < 1 || E > INT32_MAX / pad || T > INT32_MAX / top_k)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cpu: moe_group_padded needs T >= 0, E, top_k and pad >= 1, "
                          "with E*pad and T*top_k at most %d; got T %lld, E %lld, top_k %d, pad %lld", INT32_MAX,
                          (long long)T, (long long)E, top_k, (long long)pad);
    int64_t N = T * top_k;
    for (int64_t i = 0; i < N; i++)
        if (indices[i] < 0 || indices[i] >= E)
            return DSARL_FAIL(err, DSARL_E_INVALID, "device cpu: moe_group_padded indices[%lld] (token %lld, slot "
                              "%lld) is %d; valid experts are [0, %lld)", (long long)i, (long long)(i / top_k),
                              (long long)(i % top_k), indices[i], (long long)E);
    // E counters: no more than the caller's own rows array (E*pad int32) already holds
    int64_t *fill = malloc((size_t)E * sizeof(int64_t));
    if (!fill)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "device cpu: out of memory for %lld expert counters in "
                          "moe_group_padded", (long long)E);
    for (int64_t e = 0; e < E; e++)
        fill[e] = 0;
    for (int64_t r = 0; r < E * pad; r++)
        rows[r] = T > 0 ? (int32_t)(r % T) : 0, slot[r] = (int32_t)N; // a padding row: zero routing weight
    // pairs in (t, k) order, so each expert's rows come in token order
    for (int64_t i = 0; i < N; i++) {
        int64_t e = indices[i], n = fill[e]++;
        if (n >= pad) { // past its expert's rows: no row (only when pad < T or an expert repeats in a row)
            slot_inv[i] = -1;
            continue;
        }
        int64_t r = e * pad + n;
        rows[r] = (int32_t)(i / top_k);
        slot[r] = (int32_t)i;
        slot_inv[i] = (int32_t)r;
    }
    free(fill);
    return DSARL_OK;
}

int cpu_gather_rows(dsarl_device *dev, void *out, const void *inp, const int32_t *rows, int64_t n, int64_t C,
                    dsarl_error *err)
{
    for (int64_t r = 0; r < n; r++)
        memcpy((float *)out + r * C, (const float *)inp + (int64_t)rows[r] * C, (size_t)C * sizeof(float));
    return DSARL_OK;
}

int cpu_scatter_add_rows(dsarl_device *dev, void *out, const void *inp, const int32_t *rows, const float *scale,
                         int64_t n, int64_t C, dsarl_error *err)
{
    for (int64_t r = 0; r < n; r++) {
        float *o = (float *)out + (int64_t)rows[r] * C;
        const float *x = (const float *)inp + r * C;
        float a = scale ? scale[r] : 1.0f;
        for (int64_t c = 0; c < C; c++)
            o[c] += a * x[c];
    }
    return DSARL_OK;
}

int cpu_scale_rows(dsarl_device *dev, void *x, const float *scale, int64_t n, int64_t C, dsarl_error *err)
{
    for (int64_t r = 0; r < n; r++) {
        float *row = (float *)x + r * C;
        for (int64_t c = 0; c < C; c++)
            row[c] *= scale[r];
    }
    return DSARL_OK;
}

int cpu_row_dot(dsarl_device *dev, float *out, const void *a, const void *b, int64_t n, int64_t C, dsarl_error *err)
{
    for (int64_t r = 0; r < n; r++) {
        const float *x = (const float *)a + r * C, *y = (const float *)b + r * C;
        double s = 0.0;
        for (int64_t c = 0; c < C; c++)
            s += (double)x[c] * y[c];
        out[r] = (float)s;
    }
    return DSARL_OK;
}
