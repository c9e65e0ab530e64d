/* check_recipe.c: the recipe system against hand-derived values, NeMo RL's own recipes, and every bad input we
 * promise to refuse (malformed YAML, include cycles, alias bombs, duplicate keys, ...). */
#include <check.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "recipe_internal.h"

#define FIXTURES DSARL_SOURCE_DIR "/tests/fixtures/recipes"
// NeMo RL's own GLM recipes, vendored unchanged (tests/fixtures/nemo_rl/README.md).
#define NEMO_LLM DSARL_SOURCE_DIR "/tests/fixtures/nemo_rl/examples/configs/recipes/llm"

static unsigned test_seed;

static dsarl_recipe *load_ok(const char *yaml)
{
    dsarl_recipe *r = NULL;
    dsarl_error err = {0};
    int rc = dsarl_recipe_load_string(yaml, "t.yaml", &r, &err);
    ck_assert_msg(rc == DSARL_OK, "load failed: %s", err.message);
    return r;
}

/* Loads yaml expecting failure; returns the message (static). */
static const char *load_fails(const char *yaml)
{
    static dsarl_error err;
    dsarl_recipe *r = NULL;
    dsarl_error_clear(&err);
    int rc = dsarl_recipe_load_string(yaml, "t.yaml", &r, &err);
    ck_assert_msg(rc < 0, "expected failure loading:\n%s", yaml);
    ck_assert_ptr_null(r);
    return err.message;
}

static dsarl_recipe *load_file_ok(const char *path)
{
    dsarl_recipe *r = NULL;
    dsarl_error err = {0};
    int rc = dsarl_recipe_load_file(path, &r, &err);
    ck_assert_msg(rc == DSARL_OK, "load %s failed: %s", path, err.message);
    return r;
}

static const dsarl_node *at(const dsarl_recipe *r, const char *path)
{
    const dsarl_node *n = dsarl_node_get(dsarl_recipe_root(r), path);
    ck_assert_msg(n != NULL, "missing key %s", path);
    return n;
}

static int64_t int_at(const dsarl_recipe *r, const char *path)
{
    const dsarl_node *n = at(r, path);
    ck_assert_msg(dsarl_node_kind(n) == DSARL_NODE_INT, "%s is a %s, not an int", path,
                  dsarl_node_type_name(dsarl_node_kind(n)));
    return dsarl_node_as_int(n);
}

static double float_at(const dsarl_recipe *r, const char *path)
{
    const dsarl_node *n = at(r, path);
    ck_assert_msg(dsarl_node_kind(n) == DSARL_NODE_FLOAT, "%s is a %s, not a float", path,
                  dsarl_node_type_name(dsarl_node_kind(n)));
    return dsarl_node_as_double(n);
}

static const char *str_at(const dsarl_recipe *r, const char *path)
{
    const dsarl_node *n = at(r, path);
    ck_assert_msg(dsarl_node_kind(n) == DSARL_NODE_STRING, "%s is a %s, not a string", path,
                  dsarl_node_type_name(dsarl_node_kind(n)));
    return dsarl_node_text(n);
}

static void assert_contains(const char *haystack, const char *needle)
{
    ck_assert_msg(strstr(haystack, needle) != NULL, "expected '%s' in: %s", needle, haystack);
}

static void override_ok(dsarl_recipe *r, const char *arg, int index)
{
    dsarl_error err = {0};
    int rc = dsarl_recipe_override(r, arg, index, &err);
    ck_assert_msg(rc == DSARL_OK, "override %s failed: %s", arg, err.message);
}

static const char *override_fails(dsarl_recipe *r, const char *arg, int index)
{
    static dsarl_error err;
    dsarl_error_clear(&err);
    int rc = dsarl_recipe_override(r, arg, index, &err);
    ck_assert_msg(rc < 0, "override %s should fail", arg);
    return err.message;
}

static void resolve_ok(dsarl_recipe *r)
{
    dsarl_error err = {0};
    int rc = dsarl_recipe_resolve(r, &err);
    ck_assert_msg(rc == DSARL_OK, "resolve failed: %s", err.message);
}

static const char *resolve_fails(const char *yaml)
{
    static dsarl_error err;
    dsarl_recipe *r = load_ok(yaml);
    dsarl_error_clear(&err);
    int rc = dsarl_recipe_resolve(r, &err);
    ck_assert_msg(rc < 0, "resolve should fail for:\n%s", yaml);
    dsarl_recipe_free(r);
    return err.message;
}

static void assert_round_trip(const dsarl_recipe *r);

/* ---- scalars and YAML safety --------------------------------------------------------------------------------- */

START_TEST(test_strict_scalars)
{
    dsarl_recipe *r = load_ok("t: true\nf: false\nT: True\n"
                              "y: yes\nn: no\non: on\noff: off\n"
                              "qt: \"true\"\nqi: '123'\nqn: 'null'\n"
                              "n1: null\nn2: ~\nn3:\n"
                              "i: 42\nneg: -7\nbig: 9223372036854775807\n"
                              "e: 1e-6\ne2: 1.0e-06\nd: 5.0\ninf: .inf\nninf: -.inf\nnan: .nan\n"
                              "hex: 0x10\nus: 1_000\nword: inf\ntl: tilelang\n");
    const dsarl_node *root = dsarl_recipe_root(r);
    ck_assert_int_eq(dsarl_node_kind(at(r, "t")), DSARL_NODE_BOOL);
    ck_assert(dsarl_node_as_bool(at(r, "t")));
    ck_assert(!dsarl_node_as_bool(at(r, "f")));
    ck_assert(dsarl_node_as_bool(at(r, "T")));
    ck_assert_str_eq(str_at(r, "y"), "yes");
    ck_assert_str_eq(str_at(r, "n"), "no");
    ck_assert_str_eq(str_at(r, "on"), "on");
    ck_assert_str_eq(str_at(r, "off"), "off");
    ck_assert_str_eq(str_at(r, "qt"), "true");
    ck_assert_str_eq(str_at(r, "qi"), "123");
    ck_assert_str_eq(str_at(r, "qn"), "null");
    ck_assert_int_eq(dsarl_node_kind(at(r, "n1")), DSARL_NODE_NULL);
    ck_assert_int_eq(dsarl_node_kind(at(r, "n2")), DSARL_NODE_NULL);
    ck_assert_int_eq(dsarl_node_kind(at(r, "n3")), DSARL_NODE_NULL);
    ck_assert_int_eq(int_at(r, "i"), 42);
    ck_assert_int_eq(int_at(r, "neg"), -7);
    ck_assert(int_at(r, "big") == INT64_MAX);
    ck_assert(float_at(r, "e") == 1e-6);
    ck_assert(float_at(r, "e2") == 1e-6);
    ck_assert(float_at(r, "d") == 5.0);
    ck_assert(isinf(float_at(r, "inf")) && float_at(r, "inf") > 0);
    ck_assert(isinf(float_at(r, "ninf")) && float_at(r, "ninf") < 0);
    ck_assert(isnan(float_at(r, "nan")));
    ck_assert_str_eq(str_at(r, "hex"), "0x10");
    ck_assert_str_eq(str_at(r, "us"), "1_000");
    ck_assert_str_eq(str_at(r, "word"), "inf");
    ck_assert_str_eq(str_at(r, "tl"), "tilelang");
    // Map keys keep file order.
    ck_assert_str_eq(dsarl_node_key_at(root, 0), "t");
    ck_assert_str_eq(dsarl_node_key_at(root, 3), "y");
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_number_out_of_range)
{
    const char *m = load_fails("a: 1\nb:\n  c: 9223372036854775808\n");
    assert_contains(m, "t.yaml:3:6");
    assert_contains(m, "64 bits");
    m = load_fails("x: 1e999\n");
    assert_contains(m, "t.yaml:1:4");
}
END_TEST

