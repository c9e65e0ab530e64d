/* Lightning-indexer scores and top-k selection (glm5_dsa.md sections 2.5-2.6).
 *
 *   I(t,s) = sum_j weights[t,j] * relu(q[t,j,:] . k[s,:])   for s in [key_start[t], key_end[t])
 *
 * The weights already carry n_heads^-1/2 * head_dim^-1/2 (DeepSeek Indexer.forward, Megatron
 * DSAIndexer.forward_before_topk). The ReLU acts on the raw q.k before weighting, and weights may be negative, so
 * scores may be negative. The k = min(topk, eligible) best keys are kept with a bounded min-heap and written in
 * descending score order, ties broken toward the lower key index (Megatron test_dsa_native_parity.py
 * test_cudnn_indexer_topk_tie_break_prefers_lower_indices); the remaining slots hold -1 and score -inf (Megatron
 * fused_qk_topk_naive: masked_fill(topk_scores == -inf, -1)). Ties are decided on the double scores. */
#include <math.h>
#include <stdlib.h>
#include "dsa_reference.h"

typedef struct scored_key {
    double score;
    int32_t key;
} scored_key;

/* True when a ranks strictly before b: higher score, or equal score and lower key index. */
static int ranks_before(scored_key a, scored_key b)
{
    return a.score > b.score || (a.score == b.score && a.key < b.key);
}

/* Restores the heap property below slot i of a min-heap whose root is the worst-ranked kept key. */
static void sift_down(scored_key *heap, int32_t n, int32_t i)
{
    for (;;) {
        int32_t worst = i, left = 2 * i + 1, right = 2 * i + 2;
        if (left < n && ranks_before(heap[worst], heap[left]))
            worst = left;
        if (right < n && ranks_before(heap[worst], heap[right]))
            worst = right;
        if (worst == i)
            return;
        scored_key tmp = heap[i];
        heap[i] = heap[worst];
        heap[worst] = tmp;
        i = worst;
    }
}

/* Moves slot i up while it ranks below its parent (it is worse, so it belongs nearer the root). */
static void sift_up(scored_key *heap, int32_t i)
{
    while (i > 0) {
        int32_t parent = (i - 1) / 2;
        if (!ranks_before(heap[parent], heap[i]))
            return;
        scored_key tmp = heap[i];
        heap[i] = heap[parent];
        heap[parent] = tmp;
        i = parent;
    }
}

/* I(t,s) for one query row and one key, in double. */
static double indexer_score(const float *q_row, const float *weights_row, const float *k_row, int32_t n_heads,
                            int32_t head_dim)
{
    double score = 0.0;
    for (int32_t j = 0; j < n_heads; j++) {
        double dot = dsa_ref_dot(q_row + (int64_t)j * head_dim, k_row, head_dim);
        if (dot > 0.0)
            score += (double)weights_row[j] * dot;
    }
    return score;
}

int dsa_reference_indexer_topk(dsarl_dsa_context *ctx, const dsarl_dsa_batch *batch, const dsarl_dsa_indexer_inputs *in,
                               int32_t topk, int32_t *indices, float *scores, dsarl_error *err)
{
    DSARL_TRY(dsa_ref_check_batch("indexer_topk", batch, err));
    DSARL_TRY(dsa_ref_check_indexer("indexer_topk", batch, in, err));
    if (topk <= 0 || (batch->n_queries > 0 && indices == NULL))
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "dsa reference indexer_topk: topk = %d must be positive and indices (Tq, topk) set", topk);
    const float *q = in->q;       // (Tq, n_heads, head_dim)
    const float *k = in->k;       // (Tk, head_dim)
    const float *w = in->weights; // (Tq, n_heads)
    scored_key *heap = malloc((size_t)topk * sizeof(*heap));
    if (heap == NULL)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsa reference indexer_topk: cannot allocate a heap of %d keys", topk);

    for (int64_t t = 0; t < batch->n_queries; t++) {
        const float *q_row = q + t * in->n_heads * in->head_dim;
        const float *w_row = w + t * in->n_heads;
        int32_t kept = 0;
        for (int32_t s = batch->key_start[t]; s < batch->key_end[t]; s++) {
            scored_key cand = {indexer_score(q_row, w_row, k + (int64_t)s * in->head_dim, in->n_heads, in->head_dim),
                               s};
            if (kept < topk) {
                heap[kept] = cand;
                sift_up(heap, kept++);
            } else if (ranks_before(cand, heap[0])) {
                heap[0] = cand;
                sift_down(heap, kept, 0);
            }
        }
        // Popping the worst key into the last open slot leaves the kept keys in descending order.
        int32_t *idx_row = indices + t * topk;
        float *score_row = scores != NULL ? scores + t * topk : NULL;
        for (int32_t slot = kept - 1; slot >= 0; slot--) {
            idx_row[slot] = heap[0].key;
            if (score_row != NULL)
                score_row[slot] = (float)heap[0].score;
            heap[0] = heap[slot];
            sift_down(heap, slot, 0);
        }
        for (int32_t slot = kept; slot < topk; slot++) {
            idx_row[slot] = -1;
            if (score_row != NULL)
                score_row[slot] = -INFINITY;
        }
    }
    free(heap);
    return DSARL_OK;
}
