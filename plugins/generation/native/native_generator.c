/* native_generator.c: the native engine's table, its settings, and the contiguous-cache generate loop.
 *
 * A model with the ABI 1.5 paged cache ops is served by the continuous-batching loop of native_paged.c (unless
 * policy.generation.paged_kv_cache is false); this file keeps the contiguous loop for the others. One contiguous
 * generate() call: the cache is sized for the batch (longest prompt + max_new_tokens per slot) and reset; a
 * prefill appends every prompt and yields each one's next-token logits; then each step turns those logits into the
 * sampling distribution and draws one token per running sequence on the device (native_sample_rows: Philox
 * stream per sequence and step), and feeds only the running sequences back through a one-token decode, so
 * finished sequences cost nothing. The model's weights are read in place: the engine holds the policy's own model
 * instance. */
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "native_internal.h"
#include "native_sampling.h"

/* New tokens per prefill call (prefill below): 32768 x the bench model's ~170 KB of one layer's activations per
 * token is about 6 GB. */
#define NATIVE_PREFILL_TOKENS 32768

uint64_t native_sample_stream(int64_t b, int32_t s)
{
    return ((uint64_t)b << 32) | (uint32_t)s;
}

// The paged settings from the recipe (policy.generation.*, vLLM's engine names; null: the default).
static int read_paged_config(const dsarl_node *root, native_paged_config *c, dsarl_error *err)
{
    int64_t bs = 16, bytes = 0, seqs = 0, tokens = NATIVE_PREFILL_TOKENS;
    double share = 0.0;
    bool paged = true, sharing = true;
    if (root) {
        // absent or null: unset (0 is a value, and refused)
        const dsarl_node *u = dsarl_node_get(root, "policy.generation.gpu_memory_utilization");
        if (u && dsarl_node_kind(u) != DSARL_NODE_NULL) {
            DSARL_TRY(dsarl_recipe_double(root, "policy.generation.gpu_memory_utilization", &share, err));
            if (!(share > 0.0 && share <= 1.0))
                return dsarl_recipe_fail(root, "policy.generation.gpu_memory_utilization", err, DSARL_E_INVALID,
                                         "must be in (0, 1] (the fraction of the device's memory in use once the "
                                         "paged KV cache is allocated; null: unset), got %g", share);
        }
        DSARL_TRY(dsarl_recipe_bool_or(root, "policy.generation.paged_kv_cache", true, &paged, err));
        DSARL_TRY(dsarl_recipe_int_or(root, "policy.generation.block_size", 16, &bs, err));
        DSARL_TRY(dsarl_recipe_int_or(root, "policy.generation.kv_cache_memory_bytes", 0, &bytes, err));
        DSARL_TRY(dsarl_recipe_int_or(root, "policy.generation.max_num_seqs", 0, &seqs, err));
        DSARL_TRY(dsarl_recipe_int_or(root, "policy.generation.max_num_batched_tokens", NATIVE_PREFILL_TOKENS,
                                      &tokens, err));
        DSARL_TRY(dsarl_recipe_bool_or(root, "policy.generation.enable_prefix_caching", true, &sharing, err));
        if (bs < 1 || bs > 65536)
            return dsarl_recipe_fail(root, "policy.generation.block_size", err, DSARL_E_INVALID,
                                     "must be in [1, 65536] tokens, got %lld", (long long)bs);
        if (bytes < 0)
            return dsarl_recipe_fail(root, "policy.generation.kv_cache_memory_bytes", err, DSARL_E_INVALID,
                                     "must be >= 0 (0 or null: sized for each batch), got %lld", (long long)bytes);
        if (seqs < 0 || seqs > INT32_MAX)
            return dsarl_recipe_fail(root, "policy.generation.max_num_seqs", err, DSARL_E_INVALID,
                                     "must be >= 1 (0 or null: no bound), got %lld", (long long)seqs);
        if (tokens < 1 || tokens > INT32_MAX)
            return dsarl_recipe_fail(root, "policy.generation.max_num_batched_tokens", err, DSARL_E_INVALID,
                                     "must be in [1, %d], got %lld", INT32_MAX, (long long)tokens);
    }
    *c = (native_paged_config){.enabled = paged, .block_size = (int32_t)bs, .memory_bytes = bytes,
                               .memory_utilization = share,
                               .max_num_seqs = (int32_t)seqs, .max_batched_tokens = (int32_t)tokens,
                               .prefix_sharing = sharing};
    return DSARL_OK;
}

