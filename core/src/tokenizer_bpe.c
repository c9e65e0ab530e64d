/* tokenizer_bpe.c: Hugging Face tokenizer.json (BPE model, byte-level pre-tokenizer) loading and BPE encoding.
 *
 * Encoding one pre-tokenizer piece: its bytes become GPT-2's printable stand-in characters (bytes_to_unicode),
 * one symbol each; then, as in tokenizers' BPE::merge_word, the adjacent pair with the lowest merge rank (the
 * leftmost on ties) is merged, one occurrence at a time, until no pair has a merge. */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "dsarl/json.h"

/* ---- hash maps ------------------------------------------------------------------------------------------------ */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; // FNV-1a
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static int str_map_grow(str_map *m)
{
    size_t cap = m->cap ? m->cap * 2 : 1024;
    char **keys = calloc(cap, sizeof *keys);
    int32_t *values = calloc(cap, sizeof *values);
    if (!keys || !values) {
        free(keys);
        free(values);
        return DSARL_E_NOMEM;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i])
            continue;
        size_t j = hash_bytes(m->keys[i], strlen(m->keys[i])) & (cap - 1);
        while (keys[j])
            j = (j + 1) & (cap - 1);
        keys[j] = m->keys[i];
        values[j] = m->values[i];
    }
    free(m->keys);
    free(m->values);
    m->keys = keys;
    m->values = values;
    m->cap = cap;
    return 0;
}

int str_map_put(str_map *m, char *key, int32_t value)
{
    if ((m->count + 1) * 2 > m->cap && str_map_grow(m) < 0)
        return DSARL_E_NOMEM;
    size_t len = strlen(key);
    size_t j = hash_bytes(key, len) & (m->cap - 1);
    for (; m->keys[j]; j = (j + 1) & (m->cap - 1))
        if (strcmp(m->keys[j], key) == 0)
            return 0;
    m->keys[j] = key;
    m->values[j] = value;
    m->count++;
    return 0;
}

int32_t str_map_get(const str_map *m, const char *key, size_t len)
{
    if (!m->cap)
        return -1;
    for (size_t j = hash_bytes(key, len) & (m->cap - 1); m->keys[j]; j = (j + 1) & (m->cap - 1))
        if (strncmp(m->keys[j], key, len) == 0 && m->keys[j][len] == '\0')
            return m->values[j];
    return -1;
}

void str_map_free(str_map *m)
{
    free(m->keys);
    free(m->values);
    memset(m, 0, sizeof *m);
}

static uint64_t pair_key(int32_t a, int32_t b) { return (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1; }

static size_t pair_slot(uint64_t key, size_t cap) { return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1); }

static int merge_map_init(merge_map *m, size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n + 16)
        cap *= 2;
    m->keys = calloc(cap, sizeof *m->keys);
    m->rank = calloc(cap, sizeof *m->rank);
    m->merged = calloc(cap, sizeof *m->merged);
    m->cap = cap;
    return m->keys && m->rank && m->merged ? 0 : DSARL_E_NOMEM;
}

/* Records a merge; the first (lowest) rank of a repeated pair wins, as when tokenizers builds its map. */
static void merge_map_put(merge_map *m, int32_t a, int32_t b, int32_t rank, int32_t merged)
{
    uint64_t key = pair_key(a, b);
    size_t j = pair_slot(key, m->cap);
    for (; m->keys[j]; j = (j + 1) & (m->cap - 1))
        if (m->keys[j] == key)
            return;
    m->keys[j] = key;
    m->rank[j] = rank;
    m->merged[j] = merged;
    m->count++;
}

/* Rank of merging (a, b), or -1; *merged gets the resulting id. */
static int32_t merge_map_get(const merge_map *m, int32_t a, int32_t b, int32_t *merged)
{
    uint64_t key = pair_key(a, b);
    for (size_t j = pair_slot(key, m->cap); m->keys[j]; j = (j + 1) & (m->cap - 1)) {
        if (m->keys[j] == key) {
            *merged = m->merged[j];
            return m->rank[j];
        }
    }
    return -1;
}

