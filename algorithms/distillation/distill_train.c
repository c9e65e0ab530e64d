#define _POSIX_C_SOURCE 200809L /* clock_gettime */
/* distill_train.c: NeMo RL's on-policy distillation loop on the GRPO loop's machinery (grpo_loop.h): per step the
 * student generates responses to the dataset's prompts with the generation engine (rollouts scored by the
 * environment only for the logs), the frozen teacher scores every response position with its top-k logits, and
 * per train_global_batch_size slice the student's microbatches run DistillationLossFn (distill_loss.c) and one
 * optimizer step.
 *
 * The teacher is a second model of the student's family, built by the model plugin from teacher.model_name on the
 * student's device and DSA backend, and only ever runs forward_logits: no backward, so no optimizer state.
 * The model API's backward takes d loss / d log p(target) for one target per position; the loss needs k per
 * position, so the student's training microbatch is the batch repeated k times, copy j targeting the teacher's
 * j-th token. One backward of that batch is the sum of the k gradients, and the indexer loss (a token mean) keeps
 * its weight. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distill.h"
#include "dsarl/fileutil.h"
#include "grpo_loop.h"

typedef struct distiller {
    trainer tr;             /* the student's session, data, environment, engine and logger */
    distill_config cfg;
    dsarl_model *teacher;
    int32_t k;
} distiller;

/* What one training step's slices return for the logs (sums over slices; divide by n_slices). */
typedef struct distill_stats {
    distill_loss_metrics loss;
    double grad_norm, lr, indexer_loss, valid_toks;
    int64_t n_slices;
} distill_stats;

/* The packed batch's per-position teacher top-k: indices and logits (T, k). */
typedef struct teacher_topk {
    int32_t *idx;
    float *logits;
} teacher_topk;

static int refuse_parallel(const dsarl_run_context *ctx, dsarl_error *err)
{
    const dsarl_parallel *p = ctx->parallel;
    if (p && (p->dp_size > 1 || p->tp_size > 1 || p->pp_size > 1 || p->cp_size > 1 || p->ep_size > 1))
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "algorithm distillation runs in one process only for now "
                          "(got dp %d tp %d pp %d cp %d ep %d): launch one process (no mpirun or srun), with "
                          "cluster.num_nodes, cluster.gpus_per_node and policy.megatron_cfg's "
                          "*_model_parallel_size at 1", p->dp_size, p->tp_size, p->pp_size, p->cp_size, p->ep_size);
    return DSARL_OK;
}

static int open_teacher(distiller *d, dsarl_error *err)
{
    trainer *tr = &d->tr;
    const dsarl_model_ops *ops = tr->session.model_ops;
    char cfg_path[4200];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", d->cfg.teacher_dir);
    if (!dsarl_path_exists(cfg_path))
        return dsarl_recipe_fail(tr->root, "teacher.model_name", err, DSARL_E_NOT_FOUND,
                                 "names '%s', which holds no config.json (a checkpoint directory of the student's "
                                 "model family is needed)", d->cfg.teacher_dir);
    dsarl_model_config mc = {.struct_size = sizeof mc, .host = tr->ctx->host, .recipe = tr->root,
                             .model_dir = d->cfg.teacher_dir, .device_ops = tr->session.config.device_ops,
                             .device = tr->session.device, .dsa_ops = tr->session.config.dsa_ops,
                             .dsa = tr->session.dsa, .parallel = tr->ctx->parallel,
                             .seed = (uint64_t)tr->cfg.seed};
    DSARL_TRY(ops->create(&mc, &d->teacher, err));
    int64_t vs = ops->vocab_size(tr->model), vt = ops->vocab_size(d->teacher);
    if (vs != vt)
        return dsarl_recipe_fail(tr->root, "teacher.model_name", err, DSARL_E_INVALID,
                                 "'%s' has a vocabulary of %" PRId64 " tokens, the student %" PRId64 ": they must "
                                 "share one tokenizer", d->cfg.teacher_dir, vt, vs);
    if (d->k > vt)
        return dsarl_recipe_fail(tr->root, "distillation.topk_logits_k", err, DSARL_E_INVALID,
                                 "(%d) must not exceed the vocabulary size %" PRId64, d->k, vt);
    int64_t pt = 0, bt = 0, ps = 0, bs = 0;
    DSARL_TRY(ops->parameter_count(d->teacher, &pt, &bt, err));
    DSARL_TRY(ops->parameter_count(tr->model, &ps, &bs, err));
    dsarl_log(DSARL_LOG_INFO, "distillation: teacher %s (%" PRId64 " parameters), student %" PRId64
              " parameters, top-%d logits", d->cfg.teacher_dir, pt, ps, d->k);
    return DSARL_OK;
}

