/* testkit.c: the installed test kit (dsarl/testkit.h): a recipe, a registry and the instances opened on them. */
#include "dsarl/testkit.h"

#include <stdlib.h>

#include "dsarl/rng.h"
#include "recipe_internal.h"
#include "registry.h"

#define TESTKIT_MAX_INSTANCES 16

struct dsarl_testkit {
    dsarl_recipe *recipe;
    dsarl_registry *reg;
    dsarl_parallel parallel;
    const dsarl_device_ops *device_ops[TESTKIT_MAX_INSTANCES];
    dsarl_device *devices[TESTKIT_MAX_INSTANCES];
    int n_devices;
    const dsarl_dsa_ops *dsa_ops[TESTKIT_MAX_INSTANCES];
    dsarl_dsa_context *dsas[TESTKIT_MAX_INSTANCES];
    int n_dsas;
};

int dsarl_testkit_open(const char *recipe_yaml, const char *plugin_path, dsarl_testkit **out, dsarl_error *err)
{
    *out = NULL;
    dsarl_testkit *kit = calloc(1, sizeof *kit);
    if (!kit)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dsarl_testkit_open: out of memory");
    kit->parallel = (dsarl_parallel)DSARL_PARALLEL_SINGLE;
    int rc = dsarl_recipe_load_string(recipe_yaml ? recipe_yaml : "{}", "testkit recipe", &kit->recipe, err);
    if (rc == 0)
        rc = dsarl_recipe_resolve(kit->recipe, err);
    if (rc == 0)
        rc = dsarl_registry_create(&kit->reg, err);
    if (rc == 0)
        rc = dsarl_registry_add_search_path(kit->reg, plugin_path, "dsarl_testkit_open", err);
    if (rc == 0)
        rc = dsarl_registry_add_default_paths(kit->reg, err);
    if (rc == 0)
        rc = dsarl_registry_load_all(kit->reg, err);
    if (rc < 0) {
        dsarl_testkit_free(kit);
        return rc;
    }
    *out = kit;
    return 0;
}

const dsarl_node *dsarl_testkit_recipe(const dsarl_testkit *kit) { return dsarl_recipe_root(kit->recipe); }

const dsarl_ops_common *dsarl_testkit_find(const dsarl_testkit *kit, dsarl_kind kind, const char *name)
{
    return dsarl_registry_find(kit->reg, kind, name);
}

size_t dsarl_testkit_refusal_count(const dsarl_testkit *kit) { return dsarl_registry_refusal_count(kit->reg); }

const char *dsarl_testkit_refusal_at(const dsarl_testkit *kit, size_t i)
{
    const dsarl_refusal *r = dsarl_registry_refusal_at(kit->reg, i);
    return r ? r->reason : NULL;
}

int dsarl_testkit_device(dsarl_testkit *kit, const char *name, const dsarl_device_ops **ops, dsarl_device **dev,
                         dsarl_error *err)
{
    if (kit->n_devices == TESTKIT_MAX_INSTANCES)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_testkit_device: at most %d devices per kit",
                          TESTKIT_MAX_INSTANCES);
    const dsarl_ops_common *common = NULL;
    DSARL_TRY(dsarl_registry_require(kit->reg, DSARL_KIND_DEVICE, name, "dsarl_testkit_device", &common, err));
    const dsarl_device_ops *d = (const dsarl_device_ops *)common;
    dsarl_device_config config = {.struct_size = sizeof config, .recipe = dsarl_recipe_root(kit->recipe),
                                  .parallel = &kit->parallel, .threads = 0, .seed = 1234};
    DSARL_TRY(d->create(&config, dev, err));
    kit->device_ops[kit->n_devices] = d;
    kit->devices[kit->n_devices++] = *dev;
    *ops = d;
    return 0;
}

int dsarl_testkit_dsa(dsarl_testkit *kit, const char *name, const dsarl_device_ops *device_ops, dsarl_device *dev,
                      const dsarl_dsa_ops **ops, dsarl_dsa_context **ctx, dsarl_error *err)
{
    if (kit->n_dsas == TESTKIT_MAX_INSTANCES)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_testkit_dsa: at most %d DSA contexts per kit",
                          TESTKIT_MAX_INSTANCES);
    const dsarl_ops_common *common = NULL;
    DSARL_TRY(dsarl_registry_require(kit->reg, DSARL_KIND_DSA, name, "dsarl_testkit_dsa", &common, err));
    const dsarl_dsa_ops *a = (const dsarl_dsa_ops *)common;
    DSARL_TRY(a->create(device_ops, dev, dsarl_recipe_root(kit->recipe), ctx, err));
    kit->dsa_ops[kit->n_dsas] = a;
    kit->dsas[kit->n_dsas++] = *ctx;
    *ops = a;
    return 0;
}

void dsarl_testkit_fill_uniform(float *out, size_t n, float lo, float hi, uint64_t seed, uint64_t stream)
{
    dsarl_rng rng;
    dsarl_rng_init(&rng, seed, stream);
    for (size_t i = 0; i < n; i++)
        out[i] = lo + (hi - lo) * dsarl_rng_uniform(&rng);
}

void dsarl_testkit_free(dsarl_testkit *kit)
{
    if (!kit)
        return;
    for (int i = kit->n_dsas - 1; i >= 0; i--)
        kit->dsa_ops[i]->destroy(kit->dsas[i]);
    for (int i = kit->n_devices - 1; i >= 0; i--)
        kit->device_ops[i]->destroy(kit->devices[i]);
    dsarl_registry_free(kit->reg);
    dsarl_recipe_free(kit->recipe);
    free(kit);
}
