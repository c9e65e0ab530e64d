/* check_grpo_tool_episodes.c: multi-turn tool use through the GRPO loop (algorithms/grpo/grpo_rollout.c) with the
 * real calculator environment and configs/recipes/llm/grpo-glm5.2-tiny-calculator.yaml, under a scripted policy in
 * place of the generation engine. The script reads the conversation it is given: with no result in it yet it calls
 * the tool on the prompt's expression (or, as the "no tool" policy, guesses at once); after "</calc><result>V
 * </result>" it answers " Answer: V". So the reward is 1 only if every turn's context is the prompt, the policy's
 * earlier turns and the environment's observations in order, and the metrics count the turns, calls and masked
 * observation tokens exactly. It costs one training step of the tiny model. */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsarl/fileutil.h"
#include "grpo_train.h"
#include "run_harness.h"

/* --- the scripted policy, as a generation engine --------------------------------------------------------------- */

struct dsarl_generator {
    int32_t *cu, *tokens;
    float *logprobs;
    uint8_t *truncated;
};

/* 0: answer at once; 1: use the tool; 2: use it on products whose first operand is odd, call "1/0" on the others
 * (then answer 0), so that long error observations share the batch with short results */
static int policy_mode = 1;
static int64_t turn2_contexts, observation_bytes; /* well-formed second-turn contexts seen; their results' bytes */
static int64_t good_calls;                        /* calls on the prompt's own expression */

static int script_create(const dsarl_node *recipe, const dsarl_model_ops *model_ops, dsarl_model *model,
                         dsarl_generator **out, dsarl_error *err)
{
    (void)recipe, (void)model_ops, (void)model;
    *out = calloc(1, sizeof **out);
    return *out ? 0 : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
}

static void script_destroy(dsarl_generator *g)
{
    free(g->cu), free(g->tokens), free(g->logprobs), free(g->truncated);
    free(g);
}

/* The script's next turn for a conversation: a tool call on the prompt's "What is EXPR?", or the answer copied out
 * of the last "<result>V</result>" when the conversation ends with one. */
static void next_turn(const char *text, char *turn, size_t size)
{
    size_t n = strlen(text);
    const char *res = strstr(text, "</calc><result>");
    if (res && n > 9 && strcmp(text + n - 9, "</result>") == 0) {
        const char *v = res + strlen("</calc><result>");
        int len = (int)(text + n - 9 - v);
        observation_bytes += (int64_t)strlen("<result></result>") + len;
        if (strncmp(v, "error", 5) == 0) {
            snprintf(turn, size, " Answer: 0");
            return;
        }
        snprintf(turn, size, " Answer: %.*s", len, v);
        turn2_contexts++;
        return;
    }
    const char *q = strstr(text, "What is "), *end = q ? strchr(q, '?') : NULL;
    if (policy_mode == 0 || !end) {
        snprintf(turn, size, " Answer: 0");
    } else if (policy_mode == 2 && (q[8] - '0') % 2 == 0) {
        snprintf(turn, size, "<calc>1/0</calc>"); // "<result>error: division by zero</result>" comes back
    } else {
        snprintf(turn, size, "<calc>%.*s</calc>", (int)(end - q - 8), q + 8);
        good_calls++;
    }
}

static int script_generate(dsarl_generator *g, const dsarl_token_batch *prompts, const dsarl_sampling_params *params,
                           dsarl_generation_result *result, dsarl_error *err)
{
    const dsarl_tokenizer *tok = params->tokenizer;
    int32_t B = prompts->n_sequences, eos = dsarl_tokenizer_eos_id(tok);
    free(g->cu), free(g->tokens), free(g->logprobs), free(g->truncated);
    g->cu = calloc((size_t)B + 1, sizeof(int32_t));
    g->tokens = malloc(sizeof(int32_t) * (size_t)B * 64);
    g->logprobs = malloc(sizeof(float) * (size_t)B * 64);
    g->truncated = calloc((size_t)B + 1, 1);
    ck_assert(g->cu && g->tokens && g->logprobs && g->truncated);
    for (int32_t b = 0; b < B; b++) {
        const int32_t *ids = prompts->tokens + prompts->cu_seqlens[b];
        char *text = NULL, turn[64];
        ck_assert_int_eq(dsarl_tokenizer_decode(tok, ids, (size_t)(prompts->cu_seqlens[b + 1] - prompts->cu_seqlens[b]),
                                                1, &text, NULL, err), 0);
        next_turn(text, turn, sizeof turn);
        free(text);
        int32_t *out = NULL;
        size_t n = 0;
        ck_assert_int_eq(dsarl_tokenizer_encode(tok, turn, strlen(turn), &out, &n, err), 0);
        bool answer = strncmp(turn, " Answer:", 8) == 0;
        size_t total = n + (answer && eos >= 0); // an answer ends with EOS; a call ends at its stop string
        ck_assert(total <= 64);
        if (total > (size_t)params->max_new_tokens) { // as an engine would: cut at the limit, truncated
            total = (size_t)params->max_new_tokens;
            g->truncated[b] = 1;
        }
        int32_t at = g->cu[b];
        for (size_t i = 0; i < total; i++) {
            g->tokens[at + (int32_t)i] = i < n ? out[i] : eos;
            g->logprobs[at + (int32_t)i] = -0.5f;
        }
        g->cu[b + 1] = at + (int32_t)total;
        free(out);
    }
    *result = (dsarl_generation_result){.struct_size = sizeof *result, .n_sequences = B, .cu_lengths = g->cu,
                                        .tokens = g->tokens, .logprobs = g->logprobs, .truncated = g->truncated};
    return 0;
}

