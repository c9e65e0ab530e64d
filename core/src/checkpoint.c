/* checkpoint.c: NeMo RL's step_N checkpoints (tmp_step_N renamed once complete), a CRC-32 manifest written last
 * so a torn or corrupt checkpoint is detected and skipped, keep_top_k, save_period and the save-by deadline. */
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "dsarl/checkpoint.h"
#include "dsarl/comm.h"
#include "dsarl/fileutil.h"
#include "dsarl/json.h"
#include "dsarl/log.h"
#include "recipe_internal.h"

#define CK "checkpointing."
#define MANIFEST "manifest.json"
#define TRAINING_INFO "training_info.json"
#define WEIGHTS_DIR "policy/weights"
#define OPTIMIZER_FILE "policy/optimizer/optimizer.safetensors"
#define OPTIMIZER_SHARD "policy/optimizer/optimizer.shard%d-of-%d.safetensors"
#define MANIFEST_FORMAT "dsarl-checkpoint-1"

/* ------------------------------------------------------------------------------------------------------------
 * Recipe keys and config. */

static const dsarl_key_spec checkpoint_keys[] = {
    {"checkpointing", DSARL_KEY_MAP, NULL, "checkpoints and automatic resume (NeMo RL's checkpointing section)",
     DSARL_KEY_OWNED},
    {CK "enabled", DSARL_KEY_BOOL, "true", "write checkpoints and resume from the latest complete one", 0},
    {CK "checkpoint_dir", DSARL_KEY_STRING, "results/grpo", "directory holding step_N checkpoints", 0},
    {CK "metric_name", DSARL_KEY_STRING, "val:accuracy", "metric ranking checkpoints for keep_top_k (val:... or "
     "train:...); null = keep the newest", DSARL_KEY_NULLABLE},
    {CK "higher_is_better", DSARL_KEY_BOOL, "true", "a higher metric_name value is better", 0},
    {CK "keep_top_k", DSARL_KEY_INT, "3", "checkpoints kept (the newest always is); null = all", DSARL_KEY_NULLABLE},
    {CK "save_period", DSARL_KEY_INT, "10", "save every N steps (and at the last step)", 0},
    {CK "checkpoint_must_save_by", DSARL_KEY_STRING, "null",
     "\"DD:HH:MM:SS\" after the run start: save and stop cleanly before it", DSARL_KEY_NULLABLE},
    {CK "model_save_format", DSARL_KEY_STRING, "safetensors", "weights format: safetensors (Hugging Face layout)",
     DSARL_KEY_NULLABLE},
    {CK "save_optimizer", DSARL_KEY_BOOL, "true", "also save the AdamW state (needed for bit-identical resume)", 0},
    {CK "on_corrupt", DSARL_KEY_STRING, "fallback", "a step_N that fails verification at resume: fallback (move it "
     "aside, resume from the newest good one; stop if none is good) | fail (stop) | restart (as fallback, but start "
     "from step 0 when none is good)", 0},
    {CK "save_consolidated", DSARL_KEY_BOOL, NULL, "NeMo RL only: dsarl always saves consolidated weights",
     DSARL_KEY_IGNORED},
    {CK "pretrained_checkpoint", DSARL_KEY_ANY, NULL, "NeMo RL only (Megatron checkpoints): not read",
     DSARL_KEY_NULLABLE | DSARL_KEY_IGNORED},
    {CK "ft_save_period", DSARL_KEY_INT, NULL, "NeMo RL only (fault-tolerance saves): not read",
     DSARL_KEY_NULLABLE | DSARL_KEY_IGNORED},
    {CK "ft_keep_latest_k", DSARL_KEY_INT, NULL, "NeMo RL only (fault-tolerance saves): not read",
     DSARL_KEY_NULLABLE | DSARL_KEY_IGNORED},
};

const dsarl_key_spec *dsarl_checkpoint_keys(size_t *n)
{
    *n = DSARL_ARRAY_LEN(checkpoint_keys);
    return checkpoint_keys;
}

int dsarl_parse_duration(const char *text, const char *what, double *seconds, dsarl_error *err)
{
    long long field[4];
    int n = 0;
    const char *p = text ? text : "";
    while (n < 4) {
        if (*p < '0' || *p > '9')
            break;
        long long v = 0;
        while (*p >= '0' && *p <= '9' && v < 1000000)
            v = v * 10 + (*p++ - '0');
        field[n++] = v;
        if (*p != ':')
            break;
        p++;
    }
    if (n != 4 || *p != '\0' || field[1] > 23 || field[2] > 59 || field[3] > 59)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s must be \"DD:HH:MM:SS\" (hours < 24, minutes and seconds < 60), "
                          "got \"%s\"", what, text ? text : "");
    double s = (double)field[0] * 86400.0 + (double)field[1] * 3600.0 + (double)field[2] * 60.0 + (double)field[3];
    if (s <= 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s must be a \"DD:HH:MM:SS\" duration after the run start, longer than "
                          "zero, got \"%s\"", what, text);
    *seconds = s;
    return DSARL_OK;
}

