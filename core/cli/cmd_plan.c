/* cmd_plan.c: `dsarl plan RECIPE [overrides]`: the recipe's parallel layout at full model size, and what each GPU
 * holds and how long a GRPO step takes, without running anything: no device is opened and no model is built.
 *
 * The model's sizes come from its plan slot (dsarl_model_ops.plan, ABI 1.3) and its FLOP count (flops, 1.2); the
 * model config is policy.model_name's config.json when that is a local directory, else --model-config FILE, else the
 * recipe's inline policy.model_config, else configs/models/<hub name>.json shipped with dsarl (the real GLM-5.1 and
 * GLM-5.2 configs, so the seed recipes plan without downloading a checkpoint). Generation on dedicated nodes
 * (policy.generation.colocated.enabled false) leaves the training layout the other nodes. The arithmetic is
 * plan.c's. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "dsarl/hf_hub.h"
#include "dsarl/json.h"
#include "dsarl/ops/model.h"
#include "layout.h"
#include "plan.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MAX_PLAN_LAYERS (1 << 16)

static void print_help(void)
{
    printf("usage: dsarl plan RECIPE [key=value ...] [--gpu-memory GiB] [--model-config FILE]\n"
           "                  [--peak-tflops T] [--hbm-tbs B]\n"
           "\n"
           "Prints the recipe's parallel layout at full model size (which layers each pipeline stage holds, which\n"
           "experts each expert-parallel rank holds), every stage's per-GPU memory (weights, gradients, optimizer\n"
           "state, activations, communication buffers, generation cache) and a roofline GRPO step time, without\n"
           "running anything. World size = cluster.num_nodes x cluster.gpus_per_node (less the dedicated generation\n"
           "nodes when policy.generation.colocated.enabled is false). Exit status 0 when every GPU fits, 3 with the\n"
           "overflowing number when one does not (or the layout cannot split the model). docs/plan.md: the formulas.\n"
           "  --gpu-memory GiB     memory of one GPU (default 80: H100 80 GB)\n"
           "  --model-config FILE  the model's Hugging Face config.json (default: policy.model_name's, else the\n"
           "                       inline policy.model_config, else configs/models/<name>.json for a hub id)\n"
           "  --peak-tflops T      dense bf16 TFLOP/s of one GPU (default 989: H100 SXM)\n"
           "  --hbm-tbs B          memory bandwidth of one GPU in TB/s (default 3.35: H100 SXM)\n");
}

typedef struct plan_opts {
    const char *recipe, *model_config;
    double gpu_gib, peak_tflops, hbm_tbs;
    char **overrides;
    int n_overrides;
} plan_opts;

static int usage_error(const char *what, const char *arg)
{
    fprintf(stderr, "dsarl plan: error: %s%s%s; see `dsarl plan --help`\n", what, arg ? " " : "", arg ? arg : "");
    return CLI_EXIT_USAGE;
}

static int parse_number(const char *flag, const char *v, double lo, double hi, double *out)
{
    char *end = NULL;
    double x = v ? strtod(v, &end) : 0.0;
    if (!v || !*v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "dsarl plan: error: %s needs a number in [%g, %g], got '%s'; see `dsarl plan --help`\n",
                flag, lo, hi, v ? v : "(nothing)");
        return -1;
    }
    *out = x;
    return 0;
}

// Options anywhere after `plan`; everything else after RECIPE is an override. Returns -1 after --help.
static int parse_opts(int argc, char **argv, plan_opts *o)
{
    o->gpu_gib = 80.0, o->peak_tflops = 989.0, o->hbm_tbs = 3.35;
    o->overrides = calloc((size_t)argc, sizeof *o->overrides);
    if (!o->overrides)
        return usage_error("out of memory", NULL);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (cli_is_help(a)) {
            print_help();
            return -1;
        }
        struct { const char *flag; double *dst, lo, hi; } nums[] = {
            {"--gpu-memory", &o->gpu_gib, 1.0, 1e5}, {"--peak-tflops", &o->peak_tflops, 1e-3, 1e6},
            {"--hbm-tbs", &o->hbm_tbs, 1e-3, 1e4}};
        bool done = false;
        for (size_t j = 0; j < sizeof nums / sizeof nums[0] && !done; j++)
            if (!strcmp(a, nums[j].flag)) {
                if (parse_number(a, v, nums[j].lo, nums[j].hi, nums[j].dst))
                    return CLI_EXIT_USAGE;
                done = true, i++;
            }
        if (done)
            continue;
        if (!strcmp(a, "--model-config")) {
            if (!v || !*v)
                return usage_error("--model-config needs a file", NULL);
            o->model_config = v, i++;
        } else if (!strncmp(a, "--", 2)) {
            return usage_error("unknown option", a);
        } else if (!o->recipe) {
            o->recipe = a;
        } else {
            o->overrides[o->n_overrides++] = argv[i];
        }
    }
    if (!o->recipe)
        return usage_error("missing RECIPE (a YAML file)", NULL);
    return 0;
}

/* --- the model config ------------------------------------------------------------------------------------------ */

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

