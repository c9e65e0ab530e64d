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

/* ---- ABI 1.5 sample_filtered: dsarl_sampling_filter_row's distribution, drawn and scored in one kernel ---------
 * One block per row. The row is divided by the temperature (the same float division as the CPU), then:
 *   top-k: the k-th largest value (duplicates counted) is found by bisecting the order-preserving 32-bit keys of
 *     the values (count of keys >= mid), and every id below it is removed: the CPU's set exactly.
 *   top-p: the cut lies inside one value level u, the one with mass(> u) < top_p <= mass(>= u), found by bisecting
 *     the keys on mass(> key); ids above u stay, ids below go, and the c-th id of level u (ascending id) stays when
 *     it is the most likely id or mass(> u) + c * p(u) < top_p, the CPU's walk in rank order. The masses are double
 *     sums in another order than the CPU's, so a row whose cumulative mass lands within rounding of top_p may keep
 *     one id more or less there; anything else is the CPU's set.
 * Then the draw (inverse CDF in id order, as sample_kernel above, at temperature 1 on the filtered row, or the
 * argmax when greedy) and the log-softmax at the drawn id. */

// Monotone map of a float to uint32 (-inf lowest, +inf highest; NaN never occurs in logits).
static __device__ uint32_t order_key(float x)
{
    uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Block sums of one double and one integer per thread (blockDim.x == SAMPLE_THREADS); every thread gets the totals.
static __device__ void block_sum(double *d, int64_t *c, double *sd, int64_t *sc)
{
    int tid = threadIdx.x;
    sd[tid] = *d, sc[tid] = *c;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s)
            sd[tid] += sd[tid + s], sc[tid] += sc[tid + s];
        __syncthreads();
    }
    *d = sd[0], *c = sc[0];
    __syncthreads();
}

