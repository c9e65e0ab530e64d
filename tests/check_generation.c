/* check_generation.c: the native generation engine against independent formulations.
 *
 *   cache      forward_cached (prefill of ragged prompts, then one-token decodes) against a no-cache forward_logits
 *              of the whole sequences, on the transformers fixtures (glm5.1, glm5.2 IndexShare, grouped routing
 *              bf16) and on random recipe-defined models, every sequence longer than index_topk so decode selects
 *              a sparse top-k over the cache; and the engine's greedy tokens and log-probs against the same
 *              recompute.
 *   hf         greedy tokens equal transformers' greedy generate (fixtures' generate.json).
 *   logprobs   sampled tokens' log-probs equal the log-softmax of the no-cache, temperature-scaled (and top-k /
 *              top-p filtered, by a naive double-precision filter written here) logits: token_mult_prob_error
 *              = mean exp(|lp_gen - lp_train|) is 1 within 1e-5.
 *   sampling   temperature / top-k / top-p frequencies against hand-derived probabilities; tie rules.
 *   control    stop token ids, tokenizer EOS, stop strings, max_new_tokens truncation flags, ragged batches equal
 *              their sequences generated alone, determinism given the seed, argument refusals. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_device.h"
#include "dsa_reference.h"
#include "dsarl/json.h"
#include "dsarl/rng.h"
#include "generation_recipes.h"
#include "glm5_ops.h"
#include "native_generator.h"
#include "native_sampling.h"
#include "recipe_internal.h"

#define FIXTURES DSARL_SOURCE_DIR "/tests/fixtures/glm5/"

static dsarl_device *dev;
static dsarl_dsa_context *dsa;
static dsarl_error err;

static void setup(void)
{
    dsarl_device_config cfg = {.struct_size = sizeof(cfg), .threads = 1};
    ck_assert_int_eq(cpu_create(&cfg, &dev, &err), 0);
    ck_assert_int_eq(dsarl_dsa_reference_ops.create(&dsarl_cpu_device_ops, dev, NULL, &dsa, &err), 0);
}

static void teardown(void)
{
    dsarl_dsa_reference_ops.destroy(dsa);
    cpu_destroy(dev);
}

typedef struct loaded {
    const dsarl_model_ops *ops;
    dsarl_model *m;
    dsarl_recipe *recipe;
} loaded;

static loaded load_fixture(const char *name)
{
    char dir[512];
    snprintf(dir, sizeof dir, FIXTURES "%s", name);
    loaded l = {.ops = strstr(name, "5.1") ? &glm5_1_model_ops : &glm5_2_model_ops};
    dsarl_model_config mc = {.struct_size = sizeof(mc), .model_dir = dir, .device_ops = &dsarl_cpu_device_ops,
                             .device = dev, .dsa_ops = &dsarl_dsa_reference_ops, .dsa = dsa};
    ck_assert_msg(l.ops->create(&mc, &l.m, &err) == 0, "load %s: %s", dir, err.message);
    return l;
}

static loaded load_recipe(const char *text, const dsarl_model_ops *ops, uint64_t seed)
{
    loaded l = {.ops = ops};
    ck_assert_int_eq(dsarl_recipe_load_string(text, "gen.yaml", &l.recipe, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(l.recipe, &err), 0);
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(l.recipe),
                             .device_ops = &dsarl_cpu_device_ops, .device = dev, .dsa_ops = &dsarl_dsa_reference_ops,
                             .dsa = dsa, .seed = seed};
    ck_assert_msg(ops->create(&mc, &l.m, &err) == 0, "%s", err.message);
    return l;
}

static void unload(loaded *l)
{
    l->ops->destroy(l->m);
    dsarl_recipe_free(l->recipe);
}

// Random prompts of the given lengths (ids in [1, V)), packed.
static dsarl_token_batch make_prompts(int32_t B, const int32_t *lens, int64_t V, uint32_t seed, int32_t **tokens,
                                      int32_t **cu)
{
    *cu = malloc((size_t)(B + 1) * sizeof(int32_t));
    (*cu)[0] = 0;
    for (int32_t b = 0; b < B; b++)
        (*cu)[b + 1] = (*cu)[b] + lens[b];
    *tokens = malloc((size_t)(*cu)[B] * sizeof(int32_t));
    dsarl_rng rng;
    dsarl_rng_init(&rng, seed, 0);
    for (int32_t t = 0; t < (*cu)[B]; t++)
        (*tokens)[t] = 1 + (int32_t)dsarl_rng_below(&rng, (uint32_t)(V - 1));
    return (dsarl_token_batch){.struct_size = sizeof(dsarl_token_batch), .n_tokens = (*cu)[B], .n_sequences = B,
                               .tokens = *tokens, .cu_seqlens = *cu};
}

// No-cache logits (P + n, V) of prompt b followed by completion (n tokens).
static float *recompute_logits(const loaded *l, const dsarl_token_batch *prompts, int32_t b, const int32_t *compl,
                               int32_t n)
{
    int32_t P = prompts->cu_seqlens[b + 1] - prompts->cu_seqlens[b], T = P + n, cu[2] = {0, T};
    int64_t V = l->ops->vocab_size(l->m);
    int32_t *seq = malloc((size_t)T * sizeof(int32_t));
    memcpy(seq, prompts->tokens + prompts->cu_seqlens[b], (size_t)P * sizeof(int32_t));
    memcpy(seq + P, compl, (size_t)n * sizeof(int32_t));
    float *logits = malloc((size_t)T * (size_t)V * sizeof(float));
    dsarl_token_batch one = {.struct_size = sizeof(one), .n_tokens = T, .n_sequences = 1, .tokens = seq,
                             .cu_seqlens = cu};
    ck_assert_msg(l->ops->forward_logits(l->m, &one, logits, &err) == 0, "%s", err.message);
    free(seq);
    return logits;
}

// Naive sampling distribution in double: scale, keep ids >= k-th largest, then top-p over descending ranks.
static void reference_logprobs(const float *raw, int64_t V, float temperature, int32_t top_k, float top_p,
                               double *out)
{
    double *x = malloc((size_t)V * sizeof(double));
    for (int64_t v = 0; v < V; v++)
        x[v] = temperature > 0 ? (double)(raw[v] / temperature) : raw[v]; // float division, as the engine scales
    int *keep = malloc((size_t)V * sizeof(int));
    for (int64_t v = 0; v < V; v++) {
        int64_t above = 0; // ids ranked strictly before v (larger, or equal with a lower id)
        for (int64_t u = 0; u < V; u++)
            above += x[u] > x[v] || (x[u] == x[v] && u < v);
        int64_t larger = 0;
        for (int64_t u = 0; u < V; u++)
            larger += x[u] > x[v];
        keep[v] = temperature <= 0 || top_k <= 0 || top_k >= V || larger < top_k;
        (void)above;
    }
    if (temperature > 0 && top_p < 1.0f) {
        double z = 0, mx = -INFINITY;
        for (int64_t v = 0; v < V; v++)
            if (keep[v] && x[v] > mx)
                mx = x[v];
        for (int64_t v = 0; v < V; v++)
            z += keep[v] ? exp(x[v] - mx) : 0;
        int *keep_p = malloc((size_t)V * sizeof(int));
        for (int64_t v = 0; v < V; v++) {
            double mass_above = 0;
            int first = 1;
            for (int64_t u = 0; u < V; u++)
                if (keep[u] && (x[u] > x[v] || (x[u] == x[v] && u < v)))
                    mass_above += exp(x[u] - mx) / z, first = 0;
            keep_p[v] = keep[v] && (first || mass_above < top_p);
        }
        memcpy(keep, keep_p, (size_t)V * sizeof(int));
        free(keep_p);
    }
    double mx = -INFINITY, z = 0;
    for (int64_t v = 0; v < V; v++)
        if (keep[v] && x[v] > mx)
            mx = x[v];
    for (int64_t v = 0; v < V; v++)
        z += keep[v] ? exp(x[v] - mx) : 0;
    for (int64_t v = 0; v < V; v++)
        out[v] = keep[v] ? x[v] - mx - log(z) : -INFINITY;
    free(x), free(keep);
}

static int32_t argmax(const float *row, int64_t V)
{
    int32_t best = 0;
    for (int32_t v = 1; v < V; v++)
        best = row[v] > row[best] ? v : best;
    return best;
}

typedef struct compare_stats {
    double max_rel_logprob, mult_prob_error_sum;
    int64_t n_tokens, n_bit_identical;
} compare_stats;

// Generates for prompts and checks every completion token against the no-cache recompute: greedy tokens are the
// recompute's argmax, log-probs its (processed) log-softmax; sampled tokens lie in the kept set.
static compare_stats generate_and_compare(const loaded *l, const dsarl_token_batch *prompts,
                                          const dsarl_sampling_params *sp, dsarl_generation_result *res_out)
{
    dsarl_generator *gen = NULL;
    ck_assert_msg(native_create(NULL, l->ops, l->m, &gen, &err) == 0, "%s", err.message);
    dsarl_generation_result res;
    ck_assert_msg(native_generate(gen, prompts, sp, &res, &err) == 0, "%s", err.message);
    int64_t V = l->ops->vocab_size(l->m);
    double *ref = malloc((size_t)V * sizeof(double));
    compare_stats st = {0};
    for (int32_t b = 0; b < res.n_sequences; b++) {
        int32_t n = res.cu_lengths[b + 1] - res.cu_lengths[b], P = prompts->cu_seqlens[b + 1] - prompts->cu_seqlens[b];
        const int32_t *compl = res.tokens + res.cu_lengths[b];
        const float *lp = res.logprobs + res.cu_lengths[b];
        float *logits = recompute_logits(l, prompts, b, compl, n);
        for (int32_t j = 0; j < n; j++) {
            const float *row = logits + (int64_t)(P - 1 + j) * V;
            if (sp->temperature <= 0)
                ck_assert_msg(compl[j] == argmax(row, V), "sequence %d step %d: greedy token %d, recompute argmax %d",
                              b, j, compl[j], argmax(row, V));
            reference_logprobs(row, V, sp->temperature, sp->top_k, sp->top_p, ref);
            ck_assert_msg(isfinite(ref[compl[j]]), "sequence %d step %d: token %d is outside the kept set", b, j,
                          compl[j]);
            double diff = fabs((double)lp[j] - ref[compl[j]]);
            // relative to |log p|, absolute below |log p| = 1 (a log-prob near 0 has no relative scale); a
            // temperature below 1 magnifies the logits' rounding by 1 / temperature, so the bound scales with it
            double scale = fmax(1.0, fabs(ref[compl[j]])) / fmin(1.0, sp->temperature > 0 ? sp->temperature : 1.0);
            st.max_rel_logprob = fmax(st.max_rel_logprob, diff / scale);
            if (getenv("GEN_DEBUG"))
                fprintf(stderr, "b%d j%d lp %.9g ref %.9g\n", b, j, lp[j], ref[compl[j]]);
            st.mult_prob_error_sum += exp(diff);
            st.n_bit_identical += (float)ref[compl[j]] == lp[j];
            st.n_tokens++;
        }
        free(logits);
    }
    free(ref);
    if (res_out) { // a copy that outlives the generator
        int32_t total = res.cu_lengths[res.n_sequences];
        int32_t *cu = malloc((size_t)(res.n_sequences + 1) * sizeof(int32_t)), *tok = malloc((size_t)total * 4 + 4);
        float *lps = malloc((size_t)total * 4 + 4);
        uint8_t *tr = malloc((size_t)res.n_sequences);
        memcpy(cu, res.cu_lengths, (size_t)(res.n_sequences + 1) * 4);
        memcpy(tok, res.tokens, (size_t)total * 4);
        memcpy(lps, res.logprobs, (size_t)total * 4);
        memcpy(tr, res.truncated, (size_t)res.n_sequences);
        *res_out = (dsarl_generation_result){.struct_size = sizeof(res), .n_sequences = res.n_sequences,
                                             .cu_lengths = cu, .tokens = tok, .logprobs = lps, .truncated = tr};
    }
    native_destroy(gen);
    return st;
}

static void free_result(dsarl_generation_result *r)
{
    free((void *)r->cu_lengths), free((void *)r->tokens), free((void *)r->logprobs), free((void *)r->truncated);
}

static dsarl_sampling_params params(float temperature, int32_t max_new, uint64_t seed)
{
    return (dsarl_sampling_params){.struct_size = sizeof(dsarl_sampling_params), .temperature = temperature,
                                   .top_p = 1.0f, .top_k = 0, .max_new_tokens = max_new, .seed = seed};
}

// forward_cached logits (prefill of ragged prompts, then decodes of fixed tokens) against forward_logits.
static void check_cached_logits(const loaded *l, uint32_t seed)
{
    int32_t lens[3] = {6, 2, 9}, B = 3, steps = 10;
    int64_t V = l->ops->vocab_size(l->m);
    int32_t *tokens, *cu;
    dsarl_token_batch prompts = make_prompts(B, lens, V, seed, &tokens, &cu);
    dsarl_model_cache *cache = NULL;
    ck_assert_msg(l->ops->cache_create(l->m, B, 9 + steps, &cache, &err) == 0, "%s", err.message);
    float *cached = malloc((size_t)(B * (steps + 1)) * (size_t)V * sizeof(float)), *out = cached;
    int32_t slots[3] = {2, 0, 1}; // slots need not follow batch order
    ck_assert_msg(l->ops->forward_cached(l->m, cache, &prompts, slots, out, &err) == 0, "%s", err.message);
    int32_t compl[3][10], dcu[4] = {0, 1, 2, 3};
    dsarl_rng rng;
    dsarl_rng_init(&rng, seed, 99);
    for (int32_t s = 0; s < steps; s++) {
        int32_t next[3];
        for (int32_t b = 0; b < B; b++)
            next[b] = compl[b][s] = 1 + (int32_t)dsarl_rng_below(&rng, (uint32_t)(V - 1));
        dsarl_token_batch one = {.struct_size = sizeof(one), .n_tokens = B, .n_sequences = B, .tokens = next,
                                 .cu_seqlens = dcu};
        out += B * V;
        ck_assert_msg(l->ops->forward_cached(l->m, cache, &one, slots, out, &err) == 0, "%s", err.message);
    }
    for (int32_t b = 0; b < B; b++)
        ck_assert_int_eq(l->ops->cache_length(cache, slots[b]), lens[b] + steps);
    double max_err = 0, max_ref = 0;
    int64_t same = 0, total = 0;
    for (int32_t b = 0; b < B; b++) {
        float *ref = recompute_logits(l, &prompts, b, compl[b], steps);
        for (int32_t s = 0; s <= steps; s++) {
            const float *want = ref + (int64_t)(lens[b] - 1 + s) * V, *got = cached + (int64_t)(s * B + b) * V;
            for (int64_t v = 0; v < V; v++) {
                max_err = fmax(max_err, fabs((double)got[v] - want[v]));
                max_ref = fmax(max_ref, fabs((double)want[v]));
                same += got[v] == want[v], total++;
            }
        }
        free(ref);
    }
    ck_assert_msg(max_ref > 0.05, "reference logits are degenerate (max %g)", max_ref);
    ck_assert_msg(max_err <= 1e-5 * max_ref, "cached logits differ from the no-cache forward: max abs %g (max %g)",
                  max_err, max_ref);
    fprintf(stderr, "cached vs no-cache logits: %lld of %lld bit-identical, max abs diff %.3g (max |logit| %.3g)\n",
            (long long)same, (long long)total, max_err, max_ref);
    l->ops->cache_free(cache);
    free(cached), free(tokens), free(cu);
}

START_TEST(test_cached_logits_fixtures)
{
    const char *names[] = {"glm5.1-tiny", "glm5.2-tiny", "glm5-groups-bf16"};
    for (int i = 0; i < 3; i++) {
        loaded l = load_fixture(names[i]);
        check_cached_logits(&l, 7u + (uint32_t)i);
        unload(&l);
    }
}
END_TEST

START_TEST(test_cached_logits_recipe_models)
{
    loaded a = load_recipe(recipe_52, &glm5_2_model_ops, 5);
    check_cached_logits(&a, 21);
    unload(&a);
    loaded b = load_recipe(recipe_51, &glm5_1_model_ops, 6);
    check_cached_logits(&b, 22);
    unload(&b);
    // DSA dense warm-up: every cached key attended (the top-k widens with the cache, as it does with the batch)
    size_t n = strlen(recipe_52) + 128;
    char *dense = malloc(n);
    snprintf(dense, n, "%s  megatron_cfg:\n    model_overrides:\n      dsa_dense_attention: true\n", recipe_52);
    loaded c = load_recipe(dense, &glm5_2_model_ops, 7);
    ck_assert(c.m->dense_attention);
    check_cached_logits(&c, 23);
    unload(&c);
    free(dense);
}
END_TEST

// Greedy engine runs on ragged prompts: tokens = recompute argmax, log-probs = recompute log-softmax.
START_TEST(test_greedy_matches_recompute)
{
    const char *names[] = {"glm5.1-tiny", "glm5.2-tiny", "glm5-groups-bf16", NULL, NULL};
    for (int i = 0; i < 5; i++) {
        loaded l = names[i] ? load_fixture(names[i])
                            : load_recipe(i == 3 ? recipe_52 : recipe_51, i == 3 ? &glm5_2_model_ops
                                                                                 : &glm5_1_model_ops, 40 + i);
        int32_t lens[4] = {7, 3, 5, 1}, *tokens, *cu;
        dsarl_token_batch prompts = make_prompts(4, lens, l.ops->vocab_size(l.m), 30u + (uint32_t)i, &tokens, &cu);
        dsarl_sampling_params sp = params(0.0f, 12, 1);
        dsarl_generation_result res;
        compare_stats st = generate_and_compare(&l, &prompts, &sp, &res);
        ck_assert_int_eq(st.n_tokens, 4 * 12);
        for (int32_t b = 0; b < 4; b++)
            ck_assert_int_eq(res.truncated[b], 1);
        ck_assert_msg(st.max_rel_logprob <= 1e-5, "model %d: greedy log-probs differ from the recompute by %g "
                      "(relative)", i, st.max_rel_logprob);
        fprintf(stderr, "greedy model %d: %lld of %lld log-probs bit-identical, max rel %.3g\n", i,
                (long long)st.n_bit_identical, (long long)st.n_tokens, st.max_rel_logprob);
        free_result(&res), free(tokens), free(cu);
        unload(&l);
    }
}
END_TEST

START_TEST(test_greedy_matches_transformers)
{
    const char *names[] = {"glm5.1-tiny", "glm5.2-tiny", "glm5-groups-bf16"};
    for (int i = 0; i < 3; i++) {
        loaded l = load_fixture(names[i]);
        char path[600];
        snprintf(path, sizeof path, FIXTURES "%s/generate.json", names[i]);
        json_t *g = NULL;
        ck_assert_int_eq(dsarl_json_load_file(path, &g, &err), 0);
        json_t *prompt = json_object_get(g, "prompt"), *want = json_object_get(g, "tokens");
        int32_t P = (int32_t)json_array_size(prompt), N = (int32_t)json_array_size(want), cu[2] = {0, P};
        int32_t *ids = malloc((size_t)P * sizeof(int32_t));
        for (int32_t t = 0; t < P; t++)
            ids[t] = (int32_t)json_integer_value(json_array_get(prompt, (size_t)t));
        ck_assert_int_eq(json_integer_value(json_object_get(g, "max_new_tokens")), N);
        dsarl_token_batch prompts = {.struct_size = sizeof(prompts), .n_tokens = P, .n_sequences = 1, .tokens = ids,
                                     .cu_seqlens = cu};
        dsarl_generator *gen = NULL;
        ck_assert_int_eq(native_create(NULL, l.ops, l.m, &gen, &err), 0);
        dsarl_sampling_params sp = params(0.0f, N, 0);
        dsarl_generation_result res;
        ck_assert_msg(native_generate(gen, &prompts, &sp, &res, &err) == 0, "%s", err.message);
        ck_assert_int_eq(res.cu_lengths[1], N);
        ck_assert(P + N > l.m->cfg.index_topk); // decode runs with the sparse top-k active
        for (int32_t j = 0; j < N; j++)
            ck_assert_msg(res.tokens[j] == json_integer_value(json_array_get(want, (size_t)j)),
                          "%s: step %d gave %d, transformers %lld", names[i], j, res.tokens[j],
                          (long long)json_integer_value(json_array_get(want, (size_t)j)));
        native_destroy(gen);
        json_decref(g);
        free(ids);
        unload(&l);
    }
}
END_TEST

// Sampled log-probs against the training forward's log-softmax of the same scaled/filtered logits.
START_TEST(test_sampled_logprobs_match_training)
{
    struct { float temperature, top_p; int32_t top_k; } cases[] = {{1.0f, 1.0f, 0}, {0.7f, 1.0f, -1},
                                                                    {1.3f, 0.9f, 0}, {0.8f, 1.0f, 20},
                                                                    {1.0f, 0.8f, 40}};
    loaded l = load_recipe(recipe_52, &glm5_2_model_ops, 9);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int32_t lens[3] = {4, 8, 2}, *tokens, *cu;
        dsarl_token_batch prompts = make_prompts(3, lens, 260, 50u + (uint32_t)c, &tokens, &cu);
        dsarl_sampling_params sp = params(cases[c].temperature, 14, 1000 + c);
        sp.top_p = cases[c].top_p, sp.top_k = cases[c].top_k;
        compare_stats st = generate_and_compare(&l, &prompts, &sp, NULL);
        double mult = st.mult_prob_error_sum / (double)st.n_tokens;
        ck_assert_msg(fabs(mult - 1.0) <= 1e-5, "case %zu: token_mult_prob_error %.9f", c, mult);
        ck_assert_msg(st.max_rel_logprob <= 1e-5, "case %zu: log-probs differ by %g relative", c,
                      st.max_rel_logprob);
        free(tokens), free(cu);
    }
    unload(&l);
}
END_TEST

// Draws n tokens from one processed row with the engine's streams; returns counts (V).
static void draw_counts(const float *raw, int64_t V, float temperature, int32_t top_k, float top_p, int32_t n,
                        int64_t *counts)
{
    float *row = malloc((size_t)V * sizeof(float));
    int32_t *order = malloc((size_t)V * sizeof(int32_t)), *scratch = malloc((size_t)V * sizeof(int32_t));
    memcpy(row, raw, (size_t)V * sizeof(float));
    native_process_logits(row, V, temperature, top_k, top_p, order, scratch);
    memset(counts, 0, (size_t)V * sizeof(int64_t));
    for (int32_t i = 0; i < n; i++) {
        int32_t tok;
        ck_assert_int_eq(dsarl_cpu_device_ops.sample_tokens(dev, &tok, row, 1, V, 1.0f, 77,
                                                            native_sample_stream(i % 97, i / 97), &err), 0);
        counts[tok]++;
    }
    free(row), free(order), free(scratch);
}

// Frequencies within 4.5 standard deviations of the hand-derived probabilities (0 where excluded).
static void check_counts(const int64_t *counts, const double *p, int64_t V, int32_t n, const char *what)
{
    for (int64_t v = 0; v < V; v++) {
        double sd = sqrt(n * p[v] * (1 - p[v])) + 1e-9;
        ck_assert_msg(fabs((double)counts[v] - n * p[v]) <= 4.5 * sd + (p[v] == 0 ? 0 : 1),
                      "%s: id %lld drawn %lld times of %d, expected %.1f", what, (long long)v, (long long)counts[v], n,
                      n * p[v]);
    }
}

START_TEST(test_sampling_frequencies)
{
    enum { V = 6, N = 40000 };
    const double p0[V] = {0.05, 0.4, 0.1, 0.25, 0.15, 0.05}; // ids ranked 1, 3, 4, 2, then 0 and 5 tied
    float raw[V];
    for (int v = 0; v < V; v++)
        raw[v] = (float)log(p0[v]) + 1.5f;
    int64_t counts[V];
    // temperature 1: the distribution itself
    draw_counts(raw, V, 1.0f, 0, 1.0f, N, counts);
    check_counts(counts, p0, V, N, "temperature 1");
    // temperature 2: p^(1/2) renormalised
    double p[V], z = 0;
    for (int v = 0; v < V; v++)
        z += sqrt(p0[v]);
    for (int v = 0; v < V; v++)
        p[v] = sqrt(p0[v]) / z;
    draw_counts(raw, V, 2.0f, 0, 1.0f, N, counts);
    check_counts(counts, p, V, N, "temperature 2");
    // top-k 3: {0.4, 0.25, 0.15} / 0.8
    const double pk[V] = {0, 0.5, 0, 0.3125, 0.1875, 0};
    draw_counts(raw, V, 1.0f, 3, 1.0f, N, counts);
    check_counts(counts, pk, V, N, "top_k 3");
    // top-p 0.6: 0.4 (mass above 0) and 0.25 (above 0.4 < 0.6) stay; 0.15 has 0.65 above it and goes
    const double pp[V] = {0, 0.4 / 0.65, 0, 0.25 / 0.65, 0, 0};
    draw_counts(raw, V, 1.0f, 0, 0.6f, N, counts);
    check_counts(counts, pp, V, N, "top_p 0.6");
    // top-k 4 then top-p 0.9 of the renormalised {0.4, 0.25, 0.15, 0.1}/0.9: above 0.1 is 0.8/0.9 = 0.889 < 0.9
    const double pkp[V] = {0, 0.4 / 0.9, 0.1 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0};
    draw_counts(raw, V, 1.0f, 4, 0.9f, N, counts);
    check_counts(counts, pkp, V, N, "top_k 4 + top_p 0.9");
    // greedy: always the argmax
    draw_counts(raw, V, 0.0f, 0, 1.0f, 50, counts);
    int32_t tok;
    ck_assert_int_eq(dsarl_cpu_device_ops.sample_tokens(dev, &tok, raw, 1, V, 0.0f, 1, 2, &err), 0);
    ck_assert_int_eq(tok, 1);
}
END_TEST

START_TEST(test_filter_ties)
{
    int32_t order[5], scratch[5];
    float row[5] = {1.0f, 2.0f, 2.0f, 0.5f, 2.0f};
    native_process_logits(row, 5, 1.0f, 2, 1.0f, order, scratch); // ties at the k-th value all stay (vLLM)
    ck_assert(row[1] == 2.0f && row[2] == 2.0f && row[4] == 2.0f);
    ck_assert(isinf(row[0]) && row[0] < 0 && isinf(row[3]));
    float row2[4] = {3.0f, 3.0f, 3.0f, 3.0f}; // uniform: top-p 0.5 keeps the first two ranks (lowest ids)
    native_process_logits(row2, 4, 1.0f, 0, 0.5f, order, scratch);
    ck_assert(row2[0] == 3.0f && row2[1] == 3.0f && isinf(row2[2]) && isinf(row2[3]));
    float row3[3] = {0.5f, -1.0f, 2.0f}; // temperature divides exactly as float division
    native_process_logits(row3, 3, 0.25f, 0, 1.0f, order, scratch);
    ck_assert(row3[0] == 2.0f && row3[1] == -4.0f && row3[2] == 8.0f);
}
END_TEST

// Runs the engine and returns a copy of the result (generator destroyed).
static dsarl_generation_result run(const loaded *l, const dsarl_token_batch *prompts, const dsarl_sampling_params *sp)
{
    dsarl_generation_result res;
    generate_and_compare(l, prompts, sp, &res);
    return res;
}

START_TEST(test_stop_ids_eos_and_truncation)
{
    loaded l = load_recipe(recipe_52, &glm5_2_model_ops, 12);
    int32_t lens[4] = {3, 6, 1, 4}, *tokens, *cu;
    dsarl_token_batch prompts = make_prompts(4, lens, 260, 61, &tokens, &cu);
    dsarl_sampling_params sp = params(1.0f, 10, 5);
    dsarl_generation_result free_run = run(&l, &prompts, &sp);
    for (int32_t b = 0; b < 4; b++) { // nothing stops it: every sequence runs to max_new_tokens, truncated
        ck_assert_int_eq(free_run.cu_lengths[b + 1] - free_run.cu_lengths[b], 10);
        ck_assert_int_eq(free_run.truncated[b], 1);
    }
    // the 4th token of sequence 1 (first occurrence picked) as a stop id: sequences stop at its first occurrence
    const int32_t *s1 = free_run.tokens + free_run.cu_lengths[1];
    int32_t j = 3;
    while (j < 9) {
        int seen = 0;
        for (int32_t i = 0; i < j; i++)
            seen |= s1[i] == s1[j];
        if (!seen)
            break;
        j++;
    }
    int32_t stop_id = s1[j];
    sp.stop_token_ids = &stop_id, sp.n_stop_token_ids = 1;
    dsarl_generation_result stopped = run(&l, &prompts, &sp);
    for (int32_t b = 0; b < 4; b++) {
        const int32_t *full = free_run.tokens + free_run.cu_lengths[b], *got = stopped.tokens + stopped.cu_lengths[b];
        int32_t first = -1;
        for (int32_t i = 0; i < 10 && first < 0; i++)
            first = full[i] == stop_id ? i : -1;
        int32_t want_len = first >= 0 ? first + 1 : 10, n = stopped.cu_lengths[b + 1] - stopped.cu_lengths[b];
        ck_assert_int_eq(n, want_len);
        ck_assert_int_eq(stopped.truncated[b], first < 0);
        // same draws up to the stop (streams per sequence and step), and the same log-probs to float32 rounding: a
        // sequence's row sits at another place of a smaller batch once others stopped, and some BLAS kernels round
        // a row by its place (OpenBLAS's Haswell kernels, which it also picks on AMD Zen 4: about 1e-6 relative)
        for (int32_t i = 0; i < n; i++) {
            ck_assert_int_eq(got[i], full[i]);
            ck_assert(fabsf(stopped.logprobs[stopped.cu_lengths[b] + i] - free_run.logprobs[free_run.cu_lengths[b] +
                            i]) <= 1e-5f * fabsf(free_run.logprobs[free_run.cu_lengths[b] + i]) + 1e-6f);
        }
    }
    ck_assert_int_eq(stopped.cu_lengths[2] - stopped.cu_lengths[1], j + 1);
    free_result(&stopped);
    // with a tokenizer, sequences also end at its EOS (257) where the free run drew it (test_tokenizer_eos_stops
    // forces one)
    dsarl_tokenizer *tok = NULL;
    ck_assert_int_eq(dsarl_tokenizer_load("byte", &tok, &err), 0);
    sp.stop_token_ids = NULL, sp.n_stop_token_ids = 0, sp.tokenizer = tok;
    dsarl_generation_result with_tok = run(&l, &prompts, &sp);
    for (int32_t b = 0; b < 4; b++) {
        const int32_t *full = free_run.tokens + free_run.cu_lengths[b];
        int32_t first = -1;
        for (int32_t i = 0; i < 10 && first < 0; i++)
            first = full[i] == DSARL_BYTE_TOKENIZER_EOS ? i : -1;
        ck_assert_int_eq(with_tok.cu_lengths[b + 1] - with_tok.cu_lengths[b], first >= 0 ? first + 1 : 10);
    }
    free_result(&with_tok);
    dsarl_tokenizer_free(tok);
    free_result(&free_run), free(tokens), free(cu);
    unload(&l);
}
END_TEST

// The tokenizer's EOS ends a sequence with no stop ids given: the LM head row of EOS becomes 1.5x the row of the
// token greedy picked at a fresh step j of sequence 0, so EOS wins there (or earlier) and the sequence stops on it.
START_TEST(test_tokenizer_eos_stops)
{
    loaded l = load_recipe(recipe_52, &glm5_2_model_ops, 13);
    int64_t idx = -1;
    for (int64_t i = 0; i < l.ops->parameter_tensors(l.m); i++) {
        const char *name;
        ck_assert_int_eq(l.ops->parameter_info(l.m, i, &name, NULL, NULL, NULL, &err), 0);
        if (!strcmp(name, "lm_head.weight"))
            idx = i;
    }
    ck_assert(idx >= 0);
    int64_t C = l.m->cfg.hidden_size;
    float *w = malloc((size_t)(260 * C) * sizeof(float));
    ck_assert_int_eq(l.ops->read_parameter(l.m, idx, w, NULL, &err), 0);
    int32_t lens[2] = {5, 3}, *tokens, *cu;
    dsarl_token_batch prompts = make_prompts(2, lens, 260, 71, &tokens, &cu);
    dsarl_tokenizer *tok = NULL;
    ck_assert_int_eq(dsarl_tokenizer_load("byte", &tok, &err), 0);
    dsarl_sampling_params sp = params(0.0f, 8, 0);
    dsarl_generation_result before = run(&l, &prompts, &sp);
    for (int32_t b = 0; b < 2; b++)
        ck_assert_int_eq(before.truncated[b], 1);
    int32_t j = 1; // the first step whose greedy token did not appear before
    while (j < 7) {
        int seen = 0;
        for (int32_t i = 0; i < j; i++)
            seen |= before.tokens[i] == before.tokens[j];
        if (!seen)
            break;
        j++;
    }
    int32_t chosen = before.tokens[j];
    ck_assert_int_ne(chosen, DSARL_BYTE_TOKENIZER_EOS);
    for (int64_t c = 0; c < C; c++)
        w[DSARL_BYTE_TOKENIZER_EOS * C + c] = 1.5f * w[(int64_t)chosen * C + c];
    ck_assert_int_eq(l.ops->write_parameter(l.m, idx, w, &err), 0);
    dsarl_generation_result no_tok = run(&l, &prompts, &sp); // without a tokenizer EOS is an ordinary token
    ck_assert_int_eq(no_tok.cu_lengths[1], 8);
    sp.tokenizer = tok;
    dsarl_generation_result after = run(&l, &prompts, &sp); // run() checks greedy = recompute argmax
    int32_t n0 = after.cu_lengths[1];
    ck_assert_int_le(n0, j + 1);
    ck_assert_int_eq(after.tokens[n0 - 1], DSARL_BYTE_TOKENIZER_EOS);
    ck_assert_int_eq(after.truncated[0], 0);
    for (int32_t i = 0; i < n0 - 1; i++)
        ck_assert_int_ne(after.tokens[i], DSARL_BYTE_TOKENIZER_EOS);
    free_result(&after), free_result(&no_tok), free_result(&before);
    dsarl_tokenizer_free(tok);
    free(w), free(tokens), free(cu);
    unload(&l);
}
END_TEST

START_TEST(test_stop_strings)
{
    loaded l = load_recipe(recipe_52, &glm5_2_model_ops, 14);
    dsarl_tokenizer *tok = NULL;
    ck_assert_int_eq(dsarl_tokenizer_load("byte", &tok, &err), 0);
    int32_t lens[3] = {4, 2, 6}, *tokens, *cu;
    dsarl_token_batch prompts = make_prompts(3, lens, 256, 81, &tokens, &cu); // plain bytes
    dsarl_sampling_params sp = params(1.0f, 12, 9);
    dsarl_generation_result free_run = run(&l, &prompts, &sp);
    // the text of tokens 4..5 of sequence 2 as a stop string
    const int32_t *s2 = free_run.tokens + free_run.cu_lengths[2];
    char *text = NULL, *stop_text = NULL;
    size_t len = 0, stop_len = 0;
    ck_assert_int_eq(dsarl_tokenizer_decode(tok, s2 + 4, 2, 0, &stop_text, &stop_len, &err), 0);
    const char *stops[2] = {"\x01\x02\x03 never", stop_text};
    sp.stop_strings = stops, sp.n_stop_strings = 2, sp.tokenizer = tok;
    dsarl_generation_result stopped = run(&l, &prompts, &sp);
    for (int32_t b = 0; b < 3; b++) {
        // expected: the first prefix of the free run whose text contains the stop string (-1: none)
        const int32_t *full = free_run.tokens + free_run.cu_lengths[b];
        int32_t want = -1;
        for (int32_t n = 1; n <= 12 && want < 0; n++) {
            ck_assert_int_eq(dsarl_tokenizer_decode(tok, full, (size_t)n, 0, &text, &len, &err), 0);
            for (size_t at = 0; at + stop_len <= len && want < 0; at++)
                want = memcmp(text + at, stop_text, stop_len) == 0 ? n : -1;
            free(text);
        }
        int32_t n = stopped.cu_lengths[b + 1] - stopped.cu_lengths[b];
        ck_assert_msg(n == (want < 0 ? 12 : want), "sequence %d: stopped after %d tokens, expected %d", b, n, want);
        ck_assert_int_eq(memcmp(stopped.tokens + stopped.cu_lengths[b], full, (size_t)n * sizeof(int32_t)), 0);
        ck_assert_int_eq(stopped.truncated[b], want < 0);
    }
    ck_assert_int_le(stopped.cu_lengths[3] - stopped.cu_lengths[2], 6);
    free(stop_text);
    free_result(&stopped), free_result(&free_run);
    dsarl_tokenizer_free(tok);
    free(tokens), free(cu);
    unload(&l);
}
END_TEST

// A ragged batch gives each sequence exactly what it gets alone (same seed): slots, streams and finished
// sequences do not leak between sequences; and the same seed repeats, another seed differs.
START_TEST(test_ragged_batch_and_determinism)
{
    loaded l = load_recipe(recipe_51, &glm5_1_model_ops, 15);
    int32_t lens[4] = {9, 1, 4, 6}, *tokens, *cu;
    dsarl_token_batch prompts = make_prompts(4, lens, 260, 91, &tokens, &cu);
    dsarl_sampling_params sp = params(0.9f, 9, 123);
    sp.top_k = 50;
    dsarl_generation_result all = run(&l, &prompts, &sp), again = run(&l, &prompts, &sp);
    int32_t total = all.cu_lengths[4];
    ck_assert_int_eq(again.cu_lengths[4], total);
    ck_assert_int_eq(memcmp(all.tokens, again.tokens, (size_t)total * 4), 0);
    ck_assert_int_eq(memcmp(all.logprobs, again.logprobs, (size_t)total * 4), 0);
    sp.seed = 124;
    dsarl_generation_result other = run(&l, &prompts, &sp);
    ck_assert_msg(memcmp(all.tokens, other.tokens, (size_t)total * 4) != 0, "another seed drew the same tokens");
    sp.seed = 123;
    // sequence b alone is sequence 0 of a one-prompt batch, so it draws from stream (0, step): give the batch
    // run's sequence 0 for comparison, and the others through a batch where they sit at the same index
    for (int32_t b = 0; b < 4; b++) {
        int32_t *sub_tok = malloc((size_t)cu[4] * sizeof(int32_t)), sub_cu[5] = {0};
        int32_t n = 0;
        for (int32_t i = 0; i <= b; i++) { // prompts 0..b-1 replaced by one-token dummies
            int32_t from = i == b ? cu[b] : 0, cnt = i == b ? lens[b] : 1;
            for (int32_t t = 0; t < cnt; t++)
                sub_tok[n++] = i == b ? tokens[from + t] : 3;
            sub_cu[i + 1] = n;
        }
        dsarl_token_batch sub = {.struct_size = sizeof(sub), .n_tokens = n, .n_sequences = b + 1, .tokens = sub_tok,
                                 .cu_seqlens = sub_cu};
        dsarl_generation_result one = run(&l, &sub, &sp);
        int32_t len_all = all.cu_lengths[b + 1] - all.cu_lengths[b], len_one = one.cu_lengths[b + 1] - one.cu_lengths[b];
        ck_assert_int_eq(len_all, len_one);
        for (int32_t i = 0; i < len_all; i++) {
            ck_assert_int_eq(all.tokens[all.cu_lengths[b] + i], one.tokens[one.cu_lengths[b] + i]);
            float a = all.logprobs[all.cu_lengths[b] + i], o = one.logprobs[one.cu_lengths[b] + i];
            ck_assert(fabsf(a - o) <= 1e-5f * fabsf(a) + 1e-6f);
        }
        free_result(&one);
        free(sub_tok);
    }
    free_result(&all), free_result(&again), free_result(&other);
    free(tokens), free(cu);
    unload(&l);
}
END_TEST

// Long prompts are prefilled in pieces (native_set_prefill_tokens): whole prompts packed while they fit, a longer
// one split over calls that continue its slot. The pieces draw what the one-pass prefill draws, and the sparse top-k
// is active (prompts longer than index_topk), so the split prompt's later pieces select among cached keys.
START_TEST(test_prefill_in_pieces)
{
    loaded l = load_recipe(recipe_52, &glm5_2_model_ops, 21);
    int32_t lens[4] = {23, 3, 30, 5}, *tokens, *cu;
    ck_assert(lens[2] > l.m->cfg.index_topk);
    dsarl_token_batch prompts = make_prompts(4, lens, 260, 33, &tokens, &cu);
    dsarl_sampling_params sp = params(1.0f, 6, 77);
    dsarl_generation_result whole = run(&l, &prompts, &sp);
    int32_t budgets[3] = {7, 24, 1};
    for (int i = 0; i < 3; i++) {
        dsarl_generator *gen = NULL;
        ck_assert_int_eq(native_create(NULL, l.ops, l.m, &gen, &err), 0);
        native_set_prefill_tokens(gen, budgets[i]);
        dsarl_generation_result part;
        ck_assert_msg(native_generate(gen, &prompts, &sp, &part, &err) == 0, "%s", err.message);
        ck_assert_int_eq(part.cu_lengths[4], whole.cu_lengths[4]);
        for (int32_t j = 0; j < whole.cu_lengths[4]; j++) {
            ck_assert_msg(part.tokens[j] == whole.tokens[j], "budget %d: token %d is %d, one pass %d", budgets[i], j,
                          part.tokens[j], whole.tokens[j]);
            float a = whole.logprobs[j], o = part.logprobs[j];
            ck_assert_msg(fabsf(a - o) <= 1e-5f * fabsf(a) + 1e-6f, "budget %d: log-prob %d is %g, one pass %g",
                          budgets[i], j, o, a);
        }
        native_destroy(gen);
    }
    free_result(&whole);
    free(tokens), free(cu);
    unload(&l);
}
END_TEST

// A cache whose rows (slots x tokens) would overflow the int32 key ranges is refused before anything is allocated:
// 16384 slots of 131072 tokens are 2^31 rows (one past INT32_MAX), one slot fewer fits the bound.
START_TEST(test_cache_rows_bound)
{
    loaded l = load_recipe(recipe_52, &glm5_2_model_ops, 5);
    dsarl_model_cache *cache = NULL;
    ck_assert_int_eq(l.ops->cache_create(l.m, 16384, 131072, &cache, &err), DSARL_E_INVALID);
    ck_assert_ptr_null(cache);
    ck_assert_msg(strstr(err.message, "2147483648 rows"), "%s", err.message);
    ck_assert_int_eq(l.ops->cache_create(l.m, 2, 131072, &cache, &err), 0); // 262144 rows: well inside
    l.ops->cache_free(cache);
    unload(&l);
}
END_TEST

START_TEST(test_sequence_offset_splits_a_batch)
{
    // a data-parallel rank samples its rows of a batch with sequence_offset = the index of its first row: the two
    // halves of a batch, generated apart, draw exactly what the whole batch draws (and without the offset the
    // second half would draw the first half's streams)
    loaded l = load_recipe(recipe_51, &glm5_1_model_ops, 15);
    int32_t lens[4] = {5, 3, 7, 2}, *tokens, *cu;
    dsarl_token_batch prompts = make_prompts(4, lens, 260, 17, &tokens, &cu);
    dsarl_sampling_params sp = params(1.0f, 8, 321);
    dsarl_generation_result all = run(&l, &prompts, &sp);
    bool offset_matters = false;
    for (int32_t half = 0; half < 2; half++) {
        int32_t first = 2 * half, sub_cu[3] = {0, lens[first], lens[first] + lens[first + 1]};
        dsarl_token_batch sub = {.struct_size = sizeof(sub), .n_tokens = sub_cu[2], .n_sequences = 2,
                                 .tokens = tokens + cu[first], .cu_seqlens = sub_cu};
        sp.sequence_offset = first;
        dsarl_generation_result part = run(&l, &sub, &sp);
        for (int32_t b = 0; b < 2; b++) {
            int32_t len = all.cu_lengths[first + b + 1] - all.cu_lengths[first + b];
            ck_assert_int_eq(part.cu_lengths[b + 1] - part.cu_lengths[b], len);
            ck_assert_int_eq(memcmp(all.tokens + all.cu_lengths[first + b], part.tokens + part.cu_lengths[b],
                                    (size_t)len * sizeof(int32_t)), 0);
            for (int32_t i = 0; i < len; i++) {
                float a = all.logprobs[all.cu_lengths[first + b] + i], o = part.logprobs[part.cu_lengths[b] + i];
                ck_assert(fabsf(a - o) <= 1e-5f * fabsf(a) + 1e-6f);
            }
        }
        if (half == 1) {
            sp.sequence_offset = 0;
            dsarl_generation_result wrong = run(&l, &sub, &sp);
            offset_matters = wrong.cu_lengths[2] != part.cu_lengths[2] ||
                             memcmp(wrong.tokens, part.tokens, (size_t)part.cu_lengths[2] * sizeof(int32_t)) != 0;
            free_result(&wrong);
        }
        free_result(&part);
    }
    ck_assert_msg(offset_matters, "the second half drew the same tokens from the first half's streams");
    free_result(&all);
    free(tokens), free(cu);
    unload(&l);
}
END_TEST

START_TEST(test_refusals)
{
    loaded l = load_recipe(recipe_52, &glm5_2_model_ops, 16);
    dsarl_generator *gen = NULL;
    ck_assert_int_eq(native_create(NULL, l.ops, l.m, &gen, &err), 0);
    int32_t ids[3] = {1, 2, 3}, cu[3] = {0, 3, 3}, cu1[2] = {0, 3};
    dsarl_token_batch ragged_empty = {.struct_size = sizeof(ragged_empty), .n_tokens = 3, .n_sequences = 2,
                                      .tokens = ids, .cu_seqlens = cu};
    dsarl_token_batch one = {.struct_size = sizeof(one), .n_tokens = 3, .n_sequences = 1, .tokens = ids,
                             .cu_seqlens = cu1};
    dsarl_generation_result res;
    dsarl_sampling_params sp = params(1.0f, 4, 0);
    ck_assert_int_eq(native_generate(gen, &ragged_empty, &sp, &res, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "prompt 1 is empty"));
    sp.top_p = 0.0f;
    ck_assert_int_eq(native_generate(gen, &one, &sp, &res, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "top_p"));
    sp = params(-1.0f, 4, 0);
    ck_assert_int_eq(native_generate(gen, &one, &sp, &res, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "temperature"));
    sp = params(1.0f, 0, 0);
    ck_assert_int_eq(native_generate(gen, &one, &sp, &res, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "max_new_tokens"));
    const char *stop = "x";
    sp = params(1.0f, 4, 0);
    sp.stop_strings = &stop, sp.n_stop_strings = 1;
    ck_assert_int_eq(native_generate(gen, &one, &sp, &res, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "tokenizer"));
    ids[1] = 260;
    sp = params(1.0f, 4, 0);
    ck_assert_int_eq(native_generate(gen, &one, &sp, &res, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "vocabulary"));
    native_destroy(gen);
    // the cache refuses more tokens than it was sized for, and a slot named twice
    dsarl_model_cache *cache = NULL;
    ck_assert_int_eq(l.ops->cache_create(l.m, 2, 4, &cache, &err), 0);
    ids[1] = 2;
    int32_t slot0 = 0, slots2[2] = {1, 1}, cu2[3] = {0, 1, 2};
    float logits[2 * 260];
    ck_assert_int_eq(l.ops->forward_cached(l.m, cache, &one, &slot0, logits, &err), 0);
    ck_assert_int_eq(l.ops->forward_cached(l.m, cache, &one, &slot0, logits, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "holds 3 tokens"));
    dsarl_token_batch two = {.struct_size = sizeof(two), .n_tokens = 2, .n_sequences = 2, .tokens = ids,
                             .cu_seqlens = cu2};
    ck_assert_int_eq(l.ops->forward_cached(l.m, cache, &two, slots2, logits, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "both name slot 1"));
    l.ops->cache_free(cache);
    unload(&l);
}
END_TEST

// `dsarl generate` in sampling mode prints what the engine returns in process for the same parameters.
START_TEST(test_cli_sampling)
{
    loaded l = load_fixture("glm5.2-tiny");
    int32_t ids[6] = {40, 104, 24, 3, 19, 77}, cu[2] = {0, 6}, stop = 46;
    dsarl_token_batch prompts = {.struct_size = sizeof(prompts), .n_tokens = 6, .n_sequences = 1, .tokens = ids,
                                 .cu_seqlens = cu};
    dsarl_sampling_params sp = params(0.9f, 9, 4);
    sp.top_k = 30, sp.top_p = 0.95f, sp.stop_token_ids = &stop, sp.n_stop_token_ids = 1;
    dsarl_generation_result want = run(&l, &prompts, &sp);
    char cmd[1024], out[8192] = {0};
    snprintf(cmd, sizeof cmd, "'%s/bin/dsarl' generate --model-dir '%sglm5.2-tiny' --prompt-ids 40,104,24,3,19,77 "
             "--max-new-tokens 9 --temperature 0.9 --top-k 30 --top-p 0.95 --seed 4 --stop-ids 46 --logprobs "
             "2>&1", DSARL_BINARY_DIR, FIXTURES);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    ck_assert_msg(pclose(p) == 0, "%s", out);
    json_error_t jerr;
    json_t *j = json_loads(out, 0, &jerr);
    ck_assert_msg(j != NULL, "not JSON: %s", out);
    json_t *tok = json_object_get(j, "tokens"), *lp = json_object_get(j, "logprobs");
    ck_assert_int_eq((int)json_array_size(tok), want.cu_lengths[1]);
    for (int32_t i = 0; i < want.cu_lengths[1]; i++) {
        ck_assert_int_eq(json_integer_value(json_array_get(tok, (size_t)i)), want.tokens[i]);
        ck_assert(fabs(json_real_value(json_array_get(lp, (size_t)i)) - want.logprobs[i]) <= 1e-6);
    }
    ck_assert(json_is_true(json_object_get(j, "truncated")) == (want.truncated[0] == 1));
    json_decref(j);
    free_result(&want);
    unload(&l);
}
END_TEST

static Suite *generation_suite(void)
{
    Suite *s = suite_create("generation");
    TCase *tc = tcase_create("native");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_cached_logits_fixtures);
    tcase_add_test(tc, test_cached_logits_recipe_models);
    tcase_add_test(tc, test_greedy_matches_recompute);
    tcase_add_test(tc, test_greedy_matches_transformers);
    tcase_add_test(tc, test_sampled_logprobs_match_training);
    tcase_add_test(tc, test_sampling_frequencies);
    tcase_add_test(tc, test_filter_ties);
    tcase_add_test(tc, test_stop_ids_eos_and_truncation);
    tcase_add_test(tc, test_tokenizer_eos_stops);
    tcase_add_test(tc, test_stop_strings);
    tcase_add_test(tc, test_ragged_batch_and_determinism);
    tcase_add_test(tc, test_sequence_offset_splits_a_batch);
    tcase_add_test(tc, test_prefill_in_pieces);
    tcase_add_test(tc, test_cache_rows_bound);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_cli_sampling);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(generation_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
