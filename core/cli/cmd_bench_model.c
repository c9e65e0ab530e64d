/* cmd_bench_model.c: `dsarl bench train` and `dsarl bench generate`: a whole training step and generation (greedy,
 * or GRPO's shape: groups of equal prompts, sampled, ended at an EOS) of a glm_moe_dsa model config on one device,
 * each printed beside the machine's ceilings measured in the same run (bf16 GEMM 8192^3 through the device's gemm,
 * a device-to-device copy; cmd_bench.h), with a `json:` line that tools/bench/run-model-bench and
 * run-generate-bench merge with the transformers peer (tools/bench/{train,generate}_torch.py).
 *
 * The model is built the way a recipe builds it: the registry's model, device and DSA plugins, random init from
 * the config (policy.model_config, so glm5_model_init_random through the model ops' create), or the weights of a
 * Hugging Face directory (--model-dir). One training step is what the SFT and GRPO trainers run per microbatch:
 * zero_grad, train_forward (one forward that keeps its activations; its log-probs give the loss), train_backward
 * (the backward of the mean token NLL, no second forward), grad_norm, clip to 1.0, optimizer_step (AdamW on fp32
 * master weights, hyper-parameters through dsarl_optimizer_params_from_recipe).
 *
 * Model FLOPs of a step are the model plugin's count (dsarl_model_ops.flops: forward + backward over the batch),
 * printed with the plugin's formula. */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "cmd_bench.h"
#include "dsarl/json.h"
#include "dsarl/ops/generation.h"
#include "dsarl/ops/model.h"
#include "dsarl/optimizer.h"
#include "dsarl/trainer.h"

typedef struct model_bench_opts {
    const char *config, *model_dir, *device, *backend;
    int64_t seq, batch, steps, warmup, seed, ceiling_iters, threads;
    int64_t prompt_len, new_tokens;  // generate
    int64_t groups, samples, top_k;  // generate: groups x samples prompts (0 groups: --batch / --samples)
    double temperature, top_p;       // generate: 0 = greedy
    const char *stop_at_eos;         // generate: NULL (no stop), "eos" (the config's eos_token_id) or an id
    bool batch_given, new_given, max_new_given;
    int64_t max_new_tokens;          // --max-new-tokens: the same value as --new-tokens
    double lr, indexer_loss_coeff;
    const char *sets[8];  // --set KEY=VALUE recipe overrides, applied in order after the bench's own keys
    int n_sets;
} model_bench_opts;

// What the model ops say of the model (sizes for the token data and the decode floor) and what its flops slot
// says of the work (the plugin's own count: the core knows no family's formula or tensor names).
typedef struct model_shape {
    int64_t vocab, trainable, weight_bytes;
    dsarl_model_flops flops;
} model_shape;

// Everything one benchmark holds; closed in reverse order.
typedef struct model_bench {
    bench b;                     // device, events, flush buffer, error (device and DSA context: the session's)
    dsarl_session session;       // the trainer session: device -> DSA backend, the model added after the ceilings
    dsarl_registry *registry;
    dsarl_recipe *recipe;
    json_t *config;              // the HF config (model_config of the recipe)
    char config_path[4200];      // the file it was read from
    const dsarl_model_ops *mo;
    dsarl_model *model;
    const char *family;
    double gemm_tflops, copy_gbs;
    int ceiling_n;
} model_bench;

static void model_bench_close(model_bench *m)
{
    if (m->model)
        m->mo->destroy(m->model);
    if (m->b.flush)
        m->b.d->free(m->b.dev, m->b.flush);
    dsarl_session_close(&m->session); // the DSA backend, then the device
    dsarl_registry_free(m->registry);
    dsarl_recipe_free(m->recipe);
    json_decref(m->config);
}

/* --- options ------------------------------------------------------------------------------------------------- */

static const char *train_help =
    "usage: dsarl bench train [--config FILE|NAME | --model-dir DIR] [--device NAME] [--backend NAME]\n"
    "                         [--tokens 4096] [--batch 2] [--steps 3] [--warmup 1] [--seed 0] [--lr 1e-5]\n"
    "                         [--indexer-loss-coeff 0] [--ceiling-iters 5] [--threads N] [--set KEY=VALUE ...]\n"
    "\n"
    "Times whole training steps (zero_grad, forward + backward of the mean token NLL, gradient norm and clip,\n"
    "AdamW on fp32 master weights: what the SFT and GRPO trainers run) of a glm_moe_dsa model on random token ids,\n"
    "after measuring the device's GEMM and copy ceilings in the same run. Prints tokens/s, the model FLOPs of a\n"
    "step with their formula, achieved TFLOP/s, MFU = achieved / GEMM ceiling, the loss, and a `json:` line.\n"
    "  --config FILE|NAME   an HF config.json, or a built-in bench config (glm5.2-3b: configs/bench/glm5.2-3b.json);\n"
    "                       random init (initializer_range of the config, else 0.02). Default glm5.2-3b\n"
    "  --model-dir DIR      instead: load config.json + safetensors from DIR\n"
    "  --device NAME        device plugin (default: the highest-ranked device this machine can run)\n"
    "  --backend NAME       DSA backend plugin (default: the highest-ranked backend that runs on the device)\n"
    "  --tokens S           tokens per sequence (default 4096)\n"
    "  --batch B            sequences per step, packed (default 2)\n"
    "  --steps N            timed steps (default 3); --warmup W untimed steps first (default 1)\n"
    "  --seed S             random init and token ids (default 0)\n"
    "  --lr LR              AdamW learning rate (default 1e-5)\n"
    "  --indexer-loss-coeff C  DSA indexer KL loss weight (default 0: the LM loss alone, as the transformers peer)\n"
    "  --ceiling-iters N    timed runs of each ceiling (default 5)\n"
    "  --threads N          host threads of the cpu device (default 0: its default)\n"
    "  --set KEY=VALUE      a recipe key for the device, backend and model (runtime.cuda_profile=true: per-op GPU\n"
    "                       times at the end; runtime.cuda_storage_dtype=f32, ...); repeatable, at most 8\n";

