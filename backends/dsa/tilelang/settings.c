/* settings.c: the tilelang backend's runtime.tilelang_* recipe keys, read and checked once at create. */
#include <stdio.h>
#include <string.h>
#include "dsarl/recipe.h"
#include "tilelang.h"

static int read_choice(const dsarl_node *recipe, const char *key, const char *const *names, int n, int *out,
                       dsarl_error *err)
{
    const char *text = NULL;
    DSARL_TRY(dsarl_recipe_string_or(recipe, key, names[0], &text, err));
    for (int i = 0; i < n; i++)
        if (strcmp(text, names[i]) == 0) {
            *out = i;
            return DSARL_OK;
        }
    return dsarl_recipe_fail(recipe, key, err, DSARL_E_INVALID, "must be %s | %s | %s, got '%s'", names[0],
                             names[1], names[2], text);
}

static const char *const mla_names[] = {"auto", "wmma", "cuda_core"};
static const char *const indexer_names[] = {"auto", "rowwise", "cuda_core"};

int tilelang_read_settings(const dsarl_node *recipe, tilelang_settings *out, dsarl_error *err)
{
    tilelang_settings s = {.sparse_mla = TILELANG_MLA_AUTO, .indexer = TILELANG_INDEXER_AUTO, .select_threads = 512,
                           .score_warps = 8, .indexer_chunk = 0, .query_groups = 1, .forward_groups = 0};
    if (recipe) {
        int mla = 0, indexer = 0;
        int64_t threads = 0, warps = 0, chunk = 0;
        DSARL_TRY(read_choice(recipe, "runtime.tilelang_sparse_mla", mla_names, 3, &mla, err));
        DSARL_TRY(read_choice(recipe, "runtime.tilelang_indexer", indexer_names, 3, &indexer, err));
        DSARL_TRY(dsarl_recipe_int_or(recipe, "runtime.tilelang_select_threads", 512, &threads, err));
        if (threads != 512 && threads != 256)
            return dsarl_recipe_fail(recipe, "runtime.tilelang_select_threads", err, DSARL_E_INVALID,
                                     "must be 512 or 256, got %lld", (long long)threads);
        DSARL_TRY(dsarl_recipe_int_or(recipe, "runtime.tilelang_score_warps", 8, &warps, err));
        if (warps != 8 && warps != 4)
            return dsarl_recipe_fail(recipe, "runtime.tilelang_score_warps", err, DSARL_E_INVALID,
                                     "must be 8 or 4, got %lld", (long long)warps);
        DSARL_TRY(dsarl_recipe_int_or(recipe, "runtime.tilelang_indexer_chunk", 0, &chunk, err));
        if (chunk != 0 && (chunk < 64 || chunk > INT32_MAX))
            return dsarl_recipe_fail(recipe, "runtime.tilelang_indexer_chunk", err, DSARL_E_INVALID,
                                     "must be 0 (automatic) or a row count from 64 to 2^31-1, got %lld",
                                     (long long)chunk);
        s.sparse_mla = (tilelang_mla_kernels)mla;
        s.indexer = (tilelang_indexer_kernels)indexer;
        s.select_threads = (int)threads;
        s.score_warps = (int)warps;
        s.indexer_chunk = chunk;
        bool groups = true;
        DSARL_TRY(dsarl_recipe_bool_or(recipe, "runtime.tilelang_mla_query_groups", true, &groups, err));
        s.query_groups = groups;
        bool forward_groups = false;
        DSARL_TRY(dsarl_recipe_bool_or(recipe, "runtime.tilelang_mla_forward_query_groups", false, &forward_groups,
                                       err));
        s.forward_groups = forward_groups;
    }
    *out = s;
    return DSARL_OK;
}

void tilelang_format_settings(const tilelang_settings *s, char *buf, size_t size)
{
    snprintf(buf, size, "runtime.tilelang_sparse_mla=%s runtime.tilelang_indexer=%s "
             "runtime.tilelang_select_threads=%d runtime.tilelang_score_warps=%d runtime.tilelang_indexer_chunk=%lld "
             "runtime.tilelang_mla_query_groups=%s runtime.tilelang_mla_forward_query_groups=%s",
             mla_names[s->sparse_mla], indexer_names[s->indexer], s->select_threads, s->score_warps,
             (long long)s->indexer_chunk, s->query_groups ? "true" : "false",
             s->forward_groups ? "true" : "false");
}
