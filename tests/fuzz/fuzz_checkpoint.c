/* fuzz_checkpoint.c: a checkpoint's manifest.json and training_info.json as resume reads them: verification
 * against the files present, the trainer state with its RNG, dataloader and metric entries, and the choice of the
 * step to resume under each checkpointing.on_corrupt policy (nothing is moved aside).
 * Input: manifest.json, "\n%%\n", training_info.json, "\n%%\n", the bytes of policy/weights/model.safetensors. */
#include "fuzz_common.h"

#include <sys/stat.h>

#include "dsarl/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t a, a_rest, b, b_rest;
    fuzz_split(data, size, "\n%%\n", &a, &a_rest);
    fuzz_split(data + a_rest, size - a_rest, "\n%%\n", &b, &b_rest);
    const uint8_t *info = data + a_rest, *blob = data + a_rest + b_rest;
    size_t blob_n = size - a_rest - b_rest;
    char path[512], root[512], step[512];
    snprintf(root, sizeof root, "%s/ck", fuzz_scratch_dir());
    snprintf(step, sizeof step, "%s/step_3", root);
    mkdir(root, 0700);
    mkdir(step, 0700);
    snprintf(path, sizeof path, "%s/policy", step);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/policy/weights", step);
    mkdir(path, 0700);
    fuzz_write("ck/step_3/manifest.json", data, a, path, sizeof path);
    fuzz_write("ck/step_3/training_info.json", info, b, path, sizeof path);
    fuzz_write("ck/step_3/policy/weights/model.safetensors", blob, blob_n, path, sizeof path);
    dsarl_error err;
    (void)dsarl_checkpoint_verify(step, &err);
    dsarl_trainer_state st;
    if (dsarl_checkpoint_read_state(step, &st, &err) == 0) {
        dsarl_dataloader_state pos;
        dsarl_rng_state rng;
        double v;
        (void)dsarl_trainer_state_get_loader(&st, "train", &pos, &err);
        (void)dsarl_trainer_state_get_rng(&st, "train", &rng, &err);
        (void)dsarl_trainer_state_get_metric(&st, "val:accuracy", &v, &err);
    }
    char chosen[1024];
    int64_t found;
    for (int p = 0; p < 3; p++)
        (void)dsarl_checkpoint_choose(root, (dsarl_checkpoint_on_corrupt)p, false, chosen, sizeof chosen, &found,
                                      &err);
    (void)dsarl_checkpoint_find_latest(root, chosen, sizeof chosen, &found, &err);
    return 0;
}
