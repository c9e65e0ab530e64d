#define _POSIX_C_SOURCE 200809L /* clock_gettime */
/* grpo_step.c: one GRPO step (rollouts -> the packed batch -> advantages -> old / reference log-probs -> training), its
 * metrics and sample dumps; validation. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpo_loop.h"

/* --- one step ------------------------------------------------------------------------------------------------- */

int grpo_set_metric(trainer *tr, const char *name, double v, dsarl_error *err)
{
    return dsarl_metrics_set(tr->log, name, v, err);
}

/* reward and advantage (may be NULL: the rollouts' own rewards, no advantage) are per rollout. */
static int log_samples(trainer *tr, const char *prefix, int64_t step, const rollout_set *rs, const float *reward,
                       const float *advantage, dsarl_error *err)
{
    dsarl_metrics_sample *s = malloc(sizeof *s * (size_t)(rs->n ? rs->n : 1));
    if (!s)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory dumping %" PRId64 " samples", rs->n);
    for (int64_t i = 0; i < rs->n; i++)
        s[i] = (dsarl_metrics_sample){rs->items[i].prompt_text, rs->items[i].response_text,
                                      reward ? reward[i] : rs->items[i].reward, advantage ? advantage[i] : NAN};
    int rc = dsarl_metrics_write_samples(tr->log, prefix, step, s, (size_t)rs->n, err);
    free(s);
    return rc;
}

/* The environment's reward vectors into the packed batch (multi-reward estimators only). */
static int pack_components(const trainer *tr, const rollout_set *rs, packed_batch *p, dsarl_error *err)
{
    if (tr->n_components <= 0)
        return DSARL_OK;
    p->n_components = tr->n_components;
    p->components = malloc(sizeof(float) * (size_t)(rs->n * tr->n_components));
    if (!p->components)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for %" PRId64 " reward vectors", rs->n);
    for (int64_t i = 0; i < rs->n; i++)
        memcpy(p->components + i * tr->n_components, rs->items[i].components,
               sizeof(float) * (size_t)tr->n_components);
    return DSARL_OK;
}

/* Log-probs of a model over the batch. Read before the training pass (whole), every rank needs every sequence's;
 * otherwise only its own share, as grpo_logprobs_all computes. */
static int grpo_logprobs_all_ranks(trainer *tr, const packed_batch *p, float *out, bool whole, dsarl_error *err)
{
    dsarl_model *model = out == p->lp_ref ? tr->reference : tr->model;
    if (!whole || dsarl_group_size(grpo_dp_group(tr)) <= 1)
        return grpo_logprobs_all(tr, model, p, out, err);
    // the shares are computed rank-locally; a sum over ranks of the zero-initialised arrays assembles the whole
    DSARL_TRY(grpo_logprobs_all(tr, model, p, out, err));
    return dsarl_group_all_reduce_host(grpo_dp_group(tr), out, p->T, DSARL_DTYPE_F32, DSARL_REDUCE_SUM, err);
}

/* One GRPO step; on return tr->step has advanced and the step's train metrics are recorded (not committed). */
// Seconds this rank has waited in collectives of every group of its layout so far (0 in a single process).
static double collective_seconds(const trainer *tr)
{
    const dsarl_parallel *p = tr->ctx->parallel;
    if (!p || !DSARL_PARALLEL_HAS_GROUPS(p))
        return 0;
    const dsarl_group *groups[] = {p->world, p->tp, p->pp, p->cp, p->dp, p->dp_cp, p->ep, p->edp, p->tp_dp_cp};
    double total = 0;
    for (size_t i = 0; i < DSARL_ARRAY_LEN(groups); i++) {
        double s;
        int64_t calls;
        dsarl_group_time(groups[i], &s, &calls);
        total += s;
    }
    return total;
}