int dsarl_checkpoint_config_from_recipe(const dsarl_node *root, dsarl_checkpoint_config *cfg, dsarl_error *err)
{
    memset(cfg, 0, sizeof *cfg);
    DSARL_TRY(dsarl_recipe_bool_or(root, CK "enabled", true, &cfg->enabled, err));
    DSARL_TRY(dsarl_recipe_string_or(root, CK "checkpoint_dir", "results/grpo", &cfg->checkpoint_dir, err));
    DSARL_TRY(dsarl_recipe_string_or(root, CK "metric_name", NULL, &cfg->metric_name, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, CK "higher_is_better", true, &cfg->higher_is_better, err));
    DSARL_TRY(dsarl_recipe_int_or(root, CK "keep_top_k", -1, &cfg->keep_top_k, err));
    DSARL_TRY(dsarl_recipe_int_or(root, CK "save_period", 10, &cfg->save_period, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, CK "save_optimizer", true, &cfg->save_optimizer, err));
    const char *deadline = NULL, *format = NULL;
    DSARL_TRY(dsarl_recipe_string_or(root, CK "checkpoint_must_save_by", NULL, &deadline, err));
    DSARL_TRY(dsarl_recipe_string_or(root, CK "model_save_format", "safetensors", &format, err));
    if (cfg->checkpoint_dir[0] == '\0')
        return dsarl_recipe_fail(root, CK "checkpoint_dir", err, DSARL_E_INVALID, "must name a directory, got \"\"");
    if (cfg->metric_name && strncmp(cfg->metric_name, "val:", 4) != 0 && strncmp(cfg->metric_name, "train:", 6) != 0)
        return dsarl_recipe_fail(root, CK "metric_name", err, DSARL_E_INVALID,
                                 "must start with \"val:\" or \"train:\" (e.g. val:accuracy), got \"%s\"",
                                 cfg->metric_name);
    if (dsarl_node_get(root, CK "keep_top_k") && dsarl_node_kind(dsarl_node_get(root, CK "keep_top_k")) !=
                                                     DSARL_NODE_NULL && cfg->keep_top_k < 1)
        return dsarl_recipe_fail(root, CK "keep_top_k", err, DSARL_E_INVALID, "must be >= 1 or null (keep all), got "
                                 "%lld", (long long)cfg->keep_top_k);
    if (cfg->save_period < 0)
        return dsarl_recipe_fail(root, CK "save_period", err, DSARL_E_INVALID, "must be >= 0 (0 = only at the end), "
                                 "got %lld", (long long)cfg->save_period);
    if (format && strcmp(format, "safetensors") != 0)
        return dsarl_recipe_fail(root, CK "model_save_format", err, DSARL_E_UNSUPPORTED,
                                 "must be safetensors (Hugging Face layout), got \"%s\"", format);
    dsarl_checkpoint_on_corrupt policy;
    DSARL_TRY(dsarl_checkpoint_on_corrupt_from_recipe(root, &policy, err));
    cfg->must_save_by_s = -1.0;
    dsarl_error why;
    if (deadline && dsarl_parse_duration(deadline, "the value", &cfg->must_save_by_s, &why))
        return dsarl_recipe_fail(root, CK "checkpoint_must_save_by", err, DSARL_E_INVALID, "%s", why.message);
    return DSARL_OK;
}

int dsarl_checkpoint_on_corrupt_from_recipe(const dsarl_node *root, dsarl_checkpoint_on_corrupt *out,
                                            dsarl_error *err)
{
    *out = DSARL_CHECKPOINT_ON_CORRUPT_FALLBACK;
    if (!root)
        return DSARL_OK;
    const char *text = NULL;
    DSARL_TRY(dsarl_recipe_string_or(root, CK "on_corrupt", "fallback", &text, err));
    if (strcmp(text, "fallback") == 0)
        *out = DSARL_CHECKPOINT_ON_CORRUPT_FALLBACK;
    else if (strcmp(text, "fail") == 0)
        *out = DSARL_CHECKPOINT_ON_CORRUPT_FAIL;
    else if (strcmp(text, "restart") == 0)
        *out = DSARL_CHECKPOINT_ON_CORRUPT_RESTART;
    else
        return dsarl_recipe_fail(root, CK "on_corrupt", err, DSARL_E_INVALID, "must be fallback, fail or restart, got "
                                 "\"%s\"", text);
    return DSARL_OK;
}

bool dsarl_checkpoint_deadline_near(const dsarl_checkpoint_config *cfg, double elapsed_s, double next_step_s)
{
    return cfg->must_save_by_s >= 0 && elapsed_s + next_step_s >= cfg->must_save_by_s;
}

bool dsarl_checkpoint_due(const dsarl_checkpoint_config *cfg, int64_t step, bool is_last_step)
{
    if (!cfg->enabled || step < 1)
        return false;
    return is_last_step || (cfg->save_period > 0 && step % cfg->save_period == 0);
}

/* ------------------------------------------------------------------------------------------------------------
 * Trainer state. */

// Finds name in a table of entries `stride` bytes apart whose first member is the name.
static int find_named(const void *table, int32_t n, size_t stride, const char *name)
{
    for (int32_t i = 0; i < n; i++)
        if (strcmp((const char *)table + (size_t)i * stride, name) == 0)
            return i;
    return -1;
}

// Index of the entry for name, appending an empty one when absent.
static int slot_named(void *table, int32_t *n, size_t stride, const char *name, const char *what, dsarl_error *err)
{
    if (!name || strlen(name) >= DSARL_TRAINER_NAME_MAX)
        return DSARL_FAIL(err, DSARL_E_INVALID, "trainer state: %s name \"%s\" must have 1 to %d characters", what,
                          name ? name : "(null)", DSARL_TRAINER_NAME_MAX - 1);
    int i = find_named(table, *n, stride, name);
    if (i >= 0)
        return i;
    if (*n >= DSARL_TRAINER_MAX_ENTRIES)
        return DSARL_FAIL(err, DSARL_E_INVALID, "trainer state: no room for %s \"%s\" (at most %d)", what, name,
                          DSARL_TRAINER_MAX_ENTRIES);
    char *slot = (char *)table + (size_t)*n * stride;
    memset(slot, 0, stride);
    strcpy(slot, name);
    return (*n)++;
}

int dsarl_trainer_state_set_rng(dsarl_trainer_state *st, const char *name, dsarl_rng_state state, dsarl_error *err)
{
    int i = slot_named(st->rngs, &st->n_rngs, sizeof st->rngs[0], name, "RNG", err);
    DSARL_TRY(i);
    st->rngs[i].state = state;
    return DSARL_OK;
}

int dsarl_trainer_state_set_loader(dsarl_trainer_state *st, const char *name, dsarl_dataloader_state state,
                                   dsarl_error *err)
{
    int i = slot_named(st->loaders, &st->n_loaders, sizeof st->loaders[0], name, "dataloader", err);
    DSARL_TRY(i);
    st->loaders[i].state = state;
    return DSARL_OK;
}

int dsarl_trainer_state_set_metric(dsarl_trainer_state *st, const char *name, double value, dsarl_error *err)
{
    int i = slot_named(st->metrics, &st->n_metrics, sizeof st->metrics[0], name, "metric", err);
    DSARL_TRY(i);
    st->metrics[i].value = value;
    return DSARL_OK;
}

int dsarl_trainer_state_get_rng(const dsarl_trainer_state *st, const char *name, dsarl_rng_state *out,
                                dsarl_error *err)
{
    int i = find_named(st->rngs, st->n_rngs, sizeof st->rngs[0], name);
    if (i < 0)
        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "trainer state has no RNG \"%s\"", name);
    *out = st->rngs[i].state;
    return DSARL_OK;
}

