/* glm5_moe.c: the routed experts of a MoE layer (router, top-k routing, grouped expert GEMMs, weighted combine)
 * and their backward. The shared experts are an ordinary MLP beside them (glm5_forward.c / glm5_backward.c).
 *
 * Tokens are grouped by expert on the host (the counts decide the GEMM shapes), except for a few tokens on a
 * launch-bound device with the ABI 1.7 moe_group_padded slot: there every expert gets T rows (an expert appears at
 * most once per token, so no pair overflows) and the device groups them, so a decode step's MoE layers need no
 * host round trip. The routing decided in the forward (route_idx, rows, slots) is kept in the layer's activations
 * and reused by the backward, so both see one routing.
 *
 * Expert parallelism (Megatron's alltoall token dispatcher, dropless): rank r of the ep group holds experts
 * [r E/ep, (r+1) E/ep). The router is replicated, so each rank routes its own tokens; its routed rows, already
 * grouped by expert, are grouped by owning rank too, and one all-to-all sends each owner its rows. Every rank
 * all-gathers the per-expert row counts, so a receiver knows the expert of each row it gets without ids on the
 * wire. Received rows are sorted by (local expert, source rank, source order) before the expert GEMMs, so the
 * sums are reproducible for a fixed layout, and the outputs travel back by the reverse all-to-all; the routing
 * weights never leave the rank that routed, which combines (forward) and takes their gradient (backward). The
 * backward reverses the path: output gradients out, expert weight gradients accumulated on the owner, input-row
 * gradients back. Under EP the padded batched path (glm5_moe_pad) is off: the expert groups run as one grouped
 * call (the device's gemm_grouped, or a GEMM per group where it has none). */
#include <stdlib.h>
#include <string.h>
#include "glm5_pass.h"

/* A device buffer that grows: recompute and decode reuse one per layer slot across calls with different row
 * counts (the old buffer stays with the pass until glm5_pass_free). */
typedef struct ep_buf {
    void *ptr;
    size_t bytes;
} ep_buf;

// One MoE layer's dispatch under expert parallelism, from its forward for its backward (Rr: rows received).
struct glm5_moe_ep {
    int64_t *send, *recv;          // host (ep): routed rows to / from each EP rank
    int64_t *first;                // host (E/ep + 1): first sorted row of each local expert
    int64_t rows;                  // Rr
    ep_buf perm;                   // device int32 (2 Rr): received row of each sorted row, then the reverse
    ep_buf in, gate_up, act;       // device sorted rows (Rr, C) and their expert activations (Rr, 2I), (Rr, I)
};

// Scratch of the dispatch that no layer keeps: every MoE layer of a pass reuses it.
struct glm5_moe_ep_scratch {
    ep_buf counts;                 // device int64 (E + ep E): this rank's rows per expert, then every rank's
    ep_buf raw, sorted;            // device (Rr, C): rows in received order, and in sorted order
    ep_buf dact, dgu;              // backward (Rr, I), (Rr, 2I)
    int64_t *all;                  // host (ep, E): every rank's rows per expert
    int64_t *values;               // host (2 ep): all-to-all counts in values (rows times the row width)
};

static int ep_reserve(glm5_pass *p, ep_buf *b, size_t bytes, dsarl_error *err)
{
    if (b->ptr && b->bytes >= bytes)
        return DSARL_OK;
    // half again as much: a slot that grows once per call would otherwise allocate on every call
    size_t want = b->ptr ? bytes + bytes / 2 : bytes;
    DSARL_TRY(glm5_pass_alloc(p, want, &b->ptr, err));
    b->bytes = want;
    return DSARL_OK;
}

static bool ep_active(const dsarl_model *m) { return m->shards.ep_size > 1; }

