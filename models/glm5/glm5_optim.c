/* glm5_optim.c: AdamW over the model's flat parameter buffer, the gradient norm, and the optimizer state on disk.
 *
 * m, v (and the fp32 master when the storage dtype is not float32) are device buffers in the layout of
 * model->weights, so one adamw_update per trainable tensor covers the model; the slots of buffers
 * (e_score_correction_bias) stay zero and are never read. The state is m, v, master and the step count: no
 * random numbers, so a checkpoint of those resumes bit-identically. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dsarl/safetensors.h"
#include "glm5_model.h"
#include "glm5_pass.h"

struct glm5_optim {
    int64_t step;     /* optimizer steps taken */
    int64_t lo, hi;   /* the elements [lo, hi) of the flattened buffer this rank updates: its shard under the
                       * distributed optimizer, else [0, n_weights) */
    float *m, *v;     /* device (hi - lo) float32 */
    float *master;    /* device (hi - lo) float32, or NULL when the weights are float32 (they are the master) */
    void *stage;      /* device (dp_cp + 1) * stage_len storage-dtype elements: the packed blocks of one
                       * reduce-scatter / all-gather chunk, then this rank's block; NULL until the first one */
    int64_t stage_len;
};

/* The distributed optimizer needs these; declared here because glm5_ops.c installs it in the ops tables. */
int glm5_reduce_gradients(dsarl_model *model, dsarl_error *err);

void glm5_optim_free(dsarl_model *model)
{
    glm5_optim *o = model->optim;
    if (!o)
        return;
    model->dev_ops->free(model->dev, o->m);
    model->dev_ops->free(model->dev, o->v);
    model->dev_ops->free(model->dev, o->master);
    model->dev_ops->free(model->dev, o->stage);
    free(o);
    model->optim = NULL;
}

/* --- the data-parallel layout --------------------------------------------------------------------------------- */

// The replicas of the dense weights (NULL in a single process or a 1.2 core without groups).
static const dsarl_group *dense_group(const dsarl_model *model)
{
    return DSARL_PARALLEL_HAS_GROUPS(&model->parallel) ? model->parallel.dp_cp : NULL;
}

// The replicas of an expert weight: its expert-data-parallel peers.
static const dsarl_group *expert_group(const dsarl_model *model)
{
    return DSARL_PARALLEL_HAS_GROUPS(&model->parallel) ? model->parallel.edp : NULL;
}

// Tensor, pipeline or expert parallelism: the shards of one replica differ, so the flat-buffer shard layout of the
// distributed optimizer (one range of a buffer every dp_cp rank holds whole) does not apply yet.
static bool model_parallel(const dsarl_model *model)
{
    const dsarl_parallel *p = &model->parallel;
    return p->tp_size > 1 || p->pp_size > 1 || p->ep_size > 1;
}

// True when AdamW state is sharded over dp_cp (a layout with one data-parallel rank has nothing to shard).
static bool sharded(const dsarl_model *model)
{
    return DSARL_PARALLEL_HAS_GROUPS(&model->parallel) && model->parallel.distributed_optimizer &&
           dsarl_group_size(model->parallel.dp_cp) > 1 && !model_parallel(model);
}

// Elements per shard: ceil(n_weights / dp_cp), so shard r is [r * S, min((r + 1) * S, n_weights)).
static int64_t shard_size(const dsarl_model *model)
{
    int64_t dp = dsarl_group_size(model->parallel.dp_cp);
    return (model->n_weights + dp - 1) / dp;
}

