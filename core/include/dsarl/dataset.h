/* dsarl/dataset.h: prompt/answer examples for RL and SFT, and a resumable, deterministic dataloader.
 * SDK tier: trainer services (docs/sdk.md): exported by libdsarl, versioned with it; plugins may call them.
 *
 * An example is the prompt as chat messages, the ground truth the environment checks, and a task name
 * (data.*.env_name picks the environment per task). Sources:
 *   - DAPO-Math jsonl: {"prompt": [{"role": "user", "content": ...}], "reward_model": {"ground_truth": ...}, ...}
 *     (the layout of BytedTsinghua-SIA/DAPO-Math-17k and AIME-2024 exported with to_json(lines=True));
 *   - plain jsonl with configurable keys (NeMo RL's data_path + input_key + output_key): the input is a string
 *     (one user message) or a list of {role, content}; the output is a string or an integer;
 *   - "arithmetic": a built-in deterministic generator ("What is 12+7? ..." -> "19") whose train and validation
 *     splits never share a problem: each expression is hashed (FNV-1a) into a bucket that belongs to one split.
 * A dataset owns all its strings. A malformed jsonl line fails the load naming file:line and the key. */
#ifndef DSARL_DATASET_H
#define DSARL_DATASET_H

#include <stddef.h>
#include <stdint.h>
#include "dsarl/plugin.h"
#include "dsarl/recipe.h"
#include "dsarl/tokenizer.h"

DSARL_BEGIN_DECLS

typedef struct dsarl_example {
    const dsarl_chat_message *messages; /* the prompt, in order (system/user turns; no answer) */
    size_t n_messages;
    const char *ground_truth;           /* what the environment compares against */
    const char *task_name;              /* e.g. "math", "arithmetic" */
} dsarl_example;

typedef struct dsarl_dataset dsarl_dataset;

typedef enum dsarl_split {
    DSARL_SPLIT_TRAIN = 0,
    DSARL_SPLIT_VALIDATION = 1,
} dsarl_split;

/* Knobs of the arithmetic task; dsarl_arithmetic_config_default fills the defaults listed here. */
typedef struct dsarl_arithmetic_config {
    uint64_t seed;              /* 42; the same seed and knobs always give the same examples */
    int64_t num_examples;       /* 1024 distinct problems (fails when the knobs allow fewer in the split) */
    int min_digits, max_digits; /* 1, 2: digits of each operand, drawn uniformly per operand */
    int num_operands;           /* 2 (2..8) */
    const char *operators;      /* "+-": any of '+', '-', '*' (usual precedence: * before + and -) */
    int64_t min_answer;         /* -1000000000 */
    int64_t max_answer;         /* 1000000000: problems whose answer falls outside are redrawn */
    double validation_fraction; /* 0.1: share of the hash buckets that belong to the validation split */
    const char *prompt_format;  /* "What is {}? Give the final answer after 'Answer:'." ("{}" = "12+7") */
    const char *task_name;      /* "math" (the environment that checks it) */
    const char *function;       /* NULL: operators join the operands; "max" or "min": "max(4,8,2,7)" instead */
} dsarl_arithmetic_config;

/* Fills *cfg with the defaults above. */
DSARL_API void dsarl_arithmetic_config_default(dsarl_arithmetic_config *cfg);

/* Generates the given split of the arithmetic task. */
DSARL_API int dsarl_dataset_arithmetic(const dsarl_arithmetic_config *cfg, dsarl_split split, dsarl_dataset **out,
                                       dsarl_error *err);

/* Loads DAPO-Math jsonl (prompt messages + reward_model.ground_truth); task_name NULL means "math". */
DSARL_API int dsarl_dataset_load_dapo_jsonl(const char *path, const char *task_name, dsarl_dataset **out,
                                            dsarl_error *err);

/* Loads plain jsonl: input_key (string or message list) and output_key (string or integer) per line. */
DSARL_API int dsarl_dataset_load_jsonl(const char *path, const char *input_key, const char *output_key,
                                       const char *task_name, dsarl_dataset **out, dsarl_error *err);