// The layer's dispatch state and the pass's scratch, allocated on first use (host parts freed with the pass).
static int ep_state(glm5_pass *p, glm5_layer_acts *a, dsarl_error *err)
{
    const dsarl_model *m = p->m;
    int64_t ep = m->shards.ep_size, E = m->cfg.n_routed_experts;
    if (!p->ep_scratch) {
        struct glm5_moe_ep_scratch *s;
        DSARL_TRY(glm5_pass_host_alloc(p, sizeof *s, (void **)&s, err));
        DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(ep * E) * sizeof(int64_t), (void **)&s->all, err));
        DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(2 * ep) * sizeof(int64_t), (void **)&s->values, err));
        DSARL_TRY(ep_reserve(p, &s->counts, (size_t)(E + ep * E) * sizeof(int64_t), err));
        p->ep_scratch = s;
    }
    if (!a->ep) {
        struct glm5_moe_ep *st;
        DSARL_TRY(glm5_pass_host_alloc(p, sizeof *st, (void **)&st, err));
        DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(2 * ep + E / ep + 1) * sizeof(int64_t), (void **)&st->send,
                                       err));
        st->recv = st->send + ep, st->first = st->send + 2 * ep;
        a->ep = st;
    }
    return DSARL_OK;
}

/* Exchanges the per-expert counts of this rank's routed rows (count: (E+1) first row of each expert) over the ep
 * group and plans the dispatch: rows to and from each rank, the sorted order of the received rows (uploaded) and
 * the room for them. Peers' counts size allocations here, so they are checked first. */
