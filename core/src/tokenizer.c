/* tokenizer.c: the public tokenizer API, the byte tokenizer and added-token matching (chat templates:
 * tokenizer_chat.c). */
#include "tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dsarl/fileutil.h"
#include "dsarl/hf_hub.h"

/* ---- construction ------------------------------------------------------------------------------------------ */

static int byte_tokenizer_init(dsarl_tokenizer *tok, dsarl_error *err)
{
    static const char *const specials[] = {"<|bos|>", "<|eos|>", "<|pad|>", "<|sep|>"};
    tok->kind = TOKENIZER_BYTE;
    tok->vocab_size = DSARL_BYTE_TOKENIZER_VOCAB;
    tok->bos = DSARL_BYTE_TOKENIZER_BOS;
    tok->eos = DSARL_BYTE_TOKENIZER_EOS;
    tok->pad = DSARL_BYTE_TOKENIZER_PAD;
    tok->default_template = "plain";
    tok->tokens = calloc(DSARL_BYTE_TOKENIZER_VOCAB, sizeof *tok->tokens);
    tok->flags = calloc(DSARL_BYTE_TOKENIZER_VOCAB, 1);
    tok->added = calloc(DSARL_ARRAY_LEN(specials), sizeof *tok->added);
    if (!tok->tokens || !tok->flags || !tok->added)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "byte tokenizer: out of memory");
    for (int id = 0; id < DSARL_BYTE_TOKENIZER_VOCAB; id++) {
        char buf[8];
        if (id >= 256)
            snprintf(buf, sizeof buf, "%s", specials[id - 256]);
        else if (id >= 0x20 && id < 0x7F)
            snprintf(buf, sizeof buf, "%c", id);
        else
            snprintf(buf, sizeof buf, "<0x%02X>", id);
        tok->tokens[id] = strdup(buf);
        if (!tok->tokens[id] || str_map_put(&tok->token_ids, tok->tokens[id], id) < 0)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "byte tokenizer: out of memory");
        if (id >= 256) {
            tok->flags[id] = TOKEN_ADDED | TOKEN_SPECIAL;
            added_token *a = &tok->added[tok->n_added++];
            a->content = tok->tokens[id];
            a->len = strlen(a->content);
            a->id = id;
            a->special = true;
        }
    }
    return 0;
}

static bool is_directory(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int dsarl_tokenizer_load(const char *name_or_path, dsarl_tokenizer **out, dsarl_error *err)
{
    *out = NULL;
    if (!name_or_path || !name_or_path[0])
        return DSARL_FAIL(err, DSARL_E_INVALID, "tokenizer: no name given; use 'byte', a directory holding "
                          "tokenizer.json, or a tokenizer.json file");
    dsarl_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "tokenizer: out of memory");
    int rc;
    if (strcmp(name_or_path, "byte") == 0) {
        rc = byte_tokenizer_init(tok, err);
        if (rc == 0)
            rc = tokenizer_chat_load(tok, NULL, NULL, err);
    } else if (dsarl_hf_is_hub_id(name_or_path)) {
        char dir[4096];
        rc = dsarl_hf_resolve(name_or_path, NULL, "tokenizer", dir, sizeof dir, err);
        free(tok);
        return rc < 0 ? rc : dsarl_tokenizer_load(dir, out, err);
    } else if (!dsarl_path_exists(name_or_path)) {
        rc = DSARL_FAIL(err, DSARL_E_NOT_FOUND, "tokenizer '%s': no such file or directory; use 'byte', a "
                        "directory holding tokenizer.json, or a tokenizer.json file", name_or_path);
    } else {
        char *json_path = is_directory(name_or_path) ? dsarl_path_join(name_or_path, "tokenizer.json")
                                                     : strdup(name_or_path);
        char *dir = json_path ? dsarl_path_dirname(json_path) : NULL;
        char *config_path = dir ? dsarl_path_join(dir, "tokenizer_config.json") : NULL;
        if (!json_path || !dir || !config_path) {
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "tokenizer: out of memory");
        } else if (!dsarl_path_exists(json_path)) {
            rc = DSARL_FAIL(err, DSARL_E_NOT_FOUND, "tokenizer directory '%s' has no tokenizer.json", name_or_path);
        } else {
            tok->kind = TOKENIZER_BPE;
            const char *config = dsarl_path_exists(config_path) ? config_path : NULL;
            rc = tokenizer_bpe_load(tok, json_path, config, err);
            if (rc == 0)
                rc = tokenizer_chat_load(tok, dir, config, err);
        }
        free(json_path);
        free(dir);
        free(config_path);
    }
    if (rc < 0) {
        dsarl_tokenizer_free(tok);
        return rc;
    }
    *out = tok;
    return 0;
}

void dsarl_tokenizer_free(dsarl_tokenizer *tok)
{
    if (!tok)
        return;
    for (int32_t i = 0; i < tok->vocab_size; i++)
        free(tok->tokens[i]);
    free(tok->tokens);
    free(tok->flags);
    free(tok->added);
    str_map_free(&tok->token_ids);
    tokenizer_chat_free(tok);
    free(tok->merges.keys);
    free(tok->merges.rank);
    free(tok->merges.merged);
    free(tok);
}

/* ---- queries ------------------------------------------------------------------------------------------------ */

