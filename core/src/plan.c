/* plan.c: `dsarl plan`'s arithmetic: stage split, per-GPU memory of every pipeline stage, and the fit check.
 *
 * The model's plan (dsarl_model_ops.plan) gives what only the model knows, per layer and per rank; everything here is
 * Megatron's bookkeeping over it (docs/plan.md): bf16 weights, gradients of the recipe's dtype, 12 bytes of AdamW
 * state per parameter (fp32 master, m, v) sharded over dp x cp (dense) or edp (experts) by the distributed
 * optimizer, activations of the micro-batches a 1F1B stage holds at once, the buffers of one micro-batch's
 * expert all-to-all and pipeline send/receive, and the generation cache. */
#include "plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MCFG "policy.megatron_cfg."
#define GIB (1024.0 * 1024.0 * 1024.0)

static int get_positive(const dsarl_node *root, const char *key, int64_t def, int64_t max, int64_t *out,
                        dsarl_error *err)
{
    DSARL_TRY(dsarl_recipe_int_or(root, key, def, out, err));
    if (*out < 1 || *out > max)
        return dsarl_recipe_fail(root, key, err, DSARL_E_INVALID, "must be an integer in [1, %lld], got %lld",
                                 (long long)max, (long long)*out);
    return DSARL_OK;
}