/* ---- GPT-2's byte <-> printable character map ------------------------------------------------------------------ */

/* bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68 map to U+0100.. in byte order. */
static uint32_t byte_to_codepoint(unsigned b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
        return b;
    uint32_t k = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF)))
            k++;
    return 0x100 + k;
}

/* UTF-8 of a code point below U+0800 (all the map produces) into out; returns its length. */
static size_t utf8_encode_small(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* ---- loading ------------------------------------------------------------------------------------------------- */

static const char *const CL100K_REGEX =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const QWEN2_REGEX =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const GPT2_REGEX = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* A JSON member that must be absent, null, false, "" or 0 (an option dsarl does not implement). */
static int require_off(const json_t *obj, const char *key, const char *where, const char *what, dsarl_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v) || json_is_false(v) || (json_is_string(v) && json_string_length(v) == 0) ||
        (json_is_number(v) && json_number_value(v) == 0.0))
        return 0;
    return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key '%s' is set, but dsarl's BPE does not implement %s; "
                      "supported: null/false/empty", where, key, what);
}

static int parse_byte_level(const json_t *pt, const char *where, bool inside_split, dsarl_tokenizer *tok,
                            dsarl_error *err)
{
    int add_prefix = 0, use_regex = 1;
    DSARL_TRY(dsarl_json_get_bool_or(pt, "add_prefix_space", where, 0, &add_prefix, err));
    DSARL_TRY(dsarl_json_get_bool_or(pt, "use_regex", where, 1, &use_regex, err));
    if (inside_split && use_regex)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key 'use_regex' is true after a Split pre-tokenizer; "
                          "dsarl supports Split followed by ByteLevel with use_regex false", where);
    tok->add_prefix_space = add_prefix != 0;
    if (!inside_split)
        tok->pattern = use_regex ? PRETOK_GPT2 : PRETOK_NONE;
    return 0;
}

static int parse_split(const json_t *pt, const char *where, dsarl_tokenizer *tok, dsarl_error *err)
{
    json_t *pattern;
    const char *behavior, *regex = NULL;
    int invert = 0;
    DSARL_TRY(dsarl_json_get_object(pt, "pattern", where, &pattern, err));
    char inner[512];
    snprintf(inner, sizeof inner, "%s.pattern", where);
    int rc = dsarl_json_get_string(pattern, "Regex", inner, &regex, err);
    if (rc < 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key 'Regex' is missing; dsarl supports Split patterns "
                          "given as {\"Regex\": ...} (GPT-2, cl100k/GLM or Qwen2 regex)", inner);
    DSARL_TRY(dsarl_json_get_string(pt, "behavior", where, &behavior, err));
    DSARL_TRY(dsarl_json_get_bool_or(pt, "invert", where, 0, &invert, err));
    if (strcmp(behavior, "Isolated") != 0 || invert)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key 'behavior' is '%s'%s; dsarl supports Split with "
                          "behavior Isolated and invert false", where, behavior, invert ? " with invert true" : "");
    if (strcmp(regex, CL100K_REGEX) == 0)
        tok->pattern = PRETOK_CL100K;
    else if (strcmp(regex, QWEN2_REGEX) == 0)
        tok->pattern = PRETOK_QWEN2;
    else if (strcmp(regex, GPT2_REGEX) == 0)
        tok->pattern = PRETOK_GPT2;
    else
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key 'Regex' is a pattern dsarl does not implement (it "
                          "supports exactly GPT-2's, cl100k's as used by GLM-4/GLM-5 and Llama-3, and Qwen2's)", inner);
    return 0;
}

