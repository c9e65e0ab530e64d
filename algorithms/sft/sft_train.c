/* sft_train.c: the SFT loop. Per step: one global batch from the dataloader -> samples (template + answer + EOS)
 * -> microbatches: one training pass each, whose forward gives the log-probs the loss is logged from and whose
 * backward takes the gradient of sum(-logp) / (answer tokens of the global batch) ->
 * gradient norm, clip factor, AdamW at the schedule's LR -> validation (loss, greedy exact match) -> checkpoint ->
 * metrics and one log line. Resume restores weights, AdamW state, the dataloader position and the step, so a CPU
 * run continues bit-identically. Under data parallelism every rank reads the same global batch, trains on a
 * contiguous 1/dp of it (whole microbatches, the loss still normalised by the global batch's answer tokens) and
 * validates a 1/dp share of each validation batch; sums are reduced over dp, so rank 0 logs the one-process run. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "dsarl/checkpoint.h"
#include "dsarl/dataset.h"
#include "dsarl/log.h"
#include "dsarl/metrics.h"
#include "dsarl/optimizer.h"
#include "dsarl/trainer.h"
#include "sft.h"

typedef struct sft_trainer {
    const dsarl_run_context *ctx;
    const dsarl_model_ops *ops;
    const dsarl_node *root;
    sft_config cfg;
    dsarl_optimizer_params adam;
    dsarl_checkpoint_config ckpt;
    dsarl_metrics_config log_cfg;
    dsarl_session session;              /* device, DSA, model, tokenizer, metrics; the pointers below borrow */
    dsarl_model *model;
    dsarl_tokenizer *tok;
    const char *chat_template;
    dsarl_dataset *train_set, *val_set;
    dsarl_dataloader *loader;
    dsarl_metrics *log;
    int64_t step, total_steps, consumed_samples;
    double train_time_s;                /* summed over resumes */
    bool has_val;
    double val_loss, val_accuracy;      /* the latest validation */
    double train_loss;                  /* the latest step */
} sft_trainer;

/* The run's data-parallel group and world (NULL in a single process: a group of one). */
static const dsarl_group *dp_group(const sft_trainer *tr)
{
    const dsarl_parallel *p = tr->ctx->parallel;
    return p && DSARL_PARALLEL_HAS_GROUPS(p) ? p->dp : NULL;
}

static const dsarl_group *world_group(const sft_trainer *tr)
{
    const dsarl_parallel *p = tr->ctx->parallel;
    return p && DSARL_PARALLEL_HAS_GROUPS(p) ? p->world : NULL;
}

/* Share [*lo, *hi) of n items of this data-parallel rank: contiguous, in rank order. */
static void dp_share(const sft_trainer *tr, int64_t n, int64_t *lo, int64_t *hi)
{
    int64_t dp = dsarl_group_size(dp_group(tr)), r = dsarl_group_rank(dp_group(tr));
    *lo = n * r / dp;
    *hi = n * (r + 1) / dp;
}

/* True when any rank says so (a stop signal or the save-by deadline): every rank stops at the same step. */
static bool any_rank(const sft_trainer *tr, bool x)
{
    const dsarl_group *world = world_group(tr);
    if (dsarl_group_size(world) <= 1)
        return x;
    int32_t v = x;
    dsarl_error ignored;
    if (dsarl_group_all_reduce_host(world, &v, 1, DSARL_DTYPE_I32, DSARL_REDUCE_MAX, &ignored) < 0)
        return true; // the collective failed: stopping is the only safe choice
    return v != 0;
}

/* Batches that do not split into whole microbatches per data-parallel rank are refused before any model is built:
 * the per-microbatch indexer-loss means would differ from the one-process run's. */
