/* check_dp_train_mpi.c: data-parallel training of tiny GLM-5.2 and GLM-5.1 models under `mpirun -np 2` (and 4)
 * against the one-process run in the same process. Each optimizer step draws a fresh global batch of random
 * sequences with a random linear loss on their log-probs, normalised by the GLOBAL token count; every rank trains
 * a data-parallel model on its contiguous share of the sequences (dsarl_trainer_optimizer_step reduces the
 * gradients over dp_cp) and a one-process model on the whole batch. Loss, gradient norm and every weight after
 * three steps must agree, with the all-reduce path and with the distributed optimizer (sharded AdamW state,
 * reduce-scatter, all-gather), with gradient buckets small enough that the shards take several chunks and the
 * last one is padded. The sharded optimizer state then goes through save/load per rank, and a session refuses a
 * model that cannot reduce its gradients. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm_internal.h"
#include "cpu_device.h"
#include "dsa_reference.h"
#include "dsarl/rng.h"
#include "dsarl/trainer.h"
#include "glm5_ops.h"
#include "layout.h"
#include "recipe_internal.h"

static dsarl_comm *comm;
static dsarl_parallel par;
static dsarl_error err;
#define OK(call) ck_assert_msg((call) == DSARL_OK, "%s: %s", #call, err.message)

/* GLM-5.1: every layer runs its indexer; GLM-5.2 (recipe_text_52) adds IndexShare layers reusing the last top-k. */
static const char *recipe_text =
    "policy:\n"
    "  model_config:\n"
    "    vocab_size: 40\n    hidden_size: 16\n    intermediate_size: 24\n    moe_intermediate_size: 6\n"
    "    num_hidden_layers: 2\n    num_attention_heads: 2\n    num_key_value_heads: 2\n    q_lora_rank: 12\n"
    "    kv_lora_rank: 8\n    qk_nope_head_dim: 4\n    qk_rope_head_dim: 4\n    v_head_dim: 6\n"
    "    n_routed_experts: 4\n    num_experts_per_tok: 2\n    n_group: 2\n    topk_group: 2\n    index_topk: 3\n"
    "    index_head_dim: 8\n    index_n_heads: 2\n    first_k_dense_replace: 1\n"
    "    n_shared_experts: 1\n    initializer_range: 0.2\n"
    "  megatron_cfg:\n    model_overrides:\n      dsa_indexer_loss_coeff: 0.01\n";
static const char *recipe_text_52 =
    "policy:\n"
    "  model_config:\n"
    "    vocab_size: 40\n    hidden_size: 16\n    intermediate_size: 24\n    moe_intermediate_size: 6\n"
    "    num_hidden_layers: 3\n    num_attention_heads: 2\n    num_key_value_heads: 2\n    q_lora_rank: 12\n"
    "    kv_lora_rank: 8\n    qk_nope_head_dim: 4\n    qk_rope_head_dim: 4\n    v_head_dim: 6\n"
    "    n_routed_experts: 4\n    num_experts_per_tok: 2\n    n_group: 2\n    topk_group: 2\n    index_topk: 3\n"
    "    index_head_dim: 8\n    index_n_heads: 2\n    first_k_dense_replace: 1\n    index_topk_freq: 2\n"
    "    index_skip_topk_offset: 1\n    n_shared_experts: 1\n    initializer_range: 0.2\n"
    "  megatron_cfg:\n    model_overrides:\n      dsa_indexer_loss_coeff: 0.01\n";

/* One model on its own CPU device (the data-parallel one sees the layout, the reference a single process). */
typedef struct built {
    dsarl_recipe *recipe;
    dsarl_device *dev;
    dsarl_dsa_context *dsa;
    dsarl_model *model;
} built;

static void build(built *b, const dsarl_model_ops *ops, const dsarl_parallel *p)
{
    static const dsarl_parallel single = DSARL_PARALLEL_SINGLE;
    memset(b, 0, sizeof *b);
    OK(dsarl_recipe_load_string(ops == &glm5_2_model_ops ? recipe_text_52 : recipe_text, "dp.yaml", &b->recipe, &err));
    OK(dsarl_recipe_resolve(b->recipe, &err));
    dsarl_device_config dc = {.struct_size = sizeof dc, .parallel = p ? p : &single, .threads = 1};
    OK(cpu_create(&dc, &b->dev, &err));
    OK(dsarl_dsa_reference_ops.create(&dsarl_cpu_device_ops, b->dev, NULL, &b->dsa, &err));
    dsarl_model_config mc = {.struct_size = sizeof mc, .recipe = dsarl_recipe_root(b->recipe),
                             .device_ops = &dsarl_cpu_device_ops, .device = b->dev,
                             .dsa_ops = &dsarl_dsa_reference_ops, .dsa = b->dsa, .parallel = p ? p : &single,
                             .seed = 77};
    OK(ops->create(&mc, &b->model, &err));
}

