# Plugins the loader tests load: one good, one per refusal. They live in tests/plugins/<case>/, never in
# lib/dsarl/plugins, so they do not show up in `dsarl plugins`.
function(dsarl_test_plugin case file)
  add_library(test-plugin-${case} MODULE plugins/test_plugin.c)
  set_target_properties(test-plugin-${case} PROPERTIES PREFIX "" OUTPUT_NAME "${file}"
                        LIBRARY_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests/plugins/${case}")
  target_link_libraries(test-plugin-${case} PRIVATE dsarl)
  target_link_options(test-plugin-${case} PRIVATE "LINKER:--no-undefined")
  target_compile_definitions(test-plugin-${case} PRIVATE ${ARGN})
  add_dependencies(check_registry test-plugin-${case})
endfunction()

dsarl_add_check_test(check_registry SOURCES check_registry.c LABELS unit)
dsarl_test_plugin(good dsarl-environment-testgood)
dsarl_test_plugin(good2 dsarl-environment-testgood2 TEST_ENV_NAME="testgood")     # same (kind, name): duplicate
dsarl_test_plugin(abi_major dsarl-environment-abimajor TEST_ABI_MAJOR=99 TEST_ENV_NAME="abimajor")
dsarl_test_plugin(abi_minor dsarl-environment-abiminor TEST_ABI_MINOR=99 TEST_ENV_NAME="abiminor")
dsarl_test_plugin(build_sig dsarl-environment-buildsig TEST_WRONG_BUILD_SIG=1
                  TEST_ENV_NAME="buildsig")
dsarl_test_plugin(small_desc dsarl-environment-smalldesc TEST_DESC_SIZE=16 TEST_ENV_NAME="smalldesc")
dsarl_test_plugin(small_ops dsarl-environment-smallops TEST_SMALL_OPS=1 TEST_ENV_NAME="smallops")
dsarl_test_plugin(init_fails dsarl-environment-initfails TEST_INIT_FAILS=1 TEST_ENV_NAME="initfails")
dsarl_test_plugin(no_desc dsarl-environment-nodesc TEST_NO_DESCRIPTOR=1 TEST_ENV_NAME="nodesc")

# Out-of-tree DSA backends with a NULL mandatory op, each alone in its directory: `dsarl plugins --plugin-path DIR`
# must print one refusal line naming the slot (tests/cli/test_plugin_refusal.sh).
foreach(case null_loss null_create)
  string(TOUPPER "${case}" flag)
  add_library(test-plugin-dsa-${case} MODULE plugins/test_dsa_plugin.c)
  set_target_properties(test-plugin-dsa-${case} PROPERTIES PREFIX "" OUTPUT_NAME "dsarl-dsa-nullslot"
                        LIBRARY_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests/plugins/dsa_${case}")
  target_link_libraries(test-plugin-dsa-${case} PRIVATE dsarl)
  target_link_options(test-plugin-dsa-${case} PRIVATE "LINKER:--no-undefined")
  target_compile_definitions(test-plugin-dsa-${case} PRIVATE TEST_${flag}=1)
  add_dependencies(check_registry test-plugin-dsa-${case})
endforeach()
add_test(NAME plugin_refusal COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/cli/test_plugin_refusal.sh" "${CMAKE_BINARY_DIR}")
set_tests_properties(plugin_refusal PROPERTIES LABELS unit TIMEOUT 60)

# The installed test kit, used through installed headers only (no dsarl_internal): the reference DSA backend on
# the cpu device, found by the real loader beside libdsarl.
add_executable(check_testkit check_testkit.c)
set_target_properties(check_testkit PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests")
target_link_libraries(check_testkit PRIVATE dsarl PkgConfig::CHECK m)
add_test(NAME check_testkit COMMAND check_testkit)
set_tests_properties(check_testkit PROPERTIES LABELS unit TIMEOUT 120 SKIP_RETURN_CODE 77)

# World-writable plugins and directories are refused before dlopen, bad search-path entries are reported, and a
# relative plugins.path is found beside its recipe (tests/cli/test_plugin_trust.sh).
add_test(NAME plugin_trust COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/cli/test_plugin_trust.sh" "${CMAKE_BINARY_DIR}")
set_tests_properties(plugin_trust PROPERTIES LABELS unit TIMEOUT 60)
