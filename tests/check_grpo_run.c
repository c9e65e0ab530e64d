/* check_grpo_run.c: the GRPO loop (algorithms/grpo/grpo_train.c) end to end on the tiny GLM-5.2 recipe shrunk to a
 * micro run (2 prompts x 4 generations, 8 new tokens): metrics present and finite, train/inference log-prob
 * agreement to float rounding on the CPU, bit-identical resume (4 steps == 2 steps + resume 2: weights, optimizer
 * state and metrics compared bit for bit), a corrupt checkpoint skipped, and bad recipe values refused before
 * anything is built. The plugins are loaded from the build tree like `dsarl run` loads them. */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsarl/fileutil.h"
#include "grpo_train.h"
#include "run_harness.h"

/* A test environment whose reward varies between random responses (the share of ASCII bytes in it), so a
 * random-init model gets non-zero advantages and the weights really move. */
struct dsarl_environment {
    int unused;
};

static int ascii_create(const dsarl_node *recipe, const dsarl_node *section, dsarl_environment **out,
                        dsarl_error *err)
{
    (void)recipe;
    (void)section;
    *out = calloc(1, sizeof **out);
    return *out ? 0 : DSARL_FAIL(err, DSARL_E_NOMEM, "out of memory");
}

static void ascii_destroy(dsarl_environment *env) { free(env); }

/* Responses scored since the last reset: counts the generation rounds a run really ran. */
static int64_t n_scored;

static int ascii_score(dsarl_environment *env, size_t n, const char *const *responses, const char *const *truths,
                       float *rewards, dsarl_verdict *verdicts, dsarl_error *err)
{
    (void)env;
    (void)truths;
    (void)err;
    n_scored += (int64_t)n;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(responses[i]), ascii = 0;
        for (size_t j = 0; j < len; j++)
            ascii += (unsigned char)responses[i][j] < 128;
        rewards[i] = len ? (float)ascii / (float)len : 0.0f;
        verdicts[i] = rewards[i] > 0.5f ? DSARL_VERDICT_CORRECT : DSARL_VERDICT_WRONG;
    }
    return 0;
}

static const dsarl_environment_ops ascii_env = {
    .common = DSARL_OPS_COMMON_NOKEYS(dsarl_environment_ops, DSARL_KIND_ENVIRONMENT, "ascii", "test reward"),
    .create = ascii_create, .destroy = ascii_destroy, .score = ascii_score};

/* A multi-turn test environment (ABI 1.4 step): turns 0 and 1 get the observation "<ok>" appended, turn 2 ends
 * the episode with the ascii reward of its own text. */
static int turns_step(dsarl_environment *env, size_t n, const char *const *responses, const char *const *truths,
                      const int32_t *turns, const char **observations, uint8_t *done, float *rewards,
                      dsarl_verdict *verdicts, int32_t *tool_calls, int32_t *invalid_tool_calls, dsarl_error *err)
{
    for (size_t i = 0; i < n; i++) {
        done[i] = turns[i] >= 2;
        observations[i] = done[i] ? NULL : "<ok>";
        tool_calls[i] = !done[i];
        invalid_tool_calls[i] = 0;
        if (done[i])
            DSARL_TRY(ascii_score(env, 1, &responses[i], &truths[i], &rewards[i], &verdicts[i], err));
    }
    return 0;
}

static const dsarl_environment_ops turns_env = {
    .common = DSARL_OPS_COMMON_NOKEYS(dsarl_environment_ops, DSARL_KIND_ENVIRONMENT, "turns", "test turns"),
    .create = ascii_create, .destroy = ascii_destroy, .score = ascii_score, .step = turns_step};

/* When set, runs use turns_env instead of ascii_env. */
static int use_turns_env;

/* The micro run: every test starts from these and adds its own overrides (later ones win). */
static const char *const micro[] = {
    "grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=4", "policy.train_global_batch_size=4",
    "policy.train_micro_batch_size=2", "policy.generation.max_new_tokens=8", "grpo.max_val_samples=4",
    "grpo.val_batch_size=4", "grpo.val_period=2", "grpo.val_at_start=false", "grpo.val_at_end=true",
    "runtime.threads=1", "checkpointing.save_period=2", "checkpointing.keep_top_k=null",
    "grpo.val_num_generations_per_prompt=2",
};

