/* recipe_load.c: YAML (libyaml document API) -> recipe tree, and the `defaults:` chain with OmegaConf merging.
 *
 * libyaml shares aliased nodes instead of copying them, and an anchor is registered before its children load, so
 * `a: &x [*x]` is a cycle in its graph. Before building our tree we measure each libyaml node once (expanded size
 * and height, memoized, with an on-path mark): an alias bomb, an alias cycle or too deep nesting is refused before
 * a single node of ours is allocated. */
#include "recipe_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

/* ---- opening ------------------------------------------------------------------------------------------- */

// A recipe path that names nothing openable is bad input (exit 3), whichever way it is wrong.
static int open_failure(const char *path, dsarl_error *err)
{
    int e = errno;
    if (e == ENOTDIR)
        return DSARL_FAIL(err, DSARL_E_INVALID, "cannot open recipe '%s': a component of the path is a file, not a "
                          "directory", path);
    bool bad_input = e == ENOENT || e == EACCES || e == ELOOP || e == ENAMETOOLONG || e == EISDIR;
    return DSARL_FAIL(err, bad_input ? DSARL_E_NOT_FOUND : DSARL_E_IO, "cannot open recipe '%s': %s", path,
                      strerror(e));
}

/* ---- libyaml errors -------------------------------------------------------------------------------------- */

static int parser_error(const yaml_parser_t *parser, const char *name, dsarl_error *err)
{
    switch (parser->error) {
    case YAML_MEMORY_ERROR: return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory while parsing YAML", name);
    case YAML_READER_ERROR:
        if (parser->problem_value != -1)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: byte %zu: %s (#%X); recipes must be UTF-8 text", name,
                              parser->problem_offset, parser->problem, (unsigned)parser->problem_value);
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: byte %zu: %s", name, parser->problem_offset,
                          parser->problem);
    default:
        // libyaml reads at most 1024 characters as an implicit ("simple") key, and past that reports the ':' it
        // then meets as misplaced, which says nothing about the real cause
        if (parser->problem && parser->problem_mark.column >= 1024 &&
            (strstr(parser->problem, "mapping values are not allowed") ||
             strstr(parser->problem, "could not find expected ':'")))
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s:%zu:%zu: %s: a key longer than 1024 characters? libyaml reads "
                              "at most 1024 characters as a key; shorten it (or write it as an explicit key, "
                              "\"? KEY\" then \": VALUE\")", name, parser->problem_mark.line + 1,
                              parser->problem_mark.column + 1, parser->problem);
        if (parser->context)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s:%zu:%zu: %s (%s at line %zu, column %zu)", name,
                              parser->problem_mark.line + 1, parser->problem_mark.column + 1, parser->problem,
                              parser->context, parser->context_mark.line + 1, parser->context_mark.column + 1);
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s:%zu:%zu: %s", name, parser->problem_mark.line + 1,
                          parser->problem_mark.column + 1, parser->problem ? parser->problem : "invalid YAML");
    }
}

/* ---- measuring a libyaml document ----------------------------------------------------------------------- */

typedef struct measure {
    yaml_document_t *doc;
    const char *name;
    size_t *sizes;    /* expanded node count per libyaml node, saturating at MAX_NODES + 1 */
    int *heights;     /* levels below and including the node */
    char *state;      /* 0 unseen, 1 on the current path, 2 measured */
} measure;

static size_t saturating_add(size_t a, size_t b)
{
    size_t cap = (size_t)DSARL_RECIPE_MAX_NODES + 1;
    return (a + b > cap || a + b < a) ? cap : a + b;
}

