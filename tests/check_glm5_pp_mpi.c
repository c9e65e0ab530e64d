/* check_glm5_pp_mpi.c: pipeline parallelism inside the glm5 model, under `mpirun -np 2` (PP2), `-np 4 ... pp4` (PP4,
 * every stage one layer: middle stages talk to both neighbours), `-np 4` (PP2 x TP2 with sequence parallelism),
 * `-np 2 ... vpp2` / `-np 4 ... vpp2` (PP2 / PP4 x VPP2: one-layer model chunks in Megatron's interleaved order and
 * schedule, the pp group a ring) and `-np 4 ... cp2` (PP2 x CP2: each stage on its cp rank's zigzag rows), on the cpu
 * device and the reference DSA backend. Every rank also builds the
 * one-process model (same config and seed, so the same weights) and compares:
 * - log-probabilities (forward_logprobs and train_forward) and forward_logits of a fresh random batch on every rank,
 *   max relative error 1e-5;
 * - the indexer loss and every gradient of this stage's parameters after a backward and an accumulated training
 *   pass (2e-5 per tensor), then the gradient norm of three AdamW steps and the weights after them;
 * - cached decode logits (prefill, then decode steps) and the native engine's rollouts: the same tokens;
 * - the 1F1B schedule of dsarl_trainer_train_microbatches (more microbatches than stages, fewer, recompute);
 * - a Hugging Face save of the staged model loaded by one process, and the reverse;
 * on a GLM-5.2 config split evenly (the second stage starts on a full indexer layer), the same config split 1|3
 * (the second stage starts on an IndexShare shared layer: it receives the top-k of layer 0 with the activations),
 * and a GLM-5.1 config with GLM-5's real head dims and tied embeddings split 2|1 (the embedding's two copies, the
 * first stage's input and the last one's LM head, get the sum of both gradients). Layouts the model cannot split
 * are refused in one sentence naming the keys. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm_internal.h"
#include "cpu_device.h"
#include "dsa_reference.h"
#include "dsarl/fileutil.h"
#include "dsarl/trainer.h"
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

// 4 layers F S F S, MoE from layer 1 (a shared layer reuses the full layer before it)
static const char *glm52_recipe =
    "policy:\n"
    "  model_config:\n"
    "    vocab_size: 64\n    hidden_size: 16\n    intermediate_size: 24\n    moe_intermediate_size: 6\n"
    "    num_hidden_layers: 4\n    num_attention_heads: 4\n    num_key_value_heads: 4\n    q_lora_rank: 12\n"
    "    kv_lora_rank: 8\n    qk_nope_head_dim: 4\n    qk_rope_head_dim: 4\n    v_head_dim: 6\n"
    "    n_routed_experts: 8\n    num_experts_per_tok: 2\n    n_group: 2\n    topk_group: 2\n    index_topk: 3\n"
    "    index_head_dim: 8\n    index_n_heads: 3\n    first_k_dense_replace: 1\n    index_topk_pattern: FSFS\n"
    "    n_shared_experts: 2\n    initializer_range: 0.35\n"
    "  megatron_cfg:\n%s    model_overrides:\n      dsa_indexer_loss_coeff: 0.25\n";

// GLM-5's head dims with few heads and a tiny hidden size; tied embeddings and the dense indexer loss
static const char *glm51_recipe =
    "policy:\n"
    "  model_config:\n"
    "    vocab_size: 32\n    hidden_size: 16\n    intermediate_size: 8\n    moe_intermediate_size: 4\n"
    "    num_hidden_layers: 3\n    num_attention_heads: 4\n    num_key_value_heads: 4\n    q_lora_rank: 16\n"
    "    kv_lora_rank: 512\n    qk_nope_head_dim: 192\n    qk_rope_head_dim: 64\n    v_head_dim: 256\n"
    "    n_routed_experts: 4\n    num_experts_per_tok: 2\n    n_group: 1\n    topk_group: 1\n    index_topk: 4\n"
    "    index_head_dim: 64\n    index_n_heads: 2\n    first_k_dense_replace: 1\n"
    "    n_shared_experts: 1\n    initializer_range: 0.1\n    tie_word_embeddings: true\n"
    "  megatron_cfg:\n%s    model_overrides:\n      dsa_indexer_loss_coeff: 0.5\n      dsa_indexer_use_sparse_loss: false\n";

// The staged models' extra megatron_cfg lines of the run's mode (virtual stages: their size).
static const char *layout_extra = "";

// A model of the recipe template (its megatron_cfg lines `extra`) under layout (NULL: one process).
static int create_model(const char *tmpl, const char *extra, glm5_family family, const dsarl_parallel *layout,
                        dsarl_recipe **recipe, dsarl_model **m)
{
    char text[4096], lines[512];
    snprintf(lines, sizeof lines, "%s%s", extra, layout ? layout_extra : "");
    snprintf(text, sizeof text, tmpl, lines);
    ck_assert_int_eq(dsarl_recipe_load_string(text, "pp.yaml", recipe, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(*recipe, &err), 0);
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(*recipe),
                             .device_ops = &dsarl_cpu_device_ops, .device = dev,
                             .dsa_ops = &dsarl_dsa_reference_ops, .dsa = dsa, .seed = 11, .parallel = layout};
    *m = NULL;
    return glm5_create_family(family, &mc, m, &err);
}

// A random packed batch of three sequences, the same on every rank: T = 16 tokens, or 15 (odd: padded under tp).
enum { T = 16, NSEQ = 3 };
typedef struct pp_batch {
    int32_t tokens[T], targets[T], cu[NSEQ + 1];
    float dlogprobs[T];
    dsarl_token_batch b;
} pp_batch;

static void make_batch(pp_batch *b, int64_t V, uint64_t salt, int32_t n)
{
    const int32_t cu[NSEQ + 1] = {0, 5, 11, n};
    memcpy(b->cu, cu, sizeof cu);
    uint64_t s = mix(salt * 1000003u + 17u);
    for (int t = 0; t < T; t++) {
        s = mix(s);
        b->tokens[t] = (int32_t)(s % (uint64_t)V);
        s = mix(s);
        b->targets[t] = s % 7 == 0 ? -1 : (int32_t)((s >> 8) % (uint64_t)V);
        s = mix(s);
        b->dlogprobs[t] = (float)((double)(s >> 11) / 9007199254740992.0) - 0.3f;
    }
    b->b = (dsarl_token_batch){.struct_size = sizeof(dsarl_token_batch), .n_tokens = n, .n_sequences = NSEQ,
                               .tokens = b->tokens, .cu_seqlens = b->cu, .logit_scale = salt % 2 ? 0.0f : 1.4f};
}

static double world_max(double x)
{
    OK(dsarl_group_all_reduce_host(par.world, &x, 1, DSARL_DTYPE_F64, DSARL_REDUCE_MAX, &err));
    return x;
}

// Every parameter of the staged model (values, or gradients) against this rank's slice of single's whole tensor;
// returns the worst tensor's max |diff| / max |ref|.
static double compare_params(dsarl_model *single, dsarl_model *pp, bool grads, double tol, const char *what)
{
    double worst = 0;
    const char *worst_name = "";
    for (int64_t i = 0; i < pp->n_params; i++) {
        const glm5_param *q = &pp->params[i], *p = glm5_model_find_param(single, q->name);
        ck_assert_ptr_nonnull(p);
        if (grads && !q->trainable)
            continue;
        const float *src = (const float *)(grads ? single->grads : single->weights);
        float *ref = malloc((size_t)q->numel * sizeof(float)), *got = malloc((size_t)q->numel * sizeof(float));
        glm5_param_take_shard(q, src + p->offset, ref);
        memcpy(got, (const float *)(grads ? pp->grads : pp->weights) + q->offset, (size_t)q->numel * sizeof(float));
        double scale = 0, diff = 0;
        for (int64_t j = 0; j < q->numel; j++)
            scale = fmax(scale, fabs(ref[j])), diff = fmax(diff, fabs((double)got[j] - ref[j]));
        if (scale == 0.0)
            ck_assert_msg(diff < 1e-12, "%s: %s is 0 in one process but %g here", what, q->name, diff);
        else if (diff / scale > worst)
            worst = diff / scale, worst_name = q->name;
        free(ref), free(got);
    }
    double everywhere = world_max(worst);
    if (par.world_rank == 0)
        fprintf(stderr, "  %s: worst tensor %.3g on any rank (rank 0: %s)\n", what, everywhere, worst_name);
    ck_assert_msg(worst < tol, "%s: %s differs from one process by %.3g", what, worst_name, worst);
    return worst;
}

// Cached decode: a prefill of two prompts, then three greedy decode steps, logits against one process.
static double compare_decode(dsarl_model *single, dsarl_model *pp, const pp_batch *b)
{
    int64_t V = single->cfg.vocab_size;
    dsarl_model_cache *c1, *c2;
    OK(glm5_cache_create(single, 2, 12, &c1, &err));
    OK(glm5_cache_create(pp, 2, 12, &c2, &err));
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
        OK(glm5_forward_cached(pp, c2, batch, slots, l2, &err));
        worst = fmax(worst, max_rel_scaled(l2, l1, 2 * V));
    }
    glm5_cache_free(c1), glm5_cache_free(c2);
    free(l1), free(l2);
    return worst;
}

// Rollouts of the native engine on both models: the same tokens, log-probs within 1e-5.
static double compare_generation(const dsarl_model_ops *ops, dsarl_model *single, dsarl_model *pp, float temp)
{
    int32_t tokens[7] = {3, 9, 1, 4, 8, 2, 6}, cu[3] = {0, 4, 7};
    dsarl_token_batch prompts = {.struct_size = sizeof(prompts), .n_tokens = 7, .n_sequences = 2, .tokens = tokens,
                                 .cu_seqlens = cu};
    dsarl_sampling_params sp = {.struct_size = sizeof(sp), .temperature = temp, .top_p = 0.9f, .top_k = 8,
                                .max_new_tokens = 6, .seed = 5};
    dsarl_generator *g1, *g2;
    dsarl_generation_result r1, r2;
    OK(native_create(NULL, ops, single, &g1, &err));
    OK(native_create(NULL, ops, pp, &g2, &err));
    OK(native_generate(g1, &prompts, &sp, &r1, &err));
    OK(native_generate(g2, &prompts, &sp, &r2, &err));
    ck_assert_int_eq(r1.cu_lengths[2], r2.cu_lengths[2]);
    int32_t n = r1.cu_lengths[2];
    for (int32_t i = 0; i < n; i++)
        ck_assert_msg(r1.tokens[i] == r2.tokens[i], "temperature %g: completion token %d is %d, one process %d",
                      (double)temp, i, r2.tokens[i], r1.tokens[i]);
    double e = max_rel(r2.logprobs, r1.logprobs, n, 1e-2);
    native_destroy(g1), native_destroy(g2);
    return e;
}

// Log-probs, logits, a backward and an accumulated training pass on batches of n tokens.
static void check_round(dsarl_model *single, dsarl_model *pp, const char *what, uint64_t salt, int32_t n)
{
    int64_t V = single->cfg.vocab_size;
    pp_batch b, b2;
    make_batch(&b, V, salt, n);
    make_batch(&b2, V, salt + 99, n);
    float lp1[T], lp2[T];
    OK(glm5_forward_logprobs(single, &b.b, b.targets, lp1, &err));
    OK(glm5_forward_logprobs(pp, &b.b, b.targets, lp2, &err));
    double e_lp = max_rel(lp2, lp1, n, 1e-3);
    float *g1 = malloc((size_t)(n * V) * sizeof(float)), *g2 = malloc((size_t)(n * V) * sizeof(float));
    OK(glm5_forward_logits(single, &b.b, g1, &err));
    OK(glm5_forward_logits(pp, &b.b, g2, &err));
    double e_logits = max_rel_scaled(g2, g1, n * V);
    free(g1), free(g2);
    float il1 = 0, il2 = 0, il1b = 0, il2b = 0;
    OK(glm5_zero_grad(single, &err));
    OK(glm5_zero_grad(pp, &err));
    OK(glm5_backward(single, &b.b, b.targets, b.dlogprobs, &il1, &err));
    OK(glm5_backward(pp, &b.b, b.targets, b.dlogprobs, &il2, &err));
    OK(glm5_train_forward(single, &b2.b, b2.targets, lp1, &err));
    OK(glm5_train_forward(pp, &b2.b, b2.targets, lp2, &err));
    e_lp = fmax(e_lp, max_rel(lp2, lp1, n, 1e-3));
    OK(glm5_train_backward(single, b2.dlogprobs, &il1b, &err));
    OK(glm5_train_backward(pp, b2.dlogprobs, &il2b, &err));
    // the tied embedding's two ends are summed with the data-parallel reduction, which under tp also completes the
    // routed experts' gradients (each tp rank saw its own rows: edp spans the tp ranks of a stage)
    OK(glm5_2_model_ops.reduce_gradients(pp, &err));
    char label[160];
    snprintf(label, sizeof label, "%s, gradients of two passes", what);
    compare_params(single, pp, true, 2e-5, label);
    double e_il = fmax(fabs((double)il2 - il1) / fabs((double)il1), fabs((double)il2b - il1b) / fabs((double)il1b));
    double e_dec = compare_decode(single, pp, &b);
    double any_lp = world_max(e_lp), any_logits = world_max(e_logits), any_il = world_max(e_il);
    double any_dec = world_max(e_dec);
    if (par.world_rank == 0)
        fprintf(stderr, "  %s, worst rank: log-probs %.3g, logits %.3g, indexer loss %.3g (%.7g), decode logits "
                "%.3g\n", what, any_lp, any_logits, any_il, (double)il1, any_dec);
    ck_assert_msg(e_lp < 1e-5, "%s: log-probs differ from one process by %.3g (relative)", what, e_lp);
    ck_assert_msg(e_logits < 1e-5, "%s: logits differ from one process by %.3g", what, e_logits);
    ck_assert_msg(il1 > 0 && e_il < 1e-5, "%s: indexer loss %g vs one process %g", what, (double)il2, (double)il1);
    ck_assert_msg(e_dec < 1e-5, "%s: cached decode logits differ from one process by %.3g", what, e_dec);
}

// Three AdamW steps, each on two accumulated training passes: gradient norms and then the weights.
static void check_steps(const dsarl_model_ops *ops, dsarl_model *single, dsarl_model *pp, const char *what)
{
    dsarl_optimizer_params adam = {.struct_size = sizeof adam, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                                   .weight_decay = 0.01};
    int64_t V = single->cfg.vocab_size;
    for (int step = 0; step < 3; step++) {
        OK(ops->zero_grad(single, &err));
        OK(ops->zero_grad(pp, &err));
        for (int mb = 0; mb < 2; mb++) {
            pp_batch b;
            make_batch(&b, V, 1000 + 10 * (uint64_t)step + (uint64_t)mb, T);
            float lp1[T], lp2[T];
            OK(dsarl_trainer_train_forward(ops, single, &b.b, b.targets, lp1, NULL, &err));
            OK(dsarl_trainer_train_forward(ops, pp, &b.b, b.targets, lp2, NULL, &err));
            OK(dsarl_trainer_train_backward(ops, single, &b.b, b.targets, b.dlogprobs, NULL, &err));
            OK(dsarl_trainer_train_backward(ops, pp, &b.b, b.targets, b.dlogprobs, NULL, &err));
        }
        double n1, n2;
        OK(dsarl_trainer_optimizer_step(ops, single, &adam, 3e-3, 0.05, &n1, &err));
        OK(dsarl_trainer_optimizer_step(ops, pp, &adam, 3e-3, 0.05, &n2, &err));
        double e = world_max(fabs(n2 - n1) / n1);
        if (par.world_rank == 0)
            fprintf(stderr, "  %s: step %d gradient norm %.7g, worst rank's relative difference %.3g\n", what, step,
                    n1, e);
        ck_assert_msg(e < 1e-5, "%s: step %d gradient norm %.9g vs one process %.9g", what, step, n2, n1);
    }
    char label[160];
    snprintf(label, sizeof label, "%s, weights after 3 AdamW steps", what);
    // under tp or cp the gradients differ in fp32 summation order, and AdamW's normalised step turns that into up to a
    // few 1e-5 of lr-sized differences where a gradient is near zero (no pipeline arithmetic is involved)
    compare_params(single, pp, false, par.tp_size > 1 || par.cp_size > 1 ? 2e-4 : 2e-5, label);
}

// A save of the staged model loaded by one process, and one process's save loaded into the stages.
static void check_hf_round_trip(const char *tmpl, const char *extra, glm5_family family, dsarl_model *single,
                                dsarl_model *pp)
{
    char dir[256] = "/tmp/dsarl_pp_hf_XXXXXX";
    if (par.world_rank == 0)
        ck_assert_ptr_nonnull(mkdtemp(dir));
    OK(dsarl_group_broadcast_host(par.world, dir, (int64_t)sizeof dir, DSARL_DTYPE_U8, 0, &err));
    char staged[300], whole[300];
    snprintf(staged, sizeof staged, "%s/staged", dir);
    snprintf(whole, sizeof whole, "%s/whole", dir);
    OK(glm5_save_hf(pp, staged, &err));
    if (par.world_rank == 0)
        OK(glm5_save_hf(single, whole, &err));
    OK(dsarl_group_barrier(par.world, &err));
    // one process reads the staged save: every tensor equal to the stages' own weights (each rank checks its shard)
    dsarl_model *back;
    dsarl_recipe *r;
    char text[4096];
    snprintf(text, sizeof text, tmpl, extra);
    ck_assert_int_eq(dsarl_recipe_load_string(text, "pp.yaml", &r, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(r, &err), 0);
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(r), .model_dir = staged,
                             .device_ops = &dsarl_cpu_device_ops, .device = dev,
                             .dsa_ops = &dsarl_dsa_reference_ops, .dsa = dsa, .seed = 11};
    OK(glm5_create_family(family, &mc, &back, &err));
    ck_assert_int_eq(back->n_weights, single->n_weights);
    for (int64_t i = 0; i < pp->n_params; i++) {
        const glm5_param *q = &pp->params[i], *p = glm5_model_find_param(back, q->name);
        float *ref = malloc((size_t)q->numel * sizeof(float));
        glm5_param_take_shard(q, (const float *)back->weights + p->offset, ref);
        ck_assert_msg(memcmp((const float *)pp->weights + q->offset, ref, (size_t)q->numel * sizeof(float)) == 0,
                      "the staged save's %s differs from stage %d's", q->name, pp->stage.rank);
        free(ref);
    }
    glm5_model_free(back);
    // the stages read one process's save (only their own tensors), under the staged recipe
    dsarl_recipe *staged_recipe;
    char lines[512];
    snprintf(lines, sizeof lines, "%s%s", extra, layout_extra);
    snprintf(text, sizeof text, tmpl, lines);
    ck_assert_int_eq(dsarl_recipe_load_string(text, "pp.yaml", &staged_recipe, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(staged_recipe, &err), 0);
    mc.model_dir = whole, mc.parallel = &par, mc.recipe = dsarl_recipe_root(staged_recipe);
    OK(glm5_create_family(family, &mc, &back, &err));
    for (int64_t i = 0; i < back->n_params; i++) {
        const glm5_param *q = &back->params[i], *p = glm5_model_find_param(single, q->name);
        float *ref = malloc((size_t)q->numel * sizeof(float));
        glm5_param_take_shard(q, (const float *)single->weights + p->offset, ref);
        ck_assert_msg(memcmp((const float *)back->weights + q->offset, ref, (size_t)q->numel * sizeof(float)) == 0,
                      "stage %d's %s read from one process's save differs", back->stage.rank, q->name);
        free(ref);
    }
    glm5_model_free(back);
    dsarl_recipe_free(r), dsarl_recipe_free(staged_recipe);
    OK(dsarl_group_barrier(par.world, &err));
    if (par.world_rank == 0) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        ck_assert_int_eq(system(cmd), 0);
    }
}

// starts: the first layer of each virtual stage the split must give (vpp x pp + 1 entries; vpp 1: the stages).
static void check_config(const char *tmpl, const char *extra, glm5_family family, const char *name,
                         const int32_t *starts)
{
    dsarl_recipe *r1, *r2;
    dsarl_model *single, *pp;
    OK(create_model(tmpl, extra, family, NULL, &r1, &single));
    OK(create_model(tmpl, extra, family, &par, &r2, &pp));
    // this stage's layers only: the split the recipe asks for
    ck_assert_int_eq(pp->stage.size, par.pp_size);
    ck_assert_int_eq(pp->stage.chunks, dsarl_parallel_vpp(&par));
    for (int32_t k = 0; k <= pp->stage.chunks * par.pp_size; k++)
        ck_assert_msg(pp->stage.starts[k] == starts[k], "%s: virtual stage %d starts at layer %d, not %d", name, k,
                      pp->stage.starts[k], starts[k]);
    ck_assert(pp->n_params < single->n_params);
    for (int64_t i = 0; i < pp->n_params; i++)
        ck_assert(pp->params[i].layer < 0 || glm5_stage_has_layer(pp, pp->params[i].layer));
    ck_assert((glm5_model_find_param(pp, "model.embed_tokens.weight") != NULL) ==
              (par.pp_rank == 0 || pp->cfg.tie_word_embeddings));
    ck_assert((glm5_model_find_param(pp, "model.norm.weight") != NULL) == (par.pp_rank == par.pp_size - 1));
    char what[128];
    snprintf(what, sizeof what, "%s absorbed", name);
    check_round(single, pp, what, 1, T);
    single->attention_form = pp->attention_form = GLM5_FORM_HEADWISE;
    snprintf(what, sizeof what, "%s headwise, 15 tokens", name);
    check_round(single, pp, what, 4, T - 1);
    single->attention_form = pp->attention_form = GLM5_FORM_ABSORBED;
    single->activation_recompute = pp->activation_recompute = true;
    snprintf(what, sizeof what, "%s absorbed, activation recompute", name);
    check_round(single, pp, what, 3, T);
    const dsarl_model_ops *ops = family == GLM5_FAMILY_51 ? &glm5_1_model_ops : &glm5_2_model_ops;
    double e_gen = world_max(fmax(compare_generation(ops, single, pp, 0.8f), compare_generation(ops, single, pp, 0)));
    if (par.world_rank == 0)
        fprintf(stderr, "  %s native generation: same tokens; log-probs %.3g\n", name, e_gen);
    ck_assert_msg(e_gen < 1e-5, "%s: rollout log-probs differ by %.3g", name, e_gen);
    check_steps(ops, single, pp, name);
    check_hf_round_trip(tmpl, extra, family, single, pp);
    glm5_model_free(single), glm5_model_free(pp);
    dsarl_recipe_free(r1), dsarl_recipe_free(r2);
}

START_TEST(test_glm52_even_stages)
{
    static const int32_t pp2[] = {0, 2, 4}, pp4[] = {0, 1, 2, 3, 4};
    check_config(glm52_recipe, "", GLM5_FAMILY_52, par.pp_size == 4 ? "glm5.2 1|1|1|1" : "glm5.2 2|2",
                 par.pp_size == 4 ? pp4 : pp2);
}
END_TEST

START_TEST(test_glm52_stage_starts_on_shared_layer)
{
    static const int32_t starts[] = {0, 1, 4};
    check_config(glm52_recipe, "    num_layers_in_first_pipeline_stage: 1\n", GLM5_FAMILY_52,
                 "glm5.2 1|3 (shared layer 1 starts stage 1)", starts);
}
END_TEST

START_TEST(test_glm51_tied_uneven_stages)
{
    static const int32_t starts[] = {0, 2, 3};
    check_config(glm51_recipe, "    num_layers_in_first_pipeline_stage: 2\n", GLM5_FAMILY_51,
                 "glm5.1 2|1 tied embeddings", starts);
}
END_TEST

/* --- the 1F1B schedule of dsarl_trainer_train_microbatches ----------------------------------------------------- */