static int ep_plan(glm5_pass *p, glm5_layer_acts *a, const int64_t *count, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    const dsarl_group *g = m->parallel.ep;
    int64_t E = c->n_routed_experts, K = c->num_experts_per_tok, C = c->hidden_size;
    int64_t I = c->moe_intermediate_size, ep = m->shards.ep_size, El = E / ep, r0 = m->shards.ep_rank * El;
    if (dsarl_group_size(g) != ep || dsarl_group_rank(g) != m->shards.ep_rank)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: expert parallelism %lld needs the ep process group of the "
                          "layout (this rank's has %d members); the core builds it with the session", (long long)ep,
                          dsarl_group_size(g));
    if (!dsarl_device_has_collectives(d))
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "glm5: expert parallelism needs the device's collectives "
                          "(all_gather, all_to_all); device %s has none", d->common.name ? d->common.name : "?");
    DSARL_TRY(ep_state(p, a, err));
    struct glm5_moe_ep *st = a->ep;
    struct glm5_moe_ep_scratch *s = p->ep_scratch;
    // every rank's rows per expert: one upload, one all-gather, one download (device memory, as the collectives)
    int64_t *mine = s->all; // (E) staged in the first row before the download overwrites it with the gathered
    for (int64_t e = 0; e < E; e++)
        mine[e] = count[e + 1] - count[e];
    int64_t *dcounts = s->counts.ptr;
    DSARL_TRY(d->copy(m->dev, dcounts, mine, (size_t)E * sizeof(int64_t), DSARL_COPY_HOST_TO_DEVICE, err));
    DSARL_TRY(dsarl_device_all_gather(d, m->dev, g, dcounts + E, dcounts, E, DSARL_DTYPE_I64, err));
    DSARL_TRY(d->copy(m->dev, s->all, dcounts + E, (size_t)(ep * E) * sizeof(int64_t), DSARL_COPY_DEVICE_TO_HOST,
                      err));
    // a peer's counts are plausible only as a routing: each >= 0, K rows per token in all, int32-indexable rows.
    // Every rank checks the same gathered table, so every rank refuses together (no peer left in an exchange),
    // the received totals of every owner included.
    for (int64_t r = 0; r < ep; r++) {
        int64_t total = 0;
        for (int64_t e = 0; e < E; e++) {
            int64_t n = s->all[r * E + e];
            if (n < 0 || n > INT32_MAX || (total += n) > INT32_MAX)
                return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: expert-parallel rank %lld reported %lld rows for "
                                  "expert %lld; the ep ranks disagree on the dispatch (a peer diverged)",
                                  (long long)r, (long long)n, (long long)e);
        }
        if (total % K != 0)
            return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: expert-parallel rank %lld reported %lld routed rows, not "
                              "%lld experts for each of its tokens; the ep ranks disagree on the dispatch",
                              (long long)r, (long long)total, (long long)K);
    }
    for (int64_t o = 0; o < ep; o++) {
        int64_t owned = 0;
        for (int64_t r = 0; r < ep; r++)
            for (int64_t e = o * El; e < (o + 1) * El; e++)
                owned += s->all[r * E + e];
        if (owned > INT32_MAX)
            return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "glm5: expert-parallel rank %lld would receive %lld routed "
                              "rows; row indices are int32 (at most %d): use more ranks or fewer tokens per step",
                              (long long)o, (long long)owned, INT32_MAX);
    }
    int64_t rows = 0;
    for (int64_t r = 0; r < ep; r++) {
        st->send[r] = count[(r + 1) * El] - count[r * El];
        st->recv[r] = 0;
        for (int64_t e = r0; e < r0 + El; e++)
            st->recv[r] += s->all[r * E + e];
        rows += st->recv[r];
    }
    st->rows = rows;
    // received rows: source-major, within a source its rows of local expert 0, 1, ... in its order; sorted rows:
    // expert-major, within an expert source 0, 1, ... (perm: received row of each sorted row; perm + Rr: reverse)
    int32_t *perm = malloc((size_t)(2 * rows + 1) * sizeof(int32_t));
    if (!perm)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of host memory for %lld dispatched rows", (long long)rows);
    int64_t j = 0;
    for (int64_t el = 0; el < El; el++) {
        st->first[el] = j;
        for (int64_t r = 0, base = 0; r < ep; base += st->recv[r], r++) {
            int64_t at = base;
            for (int64_t e = r0; e < r0 + el; e++)
                at += s->all[r * E + e];
            for (int64_t i = 0; i < s->all[r * E + r0 + el]; i++, j++)
                perm[j] = (int32_t)(at + i), perm[rows + at + i] = (int32_t)j;
        }
    }
    st->first[El] = j;
    int rc = ep_reserve(p, &st->perm, (size_t)(2 * rows) * sizeof(int32_t), err);
    if (rc == 0 && rows > 0)
        rc = d->copy(m->dev, st->perm.ptr, perm, (size_t)(2 * rows) * sizeof(int32_t), DSARL_COPY_HOST_TO_DEVICE,
                     err);
    free(perm);
    DSARL_TRY(rc);
    size_t e = m->elem;
    DSARL_TRY(ep_reserve(p, &st->in, (size_t)(rows * C) * e, err));
    DSARL_TRY(ep_reserve(p, &st->gate_up, (size_t)(rows * 2 * I) * e, err));
    DSARL_TRY(ep_reserve(p, &st->act, (size_t)(rows * I) * e, err));
    DSARL_TRY(ep_reserve(p, &s->raw, (size_t)(rows * C) * e, err));
    return ep_reserve(p, &s->sorted, (size_t)(rows * C) * e, err);
}

/* The all-to-all of rows of `width` storage elements: out (to this rank) from in (this rank's), toward the experts
 * (forward: send counts out, recv counts in) or back from them (the reverse). */
static int ep_exchange(glm5_pass *p, const struct glm5_moe_ep *st, void *out, const void *in, int64_t width,
                       bool toward_experts, dsarl_error *err)
{
    dsarl_model *m = p->m;
    int64_t ep = m->shards.ep_size, *send = p->ep_scratch->values, *recv = send + ep;
    for (int64_t r = 0; r < ep; r++) {
        send[r] = (toward_experts ? st->send[r] : st->recv[r]) * width;
        recv[r] = (toward_experts ? st->recv[r] : st->send[r]) * width;
    }
    return dsarl_device_all_to_all(m->dev_ops, m->dev, m->parallel.ep, out, recv, in, send, m->storage, err);
}