static int open_harness(run_harness *h, const char *work, const char *const *extra, size_t n_extra, dsarl_error *err)
{
    char arg[3][512];
    snprintf(arg[0], sizeof arg[0], "logger.log_dir=%s/logs", work);
    snprintf(arg[1], sizeof arg[1], "checkpointing.checkpoint_dir=%s/ckpt", work);
    snprintf(arg[2], sizeof arg[2], "grpo.max_num_steps=4");
    const char *const args[] = {arg[0], arg[1], arg[2]};
    const run_overrides lists[] = {{micro, DSARL_ARRAY_LEN(micro)}, {args, 3}, {extra, n_extra}};
    return run_harness_open(h, "configs/recipes/llm/grpo-glm5.2-tiny.yaml", lists, 3, err);
}

/* When set, runs ignore the generation plugin and sample with grpo_sample_with_model. */
static int use_builtin_sampler;

/* Runs the micro recipe with extra overrides in work; fails the test on an error. */
static grpo_run_summary run_ok(const char *work, const char *const *extra, size_t n_extra)
{
    run_harness h;
    dsarl_error err = {0};
    ck_assert_msg(open_harness(&h, work, extra, n_extra, &err) == 0, "%s", err.message);
    h.env_ops[0] = use_turns_env ? &turns_env : &ascii_env; /* the run's only environment ("math" by name) */
    if (use_builtin_sampler)
        h.ctx.generation_ops = NULL;
    grpo_run_summary sum;
    int rc = grpo_train_run(&h.ctx, &sum, &err);
    ck_assert_msg(rc == 0, "grpo_train_run: %s", err.message);
    run_harness_close(&h);
    return sum;
}

static char *make_work_dir(void) { return run_harness_work_dir("check_grpo_run"); }
/* CHECK_GRPO_RUN_KEEP set: the run directories are left for inspection */
static void remove_tree(const char *path) { run_harness_remove_tree(path, "CHECK_GRPO_RUN_KEEP"); }

/* Every line of a JSONL file (metrics or sample dumps) as a JSON array. */
static json_t *read_metrics_file(const char *path)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "no %s", path);
    json_t *rows = json_array();
    char line[65536];
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        ck_assert_msg(o != NULL, "bad metrics line: %s", je.text);
        json_array_append_new(rows, o);
    }
    fclose(f);
    return rows;
}

static json_t *read_metrics(const char *exp_dir)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", exp_dir);
    return read_metrics_file(path);
}

static double metric(json_t *row, const char *name) { return run_harness_metric(row, name); }

