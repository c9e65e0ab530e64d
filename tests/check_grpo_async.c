/* check_grpo_async.c: generation on its own weight copy (policy.generation.colocated.enabled false, refit in buckets)
 * and asynchronous GRPO (grpo.async_grpo) on the micro run of the tiny GLM-5.2 recipe, against the one-process
 * colocated run as the reference: the refitted copy generates exactly what the policy would (metrics and sample
 * dumps bit-identical, several buckets per refit); async with max_trajectory_age_steps 0 is the synchronous run bit
 * for bit; with age 1 the first step is the synchronous one and later steps train on batches of the previous
 * weights, so the importance weights differ from 1 while the synchronous run's are 1 to float rounding; a checkpoint
 * resumes before the queued batches; and every combination NeMo RL refuses is refused naming its key. */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsarl/fileutil.h"
#include "grpo.h"
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

static int ascii_score(dsarl_environment *env, size_t n, const char *const *responses, const char *const *truths,
                       float *rewards, dsarl_verdict *verdicts, dsarl_error *err)
{
    (void)env;
    (void)truths;
    (void)err;
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

/* The micro run: every test starts from these and adds its own overrides (later ones win). */
static const char *const micro[] = {
    "grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=4", "policy.train_global_batch_size=4",
    "policy.train_micro_batch_size=2", "policy.generation.max_new_tokens=8", "grpo.max_val_samples=4",
    "grpo.val_batch_size=4", "grpo.val_period=2", "grpo.val_at_start=false", "grpo.val_at_end=true",
    "runtime.threads=1", "checkpointing.save_period=2", "checkpointing.keep_top_k=null",
    "grpo.val_num_generations_per_prompt=2",
};

static int open_harness(run_harness *h, const char *work, const char *const *extra, size_t n_extra,
                        dsarl_error *err)
{
    char arg[3][512];
    snprintf(arg[0], sizeof arg[0], "logger.log_dir=%s/logs", work);
    snprintf(arg[1], sizeof arg[1], "checkpointing.checkpoint_dir=%s/ckpt", work);
    snprintf(arg[2], sizeof arg[2], "grpo.max_num_steps=4");
    const char *const args[] = {arg[0], arg[1], arg[2]};
    const run_overrides lists[] = {{micro, DSARL_ARRAY_LEN(micro)}, {args, 3}, {extra, n_extra}};
    return run_harness_open(h, "configs/recipes/llm/grpo-glm5.2-tiny.yaml", lists, 3, err);
}

/* Runs the micro recipe with extra overrides in work (checkpointing off unless an override turns it on). */
static grpo_run_summary run_ok(const char *work, const char *const *extra, size_t n_extra)
{
    run_harness h;
    dsarl_error err = {0};
    ck_assert_msg(open_harness(&h, work, extra, n_extra, &err) == 0, "%s", err.message);
    h.env_ops[0] = &ascii_env;
    grpo_run_summary sum;
    int rc = grpo_train_run(&h.ctx, &sum, &err);
    ck_assert_msg(rc == 0, "grpo_train_run: %s", err.message);
    run_harness_close(&h);
    return sum;
}

static char *make_work_dir(void) { return run_harness_work_dir("check_grpo_async"); }

static void remove_tree(char *path)
{
    run_harness_remove_tree(path, "CHECK_GRPO_ASYNC_KEEP");
    free(path);
}

/* The refusal of a run that must not start: its status and the key its message names. */
static void assert_refused(const char *const *extra, size_t n_extra, const char *key, int code)
{
    char *work = make_work_dir();
    run_harness h;
    dsarl_error err = {0};
    ck_assert_msg(open_harness(&h, work, extra, n_extra, &err) == 0, "%s", err.message);
    h.env_ops[0] = &ascii_env;
    grpo_run_summary sum;
    int rc = grpo_train_run(&h.ctx, &sum, &err);
    ck_assert_msg(rc == code, "expected status %d for %s, got %d: %s", code, key, rc, err.message);
    ck_assert_msg(strstr(err.message, key) != NULL, "message does not name %s: %s", key, err.message);
    run_harness_close(&h);
    remove_tree(work);
}


static json_t *read_jsonl(const char *dir, const char *file)
{
    char path[1300];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "no %s", path);
    json_t *rows = json_array();
    char line[65536];
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        ck_assert_msg(o != NULL, "bad line in %s: %s", path, je.text);
        json_array_append_new(rows, o);
    }
    fclose(f);
    return rows;
}

