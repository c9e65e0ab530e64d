/* check_schema.c: recipe validation against declared plugin keys: defaults, types, owned sections with
 * "did you mean", unused keys, and the collect-everything mode of `dsarl config show`. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "schema.h"

// NeMo RL's own GLM recipes, vendored unchanged (tests/fixtures/nemo_rl/README.md).
#define NEMO_LLM DSARL_SOURCE_DIR "/tests/fixtures/nemo_rl/examples/configs/recipes/llm"

static unsigned test_seed;

static const dsarl_key_spec grpo_keys[] = {
    {"grpo", DSARL_KEY_MAP, NULL, "GRPO settings", DSARL_KEY_OWNED},
    {"grpo.num_prompts_per_step", DSARL_KEY_INT, "32", "prompts per step", 0},
    {"grpo.normalize_rewards", DSARL_KEY_BOOL, "true", "divide advantages by the group std", 0},
    {"grpo.advantage_clip_low", DSARL_KEY_FLOAT, "null", "lower advantage clip", DSARL_KEY_NULLABLE},
    {"grpo.ratio", DSARL_KEY_FLOAT, "0.2", "clip ratio", 0},
    {"grpo.reward_shaping.enabled", DSARL_KEY_BOOL, "false", "DAPO overlong shaping", 0},
    {"grpo.async_grpo", DSARL_KEY_MAP, NULL, "NeMo RL async mode", DSARL_KEY_IGNORED},
    {"grpo.extra", DSARL_KEY_MAP, "{}", "passed through whole", 0},
    {"grpo.val_prompts", DSARL_KEY_INT, "${mul:${.num_prompts_per_step}, 2}", "validation prompts", 0},
};

static const dsarl_key_spec env_keys[] = {
    {"env.*.num_workers", DSARL_KEY_INT, "8", "verifier processes", 0},
    {"env.*.math_verify_impl", DSARL_KEY_STRING, NULL, "verifier", 0},
};

static const dsarl_schema_table tables[] = {
    {"algorithm/grpo", grpo_keys, DSARL_ARRAY_LEN(grpo_keys)},
    {"environment/math", env_keys, DSARL_ARRAY_LEN(env_keys)},
};

static dsarl_recipe *load_ok(const char *yaml)
{
    dsarl_recipe *r = NULL;
    dsarl_error err = {0};
    int rc = dsarl_recipe_load_string(yaml, "t.yaml", &r, &err);
    ck_assert_msg(rc == DSARL_OK, "load failed: %s", err.message);
    return r;
}

static const dsarl_node *at(const dsarl_recipe *r, const char *path)
{
    const dsarl_node *n = dsarl_node_get(dsarl_recipe_root(r), path);
    ck_assert_msg(n != NULL, "missing key %s", path);
    return n;
}

/* Validates yaml expecting failure; returns the message (static). */
static const char *validate_fails(const char *yaml)
{
    static dsarl_error err;
    dsarl_error_clear(&err);
    dsarl_recipe *r = load_ok(yaml);
    int rc = dsarl_schema_validate(r, tables, DSARL_ARRAY_LEN(tables), NULL, &err);
    ck_assert_msg(rc == DSARL_E_INVALID, "validation should fail for:\n%s", yaml);
    dsarl_recipe_free(r);
    return err.message;
}

static void validate_ok(const char *yaml)
{
    dsarl_error err = {0};
    dsarl_recipe *r = load_ok(yaml);
    int rc = dsarl_schema_validate(r, tables, DSARL_ARRAY_LEN(tables), NULL, &err);
    ck_assert_msg(rc == DSARL_OK, "validation failed: %s\n%s", err.message, yaml);
    dsarl_recipe_free(r);
}