int dsarl_plan_settings_from_recipe(const dsarl_node *root, const dsarl_layout *layout, dsarl_plan_settings *s,
                                    dsarl_error *err)
{
    memset(s, 0, sizeof *s);
    s->layout = *layout;
    int64_t v;
    DSARL_TRY(dsarl_recipe_int_or(root, MCFG "num_layers_in_first_pipeline_stage", 0, &v, err));
    if (v < 0 || v > 1 << 20)
        return dsarl_recipe_fail(root, MCFG "num_layers_in_first_pipeline_stage", err, DSARL_E_INVALID,
                                 "must be null or in [1, 1048576], got %lld", (long long)v);
    s->first_stage_layers = (int32_t)v;
    DSARL_TRY(dsarl_recipe_int_or(root, MCFG "num_layers_in_last_pipeline_stage", 0, &v, err));
    if (v < 0 || v > 1 << 20)
        return dsarl_recipe_fail(root, MCFG "num_layers_in_last_pipeline_stage", err, DSARL_E_INVALID,
                                 "must be null or in [1, 1048576], got %lld", (long long)v);
    s->last_stage_layers = (int32_t)v;
    // bounds keep every product below 2^53 (exact in double) and every count in int32 where it is one
    DSARL_TRY(get_positive(root, "policy.train_micro_batch_size", 1, 1 << 16, &s->micro_batch, err));
    DSARL_TRY(get_positive(root, "policy.max_total_sequence_length", 2, 1 << 24, &s->seq_len, err));
    DSARL_TRY(get_positive(root, "policy.train_global_batch_size", s->micro_batch, 1 << 24, &s->global_batch, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "policy.logprob_chunk_size", 0, &s->logprob_chunk, err));
    if (s->logprob_chunk < 0)
        return dsarl_recipe_fail(root, "policy.logprob_chunk_size", err, DSARL_E_INVALID,
                                 "must be null or > 0, got %lld", (long long)s->logprob_chunk);
    if (s->global_batch % (s->micro_batch * layout->dp) != 0)
        return dsarl_recipe_fail(root, "policy.train_global_batch_size", err, DSARL_E_INVALID,
                                 "is %lld, not a multiple of train_micro_batch_size (%lld) x data parallel (%d); each "
                                 "data-parallel replica runs whole micro-batches", (long long)s->global_batch,
                                 (long long)s->micro_batch, layout->dp);
    int64_t per_replica = s->global_batch / (s->micro_batch * layout->dp);
    if (layout->vpp > 1 && per_replica % layout->pp != 0)
        return dsarl_recipe_fail(root, "policy.train_global_batch_size", err, DSARL_E_INVALID,
                                 "(%lld) makes %lld micro-batches per data-parallel replica, which the interleaved "
                                 "schedule (virtual_pipeline_model_parallel_size %d) needs to be a multiple of "
                                 "pipeline_model_parallel_size %d, as Megatron does", (long long)s->global_batch,
                                 (long long)per_replica, layout->vpp, layout->pp);
    DSARL_TRY(dsarl_recipe_bool_or(root, MCFG "activation_checkpointing", false, &s->recompute, err));
    bool fp32_grads = false;
    DSARL_TRY(dsarl_recipe_bool_or(root, MCFG "distributed_data_parallel_config.grad_reduce_in_fp32", false,
                                   &fp32_grads, err));
    s->grad_bytes = fp32_grads ? 4 : 2;
    bool offload = false;
    DSARL_TRY(dsarl_recipe_bool_or(root, MCFG "optimizer.optimizer_cpu_offload", false, &offload, err));
    double fraction = 1.0;
    DSARL_TRY(dsarl_recipe_double_or(root, MCFG "optimizer.optimizer_offload_fraction", 1.0, &fraction, err));
    if (offload && !(fraction >= 0.0 && fraction <= 1.0))
        return dsarl_recipe_fail(root, MCFG "optimizer.optimizer_offload_fraction", err, DSARL_E_INVALID,
                                 "must be in [0, 1], got %g", fraction);
    // NeMo RL's default fraction is 0.0 next to optimizer_cpu_offload: false; with offload on and no fraction,
    // everything moves
    s->optimizer_offload = offload ? fraction : 0.0;
    bool skip_ref = false;
    DSARL_TRY(dsarl_recipe_bool_or(root, "grpo.skip_reference_policy_logprobs_calculation", false, &skip_ref, err));
    s->logprob_passes = skip_ref ? 1 : 2;

    DSARL_TRY(dsarl_recipe_bool_or(root, "policy.generation.colocated.enabled", true, &s->colocated, err));
    int64_t prompts, gens;
    DSARL_TRY(get_positive(root, "grpo.num_prompts_per_step", 1, 1 << 20, &prompts, err));
    DSARL_TRY(get_positive(root, "grpo.num_generations_per_prompt", 1, 1 << 16, &gens, err));
    s->rollouts = prompts * gens;
    DSARL_TRY(get_positive(root, "data.max_input_seq_length", s->seq_len, 1 << 24, &s->prompt_tokens, err));
    DSARL_TRY(get_positive(root, "policy.generation.max_new_tokens", s->seq_len, 1 << 24, &s->new_tokens, err));
    // a sequence never grows past the training length (NeMo RL stops generation there); when prompt + new tokens
    // would pass it, plan the worst case for time: a short prompt generating up to the cap
    if (s->new_tokens > s->seq_len - 1)
        s->new_tokens = s->seq_len - 1;
    if (s->prompt_tokens > s->seq_len - s->new_tokens)
        s->prompt_tokens = s->seq_len - s->new_tokens;
    // absent or null: unset (0 inside); 0 as a value is refused, as the generation engine refuses it
    s->gen_memory_utilization = 0.0;
    const dsarl_node *util = dsarl_node_get(root, "policy.generation.gpu_memory_utilization");
    if (util && dsarl_node_kind(util) != DSARL_NODE_NULL) {
        DSARL_TRY(dsarl_recipe_double(root, "policy.generation.gpu_memory_utilization", &s->gen_memory_utilization,
                                      err));
        if (!(s->gen_memory_utilization > 0.0 && s->gen_memory_utilization <= 1.0))
            return dsarl_recipe_fail(root, "policy.generation.gpu_memory_utilization", err, DSARL_E_INVALID,
                                     "must be in (0, 1] (null: unset), got %g", s->gen_memory_utilization);
    }
    if (!s->colocated) {
        int64_t nodes, per_node, tp, ep;
        DSARL_TRY(get_positive(root, "policy.generation.colocated.resources.num_nodes", 1, 1 << 16, &nodes, err));
        DSARL_TRY(get_positive(root, "policy.generation.colocated.resources.gpus_per_node", layout->gpus_per_node,
                               1 << 10, &per_node, err));
        s->gen_gpus = (int32_t)(nodes * per_node);
        DSARL_TRY(get_positive(root, "policy.generation.tensor_parallel_size", layout->tp, s->gen_gpus, &tp, err));
        DSARL_TRY(get_positive(root, "policy.generation.expert_parallel_size", s->gen_gpus, s->gen_gpus, &ep, err));
        if (s->gen_gpus % tp || s->gen_gpus % ep)
            return DSARL_FAIL(err, DSARL_E_INVALID,
                              "policy.generation.tensor_parallel_size (%lld) and expert_parallel_size (%lld) must "
                              "divide the %d dedicated generation GPUs (policy.generation.colocated.resources)",
                              (long long)tp, (long long)ep, s->gen_gpus);
        s->gen_tp = (int32_t)tp, s->gen_ep = (int32_t)ep;
    }
    s->gpu_bytes = 80.0 * GIB;
    s->reserve_bytes = 2.0 * GIB;
    s->peak_flops = 989e12;
    s->hbm_bytes_per_s = 3.35e12;
    return DSARL_OK;
}

