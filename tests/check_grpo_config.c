/* check_grpo_config.c: the GRPO recipe keys, config loading and validation (grpo_keys.c, grpo_config.c), and the
 * plugin's run entry.
 *
 * Recipes go through the real host path: load (defaults chain) -> Hydra override -> resolve -> schema validation
 * with the plugin's key table -> grpo_config_from_recipe. Every bad value must be refused with the key's path and
 * its origin (the command-line argument or file:line) in the message. */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsarl/ops/algorithm.h"
#include "grpo.h"
#include "recipe_internal.h"
#include "schema.h"

/* The grpo key table as the schema sees it (grpo_recipe_keys builds it on first use). */
static const dsarl_schema_table *grpo_table(void)
{
    static dsarl_schema_table table = {"algorithm/grpo", NULL, 0};
    table.keys = grpo_recipe_keys(&table.n_keys);
    return &table;
}

/* Loads the base recipe, applies the overrides, resolves and validates against the grpo keys; returns the recipe
 * (caller frees) and the status of grpo_config_from_recipe in *rc. */
static dsarl_recipe *load_base(const char *const *overrides, int n, grpo_config *cfg, int *rc, dsarl_error *err)
{
    dsarl_recipe *r = NULL;
    ck_assert_int_eq(dsarl_recipe_load_file(DSARL_SOURCE_DIR "/configs/grpo_math.yaml", &r, err), 0);
    for (int i = 0; i < n; i++)
        ck_assert_msg(dsarl_recipe_override(r, overrides[i], i + 1, err) == 0, "override %s: %s", overrides[i],
                      err->message);
    ck_assert_msg(dsarl_recipe_resolve(r, err) == 0, "%s", err->message);
    *rc = dsarl_schema_validate(r, grpo_table(), 1, NULL, err);
    if (*rc == 0)
        *rc = grpo_config_from_recipe(dsarl_recipe_root(r), cfg, err);
    return r;
}

/* The shipped recipes validate, and their GRPO settings read as written. */
START_TEST(test_shipped_recipes_validate)
{
    static const char *const files[] = {
        "grpo_math.yaml", "recipes/llm/grpo-glm5.2-tiny.yaml", "recipes/llm/grpo-glm5.1-tiny.yaml",
        "recipes/llm/grpo-glm5.1-64n8g-megatron.yaml", "recipes/llm/grpo-glm5.2-64n8g-megatron-6K-colocated.yaml",
        "recipes/llm/grpo-glm5.2-72n8g-megatron-noncolocated.yaml"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/configs/%s", DSARL_SOURCE_DIR, files[i]);
        dsarl_recipe *r = NULL;
        dsarl_error err = {0};
        ck_assert_msg(dsarl_recipe_load_file(path, &r, &err) == 0, "%s: %s", files[i], err.message);
        ck_assert_msg(dsarl_recipe_resolve(r, &err) == 0, "%s: %s", files[i], err.message);
        ck_assert_msg(dsarl_schema_validate(r, grpo_table(), 1, NULL, &err) == 0, "%s: %s", files[i], err.message);
        grpo_config cfg;
        ck_assert_msg(grpo_config_from_recipe(dsarl_recipe_root(r), &cfg, &err) == 0, "%s: %s", files[i], err.message);
        if (strstr(files[i], "glm5.2-tiny")) {
            ck_assert_int_eq(cfg.num_prompts_per_step, 16);
            ck_assert_int_eq(cfg.num_generations_per_prompt, 8);
            ck_assert(!cfg.advantage.use_leave_one_out_baseline && cfg.advantage.normalize_rewards);
            ck_assert(cfg.loss.reference_policy_kl_penalty == 0.0 && cfg.skip_reference_policy_logprobs);
            ck_assert(cfg.loss.ratio_clip_max == 0.28 && cfg.loss.ratio_clip_min == 0.2);
            ck_assert(cfg.lr_schedule.lr == 3e-4 && cfg.lr_schedule.warmup_iters == 10);
            ck_assert(cfg.lr_schedule.decay_style == DSARL_LR_COSINE && cfg.lr_schedule.decay_iters == 200);
        }
        if (strstr(files[i], "6K-colocated")) {
            ck_assert(cfg.loss.use_importance_sampling_correction);
            ck_assert_int_eq(cfg.loss.truncation, GRPO_TRUNCATION_TIS);
            ck_assert(cfg.loss.truncation_ratio == 2.0 && cfg.loss.truncation_ratio_min == 0.0);
            ck_assert(cfg.loss.ratio_clip_c == 10.0);
            ck_assert_int_eq(cfg.lr_schedule.decay_iters, 10000);
        }
        if (strstr(files[i], "noncolocated"))
            ck_assert(cfg.loss.force_on_policy_ratio && cfg.train_global_batch_size == 32);
        if (strcmp(files[i], "grpo_math.yaml") == 0) {
            // NeMo RL's defaults, and the interpolated reward_shaping.max_response_length = 512.
            ck_assert(cfg.loss.reference_policy_kl_penalty == 0.01 && cfg.loss.kl_type == GRPO_KL_K3);
            ck_assert(cfg.loss.kl_input_clamp_value == 20.0 && cfg.loss.kl_output_clamp_value == 10.0);
            ck_assert(cfg.advantage.use_leave_one_out_baseline && cfg.advantage.normalize_rewards);
            ck_assert(isinf(cfg.advantage.advantage_clip_low) && isinf(cfg.advantage.advantage_clip_high));
            ck_assert_int_eq(cfg.reward_shaping.max_response_length, 512);
            ck_assert(cfg.lr_schedule.max_grad_norm == 1.0 && cfg.lr_schedule.decay_style == DSARL_LR_CONSTANT);
            ck_assert(!cfg.skip_reference_policy_logprobs);
        }
        dsarl_recipe_free(r);
    }
}
END_TEST

