/* check_plan.c: `dsarl plan`'s arithmetic on a small glm_moe_dsa config whose every number is computed by hand
 * below (per-rank parameters under TP2 / EP2 / PP2, optimizer bytes with and without the distributed optimizer,
 * activation bytes with and without recompute), a stage starting on an IndexShare shared layer (planned with the
 * top-k it receives), interleaved virtual stages, and every refusal as one sentence: a layout that does not divide,
 * a model split that does not divide, uneven stage sizes, virtual stages that do not divide a stage, a stage start
 * the model forbids, a plan that does not fit.
 *
 * The config: hidden C 8, vocab V 16, 4 layers (layer 0 dense with intermediate 12, layers 1-3 MoE: 4 experts of
 * width 4, top 2, one shared expert), 4 heads with q_lora 6, kv_lora 4, nope 2, rope 2, v 2; indexer 2 heads x 4,
 * top-k 8, IndexShare freq 2 offset 2, so layers 0, 1, 3 run their indexer and layer 2 is "shared".
 *
 * Full tensors (elements): attention per layer: input norm 8, q_a 6x8 = 48, q_a norm 6, kv_a (4+2)x8 = 48, kv_a
 * norm 4, post norm 8 (replicated, 122); q_b (4x4)x6 = 96 and kv_b (4x(2+2))x4 = 64 (column, 160); o 8x(4x2) = 64
 * (row). Indexer (full layers, replicated): wq_b 8x6 = 48, wk 4x8 = 32, k_norm 4 + 4, weights_proj 2x8 = 16: 104.
 * Dense MLP: gate 12x8 = 96 + up 96 (column), down 96 (row). MoE: router 4x8 = 32 (replicated), bias 4 (buffer),
 * experts gate_up 4x8x8 = 256 + down 4x8x4 = 128 (expert, 384), shared gate 32 + up 32 (column), down 32 (row).
 * Embedding and LM head 16x8 = 128 each (vocab), final norm 8 (replicated). Whole model: 128 + 738 + 962 + 858 +
 * 962 + 8 + 128 = 3784.
 *
 * Rank 0 of TP2 x EP2 halves column, row, vocab and expert: layer 0 = 226 + 176 + 80 = 482, layers 1 and 3 =
 * 258 + 112 + 48 + 192 = 610, layer 2 = 154 + 112 + 48 + 192 = 506; embedding 64; head 8 + 64 = 72. PP2 with 3 + 1
 * layers: stage 0 = 64 + 482 + 610 + 506 = 1662 (experts 384, buffers 8), stage 1 = 610 + 72 = 682. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dsarl/recipe.h"
#include "glm5_ops.h"
#include "layout.h"
#include "plan.h"
#include "recipe_internal.h"

static const char recipe_text[] =
    "policy:\n"
    "  model_config: {hidden_size: 8, vocab_size: 16, intermediate_size: 12, moe_intermediate_size: 4,\n"
    "    num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 4, q_lora_rank: 6, kv_lora_rank: 4,\n"
    "    qk_nope_head_dim: 2, qk_rope_head_dim: 2, v_head_dim: 2, n_routed_experts: 4, num_experts_per_tok: 2,\n"
    "    n_shared_experts: 1, first_k_dense_replace: 1, index_n_heads: 2, index_head_dim: 4, index_topk: 8,\n"
    "    index_topk_freq: 2, index_skip_topk_offset: 2, max_position_embeddings: 64}\n"
    "  megatron_cfg:\n"
    "    model_overrides: {dsa_indexer_loss_coeff: 0.0}\n";

typedef struct fixture {
    dsarl_recipe *recipe;
    dsarl_model_config mc;
    dsarl_model_plan mp;
    dsarl_model_plan_layer layers[4];
} fixture;

static void open_fixture(fixture *f)
{
    memset(f, 0, sizeof *f);
    dsarl_error err;
    dsarl_error_clear(&err);
    ck_assert_msg(dsarl_recipe_load_string(recipe_text, "plan.yaml", &f->recipe, &err) == 0, "%s", err.message);
    ck_assert_msg(dsarl_recipe_resolve(f->recipe, &err) == 0, "%s", err.message);
    f->mc = (dsarl_model_config){.struct_size = sizeof f->mc, .recipe = dsarl_recipe_root(f->recipe)};
    f->mp = (dsarl_model_plan){.struct_size = sizeof f->mp, .layer_capacity = 4, .layers = f->layers};
}

// The model's plan at the layout's rank 0; returns the status (err holds the refusal).
static int plan_at(fixture *f, const dsarl_layout *l, dsarl_error *err)
{
    dsarl_parallel par;
    dsarl_layout_coords(l, 0, &par);
    return glm5_plan_52(&f->mc, &par, &f->mp, err);
}

static void expect_one_sentence(const dsarl_error *err, const char *must_contain)
{
    ck_assert_msg(err->message[0] != '\0', "no message");
    ck_assert_msg(strchr(err->message, '\n') == NULL, "more than one line: %s", err->message);
    ck_assert_msg(strstr(err->message, ". ") == NULL, "more than one sentence: %s", err->message);
    ck_assert_msg(strstr(err->message, must_contain) != NULL, "'%s' not in: %s", must_contain, err->message);
}

static void settings(dsarl_plan_settings *s, const dsarl_layout *l)
{
    memset(s, 0, sizeof *s);
    s->layout = *l;
    s->first_stage_layers = 3, s->last_stage_layers = 1;
    s->micro_batch = 1, s->seq_len = 16, s->global_batch = 4; // dp 2: 2 micro-batches per replica
    s->grad_bytes = 2;
    s->colocated = true;
    s->rollouts = 4, s->prompt_tokens = 6, s->new_tokens = 10;
    s->gpu_bytes = 80.0 * 1024 * 1024 * 1024;
    s->peak_flops = 989e12, s->hbm_bytes_per_s = 3.35e12;
}

START_TEST(test_per_rank_params)
{
    fixture f;
    open_fixture(&f);
    dsarl_error err;
    dsarl_error_clear(&err);
    dsarl_layout single, l;
    ck_assert_int_eq(dsarl_layout_make(1, 1, 1, 1, 1, &single, &err), 0);
    ck_assert_msg(plan_at(&f, &single, &err) == 0, "%s", err.message);
    ck_assert_int_eq(f.mp.n_layers, 4);
    ck_assert_int_eq(f.mp.total_params, 3784);
    static const int64_t whole[4] = {738, 962, 858, 962};
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(dsarl_plan_params(f.layers[i].params), whole[i]);
    ck_assert_int_eq(dsarl_plan_params(f.mp.embedding), 128);
    ck_assert_int_eq(dsarl_plan_params(f.mp.head), 136);

    ck_assert_int_eq(dsarl_layout_make(8, 2, 2, 1, 2, &l, &err), 0); // TP2 PP2 DP2, EP2 EDP2
    ck_assert_msg(plan_at(&f, &l, &err) == 0, "%s", err.message);
    static const int64_t rank0[4] = {482, 610, 506, 610};
    for (int i = 0; i < 4; i++)
        ck_assert_msg(dsarl_plan_params(f.layers[i].params) == rank0[i], "layer %d: %lld", i,
                      (long long)dsarl_plan_params(f.layers[i].params));
    ck_assert_int_eq(f.layers[0].params[DSARL_PLAN_REPLICATED], 226);
    ck_assert_int_eq(f.layers[0].params[DSARL_PLAN_COLUMN], 176);
    ck_assert_int_eq(f.layers[0].params[DSARL_PLAN_ROW], 80);
    ck_assert_int_eq(f.layers[1].params[DSARL_PLAN_EXPERT], 192);
    ck_assert_int_eq(f.layers[2].params[DSARL_PLAN_REPLICATED], 154); // shared layer: no indexer weights
    ck_assert_int_eq(f.layers[1].buffers, 4);
    ck_assert_int_eq(f.mp.embedding[DSARL_PLAN_VOCAB], 64);
    ck_assert_int_eq(dsarl_plan_params(f.mp.head), 72);
    // every layer may start a stage; one starting on the shared layer 2 receives layer 1's 8 top-k per token
    for (int i = 0; i < 4; i++) {
        ck_assert(f.layers[i].stage_start_ok);
        ck_assert_int_eq(f.layers[i].stage_in_topk, i == 2 ? 8 : 0);
    }
    // cache: latent 4 + rope key 2 in bf16, + the indexer key (4 x 2 bytes) on full layers
    ck_assert(f.layers[0].cache_bytes == 20.0 && f.layers[2].cache_bytes == 12.0);

    dsarl_plan_settings s;
    settings(&s, &l);
    dsarl_plan p;
    ck_assert_msg(dsarl_plan_compute(&s, &f.mp, NULL, &p, &err) == 0, "%s", err.message);
    ck_assert_int_eq(p.n_stages, 2);
    ck_assert_int_eq(p.stages[0].first_layer, 0);
    ck_assert_int_eq(p.stages[0].n_layers, 3);
    ck_assert_int_eq(p.stages[1].first_layer, 3);
    ck_assert_int_eq(dsarl_plan_params(p.stages[0].gpu.params), 1662);
    ck_assert_int_eq(dsarl_plan_params(p.stages[1].gpu.params), 682);
    ck_assert_int_eq(p.stages[0].gpu.params[DSARL_PLAN_EXPERT], 384);
    // bf16 weights + fp32 router biases (layers 1 and 2), bf16 gradients
    ck_assert(p.stages[0].gpu.weights == 2.0 * 1662 + 4.0 * 8);
    ck_assert(p.stages[0].gpu.grads == 2.0 * 1662);
    dsarl_plan_free(&p);
    dsarl_recipe_free(f.recipe);
}
END_TEST

START_TEST(test_optimizer_bytes)
{
    fixture f;
    open_fixture(&f);
    dsarl_error err;
    dsarl_error_clear(&err);
    dsarl_layout l;
    ck_assert_int_eq(dsarl_layout_make(8, 2, 2, 1, 2, &l, &err), 0);
    ck_assert_msg(plan_at(&f, &l, &err) == 0, "%s", err.message);
    dsarl_plan_settings s;
    settings(&s, &l);
    dsarl_plan p;
    // distributed: dense (1662 - 384) / (dp 2 x cp 1) + experts 384 / edp 2, 12 bytes each
    ck_assert_int_eq(dsarl_plan_compute(&s, &f.mp, NULL, &p, &err), 0);
    ck_assert(p.stages[0].gpu.optimizer == 12.0 * (1278.0 / 2 + 384.0 / 2));
    ck_assert(p.stages[0].gpu.optimizer_host == 0.0);
    dsarl_plan_free(&p);
    // without: every rank keeps the whole state of what it holds
    s.layout.distributed_optimizer = false;
    ck_assert_int_eq(dsarl_plan_compute(&s, &f.mp, NULL, &p, &err), 0);
    ck_assert(p.stages[0].gpu.optimizer == 12.0 * 1662);
    dsarl_plan_free(&p);
    // offloaded: the state moves to the host; fp32 gradients double
    s.layout.distributed_optimizer = true;
    s.optimizer_offload = 1.0, s.grad_bytes = 4;
    ck_assert_int_eq(dsarl_plan_compute(&s, &f.mp, NULL, &p, &err), 0);
    ck_assert(p.stages[0].gpu.optimizer == 0.0);
    ck_assert(p.stages[0].gpu.optimizer_host == 12.0 * (1278.0 / 2 + 384.0 / 2));
    ck_assert(p.stages[0].gpu.grads == 4.0 * 1662);
    dsarl_plan_free(&p);
    dsarl_recipe_free(f.recipe);
}
END_TEST

/* Activation bytes per token (full width), indexer loss off:
 *   attention: (5C 40 + 2 qr 12 + H dqk 16 + kvr+rope 6 + kvr 4 + H(nope+v) 16 + H v 8) = 102 bf16 = 204, + H fp32
 *   log-sum-exp 16 = 220; full layers + top-k indices 8 x 4 = 32 -> 252.
 *   dense MLP: 3 I = 36 bf16 = 72: layer 0 = 324.
 *   MoE: router logits 4 x 4 = 16, top-k weights and indices 2 x 8 = 16, (k C 16 + 2 k M 16 + k M 8 + k C 16) = 56
 *   bf16 = 112, shared 3 M = 12 bf16 = 24: +168 -> layer 1 and 3 = 420, layer 2 (shared) = 388.
 *   recompute keeps the layer input, C bf16 = 16, and the layer's int32 top-k, 8 x 4 = 32: 48.
 * Tokens per rank: 1 x 16 / CP1 / TP2 = 8; stage 0 holds min(pp 2 - 0, 2 micro-batches) = 2, stage 1 holds 1;
 * the last stage adds fp32 logits + gradient of 16 tokens over V/TP: 16 x 8 x 16 / 2 = 1024. */
