/* cuda_sample.cu: token sampling from softmax(logits / temperature). Row t draws one uniform from the Philox
 * stream (seed, stream + t) (dsarl/rng.h: word 0 of block 0, (word >> 8) * 2^-24), exactly the CPU device's draw,
 * and inverts the CDF: each thread sums exp over a contiguous chunk of the vocabulary in double, the chunk holding
 * the target is found from the prefix of chunk sums, and its owner scans it. temperature <= 0 is the argmax
 * (ties to the lowest id). Top-p / top-k filtering is the generation engine's job (not in device.h yet). */
#include <math.h>
#include "cuda_common.cuh"

#define SAMPLE_THREADS 256

static __device__ float philox_first_uniform(uint64_t seed, uint64_t stream)
{
    uint32_t c0 = 0, c1 = 0, c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0, hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    return (float)(c0 >> 8) * 0x1p-24f;
}

static __global__ void sample_kernel(int32_t *tokens, const float *logits, int64_t T, int64_t V, float temperature,
                                     uint64_t seed, uint64_t stream)
{
    __shared__ float best_val[SAMPLE_THREADS];
    __shared__ int64_t best_idx[SAMPLE_THREADS];
    __shared__ double chunk_sum[SAMPLE_THREADS];
    int tid = threadIdx.x;
    int64_t chunk = (V + blockDim.x - 1) / blockDim.x, lo = tid * chunk, hi = lo + chunk < V ? lo + chunk : V;
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const float *row = logits + t * V;
        // argmax, ties to the lowest id: each thread scans its chunk in order, then the lower chunk wins ties
        float bv = -INFINITY;
        int64_t bi = -1;
        for (int64_t v = lo; v < hi; v++)
            if (bi < 0 || row[v] > bv) {
                bv = row[v];
                bi = v;
            }
        best_val[tid] = bv;
        best_idx[tid] = bi;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if (tid < s) {
                int64_t oi = best_idx[tid + s];
                float ov = best_val[tid + s];
                if (oi >= 0 && (best_idx[tid] < 0 || ov > best_val[tid] ||
                                (ov == best_val[tid] && oi < best_idx[tid]))) {
                    best_val[tid] = ov;
                    best_idx[tid] = oi;
                }
            }
            __syncthreads();
        }
        int64_t best = best_idx[0];
        float max_logit = best_val[0];
        if (temperature <= 0.0f) {
            if (tid == 0)
                tokens[t] = (int32_t)best;
            __syncthreads();
            continue;
        }
        double s = 0.0;
        for (int64_t v = lo; v < hi; v++)
            s += exp(((double)row[v] - max_logit) / temperature);
        chunk_sum[tid] = s;
        __syncthreads();
        if (tid == 0) {
            double z = 0.0;
            for (int i = 0; i < (int)blockDim.x; i++)
                z += chunk_sum[i];
            double target = (double)philox_first_uniform(seed, stream + (uint64_t)t) * z, acc = 0.0;
            int64_t pick = V - 1;
            for (int i = 0; i < (int)blockDim.x && pick == V - 1; i++) {
                if (acc + chunk_sum[i] > target) { /* the target lies in chunk i: scan it */
                    int64_t clo = i * chunk, chi = clo + chunk < V ? clo + chunk : V;
                    for (int64_t v = clo; v < chi; v++) {
                        acc += exp(((double)row[v] - max_logit) / temperature);
                        if (acc > target) {
                            pick = v;
                            break;
                        }
                    }
                    break;
                }
                acc += chunk_sum[i];
            }
            tokens[t] = (int32_t)pick;
        }
        __syncthreads();
    }
}

int cuda_sample_tokens(dsarl_device *dev, int32_t *tokens, const float *logits, int64_t T, int64_t V,
                       float temperature, uint64_t seed, uint64_t stream, dsarl_error *err)
{
    if (V < 1)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cuda: sample_tokens needs a vocabulary, got V = %lld",
                          (long long)V);
    if (T <= 0)
        return DSARL_OK;
    sample_kernel<<<(unsigned int)(T < 65535 ? T : 65535), SAMPLE_THREADS, 0, CUDA_STREAM(dev)>>>(
        tokens, logits, T, V, temperature, seed, stream);
    cudaCheckLaunch("sample_tokens", err);
    return DSARL_OK;
}