// configs/models/<name>.json for a hub id's last segment: beside the binary (share/dsarl), then ./configs.
static bool find_shipped_config(const char *hub_id, char *path, size_t size)
{
    const char *name = strrchr(hub_id, '/');
    name = name ? name + 1 : hub_id;
    if (!*name || strstr(name, ".."))
        return false;
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(path, size, "%s/../share/dsarl/configs/models/%s.json", exe, name);
            if (is_file(path))
                return true;
        }
    }
    snprintf(path, size, "configs/models/%s.json", name);
    return is_file(path);
}

typedef struct plan_model {
    char model_dir[4096];      // policy.model_name when it is a local directory with config.json, else ""
    char config_from[4200];    // where the config came from, for the output
    char *config_override;     // "++policy.model_config=<flow>" when the config is given as a file, or NULL
    bool replace_inline;       // the recipe has an inline config too: delete it first (++ would merge into it)
} plan_model;

// Decides where the model config comes from; a file becomes an inline policy.model_config override so that
// policy.hf_config_overrides apply on top of it as in a run.
static int choose_model_config(const dsarl_node *root, const plan_opts *o, plan_model *pm, dsarl_error *err)
{
    const char *name = NULL;
    DSARL_TRY(dsarl_recipe_string_or(root, "policy.model_name", NULL, &name, err));
    char file[4200] = "";
    if (o->model_config) {
        snprintf(file, sizeof file, "%s", o->model_config);
    } else if (name) {
        // a hub id in the Hugging Face cache plans with its own config.json; one that is not there falls back to
        // the config this project ships for it
        char dir[4096], cfg[4200];
        const char *revision = NULL;
        DSARL_TRY(dsarl_recipe_string_or(root, "policy.model_revision", NULL, &revision, err));
        dsarl_hf_find(name, revision, dir, sizeof dir);
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        if (is_file(cfg)) {
            snprintf(pm->model_dir, sizeof pm->model_dir, "%s", dir);
            snprintf(pm->config_from, sizeof pm->config_from, "%s (policy.model_name)", cfg);
            return DSARL_OK;
        }
    }
    const dsarl_node *inline_cfg = dsarl_node_get(root, "policy.model_config");
    if (!*file && inline_cfg && dsarl_node_kind(inline_cfg) == DSARL_NODE_MAP) {
        snprintf(pm->config_from, sizeof pm->config_from, "the recipe's policy.model_config");
        return DSARL_OK;
    }
    if (!*file && !(name && find_shipped_config(name, file, sizeof file)))
        return DSARL_FAIL(err, DSARL_E_NOT_FOUND,
                          "policy.model_name '%s' is not a local directory with a config.json and dsarl ships no "
                          "configs/models/<name>.json for it; give the model's config.json with --model-config FILE",
                          name ? name : "(unset)");
    json_t *cfg = NULL;
    DSARL_TRY(dsarl_json_load_file(file, &cfg, err));
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: a model config must be a JSON object", file);
    }
    // the plan's figures cover the main layers only: the multi-token-prediction depths (kept on load, trained
    // with policy.megatron_cfg.mtp_num_layers) are left out, said once in the source line; dropping the key keeps
    // the model from logging them once per query
    json_int_t mtp = json_integer_value(json_object_get(cfg, "num_nextn_predict_layers"));
    json_object_del(cfg, "num_nextn_predict_layers");
    // JSON with ", " and ": " separators is YAML flow, so the config drops into the override as it is
    char *flow = json_dumps(cfg, JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(cfg);
    size_t need = (flow ? strlen(flow) : 0) + 32;
    pm->config_override = flow ? malloc(need) : NULL;
    if (!pm->config_override) {
        free(flow);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsarl plan: out of memory for the model config");
    }
    snprintf(pm->config_override, need, "++policy.model_config=%s", flow);
    pm->replace_inline = inline_cfg && dsarl_node_kind(inline_cfg) == DSARL_NODE_MAP;
    free(flow);
    snprintf(pm->config_from, sizeof pm->config_from, "%s%s%s", file, o->model_config ? " (--model-config)" : "",
             mtp > 0 ? ", its MTP layers not planned" : "");
    return DSARL_OK;
}

