/* cmd_bench.h: `dsarl bench` (cmd_bench.c: dsa; cmd_bench_model.c: train, generate; cmd_bench_comm.c: comm) and
 * the timing helpers the benchmarks share: CUDA driver events (dlopen'ed libcuda), the L2 flush, random device
 * inputs and the GEMM/copy ceilings every benchmark measures in its own run. */
#ifndef DSARL_CMD_BENCH_H
#define DSARL_CMD_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include "cli.h"
#include "dsarl/ops/device.h"
#include "dsarl/ops/dsa.h"

/* CUDA driver events, resolved at run time; all NULL when libcuda is absent (then the wall clock is used). */
typedef struct event_api {
    int (*create)(void **ev, unsigned int flags);
    int (*record)(void *ev, void *stream);
    int (*sync)(void *ev);
    int (*elapsed)(float *ms, void *start, void *end);
    int (*destroy)(void *ev);
} event_api;

/* One benchmark's device (and DSA backend, for `bench dsa`), events and L2 flush buffer. */
typedef struct bench {
    const dsarl_device_ops *d;
    dsarl_device *dev;
    const dsarl_dsa_ops *dsa_ops;
    dsarl_dsa_context *dsa;
    event_api ev;
    void *flush;                  // L2 flush buffer (time_op zeroes it before every timed run)
    size_t flush_bytes;
    dsarl_error err;
} bench;

typedef int (*bench_fn)(bench *b, void *arg);

/* Fills ev from libcuda.so.1 (all NULL when it cannot be opened). */
void load_events(event_api *ev);

/* Monotonic wall clock in milliseconds. */
double now_ms(void);

/* Mean milliseconds of fn over iters runs after one warm-up, each run preceded by an L2 flush (b->flush must be
 * allocated) outside the timing; CUDA events on the legacy default stream when available, else the wall clock. */
int time_op(bench *b, bench_fn fn, void *arg, int iters, double *mean_ms);

/* n uniform values in [-scale, scale) from a fixed LCG stream, allocated on the device and uploaded as dtype. */
int upload_random(bench *b, void **dst, dsarl_dtype dtype, int64_t n, float scale, uint64_t seed);

/* The ceilings' operations: C (n,n) = A B^T in the storage dtype, and a device-to-device copy. */
typedef struct gemm_args { int64_t n; void *a, *bm, *c; } gemm_args;
typedef struct copy_args { void *dst, *src; size_t bytes; } copy_args;
int run_gemm(bench *b, void *p);
int run_copy(bench *b, void *p);

/* `dsarl bench dsa|train|generate|comm [options]`; argv[0] is "bench". */
int cmd_bench(int argc, char **argv, const cli_options *opts);

/* `dsarl bench train` and `dsarl bench generate` (cmd_bench_model.c); argv[0] is "bench", argv[1] the name. */
int cmd_bench_train(int argc, char **argv, const cli_options *opts);
int cmd_bench_generate(int argc, char **argv, const cli_options *opts);

/* `[mpirun -np N] dsarl bench comm` (cmd_bench_comm.c): the device's collectives over the world group, algorithm
 * and bus bandwidth beside the link's ceiling; argv[0] is "bench", argv[1] "comm". */
int cmd_bench_comm(int argc, char **argv, const cli_options *opts);

#endif /* DSARL_CMD_BENCH_H */
