/* check_dataset.c: the arithmetic generator (determinism, answers by an independent parser, split disjointness,
 * knobs), both jsonl formats and their errors, prompt files, recipe sections, and the dataloader (epochs,
 * drop_last, reshuffling, save/restore giving the same next batches). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsarl/dataset.h"
#include "dsarl/fileutil.h"
#include "recipe_internal.h"

/* The expression inside "What is <expr>? ...". */
static void expression_of(const dsarl_example *e, char *out, size_t size)
{
    const char *c = e->messages[e->n_messages - 1].content;
    const char *start = strstr(c, "What is ");
    ck_assert_ptr_nonnull(start);
    start += 8;
    const char *end = strchr(start, '?');
    ck_assert_ptr_nonnull(end);
    snprintf(out, size, "%.*s", (int)(end - start), start);
}

/* Recursive descent: expr := term (('+'|'-') term)*, term := number ('*' number)*. */
static long long parse_number(const char **p, int *digits)
{
    long long v = 0;
    *digits = 0;
    while (**p >= '0' && **p <= '9') {
        v = v * 10 + (*(*p)++ - '0');
        (*digits)++;
    }
    return v;
}

static long long parse_term(const char **p, int *operands, int min_d, int max_d)
{
    int d;
    long long v = parse_number(p, &d);
    ck_assert(d >= min_d && d <= max_d);
    (*operands)++;
    while (**p == '*') {
        (*p)++;
        v *= parse_number(p, &d);
        ck_assert(d >= min_d && d <= max_d);
        (*operands)++;
    }
    return v;
}

static long long evaluate(const char *expr, int *operands, int min_d, int max_d)
{
    const char *p = expr;
    *operands = 0;
    long long v = parse_term(&p, operands, min_d, max_d);
    while (*p == '+' || *p == '-') {
        char op = *p++;
        long long t = parse_term(&p, operands, min_d, max_d);
        v = op == '+' ? v + t : v - t;
    }
    ck_assert_msg(*p == '\0', "unparsed rest '%s' of '%s'", p, expr);
    return v;
}

static dsarl_dataset *arithmetic(const dsarl_arithmetic_config *cfg, dsarl_split split)
{
    dsarl_dataset *ds = NULL;
    dsarl_error err = {0};
    ck_assert_msg(dsarl_dataset_arithmetic(cfg, split, &ds, &err) == 0, "%s", err.message);
    return ds;
}

START_TEST(test_arithmetic_determinism_and_answers)
{
    dsarl_arithmetic_config cfg;
    dsarl_arithmetic_config_default(&cfg);
    cfg.seed = 7 + (uint64_t)getpid(); // fresh problems every run
    cfg.num_examples = 300;
    cfg.operators = "+-*";
    cfg.num_operands = 3;
    dsarl_dataset *a = arithmetic(&cfg, DSARL_SPLIT_TRAIN), *b = arithmetic(&cfg, DSARL_SPLIT_TRAIN);
    cfg.seed++;
    dsarl_dataset *c = arithmetic(&cfg, DSARL_SPLIT_TRAIN);
    ck_assert_uint_eq(dsarl_dataset_size(a), 300);
    size_t same_as_other_seed = 0;
    for (size_t i = 0; i < 300; i++) {
        const dsarl_example *x = dsarl_dataset_get(a, i), *y = dsarl_dataset_get(b, i);
        ck_assert_str_eq(x->messages[0].content, y->messages[0].content);
        ck_assert_str_eq(x->ground_truth, y->ground_truth);
        ck_assert_str_eq(x->messages[0].role, "user");
        ck_assert_str_eq(x->task_name, "math");
        same_as_other_seed += strcmp(x->messages[0].content, dsarl_dataset_get(c, i)->messages[0].content) == 0;
        char expr[128], want[32];
        expression_of(x, expr, sizeof expr);
        int operands;
        snprintf(want, sizeof want, "%lld", evaluate(expr, &operands, 1, 2));
        ck_assert_msg(strcmp(want, x->ground_truth) == 0, "'%s' = %s, dataset says %s", expr, want, x->ground_truth);
        ck_assert_int_eq(operands, 3);
        char prompt[256];
        snprintf(prompt, sizeof prompt, "What is %s? Give the final answer after 'Answer:'.", expr);
        ck_assert_str_eq(x->messages[0].content, prompt);
    }
    ck_assert_uint_lt(same_as_other_seed, 30);
    ck_assert_ptr_null(dsarl_dataset_get(a, 300));
    dsarl_dataset_free(a);
    dsarl_dataset_free(b);
    dsarl_dataset_free(c);
}
END_TEST