START_TEST(test_duplicate_key)
{
    const char *m = load_fails("grpo:\n  seed: 1\n  val: 2\n  seed: 3\n");
    assert_contains(m, "t.yaml:4:3");
    assert_contains(m, "duplicate key 'seed'");
    assert_contains(m, "line 2");
}
END_TEST

START_TEST(test_malformed_yaml)
{
    dsarl_recipe *r = NULL;
    dsarl_error err = {0};
    ck_assert_int_lt(dsarl_recipe_load_file(FIXTURES "/malformed.yaml", &r, &err), 0);
    // The unclosed flow list opened on line 3 col 9; libyaml notices at line 4.
    assert_contains(err.message, "malformed.yaml:4:");
    assert_contains(err.message, "line 3, column 9");
    const char *m = load_fails("a: b\n  c: d\n");
    assert_contains(m, "t.yaml:2:4");
    m = load_fails("a: 'unterminated\n");
    assert_contains(m, "t.yaml:");
}
END_TEST

START_TEST(test_mutated_yaml_never_crashes)
{
    // Random byte edits of a real recipe: each load either succeeds or fails with a located message.
    FILE *f = fopen(FIXTURES "/base.yaml", "rb");
    ck_assert_ptr_nonnull(f);
    char original[4096];
    size_t n = fread(original, 1, sizeof original - 1, f);
    fclose(f);
    original[n] = '\0';
    static const char alphabet[] = "{}[]:,-&*!|>'\"%@`#?$ \n\tabc019.~";
    int failures = 0;
    for (int trial = 0; trial < 300; trial++) {
        char text[4096];
        memcpy(text, original, n + 1);
        int edits = 1 + (int)(rand_r(&test_seed) % 4);
        for (int e = 0; e < edits; e++)
            text[rand_r(&test_seed) % n] = alphabet[rand_r(&test_seed) % (sizeof alphabet - 1)];
        dsarl_recipe *r = NULL;
        dsarl_error err = {0};
        if (dsarl_recipe_load_string(text, "t.yaml", &r, &err) < 0) {
            failures++;
            ck_assert_msg(strncmp(err.message, "t.yaml", 6) == 0, "unlocated error: %s", err.message);
            continue;
        }
        // What loads must also resolve or fail cleanly, and write back.
        if (dsarl_recipe_resolve(r, &err) == 0)
            assert_round_trip(r);
        dsarl_recipe_free(r);
    }
    ck_assert_int_gt(failures, 0);
}
END_TEST

