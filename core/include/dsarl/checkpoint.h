/* dsarl/checkpoint.h: training checkpoints with NeMo RL's layout and semantics, and bit-identical resume.
 * SDK tier: trainer services (docs/sdk.md): exported by libdsarl, versioned with it; plugins may call them.
 *
 * Layout of one checkpoint, checkpointing.checkpoint_dir/step_N/:
 *   policy/weights/            the model in Hugging Face layout (model ops save: config.json + model.safetensors)
 *   policy/optimizer/optimizer.safetensors   AdamW m, v, step (model ops optimizer_save), when save_optimizer;
 *                              under a distributed optimizer one optimizer.shard<r>-of-<n>.safetensors per dp_cp rank
 *   training_info.json         trainer state: step, consumed samples, dataloader positions, every RNG state,
 *                              metrics (the keep_top_k one among them), accumulated wall-clock
 *   config.yaml                the resolved recipe (when one is given)
 *   manifest.json              written LAST: every other file with its size and CRC-32
 * Everything is written into tmp_step_N, which is renamed to step_N only once the manifest is on disk, so a crash
 * leaves either no step_N or a complete one. A step_N whose manifest is missing or disagrees with a file (size,
 * checksum) or that lacks a listed file is detected, logged in one line naming the file and why, and never loaded.
 * Nothing here draws random numbers; resuming restores every generator from its stored (seed, stream, offset). */
#ifndef DSARL_CHECKPOINT_H
#define DSARL_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "dsarl/comm.h"
#include "dsarl/dataset.h"
#include "dsarl/error.h"
#include "dsarl/ops/model.h"
#include "dsarl/plugin.h"
#include "dsarl/recipe.h"
#include "dsarl/rng.h"

DSARL_BEGIN_DECLS

/* The checkpointing section (NeMo RL keys; strings borrow from the recipe). */
typedef struct dsarl_checkpoint_config {
    bool enabled;               /* checkpointing.enabled */
    const char *checkpoint_dir; /* checkpointing.checkpoint_dir */
    int64_t save_period;        /* save every N steps (and at the last step); 0 = only at the end */
    int64_t keep_top_k;         /* step_N directories kept; -1 = all (recipe null) */
    const char *metric_name;    /* "val:accuracy" / "train:loss" ranks them; NULL = the newest are kept */
    bool higher_is_better;
    bool save_optimizer;        /* checkpointing.save_optimizer */
    double must_save_by_s;      /* checkpoint_must_save_by in seconds after the run start; < 0 = no deadline */
} dsarl_checkpoint_config;

/* ABI 1.4: the largest step a checkpoint may hold (2^53: exact in JSON's numbers); training_info.json beyond it
 * is refused. */
#define DSARL_CHECKPOINT_MAX_STEP ((int64_t)1 << 53)

/* ABI 1.4: checkpointing.on_corrupt, what resume does with a step_N that fails verification (manifest missing,
 * truncated or garbage, a size or CRC-32 mismatch, a missing file, a training_info.json whose step is not N). */
typedef enum dsarl_checkpoint_on_corrupt {
    DSARL_CHECKPOINT_ON_CORRUPT_FALLBACK = 0, /* move it aside, resume from the newest good one; stop when none is */
    DSARL_CHECKPOINT_ON_CORRUPT_FAIL = 1,     /* stop, naming each and why */
    DSARL_CHECKPOINT_ON_CORRUPT_RESTART = 2,  /* as fallback, but start over from step 0 when none is good */
} dsarl_checkpoint_on_corrupt;

/* ABI 1.4: reads checkpointing.on_corrupt (fallback when absent or root is NULL); a bad value fails naming it. */
DSARL_API int dsarl_checkpoint_on_corrupt_from_recipe(const dsarl_node *root, dsarl_checkpoint_on_corrupt *out,
                                                      dsarl_error *err);

/* The checkpointing.* recipe keys (NeMo RL defaults), for an algorithm's key table. */
DSARL_API const dsarl_key_spec *dsarl_checkpoint_keys(size_t *n);

/* Reads and range-checks the checkpointing section; bad values fail naming the key's location. */
DSARL_API int dsarl_checkpoint_config_from_recipe(const dsarl_node *root, dsarl_checkpoint_config *cfg,
                                                  dsarl_error *err);

/* Parses NeMo's "DD:HH:MM:SS" duration (HH < 24, MM and SS < 60) into seconds; `what` names the value in errors. */
DSARL_API int dsarl_parse_duration(const char *text, const char *what, double *seconds, dsarl_error *err);

/* True when the run should save now and stop: elapsed_s since the run start plus the expected duration of one
 * more step (and its save) would pass checkpoint_must_save_by. Always false without a deadline. */
