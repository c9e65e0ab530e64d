/* glm5_decode.c: cached inference. New tokens (whole prompts at prefill, one token per sequence at decode) run
 * through the same decoder layers as training (glm5_layer_forward); their keys are appended to the KV cache and
 * every query attends over its slot's cached range through the same DSA ops, so the logits equal a no-cache
 * forward of the whole sequence to float rounding. Only the last new token of each sequence reaches the LM head. */
#include <stdlib.h>
#include <string.h>
#include "glm5_pass.h"

// Checks the batch against the cache: distinct slots in range, room for the new tokens.
static int check_batch(const dsarl_model_cache *c, const dsarl_token_batch *b, const int32_t *slots,
                       dsarl_error *err)
{
    if (b->n_sequences < 1 || !b->cu_seqlens || !b->tokens || !slots || b->cu_seqlens[0] != 0 ||
        b->cu_seqlens[b->n_sequences] != b->n_tokens)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: forward_cached needs tokens, slots and cu_seqlens running from "
                          "0 to n_tokens (%lld) over at least one sequence", (long long)b->n_tokens);
    for (int32_t i = 0; i < b->n_sequences; i++) {
        int32_t s = slots[i], n = b->cu_seqlens[i + 1] - b->cu_seqlens[i];
        if (s < 0 || s >= c->n_slots)
            return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: forward_cached sequence %d names slot %d; valid slots are "
                              "[0, %d)", i, s, c->n_slots);
        if (n < 1)
            return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: forward_cached sequence %d has %d new tokens; it needs at "
                              "least 1", i, n);
        if ((int64_t)c->lengths[s] + n > c->max_tokens)
            return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: slot %d holds %d tokens and cannot take %d more; the cache "
                              "was sized for %d tokens per sequence", s, c->lengths[s], n, c->max_tokens);
        for (int32_t j = 0; j < i; j++)
            if (slots[j] == s)
                return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: forward_cached sequences %d and %d both name slot %d; "
                                  "each slot may appear once per call", j, i, s);
    }
    return DSARL_OK;
}

// Uploads ids, positions (after what each slot holds), key ranges into the cache, the rows the keys go to and each
// sequence's last new token: one host block in the layout of the device block p->tokens, one upload (each
// host-to-device copy waits for the device).
static int upload_cached_batch(glm5_pass *p, const dsarl_model_cache *c, const dsarl_token_batch *b,
                               const int32_t *slots, dsarl_error *err)
{
    dsarl_model *m = p->m;
    int64_t T = b->n_tokens, B = b->n_sequences;
    int32_t *host = malloc((size_t)(5 * T + B) * sizeof(int32_t));
    if (!host)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of host memory for %lld cached tokens", (long long)T);
    memcpy(host, b->tokens, (size_t)T * sizeof(int32_t));
    int32_t *pos = host + T, *ks = host + 2 * T, *ke = host + 3 * T, *rows = host + 4 * T, *last_rows = host + 5 * T;
    int32_t max_keys = 0;
    for (int32_t i = 0; i < b->n_sequences; i++) {
        // fits int32: glm5_cache_create refuses caches of more than INT32_MAX rows
        int32_t base = (int32_t)((int64_t)slots[i] * c->max_tokens), lo = b->cu_seqlens[i], hi = b->cu_seqlens[i + 1];
        for (int32_t t = lo; t < hi; t++) {
            pos[t] = c->lengths[slots[i]] + (t - lo);
            ks[t] = base, ke[t] = base + pos[t] + 1, rows[t] = base + pos[t];
        }
        max_keys = ke[hi - 1] - base > max_keys ? ke[hi - 1] - base : max_keys;
        last_rows[i] = hi - 1;
    }
    int rc = m->dev_ops->copy(m->dev, p->tokens, host, (size_t)(5 * T + B) * sizeof(int32_t),
                              DSARL_COPY_HOST_TO_DEVICE, err);
    p->batch = (dsarl_dsa_batch){.struct_size = sizeof(p->batch), .n_queries = T, .n_keys = c->n_rows,
                                 .key_start = p->key_start, .key_end = p->key_end, .max_keys_per_query = max_keys};
    // dense attention (DSA warm-up): as in training, a top-k as wide as the longest sequence selects every key
    if (m->dense_attention && max_keys > p->topk_width)
        p->topk_width = max_keys;
    if (rc == 0)
        rc = glm5_routing_prepare(p, b, ks, err);
    free(host);
    return rc;
}