int dsarl_plan_stage_layers(int32_t n_layers, int32_t pp, int32_t first, int32_t last, int32_t *starts,
                            dsarl_error *err)
{
    if (pp < 1 || n_layers < pp)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          MCFG "pipeline_model_parallel_size %d is more than the model's %d layers; every stage needs "
                          "at least one layer", pp, n_layers);
    if (pp == 1)
        first = last = 0; // one stage holds everything (Megatron ignores the uneven sizes)
    int32_t fixed = (first > 0) + (last > 0);
    int64_t rest = (int64_t)n_layers - first - last;
    int32_t middle = pp - fixed;
    if (pp == 1 || (middle == 0 && rest == 0) || (middle > 0 && rest > 0 && rest % middle == 0)) {
        int32_t each = middle > 0 ? (int32_t)(rest / middle) : 0;
        starts[0] = 0;
        for (int32_t s = 0; s < pp; s++) {
            int32_t size = s == 0 && first > 0 ? first : s == pp - 1 && last > 0 ? last : each;
            starts[s + 1] = starts[s] + size;
        }
        if (pp == 1)
            starts[1] = n_layers;
        return DSARL_OK;
    }
    return DSARL_FAIL(err, DSARL_E_INVALID,
                      "the model's %d layers minus " MCFG "num_layers_in_first_pipeline_stage (%d) and "
                      "num_layers_in_last_pipeline_stage (%d) leave %lld layers, which do not split evenly over the "
                      "other %d of pipeline_model_parallel_size %d stages; pick sizes that leave a multiple of %d",
                      n_layers, first, last, (long long)rest, middle, pp, middle > 0 ? middle : 1);
}

int dsarl_plan_chunk_layers(int32_t n_layers, int32_t pp, int32_t vpp, int32_t first, int32_t last,
                            int32_t *starts, dsarl_error *err)
{
    if (vpp < 1 || (vpp > 1 && pp < 2))
        return DSARL_FAIL(err, DSARL_E_INVALID, MCFG "virtual_pipeline_model_parallel_size %d needs "
                          "pipeline_model_parallel_size > 1 (it is %d)", vpp, pp);
    DSARL_TRY(dsarl_plan_stage_layers(n_layers, pp, first, last, starts, err));
    if (vpp == 1)
        return DSARL_OK;
    int32_t *count = malloc((size_t)pp * sizeof *count);
    if (!count)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "plan: out of memory for %d stages", pp);
    for (int32_t r = 0; r < pp; r++)
        count[r] = starts[r + 1] - starts[r];
    for (int32_t r = 0; r < pp; r++) {
        if (count[r] % vpp == 0)
            continue;
        int32_t c = count[r], a = starts[r];
        free(count);
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          MCFG "virtual_pipeline_model_parallel_size %d does not divide the %d layers of pipeline "
                          "stage %d (layers %d-%d); each stage's count (num_layers_in_first_pipeline_stage, "
                          "num_layers_in_last_pipeline_stage or the even share of the rest) must be a multiple of it, "
                          "as Megatron requires", vpp, c, r, a, a + c - 1);
    }
    // virtual stage k = chunk * pp + rank holds count[rank] / vpp layers, in k order
    starts[0] = 0;
    for (int32_t k = 0; k < vpp * pp; k++)
        starts[k + 1] = starts[k] + count[k % pp] / vpp;
    free(count);
    return DSARL_OK;
}

