/* grpo_config.c: the GRPO config struct from a resolved recipe, and the checks that refuse a recipe GRPO cannot
 * run before any heavy work starts. Every refusal names the key and where its value came from (file:line,
 * command-line argument or plugin default) through dsarl_recipe_fail.
 *
 * Deviations from NeMo RL, on purpose:
 *   - grpo.adv_estimator.{normalize_rewards, use_leave_one_out_baseline} default to the grpo-level keys (NeMo's
 *     YAML writes that as ${grpo.normalize_rewards}); NeMo's advantage estimator reads only the adv_estimator
 *     copies, its dynamic-sampling std the grpo-level ones, so in dsarl one setting drives both.
 *   - A recipe that would silently do nothing or drop data is refused: a group of one with std normalisation or a
 *     leave-one-out baseline, a train_global_batch_size that does not divide the rollouts, a
 *     truncated_importance_sampling_ratio without a type (NeMo fails there only at the first loss call). */
#include "grpo.h"

#include <math.h>
#include <string.h>

void grpo_config_defaults(grpo_config *cfg)
{
    *cfg = (grpo_config){
        .num_prompts_per_step = 32,
        .num_generations_per_prompt = 16,
        .max_rollout_turns = 1,
        .max_num_epochs = 1,
        .max_num_steps = 1000000,
        .val_period = 10,
        .val_start_at = -1,
        .max_val_samples = 256,
        .val_batch_size = 256,
        .val_num_generations_per_prompt = 1,
        .stop_at_validation_threshold = NAN,
        .seed = 42,
        .dynamic_sampling_max_gen_batches = 10,
        .batch_multiplier = 1.0,
        .seq_logprob_error_threshold = NAN,
        .malformed_thinking_advantage = NAN,
        .invalid_tool_call_advantage = NAN,
        .advantage = {.minus_baseline = true, .normalize_rewards = true, .use_leave_one_out_baseline = true,
                      .advantage_clip_low = -INFINITY, .advantage_clip_high = INFINITY},
        .reward_scaling = {.source_min = 0.0, .source_max = 1.0, .target_min = 0.0, .target_max = 1.0},
        .reward_shaping = {.overlong_buffer_length = 128, .overlong_buffer_penalty = 1.0, .max_response_length = 512},
        .loss = {.ratio_clip_min = 0.2, .ratio_clip_max = 0.2, .reference_policy_kl_penalty = 0.01,
                 .kl_type = GRPO_KL_K3, .kl_input_clamp_value = 20.0, .kl_output_clamp_value = 10.0,
                 .truncation_ratio = INFINITY, .token_level_loss = true},
        .async = {.max_trajectory_age_steps = 1, .colocated = true, .refit_buffer_size_gb = 1.0},
        .train_global_batch_size = 512,
        .lr_schedule = {.struct_size = sizeof(dsarl_lr_schedule), .lr = 5.0e-6, .min_lr = 5.0e-7,
                        .warmup_init = 5.0e-7, .warmup_iters = 13, .decay_iters = 1000000,
                        .decay_style = DSARL_LR_CONSTANT, .max_grad_norm = 1.0},
    };
}

/* True when the key is present with a non-null value. */
static bool is_set(const dsarl_node *root, const char *path)
{
    const dsarl_node *node = dsarl_node_get(root, path);
    return node && dsarl_node_kind(node) != DSARL_NODE_NULL;
}

/* A nullable float: the value, or `unset` when absent or null. */
static int nullable_double(const dsarl_node *root, const char *path, double unset, double *out, dsarl_error *err)
{
    return dsarl_recipe_double_or(root, path, unset, out, err);
}

/* Maps a string key onto one of `n` spellings; fails naming the key and the valid spellings. */
static int parse_choice(const dsarl_node *root, const char *path, const char *def, const char *const *names, int n,
                        int *out, dsarl_error *err)
{
    const char *value;
    DSARL_TRY(dsarl_recipe_string_or(root, path, def, &value, err));
    for (int i = 0; i < n; i++)
        if (strcmp(value, names[i]) == 0) {
            *out = i;
            return DSARL_OK;
        }
    char valid[256] = "";
    for (int i = 0; i < n; i++) {
        strncat(valid, i ? (i == n - 1 ? " or " : ", ") : "", sizeof valid - strlen(valid) - 1);
        strncat(valid, names[i], sizeof valid - strlen(valid) - 1);
    }
    return dsarl_recipe_fail(root, path, err, DSARL_E_INVALID, "must be %s, got '%s'", valid, value);
}