/* The teacher's top-k logits at every trained position, logprob_batch_size sequences per forward. Positions that
 * do not train keep index 0 (their targets are -1 in the student pass). */
static int teacher_scores(distiller *d, const packed_batch *p, teacher_topk *out, dsarl_error *err)
{
    trainer *tr = &d->tr;
    const dsarl_model_ops *ops = tr->session.model_ops;
    const int32_t k = d->k;
    int64_t V = ops->vocab_size(d->teacher), nb = tr->opt.logprob_batch, max_T = 0;
    for (int64_t s = 0; s < p->B; s += nb) {
        int64_t e = s + nb < p->B ? s + nb : p->B;
        max_T = p->cu[e] - p->cu[s] > max_T ? p->cu[e] - p->cu[s] : max_T;
    }
    out->idx = calloc((size_t)(p->T * k), sizeof(int32_t));
    out->logits = calloc((size_t)(p->T * k), sizeof(float));
    float *logits = malloc(sizeof(float) * (size_t)(max_T * V > 0 ? max_T * V : 1)); // (T_mb, V)
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(nb + 1));
    int rc = out->idx && out->logits && logits && cu
                 ? DSARL_OK
                 : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for the teacher's logits of %" PRId64 " tokens",
                              max_T);
    for (int64_t s = 0; rc == DSARL_OK && s < p->B; s += nb) {
        int64_t e = s + nb < p->B ? s + nb : p->B, base = p->cu[s];
        for (int64_t i = s; i <= e; i++)
            cu[i - s] = p->cu[i] - (int32_t)base;
        dsarl_token_batch b = {.struct_size = sizeof b, .n_tokens = p->cu[e] - base, .n_sequences = (int32_t)(e - s),
                               .tokens = p->tokens + base, .cu_seqlens = cu,
                               .logit_scale = 1.0f / tr->opt.temperature};
        rc = ops->forward_logits(d->teacher, &b, logits, err);
        tr->passes.forward_tokens += b.n_tokens;
        for (int64_t t = 0; rc == DSARL_OK && t < b.n_tokens; t++)
            if (p->mask[base + t] != 0.0f)
                distill_topk(logits + t * V, V, k, out->idx + (base + t) * k, out->logits + (base + t) * k);
    }
    free(logits);
    free(cu);
    return rc;
}

/* One microbatch of the student pass: sequences [s0, s1) repeated k times. */
typedef struct repeated_batch {
    int64_t T;          /* tokens of one copy */
    int32_t *tokens, *cu, *targets; /* (k T), (k B + 1), (k T) */
    float *lp, *dlp;    /* (k T): copy j at [j T, (j + 1) T) */
    dsarl_token_batch batch;
} repeated_batch;

static void repeated_free(repeated_batch *r)
{
    free(r->tokens), free(r->cu), free(r->targets), free(r->lp), free(r->dlp);
    memset(r, 0, sizeof *r);
}

static int repeat_microbatch(const distiller *d, const packed_batch *p, const teacher_topk *top, int64_t s0,
                             int64_t s1, repeated_batch *r, dsarl_error *err)
{
    const int32_t k = d->k;
    int64_t base = p->cu[s0], T = p->cu[s1] - base, B = s1 - s0;
    memset(r, 0, sizeof *r);
    r->T = T;
    r->tokens = malloc(sizeof(int32_t) * (size_t)(k * T));
    r->targets = malloc(sizeof(int32_t) * (size_t)(k * T));
    r->cu = malloc(sizeof(int32_t) * (size_t)(k * B + 1));
    r->lp = calloc((size_t)(k * T), sizeof(float));
    r->dlp = calloc((size_t)(k * T), sizeof(float));
    if (!r->tokens || !r->targets || !r->cu || !r->lp || !r->dlp) {
        repeated_free(r);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for a %d-fold microbatch of %" PRId64 " tokens", k, T);
    }
    for (int32_t j = 0; j < k; j++) {
        memcpy(r->tokens + j * T, p->tokens + base, sizeof(int32_t) * (size_t)T);
        for (int64_t t = 0; t < T; t++)
            r->targets[j * T + t] = p->mask[base + t] != 0.0f ? top->idx[(base + t) * k + j] : -1;
        for (int64_t s = 0; s < B; s++)
            r->cu[j * B + s] = (int32_t)(j * T) + p->cu[s0 + s] - (int32_t)base;
    }
    r->cu[k * B] = (int32_t)(k * T);
    // log-probs of the tempered distribution the rollouts were drawn from, as the GRPO training pass
    r->batch = (dsarl_token_batch){.struct_size = sizeof r->batch, .n_tokens = k * T, .n_sequences = (int32_t)(k * B),
                                   .tokens = r->tokens, .cu_seqlens = r->cu,
                                   .logit_scale = 1.0f / d->tr.opt.temperature};
    return DSARL_OK;
}

