/* grpo_keys.c: the recipe keys of algorithm/grpo, with NeMo RL's defaults (examples/configs/grpo_math_1B.yaml and
 * the GRPOConfig / ClippedPGLossConfig classes), so NeMo RL recipes read the same.
 *
 * `grpo` and `loss_fn` are owned: a misspelt key below them fails with "did you mean". Keys of NeMo RL features
 * dsarl does not implement fall in two groups:
 *   - keys whose value changes the algorithm (adv_estimator.name opd) are declared normally and grpo_config_validate refuses any value but the default with
 *     "not supported yet", so a recipe never silently trains something else than it says;
 *   - keys that only tune those features or NeMo's machinery (calculate_advantages_on_gpu,
 *     deduplicate_multimodal_data, debug_payload_metrics) are DSARL_KEY_IGNORED: accepted, reported as unused.
 * The policy.* keys are the ones the batch checks read, then the learning-rate schedule and gradient-clip keys
 * shared with SFT (dsarl_lr_schedule_keys, with grpo_config_defaults' values: NeMo RL's grpo_math base warms up
 * over 13 steps from 5e-7); the model plugin may declare them too. */
#include <pthread.h>
#include <string.h>
#include "grpo.h"

#define N DSARL_KEY_NULLABLE
#define IGN DSARL_KEY_IGNORED