static double metric(json_t *row, const char *name) { return run_harness_metric(row, name); }

/* Metrics a run without the generation copy or the queue does not log, and the wall-clock ones. */
static bool placement_only(const char *key)
{
    return strncmp(key, "timing/", 7) == 0 || strcmp(key, "train/tokens_per_sec") == 0 ||
           strcmp(key, "train/refit_buckets") == 0 || strncmp(key, "train/trajectory_", 17) == 0;
}

/* Every metric of reference row a (but the placement-only ones) is in b with the same value, bit for bit. */
static void assert_row_equal(json_t *a, json_t *b, const char *what)
{
    const char *key;
    json_t *v;
    size_t compared = 0;
    json_object_foreach(a, key, v) {
        if (placement_only(key))
            continue;
        json_t *w = json_object_get(b, key);
        ck_assert_msg(w != NULL, "%s: metric %s missing", what, key);
        ck_assert_msg(json_equal(v, w), "%s: metric %s differs (%.17g vs %.17g)", what, key, json_number_value(v),
                      json_number_value(w));
        compared++;
    }
    ck_assert_uint_gt(compared, 20);
}

static void assert_dumps_equal(const char *a, const char *b, int64_t step)
{
    char name[64];
    snprintf(name, sizeof name, "train_data_step%lld.jsonl", (long long)step);
    json_t *ra = read_jsonl(a, name), *rb = read_jsonl(b, name);
    ck_assert_msg(json_equal(ra, rb), "%s differs", name);
    json_decref(ra);
    json_decref(rb);
}

static const char *const sync_is[] = {"checkpointing.enabled=false", "grpo.max_num_steps=3",
                                      "loss_fn.use_importance_sampling_correction=true"};

/* The refitted copy generates what the policy itself would: the non-colocated synchronous run is the colocated one
 * bit for bit, with the weights in several buckets per refit (a 4 KiB buffer). */
START_TEST(test_noncolocated_sync_is_colocated)
{
    char *a = make_work_dir(), *b = make_work_dir();
    grpo_run_summary ref = run_ok(a, sync_is, 3);
    static const char *const copy[] = {"checkpointing.enabled=false", "grpo.max_num_steps=3",
                                       "loss_fn.use_importance_sampling_correction=true",
                                       "++policy.generation.colocated.enabled=false",
                                       "++policy.refit_buffer_size_gb=0.000004"};
    grpo_run_summary got = run_ok(b, copy, 5);
    json_t *ra = read_jsonl(ref.exp_dir, "metrics.jsonl"), *rb = read_jsonl(got.exp_dir, "metrics.jsonl");
    ck_assert_uint_eq(json_array_size(ra), json_array_size(rb));
    for (size_t i = 0; i < json_array_size(ra); i++) {
        json_t *x = json_array_get(ra, i), *y = json_array_get(rb, i);
        if (!json_object_get(x, "train/loss"))
            continue;
        assert_row_equal(x, y, "non-colocated");
        ck_assert_msg(metric(y, "train/refit_buckets") > 1, "one bucket only: the test does not split the weights");
        ck_assert(metric(y, "timing/train/prepare_for_generation/transfer_and_update_weights") >= 0.0);
        ck_assert_ptr_null(json_object_get(x, "train/refit_buckets")); // colocated: nothing to refit
    }
    for (int64_t s = 1; s <= 3; s++)
        assert_dumps_equal(ref.exp_dir, got.exp_dir, s);
    json_decref(ra);
    json_decref(rb);
    remove_tree(a);
    remove_tree(b);
}
END_TEST

static const char *const async_base[] = {"checkpointing.enabled=false", "grpo.max_num_steps=3",
                                         "loss_fn.use_importance_sampling_correction=true",
                                         "++policy.generation.colocated.enabled=false",
                                         "++grpo.async_grpo.enabled=true"};

