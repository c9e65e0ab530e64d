# GRPO algorithm (algorithms/grpo): advantages and DAPO reward options, ClippedPGLoss with its gradient,
# recipe keys / config validation and the plugin entry. The suites link the plugin's object library directly.
if(TARGET dsarl-algorithm-grpo-objects)
  dsarl_add_check_test(check_grpo_advantage SOURCES check_grpo_advantage.c LABELS unit
                       LIBS dsarl-algorithm-grpo-objects TIMEOUT 60)
  dsarl_add_check_test(check_grpo_loss SOURCES check_grpo_loss.c LABELS unit
                       LIBS dsarl-algorithm-grpo-objects TIMEOUT 120)
  dsarl_add_check_test(check_grpo_config SOURCES check_grpo_config.c LABELS unit
                       LIBS dsarl-algorithm-grpo-objects ${CMAKE_DL_LIBS} TIMEOUT 120)
  # test_plugin_run dlopen()s the built plugin itself.
  add_dependencies(check_grpo_config dsarl-algorithm-grpo)
  target_compile_definitions(check_grpo_config PRIVATE GRPO_PLUGIN_PATH="$<TARGET_FILE:dsarl-algorithm-grpo>")
endif()