static int check_parallel(const sft_trainer *tr, dsarl_error *err)
{
    const dsarl_parallel *p = tr->ctx->parallel;
    int64_t dp = p && p->dp_size > 1 ? p->dp_size : 1;
    if (tr->cfg.global_batch % (dp * tr->cfg.micro_batch) != 0)
        return dsarl_recipe_fail(tr->root, "policy.train_global_batch_size", err, DSARL_E_INVALID,
                                 "(%" PRId64 ") must be divisible by the data-parallel size %" PRId64 " x "
                                 "policy.train_micro_batch_size (%" PRId64 "), so that every rank trains whole "
                                 "microbatches of each optimizer step", tr->cfg.global_batch, dp,
                                 tr->cfg.micro_batch);
    int64_t pp = p && p->pp_size > 1 ? p->pp_size : 1, vpp = dsarl_parallel_vpp(p);
    int64_t per_rank = tr->cfg.global_batch / (dp * tr->cfg.micro_batch);
    if (vpp > 1 && per_rank % pp != 0)
        return dsarl_recipe_fail(tr->root, "policy.train_global_batch_size", err, DSARL_E_INVALID,
                                 "(%" PRId64 ") makes %" PRId64 " microbatches per data-parallel rank, which the "
                                 "interleaved schedule (virtual_pipeline_model_parallel_size %" PRId64 ") needs to be "
                                 "a multiple of pipeline_model_parallel_size %" PRId64 ", as Megatron does",
                                 tr->cfg.global_batch, per_rank, vpp, pp);
    if (tr->cfg.val_global_batch_size % dp != 0)
        return dsarl_recipe_fail(tr->root, "sft.val_global_batch_size", err, DSARL_E_INVALID,
                                 "(%" PRId64 ") must be divisible by the data-parallel size %" PRId64 ", so that "
                                 "every rank validates an equal share of each validation batch",
                                 tr->cfg.val_global_batch_size, dp);
    return DSARL_OK;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* --- setup ---------------------------------------------------------------------------------------------------- */

static int trainer_open(sft_trainer *tr, dsarl_error *err)
{
    const dsarl_run_context *ctx = tr->ctx;
    const dsarl_model_ops *ops = tr->ops;
    if (!ops || !ctx->device_ops || !ctx->dsa_ops)
        return DSARL_FAIL(err, DSARL_E_INVALID, "sft needs a model, a device and a dsa plugin in the run context");
    if (!ops->forward_logprobs || !ops->forward_logits || !ops->backward || !ops->zero_grad || !ops->grad_norm ||
        !ops->optimizer_step)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "model plugin '%s' cannot train (no log-probs, backward or "
                          "optimizer step)", ops->common.name);
    const char *model_dir = NULL;
    DSARL_TRY(dsarl_recipe_string_or(tr->root, "policy.model_name", NULL, &model_dir, err));
    dsarl_session_config sc = {.struct_size = sizeof sc, .host = ctx->host, .recipe = tr->root,
                               .parallel = ctx->parallel, .seed = (uint64_t)tr->cfg.seed,
                               .device_ops = ctx->device_ops, .dsa_ops = ctx->dsa_ops, .model_ops = ops,
                               .model_dir = model_dir, .tokenizer = tr->cfg.tokenizer_name};
    DSARL_TRY(dsarl_session_open(&sc, &tr->session, err));
    tr->model = tr->session.model;
    tr->tok = tr->session.tokenizer;
    tr->chat_template = tr->cfg.chat_template ? tr->cfg.chat_template : dsarl_tokenizer_default_template(tr->tok);
    DSARL_TRY(dsarl_dataset_from_recipe(tr->root, "data.train", DSARL_SPLIT_TRAIN, &tr->train_set, err));
    if (dsarl_node_get(tr->root, "data.validation"))
        DSARL_TRY(dsarl_dataset_from_recipe(tr->root, "data.validation", DSARL_SPLIT_VALIDATION, &tr->val_set, err));
    DSARL_TRY(dsarl_dataloader_create(tr->train_set, (size_t)tr->cfg.global_batch, tr->cfg.shuffle, 1,
                                      (uint64_t)tr->cfg.seed, &tr->loader, err));
    int64_t per_epoch = dsarl_dataloader_batches_per_epoch(tr->loader);
    tr->total_steps = tr->cfg.max_num_steps;
    if (per_epoch * tr->cfg.max_num_epochs < tr->total_steps)
        tr->total_steps = per_epoch * tr->cfg.max_num_epochs;
    return DSARL_OK;
}

static void trainer_free(sft_trainer *tr)
{
    dsarl_session_close(&tr->session);
    dsarl_dataloader_free(tr->loader);
    dsarl_dataset_free(tr->train_set);
    dsarl_dataset_free(tr->val_set);
}