START_TEST(test_activation_bytes)
{
    fixture f;
    open_fixture(&f);
    dsarl_error err;
    dsarl_error_clear(&err);
    dsarl_layout l;
    ck_assert_int_eq(dsarl_layout_make(8, 2, 2, 1, 2, &l, &err), 0);
    ck_assert_msg(plan_at(&f, &l, &err) == 0, "%s", err.message);
    ck_assert_msg(f.layers[0].act_bytes == 324.0, "%g", f.layers[0].act_bytes);
    ck_assert_msg(f.layers[1].act_bytes == 420.0, "%g", f.layers[1].act_bytes);
    ck_assert_msg(f.layers[2].act_bytes == 388.0, "%g", f.layers[2].act_bytes);
    ck_assert(f.layers[3].act_bytes == 420.0 && f.layers[1].act_bytes_recompute == 48.0 &&
              f.layers[2].act_bytes_recompute == 48.0);
    dsarl_plan_settings s;
    settings(&s, &l);
    dsarl_plan p;
    ck_assert_int_eq(dsarl_plan_compute(&s, &f.mp, NULL, &p, &err), 0);
    ck_assert(p.train_tokens_per_rank == 8.0 && p.microbatches == 2);
    ck_assert(p.stages[0].in_flight == 2 && p.stages[1].in_flight == 1);
    ck_assert_msg(p.stages[0].gpu.activations == (324.0 + 420 + 388) * 8 * 2, "%g", p.stages[0].gpu.activations);
    ck_assert_msg(p.stages[1].gpu.activations == 420.0 * 8 + 1024, "%g", p.stages[1].gpu.activations);
    dsarl_plan_free(&p);
    s.recompute = true; // inputs of every in-flight layer + one layer rebuilt at a time
    ck_assert_int_eq(dsarl_plan_compute(&s, &f.mp, NULL, &p, &err), 0);
    ck_assert_msg(p.stages[0].gpu.activations == 48.0 * 3 * 8 * 2 + 420.0 * 8, "%g", p.stages[0].gpu.activations);
    // the generation cache: 4 rollouts over DP2 x CP1 = 2 sequences x 16 tokens of stage 0's 20 + 20 + 12 bytes
    ck_assert_msg(p.stages[0].gpu.cache == 52.0 * 2 * 16, "%g", p.stages[0].gpu.cache);
    dsarl_plan_free(&p);
    dsarl_recipe_free(f.recipe);
}
END_TEST