static int measure_node(measure *m, int index, int depth, dsarl_error *err)
{
    yaml_node_t *node = yaml_document_get_node(m->doc, index);
    size_t k = (size_t)(index - 1);
    if (!node)
        return DSARL_FAIL(err, DSARL_E_INTERNAL, "%s: libyaml gave a dangling node index %d", m->name, index);
    if (m->state[k] == 1)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "%s:%zu:%zu: an alias refers to the node that contains it (an alias cycle); aliases "
                          "must point to complete, earlier nodes",
                          m->name, node->start_mark.line + 1, node->start_mark.column + 1);
    bool container = node->type != YAML_SCALAR_NODE;
    if (m->state[k] == 0) {
        if (container && depth > DSARL_RECIPE_MAX_DEPTH)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s:%zu:%zu: nesting is deeper than %d levels", m->name,
                              node->start_mark.line + 1, node->start_mark.column + 1, DSARL_RECIPE_MAX_DEPTH);
        m->state[k] = 1;
        size_t size = 1;
        int height = 0;
        if (node->type == YAML_SEQUENCE_NODE) {
            for (yaml_node_item_t *it = node->data.sequence.items.start; it < node->data.sequence.items.top; it++) {
                DSARL_TRY(measure_node(m, *it, depth + 1, err));
                size = saturating_add(size, m->sizes[*it - 1]);
                if (m->heights[*it - 1] > height)
                    height = m->heights[*it - 1];
            }
        } else if (node->type == YAML_MAPPING_NODE) {
            for (yaml_node_pair_t *p = node->data.mapping.pairs.start; p < node->data.mapping.pairs.top; p++) {
                DSARL_TRY(measure_node(m, p->value, depth + 1, err));
                size = saturating_add(size, m->sizes[p->value - 1]);
                if (m->heights[p->value - 1] > height)
                    height = m->heights[p->value - 1];
            }
        }
        m->sizes[k] = size;
        m->heights[k] = container ? height + 1 : 0; // depth counts maps and lists, not scalars
        m->state[k] = 2;
    }
    if (depth + m->heights[k] - 1 > DSARL_RECIPE_MAX_DEPTH)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s:%zu:%zu: nesting (through an alias) is deeper than %d levels",
                          m->name, node->start_mark.line + 1, node->start_mark.column + 1, DSARL_RECIPE_MAX_DEPTH);
    return DSARL_OK;
}

/* ---- libyaml document -> our tree -------------------------------------------------------------------------- */

typedef struct converter {
    yaml_document_t *doc;
    const char *name;
    const dsarl_origin *fixed_origin; /* command line / default: every node gets this; NULL for a file */
} converter;

static dsarl_origin origin_at(const converter *c, const yaml_node_t *node)
{
    if (c->fixed_origin)
        return *c->fixed_origin;
    return (dsarl_origin){.kind = DSARL_ORIGIN_FILE, .file = c->name, .line = (int)node->start_mark.line + 1,
                          .column = (int)node->start_mark.column + 1};
}

/* "file:line:col" of a libyaml node for messages (for a parsed value, "value '...':line:col"). */
static const char *mark_text(const converter *c, const yaml_node_t *node, char *buf, size_t size)
{
    snprintf(buf, size, "%s:%zu:%zu", c->name, node->start_mark.line + 1, node->start_mark.column + 1);
    return buf;
}

typedef struct key_ref {
    const char *key;
    const yaml_node_t *node;
} key_ref;

static int compare_key_ref(const void *a, const void *b)
{
    const key_ref *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    if (c)
        return c;
    return x->node->start_mark.index < y->node->start_mark.index ? -1
           : x->node->start_mark.index > y->node->start_mark.index ? 1
                                                                   : 0;
}

static int convert_node(const converter *c, int index, dsarl_node **out, dsarl_error *err);

static int convert_mapping(const converter *c, yaml_node_t *node, dsarl_node *map, dsarl_error *err)
{
    size_t n = (size_t)(node->data.mapping.pairs.top - node->data.mapping.pairs.start);
    key_ref *keys = n ? calloc(n, sizeof *keys) : NULL;
    char where[512];
    if (n && !keys)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory", c->name);
    int rc = DSARL_OK;
    size_t i = 0;
    for (yaml_node_pair_t *p = node->data.mapping.pairs.start; p < node->data.mapping.pairs.top; p++, i++) {
        yaml_node_t *key = yaml_document_get_node(c->doc, p->key);
        if (!key || key->type != YAML_SCALAR_NODE) {
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: mapping keys must be plain text, not a list or map",
                            key ? mark_text(c, key, where, sizeof where) : c->name);
            goto done;
        }
        const char *text = (const char *)key->data.scalar.value;
        if (key->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && strcmp(text, "<<") == 0) {
            rc = DSARL_FAIL(err, DSARL_E_INVALID,
                            "%s: YAML merge keys (<<) are not supported; use `defaults:` or repeat the keys",
                            mark_text(c, key, where, sizeof where));
            goto done;
        }
        keys[i] = (key_ref){.key = text, .node = key};
    }
    // Duplicates: sort by (key, position) so a repeated key sits next to its first occurrence.
    if (n > 1) {
        qsort(keys, n, sizeof *keys, compare_key_ref);
        for (i = 1; i < n; i++) {
            if (strcmp(keys[i].key, keys[i - 1].key) == 0) {
                rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: duplicate key '%s' (first defined at line %zu)",
                                mark_text(c, keys[i].node, where, sizeof where), keys[i].key,
                                keys[i - 1].node->start_mark.line + 1);
                goto done;
            }
        }
    }
    for (yaml_node_pair_t *p = node->data.mapping.pairs.start; p < node->data.mapping.pairs.top; p++) {
        yaml_node_t *key = yaml_document_get_node(c->doc, p->key);
        dsarl_node *child = NULL;
        if ((rc = convert_node(c, p->value, &child, err)) < 0)
            goto done;
        if (recipe_node_append(map, (const char *)key->data.scalar.value, child) < 0) {
            recipe_node_free(child);
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory", c->name);
            goto done;
        }
    }
