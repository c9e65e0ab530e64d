/* glm5_config.c: parsing and validation of a glm_moe_dsa config, mirroring transformers' GlmMoeDsaConfig. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "dsarl/json.h"
#include "dsarl/log.h"
#include "glm5_config.h"

#define GLM5_PI 3.14159265358979323846

// Reads an optional integer field; a missing key keeps *out (the HF default).
static int get_i64(const json_t *root, const char *key, const char *where, int64_t *out, dsarl_error *err)
{
    return dsarl_json_get_int_or(root, key, where, *out, out, err);
}

static int get_i32(const json_t *root, const char *key, const char *where, int32_t *out, dsarl_error *err)
{
    int64_t v = *out;
    DSARL_TRY(dsarl_json_get_int_or(root, key, where, v, &v, err));
    if (v < INT32_MIN || v > INT32_MAX)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key '%s' is out of range (%lld)", where, key, (long long)v);
    *out = (int32_t)v;
    return DSARL_OK;
}

static int get_bool(const json_t *root, const char *key, const char *where, bool *out, dsarl_error *err)
{
    int v = *out;
    DSARL_TRY(dsarl_json_get_bool_or(root, key, where, v, &v, err));
    *out = v != 0;
    return DSARL_OK;
}

static int check_positive(int64_t v, const char *key, const char *where, dsarl_error *err)
{
    if (v <= 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key '%s' must be > 0, got %lld", where, key, (long long)v);
    return DSARL_OK;
}

// rope_parameters (or the legacy rope_theta / rope_scaling keys) as transformers standardizes them.
static int parse_rope(glm5_config *cfg, const json_t *root, const char *where, dsarl_error *err)
{
    const json_t *rp = json_object_get(root, "rope_parameters");
    if (!rp || json_is_null(rp))
        rp = json_object_get(root, "rope_scaling");
    if (rp && !json_is_null(rp) && !json_is_object(rp))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key 'rope_parameters' must be an object, got %s", where,
                          dsarl_json_type_name(rp));
    snprintf(cfg->rope_type, sizeof cfg->rope_type, "default");
    cfg->rope_theta = 10000.0;
    DSARL_TRY(dsarl_json_get_double_or(root, "rope_theta", where, cfg->rope_theta, &cfg->rope_theta, err));
    cfg->rope_factor = 1.0, cfg->rope_mscale = 0.0, cfg->rope_mscale_all_dim = 0.0;
    cfg->rope_beta_fast = 32.0, cfg->rope_beta_slow = 1.0;
    cfg->rope_original_max_position = cfg->max_position_embeddings;
    if (rp && json_is_object(rp)) {
        char w[600];
        snprintf(w, sizeof w, "%s: rope_parameters", where);
        const char *type = "default";
        DSARL_TRY(dsarl_json_get_string_or(rp, "rope_type", w, type, &type, err));
        if (strcmp(type, "default") != 0 && strcmp(type, "yarn") != 0)
            return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "%s: rope_type '%s' is not supported; valid: default, yarn",
                              w, type);
        snprintf(cfg->rope_type, sizeof cfg->rope_type, "%s", type);
        DSARL_TRY(dsarl_json_get_double_or(rp, "rope_theta", w, cfg->rope_theta, &cfg->rope_theta, err));
        DSARL_TRY(dsarl_json_get_double_or(rp, "factor", w, cfg->rope_factor, &cfg->rope_factor, err));
        DSARL_TRY(dsarl_json_get_double_or(rp, "mscale", w, 0.0, &cfg->rope_mscale, err));
        DSARL_TRY(dsarl_json_get_double_or(rp, "mscale_all_dim", w, 0.0, &cfg->rope_mscale_all_dim, err));
        DSARL_TRY(dsarl_json_get_double_or(rp, "beta_fast", w, 32.0, &cfg->rope_beta_fast, err));
        DSARL_TRY(dsarl_json_get_double_or(rp, "beta_slow", w, 1.0, &cfg->rope_beta_slow, err));
        DSARL_TRY(dsarl_json_get_int_or(rp, "original_max_position_embeddings", w, cfg->max_position_embeddings,
                                        &cfg->rope_original_max_position, err));
        if (json_object_get(rp, "attention_factor") && !json_is_null(json_object_get(rp, "attention_factor")))
            return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "%s: key 'attention_factor' is not supported; leave it out "
                              "so it is derived from factor, mscale and mscale_all_dim", w);
    }
    return DSARL_OK;
}

static double yarn_get_mscale(double scale, double mscale)
{
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

// indexer_types: explicit list, else index_topk_pattern ("F"/"S" string or list), else freq/offset schedule.
static int parse_indexer_types(glm5_config *cfg, const json_t *root, const char *where, dsarl_error *err)
{
    int32_t L = cfg->num_hidden_layers;
    const json_t *types = json_object_get(root, "indexer_types");
    const json_t *pattern = json_object_get(root, "index_topk_pattern");
    if (types && !json_is_null(types)) {
        if (!json_is_array(types) || (int64_t)json_array_size(types) != L)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key 'indexer_types' must be a list of %d strings (one per "
                              "layer), got %s of size %zu", where, L, dsarl_json_type_name(types),
                              json_is_array(types) ? json_array_size(types) : (size_t)0);
        for (int32_t i = 0; i < L; i++) {
            const char *s = json_string_value(json_array_get(types, (size_t)i));
            if (!s || (strcmp(s, "full") && strcmp(s, "shared")))
                return DSARL_FAIL(err, DSARL_E_INVALID, "%s: indexer_types[%d] is '%s'; valid: \"full\", \"shared\"",
                                  where, i, s ? s : dsarl_json_type_name(json_array_get(types, (size_t)i)));
            cfg->indexer_full[i] = strcmp(s, "full") == 0;
        }
    } else if (pattern && !json_is_null(pattern)) {
        size_t n = json_is_string(pattern) ? strlen(json_string_value(pattern))
                                           : json_is_array(pattern) ? json_array_size(pattern) : 0;
        if ((int64_t)n != L)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key 'index_topk_pattern' must have one entry per layer "
                              "(%d), got %zu", where, L, n);
        for (int32_t i = 0; i < L; i++) {
            if (json_is_string(pattern)) {
                char c = json_string_value(pattern)[i];
                if (c != 'F' && c != 'S')
                    return DSARL_FAIL(err, DSARL_E_INVALID, "%s: index_topk_pattern character %d is '%c'; valid: "
                                      "'F' (full), 'S' (shared)", where, i, c);
                cfg->indexer_full[i] = c == 'F';
            } else {
                const char *s = json_string_value(json_array_get(pattern, (size_t)i));
                if (!s || (strcmp(s, "full") && strcmp(s, "shared")))
                    return DSARL_FAIL(err, DSARL_E_INVALID, "%s: index_topk_pattern[%d] is not \"full\" or "
                                      "\"shared\"", where, i);
                cfg->indexer_full[i] = strcmp(s, "full") == 0;
            }
        }
    } else {
        int64_t freq = 1, offset = 2;
        DSARL_TRY(dsarl_json_get_int_or(root, "index_topk_freq", where, 1, &freq, err));
        DSARL_TRY(dsarl_json_get_int_or(root, "index_skip_topk_offset", where, 2, &offset, err));
        if (freq < 1)
            freq = 1; // transformers: max(freq, 1)
        for (int32_t i = 0; i < L; i++) {
            int64_t k = i - offset + 1;
            cfg->indexer_full[i] = (k > 0 ? k : 0) % freq == 0;
        }
    }
    if (!cfg->indexer_full[0])
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: layer 0 is an IndexShare \"shared\" layer, but a shared layer "
                          "reuses the top-k of an earlier \"full\" layer and there is none; make layer 0 \"full\"",
                          where);
    return DSARL_OK;
}

static int parse_mlp_types(glm5_config *cfg, const json_t *root, const char *where, dsarl_error *err)
{
    int32_t L = cfg->num_hidden_layers;
    const json_t *types = json_object_get(root, "mlp_layer_types");
    if (types && !json_is_null(types)) {
        if (!json_is_array(types) || (int64_t)json_array_size(types) != L)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key 'mlp_layer_types' must be a list of %d strings, got %s",
                              where, L, dsarl_json_type_name(types));
        for (int32_t i = 0; i < L; i++) {
            const char *s = json_string_value(json_array_get(types, (size_t)i));
            if (!s || (strcmp(s, "dense") && strcmp(s, "sparse")))
                return DSARL_FAIL(err, DSARL_E_INVALID, "%s: mlp_layer_types[%d] must be \"dense\" or \"sparse\"",
                                  where, i);
            cfg->mlp_sparse[i] = strcmp(s, "sparse") == 0;
        }
    } else {
        for (int32_t i = 0; i < L; i++)
            cfg->mlp_sparse[i] = i >= cfg->first_k_dense_replace;
    }
    return DSARL_OK;
}

int glm5_config_from_json(glm5_config *cfg, const json_t *root, const char *where, dsarl_error *err)
{
    if (!json_is_object(root))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: the config must be a JSON object", where);
    // transformers' GlmMoeDsaConfig defaults (= GLM-5)
    *cfg = (glm5_config){.vocab_size = 154880, .hidden_size = 6144, .intermediate_size = 12288,
                         .moe_intermediate_size = 2048, .num_hidden_layers = 78, .num_attention_heads = 64,
                         .q_lora_rank = 2048, .kv_lora_rank = 512, .qk_nope_head_dim = 192, .qk_rope_head_dim = 64,
                         .v_head_dim = 256, .n_routed_experts = 256, .n_shared_experts = 1,
                         .num_experts_per_tok = 8, .n_group = 1, .topk_group = 1, .norm_topk_prob = true,
                         .tie_word_embeddings = false, .routed_scaling_factor = 2.5, .rms_norm_eps = 1e-5,
                         .index_topk = 2048, .index_head_dim = 128, .index_n_heads = 32,
                         .max_position_embeddings = 202752, .first_k_dense_replace = 3};
    const char *model_type = NULL;
    DSARL_TRY(dsarl_json_get_string_or(root, "model_type", where, NULL, &model_type, err));
    if (model_type && strcmp(model_type, "glm_moe_dsa") != 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: model_type is '%s'; the glm5 plugins read 'glm_moe_dsa'", where,
                          model_type);
    DSARL_TRY(get_i64(root, "vocab_size", where, &cfg->vocab_size, err));
    DSARL_TRY(get_i64(root, "hidden_size", where, &cfg->hidden_size, err));
    DSARL_TRY(get_i64(root, "intermediate_size", where, &cfg->intermediate_size, err));
    DSARL_TRY(get_i64(root, "moe_intermediate_size", where, &cfg->moe_intermediate_size, err));
    DSARL_TRY(get_i32(root, "num_hidden_layers", where, &cfg->num_hidden_layers, err));
    DSARL_TRY(get_i32(root, "num_attention_heads", where, &cfg->num_attention_heads, err));
    int32_t kv_heads = cfg->num_attention_heads;
    DSARL_TRY(get_i32(root, "num_key_value_heads", where, &kv_heads, err));
    DSARL_TRY(get_i64(root, "q_lora_rank", where, &cfg->q_lora_rank, err));
    DSARL_TRY(get_i64(root, "kv_lora_rank", where, &cfg->kv_lora_rank, err));
    DSARL_TRY(get_i64(root, "qk_nope_head_dim", where, &cfg->qk_nope_head_dim, err));
    DSARL_TRY(get_i64(root, "qk_rope_head_dim", where, &cfg->qk_rope_head_dim, err));
    DSARL_TRY(get_i64(root, "v_head_dim", where, &cfg->v_head_dim, err));
    int64_t num_experts = -1; // BC alias of n_routed_experts, as transformers accepts it
    DSARL_TRY(get_i64(root, "num_experts", where, &num_experts, err));
    DSARL_TRY(get_i32(root, "n_routed_experts", where, &cfg->n_routed_experts, err));
    if (num_experts > 0)
        cfg->n_routed_experts = (int32_t)num_experts;
    DSARL_TRY(get_i32(root, "n_shared_experts", where, &cfg->n_shared_experts, err));
    DSARL_TRY(get_i32(root, "num_experts_per_tok", where, &cfg->num_experts_per_tok, err));
    DSARL_TRY(get_i32(root, "n_group", where, &cfg->n_group, err));
    DSARL_TRY(get_i32(root, "topk_group", where, &cfg->topk_group, err));
    DSARL_TRY(get_bool(root, "norm_topk_prob", where, &cfg->norm_topk_prob, err));
    DSARL_TRY(get_bool(root, "tie_word_embeddings", where, &cfg->tie_word_embeddings, err));
    DSARL_TRY(dsarl_json_get_double_or(root, "routed_scaling_factor", where, cfg->routed_scaling_factor,
                                       &cfg->routed_scaling_factor, err));
    DSARL_TRY(dsarl_json_get_double_or(root, "rms_norm_eps", where, cfg->rms_norm_eps, &cfg->rms_norm_eps, err));
    DSARL_TRY(get_i32(root, "index_topk", where, &cfg->index_topk, err));
    DSARL_TRY(get_i32(root, "index_head_dim", where, &cfg->index_head_dim, err));
    DSARL_TRY(get_i32(root, "index_n_heads", where, &cfg->index_n_heads, err));
    DSARL_TRY(get_i64(root, "max_position_embeddings", where, &cfg->max_position_embeddings, err));
    DSARL_TRY(get_i32(root, "first_k_dense_replace", where, &cfg->first_k_dense_replace, err));
    DSARL_TRY(get_i32(root, "num_nextn_predict_layers", where, &cfg->num_nextn_predict_layers, err));

    const char *act = "silu";
    DSARL_TRY(dsarl_json_get_string_or(root, "hidden_act", where, act, &act, err));
    if (strcmp(act, "silu") != 0)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "%s: hidden_act '%s' is not supported; glm_moe_dsa uses 'silu'",
                          where, act);
    bool attention_bias = false;
    DSARL_TRY(get_bool(root, "attention_bias", where, &attention_bias, err));
    if (attention_bias)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "%s: attention_bias true is not supported; GLM-5 checkpoints "
                          "use false", where);

    // every dimension in (0, max]: the bounds keep each tensor's element count far inside int64 (the largest product,
    // experts x 2 x moe_intermediate x hidden, stays below 2^54) and a hostile config.json cannot wrap a size
    struct { const char *key; int64_t v, max; } dims[] = {
        {"vocab_size", cfg->vocab_size, 1 << 24}, {"hidden_size", cfg->hidden_size, 1 << 16},
        {"intermediate_size", cfg->intermediate_size, 1 << 20},
        {"moe_intermediate_size", cfg->moe_intermediate_size, 1 << 20},
        {"num_hidden_layers", cfg->num_hidden_layers, GLM5_MAX_LAYERS},
        {"num_attention_heads", cfg->num_attention_heads, 1 << 10}, {"q_lora_rank", cfg->q_lora_rank, 1 << 16},
        {"kv_lora_rank", cfg->kv_lora_rank, 1 << 16}, {"qk_nope_head_dim", cfg->qk_nope_head_dim, 1 << 12},
        {"qk_rope_head_dim", cfg->qk_rope_head_dim, 1 << 12}, {"v_head_dim", cfg->v_head_dim, 1 << 12},
        {"n_routed_experts", cfg->n_routed_experts, 1 << 16}, {"num_experts_per_tok", cfg->num_experts_per_tok, 1 << 10},
        {"n_group", cfg->n_group, 1 << 16}, {"topk_group", cfg->topk_group, 1 << 16},
        {"index_topk", cfg->index_topk, 1 << 20}, {"index_head_dim", cfg->index_head_dim, 1 << 12},
        {"index_n_heads", cfg->index_n_heads, 1 << 10},
        {"max_position_embeddings", cfg->max_position_embeddings, 1 << 24}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        DSARL_TRY(check_positive(dims[i].v, dims[i].key, where, err));
        if (dims[i].v > dims[i].max)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key '%s' is %lld, more than the %lld this model supports", where,
                              dims[i].key, (long long)dims[i].v, (long long)dims[i].max);
    }
    if (cfg->n_shared_experts < 0 || cfg->n_shared_experts > 1 << 10)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key 'n_shared_experts' must be in [0, 1024], got %d", where,
                          cfg->n_shared_experts);
    if (cfg->num_hidden_layers > GLM5_MAX_LAYERS)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: num_hidden_layers %d exceeds the supported %d", where,
                          cfg->num_hidden_layers, GLM5_MAX_LAYERS);
    if (kv_heads != cfg->num_attention_heads)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: num_key_value_heads (%d) must equal num_attention_heads (%d) "
                          "for MLA", where, kv_heads, cfg->num_attention_heads);
    if (cfg->qk_rope_head_dim % 2 || cfg->qk_rope_head_dim > cfg->index_head_dim)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: qk_rope_head_dim (%lld) must be even and <= index_head_dim "
                          "(%d): the indexer ropes its first qk_rope_head_dim dims", where,
                          (long long)cfg->qk_rope_head_dim, cfg->index_head_dim);
    if (cfg->n_routed_experts % cfg->n_group || cfg->topk_group > cfg->n_group ||
        cfg->num_experts_per_tok > cfg->n_routed_experts / cfg->n_group * cfg->topk_group)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: n_group (%d) must divide n_routed_experts (%d), topk_group "
                          "(%d) must be <= n_group and num_experts_per_tok (%d) <= experts in the kept groups",
                          where, cfg->n_group, cfg->n_routed_experts, cfg->topk_group, cfg->num_experts_per_tok);
    if (cfg->n_group > 1 && cfg->n_routed_experts / cfg->n_group < 2)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: n_group %d leaves fewer than 2 experts per group; the router "
                          "scores a group by its top-2 experts", where, cfg->n_group);
    DSARL_TRY(parse_rope(cfg, root, where, err));
    DSARL_TRY(parse_indexer_types(cfg, root, where, err));
    DSARL_TRY(parse_mlp_types(cfg, root, where, err));

    cfg->qk_head_dim = cfg->qk_nope_head_dim + cfg->qk_rope_head_dim;
    cfg->softmax_scale = 1.0 / sqrt((double)cfg->qk_head_dim);
    cfg->attention_scaling = 1.0;
    if (strcmp(cfg->rope_type, "default") != 0) {
        // transformers yarn_apply_mscale (softmax scale) and _compute_yarn_parameters (cos/sin factor)
        if (cfg->rope_mscale_all_dim != 0.0) {
            double m = yarn_get_mscale(cfg->rope_factor, cfg->rope_mscale_all_dim);
            cfg->softmax_scale *= m * m;
        }
        if (cfg->rope_mscale != 0.0 && cfg->rope_mscale_all_dim != 0.0)
            cfg->attention_scaling = yarn_get_mscale(cfg->rope_factor, cfg->rope_mscale) /
                                     yarn_get_mscale(cfg->rope_factor, cfg->rope_mscale_all_dim);
        else
            cfg->attention_scaling = yarn_get_mscale(cfg->rope_factor, 1.0);
    }
    if (cfg->num_nextn_predict_layers < 0 || cfg->num_nextn_predict_layers > GLM5_MAX_LAYERS - cfg->num_hidden_layers)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key 'num_nextn_predict_layers' must be in [0, %d], got %d", where,
                          GLM5_MAX_LAYERS - cfg->num_hidden_layers, cfg->num_nextn_predict_layers);
    cfg->mtp_layers = 0;
    return DSARL_OK;
}

int glm5_config_enable_mtp(glm5_config *cfg, int64_t layers, const char *where, dsarl_error *err)
{
    if (layers == 0)
        return DSARL_OK;
    if (layers < 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "policy.megatron_cfg.mtp_num_layers must be >= 0 (0 or null: MTP "
                          "off), got %lld", (long long)layers);
    if (cfg->num_nextn_predict_layers == 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "policy.megatron_cfg.mtp_num_layers is %lld, but %s has no MTP "
                          "layer (num_nextn_predict_layers 0); set mtp_num_layers to 0", (long long)layers, where);
    if (layers > cfg->num_nextn_predict_layers)
        return DSARL_FAIL(err, DSARL_E_INVALID, "policy.megatron_cfg.mtp_num_layers is %lld, but %s has only %d MTP "
                          "layer(s) (num_nextn_predict_layers); pick 1..%d", (long long)layers, where,
                          cfg->num_nextn_predict_layers, cfg->num_nextn_predict_layers);
    cfg->mtp_layers = (int32_t)layers;
    for (int32_t i = cfg->num_hidden_layers; i < glm5_built_layers(cfg); i++) {
        cfg->indexer_full[i] = 1; // an MTP block always computes its own top-k
        cfg->mlp_sparse[i] = i >= cfg->first_k_dense_replace;
    }
    return DSARL_OK;
}

void glm5_rope_inv_freq(const glm5_config *cfg, float *inv_freq)
{
    int64_t dim = cfg->qk_rope_head_dim, half = dim / 2;
    for (int64_t i = 0; i < half; i++) {
        // float32 arithmetic in the order transformers uses: base ** (arange(0, dim, 2) / dim)
        float e = (float)(2 * i) / (float)dim;
        float pos_freq = powf((float)cfg->rope_theta, e);
        inv_freq[i] = 1.0f / pos_freq;
        if (strcmp(cfg->rope_type, "yarn") == 0) {
            double base = cfg->rope_theta, orig = (double)cfg->rope_original_max_position;
            double low = floor(dim * log(orig / (cfg->rope_beta_fast * 2 * GLM5_PI)) / (2 * log(base)));
            double high = ceil(dim * log(orig / (cfg->rope_beta_slow * 2 * GLM5_PI)) / (2 * log(base)));
            low = low > 0 ? low : 0;
            high = high < dim - 1 ? high : dim - 1;
            if (low == high)
                high += 0.001;
            float ramp = (float)(((float)i - low) / (high - low));
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float extrapolation = 1.0f - ramp;
            float interp = 1.0f / ((float)cfg->rope_factor * pos_freq);
            inv_freq[i] = interp * (1.0f - extrapolation) + inv_freq[i] * extrapolation;
        }
    }
}

int32_t glm5_config_full_layers(const glm5_config *cfg)
{
    int32_t n = 0;
    for (int32_t i = 0; i < cfg->num_hidden_layers; i++)
        n += cfg->indexer_full[i];
    return n;
}

int glm5_recipe_node_to_json(const dsarl_node *node, json_t **out, dsarl_error *err)
{
    json_t *v = NULL;
    switch (dsarl_node_kind(node)) {
    case DSARL_NODE_NULL: v = json_null(); break;
    case DSARL_NODE_BOOL: v = json_boolean(dsarl_node_as_bool(node)); break;
    case DSARL_NODE_INT: v = json_integer(dsarl_node_as_int(node)); break;
    case DSARL_NODE_FLOAT: v = json_real(dsarl_node_as_double(node)); break;
    case DSARL_NODE_STRING: v = json_string(dsarl_node_text(node)); break;
    case DSARL_NODE_LIST:
        v = json_array();
        for (size_t i = 0; i < dsarl_node_count(node); i++) {
            json_t *c = NULL;
            if (glm5_recipe_node_to_json(dsarl_node_child_at(node, i), &c, err) < 0) {
                json_decref(v);
                return err ? err->code : DSARL_E_INVALID;
            }
            json_array_append_new(v, c);
        }
        break;
    case DSARL_NODE_MAP:
        v = json_object();
        for (size_t i = 0; i < dsarl_node_count(node); i++) {
            json_t *c = NULL;
            if (glm5_recipe_node_to_json(dsarl_node_child_at(node, i), &c, err) < 0) {
                json_decref(v);
                return err ? err->code : DSARL_E_INVALID;
            }
            json_object_set_new(v, dsarl_node_key_at(node, i), c);
        }
        break;
    }
    if (!v)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory converting the recipe model config");
    *out = v;
    return DSARL_OK;
}

int glm5_config_from_recipe(glm5_config *cfg, const dsarl_node *recipe, dsarl_error *err)
{
    const dsarl_node *mc = dsarl_node_get(recipe, "policy.model_config");
    if (!mc || dsarl_node_kind(mc) != DSARL_NODE_MAP)
        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "recipe key policy.model_config must be a map of Hugging Face "
                          "config keys (hidden_size, num_hidden_layers, ...) when no model directory is given");
    json_t *root = NULL;
    DSARL_TRY(glm5_recipe_node_to_json(mc, &root, err));
    const dsarl_node *ov = dsarl_node_get(recipe, "policy.hf_config_overrides");
    if (ov && dsarl_node_kind(ov) == DSARL_NODE_MAP) {
        json_t *o = NULL;
        if (glm5_recipe_node_to_json(ov, &o, err) < 0) {
            json_decref(root);
            return err->code;
        }
        json_object_update(root, o);
        json_decref(o);
    }
    char where[256];
    dsarl_node_where(mc, where, sizeof where);
    char prefix[320];
    snprintf(prefix, sizeof prefix, "%s: policy.model_config", where);
    int rc = glm5_config_from_json(cfg, root, prefix, err);
    json_decref(root);
    return rc;
}

int glm5_config_to_json(const glm5_config *cfg, json_t **out, dsarl_error *err)
{
    json_t *o = json_object();
    json_t *arch = json_array();
    json_array_append_new(arch, json_string("GlmMoeDsaForCausalLM"));
    json_object_set_new(o, "architectures", arch);
    json_object_set_new(o, "model_type", json_string("glm_moe_dsa"));
#define SETI(k) json_object_set_new(o, #k, json_integer(cfg->k))
    SETI(vocab_size); SETI(hidden_size); SETI(intermediate_size); SETI(moe_intermediate_size);
    SETI(num_hidden_layers); SETI(num_attention_heads); SETI(q_lora_rank); SETI(kv_lora_rank);
    SETI(qk_nope_head_dim); SETI(qk_rope_head_dim); SETI(v_head_dim); SETI(n_routed_experts);
    SETI(n_shared_experts); SETI(num_experts_per_tok); SETI(n_group); SETI(topk_group); SETI(index_topk);
    SETI(index_head_dim); SETI(index_n_heads); SETI(max_position_embeddings); SETI(first_k_dense_replace);
    SETI(num_nextn_predict_layers);
#undef SETI
    json_object_set_new(o, "num_key_value_heads", json_integer(cfg->num_attention_heads));
    json_object_set_new(o, "norm_topk_prob", json_boolean(cfg->norm_topk_prob));
    json_object_set_new(o, "tie_word_embeddings", json_boolean(cfg->tie_word_embeddings));
    json_object_set_new(o, "routed_scaling_factor", json_real(cfg->routed_scaling_factor));
    json_object_set_new(o, "rms_norm_eps", json_real(cfg->rms_norm_eps));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "attention_bias", json_false());
    json_object_set_new(o, "dtype", json_string("float32"));
    json_t *rp = json_object();
    json_object_set_new(rp, "rope_type", json_string(cfg->rope_type));
    json_object_set_new(rp, "rope_theta", json_real(cfg->rope_theta));
    if (strcmp(cfg->rope_type, "default") != 0) {
        json_object_set_new(rp, "factor", json_real(cfg->rope_factor));
        json_object_set_new(rp, "original_max_position_embeddings", json_integer(cfg->rope_original_max_position));
        json_object_set_new(rp, "beta_fast", json_real(cfg->rope_beta_fast));
        json_object_set_new(rp, "beta_slow", json_real(cfg->rope_beta_slow));
        if (cfg->rope_mscale != 0.0)
            json_object_set_new(rp, "mscale", json_real(cfg->rope_mscale));
        if (cfg->rope_mscale_all_dim != 0.0)
            json_object_set_new(rp, "mscale_all_dim", json_real(cfg->rope_mscale_all_dim));
    }
    json_object_set_new(o, "rope_parameters", rp);
    json_t *it = json_array(), *mt = json_array();
    for (int32_t i = 0; i < cfg->num_hidden_layers; i++) {
        json_array_append_new(it, json_string(cfg->indexer_full[i] ? "full" : "shared"));
        json_array_append_new(mt, json_string(cfg->mlp_sparse[i] ? "sparse" : "dense"));
    }
    json_object_set_new(o, "indexer_types", it);
    json_object_set_new(o, "mlp_layer_types", mt);
    *out = o;
    return DSARL_OK;
}