int dsarl_trainer_state_get_loader(const dsarl_trainer_state *st, const char *name, dsarl_dataloader_state *out,
                                   dsarl_error *err)
{
    int i = find_named(st->loaders, st->n_loaders, sizeof st->loaders[0], name);
    if (i < 0)
        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "trainer state has no dataloader \"%s\"", name);
    *out = st->loaders[i].state;
    return DSARL_OK;
}

int dsarl_trainer_state_get_metric(const dsarl_trainer_state *st, const char *name, double *out, dsarl_error *err)
{
    int i = find_named(st->metrics, st->n_metrics, sizeof st->metrics[0], name);
    if (i < 0)
        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "trainer state has no metric \"%s\"", name);
    *out = st->metrics[i].value;
    return DSARL_OK;
}

// uint64 values go to JSON as decimal strings: jansson's integers are signed.
static json_t *u64_json(uint64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    return json_string(buf);
}

static int u64_from_json(const json_t *obj, const char *key, const char *where, uint64_t *out, dsarl_error *err)
{
    const char *text = NULL;
    DSARL_TRY(dsarl_json_get_string(obj, key, where, &text, err));
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || *end || text[0] == '-')
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key '%s' must be a decimal unsigned 64-bit integer, got \"%s\"",
                          where, key, text);
    *out = (uint64_t)v;
    return DSARL_OK;
}

static json_t *state_to_json(const dsarl_trainer_state *st)
{
    json_t *root = json_object(), *rngs = json_object(), *loaders = json_object(), *metrics = json_object();
    json_object_set_new(root, "step", json_integer(st->step));
    json_object_set_new(root, "consumed_samples", json_integer(st->consumed_samples));
    json_object_set_new(root, "total_train_time_s", json_real(st->total_train_time_s));
    for (int32_t i = 0; i < st->n_rngs; i++) {
        json_t *r = json_object();
        json_object_set_new(r, "seed", u64_json(st->rngs[i].state.seed));
        json_object_set_new(r, "stream", u64_json(st->rngs[i].state.stream));
        json_object_set_new(r, "offset", u64_json(st->rngs[i].state.offset));
        json_object_set_new(rngs, st->rngs[i].name, r);
    }
    for (int32_t i = 0; i < st->n_loaders; i++) {
        json_t *l = json_object();
        json_object_set_new(l, "epoch", json_integer(st->loaders[i].state.epoch));
        json_object_set_new(l, "cursor", json_integer(st->loaders[i].state.cursor));
        json_object_set_new(loaders, st->loaders[i].name, l);
    }
    // a non-finite metric has no JSON spelling: null, read back as absent
    for (int32_t i = 0; i < st->n_metrics; i++)
        json_object_set_new(metrics, st->metrics[i].name,
                            isfinite(st->metrics[i].value) ? json_real(st->metrics[i].value) : json_null());
    json_object_set_new(root, "rngs", rngs);
    json_object_set_new(root, "dataloaders", loaders);
    json_object_set_new(root, "metrics", metrics);
    return root;
}

static int state_from_json(const json_t *root, const char *where, dsarl_trainer_state *st, dsarl_error *err)
{
    memset(st, 0, sizeof *st);
    DSARL_TRY(dsarl_json_get_int(root, "step", where, &st->step, err));
    DSARL_TRY(dsarl_json_get_int(root, "consumed_samples", where, &st->consumed_samples, err));
    DSARL_TRY(dsarl_json_get_double(root, "total_train_time_s", where, &st->total_train_time_s, err));
    if (st->step < 0 || st->step > DSARL_CHECKPOINT_MAX_STEP || st->consumed_samples < 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: step must be in [0, %lld] and consumed_samples >= 0, got step %"
                          PRId64 ", consumed_samples %" PRId64, where, (long long)DSARL_CHECKPOINT_MAX_STEP, st->step,
                          st->consumed_samples);
    json_t *rngs = NULL, *loaders = NULL, *metrics = NULL;
    DSARL_TRY(dsarl_json_get_object(root, "rngs", where, &rngs, err));
    DSARL_TRY(dsarl_json_get_object(root, "dataloaders", where, &loaders, err));
    DSARL_TRY(dsarl_json_get_object(root, "metrics", where, &metrics, err));
    const char *key;
    json_t *value;
    char sub[512];
    json_object_foreach(rngs, key, value) {
        snprintf(sub, sizeof sub, "%s: rngs.%s", where, key);
        dsarl_rng_state s;
        DSARL_TRY(u64_from_json(value, "seed", sub, &s.seed, err));
        DSARL_TRY(u64_from_json(value, "stream", sub, &s.stream, err));
        DSARL_TRY(u64_from_json(value, "offset", sub, &s.offset, err));
        if (dsarl_trainer_state_set_rng(st, key, s, err) < 0)
            return dsarl_error_prefix(err, "%s", where);
    }
    json_object_foreach(loaders, key, value) {
        snprintf(sub, sizeof sub, "%s: dataloaders.%s", where, key);
        dsarl_dataloader_state s;
        DSARL_TRY(dsarl_json_get_int(value, "epoch", sub, &s.epoch, err));
        DSARL_TRY(dsarl_json_get_int(value, "cursor", sub, &s.cursor, err));
        if (s.epoch < 0 || s.cursor < 0)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: epoch and cursor must be >= 0, got epoch %" PRId64 ", cursor %"
                              PRId64, sub, s.epoch, s.cursor);
        if (dsarl_trainer_state_set_loader(st, key, s, err) < 0)
            return dsarl_error_prefix(err, "%s", where);
    }
    json_object_foreach(metrics, key, value) {
        if (json_is_null(value))
            continue;
        if (!json_is_number(value))
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: metrics.%s must be a number, got %s", where, key,
                              dsarl_json_type_name(value));
        if (dsarl_trainer_state_set_metric(st, key, json_number_value(value), err) < 0)
            return dsarl_error_prefix(err, "%s", where);
    }
    return DSARL_OK;
}

/* ------------------------------------------------------------------------------------------------------------
 * CRC-32 and file helpers. */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t dsarl_crc32(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&crc_once, crc_init);
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++)
        crc = crc_table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
    return ~crc;
}