START_TEST(test_arithmetic_splits_disjoint)
{
    dsarl_arithmetic_config cfg;
    dsarl_arithmetic_config_default(&cfg);
    cfg.seed = (uint64_t)getpid();
    cfg.num_examples = 3000;
    cfg.operators = "+-*";
    dsarl_dataset *train = arithmetic(&cfg, DSARL_SPLIT_TRAIN);
    cfg.seed += 1000; // another seed must not matter for disjointness
    cfg.num_examples = 400;
    dsarl_dataset *val = arithmetic(&cfg, DSARL_SPLIT_VALIDATION);
    char (*train_exprs)[64] = calloc(3000, 64);
    for (size_t i = 0; i < 3000; i++) {
        expression_of(dsarl_dataset_get(train, i), train_exprs[i], 64);
        for (size_t j = 0; j < i; j++) // plain if: Check records every ck_assert, too slow for 4.5M pairs
            if (strcmp(train_exprs[i], train_exprs[j]) == 0)
                ck_abort_msg("train repeats '%s'", train_exprs[i]);
    }
    for (size_t k = 0; k < 400; k++) {
        char expr[64];
        expression_of(dsarl_dataset_get(val, k), expr, sizeof expr);
        for (size_t i = 0; i < 3000; i++)
            if (strcmp(expr, train_exprs[i]) == 0)
                ck_abort_msg("'%s' is in both splits", expr);
    }
    free(train_exprs);
    dsarl_dataset_free(train);
    dsarl_dataset_free(val);
}
END_TEST

START_TEST(test_arithmetic_knobs)
{
    dsarl_arithmetic_config cfg;
    dsarl_arithmetic_config_default(&cfg);
    cfg.seed = (uint64_t)getpid();
    cfg.num_examples = 200;
    cfg.min_digits = 3;
    cfg.max_digits = 4;
    cfg.num_operands = 4;
    cfg.operators = "-";
    cfg.min_answer = -5000;
    cfg.max_answer = 0;
    cfg.prompt_format = "What is {}? ({})";
    cfg.task_name = "arith";
    dsarl_dataset *ds = arithmetic(&cfg, DSARL_SPLIT_VALIDATION);
    bool saw3 = false, saw4 = false;
    for (size_t i = 0; i < 200; i++) {
        const dsarl_example *e = dsarl_dataset_get(ds, i);
        char expr[128];
        expression_of(e, expr, sizeof expr);
        ck_assert_ptr_null(strchr(expr, '+'));
        ck_assert_ptr_null(strchr(expr, '*'));
        int operands;
        long long v = evaluate(expr, &operands, 3, 4);
        ck_assert_int_eq(operands, 4);
        ck_assert(v >= -5000 && v <= 0);
        saw3 |= expr[3] == '-';
        saw4 |= expr[4] == '-';
        ck_assert_ptr_nonnull(strstr(e->messages[0].content, expr)); // both {} replaced
        ck_assert_str_eq(e->task_name, "arith");
    }
    ck_assert(saw3 && saw4);
    dsarl_dataset_free(ds);

    dsarl_error err = {0};
    dsarl_arithmetic_config bad = cfg;
    bad.max_digits = 12;
    ck_assert_int_eq(dsarl_dataset_arithmetic(&bad, DSARL_SPLIT_TRAIN, &ds, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "max_digits") && strstr(err.message, "got 12"), "%s", err.message);
    bad = cfg;
    bad.operators = "+/";
    ck_assert_int_eq(dsarl_dataset_arithmetic(&bad, DSARL_SPLIT_TRAIN, &ds, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "operators"), "%s", err.message);
    // 1-digit a+b has 100 problems; the train split cannot hold 200 distinct ones
    dsarl_arithmetic_config_default(&bad);
    bad.max_digits = 1;
    bad.operators = "+";
    bad.num_examples = 200;
    ck_assert_int_eq(dsarl_dataset_arithmetic(&bad, DSARL_SPLIT_TRAIN, &ds, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "distinct train problems") && strstr(err.message, "num_examples = 200"), "%s",
                  err.message);
}
END_TEST