static const char *generate_help =
    "usage: dsarl bench generate [--config FILE|NAME | --model-dir DIR] [--device NAME] [--backend NAME]\n"
    "                            [--batch 32 | --groups P --samples G] [--prompt-len 128] [--new-tokens 128]\n"
    "                            [--temperature 0] [--top-p 1] [--top-k 0] [--stop-at-eos [eos|ID]]\n"
    "                            [--steps 1] [--warmup 1] [--seed 0] [--ceiling-iters 5] [--threads N]\n"
    "                            [--set KEY=VALUE ...]\n"
    "\n"
    "Times generation of random prompts through the native generation engine (paged KV cache: prefill, then one\n"
    "decode step per new token), after measuring the device's GEMM and copy ceilings in the same run. By default\n"
    "greedy with no stop token, so every sequence makes --new-tokens tokens. GRPO's shape: --groups P --samples G\n"
    "(P random prompts, each G times in a row: the G samples of a prompt share its prefill), sampled\n"
    "(--temperature, --top-p, --top-k; the draws are seeded by --seed), ended at an EOS (--stop-at-eos).\n"
    "Prints generated tokens/s (prefill included), prefill time (a call of the same batch with one new token),\n"
    "decode tokens/s and mean decode step, the decode floor (the weight bytes a step reads at the measured copy\n"
    "rate, at the full batch) and decode / floor, the mean completion length, and a `json:` line.\n"
    "  --config, --model-dir, --device, --backend, --seed, --ceiling-iters, --threads, --set: as `dsarl bench train`\n"
    "  --batch B            prompts, all different (default 32)\n"
    "  --groups P           distinct prompts; the batch is P x G (give --batch P x G or leave it out)\n"
    "  --samples G          sequences per prompt (default 1; without --groups, --batch / G prompts)\n"
    "  --prompt-len P       tokens per prompt (default 128)\n"
    "  --new-tokens N       new tokens per sequence, at most (default 128); --max-new-tokens N: the same\n"
    "  --temperature T      0 (default): greedy; > 0: sampled, logits / T\n"
    "  --top-p P            nucleus in (0, 1] (default 1: off); --top-k K: the K likeliest (default 0: off)\n"
    "  --stop-at-eos [eos|ID]  end a sequence at the config's eos_token_id (every id of a list; the default when no\n"
    "                       value follows) or at token ID; the mean completion length is reported\n"
    "  --steps N            timed generate calls (default 1); --warmup W untimed calls first (default 1)\n";

static int bad_option(const char *cmd, const char *what)
{
    fprintf(stderr, "dsarl bench %s: error: %s; see `dsarl bench %s --help`\n", cmd, what, cmd);
    return CLI_EXIT_USAGE;
}

static int parse_i64(const char *cmd, const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out)
{
    char *end = NULL;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || !*v || *end || x < lo || x > hi) {
        char msg[200];
        snprintf(msg, sizeof msg, "%s needs an integer in [%lld, %lld], got '%s'", flag, (long long)lo,
                 (long long)hi, v ? v : "(nothing)");
        bad_option(cmd, msg);
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_f64(const char *cmd, const char *flag, const char *v, double lo, double hi, double *out)
{
    char *end = NULL;
    double x = v ? strtod(v, &end) : 0.0;
    if (!v || !*v || *end || !(x >= lo && x <= hi)) {
        char msg[200];
        snprintf(msg, sizeof msg, "%s needs a number in [%g, %g], got '%s'", flag, lo, hi, v ? v : "(nothing)");
        bad_option(cmd, msg);
        return -1;
    }
    *out = x;
    return 0;
}

// Parses argv[2..]; returns -1 for --help (printed), CLI_EXIT_USAGE after an error message, 0 otherwise.
static int parse_opts(int argc, char **argv, bool generate, model_bench_opts *o)
{
    const char *cmd = generate ? "generate" : "train";
    for (int i = 2, step = 2; i < argc; i += step, step = 2) { // every option takes a value but --stop-at-eos
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (cli_is_help(f)) {
            fputs(generate ? generate_help : train_help, stdout);
            return -1;
        }
        struct { const char *flag; const char **dst; } strs[] = {
            {"--config", &o->config}, {"--model-dir", &o->model_dir}, {"--device", &o->device},
            {"--backend", &o->backend}};
        struct { const char *flag; int64_t *dst; int64_t lo, hi; bool gen, train; } ints[] = {
            {"--tokens", &o->seq, 2, 1 << 20, false, true},
            {"--batch", &o->batch, 1, 1 << 16, true, true},
            {"--steps", &o->steps, 1, 10000, true, true},
            {"--warmup", &o->warmup, 0, 10000, true, true},
            {"--seed", &o->seed, 0, INT64_MAX, true, true},
            {"--ceiling-iters", &o->ceiling_iters, 1, 1000, true, true},
            {"--threads", &o->threads, 0, 1024, true, true},
            {"--prompt-len", &o->prompt_len, 1, 1 << 20, true, false},
            {"--new-tokens", &o->new_tokens, 1, 1 << 20, true, false},
            {"--max-new-tokens", &o->max_new_tokens, 1, 1 << 20, true, false},
            {"--groups", &o->groups, 1, 1 << 16, true, false},
            {"--samples", &o->samples, 1, 1 << 16, true, false},
            {"--top-k", &o->top_k, 0, 1 << 24, true, false}};
        struct { const char *flag; double *dst; double lo, hi; bool gen, train; } reals[] = {
            {"--lr", &o->lr, 0.0, 1.0, false, true},
            {"--indexer-loss-coeff", &o->indexer_loss_coeff, 0.0, 1e6, false, true},
            {"--temperature", &o->temperature, 0.0, 100.0, true, false}};
        bool done = false;
        if (generate && !strcmp(f, "--stop-at-eos")) {
            if (!v || !strncmp(v, "--", 2)) // no value: the config's EOS
                o->stop_at_eos = "eos", step = 1;
            else
                o->stop_at_eos = v;
            done = true;
        }
        if (generate && !strcmp(f, "--top-p")) { // (0, 1]: 0 would keep no token
            char *end = NULL;
            double x = v ? strtod(v, &end) : 0.0;
            if (!v || !*v || *end || !(x > 0.0 && x <= 1.0)) {
                char msg[200];
                snprintf(msg, sizeof msg, "--top-p needs a number in (0, 1], got '%s'", v ? v : "(nothing)");
                return bad_option(cmd, msg);
            }
            o->top_p = x, done = true;
        }
        if (!strcmp(f, "--set")) {
            if (!v || !strchr(v, '=') || *v == '=')
                return bad_option(cmd, "--set needs KEY=VALUE (a dotted recipe key, e.g. runtime.cuda_profile=true)");
            if (o->n_sets == (int)(sizeof o->sets / sizeof o->sets[0]))
                return bad_option(cmd, "--set is given more than 8 times");
            o->sets[o->n_sets++] = v, done = true;
        }
        for (size_t j = 0; !done && j < sizeof strs / sizeof strs[0]; j++)
            if (!strcmp(f, strs[j].flag)) {
                if (!v || !*v) {
                    char msg[120];
                    snprintf(msg, sizeof msg, "%s needs a value", f);
                    return bad_option(cmd, msg);
                }
                *strs[j].dst = v, done = true;
            }
        for (size_t j = 0; !done && j < sizeof ints / sizeof ints[0]; j++)
            if (!strcmp(f, ints[j].flag) && (generate ? ints[j].gen : ints[j].train)) {
                if (parse_i64(cmd, f, v, ints[j].lo, ints[j].hi, ints[j].dst))
                    return CLI_EXIT_USAGE;
                o->batch_given |= ints[j].dst == &o->batch;
                o->new_given |= ints[j].dst == &o->new_tokens;
                o->max_new_given |= ints[j].dst == &o->max_new_tokens;
                done = true;
            }
        for (size_t j = 0; !done && j < sizeof reals / sizeof reals[0]; j++)
            if (!strcmp(f, reals[j].flag) && (generate ? reals[j].gen : reals[j].train)) {
                if (parse_f64(cmd, f, v, reals[j].lo, reals[j].hi, reals[j].dst))
                    return CLI_EXIT_USAGE;
                done = true;
            }
        if (!done) {
            char msg[300];
            snprintf(msg, sizeof msg, "unknown option '%s'", f);
            return bad_option(cmd, msg);
        }
    }
    if (o->config && o->model_dir)
        return bad_option(cmd, "give --config or --model-dir, not both");
    if (!o->config && !o->model_dir)
        o->config = "glm5.2-3b";
    if (generate && o->max_new_given) {
        if (o->new_given && o->new_tokens != o->max_new_tokens)
            return bad_option(cmd, "--new-tokens and --max-new-tokens are one setting; give one, or the same value");
        o->new_tokens = o->max_new_tokens;
    }
    if (generate && o->stop_at_eos && strcmp(o->stop_at_eos, "eos")) {
        char *end = NULL;
        long long id = strtoll(o->stop_at_eos, &end, 10);
        if (!*o->stop_at_eos || *end || id < 0 || id > INT32_MAX) {
            char msg[200];
            snprintf(msg, sizeof msg, "--stop-at-eos needs 'eos' (the config's eos_token_id), a token id >= 0 or no "
                     "value, got '%s'", o->stop_at_eos);
            return bad_option(cmd, msg);
        }
    }
    if (generate && o->groups > 0) {
        if (o->batch_given && o->batch != o->groups * o->samples) {
            char msg[200];
            snprintf(msg, sizeof msg, "--batch %" PRId64 " is not --groups %" PRId64 " x --samples %" PRId64
                     "; leave --batch out with --groups", o->batch, o->groups, o->samples);
            return bad_option(cmd, msg);
        }
        if (o->groups * o->samples > 1 << 16)
            return bad_option(cmd, "--groups x --samples is more than 65536 sequences");
        o->batch = o->groups * o->samples;
    } else if (generate) {
        if (o->batch % o->samples) {
            char msg[200];
            snprintf(msg, sizeof msg, "--batch %" PRId64 " is not a multiple of --samples %" PRId64 "; give --groups "
                     "P --samples G for a batch of P x G", o->batch, o->samples);
            return bad_option(cmd, msg);
        }
        o->groups = o->batch / o->samples;
    }
    if (o->batch * (generate ? o->prompt_len + o->new_tokens : o->seq) > INT32_MAX)
        return bad_option(cmd, "the batch holds more than 2^31 tokens; lower --batch or the lengths");
    return 0;
}

/* --- model ------------------------------------------------------------------------------------------------------ */

// A config given by name resolves to <exe>/../share/dsarl/configs/bench/NAME.json, else ./configs/bench/NAME.json.
static int find_config(const char *config, char *path, size_t size, dsarl_error *err)
{
    if (strchr(config, '/') || strstr(config, ".json")) {
        snprintf(path, size, "%s", config);
        return DSARL_OK;
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(path, size, "%s/../share/dsarl/configs/bench/%s.json", exe, config);
            if (access(path, R_OK) == 0)
                return DSARL_OK;
        }
    }
    snprintf(path, size, "configs/bench/%s.json", config);
    if (access(path, R_OK) == 0)
        return DSARL_OK;
    return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "--config '%s' is neither a file nor a built-in bench config (looked "
                      "for share/dsarl/configs/bench/%s.json beside the binary and ./configs/bench/%s.json); valid: "
                      "a path to an HF config.json, or glm5.2-3b", config, config, config);
}

