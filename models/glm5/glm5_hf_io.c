/* glm5_hf_io.c: Hugging Face directories: config.json + model.safetensors (or a sharded index), per-expert or
 * fused 3-D expert keys, float32/bfloat16/float16 tensors and block-scaled FP8 weights (dequantized on load,
 * glm5_fp8.c); keys of MTP layers the model does not build (all of them unless policy.megatron_cfg.mtp_num_layers
 * trains some) are carried unchanged from load to save (glm5_extra).
 *
 * Under tensor/expert parallelism a rank holds slices (glm5_model.h): the loader opens only the files the index
 * names for keys it needs and copies only its slices out of the mapping (a row split is one byte range, a column
 * split one range per row, an expert split only that rank's expert keys), so a rank reads about its share of the
 * directory plus the replicated tensors. The save gathers every shard on world rank 0, which writes the whole
 * tensors in the layout a single process writes; so a directory saved under one layout loads under any other. */
#define _XOPEN_SOURCE 700 // strdup
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dsarl/comm.h"
#include "dsarl/fileutil.h"
#include "dsarl/json.h"
#include "dsarl/log.h"
#include "dsarl/safetensors.h"
#include "glm5_fp8.h"
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

// The world, tp and ep groups of the model's layout; NULL (a group of one) in a single process or under a core
// older than the ABI 1.3 groups.
static const dsarl_group *world_group(const dsarl_model *m)
{
    return DSARL_PARALLEL_HAS_GROUPS(&m->parallel) ? m->parallel.world : NULL;
}

// Every rank returns the same status: the first failing rank's error (code and sentence) reaches all of them, so
// no rank goes on after a peer failed to load its slices, and none returns OK from a save rank 0 could not write.
// Collective over the world; every rank calls it with its own rc.
static int agree(const dsarl_model *m, int rc, dsarl_error *err)
{
    const dsarl_group *world = world_group(m);
    if (dsarl_group_size(world) <= 1)
        return rc;
    int32_t me = dsarl_group_rank(world), first = rc ? me : INT32_MAX;
    dsarl_error mine = {0};
    if (rc && err)
        mine = *err;
    DSARL_TRY(dsarl_group_all_reduce_host(world, &first, 1, DSARL_DTYPE_I32, DSARL_REDUCE_MIN, err));
    if (first == INT32_MAX)
        return DSARL_OK;
    struct { int32_t code; char message[DSARL_ERROR_MESSAGE_MAX]; } msg;
    memset(&msg, 0, sizeof msg);
    if (me == first) {
        msg.code = rc;
        snprintf(msg.message, sizeof msg.message, "%s", err ? mine.message : "glm5: failed");
    }
    DSARL_TRY(dsarl_group_broadcast_host(world, &msg, (int64_t)sizeof msg, DSARL_DTYPE_U8, first, err));
    if (me == first)
        return rc;
    return DSARL_FAIL(err, msg.code < 0 ? msg.code : DSARL_E_INTERNAL, "%s (on rank %d)", msg.message, (int)first);
}

// Where one checkpoint key lands in the model: a spec plus an element offset inside this rank's shard of it.
typedef struct key_target {
    int64_t spec;     // index into model->params, or -1
    int64_t offset;   // elements into the spec's local shard (per-expert slices)
    int64_t shape[2]; // expected 2-D shape of a per-expert slice
    int32_t slot;     // per-expert bookkeeping: expert*3 + {gate 0, up 1, down 2}; -1 for whole tensors
    int mtp;          // 1 for a key of a layer at or past num_hidden_layers (MTP)
    int scale;        // 1 for an FP8 scale ("..._scale_inv"), read with its weight
    int other_stage;  // 1 for a key of the model that another pipeline stage holds
    int needed;       // 1 when this rank holds (part of) what the key stores
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
    if (sscanf(key, "model.layers.%d.%n", &layer, &used) == 1 && layer >= glm5_built_layers(&m->cfg)) {
        t.mtp = 1;
        t.needed = dsarl_group_rank(world_group(m)) == 0; // the rank that writes saves keeps them
        return t;
    }
    if (t.spec < 0 && glm5_fp8_is_scale_key(key)) {
        t.scale = 1;
        return t;
    }
    if (t.spec < 0 && glm5_stage_key_elsewhere(m, key)) { // read by the stage that holds it
        t.other_stage = 1;
        return t;
    }
    if (t.spec >= 0) { // a whole tensor: every rank holds a slice of it (or all of it)
        t.needed = 1;
        return t;
    }
    if (sscanf(key, "model.layers.%d.mlp.experts.%d.%15[a-z]_proj.weight%n", &layer, &expert, proj, &used) == 3 &&
        key[used] == '\0' && layer >= 0 && layer < glm5_built_layers(&m->cfg) && expert >= 0 &&
        expert < m->cfg.n_routed_experts) {
        char fused[96];
        int64_t C = m->cfg.hidden_size, I = m->cfg.moe_intermediate_size;
        int is_down = !strcmp(proj, "down");
        snprintf(fused, sizeof fused, "model.layers.%d.mlp.experts.%s", layer, is_down ? "down_proj" : "gate_up_proj");
        t.spec = find_spec(m, fused);
        if (t.spec < 0)
            return t;
        // expert parallelism: this rank's experts are one block of the expert dimension
        const glm5_param *p = &m->params[t.spec];
        int64_t local = expert - p->shard_start;
        t.needed = local >= 0 && local < p->shape[0];
        if (!strcmp(proj, "gate"))
            t.offset = local * 2 * I * C, t.shape[0] = I, t.shape[1] = C, t.slot = expert * 3;
        else if (!strcmp(proj, "up"))
            t.offset = local * 2 * I * C + I * C, t.shape[0] = I, t.shape[1] = C, t.slot = expert * 3 + 1;
        else if (is_down)
            t.offset = local * C * I, t.shape[0] = C, t.shape[1] = I, t.slot = expert * 3 + 2;
        else
            t.spec = -1, t.needed = 0;
    }
    if (t.spec < 0 && sscanf(key, "model.layers.%d.", &layer) == 1 && layer >= m->cfg.num_hidden_layers) {
        // a tensor of a trained MTP depth that the model does not build (a copy of the embedding or LM head, as
        // DeepSeek-V3 releases ship): carried unchanged like the untrained depths'
        t.mtp = 1;
        t.needed = dsarl_group_rank(world_group(m)) == 0;
    }
    return t;
}

