# hf_math_verify: agreement with Python math-verify on committed labelled pairs, unit cases, the NeMo RL recipe.
if(TARGET dsarl-environment-math-objects)
  add_executable(math_hf_agreement math_hf_agreement.c)
  set_target_properties(math_hf_agreement PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests")
  target_link_libraries(math_hf_agreement PRIVATE dsarl-environment-math-objects PkgConfig::JANSSON m)
endif()
if(TARGET dsarl-environment-math-objects)
  dsarl_add_check_test(check_math_hf_verify SOURCES check_math_hf_verify.c LABELS unit
                       LIBS dsarl-environment-math-objects)
  # 10,000 pairs labelled by Python math-verify (tests/fixtures/math_verify/README.md); the C verifier must agree on
  # at least the rate measured when they were made (docs/math_verify.md lists what it gets wrong)
  add_test(NAME math_hf_agreement_10k
           COMMAND math_hf_agreement "${PROJECT_SOURCE_DIR}/tests/fixtures/math_verify/pairs_10k.jsonl"
                   --min-rate 0.995)
  set_tests_properties(math_hf_agreement_10k PROPERTIES LABELS unit TIMEOUT 120)
endif()
add_test(NAME nemo_glm51_hf_math_verify
         COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/cli/test_nemo_hf_math_verify.sh" "${CMAKE_BINARY_DIR}"
                 "${PROJECT_SOURCE_DIR}")
set_tests_properties(nemo_glm51_hf_math_verify PROPERTIES LABELS unit TIMEOUT 120)
