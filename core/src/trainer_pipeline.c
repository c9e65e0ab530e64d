/* trainer_pipeline.c: the microbatches of one optimizer slice, in the 1F1B pipeline schedule under pipeline
 * parallelism (Megatron's forward_backward_pipelining_without_interleaving, or with_interleaving when each rank
 * holds several model chunks), one after another otherwise.
 *
 * Stage s of P runs min(P - 1 - s, n) warm-up forwards, then alternates one forward and one backward, then the
 * cool-down backwards: microbatch i lives in slot i % P of the model's stage ops from its forward (or the receive
 * of its input) to the send of its input gradient, at most P - s at a time. Each point-to-point step is one
 * dsarl_model_ops.stage_transfer pairing what Megatron pairs (a forward send with the next stage's gradient, a
 * gradient send with the previous stage's next input), so the two ends of a link always meet.
 *
 * Interleaved (V model chunks per rank, virtual stage c P + s): the n V chunk passes run in Megatron's order,
 * groups of P microbatches through chunk 0, then chunk 1, ... (backwards from chunk V - 1 down), with
 * 2 (P - 1 - s) + (V - 1) P warm-up forwards (all of them when n = P). The last rank's chunk sends to the first
 * rank's next chunk, so the pp group is a ring. A microbatch keeps slot i % 2P from its first chunk's forward to its
 * chunk 0 input gradient (at most 2P of them are in flight: checked by simulating every layout up to P 8, V 5);
 * the model knows which chunk a call means from the order of its calls on that slot (forwards go up the chunks,
 * backwards down). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "dsarl/trainer.h"

// A microbatch struct of an ABI 1.5 caller has room for the MTP loss (1.4 ones end before it).
static bool has_mtp_loss(const dsarl_train_microbatch *mb)
{
    return mb->struct_size >= offsetof(dsarl_train_microbatch, mtp_loss) + sizeof mb->mtp_loss;
}

// One microbatch after another: forward, loss, backward.
static int run_in_order(const dsarl_model_ops *ops, dsarl_model *model, dsarl_train_microbatch *mbs, int32_t n,
                        dsarl_microbatch_loss_fn loss, void *user, dsarl_pass_counts *counts, dsarl_error *err)
{
    for (int32_t i = 0; i < n; i++) {
        dsarl_train_microbatch *mb = &mbs[i];
        DSARL_TRY(dsarl_trainer_train_forward(ops, model, mb->batch, mb->targets, mb->logprobs, counts, err));
        DSARL_TRY(loss(user, i, mb, err));
        float mtp = 0.0f; // the caller's normalisation of the MTP loss, before the backward adds it
        if (has_mtp_loss(mb) && DSARL_MODEL_HAS(ops, mtp_loss) &&
            ops->mtp_loss(model, mb->token_mask, mb->norm_tokens, &mtp) > 0)
            mb->mtp_loss = mtp;
        DSARL_TRY(dsarl_trainer_train_backward(ops, model, mb->batch, mb->targets, mb->dlogprobs,
                                               &mb->indexer_loss, err));
    }
    return DSARL_OK;
}

typedef struct schedule {
    const dsarl_model_ops *ops;
    dsarl_model *model;
    dsarl_train_microbatch *mbs;
    int32_t n, stages, stage;
    int32_t chunks;  // model chunks per rank (V), 1 without virtual stages
    int32_t *next_in, *next_grad; // interleaved: (V) the next microbatch whose input / output gradient each chunk
                                  // receives (each chunk's forwards and backwards run in microbatch order)
    dsarl_microbatch_loss_fn loss;
    void *user;
    float *shared;   // (sum of T) every microbatch's log-probs, kept by the last stage before its loss call (which
                     // may overwrite them with their gradient), then broadcast to the other stages
    int64_t *offset; // (n + 1) where each microbatch's log-probs start in shared
} schedule;

static bool first_stage(const schedule *s) { return s->stage == 0; }
static bool last_stage(const schedule *s) { return s->stage == s->stages - 1; }
// Whether this rank's chunk c is the whole pipeline's first (the embedding's) / last (the loss's) virtual stage.
static bool first_virtual(const schedule *s, int32_t c) { return first_stage(s) && c == 0; }
static bool last_virtual(const schedule *s, int32_t c) { return last_stage(s) && c == s->chunks - 1; }
// The slot of microbatch i (at most P in flight without virtual stages, 2P with them).
static int32_t slot_of(const schedule *s, int32_t i) { return i % (s->chunks > 1 ? 2 * s->stages : s->stages); }

// One step's transfers, each a microbatch index or -1, as given: under virtual stages the first stage receives from
// the last one (the ring of virtual stages), so only the schedule knows which ends to drop.
static int transfer_ring(const schedule *s, int32_t send_fwd, int32_t recv_bwd, int32_t send_bwd, int32_t recv_fwd,
                         dsarl_error *err)
{
    if (send_fwd < 0 && recv_bwd < 0 && send_bwd < 0 && recv_fwd < 0)
        return DSARL_OK;
    dsarl_stage_transfer t = {.struct_size = sizeof t, .send_forward = send_fwd < 0 ? -1 : slot_of(s, send_fwd),
                              .recv_backward = recv_bwd < 0 ? -1 : slot_of(s, recv_bwd),
                              .send_backward = send_bwd < 0 ? -1 : slot_of(s, send_bwd),
                              .recv_forward = recv_fwd < 0 ? -1 : slot_of(s, recv_fwd),
                              .recv_batch = recv_fwd < 0 ? NULL : s->mbs[recv_fwd].batch};
    return s->ops->stage_transfer(s->model, &t, err);
}

// A transfer step of the non-interleaved schedule: the ends this stage has no neighbour for are dropped.
static int transfer(const schedule *s, int32_t send_fwd, int32_t recv_bwd, int32_t send_bwd, int32_t recv_fwd,
                    dsarl_error *err)
{
    if (last_stage(s))
        send_fwd = recv_bwd = -1;
    if (first_stage(s))
        send_bwd = recv_fwd = -1;
    return transfer_ring(s, send_fwd, recv_bwd, send_bwd, recv_fwd, err);
}

// The stage's forward of microbatch i (its next chunk); the last virtual stage turns its log-probs into their
// gradient at once.
static int forward_chunk(const schedule *s, int32_t i, int32_t chunk, dsarl_error *err)
{
    dsarl_train_microbatch *mb = &s->mbs[i];
    DSARL_TRY(s->ops->stage_forward(s->model, slot_of(s, i), mb->batch, mb->targets, mb->logprobs, err));
    if (!last_virtual(s, chunk))
        return DSARL_OK;
    memcpy(s->shared + s->offset[i], mb->logprobs, (size_t)mb->batch->n_tokens * sizeof(float));
    return s->loss(s->user, i, mb, err);
}

static int forward(const schedule *s, int32_t i, dsarl_error *err)
{
    return forward_chunk(s, i, 0, err);
}

static int backward(const schedule *s, int32_t i, dsarl_error *err)
{
    dsarl_train_microbatch *mb = &s->mbs[i];
    return s->ops->stage_backward(s->model, slot_of(s, i), mb->dlogprobs, &mb->indexer_loss, err);
}

static int run_1f1b(const schedule *s, dsarl_error *err)
{
    int32_t n = s->n, warm = s->stages - 1 - s->stage;
    warm = warm < n ? warm : n;
    int32_t steady = n - warm;
    for (int32_t i = 0; i < warm; i++) {
        DSARL_TRY(transfer(s, -1, -1, -1, i, err));
        DSARL_TRY(forward(s, i, err));
        DSARL_TRY(transfer(s, i, -1, -1, -1, err));
    }
    if (steady > 0)
        DSARL_TRY(transfer(s, -1, -1, -1, warm, err));
    for (int32_t j = 0; j < steady; j++) {
        int32_t f = warm + j; // the forward of this step; j is the oldest microbatch in flight
        DSARL_TRY(forward(s, f, err));
        DSARL_TRY(transfer(s, f, j, -1, -1, err));
        DSARL_TRY(backward(s, j, err));
        DSARL_TRY(transfer(s, -1, -1, j, j + 1 < steady ? f + 1 : -1, err));
    }
    for (int32_t j = steady; j < n; j++) {
        DSARL_TRY(transfer(s, -1, j, -1, -1, err));
        DSARL_TRY(backward(s, j, err));
        DSARL_TRY(transfer(s, -1, -1, j, -1, err));
    }
    return DSARL_OK;
}

/* --- the interleaved schedule (V > 1) ------------------------------------------------------------------------ */

