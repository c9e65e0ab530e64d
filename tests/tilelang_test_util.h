/* tilelang_test_util.h: tilelang contexts whose kernel choices come from recipe keys (runtime.tilelang_*), for the
 * GPU suites that force a path (the CUDA-core or WMMA kernels on Hopper, the row-wise indexer, a chunk size). The
 * keys are read once at create, so the recipe is freed here; the context's settings are asserted to match, so a
 * key the backend stopped reading fails the suite instead of silently testing the default path. */
#ifndef DSARL_TEST_TILELANG_TEST_UTIL_H
#define DSARL_TEST_TILELANG_TEST_UTIL_H

#include <check.h>
#include "cuda_device.h"
#include "recipe_internal.h"
#include "registry.h"
#include "tilelang.h"

/* Block YAML for the usual forced paths. */
#define TL_KEYS_CUDA_CORE "runtime:\n  tilelang_sparse_mla: cuda_core\n  tilelang_indexer: cuda_core\n"
#define TL_KEYS_WMMA "runtime:\n  tilelang_sparse_mla: wmma\n"

// A recipe from YAML text (free it with dsarl_recipe_free once the context that reads it is created).
static inline dsarl_recipe *keys_recipe(const char *yaml)
{
    dsarl_recipe *r = NULL;
    dsarl_error e = {0};
    ck_assert_msg(dsarl_recipe_load_string(yaml, "test keys", &r, &e) == 0, "recipe '%s': %s", yaml, e.message);
    return r;
}

// A tilelang context on gpu (the cuda device's ops, so its stream) with the keys of the YAML text.
static inline dsarl_dsa_context *tilelang_with_keys(dsarl_device *gpu, const char *yaml)
{
    dsarl_recipe *r = keys_recipe(yaml);
    dsarl_dsa_context *ctx = NULL;
    dsarl_error e = {0};
    ck_assert_msg(tilelang_create(&dsarl_cuda_device_ops, gpu, dsarl_recipe_root(r), &ctx, &e) == 0,
                  "tilelang create with '%s': %s", yaml, e.message);
    tilelang_settings want;
    ck_assert_msg(tilelang_read_settings(dsarl_recipe_root(r), &want, &e) == 0, "%s", e.message);
    ck_assert_msg(ctx->settings.sparse_mla == want.sparse_mla && ctx->settings.indexer == want.indexer &&
                      ctx->settings.select_threads == want.select_threads &&
                      ctx->settings.score_warps == want.score_warps &&
                      ctx->settings.indexer_chunk == want.indexer_chunk &&
                      ctx->settings.query_groups == want.query_groups &&
                      ctx->settings.forward_groups == want.forward_groups,
                  "the context did not keep the keys of '%s'", yaml);
    ck_assert_msg(ctx->stream == cuda_stream(gpu), "the tilelang context is not on the device's stream");
    dsarl_recipe_free(r);
    return ctx;
}

#ifdef DSARL_TEST_TILELANG_SO
// A registry holding the built tilelang plugin (DSARL_TEST_TILELANG_SO), for the cudnn backend's create to find it
// through (cdn_set_host(dsarl_registry_host(reg))), as it does in a run. Free it after the last cudnn context.
static inline dsarl_registry *tilelang_registry(void)
{
    dsarl_registry *reg = NULL;
    dsarl_error e = {0};
    ck_assert_msg(dsarl_registry_create(&reg, &e) == 0, "%s", e.message);
    ck_assert_msg(dsarl_registry_load_file(reg, DSARL_TEST_TILELANG_SO, &e) == 0, "loading %s: %s",
                  DSARL_TEST_TILELANG_SO, e.message);
    ck_assert_msg(dsarl_registry_find(reg, DSARL_KIND_DSA, "tilelang") != NULL, "%s registered no (dsa, tilelang)",
                  DSARL_TEST_TILELANG_SO);
    return reg;
}
#endif

#endif /* DSARL_TEST_TILELANG_TEST_UTIL_H */
