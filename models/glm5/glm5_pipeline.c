/* glm5_pipeline.c: pipeline parallelism of the glm5 model. Each pp rank holds the decoder layers of its stage
 * (the split of dsarl/pipeline.h), the first stage the embedding, the last the final norm and LM head. A pass runs
 * the stages in turn: a stage receives the residual stream (its rows under sequence parallelism) from the previous
 * stage with the device recv, runs its layers and sends the result on; the backward sends the residual stream's
 * gradient the other way. A stage whose first layer is an IndexShare "shared" layer also receives the top-k
 * indices its layer reuses (computed by the full layer on an earlier stage), so it attends to exactly the keys one
 * process selects. The last stage's log-probs (or logits) are broadcast over the pp group, so every rank returns
 * what one process returns. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dsarl/pipeline.h"
#include "glm5_pass.h"

int glm5_stage_resolve(const glm5_config *cfg, const dsarl_parallel *par, const dsarl_node *recipe, glm5_stage *out,
                       dsarl_error *err)
{
    *out = (glm5_stage){.rank = 0, .size = 1, .first = 0, .end = cfg->num_hidden_layers};
    int32_t pp = par ? par->pp_size : 1;
    if (pp <= 1) {
        int32_t starts[2];
        // the keys are still checked (a virtual pipeline size is refused even without pipeline parallelism)
        return dsarl_pipeline_stage_layers(recipe, cfg->num_hidden_layers, 1, starts, err);
    }
    if (!DSARL_PARALLEL_HAS_GROUPS(par) || !par->pp || dsarl_group_size(par->pp) != pp ||
        dsarl_group_rank(par->pp) != par->pp_rank)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "glm5: pipeline parallelism (pp %d) needs the process groups of "
                          "an ABI 1.3 core, the pp group ranked by stage", pp);
    int32_t *starts = malloc((size_t)(pp + 1) * sizeof(int32_t));
    if (!starts)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory splitting %d pipeline stages", pp);
    int rc = dsarl_pipeline_stage_layers(recipe, cfg->num_hidden_layers, pp, starts, err);
    if (rc) {
        free(starts);
        return rc;
    }
    *out = (glm5_stage){.rank = par->pp_rank, .size = pp, .first = starts[par->pp_rank],
                        .end = starts[par->pp_rank + 1], .starts = starts};
    return DSARL_OK;
}

bool glm5_stage_holds(const glm5_config *cfg, const glm5_stage *s, const glm5_param *p)
{
    if (p->layer >= 0)
        return p->layer >= s->first && p->layer < s->end;
    bool first = s->rank == 0, last = s->rank == s->size - 1;
    if (!strcmp(p->name, "model.embed_tokens.weight"))
        return first || (last && cfg->tie_word_embeddings); // a tied embedding is the last stage's LM head too
    return last; // model.norm.weight, lm_head.weight
}

void glm5_stage_filter_specs(const glm5_config *cfg, const glm5_stage *s, glm5_param *params, int64_t *n,
                             int64_t *n_weights)
{
    // a dropped spec frees its span up to the next spec's offset (its padding included), so every kept offset
    // moves down by a multiple of 64 and the gate/up pairs (listed back to back) stay adjacent
    int64_t kept = 0, removed = 0;
    for (int64_t i = 0; i < *n; i++) {
        int64_t span = (i + 1 < *n ? params[i + 1].offset : *n_weights) - params[i].offset;
        if (!glm5_stage_holds(cfg, s, &params[i])) {
            removed += span;
            continue;
        }
        params[kept] = params[i];
        params[kept].offset -= removed;
        kept++;
    }
    *n = kept;
    *n_weights -= removed;
}

// The pp group of the model (non-NULL whenever the stage count is above one: glm5_stage_resolve checked it).
static const dsarl_group *pp_group(const dsarl_model *m)
{
    return m->stage.size > 1 ? m->parallel.pp : NULL;
}

int glm5_stage_share_last(dsarl_model *m, float *host, int64_t n, dsarl_error *err)
{
    if (m->stage.size <= 1)
        return DSARL_OK;
    return dsarl_group_broadcast_host(pp_group(m), host, n, DSARL_DTYPE_F32, m->stage.size - 1, err);
}

int glm5_stage_sum(dsarl_model *m, double *value, dsarl_error *err)
{
    if (m->stage.size <= 1)
        return DSARL_OK;
    return dsarl_group_all_reduce_host(pp_group(m), value, 1, DSARL_DTYPE_F64, DSARL_REDUCE_SUM, err);
}

int glm5_stage_reduce_tied(dsarl_model *m, dsarl_error *err)
{
    if (m->stage.size <= 1 || !m->cfg.tie_word_embeddings)
        return DSARL_OK;
    const glm5_param *p = glm5_model_find_param(m, "model.embed_tokens.weight");
    const dsarl_device_ops *d = m->dev_ops;
    // the middle stages hold no copy: they take part in the sum over pp with zeros
    void *buf = p ? glm5_at(m, m->grads, p->offset) : NULL, *zeros = NULL;
    int64_t n = glm5_local_vocab(m) * m->cfg.hidden_size;
    if (!p) {
        DSARL_TRY(d->alloc(m->dev, (size_t)n * m->elem, &zeros, err));
        buf = zeros;
    }
    int rc = p ? DSARL_OK : d->zero(m->dev, zeros, (size_t)n * m->elem, err);
    if (rc == 0)
        rc = dsarl_device_all_reduce(d, m->dev, pp_group(m), buf, n, m->storage, DSARL_REDUCE_SUM, err);
    if (zeros)
        d->free(m->dev, zeros);
    return rc;
}

// Whether the activations into the stage starting at layer `first` carry the top-k of the layer before it.
static bool carries_topk(const dsarl_model *m, int32_t first)
{
    return first > 0 && first < m->cfg.num_hidden_layers && !m->cfg.indexer_full[first];
}

// Receives the stage's input into p->x (and the top-k a shared first layer reuses into p->stage_topk).
static int recv_input(glm5_pass *p, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    int32_t from = m->stage.rank - 1;
    DSARL_TRY(d->recv(m->dev, pp_group(m), p->x, p->T_sp * m->cfg.hidden_size, m->storage, from, err));
    if (!carries_topk(m, m->stage.first))
        return DSARL_OK;
    size_t bytes = (size_t)(p->T * p->topk_width) * sizeof(int32_t);
    DSARL_TRY(glm5_pass_alloc(p, bytes, (void **)&p->stage_topk, err));
    return d->recv(m->dev, pp_group(m), p->stage_topk, p->T * p->topk_width, DSARL_DTYPE_I32, from, err);
}

int glm5_stage_input(glm5_pass *p, const int32_t **prev_topk, dsarl_error *err)
{
    *prev_topk = NULL;
    if (glm5_stage_is_first(p->m))
        return glm5_embed(p, err);
    if (!p->input_ready) // a pipeline schedule received it already
        DSARL_TRY(recv_input(p, err));
    *prev_topk = p->stage_topk;
    return DSARL_OK;
}

// Sends p->x (and topk, when the next stage starts on a shared layer) to the next stage.
static int send_output(glm5_pass *p, const int32_t *topk, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    int32_t to = m->stage.rank + 1;
    DSARL_TRY(d->send(m->dev, pp_group(m), p->x, p->T_sp * m->cfg.hidden_size, m->storage, to, err));
    if (!carries_topk(m, m->stage.end))
        return DSARL_OK;
    if (!topk)
        return DSARL_FAIL(err, DSARL_E_INTERNAL, "glm5: stage %d has no top-k for the shared layer %d after it",
                          m->stage.rank, m->stage.end);
    return d->send(m->dev, pp_group(m), topk, p->T * p->topk_width, DSARL_DTYPE_I32, to, err);
}

int glm5_stage_output(glm5_pass *p, const int32_t *topk, dsarl_error *err)
{
    if (p->staged) { // the schedule sends it (stage_transfer)
        p->out_topk = topk;
        return DSARL_OK;
    }
    return send_output(p, topk, err);
}

int glm5_stage_grad_input(glm5_pass *p, void *dx, dsarl_error *err)
{
    dsarl_model *m = p->m;
    if (p->grad_ready)
        return DSARL_OK;
    return m->dev_ops->recv(m->dev, pp_group(m), dx, p->T_sp * m->cfg.hidden_size, m->storage, m->stage.rank + 1,
                            err);
}

// Sends the input gradient dx to the previous stage.
static int send_grad(glm5_pass *p, const void *dx, dsarl_error *err)
{
    dsarl_model *m = p->m;
    return m->dev_ops->send(m->dev, pp_group(m), dx, p->T_sp * m->cfg.hidden_size, m->storage, m->stage.rank - 1,
                            err);
}

int glm5_stage_grad_output(glm5_pass *p, const void *dx, dsarl_error *err)
{
    return p->staged ? DSARL_OK : send_grad(p, dx, err); // staged: the schedule sends it
}

/* --- the stage ops of a pipeline schedule (dsarl_model_ops.stage_*, ABI 1.4) --------------------------------- */

