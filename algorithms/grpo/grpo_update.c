#define _POSIX_C_SOURCE 200809L /* clock_gettime */
/* grpo_update.c: the packed batch -> log-prob passes -> per train_global_batch_size slice: microbatches of
 * ClippedPGLoss + backward (dsarl_trainer_train_microbatches, a loss callback per microbatch), then the optimizer
 * slice tail (dsarl_trainer_optimizer_step). On-policy (one slice) the old log-probs are the training pass's own. */
#include <inttypes.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpo_loop.h"

void grpo_replay_rows(const trainer *tr, const packed_batch *p, int64_t base, dsarl_token_batch *b)
{
    if (p->replay_experts)
        b->replay_experts = p->replay_experts + base * tr->replay_w_experts;
    if (p->replay_indices)
        b->replay_indices = p->replay_indices + base * tr->replay_w_indices;
}

/* Log-probs of sequences [s0, s1) with a model, written at their positions in out: a forward-only pass (under
 * pipeline parallelism the stages run in turn). */
static int logprobs_range(trainer *tr, dsarl_model *model, const packed_batch *p, int64_t s0, int64_t s1, float *out,
                          dsarl_error *err)
{
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(s1 - s0 + 1));
    if (!cu)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for a microbatch of %" PRId64 " sequences", s1 - s0);
    for (int64_t s = s0; s <= s1; s++)
        cu[s - s0] = p->cu[s] - p->cu[s0];
    int64_t base = p->cu[s0];
    // log-probs of the tempered distribution the rollouts were drawn from (NeMo RL divides the logits likewise)
    dsarl_token_batch b = {.struct_size = sizeof b, .n_tokens = p->cu[s1] - base, .n_sequences = (int32_t)(s1 - s0),
                           .tokens = p->tokens + base, .cu_seqlens = cu, .logit_scale = 1.0f / tr->opt.temperature};
    grpo_replay_rows(tr, p, base, &b);
    int rc = dsarl_trainer_forward(tr->ctx->model_ops, model, &b, p->targets + base, out + base, &tr->passes, err);
    free(cu);
    return rc;
}

/* The sequences [*lo, *hi) of optimizer slice [g0, g1) that this data-parallel rank trains on: a contiguous 1/dp
 * of it. train_global_batch_size is a multiple of dp x train_micro_batch_size, so each share of a full slice is
 * whole microbatches: the microbatches (and their per-microbatch indexer loss means) are the one-process run's. */
static void rank_share(const trainer *tr, int64_t g0, int64_t g1, int64_t *lo, int64_t *hi)
{
    const dsarl_group *g = grpo_dp_group(tr);
    int64_t dp = dsarl_group_size(g), r = dsarl_group_rank(g);
    *lo = g0 + (g1 - g0) * r / dp;
    *hi = g0 + (g1 - g0) * (r + 1) / dp;
}

int grpo_logprobs_all(trainer *tr, dsarl_model *model, const packed_batch *p, float *out, dsarl_error *err)
{
    /* only this rank's shares are read by its loss */
    int64_t gbs = tr->cfg.train_global_batch_size;
    for (int64_t g0 = 0; g0 < p->B; g0 += gbs) {
        int64_t lo, hi;
        rank_share(tr, g0, g0 + gbs < p->B ? g0 + gbs : p->B, &lo, &hi);
        for (int64_t s = lo; s < hi; s += tr->opt.logprob_batch) {
            int64_t e = s + tr->opt.logprob_batch < hi ? s + tr->opt.logprob_batch : hi;
            DSARL_TRY(logprobs_range(tr, model, p, s, e, out, err));
        }
    }
    return DSARL_OK;
}

/* The slice's loss metrics summed over the data-parallel ranks (extrema as min / max): every term is normalised
 * by the slice's global counts, so the sum is the one-process value. */
static int reduce_loss_metrics(const trainer *tr, grpo_loss_metrics *m, float *indexer, float *mtp, dsarl_error *err)
{
    const dsarl_group *g = grpo_dp_group(tr);
    if (dsarl_group_size(g) <= 1)
        return DSARL_OK;
    enum { N = sizeof(grpo_loss_metrics) / sizeof(double) };
    _Static_assert(sizeof(grpo_loss_metrics) == N * sizeof(double), "grpo_loss_metrics holds doubles only");
    double sum[N + 2], lo[N], hi[N];
    memcpy(sum, m, sizeof *m);
    memcpy(lo, m, sizeof *m);
    memcpy(hi, m, sizeof *m);
    sum[N] = *indexer, sum[N + 1] = *mtp;
    DSARL_TRY(dsarl_group_all_reduce_host(g, sum, N + 2, DSARL_DTYPE_F64, DSARL_REDUCE_SUM, err));
    DSARL_TRY(dsarl_group_all_reduce_host(g, lo, N, DSARL_DTYPE_F64, DSARL_REDUCE_MIN, err));
    DSARL_TRY(dsarl_group_all_reduce_host(g, hi, N, DSARL_DTYPE_F64, DSARL_REDUCE_MAX, err));
    memcpy(m, sum, sizeof *m);
    *indexer = (float)sum[N], *mtp = (float)sum[N + 1];
#define PICK(field, from) memcpy(&m->field, (const char *)(from) + offsetof(grpo_loss_metrics, field), sizeof(double))
    PICK(probs_ratio_min, lo);
    PICK(probs_ratio_clamped_min, lo);
    PICK(probs_ratio_max, hi);
    PICK(probs_ratio_clamped_max, hi);
#undef PICK
    return DSARL_OK;
}

