/* dsarl/tokenizer.h: text <-> token ids, and chat templates.
 * SDK tier: trainer services (docs/sdk.md): exported by libdsarl, versioned with it; plugins may call them.
 *
 * Two kinds behind one opaque handle:
 *   byte  ids 0..255 are the bytes; then <|bos|> = 256, <|eos|> = 257, <|pad|> = 258, <|sep|> = 259 (vocab 260).
 *   bpe   a Hugging Face tokenizer.json with a BPE model and byte-level pre-tokenizer, as GLM, Qwen, Llama-3 and
 *         GPT-2 ship it. Supported: normalizer null (or NFC, applied as the identity: feed NFC text);
 *         pre_tokenizer ByteLevel (use_regex true = the GPT-2 regex, or false), or Sequence[Split(Regex, Isolated,
 *         invert false), ByteLevel(use_regex false)] where the regex is one of GPT-2's, cl100k's (GLM-4/GLM-5,
 *         Llama-3: \p{N}{1,3}) or Qwen2's (\p{N}); model BPE with merges as "a b" strings or [a, b] pairs,
 *         ignore_merges, no dropout, no continuing_subword_prefix/end_of_word_suffix, no byte_fallback; decoder
 *         ByteLevel; added_tokens without lstrip/rstrip/single_word. Anything else is refused at load with the
 *         file and JSON key. \p{L}/\p{N} follow Unicode 14 (Python 3.11's unicodedata).
 * Both match special/added tokens in the text before anything else (leftmost, then longest, like HF), so a chat
 * template's markers become their ids. encode never adds BOS/EOS itself. */
#ifndef DSARL_TOKENIZER_H
#define DSARL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "dsarl/error.h"

struct dsarl_node; /* dsarl/recipe.h */

DSARL_BEGIN_DECLS

typedef struct dsarl_tokenizer dsarl_tokenizer;

/* One chat message: role is "system", "user", "assistant" (others are rendered the same way). */
typedef struct dsarl_chat_message {
    const char *role;
    const char *content;
} dsarl_chat_message;

/* Byte tokenizer ids. */
#define DSARL_BYTE_TOKENIZER_BOS 256
#define DSARL_BYTE_TOKENIZER_EOS 257
#define DSARL_BYTE_TOKENIZER_PAD 258
#define DSARL_BYTE_TOKENIZER_SEP 259
#define DSARL_BYTE_TOKENIZER_VOCAB 260

/* Loads "byte" (the byte tokenizer), a directory (its tokenizer.json), or a tokenizer.json file; a
 * tokenizer_config.json beside the tokenizer.json, when present, names bos/eos/pad. Errors name the file and the
 * JSON key. */
DSARL_API int dsarl_tokenizer_load(const char *name_or_path, dsarl_tokenizer **out, dsarl_error *err);

/* Frees the tokenizer (NULL is fine). */
DSARL_API void dsarl_tokenizer_free(dsarl_tokenizer *tok);

/* "byte" or "bpe". */
DSARL_API const char *dsarl_tokenizer_kind(const dsarl_tokenizer *tok);

/* Number of ids: the largest id (vocab or added token) + 1. */
DSARL_API int32_t dsarl_tokenizer_vocab_size(const dsarl_tokenizer *tok);

/* Special ids, or -1 when the tokenizer has none. BPE: from tokenizer_config.json's bos_token/eos_token/pad_token
 * when one lies beside tokenizer.json, else by name (<|endoftext|>, </s>, <|eos|> / <s>, <|bos|> /
 * <|pad|>, <pad>). */
DSARL_API int32_t dsarl_tokenizer_bos_id(const dsarl_tokenizer *tok);
DSARL_API int32_t dsarl_tokenizer_eos_id(const dsarl_tokenizer *tok);
DSARL_API int32_t dsarl_tokenizer_pad_id(const dsarl_tokenizer *tok);

/* 1 when id is a special/added token (matched whole in text, skipped by decode with skip_special), else 0. */
DSARL_API int dsarl_tokenizer_is_special(const dsarl_tokenizer *tok, int32_t id);

/* The token's string as stored (BPE: byte-level form, e.g. "Ġthe"; byte: the character for printable ASCII,
 * "<0xNN>" otherwise), or NULL for an id out of range or unused. Borrowed from tok. */
DSARL_API const char *dsarl_tokenizer_id_to_token(const dsarl_tokenizer *tok, int32_t id);

/* The id of a token string (the inverse of id_to_token), or -1. */
DSARL_API int32_t dsarl_tokenizer_token_to_id(const dsarl_tokenizer *tok, const char *token);

