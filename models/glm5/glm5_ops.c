/* glm5_ops.c: model ops tables for glm5.1 and glm5.2 over the shared implementation. */
#include <string.h>
#include "dsarl/log.h"
#include "glm5_cache.h"
#include "glm5_ops.h"
#include "glm5_pass.h"

/* glm5_optim.c: the data-parallel gradient reduction (ABI 1.3 slot reduce_gradients). */
int glm5_reduce_gradients(dsarl_model *model, dsarl_error *err);

int glm5_check_family(glm5_family family, const glm5_config *cfg, const char *where, dsarl_error *err)
{
    if (family == GLM5_FAMILY_51 && glm5_config_full_layers(cfg) != cfg->num_hidden_layers)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "%s: the config has %d IndexShare \"shared\" layers, but glm5.1 runs "
                          "every layer's indexer; select policy.model_family=glm5.2", where,
                          cfg->num_hidden_layers - glm5_config_full_layers(cfg));
    return DSARL_OK;
}

int glm5_family_config(glm5_family family, const dsarl_model_config *config, glm5_config *cfg, dsarl_error *err)
{
    const char *where = config->model_dir ? config->model_dir : "policy.model_config";
    if (!config->model_dir && !config->recipe)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: a model needs a model directory (policy.model_name) or a "
                          "recipe with policy.model_config");
    if (config->model_dir)
        DSARL_TRY(glm5_read_hf_config(config->model_dir, cfg, err));
    else
        DSARL_TRY(glm5_config_from_recipe(cfg, config->recipe, err));
    return glm5_check_family(family, cfg, where, err);
}

int glm5_count_family(glm5_family family, const dsarl_model_config *config, int64_t *trainable, int64_t *buffers,
                      dsarl_error *err)
{
    glm5_config cfg;
    DSARL_TRY(glm5_family_config(family, config, &cfg, err));
    return glm5_count_parameters(&cfg, trainable, buffers, err);
}

#define ATTENTION_FORM_KEY "policy.megatron_cfg.model_overrides.dsa_attention_form"

// dsa_attention_form: auto | absorbed | headwise; headwise needs a backend with the per-head ops.
static int read_attention_form(const dsarl_node *recipe, const dsarl_dsa_ops *dsa, glm5_attention_form *out,
                               dsarl_error *err)
{
    const char *form = "auto";
    DSARL_TRY(dsarl_recipe_string_or(recipe, ATTENTION_FORM_KEY, "auto", &form, err));
    if (!strcmp(form, "auto"))
        *out = GLM5_FORM_AUTO;
    else if (!strcmp(form, "absorbed"))
        *out = GLM5_FORM_ABSORBED;
    else if (!strcmp(form, "headwise"))
        *out = GLM5_FORM_HEADWISE;
    else
        return dsarl_recipe_fail(recipe, ATTENTION_FORM_KEY, err, DSARL_E_INVALID,
                                 "must be auto, absorbed or headwise, got \"%s\"", form);
    if (*out == GLM5_FORM_HEADWISE && !glm5_dsa_has_headwise(dsa))
        return dsarl_recipe_fail(recipe, ATTENTION_FORM_KEY, err, DSARL_E_UNSUPPORTED,
                                 "is headwise, but DSA backend %s has no headwise_attention_forward/backward; use "
                                 "auto or absorbed with it",
                                 dsa->common.name ? dsa->common.name : "(unnamed)");
    return DSARL_OK;
}

static int32_t glm5_mtp_loss(dsarl_model *m, const float *mask, double norm_tokens, float *loss)
{
    if (m->train && m->train->p.mtp) // a pending training pass: its backward adds the loss weighed so
        return glm5_mtp_weigh(&m->train->p, mask, norm_tokens, loss);
    *loss = m->cfg.mtp_layers > 0 ? m->mtp_loss : 0.0f;
    return m->cfg.mtp_layers;
}