done:
    free(keys);
    return rc;
}

static int convert_node(const converter *c, int index, dsarl_node **out, dsarl_error *err)
{
    yaml_node_t *node = yaml_document_get_node(c->doc, index);
    dsarl_origin origin = origin_at(c, node);
    char where[512];
    *out = NULL;
    // the loader gives untagged nodes these defaults (so !!str, !!map, !!seq pass unseen); any other tag would be
    // silently dropped, so it is refused
    const char *tag = (const char *)node->tag;
    const char *untagged = node->type == YAML_SCALAR_NODE    ? YAML_STR_TAG
                           : node->type == YAML_MAPPING_NODE ? YAML_MAP_TAG
                                                             : YAML_SEQ_TAG;
    if (tag && strcmp(tag, untagged) != 0) {
        bool core = strncmp(tag, "tag:yaml.org,2002:", 18) == 0;
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: YAML tag '%s%s' is not supported; recipes hold plain values "
                          "(quote a string, write numbers, booleans and null plainly)",
                          mark_text(c, node, where, sizeof where), core ? "!!" : "", core ? tag + 18 : tag);
    }
    if (node->type == YAML_SCALAR_NODE) {
        const char *text = (const char *)node->data.scalar.value;
        size_t len = node->data.scalar.length;
        if (node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
            int rc = recipe_scalar_from_plain(text, len, &origin, out, err);
            if (rc < 0 && rc != DSARL_E_NOMEM)
                dsarl_error_prefix(err, "%s", mark_text(c, node, where, sizeof where));
            return rc;
        }
        char *copy = strndup(text, len);
        *out = copy ? recipe_scalar_string(copy, &origin) : NULL;
        free(copy);
        return *out ? DSARL_OK : DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory", c->name);
    }
    dsarl_node *container =
        recipe_node_new(node->type == YAML_MAPPING_NODE ? DSARL_NODE_MAP : DSARL_NODE_LIST, &origin);
    if (!container)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory", c->name);
    int rc = DSARL_OK;
    if (node->type == YAML_MAPPING_NODE) {
        rc = convert_mapping(c, node, container, err);
    } else {
        for (yaml_node_item_t *it = node->data.sequence.items.start; it < node->data.sequence.items.top; it++) {
            dsarl_node *child = NULL;
            if ((rc = convert_node(c, *it, &child, err)) < 0)
                break;
            if (recipe_node_append(container, NULL, child) < 0) {
                recipe_node_free(child);
                rc = DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory", c->name);
                break;
            }
        }
    }
    if (rc < 0) {
        recipe_node_free(container);
        return rc;
    }
    *out = container;
    return DSARL_OK;
}