START_TEST(test_document_shape)
{
    assert_contains(load_fails("a: 1\n---\nb: 2\n"), "t.yaml:2:1: a second YAML document");
    assert_contains(load_fails("- a\n- b\n"), "must be a map");
    assert_contains(load_fails("a: 1\n<<: {b: 2}\n"), "merge keys");
    assert_contains(load_fails("? [a, b]\n: 1\n"), "mapping keys");
    assert_contains(load_fails("a: \xff\xfe\n"), "t.yaml: byte");
    // An empty file is an empty recipe.
    dsarl_recipe *r = load_ok("");
    ck_assert_uint_eq(dsarl_node_count(dsarl_recipe_root(r)), 0);
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_alias_expands_to_copies)
{
    dsarl_recipe *r = load_ok("a: &x {k: 1, l: [1, 2]}\nb: *x\nc: &s hello\nd: *s\n");
    ck_assert_int_eq(int_at(r, "b.k"), 1);
    ck_assert_int_eq(int_at(r, "b.l.1"), 2);
    ck_assert_str_eq(str_at(r, "d"), "hello");
    // Copies, not shared nodes: an override of one leaves the other alone.
    override_ok(r, "b.k=5", 1);
    ck_assert_int_eq(int_at(r, "a.k"), 1);
    ck_assert_int_eq(int_at(r, "b.k"), 5);
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_alias_bomb_fails_fast)
{
    // Billion laughs: 9 levels, each a list of 10 aliases of the level below (10^9 nodes when expanded).
    char yaml[4096];
    size_t len = (size_t)snprintf(yaml, sizeof yaml, "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for (int level = 1; level <= 9; level++) {
        len += (size_t)snprintf(yaml + len, sizeof yaml - len, "l%d: &l%d [", level, level);
        for (int k = 0; k < 10; k++)
            len += (size_t)snprintf(yaml + len, sizeof yaml - len, "%s*l%d", k ? ", " : "", level - 1);
        len += (size_t)snprintf(yaml + len, sizeof yaml - len, "]\n");
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    const char *m = load_fails(yaml);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
    double seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    ck_assert_msg(seconds < 1.0, "alias bomb took %.3f s", seconds);
    assert_contains(m, "alias");
    assert_contains(m, "t.yaml:1:1");
    // A modest fan-out (1,111 nodes) is fine.
    dsarl_recipe *r = load_ok("a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                              "c: [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n");
    ck_assert_int_eq(int_at(r, "c.9.9.9"), 10);
    dsarl_recipe_free(r);
}
END_TEST

/* The bomb tests bound the parser's own work, so they time this process's CPU (CLOCK_PROCESS_CPUTIME_ID): wall
 * time also counts whatever else the machine runs (the sanitizer stage of CI runs suites two at a time). */

/* Interpolation bombs: lists of ten references to the level below (10^7 nodes at 7 levels) and strings that
 * double at every level (2^26 copies of "x"). Both must stop within the budget in well under a second, naming
 * where, and a modest fan-out must still resolve. */
START_TEST(test_interpolation_bomb_fails_fast)
{
    char yaml[4096];
    size_t len = (size_t)snprintf(yaml, sizeof yaml, "a0: [x, x, x, x, x, x, x, x, x, x]\n");
    for (int level = 1; level <= 7; level++) {
        len += (size_t)snprintf(yaml + len, sizeof yaml - len, "a%d: [", level);
        for (int k = 0; k < 10; k++)
            len += (size_t)snprintf(yaml + len, sizeof yaml - len, "%s\"${a%d}\"", k ? ", " : "", level - 1);
        len += (size_t)snprintf(yaml + len, sizeof yaml - len, "]\n");
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    const char *m = resolve_fails(yaml);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
    double seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    ck_assert_msg(seconds < 2.0, "interpolation bomb took %.3f s", seconds);
    assert_contains(m, "interpolation expands the recipe past");
    assert_contains(m, "t.yaml:");
    len = (size_t)snprintf(yaml, sizeof yaml, "s0: x\n");
    for (int level = 1; level <= 30; level++)
        len += (size_t)snprintf(yaml + len, sizeof yaml - len, "s%d: \"${s%d}${s%d}\"\n", level, level - 1, level - 1);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    m = resolve_fails(yaml);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
    seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    ck_assert_msg(seconds < 2.0, "string doubling took %.3f s", seconds);
    assert_contains(m, "MiB of text");
    // three levels of ten (1,111 nodes) resolve
    dsarl_recipe *r = load_ok("a: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\nb: ['${a}', '${a}', '${a}', '${a}', '${a}', '${a}', "
                              "'${a}', '${a}', '${a}', '${a}']\nc: ['${b}', '${b}', '${b}', '${b}', '${b}', '${b}', "
                              "'${b}', '${b}', '${b}', '${b}']\n");
    resolve_ok(r);
    ck_assert_int_eq(int_at(r, "c.9.9.9"), 10);
    dsarl_recipe_free(r);
}
END_TEST

/* Only regular files are read: a FIFO would block forever, /dev/zero never ends, a directory is a mistake. Each is
 * refused at once with what it is. */
START_TEST(test_non_regular_files_refused)
{
    char dir[] = "/tmp/check_recipe_fifo.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char fifo[256], parent[256];
    snprintf(fifo, sizeof fifo, "%s/pipe.yaml", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    snprintf(parent, sizeof parent, "%s/parent.yaml", dir);
    FILE *f = fopen(parent, "w");
    fprintf(f, "defaults: /dev/zero\n");
    fclose(f);
    struct { const char *path, *what; } cases[] = {{fifo, "(a pipe)"}, {parent, "(a device or socket)"},
                                                   {dir, "(a directory)"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsarl_recipe *r = NULL;
        dsarl_error err;
        dsarl_error_clear(&err);
        ck_assert_int_eq(dsarl_recipe_load_file(cases[i].path, &r, &err), DSARL_E_INVALID);
        assert_contains(err.message, "is not a regular file");
        assert_contains(err.message, cases[i].what);
    }
    unlink(fifo), unlink(parent), rmdir(dir);
}
END_TEST

START_TEST(test_alias_cycle)
{
    assert_contains(load_fails("a: &x [*x]\n"), "alias cycle");
    assert_contains(load_fails("a: &x {b: {c: *x}}\n"), "alias cycle");
}
END_TEST

START_TEST(test_nesting_depth)
{
    char yaml[512];
    // 63 nested lists under the root map: depth 64 including the map. Fine.
    size_t len = (size_t)snprintf(yaml, sizeof yaml, "a: ");
    for (int i = 0; i < 63; i++)
        yaml[len++] = '[';
    yaml[len++] = '1';
    for (int i = 0; i < 63; i++)
        yaml[len++] = ']';
    yaml[len++] = '\n';
    yaml[len] = '\0';
    dsarl_recipe *r = load_ok(yaml);
    dsarl_recipe_free(r);
    // One more is refused, naming where.
    len = (size_t)snprintf(yaml, sizeof yaml, "a: ");
    for (int i = 0; i < 64; i++)
        yaml[len++] = '[';
    for (int i = 0; i < 64; i++)
        yaml[len++] = ']';
    yaml[len++] = '\n';
    yaml[len] = '\0';
    const char *m = load_fails(yaml);
    assert_contains(m, "deeper than 64");
    assert_contains(m, "t.yaml:1:");
    // Hostile depth is refused before libyaml's loader (quadratic in flow depth) ever sees it.
    size_t deep = 200000;
    char *huge = malloc(2 * deep + 8);
    ck_assert_ptr_nonnull(huge);
    memcpy(huge, "a: ", 3);
    memset(huge + 3, '[', deep);
    memset(huge + 3 + deep, ']', deep);
    huge[3 + 2 * deep] = '\0';
    struct timespec t0, t1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    assert_contains(load_fails(huge), "t.yaml:1:67: nesting is deeper than 64");
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
    ck_assert_msg(t1.tv_sec - t0.tv_sec < 2, "deep nesting took %ld s", (long)(t1.tv_sec - t0.tv_sec));
    free(huge);
    // Through an alias too.
    len = (size_t)snprintf(yaml, sizeof yaml, "a: &d ");
    for (int i = 0; i < 40; i++)
        yaml[len++] = '[';
    for (int i = 0; i < 40; i++)
        yaml[len++] = ']';
    len += (size_t)snprintf(yaml + len, sizeof yaml - len, "\nb: [[[[[[[[[[[[[[[[[[[[[[[[[[*d]]]]]]]]]]]]]]]]]]]]]]]]]]\n");
    assert_contains(load_fails(yaml), "deeper than 64");
}
END_TEST

/* ---- defaults and merging ------------------------------------------------------------------------------------- */

START_TEST(test_defaults_chain)
{
    dsarl_recipe *r = load_file_ok(FIXTURES "/child.yaml");
    ck_assert_ptr_null(dsarl_node_get(dsarl_recipe_root(r), "defaults"));
    // child over parent over base: maps merge key by key, last wins.
    ck_assert_int_eq(int_at(r, "grpo.num_prompts_per_step"), 8);     // parent
    ck_assert_int_eq(int_at(r, "grpo.num_generations_per_prompt"), 4); // child
    ck_assert_int_eq(int_at(r, "grpo.seed"), 42);                    // base
    ck_assert_int_eq(int_at(r, "policy.max_total_sequence_length"), 2048);
    ck_assert(float_at(r, "policy.optimizer.kwargs.lr") == 1e-6);    // parent, deep
    ck_assert_str_eq(str_at(r, "policy.optimizer.name"), "adamw");   // base, sibling kept
    // Lists replace whole.
    ck_assert_uint_eq(dsarl_node_count(at(r, "policy.stop_strings")), 1);
    ck_assert_str_eq(str_at(r, "policy.stop_strings.0"), "x");
    ck_assert_uint_eq(dsarl_node_count(at(r, "policy.optimizer.kwargs.betas")), 2);
    // Origins name the file and line each value came from.
    char where[256];
    ck_assert_str_eq(dsarl_node_where(at(r, "grpo.num_generations_per_prompt"), where, sizeof where),
                     FIXTURES "/child.yaml:3:31");
    ck_assert_str_eq(dsarl_node_where(at(r, "grpo.num_prompts_per_step"), where, sizeof where),
                     FIXTURES "/parent.yaml:3:25");
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_defaults_list_order)
{
    dsarl_recipe *r = load_file_ok(FIXTURES "/list_child.yaml");
    ck_assert_int_eq(int_at(r, "grpo.seed"), 2); // right.yaml is later in the list than left.yaml
    ck_assert_str_eq(str_at(r, "grpo.left_only"), "left");
    ck_assert_str_eq(str_at(r, "grpo.right_only"), "right");
    ck_assert_str_eq(str_at(r, "grpo.child_only"), "child");
    ck_assert_int_eq(int_at(r, "policy.max_total_sequence_length"), 100);
    ck_assert_int_eq(int_at(r, "grpo.num_prompts_per_step"), 32);
    // Key order: base's keys first, then new keys in merge order.
    const dsarl_node *grpo = at(r, "grpo");
    ck_assert_str_eq(dsarl_node_key_at(grpo, 0), "num_prompts_per_step");
    ck_assert_str_eq(dsarl_node_key_at(grpo, dsarl_node_count(grpo) - 1), "child_only");
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_override_flag_replaces_section)
{
    dsarl_recipe *r = load_file_ok(FIXTURES "/override_child.yaml");
    const dsarl_node *data = at(r, "data");
    ck_assert_uint_eq(dsarl_node_count(data), 1); // base's train.dataset_name/seed and default are gone
    ck_assert_str_eq(str_at(r, "data.train.data_path"), "/tmp/train.jsonl");
    ck_assert_ptr_null(dsarl_node_get(dsarl_recipe_root(r), "data.default"));
    ck_assert_ptr_null(dsarl_node_get(dsarl_recipe_root(r), "data._override_"));
    // _override_: false merges as usual, and the flag itself is dropped.
    ck_assert(float_at(r, "policy.optimizer.kwargs.lr") == 3e-6);
    ck_assert_uint_eq(dsarl_node_count(at(r, "policy.optimizer.kwargs.betas")), 2);
    ck_assert_ptr_null(dsarl_node_get(dsarl_recipe_root(r), "policy.optimizer._override_"));
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_override_flag_in_middle_file)
{
    dsarl_recipe *r = load_file_ok(FIXTURES "/over_mid.yaml");
    const dsarl_node *optimizer = at(r, "policy.optimizer");
    ck_assert_uint_eq(dsarl_node_count(optimizer), 2); // base's kwargs dropped by the middle file
    ck_assert_str_eq(str_at(r, "policy.optimizer.name"), "sgd");
    ck_assert(float_at(r, "policy.optimizer.momentum") == 0.9);
    ck_assert_int_eq(int_at(r, "policy.max_total_sequence_length"), 512);
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_defaults_relative_to_including_file)
{
    dsarl_recipe *r = load_file_ok(FIXTURES "/sub/via_sub.yaml");
    ck_assert_int_eq(int_at(r, "grpo.seed"), 7);
    ck_assert_str_eq(str_at(r, "policy.model_name"), "sub");
    ck_assert_int_eq(int_at(r, "grpo.num_prompts_per_step"), 32);
    char where[512];
    dsarl_node_where(at(r, "grpo.num_prompts_per_step"), where, sizeof where);
    ck_assert_str_eq(where, FIXTURES "/base.yaml:3:25");
    dsarl_recipe_free(r);
    // load_string: relative to the current directory.
    ck_assert_int_eq(chdir(FIXTURES "/sub"), 0);
    r = load_ok("defaults: [deeper/relative.yaml]\ngrpo: {seed: 9}\n");
    ck_assert_int_eq(int_at(r, "grpo.seed"), 9);
    ck_assert_int_eq(int_at(r, "grpo.num_generations_per_prompt"), 16);
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_missing_defaults_file)
{
    dsarl_recipe *r = NULL;
    dsarl_error err = {0};
    ck_assert_int_lt(dsarl_recipe_load_file(FIXTURES "/missing_default.yaml", &r, &err), 0);
    assert_contains(err.message, "missing_default.yaml:5:5");
    assert_contains(err.message, "does_not_exist.yaml");
    ck_assert_int_eq(err.code, DSARL_E_NOT_FOUND);
    assert_contains(load_fails("defaults: 3\n"), "file name");
}
END_TEST

START_TEST(test_include_cycle)
{
    dsarl_recipe *r = NULL;
    dsarl_error err = {0};
    ck_assert_int_lt(dsarl_recipe_load_file(FIXTURES "/cycle_a.yaml", &r, &err), 0);
    assert_contains(err.message, "include cycle");
    assert_contains(err.message, "cycle_a.yaml -> ");
    assert_contains(err.message, "cycle_b.yaml -> ");
    ck_assert_msg(strstr(strstr(err.message, "cycle_b.yaml -> "), "cycle_a.yaml"), "chain must close: %s",
                  err.message);
}
END_TEST

/* ---- overrides ---------------------------------------------------------------------------------------------- */

START_TEST(test_override_typed_values)
{
    dsarl_recipe *r = load_file_ok(FIXTURES "/child.yaml");
    int value = (int)(rand_r(&test_seed) % 100000) + 1;
    char arg[128];
    snprintf(arg, sizeof arg, "grpo.seed=%d", value);
    override_ok(r, arg, 1);
    ck_assert_int_eq(int_at(r, "grpo.seed"), value);
    override_ok(r, "policy.optimizer.kwargs.lr=1e-7", 2);
    ck_assert(float_at(r, "policy.optimizer.kwargs.lr") == 1e-7);
    char where[256];
    ck_assert_str_eq(dsarl_node_where(at(r, "policy.optimizer.kwargs.lr"), where, sizeof where),
                     "command line argument 2 'policy.optimizer.kwargs.lr=1e-7'");
    override_ok(r, "grpo.normalize_rewards=false", 3);
    ck_assert_int_eq(dsarl_node_kind(at(r, "grpo.normalize_rewards")), DSARL_NODE_BOOL);
    ck_assert(!dsarl_node_as_bool(at(r, "grpo.normalize_rewards")));
    override_ok(r, "policy.model_name=null", 4);
    ck_assert_int_eq(dsarl_node_kind(at(r, "policy.model_name")), DSARL_NODE_NULL);
    override_ok(r, "policy.stop_strings=[1,2,three]", 5);
    ck_assert_uint_eq(dsarl_node_count(at(r, "policy.stop_strings")), 3);
    ck_assert_int_eq(int_at(r, "policy.stop_strings.1"), 2);
    ck_assert_str_eq(str_at(r, "policy.stop_strings.2"), "three");
    // A map value merges into the existing map (Hydra's OmegaConf.update(merge=True)).
    override_ok(r, "policy.optimizer={name: sgd, momentum: 0.9, kwargs: {betas: [0.5]}}", 6);
    ck_assert_str_eq(str_at(r, "policy.optimizer.name"), "sgd");
    ck_assert(float_at(r, "policy.optimizer.momentum") == 0.9);
    ck_assert(float_at(r, "policy.optimizer.kwargs.lr") == 1e-7);
    ck_assert_uint_eq(dsarl_node_count(at(r, "policy.optimizer.kwargs.betas")), 1);
    ck_assert_int_eq(dsarl_node_origin(at(r, "policy.optimizer.momentum"))->index, 6);
    override_ok(r, "data.default.env_name='true'", 7);
    ck_assert_str_eq(str_at(r, "data.default.env_name"), "true");
    override_ok(r, "data.default.prompt_file=tilelang", 8);
    ck_assert_str_eq(str_at(r, "data.default.prompt_file"), "tilelang");
    override_ok(r, "data.train.dataset_name=", 9);
    ck_assert_str_eq(str_at(r, "data.train.dataset_name"), "");
    // The origin is the command line argument, with its position and text.
    const dsarl_origin *o = dsarl_node_origin(at(r, "grpo.seed"));
    ck_assert_int_eq(o->kind, DSARL_ORIGIN_COMMAND_LINE);
    ck_assert_int_eq(o->index, 1);
    ck_assert_str_eq(o->text, arg);
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_override_unknown_key_did_you_mean)
{
    dsarl_recipe *r = load_file_ok(FIXTURES "/child.yaml");
    const char *m = override_fails(r, "grpo.normalise_rewards=false", 2);
    assert_contains(m, "command line argument 2 'grpo.normalise_rewards=false'");
    assert_contains(m, "did you mean 'grpo.normalize_rewards'?");
    // A typo in a section name is matched against full paths.
    m = override_fails(r, "polcy.max_total_sequence_length=3", 3);
    assert_contains(m, "did you mean 'policy.max_total_sequence_length'?");
    m = override_fails(r, "grpo.completely_unrelated_name=1", 1);
    ck_assert_ptr_null(strstr(m, "did you mean"));
    assert_contains(m, "+grpo.completely_unrelated_name");
    // Bad syntax.
    assert_contains(override_fails(r, "grpo.seed", 4), "expected key=value");
    assert_contains(override_fails(r, "grpo..seed=1", 5), "not a dotted key");
    m = override_fails(r, "grpo.seed=[1, 2", 6);
    ck_assert_msg(strncmp(m, "command line argument 6 'grpo.seed=[1, 2': value '[1, 2':", 57) == 0, "%s", m);
    assert_contains(override_fails(r, "grpo.seed={a: 1, a: 2}", 7), "duplicate key 'a'");
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_override_add_force_delete)
{
    dsarl_recipe *r = load_file_ok(FIXTURES "/child.yaml");
    override_ok(r, "+policy.megatron_cfg.model_overrides.dsa_kernel_backend=tilelang", 1);
    ck_assert_str_eq(str_at(r, "policy.megatron_cfg.model_overrides.dsa_kernel_backend"), "tilelang");
    ck_assert_int_eq(dsarl_node_origin(at(r, "policy.megatron_cfg"))->kind, DSARL_ORIGIN_COMMAND_LINE);
    assert_contains(override_fails(r, "+grpo.seed=3", 2), "already exists");
    override_ok(r, "+policy.generation={top_k: 5}", 2); // + with a map merges into the existing map
    ck_assert_int_eq(int_at(r, "policy.generation.top_k"), 5);
    ck_assert(float_at(r, "policy.generation.temperature") == 1.0);
    override_ok(r, "policy.model_name=null", 2);
    override_ok(r, "+policy.model_name=now_set", 2); // + on a null key is allowed, as in Hydra
    ck_assert_str_eq(str_at(r, "policy.model_name"), "now_set");
    override_ok(r, "++grpo.seed=3", 3);
    ck_assert_int_eq(int_at(r, "grpo.seed"), 3);
    override_ok(r, "++grpo.new_key=[a]", 4);
    ck_assert_str_eq(str_at(r, "grpo.new_key.0"), "a");
    assert_contains(override_fails(r, "+grpo.seed.deeper=1", 5), "not a map");
    // Deletion, with and without the value check.
    override_ok(r, "~grpo.new_key", 6);
    ck_assert_ptr_null(dsarl_node_get(dsarl_recipe_root(r), "grpo.new_key"));
    assert_contains(override_fails(r, "~grpo.seed=4", 7), "not '4'");
    ck_assert_int_eq(int_at(r, "grpo.seed"), 3);
    override_ok(r, "~grpo.seed=3", 8);
    ck_assert_ptr_null(dsarl_node_get(dsarl_recipe_root(r), "grpo.seed"));
    assert_contains(override_fails(r, "~grpo.seed", 9), "cannot delete");
    override_ok(r, "~policy.optimizer", 10);
    ck_assert_ptr_null(dsarl_node_get(dsarl_recipe_root(r), "policy.optimizer"));
    dsarl_recipe_free(r);
}
END_TEST

/* ---- interpolation ---------------------------------------------------------------------------------------------- */

START_TEST(test_interpolation_references)
{
    dsarl_recipe *r = load_ok("a:\n  b: 12\n  f: 0.5\n  s: text\n  m: {x: 1, y: [2, 3]}\n"
                              "  rel: ${.b}\n  inner:\n    up: ${..f}\n    up2: ${...top}\n"
                              "top: 5\nabs_int: ${a.b}\nabs_float: ${a.f}\nabs_map: ${a.m}\nabs_list: ${a.m.y}\n"
                              "in_string: 'b=${a.b}, f=${a.f}, flag=${flag}, none=${nothing}'\n"
                              "flag: true\nnothing: null\nescaped: 'cost \\${a.b}'\nchain: ${abs_int}\n"
                              "mandatory: ???\n");
    resolve_ok(r);
    ck_assert_int_eq(int_at(r, "a.rel"), 12);
    ck_assert(float_at(r, "a.inner.up") == 0.5);
    ck_assert_int_eq(int_at(r, "a.inner.up2"), 5);
    ck_assert_int_eq(int_at(r, "abs_int"), 12);
    ck_assert(float_at(r, "abs_float") == 0.5);
    ck_assert_int_eq(dsarl_node_kind(at(r, "abs_map")), DSARL_NODE_MAP);
    ck_assert_int_eq(int_at(r, "abs_map.y.1"), 3);
    ck_assert_int_eq(dsarl_node_kind(at(r, "abs_list")), DSARL_NODE_LIST);
    ck_assert_str_eq(str_at(r, "in_string"), "b=12, f=0.5, flag=True, none=None");
    ck_assert_str_eq(str_at(r, "escaped"), "cost ${a.b}");
    ck_assert_int_eq(int_at(r, "chain"), 12);
    ck_assert_str_eq(str_at(r, "mandatory"), "???"); // unreferenced ??? stays
    // A deep copy: changing the source afterwards does not touch the copy.
    dsarl_node *src = (dsarl_node *)at(r, "a.m.x");
    src->int_value = 99;
    ck_assert_int_eq(int_at(r, "abs_map.x"), 1);
    // The resolved value remembers where the ${...} was written.
    char where[256];
    ck_assert_str_eq(dsarl_node_where(at(r, "abs_int"), where, sizeof where), "t.yaml:11:10");
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_interpolation_resolvers)
{
    for (int trial = 0; trial < 20; trial++) {
        int64_t x = (int64_t)(rand_r(&test_seed) % 1000) + 1, y = (int64_t)(rand_r(&test_seed) % 1000) + 1;
        double f = 0.25 + (double)(rand_r(&test_seed) % 1000) / 7.0;
        char yaml[1024];
        snprintf(yaml, sizeof yaml,
                 "p: {x: %lld, y: %lld, f: %.17g}\n"
                 "nested: ${mul:${p.x}, ${mul:2, ${p.y}}}\n"
                 "sum: ${add:${p.x},${p.y},3}\n"
                 "fsum: ${add:${p.x}, ${p.f}}\n"
                 "quot: ${div:${p.x}, ${p.y}}\n"
                 "exact: ${div:${mul:${p.x}, 4}, 2}\n"
                 "big: ${max:${p.x}, ${p.y}}\n"
                 "text: 'len=${mul:${p.x},2}'\n",
                 (long long)x, (long long)y, f);
        dsarl_recipe *r = load_ok(yaml);
        resolve_ok(r);
        ck_assert_int_eq(int_at(r, "nested"), x * 2 * y);
        ck_assert_int_eq(int_at(r, "sum"), x + y + 3);
        ck_assert(float_at(r, "fsum") == (double)x + f);
        ck_assert(float_at(r, "quot") == (double)x / (double)y); // Python's / always gives a float
        ck_assert(float_at(r, "exact") == (double)(2 * x));
        ck_assert_int_eq(int_at(r, "big"), x > y ? x : y);
        char text[64];
        snprintf(text, sizeof text, "len=%lld", (long long)(2 * x));
        ck_assert_str_eq(str_at(r, "text"), text);
        dsarl_recipe_free(r);
    }
}
END_TEST

START_TEST(test_interpolation_after_overrides)
{
    dsarl_recipe *r = load_file_ok(FIXTURES "/child.yaml");
    override_ok(r, "grpo.seed=1234", 1);
    override_ok(r, "policy.generation.temperature=0.7", 2);
    resolve_ok(r);
    ck_assert_int_eq(int_at(r, "data.train.seed"), 1234);
    ck_assert(float_at(r, "policy.generation.val_temperature") == 0.7);
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_interpolation_errors)
{
    const char *m = resolve_fails("a: 1\nb:\n  c: ${nope:1,2}\n");
    assert_contains(m, "t.yaml:3:6");
    assert_contains(m, "unknown resolver 'nope'");
    m = resolve_fails("grpo:\n  seed: 1\nx: ${grpo.sead}\n");
    assert_contains(m, "t.yaml:3:4");
    assert_contains(m, "did you mean 'grpo.seed'?");
    m = resolve_fails("a: ${b}\nb: ${c.d}\nc:\n  d: ${a}\n");
    assert_contains(m, "interpolation cycle: a -> b -> c.d -> a");
    m = resolve_fails("a:\n  b: ${a}\n");
    assert_contains(m, "cycle");
    m = resolve_fails("need: ???\nuse: ${need}\n");
    assert_contains(m, "mandatory value missing");
    assert_contains(m, "t.yaml:2:6");
    m = resolve_fails("a: ${mul:2, word}\n");
    assert_contains(m, "not a number");
    m = resolve_fails("a: ${div:2, 0}\n");
    assert_contains(m, "division by zero");
    m = resolve_fails("a: {x: 1}\nb: 'x${a}'\n");
    assert_contains(m, "cannot be embedded");
    m = resolve_fails("a: ${b\n");
    assert_contains(m, "closing");
}
END_TEST

/* ---- typed lookups ----------------------------------------------------------------------------------------------- */

START_TEST(test_typed_lookups)
{
    dsarl_recipe *r = load_ok("p:\n  i: 3\n  f: 2.5\n  s: word\n  b: true\n  n: null\n");
    const dsarl_node *root = dsarl_recipe_root(r);
    dsarl_error err = {0};
    int64_t i = 0;
    double d = 0;
    bool b = false;
    const char *s = NULL;
    ck_assert_int_eq(dsarl_recipe_int(root, "p.i", &i, &err), 0);
    ck_assert_int_eq(i, 3);
    ck_assert_int_eq(dsarl_recipe_double(root, "p.i", &d, &err), 0); // an int is a fine double
    ck_assert(d == 3.0);
    ck_assert_int_eq(dsarl_recipe_bool(root, "p.b", &b, &err), 0);
    ck_assert(b);
    ck_assert_int_eq(dsarl_recipe_string(root, "p.s", &s, &err), 0);
    ck_assert_str_eq(s, "word");
    ck_assert_int_eq(dsarl_recipe_int(root, "p.f", &i, &err), DSARL_E_INVALID);
    assert_contains(err.message, "t.yaml:3:6: recipe key p.f must be a int, got float '2.5'");
    ck_assert_int_eq(dsarl_recipe_int(root, "p.missing", &i, &err), DSARL_E_NOT_FOUND);
    ck_assert_int_eq(dsarl_recipe_int(root, "p.n", &i, &err), DSARL_E_NOT_FOUND);
    ck_assert_int_eq(dsarl_recipe_int_or(root, "p.n", 17, &i, &err), 0);
    ck_assert_int_eq(i, 17);
    ck_assert_int_eq(dsarl_recipe_double_or(root, "p.missing", 0.125, &d, &err), 0);
    ck_assert(d == 0.125);
    ck_assert_int_eq(dsarl_recipe_string_or(root, "p.i", "x", &s, &err), DSARL_E_INVALID); // wrong type still fails
    ck_assert_int_eq(dsarl_recipe_fail(root, "p.i", &err, DSARL_E_INVALID, "must be > %d, got %d", 5, 3),
                     DSARL_E_INVALID);
    ck_assert_str_eq(err.message, "t.yaml:2:6: recipe key p.i must be > 5, got 3");
    char path[64];
    ck_assert_str_eq(dsarl_node_path(at(r, "p.s"), path, sizeof path), "p.s");
    dsarl_recipe_free(r);
}
END_TEST

/* ---- writing ----------------------------------------------------------------------------------------------------- */

static void assert_round_trip(const dsarl_recipe *r)
{
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_recipe_write(r, f, 0, &err), 0);
    fclose(f);
    dsarl_recipe *back = NULL;
    int rc = dsarl_recipe_load_string(text, "written.yaml", &back, &err);
    ck_assert_msg(rc == 0, "written YAML does not load: %s\n%s", err.message, text);
    ck_assert_msg(dsarl_node_equal(dsarl_recipe_root(r), dsarl_recipe_root(back)), "round trip differs:\n%s", text);
    dsarl_recipe_free(back);
    free(text);
}

START_TEST(test_write_round_trip)
{
    dsarl_recipe *r = load_ok("s:\n  t: 'true'\n  n: 'null'\n  f: '1.0'\n  i: '12'\n  e: ''\n  colon: 'a: b'\n"
                              "  hash: 'x #y'\n  dash: '- x'\n  star: '*x'\n  nl: \"two\\nlines\"\n  q: 'say \"hi\"'\n"
                              "  yes: 'yes'\n  tilde: '~'\n  unicode: \"caf\\u00e9\"\n  trailing: 'x '\n  ques: '?\?\?'\n"
                              "v:\n  b: false\n  i: -3\n  f: 1.0e-06\n  whole: 2.0\n  inf: -.inf\n  nan: .nan\n  null: ~\n"
                              "lists: [[1, [2]], {a: 1, b: [x, {c: d}]}, [], {}]\n"
                              "empty_map: {}\nempty_list: []\n'quoted key: x': 1\n");
    assert_round_trip(r);
    dsarl_recipe_free(r);
    r = load_file_ok(FIXTURES "/child.yaml");
    resolve_ok(r);
    assert_round_trip(r);
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_write_portable_scalars)
{
    // Spellings YAML 1.1 readers (PyYAML) would misread are normalized or quoted.
    dsarl_recipe *r = load_ok("a: 1e-8\nb: 00:10\nc: 0x1F\nd: 1.5\ne: 5.0e-07\nf: False\ng: on\nh: 100\n");
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_recipe_write(r, f, 0, &err), 0);
    fclose(f);
    ck_assert_str_eq(text, "a: 1.0e-08\nb: \"00:10\"\nc: \"0x1F\"\nd: 1.5\ne: 5.0e-07\nf: false\ng: \"on\"\nh: 100\n");
    free(text);
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_write_file_atomic)
{
    char dir[] = "/tmp/check_recipe_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/resolved.yaml", dir);
    dsarl_recipe *r = load_file_ok(FIXTURES "/child.yaml");
    resolve_ok(r);
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_recipe_write_file(r, path, 1, &err), 0);
    dsarl_recipe *back = load_file_ok(path);
    ck_assert(dsarl_node_equal(dsarl_recipe_root(r), dsarl_recipe_root(back)));
    dsarl_recipe_free(back);
    // An unwritable destination fails and leaves nothing behind.
    char bad[300];
    snprintf(bad, sizeof bad, "%s/no/such/dir/r.yaml", dir);
    ck_assert_int_lt(dsarl_recipe_write_file(r, bad, 0, &err), 0);
    ck_assert_int_ne(access(bad, F_OK), 0);
    dsarl_recipe_free(r);
    unlink(path);
    ck_assert_int_eq(rmdir(dir), 0); // empty: no temp file was left
}
END_TEST

/* A random tree with awkward strings, for the round trip. */
static dsarl_node *random_tree(unsigned *seed, int depth)
{
    static const char *const strings[] = {"true", "False", "null", "~", "", "1e5", "0.5", "-7", "a: b", "#x", "yes",
                                          "x y", "tilelang", "${a.b}", "[1]", "{k}", "- z", "'q'", "\"d\"", "é"};
    int kind = depth >= 4 ? (int)(rand_r(seed) % 5) : (int)(rand_r(seed) % 7);
    switch (kind) {
    case 0: return recipe_scalar_int((int64_t)rand_r(seed) - RAND_MAX / 2, NULL);
    case 1: return recipe_scalar_float(((double)rand_r(seed) - RAND_MAX / 2) / 977.0, NULL);
    case 2: return recipe_scalar_bool(rand_r(seed) % 2, NULL);
    case 3: return recipe_scalar_string(strings[rand_r(seed) % (sizeof strings / sizeof strings[0])], NULL);
    case 4: return recipe_scalar_null(NULL);
    default: {
        bool map = kind == 5;
        dsarl_node *node = recipe_node_new(map ? DSARL_NODE_MAP : DSARL_NODE_LIST, NULL);
        int n = (int)(rand_r(seed) % 4);
        for (int i = 0; i < n; i++) {
            char key[32];
            snprintf(key, sizeof key, "%s%d", strings[rand_r(seed) % 20], i);
            ck_assert_int_eq(recipe_node_append(node, map ? key : NULL, random_tree(seed, depth + 1)), 0);
        }
        return node;
    }
    }
}

START_TEST(test_write_round_trip_random)
{
    for (int trial = 0; trial < 50; trial++) {
        dsarl_recipe r = {.root = recipe_node_new(DSARL_NODE_MAP, NULL)};
        for (int i = 0; i < 6; i++) {
            char key[16];
            snprintf(key, sizeof key, "k%d", i);
            ck_assert_int_eq(recipe_node_append(r.root, key, random_tree(&test_seed, 1)), 0);
        }
        assert_round_trip(&r);
        recipe_node_free(r.root);
    }
}
END_TEST

START_TEST(test_write_annotated)
{
    dsarl_recipe *r = load_ok("grpo:\n  seed: 5\n  list: [a]\n  when: 00:03:45:00\n");
    override_ok(r, "grpo.seed=6", 1);
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_recipe_write(r, f, 1, &err), 0);
    fclose(f);
    ck_assert_str_eq(text, "grpo:\n  seed: 6  # command line argument 1 'grpo.seed=6'\n  list:\n    - a  # t.yaml:3:10\n"
                           "  when: \"00:03:45:00\"  # t.yaml:4:9\n");
    free(text);
    dsarl_recipe_free(r);
}
END_TEST

/* ---- NeMo RL's own recipes ---------------------------------------------------------------------------------------- */

static dsarl_recipe *load_nemo(const char *name, const char *override)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", NEMO_LLM, name);
    dsarl_recipe *r = load_file_ok(path);
    if (override)
        override_ok(r, override, 1);
    resolve_ok(r);
    return r;
}

