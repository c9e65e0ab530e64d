/* dataset_arithmetic.c: the built-in arithmetic task, so the main job needs no downloads.
 *
 * A problem is num_operands integers joined by operators ("12+7*3"), evaluated with the usual precedence in
 * 64-bit integers, or with function set that function of them ("max(4,8,2,7)"); a draw that overflows or whose
 * answer is outside [min_answer, max_answer] is redrawn. Which
 * split a problem belongs to depends only on its expression: FNV-1a(expression) as a fraction in [0, 1) below
 * validation_fraction means validation. So the splits are disjoint for any seeds, and each split holds distinct
 * problems drawn from Philox stream 0 (train) or 1 (validation) of the seed. */
#include "dataset_internal.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsarl/rng.h"

/* Consecutive rejected draws after which the knobs are taken to allow no more distinct problems. */
#define ARITHMETIC_MAX_REJECTS 200000

void dsarl_arithmetic_config_default(dsarl_arithmetic_config *cfg)
{
    *cfg = (dsarl_arithmetic_config){
        .seed = 42,
        .num_examples = 1024,
        .min_digits = 1,
        .max_digits = 2,
        .num_operands = 2,
        .operators = "+-",
        .min_answer = -1000000000,
        .max_answer = 1000000000,
        .validation_fraction = 0.1,
        .prompt_format = "What is {}? Give the final answer after 'Answer:'.",
        .task_name = "math",
    };
}

