/* check_layout.c: the parallel layout's rank arithmetic against Megatron's own groups, and every refusal of a layout
 * that does not fit (one sentence naming the key and the numbers).
 *
 * The expected groups are the worked example of Megatron-LM's RankGenerator (order tp-cp-ep-dp-pp) for 16 ranks at
 * TP2 PP2 CP2 EP4 with expert tensor parallelism 1, computed by hand from rank = tp + 2 (cp + 2 (dp + 2 pp)) for the
 * dense grid and rank = ep + 4 (edp + 2 pp) for the expert grid. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "dsarl/recipe.h"
#include "layout.h"
#include "recipe_internal.h"

static void expect_groups(const dsarl_layout *l, dsarl_axis axis, int n_groups, int group_size, const int *want)
{
    // every listed group must be what each of its members computes
    for (int g = 0; g < n_groups; g++) {
        const int *members = want + g * group_size;
        for (int i = 0; i < group_size; i++) {
            int32_t got[64];
            int32_t n = dsarl_layout_group_members(l, members[i], axis, got);
            ck_assert_msg(n == group_size, "%s group of rank %d has %d members, want %d", dsarl_axis_name(axis),
                          members[i], n, group_size);
            for (int j = 0; j < group_size; j++)
                ck_assert_msg(got[j] == members[j], "%s group of rank %d: member %d is %d, want %d",
                              dsarl_axis_name(axis), members[i], j, got[j], members[j]);
        }
    }
}

START_TEST(test_megatron_worked_example)
{
    dsarl_layout l;
    dsarl_error err;
    dsarl_error_clear(&err);
    ck_assert_int_eq(dsarl_layout_make(16, 2, 2, 2, 4, &l, &err), DSARL_OK);
    ck_assert_int_eq(l.dp, 2);
    ck_assert_int_eq(l.edp, 2);
    static const int tp[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    static const int cp[] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
    static const int dp[] = {0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15};
    static const int dp_cp[] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15};
    static const int pp[] = {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15};
    static const int ep[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    static const int edp[] = {0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15};
    static const int stage[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    expect_groups(&l, DSARL_AXIS_TP, 8, 2, tp);
    expect_groups(&l, DSARL_AXIS_CP, 8, 2, cp);
    expect_groups(&l, DSARL_AXIS_DP, 8, 2, dp);
    expect_groups(&l, DSARL_AXIS_DP_CP, 4, 4, dp_cp);
    expect_groups(&l, DSARL_AXIS_PP, 8, 2, pp);
    expect_groups(&l, DSARL_AXIS_EP, 4, 4, ep);
    expect_groups(&l, DSARL_AXIS_EDP, 8, 2, edp);
    expect_groups(&l, DSARL_AXIS_TP_DP_CP, 2, 8, stage);
    // coordinates: rank 13 = tp 1, cp 0, dp 1, pp 1; expert grid ep 1, edp 1
    dsarl_parallel p;
    dsarl_layout_coords(&l, 13, &p);
    ck_assert_int_eq(p.tp_rank, 1);
    ck_assert_int_eq(p.cp_rank, 0);
    ck_assert_int_eq(p.dp_rank, 1);
    ck_assert_int_eq(p.pp_rank, 1);
    ck_assert_int_eq(p.ep_rank, 1);
    ck_assert_int_eq(p.edp_rank, 1);
    ck_assert_int_eq(p.sequence_parallel, 1);
}
END_TEST

/* Every rank's coordinates invert to itself in both grids, and both grids agree on the pipeline stage. */
START_TEST(test_coordinates_round_trip)
{
    const int layouts[][5] = {{8, 2, 1, 1, 2}, {8, 1, 2, 1, 4}, {12, 2, 1, 3, 3}, {16, 2, 2, 1, 8}, {4, 1, 1, 1, 4},
                              {6, 3, 1, 1, 1}};
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        dsarl_layout l;
        dsarl_error err;
        dsarl_error_clear(&err);
        const int *s = layouts[i];
        ck_assert_msg(dsarl_layout_make(s[0], s[1], s[2], s[3], s[4], &l, &err) == DSARL_OK, "%s", err.message);
        for (int32_t r = 0; r < l.world; r++) {
            dsarl_parallel p;
            dsarl_layout_coords(&l, r, &p);
            ck_assert_int_eq(dsarl_layout_dense_rank(&l, p.tp_rank, p.cp_rank, p.dp_rank, p.pp_rank), r);
            ck_assert_int_eq(dsarl_layout_expert_rank(&l, p.ep_rank, p.edp_rank, p.pp_rank), r);
        }
    }
}
END_TEST

static const char *layout_fails(int world, const char *yaml)
{
    static dsarl_error err;
    dsarl_error_clear(&err);
    dsarl_recipe *r = NULL;
    ck_assert_int_eq(dsarl_recipe_load_string(yaml, "t.yaml", &r, &err), DSARL_OK);
    dsarl_layout l;
    int rc = dsarl_layout_from_recipe(dsarl_recipe_root(r), world, &l, &err);
    dsarl_recipe_free(r);
    ck_assert_msg(rc != DSARL_OK, "layout accepted: %s", yaml);
    return err.message;
}

#define EXPECT_IN(msg, text) ck_assert_msg(strstr((msg), (text)) != NULL, "'%s' not in: %s", (text), (msg))

