/* registry.c: finding, loading, checking and indexing plugins (see registry.h for the rules). */
#include "registry.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsarl/ops/algorithm.h"
#include "dsarl/ops/device.h"
#include "dsarl/ops/dsa.h"
#include "dsarl/ops/environment.h"
#include "dsarl/ops/generation.h"
#include "dsarl/ops/model.h"

typedef struct search_dir {
    char *path;
    char *source;
} search_dir;

typedef struct loaded_plugin {
    dsarl_plugin_info info;
    char *path;
    char *real_path;
} loaded_plugin;

struct dsarl_registry {
    dsarl_host host;
    search_dir *dirs;
    size_t n_dirs, cap_dirs;
    loaded_plugin **plugins; /* stable addresses: ops entries point at their plugin's info */
    size_t n_plugins, cap_plugins;
    dsarl_ops_entry *ops;
    size_t n_ops, cap_ops;
    dsarl_refusal *refusals;
    size_t n_refusals, cap_refusals;
    char **seen_real_paths; /* files already tried, loaded or refused, so each file is tried once */
    size_t n_seen, cap_seen;
    loaded_plugin *loading;  /* the plugin whose init is running (registrations are attributed to it) */
    int loading_refused;     /* set when a registration of the loading plugin was refused */
};

/* ---------------------------------------------------------------------------------------------------------------
 * Small growable arrays. */

static int grow(void **items, size_t *cap, size_t need, size_t item_size, dsarl_error *err)
{
    if (need <= *cap)
        return 0;
    size_t cap2 = *cap ? *cap * 2 : 8;
    while (cap2 < need)
        cap2 *= 2;
    void *p = realloc(*items, cap2 * item_size);
    if (!p)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory growing the plugin registry");
    *items = p;
    *cap = cap2;
    return 0;
}

static int add_refusal(dsarl_registry *reg, const char *path, const char *reason)
{
    if (grow((void **)&reg->refusals, &reg->cap_refusals, reg->n_refusals + 1, sizeof *reg->refusals, NULL))
        return DSARL_E_NOMEM;
    reg->refusals[reg->n_refusals].path = strdup(path);
    reg->refusals[reg->n_refusals].reason = strdup(reason);
    reg->n_refusals++;
    return 0;
}

/* Records a refusal and fills err with the same line. */
static int refuse(dsarl_registry *reg, const char *path, dsarl_error *err, int code, const char *fmt, ...)
    DSARL_PRINTF(5, 6);
static int refuse(dsarl_registry *reg, const char *path, dsarl_error *err, int code, const char *fmt, ...)
{
    char reason[DSARL_ERROR_MESSAGE_MAX];
    va_list args;
    va_start(args, fmt);
    vsnprintf(reason, sizeof reason, fmt, args);
    va_end(args);
    add_refusal(reg, path, reason);
    dsarl_log(DSARL_LOG_DEBUG, "refused plugin %s", reason);
    return DSARL_FAIL(err, code, "%s", reason);
}

/* ---------------------------------------------------------------------------------------------------------------
 * The host table. */

static int valid_name(const char *name)
{
    if (!name || !*name || strlen(name) > 64)
        return 0;
    for (const char *c = name; *c; c++) {
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' ||
              *c == '-' || *c == '.'))
            return 0;
    }
    return 1;
}