/* Rows rows[i] of src into dst (n, C); nothing for n = 0 (a rank may receive no rows). */
static int gather(dsarl_model *m, void *dst, const void *src, const int32_t *rows, int64_t n, int64_t C,
                  dsarl_error *err)
{
    return n > 0 ? m->dev_ops->gather_rows(m->dev, dst, src, rows, n, C, err) : DSARL_OK;
}

/* The experts' products over expert row groups first[0 .. groups] (host, first[groups] rows in all) of L's experts
 * 0 .. groups - 1, one grouped call per projection: gate_up = in W_gu,e^T, act = SwiGLU(gate_up), out =
 * act W_down,e^T. in (rows, C), gate_up (rows, 2I), act (rows, I), out (rows, C). */
static int grouped_experts_forward(dsarl_model *m, const glm5_layer *L, int64_t groups, const int64_t *first,
                                   const void *in, void *gate_up, void *act, void *out, dsarl_error *err)
{
    const dsarl_device_ops *d = m->dev_ops;
    int64_t C = m->cfg.hidden_size, I = m->cfg.moe_intermediate_size, rows = first[groups];
    DSARL_TRY(dsarl_device_gemm_grouped(d, m->dev, false, true, groups, first, 0, 2 * I, C, 1.0f, in,
                                        L->experts_gate_up, 2 * I * C, 0.0f, gate_up, 0, err));
    if (rows > 0)
        DSARL_TRY(d->swiglu_forward(m->dev, act, gate_up, rows, I, err));
    return dsarl_device_gemm_grouped(d, m->dev, false, true, groups, first, 0, C, I, 1.0f, act, L->experts_down, C * I,
                                     0.0f, out, 0, err);
}

/* Backward of grouped_experts_forward from dexp (rows, C): dact = dexp W_down,e and dW_down,e += dexp^T act, then
 * dgu = SwiGLU' and dW_gu,e += dgu^T in, dxin = dgu W_gu,e, in this order, so dxin may take dexp's room (its last
 * read comes first). */
static int grouped_experts_backward(dsarl_model *m, const glm5_layer *L, int64_t groups, const int64_t *first,
                                    const void *dexp, const void *in, const void *gate_up, const void *act,
                                    void *dact, void *dgu, void *dxin, dsarl_error *err)
{
    const dsarl_device_ops *d = m->dev_ops;
    int64_t C = m->cfg.hidden_size, I = m->cfg.moe_intermediate_size, rows = first[groups];
    DSARL_TRY(dsarl_device_gemm_grouped(d, m->dev, false, false, groups, first, 0, I, C, 1.0f, dexp, L->experts_down,
                                        C * I, 0.0f, dact, 0, err));
    DSARL_TRY(dsarl_device_gemm_grouped(d, m->dev, true, false, groups, first, C, I, 0, 1.0f, dexp, act, 0, 1.0f,
                                        glm5_grad_of(m, L->experts_down), C * I, err));
    if (rows > 0)
        DSARL_TRY(d->swiglu_backward(m->dev, dgu, dact, gate_up, rows, I, err));
    DSARL_TRY(dsarl_device_gemm_grouped(d, m->dev, true, false, groups, first, 2 * I, C, 0, 1.0f, dgu, in, 0, 1.0f,
                                        glm5_grad_of(m, L->experts_gate_up), 2 * I * C, err));
    return dsarl_device_gemm_grouped(d, m->dev, false, false, groups, first, 0, C, 2 * I, 1.0f, dgu,
                                     L->experts_gate_up, 2 * I * C, 0.0f, dxin, 0, err);
}

/* The expert side of the forward under EP: this rank's routed rows a->expert_in (N, C), grouped by expert and so
 * by owner, go to their owners; the local experts run on what arrives; a->expert_out (N, C) gets the outputs of
 * this rank's rows back in the same order. */