/* Encodes len bytes of text into *ids (malloc'd; caller frees) and *n_ids. Never adds BOS/EOS. */
DSARL_API int dsarl_tokenizer_encode(const dsarl_tokenizer *tok, const char *text, size_t len, int32_t **ids,
                                     size_t *n_ids, dsarl_error *err);

/* Decodes ids into *text (malloc'd, NUL-terminated; *len without the NUL, may be NULL). skip_special != 0 leaves
 * special tokens out. Bytes are returned as they are, even when they do not form valid UTF-8. */
DSARL_API int dsarl_tokenizer_decode(const dsarl_tokenizer *tok, const int32_t *ids, size_t n_ids, int skip_special,
                                     char **text, size_t *len, dsarl_error *err);

/* Renders messages with a named template into *out (malloc'd). Templates:
 *   "default" (or NULL)  the tokenizer's own template when it brings one (see below), else the built-in its
 *                        vocabulary suggests (dsarl_tokenizer_default_template);
 *   "tokenizer"          the tokenizer's own template, an error when it has none (ABI 1.4);
 *   a name               one of the tokenizer's named templates, e.g. "tool_use" (ABI 1.4);
 *   a path ending .jinja a Jinja chat template file (ABI 1.4);
 *   "glm"   "[gMASK]<sop>" then "<|ROLE|>\n" + content per message; generation prompt "<|assistant|>\n" (a short
 *           built-in approximation of GLM's own template);
 *   "plain" "System: c\n", "User: c\n", "Assistant: c\n" (role capitalised); generation prompt "Assistant:".
 *   "none"  the contents concatenated; no generation prompt (for raw prompts).
 * A tokenizer's own templates come from tokenizer_config.json's chat_template (a string, or a list of {name,
 * template}), chat_template.jinja beside tokenizer.json (it replaces the config's default) and
 * additional_chat_templates/NAME.jinja. Jinja templates render as transformers' apply_chat_template(...,
 * tokenize=False) does, byte for byte, within the subset docs/chat_templates.md lists; a template outside it is
 * refused when asked for, naming the construct and line. add_generation_prompt != 0 appends the assistant's
 * opening. The recipe key that names it is read by the algorithm (policy.tokenizer.chat_template). */
DSARL_API int dsarl_tokenizer_apply_chat_template(const dsarl_tokenizer *tok, const char *template_name,
                                                  const dsarl_chat_message *messages, size_t n_messages,
                                                  int add_generation_prompt, char **out, dsarl_error *err);

/* The template a tokenizer uses by default: "tokenizer" when it brings its own chat template (ABI 1.4), else
 * "glm" for a BPE tokenizer that has [gMASK] and <sop>, else "plain". */
DSARL_API const char *dsarl_tokenizer_default_template(const dsarl_tokenizer *tok);

/* ABI 1.4: as dsarl_tokenizer_apply_chat_template, plus extra template variables: kwargs_json is NULL or a JSON
 * object whose keys become variables (NeMo RL's policy.tokenizer.chat_template_kwargs, e.g.
 * {"enable_thinking": false}). The built-in templates ignore them. */
DSARL_API int dsarl_tokenizer_apply_chat_template_kwargs(const dsarl_tokenizer *tok, const char *template_name,
                                                         const dsarl_chat_message *messages, size_t n_messages,
                                                         int add_generation_prompt, const char *kwargs_json,
                                                         char **out, dsarl_error *err);

/* ABI 1.4: renders a conversation given as JSON text, as transformers does: messages_json is an array of message
 * objects (role, content as a string or a list of parts, tool_calls, reasoning_content, ...), tools_json NULL or
 * an array of tool schemas, kwargs_json NULL or an object of extra variables. A built-in template renders only
 * messages whose content is a string. */
DSARL_API int dsarl_tokenizer_render_chat(const dsarl_tokenizer *tok, const char *template_name,
                                          const char *messages_json, const char *tools_json,
                                          const char *kwargs_json, int add_generation_prompt, char **out,
                                          dsarl_error *err);

/* ABI 1.4: 1 when the tokenizer brings its own chat template (usable or not), else 0. */
DSARL_API int dsarl_tokenizer_has_chat_template(const dsarl_tokenizer *tok);

/* ABI 1.4: sets the template variables every later render of tok gets (a call's own kwargs override them) from
 * the recipe map at path, e.g. policy.tokenizer.chat_template_kwargs: {enable_thinking: false}. Absent or null
 * clears them; anything but a map fails naming the key. */
DSARL_API int dsarl_tokenizer_set_chat_kwargs_from_recipe(dsarl_tokenizer *tok, const struct dsarl_node *root,
                                                          const char *path, dsarl_error *err);

DSARL_END_DECLS

#endif /* DSARL_TOKENIZER_H */