int native_create(const dsarl_node *recipe, const dsarl_model_ops *model_ops, dsarl_model *model,
                  dsarl_generator **out, dsarl_error *err)
{
    // sampling settings arrive per call (dsarl_sampling_params): the algorithm owns those keys; the cache's are ours
    *out = NULL;
    if (!model_ops || !model)
        return DSARL_FAIL(err, DSARL_E_INVALID, "generation native: create needs a model instance and its ops");
    if (model_ops->common.struct_size < offsetof(dsarl_model_ops, device) + sizeof(model_ops->device) ||
        !model_ops->cache_create || !model_ops->forward_cached || !model_ops->cache_reset || !model_ops->device ||
        !model_ops->cache_free)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "generation native: model \"%s\" has no cached inference "
                          "(cache_create/forward_cached); pick a model plugin that provides it",
                          model_ops->common.name ? model_ops->common.name : "?");
    native_paged_config paged;
    DSARL_TRY(read_paged_config(recipe, &paged, err));
    // a model without the ABI 1.5 paged set keeps the contiguous cache
    paged.enabled = paged.enabled && DSARL_MODEL_HAS(model_ops, cache_token_bytes) &&
                    DSARL_MODEL_HAS(model_ops, paged_cache_create) && DSARL_MODEL_HAS(model_ops, forward_paged) &&
                    DSARL_MODEL_HAS(model_ops, cache_copy_block);
    dsarl_generator *g = calloc(1, sizeof(*g));
    if (!g)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "generation native: out of memory");
    g->mo = model_ops, g->model = model, g->prefill_tokens = NATIVE_PREFILL_TOKENS, g->paged = paged;
    model_ops->device(model, &g->dev_ops, &g->dev);
    if (paged.memory_utilization > 0.0 && !DSARL_DEVICE_SLOT(g->dev_ops, memory_info)) {
        int rc = dsarl_recipe_fail(recipe, "policy.generation.gpu_memory_utilization", err, DSARL_E_UNSUPPORTED,
                                   "needs the device's memory_info (plugin ABI 1.7), which device \"%s\" does not "
                                   "have; set policy.generation.kv_cache_memory_bytes instead",
                                   g->dev_ops->common.name ? g->dev_ops->common.name : "?");
        free(g);
        return rc;
    }
    *out = g;
    return DSARL_OK;
}

native_paged_config native_get_paged(const dsarl_generator *g)
{
    return g->paged;
}

void native_set_paged(dsarl_generator *g, native_paged_config c)
{
    g->paged = c;
}

const native_paged_stats *native_paged_last_stats(const dsarl_generator *g)
{
    return &g->stats;
}

static void free_result(dsarl_generator *g)
{
    free(g->cu_lengths), free(g->tokens), free(g->logprobs), free(g->truncated);
    g->cu_lengths = g->tokens = NULL, g->logprobs = NULL, g->truncated = NULL;
    free(g->rec_experts), free(g->rec_indices), free(g->cu_routed);
    g->rec_experts = g->rec_indices = g->cu_routed = NULL;
    g->rec_w_experts = g->rec_w_indices = g->rec_stride = 0;
}

void native_store_routing(dsarl_generator *g, const int32_t *step_experts, const int32_t *step_indices, int32_t n,
                          const int32_t *ids, const int32_t *ctx, const int32_t *cu)
{
    int64_t we = g->rec_w_experts, wi = g->rec_w_indices, S = g->rec_stride;
    for (int32_t i = 0; i < n; i++)
        for (int32_t t = cu[i]; t < cu[i + 1]; t++) {
            int64_t row = (int64_t)ids[i] * S + ctx[i] + (t - cu[i]);
            if (we)
                memcpy(g->rec_experts + row * we, step_experts + t * we, (size_t)we * sizeof(int32_t));
            if (wi)
                memcpy(g->rec_indices + row * wi, step_indices + t * wi, (size_t)wi * sizeof(int32_t));
        }
}