// Size and CRC-32 of a file, read in pieces.
static int file_crc(const char *path, uint64_t *size, uint32_t *crc, dsarl_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return DSARL_FAIL(err, errno == ENOENT ? DSARL_E_NOT_FOUND : DSARL_E_IO, "%s: cannot open: %s", path,
                          strerror(errno));
    unsigned char buf[1 << 16];
    uint32_t c = 0;
    uint64_t total = 0;
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        c = dsarl_crc32(c, buf, got);
        total += got;
    }
    int failed = ferror(f);
    fclose(f);
    if (failed)
        return DSARL_FAIL(err, DSARL_E_IO, "%s: read error", path);
    *size = total;
    *crc = c;
    return DSARL_OK;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

// rm -rf path; a missing path is success.
static int remove_tree(const char *path, dsarl_error *err)
{
    if (!dsarl_path_exists(path))
        return DSARL_OK;
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return DSARL_FAIL(err, DSARL_E_IO, "%s: cannot remove: %s", path, strerror(errno));
    return DSARL_OK;
}

// Makes a directory's entries (a rename) durable.
static void sync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

typedef struct file_list {
    char **paths; /* relative to the walked root */
    size_t n, cap;
} file_list;

static void file_list_free(file_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->paths[i]);
    free(l->paths);
    memset(l, 0, sizeof *l);
}

// Appends every regular file below root/rel (rel "" = root) to l, in name order per directory.
static int list_files(const char *root, const char *rel, file_list *l, dsarl_error *err)
{
    char *dir = rel[0] ? dsarl_path_join(root, rel) : strdup(root);
    if (!dir)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory");
    struct dirent **names = NULL;
    int n = scandir(dir, &names, NULL, alphasort);
    if (n < 0) {
        int rc = DSARL_FAIL(err, DSARL_E_IO, "%s: cannot list: %s", dir, strerror(errno));
        free(dir);
        return rc;
    }
    int rc = DSARL_OK;
    for (int i = 0; i < n; i++) {
        const char *name = names[i]->d_name;
        if (rc == 0 && strcmp(name, ".") != 0 && strcmp(name, "..") != 0) {
            char *sub = rel[0] ? dsarl_path_join(rel, name) : strdup(name);
            char *full = sub ? dsarl_path_join(root, sub) : NULL;
            struct stat sb;
            if (!full)
                rc = DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory");
            else if (lstat(full, &sb) != 0)
                rc = DSARL_FAIL(err, DSARL_E_IO, "%s: cannot stat: %s", full, strerror(errno));
            else if (S_ISDIR(sb.st_mode))
                rc = list_files(root, sub, l, err);
            else if (S_ISREG(sb.st_mode)) {
                if (l->n == l->cap) {
                    size_t cap = l->cap ? 2 * l->cap : 16;
                    char **grown = realloc(l->paths, cap * sizeof *grown);
                    if (!grown)
                        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory");
                    else
                        l->paths = grown, l->cap = cap;
                }
                if (rc == 0) {
                    l->paths[l->n++] = sub;
                    sub = NULL;
                }
            }
            free(full);
            free(sub);
        }
        free(names[i]);
    }
    free(names);
    free(dir);
    return rc;
}

// Writes dir/manifest.json listing every other file below dir with its size and CRC-32.
static int write_manifest(const char *dir, int64_t step, dsarl_error *err)
{
    file_list l = {0};
    int rc = list_files(dir, "", &l, err);
    json_t *root = json_object(), *files = json_array();
    json_object_set_new(root, "format", json_string(MANIFEST_FORMAT));
    json_object_set_new(root, "step", json_integer(step));
    for (size_t i = 0; i < l.n && rc == 0; i++) {
        if (strcmp(l.paths[i], MANIFEST) == 0)
            continue;
        char *full = dsarl_path_join(dir, l.paths[i]);
        uint64_t size = 0;
        uint32_t crc = 0;
        rc = full ? file_crc(full, &size, &crc, err) : DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory");
        free(full);
        if (rc)
            break;
        char hex[16];
        snprintf(hex, sizeof hex, "%08" PRIx32, crc);
        json_t *e = json_object();
        json_object_set_new(e, "path", json_string(l.paths[i]));
        json_object_set_new(e, "size", json_integer((json_int_t)size));
        json_object_set_new(e, "crc32", json_string(hex));
        json_array_append_new(files, e);
    }
    json_object_set_new(root, "files", files);
    char *path = dsarl_path_join(dir, MANIFEST);
    if (rc == 0)
        rc = path ? dsarl_json_write_file_atomic(path, root, JSON_INDENT(1), err)
                  : DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory");
    free(path);
    json_decref(root);
    file_list_free(&l);
    return rc;
}

/* ------------------------------------------------------------------------------------------------------------
 * Save. */

// "<dir>/<prefix><step>" into a malloc'd string.
static char *step_path(const char *dir, const char *prefix, int64_t step)
{
    char name[64];
    snprintf(name, sizeof name, "%s%lld", prefix, (long long)step);
    return dsarl_path_join(dir, name);
}

// The optimizer file of a checkpoint relative to its step directory: one file, or shard r of n under a
// distributed optimizer (n > 1); malloc'd.
static char *optimizer_path(const char *step_dir, const dsarl_group *shards)
{
    if (dsarl_group_size(shards) <= 1)
        return dsarl_path_join(step_dir, OPTIMIZER_FILE);
    char rel[128];
    snprintf(rel, sizeof rel, OPTIMIZER_SHARD, (int)dsarl_group_rank(shards), (int)dsarl_group_size(shards));
    return dsarl_path_join(step_dir, rel);
}

// Writes this rank's optimizer file (its shard, or the whole state) into tmp.
static int write_optimizer(const dsarl_model_ops *ops, dsarl_model *model, const char *tmp,
                           const dsarl_group *shards, dsarl_error *err)
{
    if (!ops->optimizer_save)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "checkpoint: model %s cannot save its optimizer state; set "
                          "checkpointing.save_optimizer=false", ops->common.name);
    char *optim = optimizer_path(tmp, shards);
    char *optim_dir = optim ? dsarl_path_dirname(optim) : NULL;
    int rc = optim_dir ? dsarl_mkdir_p(optim_dir, err) : DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory");
    if (rc == 0)
        rc = ops->optimizer_save(model, optim, err);
    free(optim), free(optim_dir);
    return rc;
}