/* Loads the one document the parser holds into *out (NULL for an empty document). */
static int load_document(yaml_parser_t *parser, const char *name, const dsarl_origin *fixed_origin,
                         dsarl_node **out, dsarl_error *err)
{
    yaml_document_t doc;
    *out = NULL;
    if (!yaml_parser_load(parser, &doc))
        return parser_error(parser, name, err);
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    int rc = DSARL_OK;
    if (root) {
        // A second document is a mistake (a stray `---`), not something to ignore.
        yaml_document_t extra;
        if (!yaml_parser_load(parser, &extra)) {
            rc = parser_error(parser, name, err);
        } else {
            if (yaml_document_get_root_node(&extra))
                rc = DSARL_FAIL(err, DSARL_E_INVALID,
                                "%s:%zu:%zu: a second YAML document starts here; a recipe is one document", name,
                                extra.start_mark.line + 1, extra.start_mark.column + 1);
            yaml_document_delete(&extra);
        }
    }
    if (root && rc == DSARL_OK) {
        size_t n = (size_t)(doc.nodes.top - doc.nodes.start);
        measure m = {.doc = &doc, .name = name, .sizes = calloc(n, sizeof(size_t)), .heights = calloc(n, sizeof(int)),
                     .state = calloc(n, 1)};
        if (!m.sizes || !m.heights || !m.state)
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory", name);
        else
            rc = measure_node(&m, 1, 1, err);
        if (rc == DSARL_OK && m.sizes[0] > DSARL_RECIPE_MAX_NODES)
            rc = DSARL_FAIL(err, DSARL_E_INVALID,
                            "%s:%zu:%zu: the document expands to more than %d nodes through aliases (an alias bomb?); "
                            "refusing to load it",
                            name, root->start_mark.line + 1, root->start_mark.column + 1, DSARL_RECIPE_MAX_NODES);
        free(m.sizes);
        free(m.heights);
        free(m.state);
        if (rc == DSARL_OK) {
            converter c = {.doc = &doc, .name = name, .fixed_origin = fixed_origin};
            rc = convert_node(&c, 1, out, err);
        }
    }
    yaml_document_delete(&doc);
    return rc;
}

/* Streams the events once, only counting nesting, and stops at the first level past the cap. libyaml's scanner
 * slows down quadratically with flow nesting ("[[[[..." 200,000 deep takes minutes), so the cap must bite before
 * the document loader ever sees such input. */
static int check_nesting(const char *data, size_t len, const char *name, dsarl_error *err)
{
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory creating a YAML parser");
    yaml_parser_set_input_string(&parser, (const unsigned char *)data, len);
    yaml_parser_set_encoding(&parser, YAML_UTF8_ENCODING); // never guessed from bytes: FF FE is not a UTF-16 BOM
    int rc = DSARL_OK, depth = 0;
    for (bool done = false; !done && rc == DSARL_OK;) {
        yaml_event_t event;
        if (!yaml_parser_parse(&parser, &event)) {
            rc = parser_error(&parser, name, err);
            break;
        }
        switch (event.type) {
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT:
            if (++depth > DSARL_RECIPE_MAX_DEPTH)
                rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s:%zu:%zu: nesting is deeper than %d levels", name,
                                event.start_mark.line + 1, event.start_mark.column + 1, DSARL_RECIPE_MAX_DEPTH);
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT: depth--; break;
        case YAML_STREAM_END_EVENT: done = true; break;
        default: break;
        }
        yaml_event_delete(&event);
    }
    yaml_parser_delete(&parser);
    return rc;
}

/* Parses YAML text (one document) into *out: nesting check first, then the document loader. */
static int parse_text(const char *data, size_t len, const char *name, const dsarl_origin *fixed_origin,
                      dsarl_node **out, dsarl_error *err)
{
    *out = NULL;
    DSARL_TRY(check_nesting(data, len, name, err));
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory creating a YAML parser");
    yaml_parser_set_input_string(&parser, (const unsigned char *)data, len);
    yaml_parser_set_encoding(&parser, YAML_UTF8_ENCODING); // never guessed from bytes: FF FE is not a UTF-16 BOM
    int rc = load_document(&parser, name, fixed_origin, out, err);
    yaml_parser_delete(&parser);
    return rc;
}

int recipe_parse_value(const char *text, const dsarl_origin *origin, dsarl_node **out, dsarl_error *err)
{
    // Callers prefix their own context (the argument, the plugin), so messages name just the value.
    char where[512];
    snprintf(where, sizeof where, "value '%s'", text);
    int rc = parse_text(text, strlen(text), where, origin, out, err);
    if (rc == DSARL_OK && !*out && !(*out = recipe_scalar_null(origin)))
        rc = DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
    return rc;
}

