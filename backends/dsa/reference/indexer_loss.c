/* Indexer KL loss, forward and backward (DeepSeek-V3.2 report section 2.1; glm5_dsa.md section 3.2, which follows
 * Megatron-LM dsa_indexer_loss.py). For each query t, over a set S:
 *   sparse mode (indices != NULL): S = the valid slots of the top-k row (Megatron dsa_indexer_use_sparse_loss=True:
 *     "valid = causal set AND s in S(t)", both softmaxes renormalised over S); a key in two slots is two entries.
 *   dense warm-up (indices == NULL): S = every eligible key [key_start, key_end).
 *   target  P(s) = sum_h exp(softmax_scale * q[t,h,:] . kv[s,:] - lse_h)   (summed over ALL heads)
 *           p(s) = P(s) / max(sum_S P, 1e-10)                             (Megatron's L1 normalisation)
 *     lse_h: the given sparse-attention lse in sparse mode (NULL: recomputed over S); in dense mode always
 *     recomputed over S here, since the dense attention's probabilities are wanted, not the sparse ones.
 *   log q(s) = I(t,s) - logsumexp_S I(t,.),  I(t,s) = sum_j w[t,j] relu(qI[t,j,:] . kI[s,:])
 *   loss(t)  = sum_{s in S, p(s) > 0} p(s) (log p(s) - log q(s))
 *     (Megatron clamps log(max(p, 1e-10)); taking p log p exactly differs by < 1e-10 * 23 per term and makes
 *     p = 0 terms contribute exactly 0.) An empty S gives loss 0 and zero gradients.
 * No coefficient and no mean over rows here: the model applies dsa_indexer_loss_coeff / N_rows through dloss.
 * Backward (Megatron bwd_fused_indexer_loss_naive): g(s) = dloss[t] * (softmax_S(I)(s) - p(s)), then
 *   dweights[t,j] = sum_s g relu(qI_j . kI_s);  dq_index[t,j] = sum_s g w_j 1[qI_j . kI_s > 0] kI_s;
 *   dk_index[s] += sum_{t,j} g w_j 1[qI_j . kI_s > 0] qI[t,j].
 * The attention operands are detached (Megatron: "prevent gradients of indexer from flowing back to the main
 * model"; FusedDSAIndexerLoss.backward returns None for query/key): nothing is written for q or kv. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dsa_reference.h"

/* Per-row workspace, sized for the largest set of the call. */
typedef struct loss_row {
    int32_t n_set;  // |S|
    int32_t *keys;  // (max_set) absolute key index of each entry of S
    double *target; // (max_set) p(s), L1-normalised
    double *log_q;  // (max_set) log softmax_S of the indexer scores
    double *qk_dot; // (max_set, indexer n_heads) raw qI_j . kI_s (its sign is the ReLU gate)
    double *logit;  // (max_set) attention logits of one head (scratch)
} loss_row;

static void loss_row_free(loss_row *row)
{
    free(row->keys);
    free(row->target);
    free(row->log_q);
    free(row->qk_dot);
    free(row->logit);
}

static int loss_row_alloc(loss_row *row, int64_t max_set, int32_t indexer_heads, dsarl_error *err)
{
    size_t n = (size_t)(max_set > 0 ? max_set : 1);
    row->keys = malloc(n * sizeof(int32_t));
    row->target = malloc(n * sizeof(double));
    row->log_q = malloc(n * sizeof(double));
    row->qk_dot = malloc(n * (size_t)indexer_heads * sizeof(double));
    row->logit = malloc(n * sizeof(double));
    if (row->keys == NULL || row->target == NULL || row->log_q == NULL || row->qk_dot == NULL || row->logit == NULL) {
        loss_row_free(row);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsa reference indexer loss: cannot allocate buffers for %lld keys",
                          (long long)max_set);
    }
    return DSARL_OK;
}

/* log sum_i exp(x[i]) over n > 0 values, shifted by the maximum. */
static double log_sum_exp(const double *x, int32_t n)
{
    double max = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (x[i] > max)
            max = x[i];
    if (max == -INFINITY)
        return max;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        sum += exp(x[i] - max);
    return max + log(sum);
}

