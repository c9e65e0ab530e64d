/* cmd_model.c: `dsarl logits` and `dsarl generate` for any Hugging Face directory a loaded model plugin accepts,
 * by default on the highest-ranked host-memory device and the highest-ranked DSA backend that runs on it (float32
 * results); --device, --dsa and --dtype run them on what training uses (the GPU and its kernels). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cli.h"
#include "cmd_model.h"
#include "dsarl/fileutil.h"
#include "dsarl/hf_hub.h"
#include "dsarl/json.h"
#include "dsarl/npy.h"
#include "dsarl/ops/generation.h"
#include "dsarl/ops/model.h"
#include "dsarl/trainer.h"
#include "recipe_internal.h"

// Refuses a sequence longer than the model's positions (config.json's max_position_embeddings, when it has one):
// RoPE past them is extrapolation the model was never trained for, and caches are sized from it.
static int check_positions(const char *dir, const char *what, int64_t tokens, dsarl_error *err)
{
    char *path = dsarl_path_join(dir, "config.json");
    json_t *root = NULL;
    int rc = path ? dsarl_json_load_file(path, &root, err) : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
    json_t *max = rc == 0 ? json_object_get(root, "max_position_embeddings") : NULL;
    if (rc == 0 && json_is_integer(max) && tokens > json_integer_value(max))
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s has %lld tokens, more than the model's max_position_embeddings "
                        "%lld (%s)", what, (long long)tokens, (long long)json_integer_value(max), path);
    json_decref(root);
    free(path);
    return rc;
}

// Everything one command holds; closed in reverse order.
typedef struct model_session {
    dsarl_registry *registry;
    dsarl_recipe *recipe;             // the device's settings (--dtype)
    dsarl_session core;               // device, DSA backend, the model
    const dsarl_model_ops *model_ops; // borrowed from core
    dsarl_model *model;
} model_session;

static void session_close(model_session *s)
{
    dsarl_session_close(&s->core);
    dsarl_recipe_free(s->recipe);
    dsarl_registry_free(s->registry);
    memset(s, 0, sizeof(*s));
}

/* --threads N: an integer in [1, 1024] (a negative or huge count used to reach the BLAS unchecked). */
static int parse_threads(const char *cmd, const char *text, int *out)
{
    char *end = NULL;
    long v = strtol(text, &end, 10);
    if (!*text || *end || v < 1 || v > 1024) {
        fprintf(stderr, "dsarl %s: error: --threads needs an integer in [1, 1024], got '%s'\n", cmd, text);
        return CLI_EXIT_USAGE;
    }
    *out = (int)v;
    return CLI_EXIT_OK;
}

// Where a command runs: --device, --dsa and --dtype as given (NULL: the defaults below).
typedef struct run_target {
    const char *device; // device plugin, or "auto": the highest-ranked one this machine runs; NULL: host memory
    const char *dsa;    // DSA backend; NULL: the highest-ranked one that runs on the device
    const char *dtype;  // storage dtype "bf16" | "f32" (runtime.cuda_storage_dtype); NULL: the device's default
} run_target;

