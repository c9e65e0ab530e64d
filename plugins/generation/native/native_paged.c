/* native_paged.c: continuous batching over the model's paged KV cache (ABI 1.5 forward_paged).
 *
 * The cache is one arena of fixed-size blocks; each sequence owns a block table. Every step is ONE forward call
 * of at most max_batched_tokens tokens: first the running sequences in admission order (one decode token each, or
 * the next chunk of a prompt still prefilling), then waiting sequences admitted in index order while the budget,
 * max_num_seqs and free blocks allow, so chunked prefill runs mixed with decode. A sequence retires at a stop token,
 * EOS, a stop string or max_new_tokens, and its blocks free up for the next admission. When a running sequence
 * needs a block and none is free, the latest admitted sequence is preempted (vLLM's recompute policy): its blocks
 * are released and it waits again; readmitted, it prefills its prompt and the tokens it had drawn, then goes on
 * drawing from the same Philox streams (sequence, step), so its completion is the one it would have had.
 *
 * Prompts that are equal (GRPO's G generations of one prompt) form a group when admitted: the first is prefilled,
 * the others wait, then map the same prompt blocks (reference counts) and draw their first token from its logits,
 * so a group costs one prefill. The first token written into a shared block copies it first (copy-on-write). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dsarl/log.h"
#include "native_internal.h"

enum { SEQ_WAITING = 0, SEQ_RUNNING = 1, SEQ_PENDING = 2, SEQ_DONE = 3 }; // PENDING: waits for its leader's prefill

typedef struct seq {
    int32_t state;
    int32_t prompt_len;
    int32_t n_cached; // tokens whose keys are in the cache
    int32_t n_blocks; // entries of table mapped
    int32_t leader;   // PENDING: the sequence whose prompt prefill it shares
    int32_t *table;   // (max_blocks) block ids
} seq;

// Free blocks (a stack, so block 0 is handed out first) and each block's reference count.
typedef struct block_pool {
    int32_t n, n_free, used, peak;
    int32_t *free_ids, *refs;
} block_pool;

typedef struct sched {
    dsarl_generator *g;
    run *r;
    const dsarl_token_batch *prompts;
    const dsarl_sampling_params *p;
    int32_t B, bs, max_blocks, budget, eos;
    seq *s;
    block_pool pool;
    int32_t *same_next;        // (B) the next sequence with an equal prompt, or -1
    int32_t *active, n_active; // running and pending sequences, in admission order
    // one step's batch
    int32_t *ids, *take, *cu, *tokens, *tables, *ctx, n;
    int32_t *sample_ids, *sample_rows; // sequences drawing this step and the batch row of their logits
    float *step_logits;                // device (B, V)
    int32_t *step_experts, *step_indices; // host (budget, width): the routing one step records, or NULL
} sched;

static int32_t pool_take(block_pool *pl)
{
    if (pl->n_free == 0)
        return -1;
    int32_t b = pl->free_ids[--pl->n_free];
    pl->refs[b] = 1;
    pl->used++;
    pl->peak = pl->used > pl->peak ? pl->used : pl->peak;
    return b;
}

static void pool_release(block_pool *pl, int32_t b)
{
    if (--pl->refs[b] == 0) {
        pl->free_ids[pl->n_free++] = b;
        pl->used--;
    }
}

static int32_t token_at(const sched *k, int32_t id, int32_t j)
{
    const seq *q = &k->s[id];
    if (j < q->prompt_len)
        return k->prompts->tokens[k->prompts->cu_seqlens[id] + j];
    return k->g->tokens[(int64_t)id * k->r->max_new + (j - q->prompt_len)];
}

static int append_id(int32_t **list, int32_t *n, int32_t *cap, int32_t id, dsarl_error *err)
{
    if (*n == *cap) {
        int32_t grown = *cap ? 2 * *cap : 64;
        int32_t *more = realloc(*list, (size_t)grown * sizeof(int32_t));
        if (!more)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "generation native: out of memory for scheduling statistics");
        *list = more, *cap = grown;
    }
    (*list)[(*n)++] = id;
    return DSARL_OK;
}

static void drop_active(sched *k, int32_t id)
{
    for (int32_t i = 0; i < k->n_active; i++)
        if (k->active[i] == id) {
            memmove(k->active + i, k->active + i + 1, (size_t)(k->n_active - i - 1) * sizeof(int32_t));
            k->n_active--;
            return;
        }
}

static void release_blocks(sched *k, seq *q)
{
    for (int32_t j = 0; j < q->n_blocks; j++)
        pool_release(&k->pool, q->table[j]);
    q->n_blocks = 0, q->n_cached = 0;
}

// Sends sequence id back to the waiting queue (its blocks freed); pending members of its group go with it.
static void preempt(sched *k, int32_t id)
{
    seq *q = &k->s[id];
    release_blocks(k, q);
    q->state = SEQ_WAITING, q->leader = -1;
    drop_active(k, id);
    k->g->stats.preemptions++;
    for (int32_t i = 0; i < k->n_active;) {
        int32_t m = k->active[i];
        if (k->s[m].state == SEQ_PENDING && k->s[m].leader == id) {
            k->s[m].state = SEQ_WAITING, k->s[m].leader = -1;
            drop_active(k, m);
        } else
            i++;
    }
}

/* Maps the blocks for tokens [from, from + n) of q: a copy of a shared block written first (copy-on-write),
 * fresh blocks past the mapped ones. 0 (and nothing changed) when the pool has too few free blocks. */
