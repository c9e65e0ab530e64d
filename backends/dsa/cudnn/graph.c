#define _POSIX_C_SOURCE 200809L /* clock_gettime */
/* graph.c: checked descriptor building, plan selection (heuristics, then the first engine config that finalizes),
 * the plan cache and plan execution, over cuDNN's backend API (its call sequence: docs/gpu.md). */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "graph.h"

void cdn_graph_init(cdn_graph *g, dsarl_error *err, const char *fmt, ...)
{
    memset(g, 0, sizeof(*g));
    g->err = err;
    g->next_virtual_uid = 1000;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->name, sizeof g->name, fmt, ap);
    va_end(ap);
}

static void last_error_text(char *buf, size_t n)
{
    buf[0] = '\0';
    cudnnGetLastErrorString(buf, n);
    if (!buf[0])
        snprintf(buf, n, "cuDNN gave no detail; rerun with CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr");
}

int cdn_check_(cdn_graph *g, cudnnStatus_t st, const char *what, const char *file, int line)
{
    if (st == CUDNN_STATUS_SUCCESS)
        return 0;
    if (!g->failed) {
        char last[512];
        last_error_text(last, sizeof last);
        dsarl_error_set(g->err, DSARL_E_DEVICE, file, line, "dsa cudnn: building the %s graph: %s failed: %s (%s)",
                        g->name, what, cudnnGetErrorString(st), last);
        g->failed = 1;
    }
    return -1;
}

void cdn_set_(cdn_graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, const char *name_text,
              cudnnBackendAttributeType_t type, int64_t count, const void *value, const char *file, int line)
{
    if (g->failed || !d)
        return;
    cdn_check_(g, cudnnBackendSetAttribute(d, name, type, count, value), name_text, file, line);
}

cudnnBackendDescriptor_t cdn_new(cdn_graph *g, cudnnBackendDescriptorType_t type)
{
    if (g->failed)
        return NULL;
    if (g->n_descs == CDN_MAX_DESCS) {
        dsarl_error_set(g->err, DSARL_E_INTERNAL, __FILE__, __LINE__,
                        "dsa cudnn: building the %s graph: more than %d descriptors", g->name, CDN_MAX_DESCS);
        g->failed = 1;
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    if (cdn_check(g, cudnnBackendCreateDescriptor(type, &d)))
        return NULL;
    g->descs[g->n_descs++] = d;
    return d;
}

void cdn_finalize(cdn_graph *g, cudnnBackendDescriptor_t d, const char *what)
{
    if (g->failed || !d)
        return;
    cdn_check_(g, cudnnBackendFinalize(d), what, __FILE__, __LINE__);
}

cudnnBackendDescriptor_t cdn_tensor(cdn_graph *g, cudnnDataType_t type, const int64_t dims[4],
                                    const int64_t strides[4], int64_t uid, unsigned flags)
{
    return cdn_tensor_nd(g, type, 4, dims, strides, uid, flags);
}

cudnnBackendDescriptor_t cdn_tensor_nd(cdn_graph *g, cudnnDataType_t type, int rank, const int64_t *dims,
                                       const int64_t *strides, int64_t uid, unsigned flags)
{
    cudnnBackendDescriptor_t t = cdn_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    if (!t)
        return NULL;
    bool is_virtual = (flags & CDN_VIRTUAL) != 0, by_value = (flags & CDN_BY_VALUE) != 0;
    int64_t id = is_virtual ? g->next_virtual_uid++ : uid, alignment = 16;
    cdn_set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    cdn_set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, rank, dims);
    cdn_set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, rank, strides);
    cdn_set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id);
    cdn_set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    cdn_set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value)
        cdn_set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    cdn_finalize(g, t, "a tensor descriptor");
    if (!g->failed && !is_virtual)
        g->uids[g->n_uids++] = uid;
    return g->failed ? NULL : t;
}

void cdn_add_op(cdn_graph *g, cudnnBackendDescriptor_t op)
{
    if (g->failed || !op)
        return;
    if (g->n_ops == CDN_MAX_OPS) {
        dsarl_error_set(g->err, DSARL_E_INTERNAL, __FILE__, __LINE__,
                        "dsa cudnn: building the %s graph: more than %d operations", g->name, CDN_MAX_OPS);
        g->failed = 1;
        return;
    }
    g->ops[g->n_ops++] = op;
}

