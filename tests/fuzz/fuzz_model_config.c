/* fuzz_model_config.c: a Hugging Face config.json read into the glm5 model config (every dimension bounded), then
 * the parameter count and the full parameter list a model of it would allocate, and the config written back. */
#include "fuzz_common.h"

#include <jansson.h>

#include "dsarl/json.h"
#include "glm5_config.h"
#include "glm5_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)fuzz_scratch_dir();
    json_t *root = NULL;
    dsarl_error err;
    if (dsarl_json_load_buffer("config.json", (const char *)data, size, &root, &err) != 0)
        return 0;
    glm5_config cfg;
    if (glm5_config_from_json(&cfg, root, "config.json", &err) == 0) {
        int64_t trainable = 0, buffers = 0, n_params = 0, n_weights = 0;
        (void)glm5_count_parameters(&cfg, &trainable, &buffers, &err);
        glm5_param *specs = NULL;
        if (glm5_param_specs(&cfg, NULL, &specs, &n_params, &n_weights, &err) == 0)
            free(specs);
        (void)glm5_config_full_layers(&cfg);
        json_t *back = NULL;
        if (glm5_config_to_json(&cfg, &back, &err) == 0)
            json_decref(back);
    }
    json_decref(root);
    return 0;
}