static int map_blocks(sched *k, seq *q, int32_t from, int32_t n, int *ok, dsarl_error *err)
{
    int32_t first = from / k->bs, last = (from + n - 1) / k->bs;
    bool cow = first < q->n_blocks && k->pool.refs[q->table[first]] > 1;
    int32_t need = (cow ? 1 : 0) + (last + 1 > q->n_blocks ? last + 1 - q->n_blocks : 0);
    *ok = need <= k->pool.n_free;
    if (!*ok)
        return DSARL_OK;
    if (cow) { // rows [0, from % bs) are the shared prompt's; the rest become this sequence's
        int32_t mine = pool_take(&k->pool), shared = q->table[first];
        DSARL_TRY(k->g->mo->cache_copy_block(k->g->paged_cache, shared, mine, from % k->bs, err));
        pool_release(&k->pool, shared);
        q->table[first] = mine;
    }
    while (q->n_blocks <= last)
        q->table[q->n_blocks++] = pool_take(&k->pool);
    return DSARL_OK;
}

static void add_to_batch(sched *k, int32_t id, int32_t n)
{
    seq *q = &k->s[id];
    int32_t at = k->cu[k->n];
    for (int32_t j = 0; j < n; j++)
        k->tokens[at + j] = token_at(k, id, q->n_cached + j);
    memcpy(k->tables + (int64_t)k->n * k->max_blocks, q->table, (size_t)q->n_blocks * sizeof(int32_t));
    k->ids[k->n] = id, k->take[k->n] = n, k->ctx[k->n] = q->n_cached;
    k->cu[k->n + 1] = at + n;
    k->n++;
}

// The running sequences' tokens of this step, in admission order; blocks found by preempting the latest.
static int schedule_running(sched *k, int32_t *used, dsarl_error *err)
{
    int32_t *order = k->sample_ids; // scratch: the active list changes as sequences are preempted
    int32_t n = k->n_active;
    memcpy(order, k->active, (size_t)n * sizeof(int32_t));
    for (int32_t i = 0; i < n; i++) {
        int32_t id = order[i];
        seq *q = &k->s[id];
        if (q->state != SEQ_RUNNING)
            continue; // pending behind its leader, or preempted earlier in this loop
        int32_t need = q->prompt_len + k->r->len[id] - q->n_cached, take = need < k->budget - *used ? need
                                                                                                    : k->budget - *used;
        if (take <= 0)
            continue;
        int ok = 0;
        for (;;) {
            DSARL_TRY(map_blocks(k, q, q->n_cached, take, &ok, err));
            if (ok)
                break;
            int32_t victim = k->active[k->n_active - 1];
            if (victim == id && k->n_active == 1)
                return DSARL_FAIL(err, DSARL_E_INVALID, "generation native: the paged KV cache has %d blocks of %d "
                                  "tokens, too few for sequence %d alone (%d prompt + %d new tokens); raise "
                                  "policy.generation.kv_cache_memory_bytes", k->pool.n, k->bs, id, q->prompt_len,
                                  k->r->max_new);
            preempt(k, victim);
            if (victim == id)
                break;
        }
        if (!ok)
            continue;
        add_to_batch(k, id, take);
        *used += take;
    }
    return DSARL_OK;
}

