#define _POSIX_C_SOURCE 200809L /* clock_gettime */
/* grpo_remote.c: the generation copy on a dedicated generation rank (policy.generation.colocated.enabled false in
 * a job of several processes; the core gives the job's last process to generation).
 *
 * The generation rank opens the recipe's model, tokenizer, datasets and environment as a one-process run and serves
 * commands from training rank 0 over the generation group (every process, training ranks first):
 *   WEIGHTS  n_tensors, bucket: the policy's tensors follow in buckets (grpo_refit_receive);
 *   ROLLOUTS split, n, n_gen, seed, top_k, temperature, top_p + n example indices: it runs grpo_run_rollouts on
 *            those examples of its own dataset (generation and environment rewards, one process) and sends every
 *            training rank the rows' metadata, tokens and log-probs, and under routing replay the engine's routing
 *            rows of every rollout's prompt and response tokens (-1 where it recorded none); each rank decodes the
 *            texts itself;
 *   STOP.
 * The request carries the sampling seed the trainer derived, so the rows equal those one process would generate
 * with the same weights (float32 copies are exact). One request is outstanding at a time: the trainer receives its
 * answer before it sends the next command, so neither side ever blocks on a send the other is not receiving. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpo_loop.h"

enum { HEADER = 10, STATUS = 4, MESSAGE = 512 };
enum { SPLIT_TRAIN = 0, SPLIT_VALIDATION = 1 };

const dsarl_group *grpo_remote_group(const trainer *tr)
{
    return tr->ctx->parallel->generation;
}

int32_t grpo_remote_generation_peer(const trainer *tr)
{
    return tr->ctx->parallel->world_size; // the generation rank follows the training ranks
}

int grpo_remote_send_header(trainer *tr, int64_t cmd, int64_t a, int64_t b, dsarl_error *err)
{
    int64_t h[HEADER] = {cmd, a, b};
    return dsarl_group_send_host(grpo_remote_group(tr), h, HEADER, DSARL_DTYPE_I64, grpo_remote_generation_peer(tr),
                                 err);
}

static int64_t float_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (int64_t)u;
}

static float bits_float(int64_t v)
{
    uint32_t u = (uint32_t)v;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The position of ex in ds (examples are one array), or -1. */
static int64_t example_index(const dsarl_dataset *ds, const dsarl_example *ex)
{
    size_t n = ds ? dsarl_dataset_size(ds) : 0;
    const dsarl_example *base = n ? dsarl_dataset_get(ds, 0) : NULL;
    if (!base || ex < base || ex >= base + n)
        return -1;
    return (int64_t)(ex - base);
}

/* The routing rows of an answer (after its log-probs) into the rollouts items[first ..] of out, which the trainer
 * encoded (their prompt lengths) and grpo_rollout_unpack filled (their response lengths). */
static int receive_routing(trainer *tr, const remote_pending *p, dsarl_error *err)
{
    const dsarl_group *g = grpo_remote_group(tr);
    int32_t peer = grpo_remote_generation_peer(tr);
    rollout *items = p->out->items + p->first;
    const size_t want = grpo_routing_tokens(items, p->rows);
    for (int kind = 0; kind < 2; kind++) {
        const size_t w = (size_t)(kind ? tr->replay_w_indices : tr->replay_w_experts);
        if (!w)
            continue;
        int64_t tokens = 0;
        DSARL_TRY(dsarl_group_recv_host(g, &tokens, 1, DSARL_DTYPE_I64, peer, err));
        if (tokens < 0 || (size_t)tokens != want)
            return DSARL_FAIL(err, DSARL_E_INTERNAL, "the generation rank sent routing rows for %" PRId64 " tokens; "
                              "the %" PRId64 " rollouts hold %zu", tokens, p->rows, want);
        int32_t *all = malloc(sizeof(int32_t) * (want * w + 1));
        if (!all)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory receiving the routing of %zu tokens", want);
        int rc = dsarl_group_recv_host(g, all, (int64_t)(want * w), DSARL_DTYPE_I32, peer, err);
        if (rc == DSARL_OK)
            rc = grpo_routing_unpack(tr, items, p->rows, kind, all, err);
        free(all);
        DSARL_TRY(rc);
    }
    return DSARL_OK;
}

