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

# DSARL_STATIC_DEPS (top-level option): Check and its subunit statically, so the gpu suites run on a machine
# without libcheck (the GPU machine). The imported target lives in this directory's scope.
if(DSARL_STATIC_DEPS AND TARGET PkgConfig::CHECK)
  find_library(DSARL_CHECK_STATIC NAMES libcheck_pic.a libcheck.a REQUIRED)
  find_library(DSARL_SUBUNIT_STATIC NAMES libsubunit.a REQUIRED)
  set_target_properties(PkgConfig::CHECK PROPERTIES
    INTERFACE_LINK_LIBRARIES "${DSARL_CHECK_STATIC};${DSARL_SUBUNIT_STATIC};m;rt;Threads::Threads"
    INTERFACE_LINK_OPTIONS "" INTERFACE_LINK_DIRECTORIES "")
endif()