// The recipe a model is built from: the HF config as policy.model_config, the indexer loss, the optimizer.
static int make_recipe(model_bench *m, const model_bench_opts *o, dsarl_error *err)
{
    char *path = m->config_path;
    if (o->model_dir)
        snprintf(path, sizeof m->config_path, "%s/config.json", o->model_dir);
    else
        DSARL_TRY(find_config(o->config, path, sizeof m->config_path, err));
    DSARL_TRY(dsarl_json_load_file(path, &m->config, err));
    if (!json_is_object(m->config))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: the config must be a JSON object", path);
    // JSON with ", " and ": " separators is YAML flow syntax, so the config drops into the recipe as it is
    char *flow = json_dumps(m->config, JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    size_t need = (flow ? strlen(flow) : 0) + 1024;
    char *yaml = malloc(need);
    if (!flow || !yaml) {
        free(flow), free(yaml);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsarl bench: out of memory for the recipe");
    }
    snprintf(yaml, need,
             "policy:\n"
             "  model_config: %s\n"
             "  megatron_cfg:\n"
             "    model_overrides:\n"
             "      dsa_indexer_loss_coeff: %.17g\n"
             "    optimizer:\n"
             "      lr: %.17g\n"
             "runtime:\n"
             "  cuda_storage_dtype: bf16\n",
             flow, o->indexer_loss_coeff, o->lr);
    int rc = dsarl_recipe_load_string(yaml, path, &m->recipe, err);
    free(flow), free(yaml);
    for (int i = 0; rc == DSARL_OK && i < o->n_sets; i++) {
        char arg[512];
        if (snprintf(arg, sizeof arg, "++%s", o->sets[i]) >= (int)sizeof arg)
            return DSARL_FAIL(err, DSARL_E_INVALID, "--set '%.40s...': longer than 500 characters", o->sets[i]);
        rc = dsarl_recipe_override(m->recipe, arg, i + 1, err);
    }
    return rc;
}

static int open_model(model_bench *m, model_bench_opts *o, const cli_options *opts, const char *cmd,
                      dsarl_error *err)
{
    DSARL_TRY(make_recipe(m, o, err));
    const dsarl_node *root = dsarl_recipe_root(m->recipe);
    const dsarl_ops_common *dev_c = NULL, *dsa_c = NULL, *model_c = NULL;
    DSARL_TRY(cli_open_registry(NULL, opts, &m->registry, err));
    // the choices a run makes where the recipe leaves them open: the highest-ranked available device, the
    // highest-ranked DSA backend that runs on it, the model table whose accepts takes the config
    char cmd_name[48];
    snprintf(cmd_name, sizeof cmd_name, "dsarl bench %s", cmd);
    DSARL_TRY(cli_choose_device(m->registry, cmd_name, 0, &o->device, &dev_c, err));
    DSARL_TRY(cli_choose_dsa(m->registry, cmd_name, dev_c, &o->backend, &dsa_c, err));
    dsarl_model_probe probe = {.struct_size = sizeof probe, .model_name = o->model_dir ? o->model_dir : m->config_path,
                               .config_path = m->config_path, .recipe = root};
    DSARL_TRY(dsarl_select_model_for(m->registry, &probe, &model_c, err));
    if (!model_c)
        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "dsarl bench %s: no loaded model plugin accepts %s", cmd,
                          m->config_path);
    m->mo = (const dsarl_model_ops *)model_c;
    m->family = model_c->name;
    m->b.d = (const dsarl_device_ops *)dev_c;
    m->b.dsa_ops = (const dsarl_dsa_ops *)dsa_c;
    // the session opens device -> DSA here; the model joins it in create_model, after the ceilings
    dsarl_session_config sc = {.struct_size = sizeof sc, .host = dsarl_registry_host(m->registry), .recipe = root,
                               .seed = (uint64_t)o->seed, .threads = (int32_t)o->threads, .device_ops = m->b.d,
                               .dsa_ops = m->b.dsa_ops, .model_dir = o->model_dir};
    int rc = dsarl_session_open(&sc, &m->session, err);
    m->b.dev = m->session.device;
    m->b.dsa = m->session.dsa;
    DSARL_TRY(rc);
    load_events(&m->b.ev);
    return DSARL_OK;
}

