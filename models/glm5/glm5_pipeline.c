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
    int32_t pp = par ? par->pp_size : 1, L = cfg->num_hidden_layers, vpp = 1;
    *out = (glm5_stage){.rank = 0, .size = 1, .chunks = 1};
    // the keys are checked even without pipeline parallelism (virtual stages need pp > 1)
    DSARL_TRY(dsarl_pipeline_virtual_stages(recipe, pp > 1 ? pp : 1, &vpp, err));
    int32_t layout_vpp = dsarl_parallel_vpp(par);
    if (recipe && pp > 1 && layout_vpp != vpp)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: the recipe's virtual_pipeline_model_parallel_size (%d) is not "
                          "the layout's (%d)", vpp, layout_vpp);
    vpp = recipe ? vpp : layout_vpp;
    if (pp > 1 && (!DSARL_PARALLEL_HAS_GROUPS(par) || !par->pp || dsarl_group_size(par->pp) != pp ||
                   dsarl_group_rank(par->pp) != par->pp_rank))
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "glm5: pipeline parallelism (pp %d) needs the process groups of "
                          "an ABI 1.3 core, the pp group ranked by stage", pp);
    if (pp <= 1)
        pp = 1, vpp = 1;
    int32_t *starts = malloc((size_t)(vpp * pp + 1) * sizeof(int32_t));
    if (!starts)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory splitting %d pipeline stages", vpp * pp);
    int rc = dsarl_pipeline_chunk_layers(recipe, L, pp, vpp, starts, err);
    if (rc) {
        free(starts);
        return rc;
    }
    *out = (glm5_stage){.rank = pp > 1 ? par->pp_rank : 0, .size = pp, .chunks = vpp, .starts = starts};
    return DSARL_OK;
}