START_TEST(test_nemo_recipes_all_load)
{
    glob_t g;
    // The recipes are vendored: a missing one is a broken checkout, not a reason to skip.
    ck_assert_msg(glob(NEMO_LLM "/*.yaml", 0, NULL, &g) == 0, "no NeMo RL recipes under %s", NEMO_LLM);
    ck_assert_uint_ge(g.gl_pathc, 3);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        for (int with_override = 0; with_override < 2; with_override++) {
            dsarl_recipe *r = load_file_ok(g.gl_pathv[i]);
            if (with_override) {
                // The GLM-5.1 recipe has no model_overrides entries, so `=` needs `++` (Hydra struct mode).
                const dsarl_node *backend =
                    dsarl_node_get(dsarl_recipe_root(r), "policy.megatron_cfg.model_overrides.dsa_kernel_backend");
                override_ok(r, backend ? "policy.megatron_cfg.model_overrides.dsa_kernel_backend=tilelang"
                                       : "++policy.megatron_cfg.model_overrides.dsa_kernel_backend=tilelang",
                            1);
            }
            resolve_ok(r);
            // Every interpolation is gone.
            assert_round_trip(r);
            ck_assert_str_eq(str_at(r, "policy.tokenizer.name"), str_at(r, "policy.model_name"));
            if (with_override) {
                const dsarl_node *n = at(r, "policy.megatron_cfg.model_overrides.dsa_kernel_backend");
                ck_assert_str_eq(dsarl_node_text(n), "tilelang");
                ck_assert_int_eq(dsarl_node_origin(n)->kind, DSARL_ORIGIN_COMMAND_LINE);
            }
            dsarl_recipe_free(r);
        }
    }
    globfree(&g);
}
END_TEST