/* What the loss callback of one optimizer slice needs: the batch, the slice's global counts, each microbatch's
 * sequences and segment offsets, and the slice's metrics it accumulates. */
typedef struct slice_loss {
    trainer *tr;
    packed_batch *p;
    double valid_toks, valid_seqs, valid_positive_toks; // positive: tokens of positively rewarded sequences
    const int64_t *first_seq;  // (n + 1) the microbatches' sequences [first_seq[i], first_seq[i + 1])
    int32_t *const *cu;        // (n) each microbatch's cu_seqlens from 0
    grpo_loss_metrics *m;
} slice_loss;

/* The loss of microbatch i (dsarl_microbatch_loss_fn): ClippedPGLoss of its log-probs, its per-token gradient. */
static int microbatch_loss(void *user, int32_t i, dsarl_train_microbatch *mb, dsarl_error *err)
{
    slice_loss *sl = user;
    trainer *tr = sl->tr;
    packed_batch *p = sl->p;
    int64_t s0 = sl->first_seq[i], s1 = sl->first_seq[i + 1], base = p->cu[s0];
    if (p->old_from_train)
        memcpy(p->lp_old + base, p->lp_theta + base, sizeof(float) * (size_t)(p->cu[s1] - base));
    grpo_loss_inputs in = {
        .n_tokens = p->cu[s1] - base, .n_seqs = s1 - s0, .cu_seqlens = sl->cu[i], .lp_theta = mb->logprobs,
        .lp_old = tr->cfg.loss.force_on_policy_ratio ? NULL : p->lp_old + base, .lp_gen = p->lp_gen + base,
        .lp_ref = tr->reference ? p->lp_ref + base : NULL, .token_mask = p->mask + base,
        .sample_mask = p->sample_mask + s0, .advantages = p->advantages + s0,
        .token_advantages = p->token_adv ? p->token_adv + base : NULL, .rewards = p->reward + s0,
        .global_valid_toks = sl->valid_toks, .global_valid_seqs = sl->valid_seqs,
        .global_positive_toks = sl->valid_positive_toks};
    double loss;
    grpo_loss_metrics mbm;
    DSARL_TRY(grpo_clipped_pg_loss(&tr->cfg.loss, &in, &loss, mb->dlogprobs, &mbm, err));
    grpo_loss_metrics_add(sl->m, &mbm);
    return DSARL_OK;
}

/* This rank's microbatches of sequences [lo, hi) in steps of mbs: current log-probs, the loss and its per-token
 * gradient, backward into the gradients (dsarl_trainer_train_microbatches: the 1F1B schedule under pipeline
 * parallelism). The indexer and MTP losses are summed into *indexer_loss and *mtp_loss. */
static int train_share(trainer *tr, packed_batch *p, int64_t lo, int64_t hi, const double valid[3],
                       grpo_loss_metrics *m, float *indexer_loss, float *mtp_loss, dsarl_error *err)
{
    int64_t mbs = tr->opt.micro_batch, n = hi > lo ? (hi - lo + mbs - 1) / mbs : 0;
    int64_t *first = malloc(sizeof(int64_t) * (size_t)(n + 1));
    int32_t **cu = calloc((size_t)(n > 0 ? n : 1), sizeof(int32_t *));
    dsarl_token_batch *b = calloc((size_t)(n > 0 ? n : 1), sizeof *b);
    dsarl_train_microbatch *mb = calloc((size_t)(n > 0 ? n : 1), sizeof *mb);
    int rc = first && cu && b && mb ? DSARL_OK
                                    : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for %" PRId64 " microbatches", n);
    for (int64_t i = 0; rc == 0 && i <= n; i++)
        first[i] = lo + i * mbs < hi ? lo + i * mbs : hi;
    for (int64_t i = 0; rc == 0 && i < n; i++) {
        int64_t s0 = first[i], s1 = first[i + 1], base = p->cu[s0];
        if (!(cu[i] = malloc(sizeof(int32_t) * (size_t)(s1 - s0 + 1)))) {
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for a microbatch of %" PRId64 " sequences", s1 - s0);
            break;
        }
        for (int64_t s = s0; s <= s1; s++)
            cu[i][s - s0] = p->cu[s] - (int32_t)base;
        // log-probs of the tempered distribution the rollouts were drawn from (NeMo RL divides the logits likewise)
        b[i] = (dsarl_token_batch){.struct_size = sizeof b[i], .n_tokens = p->cu[s1] - base,
                                   .n_sequences = (int32_t)(s1 - s0), .tokens = p->tokens + base, .cu_seqlens = cu[i],
                                   .logit_scale = 1.0f / tr->opt.temperature};
        grpo_replay_rows(tr, p, base, &b[i]);
        // an MTP loss (models that train MTP layers) counts the tokens the policy loss counts, normalised alike
        mb[i] = (dsarl_train_microbatch){.struct_size = sizeof mb[i], .batch = &b[i], .targets = p->targets + base,
                                         .logprobs = p->lp_theta + base, .dlogprobs = p->grad + base,
                                         .token_mask = p->mask + base, .norm_tokens = valid[0]};
    }
    slice_loss sl = {.tr = tr, .p = p, .valid_toks = valid[0], .valid_seqs = valid[1],
                     .valid_positive_toks = valid[2], .first_seq = first,
                     .cu = cu, .m = m};
    if (rc == 0)
        rc = dsarl_trainer_train_microbatches(tr->ctx->model_ops, tr->model, tr->ctx->parallel, mb, (int32_t)n,
                                              microbatch_loss, &sl, &tr->passes, err);
    for (int64_t i = 0; rc == 0 && i < n; i++)
        *indexer_loss += mb[i].indexer_loss, *mtp_loss += mb[i].mtp_loss;
    for (int64_t i = 0; cu && i < n; i++)
        free(cu[i]);
    free(first), free(cu), free(b), free(mb);
    return rc;
}

