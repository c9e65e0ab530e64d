/* check_distill_run.c: on-policy distillation (algorithms/distillation) end to end on the tiny GLM-5.2 recipe
 * shrunk to a micro run. The teacher is a fixture built on the fly: a bigger tiny GLM-5.2 (5 layers, hidden 80)
 * with a sharpened LM head, so its next-token distributions are far from the student's near-uniform ones, saved by
 * the model plugin into the run's directory. The student's KL to it must fall over a few steps, and bad
 * recipes must be refused before any model is built. The plugins are loaded from the build tree. */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distill.h"
#include "dsarl/fileutil.h"
#include "dsarl/trainer.h"
#include "run_harness.h"

static const char *const micro[] = {
    "distillation.num_prompts_per_step=8", "distillation.num_generations_per_prompt=2",
    "policy.train_global_batch_size=16", "policy.train_micro_batch_size=8", "policy.logprob_batch_size=16",
    "policy.generation.max_new_tokens=16", "distillation.topk_logits_k=4", "distillation.val_period=0",
    "distillation.val_at_end=false", "runtime.threads=1", "checkpointing.enabled=false",
    "policy.megatron_cfg.scheduler.lr_warmup_iters=0", "policy.megatron_cfg.optimizer.lr=5.0e-3",
    "policy.megatron_cfg.optimizer.min_lr=5.0e-3",
};

static int open_harness(run_harness *h, const char *work, const char *const *extra, size_t n_extra, dsarl_error *err)
{
    char arg[2][512];
    snprintf(arg[0], sizeof arg[0], "logger.log_dir=%s/logs", work);
    snprintf(arg[1], sizeof arg[1], "teacher.model_name=%s/teacher", work);
    const char *const args[] = {arg[0], arg[1]};
    const run_overrides lists[] = {{micro, DSARL_ARRAY_LEN(micro)}, {args, 2}, {extra, n_extra}};
    return run_harness_open(h, "configs/recipes/llm/distillation-glm5.2-tiny.yaml", lists, 3, err);
}

/* The teacher fixture: the micro recipe's model made bigger (5 layers, hidden 80), built with random weights, its
 * LM head scaled by 40 so that its next-token distributions are sharp (a near-uniform random teacher would leave
 * nothing to learn), and saved in Hugging Face layout to work/teacher. */
static void make_teacher(const char *work)
{
    static const char *const bigger[] = {
        "policy.model_config.num_hidden_layers=5", "policy.model_config.hidden_size=80",
        "policy.model_config.intermediate_size=160"};
    run_harness h;
    dsarl_error err = {0};
    ck_assert_msg(open_harness(&h, work, bigger, DSARL_ARRAY_LEN(bigger), &err) == 0, "%s", err.message);
    dsarl_session_config sc = {.struct_size = sizeof sc, .host = h.ctx.host, .recipe = h.ctx.recipe,
                               .parallel = h.ctx.parallel, .seed = 7, .threads = 1, .device_ops = h.ctx.device_ops,
                               .dsa_ops = h.ctx.dsa_ops, .model_ops = h.ctx.model_ops};
    dsarl_session s;
    memset(&s, 0, sizeof s);
    ck_assert_msg(dsarl_session_open(&sc, &s, &err) == 0, "%s", err.message);
    const double sharpen = getenv("CHECK_DISTILL_SHARPEN") ? atof(getenv("CHECK_DISTILL_SHARPEN")) : 40.0;
    int64_t n = s.model_ops->parameter_tensors(s.model), found = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *name;
        int32_t ndim;
        int64_t shape[8];
        int trainable;
        ck_assert_msg(s.model_ops->parameter_info(s.model, i, &name, &ndim, shape, &trainable, &err) == 0, "%s",
                      err.message);
        if (strcmp(name, "lm_head.weight") != 0)
            continue;
        size_t count = (size_t)(shape[0] * shape[1]);
        float *w = malloc(sizeof(float) * count);
        ck_assert_ptr_nonnull(w);
        ck_assert_msg(s.model_ops->read_parameter(s.model, i, w, NULL, &err) == 0, "%s", err.message);
        for (size_t j = 0; j < count; j++)
            w[j] *= (float)sharpen;
        ck_assert_msg(s.model_ops->write_parameter(s.model, i, w, &err) == 0, "%s", err.message);
        free(w);
        found++;
    }
    ck_assert_int_eq(found, 1);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/teacher", work);
    ck_assert_msg(s.model_ops->save(s.model, dir, &err) == 0, "%s", err.message);
    dsarl_session_close(&s);
    run_harness_close(&h);
}

static char *make_work_dir(void) { return run_harness_work_dir("check_distill_run"); }
/* CHECK_DISTILL_RUN_KEEP set: the run directories (and the teacher) are left for inspection */
static void remove_tree(const char *path) { run_harness_remove_tree(path, "CHECK_DISTILL_RUN_KEEP"); }

static double metric(json_t *row, const char *name) { return run_harness_metric(row, name); }

static json_t *read_metrics(const char *exp_dir)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", exp_dir);
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

