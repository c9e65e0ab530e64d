/* cmd_bench.h: `dsarl bench` (cmd_bench.c). */
#ifndef DSARL_CMD_BENCH_H
#define DSARL_CMD_BENCH_H

#include "cli.h"

/* `dsarl bench dsa [options]`: DSA kernel timings against the device's ceilings; argv[0] is "bench". */
int cmd_bench(int argc, char **argv, const cli_options *opts);

#endif /* DSARL_CMD_BENCH_H */