// The paged form of upload_cached_batch: the rows new tokens go to come from the block tables, the key ranges
// index the gathered key array (sequence i at rows [first_i, first_i + context_i + new_i)), and key_rows maps
// every gathered key to its cache row. Blocks that a call starts (a token at a block's row 0) are cleared first.
static int upload_paged_batch(glm5_pass *p, const dsarl_model_cache *c, const dsarl_token_batch *b,
                              const dsarl_block_tables *bt, dsarl_error *err)
{
    dsarl_model *m = p->m;
    int64_t T = b->n_tokens, B = b->n_sequences, K = p->n_key_rows, bs = c->block_size;
    int32_t *host = malloc((size_t)(5 * T + B + K) * sizeof(int32_t));
    if (!host)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of host memory for %lld cached tokens", (long long)T);
    memcpy(host, b->tokens, (size_t)T * sizeof(int32_t));
    int32_t *pos = host + T, *ks = host + 2 * T, *ke = host + 3 * T, *rows = host + 4 * T, *last_rows = host + 5 * T;
    int32_t *key_rows = host + 5 * T + B, max_keys = 0, first = 0;
    int rc = DSARL_OK;
    for (int32_t i = 0; i < b->n_sequences; i++) {
        const int32_t *table = bt->tables + (int64_t)i * bt->blocks_per_sequence;
        int32_t lo = b->cu_seqlens[i], hi = b->cu_seqlens[i + 1], ctx = bt->context_lens[i], n = ctx + hi - lo;
        for (int32_t j = 0; j < n; j++) // fits int32: glm5_paged_cache_create refuses more rows
            key_rows[first + j] = (int32_t)(table[j / bs] * bs + j % bs);
        for (int32_t t = lo; t < hi; t++) {
            pos[t] = ctx + (t - lo);
            ks[t] = first, ke[t] = first + pos[t] + 1, rows[t] = key_rows[first + pos[t]];
            if (pos[t] % bs == 0 && rc == 0) // the sequence starts this block: its rows must be zero
                rc = glm5_cache_clear_block((dsarl_model_cache *)c, table[pos[t] / bs], err);
        }
        max_keys = n > max_keys ? n : max_keys;
        last_rows[i] = hi - 1;
        first += n;
    }
    if (rc == 0)
        rc = m->dev_ops->copy(m->dev, p->tokens, host, (size_t)(5 * T + B + K) * sizeof(int32_t),
                              DSARL_COPY_HOST_TO_DEVICE, err);
    p->batch = (dsarl_dsa_batch){.struct_size = sizeof(p->batch), .n_queries = T, .n_keys = K,
                                 .key_start = p->key_start, .key_end = p->key_end, .max_keys_per_query = max_keys};
    if (m->dense_attention && max_keys > p->topk_width)
        p->topk_width = max_keys;
    if (rc == 0)
        rc = glm5_routing_prepare(p, b, ks, err);
    free(host);
    return rc;
}