/* function: max and min of 3-digit operands, checked by parsing "f(a,b,...)" back; unknown functions refused. */
START_TEST(test_arithmetic_function)
{
    static const char *const functions[] = {"max", "min"};
    for (int f = 0; f < 2; f++) {
        dsarl_arithmetic_config cfg;
        dsarl_arithmetic_config_default(&cfg);
        cfg.seed = 11 + (uint64_t)getpid();
        cfg.num_examples = 300;
        cfg.min_digits = 1;
        cfg.max_digits = 3;
        cfg.num_operands = 5;
        cfg.function = functions[f];
        cfg.max_answer = 500; // a max above 500 (or a min above it) is redrawn
        dsarl_dataset *ds = arithmetic(&cfg, DSARL_SPLIT_TRAIN);
        ck_assert_uint_eq(dsarl_dataset_size(ds), 300);
        int below_first = 0; // an answer that is not the first operand: the function looked past it
        for (size_t i = 0; i < 300; i++) {
            const dsarl_example *e = dsarl_dataset_get(ds, i);
            char expr[128];
            expression_of(e, expr, sizeof expr);
            ck_assert_msg(strncmp(expr, functions[f], 3) == 0 && expr[3] == '(', "%s", expr);
            const char *p = expr + 4;
            long long best = 0, first = 0;
            int operands = 0;
            for (;;) {
                int d;
                long long x = parse_number(&p, &d);
                ck_assert(d >= 1 && d <= 3);
                if (operands == 0)
                    best = first = x;
                else if (f == 0 ? x > best : x < best)
                    best = x;
                operands++;
                if (*p != ',')
                    break;
                p++;
            }
            ck_assert_msg(*p == ')' && p[1] == '\0', "unparsed rest '%s' of '%s'", p, expr);
            ck_assert_int_eq(operands, 5);
            ck_assert(best <= 500);
            char answer[32];
            snprintf(answer, sizeof answer, "%lld", best);
            ck_assert_str_eq(e->ground_truth, answer);
            below_first += best != first;
        }
        ck_assert_int_gt(below_first, 150);
        dsarl_dataset_free(ds);
    }
    dsarl_arithmetic_config bad;
    dsarl_arithmetic_config_default(&bad);
    bad.function = "mean";
    dsarl_dataset *ds = NULL;
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_dataset_arithmetic(&bad, DSARL_SPLIT_TRAIN, &ds, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "function") && strstr(err.message, "'mean'"), "%s", err.message);
    ck_assert_ptr_null(ds);
}
END_TEST

static void write_text(const char *path, const char *text)
{
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_write_file_atomic(path, text, strlen(text), &err), 0);
}

static char tmpdir[64];

