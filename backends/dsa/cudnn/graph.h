/* graph.h: a thin checked layer over cuDNN's backend API (cudnnBackendCreateDescriptor / SetAttribute / Finalize),
 * shared by graph.c and sdpa_graphs.c.
 *
 * A cdn_graph collects descriptors while a graph is described. Errors are sticky: the first failing call records
 * one message naming the graph being built, the call (or attribute), cuDNN's status and cudnnGetLastErrorString,
 * and every later call does nothing, so a builder reads as a straight list of ops and checks once at the end. */
#ifndef DSARL_DSA_CUDNN_GRAPH_H
#define DSARL_DSA_CUDNN_GRAPH_H

#include <cudnn.h>
#include "cudnn_dsa.h"

#define CDN_MAX_DESCS 160
#define CDN_MAX_OPS 64

typedef struct cdn_graph {
    char name[192];          /* "headwise fwd B=4 S=128 H=4 d=24/16 causal+bias", used in every message */
    dsarl_error *err;
    int failed;
    cudnnBackendDescriptor_t descs[CDN_MAX_DESCS]; /* everything created, kept alive as long as the plan */
    int n_descs;
    cudnnBackendDescriptor_t ops[CDN_MAX_OPS];
    int n_ops;
    int64_t uids[CDN_N_UIDS]; /* non-virtual tensor uids, in the order they were declared */
    int n_uids;
    int64_t next_virtual_uid;
} cdn_graph;

struct cdn_plan {
    char key[192];
    cudnnBackendDescriptor_t plan;
    cudnnBackendDescriptor_t descs[CDN_MAX_DESCS + 8]; /* owned: tensors, ops, graph, engine config, plan */
    int n_descs;
    int64_t uids[CDN_N_UIDS];
    int n_uids;
    int64_t workspace;
    int64_t engine;
    double build_ms;
};

enum { CDN_VIRTUAL = 1, CDN_BY_VALUE = 2 };

void cdn_graph_init(cdn_graph *g, dsarl_error *err, const char *fmt, ...) DSARL_PRINTF(3, 4);
/* Records a failure of call (text `what`) unless it succeeded; returns 0 on success. */
int cdn_check_(cdn_graph *g, cudnnStatus_t st, const char *what, const char *file, int line);
#define cdn_check(g, call) cdn_check_((g), (call), #call, __FILE__, __LINE__)
void cdn_set_(cdn_graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, const char *name_text,
              cudnnBackendAttributeType_t type, int64_t count, const void *value, const char *file, int line);
#define cdn_set(g, d, name, type, count, value) \
    cdn_set_((g), (d), (name), #name, (type), (count), (value), __FILE__, __LINE__)

cudnnBackendDescriptor_t cdn_new(cdn_graph *g, cudnnBackendDescriptorType_t type);
void cdn_finalize(cdn_graph *g, cudnnBackendDescriptor_t d, const char *what);

/* A rank-4 tensor; uid is used for non-virtual tensors (one of CDN_*), virtual ones get fresh uids. */
cudnnBackendDescriptor_t cdn_tensor(cdn_graph *g, cudnnDataType_t type, const int64_t dims[4],
                                    const int64_t strides[4], int64_t uid, unsigned flags);
/* The same with any rank (the MoE grouped matmul takes rank 3). */
cudnnBackendDescriptor_t cdn_tensor_nd(cdn_graph *g, cudnnDataType_t type, int rank, const int64_t *dims,
                                       const int64_t *strides, int64_t uid, unsigned flags);
/* y = mode(x [, b] [, t]) with math precision math; axis >= 0 for GEN_INDEX. */
void cdn_pointwise(cdn_graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t math, cudnnBackendDescriptor_t x,
                   cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis);
void cdn_matmul(cdn_graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c);
void cdn_reduction(cdn_graph *g, cudnnReduceTensorOp_t op, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y);
void cdn_reshape(cdn_graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y);
/* Appends an op the caller built and finalized (SDPA_FWD). */
void cdn_add_op(cdn_graph *g, cudnnBackendDescriptor_t op);

/* Finalizes the operation graph, asks heuristics (mode A, then FALLBACK) and keeps the first engine config whose
 * plan finalizes. On success the plan owns every descriptor of g (g is emptied); on failure they are destroyed. */
int cdn_graph_build_plan(cudnn_dsa *c, cdn_graph *g, const char *key, cdn_plan **out);

/* The cached plan for key, or NULL. */
cdn_plan *cdn_plan_find(cudnn_dsa *c, const char *key);
/* Adds plan to the cache (owned by it from now on). */
int cdn_plan_cache_add(cudnn_dsa *c, cdn_plan *plan, dsarl_error *err);

#endif /* DSARL_DSA_CUDNN_GRAPH_H */