/* Age 0: every batch comes from the weights that train on it, drawn and seeded as the synchronous run does. */
START_TEST(test_async_age0_is_synchronous)
{
    char *a = make_work_dir(), *b = make_work_dir();
    grpo_run_summary ref = run_ok(a, sync_is, 3);
    const char *extra[6] = {async_base[0], async_base[1], async_base[2], async_base[3], async_base[4],
                            "++grpo.async_grpo.max_trajectory_age_steps=0"};
    grpo_run_summary got = run_ok(b, extra, 6);
    json_t *ra = read_jsonl(ref.exp_dir, "metrics.jsonl"), *rb = read_jsonl(got.exp_dir, "metrics.jsonl");
    ck_assert_uint_eq(json_array_size(ra), json_array_size(rb));
    size_t steps = 0;
    for (size_t i = 0; i < json_array_size(ra); i++) {
        json_t *x = json_array_get(ra, i), *y = json_array_get(rb, i);
        assert_row_equal(x, y, "async age 0");
        if (json_object_get(y, "train/loss")) {
            ck_assert(metric(y, "train/trajectory_age_mean") == 0.0 && metric(y, "train/trajectory_age_max") == 0.0);
            ck_assert(metric(y, "train/trajectory_staleness") == 0.0);
            steps++;
        }
    }
    ck_assert_uint_eq(steps, 3);
    for (int64_t s = 1; s <= 3; s++)
        assert_dumps_equal(ref.exp_dir, got.exp_dir, s);
    json_decref(ra);
    json_decref(rb);
    remove_tree(a);
    remove_tree(b);
}
END_TEST

/* Age 1: step 1 has no older weights (the synchronous step exactly); steps 2 and 3 train on batches of the weights
 * one optimizer step older, so the generator's and the trainer's log-probs differ: the importance weights and the
 * train/inference error move away from 1, where the synchronous run has them at 1 to float rounding. */
START_TEST(test_async_age1_trains_on_older_batches)
{
    char *a = make_work_dir(), *b = make_work_dir();
    grpo_run_summary ref = run_ok(a, sync_is, 3);
    grpo_run_summary got = run_ok(b, async_base, 5);
    json_t *ra = read_jsonl(ref.exp_dir, "metrics.jsonl"), *rb = read_jsonl(got.exp_dir, "metrics.jsonl");
    ck_assert_uint_eq(json_array_size(ra), json_array_size(rb));
    size_t steps = 0;
    for (size_t i = 0; i < json_array_size(rb); i++) {
        json_t *x = json_array_get(ra, i), *y = json_array_get(rb, i);
        if (!json_object_get(y, "train/loss"))
            continue;
        int64_t step = (int64_t)json_integer_value(json_object_get(y, "step"));
        double ref_err = metric(x, "train/token_mult_prob_error"), err = metric(y, "train/token_mult_prob_error");
        double ref_is = metric(x, "train/sampling_importance_ratio"), is = metric(y, "train/sampling_importance_ratio");
        ck_assert_msg(fabs(ref_err - 1.0) <= 1e-5 && fabs(ref_is - 1.0) <= 1e-5, "sync step %lld: %.9g %.9g",
                      (long long)step, ref_err, ref_is);
        if (step == 1) {
            assert_row_equal(x, y, "async age 1, step 1");
            ck_assert(metric(y, "train/trajectory_age_max") == 0.0);
        } else {
            ck_assert(metric(y, "train/trajectory_age_mean") == 1.0 && metric(y, "train/trajectory_age_max") == 1.0);
            ck_assert(metric(y, "train/trajectory_staleness") == 1.0);
            // the older generator: a train/inference mismatch far above float rounding, and IS weights != 1
            ck_assert_msg(err - 1.0 > 1e-3, "step %lld: token_mult_prob_error %.9g", (long long)step, err);
            ck_assert_msg(fabs(is - 1.0) > 1e-4, "step %lld: sampling_importance_ratio %.9g", (long long)step, is);
            ck_assert_msg(fabs(metric(y, "train/gen_kl_error")) > 1e-5, "step %lld: gen_kl_error", (long long)step);
        }
        steps++;
    }
    ck_assert_uint_eq(steps, 3);
    assert_dumps_equal(ref.exp_dir, got.exp_dir, 1);
    json_decref(ra);
    json_decref(rb);
    remove_tree(a);
    remove_tree(b);
}
END_TEST

/* A checkpoint of an async run points the loader before the queued batch: the resumed run trains the same prompts
 * at the same steps as the uninterrupted one, its first batch generated afresh by the restored weights (age 0). */