/* grpo.adv_estimator.name: grpo, gdpo or reinforce_plus_plus; NeMo's opd (distillation) is not supported yet. */
static int parse_estimator(const dsarl_node *root, const char *const names[3], int *out, dsarl_error *err)
{
    const char *name;
    DSARL_TRY(dsarl_recipe_string_or(root, "grpo.adv_estimator.name", "grpo", &name, err));
    if (strcmp(name, "opd") == 0)
        return dsarl_recipe_fail(root, "grpo.adv_estimator.name", err, DSARL_E_UNSUPPORTED,
                                 "is 'opd' (on-policy distillation as a GRPO advantage), which is not supported "
                                 "yet; use grpo, gdpo or reinforce_plus_plus (algorithm.name: distillation trains on "
                                 "a teacher's top-k logits)");
    return parse_choice(root, "grpo.adv_estimator.name", "grpo", names, 3, out, err);
}

/* grpo.adv_estimator.reward_weights: null (equal weights) or a list of numbers, one per reward component. */
static int load_reward_weights(const dsarl_node *root, grpo_advantage_config *adv, dsarl_error *err)
{
    const char *path = "grpo.adv_estimator.reward_weights";
    adv->n_reward_weights = 0;
    if (!is_set(root, path))
        return DSARL_OK;
    const dsarl_node *list = dsarl_node_get(root, path);
    if (dsarl_node_kind(list) != DSARL_NODE_LIST)
        return dsarl_recipe_fail(root, path, err, DSARL_E_INVALID, "must be a list of numbers or null, got a %s",
                                 dsarl_node_type_name(dsarl_node_kind(list)));
    size_t n = dsarl_node_count(list);
    if (n < 1 || n > DSARL_ARRAY_LEN(adv->reward_weights))
        return dsarl_recipe_fail(root, path, err, DSARL_E_INVALID, "must hold 1 to %zu weights, got %zu",
                                 DSARL_ARRAY_LEN(adv->reward_weights), n);
    for (size_t i = 0; i < n; i++) {
        const dsarl_node *w = dsarl_node_child_at(list, i);
        dsarl_node_type k = dsarl_node_kind(w);
        double v = (k == DSARL_NODE_INT || k == DSARL_NODE_FLOAT) ? dsarl_node_as_double(w) : NAN;
        if (!isfinite(v))
            return dsarl_recipe_fail(root, path, err, DSARL_E_INVALID, "entry %zu must be a finite number", i);
        adv->reward_weights[i] = v;
    }
    adv->n_reward_weights = (int64_t)n;
    return DSARL_OK;
}

