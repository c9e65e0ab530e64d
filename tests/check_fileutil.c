/* check_fileutil.c: whole-file reads, atomic writes (no temp file left behind) and path helpers. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsarl/fileutil.h"

static char tmpdir[256];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dsarl-check-fileutil-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void remove_tree(const char *path)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    ck_assert_int_eq(system(cmd), 0);
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

START_TEST(test_write_then_read)
{
    make_tmpdir();
    char *path = dsarl_path_join(tmpdir, "blob.bin");
    dsarl_error err = {0};
    unsigned char data[3000];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (unsigned char)(i * 131u + 7u + (unsigned)rand());
    ck_assert_int_eq(dsarl_write_file_atomic(path, data, sizeof data, &err), DSARL_OK);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0644);
    void *back = NULL;
    size_t n = 0;
    ck_assert_int_eq(dsarl_read_file(path, &back, &n, &err), DSARL_OK);
    ck_assert_uint_eq(n, sizeof data);
    ck_assert_int_eq(memcmp(back, data, n), 0);
    ck_assert_int_eq(((char *)back)[n], '\0');
    free(back);
    /* Overwrite with something shorter: the old contents must be fully replaced, and no temp file remains. */
    ck_assert_int_eq(dsarl_write_file_atomic(path, "xyz", 3, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_read_file(path, &back, &n, &err), DSARL_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_str_eq(back, "xyz");
    free(back);
    ck_assert_int_eq(count_entries(tmpdir), 1);
    free(path);
    remove_tree(tmpdir);
}
END_TEST

START_TEST(test_errors_leave_nothing_behind)
{
    make_tmpdir();
    dsarl_error err = {0};
    void *data = NULL;
    size_t n = 0;
    char *missing = dsarl_path_join(tmpdir, "missing.txt");
    ck_assert_int_eq(dsarl_read_file(missing, &data, &n, &err), DSARL_E_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err.message, missing));
    ck_assert_int_eq(dsarl_read_file(tmpdir, &data, &n, &err), DSARL_E_INVALID); /* a directory */
    ck_assert_ptr_nonnull(strstr(err.message, "not a regular file (a directory)"));
    char *nodir = dsarl_path_join(tmpdir, "no/such/dir/file.txt");
    ck_assert_int_eq(dsarl_write_file_atomic(nodir, "a", 1, &err), DSARL_E_IO);
    ck_assert_ptr_nonnull(strstr(err.message, nodir));
    /* An aborted atomic file removes its temp file and never creates the final one. */
    char *aborted = dsarl_path_join(tmpdir, "aborted.bin");
    dsarl_atomic_file f;
    ck_assert_int_eq(dsarl_atomic_file_open(&f, aborted, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_atomic_file_write(&f, "partial", 7, &err), DSARL_OK);
    ck_assert_int_eq(count_entries(tmpdir), 1); /* the temp file */
    ck_assert(!dsarl_path_exists(aborted));
    dsarl_atomic_file_abort(&f);
    dsarl_atomic_file_abort(&f); /* twice is harmless */
    ck_assert_int_eq(count_entries(tmpdir), 0);
    free(missing);
    free(nodir);
    free(aborted);
    remove_tree(tmpdir);
}
END_TEST

START_TEST(test_mkdir_p)
{
    make_tmpdir();
    dsarl_error err = {0};
    char *deep = dsarl_path_join(tmpdir, "a/b/c/");
    ck_assert_int_eq(dsarl_mkdir_p(deep, &err), DSARL_OK);
    ck_assert_int_eq(dsarl_mkdir_p(deep, &err), DSARL_OK); /* existing is fine */
    struct stat st;
    ck_assert_int_eq(stat(deep, &st), 0);
    ck_assert(S_ISDIR(st.st_mode));
    char *file = dsarl_path_join(tmpdir, "a/plain");
    ck_assert_int_eq(dsarl_write_file_atomic(file, "x", 1, &err), DSARL_OK);
    char *under_file = dsarl_path_join(file, "sub");
    ck_assert_int_eq(dsarl_mkdir_p(under_file, &err), DSARL_E_IO);
    ck_assert_int_eq(dsarl_mkdir_p(file, &err), DSARL_E_IO);
    ck_assert_ptr_nonnull(strstr(err.message, "not a directory"));
    free(deep);
    free(file);
    free(under_file);
    remove_tree(tmpdir);
}
END_TEST

START_TEST(test_path_helpers)
{
    static const struct { const char *a, *b, *want; } joins[] = {
        {"dir", "file", "dir/file"}, {"dir/", "file", "dir/file"}, {"", "file", "file"},
        {"dir", "/abs", "/abs"},     {"/", "x", "/x"},             {"a/b", "c/d", "a/b/c/d"},
        {"dir", "", "dir"},
    };
    for (size_t i = 0; i < sizeof joins / sizeof joins[0]; i++) {
        char *got = dsarl_path_join(joins[i].a, joins[i].b);
        ck_assert_str_eq(got, joins[i].want);
        free(got);
    }
    static const struct { const char *path, *want; } dirs[] = {
        {"a/b/c", "a/b"}, {"c", "."},   {"/c", "/"},      {"a/b/", "a"}, {"/", "/"},
        {"", "."},        {"a//b", "a"}, {"//x/y", "//x"}, {"./f", "."},
    };
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        char *got = dsarl_path_dirname(dirs[i].path);
        ck_assert_msg(strcmp(got, dirs[i].want) == 0, "dirname('%s') = '%s', want '%s'", dirs[i].path, got,
                      dirs[i].want);
        free(got);
    }
    ck_assert(dsarl_path_exists("/"));
    ck_assert(!dsarl_path_exists("/definitely/not/here"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fileutil");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_write_then_read);
    tcase_add_test(tc, test_errors_leave_nothing_behind);
    tcase_add_test(tc, test_mkdir_p);
    tcase_add_test(tc, test_path_helpers);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