/* Builds the dataset a recipe section describes ("data.train" or "data.validation"), then applies the prompt
 * files (the section's prompt_file/system_prompt_file, else data.default's). Keys (see dsarl_dataset_keys):
 *   dataset_name: arithmetic | DAPOMath17K | DAPOMathAIME2024 | dapo (DAPO layout, read from data_path: dsarl
 *                 downloads nothing) | null or ResponseDataset (plain jsonl from data_path)
 *   data_path, input_key ("input"), output_key ("output"), seed (arithmetic), task_name,
 *   arithmetic: {num_examples, min_digits, max_digits, num_operands, operators, function, min_answer,
 *                max_answer, validation_fraction, prompt_format}
 * Errors name the key and where its value came from. */
DSARL_API int dsarl_dataset_from_recipe(const dsarl_node *root, const char *section, dsarl_split split,
                                        dsarl_dataset **out, dsarl_error *err);

/* The recipe keys dsarl_dataset_from_recipe reads (paths under data.*), for an algorithm's key table. */
DSARL_API const dsarl_key_spec *dsarl_dataset_keys(size_t *n);

/* Rewrites every example's prompt like NeMo RL's math data processor: the last user message's content becomes
 * prompt_template with "{}" (or "{0}") replaced by it ("{{" and "}}" are literal braces), and a system message
 * with system_prompt is put first. Either may be NULL (no change). `where` names the template's origin in errors. */
DSARL_API int dsarl_dataset_apply_prompt(dsarl_dataset *ds, const char *prompt_template, const char *system_prompt,
                                         const char *where, dsarl_error *err);

/* Reads the two files (either path may be NULL) and calls dsarl_dataset_apply_prompt. */
DSARL_API int dsarl_dataset_apply_prompt_files(dsarl_dataset *ds, const char *prompt_file,
                                               const char *system_prompt_file, dsarl_error *err);

/* Number of examples. */
DSARL_API size_t dsarl_dataset_size(const dsarl_dataset *ds);

/* Example i (borrowed), or NULL when i is out of range. */
DSARL_API const dsarl_example *dsarl_dataset_get(const dsarl_dataset *ds, size_t i);

/* Frees the dataset (NULL is fine). Examples handed out earlier become invalid. */
DSARL_API void dsarl_dataset_free(dsarl_dataset *ds);

/* ------------------------------------------------------------------------------------------------------------
 * Dataloader: batches of examples in a per-epoch order. With shuffle, epoch e's order is a Fisher-Yates
 * permutation drawn from Philox stream e of the seed, so any position can be restored without replaying. */

typedef struct dsarl_dataloader dsarl_dataloader;

/* The position to store in a checkpoint: the epoch of the next batch and how many examples of that epoch's order
 * were already handed out. */
typedef struct dsarl_dataloader_state {
    int64_t epoch;
    int64_t cursor;
} dsarl_dataloader_state;

/* A loader over ds (which must outlive it). drop_last != 0 (NeMo's training loader) never returns a short batch:
 * an epoch is floor(size / batch_size) batches, and a dataset smaller than one batch is refused. */
DSARL_API int dsarl_dataloader_create(const dsarl_dataset *ds, size_t batch_size, int shuffle, int drop_last,
                                      uint64_t seed, dsarl_dataloader **out, dsarl_error *err);

/* The next batch: batch[0..*n) get the examples (batch must hold batch_size pointers), *epoch (may be NULL) the
 * epoch they belong to. An epoch ends when no full batch (drop_last) or no example is left; the next call starts
 * the next epoch in a fresh order. indices (may be NULL) receive the examples' dataset indices. */
DSARL_API int dsarl_dataloader_next(dsarl_dataloader *dl, const dsarl_example **batch, size_t *indices, size_t *n,
                                    int64_t *epoch, dsarl_error *err);

/* Batches in one epoch. */
DSARL_API int64_t dsarl_dataloader_batches_per_epoch(const dsarl_dataloader *dl);

/* The current position. */
DSARL_API dsarl_dataloader_state dsarl_dataloader_get_state(const dsarl_dataloader *dl);

/* Moves to a stored position; the batches that follow equal those the saved loader would have returned. Fails
 * for a negative epoch or a cursor beyond the epoch's length. */
DSARL_API int dsarl_dataloader_set_state(dsarl_dataloader *dl, dsarl_dataloader_state state, dsarl_error *err);

/* Frees the loader (NULL is fine). */
DSARL_API void dsarl_dataloader_free(dsarl_dataloader *dl);

DSARL_END_DECLS

#endif /* DSARL_DATASET_H */
