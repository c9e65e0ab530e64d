/* distill_config.c: the recipe keys of algorithm/distillation with NeMo RL's names and defaults
 * (examples/configs/distillation_math.yaml, DistillationConfig / DistillationLossConfig), and their checks, all
 * made before any model is built.
 *
 * `distillation` and `loss_fn` are owned sections. The teacher is NeMo RL's `teacher` section, a whole policy
 * configuration there; dsarl reads teacher.model_name (a checkpoint directory the model plugin loads on the
 * student's device) and reports the rest as unused. NeMo RL's example uses kl_type "mixed"; dsarl's default is the
 * reverse KL of on-policy distillation (its loss config has no default of its own). */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "distill.h"
#include "dsarl/checkpoint.h"
#include "dsarl/dataset.h"
#include "dsarl/metrics.h"
#include "dsarl/optimizer.h"
#include "grpo_train.h"

#define N DSARL_KEY_NULLABLE

static const dsarl_key_spec distill_own_keys[] = {
    {"algorithm.name", DSARL_KEY_STRING, "distillation", "algorithm plugin that runs the job", 0},
    {"distillation", DSARL_KEY_MAP, NULL, "on-policy distillation loop (NeMo RL's distillation section)",
     DSARL_KEY_OWNED},
    {"distillation.num_prompts_per_step", DSARL_KEY_INT, "128", "prompts per training step", 0},
    {"distillation.num_generations_per_prompt", DSARL_KEY_INT, "1", "student responses per prompt", 0},
    {"distillation.max_rollout_turns", DSARL_KEY_INT, "1",
     "policy turns per episode; > 1 needs a multi-turn environment, observations are masked", 0},
    {"distillation.max_num_steps", DSARL_KEY_INT, "1000", "training steps (whichever limit comes first)", 0},
    {"distillation.max_num_epochs", DSARL_KEY_INT, "10", "passes over the training prompts", 0},
    {"distillation.val_batch_size", DSARL_KEY_INT, "64", "validation prompts per generation batch", 0},
    {"distillation.val_period", DSARL_KEY_INT, "20", "validate (environment accuracy) every N steps; 0 = never", 0},
    {"distillation.val_at_start", DSARL_KEY_BOOL, "false", "validate before the first step", 0},
    {"distillation.val_at_end", DSARL_KEY_BOOL, "false", "validate after the last step", 0},
    {"distillation.max_val_samples", DSARL_KEY_INT, "512", "validation prompts; null = the whole validation set", N},
    {"distillation.topk_logits_k", DSARL_KEY_INT, "64",
     "teacher tokens per position the KL runs over (1..256; the student pass runs the batch k times)", 0},
    {"distillation.seed", DSARL_KEY_INT, "42", "seed of data order, sampling and initialisation", 0},

    {"loss_fn", DSARL_KEY_MAP, NULL, "DistillationLossFn settings", DSARL_KEY_OWNED},
    {"loss_fn.kl_type", DSARL_KEY_STRING, "reverse",
     "reverse = KL(student || teacher), forward = KL(teacher || student), mixed = weighted sum", 0},
    {"loss_fn.mixed_kl_weight", DSARL_KEY_FLOAT, "0.5", "weight of the forward KL under kl_type mixed, in [0, 1]", 0},
    {"loss_fn.zero_outside_topk", DSARL_KEY_BOOL, "false",
     "false: both distributions renormalised over the teacher's top k; true (forward KL only): the student's "
     "full-vocabulary log-probs", 0},

    {"teacher", DSARL_KEY_MAP, NULL, "the teacher policy (NeMo RL's teacher section; only model_name is read)", 0},
    {"teacher.model_name", DSARL_KEY_STRING, "null",
     "checkpoint directory of the teacher (same model family and vocabulary as the student; may be larger)", N},

    {"policy.train_global_batch_size", DSARL_KEY_INT, "64", "samples per optimizer step", 0},
    {"policy.max_total_sequence_length", DSARL_KEY_INT, "512", "prompt + response tokens", 0},
};

/* NeMo RL's distillation_math schedule: constant 2e-5 after a 10-step warm-up from 2e-6, clip 1. */
static const dsarl_lr_schedule distill_schedule_defaults = {
    .struct_size = sizeof(dsarl_lr_schedule), .lr = 2.0e-5, .min_lr = 2.0e-5, .warmup_init = 2.0e-6,
    .warmup_iters = 10, .decay_iters = 1000, .decay_style = DSARL_LR_CONSTANT, .max_grad_norm = 1.0};

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
    lists[0] = (dsarl_key_list){distill_own_keys, DSARL_ARRAY_LEN(distill_own_keys)};
    lists[1].keys = dsarl_lr_schedule_keys(&distill_schedule_defaults, "distillation.max_num_steps", &schedule_keys,
                                           &lists[1].n_keys);
    lists[2] = (dsarl_key_list){grpo_train_keys, grpo_train_n_keys};
    lists[3].keys = dsarl_metrics_keys(&lists[3].n_keys);
    lists[4].keys = dsarl_checkpoint_keys(&lists[4].n_keys);
    lists[5].keys = dsarl_optimizer_keys(&lists[5].n_keys);
    lists[6].keys = dsarl_dataset_keys(&lists[6].n_keys);
    join_rc = dsarl_key_table_join("algorithm/distillation", lists, DSARL_ARRAY_LEN(lists), all_keys,
                                   DSARL_ARRAY_LEN(all_keys), &n_all_keys, &join_err);
}

int distill_recipe_keys(const dsarl_key_spec **keys, size_t *n, dsarl_error *err)
{
    pthread_once(&keys_once, join_keys);
    *keys = all_keys;
    *n = n_all_keys;
    if (join_rc != DSARL_OK && err)
        *err = join_err; /* the join's own message and source location */
    return join_rc;
}