/* The optimizer steps of one training step: one per train_global_batch_size slice of the rollouts. */
int grpo_train_on_batch(trainer *tr, packed_batch *p, step_stats *st, dsarl_error *err)
{
    const dsarl_model_ops *ops = tr->ctx->model_ops;
    int64_t gbs = tr->cfg.train_global_batch_size;
    grpo_loss_metrics_init(&st->loss);
    st->grad_norm = 0.0;
    st->indexer_loss = 0.0;
    st->mtp_loss = 0.0;
    st->n_slices = 0;
    for (int64_t g0 = 0; g0 < p->B; g0 += gbs) {
        int64_t g1 = g0 + gbs < p->B ? g0 + gbs : p->B;
        double valid[3] = {0.0, 0.0, 0.0}; /* tokens, sequences, tokens of positively rewarded sequences */
        for (int64_t s = g0; s < g1; s++) {
            valid[1] += p->sample_mask[s];
            for (int64_t t = p->cu[s]; t < p->cu[s + 1]; t++) {
                valid[0] += p->mask[t] * p->sample_mask[s];
                valid[2] += p->reward[s] > 0.0f ? p->mask[t] * p->sample_mask[s] : 0.0;
            }
        }
        DSARL_TRY(ops->zero_grad(tr->model, err));
        grpo_loss_metrics slice;
        grpo_loss_metrics_init(&slice);
        float indexer = 0.0f, mtp = 0.0f;
        /* this rank's share of the slice; the valid counts above count the WHOLE slice (every rank holds
         * the gathered batch), so the summed gradients are the one-process gradient */
        int64_t lo, hi;
        rank_share(tr, g0, g1, &lo, &hi);
        DSARL_TRY(train_share(tr, p, lo, hi, valid, &slice, &indexer, &mtp, err));
        DSARL_TRY(reduce_loss_metrics(tr, &slice, &indexer, &mtp, err));
        double norm;
        double lr = dsarl_lr_at(&tr->cfg.lr_schedule, ops->optimizer_steps ? ops->optimizer_steps(tr->model) : 0);
        bool skipped; // a non-finite loss or norm: no update, reported by the guard (ends the run when repeated)
        DSARL_TRY(dsarl_session_optimizer_step(&tr->session, &tr->adam, lr, tr->cfg.lr_schedule.max_grad_norm,
                                               "train/loss", slice.loss, &norm, &skipped, err));
        /* slice sums are normalised per slice; averaging them gives the step's metric */
        grpo_loss_metrics_add(&st->loss, &slice);
        st->grad_norm += norm;
        st->lr = lr;
        st->indexer_loss += indexer;
        st->mtp_loss += mtp;
        st->n_slices++;
    }
    /* The extremes over every trained token of the step (already reduced over ranks): under GSPO they are the
     * sequence ratios' range, the one place where a per-sequence ratio shows. A step with no trained token has
     * none (they stay +-inf) and logs none. */
    const grpo_loss_metrics *m = &st->loss;
    struct { const char *name; double v; } rows[] = {
        {"train/probs_ratio_min", m->probs_ratio_min},
        {"train/probs_ratio_max", m->probs_ratio_max},
        {"train/probs_ratio_clamped_min", m->probs_ratio_clamped_min},
        {"train/probs_ratio_clamped_max", m->probs_ratio_clamped_max},
    };
    for (size_t i = 0; i < DSARL_ARRAY_LEN(rows); i++)
        if (isfinite(rows[i].v))
            DSARL_TRY(grpo_set_metric(tr, rows[i].name, rows[i].v, err));
    return DSARL_OK;
}