int grpo_remote_rollouts(trainer *tr, const dsarl_example *const *examples, size_t n, int64_t n_gen,
                         float temperature, float top_p, int32_t top_k, uint64_t seed, rollout_set *out,
                         int64_t first, dsarl_error *err)
{
    if (tr->pending.active)
        return DSARL_FAIL(err, DSARL_E_INTERNAL, "a rollout request is sent while another is outstanding");
    const dsarl_parallel *par = tr->ctx->parallel;
    int rc = DSARL_OK;
    if (par->world_rank == 0) {
        int64_t split = n && example_index(tr->train_set, examples[0]) >= 0 ? SPLIT_TRAIN : SPLIT_VALIDATION;
        const dsarl_dataset *ds = split == SPLIT_TRAIN ? tr->train_set : tr->val_set;
        int64_t *msg = malloc(sizeof(int64_t) * (HEADER + n));
        if (!msg)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for a request of %zu prompts", n);
        int64_t h[HEADER] = {GRPO_REMOTE_ROLLOUTS, split, (int64_t)n, n_gen, (int64_t)seed, top_k,
                             float_bits(temperature), float_bits(top_p)};
        memcpy(msg, h, sizeof h);
        for (size_t i = 0; i < n && rc == DSARL_OK; i++)
            if ((msg[HEADER + i] = example_index(ds, examples[i])) < 0)
                rc = DSARL_FAIL(err, DSARL_E_INTERNAL, "prompt %zu of a request is in no dataset", i);
        // header first (the serve loop reads a fixed size), then the example indices
        if (rc == DSARL_OK)
            rc = dsarl_group_send_host(grpo_remote_group(tr), msg, HEADER, DSARL_DTYPE_I64,
                                       grpo_remote_generation_peer(tr), err);
        if (rc == DSARL_OK && n)
            rc = dsarl_group_send_host(grpo_remote_group(tr), msg + HEADER, (int64_t)n, DSARL_DTYPE_I64,
                                       grpo_remote_generation_peer(tr), err);
        free(msg);
    }
    if (rc < 0)
        return rc;
    tr->pending = (remote_pending){.active = true, .deferred = tr->remote_defer, .out = out, .first = first,
                                   .rows = (int64_t)n * n_gen, .sent_at = now_s()};
    return tr->remote_defer ? DSARL_OK : grpo_remote_finish(tr, err);
}

int grpo_remote_finish(trainer *tr, dsarl_error *err)
{
    remote_pending p = tr->pending;
    if (!p.active)
        return DSARL_OK;
    tr->pending.active = false;
    double t0 = now_s();
    const dsarl_group *g = grpo_remote_group(tr);
    int32_t peer = grpo_remote_generation_peer(tr);
    int64_t status[STATUS]; // 0 or -error code, rows, tokens, the generation rank's seconds (bits of a double)
    DSARL_TRY(dsarl_group_recv_host(g, status, STATUS, DSARL_DTYPE_I64, peer, err));
    if (status[0] != 0) {
        char msg[MESSAGE];
        DSARL_TRY(dsarl_group_recv_host(g, msg, MESSAGE, DSARL_DTYPE_U8, peer, err));
        msg[MESSAGE - 1] = '\0';
        return DSARL_FAIL(err, (dsarl_status)status[0], "generation rank: %s", msg);
    }
    if (status[1] != p.rows || status[2] < 0 || status[2] > ((int64_t)1 << 40))
        return DSARL_FAIL(err, DSARL_E_INTERNAL, "the generation rank answered %" PRId64 " rollouts of %" PRId64
                          " tokens for a request of %" PRId64, status[1], status[2], p.rows);
    size_t rows = (size_t)p.rows, toks = (size_t)status[2];
    double *meta = malloc(sizeof(double) * (rows * GRPO_ROLLOUT_META + 1));
    int32_t *tok = malloc(sizeof(int32_t) * (toks + 1));
    float *lp = malloc(sizeof(float) * (toks + 1));
    int rc = meta && tok && lp ? DSARL_OK
                               : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory receiving %zu rollouts", rows);
    if (rc == DSARL_OK)
        rc = dsarl_group_recv_host(g, meta, (int64_t)(rows * GRPO_ROLLOUT_META), DSARL_DTYPE_F64, peer, err);
    if (rc == DSARL_OK)
        rc = dsarl_group_recv_host(g, tok, (int64_t)toks, DSARL_DTYPE_I32, peer, err);
    if (rc == DSARL_OK)
        rc = dsarl_group_recv_host(g, lp, (int64_t)toks, DSARL_DTYPE_F32, peer, err);
    size_t at = 0;
    for (size_t i = 0; i < rows && rc == DSARL_OK; i++) {
        const double *m = meta + i * GRPO_ROLLOUT_META;
        if (!(m[0] >= 0) || (size_t)m[0] > toks - at) {
            rc = DSARL_FAIL(err, DSARL_E_INTERNAL, "rollout %zu from the generation rank overruns its tokens", i);
            break;
        }
        rollout *x = &p.out->items[p.first + (int64_t)i];
        rc = grpo_rollout_unpack(tr, m, tok + at, lp + at, x, err);
        at += (size_t)m[0];
        if (rc == DSARL_OK && !p.deferred && x->verdict == DSARL_VERDICT_VERIFIER_FAILED)
            tr->verifier_failures++; // as grpo_run_rollouts counts (a deferred batch is counted when taken)
    }
    free(meta);
    free(tok);
    free(lp);
    if (rc == DSARL_OK && (tr->replay_w_experts || tr->replay_w_indices))
        rc = receive_routing(tr, &p, err);
    double generate_s;
    memcpy(&generate_s, &status[3], sizeof generate_s);
    tr->remote_wait_s += now_s() - t0;
    tr->remote_generate_s += generate_s;
    return rc;
}

