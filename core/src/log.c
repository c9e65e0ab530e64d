/* log.c: the process-wide logger (one per process by design: libdsarl is the single shared core). */
#include "dsarl/log.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

/* Logger state is process-wide on purpose: every plugin logs through the same libdsarl, so one threshold and
 * one rank prefix apply everywhere. Guarded by a mutex so lines from threads never interleave. */
static struct {
    dsarl_log_level level;
    int rank, world_size;
    bool all_ranks; /* ranks other than 0 log below WARN too */
    pthread_mutex_t lock;
} logger = {DSARL_LOG_INFO, 0, 1, false, PTHREAD_MUTEX_INITIALIZER};

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG", "TRACE"};

void dsarl_log_set_level(dsarl_log_level level) { logger.level = level; }

dsarl_log_level dsarl_log_get_level(void) { return logger.level; }

void dsarl_log_set_rank(int rank, int world_size)
{
    logger.rank = rank;
    logger.world_size = world_size;
}

void dsarl_log_set_all_ranks(bool all_ranks) { logger.all_ranks = all_ranks; }

void dsarl_log_get_rank(int *rank, int *world_size)
{
    *rank = logger.rank;
    *world_size = logger.world_size;
}

int dsarl_log_level_parse(const char *name, dsarl_log_level *out)
{
    static const char *const lower[] = {"error", "warn", "info", "debug", "trace"};
    for (int i = 0; i < 5; i++) {
        if (name && strcasecmp(name, lower[i]) == 0) {
            *out = (dsarl_log_level)i;
            return 0;
        }
    }
    if (name && strcasecmp(name, "warning") == 0) {
        *out = DSARL_LOG_WARN;
        return 0;
    }
    return -1;
}

void dsarl_log(dsarl_log_level level, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    dsarl_logv(level, fmt, args);
    va_end(args);
}

void dsarl_logv(dsarl_log_level level, const char *fmt, va_list args)
{
    if (level > logger.level || level < DSARL_LOG_ERROR)
        return;
    if (logger.rank != 0 && !logger.all_ranks && level > DSARL_LOG_WARN) // one rank tells the story
        return;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    localtime_r(&tv.tv_sec, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
    pthread_mutex_lock(&logger.lock);
    if (logger.world_size > 1)
        fprintf(stderr, "%s.%03d %-5s [rank %d] ", stamp, (int)(tv.tv_usec / 1000), level_names[level], logger.rank);
    else
        fprintf(stderr, "%s.%03d %-5s ", stamp, (int)(tv.tv_usec / 1000), level_names[level]);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    fflush(stderr);
    pthread_mutex_unlock(&logger.lock);
}