static int ep_experts_forward(glm5_pass *p, glm5_layer_acts *a, const glm5_layer *L, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const glm5_config *c = &m->cfg;
    int64_t C = c->hidden_size, El = c->n_routed_experts / m->shards.ep_size;
    struct glm5_moe_ep *st = a->ep;
    struct glm5_moe_ep_scratch *s = p->ep_scratch;
    int64_t Rr = st->rows;
    const int32_t *perm = st->perm.ptr, *inv = perm + Rr;
    DSARL_TRY(ep_exchange(p, st, s->raw.ptr, a->expert_in, C, true, err));
    DSARL_TRY(gather(m, st->in.ptr, s->raw.ptr, perm, Rr, C, err));
    DSARL_TRY(grouped_experts_forward(m, L, El, st->first, st->in.ptr, st->gate_up.ptr, st->act.ptr, s->sorted.ptr,
                                      err));
    DSARL_TRY(gather(m, s->raw.ptr, s->sorted.ptr, inv, Rr, C, err));
    return ep_exchange(p, st, a->expert_out, s->raw.ptr, C, false, err);
}

/* The expert side of the backward under EP: dexp (N, C) = this rank's rows' output gradients (routing weights
 * applied) go to the owners, which accumulate their experts' weight gradients; dxin (N, C) gets the input-row
 * gradients of this rank's rows back. */
static int ep_experts_backward(glm5_pass *p, glm5_grad_bufs *g, const glm5_layer_acts *a, const glm5_layer *L,
                               dsarl_error *err)
{
    dsarl_model *m = p->m;
    const glm5_config *c = &m->cfg;
    int64_t C = c->hidden_size, I = c->moe_intermediate_size, El = c->n_routed_experts / m->shards.ep_size;
    const struct glm5_moe_ep *st = a->ep;
    struct glm5_moe_ep_scratch *s = p->ep_scratch;
    int64_t Rr = st->rows;
    const int32_t *perm = st->perm.ptr, *inv = perm + Rr;
    // a recomputed layer's forward sized raw and sorted for this layer; dact and dgu are the backward's own
    DSARL_TRY(ep_reserve(p, &s->dact, (size_t)(Rr * I) * m->elem, err));
    DSARL_TRY(ep_reserve(p, &s->dgu, (size_t)(Rr * 2 * I) * m->elem, err));
    void *dexp = s->sorted.ptr, *dact = s->dact.ptr, *dgu = s->dgu.ptr;
    DSARL_TRY(ep_exchange(p, st, s->raw.ptr, g->dexp, C, true, err));
    DSARL_TRY(gather(m, dexp, s->raw.ptr, perm, Rr, C, err));
    void *dxin = s->sorted.ptr; // the input gradients take the room of the sorted output gradients (dexp), spent
                                // by then (grouped_experts_backward's order)
    DSARL_TRY(grouped_experts_backward(m, L, El, st->first, dexp, st->in.ptr, st->gate_up.ptr, st->act.ptr, dact, dgu,
                                       dxin, err));
    DSARL_TRY(gather(m, s->raw.ptr, dxin, inv, Rr, C, err));
    return ep_exchange(p, st, g->dxin, s->raw.ptr, C, false, err);
}

int glm5_moe_serve(glm5_pass *p, glm5_layer_acts *a, const glm5_layer *L, dsarl_error *err)
{
    dsarl_model *m = p->m;
    if (!ep_active(m))
        return DSARL_OK;
    int64_t E = m->cfg.n_routed_experts;
    if (!a->count) // no rows of its own: every expert's group is empty (the exchanges still take one room each)
        DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(E + 1) * sizeof(int64_t), (void **)&a->count, err));
    if (!a->expert_in)
        DSARL_TRY(glm5_pass_alloc(p, m->elem, &a->expert_in, err));
    if (!a->expert_out)
        DSARL_TRY(glm5_pass_alloc(p, m->elem, &a->expert_out, err));
    memset(a->count, 0, (size_t)(E + 1) * sizeof(int64_t));
    DSARL_TRY(ep_plan(p, a, a->count, err));
    return ep_experts_forward(p, a, L, err);
}

