/* fuzz_recipe.c: a recipe from YAML text, then command-line overrides, then resolution (defaults, interpolation),
 * then the typed reads the trainer makes of it and the annotated write of `config show`.
 * Input: YAML, then optionally "\n%%\n" and one override per line (at most 8). */
#include "fuzz_common.h"

#include "dsarl/checkpoint.h"
#include "dsarl/optimizer.h"
#include "dsarl/recipe.h"
#include "dsarl/trainer.h"
#include "recipe_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)fuzz_scratch_dir();
    size_t yaml_n, rest;
    fuzz_split(data, size, "\n%%\n", &yaml_n, &rest);
    char *yaml = malloc(yaml_n + 1), *overrides = malloc(size - rest + 1);
    memcpy(yaml, data, yaml_n);
    yaml[yaml_n] = '\0';
    memcpy(overrides, data + rest, size - rest);
    overrides[size - rest] = '\0';
    dsarl_recipe *r = NULL;
    dsarl_error err;
    if (dsarl_recipe_load_string(yaml, "fuzz.yaml", &r, &err) == 0) {
        int rc = 0, index = 0;
        for (char *line = strtok(overrides, "\n"); line && rc == 0 && index < 8; line = strtok(NULL, "\n"))
            rc = dsarl_recipe_override(r, line, ++index, &err);
        if (rc == 0 && dsarl_recipe_resolve(r, &err) == 0) {
            const dsarl_node *root = dsarl_recipe_root(r);
            dsarl_checkpoint_config ck;
            dsarl_optimizer_params adam;
            dsarl_nonfinite_guard guard;
            dsarl_checkpoint_on_corrupt policy;
            (void)dsarl_checkpoint_config_from_recipe(root, &ck, &err);
            (void)dsarl_checkpoint_on_corrupt_from_recipe(root, &policy, &err);
            (void)dsarl_optimizer_params_from_recipe(root, &adam, &err);
            (void)dsarl_nonfinite_guard_from_recipe(root, &guard, &err);
            FILE *null = fopen("/dev/null", "w");
            (void)dsarl_recipe_write(r, null, 1, &err);
            fclose(null);
        }
    }
    dsarl_recipe_free(r);
    free(yaml);
    free(overrides);
    return 0;
}