typedef struct slice_loss {
    const distiller *d;
    const packed_batch *p;
    const teacher_topk *top;
    const int64_t *first_seq; /* (n + 1) */
    repeated_batch *reps;
    double valid_toks;
    distill_loss_metrics *m;
} slice_loss;

/* dsarl_microbatch_loss_fn: regroups the k copies' log-probs per position, runs the loss, scatters the gradient. */
static int microbatch_loss(void *user, int32_t i, dsarl_train_microbatch *mb, dsarl_error *err)
{
    slice_loss *sl = user;
    const int32_t k = sl->d->k;
    const packed_batch *p = sl->p;
    const repeated_batch *r = &sl->reps[i];
    int64_t base = p->cu[sl->first_seq[i]], T = r->T;
    float *lp = malloc(sizeof(float) * (size_t)(T * k)), *grad = malloc(sizeof(float) * (size_t)(T * k));
    int rc = lp && grad ? DSARL_OK : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for %" PRId64 " positions", T);
    for (int64_t t = 0; rc == DSARL_OK && t < T; t++)
        for (int32_t j = 0; j < k; j++)
            lp[t * k + j] = mb->logprobs[j * T + t];
    distill_loss_inputs in = {.n_positions = T, .k = k, .lp_student = lp, .teacher_logits = sl->top->logits + base * k,
                              .mask = p->mask + base, .global_valid_toks = sl->valid_toks};
    double loss;
    distill_loss_metrics m;
    if (rc == DSARL_OK)
        rc = distill_loss(&sl->d->cfg.loss, &in, &loss, grad, &m, err);
    for (int64_t t = 0; rc == DSARL_OK && t < T; t++)
        for (int32_t j = 0; j < k; j++)
            mb->dlogprobs[j * T + t] = grad[t * k + j];
    if (rc == DSARL_OK) {
        sl->m->loss += m.loss, sl->m->forward_kl += m.forward_kl, sl->m->reverse_kl += m.reverse_kl;
        sl->m->student_topk_mass += m.student_topk_mass;
    }
    free(lp);
    free(grad);
    return rc;
}

/* One optimizer step over sequences [g0, g1): its microbatches, then the guarded optimizer step. */
static int train_slice(distiller *d, const packed_batch *p, const teacher_topk *top, int64_t g0, int64_t g1,
                       distill_stats *st, dsarl_error *err)
{
    trainer *tr = &d->tr;
    const dsarl_model_ops *ops = tr->session.model_ops;
    int64_t mbs = tr->opt.micro_batch, n = (g1 - g0 + mbs - 1) / mbs;
    double valid = 0.0;
    for (int64_t t = p->cu[g0]; t < p->cu[g1]; t++)
        valid += p->mask[t];
    int64_t *first = malloc(sizeof(int64_t) * (size_t)(n + 1));
    repeated_batch *reps = calloc((size_t)n, sizeof *reps);
    dsarl_train_microbatch *mb = calloc((size_t)n, sizeof *mb);
    int rc = first && reps && mb ? DSARL_OK
                                 : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for %" PRId64 " microbatches", n);
    for (int64_t i = 0; rc == DSARL_OK && i <= n; i++)
        first[i] = g0 + i * mbs < g1 ? g0 + i * mbs : g1;
    for (int64_t i = 0; rc == DSARL_OK && i < n; i++) {
        rc = repeat_microbatch(d, p, top, first[i], first[i + 1], &reps[i], err);
        if (rc == DSARL_OK)
            mb[i] = (dsarl_train_microbatch){.struct_size = sizeof mb[i], .batch = &reps[i].batch,
                                             .targets = reps[i].targets, .logprobs = reps[i].lp,
                                             .dlogprobs = reps[i].dlp};
    }
    distill_loss_metrics m = {0};
    slice_loss sl = {.d = d, .p = p, .top = top, .first_seq = first, .reps = reps, .valid_toks = valid, .m = &m};
    if (rc == DSARL_OK)
        rc = ops->zero_grad(tr->model, err);
    if (rc == DSARL_OK)
        rc = dsarl_trainer_train_microbatches(ops, tr->model, tr->ctx->parallel, mb, (int32_t)n, microbatch_loss, &sl,
                                              &tr->passes, err);
    double indexer = 0.0, norm = 0.0;
    for (int64_t i = 0; rc == DSARL_OK && i < n; i++)
        indexer += mb[i].indexer_loss;
    double lr = dsarl_lr_at(&tr->cfg.lr_schedule, ops->optimizer_steps ? ops->optimizer_steps(tr->model) : 0);
    bool skipped;
    if (rc == DSARL_OK)
        rc = dsarl_session_optimizer_step(&tr->session, &tr->adam, lr, tr->cfg.lr_schedule.max_grad_norm, "train/loss",
                                          m.loss, &norm, &skipped, err);
    if (rc == DSARL_OK) {
        st->loss.loss += m.loss, st->loss.forward_kl += m.forward_kl, st->loss.reverse_kl += m.reverse_kl;
        st->loss.student_topk_mass += m.student_topk_mass;
        st->grad_norm += norm, st->lr = lr, st->indexer_loss += indexer, st->valid_toks += valid;
        st->n_slices++;
    }
    for (int64_t i = 0; reps && i < n; i++)
        repeated_free(&reps[i]);
    free(first), free(reps), free(mb);
    return rc;
}

