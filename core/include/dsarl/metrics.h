/* dsarl/metrics.h: the run logger. What a training run leaves under logger.log_dir for its user.
 * SDK tier: trainer services (docs/sdk.md): exported by libdsarl, versioned with it; plugins may call them.
 *
 * A run writes into an experiment directory <log_dir>/exp_NNN (NeMo RL's get_next_experiment_dir: a fresh run takes
 * the next free number; a resumed run reuses the newest one) holding:
 *   metrics.jsonl              one JSON object per step: {"step": N, "<name>": value, ...} (non-finite -> null)
 *   train_data_step{N}.jsonl   per-sample dumps (prompt, response, reward, advantage), and val_data_step{N}.jsonl
 *   tensorboard/events.out.tfevents.*   TFRecord-framed Event protos with scalar summaries (logger.tensorboard_enabled)
 * plus a progress line on stderr (step/total, ETA, last reward; redrawn in place on a terminal, a log line otherwise).
 * Every step is flushed when it is committed, so a killed run keeps what it logged. Resuming from step k drops what
 * a previous session logged after k (metrics lines, sample dumps, TensorBoard events), so no step appears twice. */
#ifndef DSARL_METRICS_H
#define DSARL_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "dsarl/error.h"
#include "dsarl/plugin.h"

DSARL_BEGIN_DECLS

typedef struct dsarl_metrics dsarl_metrics;

typedef struct dsarl_metrics_config {
    const char *log_dir;       /* logger.log_dir: the parent of the exp_NNN directories (created when missing) */
    const char *exp_dir;       /* use exactly this directory instead of an exp_NNN below log_dir; NULL = auto */
    bool tensorboard;          /* logger.tensorboard_enabled */
    int progress;              /* 1 = progress line on stderr, 0 = none, -1 = only when stderr is a terminal */
    int64_t total_steps;       /* for the progress line's step/total and ETA; <= 0 = unknown */
    int64_t resume_step;       /* -1 = fresh run (new exp_NNN); k >= 0 = resume after step k (newest exp_NNN) */
} dsarl_metrics_config;

/* Opens the experiment directory (and on resume truncates what was logged after resume_step). */
DSARL_API int dsarl_metrics_open(const dsarl_metrics_config *cfg, dsarl_metrics **out, dsarl_error *err);

/* Flushes and closes everything; ends the progress line. NULL is fine: every function below does nothing on a
 * NULL logger (dsarl_metrics_dir returns NULL), the ranks other than 0 of a multi-process run. */
DSARL_API void dsarl_metrics_close(dsarl_metrics *m);

/* The experiment directory in use (borrowed). */
DSARL_API const char *dsarl_metrics_dir(const dsarl_metrics *m);

/* Records one value of the current step (a later call with the same name replaces it). Names are NeMo's
 * ("train/reward", "timing/train/generation", "val/accuracy", ...). */
DSARL_API int dsarl_metrics_set(dsarl_metrics *m, const char *name, double value, dsarl_error *err);

/* Writes the recorded values as step `step` (metrics.jsonl line + TensorBoard scalars), flushes, and clears them. */
DSARL_API int dsarl_metrics_commit(dsarl_metrics *m, int64_t step, dsarl_error *err);

/* One dumped sample. */
typedef struct dsarl_metrics_sample {
    const char *prompt;
    const char *response;
    double reward;
    double advantage;          /* NAN when not applicable (validation): written as null */
} dsarl_metrics_sample;

/* Writes <prefix>_data_step{step}.jsonl (prefix "train" or "val") atomically, one sample per line. */
DSARL_API int dsarl_metrics_write_samples(dsarl_metrics *m, const char *prefix, int64_t step,
                                          const dsarl_metrics_sample *samples, size_t n, dsarl_error *err);

/* Redraws the progress line: step (1-based count of completed steps), ETA from the mean step time since open, the
 * last mean reward (NAN = not shown). */
DSARL_API void dsarl_metrics_progress(dsarl_metrics *m, int64_t step, double last_reward);

/* Appends `s` to out as a JSON string literal (quotes included); bytes that are not valid UTF-8 become U+FFFD, so
 * any decoded model output is safe to log. Returns 0, or -1 when out of memory. out is a growable buffer. */
typedef struct dsarl_text_buffer {
    char *data;
    size_t len, cap;
} dsarl_text_buffer;
DSARL_API int dsarl_json_escape_append(dsarl_text_buffer *out, const char *s);

/* TensorBoard's masked CRC32C of n bytes (TFRecord framing): ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
DSARL_API uint32_t dsarl_tfrecord_masked_crc32c(const void *data, size_t n);

/* Plain CRC32C (Castagnoli) of n bytes. */
DSARL_API uint32_t dsarl_crc32c(const void *data, size_t n);

/* Serialises one Event proto {wall_time, step, summary {value {tag, simple_value}}} into buf (size bytes); returns
 * the length, or 0 when buf is too small. For the TensorBoard writer and its tests. */
DSARL_API size_t dsarl_tb_scalar_event(uint8_t *buf, size_t size, double wall_time, int64_t step, const char *tag,
                                       float value);

/* The recipe keys the logger reads (logger.*; NeMo's wandb/mlflow/swanlab/gpu-monitoring keys accepted, ignored),
 * for an algorithm's key table. */
DSARL_API const dsarl_key_spec *dsarl_metrics_keys(size_t *n);

/* Fills cfg's log_dir and tensorboard from the recipe's logger section (other fields untouched). */
DSARL_API int dsarl_metrics_config_from_recipe(const dsarl_node *root, dsarl_metrics_config *cfg, dsarl_error *err);

DSARL_END_DECLS

#endif /* DSARL_METRICS_H */
