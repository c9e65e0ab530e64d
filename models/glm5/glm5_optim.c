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

struct glm5_optim {
    int64_t step;  /* optimizer steps taken */
    float *m, *v;  /* device (n_weights) float32 */
    float *master; /* device (n_weights) float32, or NULL when the weights are float32 (they are the master) */
};

void glm5_optim_free(dsarl_model *model)
{
    glm5_optim *o = model->optim;
    if (!o)
        return;
    model->dev_ops->free(model->dev, o->m);
    model->dev_ops->free(model->dev, o->v);
    model->dev_ops->free(model->dev, o->master);
    free(o);
    model->optim = NULL;
}

// master (n_weights float32, device) = the weights widened from the storage dtype, on the device: storage -> float32
// is exact, so this equals the host round trip (download_f32 + upload) it replaces, which took 20-28 s at 3B.
static int master_from_weights(dsarl_model *model, float *master, dsarl_error *err)
{
    return model->dev_ops->convert(model->dev, master, DSARL_DTYPE_F32, model->weights, model->storage,
                                   model->n_weights, 1.0f, err);
}

// Allocates zeroed moments (and the master copied from the weights) on first use.
static int ensure_optim(dsarl_model *model, dsarl_error *err)
{
    if (model->optim)
        return DSARL_OK;
    glm5_optim *o = calloc(1, sizeof *o);
    if (!o)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory for the optimizer state");
    model->optim = o;
    const dsarl_device_ops *d = model->dev_ops;
    size_t bytes = (size_t)model->n_weights * sizeof(float);
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

int glm5_grad_norm(dsarl_model *model, double *norm, dsarl_error *err)
{
    if (!model->grads)
        DSARL_TRY(glm5_zero_grad(model, err));
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
        if (p->trainable)
            rc = d->sum_squares(model->dev, partial + i, glm5_at(model, model->grads, p->offset), p->numel, err);
    }
    if (rc == 0)
        rc = d->copy(model->dev, host, partial, (size_t)model->n_params * sizeof(float), DSARL_COPY_DEVICE_TO_HOST,
                     err);
    double total = 0.0;
    for (int64_t i = 0; i < model->n_params; i++) // in tensor order, as before: the same sum to the bit
        total += host[i];
    d->free(model->dev, partial);
    free(host);
    if (rc == 0)
        *norm = sqrt(total);
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
    if (!model->grads)
        DSARL_TRY(glm5_zero_grad(model, err));
    DSARL_TRY(ensure_optim(model, err));
    glm5_optim *o = model->optim;
    int64_t step = o->step + 1;
    for (int64_t i = 0; i < model->n_params; i++) {
        const glm5_param *p = &model->params[i];
        if (!p->trainable)
            continue;
        void *weight = glm5_at(model, model->weights, p->offset);
        float *master = o->master ? o->master + p->offset : weight;
        DSARL_TRY(model->dev_ops->adamw_update(model->dev, master, weight, glm5_at(model, model->grads, p->offset),
                                               o->m + p->offset, o->v + p->offset, p->numel, (float)hp->lr,
                                               (float)hp->beta1, (float)hp->beta2, (float)hp->eps,
                                               (float)hp->weight_decay, (float)hp->grad_scale, step, err));
    }
    o->step = step;
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

int glm5_optimizer_save(dsarl_model *model, const char *path, dsarl_error *err)
{
    DSARL_TRY(ensure_optim(model, err));
    glm5_optim *o = model->optim;
    const dsarl_device_ops *d = model->dev_ops;
    size_t bytes = (size_t)model->n_weights * sizeof(float);
    int kinds = o->master ? 3 : 2;
    float *host = malloc(bytes * (size_t)kinds);
    dsarl_safetensors_entry *entries = calloc((size_t)(model->n_params * kinds + 1), sizeof *entries);
    char (*names)[STATE_NAME_MAX] = calloc((size_t)(model->n_params * kinds), STATE_NAME_MAX);
    int rc = (!host || !entries || !names) ? DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory saving %s", path)
                                           : DSARL_OK;
    float *const sources[3] = {o->m, o->v, o->master};
    static const char *const kind_names[3] = {"exp_avg", "exp_avg_sq", "master"};
    for (int k = 0; k < kinds && rc == 0; k++)
        rc = d->copy(model->dev, host + (size_t)k * (size_t)model->n_weights, sources[k], bytes,
                     DSARL_COPY_DEVICE_TO_HOST, err);
    size_t n = 0;
    for (int k = 0; k < kinds && rc == 0; k++)
        for (int64_t i = 0; i < model->n_params && rc == 0; i++) {
            const glm5_param *p = &model->params[i];
            if (!p->trainable)
                continue;
            state_name(names[n], STATE_NAME_MAX, kind_names[k], p);
            entries[n].name = names[n];
            rc = dsarl_tensor_init(&entries[n].tensor, host + (size_t)k * (size_t)model->n_weights + p->offset,
                                   DSARL_DTYPE_F32, p->ndim, p->shape, DSARL_DEVICE_CPU, err);
            n++;
        }
    int64_t step = o->step, one = 1;
    if (rc == 0) {
        entries[n].name = "step";
        rc = dsarl_tensor_init(&entries[n].tensor, &step, DSARL_DTYPE_I64, 1, &one, DSARL_DEVICE_CPU, err);
        n++;
    }
    dsarl_safetensors_kv meta[] = {{"format", "pt"}, {"optimizer", "adamw"}};
    if (rc == 0)
        rc = dsarl_safetensors_write(path, entries, n, meta, DSARL_ARRAY_LEN(meta), err);
    free(names);
    free(entries);
    free(host);
    return rc;
}

// Copies the float32 tensor `name` of f (shape of p) into host[p->offset ...].
static int read_state_tensor(dsarl_safetensors_file *f, const char *name, const glm5_param *p, float *host,
                             dsarl_error *err)
{
    dsarl_tensor t;
    DSARL_TRY(dsarl_safetensors_get(f, name, &t, err));
    int same = t.dtype == DSARL_DTYPE_F32 && t.ndim == p->ndim;
    for (int32_t dim = 0; same && dim < p->ndim; dim++)
        same = t.shape[dim] == p->shape[dim];
    if (!same) {
        char got[64];
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: optimizer tensor %s is %s %s, expected F32 with the shape of "
                          "the parameter (%lld elements)", dsarl_safetensors_path(f), name, dsarl_dtype_name(t.dtype),
                          dsarl_tensor_shape_str(&t, got, sizeof got), (long long)p->numel);
    }
    memcpy(host + p->offset, t.data, (size_t)p->numel * sizeof(float));
    return DSARL_OK;
}

