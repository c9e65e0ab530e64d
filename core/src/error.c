/* error.c: recording and formatting dsarl_error. */
#include "dsarl/error.h"

#include <stdio.h>
#include <string.h>

int dsarl_error_setv(dsarl_error *err, int code, const char *file, int line, const char *fmt, va_list args)
{
    if (!err)
        return code;
    err->code = code;
    err->file = file;
    err->line = line;
    vsnprintf(err->message, sizeof err->message, fmt, args);
    return code;
}

int dsarl_error_set(dsarl_error *err, int code, const char *file, int line, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    dsarl_error_setv(err, code, file, line, fmt, args);
    va_end(args);
    return code;
}

int dsarl_error_prefix(dsarl_error *err, const char *fmt, ...)
{
    if (!err)
        return DSARL_E_INTERNAL;
    char prefix[DSARL_ERROR_MESSAGE_MAX];
    va_list args;
    va_start(args, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, args);
    va_end(args);
    /* Build "prefix: message" in place, truncating the old message rather than the location. */
    char old[DSARL_ERROR_MESSAGE_MAX];
    memcpy(old, err->message, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof err->message - 3)
        n = sizeof err->message - 3;
    memcpy(err->message, prefix, n);
    memcpy(err->message + n, ": ", 2);
    size_t room = sizeof err->message - n - 3;
    size_t m = strnlen(old, room);
    memcpy(err->message + n + 2, old, m);
    err->message[n + 2 + m] = '\0';
    return err->code;
}

void dsarl_error_clear(dsarl_error *err)
{
    if (!err)
        return;
    err->code = DSARL_OK;
    err->message[0] = '\0';
    err->file = NULL;
    err->line = 0;
}

const char *dsarl_status_name(int code)
{
    switch (code) {
    case DSARL_OK: return "ok";
    case DSARL_E_INVALID: return "invalid input";
    case DSARL_E_NOMEM: return "out of memory";
    case DSARL_E_IO: return "I/O error";
    case DSARL_E_NOT_FOUND: return "not found";
    case DSARL_E_UNSUPPORTED: return "not supported";
    case DSARL_E_ABI: return "ABI mismatch";
    case DSARL_E_DEVICE: return "device error";
    case DSARL_E_INTERNAL: return "internal error";
    default: return "unknown error";
    }
}
