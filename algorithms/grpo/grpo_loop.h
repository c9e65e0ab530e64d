/* grpo_loop.h: what the files of the GRPO loop share (internal to the grpo plugin). The data path, one file each:
 *   grpo_rollout.c  prompts -> generation -> environment rewards (rollouts; dynamic sampling)
 *   grpo_batch.c    rollouts -> the packed THD batch (tokens, targets, masks, per-sequence advantages)
 *   grpo_update.c   the batch -> log-prob passes -> ClippedPGLoss microbatches -> one optimizer step per slice
 *   grpo_step.c     one GRPO step end to end, its metrics and samples; validation
 *   grpo_train.c    options, setup, checkpoints and the loop with its stop conditions
 *   grpo_async.c    generation on its own weight copy (refit in buckets) and the async queue of older batches
 *   grpo_remote.c   that copy on a dedicated generation rank: weights, requests and rollouts over MPI, its serve loop
 * Positions follow the model's convention: logprob j of a sequence scores its token j + 1, so every per-token
 * array is indexed by model position. */
#ifndef DSARL_GRPO_LOOP_H
#define DSARL_GRPO_LOOP_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "dsarl/checkpoint.h"
#include "dsarl/dataset.h"
#include "dsarl/log.h"
#include "dsarl/metrics.h"
#include "dsarl/optimizer.h"
#include "dsarl/tokenizer.h"
#include "dsarl/trainer.h"
#include "grpo_train.h"

/* Settings the loop reads besides grpo_config. */
typedef struct loop_options {
    int64_t micro_batch, logprob_batch;
    int64_t max_total_len, max_input_len, max_new_tokens;
    float temperature, top_p, val_temperature, val_top_p;
    int32_t top_k, val_top_k;
    int32_t stop_ids[16];
    int32_t n_stop_ids;
    const char *stop_strings[16];
    int32_t n_stop_strings;
    bool shuffle;
    int64_t num_val_samples_to_print;
    const char *tokenizer_name, *chat_template;
    bool router_replay;   /* policy.router_replay.enabled: the engine records experts, training replays them */
    bool index_replay;    /* policy.dsa_index_replay.enabled: the same for the DSA indexer's selected keys */
} loop_options;

/* One rollout: a prompt, one response, and everything the loss and the logs need about it. */
typedef struct rollout {
    const dsarl_example *example;
    char *prompt_text;
    int32_t *prompt;       /* (prompt_len) */
    int32_t prompt_len;
    int32_t *response;     /* (response_len) */
    float *response_lp;    /* (response_len) generation log-probs */
    int32_t response_len;
    uint8_t truncated;     /* max_new_tokens ended it */
    uint8_t prompt_cut;    /* the prompt was longer than data.max_input_seq_length */
    char *response_text;
    float reward;          /* after scaling and shaping */
    float raw_reward;
    dsarl_verdict verdict;
    float loss_multiplier;
    float components[DSARL_MAX_REWARD_COMPONENTS]; /* the environment's reward vector (multi-reward estimators) */
    /* multi-turn episodes: response holds the policy's turns and the environment's observations in order; an
     * observation token has response_lp NAN (it is masked out of the loss) */
    int32_t turns, env_tokens, tool_calls, invalid_tool_calls;
    uint8_t ended_by_env;  /* the environment ended the episode (natural termination) */
    /* routing replay: the engine's rows for the prompt_len + response_len tokens (trainer.replay_w_*), or NULL */
    int32_t *routed_experts, *routed_indices;
} rollout;

typedef struct rollout_set {
    rollout *items;
    int64_t n, cap;
} rollout_set;

typedef struct grpo_async grpo_async; /* grpo_async.c: the batches generated ahead (async GRPO) */

/* A rollout request sent to the generation rank and not received yet (at most one at a time). */
typedef struct remote_pending {
    bool active;
    bool deferred;        /* async: its verifier failures count when the batch is taken, not now */
    rollout_set *out;     /* the rows [first, first + rows) wait for the generation rank's answer */
    int64_t first, rows;
    double sent_at;       /* when the request went out */
} remote_pending;