/* --- the model's plan -------------------------------------------------------------------------------------- */

// The model's plan under layout rank 0's shard (every rank of a stage holds equal shares); layers allocated here
// once the model says how many it has.
static int model_plan(const dsarl_model_ops *mo, const dsarl_model_config *mc, const dsarl_parallel *par,
                      dsarl_model_plan *mp, dsarl_error *err)
{
    memset(mp, 0, sizeof *mp);
    mp->struct_size = sizeof *mp;
    dsarl_error probe_err;
    dsarl_error_clear(&probe_err);
    int rc = mo->plan(mc, par, mp, &probe_err); // capacity 0: only n_layers, unless the layout is refused
    if (mp->n_layers < 1 || mp->n_layers > MAX_PLAN_LAYERS) {
        if (rc)
            *err = probe_err;
        return rc ? rc : DSARL_FAIL(err, DSARL_E_INVALID, "model %s: its plan reports %d layers (1 to %d expected)",
                                    mo->common.name, mp->n_layers, MAX_PLAN_LAYERS);
    }
    mp->layers = calloc((size_t)mp->n_layers, sizeof *mp->layers);
    if (!mp->layers)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsarl plan: out of memory for %d layers", mp->n_layers);
    mp->layer_capacity = mp->n_layers;
    rc = mo->plan(mc, par, mp, err);
    if (rc) {
        free(mp->layers);
        mp->layers = NULL;
    }
    return rc;
}

// Forward and backward FLOPs of `count` sequences of len tokens (the model's flops slot counts one sequence).
static int flops_of(const dsarl_model_ops *mo, const dsarl_model_config *mc, int64_t len, double count, double *fwd,
                    double *bwd, dsarl_error *err)
{
    *fwd = *bwd = 0.0;
    if (len < 1)
        return DSARL_OK;
    int32_t *tokens = calloc((size_t)len, sizeof *tokens); // len is bounded by the settings (<= 2^24)
    if (!tokens)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsarl plan: out of memory for %" PRId64 " tokens", len);
    int32_t cu[2] = {0, (int32_t)len};
    dsarl_token_batch b = {.struct_size = sizeof b, .n_tokens = len, .n_sequences = 1, .tokens = tokens,
                           .cu_seqlens = cu};
    dsarl_model_flops f = {.struct_size = sizeof f};
    int rc = mo->flops(mc, &b, &f, err);
    free(tokens);
    *fwd = f.forward * count, *bwd = f.backward * count;
    return rc;
}

/* --- output ---------------------------------------------------------------------------------------------------- */

