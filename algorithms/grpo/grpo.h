/* grpo.h: the math of GRPO as NeMo RL implements it, on host float arrays, plus its recipe keys and config.
 *
 * Semantics follow NeMo RL's nemo_rl/algorithms/{grpo.py, utils.py, reward_functions.py, advantage_estimator.py,
 * loss/loss_functions.py}, written out in docs/conventions.md section 2.
 * Everything here is a pure function over caller-owned arrays: no globals, no allocation that outlives a call.
 * The loss runs on the host over per-token log-probabilities (only T floats cross the bus), so one
 * implementation serves the CPU and the GPU model: the model computes lp_theta, this file returns
 * d loss / d lp_theta, and the model's backward takes it from there.
 *
 * Layout conventions. A GRPO batch is n_groups prompt groups of group_size responses each, stored group after
 * group (NeMo's repeat_interleave order): sample i belongs to group i / group_size. Token arrays are packed THD:
 * sequence s owns tokens [cu_seqlens[s], cu_seqlens[s+1]). Log-probabilities are aligned so that lp[t] is
 * log p(token t | tokens before t); token_mask marks the generated tokens that train (NeMo's token_mask[:, 1:]). */
#ifndef DSARL_GRPO_H
#define DSARL_GRPO_H

#include <stdbool.h>
#include <stdint.h>
#include "dsarl/error.h"
#include "dsarl/optimizer.h"
#include "dsarl/plugin.h"
#include "dsarl/recipe.h"

/* ------------------------------------------------------------------------------------------------------------
 * Configuration (filled from the recipe by grpo_config_load; every field has NeMo RL's default). */

typedef enum grpo_kl_type { GRPO_KL_K1 = 1, GRPO_KL_K2 = 2, GRPO_KL_K3 = 3 } grpo_kl_type;

/* loss_fn.truncated_importance_sampling_type */
typedef enum grpo_truncation {
    GRPO_TRUNCATION_NONE = 0, /* null: the IS weight is used as is */
    GRPO_TRUNCATION_TIS,      /* "tis": clamp the weight to [ratio_min or 0, ratio] */
    GRPO_TRUNCATION_ICEPOP,   /* "icepop": zero the weight of tokens outside [ratio_min, ratio] */
    GRPO_TRUNCATION_SEQ_MASK, /* "seq-mask-tis": zero whole sequences whose geometric-mean weight is outside */
} grpo_truncation;

/* ClippedPGLoss settings (the loss_fn section). */
typedef struct grpo_loss_config {
    double ratio_clip_min;              /* the ratio is clamped at 1 - ratio_clip_min from below */
    double ratio_clip_max;              /* ... and at 1 + ratio_clip_max from above (clip-higher when larger) */
    double ratio_clip_c;                /* dual clip c > 1 for negative advantages; 0 = off (recipe null) */
    double reference_policy_kl_penalty; /* beta; 0 skips the KL term and the reference log-probs entirely */
    grpo_kl_type kl_type;
    double kl_input_clamp_value;        /* |lp_ref - lp_theta| clamp; INFINITY = none (recipe null) */
    double kl_output_clamp_value;       /* |w_kl * k| clamp; INFINITY = none (recipe null) */
    bool use_on_policy_kl_approximation; /* w_kl = exp(lp_theta - lp_gen) instead of exp(lp_theta - sg(lp_theta)) */
    bool use_importance_sampling_correction; /* weight each token by w = exp(lp_old - lp_gen) */
    grpo_truncation truncation;
    double truncation_ratio;            /* upper bound of the IS weight (truncated_importance_sampling_ratio) */
    double truncation_ratio_min;        /* lower bound (0 for "tis" when the recipe says null) */
    bool token_level_loss;              /* true: mean over the global batch's tokens; false: mean of sequence means */
    bool force_on_policy_ratio;         /* ratio = exp(lp - sg(lp)) == 1, lp_old taken as sg(lp_theta) */
    /* NeMo RL's loss variants (docs/algorithms.md), all off by default: */
    bool sequence_level_importance_ratios; /* GSPO: ratio exp(mean_t(lp - lp_old)) and IS weight per sequence */
    bool use_cispo;                     /* CISPO: L = -A sg(clamp(ratio)) lp */
    bool disable_ppo_ratio;             /* REINFORCE: L = -A lp (no ratio, no clip) */
    bool use_kl_in_reward;              /* the KL goes into the Reinforce++ advantages; the loss has none */
    double positive_example_nll_weight; /* VAPO: + weight * mean NLL of the tokens of samples with reward > 0 */
} grpo_loss_config;