// The training pass of slot (NULL when none is open); refuses a slot outside [0, pp).
static int slot_of(dsarl_model *m, int32_t slot, glm5_train ***out, dsarl_error *err)
{
    int32_t n = m->stage.size;
    if (slot < 0 || slot >= n)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: pipeline slot %d is outside [0, %d) (one per microbatch in "
                          "flight, at most the stage count)", slot, n);
    if (!m->stage_slots && !(m->stage_slots = calloc((size_t)n, sizeof(glm5_train *))))
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of host memory for %d pipeline slots", n);
    *out = &m->stage_slots[slot];
    return DSARL_OK;
}

// Releases the pass of *slot.
static void close_slot(glm5_train **slot)
{
    glm5_train_free(*slot);
    *slot = NULL;
}

void glm5_stage_release(dsarl_model *m)
{
    for (int32_t i = 0; m->stage_slots && i < m->stage.size; i++)
        close_slot(&m->stage_slots[i]);
    free(m->stage_slots);
    m->stage_slots = NULL;
}

int glm5_stage_forward(dsarl_model *m, int32_t slot, const dsarl_token_batch *batch, const int32_t *targets,
                       float *logprobs, dsarl_error *err)
{
    glm5_train **tr = NULL;
    DSARL_TRY(slot_of(m, slot, &tr, err));
    if (!*tr && !glm5_stage_is_first(m))
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: stage %d's forward of slot %d has no input (stage_transfer "
                          "receives it first)", m->stage.rank, slot);
    if (!*tr)
        DSARL_TRY(glm5_train_open(m, batch, true, tr, err));
    int rc = glm5_train_run_forward(m, *tr, targets, logprobs, err);
    if (rc)
        close_slot(tr);
    return rc;
}