// Builds the model after the ceilings (so their buffers are gone), with the table open_model chose, through the
// session (the same model_config a run's session builds).
static int create_model(model_bench *m, dsarl_error *err)
{
    m->session.config.model_ops = m->mo;
    m->session.model_ops = m->mo;
    return dsarl_session_create_model(&m->session, &m->model, err);
}

/* --- ceilings ---------------------------------------------------------------------------------------------------- */

// bf16 (storage) GEMM n^3 and a device copy of n^2 elements, timed like `dsarl bench dsa` (L2 flushed, mean).
static int measure_ceilings(model_bench *m, int iters, dsarl_error *err)
{
    bench *b = &m->b;
    dsarl_dtype st = b->d->storage_dtype(b->dev);
    size_t e = dsarl_dtype_size(st);
    // the CPU device stores float32 and computes on the host: a smaller square keeps the run short
    bool host = (dsarl_device_capabilities(b->d) & DSARL_DEVICE_CAP_HOST_MEMORY) != 0;
    m->ceiling_n = st == DSARL_DTYPE_F32 && host ? 512 : 8192;
    b->flush_bytes = host ? (size_t)1 << 20 : (size_t)256 << 20;
    int rc = b->d->alloc(b->dev, b->flush_bytes, &b->flush, &b->err);
    gemm_args g = {.n = m->ceiling_n};
    if (rc == 0)
        rc = upload_random(b, &g.a, st, g.n * g.n, 1.0f, 1);
    if (rc == 0)
        rc = upload_random(b, &g.bm, st, g.n * g.n, 1.0f, 2);
    if (rc == 0)
        rc = b->d->alloc(b->dev, (size_t)(g.n * g.n) * e, &g.c, &b->err);
    double gemm_ms = 0.0, copy_ms = 0.0;
    if (rc == 0)
        rc = time_op(b, run_gemm, &g, iters, &gemm_ms);
    copy_args c = {.dst = g.c, .src = g.a, .bytes = (size_t)(g.n * g.n) * e};
    if (rc == 0)
        rc = time_op(b, run_copy, &c, iters, &copy_ms);
    b->d->free(b->dev, g.a), b->d->free(b->dev, g.bm), b->d->free(b->dev, g.c);
    if (rc) {
        *err = b->err;
        return rc;
    }
    m->gemm_tflops = 2.0 * (double)g.n * g.n * g.n / gemm_ms / 1e9;
    m->copy_gbs = 2.0 * (double)c.bytes / copy_ms / 1e6;
    printf("ceilings (this run): %s GEMM %d^3 %.1f TFLOP/s; device copy %.0f GB/s (read + write); %s\n",
           dsarl_dtype_name(st), m->ceiling_n, m->gemm_tflops, m->copy_gbs,
           b->ev.create ? "CUDA events" : "wall clock");
    printf("json: {\"impl\": \"dsarl\", \"op\": \"ceilings\", \"gemm_tflops\": %.6g, \"copy_gbs\": %.6g}\n",
           m->gemm_tflops, m->copy_gbs);
    return DSARL_OK;
}

/* --- FLOPs ------------------------------------------------------------------------------------------------------- */

// The model's sizes from its ops and the FLOPs of batch from its flops slot.
static int model_shape_of(model_bench *m, const model_bench_opts *o, const dsarl_token_batch *batch, model_shape *f,
                          dsarl_error *err)
{
    memset(f, 0, sizeof(*f));
    if (!DSARL_MODEL_HAS(m->mo, flops))
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "dsarl bench: model %s does not count its FLOPs (flops, ABI 1.2)",
                          m->family);
    f->vocab = m->mo->vocab_size(m->model);
    int64_t buffers = 0;
    DSARL_TRY(m->mo->parameter_count(m->model, &f->trainable, &buffers, err));
    size_t elem = dsarl_dtype_size(m->b.d->storage_dtype(m->b.dev));
    int64_t n = m->mo->parameter_tensors(m->model);
    for (int64_t i = 0; i < n; i++) {
        const char *name = NULL;
        int32_t ndim = 0;
        int64_t shape[3] = {1, 1, 1};
        int trainable = 0;
        DSARL_TRY(m->mo->parameter_info(m->model, i, &name, &ndim, shape, &trainable, err));
        f->weight_bytes += shape[0] * (ndim > 1 ? shape[1] : 1) * (ndim > 2 ? shape[2] : 1) * (int64_t)elem;
    }
    dsarl_model_config mc = {.struct_size = sizeof mc, .host = dsarl_registry_host(m->registry),
                             .recipe = dsarl_recipe_root(m->recipe), .model_dir = o->model_dir};
    f->flops.struct_size = sizeof f->flops;
    return m->mo->flops(&mc, batch, &f->flops, err);
}

static void print_model(const model_bench *m, const model_shape *f)
{
    printf("model: %s, %" PRId64 " trainable parameters (%.3f B), %" PRId64 " per token in matmuls (N_lm, %.3f B, "
           "embedding excluded), %" PRId64 " in the indexers (N_idx); %s\n", m->family, f->trainable,
           f->trainable / 1e9, f->flops.matmul_params_per_token, f->flops.matmul_params_per_token / 1e9,
           f->flops.indexer_params, f->flops.summary);
}

/* --- token batches ---------------------------------------------------------------------------------------------- */

