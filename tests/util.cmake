# Unit suites for the core utility layer: tensors and dtypes, files, JSON, safetensors, RNG, arenas, NPY.
dsarl_add_check_test(check_tensor SOURCES check_tensor.c LABELS unit)
dsarl_add_check_test(check_fileutil SOURCES check_fileutil.c LABELS unit)
dsarl_add_check_test(check_hf_hub SOURCES check_hf_hub.c LABELS unit)
dsarl_add_check_test(check_json SOURCES check_json.c LABELS unit LIBS PkgConfig::JANSSON)
dsarl_add_check_test(check_safetensors SOURCES check_safetensors.c LABELS unit)
dsarl_add_check_test(check_rng SOURCES check_rng.c LABELS unit)
dsarl_add_check_test(check_arena SOURCES check_arena.c LABELS unit)
dsarl_add_check_test(check_npy SOURCES check_npy.c LABELS unit)
