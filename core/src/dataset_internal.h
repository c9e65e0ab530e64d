/* dataset_internal.h: what the dataset*.c files share. */
#ifndef DSARL_DATASET_INTERNAL_H
#define DSARL_DATASET_INTERNAL_H

#include "dsarl/dataset.h"

struct dsarl_dataset {
    dsarl_example *examples; /* every string and message array below is owned by the dataset */
    size_t n, cap;
};

/* An empty dataset, or NULL when out of memory. */
dsarl_dataset *dataset_new(void);

/* Appends an example, taking ownership of messages (with their role/content strings) and ground_truth, copying
 * task_name. On failure frees what it was given and returns DSARL_E_NOMEM. */
int dataset_add(dsarl_dataset *ds, dsarl_chat_message *messages, size_t n_messages, char *ground_truth,
                const char *task_name);

/* Frees a message array and its strings. */
void dataset_free_messages(dsarl_chat_message *messages, size_t n);

/* Validates arithmetic knobs: 0, or -1 with *field naming the bad knob ("max_digits") and why[] the sentence
 * ("must be in [min_digits, 9], got 12"). */
int dataset_arithmetic_check(const dsarl_arithmetic_config *cfg, const char **field, char *why, size_t size);

#endif /* DSARL_DATASET_INTERNAL_H */