int dsarl_plan_check_stage_starts(const dsarl_model_plan *mp, const int32_t *starts, int32_t pp, dsarl_error *err)
{
    for (int32_t s = 1; s < pp; s++) {
        int32_t l = starts[s];
        if (l < mp->n_layers && !mp->layers[l].stage_start_ok) {
            char ok[160] = "";
            size_t used = 0;
            int shown = 0;
            for (int32_t i = 0; i < mp->n_layers && shown < 12 && used + 16 < sizeof ok; i++)
                if (mp->layers[i].stage_start_ok)
                    used += (size_t)snprintf(ok + used, sizeof ok - used, "%s%d", shown++ ? ", " : "", i);
            return DSARL_FAIL(err, DSARL_E_INVALID,
                              "pipeline stage %d (layers %d-%d) starts at layer %d, which %s; change " MCFG
                              "num_layers_in_first_pipeline_stage / num_layers_in_last_pipeline_stage so every stage "
                              "starts on a layer that may start one (%s%s)", s, l, starts[s + 1] - 1, l,
                              mp->stage_start_rule ? mp->stage_start_rule : "the model does not allow", ok,
                              shown == 12 ? ", ..." : "");
        }
    }
    return DSARL_OK;
}

int64_t dsarl_plan_params(const int64_t params[DSARL_PLAN_SHARD_COUNT])
{
    int64_t n = 0;
    for (int k = 0; k < DSARL_PLAN_SHARD_COUNT; k++)
        n += params[k];
    return n;
}

static void add_params(int64_t *dst, const int64_t *src)
{
    for (int k = 0; k < DSARL_PLAN_SHARD_COUNT; k++)
        dst[k] += src[k];
}

// Weights, gradients and optimizer state of a GPU holding params (the shard of its layers).
static void state_bytes(const dsarl_plan_settings *s, dsarl_plan_gpu *g, bool trains)
{
    double all = (double)dsarl_plan_params(g->params), experts = (double)g->params[DSARL_PLAN_EXPERT];
    double dense = all - experts;
    g->weights = 2.0 * all + 4.0 * (double)g->buffers; // bf16 weights, fp32 router biases
    if (!trains)
        return;
    g->grads = (double)s->grad_bytes * all;
    const dsarl_layout *l = &s->layout;
    // the distributed optimizer shards each parameter's fp32 master + m + v over the ranks that reduce its gradient
    double dense_shards = l->distributed_optimizer ? (double)l->dp * l->cp : 1.0;
    double expert_shards = l->distributed_optimizer ? (double)l->edp : 1.0;
    double opt = 12.0 * (dense / dense_shards + experts / expert_shards);
    g->optimizer = opt * (1.0 - s->optimizer_offload);
    g->optimizer_host = opt * s->optimizer_offload;
}