static int distill_step(distiller *d, bool *out_of_epochs, dsarl_error *err)
{
    trainer *tr = &d->tr;
    double t0 = now_s();
    rollout_set rs = {0};
    packed_batch p = {0};
    teacher_topk top = {0};
    distill_stats st = {0};
    int64_t rounds = 0, epoch = 0;
    memset(&tr->passes, 0, sizeof tr->passes);
    tr->verifier_failures = 0;
    dsarl_dataloader_state before = dsarl_dataloader_get_state(tr->loader);
    int64_t next_epoch = before.epoch +
                         (before.cursor >= dsarl_dataloader_batches_per_epoch(tr->loader) * tr->per_round);
    *out_of_epochs = next_epoch >= tr->cfg.max_num_epochs;
    if (*out_of_epochs)
        return DSARL_OK;
    int rc = grpo_collect_rollouts(tr, &rs, &rounds, &epoch, err);
    double t_gen = now_s();
    if (rc == DSARL_OK)
        rc = grpo_pack_rollouts(tr, &rs, &p, err);
    /* NeMo's mask = token_mask * sample_mask: a prompt cut by data.max_input_seq_length does not train */
    for (int64_t s = 0; rc == DSARL_OK && s < p.B; s++)
        for (int64_t t = p.cu[s]; t < p.cu[s + 1]; t++)
            p.mask[t] *= p.sample_mask[s];
    if (rc == DSARL_OK)
        rc = teacher_scores(d, &p, &top, err);
    double t_teacher = now_s();
    for (int64_t g0 = 0; rc == DSARL_OK && g0 < p.B; g0 += tr->cfg.train_global_batch_size) {
        int64_t g1 = g0 + tr->cfg.train_global_batch_size < p.B ? g0 + tr->cfg.train_global_batch_size : p.B;
        rc = train_slice(d, &p, &top, g0, g1, &st, err);
    }
    double t_train = now_s();
    if (rc == DSARL_OK) {
        tr->step++;
        double reward = 0, correct = 0, gen_len = 0, trunc = 0, n = (double)rs.n, k = (double)st.n_slices;
        for (int64_t i = 0; i < rs.n; i++) {
            reward += rs.items[i].raw_reward;
            correct += rs.items[i].verdict == DSARL_VERDICT_CORRECT;
            gen_len += rs.items[i].response_len;
            trunc += rs.items[i].truncated;
        }
        struct { const char *name; double v; } rows[] = {
            {"train/loss", st.loss.loss / k},
            {"train/kl_to_teacher", st.loss.reverse_kl / k},
            {"train/forward_kl_to_teacher", st.loss.forward_kl / k},
            {"train/student_topk_mass", st.loss.student_topk_mass / k},
            {"train/reward", reward / n},
            {"train/accuracy", correct / n},
            {"train/grad_norm", st.grad_norm / k},
            {"train/lr", st.lr},
            {"train/indexer_loss", st.indexer_loss / k},
            {"train/num_valid_tokens", st.valid_toks},
            {"train/mean_gen_length", gen_len / n},
            {"train/truncation_rate", trunc / n},
            {"train/total_num_tokens", (double)p.T},
            {"train/forward_tokens", (double)tr->passes.forward_tokens},
            {"train/train_pass_tokens", (double)tr->passes.train_pass_tokens},
            {"train/epoch", (double)epoch},
            {"timing/train/generation", t_gen - t0},
            {"timing/train/teacher_logits", t_teacher - t_gen},
            {"timing/train/policy_training", t_train - t_teacher},
            {"timing/train/total_step_time", t_train - t0},
        };
        for (size_t i = 0; i < DSARL_ARRAY_LEN(rows) && rc == DSARL_OK; i++)
            rc = grpo_set_metric(tr, rows[i].name, rows[i].v, err);
        tr->train_time_s += t_train - t0;
    }
    free(top.idx);
    free(top.logits);
    grpo_packed_free(&p);
    grpo_rollout_set_free(&rs);
    return rc;
}

