/* fileutil.c: whole-file reads, atomic (temp + fsync + rename) writes and path helpers. */
#include "dsarl/fileutil.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int dsarl_read_file(const char *path, void **out_data, size_t *out_size, dsarl_error *err)
{
    if (!path || !out_data || !out_size)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_read_file: path, out_data and out_size must not be NULL");
    *out_data = NULL;
    *out_size = 0;
    // O_NONBLOCK: opening a FIFO must not wait for a writer before the check below refuses it
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return DSARL_FAIL(err, errno == ENOENT ? DSARL_E_NOT_FOUND : DSARL_E_IO, "%s: cannot open for reading: %s",
                          path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int saved = errno;
        close(fd);
        return DSARL_FAIL(err, DSARL_E_IO, "%s: cannot stat: %s", path, strerror(saved));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: not a regular file (%s)", path,
                          S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a pipe" : "a device or socket");
    }
    size_t size = (size_t)st.st_size;
    char *data = malloc(size + 1);
    if (!data) {
        close(fd);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: cannot allocate %zu bytes to read it", path, size + 1);
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, data + got, size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int saved = errno;
            free(data);
            close(fd);
            return DSARL_FAIL(err, DSARL_E_IO, "%s: read failed after %zu of %zu bytes: %s", path, got, size,
                              r == 0 ? "unexpected end of file" : strerror(saved));
        }
        got += (size_t)r;
    }
    close(fd);
    data[size] = '\0';
    *out_data = data;
    *out_size = size;
    return DSARL_OK;
}

/* fsync the directory holding path so the rename itself survives a crash; failures are ignored because some
 * file systems refuse to fsync directories and the data is already safe. */