static void unbuild(built *b, const dsarl_model_ops *ops)
{
    ops->destroy(b->model);
    dsarl_dsa_reference_ops.destroy(b->dsa);
    cpu_destroy(b->dev);
    dsarl_recipe_free(b->recipe);
}

enum { SEQS = 8, MAX_LEN = 7, STEPS = 3 };

/* One step's global batch: SEQS random sequences (lengths 2..MAX_LEN), targets, and a random linear loss on the
 * log-probs scaled by 1 / the global token count. Every rank draws the same batch from the same seed. */
typedef struct global_batch {
    int32_t tokens[SEQS * MAX_LEN], targets[SEQS * MAX_LEN], cu[SEQS + 1];
    float weight[SEQS * MAX_LEN];
} global_batch;

static void draw_batch(global_batch *g, uint64_t seed)
{
    dsarl_rng rng;
    dsarl_rng_init(&rng, seed, 3);
    g->cu[0] = 0;
    for (int s = 0; s < SEQS; s++)
        g->cu[s + 1] = g->cu[s] + 2 + (int32_t)dsarl_rng_below(&rng, MAX_LEN - 1);
    int32_t T = g->cu[SEQS];
    for (int32_t t = 0; t < T; t++) {
        g->tokens[t] = (int32_t)dsarl_rng_below(&rng, 40);
        g->targets[t] = (int32_t)dsarl_rng_below(&rng, 40);
        g->weight[t] = (dsarl_rng_uniform(&rng) - 1.2f) / (float)T; // the global normalisation
    }
}

/* Forward + backward of sequences [s0, s1) in microbatches of two; returns the loss sum_t weight[t] * lp[t]. */
static double accumulate(const dsarl_model_ops *ops, dsarl_model *m, const global_batch *g, int s0, int s1)
{
    double loss = 0;
    for (int a = s0; a < s1; a += 2) {
        int b = a + 2 < s1 ? a + 2 : s1;
        int32_t cu[3], base = g->cu[a];
        for (int s = a; s <= b; s++)
            cu[s - a] = g->cu[s] - base;
        dsarl_token_batch tb = {.struct_size = sizeof tb, .n_tokens = g->cu[b] - base, .n_sequences = b - a,
                                .tokens = g->tokens + base, .cu_seqlens = cu};
        float lp[SEQS * MAX_LEN];
        OK(dsarl_trainer_train_forward(ops, m, &tb, g->targets + base, lp, NULL, &err));
        for (int64_t t = 0; t < tb.n_tokens; t++)
            loss += (double)g->weight[base + t] * lp[t];
        OK(dsarl_trainer_train_backward(ops, m, &tb, g->targets + base, g->weight + base, NULL, &err));
    }
    return loss;
}

static double rel(double a, double b)
{
    return fabs(a - b) / fmax(1e-12, fabs(b));
}

/* The largest difference of any weight between the two models, relative to the largest weight of its tensor. */
static double weights_diff(const dsarl_model_ops *ops, dsarl_model *a, dsarl_model *b)
{
    double worst = 0;
    int64_t n = ops->parameter_tensors(a);
    for (int64_t i = 0; i < n; i++) {
        int32_t ndim;
        int64_t shape[3], numel = 1;
        OK(ops->parameter_info(a, i, NULL, &ndim, shape, NULL, &err));
        for (int32_t d = 0; d < ndim; d++)
            numel *= shape[d];
        float *x = malloc(sizeof(float) * (size_t)numel), *y = malloc(sizeof(float) * (size_t)numel);
        ck_assert(x && y);
        OK(ops->read_parameter(a, i, x, NULL, &err));
        OK(ops->read_parameter(b, i, y, NULL, &err));
        double big = 1e-6, d = 0;
        for (int64_t j = 0; j < numel; j++) {
            big = fmax(big, fabs(y[j]));
            d = fmax(d, fabs((double)x[j] - y[j]));
        }
        worst = fmax(worst, d / big);
        free(x);
        free(y);
    }
    return worst;
}