typedef struct load_state {
    dsarl_model *m;
    unsigned char *whole;    // per spec: loaded as one tensor
    unsigned char **slices;  // per spec: per-expert slot flags (expert specs only), indexed by global expert
    int64_t mtp_keys, unexpected_keys;
    bool fp8;                // config.json's quantization_config is block-scaled FP8
    int64_t fp8_block[2];
    float *staging;
    size_t staging_cap;
    glm5_hf_read read;
} load_state;

// Counts MTP and unexpected keys (warning once, naming the file that holds the first) and says whether this
// rank needs key.
static key_target classify(load_state *s, const char *file, const char *key)
{
    key_target t = resolve_key(s->m, key);
    if (t.mtp)
        s->mtp_keys++;
    else if (t.spec < 0 && !t.scale && !t.other_stage && s->unexpected_keys++ == 0)
        dsarl_log(DSARL_LOG_WARN, "%s: tensor '%s' is not part of the glm_moe_dsa model; ignored", file, key);
    return t;
}

// Reads this rank's slice of key (resolved as t) from the mapping of f: only the bytes of the slice are touched.
static int load_tensor(load_state *s, dsarl_safetensors_file *f, const char *key, key_target t, dsarl_error *err)
{
    dsarl_model *m = s->m;
    const char *file = dsarl_safetensors_path(f);
    const glm5_param *p = &m->params[t.spec];
    dsarl_tensor ten, scale = {0};
    DSARL_TRY(dsarl_safetensors_get(f, key, &ten, err));
    bool fp8 = ten.dtype == DSARL_DTYPE_F8_E4M3;
    if (!fp8 && ten.dtype != DSARL_DTYPE_F32 && ten.dtype != DSARL_DTYPE_BF16 && ten.dtype != DSARL_DTYPE_F16)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor '%s' has dtype %s; the glm5 loader reads F32, BF16, "
                          "F16 and (with an fp8 quantization_config) F8_E4M3", file, key,
                          dsarl_dtype_name(ten.dtype));
    if (fp8 && !s->fp8)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: tensor '%s' is F8_E4M3 but config.json has no fp8 "
                          "quantization_config (its block size and scales)", file, key);
    if (fp8) { // its scales sit beside it in the same file, as FP8 releases write them
        char scale_key[256];
        snprintf(scale_key, sizeof scale_key, "%s_scale_inv", key);
        if (!dsarl_safetensors_has(f, scale_key))
            return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s: FP8 tensor '%s' has no '%s' in the same file", file, key,
                              scale_key);
        DSARL_TRY(dsarl_safetensors_get(f, scale_key, &scale, err));
    }
    // the file holds the whole tensor (the Hugging Face shape), whatever this rank's shard is
    int32_t ndim = t.slot >= 0 ? 2 : p->ndim;
    const int64_t *want = t.slot >= 0 ? t.shape : p->full_shape;
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
    // this rank's slice: `outer` runs of `span` contiguous elements, `stride` apart, from element `first`
    int64_t n = dsarl_tensor_numel(&ten), outer = 1, span = n, stride = 0, first = 0;
    if (t.slot < 0 && p->shard_dim >= 0) {
        int64_t inner = 1;
        for (int32_t d = 0; d < p->shard_dim; d++)
            outer *= p->full_shape[d];
        for (int32_t d = p->shard_dim + 1; d < p->ndim; d++)
            inner *= p->full_shape[d];
        span = p->shape[p->shard_dim] * inner;
        stride = p->full_shape[p->shard_dim] * inner;
        first = p->shard_start * inner;
        n = p->numel;
    }
    if ((size_t)n > s->staging_cap) {
        float *b = realloc(s->staging, (size_t)n * sizeof(float));
        if (!b)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory reading %s from %s", key, file);
        s->staging = b, s->staging_cap = (size_t)n;
    }
    size_t elem = dsarl_dtype_size(ten.dtype);
    const unsigned char *base = ten.data;
    if (fp8) {
        DSARL_TRY(glm5_fp8_dequantize(s->staging, &ten, &scale, s->fp8_block, first, outer, span, stride, file, key,
                                      err));
        s->read.data_bytes += (int64_t)dsarl_tensor_nbytes(&scale);
    }
    for (int64_t o = 0; !fp8 && o < outer; o++)
        DSARL_TRY(dsarl_convert_to_f32(s->staging + o * span, base + (size_t)(first + o * stride) * elem, ten.dtype,
                                       (size_t)span, err));
    s->read.data_bytes += n * (int64_t)elem;
    DSARL_TRY(glm5_upload_param(m, p, t.offset, s->staging, (size_t)n, err));
    if (t.slot >= 0) {
        if (!s->slices[t.spec] && !(s->slices[t.spec] = calloc((size_t)m->cfg.n_routed_experts * 3, 1)))
            return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory");
        s->slices[t.spec][t.slot] = 1;
    } else {
        s->whole[t.spec] = 1;
    }
    return DSARL_OK;
}