void cdn_pointwise(cdn_graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t math, cudnnBackendDescriptor_t x,
                   cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis)
{
    cudnnBackendDescriptor_t pw = cdn_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    cdn_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    cdn_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
    if (axis >= 0)
        cdn_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    cdn_finalize(g, pw, "a pointwise descriptor");
    cudnnBackendDescriptor_t op = cdn_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    float one = 1.0f;
    cdn_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    cdn_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b)
        cdn_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    if (t)
        cdn_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    cdn_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    cdn_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    cdn_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    cdn_finalize(g, op, "a pointwise operation");
    cdn_add_op(g, op);
}

void cdn_matmul(cdn_graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c)
{
    cudnnBackendDescriptor_t mm = cdn_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cdn_set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    cdn_finalize(g, mm, "a matmul descriptor");
    cudnnBackendDescriptor_t op = cdn_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    cdn_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    cdn_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    cdn_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    cdn_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
    cdn_finalize(g, op, "a matmul operation");
    cdn_add_op(g, op);
}

void cdn_reduction(cdn_graph *g, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t red = cdn_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cdn_set(g, red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    cdn_set(g, red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    cdn_finalize(g, red, "a reduction descriptor");
    cudnnBackendDescriptor_t op = cdn_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    cdn_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    cdn_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    cdn_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &red);
    cdn_finalize(g, op, "a reduction operation");
    cdn_add_op(g, op);
}

void cdn_reshape(cdn_graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t op = cdn_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    cdn_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    cdn_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    cdn_finalize(g, op, "a reshape operation");
    cdn_add_op(g, op);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void destroy_descs(cudnnBackendDescriptor_t *descs, int n)
{
    for (int i = n - 1; i >= 0; i--)
        if (descs[i])
            cudnnBackendDestroyDescriptor(descs[i]);
}

// Tries the engine configs heuristics mode `mode` offers; the first whose plan finalizes is kept in *plan_out.
static int try_heuristics(cudnn_dsa *c, cdn_graph *g, cudnnBackendDescriptor_t opgraph, cudnnBackendHeurMode_t mode,
                          cudnnBackendDescriptor_t *plan_out, cudnnBackendDescriptor_t *cfg_out, int *n_offered)
{
    cudnnHandle_t handle = (cudnnHandle_t)c->handle;
    cudnnBackendDescriptor_t heur = cdn_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    cdn_set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &opgraph);
    cdn_set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    cdn_finalize(g, heur, "the engine heuristics");
    if (g->failed)
        return -1;
    int64_t n = 0;
    if (cdn_check(g, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                              &n, NULL)))
        return -1;
    *n_offered += (int)n;
    if (n <= 0)
        return 0;
    if (n > 16)
        n = 16;
    cudnnBackendDescriptor_t cfgs[16] = {0};
    for (int64_t i = 0; i < n; i++)
        if (cdn_check(g, cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[i]))) {
            destroy_descs(cfgs, (int)i);
            return -1;
        }
    int64_t got = 0;
    if (cdn_check(g, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n,
                                              &got, cfgs))) {
        destroy_descs(cfgs, (int)n);
        return -1;
    }
    for (int64_t i = 0; i < got && !*plan_out; i++) {
        cudnnBackendDescriptor_t plan = NULL;
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS)
            continue;
        // a config that does not finalize is skipped: the next one may (that is what the frontend does)
        if (cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle) ==
                CUDNN_STATUS_SUCCESS &&
            cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                     &cfgs[i]) == CUDNN_STATUS_SUCCESS &&
            cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS) {
            *plan_out = plan;
            *cfg_out = cfgs[i];
            cfgs[i] = NULL;
        } else {
            cudnnBackendDestroyDescriptor(plan);
        }
    }
    destroy_descs(cfgs, (int)n);
    return 0;
}

static int64_t engine_index(cudnnBackendDescriptor_t cfg)
{
    cudnnBackendDescriptor_t engine = NULL;
    int64_t n = 0, index = -1;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != CUDNN_STATUS_SUCCESS)
        return -1;
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine) ==
        CUDNN_STATUS_SUCCESS)
        cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index);
    cudnnBackendDestroyDescriptor(engine);
    return index;
}