/* Restores the newest complete checkpoint, if any, and opens the metrics. */
static int trainer_start(sft_trainer *tr, dsarl_error *err)
{
    tr->log_cfg.progress = 0; // one log line per step instead
    tr->log_cfg.total_steps = tr->total_steps;
    dsarl_trainer_state st;
    DSARL_TRY(dsarl_session_start(&tr->session, &tr->ckpt, tr->loader, &tr->log_cfg, &st, err));
    tr->log = tr->session.log;
    if (st.step < 0)
        return DSARL_OK;
    tr->step = st.step;
    tr->consumed_samples = st.consumed_samples;
    tr->train_time_s = st.total_train_time_s;
    dsarl_error absent;
    tr->has_val = dsarl_trainer_state_get_metric(&st, "val:loss", &tr->val_loss, &absent) == 0 &&
                  dsarl_trainer_state_get_metric(&st, "val:accuracy", &tr->val_accuracy, &absent) == 0;
    if (dsarl_trainer_state_get_metric(&st, "train:loss", &tr->train_loss, &absent) != 0)
        tr->train_loss = NAN;
    return DSARL_OK;
}

static int save_checkpoint(sft_trainer *tr, dsarl_error *err)
{
    dsarl_trainer_state st;
    memset(&st, 0, sizeof st);
    st.step = tr->step;
    st.consumed_samples = tr->consumed_samples;
    st.total_train_time_s = tr->train_time_s;
    DSARL_TRY(dsarl_trainer_state_set_loader(&st, "train", dsarl_dataloader_get_state(tr->loader), err));
    if (isfinite(tr->train_loss))
        DSARL_TRY(dsarl_trainer_state_set_metric(&st, "train:loss", tr->train_loss, err));
    if (tr->has_val) {
        DSARL_TRY(dsarl_trainer_state_set_metric(&st, "val:loss", tr->val_loss, err));
        DSARL_TRY(dsarl_trainer_state_set_metric(&st, "val:val_loss", tr->val_loss, err)); // NeMo SFT's name
        DSARL_TRY(dsarl_trainer_state_set_metric(&st, "val:accuracy", tr->val_accuracy, err));
    }
    return dsarl_session_save_checkpoint(&tr->session, &tr->ckpt, &st, NULL, 0, err);
}

/* --- batches ------------------------------------------------------------------------------------------------- */

typedef struct packed {
    int32_t *tokens, *targets, *cu;
    float *values; /* (T) dlogprobs in, or log-probs out */
    int64_t n_tokens;
    int32_t n_seqs;
} packed;

static void packed_free(packed *p)
{
    free(p->tokens), free(p->targets), free(p->cu), free(p->values);
    memset(p, 0, sizeof *p);
}

// Packs samples[0..n) as THD.
static int pack(const sft_sample *samples, int64_t n, packed *p, dsarl_error *err)
{
    memset(p, 0, sizeof *p);
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++)
        total += samples[i].n;
    p->tokens = malloc(sizeof(int32_t) * (size_t)total);
    p->targets = malloc(sizeof(int32_t) * (size_t)total);
    p->values = calloc((size_t)total, sizeof(float));
    p->cu = malloc(sizeof(int32_t) * (size_t)(n + 1));
    if (!p->tokens || !p->targets || !p->values || !p->cu) {
        packed_free(p);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "sft: out of memory packing %" PRId64 " tokens", total);
    }
    p->cu[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        memcpy(p->tokens + p->cu[i], samples[i].tokens, sizeof(int32_t) * (size_t)samples[i].n);
        memcpy(p->targets + p->cu[i], samples[i].targets, sizeof(int32_t) * (size_t)samples[i].n);
        p->cu[i + 1] = p->cu[i] + samples[i].n;
    }
    p->n_tokens = total;
    p->n_seqs = (int32_t)n;
    return DSARL_OK;
}

static dsarl_token_batch as_batch(const packed *p)
{
    dsarl_token_batch b = {.struct_size = sizeof b, .n_tokens = p->n_tokens, .n_sequences = p->n_seqs,
                           .tokens = p->tokens, .cu_seqlens = p->cu};
    return b;
}

static int build_samples(sft_trainer *tr, const dsarl_example *const *examples, int64_t n, sft_sample *out,
                         dsarl_error *err)
{
    for (int64_t i = 0; i < n; i++) {
        int rc = sft_build_sample(tr->tok, tr->chat_template, tr->cfg.answer_format, examples[i],
                                  tr->cfg.max_seq_len, &out[i], err);
        if (rc) {
            for (int64_t j = 0; j < i; j++)
                sft_sample_free(&out[j]);
            return rc;
        }
    }
    return DSARL_OK;
}

