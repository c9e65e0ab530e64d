# Training infrastructure: AdamW (device op + model optimizer), checkpoints with bit-identical resume, SFT.
if(TARGET dsarl-glm5-objects AND TARGET dsarl-dsa-reference-objects)
  dsarl_add_check_test(check_optim SOURCES check_optim.c LABELS unit TIMEOUT 120
    LIBS dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects PkgConfig::JANSSON)
endif()
if(TARGET dsarl-glm5-objects AND TARGET dsarl-dsa-reference-objects)
  dsarl_add_check_test(check_checkpoint SOURCES check_checkpoint.c LABELS unit TIMEOUT 120
    LIBS dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects PkgConfig::JANSSON)
endif()
if(TARGET dsarl-algorithm-sft-objects AND TARGET dsarl-glm5-objects AND TARGET dsarl-dsa-reference-objects)
  dsarl_add_check_test(check_sft SOURCES check_sft.c LABELS unit TIMEOUT 240
    LIBS dsarl-algorithm-sft-objects dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects
         PkgConfig::JANSSON)
endif()
if(TARGET dsarl-glm5-objects AND TARGET dsarl-dsa-reference-objects)
  dsarl_add_check_test(check_trainer SOURCES check_trainer.c LABELS unit TIMEOUT 120
    LIBS dsarl-glm5-objects dsarl-device-cpu-objects dsarl-dsa-reference-objects PkgConfig::JANSSON)
endif()