int cdn_graph_build_plan(cudnn_dsa *c, cdn_graph *g, const char *key, cdn_plan **out)
{
    *out = NULL;
    double t0 = now_ms();
    cudnnHandle_t handle = (cudnnHandle_t)c->handle;
    cudnnBackendDescriptor_t opgraph = cdn_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    cdn_set(g, opgraph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_ops, g->ops);
    cdn_set(g, opgraph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    cdn_finalize(g, opgraph, "the operation graph");
    cudnnBackendDescriptor_t plan = NULL, cfg = NULL;
    int offered = 0;
    if (!g->failed)
        try_heuristics(c, g, opgraph, CUDNN_HEUR_MODE_A, &plan, &cfg, &offered);
    if (!g->failed && !plan)
        try_heuristics(c, g, opgraph, CUDNN_HEUR_MODE_FALLBACK, &plan, &cfg, &offered);
    if (!g->failed && !plan) {
        char last[512];
        last_error_text(last, sizeof last);
        dsarl_error_set(g->err, DSARL_E_UNSUPPORTED, __FILE__, __LINE__,
                        "dsa cudnn: building the %s graph: heuristics offered %d engine configs and no execution "
                        "plan finalized (%s)", g->name, offered, last);
        g->failed = 1;
    }
    cdn_plan *p = g->failed ? NULL : calloc(1, sizeof(*p));
    if (!g->failed && !p) {
        dsarl_error_set(g->err, DSARL_E_NOMEM, __FILE__, __LINE__, "dsa cudnn: out of host memory for a plan");
        g->failed = 1;
    }
    int64_t workspace = 0, n = 0;
    if (!g->failed)
        cdn_check(g, cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                              &workspace));
    if (g->failed) {
        if (plan)
            cudnnBackendDestroyDescriptor(plan);
        if (cfg)
            cudnnBackendDestroyDescriptor(cfg);
        destroy_descs(g->descs, g->n_descs);
        g->n_descs = 0;
        free(p);
        return -1;
    }
    snprintf(p->key, sizeof p->key, "%s", key);
    memcpy(p->descs, g->descs, (size_t)g->n_descs * sizeof(g->descs[0]));
    p->n_descs = g->n_descs;
    p->descs[p->n_descs++] = cfg;
    p->descs[p->n_descs++] = plan;
    g->n_descs = 0;
    p->plan = plan;
    memcpy(p->uids, g->uids, (size_t)g->n_uids * sizeof(g->uids[0]));
    p->n_uids = g->n_uids;
    p->workspace = workspace;
    p->engine = engine_index(cfg);
    p->build_ms = now_ms() - t0;
    c->plan_build_ms += p->build_ms;
    c->plans_built++;
    dsarl_log(DSARL_LOG_DEBUG, "dsa cudnn: plan for %s: engine %lld, workspace %lld bytes, built in %.0f ms", g->name,
              (long long)p->engine, (long long)workspace, p->build_ms);
    *out = p;
    return 0;
}

void cdn_plan_free(cdn_plan *plan)
{
    if (!plan)
        return;
    destroy_descs(plan->descs, plan->n_descs);
    free(plan);
}

int64_t cdn_plan_workspace(const cdn_plan *plan)
{
    return plan->workspace;
}

cdn_plan *cdn_plan_find(cudnn_dsa *c, const char *key)
{
    for (int i = 0; i < c->n_plans; i++)
        if (strcmp(c->plans[i]->key, key) == 0)
            return c->plans[i];
    return NULL;
}

int cdn_plan_cache_add(cudnn_dsa *c, cdn_plan *plan, dsarl_error *err)
{
    if (c->n_plans == c->cap_plans) {
        int cap = c->cap_plans ? 2 * c->cap_plans : 16;
        cdn_plan **grown = realloc(c->plans, (size_t)cap * sizeof(*grown));
        if (!grown) {
            cdn_plan_free(plan);
            return DSARL_FAIL(err, DSARL_E_NOMEM, "dsa cudnn: out of host memory for the plan cache");
        }
        c->plans = grown;
        c->cap_plans = cap;
    }
    c->plans[c->n_plans++] = plan;
    return DSARL_OK;
}

int cdn_plan_execute(cudnn_dsa *c, const cdn_plan *plan, void *const ptrs[CDN_N_UIDS], void *workspace,
                     dsarl_error *err)
{
    void *data[CDN_N_UIDS];
    for (int i = 0; i < plan->n_uids; i++) {
        data[i] = ptrs[plan->uids[i]];
        if (!data[i])
            return DSARL_FAIL(err, DSARL_E_INTERNAL, "dsa cudnn: running %s: tensor uid %lld has no pointer",
                              plan->key, (long long)plan->uids[i]);
    }
    cdn_graph g;
    cdn_graph_init(&g, err, "variant pack of %s", plan->key);
    cudnnBackendDescriptor_t pack = cdn_new(&g, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    cdn_set(&g, pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, plan->n_uids, plan->uids);
    cdn_set(&g, pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, plan->n_uids, data);
    cdn_set(&g, pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    cdn_finalize(&g, pack, "the variant pack");
    if (!g.failed)
        cdn_check(&g, cudnnBackendExecute((cudnnHandle_t)c->handle, plan->plan, pack));
    destroy_descs(g.descs, g.n_descs);
    return g.failed ? -1 : DSARL_OK;
}