/* grpo.adv_estimator.name */
typedef enum grpo_estimator {
    GRPO_ESTIMATOR_GRPO = 0,          /* group baseline, optional std normalisation */
    GRPO_ESTIMATOR_GDPO,              /* GRPO per reward component, weighted sum, batch z-score */
    GRPO_ESTIMATOR_REINFORCE_PP,      /* Reinforce++: group mean (minus_baseline), KL in reward, batch z-score */
} grpo_estimator;

/* Group baseline and normalisation (grpo.normalize_rewards etc.). */
typedef struct grpo_advantage_config {
    grpo_estimator estimator;
    bool minus_baseline;             /* Reinforce++: subtract the group mean */
    int64_t n_reward_weights;        /* GDPO: 0 = equal weights (recipe null) */
    double reward_weights[16];       /* GDPO: one per reward component, in the order of their sorted names */
    bool normalize_rewards;          /* divide by (std + 1e-6) where std > 0 */
    bool use_leave_one_out_baseline; /* RLOO: baseline and std exclude the sample itself */
    double advantage_clip_low;       /* clamp after normalisation; -INFINITY = none */
    double advantage_clip_high;      /* +INFINITY = none */
} grpo_advantage_config;

/* grpo.reward_scaling: clamp to [source_min, source_max], then map linearly onto [target_min, target_max]. */
typedef struct grpo_reward_scaling {
    bool enabled;
    double source_min, source_max, target_min, target_max;
} grpo_reward_scaling;

/* grpo.reward_shaping: DAPO's overlong penalty, or (when stop_properly_penalty_coef is set) a factor for truncated
 * responses instead. */
typedef struct grpo_reward_shaping {
    bool enabled;
    int64_t overlong_buffer_length;
    double overlong_buffer_penalty;
    int64_t max_response_length;
    bool has_stop_properly_penalty_coef;
    double stop_properly_penalty_coef;
} grpo_reward_shaping;

/* grpo.async_grpo and the generation placement it depends on (policy.generation.colocated, the refit buffer). */
typedef struct grpo_async_config {
    bool enabled;                    /* grpo.async_grpo.enabled */
    int64_t max_trajectory_age_steps; /* the batch trained at step n was generated by step max(0, n - age)'s weights */
    bool colocated;                  /* policy.generation.colocated.enabled: the engine reads the policy in place */
    double refit_buffer_size_gb;     /* policy.refit_buffer_size_gb: the bucket the weights travel to generation in */
} grpo_async_config;

/* Everything the GRPO algorithm reads from a recipe. Strings point into the recipe (valid while it lives). */
typedef struct grpo_config {
    int64_t num_prompts_per_step;
    int64_t num_generations_per_prompt;
    int64_t max_rollout_turns;             /* policy turns per episode; > 1 needs an environment with step */
    int64_t max_num_epochs;
    int64_t max_num_steps;
    int64_t val_period;                    /* 0 = no periodic validation */
    int64_t val_start_at;                  /* first step eligible for periodic validation; -1 = no delay */
    bool val_at_start, val_at_end;
    int64_t max_val_samples;               /* prompts; -1 = the whole validation set (recipe null) */
    int64_t val_batch_size;                /* -1 = recipe null */
    int64_t val_num_generations_per_prompt;
    const char *stop_at_validation_metric; /* NULL = no early stop */
    double stop_at_validation_threshold;
    int64_t seed;
    bool overlong_filtering;               /* truncated responses get loss multiplier 0 (stay in the baseline) */
    bool use_dynamic_sampling;
    int64_t dynamic_sampling_max_gen_batches;
    double batch_multiplier;               /* prompts generated per round = num_prompts_per_step * this */
    bool skip_reference_policy_logprobs;   /* true whenever reference_policy_kl_penalty == 0 */
    double seq_logprob_error_threshold;    /* drop sequences whose mean exp(|lp_gen - lp_old|) exceeds it; NAN = off */
    double malformed_thinking_advantage;   /* advantage of responses with malformed <think> tags; NAN = off */
    double invalid_tool_call_advantage;    /* advantage of responses with a (textual, unexecuted) tool call; NAN = off */
    grpo_advantage_config advantage;
    grpo_reward_scaling reward_scaling;
    grpo_reward_shaping reward_shaping;
    grpo_loss_config loss;
    grpo_async_config async;
    int64_t train_global_batch_size;       /* policy.train_global_batch_size: samples per optimizer step */
    dsarl_lr_schedule lr_schedule;         /* policy.megatron_cfg.optimizer / scheduler, clip_grad (dsarl/optimizer.h) */
} grpo_config;