// Python's k mod n (k may be negative: the first and last ranks look P - 1 virtual microbatches back).
static int64_t mod_floor(int64_t k, int64_t n)
{
    int64_t r = k % n;
    return r < 0 ? r + n : r;
}

// Virtual microbatch k of the n V: its chunk (forwards up the chunks, backwards down) and its microbatch.
static int32_t chunk_of(const schedule *s, int64_t k, bool forward_pass)
{
    int64_t P = s->stages, V = s->chunks;
    int32_t c = (int32_t)(mod_floor(k, P * V) / P);
    return forward_pass ? c : (int32_t)(V - 1 - c);
}
static int32_t microbatch_of(const schedule *s, int64_t k)
{
    int64_t P = s->stages, V = s->chunks;
    return (int32_t)((k / (P * V)) * P + k % P);
}

// The microbatch whose input (forward) or output gradient chunk c receives next, counted; -1 when not receiving.
static int32_t take_input(const schedule *s, bool receive, int32_t c)
{
    return receive ? s->next_in[c]++ : -1;
}
static int32_t take_grad(const schedule *s, bool receive, int32_t c)
{
    return receive ? s->next_grad[c]++ : -1;
}

// Virtual microbatch k's forward on this rank.
static int forward_virtual(const schedule *s, int64_t k, int32_t *mb, int32_t *c, dsarl_error *err)
{
    *c = chunk_of(s, k, true), *mb = microbatch_of(s, k);
    return forward_chunk(s, *mb, *c, err);
}

