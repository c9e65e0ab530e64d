/* glm52_family.c: what distinguishes the glm5.2 plugin: its table (IndexShare "shared" layers accepted). */
#include "glm5_ops.h"

/* The table this plugin registers. */
const dsarl_model_ops *glm52_table(void);

const dsarl_model_ops *glm52_table(void) { return &glm5_2_model_ops; }