// The experts on this rank's own routed rows (no EP): a->expert_in (R, C) grouped by expert -> a->expert_out.
static int local_experts_forward(glm5_pass *p, glm5_layer_acts *a, const glm5_layer *L, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t C = c->hidden_size, E = c->n_routed_experts, I = c->moe_intermediate_size;
    int64_t rows_used = a->moe_rows, pad = a->moe_pad;
    if (!pad) // the experts' row groups, one grouped call per projection (the device may run them at once)
        return grouped_experts_forward(m, L, E, a->count, a->expert_in, a->gate_up, a->act, a->expert_out, err);
    DSARL_TRY(d->gemm_strided_batched(m->dev, false, true, pad, 2 * I, C, 1.0f, a->expert_in, pad * C,
                                      L->experts_gate_up, 2 * I * C, 0.0f, a->gate_up, pad * 2 * I, E, err));
    DSARL_TRY(d->swiglu_forward(m->dev, a->act, a->gate_up, rows_used, I, err));
    return d->gemm_strided_batched(m->dev, false, true, pad, C, I, 1.0f, a->act, pad * I, L->experts_down, C * I,
                                   0.0f, a->expert_out, pad * C, E, err);
}

// Backward of local_experts_forward from g->dexp (R, C) (routing weights applied): weight gradients accumulated,
// g->dxin (R, C) the input-row gradients.
static int local_experts_backward(glm5_pass *p, glm5_grad_bufs *g, const glm5_layer_acts *a, const glm5_layer *L,
                                  dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t C = c->hidden_size, E = c->n_routed_experts, I = c->moe_intermediate_size;
    int64_t R = a->moe_rows, pad = a->moe_pad;
    if (!pad)
        return grouped_experts_backward(m, L, E, a->count, g->dexp, a->expert_in, a->gate_up, a->act, g->dact, g->dgu,
                                        g->dxin, err);
    DSARL_TRY(d->gemm_strided_batched(m->dev, false, false, pad, I, C, 1.0f, g->dexp, pad * C, L->experts_down, C * I,
                                      0.0f, g->dact, pad * I, E, err));
    DSARL_TRY(d->gemm_strided_batched(m->dev, true, false, C, I, pad, 1.0f, g->dexp, pad * C, a->act, pad * I, 1.0f,
                                      glm5_grad_of(m, L->experts_down), C * I, E, err));
    DSARL_TRY(d->swiglu_backward(m->dev, g->dgu, g->dact, a->gate_up, R, I, err));
    DSARL_TRY(d->gemm_strided_batched(m->dev, true, false, 2 * I, C, pad, 1.0f, g->dgu, pad * 2 * I, a->expert_in,
                                      pad * C, 1.0f, glm5_grad_of(m, L->experts_gate_up), 2 * I * C, E, err));
    return d->gemm_strided_batched(m->dev, false, false, pad, C, 2 * I, 1.0f, g->dgu, pad * 2 * I, L->experts_gate_up,
                                   2 * I * C, 0.0f, g->dxin, pad * C, E, err);
}

/* Whether MoE layer `layer` of a device with moe_group_padded groups its rows there (glm5_moe_forward): the pass
 * is not expert-parallel (an expert group there is what its owner receives, counted on the host), no routing is
 * recorded or replayed on the layer (those need the ids on the host), and the tokens are few enough for
 * glm5_moe_pad to pad every group to T on a launch-bound device. Recompute reruns a layer with the same answer. */
static bool device_grouping(const glm5_pass *p, int32_t layer)
{
    const dsarl_model *m = p->m;
    return !ep_active(m) && m->launch_bound && p->T > 0 && p->T <= GLM5_MOE_PAD_MAX &&
           !glm5_routing_experts_on_host(p, layer);
}

/* The rest of the forward once a->rows/slot/slot_inv (device) and a->moe_pad/moe_rows are set: routing weights and
 * input rows gathered, the experts (locally, or under EP by their owners from count, the host first row of each
 * expert), and y (T,C) = the weighted sum of each token's expert outputs. */
