/* check_glm5_ep_mpi.c: expert parallelism of the glm5 routed experts on the CPU device, under `mpirun -np 2` (EP2,
 * the two ranks data-parallel: different batches) and `-np 4` (EP4, or EP2 x EDP2 with the argument 2).
 *
 * Every rank builds the EP model and the one-process model (same config and seed) and runs both on its own batch;
 * batches come from a seed of the world rank, so each rank regenerates its EP peers' batches too. The EP model must
 * give the one-process log-probs and cached-decode logits; its dense gradients are the one-process gradients of
 * the rank's batch, and its expert shard's gradients the sum over the EP group's batches of the one-process
 * gradient slice of those experts (every token routed to an expert reaches its owner). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "cpu_device.h"
#include "dsa_reference.h"
#include "glm5_ops.h"
#include "recipe_internal.h"
#include "parallel_compare.h"

static dsarl_comm *comm;
static dsarl_parallel par;
static dsarl_device *dev;
static dsarl_dsa_context *dsa;
static dsarl_error err;

#define OK(call) ck_assert_msg((call) == DSARL_OK, "%s: %s", #call, err.message)

// GLM-5.2: 8 experts in 2 groups (grouped routing), a dense first layer, full and shared indexer layers.
static const char *recipe_52 =
    "policy:\n"
    "  model_config:\n"
    "    vocab_size: 48\n    hidden_size: 16\n    intermediate_size: 24\n    moe_intermediate_size: 6\n"
    "    num_hidden_layers: 3\n    num_attention_heads: 2\n    num_key_value_heads: 2\n    q_lora_rank: 12\n"
    "    kv_lora_rank: 8\n    qk_nope_head_dim: 4\n    qk_rope_head_dim: 4\n    v_head_dim: 6\n"
    "    n_routed_experts: 8\n    num_experts_per_tok: 2\n    n_group: 2\n    topk_group: 2\n    index_topk: 3\n"
    "    index_head_dim: 8\n    index_n_heads: 3\n    first_k_dense_replace: 1\n    index_topk_pattern: FSF\n"
    "    n_shared_experts: 1\n    initializer_range: 0.35\n";

// GLM-5.1: 16 experts, 3 per token, two MoE layers.
static const char *recipe_51 =
    "policy:\n"
    "  model_config:\n"
    "    vocab_size: 60\n    hidden_size: 24\n    intermediate_size: 16\n    moe_intermediate_size: 8\n"
    "    num_hidden_layers: 3\n    num_attention_heads: 3\n    num_key_value_heads: 3\n    q_lora_rank: 8\n"
    "    kv_lora_rank: 8\n    qk_nope_head_dim: 4\n    qk_rope_head_dim: 4\n    v_head_dim: 4\n"
    "    n_routed_experts: 16\n    num_experts_per_tok: 3\n    index_topk: 4\n"
    "    index_head_dim: 8\n    index_n_heads: 2\n    first_k_dense_replace: 1\n"
    "    n_shared_experts: 1\n    initializer_range: 0.3\n";

// One rank's batch: 1-3 sequences of 2-9 tokens, targets (some ignored), dlogprobs, all from (salt, world rank).
enum { MAX_T = 32, MAX_B = 3 };
typedef struct rank_batch {
    int32_t tokens[MAX_T], targets[MAX_T], cu[MAX_B + 1];
    float dlogprobs[MAX_T];
    dsarl_token_batch b;
} rank_batch;

static void batch_of(int salt, int32_t rank, int64_t V, rank_batch *rb)
{
    uint64_t h = mix(((uint64_t)salt << 32) ^ (uint64_t)rank);
    int32_t B = 1 + (int32_t)(h % MAX_B);
    rb->cu[0] = 0;
    for (int32_t s = 0; s < B; s++)
        rb->cu[s + 1] = rb->cu[s] + 2 + (int32_t)((h = mix(h)) % 8);
    for (int32_t t = 0; t < rb->cu[B]; t++) {
        rb->tokens[t] = 1 + (int32_t)((h = mix(h)) % (uint64_t)(V - 1));
        rb->targets[t] = (h >> 20) % 7 == 0 ? -1 : (int32_t)((h >> 24) % (uint64_t)V);
        rb->dlogprobs[t] = 0.25f + (float)((h >> 40) % 1000) / 1000.0f;
    }
    rb->b = (dsarl_token_batch){.struct_size = sizeof(dsarl_token_batch), .n_tokens = rb->cu[B], .n_sequences = B,
                                .tokens = rb->tokens, .cu_seqlens = rb->cu};
}

typedef struct loaded {
    const dsarl_model_ops *ops;
    dsarl_recipe *recipe;
    dsarl_model *m;
} loaded;

// A model from recipe text: under this process's layout (parallel) or in one process (NULL); 1-D tensors (norms,
// router biases) moved off their initial values so the router bias takes part in routing.
static int load_on(const char *text, const dsarl_model_ops *ops, const dsarl_device_ops *device_ops,
                   const dsarl_parallel *parallel, loaded *l)
{
    l->ops = ops;
    ck_assert_int_eq(dsarl_recipe_load_string(text, "ep.yaml", &l->recipe, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(l->recipe, &err), 0);
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(l->recipe),
                             .device_ops = device_ops, .device = dev, .dsa_ops = &dsarl_dsa_reference_ops,
                             .dsa = dsa, .parallel = parallel, .seed = 17};
    int rc = ops->create(&mc, &l->m, &err);
    if (rc != DSARL_OK) {
        dsarl_recipe_free(l->recipe);
        return rc;
    }
    for (int64_t i = 0; i < ops->parameter_tensors(l->m); i++) {
        const char *name;
        int32_t ndim;
        int64_t shape[3];
        OK(ops->parameter_info(l->m, i, &name, &ndim, shape, NULL, &err));
        if (ndim != 1)
            continue;
        float v[256];
        ck_assert_int_le(shape[0], 256);
        OK(ops->read_parameter(l->m, i, v, NULL, &err));
        for (int64_t j = 0; j < shape[0]; j++)
            v[j] += 0.1f * sinf((float)(7 * i + 3 * j));
        OK(ops->write_parameter(l->m, i, v, &err));
    }
    return DSARL_OK;
}

static int load(const char *text, const dsarl_model_ops *ops, const dsarl_parallel *parallel, loaded *l)
{
    return load_on(text, ops, &dsarl_cpu_device_ops, parallel, l);
}

static void unload(loaded *l)
{
    l->ops->destroy(l->m);
    dsarl_recipe_free(l->recipe);
}

static bool is_expert(const char *name) { return strstr(name, ".mlp.experts.") != NULL; }

static int64_t numel_of(int32_t ndim, const int64_t *shape)
{
    return shape[0] * (ndim > 1 ? shape[1] : 1) * (ndim > 2 ? shape[2] : 1);
}

// max |got - want| / max |want| over n values (0 when both vanish)
static double rel_diff(const float *got, const float *want, int64_t n, double *scale)
{
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)got[i] - want[i])), s = fmax(s, fabs((double)want[i]));
    if (scale)
        *scale = s;
    return s > 0 ? d / s : d;
}

// The largest of every rank's value (reported by rank 0).
static double world_max(double v)
{
    OK(dsarl_group_all_reduce_host(par.world, &v, 1, DSARL_DTYPE_F64, DSARL_REDUCE_MAX, &err));
    return v;
}

static void check_logprobs(loaded *ep, loaded *one, const rank_batch *rb)
{
    float got[MAX_T], want[MAX_T];
    OK(ep->ops->forward_logprobs(ep->m, &rb->b, rb->targets, got, &err));
    OK(one->ops->forward_logprobs(one->m, &rb->b, rb->targets, want, &err));
    double scale, d = rel_diff(got, want, rb->b.n_tokens, &scale);
    ck_assert_msg(scale > 0.1, "degenerate log-probs (max %g)", scale);
    ck_assert_msg(d <= 1e-5, "rank %d: EP log-probs differ from one process by %.3g (relative)", par.world_rank, d);
    // a fixed layout reproduces itself bit for bit (received rows are summed in a fixed order)
    float again[MAX_T];
    OK(ep->ops->forward_logprobs(ep->m, &rb->b, rb->targets, again, &err));
    ck_assert(memcmp(again, got, (size_t)rb->b.n_tokens * sizeof(float)) == 0);
    d = world_max(d);
    if (par.world_rank == 0)
        fprintf(stderr, "  log-probs (%lld tokens): max relative diff %.3g\n", (long long)rb->b.n_tokens, d);
}

// Gradients of the EP model on this rank's batch against the one-process gradients (see the file comment); unless
// idle, some gradient must reach this rank's experts.
static void check_grads(loaded *ep, loaded *one, int salt, bool idle)
{
    int64_t n = ep->ops->parameter_tensors(ep->m), V = ep->ops->vocab_size(ep->m);
    ck_assert_int_eq(n, one->ops->parameter_tensors(one->m));
    rank_batch mine;
    batch_of(salt, par.world_rank, V, &mine);
    OK(ep->ops->zero_grad(ep->m, &err));
    OK(ep->ops->backward(ep->m, &mine.b, mine.targets, mine.dlogprobs, NULL, &err));
    float **got = calloc((size_t)n, sizeof(float *)), **want = calloc((size_t)n, sizeof(float *));
    for (int64_t i = 0; i < n; i++) {
        const char *name;
        int32_t ndim;
        int64_t shape[3];
        OK(ep->ops->parameter_info(ep->m, i, &name, &ndim, shape, NULL, &err));
        got[i] = malloc((size_t)numel_of(ndim, shape) * sizeof(float));
        want[i] = calloc((size_t)numel_of(ndim, shape), sizeof(float));
        OK(ep->ops->read_parameter(ep->m, i, NULL, got[i], &err));
    }
    // the one-process gradients of every EP peer's batch: dense ones of this rank's, expert slices summed
    for (int32_t q = 0; q < par.ep_size; q++) {
        int32_t wr = dsarl_group_world_rank(par.ep, q);
        rank_batch rb;
        batch_of(salt, wr, V, &rb);
        OK(one->ops->zero_grad(one->m, &err));
        OK(one->ops->backward(one->m, &rb.b, rb.targets, rb.dlogprobs, NULL, &err));
        for (int64_t i = 0; i < n; i++) {
            const char *name;
            int32_t ndim;
            int64_t shape[3], local[3];
            OK(one->ops->parameter_info(one->m, i, &name, &ndim, shape, NULL, &err));
            OK(ep->ops->parameter_info(ep->m, i, &name, &ndim, local, NULL, &err));
            int64_t full = numel_of(ndim, shape), part = numel_of(ndim, local);
            if (!is_expert(name) && wr != par.world_rank)
                continue;
            float *g = malloc((size_t)full * sizeof(float));
            OK(one->ops->read_parameter(one->m, i, NULL, g, &err));
            if (is_expert(name)) { // this rank's experts: a block of the leading dimension
                ck_assert_int_eq(full, part * par.ep_size);
                for (int64_t j = 0; j < part; j++)
                    want[i][j] += g[par.ep_rank * part + j];
            } else {
                ck_assert_int_eq(full, part);
                memcpy(want[i], g, (size_t)full * sizeof(float));
            }
            free(g);
        }
    }
    double worst_dense = 0, worst_expert = 0, expert_scale = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *name;
        int32_t ndim;
        int64_t shape[3];
        int trainable;
        OK(ep->ops->parameter_info(ep->m, i, &name, &ndim, shape, &trainable, &err));
        double scale, d = rel_diff(got[i], want[i], numel_of(ndim, shape), &scale);
        ck_assert_msg(d <= 1e-5, "rank %d: gradient of %s differs by %.3g (relative to its max %.3g)",
                      par.world_rank, name, d, scale);
        if (is_expert(name))
            worst_expert = fmax(worst_expert, d), expert_scale = fmax(expert_scale, scale);
        else
            worst_dense = fmax(worst_dense, d);
        free(got[i]), free(want[i]);
    }
    ck_assert_msg(idle || expert_scale > 0, "rank %d: no gradient reached its experts", par.world_rank);
    worst_dense = world_max(worst_dense), worst_expert = world_max(worst_expert);
    if (par.world_rank == 0)
        fprintf(stderr, "  gradients: dense max relative diff %.3g, expert shard %.3g\n", worst_dense, worst_expert);
    free(got), free(want);
}

// Cached decode: prefill of this rank's prompts then 3 one-token steps (every rank the same number of calls, each
// with its own sequences), logits against the one-process model's. With `finish`, odd world ranks' sequences end
// after the first step: their later calls are empty batches that only serve their experts.
static void check_decode(loaded *ep, loaded *one, int salt, bool finish)
{
    int64_t V = ep->ops->vocab_size(ep->m);
    rank_batch rb;
    batch_of(salt + 1000, par.world_rank, V, &rb);
    int32_t B = rb.b.n_sequences, slots[MAX_B] = {2, 0, 1}, cu[MAX_B + 1] = {0, 1, 2, 3};
    enum { STEPS = 3 };
    dsarl_model_cache *ce = NULL, *co = NULL;
    OK(ep->ops->cache_create(ep->m, MAX_B, 10 + STEPS, &ce, &err));
    OK(one->ops->cache_create(one->m, MAX_B, 10 + STEPS, &co, &err));
    float *got = malloc((size_t)(MAX_B * V) * sizeof(float)), *want = malloc((size_t)(MAX_B * V) * sizeof(float));
    double worst = 0;
    uint64_t h = mix((uint64_t)salt ^ ((uint64_t)par.world_rank << 16));
    for (int s = 0; s <= STEPS; s++) {
        int32_t next[MAX_B];
        dsarl_token_batch step = {.struct_size = sizeof(step), .n_tokens = B, .n_sequences = B, .tokens = next,
                                  .cu_seqlens = cu};
        for (int32_t b = 0; b < B; b++)
            next[b] = 1 + (int32_t)((h = mix(h)) % (uint64_t)(V - 1));
        const dsarl_token_batch *batch = s == 0 ? &rb.b : &step;
        if (finish && s > 1 && par.world_rank % 2 == 1) {
            dsarl_token_batch none = {.struct_size = sizeof(none), .n_tokens = 0, .n_sequences = 0, .tokens = next,
                                      .cu_seqlens = cu};
            OK(ep->ops->forward_cached(ep->m, ce, &none, slots, got, &err));
            continue;
        }
        OK(ep->ops->forward_cached(ep->m, ce, batch, slots, got, &err));
        OK(one->ops->forward_cached(one->m, co, batch, slots, want, &err));
        double scale, d = rel_diff(got, want, B * V, &scale);
        ck_assert_msg(scale > 0.05, "degenerate decode logits (max %g)", scale);
        ck_assert_msg(d <= 1e-5, "rank %d step %d: EP decode logits differ by %.3g (relative)", par.world_rank, s, d);
        worst = fmax(worst, d);
    }
    worst = world_max(worst);
    if (par.world_rank == 0)
        fprintf(stderr, "  cached decode (prefill + %d steps%s): max relative diff %.3g\n", STEPS,
                finish ? ", odd ranks finished after one" : "", worst);
    free(got), free(want);
    ep->ops->cache_free(ce);
    one->ops->cache_free(co);
}

static void check_model(const char *text, const dsarl_model_ops *ops, int salt, const char *what)
{
    if (par.world_rank == 0)
        fprintf(stderr, "%s, EP%d x EDP%d:\n", what, par.ep_size, par.edp_size);
    loaded ep, one;
    OK(load(text, ops, &par, &ep));
    OK(load(text, ops, NULL, &one));
    rank_batch rb;
    batch_of(salt, par.world_rank, ops->vocab_size(ep.m), &rb);
    check_logprobs(&ep, &one, &rb);
    check_grads(&ep, &one, salt, false);
    check_decode(&ep, &one, salt, false);
    check_decode(&ep, &one, salt + 7, true);
    unload(&ep);
    unload(&one);
}

/* A trained MTP depth (a MoE block of its own) under EP: the training log-probs and every gradient, the depth's
 * experts' included, as one process's. */