static int64_t clamp64(int64_t x, int64_t lo, int64_t hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

// Under tensor/pipeline/expert parallelism the distributed optimizer is not sharded yet: say so once, since the
// recipe asked for it and the memory it would have saved is then spent.
static void warn_unsharded(const dsarl_model *model)
{
    const dsarl_parallel *p = &model->parallel;
    if (DSARL_PARALLEL_HAS_GROUPS(p) && p->distributed_optimizer && dsarl_group_size(p->dp_cp) > 1 &&
        model_parallel(model))
        dsarl_log(DSARL_LOG_WARN, "glm5: use_distributed_optimizer is set, but sharding AdamW state under tensor, "
                  "pipeline or expert parallelism (tp %d, pp %d, ep %d) is not implemented yet: every rank keeps the "
                  "whole state of its own shard (12 bytes per parameter)", p->tp_size, p->pp_size, p->ep_size);
}

// master (hi - lo float32, device) = the weights [lo, hi) widened from the storage dtype, on the device: storage ->
// float32 is exact, so this equals the host round trip (download_f32 + upload) it replaces, which took 20-28 s at 3B.
static int master_from_weights(dsarl_model *model, float *master, dsarl_error *err)
{
    glm5_optim *o = model->optim;
    return model->dev_ops->convert(model->dev, master, DSARL_DTYPE_F32, glm5_at(model, model->weights, o->lo),
                                   model->storage, o->hi - o->lo, 1.0f, err);
}

// Allocates zeroed moments (and the master copied from the weights) of this rank's range on first use.
static int ensure_optim(dsarl_model *model, dsarl_error *err)
{
    if (model->optim)
        return DSARL_OK;
    warn_unsharded(model);
    glm5_optim *o = calloc(1, sizeof *o);
    if (!o)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory for the optimizer state");
    model->optim = o;
    o->lo = 0, o->hi = model->n_weights;
    if (sharded(model)) {
        int64_t S = shard_size(model), r = dsarl_group_rank(model->parallel.dp_cp);
        o->lo = clamp64(r * S, 0, model->n_weights);
        o->hi = clamp64(r * S + S, 0, model->n_weights);
    }
    const dsarl_device_ops *d = model->dev_ops;
    // an empty shard (more ranks than elements) still gets a buffer: alloc of 0 bytes is not portable
    size_t bytes = (size_t)(o->hi - o->lo > 0 ? o->hi - o->lo : 1) * sizeof(float);
    int rc = d->alloc(model->dev, bytes, (void **)&o->m, err);
    if (rc == 0)
        rc = d->alloc(model->dev, bytes, (void **)&o->v, err);
    if (rc == 0)
        rc = d->zero(model->dev, o->m, bytes, err);
    if (rc == 0)
        rc = d->zero(model->dev, o->v, bytes, err);
    if (rc == 0 && model->storage != DSARL_DTYPE_F32) {
        rc = d->alloc(model->dev, bytes, (void **)&o->master, err);
        if (rc == 0)
            rc = master_from_weights(model, o->master, err);
    }
    if (rc)
        glm5_optim_free(model);
    return rc;
}

/* --- gradient reduction --------------------------------------------------------------------------------------- */

// Chunk length of the sharded collectives: a bucket of grad_bucket_elements spans every rank's block, so each
// rank's part is bucket / dp_cp (0: the whole shard in one collective).
static int64_t chunk_len(const dsarl_model *model)
{
    int64_t S = shard_size(model), dp = dsarl_group_size(model->parallel.dp_cp);
    int64_t b = model->parallel.grad_bucket_elements > 0 ? model->parallel.grad_bucket_elements / dp : S;
    return clamp64(b, 1, S > 0 ? S : 1);
}

static int ensure_stage(dsarl_model *model, dsarl_error *err)
{
    glm5_optim *o = model->optim;
    if (o->stage)
        return DSARL_OK;
    int64_t len = chunk_len(model), dp = dsarl_group_size(model->parallel.dp_cp);
    DSARL_TRY(model->dev_ops->alloc(model->dev, (size_t)((dp + 1) * len) * model->elem, &o->stage, err));
    o->stage_len = len;
    return DSARL_OK;
}

// Copies n elements of the storage dtype from src[at] (n_weights long) into dst and zeroes dst's tail where the
// range passes the buffer's end (the padding of the last shard).
static int copy_padded(dsarl_model *model, void *dst, const void *src, int64_t at, int64_t n, dsarl_error *err)
{
    const dsarl_device_ops *d = model->dev_ops;
    int64_t valid = clamp64(model->n_weights - at, 0, n);
    if (valid > 0)
        DSARL_TRY(d->copy(model->dev, dst, glm5_at(model, src, at), (size_t)valid * model->elem,
                          DSARL_COPY_DEVICE_TO_DEVICE, err));
    if (valid < n)
        DSARL_TRY(d->zero(model->dev, glm5_at(model, dst, valid), (size_t)(n - valid) * model->elem, err));
    return DSARL_OK;
}

// Copies the part of n staged elements that lies inside the buffer back to dst[at].
static int copy_back(dsarl_model *model, void *dst, const void *src, int64_t at, int64_t n, dsarl_error *err)
{
    int64_t valid = clamp64(model->n_weights - at, 0, n);
    if (valid <= 0)
        return DSARL_OK;
    return model->dev_ops->copy(model->dev, glm5_at(model, dst, at), src, (size_t)valid * model->elem,
                                DSARL_COPY_DEVICE_TO_DEVICE, err);
}

// Reduce-scatter of the gradients: afterwards grads[lo, hi) holds the sum over dp_cp, the rest is stale. Chunk
// by chunk, block r of the staging buffer gathers the same offset of rank r's shard, so one collective of equal
// blocks serves a contiguous shard per rank.
static int reduce_scatter_grads(dsarl_model *model, dsarl_error *err)
{
    DSARL_TRY(ensure_stage(model, err));
    glm5_optim *o = model->optim;
    const dsarl_group *g = model->parallel.dp_cp;
    int64_t S = shard_size(model), dp = dsarl_group_size(g), rank = dsarl_group_rank(g), b = o->stage_len;
    void *mine = glm5_at(model, o->stage, dp * b);
    for (int64_t c = 0; c < S; c += b) {
        int64_t len = c + b < S ? b : S - c;
        for (int64_t r = 0; r < dp; r++)
            DSARL_TRY(copy_padded(model, glm5_at(model, o->stage, r * len), model->grads, r * S + c, len, err));
        DSARL_TRY(dsarl_device_reduce_scatter(model->dev_ops, model->dev, g, mine, o->stage, len, model->storage,
                                              DSARL_REDUCE_SUM, err));
        DSARL_TRY(copy_back(model, model->grads, mine, rank * S + c, len, err));
    }
    return DSARL_OK;
}

// All-gather of the updated weights: every rank's shard of weights into every rank's buffer.
static int all_gather_weights(dsarl_model *model, dsarl_error *err)
{
    DSARL_TRY(ensure_stage(model, err));
    glm5_optim *o = model->optim;
    const dsarl_group *g = model->parallel.dp_cp;
    int64_t S = shard_size(model), dp = dsarl_group_size(g), rank = dsarl_group_rank(g), b = o->stage_len;
    void *mine = glm5_at(model, o->stage, dp * b);
    for (int64_t c = 0; c < S; c += b) {
        int64_t len = c + b < S ? b : S - c;
        DSARL_TRY(copy_padded(model, mine, model->weights, rank * S + c, len, err));
        DSARL_TRY(dsarl_device_all_gather(model->dev_ops, model->dev, g, o->stage, mine, len, model->storage, err));
        for (int64_t r = 0; r < dp; r++)
            if (r != rank)
                DSARL_TRY(copy_back(model, model->weights, glm5_at(model, o->stage, r * len), r * S + c, len, err));
    }
    return DSARL_OK;
}

// The all-reduce path: each maximal run of parameters with the same replica group (dense weights over dp_cp,
// expert weights over edp), contiguous in the buffer, summed in buckets of grad_bucket_elements.
static int all_reduce_grads(dsarl_model *model, dsarl_error *err)
{
    int64_t bucket = model->parallel.grad_bucket_elements;
    for (int64_t i = 0; i < model->n_params;) {
        const dsarl_group *g = model->params[i].shard == GLM5_SHARD_EXPERT ? expert_group(model) : dense_group(model);
        int64_t at = model->params[i].offset, end = at + model->params[i].numel, j = i + 1;
        for (; j < model->n_params; j++) {
            const glm5_param *q = &model->params[j];
            const dsarl_group *h = q->shard == GLM5_SHARD_EXPERT ? expert_group(model) : dense_group(model);
            if (h != g || q->offset != end)
                break;
            end += q->numel;
        }
        for (int64_t s = at; s < end;) {
            int64_t n = bucket > 0 && end - s > bucket ? bucket : end - s;
            DSARL_TRY(dsarl_device_all_reduce(model->dev_ops, model->dev, g, glm5_at(model, model->grads, s), n,
                                              model->storage, DSARL_REDUCE_SUM, err));
            s += n;
        }
        i = j;
    }
    return DSARL_OK;
}

int glm5_reduce_gradients(dsarl_model *model, dsarl_error *err)
{
    glm5_scope(model, "optimizer.grad_reduce");
    if (!model->grads)
        DSARL_TRY(glm5_zero_grad(model, err));
    DSARL_TRY(glm5_stage_reduce_tied(model, err)); // a tied embedding's two ends, under pipeline parallelism
    int rc = sharded(model) ? ensure_optim(model, err) : DSARL_OK;
    if (rc == 0)
        rc = sharded(model) ? reduce_scatter_grads(model, err) : all_reduce_grads(model, err);
    glm5_scope(model, NULL);
    return rc;
}

/* --- norm and step -------------------------------------------------------------------------------------------- */

// The part [*a, *b) of parameter p inside this rank's range [lo, hi); false when it has none.
static bool own_part(const glm5_param *p, int64_t lo, int64_t hi, int64_t *a, int64_t *b)
{
    *a = p->offset > lo ? p->offset : lo;
    *b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
    return *a < *b;
}

int glm5_grad_norm(dsarl_model *model, double *norm, dsarl_error *err)
{
    glm5_scope(model, "optimizer.grad_norm");
    if (!model->grads)
        DSARL_TRY(glm5_zero_grad(model, err));
    // sharded: this rank holds the reduced gradients of its shard only, so the squares of the shards are summed
    int64_t lo = 0, hi = model->n_weights;
    if (sharded(model)) {
        DSARL_TRY(ensure_optim(model, err));
        lo = model->optim->lo, hi = model->optim->hi;
    }
    const dsarl_device_ops *d = model->dev_ops;
    // one partial sum per tensor on the device, then one download (each download waits for the device)
    float *partial = NULL, *host = calloc((size_t)model->n_params, sizeof(float));
    if (!host)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory for the gradient norm");
    int rc = d->alloc(model->dev, (size_t)model->n_params * sizeof(float), (void **)&partial, err);
    if (rc == 0)
        rc = d->zero(model->dev, partial, (size_t)model->n_params * sizeof(float), err);
    for (int64_t i = 0; i < model->n_params && rc == 0; i++) {
        const glm5_param *p = &model->params[i];
        int64_t a, b;
        // under tensor/expert parallelism each element is counted on exactly one rank of the world (the shards of a
        // replica differ; a replicated tensor or a data-parallel replica would otherwise count twice)
        bool counted = !model_parallel(model) || glm5_param_counts_in_norm(model, p);
        if (p->trainable && counted && own_part(p, lo, hi, &a, &b))
            rc = d->sum_squares(model->dev, partial + i, glm5_at(model, model->grads, a), b - a, err);
    }
    if (rc == 0)
        rc = d->copy(model->dev, host, partial, (size_t)model->n_params * sizeof(float), DSARL_COPY_DEVICE_TO_HOST,
                     err);
    double total = 0.0;
    for (int64_t i = 0; i < model->n_params; i++) // in tensor order, as before: the same sum to the bit
        total += host[i];
    d->free(model->dev, partial);
    free(host);
    if (rc == 0 && sharded(model))
        rc = dsarl_group_all_reduce_host(model->parallel.dp_cp, &total, 1, DSARL_DTYPE_F64, DSARL_REDUCE_SUM, err);
    else if (rc == 0 && model_parallel(model) && DSARL_PARALLEL_HAS_GROUPS(&model->parallel))
        rc = dsarl_group_all_reduce_host(model->parallel.world, &total, 1, DSARL_DTYPE_F64, DSARL_REDUCE_SUM, err);
    if (rc == 0)
        *norm = sqrt(total);
    glm5_scope(model, NULL);
    return rc;
}

int glm5_optimizer_step(dsarl_model *model, const dsarl_optimizer_params *hp, dsarl_error *err)
{
    if (!hp || hp->struct_size < sizeof *hp)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: optimizer_step needs a dsarl_optimizer_params with "
                          "struct_size set");
    if (!(hp->lr >= 0) || !(hp->beta1 >= 0 && hp->beta1 < 1) || !(hp->beta2 >= 0 && hp->beta2 < 1) ||
        !(hp->eps > 0) || !(hp->weight_decay >= 0) || !isfinite(hp->grad_scale))
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: optimizer_step needs lr >= 0, betas in [0, 1), eps > 0, "
                          "weight_decay >= 0 and a finite grad_scale; got lr %g, betas %g/%g, eps %g, decay %g, "
                          "scale %g", hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay, hp->grad_scale);
    if (!model->dev_ops->adamw_update)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "glm5: the device plugin has no adamw_update op");
    glm5_scope(model, "optimizer.adamw");
    if (!model->grads)
        DSARL_TRY(glm5_zero_grad(model, err));
    DSARL_TRY(ensure_optim(model, err));
    glm5_optim *o = model->optim;
    int64_t step = o->step + 1;
    // AdamW is elementwise, so the part of each tensor inside this rank's range updates on its own, and tensors
    // that lie end to end in the flat buffers update as one run (one launch, not one per norm weight)
    for (int64_t i = 0; i < model->n_params; i++) {
        const glm5_param *p = &model->params[i];
        int64_t a, b, a2, b2;
        if (!p->trainable || !own_part(p, o->lo, o->hi, &a, &b))
            continue;
        while (i + 1 < model->n_params && model->params[i + 1].trainable &&
               own_part(&model->params[i + 1], o->lo, o->hi, &a2, &b2) && a2 == b)
            b = b2, i++;
        void *weight = glm5_at(model, model->weights, a);
        float *master = o->master ? o->master + (a - o->lo) : weight;
        DSARL_TRY(model->dev_ops->adamw_update(model->dev, master, weight, glm5_at(model, model->grads, a),
                                               o->m + (a - o->lo), o->v + (a - o->lo), b - a, (float)hp->lr,
                                               (float)hp->beta1, (float)hp->beta2, (float)hp->eps,
                                               (float)hp->weight_decay, (float)hp->grad_scale, step, err));
    }
    if (sharded(model)) {
        glm5_scope(model, "optimizer.weight_gather");
        DSARL_TRY(all_gather_weights(model, err));
    }
    o->step = step;
    glm5_scope(model, NULL);
    return DSARL_OK;
}

