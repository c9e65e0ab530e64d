# GPU suites (label gpu): the CUDA device against the CPU device, the tilelang DSA backend against the reference
# backend, and the glm5 model on cuda against the CPU run. Separate executables run without fork; each exits 77
# ("skipped", with the reason printed) when no GPU is visible, so CI (nvcc, no GPU) reports them skipped.
if(TARGET dsarl-device-cuda-objects AND TARGET dsarl-device-cpu-objects)
  dsarl_add_check_test(check_device_cuda SOURCES check_device_cuda.c LABELS gpu NOFORK TIMEOUT 300
    LIBS dsarl-device-cuda-objects dsarl-device-cpu-objects)
endif()
if(TARGET dsarl-dsa-tilelang-objects AND TARGET dsarl-dsa-reference-objects)
  dsarl_add_check_test(check_dsa_tilelang SOURCES check_dsa_tilelang.c LABELS gpu NOFORK TIMEOUT 600
    LIBS dsarl-dsa-tilelang-objects dsarl-device-cuda-objects dsarl-dsa-reference-objects)
endif()

if(TARGET dsarl-glm5-objects AND TARGET dsarl-dsa-tilelang-objects)
  dsarl_add_check_test(check_glm5_cuda SOURCES check_glm5_cuda.c LABELS gpu NOFORK TIMEOUT 300
    LIBS dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects dsarl-device-cuda-objects
         dsarl-dsa-tilelang-objects PkgConfig::JANSSON)
endif()

# The Hopper wgmma sparse MLA forward (tilelang backend) against the reference backend at GLM-5 dims.
if(TARGET dsarl-dsa-tilelang-objects AND TARGET dsarl-dsa-reference-objects)
  dsarl_add_check_test(check_dsa_mla_sm90 SOURCES check_dsa_mla_sm90.c LABELS gpu NOFORK TIMEOUT 600
    LIBS dsarl-dsa-tilelang-objects dsarl-device-cuda-objects dsarl-dsa-reference-objects)
endif()

# The tilelang backend's two-kernel indexer_topk (tensor-core scores + radix select) against the reference backend.
if(TARGET dsarl-dsa-tilelang-objects AND TARGET dsarl-dsa-reference-objects)
  dsarl_add_check_test(check_dsa_indexer_fast SOURCES check_dsa_indexer_fast.c LABELS gpu NOFORK TIMEOUT 600
    LIBS dsarl-dsa-tilelang-objects dsarl-device-cuda-objects dsarl-dsa-reference-objects)
endif()

# The cudnn DSA backend (cuDNN graphs + hand-overs to tilelang) against the reference backend, every op and route.
if(TARGET dsarl-dsa-cudnn-objects AND TARGET dsarl-dsa-reference-objects)
  dsarl_add_check_test(check_dsa_cudnn SOURCES check_dsa_cudnn.c LABELS gpu NOFORK TIMEOUT 600
    LIBS dsarl-dsa-cudnn-objects dsarl-dsa-tilelang-objects dsarl-device-cuda-objects dsarl-dsa-reference-objects)
  # the cudnn backend finds tilelang through a registry: the suite loads the built plugin into one of its own
  target_compile_definitions(check_dsa_cudnn PRIVATE DSARL_TEST_TILELANG_SO="$<TARGET_FILE:dsarl-dsa-tilelang>")
  add_dependencies(check_dsa_cudnn dsarl-dsa-tilelang)
endif()
# ... and the glm5 model step with dsa_kernel_backend=cudnn (a third case of check_glm5_cuda).
if(TARGET check_glm5_cuda AND TARGET dsarl-dsa-cudnn-objects)
  target_link_libraries(check_glm5_cuda PRIVATE dsarl-dsa-cudnn-objects)
  target_compile_definitions(check_glm5_cuda PRIVATE DSARL_TEST_CUDNN=1
                             DSARL_TEST_TILELANG_SO="$<TARGET_FILE:dsarl-dsa-tilelang>")
  add_dependencies(check_glm5_cuda dsarl-dsa-tilelang)