static void print_stages(const dsarl_plan_settings *s, const dsarl_plan *p, const dsarl_model_plan *mp)
{
    const dsarl_layout *l = &s->layout;
    int32_t span = l->tp * l->cp * l->dp;
    printf("pipeline stages (PP%d; stage s is world ranks s*%d .. s*%d+%d):\n", l->pp, span, span, span - 1);
    if (p->vpp > 1)
        printf("  interleaved: %d model chunks per stage, virtual stage c*%d+s on stage s\n", p->vpp, l->pp);
    for (int32_t st = 0; st < p->n_stages; st++) {
        const dsarl_plan_stage *S = &p->stages[st];
        char layers[160];
        dsarl_plan_stage_ranges(p, st, layers, sizeof layers);
        printf("  stage %d: layers %s (%d)%s%s", st, layers, S->n_layers, st == 0 ? ", input embedding" : "",
               st == p->n_stages - 1 ? ", final norm + LM head" : "");
        if (S->topk_in > 0)
            printf(", receives %d top-k indices per token (a chunk starts on an IndexShare shared layer)",
                   S->topk_in);
        printf("\n");
    }
    if (mp->n_experts > 0) {
        int32_t per = mp->n_experts / l->ep;
        if (l->ep == 1)
            printf("experts: each MoE layer's %d routed experts (top %d per token): every rank holds all of them "
                   "(EP1)\n", mp->n_experts, mp->experts_per_token);
        else if (per == 1)
            printf("experts: each MoE layer's %d routed experts over EP%d: EP rank e (world rank mod %d) holds expert "
                   "e; EDP%d replicas of each\n", mp->n_experts, l->ep, l->ep, l->edp);
        else
            printf("experts: each MoE layer's %d routed experts (top %d per token) over EP%d: EP rank e (world rank "
                   "mod %d) holds experts %d*e .. %d*e+%d; EDP%d replicas of each\n", mp->n_experts,
                   mp->experts_per_token, l->ep, l->ep, per, per, per - 1, l->edp);
    }
}

static void print_gpu_row(const char *name, const dsarl_plan_gpu *g)
{
    printf("  %-8s %9.2f %8.1f %6.1f %9.1f %11.1f %5.1f %6.1f %7.1f %6.1f %8.1f %6.1f\n", name,
           (double)dsarl_plan_params(g->params) / 1e9, g->weights / GIB, g->grads / GIB, g->optimizer / GIB,
           g->activations / GIB, g->comm / GIB, g->cache / GIB, g->reserve / GIB, g->train_total / GIB,
           g->gen_total / GIB, g->total / GIB);
}

static void print_memory(const dsarl_plan_settings *s, const dsarl_plan *p)
{
    const dsarl_layout *l = &s->layout;
    printf("per-GPU memory (GiB, every GPU of a stage alike; * the worst): micro-batch %" PRId64 " x %" PRId64
           " tokens / CP%d / TP%d%s = %.0f tokens per rank, %" PRId64 " micro-batches per replica, %s; activation "
           "recompute %s; gradients %s; distributed optimizer %s%s\n",
           s->micro_batch, s->seq_len, l->cp, l->sequence_parallel && l->tp > 1 ? l->tp : 1,
           l->sequence_parallel && l->tp > 1 ? " (sequence parallel)" : "", p->train_tokens_per_rank,
           p->microbatches,
           p->vpp > 1 ? "interleaved 1F1B holds 2 (pp - 1 - stage) + (vpp - 1) pp + 1 chunk passes (all with pp "
                        "micro-batches)"
                      : "1F1B holds min(pp - stage, micro-batches)",
           s->recompute ? "on" : "off", s->grad_bytes == 4 ? "fp32" : "bf16",
           l->distributed_optimizer && l->dp * l->cp > 1 ? "on" : "off",
           s->optimizer_offload > 0 ? ", optimizer state offloaded to the host" : "");
    if (s->colocated)
        printf("generation colocated: the engine reads the training weights in place; each of the %d DPxCP replicas "
               "caches %.0f sequences x %" PRId64 " tokens (%" PRId64 " prompt + %" PRId64 " new)\n",
               l->dp * l->cp, p->gen_seqs_per_replica, s->prompt_tokens + s->new_tokens, s->prompt_tokens,
               s->new_tokens);
    printf("  %-8s %9s %8s %6s %9s %11s %5s %6s %7s %6s %8s %6s\n", "stage", "params(B)", "weights", "grads",
           "optimizer", "activations", "comm", "cache", "reserve", "train", "generate", "peak");
    for (int32_t st = 0; st < p->n_stages; st++) {
        char name[16];
        snprintf(name, sizeof name, "%d%s", st, st == p->worst ? "*" : "");
        print_gpu_row(name, &p->stages[st].gpu);
    }
    if (p->dedicated) {
        printf("dedicated generation: %d GPUs, TP%d x EP%d, every layer on each GPU; each of the %d TP replicas "
               "caches %.0f sequences x %" PRId64 " tokens\n", s->gen_gpus, s->gen_tp, s->gen_ep,
               s->gen_gpus / s->gen_tp, p->gen_seqs_per_replica, s->prompt_tokens + s->new_tokens);
        print_gpu_row("gen", &p->gen);
    }
    const dsarl_plan_gpu *w = &p->stages[p->worst].gpu;
    if (w->optimizer_host > 0)
        printf("optimizer state on the host: %.1f GiB per training GPU (%.1f GiB per 8-GPU node)\n",
               w->optimizer_host / GIB, 8.0 * w->optimizer_host / GIB);
}

