# Multi-turn tool use through the GRPO loop: a scripted policy with the calculator environment (one step of the
# tiny calculator recipe; the plugins are loaded from the build tree).
if(TARGET dsarl-algorithm-grpo-objects)
  dsarl_add_check_test(check_grpo_tool_episodes SOURCES check_grpo_tool_episodes.c LABELS unit
                       LIBS dsarl-algorithm-grpo-objects PkgConfig::JANSSON TIMEOUT 120)
  target_include_directories(check_grpo_tool_episodes PRIVATE ${PROJECT_SOURCE_DIR}/core/src)
  add_dependencies(check_grpo_tool_episodes dsarl-algorithm-grpo dsarl-model-glm5 dsarl-device-cpu
                   dsarl-dsa-reference dsarl-environment-calculator)
endif()
