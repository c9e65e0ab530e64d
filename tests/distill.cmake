# On-policy distillation (algorithms/distillation): DistillationLossFn by hand and by finite differences, the
# teacher's top-k; and a short run on the tiny GLM-5.2 recipe whose KL to a larger teacher falls.
if(TARGET dsarl-algorithm-distillation-objects)
  dsarl_add_check_test(check_distill_loss SOURCES check_distill_loss.c LABELS unit
                       LIBS dsarl-algorithm-distillation-objects dsarl-algorithm-grpo-objects TIMEOUT 60)
endif()
if(TARGET dsarl-algorithm-distillation-objects AND TARGET dsarl-model-glm5)
  dsarl_add_check_test(check_distill_run SOURCES check_distill_run.c LABELS unit
                       LIBS dsarl-algorithm-distillation-objects dsarl-algorithm-grpo-objects PkgConfig::JANSSON
                       TIMEOUT 300)
  target_include_directories(check_distill_run PRIVATE ${PROJECT_SOURCE_DIR}/core/src)
  add_dependencies(check_distill_run dsarl-algorithm-distillation dsarl-model-glm5 dsarl-device-cpu
                   dsarl-dsa-reference dsarl-environment-math dsarl-generation-native)
endif()