static int parse_pre_tokenizer(const json_t *root, const char *file, dsarl_tokenizer *tok, dsarl_error *err)
{
    const json_t *pt = json_object_get(root, "pre_tokenizer");
    char where[512];
    snprintf(where, sizeof where, "%s: pre_tokenizer", file);
    const char *type = NULL;
    if (!pt || !json_is_object(pt))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key 'pre_tokenizer' is %s; dsarl needs a ByteLevel "
                          "pre-tokenizer (alone or after a Split)", file, dsarl_json_type_name(pt));
    DSARL_TRY(dsarl_json_get_string(pt, "type", where, &type, err));
    if (strcmp(type, "ByteLevel") == 0)
        return parse_byte_level(pt, where, false, tok, err);
    if (strcmp(type, "Sequence") != 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: type '%s' is not supported; use ByteLevel or "
                          "Sequence[Split, ByteLevel]", where, type);
    json_t *list;
    DSARL_TRY(dsarl_json_get_array(pt, "pretokenizers", where, &list, err));
    const char *t0 = NULL, *t1 = NULL;
    if (json_array_size(list) == 2) {
        char w0[600];
        snprintf(w0, sizeof w0, "%s.pretokenizers[0]", where);
        DSARL_TRY(dsarl_json_get_string(json_array_get(list, 0), "type", w0, &t0, err));
        snprintf(w0, sizeof w0, "%s.pretokenizers[1]", where);
        DSARL_TRY(dsarl_json_get_string(json_array_get(list, 1), "type", w0, &t1, err));
    }
    if (!t0 || strcmp(t0, "Split") != 0 || strcmp(t1, "ByteLevel") != 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s.pretokenizers: dsarl supports exactly [Split, ByteLevel] "
                          "in a Sequence", where);
    char w[600];
    snprintf(w, sizeof w, "%s.pretokenizers[0]", where);
    DSARL_TRY(parse_split(json_array_get(list, 0), w, tok, err));
    snprintf(w, sizeof w, "%s.pretokenizers[1]", where);
    return parse_byte_level(json_array_get(list, 1), w, true, tok, err);
}

/* Grows tok's id tables to hold id. */
static int ensure_id(dsarl_tokenizer *tok, int32_t id, int32_t *cap)
{
    if (id < *cap) {
        if (id >= tok->vocab_size)
            tok->vocab_size = id + 1;
        return 0;
    }
    int32_t n = *cap ? *cap : 1024;
    while (n <= id)
        n *= 2;
    char **tokens = realloc(tok->tokens, (size_t)n * sizeof *tokens);
    if (!tokens)
        return DSARL_E_NOMEM;
    tok->tokens = tokens;
    uint8_t *flags = realloc(tok->flags, (size_t)n);
    if (!flags)
        return DSARL_E_NOMEM;
    tok->flags = flags;
    memset(tok->tokens + *cap, 0, (size_t)(n - *cap) * sizeof *tokens);
    memset(tok->flags + *cap, 0, (size_t)(n - *cap));
    *cap = n;
    tok->vocab_size = id + 1;
    return 0;
}

// Ids may leave gaps (released tokenizers have a few reserved ranges), but not more than this many past the entries.
#define ID_GAP_ALLOWANCE 65536

static int check_id(const dsarl_tokenizer *tok, int64_t id, const char *where, dsarl_error *err)
{
    if (id >= tok->id_limit)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: id %lld is far past the %lld tokens the file defines (ids must stay "
                          "below %lld); a corrupt or hostile tokenizer.json?", where, (long long)id,
                          (long long)(tok->id_limit - ID_GAP_ALLOWANCE), (long long)tok->id_limit);
    return DSARL_OK;
}