typedef struct trainer {
    const dsarl_run_context *ctx;
    const dsarl_node *root;
    grpo_config cfg;
    loop_options opt;
    dsarl_optimizer_params adam;
    dsarl_checkpoint_config ckpt;
    dsarl_metrics_config log_cfg;
    dsarl_session session;     /* device, DSA, policy, tokenizer, metrics; the pointers below borrow from it */
    dsarl_model *model, *reference;
    dsarl_generator *engine;
    dsarl_model *gen_model;    /* non-colocated: the engine's own copy of the weights (NULL: it reads tr->model) */
    grpo_async *async;         /* async GRPO's queue (NULL when off) */
    int64_t refit_buckets;     /* buckets sent by grpo_refit so far */
    /* dedicated generation rank (grpo_remote.c): remote on training ranks, serving on the generation rank */
    bool remote, serving;
    bool remote_defer;         /* grpo_run_rollouts only sends its request (async GRPO's overlap) */
    remote_pending pending;
    double remote_wait_s;      /* this step: seconds the trainer waited for rollouts */
    double remote_generate_s;  /* this step: seconds the generation rank spent on them */
    dsarl_tokenizer *tok;
    dsarl_dataset *train_set, *val_set;
    dsarl_dataloader *loader;
    const dsarl_environment_ops *env_ops;
    dsarl_environment *env;
    dsarl_metrics *log;
    int64_t per_round;         /* prompts per dataloader batch */
    int64_t step;              /* completed training steps */
    int64_t consumed_samples;
    double train_time_s;       /* summed over resumes */
    int64_t verifier_failures; /* this step */
    dsarl_pass_counts passes;  /* this step */
    int64_t n_components;      /* reward components per rollout (0: the environment's scalar reward only) */
    int32_t replay_w_experts;  /* int32 per token of the recorded experts (0: no router replay) */
    int32_t replay_w_indices;  /* int32 per token of the recorded key positions (0: no index replay) */
} trainer;

/* The rollouts packed as model input: tokens (T), cu (B + 1), targets (T) = next token or -1, and per position the
 * generation log-prob and the train mask of the response token it predicts. */
typedef struct packed_batch {
    int64_t T, B;
    int32_t *tokens, *cu, *targets; /* cu: the one offset type, the model's */
    float *lp_gen, *mask, *lp_old, *lp_ref, *lp_theta, *grad;
    /* per sequence (B): what the advantage code reads and writes in place and the loss takes */
    float *raw_reward, *reward;   /* environment reward; after scaling and shaping */
    int64_t *response_len;
    uint8_t *truncated;
    float *sample_mask, *advantages; /* loss multiplier (0 = no loss); advantage */
    bool old_from_train; /* on-policy: lp_old is copied from the training pass's own log-probs (ratio exactly 1) */
    int64_t n_components;
    float *components;   /* (B, n_components): the reward vectors, or NULL */
    float *token_adv;    /* (T) per-token advantages (Reinforce++), or NULL: advantages broadcast per sequence */
    int32_t *replay_experts, *replay_indices; /* (T, trainer.replay_w_*) the engine's routing rows, or NULL */
    grpo_seq_error_stats seq_error; /* after grpo_batch_late_advantages, when the old log-probs were computed */
    bool has_seq_error;
    grpo_penalty_counts penalties;  /* responses whose advantage a message-level penalty replaced */
} packed_batch;

typedef struct step_stats {
    grpo_loss_metrics loss;
    double grad_norm, lr, indexer_loss;
    double mtp_loss; /* the model's multi-token-prediction loss (summed like indexer_loss), 0 without MTP */
    int64_t n_slices;
} step_stats;

