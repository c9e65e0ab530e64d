/* check_selection.c: how the core fills the choices a recipe leaves open, with no name of a family, device or
 * backend in the core: the model table whose accepts scores the checkpoint highest (glm5's: IndexShare in
 * config.json, else the hub id's name), the highest-ranked model when neither key is set, the highest-ranked device
 * whose available probe passes, and the highest-ranked DSA backend whose device_requires the device meets. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cpu_device.h"
#include "dsa_reference.h"
#include "glm5_ops.h"
#include "recipe_internal.h"
#include "selection.h"

// A GPU-like device that ranks above cpu but cannot run here, and a backend for it ranked above reference.
static bool never_available(char *why, size_t why_size)
{
    snprintf(why, why_size, "no such device in this test");
    return false;
}
static dsarl_device_ops gpu_like;
static dsarl_dsa_ops gpu_backend;
static bool gpu_available;
static bool probe_gpu(char *why, size_t why_size)
{
    return gpu_available || never_available(why, why_size);
}

static dsarl_registry *reg;
static dsarl_error err;
static char dir[256];

static void setup(void)
{
    ck_assert_int_eq(dsarl_registry_create(&reg, &err), 0);
    const dsarl_host *host = dsarl_registry_host(reg);
    gpu_like = dsarl_cpu_device_ops;
    gpu_like.common.name = "gpu-like";
    gpu_like.common.rank = DSARL_RANK_PRIMARY;
    gpu_like.capabilities = DSARL_DEVICE_CAP_CUDA | DSARL_DEVICE_CAP_LAUNCH_BOUND;
    gpu_like.available = probe_gpu;
    gpu_backend = dsarl_dsa_reference_ops;
    gpu_backend.common.name = "gpu-kernels";
    gpu_backend.common.rank = DSARL_RANK_PRIMARY;
    gpu_backend.device_requires = DSARL_DEVICE_CAP_CUDA;
    gpu_available = false;
    const dsarl_ops_common *tables[] = {&glm5_1_model_ops.common, &glm5_2_model_ops.common,
                                        &dsarl_cpu_device_ops.common, &gpu_like.common,
                                        &dsarl_dsa_reference_ops.common, &gpu_backend.common};
    dsarl_kind kinds[] = {DSARL_KIND_MODEL, DSARL_KIND_MODEL, DSARL_KIND_DEVICE, DSARL_KIND_DEVICE, DSARL_KIND_DSA,
                          DSARL_KIND_DSA};
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
        ck_assert_msg(host->register_ops(host, kinds[i], tables[i], &err) == 0, "%s", err.message);
    snprintf(dir, sizeof dir, "/tmp/check_selection.%d", (int)getpid());
    mkdir(dir, 0700);
}

static void teardown(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
    dsarl_registry_free(reg);
}

// The selection of a recipe given as YAML text.
static int select_text(const char *yaml, dsarl_selection *sel)
{
    dsarl_recipe *recipe;
    ck_assert_int_eq(dsarl_recipe_load_string(yaml, "sel.yaml", &recipe, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(recipe, &err), 0);
    int rc = dsarl_select_plugins(dsarl_recipe_root(recipe), reg, sel, &err);
    dsarl_recipe_free(recipe);
    return rc;
}

static void write_config(const char *json)
{
    char path[300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(json, f);
    fclose(f);
}

static const char *model_for_dir(void)
{
    static dsarl_selection sel;
    char yaml[400];
    snprintf(yaml, sizeof yaml, "policy:\n  model_name: %s\n", dir);
    ck_assert_msg(select_text(yaml, &sel) == 0, "%s", err.message);
    return sel.model.name;
}

START_TEST(test_model_from_config)
{
    write_config("{\"model_type\": \"glm_moe_dsa\", \"num_hidden_layers\": 4}");
    ck_assert_str_eq(model_for_dir(), "glm5.1");
    write_config("{\"model_type\": \"glm_moe_dsa\", \"index_topk_freq\": 2}");
    ck_assert_str_eq(model_for_dir(), "glm5.2");
    write_config("{\"model_type\": \"glm_moe_dsa\", \"index_topk_freq\": 1, \"indexer_types\": [\"full\", \"shared\"]}");
    ck_assert_str_eq(model_for_dir(), "glm5.2");
    write_config("{\"model_type\": \"glm_moe_dsa\", \"index_topk_pattern\": \"FSS\"}");
    ck_assert_str_eq(model_for_dir(), "glm5.2");
    write_config("{\"model_type\": \"llama\"}"); // no table accepts another architecture
    ck_assert_str_eq(model_for_dir(), "(none)");
    write_config("{not json");
    dsarl_selection sel;
    char yaml[400];
    snprintf(yaml, sizeof yaml, "policy:\n  model_name: %s\n", dir);
    ck_assert_int_lt(select_text(yaml, &sel), 0);
    ck_assert_ptr_nonnull(strstr(err.message, "config.json"));
}
END_TEST

START_TEST(test_model_from_hub_name_and_rank)
{
    dsarl_selection sel;
    ck_assert_int_eq(select_text("policy:\n  model_name: zai-org/GLM-5.1-FP8\n", &sel), 0);
    ck_assert_str_eq(sel.model.name, "glm5.1");
    ck_assert_int_eq(select_text("policy:\n  model_name: zai-org/GLM-5.2\n", &sel), 0);
    ck_assert_str_eq(sel.model.name, "glm5.2");
    ck_assert_int_eq(select_text("policy:\n  model_family: glm5.1\n  model_name: zai-org/GLM-5.2\n", &sel), 0);
    ck_assert_str_eq(sel.model.name, "glm5.1"); // the family by name wins
    ck_assert_int_eq(select_text("grpo: {}\n", &sel), 0);
    ck_assert_str_eq(sel.model.name, "glm5.2"); // neither key: the highest-ranked (PRIMARY above SECONDARY)
}
END_TEST

START_TEST(test_device_and_backend_by_rank)
{
    dsarl_selection sel;
    ck_assert_int_eq(select_text("grpo: {}\n", &sel), 0);
    ck_assert_str_eq(sel.device.name, "cpu"); // gpu-like ranks higher but its probe says no
    ck_assert_str_eq(sel.dsa.name, "reference"); // gpu-kernels ranks higher but needs CUDA memory
    gpu_available = true;
    ck_assert_int_eq(select_text("runtime:\n  device: auto\n", &sel), 0);
    ck_assert_str_eq(sel.device.name, "gpu-like");
    ck_assert_str_eq(sel.dsa.name, "gpu-kernels"); // reference needs host memory: not on this device
    ck_assert_int_eq(select_text("runtime:\n  device: cpu\n", &sel), 0);
    ck_assert_str_eq(sel.device.name, "cpu");
    ck_assert_str_eq(sel.dsa.name, "reference");
}
END_TEST

static Suite *selection_suite(void)
{
    Suite *s = suite_create("selection");
    TCase *tc = tcase_create("selection");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_model_from_config);
    tcase_add_test(tc, test_model_from_hub_name_and_rank);
    tcase_add_test(tc, test_device_and_backend_by_rank);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(selection_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