// Sum of -logp over the answer tokens of samples[0..n) in microbatches of micro (log-probs only).
static int answer_nll(sft_trainer *tr, const sft_sample *samples, int64_t n, int64_t micro, double *nll,
                      dsarl_error *err)
{
    *nll = 0.0;
    for (int64_t first = 0; first < n; first += micro) {
        int64_t m = n - first < micro ? n - first : micro;
        packed p;
        DSARL_TRY(pack(samples + first, m, &p, err));
        dsarl_token_batch b = as_batch(&p);
        int rc = tr->ops->forward_logprobs(tr->model, &b, p.targets, p.values, err);
        for (int64_t t = 0; rc == 0 && t < p.n_tokens; t++)
            if (p.targets[t] >= 0)
                *nll -= p.values[t];
        packed_free(&p);
        DSARL_TRY(rc);
    }
    return DSARL_OK;
}

/* --- validation ---------------------------------------------------------------------------------------------- */

// Greedy completions of samples[0..n) (sft_greedy.c), counted where they equal the answer.
static int greedy_correct(sft_trainer *tr, const sft_sample *samples, int64_t n, int64_t *correct, dsarl_error *err)
{
    char **texts = calloc((size_t)n, sizeof *texts);
    if (!texts)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "sft: out of memory for greedy validation");
    int rc = sft_greedy_complete(tr->ops, tr->model, tr->tok, samples, n, tr->cfg.max_new_tokens, texts, err);
    *correct = 0;
    for (int64_t i = 0; rc == 0 && i < n; i++) {
        *correct += sft_answer_matches(texts[i], samples[i].answer);
        if (i == 0)
            dsarl_log(DSARL_LOG_DEBUG, "sft: greedy completion \"%s\", target \"%s\"", texts[i], samples[i].answer);
    }
    for (int64_t i = 0; i < n; i++)
        free(texts[i]);
    free(texts);
    return rc;
}

// Mean answer-token NLL and greedy exact-match accuracy over the first val_batches batches of the validation set.
static int validate(sft_trainer *tr, dsarl_error *err)
{
    if (!tr->val_set)
        return DSARL_OK;
    int64_t size = (int64_t)dsarl_dataset_size(tr->val_set), vb = tr->cfg.val_global_batch_size;
    int64_t n = tr->cfg.val_batches > 0 && tr->cfg.val_batches * vb < size ? tr->cfg.val_batches * vb : size;
    double nll_sum = 0.0, tokens = 0.0;
    int64_t correct = 0;
    double t0 = now_s();
    for (int64_t batch_first = 0; batch_first < n; batch_first += vb) {
        // this rank's share of the batch (all of it in a single process)
        int64_t lo, hi;
        dp_share(tr, n - batch_first < vb ? n - batch_first : vb, &lo, &hi);
        int64_t first = batch_first + lo, m = hi - lo;
        sft_sample *samples = calloc((size_t)(m ? m : 1), sizeof *samples);
        const dsarl_example **ex = calloc((size_t)(m ? m : 1), sizeof *ex);
        int rc = (!samples || !ex) ? DSARL_FAIL(err, DSARL_E_NOMEM, "sft: out of memory for validation") : DSARL_OK;
        for (int64_t i = 0; rc == 0 && i < m; i++)
            ex[i] = dsarl_dataset_get(tr->val_set, (size_t)(first + i));
        if (rc == 0)
            rc = build_samples(tr, ex, m, samples, err);
        double nll = 0;
        if (rc == 0)
            rc = answer_nll(tr, samples, m, tr->cfg.val_micro_batch_size, &nll, err);
        for (int64_t i = 0; rc == 0 && i < m; i++)
            tokens += samples[i].n_answer;
        nll_sum += nll;
        for (int64_t first_mb = 0; rc == 0 && first_mb < m; first_mb += tr->cfg.val_micro_batch_size) {
            int64_t k = m - first_mb < tr->cfg.val_micro_batch_size ? m - first_mb : tr->cfg.val_micro_batch_size;
            int64_t c = 0;
            rc = greedy_correct(tr, samples + first_mb, k, &c, err);
            correct += c;
        }
        for (int64_t i = 0; samples && rc == 0 && i < m; i++)
            sft_sample_free(&samples[i]);
        free(samples);
        free(ex);
        DSARL_TRY(rc);
    }
    double sums[3] = {nll_sum, tokens, (double)correct};
    DSARL_TRY(dsarl_group_all_reduce_host(dp_group(tr), sums, 3, DSARL_DTYPE_F64, DSARL_REDUCE_SUM, err));
    nll_sum = sums[0], tokens = sums[1], correct = (int64_t)sums[2];
    tr->val_loss = tokens > 0 ? nll_sum / tokens : NAN;
    tr->val_accuracy = n > 0 ? (double)correct / (double)n : NAN;
    tr->has_val = true;
    DSARL_TRY(dsarl_metrics_set(tr->log, "val/loss", tr->val_loss, err));
    DSARL_TRY(dsarl_metrics_set(tr->log, "val/accuracy", tr->val_accuracy, err));
    DSARL_TRY(dsarl_metrics_set(tr->log, "timing/validation/total_validation_time", now_s() - t0, err));
    dsarl_log(DSARL_LOG_INFO, "sft: validation at step %" PRId64 ": loss %.4f accuracy %.4f (%" PRId64 "/%" PRId64
              " exact) in %.1f s", tr->step, tr->val_loss, tr->val_accuracy, correct, n, now_s() - t0);
    return DSARL_OK;
}