// The first parameter (or per-expert slice of this rank's experts) no file provided, named as a checkpoint key.
static int check_complete(load_state *s, const char *dir, dsarl_error *err)
{
    dsarl_model *m = s->m;
    for (int64_t i = 0; i < m->n_params; i++) {
        const glm5_param *p = &m->params[i];
        if (s->whole[i])
            continue;
        if (strstr(p->name, ".mlp.experts.")) {
            int is_down = strstr(p->name, "down_proj") != NULL;
            for (int64_t e = p->shard_start; e < p->shard_start + p->shape[0]; e++)
                for (int j = is_down ? 2 : 0; j < (is_down ? 3 : 2); j++)
                    if (!s->slices[i] || !s->slices[i][e * 3 + j]) {
                        static const char *proj[] = {"gate", "up", "down"};
                        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s: tensor 'model.layers.%d.mlp.experts.%lld.%s"
                                          "_proj.weight' (or the fused '%s') is missing from the checkpoint", dir,
                                          p->layer, (long long)e, proj[j], p->name);
                    }
            continue;
        }
        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s: tensor '%s' is missing from the checkpoint", dir, p->name);
    }
    return DSARL_OK;
}

// One key of the directory: its name, the file that holds it (index into the file list) and where it lands.
typedef struct hf_key {
    const char *name;
    size_t file;
    key_target t;
} hf_key;

// The files of a directory and its keys: model.safetensors (opened here: its header lists the keys), or the
// distinct files of model.safetensors.index.json with the keys of its weight_map (nothing opened yet).
typedef struct hf_dir {
    char **files;
    const char **names;             // the files as the index names them (NULL for model.safetensors)
    size_t n_files;
    dsarl_safetensors_file *single; // the open model.safetensors, or NULL
    json_t *index;                  // the parsed index, or NULL; owns the key names
    hf_key *keys;
    size_t n_keys;
} hf_dir;

static void hf_dir_free(hf_dir *d)
{
    for (size_t i = 0; i < d->n_files; i++)
        free(d->files[i]);
    free(d->files), free(d->names), free(d->keys);
    dsarl_safetensors_close(d->single);
    json_decref(d->index);
}