START_TEST(test_nemo_glm52_noncolocated_values)
{
    ck_assert_msg(access(NEMO_LLM "/grpo-glm5.2-72n8g-megatron-noncolocated.yaml", R_OK) == 0, "missing fixture %s/grpo-glm5.2-72n8g-megatron-noncolocated.yaml", NEMO_LLM);
    dsarl_recipe *r = load_nemo("grpo-glm5.2-72n8g-megatron-noncolocated.yaml", NULL);
    // TP 2 * (2 * CP 32)
    ck_assert_int_eq(int_at(r, "policy.make_sequence_length_divisible_by"), 128);
    // max_total_sequence_length 131072 * train_micro_batch_size 1 (base's ${mul:...})
    ck_assert_int_eq(int_at(r, "policy.sequence_packing.train_mb_tokens"), 131072);
    // logprob_batch_size inherits ${policy.train_micro_batch_size} = 1 from the base
    ck_assert_int_eq(int_at(r, "policy.logprob_batch_size"), 1);
    ck_assert_int_eq(int_at(r, "policy.sequence_packing.logprob_mb_tokens"), 131072);
    ck_assert_int_eq(int_at(r, "policy.generation.max_new_tokens"), 4096);
    ck_assert_int_eq(int_at(r, "policy.generation.vllm_cfg.max_model_len"), 131072);
    ck_assert_str_eq(str_at(r, "policy.megatron_cfg.model_overrides.dsa_kernel_backend"), "cudnn");
    ck_assert_str_eq(str_at(r, "policy.megatron_cfg.pipeline_dtype"), "bfloat16");
    ck_assert(float_at(r, "policy.megatron_cfg.scheduler.start_weight_decay") == 0.0);
    ck_assert(float_at(r, "policy.megatron_cfg.optimizer.clip_grad") == 1.0);
    ck_assert(dsarl_node_as_bool(at(r, "grpo.adv_estimator.use_leave_one_out_baseline")));
    ck_assert_int_eq(int_at(r, "cluster.num_nodes"), 72);
    ck_assert_int_eq(int_at(r, "data.train.seed"), 42);
    ck_assert_int_eq(dsarl_node_kind(at(r, "policy.optimizer")), DSARL_NODE_NULL);
    ck_assert_str_eq(str_at(r, "policy.generation.vllm_kwargs.kernel_config.moe_backend"), "flashinfer_cutlass");
    ck_assert_str_eq(str_at(r, "policy.megatron_cfg.env_vars.CUDA_DEVICE_MAX_CONNECTIONS"), "1");
    ck_assert(dsarl_node_as_bool(at(r, "policy.sequence_packing.enabled")));
    ck_assert_int_eq(int_at(r, "grpo.reward_shaping.max_response_length"), 131072);
    dsarl_recipe_free(r);
    // With the override: the value and its origin.
    r = load_nemo("grpo-glm5.2-72n8g-megatron-noncolocated.yaml",
                  "policy.megatron_cfg.model_overrides.dsa_kernel_backend=tilelang");
    const dsarl_node *n = at(r, "policy.megatron_cfg.model_overrides.dsa_kernel_backend");
    ck_assert_str_eq(dsarl_node_text(n), "tilelang");
    char where[256];
    ck_assert_str_eq(dsarl_node_where(n, where, sizeof where),
                     "command line argument 1 'policy.megatron_cfg.model_overrides.dsa_kernel_backend=tilelang'");
    dsarl_recipe_free(r);
    // Overriding a source key moves every value derived from it.
    char path[1024];
    snprintf(path, sizeof path, "%s/grpo-glm5.2-72n8g-megatron-noncolocated.yaml", NEMO_LLM);
    r = load_file_ok(path);
    override_ok(r, "policy.megatron_cfg.context_parallel_size=8", 1);
    override_ok(r, "policy.max_total_sequence_length=8192", 2);
    resolve_ok(r);
    ck_assert_int_eq(int_at(r, "policy.make_sequence_length_divisible_by"), 32);
    ck_assert_int_eq(int_at(r, "policy.sequence_packing.train_mb_tokens"), 8192);
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_nemo_glm52_colocated_and_glm51_values)
{
    ck_assert_msg(access(NEMO_LLM "/grpo-glm5.2-64n8g-megatron-6K-colocated.yaml", R_OK) == 0, "missing fixture %s/grpo-glm5.2-64n8g-megatron-6K-colocated.yaml", NEMO_LLM);
    dsarl_recipe *r = load_nemo("grpo-glm5.2-64n8g-megatron-6K-colocated.yaml", NULL);
    ck_assert_int_eq(int_at(r, "policy.make_sequence_length_divisible_by"), 6144);
    ck_assert_int_eq(int_at(r, "policy.sequence_packing.train_mb_tokens"), 6144); // the recipe's own ${...}
    ck_assert_int_eq(int_at(r, "policy.dynamic_batching.train_mb_tokens"), 6144 * 1);
    ck_assert(float_at(r, "policy.megatron_cfg.model_overrides.dsa_indexer_k_norm_epsilon") == 1e-6);
    ck_assert_str_eq(str_at(r, "checkpointing.checkpoint_must_save_by"), "00:03:45:00");
    ck_assert(!dsarl_node_as_bool(at(r, "grpo.adv_estimator.use_leave_one_out_baseline")));
    ck_assert(float_at(r, "loss_fn.truncated_importance_sampling_ratio") == 2.0);
    ck_assert_int_eq(int_at(r, "loss_fn.ratio_clip_c"), 10);
    dsarl_recipe_free(r);

    r = load_nemo("grpo-glm5.1-64n8g-megatron.yaml", "++policy.megatron_cfg.model_overrides.dsa_kernel_backend=tilelang");
    ck_assert_int_eq(int_at(r, "policy.make_sequence_length_divisible_by"), 8); // ${...tensor_model_parallel_size}
    ck_assert_int_eq(int_at(r, "policy.sequence_packing.train_mb_tokens"), 2048);
    ck_assert(!dsarl_node_as_bool(at(r, "policy.sequence_packing.enabled")));
    ck_assert_uint_eq(dsarl_node_count(at(r, "policy.megatron_cfg.model_overrides")), 1);
    ck_assert(float_at(r, "loss_fn.reference_policy_kl_penalty") == 0.01); // inherited
    dsarl_recipe_free(r);
    // Plain `=` fails on it, as it does in NeMo RL (struct mode), and says how to add the key.
    char path[1024];
    snprintf(path, sizeof path, "%s/grpo-glm5.1-64n8g-megatron.yaml", NEMO_LLM);
    r = load_file_ok(path);
    assert_contains(override_fails(r, "policy.megatron_cfg.model_overrides.dsa_kernel_backend=tilelang", 1),
                    "+policy.megatron_cfg.model_overrides.dsa_kernel_backend");
    dsarl_recipe_free(r);
}
END_TEST

