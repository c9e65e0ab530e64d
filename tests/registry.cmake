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