static void print_time(const dsarl_plan_settings *s, const dsarl_plan *p, const dsarl_model_ops *mo,
                       const dsarl_model_config *mc, dsarl_error *err, int *rc)
{
    const dsarl_layout *l = &s->layout;
    double f_train, b_train, f_prompt, b_unused, f_full;
    *rc = flops_of(mo, mc, s->seq_len, (double)s->global_batch, &f_train, &b_train, err);
    if (*rc == 0)
        *rc = flops_of(mo, mc, s->prompt_tokens, (double)s->rollouts, &f_prompt, &b_unused, err);
    if (*rc == 0)
        *rc = flops_of(mo, mc, s->prompt_tokens + s->new_tokens, (double)s->rollouts, &f_full, &b_unused, err);
    if (*rc)
        return;
    double train = f_train + b_train + (s->recompute ? f_train : 0.0); // recompute reruns every forward
    double logprob = s->logprob_passes * f_train;
    double W = (double)l->world, m = (double)p->microbatches;
    // 1F1B: pp - 1 idle slots per m micro-batches; interleaved, each slot is one chunk: 1 / vpp as long
    double bubble = (m + (double)(l->pp - 1) / p->vpp) / m;
    double t_train = train / (W * s->peak_flops) * bubble, t_logprob = logprob / (W * s->peak_flops) * bubble;
    // generation: prefill is compute-bound; each decode step reads every weight of the GPUs a token passes (one
    // stage after another under PP) and about half the final cache, or is compute-bound, whichever is slower
    double G = p->dedicated ? (double)s->gen_gpus : W;
    double t_prefill = f_prompt / (G * s->peak_flops);
    double t_decode_compute = (f_full - f_prompt) / (G * s->peak_flops);
    double step_bytes = 0.0;
    if (p->dedicated)
        step_bytes = p->gen.weights + 0.5 * p->gen.cache;
    else
        for (int32_t st = 0; st < p->n_stages; st++)
            step_bytes += p->stages[st].gpu.weights + 0.5 * p->stages[st].gpu.cache;
    double t_decode_memory = (double)s->new_tokens * step_bytes / s->hbm_bytes_per_s;
    double t_decode = t_decode_compute > t_decode_memory ? t_decode_compute : t_decode_memory;
    double t_gen = t_prefill + t_decode;
    printf("FLOPs per step (the model's count; %" PRId64 " sequences x %" PRId64 " tokens trained, %" PRId64
           " generated): training %.3g (forward %.3g + backward %.3g%s), log-prob passes %d x %.3g, generation %.3g; "
           "forward %.3g FLOPs per token at %" PRId64 " tokens\n", s->global_batch, s->seq_len, s->rollouts, train,
           f_train, b_train, s->recompute ? " + recomputed forward" : "", s->logprob_passes, f_train, f_full,
           f_train / ((double)s->global_batch * s->seq_len), s->seq_len);
    printf("step time (roofline at %.0f TFLOP/s dense bf16 and %.2f TB/s HBM per GPU, %s GPUs; 1F1B bubble (m + (pp - "
           "1) / vpp) / m = %.2f): generation %.1f s (prefill %.1f, decode %.1f: %s-bound), log-probs %.1f s, "
           "training %.1f s; %.1f s per step%s\n", s->peak_flops / 1e12, s->hbm_bytes_per_s / 1e12,
           p->dedicated ? "dedicated generation" : "all", bubble, t_gen, t_prefill, t_decode,
           t_decode_memory > t_decode_compute ? "memory" : "compute", t_logprob, t_train, t_gen + t_logprob + t_train,
           p->dedicated ? " (generation and training in turn, weight transfer not counted)" : "");
}