static int parse_vocab(const json_t *model, const char *file, dsarl_tokenizer *tok, int32_t *cap, dsarl_error *err)
{
    json_t *vocab;
    char where[512];
    snprintf(where, sizeof where, "%s: model", file);
    DSARL_TRY(dsarl_json_get_object(model, "vocab", where, &vocab, err));
    if (!json_is_object(vocab))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key 'vocab' must be an object of token -> id, got %s", where,
                          dsarl_json_type_name(vocab));
    const char *token;
    json_t *value;
    json_object_foreach(vocab, token, value) {
        if (!json_is_integer(value) || json_integer_value(value) < 0 || json_integer_value(value) >= (1 << 30))
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s.vocab: key '%s' must map to an id in [0, 2^30), got %s",
                              where, token, dsarl_json_type_name(value));
        int32_t id = (int32_t)json_integer_value(value);
        DSARL_TRY(check_id(tok, id, where, err));
        if (ensure_id(tok, id, cap) < 0)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory reading the vocab", file);
        if (tok->tokens[id])
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s.vocab: id %d is used by both '%s' and '%s'", where, id,
                              tok->tokens[id], token);
        tok->tokens[id] = strdup(token);
        if (!tok->tokens[id] || str_map_put(&tok->token_ids, tok->tokens[id], id) < 0)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory reading the vocab", file);
    }
    return 0;
}

static int parse_merges(const json_t *model, const char *file, dsarl_tokenizer *tok, dsarl_error *err)
{
    json_t *merges;
    char where[512];
    snprintf(where, sizeof where, "%s: model", file);
    DSARL_TRY(dsarl_json_get_array(model, "merges", where, &merges, err));
    if (!json_is_array(merges))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key 'merges' must be a list, got %s", where,
                          dsarl_json_type_name(merges));
    if (merge_map_init(&tok->merges, json_array_size(merges)) < 0)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory reading the merges", file);
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        const char *a = NULL, *b = NULL;
        size_t alen = 0, blen = 0;
        if (json_is_string(m)) {
            // "a b": the two halves split at the first space (byte-level tokens never contain one)
            const char *s = json_string_value(m);
            const char *sp = strchr(s, ' ');
            if (sp) {
                a = s;
                alen = (size_t)(sp - s);
                b = sp + 1;
                blen = strlen(b);
            }
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            alen = strlen(a);
            blen = strlen(b);
        }
        if (!a || strchr(b, ' '))
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s.merges[%zu]: a merge must be \"a b\" or [\"a\", \"b\"]",
                              where, i);
        char *joined = malloc(alen + blen + 1);
        if (!joined)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory reading the merges", file);
        memcpy(joined, a, alen);
        memcpy(joined + alen, b, blen);
        joined[alen + blen] = '\0';
        int32_t ia = str_map_get(&tok->token_ids, a, alen), ib = str_map_get(&tok->token_ids, b, blen);
        int32_t ij = str_map_get(&tok->token_ids, joined, alen + blen);
        if (ia < 0 || ib < 0 || ij < 0) {
            int rc = DSARL_FAIL(err, DSARL_E_INVALID, "%s.merges[%zu]: '%s' is not in model.vocab", where, i,
                                ia < 0 ? "first half" : ib < 0 ? "second half" : joined);
            free(joined);
            return rc;
        }
        free(joined);
        merge_map_put(&tok->merges, ia, ib, (int32_t)i, ij);
    }
    return 0;
}

