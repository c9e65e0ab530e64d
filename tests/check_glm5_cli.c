/* check_glm5_cli.c: `dsarl logits` and `dsarl generate` end to end (the built binary and plugins) on the
 * transformers fixtures: the .npy logits within max relative error 1e-4 and the greedy tokens identical; usage and
 * bad-directory errors exit with the documented statuses. */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "dsarl/json.h"
#include "dsarl/npy.h"

#define DSARL_BIN DSARL_BINARY_DIR "/bin/dsarl"
#define FIXTURES DSARL_SOURCE_DIR "/tests/fixtures/glm5/"

static int run(const char *cmd, char *out, size_t size)
{
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static float *read_npy(const char *path, long *count, char *header_out, size_t header_size)
{
    dsarl_tensor t;
    dsarl_error err;
    ck_assert_msg(dsarl_npy_read(path, &t, &err) == 0, "%s", err.message);
    ck_assert_int_eq(t.dtype, DSARL_DTYPE_F32);
    dsarl_tensor_shape_str(&t, header_out, header_size);
    *count = (long)dsarl_tensor_numel(&t);
    return t.data;
}

// env: a prefix for the commands ("" or "HF_HUB_CACHE=... "); model: what --model-dir gets (NULL = the fixture);
// extra: more arguments for both commands (--device ...); tol: the logits' max relative error; tokens: whether the
// greedy tokens must equal transformers' (a bf16 run may flip a near tie of the random tiny model)
static void check_fixture_with(const char *name, const char *env, const char *model, const char *extra, double tol,
                               bool tokens)
{
    char fixture_dir[512];
    snprintf(fixture_dir, sizeof fixture_dir, FIXTURES "%s", name);
    if (!model)
        model = fixture_dir;
    char cmd[2048], out[4096], header[256], path[512], prompt[512] = "", want_tokens[512] = "[";
    dsarl_error err;
    json_t *g = NULL;
    snprintf(path, sizeof path, FIXTURES "%s/generate.json", name);
    ck_assert_int_eq(dsarl_json_load_file(path, &g, &err), 0);
    for (size_t i = 0; i < json_array_size(json_object_get(g, "prompt")); i++)
        snprintf(prompt + strlen(prompt), sizeof prompt - strlen(prompt), "%s%lld", i ? "," : "",
                 (long long)json_integer_value(json_array_get(json_object_get(g, "prompt"), i)));
    for (size_t i = 0; i < json_array_size(json_object_get(g, "tokens")); i++)
        snprintf(want_tokens + strlen(want_tokens), sizeof want_tokens - strlen(want_tokens), "%s%lld",
                 i ? ", " : "", (long long)json_integer_value(json_array_get(json_object_get(g, "tokens"), i)));
    strcat(want_tokens, "]");
    json_decref(g);
    snprintf(path, sizeof path, "/tmp/check_glm5_cli_%d_%s.npy", (int)getpid(), name);
    snprintf(cmd, sizeof cmd, "%s'%s' logits --model-dir '%s' --input-ids '" FIXTURES
             "%s/input_ids.json' --out '%s' %s 2>&1", env, DSARL_BIN, model, name, path, extra);
    ck_assert_msg(run(cmd, out, sizeof out) == 0, "%s", out);
    long n = 0, nref = 0;
    float *got = read_npy(path, &n, header, sizeof header);
    ck_assert_msg(strcmp(header, "[2, 12, 128]") == 0, "%s", header);
    snprintf(cmd, sizeof cmd, FIXTURES "%s/logits.npy", name);
    float *ref = read_npy(cmd, &nref, header, sizeof header);
    ck_assert_int_eq(n, nref);
    double mx = 0, me = 0;
    for (long i = 0; i < n; i++)
        mx = fmax(mx, fabs(ref[i])), me = fmax(me, fabs((double)got[i] - ref[i]));
    ck_assert_msg(me / mx < tol, "%s %s: max relative error %g", name, extra, me / mx);
    remove(path);
    free(got), free(ref);
    snprintf(cmd, sizeof cmd, "%s'%s' generate --model-dir '%s' --prompt-ids %s --max-new-tokens 7 "
             "--greedy %s 2>&1", env, DSARL_BIN, model, prompt, extra);
    ck_assert_msg(run(cmd, out, sizeof out) == 0, "%s", out);
    // the ids are one line of stdout; stderr's log lines (merged for the message) may come before it
    bool found = false;
    for (const char *line = out; tokens && !found && line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
        found = strncmp(line, want_tokens, strlen(want_tokens)) == 0;
    if (tokens)
        ck_assert_msg(found, "%s %s: got %s want a line %s", name, extra, out, want_tokens);
}

#ifndef DSARL_TEST_CUDA
static void check_fixture_as(const char *name, const char *env, const char *model)
{
    check_fixture_with(name, env, model, "", 1e-4, true);
}

static void check_fixture(const char *name) { check_fixture_as(name, "", NULL); }

START_TEST(test_glm51) { check_fixture("glm5.1-tiny"); }
END_TEST
START_TEST(test_glm52) { check_fixture("glm5.2-tiny"); }
END_TEST
START_TEST(test_groups) { check_fixture("glm5-groups-bf16"); }
END_TEST

/* The GLM-5.2 fixture as the Hugging Face tools lay out a download (snapshot files linking into blobs/, refs/main
 * naming the snapshot) gives the same logits and tokens by hub id; a hub id that is not there is one line naming
 * where it looked and how to download it. */
START_TEST(test_hub_cache)
{
    char cache[] = "/tmp/check_glm5_cli_hub_XXXXXX", cmd[4096], out[4096], env[512];
    ck_assert_ptr_nonnull(mkdtemp(cache));
    const char *commit = "5f2c0d9e1a3b4c6d7e8f90a1b2c3d4e5f6a7b8c9";
    snprintf(cmd, sizeof cmd, "set -e; r='%s/models--zai-org--GLM-5.2-tiny'; mkdir -p \"$r/blobs\" \"$r/refs\" "
             "\"$r/snapshots/%s\"; for f in config.json model.safetensors; do "
             "b=$(sha256sum '" FIXTURES "glm5.2-tiny/'$f | cut -c1-64); "
             "cp '" FIXTURES "glm5.2-tiny/'$f \"$r/blobs/$b\"; "
             "ln -s ../../blobs/$b \"$r/snapshots/%s/$f\"; done; printf %s '%s' > \"$r/refs/main\"",
             cache, commit, commit, "%s", commit);
    ck_assert_msg(system(cmd) == 0, "%s", cmd);
    snprintf(env, sizeof env, "HF_HUB_CACHE='%s' ", cache);
    check_fixture_as("glm5.2-tiny", env, "zai-org/GLM-5.2-tiny");
    snprintf(cmd, sizeof cmd, "HF_HUB_CACHE='%s' '" DSARL_BIN "' generate --model-dir zai-org/GLM-5.1 --prompt-ids 1,2 "
             "--max-new-tokens 2 --greedy 2>&1", cache);
    ck_assert_int_eq(run(cmd, out, sizeof out), 3);
    ck_assert_msg(strstr(out, "models--zai-org--GLM-5.1") && strstr(out, "hf download zai-org/GLM-5.1"), "%s", out);
    // a run names the recipe key, before any training
    snprintf(cmd, sizeof cmd, "HF_HUB_CACHE='%s' '" DSARL_BIN "' run '" DSARL_SOURCE_DIR "/configs/recipes/llm/"
             "sft-glm5.2-tiny.yaml' policy.model_name=zai-org/GLM-5.9 logger.log_dir='%s/logs' "
             "checkpointing.checkpoint_dir='%s/ckpt' 2>&1", cache, cache, cache);
    ck_assert_int_eq(run(cmd, out, sizeof out), 3);
    ck_assert_msg(strstr(out, "policy.model_name 'zai-org/GLM-5.9': not in the Hugging Face cache"), "%s", out);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(test_errors)
{
    char out[4096];
    ck_assert_int_eq(run("'" DSARL_BIN "' logits --model-dir /nonexistent --input-ids x --out y 2>&1", out,
                         sizeof out), 3);
    ck_assert_ptr_nonnull(strstr(out, "x")); // the unreadable input file is named
    ck_assert_int_eq(run("'" DSARL_BIN "' logits --model-dir 2>&1", out, sizeof out), 2);
    ck_assert_int_eq(run("'" DSARL_BIN "' generate --model-dir " FIXTURES "glm5.1-tiny --prompt-ids 1,2 "
                         "--max-new-tokens 2 2>&1", out, sizeof out), 2);
    ck_assert_ptr_nonnull(strstr(out, "--greedy"));
    ck_assert_int_eq(run("'" DSARL_BIN "' generate --model-dir /nonexistent --prompt-ids 1,2 --max-new-tokens 2 "
                         "--greedy 2>&1", out, sizeof out), 3);
    ck_assert_ptr_nonnull(strstr(out, "--model-dir '/nonexistent' is missing"));
    // a file as the model directory, and thread counts outside [1, 1024], are named as such
    ck_assert_int_eq(run("'" DSARL_BIN "' generate --model-dir " FIXTURES "glm5.1-tiny/config.json --prompt-ids 1,2 "
                         "--max-new-tokens 2 --greedy 2>&1", out, sizeof out), 3);
    ck_assert_ptr_nonnull(strstr(out, "is not a directory"));
    ck_assert_int_eq(run("'" DSARL_BIN "' generate --model-dir " FIXTURES "glm5.1-tiny --prompt-ids 1,2 "
                         "--max-new-tokens 2 --greedy --threads -1 2>&1", out, sizeof out), 2);
    ck_assert_ptr_nonnull(strstr(out, "--threads needs an integer in [1, 1024], got '-1'"));
    ck_assert_int_eq(run("'" DSARL_BIN "' generate --model-dir " FIXTURES "glm5.1-tiny --prompt-ids 1,2 "
                         "--max-new-tokens 2 --greedy --threads 99999 2>&1", out, sizeof out), 2);
    // the device, backend and storage dtype by name: the cpu ones give the default run's tokens; what the machine
    // or the device does not have is one line naming the option
    char first[4096];
    ck_assert_int_eq(run("'" DSARL_BIN "' generate --model-dir " FIXTURES "glm5.2-tiny --prompt-ids 1,2,3 "
                         "--max-new-tokens 4 --greedy 2>&1", first, sizeof first), 0);
    ck_assert_int_eq(run("'" DSARL_BIN "' generate --model-dir " FIXTURES "glm5.2-tiny --prompt-ids 1,2,3 "
                         "--max-new-tokens 4 --greedy --device cpu --dsa reference --dtype f32 2>&1", out,
                         sizeof out), 0);
    ck_assert_str_eq(out, first);
    ck_assert_int_eq(run("'" DSARL_BIN "' generate --model-dir " FIXTURES "glm5.2-tiny --prompt-ids 1,2,3 "
                         "--max-new-tokens 4 --greedy --device nosuch 2>&1", out, sizeof out), 3);
    ck_assert_msg(strstr(out, "--device: no device plugin named 'nosuch'; available:"), "%s", out);
    ck_assert_int_eq(run("'" DSARL_BIN "' logits --model-dir " FIXTURES "glm5.2-tiny --input-ids x --out y "
                         "--device cpu --dtype bf16 2>&1", out, sizeof out), 3);
    ck_assert_int_eq(run("'" DSARL_BIN "' generate --model-dir " FIXTURES "glm5.2-tiny --prompt-ids 1,2,3 "
                         "--max-new-tokens 4 --greedy --device cpu --dtype bf16 2>&1", out, sizeof out), 3);
    ck_assert_msg(strstr(out, "--dtype bf16: device cpu stores f32 only"), "%s", out);
    ck_assert_int_eq(run("'" DSARL_BIN "' generate --model-dir " FIXTURES "glm5.2-tiny --prompt-ids 1,2,3 "
                         "--max-new-tokens 4 --greedy --dtype fp8 2>&1", out, sizeof out), 3);
    ck_assert_msg(strstr(out, "--dtype 'fp8': valid values are bf16 and f32"), "%s", out);
    ck_assert_int_eq(run("'" DSARL_BIN "' generate --model-dir " FIXTURES "glm5.2-tiny --prompt-ids 1,2,3 "
                         "--max-new-tokens 4 --greedy --dsa 2>&1", out, sizeof out), 2);
    ck_assert_int_eq(run("'" DSARL_BIN "' logits --help", out, sizeof out), 0);
    ck_assert_ptr_nonnull(strstr(out, "--dtype bf16|f32"));
    ck_assert_ptr_nonnull(strstr(out, "--input-ids"));
}
END_TEST

#endif

#ifdef DSARL_TEST_CUDA
/* The same fixtures on the GPU with the kernels training uses: float32 storage holds transformers' logits to 1e-3
 * and its greedy tokens; bf16 storage to 3e-2. */
static void check_cuda(const char *dsa)
{
    const char *fixtures[] = {"glm5.1-tiny", "glm5.2-tiny", "glm5-groups-bf16"};
    char extra[128];
    for (int i = 0; i < 3; i++) {
        snprintf(extra, sizeof extra, "--device cuda --dsa %s --dtype f32", dsa);
        check_fixture_with(fixtures[i], "", NULL, extra, 1e-3, true);
        snprintf(extra, sizeof extra, "--device cuda --dsa %s --dtype bf16", dsa);
        check_fixture_with(fixtures[i], "", NULL, extra, 3e-2, false);
    }
}

START_TEST(test_cuda_tilelang) { check_cuda("tilelang"); }
END_TEST
START_TEST(test_cuda_cudnn) { check_cuda("cudnn"); }
END_TEST

int main(void)
{
    if (system("nvidia-smi -L >/dev/null 2>&1") != 0) {
        printf("no GPU visible (nvidia-smi -L failed): skipped\n");
        return 77;
    }
    Suite *s = suite_create("glm5_cli_cuda");
    TCase *tc = tcase_create("cli");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_cuda_tilelang);
    tcase_add_test(tc, test_cuda_cudnn);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
#else
int main(void)
{
    Suite *s = suite_create("glm5_cli");
    TCase *tc = tcase_create("cli");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_glm51);
    tcase_add_test(tc, test_glm52);
    tcase_add_test(tc, test_groups);
    tcase_add_test(tc, test_hub_cache);
    tcase_add_test(tc, test_errors);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
#endif