/* The metrics of the NeMo RL variants a recipe switched on (absent otherwise, as NeMo logs them). */
static int variant_metrics(trainer *tr, const rollout_set *rs, const packed_batch *p, const grpo_loss_metrics *m,
                           double k, dsarl_error *err)
{
    const grpo_config *c = &tr->cfg;
    if (c->max_rollout_turns > 1 && rs->n > 0) {
        // NeMo RL's multi-turn rollout metrics, and the tool's
        double turns = 0, max_turns = 0, natural = 0, at_limit = 0, env = 0, gen = 0, total = 0, calls = 0, bad = 0;
        for (int64_t i = 0; i < rs->n; i++) {
            const rollout *r = &rs->items[i];
            turns += r->turns, max_turns = fmax(max_turns, r->turns);
            natural += r->ended_by_env;
            at_limit += !r->ended_by_env && !r->truncated && r->turns >= c->max_rollout_turns;
            env += r->env_tokens, gen += r->response_len - r->env_tokens, total += r->prompt_len + r->response_len;
            calls += r->tool_calls, bad += r->invalid_tool_calls;
        }
        double n = (double)rs->n;
        struct { const char *name; double v; } rows[] = {
            {"train/total_turns", turns},
            {"train/avg_turns_per_sample", turns / n},
            {"train/max_turns_per_sample", max_turns},
            {"train/natural_termination_rate", natural / n},
            {"train/max_turns_reached_rate", at_limit / n},
            {"train/mean_env_tokens_per_sample", env / n},
            {"train/mean_gen_tokens_per_sample", gen / n},
            {"train/mean_total_tokens_per_sample", total / n},
            {"train/tool_calls_per_sample", calls / n},
            {"train/tool_call_error_rate", calls > 0 ? bad / calls : 0.0},
        };
        for (size_t i = 0; i < DSARL_ARRAY_LEN(rows); i++)
            DSARL_TRY(grpo_set_metric(tr, rows[i].name, rows[i].v, err));
    }
    if (c->loss.positive_example_nll_weight > 0.0)
        DSARL_TRY(grpo_set_metric(tr, "train/positive_nll_loss", m->positive_nll_loss / k, err));
    if (p->has_seq_error) {
        const grpo_seq_error_stats *e = &p->seq_error;
        struct { const char *name; double v; } rows[] = {
            {"train/max_seq_mult_prob_error", e->max},
            {"train/mean_seq_mult_prob_error", e->mean},
            {"train/min_seq_mult_prob_error", e->min},
            {"train/max_seq_mult_prob_error_after_mask", e->max_after},
            {"train/mean_seq_mult_prob_error_after_mask", e->mean_after},
            {"train/min_seq_mult_prob_error_after_mask", e->min_after},
            {"train/num_masked_seqs_by_logprob_error", (double)e->num_masked},
            {"train/masked_correct_pct", e->masked_correct_pct},
        };
        for (size_t i = 0; i < DSARL_ARRAY_LEN(rows); i++)
            DSARL_TRY(grpo_set_metric(tr, rows[i].name, rows[i].v, err));
    }
    if (!isnan(c->malformed_thinking_advantage) || !isnan(c->invalid_tool_call_advantage)) {
        const grpo_penalty_counts *q = &p->penalties;
        double msgs = (double)(q->assistant_messages ? q->assistant_messages : 1);
        struct { const char *name; double v; } rows[] = {
            {"train/invalid_tool_call_rate", (double)q->invalid_tool_calls / msgs},
            {"train/malformed_thinking_rate", (double)q->malformed_thinking / msgs},
            {"train/num_invalid_tool_calls", (double)q->invalid_tool_calls},
            {"train/num_malformed_thinking", (double)q->malformed_thinking},
            {"train/num_assistant_messages", (double)q->assistant_messages},
        };
        for (size_t i = 0; i < DSARL_ARRAY_LEN(rows); i++)
            DSARL_TRY(grpo_set_metric(tr, rows[i].name, rows[i].v, err));
    }
    return DSARL_OK;
}

/* Non-colocated generation and async GRPO: the refit's time and buckets, and how far behind the trained weights
 * the batch's generator was (every trajectory of a batch comes from one weight version). */