int grpo_config_load(const dsarl_node *root, grpo_config *cfg, dsarl_error *err)
{
    grpo_config_defaults(cfg);
    grpo_config d = *cfg;  // defaults to fall back on

    DSARL_TRY(dsarl_recipe_int_or(root, "grpo.num_prompts_per_step", d.num_prompts_per_step, &cfg->num_prompts_per_step,
                                  err));
    DSARL_TRY(dsarl_recipe_int_or(root, "grpo.num_generations_per_prompt", d.num_generations_per_prompt,
                                  &cfg->num_generations_per_prompt, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "grpo.max_rollout_turns", 1, &cfg->max_rollout_turns, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "grpo.max_num_epochs", d.max_num_epochs, &cfg->max_num_epochs, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "grpo.max_num_steps", d.max_num_steps, &cfg->max_num_steps, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "grpo.val_period", d.val_period, &cfg->val_period, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "grpo.val_start_at", d.val_start_at, &cfg->val_start_at, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "grpo.val_at_start", false, &cfg->val_at_start, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "grpo.val_at_end", false, &cfg->val_at_end, err));
    // max_val_samples and val_batch_size are nullable: null means "all", kept as -1.
    cfg->max_val_samples = dsarl_node_get(root, "grpo.max_val_samples") ? -1 : d.max_val_samples;
    DSARL_TRY(dsarl_recipe_int_or(root, "grpo.max_val_samples", cfg->max_val_samples, &cfg->max_val_samples, err));
    cfg->val_batch_size = dsarl_node_get(root, "grpo.val_batch_size") ? -1 : d.val_batch_size;
    DSARL_TRY(dsarl_recipe_int_or(root, "grpo.val_batch_size", cfg->val_batch_size, &cfg->val_batch_size, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "grpo.val_num_generations_per_prompt", d.val_num_generations_per_prompt,
                                  &cfg->val_num_generations_per_prompt, err));
    DSARL_TRY(dsarl_recipe_string_or(root, "grpo.stop_at_validation_metric", NULL, &cfg->stop_at_validation_metric,
                                     err));
    DSARL_TRY(nullable_double(root, "grpo.stop_at_validation_threshold", NAN, &cfg->stop_at_validation_threshold, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "grpo.seed", d.seed, &cfg->seed, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "grpo.overlong_filtering", false, &cfg->overlong_filtering, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "grpo.use_dynamic_sampling", false, &cfg->use_dynamic_sampling, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "grpo.dynamic_sampling_max_gen_batches", d.dynamic_sampling_max_gen_batches,
                                  &cfg->dynamic_sampling_max_gen_batches, err));
    DSARL_TRY(dsarl_recipe_double_or(root, "grpo.batch_multiplier", d.batch_multiplier, &cfg->batch_multiplier, err));

    // Advantages: the adv_estimator copies win when set, else the grpo-level keys.
    grpo_advantage_config *adv = &cfg->advantage;
    DSARL_TRY(dsarl_recipe_bool_or(root, "grpo.normalize_rewards", true, &adv->normalize_rewards, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "grpo.use_leave_one_out_baseline", true, &adv->use_leave_one_out_baseline,
                                   err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "grpo.adv_estimator.normalize_rewards", adv->normalize_rewards,
                                   &adv->normalize_rewards, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "grpo.adv_estimator.use_leave_one_out_baseline",
                                   adv->use_leave_one_out_baseline, &adv->use_leave_one_out_baseline, err));
    static const char *const estimators[] = {"grpo", "gdpo", "reinforce_plus_plus"};
    int estimator = 0;
    DSARL_TRY(parse_estimator(root, estimators, &estimator, err));
    adv->estimator = (grpo_estimator)estimator;
    DSARL_TRY(dsarl_recipe_bool_or(root, "grpo.adv_estimator.minus_baseline", true, &adv->minus_baseline, err));
    DSARL_TRY(load_reward_weights(root, adv, err));
    DSARL_TRY(nullable_double(root, "grpo.seq_logprob_error_threshold", NAN, &cfg->seq_logprob_error_threshold, err));
    DSARL_TRY(nullable_double(root, "grpo.malformed_thinking_advantage", NAN, &cfg->malformed_thinking_advantage,
                              err));
    DSARL_TRY(nullable_double(root, "grpo.invalid_tool_call_advantage", NAN, &cfg->invalid_tool_call_advantage, err));
    DSARL_TRY(nullable_double(root, "grpo.advantage_clip_low", -INFINITY, &adv->advantage_clip_low, err));
    DSARL_TRY(nullable_double(root, "grpo.advantage_clip_high", INFINITY, &adv->advantage_clip_high, err));

    grpo_reward_scaling *sc = &cfg->reward_scaling;
    DSARL_TRY(dsarl_recipe_bool_or(root, "grpo.reward_scaling.enabled", false, &sc->enabled, err));
    DSARL_TRY(dsarl_recipe_double_or(root, "grpo.reward_scaling.source_min", 0.0, &sc->source_min, err));
    DSARL_TRY(dsarl_recipe_double_or(root, "grpo.reward_scaling.source_max", 1.0, &sc->source_max, err));
    DSARL_TRY(dsarl_recipe_double_or(root, "grpo.reward_scaling.target_min", 0.0, &sc->target_min, err));
    DSARL_TRY(dsarl_recipe_double_or(root, "grpo.reward_scaling.target_max", 1.0, &sc->target_max, err));

    grpo_reward_shaping *sh = &cfg->reward_shaping;
    int64_t max_total_len;
    DSARL_TRY(dsarl_recipe_int_or(root, "policy.max_total_sequence_length", 512, &max_total_len, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "grpo.reward_shaping.enabled", false, &sh->enabled, err));
    // Shaping keys may be null (NeMo's class defaults); -1 / NaN mark "unset" for the validator.
    sh->overlong_buffer_length = dsarl_node_get(root, "grpo.reward_shaping.overlong_buffer_length") ? -1 : 128;
    DSARL_TRY(dsarl_recipe_int_or(root, "grpo.reward_shaping.overlong_buffer_length", sh->overlong_buffer_length,
                                  &sh->overlong_buffer_length, err));
    sh->overlong_buffer_penalty = dsarl_node_get(root, "grpo.reward_shaping.overlong_buffer_penalty") ? NAN : 1.0;
    DSARL_TRY(nullable_double(root, "grpo.reward_shaping.overlong_buffer_penalty", sh->overlong_buffer_penalty,
                              &sh->overlong_buffer_penalty, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "grpo.reward_shaping.max_response_length", max_total_len,
                                  &sh->max_response_length, err));
    sh->has_stop_properly_penalty_coef = is_set(root, "grpo.reward_shaping.stop_properly_penalty_coef");
    DSARL_TRY(nullable_double(root, "grpo.reward_shaping.stop_properly_penalty_coef", 1.0,
                              &sh->stop_properly_penalty_coef, err));

    // loss_fn
    grpo_loss_config *loss = &cfg->loss;
    DSARL_TRY(dsarl_recipe_double_or(root, "loss_fn.reference_policy_kl_penalty", d.loss.reference_policy_kl_penalty,
                                     &loss->reference_policy_kl_penalty, err));
    static const char *const kl_names[] = {"k1", "k2", "k3"};
    int kl;
    DSARL_TRY(parse_choice(root, "loss_fn.reference_policy_kl_type", "k3", kl_names, 3, &kl, err));
    loss->kl_type = (grpo_kl_type)(GRPO_KL_K1 + kl);
    DSARL_TRY(nullable_double(root, "loss_fn.kl_input_clamp_value", INFINITY, &loss->kl_input_clamp_value, err));
    if (!dsarl_node_get(root, "loss_fn.kl_input_clamp_value"))
        loss->kl_input_clamp_value = d.loss.kl_input_clamp_value;  // absent: NeMo's 20, null: no clamp
    DSARL_TRY(nullable_double(root, "loss_fn.kl_output_clamp_value", INFINITY, &loss->kl_output_clamp_value, err));
    if (!dsarl_node_get(root, "loss_fn.kl_output_clamp_value"))
        loss->kl_output_clamp_value = d.loss.kl_output_clamp_value;
    DSARL_TRY(dsarl_recipe_double_or(root, "loss_fn.ratio_clip_min", 0.2, &loss->ratio_clip_min, err));
    DSARL_TRY(dsarl_recipe_double_or(root, "loss_fn.ratio_clip_max", 0.2, &loss->ratio_clip_max, err));
    DSARL_TRY(nullable_double(root, "loss_fn.ratio_clip_c", 0.0, &loss->ratio_clip_c, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "loss_fn.use_on_policy_kl_approximation", false,
                                   &loss->use_on_policy_kl_approximation, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "loss_fn.use_importance_sampling_correction", false,
                                   &loss->use_importance_sampling_correction, err));
    loss->truncation = GRPO_TRUNCATION_NONE;
    if (is_set(root, "loss_fn.truncated_importance_sampling_type")) {
        static const char *const tis_names[] = {"tis", "icepop", "seq-mask-tis"};
        int tis;
        DSARL_TRY(parse_choice(root, "loss_fn.truncated_importance_sampling_type", NULL, tis_names, 3, &tis, err));
        loss->truncation = (grpo_truncation)(GRPO_TRUNCATION_TIS + tis);
    }
    DSARL_TRY(nullable_double(root, "loss_fn.truncated_importance_sampling_ratio", INFINITY, &loss->truncation_ratio,
                              err));
    // ratio_min: null is 0 for tis; icepop and seq-mask-tis must set it (the validator checks).
    DSARL_TRY(nullable_double(root, "loss_fn.truncated_importance_sampling_ratio_min", 0.0,
                              &loss->truncation_ratio_min, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "loss_fn.token_level_loss", true, &loss->token_level_loss, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "loss_fn.force_on_policy_ratio", false, &loss->force_on_policy_ratio, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "loss_fn.sequence_level_importance_ratios", false,
                                   &loss->sequence_level_importance_ratios, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "loss_fn.use_cispo", false, &loss->use_cispo, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "loss_fn.disable_ppo_ratio", false, &loss->disable_ppo_ratio, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "loss_fn.use_kl_in_reward", false, &loss->use_kl_in_reward, err));
    DSARL_TRY(dsarl_recipe_double_or(root, "loss_fn.positive_example_nll_weight", 0.0,
                                     &loss->positive_example_nll_weight, err));

    // async GRPO and the generation placement (validated in validate_async)
    grpo_async_config *as = &cfg->async;
    DSARL_TRY(dsarl_recipe_bool_or(root, "grpo.async_grpo.enabled", false, &as->enabled, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "grpo.async_grpo.max_trajectory_age_steps", d.async.max_trajectory_age_steps,
                                  &as->max_trajectory_age_steps, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "policy.generation.colocated.enabled", true, &as->colocated, err));
    DSARL_TRY(nullable_double(root, "policy.refit_buffer_size_gb", d.async.refit_buffer_size_gb,
                              &as->refit_buffer_size_gb, err));

    bool skip_ref;
    DSARL_TRY(dsarl_recipe_bool_or(root, "grpo.skip_reference_policy_logprobs_calculation", false, &skip_ref, err));
    // NeMo forces the skip when beta == 0: the reference model is not even built.
    cfg->skip_reference_policy_logprobs = skip_ref || loss->reference_policy_kl_penalty == 0.0;

    // policy: batch, then gradient clipping and the learning-rate schedule (shared with SFT: dsarl/optimizer.h).
    DSARL_TRY(dsarl_recipe_int_or(root, "policy.train_global_batch_size", d.train_global_batch_size,
                                  &cfg->train_global_batch_size, err));
    return dsarl_lr_schedule_from_recipe(root, &d.lr_schedule, cfg->max_num_steps, &cfg->lr_schedule, err);
}