static const dsarl_generation_ops script_ops = {
    .common = DSARL_OPS_COMMON_NOKEYS(dsarl_generation_ops, DSARL_KIND_GENERATION, "script", "scripted policy"),
    .create = script_create, .destroy = script_destroy, .generate = script_generate};

/* --- the run ------------------------------------------------------------------------------------------------- */

static json_t *run_one_step(const char *work)
{
    dsarl_error err = {0};
    char logs[600];
    snprintf(logs, sizeof logs, "logger.log_dir=%s/logs", work);
    const char *over[] = {"grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=2",
                          "policy.train_global_batch_size=8", "policy.train_micro_batch_size=4",
                          "grpo.max_num_steps=1", "grpo.val_period=0", "grpo.val_at_start=false",
                          "grpo.val_at_end=false", "checkpointing.enabled=false", "runtime.threads=1", logs};
    const run_overrides lists[] = {{over, DSARL_ARRAY_LEN(over)}};
    run_harness h;
    ck_assert_msg(run_harness_open(&h, "configs/recipes/llm/grpo-glm5.2-tiny-calculator.yaml", lists, 1, &err) == 0,
                  "%s", err.message);
    bool calculator = false; // data.env_name picks it among the selected ones
    for (int i = 0; i < h.ctx.n_environments; i++)
        calculator |= strcmp(h.env_names[i], "calculator") == 0;
    ck_assert(calculator);
    h.ctx.generation_ops = &script_ops;
    grpo_run_summary sum;
    turn2_contexts = observation_bytes = good_calls = 0;
    ck_assert_msg(grpo_train_run(&h.ctx, &sum, &err) == 0, "%s", err.message);
    run_harness_close(&h);
    char path[1200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", sum.exp_dir);
    json_error_t je;
    json_t *row = json_load_file(path, JSON_DISABLE_EOF_CHECK, &je);
    ck_assert_msg(row != NULL, "%s: %s", path, je.text);
    return row;
}

static double metric(json_t *row, const char *name) { return run_harness_metric(row, name); }

static void remove_tree(const char *path) { run_harness_remove_tree(path, NULL); }
/* The tool-using script solves every two-digit product in two turns; the one that answers at once solves none; the
 * mixed one solves exactly the products it called the tool on, although the failed calls' long error observations
 * run in the same turn batches (each episode's answer has the room its own conversation leaves). */
START_TEST(test_scripted_tool_policy)
{
    char work[] = "/tmp/check_grpo_tool_episodes_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(work));
    policy_mode = _i;
    json_t *row = run_one_step(work);
    double n = 8.0;
    if (policy_mode == 1) {
        ck_assert_int_eq(turn2_contexts, 8);
        ck_assert_msg(metric(row, "train/reward") == 1.0, "reward %g", metric(row, "train/reward"));
        ck_assert(metric(row, "train/avg_turns_per_sample") == 2.0);
        ck_assert(metric(row, "train/tool_calls_per_sample") == 1.0);
        ck_assert(metric(row, "train/tool_call_error_rate") == 0.0);
        ck_assert(metric(row, "train/natural_termination_rate") == 1.0);
        // the observations are the environment's tokens (one byte each), counted apart from the policy's
        ck_assert_msg(fabs(metric(row, "train/mean_env_tokens_per_sample") - (double)observation_bytes / n) < 1e-9,
                      "env tokens %g, want %g", metric(row, "train/mean_env_tokens_per_sample"),
                      (double)observation_bytes / n);
    } else if (policy_mode == 0) {
        ck_assert_int_eq(turn2_contexts, 0);
        ck_assert(metric(row, "train/reward") == 0.0);
        ck_assert(metric(row, "train/avg_turns_per_sample") == 1.0);
        ck_assert(metric(row, "train/tool_calls_per_sample") == 0.0);
        ck_assert(metric(row, "train/mean_env_tokens_per_sample") == 0.0);
    } else {
        ck_assert_msg(good_calls > 0 && good_calls < 8, "the batch should mix both kinds of call: %lld good",
                      (long long)good_calls);
        ck_assert_int_eq(turn2_contexts, good_calls);
        ck_assert_msg(metric(row, "train/reward") == (double)good_calls / n, "reward %g, want %g",
                      metric(row, "train/reward"), (double)good_calls / n);
        ck_assert(fabs(metric(row, "train/tool_call_error_rate") - (n - (double)good_calls) / n) < 1e-9);
    }
    json_decref(row);
    remove_tree(work);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("grpo_tool_episodes");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_scripted_tool_policy, 0, 3);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