int glm5_optimizer_load(dsarl_model *model, const char *path, dsarl_error *err)
{
    dsarl_safetensors_file *f = NULL;
    DSARL_TRY(dsarl_safetensors_open(path, &f, err));
    const dsarl_device_ops *d = model->dev_ops;
    size_t bytes = (size_t)model->n_weights * sizeof(float);
    int has_master = model->storage != DSARL_DTYPE_F32;
    int kinds = has_master ? 3 : 2;
    float *host = calloc((size_t)kinds * (size_t)model->n_weights, sizeof(float));
    int rc = host ? DSARL_OK : DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory loading %s", path);
    static const char *const kind_names[3] = {"exp_avg", "exp_avg_sq", "master"};
    char name[STATE_NAME_MAX];
    // read and check everything before touching the model, so a bad file leaves the state unchanged
    for (int k = 0; k < kinds && rc == 0; k++)
        for (int64_t i = 0; i < model->n_params && rc == 0; i++) {
            const glm5_param *p = &model->params[i];
            if (!p->trainable)
                continue;
            state_name(name, sizeof name, kind_names[k], p);
            rc = read_state_tensor(f, name, p, host + (size_t)k * (size_t)model->n_weights, err);
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
    if (rc == 0)
        rc = ensure_optim(model, err);
    glm5_optim *o = model->optim;
    float *const targets[3] = {o ? o->m : NULL, o ? o->v : NULL, o ? o->master : NULL};
    for (int k = 0; k < kinds && rc == 0; k++)
        rc = d->copy(model->dev, targets[k], host + (size_t)k * (size_t)model->n_weights, bytes,
                     DSARL_COPY_HOST_TO_DEVICE, err);
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