/* A recipe with no grpo/loss_fn sections at all reads as the defaults, whether the schema filled the declared
 * defaults or the loader fell back on its own: the two default sets agree. */
START_TEST(test_declared_defaults_match_loader)
{
    grpo_config from_schema, from_loader, want;
    dsarl_error err = {0};
    dsarl_recipe *a = NULL, *b = NULL;
    ck_assert_int_eq(dsarl_recipe_load_string("policy:\n  max_total_sequence_length: 512\n", "a.yaml", &a, &err), 0);
    ck_assert_int_eq(dsarl_recipe_load_string("policy:\n  max_total_sequence_length: 512\n", "b.yaml", &b, &err), 0);
    ck_assert_msg(dsarl_schema_validate(a, grpo_table(), 1, NULL, &err) == 0, "%s", err.message);
    ck_assert_int_eq(grpo_config_load(dsarl_recipe_root(a), &from_schema, &err), 0);
    ck_assert_int_eq(grpo_config_load(dsarl_recipe_root(b), &from_loader, &err), 0);
    grpo_config_defaults(&want);
    const grpo_config *c[2] = {&from_schema, &from_loader};
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(c[i]->num_prompts_per_step, want.num_prompts_per_step);
        ck_assert_int_eq(c[i]->num_generations_per_prompt, want.num_generations_per_prompt);
        ck_assert_int_eq(c[i]->max_num_steps, want.max_num_steps);
        ck_assert_int_eq(c[i]->val_period, want.val_period);
        ck_assert_int_eq(c[i]->max_val_samples, want.max_val_samples);
        ck_assert_int_eq(c[i]->val_batch_size, want.val_batch_size);
        ck_assert_int_eq(c[i]->seed, want.seed);
        ck_assert_int_eq(c[i]->dynamic_sampling_max_gen_batches, want.dynamic_sampling_max_gen_batches);
        ck_assert(c[i]->batch_multiplier == want.batch_multiplier);
        ck_assert(c[i]->advantage.normalize_rewards && c[i]->advantage.use_leave_one_out_baseline);
        ck_assert(c[i]->loss.ratio_clip_min == 0.2 && c[i]->loss.ratio_clip_max == 0.2 && c[i]->loss.ratio_clip_c == 0);
        ck_assert(c[i]->loss.reference_policy_kl_penalty == 0.01 && c[i]->loss.kl_type == GRPO_KL_K3);
        ck_assert(c[i]->loss.kl_input_clamp_value == 20.0 && c[i]->loss.kl_output_clamp_value == 10.0);
        ck_assert(c[i]->loss.token_level_loss && !c[i]->loss.force_on_policy_ratio);
        ck_assert_int_eq(c[i]->loss.truncation, GRPO_TRUNCATION_NONE);
        ck_assert(c[i]->reward_scaling.source_max == 1.0 && !c[i]->reward_scaling.enabled);
        ck_assert_int_eq(c[i]->reward_shaping.overlong_buffer_length, 128);
        ck_assert(c[i]->reward_shaping.overlong_buffer_penalty == 1.0);
        ck_assert(!c[i]->reward_shaping.has_stop_properly_penalty_coef);
        ck_assert_int_eq(c[i]->reward_shaping.max_response_length, 512);
        ck_assert_int_eq(c[i]->train_global_batch_size, 512);
        ck_assert(c[i]->lr_schedule.max_grad_norm == 1.0);
        ck_assert(c[i]->lr_schedule.lr == 5e-6 && c[i]->lr_schedule.min_lr == 5e-7);
        ck_assert(c[i]->lr_schedule.warmup_init == 5e-7 && c[i]->lr_schedule.warmup_iters == 13);
        ck_assert_int_eq(c[i]->lr_schedule.decay_iters, c[i]->max_num_steps);
    }
    ck_assert_int_eq(grpo_config_validate(dsarl_recipe_root(a), &from_schema, &err), 0);
    dsarl_recipe_free(a);
    dsarl_recipe_free(b);
}
END_TEST