/* STEPS optimizer steps of both models; returns the worst relative differences seen (loss, norm, weights). */
static void train_and_compare(const dsarl_model_ops *ops, const dsarl_parallel *p, double out[3])
{
    built dp, one;
    build(&dp, ops, p);
    build(&one, ops, NULL);
    ck_assert(weights_diff(ops, dp.model, one.model) == 0); // the same initial weights
    dsarl_optimizer_params adam = {.struct_size = sizeof adam, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                                   .weight_decay = 0.1};
    int32_t dp_size = dsarl_group_size(p->dp), r = dsarl_group_rank(p->dp);
    int s0 = SEQS * r / dp_size, s1 = SEQS * (r + 1) / dp_size;
    memset(out, 0, 3 * sizeof(double));
    for (int step = 0; step < STEPS; step++) {
        global_batch g;
        draw_batch(&g, 1000 + (uint64_t)step);
        OK(ops->zero_grad(dp.model, &err));
        OK(ops->zero_grad(one.model, &err));
        double loss_dp = accumulate(ops, dp.model, &g, s0, s1);
        double loss_one = accumulate(ops, one.model, &g, 0, SEQS);
        OK(dsarl_group_all_reduce_host(p->dp, &loss_dp, 1, DSARL_DTYPE_F64, DSARL_REDUCE_SUM, &err));
        double norm_dp, norm_one;
        // a clip threshold below the norm, so the clip factor (from the reduced norm) matters too; Adam turns the
        // summation-order noise of near-zero gradients into updates of up to lr, hence a modest lr
        OK(dsarl_trainer_optimizer_step(ops, dp.model, &adam, 3e-3, 0.05, &norm_dp, &err));
        OK(dsarl_trainer_optimizer_step(ops, one.model, &adam, 3e-3, 0.05, &norm_one, &err));
        ck_assert_msg(norm_one > 0.05, "the gradient norm %g should exceed the clip threshold", norm_one);
        out[0] = fmax(out[0], rel(loss_dp, loss_one));
        out[1] = fmax(out[1], rel(norm_dp, norm_one));
    }
    out[2] = weights_diff(ops, dp.model, one.model);
    // the sharded optimizer state round-trips through one file per rank: a fresh model resumes to the same step
    if (p->distributed_optimizer) {
        char path[256];
        snprintf(path, sizeof path, "/tmp/dsarl_dp_optim_%d_%d.safetensors", (int)getpid(), r);
        OK(ops->optimizer_save(dp.model, path, &err));
        built again;
        build(&again, ops, p);
        OK(ops->optimizer_load(again.model, path, &err));
        ck_assert_int_eq(ops->optimizer_steps(again.model), STEPS);
        // a one-process model refuses a shard
        ck_assert_int_eq(ops->optimizer_load(one.model, path, &err), DSARL_E_INVALID);
        ck_assert_msg(strstr(err.message, "sharded"), "%s", err.message);
        unbuild(&again, ops);
        unlink(path);
    }
    unbuild(&dp, ops);
    unbuild(&one, ops);
}

static void check_family(const dsarl_model_ops *ops, bool distributed, int64_t bucket)
{
    dsarl_parallel p = par;
    p.distributed_optimizer = distributed;
    p.grad_bucket_elements = bucket;
    double d[3];
    train_and_compare(ops, &p, d);
    if (par.world_rank == 0)
        printf("%s %s optimizer, bucket %lld: max relative difference loss %.3g grad norm %.3g weights %.3g\n",
               ops->common.name, distributed ? "distributed" : "replicated", (long long)bucket, d[0], d[1], d[2]);
    ck_assert_msg(d[0] <= 1e-5 && d[1] <= 1e-5 && d[2] <= 1e-5, "%s: loss %g, grad norm %g, weights %g",
                  ops->common.name, d[0], d[1], d[2]);
}

START_TEST(test_glm52_all_reduce) { check_family(&glm5_2_model_ops, false, 1000); }
END_TEST
START_TEST(test_glm52_distributed_optimizer) { check_family(&glm5_2_model_ops, true, 1000); }
END_TEST
START_TEST(test_glm52_distributed_one_bucket) { check_family(&glm5_2_model_ops, true, 0); }
END_TEST
START_TEST(test_glm51_all_reduce) { check_family(&glm5_1_model_ops, false, 0); }
END_TEST
START_TEST(test_glm51_distributed_optimizer) { check_family(&glm5_1_model_ops, true, 777); }
END_TEST