static int experts_and_combine(glm5_pass *p, glm5_layer_acts *a, const glm5_layer *L, void *y, const int64_t *count,
                               dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    int64_t T = p->T, C = m->cfg.hidden_size, rows_used = a->moe_rows;
    // row_scale[r] = route_w[slot[r]] on the device: a gather of float32 values moved as rows of 4 bytes (one or
    // two storage elements), a bit copy
    DSARL_TRY(d->gather_rows(m->dev, a->row_scale, a->route_w, a->slot, rows_used, glm5_f32_units(m), err));
    DSARL_TRY(d->gather_rows(m->dev, a->expert_in, a->h2, a->rows, rows_used, C, err));
    if (ep_active(m)) { // the owners run the experts on every rank's rows; the combine stays here
        DSARL_TRY(ep_plan(p, a, count, err));
        DSARL_TRY(ep_experts_forward(p, a, L, err));
    } else {
        DSARL_TRY(local_experts_forward(p, a, L, err));
    }
    DSARL_TRY(d->zero(m->dev, y, (size_t)(T * C) * m->elem, err));
    return d->scatter_add_rows(m->dev, y, a->expert_out, a->rows, a->row_scale, rows_used, C, err);
}

int glm5_moe_forward(glm5_pass *p, glm5_layer_acts *a, const glm5_layer *L, void *y, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t T = p->T, C = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    int64_t N = T * K;
    // router logits, bias and weights in float32 whatever the storage (transformers routes in fp32): a bf16 logit
    // or bias would move top-k near-ties
    DSARL_TRY(d->gemm_f32out(m->dev, false, true, T, E, C, 1.0f, a->h2, L->router, 0.0f, a->router_logits, err));
    DSARL_TRY(d->moe_route_forward(m->dev, a->route_idx, a->route_w, a->router_probs, a->router_logits,
                                   L->router_bias32, T, E, (int32_t)K, c->n_group, c->topk_group, c->norm_topk_prob,
                                   (float)c->routed_scaling_factor, err));
    int32_t layer = (int32_t)(L - m->layers);
    int (*group)(dsarl_device *, int32_t *, int32_t *, int32_t *, const int32_t *, int64_t, int64_t, int32_t,
                 int64_t, dsarl_error *) = DSARL_DEVICE_SLOT(d, moe_group_padded);
    if (group && device_grouping(p, layer)) {
        // the padded layout glm5_moe_pad takes on a launch-bound device for T <= GLM5_MOE_PAD_MAX, with pad = T
        // (the largest group there can be) rather than the largest group, which only the device knows: nothing
        // comes back to the host. a->count (the unpadded paths' and EP's) is not filled: neither runs here.
        a->moe_pad = T;
        a->moe_rows = E * T;
        DSARL_TRY(group(m->dev, a->rows, a->slot, a->slot_inv, a->route_idx, T, E, (int32_t)K, T, err));
        return experts_and_combine(p, a, L, y, NULL, err);
    }
    // group (token, slot) pairs by expert on the host: the counts decide the GEMM shapes. One download (the expert
    // ids) and one upload (rows, slot, slot_inv: one block) per layer, each a wait for the device.
    int64_t R = glm5_moe_rows(m, T); // the rows block's layout (glm5_layer_acts_alloc)
    int32_t *idx, *rows;
    int64_t *fill;
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)N * sizeof(int32_t), (void **)&idx, err));
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(2 * R + N) * sizeof(int32_t), (void **)&rows, err));
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)E * sizeof(int64_t), (void **)&fill, err));
    DSARL_TRY(d->copy(m->dev, idx, a->route_idx, (size_t)N * sizeof(int32_t), DSARL_COPY_DEVICE_TO_HOST, err));
    DSARL_TRY(glm5_routing_experts(p, a, layer, idx, err));
    int32_t *slot = rows + R, *slot_inv = rows + 2 * R;
    int64_t *count = a->count, largest = 0;
    memset(count, 0, (size_t)(E + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < N; i++)
        count[idx[i] + 1]++;
    for (int64_t e = 0; e < E; e++) {
        largest = count[e + 1] > largest ? count[e + 1] : largest;
        count[e + 1] += count[e]; // count[e] = first row of expert e
    }
    // small or balanced groups (glm5_moe_pad): expert e's rows at e * pad, the rest of its pad rows read token
    // r mod T with weight 0 (route_w[N]), so one batched GEMM covers every expert and the combine adds a few zero
    // terms to each token, not E * pad of them to token 0 (one destination summing them all serialises a GPU's
    // scatter). Not under EP: the rows of an expert group are what its owner receives.
    a->moe_pad = ep_active(m) ? 0 : glm5_moe_pad(m, T, largest);
    a->moe_rows = a->moe_pad ? E * a->moe_pad : N;
    for (int64_t e = 0; e < E; e++)
        fill[e] = a->moe_pad ? e * a->moe_pad : count[e];
    for (int64_t r = 0; r < a->moe_rows; r++)
        rows[r] = (int32_t)(r % T), slot[r] = (int32_t)N;
    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < K; k++) {
            int64_t r = fill[idx[t * K + k]]++;
            rows[r] = (int32_t)t;
            slot[r] = (int32_t)(t * K + k);
            slot_inv[t * K + k] = (int32_t)r;
        }
    DSARL_TRY(d->copy(m->dev, a->rows, rows, (size_t)(2 * R + N) * sizeof(int32_t), DSARL_COPY_HOST_TO_DEVICE,
                      err));
    return experts_and_combine(p, a, L, y, count, err);
}