/* Every NeMo RL grpo / loss_fn key of reference section 1.5 is declared, once, with a one-line doc; `grpo` and
 * `loss_fn` are owned, so a typo below them is refused with a suggestion. */
START_TEST(test_key_table)
{
    static const char *const nemo_keys[] = {
        "grpo.num_prompts_per_step", "grpo.num_generations_per_prompt", "grpo.max_rollout_turns",
        "grpo.max_num_epochs", "grpo.max_num_steps", "grpo.normalize_rewards", "grpo.use_leave_one_out_baseline",
        "grpo.val_period", "grpo.val_start_at", "grpo.val_at_start", "grpo.val_at_end", "grpo.overlong_filtering",
        "grpo.advantage_clip_low", "grpo.advantage_clip_high", "grpo.max_val_samples",
        "grpo.val_num_generations_per_prompt", "grpo.stop_at_validation_metric", "grpo.stop_at_validation_threshold",
        "grpo.val_batch_size", "grpo.seed", "grpo.use_dynamic_sampling", "grpo.dynamic_sampling_max_gen_batches",
        "grpo.batch_multiplier", "grpo.reward_shaping.enabled", "grpo.reward_shaping.overlong_buffer_length",
        "grpo.reward_shaping.overlong_buffer_penalty", "grpo.reward_shaping.max_response_length",
        "grpo.reward_shaping.stop_properly_penalty_coef", "grpo.adv_estimator.name",
        "grpo.adv_estimator.normalize_rewards", "grpo.adv_estimator.use_leave_one_out_baseline",
        "grpo.adv_estimator.minus_baseline", "grpo.reward_scaling.enabled", "grpo.reward_scaling.source_min",
        "grpo.reward_scaling.source_max", "grpo.reward_scaling.target_min", "grpo.reward_scaling.target_max",
        "grpo.seq_logprob_error_threshold", "grpo.invalid_tool_call_advantage", "grpo.malformed_thinking_advantage",
        "grpo.async_grpo.enabled", "grpo.async_grpo.max_trajectory_age_steps",
        "grpo.async_grpo.max_generation_failures", "grpo.async_grpo.in_flight_weight_updates",
        "grpo.async_grpo.recompute_kv_cache_after_weight_updates", "grpo.skip_reference_policy_logprobs_calculation",
        "grpo.calculate_advantages_on_gpu", "loss_fn.reference_policy_kl_penalty", "loss_fn.reference_policy_kl_type",
        "loss_fn.kl_input_clamp_value", "loss_fn.kl_output_clamp_value", "loss_fn.ratio_clip_min",
        "loss_fn.ratio_clip_max", "loss_fn.ratio_clip_c", "loss_fn.use_on_policy_kl_approximation",
        "loss_fn.use_importance_sampling_correction", "loss_fn.truncated_importance_sampling_type",
        "loss_fn.truncated_importance_sampling_ratio", "loss_fn.truncated_importance_sampling_ratio_min",
        "loss_fn.sequence_level_importance_ratios", "loss_fn.token_level_loss", "loss_fn.force_on_policy_ratio",
        "loss_fn.use_kl_in_reward", "loss_fn.use_cispo", "loss_fn.disable_ppo_ratio",
        "loss_fn.positive_example_nll_weight", "algorithm.name"};
    size_t n_keys;
    const dsarl_key_spec *keys = grpo_recipe_keys(&n_keys);
    for (size_t i = 0; i < n_keys; i++) {
        ck_assert_msg(keys[i].path && keys[i].doc && keys[i].doc[0],
                      "key %zu has no path or doc", i);
        for (size_t j = 0; j < i; j++)
            ck_assert_msg(strcmp(keys[i].path, keys[j].path) != 0, "%s declared twice", keys[i].path);
    }
    for (size_t k = 0; k < sizeof nemo_keys / sizeof nemo_keys[0]; k++) {
        bool found = false;
        for (size_t i = 0; i < n_keys && !found; i++)
            found = strcmp(keys[i].path, nemo_keys[k]) == 0;
        ck_assert_msg(found, "NeMo RL key %s is not declared", nemo_keys[k]);
    }
    // A typo inside the owned sections fails with a suggestion.
    dsarl_recipe *r = NULL;
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_recipe_load_string("loss_fn:\n  ratio_clip_mx: 0.3\n", "typo.yaml", &r, &err), 0);
    ck_assert_int_ne(dsarl_schema_validate(r, grpo_table(), 1, NULL, &err), 0);
    ck_assert_msg(strstr(err.message, "ratio_clip_max") && strstr(err.message, "typo.yaml:2"), "%s", err.message);
    dsarl_recipe_free(r);
}
END_TEST