static int session_open(model_session *s, const char *model_dir, int threads, const run_target *target,
                        const char *cmd, dsarl_error *err)
{
    memset(s, 0, sizeof(*s));
    char found[4096];
    if (dsarl_hf_is_hub_id(model_dir)) {
        DSARL_TRY(dsarl_hf_resolve(model_dir, NULL, "--model-dir", found, sizeof found, err));
        model_dir = found;
    }
    struct stat st;
    if (stat(model_dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return DSARL_FAIL(err, errno == ENOENT ? DSARL_E_NOT_FOUND : DSARL_E_INVALID,
                          "--model-dir '%s' is %s; it takes a Hugging Face model directory (config.json and "
                          "model.safetensors)", model_dir, errno == ENOENT ? "missing" : "not a directory");
    if (target->dtype && strcmp(target->dtype, "bf16") != 0 && strcmp(target->dtype, "f32") != 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl %s --dtype '%s': valid values are bf16 and f32", cmd,
                          target->dtype);
    cli_options none = {0};
    const dsarl_ops_common *dev_c = NULL, *dsa_c = NULL, *model_c = NULL;
    int rc = cli_open_registry(NULL, &none, &s->registry, err);
    if (rc < 0)
        return rc;
    char where[64];
    if (!target->device) {
        // float32 host results by default: the highest-ranked host-memory device
        dev_c = dsarl_select_default_device(s->registry, DSARL_DEVICE_CAP_HOST_MEMORY);
        if (!dev_c)
            return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "dsarl %s: no loaded device plugin with host memory can run "
                              "here; name one with --device", cmd);
    } else {
        const char *device = strcmp(target->device, "auto") == 0 ? NULL : target->device;
        snprintf(where, sizeof where, "dsarl %s", cmd);
        DSARL_TRY(cli_choose_device(s->registry, where, 0, &device, &dev_c, err));
    }
    if (target->dsa) {
        snprintf(where, sizeof where, "dsarl %s --dsa", cmd);
        DSARL_TRY(dsarl_registry_require(s->registry, DSARL_KIND_DSA, target->dsa, where, &dsa_c, err));
    } else if (!(dsa_c = dsarl_select_default_dsa(s->registry, (const dsarl_device_ops *)dev_c))) {
        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "dsarl %s: no loaded DSA backend runs on device %s; name one with "
                          "--dsa", cmd, dev_c->name);
    }
    char config_path[4200];
    snprintf(config_path, sizeof config_path, "%s/config.json", model_dir);
    dsarl_model_probe probe = {.struct_size = sizeof probe, .model_name = model_dir,
                               .config_path = access(config_path, R_OK) == 0 ? config_path : NULL};
    rc = dsarl_select_model_for(s->registry, &probe, &model_c, err);
    if (rc < 0)
        return rc;
    if (!model_c)
        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "dsarl %s: no loaded model plugin accepts %s", cmd, model_dir);
    // the device reads its storage dtype from the recipe key a run sets
    char yaml[128];
    snprintf(yaml, sizeof yaml, "runtime:\n  cuda_storage_dtype: %s\n", target->dtype ? target->dtype : "bf16");
    DSARL_TRY(dsarl_recipe_load_string(yaml, "--dtype", &s->recipe, err));
    dsarl_session_config sc = {.struct_size = sizeof(sc), .host = dsarl_registry_host(s->registry),
                               .recipe = dsarl_recipe_root(s->recipe), .threads = threads,
                               .device_ops = (const dsarl_device_ops *)dev_c, .dsa_ops = (const dsarl_dsa_ops *)dsa_c,
                               .model_ops = (const dsarl_model_ops *)model_c, .model_dir = model_dir};
    rc = dsarl_session_open(&sc, &s->core, err);
    s->model_ops = s->core.model_ops;
    s->model = s->core.model;
    if (rc == 0 && target->dtype) {
        dsarl_dtype want = strcmp(target->dtype, "bf16") == 0 ? DSARL_DTYPE_BF16 : DSARL_DTYPE_F32;
        dsarl_dtype have = sc.device_ops->storage_dtype(s->core.device);
        if (have != want)
            return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl %s --dtype %s: device %s stores %s only", cmd,
                              target->dtype, dev_c->name, dsarl_dtype_name(have));
    }
    return rc;
}

static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')
        p++;
    return p;
}

// Parses "[[1,2,3],[4,5,6]]" (equal-length rows) into a malloc'ed B*S array.
static int parse_id_rows(const char *path, const char *text, int32_t **ids, int32_t *B, int32_t *S,
                         dsarl_error *err)
{
    const char *p = text;
    int32_t rows = 0, cols = -1, n = 0, cap = 256;
    int32_t *out = malloc((size_t)cap * sizeof(int32_t));
    if (!out)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory", path);
#define BAD(msg) do { free(out); return DSARL_FAIL(err, DSARL_E_INVALID, "%s: %s (byte %ld); expected a JSON list " \
                 "of equal-length lists of token ids, e.g. [[1, 2, 3]]", path, msg, (long)(p - text)); } while (0)
    p = skip_ws(p);
    if (*p++ != '[')
        BAD("not a list");
    p = skip_ws(p);
    while (*p == '[') {
        p++;
        int32_t row_len = 0;
        p = skip_ws(p);
        while (*p != ']') {
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < 0 || v > INT32_MAX)
                BAD("a token id is not a non-negative integer");
            p = end;
            if (n == cap) {
                int32_t *b = realloc(out, (size_t)(cap *= 2) * sizeof(int32_t));
                if (!b)
                    BAD("out of memory");
                out = b;
            }
            out[n++] = (int32_t)v, row_len++;
            p = skip_ws(p);
            if (*p == ',')
                p = skip_ws(p + 1);
            else if (*p != ']')
                BAD("missing ',' or ']'");
        }
        p++;
        if (cols >= 0 && row_len != cols)
            BAD("rows have different lengths");
        if (row_len == 0)
            BAD("an empty row");
        cols = row_len, rows++;
        p = skip_ws(p);
        if (*p == ',')
            p = skip_ws(p + 1);
    }
    if (*p != ']' || rows == 0)
        BAD("no rows, or trailing text");