int glm5_stage_backward(dsarl_model *m, int32_t slot, const float *dlogprobs, float *indexer_loss,
                        dsarl_error *err)
{
    glm5_train **tr = NULL;
    DSARL_TRY(slot_of(m, slot, &tr, err));
    if (!*tr)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: stage %d's backward of slot %d has no forward pending",
                          m->stage.rank, slot);
    int rc = glm5_train_run_backward(m, *tr, dlogprobs, indexer_loss, err);
    if (rc || glm5_stage_is_first(m)) // the other stages keep it until its gradient is sent
        close_slot(tr);
    return rc;
}

// One transfer of a schedule step: a send (backward: of the input gradient, which releases the slot) or a receive.
static int transfer_one(dsarl_model *m, const dsarl_stage_transfer *t, bool send, bool forward, dsarl_error *err)
{
    int32_t slot = send ? (forward ? t->send_forward : t->send_backward)
                        : (forward ? t->recv_forward : t->recv_backward);
    if (slot < 0)
        return DSARL_OK;
    glm5_train **tr = NULL;
    DSARL_TRY(slot_of(m, slot, &tr, err));
    if (!send && forward) { // opens the slot
        if (*tr || !t->recv_batch)
            return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: receiving into pipeline slot %d needs a free slot and its "
                              "batch", slot);
        DSARL_TRY(glm5_train_open(m, t->recv_batch, true, tr, err));
        int rc = recv_input(&(*tr)->p, err);
        (*tr)->p.input_ready = rc == 0;
        return rc;
    }
    if (!*tr)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: pipeline slot %d has no pass to transfer", slot);
    glm5_pass *p = &(*tr)->p;
    if (send && forward)
        return send_output(p, p->out_topk, err);
    if (send) {
        int rc = send_grad(p, (*tr)->g.dx, err);
        close_slot(tr);
        return rc;
    }
    DSARL_TRY(glm5_train_grad_bufs(m, *tr, err));
    DSARL_TRY(m->dev_ops->recv(m->dev, pp_group(m), (*tr)->g.dx, p->T_sp * m->cfg.hidden_size, m->storage,
                               m->stage.rank + 1, err));
    p->grad_ready = true;
    return DSARL_OK;
}