static int register_checked(dsarl_registry *reg, dsarl_kind kind, const dsarl_ops_common *ops, dsarl_error *err)
{
    const char *file = reg->loading ? reg->loading->path : "(host)";
    const char *kind_name = dsarl_kind_name(kind);
    if (!kind_name)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: registers an ops table of unknown kind %d", file, (int)kind);
    if (!ops)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: registers a NULL %s ops table", file, kind_name);
    if (ops->kind != (uint32_t)kind)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: registers a %s table whose head says kind %u", file, kind_name,
                          ops->kind);
    if (!valid_name(ops->name))
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "%s: %s ops table has an invalid name (1-64 characters of [A-Za-z0-9_.-])", file, kind_name);
    /* A table is checked against the minor its plugin was built for; the host's own tables against this one. */
    unsigned minor = reg->loading ? reg->loading->info.abi_minor : DSARL_ABI_MINOR;
    char why[DSARL_ERROR_MESSAGE_MAX / 2];
    if (dsarl_registry_check_slots(kind, ops, minor, why, sizeof why) < 0) {
        return DSARL_FAIL(err, DSARL_E_ABI, "%s: %s '%s' ops table %s", file, kind_name, ops->name, why);
    }
    if (ops->n_keys && !ops->keys)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: %s '%s' declares %zu keys but no key array", file, kind_name,
                          ops->name, ops->n_keys);
    for (size_t i = 0; i < reg->n_ops; i++) {
        if (reg->ops[i].kind == kind && strcmp(reg->ops[i].ops->name, ops->name) == 0) {
            const char *other = reg->ops[i].plugin ? reg->ops[i].plugin->path : "(host)";
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: duplicate %s plugin '%s': already registered by %s", file,
                              kind_name, ops->name, other);
        }
    }
    DSARL_TRY(grow((void **)&reg->ops, &reg->cap_ops, reg->n_ops + 1, sizeof *reg->ops, err));
    reg->ops[reg->n_ops].kind = kind;
    reg->ops[reg->n_ops].ops = ops;
    reg->ops[reg->n_ops].plugin = reg->loading ? &reg->loading->info : NULL;
    reg->n_ops++;
    return 0;
}

/* Any refused registration refuses the whole file, even when the plugin's init ignores the error it got back. */
static int host_register_ops(const dsarl_host *host, dsarl_kind kind, const dsarl_ops_common *ops,
                             dsarl_error *err)
{
    dsarl_registry *reg = host->host_private;
    int rc = register_checked(reg, kind, ops, err);
    if (rc < 0)
        reg->loading_refused = 1;
    return rc;
}

static const dsarl_ops_common *host_find_ops(const dsarl_host *host, dsarl_kind kind, const char *name)
{
    return dsarl_registry_find(host->host_private, kind, name);
}

static void host_log(const dsarl_host *host, dsarl_log_level level, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    dsarl_logv(level, fmt, args);
    va_end(args);
}

int dsarl_registry_create(dsarl_registry **out, dsarl_error *err)
{
    dsarl_registry *reg = calloc(1, sizeof *reg);
    if (!reg)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory creating the plugin registry");
    reg->host.struct_size = sizeof reg->host;
    reg->host.abi_major = DSARL_ABI_MAJOR;
    reg->host.abi_minor = DSARL_ABI_MINOR;
    reg->host.host_version = DSARL_VERSION;
    reg->host.host_private = reg;
    reg->host.register_ops = host_register_ops;
    reg->host.find_ops = host_find_ops;
    reg->host.log = host_log;
    *out = reg;
    return 0;
}

const dsarl_host *dsarl_registry_host(const dsarl_registry *reg) { return &reg->host; }

/* ---------------------------------------------------------------------------------------------------------------
 * Search path. */