/* Fills S, the target p and log q of query t. */
static void loss_row_compute(loss_row *row, const dsarl_dsa_batch *batch, const dsarl_dsa_attention_inputs *attn,
                             const float *lse, const dsarl_dsa_indexer_inputs *indexer, const int32_t *indices,
                             int32_t topk, int64_t t)
{
    row->n_set = 0;
    if (indices != NULL) {
        const int32_t *sel = indices + t * topk;
        for (int32_t i = 0; i < topk; i++)
            if (sel[i] >= 0)
                row->keys[row->n_set++] = sel[i];
    } else {
        for (int32_t s = batch->key_start[t]; s < batch->key_end[t]; s++)
            row->keys[row->n_set++] = s;
    }
    const int32_t n = row->n_set;
    if (n == 0)
        return;

    // Target: head-summed attention probabilities over S, L1-normalised.
    const float *q = attn->q;   // (Tq, H, d_qk)
    const float *kv = attn->kv; // (Tk, d_qk)
    memset(row->target, 0, (size_t)n * sizeof(double));
    for (int32_t h = 0; h < attn->n_heads; h++) {
        const float *q_th = q + (t * attn->n_heads + h) * attn->d_qk;
        for (int32_t i = 0; i < n; i++)
            row->logit[i] =
                (double)attn->softmax_scale * dsa_ref_dot(q_th, kv + (int64_t)row->keys[i] * attn->d_qk, attn->d_qk);
        double head_lse =
            (indices != NULL && lse != NULL) ? (double)lse[t * attn->n_heads + h] : log_sum_exp(row->logit, n);
        for (int32_t i = 0; i < n; i++)
            row->target[i] += exp(row->logit[i] - head_lse);
    }
    double total = 0.0;
    for (int32_t i = 0; i < n; i++)
        total += row->target[i];
    const double norm = total > 1e-10 ? total : 1e-10;
    for (int32_t i = 0; i < n; i++)
        row->target[i] /= norm;

    // Indexer distribution: log softmax over S of the weighted-ReLU scores.
    const float *q_index = indexer->q; // (Tq, n_heads, head_dim)
    const float *k_index = indexer->k; // (Tk, head_dim)
    const float *w = indexer->weights; // (Tq, n_heads)
    const int32_t heads = indexer->n_heads, dim = indexer->head_dim;
    for (int32_t i = 0; i < n; i++) {
        const float *k_s = k_index + (int64_t)row->keys[i] * dim;
        double score = 0.0;
        for (int32_t j = 0; j < heads; j++) {
            double dot = dsa_ref_dot(q_index + (t * heads + j) * dim, k_s, dim);
            row->qk_dot[(int64_t)i * heads + j] = dot;
            if (dot > 0.0)
                score += (double)w[t * heads + j] * dot;
        }
        row->log_q[i] = score;
    }
    const double score_lse = log_sum_exp(row->log_q, n);
    for (int32_t i = 0; i < n; i++)
        row->log_q[i] -= score_lse;
}

/* Checks shared by forward and backward; sets *max_set to the largest |S| of the call. */
static int check_loss_args(const char *op, const dsarl_dsa_batch *batch, const dsarl_dsa_attention_inputs *attn,
                           const dsarl_dsa_indexer_inputs *indexer, const int32_t *indices, int32_t topk,
                           int64_t *max_set, dsarl_error *err)
{
    DSARL_TRY(dsa_ref_check_batch(op, batch, err));
    DSARL_TRY(dsa_ref_check_attention(op, batch, attn, err));
    DSARL_TRY(dsa_ref_check_indexer(op, batch, indexer, err));
    if (indices != NULL)
        DSARL_TRY(dsa_ref_check_indices(op, batch, indices, topk, err));
    *max_set = indices != NULL ? topk : batch->max_keys_per_query;
    return DSARL_OK;
}