enum { MAX_MB = 8 };
typedef struct loss_log {
    int32_t order[MAX_MB], calls;
    const float *c[MAX_MB]; // each microbatch's fixed part of the gradient
} loss_log;

// d loss / d logp = c + 0.05 logp: the gradient depends on the log-probs the callback was handed
static int linear_loss(void *user, int32_t index, dsarl_train_microbatch *mb, dsarl_error *e)
{
    (void)e;
    loss_log *log = user;
    ck_assert_int_lt(log->calls, MAX_MB);
    log->order[log->calls++] = index;
    for (int64_t t = 0; t < mb->batch->n_tokens; t++)
        mb->dlogprobs[t] = log->c[index][t] + 0.05f * mb->logprobs[t];
    return DSARL_OK;
}

// n microbatches through the schedule on the staged model and one after another on one process: the loss calls in
// order on every rank, the same log-probs and indexer losses everywhere, the same accumulated gradients.
static void check_schedule(dsarl_model *single, dsarl_model *pp, int32_t n, const char *what)
{
    const dsarl_model_ops *ops = &glm5_2_model_ops;
    pp_batch b[MAX_MB];
    float lp1[MAX_MB][T], lp2[MAX_MB][T], d1[MAX_MB][T], d2[MAX_MB][T];
    dsarl_train_microbatch m1[MAX_MB], m2[MAX_MB];
    loss_log log1 = {.calls = 0}, log2 = {.calls = 0};
    for (int32_t i = 0; i < n; i++) {
        make_batch(&b[i], single->cfg.vocab_size, 500 + (uint64_t)i, i % 2 ? T - 1 : T);
        log1.c[i] = log2.c[i] = b[i].dlogprobs;
        m1[i] = (dsarl_train_microbatch){.struct_size = sizeof m1[i], .batch = &b[i].b, .targets = b[i].targets,
                                         .logprobs = lp1[i], .dlogprobs = d1[i]};
        // the staged run's gradient overwrites its log-probs, as SFT's does
        m2[i] = (dsarl_train_microbatch){.struct_size = sizeof m2[i], .batch = &b[i].b, .targets = b[i].targets,
                                         .logprobs = lp2[i], .dlogprobs = lp2[i]};
    }
    OK(ops->zero_grad(single, &err));
    OK(ops->zero_grad(pp, &err));
    dsarl_pass_counts counts = {0, 0};
    OK(dsarl_trainer_train_microbatches(ops, single, NULL, m1, n, linear_loss, &log1, NULL, &err));
    OK(dsarl_trainer_train_microbatches(ops, pp, &par, m2, n, linear_loss, &log2, &counts, &err));
    OK(ops->reduce_gradients(pp, &err));
    ck_assert_int_eq(log2.calls, n);
    int64_t tokens = 0;
    double e_lp = 0, e_il = 0;
    for (int32_t i = 0; i < n; i++) {
        ck_assert_int_eq(log2.order[i], i);
        tokens += b[i].b.n_tokens;
        // lp2 holds the gradient now: compare it with the one-process gradient of the same log-probs
        e_lp = fmax(e_lp, max_rel(lp2[i], d1[i], b[i].b.n_tokens, 1e-3));
        e_il = fmax(e_il, fabs((double)m2[i].indexer_loss - m1[i].indexer_loss) / fabs((double)m1[i].indexer_loss));
    }
    ck_assert_int_eq(counts.train_pass_tokens, tokens);
    double any_lp = world_max(e_lp), any_il = world_max(e_il);
    if (par.world_rank == 0)
        fprintf(stderr, "  %s: %d microbatches, worst rank: log-prob gradients %.3g, indexer losses %.3g\n", what, n,
                any_lp, any_il);
    ck_assert_msg(e_lp < 1e-5 && e_il < 1e-5, "%s: log-probs %.3g, indexer losses %.3g from one process", what, e_lp,
                  e_il);
    char label[160];
    snprintf(label, sizeof label, "%s, %d microbatches' gradients", what, n);
    compare_params(single, pp, true, 2e-5, label);
    (void)d2;
}

