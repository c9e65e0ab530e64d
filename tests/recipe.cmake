# Recipe system and schema validation (core/src/recipe*.c, core/src/schema.c).
dsarl_add_check_test(check_recipe SOURCES check_recipe.c LABELS unit TIMEOUT 60)
dsarl_add_check_test(check_schema SOURCES check_schema.c LABELS unit TIMEOUT 60)
