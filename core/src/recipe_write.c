/* recipe_write.c: the tree back to block YAML (for `dsarl config show` and the run directory's resolved recipe).
 *
 * The output re-loads to the same values: strings that would otherwise be read as another type ("true", "1.0",
 * "null", "") or that YAML would misread (": ", leading indicators) are double-quoted. */
#include "recipe_internal.h"

#include <stdlib.h>
#include "dsarl/fileutil.h"

#include <inttypes.h>
#include <string.h>
#include <strings.h>

static bool needs_quotes(const char *s)
{
    static const char *const loose_booleans[] = {"yes", "no", "on", "off", "y", "n", NULL};
    if (!s[0] || recipe_plain_type(s) != DSARL_NODE_STRING)
        return true;
    // Strings our loader keeps but a YAML 1.1 reader (PyYAML) would turn into booleans.
    for (const char *const *w = loose_booleans; *w; w++)
        if (strcasecmp(s, *w) == 0)
            return true;
    if (strchr("-?:,[]{}#&*!|>'\"%@` \t", s[0]))
        return true;
    // Number-like strings (00:03:45:00, 0x10, 1_000, .5x) are numbers to YAML 1.1 readers: quote them too.
    if (strchr("0123456789.+", s[0]))
        return true;
    size_t len = strlen(s);
    if (s[len - 1] == ' ' || s[len - 1] == '\t' || s[len - 1] == ':')
        return true;
    if (strstr(s, ": ") || strstr(s, " #") || strstr(s, ":\t"))
        return true;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return true;
    return false;
}

static void write_quoted(FILE *out, const char *s)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\t': fputs("\\t", out); break;
        case '\r': fputs("\\r", out); break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                fprintf(out, "\\x%02X", *p);
            else
                fputc(*p, out);
        }
    }
    fputc('"', out);
}

static void write_text(FILE *out, const char *s)
{
    if (needs_quotes(s))
        write_quoted(out, s);
    else
        fputs(s, out);
}

/* Whether a float spelling also reads as a float in YAML 1.1 (PyYAML): a '.' in the mantissa and a signed
 * exponent ("5.0e-07" yes, "1e-8" no), or one of the .inf/.nan forms. */
static bool yaml11_float(const char *text)
{
    const char *e = strpbrk(text, "eE");
    if (strstr(text, "inf") || strstr(text, "nan") || strstr(text, "Inf") || strstr(text, "NaN") ||
        strstr(text, "INF") || strstr(text, "NAN"))
        return true;
    const char *dot = strchr(text, '.');
    return dot && (!e || (dot < e && (e[1] == '-' || e[1] == '+')));
}

/* A float spelling that every YAML reader takes as this float: shortest round trip, with "1e-08" -> "1.0e-08". */
static void format_float_portable(double v, char *buf, size_t size)
{
    recipe_format_float(v, buf, size);
    char *e = strpbrk(buf, "eE");
    if (e && !strchr(buf, '.') && strlen(buf) + 3 <= size) {
        memmove(e + 2, e, strlen(e) + 1);
        e[0] = '.';
        e[1] = '0';
    }
}

static void write_scalar(FILE *out, const dsarl_node *node)
{
    char buf[64];
    switch (node->type) {
    case DSARL_NODE_NULL: fputs("null", out); break;
    case DSARL_NODE_BOOL: fputs(node->bool_value ? "true" : "false", out); break;
    case DSARL_NODE_INT: fprintf(out, "%" PRId64, node->int_value); break;
    case DSARL_NODE_FLOAT:
        // Keep the spelling from the file (5.0e-07) when every reader takes it as this float.
        if (node->text && recipe_plain_type(node->text) == DSARL_NODE_FLOAT && yaml11_float(node->text))
            fputs(node->text, out);
        else
            format_float_portable(node->float_value, buf, sizeof buf), fputs(buf, out);
        break;
    case DSARL_NODE_STRING: write_text(out, node->text); break;
    case DSARL_NODE_MAP: fputs("{}", out); break;
    case DSARL_NODE_LIST: fputs("[]", out); break;
    }
}

static void end_value_line(FILE *out, const dsarl_node *node, int annotate)
{
    if (annotate) {
        char where[1024];
        dsarl_node_where(node, where, sizeof where);
        fputs("  # ", out);
        for (const char *p = where; *p; p++)
            fputc(*p == '\n' || *p == '\r' ? ' ' : *p, out);
    }
    fputc('\n', out);
}

static void indent_to(FILE *out, int indent)
{
    for (int i = 0; i < indent; i++)
        fputc(' ', out);
}

static bool is_block(const dsarl_node *node)
{
    return (node->type == DSARL_NODE_MAP || node->type == DSARL_NODE_LIST) && node->count > 0;
}

static void write_list(FILE *out, const dsarl_node *list, int indent, int annotate);

/* Writes a map's entries at indent; the first line may already be positioned (after "- "). */
static void write_map(FILE *out, const dsarl_node *map, int indent, bool first_positioned, int annotate)
{
    for (size_t i = 0; i < map->count; i++) {
        const dsarl_node *child = map->items[i];
        if (i > 0 || !first_positioned)
            indent_to(out, indent);
        write_text(out, child->key);
        fputc(':', out);
        if (child->type == DSARL_NODE_MAP && child->count > 0) {
            fputc('\n', out);
            write_map(out, child, indent + 2, false, annotate);
        } else if (child->type == DSARL_NODE_LIST && child->count > 0) {
            fputc('\n', out);
            write_list(out, child, indent + 2, annotate);
        } else {
            fputc(' ', out);
            write_scalar(out, child);
            end_value_line(out, child, annotate);
        }
    }
}

static void write_list(FILE *out, const dsarl_node *list, int indent, int annotate)
{
    for (size_t i = 0; i < list->count; i++) {
        const dsarl_node *item = list->items[i];
        indent_to(out, indent);
        if (item->type == DSARL_NODE_MAP && is_block(item)) {
            fputs("- ", out);
            write_map(out, item, indent + 2, true, annotate);
        } else if (item->type == DSARL_NODE_LIST && is_block(item)) {
            fputs("-\n", out);
            write_list(out, item, indent + 2, annotate);
        } else {
            fputs("- ", out);
            write_scalar(out, item);
            end_value_line(out, item, annotate);
        }
    }
}

int dsarl_recipe_write(const dsarl_recipe *r, FILE *out, int annotate, dsarl_error *err)
{
    if (!r || !r->root || !out)
        return DSARL_FAIL(err, DSARL_E_INVALID, "dsarl_recipe_write needs a recipe and an open stream");
    if (r->root->count == 0)
        fputs("{}\n", out);
    else
        write_map(out, r->root, 0, false, annotate);
    if (fflush(out) != 0 || ferror(out))
        return DSARL_FAIL(err, DSARL_E_IO, "writing the recipe failed (disk full or stream closed?)");
    return DSARL_OK;
}

int dsarl_recipe_write_file(const dsarl_recipe *r, const char *path, int annotate, dsarl_error *err)
{
    char *text = NULL;
    size_t size = 0;
    FILE *memory = open_memstream(&text, &size);
    if (!memory)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory writing the recipe for '%s'", path);
    int rc = dsarl_recipe_write(r, memory, annotate, err);
    fclose(memory);
    // Whole text first, then one atomic replace: a crash never leaves half a recipe in the run directory.
    if (rc == DSARL_OK)
        rc = dsarl_write_file_atomic(path, text, size, err);
    free(text);
    return rc;
}