START_TEST(test_refusals)
{
    fixture f;
    open_fixture(&f);
    dsarl_error err;
    dsarl_error_clear(&err);
    dsarl_layout l;
    // the layout: 3 x 2 ranks per replica do not divide 8
    ck_assert_int_ne(dsarl_layout_make(8, 3, 2, 1, 1, &l, &err), 0);
    expect_one_sentence(&err, "does not divide the 8 processes");
    // the model: 4 heads over TP8, 4 experts over EP8
    dsarl_error_clear(&err);
    ck_assert_int_eq(dsarl_layout_make(8, 8, 1, 1, 1, &l, &err), 0);
    ck_assert_int_ne(plan_at(&f, &l, &err), 0);
    expect_one_sentence(&err, "attention heads (num_attention_heads) = 4 is not divisible by "
                              "policy.megatron_cfg.tensor_model_parallel_size = 8");
    dsarl_error_clear(&err);
    ck_assert_int_eq(dsarl_layout_make(8, 1, 1, 1, 8, &l, &err), 0);
    ck_assert_int_ne(plan_at(&f, &l, &err), 0);
    expect_one_sentence(&err, "routed experts (n_routed_experts) = 4 is not divisible by "
                              "policy.megatron_cfg.expert_model_parallel_size = 8");
    // uneven stage sizes: 4 layers - first 1 leave 3 for 2 stages
    int32_t starts[5];
    dsarl_error_clear(&err);
    ck_assert_int_ne(dsarl_plan_stage_layers(4, 3, 1, 0, starts, &err), 0);
    expect_one_sentence(&err, "leave 3 layers, which do not split evenly over the other 2");
    ck_assert_int_eq(dsarl_plan_stage_layers(4, 3, 2, 0, starts, &err), 0);
    ck_assert(starts[0] == 0 && starts[1] == 2 && starts[2] == 3 && starts[3] == 4);
    // a stage starting on the shared layer 2 (even split of 4 layers over PP2)
    dsarl_error_clear(&err);
    ck_assert_int_eq(dsarl_layout_make(8, 2, 2, 1, 2, &l, &err), 0);
    ck_assert_int_eq(plan_at(&f, &l, &err), 0);
    dsarl_plan_settings s;
    settings(&s, &l);
    s.first_stage_layers = s.last_stage_layers = 0;
    dsarl_plan p;
    // planned as the run takes it: stage 1 keeps the received int32 top-k (8 per token of the 16 on the CP rank)
    // for its one micro-batch in flight, 4 x 8 x 16 bytes more than the same plan without the transfer
    ck_assert_msg(dsarl_plan_compute(&s, &f.mp, NULL, &p, &err) == 0, "%s", err.message);
    ck_assert(p.stages[0].topk_in == 0 && p.stages[1].topk_in == 8 && p.stages[1].in_flight == 1);
    double with_topk = p.stages[1].gpu.activations;
    dsarl_plan_free(&p);
    f.layers[2].stage_in_topk = 0;
    ck_assert_int_eq(dsarl_plan_compute(&s, &f.mp, NULL, &p, &err), 0);
    ck_assert_msg(with_topk - p.stages[1].gpu.activations == 512.0, "%g", with_topk - p.stages[1].gpu.activations);
    dsarl_plan_free(&p);
    f.layers[2].stage_in_topk = 8;
    // a model that says a layer cannot start a stage is still refused, naming the layers that may
    f.layers[2].stage_start_ok = 0;
    f.mp.stage_start_rule = "is a layer of the test's choosing";
    ck_assert_int_ne(dsarl_plan_compute(&s, &f.mp, NULL, &p, &err), 0);
    expect_one_sentence(&err, "pipeline stage 1 (layers 2-3) starts at layer 2, which is a layer of the test's "
                              "choosing");
    ck_assert_msg(strstr(err.message, "(0, 1, 3)") != NULL, "%s", err.message);
    f.layers[2].stage_start_ok = 1;
    // does not fit: a 1 GiB GPU under a 2 GiB reserve overflows by the reserve's excess and a little more
    dsarl_error_clear(&err);
    settings(&s, &l);
    s.gpu_bytes = 1024.0 * 1024 * 1024;
    s.reserve_bytes = 2.0 * 1024 * 1024 * 1024;
    ck_assert_int_eq(dsarl_plan_compute(&s, &f.mp, NULL, &p, &err), 0);
    ck_assert_int_ne(dsarl_plan_check_fit(&s, &p, &err), 0);
    expect_one_sentence(&err, "need 2.0 GiB while training, 1.0 GiB more than the 1.0 GiB of one GPU");
    dsarl_plan_free(&p);
    // fits when the GPU is large enough
    s.gpu_bytes = 3.0 * 1024 * 1024 * 1024;
    ck_assert_int_eq(dsarl_plan_compute(&s, &f.mp, NULL, &p, &err), 0);
    ck_assert_int_eq(dsarl_plan_check_fit(&s, &p, &err), 0);
    dsarl_plan_free(&p);
    dsarl_recipe_free(f.recipe);
}
END_TEST

