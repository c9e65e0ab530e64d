/* check_key_table.c: dsarl_key_table_join (plugin.h), the join of a plugin's recipe-key lists into its table. The
 * lists have fresh random lengths; the joined table must hold every key once, in list order, and a table one key
 * too small must be refused with the counts in the message and left as it was. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsarl/plugin.h"

enum { N_LISTS = 4, MAX_PER_LIST = 40 };

typedef struct lists_fixture {
    dsarl_key_spec keys[N_LISTS][MAX_PER_LIST];
    char paths[N_LISTS][MAX_PER_LIST][32];
    dsarl_key_list lists[N_LISTS];
    size_t total;
} lists_fixture;

/* Lists of 0..MAX_PER_LIST keys (list 1 always empty, the case of a plugin with no own keys), each path naming its
 * list and position so order can be checked from the text alone. */
static void make_lists(lists_fixture *f, unsigned seed)
{
    srand(seed);
    f->total = 0;
    for (int l = 0; l < N_LISTS; l++) {
        size_t n = l == 1 ? 0 : 1 + (size_t)rand() % MAX_PER_LIST;
        for (size_t i = 0; i < n; i++) {
            snprintf(f->paths[l][i], sizeof f->paths[l][i], "list%d.key%zu", l, i);
            f->keys[l][i] = (dsarl_key_spec){f->paths[l][i], (dsarl_key_type)(rand() % 7), "1", "doc",
                                             (uint32_t)(rand() % 8)};
        }
        f->lists[l] = (dsarl_key_list){n ? f->keys[l] : NULL, n};
        f->total += n;
    }
}

START_TEST(test_join_keeps_every_key_in_order)
{
    lists_fixture f;
    make_lists(&f, (unsigned)time(NULL) + (unsigned)_i);
    dsarl_key_spec table[N_LISTS * MAX_PER_LIST];
    size_t n = 12345;
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_key_table_join("test/join", f.lists, N_LISTS, table, f.total, &n, &err), DSARL_OK);
    ck_assert_uint_eq(n, f.total);
    size_t at = 0;
    for (int l = 0; l < N_LISTS; l++) {
        for (size_t i = 0; i < f.lists[l].n_keys; i++, at++) {
            char want[32];
            snprintf(want, sizeof want, "list%d.key%zu", l, i);
            ck_assert_str_eq(table[at].path, want);
            ck_assert_int_eq(table[at].type, f.keys[l][i].type);
            ck_assert_uint_eq(table[at].flags, f.keys[l][i].flags);
        }
    }
    ck_assert_uint_eq(at, f.total);
}
END_TEST

START_TEST(test_overflow_is_refused_and_writes_nothing)
{
    lists_fixture f;
    make_lists(&f, (unsigned)time(NULL) * 31u + (unsigned)_i);
    dsarl_key_spec table[N_LISTS * MAX_PER_LIST];
    memset(table, 0xA5, sizeof table);
    dsarl_key_spec pristine[N_LISTS * MAX_PER_LIST];
    memcpy(pristine, table, sizeof table);
    size_t n = 12345;
    dsarl_error err = {0};
    int rc = dsarl_key_table_join("algorithm/test", f.lists, N_LISTS, table, f.total - 1, &n, &err);
    ck_assert_int_eq(rc, DSARL_E_INTERNAL);
    ck_assert_uint_eq(n, 0);
    char want[128];
    snprintf(want, sizeof want, "algorithm/test: %zu recipe keys do not fit its key table of %zu", f.total,
             f.total - 1);
    ck_assert_msg(strstr(err.message, want) != NULL, "message '%s' lacks '%s'", err.message, want);
    ck_assert(memcmp(table, pristine, sizeof table) == 0);
}
END_TEST

START_TEST(test_bad_lists_are_refused)
{
    dsarl_key_spec table[4];
    size_t n = 7;
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_key_table_join("algorithm/none", NULL, 0, table, 4, &n, &err), DSARL_OK);
    ck_assert_uint_eq(n, 0);
    const dsarl_key_list holes[] = {{NULL, 3}};
    ck_assert_int_eq(dsarl_key_table_join("algorithm/hole", holes, 1, table, 4, &n, &err), DSARL_E_INTERNAL);
    ck_assert_msg(strstr(err.message, "algorithm/hole: key list 0 has 3 keys but no array"), "%s", err.message);
    const dsarl_key_spec one = {"a.b", DSARL_KEY_INT, "1", "doc", 0};
    const dsarl_key_list huge[] = {{&one, 1}, {&one, SIZE_MAX}};
    ck_assert_int_eq(dsarl_key_table_join(NULL, huge, 2, table, 4, &n, &err), DSARL_E_INTERNAL);
    ck_assert_msg(strstr(err.message, "a plugin: key lists too long to count"), "%s", err.message);
    ck_assert_uint_eq(n, 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("key_table");
    TCase *tc = tcase_create("join");
    tcase_add_loop_test(tc, test_join_keeps_every_key_in_order, 0, 8);
    tcase_add_loop_test(tc, test_overflow_is_refused_and_writes_nothing, 0, 8);
    tcase_add_test(tc, test_bad_lists_are_refused);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