int glm5_moe_backward(glm5_pass *p, glm5_grad_bufs *g, const glm5_layer_acts *a, const glm5_layer *L,
                        const void *dy, void *dh2, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t T = p->T, C = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    int64_t N = T * K;
    // routed rows: y[t] += w_r * expert_out_r  ->  d expert_out_r = w_r dy[t], d w_r = <dy[t], expert_out_r>;
    // padding rows (a->moe_pad: one batched GEMM per product) have w_r = 0, so their gradients are zero and add
    // nothing to the weight gradients or to dh2. Under EP expert_out holds the owners' outputs sent back, so the
    // routing-weight gradient is taken here, where the routing happened.
    int64_t R = a->moe_rows;
    DSARL_TRY(d->gather_rows(m->dev, g->dexp, dy, a->rows, R, C, err));
    DSARL_TRY(d->row_dot(m->dev, g->dscale, g->dexp, a->expert_out, R, C, err));
    DSARL_TRY(d->scale_rows(m->dev, g->dexp, a->row_scale, R, C, err));
    if (ep_active(m))
        DSARL_TRY(ep_experts_backward(p, g, a, L, err));
    else
        DSARL_TRY(local_experts_backward(p, g, a, L, err));
    DSARL_TRY(d->scatter_add_rows(m->dev, dh2, g->dxin, a->rows, NULL, R, C, err));
    // routing weights back to their (token, slot), then through the router: droute_w[t*K + k] = dscale[its row],
    // a gather of float32 values on the device (no round trip through the host)
    DSARL_TRY(d->gather_rows(m->dev, g->droute_w, g->dscale, a->slot_inv, N, glm5_f32_units(m), err));
    DSARL_TRY(d->moe_route_backward(m->dev, g->drouter, g->droute_w, a->route_idx, a->router_probs, T, E,
                                    (int32_t)K, c->norm_topk_prob, (float)c->routed_scaling_factor, err));
    int rc = 0;
    const void *drouter = glm5_storage_operand(m, g->drouter, g->drouter_s, T * E, err, &rc);
    DSARL_TRY(rc);
    DSARL_TRY(glm5_linear_dweight(m, L->router, drouter, a->h2, T, C, E, err));
    return glm5_linear_dinput(m, dh2, drouter, L->router, T, C, E, 1.0f, err);
}