int dataset_arithmetic_check(const dsarl_arithmetic_config *cfg, const char **field, char *why, size_t size)
{
    *field = NULL;
    if (cfg->num_examples < 1 || cfg->num_examples > 10000000) {
        *field = "num_examples";
        snprintf(why, size, "must be in [1, 10000000], got %" PRId64, cfg->num_examples);
    } else if (cfg->min_digits < 1 || cfg->min_digits > 9) {
        *field = "min_digits";
        snprintf(why, size, "must be in [1, 9], got %d", cfg->min_digits);
    } else if (cfg->max_digits < cfg->min_digits || cfg->max_digits > 9) {
        *field = "max_digits";
        snprintf(why, size, "must be in [min_digits = %d, 9], got %d", cfg->min_digits, cfg->max_digits);
    } else if (cfg->num_operands < 2 || cfg->num_operands > 8) {
        *field = "num_operands";
        snprintf(why, size, "must be in [2, 8], got %d", cfg->num_operands);
    } else if (!cfg->operators || !cfg->operators[0] || strspn(cfg->operators, "+-*") != strlen(cfg->operators)) {
        *field = "operators";
        snprintf(why, size, "must be a non-empty string of the characters + - *, got '%s'",
                 cfg->operators ? cfg->operators : "(null)");
    } else if (cfg->min_answer > cfg->max_answer) {
        *field = "max_answer";
        snprintf(why, size, "must be >= min_answer = %" PRId64 ", got %" PRId64, cfg->min_answer, cfg->max_answer);
    } else if (!(cfg->validation_fraction > 0.0 && cfg->validation_fraction < 1.0)) {
        *field = "validation_fraction";
        snprintf(why, size, "must be strictly between 0 and 1, got %g", cfg->validation_fraction);
    } else if (cfg->function && strcmp(cfg->function, "max") != 0 && strcmp(cfg->function, "min") != 0) {
        *field = "function";
        snprintf(why, size, "must be max, min or null (operators join the operands), got '%s'", cfg->function);
    } else if (!cfg->prompt_format || !strstr(cfg->prompt_format, "{}")) {
        *field = "prompt_format";
        snprintf(why, size, "must contain {} where the expression goes, got '%s'",
                 cfg->prompt_format ? cfg->prompt_format : "(null)");
    }
    return *field ? -1 : 0;
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

static bool belongs_to_validation(const char *expression, double validation_fraction)
{
    double u = (double)(fnv1a(expression) >> 11) * 0x1.0p-53;
    return u < validation_fraction;
}

static int64_t draw_operand(dsarl_rng *rng, int min_digits, int max_digits)
{
    int digits = min_digits + (int)dsarl_rng_below(rng, (uint32_t)(max_digits - min_digits + 1));
    if (digits == 1)
        return dsarl_rng_below(rng, 10);
    uint32_t low = 1;
    for (int i = 1; i < digits; i++)
        low *= 10;
    return (int64_t)low + dsarl_rng_below(rng, 9 * low);
}

/* Draws function(x1, ..., xn) into expr ("max(4,8,2,7)") and its value. */
static void draw_function(dsarl_rng *rng, const dsarl_arithmetic_config *cfg, char *expr, size_t size, int64_t *value)
{
    bool is_max = strcmp(cfg->function, "max") == 0;
    *value = 0; // num_operands >= 2 (checked), so the first operand always replaces it
    int len = snprintf(expr, size, "%s(", cfg->function);
    for (int i = 0; i < cfg->num_operands; i++) {
        int64_t x = draw_operand(rng, cfg->min_digits, cfg->max_digits);
        len += snprintf(expr + len, size - (size_t)len, "%s%" PRId64, i ? "," : "", x);
        if (i == 0 || (is_max ? x > *value : x < *value))
            *value = x;
    }
    snprintf(expr + len, size - (size_t)len, ")");
}

/* Draws one problem into expr; returns false when its value overflows int64. */
static bool draw_problem(dsarl_rng *rng, const dsarl_arithmetic_config *cfg, char *expr, size_t size,
                         int64_t *value)
{
    if (cfg->function) {
        draw_function(rng, cfg, expr, size, value);
        return true;
    }
    size_t n_ops = strlen(cfg->operators);
    int64_t total = 0, term = draw_operand(rng, cfg->min_digits, cfg->max_digits);
    bool ok = true;
    int len = snprintf(expr, size, "%" PRId64, term);
    for (int i = 1; i < cfg->num_operands; i++) {
        char op = cfg->operators[dsarl_rng_below(rng, (uint32_t)n_ops)];
        int64_t x = draw_operand(rng, cfg->min_digits, cfg->max_digits);
        len += snprintf(expr + len, size - (size_t)len, "%c%" PRId64, op, x);
        if (op == '*') {
            ok = ok && !__builtin_mul_overflow(term, x, &term);
        } else {
            ok = ok && !__builtin_add_overflow(total, term, &total);
            term = op == '+' ? x : -x;
        }
    }
    ok = ok && !__builtin_add_overflow(total, term, &total);
    *value = total;
    return ok;
}

/* prompt_format with every "{}" replaced by expr. */
static char *format_problem(const char *format, const char *expr)
{
    size_t n = 0, elen = strlen(expr);
    for (const char *p = format; (p = strstr(p, "{}")) != NULL; p += 2)
        n++;
    char *out = malloc(strlen(format) + n * elen + 1);
    if (!out)
        return NULL;
    char *o = out;
    for (const char *p = format; *p;) {
        if (p[0] == '{' && p[1] == '}') {
            memcpy(o, expr, elen);
            o += elen;
            p += 2;
        } else {
            *o++ = *p++;
        }
    }
    *o = '\0';
    return out;
}

/* A set of expression strings (open addressing on their FNV-1a hash; the strings are owned). */
typedef struct expr_set {
    char **items;
    size_t cap, count;
} expr_set;

/* Inserts s (copied) unless present: 1 inserted, 0 present, -1 out of memory. */
static int expr_set_insert(expr_set *set, const char *s)
{
    if ((set->count + 1) * 2 > set->cap) {
        size_t cap = set->cap ? set->cap * 2 : 1024;
        char **items = calloc(cap, sizeof *items);
        if (!items)
            return -1;
        for (size_t i = 0; i < set->cap; i++) {
            if (!set->items[i])
                continue;
            size_t j = fnv1a(set->items[i]) & (cap - 1);
            while (items[j])
                j = (j + 1) & (cap - 1);
            items[j] = set->items[i];
        }
        free(set->items);
        set->items = items;
        set->cap = cap;
    }
    size_t j = fnv1a(s) & (set->cap - 1);
    for (; set->items[j]; j = (j + 1) & (set->cap - 1))
        if (strcmp(set->items[j], s) == 0)
            return 0;
    if (!(set->items[j] = strdup(s)))
        return -1;
    set->count++;
    return 1;
}

static void expr_set_free(expr_set *set)
{
    for (size_t i = 0; i < set->cap; i++)
        free(set->items[i]);
    free(set->items);
}

int dsarl_dataset_arithmetic(const dsarl_arithmetic_config *cfg, dsarl_split split, dsarl_dataset **out,
                             dsarl_error *err)
{
    *out = NULL;
    const char *field;
    char why[256];
    if (dataset_arithmetic_check(cfg, &field, why, sizeof why) < 0)
        return DSARL_FAIL(err, DSARL_E_INVALID, "arithmetic task: %s %s", field, why);
    dsarl_dataset *ds = dataset_new();
    if (!ds)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "arithmetic task: out of memory");
    dsarl_rng rng;
    dsarl_rng_init(&rng, cfg->seed, split == DSARL_SPLIT_VALIDATION ? 1 : 0);
    expr_set seen = {0};
    bool want_validation = split == DSARL_SPLIT_VALIDATION;
    long rejects = 0;
    int rc = 0;
    while ((int64_t)ds->n < cfg->num_examples && rc == 0) {
        char expr[128];
        int64_t value;
        bool ok = draw_problem(&rng, cfg, expr, sizeof expr, &value) && value >= cfg->min_answer &&
                  value <= cfg->max_answer && belongs_to_validation(expr, cfg->validation_fraction) == want_validation;
        int inserted = ok ? expr_set_insert(&seen, expr) : 0;
        if (inserted < 0) {
            rc = DSARL_FAIL(err, DSARL_E_NOMEM, "arithmetic task: out of memory");
        } else if (inserted == 0) {
            if (++rejects > ARITHMETIC_MAX_REJECTS)
                rc = DSARL_FAIL(err, DSARL_E_INVALID, "arithmetic task: found only %zu distinct %s problems for "
                                "num_examples = %" PRId64 " (%d-%d digits, %d operands, operators '%s', answers in "
                                "[%" PRId64 ", %" PRId64 "]); lower num_examples or widen the knobs", ds->n,
                                want_validation ? "validation" : "train", cfg->num_examples, cfg->min_digits,
                                cfg->max_digits, cfg->num_operands, cfg->operators, cfg->min_answer, cfg->max_answer);
        } else {
            rejects = 0;
            char answer[32];
            snprintf(answer, sizeof answer, "%" PRId64, value);
            dsarl_chat_message *msg = calloc(1, sizeof *msg);
            char *role = strdup("user"), *content = format_problem(cfg->prompt_format, expr), *gt = strdup(answer);
            if (msg) {
                msg->role = role;
                msg->content = content;
            }
            if (!msg || !role || !content || !gt) {
                if (!msg) {
                    free(role);
                    free(content);
                }
                dataset_free_messages(msg, 1);
                free(gt);
                rc = DSARL_FAIL(err, DSARL_E_NOMEM, "arithmetic task: out of memory");
            } else if (dataset_add(ds, msg, 1, gt, cfg->task_name) < 0) {
                rc = DSARL_FAIL(err, DSARL_E_NOMEM, "arithmetic task: out of memory");
            }
        }
    }
    expr_set_free(&seen);
    if (rc < 0) {
        dsarl_dataset_free(ds);
        return rc;
    }
    *out = ds;
    return 0;
}