// Admits waiting sequences in index order (an equal-prompt group as one unit) while budget and blocks allow.
static int schedule_waiting(sched *k, int32_t *used, dsarl_error *err)
{
    const native_paged_config *c = &k->g->paged;
    native_paged_stats *st = &k->g->stats;
    static const int32_t none = -1;
    for (int32_t id = 0; id < k->B && *used < k->budget; id++) {
        seq *q = &k->s[id];
        if (q->state != SEQ_WAITING)
            continue;
        if (c->max_num_seqs > 0 && k->n_active >= c->max_num_seqs)
            break;
        int32_t need = q->prompt_len + k->r->len[id], take = need < k->budget - *used ? need : k->budget - *used;
        int ok = 0;
        DSARL_TRY(map_blocks(k, q, 0, take, &ok, err));
        if (!ok)
            break; // no preemption for admissions: running sequences keep their blocks
        q->state = SEQ_RUNNING;
        k->active[k->n_active++] = id;
        DSARL_TRY(append_id(&st->admitted, &st->n_admitted, &k->g->admitted_cap, id, err));
        add_to_batch(k, id, take);
        *used += take;
        // fresh sequences with the same prompt join as pending members: they share this prefill
        for (int32_t m = c->prefix_sharing && k->r->len[id] == 0 ? k->same_next[id] : none; m >= 0;
             m = k->same_next[m]) {
            if (k->s[m].state != SEQ_WAITING || k->r->len[m] != 0)
                continue;
            if (c->max_num_seqs > 0 && k->n_active >= c->max_num_seqs)
                break;
            k->s[m].state = SEQ_PENDING, k->s[m].leader = id;
            k->active[k->n_active++] = m;
            DSARL_TRY(append_id(&st->admitted, &st->n_admitted, &k->g->admitted_cap, m, err));
        }
    }
    return DSARL_OK;
}

// Pending members of leader's group take its prompt blocks (one more reference each) and its cached length.
static void share_prompt(sched *k, int32_t leader, int32_t m)
{
    seq *l = &k->s[leader], *q = &k->s[m];
    int32_t blocks = (l->prompt_len + k->bs - 1) / k->bs;
    for (int32_t j = 0; j < blocks; j++) {
        q->table[j] = l->table[j];
        k->pool.refs[l->table[j]]++;
    }
    q->n_blocks = blocks, q->n_cached = l->prompt_len, q->state = SEQ_RUNNING, q->leader = -1;
    native_copy_routing(k->g, leader, m, l->prompt_len); // the prefill it shares recorded the leader's rows
}

static void retire(sched *k, int32_t id)
{
    seq *q = &k->s[id];
    release_blocks(k, q);
    q->state = SEQ_DONE;
    drop_active(k, id);
}

