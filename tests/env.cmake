# GRPO inputs that need no model: the math reward environment, the tokenizers and the data layer.
if(TARGET dsarl-environment-math-objects)
  dsarl_add_check_test(check_env_math SOURCES check_env_math.c LABELS unit LIBS dsarl-environment-math-objects)
endif()
if(TARGET dsarl-environment-calculator-objects)
  dsarl_add_check_test(check_env_calculator SOURCES check_env_calculator.c LABELS unit
                       LIBS dsarl-environment-calculator-objects)
  target_include_directories(check_env_calculator PRIVATE ${PROJECT_SOURCE_DIR}/plugins/environments/calculator)
endif()
dsarl_add_check_test(check_tokenizer SOURCES check_tokenizer.c LABELS unit LIBS PkgConfig::JANSSON)
dsarl_add_check_test(check_dataset SOURCES check_dataset.c LABELS unit)