/* ---- merging (OmegaConf.merge + NeMo RL's _override_) ------------------------------------------------------- */

static bool wants_override(const dsarl_node *map)
{
    long i = recipe_map_index(map, "_override_");
    return i >= 0 && map->items[i]->type == DSARL_NODE_BOOL && map->items[i]->bool_value;
}

int recipe_merge_maps(dsarl_node *dst, dsarl_node *src)
{
    int rc = DSARL_OK;
    for (size_t i = 0; i < src->count && rc == DSARL_OK; i++) {
        dsarl_node *s = src->items[i];
        if (strcmp(s->key, "_override_") == 0)
            continue;
        long j = recipe_map_index(dst, s->key);
        src->items[i] = NULL;
        if (j < 0) {
            char *key = s->key;
            s->key = NULL;
            rc = recipe_node_append(dst, key, s);
            free(key);
            if (rc < 0)
                recipe_node_free(s);
        } else if (s->type == DSARL_NODE_MAP && dst->items[j]->type == DSARL_NODE_MAP && !wants_override(s)) {
            rc = recipe_merge_maps(dst->items[j], s);
        } else {
            recipe_node_replace_at(dst, (size_t)j, s);
        }
    }
    recipe_node_free(src);
    return rc;
}

/* Drops every `_override_` key below node once the merge that needed it is done. */
static void strip_override_keys(dsarl_node *node)
{
    if (node->type == DSARL_NODE_MAP) {
        long i = recipe_map_index(node, "_override_");
        if (i >= 0)
            recipe_node_remove_at(node, (size_t)i);
    }
    for (size_t i = 0; i < node->count; i++)
        strip_override_keys(node->items[i]);
}

/* ---- the defaults chain ------------------------------------------------------------------------------------- */

#define MAX_INCLUDE_CHAIN 32

typedef struct include_chain {
    char *display[MAX_INCLUDE_CHAIN]; /* paths as the user sees them */
    char *real[MAX_INCLUDE_CHAIN];    /* realpath() of each, for cycle detection */
    size_t n;
} include_chain;

/* Parses the file at open_path; origins and messages name it path. Only a regular file of at most
 * DSARL_RECIPE_MAX_FILE_BYTES is read: a FIFO would block forever and a device (/dev/zero) never ends. */
