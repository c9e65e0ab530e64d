/* metrics.c: the run logger: experiment directory, metrics.jsonl, sample dumps, TensorBoard scalars, progress line,
 * and the truncation that makes a resumed run log each step exactly once. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "dsarl/fileutil.h"
#include "dsarl/json.h"
#include "dsarl/log.h"
#include "dsarl/recipe.h"
#include "metrics_internal.h"

typedef struct metric_entry {
    char *name;
    double value;
} metric_entry;

struct dsarl_metrics {
    char *dir;                 /* the experiment directory */
    char *jsonl_path;
    FILE *jsonl;               /* metrics.jsonl, appended */
    bool tensorboard;
    metrics_tb_writer tb;
    metric_entry *entries;     /* values of the step being recorded, in first-set order */
    size_t n_entries, cap_entries;
    int progress;              /* 0 none, 1 redrawn line (terminal), 2 log lines */
    bool progress_open;        /* a redrawn line is on screen without its newline */
    int64_t total_steps;
    double t_open;             /* when this session started, for the ETA */
    int64_t first_step;        /* steps completed before this session (resume) */
};

#define IGN DSARL_KEY_IGNORED
static const dsarl_key_spec metrics_keys[] = {
    {"logger", DSARL_KEY_MAP, NULL, "run logger: metrics.jsonl, sample dumps, TensorBoard, progress line", DSARL_KEY_OWNED},
    {"logger.log_dir", DSARL_KEY_STRING, "logs", "parent of the run's exp_NNN directory", 0},
    {"logger.num_val_samples_to_print", DSARL_KEY_INT, "0", "validation samples printed to the log per validation", 0},
    {"logger.tensorboard_enabled", DSARL_KEY_BOOL, "false", "write TensorBoard event files under exp_NNN/tensorboard", 0},
    {"logger.tensorboard", DSARL_KEY_MAP, NULL, "NeMo RL TensorBoard options; the event files go under exp_NNN", IGN},
    {"logger.wandb_enabled", DSARL_KEY_BOOL, "false", "Weights & Biases logging; not available in dsarl", IGN},
    {"logger.wandb", DSARL_KEY_MAP, NULL, "Weights & Biases settings; not used", IGN},
    {"logger.mlflow_enabled", DSARL_KEY_BOOL, "false", "MLflow logging; not available in dsarl", IGN},
    {"logger.mlflow", DSARL_KEY_MAP, NULL, "MLflow settings; not used", IGN},
    {"logger.swanlab_enabled", DSARL_KEY_BOOL, "false", "SwanLab logging; not available in dsarl", IGN},
    {"logger.swanlab", DSARL_KEY_MAP, NULL, "SwanLab settings; not used", IGN},
    {"logger.monitor_gpus", DSARL_KEY_BOOL, "false", "Ray GPU monitor; not used", IGN},
    {"logger.gpu_monitoring", DSARL_KEY_MAP, NULL, "Ray GPU monitor settings; not used", IGN},
};

const dsarl_key_spec *dsarl_metrics_keys(size_t *n)
{
    *n = DSARL_ARRAY_LEN(metrics_keys);
    return metrics_keys;
}

int dsarl_metrics_config_from_recipe(const dsarl_node *root, dsarl_metrics_config *cfg, dsarl_error *err)
{
    DSARL_TRY(dsarl_recipe_string_or(root, "logger.log_dir", "logs", &cfg->log_dir, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "logger.tensorboard_enabled", false, &cfg->tensorboard, err));
    return DSARL_OK;
}

