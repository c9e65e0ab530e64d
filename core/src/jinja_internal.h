/* jinja_internal.h: the Jinja subset that renders Hugging Face chat templates (docs/chat_templates.md).
 *
 * jinja_lex.c    template text -> tokens, with Jinja's whitespace rules as transformers configures them
 *                (trim_blocks, lstrip_blocks, no trailing newline kept)
 * jinja_parse.c  tokens -> a tree; every construct outside the subset is refused here with its line
 * jinja_value.c  the values a template computes with (an arena per render), Python's str() and json.dumps
 * jinja_eval.c   runs the tree: scopes, loops, macros, operators, and the bounds on work and output
 * jinja_builtins.c  filters, tests, string/dict methods and the globals transformers adds
 * The renderer never trusts the template: every loop, recursion and string it builds is bounded. */
#ifndef DSARL_JINJA_INTERNAL_H
#define DSARL_JINJA_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "dsarl/error.h"

/* ---- tokens (jinja_lex.c) --------------------------------------------------------------------------------- */

typedef enum jtok_kind {
    JT_TEXT,        /* template data between tags, whitespace rules already applied */
    JT_VAR_BEGIN,   /* {{ */
    JT_VAR_END,     /* }} */
    JT_BLOCK_BEGIN, /* {% */
    JT_BLOCK_END,   /* %} */
    JT_NAME,
    JT_STRING, /* text holds the decoded literal */
    JT_INT,
    JT_FLOAT,
    JT_OP, /* text holds the operator: + - * / // % ** ~ ( ) [ ] { } , . : | = == != < > <= >= */
    JT_EOF,
} jtok_kind;

typedef struct jtok {
    jtok_kind kind;
    char *text; /* owned, NUL-terminated; len excludes the NUL (a string literal may hold NULs) */
    size_t len;
    int64_t ival;
    double fval;
    int line;
} jtok;

typedef struct jtok_list {
    jtok *items;
    size_t n, cap;
} jtok_list;

/* Splits source (len bytes) into tokens. name is the template's origin for error messages. */
int jinja_lex(const char *name, const char *source, size_t len, jtok_list *out, dsarl_error *err);
void jinja_tokens_free(jtok_list *toks);

/* ---- tree (jinja_parse.c) ---------------------------------------------------------------------------------- */

typedef enum jnode_kind {
    /* statements */
    JN_TEXT,
    JN_OUTPUT,
    JN_IF,
    JN_FOR,
    JN_SET,
    JN_SET_BLOCK,
    JN_MACRO,
    JN_BREAK,
    JN_CONTINUE,
    JN_BODY,
    /* expressions */
    JN_LITERAL,
    JN_NAME,
    JN_LIST,
    JN_TUPLE,
    JN_DICT,
    JN_GETATTR,
    JN_GETITEM,
    JN_SLICE,
    JN_CALL,
    JN_FILTER,
    JN_TEST,
    JN_NEG,
    JN_POS,
    JN_NOT,
    JN_AND,
    JN_OR,
    JN_BINARY,
    JN_COMPARE,
    JN_COND,
} jnode_kind;

typedef struct jnode jnode;

typedef struct jnode_list {
    jnode **items;
    size_t n, cap;
} jnode_list;

struct jnode {
    jnode_kind kind;
    int line;
    char *str;          /* TEXT data, NAME/GETATTR/FILTER/TEST/MACRO/SET name, BINARY/COMPARE operators */
    size_t len;         /* of str */
    struct jv *literal; /* LITERAL: a value owned by the template's arena */
    jnode *a, *b, *c;   /* operands: IF/COND test-then-else, FOR iter/filter, GETITEM obj/key, SLICE parts */
    jnode_list kids;    /* bodies, list/dict items (key, value pairs), call/filter args, compare operands */
    jnode_list kids2;   /* IF: elif/else chain as nested IF in b; FOR: else body; CALL: keyword args */
    char **names;       /* FOR targets, macro parameters, CALL/FILTER keyword names */
    size_t n_names;
    bool negated;     /* TEST: `is not` */
    bool filter_args; /* FILTER/TEST: parenthesised arguments were given */
};

typedef struct jinja_arena jinja_arena;

typedef struct jinja_template {
    char *name;         /* origin for error messages: a file path or "tokenizer_config.json chat_template" */
    jnode *root;        /* JN_BODY */
    jinja_arena *arena; /* nodes, strings and literal values */
} jinja_template;

/* Compiles template text; refuses anything outside the subset naming the construct and its line. */
int jinja_compile(const char *name, const char *source, size_t len, jinja_template **out, dsarl_error *err);
void jinja_template_free(jinja_template *t);

/* ---- values (jinja_value.c) -------------------------------------------------------------------------------- */

typedef enum jv_kind {
    JV_UNDEFINED,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STRING,
    JV_LIST,
    JV_DICT,
    JV_NAMESPACE,
    JV_MACRO,
    JV_BUILTIN,
    JV_METHOD,
    JV_LOOP,
} jv_kind;

typedef struct jv jv;
struct jv {
    jv_kind kind;
    bool is_tuple; /* JV_LIST made by a tuple (Python prints it with parentheses) */
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *s;
            size_t n;
        } str; /* bytes, UTF-8; not NUL-terminated */
        struct {
            jv **items;
            size_t n, cap;
        } list;
        struct {
            jv **keys, **vals;
            size_t n, cap;
        } dict; /* insertion order, as Python's dict */
        const jnode *macro;
        int builtin; /* index into the globals table */
        struct {
            int id;
            jv *self;
        } method; /* a bound string/dict method */
        struct {
            jv *items;
            size_t index;
        } loop; /* `loop` inside a for: fields made on access */
    } u;
};