#undef BAD
    *ids = out, *B = rows, *S = cols;
    return DSARL_OK;
}

static const char *logits_help =
    "usage: dsarl logits --model-dir DIR --input-ids FILE.json --out OUT.npy [--threads N]\n"
    "                    [--device NAME|auto] [--dsa NAME] [--dtype bf16|f32]\n"
    "\n"
    "Next-token logits of a Hugging Face glm_moe_dsa model (config.json + safetensors) in float32 on the\n"
    "highest-ranked host-memory device and the highest-ranked DSA backend on it (cpu and reference by default).\n"
    "  --model-dir DIR       the model directory (GLM-5.1 style, or GLM-5.2 with IndexShare), or a hub id in\n"
    "                        the Hugging Face cache (zai-org/GLM-5.2)\n"
    "  --input-ids FILE      JSON list of equal-length lists of token ids, e.g. [[1, 2, 3], [4, 5, 6]]\n"
    "  --out OUT.npy         float32 array [B, S, V], written atomically\n"
    "  --threads N           OpenBLAS threads (default 1)\n"
    "  --device NAME         device plugin (cpu, cuda), or auto: the highest-ranked one this machine runs\n"
    "  --dsa NAME            DSA backend (reference, tilelang, cudnn); default: the best one on the device\n"
    "  --dtype bf16|f32      storage dtype on cuda (runtime.cuda_storage_dtype; default bf16); cpu is f32\n";

static const char *generate_help =
    "usage: dsarl generate --model-dir DIR --prompt-ids 1,2,3 --max-new-tokens N (--greedy | --temperature T)\n"
    "                      [--top-k K] [--top-p P] [--seed S] [--stop-ids 1,2] [--logprobs] [--threads N]\n"
    "                      [--device NAME|auto] [--dsa NAME] [--dtype bf16|f32]\n"
    "\n"
    "Continues a prompt with a Hugging Face glm_moe_dsa model through the native generation engine (KV cache of MLA\n"
    "latents and indexer keys, prefill + decode; the reference DSA backend on the cpu device unless --device and\n"
    "--dsa say otherwise). Prints the new\n"
    "token ids as a JSON list, or with --logprobs an object {\"tokens\", \"logprobs\", \"truncated\"}.\n"
    "  --model-dir DIR         the model directory, or a hub id in the Hugging Face cache\n"
    "  --prompt-ids IDS        comma-separated token ids\n"
    "  --max-new-tokens N      at most this many new tokens (>= 1)\n"
    "  --greedy                argmax decoding (ties pick the lowest id)\n"
    "  --temperature T         sample from softmax(logits / T), T > 0\n"
    "  --top-k K, --top-p P    keep the K most likely ids / the smallest set holding mass P (off by default)\n"
    "  --seed S                sampling seed (default 0)\n"
    "  --stop-ids IDS          comma-separated ids that end the completion (kept in it)\n"
    "  --logprobs              also print each token's log-probability under the sampling distribution\n"
    "  --threads N             OpenBLAS threads (default 1)\n"
    "  --device, --dsa, --dtype as `dsarl logits`\n";

// Matches "--name VALUE" and "--name=VALUE"; advances *i past the value.
static int take_value(int argc, char **argv, int *i, const char *name, const char **out)
{
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0)
        return 0;
    if (argv[*i][n] == '=') {
        *out = argv[*i] + n + 1;
        return 1;
    }
    if (argv[*i][n] != '\0')
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "dsarl: error: %s needs a value\n", name);
        return -1;
    }
    *out = argv[++*i];
    return 1;
}

// --device, --dsa, --dtype: 1 when argv[*i] was one of them, -1 when its value is missing, 0 otherwise.
static int take_target(int argc, char **argv, int *i, run_target *t)
{
    int r;
    if ((r = take_value(argc, argv, i, "--device", &t->device)) || (r = take_value(argc, argv, i, "--dsa", &t->dsa)))
        return r;
    return take_value(argc, argv, i, "--dtype", &t->dtype);
}

static int usage_error(const char *cmd, const char *what)
{
    fprintf(stderr, "dsarl %s: error: %s; run `dsarl %s --help`\n", cmd, what, cmd);
    return CLI_EXIT_USAGE;
}