// Writes the files of the checkpoint that one process writes into tmp (which exists and is empty): the weights,
// the unsharded optimizer state (with_optimizer), the trainer state and the recipe.
static int write_contents(const dsarl_checkpoint_config *cfg, const dsarl_model_ops *ops, dsarl_model *model,
                          const dsarl_trainer_state *state, const dsarl_node *recipe, const char *tmp,
                          bool with_weights, bool with_optimizer, dsarl_error *err)
{
    char *weights = dsarl_path_join(tmp, WEIGHTS_DIR);
    char *info = dsarl_path_join(tmp, TRAINING_INFO), *config = dsarl_path_join(tmp, "config.yaml");
    int rc = (!weights || !info || !config) ? DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory") : DSARL_OK;
    if (rc == 0 && with_weights)
        rc = ops->save(model, weights, err);
    if (rc == 0 && cfg->save_optimizer && with_optimizer)
        rc = write_optimizer(ops, model, tmp, NULL, err);
    if (rc == 0) {
        json_t *j = state_to_json(state);
        rc = dsarl_json_write_file_atomic(info, j, JSON_INDENT(1), err);
        json_decref(j);
    }
    if (rc == 0 && recipe) {
        dsarl_recipe view = {.root = (dsarl_node *)recipe};
        rc = dsarl_recipe_write_file(&view, config, 0, err);
    }
    free(weights), free(info), free(config);
    return rc;
}

// Collective over world: every member learns whether every member got here with rc == 0. A member that failed
// keeps its own message; the others get one saying that a peer failed (its log names why).
static int agree(const dsarl_group *world, int rc, const char *what, dsarl_error *err)
{
    if (dsarl_group_size(world) <= 1)
        return rc;
    int32_t failed = rc != DSARL_OK;
    dsarl_error e;
    if (dsarl_group_all_reduce_host(world, &failed, 1, DSARL_DTYPE_I32, DSARL_REDUCE_MAX, &e) < 0)
        return rc ? rc : DSARL_FAIL(err, e.code, "%s", e.message);
    if (failed && rc == DSARL_OK)
        return DSARL_FAIL(err, DSARL_E_IO, "checkpoint: another rank failed %s (its log names why)", what);
    return rc;
}

int dsarl_checkpoint_save_group(const dsarl_checkpoint_config *cfg, const dsarl_model_ops *ops, dsarl_model *model,
                                const dsarl_trainer_state *state, const dsarl_node *recipe, const dsarl_group *world,
                                const dsarl_group *shards, bool weights_collective, char *saved_dir, size_t size,
                                dsarl_error *err)
{
    if (!cfg->checkpoint_dir || !ops || !ops->save || !state || state->step < 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "checkpoint save needs checkpointing.checkpoint_dir, a model that "
                          "can save and a trainer state with step >= 0");
    bool lead = dsarl_group_rank(world) == 0, sharded = dsarl_group_size(shards) > 1;
    char *tmp = step_path(cfg->checkpoint_dir, "tmp_step_", state->step);
    char *final = step_path(cfg->checkpoint_dir, "step_", state->step);
    int rc = (!tmp || !final) ? DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory") : DSARL_OK;
    // 1. the lead rank makes an empty tmp_step_N and writes what one process writes
    if (rc == 0 && lead)
        rc = dsarl_mkdir_p(cfg->checkpoint_dir, err);
    if (rc == 0 && lead)
        rc = remove_tree(tmp, err); // a save that died before its rename
    if (rc == 0 && lead)
        rc = dsarl_mkdir_p(tmp, err);
    if (weights_collective) { // every rank takes part in the save that gathers the model's shards
        rc = agree(world, rc, "making the checkpoint directory", err);
        char *weights = rc == 0 ? dsarl_path_join(tmp, WEIGHTS_DIR) : NULL;
        if (rc == 0)
            rc = weights ? ops->save(model, weights, err) : DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory");
        free(weights);
        rc = agree(world, rc, "writing the weights", err);
    }
    if (rc == 0 && lead)
        rc = write_contents(cfg, ops, model, state, recipe, tmp, !weights_collective, !sharded, err);
    rc = agree(world, rc, "writing the checkpoint", err);
    // 2. every rank writes its optimizer shard into the directory that now exists
    if (rc == 0 && sharded && cfg->save_optimizer)
        rc = write_optimizer(ops, model, tmp, shards, err);
    rc = agree(world, rc, "writing its optimizer shard", err);
    // 3. the manifest last, over every rank's files, then the rename that publishes the step
    if (rc == 0 && lead)
        rc = write_manifest(tmp, state->step, err);
    if (rc == 0 && lead)
        rc = remove_tree(final, err); // re-saving a step (a resumed run that saves it again)
    if (rc == 0 && lead && rename(tmp, final) != 0)
        rc = DSARL_FAIL(err, DSARL_E_IO, "checkpoint: cannot rename %s to %s: %s", tmp, final, strerror(errno));
    if (rc == 0 && lead) {
        sync_dir(cfg->checkpoint_dir);
        dsarl_log(DSARL_LOG_INFO, "saved checkpoint %s", final);
        rc = dsarl_checkpoint_prune(cfg, err);
    } else if (rc && lead) {
        dsarl_error ignored;
        (void)remove_tree(tmp, &ignored);
    }
    rc = agree(world, rc, "publishing the checkpoint", err);
    if (rc == 0 && saved_dir && size)
        snprintf(saved_dir, size, "%s", final);
    free(tmp);
    free(final);
    return rc;
}

int dsarl_checkpoint_save(const dsarl_checkpoint_config *cfg, const dsarl_model_ops *ops, dsarl_model *model,
                          const dsarl_trainer_state *state, const dsarl_node *recipe, char *saved_dir, size_t size,
                          dsarl_error *err)
{
    return dsarl_checkpoint_save_group(cfg, ops, model, state, recipe, NULL, NULL, false, saved_dir, size, err);
}

/* ------------------------------------------------------------------------------------------------------------
 * Verify, find, load. */

// A manifest path must stay inside the checkpoint.
static bool safe_relative(const char *p)
{
    return p[0] && p[0] != '/' && strstr(p, "..") == NULL;
}

