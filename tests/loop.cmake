# Run logger (core/src/metrics*.c) and the GRPO training loop (algorithms/grpo/grpo_train*.c).
dsarl_add_check_test(check_metrics SOURCES check_metrics.c LABELS unit LIBS PkgConfig::JANSSON TIMEOUT 60)
# TensorBoard's own reader loads what the logger wrote (skipped, exit 77, without the tensorboard package).
# tools/install-deps installs tensorboard into .venv-tools; a Python that has it already works too.
find_package(Python3 COMPONENTS Interpreter QUIET)
set(DSARL_TOOLS_PYTHON ${Python3_EXECUTABLE})
if(EXISTS "${PROJECT_SOURCE_DIR}/.venv-tools/bin/python")
  set(DSARL_TOOLS_PYTHON "${PROJECT_SOURCE_DIR}/.venv-tools/bin/python")
endif()
if(DSARL_TOOLS_PYTHON)
  add_test(NAME tensorboard_reader COMMAND sh -c
    "d=$(mktemp -d) && \"$0\" --write-fixture \"$d/exp\" && \"$1\" \"$2\" \"$d/exp\"; rc=$?; rm -rf \"$d\"; exit $rc"
    $<TARGET_FILE:check_metrics> ${DSARL_TOOLS_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/tensorboard_check.py)
  set_tests_properties(tensorboard_reader PROPERTIES LABELS unit TIMEOUT 120 SKIP_RETURN_CODE 77)
endif()
# tools/plot: PNG curves from metrics.jsonl (skipped without matplotlib).
add_test(NAME tools_plot COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/plot_check.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(tools_plot PROPERTIES LABELS unit TIMEOUT 120 SKIP_RETURN_CODE 77)
# The GRPO loop end to end on a micro run of the tiny recipe (plugins loaded from the build tree).
if(TARGET dsarl-algorithm-grpo-objects)
  dsarl_add_check_test(check_grpo_run SOURCES check_grpo_run.c LABELS unit
                       LIBS dsarl-algorithm-grpo-objects PkgConfig::JANSSON TIMEOUT 600)
  target_include_directories(check_grpo_run PRIVATE ${PROJECT_SOURCE_DIR}/core/src)
  add_dependencies(check_grpo_run dsarl-algorithm-grpo dsarl-model-glm5 dsarl-device-cpu dsarl-dsa-reference
                   dsarl-environment-math)
endif()
# `dsarl run` of the tiny GRPO recipe (2 steps), and SIGTERM -> checkpoint -> resume through the CLI.
add_test(NAME grpo_cli_run COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/grpo_cli_check.sh ${CMAKE_BINARY_DIR}
         ${PROJECT_SOURCE_DIR})
set_tests_properties(grpo_cli_run PROPERTIES LABELS unit TIMEOUT 300 SKIP_RETURN_CODE 77)
# NeMo RL's GRPO variants (GSPO, CISPO, REINFORCE, VAPO, Reinforce++, GDPO, masking) through `dsarl run`, and the
# combinations it forbids refused with exit status 3.
add_test(NAME grpo_cli_variants COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/grpo_variants_check.sh ${CMAKE_BINARY_DIR}
         ${PROJECT_SOURCE_DIR})
set_tests_properties(grpo_cli_variants PROPERTIES LABELS unit TIMEOUT 300 SKIP_RETURN_CODE 77)
# The tiny GRPO recipe with the contiguous, paged and prefix-shared generation caches: equal metrics.
add_test(NAME grpo_paged_cache COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_grpo_paged_cache.sh ${CMAKE_BINARY_DIR}
         ${PROJECT_SOURCE_DIR})
set_tests_properties(grpo_paged_cache PROPERTIES LABELS unit TIMEOUT 300)
# Generation on its own refitted weight copy and asynchronous GRPO against the one-process colocated run.
if(TARGET dsarl-algorithm-grpo-objects)
  dsarl_add_check_test(check_grpo_async SOURCES check_grpo_async.c LABELS unit
                       LIBS dsarl-algorithm-grpo-objects PkgConfig::JANSSON TIMEOUT 300)
  target_include_directories(check_grpo_async PRIVATE ${PROJECT_SOURCE_DIR}/core/src ${PROJECT_SOURCE_DIR}/algorithms/grpo)
  add_dependencies(check_grpo_async dsarl-algorithm-grpo dsarl-model-glm5 dsarl-device-cpu dsarl-dsa-reference
                   dsarl-environment-math)
endif()