typedef struct token_data {
    int32_t *tokens, *targets, *cu;
    float *values, *grads; // (n) log-probs, and their gradients (d mean-NLL / d logp)
    int64_t n;
    int32_t batch;
} token_data;

static void token_data_free(token_data *t)
{
    free(t->tokens), free(t->targets), free(t->cu), free(t->values), free(t->grads);
    memset(t, 0, sizeof(*t));
}

// batch sequences of len uniform token ids in [0, vocab) from a splitmix stream; targets are the next token of
// the same sequence (-1 at its last position).
static int token_data_make(token_data *t, int64_t batch, int64_t len, int64_t vocab, uint64_t seed, dsarl_error *err)
{
    memset(t, 0, sizeof(*t));
    t->n = batch * len, t->batch = (int32_t)batch;
    t->tokens = malloc((size_t)t->n * sizeof(int32_t));
    t->targets = malloc((size_t)t->n * sizeof(int32_t));
    t->values = malloc((size_t)t->n * sizeof(float));
    t->grads = malloc((size_t)t->n * sizeof(float));
    t->cu = malloc((size_t)(batch + 1) * sizeof(int32_t));
    if (!t->tokens || !t->targets || !t->values || !t->grads || !t->cu) {
        token_data_free(t);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsarl bench: out of host memory for %" PRId64 " tokens", batch * len);
    }
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull;
    for (int64_t i = 0; i < t->n; i++) {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        t->tokens[i] = (int32_t)((z ^ (z >> 31)) % (uint64_t)vocab);
    }
    for (int64_t b = 0; b <= batch; b++)
        t->cu[b] = (int32_t)(b * len);
    for (int64_t i = 0; i < t->n; i++)
        t->targets[i] = (i + 1) % len ? t->tokens[i + 1] : -1;
    return DSARL_OK;
}

static dsarl_token_batch as_batch(const token_data *t)
{
    return (dsarl_token_batch){.struct_size = sizeof(dsarl_token_batch), .n_tokens = t->n, .n_sequences = t->batch,
                               .tokens = t->tokens, .cu_seqlens = t->cu};
}

/* --- timing ------------------------------------------------------------------------------------------------------ */

// Marks on the legacy default stream (CUDA events), or the wall clock after a synchronize; differences in ms.
typedef struct stopwatch {
    model_bench *m;
    void *ev[4];
    double wall[4];
    bool events;
} stopwatch;

static void stopwatch_open(stopwatch *w, model_bench *m)
{
    memset(w, 0, sizeof(*w));
    w->m = m;
    w->events = m->b.ev.create != NULL;
    for (int i = 0; i < 4 && w->events; i++)
        w->events = m->b.ev.create(&w->ev[i], 0) == 0;
}

static void stopwatch_close(stopwatch *w)
{
    for (int i = 0; i < 4; i++)
        if (w->ev[i])
            w->m->b.ev.destroy(w->ev[i]);
}

static int stopwatch_mark(stopwatch *w, int i, dsarl_error *err)
{
    if (w->events)
        w->m->b.ev.record(w->ev[i], NULL);
    else
        DSARL_TRY(w->m->b.d->synchronize(w->m->b.dev, err));
    w->wall[i] = now_ms();
    return DSARL_OK;
}

static double stopwatch_ms(stopwatch *w, int from, int to)
{
    float ms = 0.0f;
    if (w->events && w->m->b.ev.sync(w->ev[to]) == 0 && w->m->b.ev.elapsed(&ms, w->ev[from], w->ev[to]) == 0)
        return ms;
    return w->wall[to] - w->wall[from];
}

/* --- train ------------------------------------------------------------------------------------------------------- */

typedef struct step_times { double fwd_ms, step_ms, fwdbwd_ms, opt_ms, loss, grad_norm; } step_times;