// The pass body once buffers exist: layers over the new tokens, then the head on each sequence's last token.
static int run_cached(glm5_pass *p, const dsarl_token_batch *b, const int32_t *slots,
                      const dsarl_block_tables *tables, float *logits, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t T = p->T, C = c->hidden_size, V = glm5_local_vocab(m), B = b->n_sequences;
    const int32_t *last_rows = p->cache_rows + T; // (B) device, uploaded with the batch
    DSARL_TRY(tables ? upload_paged_batch(p, p->cache, b, tables, err) : upload_cached_batch(p, p->cache, b, slots, err));
    if (m->shards.tp_size > 1)
        DSARL_TRY(glm5_upload_vocab_ids(p, b->tokens, err));
    // buffers sized now that the top-k width is known (dense attention widens it)
    if (!(p->acts = calloc(1, sizeof(glm5_layer_acts))))
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory for activations");
    p->n_acts = 1;
    DSARL_TRY(glm5_layer_acts_alloc(p, &p->acts[0], err));
    // this rank's model chunks in turn, each from the previous virtual stage's output (or the embedding)
    for (int32_t chunk = 0; chunk < m->stage.chunks; chunk++) {
        const int32_t *prev_topk = NULL;
        DSARL_TRY(glm5_stage_input(p, chunk, &prev_topk, err));
        for (int32_t i = glm5_chunk_first(&m->stage, chunk); i < glm5_chunk_end(&m->stage, chunk); i++) {
            DSARL_TRY(glm5_layer_forward(p, &p->acts[0], i, prev_topk, err));
            prev_topk = p->acts[0].topk; // indices into the cache: every layer's arrays share the row layout
        }
        if (!glm5_chunk_is_last(m, chunk))
            DSARL_TRY(glm5_stage_output(p, chunk, prev_topk, err));
    }
    DSARL_TRY(glm5_routing_share_stages(p, err)); // recorded routing: each stage's layers into every stage's rows
    if (!glm5_stage_is_last(m)) { // the last stage's logits come back to every stage
        glm5_scope(m, "pipeline");
        DSARL_TRY(glm5_stage_share_last(m, logits, B * m->cfg.vocab_size, err));
        return d->synchronize(m->dev, err);
    }
    // final norm and LM head on the last new token of each sequence only: (B, C) -> (B, V/tp), gathered to (B, V)
    glm5_scope(m, "lm_head");
    DSARL_TRY(d->gather_rows(m->dev, p->tmp, p->x, last_rows, B, C, err));
    DSARL_TRY(d->rmsnorm_forward(m->dev, p->h_final, p->rstd_final, p->tmp, m->final_norm, B, C,
                                 (float)c->rms_norm_eps, err));
    DSARL_TRY(d->gemm_f32out(m->dev, false, true, B, V, C, 1.0f, p->h_final, m->lm_head, 0.0f, p->logits, err));
    if (p->logits_device) // one vocabulary shard and one stage (glm5_forward_paged): they stay on the device
        DSARL_TRY(d->copy(m->dev, logits, p->logits, (size_t)(B * V) * sizeof(float), DSARL_COPY_DEVICE_TO_DEVICE,
                          err));
    else {
        DSARL_TRY(glm5_gather_vocab(m, logits, p->logits, B, err));
        DSARL_TRY(glm5_stage_share_last(m, logits, B * m->cfg.vocab_size, err));
    }
    return d->synchronize(m->dev, err);
}

/* An empty decode step under expert parallelism: this rank's sequences have all finished, its ep peers' have not;
 * every MoE layer's exchanges still need this rank (it owns experts their tokens pick), in layer order. */
static int serve_experts(dsarl_model *m, dsarl_error *err)
{
    glm5_pass p;
    memset(&p, 0, sizeof(p));
    p.m = m, p.T = 0, p.form = DSARL_DSA_FORM_ABSORBED;
    glm5_layer_acts a;
    memset(&a, 0, sizeof(a));
    int rc = DSARL_OK;
    glm5_scope(m, "moe");
    for (int32_t i = 0; rc == 0 && i < m->cfg.num_hidden_layers; i++) // this rank's layers, in order
        if (glm5_stage_has_layer(m, i) && m->cfg.mlp_sparse[i])
            rc = glm5_moe_serve(&p, &a, &m->layers[i], err);
    if (rc == 0)
        rc = m->dev_ops->synchronize(m->dev, err);
    glm5_pass_free(&p);
    glm5_scope(m, NULL);
    return rc;
}