static void make_tmpdir(void)
{
    strcpy(tmpdir, "/tmp/dsarl_dataset_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void remove_tmpdir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
}

START_TEST(test_dapo_jsonl)
{
    make_tmpdir();
    char path[128];
    snprintf(path, sizeof path, "%s/dapo.jsonl", tmpdir);
    write_text(path,
               "{\"data_source\": \"math_dapo\", \"prompt\": [{\"role\": \"user\", \"content\": \"Solve x+1=35.\"}], "
               "\"ability\": \"MATH\", \"reward_model\": {\"ground_truth\": \"34\", \"style\": \"rule\"}}\n"
               "  \n"
               "{\"prompt\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Q2\"}], "
               "\"reward_model\": {\"ground_truth\": 540}}\n");
    dsarl_dataset *ds = NULL;
    dsarl_error err = {0};
    ck_assert_msg(dsarl_dataset_load_dapo_jsonl(path, NULL, &ds, &err) == 0, "%s", err.message);
    ck_assert_uint_eq(dsarl_dataset_size(ds), 2);
    const dsarl_example *e = dsarl_dataset_get(ds, 0);
    ck_assert_uint_eq(e->n_messages, 1);
    ck_assert_str_eq(e->messages[0].content, "Solve x+1=35.");
    ck_assert_str_eq(e->ground_truth, "34");
    ck_assert_str_eq(e->task_name, "math");
    e = dsarl_dataset_get(ds, 1);
    ck_assert_uint_eq(e->n_messages, 2);
    ck_assert_str_eq(e->messages[0].role, "system");
    ck_assert_str_eq(e->messages[1].content, "Q2");
    ck_assert_str_eq(e->ground_truth, "540");
    dsarl_dataset_free(ds);

    const struct {
        const char *text, *expect;
    } bad[] = {
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"Q\"}], \"reward_model\": {\"ground_truth\": \"1\"}}\n"
         "{\"prompt\": [{\"role\": \"user\", \"content\": \"Q\"}], \"reward_model\": {\"style\": \"x\"}}\n",
         ":2: key 'reward_model.ground_truth' must be a string or an integer, got nothing (missing)"},
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"Q\"}], \"reward_model\": {\"ground_truth\": 1.5}}\n",
         ":1: key 'reward_model.ground_truth' must be a string or an integer, got real"},
        {"\n{\"prompt\": [{\"role\": \"user\"}], \"reward_model\": {\"ground_truth\": \"1\"}}\n",
         ":2: key 'prompt[0].content' must be a string"},
        {"{\"prompt\": \"Q\", \"reward_model\": {\"ground_truth\": \"1\"}}\n", ":1: key 'prompt' must be a non-empty"},
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"Q\"}], \"reward_model\": 3}\n",
         ":1: key 'reward_model' must be an object"},
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"Q\"}]\n", ":1: not valid JSON"},
        {"[1, 2]\n", ":1: each line must be a JSON object"},
        {"\n \n", "holds no examples"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_text(path, bad[i].text);
        ck_assert_int_eq(dsarl_dataset_load_dapo_jsonl(path, NULL, &ds, &err), DSARL_E_INVALID);
        ck_assert_ptr_null(ds);
        ck_assert_msg(strstr(err.message, path) && strstr(err.message, bad[i].expect),
                      "row %zu: '%s' should name the file and say '%s'", i, err.message, bad[i].expect);
    }
    ck_assert_int_eq(dsarl_dataset_load_dapo_jsonl("/nonexistent.jsonl", NULL, &ds, &err), DSARL_E_NOT_FOUND);
    ck_assert_msg(strstr(err.message, "/nonexistent.jsonl"), "%s", err.message);
    remove_tmpdir();
}
END_TEST

START_TEST(test_plain_jsonl)
{
    make_tmpdir();
    char path[128];
    snprintf(path, sizeof path, "%s/qa.jsonl", tmpdir);
    write_text(path, "{\"question\": \"What is 2+2?\", \"answer\": \"4\"}\n"
                     "{\"question\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"answer\": 7}");
    dsarl_dataset *ds = NULL;
    dsarl_error err = {0};
    ck_assert_msg(dsarl_dataset_load_jsonl(path, "question", "answer", "qa", &ds, &err) == 0, "%s", err.message);
    ck_assert_uint_eq(dsarl_dataset_size(ds), 2);
    ck_assert_str_eq(dsarl_dataset_get(ds, 0)->messages[0].role, "user");
    ck_assert_str_eq(dsarl_dataset_get(ds, 0)->messages[0].content, "What is 2+2?");
    ck_assert_str_eq(dsarl_dataset_get(ds, 1)->messages[0].content, "Hi");
    ck_assert_str_eq(dsarl_dataset_get(ds, 1)->ground_truth, "7");
    ck_assert_str_eq(dsarl_dataset_get(ds, 1)->task_name, "qa");
    dsarl_dataset_free(ds);
    ck_assert_int_eq(dsarl_dataset_load_jsonl(path, "input", "answer", NULL, &ds, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, ":1: key 'input' (input_key)"), "%s", err.message);
    ck_assert_int_eq(dsarl_dataset_load_jsonl(path, "question", "output", NULL, &ds, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, ":1: key 'output'"), "%s", err.message);
    remove_tmpdir();
}
END_TEST

/* Collects the dataset indices of the next k batches. */
static void take(dsarl_dataloader *dl, int k, size_t bs, size_t *out, int64_t *epochs)
{
    const dsarl_example *batch[64];
    dsarl_error err = {0};
    for (int b = 0; b < k; b++) {
        size_t n;
        ck_assert_int_eq(dsarl_dataloader_next(dl, batch, out + (size_t)b * bs, &n, &epochs[b], &err), 0);
        ck_assert_uint_eq(n, bs);
    }
}