endif()

# The same seed recipes on the GPU with their own dsa_kernel_backend (cudnn); skipped (77) without a GPU.
if(TARGET dsarl-dsa-cudnn)
  add_test(NAME seed_recipes_tiny_cuda COMMAND bash "${CMAKE_CURRENT_SOURCE_DIR}/cli/test_seed_recipes_tiny.sh"
           "${CMAKE_BINARY_DIR}" "${PROJECT_SOURCE_DIR}" cuda)
  set_tests_properties(seed_recipes_tiny_cuda PROPERTIES LABELS gpu TIMEOUT 600 SKIP_RETURN_CODE 77)
endif()

# The Hopper wgmma sparse MLA backward (tilelang backend, opt-in) against the reference backend at GLM-5 dims.
if(TARGET dsarl-dsa-tilelang-objects AND TARGET dsarl-dsa-reference-objects)
  dsarl_add_check_test(check_dsa_mla_bwd_sm90 SOURCES check_dsa_mla_bwd_sm90.c LABELS gpu NOFORK TIMEOUT 600
    LIBS dsarl-dsa-tilelang-objects dsarl-device-cuda-objects dsarl-dsa-reference-objects)
endif()

# The CUDA device's collectives on NCCL (bf16 and f32, every slot). Started alone it runs on the NULL group (a
# communicator of one); under mpirun -np 1 on the world group of a real layout (MPI bootstrap of the NCCL id). Both
# exit 77 without a GPU. With more GPUs, `mpirun -np <GPUs> tests/check_device_cuda_comm` runs it across them.
if(TARGET dsarl-device-cuda-objects)
  dsarl_add_check_test(check_device_cuda_comm SOURCES check_device_cuda_comm.c LABELS gpu NOFORK TIMEOUT 300
    LIBS dsarl-device-cuda-objects)
  if(DSARL_HAVE_MPI AND MPIEXEC_EXECUTABLE)
    add_test(NAME device_cuda_comm_mpi_np1
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 $<TARGET_FILE:check_device_cuda_comm>)
    set_tests_properties(device_cuda_comm_mpi_np1 PROPERTIES LABELS gpu TIMEOUT 300 SKIP_RETURN_CODE 77
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;CK_FORK=no;CK_DEFAULT_TIMEOUT=300")
  endif()
endif()

# `dsarl logits` and `dsarl generate` on the GPU (--device cuda --dsa tilelang|cudnn --dtype f32|bf16) against the
# transformers fixtures; the same source as check_glm5_cli, built with its GPU cases.
if(TARGET dsarl-device-cuda AND TARGET dsarl-dsa-cudnn AND TARGET dsarl-model-glm5)
  dsarl_add_check_test(check_glm5_cli_cuda SOURCES check_glm5_cli.c LABELS gpu TIMEOUT 600 LIBS PkgConfig::JANSSON)
  target_compile_definitions(check_glm5_cli_cuda PRIVATE DSARL_TEST_CUDA=1)
  add_dependencies(check_glm5_cli_cuda dsarl_cli dsarl-model-glm5 dsarl-device-cuda dsarl-dsa-tilelang
                   dsarl-dsa-cudnn)
endif()

# The generation path on the GPU: the cuda sample_filtered against the CPU op, and the native engine's paged cache
# against its contiguous cache on glm5 (cuda, tilelang). Written against the CPU op so it runs unchanged on a GPU.
if(TARGET dsarl-device-cuda-objects AND TARGET dsarl-generation-native-objects AND TARGET dsarl-dsa-tilelang-objects)
  dsarl_add_check_test(check_generation_cuda SOURCES check_generation_cuda.c LABELS gpu NOFORK TIMEOUT 300
    LIBS dsarl-generation-native-objects dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects
         dsarl-device-cuda-objects dsarl-dsa-tilelang-objects PkgConfig::JANSSON)
endif()
