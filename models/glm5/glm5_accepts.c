/* glm5_accepts.c: which of the two glm_moe_dsa tables serves a checkpoint (dsarl_model_ops.accepts).
 *
 * A config.json with IndexShare (an index_topk_pattern, index_topk_freq > 1, or an indexer_types list with a
 * "shared" layer) is GLM-5.2's; any other glm_moe_dsa config is GLM-5 / GLM-5.1's. A hub id that is not a local
 * directory has no config to read, so its name decides: "GLM-5.1" / "glm-5.1" in it picks glm5.1, any other name
 * glm5.2 (the newest family) at a lower score. */
#include <jansson.h>
#include <string.h>
#include "glm5_ops.h"

// Scores: a config-decided match beats a name guess, which beats the catch-all.
enum { SCORE_CATCH_ALL = 1, SCORE_BY_NAME = 2, SCORE_BY_CONFIG = 3 };

static bool config_has_indexshare(json_t *config)
{
    json_t *pattern = json_object_get(config, "index_topk_pattern");
    if (pattern && !json_is_null(pattern))
        return true;
    json_t *freq = json_object_get(config, "index_topk_freq");
    if (json_is_integer(freq) && json_integer_value(freq) > 1)
        return true;
    json_t *types = json_object_get(config, "indexer_types");
    size_t i;
    json_t *t;
    json_array_foreach(types, i, t) {
        if (json_is_string(t) && strcmp(json_string_value(t), "shared") == 0)
            return true;
    }
    return false;
}

static int accepts_family(glm5_family family, const dsarl_model_probe *probe, dsarl_error *err)
{
    if (probe->config_path) {
        json_error_t jerr;
        json_t *config = json_load_file(probe->config_path, 0, &jerr);
        if (!config)
            return DSARL_FAIL(err, DSARL_E_INVALID, "cannot read %s: %s (line %d)", probe->config_path, jerr.text,
                              jerr.line);
        json_t *type = json_object_get(config, "model_type");
        bool ours = !json_is_string(type) || strcmp(json_string_value(type), "glm_moe_dsa") == 0;
        bool shared = config_has_indexshare(config);
        json_decref(config);
        return ours && shared == (family == GLM5_FAMILY_52) ? SCORE_BY_CONFIG : 0;
    }
    if (!probe->model_name)
        return 0;
    bool named_51 = strstr(probe->model_name, "GLM-5.1") || strstr(probe->model_name, "glm-5.1");
    if (family == GLM5_FAMILY_51)
        return named_51 ? SCORE_BY_NAME : 0;
    return named_51 ? 0 : SCORE_CATCH_ALL;
}

int glm5_accepts_51(const dsarl_model_probe *probe, dsarl_error *err)
{
    return accepts_family(GLM5_FAMILY_51, probe, err);
}

int glm5_accepts_52(const dsarl_model_probe *probe, dsarl_error *err)
{
    return accepts_family(GLM5_FAMILY_52, probe, err);
}