START_TEST(test_1f1b_schedule)
{
    dsarl_recipe *r1, *r2;
    dsarl_model *single, *pp;
    // two stages: the second starts on a shared layer; four: every stage has one layer, two start on shared ones
    const char *extra = par.pp_size == 2 ? "    num_layers_in_first_pipeline_stage: 1\n" : "";
    const char *what = par.pp_size == 2 ? "1F1B, glm5.2 1|3" : "1F1B, glm5.2 1|1|1|1";
    OK(create_model(glm52_recipe, extra, GLM5_FAMILY_52, NULL, &r1, &single));
    OK(create_model(glm52_recipe, extra, GLM5_FAMILY_52, &par, &r2, &pp));
    check_schedule(single, pp, 6, what);
    check_schedule(single, pp, 1, what); // fewer microbatches than stages: warm-up and cool-down only
    single->activation_recompute = pp->activation_recompute = true;
    char label[96];
    snprintf(label, sizeof label, "%s, activation recompute", what);
    check_schedule(single, pp, 3, label);
    glm5_model_free(single), glm5_model_free(pp);
    dsarl_recipe_free(r1), dsarl_recipe_free(r2);
}
END_TEST

/* --- interleaved virtual stages (vpp mode: PP2 x VPP2) ----------------------------------------------------------- */