// One cached pass over b: through slots of a contiguous cache, or through tables of a paged one.
static int forward_pass(dsarl_model *m, dsarl_model_cache *cache, const dsarl_token_batch *b, const int32_t *slots,
                        const dsarl_block_tables *tables, float *logits, bool logits_device, dsarl_error *err)
{
    const glm5_config *c = &m->cfg;
    int64_t T = b->n_tokens, C = c->hidden_size, V = glm5_local_vocab(m), B = b->n_sequences;
    glm5_pass p;
    memset(&p, 0, sizeof(p));
    glm5_scope(m, "setup"); // the batch's upload, buffers, head maps
    // tensor parallelism without sequence parallelism: every rank runs every row (a few tokens per step) for its
    // heads and vocabulary slice, the row-parallel sums all-reduced; the latent cache is whole on every rank
    p.m = m, p.T = p.T_real = T, p.T_sp = T, p.sp = false, p.cache = cache, p.topk_width = c->index_topk;
    p.form = DSARL_DSA_FORM_ABSORBED; // the cache holds latents, not per-head keys (and the batch no host segments)
    int64_t stage = glm5_local_heads(m) * T * glm5_head_stage(c); // head-major staging (glm5_heads.c)
    size_t e = m->elem, i4 = sizeof(int32_t);
    struct { void **ptr; size_t bytes; } plan[] = {
        {&p.x, T * C * e}, {&p.h_final, T * C * e}, {(void **)&p.rstd_final, T * sizeof(float)},
        {(void **)&p.logits, (glm5_stage_is_last(m) ? B * V : 0) * sizeof(float)}, {&p.head_in, stage * e}, {&p.head_out, stage * e},
        {&p.tmp, T * C * e}, {(void **)&p.tokens, (5 * T + B) * i4}};
    p.logits_device = logits_device;
    if (tables) { // paged: every sequence's context and new tokens gathered per layer
        for (int32_t i = 0; i < b->n_sequences; i++)
            p.n_key_rows += tables->context_lens[i] + b->cu_seqlens[i + 1] - b->cu_seqlens[i];
        plan[7].bytes = (5 * T + B + p.n_key_rows) * i4;
    }
    int rc = DSARL_OK;
    for (size_t i = 0; rc == 0 && i < sizeof plan / sizeof plan[0]; i++)
        rc = glm5_pass_alloc(&p, plan[i].bytes, plan[i].ptr, err);
    // ids, positions, key ranges, cache rows, last rows: one block, uploaded at once by upload_cached_batch
    if (rc == 0)
        p.positions = p.tokens + T, p.key_start = p.tokens + 2 * T, p.key_end = p.tokens + 3 * T,
        p.cache_rows = p.tokens + 4 * T;
    if (rc == 0 && tables) {
        p.key_rows = p.tokens + 5 * T + B;
        rc = glm5_pass_alloc(&p, (size_t)(p.n_key_rows * (c->kv_lora_rank + c->qk_rope_head_dim)) * e, &p.key_kv, err);
        if (rc == 0)
            rc = glm5_pass_alloc(&p, (size_t)(p.n_key_rows * c->index_head_dim) * e, &p.key_ik, err);
    }
    if (rc == 0) // the absorbed form's head-layout maps (kept by the model while the batch size stays)
        rc = glm5_head_maps_prepare(&p, err);
    if (rc == 0)
        rc = run_cached(&p, b, slots, tables, logits, err);
    glm5_pass_free(&p);
    glm5_scope(m, NULL);
    return rc;
}

int glm5_forward_cached(dsarl_model *m, dsarl_model_cache *cache, const dsarl_token_batch *b, const int32_t *slots,
                        float *logits, dsarl_error *err)
{
    if (!cache || cache->m != m)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: forward_cached needs a cache created by this model instance");
    if (cache->block_size > 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: forward_cached got a paged cache; call forward_paged with its "
                          "block tables");
    if (m->shards.ep_size > 1 && b && b->n_sequences == 0 && b->n_tokens == 0)
        return serve_experts(m, err);
    DSARL_TRY(check_batch(cache, b, slots, err));
    int rc = forward_pass(m, cache, b, slots, NULL, logits, false, err);
    if (rc == 0) // the slots now hold the new tokens (on failure their rows may be half-written: reset the cache)
        for (int32_t i = 0; i < b->n_sequences; i++)
            cache->lengths[slots[i]] += b->cu_seqlens[i + 1] - b->cu_seqlens[i];
    return rc;
}