int dsarl_cmd_logits(int argc, char **argv)
{
    const char *dir = NULL, *input = NULL, *out = NULL, *threads_s = "1";
    run_target target = {0};
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_is_help(argv[i])) {
            fputs(logits_help, stdout);
            return CLI_EXIT_OK;
        }
        if ((r = take_value(argc, argv, &i, "--model-dir", &dir)) || (r = take_value(argc, argv, &i, "--input-ids",
            &input)) || (r = take_value(argc, argv, &i, "--out", &out)) ||
            (r = take_value(argc, argv, &i, "--threads", &threads_s)) ||
            (r = take_target(argc, argv, &i, &target))) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            continue;
        }
        char msg[300];
        snprintf(msg, sizeof msg, "unknown argument '%s'", argv[i]);
        return usage_error("logits", msg);
    }
    if (!dir || !input || !out)
        return usage_error("logits", "--model-dir, --input-ids and --out are required");
    dsarl_error err = {0};
    void *text = NULL;
    size_t size = 0;
    int32_t *ids = NULL, B = 0, S = 0;
    int rc = dsarl_read_file(input, &text, &size, &err);
    if (rc == 0)
        rc = parse_id_rows(input, text, &ids, &B, &S, &err);
    free(text);
    if (rc < 0)
        return cli_fail(&err);
    int threads = 1;
    if (parse_threads("logits", threads_s, &threads) != CLI_EXIT_OK)
        return CLI_EXIT_USAGE;
    model_session s;
    rc = session_open(&s, dir, threads, &target, "logits", &err);
    if (rc == 0)
        rc = check_positions(s.core.model_dir, "each row of --input-ids", S, &err);
    float *logits = NULL;
    int32_t *cu = malloc((size_t)(B + 1) * sizeof(int32_t));
    if (rc == 0) {
        int64_t V = s.model_ops->vocab_size(s.model);
        logits = malloc((size_t)B * (size_t)S * (size_t)V * sizeof(float));
        for (int32_t b = 0; b <= B; b++)
            cu[b] = b * S; // rows packed as separate sequences
        dsarl_token_batch batch = {.struct_size = sizeof(batch), .n_tokens = (int64_t)B * S, .n_sequences = B,
                                   .tokens = ids, .cu_seqlens = cu};
        rc = logits ? s.model_ops->forward_logits(s.model, &batch, logits, &err)
                    : DSARL_FAIL(&err, DSARL_E_NOMEM, "out of memory for %d x %d x %lld logits", B, S, (long long)V);
        int64_t shape[3] = {B, S, V};
        dsarl_tensor t;
        if (rc == 0)
            rc = dsarl_tensor_init(&t, logits, DSARL_DTYPE_F32, 3, shape, DSARL_DEVICE_CPU, &err);
        if (rc == 0)
            rc = dsarl_npy_write(out, &t, &err);
    }
    session_close(&s);
    free(ids), free(cu), free(logits);
    return rc < 0 ? cli_fail(&err) : CLI_EXIT_OK;
}

