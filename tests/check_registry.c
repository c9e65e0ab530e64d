/* check_registry.c: the plugin loader: loading, lookup, search order and every refusal it must report. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsarl/ops/algorithm.h"
#include "dsarl/ops/environment.h"
#include "registry.h"

#define PLUGINS DSARL_BINARY_DIR "/tests/plugins"

static dsarl_registry *new_registry(void)
{
    dsarl_registry *reg = NULL;
    dsarl_error err;
    ck_assert_int_eq(dsarl_registry_create(&reg, &err), 0);
    return reg;
}

/* Loads path expecting a refusal whose message contains every needle; returns nothing, asserts inside. */
static void expect_refusal(const char *path, const char *needle1, const char *needle2)
{
    dsarl_registry *reg = new_registry();
    dsarl_error err;
    dsarl_error_clear(&err);
    int rc = dsarl_registry_load_file(reg, path, &err);
    ck_assert_msg(rc < 0, "%s loaded but should have been refused", path);
    ck_assert_msg(strstr(err.message, path) != NULL, "refusal does not name the file: %s", err.message);
    ck_assert_msg(strstr(err.message, needle1) != NULL, "refusal '%s' lacks '%s'", err.message, needle1);
    if (needle2)
        ck_assert_msg(strstr(err.message, needle2) != NULL, "refusal '%s' lacks '%s'", err.message, needle2);
    ck_assert_msg(strchr(err.message, '\n') == NULL, "refusal is not one line: %s", err.message);
    ck_assert_uint_eq(dsarl_registry_refusal_count(reg), 1);
    ck_assert_str_eq(dsarl_registry_refusal_at(reg, 0)->reason, err.message);
    ck_assert_uint_eq(dsarl_registry_ops_count(reg), 0);
    dsarl_registry_free(reg);
}

START_TEST(test_good_plugin_loads_and_works)
{
    dsarl_registry *reg = new_registry();
    dsarl_error err;
    ck_assert_int_eq(dsarl_registry_load_file(reg, PLUGINS "/good/dsarl-environment-testgood.so", &err), 0);
    const dsarl_ops_common *common = dsarl_registry_find(reg, DSARL_KIND_ENVIRONMENT, "testgood");
    ck_assert_ptr_nonnull(common);
    ck_assert_ptr_null(dsarl_registry_find(reg, DSARL_KIND_DSA, "testgood"));
    ck_assert_uint_eq(common->n_keys, 1);
    ck_assert_str_eq(common->keys[0].path, "env.testgood.reward_correct");
    /* The table is callable: the plugin's score really runs. */
    const dsarl_environment_ops *env = (const dsarl_environment_ops *)common;
    const char *responses[] = {"42", "41"}, *truths[] = {"42", "42"};
    float rewards[2] = {-1, -1};
    dsarl_verdict verdicts[2];
    ck_assert_int_eq(env->score(NULL, 2, responses, truths, rewards, verdicts, &err), 0);
    ck_assert_float_eq(rewards[0], 1.0f);
    ck_assert_float_eq(rewards[1], 0.0f);
    ck_assert_int_eq(verdicts[0], DSARL_VERDICT_CORRECT);
    /* The host can find it too, as a model plugin would find a device table. */
    const dsarl_host *host = dsarl_registry_host(reg);
    ck_assert_ptr_eq(host->find_ops(host, DSARL_KIND_ENVIRONMENT, "testgood"), common);
    /* Loading the same file again is a no-op, not a duplicate. */
    ck_assert_int_eq(dsarl_registry_load_file(reg, PLUGINS "/good/../good/dsarl-environment-testgood.so", &err), 0);
    ck_assert_uint_eq(dsarl_registry_ops_count(reg), 1);
    ck_assert_uint_eq(dsarl_registry_refusal_count(reg), 0);
    dsarl_registry_free(reg);
}
END_TEST

START_TEST(test_refuses_wrong_abi_major)
{
    expect_refusal(PLUGINS "/abi_major/dsarl-environment-abimajor.so", "ABI 99.", "major versions must match");
}
END_TEST

START_TEST(test_refuses_newer_abi_minor)
{
    expect_refusal(PLUGINS "/abi_minor/dsarl-environment-abiminor.so", ".99", "newer than this host");
}
END_TEST

START_TEST(test_refuses_build_signature)
{
    expect_refusal(PLUGINS "/build_sig/dsarl-environment-buildsig.so", "build signature 'abi=1;ptr=32",
                   DSARL_BUILD_SIG);
}
END_TEST

START_TEST(test_refuses_small_descriptor)
{
    expect_refusal(PLUGINS "/small_desc/dsarl-environment-smalldesc.so", "descriptor is 16 bytes", NULL);
}
END_TEST