// Draws for every sequence whose cache caught up with its tokens this step, then applies the stop rules.
static int sample_and_advance(sched *k, dsarl_error *err)
{
    dsarl_generator *g = k->g;
    run *r = k->r;
    const dsarl_sampling_params *p = k->p;
    native_paged_stats *st = &g->stats;
    int32_t n = 0;
    for (int32_t i = 0; i < k->n; i++) {
        int32_t id = k->ids[i];
        seq *q = &k->s[id];
        q->n_cached += k->take[i];
        if (q->n_cached < q->prompt_len + r->len[id])
            continue; // a prompt chunk: its logits are not the next token's
        k->sample_ids[n] = id, k->sample_rows[n++] = i;
        if (r->len[id] != 0)
            continue;
        for (int32_t a = 0; a < k->n_active; a++) { // the group's members draw their first token from these logits
            int32_t m = k->active[a];
            if (k->s[m].state == SEQ_PENDING && k->s[m].leader == id) {
                share_prompt(k, id, m);
                k->sample_ids[n] = m, k->sample_rows[n++] = i;
            }
        }
    }
    if (n == 0)
        return DSARL_OK;
    int64_t V = r->V;
    for (int32_t i = 0, run_len; i < n; i += run_len) { // one copy per run of consecutive batch rows
        for (run_len = 1; i + run_len < n && k->sample_rows[i + run_len] == k->sample_rows[i] + run_len; run_len++)
            ;
        DSARL_TRY(g->dev_ops->copy(g->dev, r->dev_logits + i * V, k->step_logits + (int64_t)k->sample_rows[i] * V,
                                   (size_t)(run_len * V) * sizeof(float), DSARL_COPY_DEVICE_TO_DEVICE, err));
    }
    for (int32_t i = 0; i < n; i++)
        r->streams[i] = native_sample_stream(dsarl_sampling_sequence_offset(p) + k->sample_ids[i],
                                             r->len[k->sample_ids[i]]);
    DSARL_TRY(native_sample_rows(g, r, p, n, r->streams, err));
    for (int32_t i = 0; i < n; i++) {
        int32_t id = k->sample_ids[i], t = r->step_tokens[i];
        g->tokens[(int64_t)id * r->max_new + r->len[id]] = t;
        g->logprobs[(int64_t)id * r->max_new + r->len[id]] = r->step_lp[i];
        r->len[id]++;
        int stop = native_is_stop_token(p, k->eos, t), hit = 0;
        if (!stop && p->n_stop_strings > 0)
            DSARL_TRY(native_hits_stop_string(g, r, p, id, &hit, err));
        if (!stop && !hit && r->len[id] == r->max_new)
            g->truncated[id] = 1;
        if (stop || hit || r->len[id] == r->max_new) {
            retire(k, id);
            DSARL_TRY(append_id(&st->retired, &st->n_retired, &g->retired_cap, id, err));
        }
    }
    return DSARL_OK;
}

// One forward call over the step's batch (an empty one: a lockstep rank serving its experts).
static int forward_step(sched *k, dsarl_error *err)
{
    dsarl_generator *g = k->g;
    dsarl_token_batch batch = {.struct_size = sizeof(batch), .n_tokens = k->cu[k->n], .n_sequences = k->n,
                               .tokens = k->tokens, .cu_seqlens = k->cu, .record_experts = k->step_experts,
                               .record_indices = k->step_indices};
    dsarl_block_tables bt = {.struct_size = sizeof(bt), .blocks_per_sequence = k->max_blocks, .tables = k->tables,
                             .context_lens = k->ctx};
    DSARL_TRY(g->mo->forward_paged(g->model, g->paged_cache, &batch, &bt, k->step_logits, err));
    if (k->step_experts || k->step_indices)
        native_store_routing(g, k->step_experts, k->step_indices, k->n, k->ids, k->ctx, k->cu);
    native_paged_stats *st = &g->stats;
    st->forward_calls++;
    st->tokens_computed += k->cu[k->n];
    bool decode = false, prefill = false;
    for (int32_t i = 0; i < k->n; i++) {
        int32_t prompt_left = k->s[k->ids[i]].prompt_len - k->ctx[i];
        st->prompt_tokens_computed += prompt_left <= 0 ? 0 : prompt_left < k->take[i] ? prompt_left : k->take[i];
        decode |= prompt_left <= 0, prefill |= prompt_left > 0;
    }
    st->mixed_steps += decode && prefill;
    return DSARL_OK;
}