/* NeMo RL's defaults (grpo_math_1B.yaml) for every field. */
void grpo_config_defaults(grpo_config *cfg);

/* Reads the grpo, loss_fn and the policy keys above from a resolved recipe; absent keys keep their defaults.
 * Fails with the key's location on a wrong type or an unknown enum spelling. Does not range-check. */
int grpo_config_load(const dsarl_node *root, grpo_config *cfg, dsarl_error *err);

/* Refuses settings GRPO cannot run with (ranges, combinations, features not supported yet), naming the key's
 * location in the recipe (dsarl_recipe_fail). root is the recipe cfg was loaded from. */
int grpo_config_validate(const dsarl_node *root, const grpo_config *cfg, dsarl_error *err);

/* grpo_config_load, then grpo_config_validate. */
int grpo_config_from_recipe(const dsarl_node *root, grpo_config *cfg, dsarl_error *err);

/* The recipe keys of algorithm/grpo: `grpo` and `loss_fn` are owned sections; every NeMo RL key is declared
 * (the ones dsarl does not implement are IGNORED or refused by grpo_config_validate when set), then the shared
 * schedule keys (dsarl_lr_schedule_keys) with GRPO's defaults. One static table, built on the first call. */
const dsarl_key_spec *grpo_recipe_keys(size_t *n);

/* ------------------------------------------------------------------------------------------------------------
 * Rewards and advantages (section 3.2 and the DAPO options of 3.5). */

/* Per-sample baseline and std of its group, as calculate_baseline_and_std_per_prompt: mean of the group (or of
 * the others, leave_one_out), Bessel-corrected std from E[R^2] - b^2 over the same samples, NaN -> 0; a group of
 * one gets b = R, std = 0. std_rewards (may be NULL = rewards) feeds only the std (DAPO: the unshaped reward).
 * rewards, std_rewards: (n_groups * group_size); baseline, std: (n_groups * group_size) outputs. */
void grpo_baseline_and_std(const float *rewards, const float *std_rewards, int64_t n_groups, int64_t group_size,
                           bool leave_one_out, double *baseline, double *std);

/* GRPO advantages A = R - b, divided by (std + 1e-6) where normalize_rewards and std > 0, then clamped to
 * [advantage_clip_low, advantage_clip_high]. Fails on a non-finite reward (naming the sample) or bad sizes.
 * rewards: (n_groups * group_size); advantages: (n_groups * group_size) output. */
int grpo_compute_advantages(const grpo_advantage_config *cfg, const float *rewards, int64_t n_groups,
                            int64_t group_size, float *advantages, dsarl_error *err);

/* GDPO: GRPO advantages (baseline and normalisation as cfg, no clip) of each of n_components reward columns,
 * summed with cfg->reward_weights (all 1 when cfg->n_reward_weights == 0), then z-scored over the whole batch
 * (unbiased std; only the mean is removed when that std is 0 or undefined), then clamped as grpo_compute_advantages.
 * Fails unless n_components >= 2 and the weights, when given, number n_components.
 * components: (n_groups * group_size, n_components) row-major; advantages: (n_groups * group_size) output. */
int grpo_gdpo_advantages(const grpo_advantage_config *cfg, const float *components, int64_t n_components,
                         int64_t n_groups, int64_t group_size, float *advantages, dsarl_error *err);

/* Reinforce++: a_s = R_s - mean of its group (minus_baseline) or R_s; per token a_t = a_s - kl_coef * k3-style
 * KL(lp_policy, lp_ref) (NeMo's calculate_kl with its fixed clamps 20 / 10) when kl_coef != 0; then
 * a_t = (a_t - mean) / sqrt(max(var, 1e-8)) with mean and (biased) var over the tokens with token_mask *
 * sample_mask != 0; then clamped to [advantage_clip_low, high]. Fails when no token is valid or a reward is not
 * finite. rewards, sample_mask: (n_groups * group_size); cu_seqlens (S + 1); token_mask, lp_policy, lp_ref (may be
 * NULL when kl_coef == 0), token_advantages: (cu_seqlens[S]). */