START_TEST(test_refuses_small_ops_table)
{
    expect_refusal(PLUGINS "/small_ops/dsarl-environment-smallops.so", "ops table is 8 bytes", "smaller than");
}
END_TEST

START_TEST(test_refuses_failing_init)
{
    expect_refusal(PLUGINS "/init_fails/dsarl-environment-initfails.so", "plugin init failed",
                   "no device of the kind");
}
END_TEST

START_TEST(test_refuses_missing_descriptor)
{
    expect_refusal(PLUGINS "/no_desc/dsarl-environment-nodesc.so", "missing the descriptor symbol",
                   DSARL_PLUGIN_SYMBOL);
}
END_TEST

START_TEST(test_refuses_non_elf)
{
    char dir[] = "/tmp/dsarl-registry-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/dsarl-dsa-bogus.so", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("this is not an ELF file\n", f);
    fclose(f);
    expect_refusal(path, "not a loadable shared object", NULL);
    /* Scanning the directory records the same refusal without failing the scan. */
    dsarl_registry *reg = new_registry();
    dsarl_error err;
    ck_assert_int_eq(dsarl_registry_add_search_path(reg, dir, "--plugin-path", &err), 0);
    ck_assert_int_eq(dsarl_registry_load_all(reg, &err), 0);
    ck_assert_uint_eq(dsarl_registry_refusal_count(reg), 1);
    dsarl_registry_free(reg);
    unlink(path);
    rmdir(dir);
}
END_TEST

START_TEST(test_refuses_missing_file)
{
    expect_refusal("/nonexistent/dsarl-dsa-x.so", "no such file", NULL);
}
END_TEST

START_TEST(test_duplicate_names_both_files)
{
    dsarl_registry *reg = new_registry();
    dsarl_error err;
    ck_assert_int_eq(dsarl_registry_add_search_path(reg, PLUGINS "/good:" PLUGINS "/good2", "--plugin-path", &err),
                     0);
    ck_assert_int_eq(dsarl_registry_load_all(reg, &err), 0);
    ck_assert_uint_eq(dsarl_registry_ops_count(reg), 1);
    ck_assert_uint_eq(dsarl_registry_refusal_count(reg), 1);
    const dsarl_refusal *r = dsarl_registry_refusal_at(reg, 0);
    ck_assert_msg(strstr(r->reason, "good2/dsarl-environment-testgood2.so") != NULL, "%s", r->reason);
    ck_assert_msg(strstr(r->reason, "good/dsarl-environment-testgood.so") != NULL, "%s", r->reason);
    ck_assert_msg(strstr(r->reason, "duplicate environment plugin 'testgood'") != NULL, "%s", r->reason);
    /* The first one found (search order) stays registered and comes from the first directory. */
    const dsarl_ops_entry *e = dsarl_registry_ops_at(reg, 0);
    ck_assert_msg(strstr(e->plugin->path, "/good/") != NULL, "%s", e->plugin->path);
    dsarl_registry_free(reg);
}
END_TEST

START_TEST(test_require_lists_available_names)
{
    dsarl_registry *reg = new_registry();
    dsarl_error err;
    ck_assert_int_eq(dsarl_registry_load_file(reg, PLUGINS "/good/dsarl-environment-testgood.so", &err), 0);
    const dsarl_ops_common *ops = NULL;
    ck_assert_int_eq(dsarl_registry_require(reg, DSARL_KIND_ENVIRONMENT, "testgood", "data.env_name", &ops, &err),
                     0);
    ck_assert_ptr_nonnull(ops);
    int rc = dsarl_registry_require(reg, DSARL_KIND_ENVIRONMENT, "mathx", "recipe.yaml:3:12 data.env_name", &ops,
                                    &err);
    ck_assert_int_eq(rc, DSARL_E_NOT_FOUND);
    ck_assert_str_eq(err.message,
                     "recipe.yaml:3:12 data.env_name: no environment plugin named 'mathx'; available: testgood");
    /* When the file that would provide it was refused, the reason is given. */
    dsarl_registry_load_file(reg, PLUGINS "/init_fails/dsarl-environment-initfails.so", NULL);
    rc = dsarl_registry_require(reg, DSARL_KIND_ENVIRONMENT, "initfails", "env", &ops, &err);
    ck_assert_int_eq(rc, DSARL_E_NOT_FOUND);
    ck_assert_msg(strstr(err.message, "was refused") && strstr(err.message, "plugin init failed"), "%s",
                  err.message);
    dsarl_registry_free(reg);
}
END_TEST