int dsarl_registry_add_search_path(dsarl_registry *reg, const char *dirs, const char *source, dsarl_error *err)
{
    if (!dirs)
        return 0;
    char *copy = strdup(dirs);
    if (!copy)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
    char *save = NULL;
    for (char *dir = strtok_r(copy, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
        if (!*dir)
            continue;
        int rc = grow((void **)&reg->dirs, &reg->cap_dirs, reg->n_dirs + 1, sizeof *reg->dirs, err);
        if (rc) {
            free(copy);
            return rc;
        }
        reg->dirs[reg->n_dirs].path = strdup(dir);
        reg->dirs[reg->n_dirs].source = strdup(source);
        reg->n_dirs++;
    }
    free(copy);
    return 0;
}

/* lib/dsarl/plugins beside the libdsarl.so this code lives in (the build tree mirrors the install tree). */
static int beside_libdsarl(char *buf, size_t size)
{
    Dl_info info;
    if (!dladdr((void *)&dsarl_registry_create, &info) || !info.dli_fname)
        return -1;
    char path[PATH_MAX];
    if (!realpath(info.dli_fname, path))
        snprintf(path, sizeof path, "%s", info.dli_fname);
    char *slash = strrchr(path, '/');
    if (!slash)
        return -1;
    *slash = '\0';
    int n = snprintf(buf, size, "%s/%s", path, DSARL_PLUGIN_SUBDIR);
    return n > 0 && (size_t)n < size ? 0 : -1;
}

int dsarl_registry_add_default_paths(dsarl_registry *reg, dsarl_error *err)
{
    const char *env = getenv("DSARL_PLUGIN_PATH");
    if (env && *env)
        DSARL_TRY(dsarl_registry_add_search_path(reg, env, "DSARL_PLUGIN_PATH", err));
    char dir[PATH_MAX];
    if (beside_libdsarl(dir, sizeof dir) == 0)
        DSARL_TRY(dsarl_registry_add_search_path(reg, dir, "beside libdsarl", err));
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Loading one file. */

static int already_seen(dsarl_registry *reg, const char *real_path)
{
    for (size_t i = 0; i < reg->n_seen; i++)
        if (strcmp(reg->seen_real_paths[i], real_path) == 0)
            return 1;
    if (grow((void **)&reg->seen_real_paths, &reg->cap_seen, reg->n_seen + 1, sizeof *reg->seen_real_paths, NULL))
        return 0;
    reg->seen_real_paths[reg->n_seen++] = strdup(real_path);
    return 0;
}

/* Removes the ops tables a plugin registered before its init failed. */
static void drop_ops_of(dsarl_registry *reg, const dsarl_plugin_info *info)
{
    size_t kept = 0;
    for (size_t i = 0; i < reg->n_ops; i++)
        if (reg->ops[i].plugin != info)
            reg->ops[kept++] = reg->ops[i];
    reg->n_ops = kept;
}

int dsarl_registry_load_file(dsarl_registry *reg, const char *path, dsarl_error *err)
{
    char real_path[PATH_MAX];
    struct stat st;
    if (stat(path, &st) != 0)
        return refuse(reg, path, err, DSARL_E_NOT_FOUND, "%s: no such file", path);
    if (!S_ISREG(st.st_mode))
        return refuse(reg, path, err, DSARL_E_INVALID, "%s: not a regular file", path);
    // dlopen runs the file's constructors before any check of ours: refuse a file someone else could have written
    if (st.st_mode & S_IWOTH)
        return refuse(reg, path, err, DSARL_E_INVALID, "%s: writable by every user (mode %04o), so anyone could have "
                      "put code in it; not loaded (chmod o-w)", path, (unsigned)(st.st_mode & 07777));
    if (st.st_uid != geteuid() && st.st_uid != 0)
        return refuse(reg, path, err, DSARL_E_INVALID, "%s: owned by another user (uid %u); not loaded (plugins must "
                      "belong to you or root)", path, (unsigned)st.st_uid);
    if (st.st_mode & S_IWGRP)
        dsarl_log(DSARL_LOG_WARN, "plugin %s is writable by its group (mode %04o): anyone in it can change what dsarl "
                  "runs", path, (unsigned)(st.st_mode & 07777));
    if (!realpath(path, real_path))
        snprintf(real_path, sizeof real_path, "%s", path);
    if (already_seen(reg, real_path))
        return 0;

    /* RTLD_NODELETE as well as never calling dlclose: CUDA fatbins registered by a plugin's constructors must
     * outlive any refusal. */
    void *handle = dlopen(real_path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!handle) {
        const char *why = dlerror();
        return refuse(reg, path, err, DSARL_E_INVALID, "%s: not a loadable shared object (%s)", path,
                      why ? why : "dlopen failed");
    }
    dlerror();
    const dsarl_plugin_descriptor *desc = dlsym(handle, DSARL_PLUGIN_SYMBOL);
    if (!desc)
        return refuse(reg, path, err, DSARL_E_ABI,
                      "%s: missing the descriptor symbol '%s' (not a dsarl plugin, or built without "
                      "DSARL_PLUGIN_DEFINE)",
                      path, DSARL_PLUGIN_SYMBOL);
    if (desc->abi_major != DSARL_ABI_MAJOR)
        return refuse(reg, path, err, DSARL_E_ABI,
                      "%s: built for plugin ABI %u.%u, this host speaks ABI %u.%u (major versions must match; "
                      "rebuild the plugin against this dsarl)",
                      path, desc->abi_major, desc->abi_minor, DSARL_ABI_MAJOR, DSARL_ABI_MINOR);
    if (desc->abi_minor > DSARL_ABI_MINOR)
        return refuse(reg, path, err, DSARL_E_ABI,
                      "%s: built for plugin ABI %u.%u, newer than this host's %u.%u (upgrade dsarl)", path,
                      desc->abi_major, desc->abi_minor, DSARL_ABI_MAJOR, DSARL_ABI_MINOR);
    if (desc->struct_size < offsetof(dsarl_plugin_descriptor, reserved))
        return refuse(reg, path, err, DSARL_E_ABI, "%s: descriptor is %u bytes, smaller than the %zu of ABI %u.%u",
                      path, desc->struct_size, offsetof(dsarl_plugin_descriptor, reserved), DSARL_ABI_MAJOR,
                      DSARL_ABI_MINOR);
    if (!valid_name(desc->name) || !desc->version || !desc->init)
        return refuse(reg, path, err, DSARL_E_ABI,
                      "%s: bad descriptor: name, version and init must all be set (name: 1-64 of [A-Za-z0-9_.-])",
                      path);
    if (!desc->build_sig || strcmp(desc->build_sig, DSARL_BUILD_SIG) != 0)
        return refuse(reg, path, err, DSARL_E_ABI,
                      "%s: build signature '%s' does not match this host's '%s' (rebuild against this SDK)", path,
                      desc->build_sig ? desc->build_sig : "(none)", DSARL_BUILD_SIG);

    loaded_plugin *plugin = calloc(1, sizeof *plugin);
    if (!plugin || grow((void **)&reg->plugins, &reg->cap_plugins, reg->n_plugins + 1, sizeof *reg->plugins, err)) {
        free(plugin);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory loading %s", path);
    }
    plugin->path = strdup(path);
    plugin->real_path = strdup(real_path);
    plugin->info.path = plugin->path;
    plugin->info.name = desc->name;
    plugin->info.version = desc->version;
    plugin->info.description = desc->description ? desc->description : "";
    plugin->info.abi_major = desc->abi_major;
    plugin->info.abi_minor = desc->abi_minor;

    dsarl_error init_err;
    dsarl_error_clear(&init_err);
    reg->loading = plugin;
    reg->loading_refused = 0;
    int rc = desc->init(&reg->host, &init_err);
    reg->loading = NULL;
    if (rc < 0 || reg->loading_refused) {
        drop_ops_of(reg, &plugin->info);
        int code = rc < 0 ? rc : init_err.code;
        const char *why = init_err.message[0] ? init_err.message : dsarl_status_name(rc);
        free(plugin->path);
        free(plugin->real_path);
        free(plugin);
        /* A registration error already names the file; an init's own error gets the file prepended. */
        if (strncmp(why, path, strlen(path)) == 0)
            return refuse(reg, path, err, code ? code : DSARL_E_INVALID, "%s", why);
        return refuse(reg, path, err, code ? code : DSARL_E_INVALID, "%s: plugin init failed: %s", path, why);
    }
    reg->plugins[reg->n_plugins++] = plugin;
    dsarl_log(DSARL_LOG_DEBUG, "loaded plugin %s %s from %s", desc->name, desc->version, path);
    return 0;
}

static int compare_strings(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int is_plugin_file_name(const char *name)
{
    size_t n = strlen(name);
    return strncmp(name, "dsarl-", 6) == 0 && n > 9 && strcmp(name + n - 3, ".so") == 0;
}

int dsarl_registry_load_all(dsarl_registry *reg, dsarl_error *err)
{
    for (size_t d = 0; d < reg->n_dirs; d++) {
        DIR *dir = opendir(reg->dirs[d].path);
        if (!dir) {
            // a directory the user named that is not there is most likely a typo: say so; the built-in one is quiet
            bool builtin = strcmp(reg->dirs[d].source, "beside libdsarl") == 0;
            dsarl_log(builtin ? DSARL_LOG_DEBUG : DSARL_LOG_WARN, "plugin directory %s (from %s) %s; skipped",
                      reg->dirs[d].path, reg->dirs[d].source, errno == ENOTDIR ? "is not a directory"
                                                              : errno == ENOENT ? "does not exist"
                                                                                : "cannot be read");
            continue;
        }
        struct stat dst;
        if (fstat(dirfd(dir), &dst) == 0 && (dst.st_mode & S_IWOTH) && !(dst.st_mode & S_ISVTX)) {
            // anyone could drop a .so here and have it run inside dsarl
            dsarl_log(DSARL_LOG_WARN, "plugin directory %s (from %s) is writable by every user (mode %04o); nothing "
                      "in it is loaded (chmod o-w)", reg->dirs[d].path, reg->dirs[d].source,
                      (unsigned)(dst.st_mode & 07777));
            add_refusal(reg, reg->dirs[d].path, "directory writable by every user; nothing in it is loaded");
            closedir(dir);
            continue;
        }
        char **names = NULL;
        size_t n = 0, cap = 0;
        for (struct dirent *e; (e = readdir(dir));) {
            if (!is_plugin_file_name(e->d_name))
                continue;
            if (grow((void **)&names, &cap, n + 1, sizeof *names, err)) {
                closedir(dir);
                return DSARL_E_NOMEM;
            }
            names[n++] = strdup(e->d_name);
        }
        closedir(dir);
        qsort(names, n, sizeof *names, compare_strings); /* deterministic order, so duplicates resolve the same */
        for (size_t i = 0; i < n; i++) {
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/%s", reg->dirs[d].path, names[i]);
            dsarl_registry_load_file(reg, path, NULL); /* refusals are recorded, never fatal */
            free(names[i]);
        }
        free(names);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Lookup. */

const dsarl_ops_common *dsarl_registry_find(const dsarl_registry *reg, dsarl_kind kind, const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < reg->n_ops; i++)
        if (reg->ops[i].kind == kind && strcmp(reg->ops[i].ops->name, name) == 0)
            return reg->ops[i].ops;
    return NULL;
}

int dsarl_registry_require(const dsarl_registry *reg, dsarl_kind kind, const char *name, const char *selected_by,
                           const dsarl_ops_common **out, dsarl_error *err)
{
    *out = dsarl_registry_find(reg, kind, name);
    if (*out)
        return 0;
    char available[512] = "";
    size_t used = 0;
    for (size_t i = 0; i < reg->n_ops && used + 2 < sizeof available; i++) {
        if (reg->ops[i].kind != kind)
            continue;
        int w = snprintf(available + used, sizeof available - used, "%s%s", used ? ", " : "", reg->ops[i].ops->name);
        if (w > 0)
            used += (size_t)w;
    }
    /* A refused file that carries the name in its file name is the likely intended provider. */
    char file_stem[160];
    snprintf(file_stem, sizeof file_stem, "dsarl-%s-%s.so", dsarl_kind_name(kind), name);
    for (size_t i = 0; i < reg->n_refusals; i++) {
        if (strstr(reg->refusals[i].path, file_stem))
            return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s: %s plugin '%s' was refused: %s; available: %s",
                              selected_by, dsarl_kind_name(kind), name, reg->refusals[i].reason,
                              used ? available : "(none)");
    }
    return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s: no %s plugin named '%s'; available: %s", selected_by,
                      dsarl_kind_name(kind), name, used ? available : "(none)");
}

size_t dsarl_registry_ops_count(const dsarl_registry *reg) { return reg->n_ops; }

const dsarl_ops_entry *dsarl_registry_ops_at(const dsarl_registry *reg, size_t i)
{
    return i < reg->n_ops ? &reg->ops[i] : NULL;
}

size_t dsarl_registry_refusal_count(const dsarl_registry *reg) { return reg->n_refusals; }

const dsarl_refusal *dsarl_registry_refusal_at(const dsarl_registry *reg, size_t i)
{
    return i < reg->n_refusals ? &reg->refusals[i] : NULL;
}

size_t dsarl_registry_search_dir_count(const dsarl_registry *reg) { return reg->n_dirs; }

const char *dsarl_registry_search_dir_at(const dsarl_registry *reg, size_t i, const char **source)
{
    if (i >= reg->n_dirs)
        return NULL;
    if (source)
        *source = reg->dirs[i].source;
    return reg->dirs[i].path;
}

void dsarl_registry_free(dsarl_registry *reg)
{
    if (!reg)
        return;
    for (size_t i = 0; i < reg->n_dirs; i++) {
        free(reg->dirs[i].path);
        free(reg->dirs[i].source);
    }
    for (size_t i = 0; i < reg->n_plugins; i++) {
        free(reg->plugins[i]->path);
        free(reg->plugins[i]->real_path);
        free(reg->plugins[i]);
    }
    for (size_t i = 0; i < reg->n_refusals; i++) {
        free((char *)reg->refusals[i].path);
        free((char *)reg->refusals[i].reason);
    }
    for (size_t i = 0; i < reg->n_seen; i++)
        free(reg->seen_real_paths[i]);
    free(reg->dirs);
    free(reg->plugins);
    free(reg->ops);
    free(reg->refusals);
    free(reg->seen_real_paths);
    free(reg);
}