// Checks a paged batch: a paged cache of this model, sequences of >= 1 new tokens, tables that map every row.
static int check_paged(const dsarl_model *m, const dsarl_model_cache *c, const dsarl_token_batch *b,
                       const dsarl_block_tables *bt, dsarl_error *err)
{
    if (!c || c->m != m || c->block_size < 1)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: forward_paged needs a paged cache created by this model "
                          "instance (paged_cache_create)");
    if (!b || b->n_sequences < 1 || !b->cu_seqlens || !b->tokens || b->cu_seqlens[0] != 0 ||
        b->cu_seqlens[b->n_sequences] != b->n_tokens)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: forward_paged needs tokens and cu_seqlens running from 0 to "
                          "n_tokens over at least one sequence");
    if (!bt || bt->struct_size < sizeof(*bt) || !bt->tables || !bt->context_lens || bt->blocks_per_sequence < 1)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: forward_paged needs block tables (tables, context_lens, "
                          "blocks_per_sequence >= 1)");
    int64_t keys = 0;
    for (int32_t i = 0; i < b->n_sequences; i++) {
        int32_t n = b->cu_seqlens[i + 1] - b->cu_seqlens[i], ctx = bt->context_lens[i];
        if (n < 1 || ctx < 0)
            return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: forward_paged sequence %d has %d new tokens after %d "
                              "cached ones; it needs >= 1 new and >= 0 cached", i, n, ctx);
        int64_t blocks = ((int64_t)ctx + n + c->block_size - 1) / c->block_size;
        if (blocks > bt->blocks_per_sequence)
            return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: forward_paged sequence %d reaches %lld blocks; its table "
                              "has %d", i, (long long)blocks, bt->blocks_per_sequence);
        for (int64_t j = 0; j < blocks; j++) {
            int32_t blk = bt->tables[(int64_t)i * bt->blocks_per_sequence + j];
            if (blk < 0 || blk >= c->n_blocks)
                return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: forward_paged sequence %d maps block %lld to %d; valid "
                                  "blocks are [0, %d)", i, (long long)j, blk, c->n_blocks);
        }
        keys += ctx + n;
    }
    if (keys > INT32_MAX)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: forward_paged gathers %lld keys, more than the %d its int32 "
                          "ranges address; take fewer sequences per call", (long long)keys, INT32_MAX);
    return DSARL_OK;
}

int glm5_forward_paged(dsarl_model *m, dsarl_model_cache *cache, const dsarl_token_batch *b,
                       const dsarl_block_tables *tables, float *logits, dsarl_error *err)
{
    if (m->shards.ep_size > 1 && b && b->n_sequences == 0 && b->n_tokens == 0)
        return serve_experts(m, err);
    DSARL_TRY(check_paged(m, cache, b, tables, err));
    // one vocabulary shard on the only stage: the head's logits are already where the caller wants them
    if (m->shards.tp_size == 1 && m->stage.size <= 1)
        return forward_pass(m, cache, b, NULL, tables, logits, true, err);
    size_t bytes = (size_t)b->n_sequences * (size_t)m->cfg.vocab_size * sizeof(float);
    float *host = malloc(bytes);
    if (!host)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of host memory for %d rows of logits", b->n_sequences);
    int rc = forward_pass(m, cache, b, NULL, tables, host, false, err);
    if (rc == 0)
        rc = m->dev_ops->copy(m->dev, logits, host, bytes, DSARL_COPY_HOST_TO_DEVICE, err);
    free(host);
    return rc;
}
