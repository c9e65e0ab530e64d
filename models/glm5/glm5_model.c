/* glm5_model.c: allocation of a glm_moe_dsa instance, binding of layer pointers, random init. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "glm5_model.h"

#define GLM5_PI 3.14159265358979323846

const glm5_param *glm5_model_find_param(const dsarl_model *model, const char *name)
{
    for (int64_t i = 0; i < model->n_params; i++)
        if (strcmp(model->params[i].name, name) == 0)
            return &model->params[i];
    return NULL;
}

// Binds each spec's device pointer to the field of its layer (by the key's suffix).
static void bind_pointers(dsarl_model *m)
{
    for (int64_t i = 0; i < m->n_params; i++) {
        const glm5_param *p = &m->params[i];
        void *ptr = glm5_at(m, m->weights, p->offset);
        if (p->layer < 0) {
            if (!strcmp(p->name, "model.embed_tokens.weight"))
                m->embed = ptr;
            else if (!strcmp(p->name, "model.norm.weight"))
                m->final_norm = ptr;
            else if (!strcmp(p->name, "lm_head.weight"))
                m->lm_head = ptr;
            continue;
        }
        glm5_layer *L = &m->layers[p->layer];
        const char *s = strchr(p->name + strlen("model.layers."), '.') + 1; // key within the layer
        struct { const char *key; void **field; } map[] = {
            {"input_layernorm.weight", &L->input_norm},
            {"post_attention_layernorm.weight", &L->post_attention_norm},
            {"self_attn.q_a_proj.weight", &L->q_a_proj},
            {"self_attn.q_a_layernorm.weight", &L->q_a_norm},
            {"self_attn.q_b_proj.weight", &L->q_b_proj},
            {"self_attn.kv_a_proj_with_mqa.weight", &L->kv_a_proj},
            {"self_attn.kv_a_layernorm.weight", &L->kv_a_norm},
            {"self_attn.kv_b_proj.weight", &L->kv_b_proj},
            {"self_attn.o_proj.weight", &L->o_proj},
            {"self_attn.indexer.wq_b.weight", &L->idx_wq_b},
            {"self_attn.indexer.wk.weight", &L->idx_wk},
            {"self_attn.indexer.k_norm.weight", &L->idx_k_norm_w},
            {"self_attn.indexer.k_norm.bias", &L->idx_k_norm_b},
            {"self_attn.indexer.weights_proj.weight", &L->idx_weights_proj},
            {"mlp.gate_proj.weight", &L->mlp_gate_up},
            {"mlp.shared_experts.gate_proj.weight", &L->mlp_gate_up},
            {"mlp.down_proj.weight", &L->mlp_down},
            {"mlp.shared_experts.down_proj.weight", &L->mlp_down},
            {"mlp.gate.weight", &L->router},
            {"mlp.gate.e_score_correction_bias", &L->router_bias},
            {"mlp.experts.gate_up_proj", &L->experts_gate_up},
            {"mlp.experts.down_proj", &L->experts_down},
            {"enorm.weight", &L->enorm},
            {"hnorm.weight", &L->hnorm},
            {"eh_proj.weight", &L->eh_proj},
            {"shared_head.norm.weight", &L->head_norm},
            {"embed_tokens.weight", &L->mtp_embed},
            {"shared_head.head.weight", &L->mtp_head},
        };
        for (size_t k = 0; k < sizeof map / sizeof map[0]; k++)
            if (!strcmp(s, map[k].key))
                *map[k].field = ptr;
        if (!strcmp(s, "mlp.gate_proj.weight") || !strcmp(s, "mlp.shared_experts.gate_proj.weight"))
            L->mlp_inner = p->shape[0];
    }
    if (m->cfg.tie_word_embeddings)
        m->lm_head = m->embed;
    for (int32_t i = 0; i < glm5_built_layers(&m->cfg); i++) {
        glm5_layer *L = &m->layers[i];
        if (L->router_bias)
            L->router_bias32 = m->router_bias32 ? m->router_bias32 + (int64_t)i * m->cfg.n_routed_experts
                                                : (float *)L->router_bias;
    }
}

float *glm5_param_f32_copy(const dsarl_model *m, const glm5_param *p)
{
    if (!m->router_bias32 || p->layer < 0 || !strstr(p->name, ".mlp.gate.e_score_correction_bias"))
        return NULL;
    return m->layers[p->layer].router_bias32;
}

int glm5_upload_param(dsarl_model *m, const glm5_param *p, int64_t at, const float *host, size_t n,
                      dsarl_error *err)
{
    DSARL_TRY(m->dev_ops->upload_f32(m->dev, glm5_at(m, m->weights, p->offset + at), m->storage, host, n, err));
    float *copy = glm5_param_f32_copy(m, p);
    return copy ? m->dev_ops->upload_f32(m->dev, copy + at, DSARL_DTYPE_F32, host, n, err) : DSARL_OK;
}

int glm5_model_alloc(const glm5_config *cfg, const dsarl_device_ops *dev_ops, dsarl_device *dev,
                     const dsarl_dsa_ops *dsa_ops, dsarl_dsa_context *dsa, const dsarl_parallel *parallel,
                     dsarl_model **out, dsarl_error *err)
{
    return glm5_model_alloc_staged(cfg, dev_ops, dev, dsa_ops, dsa, parallel, NULL, out, err);
}

int glm5_model_alloc_staged(const glm5_config *cfg, const dsarl_device_ops *dev_ops, dsarl_device *dev,
                            const dsarl_dsa_ops *dsa_ops, dsarl_dsa_context *dsa, const dsarl_parallel *parallel,
                            const dsarl_node *recipe, dsarl_model **out, dsarl_error *err)
{
    if (!dev_ops || !dev || !dsa_ops)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: a model needs a device (ops and instance) and a DSA backend");
    DSARL_TRY(glm5_check_layout(cfg, parallel, err));
    if (parallel && parallel->pp_size > 1 && !dsarl_device_has_collectives(dev_ops))
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "glm5: pipeline parallelism (pp %d) needs a device with the 1.3 "
                          "collectives (send, recv, broadcast)", parallel->pp_size);
    if (parallel && parallel->cp_size > 1 && (!DSARL_PARALLEL_HAS_GROUPS(parallel) || !parallel->cp ||
                                              !dsarl_device_has_collectives(dev_ops)))
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "glm5: context parallelism (cp %d) needs the process groups of "
                          "an ABI 1.3 core and a device with the 1.3 collectives (all_reduce ... recv)",
                          parallel->cp_size);
    if (parallel && parallel->tp_size > 1 && (!DSARL_PARALLEL_HAS_GROUPS(parallel) || !parallel->tp ||
                                              !dsarl_device_has_collectives(dev_ops)))
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "glm5: tensor parallelism (tp %d) needs the process groups of "
                          "an ABI 1.3 core and a device with the 1.3 collectives (all_reduce ... recv)",
                          parallel->tp_size);
    glm5_stage stage;
    DSARL_TRY(glm5_stage_resolve(cfg, parallel, recipe, &stage, err));
    dsarl_model *m = calloc(1, sizeof(*m));
    if (!m) {
        free(stage.starts);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory creating the model");
    }
    m->stage = stage; // owned by m from here
    m->cfg = *cfg;
    m->dev_ops = dev_ops, m->dev = dev, m->dsa_ops = dsa_ops, m->dsa = dsa;
    m->parallel = parallel ? *parallel : (dsarl_parallel)DSARL_PARALLEL_SINGLE;
    m->shards = (glm5_shards){.tp_rank = m->parallel.tp_rank, .tp_size = m->parallel.tp_size,
                              .ep_rank = m->parallel.ep_rank, .ep_size = m->parallel.ep_size};
    // the host device runs each call's arithmetic at once; a GPU device queues kernels, each with a fixed cost
    m->launch_bound = (dsarl_device_capabilities(dev_ops) & DSARL_DEVICE_CAP_LAUNCH_BOUND) != 0;
    m->storage = dev_ops->storage_dtype(dev);
    m->elem = dsarl_dtype_size(m->storage);
    int rc = glm5_param_specs(cfg, &m->shards, &m->params, &m->n_params, &m->n_weights, err);
    // On the H200, one MTP depth in bf16 storage gave the last trunk layer's router gradient 38% away from the fp32
    // reference (check_glm5_cuda); fp32 storage agrees. Refused until that is found, rather than trained wrongly.
    if (rc == 0 && cfg->mtp_layers > 0 && m->storage != DSARL_DTYPE_F32)
        rc = DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "policy.megatron_cfg.mtp_num_layers is %d, but MTP training runs "
                        "with float32 storage only for now (this device stores %s); set mtp_num_layers to 0 or use "
                        "float32 storage", cfg->mtp_layers, dsarl_dtype_name(m->storage));
    if (rc == 0 && stage.size > 1) // only this stage's parameters take device memory
        glm5_stage_filter_specs(cfg, &stage, m->params, &m->n_params, &m->n_weights);
    if (rc == 0 && !(m->layers = calloc((size_t)glm5_built_layers(cfg), sizeof(glm5_layer))))
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory creating the layer table");
    if (rc == 0)
        rc = dev_ops->alloc(dev, (size_t)m->n_weights * m->elem, &m->weights, err);
    if (rc == 0)
        rc = dev_ops->zero(dev, m->weights, (size_t)m->n_weights * m->elem, err);
    size_t bias_bytes = (size_t)glm5_built_layers(cfg) * (size_t)cfg->n_routed_experts * sizeof(float);
    if (rc == 0 && m->storage != DSARL_DTYPE_F32 && bias_bytes > 0)
        rc = dev_ops->alloc(dev, bias_bytes, (void **)&m->router_bias32, err);
    if (m->router_bias32 && rc == 0)
        rc = dev_ops->zero(dev, m->router_bias32, bias_bytes, err);
    int64_t half = cfg->qk_rope_head_dim / 2;
    if (rc == 0)
        rc = dev_ops->alloc(dev, (size_t)half * sizeof(float), (void **)&m->inv_freq, err);
    if (rc == 0) {
        float *f = malloc((size_t)half * sizeof(float));
        if (!f)
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory");
        else {
            glm5_rope_inv_freq(cfg, f);
            rc = dev_ops->upload_f32(dev, m->inv_freq, DSARL_DTYPE_F32, f, (size_t)half, err);
            free(f);
        }
    }
    if (rc) {
        glm5_model_free(m);
        return rc;
    }
    bind_pointers(m);
    *out = m;
    return DSARL_OK;
}

void glm5_model_free(dsarl_model *m)
{
    if (!m)
        return;
    glm5_train_release(m);
    glm5_stage_release(m);
    if (m->weights)
        m->dev_ops->free(m->dev, m->weights);
    if (m->inv_freq)
        m->dev_ops->free(m->dev, m->inv_freq);
    if (m->router_bias32)
        m->dev_ops->free(m->dev, m->router_bias32);
    if (m->grads)
        m->dev_ops->free(m->dev, m->grads);
    glm5_optim_free(m);
    glm5_head_maps_free(m);
    json_decref(m->hf_config);
    glm5_extra_free(&m->extra);
    free(m->params);
    free(m->layers);
    free(m->stage.starts);
    free(m);
}

// splitmix64 -> Box-Muller normal; deterministic for a seed, independent of the device.
static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double normal01(uint64_t *s)
{
    double u1 = ((double)(splitmix(s) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = (double)(splitmix(s) >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * GLM5_PI * u2);
}

int glm5_zero_grad(dsarl_model *m, dsarl_error *err)
{
    if (!m->grads)
        DSARL_TRY(m->dev_ops->alloc(m->dev, (size_t)m->n_weights * m->elem, &m->grads, err));
    return m->dev_ops->zero(m->dev, m->grads, (size_t)m->n_weights * m->elem, err);
}

/* The normal draws of one tensor, split over threads: splitmix64 is a counter (each draw adds one constant to the
 * state), so element j, which takes draws 2j and 2j+1, starts from s0 + 2j * that constant, and any split of the
 * elements gives the values one sequential pass gives. A 3B-parameter model takes minutes on one core. */