// The settings a recipe gives: NeMo RL's offload and fp32-gradient keys, dedicated generation nodes.
START_TEST(test_settings_from_recipe)
{
    static const char text[] =
        "policy:\n"
        "  train_micro_batch_size: 1\n"
        "  train_global_batch_size: 8\n"
        "  max_total_sequence_length: 64\n"
        "  megatron_cfg:\n"
        "    activation_checkpointing: true\n"
        "    num_layers_in_first_pipeline_stage: 3\n"
        "    optimizer: {optimizer_cpu_offload: true, optimizer_offload_fraction: 0.5}\n"
        "    distributed_data_parallel_config: {grad_reduce_in_fp32: true}\n"
        "  generation:\n"
        "    max_new_tokens: 100\n"
        "    colocated: {enabled: false, resources: {num_nodes: 1, gpus_per_node: 4}}\n"
        "grpo: {num_prompts_per_step: 2, num_generations_per_prompt: 4,\n"
        "       skip_reference_policy_logprobs_calculation: true}\n"
        "data: {max_input_seq_length: 16}\n"
        "cluster: {num_nodes: 2, gpus_per_node: 4}\n";
    dsarl_recipe *r = NULL;
    dsarl_error err;
    dsarl_error_clear(&err);
    ck_assert_int_eq(dsarl_recipe_load_string(text, "s.yaml", &r, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(r, &err), 0);
    dsarl_layout l;
    ck_assert_msg(dsarl_layout_from_recipe(dsarl_recipe_root(r), 8, &l, &err) == 0, "%s", err.message);
    dsarl_plan_settings s;
    ck_assert_msg(dsarl_plan_settings_from_recipe(dsarl_recipe_root(r), &l, &s, &err) == 0, "%s", err.message);
    ck_assert(s.recompute && s.grad_bytes == 4 && s.optimizer_offload == 0.5 && s.logprob_passes == 1);
    ck_assert(s.first_stage_layers == 3 && s.last_stage_layers == 0);
    ck_assert(!s.colocated && s.gen_gpus == 4 && s.gen_tp == 1 && s.gen_ep == 4);
    ck_assert(s.rollouts == 8);
    // 16 prompt + 100 new tokens pass the 64-token sequence: plan the cap, 63 new after a 1-token prompt
    ck_assert(s.new_tokens == 63 && s.prompt_tokens == 1);
    ck_assert(s.gen_memory_utilization == 0.0); // absent: unset
    dsarl_recipe_free(r);
    // policy.generation.gpu_memory_utilization: null is unset, a fraction in (0, 1] is kept, 0 and 1.5 are refused
    // naming the key, as the generation engine refuses them
    const char *values[5] = {"null", "0.85", "1", "0", "1.5"};
    const double want[3] = {0.0, 0.85, 1.0};
    for (int i = 0; i < 5; i++) {
        char yaml[sizeof text + 64];
        const char *at = strstr(text, "    max_new_tokens: 100\n");
        ck_assert_ptr_nonnull(at);
        snprintf(yaml, sizeof yaml, "%.*s    gpu_memory_utilization: %s\n%s", (int)(at - text), text, values[i], at);
        ck_assert_int_eq(dsarl_recipe_load_string(yaml, "u.yaml", &r, &err), 0);
        ck_assert_int_eq(dsarl_recipe_resolve(r, &err), 0);
        dsarl_error_clear(&err);
        int rc = dsarl_plan_settings_from_recipe(dsarl_recipe_root(r), &l, &s, &err);
        if (i < 3) {
            ck_assert_msg(rc == 0, "%s: %s", values[i], err.message);
            ck_assert_msg(s.gen_memory_utilization == want[i], "%s: %g", values[i], s.gen_memory_utilization);
        } else {
            ck_assert_msg(rc != 0, "gpu_memory_utilization %s was accepted", values[i]);
            expect_one_sentence(&err, "policy.generation.gpu_memory_utilization");
            ck_assert_msg(strstr(err.message, "must be in (0, 1]") != NULL, "%s", err.message);
        }
        dsarl_recipe_free(r);
    }
}
END_TEST

/* Dedicated generation on 2 GPUs at TP1 x EP2: every layer on each GPU, experts halved. Per GPU: layer 0 =
 * 226 + 352 + 160 = 738, layers 1 and 3 = 258 + 224 + 96 + 192 = 770, layer 2 = 154 + 224 + 96 + 192 = 666, embedding
 * 128, head 136: 3208 elements, 2 x 3208 + 4 x 12 (three router biases) bytes of weights. Cache: 20 + 20 + 12 + 20
 * = 72 bytes per token over 2 TP1 replicas: 2 of the 4 rollouts x 16 tokens each. */
START_TEST(test_dedicated_generation)
{
    fixture f;
    open_fixture(&f);
    dsarl_error err;
    dsarl_error_clear(&err);
    dsarl_layout l, gl;
    ck_assert_int_eq(dsarl_layout_make(8, 2, 2, 1, 2, &l, &err), 0);
    ck_assert_msg(plan_at(&f, &l, &err) == 0, "%s", err.message);
    fixture g;
    open_fixture(&g);
    ck_assert_int_eq(dsarl_layout_make(2, 1, 1, 1, 2, &gl, &err), 0);
    ck_assert_msg(plan_at(&g, &gl, &err) == 0, "%s", err.message);
    dsarl_plan_settings s;
    settings(&s, &l);
    s.colocated = false, s.gen_gpus = 2, s.gen_tp = 1, s.gen_ep = 2;
    s.reserve_bytes = 2.0 * 1024 * 1024 * 1024;
    dsarl_plan p;
    ck_assert_msg(dsarl_plan_compute(&s, &f.mp, &g.mp, &p, &err) == 0, "%s", err.message);
    ck_assert(p.dedicated);
    ck_assert_int_eq(dsarl_plan_params(p.gen.params), 3208);
    ck_assert(p.gen.weights == 2.0 * 3208 + 4.0 * 12);
    ck_assert(p.gen.grads == 0.0 && p.gen.optimizer == 0.0);
    ck_assert_msg(p.gen.cache == 72.0 * 2 * 16, "%g", p.gen.cache);
    ck_assert(p.stages[0].gpu.cache == 0.0 && p.stages[0].gpu.gen_total == 0.0); // training GPUs do not generate
    ck_assert_int_eq(dsarl_plan_check_fit(&s, &p, &err), 0);
    // a generation budget below the 2 GiB reserve refuses the generation GPUs, with the number over
    s.gen_memory_utilization = 0.01; // 0.8 GiB of 80
    ck_assert_int_ne(dsarl_plan_check_fit(&s, &p, &err), 0);
    expect_one_sentence(&err, "each dedicated generation GPU needs 2.0 GiB");
    ck_assert_msg(strstr(err.message, "1.2 GiB more than the 0.8 GiB policy.generation.gpu_memory_utilization "
                                      "allows") != NULL, "%s", err.message);
    dsarl_plan_free(&p);
    dsarl_recipe_free(f.recipe);
    dsarl_recipe_free(g.recipe);
}
END_TEST

/* Interleaved virtual stages: Megatron's chunk offsets (rank r's chunk c starts at c x L / vpp + the layers of the
 * ranks before it in chunk c), the counts vpp must divide, and the plan of PP2 x VPP2 on the fixture: stage 0 holds
 * layers 0 and 2 (482 + 506 + the embedding's 64 elements), stage 1 layers 1 and 3 (610 + 610 + the head's 72); with
 * m = pp = 2 micro-batches every chunk pass warms up first, so each stage holds all 4 (each half its layers); stage
 * 0's chunk starting on the shared layer 2 keeps 8 int32 top-k per token of the 16. */
START_TEST(test_virtual_stages)
{
    dsarl_error err;
    dsarl_error_clear(&err);
    int32_t starts[9];
    ck_assert_int_eq(dsarl_plan_chunk_layers(8, 2, 2, 0, 0, starts, &err), 0);
    static const int32_t even[] = {0, 2, 4, 6, 8}, first2[] = {0, 1, 4, 5, 8};
    for (int k = 0; k < 5; k++)
        ck_assert_int_eq(starts[k], even[k]);
    ck_assert_int_eq(dsarl_plan_chunk_layers(8, 2, 2, 2, 0, starts, &err), 0); // 2 | 6: chunks 1, 3, 1, 3
    for (int k = 0; k < 5; k++)
        ck_assert_int_eq(starts[k], first2[k]);
    ck_assert_int_eq(dsarl_plan_chunk_layers(8, 4, 2, 2, 2, starts, &err), 0); // 2 | 2 | 2 | 2: one layer each
    for (int k = 0; k <= 8; k++)
        ck_assert_int_eq(starts[k], k);
    ck_assert_int_ne(dsarl_plan_chunk_layers(4, 2, 2, 1, 0, starts, &err), 0);
    expect_one_sentence(&err, "virtual_pipeline_model_parallel_size 2 does not divide the 1 layers of pipeline stage "
                              "0 (layers 0-0)");
    dsarl_error_clear(&err);
    ck_assert_int_ne(dsarl_plan_chunk_layers(4, 1, 2, 0, 0, starts, &err), 0);
    expect_one_sentence(&err, "needs pipeline_model_parallel_size > 1");

    fixture f;
    open_fixture(&f);
    dsarl_error_clear(&err);
    dsarl_layout l;
    ck_assert_int_eq(dsarl_layout_make(8, 2, 2, 1, 2, &l, &err), 0);
    ck_assert_msg(plan_at(&f, &l, &err) == 0, "%s", err.message);
    l.vpp = 2;
    dsarl_plan_settings s;
    settings(&s, &l);
    s.first_stage_layers = s.last_stage_layers = 0;
    dsarl_plan p;
    ck_assert_msg(dsarl_plan_compute(&s, &f.mp, NULL, &p, &err) == 0, "%s", err.message);
    ck_assert(p.vpp == 2 && p.starts[1] == 1 && p.starts[2] == 2 && p.starts[3] == 3);
    ck_assert_int_eq(dsarl_plan_params(p.stages[0].gpu.params), 482 + 506 + 64);
    ck_assert_int_eq(dsarl_plan_params(p.stages[1].gpu.params), 610 + 610 + 72);
    ck_assert(p.stages[0].n_layers == 2 && p.stages[1].n_layers == 2);
    ck_assert(p.stages[0].in_flight == 4 && p.stages[1].in_flight == 4);
    ck_assert(p.stages[0].topk_in == 8 && p.stages[1].topk_in == 0);
    double t = 8.0; // 16 tokens over TP2 with sequence parallelism
    double want = ((f.layers[0].act_bytes + f.layers[2].act_bytes) * t + 4.0 * 8 * 16) * 4 / 2;
    ck_assert_msg(fabs(p.stages[0].gpu.activations - want) < 1e-9, "%g vs %g", p.stages[0].gpu.activations, want);
    char ranges[64];
    dsarl_plan_stage_ranges(&p, 1, ranges, sizeof ranges);
    ck_assert_str_eq(ranges, "1-1, 3-3");
    dsarl_plan_free(&p);
    dsarl_recipe_free(f.recipe);

    // the recipe: 3 micro-batches per replica are not a multiple of pp 2 (as the run refuses them)
    static const char text[] = "policy:\n  train_micro_batch_size: 1\n  train_global_batch_size: 3\n"
                               "  megatron_cfg:\n    pipeline_model_parallel_size: 2\n"
                               "    virtual_pipeline_model_parallel_size: 2\n"
                               "cluster: {num_nodes: 1, gpus_per_node: 2}\n";
    dsarl_recipe *r = NULL;
    ck_assert_int_eq(dsarl_recipe_load_string(text, "v.yaml", &r, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(r, &err), 0);
    ck_assert_msg(dsarl_layout_from_recipe(dsarl_recipe_root(r), 2, &l, &err) == 0, "%s", err.message);
    ck_assert_int_eq(l.vpp, 2);
    dsarl_error_clear(&err);
    ck_assert_int_ne(dsarl_plan_settings_from_recipe(dsarl_recipe_root(r), &l, &s, &err), 0);
    expect_one_sentence(&err, "makes 3 micro-batches per data-parallel replica");
    dsarl_recipe_free(r);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("plan");
    TCase *tc = tcase_create("plan");
    tcase_add_test(tc, test_per_rank_params);
    tcase_add_test(tc, test_optimizer_bytes);
    tcase_add_test(tc, test_activation_bytes);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_settings_from_recipe);
    tcase_add_test(tc, test_dedicated_generation);
    tcase_add_test(tc, test_virtual_stages);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