bool glm5_stage_holds(const glm5_config *cfg, const glm5_stage *s, const glm5_param *p)
{
    if (p->layer >= 0)
        return glm5_stage_chunk_of(s, p->layer) >= 0;
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

int glm5_stage_max_i32(dsarl_model *m, int32_t *buf, int64_t n, dsarl_error *err)
{
    if (m->stage.size <= 1 || n <= 0)
        return DSARL_OK;
    return dsarl_group_all_reduce_host(pp_group(m), buf, n, DSARL_DTYPE_I32, DSARL_REDUCE_MAX, err);
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

// Whether the activations into the virtual stage starting at layer `first` carry the top-k of the layer before it.
static bool carries_topk(const dsarl_model *m, int32_t first)
{
    return first > 0 && first < m->cfg.num_hidden_layers && !m->cfg.indexer_full[first];
}

// The pp ranks of the virtual stages before and after this rank's chunks (a ring under virtual stages: the last
// rank's chunk c feeds the first rank's chunk c + 1).
static int32_t prev_rank(const dsarl_model *m) { return (m->stage.rank + m->stage.size - 1) % m->stage.size; }
static int32_t next_rank(const dsarl_model *m) { return (m->stage.rank + 1) % m->stage.size; }

// Receives chunk c's input into p->x (and the top-k a shared first layer reuses into p->stage_topk[c]).
static int recv_input(glm5_pass *p, int32_t c, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    int32_t from = prev_rank(m);
    DSARL_TRY(d->recv(m->dev, pp_group(m), p->x, p->T_sp * m->cfg.hidden_size, m->storage, from, err));
    if (!carries_topk(m, glm5_chunk_first(&m->stage, c)))
        return DSARL_OK;
    if (!p->stage_topk)
        DSARL_TRY(glm5_pass_host_alloc(p, (size_t)m->stage.chunks * sizeof(int32_t *), (void **)&p->stage_topk, err));
    if (!p->stage_topk[c]) {
        size_t bytes = (size_t)(p->T * p->topk_width) * sizeof(int32_t);
        DSARL_TRY(glm5_pass_alloc(p, bytes, (void **)&p->stage_topk[c], err));
    }
    return d->recv(m->dev, pp_group(m), p->stage_topk[c], p->T * p->topk_width, DSARL_DTYPE_I32, from, err);
}

int glm5_stage_input(glm5_pass *p, int32_t c, const int32_t **prev_topk, dsarl_error *err)
{
    *prev_topk = NULL;
    if (glm5_chunk_is_first(p->m, c))
        return glm5_embed(p, err);
    if (!p->input_ready) { // a pipeline schedule received it already
        glm5_scope(p->m, "pipeline");
        DSARL_TRY(recv_input(p, c, err));
    }
    p->input_ready = false;
    *prev_topk = glm5_stage_topk(p, c);
    return DSARL_OK;
}

// Sends p->x (and topk, when the next virtual stage starts on a shared layer) on from chunk c.
static int send_output(glm5_pass *p, int32_t c, const int32_t *topk, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    int32_t to = next_rank(m), end = glm5_chunk_end(&m->stage, c);
    DSARL_TRY(d->send(m->dev, pp_group(m), p->x, p->T_sp * m->cfg.hidden_size, m->storage, to, err));
    if (!carries_topk(m, end))
        return DSARL_OK;
    if (!topk)
        return DSARL_FAIL(err, DSARL_E_INTERNAL, "glm5: stage %d has no top-k for the shared layer %d after it",
                          m->stage.rank, end);
    return d->send(m->dev, pp_group(m), topk, p->T * p->topk_width, DSARL_DTYPE_I32, to, err);
}

int glm5_stage_output(glm5_pass *p, int32_t c, const int32_t *topk, dsarl_error *err)
{
    if (p->staged) { // the schedule sends it (stage_transfer)
        p->out_topk = topk;
        return DSARL_OK;
    }
    glm5_scope(p->m, "pipeline");
    return send_output(p, c, topk, err);
}

int glm5_stage_grad_input(glm5_pass *p, void *dx, dsarl_error *err)
{
    dsarl_model *m = p->m;
    if (p->grad_ready) {
        p->grad_ready = false;
        return DSARL_OK;
    }
    glm5_scope(m, "pipeline");
    return m->dev_ops->recv(m->dev, pp_group(m), dx, p->T_sp * m->cfg.hidden_size, m->storage, next_rank(m), err);
}

// Sends the input gradient dx to the previous virtual stage.
static int send_grad(glm5_pass *p, const void *dx, dsarl_error *err)
{
    dsarl_model *m = p->m;
    return m->dev_ops->send(m->dev, pp_group(m), dx, p->T_sp * m->cfg.hidden_size, m->storage, prev_rank(m), err);
}

int glm5_stage_grad_output(glm5_pass *p, const void *dx, dsarl_error *err)
{
    if (p->staged) // the schedule sends it
        return DSARL_OK;
    glm5_scope(p->m, "pipeline");
    return send_grad(p, dx, err);
}

/* --- the stage ops of a pipeline schedule (dsarl_model_ops.stage_*, ABI 1.4) --------------------------------- */

// The training pass of slot (NULL when none is open); refuses a slot outside [0, glm5_stage_slots).
static int slot_of(dsarl_model *m, int32_t slot, glm5_train ***out, dsarl_error *err)
{
    int32_t n = glm5_stage_slots(&m->stage);
    if (slot < 0 || slot >= n)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: pipeline slot %d is outside [0, %d) (one per microbatch in "
                          "flight: the stage count, twice it under virtual stages)", slot, n);
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
    for (int32_t i = 0; m->stage_slots && i < glm5_stage_slots(&m->stage); i++)
        close_slot(&m->stage_slots[i]);
    free(m->stage_slots);
    m->stage_slots = NULL;
}

int glm5_stage_forward(dsarl_model *m, int32_t slot, const dsarl_token_batch *batch, const int32_t *targets,
                       float *logprobs, dsarl_error *err)
{
    glm5_train **tr = NULL;
    DSARL_TRY(slot_of(m, slot, &tr, err));
    int32_t c = *tr ? (*tr)->p.fwd_chunk : 0;
    if (*tr && c >= m->stage.chunks)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: stage %d's slot %d ran the forward of all its %d model "
                          "chunks already", m->stage.rank, slot, m->stage.chunks);
    if (!glm5_chunk_is_first(m, c) && (!*tr || !(*tr)->p.input_ready))
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: stage %d's forward of slot %d (model chunk %d) has no input "
                          "(stage_transfer receives it first)", m->stage.rank, slot, c);
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
    if (!*tr || (*tr)->p.bwd_chunk < 0 || (*tr)->p.bwd_chunk >= (*tr)->p.fwd_chunk)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: stage %d's backward of slot %d has no forward pending",
                          m->stage.rank, slot);
    int rc = glm5_train_run_backward(m, *tr, dlogprobs, indexer_loss, err);
    // the first virtual stage ends the pass here; the others keep it until its gradient is sent
    if (rc || (glm5_stage_is_first(m) && (*tr)->p.bwd_chunk < 0))
        close_slot(tr);
    return rc;
}

