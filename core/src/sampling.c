/* sampling.c: temperature, top-k and top-p filtering of one logits row (vLLM's order and tie rules). */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include "dsarl/sampling.h"

// a ranks before b: larger logit first, the lower id first among equals (so ties resolve the same everywhere).
static int ranks_before(const float *row, int32_t a, int32_t b)
{
    return row[a] > row[b] || (row[a] == row[b] && a < b);
}

// Stable bottom-up merge sort of ids by rank (qsort has no context argument in C11).
static void sort_by_rank(const float *row, int32_t *ids, int32_t *tmp, int64_t n)
{
    for (int64_t width = 1; width < n; width *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * width) {
            int64_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            int64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = ranks_before(row, ids[j], ids[i]) ? ids[j++] : ids[i++];
            while (i < mid)
                tmp[k++] = ids[i++];
            while (j < hi)
                tmp[k++] = ids[j++];
        }
        memcpy(ids, tmp, (size_t)n * sizeof(int32_t));
    }
}

void dsarl_sampling_filter_row(float *row, int64_t V, float temperature, int32_t top_k, float top_p, int32_t *order,
                               int32_t *scratch)
{
    if (temperature <= 0.0f)
        return; // greedy: the argmax of the raw logits, scored under softmax(raw logits)
    if (temperature != 1.0f)
        for (int64_t v = 0; v < V; v++)
            row[v] /= temperature;
    bool use_k = top_k > 0 && top_k < V, use_p = top_p < 1.0f;
    if (!use_k && !use_p)
        return;
    for (int64_t v = 0; v < V; v++)
        order[v] = (int32_t)v;
    sort_by_rank(row, order, scratch, V);
    int64_t kept = V;
    if (use_k) { // vLLM keeps every id whose logit reaches the k-th largest (ties at the boundary survive)
        float kth = row[order[top_k - 1]];
        for (kept = top_k; kept < V && row[order[kept]] >= kth; kept++)
            ;
        for (int64_t r = kept; r < V; r++)
            row[order[r]] = -INFINITY;
    }
    if (use_p) {
        // vLLM drops ids whose ascending cumulative probability is <= 1 - top_p: equivalently, walking from the
        // most likely, an id is dropped once the mass ranked above it has reached top_p
        double max = row[order[0]], z = 0.0, above = 0.0;
        for (int64_t r = 0; r < kept; r++)
            z += exp((double)row[order[r]] - max);
        for (int64_t r = 0; r < kept; r++) {
            double prob = exp((double)row[order[r]] - max) / z;
            if (r > 0 && above >= (double)top_p)
                row[order[r]] = -INFINITY;
            above += prob;
        }
    }
}
