# Suites of the multi-process paths, run under mpirun (label mpi). Open MPI in CI: --oversubscribe lets 4 ranks
# share 2 cores, and the OMPI_ALLOW_RUN_AS_ROOT pair lets a root CI user launch them.
dsarl_add_check_test(check_layout SOURCES check_layout.c LABELS unit)

if(DSARL_HAVE_MPI AND MPIEXEC_EXECUTABLE)
  execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _dsarl_mpiexec_version ERROR_QUIET)
  set(DSARL_MPIEXEC_FLAGS "")
  if(_dsarl_mpiexec_version MATCHES "Open MPI|OpenRTE")
    set(DSARL_MPIEXEC_FLAGS --oversubscribe)
  endif()
  set(DSARL_MPI_TEST_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
      CK_FORK=no)

  # dsarl_add_mpi_test(<name> NP <n> COMMAND <target or program> [args...] [TIMEOUT s])
  function(dsarl_add_mpi_test name)
    cmake_parse_arguments(T "" "NP;TIMEOUT" "COMMAND" ${ARGN})
    if(NOT T_TIMEOUT)
      set(T_TIMEOUT 300)
    endif()
    add_test(NAME ${name} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${T_NP} ${DSARL_MPIEXEC_FLAGS}
             ${T_COMMAND})
    set_tests_properties(${name} PROPERTIES LABELS mpi TIMEOUT ${T_TIMEOUT} SKIP_RETURN_CODE 77
                         ENVIRONMENT "${DSARL_MPI_TEST_ENV};CK_DEFAULT_TIMEOUT=${T_TIMEOUT}")
  endfunction()

  if(TARGET dsarl-device-cpu-objects)
    add_executable(check_comm_mpi check_comm_mpi.c)
    set_target_properties(check_comm_mpi PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests")
    target_link_libraries(check_comm_mpi PRIVATE dsarl dsarl_internal PkgConfig::CHECK dsarl-device-cpu-objects m)
    target_compile_definitions(check_comm_mpi PRIVATE _GNU_SOURCE)
    dsarl_add_mpi_test(comm_mpi_np2 NP 2 COMMAND $<TARGET_FILE:check_comm_mpi> TIMEOUT 120)
    dsarl_add_mpi_test(comm_mpi_np4 NP 4 COMMAND $<TARGET_FILE:check_comm_mpi> TIMEOUT 120)
  endif()
endif()

# Tensor and sequence parallelism inside the glm5 model: TP2 and TP2 x DP2 against the one-process model.
if(DSARL_HAVE_MPI AND MPIEXEC_EXECUTABLE AND TARGET dsarl-glm5-objects AND TARGET dsarl-dsa-reference-objects
   AND TARGET dsarl-generation-native-objects)
  add_executable(check_glm5_tp_mpi check_glm5_tp_mpi.c)
  set_target_properties(check_glm5_tp_mpi PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests")
  target_link_libraries(check_glm5_tp_mpi PRIVATE dsarl dsarl_internal PkgConfig::CHECK dsarl-glm5-objects
                        dsarl-generation-native-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects PkgConfig::JANSSON m)
  target_compile_definitions(check_glm5_tp_mpi PRIVATE _GNU_SOURCE)
  dsarl_add_mpi_test(glm5_tp_mpi_np2 NP 2 COMMAND $<TARGET_FILE:check_glm5_tp_mpi> TIMEOUT 120)
  dsarl_add_mpi_test(glm5_tp_mpi_np4 NP 4 COMMAND $<TARGET_FILE:check_glm5_tp_mpi> TIMEOUT 120)
endif()
