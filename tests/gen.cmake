# Suites of the generation area: the native engine (KV cache, prefill/decode, sampling) on the glm5 model.
if(TARGET dsarl-generation-native-objects AND TARGET dsarl-glm5-objects AND TARGET dsarl-dsa-reference-objects)
  dsarl_add_check_test(check_generation SOURCES check_generation.c
    LIBS dsarl-generation-native-objects dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects
         PkgConfig::JANSSON LABELS unit)
  dsarl_add_check_test(check_generation_paged SOURCES check_generation_paged.c
    LIBS dsarl-generation-native-objects dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects
         PkgConfig::JANSSON LABELS unit)
  dsarl_add_check_test(check_routing_replay SOURCES check_routing_replay.c
    LIBS dsarl-generation-native-objects dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects
         PkgConfig::JANSSON LABELS unit)
  # MoE rows grouped on the device (moe_group_padded) against the host grouping: training passes, decode, replay
  dsarl_add_check_test(check_glm5_moe_group SOURCES check_glm5_moe_group.c
    LIBS dsarl-generation-native-objects dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects
         PkgConfig::JANSSON LABELS unit)
  # test_cli_sampling runs the built binary with the plugins it loads
  add_dependencies(check_generation dsarl_cli dsarl-generation-native dsarl-model-glm5
                   dsarl-device-cpu dsarl-dsa-reference)
endif()
