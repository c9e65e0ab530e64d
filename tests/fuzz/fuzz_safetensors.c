/* fuzz_safetensors.c: a .safetensors file (8-byte header length, JSON header, data) opened, validated and read:
 * every tensor described and every element's bytes touched, and every metadata entry. */
#include "fuzz_common.h"

#include "dsarl/safetensors.h"
#include "dsarl/tensor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[512];
    fuzz_write("model.safetensors", data, size, path, sizeof path);
    dsarl_safetensors_file *f = NULL;
    dsarl_error err;
    if (dsarl_safetensors_open(path, &f, &err) == 0) {
        for (size_t i = 0; i < dsarl_safetensors_count(f); i++) {
            const char *name = dsarl_safetensors_name(f, i);
            dsarl_tensor t;
            if (name && dsarl_safetensors_get(f, name, &t, &err) == 0) {
                // what a loader does with a tensor: read every byte it claims to have
                const volatile unsigned char *p = t.data;
                size_t n = dsarl_tensor_nbytes(&t);
                unsigned char sum = 0;
                for (size_t k = 0; k < n; k++)
                    sum ^= p[k];
                (void)sum;
            }
        }
        for (size_t i = 0; i < dsarl_safetensors_metadata_count(f); i++) {
            const char *key, *value;
            dsarl_safetensors_metadata_at(f, i, &key, &value);
            if (key)
                (void)dsarl_safetensors_metadata(f, key);
        }
        (void)dsarl_safetensors_has(f, "x");
    }
    dsarl_safetensors_close(f);
    return 0;
}