int glm5_create_family(glm5_family family, const dsarl_model_config *config, dsarl_model **out, dsarl_error *err)
{
    glm5_config cfg;
    DSARL_TRY(glm5_family_config(family, config, &cfg, err));
    float mtp_scale = 0.0f;
    DSARL_TRY(glm5_mtp_configure(&cfg, config->recipe, config->parallel, config->model_dir, &mtp_scale, err));
    dsarl_model *m = NULL;
    DSARL_TRY(glm5_model_alloc_staged(&cfg, config->device_ops, config->device, config->dsa_ops, config->dsa,
                                      config->parallel, config->recipe, &m, err));
    int rc;
    if (config->model_dir) {
        rc = glm5_load_hf_weights(m, config->model_dir, err);
    } else {
        double range = 0.02;
        rc = dsarl_recipe_double_or(config->recipe, "policy.model_config.initializer_range", 0.02, &range, err);
        if (rc == 0)
            rc = glm5_model_init_random(m, config->seed, range, err);
    }
    // indexer loss knobs (Megatron names); the GLM-5 bridge uses coeff 0.001 with the sparse loss
    double coeff = 0.001;
    bool sparse = true;
    if (rc == 0 && config->recipe) {
        rc = dsarl_recipe_double_or(config->recipe, "policy.megatron_cfg.model_overrides.dsa_indexer_loss_coeff",
                                    0.001, &coeff, err);
        if (rc == 0)
            rc = dsarl_recipe_bool_or(config->recipe,
                                      "policy.megatron_cfg.model_overrides.dsa_indexer_use_sparse_loss", true, &sparse,
                                      err);
        if (rc == 0 && coeff < 0)
            rc = dsarl_recipe_fail(config->recipe, "policy.megatron_cfg.model_overrides.dsa_indexer_loss_coeff", err,
                                   DSARL_E_INVALID, "must be >= 0, got %g", coeff);
    }
    bool dense_attention = false;
    if (rc == 0 && config->recipe)
        rc = dsarl_recipe_bool_or(config->recipe, "policy.megatron_cfg.model_overrides.dsa_dense_attention", false,
                                  &dense_attention, err);
    m->dense_attention = dense_attention;
    if (rc == 0 && config->recipe)
        rc = read_attention_form(config->recipe, config->dsa_ops, &m->attention_form, err);
    bool recompute = false;
    if (rc == 0 && config->recipe)
        rc = dsarl_recipe_bool_or(config->recipe, "policy.megatron_cfg.activation_checkpointing", false, &recompute,
                                  err);
    m->activation_recompute = recompute;
    int64_t chunk = 0;
    if (rc == 0 && config->recipe)
        rc = dsarl_recipe_int_or(config->recipe, "policy.logprob_chunk_size", 0, &chunk, err);
    if (rc == 0 && chunk < 0)
        rc = dsarl_recipe_fail(config->recipe, "policy.logprob_chunk_size", err, DSARL_E_INVALID,
                               "must be null or > 0 (tokens of LM-head logits at once), got %lld", (long long)chunk);
    m->logprob_chunk = chunk;
    m->mtp_loss_scale = mtp_scale;
    m->indexer_loss_coeff = (float)coeff;
    m->indexer_sparse_loss = sparse;
    if (rc) {
        glm5_model_free(m);
        return rc;
    }
    *out = m;
    return DSARL_OK;
}

static int create_51(const dsarl_model_config *c, dsarl_model **out, dsarl_error *err)
{
    return glm5_create_family(GLM5_FAMILY_51, c, out, err);
}

static int create_52(const dsarl_model_config *c, dsarl_model **out, dsarl_error *err)
{
    return glm5_create_family(GLM5_FAMILY_52, c, out, err);
}

static int count_51(const dsarl_model_config *c, int64_t *trainable, int64_t *buffers, dsarl_error *err)
{
    return glm5_count_family(GLM5_FAMILY_51, c, trainable, buffers, err);
}

static int count_52(const dsarl_model_config *c, int64_t *trainable, int64_t *buffers, dsarl_error *err)
{
    return glm5_count_family(GLM5_FAMILY_52, c, trainable, buffers, err);
}

static int parameter_count(const dsarl_model *m, int64_t *trainable, int64_t *buffers, dsarl_error *err)
{
    return glm5_count_parameters(&m->cfg, trainable, buffers, err);
}

static int64_t vocab_size(const dsarl_model *m) { return m->cfg.vocab_size; }