/* Shorthands for the refusals below: an invalid value, or a NeMo RL feature dsarl does not implement yet. */
#define REFUSE(path, ...) return dsarl_recipe_fail(root, path, err, DSARL_E_INVALID, __VA_ARGS__)
#define NOT_YET(path, ...) return dsarl_recipe_fail(root, path, err, DSARL_E_UNSUPPORTED, __VA_ARGS__)

/* grpo.async_grpo and the generation placement: the combinations NeMo RL refuses, and the knobs that have no
 * meaning for an engine whose weights change only between two generate() calls. */
static int validate_async(const dsarl_node *root, const grpo_config *cfg, dsarl_error *err)
{
    const grpo_async_config *a = &cfg->async;
    if (!(a->refit_buffer_size_gb > 0.0) || !isfinite(a->refit_buffer_size_gb) || a->refit_buffer_size_gb > 1024.0)
        REFUSE("policy.refit_buffer_size_gb", "must be in (0, 1024] GiB (the bucket weights travel to generation in), "
               "or null for 1, got %g", a->refit_buffer_size_gb);
    bool in_flight, recompute;
    int64_t failures;
    DSARL_TRY(dsarl_recipe_bool_or(root, "grpo.async_grpo.in_flight_weight_updates", false, &in_flight, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, "grpo.async_grpo.recompute_kv_cache_after_weight_updates", false, &recompute,
                                   err));
    DSARL_TRY(dsarl_recipe_int_or(root, "grpo.async_grpo.max_generation_failures", 0, &failures, err));
    if (!a->enabled)
        return DSARL_OK;
    if (a->colocated)
        REFUSE("grpo.async_grpo.enabled", "is true but policy.generation.colocated.enabled is true: asynchronous GRPO "
               "generates with its own copy of the weights while the policy trains, so set "
               "policy.generation.colocated.enabled: false (NeMo RL refuses the same)");
    if (!cfg->loss.use_importance_sampling_correction)
        REFUSE("grpo.async_grpo.enabled", "is true but loss_fn.use_importance_sampling_correction is false: "
               "trajectories of older weights need the importance-sampling correction; set it true (NeMo RL "
               "requires it)");
    if (a->max_trajectory_age_steps < 0 || a->max_trajectory_age_steps > 64)
        REFUSE("grpo.async_grpo.max_trajectory_age_steps", "must be in [0, 64] optimizer steps, got %lld",
               (long long)a->max_trajectory_age_steps);
    if (cfg->use_dynamic_sampling)
        REFUSE("grpo.use_dynamic_sampling", "is true with grpo.async_grpo.enabled: the queue holds one generated batch "
               "per training step, and dynamic sampling's extra rounds would mix weight versions within it; turn "
               "one of them off");
    if (in_flight)
        REFUSE("grpo.async_grpo.in_flight_weight_updates", "is true, but the native engine generates a whole batch "
               "per call and takes new weights only between calls, so there is no in-flight update; use false");
    if (recompute)
        REFUSE("grpo.async_grpo.recompute_kv_cache_after_weight_updates", "is true, but weights never change under "
               "a live KV cache here (no in-flight weight updates: every batch is prefilled with the weights it "
               "decodes with); use false");
    if (failures != 0)
        REFUSE("grpo.async_grpo.max_generation_failures", "is %lld, but generation runs in the job's own ranks and "
               "a failure there ends the run; use 0", (long long)failures);
    return DSARL_OK;
}