/* One bad value: the override(s) applied to the base recipe, the key the message must name, the status. */
typedef struct bad_case {
    const char *overrides[3];
    const char *key;
    int code;
} bad_case;

static const bad_case bad_cases[] = {
    {{"grpo.num_generations_per_prompt=1"}, "grpo.num_generations_per_prompt", DSARL_E_INVALID},
    {{"grpo.num_generations_per_prompt=1", "grpo.normalize_rewards=false"}, "grpo.num_generations_per_prompt",
     DSARL_E_INVALID},  // still leave-one-out
    {{"grpo.num_generations_per_prompt=0", "grpo.normalize_rewards=false", "grpo.use_leave_one_out_baseline=false"},
     "grpo.num_generations_per_prompt", DSARL_E_INVALID},
    {{"grpo.num_prompts_per_step=0"}, "grpo.num_prompts_per_step", DSARL_E_INVALID},
    {{"grpo.max_num_epochs=0"}, "grpo.max_num_epochs", DSARL_E_INVALID},
    {{"grpo.max_num_steps=0"}, "grpo.max_num_steps", DSARL_E_INVALID},
    {{"grpo.val_period=-1"}, "grpo.val_period", DSARL_E_INVALID},
    {{"grpo.val_start_at=-2"}, "grpo.val_start_at", DSARL_E_INVALID},
    {{"grpo.max_val_samples=0"}, "grpo.max_val_samples", DSARL_E_INVALID},
    {{"grpo.val_batch_size=0"}, "grpo.val_batch_size", DSARL_E_INVALID},
    {{"grpo.val_num_generations_per_prompt=0"}, "grpo.val_num_generations_per_prompt", DSARL_E_INVALID},
    {{"grpo.stop_at_validation_metric=loss", "grpo.stop_at_validation_threshold=0.5"},
     "grpo.stop_at_validation_metric", DSARL_E_INVALID},
    {{"grpo.stop_at_validation_metric=accuracy"}, "grpo.stop_at_validation_metric", DSARL_E_INVALID},
    {{"grpo.use_dynamic_sampling=true", "grpo.dynamic_sampling_max_gen_batches=0"},
     "grpo.dynamic_sampling_max_gen_batches", DSARL_E_INVALID},
    {{"grpo.batch_multiplier=0"}, "grpo.batch_multiplier", DSARL_E_INVALID},
    {{"grpo.batch_multiplier=0.3"}, "grpo.batch_multiplier", DSARL_E_INVALID},  // 32 * 0.3 = 9.6 prompts
    {{"grpo.advantage_clip_low=1.0", "grpo.advantage_clip_high=-1.0"}, "grpo.advantage_clip_low", DSARL_E_INVALID},
    {{"grpo.skip_reference_policy_logprobs_calculation=true"}, "grpo.skip_reference_policy_logprobs_calculation",
     DSARL_E_INVALID},  // beta is 0.01 in the base
    {{"grpo.reward_scaling.enabled=true", "grpo.reward_scaling.source_max=0.0"}, "grpo.reward_scaling.source_max",
     DSARL_E_INVALID},
    {{"grpo.reward_shaping.enabled=true", "grpo.reward_shaping.stop_properly_penalty_coef=1.5"},
     "grpo.reward_shaping.stop_properly_penalty_coef", DSARL_E_INVALID},
    {{"grpo.reward_shaping.enabled=true", "grpo.reward_shaping.overlong_buffer_length=0"},
     "grpo.reward_shaping.overlong_buffer_length", DSARL_E_INVALID},
    {{"grpo.reward_shaping.enabled=true", "grpo.reward_shaping.overlong_buffer_penalty=-1"},
     "grpo.reward_shaping.overlong_buffer_penalty", DSARL_E_INVALID},
    {{"grpo.reward_shaping.enabled=true", "grpo.reward_shaping.max_response_length=100"},
     "grpo.reward_shaping.max_response_length", DSARL_E_INVALID},  // buffer is 128
    {{"loss_fn.ratio_clip_min=1.5"}, "loss_fn.ratio_clip_min", DSARL_E_INVALID},
    {{"loss_fn.ratio_clip_min=-0.1"}, "loss_fn.ratio_clip_min", DSARL_E_INVALID},
    {{"loss_fn.ratio_clip_max=-0.1"}, "loss_fn.ratio_clip_max", DSARL_E_INVALID},
    {{"loss_fn.ratio_clip_c=1.0"}, "loss_fn.ratio_clip_c", DSARL_E_INVALID},
    {{"loss_fn.ratio_clip_c=0.5"}, "loss_fn.ratio_clip_c", DSARL_E_INVALID},
    {{"loss_fn.reference_policy_kl_penalty=-0.01"}, "loss_fn.reference_policy_kl_penalty", DSARL_E_INVALID},
    {{"loss_fn.reference_policy_kl_type=k4"}, "loss_fn.reference_policy_kl_type", DSARL_E_INVALID},
    {{"loss_fn.kl_input_clamp_value=0"}, "loss_fn.kl_input_clamp_value", DSARL_E_INVALID},
    {{"loss_fn.kl_output_clamp_value=-1"}, "loss_fn.kl_output_clamp_value", DSARL_E_INVALID},
    {{"loss_fn.truncated_importance_sampling_type=tis", "loss_fn.truncated_importance_sampling_ratio=2.0"},
     "loss_fn.truncated_importance_sampling_type", DSARL_E_INVALID},  // correction is off
    {{"loss_fn.use_importance_sampling_correction=true", "loss_fn.truncated_importance_sampling_type=clip",
      "loss_fn.truncated_importance_sampling_ratio=2.0"},
     "loss_fn.truncated_importance_sampling_type", DSARL_E_INVALID},
    {{"loss_fn.use_importance_sampling_correction=true", "loss_fn.truncated_importance_sampling_type=tis"},
     "loss_fn.truncated_importance_sampling_ratio", DSARL_E_INVALID},  // no ratio
    {{"loss_fn.use_importance_sampling_correction=true", "loss_fn.truncated_importance_sampling_type=icepop",
      "loss_fn.truncated_importance_sampling_ratio=2.0"},
     "loss_fn.truncated_importance_sampling_ratio_min", DSARL_E_INVALID},
    {{"loss_fn.use_importance_sampling_correction=true", "loss_fn.truncated_importance_sampling_type=seq-mask-tis",
      "loss_fn.truncated_importance_sampling_ratio=1.002"},
     "loss_fn.truncated_importance_sampling_ratio_min", DSARL_E_INVALID},
    {{"loss_fn.use_importance_sampling_correction=true", "loss_fn.truncated_importance_sampling_ratio_min=3.0",
      "loss_fn.truncated_importance_sampling_ratio=2.0"},
     "loss_fn.truncated_importance_sampling_ratio", DSARL_E_INVALID},  // ratio set, type null
    {{"loss_fn.truncated_importance_sampling_ratio=2.0"}, "loss_fn.truncated_importance_sampling_ratio",
     DSARL_E_INVALID},  // no type
    {{"loss_fn.force_on_policy_ratio=true", "policy.train_global_batch_size=256"}, "loss_fn.force_on_policy_ratio",
     DSARL_E_INVALID},
    {{"policy.train_global_batch_size=0"}, "policy.train_global_batch_size", DSARL_E_INVALID},
    {{"policy.train_global_batch_size=1024"}, "policy.train_global_batch_size", DSARL_E_INVALID},
    {{"policy.train_global_batch_size=300"}, "policy.train_global_batch_size", DSARL_E_INVALID},
    {{"policy.max_grad_norm=-1.0"}, "policy.max_grad_norm", DSARL_E_INVALID},
    {{"policy.megatron_cfg.optimizer.lr=0.0"}, "policy.megatron_cfg.optimizer.lr", DSARL_E_INVALID},
    {{"policy.megatron_cfg.optimizer.min_lr=1.0"}, "policy.megatron_cfg.optimizer.min_lr", DSARL_E_INVALID},
    {{"policy.megatron_cfg.scheduler.lr_warmup_init=1.0"}, "policy.megatron_cfg.scheduler.lr_warmup_init",
     DSARL_E_INVALID},
    {{"policy.megatron_cfg.scheduler.lr_warmup_iters=1000"}, "policy.megatron_cfg.scheduler.lr_warmup_iters",
     DSARL_E_INVALID},  // decay is 1000
    {{"policy.megatron_cfg.scheduler.lr_decay_style=exponential"}, "policy.megatron_cfg.scheduler.lr_decay_style",
     DSARL_E_INVALID},
    {{"policy.megatron_cfg.scheduler.lr_decay_style=WSD"}, "policy.megatron_cfg.scheduler.lr_decay_style",
     DSARL_E_UNSUPPORTED},
    // NeMo RL features dsarl does not implement: refused unless left at their default.
    {{"grpo.max_rollout_turns=0"}, "grpo.max_rollout_turns", DSARL_E_INVALID},
    {{"grpo.max_rollout_turns=3", "++grpo.adv_estimator.name=gdpo"}, "grpo.max_rollout_turns", DSARL_E_INVALID},
    {{"++grpo.adv_estimator.name=opd"}, "grpo.adv_estimator.name", DSARL_E_UNSUPPORTED},
    {{"++grpo.adv_estimator.name=ppo"}, "grpo.adv_estimator.name", DSARL_E_INVALID},
    {{"++grpo.async_grpo.enabled=true"}, "grpo.async_grpo.enabled", DSARL_E_INVALID}, // colocated by default
    // NeMo RL's variant combinations its loss and setup assert against, and values that would drop all data.
    {{"loss_fn.sequence_level_importance_ratios=true"}, "loss_fn.token_level_loss", DSARL_E_INVALID},
    {{"loss_fn.sequence_level_importance_ratios=true", "loss_fn.token_level_loss=false",
      "loss_fn.truncated_importance_sampling_type=seq-mask-tis"}, "seq-mask-tis", DSARL_E_INVALID},
    {{"loss_fn.use_cispo=true", "loss_fn.disable_ppo_ratio=true"}, "loss_fn.use_cispo", DSARL_E_INVALID},
    {{"loss_fn.use_cispo=true", "loss_fn.force_on_policy_ratio=true", "policy.train_global_batch_size=512"},
     "loss_fn.force_on_policy_ratio", DSARL_E_INVALID},
    {{"loss_fn.use_cispo=true", "loss_fn.ratio_clip_c=3"}, "loss_fn.ratio_clip_c", DSARL_E_INVALID},
    {{"loss_fn.use_cispo=true", "loss_fn.token_level_loss=false"}, "loss_fn.token_level_loss", DSARL_E_INVALID},
    {{"loss_fn.use_cispo=true", "loss_fn.sequence_level_importance_ratios=true", "loss_fn.token_level_loss=false"},
     "loss_fn.sequence_level_importance_ratios", DSARL_E_INVALID},
    {{"loss_fn.use_kl_in_reward=true"}, "reinforce_plus_plus", DSARL_E_INVALID},
    {{"loss_fn.use_kl_in_reward=true", "++grpo.adv_estimator.name=reinforce_plus_plus",
      "loss_fn.reference_policy_kl_penalty=0"}, "loss_fn.use_kl_in_reward", DSARL_E_INVALID},
    {{"loss_fn.use_kl_in_reward=true", "++grpo.adv_estimator.name=reinforce_plus_plus",
      "loss_fn.force_on_policy_ratio=true"}, "loss_fn.force_on_policy_ratio", DSARL_E_INVALID},
    {{"++grpo.adv_estimator.reward_weights=[1,2]"}, "grpo.adv_estimator.reward_weights", DSARL_E_INVALID},
    {{"++grpo.adv_estimator.name=gdpo", "++grpo.adv_estimator.reward_weights=[1,x]"},
     "grpo.adv_estimator.reward_weights", DSARL_E_INVALID},
    {{"loss_fn.positive_example_nll_weight=-0.1"}, "loss_fn.positive_example_nll_weight", DSARL_E_INVALID},
    {{"++grpo.seq_logprob_error_threshold=0.9"}, "grpo.seq_logprob_error_threshold", DSARL_E_INVALID},
    // Wrong types are refused by the schema, with the key and its origin.
    {{"grpo.num_prompts_per_step=abc"}, "grpo.num_prompts_per_step", DSARL_E_INVALID},
    {{"loss_fn.token_level_loss=1"}, "loss_fn.token_level_loss", DSARL_E_INVALID},
};