void native_copy_routing(dsarl_generator *g, int32_t src, int32_t dst, int32_t n)
{
    int64_t we = g->rec_w_experts, wi = g->rec_w_indices, S = g->rec_stride;
    if (we)
        memcpy(g->rec_experts + dst * S * we, g->rec_experts + src * S * we, (size_t)(n * we) * sizeof(int32_t));
    if (wi)
        memcpy(g->rec_indices + dst * S * wi, g->rec_indices + src * S * wi, (size_t)(n * wi) * sizeof(int32_t));
}

// Routing buffers for B sequences of up to stride tokens when params ask for them (every row -1: not recorded).
static int alloc_routing(dsarl_generator *g, const dsarl_sampling_params *p, int32_t B, int32_t stride,
                         dsarl_error *err)
{
    uint32_t flags = dsarl_sampling_record_routing(p);
    if (!flags)
        return DSARL_OK;
    if (!g->paged.enabled)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "generation native: record_routing needs the paged loop; "
                          "policy.generation.paged_kv_cache is off or model \"%s\" has no paged cache",
                          g->mo->common.name ? g->mo->common.name : "?");
    if (!DSARL_MODEL_HAS(g->mo, routing_shape))
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "generation native: record_routing asked, but model \"%s\" "
                          "cannot record its routing (no routing_shape)", g->mo->common.name ? g->mo->common.name : "?");
    dsarl_routing_shape sh = {.struct_size = sizeof(sh)};
    DSARL_TRY(g->mo->routing_shape(g->model, &sh, err));
    g->rec_stride = stride;
    g->rec_w_experts = flags & DSARL_RECORD_EXPERTS ? sh.moe_layers * sh.experts_per_token : 0;
    g->rec_w_indices = flags & DSARL_RECORD_INDICES ? sh.index_layers * sh.index_topk : 0;
    size_t rows = (size_t)(B > 0 ? B : 1) * (size_t)stride;
    g->cu_routed = calloc((size_t)B + 1, sizeof(int32_t));
    g->rec_experts = malloc(rows * (size_t)(g->rec_w_experts > 0 ? g->rec_w_experts : 1) * sizeof(int32_t));
    g->rec_indices = malloc(rows * (size_t)(g->rec_w_indices > 0 ? g->rec_w_indices : 1) * sizeof(int32_t));
    if (!g->cu_routed || !g->rec_experts || !g->rec_indices)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "generation native: out of memory recording the routing of %d "
                          "sequences of up to %d tokens", B, stride);
    memset(g->rec_experts, 0xff, rows * (size_t)(g->rec_w_experts > 0 ? g->rec_w_experts : 1) * sizeof(int32_t));
    memset(g->rec_indices, 0xff, rows * (size_t)(g->rec_w_indices > 0 ? g->rec_w_indices : 1) * sizeof(int32_t));
    return DSARL_OK;
}

void native_set_prefill_tokens(dsarl_generator *g, int32_t tokens)
{
    g->prefill_tokens = tokens > 0 ? tokens : NATIVE_PREFILL_TOKENS;
    g->paged.max_batched_tokens = g->prefill_tokens; // the paged loop's step budget is the same knob
}

void native_destroy(dsarl_generator *g)
{
    if (!g)
        return;
    if (g->cache)
        g->mo->cache_free(g->cache);
    if (g->paged_cache)
        g->mo->cache_free(g->paged_cache);
    free(g->stats.admitted), free(g->stats.retired);
    free_result(g);
    free(g);
}

// A cache with room for B slots of max_tokens each, reused (reset) when the last one is big enough.
static int ensure_cache(dsarl_generator *g, int32_t B, int32_t max_tokens, dsarl_error *err)
{
    if (g->cache && g->cache_slots >= B && g->cache_tokens >= max_tokens)
        return g->mo->cache_reset(g->cache, err);
    if (g->cache)
        g->mo->cache_free(g->cache);
    g->cache = NULL;
    DSARL_TRY(g->mo->cache_create(g->model, B, max_tokens, &g->cache, err));
    g->cache_slots = B, g->cache_tokens = max_tokens;
    return DSARL_OK;
}