int grpo_reinforce_pp_advantages(const grpo_advantage_config *cfg, const float *rewards, int64_t n_groups,
                                 int64_t group_size, const int32_t *cu_seqlens, const float *token_mask,
                                 const float *sample_mask, double kl_coef, grpo_kl_type kl_type,
                                 const float *lp_policy, const float *lp_ref, float *token_advantages,
                                 dsarl_error *err);

/* The KL that use_kl_in_reward takes out of the Reinforce++ advantages, before its coefficient: the mean of the same
 * clamped estimator over the tokens with token_mask * sample_mask != 0 (0 when there is none). Shapes as
 * grpo_reinforce_pp_advantages: sample_mask (S), cu_seqlens (S + 1), token_mask, lp_policy, lp_ref (cu_seqlens[S]). */
double grpo_reward_kl_mean(grpo_kl_type kl_type, int64_t n_seqs, const int32_t *cu_seqlens, const float *token_mask,
                           const float *sample_mask, const float *lp_policy, const float *lp_ref);

/* Sequence-level train/inference error (NeMo's seq_mult_prob_error): per sequence with a valid token, the mean over
 * its tokens with token_mask * sample_mask of exp(|lp_gen - lp_old|), and the statistics NeMo logs. */
typedef struct grpo_seq_error_stats {
    double max, mean, min;                   /* over sequences with a valid token (0 when there are none) */
    double max_after, mean_after, min_after; /* over the ones kept */
    int64_t num_masked;                      /* sequences the threshold dropped */
    double masked_correct_pct;               /* fraction of the dropped ones whose reward is exactly 1 */
} grpo_seq_error_stats;

/* Computes the statistics and, when threshold is not NaN, sets sample_mask[s] = 0 for every sequence whose error
 * exceeds it. cu_seqlens (S + 1); token_mask, lp_old, lp_gen (cu_seqlens[S]); sample_mask (in/out), rewards (S). */
void grpo_seq_logprob_error_mask(double threshold, int64_t n_seqs, const int32_t *cu_seqlens, const float *token_mask,
                                 const float *lp_old, const float *lp_gen, const float *rewards, float *sample_mask,
                                 grpo_seq_error_stats *out);

/* True when a response's <think> tags do not fit its prompt (NeMo-Gym's rule): a prompt with as many "<think>" as
 * "</think>" (thinking off) wants neither tag in the response; a prompt with one "<think>" more (thinking opened)
 * wants no "<think>" and exactly one "</think>"; any other prompt is malformed already. */
bool grpo_malformed_thinking(const char *prompt, const char *response);

/* True when a response holds a textual tool call (NeMo-Gym's patterns <tool_call>, </tool_call>, <function_call>,
 * </function_call>). Rollouts here are single-turn, so no tool call is ever executed: every one in the text is an
 * invalid (unexecuted) call, as NeMo-Gym judges a final message. */
bool grpo_invalid_tool_call(const char *response);

/* Counts of grpo_apply_message_penalties. */
typedef struct grpo_penalty_counts {
    int64_t invalid_tool_calls, malformed_thinking, assistant_messages;
} grpo_penalty_counts;

/* NeMo RL's message-level penalties: a response with an invalid tool call gets invalid_tool_call_advantage, else
 * one with malformed thinking gets malformed_thinking_advantage (each NaN = off), clamped to the advantage clip,
 * in place of its advantage (advantages[s], and every token's in token_advantages when not NULL).
 * prompts, responses, advantages: (n); cu_seqlens (n + 1) and token_advantages (cu_seqlens[n]) may be NULL. */
void grpo_apply_message_penalties(const grpo_advantage_config *adv, double invalid_tool_call_advantage,
                                  double malformed_thinking_advantage, int64_t n, const char *const *prompts,
                                  const char *const *responses, const int32_t *cu_seqlens, float *advantages,
                                  float *token_advantages, grpo_penalty_counts *counts);

/* grpo.reward_scaling in place (no-op when disabled); returns how many rewards were outside the source range
 * and got clamped (NeMo warns about them). rewards: (n). */
int64_t grpo_scale_rewards(const grpo_reward_scaling *cfg, float *rewards, int64_t n);