/* The KL to the teacher falls over 10 steps of the default reverse KL: the mean of the last three steps is well
 * under the mean of the first two (each step scores fresh rollouts, so single steps are noisy). A 2-step mixed-KL
 * run checks the rest: metrics finite, the teacher ran forward only (one pass per token, never a training pass),
 * the student's training pass ran the batch topk_logits_k = 4 times. */
START_TEST(test_kl_falls)
{
    static const char *const kl[] = {"loss_fn.kl_type=reverse", "loss_fn.kl_type=mixed"};
    static const int64_t steps[] = {10, 2};
    char *work = make_work_dir();
    make_teacher(work);
    char n_steps[64];
    snprintf(n_steps, sizeof n_steps, "distillation.max_num_steps=%lld", (long long)steps[_i]);
    const char *extra[] = {n_steps, kl[_i]};
    run_harness h;
    dsarl_error err = {0};
    ck_assert_msg(open_harness(&h, work, extra, DSARL_ARRAY_LEN(extra), &err) == 0, "%s", err.message);
    distill_run_summary sum;
    ck_assert_msg(distill_train_run(&h.ctx, &sum, &err) == 0, "%s", err.message);
    run_harness_close(&h);
    ck_assert_int_eq(sum.last_step, steps[_i]);
    json_t *rows = read_metrics(sum.exp_dir);
    size_t n = json_array_size(rows);
    ck_assert_uint_eq(n, (size_t)steps[_i]);
    const char *name = "train/kl_to_teacher";
    printf("check_distill_run: %s %s:", kl[_i], name);
    for (size_t s = 0; s < n; s++)
        printf(" %.4f", metric(json_array_get(rows, s), name));
    printf("\n");
    fflush(stdout);
    if (_i == 0) {
        double first = 0.5 * (metric(json_array_get(rows, 0), name) + metric(json_array_get(rows, 1), name));
        double last = (metric(json_array_get(rows, n - 3), name) + metric(json_array_get(rows, n - 2), name) +
                       metric(json_array_get(rows, n - 1), name)) / 3.0;
        ck_assert_msg(first > 0.3, "the fixture teacher should start far from the student: %g", first);
        ck_assert_msg(last < 0.85 * first, "%s did not fall: %g -> %g", name, first, last);
    }
    for (size_t s = 0; s < n; s++) {
        json_t *row = json_array_get(rows, s);
        double T = metric(row, "train/total_num_tokens");
        ck_assert(isfinite(metric(row, "train/loss")) && metric(row, "train/grad_norm") > 0.0);
        ck_assert(metric(row, "train/forward_kl_to_teacher") > 0.0);
        ck_assert(metric(row, "train/forward_tokens") == T);
        ck_assert(metric(row, "train/train_pass_tokens") == 4.0 * T);
        double mass = metric(row, "train/student_topk_mass");
        ck_assert(mass > 0.0 && mass <= 1.0 + 1e-6);
    }
    json_decref(rows);
    remove_tree(work);
    free(work);
}
END_TEST

/* Bad recipes are refused in one sentence naming the key, before any model is built (no log directory). */
static const struct {
    const char *override, *key;
    int code;
} bad_cases[] = {
    {"loss_fn.kl_type=sideways", "loss_fn.kl_type", DSARL_E_INVALID},
    {"loss_fn.mixed_kl_weight=1.5", "loss_fn.mixed_kl_weight", DSARL_E_INVALID},
    {"loss_fn.zero_outside_topk=true", "loss_fn.zero_outside_topk", DSARL_E_UNSUPPORTED},
    {"distillation.topk_logits_k=0", "distillation.topk_logits_k", DSARL_E_INVALID},
    {"teacher.model_name=null", "teacher.model_name", DSARL_E_INVALID},
    {"policy.train_micro_batch_size=3", "policy.train_micro_batch_size", DSARL_E_INVALID},
};

START_TEST(test_bad_recipe_refused)
{
    char *work = make_work_dir();
    const char *extra[] = {bad_cases[_i].override};
    run_harness h;
    dsarl_error err = {0};
    ck_assert_msg(open_harness(&h, work, extra, 1, &err) == 0, "%s", err.message);
    int rc = distill_train_run(&h.ctx, NULL, &err);
    run_harness_close(&h);
    ck_assert_msg(rc == bad_cases[_i].code, "%s: rc %d (%s)", bad_cases[_i].override, rc, err.message);
    ck_assert_msg(strstr(err.message, bad_cases[_i].key) != NULL, "%s: message '%s'", bad_cases[_i].override,
                  err.message);
    ck_assert(strchr(err.message, '\n') == NULL);
    char logs[600];
    snprintf(logs, sizeof logs, "%s/logs", work);
    ck_assert_int_eq(dsarl_path_exists(logs), 0);
    remove_tree(work);
    free(work);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("distill_run");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_kl_falls, 0, 2);
    tcase_add_loop_test(tc, test_bad_recipe_refused, 0, (int)(sizeof bad_cases / sizeof bad_cases[0]));
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