START_TEST(test_default_path_is_beside_libdsarl)
{
    dsarl_registry *reg = new_registry();
    dsarl_error err;
    setenv("DSARL_PLUGIN_PATH", "/first/a:/first/b", 1);
    ck_assert_int_eq(dsarl_registry_add_search_path(reg, "/cli/dir", "--plugin-path", &err), 0);
    ck_assert_int_eq(dsarl_registry_add_default_paths(reg, &err), 0);
    unsetenv("DSARL_PLUGIN_PATH");
    ck_assert_uint_eq(dsarl_registry_search_dir_count(reg), 4);
    const char *source = NULL;
    ck_assert_str_eq(dsarl_registry_search_dir_at(reg, 0, &source), "/cli/dir");
    ck_assert_str_eq(source, "--plugin-path");
    ck_assert_str_eq(dsarl_registry_search_dir_at(reg, 1, &source), "/first/a");
    ck_assert_str_eq(source, "DSARL_PLUGIN_PATH");
    const char *last = dsarl_registry_search_dir_at(reg, 3, &source);
    ck_assert_str_eq(source, "beside libdsarl");
    char expected[4096];
    ck_assert_ptr_nonnull(realpath(DSARL_BINARY_DIR "/lib", expected));
    strcat(expected, "/dsarl/plugins");
    ck_assert_str_eq(last, expected);
    dsarl_registry_free(reg);
}
END_TEST

START_TEST(test_kind_names_round_trip)
{
    for (int k = 0; k < DSARL_KIND_COUNT; k++) {
        dsarl_kind parsed;
        ck_assert_int_eq(dsarl_kind_parse(dsarl_kind_name((dsarl_kind)k), &parsed), 0);
        ck_assert_int_eq(parsed, k);
    }
    dsarl_kind parsed;
    ck_assert_int_eq(dsarl_kind_parse("attention", &parsed), -1);
    ck_assert_ptr_null(dsarl_kind_name(DSARL_KIND_COUNT));
}
END_TEST

/* ---- Mandatory slots, per kind. The lists below are this test's own reading of the headers' "mandatory" marks,
 * independent of the loader's table. */

static void never_called(void) {}

/* A table of kind with every pointer-sized word after the head set to a function (never called). */
typedef union any_ops {
    dsarl_model_ops model;
    dsarl_device_ops device;
    dsarl_dsa_ops dsa;
    dsarl_generation_ops generation;
    dsarl_algorithm_ops algorithm;
    dsarl_environment_ops environment;
} any_ops;

static void fill_table(any_ops *t, dsarl_kind kind, size_t size)
{
    void (*fn)(void) = never_called;
    for (size_t off = sizeof(dsarl_ops_common); off + sizeof fn <= size; off += sizeof fn)
        memcpy((char *)t + off, &fn, sizeof fn);
    dsarl_ops_common head = {.struct_size = (uint32_t)size, .kind = kind, .name = "full", .description = ""};
    memcpy(t, &head, sizeof head);
}

typedef struct mandatory_slot {
    const char *name;
    size_t offset;
} mandatory_slot;