int grpo_remote_stop(trainer *tr, dsarl_error *err)
{
    DSARL_TRY(grpo_remote_finish(tr, err));
    if (tr->ctx->parallel->world_rank != 0)
        return DSARL_OK;
    return grpo_remote_send_header(tr, GRPO_REMOTE_STOP, 0, 0, err);
}

/* --- the generation rank ---------------------------------------------------------------------------------- */

/* Sends every training rank the answer to a request: the rows, or the failure (rc, err) in one sentence. */
static int answer(trainer *tr, int rc, const dsarl_error *why, const rollout_set *rs, double seconds,
                  dsarl_error *err)
{
    const dsarl_group *g = grpo_remote_group(tr);
    int32_t trainers = dsarl_group_size(g) - dsarl_parallel_generation_ranks(tr->ctx->parallel);
    int64_t toks = 0;
    for (int64_t i = 0; rc == DSARL_OK && i < rs->n; i++)
        toks += rs->items[i].response_len;
    size_t rows = (size_t)rs->n;
    double *meta = rc == DSARL_OK ? malloc(sizeof(double) * (rows * GRPO_ROLLOUT_META + 1)) : NULL;
    int32_t *tok = rc == DSARL_OK ? malloc(sizeof(int32_t) * ((size_t)toks + 1)) : NULL;
    float *lp = rc == DSARL_OK ? malloc(sizeof(float) * ((size_t)toks + 1)) : NULL;
    dsarl_error nomem;
    if (rc == DSARL_OK && (!meta || !tok || !lp)) {
        rc = DSARL_FAIL(&nomem, DSARL_E_NOMEM, "out of memory sending %zu rollouts", rows);
        why = &nomem;
    }
    int64_t at = 0;
    for (size_t i = 0; rc == DSARL_OK && i < rows; i++) {
        const rollout *x = &rs->items[i];
        grpo_rollout_pack(x, meta + i * GRPO_ROLLOUT_META);
        memcpy(tok + at, x->response, sizeof(int32_t) * (size_t)x->response_len);
        memcpy(lp + at, x->response_lp, sizeof(float) * (size_t)x->response_len);
        at += x->response_len;
    }
    int32_t *routing[2] = {NULL, NULL}; // routing replay: experts, key positions
    const int64_t routed = rc == DSARL_OK ? (int64_t)grpo_routing_tokens(rs->items, rs->n) : 0;
    for (int kind = 0; kind < 2 && rc == DSARL_OK; kind++) {
        const size_t w = (size_t)(kind ? tr->replay_w_indices : tr->replay_w_experts);
        if (!w)
            continue;
        if (!(routing[kind] = malloc(sizeof(int32_t) * ((size_t)routed * w + 1)))) {
            rc = DSARL_FAIL(&nomem, DSARL_E_NOMEM, "out of memory sending the routing of %" PRId64 " tokens", routed);
            why = &nomem;
        } else {
            grpo_routing_pack(tr, rs->items, rs->n, kind, routing[kind]);
        }
    }
    int64_t status[STATUS] = {rc == DSARL_OK ? 0 : (why->code ? (int64_t)why->code : (int64_t)DSARL_E_INTERNAL),
                              (int64_t)rows, toks, 0};
    memcpy(&status[3], &seconds, sizeof seconds);
    char msg[MESSAGE] = "";
    if (rc != DSARL_OK)
        snprintf(msg, sizeof msg, "%s", why->message);
    int sent = DSARL_OK;
    for (int32_t r = 0; r < trainers && sent == DSARL_OK; r++) {
        sent = dsarl_group_send_host(g, status, STATUS, DSARL_DTYPE_I64, r, err);
        if (sent == DSARL_OK && rc != DSARL_OK)
            sent = dsarl_group_send_host(g, msg, MESSAGE, DSARL_DTYPE_U8, r, err);
        if (sent == DSARL_OK && rc == DSARL_OK)
            sent = dsarl_group_send_host(g, meta, (int64_t)(rows * GRPO_ROLLOUT_META), DSARL_DTYPE_F64, r, err);
        if (sent == DSARL_OK && rc == DSARL_OK)
            sent = dsarl_group_send_host(g, tok, toks, DSARL_DTYPE_I32, r, err);
        if (sent == DSARL_OK && rc == DSARL_OK)
            sent = dsarl_group_send_host(g, lp, toks, DSARL_DTYPE_F32, r, err);
        for (int kind = 0; kind < 2 && sent == DSARL_OK && rc == DSARL_OK; kind++) {
            const int64_t w = kind ? tr->replay_w_indices : tr->replay_w_experts;
            if (!w)
                continue;
            sent = dsarl_group_send_host(g, &routed, 1, DSARL_DTYPE_I64, r, err);
            if (sent == DSARL_OK)
                sent = dsarl_group_send_host(g, routing[kind], routed * w, DSARL_DTYPE_I32, r, err);
        }
    }
    free(meta);
    free(tok);
    free(lp);
    free(routing[0]);
    free(routing[1]);
    return sent;
}