// One transfer of a schedule step: a send (backward: of the input gradient, which releases the slot after its
// last chunk) or a receive; each for the slot pass's next (receives) or last (sends) model chunk.
static int transfer_one(dsarl_model *m, const dsarl_stage_transfer *t, bool send, bool forward, dsarl_error *err)
{
    int32_t slot = send ? (forward ? t->send_forward : t->send_backward)
                        : (forward ? t->recv_forward : t->recv_backward);
    if (slot < 0)
        return DSARL_OK;
    glm5_train **tr = NULL;
    DSARL_TRY(slot_of(m, slot, &tr, err));
    if (!send && forward) { // opens the slot (chunk 0), or the input of the pass's next chunk
        if ((!*tr && !t->recv_batch) || (*tr && ((*tr)->p.input_ready || (*tr)->p.fwd_chunk >= m->stage.chunks)))
            return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: receiving into pipeline slot %d needs a free slot and its "
                              "batch, or a pass with a model chunk left to run", slot);
        if (!*tr)
            DSARL_TRY(glm5_train_open(m, t->recv_batch, true, tr, err));
        glm5_scope(m, "pipeline");
        int rc = recv_input(&(*tr)->p, (*tr)->p.fwd_chunk, err);
        (*tr)->p.input_ready = rc == 0;
        return rc;
    }
    if (!*tr)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: pipeline slot %d has no pass to transfer", slot);
    glm5_pass *p = &(*tr)->p;
    glm5_scope(m, "pipeline");
    if (send && forward)
        return send_output(p, p->fwd_chunk - 1, p->out_topk, err);
    if (send) {
        int rc = send_grad(p, (*tr)->g.dx, err);
        if (rc || p->bwd_chunk < 0) // chunk 0's gradient: the pass is done
            close_slot(tr);
        return rc;
    }
    DSARL_TRY(glm5_train_grad_bufs(m, *tr, err));
    glm5_scope(m, "pipeline");
    DSARL_TRY(m->dev_ops->recv(m->dev, pp_group(m), (*tr)->g.dx, p->T_sp * m->cfg.hidden_size, m->storage,
                               next_rank(m), err));
    p->grad_ready = true;
    return DSARL_OK;
}

int glm5_stage_transfer(dsarl_model *m, const dsarl_stage_transfer *t, dsarl_error *err)
{
    if (!t || t->struct_size < sizeof *t)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: stage_transfer needs a dsarl_stage_transfer of ABI 1.4");
    if (m->stage.size <= 1)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: stage_transfer needs pipeline parallelism (pp is 1)");
    // one direction at a time (the activations forward, then the gradients back); in each the even stage of a
    // link sends first and the odd one receives first, so blocking sends and receives meet, also around the ring
    // of virtual stages whatever the stage count
    bool send_first = m->stage.rank % 2 == 0;
    for (int direction = 0; direction < 2; direction++) {
        bool forward = direction == 0;
        for (int round = 0; round < 2; round++)
            DSARL_TRY(transfer_one(m, t, (round == 0) == send_first, forward, err));
    }
    glm5_scope(m, NULL);
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
    int32_t k = 0, n = m->stage.chunks * m->stage.size; // the virtual stage holding the layer, on rank k % size
    while (k + 1 < n && m->stage.starts[k + 1] <= p->layer)
        k++;
    return k % m->stage.size;
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