START_TEST(test_mtp_ep)
{
    size_t n = strlen(recipe_52) + 128;
    char *text = malloc(n);
    snprintf(text, n, "%s    num_nextn_predict_layers: 1\n  megatron_cfg:\n    mtp_num_layers: 1\n", recipe_52);
    loaded ep, one;
    OK(load(text, &glm5_2_model_ops, &par, &ep));
    OK(load(text, &glm5_2_model_ops, NULL, &one));
    ck_assert_int_eq(ep.m->cfg.mtp_layers, 1);
    if (par.world_rank == 0)
        fprintf(stderr, "GLM-5.2 with an MTP depth, EP%d x EDP%d:\n", par.ep_size, par.edp_size);
    check_grads(&ep, &one, 5, false);
    // the MTP loss of this rank's batch (the EP model's last pass) against one process's training forward of it
    float mine = 0, want = 0, lp[MAX_T];
    rank_batch rb;
    batch_of(5, par.world_rank, ep.ops->vocab_size(ep.m), &rb);
    ck_assert_int_eq(ep.ops->mtp_loss(ep.m, NULL, 0.0, &mine), 1);
    OK(one.ops->train_forward(one.m, &rb.b, rb.targets, lp, &err));
    ck_assert_int_eq(one.ops->mtp_loss(one.m, NULL, 0.0, &want), 1);
    ck_assert_msg(mine > 0 && fabsf(mine - want) <= 1e-5f * want, "rank %d: MTP loss %g, one process %g",
                  par.world_rank, (double)mine, (double)want);
    unload(&ep);
    unload(&one);
    free(text);
}
END_TEST