int64_t glm5_optimizer_steps(const dsarl_model *model)
{
    return model->optim ? model->optim->step : 0;
}

// The three per-tensor state names of parameter p: exp_avg.<name>, exp_avg_sq.<name>, master.<name>.
static void state_name(char *buf, size_t size, const char *kind, const glm5_param *p)
{
    snprintf(buf, size, "%s.%s", kind, p->name);
}

#define STATE_NAME_MAX 128

// The shard this file's state covers, in the metadata so a file of another layout is refused, not misread:
// "lo hi n_weights" of the flattened buffer.
static void shard_text(const glm5_optim *o, const dsarl_model *model, char *buf, size_t size)
{
    snprintf(buf, size, "%lld %lld %lld", (long long)o->lo, (long long)o->hi, (long long)model->n_weights);
}

// Shape of the state tensor of parameter p's part [a, b): the parameter's shape when the rank holds all of it
// unsharded, else 1-D (a shard cuts tensors anywhere).
static int32_t state_shape(const dsarl_model *model, const glm5_param *p, int64_t a, int64_t b, int64_t *shape)
{
    if (!sharded(model)) {
        memcpy(shape, p->shape, sizeof p->shape);
        return p->ndim;
    }
    shape[0] = b - a;
    return 1;
}

int glm5_optimizer_save(dsarl_model *model, const char *path, dsarl_error *err)
{
    DSARL_TRY(ensure_optim(model, err));
    glm5_optim *o = model->optim;
    const dsarl_device_ops *d = model->dev_ops;
    int64_t n_own = o->hi - o->lo;
    size_t bytes = (size_t)n_own * sizeof(float);
    int kinds = o->master ? 3 : 2;
    float *host = malloc(bytes * (size_t)kinds + 1);
    dsarl_safetensors_entry *entries = calloc((size_t)(model->n_params * kinds + 1), sizeof *entries);
    char (*names)[STATE_NAME_MAX] = calloc((size_t)(model->n_params * kinds), STATE_NAME_MAX);
    int64_t (*shapes)[3] = calloc((size_t)(model->n_params * kinds), sizeof *shapes);
    int rc = (!host || !entries || !names || !shapes)
                 ? DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory saving %s", path) : DSARL_OK;
    float *const sources[3] = {o->m, o->v, o->master};
    static const char *const kind_names[3] = {"exp_avg", "exp_avg_sq", "master"};
    for (int k = 0; k < kinds && rc == 0 && n_own > 0; k++)
        rc = d->copy(model->dev, host + (size_t)k * (size_t)n_own, sources[k], bytes, DSARL_COPY_DEVICE_TO_HOST,
                     err);
    size_t n = 0;
    for (int k = 0; k < kinds && rc == 0; k++)
        for (int64_t i = 0; i < model->n_params && rc == 0; i++) {
            const glm5_param *p = &model->params[i];
            int64_t a, b;
            if (!p->trainable || !own_part(p, o->lo, o->hi, &a, &b))
                continue;
            state_name(names[n], STATE_NAME_MAX, kind_names[k], p);
            entries[n].name = names[n];
            int32_t ndim = state_shape(model, p, a, b, shapes[n]);
            rc = dsarl_tensor_init(&entries[n].tensor, host + (size_t)k * (size_t)n_own + (a - o->lo),
                                   DSARL_DTYPE_F32, ndim, shapes[n], DSARL_DEVICE_CPU, err);
            n++;
        }
    int64_t step = o->step, one = 1;
    if (rc == 0) {
        entries[n].name = "step";
        rc = dsarl_tensor_init(&entries[n].tensor, &step, DSARL_DTYPE_I64, 1, &one, DSARL_DEVICE_CPU, err);
        n++;
    }
    char shard[96];
    shard_text(o, model, shard, sizeof shard);
    dsarl_safetensors_kv meta[] = {{"format", "pt"}, {"optimizer", "adamw"}, {"shard", shard}};
    if (rc == 0)
        rc = dsarl_safetensors_write(path, entries, n, meta, DSARL_ARRAY_LEN(meta) - (sharded(model) ? 0 : 1), err);
    free(shapes);
    free(names);
    free(entries);
    free(host);
    return rc;
}