static void run_free(dsarl_generator *g, run *r)
{
    free(r->logits), free(r->order), free(r->scratch), free(r->running), free(r->len), free(r->step_tokens);
    free(r->step_lp), free(r->cu), free(r->streams);
    g->dev_ops->free(g->dev, r->dev_logits);
    g->dev_ops->free(g->dev, r->dev_tokens);
    g->dev_ops->free(g->dev, r->dev_logprobs);
}

// 1 when the newest token of sequence b completed one of the stop strings.
int native_hits_stop_string(const dsarl_generator *g, const run *r, const dsarl_sampling_params *p, int32_t b,
                            int *hit, dsarl_error *err)
{
    *hit = 0;
    const int32_t *seq = g->tokens + (int64_t)b * r->max_new;
    int32_t n = r->len[b], k = n < r->stop_window ? n : r->stop_window;
    char *text = NULL, *last = NULL;
    size_t text_len = 0, last_len = 0;
    // every token decodes to >= 1 byte, so a stop string ending in the newest token starts within the last k
    DSARL_TRY(dsarl_tokenizer_decode(p->tokenizer, seq + n - k, (size_t)k, 0, &text, &text_len, err));
    int rc = dsarl_tokenizer_decode(p->tokenizer, seq + n - 1, 1, 0, &last, &last_len, err);
    for (int32_t i = 0; rc == 0 && i < p->n_stop_strings && !*hit; i++) {
        size_t sl = strlen(p->stop_strings[i]);
        // occurrences that end inside the newest token's bytes (earlier ones would have stopped earlier)
        for (size_t end = text_len; end >= sl && end + last_len > text_len && !*hit; end--)
            *hit = memcmp(text + end - sl, p->stop_strings[i], sl) == 0;
    }
    free(text), free(last);
    return rc;
}

int native_is_stop_token(const dsarl_sampling_params *p, int32_t eos, int32_t tok)
{
    if (tok == eos && eos >= 0)
        return 1;
    for (int32_t i = 0; i < p->n_stop_token_ids; i++)
        if (tok == p->stop_token_ids[i])
            return 1;
    return 0;
}

int native_sample_rows(dsarl_generator *g, run *r, const dsarl_sampling_params *p, int32_t n, const uint64_t *streams,
                       dsarl_error *err)
{
    const dsarl_device_ops *d = g->dev_ops;
    int64_t V = r->V;
    if (dsarl_device_has_sample_filtered(d)) // filtered and drawn on the device: only ids and log-probs come back
        DSARL_TRY(d->sample_filtered(g->dev, r->dev_tokens, r->dev_logprobs, r->dev_logits, n, V, p->temperature,
                                     p->top_k, p->top_p, p->seed, streams, err));
    else {
        DSARL_TRY(d->copy(g->dev, r->logits, r->dev_logits, (size_t)(n * V) * sizeof(float),
                          DSARL_COPY_DEVICE_TO_HOST, err));
        for (int32_t i = 0; i < n; i++)
            native_process_logits(r->logits + i * V, V, p->temperature, p->top_k, p->top_p, r->order, r->scratch);
        DSARL_TRY(d->copy(g->dev, r->dev_logits, r->logits, (size_t)(n * V) * sizeof(float),
                          DSARL_COPY_HOST_TO_DEVICE, err));
        // the processed logits already carry the temperature: draw from softmax(them), or argmax when greedy
        float draw_temperature = p->temperature > 0.0f ? 1.0f : 0.0f;
        for (int32_t i = 0; i < n; i++)
            DSARL_TRY(d->sample_tokens(g->dev, r->dev_tokens + i, r->dev_logits + i * V, 1, V, draw_temperature,
                                       p->seed, streams[i], err));
        DSARL_TRY(d->logprobs_forward(g->dev, r->dev_logprobs, r->dev_logits, r->dev_tokens, n, V, err));
    }
    DSARL_TRY(d->copy(g->dev, r->step_tokens, r->dev_tokens, (size_t)n * sizeof(int32_t),
                      DSARL_COPY_DEVICE_TO_HOST, err));
    DSARL_TRY(d->copy(g->dev, r->step_lp, r->dev_logprobs, (size_t)n * sizeof(float), DSARL_COPY_DEVICE_TO_HOST,
                      err));
    return d->synchronize(g->dev, err);
}