START_TEST(test_defaults_fill_absent_keys)
{
    int prompts = (int)(rand_r(&test_seed) % 1000) + 1, workers = (int)(rand_r(&test_seed) % 64) + 1;
    char yaml[256];
    snprintf(yaml, sizeof yaml, "grpo:\n  num_prompts_per_step: %d\nenv:\n  math: {}\n  code: {num_workers: %d}\n",
             prompts, workers);
    dsarl_recipe *r = load_ok(yaml);
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_schema_validate(r, tables, DSARL_ARRAY_LEN(tables), NULL, &err), 0);
    // Present values stay, with their file origin.
    ck_assert_int_eq(dsarl_node_as_int(at(r, "grpo.num_prompts_per_step")), prompts);
    ck_assert_int_eq(dsarl_node_origin(at(r, "grpo.num_prompts_per_step"))->kind, DSARL_ORIGIN_FILE);
    ck_assert_int_eq(dsarl_node_as_int(at(r, "env.code.num_workers")), workers);
    // Absent ones get the declared default, typed, and say whose default it is.
    const dsarl_node *n = at(r, "grpo.normalize_rewards");
    ck_assert_int_eq(dsarl_node_kind(n), DSARL_NODE_BOOL);
    ck_assert(dsarl_node_as_bool(n));
    char where[128];
    ck_assert_str_eq(dsarl_node_where(n, where, sizeof where), "default of algorithm/grpo");
    ck_assert_int_eq(dsarl_node_kind(at(r, "grpo.ratio")), DSARL_NODE_FLOAT);
    ck_assert(dsarl_node_as_double(at(r, "grpo.ratio")) == 0.2);
    ck_assert_int_eq(dsarl_node_kind(at(r, "grpo.advantage_clip_low")), DSARL_NODE_NULL);
    ck_assert(!dsarl_node_as_bool(at(r, "grpo.reward_shaping.enabled"))); // intermediate map created
    ck_assert_int_eq(dsarl_node_kind(at(r, "grpo.reward_shaping.enabled")), DSARL_NODE_BOOL);
    ck_assert_int_eq(dsarl_node_kind(at(r, "grpo.extra")), DSARL_NODE_MAP);
    ck_assert_int_eq(dsarl_node_as_int(at(r, "grpo.val_prompts")), 2 * prompts); // a default may interpolate
    // Wildcards: a default under every existing env.<name>, and none invented for absent names.
    ck_assert_int_eq(dsarl_node_as_int(at(r, "env.math.num_workers")), 8);
    ck_assert_str_eq(dsarl_node_where(at(r, "env.math.num_workers"), where, sizeof where),
                     "default of environment/math");
    ck_assert_uint_eq(dsarl_node_count(at(r, "env")), 2);
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_type_checks)
{
    const char *m = validate_fails("grpo: {num_prompts_per_step: '32'}\n");
    ck_assert_str_eq(m, "t.yaml:1:30: recipe key 'grpo.num_prompts_per_step' must be a int (declared by "
                        "algorithm/grpo: prompts per step), got string '32'");
    validate_ok("grpo: {ratio: 1}\n");                 // FLOAT accepts INT
    validate_ok("grpo: {advantage_clip_low: null}\n"); // NULLABLE
    validate_ok("grpo: {advantage_clip_low: -0.5}\n");
    m = validate_fails("grpo: {ratio: null}\n");
    ck_assert_ptr_nonnull(strstr(m, "must be a number (declared"));
    ck_assert_ptr_nonnull(strstr(m, "got null"));
    m = validate_fails("grpo: {advantage_clip_low: yes}\n"); // yes is a string, not a bool, not a number
    ck_assert_ptr_nonnull(strstr(m, "must be a number or null"));
    m = validate_fails("env:\n  math:\n    num_workers: 2.5\n");
    ck_assert_ptr_nonnull(strstr(m, "t.yaml:3:18: recipe key 'env.math.num_workers' must be a int"));
    m = validate_fails("grpo: [1, 2]\n");
    ck_assert_ptr_nonnull(strstr(m, "recipe key 'grpo' must be a map"));
    // First error in recipe order wins.
    m = validate_fails("grpo:\n  normalize_rewards: 1\n  ratio: x\n");
    ck_assert_ptr_nonnull(strstr(m, "t.yaml:2:22"));
}
END_TEST