static int run_train(model_bench *m, const model_bench_opts *o, dsarl_error *err)
{
    if (!(DSARL_MODEL_HAS(m->mo, train_forward) && DSARL_MODEL_HAS(m->mo, train_backward)))
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "dsarl bench train: model %s has no training pass "
                          "(train_forward / train_backward, ABI 1.2)", m->family);
    dsarl_optimizer_params adam;
    DSARL_TRY(dsarl_optimizer_params_from_recipe(dsarl_recipe_root(m->recipe), &adam, err));
    token_data t;
    DSARL_TRY(token_data_make(&t, o->batch, o->seq, m->mo->vocab_size(m->model), (uint64_t)o->seed, err));
    model_shape f;
    {
        dsarl_token_batch fb = as_batch(&t);
        int frc = model_shape_of(m, o, &fb, &f, err);
        if (frc) {
            token_data_free(&t);
            return frc;
        }
    }
    print_model(m, &f);
    const dsarl_model_flops mf = f.flops;
    double flops = mf.forward + mf.backward;
    stopwatch w;
    stopwatch_open(&w, m);
    step_times sum = {0}, first = {0};
    int rc = DSARL_OK;
    printf("%-6s %10s %10s %12s %10s %12s %10s\n", "step", "fwd ms", "fwd+bwd ms", "optimizer ms", "step ms",
           "tokens/s", "loss");
    for (int64_t s = 0; rc == 0 && s < o->warmup + o->steps; s++) {
        // marks: 0 start, 1 after the training forward, 3 after its backward; the step is what the trainers run
        // per microbatch: zero_grad, train_forward (the log-probs give the loss), train_backward, grad norm, clip,
        // optimizer step
        const dsarl_model_ops *mo = m->mo;
        dsarl_token_batch batch = as_batch(&t);
        step_times st = {0};
        int64_t n_targets = 0;
        for (int64_t i = 0; i < t.n; i++)
            n_targets += t.targets[i] >= 0;
        for (int64_t i = 0; i < t.n; i++) // d mean-NLL / d logp
            t.grads[i] = t.targets[i] >= 0 ? (float)(-1.0 / (double)n_targets) : 0.0f;
        rc = stopwatch_mark(&w, 0, err);
        if (rc == 0)
            rc = mo->zero_grad(m->model, err);
        if (rc == 0)
            rc = mo->train_forward(m->model, &batch, t.targets, t.values, err);
        if (rc == 0)
            rc = stopwatch_mark(&w, 1, err);
        double nll = 0.0;
        for (int64_t i = 0; rc == 0 && i < t.n; i++)
            if (t.targets[i] >= 0)
                nll -= t.values[i];
        if (rc == 0)
            rc = mo->train_backward(m->model, t.grads, NULL, err);
        if (rc == 0)
            rc = stopwatch_mark(&w, 3, err);
        double norm = 0.0;
        if (rc == 0)
            rc = mo->grad_norm(m->model, &norm, err);
        if (rc == 0 && !isfinite(norm))
            rc = DSARL_FAIL(err, DSARL_E_INTERNAL, "dsarl bench train: the gradient norm is %g at step %" PRId64,
                            norm, s);
        dsarl_optimizer_params p = adam;
        p.grad_scale = norm > 1.0 ? 1.0 / (norm + 1e-6) : 1.0; // clip to 1.0 (policy.max_grad_norm's default)
        if (rc == 0)
            rc = mo->optimizer_step(m->model, &p, err);
        if (rc == 0)
            rc = m->b.d->synchronize(m->b.dev, err);
        if (rc)
            break;
        // the optimizer interval: wall clock from the end of backward (which synchronizes) to the synchronize
        double t_end = now_ms();
        st.fwd_ms = stopwatch_ms(&w, 0, 1);
        st.fwdbwd_ms = stopwatch_ms(&w, 0, 3);
        st.opt_ms = t_end - w.wall[3];
        st.step_ms = st.fwdbwd_ms + st.opt_ms;
        st.loss = n_targets ? nll / (double)n_targets : 0.0;
        st.grad_norm = norm;
        if (!isfinite(st.loss)) {
            rc = DSARL_FAIL(err, DSARL_E_INTERNAL, "dsarl bench train: the loss is %g at step %" PRId64, st.loss, s);
            break;
        }
        printf("%-6s %10.1f %10.1f %12.1f %10.1f %12.0f %10.4f\n", s < o->warmup ? "warmup" : "timed", st.fwd_ms,
               st.fwdbwd_ms, st.opt_ms, st.step_ms, (double)t.n / st.step_ms * 1e3, st.loss);
        if (s == 0)
            first = st;
        if (s >= o->warmup) {
            sum.fwd_ms += st.fwd_ms / (double)o->steps, sum.fwdbwd_ms += st.fwdbwd_ms / (double)o->steps;
            sum.opt_ms += st.opt_ms / (double)o->steps, sum.step_ms += st.step_ms / (double)o->steps;
            sum.loss = st.loss, sum.grad_norm = st.grad_norm;
        }
    }
    stopwatch_close(&w);
    token_data_free(&t);
    DSARL_TRY(rc);
    double tok_s = (double)(o->batch * o->seq) / sum.step_ms * 1e3, tflops = flops / sum.step_ms / 1e9;
    double mfu = tflops / m->gemm_tflops;
    printf("%s (model %s)\n           = %.0f forward + %.0f backward = %.0f\n", mf.formula ? mf.formula : "FLOPs/step",
           m->family, mf.forward, mf.backward, flops);
    printf("train step (%" PRId64 " x %" PRId64 " tokens, mean of %" PRId64 " after %" PRId64 " warm-up): %.1f ms "
           "(training forward %.1f ms, forward+backward %.1f ms, grad norm + AdamW %.1f ms); %.0f tokens/s; %.1f "
           "TFLOP/s achieved of %.1f ceiling: MFU %.1f%%; loss %.4f (first step %.4f), grad norm %.3g\n",
           o->batch, o->seq, o->steps, o->warmup, sum.step_ms, sum.fwd_ms, sum.fwdbwd_ms, sum.opt_ms, tok_s, tflops,
           m->gemm_tflops, 100.0 * mfu, sum.loss, first.loss, sum.grad_norm);
    printf("json: {\"impl\": \"dsarl\", \"op\": \"train_step\", \"device\": \"%s\", \"backend\": \"%s\", "
           "\"params\": %" PRId64 ", \"active_params\": %" PRId64 ", \"indexer_params\": %" PRId64 ", "
           "\"batch\": %" PRId64 ", \"seq\": %" PRId64 ", \"tokens\": %" PRId64 ", \"ms\": %.3f, \"fwd_ms\": %.3f, "
           "\"fwdbwd_ms\": %.3f, \"opt_ms\": %.3f, \"tokens_per_s\": %.1f, \"flops_per_step\": %.0f, "
           "\"tflops\": %.6g, \"gemm_ceiling_tflops\": %.6g, \"copy_gbs\": %.6g, \"mfu\": %.6g, \"loss\": %.6f, "
           "\"first_loss\": %.6f}\n",
           o->device, o->backend, f.trainable, mf.matmul_params_per_token, mf.indexer_params, o->batch, o->seq,
           o->batch * o->seq,
           sum.step_ms, sum.fwd_ms, sum.fwdbwd_ms, sum.opt_ms, tok_s, flops, tflops, m->gemm_tflops, m->copy_gbs,
           mfu, sum.loss, first.loss);
    return DSARL_OK;
}

/* --- generate ---------------------------------------------------------------------------------------------------- */

enum { MAX_STOP_IDS = 16 };

// The ids --stop-at-eos ends sequences at: the config's eos_token_id (an id or a list) or the id given.
static int stop_ids_of(const model_bench *m, const model_bench_opts *o, int64_t vocab, int32_t *ids, int32_t *n,
                       dsarl_error *err)
{
    *n = 0;
    if (!o->stop_at_eos)
        return DSARL_OK;
    if (strcmp(o->stop_at_eos, "eos")) {
        long long id = strtoll(o->stop_at_eos, NULL, 10); // its syntax was checked with the options
        if (id >= vocab)
            return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl bench generate: --stop-at-eos %lld is outside the "
                              "vocabulary [0, %" PRId64 ") of %s", id, vocab, m->config_path);
        ids[(*n)++] = (int32_t)id;
        return DSARL_OK;
    }
    const json_t *eos = json_object_get(m->config, "eos_token_id");
    size_t count = json_is_array(eos) ? json_array_size(eos) : json_is_integer(eos) ? 1 : 0;
    if (count == 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl bench generate: --stop-at-eos: %s has no eos_token_id (an id "
                          "or a list of ids); give the id to stop at, --stop-at-eos ID", m->config_path);
    if (count > MAX_STOP_IDS)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl bench generate: --stop-at-eos: eos_token_id of %s lists %zu "
                          "ids, more than the %d the bench takes", m->config_path, count, MAX_STOP_IDS);
    for (size_t i = 0; i < count; i++) {
        const json_t *e = json_is_array(eos) ? json_array_get(eos, i) : eos;
        json_int_t id = json_is_integer(e) ? json_integer_value(e) : -1;
        if (id < 0 || id >= vocab)
            return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl bench generate: --stop-at-eos: eos_token_id of %s holds "
                              "%s, not a token id in [0, %" PRId64 ")", m->config_path,
                              json_is_integer(e) ? "an id outside the vocabulary" : "a value that is no integer",
                              vocab);
        ids[(*n)++] = (int32_t)id;
    }
    return DSARL_OK;
}

// What one generate call made: its time, tokens, and the longest completion.
typedef struct gen_call { double ms; int64_t tokens; int32_t longest; } gen_call;