// Draws and scores one token for each running row from r->logits (host, from forward_cached).
static int sample_step(dsarl_generator *g, run *r, const dsarl_sampling_params *p, int32_t step, int32_t n_run,
                       dsarl_error *err)
{
    DSARL_TRY(g->dev_ops->copy(g->dev, r->dev_logits, r->logits, (size_t)(n_run * r->V) * sizeof(float),
                               DSARL_COPY_HOST_TO_DEVICE, err));
    for (int32_t i = 0; i < n_run; i++)
        r->streams[i] = native_sample_stream(dsarl_sampling_sequence_offset(p) + r->running[i], step);
    return native_sample_rows(g, r, p, n_run, r->streams, err);
}

/* Prefill in calls of at most g->prefill_tokens new tokens: whole prompts packed while they fit, a longer one
 * split into pieces that continue its slot (the cache keeps what earlier pieces appended, and positions follow it).
 * A batch within the budget is one call, as before; two 128K-token prompts would otherwise make one 256K-token pass,
 * whose activations alone (MoE dispatch, per-head staging) take tens of GB. The logits of a sequence come from the
 * call holding its last piece. */
static int prefill(dsarl_generator *g, run *r, const dsarl_token_batch *prompts, bool lockstep, dsarl_error *err)
{
    int32_t B = r->B;
    // one pass: within the budget, a lockstep rank's empty pass, or under lockstep at all (every rank must make the
    // same model calls: expert parallelism exchanges tokens in each)
    if (prompts->n_tokens <= g->prefill_tokens || B == 0 || lockstep)
        return g->mo->forward_cached(g->model, g->cache, prompts, r->running, r->logits, err);
    int64_t V = r->V;
    int32_t *cu = malloc((size_t)(B + 1) * sizeof(int32_t)), *slots = malloc((size_t)B * sizeof(int32_t));
    int32_t *done = malloc((size_t)B * sizeof(int32_t)); // prompt tokens of each sequence already prefilled
    float *logits = malloc((size_t)B * (size_t)V * sizeof(float));
    int rc = cu && slots && done && logits ? DSARL_OK
                                           : DSARL_FAIL(err, DSARL_E_NOMEM, "generation native: out of memory for "
                                                        "the prefill of %d prompts", B);
    for (int32_t b = 0; rc == 0 && b < B; b++)
        done[b] = 0;
    for (int32_t first = 0; rc == 0 && first < B;) {
        // this call: pieces of sequences first.. in order, g->prefill_tokens tokens at most
        int32_t n = 0, budget = g->prefill_tokens;
        cu[0] = 0;
        for (int32_t b = first; b < B && budget > 0; b++) {
            int32_t left = prompts->cu_seqlens[b + 1] - prompts->cu_seqlens[b] - done[b];
            int32_t take = left < budget ? left : budget;
            slots[n] = b, cu[n + 1] = cu[n] + take, n++;
            budget -= take;
        }
        // the pieces are contiguous in the packed prompts: from sequence first's next token on
        const int32_t *tokens = prompts->tokens + prompts->cu_seqlens[first] + done[first];
        dsarl_token_batch piece = {.struct_size = sizeof(piece), .n_tokens = cu[n], .n_sequences = n,
                                   .tokens = tokens, .cu_seqlens = cu};
        rc = g->mo->forward_cached(g->model, g->cache, &piece, slots, logits, err);
        for (int32_t i = 0; rc == 0 && i < n; i++) {
            int32_t b = slots[i], len = prompts->cu_seqlens[b + 1] - prompts->cu_seqlens[b];
            done[b] += cu[i + 1] - cu[i];
            if (done[b] == len) { // its last piece: these are its next-token logits
                memcpy(r->logits + (int64_t)b * V, logits + (int64_t)i * V, (size_t)V * sizeof(float));
                first = b + 1;
            }
        }
    }
    free(cu), free(slots), free(done), free(logits);
    return rc;
}