/* --- one step ------------------------------------------------------------------------------------------------ */

// The loss callback of a step's microbatches: the NLL of the answer tokens, normalised by the global batch's count.
typedef struct step_nll {
    double n_answer, nll;
} step_nll;

static int answer_loss(void *user, int32_t index, dsarl_train_microbatch *m, dsarl_error *err)
{
    (void)index, (void)err;
    step_nll *a = user;
    for (int64_t t = 0; t < m->batch->n_tokens; t++) {
        a->nll -= m->targets[t] >= 0 ? m->logprobs[t] : 0.0f;
        m->dlogprobs[t] = m->targets[t] >= 0 ? (float)(-1.0 / a->n_answer) : 0.0f; // d loss / d logp
    }
    return DSARL_OK;
}

static int train_step(sft_trainer *tr, dsarl_error *err)
{
    const dsarl_model_ops *ops = tr->ops;
    int64_t gb = tr->cfg.global_batch, mb = tr->cfg.micro_batch;
    const dsarl_example **batch = calloc((size_t)gb, sizeof *batch);
    sft_sample *samples = calloc((size_t)gb, sizeof *samples);
    if (!batch || !samples) {
        free(batch), free(samples);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "sft: out of memory for a batch of %" PRId64, gb);
    }
    size_t got = 0;
    int rc = dsarl_dataloader_next(tr->loader, batch, NULL, &got, NULL, err);
    if (rc == 0 && (int64_t)got != gb)
        rc = DSARL_FAIL(err, DSARL_E_INTERNAL, "sft: the dataloader returned %zu samples, expected %" PRId64, got, gb);
    if (rc == 0)
        rc = build_samples(tr, batch, gb, samples, err);
    else
        gb = 0; // nothing built
    // the loss is normalised by the global batch's answer tokens, so the microbatch gradients add up to it
    double n_answer = 0, nll = 0;
    for (int64_t i = 0; rc == 0 && i < gb; i++)
        n_answer += samples[i].n_answer;
    if (rc == 0 && n_answer == 0)
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "sft: no answer token fits policy.max_total_sequence_length (%" PRId64
                        ") in this batch; raise it", tr->cfg.max_seq_len);
    if (rc == 0)
        rc = ops->zero_grad(tr->model, err);
    double indexer_loss = 0, mtp_loss = 0;
    dsarl_pass_counts passes = {0, 0};
    // this rank's share: whole microbatches (check_parallel), the same ones the one-process run makes
    int64_t lo, hi;
    dp_share(tr, gb, &lo, &hi);
    // every microbatch of the share at once: the pipeline schedule keeps several in flight
    int64_t n_mb = hi > lo ? (hi - lo) / mb : 0;
    packed *pk = calloc((size_t)(n_mb > 0 ? n_mb : 1), sizeof *pk);
    dsarl_token_batch *bs = calloc((size_t)(n_mb > 0 ? n_mb : 1), sizeof *bs);
    dsarl_train_microbatch *mbs = calloc((size_t)(n_mb > 0 ? n_mb : 1), sizeof *mbs);
    if (rc == 0 && (!pk || !bs || !mbs))
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "sft: out of memory for %" PRId64 " microbatches", n_mb);
    for (int64_t i = 0; rc == 0 && i < n_mb; i++) {
        rc = pack(samples + lo + i * mb, mb, &pk[i], err);
        bs[i] = as_batch(&pk[i]);
        // the log-probs come back in values, and the loss overwrites them with their gradient
        // an MTP loss (models that train MTP layers) over the answer tokens, divided by their count like the NLL
        mbs[i] = (dsarl_train_microbatch){.struct_size = sizeof mbs[i], .batch = &bs[i], .targets = pk[i].targets,
                                          .logprobs = pk[i].values, .dlogprobs = pk[i].values,
                                          .norm_tokens = (double)n_answer};
    }
    step_nll an = {.n_answer = n_answer, .nll = 0};
    if (rc == 0)
        rc = dsarl_trainer_train_microbatches(ops, tr->model, tr->ctx->parallel, mbs, (int32_t)n_mb, answer_loss,
                                              &an, &passes, err);
    nll = an.nll;
    for (int64_t i = 0; rc == 0 && i < n_mb; i++)
        indexer_loss += mbs[i].indexer_loss * (double)mb / (double)gb,
        mtp_loss += mbs[i].mtp_loss; // each a share of the step's mean
    for (int64_t i = 0; pk && i < n_mb; i++)
        packed_free(&pk[i]);
    free(pk), free(bs), free(mbs);
    // the summed NLL, indexer loss and pass counts of every rank's share; failures first, so no rank is left
    // waiting in the optimizer step's reduction of a peer that gave up
    double sums[6] = {nll, indexer_loss, (double)passes.forward_tokens, (double)passes.train_pass_tokens, rc != 0,
                      mtp_loss};
    if (dsarl_group_size(dp_group(tr)) > 1) {
        dsarl_error e;
        if (dsarl_group_all_reduce_host(dp_group(tr), sums, 6, DSARL_DTYPE_F64, DSARL_REDUCE_SUM, &e) < 0 && !rc)
            rc = DSARL_FAIL(err, e.code, "%s", e.message);
        if (rc == 0 && sums[4] > 0)
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "sft: another data-parallel rank failed its microbatches (its log "
                            "names why)");
    }
    nll = sums[0], indexer_loss = sums[1], mtp_loss = sums[5];
    passes.forward_tokens = (int64_t)sums[2], passes.train_pass_tokens = (int64_t)sums[3];
    double norm = 0;
    double lr = dsarl_lr_at(&tr->cfg.lr_schedule, tr->step);
    if (rc == 0) {
        bool skipped; // a non-finite loss or norm: no update, reported by the guard (ends the run when repeated)
        rc = dsarl_session_optimizer_step(&tr->session, &tr->adam, lr, tr->cfg.lr_schedule.max_grad_norm,
                                          "train/loss", n_answer > 0 ? nll / n_answer : 0.0, &norm, &skipped, err);
    }
    for (int64_t i = 0; i < gb; i++)
        sft_sample_free(&samples[i]);
    free(samples);
    free(batch);
    DSARL_TRY(rc);
    tr->step++;
    tr->consumed_samples += gb;
    tr->train_loss = nll / n_answer;
    DSARL_TRY(dsarl_metrics_set(tr->log, "train/loss", tr->train_loss, err));
    DSARL_TRY(dsarl_metrics_set(tr->log, "train/grad_norm", norm, err));
    DSARL_TRY(dsarl_metrics_set(tr->log, "train/lr", lr, err));
    DSARL_TRY(dsarl_metrics_set(tr->log, "train/num_answer_tokens", n_answer, err));
    DSARL_TRY(dsarl_metrics_set(tr->log, "train/indexer_loss", indexer_loss, err));
    float last_mtp;
    if (DSARL_MODEL_HAS(ops, mtp_loss) && ops->mtp_loss(tr->model, NULL, 0.0, &last_mtp) > 0) // trains MTP layers
        DSARL_TRY(dsarl_metrics_set(tr->log, "train/mtp_loss", mtp_loss, err));
    DSARL_TRY(dsarl_metrics_set(tr->log, "train/forward_tokens", (double)passes.forward_tokens, err));
    DSARL_TRY(dsarl_metrics_set(tr->log, "train/train_pass_tokens", (double)passes.train_pass_tokens, err));
    return DSARL_OK;
}

