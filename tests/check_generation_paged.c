/* check_generation_paged.c: the native engine's paged KV cache and continuous batching against its contiguous cache.
 *
 *   equal      paged runs (block sizes 1, 4, 7: sequences over many blocks) give the contiguous cache's tokens and
 *              log-probs bit for bit, greedy and seeded top-k/top-p sampling, on glm5.1 and glm5.2 (IndexShare)
 *              models whose prompts are longer than index_topk: the step batches are the same, and the paged
 *              forward gathers every layer's keys in token order, so the arithmetic is the same.
 *   sharing    a group of G equal prompts costs one prefill (prompt tokens through the model counted), with a
 *              block shared mid-way (copy-on-write) and one shared whole; tokens equal the unshared run's.
 *   preempt    an arena too small for the batch preempts (recompute) and still gives the unpreempted tokens.
 *   batching   max_num_seqs 2 over sequences of different lengths: admission and retirement follow the order a
 *              hand simulation of the scheduler gives; chunked prefill mixed with decode gives the same tokens.
 *   sampler    the CPU device's sample_filtered equals host filtering + sample_tokens + logprobs_forward, and an
 *              engine on a device without the op (host filtering) draws what it draws.
 *   refusals   arenas smaller than one sequence, bad block tables, a paged cache given to forward_cached.
 *   memory     policy.generation.gpu_memory_utilization: the arena formula on hand-worked values (GLM-5.2's cache
 *              row among them), an engine sized from the cpu device's memory_info giving the unset engine's tokens
 *              and log-probs bit for bit, bad values, an arena below one sequence, a device without memory_info.
 * Where batch composition differs from the contiguous run (sharing, preemption, max_num_seqs, chunks) GEMM row
 * counts differ (an MoE expert's GEMM has as many rows as tokens routed to it, and OpenBLAS rounds a one-row
 * product unlike the same row in a larger one), so tokens must be equal and log-probs are bounded (relative 1e-5,
 * as ragged batches against sequences alone); the number of bit-identical ones is printed. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_model_fixture.h"
#include "dsarl/rng.h"
#include "dsarl/sampling.h"
#include "generation_recipes.h"
#include "glm5_ops.h"
#include "native_generator.h"

static dsarl_error err;

typedef cpu_model_fixture loaded; // a model on its own CPU device with the reference DSA backend

static loaded load_recipe(const char *text, const dsarl_model_ops *ops, uint64_t seed)
{
    loaded l;
    cpu_model_fixture_open(&l, ops, text, "gen.yaml", seed);
    return l;
}

static void unload(loaded *l)
{
    cpu_model_fixture_close(l);
}

// Random prompts of the given lengths (ids in [1, V)), packed; copies[b] > 1 repeats prompt b (a GRPO group).
static dsarl_token_batch make_prompts(int32_t B, const int32_t *lens, uint32_t seed, int32_t **tokens, int32_t **cu)
{
    *cu = malloc((size_t)(B + 1) * sizeof(int32_t));
    (*cu)[0] = 0;
    for (int32_t b = 0; b < B; b++)
        (*cu)[b + 1] = (*cu)[b] + lens[b];
    *tokens = malloc((size_t)(*cu)[B] * sizeof(int32_t));
    dsarl_rng rng;
    dsarl_rng_init(&rng, seed, 0);
    for (int32_t t = 0; t < (*cu)[B]; t++)
        (*tokens)[t] = 1 + (int32_t)dsarl_rng_below(&rng, 259);
    return (dsarl_token_batch){.struct_size = sizeof(dsarl_token_batch), .n_tokens = (*cu)[B], .n_sequences = B,
                               .tokens = *tokens, .cu_seqlens = *cu};
}

static dsarl_sampling_params params(float temperature, int32_t max_new, uint64_t seed)
{
    return (dsarl_sampling_params){.struct_size = sizeof(dsarl_sampling_params), .temperature = temperature,
                                   .top_p = 1.0f, .top_k = 0, .max_new_tokens = max_new, .seed = seed};
}

// A generate() result copied out of the engine, with the paged statistics of the call.
typedef struct outcome {
    int32_t B, *cu, *tokens, *admitted, *retired, n_admitted, n_retired;
    float *logprobs;
    uint8_t *truncated;
    native_paged_stats stats;
} outcome;

// Runs one generate() on gen and copies the result and the paged statistics out of the engine.
static outcome collect(dsarl_generator *gen, const dsarl_token_batch *prompts, const dsarl_sampling_params *sp)
{
    dsarl_generation_result res;
    ck_assert_msg(native_generate(gen, prompts, sp, &res, &err) == 0, "%s", err.message);
    outcome o = {.B = res.n_sequences};
    int32_t total = res.cu_lengths[res.n_sequences];
    o.cu = malloc((size_t)(o.B + 1) * 4), o.tokens = malloc((size_t)total * 4 + 4);
    o.logprobs = malloc((size_t)total * 4 + 4), o.truncated = malloc((size_t)o.B);
    memcpy(o.cu, res.cu_lengths, (size_t)(o.B + 1) * 4);
    memcpy(o.tokens, res.tokens, (size_t)total * 4);
    memcpy(o.logprobs, res.logprobs, (size_t)total * 4);
    memcpy(o.truncated, res.truncated, (size_t)o.B);
    const native_paged_stats *st = native_paged_last_stats(gen);
    o.stats = *st;
    o.n_admitted = st->n_admitted, o.n_retired = st->n_retired;
    o.admitted = malloc((size_t)st->n_admitted * 4 + 4), o.retired = malloc((size_t)st->n_retired * 4 + 4);
    if (st->n_admitted)
        memcpy(o.admitted, st->admitted, (size_t)st->n_admitted * 4);
    if (st->n_retired)
        memcpy(o.retired, st->retired, (size_t)st->n_retired * 4);
    return o;
}

static outcome generate(const loaded *l, const dsarl_token_batch *prompts, const dsarl_sampling_params *sp,
                        const native_paged_config *cfg)
{
    dsarl_generator *gen = NULL;
    ck_assert_msg(native_create(NULL, l->ops, l->model, &gen, &err) == 0, "%s", err.message);
    native_paged_config c = native_get_paged(gen);
    ck_assert_msg(c.enabled, "glm5 has the paged ops: the engine should page by default");
    if (cfg)
        native_set_paged(gen, *cfg);
    else
        c.enabled = false, native_set_paged(gen, c);
    outcome o = collect(gen, prompts, sp);
    native_destroy(gen);
    return o;
}

static void outcome_free(outcome *o)
{
    free(o->cu), free(o->tokens), free(o->logprobs), free(o->truncated), free(o->admitted), free(o->retired);
}

static native_paged_config paged(int32_t block_size)
{
    return (native_paged_config){.enabled = true, .block_size = block_size, .max_batched_tokens = 32768,
                                 .prefix_sharing = true};
}

// Same completions; log-probs bit-identical when exact, else within relative 1e-5. Returns the bit-identical count.
static int64_t compare(const outcome *a, const outcome *b, bool exact, const char *what)
{
    ck_assert_int_eq(a->B, b->B);
    int64_t same = 0;
    for (int32_t s = 0; s < a->B; s++) {
        ck_assert_msg(a->cu[s + 1] == b->cu[s + 1], "%s: sequence %d has %d tokens, reference %d", what, s,
                      b->cu[s + 1] - b->cu[s], a->cu[s + 1] - a->cu[s]);
        ck_assert_int_eq(a->truncated[s], b->truncated[s]);
    }
    for (int32_t t = 0; t < a->cu[a->B]; t++) {
        ck_assert_msg(a->tokens[t] == b->tokens[t], "%s: token %d is %d, reference %d", what, t, b->tokens[t],
                      a->tokens[t]);
        float x = a->logprobs[t], y = b->logprobs[t];
        if (exact)
            ck_assert_msg(memcmp(&x, &y, sizeof x) == 0, "%s: log-prob %d is %.9g, reference %.9g", what, t, y, x);
        else
            ck_assert_msg(fabsf(x - y) <= 1e-5f * fmaxf(1.0f, fabsf(x)), "%s: log-prob %d is %.9g, reference %.9g",
                          what, t, y, x);
        same += memcmp(&x, &y, sizeof x) == 0;
    }
    return same;
}

START_TEST(test_paged_equals_contiguous)
{
    const char *recipes[2] = {recipe_52, recipe_51};
    const dsarl_model_ops *ops[2] = {&glm5_2_model_ops, &glm5_1_model_ops};
    int32_t lens[5] = {9, 1, 4, 13, 6}, *tokens, *cu, block_sizes[3] = {4, 1, 7};
    for (int i = 0; i < 2; i++) {
        loaded l = load_recipe(recipes[i], ops[i], 31 + (uint64_t)i);
        dsarl_token_batch prompts = make_prompts(5, lens, 17 + (uint32_t)i, &tokens, &cu);
        dsarl_sampling_params greedy = params(0.0f, 8, 1), sampled = params(0.8f, 8, 99);
        sampled.top_k = 40, sampled.top_p = 0.9f;
        const dsarl_sampling_params *sps[2] = {&greedy, &sampled};
        for (int s = 0; s < 2; s++) {
            outcome want = generate(&l, &prompts, sps[s], NULL);
            for (int b = 0; b < 3; b++) {
                native_paged_config c = paged(block_sizes[b]);
                outcome got = generate(&l, &prompts, sps[s], &c);
                compare(&want, &got, true, "paged vs contiguous");
                ck_assert_int_eq(got.stats.preemptions, 0);
                ck_assert_int_eq(got.stats.n_admitted, 5);
                outcome_free(&got);
            }
            outcome_free(&want);
        }
        free(tokens), free(cu);
        unload(&l);
    }
}
END_TEST

// GRPO's layout: G copies of each prompt, one after another. Prompt 0 (10 tokens, blocks of 4) leaves a shared block
// half full, so every member's first token copies it; prompt 1 (8 tokens) fills its blocks, so none is copied.
START_TEST(test_prefix_sharing_one_prefill)
{
    loaded l = load_recipe(recipe_52, &glm5_2_model_ops, 41);
    enum { G = 4 };
    int32_t base_lens[2] = {10, 8}, *base_tok, *base_cu;
    dsarl_token_batch base = make_prompts(2, base_lens, 5, &base_tok, &base_cu);
    int32_t lens[2 * G], cu[2 * G + 1] = {0}, *tokens = malloc((size_t)(G * 18) * sizeof(int32_t));
    for (int32_t b = 0; b < 2 * G; b++) {
        int32_t src = b / G;
        lens[b] = base_lens[src];
        memcpy(tokens + cu[b], base.tokens + base.cu_seqlens[src], (size_t)lens[b] * sizeof(int32_t));
        cu[b + 1] = cu[b] + lens[b];
    }
    dsarl_token_batch prompts = {.struct_size = sizeof(prompts), .n_tokens = cu[2 * G], .n_sequences = 2 * G,
                                 .tokens = tokens, .cu_seqlens = cu};
    dsarl_sampling_params sp = params(1.0f, 7, 2024);
    native_paged_config shared = paged(4), unshared = paged(4);
    unshared.prefix_sharing = false;
    outcome one = generate(&l, &prompts, &sp, &shared), each = generate(&l, &prompts, &sp, &unshared);
    outcome want = generate(&l, &prompts, &sp, NULL);
    ck_assert_int_eq(one.stats.prompt_tokens_computed, 18);        // one prefill per group
    ck_assert_int_eq(each.stats.prompt_tokens_computed, G * 18);   // one per sequence
    ck_assert_int_eq(one.stats.tokens_computed, each.stats.tokens_computed - (G - 1) * 18);
    ck_assert_msg(one.stats.peak_blocks_used < each.stats.peak_blocks_used, "sharing used %d blocks at peak, "
                  "unshared %d", one.stats.peak_blocks_used, each.stats.peak_blocks_used);
    compare(&want, &each, true, "unshared paged vs contiguous");
    int64_t same = compare(&want, &one, false, "shared prefill vs contiguous");
    // the members drew different completions from one prefill's logits (their own Philox streams)
    ck_assert(memcmp(one.tokens + one.cu[0], one.tokens + one.cu[1], 7 * sizeof(int32_t)) != 0);
    fprintf(stderr, "prefix sharing: %d prompt tokens computed for %d sequences (unshared %d); %lld of %d log-probs "
            "bit-identical to the contiguous run\n", (int)one.stats.prompt_tokens_computed, 2 * G,
            (int)each.stats.prompt_tokens_computed, (long long)same, one.cu[2 * G]);
    outcome_free(&one), outcome_free(&each), outcome_free(&want);
    free(tokens), free(base_tok), free(base_cu);
    unload(&l);
}
END_TEST

// An arena of 7 blocks of 4 tokens (each sequence needs up to 4) for 5 sequences: running ones are preempted and
// recomputed; the completions are the unpreempted run's.
START_TEST(test_preemption_recompute)
{
    loaded l = load_recipe(recipe_51, &glm5_1_model_ops, 43);
    int32_t lens[5] = {5, 3, 7, 2, 6}, *tokens, *cu;
    dsarl_token_batch prompts = make_prompts(5, lens, 9, &tokens, &cu);
    dsarl_sampling_params sp = params(0.9f, 8, 77);
    sp.top_k = 30;
    native_paged_config roomy = paged(4), tiny = paged(4);
    tiny.memory_bytes = 7 * 4 * l.ops->cache_token_bytes(l.model);
    outcome want = generate(&l, &prompts, &sp, &roomy), got = generate(&l, &prompts, &sp, &tiny);
    ck_assert_int_eq(want.stats.preemptions, 0);
    ck_assert_int_eq(got.stats.blocks, 7);
    ck_assert_msg(got.stats.preemptions > 0, "7 blocks for 5 sequences of up to 15 tokens should preempt");
    ck_assert_int_le(got.stats.peak_blocks_used, 7);
    ck_assert_int_eq(got.stats.n_admitted, 5 + got.stats.preemptions);
    int64_t same = compare(&want, &got, false, "preempted vs unpreempted");
    fprintf(stderr, "preemption: %lld preemptions, %lld tokens computed (unpreempted %lld); %lld of %d log-probs "
            "bit-identical\n", (long long)got.stats.preemptions, (long long)got.stats.tokens_computed,
            (long long)want.stats.tokens_computed, (long long)same, got.cu[5]);
    outcome_free(&want), outcome_free(&got);
    free(tokens), free(cu);
    unload(&l);
}
END_TEST

// max_num_seqs 2 over 6 sequences that stop at different steps (stop ids drawn from the free run). The expected
// admission and retirement orders come from simulating the rules by hand: each step the running sequences
// (admission order) take one token, then waiting ones are admitted in index order into free places, their prefill
// giving their first token in that step; a sequence retires in the step that draws its last token.
START_TEST(test_continuous_batching_order)
{
    loaded l = load_recipe(recipe_52, &glm5_2_model_ops, 47);
    enum { B = 6, MAX_NEW = 9 };
    int32_t lens[B] = {4, 11, 2, 7, 5, 3}, *tokens, *cu;
    dsarl_token_batch prompts = make_prompts(B, lens, 13, &tokens, &cu);
    dsarl_sampling_params sp = params(1.3f, MAX_NEW, 8);
    outcome free_run = generate(&l, &prompts, &sp, NULL);
    // stop ids: the 2nd token of sequence 0 and the 5th of sequence 3 (stopping whoever draws them first)
    int32_t stop_ids[2] = {free_run.tokens[free_run.cu[0] + 1], free_run.tokens[free_run.cu[3] + 4]};
    sp.stop_token_ids = stop_ids, sp.n_stop_token_ids = 2;
    outcome want = generate(&l, &prompts, &sp, NULL);
    int32_t n_len[B], distinct = 0;
    for (int32_t b = 0; b < B; b++) {
        n_len[b] = want.cu[b + 1] - want.cu[b];
        int seen = 0;
        for (int32_t a = 0; a < b; a++)
            seen |= n_len[a] == n_len[b];
        distinct += !seen;
    }
    ck_assert_msg(distinct >= 3, "the stop ids should give sequences of several lengths");
    // the hand simulation
    int32_t act[2], n_act = 0, next = 0, done[B] = {0}, order[B], n_order = 0;
    while (n_order < B) {
        int32_t step_seqs[2], n_step = 0;
        for (int32_t i = 0; i < n_act; i++)
            step_seqs[n_step++] = act[i];
        while (n_act < 2 && next < B)
            act[n_act++] = next, step_seqs[n_step++] = next++;
        for (int32_t i = 0; i < n_step; i++) {
            int32_t b = step_seqs[i];
            if (++done[b] == n_len[b]) {
                order[n_order++] = b;
                for (int32_t j = 0; j < n_act; j++)
                    if (act[j] == b) {
                        memmove(act + j, act + j + 1, (size_t)(n_act - j - 1) * sizeof(int32_t));
                        n_act--;
                        break;
                    }
            }
        }
    }
    native_paged_config two = paged(4);
    two.max_num_seqs = 2;
    outcome got = generate(&l, &prompts, &sp, &two);
    compare(&want, &got, false, "max_num_seqs 2 vs contiguous");
    ck_assert_int_eq(got.n_admitted, B);
    for (int32_t b = 0; b < B; b++)
        ck_assert_int_eq(got.admitted[b], b);
    ck_assert_int_eq(got.n_retired, B);
    for (int32_t i = 0; i < B; i++)
        ck_assert_msg(got.retired[i] == order[i], "retirement %d is sequence %d, the simulation says %d", i,
                      got.retired[i], order[i]);
    // chunked prefill mixed with decode: 5 tokens per step, prompts longer than that arrive in pieces
    native_paged_config chunks = paged(4);
    chunks.max_batched_tokens = 5;
    outcome chunked = generate(&l, &prompts, &sp, &chunks);
    compare(&want, &chunked, false, "5-token steps vs contiguous");
    ck_assert_msg(chunked.stats.mixed_steps > 0, "5-token steps should mix decode tokens with prompt chunks");
    ck_assert_int_eq(chunked.stats.prompt_tokens_computed, prompts.n_tokens);
    outcome_free(&free_run), outcome_free(&want), outcome_free(&got), outcome_free(&chunked);
    free(tokens), free(cu);
    unload(&l);
}
END_TEST

// The CPU device's sample_filtered against the host path it replaces, on random rows with ties.
START_TEST(test_device_sampler_matches_host)
{
    enum { T = 5, V = 300 };
    float *raw = malloc(T * V * sizeof(float)), *dev_rows = malloc(T * V * sizeof(float));
    float *host_rows = malloc(T * V * sizeof(float));
    int32_t *order = malloc(V * sizeof(int32_t)), *scratch = malloc(V * sizeof(int32_t));
    dsarl_rng rng;
    dsarl_rng_init(&rng, 3, 0);
    for (int64_t i = 0; i < T * V; i++) // quarter steps: many exact ties
        raw[i] = (float)((int32_t)dsarl_rng_below(&rng, 40) - 20) * 0.25f;
    struct { float temperature, top_p; int32_t top_k; } cases[4] = {{0.0f, 1.0f, 0}, {1.0f, 1.0f, 0},
                                                                      {0.7f, 0.8f, 25}, {1.4f, 0.5f, -1}};
    uint64_t streams[T];
    for (int32_t t = 0; t < T; t++)
        streams[t] = native_sample_stream(t * 7 + 1, t + 3);
    dsarl_device_config dc = {.struct_size = sizeof(dc), .threads = 1};
    dsarl_device *dev = NULL;
    ck_assert_int_eq(cpu_create(&dc, &dev, &err), 0);
    for (int c = 0; c < 4; c++) {
        memcpy(dev_rows, raw, T * V * sizeof(float));
        memcpy(host_rows, raw, T * V * sizeof(float));
        int32_t tok_dev[T], tok_host[T];
        float lp_dev[T], lp_host[T];
        ck_assert_int_eq(dsarl_cpu_device_ops.sample_filtered(dev, tok_dev, lp_dev, dev_rows, T, V,
                                                               cases[c].temperature, cases[c].top_k, cases[c].top_p,
                                                               11, streams, &err), 0);
        for (int32_t t = 0; t < T; t++) {
            float *row = host_rows + t * V;
            dsarl_sampling_filter_row(row, V, cases[c].temperature, cases[c].top_k, cases[c].top_p, order, scratch);
            ck_assert_int_eq(cpu_sample_tokens(dev, tok_host + t, row, 1, V, cases[c].temperature > 0 ? 1.0f : 0.0f,
                                               11, streams[t], &err), 0);
            ck_assert_int_eq(cpu_logprobs_forward(dev, lp_host + t, row, tok_host + t, 1, V, &err), 0);
            ck_assert(isfinite(row[tok_host[t]]));
        }
        ck_assert_int_eq(memcmp(tok_dev, tok_host, sizeof tok_dev), 0);
        ck_assert_int_eq(memcmp(lp_dev, lp_host, sizeof lp_dev), 0);
        ck_assert_int_eq(memcmp(dev_rows, host_rows, T * V * sizeof(float)), 0); // the filtered rows too
    }
    cpu_destroy(dev);
    free(raw), free(dev_rows), free(host_rows), free(order), free(scratch);
}
END_TEST

// A device without sample_filtered (an older plugin): the engine filters on the host and draws with
// sample_tokens, and gets the same ids and log-probs as the device op.
START_TEST(test_host_sampling_fallback)
{
    loaded l = load_recipe(recipe_52, &glm5_2_model_ops, 53);
    dsarl_device_ops old = dsarl_cpu_device_ops;
    old.sample_filtered = NULL;
    ck_assert(!dsarl_device_has_sample_filtered(&old));
    dsarl_model *m_old = NULL;
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(l.recipe), .device_ops = &old,
                             .device = l.dev, .dsa_ops = &dsarl_dsa_reference_ops, .dsa = l.dsa, .seed = 53};
    ck_assert_msg(l.ops->create(&mc, &m_old, &err) == 0, "%s", err.message);
    loaded l_old = l;
    l_old.model = m_old;
    int32_t lens[3] = {7, 2, 5}, *tokens, *cu;
    dsarl_token_batch prompts = make_prompts(3, lens, 23, &tokens, &cu);
    dsarl_sampling_params sp = params(0.8f, 6, 31);
    sp.top_k = 20, sp.top_p = 0.7f;
    native_paged_config c = paged(4);
    outcome on_device = generate(&l, &prompts, &sp, &c), on_host = generate(&l_old, &prompts, &sp, &c);
    compare(&on_device, &on_host, true, "host filtering vs sample_filtered");
    outcome_free(&on_device), outcome_free(&on_host);
    l.ops->destroy(m_old);
    free(tokens), free(cu);
    unload(&l);
}
END_TEST

START_TEST(test_refusals)
{
    loaded l = load_recipe(recipe_52, &glm5_2_model_ops, 5);
    int32_t lens[2] = {6, 3}, *tokens, *cu;
    dsarl_token_batch prompts = make_prompts(2, lens, 3, &tokens, &cu);
    dsarl_sampling_params sp = params(0.0f, 8, 1);
    // one block of 4 tokens cannot hold a 6-token prompt and 8 new tokens
    dsarl_generator *gen = NULL;
    ck_assert_int_eq(native_create(NULL, l.ops, l.model, &gen, &err), 0);
    native_paged_config c = paged(4);
    c.memory_bytes = 4 * l.ops->cache_token_bytes(l.model);
    native_set_paged(gen, c);
    dsarl_generation_result res;
    ck_assert_int_eq(native_generate(gen, &prompts, &sp, &res, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "kv_cache_memory_bytes"), "%s", err.message);
    c.memory_bytes = 3; // less than a block
    native_set_paged(gen, c);
    ck_assert_int_eq(native_generate(gen, &prompts, &sp, &res, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "less than one block"), "%s", err.message);
    native_destroy(gen);
    // the model's checks: block ids out of range, a table too short, a paged cache given to forward_cached
    dsarl_model_cache *cache = NULL;
    ck_assert_int_eq(l.ops->paged_cache_create(l.model, 4, 2, &cache, &err), 0);
    float *logits = malloc(2 * 260 * sizeof(float));
    int32_t table[4] = {0, 1, 2, 9}, ctx[1] = {0}, one_cu[2] = {0, 7}, slot = 0;
    dsarl_token_batch b1 = {.struct_size = sizeof(b1), .n_tokens = 7, .n_sequences = 1, .tokens = tokens,
                            .cu_seqlens = one_cu};
    dsarl_block_tables bt = {.struct_size = sizeof(bt), .blocks_per_sequence = 4, .tables = table,
                             .context_lens = ctx};
    ck_assert_int_eq(l.ops->forward_paged(l.model, cache, &b1, &bt, logits, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "maps block 3 to 9"), "%s", err.message);
    bt.blocks_per_sequence = 3;
    ck_assert_int_eq(l.ops->forward_paged(l.model, cache, &b1, &bt, logits, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "reaches 4 blocks"), "%s", err.message);
    ck_assert_int_eq(l.ops->forward_cached(l.model, cache, &b1, &slot, logits, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "paged cache"), "%s", err.message);
    ck_assert_int_eq(l.ops->cache_copy_block(cache, 1, 1, 1, &err), DSARL_E_INVALID);
    l.ops->cache_free(cache);
    ck_assert_int_eq(l.ops->paged_cache_create(l.model, 65536, 65536, &cache, &err), DSARL_E_INVALID);
    free(logits);
    free(tokens), free(cu);
    unload(&l);
}
END_TEST

// native_create from a recipe whose policy.generation section is generation_yaml (indented by four spaces).
static int create_from(const loaded *l, dsarl_model *model, const char *generation_yaml, dsarl_generator **gen)
{
    char text[512];
    snprintf(text, sizeof text, "policy:\n  generation:\n%s", generation_yaml);
    dsarl_recipe *r = NULL;
    ck_assert_msg(dsarl_recipe_load_string(text, "gen.yaml", &r, &err) == 0, "%s", err.message);
    ck_assert_msg(dsarl_recipe_resolve(r, &err) == 0, "%s", err.message);
    *gen = NULL;
    int rc = native_create(dsarl_recipe_root(r), l->ops, model, gen, &err);
    dsarl_recipe_free(r); // the engine copies what it reads
    return rc;
}

// floor(u * total - (total - free)) bytes in whole blocks, on values worked out by hand.
START_TEST(test_utilization_formula)
{
    int64_t blocks = -1;
    // u 0.5 of 1000 bytes with 200 in use: 300 bytes = 4 blocks of 64 (and 44 bytes left over)
    ck_assert_int_eq(native_arena_blocks_for_utilization(0.5, 800, 1000, 64, 16, 4, &blocks, &err), 0);
    ck_assert_int_eq(blocks, 4);
    // 0.3 x 1001 = 300.3 -> 300, minus 101 in use = 199 bytes = 3 blocks of 64
    ck_assert_int_eq(native_arena_blocks_for_utilization(0.3, 900, 1001, 64, 16, 1, &blocks, &err), 0);
    ck_assert_int_eq(blocks, 3);
    // the whole of a 1 TiB device with 2^39 - 12345 bytes in use: 2^39 + 12345 bytes = 2^27 + 3 blocks of 4096
    size_t tib = (size_t)1 << 40;
    ck_assert_int_eq(native_arena_blocks_for_utilization(1.0, tib / 2 + 12345, tib, 4096, 16, 1, &blocks, &err), 0);
    ck_assert_int_eq(blocks, ((int64_t)1 << 27) + 3);
    // GLM-5.2's cache row: 78 layers x (512 latent + 64 rope) bf16, the indexer's 128-wide key in 21 of them; blocks
    // of 64 tokens; an H200's 150,754,820,096 bytes with 45 GiB in use, u 0.9: 135,679,338,086 - 48,318,382,080 =
    // 87,360,956,006 bytes / (64 x 95,232) = 14,333 blocks
    int64_t row = (78 * (512 + 64) + 21 * 128) * 2;
    ck_assert_int_eq(row, 95232);
    size_t h200 = 150754820096ull, used = (size_t)45 << 30;
    ck_assert_int_eq(native_arena_blocks_for_utilization(0.9, h200 - used, h200, 64 * row, 64, 100, &blocks, &err), 0);
    ck_assert_int_eq(blocks, 14333);
    // free above total (a racy reading): nothing counts as in use
    ck_assert_int_eq(native_arena_blocks_for_utilization(0.5, 1200, 1000, 100, 16, 1, &blocks, &err), 0);
    ck_assert_int_eq(blocks, 5);
    // fewer blocks than one sequence needs: refused, naming the key and both counts
    ck_assert_int_eq(native_arena_blocks_for_utilization(0.5, 800, 1000, 64, 16, 5, &blocks, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "policy.generation.gpu_memory_utilization 0.5") &&
                  strstr(err.message, "4 blocks of 16 tokens, fewer than the 5 blocks"), "%s", err.message);
    // more in use than the share allows: no arena at all
    ck_assert_int_eq(native_arena_blocks_for_utilization(0.1, 500, 1000, 64, 16, 1, &blocks, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "leaves 0 bytes"), "%s", err.message);
    ck_assert_int_eq(blocks, 0);
    const double bad[4] = {0.0, 1.5, -1.0, NAN};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(native_arena_blocks_for_utilization(bad[i], 800, 1000, 64, 16, 1, &blocks, &err),
                         DSARL_E_INVALID);
        ck_assert_msg(strstr(err.message, "gpu_memory_utilization must be in (0, 1]"), "%s", err.message);
    }
}
END_TEST

// An engine with policy.generation.gpu_memory_utilization: the arena follows the formula from the cpu device's
// memory_info, and the completions are the unset engine's, token for token and log-prob for log-prob.
START_TEST(test_utilization_sizes_arena)
{
    loaded l = load_recipe(recipe_52, &glm5_2_model_ops, 61);
    enum { P = 2, G = 3 };
    int32_t base_lens[P] = {11, 6}, lens[P * G], *base_tok, *base_cu;
    dsarl_token_batch base = make_prompts(P, base_lens, 77, &base_tok, &base_cu);
    int32_t cu[P * G + 1] = {0}, *tokens = malloc((size_t)(G * 17) * sizeof(int32_t));
    for (int32_t b = 0; b < P * G; b++) { // GRPO's layout: each prompt's G samples one after another
        lens[b] = base_lens[b / G];
        memcpy(tokens + cu[b], base.tokens + base.cu_seqlens[b / G], (size_t)lens[b] * sizeof(int32_t));
        cu[b + 1] = cu[b] + lens[b];
    }
    dsarl_token_batch prompts = {.struct_size = sizeof(prompts), .n_tokens = cu[P * G], .n_sequences = P * G,
                                 .tokens = tokens, .cu_seqlens = cu};
    dsarl_sampling_params sp = params(0.9f, 9, 4242);
    sp.top_k = 50, sp.top_p = 0.95f;
    dsarl_generator *gen = NULL;
    ck_assert_msg(create_from(&l, l.model, "    block_size: 4\n", &gen) == 0, "%s", err.message);
    ck_assert(native_get_paged(gen).memory_utilization == 0.0);
    outcome want = collect(gen, &prompts, &sp);
    ck_assert_uint_eq(want.stats.memory_total, 0); // not read when the key is unset
    native_destroy(gen);
    // the share that leaves 128 MiB for the arena beside what the machine holds now
    size_t free0 = 0, total0 = 0;
    ck_assert_msg(dsarl_cpu_device_ops.memory_info(l.dev, &free0, &total0, &err) == 0, "%s", err.message);
    ck_assert(total0 > ((size_t)1 << 30) && free0 <= total0);
    double u = ((double)(total0 - free0) + (double)(128 << 20)) / (double)total0;
    char yaml[160];
    snprintf(yaml, sizeof yaml, "    block_size: 4\n    gpu_memory_utilization: %.17g\n", u);
    ck_assert_msg(create_from(&l, l.model, yaml, &gen) == 0, "%s", err.message);
    ck_assert(native_get_paged(gen).memory_utilization == u);
    outcome got = collect(gen, &prompts, &sp);
    const native_paged_stats *st = &got.stats;
    ck_assert_uint_eq(st->memory_total, total0);
    // the engine's reading a moment after the test's: the machine's other processes move it, not by 1 GiB
    ck_assert_msg(llabs((long long)st->memory_free - (long long)free0) < (1ll << 30), "memory_info said %zu bytes "
                  "free to the test, %zu to the engine", free0, st->memory_free);
    int64_t block_bytes = 4 * l.ops->cache_token_bytes(l.model);
    int64_t arena = (int64_t)floor(u * (double)st->memory_total) - (int64_t)(st->memory_total - st->memory_free);
    ck_assert_int_eq(st->blocks, arena / block_bytes);
    ck_assert_msg(st->blocks > 4 * want.stats.blocks, "%d blocks, the batch-sized arena %d", st->blocks,
                  want.stats.blocks);
    ck_assert_int_eq(st->preemptions, 0);
    compare(&want, &got, true, "gpu_memory_utilization vs unset");
    // the next call keeps the arena and the reading it was sized from
    outcome again = collect(gen, &prompts, &sp);
    ck_assert_int_eq(again.stats.blocks, st->blocks);
    ck_assert_uint_eq(again.stats.memory_free, st->memory_free);
    compare(&want, &again, true, "gpu_memory_utilization, second call");
    native_destroy(gen);
    outcome_free(&want), outcome_free(&got), outcome_free(&again);
    free(tokens), free(base_tok), free(base_cu);
    unload(&l);
}
END_TEST

START_TEST(test_utilization_refusals)
{
    loaded l = load_recipe(recipe_52, &glm5_2_model_ops, 67);
    dsarl_generator *gen = NULL;
    const char *bad[4] = {"0", "1.5", "-1", "half"};
    for (int i = 0; i < 4; i++) {
        char yaml[96];
        snprintf(yaml, sizeof yaml, "    gpu_memory_utilization: %s\n", bad[i]);
        ck_assert_int_eq(create_from(&l, l.model, yaml, &gen), DSARL_E_INVALID);
        ck_assert_ptr_null(gen);
        ck_assert_msg(strstr(err.message, "policy.generation.gpu_memory_utilization"), "%s", err.message);
        ck_assert_msg(strstr(err.message, i < 3 ? "must be in (0, 1]" : "must be a number"), "%s", err.message);
    }
    ck_assert_msg(create_from(&l, l.model, "    gpu_memory_utilization: null\n", &gen) == 0, "%s", err.message);
    ck_assert(native_get_paged(gen).memory_utilization == 0.0); // null: unset
    native_destroy(gen);
    int32_t lens[2] = {6, 3}, *tokens, *cu;
    dsarl_token_batch prompts = make_prompts(2, lens, 13, &tokens, &cu);
    dsarl_sampling_params sp = params(0.0f, 5, 1);
    dsarl_generation_result res;
    // a share below what the machine uses already leaves no arena: one sentence naming the key
    ck_assert_int_eq(native_create(NULL, l.ops, l.model, &gen, &err), 0);
    native_paged_config c = paged(4);
    c.memory_utilization = 1e-9;
    native_set_paged(gen, c);
    ck_assert_int_eq(native_generate(gen, &prompts, &sp, &res, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "gpu_memory_utilization 1e-09 leaves 0 bytes") &&
                  strstr(err.message, "fewer than the 3 blocks one sequence"), "%s", err.message);
    // kv_cache_memory_bytes wins over it (vLLM's rule): the device memory is not even read
    c.memory_bytes = 64 * 4 * l.ops->cache_token_bytes(l.model);
    native_set_paged(gen, c);
    ck_assert_msg(native_generate(gen, &prompts, &sp, &res, &err) == 0, "%s", err.message);
    ck_assert_int_eq(native_paged_last_stats(gen)->blocks, 64);
    ck_assert_uint_eq(native_paged_last_stats(gen)->memory_total, 0);
    native_destroy(gen);
    // a device without memory_info (older than ABI 1.7): refused at create from a recipe, and at generate when set
    dsarl_device_ops old = dsarl_cpu_device_ops;
    old.memory_info = NULL;
    ck_assert_ptr_null(DSARL_DEVICE_SLOT(&old, memory_info));
    dsarl_model *m_old = NULL;
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(l.recipe), .device_ops = &old,
                             .device = l.dev, .dsa_ops = &dsarl_dsa_reference_ops, .dsa = l.dsa, .seed = 67};
    ck_assert_msg(l.ops->create(&mc, &m_old, &err) == 0, "%s", err.message);
    ck_assert_int_eq(create_from(&l, m_old, "    gpu_memory_utilization: 0.5\n", &gen), DSARL_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.message, "policy.generation.gpu_memory_utilization") &&
                  strstr(err.message, "memory_info") && strstr(err.message, "\"cpu\""), "%s", err.message);
    ck_assert_int_eq(native_create(NULL, l.ops, m_old, &gen, &err), 0);
    c.memory_bytes = 0, c.memory_utilization = 0.5;
    native_set_paged(gen, c);
    ck_assert_int_eq(native_generate(gen, &prompts, &sp, &res, &err), DSARL_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.message, "gpu_memory_utilization needs the device's memory_info"), "%s", err.message);
    native_destroy(gen);
    l.ops->destroy(m_old);
    free(tokens), free(cu);
    unload(&l);
}
END_TEST

static Suite *paged_suite(void)
{
    Suite *s = suite_create("generation_paged");
    TCase *tc = tcase_create("paged");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_paged_equals_contiguous);
    tcase_add_test(tc, test_prefix_sharing_one_prefill);
    tcase_add_test(tc, test_preemption_recompute);
    tcase_add_test(tc, test_continuous_batching_order);
    tcase_add_test(tc, test_device_sampler_matches_host);
    tcase_add_test(tc, test_host_sampling_fallback);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_utilization_formula);
    tcase_add_test(tc, test_utilization_sizes_arena);
    tcase_add_test(tc, test_utilization_refusals);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(paged_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