static int list_files(load_state *s, const char *dir, hf_dir *d, dsarl_error *err)
{
    char *single = dsarl_path_join(dir, "model.safetensors");
    char *index = dsarl_path_join(dir, "model.safetensors.index.json");
    int rc = (!single || !index) ? DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory") : DSARL_OK;
    if (rc == 0 && dsarl_path_exists(single)) {
        d->files = malloc(sizeof(char *));
        rc = d->files ? dsarl_safetensors_open(single, &d->single, err)
                      : DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory");
        if (d->files)
            d->files[d->n_files++] = single, single = NULL;
        size_t n = rc == 0 ? dsarl_safetensors_count(d->single) : 0;
        if (rc == 0 && !(d->keys = calloc(n + 1, sizeof(hf_key))))
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory");
        for (size_t k = 0; rc == 0 && k < n; k++) {
            hf_key *key = &d->keys[d->n_keys++];
            key->name = dsarl_safetensors_name(d->single, k);
            key->t = classify(s, d->files[0], key->name);
        }
    } else if (rc == 0 && dsarl_path_exists(index)) {
        json_t *map = NULL;
        rc = dsarl_json_load_file(index, &d->index, err);
        if (rc == 0)
            rc = dsarl_json_get_object(d->index, "weight_map", index, &map, err);
        size_t n = rc == 0 ? json_object_size(map) + 1 : 0;
        if (rc == 0 && (!(d->files = calloc(n, sizeof(char *))) || !(d->names = calloc(n, sizeof(char *))) ||
                        !(d->keys = calloc(n, sizeof(hf_key)))))
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory");
        const char *name;
        json_t *v;
        if (rc == 0) {
            json_object_foreach(map, name, v) {
                const char *fname = json_string_value(v);
                if (!fname) {
                    rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: weight_map['%s'] must be a file name string", index,
                                    name);
                    break;
                }
                size_t j = 0;
                while (j < d->n_files && strcmp(d->names[j], fname))
                    j++;
                if (j == d->n_files) {
                    d->names[j] = fname;
                    if (!(d->files[d->n_files++] = dsarl_path_join(dir, fname))) {
                        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory");
                        break;
                    }
                }
                hf_key *key = &d->keys[d->n_keys++];
                key->name = name, key->file = j, key->t = classify(s, d->files[j], name);
            }
        }
    } else if (rc == 0) {
        rc = DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s: no model.safetensors or model.safetensors.index.json", dir);
    }
    free(single), free(index);
    return rc;
}

int glm5_hf_has_key(const char *dir, const char *key, bool *has, dsarl_error *err)
{
    char *single = dsarl_path_join(dir, "model.safetensors"), *index = dsarl_path_join(dir, "model.safetensors.index.json");
    int rc = (!single || !index) ? DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory") : DSARL_OK;
    *has = false;
    if (rc == 0 && dsarl_path_exists(single)) {
        dsarl_safetensors_file *f = NULL;
        rc = dsarl_safetensors_open(single, &f, err);
        *has = rc == 0 && dsarl_safetensors_has(f, key);
        dsarl_safetensors_close(f);
    } else if (rc == 0 && dsarl_path_exists(index)) {
        json_t *root = NULL, *map = NULL;
        rc = dsarl_json_load_file(index, &root, err);
        if (rc == 0)
            rc = dsarl_json_get_object(root, "weight_map", index, &map, err);
        *has = rc == 0 && json_object_get(map, key) != NULL;
        json_decref(root);
    } // no weights at all: the load names what is missing
    free(single), free(index);
    return rc;
}

void glm5_extra_free(glm5_extra *x)
{
    for (size_t i = 0; i < x->n_files; i++)
        dsarl_safetensors_close(x->files[i]);
    for (size_t i = 0; i < x->n; i++)
        free(x->names[i]);
    free(x->files), free(x->names), free(x->file_of);
    memset(x, 0, sizeof *x);
}

// Records key as kept from the file being read; new_file: the first kept key of that file (a slot for its mapping,
// which load_files fills once the file's keys are done).
static int keep_extra(glm5_extra *x, const char *key, bool new_file, dsarl_error *err)
{
    if (new_file) {
        dsarl_safetensors_file **files = realloc(x->files, (x->n_files + 1) * sizeof *files);
        if (!files)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory keeping MTP tensors");
        x->files = files;
        x->files[x->n_files++] = NULL;
    }
    char **names = realloc(x->names, (x->n + 1) * sizeof *names);
    size_t *file_of = names ? realloc(x->file_of, (x->n + 1) * sizeof *file_of) : NULL;
    if (names)
        x->names = names;
    if (file_of)
        x->file_of = file_of;
    char *copy = file_of ? strdup(key) : NULL;
    if (!copy)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory keeping MTP tensors");
    x->names[x->n] = copy;
    x->file_of[x->n++] = x->n_files - 1;
    return DSARL_OK;
}