START_TEST(test_micro_run_metrics)
{
    use_builtin_sampler = _i; /* 0: the selected generation plugin (native), 1: the built-in sampler */
    char *work = make_work_dir();
    static const char *const extra[] = {"grpo.max_num_steps=2", "grpo.val_at_start=true", "checkpointing.enabled=false"};
    grpo_run_summary sum = run_ok(work, extra, 3);
    ck_assert_int_eq(sum.first_step, 0);
    ck_assert_int_eq(sum.last_step, 2);
    json_t *rows = read_metrics(sum.exp_dir);
    ck_assert_uint_eq(json_array_size(rows), 3); // step 0 (validation at start), 1, 2
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(rows, 0), "step")), 0);
    double acc0 = metric(json_array_get(rows, 0), "val/accuracy");
    ck_assert(acc0 >= 0.0 && acc0 <= 1.0);
    static const char *const finite[] = {
        "train/reward", "train/accuracy", "train/loss", "train/kl_penalty", "train/clip_fraction",
        "train/gen_kl_error", "train/mean_gen_length", "train/truncation_rate", "train/grad_norm", "train/lr",
        "train/advantages/mean", "timing/train/generation", "timing/train/policy_training",
        "timing/train/total_step_time", "train/tokens_per_sec"};
    for (size_t s = 1; s <= 2; s++) {
        json_t *row = json_array_get(rows, s);
        ck_assert_int_eq(json_integer_value(json_object_get(row, "step")), (json_int_t)s);
        for (size_t i = 0; i < DSARL_ARRAY_LEN(finite); i++)
            ck_assert_msg(isfinite(metric(row, finite[i])), "%s not finite", finite[i]);
        // the generation log-probs and the trainer's agree to float rounding on the CPU
        double err_mult = metric(row, "train/token_mult_prob_error");
        ck_assert_msg(fabs(err_mult - 1.0) <= 1e-5, "token_mult_prob_error %.9g", err_mult);
        ck_assert_msg(fabs(metric(row, "train/gen_kl_error")) <= 1e-5, "gen_kl_error");
        double gen_len = metric(row, "train/mean_gen_length");
        ck_assert(gen_len >= 1.0 && gen_len <= 8.0);
        // advantages of the group-mean baseline sum to zero
        ck_assert(fabs(metric(row, "train/advantages/mean")) < 1e-5);
        ck_assert(metric(row, "train/lr") > 0.0);
        // rewards vary within groups, so there is a gradient and an update
        ck_assert(metric(row, "train/grad_norm") > 0.0);
        ck_assert(metric(row, "train/advantages/max") > 0.0);
    }
    // the last step also validated (val_at_end), with pass@k over the 2 generations per prompt
    ck_assert(isfinite(metric(json_array_get(rows, 2), "val/accuracy")));
    double pass = metric(json_array_get(rows, 2), "val/pass_at_k");
    ck_assert(pass >= 0.0 && pass <= 1.0);
    char path[1300];
    snprintf(path, sizeof path, "%s/train_data_step2.jsonl", sum.exp_dir);
    ck_assert(dsarl_path_exists(path));
    snprintf(path, sizeof path, "%s/val_data_step0.jsonl", sum.exp_dir);
    ck_assert(dsarl_path_exists(path));
    // val/accuracy_se recomputed from the dumped answers: the prompts' mean rewards (2 answers each, in order) are
    // the unit, their sample standard deviation over sqrt(4 prompts)
    json_t *val = read_metrics_file(path);
    ck_assert_uint_eq(json_array_size(val), 8);
    double means[4], acc = 0, ss = 0;
    for (size_t g = 0; g < 4; g++) {
        json_t *a = json_array_get(val, 2 * g), *b = json_array_get(val, 2 * g + 1);
        ck_assert_str_eq(json_string_value(json_object_get(a, "prompt")), json_string_value(json_object_get(b, "prompt")));
        means[g] = (metric(a, "reward") + metric(b, "reward")) / 2.0;
        acc += means[g] / 4.0;
    }
    for (size_t g = 0; g < 4; g++)
        ss += (means[g] - acc) * (means[g] - acc);
    ck_assert_msg(fabs(acc - acc0) <= 1e-6, "accuracy %.9g from the samples, %.9g logged", acc, acc0);
    double se = sqrt(ss / 3.0 / 4.0);
    ck_assert_msg(fabs(metric(json_array_get(rows, 0), "val/accuracy_se") - se) <= 1e-6, "val/accuracy_se %.9g, expected %.9g",
                  metric(json_array_get(rows, 0), "val/accuracy_se"), se);
    json_decref(val);
    json_decref(rows);
    remove_tree(work);
    free(work);
}
END_TEST

/* Pass accounting: on-policy (the 8 rollouts are one optimizer slice) runs one training pass per token and no
 * other forward, its ratio is exactly 1; off-policy (two slices of 4) adds one old-log-prob forward per token; a
 * KL penalty adds the reference forward. */