// The zero_grad op in its own op class (the passes call glm5_zero_grad inside theirs).
static int zero_grad(dsarl_model *m, dsarl_error *err)
{
    glm5_scope(m, "optimizer.zero_grad");
    int rc = glm5_zero_grad(m, err);
    glm5_scope(m, NULL);
    return rc;
}
static void glm5_device(const dsarl_model *m, const dsarl_device_ops **ops, dsarl_device **dev)
{
    *ops = m->dev_ops, *dev = m->dev;
}

static int64_t parameter_tensors(const dsarl_model *m) { return m->n_params; }

static int parameter_info(const dsarl_model *m, int64_t i, const char **name, int32_t *ndim, int64_t *shape,
                          int *trainable, dsarl_error *err)
{
    if (i < 0 || i >= m->n_params)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: parameter index %lld is outside [0, %lld)", (long long)i,
                          (long long)m->n_params);
    const glm5_param *p = &m->params[i];
    if (name)
        *name = p->name;
    if (ndim)
        *ndim = p->ndim;
    for (int32_t d = 0; shape && d < p->ndim; d++)
        shape[d] = p->shape[d];
    if (trainable)
        *trainable = p->trainable;
    return DSARL_OK;
}

static int read_parameter(dsarl_model *m, int64_t i, float *value, float *grad, dsarl_error *err)
{
    DSARL_TRY(parameter_info(m, i, NULL, NULL, NULL, NULL, err));
    const glm5_param *p = &m->params[i];
    const float *copy = glm5_param_f32_copy(m, p);
    if (value)
        DSARL_TRY(m->dev_ops->download_f32(m->dev, value, copy ? (const void *)copy : glm5_at(m, m->weights, p->offset),
                                           copy ? DSARL_DTYPE_F32 : m->storage, (size_t)p->numel, err));
    if (grad) {
        if (!m->grads)
            DSARL_TRY(glm5_zero_grad(m, err));
        DSARL_TRY(m->dev_ops->download_f32(m->dev, grad, glm5_at(m, m->grads, p->offset), m->storage,
                                           (size_t)p->numel, err));
    }
    return DSARL_OK;
}

static int write_parameter(dsarl_model *m, int64_t i, const float *value, dsarl_error *err)
{
    DSARL_TRY(parameter_info(m, i, NULL, NULL, NULL, NULL, err));
    const glm5_param *p = &m->params[i];
    return glm5_upload_param(m, p, 0, value, (size_t)p->numel, err);
}

static const dsarl_key_spec glm5_keys[] = {
    {.path = "policy.model_config", .type = DSARL_KEY_MAP, .default_value = NULL, .flags = DSARL_KEY_NULLABLE,
     .doc = "Hugging Face glm_moe_dsa config keys for a model built from the recipe (random init)"},
    {.path = "policy.hf_config_overrides", .type = DSARL_KEY_MAP, .default_value = NULL, .flags = DSARL_KEY_NULLABLE,
     .doc = "config.json keys applied on top of the model's config"},
    {.path = "policy.megatron_cfg.model_overrides.dsa_indexer_loss_coeff", .type = DSARL_KEY_FLOAT,
     .default_value = "0.001", .doc = "weight of the DSA indexer KL loss (0 disables it)"},
    {.path = "policy.megatron_cfg.model_overrides.dsa_indexer_use_sparse_loss", .type = DSARL_KEY_BOOL,
     .default_value = "true", .doc = "indexer KL over the selected top-k keys (sparse stage) or all keys (dense "
     "warm-up)"},
    {.path = "policy.megatron_cfg.model_overrides.dsa_dense_attention", .type = DSARL_KEY_BOOL,
     .default_value = "false", .doc = "attend to every causal key (top-k off), as in DSA's dense warm-up stage"},
    {.path = ATTENTION_FORM_KEY, .type = DSARL_KEY_STRING, .default_value = "auto",
     .doc = "attention form of training/prefill: auto (the DSA backend's preferred_form), absorbed (MQA over the "
     "latent) or headwise (per-head keys/values); cached decode is always absorbed"},
    {.path = "policy.megatron_cfg.activation_checkpointing", .type = DSARL_KEY_BOOL, .default_value = "false",
     .doc = "keep only each layer's input in training and recompute the layer in the backward pass"},
    {.path = "policy.logprob_chunk_size", .type = DSARL_KEY_INT, .default_value = NULL, .flags = DSARL_KEY_NULLABLE,
     .doc = "LM-head logits and their log-softmax this many tokens at a time (null: the whole pass); tp 1 only"},
    {.path = "policy.megatron_cfg.mtp_num_layers", .type = DSARL_KEY_INT, .default_value = "0",
     .flags = DSARL_KEY_NULLABLE, .doc = "MTP depths of the checkpoint to train (num_nextn_predict_layers at most; 0 or "
     "null: off, the MTP tensors are carried through saves unchanged); data parallelism only"},
    {.path = "policy.megatron_cfg.mtp_loss_scaling_factor", .type = DSARL_KEY_FLOAT, .default_value = "0.1",
     .doc = "weight of the MTP loss added to the training loss (divided by mtp_num_layers per depth)"},
};