START_TEST(test_glm52_ep)
{
    check_model(recipe_52, &glm5_2_model_ops, 1, "GLM-5.2, 8 experts");
}
END_TEST

START_TEST(test_glm51_ep)
{
    check_model(recipe_51, &glm5_1_model_ops, 2, "GLM-5.1, 16 experts");
}
END_TEST

// Activation recompute: the MoE layers rerun (and re-dispatch) in the backward, one activation set for all layers.
START_TEST(test_recompute_ep)
{
    size_t n = strlen(recipe_51) + 128;
    char *text = malloc(n);
    snprintf(text, n, "%s  megatron_cfg:\n    activation_checkpointing: true\n", recipe_51);
    if (par.world_rank == 0)
        fprintf(stderr, "GLM-5.1 with activation recompute, EP%d:\n", par.ep_size);
    loaded ep, one;
    OK(load(text, &glm5_1_model_ops, &par, &ep));
    OK(load(recipe_51, &glm5_1_model_ops, NULL, &one));
    ck_assert(ep.m->activation_recompute);
    check_grads(&ep, &one, 3, false);
    unload(&ep);
    unload(&one);
    free(text);
}
END_TEST

// Sets the router bias of EP rank 1's experts to -100 in every MoE layer: no token picks them.
static void starve_rank1(loaded *l, int32_t ep_size)
{
    for (int64_t i = 0; i < l->ops->parameter_tensors(l->m); i++) {
        const char *name;
        int32_t ndim;
        int64_t shape[3];
        OK(l->ops->parameter_info(l->m, i, &name, &ndim, shape, NULL, &err));
        if (!strstr(name, "e_score_correction_bias"))
            continue;
        float v[256];
        OK(l->ops->read_parameter(l->m, i, v, NULL, &err));
        for (int64_t e = shape[0] / ep_size; e < 2 * shape[0] / ep_size; e++)
            v[e] = -100.0f;
        OK(l->ops->write_parameter(l->m, i, v, &err));
    }
}