// The GLM-5.2 template with 8 layers F S F S F S F S (PP4 x VPP2: one layer per chunk).
static const char *glm52_recipe_8_layers(void)
{
    static char text[4096];
    snprintf(text, sizeof text, "%s", glm52_recipe);
    char *layers = strstr(text, "num_hidden_layers: 4"), *pattern = strstr(text, "index_topk_pattern: FSFS\n");
    ck_assert(layers && pattern);
    layers[strlen("num_hidden_layers: ")] = '8';
    size_t at = (size_t)(pattern - text) + strlen("index_topk_pattern: FSFS");
    memmove(text + at + 4, text + at, strlen(text + at) + 1);
    memcpy(text + at, "FSFS", 4);
    return text;
}

// One-layer chunks F S F S ...: at PP2 rank 0 holds layers 0 and 2, rank 1 layers 1 and 3 (at PP4 rank r holds r and
// r + 4); every odd rank's chunks start on a shared layer (their top-k comes from the rank before), and the last
// rank's first chunk feeds rank 0's second.
START_TEST(test_vpp_chunks)
{
    static const int32_t starts[] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    bool pp4 = par.pp_size == 4;
    check_config(pp4 ? glm52_recipe_8_layers() : glm52_recipe, "", GLM5_FAMILY_52,
                 pp4 ? "glm5.2 pp4 vpp2 1|1|1|1|1|1|1|1" : "glm5.2 vpp2 1|1|1|1", starts);
}
END_TEST