/* The slots both families share (everything but create and the config-only count), so the two tables cannot
 * drift apart when a slot is added. */
#define GLM5_SHARED_MODEL_OPS                           \
    .destroy = glm5_model_free,                     \
    .parameter_count = parameter_count,             \
    .vocab_size = vocab_size,                       \
    .forward_logits = glm5_forward_logits,          \
    .save = glm5_save_hf,                           \
    .forward_logprobs = glm5_forward_logprobs,      \
    .backward = glm5_backward,                      \
    .train_forward = glm5_train_forward,            \
    .train_backward = glm5_train_backward,          \
    .reduce_gradients = glm5_reduce_gradients,      \
    .zero_grad = zero_grad,                         \
    .parameter_tensors = parameter_tensors,         \
    .parameter_info = parameter_info,               \
    .read_parameter = read_parameter,               \
    .write_parameter = write_parameter,             \
    .grad_norm = glm5_grad_norm,                    \
    .optimizer_step = glm5_optimizer_step,          \
    .optimizer_steps = glm5_optimizer_steps,        \
    .optimizer_save = glm5_optimizer_save,          \
    .optimizer_load = glm5_optimizer_load,          \
    .load_weights = glm5_load_weights,              \
    .cache_create = glm5_cache_create,              \
    .cache_free = glm5_cache_free,                  \
    .cache_reset = glm5_cache_reset,                \
    .forward_cached = glm5_forward_cached,          \
    .cache_length = glm5_cache_length,              \
    .device = glm5_device,                          \
    .stage_forward = glm5_stage_forward,            \
    .stage_backward = glm5_stage_backward,          \
    .stage_transfer = glm5_stage_transfer,          \
    .cache_token_bytes = glm5_cache_token_bytes,    \
    .paged_cache_create = glm5_paged_cache_create,  \
    .forward_paged = glm5_forward_paged,            \
    .cache_copy_block = glm5_cache_copy_block,      \
    .mtp_loss = glm5_mtp_loss,                      \
    .routing_shape = glm5_routing_shape

const dsarl_model_ops glm5_1_model_ops = {
    .common = DSARL_OPS_COMMON_RANKED(dsarl_model_ops, DSARL_KIND_MODEL, "glm5.1",
                                      "GLM-5 / GLM-5.1 (glm_moe_dsa: MLA + DSA indexer on every layer + MoE)",
                                      glm5_keys, DSARL_RANK_SECONDARY),
    .create = create_51,
    .parameter_count_config = count_51,
    .accepts = glm5_accepts_51,
    .flops = glm5_flops_51,
    .plan = glm5_plan_51,
    GLM5_SHARED_MODEL_OPS,
};

const dsarl_model_ops glm5_2_model_ops = {
    .common = DSARL_OPS_COMMON_RANKED(dsarl_model_ops, DSARL_KIND_MODEL, "glm5.2",
                                      "GLM-5.2 (glm_moe_dsa with IndexShare: shared layers reuse the last full top-k)",
                                      glm5_keys, DSARL_RANK_PRIMARY),
    .create = create_52,
    .parameter_count_config = count_52,
    .accepts = glm5_accepts_52,
    .flops = glm5_flops_52,
    .plan = glm5_plan_52,
    GLM5_SHARED_MODEL_OPS,
};