/* One ROLLOUTS request (header h): receives its example indices, generates and scores, answers. */
static int serve_rollouts(trainer *tr, const int64_t *h, dsarl_error *err)
{
    const dsarl_group *g = grpo_remote_group(tr);
    int64_t split = h[1], n = h[2], n_gen = h[3];
    const dsarl_dataset *ds = split == SPLIT_TRAIN ? tr->train_set : tr->val_set;
    size_t size = ds ? dsarl_dataset_size(ds) : 0;
    if ((split != SPLIT_TRAIN && split != SPLIT_VALIDATION) || n < 0 || (size_t)n > size || n_gen < 1 ||
        n_gen > (1 << 16))
        return DSARL_FAIL(err, DSARL_E_INTERNAL, "a rollout request for %" PRId64 " x %" PRId64 " rollouts of split %"
                          PRId64 " (%zu examples)", n, n_gen, split, size);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    const dsarl_example **ex = malloc(sizeof *ex * (size_t)(n ? n : 1));
    int rc = idx && ex ? DSARL_OK : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory for %" PRId64 " prompts", n);
    if (rc == DSARL_OK && n)
        rc = dsarl_group_recv_host(g, idx, n, DSARL_DTYPE_I64, 0, err);
    for (int64_t i = 0; i < n && rc == DSARL_OK; i++)
        if (!(ex[i] = idx[i] >= 0 ? dsarl_dataset_get(ds, (size_t)idx[i]) : NULL))
            rc = DSARL_FAIL(err, DSARL_E_INTERNAL, "a rollout request names example %" PRId64 " of %zu", idx[i], size);
    free(idx);
    if (rc < 0) {
        free(ex);
        return rc;
    }
    rollout_set rs = {0};
    double t0 = now_s();
    dsarl_error why;
    dsarl_error_clear(&why);
    int gen_rc = grpo_run_rollouts(tr, ex, (size_t)n, n_gen, bits_float(h[6]), bits_float(h[7]), (int32_t)h[5],
                                   (uint64_t)h[4], &rs, &why);
    free(ex);
    rc = answer(tr, gen_rc, &why, &rs, now_s() - t0, err);
    grpo_rollout_set_free(&rs);
    if (gen_rc < 0) { // the trainers fail with this sentence; so does this rank
        *err = why;
        return gen_rc;
    }
    return rc;
}

int grpo_remote_serve(trainer *tr, dsarl_error *err)
{
    const dsarl_group *g = grpo_remote_group(tr);
    for (;;) {
        int64_t h[HEADER];
        DSARL_TRY(dsarl_group_recv_host(g, h, HEADER, DSARL_DTYPE_I64, 0, err));
        switch (h[0]) {
        case GRPO_REMOTE_STOP:
            return DSARL_OK;
        case GRPO_REMOTE_WEIGHTS:
            DSARL_TRY(grpo_refit_receive(tr, h[1], h[2], err));
            break;
        case GRPO_REMOTE_ROLLOUTS:
            DSARL_TRY(serve_rollouts(tr, h, err));
            break;
        default:
            return DSARL_FAIL(err, DSARL_E_INTERNAL, "the generation rank received command %" PRId64, h[0]);
        }
    }
}