START_TEST(test_bad_values_refused_with_location)
{
    const bad_case *c = &bad_cases[_i];
    int n = 0;
    while (n < 3 && c->overrides[n])
        n++;
    grpo_config cfg;
    int rc;
    dsarl_error err = {0};
    dsarl_recipe *r = load_base(c->overrides, n, &cfg, &rc, &err);
    ck_assert_msg(rc == c->code, "%s: status %d (%s), want %d: %s", c->overrides[0], rc, dsarl_status_name(rc), c->code,
                  err.message);
    ck_assert_msg(strstr(err.message, c->key), "%s: message does not name %s: %s", c->overrides[0], c->key,
                  err.message);
    // The location is the command-line argument that set the value (or, for interpolations, the file).
    ck_assert_msg(strstr(err.message, "command line argument") || strstr(err.message, "grpo_math.yaml:"),
                  "%s: message has no location: %s", c->overrides[0], err.message);
    dsarl_recipe_free(r);
}
END_TEST

/* A bad value written in a YAML file is located at its file:line:column. */
START_TEST(test_file_location_in_message)
{
    dsarl_recipe *r = NULL;
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_recipe_load_string("grpo:\n  num_generations_per_prompt: 1\nloss_fn:\n"
                                              "  reference_policy_kl_penalty: 0.0\n",
                                              "bad.yaml", &r, &err),
                     0);
    grpo_config cfg;
    ck_assert_int_eq(grpo_config_from_recipe(dsarl_recipe_root(r), &cfg, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "bad.yaml:2:") && strstr(err.message, "grpo.num_generations_per_prompt") &&
                      strstr(err.message, "normalize_rewards"),
                  "%s", err.message);
    dsarl_recipe_free(r);
}
END_TEST