// Loads this rank's slices from the files that hold any; the others are never opened.
static int load_files(load_state *s, hf_dir *d, dsarl_error *err)
{
    int rc = DSARL_OK;
    s->read.files_listed = (int64_t)d->n_files;
    for (size_t i = 0; i < d->n_files && rc == 0; i++) {
        size_t wanted = 0;
        for (size_t k = 0; k < d->n_keys; k++)
            wanted += d->keys[k].file == i && d->keys[k].t.needed;
        if (!wanted)
            continue;
        dsarl_safetensors_file *f = d->single;
        if (!f)
            rc = dsarl_safetensors_open(d->files[i], &f, err);
        if (rc == 0) {
            s->read.files_opened++;
            s->read.header_bytes += (int64_t)dsarl_safetensors_header_bytes(f);
        }
        size_t kept = 0;
        for (size_t k = 0; rc == 0 && k < d->n_keys; k++) {
            if (d->keys[k].file != i || !d->keys[k].t.needed)
                continue;
            if (d->keys[k].t.mtp)
                rc = keep_extra(&s->m->extra, d->keys[k].name, kept++ == 0, err);
            else
                rc = load_tensor(s, f, d->keys[k].name, d->keys[k].t, err);
        }
        if (rc == 0 && kept) { // the mapping stays open for the saves; the model owns it now
            s->m->extra.files[s->m->extra.n_files - 1] = f;
            if (f == d->single)
                d->single = NULL;
        } else if (f != d->single) {
            dsarl_safetensors_close(f);
        }
    }
    return rc;
}

// This rank's part of the load; no collective inside, so a failure here cannot leave a peer waiting.
static int load_local(dsarl_model *m, const char *dir, load_state *s, dsarl_error *err)
{
    char *cfg_path = dsarl_path_join(dir, "config.json");
    int rc = cfg_path ? dsarl_json_load_file(cfg_path, &m->hf_config, err)
                      : DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory");
    free(cfg_path);
    DSARL_TRY(rc);
    DSARL_TRY(glm5_fp8_scheme(m->hf_config, dir, &s->fp8, s->fp8_block, err));
    glm5_extra_free(&m->extra); // a reload replaces what an earlier load kept
    hf_dir d = {0};
    if (!(s->whole = calloc((size_t)m->n_params, 1)) ||
        !(s->slices = calloc((size_t)m->n_params, sizeof(unsigned char *))))
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory");
    rc = list_files(s, dir, &d, err);
    if (rc == 0)
        rc = load_files(s, &d, err);
    if (rc == 0)
        rc = check_complete(s, dir, err);
    hf_dir_free(&d);
    return rc;
}

int glm5_load_hf_weights(dsarl_model *m, const char *dir, dsarl_error *err)
{
    load_state s = {.m = m};
    int rc = load_local(m, dir, &s, err);
    m->hf_read = s.read;
    rc = agree(m, rc, err);
    if (rc == 0 && s.mtp_keys)
        dsarl_log(DSARL_LOG_INFO, "%s: %lld MTP tensor(s) of layers >= %d are not trained (%d MTP depth(s) "
                  "built); every save writes them back unchanged", dir, (long long)s.mtp_keys,
                  m->cfg.num_hidden_layers, m->cfg.mtp_layers);
    if (rc == 0 && s.fp8)
        dsarl_log(DSARL_LOG_INFO, "%s: FP8 weights dequantized to %s (blocks of %lld x %lld); saves write them "
                  "unquantized", dir, dsarl_dtype_name(m->storage), (long long)s.fp8_block[0],
                  (long long)s.fp8_block[1]);
    if (rc == 0 && s.unexpected_keys > 1)
        dsarl_log(DSARL_LOG_WARN, "%s: %lld tensors in total were not part of the model and were ignored", dir,
                  (long long)s.unexpected_keys);
    if (rc == 0)
        dsarl_log(DSARL_LOG_DEBUG, "%s: read %lld tensor bytes and %lld header bytes from %lld of %lld file(s) "
                  "(tp rank %d of %d, ep rank %d of %d)", dir, (long long)s.read.data_bytes,
                  (long long)s.read.header_bytes, (long long)s.read.files_opened, (long long)s.read.files_listed,
                  m->shards.tp_rank, m->shards.tp_size, m->shards.ep_rank, m->shards.ep_size);
    for (int64_t i = 0; s.slices && i < m->n_params; i++)
        free(s.slices[i]);
    free(s.slices), free(s.whole), free(s.staging);
    return rc;
}

// Puts block `part` of a shard split of p (p->numel values, rank `part`'s shard) into the whole tensor full: the
// inverse of glm5_param_take_shard for that rank.
static void put_shard(const glm5_param *p, int32_t part, const float *block, float *full)
{
    int64_t outer = 1, inner = 1;
    for (int32_t d = 0; d < p->shard_dim; d++)
        outer *= p->full_shape[d];
    for (int32_t d = p->shard_dim + 1; d < p->ndim; d++)
        inner *= p->full_shape[d];
    int64_t full_span = p->full_shape[p->shard_dim] * inner, span = p->shape[p->shard_dim] * inner;
    for (int64_t o = 0; o < outer; o++)
        memcpy(full + o * full_span + (int64_t)part * span, block + o * span, (size_t)span * sizeof(float));
}