int native_arena_blocks_for_utilization(double u, size_t free_bytes, size_t total_bytes, int64_t block_bytes,
                                        int32_t block_size, int64_t need_blocks, int64_t *blocks, dsarl_error *err)
{
    *blocks = 0;
    if (!(u > 0.0 && u <= 1.0))
        return DSARL_FAIL(err, DSARL_E_INVALID, "generation native: policy.generation.gpu_memory_utilization must be "
                          "in (0, 1], got %g", u);
    if (block_bytes < 1)
        return DSARL_FAIL(err, DSARL_E_INVALID, "generation native: a paged KV cache block of %lld bytes cannot be "
                          "sized from policy.generation.gpu_memory_utilization", (long long)block_bytes);
    size_t used = total_bytes > free_bytes ? total_bytes - free_bytes : 0;
    // u * total is exact in a double up to 2^53 bytes; the floor comes before the integer subtraction
    double budget = floor(u * (double)total_bytes) - (double)used;
    int64_t bytes = budget > 0.0 ? (int64_t)budget : 0;
    *blocks = bytes / block_bytes;
    if (*blocks >= need_blocks && *blocks >= 1)
        return DSARL_OK;
    const double gib = (double)((size_t)1 << 30);
    return DSARL_FAIL(err, DSARL_E_INVALID, "generation native: policy.generation.gpu_memory_utilization %g leaves "
                      "%lld bytes for the paged KV cache (%g x %.2f GiB of device memory, %.2f GiB in use already), "
                      "%lld blocks of %d tokens, fewer than the %lld blocks one sequence of this batch needs at full "
                      "length; raise it, or set policy.generation.kv_cache_memory_bytes", u, (long long)bytes, u,
                      (double)total_bytes / gib, (double)used / gib, (long long)*blocks, block_size,
                      (long long)(need_blocks > 1 ? need_blocks : 1));
}

// The blocks gpu_memory_utilization gives, from the device memory read when the engine made its first arena.
static int utilization_blocks(sched *k, int64_t block_bytes, int64_t *blocks, dsarl_error *err)
{
    dsarl_generator *g = k->g;
    if (g->util_total == 0) {
        int (*info)(dsarl_device *, size_t *, size_t *, dsarl_error *) = DSARL_DEVICE_SLOT(g->dev_ops, memory_info);
        if (!info)
            return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "generation native: policy.generation.gpu_memory_utilization "
                              "needs the device's memory_info (plugin ABI 1.7), which device \"%s\" does not have; "
                              "set policy.generation.kv_cache_memory_bytes instead",
                              g->dev_ops->common.name ? g->dev_ops->common.name : "?");
        if (g->paged_cache) { // an arena of earlier settings is not memory the new one must leave alone
            g->mo->cache_free(g->paged_cache);
            g->paged_cache = NULL, g->paged_blocks = 0;
        }
        size_t free_bytes = 0, total_bytes = 0;
        DSARL_TRY(info(g->dev, &free_bytes, &total_bytes, err));
        if (total_bytes == 0)
            return DSARL_FAIL(err, DSARL_E_DEVICE, "generation native: device \"%s\" reports 0 bytes of memory in "
                              "all; policy.generation.gpu_memory_utilization cannot size the paged KV cache from that",
                              g->dev_ops->common.name ? g->dev_ops->common.name : "?");
        g->util_free = free_bytes, g->util_total = total_bytes;
    }
    g->stats.memory_free = g->util_free, g->stats.memory_total = g->util_total;
    return native_arena_blocks_for_utilization(g->paged.memory_utilization, g->util_free, g->util_total, block_bytes,
                                               g->paged.block_size, k->max_blocks, blocks, err);
}

/* The arena: kv_cache_memory_bytes worth of blocks, else gpu_memory_utilization's share of the device, else enough
 * for every sequence at full length (no preemption). */