static __global__ void sample_filtered_kernel(int32_t *tokens, float *logprobs, float *logits, int64_t T, int64_t V,
                                              float temperature, int32_t top_k, float top_p, uint64_t seed,
                                              const uint64_t *streams)
{
    __shared__ double sd[SAMPLE_THREADS];
    __shared__ int64_t sc[SAMPLE_THREADS];
    __shared__ float best_val[SAMPLE_THREADS];
    __shared__ int64_t best_idx[SAMPLE_THREADS];
    int tid = threadIdx.x;
    int64_t chunk = (V + blockDim.x - 1) / blockDim.x, lo = tid * chunk, hi = lo + chunk < V ? lo + chunk : V;
    for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
        float *row = logits + t * V;
        bool greedy = temperature <= 0.0f;
        if (!greedy && temperature != 1.0f)
            for (int64_t v = lo; v < hi; v++)
                row[v] /= temperature;
        __syncthreads();
        // argmax, ties to the lowest id (each thread's chunk in order, then the lower chunk)
        float bv = -INFINITY;
        int64_t bi = -1;
        for (int64_t v = lo; v < hi; v++)
            if (bi < 0 || row[v] > bv)
                bv = row[v], bi = v;
        best_val[tid] = bv, best_idx[tid] = bi;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if (tid < s) {
                int64_t oi = best_idx[tid + s];
                float ov = best_val[tid + s];
                if (oi >= 0 && (best_idx[tid] < 0 || ov > best_val[tid] || (ov == best_val[tid] && oi < best_idx[tid])))
                    best_val[tid] = ov, best_idx[tid] = oi;
            }
            __syncthreads();
        }
        int64_t best = best_idx[0];
        float max_logit = best_val[0];
        __syncthreads();
        bool use_k = !greedy && top_k > 0 && top_k < V, use_p = !greedy && top_p < 1.0f;
        if (use_k) { // the largest key whose count of keys >= it reaches top_k is the k-th largest value's
            uint32_t lo_key = 0, hi_key = 0xFFFFFFFFu;
            while (lo_key < hi_key) {
                uint32_t mid = lo_key + (uint32_t)(((uint64_t)hi_key - lo_key + 1) / 2);
                int64_t c = 0;
                double unused = 0.0;
                for (int64_t v = lo; v < hi; v++)
                    c += order_key(row[v]) >= mid;
                block_sum(&unused, &c, sd, sc);
                if (c >= top_k)
                    lo_key = mid;
                else
                    hi_key = mid - 1;
            }
            for (int64_t v = lo; v < hi; v++)
                if (order_key(row[v]) < lo_key)
                    row[v] = -INFINITY;
            __syncthreads();
        }
        if (use_p) {
            double z = 0.0;
            int64_t unused_c = 0;
            for (int64_t v = lo; v < hi; v++)
                z += exp((double)row[v] - max_logit);
            block_sum(&z, &unused_c, sd, sc);
            // the smallest key with mass(> key) < top_p is the key of the cut's level u
            uint32_t lo_key = 0, hi_key = order_key(max_logit);
            while (lo_key < hi_key) {
                uint32_t mid = lo_key + (hi_key - lo_key) / 2;
                double mass = 0.0;
                int64_t c = 0;
                for (int64_t v = lo; v < hi; v++)
                    if (order_key(row[v]) > mid)
                        mass += exp((double)row[v] - max_logit);
                block_sum(&mass, &c, sd, sc);
                if (mass / z < (double)top_p)
                    hi_key = mid;
                else
                    lo_key = mid + 1;
            }
            uint32_t level = lo_key;
            double above = 0.0, p_level = 0.0;
            int64_t mine = 0; // ids of this thread's chunk at the level
            for (int64_t v = lo; v < hi; v++) {
                uint32_t key = order_key(row[v]);
                if (key > level)
                    above += exp((double)row[v] - max_logit);
                else if (key == level)
                    mine++, p_level = exp((double)row[v] - max_logit);
            }
            sc[tid] = mine;
            __syncthreads();
            if (tid == 0) { // exclusive prefix of the level's counts over the chunks
                int64_t run = 0;
                for (int i = 0; i < (int)blockDim.x; i++) {
                    int64_t n = sc[i];
                    sc[i] = run, run += n;
                }
            }
            __syncthreads();
            int64_t before = sc[tid];
            __syncthreads();
            double p_any = p_level;
            block_sum(&above, &mine, sd, sc); // totals: mass above the level; p_level from any thread holding it
            sd[tid] = p_any;
            __syncthreads();
            for (int s = blockDim.x / 2; s > 0; s >>= 1) {
                if (tid < s)
                    sd[tid] = sd[tid] > sd[tid + s] ? sd[tid] : sd[tid + s];
                __syncthreads();
            }
            p_level = sd[0] / z, above /= z;
            __syncthreads();
            for (int64_t v = lo; v < hi; v++) {
                uint32_t key = order_key(row[v]);
                if (key < level)
                    row[v] = -INFINITY;
                else if (key == level) {
                    bool first = v == best && key == order_key(max_logit);
                    if (!first && above + (double)before * p_level >= (double)top_p)
                        row[v] = -INFINITY;
                    before++;
                }
            }
            __syncthreads();
        }
        // the draw: argmax when greedy, else the inverse CDF of softmax(row) at the row's Philox uniform
        double s = 0.0;
        int64_t unused_c = 0;
        for (int64_t v = lo; v < hi; v++)
            s += exp((double)row[v] - max_logit);
        double chunk_s = s;
        block_sum(&s, &unused_c, sd, sc);
        sd[tid] = chunk_s; // chunk sums again, for the scan of thread 0
        __syncthreads();
        if (tid == 0) {
            int64_t pick = best;
            if (!greedy) {
                double target = (double)philox_first_uniform(seed, streams[t]) * s, acc = 0.0;
                pick = V - 1;
                for (int i = 0; i < (int)blockDim.x; i++) {
                    if (acc + sd[i] > target) {
                        int64_t clo = i * chunk, chi = clo + chunk < V ? clo + chunk : V;
                        for (int64_t v = clo; v < chi; v++) {
                            acc += exp((double)row[v] - max_logit);
                            if (acc > target) {
                                pick = v;
                                break;
                            }
                        }
                        break;
                    }
                    acc += sd[i];
                }
            }
            tokens[t] = (int32_t)pick;
            logprobs[t] = (float)((double)row[pick] - ((double)max_logit + log(s)));
        }
        __syncthreads();
    }
}

int cuda_sample_filtered(dsarl_device *dev, int32_t *tokens, float *logprobs, float *logits, int64_t T, int64_t V,
                         float temperature, int32_t top_k, float top_p, uint64_t seed, const uint64_t *streams,
                         dsarl_error *err)
{
    if (V < 1 || V > INT32_MAX)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cuda: sample_filtered needs a vocabulary of 1 to %d ids, got "
                          "V = %lld", INT32_MAX, (long long)V);
    if (T <= 0)
        return DSARL_OK;
    if (!streams)
        return DSARL_FAIL(err, DSARL_E_INVALID, "device cuda: sample_filtered needs one Philox stream per row");
    void *dev_streams = NULL; // the streams ride in the device's scratch, uploaded in queue order
    DSARL_TRY(cuda_scratch(dev, (size_t)T * sizeof(uint64_t), &dev_streams, err));
    DSARL_TRY(cuda_copy(dev, dev_streams, streams, (size_t)T * sizeof(uint64_t), DSARL_COPY_HOST_TO_DEVICE, err));
    sample_filtered_kernel<<<(unsigned int)(T < 65535 ? T : 65535), SAMPLE_THREADS, 0, CUDA_STREAM(dev)>>>(
        tokens, logprobs, logits, T, V, temperature, top_k, top_p, seed, (const uint64_t *)dev_streams);
    cudaCheckLaunch("sample_filtered", err);
    return DSARL_OK;
}
