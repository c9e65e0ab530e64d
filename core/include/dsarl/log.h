/* dsarl/log.h: levelled, timestamped logging to stderr, with a rank prefix once there is more than one process.
 * SDK tier: plugin ABI (docs/sdk.md).
 *
 * The level comes from --log-level or DSARL_LOG (error, warn, info, debug, trace); the default is info. */
#ifndef DSARL_LOG_H
#define DSARL_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include "dsarl/export.h"

DSARL_BEGIN_DECLS

typedef enum dsarl_log_level {
    DSARL_LOG_ERROR = 0,
    DSARL_LOG_WARN = 1,
    DSARL_LOG_INFO = 2,
    DSARL_LOG_DEBUG = 3,
    DSARL_LOG_TRACE = 4,
} dsarl_log_level;

/* Writes one line "YYYY-mm-ddTHH:MM:SS.mmm LEVEL [rank N] message" when level is enabled. */
DSARL_API void dsarl_log(dsarl_log_level level, const char *fmt, ...) DSARL_PRINTF(2, 3);

/* va_list form of dsarl_log. */
DSARL_API void dsarl_logv(dsarl_log_level level, const char *fmt, va_list args);

/* Sets the threshold; messages above it are dropped. */
DSARL_API void dsarl_log_set_level(dsarl_log_level level);

/* The current threshold. */
DSARL_API dsarl_log_level dsarl_log_get_level(void);

/* Parses "error|warn|info|debug|trace" (case-insensitive) into *out; returns 0, or -1 for an unknown name. */
DSARL_API int dsarl_log_level_parse(const char *name, dsarl_log_level *out);

/* Sets the rank shown in the prefix; world_size <= 1 hides it. */
DSARL_API void dsarl_log_set_rank(int rank, int world_size);

/* Whether ranks other than 0 log below WARN (runtime.log_all_ranks); by default only rank 0 does. */
DSARL_API void dsarl_log_set_all_ranks(bool all_ranks);

/* This process's rank and the world size as the logger knows them (0 and 1 in a single process). */
DSARL_API void dsarl_log_get_rank(int *rank, int *world_size);

#define DSARL_LOG_ERR(...) dsarl_log(DSARL_LOG_ERROR, __VA_ARGS__)
#define DSARL_LOG_WRN(...) dsarl_log(DSARL_LOG_WARN, __VA_ARGS__)
#define DSARL_LOG_INF(...) dsarl_log(DSARL_LOG_INFO, __VA_ARGS__)
#define DSARL_LOG_DBG(...) dsarl_log(DSARL_LOG_DEBUG, __VA_ARGS__)

DSARL_END_DECLS

#endif /* DSARL_LOG_H */