int glm5_stage_transfer(dsarl_model *m, const dsarl_stage_transfer *t, dsarl_error *err)
{
    if (!t || t->struct_size < sizeof *t)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: stage_transfer needs a dsarl_stage_transfer of ABI 1.4");
    if (m->stage.size <= 1)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: stage_transfer needs pipeline parallelism (pp is 1)");
    // both ends of a link pair their calls: the even stage of the two sends first, the odd one receives first
    bool send_first = m->stage.rank % 2 == 0;
    for (int round = 0; round < 2; round++) {
        bool send = (round == 0) == send_first;
        DSARL_TRY(transfer_one(m, t, send, true, err));
        DSARL_TRY(transfer_one(m, t, send, false, err));
    }
    return DSARL_OK;
}

int glm5_stage_all_specs(dsarl_model *m, glm5_param **all, int64_t *n_all, int64_t **local, dsarl_error *err)
{
    *all = m->params, *n_all = m->n_params;
    if (m->stage.size > 1) {
        int64_t n_weights;
        DSARL_TRY(glm5_param_specs(&m->cfg, &m->shards, all, n_all, &n_weights, err));
    }
    if (!(*local = malloc((size_t)(*n_all + 1) * sizeof(int64_t)))) {
        if (*all != m->params)
            free(*all);
        *all = NULL;
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory listing the model's parameters");
    }
    // both lists are in buffer order, the stage's a subsequence of the whole's
    for (int64_t i = 0, j = 0; i < *n_all; i++) {
        bool same = j < m->n_params && !strcmp(m->params[j].name, (*all)[i].name);
        (*local)[i] = same ? j++ : -1;
    }
    return DSARL_OK;
}

// The stage that holds parameter p (the first of the two for a tied embedding).
static int32_t owner_stage(const dsarl_model *m, const glm5_param *p)
{
    if (p->layer < 0)
        return strcmp(p->name, "model.embed_tokens.weight") ? m->stage.size - 1 : 0;
    int32_t s = 0;
    while (s + 1 < m->stage.size && m->stage.starts[s + 1] <= p->layer)
        s++;
    return s;
}

int glm5_stage_fetch(dsarl_model *m, const glm5_param *p, const float *mine, float *staged, const float **out,
                     dsarl_error *err)
{
    *out = mine;
    int32_t owner = m->stage.size > 1 ? owner_stage(m, p) : 0;
    if (owner == 0)
        return DSARL_OK;
    // the ranks the save's gather reads on the first stage (glm5_hf_io.c): world rank 0 for a tensor every rank
    // holds whole, the first data-parallel replica's tp ranks for a split one, the first edp replica's ep ranks
    // for experts; a pp group joins ranks of the same coordinates in every stage
    const dsarl_parallel *par = &m->parallel;
    bool takes_part = p->shard_dim < 0                ? par->tp_rank == 0 && par->dp_rank == 0 && par->cp_rank == 0
                      : p->shard == GLM5_SHARD_EXPERT ? par->edp_rank == 0
                                                      : par->dp_rank == 0 && par->cp_rank == 0;
    if (!takes_part)
        return DSARL_OK;
    if (m->stage.rank == owner)
        return dsarl_group_send_host(pp_group(m), mine, p->numel, DSARL_DTYPE_F32, 0, err);
    if (m->stage.rank != 0)
        return DSARL_OK;
    *out = staged;
    return dsarl_group_recv_host(pp_group(m), staged, p->numel, DSARL_DTYPE_F32, owner, err);
}

bool glm5_stage_key_elsewhere(const dsarl_model *m, const char *key)
{
    if (m->stage.size <= 1)
        return false;
    int layer = -1;
    if (sscanf(key, "model.layers.%d.", &layer) == 1)
        return layer >= 0 && layer < m->cfg.num_hidden_layers && !glm5_stage_has_layer(m, layer);
    return !strcmp(key, "model.embed_tokens.weight") || !strcmp(key, "model.norm.weight") ||
           !strcmp(key, "lm_head.weight");
}