static int validate_loop(const dsarl_node *root, const grpo_config *cfg, dsarl_error *err)
{
    if (cfg->num_prompts_per_step < 1)
        REFUSE("grpo.num_prompts_per_step", "must be >= 1, got %lld", (long long)cfg->num_prompts_per_step);
    if (cfg->num_generations_per_prompt < 1)
        REFUSE("grpo.num_generations_per_prompt", "must be >= 1, got %lld", (long long)cfg->num_generations_per_prompt);
    if (cfg->num_generations_per_prompt == 1 && cfg->advantage.normalize_rewards)
        REFUSE("grpo.num_generations_per_prompt",
               "is 1 but grpo.normalize_rewards is true: the std of a group of one response is undefined; use >= 2 "
               "generations per prompt or normalize_rewards: false");
    if (cfg->num_generations_per_prompt == 1 && cfg->advantage.use_leave_one_out_baseline)
        REFUSE("grpo.num_generations_per_prompt",
               "is 1 but grpo.use_leave_one_out_baseline is true: a leave-one-out baseline needs >= 2 generations per "
               "prompt");
    if (cfg->max_num_epochs < 1)
        REFUSE("grpo.max_num_epochs", "must be >= 1, got %lld", (long long)cfg->max_num_epochs);
    if (cfg->max_num_steps < 1)
        REFUSE("grpo.max_num_steps", "must be >= 1, got %lld", (long long)cfg->max_num_steps);
    if (cfg->val_period < 0)
        REFUSE("grpo.val_period", "must be >= 0 (0 = no periodic validation), got %lld", (long long)cfg->val_period);
    if (cfg->val_start_at < -1)
        REFUSE("grpo.val_start_at", "must be >= -1 (-1 = no delay), got %lld", (long long)cfg->val_start_at);
    if (is_set(root, "grpo.max_val_samples") && cfg->max_val_samples < 1)
        REFUSE("grpo.max_val_samples", "must be >= 1 or null (all), got %lld", (long long)cfg->max_val_samples);
    if (is_set(root, "grpo.val_batch_size") && cfg->val_batch_size < 1)
        REFUSE("grpo.val_batch_size", "must be >= 1 or null, got %lld", (long long)cfg->val_batch_size);
    if (cfg->val_num_generations_per_prompt < 1)
        REFUSE("grpo.val_num_generations_per_prompt", "must be >= 1, got %lld",
               (long long)cfg->val_num_generations_per_prompt);
    if (cfg->stop_at_validation_metric) {
        const char *metric = cfg->stop_at_validation_metric;
        if (strcmp(metric, "accuracy") && strcmp(metric, "pass_k") && strcmp(metric, "avg_length"))
            REFUSE("grpo.stop_at_validation_metric", "must be accuracy, pass_k or avg_length (or null), got '%s'",
                   metric);
        if (!isfinite(cfg->stop_at_validation_threshold))
            REFUSE("grpo.stop_at_validation_metric",
                   "is set but grpo.stop_at_validation_threshold is not a finite number; set both or neither");
    }
    if (cfg->use_dynamic_sampling && cfg->dynamic_sampling_max_gen_batches < 1)
        REFUSE("grpo.dynamic_sampling_max_gen_batches", "must be > 0 with grpo.use_dynamic_sampling, got %lld",
               (long long)cfg->dynamic_sampling_max_gen_batches);
    double prompts_per_round = (double)cfg->num_prompts_per_step * cfg->batch_multiplier;
    if (!(cfg->batch_multiplier > 0.0) || prompts_per_round != floor(prompts_per_round) || prompts_per_round < 1.0)
        REFUSE("grpo.batch_multiplier",
               "must be > 0 and make num_prompts_per_step * batch_multiplier a whole number of prompts, got %g", 
               cfg->batch_multiplier);
    if (cfg->advantage.advantage_clip_low > cfg->advantage.advantage_clip_high)
        REFUSE("grpo.advantage_clip_low", "(%g) must be <= grpo.advantage_clip_high (%g)",
               cfg->advantage.advantage_clip_low, cfg->advantage.advantage_clip_high);
    if (isnan(cfg->advantage.advantage_clip_low) || isnan(cfg->advantage.advantage_clip_high))
        REFUSE(isnan(cfg->advantage.advantage_clip_low) ? "grpo.advantage_clip_low" : "grpo.advantage_clip_high",
               "must be a number or null, got nan");
    bool skip_ref;
    DSARL_TRY(dsarl_recipe_bool_or(root, "grpo.skip_reference_policy_logprobs_calculation", false, &skip_ref, err));
    if (skip_ref && cfg->loss.reference_policy_kl_penalty != 0.0)
        REFUSE("grpo.skip_reference_policy_logprobs_calculation",
               "is true but loss_fn.reference_policy_kl_penalty is %g: the KL term needs the reference log-probs; "
               "set the penalty to 0 or this key to false",
               cfg->loss.reference_policy_kl_penalty);
    return DSARL_OK;
}

