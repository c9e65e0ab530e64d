# hf_math_verify: agreement with Python math-verify on committed labelled pairs, unit cases, the NeMo RL recipe.
if(TARGET dsarl-environment-math-objects)
  add_executable(math_hf_agreement math_hf_agreement.c)
  set_target_properties(math_hf_agreement PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests")
  target_link_libraries(math_hf_agreement PRIVATE dsarl-environment-math-objects PkgConfig::JANSSON m)
endif()