START_TEST(test_dataloader_epochs_and_resume)
{
    dsarl_arithmetic_config cfg;
    dsarl_arithmetic_config_default(&cfg);
    cfg.num_examples = 23;
    dsarl_dataset *ds = arithmetic(&cfg, DSARL_SPLIT_TRAIN);
    dsarl_dataloader *dl = NULL, *again = NULL;
    dsarl_error err = {0};
    uint64_t seed = (uint64_t)getpid();
    ck_assert_int_eq(dsarl_dataloader_create(ds, 5, 1, 1, seed, &dl, &err), 0);
    ck_assert_int_eq(dsarl_dataloader_batches_per_epoch(dl), 4); // 23 / 5, drop_last
    size_t idx[12 * 5];
    int64_t epochs[12];
    take(dl, 12, 5, idx, epochs);
    for (int e = 0; e < 3; e++) {
        bool seen[23] = {0};
        for (int b = 0; b < 4; b++) {
            ck_assert_int_eq(epochs[e * 4 + b], e);
            for (int i = 0; i < 5; i++) {
                size_t k = idx[(e * 4 + b) * 5 + i];
                ck_assert_msg(!seen[k], "epoch %d hands out example %zu twice", e, k);
                seen[k] = true;
            }
        }
    }
    ck_assert_msg(memcmp(idx, idx + 20, 20 * sizeof *idx) != 0, "epoch 1 repeats epoch 0's order");
    // Same seed, fresh loader: same order; restored at batch 6 (inside epoch 1): the same following batches.
    ck_assert_int_eq(dsarl_dataloader_create(ds, 5, 1, 1, seed, &again, &err), 0);
    size_t idx2[12 * 5];
    int64_t epochs2[12];
    take(again, 6, 5, idx2, epochs2);
    ck_assert(memcmp(idx, idx2, 30 * sizeof *idx) == 0);
    dsarl_dataloader_state st = dsarl_dataloader_get_state(again);
    ck_assert_int_eq(st.epoch, 1);
    ck_assert_int_eq(st.cursor, 10);
    dsarl_dataloader_free(again);
    ck_assert_int_eq(dsarl_dataloader_create(ds, 5, 1, 1, seed, &again, &err), 0);
    ck_assert_int_eq(dsarl_dataloader_set_state(again, st, &err), 0);
    take(again, 6, 5, idx2, epochs2);
    ck_assert(memcmp(idx + 30, idx2, 30 * sizeof *idx) == 0);
    ck_assert(memcmp(epochs + 6, epochs2, 6 * sizeof *epochs) == 0);
    // at an epoch's end
    ck_assert_int_eq(dsarl_dataloader_set_state(again, (dsarl_dataloader_state){0, 20}, &err), 0);
    take(again, 1, 5, idx2, epochs2);
    ck_assert_int_eq(epochs2[0], 1);
    ck_assert(memcmp(idx + 20, idx2, 5 * sizeof *idx) == 0);
    ck_assert_int_eq(dsarl_dataloader_set_state(again, (dsarl_dataloader_state){0, 21}, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "cursor 21"), "%s", err.message);
    dsarl_dataloader_free(again);
    dsarl_dataloader_free(dl);
    // a different seed gives a different order
    ck_assert_int_eq(dsarl_dataloader_create(ds, 5, 1, 1, seed + 1, &dl, &err), 0);
    take(dl, 4, 5, idx2, epochs2);
    ck_assert(memcmp(idx, idx2, 20 * sizeof *idx) != 0);
    dsarl_dataloader_free(dl);
    // drop_last with fewer examples than a batch is refused
    ck_assert_int_eq(dsarl_dataloader_create(ds, 24, 1, 1, seed, &dl, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "23 examples") && strstr(err.message, "24"), "%s", err.message);
    dsarl_dataset_free(ds);
}
END_TEST