// Megatron's forward_backward_pipelining_with_interleaving (microbatch groups of P, the default group size).
static int run_interleaved(const schedule *s, dsarl_error *err)
{
    int64_t P = s->stages, V = s->chunks, r = s->stage, total = (int64_t)s->n * V;
    bool all_warmup = s->n == P;
    int64_t warm = all_warmup ? total : 2 * (P - r - 1) + (V - 1) * P;
    warm = warm < total ? warm : total;
    int64_t steady = total - warm;
    int32_t mb, c;
    if (total == 0)
        return DSARL_OK;
    if (!first_stage(s))
        DSARL_TRY(transfer_ring(s, -1, -1, -1, take_input(s, true, 0), err));
    for (int64_t k = 0; k < warm; k++) {
        DSARL_TRY(forward_virtual(s, k, &mb, &c, err));
        int32_t next = chunk_of(s, k + 1, true);
        bool recv_prev = !(first_stage(s) && next == 0) && k != total - 1;
        int32_t send = last_virtual(s, c) ? -1 : mb;
        bool recv_next = k == warm - 1 && !all_warmup && !last_stage(s);
        DSARL_TRY(transfer_ring(s, send, take_grad(s, recv_next, (int32_t)V - 1), -1,
                                take_input(s, recv_prev, next), err));
    }
    for (int64_t j = 0; j < steady; j++) {
        int64_t fk = warm + j;
        DSARL_TRY(forward_virtual(s, fk, &mb, &c, err));
        int32_t send_f = last_virtual(s, c) ? -1 : mb;
        int32_t bc = chunk_of(s, j, false), bmb = microbatch_of(s, j);
        DSARL_TRY(backward(s, bmb, err));
        int32_t send_b = first_virtual(s, bc) ? -1 : bmb;
        // the first rank runs P - 1 virtual microbatches ahead of the last one, which feeds its inputs (and the
        // reverse for gradients)
        bool recv_prev = true, recv_next = true;
        int32_t next_f, next_b;
        if (first_stage(s)) {
            int32_t t = chunk_of(s, fk - (P - 1), true);
            recv_prev = t != V - 1;
            next_f = t + 1;
        } else {
            next_f = chunk_of(s, fk + 1, true);
        }
        if (last_stage(s)) {
            int32_t t = chunk_of(s, j - (P - 1), false);
            recv_next = t != 0;
            next_b = t - 1;
        } else {
            next_b = chunk_of(s, j + 1, false);
        }
        if (j == steady - 1)
            recv_prev = false;
        DSARL_TRY(transfer_ring(s, send_f, take_grad(s, recv_next, next_b), send_b,
                                take_input(s, recv_prev, next_f), err));
    }
    if (all_warmup && !last_stage(s))
        DSARL_TRY(transfer_ring(s, -1, take_grad(s, true, (int32_t)V - 1), -1, -1, err));
    for (int64_t k = steady; k < total; k++) {
        int32_t bc = chunk_of(s, k, false), bmb = microbatch_of(s, k);
        DSARL_TRY(backward(s, bmb, err));
        int32_t next = chunk_of(s, k + 1, false);
        bool recv_next = !(last_stage(s) && next == V - 1) && k != total - 1;
        DSARL_TRY(transfer_ring(s, -1, take_grad(s, recv_next, next), first_virtual(s, bc) ? -1 : bmb, -1, err));
    }
    return DSARL_OK;
}

