/* sdpa_graphs.c: the three cuDNN graphs this backend runs, spelled exactly as cuDNN's fused-attention engines
 * pattern-match them on sm_90 with 9.19 (cudnn-frontend's
 * CompositeSDPANode / CompositeSDPABackwardNode emit the same ops):
 * - headwise forward: S = (Q K^T) * scale [+ bias]; causal select (-inf above the diagonal); softmax with
 *   Stats = max + log(sum exp) (natural-log lse); O = P V with P in bf16.
 * - headwise backward (the deterministic variant: dQ straight from dS K, no fp32 dQ accumulator):
 *   softmax_sum = rowsum(dO * O); P = exp(S - Stats); dV = P^T dO; dS = P * (dO V^T - softmax_sum) * scale;
 *   dK = dS^T Q; dQ = dS K.
 * - absorbed forward: one SDPA_FWD op with page tables of block size 1 over the shared latent pool.
 * Layouts: Q/K/V/O/dX are [B, S, H, d] buffers described as [B, H, S, d] with strides {S H d, d, H d, 1}; K^T and
 * V^T are the same memory with the last two dims (and strides) swapped; Stats [B, H, S, 1] float32. */
#include <math.h>
#include <stdio.h>
#include "graph.h"

#define DIMS(a, b, c, d) ((const int64_t[4]){(a), (b), (c), (d)})

