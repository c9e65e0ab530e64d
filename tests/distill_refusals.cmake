# On-policy distillation's refusal of parallel layouts (the recipe refusals run in the errors catalogue).
if(TARGET dsarl-algorithm-distillation-objects)
  dsarl_add_check_test(check_distill_refusals SOURCES check_distill_refusals.c LABELS unit
                       LIBS dsarl-algorithm-distillation-objects dsarl-algorithm-grpo-objects PkgConfig::JANSSON
                       TIMEOUT 60)
  target_include_directories(check_distill_refusals PRIVATE ${PROJECT_SOURCE_DIR}/core/src)
endif()