// Gathers parameter p (this rank's shard in local) into full on world rank 0 (full is NULL elsewhere). A split
// tensor travels over the group that splits it (tp, or ep for experts), and only the one group that contains rank
// 0 takes part: the other groups hold replicas of the same shards (other dp/edp ranks). Collective.
static int gather_param(const dsarl_model *m, const glm5_param *p, const float *local, float *full, float *scratch,
                        dsarl_error *err)
{
    const dsarl_parallel *par = &m->parallel;
    if (p->shard_dim < 0) { // every rank holds it whole: rank 0's copy is the tensor
        if (full)
            memcpy(full, local, (size_t)p->numel * sizeof(float));
        return DSARL_OK;
    }
    bool expert = p->shard == GLM5_SHARD_EXPERT;
    const dsarl_group *g = DSARL_PARALLEL_HAS_GROUPS(par) ? (expert ? par->ep : par->tp) : NULL;
    bool takes_part = expert ? par->edp_rank == 0 && par->pp_rank == 0
                             : par->dp_rank == 0 && par->cp_rank == 0 && par->pp_rank == 0;
    if (!takes_part)
        return DSARL_OK;
    int32_t rank = dsarl_group_rank(g), size = dsarl_group_size(g);
    // block r lands at shard index r: the group's ranks must be the tp (ep) coordinates the shards were cut by
    if (!g || rank != (expert ? par->ep_rank : par->tp_rank))
        return DSARL_FAIL(err, DSARL_E_INTERNAL, "glm5: saving %s needs the %s group of the layout with ranks in "
                          "shard order", p->name, expert ? "ep" : "tp");
    if (rank != 0)
        return dsarl_group_send_host(g, local, p->numel, DSARL_DTYPE_F32, 0, err);
    put_shard(p, 0, local, full);
    for (int32_t r = 1; r < size; r++) {
        DSARL_TRY(dsarl_group_recv_host(g, scratch, p->numel, DSARL_DTYPE_F32, r, err));
        put_shard(p, r, scratch, full);
    }
    return DSARL_OK;
}

// How many safetensors keys whole tensor p becomes: experts are written per expert (the layout of released GLM-5
// checkpoints), two keys (gate, up) per expert for the fused gate_up_proj.
static int64_t keys_of(const dsarl_model *m, const glm5_param *p)
{
    if (!strstr(p->name, ".mlp.experts."))
        return 1;
    return strstr(p->name, "gate_up") ? 2 * (int64_t)m->cfg.n_routed_experts : m->cfg.n_routed_experts;
}

// Writes the whole tensors of parameters [first, last) (data[i - first] each) into one safetensors file at path,
// plus the kept MTP tensors when with_extra, and names it fname in weight_map when there is one.
static int write_file(const dsarl_model *m, const glm5_param *params, const char *path, const char *fname,
                      int64_t first, int64_t last, float *const *data, bool with_extra, json_t *weight_map,
                      dsarl_error *err)
{
    int64_t n_entries = 0, E = m->cfg.n_routed_experts, C = m->cfg.hidden_size, I = m->cfg.moe_intermediate_size;
    for (int64_t i = first; i < last; i++)
        n_entries += keys_of(m, &params[i]);
    int64_t n_params_entries = n_entries;
    if (with_extra)
        n_entries += (int64_t)m->extra.n;
    dsarl_safetensors_entry *entries = calloc((size_t)n_entries + 1, sizeof(*entries));
    char (*names)[96] = calloc((size_t)n_entries + 1, 96);
    int rc = (!entries || !names) ? DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory writing %s", path) : DSARL_OK;
    int64_t k = 0;
    for (int64_t i = first; i < last && rc == 0; i++) {
        const glm5_param *p = &params[i];
        float *base = data[i - first];
        if (keys_of(m, p) == 1) {
            snprintf(names[k], 96, "%s", p->name);
            rc = dsarl_tensor_init(&entries[k].tensor, base, DSARL_DTYPE_F32, p->ndim, p->full_shape,
                                   DSARL_DEVICE_CPU, err);
            entries[k].name = names[k];
            k++;
            continue;
        }
        int is_down = strstr(p->name, "down_proj") != NULL;
        for (int64_t e = 0; e < E && rc == 0; e++)
            for (int j = 0; j < (is_down ? 1 : 2) && rc == 0; j++) {
                const char *proj = is_down ? "down" : j == 0 ? "gate" : "up";
                snprintf(names[k], 96, "model.layers.%d.mlp.experts.%lld.%s_proj.weight", p->layer, (long long)e,
                         proj);
                int64_t shape[2] = {is_down ? C : I, is_down ? I : C};
                float *at = is_down ? base + e * C * I : base + e * 2 * I * C + j * I * C;
                entries[k].name = names[k];
                rc = dsarl_tensor_init(&entries[k].tensor, at, DSARL_DTYPE_F32, 2, shape, DSARL_DEVICE_CPU, err);
                k++;
            }
    }
    // the MTP tensors as loaded: their own dtype and bytes, straight from the kept mappings
    for (size_t j = 0; rc == 0 && with_extra && j < m->extra.n; j++, k++) {
        entries[k].name = m->extra.names[j];
        rc = dsarl_safetensors_get(m->extra.files[m->extra.file_of[j]], m->extra.names[j], &entries[k].tensor, err);
    }
    dsarl_safetensors_kv meta[] = {{"format", "pt"}};
    if (rc == 0)
        rc = dsarl_safetensors_write(path, entries, (size_t)k, meta, 1, err);
    for (int64_t j = 0; rc == 0 && weight_map && j < k; j++)
        if (json_object_set_new(weight_map, j < n_params_entries ? names[j] : entries[j].name, json_string(fname)))
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory writing the index of %s", path);
    free(entries), free(names);
    return rc;
}