START_TEST(test_pass_counts)
{
    static const struct {
        const char *gbs, *kl, *skip_ref;
        int64_t forwards_per_token;
    } cases[] = {
        {"policy.train_global_batch_size=8", "loss_fn.reference_policy_kl_penalty=0",
         "grpo.skip_reference_policy_logprobs_calculation=true", 0},
        {"policy.train_global_batch_size=4", "loss_fn.reference_policy_kl_penalty=0",
         "grpo.skip_reference_policy_logprobs_calculation=true", 1},
        {"policy.train_global_batch_size=8", "loss_fn.reference_policy_kl_penalty=0.05",
         "grpo.skip_reference_policy_logprobs_calculation=false", 1},
        {"policy.train_global_batch_size=4", "loss_fn.reference_policy_kl_penalty=0.05",
         "grpo.skip_reference_policy_logprobs_calculation=false", 2},
    };
    char *work = make_work_dir();
    const char *extra[] = {"grpo.max_num_steps=2", "checkpointing.enabled=false", cases[_i].gbs, cases[_i].kl,
                           cases[_i].skip_ref};
    grpo_run_summary sum = run_ok(work, extra, DSARL_ARRAY_LEN(extra));
    json_t *rows = read_metrics(sum.exp_dir);
    ck_assert_uint_eq(json_array_size(rows), 2);
    for (size_t s = 0; s < 2; s++) {
        json_t *row = json_array_get(rows, s);
        double T = metric(row, "train/total_num_tokens");
        ck_assert(T > 0);
        ck_assert_msg(metric(row, "train/train_pass_tokens") == T, "case %d: train pass tokens %g, T %g", _i,
                      metric(row, "train/train_pass_tokens"), T);
        ck_assert_msg(metric(row, "train/forward_tokens") == (double)cases[_i].forwards_per_token * T,
                      "case %d: forward tokens %g, T %g", _i, metric(row, "train/forward_tokens"), T);
        if (_i == 0) { /* old log-probs are the training pass's own: every ratio is 1 (the mean of the ones to double
                        * rounding of its token weights), nothing clips */
            ck_assert_msg(fabs(metric(row, "train/probs_ratio") - 1.0) <= 1e-9, "probs_ratio %.17g",
                          metric(row, "train/probs_ratio"));
            ck_assert(metric(row, "train/clip_fraction") == 0.0);
        }
    }
    json_decref(rows);
    remove_tree(work);
    free(work);
}
END_TEST

/* grpo.max_num_epochs is checked before a generation round: 150 prompts in batches of 50 are 3 steps, and no
 * fourth round is generated and thrown away. */
START_TEST(test_epoch_limit_before_generation)
{
    char *work = make_work_dir();
    static const char *const extra[] = {
        "grpo.num_prompts_per_step=50", "grpo.num_generations_per_prompt=2", "policy.train_global_batch_size=100",
        "policy.train_micro_batch_size=50", "grpo.max_num_epochs=1", "grpo.max_num_steps=10", "grpo.val_period=0",
        "grpo.val_at_end=false", "checkpointing.enabled=false", "policy.generation.max_new_tokens=2"};
    n_scored = 0;
    grpo_run_summary sum = run_ok(work, extra, DSARL_ARRAY_LEN(extra));
    ck_assert_int_eq(sum.last_step, 3);
    ck_assert_int_eq(n_scored, 3 * 100);
    remove_tree(work);
    free(work);
}
END_TEST

/* grpo.stop_at_validation_metric acts for each name the config accepts: a threshold the first validation (step 2)
 * reaches stops the run there; one it cannot reach lets it run to max_num_steps (4). */
START_TEST(test_stop_at_validation_metric)
{
    static const struct {
        const char *metric, *threshold;
        int64_t last_step;
    } cases[] = {
        {"grpo.stop_at_validation_metric=accuracy", "grpo.stop_at_validation_threshold=0", 2},
        {"grpo.stop_at_validation_metric=pass_k", "grpo.stop_at_validation_threshold=0", 2},
        {"grpo.stop_at_validation_metric=avg_length", "grpo.stop_at_validation_threshold=1", 2},
        {"grpo.stop_at_validation_metric=pass_k", "grpo.stop_at_validation_threshold=1.5", 4},
        {"grpo.stop_at_validation_metric=avg_length", "grpo.stop_at_validation_threshold=9", 4},
    };
    char *work = make_work_dir();
    const char *extra[] = {"checkpointing.enabled=false", cases[_i].metric, cases[_i].threshold};
    grpo_run_summary sum = run_ok(work, extra, DSARL_ARRAY_LEN(extra));
    ck_assert_msg(sum.last_step == cases[_i].last_step, "%s %s: stopped at %lld", cases[_i].metric,
                  cases[_i].threshold, (long long)sum.last_step);
    remove_tree(work);
    free(work);
}
END_TEST

/* Sampling at temperature 0.5 (both samplers record log-probs of the tempered distribution): the trainer scales its
 * logits by 1 / temperature (dsarl_token_batch.logit_scale), so its log-probs still match generation's. Unscaled,
 * the micro model's logits give token_mult_prob_error ~1.1 here. */
