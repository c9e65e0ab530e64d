# Suites of `dsarl plan`: the arithmetic on a hand-computed glm_moe_dsa config and every refusal (check_plan), and
# the seed recipes planned at full size through the binary (plan_cli: they fit on H100 80 GB as NeMo RL runs them).
if(TARGET dsarl-glm5-objects AND TARGET dsarl-dsa-reference-objects)
  dsarl_add_check_test(check_plan SOURCES check_plan.c
    LIBS dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects PkgConfig::JANSSON LABELS unit)
endif()
if(TARGET dsarl-model-glm5)
  add_test(NAME plan_cli COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/cli/test_plan.sh" "${CMAKE_BINARY_DIR}"
           "${PROJECT_SOURCE_DIR}")
  set_tests_properties(plan_cli PROPERTIES LABELS unit TIMEOUT 120)
endif()
