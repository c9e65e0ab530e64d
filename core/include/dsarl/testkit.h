/* dsarl/testkit.h: unit-testing a plugin out of tree, through the same loader and recipe reader the host uses.
 * SDK tier: trainer services (docs/sdk.md), linked from libdsarl; never called by a plugin at run time.
 *
 * A kit owns one recipe (parsed from a YAML string and resolved), one plugin registry (the given search path, then
 * DSARL_PLUGIN_PATH, then the installed plugins beside libdsarl), and the device and DSA instances it opened, which
 * it frees in reverse order. Typical test of a DSA backend against the reference one:
 *
 *     dsarl_testkit *kit; dsarl_error err;
 *     dsarl_testkit_open("runtime: {device: cpu}\n", "build/plugins", &kit, &err);
 *     const dsarl_device_ops *dev_ops; dsarl_device *dev;
 *     dsarl_testkit_device(kit, "cpu", &dev_ops, &dev, &err);
 *     const dsarl_dsa_ops *mine, *ref; dsarl_dsa_context *a, *b;
 *     dsarl_testkit_dsa(kit, "mybackend", dev_ops, dev, &mine, &a, &err);
 *     dsarl_testkit_dsa(kit, "reference", dev_ops, dev, &ref, &b, &err);
 *     ... fill inputs with dsarl_testkit_fill_uniform, upload, call both, compare ...
 *     dsarl_testkit_free(kit);
 *
 * Every function returns 0 or a negative dsarl_status with one sentence in err (a refused plugin's own line when
 * the name was refused). */
#ifndef DSARL_TESTKIT_H
#define DSARL_TESTKIT_H

#include <stddef.h>
#include <stdint.h>
#include "dsarl/ops/device.h"
#include "dsarl/ops/dsa.h"

DSARL_BEGIN_DECLS

typedef struct dsarl_testkit dsarl_testkit;

/* Parses recipe_yaml (a complete recipe; "{}" for none), resolves it, and loads every plugin on plugin_path (a
 * ':'-separated list, or NULL) followed by the default search path. */
DSARL_API int dsarl_testkit_open(const char *recipe_yaml, const char *plugin_path, dsarl_testkit **out,
                                 dsarl_error *err);

/* The resolved recipe root the kit hands to create() calls. */
DSARL_API const dsarl_node *dsarl_testkit_recipe(const dsarl_testkit *kit);

/* The registered ops table (kind, name), or NULL when there is none; the kit's registry owns it. */
DSARL_API const dsarl_ops_common *dsarl_testkit_find(const dsarl_testkit *kit, dsarl_kind kind, const char *name);

/* Number of files the loader refused and refusal i's one-line reason (NULL past the end): a test can assert that
 * its own plugin loaded. */
DSARL_API size_t dsarl_testkit_refusal_count(const dsarl_testkit *kit);
DSARL_API const char *dsarl_testkit_refusal_at(const dsarl_testkit *kit, size_t i);

/* Creates an instance of device plugin `name` (single process, seed 1234); the kit destroys it. */
DSARL_API int dsarl_testkit_device(dsarl_testkit *kit, const char *name, const dsarl_device_ops **ops,
                                   dsarl_device **dev, dsarl_error *err);

/* Creates a context of DSA backend `name` on a device from dsarl_testkit_device; the kit destroys it first. */
DSARL_API int dsarl_testkit_dsa(dsarl_testkit *kit, const char *name, const dsarl_device_ops *device_ops,
                                dsarl_device *dev, const dsarl_dsa_ops **ops, dsarl_dsa_context **ctx,
                                dsarl_error *err);

/* Fills out[0..n) with uniform values in [lo, hi) from the Philox stream (seed, stream): fresh inputs per test
 * that are the same on every machine. */
DSARL_API void dsarl_testkit_fill_uniform(float *out, size_t n, float lo, float hi, uint64_t seed, uint64_t stream);

/* Destroys the DSA contexts, then the devices, then the registry and the recipe. NULL is a no-op. */
DSARL_API void dsarl_testkit_free(dsarl_testkit *kit);

DSARL_END_DECLS

#endif /* DSARL_TESTKIT_H */