START_TEST(test_unknown_keys_in_owned_sections)
{
    const char *m = validate_fails("grpo:\n  num_prompts_per_step: 4\n  normalise_rewards: true\n");
    ck_assert_str_eq(m, "t.yaml:3:22: unknown key 'grpo.normalise_rewards' in section 'grpo' (owned by "
                        "algorithm/grpo); did you mean 'grpo.normalize_rewards'?");
    m = validate_fails("grpo:\n  reward_shaping:\n    enabeld: true\n");
    ck_assert_ptr_nonnull(strstr(m, "unknown key 'grpo.reward_shaping.enabeld'"));
    ck_assert_ptr_nonnull(strstr(m, "did you mean 'grpo.reward_shaping.enabled'?"));
    m = validate_fails("grpo:\n  something_else_entirely: 1\n");
    ck_assert_ptr_nonnull(strstr(m, "declares no such key"));
    // An owned section that declares nothing below it accepts nothing below it.
    static const dsarl_key_spec logger_keys[] = {{"logger", DSARL_KEY_MAP, "{}", "metrics", DSARL_KEY_OWNED}};
    const dsarl_schema_table logger_table = {"algorithm/sft", logger_keys, 1};
    dsarl_recipe *r = load_ok("logger:\n  wandb: true\n");
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_schema_validate(r, &logger_table, 1, NULL, &err), DSARL_E_INVALID);
    ck_assert_str_eq(err.message, "t.yaml:2:10: unknown key 'logger.wandb' in section 'logger' (owned by algorithm/sft), "
                                  "which declares no such key");
    dsarl_recipe_free(r);
    // A declared map without declared keys below it is taken whole; env is not owned, so unknown keys there pass.
    validate_ok("grpo:\n  extra: {anything: [1, 2], goes: {here: true}}\nenv:\n  math: {other: 1}\n");
}
END_TEST

START_TEST(test_unused_keys_reported)
{
    dsarl_recipe *r = load_ok("grpo:\n  async_grpo: {enabled: false}\n  num_prompts_per_step: 3\n"
                              "policy:\n  dtensor_cfg: {enabled: false}\n  model_name: x\nlogger: {wandb: true}\n");
    dsarl_schema_report report;
    dsarl_schema_report_init(&report);
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_schema_validate(r, tables, DSARL_ARRAY_LEN(tables), &report, &err), 0);
    ck_assert_uint_eq(report.n_unused, 3);
    ck_assert_str_eq(report.unused[0].path, "grpo.async_grpo");
    ck_assert_str_eq(report.unused[0].detail, "ignored by algorithm/grpo");
    ck_assert_str_eq(report.unused[0].where, "t.yaml:2:15");
    ck_assert_str_eq(report.unused[1].path, "policy"); // a whole undeclared section counts once
    ck_assert_str_eq(report.unused[1].detail, "declared by no plugin");
    ck_assert_str_eq(report.unused[2].path, "logger");
    ck_assert_uint_eq(report.n_problems, 0);
    dsarl_schema_report_free(&report);
    ck_assert_uint_eq(report.n_unused, 0);
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_check_only_collects_every_problem)
{
    dsarl_recipe *r = load_ok("grpo:\n  num_prompts_per_step: many\n  normalise_rewards: true\n"
                              "env:\n  math: {num_workers: x}\nextra_section: 1\n");
    dsarl_schema_report report;
    dsarl_schema_report_init(&report);
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_schema_check_only(r, tables, DSARL_ARRAY_LEN(tables), &report, &err), 0);
    ck_assert_uint_eq(report.n_problems, 4); // + the default that interpolates the mistyped value
    ck_assert_ptr_nonnull(strstr(report.problems[0].detail, "t.yaml:2:25: recipe key 'grpo.num_prompts_per_step'"));
    ck_assert_ptr_nonnull(strstr(report.problems[1].detail, "did you mean 'grpo.normalize_rewards'"));
    ck_assert_str_eq(report.problems[2].path, "env.math.num_workers");
    ck_assert_ptr_nonnull(strstr(report.problems[3].detail, "default of algorithm/grpo: argument 1 of 'mul'"));
    ck_assert_uint_eq(report.n_unused, 1);
    ck_assert_str_eq(report.unused[0].path, "extra_section");
    // Defaults were still applied.
    ck_assert(dsarl_node_as_double(at(r, "grpo.ratio")) == 0.2);
    dsarl_schema_report_free(&report);
    dsarl_recipe_free(r);
    // And validate on the same input stops at the first.
    ck_assert_ptr_nonnull(strstr(validate_fails("grpo:\n  num_prompts_per_step: many\n  normalise_rewards: true\n"),
                                 "num_prompts_per_step"));
}
END_TEST

