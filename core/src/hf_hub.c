/* hf_hub.c: finding a hub id in the Hugging Face cache, offline. */
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dsarl/fileutil.h"
#include "dsarl/hf_hub.h"

enum { HUB_NAME_MAX = 96, REF_FILE_MAX = 256 };

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

// One side of "owner/name": the hub's characters, not empty, not hidden, no "..", at most 96 bytes.
static bool hub_part_ok(const char *s, size_t n)
{
    if (n == 0 || n > HUB_NAME_MAX || s[0] == '.' || s[0] == '-')
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!(isalnum(c) || c == '-' || c == '_' || c == '.'))
            return false;
        if (c == '.' && i + 1 < n && s[i + 1] == '.')
            return false;
    }
    return true;
}

bool dsarl_hf_is_hub_id(const char *name)
{
    if (!name)
        return false;
    const char *slash = strchr(name, '/');
    if (!slash || strchr(slash + 1, '/'))
        return false;
    if (!hub_part_ok(name, (size_t)(slash - name)) || !hub_part_ok(slash + 1, strlen(slash + 1)))
        return false;
    return !dsarl_path_exists(name);
}

int dsarl_hf_cache_dir(char *out, size_t size, const char **source, dsarl_error *err)
{
    static const struct { const char *var, *suffix; } order[] = {
        {"HF_HUB_CACHE", ""}, {"HF_HOME", "/hub"}, {"XDG_CACHE_HOME", "/huggingface/hub"},
        {"HOME", "/.cache/huggingface/hub"}};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        const char *v = getenv(order[i].var);
        if (!v || !v[0])
            continue;
        int n = snprintf(out, size, "%s%s", v, order[i].suffix);
        if (n < 0 || (size_t)n >= size)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s is longer than %zu bytes", order[i].var, size - 1);
        if (source)
            *source = order[i].var;
        return DSARL_OK;
    }
    return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "no Hugging Face cache: none of HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME "
                      "or HOME is set");
}

static bool is_commit(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++)
        if (!isxdigit((unsigned char)s[n]))
            return false;
    return n == 40;
}

// A branch, tag or "refs/pr/N": the hub's characters and '/', no "..", no leading '/' or '.'.
static bool revision_ok(const char *r)
{
    size_t n = strlen(r);
    if (n == 0 || n > 255 || r[0] == '/' || r[0] == '.' || strstr(r, ".."))
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)r[i];
        if (!(isalnum(c) || c == '-' || c == '_' || c == '.' || c == '/'))
            return false;
    }
    return true;
}

// The commit refs/<revision> of repo points to, into commit (41 bytes); false when the ref is missing or malformed.
static bool read_ref(const char *repo, const char *revision, char commit[41])
{
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/refs/%s", repo, revision);
    if (n < 0 || (size_t)n >= sizeof path)
        return false;
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > REF_FILE_MAX)
        return false;
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    char buf[REF_FILE_MAX + 1];
    size_t got = fread(buf, 1, REF_FILE_MAX, f);
    fclose(f);
    buf[got] = 0;
    while (got > 0 && isspace((unsigned char)buf[got - 1]))
        buf[--got] = 0;
    if (!is_commit(buf))
        return false;
    memcpy(commit, buf, 41);
    return true;
}

// Up to three snapshot names of repo, ", "-separated, for a message ("none" when there are none).
static void list_snapshots(const char *repo, char *out, size_t size)
{
    snprintf(out, size, "none");
    char path[4096];
    snprintf(path, sizeof path, "%s/snapshots", repo);
    DIR *d = opendir(path);
    if (!d)
        return;
    size_t used = 0;
    int shown = 0;
    struct dirent *e;
    while ((e = readdir(d)) && shown < 3) {
        if (e->d_name[0] == '.')
            continue;
        int n = snprintf(out + used, size - used, "%s%.12s", shown ? ", " : "", e->d_name);
        if (n < 0 || (size_t)n >= size - used)
            break;
        used += (size_t)n, shown++;
    }
    closedir(d);
}

int dsarl_hf_resolve(const char *name, const char *revision, const char *key, char *out, size_t size,
                     dsarl_error *err)
{
    if (!key)
        key = "model";
    if (!name || !name[0])
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: empty; give a local directory or a hub id such as "
                          "zai-org/GLM-5.2", key);
    if (dsarl_path_exists(name)) {
        if (strlen(name) >= size)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s '%s': longer than %zu bytes", key, name, size - 1);
        snprintf(out, size, "%s", name);
        return DSARL_OK;
    }
    if (!dsarl_hf_is_hub_id(name))
        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s '%s': no such file or directory (and not a hub id of the "
                          "form owner/name)", key, name);
    const char *rev = revision && revision[0] ? revision : "main";
    if (!is_commit(rev) && !revision_ok(rev))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s '%s': revision '%s' is neither a 40-digit commit nor a branch or "
                          "tag name", key, name, rev);
    char cache[4096];
    const char *source = NULL;
    DSARL_TRY(dsarl_hf_cache_dir(cache, sizeof cache, &source, err));
    char repo[4096];
    const char *slash = strchr(name, '/');
    int n = snprintf(repo, sizeof repo, "%s/models--%.*s--%s", cache, (int)(slash - name), name, slash + 1);
    if (n < 0 || (size_t)n >= sizeof repo)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s '%s': the cache path under %s is too long", key, name, source);
    const char *offline = getenv("HF_HUB_OFFLINE");
    bool is_offline = offline && offline[0] && strcmp(offline, "0") != 0;
    if (!is_dir(repo))
        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s '%s': not in the Hugging Face cache (looked for %s, the cache "
                          "from %s); %s `hf download %s` (pip install huggingface_hub), point HF_HUB_CACHE or HF_HOME "
                          "at the cache that holds it, or give a local directory", key, name, repo, source,
                          is_offline ? "HF_HUB_OFFLINE is set, so on a machine with network access run" : "run",
                          name);
    char commit[41];
    if (is_commit(rev))
        snprintf(commit, sizeof commit, "%s", rev);
    else if (!read_ref(repo, rev, commit)) {
        char snapshots[160];
        list_snapshots(repo, snapshots, sizeof snapshots);
        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s '%s': the cache (%s) has no ref '%s' (refs/%s is missing or "
                          "not a commit; snapshots: %s); run `hf download %s --revision %s` or ask for "
                          "a revision that is a commit", key, name, repo, rev, rev, snapshots, name, rev);
    }
    n = snprintf(out, size, "%s/snapshots/%s", repo, commit);
    if (n < 0 || (size_t)n >= size)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s '%s': the snapshot path is longer than %zu bytes", key, name,
                          size - 1);
    if (!is_dir(out)) {
        char snapshots[160];
        list_snapshots(repo, snapshots, sizeof snapshots);
        return DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s '%s': revision %s points to snapshot %.12s, which is not in the "
                          "cache %s (snapshots: %s); run `hf download %s --revision %s`", key, name, rev, commit,
                          repo, snapshots, name, rev);
    }
    return DSARL_OK;
}

void dsarl_hf_find(const char *name, const char *revision, char *out, size_t size)
{
    dsarl_error quiet = {0};
    if (!dsarl_hf_is_hub_id(name) || dsarl_hf_resolve(name, revision, "policy.model_name", out, size, &quiet) != 0)
        snprintf(out, size, "%s", name);
}
