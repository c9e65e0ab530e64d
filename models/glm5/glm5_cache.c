/* glm5_cache.c: allocation of the generation KV caches, contiguous and paged (layouts in glm5_cache.h). */
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

// Allocates c's arrays for c->n_rows rows: planned on a counting arena, then exactly its high-water size once.
static int cache_allocate(dsarl_model_cache *c, dsarl_error *err)
{
    int32_t L = c->m->cfg.num_hidden_layers;
    c->kv = calloc((size_t)L, sizeof(void *));
    c->ik = calloc((size_t)L, sizeof(void *));
    if (!c->kv || !c->ik)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of host memory for a KV cache of %d layers", L);
    dsarl_arena plan;
    dsarl_arena_init(&plan, NULL, SIZE_MAX);
    DSARL_TRY(carve(c, &plan, err));
    c->bytes = dsarl_arena_high_water(&plan);
    DSARL_TRY(c->m->dev_ops->alloc(c->m->dev, c->bytes, &c->memory, err));
    dsarl_arena real;
    dsarl_arena_init(&real, c->memory, c->bytes);
    DSARL_TRY(carve(c, &real, err));
    return glm5_cache_reset(c, err);
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
    dsarl_model_cache *c = calloc(1, sizeof(*c));
    if (c)
        c->lengths = calloc((size_t)n_slots, sizeof(int32_t));
    if (!c || !c->lengths) {
        glm5_cache_free(c);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of host memory for a KV cache of %d slots", n_slots);
    }
    c->m = m, c->n_slots = n_slots, c->max_tokens = max_tokens;
    c->n_rows = (int64_t)n_slots * max_tokens;
    int rc = cache_allocate(c, err);
    if (rc) {
        glm5_cache_free(c);
        return rc;
    }
    *out = c;
    return DSARL_OK;
}

int64_t glm5_cache_token_bytes(const dsarl_model *m)
{
    const glm5_config *cfg = &m->cfg;
    int64_t per = 0;
    for (int32_t i = 0; i < cfg->num_hidden_layers; i++)
        if (glm5_stage_has_layer(m, i))
            per += (int64_t)(cfg->kv_lora_rank + cfg->qk_rope_head_dim + (m->layers[i].idx_wq_b ? cfg->index_head_dim
                                                                                               : 0)) *
                   (int64_t)m->elem;
    return per;
}

int glm5_paged_cache_create(dsarl_model *m, int32_t n_blocks, int32_t block_size, dsarl_model_cache **out,
                            dsarl_error *err)
{
    *out = NULL;
    if (n_blocks < 1 || block_size < 1)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: a paged KV cache needs n_blocks >= 1 and block_size >= 1, got "
                          "%d and %d", n_blocks, block_size);
    if ((int64_t)n_blocks * block_size > INT32_MAX) // rows are int32 in the gather and scatter maps
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: a paged KV cache of %d blocks x %d tokens has %lld rows, more "
                          "than the %d its int32 row maps address; lower the cache memory", n_blocks, block_size,
                          (long long)n_blocks * block_size, INT32_MAX);
    dsarl_model_cache *c = calloc(1, sizeof(*c));
    if (!c)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of host memory for a paged KV cache");
    c->m = m, c->n_blocks = n_blocks, c->block_size = block_size, c->max_tokens = block_size;
    c->n_rows = (int64_t)n_blocks * block_size;
    int rc = cache_allocate(c, err);
    if (rc) {
        glm5_cache_free(c);
        return rc;
    }
    *out = c;
    return DSARL_OK;
}

int glm5_cache_clear_block(dsarl_model_cache *c, int32_t b, dsarl_error *err)
{
    const dsarl_model *m = c->m;
    const glm5_config *cfg = &m->cfg;
    int64_t dqk = cfg->kv_lora_rank + cfg->qk_rope_head_dim, dI = cfg->index_head_dim, first = (int64_t)b * c->block_size;
    for (int32_t i = 0; i < cfg->num_hidden_layers; i++) {
        if (c->kv[i])
            DSARL_TRY(m->dev_ops->zero(m->dev, glm5_at(m, c->kv[i], first * dqk),
                                       (size_t)(c->block_size * dqk) * m->elem, err));
        if (c->ik[i])
            DSARL_TRY(m->dev_ops->zero(m->dev, glm5_at(m, c->ik[i], first * dI),
                                       (size_t)(c->block_size * dI) * m->elem, err));
    }
    return DSARL_OK;
}

int glm5_cache_copy_block(dsarl_model_cache *c, int32_t src, int32_t dst, int32_t rows, dsarl_error *err)
{
    if (!c || c->block_size < 1)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: cache_copy_block needs a paged cache");
    if (src < 0 || src >= c->n_blocks || dst < 0 || dst >= c->n_blocks || src == dst || rows < 0 ||
        rows > c->block_size)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: cache_copy_block(%d -> %d, %d rows) needs two distinct blocks in "
                          "[0, %d) and rows in [0, %d]", src, dst, rows, c->n_blocks, c->block_size);
    const dsarl_model *m = c->m;
    const glm5_config *cfg = &m->cfg;
    DSARL_TRY(glm5_cache_clear_block(c, dst, err));
    int64_t dqk = cfg->kv_lora_rank + cfg->qk_rope_head_dim, dI = cfg->index_head_dim, bs = c->block_size;
    for (int32_t i = 0; i < cfg->num_hidden_layers && rows > 0; i++) {
        if (c->kv[i])
            DSARL_TRY(m->dev_ops->copy(m->dev, glm5_at(m, c->kv[i], dst * bs * dqk), glm5_at(m, c->kv[i], src * bs * dqk),
                                       (size_t)(rows * dqk) * m->elem, DSARL_COPY_DEVICE_TO_DEVICE, err));
        if (c->ik[i])
            DSARL_TRY(m->dev_ops->copy(m->dev, glm5_at(m, c->ik[i], dst * bs * dI), glm5_at(m, c->ik[i], src * bs * dI),
                                       (size_t)(rows * dI) * m->elem, DSARL_COPY_DEVICE_TO_DEVICE, err));
    }
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
    if (c->lengths)
        memset(c->lengths, 0, (size_t)c->n_slots * sizeof(int32_t));
    return c->m->dev_ops->zero(c->m->dev, c->memory, c->bytes, err);
}

int32_t glm5_cache_length(const dsarl_model_cache *c, int32_t slot)
{
    return c && c->lengths && slot >= 0 && slot < c->n_slots ? c->lengths[slot] : 0;
}
