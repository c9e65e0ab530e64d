/* fuzz_dataset.c: a JSONL file read as a plain (input/output) dataset and as DAPO-Math, a prompt template applied,
 * then a shuffling loader drawn from across an epoch boundary and set to a stored position.
 * The first input byte picks the batch size (1-8) and the second the stored cursor; the rest is the file. */
#include "fuzz_common.h"

#include "dsarl/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void draw(dsarl_dataset *ds, size_t batch, int64_t cursor)
{
    dsarl_dataloader *dl = NULL;
    dsarl_error err;
    if (dsarl_dataloader_create(ds, batch, 1, 1, 7, &dl, &err) != 0)
        return;
    const dsarl_example *got[8];
    size_t idx[8], n;
    int64_t epoch;
    int64_t per_epoch = dsarl_dataloader_batches_per_epoch(dl);
    for (int64_t i = 0; i < per_epoch + 1 && i < 32; i++) {
        if (dsarl_dataloader_next(dl, got, idx, &n, &epoch, &err) != 0)
            break;
        for (size_t k = 0; k < n; k++)
            for (size_t m = 0; m < got[k]->n_messages; m++)
                (void)strlen(got[k]->messages[m].content);
    }
    dsarl_dataloader_state st = {.epoch = 1, .cursor = cursor};
    (void)dsarl_dataloader_set_state(dl, st, &err);
    (void)dsarl_dataloader_next(dl, got, idx, &n, &epoch, &err);
    dsarl_dataloader_free(dl);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    size_t batch = 1 + data[0] % 8;
    int64_t cursor = (int64_t)data[1] - 8;
    char path[512];
    fuzz_write("data.jsonl", data + 2, size - 2, path, sizeof path);
    dsarl_dataset *ds = NULL;
    dsarl_error err;
    if (dsarl_dataset_load_jsonl(path, "input", "output", NULL, &ds, &err) == 0) {
        (void)dsarl_dataset_apply_prompt(ds, "Q: {}", "be brief", "fuzz", &err);
        for (size_t i = 0; i < dsarl_dataset_size(ds); i++)
            (void)dsarl_dataset_get(ds, i)->ground_truth;
        draw(ds, batch, cursor);
        dsarl_dataset_free(ds);
    }
    ds = NULL;
    if (dsarl_dataset_load_dapo_jsonl(path, NULL, &ds, &err) == 0) {
        draw(ds, batch, cursor);
        dsarl_dataset_free(ds);
    }
    return 0;
}