static int validate_rewards(const dsarl_node *root, const grpo_config *cfg, dsarl_error *err)
{
    const grpo_reward_scaling *sc = &cfg->reward_scaling;
    if (sc->enabled && !(sc->source_max > sc->source_min))
        REFUSE("grpo.reward_scaling.source_max", "(%g) must be > grpo.reward_scaling.source_min (%g)", sc->source_max,
               sc->source_min);
    const grpo_reward_shaping *sh = &cfg->reward_shaping;
    if (!sh->enabled)
        return DSARL_OK;
    if (sh->has_stop_properly_penalty_coef) {
        if (!(sh->stop_properly_penalty_coef >= 0.0 && sh->stop_properly_penalty_coef <= 1.0))
            REFUSE("grpo.reward_shaping.stop_properly_penalty_coef", "must be in [0, 1], got %g",
                   sh->stop_properly_penalty_coef);
        return DSARL_OK;
    }
    if (sh->overlong_buffer_length < 1)
        REFUSE("grpo.reward_shaping.overlong_buffer_length",
               "must be >= 1 for DAPO overlong shaping (or set stop_properly_penalty_coef), got %lld",
               (long long)sh->overlong_buffer_length);
    if (!(sh->overlong_buffer_penalty >= 0.0))
        REFUSE("grpo.reward_shaping.overlong_buffer_penalty", "must be a number >= 0, got %g",
               sh->overlong_buffer_penalty);
    if (sh->max_response_length <= sh->overlong_buffer_length)
        REFUSE("grpo.reward_shaping.max_response_length",
               "(%lld) must exceed grpo.reward_shaping.overlong_buffer_length (%lld), or every response is penalised",
               (long long)sh->max_response_length, (long long)sh->overlong_buffer_length);
    return DSARL_OK;
}