START_TEST(test_no_reduction_differs)
{
    // the comparison has teeth: the same DP run with the reduction skipped (each rank steps on its own share)
    // moves the weights differently from the one-process run
    built dp, one;
    const dsarl_model_ops *ops = &glm5_2_model_ops;
    static const dsarl_parallel single = DSARL_PARALLEL_SINGLE;
    build(&dp, ops, &single);
    build(&one, ops, NULL);
    int32_t n = dsarl_group_size(par.dp), r = dsarl_group_rank(par.dp);
    global_batch g;
    draw_batch(&g, 1000);
    OK(ops->zero_grad(dp.model, &err));
    OK(ops->zero_grad(one.model, &err));
    accumulate(ops, dp.model, &g, SEQS * r / n, SEQS * (r + 1) / n);
    accumulate(ops, one.model, &g, 0, SEQS);
    double a, b;
    OK(ops->grad_norm(dp.model, &a, &err));
    OK(ops->grad_norm(one.model, &b, &err));
    ck_assert_msg(rel(a, b) > 1e-3, "a share's gradient norm %g should differ from the whole batch's %g", a, b);
    unbuild(&dp, ops);
    unbuild(&one, ops);
}
END_TEST

START_TEST(test_session_refuses_a_model_without_reduction)
{
    // a model table without reduce_gradients would train each rank on its own share: the session refuses it
    dsarl_model_ops no_reduce = glm5_2_model_ops;
    no_reduce.reduce_gradients = NULL;
    dsarl_recipe *recipe;
    OK(dsarl_recipe_load_string(recipe_text, "dp.yaml", &recipe, &err));
    OK(dsarl_recipe_resolve(recipe, &err));
    dsarl_session_config sc = {.struct_size = sizeof sc, .recipe = dsarl_recipe_root(recipe), .parallel = &par,
                               .seed = 5, .threads = 1, .device_ops = &dsarl_cpu_device_ops,
                               .dsa_ops = &dsarl_dsa_reference_ops, .model_ops = &no_reduce};
    dsarl_session s;
    ck_assert_int_eq(dsarl_session_open(&sc, &s, &err), DSARL_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.message, "has no reduce_gradients") && strstr(err.message, "one data-parallel rank"),
                  "%s", err.message);
    dsarl_session_close(&s);
    // the real table opens
    sc.model_ops = &glm5_2_model_ops;
    OK(dsarl_session_open(&sc, &s, &err));
    dsarl_session_close(&s);
    dsarl_recipe_free(recipe);
}
END_TEST

int main(void)
{
    dsarl_error_clear(&err);
    if (!dsarl_comm_launched()) {
        fprintf(stderr, "check_dp_train_mpi runs under mpirun (-np 2 or 4)\n");
        return 77;
    }
    if (dsarl_comm_init(&comm, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return EXIT_FAILURE;
    }
    dsarl_layout l;
    int rc = dsarl_layout_make(dsarl_comm_world_size(comm), 1, 1, 1, 1, &l, &err);
    l.collective_timeout_s = 60; // a failed assertion on one rank leaves its peers waiting: end the run quickly
    if (rc < 0 || dsarl_comm_build(comm, &l, &par, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return EXIT_FAILURE;
    }
    Suite *s = suite_create("dp_train_mpi");
    TCase *tc = tcase_create("dp");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_glm52_all_reduce);
    tcase_add_test(tc, test_glm52_distributed_optimizer);
    tcase_add_test(tc, test_glm52_distributed_one_bucket);
    tcase_add_test(tc, test_glm51_all_reduce);
    tcase_add_test(tc, test_glm51_distributed_optimizer);
    tcase_add_test(tc, test_no_reduction_differs);
    tcase_add_test(tc, test_session_refuses_a_model_without_reduction);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, par.world_rank == 0 ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    int32_t any = failed;
    dsarl_group_all_reduce_host(par.world, &any, 1, DSARL_DTYPE_I32, DSARL_REDUCE_MAX, &err);
    dsarl_comm_finalize(comm);
    return any ? EXIT_FAILURE : EXIT_SUCCESS;
}