#define SLOT(T, f) {#f, offsetof(T, f)}
static const mandatory_slot model_slots[] = {
    SLOT(dsarl_model_ops, create), SLOT(dsarl_model_ops, destroy), SLOT(dsarl_model_ops, parameter_count),
    SLOT(dsarl_model_ops, vocab_size), SLOT(dsarl_model_ops, forward_logits), SLOT(dsarl_model_ops, save),
    SLOT(dsarl_model_ops, forward_logprobs), SLOT(dsarl_model_ops, backward), SLOT(dsarl_model_ops, zero_grad),
    SLOT(dsarl_model_ops, parameter_tensors), SLOT(dsarl_model_ops, parameter_info),
    SLOT(dsarl_model_ops, read_parameter), SLOT(dsarl_model_ops, write_parameter), SLOT(dsarl_model_ops, grad_norm),
    SLOT(dsarl_model_ops, optimizer_step), SLOT(dsarl_model_ops, optimizer_steps),
    SLOT(dsarl_model_ops, optimizer_save), SLOT(dsarl_model_ops, optimizer_load), SLOT(dsarl_model_ops, load_weights),
};
static const mandatory_slot device_slots[] = {
    SLOT(dsarl_device_ops, create), SLOT(dsarl_device_ops, destroy), SLOT(dsarl_device_ops, alloc),
    SLOT(dsarl_device_ops, free), SLOT(dsarl_device_ops, copy), SLOT(dsarl_device_ops, synchronize),
    SLOT(dsarl_device_ops, gemm), SLOT(dsarl_device_ops, rope_forward), SLOT(dsarl_device_ops, adamw_update),
    SLOT(dsarl_device_ops, sample_tokens), SLOT(dsarl_device_ops, gemm_f32out), SLOT(dsarl_device_ops, convert),
};
static const mandatory_slot dsa_slots[] = {
    SLOT(dsarl_dsa_ops, create), SLOT(dsarl_dsa_ops, destroy), SLOT(dsarl_dsa_ops, indexer_topk),
    SLOT(dsarl_dsa_ops, sparse_mla_forward), SLOT(dsarl_dsa_ops, sparse_mla_backward),
    SLOT(dsarl_dsa_ops, indexer_loss_forward), SLOT(dsarl_dsa_ops, indexer_loss_backward),
};
static const mandatory_slot generation_slots[] = {
    SLOT(dsarl_generation_ops, create), SLOT(dsarl_generation_ops, destroy), SLOT(dsarl_generation_ops, generate),
};
static const mandatory_slot algorithm_slots[] = {SLOT(dsarl_algorithm_ops, run)};
static const mandatory_slot environment_slots[] = {
    SLOT(dsarl_environment_ops, create), SLOT(dsarl_environment_ops, destroy), SLOT(dsarl_environment_ops, score),
};
/* Optional slots: NULL must be accepted. */
static const mandatory_slot optional_slots[] = {
    SLOT(dsarl_model_ops, cache_create), SLOT(dsarl_model_ops, accepts), SLOT(dsarl_model_ops, train_forward),
    SLOT(dsarl_device_ops, stream), SLOT(dsarl_dsa_ops, preferred_form),
    SLOT(dsarl_dsa_ops, headwise_attention_forward),
};
static const dsarl_kind optional_kinds[] = {DSARL_KIND_MODEL, DSARL_KIND_MODEL, DSARL_KIND_MODEL, DSARL_KIND_DEVICE,
                                            DSARL_KIND_DSA, DSARL_KIND_DSA};
#undef SLOT

static const size_t kind_sizes[DSARL_KIND_COUNT] = {sizeof(dsarl_model_ops), sizeof(dsarl_device_ops),
                                                    sizeof(dsarl_dsa_ops), sizeof(dsarl_generation_ops),
                                                    sizeof(dsarl_algorithm_ops), sizeof(dsarl_environment_ops)};

/* Registering a full table works; with any one mandatory slot NULL it fails in one line naming kind and slot. */
static void check_kind(dsarl_kind kind, const mandatory_slot *slots, size_t n)
{
    any_ops t;
    dsarl_registry *reg = new_registry();
    const dsarl_host *host = dsarl_registry_host(reg);
    dsarl_error err;
    fill_table(&t, kind, kind_sizes[kind]);
    ck_assert_msg(host->register_ops(host, kind, (const dsarl_ops_common *)&t, &err) == 0, "full %s table refused: %s",
                  dsarl_kind_name(kind), err.message);
    dsarl_registry_free(reg);
    for (size_t i = 0; i < n; i++) {
        reg = new_registry();
        host = dsarl_registry_host(reg);
        fill_table(&t, kind, kind_sizes[kind]);
        memset((char *)&t + slots[i].offset, 0, sizeof(void (*)(void)));
        dsarl_error_clear(&err);
        ck_assert_msg(host->register_ops(host, kind, (const dsarl_ops_common *)&t, &err) < 0,
                      "%s table with NULL %s was accepted", dsarl_kind_name(kind), slots[i].name);
        char quoted[80];
        snprintf(quoted, sizeof quoted, "'%s'", slots[i].name);
        ck_assert_msg(strstr(err.message, quoted) && strstr(err.message, dsarl_kind_name(kind)) &&
                          strstr(err.message, "'full'") && !strchr(err.message, '\n'),
                      "refusal of NULL %s: %s", slots[i].name, err.message);
        ck_assert_uint_eq(dsarl_registry_ops_count(reg), 0);
        dsarl_registry_free(reg);
    }
}

START_TEST(test_mandatory_slots_every_kind)
{
    check_kind(DSARL_KIND_MODEL, model_slots, DSARL_ARRAY_LEN(model_slots));
    check_kind(DSARL_KIND_DEVICE, device_slots, DSARL_ARRAY_LEN(device_slots));
    check_kind(DSARL_KIND_DSA, dsa_slots, DSARL_ARRAY_LEN(dsa_slots));
    check_kind(DSARL_KIND_GENERATION, generation_slots, DSARL_ARRAY_LEN(generation_slots));
    check_kind(DSARL_KIND_ALGORITHM, algorithm_slots, DSARL_ARRAY_LEN(algorithm_slots));
    check_kind(DSARL_KIND_ENVIRONMENT, environment_slots, DSARL_ARRAY_LEN(environment_slots));
}
END_TEST