START_TEST(test_tempered_logprobs_match_generation)
{
    use_builtin_sampler = _i;
    char *work = make_work_dir();
    static const char *const extra[] = {"grpo.max_num_steps=2", "checkpointing.enabled=false",
                                        "policy.generation.temperature=0.5"};
    grpo_run_summary sum = run_ok(work, extra, 3);
    json_t *rows = read_metrics(sum.exp_dir);
    size_t checked = 0;
    for (size_t s = 0; s < json_array_size(rows); s++) {
        json_t *row = json_array_get(rows, s);
        if (!json_object_get(row, "train/token_mult_prob_error"))
            continue;
        double err_mult = metric(row, "train/token_mult_prob_error");
        ck_assert_msg(fabs(err_mult - 1.0) <= 1e-5, "temperature 0.5: token_mult_prob_error %.9g", err_mult);
        ck_assert_msg(fabs(metric(row, "train/gen_kl_error")) <= 1e-5, "temperature 0.5: gen_kl_error");
        checked++;
    }
    ck_assert_uint_eq(checked, 2);
    json_decref(rows);
    remove_tree(work);
    free(work);
}
END_TEST

static void assert_files_equal(const char *a, const char *b)
{
    void *da, *db;
    size_t na, nb;
    dsarl_error err = {0};
    ck_assert_msg(dsarl_read_file(a, &da, &na, &err) == 0, "%s", err.message);
    ck_assert_msg(dsarl_read_file(b, &db, &nb, &err) == 0, "%s", err.message);
    ck_assert_msg(na == nb && memcmp(da, db, na) == 0, "%s and %s differ", a, b);
    free(da);
    free(db);
}

/* Metrics of a step without the wall-clock ones. */
static void assert_rows_equal(json_t *a, json_t *b)
{
    const char *key;
    json_t *v;
    size_t compared = 0;
    json_object_foreach(a, key, v) {
        if (strncmp(key, "timing/", 7) == 0 || strcmp(key, "train/tokens_per_sec") == 0)
            continue;
        json_t *w = json_object_get(b, key);
        ck_assert_msg(w != NULL, "metric %s missing after resume", key);
        ck_assert_msg(json_equal(v, w), "metric %s differs after resume", key);
        compared++;
    }
    ck_assert_uint_gt(compared, 20);
}

START_TEST(test_resume_is_bit_identical)
{
    char *a = make_work_dir(), *b = make_work_dir();
    grpo_run_summary full = run_ok(a, NULL, 0);
    ck_assert_int_eq(full.last_step, 4);
    static const char *const first_half[] = {"grpo.max_num_steps=2"};
    grpo_run_summary half = run_ok(b, first_half, 1);
    ck_assert_int_eq(half.last_step, 2);
    grpo_run_summary rest = run_ok(b, NULL, 0);
    ck_assert_int_eq(rest.first_step, 2);
    ck_assert_int_eq(rest.last_step, 4);
    ck_assert_str_eq(rest.exp_dir, half.exp_dir); // the resumed run appends to the same experiment
    char pa[1200], pb[1200];
    snprintf(pa, sizeof pa, "%s/ckpt/step_4/policy/weights/model.safetensors", a);
    snprintf(pb, sizeof pb, "%s/ckpt/step_4/policy/weights/model.safetensors", b);
    assert_files_equal(pa, pb);
    // the weights did move between the checkpoints (else the comparison would prove little)
    char p2[1200];
    snprintf(p2, sizeof p2, "%s/ckpt/step_2/policy/weights/model.safetensors", a);
    void *d2, *d4;
    size_t n2, n4;
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_read_file(p2, &d2, &n2, &err), 0);
    ck_assert_int_eq(dsarl_read_file(pa, &d4, &n4, &err), 0);
    ck_assert(n2 != n4 || memcmp(d2, d4, n2) != 0);
    free(d2);
    free(d4);
    snprintf(pa, sizeof pa, "%s/ckpt/step_4/policy/optimizer/optimizer.safetensors", a);
    snprintf(pb, sizeof pb, "%s/ckpt/step_4/policy/optimizer/optimizer.safetensors", b);
    assert_files_equal(pa, pb);
    json_t *ra = read_metrics(full.exp_dir), *rb = read_metrics(rest.exp_dir);
    ck_assert_uint_eq(json_array_size(ra), 4); // steps 1..4, each once
    ck_assert_uint_eq(json_array_size(rb), 4);
    for (size_t i = 0; i < 4; i++) {
        ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(rb, i), "step")), (json_int_t)i + 1);
        assert_rows_equal(json_array_get(ra, i), json_array_get(rb, i));
    }
    snprintf(pa, sizeof pa, "%s/train_data_step4.jsonl", full.exp_dir);
    snprintf(pb, sizeof pb, "%s/train_data_step4.jsonl", rest.exp_dir);
    assert_files_equal(pa, pb);
    json_decref(ra);
    json_decref(rb);
    remove_tree(a);
    remove_tree(b);
    free(a);
    free(b);
}
END_TEST

