/* check_glm5_tp_mpi.c: tensor parallelism with sequence parallelism inside the glm5 model, under `mpirun -np 2`
 * (TP2) and `-np 4` (TP2 x DP2, each data-parallel pair its own batch), on the cpu device and the reference DSA
 * backend. Every rank also builds the one-process model (same config and seed, so the same weights) and compares:
 * - log-probabilities of a fresh random batch (forward_logprobs and train_forward), max relative error 1e-5;
 * - after a backward (glm5_backward, then train_forward/train_backward accumulating onto it): the indexer loss and
 *   every parameter gradient (max relative error 2e-5 per tensor), this rank's shard against the slice of the whole
 *   gradient (routed experts, which see only this rank's rows, after their sum over tp: the data-parallel reduction
 *   over edp completes them); the gradients of replicated parameters are also equal on every tp rank;
 * - forward_logits (gathered) and cached decode (prefill, then decode steps) logits, and the native generation
 *   engine's rollouts (sampled and greedy): the same tokens on every rank and as one process;
 * in both attention forms, on a tiny GLM-5.2 config (IndexShare layers, MoE with shared experts, 4 heads: 2 per
 * rank, activation recompute in one round, a logit scale in some batches) and a GLM-5.1 one with GLM-5's real
 * asymmetric head dims (qk_nope 192, rope 64, v 256, kv_lora 512), a tiny hidden size and tied embeddings; some
 * batches have an odd token count (the model pads them internally). A layout that does not split (3 heads over tp 2)
 * is refused in one sentence naming the keys. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "cpu_device.h"
#include "dsa_reference.h"
#include "glm5_cache.h"
#include "glm5_ops.h"
#include "native_generator.h"
#include "recipe_internal.h"
#include "parallel_compare.h"

static dsarl_comm *comm;
static dsarl_parallel par;
static dsarl_device *dev;
static dsarl_dsa_context *dsa;
static dsarl_error err;

#define OK(call) ck_assert_msg((call) == DSARL_OK, "%s: %s", #call, err.message)

static const char *glm52_recipe =
    "policy:\n"
    "  model_config:\n"
    "    vocab_size: 64\n    hidden_size: 16\n    intermediate_size: 24\n    moe_intermediate_size: 6\n"
    "    num_hidden_layers: 3\n    num_attention_heads: 4\n    num_key_value_heads: 4\n    q_lora_rank: 12\n"
    "    kv_lora_rank: 8\n    qk_nope_head_dim: 4\n    qk_rope_head_dim: 4\n    v_head_dim: 6\n"
    "    n_routed_experts: 8\n    num_experts_per_tok: 2\n    n_group: 2\n    topk_group: 2\n    index_topk: 3\n"
    "    index_head_dim: 8\n    index_n_heads: 3\n    first_k_dense_replace: 1\n    index_topk_pattern: FSF\n"
    "    n_shared_experts: 2\n    initializer_range: 0.35\n"
    "  megatron_cfg:\n    model_overrides:\n      dsa_indexer_loss_coeff: 0.25\n";

// GLM-5's head dims (qk_nope 192, rope 64, v 256, kv_lora 512) with few heads and a tiny hidden size; tied
// embeddings (one vocab-parallel tensor serves both ends) and the dense indexer loss
static const char *glm51_recipe =
    "policy:\n"
    "  model_config:\n"
    "    vocab_size: 32\n    hidden_size: 16\n    intermediate_size: 8\n    moe_intermediate_size: 4\n"
    "    num_hidden_layers: 2\n    num_attention_heads: 4\n    num_key_value_heads: 4\n    q_lora_rank: 16\n"
    "    kv_lora_rank: 512\n    qk_nope_head_dim: 192\n    qk_rope_head_dim: 64\n    v_head_dim: 256\n"
    "    n_routed_experts: 4\n    num_experts_per_tok: 2\n    n_group: 1\n    topk_group: 1\n    index_topk: 4\n"
    "    index_head_dim: 64\n    index_n_heads: 2\n    first_k_dense_replace: 1\n"
    "    n_shared_experts: 1\n    initializer_range: 0.1\n    tie_word_embeddings: true\n"
    "  megatron_cfg:\n    model_overrides:\n      dsa_indexer_loss_coeff: 0.5\n      dsa_indexer_use_sparse_loss: false\n";

// A model of the recipe under layout `layout` (NULL: one process); returns the create status.
static int create_model(const char *text, glm5_family family, const dsarl_parallel *layout, dsarl_recipe **recipe,
                        dsarl_model **m)
{
    ck_assert_int_eq(dsarl_recipe_load_string(text, "tp.yaml", recipe, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(*recipe, &err), 0);
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(*recipe),
                             .device_ops = &dsarl_cpu_device_ops, .device = dev,
                             .dsa_ops = &dsarl_dsa_reference_ops, .dsa = dsa, .seed = 11, .parallel = layout};
    *m = NULL;
    return glm5_create_family(family, &mc, m, &err);
}

// Non-unit norm weights and non-zero router biases in both models (the whole tensor, then each one's shard).
static void perturb_vectors(dsarl_model *single, dsarl_model *tp)
{
    for (int64_t i = 0; i < single->n_params; i++) {
        const glm5_param *p = &single->params[i], *q = glm5_model_find_param(tp, p->name);
        ck_assert_ptr_nonnull(q);
        if (p->ndim != 1)
            continue;
        float *full = malloc((size_t)p->numel * sizeof(float)), *local = malloc((size_t)q->numel * sizeof(float));
        memcpy(full, (const float *)single->weights + p->offset, (size_t)p->numel * sizeof(float));
        for (int64_t j = 0; j < p->numel; j++)
            full[j] += 0.1f * sinf((float)(7 * i + 3 * j));
        glm5_param_take_shard(q, full, local);
        OK(glm5_upload_param(single, p, 0, full, (size_t)p->numel, &err));
        OK(glm5_upload_param(tp, q, 0, local, (size_t)q->numel, &err));
        free(full), free(local);
    }
}

// A random packed batch of three sequences (one crosses the sequence-parallel row boundary), its own per
// data-parallel rank: T = 16 tokens, or 15 (odd, so the model pads a segment to split the rows), some targets
// ignored.
enum { T = 16, NSEQ = 3 };
typedef struct tp_batch {
    int32_t tokens[T], targets[T], cu[NSEQ + 1];
    float dlogprobs[T];
    dsarl_token_batch b;
} tp_batch;

static void make_batch(tp_batch *b, int64_t V, uint64_t salt, int32_t n)
{
    const int32_t cu[NSEQ + 1] = {0, 5, 11, n};
    memcpy(b->cu, cu, sizeof cu);
    uint64_t s = mix(salt * 1000003u + (uint64_t)par.dp_rank * 7919u + 17u);
    for (int t = 0; t < T; t++) {
        s = mix(s);
        b->tokens[t] = (int32_t)(s % (uint64_t)V);
        s = mix(s);
        b->targets[t] = s % 7 == 0 ? -1 : (int32_t)((s >> 8) % (uint64_t)V);
        s = mix(s);
        b->dlogprobs[t] = (float)((double)(s >> 11) / 9007199254740992.0) - 0.3f;
    }
    // some rounds divide the logits by a sampling temperature (logit_scale)
    b->b = (dsarl_token_batch){.struct_size = sizeof(dsarl_token_batch), .n_tokens = n, .n_sequences = NSEQ,
                               .tokens = b->tokens, .cu_seqlens = b->cu, .logit_scale = salt % 2 ? 0.0f : 1.4f};
}

// The largest of x over every rank (the printed errors cover every rank's batch).
static double world_max(double x)
{
    OK(dsarl_group_all_reduce_host(par.world, &x, 1, DSARL_DTYPE_F64, DSARL_REDUCE_MAX, &err));
    return x;
}

// Every parameter gradient of tp against the slice of single's whole gradient; returns the worst tensor's error
// (max |diff| / max |ref| of the tensor).
static double compare_grads(dsarl_model *single, dsarl_model *tp, const char *what)
{
    double worst = 0;
    const char *worst_name = "";
    for (int64_t i = 0; i < tp->n_params; i++) {
        const glm5_param *q = &tp->params[i], *p = glm5_model_find_param(single, q->name);
        ck_assert_ptr_nonnull(p);
        if (!q->trainable)
            continue;
        float *ref = malloc((size_t)q->numel * sizeof(float)), *got = malloc((size_t)q->numel * sizeof(float));
        glm5_param_take_shard(q, (const float *)single->grads + p->offset, ref);
        memcpy(got, (const float *)tp->grads + q->offset, (size_t)q->numel * sizeof(float));
        if (q->shard == GLM5_SHARD_EXPERT) // this rank's rows only: their sum over tp (part of the edp reduction)
            OK(dsarl_group_all_reduce_host(par.tp, got, q->numel, DSARL_DTYPE_F32, DSARL_REDUCE_SUM, &err));
        if (q->shard == GLM5_SHARD_REPLICATED) { // equal on every tp rank
            float *hi = malloc((size_t)q->numel * sizeof(float)), *lo = malloc((size_t)q->numel * sizeof(float));
            memcpy(hi, got, (size_t)q->numel * sizeof(float));
            memcpy(lo, got, (size_t)q->numel * sizeof(float));
            OK(dsarl_group_all_reduce_host(par.tp, hi, q->numel, DSARL_DTYPE_F32, DSARL_REDUCE_MAX, &err));
            OK(dsarl_group_all_reduce_host(par.tp, lo, q->numel, DSARL_DTYPE_F32, DSARL_REDUCE_MIN, &err));
            for (int64_t j = 0; j < q->numel; j++)
                ck_assert_msg(hi[j] == lo[j], "%s: replicated %s [%lld] differs over tp (%g vs %g)", what, q->name,
                              (long long)j, hi[j], lo[j]);
            free(hi), free(lo);
        }
        double scale = 0, diff = 0;
        for (int64_t j = 0; j < q->numel; j++) {
            scale = fmax(scale, fabs(ref[j]));
            diff = fmax(diff, fabs((double)got[j] - ref[j]));
        }
        if (scale == 0.0)
            ck_assert_msg(diff < 1e-12, "%s: %s has no one-process gradient but %g here", what, q->name, diff);
        else if (diff / scale > worst)
            worst = diff / scale, worst_name = q->name;
        free(ref), free(got);
    }
    double everywhere = world_max(worst);
    if (par.world_rank == 0)
        fprintf(stderr, "  %s: worst gradient tensor %.3g on any rank (rank 0: %.3g, %s)\n", what, everywhere, worst,
                worst_name);
    // norm-wise per tensor; the glm5.2 model's large init (0.35) amplifies float32 reordering to a few 1e-6
    ck_assert_msg(worst < 2e-5, "%s: gradient of %s differs from one process by %.3g", what, worst_name, worst);
    return worst;
}

// Cached decode: a prefill of two prompts, then three decode steps, logits against one process.
static double compare_decode(dsarl_model *single, dsarl_model *tp, const tp_batch *b)
{
    int64_t V = single->cfg.vocab_size;
    dsarl_model_cache *c1, *c2;
    OK(glm5_cache_create(single, 2, 12, &c1, &err));
    OK(glm5_cache_create(tp, 2, 12, &c2, &err));
    int32_t slots[2] = {1, 0}, cu[3] = {0, 5, 9};
    float *l1 = malloc((size_t)(2 * V) * sizeof(float)), *l2 = malloc((size_t)(2 * V) * sizeof(float));
    dsarl_token_batch pre = {.struct_size = sizeof(pre), .n_tokens = 9, .n_sequences = 2, .tokens = b->tokens,
                             .cu_seqlens = cu};
    double worst = 0;
    for (int step = 0; step < 4; step++) {
        int32_t next[2], one[3] = {0, 1, 2};
        dsarl_token_batch dec = {.struct_size = sizeof(dec), .n_tokens = 2, .n_sequences = 2, .tokens = next,
                                 .cu_seqlens = one};
        const dsarl_token_batch *batch = &pre;
        if (step > 0) { // greedy continuation of the one-process logits, the same tokens for both models
            for (int s = 0; s < 2; s++) {
                int32_t best = 0;
                for (int64_t v = 1; v < V; v++)
                    best = l1[s * V + v] > l1[s * V + best] ? (int32_t)v : best;
                next[s] = best;
            }
            batch = &dec;
        }
        OK(glm5_forward_cached(single, c1, batch, slots, l1, &err));
        OK(glm5_forward_cached(tp, c2, batch, slots, l2, &err));
        worst = fmax(worst, max_rel_scaled(l2, l1, 2 * V));
    }
    glm5_cache_free(c1), glm5_cache_free(c2);
    free(l1), free(l2);
    return worst;
}

// One round on batches of n tokens: log-probs, logits, backward (two accumulated), decode, in form `form`.
static void check_round(dsarl_model *single, dsarl_model *tp, glm5_attention_form form, const char *what,
                        uint64_t salt, int32_t n)
{
    single->attention_form = tp->attention_form = form;
    int64_t V = single->cfg.vocab_size;
    tp_batch b;
    make_batch(&b, V, salt, n);
    float lp1[T], lp2[T];
    OK(glm5_forward_logprobs(single, &b.b, b.targets, lp1, &err));
    OK(glm5_forward_logprobs(tp, &b.b, b.targets, lp2, &err));
    double e_lp = max_rel(lp2, lp1, n, 1e-3);
    float *g1 = malloc((size_t)(n * V) * sizeof(float)), *g2 = malloc((size_t)(n * V) * sizeof(float));
    OK(glm5_forward_logits(single, &b.b, g1, &err));
    OK(glm5_forward_logits(tp, &b.b, g2, &err));
    double e_logits = max_rel_scaled(g2, g1, n * V);
    free(g1), free(g2);
    // a backward, then a training pass accumulating onto it (its log-probs too)
    float il1 = 0, il2 = 0, il1b = 0, il2b = 0;
    OK(glm5_zero_grad(single, &err));
    OK(glm5_zero_grad(tp, &err));
    OK(glm5_backward(single, &b.b, b.targets, b.dlogprobs, &il1, &err));
    OK(glm5_backward(tp, &b.b, b.targets, b.dlogprobs, &il2, &err));
    char label[160];
    snprintf(label, sizeof label, "%s, one backward", what);
    compare_grads(single, tp, label);
    tp_batch b2;
    make_batch(&b2, V, salt + 99, n);
    OK(glm5_train_forward(single, &b2.b, b2.targets, lp1, &err));
    OK(glm5_train_forward(tp, &b2.b, b2.targets, lp2, &err));
    e_lp = fmax(e_lp, max_rel(lp2, lp1, n, 1e-3));
    OK(glm5_train_backward(single, b2.dlogprobs, &il1b, &err));
    OK(glm5_train_backward(tp, b2.dlogprobs, &il2b, &err));
    snprintf(label, sizeof label, "%s, two accumulated", what);
    compare_grads(single, tp, label);
    double e_il = fmax(fabs((double)il2 - il1) / fabs((double)il1), fabs((double)il2b - il1b) / fabs((double)il1b));
    double e_dec = compare_decode(single, tp, &b);
    double any_lp = world_max(e_lp), any_logits = world_max(e_logits), any_il = world_max(e_il);
    double any_dec = world_max(e_dec);
    if (par.world_rank == 0)
        fprintf(stderr, "  %s, worst rank: log-probs %.3g, logits %.3g, indexer loss %.3g (rank 0's %.7g), decode "
                "logits %.3g\n", what, any_lp, any_logits, any_il, (double)il1, any_dec);
    ck_assert_msg(e_lp < 1e-5, "%s: log-probs differ from one process by %.3g (relative)", what, e_lp);
    ck_assert_msg(e_logits < 1e-5, "%s: logits differ from one process by %.3g", what, e_logits);
    ck_assert_msg(il1 > 0 && e_il < 1e-5, "%s: indexer loss %g vs one process %g", what, (double)il2, (double)il1);
    ck_assert_msg(e_dec < 1e-5, "%s: cached decode logits differ from one process by %.3g", what, e_dec);
}

// Rollouts of the native engine on both models: the same tokens, log-probs within 1e-5; returns the log-prob error.
static double compare_generation(const dsarl_model_ops *ops, dsarl_model *single, dsarl_model *tp, float temperature)
{
    int32_t tokens[7] = {3, 9, 1, 4, 8, 2, 6}, cu[3] = {0, 4, 7};
    dsarl_token_batch prompts = {.struct_size = sizeof(prompts), .n_tokens = 7, .n_sequences = 2, .tokens = tokens,
                                 .cu_seqlens = cu};
    dsarl_sampling_params sp = {.struct_size = sizeof(sp), .temperature = temperature, .top_p = 0.9f, .top_k = 8,
                                .max_new_tokens = 6, .seed = 5};
    dsarl_generator *g1, *g2;
    dsarl_generation_result r1, r2;
    OK(native_create(NULL, ops, single, &g1, &err));
    OK(native_create(NULL, ops, tp, &g2, &err));
    OK(native_generate(g1, &prompts, &sp, &r1, &err));
    OK(native_generate(g2, &prompts, &sp, &r2, &err));
    ck_assert_int_eq(r1.cu_lengths[2], r2.cu_lengths[2]);
    int32_t n = r1.cu_lengths[2], mine[16], lo[16], hi[16];
    ck_assert_int_le(n, 16);
    for (int32_t i = 0; i < n; i++) {
        ck_assert_msg(r1.tokens[i] == r2.tokens[i], "temperature %g: completion token %d is %d, one process %d",
                      (double)temperature, i, r2.tokens[i], r1.tokens[i]);
        mine[i] = lo[i] = hi[i] = r2.tokens[i];
    }
    // every tp rank drew the same tokens
    OK(dsarl_group_all_reduce_host(par.tp, lo, n, DSARL_DTYPE_I32, DSARL_REDUCE_MIN, &err));
    OK(dsarl_group_all_reduce_host(par.tp, hi, n, DSARL_DTYPE_I32, DSARL_REDUCE_MAX, &err));
    ck_assert(memcmp(lo, mine, (size_t)n * sizeof(int32_t)) == 0 && memcmp(hi, mine, (size_t)n * sizeof(int32_t)) == 0);
    double e = max_rel(r2.logprobs, r1.logprobs, n, 1e-2);
    native_destroy(g1), native_destroy(g2);
    return e;
}

static void check_config(const char *text, glm5_family family, const char *name)
{
    dsarl_recipe *r1, *r2;
    dsarl_model *single, *tp;
    OK(create_model(text, family, NULL, &r1, &single));
    OK(create_model(text, family, &par, &r2, &tp));
    ck_assert_int_eq(tp->shards.tp_size, par.tp_size);
    if (strstr(text, "tie_word_embeddings: true"))
        ck_assert(tp->cfg.tie_word_embeddings && !glm5_model_find_param(tp, "lm_head.weight") &&
                  tp->lm_head == tp->embed);
    perturb_vectors(single, tp);
    char what[128];
    snprintf(what, sizeof what, "%s absorbed", name);
    check_round(single, tp, GLM5_FORM_ABSORBED, what, 1, T);
    snprintf(what, sizeof what, "%s headwise", name);
    check_round(single, tp, GLM5_FORM_HEADWISE, what, 2, T);
    snprintf(what, sizeof what, "%s headwise, 15 tokens (padded)", name);
    check_round(single, tp, GLM5_FORM_HEADWISE, what, 4, T - 1);
    single->activation_recompute = tp->activation_recompute = true;
    snprintf(what, sizeof what, "%s absorbed, activation recompute, 15 tokens (padded)", name);
    check_round(single, tp, GLM5_FORM_ABSORBED, what, 3, T - 1);
    const dsarl_model_ops *ops = family == GLM5_FAMILY_51 ? &glm5_1_model_ops : &glm5_2_model_ops;
    double e_sampled = world_max(compare_generation(ops, single, tp, 0.8f));
    double e_greedy = world_max(compare_generation(ops, single, tp, 0.0f));
    if (par.world_rank == 0)
        fprintf(stderr, "  %s native generation: same tokens; log-probs %.3g (sampled), %.3g (greedy)\n", name,
                e_sampled, e_greedy);
    ck_assert_msg(e_sampled < 1e-5 && e_greedy < 1e-5, "%s: rollout log-probs differ by %.3g / %.3g", name,
                  e_sampled, e_greedy);
    glm5_model_free(single), glm5_model_free(tp);
    dsarl_recipe_free(r1), dsarl_recipe_free(r2);
}

START_TEST(test_glm52_tp_matches_one_process) { check_config(glm52_recipe, GLM5_FAMILY_52, "glm5.2"); }
END_TEST

START_TEST(test_glm51_real_head_dims_tp_matches_one_process) { check_config(glm51_recipe, GLM5_FAMILY_51, "glm5.1"); }
END_TEST

START_TEST(test_refusal)
{
    // 3 heads do not split over tp 2
    char text[4096];
    snprintf(text, sizeof text, "%s", glm52_recipe);
    static const char *const keys[] = {"num_attention_heads: 4", "num_key_value_heads: 4"};
    for (int k = 0; k < 2; k++) {
        char *h = strstr(text, keys[k]);
        ck_assert_ptr_nonnull(h);
        h[strlen(keys[k]) - 1] = '3';
    }
    dsarl_recipe *r;
    dsarl_model *m;
    ck_assert_int_ne(create_model(text, GLM5_FAMILY_52, &par, &r, &m), DSARL_OK);
    ck_assert_msg(strstr(err.message, "num_attention_heads") && strstr(err.message, "tensor_model_parallel_size"),
                  "%s", err.message);
    dsarl_recipe_free(r);
}
END_TEST

int main(void)
{
    dsarl_error_clear(&err);
    if (!dsarl_comm_launched()) {
        fprintf(stderr, "check_glm5_tp_mpi runs under mpirun (-np 2 or 4)\n");
        return 77;
    }
    if (dsarl_comm_init(&comm, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return EXIT_FAILURE;
    }
    // -np 2: TP2; -np 4: TP2 x DP2
    int32_t world = dsarl_comm_world_size(comm);
    dsarl_layout l;
    int rc = dsarl_layout_make(world, 2, 1, 1, 1, &l, &err);
    l.collective_timeout_s = 60; // a failed assertion on one rank leaves its peers waiting: end the run quickly
    if (rc < 0 || dsarl_comm_build(comm, &l, &par, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return EXIT_FAILURE;
    }
    dsarl_device_config dc = {.struct_size = sizeof dc, .parallel = &par, .threads = 1};
    if (cpu_create(&dc, &dev, &err) < 0 ||
        dsarl_dsa_reference_ops.create(&dsarl_cpu_device_ops, dev, NULL, &dsa, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return EXIT_FAILURE;
    }
    Suite *s = suite_create("glm5_tp_mpi");
    TCase *tc = tcase_create("tp");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_glm52_tp_matches_one_process);
    tcase_add_test(tc, test_glm51_real_head_dims_tp_matches_one_process);
    tcase_add_test(tc, test_refusal);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, par.world_rank == 0 ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    // every rank's verdict decides the exit: one failing rank fails the test
    int32_t any = failed;
    dsarl_group_all_reduce_host(par.world, &any, 1, DSARL_DTYPE_I32, DSARL_REDUCE_MAX, &err);
    dsarl_dsa_reference_ops.destroy(dsa);
    cpu_destroy(dev);
    dsarl_comm_finalize(comm);
    return any ? EXIT_FAILURE : EXIT_SUCCESS;
}
