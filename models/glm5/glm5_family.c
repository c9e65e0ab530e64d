/* glm5_family.c: the tables dsarl-model-glm5.so registers: glm5.1 (every layer runs its indexer) and glm5.2
 * (IndexShare "shared" layers reuse the last full layer's top-k). */
#include "glm5_ops.h"

const dsarl_model_ops *const *glm5_plugin_tables(size_t *n);

const dsarl_model_ops *const *glm5_plugin_tables(size_t *n)
{
    static const dsarl_model_ops *const tables[] = {&glm5_2_model_ops, &glm5_1_model_ops};
    *n = DSARL_ARRAY_LEN(tables);
    return tables;
}