typedef struct normal_fill {
    float *out;
    int64_t begin, end;
    uint64_t s0;
    double range;
} normal_fill;

static void *fill_normals(void *arg)
{
    normal_fill *f = arg;
    uint64_t s = f->s0 + (uint64_t)(2 * f->begin) * 0x9E3779B97F4A7C15ull;
    for (int64_t j = f->begin; j < f->end; j++)
        f->out[j] = (float)(normal01(&s) * f->range);
    return NULL;
}

#define GLM5_INIT_THREADS 32
#define GLM5_INIT_PER_THREAD ((int64_t)1 << 22) /* elements below which another thread is not worth starting */

static void fill_normals_parallel(float *out, int64_t n, uint64_t s0, double range)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t k = n / GLM5_INIT_PER_THREAD + 1;
    k = k < cores ? k : cores;
    k = k < GLM5_INIT_THREADS ? k : GLM5_INIT_THREADS;
    k = k > 1 ? k : 1;
    normal_fill parts[GLM5_INIT_THREADS];
    pthread_t threads[GLM5_INIT_THREADS];
    bool started[GLM5_INIT_THREADS] = {false};
    for (int64_t i = 0; i < k; i++) {
        parts[i] = (normal_fill){out, n * i / k, n * (i + 1) / k, s0, range};
        started[i] = i > 0 && pthread_create(&threads[i], NULL, fill_normals, &parts[i]) == 0;
    }
    fill_normals(&parts[0]);
    for (int64_t i = 1; i < k; i++) {
        if (started[i])
            pthread_join(threads[i], NULL);
        else // a thread that could not start: its part here
            fill_normals(&parts[i]);
    }
}