int dsarl_checkpoint_verify(const char *step_dir, dsarl_error *err)
{
    char *path = dsarl_path_join(step_dir, MANIFEST);
    if (!path)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory");
    if (!dsarl_path_exists(path)) {
        int rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s is missing, so the checkpoint is incomplete", path);
        free(path);
        return rc;
    }
    json_t *root = NULL;
    int rc = dsarl_json_load_file(path, &root, err);
    json_t *files = NULL;
    const char *format = NULL;
    if (rc == 0)
        rc = dsarl_json_get_string(root, "format", path, &format, err);
    if (rc == 0 && strcmp(format, MANIFEST_FORMAT) != 0)
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: format \"%s\" is not %s", path, format, MANIFEST_FORMAT);
    if (rc == 0)
        rc = dsarl_json_get_array(root, "files", path, &files, err);
    bool has_info = false;
    for (size_t i = 0; rc == 0 && i < json_array_size(files); i++) {
        const json_t *e = json_array_get(files, i);
        const char *rel = NULL, *want_crc = NULL;
        int64_t want_size = 0;
        rc = dsarl_json_get_string(e, "path", path, &rel, err);
        if (rc == 0)
            rc = dsarl_json_get_int(e, "size", path, &want_size, err);
        if (rc == 0)
            rc = dsarl_json_get_string(e, "crc32", path, &want_crc, err);
        if (rc == 0 && !safe_relative(rel))
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: file path \"%s\" leaves the checkpoint", path, rel);
        if (rc)
            break;
        has_info |= strcmp(rel, TRAINING_INFO) == 0;
        char *full = dsarl_path_join(step_dir, rel);
        uint64_t size = 0;
        uint32_t crc = 0;
        char hex[16];
        rc = full ? file_crc(full, &size, &crc, err) : DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory");
        if (rc == DSARL_E_NOT_FOUND)
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s is listed in the manifest but missing", full);
        snprintf(hex, sizeof hex, "%08" PRIx32, crc);
        if (rc == 0 && (int64_t)size != want_size)
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s has %llu bytes, the manifest says %lld (truncated or "
                            "overwritten)", full, (unsigned long long)size, (long long)want_size);
        else if (rc == 0 && strcmp(hex, want_crc) != 0)
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s has CRC-32 %s, the manifest says %s (corrupt)", full, hex,
                            want_crc);
        free(full);
    }
    if (rc == 0 && !has_info)
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s does not list %s", path, TRAINING_INFO);
    json_decref(root);
    free(path);
    return rc;
}

// N of "<prefix>N" (digits only), or -1.
static int64_t parse_step(const char *name, const char *prefix)
{
    size_t k = strlen(prefix);
    if (strncmp(name, prefix, k) != 0 || name[k] == '\0')
        return -1;
    int64_t v = 0;
    for (const char *p = name + k; *p; p++) {
        if (*p < '0' || *p > '9' || v > INT64_MAX / 10 - 10)
            return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

static int cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

// The steps N of every step_N directory under dir, newest first (*steps malloc'd; none when dir is missing).
// warn_tmp logs each tmp_step_N left behind.
static int list_steps(const char *dir, int64_t **steps, size_t *n, bool warn_tmp, dsarl_error *err)
{
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT)
            return DSARL_OK;
        return DSARL_FAIL(err, DSARL_E_IO, "%s: cannot list checkpoints: %s", dir, strerror(errno));
    }
    size_t cap = 0;
    int rc = DSARL_OK;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (warn_tmp && parse_step(e->d_name, "tmp_step_") >= 0)
            dsarl_log(DSARL_LOG_WARN, "skipping checkpoint %s/%s: an unfinished save (never renamed to step_N)", dir,
                      e->d_name);
        int64_t s = parse_step(e->d_name, "step_");
        if (s < 0)
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *grown = realloc(*steps, cap * sizeof *grown);
            if (!grown) {
                rc = DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory");
                break;
            }
            *steps = grown;
        }
        (*steps)[(*n)++] = s;
    }
    closedir(d);
    if (rc) {
        free(*steps);
        *steps = NULL;
        *n = 0;
        return rc;
    }
    if (*n)
        qsort(*steps, *n, sizeof **steps, cmp_desc);
    return DSARL_OK;
}

int dsarl_checkpoint_find_latest(const char *checkpoint_dir, char *out, size_t size, int64_t *step,
                                 dsarl_error *err)
{
    *step = -1;
    int64_t *steps = NULL;
    size_t n = 0;
    DSARL_TRY(list_steps(checkpoint_dir, &steps, &n, true, err));
    int rc = DSARL_OK;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char *dir = step_path(checkpoint_dir, "step_", steps[i]);
        if (!dir) {
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory");
            break;
        }
        dsarl_error why;
        if (dsarl_checkpoint_verify(dir, &why) == 0) {
            snprintf(out, size, "%s", dir);
            *step = steps[i];
            free(dir);
            break;
        }
        dsarl_log(DSARL_LOG_WARN, "skipping checkpoint %s: %s", dir, why.message);
        free(dir);
    }
    free(steps);
    return rc;
}

int dsarl_checkpoint_read_state(const char *step_dir, dsarl_trainer_state *state, dsarl_error *err)
{
    char *path = dsarl_path_join(step_dir, TRAINING_INFO);
    if (!path)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory");
    json_t *root = NULL;
    int rc = dsarl_json_load_file(path, &root, err);
    if (rc == 0)
        rc = state_from_json(root, path, state, err);
    json_decref(root);
    free(path);
    return rc;
}

int dsarl_checkpoint_load(const char *step_dir, const dsarl_model_ops *ops, dsarl_model *model,
                          dsarl_trainer_state *state, dsarl_error *err)
{
    return dsarl_checkpoint_load_group(step_dir, ops, model, state, NULL, err);
}

int dsarl_checkpoint_load_group(const char *step_dir, const dsarl_model_ops *ops, dsarl_model *model,
                                dsarl_trainer_state *state, const dsarl_group *shards, dsarl_error *err)
{
    if (!ops->load_weights)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "checkpoint: model %s cannot load weights into a built model",
                          ops->common.name);
    DSARL_TRY(dsarl_checkpoint_verify(step_dir, err));
    dsarl_trainer_state loaded;
    DSARL_TRY(dsarl_checkpoint_read_state(step_dir, &loaded, err));
    char *weights = dsarl_path_join(step_dir, WEIGHTS_DIR), *optim = optimizer_path(step_dir, shards);
    int rc = (!weights || !optim) ? DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory") : DSARL_OK;
    if (rc == 0)
        rc = ops->load_weights(model, weights, err);
    if (rc == 0 && !dsarl_path_exists(optim)) {
        // a checkpoint of another layout: the unsharded file (or another shard count) makes the model refuse it
        // naming the layout, rather than AdamW silently restarting
        char *other = dsarl_path_join(step_dir, OPTIMIZER_FILE);
        char *probe = dsarl_path_join(step_dir, "policy/optimizer");
        if (other && dsarl_path_exists(other)) {
            free(optim);
            optim = other;
            other = NULL;
        } else if (probe && dsarl_path_exists(probe)) {
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "checkpoint: %s holds no optimizer file for this layout (%s); "
                            "resume with the data-parallel size and distributed optimizer setting that saved it",
                            step_dir, optim);
        }
        free(other);
        free(probe);
    }
    if (rc == 0 && dsarl_path_exists(optim)) {
        rc = ops->optimizer_load ? ops->optimizer_load(model, optim, err)
                                 : DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "checkpoint: model %s cannot load %s",
                                              ops->common.name, optim);
    } else if (rc == 0) {
        dsarl_log(DSARL_LOG_WARN, "%s has no optimizer state (save_optimizer was false): AdamW restarts from zero "
                  "moments", step_dir);
    }
    if (rc == 0)
        *state = loaded;
    free(weights);
    free(optim);
    return rc;
}