static double now_seconds(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

/* Parses "<prefix><digits><suffix>" exactly; returns the number or -1. */
static int64_t parse_numbered(const char *name, const char *prefix, const char *suffix)
{
    size_t lp = strlen(prefix), ls = strlen(suffix), ln = strlen(name);
    if (ln <= lp + ls || strncmp(name, prefix, lp) != 0 || strcmp(name + ln - ls, suffix) != 0)
        return -1;
    int64_t v = 0;
    for (size_t i = lp; i < ln - ls; i++) {
        if (name[i] < '0' || name[i] > '9' || v > INT64_MAX / 10 - 10)
            return -1;
        v = v * 10 + (name[i] - '0');
    }
    return v;
}

/* The largest NNN of the exp_NNN directories in log_dir (0 when there is none). */
static int newest_experiment(const char *log_dir, int64_t *newest, dsarl_error *err)
{
    *newest = 0;
    DIR *d = opendir(log_dir);
    if (!d)
        return DSARL_FAIL(err, DSARL_E_IO, "cannot list logger.log_dir %s: %s", log_dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t id = parse_numbered(e->d_name, "exp_", "");
        if (id > *newest)
            *newest = id;
    }
    closedir(d);
    return DSARL_OK;
}

/* Keeps the lines of metrics.jsonl whose step is <= last_step; drops later steps and a torn last line. */
static int truncate_metrics_file(const char *path, int64_t last_step, dsarl_error *err)
{
    if (!dsarl_path_exists(path))
        return DSARL_OK;
    char *text;
    size_t size;
    DSARL_TRY(dsarl_read_file(path, (void **)&text, &size, err));
    dsarl_text_buffer kept = {0};
    int rc = DSARL_OK;
    size_t dropped = 0;
    for (char *line = text; line < text + size;) {
        char *nl = memchr(line, '\n', (size_t)(text + size - line));
        if (!nl) { /* a line without its newline was torn by a kill */
            dropped++;
            break;
        }
        json_error_t jerr;
        json_t *obj = json_loadb(line, (size_t)(nl - line), 0, &jerr);
        json_t *step = obj ? json_object_get(obj, "step") : NULL;
        if (step && json_is_integer(step) && json_integer_value(step) <= last_step) {
            if (metrics_buf_append(&kept, line, (size_t)(nl - line + 1)) < 0)
                rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory truncating %s", path);
        } else {
            dropped++;
        }
        json_decref(obj);
        if (rc < 0)
            break;
        line = nl + 1;
    }
    if (rc == DSARL_OK && dropped)
        rc = dsarl_write_file_atomic(path, kept.data ? kept.data : "", kept.len, err);
    if (rc == DSARL_OK && dropped)
        dsarl_log(DSARL_LOG_INFO, "resume: dropped %zu metrics.jsonl lines logged after step %" PRId64, dropped,
                  last_step);
    free(kept.data);
    free(text);
    return rc;
}

/* Removes the sample dumps of steps after last_step. */
static int remove_later_sample_files(const char *dir, int64_t last_step, dsarl_error *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return DSARL_FAIL(err, DSARL_E_IO, "cannot list %s: %s", dir, strerror(errno));
    struct dirent *e;
    int rc = DSARL_OK;
    while (rc == DSARL_OK && (e = readdir(d)) != NULL) {
        int64_t s = parse_numbered(e->d_name, "train_data_step", ".jsonl");
        if (s < 0)
            s = parse_numbered(e->d_name, "val_data_step", ".jsonl");
        if (s > last_step) {
            char *p = dsarl_path_join(dir, e->d_name);
            if (!p || unlink(p) != 0)
                rc = DSARL_FAIL(err, DSARL_E_IO, "cannot remove %s/%s (logged after the resume step)", dir, e->d_name);
            free(p);
        }
    }
    closedir(d);
    return rc;
}

/* Removes every event file in tb_dir (they are rebuilt from the truncated metrics.jsonl). */
static int remove_event_files(const char *tb_dir, dsarl_error *err)
{
    DIR *d = opendir(tb_dir);
    if (!d)
        return DSARL_OK;
    struct dirent *e;
    int rc = DSARL_OK;
    while (rc == DSARL_OK && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "events.out.tfevents.", 20) != 0)
            continue;
        char *p = dsarl_path_join(tb_dir, e->d_name);
        if (!p || unlink(p) != 0)
            rc = DSARL_FAIL(err, DSARL_E_IO, "cannot remove old TensorBoard file %s/%s", tb_dir, e->d_name);
        free(p);
    }
    closedir(d);
    return rc;
}

