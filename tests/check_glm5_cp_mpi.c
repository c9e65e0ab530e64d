/* check_glm5_cp_mpi.c: context parallelism inside the glm5 model, under mpirun, on the cpu device and the reference
 * DSA backend. Arguments: tp cp [ep] (default 1 2 1); the data-parallel size is what the world leaves. CI runs CP2
 * (-np 2), CP2 x EP2 (-np 2), CP2 x TP2 and CP4 (-np 4). Every rank is handed the whole packed batch (its data-parallel
 * pair's own) and also builds the one-process model (same config and seed) to compare:
 * - log-probs of every token (forward_logprobs, train_forward: each rank returns all of them, gathered over cp), max
 *   relative error 1e-5, and forward_logits;
 * - after a backward and a second, accumulated training pass: the indexer loss (the same on every rank) and every
 *   parameter gradient, summed over cp (each rank holds its own tokens' share), against the one-process gradient
 *   (its slice under tp);
 * - several AdamW steps through dsarl_trainer_optimizer_step (gradients reduced over dp_cp, the norm, clipping): the
 *   loss and gradient norm of every step and the weights after;
 * - cached decode (no cp: every rank decodes the same sequences) and the native engine's rollouts;
 * in both attention forms (absorbed, headwise), with and without activation recompute, on a tiny GLM-5.2 config
 * (IndexShare layers FSF, MoE with shared experts) and a GLM-5.1 one with GLM-5's real asymmetric head dims. Batches:
 * three short sequences whose lengths 2 cp does not divide (the model pads each), and a longer pack of unequal
 * segments, one far longer than index_topk, so the sparse selection drops keys across chunk boundaries. Also the
 * zigzag rows themselves, and refusals in one sentence: a target outside the vocabulary (named by its position in the
 * caller's batch), a layout without a cp group. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "cpu_device.h"
#include "dsa_reference.h"
#include "dsarl/trainer.h"
#include "glm5_cache.h"
#include "glm5_cp.h"
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
// embeddings and the dense indexer loss
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

// A model of the recipe (extra: more recipe text appended) under layout (NULL: one process); the create status.
static int create_model(const char *text, const char *extra, glm5_family family, const dsarl_parallel *layout,
                        dsarl_recipe **recipe, dsarl_model **m)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s%s", text, extra ? extra : "");
    ck_assert_int_eq(dsarl_recipe_load_string(buf, "cp.yaml", recipe, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(*recipe, &err), 0);
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(*recipe),
                             .device_ops = &dsarl_cpu_device_ops, .device = dev,
                             .dsa_ops = &dsarl_dsa_reference_ops, .dsa = dsa, .seed = 11, .parallel = layout};
    *m = NULL;
    return glm5_create_family(family, &mc, m, &err);
}

// Non-unit norm weights and non-zero router biases in both models (the whole tensor, then each one's shard).
static void perturb_vectors(dsarl_model *single, dsarl_model *cp)
{
    for (int64_t i = 0; i < single->n_params; i++) {
        const glm5_param *p = &single->params[i], *q = glm5_model_find_param(cp, p->name);
        ck_assert_ptr_nonnull(q);
        if (p->ndim != 1)
            continue;
        float *full = malloc((size_t)p->numel * sizeof(float)), *local = malloc((size_t)q->numel * sizeof(float));
        memcpy(full, (const float *)single->weights + p->offset, (size_t)p->numel * sizeof(float));
        for (int64_t j = 0; j < p->numel; j++)
            full[j] += 0.1f * sinf((float)(7 * i + 3 * j));
        glm5_param_take_shard(q, full, local);
        OK(glm5_upload_param(single, p, 0, full, (size_t)p->numel, &err));
        OK(glm5_upload_param(cp, q, 0, local, (size_t)q->numel, &err));
        free(full), free(local);
    }
}

// A random packed batch, its own per data-parallel rank (the cp ranks of a pair share it); some targets ignored.
enum { MAX_T = 48, MAX_SEQ = 6 };
typedef struct cp_batch {
    int32_t tokens[MAX_T], targets[MAX_T], cu[MAX_SEQ + 1];
    float dlogprobs[MAX_T];
    dsarl_token_batch b;
} cp_batch;

static void make_batch(cp_batch *b, int64_t V, uint64_t salt, int32_t dp_rank, const int32_t *lens, int32_t nseq)
{
    b->cu[0] = 0;
    for (int32_t s = 0; s < nseq; s++)
        b->cu[s + 1] = b->cu[s] + lens[s];
    int32_t n = b->cu[nseq];
    ck_assert_int_le(n, MAX_T);
    uint64_t s = mix(salt * 1000003u + (uint64_t)dp_rank * 7919u + 17u);
    for (int t = 0; t < n; t++) {
        s = mix(s);
        b->tokens[t] = (int32_t)(s % (uint64_t)V);
        s = mix(s);
        b->targets[t] = s % 7 == 0 ? -1 : (int32_t)((s >> 8) % (uint64_t)V);
        s = mix(s);
        b->dlogprobs[t] = ((float)((double)(s >> 11) / 9007199254740992.0) - 0.3f) / (float)n;
    }
    b->b = (dsarl_token_batch){.struct_size = sizeof(dsarl_token_batch), .n_tokens = n, .n_sequences = nseq,
                               .tokens = b->tokens, .cu_seqlens = b->cu, .logit_scale = salt % 2 ? 0.0f : 1.4f};
}

// three short sequences (2 cp divides none of them), and a longer pack, one segment much longer than index_topk
static const int32_t short_lens[3] = {5, 6, 5}, long_lens[4] = {7, 23, 1, 9};

static double world_max(double x)
{
    OK(dsarl_group_all_reduce_host(par.world, &x, 1, DSARL_DTYPE_F64, DSARL_REDUCE_MAX, &err));
    return x;
}

// Routed experts: each rank's gradient holds its own rows' share; the ranks that share a batch (tp x cp) sum it,
// unless ep spans them (then the expert all-to-all already brought every row to the shard's owner).
static bool experts_summed(void)
{
    return par.ep_size == 1;
}

// Every trainable gradient of the cp model, summed over cp (and tp for experts), against the slice of single's
// whole gradient; the worst tensor's error (max |diff| / max |ref|).
static double compare_grads(dsarl_model *single, dsarl_model *cpm, const char *what)
{
    double worst = 0;
    const char *worst_name = "";
    for (int64_t i = 0; i < cpm->n_params; i++) {
        const glm5_param *q = &cpm->params[i], *p = glm5_model_find_param(single, q->name);
        ck_assert_ptr_nonnull(p);
        if (!q->trainable)
            continue;
        float *ref = malloc((size_t)q->numel * sizeof(float)), *got = malloc((size_t)q->numel * sizeof(float));
        glm5_param_take_shard(q, (const float *)single->grads + p->offset, ref);
        memcpy(got, (const float *)cpm->grads + q->offset, (size_t)q->numel * sizeof(float));
        if (q->shard != GLM5_SHARD_EXPERT || experts_summed()) // each cp rank: its own tokens' share
            OK(dsarl_group_all_reduce_host(par.cp, got, q->numel, DSARL_DTYPE_F32, DSARL_REDUCE_SUM, &err));
        if (q->shard == GLM5_SHARD_EXPERT && experts_summed())
            OK(dsarl_group_all_reduce_host(par.tp, got, q->numel, DSARL_DTYPE_F32, DSARL_REDUCE_SUM, &err));
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
    ck_assert_msg(worst < 2e-5, "%s: gradient of %s differs from one process by %.3g", what, worst_name, worst);
    return worst;
}

// Cached decode (a prefill of two prompts, then decode steps): cp is not involved, every cp rank decodes the same.
static double compare_decode(dsarl_model *single, dsarl_model *cpm, const cp_batch *b)
{
    int64_t V = single->cfg.vocab_size;
    dsarl_model_cache *c1, *c2;
    OK(glm5_cache_create(single, 2, 12, &c1, &err));
    OK(glm5_cache_create(cpm, 2, 12, &c2, &err));
    int32_t slots[2] = {1, 0}, cu[3] = {0, 5, 9};
    float *l1 = malloc((size_t)(2 * V) * sizeof(float)), *l2 = malloc((size_t)(2 * V) * sizeof(float));
    dsarl_token_batch pre = {.struct_size = sizeof(pre), .n_tokens = 9, .n_sequences = 2, .tokens = b->tokens,
                             .cu_seqlens = cu};
    double worst = 0;
    for (int step = 0; step < 3; step++) {
        int32_t next[2], one[3] = {0, 1, 2};
        dsarl_token_batch dec = {.struct_size = sizeof(dec), .n_tokens = 2, .n_sequences = 2, .tokens = next,
                                 .cu_seqlens = one};
        const dsarl_token_batch *batch = &pre;
        if (step > 0) {
            for (int s = 0; s < 2; s++) {
                int32_t best = 0;
                for (int64_t v = 1; v < V; v++)
                    best = l1[s * V + v] > l1[s * V + best] ? (int32_t)v : best;
                next[s] = best;
            }
            batch = &dec;
        }
        OK(glm5_forward_cached(single, c1, batch, slots, l1, &err));
        OK(glm5_forward_cached(cpm, c2, batch, slots, l2, &err));
        worst = fmax(worst, max_rel_scaled(l2, l1, 2 * V));
    }
    glm5_cache_free(c1), glm5_cache_free(c2);
    free(l1), free(l2);
    return worst;
}

// One round on batch lens: log-probs, logits, a backward and an accumulated training pass, decode.
static void check_round(dsarl_model *single, dsarl_model *cpm, glm5_attention_form form, const char *what,
                        uint64_t salt, const int32_t *lens, int32_t nseq)
{
    single->attention_form = cpm->attention_form = form;
    int64_t V = single->cfg.vocab_size;
    cp_batch b;
    make_batch(&b, V, salt, par.dp_rank, lens, nseq);
    int32_t n = (int32_t)b.b.n_tokens;
    float lp1[MAX_T], lp2[MAX_T];
    OK(glm5_forward_logprobs(single, &b.b, b.targets, lp1, &err));
    OK(glm5_forward_logprobs(cpm, &b.b, b.targets, lp2, &err));
    double e_lp = max_rel(lp2, lp1, n, 1e-3);
    float *g1 = malloc((size_t)(n * V) * sizeof(float)), *g2 = malloc((size_t)(n * V) * sizeof(float));
    OK(glm5_forward_logits(single, &b.b, g1, &err));
    OK(glm5_forward_logits(cpm, &b.b, g2, &err));
    double e_logits = max_rel_scaled(g2, g1, n * V);
    free(g1), free(g2);
    float il1 = 0, il2 = 0, il1b = 0, il2b = 0;
    OK(glm5_zero_grad(single, &err));
    OK(glm5_zero_grad(cpm, &err));
    OK(glm5_backward(single, &b.b, b.targets, b.dlogprobs, &il1, &err));
    OK(glm5_backward(cpm, &b.b, b.targets, b.dlogprobs, &il2, &err));
    char label[160];
    snprintf(label, sizeof label, "%s, one backward", what);
    compare_grads(single, cpm, label);
    cp_batch b2;
    make_batch(&b2, V, salt + 99, par.dp_rank, lens, nseq);
    OK(glm5_train_forward(single, &b2.b, b2.targets, lp1, &err));
    OK(glm5_train_forward(cpm, &b2.b, b2.targets, lp2, &err));
    e_lp = fmax(e_lp, max_rel(lp2, lp1, n, 1e-3));
    OK(glm5_train_backward(single, b2.dlogprobs, &il1b, &err));
    OK(glm5_train_backward(cpm, b2.dlogprobs, &il2b, &err));
    snprintf(label, sizeof label, "%s, two accumulated", what);
    compare_grads(single, cpm, label);
    double e_il = fmax(fabs((double)il2 - il1) / fabs((double)il1), fabs((double)il2b - il1b) / fabs((double)il1b));
    double e_dec = compare_decode(single, cpm, &b);
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

// Rollouts of the native engine on both models: the same tokens on every rank as one process.
static double compare_generation(const dsarl_model_ops *ops, dsarl_model *single, dsarl_model *cpm)
{
    int32_t tokens[7] = {3, 9, 1, 4, 8, 2, 6}, cu[3] = {0, 4, 7};
    dsarl_token_batch prompts = {.struct_size = sizeof(prompts), .n_tokens = 7, .n_sequences = 2, .tokens = tokens,
                                 .cu_seqlens = cu};
    dsarl_sampling_params sp = {.struct_size = sizeof(sp), .temperature = 0.8f, .top_p = 0.9f, .top_k = 8,
                                .max_new_tokens = 5, .seed = 5};
    dsarl_generator *g1, *g2;
    dsarl_generation_result r1, r2;
    OK(native_create(NULL, ops, single, &g1, &err));
    OK(native_create(NULL, ops, cpm, &g2, &err));
    OK(native_generate(g1, &prompts, &sp, &r1, &err));
    OK(native_generate(g2, &prompts, &sp, &r2, &err));
    ck_assert_int_eq(r1.cu_lengths[2], r2.cu_lengths[2]);
    int32_t n = r1.cu_lengths[2];
    for (int32_t i = 0; i < n; i++)
        ck_assert_msg(r1.tokens[i] == r2.tokens[i], "completion token %d is %d, one process %d", i, r2.tokens[i],
                      r1.tokens[i]);
    double e = max_rel(r2.logprobs, r1.logprobs, n, 1e-2);
    native_destroy(g1), native_destroy(g2);
    return e;
}

static double max_weight_diff(dsarl_model *single, dsarl_model *cpm)
{
    double worst = 0;
    for (int64_t i = 0; i < cpm->n_params; i++) {
        const glm5_param *q = &cpm->params[i], *p = glm5_model_find_param(single, q->name);
        float *ref = malloc((size_t)q->numel * sizeof(float));
        glm5_param_take_shard(q, (const float *)single->weights + p->offset, ref);
        const float *got = (const float *)cpm->weights + q->offset;
        double big = 1e-30, d = 0;
        for (int64_t j = 0; j < q->numel; j++)
            big = fmax(big, fabs(ref[j])), d = fmax(d, fabs((double)got[j] - ref[j]));
        worst = fmax(worst, d / big);
        free(ref);
    }
    return worst;
}

// AdamW steps: every data-parallel share is one microbatch of one process's step (the one process runs them all),
// the cp model its own pair's; loss (sum of dlogprobs x log-probs plus the indexer loss), norm and weights compared.
static void check_steps(const dsarl_model_ops *ops, dsarl_model *single, dsarl_model *cpm, const char *what)
{
    enum { STEPS = 3 };
    dsarl_optimizer_params adam = {.struct_size = sizeof adam, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                                   .weight_decay = 0.1};
    double e_loss = 0, e_norm = 0;
    int64_t V = single->cfg.vocab_size;
    for (int step = 0; step < STEPS; step++) {
        OK(glm5_zero_grad(single, &err));
        OK(glm5_zero_grad(cpm, &err));
        double loss1 = 0, loss2 = 0;
        for (int32_t r = 0; r < par.dp_size; r++) {
            cp_batch b;
            make_batch(&b, V, 500 + (uint64_t)step, r, step % 2 ? long_lens : short_lens, step % 2 ? 4 : 3);
            for (int64_t t = 0; t < b.b.n_tokens; t++) // the global normalisation: every share's tokens
                b.dlogprobs[t] /= (float)par.dp_size;
            float lp[MAX_T], il = 0;
            for (int which = 0; which < 2; which++) {
                if (which == 1 && r != par.dp_rank)
                    continue;
                dsarl_model *m = which ? cpm : single;
                OK(glm5_train_forward(m, &b.b, b.targets, lp, &err));
                OK(glm5_train_backward(m, b.dlogprobs, &il, &err));
                double loss = il;
                for (int64_t t = 0; t < b.b.n_tokens; t++)
                    loss += (double)b.dlogprobs[t] * lp[t];
                *(which ? &loss2 : &loss1) += loss;
            }
        }
        OK(dsarl_group_all_reduce_host(par.dp, &loss2, 1, DSARL_DTYPE_F64, DSARL_REDUCE_SUM, &err));
        double n1, n2;
        OK(dsarl_trainer_optimizer_step(ops, single, &adam, 3e-3, 0.05, &n1, &err));
        OK(dsarl_trainer_optimizer_step(ops, cpm, &adam, 3e-3, 0.05, &n2, &err));
        ck_assert_msg(n1 > 0.05, "the gradient norm %g should exceed the clip threshold", n1);
        e_loss = fmax(e_loss, fabs(loss2 - loss1) / fabs(loss1));
        e_norm = fmax(e_norm, fabs(n2 - n1) / n1);
    }
    double e_w = max_weight_diff(single, cpm);
    e_loss = world_max(e_loss), e_norm = world_max(e_norm), e_w = world_max(e_w);
    if (par.world_rank == 0)
        fprintf(stderr, "  %s: %d AdamW steps, worst rank: loss %.3g, gradient norm %.3g, weights %.3g\n", what,
                STEPS, e_loss, e_norm, e_w);
    ck_assert_msg(e_loss < 1e-5 && e_norm < 1e-5, "%s: loss %.3g / norm %.3g differ from one process", what, e_loss,
                  e_norm);
    // AdamW divides each step by sqrt(v): where a gradient element is near zero, its float32 rounding differences
    // between layouts (about 1e-6 here) move the step by much more; 1e-4 is 1% of the STEPS x lr the weights travel
    ck_assert_msg(e_w < 1e-4, "%s: weights after %d steps differ from one process by %.3g", what, STEPS, e_w);
}

static void check_config(const char *text, glm5_family family, const char *name, bool thorough)
{
    dsarl_recipe *r1, *r2;
    dsarl_model *single, *cpm;
    OK(create_model(text, NULL, family, NULL, &r1, &single));
    OK(create_model(text, NULL, family, &par, &r2, &cpm));
    perturb_vectors(single, cpm);
    char what[128];
    snprintf(what, sizeof what, "%s absorbed, 3 short sequences", name);
    check_round(single, cpm, GLM5_FORM_ABSORBED, what, 1, short_lens, 3);
    snprintf(what, sizeof what, "%s absorbed, 4 segments (7, 23, 1, 9 tokens)", name);
    check_round(single, cpm, GLM5_FORM_ABSORBED, what, 2, long_lens, 4);
    snprintf(what, sizeof what, "%s headwise, 4 segments", name);
    check_round(single, cpm, GLM5_FORM_HEADWISE, what, 4, long_lens, 4);
    if (thorough) {
        single->activation_recompute = cpm->activation_recompute = true;
        snprintf(what, sizeof what, "%s headwise, activation recompute, 3 short sequences", name);
        check_round(single, cpm, GLM5_FORM_HEADWISE, what, 5, short_lens, 3);
        snprintf(what, sizeof what, "%s absorbed, activation recompute, 4 segments", name);
        check_round(single, cpm, GLM5_FORM_ABSORBED, what, 3, long_lens, 4);
        single->activation_recompute = cpm->activation_recompute = false;
    }
    single->attention_form = cpm->attention_form = GLM5_FORM_ABSORBED;
    const dsarl_model_ops *ops = family == GLM5_FAMILY_51 ? &glm5_1_model_ops : &glm5_2_model_ops;
    double e_gen = world_max(compare_generation(ops, single, cpm));
    if (par.world_rank == 0)
        fprintf(stderr, "  %s native generation: same tokens; log-probs %.3g\n", name, e_gen);
    ck_assert_msg(e_gen < 1e-5, "%s: rollout log-probs differ by %.3g", name, e_gen);
    check_steps(ops, single, cpm, name);
    glm5_model_free(single), glm5_model_free(cpm);
    dsarl_recipe_free(r1), dsarl_recipe_free(r2);
}

START_TEST(test_glm52_cp_matches_one_process) { check_config(glm52_recipe, GLM5_FAMILY_52, "glm5.2", true); }
END_TEST

START_TEST(test_glm51_real_head_dims_cp_matches_one_process)
{
    check_config(glm51_recipe, GLM5_FAMILY_51, "glm5.1", false);
}
END_TEST

// The rows a rank takes: per sequence (padded to a multiple of 2 cp) chunks r and 2 cp - 1 - r, global positions and
// causal ranges, pads (id 0, caller row -1) only past a sequence's end; every global row on exactly one rank.
START_TEST(test_zigzag_rows)
{
    dsarl_recipe *r;
    dsarl_model *m;
    OK(create_model(glm52_recipe, NULL, GLM5_FAMILY_52, &par, &r, &m));
    cp_batch b;
    make_batch(&b, m->cfg.vocab_size, 3, par.dp_rank, long_lens, 4);
    glm5_pass p;
    memset(&p, 0, sizeof p);
    p.m = m;
    const dsarl_token_batch *padded;
    OK(glm5_cp_prepare(&p, &b.b, &padded, &err));
    const glm5_cp *c = p.cp;
    int32_t cp = par.cp_size, me = par.cp_rank, two = 2 * cp;
    ck_assert_int_eq(p.T, c->T_local);
    ck_assert_int_eq(c->T_local * cp, c->T_keys);
    ck_assert_int_eq(c->T_local % par.tp_size, 0);
    ck_assert_int_eq(c->T_caller, b.b.n_tokens);
    const int32_t *tok = c->host, *pos = tok + c->T_local, *ks = tok + 2 * c->T_local, *ke = tok + 3 * c->T_local;
    int64_t i = 0, padded_start = 0;
    for (int32_t s = 0; s < 4; s++) {
        int32_t len = long_lens[s], chunk = (len + two - 1) / two;
        ck_assert_int_eq(padded->cu_seqlens[s], padded_start);
        for (int32_t half = 0; half < 2; half++)
            for (int32_t j = 0; j < chunk; j++, i++) {
                int32_t want = (half == 0 ? me : two - 1 - me) * chunk + j; // position in the sequence
                ck_assert_int_eq(pos[i], want);
                ck_assert_int_eq(ks[i], padded_start);
                ck_assert_int_eq(ke[i], padded_start + want + 1);
                bool real = want < len;
                ck_assert_int_eq(c->caller_row[i], real ? b.cu[s] + want : -1);
                ck_assert_int_eq(tok[i], real ? b.tokens[b.cu[s] + want] : 0);
            }
        padded_start += (int64_t)two * chunk;
    }
    ck_assert_int_le(i, c->T_local); // the rest: a pad segment that makes the rows split over tp
    for (; i < c->T_local; i++)
        ck_assert_int_eq(c->caller_row[i], -1);
    // the key rows of every rank together: each global row once
    int32_t *mine = malloc((size_t)c->T_local * sizeof(int32_t)), *all = malloc((size_t)c->T_keys * sizeof(int32_t));
    int8_t *seen = calloc((size_t)c->T_keys, 1);
    for (int64_t t = 0; t < c->T_local; t++)
        mine[t] = ke[t] - 1;
    OK(dsarl_group_all_gather_host(par.cp, all, mine, c->T_local, DSARL_DTYPE_I32, &err));
    for (int64_t t = 0; t < c->T_keys; t++) {
        ck_assert(all[t] >= 0 && all[t] < c->T_keys && !seen[all[t]]);
        seen[all[t]] = 1;
    }
    free(mine), free(all), free(seen);
    glm5_pass_free(&p);
    // a tp the chunks do not divide (5: layout arithmetic only, no pass runs): one more segment of pad chunks after
    // the sequences, its own causal segment from position 0, takes the rank's rows to a multiple of it
    int32_t tp = m->shards.tp_size;
    m->shards.tp_size = 5;
    memset(&p, 0, sizeof p);
    p.m = m;
    OK(glm5_cp_prepare(&p, &b.b, &padded, &err));
    c = p.cp;
    ck_assert_int_eq(c->T_local % 5, 0);
    ck_assert_int_eq(padded->n_sequences, 5);
    int32_t last = padded->cu_seqlens[4], chunk = (padded->cu_seqlens[5] - last) / two;
    ck_assert_int_gt(chunk, 0);
    tok = c->host, pos = tok + c->T_local, ks = tok + 2 * c->T_local, ke = tok + 3 * c->T_local;
    for (i = c->T_local - 2 * chunk; i < c->T_local; i++) {
        int64_t j = i - (c->T_local - 2 * chunk);
        int32_t want = (j < chunk ? me * chunk + (int32_t)j : (two - 1 - me) * chunk + (int32_t)(j - chunk));
        ck_assert_int_eq(c->caller_row[i], -1);
        ck_assert_int_eq(pos[i], want);
        ck_assert_int_eq(ks[i], last);
        ck_assert_int_eq(ke[i], last + want + 1);
    }
    glm5_pass_free(&p);
    m->shards.tp_size = tp;
    glm5_model_free(m);
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_refusals)
{
    dsarl_recipe *r;
    dsarl_model *m;
    // a target outside the vocabulary, named by its position in the caller's batch
    OK(create_model(glm52_recipe, NULL, GLM5_FAMILY_52, &par, &r, &m));
    cp_batch b;
    make_batch(&b, m->cfg.vocab_size, 7, par.dp_rank, short_lens, 3);
    b.targets[12] = (int32_t)m->cfg.vocab_size;
    float lp[MAX_T];
    ck_assert_int_eq(glm5_forward_logprobs(m, &b.b, b.targets, lp, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "target id 64 at position 12"), "%s", err.message);
    glm5_model_free(m);
    dsarl_recipe_free(r);
    // a layout of cp > 1 without its process group (a core without the ABI 1.3 groups)
    dsarl_parallel no_group = par;
    no_group.cp = NULL;
    ck_assert_int_eq(create_model(glm52_recipe, NULL, GLM5_FAMILY_52, &no_group, &r, &m), DSARL_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.message, "context parallelism") && strstr(err.message, "process groups"), "%s",
                  err.message);
    dsarl_recipe_free(r);
}
END_TEST

int main(int argc, char **argv)
{
    dsarl_error_clear(&err);
    if (!dsarl_comm_launched()) {
        fprintf(stderr, "check_glm5_cp_mpi runs under mpirun\n");
        return 77;
    }
    if (dsarl_comm_init(&comm, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return EXIT_FAILURE;
    }
    int32_t world = dsarl_comm_world_size(comm);
    int32_t tp = argc > 1 ? atoi(argv[1]) : 1, cp = argc > 2 ? atoi(argv[2]) : 2, ep = argc > 3 ? atoi(argv[3]) : 1;
    dsarl_layout l;
    int rc = dsarl_layout_make(world, tp, 1, cp, ep, &l, &err);
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
    if (par.world_rank == 0)
        fprintf(stderr, "glm5 cp: TP%d x CP%d x DP%d, EP%d\n", par.tp_size, par.cp_size, par.dp_size, par.ep_size);
    Suite *s = suite_create("glm5_cp_mpi");
    TCase *tc = tcase_create("cp");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_glm52_cp_matches_one_process);
    tcase_add_test(tc, test_glm51_real_head_dims_cp_matches_one_process);
    tcase_add_test(tc, test_zigzag_rows);
    tcase_add_test(tc, test_refusals);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, par.world_rank == 0 ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    int32_t any = failed;
    dsarl_group_all_reduce_host(par.world, &any, 1, DSARL_DTYPE_I32, DSARL_REDUCE_MAX, &err);
    dsarl_dsa_reference_ops.destroy(dsa);
    cpu_destroy(dev);
    dsarl_comm_finalize(comm);
    return any ? EXIT_FAILURE : EXIT_SUCCESS;
}