int dsarl_plan_compute(const dsarl_plan_settings *s, const dsarl_model_plan *train, const dsarl_model_plan *gen,
                       dsarl_plan *out, dsarl_error *err)
{
    memset(out, 0, sizeof *out);
    const dsarl_layout *l = &s->layout;
    int32_t pp = l->pp;
    if (train->n_layers < 1 || !train->layers)
        return DSARL_FAIL(err, DSARL_E_INVALID, "plan: the model's plan has no layers");
    if (pp > train->n_layers)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          MCFG "pipeline_model_parallel_size %d is more than the model's %d layers", pp,
                          train->n_layers);
    int32_t vpp = l->vpp > 1 ? l->vpp : 1;
    int32_t *starts = malloc((size_t)(vpp * pp + 1) * sizeof *starts);
    out->stages = calloc((size_t)pp, sizeof *out->stages);
    out->starts = starts, out->vpp = vpp;
    if (!starts || !out->stages) {
        dsarl_plan_free(out);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "plan: out of memory for %d stages", pp);
    }
    out->n_stages = pp;
    int rc = dsarl_plan_chunk_layers(train->n_layers, pp, vpp, s->first_stage_layers, s->last_stage_layers, starts,
                                     err);
    if (rc == 0)
        rc = dsarl_plan_check_stage_starts(train, starts, vpp * pp, err);
    if (rc) {
        dsarl_plan_free(out);
        return rc;
    }
    // tokens of one micro-batch on one rank: CP splits each sequence, sequence parallelism splits it over TP
    double seq_tokens = (double)s->micro_batch * (double)s->seq_len / l->cp; // on one CP rank, TP-gathered
    double sp = l->sequence_parallel && l->tp > 1 ? (double)l->tp : 1.0;
    double t = seq_tokens / sp;
    out->train_tokens_per_rank = t;
    out->microbatches = s->global_batch / (s->micro_batch * l->dp);
    // colocated generation: every data-parallel replica (each CP rank one, as CP peers hold the same weights)
    // caches its share of the rollouts at full length
    double gen_replicas = (double)l->dp * l->cp;
    double seqs = ceil((double)s->rollouts / gen_replicas);
    double gen_len = (double)(s->prompt_tokens + s->new_tokens);
    for (int32_t st = 0; st < pp; st++) {
        dsarl_plan_stage *S = &out->stages[st];
        dsarl_plan_gpu *g = &S->gpu;
        S->first_layer = starts[st];
        int64_t m = out->microbatches, in_flight;
        if (vpp == 1) // 1F1B: stage st runs pp - st forward passes before its first backward
            in_flight = pp - st < m ? pp - st : m;
        else // interleaved: the warm-up's chunk passes and the first steady one (all of them when m = pp)
            in_flight = m == pp ? m * vpp : 2 * (pp - st - 1) + (int64_t)(vpp - 1) * pp + 1;
        if (vpp > 1 && in_flight > m * vpp)
            in_flight = m * vpp;
        S->in_flight = (int32_t)(in_flight > 0 ? in_flight : 1);
        double kept = 0.0, widest = 0.0, dispatch = 0.0, cache = 0.0;
        for (int32_t c = 0; c < vpp; c++) {
            int32_t first = starts[c * pp + st], end = starts[c * pp + st + 1];
            if (first > 0) // a chunk starting on a shared layer receives the top-k its first layer reuses
                S->topk_in += train->layers[first].stage_in_topk;
            for (int32_t i = first; i < end; i++) {
                const dsarl_model_plan_layer *L = &train->layers[i];
                add_params(g->params, L->params);
                g->buffers += L->buffers;
                kept += s->recompute ? L->act_bytes_recompute : L->act_bytes;
                widest = L->act_bytes > widest ? L->act_bytes : widest;
                dispatch = L->dispatch_bytes > dispatch ? L->dispatch_bytes : dispatch;
                cache += L->cache_bytes;
            }
            S->n_layers += end - first;
        }
        if (st == 0)
            add_params(g->params, train->embedding);
        if (st == pp - 1)
            add_params(g->params, train->head);
        state_bytes(s, g, true);
        // each pass in flight keeps its layers' activations (a chunk pass: 1 / vpp of the stage's) and the int32
        // top-k its shared first layer received, for every token of the CP rank (gathered over TP)
        g->activations = (kept * t + 4.0 * S->topk_in * seq_tokens) * S->in_flight / vpp;
        if (s->recompute) // the backward rebuilds one layer's activations at a time
            g->activations += widest * t;
        if (st == pp - 1) { // fp32 logits (and their gradient) of one chunk, vocabulary split over TP
            double chunk = s->logprob_chunk > 0 && (double)s->logprob_chunk < seq_tokens ? (double)s->logprob_chunk
                                                                                       : seq_tokens;
            g->activations += train->logits_bytes * chunk / l->tp;
        }
        // one micro-batch's expert all-to-all buffers, the pipeline send + receive, one gradient bucket's staging
        g->comm = dispatch * t + (pp > 1 ? 2.0 * train->stage_io_bytes * t : 0.0) +
                  (double)l->bucket_elements * s->grad_bytes;
        g->reserve = s->reserve_bytes;
        g->train_total = g->weights + g->grads + g->optimizer + g->activations + g->comm + g->reserve;
        if (s->colocated) { // the engine reads the weights in place; activations are gone while it runs
            g->cache = cache * seqs * gen_len;
            g->gen_total = g->weights + g->grads + g->optimizer + g->cache + g->reserve;
        }
        g->total = g->train_total > g->gen_total ? g->train_total : g->gen_total;
        if (g->total > out->stages[out->worst].gpu.total)
            out->worst = st;
    }
    out->gen_seqs_per_replica = seqs;
    if (!s->colocated) {
        if (!gen || gen->n_layers != train->n_layers || !gen->layers) {
            dsarl_plan_free(out);
            return DSARL_FAIL(err, DSARL_E_INVALID, "plan: dedicated generation needs the model's plan under the "
                              "generation layout");
        }
        out->dedicated = true;
        dsarl_plan_gpu *g = &out->gen;
        // every generation GPU holds every layer (no pipeline); attention replicas of gen_tp GPUs split the rollouts
        double cache = 0.0, dispatch = 0.0;
        for (int32_t i = 0; i < gen->n_layers; i++) {
            add_params(g->params, gen->layers[i].params);
            g->buffers += gen->layers[i].buffers;
            cache += gen->layers[i].cache_bytes;
            dispatch = gen->layers[i].dispatch_bytes > dispatch ? gen->layers[i].dispatch_bytes : dispatch;
        }
        add_params(g->params, gen->embedding);
        add_params(g->params, gen->head);
        state_bytes(s, g, false);
        double replicas = (double)s->gen_gpus / s->gen_tp;
        out->gen_seqs_per_replica = ceil((double)s->rollouts / replicas);
        g->cache = cache * out->gen_seqs_per_replica * gen_len;
        g->comm = dispatch * out->gen_seqs_per_replica; // one decode step's tokens through the all-to-all
        g->reserve = s->reserve_bytes;
        g->gen_total = g->total = g->weights + g->cache + g->comm + g->reserve;
    }
    return DSARL_OK;
}