/* Writes every scalar of metrics.jsonl into the (fresh) event file: TensorBoard then shows exactly the kept steps. */
static int replay_metrics_into_tensorboard(dsarl_metrics *m, dsarl_error *err)
{
    if (!dsarl_path_exists(m->jsonl_path))
        return DSARL_OK;
    char *text;
    size_t size;
    DSARL_TRY(dsarl_read_file(m->jsonl_path, (void **)&text, &size, err));
    int rc = DSARL_OK;
    double t = now_seconds();
    for (char *line = text; rc == DSARL_OK && line < text + size;) {
        char *nl = memchr(line, '\n', (size_t)(text + size - line));
        size_t len = nl ? (size_t)(nl - line) : (size_t)(text + size - line);
        json_error_t jerr;
        json_t *obj = json_loadb(line, len, 0, &jerr);
        json_t *step = obj ? json_object_get(obj, "step") : NULL;
        if (step && json_is_integer(step)) {
            const char *key;
            json_t *v;
            json_object_foreach(obj, key, v) {
                if (strcmp(key, "step") != 0 && json_is_number(v) && rc == DSARL_OK)
                    rc = metrics_tb_scalar(&m->tb, t, json_integer_value(step), key, (float)json_number_value(v), err);
            }
        }
        json_decref(obj);
        line += len + 1;
    }
    free(text);
    if (rc == DSARL_OK)
        rc = metrics_tb_flush(&m->tb, err);
    return rc;
}

static int open_experiment_dir(const dsarl_metrics_config *cfg, dsarl_metrics *m, dsarl_error *err)
{
    if (cfg->exp_dir) {
        m->dir = strdup(cfg->exp_dir);
    } else {
        if (!cfg->log_dir || !cfg->log_dir[0])
            return DSARL_FAIL(err, DSARL_E_INVALID, "logger.log_dir must be a directory path, got an empty string");
        DSARL_TRY(dsarl_mkdir_p(cfg->log_dir, err));
        int64_t newest;
        DSARL_TRY(newest_experiment(cfg->log_dir, &newest, err));
        /* NeMo RL numbers from exp_001; a resume continues the newest experiment when there is one */
        int64_t id = (cfg->resume_step >= 0 && newest > 0) ? newest : newest + 1;
        char name[32];
        snprintf(name, sizeof name, "exp_%03" PRId64, id);
        m->dir = dsarl_path_join(cfg->log_dir, name);
    }
    if (!m->dir)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory naming the experiment directory");
    return dsarl_mkdir_p(m->dir, err);
}