int distill_train_run(const dsarl_run_context *ctx, distill_run_summary *summary, dsarl_error *err)
{
    distiller *d = calloc(1, sizeof *d);
    if (!d)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for the distillation trainer");
    trainer *tr = &d->tr;
    tr->ctx = ctx;
    tr->root = ctx->recipe;
    /* everything that reads only the recipe runs first, so a bad value fails before any model is built */
    int rc = distill_config_from_recipe(tr->root, &d->cfg, err);
    if (rc == DSARL_OK) {
        tr->cfg = d->cfg.loop;
        d->k = (int32_t)d->cfg.topk_logits_k;
        rc = grpo_trainer_read_options(tr, err);
    }
    if (rc == DSARL_OK)
        rc = refuse_parallel(ctx, err);
    if (rc == DSARL_OK)
        rc = grpo_trainer_open(tr, err);
    if (rc == DSARL_OK)
        rc = open_teacher(d, err);
    if (rc == DSARL_OK)
        rc = grpo_trainer_start(tr, err);
    int64_t first_step = tr->step;
    val_result vr = {NAN, NAN, NAN};
    if (rc == DSARL_OK && tr->step == 0 && tr->cfg.val_at_start) {
        rc = grpo_validate(tr, &vr, err);
        if (rc == DSARL_OK)
            rc = dsarl_metrics_commit(tr->log, 0, err);
    }
    const char *why = "max_num_steps reached";
    for (bool stop = false; rc == DSARL_OK && !stop && tr->step < tr->cfg.max_num_steps;) {
        bool out_of_epochs;
        rc = distill_step(d, &out_of_epochs, err);
        if (rc < 0)
            break;
        if (out_of_epochs) {
            why = "max_num_epochs reached";
            break;
        }
        bool last = tr->step >= tr->cfg.max_num_steps;
        if (grpo_any_rank(tr, ctx->stop_requested && *ctx->stop_requested)) {
            stop = true;
            why = "stop requested (signal)";
        }
        double val_acc = NAN;
        if ((tr->cfg.val_period > 0 && tr->step % tr->cfg.val_period == 0) || (last && tr->cfg.val_at_end)) {
            vr = (val_result){NAN, NAN, NAN};
            rc = grpo_validate(tr, &vr, err);
            val_acc = vr.accuracy;
        }
        if (rc == DSARL_OK && tr->ckpt.enabled && (dsarl_checkpoint_due(&tr->ckpt, tr->step, last) || stop))
            rc = grpo_trainer_save_checkpoint(tr, val_acc, NAN, err);
        if (rc == DSARL_OK)
            rc = dsarl_metrics_commit(tr->log, tr->step, err);
        dsarl_metrics_progress(tr->log, tr->step, NAN);
    }
    if (rc == DSARL_OK)
        dsarl_log(DSARL_LOG_INFO, "distillation finished at step %" PRId64 ": %s", tr->step, why);
    if (summary) {
        memset(summary, 0, sizeof *summary);
        summary->first_step = first_step;
        summary->last_step = tr->step;
        if (tr->log)
            snprintf(summary->exp_dir, sizeof summary->exp_dir, "%s", dsarl_metrics_dir(tr->log));
    }
    if (d->teacher)
        tr->session.model_ops->destroy(d->teacher);
    grpo_trainer_free(tr);
    free(d);
    return rc;
}