START_TEST(test_async_resume_redraws_the_queue)
{
    char *a = make_work_dir(), *b = make_work_dir();
    static const char *const full[] = {"grpo.max_num_steps=4", "loss_fn.use_importance_sampling_correction=true",
                                       "++policy.generation.colocated.enabled=false", "++grpo.async_grpo.enabled=true"};
    grpo_run_summary whole = run_ok(a, full, 4);
    const char *half[5] = {full[0], full[1], full[2], full[3], "grpo.max_num_steps=2"};
    run_ok(b, half, 5);
    grpo_run_summary rest = run_ok(b, full, 4);
    ck_assert_int_eq(rest.first_step, 2);
    ck_assert_int_eq(rest.last_step, 4);
    for (int64_t s = 1; s <= 4; s++) {
        char name[64];
        snprintf(name, sizeof name, "train_data_step%lld.jsonl", (long long)s);
        json_t *x = read_jsonl(whole.exp_dir, name), *y = read_jsonl(rest.exp_dir, name);
        ck_assert_uint_eq(json_array_size(x), json_array_size(y));
        for (size_t i = 0; i < json_array_size(x); i++)
            ck_assert_str_eq(json_string_value(json_object_get(json_array_get(x, i), "prompt")),
                             json_string_value(json_object_get(json_array_get(y, i), "prompt")));
        json_decref(x);
        json_decref(y);
    }
    json_t *rb = read_jsonl(rest.exp_dir, "metrics.jsonl");
    size_t checked = 0;
    for (size_t i = 0; i < json_array_size(rb); i++) {
        json_t *y = json_array_get(rb, i);
        int64_t step = (int64_t)json_integer_value(json_object_get(y, "step"));
        if (json_object_get(y, "train/loss") && step >= 3) {
            ck_assert_msg(metric(y, "train/trajectory_age_max") == (step == 3 ? 0.0 : 1.0), "step %lld age %g",
                          (long long)step, metric(y, "train/trajectory_age_max"));
            checked++;
        }
    }
    ck_assert_uint_eq(checked, 2);
    json_decref(rb);
    remove_tree(a);
    remove_tree(b);
}
END_TEST

/* The combinations NeMo RL refuses, and the knobs without meaning here, refused before anything is built. */
static const struct refusal {
    const char *extra[4];
    const char *key;
    int code;
} refusals[] = {
    {{"++grpo.async_grpo.enabled=true", "loss_fn.use_importance_sampling_correction=true"}, "colocated.enabled",
     DSARL_E_INVALID},
    {{"++grpo.async_grpo.enabled=true", "++policy.generation.colocated.enabled=false"},
     "use_importance_sampling_correction", DSARL_E_INVALID},
    {{"++grpo.async_grpo.enabled=true", "++policy.generation.colocated.enabled=false",
      "loss_fn.use_importance_sampling_correction=true", "++grpo.async_grpo.in_flight_weight_updates=true"},
     "grpo.async_grpo.in_flight_weight_updates", DSARL_E_INVALID},
    {{"++grpo.async_grpo.enabled=true", "++policy.generation.colocated.enabled=false",
      "loss_fn.use_importance_sampling_correction=true", "++grpo.async_grpo.recompute_kv_cache_after_weight_updates=true"},
     "grpo.async_grpo.recompute_kv_cache_after_weight_updates", DSARL_E_INVALID},
    {{"++grpo.async_grpo.enabled=true", "++policy.generation.colocated.enabled=false",
      "loss_fn.use_importance_sampling_correction=true", "++grpo.async_grpo.max_generation_failures=2"},
     "grpo.async_grpo.max_generation_failures", DSARL_E_INVALID},
    {{"++grpo.async_grpo.enabled=true", "++policy.generation.colocated.enabled=false",
      "loss_fn.use_importance_sampling_correction=true", "++grpo.async_grpo.max_trajectory_age_steps=-1"},
     "grpo.async_grpo.max_trajectory_age_steps", DSARL_E_INVALID},
    {{"++grpo.async_grpo.enabled=true", "++policy.generation.colocated.enabled=false",
      "loss_fn.use_importance_sampling_correction=true", "grpo.use_dynamic_sampling=true"},
     "grpo.use_dynamic_sampling", DSARL_E_INVALID},
    {{"++policy.generation.colocated.enabled=false", "++policy.refit_buffer_size_gb=0"}, "policy.refit_buffer_size_gb",
     DSARL_E_INVALID},
};

START_TEST(test_refusals)
{
    const struct refusal *r = &refusals[_i];
    size_t n = 0;
    while (n < 4 && r->extra[n])
        n++;
    assert_refused(r->extra, n, r->key, r->code);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("grpo_async");
    TCase *tc = tcase_create("runs");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_noncolocated_sync_is_colocated);
    tcase_add_test(tc, test_async_age0_is_synchronous);
    tcase_add_test(tc, test_async_age1_trains_on_older_batches);
    tcase_add_test(tc, test_async_resume_redraws_the_queue);
    tcase_add_loop_test(tc, test_refusals, 0, (int)(sizeof refusals / sizeof refusals[0]));
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