// A rank that receives no rows still takes part in every exchange; its experts' gradients stay zero.
START_TEST(test_idle_owner)
{
    if (par.world_rank == 0)
        fprintf(stderr, "GLM-5.2, EP rank 1's experts never chosen, EP%d:\n", par.ep_size);
    loaded ep, one;
    OK(load(recipe_52, &glm5_2_model_ops, &par, &ep));
    OK(load(recipe_52, &glm5_2_model_ops, NULL, &one));
    starve_rank1(&ep, par.ep_size);
    starve_rank1(&one, par.ep_size);
    rank_batch rb;
    batch_of(4, par.world_rank, glm5_2_model_ops.vocab_size(ep.m), &rb);
    check_logprobs(&ep, &one, &rb);
    check_grads(&ep, &one, 4, par.ep_rank == 1);
    check_decode(&ep, &one, 4, true);
    unload(&ep);
    unload(&one);
}
END_TEST

// The CPU device whose all-gathers of int64 values (the dispatch's row counts) claim -5 rows from the second rank.
static dsarl_device_ops corrupt_ops;

static int corrupt_all_gather(dsarl_device *d, const dsarl_group *g, void *out, const void *in, int64_t n,
                              dsarl_dtype dtype, dsarl_error *e)
{
    DSARL_TRY(dsarl_cpu_device_ops.all_gather(d, g, out, in, n, dtype, e));
    if (dtype == DSARL_DTYPE_I64 && dsarl_group_size(g) > 1)
        ((int64_t *)out)[n] = -5;
    return DSARL_OK;
}