static int generate_loop(dsarl_generator *g, run *r, const dsarl_token_batch *prompts,
                         const dsarl_sampling_params *p, dsarl_error *err)
{
    int32_t B = r->B, n_run = B;
    const dsarl_tokenizer *tok = p->struct_size >= offsetof(dsarl_sampling_params, tokenizer) +
                                 sizeof(p->tokenizer) ? p->tokenizer : NULL;
    int32_t eos = tok ? dsarl_tokenizer_eos_id(tok) : -1;
    for (int32_t b = 0; b < B; b++)
        r->running[b] = b;
    const dsarl_group *lock = dsarl_sampling_lockstep(p);
    // prefill: every prompt into its own slot (no prompts at all: a lockstep rank's empty pass)
    DSARL_TRY(prefill(g, r, prompts, dsarl_group_size(lock) > 1, err));
    for (int32_t step = 0;; step++) {
        if (n_run == 0) { // this rank is done; its lockstep peers may not be: one more empty pass each step they run
            int32_t peers = 0;
            DSARL_TRY(dsarl_group_all_reduce_host(lock, &peers, 1, DSARL_DTYPE_I32, DSARL_REDUCE_MAX, err));
            if (peers == 0)
                break;
            dsarl_token_batch none = {.struct_size = sizeof(none), .n_tokens = 0, .n_sequences = 0,
                                      .tokens = r->step_tokens, .cu_seqlens = r->cu};
            r->cu[0] = 0;
            DSARL_TRY(g->mo->forward_cached(g->model, g->cache, &none, r->running, r->logits, err));
            continue;
        }
        DSARL_TRY(sample_step(g, r, p, step, n_run, err));
        int32_t still = 0;
        for (int32_t i = 0; i < n_run; i++) {
            int32_t b = r->running[i], t = r->step_tokens[i];
            g->tokens[(int64_t)b * r->max_new + r->len[b]] = t;
            g->logprobs[(int64_t)b * r->max_new + r->len[b]] = r->step_lp[i];
            r->len[b]++;
            int stop = native_is_stop_token(p, eos, t), hit = 0;
            if (!stop && p->n_stop_strings > 0)
                DSARL_TRY(native_hits_stop_string(g, r, p, b, &hit, err));
            if (stop || hit)
                continue;
            if (r->len[b] == r->max_new) {
                g->truncated[b] = 1;
                continue;
            }
            r->step_tokens[still] = t; // compacted: the next decode's tokens, in running order
            r->running[still++] = b;
        }
        n_run = still;
        int32_t any = n_run; // the step is taken by every lockstep rank, or by none
        DSARL_TRY(dsarl_group_all_reduce_host(lock, &any, 1, DSARL_DTYPE_I32, DSARL_REDUCE_MAX, err));
        if (any == 0)
            break;
        for (int32_t i = 0; i <= n_run; i++)
            r->cu[i] = i;
        dsarl_token_batch next = {.struct_size = sizeof(next), .n_tokens = n_run, .n_sequences = n_run,
                                  .tokens = r->step_tokens, .cu_seqlens = r->cu};
        DSARL_TRY(g->mo->forward_cached(g->model, g->cache, &next, r->running, r->logits, err));
    }
    return DSARL_OK;
}

