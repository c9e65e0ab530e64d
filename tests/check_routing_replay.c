/* check_routing_replay.c: routing replay on the CPU device. The native engine records, per prompt and completion
 * token, the experts every MoE layer routed it to and the keys every full-indexer layer selected; a training pass
 * given those rows uses them, whatever its own top-k would choose.
 *
 *   replay_exact   an IndexShare model (glm5.2, grouped routing) generates with recording; its weights are then
 *                  perturbed until its own routing differs from the recording (counted: it must differ somewhere),
 *                  and the replayed forward, recording what it used, reproduces the engine's experts and key sets
 *                  row for row. On the unperturbed weights the replayed log-probs equal the sampler's.
 *   router_grad    under replay the loss is smooth in the router weights (the choice is fixed, the weights come
 *                  from the trainer's own scores): the router gradient of backward equals central finite
 *                  differences of forward_logprobs, so the gradient flows through the replayed gate weights.
 *   refusals       bad replay rows (an expert out of range, a key after the token), recording without the paged
 *                  loop, and a model with dense attention asked for index replay, each in one sentence. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_model_fixture.h"
#include "dsarl/rng.h"
#include "generation_recipes.h"
#include "glm5_ops.h"
#include "native_generator.h"

static dsarl_error err;

// One recorded rollout batch: prompts + completions packed as a training batch, with the engine's routing rows.
typedef struct recorded {
    int32_t B, T, *cu, *tokens, *targets, *experts, *indices;
    float *gen_lp;  // (T) the sampler's log-prob of token t + 1 at position t, 0 where t + 1 is not generated
    dsarl_routing_shape sh;
} recorded;

static recorded record_rollouts(cpu_model_fixture *f, uint32_t seed)
{
    const int32_t lens[3] = {5, 7, 6}, B = 3;
    int32_t pcu[4] = {0}, ptok[18];
    for (int32_t b = 0; b < B; b++)
        pcu[b + 1] = pcu[b] + lens[b];
    dsarl_rng rng;
    dsarl_rng_init(&rng, seed, 0);
    for (int32_t t = 0; t < pcu[B]; t++)
        ptok[t] = 1 + (int32_t)dsarl_rng_below(&rng, 259);
    dsarl_token_batch prompts = {.struct_size = sizeof prompts, .n_tokens = pcu[B], .n_sequences = B,
                                 .tokens = ptok, .cu_seqlens = pcu};
    dsarl_sampling_params sp = {.struct_size = sizeof sp, .temperature = 1.0f, .top_p = 1.0f, .max_new_tokens = 6,
                                .seed = seed, .record_routing = DSARL_RECORD_EXPERTS | DSARL_RECORD_INDICES};
    dsarl_generator *gen = NULL;
    ck_assert_msg(native_create(NULL, f->ops, f->model, &gen, &err) == 0, "%s", err.message);
    dsarl_generation_result res = {.struct_size = sizeof res};
    ck_assert_msg(native_generate(gen, &prompts, &sp, &res, &err) == 0, "%s", err.message);
    recorded r = {.B = B, .sh = {.struct_size = sizeof r.sh}};
    ck_assert_msg(f->ops->routing_shape(f->model, &r.sh, &err) == 0, "%s", err.message);
    ck_assert_int_eq(r.sh.moe_layers, 3); // layers 1-3 (first_k_dense_replace 1)
    ck_assert_int_eq(r.sh.index_layers, 2); // F S F S
    ck_assert_ptr_nonnull(res.routed_experts);
    ck_assert_ptr_nonnull(res.routed_indices);
    r.T = res.cu_routed[B];
    int64_t we = r.sh.moe_layers * r.sh.experts_per_token, wi = r.sh.index_layers * r.sh.index_topk;
    r.cu = malloc(sizeof(int32_t) * (size_t)(B + 1));
    r.tokens = malloc(sizeof(int32_t) * (size_t)r.T), r.targets = malloc(sizeof(int32_t) * (size_t)r.T);
    r.gen_lp = calloc((size_t)r.T, sizeof(float));
    r.experts = malloc(sizeof(int32_t) * (size_t)(r.T * we)), r.indices = malloc(sizeof(int32_t) * (size_t)(r.T * wi));
    memcpy(r.cu, res.cu_routed, sizeof(int32_t) * (size_t)(B + 1));
    memcpy(r.experts, res.routed_experts, sizeof(int32_t) * (size_t)(r.T * we));
    memcpy(r.indices, res.routed_indices, sizeof(int32_t) * (size_t)(r.T * wi));
    for (int32_t b = 0; b < B; b++) {
        int32_t P = lens[b], n = res.cu_lengths[b + 1] - res.cu_lengths[b], at = r.cu[b];
        ck_assert_int_eq(r.cu[b + 1] - at, P + n);
        memcpy(r.tokens + at, ptok + pcu[b], sizeof(int32_t) * (size_t)P);
        memcpy(r.tokens + at + P, res.tokens + res.cu_lengths[b], sizeof(int32_t) * (size_t)n);
        for (int32_t j = 0; j < P + n; j++) {
            r.targets[at + j] = j + 1 < P + n ? r.tokens[at + j + 1] : -1;
            if (j + 1 >= P && j + 1 < P + n)
                r.gen_lp[at + j] = res.logprobs[res.cu_lengths[b] + j + 1 - P];
            // every token but the last went through the engine: recorded; the last is not
            bool want = j + 1 < P + n;
            ck_assert_msg((r.experts[(at + j) * we] >= 0) == want, "sequence %d position %d: experts recorded %d",
                          b, j, r.experts[(at + j) * we] >= 0);
            ck_assert_msg((r.indices[(at + j) * wi] >= 0) == want, "sequence %d position %d: indices recorded %d",
                          b, j, r.indices[(at + j) * wi] >= 0);
        }
    }
    // the key positions come in the order the engine's attention read them (the indexer's, by score), not sorted:
    // a replay must sum them in that order. Random weights order some row's keys other than ascending.
    int64_t unsorted = 0, W = r.sh.index_topk;
    for (int64_t row = 0; row < r.T * r.sh.index_layers; row++)
        for (int64_t j = 1; j < W && r.indices[row * W + j] >= 0; j++)
            unsorted += r.indices[row * W + j] < r.indices[row * W + j - 1];
    ck_assert_msg(unsorted > 0, "every recorded index row is ascending: the record sorted the indexer's order away");
    native_destroy(gen);
    return r;
}

static void recorded_free(recorded *r)
{
    free(r->cu), free(r->tokens), free(r->targets), free(r->experts), free(r->indices), free(r->gen_lp);
}

static dsarl_token_batch train_batch(const recorded *r, bool replay, int32_t *rec_e, int32_t *rec_i)
{
    return (dsarl_token_batch){.struct_size = sizeof(dsarl_token_batch), .n_tokens = r->T, .n_sequences = r->B,
                               .tokens = r->tokens, .cu_seqlens = r->cu, .logit_scale = 1.0f,
                               .replay_experts = replay ? r->experts : NULL,
                               .replay_indices = replay ? r->indices : NULL, .record_experts = rec_e,
                               .record_indices = rec_i};
}

// Rows (token, layer) of got that differ from the recording, over recorded rows only; experts compared as sets.
static int64_t rows_differ(const int32_t *want, const int32_t *got, int64_t T, int64_t layers, int64_t w, bool sets)
{
    int64_t n = 0;
    for (int64_t r = 0; r < T * layers; r++) {
        const int32_t *a = want + r * w, *b = got + r * w;
        if (a[0] < 0)
            continue;
        bool same = true;
        for (int64_t i = 0; i < w && same; i++) {
            bool found = !sets && a[i] == b[i];
            for (int64_t j = 0; sets && j < w; j++)
                found |= a[i] == b[j];
            same = found;
        }
        n += !same;
    }
    return n;
}

// Scales every trainable tensor by (1 + amp * u), u uniform in [-1, 1): the trainer's weights no longer the engine's.
static void perturb(cpu_model_fixture *f, float amp, uint64_t seed)
{
    dsarl_rng rng;
    dsarl_rng_init(&rng, seed, 7);
    for (int64_t i = 0; i < f->ops->parameter_tensors(f->model); i++) {
        const char *name;
        int32_t nd;
        int64_t shape[4], n = 1;
        int trainable;
        ck_assert(f->ops->parameter_info(f->model, i, &name, &nd, shape, &trainable, &err) == 0);
        for (int32_t d = 0; d < nd; d++)
            n *= shape[d];
        float *v = malloc(sizeof(float) * (size_t)n);
        ck_assert(f->ops->read_parameter(f->model, i, v, NULL, &err) == 0);
        for (int64_t j = 0; trainable && j < n; j++)
            v[j] *= 1.0f + amp * (2.0f * (float)dsarl_rng_uniform(&rng) - 1.0f);
        ck_assert(f->ops->write_parameter(f->model, i, v, &err) == 0);
        free(v);
    }
}

START_TEST(replay_exact)
{
    cpu_model_fixture f;
    cpu_model_fixture_open(&f, &glm5_2_model_ops, recipe_52, "replay.yaml", 11);
    recorded r = record_rollouts(&f, 5);
    int64_t T = r.T, Le = r.sh.moe_layers, K = r.sh.experts_per_token, Li = r.sh.index_layers, W = r.sh.index_topk;
    int32_t *own_e = malloc(sizeof(int32_t) * (size_t)(T * Le * K)), *own_i = malloc(sizeof(int32_t) * (size_t)(T * Li * W));
    int32_t *rep_e = malloc(sizeof(int32_t) * (size_t)(T * Le * K)), *rep_i = malloc(sizeof(int32_t) * (size_t)(T * Li * W));
    float *lp = malloc(sizeof(float) * (size_t)T);
    // the unperturbed trainer replaying the engine scores what the sampler drew (temperature 1, no filtering)
    dsarl_token_batch b = train_batch(&r, true, rep_e, rep_i);
    ck_assert_msg(f.ops->forward_logprobs(f.model, &b, r.targets, lp, &err) == 0, "%s", err.message);
    double worst = 0.0;
    for (int64_t t = 0; t < T; t++)
        if (r.gen_lp[t] != 0.0f)
            worst = fmax(worst, fabs((double)lp[t] - r.gen_lp[t]));
    ck_assert_msg(worst < 1e-4, "replayed log-probs differ from the sampler's by %.3g", worst);
    perturb(&f, 0.3f, 3);
    b = train_batch(&r, false, own_e, own_i);
    ck_assert_msg(f.ops->forward_logprobs(f.model, &b, r.targets, lp, &err) == 0, "%s", err.message);
    int64_t own_de = rows_differ(r.experts, own_e, T, Le, K, true), own_di = rows_differ(r.indices, own_i, T, Li, W, false);
    b = train_batch(&r, true, rep_e, rep_i);
    ck_assert_msg(f.ops->forward_logprobs(f.model, &b, r.targets, lp, &err) == 0, "%s", err.message);
    int64_t rep_de = rows_differ(r.experts, rep_e, T, Le, K, false), rep_di = rows_differ(r.indices, rep_i, T, Li, W, false);
    printf("replay_exact: perturbed trainer's own routing differs from the engine's in %lld of %lld expert rows and "
           "%lld of %lld index rows; replayed: %lld and %lld\n", (long long)own_de, (long long)(T * Le),
           (long long)own_di, (long long)(T * Li), (long long)rep_de, (long long)rep_di);
    ck_assert_msg(own_de > 0 && own_di > 0, "the perturbation must move the trainer's own routing (experts %lld, "
                  "indices %lld rows differ)", (long long)own_de, (long long)own_di);
    ck_assert_int_eq(rep_de, 0);
    ck_assert_int_eq(rep_di, 0);
    free(own_e), free(own_i), free(rep_e), free(rep_i), free(lp);
    recorded_free(&r);
    cpu_model_fixture_close(&f);
}
END_TEST

START_TEST(router_grad)
{
    cpu_model_fixture f;
    cpu_model_fixture_open(&f, &glm5_2_model_ops, recipe_52, "replay.yaml", 11);
    recorded r = record_rollouts(&f, 9);
    perturb(&f, 0.3f, 4); // the recording is not the trainer's own choice any more
    int64_t T = r.T;
    float *dlp = malloc(sizeof(float) * (size_t)T), *lp = malloc(sizeof(float) * (size_t)T);
    dsarl_rng rng;
    dsarl_rng_init(&rng, 21, 0);
    for (int64_t t = 0; t < T; t++)
        dlp[t] = r.targets[t] >= 0 ? (float)dsarl_rng_uniform(&rng) - 0.5f : 0.0f;
    dsarl_token_batch b = train_batch(&r, true, NULL, NULL);
    ck_assert(f.ops->zero_grad(f.model, &err) == 0);
    ck_assert_msg(f.ops->backward(f.model, &b, r.targets, dlp, NULL, &err) == 0, "%s", err.message);
    int64_t router = -1; // the last MoE layer's router: (E, C)
    for (int64_t i = 0; i < f.ops->parameter_tensors(f.model); i++) {
        const char *name;
        int32_t nd;
        int64_t shape[4];
        int trainable;
        ck_assert(f.ops->parameter_info(f.model, i, &name, &nd, shape, &trainable, &err) == 0);
        if (strcmp(name, "model.layers.3.mlp.gate.weight") == 0)
            router = i;
    }
    ck_assert_int_ge(router, 0);
    int64_t n = 8 * 32;
    float *w = malloc(sizeof(float) * (size_t)n), *g = malloc(sizeof(float) * (size_t)n);
    ck_assert(f.ops->read_parameter(f.model, router, w, g, &err) == 0);
    int64_t top = 0; // the largest gradient entry, and two more spread over the tensor
    for (int64_t j = 0; j < n; j++)
        top = fabsf(g[j]) > fabsf(g[top]) ? j : top;
    int64_t probe[3] = {top, (top + 37) % n, (top + 101) % n};
    ck_assert_msg(fabsf(g[top]) > 1e-4f, "the router gets no gradient through the replayed gate weights");
    for (int k = 0; k < 3; k++) {
        int64_t j = probe[k];
        double h = 1e-2, loss[2];
        for (int s = 0; s < 2; s++) {
            float keep = w[j];
            w[j] = keep + (float)(s ? -h : h);
            ck_assert(f.ops->write_parameter(f.model, router, w, &err) == 0);
            ck_assert_msg(f.ops->forward_logprobs(f.model, &b, r.targets, lp, &err) == 0, "%s", err.message);
            loss[s] = 0.0;
            for (int64_t t = 0; t < T; t++)
                loss[s] += (double)dlp[t] * lp[t];
            w[j] = keep;
        }
        ck_assert(f.ops->write_parameter(f.model, router, w, &err) == 0);
        double fd = (loss[0] - loss[1]) / (2.0 * h);
        printf("router_grad: entry %lld backward %.6g finite differences %.6g\n", (long long)j, g[j], fd);
        ck_assert_msg(fabs(fd - g[j]) <= 2e-2 * fabs(g[top]) + 1e-5, "router entry %lld: backward %.6g, finite "
                      "differences %.6g", (long long)j, g[j], fd);
    }
    free(w), free(g), free(dlp), free(lp);
    recorded_free(&r);
    cpu_model_fixture_close(&f);
}
END_TEST

START_TEST(refusals)
{
    cpu_model_fixture f;
    cpu_model_fixture_open(&f, &glm5_2_model_ops, recipe_52, "replay.yaml", 11);
    recorded r = record_rollouts(&f, 5);
    float *lp = malloc(sizeof(float) * (size_t)r.T);
    int64_t we = r.sh.moe_layers * r.sh.experts_per_token, wi = r.sh.index_layers * r.sh.index_topk;
    int32_t keep = r.experts[2 * we];
    r.experts[2 * we] = 8; // experts are [0, 8)
    dsarl_token_batch b = train_batch(&r, true, NULL, NULL);
    ck_assert_int_ne(f.ops->forward_logprobs(f.model, &b, r.targets, lp, &err), 0);
    ck_assert_msg(strstr(err.message, "valid experts are [0, 8)"), "%s", err.message);
    r.experts[2 * we] = keep;
    r.indices[2 * wi] = 3; // token 2 of sequence 0 sees positions 0..2
    ck_assert_int_ne(f.ops->forward_logprobs(f.model, &b, r.targets, lp, &err), 0);
    ck_assert_msg(strstr(err.message, "attends to positions [0, 2] only"), "%s", err.message);
    // the contiguous loop does not record
    dsarl_generator *gen = NULL;
    ck_assert(native_create(NULL, f.ops, f.model, &gen, &err) == 0);
    native_paged_config c = native_get_paged(gen);
    c.enabled = false;
    native_set_paged(gen, c);
    int32_t cu[2] = {0, 3}, tok[3] = {4, 5, 6};
    dsarl_token_batch prompts = {.struct_size = sizeof prompts, .n_tokens = 3, .n_sequences = 1, .tokens = tok,
                                 .cu_seqlens = cu};
    dsarl_sampling_params sp = {.struct_size = sizeof sp, .temperature = 1.0f, .top_p = 1.0f, .max_new_tokens = 2,
                                .record_routing = DSARL_RECORD_EXPERTS};
    dsarl_generation_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(native_generate(gen, &prompts, &sp, &res, &err), DSARL_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.message, "record_routing needs the paged loop"), "%s", err.message);
    ck_assert_msg(!strchr(err.message, '\n'), "one line: %s", err.message);
    native_destroy(gen);
    free(lp);
    recorded_free(&r);
    cpu_model_fixture_close(&f);
    // dense attention (the DSA warm-up) selects every key: index replay has nothing to replay
    char text[2048];
    snprintf(text, sizeof text, "%s  megatron_cfg:\n    model_overrides:\n      dsa_dense_attention: true\n",
             recipe_51);
    cpu_model_fixture_open(&f, &glm5_1_model_ops, text, "dense.yaml", 2);
    ck_assert(native_create(NULL, f.ops, f.model, &gen, &err) == 0);
    sp.record_routing = DSARL_RECORD_INDICES;
    ck_assert_int_eq(native_generate(gen, &prompts, &sp, &res, &err), DSARL_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.message, "DSA index replay needs sparse attention"), "%s", err.message);
    native_destroy(gen);
    cpu_model_fixture_close(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("routing_replay");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, replay_exact);
    tcase_add_test(tc, router_grad);
    tcase_add_test(tc, refusals);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