void dsarl_plan_stage_ranges(const dsarl_plan *p, int32_t st, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int32_t c = 0; c < p->vpp && used + 24 < n; c++) {
        int32_t a = p->starts[c * p->n_stages + st], b = p->starts[c * p->n_stages + st + 1] - 1;
        used += (size_t)snprintf(buf + used, n - used, "%s%d-%d", c ? ", " : "", a, b);
    }
}

int dsarl_plan_check_fit(const dsarl_plan_settings *s, const dsarl_plan *p, dsarl_error *err)
{
    const dsarl_plan_stage *w = &p->stages[p->worst];
    const dsarl_plan_gpu *g = &w->gpu;
    if (g->total > s->gpu_bytes) {
        bool gen_peak = g->gen_total > g->train_total;
        char layers[160];
        dsarl_plan_stage_ranges(p, p->worst, layers, sizeof layers);
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "the GPUs of pipeline stage %d (layers %s) need %.1f GiB %s, %.1f GiB more than the "
                          "%.1f GiB of one GPU (weights %.1f, gradients %.1f, optimizer %.1f, %s %.1f GiB); add GPUs "
                          "to the layout, turn on activation_checkpointing or optimizer_cpu_offload, or shorten "
                          "sequences", p->worst, layers, g->total / GIB,
                          gen_peak ? "while generating" : "while training", (g->total - s->gpu_bytes) / GIB,
                          s->gpu_bytes / GIB, g->weights / GIB, g->grads / GIB, g->optimizer / GIB,
                          gen_peak ? "generation cache" : "activations",
                          (gen_peak ? g->cache : g->activations) / GIB);
    }
    if (s->colocated && s->gen_memory_utilization > 0.0) {
        for (int32_t st = 0; st < p->n_stages; st++) {
            const dsarl_plan_gpu *c = &p->stages[st].gpu;
            double budget = s->gen_memory_utilization * s->gpu_bytes;
            if (c->weights + c->cache > budget)
                return DSARL_FAIL(err, DSARL_E_INVALID,
                                  "generation on the GPUs of pipeline stage %d needs %.1f GiB (weights %.1f + cache "
                                  "%.1f), %.1f GiB more than policy.generation.gpu_memory_utilization %.2f allows "
                                  "(%.1f GiB); raise it or generate fewer sequences at once", st,
                                  (c->weights + c->cache) / GIB, c->weights / GIB, c->cache / GIB,
                                  (c->weights + c->cache - budget) / GIB, s->gen_memory_utilization, budget / GIB);
        }
    }
    if (p->dedicated) {
        const dsarl_plan_gpu *d = &p->gen;
        double budget = s->gen_memory_utilization > 0.0 ? s->gen_memory_utilization * s->gpu_bytes : s->gpu_bytes;
        if (d->total > budget)
            return DSARL_FAIL(err, DSARL_E_INVALID,
                              "each dedicated generation GPU needs %.1f GiB (weights %.1f, cache %.1f), %.1f GiB more "
                              "than the %.1f GiB %s; raise policy.generation.tensor_parallel_size / "
                              "expert_parallel_size or add generation nodes", d->total / GIB, d->weights / GIB,
                              d->cache / GIB, (d->total - budget) / GIB, budget / GIB,
                              s->gen_memory_utilization > 0.0 ? "policy.generation.gpu_memory_utilization allows"
                                                              : "of one GPU");
    }
    return DSARL_OK;
}

void dsarl_plan_free(dsarl_plan *p)
{
    free(p->stages), free(p->starts);
    p->stages = NULL, p->starts = NULL;
    p->n_stages = 0;
}