// One generate call, timed; every completion checked against the stop rules (a short one ends at a stop id).
static int timed_generate(model_bench *m, const dsarl_generation_ops *go, dsarl_generator *gen,
                          const token_data *t, const dsarl_sampling_params *sp, gen_call *out, dsarl_error *err)
{
    dsarl_token_batch batch = as_batch(t);
    dsarl_generation_result res = {.struct_size = sizeof(res)};
    DSARL_TRY(m->b.d->synchronize(m->b.dev, err));
    double t0 = now_ms();
    DSARL_TRY(go->generate(gen, &batch, sp, &res, err));
    DSARL_TRY(m->b.d->synchronize(m->b.dev, err));
    out->ms = now_ms() - t0; // the engine synchronizes every decode step (host sampling results): wall clock is exact
    out->tokens = res.cu_lengths[res.n_sequences], out->longest = 0;
    for (int32_t b = 0; b < res.n_sequences; b++) {
        int32_t n = res.cu_lengths[b + 1] - res.cu_lengths[b];
        out->longest = n > out->longest ? n : out->longest;
        bool stopped = false;
        for (int32_t i = 0; n > 0 && i < sp->n_stop_token_ids; i++)
            stopped |= res.tokens[res.cu_lengths[b + 1] - 1] == sp->stop_token_ids[i];
        if (n < 1 || n > sp->max_new_tokens || (n < sp->max_new_tokens && !stopped))
            return DSARL_FAIL(err, DSARL_E_INTERNAL, "dsarl bench generate: sequence %d came back with %d tokens, "
                              "not %d (max new tokens) nor ended by a stop id", b, n, sp->max_new_tokens);
    }
    return DSARL_OK;
}

static int run_generate(model_bench *m, const model_bench_opts *o, dsarl_error *err)
{
    // the FLOPs of generation: one forward over prompt + new tokens per sequence (what prefill and the decode
    // steps compute together, attention over the cache included; a shared prompt counted per sequence)
    int64_t full_len = o->prompt_len + o->new_tokens;
    int32_t *flop_cu = malloc(sizeof(int32_t) * (size_t)(o->batch + 1));
    if (!flop_cu)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsarl bench generate: out of memory");
    for (int64_t b = 0; b <= o->batch; b++)
        flop_cu[b] = (int32_t)(b * full_len);
    dsarl_token_batch flop_batch = {.struct_size = sizeof flop_batch, .n_tokens = o->batch * full_len,
                                    .n_sequences = (int32_t)o->batch, .cu_seqlens = flop_cu};
    model_shape f;
    int src = model_shape_of(m, o, &flop_batch, &f, err);
    if (src) {
        free(flop_cu);
        return src;
    }
    print_model(m, &f);
    int32_t stop_ids[MAX_STOP_IDS], n_stop = 0;
    int rc = stop_ids_of(m, o, f.vocab, stop_ids, &n_stop, err);
    const dsarl_ops_common *gen_c = NULL;
    if (rc == 0)
        rc = dsarl_registry_require(m->registry, DSARL_KIND_GENERATION, "native", "dsarl bench generate", &gen_c, err);
    const dsarl_generation_ops *go = (const dsarl_generation_ops *)gen_c;
    dsarl_generator *gen = NULL;
    if (rc == 0)
        rc = go->create(dsarl_recipe_root(m->recipe), m->mo, m->model, &gen, err);
    token_data t = {0};
    if (rc == 0)
        rc = token_data_make(&t, o->batch, o->prompt_len, f.vocab, (uint64_t)o->seed, err);
    // GRPO's layout: the samples of a prompt one after another, equal, so the engine prefills each prompt once
    for (int64_t b = 0; rc == 0 && b < o->batch; b++)
        if (b % o->samples)
            memcpy(t.tokens + b * o->prompt_len, t.tokens + (b - b % o->samples) * o->prompt_len,
                   (size_t)o->prompt_len * sizeof(int32_t));
    dsarl_sampling_params sp = {.struct_size = sizeof(sp), .temperature = (float)o->temperature,
                                .top_p = (float)o->top_p, .top_k = (int32_t)o->top_k,
                                .max_new_tokens = (int32_t)o->new_tokens, .seed = (uint64_t)o->seed,
                                .stop_token_ids = n_stop ? stop_ids : NULL, .n_stop_token_ids = n_stop};
    dsarl_sampling_params prefill_sp = sp; // the same batch to its first token: the prefill and one draw
    prefill_sp.max_new_tokens = 1;
    gen_call sum = {0}, call = {0}, first = {0};
    double prefill_ms = 0.0, decode_steps = 0.0;
    if (rc == 0)
        printf("%-6s %10s %14s %12s %10s %12s\n", "call", "ms", "new tokens", "tokens/s", "mean len", "prefill ms");
    for (int64_t s = 0; rc == 0 && s < o->warmup + o->steps; s++) {
        rc = timed_generate(m, go, gen, &t, &sp, &call, err);
        if (rc == 0 && n_stop == 0 && call.tokens != o->batch * o->new_tokens)
            rc = DSARL_FAIL(err, DSARL_E_INTERNAL, "dsarl bench generate: %" PRId64 " tokens came back, expected %"
                            PRId64 " (no stop token was given)", call.tokens, o->batch * o->new_tokens);
        first.ms = 0.0;
        if (rc == 0 && s >= o->warmup)
            rc = timed_generate(m, go, gen, &t, &prefill_sp, &first, err);
        if (rc)
            break;
        printf("%-6s %10.1f %14" PRId64 " %12.1f %10.2f", s < o->warmup ? "warmup" : "timed", call.ms, call.tokens,
               (double)call.tokens / call.ms * 1e3, (double)call.tokens / (double)o->batch);
        printf(s < o->warmup ? "\n" : " %12.1f\n", first.ms);
        if (s >= o->warmup) {
            sum.ms += call.ms, sum.tokens += call.tokens;
            sum.longest = call.longest > sum.longest ? call.longest : sum.longest;
            prefill_ms += first.ms / (double)o->steps;
            decode_steps += (double)(call.longest - 1) / (double)o->steps; // every running sequence, one each
        }
    }
    if (gen)
        go->destroy(gen);
    token_data_free(&t);
    if (rc == 0 && n_stop) { // the FLOPs of what was generated: the mean completion per sequence
        int64_t mean_len = (sum.tokens + o->steps * o->batch / 2) / (o->steps * o->batch);
        for (int64_t b = 0; b <= o->batch; b++)
            flop_cu[b] = (int32_t)(b * (o->prompt_len + mean_len));
        flop_batch.n_tokens = o->batch * (o->prompt_len + mean_len);
        model_shape done;
        rc = model_shape_of(m, o, &flop_batch, &done, err);
        f.flops = done.flops;
    }
    free(flop_cu);
    DSARL_TRY(rc);
    double ms = sum.ms / (double)o->steps, tok_s = (double)sum.tokens / sum.ms * 1e3;
    double tokens = (double)sum.tokens / (double)o->steps, mean_len = tokens / (double)o->batch;
    // decode: the call less its prefill (which drew every sequence's first token)
    double decode_ms = ms > prefill_ms ? ms - prefill_ms : 0.0, decode_tokens = tokens - (double)o->batch;
    double decode_tok_s = decode_ms > 0.0 ? decode_tokens / decode_ms * 1e3 : 0.0;
    double step_ms = decode_steps > 0.0 ? decode_ms / decode_steps : 0.0;
    // decode reads every weight but the embedding once per step when the batch's tokens touch every expert
    double step_bytes = (double)(f.weight_bytes - f.flops.embedding_params * (int64_t)dsarl_dtype_size(
                                     m->b.d->storage_dtype(m->b.dev)));
    double floor_ms = step_bytes / (m->copy_gbs * 1e6), floor_tok_s = (double)o->batch / floor_ms * 1e3;
    double ratio = decode_tok_s / floor_tok_s, flops = f.flops.forward;
    char sampling[96], stops[160] = "no stop";
    if (o->temperature > 0.0)
        snprintf(sampling, sizeof sampling, "temperature %g, top-p %g, top-k %" PRId64 ", seed %" PRId64,
                 o->temperature, o->top_p, o->top_k, o->seed);
    else
        snprintf(sampling, sizeof sampling, "greedy");
    for (int32_t i = 0, at = 0; i < n_stop; i++)
        at += snprintf(stops + at, sizeof stops - (size_t)at, "%s%d", i ? "," : "stop at ", stop_ids[i]);
    printf("generate (batch %" PRId64 " = %" PRId64 " prompts x %" PRId64 " samples, prompt %" PRId64 ", up to %"
           PRId64 " new tokens, %s, %s, mean of %" PRId64 "): %.1f ms, %.1f generated tokens/s, mean completion "
           "%.2f tokens (longest %d)\n", o->batch, o->groups, o->samples, o->prompt_len, o->new_tokens, sampling,
           stops, o->steps, ms, tok_s, mean_len, sum.longest);
    printf("prefill %.1f ms (the batch to one new token); decode %.1f ms, %.0f tokens in %.0f steps: %.3f ms/step, "
           "%.1f tokens/s = %.3f of the floor\n", prefill_ms, decode_ms, decode_tokens, decode_steps, step_ms,
           decode_tok_s, ratio);
    printf("decode floor %.3f ms/step (%.2f GB of weights at %.0f GB/s) = %.0f tokens/s at batch %" PRId64 "; model "
           "FLOPs %.3g (one forward over prompt + generated tokens; %.2f TFLOP/s, ceiling %.1f)\n",
           floor_ms, step_bytes / 1e9, m->copy_gbs, floor_tok_s, o->batch, flops, flops / ms / 1e9, m->gemm_tflops);
    printf("json: {\"impl\": \"dsarl\", \"op\": \"generate\", \"device\": \"%s\", \"backend\": \"%s\", "
           "\"params\": %" PRId64 ", \"active_params\": %" PRId64 ", \"batch\": %" PRId64 ", \"prompt_len\": %" PRId64
           ", \"new_tokens\": %" PRId64 ", \"ms\": %.6f, \"tokens_per_s\": %.1f, \"floor_tokens_per_s\": %.0f, "
           "\"tflops\": %.6g, \"gemm_ceiling_tflops\": %.6g, \"copy_gbs\": %.6g, \"groups\": %" PRId64 ", "
           "\"samples\": %" PRId64 ", \"temperature\": %.6g, \"top_p\": %.6g, \"top_k\": %" PRId64 ", "
           "\"seed\": %" PRId64 ", \"stop_ids\": [",
           o->device, o->backend, f.trainable, f.flops.matmul_params_per_token, o->batch, o->prompt_len, o->new_tokens,
           ms, tok_s, floor_tok_s, flops / ms / 1e9, m->gemm_tflops, m->copy_gbs, o->groups, o->samples,
           o->temperature, o->top_p, o->top_k, o->seed);
    for (int32_t i = 0; i < n_stop; i++)
        printf("%s%d", i ? ", " : "", stop_ids[i]);
    printf("], \"tokens\": %.2f, \"mean_len\": %.6g, \"max_len\": %d, \"prefill_ms\": %.6f, \"decode_ms\": %.6f, "
           "\"decode_tokens\": %.2f, \"decode_steps\": %.2f, \"decode_step_ms\": %.6f, \"decode_tokens_per_s\": %.1f, "
           "\"floor_ms\": %.6f, \"floor_ratio\": %.6g}\n",
           tokens, mean_len, sum.longest, prefill_ms, decode_ms, decode_tokens, decode_steps, step_ms, decode_tok_s,
           floor_ms, ratio);
    return DSARL_OK;
}

