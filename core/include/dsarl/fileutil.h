/* dsarl/fileutil.h: whole-file reads, crash-safe writes and small path helpers.
 * SDK tier: trainer services (docs/sdk.md): exported by libdsarl, versioned with it; plugins may call them.
 *
 * Every writer goes through a temp file in the destination's directory, fsyncs it and renames it over the final
 * name, so a reader never sees a half-written file and a crash leaves either the old file or the new one. */
#ifndef DSARL_FILEUTIL_H
#define DSARL_FILEUTIL_H

#include <stddef.h>
#include "dsarl/error.h"

DSARL_BEGIN_DECLS

/* Reads the whole file into a malloc'd buffer (*out_data, caller frees) with a NUL byte after the *out_size bytes. */
DSARL_API int dsarl_read_file(const char *path, void **out_data, size_t *out_size, dsarl_error *err);

/* Writes n bytes to path atomically: temp file in the same directory, fsync, rename, fsync of the directory. */
DSARL_API int dsarl_write_file_atomic(const char *path, const void *data, size_t n, dsarl_error *err);

/* A file being written under a temp name; it appears under its final name only on commit. */
typedef struct dsarl_atomic_file {
    int fd;           /* -1 when closed */
    char *path;       /* final name */
    char *temp_path;  /* "<path>.tmp.XXXXXX" in the same directory */
} dsarl_atomic_file;

/* Creates the temp file for path (mode 0644); on failure f is left closed and nothing exists on disk. */
DSARL_API int dsarl_atomic_file_open(dsarl_atomic_file *f, const char *path, dsarl_error *err);

/* Appends n bytes; on failure the caller must still call dsarl_atomic_file_abort. */
DSARL_API int dsarl_atomic_file_write(dsarl_atomic_file *f, const void *data, size_t n, dsarl_error *err);

/* fsyncs, closes and renames the temp file to its final name; on failure the temp file is removed. */
DSARL_API int dsarl_atomic_file_commit(dsarl_atomic_file *f, dsarl_error *err);

/* Closes and removes the temp file; safe to call on a committed, aborted or never-opened (zeroed fd=-1) file. */
DSARL_API void dsarl_atomic_file_abort(dsarl_atomic_file *f);

/* Creates path and any missing parents (mode 0755); an existing directory is success. */
DSARL_API int dsarl_mkdir_p(const char *path, dsarl_error *err);

/* Returns a malloc'd "a/b" (one separator); if b is absolute or a is empty, a copy of b. NULL only when out of
 * memory. */
DSARL_API char *dsarl_path_join(const char *a, const char *b);

/* Returns a malloc'd POSIX dirname: "a/b/c" -> "a/b", "c" -> ".", "/c" -> "/", "a/b/" -> "a". NULL only when out of
 * memory. */
DSARL_API char *dsarl_path_dirname(const char *path);

/* 1 if path exists (any file type), 0 otherwise. */
DSARL_API int dsarl_path_exists(const char *path);

DSARL_END_DECLS

#endif /* DSARL_FILEUTIL_H */