static int parse_added_tokens(const json_t *root, const char *file, dsarl_tokenizer *tok, int32_t *cap,
                              dsarl_error *err)
{
    const json_t *list = json_object_get(root, "added_tokens");
    if (!list || json_is_null(list))
        return 0;
    if (!json_is_array(list))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key 'added_tokens' must be a list, got %s", file,
                          dsarl_json_type_name(list));
    tok->added = calloc(json_array_size(list) + 1, sizeof *tok->added);
    if (!tok->added)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory reading added_tokens", file);
    size_t i;
    json_t *t;
    json_array_foreach(list, i, t) {
        char where[600];
        snprintf(where, sizeof where, "%s: added_tokens[%zu]", file, i);
        int64_t id;
        const char *content;
        int special = 0, lstrip = 0, rstrip = 0, single = 0;
        DSARL_TRY(dsarl_json_get_int(t, "id", where, &id, err));
        DSARL_TRY(dsarl_json_get_string(t, "content", where, &content, err));
        DSARL_TRY(dsarl_json_get_bool_or(t, "special", where, 0, &special, err));
        DSARL_TRY(dsarl_json_get_bool_or(t, "lstrip", where, 0, &lstrip, err));
        DSARL_TRY(dsarl_json_get_bool_or(t, "rstrip", where, 0, &rstrip, err));
        DSARL_TRY(dsarl_json_get_bool_or(t, "single_word", where, 0, &single, err));
        if (lstrip || rstrip || single)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: token '%s' sets %s, which dsarl does not implement; "
                              "supported: lstrip, rstrip and single_word all false", where, content,
                              lstrip ? "lstrip" : rstrip ? "rstrip" : "single_word");
        if (id < 0 || id >= (1 << 30) || content[0] == '\0')
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: needs an id in [0, 2^30) and a non-empty content", where);
        DSARL_TRY(check_id(tok, id, where, err));
        if (ensure_id(tok, (int32_t)id, cap) < 0)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory", file);
        if (tok->tokens[id] && strcmp(tok->tokens[id], content) != 0)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: id %lld is '%s' in model.vocab but '%s' here", where,
                              (long long)id, tok->tokens[id], content);
        if (!tok->tokens[id]) {
            tok->tokens[id] = strdup(content);
            if (!tok->tokens[id] || str_map_put(&tok->token_ids, tok->tokens[id], (int32_t)id) < 0)
                return DSARL_FAIL(err, DSARL_E_NOMEM, "%s: out of memory", file);
        }
        tok->flags[id] |= TOKEN_ADDED | (special ? TOKEN_SPECIAL : 0);
        added_token *a = &tok->added[tok->n_added++];
        a->content = tok->tokens[id];
        a->len = strlen(a->content);
        a->id = (int32_t)id;
        a->special = special != 0;
    }
    return 0;
}

/* bos/eos/pad from tokenizer_config.json ("<tok>" or {"content": "<tok>"} or null); -1 when absent or null. */
static int config_token_id(const json_t *config, const char *key, const char *config_path, dsarl_tokenizer *tok,
                           int32_t *out, dsarl_error *err)
{
    *out = -1;
    const json_t *v = json_object_get(config, key);
    if (!v || json_is_null(v))
        return 0;
    const char *name = NULL;
    if (json_is_object(v))
        DSARL_TRY(dsarl_json_get_string(v, "content", config_path, &name, err));
    else if (json_is_string(v))
        name = json_string_value(v);
    else
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key '%s' must be a token string, {\"content\": ...} or null, "
                          "got %s", config_path, key, dsarl_json_type_name(v));
    *out = str_map_get(&tok->token_ids, name, strlen(name));
    if (*out < 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key '%s' names '%s', which is not a token of the tokenizer",
                          config_path, key, name);
    return 0;
}

static int32_t first_token_of(const dsarl_tokenizer *tok, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int32_t id = str_map_get(&tok->token_ids, names[i], strlen(names[i]));
        if (id >= 0)
            return id;
    }
    return -1;
}

static int parse_special_ids(dsarl_tokenizer *tok, const char *config_path, dsarl_error *err)
{
    if (config_path) {
        json_t *config;
        DSARL_TRY(dsarl_json_load_file(config_path, &config, err));
        int rc = config_token_id(config, "bos_token", config_path, tok, &tok->bos, err);
        if (rc == 0)
            rc = config_token_id(config, "eos_token", config_path, tok, &tok->eos, err);
        if (rc == 0)
            rc = config_token_id(config, "pad_token", config_path, tok, &tok->pad, err);
        json_decref(config);
        return rc;
    }
    static const char *const bos[] = {"<s>", "<|bos|>", "<bos>", "<|begin_of_text|>"};
    static const char *const eos[] = {"<|endoftext|>", "</s>", "<|eos|>", "<eos>", "<|end_of_text|>"};
    static const char *const pad[] = {"<|pad|>", "<pad>"};
    tok->bos = first_token_of(tok, bos, DSARL_ARRAY_LEN(bos));
    tok->eos = first_token_of(tok, eos, DSARL_ARRAY_LEN(eos));
    tok->pad = first_token_of(tok, pad, DSARL_ARRAY_LEN(pad));
    return 0;
}