/* grpo.reward_shaping in place (no-op when disabled): with stop_properly_penalty_coef, truncated responses get
 * r *= coef; otherwise DAPO's r += min(-(len - (max_response_length - buffer)) / buffer * penalty, 0).
 * rewards, response_lengths (generated tokens), truncated: (n). */
int grpo_shape_rewards(const grpo_reward_shaping *cfg, float *rewards, const int64_t *response_lengths,
                       const uint8_t *truncated, int64_t n, dsarl_error *err);

/* Overlong filtering: loss_multiplier[i] = 0 for every truncated response (it still counts in the baseline).
 * Returns the number filtered. truncated, loss_multiplier: (n). */
int64_t grpo_overlong_filter(const uint8_t *truncated, float *loss_multiplier, int64_t n);

/* DAPO dynamic sampling: keep[g] = 1 for groups whose rewards are not all identical (group std != 0), else 0.
 * Whole groups are kept or dropped. NeMo filters per sample on the std its baseline setting gives, which with a
 * leave-one-out baseline can drop single samples (a lone correct answer among wrong ones has std 0 over the
 * others); with the group-mean baseline of DAPO recipes the two agree. Returns the number kept.
 * rewards: (n_groups * group_size); keep: (n_groups). */
int64_t grpo_groups_with_signal(const float *rewards, int64_t n_groups, int64_t group_size, uint8_t *keep);

/* Dynamic sampling across generation rounds within one training step (NeMo's batch_cache). */
typedef struct grpo_dynamic_sampler {
    int64_t target_groups;        /* num_prompts_per_step */
    int64_t group_size;           /* num_generations_per_prompt */
    int64_t max_gen_batches;      /* dynamic_sampling_max_gen_batches */
    int64_t n_gen_batches;        /* rounds seen so far in this step */
    int64_t n_groups_taken;       /* groups collected so far (<= target_groups) */
    int64_t n_discarded_valid_samples; /* samples with signal sliced off because the batch was already full */
} grpo_dynamic_sampler;

/* Starts a training step's collection. */
void grpo_dynamic_sampler_init(grpo_dynamic_sampler *s, int64_t target_groups, int64_t group_size,
                               int64_t max_gen_batches);

/* Adds one generation round: take[g] = 1 for the groups of this round that join the training batch (they have
 * signal and the batch is not full yet, in order). *complete becomes true once target_groups are collected. As in
 * NeMo, a short batch after round n_gen_batches > max_gen_batches is an error (DSARL_E_INVALID) naming the key.
 * rewards (pre-shaping): (n_groups * group_size); take: (n_groups). */
int grpo_dynamic_sampler_add(grpo_dynamic_sampler *s, const float *rewards, int64_t n_groups, uint8_t *take,
                             bool *complete, dsarl_error *err);

/* ------------------------------------------------------------------------------------------------------------
 * ClippedPGLoss (section 3.3) and the train/inference diagnostics (3.4). */

/* One microbatch of the loss, packed THD. global_valid_toks / global_valid_seqs count the GLOBAL batch (every
 * microbatch on every rank), so the microbatch losses, gradients and metrics sum to the global-batch values. */
typedef struct grpo_loss_inputs {
    int64_t n_tokens;           /* T */
    int64_t n_seqs;             /* S */
    const int32_t *cu_seqlens;  /* (S + 1) token offsets, cu_seqlens[0] = 0, cu_seqlens[S] = T: the model's type */
    const float *lp_theta;      /* (T) current policy: the input the gradient is taken with respect to */
    const float *lp_old;        /* (T) same policy before this step's updates; may be NULL under force_on_policy_ratio */
    const float *lp_gen;        /* (T) generation engine's log-probs */
    const float *lp_ref;        /* (T) reference policy; may be NULL when reference_policy_kl_penalty == 0 */
    const float *token_mask;    /* (T) 1 on generated tokens that train, 0 on prompt and padding */
    const float *sample_mask;   /* (S) per-sequence loss multiplier (0 drops a sequence, e.g. overlong filtering) */
    const float *advantages;    /* (S) per-sequence advantage, broadcast over its tokens */
    const float *token_advantages; /* (T) per-token advantages instead (Reinforce++ with the KL in the reward); NULL */
    const float *rewards;       /* (S) rewards: the VAPO NLL term trains on samples with reward > 0; may be NULL */
    double global_positive_toks; /* sum of token_mask * sample_mask over the global batch's samples with reward > 0 */
    double global_valid_toks;   /* sum of token_mask * sample_mask over the global batch */
    double global_valid_seqs;   /* sum of sample_mask over the global batch */
} grpo_loss_inputs;