const char *dsarl_tokenizer_kind(const dsarl_tokenizer *tok) { return tok->kind == TOKENIZER_BYTE ? "byte" : "bpe"; }
int32_t dsarl_tokenizer_vocab_size(const dsarl_tokenizer *tok) { return tok->vocab_size; }
int32_t dsarl_tokenizer_bos_id(const dsarl_tokenizer *tok) { return tok->bos; }
int32_t dsarl_tokenizer_eos_id(const dsarl_tokenizer *tok) { return tok->eos; }
int32_t dsarl_tokenizer_pad_id(const dsarl_tokenizer *tok) { return tok->pad; }

int dsarl_tokenizer_is_special(const dsarl_tokenizer *tok, int32_t id)
{
    return id >= 0 && id < tok->vocab_size && (tok->flags[id] & TOKEN_SPECIAL) != 0;
}

const char *dsarl_tokenizer_id_to_token(const dsarl_tokenizer *tok, int32_t id)
{
    return id >= 0 && id < tok->vocab_size ? tok->tokens[id] : NULL;
}

int32_t dsarl_tokenizer_token_to_id(const dsarl_tokenizer *tok, const char *token)
{
    return token ? str_map_get(&tok->token_ids, token, strlen(token)) : -1;
}

/* ---- encode / decode ------------------------------------------------------------------------------------- */

/* The longest added token that starts at p (leftmost-longest, as tokenizers' AddedVocabulary), or NULL. */
static const added_token *added_token_at(const dsarl_tokenizer *tok, const char *p, size_t avail)
{
    const added_token *best = NULL;
    for (size_t i = 0; i < tok->n_added; i++) {
        const added_token *a = &tok->added[i];
        if (a->content[0] == *p && a->len <= avail && (!best || a->len > best->len) &&
            memcmp(a->content, p, a->len) == 0)
            best = a;
    }
    return best;
}

static int push_raw(int32_t **ids, size_t *n, size_t *cap, int32_t id)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        int32_t *p = realloc(*ids, c * sizeof *p);
        if (!p)
            return DSARL_E_NOMEM;
        *ids = p;
        *cap = c;
    }
    (*ids)[(*n)++] = id;
    return 0;
}

static int encode_segment(const dsarl_tokenizer *tok, const char *text, size_t len, int32_t **ids, size_t *n,
                          size_t *cap)
{
    if (len == 0)
        return 0;
    if (tok->kind == TOKENIZER_BPE)
        return tokenizer_bpe_encode_segment(tok, text, len, ids, n, cap);
    for (size_t i = 0; i < len; i++)
        DSARL_TRY(push_raw(ids, n, cap, (unsigned char)text[i]));
    return 0;
}

int dsarl_tokenizer_encode(const dsarl_tokenizer *tok, const char *text, size_t len, int32_t **ids, size_t *n_ids,
                           dsarl_error *err)
{
    *ids = NULL;
    *n_ids = 0;
    if (!text && len)
        return DSARL_FAIL(err, DSARL_E_INVALID, "tokenizer encode: text is NULL with length %zu", len);
    int32_t *out = NULL;
    size_t n = 0, cap = 0;
    size_t segment = 0;
    int rc = 0;
    for (size_t i = 0; i < len && rc == 0;) {
        const added_token *a = added_token_at(tok, text + i, len - i);
        if (!a) {
            i++;
            continue;
        }
        rc = encode_segment(tok, text + segment, i - segment, &out, &n, &cap);
        if (rc == 0)
            rc = push_raw(&out, &n, &cap, a->id);
        i += a->len;
        segment = i;
    }
    if (rc == 0)
        rc = encode_segment(tok, text + segment, len - segment, &out, &n, &cap);
    if (rc < 0) {
        free(out);
        return DSARL_FAIL(err, DSARL_E_NOMEM, "tokenizer encode: out of memory for %zu bytes of text", len);
    }
    *ids = out;
    *n_ids = n;
    return 0;
}

int dsarl_tokenizer_decode(const dsarl_tokenizer *tok, const int32_t *ids, size_t n_ids, int skip_special,
                           char **text, size_t *len, dsarl_error *err)
{
    *text = NULL;
    size_t cap = 64, n = 0;
    // Upper bound per id: its token string's length (a byte-level character decodes to one byte).
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= tok->vocab_size || !tok->tokens[ids[i]])
            return DSARL_FAIL(err, DSARL_E_INVALID, "tokenizer decode: id %d at position %zu is not in the "
                              "vocabulary (size %d)", ids[i], i, tok->vocab_size);
        cap += strlen(tok->tokens[ids[i]]);
    }
    char *out = malloc(cap);
    if (!out)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "tokenizer decode: out of memory for %zu ids", n_ids);
    for (size_t i = 0; i < n_ids; i++) {
        int32_t id = ids[i];
        const char *t = tok->tokens[id];
        if (tok->flags[id] & TOKEN_ADDED) {
            if (!(skip_special && (tok->flags[id] & TOKEN_SPECIAL))) {
                memcpy(out + n, t, strlen(t));
                n += strlen(t);
            }
        } else if (tok->kind == TOKENIZER_BYTE) {
            out[n++] = (char)id;
        } else {
            // Byte-level characters back to bytes; a character outside the map is copied as its UTF-8.
            const char *end = t + strlen(t);
            for (const char *p = t; p < end;) {
                size_t k;
                uint32_t cp = tokenizer_decode_utf8(p, end, &k);
                int b = cp < 0x144 ? tok->byte_of_codepoint[cp] : -1;
                if (b >= 0) {
                    out[n++] = (char)b;
                } else {
                    memcpy(out + n, p, k);
                    n += k;
                }
                p += k;
            }
        }
    }
    out[n] = '\0';
    *text = out;
    if (len)
        *len = n;
    return 0;
}