static int load_root(dsarl_tokenizer *tok, const json_t *root, const char *file, int32_t *cap, dsarl_error *err)
{
    if (!json_is_object(root))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: the top level must be an object, got %s", file,
                          dsarl_json_type_name(root));
    json_t *model;
    const char *type;
    char where[512];
    DSARL_TRY(dsarl_json_get_object(root, "model", file, &model, err));
    snprintf(where, sizeof where, "%s: model", file);
    DSARL_TRY(dsarl_json_get_string(model, "type", where, &type, err));
    if (strcmp(type, "BPE") != 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key 'type' is '%s'; dsarl loads BPE models only", where,
                          type);
    DSARL_TRY(require_off(model, "dropout", where, "BPE dropout", err));
    DSARL_TRY(require_off(model, "continuing_subword_prefix", where, "subword prefixes", err));
    DSARL_TRY(require_off(model, "end_of_word_suffix", where, "end-of-word suffixes", err));
    DSARL_TRY(require_off(model, "byte_fallback", where, "byte fallback (<0xNN> tokens)", err));
    int ignore_merges = 0;
    DSARL_TRY(dsarl_json_get_bool_or(model, "ignore_merges", where, 0, &ignore_merges, err));
    tok->ignore_merges = ignore_merges != 0;

    const json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm)) {
        const char *ntype = NULL;
        snprintf(where, sizeof where, "%s: normalizer", file);
        DSARL_TRY(dsarl_json_get_string(norm, "type", where, &ntype, err));
        if (strcmp(ntype, "NFC") != 0)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: type '%s' is not supported; dsarl supports a null "
                              "normalizer or NFC (applied as the identity)", where, ntype);
    }
    const json_t *dec = json_object_get(root, "decoder");
    const char *dtype = NULL;
    snprintf(where, sizeof where, "%s: decoder", file);
    if (!dec || !json_is_object(dec))
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: key 'decoder' is %s; dsarl needs a ByteLevel decoder",
                          file, dsarl_json_type_name(dec));
    DSARL_TRY(dsarl_json_get_string(dec, "type", where, &dtype, err));
    if (strcmp(dtype, "ByteLevel") != 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s: type '%s' is not supported; dsarl needs ByteLevel", where,
                          dtype);
    DSARL_TRY(parse_pre_tokenizer(root, file, tok, err));
    const json_t *vocab = json_object_get(model, "vocab"), *added = json_object_get(root, "added_tokens");
    tok->id_limit = (int64_t)json_object_size(vocab) + (int64_t)json_array_size(added) + ID_GAP_ALLOWANCE;
    DSARL_TRY(parse_vocab(model, file, tok, cap, err));
    DSARL_TRY(parse_merges(model, file, tok, err));
    DSARL_TRY(parse_added_tokens(root, file, tok, cap, err));

    // Every byte needs its one-character token, or some text could not be encoded at all.
    for (size_t i = 0; i < DSARL_ARRAY_LEN(tok->byte_of_codepoint); i++)
        tok->byte_of_codepoint[i] = -1;
    for (unsigned b = 0; b < 256; b++) {
        tok->byte_of_codepoint[byte_to_codepoint(b)] = (int16_t)b;
        char s[3];
        size_t n = utf8_encode_small(byte_to_codepoint(b), s);
        tok->byte_ids[b] = str_map_get(&tok->token_ids, s, n);
        if (tok->byte_ids[b] < 0)
            return DSARL_FAIL(err, DSARL_E_INVALID, "%s: model.vocab has no token for byte 0x%02X ('%.*s'); a "
                              "byte-level BPE needs all 256", file, b, (int)n, s);
    }
    return 0;
}