int cdn_headwise_plan(cudnn_dsa *c, const cdn_headwise_shape *s, cdn_plan **out, dsarl_error *err)
{
    char key[192];
    snprintf(key, sizeof key, "headwise %s B=%lld S=%lld H=%lld d=%lld/%lld %s", s->backward ? "bwd" : "fwd",
             (long long)s->batch, (long long)s->seq, (long long)s->heads, (long long)s->d_qk, (long long)s->d_v,
             s->bias ? "causal+topk-bias" : "causal");
    *out = cdn_plan_find(c, key);
    if (*out)
        return DSARL_OK;
    const int64_t B = s->batch, S = s->seq, H = s->heads, dq = s->d_qk, dv = s->d_v;
    const cudnnDataType_t F = CUDNN_DATA_FLOAT, BF = CUDNN_DATA_BFLOAT16, I32 = CUDNN_DATA_INT32,
                          BOOL = CUDNN_DATA_BOOLEAN;
    cdn_graph g;
    cdn_graph_init(&g, err, "%s", key);
    const int64_t *sdims = DIMS(B, H, S, S), *sstr = DIMS(H * S * S, S * S, S, 1);
    const int64_t *rdims = DIMS(B, H, S, 1), *rstr = DIMS(H * S, S, 1, 1);
    const int64_t *one4 = DIMS(1, 1, 1, 1);
    cudnnBackendDescriptor_t q = cdn_tensor(&g, BF, DIMS(B, H, S, dq), DIMS(S * H * dq, dq, H * dq, 1), CDN_Q, 0);
    cudnnBackendDescriptor_t kt = cdn_tensor(&g, BF, DIMS(B, H, dq, S), DIMS(S * H * dq, dq, 1, H * dq), CDN_K, 0);
    cudnnBackendDescriptor_t stats = cdn_tensor(&g, F, rdims, rstr, CDN_STATS, 0);
    cudnnBackendDescriptor_t scale = cdn_tensor(&g, F, one4, one4, CDN_SCALE, CDN_BY_VALUE);
    cudnnBackendDescriptor_t neg_inf = cdn_tensor(&g, F, one4, one4, CDN_NEG_INF, CDN_BY_VALUE);
    cudnnBackendDescriptor_t bias = s->bias ? cdn_tensor(&g, BF, DIMS(B, 1, S, S), DIMS(S * S, S * S, S, 1),
                                                         CDN_BIAS, 0)
                                            : NULL;
    // scores: S = Q K^T * scale [+ bias]
    cudnnBackendDescriptor_t s1 = cdn_tensor(&g, F, sdims, sstr, 0, CDN_VIRTUAL);
    cdn_matmul(&g, q, kt, s1);
    cudnnBackendDescriptor_t s2 = cdn_tensor(&g, F, sdims, sstr, 0, CDN_VIRTUAL);
    cdn_pointwise(&g, CUDNN_POINTWISE_MUL, F, s1, scale, NULL, s2, -1);
    if (bias) {
        cudnnBackendDescriptor_t s3 = cdn_tensor(&g, F, sdims, sstr, 0, CDN_VIRTUAL);
        cdn_pointwise(&g, CUDNN_POINTWISE_ADD, F, s2, bias, NULL, s3, -1);
        s2 = s3;
    }
    if (s->backward) // P = exp(S - Stats), then the causal select (the probe's order, matched by engine 6)
    {
        cudnnBackendDescriptor_t s3 = cdn_tensor(&g, F, sdims, sstr, 0, CDN_VIRTUAL);
        cdn_pointwise(&g, CUDNN_POINTWISE_SUB, F, s2, stats, NULL, s3, -1);
        s2 = s3;
    }
    // causal: keep row >= col, else -inf
    cudnnBackendDescriptor_t row = cdn_tensor(&g, I32, sdims, sstr, 0, CDN_VIRTUAL);
    cdn_pointwise(&g, CUDNN_POINTWISE_GEN_INDEX, F, s2, NULL, NULL, row, 2);
    cudnnBackendDescriptor_t col = cdn_tensor(&g, I32, sdims, sstr, 0, CDN_VIRTUAL);
    cdn_pointwise(&g, CUDNN_POINTWISE_GEN_INDEX, F, s2, NULL, NULL, col, 3);
    cudnnBackendDescriptor_t keep = cdn_tensor(&g, BOOL, sdims, sstr, 0, CDN_VIRTUAL);
    cdn_pointwise(&g, CUDNN_POINTWISE_CMP_GE, BOOL, row, col, NULL, keep, -1);
    cudnnBackendDescriptor_t masked = cdn_tensor(&g, F, sdims, sstr, 0, CDN_VIRTUAL);
    cdn_pointwise(&g, CUDNN_POINTWISE_BINARY_SELECT, F, s2, neg_inf, keep, masked, -1);

    if (!s->backward) {
        cudnnBackendDescriptor_t v = cdn_tensor(&g, BF, DIMS(B, H, S, dv), DIMS(S * H * dv, dv, H * dv, 1), CDN_V,
                                                0);
        cudnnBackendDescriptor_t o = cdn_tensor(&g, BF, DIMS(B, H, S, dv), DIMS(S * H * dv, dv, H * dv, 1), CDN_O,
                                                0);
        cudnnBackendDescriptor_t m = cdn_tensor(&g, F, rdims, rstr, 0, CDN_VIRTUAL);
        cdn_reduction(&g, CUDNN_REDUCE_TENSOR_MAX, masked, m);
        cudnnBackendDescriptor_t d = cdn_tensor(&g, F, sdims, sstr, 0, CDN_VIRTUAL);
        cdn_pointwise(&g, CUDNN_POINTWISE_SUB, F, masked, m, NULL, d, -1);
        cudnnBackendDescriptor_t e = cdn_tensor(&g, F, sdims, sstr, 0, CDN_VIRTUAL);
        cdn_pointwise(&g, CUDNN_POINTWISE_EXP, F, d, NULL, NULL, e, -1);
        cudnnBackendDescriptor_t z = cdn_tensor(&g, F, rdims, rstr, 0, CDN_VIRTUAL);
        cdn_reduction(&g, CUDNN_REDUCE_TENSOR_ADD, e, z);
        cudnnBackendDescriptor_t log_z = cdn_tensor(&g, F, rdims, rstr, 0, CDN_VIRTUAL);
        cdn_pointwise(&g, CUDNN_POINTWISE_LOG, F, z, NULL, NULL, log_z, -1);
        cdn_pointwise(&g, CUDNN_POINTWISE_ADD, F, m, log_z, NULL, stats, -1);
        cudnnBackendDescriptor_t p = cdn_tensor(&g, BF, sdims, sstr, 0, CDN_VIRTUAL);
        cdn_pointwise(&g, CUDNN_POINTWISE_DIV, F, e, z, NULL, p, -1);
        cdn_matmul(&g, p, v, o);
    } else {
        const int64_t *qstr = DIMS(S * H * dq, dq, H * dq, 1), *vstr = DIMS(S * H * dv, dv, H * dv, 1);
        cudnnBackendDescriptor_t vt = cdn_tensor(&g, BF, DIMS(B, H, dv, S), DIMS(S * H * dv, dv, 1, H * dv), CDN_V,
                                                 0);
        cudnnBackendDescriptor_t o = cdn_tensor(&g, BF, DIMS(B, H, S, dv), vstr, CDN_O, 0);
        cudnnBackendDescriptor_t d_o = cdn_tensor(&g, BF, DIMS(B, H, S, dv), vstr, CDN_DO, 0);
        cudnnBackendDescriptor_t dq_t = cdn_tensor(&g, BF, DIMS(B, H, S, dq), qstr, CDN_DQ, 0);
        cudnnBackendDescriptor_t dk_t = cdn_tensor(&g, BF, DIMS(B, H, S, dq), qstr, CDN_DK, 0);
        cudnnBackendDescriptor_t dv_t = cdn_tensor(&g, BF, DIMS(B, H, S, dv), vstr, CDN_DV, 0);
        cudnnBackendDescriptor_t one = cdn_tensor(&g, F, one4, one4, CDN_ONE, CDN_BY_VALUE);
        cudnnBackendDescriptor_t softmax_sum = cdn_tensor(&g, F, rdims, rstr, CDN_SOFTMAX_SUM, 0);
        // softmax_sum = rowsum(dO * O) (strides of the product as the frontend writes them)
        cudnnBackendDescriptor_t t1 = cdn_tensor(&g, F, DIMS(B, H, S, dv), DIMS(H * S * dv, S * dv, H * dv, 1), 0,
                                                 CDN_VIRTUAL);
        cdn_pointwise(&g, CUDNN_POINTWISE_MUL, F, d_o, o, NULL, t1, -1);
        cudnnBackendDescriptor_t t2 = cdn_tensor(&g, F, rdims, rstr, 0, CDN_VIRTUAL);
        cdn_reduction(&g, CUDNN_REDUCE_TENSOR_ADD, t1, t2);
        cdn_pointwise(&g, CUDNN_POINTWISE_MUL, F, t2, one, NULL, softmax_sum, -1);
        // P = exp(masked); dV = P^T dO
        cudnnBackendDescriptor_t p = cdn_tensor(&g, F, sdims, sstr, 0, CDN_VIRTUAL);
        cdn_pointwise(&g, CUDNN_POINTWISE_EXP, F, masked, NULL, NULL, p, -1);
        const int64_t *tdims = DIMS(B, H, S, S), *tstr = DIMS(H * S * S, S * S, 1, S);
        cudnnBackendDescriptor_t pt = cdn_tensor(&g, BF, tdims, tstr, 0, CDN_VIRTUAL);
        cdn_reshape(&g, p, pt);
        cdn_matmul(&g, pt, d_o, dv_t);
        // dS = P * (dO V^T - softmax_sum) * scale
        cudnnBackendDescriptor_t dp = cdn_tensor(&g, F, sdims, sstr, 0, CDN_VIRTUAL);
        cdn_matmul(&g, d_o, vt, dp);
        cudnnBackendDescriptor_t ds1 = cdn_tensor(&g, F, sdims, sstr, 0, CDN_VIRTUAL);
        cdn_pointwise(&g, CUDNN_POINTWISE_SUB, F, dp, softmax_sum, NULL, ds1, -1);
        cudnnBackendDescriptor_t ds2 = cdn_tensor(&g, F, sdims, sstr, 0, CDN_VIRTUAL);
        cdn_pointwise(&g, CUDNN_POINTWISE_MUL, F, ds1, p, NULL, ds2, -1);
        cudnnBackendDescriptor_t ds = cdn_tensor(&g, F, sdims, sstr, 0, CDN_VIRTUAL);
        cdn_pointwise(&g, CUDNN_POINTWISE_MUL, F, ds2, scale, NULL, ds, -1);
        // dK = dS^T Q
        cudnnBackendDescriptor_t dst = cdn_tensor(&g, BF, tdims, tstr, 0, CDN_VIRTUAL);
        cdn_reshape(&g, ds, dst);
        cdn_matmul(&g, dst, q, dk_t);
        // dQ = dS K (K seen through a reshape of K^T, as the frontend does)
        cudnnBackendDescriptor_t k = cdn_tensor(&g, F, DIMS(B, H, S, dq), qstr, 0, CDN_VIRTUAL);
        cdn_reshape(&g, kt, k);
        cdn_matmul(&g, ds, k, dq_t);
    }
    cdn_plan *plan = NULL; // a failure recorded above is reported (and the descriptors freed) here
    DSARL_TRY(cdn_graph_build_plan(c, &g, key, &plan));
    DSARL_TRY(cdn_plan_cache_add(c, plan, err));
    *out = plan;
    return DSARL_OK;
}

