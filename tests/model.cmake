# Suites of the model area: the CPU device plugin and the glm_moe_dsa model plugins.
if(TARGET dsarl-device-cpu-objects)
  dsarl_add_check_test(check_device_cpu SOURCES check_device_cpu.c LIBS dsarl-device-cpu-objects LABELS unit)
endif()
if(TARGET dsarl-glm5-objects AND TARGET dsarl-dsa-reference-objects)
  dsarl_add_check_test(check_glm5_hf SOURCES check_glm5_hf.c
    LIBS dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects PkgConfig::JANSSON LABELS unit)
  # FP8 checkpoints dequantized on load and MTP tensors carried through saves (tools/make_glm5_fp8_fixture.py)
  dsarl_add_check_test(check_glm5_fp8 SOURCES check_glm5_fp8.c
    LIBS dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects PkgConfig::JANSSON LABELS unit)
endif()
if(TARGET dsarl-glm5-objects AND TARGET dsarl-dsa-reference-objects)
  dsarl_add_check_test(check_glm5_config SOURCES check_glm5_config.c
    LIBS dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects PkgConfig::JANSSON LABELS unit)
endif()
if(TARGET dsarl-glm5-objects AND TARGET dsarl-dsa-reference-objects)
  dsarl_add_check_test(check_glm5_io SOURCES check_glm5_io.c
    LIBS dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects PkgConfig::JANSSON LABELS unit)
endif()
if(TARGET dsarl-glm5-objects AND TARGET dsarl-dsa-reference-objects)
  dsarl_add_check_test(check_glm5_grad SOURCES check_glm5_grad.c
    LIBS dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects PkgConfig::JANSSON LABELS unit)
  # multi-token prediction in training: finite differences, a hand-computed loss, refusals, saves
  dsarl_add_check_test(check_glm5_mtp SOURCES check_glm5_mtp.c
    LIBS dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects PkgConfig::JANSSON LABELS unit)
  dsarl_add_check_test(check_glm5_train SOURCES check_glm5_train.c
    LIBS dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects PkgConfig::JANSSON LABELS unit)
  dsarl_add_check_test(check_selection SOURCES check_selection.c
    LIBS dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects PkgConfig::JANSSON LABELS unit)
endif()
if(TARGET dsarl-model-glm5 AND TARGET dsarl-dsa-reference)
  dsarl_add_check_test(check_glm5_cli SOURCES check_glm5_cli.c LIBS PkgConfig::JANSSON LABELS unit)
  add_dependencies(check_glm5_cli dsarl_cli dsarl-model-glm5 dsarl-device-cpu dsarl-dsa-reference)
endif()
# The per-head (non-absorbed) attention form of the glm5 model: transformers fixtures, both forms against each
# other, finite differences and the dsa_attention_form recipe key.
if(TARGET dsarl-glm5-objects AND TARGET dsarl-dsa-reference-objects)
  dsarl_add_check_test(check_glm5_headwise SOURCES check_glm5_headwise.c
    LIBS dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects PkgConfig::JANSSON LABELS unit)
endif()
# `dsarl run` with dsa_attention_form: SFT in both forms logs the same numbers, GRPO in the per-head form, bad value.
add_test(NAME glm5_headwise_cli COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/glm5_headwise_cli_check.sh ${CMAKE_BINARY_DIR}
         ${PROJECT_SOURCE_DIR})
set_tests_properties(glm5_headwise_cli PROPERTIES LABELS unit TIMEOUT 300 SKIP_RETURN_CODE 77)