// Packs the per-sequence completions (stride max_new) into the result's contiguous arrays, in place.
static void pack_result(dsarl_generator *g, const run *r, const dsarl_token_batch *prompts,
                        dsarl_generation_result *result)
{
    g->cu_lengths[0] = 0;
    for (int32_t b = 0; b < r->B; b++) {
        int32_t at = g->cu_lengths[b];
        memmove(g->tokens + at, g->tokens + (int64_t)b * r->max_new, (size_t)r->len[b] * sizeof(int32_t));
        memmove(g->logprobs + at, g->logprobs + (int64_t)b * r->max_new, (size_t)r->len[b] * sizeof(float));
        g->cu_lengths[b + 1] = at + r->len[b];
    }
    uint32_t caller_size = result->struct_size;
    *result = (dsarl_generation_result){.struct_size = sizeof(*result), .n_sequences = r->B,
                                        .cu_lengths = g->cu_lengths, .tokens = g->tokens, .logprobs = g->logprobs,
                                        .truncated = g->truncated};
    if (!g->cu_routed)
        return;
    int64_t we = g->rec_w_experts, wi = g->rec_w_indices, S = g->rec_stride;
    for (int32_t b = 0; b < r->B; b++) { // rows of prompt + completion, packed
        int64_t at = g->cu_routed[b], n = prompts->cu_seqlens[b + 1] - prompts->cu_seqlens[b] + r->len[b];
        memmove(g->rec_experts + at * we, g->rec_experts + b * S * we, (size_t)(n * we) * sizeof(int32_t));
        memmove(g->rec_indices + at * wi, g->rec_indices + b * S * wi, (size_t)(n * wi) * sizeof(int32_t));
        g->cu_routed[b + 1] = (int32_t)(at + n);
    }
    if (caller_size >= offsetof(dsarl_generation_result, routed_indices) + sizeof(result->routed_indices)) {
        result->cu_routed = g->cu_routed;
        result->routed_experts = we ? g->rec_experts : NULL;
        result->routed_indices = wi ? g->rec_indices : NULL;
    }
}

int native_generate(dsarl_generator *g, const dsarl_token_batch *prompts, const dsarl_sampling_params *p,
                    dsarl_generation_result *result, dsarl_error *err)
{
    DSARL_TRY(native_check_params(p, err));
    // a lockstep rank with no prompts still takes every pass its peers take
    bool idle_peer = prompts && prompts->n_sequences == 0 && prompts->n_tokens == 0 &&
                     dsarl_group_size(dsarl_sampling_lockstep(p)) > 1;
    if (!idle_peer && (!prompts || prompts->n_sequences < 1 || !prompts->cu_seqlens || !prompts->tokens ||
        prompts->cu_seqlens[0] != 0 || prompts->cu_seqlens[prompts->n_sequences] != prompts->n_tokens))
        return DSARL_FAIL(err, DSARL_E_INVALID, "generation native: prompts need at least one sequence and "
                          "cu_seqlens running from 0 to n_tokens");
    int32_t B = prompts->n_sequences, longest = 0;
    for (int32_t b = 0; b < B; b++) {
        int32_t n = prompts->cu_seqlens[b + 1] - prompts->cu_seqlens[b];
        if (n < 1)
            return DSARL_FAIL(err, DSARL_E_INVALID, "generation native: prompt %d is empty; every prompt needs at "
                              "least one token", b);
        longest = n > longest ? n : longest;
    }
    int64_t V = g->mo->vocab_size(g->model);
    for (int64_t t = 0; t < prompts->n_tokens; t++)
        if (prompts->tokens[t] < 0 || prompts->tokens[t] >= V)
            return DSARL_FAIL(err, DSARL_E_INVALID, "generation native: prompt token %lld is %d, outside the "
                              "vocabulary [0, %lld)", (long long)t, prompts->tokens[t], (long long)V);
    free_result(g);
    uint32_t caller_size = result->struct_size;
    memset(result, 0, sizeof(*result));
    result->struct_size = caller_size;
    run r = {.B = B, .max_new = p->max_new_tokens, .V = V};
    for (int32_t i = 0; i < p->n_stop_strings; i++) {
        int32_t n = (int32_t)strlen(p->stop_strings[i]);
        r.stop_window = n > r.stop_window ? n : r.stop_window;
    }
    size_t Bn = B > 0 ? (size_t)B : 1; // an idle lockstep rank (B = 0) still needs room for its empty passes
    size_t cells = Bn * (size_t)r.max_new;
    g->cu_lengths = calloc(Bn + 1, sizeof(int32_t));
    g->tokens = calloc(cells, sizeof(int32_t));
    g->logprobs = calloc(cells, sizeof(float));
    g->truncated = calloc(Bn, 1);
    r.logits = malloc(Bn * (size_t)V * sizeof(float));
    r.order = malloc((size_t)V * sizeof(int32_t));
    r.scratch = malloc((size_t)V * sizeof(int32_t));
    r.running = calloc(Bn, sizeof(int32_t));
    r.len = calloc(Bn, sizeof(int32_t));
    r.step_tokens = calloc(Bn, sizeof(int32_t));
    r.step_lp = calloc(Bn, sizeof(float));
    r.cu = calloc(Bn + 1, sizeof(int32_t));
    r.streams = calloc(Bn, sizeof(uint64_t));
    int rc = DSARL_OK;
    if (!g->cu_lengths || !g->tokens || !g->logprobs || !g->truncated || !r.logits || !r.order || !r.scratch ||
        !r.running || !r.len || !r.step_tokens || !r.step_lp || !r.cu || !r.streams)
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "generation native: out of memory for %d sequences of up to %d new "
                        "tokens", B, r.max_new);
    if (rc == 0)
        rc = alloc_routing(g, p, B, longest + r.max_new, err);
    if (rc == 0)
        rc = g->dev_ops->alloc(g->dev, Bn * (size_t)V * sizeof(float), (void **)&r.dev_logits, err);
    if (rc == 0)
        rc = g->dev_ops->alloc(g->dev, Bn * sizeof(int32_t), (void **)&r.dev_tokens, err);
    if (rc == 0)
        rc = g->dev_ops->alloc(g->dev, Bn * sizeof(float), (void **)&r.dev_logprobs, err);
    if (rc == 0 && g->paged.enabled)
        rc = native_generate_paged(g, &r, prompts, p, err);
    else {
        if (rc == 0)
            rc = ensure_cache(g, (int32_t)Bn, longest + r.max_new, err);
        if (rc == 0)
            rc = generate_loop(g, &r, prompts, p, err);
    }
    if (rc == 0)
        pack_result(g, &r, prompts, result);
    else
        free_result(g);
    run_free(g, &r);
    return rc;
}