/* The settings a recipe can legitimately combine are accepted (they are not refused by accident). */
START_TEST(test_good_combinations_accepted)
{
    static const char *const good[][5] = {
        {"loss_fn.use_importance_sampling_correction=true", "loss_fn.truncated_importance_sampling_type=tis",
         "loss_fn.truncated_importance_sampling_ratio=5.0"},
        {"grpo.num_generations_per_prompt=1", "grpo.normalize_rewards=false", "grpo.use_leave_one_out_baseline=false",
         "policy.train_global_batch_size=32"},
        {"loss_fn.kl_input_clamp_value=null", "loss_fn.kl_output_clamp_value=null", "loss_fn.ratio_clip_c=3"},
        {"grpo.reward_shaping.enabled=true", "grpo.reward_shaping.stop_properly_penalty_coef=0.0", NULL},
        {"grpo.use_dynamic_sampling=true", "grpo.batch_multiplier=3", "grpo.reward_scaling.enabled=true"},
        {"loss_fn.force_on_policy_ratio=true", "loss_fn.reference_policy_kl_penalty=0",
         "grpo.skip_reference_policy_logprobs_calculation=true"},
        {"policy.megatron_cfg.scheduler.lr_decay_style=cosine", "policy.megatron_cfg.optimizer.clip_grad=0", NULL},
        {"loss_fn.sequence_level_importance_ratios=true", "loss_fn.token_level_loss=false",
         "loss_fn.ratio_clip_c=3"},
        {"loss_fn.use_cispo=true", "loss_fn.positive_example_nll_weight=0.1", "++grpo.seq_logprob_error_threshold=1.5"},
        {"++grpo.adv_estimator.name=reinforce_plus_plus", "loss_fn.use_kl_in_reward=true",
         "++grpo.adv_estimator.minus_baseline=false"},
        {"++grpo.adv_estimator.name=gdpo", "++grpo.adv_estimator.reward_weights=[1,0.5]",
         "++grpo.malformed_thinking_advantage=-1", "++grpo.invalid_tool_call_advantage=-5"},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        int n = 0, rc;
        while (n < 5 && good[i][n])
            n++;
        grpo_config cfg;
        dsarl_error err = {0};
        dsarl_recipe *r = load_base(good[i], n, &cfg, &rc, &err);
        ck_assert_msg(rc == 0, "%s: %s", good[i][0], err.message);
        if (i == 0)
            ck_assert(cfg.loss.truncation == GRPO_TRUNCATION_TIS && cfg.loss.truncation_ratio_min == 0.0);
        if (i == 2)
            ck_assert(isinf(cfg.loss.kl_input_clamp_value) && isinf(cfg.loss.kl_output_clamp_value) &&
                      cfg.loss.ratio_clip_c == 3.0);
        if (i == 5)
            ck_assert(cfg.skip_reference_policy_logprobs);
        if (i == 6)
            ck_assert(cfg.lr_schedule.max_grad_norm == 0.0 && cfg.lr_schedule.decay_style == DSARL_LR_COSINE);
        if (i == 7)
            ck_assert(cfg.loss.sequence_level_importance_ratios && !cfg.loss.token_level_loss);
        if (i == 8)
            ck_assert(cfg.loss.use_cispo && cfg.loss.positive_example_nll_weight == 0.1 &&
                      cfg.seq_logprob_error_threshold == 1.5);
        if (i == 9)
            ck_assert(cfg.advantage.estimator == GRPO_ESTIMATOR_REINFORCE_PP && cfg.loss.use_kl_in_reward &&
                      !cfg.advantage.minus_baseline);
        if (i == 10)
            ck_assert(cfg.advantage.estimator == GRPO_ESTIMATOR_GDPO && cfg.advantage.n_reward_weights == 2 &&
                      cfg.advantage.reward_weights[1] == 0.5 && cfg.malformed_thinking_advantage == -1.0 &&
                      cfg.invalid_tool_call_advantage == -5.0);
        dsarl_recipe_free(r);
    }
}
END_TEST