#define REFUSE(path, ...) return dsarl_recipe_fail(root, path, err, DSARL_E_INVALID, __VA_ARGS__)

int distill_config_from_recipe(const dsarl_node *root, distill_config *cfg, dsarl_error *err)
{
    memset(cfg, 0, sizeof *cfg);
    grpo_config *g = &cfg->loop;
    grpo_config_defaults(g);
    /* the loop's GRPO-only parts stay off: no reference policy, no KL penalty, no dynamic sampling */
    g->skip_reference_policy_logprobs = true;
    g->loss.reference_policy_kl_penalty = 0.0;
    g->val_num_generations_per_prompt = 1;
    DSARL_TRY(dsarl_recipe_int_or(root, "distillation.num_prompts_per_step", 128, &g->num_prompts_per_step, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "distillation.num_generations_per_prompt", 1, &g->num_generations_per_prompt,
                                  err));
    DSARL_TRY(dsarl_recipe_int_or(root, "distillation.max_rollout_turns", 1, &g->max_rollout_turns, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "distillation.max_num_steps", 1000, &g->max_num_steps, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "distillation.max_num_epochs", 10, &g->max_num_epochs, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "distillation.val_batch_size", 64, &g->val_batch_size, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "distillation.val_period", 20, &g->val_period, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "distillation.val_at_start", false, &g->val_at_start, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "distillation.val_at_end", false, &g->val_at_end, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "distillation.max_val_samples", 512, &g->max_val_samples, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "distillation.topk_logits_k", 64, &cfg->topk_logits_k, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "distillation.seed", 42, &g->seed, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "policy.train_global_batch_size", 64, &g->train_global_batch_size, err));
    const dsarl_node *mvs = dsarl_node_get(root, "distillation.max_val_samples");
    if (mvs && dsarl_node_kind(mvs) == DSARL_NODE_NULL)
        g->max_val_samples = -1;

    const char *kl = NULL;
    DSARL_TRY(dsarl_recipe_string_or(root, "loss_fn.kl_type", "reverse", &kl, err));
    DSARL_TRY(dsarl_recipe_double_or(root, "loss_fn.mixed_kl_weight", 0.5, &cfg->loss.mixed_kl_weight, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "loss_fn.zero_outside_topk", false, &cfg->loss.zero_outside_topk, err));
    DSARL_TRY(dsarl_recipe_string_or(root, "teacher.model_name", NULL, &cfg->teacher_dir, err));

    if (strcmp(kl, "forward") == 0)
        cfg->loss.kl_type = DISTILL_KL_FORWARD;
    else if (strcmp(kl, "reverse") == 0)
        cfg->loss.kl_type = DISTILL_KL_REVERSE;
    else if (strcmp(kl, "mixed") == 0)
        cfg->loss.kl_type = DISTILL_KL_MIXED;
    else
        REFUSE("loss_fn.kl_type", "must be forward, reverse or mixed, got \"%s\"", kl);
    if (!(cfg->loss.mixed_kl_weight >= 0.0 && cfg->loss.mixed_kl_weight <= 1.0))
        REFUSE("loss_fn.mixed_kl_weight", "must be in [0, 1], got %g", cfg->loss.mixed_kl_weight);
    if (cfg->loss.zero_outside_topk && cfg->loss.kl_type != DISTILL_KL_FORWARD)
        return dsarl_recipe_fail(root, "loss_fn.zero_outside_topk", err, DSARL_E_UNSUPPORTED,
                                 "true with kl_type %s is not supported yet (the tail entropy term needs the "
                                 "student's whole vocabulary): use kl_type forward, or zero_outside_topk false", kl);
    if (cfg->topk_logits_k < 1 || cfg->topk_logits_k > 256)
        REFUSE("distillation.topk_logits_k", "must be in [1, 256], got %" PRId64, cfg->topk_logits_k);
    if (!cfg->teacher_dir || !cfg->teacher_dir[0])
        REFUSE("teacher.model_name", "is needed: the teacher's checkpoint directory (config.json + safetensors of "
               "the student's model family)");
    if (g->num_prompts_per_step < 1)
        REFUSE("distillation.num_prompts_per_step", "must be >= 1, got %" PRId64, g->num_prompts_per_step);
    if (g->num_generations_per_prompt < 1)
        REFUSE("distillation.num_generations_per_prompt", "must be >= 1, got %" PRId64,
               g->num_generations_per_prompt);
    if (g->max_rollout_turns < 1)
        REFUSE("distillation.max_rollout_turns", "must be >= 1, got %" PRId64, g->max_rollout_turns);
    if (g->max_num_steps < 1)
        REFUSE("distillation.max_num_steps", "must be >= 1, got %" PRId64, g->max_num_steps);
    if (g->max_num_epochs < 1)
        REFUSE("distillation.max_num_epochs", "must be >= 1, got %" PRId64, g->max_num_epochs);
    if (g->val_period < 0)
        REFUSE("distillation.val_period", "must be >= 0 (0 = never), got %" PRId64, g->val_period);
    if (g->val_batch_size < 1)
        REFUSE("distillation.val_batch_size", "must be >= 1, got %" PRId64, g->val_batch_size);
    if (g->train_global_batch_size < 1)
        REFUSE("policy.train_global_batch_size", "must be >= 1, got %" PRId64, g->train_global_batch_size);
    DSARL_TRY(dsarl_lr_schedule_from_recipe(root, &distill_schedule_defaults, g->max_num_steps, &g->lr_schedule,
                                            err));
    return dsarl_lr_schedule_validate(root, &g->lr_schedule, "distillation.max_num_steps", err);
}
