/* tokenizer_internal.h: the tokenizer's shared structure and the pieces its .c files give each other. */
#ifndef DSARL_TOKENIZER_INTERNAL_H
#define DSARL_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "dsarl/tokenizer.h"

#ifndef DSARL_ARRAY_LEN
#define DSARL_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#endif

typedef enum tokenizer_kind { TOKENIZER_BYTE = 0, TOKENIZER_BPE = 1 } tokenizer_kind;

/* Pre-tokenisation regexes implemented by hand (tokenizer_pretok.c). */
typedef enum pretok_pattern {
    PRETOK_NONE = 0,   /* the whole segment is one piece */
    PRETOK_GPT2 = 1,   /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    PRETOK_CL100K = 2, /* (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|... */
    PRETOK_QWEN2 = 3,  /* as CL100K with \p{N} instead of \p{N}{1,3} */
} pretok_pattern;

/* Open-addressing hash map from a byte string to an int32 (token -> id). */
typedef struct str_map {
    char **keys;    /* borrowed */
    int32_t *values;
    size_t cap;     /* power of two; 0 when empty */
    size_t count;
} str_map;

/* Open-addressing hash map from a pair of ids to (rank, merged id). */
typedef struct merge_map {
    uint64_t *keys; /* (a << 32 | b) + 1; 0 = empty */
    int32_t *rank, *merged;
    size_t cap, count;
} merge_map;

/* flags of an id: matched whole in raw text (decoded as its content), and special (skipped on request). */
#define TOKEN_ADDED 0x1u
#define TOKEN_SPECIAL 0x2u

typedef struct added_token {
    char *content;
    size_t len;
    int32_t id;
    bool special;
} added_token;

struct dsarl_tokenizer {
    tokenizer_kind kind;
    int32_t vocab_size;
    int64_t id_limit;   /* ids must be below it while loading: the entries the file has plus room for gaps, so a
                         * huge id in a small file is refused before its tables are sized */
    int32_t bos, eos, pad;
    char **tokens;            /* [vocab_size] token strings (owned), NULL for unused ids */
    uint8_t *flags;           /* [vocab_size] TOKEN_ADDED | TOKEN_SPECIAL */
    str_map token_ids;        /* token string -> id (vocab and added tokens) */
    added_token *added;       /* matched in raw text before anything else */
    size_t n_added;
    /* BPE only */
    merge_map merges;
    pretok_pattern pattern;
    bool add_prefix_space;    /* ByteLevel: prepend ' ' to a segment that does not start with one */
    bool ignore_merges;       /* a piece that is a whole vocab entry is emitted as is */
    int32_t byte_ids[256];    /* id of the single-character token of each byte */
    int16_t byte_of_codepoint[0x144]; /* inverse of GPT-2's bytes_to_unicode; -1 for other code points */
    const char *default_template; /* built-in used when the tokenizer brings no template: "glm" or "plain" */
    /* Chat templates the tokenizer brings (tokenizer_chat.c): "default" and named ones, each compiled at load or
     * holding the error that refused it (reported when that template is asked for). */
    struct tokenizer_chat_template *templates;
    size_t n_templates;
    char *special_strings[7]; /* bos, eos, unk, sep, pad, cls, mask token text as templates see it, or NULL */
    struct json_t *chat_kwargs; /* template variables from the recipe (a JSON object), or NULL */
};

/* Reads the chat templates beside tokenizer.json (dir): tokenizer_config.json's chat_template (config_path, may be
 * NULL; a string or a list of {name, template}), chat_template.jinja (the default; it wins over the config's),
 * additional_chat_templates/NAME.jinja, and the special token strings templates see. */
int tokenizer_chat_load(dsarl_tokenizer *tok, const char *dir, const char *config_path, dsarl_error *err);
void tokenizer_chat_free(dsarl_tokenizer *tok);

/* str_map: insert (key borrowed; later inserts of the same key keep the first), look up (-1 when absent). */
int str_map_put(str_map *m, char *key, int32_t value);
int32_t str_map_get(const str_map *m, const char *key, size_t len);
void str_map_free(str_map *m);

/* Loads a HF tokenizer.json (config_path: its tokenizer_config.json or NULL) into tok (kind already BPE). */
int tokenizer_bpe_load(dsarl_tokenizer *tok, const char *json_path, const char *config_path, dsarl_error *err);

/* Appends the ids of one plain-text segment (no added tokens in it) to the growing id array. */
int tokenizer_bpe_encode_segment(const dsarl_tokenizer *tok, const char *text, size_t len, int32_t **ids,
                                 size_t *n, size_t *cap);

/* Splits text into pre-tokenizer pieces: calls piece(ctx, start, len) for each in order; stops at a nonzero
 * return and passes it back. */
int tokenizer_pretokenize(pretok_pattern pattern, const char *text, size_t len,
                          int (*piece)(void *ctx, const char *start, size_t len), void *ctx);

/* The code point at p (n bytes; invalid UTF-8 yields the byte value and n = 1). */
uint32_t tokenizer_decode_utf8(const char *p, const char *end, size_t *n);

/* Unicode general categories L and N (tokenizer_unicode.c, generated). */
bool tokenizer_is_letter(uint32_t c);
bool tokenizer_is_number(uint32_t c);

#endif /* DSARL_TOKENIZER_INTERNAL_H */