/* The built plugin registers (algorithm, grpo) with its keys; run validates the config and then says the loop is
 * not built yet, or refuses a bad recipe first. */
static const dsarl_ops_common *registered;

static int capture_ops(const dsarl_host *host, dsarl_kind kind, const dsarl_ops_common *ops, dsarl_error *err)
{
    ck_assert_int_eq(kind, DSARL_KIND_ALGORITHM);
    registered = ops;
    return 0;
}

START_TEST(test_plugin_run)
{
    void *so = dlopen(GRPO_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    ck_assert_msg(so, "dlopen %s: %s", GRPO_PLUGIN_PATH, dlerror());
    const dsarl_plugin_descriptor *d = dlsym(so, DSARL_PLUGIN_SYMBOL);
    ck_assert_ptr_nonnull(d);
    ck_assert_str_eq(d->name, "algorithm-grpo");
    dsarl_host host = {.struct_size = sizeof host, .abi_major = DSARL_ABI_MAJOR, .abi_minor = DSARL_ABI_MINOR,
                       .register_ops = capture_ops};
    dsarl_error err = {0};
    ck_assert_int_eq(d->init(&host, &err), 0);
    ck_assert_ptr_nonnull(registered);
    ck_assert_str_eq(registered->name, "grpo");
    ck_assert_str_eq(registered->keys[0].path, "algorithm.name");
    size_t n_grpo_keys;
    grpo_recipe_keys(&n_grpo_keys);
    ck_assert_uint_gt(registered->n_keys, n_grpo_keys); /* + the loop's, logger, checkpoint, ... keys */
    const dsarl_algorithm_ops *ops = (const dsarl_algorithm_ops *)registered;

    int rc;
    grpo_config cfg;
    dsarl_recipe *r = load_base(NULL, 0, &cfg, &rc, &err);
    ck_assert_int_eq(rc, 0);
    dsarl_run_context ctx = {.struct_size = sizeof ctx, .host = &host, .recipe = dsarl_recipe_root(r)};
    /* the GRPO config passes; the base recipe names no model or tokenizer, which the loop refuses by key */
    ck_assert_int_eq(ops->run(&ctx, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "policy.tokenizer.name") != NULL, "%s", err.message);
    dsarl_recipe_free(r);

    static const char *const bad[] = {"loss_fn.ratio_clip_min=2"};
    r = load_base(bad, 1, &cfg, &rc, &err);
    ctx.recipe = dsarl_recipe_root(r);
    ck_assert_int_eq(ops->run(&ctx, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "loss_fn.ratio_clip_min"));
    dsarl_recipe_free(r);
}
END_TEST

static Suite *grpo_config_suite(void)
{
    Suite *s = suite_create("grpo_config");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_shipped_recipes_validate);
    tcase_add_test(tc, test_declared_defaults_match_loader);
    tcase_add_test(tc, test_key_table);
    tcase_add_loop_test(tc, test_bad_values_refused_with_location, 0, (int)(sizeof bad_cases / sizeof bad_cases[0]));
    tcase_add_test(tc, test_file_location_in_message);
    tcase_add_test(tc, test_good_combinations_accepted);
    tcase_add_test(tc, test_plugin_run);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(grpo_config_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
