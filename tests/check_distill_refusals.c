/* check_distill_refusals.c: the refusal of on-policy distillation (algorithms/distillation) on a parallel layout,
 * which a one-process run cannot reach: distill_train_run with a layout of 2 on each axis in turn must fail with
 * DSARL_E_UNSUPPORTED in one sentence that names the sizes and the keys to change, before any model or plugin is
 * touched (the context has none; a run that went further would crash). The recipe-only refusals are run by the
 * errors catalogue (docs/errors.md, "On-policy distillation"). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distill.h"
#include "recipe_internal.h"

START_TEST(test_parallel_layout_refused)
{
    dsarl_recipe *recipe = NULL;
    dsarl_error err = {0};
    ck_assert_msg(dsarl_recipe_load_file(DSARL_SOURCE_DIR "/configs/recipes/llm/distillation-glm5.2-tiny.yaml",
                                         &recipe, &err) == 0, "%s", err.message);
    ck_assert_msg(dsarl_recipe_override(recipe, "teacher.model_name=" DSARL_SOURCE_DIR "/tests/fixtures/glm5/"
                                        "glm5.2-tiny", 1, &err) == 0, "%s", err.message);
    ck_assert_msg(dsarl_recipe_resolve(recipe, &err) == 0, "%s", err.message);
    dsarl_parallel p = DSARL_PARALLEL_SINGLE;
    int32_t *axis[] = {&p.dp_size, &p.tp_size, &p.pp_size, &p.cp_size, &p.ep_size};
    const char *want[] = {"dp 2 tp 1 pp 1 cp 1 ep 1", "dp 1 tp 2 pp 1 cp 1 ep 1", "dp 1 tp 1 pp 2 cp 1 ep 1",
                          "dp 1 tp 1 pp 1 cp 2 ep 1", "dp 1 tp 1 pp 1 cp 1 ep 2"};
    *axis[_i] = 2;
    p.world_size = 2;
    dsarl_run_context ctx = {.struct_size = sizeof ctx, .recipe = dsarl_recipe_root(recipe), .parallel = &p};
    int rc = distill_train_run(&ctx, NULL, &err);
    ck_assert_int_eq(rc, DSARL_E_UNSUPPORTED);
    char head[400];
    snprintf(head, sizeof head, "algorithm distillation runs in one process only for now (got %s): launch one "
             "process (no mpirun or srun), with cluster.num_nodes, cluster.gpus_per_node and policy.megatron_cfg's "
             "*_model_parallel_size at 1", want[_i]);
    ck_assert_msg(strcmp(err.message, head) == 0, "message '%s'", err.message);
    dsarl_recipe_free(recipe);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("distill_refusals");
    TCase *tc = tcase_create("layout");
    tcase_add_loop_test(tc, test_parallel_layout_refused, 0, 5);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