START_TEST(test_bad_tables)
{
    static const dsarl_key_spec broken[] = {{"grpo..x", DSARL_KEY_INT, NULL, "bad", 0}};
    static const dsarl_key_spec bad_default[] = {{"grpo.x", DSARL_KEY_INT, "[1, ", "bad", 0}};
    const dsarl_schema_table t1 = {"algorithm/broken", broken, 1}, t2 = {"algorithm/bad", bad_default, 1};
    dsarl_recipe *r = load_ok("grpo: {}\n");
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_schema_validate(r, &t1, 1, NULL, &err), DSARL_E_INTERNAL);
    ck_assert_ptr_nonnull(strstr(err.message, "algorithm/broken"));
    ck_assert_int_lt(dsarl_schema_validate(r, &t2, 1, NULL, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.message, "default of algorithm/bad"));
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_nemo_recipe_cluster_section)
{
    static const dsarl_key_spec cluster_keys[] = {
        {"cluster", DSARL_KEY_MAP, NULL, "machines", DSARL_KEY_OWNED},
        {"cluster.gpus_per_node", DSARL_KEY_INT, "1", "GPUs per node", 0},
        {"cluster.num_nodes", DSARL_KEY_INT, "1", "nodes", 0},
        {"cluster.master_port_range_low", DSARL_KEY_INT, NULL, "ignored", DSARL_KEY_IGNORED},
        {"cluster.master_port_range_high", DSARL_KEY_INT, NULL, "ignored", DSARL_KEY_IGNORED},
        {"cluster.segment_size", DSARL_KEY_INT, "null", "NVLink domain", DSARL_KEY_NULLABLE},
        {"policy.megatron_cfg.context_parallel_size", DSARL_KEY_INT, "1", "CP", 0},
        {"policy.megatron_cfg.model_overrides.dsa_kernel_backend", DSARL_KEY_STRING, "reference", "DSA", 0},
    };
    const dsarl_schema_table table = {"model/glm5.2", cluster_keys, DSARL_ARRAY_LEN(cluster_keys)};
    const char *path = NEMO_LLM "/grpo-glm5.2-72n8g-megatron-noncolocated.yaml";
    ck_assert_msg(access(path, R_OK) == 0, "missing fixture %s", path);
    dsarl_recipe *r = NULL;
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_recipe_load_file(path, &r, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(r, &err), 0);
    dsarl_schema_report report;
    dsarl_schema_report_init(&report);
    ck_assert_msg(dsarl_schema_validate(r, &table, 1, &report, &err) == 0, "%s", err.message);
    // Everything but cluster's ported keys and the two policy keys is unused; nothing crashed on vLLM keys.
    ck_assert_uint_ge(report.n_unused, 8);
    bool saw_vllm = false;
    for (size_t i = 0; i < report.n_unused; i++)
        saw_vllm = saw_vllm || strcmp(report.unused[i].path, "policy.generation") == 0;
    ck_assert(saw_vllm);
    dsarl_schema_report_free(&report);
    dsarl_recipe_free(r);
    // A typo added on the command line is caught by the owner of the section.
    ck_assert_int_eq(dsarl_recipe_load_file(path, &r, &err), 0);
    ck_assert_int_eq(dsarl_recipe_override(r, "+cluster.num_node=3", 1, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(r, &err), 0);
    ck_assert_int_eq(dsarl_schema_validate(r, &table, 1, NULL, &err), DSARL_E_INVALID);
    ck_assert_str_eq(err.message, "command line argument 1 '+cluster.num_node=3': unknown key 'cluster.num_node' in "
                                  "section 'cluster' (owned by model/glm5.2); did you mean 'cluster.num_nodes'?");
    dsarl_recipe_free(r);
}
END_TEST

static Suite *schema_suite(void)
{
    Suite *s = suite_create("schema");
    TCase *tc = tcase_create("validate");
    tcase_add_test(tc, test_defaults_fill_absent_keys);
    tcase_add_test(tc, test_type_checks);
    tcase_add_test(tc, test_unknown_keys_in_owned_sections);
    tcase_add_test(tc, test_unused_keys_reported);
    tcase_add_test(tc, test_check_only_collects_every_problem);
    tcase_add_test(tc, test_bad_tables);
    tcase_add_test(tc, test_nemo_recipe_cluster_section);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    test_seed = (unsigned)time(NULL);
    fprintf(stderr, "check_schema: random seed %u\n", test_seed);
    SRunner *sr = srunner_create(schema_suite());
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