static void fsync_parent_dir(const char *path)
{
    char *dir = dsarl_path_dirname(path);
    if (!dir)
        return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

int dsarl_atomic_file_open(dsarl_atomic_file *f, const char *path, dsarl_error *err)
{
    if (!f || !path || !*path)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_atomic_file_open: file and a non-empty path are required");
    f->fd = -1;
    f->path = strdup(path);
    size_t n = strlen(path) + sizeof ".tmp.XXXXXX";
    f->temp_path = malloc(n);
    if (!f->path || !f->temp_path) {
        free(f->path);
        free(f->temp_path);
        f->path = f->temp_path = NULL;
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory preparing the temp file name", path);
    }
    snprintf(f->temp_path, n, "%s.tmp.XXXXXX", path);
    f->fd = mkostemp(f->temp_path, O_CLOEXEC);
    if (f->fd < 0) {
        int saved = errno;
        free(f->path);
        free(f->temp_path);
        f->path = f->temp_path = NULL;
        return DSARL_FAIL(err, DSARL_E_IO, "%s: cannot create a temp file beside it: %s", path, strerror(saved));
    }
    /* mkstemp creates 0600; a written checkpoint or config should be readable like any other output. */
    (void)fchmod(f->fd, 0644);
    return DSARL_OK;
}

int dsarl_atomic_file_write(dsarl_atomic_file *f, const void *data, size_t n, dsarl_error *err)
{
    if (!f || f->fd < 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_atomic_file_write: the file is not open");
    const char *p = data;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(f->fd, p + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return DSARL_FAIL(err, DSARL_E_IO, "%s: write failed after %zu of %zu bytes: %s", f->path, done, n,
                              strerror(errno));
        done += (size_t)w;
    }
    return DSARL_OK;
}

void dsarl_atomic_file_abort(dsarl_atomic_file *f)
{
    if (!f)
        return;
    if (f->fd >= 0) {
        close(f->fd);
        f->fd = -1;
    }
    if (f->temp_path)
        unlink(f->temp_path);
    free(f->path);
    free(f->temp_path);
    f->path = f->temp_path = NULL;
}

int dsarl_atomic_file_commit(dsarl_atomic_file *f, dsarl_error *err)
{
    if (!f || f->fd < 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_atomic_file_commit: the file is not open");
    int rc = DSARL_OK;
    if (fsync(f->fd) != 0)
        rc = DSARL_FAIL(err, DSARL_E_IO, "%s: fsync of the temp file failed: %s", f->path, strerror(errno));
    if (close(f->fd) != 0 && rc == DSARL_OK)
        rc = DSARL_FAIL(err, DSARL_E_IO, "%s: close of the temp file failed: %s", f->path, strerror(errno));
    f->fd = -1;
    if (rc == DSARL_OK && rename(f->temp_path, f->path) != 0)
        rc = DSARL_FAIL(err, DSARL_E_IO, "%s: cannot rename the temp file %s into place: %s", f->path,
                        f->temp_path, strerror(errno));
    if (rc != DSARL_OK) {
        dsarl_atomic_file_abort(f);
        return rc;
    }
    fsync_parent_dir(f->path);
    free(f->path);
    free(f->temp_path);
    f->path = f->temp_path = NULL;
    return DSARL_OK;
}

int dsarl_write_file_atomic(const char *path, const void *data, size_t n, dsarl_error *err)
{
    dsarl_atomic_file f;
    DSARL_TRY(dsarl_atomic_file_open(&f, path, err));
    int rc = dsarl_atomic_file_write(&f, data, n, err);
    if (rc != DSARL_OK) {
        dsarl_atomic_file_abort(&f);
        return rc;
    }
    return dsarl_atomic_file_commit(&f, err);
}

int dsarl_mkdir_p(const char *path, dsarl_error *err)
{
    if (!path || !*path)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_mkdir_p: path must be a non-empty string");
    char *copy = strdup(path);
    if (!copy)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory in dsarl_mkdir_p", path);
    /* Create each prefix ending at a '/', then the whole path; EEXIST is fine as long as it is a directory. */
    size_t len = strlen(copy);
    for (size_t i = 1; i <= len; i++) {
        if (copy[i] != '/' && copy[i] != '\0')
            continue;
        char saved = copy[i];
        copy[i] = '\0';
        if (mkdir(copy, 0755) != 0 && errno != EEXIST) {
            int e = errno;
            int rc = DSARL_FAIL(err, DSARL_E_IO, "%s: cannot create directory %s: %s", path, copy, strerror(e));
            free(copy);
            return rc;
        }
        copy[i] = saved;
    }
    free(copy);
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return DSARL_FAIL(err, DSARL_E_IO, "%s: exists but is not a directory", path);
    return DSARL_OK;
}

char *dsarl_path_join(const char *a, const char *b)
{
    if (!a || !*a || (b && b[0] == '/'))
        return strdup(b ? b : "");
    if (!b)
        b = "";
    size_t la = strlen(a), lb = strlen(b);
    int need_sep = a[la - 1] != '/' && lb > 0;
    char *out = malloc(la + (size_t)need_sep + lb + 1);
    if (!out)
        return NULL;
    memcpy(out, a, la);
    if (need_sep)
        out[la] = '/';
    memcpy(out + la + (size_t)need_sep, b, lb + 1);
    return out;
}

char *dsarl_path_dirname(const char *path)
{
    if (!path || !*path)
        return strdup(".");
    size_t end = strlen(path);
    while (end > 1 && path[end - 1] == '/') /* trailing slashes do not start a new component */
        end--;
    while (end > 0 && path[end - 1] != '/') /* drop the last component */
        end--;
    if (end == 0)
        return strdup(".");
    while (end > 1 && path[end - 1] == '/') /* and the separators before it, keeping a lone root "/" */
        end--;
    char *out = malloc(end + 1);
    if (!out)
        return NULL;
    memcpy(out, path, end);
    out[end] = '\0';
    return out;
}

int dsarl_path_exists(const char *path)
{
    struct stat st;
    return path && stat(path, &st) == 0;
}