START_TEST(test_optional_slots_may_be_null)
{
    for (size_t i = 0; i < DSARL_ARRAY_LEN(optional_slots); i++) {
        any_ops t;
        char why[256];
        fill_table(&t, optional_kinds[i], kind_sizes[optional_kinds[i]]);
        memset((char *)&t + optional_slots[i].offset, 0, sizeof(void (*)(void)));
        ck_assert_msg(dsarl_registry_check_slots(optional_kinds[i], (const dsarl_ops_common *)&t, DSARL_ABI_MINOR, why,
                                                 sizeof why) == 0,
                      "optional %s NULL refused: %s", optional_slots[i].name, why);
    }
}
END_TEST

/* The size a table must have follows the minor its plugin was built for, and slots the host calls unconditionally
 * refuse an older plugin that lacks them. */
START_TEST(test_minimum_size_and_needs_per_minor)
{
    any_ops t;
    char why[256];
    /* A 1.0 DSA table ends before preferred_form: fine from a 1.0 plugin, too small from a 1.1 or 1.2 one. */
    size_t dsa_10 = offsetof(dsarl_dsa_ops, preferred_form);
    ck_assert_uint_eq(dsarl_registry_minimum_ops_size(DSARL_KIND_DSA, 0), dsa_10);
    ck_assert_uint_eq(dsarl_registry_minimum_ops_size(DSARL_KIND_DSA, 1),
                      offsetof(dsarl_dsa_ops, routes) + sizeof(const char *));
    ck_assert_uint_eq(dsarl_registry_minimum_ops_size(DSARL_KIND_DSA, 2),
                      offsetof(dsarl_dsa_ops, device_requires) + sizeof(uint64_t));
    fill_table(&t, DSARL_KIND_DSA, dsa_10);
    ck_assert_int_eq(dsarl_registry_check_slots(DSARL_KIND_DSA, &t.dsa.common, 0, why, sizeof why), 0);
    ck_assert_int_eq(dsarl_registry_check_slots(DSARL_KIND_DSA, &t.dsa.common, 1, why, sizeof why), -1);
    ck_assert_msg(strstr(why, "ABI 1.1"), "%s", why);
    /* A 1.0 device plugin: its table has the same size (1.1 used reserved space), convert reads as NULL. */
    fill_table(&t, DSARL_KIND_DEVICE, sizeof(dsarl_device_ops));
    t.device.convert = NULL;
    ck_assert_int_eq(dsarl_registry_check_slots(DSARL_KIND_DEVICE, &t.device.common, 0, why, sizeof why), -1);
    ck_assert_msg(strstr(why, "'convert'") && strstr(why, "added in ABI 1.1"), "%s", why);
    /* A 1.0 model without the 1.2 training pass is still accepted (the core checks DSARL_MODEL_HAS). */
    fill_table(&t, DSARL_KIND_MODEL, sizeof(dsarl_model_ops));
    t.model.train_forward = NULL;
    t.model.train_backward = NULL;
    ck_assert_int_eq(dsarl_registry_check_slots(DSARL_KIND_MODEL, &t.model.common, 0, why, sizeof why), 0);
}
END_TEST

static Suite *registry_suite(void)
{
    Suite *s = suite_create("registry");
    TCase *tc = tcase_create("loader");
    tcase_add_test(tc, test_good_plugin_loads_and_works);
    tcase_add_test(tc, test_refuses_wrong_abi_major);
    tcase_add_test(tc, test_refuses_newer_abi_minor);
    tcase_add_test(tc, test_refuses_build_signature);
    tcase_add_test(tc, test_refuses_small_descriptor);
    tcase_add_test(tc, test_refuses_small_ops_table);
    tcase_add_test(tc, test_refuses_failing_init);
    tcase_add_test(tc, test_refuses_missing_descriptor);
    tcase_add_test(tc, test_refuses_non_elf);
    tcase_add_test(tc, test_refuses_missing_file);
    tcase_add_test(tc, test_duplicate_names_both_files);
    tcase_add_test(tc, test_require_lists_available_names);
    tcase_add_test(tc, test_default_path_is_beside_libdsarl);
    tcase_add_test(tc, test_kind_names_round_trip);
    tcase_add_test(tc, test_mandatory_slots_every_kind);
    tcase_add_test(tc, test_optional_slots_may_be_null);
    tcase_add_test(tc, test_minimum_size_and_needs_per_minor);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(registry_suite());
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