/* --- the command --------------------------------------------------------------------------------------------- */

typedef struct plan_run {
    plan_opts o;
    dsarl_recipe *recipe;
    dsarl_registry *reg;
    plan_model pm;
    dsarl_model_plan train, gen;
    dsarl_plan plan;
    char **overrides; // the user's, then the config and cluster overrides plan adds
} plan_run;

static void plan_run_close(plan_run *r)
{
    dsarl_plan_free(&r->plan);
    free(r->train.layers);
    free(r->gen.layers);
    free(r->pm.config_override);
    free(r->overrides);
    free(r->o.overrides);
    dsarl_registry_free(r->reg);
    dsarl_recipe_free(r->recipe);
}

static int run_plan(plan_run *r, const cli_options *opts, dsarl_error *err)
{
    // first pass: where the model config comes from and whether generation has nodes of its own
    DSARL_TRY(cli_load_recipe(r->o.recipe, r->o.n_overrides, r->o.overrides, &r->recipe, err));
    const dsarl_node *root = dsarl_recipe_root(r->recipe);
    DSARL_TRY(choose_model_config(root, &r->o, &r->pm, err));
    bool colocated = true;
    int64_t nodes = 1, gen_nodes = 0;
    DSARL_TRY(dsarl_recipe_bool_or(root, "policy.generation.colocated.enabled", true, &colocated, err));
    DSARL_TRY(dsarl_recipe_int_or(root, "cluster.num_nodes", 1, &nodes, err));
    if (!colocated) {
        DSARL_TRY(dsarl_recipe_int_or(root, "policy.generation.colocated.resources.num_nodes", 0, &gen_nodes, err));
        if (gen_nodes < 1 || gen_nodes >= nodes)
            return dsarl_recipe_fail(root, "policy.generation.colocated.resources.num_nodes", err, DSARL_E_INVALID,
                                     "is %lld with cluster.num_nodes %lld; dedicated generation needs at least one "
                                     "node and leaves the rest of cluster.num_nodes to training", (long long)gen_nodes,
                                     (long long)nodes);
    }
    // second pass with the config inlined and cluster.num_nodes = the training nodes
    char cluster[64];
    snprintf(cluster, sizeof cluster, "cluster.num_nodes=%lld", (long long)(nodes - gen_nodes));
    r->overrides = calloc((size_t)r->o.n_overrides + 3, sizeof *r->overrides);
    if (!r->overrides)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsarl plan: out of memory");
    int n = 0;
    for (int i = 0; i < r->o.n_overrides; i++)
        r->overrides[n++] = r->o.overrides[i];
    char drop_inline[] = "~policy.model_config";
    if (r->pm.replace_inline)
        r->overrides[n++] = drop_inline;
    if (r->pm.config_override)
        r->overrides[n++] = r->pm.config_override;
    if (!colocated)
        r->overrides[n++] = cluster;
    dsarl_recipe_free(r->recipe);
    r->recipe = NULL;
    DSARL_TRY(cli_load_recipe(r->o.recipe, n, r->overrides, &r->recipe, err));
    root = dsarl_recipe_root(r->recipe);

    DSARL_TRY(cli_open_registry(root, opts, &r->reg, err));
    dsarl_selection sel;
    DSARL_TRY(dsarl_select_plugins(root, r->reg, &sel, err));
    if (!sel.model.ops)
        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "no model plugin named '%s' is loaded (selected by %s); `dsarl "
                          "plugins` lists what was found", sel.model.name, sel.model.selected_by);
    const dsarl_model_ops *mo = (const dsarl_model_ops *)sel.model.ops;
    if (!DSARL_MODEL_HAS(mo, plan) || !DSARL_MODEL_HAS(mo, flops))
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "model %s cannot be planned: it has no %s slot (ABI 1.%d)",
                          mo->common.name, DSARL_MODEL_HAS(mo, plan) ? "flops" : "plan",
                          DSARL_MODEL_HAS(mo, plan) ? 2 : 3);

    int64_t per_node = 1;
    DSARL_TRY(dsarl_recipe_int_or(root, "cluster.gpus_per_node", 1, &per_node, err));
    int64_t world = (nodes - gen_nodes) * per_node;
    if (world < 1 || world > 1 << 24)
        return DSARL_FAIL(err, DSARL_E_INVALID, "cluster.num_nodes x cluster.gpus_per_node = %lld GPUs for "
                          "training; it must be in [1, 16777216]", (long long)world);
    dsarl_layout layout;
    DSARL_TRY(dsarl_layout_from_recipe(root, (int32_t)world, &layout, err));
    dsarl_plan_settings s;
    DSARL_TRY(dsarl_plan_settings_from_recipe(root, &layout, &s, err));
    s.gpu_bytes = r->o.gpu_gib * GIB;
    s.peak_flops = r->o.peak_tflops * 1e12;
    s.hbm_bytes_per_s = r->o.hbm_tbs * 1e12;

    dsarl_model_config mc = {.struct_size = sizeof mc, .host = dsarl_registry_host(r->reg), .recipe = root,
                             .model_dir = r->pm.model_dir[0] ? r->pm.model_dir : NULL};
    dsarl_parallel par;
    dsarl_layout_coords(&layout, 0, &par);
    DSARL_TRY(model_plan(mo, &mc, &par, &r->train, err));
    if (!s.colocated) {
        dsarl_layout gl;
        DSARL_TRY(dsarl_layout_make(s.gen_gpus, s.gen_tp, 1, 1, s.gen_ep, &gl, err));
        dsarl_parallel gp;
        dsarl_layout_coords(&gl, 0, &gp);
        DSARL_TRY(model_plan(mo, &mc, &gp, &r->gen, err));
    }

    char desc[256];
    dsarl_layout_describe(&layout, desc, sizeof desc);
    printf("dsarl plan: %s\n", r->o.recipe);
    double total = (double)r->train.total_params;
    printf("model: %s (%s), config %s: %s; %.1f %s trainable parameters\n", mo->common.name, sel.model.selected_by,
           r->pm.config_from, r->train.summary, total >= 1e9 ? total / 1e9 : total / 1e6, total >= 1e9 ? "B" : "M");
    printf("layout: %s; %lld nodes x %lld GPUs for training%s\n", desc, (long long)(nodes - gen_nodes),
           (long long)per_node, s.colocated ? ", generation colocated on them" : "");
    if (!s.colocated)
        printf("generation: %lld dedicated nodes (%d GPUs, policy.generation.colocated.resources)\n",
               (long long)gen_nodes, s.gen_gpus);
    DSARL_TRY(dsarl_plan_compute(&s, &r->train, s.colocated ? NULL : &r->gen, &r->plan, err));
    print_stages(&s, &r->plan, &r->train);
    print_memory(&s, &r->plan);
    int rc = 0;
    print_time(&s, &r->plan, mo, &mc, err, &rc);
    DSARL_TRY(rc);
    const dsarl_plan_stage *w = &r->plan.stages[r->plan.worst];
    DSARL_TRY(dsarl_plan_check_fit(&s, &r->plan, err));
    char layers[160];
    dsarl_plan_stage_ranges(&r->plan, r->plan.worst, layers, sizeof layers);
    printf("fits: the worst GPU (stage %d, layers %s) peaks at %.1f GiB of %.1f GiB (%.1f GiB free)", r->plan.worst,
           layers, w->gpu.total / GIB, s.gpu_bytes / GIB, (s.gpu_bytes - w->gpu.total) / GIB);
    if (r->plan.dedicated)
        printf("; a generation GPU needs %.1f GiB", r->plan.gen.total / GIB);
    printf("\n");
    return DSARL_OK;
}

int cmd_plan(int argc, char **argv, const cli_options *opts)
{
    plan_run r;
    memset(&r, 0, sizeof r);
    int prc = parse_opts(argc, argv, &r.o);
    if (prc) {
        free(r.o.overrides);
        return prc < 0 ? CLI_EXIT_OK : prc;
    }
    dsarl_error err;
    dsarl_error_clear(&err);
    int rc = run_plan(&r, opts, &err);
    fflush(stdout);
    plan_run_close(&r);
    return rc ? cli_fail(&err) : CLI_EXIT_OK;
}