/* The validation metrics grpo.stop_at_validation_metric can name. */
typedef struct val_result {
    double accuracy, avg_length, pass_k;
} val_result;

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* splitmix64: independent seeds for (grpo.seed, purpose, step) without a stored generator. */
static inline uint64_t mix_seed(uint64_t seed, uint64_t purpose, uint64_t step)
{
    uint64_t z = seed ^ (purpose * 0x9E3779B97F4A7C15ull) ^ (step * 0xBF58476D1CE4E5B9ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* grpo_train.c: the trainer's life cycle, shared with the distillation plugin (which fills tr->cfg itself) */
/* The loop's options, optimizer, checkpointing and logger settings from the recipe, checked against tr->cfg (its
 * batch sizes); reads only the recipe, so a bad value fails before any model is built. */
int grpo_trainer_read_options(trainer *tr, dsarl_error *err);
/* The session (device, DSA, policy, tokenizer), data, environment, reference policy and generation engine. */
int grpo_trainer_open(trainer *tr, dsarl_error *err);
/* Restores the newest complete checkpoint, if any, and opens the metrics. */
int grpo_trainer_start(trainer *tr, dsarl_error *err);
/* Saves checkpoint tr->step with the loader position and the given metrics (NAN = not recorded). */
int grpo_trainer_save_checkpoint(trainer *tr, double val_accuracy, double train_reward, dsarl_error *err);
/* Releases whatever grpo_trainer_open built (a partly opened trainer is fine). */
void grpo_trainer_free(trainer *tr);
/* True when any rank of the run says so: a stop signal or a deadline seen by one rank stops them all at the same
 * step, so no rank waits in a collective of a step its peers never start. */
bool grpo_any_rank(const trainer *tr, bool x);

/* grpo_rollout.c */
void grpo_rollout_set_free(rollout_set *s);
/* Once the environment exists: the reward components the estimator reads from it (tr->n_components; 0 for a
 * scalar reward), refusing naming the key when GDPO's reward vector or its weights do not fit the environment. */
int grpo_check_environment(trainer *tr, dsarl_error *err);
/* The run's data-parallel group (NULL in a single process: a group of one). */
const dsarl_group *grpo_dp_group(const trainer *tr);
/* Generates n_gen responses for each of n examples and scores them; appends n * n_gen rollouts (group after
 * group) to out. */
int grpo_run_rollouts(trainer *tr, const dsarl_example *const *examples, size_t n, int64_t n_gen, float temperature,
                      float top_p, int32_t top_k, uint64_t seed, rollout_set *out, dsarl_error *err);
/* Draws prompt batches and generates until the step's rollouts are complete (one round without dynamic sampling). */
int grpo_collect_rollouts(trainer *tr, rollout_set *rs, int64_t *n_rounds, int64_t *epoch_out, dsarl_error *err);
/* The same for training step `step` (its sampling seeds), which need not be tr->step (async GRPO draws ahead). */
int grpo_collect_rollouts_for(trainer *tr, int64_t step, rollout_set *rs, int64_t *n_rounds, int64_t *epoch_out,
                              dsarl_error *err);

/* One rollout's response metadata as GRPO_ROLLOUT_META doubles (length, flags, rewards, verdict, reward vector,
 * multi-turn counts), and back with its tokens and log-probs (the text decoded here): how rollouts travel between
 * ranks. */
#define GRPO_ROLLOUT_META (10 + DSARL_MAX_REWARD_COMPONENTS)
void grpo_rollout_pack(const rollout *x, double *m);
int grpo_rollout_unpack(const trainer *tr, const double *m, const int32_t *tokens, const float *logprobs, rollout *x,
                        dsarl_error *err);

/* Routing replay: the routing rows of kind (0 experts, 1 key positions; trainer.replay_w_* int32 per prompt and
 * response token) of rollouts items[0 .. n), end to end in dst, -1 rows for a rollout without them; returns the
 * tokens they cover. grpo_routing_unpack gives each rollout its own copy of its rows from src laid out that way. */
size_t grpo_routing_pack(const trainer *tr, const rollout *items, int64_t n, int kind, int32_t *dst);
int grpo_routing_unpack(const trainer *tr, rollout *items, int64_t n, int kind, const int32_t *src, dsarl_error *err);
/* The prompt + response tokens of items[0 .. n): the rows the routing of those rollouts holds. */
size_t grpo_routing_tokens(const rollout *items, int64_t n);

/* grpo_async.c */
/* Copies every tensor of tr->model into the generation copy, policy.refit_buffer_size_gb per bucket: tr->gen_model
 * in this process, or the dedicated generation rank's model (sent from training rank 0); adds the seconds it took
 * to *seconds (may be NULL). */
int grpo_refit(trainer *tr, double *seconds, dsarl_error *err);
/* The generation rank's side of grpo_refit: receives the buckets into tr->model. */
int grpo_refit_receive(trainer *tr, int64_t n_tensors, int64_t bucket, dsarl_error *err);
/* The async queue (nothing when grpo.async_grpo is off). */
int grpo_async_open(trainer *tr, dsarl_error *err);
void grpo_async_free(trainer *tr);
/* Generates the batches of steps tr->step .. tr->step + max_trajectory_age_steps not queued yet (with the current
 * weights), then hands over the one of step tr->step and the weight version that generated it; *out_of_epochs when
 * the data ran out before it (nothing handed over). */
int grpo_async_take(trainer *tr, rollout_set *rs, int64_t *rounds, int64_t *epoch, bool *out_of_epochs,
                    int64_t *weight_version, dsarl_error *err);
/* Where a checkpoint must put the loader (and consumed_samples) so that a resumed run redraws the queued batches:
 * before the oldest of them. False when nothing is queued. */
bool grpo_async_resume_point(const trainer *tr, dsarl_dataloader_state *loader, int64_t *consumed);

/* grpo_remote.c */
/* The trainer's side: rows [first, first + n * n_gen) of out (prompts encoded) are generated and scored by the
 * generation rank; with tr->remote_defer the request is only sent (grpo_remote_finish receives it). */
int grpo_remote_rollouts(trainer *tr, const dsarl_example *const *examples, size_t n, int64_t n_gen,
                         float temperature, float top_p, int32_t top_k, uint64_t seed, rollout_set *out,
                         int64_t first, dsarl_error *err);
/* Receives the pending request's rollouts (nothing when none is pending). */
int grpo_remote_finish(trainer *tr, dsarl_error *err);
/* Training rank 0 sends the command header of a refit to the generation rank. */
int grpo_remote_send_header(trainer *tr, int64_t cmd, int64_t a, int64_t b, dsarl_error *err);
/* The peer's rank in the generation group, and that group. */
int32_t grpo_remote_generation_peer(const trainer *tr);
const dsarl_group *grpo_remote_group(const trainer *tr);
/* Ends the generation rank's serve loop (training rank 0; a pending request is received first). */
int grpo_remote_stop(trainer *tr, dsarl_error *err);
/* The generation rank: serves refits and rollout requests until the trainer stops it. */
int grpo_remote_serve(trainer *tr, dsarl_error *err);
enum { GRPO_REMOTE_STOP = 1, GRPO_REMOTE_WEIGHTS = 2, GRPO_REMOTE_ROLLOUTS = 3 };

/* grpo_batch.c */
/* Rewards after scaling and shaping, advantages and loss multipliers, in place in the packed batch. */
int grpo_batch_advantages(trainer *tr, packed_batch *p, dsarl_error *err);
/* What needs the old (and reference) log-probs, after their passes: sequence masking by the train/inference error,
 * Reinforce++'s per-token advantages, then the malformed-thinking advantage. */
int grpo_batch_late_advantages(trainer *tr, const rollout_set *rs, packed_batch *p, dsarl_error *err);
/* Whether the step needs lp_old before the training pass (grpo_batch_late_advantages reads it). */
bool grpo_needs_old_logprobs_early(const grpo_config *cfg);
/* The rollouts packed as one batch (their routing rows too when routing replay is on). */
int grpo_pack_rollouts(const trainer *tr, const rollout_set *rs, packed_batch *p, dsarl_error *err);
void grpo_packed_free(packed_batch *p);

/* grpo_update.c */
/* Forward-only log-probs of every sequence with model, logprob_batch_size sequences per pass. */
int grpo_logprobs_all(trainer *tr, dsarl_model *model, const packed_batch *p, float *out, dsarl_error *err);
/* Points b's replay rows at the packed batch's rows from token base on (nothing when replay is off). */
void grpo_replay_rows(const trainer *tr, const packed_batch *p, int64_t base, dsarl_token_batch *b);
/* The optimizer steps of one training step: one per train_global_batch_size slice of the rollouts. */
int grpo_train_on_batch(trainer *tr, packed_batch *p, step_stats *st, dsarl_error *err);

/* grpo_step.c */
int grpo_set_metric(trainer *tr, const char *name, double v, dsarl_error *err);
/* One GRPO step; on return tr->step has advanced and the step's train metrics are recorded (not committed). */
int grpo_train_step(trainer *tr, double *mean_reward, bool *out_of_epochs, dsarl_error *err);
int grpo_validate(trainer *tr, val_result *out, dsarl_error *err);

#endif /* DSARL_GRPO_LOOP_H */