int glm5_model_init_random(dsarl_model *m, uint64_t seed, double initializer_range, dsarl_error *err)
{
    for (int64_t i = 0; i < m->n_params; i++) {
        const glm5_param *p = &m->params[i];
        // the whole tensor's values, then this rank's shard of them: every layout starts from the same weights
        float *host = malloc((size_t)(p->full_numel + (p->shard_dim >= 0 ? p->numel : 0)) * sizeof(float));
        if (!host)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory initialising %s", p->name);
        // one stream per tensor, by its place in the whole model: every stage split starts from the same weights
        uint64_t s = seed ^ (0xA24BAED4963EE407ull * (uint64_t)(p->spec_index + 1));
        bool is_bias = strstr(p->name, "bias") != NULL, is_norm = p->ndim == 1 && !is_bias;
        if (is_bias || is_norm)
            for (int64_t j = 0; j < p->full_numel; j++)
                host[j] = is_bias ? 0.0f : 1.0f;
        else
            fill_normals_parallel(host, p->full_numel, s, initializer_range);
        float *local = host;
        if (p->shard_dim >= 0) {
            local = host + p->full_numel;
            glm5_param_take_shard(p, host, local);
        }
        int rc = glm5_upload_param(m, p, 0, local, (size_t)p->numel, err);
        free(host);
        DSARL_TRY(rc);
    }
    return DSARL_OK;
}