int dsarl_metrics_open(const dsarl_metrics_config *cfg, dsarl_metrics **out, dsarl_error *err)
{
    *out = NULL;
    dsarl_metrics *m = calloc(1, sizeof *m);
    if (!m)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory creating the run logger");
    m->tensorboard = cfg->tensorboard;
    m->total_steps = cfg->total_steps;
    m->first_step = cfg->resume_step > 0 ? cfg->resume_step : 0;
    m->t_open = now_seconds();
    m->progress = cfg->progress == 0 ? 0 : isatty(STDERR_FILENO) ? 1 : (cfg->progress > 0 ? 2 : 0);
    int rc = open_experiment_dir(cfg, m, err);
    if (rc == DSARL_OK && !(m->jsonl_path = dsarl_path_join(m->dir, "metrics.jsonl")))
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory naming metrics.jsonl");
    char *tb_dir = rc == DSARL_OK ? dsarl_path_join(m->dir, "tensorboard") : NULL;
    if (rc == DSARL_OK && !tb_dir)
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory naming the TensorBoard directory");
    if (rc == DSARL_OK) {
        /* a fresh run in a reused exp_dir starts empty too, so steps never repeat */
        int64_t keep = cfg->resume_step >= 0 ? cfg->resume_step : -1;
        rc = truncate_metrics_file(m->jsonl_path, keep, err);
        if (rc == DSARL_OK)
            rc = remove_later_sample_files(m->dir, keep, err);
        if (rc == DSARL_OK)
            rc = remove_event_files(tb_dir, err);
    }
    if (rc == DSARL_OK && m->tensorboard) {
        rc = metrics_tb_open(&m->tb, tb_dir, err);
        if (rc == DSARL_OK)
            rc = replay_metrics_into_tensorboard(m, err);
    }
    free(tb_dir);
    if (rc == DSARL_OK) {
        m->jsonl = fopen(m->jsonl_path, "a");
        if (!m->jsonl)
            rc = DSARL_FAIL(err, DSARL_E_IO, "cannot open %s for appending: %s", m->jsonl_path, strerror(errno));
    }
    if (rc < 0) {
        dsarl_metrics_close(m);
        return rc;
    }
    *out = m;
    return DSARL_OK;
}

void dsarl_metrics_close(dsarl_metrics *m)
{
    if (!m)
        return;
    if (m->progress_open)
        fputc('\n', stderr);
    if (m->jsonl)
        fclose(m->jsonl);
    metrics_tb_close(&m->tb);
    for (size_t i = 0; i < m->n_entries; i++)
        free(m->entries[i].name);
    free(m->entries);
    free(m->jsonl_path);
    free(m->dir);
    free(m);
}

const char *dsarl_metrics_dir(const dsarl_metrics *m) { return m ? m->dir : NULL; }

int dsarl_metrics_set(dsarl_metrics *m, const char *name, double value, dsarl_error *err)
{
    if (!m) // a rank that does not log (every rank but 0 of a multi-process run)
        return DSARL_OK;
    if (!name || !name[0] || strcmp(name, "step") == 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "metric name '%s' is reserved or empty", name ? name : "(null)");
    for (size_t i = 0; i < m->n_entries; i++) {
        if (strcmp(m->entries[i].name, name) == 0) {
            m->entries[i].value = value;
            return DSARL_OK;
        }
    }
    if (m->n_entries == m->cap_entries) {
        size_t cap = m->cap_entries ? 2 * m->cap_entries : 64;
        metric_entry *p = realloc(m->entries, cap * sizeof *p);
        if (!p)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory recording metric %s", name);
        m->entries = p;
        m->cap_entries = cap;
    }
    char *copy = strdup(name);
    if (!copy)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory recording metric %s", name);
    m->entries[m->n_entries++] = (metric_entry){copy, value};
    return DSARL_OK;
}

int dsarl_metrics_commit(dsarl_metrics *m, int64_t step, dsarl_error *err)
{
    if (!m)
        return DSARL_OK;
    dsarl_text_buffer line = {0};
    int bad = metrics_buf_printf(&line, "{\"step\": %" PRId64, step);
    for (size_t i = 0; i < m->n_entries && !bad; i++) {
        bad |= metrics_buf_append(&line, ", ", 2);
        bad |= dsarl_json_escape_append(&line, m->entries[i].name);
        double v = m->entries[i].value;
        /* %.17g round-trips a double; JSON has no NaN/Infinity, so they are null */
        bad |= isfinite(v) ? metrics_buf_printf(&line, ": %.17g", v) : metrics_buf_append(&line, ": null", 6);
    }
    bad |= metrics_buf_append(&line, "}\n", 2);
    int rc = DSARL_OK;
    if (bad)
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory formatting the metrics of step %" PRId64, step);
    if (rc == DSARL_OK && (fwrite(line.data, 1, line.len, m->jsonl) != line.len || fflush(m->jsonl) != 0))
        rc = DSARL_FAIL(err, DSARL_E_IO, "cannot append step %" PRId64 " to %s: %s", step, m->jsonl_path,
                        strerror(errno));
    free(line.data);
    if (rc == DSARL_OK && m->tensorboard) {
        double t = now_seconds();
        for (size_t i = 0; i < m->n_entries && rc == DSARL_OK; i++)
            if (isfinite(m->entries[i].value))
                rc = metrics_tb_scalar(&m->tb, t, step, m->entries[i].name, (float)m->entries[i].value, err);
        if (rc == DSARL_OK)
            rc = metrics_tb_flush(&m->tb, err);
    }
    for (size_t i = 0; i < m->n_entries; i++)
        free(m->entries[i].name);
    m->n_entries = 0;
    return rc;
}

