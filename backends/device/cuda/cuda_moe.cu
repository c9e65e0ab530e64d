/* cuda_moe.cu: the GLM-5 / DeepSeek-V3 "noaux_tc" router (sigmoid scores, bias for choosing only, group-limited
 * top-k) and its backward. One block per token: the sigmoids are computed in parallel, then one thread makes the
 * selection in exactly the CPU device's order (ties to the lower index), so both devices pick the same experts
 * from the same logits. E is at most a few hundred, so the serial part is short.
 *
 * The padded grouping of routed rows by expert (moe_group_padded) runs on the device too, so a decode step's MoE
 * layers need no host round trip: one block per expert scans the (token, slot) pairs in order, and a block-wide
 * prefix count of its own expert's pairs gives each pair its row, the CPU device's order exactly. */
#include <math.h>
#include "cuda_common.cuh"

// Index of the largest value among n candidates not yet taken; ties go to the lower index.
static __device__ int argmax_untaken(const float *v, const unsigned char *taken, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best]))
            best = i;
    return best < 0 ? 0 : best;
}

// Dynamic shared memory: choice (E) floats, group_score (n_group) floats, taken (max(E, n_group)) bytes,
// group_kept (n_group) bytes.
static __global__ void moe_route_forward_kernel(int32_t *indices, float *weights, float *probs, const float *logits,
                                                const float *bias, int64_t T, int E, int top_k, int n_group,
                                                int topk_group, int norm_topk_prob, float scaling)
{
    extern __shared__ float shared[];
    float *choice = shared, *group_score = shared + E;
    unsigned char *taken = (unsigned char *)(group_score + n_group);
    unsigned char *group_kept = taken + (E > n_group ? E : n_group);
    int group_size = E / n_group;
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const float *lrow = logits + t * E;
        float *prow = probs + t * E;
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            float s = 1.0f / (1.0f + expf(-lrow[e]));
            prow[e] = s;
            choice[e] = s + (bias ? bias[e] : 0.0f);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            // group score = sum of the two best choice values in the group (one when a group has one expert)
            for (int g = 0; g < n_group; g++) {
                const float *gv = choice + g * group_size;
                for (int i = 0; i < group_size; i++)
                    taken[i] = 0;
                int a = argmax_untaken(gv, taken, group_size);
                taken[a] = 1;
                float s = gv[a];
                if (group_size > 1)
                    s += gv[argmax_untaken(gv, taken, group_size)];
                group_score[g] = s;
            }
            for (int g = 0; g < n_group; g++)
                taken[g] = group_kept[g] = 0;
            for (int i = 0; i < topk_group; i++) {
                int g = argmax_untaken(group_score, taken, n_group);
                taken[g] = 1;
                group_kept[g] = 1;
            }
            for (int e = 0; e < E; e++)
                taken[e] = !group_kept[e / group_size];
            float sum = 0.0f;
            for (int k = 0; k < top_k; k++) {
                int e = argmax_untaken(choice, taken, E);
                taken[e] = 1;
                indices[t * top_k + k] = e;
                weights[t * top_k + k] = prow[e];
                sum += prow[e];
            }
            float denom = sum + 1e-20f;
            for (int k = 0; k < top_k; k++) {
                float w = weights[t * top_k + k];
                if (norm_topk_prob)
                    w /= denom;
                weights[t * top_k + k] = w * scaling;
            }
        }
        __syncthreads();
    }
}

int cuda_moe_route_forward(dsarl_device *dev, int32_t *indices, float *weights, float *probs, const float *logits,
                           const float *bias, int64_t T, int64_t E, int32_t top_k, int32_t n_group,
                           int32_t topk_group, bool norm_topk_prob, float scaling, dsarl_error *err)
{
    if (n_group < 1 || E % n_group || topk_group < 1 || topk_group > n_group || top_k < 1 ||
        top_k > (E / n_group) * topk_group || E > 16384)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cuda: moe_route needs n_group dividing n_routed_experts "
                          "(%lld, at most 16384), 1 <= topk_group <= n_group and num_experts_per_tok <= experts in "
                          "kept groups; got n_group %d, topk_group %d, top_k %d", (long long)E, n_group, topk_group,
                          top_k);
    if (T <= 0)
        return DSARL_OK;
    size_t shared = (size_t)(E + n_group) * sizeof(float) + (size_t)(E > n_group ? E : n_group) + (size_t)n_group;
    if (shared > 48 * 1024)
        cudaCheck(cudaFuncSetAttribute(moe_route_forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)shared), err);
    moe_route_forward_kernel<<<(unsigned int)(T < 65535 ? T : 65535), 128, shared, CUDA_STREAM(dev)>>>(
        indices, weights, probs, logits, bias, T, (int)E, top_k, n_group, topk_group, norm_topk_prob ? 1 : 0,
        scaling);
    cudaCheckLaunch("moe_route_forward", err);
    return DSARL_OK;
}