// The interleaved schedule: n = pp (every microbatch warms up first), 2 pp and 3 pp microbatches (steady 1F1B
// steps), with activation recompute; a count pp does not divide is refused in one sentence.
START_TEST(test_vpp_schedule)
{
    dsarl_recipe *r1, *r2;
    dsarl_model *single, *pp;
    int32_t P = par.pp_size;
    const char *tmpl = P == 4 ? glm52_recipe_8_layers() : glm52_recipe;
    OK(create_model(tmpl, "", GLM5_FAMILY_52, NULL, &r1, &single));
    OK(create_model(tmpl, "", GLM5_FAMILY_52, &par, &r2, &pp));
    check_schedule(single, pp, P, "interleaved, glm5.2 vpp2");
    check_schedule(single, pp, 2 * P, "interleaved, glm5.2 vpp2");
    if (3 * P <= MAX_MB)
        check_schedule(single, pp, 3 * P, "interleaved, glm5.2 vpp2");
    single->activation_recompute = pp->activation_recompute = true;
    check_schedule(single, pp, 2 * P, "interleaved, glm5.2 vpp2, activation recompute");
    pp_batch b[3];
    float lp[3][T];
    dsarl_train_microbatch mbs[3];
    loss_log log = {.calls = 0};
    for (int32_t i = 0; i < 3; i++) {
        make_batch(&b[i], single->cfg.vocab_size, 700 + (uint64_t)i, T);
        log.c[i] = b[i].dlogprobs;
        mbs[i] = (dsarl_train_microbatch){.struct_size = sizeof mbs[i], .batch = &b[i].b, .targets = b[i].targets,
                                          .logprobs = lp[i], .dlogprobs = lp[i]};
    }
    ck_assert_int_ne(dsarl_trainer_train_microbatches(&glm5_2_model_ops, pp, &par, mbs, 3, linear_loss, &log, NULL,
                                                      &err), DSARL_OK);
    ck_assert_msg(strstr(err.message, "(3: train_global_batch_size") &&
                  strstr(err.message, P == 4 ? "multiple of pipeline_model_parallel_size 4"
                                             : "multiple of pipeline_model_parallel_size 2"), "%s", err.message);
    ck_assert_int_eq(log.calls, 0);
    glm5_model_free(single), glm5_model_free(pp);
    dsarl_recipe_free(r1), dsarl_recipe_free(r2);
}
END_TEST