/* --- the job ------------------------------------------------------------------------------------------------- */

static int train_loop(sft_trainer *tr, double run_start, dsarl_error *err)
{
    const dsarl_run_context *ctx = tr->ctx;
    if (tr->step == 0 && tr->cfg.val_at_start && tr->val_set) {
        DSARL_TRY(validate(tr, err));
        DSARL_TRY(dsarl_metrics_commit(tr->log, 0, err));
    }
    int64_t first_step = tr->step;
    while (tr->step < tr->total_steps) {
        double t0 = now_s();
        DSARL_TRY(train_step(tr, err));
        double t_train = now_s() - t0;
        bool last = tr->step == tr->total_steps;
        bool validated = (tr->cfg.val_period > 0 && tr->step % tr->cfg.val_period == 0) ||
                         (last && tr->cfg.val_at_end);
        if (validated)
            DSARL_TRY(validate(tr, err));
        double step_s = now_s() - t0;
        tr->train_time_s += step_s;
        bool stop = any_rank(tr, ctx->stop_requested && *ctx->stop_requested);
        bool deadline = any_rank(tr, dsarl_trainer_deadline_near(&tr->ckpt, now_s() - run_start,
                                                                 tr->step - first_step));
        if (tr->ckpt.enabled && (dsarl_checkpoint_due(&tr->ckpt, tr->step, last) || stop || deadline)) {
            double c0 = now_s();
            DSARL_TRY(save_checkpoint(tr, err));
            DSARL_TRY(dsarl_metrics_set(tr->log, "timing/train/checkpointing", now_s() - c0, err));
            step_s += now_s() - c0;
        }
        DSARL_TRY(dsarl_metrics_set(tr->log, "timing/train/policy_training", t_train, err));
        DSARL_TRY(dsarl_metrics_set(tr->log, "timing/train/total_step_time", step_s, err));
        DSARL_TRY(dsarl_metrics_commit(tr->log, tr->step, err));
        double eta = (double)(tr->total_steps - tr->step) * (now_s() - run_start) /
                     (double)(tr->step - (tr->log_cfg.resume_step > 0 ? tr->log_cfg.resume_step : 0));
        char val[96] = "";
        if (validated && tr->val_set)
            snprintf(val, sizeof val, ", val loss %.4f accuracy %.3f", tr->val_loss, tr->val_accuracy);
        dsarl_log(DSARL_LOG_INFO, "sft step %" PRId64 "/%" PRId64 ": loss %.4f, lr %.3g, %.2f s, ETA %.0f s%s",
                  tr->step, tr->total_steps, tr->train_loss, dsarl_lr_at(&tr->cfg.lr_schedule, tr->step - 1), step_s,
                  eta, val);
        if (stop) {
            dsarl_log(DSARL_LOG_INFO, "sft: stop requested: stopped after step %" PRId64, tr->step);
            return DSARL_OK;
        }
        if (deadline) {
            dsarl_log(DSARL_LOG_WARN, "sft: checkpointing.checkpoint_must_save_by is near: saved step %" PRId64
                      " and stopped", tr->step);
            return DSARL_OK;
        }
    }
    return DSARL_OK;
}

