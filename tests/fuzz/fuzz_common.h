/* fuzz_common.h: what every libFuzzer target here shares: a private scratch directory (made once per process) and
 * writing one input, or one piece of it, to a file there, since the loaders under test read files. */
#ifndef DSARL_FUZZ_COMMON_H
#define DSARL_FUZZ_COMMON_H

#define _XOPEN_SOURCE 700
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsarl/log.h"

// The process's scratch directory, made on first use (libFuzzer runs one input at a time per process).
static inline const char *fuzz_scratch_dir(void)
{
    static char dir[256];
    if (!dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/dsarl-fuzz-XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            abort();
        }
        dsarl_log_set_level(DSARL_LOG_ERROR); // a warning per input would drown the fuzzer's own output
    }
    return dir;
}

// Writes n bytes to <scratch>/<name> and returns that path (static storage: one at a time per name slot).
static inline const char *fuzz_write(const char *name, const void *data, size_t n, char *path, size_t size)
{
    snprintf(path, size, "%s/%s", fuzz_scratch_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n)) {
        perror(path);
        abort();
    }
    fclose(f);
    return path;
}

// Splits data at the first occurrence of sep (a byte string): [0, *first) and [*rest, size). No sep: all first.
static inline void fuzz_split(const uint8_t *data, size_t size, const char *sep, size_t *first, size_t *rest)
{
    size_t k = strlen(sep);
    for (size_t i = 0; i + k <= size; i++)
        if (memcmp(data + i, sep, k) == 0) {
            *first = i;
            *rest = i + k;
            return;
        }
    *first = size;
    *rest = size;
}

#endif /* DSARL_FUZZ_COMMON_H */