// Parses "1,2,3" into a malloc'ed array; 0 on success, -1 on a malformed list.
static int parse_id_list(const char *text, int32_t **out, int32_t *n)
{
    int32_t *ids = malloc((strlen(text) / 2 + 2) * sizeof(int32_t));
    *n = 0;
    if (!ids)
        return -1;
    for (const char *p = text; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            free(ids);
            return -1;
        }
        ids[(*n)++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    *out = ids;
    return 0;
}

// Parses a number option; 0 on success.
static int parse_double(const char *text, double lo, double hi, double *out)
{
    char *end;
    *out = strtod(text, &end);
    return *end || end == text || !(*out >= lo && *out <= hi) ? -1 : 0;
}

int dsarl_cmd_generate(int argc, char **argv)
{
    const char *dir = NULL, *prompt = NULL, *max_s = NULL, *threads_s = "1", *temp_s = NULL, *top_k_s = "0";
    const char *top_p_s = "1", *seed_s = "0", *stop_s = NULL;
    int greedy = 0, want_logprobs = 0;
    run_target target = {0};
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_is_help(argv[i])) {
            fputs(generate_help, stdout);
            return CLI_EXIT_OK;
        }
        if (!strcmp(argv[i], "--greedy") || !strcmp(argv[i], "--logprobs")) {
            *(argv[i][2] == 'g' ? &greedy : &want_logprobs) = 1;
            continue;
        }
        if ((r = take_value(argc, argv, &i, "--model-dir", &dir)) ||
            (r = take_value(argc, argv, &i, "--prompt-ids", &prompt)) ||
            (r = take_value(argc, argv, &i, "--max-new-tokens", &max_s)) ||
            (r = take_value(argc, argv, &i, "--temperature", &temp_s)) ||
            (r = take_value(argc, argv, &i, "--top-k", &top_k_s)) ||
            (r = take_value(argc, argv, &i, "--top-p", &top_p_s)) ||
            (r = take_value(argc, argv, &i, "--seed", &seed_s)) ||
            (r = take_value(argc, argv, &i, "--stop-ids", &stop_s)) ||
            (r = take_value(argc, argv, &i, "--threads", &threads_s)) ||
            (r = take_target(argc, argv, &i, &target))) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            continue;
        }
        char msg[300];
        snprintf(msg, sizeof msg, "unknown argument '%s'", argv[i]);
        return usage_error("generate", msg);
    }
    if (!dir || !prompt || !max_s)
        return usage_error("generate", "--model-dir, --prompt-ids and --max-new-tokens are required");
    if (greedy == (temp_s != NULL))
        return usage_error("generate", "choose one decoding mode: --greedy, or --temperature T with T > 0");
    double max_new, temperature = 0, top_k, top_p, seed;
    if (parse_double(max_s, 1, 1000000, &max_new) || max_new != (int32_t)max_new)
        return usage_error("generate", "--max-new-tokens must be an integer >= 1");
    if (temp_s && parse_double(temp_s, 1e-6, 1e6, &temperature))
        return usage_error("generate", "--temperature must be a number > 0");
    if (parse_double(top_k_s, -1, INT32_MAX, &top_k) || top_k != (int32_t)top_k)
        return usage_error("generate", "--top-k must be an integer >= 1 (0 or -1: off)");
    if (parse_double(top_p_s, 1e-9, 1, &top_p))
        return usage_error("generate", "--top-p must be in (0, 1]");
    if (parse_double(seed_s, 0, 9007199254740992.0, &seed) || seed != (double)(uint64_t)seed)
        return usage_error("generate", "--seed must be a non-negative integer");
    int32_t *ids = NULL, P = 0, *stop_ids = NULL, n_stop = 0;
    if (parse_id_list(prompt, &ids, &P) || P == 0) {
        free(ids);
        return usage_error("generate", "--prompt-ids must be non-empty comma-separated non-negative integers");
    }
    if (stop_s && parse_id_list(stop_s, &stop_ids, &n_stop)) {
        free(ids);
        return usage_error("generate", "--stop-ids must be comma-separated non-negative integers");
    }
    int threads = 1;
    if (parse_threads("generate", threads_s, &threads) != CLI_EXIT_OK) {
        free(ids), free(stop_ids);
        return CLI_EXIT_USAGE;
    }
    dsarl_error err = {0};
    model_session s;
    int rc = session_open(&s, dir, threads, &target, "generate", &err);
    if (rc == 0)
        rc = check_positions(s.core.model_dir, "--prompt-ids", P, &err);
    const dsarl_ops_common *gen_c = NULL;
    const dsarl_generation_ops *gen_ops = NULL;
    dsarl_generator *gen = NULL;
    if (rc == 0)
        rc = dsarl_registry_require(s.registry, DSARL_KIND_GENERATION, "native", "dsarl generate", &gen_c, &err);
    if (rc == 0) {
        gen_ops = (const dsarl_generation_ops *)gen_c;
        rc = gen_ops->create(NULL, s.model_ops, s.model, &gen, &err);
    }
    dsarl_generation_result res = {0};
    if (rc == 0) {
        int32_t cu[2] = {0, P};
        dsarl_token_batch batch = {.struct_size = sizeof(batch), .n_tokens = P, .n_sequences = 1, .tokens = ids,
                                   .cu_seqlens = cu};
        dsarl_sampling_params sp = {.struct_size = sizeof(sp), .temperature = (float)temperature,
                                    .top_p = (float)top_p, .top_k = (int32_t)top_k,
                                    .max_new_tokens = (int32_t)max_new, .stop_token_ids = stop_ids,
                                    .n_stop_token_ids = n_stop, .seed = (uint64_t)seed};
        rc = gen_ops->generate(gen, &batch, &sp, &res, &err);
    }
    if (rc == 0) {
        int32_t n = res.cu_lengths[1];
        fputs(want_logprobs ? "{\"tokens\": [" : "[", stdout);
        for (int32_t i = 0; i < n; i++)
            printf("%s%d", i ? ", " : "", res.tokens[i]);
        if (want_logprobs) {
            printf("], \"logprobs\": [");
            for (int32_t i = 0; i < n; i++)
                printf("%s%.9g", i ? ", " : "", (double)res.logprobs[i]);
            printf("], \"truncated\": %s}", res.truncated[0] ? "true" : "false");
        } else {
            printf("]");
        }
        printf("\n");
    }
    if (gen)
        gen_ops->destroy(gen);
    session_close(&s);
    free(ids), free(stop_ids);
    return rc < 0 ? cli_fail(&err) : CLI_EXIT_OK;
}