// Peers' counts size buffers: implausible ones are refused, by every rank at once (nobody left in an exchange).
START_TEST(test_bad_counts_refused)
{
    corrupt_ops = dsarl_cpu_device_ops;
    corrupt_ops.all_gather = corrupt_all_gather;
    loaded ep;
    OK(load_on(recipe_52, &glm5_2_model_ops, &corrupt_ops, &par, &ep));
    rank_batch rb;
    batch_of(5, par.world_rank, glm5_2_model_ops.vocab_size(ep.m), &rb);
    float lp[MAX_T];
    ck_assert_int_ne(ep.ops->forward_logprobs(ep.m, &rb.b, rb.targets, lp, &err), DSARL_OK);
    ck_assert_msg(strstr(err.message, "reported -5 rows") && strstr(err.message, "disagree on the dispatch"),
                  "refusal: %s", err.message);
    if (par.world_rank == 0)
        fprintf(stderr, "bad counts: %s\n", err.message);
    unload(&ep);
}
END_TEST

START_TEST(test_experts_not_divisible)
{
    // 9 experts in 3 groups: divisible by neither 2 nor 4
    const char *text =
        "policy:\n"
        "  model_config:\n"
        "    vocab_size: 48\n    hidden_size: 16\n    intermediate_size: 24\n    moe_intermediate_size: 6\n"
        "    num_hidden_layers: 2\n    num_attention_heads: 2\n    num_key_value_heads: 2\n    q_lora_rank: 12\n"
        "    kv_lora_rank: 8\n    qk_nope_head_dim: 4\n    qk_rope_head_dim: 4\n    v_head_dim: 6\n"
        "    n_routed_experts: 9\n    num_experts_per_tok: 2\n    n_group: 3\n    topk_group: 2\n"
        "    index_topk: 3\n    index_head_dim: 8\n    index_n_heads: 3\n    first_k_dense_replace: 1\n"
        "    n_shared_experts: 1\n";
    loaded l;
    ck_assert_int_ne(load(text, &glm5_2_model_ops, &par, &l), DSARL_OK);
    ck_assert_msg(strstr(err.message, "n_routed_experts") && strstr(err.message, "expert_model_parallel_size") &&
                  !strchr(err.message, '\n'), "refusal: %s", err.message);
    if (par.world_rank == 0)
        fprintf(stderr, "refusal: %s\n", err.message);
    // the same config in one process is fine
    OK(load(text, &glm5_2_model_ops, NULL, &l));
    unload(&l);
}
END_TEST

