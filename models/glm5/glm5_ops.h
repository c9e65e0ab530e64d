/* glm5_ops.h: the model ops functions shared by the glm5.1 and glm5.2 tables, and the tables. */
#ifndef DSARL_GLM5_OPS_H
#define DSARL_GLM5_OPS_H

#include "glm5_model.h"

/* What a plugin accepts: glm5.1 runs every layer's indexer, glm5.2 also accepts IndexShare "shared" layers. */
typedef enum glm5_family { GLM5_FAMILY_51 = 0, GLM5_FAMILY_52 = 1 } glm5_family;

/* The registered tables (kind model, names "glm5.1" and "glm5.2"). */
extern const dsarl_model_ops glm5_1_model_ops;
extern const dsarl_model_ops glm5_2_model_ops;

/* Builds a model for family from config (HF dir or recipe inline config with random init). */
int glm5_create_family(glm5_family family, const dsarl_model_config *config, dsarl_model **out, dsarl_error *err);

/* Parameter counts of the model config describes, without allocating it. */
int glm5_count_family(glm5_family family, const dsarl_model_config *config, int64_t *trainable, int64_t *buffers,
                      dsarl_error *err);

/* The config of config->model_dir, or of the recipe's inline policy.model_config, checked against the family. */
int glm5_family_config(glm5_family family, const dsarl_model_config *config, glm5_config *cfg, dsarl_error *err);

/* Checks that cfg fits the family (glm5.1 refuses "shared" layers, naming glm5.2). */
int glm5_check_family(glm5_family family, const glm5_config *cfg, const char *where, dsarl_error *err);

/* dsarl_model_ops.accepts of each table (glm5_accepts.c): IndexShare in config.json decides, else the name. */
int glm5_accepts_51(const dsarl_model_probe *probe, dsarl_error *err);
int glm5_accepts_52(const dsarl_model_probe *probe, dsarl_error *err);

/* dsarl_model_ops.flops of each table (glm5_flops.c). */
int glm5_flops_51(const dsarl_model_config *config, const dsarl_token_batch *batch, dsarl_model_flops *out,
                  dsarl_error *err);
int glm5_flops_52(const dsarl_model_config *config, const dsarl_token_batch *batch, dsarl_model_flops *out,
                  dsarl_error *err);

/* dsarl_model_ops.plan of each table (glm5_plan.c, ABI 1.3): sizes under one rank's layout for `dsarl plan`. */
int glm5_plan_51(const dsarl_model_config *config, const dsarl_parallel *layout, dsarl_model_plan *out,
                 dsarl_error *err);
int glm5_plan_52(const dsarl_model_config *config, const dsarl_parallel *layout, dsarl_model_plan *out,
                 dsarl_error *err);

#endif /* DSARL_GLM5_OPS_H */
