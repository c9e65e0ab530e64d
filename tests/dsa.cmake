# DSA kernel backends. The reference backend's suite links its object library and calls the ops table directly.
if(TARGET dsarl-dsa-reference-objects)
  dsarl_add_check_test(check_dsa_reference SOURCES check_dsa_reference.c LABELS unit
                       LIBS dsarl-dsa-reference-objects TIMEOUT 300)

  # The built plugin, loaded through its ABI from Python, against PyTorch autograd in float64. Skipped (77) when
  # torch or numpy is missing; not registered in sanitizer builds (an ASan plugin cannot load into python3).
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND AND NOT DSARL_SANITIZE)
    add_test(NAME dsa_reference_torch
             COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/dsa_reference_check.py
                     --plugin $<TARGET_FILE:dsarl-dsa-reference>)
    set_tests_properties(dsa_reference_torch PROPERTIES LABELS unit TIMEOUT 120 SKIP_RETURN_CODE 77)
  endif()
endif()

# The reference backend's per-head (non-absorbed) attention ops against its absorbed ops on the same MLA problem.
if(TARGET dsarl-dsa-reference-objects)
  dsarl_add_check_test(check_dsa_headwise SOURCES check_dsa_headwise.c LABELS unit
                       LIBS dsarl-dsa-reference-objects TIMEOUT 300)
endif()

# The cudnn backend's environment switches: malformed values refused before cuDNN or a GPU is touched (runs in CI).
if(TARGET dsarl-dsa-cudnn-objects)
  dsarl_add_check_test(check_dsa_cudnn_env SOURCES check_dsa_cudnn_env.c LABELS unit
    LIBS dsarl-dsa-cudnn-objects dsarl-dsa-tilelang-objects dsarl-device-cuda-objects)
endif()