START_TEST(test_corrupt_checkpoint_skipped)
{
    char *work = make_work_dir();
    grpo_run_summary first = run_ok(work, NULL, 0);
    ck_assert_int_eq(first.last_step, 4);
    // flip one byte in the middle of step_4's weights: its manifest CRC no longer matches
    char path[1200];
    snprintf(path, sizeof path, "%s/ckpt/step_4/policy/weights/model.safetensors", work);
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, size / 2, SEEK_SET);
    int c = fgetc(f);
    fseek(f, size / 2, SEEK_SET);
    fputc(c ^ 0x5a, f);
    fclose(f);
    // and leave a half-written tmp_step_6 behind
    snprintf(path, sizeof path, "%s/ckpt/tmp_step_6", work);
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_mkdir_p(path, &err), 0);
    static const char *const more[] = {"grpo.max_num_steps=5"};
    grpo_run_summary again = run_ok(work, more, 1);
    ck_assert_int_eq(again.first_step, 2); // step_4 skipped, step_2 loaded
    ck_assert_int_eq(again.last_step, 5);
    remove_tree(work);
    free(work);
}
END_TEST

static const struct bad_case {
    const char *override;
    const char *key;
} bad_cases[] = {
    {"grpo.num_generations_per_prompt=1", "grpo.num_generations_per_prompt"},
    {"loss_fn.ratio_clip_min=2", "loss_fn.ratio_clip_min"},
    {"loss_fn.reference_policy_kl_penalty=-0.1", "loss_fn.reference_policy_kl_penalty"},
    {"policy.train_micro_batch_size=3", "policy.train_micro_batch_size"},
    {"policy.generation.temperature=0", "policy.generation.temperature"},
    {"policy.generation.top_p=1.5", "policy.generation.top_p"},
    {"data.max_input_seq_length=65", "data.max_input_seq_length"},
    {"policy.megatron_cfg.optimizer.adam_beta1=1.5", "adam_beta1"},
};

START_TEST(test_bad_recipe_refused_before_run)
{
    char *work = make_work_dir();
    const struct bad_case *bc = &bad_cases[_i];
    run_harness h;
    dsarl_error err = {0};
    int rc = open_harness(&h, work, &bc->override, 1, &err);
    const bool opened = rc == 0; // a failed open has freed what it had opened
    if (opened)
        rc = grpo_train_run(&h.ctx, NULL, &err);
    ck_assert_msg(rc == DSARL_E_INVALID, "%s: rc %d: %s", bc->override, rc, err.message);
    ck_assert_msg(strstr(err.message, bc->key) != NULL, "%s: message lacks %s: %s", bc->override, bc->key,
                  err.message);
    // with the location of the value: the command-line argument that set it
    ck_assert_msg(strstr(err.message, "command line") != NULL || strstr(err.message, ".yaml:") != NULL,
                  "no location in: %s", err.message);
    // refused before anything was built or written
    char logs[1200];
    snprintf(logs, sizeof logs, "%s/logs", work);
    ck_assert_int_eq(dsarl_path_exists(logs), 0);
    if (opened)
        run_harness_close(&h);
    remove_tree(work);
    free(work);
}
END_TEST

