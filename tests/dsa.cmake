# DSA kernel backends. The reference backend's suite links its object library and calls the ops table directly.
if(TARGET dsarl-dsa-reference-objects)
  dsarl_add_check_test(check_dsa_reference SOURCES check_dsa_reference.c LABELS unit
                       LIBS dsarl-dsa-reference-objects TIMEOUT 300)
endif()
