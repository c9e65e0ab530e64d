/* glm5_hf_io.c: Hugging Face directories: config.json + model.safetensors (or a sharded index), per-expert or
 * fused 3-D expert keys, float32/bfloat16/float16 tensors; MTP layer keys are skipped with one log line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dsarl/fileutil.h"
#include "dsarl/json.h"
#include "dsarl/log.h"
#include "dsarl/safetensors.h"
#include "glm5_model.h"

int glm5_read_hf_config(const char *dir, glm5_config *cfg, dsarl_error *err)
{
    char *path = dsarl_path_join(dir, "config.json");
    if (!path)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory");
    if (!dsarl_path_exists(path)) {
        int rc = DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s: missing; a Hugging Face model directory needs config.json",
                            path);
        free(path);
        return rc;
    }
    json_t *root = NULL;
    int rc = dsarl_json_load_file(path, &root, err);
    if (rc == 0)
        rc = glm5_config_from_json(cfg, root, path, err);
    json_decref(root);
    free(path);
    return rc;
}

// Where one checkpoint key lands in the model: a spec plus an element offset inside it (per-expert slices).
typedef struct key_target {
    int64_t spec;     // index into model->params, or -1
    int64_t offset;   // elements into the spec
    int64_t shape[2]; // expected 2-D shape of a per-expert slice
    int32_t slot;     // per-expert bookkeeping: expert*3 + {gate 0, up 1, down 2}; -1 for whole tensors
    int mtp;          // 1 for a key of a layer at or past num_hidden_layers (MTP)
} key_target;

static int64_t find_spec(const dsarl_model *m, const char *name)
{
    for (int64_t i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name))
            return i;
    return -1;
}

static key_target resolve_key(const dsarl_model *m, const char *key)
{
    key_target t = {.spec = find_spec(m, key), .slot = -1};
    int layer = -1, expert = -1, used = 0;
    char proj[16];
    if (sscanf(key, "model.layers.%d.%n", &layer, &used) == 1 && layer >= m->cfg.num_hidden_layers) {
        t.mtp = 1;
        return t;
    }
    if (t.spec >= 0)
        return t;
    if (sscanf(key, "model.layers.%d.mlp.experts.%d.%15[a-z]_proj.weight%n", &layer, &expert, proj, &used) == 3 &&
        key[used] == '\0' && layer >= 0 && layer < m->cfg.num_hidden_layers && expert >= 0 &&
        expert < m->cfg.n_routed_experts) {
        char fused[96];
        int64_t C = m->cfg.hidden_size, I = m->cfg.moe_intermediate_size;
        int is_down = !strcmp(proj, "down");
        snprintf(fused, sizeof fused, "model.layers.%d.mlp.experts.%s", layer, is_down ? "down_proj" : "gate_up_proj");
        t.spec = find_spec(m, fused);
        if (t.spec < 0)
            return t;
        if (!strcmp(proj, "gate"))
            t.offset = expert * 2 * I * C, t.shape[0] = I, t.shape[1] = C, t.slot = expert * 3;
        else if (!strcmp(proj, "up"))
            t.offset = expert * 2 * I * C + I * C, t.shape[0] = I, t.shape[1] = C, t.slot = expert * 3 + 1;
        else if (is_down)
            t.offset = expert * C * I, t.shape[0] = C, t.shape[1] = I, t.slot = expert * 3 + 2;
        else
            t.spec = -1;
    }
    return t;
}

typedef struct load_state {
    dsarl_model *m;
    unsigned char *whole;    // per spec: loaded as one tensor
    unsigned char **slices;  // per spec: per-expert slot flags (expert specs only)
    int64_t mtp_keys, unexpected_keys;
    float *staging;
    size_t staging_cap;
} load_state;

static int load_tensor(load_state *s, dsarl_safetensors_file *f, const char *key, dsarl_error *err)
{
    dsarl_model *m = s->m;
    const char *file = dsarl_safetensors_path(f);
    key_target t = resolve_key(m, key);
    if (t.mtp) {
        s->mtp_keys++;
        return DSARL_OK;
    }
    if (t.spec < 0) {
        if (s->unexpected_keys++ == 0)
            dsarl_log(DSARL_LOG_WARN, "%s: tensor '%s' is not part of the glm_moe_dsa model; ignored", file, key);
        return DSARL_OK;
    }
    const glm5_param *p = &m->params[t.spec];
    dsarl_tensor ten;
    DSARL_TRY(dsarl_safetensors_get(f, key, &ten, err));
    if (ten.dtype != DSARL_DTYPE_F32 && ten.dtype != DSARL_DTYPE_BF16 && ten.dtype != DSARL_DTYPE_F16)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor '%s' has dtype %s; the glm5 loader reads F32, BF16 "
                          "and F16", file, key, dsarl_dtype_name(ten.dtype));
    int32_t ndim = t.slot >= 0 ? 2 : p->ndim;
    const int64_t *want = t.slot >= 0 ? t.shape : p->shape;
    int ok = ten.ndim == ndim;
    for (int32_t i = 0; ok && i < ndim; i++)
        ok = ten.shape[i] == want[i];
    if (!ok) {
        char got[128], exp[128];
        dsarl_tensor w = {.ndim = ndim};
        for (int32_t i = 0; i < ndim; i++)
            w.shape[i] = want[i];
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor '%s' has shape %s but the config needs %s", file, key,
                          dsarl_tensor_shape_str(&ten, got, sizeof got), dsarl_tensor_shape_str(&w, exp, sizeof exp));
    }
    size_t n = (size_t)dsarl_tensor_numel(&ten);
    if (n > s->staging_cap) {
        float *b = realloc(s->staging, n * sizeof(float));
        if (!b)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory reading %s from %s", key, file);
        s->staging = b, s->staging_cap = n;
    }
    DSARL_TRY(dsarl_convert_to_f32(s->staging, ten.data, ten.dtype, n, err));
    DSARL_TRY(glm5_upload_param(m, p, t.offset, s->staging, n, err));
    if (t.slot >= 0) {
        if (!s->slices[t.spec] && !(s->slices[t.spec] = calloc((size_t)m->cfg.n_routed_experts * 3, 1)))
            return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory");
        s->slices[t.spec][t.slot] = 1;
    } else {
        s->whole[t.spec] = 1;
    }
    return DSARL_OK;
}

// The first parameter (or per-expert slice) no file provided, named as a checkpoint key.
static int check_complete(load_state *s, const char *dir, dsarl_error *err)
{
    dsarl_model *m = s->m;
    for (int64_t i = 0; i < m->n_params; i++) {
        const glm5_param *p = &m->params[i];
        if (s->whole[i])
            continue;
        if (strstr(p->name, ".mlp.experts.")) {
            int is_down = strstr(p->name, "down_proj") != NULL;
            for (int32_t e = 0; e < m->cfg.n_routed_experts; e++)
                for (int j = is_down ? 2 : 0; j < (is_down ? 3 : 2); j++)
                    if (!s->slices[i] || !s->slices[i][e * 3 + j]) {
                        static const char *proj[] = {"gate", "up", "down"};
                        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s: tensor 'model.layers.%d.mlp.experts.%d.%s_proj"
                                          ".weight' (or the fused '%s') is missing from the checkpoint", dir,
                                          p->layer, e, proj[j], p->name);
                    }
            continue;
        }
        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s: tensor '%s' is missing from the checkpoint", dir, p->name);
    }
    return DSARL_OK;
}

// The safetensors files of dir: model.safetensors, or the distinct files of model.safetensors.index.json.
static int list_files(const char *dir, char ***out, size_t *n_out, dsarl_error *err)
{
    char *single = dsarl_path_join(dir, "model.safetensors");
    char *index = dsarl_path_join(dir, "model.safetensors.index.json");
    int rc = DSARL_OK;
    char **files = NULL;
    size_t n = 0;
    if (dsarl_path_exists(single)) {
        files = malloc(sizeof(char *));
        files[n++] = single, single = NULL;
    } else if (dsarl_path_exists(index)) {
        json_t *root = NULL, *map = NULL;
        rc = dsarl_json_load_file(index, &root, err);
        if (rc == 0)
            rc = dsarl_json_get_object(root, "weight_map", index, &map, err);
        if (rc == 0) {
            files = calloc(json_object_size(map) + 1, sizeof(char *));
            const char *key;
            json_t *v;
            json_object_foreach(map, key, v) {
                const char *fname = json_string_value(v);
                if (!fname) {
                    rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: weight_map['%s'] must be a file name string", index,
                                    key);
                    break;
                }
                size_t j = 0;
                while (j < n && strcmp(strrchr(files[j], '/') + 1, fname))
                    j++;
                if (j == n)
                    files[n++] = dsarl_path_join(dir, fname);
            }
        }
        json_decref(root);
    } else {
        rc = DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s: no model.safetensors or model.safetensors.index.json", dir);
    }
    free(single), free(index);
    if (rc) {
        for (size_t i = 0; i < n; i++)
            free(files[i]);
        free(files);
        return rc;
    }
    *out = files, *n_out = n;
    return DSARL_OK;
}

int glm5_load_hf_weights(dsarl_model *m, const char *dir, dsarl_error *err)
{
    char *cfg_path = dsarl_path_join(dir, "config.json");
    int cfg_rc = cfg_path ? dsarl_json_load_file(cfg_path, &m->hf_config, err)
                          : DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory");
    free(cfg_path);
    DSARL_TRY(cfg_rc);
    char **files = NULL;
    size_t n_files = 0;
    DSARL_TRY(list_files(dir, &files, &n_files, err));
    load_state s = {.m = m, .whole = calloc((size_t)m->n_params, 1),
                    .slices = calloc((size_t)m->n_params, sizeof(unsigned char *))};
    int rc = (!s.whole || !s.slices) ? DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory") : DSARL_OK;
    for (size_t i = 0; i < n_files && rc == 0; i++) {
        dsarl_safetensors_file *f = NULL;
        rc = dsarl_safetensors_open(files[i], &f, err);
        for (size_t k = 0; rc == 0 && k < dsarl_safetensors_count(f); k++)
            rc = load_tensor(&s, f, dsarl_safetensors_name(f, k), err);
        dsarl_safetensors_close(f);
    }
    if (rc == 0)
        rc = check_complete(&s, dir, err);
    if (rc == 0 && s.mtp_keys)
        dsarl_log(DSARL_LOG_INFO, "%s: ignored %lld MTP tensor(s) of layers >= %d (MTP is not built yet)", dir,
                  (long long)s.mtp_keys, m->cfg.num_hidden_layers);
    if (rc == 0 && s.unexpected_keys > 1)
        dsarl_log(DSARL_LOG_WARN, "%s: %lld tensors in total were not part of the model and were ignored", dir,
                  (long long)s.unexpected_keys);
    for (int64_t i = 0; s.slices && i < m->n_params; i++)
        free(s.slices[i]);
    free(s.slices), free(s.whole), free(s.staging);
    for (size_t i = 0; i < n_files; i++)
        free(files[i]);
    free(files);
    return rc;
}

int glm5_save_hf(dsarl_model *m, const char *dir, dsarl_error *err)
{
    DSARL_TRY(dsarl_mkdir_p(dir, err));
    float *host = malloc((size_t)m->n_weights * sizeof(float));
    if (!host)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory saving to %s", dir);
    int rc = m->dev_ops->download_f32(m->dev, host, m->weights, m->storage, (size_t)m->n_weights, err);
    for (int64_t i = 0; i < m->n_params && rc == 0; i++) { // router biases from their float32 copies
        const float *copy = glm5_param_f32_copy(m, &m->params[i]);
        if (copy)
            rc = m->dev_ops->download_f32(m->dev, host + m->params[i].offset, copy, DSARL_DTYPE_F32,
                                          (size_t)m->params[i].numel, err);
    }
    // experts are written per expert (the layout of released GLM-5 checkpoints)
    int64_t n_entries = 0, E = m->cfg.n_routed_experts;
    for (int64_t i = 0; i < m->n_params; i++)
        n_entries += strstr(m->params[i].name, ".mlp.experts.") ? (strstr(m->params[i].name, "gate_up") ? 2 * E : E) : 1;
    dsarl_safetensors_entry *entries = calloc((size_t)n_entries, sizeof(*entries));
    char (*names)[96] = calloc((size_t)n_entries, 96);
    if (rc == 0 && (!entries || !names))
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory saving to %s", dir);
    int64_t k = 0, C = m->cfg.hidden_size, I = m->cfg.moe_intermediate_size;
    for (int64_t i = 0; i < m->n_params && rc == 0; i++) {
        const glm5_param *p = &m->params[i];
        float *base = host + p->offset;
        if (strstr(p->name, ".mlp.experts.")) {
            int is_down = strstr(p->name, "down_proj") != NULL;
            for (int64_t e = 0; e < E && rc == 0; e++)
                for (int j = 0; j < (is_down ? 1 : 2) && rc == 0; j++) {
                    const char *proj = is_down ? "down" : j == 0 ? "gate" : "up";
                    snprintf(names[k], 96, "model.layers.%d.mlp.experts.%lld.%s_proj.weight", p->layer,
                             (long long)e, proj);
                    int64_t shape[2] = {is_down ? C : I, is_down ? I : C};
                    float *data = is_down ? base + e * C * I : base + e * 2 * I * C + j * I * C;
                    entries[k].name = names[k];
                    rc = dsarl_tensor_init(&entries[k].tensor, data, DSARL_DTYPE_F32, 2, shape, DSARL_DEVICE_CPU, err);
                    k++;
                }
            continue;
        }
        entries[k].name = p->name;
        rc = dsarl_tensor_init(&entries[k].tensor, base, DSARL_DTYPE_F32, p->ndim, p->shape, DSARL_DEVICE_CPU, err);
        k++;
    }
    char *st_path = dsarl_path_join(dir, "model.safetensors"), *cfg_path = dsarl_path_join(dir, "config.json");
    dsarl_safetensors_kv meta[] = {{"format", "pt"}};
    if (rc == 0)
        rc = dsarl_safetensors_write(st_path, entries, (size_t)k, meta, 1, err);
    json_t *cj = NULL;
    if (rc == 0 && m->hf_config) {
        // the loaded config.json with its other keys (token ids, ...), now describing float32 weights
        cj = json_deep_copy(m->hf_config);
        if (!cj)
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory saving to %s", dir);
        else {
            json_object_set_new(cj, "dtype", json_string("float32"));
            json_object_del(cj, "torch_dtype");
            json_object_del(cj, "quantization_config");
        }
    } else if (rc == 0) {
        rc = glm5_config_to_json(&m->cfg, &cj, err);
    }
    if (rc == 0)
        rc = dsarl_json_write_file_atomic(cfg_path, cj, JSON_INDENT(2) | JSON_SORT_KEYS, err);
    json_decref(cj);
    free(st_path), free(cfg_path), free(entries), free(names), free(host);
    return rc;
}