// One thread per token: dlogits row zeroed, then the selected experts' gradients (w_k = scaling s_k / denom, the
// denominator differentiated too, as in transformers).
static __global__ void moe_route_backward_kernel(float *dlogits, const float *dweights, const int32_t *indices,
                                                 const float *probs, int64_t T, int64_t E, int top_k,
                                                 int norm_topk_prob, float scaling)
{
    GRID_STRIDE(t, T) {
        for (int64_t e = 0; e < E; e++)
            dlogits[t * E + e] = 0.0f;
        const int32_t *idx = indices + t * top_k;
        const float *dw = dweights + t * top_k, *prow = probs + t * E;
        double sum = 0.0, dot = 0.0;
        for (int k = 0; k < top_k; k++) {
            sum += prow[idx[k]];
            dot += (double)dw[k] * prow[idx[k]];
        }
        double denom = sum + 1e-20;
        for (int k = 0; k < top_k; k++) {
            double s = prow[idx[k]];
            double ds = norm_topk_prob ? scaling * (dw[k] / denom - dot / (denom * denom)) : scaling * dw[k];
            dlogits[t * E + idx[k]] += (float)(ds * s * (1.0 - s));
        }
    }
}

int cuda_moe_route_backward(dsarl_device *dev, float *dlogits, const float *dweights, const int32_t *indices,
                            const float *probs, int64_t T, int64_t E, int32_t top_k, bool norm_topk_prob,
                            float scaling, dsarl_error *err)
{
    if (T <= 0)
        return DSARL_OK;
    moe_route_backward_kernel<<<grid_for(T, 128), 128, 0, CUDA_STREAM(dev)>>>(
        dlogits, dweights, indices, probs, T, E, top_k, norm_topk_prob ? 1 : 0, scaling);
    cudaCheckLaunch("moe_route_backward", err);
    return DSARL_OK;
}


enum { GROUP_THREADS = 256 };

/* One block per expert e (grid-stride over experts): the N = T*top_k indices are read in chunks of the block's
 * width, in order; a pair of expert e takes row e*pad + (its expert's pairs before it), so the rows of a group come
 * in token order whatever the grid. The block of expert 0 also marks pairs whose id is outside [0, E) (slot_inv =
 * -1): no expert's block would. */
static __global__ void moe_group_padded_kernel(int32_t *rows, int32_t *slot, int32_t *slot_inv,
                                               const int32_t *indices, int64_t N, int64_t E, int top_k, int64_t pad)
{
    for (int64_t e = blockIdx.x; e < E; e += gridDim.x) {
        int64_t before = 0; // pairs of expert e in the chunks already scanned
        for (int64_t c0 = 0; c0 < N; c0 += GROUP_THREADS) {
            int64_t i = c0 + threadIdx.x;
            int32_t id = i < N ? indices[i] : -1;
            bool mine = i < N && id == e;
            int total = 0;
            int64_t rank = before + block_exclusive_count(mine, &total);
            if (mine) {
                if (rank < pad) {
                    int64_t r = e * pad + rank;
                    rows[r] = (int32_t)(i / top_k);
                    slot[r] = (int32_t)i;
                    slot_inv[i] = (int32_t)r;
                } else { // past its expert's rows: no row
                    slot_inv[i] = -1;
                }
            } else if (e == 0 && i < N && (id < 0 || id >= E)) {
                slot_inv[i] = -1;
            }
            before += total;
        }
        // the group's unused rows: token r mod T at the zero routing weight (slot N)
        for (int64_t j = (before < pad ? before : pad) + threadIdx.x; j < pad; j += GROUP_THREADS) {
            rows[e * pad + j] = N > 0 ? (int32_t)((e * pad + j) % (N / top_k)) : 0;
            slot[e * pad + j] = (int32_t)N;
        }
    }
}

int cuda_moe_group_padded(dsarl_device *dev, int32_t *rows, int32_t *slot, int32_t *slot_inv,
                          const int32_t *indices, int64_t T, int64_t E, int32_t top_k, int64_t pad, dsarl_error *err)
{
    // only the sizes are checked here; the index values live on the device and are not read back (the call stays
    // free of host syncs, so it can be captured into a graph): an id outside [0, E) gets slot_inv = -1 and no row
    if (T < 0 || E < 1 || top_k < 1 || pad < 1 || E > INT32_MAX / pad || T > INT32_MAX / top_k)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cuda: moe_group_padded needs T >= 0, E, top_k and pad >= 1, "
                          "with E*pad and T*top_k at most %d; got T %lld, E %lld, top_k %d, pad %lld", INT32_MAX,
                          (long long)T, (long long)E, top_k, (long long)pad);
    unsigned int blocks = (unsigned int)(E < 65535 ? E : 65535);
    moe_group_padded_kernel<<<blocks, GROUP_THREADS, 0, CUDA_STREAM(dev)>>>(rows, slot, slot_inv, indices,
                                                                            T * top_k, E, top_k, pad);
    cudaCheckLaunch("moe_group_padded", err);
    return DSARL_OK;
}