/* Loss metrics of one microbatch. Sums are already divided by the global counts, so adding the microbatches'
 * values (grpo_loss_metrics_add) gives the global-batch metric; *_min / *_max combine by min / max. */
typedef struct grpo_loss_metrics {
    double loss;                     /* actor + KL */
    double actor_loss;
    double kl_penalty;               /* KL term / beta (0 when beta == 0) */
    double token_mult_prob_error;    /* mean exp(|lp_gen - lp_old|): 1.0 when generation and training agree */
    double gen_kl_error;             /* KL(P_gen || P_train), kl_type estimator, token mean */
    double policy_kl_error;          /* KL(P_train || P_gen) */
    double js_divergence_error;      /* Jensen-Shannon divergence of the two */
    double sampling_importance_ratio; /* mean IS weight exp(lp_old - lp_gen) after truncation */
    double is_oob_ratio;             /* fraction of tokens (tis, icepop) or sequences (seq-mask-tis) outside bounds */
    double approx_entropy;           /* -mean exp(lp_theta - lp_gen) * lp_theta */
    double probs_ratio, probs_ratio_clamped;      /* token means of exp(lp_theta - lp_old) and its clamp */
    double probs_ratio_min, probs_ratio_max;      /* over valid tokens; +inf / -inf when there are none */
    double probs_ratio_clamped_min, probs_ratio_clamped_max;
    double clip_fraction_low;        /* tokens whose gradient the lower clip removed (A < 0, ratio < 1 - min) */
    double clip_fraction_high;       /* tokens whose gradient the upper clip removed (A > 0, ratio > 1 + max) */
    double dual_clip_fraction;       /* tokens capped by the dual clip (A < 0, ratio > c) */
    double num_valid_samples;        /* sum of sample_mask in this microbatch (a count, not normalised) */
    double positive_nll_loss;        /* VAPO: mean -lp over the tokens of positively rewarded samples */
} grpo_loss_metrics;

/* Zero sums and empty extrema (min = +inf, max = -inf), ready for grpo_loss_metrics_add. */
void grpo_loss_metrics_init(grpo_loss_metrics *m);

/* total += microbatch (sums add, extrema combine). */
void grpo_loss_metrics_add(grpo_loss_metrics *total, const grpo_loss_metrics *microbatch);

/* Counts this microbatch's valid tokens (sum token_mask * sample_mask) and sequences (sum sample_mask); the driver
 * sums them over microbatches and ranks into global_valid_toks / global_valid_seqs. */
void grpo_count_valid(const grpo_loss_inputs *in, double *valid_toks, double *valid_seqs);

/* Counts this microbatch's valid tokens of samples whose reward is > 0 (the VAPO NLL term's denominator, summed
 * like valid_toks into global_positive_toks); 0 when in->rewards is NULL. */
double grpo_count_positive_toks(const grpo_loss_inputs *in);

/* ClippedPGLoss of one microbatch: *loss, grad_lp_theta[t] = d loss / d lp_theta[t] (may be NULL) with NeMo's
 * stop-gradients, and metrics (may be NULL). Masked tokens contribute nothing and get gradient 0. */
int grpo_clipped_pg_loss(const grpo_loss_config *cfg, const grpo_loss_inputs *in, double *loss,
                         float *grad_lp_theta, grpo_loss_metrics *metrics, dsarl_error *err);

/* The same loss with the stop-gradient values given separately: lp_detached (T) replaces lp_theta wherever NeMo
 * writes lp_theta.detach() (force_on_policy_ratio's lp_old, the w_kl = exp(lp - sg(lp)) denominator). With
 * lp_detached == lp_theta it is grpo_clipped_pg_loss; holding lp_detached fixed while perturbing lp_theta makes
 * the gradient an ordinary derivative of the returned loss (what the finite-difference tests check). */
int grpo_clipped_pg_loss_detached(const grpo_loss_config *cfg, const grpo_loss_inputs *in, const float *lp_detached,
                                  double *loss, float *grad_lp_theta, grpo_loss_metrics *metrics, dsarl_error *err);

#endif /* DSARL_GRPO_H */