int main(int argc, char **argv)
{
    dsarl_error_clear(&err);
    if (!dsarl_comm_launched()) {
        fprintf(stderr, "check_glm5_ep_mpi runs under mpirun (-np 2 or 4)\n");
        return 77;
    }
    if (dsarl_comm_init(&comm, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return EXIT_FAILURE;
    }
    // every rank data-parallel (its own batch); EP over all of them, or over the size given (EP x EDP)
    int32_t world = dsarl_comm_world_size(comm), ep = argc > 1 ? atoi(argv[1]) : world;
    dsarl_layout l;
    int rc = dsarl_layout_make(world, 1, 1, 1, ep, &l, &err);
    l.collective_timeout_s = 60; // a failed assertion on one rank leaves its peers waiting: end the run quickly
    if (rc < 0 || dsarl_comm_build(comm, &l, &par, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return EXIT_FAILURE;
    }
    dsarl_device_config dc = {.struct_size = sizeof dc, .parallel = &par, .threads = 1};
    if (cpu_create(&dc, &dev, &err) < 0 ||
        dsarl_dsa_reference_ops.create(&dsarl_cpu_device_ops, dev, NULL, &dsa, &err) < 0) {
        fprintf(stderr, "cpu device: %s\n", err.message);
        return EXIT_FAILURE;
    }
    Suite *s = suite_create("glm5_ep_mpi");
    TCase *tc = tcase_create("ep");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_glm52_ep);
    tcase_add_test(tc, test_mtp_ep);
    tcase_add_test(tc, test_glm51_ep);
    tcase_add_test(tc, test_recompute_ep);
    tcase_add_test(tc, test_idle_owner);
    tcase_add_test(tc, test_bad_counts_refused);
    tcase_add_test(tc, test_experts_not_divisible);
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