static Suite *recipe_suite(void)
{
    Suite *s = suite_create("recipe");
    TCase *yaml = tcase_create("yaml");
    tcase_add_test(yaml, test_strict_scalars);
    tcase_add_test(yaml, test_number_out_of_range);
    tcase_add_test(yaml, test_duplicate_key);
    tcase_add_test(yaml, test_malformed_yaml);
    tcase_add_test(yaml, test_document_shape);
    tcase_add_test(yaml, test_mutated_yaml_never_crashes);
    tcase_add_test(yaml, test_alias_expands_to_copies);
    tcase_add_test(yaml, test_alias_bomb_fails_fast);
    tcase_add_test(yaml, test_alias_cycle);
    tcase_add_test(yaml, test_non_regular_files_refused);
    tcase_add_test(yaml, test_nesting_depth);
    suite_add_tcase(s, yaml);
    TCase *defaults = tcase_create("defaults");
    tcase_add_test(defaults, test_defaults_chain);
    tcase_add_test(defaults, test_defaults_list_order);
    tcase_add_test(defaults, test_override_flag_replaces_section);
    tcase_add_test(defaults, test_override_flag_in_middle_file);
    tcase_add_test(defaults, test_defaults_relative_to_including_file);
    tcase_add_test(defaults, test_missing_defaults_file);
    tcase_add_test(defaults, test_include_cycle);
    suite_add_tcase(s, defaults);
    TCase *overrides = tcase_create("overrides");
    tcase_add_test(overrides, test_override_typed_values);
    tcase_add_test(overrides, test_override_unknown_key_did_you_mean);
    tcase_add_test(overrides, test_override_add_force_delete);
    suite_add_tcase(s, overrides);
    TCase *interp = tcase_create("interpolation");
    tcase_add_test(interp, test_interpolation_references);
    tcase_add_test(interp, test_interpolation_resolvers);
    tcase_add_test(interp, test_interpolation_after_overrides);
    tcase_add_test(interp, test_interpolation_errors);
    tcase_add_test(interp, test_interpolation_bomb_fails_fast);
    tcase_add_test(interp, test_typed_lookups);
    suite_add_tcase(s, interp);
    TCase *write = tcase_create("write");
    tcase_add_test(write, test_write_round_trip);
    tcase_add_test(write, test_write_round_trip_random);
    tcase_add_test(write, test_write_annotated);
    tcase_add_test(write, test_write_file_atomic);
    tcase_add_test(write, test_write_portable_scalars);
    suite_add_tcase(s, write);
    TCase *nemo = tcase_create("nemo_rl");
    tcase_add_test(nemo, test_nemo_recipes_all_load);
    tcase_add_test(nemo, test_nemo_glm52_noncolocated_values);
    tcase_add_test(nemo, test_nemo_glm52_colocated_and_glm51_values);
    suite_add_tcase(s, nemo);
    return s;
}

int main(void)
{
    test_seed = (unsigned)time(NULL);
    fprintf(stderr, "check_recipe: random seed %u\n", test_seed);
    SRunner *sr = srunner_create(recipe_suite());
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