static int generation_metrics(trainer *tr, int64_t age, double refit_s, int64_t buckets, dsarl_error *err)
{
    if (tr->gen_model || tr->remote) {
        DSARL_TRY(grpo_set_metric(tr, "timing/train/prepare_for_generation/transfer_and_update_weights", refit_s,
                                  err));
        DSARL_TRY(grpo_set_metric(tr, "train/refit_buckets", (double)buckets, err));
    }
    if (tr->remote) {
        /* the generation rank's seconds on this step's requests, the trainer's wait for them, and what of the
         * generation ran while the trainer trained (async: the next batch's, behind this step's training) */
        DSARL_TRY(grpo_set_metric(tr, "timing/train/generation/remote", tr->remote_generate_s, err));
        DSARL_TRY(grpo_set_metric(tr, "timing/train/generation/wait", tr->remote_wait_s, err));
        double hidden = tr->remote_generate_s - tr->remote_wait_s;
        DSARL_TRY(grpo_set_metric(tr, "timing/train/generation/overlapped", hidden > 0 ? hidden : 0.0, err));
    }
    if (!tr->cfg.async.enabled)
        return DSARL_OK;
    DSARL_TRY(grpo_set_metric(tr, "train/trajectory_age_mean", (double)age, err));
    DSARL_TRY(grpo_set_metric(tr, "train/trajectory_age_max", (double)age, err));
    // the share of the batch generated by weights older than the ones that train on it
    return grpo_set_metric(tr, "train/trajectory_staleness", age > 0 ? 1.0 : 0.0, err);
}