static int load_tree_file(const char *open_path, const char *path, dsarl_node **out, dsarl_error *err)
{
    int fd = open(open_path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return open_failure(path, err);
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return DSARL_FAIL(err, DSARL_E_INVALID, "recipe '%s' is not a regular file (%s); give a YAML file", path,
                          S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a pipe" : "a device or socket");
    }
    if (st.st_size > DSARL_RECIPE_MAX_FILE_BYTES) {
        close(fd);
        return DSARL_FAIL(err, DSARL_E_INVALID, "recipe '%s' is %lld bytes, more than the %d a recipe may have", path,
                          (long long)st.st_size, DSARL_RECIPE_MAX_FILE_BYTES);
    }
    // Recipes are small: read the whole file, since the nesting check and the loader each need a pass.
    size_t cap = (size_t)st.st_size, len = 0;
    char *data = malloc(cap + 1);
    int rc = data ? DSARL_OK : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory reading '%s'", path);
    while (rc == DSARL_OK && len < cap) {
        ssize_t got = read(fd, data + len, cap - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            rc = DSARL_FAIL(err, DSARL_E_IO, "cannot read recipe '%s': %s", path, strerror(errno));
        if (got <= 0)
            break; // a file that shrank while read: parse what is there
        len += (size_t)got;
    }
    close(fd);
    if (rc == DSARL_OK)
        rc = parse_text(data, len, path, NULL, out, err);
    free(data);
    return rc;
}

static int load_tree_string(const char *yaml, const char *name, dsarl_node **out, dsarl_error *err)
{
    return parse_text(yaml, strlen(yaml), name, NULL, out, err);
}

/* Removes "." segments and "dir/.." pairs in place, so messages say "configs/base.yaml" rather than
 * "configs/recipes/llm/../../base.yaml". Lexical only: the cycle check uses realpath(). */
static void normalize_lexically(char *path)
{
    bool absolute = path[0] == '/';
    char *segments[256];
    size_t slashes = 0, original_len = strlen(path);
    for (const char *p = path; *p; p++)
        slashes += *p == '/';
    if (slashes >= sizeof segments / sizeof segments[0])
        return;
    size_t n = 0;
    for (char *p = path, *save = NULL, *seg; (seg = strtok_r(p, "/", &save)); p = NULL) {
        if (strcmp(seg, ".") == 0)
            continue;
        if (strcmp(seg, "..") == 0 && n > 0 && strcmp(segments[n - 1], "..") != 0) {
            n--;
            continue;
        }
        if (strcmp(seg, "..") == 0 && n == 0 && absolute)
            continue;
        segments[n++] = seg;
    }
    char *copy = malloc(original_len + 2);
    if (!copy)
        return;
    size_t len = 0;
    if (absolute)
        copy[len++] = '/';
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(segments[i]);
        memmove(copy + len, segments[i], l);
        len += l;
        if (i + 1 < n)
            copy[len++] = '/';
    }
    if (len == 0)
        copy[len++] = '.';
    copy[len] = '\0';
    strcpy(path, copy);
    free(copy);
}

/* Joins a defaults entry to the directory of the including file (dir NULL or "" means the cwd). */
static char *join_relative(const char *dir, const char *entry)
{
    if (entry[0] == '/' || !dir || !dir[0])
        return strdup(entry);
    size_t n = strlen(dir) + strlen(entry) + 2;
    char *path = malloc(n);
    if (path)
        snprintf(path, n, "%s/%s", dir, entry);
    return path;
}

static char *directory_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return strdup("");
    if (slash == path)
        return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

static int compose(const char *name, dsarl_node *tree, const char *dir, include_chain *chain, dsarl_node **out,
                   dsarl_error *err);

/* Loads one defaults file (named by entry, relative to dir) and everything it includes. */
static int load_included(const dsarl_node *entry, const char *dir, include_chain *chain, dsarl_node **out,
                         dsarl_error *err)
{
    char where[512];
    dsarl_node_where(entry, where, sizeof where);
    char *path = join_relative(dir, entry->text);
    if (!path)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
    // The file is opened through its realpath (the OS's view of "..", symlinks included); messages use the
    // lexically normalized path.
    char *real = realpath(path, NULL);
    int rc = DSARL_OK;
    if (real)
        normalize_lexically(path);
    if (!real) {
        rc = DSARL_FAIL(err, DSARL_E_NOT_FOUND, "%s: defaults file '%s' not found (looked for '%s': %s)", where,
                        entry->text, path, strerror(errno));
        free(path);
        return rc;
    }
    for (size_t i = 0; i < chain->n; i++) {
        if (strcmp(chain->real[i], real) == 0) {
            char text[DSARL_ERROR_MESSAGE_MAX] = "";
            size_t len = 0;
            for (size_t k = i; k < chain->n; k++)
                len += (size_t)snprintf(text + len, len < sizeof text ? sizeof text - len : 0, "%s -> ",
                                        chain->display[k]);
            if (len < sizeof text)
                snprintf(text + len, sizeof text - len, "%s", path);
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: include cycle: %s", where, text);
            free(real);
            free(path);
            return rc;
        }
    }
    if (chain->n == MAX_INCLUDE_CHAIN) {
        free(real);
        free(path);
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: defaults nest deeper than %d files", where, MAX_INCLUDE_CHAIN);
    }
    dsarl_node *tree = NULL;
    rc = load_tree_file(real, path, &tree, err);
    if (rc == DSARL_OK) {
        chain->display[chain->n] = path;
        chain->real[chain->n] = real;
        chain->n++;
        char *sub_dir = directory_of(path);
        rc = sub_dir ? compose(path, tree, sub_dir, chain, out, err) : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
        free(sub_dir);
        chain->n--;
    }
    free(real);
    free(path);
    return rc;
}

/* Turns one file's tree into the merged result of its defaults (left to right) with the file itself on top. */
static int compose(const char *name, dsarl_node *tree, const char *dir, include_chain *chain, dsarl_node **out,
                   dsarl_error *err)
{
    char where[512];
    *out = NULL;
    if (!tree) {
        // An empty file is an empty recipe, as OmegaConf.load gives {}.
        dsarl_origin origin = {.kind = DSARL_ORIGIN_FILE, .file = name, .line = 1, .column = 1};
        if (!(tree = recipe_node_new(DSARL_NODE_MAP, &origin)))
            return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
    }
    if (tree->type != DSARL_NODE_MAP) {
        int rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: the top level of a recipe must be a map of sections, got a %s",
                            dsarl_node_where(tree, where, sizeof where), dsarl_node_type_name(tree->type));
        recipe_node_free(tree);
        return rc;
    }
    long d = recipe_map_index(tree, "defaults");
    if (d < 0) {
        strip_override_keys(tree);
        *out = tree;
        return DSARL_OK;
    }
    dsarl_node *defaults = tree->items[d];
    int rc = DSARL_OK;
    dsarl_node *base = NULL;
    size_t n_entries = defaults->type == DSARL_NODE_LIST ? defaults->count : 1;
    if (defaults->type != DSARL_NODE_STRING && defaults->type != DSARL_NODE_LIST &&
        defaults->type != DSARL_NODE_NULL) {
        rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: defaults must be a file name or a list of file names, got a %s",
                        dsarl_node_where(defaults, where, sizeof where), dsarl_node_type_name(defaults->type));
    }
    if (defaults->type == DSARL_NODE_NULL)
        n_entries = 0;
    for (size_t i = 0; i < n_entries && rc == DSARL_OK; i++) {
        const dsarl_node *entry = defaults->type == DSARL_NODE_LIST ? defaults->items[i] : defaults;
        if (entry->type != DSARL_NODE_STRING) {
            rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s: each defaults entry must be a file name, got a %s",
                            dsarl_node_where(entry, where, sizeof where), dsarl_node_type_name(entry->type));
            break;
        }
        dsarl_node *parent = NULL;
        if ((rc = load_included(entry, dir, chain, &parent, err)) < 0)
            break;
        if (!base)
            base = parent;
        else
            rc = recipe_merge_maps(base, parent);
    }
    recipe_node_remove_at(tree, (size_t)d);
    if (rc == DSARL_OK && base) {
        // The file itself merges on top; its _override_ flags apply to this merge only.
        rc = recipe_merge_maps(base, tree);
        tree = NULL;
    } else if (rc == DSARL_OK) {
        base = tree;
        tree = NULL;
    }
    recipe_node_free(tree);
    if (rc < 0) {
        recipe_node_free(base);
        return rc;
    }
    strip_override_keys(base);
    *out = base;
    return DSARL_OK;
}

