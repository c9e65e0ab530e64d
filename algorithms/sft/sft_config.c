/* sft_config.c: the recipe keys of algorithm/sft (NeMo RL's sft section names and defaults from
 * examples/configs/sft.yaml) and their checks, all made before any model is built. */
#include <inttypes.h>
#include <pthread.h>
#include <string.h>
#include "dsarl/checkpoint.h"
#include "dsarl/dataset.h"
#include "dsarl/metrics.h"
#include "dsarl/optimizer.h"
#include "sft.h"

#define N DSARL_KEY_NULLABLE

static const dsarl_key_spec sft_own_keys[] = {
    {"sft", DSARL_KEY_MAP, NULL, "supervised fine-tuning loop (NeMo RL's sft section)", DSARL_KEY_OWNED},
    {"sft.max_num_steps", DSARL_KEY_INT, "60", "optimizer steps (the run stops at whichever limit comes first)", 0},
    {"sft.max_num_epochs", DSARL_KEY_INT, "1", "passes over the training data", 0},
    {"sft.val_period", DSARL_KEY_INT, "10", "validate every N steps; 0 = never", 0},
    {"sft.val_batches", DSARL_KEY_INT, "8", "validation batches per validation; <= 0 = the whole validation set", 0},
    {"sft.val_global_batch_size", DSARL_KEY_INT, "32", "validation samples per batch", 0},
    {"sft.val_micro_batch_size", DSARL_KEY_INT, "1", "validation samples per forward", 0},
    {"sft.val_at_start", DSARL_KEY_BOOL, "true", "validate before the first step", 0},
    {"sft.val_at_end", DSARL_KEY_BOOL, "false", "validate after the last step", 0},
    {"sft.seed", DSARL_KEY_INT, "42", "seed of the data order and of a random initialisation", 0},
    {"sft.answer_format", DSARL_KEY_STRING, "Answer: {}",
     "training target around the ground truth ({}); the math environment reads the last 'Answer:'", 0},
    {"policy.tokenizer.name", DSARL_KEY_STRING, NULL, "\"byte\", a tokenizer.json, or a directory holding one; "
     "null = policy.model_name", N},
    {"policy.tokenizer.chat_template", DSARL_KEY_STRING, NULL, "glm | plain | none; null = the tokenizer's default",
     N},
    {"policy.train_global_batch_size", DSARL_KEY_INT, "32", "samples per optimizer step", 0},
    {"policy.train_micro_batch_size", DSARL_KEY_INT, "1", "samples per forward/backward (gradient accumulation)", 0},
    {"policy.max_total_sequence_length", DSARL_KEY_INT, "1024", "prompt + answer tokens; longer samples are cut", 0},
};

/* After the shared schedule keys (see join_keys), so `dsarl config keys` lists them in the usual order. */
static const dsarl_key_spec sft_tail_keys[] = {
    {"policy.generation.max_new_tokens", DSARL_KEY_INT, "32", "greedy validation decode length", 0},
    {"data.shuffle", DSARL_KEY_BOOL, "true", "reshuffle the training samples every epoch", 0},
};

/* SFT's schedule defaults: Megatron's lr / min_lr / clip, no warm-up (NeMo RL's sft.yaml); a null lr_decay_iters
 * decays over sft.max_num_steps (decay_iters here is never read). */
static const dsarl_lr_schedule sft_schedule_defaults = {
    .struct_size = sizeof(dsarl_lr_schedule), .lr = 5.0e-6, .min_lr = 5.0e-7, .warmup_init = 0.0, .warmup_iters = 0,
    .decay_iters = 60, .decay_style = DSARL_LR_CONSTANT, .max_grad_norm = 1.0};

static dsarl_lr_schedule_key_table schedule_keys;
/* Joined once, on first use (the lists it joins live in libdsarl, so it cannot be a static initializer); 512 leaves
 * room to grow, and the join fails the plugin's load if it ever does not. */
static dsarl_key_spec all_keys[512];
static size_t n_all_keys;
static int join_rc;
static dsarl_error join_err;
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;

static void join_keys(void)
{
    dsarl_key_list lists[7];
    lists[0] = (dsarl_key_list){sft_own_keys, DSARL_ARRAY_LEN(sft_own_keys)};
    lists[1].keys = dsarl_lr_schedule_keys(&sft_schedule_defaults, "sft.max_num_steps", &schedule_keys,
                                           &lists[1].n_keys);
    lists[2] = (dsarl_key_list){sft_tail_keys, DSARL_ARRAY_LEN(sft_tail_keys)};
    lists[3].keys = dsarl_checkpoint_keys(&lists[3].n_keys);
    lists[4].keys = dsarl_optimizer_keys(&lists[4].n_keys);
    lists[5].keys = dsarl_metrics_keys(&lists[5].n_keys);
    lists[6].keys = dsarl_dataset_keys(&lists[6].n_keys);
    join_rc = dsarl_key_table_join("algorithm/sft", lists, DSARL_ARRAY_LEN(lists), all_keys,
                                   DSARL_ARRAY_LEN(all_keys), &n_all_keys, &join_err);
}