// After the schedule: every pp rank gets the last stage's log-probs and every stage's indexer loss, and the stages
// other than the last make their loss calls (the last one made them as its forwards ended).
static int share_results(const schedule *s, const dsarl_group *pp, dsarl_error *err)
{
    double *il = malloc((size_t)(s->n > 0 ? s->n : 1) * sizeof(double));
    int rc = il ? dsarl_group_broadcast_host(pp, s->shared, s->offset[s->n], DSARL_DTYPE_F32, s->stages - 1, err)
                : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for %d indexer losses", s->n);
    for (int32_t i = 0; rc == 0 && i < s->n; i++)
        il[i] = s->mbs[i].indexer_loss;
    if (rc == 0)
        rc = dsarl_group_all_reduce_host(pp, il, s->n, DSARL_DTYPE_F64, DSARL_REDUCE_SUM, err);
    for (int32_t i = 0; rc == 0 && i < s->n; i++) {
        dsarl_train_microbatch *mb = &s->mbs[i];
        mb->indexer_loss = (float)il[i];
        if (!last_stage(s)) {
            memcpy(mb->logprobs, s->shared + s->offset[i], (size_t)mb->batch->n_tokens * sizeof(float));
            rc = s->loss(s->user, i, mb, err);
        }
    }
    free(il);
    return rc;
}

int dsarl_trainer_train_microbatches(const dsarl_model_ops *ops, dsarl_model *model, const dsarl_parallel *par,
                                     dsarl_train_microbatch *mbs, int32_t n, dsarl_microbatch_loss_fn loss,
                                     void *user, dsarl_pass_counts *counts, dsarl_error *err)
{
    if (n < 0 || (n > 0 && (!mbs || !loss)))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_trainer_train_microbatches: needs n >= 0 microbatches and a "
                          "loss callback");
    for (int32_t i = 0; i < n; i++)
        if (mbs[i].struct_size < offsetof(dsarl_train_microbatch, mtp_loss) || !mbs[i].batch || !mbs[i].logprobs ||
            !mbs[i].dlogprobs)
            return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_trainer_train_microbatches: microbatch %d needs an ABI "
                              "1.4 struct with a batch, log-prob and gradient buffers", i);
    for (int32_t i = 0; i < n; i++) {
        mbs[i].indexer_loss = 0.0f;
        if (has_mtp_loss(&mbs[i]))
            mbs[i].mtp_loss = 0.0f;
    }
    bool pipelined = par && DSARL_PARALLEL_HAS_GROUPS(par) && par->pp_size > 1 && par->pp &&
                     DSARL_MODEL_HAS(ops, stage_forward) && DSARL_MODEL_HAS(ops, stage_backward) &&
                     DSARL_MODEL_HAS(ops, stage_transfer);
    // without the stage ops a pipelined model runs its stages in turn inside train_forward / train_backward
    if (!pipelined)
        return run_in_order(ops, model, mbs, n, loss, user, counts, err);
    schedule s = {.ops = ops, .model = model, .mbs = mbs, .n = n, .stages = par->pp_size,
                  .stage = dsarl_group_rank(par->pp), .chunks = dsarl_parallel_vpp(par), .loss = loss, .user = user};
    // Megatron's rule for its default group of P microbatches per virtual stage: n is a multiple of P (P <= n, and
    // a last group shorter than P would stall the pipeline)
    if (s.chunks > 1 && n % s.stages != 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "the interleaved pipeline schedule (virtual_pipeline_model_parallel_"
                          "size %d) needs the microbatches of each optimizer step on a data-parallel rank (%d: "
                          "train_global_batch_size / (data parallel x train_micro_batch_size)) to be a multiple of "
                          "pipeline_model_parallel_size %d, as Megatron requires", s.chunks, n, s.stages);
    if (s.chunks > 1 && (!(s.next_in = calloc((size_t)s.chunks, sizeof(int32_t))) ||
                         !(s.next_grad = calloc((size_t)s.chunks, sizeof(int32_t))))) {
        free(s.next_in);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for %d model chunks", s.chunks);
    }
    if (!(s.offset = malloc((size_t)(n + 1) * sizeof(int64_t)))) {
        free(s.next_in), free(s.next_grad);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for %d microbatches", n);
    }
    s.offset[0] = 0;
    for (int32_t i = 0; i < n; i++)
        s.offset[i + 1] = s.offset[i] + (mbs[i].batch->n_tokens > 0 ? mbs[i].batch->n_tokens : 0);
    int rc = (s.shared = malloc((size_t)(s.offset[n] + 1) * sizeof(float)))
                 ? DSARL_OK
                 : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for %lld pipeline log-probs", (long long)s.offset[n]);
    if (rc == 0)
        rc = s.chunks > 1 ? run_interleaved(&s, err) : run_1f1b(&s, err);
    if (rc == 0)
        rc = share_results(&s, par->pp, err);
    for (int32_t i = 0; rc == 0 && counts && i < n; i++)
        counts->train_pass_tokens += mbs[i].batch->n_tokens;
    free(s.shared), free(s.offset), free(s.next_in), free(s.next_grad);
    return rc;
}