// Writes dir/config.json: the loaded config.json with its other keys (token ids, ...), now describing float32
// weights, or the config itself for a model built from a recipe.
static int write_config(const dsarl_model *m, const char *dir, dsarl_error *err)
{
    char *path = dsarl_path_join(dir, "config.json");
    json_t *cj = NULL;
    int rc = path ? DSARL_OK : DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory saving to %s", dir);
    if (rc == 0 && m->hf_config) {
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
        rc = dsarl_json_write_file_atomic(path, cj, JSON_INDENT(2) | JSON_SORT_KEYS, err);
    json_decref(cj);
    free(path);
    return rc;
}

// Removes dir/name when it exists (a file of an earlier save the new one replaces).
static int remove_stale(const char *dir, const char *name, dsarl_error *err)
{
    char *path = dsarl_path_join(dir, name);
    if (!path)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory saving to %s", dir);
    int rc = DSARL_OK;
    if (remove(path) != 0 && errno != ENOENT)
        rc = DSARL_FAIL(err, DSARL_E_IO, "%s: cannot remove the earlier save's file: %s", path, strerror(errno));
    free(path);
    return rc;
}

// Downloads this rank's shards (router biases from their float32 copies) into host (m->n_weights values).
static int download_local(dsarl_model *m, float *host, dsarl_error *err)
{
    DSARL_TRY(m->dev_ops->download_f32(m->dev, host, m->weights, m->storage, (size_t)m->n_weights, err));
    for (int64_t i = 0; i < m->n_params; i++) {
        const float *copy = glm5_param_f32_copy(m, &m->params[i]);
        if (copy)
            DSARL_TRY(m->dev_ops->download_f32(m->dev, host + m->params[i].offset, copy, DSARL_DTYPE_F32,
                                               (size_t)m->params[i].numel, err));
    }
    return DSARL_OK;
}

// Splits the parameters, in buffer order, into files of at most max_bytes of float32 each (a larger tensor gets a
// file of its own): file f holds [starts[f], starts[f + 1]). Every rank computes the same split from the config.
static int plan_files(const glm5_param *params, int64_t n_params, int64_t max_bytes, int64_t **starts,
                      int64_t *n_files, dsarl_error *err)
{
    int64_t *s = malloc((size_t)(n_params + 1) * sizeof(int64_t)), n = 0, bytes = 0;
    if (!s)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory planning the save");
    for (int64_t i = 0; i < n_params; i++) {
        int64_t b = params[i].full_numel * (int64_t)sizeof(float);
        if (i == 0 || (bytes > 0 && bytes + b > max_bytes))
            s[n++] = i, bytes = 0;
        bytes += b;
    }
    s[n] = n_params;
    *starts = s, *n_files = n;
    return DSARL_OK;
}

int glm5_save_hf_files(dsarl_model *m, const char *dir, int64_t max_file_bytes, dsarl_error *err)
{
    bool writer = dsarl_group_rank(world_group(m)) == 0;
    // the whole model's tensors, in buffer order: under pipeline parallelism the writer's stage holds only its own,
    // the others come from their stages (local[i]: the tensor's spec on this rank, or -1)
    glm5_param *all = m->params;
    int64_t n_all = m->n_params, *local = NULL;
    int rc = glm5_stage_all_specs(m, &all, &n_all, &local, err);
    if (rc)
        return rc;
    bool split = m->stage.size > 1; // does any rank hold less than the whole model (or of a tensor)?
    int64_t max_numel = 0, total_bytes = 0;
    for (int64_t i = 0; i < n_all; i++) {
        split |= all[i].shard_dim >= 0;
        max_numel = all[i].numel > max_numel ? all[i].numel : max_numel;
        total_bytes += all[i].full_numel * (int64_t)sizeof(float);
    }
    for (size_t j = 0; j < m->extra.n; j++) {
        dsarl_tensor t;
        if (dsarl_safetensors_get(m->extra.files[m->extra.file_of[j]], m->extra.names[j], &t, err) == 0)
            total_bytes += (int64_t)dsarl_tensor_nbytes(&t);
    }
    int64_t *starts = NULL, n_files = 0;
    float *host = malloc((size_t)m->n_weights * sizeof(float)), *scratch = NULL, *buf = NULL, *staged = NULL;
    float **data = calloc((size_t)n_all + 1, sizeof(float *));
    json_t *weight_map = NULL;
    rc = (!host || !data) ? DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory saving to %s", dir) : DSARL_OK;
    if (rc == 0 && m->stage.size > 1 && !(staged = malloc((size_t)(max_numel > 0 ? max_numel : 1) * sizeof(float))))
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory saving to %s", dir);
    if (rc == 0)
        rc = download_local(m, host, err);
    if (rc == 0)
        rc = plan_files(all, n_all, max_file_bytes > 0 ? max_file_bytes : INT64_MAX, &starts, &n_files, err);
    if (rc == 0 && writer) {
        rc = dsarl_mkdir_p(dir, err);
        // an earlier single-file save would shadow the new index (loaders prefer model.safetensors): it goes
        // first, so a save that dies half way leaves a directory that fails to load rather than stale weights
        if (rc == 0 && n_files > 1)
            rc = remove_stale(dir, "model.safetensors", err);
        if (rc == 0 && n_files > 1 && !(weight_map = json_object()))
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory saving to %s", dir);
        if (rc == 0 && split && !(scratch = malloc((size_t)max_numel * sizeof(float))))
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory saving to %s", dir);
    }
    rc = agree(m, rc, err); // a peer that could not download its shards stops everyone before any collective
    // one file at a time: rank 0 holds at most one file's whole tensors
    for (int64_t f = 0; rc == 0 && f < n_files; f++) {
        int64_t first = starts[f], last = starts[f + 1], numel = 0;
        for (int64_t i = first; i < last; i++)
            numel += all[i].full_numel;
        if (split && writer && !(buf = malloc((size_t)numel * sizeof(float))))
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory gathering %lld weights to save to %s",
                            (long long)numel, dir);
        if (split)
            rc = agree(m, rc, err);
        for (int64_t i = first, at = 0; rc == 0 && i < last; i++) {
            const glm5_param *p = &all[i];
            const float *mine = local[i] >= 0 ? host + m->params[local[i]].offset : NULL;
            data[i - first] = split ? (writer ? buf + at : NULL) : host + p->offset;
            at += p->full_numel;
            if (split) // this stage's shard, or its copy from the stage that holds it (first stage ranks)
                rc = glm5_stage_fetch(m, p, mine, staged, &mine, err);
            if (split && rc == 0)
                rc = gather_param(m, p, mine, data[i - first], scratch, err);
        }
        char fname[64];
        if (n_files == 1)
            snprintf(fname, sizeof fname, "model.safetensors");
        else
            snprintf(fname, sizeof fname, "model-%05lld-of-%05lld.safetensors", (long long)f + 1, (long long)n_files);
        char *path = writer && rc == 0 ? dsarl_path_join(dir, fname) : NULL;
        if (writer && rc == 0)
            rc = path ? write_file(m, all, path, fname, first, last, data, f == n_files - 1, weight_map, err)
                      : DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory saving to %s", dir);
        free(path);
        free(buf), buf = NULL;
        rc = agree(m, rc, err);
    }
    if (rc == 0 && writer)
        rc = write_config(m, dir, err);
    if (rc == 0 && writer && n_files == 1) // the new model.safetensors is complete: an earlier index is stale
        rc = remove_stale(dir, "model.safetensors.index.json", err);
    if (rc == 0 && writer && n_files > 1) { // the index last: the directory is a checkpoint once it exists
        json_t *index = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total_bytes,
                                  "weight_map", weight_map);
        char *path = dsarl_path_join(dir, "model.safetensors.index.json");
        rc = index && path ? dsarl_json_write_file_atomic(path, index, JSON_INDENT(2), err)
                           : DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory saving to %s", dir);
        json_decref(index);
        free(path);
    }
    rc = agree(m, rc, err);
    json_decref(weight_map);
    free(starts), free(scratch), free(data), free(host), free(staged), free(local);
    if (all != m->params)
        free(all);
    return rc;
}

int glm5_save_hf(dsarl_model *m, const char *dir, dsarl_error *err)
{
    return glm5_save_hf_files(m, dir, GLM5_HF_MAX_FILE_BYTES, err);
}