int tokenizer_bpe_load(dsarl_tokenizer *tok, const char *json_path, const char *config_path, dsarl_error *err)
{
    json_t *root;
    DSARL_TRY(dsarl_json_load_file(json_path, &root, err));
    int32_t cap = 0;
    int rc = load_root(tok, root, json_path, &cap, err);
    json_decref(root);
    if (rc < 0)
        return rc;
    DSARL_TRY(parse_special_ids(tok, config_path, err));
    bool glm = str_map_get(&tok->token_ids, "[gMASK]", 7) >= 0 && str_map_get(&tok->token_ids, "<sop>", 5) >= 0;
    tok->default_template = glm ? "glm" : "plain";
    return 0;
}

/* ---- encoding ------------------------------------------------------------------------------------------------ */

typedef struct encode_ctx {
    const dsarl_tokenizer *tok;
    int32_t **ids;
    size_t *n, *cap;
    int32_t *symbols; /* scratch: one per byte of the longest piece so far */
    size_t symbols_cap;
    char *mapped;     /* scratch: the piece in byte-level characters (ignore_merges lookup) */
    size_t mapped_cap;
} encode_ctx;

static int push_id(encode_ctx *c, int32_t id)
{
    if (*c->n == *c->cap) {
        size_t cap = *c->cap ? *c->cap * 2 : 64;
        int32_t *p = realloc(*c->ids, cap * sizeof *p);
        if (!p)
            return DSARL_E_NOMEM;
        *c->ids = p;
        *c->cap = cap;
    }
    (*c->ids)[(*c->n)++] = id;
    return 0;
}

static int encode_piece(void *ctx, const char *piece, size_t len)
{
    encode_ctx *c = ctx;
    const dsarl_tokenizer *tok = c->tok;
    if (len > c->symbols_cap) {
        int32_t *s = realloc(c->symbols, len * sizeof *s);
        if (!s)
            return DSARL_E_NOMEM;
        c->symbols = s;
        c->symbols_cap = len;
    }
    if (tok->ignore_merges) {
        if (2 * len + 1 > c->mapped_cap) {
            char *m = realloc(c->mapped, 2 * len + 1);
            if (!m)
                return DSARL_E_NOMEM;
            c->mapped = m;
            c->mapped_cap = 2 * len + 1;
        }
        size_t k = 0;
        for (size_t i = 0; i < len; i++)
            k += utf8_encode_small(byte_to_codepoint((unsigned char)piece[i]), c->mapped + k);
        int32_t whole = str_map_get(&tok->token_ids, c->mapped, k);
        if (whole >= 0)
            return push_id(c, whole);
    }
    int32_t *sym = c->symbols;
    size_t n = len;
    for (size_t i = 0; i < len; i++)
        sym[i] = tok->byte_ids[(unsigned char)piece[i]];
    for (;;) {
        int32_t best_rank = -1, best_merged = -1;
        size_t best_at = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            int32_t merged;
            int32_t rank = merge_map_get(&tok->merges, sym[i], sym[i + 1], &merged);
            if (rank >= 0 && (best_rank < 0 || rank < best_rank)) {
                best_rank = rank;
                best_merged = merged;
                best_at = i;
            }
        }
        if (best_rank < 0)
            break;
        sym[best_at] = best_merged;
        memmove(sym + best_at + 1, sym + best_at + 2, (n - best_at - 2) * sizeof *sym);
        n--;
    }
    for (size_t i = 0; i < n; i++)
        DSARL_TRY(push_id(c, sym[i]));
    return 0;
}

int tokenizer_bpe_encode_segment(const dsarl_tokenizer *tok, const char *text, size_t len, int32_t **ids,
                                 size_t *n, size_t *cap)
{
    encode_ctx c = {.tok = tok, .ids = ids, .n = n, .cap = cap};
    char *prefixed = NULL;
    if (tok->add_prefix_space && len > 0 && text[0] != ' ') {
        prefixed = malloc(len + 1);
        if (!prefixed)
            return DSARL_E_NOMEM;
        prefixed[0] = ' ';
        memcpy(prefixed + 1, text, len);
        text = prefixed;
        len++;
    }
    int rc = tokenizer_pretokenize(tok->pattern, text, len, encode_piece, &c);
    free(prefixed);
    free(c.symbols);
    free(c.mapped);
    return rc;
}