static const dsarl_key_spec grpo_math_keys[] = {
    {"algorithm.name", DSARL_KEY_STRING, "grpo", "algorithm plugin that runs the job", 0},

    {"grpo", DSARL_KEY_MAP, NULL, "GRPO loop, advantage and DAPO settings (NeMo RL's grpo section)", DSARL_KEY_OWNED},
    {"grpo.num_prompts_per_step", DSARL_KEY_INT, "32", "prompts per training step", 0},
    {"grpo.num_generations_per_prompt", DSARL_KEY_INT, "16", "responses per prompt (the group size)", 0},
    {"grpo.max_rollout_turns", DSARL_KEY_INT, "1",
     "policy turns per episode; > 1 needs a multi-turn environment (calculator), observations are masked", 0},
    {"grpo.max_num_epochs", DSARL_KEY_INT, "1", "passes over the training data", 0},
    {"grpo.max_num_steps", DSARL_KEY_INT, "1000000", "training steps (the run stops at whichever limit comes first)", 0},
    {"grpo.normalize_rewards", DSARL_KEY_BOOL, "true", "divide advantages by the group std (+1e-6) where it is > 0", 0},
    {"grpo.use_leave_one_out_baseline", DSARL_KEY_BOOL, "true", "baseline = mean of the other responses (RLOO)", 0},
    {"grpo.val_period", DSARL_KEY_INT, "10", "validate every N steps; 0 = never", 0},
    {"grpo.val_start_at", DSARL_KEY_INT, "-1", "first step eligible for periodic validation; -1 = no delay", 0},
    {"grpo.val_at_start", DSARL_KEY_BOOL, "false", "validate before the first step", 0},
    {"grpo.val_at_end", DSARL_KEY_BOOL, "false", "validate after the last step", 0},
    {"grpo.overlong_filtering", DSARL_KEY_BOOL, "false", "truncated responses get loss multiplier 0 (DAPO)", 0},
    {"grpo.advantage_clip_low", DSARL_KEY_FLOAT, "null", "clamp advantages from below after normalisation", N},
    {"grpo.advantage_clip_high", DSARL_KEY_FLOAT, "null", "clamp advantages from above after normalisation", N},
    {"grpo.max_val_samples", DSARL_KEY_INT, "256", "validation prompts; null = the whole validation set", N},
    {"grpo.val_num_generations_per_prompt", DSARL_KEY_INT, "1", "validation responses per prompt (k of pass@k)", 0},
    {"grpo.stop_at_validation_metric", DSARL_KEY_STRING, "null", "early stop metric: accuracy | pass_k | avg_length", N},
    {"grpo.stop_at_validation_threshold", DSARL_KEY_FLOAT, "null", "early stop once the metric reaches this", N},
    {"grpo.val_batch_size", DSARL_KEY_INT, "256", "validation prompts per generation batch", N},
    {"grpo.seed", DSARL_KEY_INT, "42", "seed of data order, sampling and initialisation", 0},
    {"grpo.use_dynamic_sampling", DSARL_KEY_BOOL, "false", "keep only prompt groups whose rewards differ (DAPO)", 0},
    {"grpo.dynamic_sampling_max_gen_batches", DSARL_KEY_INT, "10", "generation rounds before dynamic sampling fails", 0},
    {"grpo.batch_multiplier", DSARL_KEY_FLOAT, "1", "prompts per generation round = num_prompts_per_step * this", 0},
    {"grpo.skip_reference_policy_logprobs_calculation", DSARL_KEY_BOOL, "false",
     "skip the reference forward (needs loss_fn.reference_policy_kl_penalty = 0; implied by it)", 0},
    {"grpo.calculate_advantages_on_gpu", DSARL_KEY_BOOL, "false", "NeMo RL only: dsarl computes them on the host", IGN},

    {"grpo.reward_shaping", DSARL_KEY_MAP, NULL, "DAPO overlong reward shaping", 0},
    {"grpo.reward_shaping.enabled", DSARL_KEY_BOOL, "false", "apply the shaping", 0},
    {"grpo.reward_shaping.overlong_buffer_length", DSARL_KEY_INT, "128", "tokens over which the penalty ramps up", N},
    {"grpo.reward_shaping.overlong_buffer_penalty", DSARL_KEY_FLOAT, "1", "penalty at the end of the buffer", N},
    {"grpo.reward_shaping.max_response_length", DSARL_KEY_INT, "null",
     "length where the penalty is full; null = policy.max_total_sequence_length", N},
    {"grpo.reward_shaping.stop_properly_penalty_coef", DSARL_KEY_FLOAT, "null",
     "in [0, 1]: multiply truncated responses' reward by this instead of the overlong penalty", N},

    {"grpo.reward_scaling", DSARL_KEY_MAP, NULL, "linear map of rewards before the advantages", 0},
    {"grpo.reward_scaling.enabled", DSARL_KEY_BOOL, "false", "apply the scaling", 0},
    {"grpo.reward_scaling.source_min", DSARL_KEY_FLOAT, "0.0", "rewards are clamped to [source_min, source_max]", 0},
    {"grpo.reward_scaling.source_max", DSARL_KEY_FLOAT, "1.0", "upper end of the source range", 0},
    {"grpo.reward_scaling.target_min", DSARL_KEY_FLOAT, "0.0", "source_min maps to this", 0},
    {"grpo.reward_scaling.target_max", DSARL_KEY_FLOAT, "1.0", "source_max maps to this", 0},

    {"grpo.adv_estimator", DSARL_KEY_MAP, NULL, "advantage estimator (NeMo RL's adv_estimator)", 0},
    {"grpo.adv_estimator.name", DSARL_KEY_STRING, "grpo",
     "grpo (group baseline) | gdpo (per reward component, weighted, batch z-score) | reinforce_plus_plus (group mean, "
     "batch z-score over tokens); opd is not supported yet", 0},
    {"grpo.adv_estimator.normalize_rewards", DSARL_KEY_BOOL, "null", "null = grpo.normalize_rewards", N},
    {"grpo.adv_estimator.use_leave_one_out_baseline", DSARL_KEY_BOOL, "null",
     "null = grpo.use_leave_one_out_baseline", N},
    {"grpo.adv_estimator.minus_baseline", DSARL_KEY_BOOL, "true",
     "reinforce_plus_plus: subtract the group mean before the batch normalisation (other estimators ignore it)", 0},
    {"grpo.adv_estimator.reward_weights", DSARL_KEY_LIST, "null",
     "gdpo: weight of each reward component, ordered by component name; null = all 1", N},

    {"grpo.seq_logprob_error_threshold", DSARL_KEY_FLOAT, "null",
     ">= 1: sample_mask 0 for sequences whose mean exp(|lp_gen - lp_old|) exceeds it; null = off", N},
    {"grpo.invalid_tool_call_advantage", DSARL_KEY_FLOAT, "null",
     "advantage that replaces the computed one of responses with a textual (so unexecuted) tool call; null = off", N},
    {"grpo.malformed_thinking_advantage", DSARL_KEY_FLOAT, "null",
     "advantage that replaces the computed one of responses whose <think> tags are malformed; null = off", N},

    {"grpo.async_grpo", DSARL_KEY_MAP, NULL, "asynchronous GRPO: train on trajectories of older weights", N},
    {"grpo.async_grpo.enabled", DSARL_KEY_BOOL, "false",
     "generate the batches ahead with weights up to max_trajectory_age_steps older than the trained ones; needs "
     "policy.generation.colocated.enabled false and loss_fn.use_importance_sampling_correction true", 0},
    {"grpo.async_grpo.max_trajectory_age_steps", DSARL_KEY_INT, "1",
     "the batch trained at step n was generated by step max(0, n - age)'s weights (0 = on-policy)", 0},
    {"grpo.async_grpo.max_generation_failures", DSARL_KEY_INT, "0", "must be 0: a generation failure ends the run", 0},
    {"grpo.async_grpo.in_flight_weight_updates", DSARL_KEY_BOOL, "false",
     "must be false: the native engine takes new weights only between two batches", 0},
    {"grpo.async_grpo.recompute_kv_cache_after_weight_updates", DSARL_KEY_BOOL, "false",
     "must be false: without in-flight updates no KV cache outlives its weights", 0},
    {"policy.generation.colocated.enabled", DSARL_KEY_BOOL, "true",
     "true: the engine reads the policy's weights in place; false: it generates with its own copy, refitted after "
     "every optimizer step", 0},
    {"policy.refit_buffer_size_gb", DSARL_KEY_FLOAT, "null",
     "GiB of weights per refit bucket sent to the generation copy (null = 1; a larger tensor goes alone)", N},
    {"grpo.deduplicate_multimodal_data", DSARL_KEY_BOOL, "false", "NeMo RL multimodal transfer only", IGN},
    {"grpo.debug_payload_metrics", DSARL_KEY_BOOL, "false", "NeMo RL multimodal transfer only", IGN},

    {"loss_fn", DSARL_KEY_MAP, NULL, "ClippedPGLoss settings (NeMo RL's loss_fn section)", DSARL_KEY_OWNED},
    {"loss_fn.reference_policy_kl_penalty", DSARL_KEY_FLOAT, "0.01", "beta of the KL to the reference; 0 = no reference",
     0},
    {"loss_fn.reference_policy_kl_type", DSARL_KEY_STRING, "k3", "KL estimator: k1 | k2 | k3", 0},
    {"loss_fn.kl_input_clamp_value", DSARL_KEY_FLOAT, "20.0", "clamp of lp_ref - lp before the estimator", N},
    {"loss_fn.kl_output_clamp_value", DSARL_KEY_FLOAT, "10.0", "clamp of the per-token KL", N},
    {"loss_fn.ratio_clip_min", DSARL_KEY_FLOAT, "0.2", "ratio clamped at 1 - this from below, in [0, 1]", 0},
    {"loss_fn.ratio_clip_max", DSARL_KEY_FLOAT, "0.2", "ratio clamped at 1 + this from above (clip-higher)", 0},
    {"loss_fn.ratio_clip_c", DSARL_KEY_FLOAT, "null", "dual clip c > 1 for negative advantages; null = off", N},
    {"loss_fn.use_on_policy_kl_approximation", DSARL_KEY_BOOL, "false", "weight the KL by exp(lp - lp_gen)", 0},
    {"loss_fn.use_importance_sampling_correction", DSARL_KEY_BOOL, "false",
     "weight tokens by exp(lp_old - lp_gen) (train/inference mismatch)", 0},
    {"loss_fn.truncated_importance_sampling_type", DSARL_KEY_STRING, "null", "tis | icepop | seq-mask-tis", N},
    {"loss_fn.truncated_importance_sampling_ratio", DSARL_KEY_FLOAT, "null", "upper bound of the IS weight", N},
    {"loss_fn.truncated_importance_sampling_ratio_min", DSARL_KEY_FLOAT, "null",
     "lower bound (tis: null = 0; required for icepop and seq-mask-tis)", N},
    {"loss_fn.sequence_level_importance_ratios", DSARL_KEY_BOOL, "false",
     "GSPO: ratio exp(mean log-ratio) and IS weight per sequence (needs token_level_loss: false)", 0},
    {"loss_fn.token_level_loss", DSARL_KEY_BOOL, "true", "true: mean over tokens; false: mean of sequence means", 0},
    {"loss_fn.force_on_policy_ratio", DSARL_KEY_BOOL, "false",
     "ratio = 1 with its gradient (needs train_global_batch_size = prompts x generations)", 0},
    {"loss_fn.use_kl_in_reward", DSARL_KEY_BOOL, "false",
     "reinforce_plus_plus: subtract penalty * KL(old || ref) per token from the advantage; the loss has no KL term", 0},
    {"loss_fn.use_cispo", DSARL_KEY_BOOL, "false", "CISPO: loss -A sg(clamp(ratio)) lp (token-level loss, no dual clip)",
     0},
    {"loss_fn.disable_ppo_ratio", DSARL_KEY_BOOL, "false", "REINFORCE: loss -A lp, no ratio or clip", 0},
    {"loss_fn.positive_example_nll_weight", DSARL_KEY_FLOAT, "0.0",
     "VAPO: + weight * mean NLL over the tokens of samples with reward > 0; 0 = off", 0},

    {"policy.train_global_batch_size", DSARL_KEY_INT, "512", "samples per optimizer step", 0},
    {"policy.max_total_sequence_length", DSARL_KEY_INT, "512", "prompt + response tokens", 0},
    {"policy.router_replay.enabled", DSARL_KEY_BOOL, "false",
     "the engine records each token's routed experts; training replays them (gate weights from the trainer's scores)",
     0},
    {"policy.dsa_index_replay.enabled", DSARL_KEY_BOOL, "false",
     "the engine records each token's DSA top-k keys; training attends to them (the indexer loss is still computed)",
     0},
};

static dsarl_lr_schedule_key_table schedule_keys;
static dsarl_key_spec all_keys[DSARL_ARRAY_LEN(grpo_math_keys) + DSARL_LR_SCHEDULE_N_KEYS];
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;

static void join_keys(void)
{
    grpo_config d;
    grpo_config_defaults(&d);
    size_t n;
    const dsarl_key_spec *sched = dsarl_lr_schedule_keys(&d.lr_schedule, "grpo.max_num_steps", &schedule_keys, &n);
    memcpy(all_keys, grpo_math_keys, sizeof grpo_math_keys);
    memcpy(all_keys + DSARL_ARRAY_LEN(grpo_math_keys), sched, n * sizeof *sched);
}

const dsarl_key_spec *grpo_recipe_keys(size_t *n)
{
    pthread_once(&keys_once, join_keys);
    *n = DSARL_ARRAY_LEN(all_keys);
    return all_keys;
}