static int finish(dsarl_node *root, dsarl_recipe **out, dsarl_error *err)
{
    dsarl_recipe *r = calloc(1, sizeof *r);
    if (!r) {
        recipe_node_free(root);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
    }
    r->root = root;
    *out = r;
    return DSARL_OK;
}

int dsarl_recipe_load_file(const char *path, dsarl_recipe **out, dsarl_error *err)
{
    *out = NULL;
    include_chain chain = {.n = 0};
    char *real = realpath(path, NULL);
    if (!real)
        return open_failure(path, err);
    dsarl_node *tree = NULL;
    int rc = load_tree_file(path, path, &tree, err);
    if (rc < 0) {
        free(real);
        return rc;
    }
    chain.display[0] = (char *)path;
    chain.real[0] = real;
    chain.n = 1;
    char *dir = directory_of(path);
    dsarl_node *root = NULL;
    rc = dir ? compose(path, tree, dir, &chain, &root, err) : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
    free(dir);
    free(real);
    if (rc < 0)
        return rc;
    return finish(root, out, err);
}

int dsarl_recipe_load_string(const char *yaml, const char *name, dsarl_recipe **out, dsarl_error *err)
{
    *out = NULL;
    if (!name)
        name = "<string>";
    include_chain chain = {.n = 0};
    dsarl_node *tree = NULL;
    DSARL_TRY(load_tree_string(yaml, name, &tree, err));
    dsarl_node *root = NULL;
    DSARL_TRY(compose(name, tree, "", &chain, &root, err));
    return finish(root, out, err);
}

const dsarl_node *dsarl_recipe_root(const dsarl_recipe *r)
{
    return r ? r->root : NULL;
}

void dsarl_recipe_free(dsarl_recipe *r)
{
    if (!r)
        return;
    recipe_node_free(r->root);
    free(r);
}