int sft_recipe_keys(const dsarl_key_spec **keys, size_t *n, dsarl_error *err)
{
    pthread_once(&keys_once, join_keys);
    *keys = all_keys;
    *n = n_all_keys;
    if (join_rc != DSARL_OK && err)
        *err = join_err; /* the join's own message and source location */
    return join_rc;
}

#define REFUSE(path, ...) return dsarl_recipe_fail(root, path, err, DSARL_E_INVALID, __VA_ARGS__)

int sft_config_from_recipe(const dsarl_node *root, sft_config *cfg, dsarl_error *err)
{
    memset(cfg, 0, sizeof *cfg);
    DSARL_TRY(dsarl_recipe_int_or(root, "sft.max_num_steps", 60, &cfg->max_num_steps, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "sft.max_num_epochs", 1, &cfg->max_num_epochs, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "sft.val_period", 10, &cfg->val_period, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "sft.val_batches", 8, &cfg->val_batches, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "sft.val_global_batch_size", 32, &cfg->val_global_batch_size, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "sft.val_micro_batch_size", 1, &cfg->val_micro_batch_size, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "sft.val_at_start", true, &cfg->val_at_start, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "sft.val_at_end", false, &cfg->val_at_end, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "sft.seed", 42, &cfg->seed, err));
    DSARL_TRY(dsarl_recipe_string_or(root, "sft.answer_format", "Answer: {}", &cfg->answer_format, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "policy.train_global_batch_size", 32, &cfg->global_batch, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "policy.train_micro_batch_size", 1, &cfg->micro_batch, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "policy.max_total_sequence_length", 1024, &cfg->max_seq_len, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "policy.generation.max_new_tokens", 32, &cfg->max_new_tokens, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "data.shuffle", true, &cfg->shuffle, err));
    DSARL_TRY(dsarl_recipe_string_or(root, "policy.tokenizer.name", NULL, &cfg->tokenizer_name, err));
    if (!cfg->tokenizer_name)
        DSARL_TRY(dsarl_recipe_string_or(root, "policy.model_name", NULL, &cfg->tokenizer_name, err));
    DSARL_TRY(dsarl_recipe_string_or(root, "policy.tokenizer.chat_template", NULL, &cfg->chat_template, err));

    if (cfg->max_num_steps < 1)
        REFUSE("sft.max_num_steps", "must be >= 1, got %" PRId64, cfg->max_num_steps);
    if (cfg->max_num_epochs < 1)
        REFUSE("sft.max_num_epochs", "must be >= 1, got %" PRId64, cfg->max_num_epochs);
    if (cfg->val_period < 0)
        REFUSE("sft.val_period", "must be >= 0 (0 = never), got %" PRId64, cfg->val_period);
    if (cfg->val_global_batch_size < 1)
        REFUSE("sft.val_global_batch_size", "must be >= 1, got %" PRId64, cfg->val_global_batch_size);
    if (cfg->val_micro_batch_size < 1 || cfg->val_micro_batch_size > cfg->val_global_batch_size)
        REFUSE("sft.val_micro_batch_size", "must be in [1, sft.val_global_batch_size = %" PRId64 "], got %" PRId64,
               cfg->val_global_batch_size, cfg->val_micro_batch_size);
    if (!strstr(cfg->answer_format, "{}"))
        REFUSE("sft.answer_format", "must contain {} where the ground truth goes, got \"%s\"", cfg->answer_format);
    if (cfg->global_batch < 1)
        REFUSE("policy.train_global_batch_size", "must be >= 1, got %" PRId64, cfg->global_batch);
    if (cfg->micro_batch < 1 || cfg->global_batch % cfg->micro_batch != 0)
        REFUSE("policy.train_micro_batch_size", "must be >= 1 and divide policy.train_global_batch_size (%" PRId64
               "), got %" PRId64, cfg->global_batch, cfg->micro_batch);
    if (cfg->max_seq_len < 2)
        REFUSE("policy.max_total_sequence_length", "must be >= 2, got %" PRId64, cfg->max_seq_len);
    if (cfg->max_new_tokens < 1)
        REFUSE("policy.generation.max_new_tokens", "must be >= 1, got %" PRId64, cfg->max_new_tokens);
    if (!cfg->tokenizer_name)
        REFUSE("policy.tokenizer.name", "is needed (\"byte\" for the byte tokenizer, or a tokenizer.json path) when "
               "policy.model_name is null");
    DSARL_TRY(dsarl_lr_schedule_from_recipe(root, &sft_schedule_defaults, cfg->max_num_steps, &cfg->lr_schedule,
                                            err));
    return dsarl_lr_schedule_validate(root, &cfg->lr_schedule, "sft.max_num_steps", err);
}
