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

  # a broken rank ends the job: the watchdog, a SIGKILLed rank, a refused layout
  add_executable(mpi_stall_probe mpi_stall_probe.c)
  set_target_properties(mpi_stall_probe PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests")
  target_link_libraries(mpi_stall_probe PRIVATE dsarl dsarl_internal)
  target_compile_definitions(mpi_stall_probe PRIVATE _GNU_SOURCE)
  add_test(NAME mpi_failures COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/cli/test_mpi_failures.sh" "${CMAKE_BINARY_DIR}"
           "${PROJECT_SOURCE_DIR}" ${MPIEXEC_EXECUTABLE} ${DSARL_MPIEXEC_FLAGS})
  set_tests_properties(mpi_failures PROPERTIES LABELS mpi TIMEOUT 300 ENVIRONMENT "${DSARL_MPI_TEST_ENV}")
  # data parallelism: DP training against the one-process run in the same process
  if(TARGET dsarl-glm5-objects AND TARGET dsarl-dsa-reference-objects AND TARGET dsarl-device-cpu-objects)
    add_executable(check_dp_train_mpi check_dp_train_mpi.c)
    set_target_properties(check_dp_train_mpi PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests")
    target_link_libraries(check_dp_train_mpi PRIVATE dsarl dsarl_internal PkgConfig::CHECK dsarl-glm5-objects
                          dsarl-device-cpu-objects dsarl-dsa-reference-objects PkgConfig::JANSSON m)
    target_compile_definitions(check_dp_train_mpi PRIVATE _GNU_SOURCE)
    dsarl_add_mpi_test(dp_train_mpi_np2 NP 2 COMMAND $<TARGET_FILE:check_dp_train_mpi> TIMEOUT 120)
    dsarl_add_mpi_test(dp_train_mpi_np4 NP 4 COMMAND $<TARGET_FILE:check_dp_train_mpi> TIMEOUT 120)
  endif()

  # data-parallel GRPO and SFT through `dsarl run` (the scripts launch mpirun themselves, np 1, 2 and 4) against
  # one process
  add_test(NAME dp_grpo COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/cli/test_dp_grpo.sh" "${CMAKE_BINARY_DIR}"
           "${PROJECT_SOURCE_DIR}" "${MPIEXEC_EXECUTABLE}")
  set_tests_properties(dp_grpo PROPERTIES LABELS mpi TIMEOUT 240 ENVIRONMENT "${DSARL_MPI_TEST_ENV}")
  # a dedicated generation rank (non-colocated generation, sync and async GRPO) against one process and DP2
  add_test(NAME gen_ranks COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/cli/test_gen_ranks.sh" "${CMAKE_BINARY_DIR}"
           "${PROJECT_SOURCE_DIR}" "${MPIEXEC_EXECUTABLE}")
  set_tests_properties(gen_ranks PROPERTIES LABELS mpi TIMEOUT 240 ENVIRONMENT "${DSARL_MPI_TEST_ENV}")
  # pipeline-parallel SFT through `dsarl run` (PP2, resume, refusals) against one process
  add_test(NAME pp_run COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/cli/test_pp_run.sh" "${CMAKE_BINARY_DIR}"
           "${PROJECT_SOURCE_DIR}" "${MPIEXEC_EXECUTABLE}")
  set_tests_properties(pp_run PROPERTIES LABELS mpi TIMEOUT 240 ENVIRONMENT "${DSARL_MPI_TEST_ENV}")
  add_test(NAME dp_grpo_variants COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/cli/test_dp_grpo_variants.sh"
           "${CMAKE_BINARY_DIR}" "${PROJECT_SOURCE_DIR}" "${MPIEXEC_EXECUTABLE}")
  set_tests_properties(dp_grpo_variants PROPERTIES LABELS mpi TIMEOUT 240 ENVIRONMENT "${DSARL_MPI_TEST_ENV}")
  add_test(NAME dp_sft COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/cli/test_dp_sft.sh" "${CMAKE_BINARY_DIR}"
           "${PROJECT_SOURCE_DIR}" "${MPIEXEC_EXECUTABLE}")
  set_tests_properties(dp_sft PROPERTIES LABELS mpi TIMEOUT 240 ENVIRONMENT "${DSARL_MPI_TEST_ENV}")

  # Expert parallelism of the glm5 routed experts: EP2 (-np 2), EP4 and EP2 x EDP2 (-np 4), each rank on its own
  # batch, against the one-process model.
  if(TARGET dsarl-glm5-objects AND TARGET dsarl-dsa-reference-objects AND TARGET dsarl-device-cpu-objects)
    add_executable(check_glm5_ep_mpi check_glm5_ep_mpi.c)
    set_target_properties(check_glm5_ep_mpi PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests")
    target_link_libraries(check_glm5_ep_mpi PRIVATE dsarl dsarl_internal PkgConfig::CHECK dsarl-glm5-objects
                          dsarl-device-cpu-objects dsarl-dsa-reference-objects PkgConfig::JANSSON m)
    target_compile_definitions(check_glm5_ep_mpi PRIVATE _GNU_SOURCE)
    dsarl_add_mpi_test(glm5_ep_mpi_np2 NP 2 COMMAND $<TARGET_FILE:check_glm5_ep_mpi> TIMEOUT 120)
    dsarl_add_mpi_test(glm5_ep_mpi_np4 NP 4 COMMAND $<TARGET_FILE:check_glm5_ep_mpi> TIMEOUT 120)
    dsarl_add_mpi_test(glm5_ep_mpi_np4_ep2 NP 4 COMMAND $<TARGET_FILE:check_glm5_ep_mpi> 2 TIMEOUT 120)
  endif()


  # Hugging Face directories across ranks: each rank reads only its slices of an index + 3 files, the collective
  # save loads in one process, a bad file fails every rank (TP2, EP2, TP2 x EP2 on 2 ranks; TP2 x EP2 x DP2 on 4).
  if(TARGET dsarl-glm5-objects AND TARGET dsarl-device-cpu-objects AND TARGET dsarl-dsa-reference-objects)
    add_executable(check_glm5_hf_mpi check_glm5_hf_mpi.c)
    set_target_properties(check_glm5_hf_mpi PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests")
    target_link_libraries(check_glm5_hf_mpi PRIVATE dsarl dsarl_internal PkgConfig::CHECK PkgConfig::JANSSON
                          dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects m)
    target_compile_definitions(check_glm5_hf_mpi PRIVATE _GNU_SOURCE DSARL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
    dsarl_add_mpi_test(glm5_hf_mpi_tp2 NP 2 COMMAND $<TARGET_FILE:check_glm5_hf_mpi> 2 1 TIMEOUT 60)
    dsarl_add_mpi_test(glm5_hf_mpi_ep2 NP 2 COMMAND $<TARGET_FILE:check_glm5_hf_mpi> 1 2 TIMEOUT 60)
    dsarl_add_mpi_test(glm5_hf_mpi_tp2ep2 NP 2 COMMAND $<TARGET_FILE:check_glm5_hf_mpi> 2 2 TIMEOUT 60)
    dsarl_add_mpi_test(glm5_hf_mpi_np4 NP 4 COMMAND $<TARGET_FILE:check_glm5_hf_mpi> 2 2 TIMEOUT 60)
  endif()

  # `dsarl run` of the tiny GLM-5.2 GRPO recipe under each parallel layout, every metric against one process
  set(DSARL_MPI_LAYOUTS
      "2:policy.megatron_cfg.expert_model_parallel_size=2"
      "4:policy.megatron_cfg.expert_model_parallel_size=4"
      "4:policy.megatron_cfg.expert_model_parallel_size=2"
      "2:policy.megatron_cfg.tensor_model_parallel_size=2,policy.megatron_cfg.sequence_parallel=true"
      "4:policy.megatron_cfg.tensor_model_parallel_size=2,policy.megatron_cfg.sequence_parallel=true"
      "4:policy.megatron_cfg.tensor_model_parallel_size=2,policy.megatron_cfg.sequence_parallel=true,policy.megatron_cfg.expert_model_parallel_size=2"
      # pipeline parallelism (1F1B): the tiny model's layer 3 is an IndexShare shared layer, so 3|1 starts the
      # second stage on it; PP2 alone at np 4 is PP2 x DP2
      "2:policy.megatron_cfg.pipeline_model_parallel_size=2,policy.megatron_cfg.num_layers_in_first_pipeline_stage=3"
      "4:policy.megatron_cfg.pipeline_model_parallel_size=2,policy.megatron_cfg.tensor_model_parallel_size=2,policy.megatron_cfg.sequence_parallel=true"
      "4:policy.megatron_cfg.pipeline_model_parallel_size=2"
      "4:policy.megatron_cfg.pipeline_model_parallel_size=4"
      # interleaved virtual stages: four one-layer chunks, two per rank (the last rank's first feeds the first's
      # second); 4 microbatches per step, a multiple of pp
      "2:policy.megatron_cfg.pipeline_model_parallel_size=2,+policy.megatron_cfg.virtual_pipeline_model_parallel_size=2"
      # pipeline x context parallelism: each stage's cp peers hold their zigzag rows, with and without virtual stages
      "4:policy.megatron_cfg.pipeline_model_parallel_size=2,policy.megatron_cfg.context_parallel_size=2"
      "4:policy.megatron_cfg.pipeline_model_parallel_size=2,+policy.megatron_cfg.virtual_pipeline_model_parallel_size=2,policy.megatron_cfg.context_parallel_size=2"
      "2:policy.megatron_cfg.context_parallel_size=2"
      "4:policy.megatron_cfg.context_parallel_size=2"
      "4:policy.megatron_cfg.context_parallel_size=2,policy.megatron_cfg.expert_model_parallel_size=4"
      "4:policy.megatron_cfg.context_parallel_size=4,policy.make_sequence_length_divisible_by=8"
      "4:policy.megatron_cfg.context_parallel_size=2,policy.megatron_cfg.tensor_model_parallel_size=2,policy.megatron_cfg.sequence_parallel=true,policy.make_sequence_length_divisible_by=8")
  add_test(NAME mpi_grpo_layouts COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/cli/test_mpi_grpo_layouts.sh"
           "${CMAKE_BINARY_DIR}" "${PROJECT_SOURCE_DIR}" ${MPIEXEC_EXECUTABLE} ${DSARL_MPIEXEC_FLAGS} -- ${DSARL_MPI_LAYOUTS})
  set_tests_properties(mpi_grpo_layouts PROPERTIES LABELS mpi TIMEOUT 300 ENVIRONMENT "${DSARL_MPI_TEST_ENV}")
  # SIGKILL of one rank of an EP2 run after a checkpoint; the rerun resumes and equals the uninterrupted run
  add_test(NAME mpi_kill_resume COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/cli/test_mpi_kill_resume.sh"
           "${CMAKE_BINARY_DIR}" "${PROJECT_SOURCE_DIR}" ${MPIEXEC_EXECUTABLE} ${DSARL_MPIEXEC_FLAGS})
  set_tests_properties(mpi_kill_resume PROPERTIES LABELS mpi TIMEOUT 300 ENVIRONMENT "${DSARL_MPI_TEST_ENV}")
endif()

# `mpirun -np 2 dsarl bench comm --device cpu --sizes small`: every collective timed, bandwidths by nccl-tests'
# definitions (tests/cli/test_bench_comm.sh); needs the binary and the cpu device plugin.
if(DSARL_HAVE_MPI AND MPIEXEC_EXECUTABLE AND TARGET dsarl-device-cpu)
  add_test(NAME bench_comm_mpi_np2 COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/cli/test_bench_comm.sh"
           "${CMAKE_BINARY_DIR}" ${MPIEXEC_EXECUTABLE} ${DSARL_MPIEXEC_FLAGS})
  set_tests_properties(bench_comm_mpi_np2 PROPERTIES LABELS mpi TIMEOUT 300 ENVIRONMENT "${DSARL_MPI_TEST_ENV}")
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
  # pipeline parallelism: PP2 and PP2 x TP2 against one process in the same process
  add_executable(check_glm5_pp_mpi check_glm5_pp_mpi.c)
  set_target_properties(check_glm5_pp_mpi PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests")
  target_link_libraries(check_glm5_pp_mpi PRIVATE dsarl dsarl_internal PkgConfig::CHECK dsarl-glm5-objects
                        dsarl-generation-native-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects PkgConfig::JANSSON m)
  target_compile_definitions(check_glm5_pp_mpi PRIVATE _GNU_SOURCE)
  dsarl_add_mpi_test(glm5_pp_mpi_np2 NP 2 COMMAND $<TARGET_FILE:check_glm5_pp_mpi> TIMEOUT 120)
  dsarl_add_mpi_test(glm5_pp_mpi_np4 NP 4 COMMAND $<TARGET_FILE:check_glm5_pp_mpi> TIMEOUT 120)
  dsarl_add_mpi_test(glm5_pp4_mpi_np4 NP 4 COMMAND $<TARGET_FILE:check_glm5_pp_mpi> pp4 TIMEOUT 120)
  dsarl_add_mpi_test(glm5_vpp_mpi_np2 NP 2 COMMAND $<TARGET_FILE:check_glm5_pp_mpi> vpp2 TIMEOUT 120)
  dsarl_add_mpi_test(glm5_vpp_mpi_np4 NP 4 COMMAND $<TARGET_FILE:check_glm5_pp_mpi> vpp2 TIMEOUT 120)
  dsarl_add_mpi_test(glm5_pp_cp_mpi_np4 NP 4 COMMAND $<TARGET_FILE:check_glm5_pp_mpi> cp2 TIMEOUT 120)
endif()

# Context parallelism of the glm5 passes: CP2 and CP2 x EP2 (-np 2), CP2 x TP2 and CP4 (-np 4), against one process
# (arguments: tp cp [ep]).
if(TEST glm5_tp_mpi_np2)
  add_executable(check_glm5_cp_mpi check_glm5_cp_mpi.c)
  set_target_properties(check_glm5_cp_mpi PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests")
  target_link_libraries(check_glm5_cp_mpi PRIVATE dsarl dsarl_internal PkgConfig::CHECK dsarl-glm5-objects
                        dsarl-generation-native-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects PkgConfig::JANSSON m)
  target_compile_definitions(check_glm5_cp_mpi PRIVATE _GNU_SOURCE)
  dsarl_add_mpi_test(glm5_cp_mpi_cp2 NP 2 COMMAND $<TARGET_FILE:check_glm5_cp_mpi> 1 2 TIMEOUT 120)
  dsarl_add_mpi_test(glm5_cp_mpi_cp2_ep2 NP 2 COMMAND $<TARGET_FILE:check_glm5_cp_mpi> 1 2 2 TIMEOUT 120)
  dsarl_add_mpi_test(glm5_cp_mpi_tp2_cp2 NP 4 COMMAND $<TARGET_FILE:check_glm5_cp_mpi> 2 2 TIMEOUT 120)
  dsarl_add_mpi_test(glm5_cp_mpi_cp4 NP 4 COMMAND $<TARGET_FILE:check_glm5_cp_mpi> 1 4 TIMEOUT 120)
endif()

# The two tests that SIGKILL a rank find it among the running `dsarl run` processes: alone, so they never pick
# another test's rank.
if(TEST mpi_failures AND TEST mpi_kill_resume)
  set_tests_properties(mpi_failures mpi_kill_resume PROPERTIES RUN_SERIAL TRUE)
endif()
