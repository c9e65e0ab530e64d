/* cpu_model_fixture.h: a model from an inline recipe on the CPU device with the reference DSA backend, for the
 * suites that train or checkpoint a real model (header-only: each suite is its own executable). */
#ifndef DSARL_TEST_CPU_MODEL_FIXTURE_H
#define DSARL_TEST_CPU_MODEL_FIXTURE_H

#include <check.h>
#include <string.h>

#include "cpu_device.h"
#include "dsa_reference.h"
#include "dsarl/ops/model.h"
#include "recipe_internal.h"

typedef struct cpu_model_fixture {
    const dsarl_model_ops *ops;
    dsarl_recipe *recipe;
    dsarl_device *dev;
    dsarl_dsa_context *dsa;
    dsarl_model *model;
} cpu_model_fixture;

/* Builds ops' model from recipe_text (named name in messages), random init from seed, one CPU thread. */
static inline void cpu_model_fixture_open(cpu_model_fixture *f, const dsarl_model_ops *ops, const char *recipe_text,
                                          const char *name, uint64_t seed)
{
    dsarl_error err;
    memset(f, 0, sizeof *f);
    f->ops = ops;
    ck_assert_msg(dsarl_recipe_load_string(recipe_text, name, &f->recipe, &err) == 0, "%s", err.message);
    ck_assert_msg(dsarl_recipe_resolve(f->recipe, &err) == 0, "%s", err.message);
    dsarl_device_config dc = {.struct_size = sizeof(dc), .threads = 1};
    ck_assert_msg(cpu_create(&dc, &f->dev, &err) == 0, "%s", err.message);
    ck_assert_msg(dsarl_dsa_reference_ops.create(&dsarl_cpu_device_ops, f->dev, NULL, &f->dsa, &err) == 0, "%s",
                  err.message);
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(f->recipe),
                             .device_ops = &dsarl_cpu_device_ops, .device = f->dev,
                             .dsa_ops = &dsarl_dsa_reference_ops, .dsa = f->dsa, .seed = seed};
    ck_assert_msg(ops->create(&mc, &f->model, &err) == 0, "%s", err.message);
}

/* Frees everything cpu_model_fixture_open built. */
static inline void cpu_model_fixture_close(cpu_model_fixture *f)
{
    f->ops->destroy(f->model);
    dsarl_dsa_reference_ops.destroy(f->dsa);
    cpu_destroy(f->dev);
    dsarl_recipe_free(f->recipe);
}

#endif /* DSARL_TEST_CPU_MODEL_FIXTURE_H */