static int validate_loss(const dsarl_node *root, const grpo_config *cfg, dsarl_error *err)
{
    const grpo_loss_config *l = &cfg->loss;
    if (!(l->reference_policy_kl_penalty >= 0.0) || !isfinite(l->reference_policy_kl_penalty))
        REFUSE("loss_fn.reference_policy_kl_penalty", "must be a finite number >= 0 (0 = no KL term), got %g",
               l->reference_policy_kl_penalty);
    if (!(l->kl_input_clamp_value > 0.0))
        REFUSE("loss_fn.kl_input_clamp_value", "must be > 0 or null (no clamp), got %g", l->kl_input_clamp_value);
    if (!(l->kl_output_clamp_value > 0.0))
        REFUSE("loss_fn.kl_output_clamp_value", "must be > 0 or null (no clamp), got %g", l->kl_output_clamp_value);
    if (!(l->ratio_clip_min >= 0.0 && l->ratio_clip_min <= 1.0))
        REFUSE("loss_fn.ratio_clip_min", "must be in [0, 1] (the ratio is clamped at 1 - ratio_clip_min), got %g",
               l->ratio_clip_min);
    if (!(l->ratio_clip_max >= 0.0) || !isfinite(l->ratio_clip_max))
        REFUSE("loss_fn.ratio_clip_max", "must be a finite number >= 0, got %g", l->ratio_clip_max);
    if (is_set(root, "loss_fn.ratio_clip_c") && !(l->ratio_clip_c > 1.0))
        REFUSE("loss_fn.ratio_clip_c", "must be > 1 (a bound on the ratio for negative advantages) or null, got %g",
               l->ratio_clip_c);

    const char *type_key = "loss_fn.truncated_importance_sampling_type";
    const char *ratio_key = "loss_fn.truncated_importance_sampling_ratio";
    const char *min_key = "loss_fn.truncated_importance_sampling_ratio_min";
    if (l->truncation != GRPO_TRUNCATION_NONE) {
        if (!l->use_importance_sampling_correction)
            REFUSE(type_key, "is set but loss_fn.use_importance_sampling_correction is false; truncation applies to "
                             "the importance-sampling weight, so enable the correction or set the type to null");
        if (!is_set(root, ratio_key) || !(l->truncation_ratio > 0.0) || !isfinite(l->truncation_ratio))
            REFUSE(ratio_key, "must be a finite number > 0 when %s is set", type_key);
        if (l->truncation != GRPO_TRUNCATION_TIS && !is_set(root, min_key))
            REFUSE(min_key, "must be set for truncated_importance_sampling_type icepop and seq-mask-tis");
        if (!(l->truncation_ratio_min >= 0.0))
            REFUSE(min_key, "must be >= 0, got %g", l->truncation_ratio_min);
        if (l->truncation_ratio_min > l->truncation_ratio)
            REFUSE(min_key, "(%g) must be <= %s (%g)", l->truncation_ratio_min, ratio_key, l->truncation_ratio);
    } else if (is_set(root, ratio_key)) {
        REFUSE(ratio_key, "is set but %s is null; set the type (tis, icepop or seq-mask-tis) or the ratio to null",
               type_key);
    }
    if (l->force_on_policy_ratio &&
        cfg->train_global_batch_size != cfg->num_prompts_per_step * cfg->num_generations_per_prompt)
        REFUSE("loss_fn.force_on_policy_ratio",
               "needs exactly one optimizer step per rollout batch: policy.train_global_batch_size (%lld) must equal "
               "grpo.num_prompts_per_step * grpo.num_generations_per_prompt (%lld)",
               (long long)cfg->train_global_batch_size,
               (long long)(cfg->num_prompts_per_step * cfg->num_generations_per_prompt));
    return DSARL_OK;
}