/* --- entry points ----------------------------------------------------------------------------------------------- */

static int bench_model(int argc, char **argv, const cli_options *opts, bool generate)
{
    model_bench_opts o = {.seq = 4096, .batch = generate ? 32 : 2, .steps = generate ? 1 : 3,
                          .warmup = 1, .ceiling_iters = 5, .prompt_len = 128, .new_tokens = 128, .lr = 1e-5,
                          .samples = 1, .top_p = 1.0};
    int prc = parse_opts(argc, argv, generate, &o);
    if (prc)
        return prc < 0 ? CLI_EXIT_OK : prc;
    const char *cmd = generate ? "generate" : "train";
    model_bench m = {0};
    dsarl_error err = {0};
    int rc = open_model(&m, &o, opts, cmd, &err);
    if (rc == 0)
        printf("dsarl bench %s: device %s (storage %s), backend %s, %s %s\n", cmd, o.device,
               dsarl_dtype_name(m.b.d->storage_dtype(m.b.dev)), o.backend, o.model_dir ? "weights of" : "config",
               o.model_dir ? o.model_dir : o.config);
    if (rc == 0)
        rc = measure_ceilings(&m, (int)o.ceiling_iters, &err);
    double t0 = now_ms();
    if (rc == 0)
        rc = create_model(&m, &err);
    if (rc == 0)
        printf("model built in %.1f s (%s)\n", (now_ms() - t0) / 1e3, o.model_dir ? "loaded" : "random init");
    if (rc == 0)
        rc = generate ? run_generate(&m, &o, &err) : run_train(&m, &o, &err);
    model_bench_close(&m);
    fflush(stdout);
    return rc ? cli_fail(&err) : CLI_EXIT_OK;
}

int cmd_bench_train(int argc, char **argv, const cli_options *opts) { return bench_model(argc, argv, opts, false); }

int cmd_bench_generate(int argc, char **argv, const cli_options *opts) { return bench_model(argc, argv, opts, true); }