/* Bump allocator; every value of a render lives here and dies with it. Bounded: past limit bytes it fails. */
jinja_arena *jinja_arena_new(size_t limit);
void jinja_arena_free(jinja_arena *a);
void *jinja_alloc(jinja_arena *a, size_t n); /* zeroed; NULL past the limit or out of memory */
size_t jinja_arena_used(const jinja_arena *a);

jv *jv_new(jinja_arena *a, jv_kind kind);
jv *jv_string(jinja_arena *a, const char *s, size_t n); /* copies */
jv *jv_int(jinja_arena *a, int64_t i);
jv *jv_float(jinja_arena *a, double f);
jv *jv_bool(jinja_arena *a, bool b);
int jv_list_push(jinja_arena *a, jv *list, jv *item);        /* -1 out of memory */
int jv_dict_set(jinja_arena *a, jv *dict, jv *key, jv *val); /* replaces an equal key in place */
jv *jv_dict_get(const jv *dict, const char *key, size_t n);  /* NULL when absent */
jv *jv_dict_get_value(const jv *dict, const jv *key);
jv *jv_from_json(jinja_arena *a, const json_t *j); /* NULL out of memory */

bool jv_truthy(const jv *v);
bool jv_equal(const jv *x, const jv *y);
const char *jv_type_name(const jv *v); /* Python's name for error messages: str, int, list, dict ... */

/* A growable byte string with a hard cap (the render's output limit). */
typedef struct jbuf {
    char *data;
    size_t len, cap, limit;
    bool over; /* an append would have passed limit */
    bool oom;
} jbuf;
void jbuf_put(jbuf *b, const char *s, size_t n);
void jbuf_putc(jbuf *b, char c);

/* Python's str(v) (what {{ v }} prints) appended to b; repr for the items of lists and dicts. */
void jv_str(jbuf *b, const jv *v);
void jv_repr(jbuf *b, const jv *v);

/* json.dumps(v, ensure_ascii, indent, separators, sort_keys) as transformers' tojson calls it. indent NULL =
 * none; item_sep/key_sep NULL = Python's defaults. Returns -1 with *bad set to a value JSON cannot hold. */
int jv_tojson(jbuf *b, const jv *v, bool ensure_ascii, const char *indent, const char *item_sep, const char *key_sep,
              bool sort_keys, int depth, const jv **bad);

/* UTF-8 helpers: code points in s, and the byte offset of code point k (k <= count). */
size_t jutf8_count(const char *s, size_t n);
size_t jutf8_offset(const char *s, size_t n, size_t k);
/* Python's str.isspace() for the code point at s (its byte length in *len), false past n. */
bool jutf8_space_at(const char *s, size_t n, size_t *len);
/* The byte length of trailing whitespace in s (Python's rstrip()). */
size_t jutf8_trailing_space(const char *s, size_t n);

/* ---- rendering (jinja_eval.c) ------------------------------------------------------------------------------- */

typedef struct jinja_limits {
    size_t max_output;      /* bytes of rendered text, and of any one string built on the way */
    size_t max_memory;      /* bytes of values alive during one render */
    int64_t max_iterations; /* loop bodies run, summed over all loops (and range() lengths) */
    int max_depth;          /* nested macro calls */
} jinja_limits;

/* The defaults: 16 MiB output, 256 MiB values, 200,000 iterations, depth 64 (a 1,000-turn conversation with
 * tools needs a few thousand iterations). */
jinja_limits jinja_default_limits(void);

/* Renders t with the variables of vars (a JSON object) into *out (malloc'd, NUL-terminated, *len bytes). */
int jinja_render(const jinja_template *t, const json_t *vars, const jinja_limits *limits, char **out, size_t *len,
                 dsarl_error *err);

/* ---- builtins (jinja_builtins.c) --------------------------------------------------------------------------- */

typedef struct jinja_ctx jinja_ctx;

/* Names the parser accepts (it refuses others at load). */
bool jinja_is_filter(const char *name);
bool jinja_is_test(const char *name);
bool jinja_is_method(const char *name);
int jinja_global_index(const char *name); /* -1 when name is no builtin global */

/* Arguments of a call after evaluation: positional then keyword. */
typedef struct jargs {
    jv **pos;
    size_t n_pos;
    char **kw_names;
    jv **kw;
    size_t n_kw;
} jargs;

/* Each returns the value, or NULL after recording an error in the context (with the node's line). */
jv *jinja_apply_filter(jinja_ctx *c, const jnode *at, const char *name, jv *v, const jargs *args);
jv *jinja_apply_test(jinja_ctx *c, const jnode *at, const char *name, jv *v, const jargs *args); /* bool jv */
jv *jinja_get_method(jinja_ctx *c, jv *self, const char *name); /* NULL = no such method (no error) */
jv *jinja_call_method(jinja_ctx *c, const jnode *at, const jv *method, const jargs *args);
jv *jinja_call_global(jinja_ctx *c, const jnode *at, int index, const jargs *args);

/* Services of the evaluator the builtins use. */
jinja_arena *jinja_ctx_arena(jinja_ctx *c);
size_t jinja_ctx_string_limit(const jinja_ctx *c);
int jinja_ctx_count_iterations(jinja_ctx *c, const jnode *at, int64_t n); /* -1 past the bound (error set) */
jv *jinja_ctx_fail(jinja_ctx *c, const jnode *at, int code, const char *fmt, ...) DSARL_PRINTF(4, 5);
jv *jinja_ctx_oom(jinja_ctx *c, const jnode *at);
int jinja_ctx_failed(const jinja_ctx *c); /* the recorded error's status, 0 while none */
/* A string value from a finished jbuf (its over/oom flags become the context's error). */
jv *jinja_ctx_take(jinja_ctx *c, const jnode *at, jbuf *b);

#endif /* DSARL_JINJA_INTERNAL_H */
