/* dataset_loader.c: batches in a per-epoch order that is a pure function of (seed, epoch), so a checkpoint needs
 * only (epoch, cursor) to continue bit-identically. Semantics of NeMo RL's StatefulDataLoader: with drop_last
 * (training) an epoch is floor(n / batch) full batches; without it (validation) the last batch may be short. */
#include "dataset_internal.h"

#include <inttypes.h>
#include <stdlib.h>

#include "dsarl/rng.h"

struct dsarl_dataloader {
    const dsarl_dataset *ds;
    size_t batch_size;
    bool shuffle, drop_last;
    uint64_t seed;
    int64_t epoch, cursor; /* the position: next batch's epoch and examples already handed out in it */
    int64_t order_epoch;   /* epoch that `order` was drawn for (-1: none yet) */
    size_t *order;         /* [n] dataset indices in this epoch's order */
};

/* Examples an epoch hands out. */
static int64_t epoch_length(const dsarl_dataloader *dl)
{
    int64_t n = (int64_t)dl->ds->n;
    return dl->drop_last ? n - n % (int64_t)dl->batch_size : n;
}

/* Fisher-Yates from Philox stream `epoch` of the seed (identity without shuffle). */
static void draw_order(dsarl_dataloader *dl, int64_t epoch)
{
    size_t n = dl->ds->n;
    for (size_t i = 0; i < n; i++)
        dl->order[i] = i;
    if (dl->shuffle) {
        dsarl_rng rng;
        dsarl_rng_init(&rng, dl->seed, (uint64_t)epoch);
        for (size_t i = n; i > 1; i--) {
            size_t j = dsarl_rng_below(&rng, (uint32_t)i);
            size_t t = dl->order[i - 1];
            dl->order[i - 1] = dl->order[j];
            dl->order[j] = t;
        }
    }
    dl->order_epoch = epoch;
}

int dsarl_dataloader_create(const dsarl_dataset *ds, size_t batch_size, int shuffle, int drop_last, uint64_t seed,
                            dsarl_dataloader **out, dsarl_error *err)
{
    *out = NULL;
    if (batch_size == 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dataloader: batch size must be >= 1, got 0");
    if (ds->n == 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dataloader: the dataset is empty");
    if (ds->n > UINT32_MAX)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dataloader: %zu examples is more than the 2^32 - 1 supported", ds->n);
    if (drop_last && ds->n < batch_size)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dataloader: the dataset has %zu examples, fewer than one batch of "
                          "%zu; with drop_last no batch would ever be full (lower the batch size or add data)",
                          ds->n, batch_size);
    dsarl_dataloader *dl = calloc(1, sizeof *dl);
    size_t *order = malloc(ds->n * sizeof *order);
    if (!dl || !order) {
        free(dl);
        free(order);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "dataloader: out of memory for %zu examples", ds->n);
    }
    *dl = (dsarl_dataloader){.ds = ds, .batch_size = batch_size, .shuffle = shuffle != 0, .drop_last = drop_last != 0,
                             .seed = seed, .order_epoch = -1, .order = order};
    *out = dl;
    return 0;
}

int dsarl_dataloader_next(dsarl_dataloader *dl, const dsarl_example **batch, size_t *indices, size_t *n,
                          int64_t *epoch, dsarl_error *err)
{
    (void)err; // nothing can fail once the loader exists
    if (dl->cursor >= epoch_length(dl)) {
        dl->epoch++;
        dl->cursor = 0;
    }
    if (dl->order_epoch != dl->epoch)
        draw_order(dl, dl->epoch);
    int64_t left = epoch_length(dl) - dl->cursor;
    size_t count = left < (int64_t)dl->batch_size ? (size_t)left : dl->batch_size;
    for (size_t i = 0; i < count; i++) {
        size_t idx = dl->order[dl->cursor + (int64_t)i];
        batch[i] = &dl->ds->examples[idx];
        if (indices)
            indices[i] = idx;
    }
    if (epoch)
        *epoch = dl->epoch;
    *n = count;
    dl->cursor += (int64_t)count;
    return 0;
}

int64_t dsarl_dataloader_batches_per_epoch(const dsarl_dataloader *dl)
{
    return (epoch_length(dl) + (int64_t)dl->batch_size - 1) / (int64_t)dl->batch_size;
}

dsarl_dataloader_state dsarl_dataloader_get_state(const dsarl_dataloader *dl)
{
    return (dsarl_dataloader_state){.epoch = dl->epoch, .cursor = dl->cursor};
}

int dsarl_dataloader_set_state(dsarl_dataloader *dl, dsarl_dataloader_state state, dsarl_error *err)
{
    if (state.epoch < 0 || state.cursor < 0 || state.cursor > epoch_length(dl))
        return DSARL_FAIL(err, DSARL_E_INVALID, "dataloader: position (epoch %" PRId64 ", cursor %" PRId64 ") is "
                          "outside [0, %" PRId64 "] examples per epoch; was it saved with another dataset or batch "
                          "size?", state.epoch, state.cursor, epoch_length(dl));
    dl->epoch = state.epoch;
    dl->cursor = state.cursor;
    return 0;
}

void dsarl_dataloader_free(dsarl_dataloader *dl)
{
    if (!dl)
        return;
    free(dl->order);
    free(dl);
}