int dsarl_checkpoint_resume(const char *checkpoint_dir, const dsarl_model_ops *ops, dsarl_model *model,
                            dsarl_dataloader *loader, dsarl_trainer_state *state, char *step_dir, size_t size,
                            dsarl_error *err)
{
    return dsarl_checkpoint_resume_group(checkpoint_dir, ops, model, loader, state, NULL, step_dir, size, err);
}

int dsarl_checkpoint_resume_group(const char *checkpoint_dir, const dsarl_model_ops *ops, dsarl_model *model,
                                  dsarl_dataloader *loader, dsarl_trainer_state *state, const dsarl_group *shards,
                                  char *step_dir, size_t size, dsarl_error *err)
{
    memset(state, 0, sizeof *state);
    state->step = -1;
    int64_t step;
    DSARL_TRY(dsarl_checkpoint_find_latest(checkpoint_dir, step_dir, size, &step, err));
    if (step < 0)
        return DSARL_OK;
    DSARL_TRY(dsarl_checkpoint_load_group(step_dir, ops, model, state, shards, err));
    dsarl_dataloader_state position;
    DSARL_TRY(dsarl_trainer_state_get_loader(state, "train", &position, err));
    return dsarl_dataloader_set_state(loader, position, err);
}

/* ------------------------------------------------------------------------------------------------------------
 * Resume with a policy for corrupt checkpoints (checkpointing.on_corrupt) and a writable checkpoint_dir. */

// Creates checkpoint_dir if needed and writes then removes a probe file in it, so an unwritable directory stops
// the run before its first step rather than at its first save, hours later.
static int probe_writable(const char *dir, dsarl_error *err)
{
    dsarl_error why;
    if (dsarl_mkdir_p(dir, &why) < 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "checkpointing.checkpoint_dir: cannot create %s (%s); choose a "
                          "writable directory or set checkpointing.enabled=false", dir, why.message);
    char name[64];
    snprintf(name, sizeof name, ".dsarl-write-probe-%ld", (long)getpid());
    char *probe = dsarl_path_join(dir, name);
    if (!probe)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory");
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
    int rc = DSARL_OK;
    if (fd < 0 || write(fd, "x", 1) != 1)
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "checkpointing.checkpoint_dir: %s is not writable (%s); choose a "
                        "writable directory or set checkpointing.enabled=false", dir, strerror(errno));
    if (fd >= 0) {
        close(fd);
        unlink(probe);
    }
    free(probe);
    return rc;
}

// A step_N that verifies: its manifest checks out and its training_info.json parses with step == N.
static int check_step(const char *step_dir, int64_t n, dsarl_error *err)
{
    DSARL_TRY(dsarl_checkpoint_verify(step_dir, err));
    dsarl_trainer_state st;
    DSARL_TRY(dsarl_checkpoint_read_state(step_dir, &st, err));
    if (st.step != n)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s/" TRAINING_INFO ": step is %" PRId64 " but the directory is step_%"
                          PRId64 " (the two must agree)", step_dir, st.step, n);
    return DSARL_OK;
}

// Renames step_dir to step_dir.corrupt-<UTC time> (a free name), so nothing later overwrites or prunes it.
static int move_aside(const char *step_dir, char *moved, size_t size, dsarl_error *err)
{
    char stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
    for (int k = 0; k < 100; k++) {
        if (k == 0)
            snprintf(moved, size, "%s.corrupt-%s", step_dir, stamp);
        else
            snprintf(moved, size, "%s.corrupt-%s-%d", step_dir, stamp, k);
        if (dsarl_path_exists(moved))
            continue;
        if (rename(step_dir, moved) != 0)
            return DSARL_FAIL(err, DSARL_E_IO, "checkpoint: cannot move corrupt %s aside to %s: %s", step_dir, moved,
                              strerror(errno));
        return DSARL_OK;
    }
    return DSARL_FAIL(err, DSARL_E_IO, "checkpoint: no free name to move corrupt %s aside", step_dir);
}

static const char *policy_name(dsarl_checkpoint_on_corrupt p)
{
    return p == DSARL_CHECKPOINT_ON_CORRUPT_FAIL ? "fail" : p == DSARL_CHECKPOINT_ON_CORRUPT_RESTART ? "restart"
                                                                                                   : "fallback";
}

