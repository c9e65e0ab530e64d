/* glm51_family.c: what distinguishes the glm5.1 plugin: its table (every layer "full"). */
#include "glm5_ops.h"

/* The table this plugin registers. */
const dsarl_model_ops *glm51_table(void);

const dsarl_model_ops *glm51_table(void) { return &glm5_1_model_ops; }