int dsarl_metrics_write_samples(dsarl_metrics *m, const char *prefix, int64_t step,
                                const dsarl_metrics_sample *samples, size_t n, dsarl_error *err)
{
    if (!m)
        return DSARL_OK;
    char name[96];
    snprintf(name, sizeof name, "%s_data_step%" PRId64 ".jsonl", prefix, step);
    char *path = dsarl_path_join(m->dir, name);
    dsarl_text_buffer text = {0};
    int bad = path == NULL;
    for (size_t i = 0; i < n && !bad; i++) {
        bad |= metrics_buf_append(&text, "{\"prompt\": ", 11);
        bad |= dsarl_json_escape_append(&text, samples[i].prompt);
        bad |= metrics_buf_append(&text, ", \"response\": ", 14);
        bad |= dsarl_json_escape_append(&text, samples[i].response);
        bad |= isfinite(samples[i].reward) ? metrics_buf_printf(&text, ", \"reward\": %.9g", samples[i].reward)
                                           : metrics_buf_append(&text, ", \"reward\": null", 16);
        bad |= isfinite(samples[i].advantage)
                   ? metrics_buf_printf(&text, ", \"advantage\": %.9g}\n", samples[i].advantage)
                   : metrics_buf_append(&text, ", \"advantage\": null}\n", 21);
    }
    int rc = bad ? DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory formatting %s", name)
                 : dsarl_write_file_atomic(path, text.data ? text.data : "", text.len, err);
    free(text.data);
    free(path);
    return rc;
}

static void format_duration(char *buf, size_t size, double seconds)
{
    if (!isfinite(seconds) || seconds < 0)
        seconds = 0;
    long s = (long)(seconds + 0.5);
    if (s >= 3600)
        snprintf(buf, size, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
    else
        snprintf(buf, size, "%02ld:%02ld", s / 60, s % 60);
}

void dsarl_metrics_progress(dsarl_metrics *m, int64_t step, double last_reward)
{
    if (!m || !m->progress)
        return;
    double elapsed = now_seconds() - m->t_open;
    int64_t done_here = step - m->first_step;
    char eta[32] = "--:--", spent[32];
    format_duration(spent, sizeof spent, elapsed);
    char total[32] = "?";
    if (m->total_steps > 0) {
        snprintf(total, sizeof total, "%" PRId64, m->total_steps);
        if (done_here > 0)
            format_duration(eta, sizeof eta, elapsed / (double)done_here * (double)(m->total_steps - step));
    }
    char reward[48] = "";
    if (isfinite(last_reward))
        snprintf(reward, sizeof reward, "  reward %.4f", last_reward);
    if (m->progress == 1) {
        /* ends with \r: a log line written next overwrites it instead of continuing it */
        fprintf(stderr, "\r\033[Kstep %" PRId64 "/%s  elapsed %s  ETA %s%s\r", step, total, spent, eta, reward);
        fflush(stderr);
        m->progress_open = true;
    } else {
        dsarl_log(DSARL_LOG_INFO, "step %" PRId64 "/%s  elapsed %s  ETA %s%s", step, total, spent, eta, reward);
    }
}
