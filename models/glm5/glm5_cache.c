/* glm5_cache.c: allocation of the generation KV cache (layout in glm5_cache.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "dsarl/arena.h"
#include "glm5_model.h"
#include "glm5_cache.h"

// Carves every layer's arrays from arena (a planning arena when its base is NULL).
static int carve(dsarl_model_cache *c, dsarl_arena *arena, dsarl_error *err)
{
    const dsarl_model *m = c->m;
    const glm5_config *cfg = &m->cfg;
    size_t kv_bytes = (size_t)c->n_rows * (size_t)(cfg->kv_lora_rank + cfg->qk_rope_head_dim) * m->elem;
    size_t ik_bytes = (size_t)c->n_rows * (size_t)cfg->index_head_dim * m->elem;
    for (int32_t i = 0; i < cfg->num_hidden_layers; i++) {
        c->kv[i] = c->ik[i] = NULL;
        if (!glm5_stage_has_layer(m, i)) // another pipeline stage's layer keeps its own cache
            continue;
        DSARL_TRY(dsarl_arena_alloc(arena, kv_bytes, 0, &c->kv[i], err));
        if (m->layers[i].idx_wq_b) // full indexer layer: its keys are needed by later decode steps
            DSARL_TRY(dsarl_arena_alloc(arena, ik_bytes, 0, &c->ik[i], err));
    }
    return DSARL_OK;
}

int glm5_cache_create(dsarl_model *m, int32_t n_slots, int32_t max_tokens, dsarl_model_cache **out,
                      dsarl_error *err)
{
    *out = NULL;
    if (n_slots < 1 || max_tokens < 1)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: a KV cache needs n_slots >= 1 and max_tokens >= 1, got %d "
                          "and %d", n_slots, max_tokens);
    // a slot's rows start at slot * max_tokens, and the decode's key ranges (key_start/key_end, glm5_decode.c) are
    // int32 rows of the whole cache: past INT32_MAX rows they would wrap
    if ((int64_t)n_slots * max_tokens > INT32_MAX)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: a KV cache of %d slots x %d tokens has %lld rows, more than "
                          "the %d its int32 key ranges address; generate fewer sequences at once", n_slots, max_tokens,
                          (long long)n_slots * max_tokens, INT32_MAX);
    int32_t L = m->cfg.num_hidden_layers;
    dsarl_model_cache *c = calloc(1, sizeof(*c));
    if (c) {
        c->kv = calloc((size_t)L, sizeof(void *));
        c->ik = calloc((size_t)L, sizeof(void *));
        c->lengths = calloc((size_t)n_slots, sizeof(int32_t));
    }
    if (!c || !c->kv || !c->ik || !c->lengths) {
        glm5_cache_free(c);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of host memory for a KV cache of %d slots", n_slots);
    }
    c->m = m, c->n_slots = n_slots, c->max_tokens = max_tokens;
    c->n_rows = (int64_t)n_slots * max_tokens;
    // plan the layout on a counting arena, then allocate exactly its high-water size once
    dsarl_arena plan;
    dsarl_arena_init(&plan, NULL, SIZE_MAX);
    int rc = carve(c, &plan, err);
    c->bytes = dsarl_arena_high_water(&plan);
    if (rc == 0)
        rc = m->dev_ops->alloc(m->dev, c->bytes, &c->memory, err);
    if (rc == 0) {
        dsarl_arena real;
        dsarl_arena_init(&real, c->memory, c->bytes);
        rc = carve(c, &real, err);
    }
    if (rc == 0)
        rc = glm5_cache_reset(c, err);
    if (rc) {
        glm5_cache_free(c);
        return rc;
    }
    *out = c;
    return DSARL_OK;
}

void glm5_cache_free(dsarl_model_cache *c)
{
    if (!c)
        return;
    if (c->memory)
        c->m->dev_ops->free(c->m->dev, c->memory);
    free(c->kv), free(c->ik), free(c->lengths);
    free(c);
}

int glm5_cache_reset(dsarl_model_cache *c, dsarl_error *err)
{
    // rows must be zero before their one write (the forward adds the new keys into them)
    memset(c->lengths, 0, (size_t)c->n_slots * sizeof(int32_t));
    return c->m->dev_ops->zero(c->m->dev, c->memory, c->bytes, err);
}

int32_t glm5_cache_length(const dsarl_model_cache *c, int32_t slot)
{
    return c && slot >= 0 && slot < c->n_slots ? c->lengths[slot] : 0;
}