DSARL_API bool dsarl_checkpoint_deadline_near(const dsarl_checkpoint_config *cfg, double elapsed_s,
                                              double next_step_s);

/* True when step (completed steps, >= 1) is due for a save: every save_period steps and at the last step. */
DSARL_API bool dsarl_checkpoint_due(const dsarl_checkpoint_config *cfg, int64_t step, bool is_last_step);

/* ------------------------------------------------------------------------------------------------------------
 * Trainer state (training_info.json). Named entries so each algorithm stores what it has. */

#define DSARL_TRAINER_NAME_MAX 48
#define DSARL_TRAINER_MAX_ENTRIES 16

typedef struct dsarl_named_rng {
    char name[DSARL_TRAINER_NAME_MAX];
    dsarl_rng_state state;
} dsarl_named_rng;

typedef struct dsarl_named_loader {
    char name[DSARL_TRAINER_NAME_MAX];
    dsarl_dataloader_state state;
} dsarl_named_loader;

typedef struct dsarl_named_value {
    char name[DSARL_TRAINER_NAME_MAX]; /* "val:accuracy", "train:loss", ... */
    double value;
} dsarl_named_value;

typedef struct dsarl_trainer_state {
    int64_t step;              /* optimizer steps completed */
    int64_t consumed_samples;  /* training samples consumed */
    double total_train_time_s; /* wall-clock spent training, summed over resumes */
    int32_t n_rngs, n_loaders, n_metrics;
    dsarl_named_rng rngs[DSARL_TRAINER_MAX_ENTRIES];
    dsarl_named_loader loaders[DSARL_TRAINER_MAX_ENTRIES];
    dsarl_named_value metrics[DSARL_TRAINER_MAX_ENTRIES];
} dsarl_trainer_state;

/* Adds or replaces a named entry; fails when the name is too long or the table is full. */
DSARL_API int dsarl_trainer_state_set_rng(dsarl_trainer_state *st, const char *name, dsarl_rng_state state,
                                          dsarl_error *err);
DSARL_API int dsarl_trainer_state_set_loader(dsarl_trainer_state *st, const char *name,
                                             dsarl_dataloader_state state, dsarl_error *err);
DSARL_API int dsarl_trainer_state_set_metric(dsarl_trainer_state *st, const char *name, double value,
                                             dsarl_error *err);

/* Looks a named entry up; DSARL_E_NOT_FOUND naming the entry when absent. */
DSARL_API int dsarl_trainer_state_get_rng(const dsarl_trainer_state *st, const char *name, dsarl_rng_state *out,
                                          dsarl_error *err);
DSARL_API int dsarl_trainer_state_get_loader(const dsarl_trainer_state *st, const char *name,
                                             dsarl_dataloader_state *out, dsarl_error *err);
DSARL_API int dsarl_trainer_state_get_metric(const dsarl_trainer_state *st, const char *name, double *out,
                                             dsarl_error *err);

/* ------------------------------------------------------------------------------------------------------------
 * Saving, finding, verifying and loading. */

/* CRC-32 (IEEE 802.3, zlib's crc32): start with crc = 0, feed the data in any number of pieces. */
DSARL_API uint32_t dsarl_crc32(uint32_t crc, const void *data, size_t n);

/* Writes checkpoint_dir/step_<state->step>/ as described above (recipe may be NULL: no config.yaml), replacing a
 * leftover tmp_step_N and an existing step_N, then applies keep_top_k. saved_dir (may be NULL) receives the
 * step directory's path (size bytes). One process writes: with several ranks, use dsarl_checkpoint_save_group. */
DSARL_API int dsarl_checkpoint_save(const dsarl_checkpoint_config *cfg, const dsarl_model_ops *ops,
                                    dsarl_model *model, const dsarl_trainer_state *state, const dsarl_node *recipe,
                                    char *saved_dir, size_t size, dsarl_error *err);

/* dsarl_checkpoint_save for a run of several processes, collective over world (NULL: one process). World rank 0
 * writes the weights, the trainer state, the recipe and (without shards) the optimizer state; with shards (the
 * dp_cp group of a distributed optimizer, size > 1) every member writes its own shard as
 * policy/optimizer/optimizer.shard<r>-of-<n>.safetensors; rank 0 writes the manifest over all of them last and
 * renames. Every rank returns the same outcome (a peer's failure as "another rank failed ..."). */
/* weights_collective: the model's save is collective over the world (glm5's gathers tensor/expert shards and agrees
 * on the outcome), so every rank calls ops->save on the same directory and world rank 0 writes the files. */