/* Multi-turn episodes of up to 3 turns of at most 8 tokens (the environment ends them at the third): the observations are appended and masked out of the loss, the generation log-probs of every later turn
 * (generated after re-prefilling the prompt, the earlier turns and the observations) equal the trainer's over the
 * whole sequence, and NeMo RL's turn metrics count them. Under the native engine and the built-in sampler. */
START_TEST(test_multi_turn_episodes)
{
    use_builtin_sampler = _i;
    use_turns_env = 1;
    char *work = make_work_dir();
    static const char *const extra[] = {"grpo.max_num_steps=2", "checkpointing.enabled=false",
                                        "grpo.val_at_end=false", "grpo.val_period=0", "grpo.max_rollout_turns=3"};
    grpo_run_summary sum = run_ok(work, extra, DSARL_ARRAY_LEN(extra));
    use_turns_env = 0;
    json_t *rows = read_metrics(sum.exp_dir);
    ck_assert_uint_eq(json_array_size(rows), 2);
    for (size_t s = 0; s < 2; s++) {
        json_t *row = json_array_get(rows, s);
        double turns = metric(row, "train/avg_turns_per_sample"), env = metric(row, "train/mean_env_tokens_per_sample");
        ck_assert_msg(metric(row, "train/max_turns_per_sample") == 3.0 && turns > 1.0 && turns <= 3.0, "turns %g",
                      turns);
        // "<ok>" is 4 bytes, appended after every turn but the last of an episode
        ck_assert_msg(fabs(env - 4.0 * (turns - 1.0)) < 1e-9, "env tokens %g for %g turns", env, turns);
        ck_assert(metric(row, "train/natural_termination_rate") > 0.0);
        ck_assert(fabs(metric(row, "train/tool_calls_per_sample") - (turns - 1.0)) < 1e-9);
        double gen = metric(row, "train/mean_gen_tokens_per_sample");
        ck_assert(gen >= turns && gen <= 8.0 * turns);
        // an observation token that trained, or a turn generated from another context, would show here
        double err_mult = metric(row, "train/token_mult_prob_error");
        ck_assert_msg(fabs(err_mult - 1.0) <= 1e-5, "token_mult_prob_error %.9g", err_mult);
        ck_assert(metric(row, "train/grad_norm") > 0.0);
    }
    json_decref(rows);
    remove_tree(work);
    free(work);
}
END_TEST

/* Routing replay (policy.router_replay, policy.dsa_index_replay) on the tiny recipe: the native engine records every
 * token's experts and top-k keys and the log-prob and training passes replay them; the trainer still agrees with
 * the sampler to float rounding (token_mult_prob_error 1), and on the CPU, where the engine and the trainer round
 * alike, replaying changes nothing: with one optimizer slice per step the step's metrics equal the run without
 * replay. */
START_TEST(test_routing_replay_run)
{
    // one optimizer slice per step: every pass sees the weights the rollouts were drawn with (after an update within
    // the step the replayed routing is the old weights', the trainer's own would be the new weights')
    static const char *const base[] = {"grpo.max_num_steps=2", "checkpointing.enabled=false", "grpo.val_at_end=false",
                                       "grpo.val_period=0", "policy.train_global_batch_size=8"};
    static const char *const replay[] = {"grpo.max_num_steps=2", "checkpointing.enabled=false",
                                         "policy.train_global_batch_size=8",
                                         "grpo.val_at_end=false", "grpo.val_period=0",
                                         "+policy.router_replay.enabled=true", "+policy.dsa_index_replay.enabled=true"};
    char *work[2] = {make_work_dir(), make_work_dir()};
    grpo_run_summary sum[2] = {run_ok(work[0], base, DSARL_ARRAY_LEN(base)),
                               run_ok(work[1], replay, DSARL_ARRAY_LEN(replay))};
    json_t *rows[2] = {read_metrics(sum[0].exp_dir), read_metrics(sum[1].exp_dir)};
    ck_assert_uint_eq(json_array_size(rows[1]), 2);
    static const char *const same[] = {"train/reward", "train/loss", "train/grad_norm", "train/mean_gen_length"};
    for (size_t s = 0; s < 2; s++) {
        json_t *row = json_array_get(rows[1], s);
        double err_mult = metric(row, "train/token_mult_prob_error");
        fprintf(stderr, "routing replay step %zu: token_mult_prob_error %.9f (without replay %.9f), loss %.9g (%.9g)\n", s + 1,
               err_mult, metric(json_array_get(rows[0], s), "train/token_mult_prob_error"), metric(row, "train/loss"),
               metric(json_array_get(rows[0], s), "train/loss"));
        ck_assert_msg(fabs(err_mult - 1.0) <= 1e-5, "token_mult_prob_error %.9g", err_mult);
        ck_assert(metric(row, "train/grad_norm") > 0.0);
        for (size_t i = 0; i < DSARL_ARRAY_LEN(same); i++) {
            double a = metric(json_array_get(rows[0], s), same[i]), b = metric(row, same[i]);
            ck_assert_msg(fabs(a - b) <= 1e-6 * fmax(1.0, fabs(a)), "step %zu %s: %.9g with replay, %.9g without",
                          s + 1, same[i], b, a);
        }
    }
    for (int i = 0; i < 2; i++) {
        json_decref(rows[i]);
        remove_tree(work[i]);
        free(work[i]);
    }
}
END_TEST