int dsa_reference_indexer_loss_forward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                       const dsarl_dsa_attention_inputs *attn, const float *lse,
                                       const dsarl_dsa_indexer_inputs *indexer, const int32_t *indices, int32_t topk,
                                       float *loss, dsarl_error *err)
{
    int64_t max_set = 0;
    DSARL_TRY(check_loss_args("indexer_loss_forward", batch, attn, indexer, indices, topk, &max_set, err));
    if (batch->n_queries > 0 && loss == NULL)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsa reference indexer_loss_forward: loss (Tq) must be set");
    loss_row row;
    DSARL_TRY(loss_row_alloc(&row, max_set, indexer->n_heads, err));
    for (int64_t t = 0; t < batch->n_queries; t++) {
        loss_row_compute(&row, batch, attn, lse, indexer, indices, topk, t);
        double kl = 0.0;
        for (int32_t i = 0; i < row.n_set; i++)
            if (row.target[i] > 0.0)
                kl += row.target[i] * (log(row.target[i]) - row.log_q[i]);
        loss[t] = (float)kl;
    }
    loss_row_free(&row);
    return DSARL_OK;
}

int dsa_reference_indexer_loss_backward(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch,
                                        const dsarl_dsa_attention_inputs *attn, const float *lse,
                                        const dsarl_dsa_indexer_inputs *indexer, const int32_t *indices, int32_t topk,
                                        const float *dloss, void *dq_index, void *dk_index, float *dweights,
                                        dsarl_error *err)
{
    int64_t max_set = 0;
    DSARL_TRY(check_loss_args("indexer_loss_backward", batch, attn, indexer, indices, topk, &max_set, err));
    if (batch->n_queries > 0 && (dloss == NULL || dq_index == NULL || dk_index == NULL || dweights == NULL))
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "dsa reference indexer_loss_backward: dloss, dq_index, dk_index and dweights must be set");
    const int32_t heads = indexer->n_heads, dim = indexer->head_dim;
    const float *q_index = indexer->q; // (Tq, n_heads, head_dim)
    const float *k_index = indexer->k; // (Tk, head_dim)
    const float *w = indexer->weights; // (Tq, n_heads)
    float *dq = dq_index;              // (Tq, n_heads, head_dim)

    loss_row row;
    DSARL_TRY(loss_row_alloc(&row, max_set, heads, err));
    dsa_ref_key_accumulator dk_acc;                        // (keys touched, head_dim)
    double *dq_acc = malloc((size_t)dim * sizeof(double)); // (head_dim) one head of dq_index
    int rc = dq_acc != NULL ? dsa_ref_key_accumulator_init(&dk_acc, batch, dim, err)
                            : DSARL_FAIL(err, DSARL_E_NOMEM, "dsa reference indexer_loss_backward: out of memory");
    if (rc < 0) {
        free(dq_acc);
        loss_row_free(&row);
        return rc;
    }
    for (int64_t t = 0; t < batch->n_queries; t++) {
        loss_row_compute(&row, batch, attn, lse, indexer, indices, topk, t);
        // dI(s) = dloss * (softmax_S(I) - p), reusing target[] for it.
        for (int32_t i = 0; i < row.n_set; i++)
            row.target[i] = (double)dloss[t] * (exp(row.log_q[i]) - row.target[i]);
        const double *dscore = row.target;
        for (int32_t j = 0; j < heads; j++) {
            const double w_tj = w[t * heads + j];
            const float *q_tj = q_index + (t * heads + j) * dim;
            double dw = 0.0;
            memset(dq_acc, 0, (size_t)dim * sizeof(double));
            for (int32_t i = 0; i < row.n_set; i++) {
                const double dot = row.qk_dot[(int64_t)i * heads + j];
                if (dot <= 0.0)
                    continue; // the ReLU is closed: no gradient through this (head, key)
                dw += dscore[i] * dot;
                const double g = dscore[i] * w_tj;
                const float *k_s = k_index + (int64_t)row.keys[i] * dim;
                double *dk_s = dsa_ref_key_accumulator_row(&dk_acc, row.keys[i]);
                for (int32_t c = 0; c < dim; c++) {
                    dq_acc[c] += g * (double)k_s[c];
                    dk_s[c] += g * (double)q_tj[c];
                }
            }
            dweights[t * heads + j] = (float)dw;
            for (int32_t c = 0; c < dim; c++)
                dq[(t * heads + j) * dim + c] = (float)dq_acc[c];
        }
    }
    dsa_ref_key_accumulator_flush(&dk_acc, dk_index, dim);
    free(dq_acc);
    loss_row_free(&row);
    return DSARL_OK;
}