START_TEST(test_dataloader_in_order_keeps_last)
{
    dsarl_arithmetic_config cfg;
    dsarl_arithmetic_config_default(&cfg);
    cfg.num_examples = 7;
    dsarl_dataset *ds = arithmetic(&cfg, DSARL_SPLIT_VALIDATION);
    dsarl_dataloader *dl = NULL;
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_dataloader_create(ds, 3, 0, 0, 1, &dl, &err), 0);
    ck_assert_int_eq(dsarl_dataloader_batches_per_epoch(dl), 3);
    const dsarl_example *batch[3];
    size_t sizes[] = {3, 3, 1, 3}, n, idx[3];
    int64_t epoch;
    size_t expect = 0;
    for (int b = 0; b < 4; b++) {
        ck_assert_int_eq(dsarl_dataloader_next(dl, batch, idx, &n, &epoch, &err), 0);
        ck_assert_uint_eq(n, sizes[b]);
        ck_assert_int_eq(epoch, b < 3 ? 0 : 1);
        for (size_t i = 0; i < n; i++, expect = (expect + 1) % 7) {
            ck_assert_uint_eq(idx[i], expect);
            ck_assert_ptr_eq(batch[i], dsarl_dataset_get(ds, expect));
        }
    }
    dsarl_dataloader_free(dl);
    dsarl_dataset_free(ds);
}
END_TEST

START_TEST(test_prompt_templates)
{
    make_tmpdir();
    char prompt[128], system_path[128];
    snprintf(prompt, sizeof prompt, "%s/cot.txt", tmpdir);
    snprintf(system_path, sizeof system_path, "%s/system.txt", tmpdir);
    write_text(prompt, "Think. Output inside \\boxed{{}} tags.:\n{}\n\nLet's think");
    write_text(system_path, "You are terse.");
    dsarl_arithmetic_config cfg;
    dsarl_arithmetic_config_default(&cfg);
    cfg.num_examples = 3;
    cfg.prompt_format = "{}";
    dsarl_dataset *ds = arithmetic(&cfg, DSARL_SPLIT_TRAIN);
    char expr[64];
    snprintf(expr, sizeof expr, "%s", dsarl_dataset_get(ds, 0)->messages[0].content);
    dsarl_error err = {0};
    ck_assert_msg(dsarl_dataset_apply_prompt_files(ds, prompt, system_path, &err) == 0, "%s", err.message);
    const dsarl_example *e = dsarl_dataset_get(ds, 0);
    ck_assert_uint_eq(e->n_messages, 2);
    ck_assert_str_eq(e->messages[0].role, "system");
    ck_assert_str_eq(e->messages[0].content, "You are terse.");
    char want[256];
    snprintf(want, sizeof want, "Think. Output inside \\boxed{} tags.:\n%s\n\nLet's think", expr);
    ck_assert_str_eq(e->messages[1].content, want);
    ck_assert_int_eq(dsarl_dataset_apply_prompt(ds, "Q: {problem}", NULL, "bad.txt", &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "bad.txt") && strstr(err.message, "offset 3"), "%s", err.message);
    dsarl_dataset_free(ds);
    remove_tmpdir();
}
END_TEST

static dsarl_recipe *load_recipe(const char *yaml)
{
    dsarl_recipe *r = NULL;
    dsarl_error err = {0};
    ck_assert_msg(dsarl_recipe_load_string(yaml, "test.yaml", &r, &err) == 0, "%s", err.message);
    return r;
}

