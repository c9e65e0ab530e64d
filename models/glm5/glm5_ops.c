/* glm5_ops.c: model ops tables for glm5.1 and glm5.2 over the shared implementation. */
#include <string.h>
#include "dsarl/log.h"
#include "glm5_ops.h"

int glm5_check_family(glm5_family family, const glm5_config *cfg, const char *where, dsarl_error *err)
{
    if (family == GLM5_FAMILY_51 && glm5_config_full_layers(cfg) != cfg->num_hidden_layers)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "%s: the config has %d IndexShare \"shared\" layers, but glm5.1 runs "
                          "every layer's indexer; select policy.model_family=glm5.2", where,
                          cfg->num_hidden_layers - glm5_config_full_layers(cfg));
    return DSARL_OK;
}

int glm5_create_family(glm5_family family, const dsarl_model_config *config, dsarl_model **out, dsarl_error *err)
{
    glm5_config cfg;
    const char *where = config->model_dir ? config->model_dir : "policy.model_config";
    if (config->model_dir)
        DSARL_TRY(glm5_read_hf_config(config->model_dir, &cfg, err));
    else
        DSARL_TRY(glm5_config_from_recipe(&cfg, config->recipe, err));
    DSARL_TRY(glm5_check_family(family, &cfg, where, err));
    dsarl_model *m = NULL;
    DSARL_TRY(glm5_model_alloc(&cfg, config->device_ops, config->device, config->dsa_ops, config->dsa,
                               config->parallel, &m, err));
    int rc;
    if (config->model_dir) {
        rc = glm5_load_hf_weights(m, config->model_dir, err);
    } else {
        double range = 0.02;
        rc = dsarl_recipe_double_or(config->recipe, "policy.model_config.initializer_range", 0.02, &range, err);
        if (rc == 0)
            rc = glm5_model_init_random(m, config->seed, range, err);
    }
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

static int parameter_count(const dsarl_model *m, int64_t *trainable, int64_t *buffers, dsarl_error *err)
{
    return glm5_count_parameters(&m->cfg, trainable, buffers, err);
}

static int64_t vocab_size(const dsarl_model *m) { return m->cfg.vocab_size; }

static const dsarl_key_spec glm5_keys[] = {
    {.path = "policy.model_config", .type = DSARL_KEY_MAP, .default_value = NULL, .flags = DSARL_KEY_NULLABLE,
     .doc = "Hugging Face glm_moe_dsa config keys for a model built from the recipe (random init)"},
    {.path = "policy.hf_config_overrides", .type = DSARL_KEY_MAP, .default_value = NULL, .flags = DSARL_KEY_NULLABLE,
     .doc = "config.json keys applied on top of the model's config"},
};

const dsarl_model_ops glm5_1_model_ops = {
    .common = DSARL_OPS_COMMON(dsarl_model_ops, DSARL_KIND_MODEL, "glm5.1",
                               "GLM-5 / GLM-5.1 (glm_moe_dsa: MLA + DSA indexer on every layer + MoE)", glm5_keys),
    .create = create_51,
    .destroy = glm5_model_free,
    .parameter_count = parameter_count,
    .vocab_size = vocab_size,
    .forward_logits = glm5_forward_logits,
    .save = glm5_save_hf,
};

const dsarl_model_ops glm5_2_model_ops = {
    .common = DSARL_OPS_COMMON(dsarl_model_ops, DSARL_KIND_MODEL, "glm5.2",
                               "GLM-5.2 (glm_moe_dsa with IndexShare: shared layers reuse the last full top-k)",
                               glm5_keys),
    .create = create_52,
    .destroy = glm5_model_free,
    .parameter_count = parameter_count,
    .vocab_size = vocab_size,
    .forward_logits = glm5_forward_logits,
    .save = glm5_save_hf,
};
