/* metrics_internal.h: pieces of the run logger shared by its files (metrics.c, metrics_tensorboard.c,
 * metrics_text.c). Not part of the SDK. */
#ifndef DSARL_METRICS_INTERNAL_H
#define DSARL_METRICS_INTERNAL_H

#include <stdio.h>
#include "dsarl/metrics.h"

/* Appends n bytes / a printf-formatted string to a growable buffer; 0 or -1 when out of memory. */
int metrics_buf_append(dsarl_text_buffer *b, const char *data, size_t n);
int metrics_buf_printf(dsarl_text_buffer *b, const char *fmt, ...) DSARL_PRINTF(2, 3);

/* An open TensorBoard event file (tensorboard/events.out.tfevents.<time>.<host> in the experiment directory). */
typedef struct metrics_tb_writer {
    FILE *file;
    char *path;
} metrics_tb_writer;

/* Creates dir (when missing) and a new event file in it, starting with the file_version record. */
int metrics_tb_open(metrics_tb_writer *w, const char *dir, dsarl_error *err);

/* Appends one scalar record. */
int metrics_tb_scalar(metrics_tb_writer *w, double wall_time, int64_t step, const char *tag, float value,
                      dsarl_error *err);

/* Pushes buffered records to the kernel (a killed process keeps them). */
int metrics_tb_flush(metrics_tb_writer *w, dsarl_error *err);

/* Closes the file; a zeroed writer is fine. */
void metrics_tb_close(metrics_tb_writer *w);

#endif /* DSARL_METRICS_INTERNAL_H */