int grpo_train_step(trainer *tr, double *mean_reward, bool *out_of_epochs, dsarl_error *err)
{
    double t0 = now_s(), comm0 = collective_seconds(tr);
    tr->remote_wait_s = tr->remote_generate_s = 0;
    rollout_set rs = {0};
    packed_batch p = {0};
    step_stats st;
    int64_t rounds = 0, epoch = 0;
    dsarl_dataloader_state before = dsarl_dataloader_get_state(tr->loader);
    int64_t consumed_before = tr->consumed_samples;
    tr->verifier_failures = 0;
    memset(&tr->passes, 0, sizeof tr->passes);
    /* the loader moves to the next epoch when no full batch is left: stop before generating a batch of an epoch
     * past grpo.max_num_epochs */
    int64_t next_epoch = before.epoch +
                         (before.cursor >= dsarl_dataloader_batches_per_epoch(tr->loader) * tr->per_round);
    *out_of_epochs = next_epoch >= tr->cfg.max_num_epochs;
    const grpo_async_config *ac = &tr->cfg.async;
    int64_t version = tr->step; // the weights that generated the batch (async: up to the age older)
    int rc;
    if (ac->enabled) {
        rc = grpo_async_take(tr, &rs, &rounds, &epoch, out_of_epochs, &version, err);
        if (rc < 0 || *out_of_epochs)
            return rc;
    } else if (*out_of_epochs) {
        return DSARL_OK;
    } else {
        rc = grpo_collect_rollouts(tr, &rs, &rounds, &epoch, err);
    }
    if (rc == DSARL_OK && !ac->enabled && epoch >= tr->cfg.max_num_epochs) {
        /* dynamic sampling drew into an epoch past grpo.max_num_epochs mid-step: put the batch back and stop */
        grpo_rollout_set_free(&rs);
        tr->consumed_samples = consumed_before;
        *out_of_epochs = true;
        return dsarl_dataloader_set_state(tr->loader, before, err);
    }
    double t_gen = now_s();
    if (rc == DSARL_OK)
        rc = grpo_pack_rollouts(tr, &rs, &p, err);
    if (rc == DSARL_OK)
        rc = pack_components(tr, &rs, &p, err);
    if (rc == DSARL_OK)
        rc = grpo_batch_advantages(tr, &p, err);
    double t_adv = now_s();
    /* on-policy (the whole batch is one optimizer slice): the weights do not move before the training pass, so
     * its own log-probs are the old ones and no separate forward is needed, unless something reads them first */
    bool old_early = grpo_needs_old_logprobs_early(&tr->cfg);
    p.old_from_train = !tr->cfg.loss.force_on_policy_ratio && p.B <= tr->cfg.train_global_batch_size && !old_early;
    if (rc == DSARL_OK && (!tr->cfg.loss.force_on_policy_ratio || old_early) && !p.old_from_train)
        rc = grpo_logprobs_all_ranks(tr, &p, p.lp_old, old_early, err);
    if (rc == DSARL_OK && tr->reference)
        rc = grpo_logprobs_all_ranks(tr, &p, p.lp_ref, old_early, err);
    double t_lp = now_s();
    if (rc == DSARL_OK)
        rc = grpo_batch_late_advantages(tr, &rs, &p, err);
    if (rc == DSARL_OK)
        rc = grpo_train_on_batch(tr, &p, &st, err);
    double t_train = now_s(), refit_s = 0;
    int64_t buckets0 = tr->refit_buckets;
    if (rc == DSARL_OK && tr->remote) // async: the next batch, generated while this step trained, arrives first
        rc = grpo_remote_finish(tr, err);
    if (rc == DSARL_OK && (tr->gen_model || tr->remote)) // the next batch and validation use the weights just trained
        rc = grpo_refit(tr, &refit_s, err);
    /* every rank holds the whole gathered batch, so the rollout metrics below are the one-process ones already;
     * the passes ran on this rank's share only */
    int64_t passes[2] = {tr->passes.forward_tokens, tr->passes.train_pass_tokens};
    if (rc == DSARL_OK)
        rc = dsarl_group_all_reduce_host(grpo_dp_group(tr), passes, 2, DSARL_DTYPE_I64, DSARL_REDUCE_SUM, err);
    tr->passes.forward_tokens = passes[0], tr->passes.train_pass_tokens = passes[1];
    if (rc == DSARL_OK) {
        tr->step++;
        int64_t n = rs.n;
        double reward = 0, correct = 0, gen_len = 0, prompt_len = 0, trunc = 0, amin = INFINITY, amax = -INFINITY,
               asum = 0;
        for (int64_t i = 0; i < n; i++) {
            const rollout *r = &rs.items[i];
            reward += p.reward[i];
            correct += r->verdict == DSARL_VERDICT_CORRECT;
            gen_len += r->response_len;
            prompt_len += r->prompt_len;
            trunc += r->truncated;
            asum += p.advantages[i];
            amin = fmin(amin, p.advantages[i]);
            amax = fmax(amax, p.advantages[i]);
        }
        double k = (double)st.n_slices;
        const grpo_loss_metrics *m = &st.loss;
        *mean_reward = reward / (double)n;
        struct { const char *name; double v; } rows[] = {
            {"train/reward", reward / (double)n},
            {"train/accuracy", correct / (double)n},
            {"train/loss", m->loss / k},
            {"train/actor_loss", m->actor_loss / k},
            {"train/kl_penalty", m->kl_penalty / k},
            {"train/token_mult_prob_error", m->token_mult_prob_error / k},
            {"train/gen_kl_error", m->gen_kl_error / k},
            {"train/policy_kl_error", m->policy_kl_error / k},
            {"train/js_divergence_error", m->js_divergence_error / k},
            {"train/sampling_importance_ratio", m->sampling_importance_ratio / k},
            {"train/approx_entropy", m->approx_entropy / k},
            {"train/probs_ratio", m->probs_ratio / k},
            {"train/probs_ratio_clamped", m->probs_ratio_clamped / k},
            {"train/clip_fraction", (m->clip_fraction_low + m->clip_fraction_high) / k},
            {"train/clip_fraction_low", m->clip_fraction_low / k},
            {"train/clip_fraction_high", m->clip_fraction_high / k},
            {"train/dual_clip_fraction", m->dual_clip_fraction / k},
            {"train/num_valid_samples", m->num_valid_samples},
            {"train/indexer_loss", st.indexer_loss / k},
            {"train/grad_norm", st.grad_norm / k},
            {"train/lr", st.lr},
            {"train/advantages/mean", asum / (double)n},
            {"train/advantages/min", amin},
            {"train/advantages/max", amax},
            {"train/mean_gen_length", gen_len / (double)n},
            {"train/mean_prompt_length", prompt_len / (double)n},
            {"train/truncation_rate", trunc / (double)n},
            {"train/total_num_tokens", (double)p.T},
            {"train/forward_tokens", (double)tr->passes.forward_tokens},
            {"train/train_pass_tokens", (double)tr->passes.train_pass_tokens},
            {"train/verifier_failures", (double)tr->verifier_failures},
            {"train/dynamic_sampling_num_gen_batches", (double)rounds},
            {"train/epoch", (double)epoch},
            {"timing/train/generation", t_gen - t0},
            {"timing/train/advantage_calculation", t_adv - t_gen},
            {"timing/train/policy_and_reference_logprobs", t_lp - t_adv},
            {"timing/train/policy_training", t_train - t_lp},
            {"timing/train/total_step_time", t_train - t0},
            // rank 0's waits in collectives (host MPI calls and the device's bracketed NCCL waits) over the step
            {"timing/train/collectives", collective_seconds(tr) - comm0},
            {"train/tokens_per_sec", (double)p.T / fmax(t_train - t0, 1e-9)},
        };
        for (size_t i = 0; i < DSARL_ARRAY_LEN(rows) && rc == DSARL_OK; i++)
            rc = grpo_set_metric(tr, rows[i].name, rows[i].v, err);
        if (rc == DSARL_OK)
            rc = variant_metrics(tr, &rs, &p, m, k, err);
        if (rc == DSARL_OK)
            rc = generation_metrics(tr, tr->step - 1 - version, refit_s, tr->refit_buckets - buckets0, err);
        if (rc == DSARL_OK && (tr->replay_w_experts || tr->replay_w_indices)) {
            // routing replay: the share of the step's rollouts whose engine rows reached the trainer (1 when every
            // rollout replays; a rollout without rows routes by the trainer's own scores)
            int64_t with_rows = 0;
            for (int64_t i = 0; i < n; i++)
                with_rows += (!tr->replay_w_experts || rs.items[i].routed_experts) &&
                             (!tr->replay_w_indices || rs.items[i].routed_indices);
            rc = grpo_set_metric(tr, "train/routing_replay_coverage", n ? (double)with_rows / (double)n : 0.0, err);
            // and the share of the packed batch's row entries holding a recorded choice (a token the engine never
            // ran, the last of each completion, has none; so do a row's unused key slots)
            int64_t set = 0, all = 0;
            for (int kind = 0; kind < 2; kind++) {
                const int32_t *rec = kind ? p.replay_indices : p.replay_experts;
                const int64_t w = kind ? tr->replay_w_indices : tr->replay_w_experts;
                for (int64_t e = 0; rec && e < p.T * w; e++)
                    set += rec[e] >= 0;
                all += rec ? p.T * w : 0;
            }
            if (rc == DSARL_OK)
                rc = grpo_set_metric(tr, "train/routing_replay_rows", all ? (double)set / (double)all : 0.0, err);
        }
        float last_mtp;
        const dsarl_model_ops *mops = tr->ctx->model_ops;
        if (rc == DSARL_OK && DSARL_MODEL_HAS(mops, mtp_loss) && mops->mtp_loss(tr->model, NULL, 0.0, &last_mtp) > 0)
            rc = grpo_set_metric(tr, "train/mtp_loss", st.mtp_loss / k, err); // a model that trains MTP layers
        if (tr->verifier_failures)
            dsarl_log(DSARL_LOG_WARN, "step %" PRId64 ": the verifier failed on %" PRId64 " responses (scored 0)",
                      tr->step, tr->verifier_failures);
        if (rc == DSARL_OK)
            rc = log_samples(tr, "train", tr->step, &rs, p.reward, p.advantages, err);
        tr->train_time_s += t_train - t0;
    }
    grpo_packed_free(&p);
    grpo_rollout_set_free(&rs);
    return rc;
}