int dsarl_checkpoint_choose(const char *checkpoint_dir, dsarl_checkpoint_on_corrupt policy, bool move_corrupt,
                            char *out, size_t size, int64_t *step, dsarl_error *err)
{
    *step = -1;
    int64_t *steps = NULL;
    size_t n = 0;
    DSARL_TRY(list_steps(checkpoint_dir, &steps, &n, true, err));
    // the corrupt ones newer than the newest good one, each named with why (the error lists them all)
    char listed[DSARL_ERROR_MESSAGE_MAX] = "";
    size_t n_bad = 0, good = n, at = 0;
    int rc = DSARL_OK;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char *dir = step_path(checkpoint_dir, "step_", steps[i]);
        if (!dir) {
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory");
            break;
        }
        dsarl_error why;
        if (check_step(dir, steps[i], &why) == 0) {
            snprintf(out, size, "%s", dir);
            good = i;
            free(dir);
            break;
        }
        dsarl_log(DSARL_LOG_WARN, "checkpoint %s does not verify: %s", dir, why.message);
        if (at < sizeof listed)
            at += (size_t)snprintf(listed + at, sizeof listed - at, "%sstep_%" PRId64 ": %s", n_bad ? "; " : "",
                                   steps[i], why.message);
        n_bad++;
        free(dir);
    }
    if (rc == 0 && n_bad > 0) {
        bool have_good = good < n;
        bool stop = policy == DSARL_CHECKPOINT_ON_CORRUPT_FAIL ||
                    (!have_good && policy != DSARL_CHECKPOINT_ON_CORRUPT_RESTART);
        if (stop && have_good)
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: %zu checkpoint%s newer than step_%" PRId64 " (the newest "
                            "that verifies) do%s not verify, so the run stops rather than silently resuming from "
                            "an older one (%s); set checkpointing.on_corrupt=fallback to move %s aside and resume "
                            "from step_%" PRId64, checkpoint_dir, n_bad, n_bad > 1 ? "s" : "", steps[good],
                            n_bad > 1 ? "" : "es", listed, n_bad > 1 ? "them" : "it", steps[good]);
        else if (stop)
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: none of its %zu checkpoint%s verifies, so the run stops "
                            "rather than silently restarting from step 0 (%s); set checkpointing.on_corrupt=restart "
                            "to move %s aside and start over", checkpoint_dir, n_bad, n_bad > 1 ? "s" : "", listed,
                            n_bad > 1 ? "them" : "it");
        for (size_t i = 0; rc == 0 && i < n_bad; i++) {
            char *dir = step_path(checkpoint_dir, "step_", steps[i]);
            char moved[4096] = "";
            if (!dir)
                rc = DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory");
            else if (move_corrupt)
                rc = move_aside(dir, moved, sizeof moved, err);
            if (rc == 0)
                dsarl_log(DSARL_LOG_WARN, "checkpoint %s does not verify%s%s (checkpointing.on_corrupt=%s)", dir,
                          moved[0] ? ": moved aside to " : "", moved, policy_name(policy));
            free(dir);
        }
        if (rc == 0 && have_good)
            dsarl_log(DSARL_LOG_WARN, "resuming from %s, the newest checkpoint that verifies, instead of the newer "
                      "step_%" PRId64 " (checkpointing.on_corrupt=%s)", out, steps[0], policy_name(policy));
        else if (rc == 0)
            dsarl_log(DSARL_LOG_WARN, "no checkpoint under %s verifies: starting over from step 0 "
                      "(checkpointing.on_corrupt=restart)", checkpoint_dir);
    }
    if (rc == 0 && good < n)
        *step = steps[good];
    free(steps);
    return rc;
}

int dsarl_checkpoint_resume_checked(const dsarl_checkpoint_config *ckpt, const dsarl_node *recipe, bool lead,
                                    const dsarl_model_ops *ops, dsarl_model *model, dsarl_dataloader *loader,
                                    dsarl_trainer_state *state, const dsarl_group *shards, char *step_dir,
                                    size_t size, dsarl_error *err)
{
    memset(state, 0, sizeof *state);
    state->step = -1;
    dsarl_checkpoint_on_corrupt policy;
    DSARL_TRY(dsarl_checkpoint_on_corrupt_from_recipe(recipe, &policy, err));
    if (lead)
        DSARL_TRY(probe_writable(ckpt->checkpoint_dir, err));
    int64_t step;
    DSARL_TRY(dsarl_checkpoint_choose(ckpt->checkpoint_dir, policy, lead, step_dir, size, &step, err));
    if (step < 0)
        return DSARL_OK;
    DSARL_TRY(dsarl_checkpoint_load_group(step_dir, ops, model, state, shards, err));
    dsarl_dataloader_state position;
    if (dsarl_trainer_state_get_loader(state, "train", &position, err) < 0 ||
        dsarl_dataloader_set_state(loader, position, err) < 0)
        return dsarl_error_prefix(err, "%s/" TRAINING_INFO, step_dir);
    return DSARL_OK;
}

/* ------------------------------------------------------------------------------------------------------------
 * keep_top_k. */

typedef struct ranked {
    int64_t step;
    bool has_metric;
    double metric;
} ranked;

static bool higher_is_better_order; // qsort has no context argument; prune runs under prune_lock

static int cmp_rank(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->has_metric != y->has_metric)
        return x->has_metric ? -1 : 1;
    if (x->has_metric && x->metric != y->metric) {
        bool x_first = higher_is_better_order ? x->metric > y->metric : x->metric < y->metric;
        return x_first ? -1 : 1;
    }
    return x->step < y->step ? 1 : x->step > y->step ? -1 : 0;
}

static pthread_mutex_t prune_lock = PTHREAD_MUTEX_INITIALIZER;

int dsarl_checkpoint_prune(const dsarl_checkpoint_config *cfg, dsarl_error *err)
{
    if (cfg->keep_top_k < 1)
        return DSARL_OK;
    int64_t *steps = NULL;
    size_t n = 0;
    DSARL_TRY(list_steps(cfg->checkpoint_dir, &steps, &n, false, err));
    if (n <= (size_t)cfg->keep_top_k) {
        free(steps);
        return DSARL_OK;
    }
    ranked *r = calloc(n, sizeof *r);
    if (!r) {
        free(steps);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        r[i].step = steps[i];
        char *dir = step_path(cfg->checkpoint_dir, "step_", steps[i]);
        dsarl_trainer_state st;
        dsarl_error ignored;
        if (cfg->metric_name && dir && dsarl_checkpoint_read_state(dir, &st, &ignored) == 0 &&
            dsarl_trainer_state_get_metric(&st, cfg->metric_name, &r[i].metric, &ignored) == 0)
            r[i].has_metric = true;
        free(dir);
    }
    pthread_mutex_lock(&prune_lock);
    higher_is_better_order = cfg->higher_is_better;
    qsort(r, n, sizeof *r, cmp_rank);
    pthread_mutex_unlock(&prune_lock);
    int64_t newest = steps[0];
    int rc = DSARL_OK;
    for (size_t i = (size_t)cfg->keep_top_k; i < n && rc == 0; i++) {
        if (r[i].step == newest)
            continue; // the latest checkpoint is always kept, whatever its metric
        char *dir = step_path(cfg->checkpoint_dir, "step_", r[i].step);
        rc = dir ? remove_tree(dir, err) : DSARL_FAIL(err, DSARL_E_NOMEM, "checkpoint: out of memory");
        if (rc == 0)
            dsarl_log(DSARL_LOG_INFO, "removed checkpoint %s (keep_top_k %lld by %s)", dir,
                      (long long)cfg->keep_top_k, cfg->metric_name ? cfg->metric_name : "step");
        free(dir);
    }
    free(r);
    free(steps);
    return rc;
}
