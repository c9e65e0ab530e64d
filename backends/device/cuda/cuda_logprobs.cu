/* cuda_logprobs.cu: per-token log-probabilities of the target tokens over the vocabulary, and their backward.
 * One block per row; the log-sum-exp is two fp32 passes over the row (max, then sum of exp), so no (T, V)
 * buffer beyond the caller's logits and dlogits is ever made. */
#include <math.h>
#include "cuda_common.cuh"

#define LOGPROBS_THREADS 512

static __device__ float row_logsumexp(const float *row, int64_t V)
{
    float m = -INFINITY;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
        m = fmaxf(m, row[v]);
    m = block_max(m);
    float s = 0.0f;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
        s += expf(row[v] - m);
    return m + logf(block_sum(s));
}

static __global__ void logprobs_forward_kernel(float *logprobs, const float *logits, const int32_t *targets, int64_t T,
                                               int64_t V, int *flag)
{
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        int32_t y = targets[t];
        if (y >= V) {
            if (threadIdx.x == 0)
                atomicCAS(flag, 0, (int)(t + 1));
            continue;
        }
        if (y < 0) { /* ignored position */
            if (threadIdx.x == 0)
                logprobs[t] = 0.0f;
            continue;
        }
        const float *row = logits + t * V;
        float lse = row_logsumexp(row, V);
        if (threadIdx.x == 0)
            logprobs[t] = row[y] - lse;
    }
}

// d logp_y / d z_v = [v == y] - softmax(z)_v, times dlogprobs[t]
static __global__ void logprobs_backward_kernel(float *dlogits, const float *dlogprobs, const float *logits,
                                                const int32_t *targets, int64_t T, int64_t V)
{
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        int32_t y = targets[t];
        float *drow = dlogits + t * V;
        if (y < 0) {
            for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
                drow[v] = 0.0f;
            continue;
        }
        const float *row = logits + t * V;
        float lse = row_logsumexp(row, V), g = dlogprobs[t];
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
            drow[v] = -g * expf(row[v] - lse) + (v == y ? g : 0.0f);
    }
}

int cuda_logprobs_forward(dsarl_device *dev, float *logprobs, const float *logits, const int32_t *targets,
                          int64_t T, int64_t V, dsarl_error *err)
{
    if (T <= 0)
        return DSARL_OK;
    logprobs_forward_kernel<<<(unsigned int)(T < 65535 ? T : 65535), LOGPROBS_THREADS, 0, CUDA_STREAM(dev)>>>(
        logprobs, logits, targets, T, V, dev->flag);
    cudaCheckLaunch("logprobs_forward", err);
    int bad = 0;
    cudaCheck(cudaMemcpyAsync(&bad, dev->flag, sizeof(int), cudaMemcpyDeviceToHost, CUDA_STREAM(dev)), err);
    DSARL_TRY(cuda_comm_wait(dev, dev->compute, err)); // watched: collectives may be queued before it
    if (bad) {
        cudaCheck(cudaMemsetAsync(dev->flag, 0, sizeof(int), CUDA_STREAM(dev)), err);
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cuda: the target id at position %d is outside the "
                          "vocabulary [0, %lld)", bad - 1, (long long)V);
    }
    return DSARL_OK;
}

int cuda_logprobs_backward(dsarl_device *dev, float *dlogits, const float *dlogprobs, const float *logits,
                           const int32_t *targets, int64_t T, int64_t V, dsarl_error *err)
{
    if (T <= 0)
        return DSARL_OK;
    logprobs_backward_kernel<<<(unsigned int)(T < 65535 ? T : 65535), LOGPROBS_THREADS, 0, CUDA_STREAM(dev)>>>(
        dlogits, dlogprobs, logits, targets, T, V);
    cudaCheckLaunch("logprobs_backward", err);
    return DSARL_OK;
}