// What Megatron refuses with virtual stages is refused here too, naming the keys.
START_TEST(test_vpp_refusals)
{
    dsarl_recipe *r;
    dsarl_model *m;
    // 1|3: vpp 2 does not divide either stage's layer count
    ck_assert_int_ne(create_model(glm52_recipe, "    num_layers_in_first_pipeline_stage: 1\n", GLM5_FAMILY_52, &par,
                                  &r, &m), DSARL_OK);
    ck_assert_msg(strstr(err.message, "virtual_pipeline_model_parallel_size 2 does not divide the 1 layers of "
                                      "pipeline stage 0"), "%s", err.message);
    dsarl_recipe_free(r);
    // virtual stages without pipeline parallelism
    ck_assert_int_ne(create_model(glm52_recipe, layout_extra, GLM5_FAMILY_52, NULL, &r, &m), DSARL_OK);
    ck_assert_msg(strstr(err.message, "virtual_pipeline_model_parallel_size") &&
                  strstr(err.message, "pipeline_model_parallel_size > 1"), "%s", err.message);
    dsarl_recipe_free(r);
}
END_TEST

// Each refusal names its keys, before any weight exists.
START_TEST(test_refusals)
{
    static const struct { const char *extra, *expect[2]; } cases[] = {
        {"    virtual_pipeline_model_parallel_size: 2\n", {"virtual_pipeline_model_parallel_size (2)", "layout's (1)"}},
        {"    num_layers_in_first_pipeline_stage: 1\n    num_layers_in_last_pipeline_stage: 1\n",
         {"num_layers_in_first_pipeline_stage (1)", "num_layers_in_last_pipeline_stage (1)"}},
        {"    num_layers_in_first_pipeline_stage: 4\n", {"num_layers_in_first_pipeline_stage", "evenly"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsarl_recipe *r;
        dsarl_model *m;
        ck_assert_int_ne(create_model(glm52_recipe, cases[i].extra, GLM5_FAMILY_52, &par, &r, &m), DSARL_OK);
        for (int k = 0; k < 2; k++)
            ck_assert_msg(strstr(err.message, cases[i].expect[k]), "case %zu: '%s' lacks '%s'", i, err.message,
                          cases[i].expect[k]);
        dsarl_recipe_free(r);
    }
    // more stages than layers: a one-layer model on two stages
    char text[4096];
    snprintf(text, sizeof text, glm51_recipe, "");
    char *layers = strstr(text, "num_hidden_layers: 3");
    ck_assert_ptr_nonnull(layers);
    layers[strlen("num_hidden_layers: ")] = '1';
    dsarl_recipe *r;
    dsarl_model *m;
    ck_assert_int_ne(create_model(text, "", GLM5_FAMILY_51, &par, &r, &m), DSARL_OK);
    ck_assert_msg(strstr(err.message, "pipeline_model_parallel_size 2 is more than the model's 1 layers"), "%s",
                  err.message);
    dsarl_recipe_free(r);
}
END_TEST

int main(int argc, char **argv)
{
    dsarl_error_clear(&err);
    if (!dsarl_comm_launched()) {
        fprintf(stderr, "check_glm5_pp_mpi runs under mpirun (-np 2 or 4)\n");
        return 77;
    }
    if (dsarl_comm_init(&comm, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return EXIT_FAILURE;
    }
    // -np 2: PP2, or with the argument vpp2: PP2 x VPP2; -np 4: PP2 x TP2, with the argument pp4: PP4, with cp2:
    // PP2 x CP2, with vpp2: PP4 x VPP2
    int32_t world = dsarl_comm_world_size(comm);
    bool pp4 = argc > 1 && !strcmp(argv[1], "pp4"), vpp2 = argc > 1 && !strcmp(argv[1], "vpp2");
    bool cp2 = argc > 1 && !strcmp(argv[1], "cp2");
    dsarl_layout l;
    int32_t pp = pp4 || (vpp2 && world == 4) ? 4 : 2;
    int rc = dsarl_layout_make(world, pp4 || cp2 || vpp2 ? 1 : world / 2, pp, cp2 ? 2 : 1, 1, &l, &err);
    l.sequence_parallel = true;
    l.collective_timeout_s = 60; // a failed assertion on one rank leaves its peers waiting: end the run quickly
    l.vpp = vpp2 ? 2 : 1;
    if (rc < 0 || dsarl_comm_build(comm, &l, &par, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return EXIT_FAILURE;
    }
    layout_extra = vpp2 ? "    virtual_pipeline_model_parallel_size: 2\n" : "";
    dsarl_device_config dc = {.struct_size = sizeof dc, .parallel = &par, .threads = 1};
    if (cpu_create(&dc, &dev, &err) < 0 ||
        dsarl_dsa_reference_ops.create(&dsarl_cpu_device_ops, dev, NULL, &dsa, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return EXIT_FAILURE;
    }
    Suite *s = suite_create("glm5_pp_mpi");
    TCase *tc = tcase_create("pp");
    tcase_set_timeout(tc, 120);
    if (vpp2) {
        tcase_add_test(tc, test_vpp_chunks);
        tcase_add_test(tc, test_vpp_schedule);
        if (pp == 2)
            tcase_add_test(tc, test_vpp_refusals);
    } else {
        tcase_add_test(tc, test_glm52_even_stages);
        tcase_add_test(tc, test_1f1b_schedule);
    }
    if (!pp4 && !vpp2)
        tcase_add_test(tc, test_glm52_stage_starts_on_shared_layer);
    if (!pp4 && !vpp2 && !cp2) {
        tcase_add_test(tc, test_glm51_tied_uneven_stages);
        tcase_add_test(tc, test_refusals);
    }
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