/* What routing replay cannot serve yet is refused before anything runs, in one sentence naming the key: a sharded
 * layout (context-parallel chunks do not carry the rows), multi-turn episodes, the built-in sampler (which records
 * nothing). */
START_TEST(test_routing_replay_refusals)
{
    char *work = make_work_dir();
    static const char *const cases[][2] = {{"+policy.router_replay.enabled=true", NULL},
                                           {"+policy.dsa_index_replay.enabled=true", "grpo.max_rollout_turns=2"},
                                           {"+policy.router_replay.enabled=true", NULL}};
    static const char *const want[] = {"runs in one process or under data, expert, tensor and pipeline parallelism",
                                       "single-turn rollouts only", "the built-in sampler does not record routing"};
    for (int c = 0; c < 3; c++) {
        run_harness h;
        dsarl_error err = {0};
        int rc = open_harness(&h, work, cases[c], cases[c][1] ? 2 : 1, &err);
        ck_assert_msg(rc == 0, "%s", err.message);
        h.env_ops[0] = &ascii_env;
        if (c == 0) // a context-parallel layout (checked before any group is used)
            h.parallel.world_size = 2, h.parallel.cp_size = 2;
        if (c == 2)
            h.ctx.generation_ops = NULL;
        rc = grpo_train_run(&h.ctx, NULL, &err);
        ck_assert_msg(rc == (c == 2 ? DSARL_E_UNSUPPORTED : DSARL_E_INVALID), "case %d: rc %d: %s", c, rc,
                      err.message);
        ck_assert_msg(strstr(err.message, want[c]) != NULL, "case %d: %s", c, err.message);
        ck_assert_msg(strstr(err.message, c == 1 ? "policy.dsa_index_replay.enabled" : "policy.router_replay.enabled"),
                      "case %d names no key: %s", c, err.message);
        ck_assert_msg(!strchr(err.message, '\n'), "case %d: not one line: %s", c, err.message);
        run_harness_close(&h);
    }
    remove_tree(work);
    free(work);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("grpo_run");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_micro_run_metrics, 0, 2);
    tcase_add_loop_test(tc, test_tempered_logprobs_match_generation, 0, 2);
    tcase_add_test(tc, test_resume_is_bit_identical);
    tcase_add_loop_test(tc, test_pass_counts, 0, 4);
    tcase_add_test(tc, test_epoch_limit_before_generation);
    tcase_add_loop_test(tc, test_stop_at_validation_metric, 0, 5);
    tcase_add_test(tc, test_corrupt_checkpoint_skipped);
    tcase_add_loop_test(tc, test_multi_turn_episodes, 0, 2);
    tcase_add_loop_test(tc, test_bad_recipe_refused_before_run, 0, (int)DSARL_ARRAY_LEN(bad_cases));
    suite_add_tcase(s, tc);
    TCase *replay = tcase_create("replay"); // CK_RUN_CASE=replay runs these alone
    tcase_set_timeout(replay, 600);
    tcase_add_test(replay, test_routing_replay_run);
    tcase_add_test(replay, test_routing_replay_refusals);
    suite_add_tcase(s, replay);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
