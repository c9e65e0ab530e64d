# The dsarl binary end to end (shell-driven; needs bash).
add_test(NAME cli COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/cli/test_cli.sh" "${CMAKE_BINARY_DIR}"
         "${PROJECT_SOURCE_DIR}")
set_tests_properties(cli PROPERTIES LABELS unit TIMEOUT 300)

# Install into a temporary prefix and build/load/select the out-of-tree example plugin against it.
add_test(NAME install_example COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/cli/test_install_example.sh"
         "${CMAKE_BINARY_DIR}" "${PROJECT_SOURCE_DIR}")
set_tests_properties(install_example PROPERTIES LABELS unit TIMEOUT 300)

# `dsarl bench train|generate` on the cpu device with the tiny fixture config: FLOP count, figures, bad options.
add_test(NAME bench_model COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/cli/test_bench_model.sh" "${CMAKE_BINARY_DIR}"
         "${PROJECT_SOURCE_DIR}")
set_tests_properties(bench_model PROPERTIES LABELS unit TIMEOUT 120)

# NeMo RL's GLM recipes as shipped, at tiny scale (tools/run-seed-recipes-tiny): 2 GRPO steps each on the cpu.
add_test(NAME seed_recipes_tiny COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/cli/test_seed_recipes_tiny.sh"
         "${CMAKE_BINARY_DIR}" "${PROJECT_SOURCE_DIR}" cpu)
# 76 s in a plain build, 247 s alone under ASan+UBSan (more beside other suites at -j2)
set_tests_properties(seed_recipes_tiny PROPERTIES LABELS unit TIMEOUT 600)

# docs/errors.md, every entry run as written: its exit status and its message (about a minute on 2 cores).
add_test(NAME errors_catalogue COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/cli/test_errors_catalogue.sh"
         "${CMAKE_BINARY_DIR}" "${PROJECT_SOURCE_DIR}")
set_tests_properties(errors_catalogue PROPERTIES LABELS slow TIMEOUT 300)