DSARL_API int dsarl_checkpoint_save_group(const dsarl_checkpoint_config *cfg, const dsarl_model_ops *ops,
                                          dsarl_model *model, const dsarl_trainer_state *state,
                                          const dsarl_node *recipe, const dsarl_group *world,
                                          const dsarl_group *shards, bool weights_collective, char *saved_dir,
                                          size_t size, dsarl_error *err);

/* Checks step_dir against its manifest (present, parses, every listed file present with its size and CRC-32);
 * the error names the file and what is wrong. */
DSARL_API int dsarl_checkpoint_verify(const char *step_dir, dsarl_error *err);

/* The newest complete step_N under checkpoint_dir: *step = N and its path in out (size bytes), or *step = -1 when
 * there is none (a missing checkpoint_dir included). Incomplete ones (tmp_step_N, failed verification) are
 * skipped with one warning line each naming the file and why. */
/* ABI 1.4: the step_N to resume from under policy: the newest that verifies (manifest and step == N of its
 * training_info.json). Steps newer than it that do not verify are each logged naming the file and why, and then:
 * FAIL stops (DSARL_E_INVALID listing each); FALLBACK and RESTART rename each to step_N.corrupt-<UTC time> (when
 * move_corrupt: one process of a run does) and say which step is used; with none good FALLBACK stops and RESTART
 * starts over (*step = -1). *step = -1 and no error when checkpoint_dir holds no step_N at all. */
DSARL_API int dsarl_checkpoint_choose(const char *checkpoint_dir, dsarl_checkpoint_on_corrupt policy,
                                      bool move_corrupt, char *out, size_t size, int64_t *step, dsarl_error *err);

/* ABI 1.4: dsarl_checkpoint_resume_group behind checkpointing.on_corrupt (read from recipe, may be NULL) and, on
 * the lead process, a probe that creates ckpt->checkpoint_dir and writes a file into it (unwritable: fails naming
 * the key). Errors about the stored dataloader position name the training_info.json. */
DSARL_API int dsarl_checkpoint_resume_checked(const dsarl_checkpoint_config *ckpt, const dsarl_node *recipe,
                                              bool lead, const dsarl_model_ops *ops, dsarl_model *model,
                                              dsarl_dataloader *loader, dsarl_trainer_state *state,
                                              const dsarl_group *shards, char *step_dir, size_t size,
                                              dsarl_error *err);

DSARL_API int dsarl_checkpoint_find_latest(const char *checkpoint_dir, char *out, size_t size, int64_t *step,
                                           dsarl_error *err);

/* Reads training_info.json of a step directory (no verification). */
DSARL_API int dsarl_checkpoint_read_state(const char *step_dir, dsarl_trainer_state *state, dsarl_error *err);

/* Verifies step_dir, then restores the weights, the optimizer state (when saved) and the trainer state into a
 * model built from the same config. */
DSARL_API int dsarl_checkpoint_load(const char *step_dir, const dsarl_model_ops *ops, dsarl_model *model,
                                    dsarl_trainer_state *state, dsarl_error *err);

/* dsarl_checkpoint_load reading this rank's optimizer shard of shards (NULL or size 1: the unsharded file). A
 * checkpoint saved under another layout is refused naming it. */
DSARL_API int dsarl_checkpoint_load_group(const char *step_dir, const dsarl_model_ops *ops, dsarl_model *model,
                                          dsarl_trainer_state *state, const dsarl_group *shards, dsarl_error *err);

/* Resumes a run from the newest complete step_N under checkpoint_dir (dsarl_checkpoint_find_latest, then
 * dsarl_checkpoint_load) and sets loader to the saved position of the "train" dataloader. *state receives the
 * trainer state and step_dir (size bytes) the step's path; state->step = -1 when there is nothing to resume. */
DSARL_API int dsarl_checkpoint_resume(const char *checkpoint_dir, const dsarl_model_ops *ops, dsarl_model *model,
                                      dsarl_dataloader *loader, dsarl_trainer_state *state, char *step_dir,
                                      size_t size, dsarl_error *err);
/* dsarl_checkpoint_resume with dsarl_checkpoint_load_group's shards. Every rank of a run calls it. */
DSARL_API int dsarl_checkpoint_resume_group(const char *checkpoint_dir, const dsarl_model_ops *ops,
                                            dsarl_model *model, dsarl_dataloader *loader, dsarl_trainer_state *state,
                                            const dsarl_group *shards, char *step_dir, size_t size,
                                            dsarl_error *err);

/* Deletes step_N directories beyond keep_top_k: ranked by metric_name (higher_is_better) when set, steps without
 * the metric ranked last, else by step; the newest step is always kept. */
DSARL_API int dsarl_checkpoint_prune(const dsarl_checkpoint_config *cfg, dsarl_error *err);

DSARL_END_DECLS

#endif /* DSARL_CHECKPOINT_H */