/* NeMo RL's loss variants and estimators, and the combinations its ClippedPGLossFn and setup refuse. */
static int validate_variants(const dsarl_node *root, const grpo_config *cfg, dsarl_error *err)
{
    const grpo_loss_config *l = &cfg->loss;
    const grpo_advantage_config *a = &cfg->advantage;
    if (l->sequence_level_importance_ratios && l->token_level_loss)
        REFUSE("loss_fn.sequence_level_importance_ratios",
               "is true (GSPO) but loss_fn.token_level_loss is true; sequence-level ratios need the sequence-level "
               "loss: set token_level_loss: false");
    if (l->sequence_level_importance_ratios && l->truncation == GRPO_TRUNCATION_SEQ_MASK)
        REFUSE("loss_fn.sequence_level_importance_ratios",
               "is true but loss_fn.truncated_importance_sampling_type is seq-mask-tis, which masks token-level "
               "weights; use tis or icepop with GSPO");
    if (l->use_cispo) {
        static const char *const why = "CISPO weights each token by its own clamped ratio";
        if (l->disable_ppo_ratio)
            REFUSE("loss_fn.use_cispo", "is true but loss_fn.disable_ppo_ratio removes the ratio %s needs", why);
        if (l->force_on_policy_ratio)
            REFUSE("loss_fn.use_cispo", "is true but loss_fn.force_on_policy_ratio forces the ratio to 1 (%s)", why);
        if (l->sequence_level_importance_ratios)
            REFUSE("loss_fn.use_cispo", "is true but loss_fn.sequence_level_importance_ratios is true (%s)", why);
        if (l->ratio_clip_c > 0.0)
            REFUSE("loss_fn.use_cispo", "is true but loss_fn.ratio_clip_c is set; dual clipping would overwrite the "
                                        "CISPO term: set ratio_clip_c: null");
        if (!l->token_level_loss)
            REFUSE("loss_fn.use_cispo", "is true but loss_fn.token_level_loss is false; CISPO needs the token-level "
                                        "loss");
    }
    if (!(l->positive_example_nll_weight >= 0.0) || !isfinite(l->positive_example_nll_weight))
        REFUSE("loss_fn.positive_example_nll_weight", "must be a finite number >= 0 (0 = off), got %g",
               l->positive_example_nll_weight);
    if (l->use_kl_in_reward && a->estimator != GRPO_ESTIMATOR_REINFORCE_PP)
        REFUSE("loss_fn.use_kl_in_reward",
               "is true but grpo.adv_estimator.name is not reinforce_plus_plus; only Reinforce++ puts the KL in the "
               "reward (the loss would silently lose its KL term)");
    if (l->use_kl_in_reward && l->reference_policy_kl_penalty == 0.0)
        REFUSE("loss_fn.use_kl_in_reward",
               "is true but loss_fn.reference_policy_kl_penalty is 0, so there is no KL to put in the reward; set "
               "the penalty > 0 or use_kl_in_reward: false");
    if (l->use_kl_in_reward && l->force_on_policy_ratio && isnan(cfg->seq_logprob_error_threshold))
        REFUSE("loss_fn.use_kl_in_reward",
               "is true but loss_fn.force_on_policy_ratio skips the old log-probs the KL in the reward is computed "
               "from; set force_on_policy_ratio: false");
    if (a->n_reward_weights > 0 && a->estimator != GRPO_ESTIMATOR_GDPO)
        REFUSE("grpo.adv_estimator.reward_weights", "is set but only gdpo reads it; set it to null or "
                                                    "grpo.adv_estimator.name: gdpo");
    if (cfg->max_rollout_turns < 1 || cfg->max_rollout_turns > 64)
        REFUSE("grpo.max_rollout_turns", "must be in [1, 64], got %lld", (long long)cfg->max_rollout_turns);
    if (cfg->max_rollout_turns > 1 && a->estimator == GRPO_ESTIMATOR_GDPO)
        REFUSE("grpo.max_rollout_turns", "is %lld but gdpo reads a reward vector that multi-turn episodes do not "
                                         "report; use 1 turn or the grpo estimator", (long long)cfg->max_rollout_turns);
    const double thr = cfg->seq_logprob_error_threshold;
    if (is_set(root, "grpo.seq_logprob_error_threshold") && !(thr >= 1.0 && isfinite(thr)))
        REFUSE("grpo.seq_logprob_error_threshold",
               "must be a finite number >= 1 (a sequence's mean exp(|lp_gen - lp_old|) is never below 1, so a smaller "
               "threshold drops every sequence), or null; got %g", thr);
    if (is_set(root, "grpo.malformed_thinking_advantage") && !isfinite(cfg->malformed_thinking_advantage))
        REFUSE("grpo.malformed_thinking_advantage", "must be a finite number or null");
    if (is_set(root, "grpo.invalid_tool_call_advantage") && !isfinite(cfg->invalid_tool_call_advantage))
        REFUSE("grpo.invalid_tool_call_advantage", "must be a finite number or null");
    return DSARL_OK;
}

static int validate_optimizer(const dsarl_node *root, const grpo_config *cfg, dsarl_error *err)
{
    int64_t rollouts = cfg->num_prompts_per_step * cfg->num_generations_per_prompt;
    if (cfg->train_global_batch_size < 1 || cfg->train_global_batch_size > rollouts ||
        rollouts % cfg->train_global_batch_size != 0)
        REFUSE("policy.train_global_batch_size",
               "(%lld) must divide the %lld rollouts of a step (grpo.num_prompts_per_step * "
               "grpo.num_generations_per_prompt), or samples would be dropped or no optimizer step would run",
               (long long)cfg->train_global_batch_size, (long long)rollouts);
    return dsarl_lr_schedule_validate(root, &cfg->lr_schedule, "grpo.max_num_steps", err);
}

int grpo_config_validate(const dsarl_node *root, const grpo_config *cfg, dsarl_error *err)
{
    DSARL_TRY(validate_async(root, cfg, err));
    DSARL_TRY(validate_loop(root, cfg, err));
    DSARL_TRY(validate_rewards(root, cfg, err));
    DSARL_TRY(validate_loss(root, cfg, err));
    DSARL_TRY(validate_variants(root, cfg, err));
    DSARL_TRY(validate_optimizer(root, cfg, err));
    return DSARL_OK;
}

int grpo_config_from_recipe(const dsarl_node *root, grpo_config *cfg, dsarl_error *err)
{
    DSARL_TRY(grpo_config_load(root, cfg, err));
    return grpo_config_validate(root, cfg, err);
}