int cdn_paged_plan(cudnn_dsa *c, const cdn_paged_shape *s, cdn_plan **out, dsarl_error *err)
{
    char key[192];
    snprintf(key, sizeof key, "paged sparse-MLA fwd T=%lld H=%lld d=%lld/%lld k=%lld pool=%lld",
             (long long)s->tokens, (long long)s->heads, (long long)s->d_qk, (long long)s->d_v, (long long)s->topk,
             (long long)s->pages);
    *out = cdn_plan_find(c, key);
    if (*out)
        return DSARL_OK;
    const int64_t T = s->tokens, H = s->heads, dq = s->d_qk, dv = s->d_v, k = s->topk, N = s->pages;
    const cudnnDataType_t F = CUDNN_DATA_FLOAT, BF = CUDNN_DATA_BFLOAT16, I32 = CUDNN_DATA_INT32;
    const int64_t *one4 = DIMS(1, 1, 1, 1);
    cdn_graph g;
    cdn_graph_init(&g, err, "%s", key);
    // heads as query rows: batch = token, one "head", H query rows of d_qk; pool pages of one row each, V = the first
    // d_v columns of the same 576-wide rows
    cudnnBackendDescriptor_t q = cdn_tensor(&g, BF, DIMS(T, 1, H, dq), DIMS(H * dq, H * dq, dq, 1), CDN_Q, 0);
    cudnnBackendDescriptor_t kp = cdn_tensor(&g, BF, DIMS(N, 1, 1, dq), DIMS(dq, dq, dq, 1), CDN_K, 0);
    cudnnBackendDescriptor_t vp = cdn_tensor(&g, BF, DIMS(N, 1, 1, dv), DIMS(dq, dq, dq, 1), CDN_V, 0);
    cudnnBackendDescriptor_t o = cdn_tensor(&g, BF, DIMS(T, 1, H, dv), DIMS(H * dv, H * dv, dv, 1), CDN_O, 0);
    cudnnBackendDescriptor_t stats = cdn_tensor(&g, F, DIMS(T, 1, H, 1), DIMS(H, H, 1, 1), CDN_STATS, 0);
    cudnnBackendDescriptor_t scale = cdn_tensor(&g, F, one4, one4, CDN_SCALE, CDN_BY_VALUE);
    cudnnBackendDescriptor_t page_k = cdn_tensor(&g, I32, DIMS(T, 1, k, 1), DIMS(k, k, 1, 1), CDN_PAGE_K, 0);
    cudnnBackendDescriptor_t page_v = cdn_tensor(&g, I32, DIMS(T, 1, k, 1), DIMS(k, k, 1, 1), CDN_PAGE_V, 0);
    cudnnBackendDescriptor_t seq_q = cdn_tensor(&g, I32, DIMS(T, 1, 1, 1), DIMS(1, 1, 1, 1), CDN_SEQ_Q, 0);
    cudnnBackendDescriptor_t seq_kv = cdn_tensor(&g, I32, DIMS(T, 1, 1, 1), DIMS(1, 1, 1, 1), CDN_SEQ_KV, 0);
    cudnnBackendDescriptor_t op = cdn_new(&g, CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR);
    const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    cdn_set(&g, op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, D, 1, &q);
    cdn_set(&g, op, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, D, 1, &kp);
    cdn_set(&g, op, CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, D, 1, &vp);
    cdn_set(&g, op, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, D, 1, &o);
    cdn_set(&g, op, CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, D, 1, &stats);
    cdn_set(&g, op, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, D, 1, &scale);
    cdn_set(&g, op, CUDNN_ATTR_OPERATION_SDPA_FWD_PAGE_TABLE_KDESC, D, 1, &page_k);
    cdn_set(&g, op, CUDNN_ATTR_OPERATION_SDPA_FWD_PAGE_TABLE_VDESC, D, 1, &page_v);
    cdn_set(&g, op, CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_QDESC, D, 1, &seq_q);
    cdn_set(&g, op, CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_KVDESC, D, 1, &seq_kv);
    cdn_finalize(&g, op, "the SDPA_FWD operation");
    cdn_add_op(&g, op);
    cdn_plan *plan = NULL; // a failure recorded above is reported (and the descriptors freed) here
    DSARL_TRY(cdn_graph_build_plan(c, &g, key, &plan));
    DSARL_TRY(cdn_plan_cache_add(c, plan, err));
    *out = plan;
    return DSARL_OK;
}