int sft_run(const dsarl_run_context *ctx, dsarl_error *err)
{
    double run_start = now_s();
    sft_trainer tr;
    memset(&tr, 0, sizeof tr);
    tr.ctx = ctx;
    tr.ops = ctx->model_ops;
    tr.root = ctx->recipe;
    tr.train_loss = NAN;
    // everything that reads only the recipe first, so a bad value fails before any model is built
    int rc = sft_config_from_recipe(tr.root, &tr.cfg, err);
    if (rc == 0)
        rc = dsarl_optimizer_params_from_recipe(tr.root, &tr.adam, err);
    if (rc == 0)
        rc = dsarl_checkpoint_config_from_recipe(tr.root, &tr.ckpt, err);
    if (rc == 0)
        rc = dsarl_metrics_config_from_recipe(tr.root, &tr.log_cfg, err);
    if (rc == 0)
        rc = check_parallel(&tr, err);
    if (rc == 0)
        rc = trainer_open(&tr, err);
    if (rc == 0)
        rc = trainer_start(&tr, err);
    if (rc == 0) {
        dsarl_log(DSARL_LOG_INFO, "sft: %" PRId64 " steps of %" PRId64 " samples (micro %" PRId64 "), template %s, "
                  "logs in %s", tr.total_steps, tr.cfg.global_batch, tr.cfg.micro_batch, tr.chat_template,
                  tr.log ? dsarl_metrics_dir(tr.log) : "(rank 0's)");
        rc = train_loop(&tr, run_start, err);
    }
    trainer_free(&tr);
    return rc;
}