START_TEST(test_from_recipe)
{
    dsarl_recipe *r = load_recipe("data:\n"
                                  "  train:\n"
                                  "    dataset_name: arithmetic\n"
                                  "    seed: 3\n"
                                  "    arithmetic:\n"
                                  "      num_examples: 50\n"
                                  "      max_digits: 3\n"
                                  "      prompt_format: \"{}=\"\n"
                                  "  validation:\n"
                                  "    dataset_name: arithmetic\n"
                                  "    seed: 4\n"
                                  "    arithmetic: {num_examples: 20, max_digits: 3, prompt_format: \"{}=\"}\n"
                                  "  default:\n"
                                  "    prompt_file: null\n");
    dsarl_dataset *train = NULL, *val = NULL;
    dsarl_error err = {0};
    const dsarl_node *root = dsarl_recipe_root(r);
    ck_assert_msg(dsarl_dataset_from_recipe(root, "data.train", DSARL_SPLIT_TRAIN, &train, &err) == 0, "%s",
                  err.message);
    ck_assert_msg(dsarl_dataset_from_recipe(root, "data.validation", DSARL_SPLIT_VALIDATION, &val, &err) == 0, "%s",
                  err.message);
    ck_assert_uint_eq(dsarl_dataset_size(train), 50);
    ck_assert_uint_eq(dsarl_dataset_size(val), 20);
    for (size_t i = 0; i < 20; i++) {
        const char *v = dsarl_dataset_get(val, i)->messages[0].content;
        ck_assert_int_eq(v[strlen(v) - 1], '=');
        for (size_t j = 0; j < 50; j++)
            ck_assert_str_ne(v, dsarl_dataset_get(train, j)->messages[0].content);
    }
    dsarl_dataset_free(train);
    dsarl_dataset_free(val);
    dsarl_recipe_free(r);

    const struct {
        const char *yaml, *expect1, *expect2;
    } bad[] = {
        {"data:\n  train:\n    dataset_name: arithmetic\n    arithmetic:\n      max_digits: 12\n", "test.yaml:5",
         "data.train.arithmetic.max_digits"},
        {"data:\n  train:\n    dataset_name: DAPOMath17K\n", "does not download", "data.train.data_path"},
        {"data:\n  train:\n    dataset_name: gsm8k\n", "test.yaml:3", "'gsm8k'"},
        {"data:\n  train:\n    seed: 1\n", "data.train", "neither dataset_name nor data_path"},
        {"data:\n  train:\n    dataset_name: arithmetic\n    arithmetic:\n      operators: 5\n", "test.yaml:5",
         "data.train.arithmetic.operators"},
        {"data:\n  train:\n    dataset_name: arithmetic\n    arithmetic:\n      function: sum\n", "test.yaml:5",
         "data.train.arithmetic.function must be max, min or null"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        r = load_recipe(bad[i].yaml);
        ck_assert_int_lt(dsarl_dataset_from_recipe(dsarl_recipe_root(r), "data.train", DSARL_SPLIT_TRAIN, &train,
                                                   &err), 0);
        ck_assert_ptr_null(train);
        ck_assert_msg(strstr(err.message, bad[i].expect1) && strstr(err.message, bad[i].expect2),
                      "row %zu: '%s' should say '%s' and '%s'", i, err.message, bad[i].expect1, bad[i].expect2);
        dsarl_recipe_free(r);
    }

    // plain jsonl through the recipe, with data.default's prompt file
    make_tmpdir();
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "data:\n  train:\n    data_path: %s/d.jsonl\n    input_key: q\n    output_key: a\n"
             "  default:\n    prompt_file: %s/p.txt\n",
             tmpdir, tmpdir);
    char path[128];
    snprintf(path, sizeof path, "%s/d.jsonl", tmpdir);
    write_text(path, "{\"q\": \"1+1\", \"a\": \"2\"}\n");
    snprintf(path, sizeof path, "%s/p.txt", tmpdir);
    write_text(path, "Compute {}.");
    r = load_recipe(yaml);
    ck_assert_msg(dsarl_dataset_from_recipe(dsarl_recipe_root(r), "data.train", DSARL_SPLIT_TRAIN, &train, &err) == 0,
                  "%s", err.message);
    ck_assert_str_eq(dsarl_dataset_get(train, 0)->messages[0].content, "Compute 1+1.");
    ck_assert_str_eq(dsarl_dataset_get(train, 0)->ground_truth, "2");
    dsarl_dataset_free(train);
    dsarl_recipe_free(r);
    remove_tmpdir();

    size_t n_keys;
    const dsarl_key_spec *keys = dsarl_dataset_keys(&n_keys);
    ck_assert_uint_gt(n_keys, 10);
    ck_assert_str_eq(keys[0].path, "data.*.dataset_name");
}
END_TEST

static Suite *dataset_suite(void)
{
    Suite *s = suite_create("dataset");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_arithmetic_determinism_and_answers);
    tcase_add_test(tc, test_arithmetic_splits_disjoint);
    tcase_add_test(tc, test_arithmetic_knobs);
    tcase_add_test(tc, test_arithmetic_function);
    tcase_add_test(tc, test_dapo_jsonl);
    tcase_add_test(tc, test_plain_jsonl);
    tcase_add_test(tc, test_dataloader_epochs_and_resume);
    tcase_add_test(tc, test_dataloader_in_order_keeps_last);
    tcase_add_test(tc, test_prompt_templates);
    tcase_add_test(tc, test_from_recipe);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(dataset_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