static int ensure_arena(sched *k, int64_t blocks_for_batch, dsarl_error *err)
{
    dsarl_generator *g = k->g;
    const native_paged_config *c = &g->paged;
    int64_t blocks = blocks_for_batch;
    int64_t per_block = (int64_t)c->block_size * g->mo->cache_token_bytes(g->model);
    bool by_bytes = c->memory_bytes > 0, by_share = !by_bytes && c->memory_utilization > 0.0;
    if (by_bytes) {
        blocks = per_block > 0 ? c->memory_bytes / per_block : 0;
        if (blocks < 1)
            return DSARL_FAIL(err, DSARL_E_INVALID, "generation native: policy.generation.kv_cache_memory_bytes %lld "
                              "is less than one block (%d tokens x %lld bytes); raise it", (long long)c->memory_bytes,
                              c->block_size, (long long)(per_block / c->block_size));
    } else if (by_share)
        DSARL_TRY(utilization_blocks(k, per_block, &blocks, err));
    if (blocks > INT32_MAX / c->block_size)
        blocks = INT32_MAX / c->block_size;
    if (g->paged_cache && g->paged_blocks == blocks && g->paged_block_size == c->block_size)
        return DSARL_OK;
    if (g->paged_cache && !by_bytes && !by_share && g->paged_blocks >= blocks && g->paged_block_size == c->block_size)
        return DSARL_OK;
    if (g->paged_cache)
        g->mo->cache_free(g->paged_cache);
    g->paged_cache = NULL;
    DSARL_TRY(g->mo->paged_cache_create(g->model, (int32_t)blocks, c->block_size, &g->paged_cache, err));
    g->paged_blocks = (int32_t)blocks, g->paged_block_size = c->block_size;
    if (by_share) {
        const double gib = (double)((size_t)1 << 30);
        dsarl_log(DSARL_LOG_INFO, "generation native: paged KV cache of %lld blocks x %d tokens = %lld tokens, "
                  "%.3f GiB (policy.generation.gpu_memory_utilization %g of %.2f GiB, %.2f GiB in use before it)",
                  (long long)blocks, c->block_size, (long long)blocks * c->block_size,
                  (double)(blocks * per_block) / gib, c->memory_utilization, (double)g->util_total / gib,
                  (double)(g->util_total - (g->util_free < g->util_total ? g->util_free : g->util_total)) / gib);
    }
    return DSARL_OK;
}

static void sched_free(sched *k)
{
    if (k->s)
        for (int32_t b = 0; b < k->B; b++)
            free(k->s[b].table);
    free(k->s), free(k->pool.free_ids), free(k->pool.refs), free(k->same_next), free(k->active);
    free(k->ids), free(k->take), free(k->cu), free(k->tokens), free(k->tables), free(k->ctx);
    free(k->sample_ids), free(k->sample_rows), free(k->step_experts), free(k->step_indices);
    if (k->step_logits)
        k->g->dev_ops->free(k->g->dev, k->step_logits);
}

// Links each sequence to the next one with an equal prompt (equal length and tokens).
static void link_equal_prompts(sched *k)
{
    const dsarl_token_batch *pr = k->prompts;
    for (int32_t b = 0; b < k->B; b++)
        k->same_next[b] = -1;
    for (int32_t b = 0; b < k->B; b++) {
        for (int32_t a = b - 1; a >= 0; a--) {
            if (k->s[a].prompt_len != k->s[b].prompt_len ||
                memcmp(pr->tokens + pr->cu_seqlens[a], pr->tokens + pr->cu_seqlens[b],
                       (size_t)k->s[b].prompt_len * sizeof(int32_t)) != 0)
                continue;
            k->same_next[a] = b; // a is the latest equal one before b: b follows it in the chain
            break;
        }
    }
}

