/* check_hf_hub.c: hub ids found in a Hugging Face cache laid out as the hub's tools write it (refs/, snapshots/
 * whose files link into blobs/), the cache directory's environment order, revisions by branch, tag and commit, and
 * one-line refusals that name where they looked. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsarl/hf_hub.h"

#define COMMIT_MAIN "0123456789abcdef0123456789abcdef01234567"
#define COMMIT_V1 "89abcdef0123456789abcdef0123456789abcdef"

static char cache[256];

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static void sh(const char *fmt, const char *arg)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, fmt, arg, arg, arg, arg);
    ck_assert_msg(system(cmd) == 0, "%s", cmd);
}

// models--zai-org--GLM-5.2 with refs main and v1, two snapshots whose config.json links into blobs/
static void setup(void)
{
    snprintf(cache, sizeof cache, "/tmp/dsarl-check-hf-hub-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(cache));
    sh("mkdir -p '%s/models--zai-org--GLM-5.2/refs' '%s/models--zai-org--GLM-5.2/blobs' "
       "'%s/models--zai-org--GLM-5.2/snapshots/" COMMIT_MAIN "' '%s/models--zai-org--GLM-5.2/snapshots/" COMMIT_V1 "'",
       cache);
    char path[512];
    snprintf(path, sizeof path, "%s/models--zai-org--GLM-5.2/blobs/aa11", cache);
    write_text(path, "{\"model_type\": \"glm_moe_dsa\"}\n");
    sh("ln -s ../../blobs/aa11 '%s/models--zai-org--GLM-5.2/snapshots/" COMMIT_MAIN "/config.json'", cache);
    snprintf(path, sizeof path, "%s/models--zai-org--GLM-5.2/refs/main", cache);
    write_text(path, COMMIT_MAIN); // the hub's tools write no newline
    snprintf(path, sizeof path, "%s/models--zai-org--GLM-5.2/refs/v1", cache);
    write_text(path, COMMIT_V1 "\n");
    setenv("HF_HUB_CACHE", cache, 1);
    unsetenv("HF_HUB_OFFLINE");
}

static void teardown(void)
{
    sh("rm -rf '%s'", cache);
}

START_TEST(test_hub_id_shape)
{
    ck_assert(dsarl_hf_is_hub_id("zai-org/GLM-5.2"));
    ck_assert(dsarl_hf_is_hub_id("deepseek-ai/DeepSeek-V3.2_Exp"));
    ck_assert(!dsarl_hf_is_hub_id("GLM-5.2"));          // no owner
    ck_assert(!dsarl_hf_is_hub_id("a/b/c"));            // a path
    ck_assert(!dsarl_hf_is_hub_id("../GLM-5.2"));       // leaves the cache
    ck_assert(!dsarl_hf_is_hub_id("zai-org/.."));
    ck_assert(!dsarl_hf_is_hub_id("zai-org/a..b"));
    ck_assert(!dsarl_hf_is_hub_id("zai-org/.hidden"));
    ck_assert(!dsarl_hf_is_hub_id("zai org/GLM"));      // a space
    ck_assert(!dsarl_hf_is_hub_id("/GLM-5.2"));
    ck_assert(!dsarl_hf_is_hub_id("zai-org/"));
    ck_assert(!dsarl_hf_is_hub_id(NULL));
    char long_name[200];
    memset(long_name, 'a', sizeof long_name - 1), long_name[sizeof long_name - 1] = 0;
    long_name[3] = '/';
    ck_assert(!dsarl_hf_is_hub_id(long_name));         // past the hub's 96 characters
    // an existing local path of the same shape is a path, not a hub id
    char local[512];
    snprintf(local, sizeof local, "%s/zai-org", cache);
    ck_assert_int_eq(mkdir(local, 0755), 0);
    snprintf(local, sizeof local, "%s/zai-org/GLM-5.2", cache);
    ck_assert_int_eq(mkdir(local, 0755), 0);
    ck_assert_int_eq(chdir(cache), 0);
    ck_assert(!dsarl_hf_is_hub_id("zai-org/GLM-5.2"));
    char out[4096];
    dsarl_error err;
    ck_assert_int_eq(dsarl_hf_resolve("zai-org/GLM-5.2", NULL, "policy.model_name", out, sizeof out, &err), 0);
    ck_assert_str_eq(out, "zai-org/GLM-5.2");
    ck_assert_int_eq(chdir("/"), 0);
}
END_TEST

START_TEST(test_cache_dir_order)
{
    char out[4096];
    const char *source = NULL;
    dsarl_error err;
    setenv("HF_HOME", "/data/hf", 1);
    setenv("XDG_CACHE_HOME", "/data/xdg", 1);
    setenv("HF_HUB_CACHE", "/data/hub", 1);
    ck_assert_int_eq(dsarl_hf_cache_dir(out, sizeof out, &source, &err), 0);
    ck_assert_str_eq(out, "/data/hub");
    ck_assert_str_eq(source, "HF_HUB_CACHE");
    unsetenv("HF_HUB_CACHE");
    ck_assert_int_eq(dsarl_hf_cache_dir(out, sizeof out, &source, &err), 0);
    ck_assert_str_eq(out, "/data/hf/hub");
    ck_assert_str_eq(source, "HF_HOME");
    setenv("HF_HOME", "", 1); // empty is unset, as in huggingface_hub
    ck_assert_int_eq(dsarl_hf_cache_dir(out, sizeof out, &source, &err), 0);
    ck_assert_str_eq(out, "/data/xdg/huggingface/hub");
    unsetenv("HF_HOME");
    unsetenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (home && home[0]) {
        char want[4096];
        snprintf(want, sizeof want, "%s/.cache/huggingface/hub", home);
        ck_assert_int_eq(dsarl_hf_cache_dir(out, sizeof out, &source, &err), 0);
        ck_assert_str_eq(out, want);
        ck_assert_str_eq(source, "HOME");
    }
}
END_TEST

START_TEST(test_revisions)
{
    char out[4096], want[4096];
    dsarl_error err;
    snprintf(want, sizeof want, "%s/models--zai-org--GLM-5.2/snapshots/" COMMIT_MAIN, cache);
    ck_assert_int_eq(dsarl_hf_resolve("zai-org/GLM-5.2", NULL, "policy.model_name", out, sizeof out, &err), 0);
    ck_assert_str_eq(out, want);
    ck_assert_int_eq(dsarl_hf_resolve("zai-org/GLM-5.2", "main", "policy.model_name", out, sizeof out, &err), 0);
    ck_assert_str_eq(out, want);
    char config[4200];
    snprintf(config, sizeof config, "%s/config.json", out);
    ck_assert_int_eq(access(config, R_OK), 0); // through the blob link
    snprintf(want, sizeof want, "%s/models--zai-org--GLM-5.2/snapshots/" COMMIT_V1, cache);
    ck_assert_int_eq(dsarl_hf_resolve("zai-org/GLM-5.2", "v1", "policy.model_name", out, sizeof out, &err), 0);
    ck_assert_str_eq(out, want); // a tag's ref file ends in a newline
    ck_assert_int_eq(dsarl_hf_resolve("zai-org/GLM-5.2", COMMIT_V1, "policy.model_name", out, sizeof out, &err), 0);
    ck_assert_str_eq(out, want);
}
END_TEST

// The inspecting commands' lookup: the snapshot when the cache has it, else the name as written.
START_TEST(test_find)
{
    char out[4096], want[4096];
    snprintf(want, sizeof want, "%s/models--zai-org--GLM-5.2/snapshots/" COMMIT_V1, cache);
    dsarl_hf_find("zai-org/GLM-5.2", "v1", out, sizeof out);
    ck_assert_str_eq(out, want);
    dsarl_hf_find("zai-org/GLM-5.1", NULL, out, sizeof out);
    ck_assert_str_eq(out, "zai-org/GLM-5.1");
    dsarl_hf_find("zai-org/GLM-5.2", "v2", out, sizeof out); // a ref the cache lacks
    ck_assert_str_eq(out, "zai-org/GLM-5.2");
    dsarl_hf_find("/no/such/dir", NULL, out, sizeof out);
    ck_assert_str_eq(out, "/no/such/dir");
}
END_TEST

START_TEST(test_refusals)
{
    char out[4096], path[512];
    dsarl_error err;
    // not in the cache: where it looked, from which variable, and how to download
    ck_assert_int_eq(dsarl_hf_resolve("zai-org/GLM-5.1", NULL, "policy.model_name", out, sizeof out, &err),
                     DSARL_E_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err.message, "models--zai-org--GLM-5.1"));
    ck_assert_ptr_nonnull(strstr(err.message, "HF_HUB_CACHE"));
    ck_assert_ptr_nonnull(strstr(err.message, "hf download zai-org/GLM-5.1"));
    ck_assert_ptr_nonnull(strstr(err.message, "policy.model_name"));
    ck_assert_ptr_null(strchr(err.message, '\n'));
    setenv("HF_HUB_OFFLINE", "1", 1);
    ck_assert_int_eq(dsarl_hf_resolve("zai-org/GLM-5.1", NULL, "policy.model_name", out, sizeof out, &err),
                     DSARL_E_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err.message, "HF_HUB_OFFLINE is set"));
    unsetenv("HF_HUB_OFFLINE");
    // a revision the cache has no ref for lists the snapshots it has
    ck_assert_int_eq(dsarl_hf_resolve("zai-org/GLM-5.2", "v2", "policy.model_name", out, sizeof out, &err),
                     DSARL_E_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err.message, "refs/v2"));
    ck_assert_ptr_nonnull(strstr(err.message, "0123456789ab"));
    // a ref whose commit has no snapshot, and a ref file that is not a commit
    snprintf(path, sizeof path, "%s/models--zai-org--GLM-5.2/refs/gone", cache);
    write_text(path, "fedcba9876543210fedcba9876543210fedcba98");
    ck_assert_int_eq(dsarl_hf_resolve("zai-org/GLM-5.2", "gone", "policy.model_name", out, sizeof out, &err),
                     DSARL_E_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err.message, "fedcba987654"));
    snprintf(path, sizeof path, "%s/models--zai-org--GLM-5.2/refs/junk", cache);
    write_text(path, "not a commit at all");
    ck_assert_int_eq(dsarl_hf_resolve("zai-org/GLM-5.2", "junk", "policy.model_name", out, sizeof out, &err),
                     DSARL_E_NOT_FOUND);
    // revisions that would leave refs/, and names that are neither paths nor hub ids
    ck_assert_int_eq(dsarl_hf_resolve("zai-org/GLM-5.2", "../../x", "policy.model_name", out, sizeof out, &err),
                     DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "revision '../../x'"));
    ck_assert_int_eq(dsarl_hf_resolve("/no/such/dir", NULL, "policy.model_name", out, sizeof out, &err),
                     DSARL_E_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err.message, "'/no/such/dir': no such file or directory"));
    ck_assert_int_eq(dsarl_hf_resolve("", NULL, "policy.model_name", out, sizeof out, &err), DSARL_E_INVALID);
    // an output buffer too small for the snapshot path is an error, not a truncated path
    char small[16];
    ck_assert_int_eq(dsarl_hf_resolve("zai-org/GLM-5.2", NULL, "policy.model_name", small, sizeof small, &err),
                     DSARL_E_INVALID);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("hf_hub");
    TCase *tc = tcase_create("resolve");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_hub_id_shape);
    tcase_add_test(tc, test_cache_dir_order);
    tcase_add_test(tc, test_revisions);
    tcase_add_test(tc, test_find);
    tcase_add_test(tc, test_refusals);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