// Copies the float32 tensor `name` of f (ndim, shape: n values) into host.
static int read_state_tensor(dsarl_safetensors_file *f, const char *name, int32_t ndim, const int64_t *shape,
                             int64_t n, float *host, dsarl_error *err)
{
    dsarl_tensor t;
    DSARL_TRY(dsarl_safetensors_get(f, name, &t, err));
    int same = t.dtype == DSARL_DTYPE_F32 && t.ndim == ndim;
    for (int32_t dim = 0; same && dim < ndim; dim++)
        same = t.shape[dim] == shape[dim];
    if (!same) {
        char got[64];
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: optimizer tensor %s is %s %s, expected F32 with the shape of "
                          "the parameter (%lld elements)", dsarl_safetensors_path(f), name, dsarl_dtype_name(t.dtype),
                          dsarl_tensor_shape_str(&t, got, sizeof got), (long long)n);
    }
    memcpy(host, t.data, (size_t)n * sizeof(float));
    return DSARL_OK;
}

int glm5_optimizer_load(dsarl_model *model, const char *path, dsarl_error *err)
{
    // the range this rank holds decides what the file must cover (ensure_optim allocates zeroed state for it)
    DSARL_TRY(ensure_optim(model, err));
    glm5_optim *o = model->optim;
    dsarl_safetensors_file *f = NULL;
    DSARL_TRY(dsarl_safetensors_open(path, &f, err));
    const dsarl_device_ops *d = model->dev_ops;
    int64_t n_own = o->hi - o->lo;
    size_t bytes = (size_t)n_own * sizeof(float);
    int kinds = o->master ? 3 : 2;
    float *host = calloc((size_t)kinds * (size_t)n_own + 1, sizeof(float));
    int rc = host ? DSARL_OK : DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory loading %s", path);
    char want[96];
    shard_text(o, model, want, sizeof want);
    const char *got = dsarl_safetensors_metadata(f, "shard");
    if (rc == 0 && sharded(model) != (got != NULL))
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s holds %s optimizer state but this run %s; resume with the layout "
                        "that saved it (policy.megatron_cfg.distributed_data_parallel_config.use_distributed_optimizer "
                        "and the data-parallel size)", path, got ? "sharded" : "unsharded",
                        sharded(model) ? "shards it over dp_cp" : "does not shard it");
    if (rc == 0 && got && strcmp(got, want))
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s holds the optimizer shard [%s] (lo hi n_weights) but this rank owns "
                        "[%s]; resume with the data-parallel size that saved it", path, got, want);
    static const char *const kind_names[3] = {"exp_avg", "exp_avg_sq", "master"};
    char name[STATE_NAME_MAX];
    // read and check everything before touching the model, so a bad file leaves the state unchanged
    for (int k = 0; k < kinds && rc == 0; k++)
        for (int64_t i = 0; i < model->n_params && rc == 0; i++) {
            const glm5_param *p = &model->params[i];
            int64_t a, b, shape[3];
            if (!p->trainable || !own_part(p, o->lo, o->hi, &a, &b))
                continue;
            state_name(name, sizeof name, kind_names[k], p);
            int32_t ndim = state_shape(model, p, a, b, shape);
            rc = read_state_tensor(f, name, ndim, shape, b - a, host + (size_t)k * (size_t)n_own + (a - o->lo), err);
        }
    int64_t step = 0;
    if (rc == 0) {
        dsarl_tensor t;
        rc = dsarl_safetensors_get(f, "step", &t, err);
        if (rc == 0 && (t.dtype != DSARL_DTYPE_I64 || dsarl_tensor_numel(&t) != 1))
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor step must be one I64 value", path);
        if (rc == 0)
            memcpy(&step, t.data, sizeof step);
        if (rc == 0 && step < 0)
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor step must be >= 0, got %lld", path, (long long)step);
    }
    float *const targets[3] = {o->m, o->v, o->master};
    for (int k = 0; k < kinds && rc == 0 && n_own > 0; k++)
        rc = d->copy(model->dev, targets[k], host + (size_t)k * (size_t)n_own, bytes, DSARL_COPY_HOST_TO_DEVICE, err);
    if (rc == 0)
        o->step = step;
    free(host);
    dsarl_safetensors_close(f);
    return rc;
}

int glm5_load_weights(dsarl_model *model, const char *dir, dsarl_error *err)
{
    // the loader re-reads config.json into hf_config
    json_decref(model->hf_config);
    model->hf_config = NULL;
    DSARL_TRY(glm5_load_hf_weights(model, dir, err));
    glm5_optim *o = model->optim;
    if (!o || !o->master)
        return DSARL_OK;
    // the fp32 master follows the loaded weights until optimizer_load replaces it with the saved one
    return master_from_weights(model, o->master, err);
}