static const dsarl_key_spec native_keys[] = {
    {"policy.generation.paged_kv_cache", DSARL_KEY_BOOL, "true",
     "paged KV cache with continuous batching (false: one contiguous slot per sequence, all run to the end)", 0},
    {"policy.generation.block_size", DSARL_KEY_INT, "16", "tokens per KV cache block (vLLM's block_size)", 0},
    {"policy.generation.kv_cache_memory_bytes", DSARL_KEY_INT, "null",
     "device bytes of the paged KV cache arena; null: sized so a batch never preempts", DSARL_KEY_NULLABLE},
    {"policy.generation.gpu_memory_utilization", DSARL_KEY_FLOAT, "null",
     "fraction (0, 1] of the device's memory in use once the paged KV cache arena is allocated: the arena takes it "
     "less what is in use already; null: sized for each batch (kv_cache_memory_bytes wins when both are set)",
     DSARL_KEY_NULLABLE},
    {"policy.generation.max_num_seqs", DSARL_KEY_INT, "null", "sequences decoding at once; null: no bound",
     DSARL_KEY_NULLABLE},
    {"policy.generation.max_num_batched_tokens", DSARL_KEY_INT, "null",
     "tokens per forward step, decode and prefill chunks together; null: 32768", DSARL_KEY_NULLABLE},
    {"policy.generation.enable_prefix_caching", DSARL_KEY_BOOL, "true",
     "equal prompts (GRPO's generations of one prompt) share one prefill, copy-on-write", 0},
};

const dsarl_generation_ops native_generation_ops = {
    .common = DSARL_OPS_COMMON_RANKED(dsarl_generation_ops, DSARL_KIND_GENERATION, "native",
                                      "paged KV cache of MLA latents + indexer keys, continuous batching, shared "
                                      "prompt prefill; prefill/decode through the training DSA ops; "
                                      "temperature/top-k/top-p on the device, stop ids/strings, per-token log-probs",
                                      native_keys, DSARL_RANK_PRIMARY),
    .create = native_create,
    .destroy = native_destroy,
    .generate = native_generate,
};
