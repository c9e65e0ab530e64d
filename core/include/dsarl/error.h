/* dsarl/error.h: the error type every dsarl function and plugin reports through.
 * SDK tier: plugin ABI (docs/sdk.md).
 *
 * Functions return an int status (DSARL_OK or a negative dsarl_status) and, on failure, fill a caller-owned
 * dsarl_error with one sentence that names the file, key or argument at fault and what would be valid.
 * Plugins never call exit(); only the host binary decides to stop. */
#ifndef DSARL_ERROR_H
#define DSARL_ERROR_H

#include <stdarg.h>
#include "dsarl/export.h"

DSARL_BEGIN_DECLS

/* Status codes: 0 is success, every failure is negative so `if (rc < 0)` and `if (rc)` both work. */
typedef enum dsarl_status {
    DSARL_OK = 0,
    DSARL_E_INVALID = -1,     /* bad input: recipe value, argument, file contents */
    DSARL_E_NOMEM = -2,       /* an allocation failed (host or device) */
    DSARL_E_IO = -3,          /* a file could not be opened, read, written or renamed */
    DSARL_E_NOT_FOUND = -4,   /* a file, key, tensor or plugin that was asked for does not exist */
    DSARL_E_UNSUPPORTED = -5, /* a valid request this build or plugin does not implement */
    DSARL_E_ABI = -6,         /* a plugin does not match this host's ABI */
    DSARL_E_DEVICE = -7,      /* a CUDA, cuDNN, NCCL or MPI call failed */
    DSARL_E_INTERNAL = -8,    /* a broken invariant: a bug in dsarl or a plugin */
} dsarl_status;

#define DSARL_ERROR_MESSAGE_MAX 1024

/* One failure: the status, the sentence for the user, and where in the source it was raised. */
typedef struct dsarl_error {
    int code;                               /* a dsarl_status; DSARL_OK when no error was recorded */
    char message[DSARL_ERROR_MESSAGE_MAX];  /* one sentence, no trailing newline */
    const char *file;                       /* source file that raised it (__FILE__), or NULL */
    int line;                               /* source line that raised it, or 0 */
} dsarl_error;

/* Records a failure in err (which may be NULL) and returns code, so `return DSARL_FAIL(err, ...)` reads well. */
DSARL_API int dsarl_error_set(dsarl_error *err, int code, const char *file, int line, const char *fmt, ...)
    DSARL_PRINTF(5, 6);

/* va_list form of dsarl_error_set. */
DSARL_API int dsarl_error_setv(dsarl_error *err, int code, const char *file, int line, const char *fmt,
                               va_list args);

/* Prepends "context: " to an already-recorded message (e.g. the recipe location) and returns err->code. */
DSARL_API int dsarl_error_prefix(dsarl_error *err, const char *fmt, ...) DSARL_PRINTF(2, 3);

/* Resets err to "no error". */
DSARL_API void dsarl_error_clear(dsarl_error *err);

/* A short fixed name for a status ("invalid input", "I/O error", ...). */
DSARL_API const char *dsarl_status_name(int code);

/* Record an error at the caller's source location: `return DSARL_FAIL(err, DSARL_E_INVALID, "...", ...);` */
#define DSARL_FAIL(err, code, ...) dsarl_error_set((err), (code), __FILE__, __LINE__, __VA_ARGS__)

/* Propagate a failing status without touching the recorded message. */
#define DSARL_TRY(expr)                  \
    do {                                 \
        int dsarl_try_rc_ = (expr);      \
        if (dsarl_try_rc_ < 0)           \
            return dsarl_try_rc_;        \
    } while (0)

DSARL_END_DECLS

#endif /* DSARL_ERROR_H */