START_TEST(test_refusals)
{
    const char *m;
    m = layout_fails(3, "cluster: {num_nodes: 1, gpus_per_node: 3}\n"
                        "policy: {megatron_cfg: {tensor_model_parallel_size: 2, sequence_parallel: true}}\n");
    EXPECT_IN(m, "tensor (2) x pipeline (1) x context (1)");
    EXPECT_IN(m, "3 processes");
    m = layout_fails(4, "cluster: {num_nodes: 1, gpus_per_node: 4}\n"
                        "policy: {megatron_cfg: {expert_model_parallel_size: 3}}\n");
    EXPECT_IN(m, "expert_model_parallel_size 3 does not divide the 4 ranks");
    m = layout_fails(2, "cluster: {num_nodes: 1, gpus_per_node: 2}\n"
                        "policy: {megatron_cfg: {tensor_model_parallel_size: 2}}\n");
    EXPECT_IN(m, "sequence_parallel is false with tensor_model_parallel_size 2");
    m = layout_fails(2, "cluster: {num_nodes: 1, gpus_per_node: 2}\n"
                        "policy: {megatron_cfg: {expert_tensor_parallel_size: 2}}\n");
    EXPECT_IN(m, "expert_tensor_parallel_size");
    EXPECT_IN(m, "t.yaml");
    m = layout_fails(1, "cluster: {num_nodes: 64, gpus_per_node: 8}\n");
    EXPECT_IN(m, "cluster.num_nodes (64) x cluster.gpus_per_node (8) = 512 processes, but this run has 1");
    m = layout_fails(4, "cluster: {num_nodes: 1, gpus_per_node: 4}\n"
                        "policy: {make_sequence_length_divisible_by: 3,\n"
                        "         megatron_cfg: {tensor_model_parallel_size: 2, sequence_parallel: true}}\n");
    EXPECT_IN(m, "make_sequence_length_divisible_by");
    EXPECT_IN(m, "not a multiple of 2");
    // context parallelism cuts every sequence into 2 cp chunks, each split again over tp
    m = layout_fails(4, "cluster: {num_nodes: 1, gpus_per_node: 4}\n"
                        "policy: {make_sequence_length_divisible_by: 4,\n"
                        "         megatron_cfg: {tensor_model_parallel_size: 2, sequence_parallel: true,\n"
                        "                        context_parallel_size: 2}}\n");
    EXPECT_IN(m, "make_sequence_length_divisible_by");
    EXPECT_IN(m, "is 4, not a multiple of 8");
    EXPECT_IN(m, "x 2 x context parallel");
    m = layout_fails(2, "cluster: {num_nodes: 1, gpus_per_node: 2}\n"
                        "policy: {megatron_cfg: {tensor_model_parallel_size: 0}}\n");
    EXPECT_IN(m, "tensor_model_parallel_size");
    EXPECT_IN(m, "got 0");
    m = layout_fails(2, "cluster: {num_nodes: 1, gpus_per_node: 2}\nruntime: {collective_timeout_s: -1}\n");
    EXPECT_IN(m, "collective_timeout_s");
}
END_TEST

/* The seed recipes' own layouts at full size: GLM-5.1 TP8 PP8 EP64 on 64x8, GLM-5.2 TP2 PP8 CP8 EP64. */
START_TEST(test_seed_layouts)
{
    dsarl_error err;
    dsarl_error_clear(&err);
    dsarl_recipe *r = NULL;
    ck_assert_int_eq(dsarl_recipe_load_string("cluster: {num_nodes: 64, gpus_per_node: 8}\n"
                                              "policy: {make_sequence_length_divisible_by: 8, megatron_cfg: {\n"
                                              "  tensor_model_parallel_size: 8, pipeline_model_parallel_size: 8,\n"
                                              "  expert_model_parallel_size: 64, sequence_parallel: true}}\n",
                                              "t.yaml", &r, &err),
                     DSARL_OK);
    dsarl_layout l;
    ck_assert_msg(dsarl_layout_from_recipe(dsarl_recipe_root(r), 512, &l, &err) == DSARL_OK, "%s", err.message);
    ck_assert_int_eq(l.dp, 8);
    ck_assert_int_eq(l.edp, 1);
    dsarl_recipe_free(r);
    ck_assert_int_eq(dsarl_recipe_load_string("cluster: {num_nodes: 64, gpus_per_node: 8}\n"
                                              "policy: {make_sequence_length_divisible_by: 32, megatron_cfg: {\n"
                                              "  tensor_model_parallel_size: 2, pipeline_model_parallel_size: 8,\n"
                                              "  context_parallel_size: 8, expert_model_parallel_size: 64,\n"
                                              "  sequence_parallel: true}}\n",
                                              "t.yaml", &r, &err),
                     DSARL_OK);
    ck_assert_msg(dsarl_layout_from_recipe(dsarl_recipe_root(r), 512, &l, &err) == DSARL_OK, "%s", err.message);
    ck_assert_int_eq(l.dp, 4);
    ck_assert_int_eq(l.edp, 1);
    dsarl_recipe_free(r);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("layout");
    TCase *tc = tcase_create("layout");
    tcase_add_test(tc, test_megatron_worked_example);
    tcase_add_test(tc, test_coordinates_round_trip);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_seed_layouts);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