/* --- validation ----------------------------------------------------------------------------------------------- */

int grpo_validate(trainer *tr, val_result *out, dsarl_error *err)
{
    const grpo_config *c = &tr->cfg;
    double t0 = now_s();
    size_t n_val = dsarl_dataset_size(tr->val_set);
    if (c->max_val_samples >= 0 && (size_t)c->max_val_samples < n_val)
        n_val = (size_t)c->max_val_samples;
    size_t bs = c->val_batch_size > 0 ? (size_t)c->val_batch_size : n_val;
    int64_t k = c->val_num_generations_per_prompt > 0 ? c->val_num_generations_per_prompt : 1;
    rollout_set rs = {0};
    const dsarl_example **batch = malloc(sizeof *batch * (bs ? bs : 1));
    int rc = batch ? DSARL_OK : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for validation");
    for (size_t i = 0; rc == DSARL_OK && i < n_val; i += bs) {
        size_t n = i + bs < n_val ? bs : n_val - i;
        for (size_t j = 0; j < n; j++)
            batch[j] = dsarl_dataset_get(tr->val_set, i + j);
        /* the same seed at every validation: accuracy changes come from the weights, not the draws */
        uint64_t seed = mix_seed((uint64_t)c->seed, 0x7661u, i);
        rc = grpo_run_rollouts(tr, batch, n, k, tr->opt.val_temperature, tr->opt.val_top_p, tr->opt.val_top_k, seed, &rs,
                          err);
    }
    free(batch);
    if (rc == DSARL_OK && rs.n > 0) {
        double reward = 0, len = 0, pass = 0;
        for (int64_t i = 0; i < rs.n; i++) {
            reward += rs.items[i].raw_reward;
            len += rs.items[i].response_len;
        }
        for (int64_t g = 0; g < rs.n / k; g++) {
            bool any = false;
            for (int64_t j = 0; j < k; j++)
                any |= rs.items[g * k + j].verdict == DSARL_VERDICT_CORRECT;
            pass += any;
        }
        out->accuracy = reward / (double)rs.n;
        out->avg_length = len / (double)rs.n;
        out->pass_k = pass / (double)(rs.n / k);
        /* the standard error of val/accuracy over prompts: a prompt's k answers are not independent draws of the
         * split's accuracy (one prompt is easier than another), so the unit is the prompt's mean reward */
        int64_t n_prompts = rs.n / k;
        double ss = 0;
        for (int64_t g = 0; g < n_prompts; g++) {
            double mean = 0;
            for (int64_t j = 0; j < k; j++)
                mean += rs.items[g * k + j].raw_reward;
            mean /= (double)k;
            ss += (mean - out->accuracy) * (mean - out->accuracy);
        }
        double se = n_prompts > 1 ? sqrt(ss / (double)(n_prompts - 1) / (double)n_prompts) : NAN;
        rc = grpo_set_metric(tr, "val/accuracy", out->accuracy, err);
        if (rc == DSARL_OK && n_prompts > 1)
            rc = grpo_set_metric(tr, "val/accuracy_se", se, err);
        if (rc == DSARL_OK)
            rc = grpo_set_metric(tr, "val/avg_length", out->avg_length, err);
        if (rc == DSARL_OK && k > 1)
            rc = grpo_set_metric(tr, "val/pass_at_k", out->pass_k, err);
        if (rc == DSARL_OK)
            rc = grpo_set_metric(tr, "timing/validation/total_validation_time", now_s() - t0, err);
        if (rc == DSARL_OK)
            rc = log_samples(tr, "val", tr->step, &rs, NULL, NULL, err);
        dsarl_log(DSARL_LOG_INFO, "validation at step %" PRId64 ": accuracy %.4f (standard error %.4f) over %" PRId64
                  " responses to %" PRId64 " prompts", tr->step, out->accuracy, se, rs.n, n_prompts);
        int64_t to_print = tr->opt.num_val_samples_to_print;
        for (int64_t i = 0; rc == DSARL_OK && i < to_print && i < rs.n; i++)
            dsarl_log(DSARL_LOG_INFO, "validation sample %" PRId64 ": prompt '%s' response '%s' reward %g", i,
                      rs.items[i].prompt_text, rs.items[i].response_text, rs.items[i].raw_reward);
    }
    grpo_rollout_set_free(&rs);
    return rc;
}