static int sched_init(sched *k, dsarl_error *err)
{
    dsarl_generator *g = k->g;
    int32_t B = k->B, Bn = B > 0 ? B : 1, longest = 0;
    int64_t blocks_for_batch = 0, prompt_tokens = 0;
    k->bs = g->paged.block_size;
    k->s = calloc((size_t)Bn, sizeof(seq));
    if (!k->s)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "generation native: out of memory for %d sequences", B);
    for (int32_t b = 0; b < B; b++) {
        int32_t P = k->prompts->cu_seqlens[b + 1] - k->prompts->cu_seqlens[b];
        k->s[b] = (seq){.state = SEQ_WAITING, .prompt_len = P, .leader = -1};
        longest = P > longest ? P : longest;
        blocks_for_batch += (P + k->r->max_new + k->bs - 1) / k->bs;
        prompt_tokens += P;
    }
    k->max_blocks = (longest + k->r->max_new + k->bs - 1) / k->bs;
    int64_t budget_cap = prompt_tokens + (int64_t)Bn * k->r->max_new;
    k->budget = g->paged.max_batched_tokens < budget_cap ? g->paged.max_batched_tokens : (int32_t)budget_cap;
    DSARL_TRY(ensure_arena(k, blocks_for_batch > 0 ? blocks_for_batch : 1, err));
    int32_t nb = g->paged_blocks;
    k->pool = (block_pool){.n = nb, .n_free = nb};
    k->pool.free_ids = malloc((size_t)nb * sizeof(int32_t));
    k->pool.refs = calloc((size_t)nb, sizeof(int32_t));
    k->same_next = malloc((size_t)Bn * sizeof(int32_t));
    k->active = malloc((size_t)Bn * sizeof(int32_t));
    k->ids = malloc((size_t)Bn * sizeof(int32_t));
    k->take = malloc((size_t)Bn * sizeof(int32_t));
    k->ctx = malloc((size_t)Bn * sizeof(int32_t));
    k->cu = calloc((size_t)Bn + 1, sizeof(int32_t));
    k->tokens = malloc((size_t)(k->budget > 0 ? k->budget : 1) * sizeof(int32_t));
    k->tables = calloc((size_t)Bn * (size_t)(k->max_blocks > 0 ? k->max_blocks : 1), sizeof(int32_t));
    k->sample_ids = malloc((size_t)Bn * sizeof(int32_t));
    k->sample_rows = malloc((size_t)Bn * sizeof(int32_t));
    bool ok = k->pool.free_ids && k->pool.refs && k->same_next && k->active && k->ids && k->take && k->ctx && k->cu &&
              k->tokens && k->tables && k->sample_ids && k->sample_rows;
    for (int32_t b = 0; ok && b < B; b++)
        ok = (k->s[b].table = malloc((size_t)k->max_blocks * sizeof(int32_t))) != NULL;
    size_t budget = (size_t)(k->budget > 0 ? k->budget : 1);
    if (ok && g->rec_w_experts)
        ok = (k->step_experts = malloc(budget * (size_t)g->rec_w_experts * sizeof(int32_t))) != NULL;
    if (ok && g->rec_w_indices)
        ok = (k->step_indices = malloc(budget * (size_t)g->rec_w_indices * sizeof(int32_t))) != NULL;
    if (!ok)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "generation native: out of memory for scheduling %d sequences", B);
    for (int32_t i = 0; i < nb; i++) // a stack: block 0 on top
        k->pool.free_ids[i] = nb - 1 - i;
    link_equal_prompts(k);
    g->stats.blocks = nb;
    return g->dev_ops->alloc(g->dev, (size_t)Bn * (size_t)k->r->V * sizeof(float), (void **)&k->step_logits, err);
}

int native_generate_paged(dsarl_generator *g, run *r, const dsarl_token_batch *prompts, const dsarl_sampling_params *p,
                          dsarl_error *err)
{
    const dsarl_tokenizer *tok = p->struct_size >= offsetof(dsarl_sampling_params, tokenizer) +
                                 sizeof(p->tokenizer) ? p->tokenizer : NULL;
    free(g->stats.admitted), free(g->stats.retired);
    memset(&g->stats, 0, sizeof(g->stats));
    g->admitted_cap = g->retired_cap = 0;
    sched k = {.g = g, .r = r, .prompts = prompts, .p = p, .B = r->B, .eos = tok ? dsarl_tokenizer_eos_id(tok) : -1};
    const dsarl_group *lock = dsarl_sampling_lockstep(p);
    int rc = sched_init(&k, err);
    for (int32_t step = 0; rc == 0; step++) {
        int32_t used = 0, left = 0;
        k.n = 0, k.cu[0] = 0;
        rc = schedule_running(&k, &used, err);
        if (rc == 0)
            rc = schedule_waiting(&k, &used, err);
        for (int32_t b = 0; b < k.B; b++)
            left += k.s[b].state != SEQ_DONE;
        // every lockstep rank takes the step while any of them has sequences left (an empty pass serves experts)
        if (rc == 0)
            rc = dsarl_group_all_reduce_host(lock, &left, 1, DSARL_DTYPE_I32, DSARL_REDUCE_MAX, err);
        if (rc || left == 0)
            break;
        if (k.n == 0 && dsarl_group_size(lock) <= 1) {
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "generation native: step %d could admit no sequence: the paged KV "
                            "cache has %d free blocks of %d tokens, too few for the next prompt; raise "
                            "policy.generation.kv_cache_memory_bytes", step, k.pool.n_free, k.bs);
            break;
        }
        rc = forward_step(&k, err);
        if (rc == 0)
            rc = sample_and_advance(&k, err);
    }
    g->stats.peak_blocks_used = k.pool.peak;
    sched_free(&k);
    return rc;
}
