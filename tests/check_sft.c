/* check_sft.c: the SFT algorithm on a tiny GLM-5.2 with the byte tokenizer and the arithmetic task: samples
 * (prompt through the chat template, answer in the verifier's format, EOS, targets only on the answer) against
 * strings built by hand; a short run lowers the loss; a run killed with SIGKILL after a checkpoint and resumed ends
 * with weights and AdamW state byte-identical to an uninterrupted run; bad recipe values refused with their
 * location. */
#include <check.h>
#include <glob.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "cpu_device.h"
#include "dsa_reference.h"
#include "dsarl/checkpoint.h"
#include "dsarl/fileutil.h"
#include "glm5_ops.h"
#include "recipe_internal.h"
#include "sft.h"

static dsarl_error err;

/* ------------------------------------------------------------------------------------------------------------
 * Samples. */

START_TEST(test_sample_tokens_and_targets)
{
    dsarl_tokenizer *tok = NULL;
    ck_assert_int_eq(dsarl_tokenizer_load("byte", &tok, &err), 0);
    dsarl_chat_message msgs[2] = {{"system", "Be brief."}, {"user", "What is 12+7?"}};
    dsarl_example ex = {.messages = msgs, .n_messages = 2, .ground_truth = "19", .task_name = "math"};
    sft_sample s;
    ck_assert_msg(sft_build_sample(tok, "plain", " Answer: {}", &ex, 1000, &s, &err) == 0, "%s", err.message);
    const char *prompt = "System: Be brief.\nUser: What is 12+7?\nAssistant:", *answer = " Answer: 19";
    int32_t np = (int32_t)strlen(prompt), na = (int32_t)strlen(answer);
    ck_assert_int_eq(s.prompt_len, np);
    ck_assert_int_eq(s.n, np + na + 1);
    ck_assert_int_eq(s.n_answer, na + 1); // the answer bytes and EOS
    ck_assert_str_eq(s.answer, answer);
    for (int32_t t = 0; t < s.n; t++) {
        int32_t want = t < np ? (unsigned char)prompt[t] : t < np + na ? (unsigned char)answer[t - np]
                                                                        : DSARL_BYTE_TOKENIZER_EOS;
        ck_assert_int_eq(s.tokens[t], want);
        // position t scores token t + 1, and only answer tokens (and EOS) are scored
        int32_t u = t + 1;
        int32_t next = u < np ? -1 : u < np + na ? (unsigned char)answer[u - np] : u == np + na ? 257 : -1;
        ck_assert_int_eq(s.targets[t], next);
    }
    ck_assert_int_eq(s.targets[np - 1], ' ');
    ck_assert_int_eq(s.targets[s.n - 2], DSARL_BYTE_TOKENIZER_EOS);
    ck_assert_int_eq(s.targets[s.n - 1], -1);
    sft_sample_free(&s);
    // cut 5 tokens past the prompt: "Answe" remains, all five scored (the first from the prompt's last position)
    ck_assert_int_eq(sft_build_sample(tok, "plain", "Answer: {} done", &ex, np + 5, &s, &err), 0);
    ck_assert_int_eq(s.n, np + 5);
    ck_assert_int_eq(s.n_answer, 5);
    ck_assert_str_eq(s.answer, "Answer: 19 done");
    ck_assert_int_eq(s.tokens[np + 4], 'e');
    ck_assert_int_eq(s.targets[np + 4], -1);
    sft_sample_free(&s);
    dsarl_tokenizer_free(tok);
}
END_TEST

/* ------------------------------------------------------------------------------------------------------------
 * Whole runs through sft_run. */

static const char *recipe_format =
    "runtime: {threads: 1}\n"
    "policy:\n"
    "  model_config:\n"
    "    vocab_size: 260\n    hidden_size: 16\n    intermediate_size: 24\n    moe_intermediate_size: 6\n"
    "    num_hidden_layers: 2\n    num_attention_heads: 2\n    num_key_value_heads: 2\n    q_lora_rank: 12\n"
    "    kv_lora_rank: 8\n    qk_nope_head_dim: 4\n    qk_rope_head_dim: 4\n    v_head_dim: 6\n"
    "    n_routed_experts: 4\n    num_experts_per_tok: 2\n    n_group: 2\n    topk_group: 2\n    index_topk: 4\n"
    "    index_head_dim: 8\n    index_n_heads: 2\n    first_k_dense_replace: 1\n    index_topk_freq: 2\n"
    "    n_shared_experts: 1\n    initializer_range: 0.1\n    max_position_embeddings: 64\n"
    "  megatron_cfg:\n"
    "    model_overrides: {dsa_indexer_loss_coeff: 0.01}\n"
    "    optimizer: {lr: 1.0e-2, min_lr: 1.0e-3, weight_decay: 0.01}\n"
    "    scheduler: {lr_warmup_iters: 2, lr_warmup_init: 1.0e-3, lr_decay_style: cosine}\n"
    "  tokenizer: {name: byte, chat_template: plain}\n"
    "  train_global_batch_size: 8\n"
    "  train_micro_batch_size: 4\n"
    "  max_total_sequence_length: 40\n"
    "  max_grad_norm: 1.0\n"
    "  generation: {max_new_tokens: 6}\n"
    "data:\n"
    "  shuffle: true\n"
    "  train: {dataset_name: arithmetic, seed: 1, arithmetic: {num_examples: 48, max_digits: 2, "
    "prompt_format: \"{}=\"}}\n"
    "  validation: {dataset_name: arithmetic, seed: 2, arithmetic: {num_examples: 8, max_digits: 2, "
    "prompt_format: \"{}=\"}}\n"
    "sft: {max_num_steps: %d, max_num_epochs: 20, val_period: %d, val_at_start: %s, val_at_end: true, "
    "val_batches: 1, val_global_batch_size: 8, val_micro_batch_size: 3, seed: 7, answer_format: \" Answer: {}\"}\n"
    "checkpointing: {checkpoint_dir: \"%s/ckpt\", save_period: 2, keep_top_k: null, metric_name: null}\n"
    "logger: {log_dir: \"%s/logs\"}\n";

typedef struct job {
    char dir[64];
    dsarl_recipe *recipe;
} job;

// The recipe above in a fresh directory, with an optional Hydra-style override.
static void job_open_with(job *j, int steps, int val_period, int val_at_start, const char *const *overrides)
{
    snprintf(j->dir, sizeof j->dir, "/tmp/dsarl_sft_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(j->dir));
    char text[8192];
    snprintf(text, sizeof text, recipe_format, steps, val_period, val_at_start ? "true" : "false", j->dir, j->dir);
    ck_assert_msg(dsarl_recipe_load_string(text, "sft.yaml", &j->recipe, &err) == 0, "%s", err.message);
    for (int i = 0; overrides && overrides[i]; i++)
        ck_assert_msg(dsarl_recipe_override(j->recipe, overrides[i], i, &err) == 0, "%s", err.message);
    ck_assert_int_eq(dsarl_recipe_resolve(j->recipe, &err), 0);
}

static void job_open(job *j, int steps, int val_period, int val_at_start)
{
    job_open_with(j, steps, val_period, val_at_start, NULL);
}

static void job_close(job *j)
{
    dsarl_recipe_free(j->recipe);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", j->dir);
    ck_assert_int_eq(system(cmd), 0);
}

static int job_run_flag(job *j, volatile sig_atomic_t *stop, dsarl_error *e)
{
    dsarl_parallel single = DSARL_PARALLEL_SINGLE;
    dsarl_run_context ctx = {.struct_size = sizeof ctx, .recipe = dsarl_recipe_root(j->recipe),
                             .parallel = &single, .model_ops = &glm5_2_model_ops,
                             .device_ops = &dsarl_cpu_device_ops, .dsa_ops = &dsarl_dsa_reference_ops,
                             .stop_requested = stop};
    return sft_run(&ctx, e);
}

static int job_run(job *j, dsarl_error *e)
{
    return job_run_flag(j, NULL, e);
}

// metrics.jsonl of the job's (single) experiment directory, one JSON object per line.
static json_t *read_metrics(const job *j)
{
    char pattern[128];
    snprintf(pattern, sizeof pattern, "%s/logs/exp_*/metrics.jsonl", j->dir);
    glob_t g;
    ck_assert_int_eq(glob(pattern, 0, NULL, &g), 0);
    ck_assert_int_eq(g.gl_pathc, 1);
    FILE *f = fopen(g.gl_pathv[0], "r");
    ck_assert_ptr_nonnull(f);
    json_t *lines = json_array();
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        ck_assert_msg(o != NULL, "bad metrics line: %s", line);
        json_array_append_new(lines, o);
    }
    fclose(f);
    globfree(&g);
    return lines;
}

static double metric_at(json_t *lines, int64_t step, const char *name)
{
    size_t i;
    json_t *o;
    json_array_foreach(lines, i, o) {
        json_t *s = json_object_get(o, "step"), *v = json_object_get(o, name);
        if (s && json_integer_value(s) == step && v)
            return json_number_value(v);
    }
    return NAN;
}

START_TEST(test_short_run_lowers_loss)
{
    job j;
    job_open(&j, 10, 5, 1);
    ck_assert_msg(job_run(&j, &err) == 0, "%s", err.message);
    json_t *m = read_metrics(&j);
    double first = metric_at(m, 1, "train/loss"), last = metric_at(m, 10, "train/loss");
    double v0 = metric_at(m, 0, "val/loss"), v10 = metric_at(m, 10, "val/loss");
    // random init: the NLL starts near log(260) = 5.56 and must fall clearly
    ck_assert_msg(first > 4.5 && first < 6.5, "first loss %g", first);
    ck_assert_msg(last < first - 1.0, "loss %g -> %g did not fall", first, last);
    ck_assert_msg(v10 < v0 - 1.0, "validation loss %g -> %g did not fall", v0, v10);
    double acc = metric_at(m, 10, "val/accuracy");
    ck_assert(acc >= 0.0 && acc <= 1.0);
    ck_assert(metric_at(m, 3, "train/grad_norm") > 0);
    ck_assert(fabs(metric_at(m, 1, "train/lr") - 1e-3) < 1e-12); // warm-up starts at lr_warmup_init
    json_decref(m);
    char path[128];
    snprintf(path, sizeof path, "%s/ckpt/step_10/policy/weights/model.safetensors", j.dir);
    ck_assert(dsarl_path_exists(path));
    // run again: it resumes at the last step and has nothing left to do
    ck_assert_msg(job_run(&j, &err) == 0, "%s", err.message);
    job_close(&j);
}
END_TEST

// The bytes of a file (malloc'd).
static char *slurp(const char *path, size_t *n)
{
    void *data = NULL;
    ck_assert_msg(dsarl_read_file(path, &data, n, &err) == 0, "%s", err.message);
    return data;
}

static void assert_same_file(const char *a_dir, const char *b_dir, const char *rel)
{
    char a[256], b[256];
    snprintf(a, sizeof a, "%s/%s", a_dir, rel);
    snprintf(b, sizeof b, "%s/%s", b_dir, rel);
    size_t na, nb;
    char *da = slurp(a, &na), *db = slurp(b, &nb);
    ck_assert_msg(na == nb && memcmp(da, db, na) == 0, "%s differs between the uninterrupted and resumed runs", rel);
    free(da), free(db);
}

START_TEST(test_sigkill_resume_bit_identical)
{
    enum { STEPS = 40 }; // long enough that the kill lands well before the end, even on a loaded machine
    job a, b;
    job_open(&a, STEPS, 0, 0);
    ck_assert_msg(job_run(&a, &err) == 0, "%s", err.message);

    job_open(&b, STEPS, 0, 0);
    char step2[128];
    snprintf(step2, sizeof step2, "%s/ckpt/step_2", b.dir);
    fflush(NULL);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        dsarl_error e;
        _exit(job_run(&b, &e) == 0 ? 0 : 1);
    }
    // kill it as soon as its first checkpoint is complete (renamed into place), wherever it is then
    struct timespec nap = {0, 200000};
    for (int i = 0; i < 200000 && !dsarl_path_exists(step2); i++)
        nanosleep(&nap, NULL);
    kill(child, SIGKILL);
    int status = 0;
    ck_assert_int_eq(waitpid(child, &status, 0), child);
    char ckdir[128], latest[512];
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", b.dir);
    int64_t killed_at = -1;
    ck_assert_int_eq(dsarl_checkpoint_find_latest(ckdir, latest, sizeof latest, &killed_at, &err), 0);
    ck_assert_msg(killed_at >= 2 && killed_at < STEPS, "the run was killed at step %lld: nothing left to resume",
                  (long long)killed_at);

    ck_assert_msg(job_run(&b, &err) == 0, "%s", err.message); // resumes from killed_at
    char fa[128], fb[128];
    snprintf(fa, sizeof fa, "%s/ckpt/step_%d", a.dir, STEPS);
    snprintf(fb, sizeof fb, "%s/ckpt/step_%d", b.dir, STEPS);
    assert_same_file(fa, fb, "policy/weights/model.safetensors");
    assert_same_file(fa, fb, "policy/optimizer/optimizer.safetensors");
    dsarl_trainer_state sa, sb;
    ck_assert_int_eq(dsarl_checkpoint_read_state(fa, &sa, &err), 0);
    ck_assert_int_eq(dsarl_checkpoint_read_state(fb, &sb, &err), 0);
    ck_assert_int_eq(sa.consumed_samples, sb.consumed_samples);
    ck_assert_int_eq(sa.loaders[0].state.epoch, sb.loaders[0].state.epoch);
    ck_assert_int_eq(sa.loaders[0].state.cursor, sb.loaders[0].state.cursor);
    double la, lb;
    ck_assert_int_eq(dsarl_trainer_state_get_metric(&sa, "train:loss", &la, &err), 0);
    ck_assert_int_eq(dsarl_trainer_state_get_metric(&sb, "train:loss", &lb, &err), 0);
    ck_assert(la == lb);
    job_close(&a);
    job_close(&b);
}
END_TEST

START_TEST(test_greedy_batched_equals_one_at_a_time)
{
    job j;
    job_open(&j, 1, 0, 0);
    const dsarl_node *root = dsarl_recipe_root(j.recipe);
    dsarl_device *dev = NULL;
    dsarl_dsa_context *dsa = NULL;
    dsarl_model *model = NULL;
    const dsarl_model_ops *ops = &glm5_2_model_ops;
    dsarl_device_config dc = {.struct_size = sizeof dc, .threads = 1};
    ck_assert_int_eq(cpu_create(&dc, &dev, &err), 0);
    ck_assert_int_eq(dsarl_dsa_reference_ops.create(&dsarl_cpu_device_ops, dev, root, &dsa, &err), 0);
    dsarl_model_config mc = {.struct_size = sizeof mc, .recipe = root, .device_ops = &dsarl_cpu_device_ops,
                             .device = dev, .dsa_ops = &dsarl_dsa_reference_ops, .dsa = dsa, .seed = 3};
    ck_assert_msg(ops->create(&mc, &model, &err) == 0, "%s", err.message);
    dsarl_tokenizer *tok = NULL;
    ck_assert_int_eq(dsarl_tokenizer_load("byte", &tok, &err), 0);
    // prompts of different lengths, so the packed batch has ragged sequences that finish at different steps
    static const char *const prompts[] = {"1+2=", "What is 13-4?", "9=", "A longer prompt: 7+8 equals", "0-0"};
    enum { N = 5, MAX_NEW = 7 };
    sft_sample samples[N];
    dsarl_chat_message msg[N];
    for (int i = 0; i < N; i++) {
        msg[i] = (dsarl_chat_message){"user", prompts[i]};
        dsarl_example ex = {.messages = &msg[i], .n_messages = 1, .ground_truth = "3"};
        ck_assert_int_eq(sft_build_sample(tok, "plain", " Answer: {}", &ex, 64, &samples[i], &err), 0);
    }
    char *texts[N];
    ck_assert_msg(sft_greedy_complete(ops, model, tok, samples, N, MAX_NEW, texts, &err) == 0, "%s", err.message);
    // reference: each prompt alone, one forward per new token, argmax by hand
    int64_t V = ops->vocab_size(model);
    for (int i = 0; i < N; i++) {
        int32_t seq[128], cu[2] = {0, 0}, out[MAX_NEW];
        int n_out = 0, len = samples[i].prompt_len;
        memcpy(seq, samples[i].tokens, sizeof(int32_t) * (size_t)len);
        float *logits = malloc(sizeof(float) * 128 * (size_t)V);
        for (int k = 0; k < MAX_NEW; k++) {
            cu[1] = len;
            dsarl_token_batch b = {.struct_size = sizeof b, .n_tokens = len, .n_sequences = 1, .tokens = seq,
                                   .cu_seqlens = cu};
            ck_assert_int_eq(ops->forward_logits(model, &b, logits, &err), 0);
            const float *row = logits + (int64_t)(len - 1) * V;
            int32_t best = 0;
            for (int32_t v = 1; v < V; v++)
                best = row[v] > row[best] ? v : best;
            seq[len++] = best;
            if (best == DSARL_BYTE_TOKENIZER_EOS)
                break;
            out[n_out++] = best;
        }
        free(logits);
        char *want = NULL;
        ck_assert_int_eq(dsarl_tokenizer_decode(tok, out, (size_t)n_out, 1, &want, NULL, &err), 0);
        ck_assert_msg(strcmp(texts[i], want) == 0, "sample %d: batched \"%s\", alone \"%s\"", i, texts[i], want);
        ck_assert_int_eq(sft_answer_matches(texts[i], want), 1);
        free(want);
        free(texts[i]);
        sft_sample_free(&samples[i]);
    }
    ck_assert_int_eq(sft_answer_matches(" Answer: 7\n", "Answer: 7"), 1);
    ck_assert_int_eq(sft_answer_matches("Answer: 7", "Answer: 77"), 0);
    ck_assert_int_eq(sft_answer_matches("Answer:7", "Answer: 7"), 0);
    ck_assert_int_eq(sft_answer_matches("  ", ""), 1);
    dsarl_tokenizer_free(tok);
    ops->destroy(model);
    dsarl_dsa_reference_ops.destroy(dsa);
    cpu_destroy(dev);
    job_close(&j);
}
END_TEST

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

START_TEST(test_stop_and_deadline_save_then_stop)
{
    // a stop request (SIGINT/SIGTERM in dsarl run) finishes the step, saves it and returns cleanly
    job j;
    job_open(&j, 50, 0, 0);
    volatile sig_atomic_t stop = 1;
    ck_assert_msg(job_run_flag(&j, &stop, &err) == 0, "%s", err.message);
    char ckdir[128], latest[512];
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", j.dir);
    int64_t step = -1;
    ck_assert_int_eq(dsarl_checkpoint_find_latest(ckdir, latest, sizeof latest, &step, &err), 0);
    ck_assert_int_eq(step, 1); // step 1 is not a save_period multiple: saved because of the stop
    job_close(&j);

    // checkpoint_must_save_by one second after the start: the run saves and stops before it
    static const char *const deadline[] = {"++checkpointing.checkpoint_must_save_by=\"00:00:00:01\"",
                                           "sft.max_num_epochs=100000", NULL};
    job_open_with(&j, 1000000, 0, 0, deadline);
    double t0 = wall_s();
    ck_assert_msg(job_run(&j, &err) == 0, "%s", err.message);
    double took = wall_s() - t0;
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", j.dir);
    ck_assert_int_eq(dsarl_checkpoint_find_latest(ckdir, latest, sizeof latest, &step, &err), 0);
    ck_assert_msg(step >= 1 && step < 1000000, "saved step %lld", (long long)step);
    // it stops when one more (slowest-so-far) step would cross the deadline; slack for a loaded machine
    ck_assert_msg(took < 1.5, "the run took %.2f s, past its 1 s deadline", took);
    job_close(&j);
}
END_TEST

/* ------------------------------------------------------------------------------------------------------------
 * Recipe checks. */

static int config_from(const char *yaml, sft_config *cfg, dsarl_recipe **r)
{
    ck_assert_int_eq(dsarl_recipe_load_string(yaml, "bad.yaml", r, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(*r, &err), 0);
    return sft_config_from_recipe(dsarl_recipe_root(*r), cfg, &err);
}

START_TEST(test_recipe_values)
{
    sft_config cfg;
    dsarl_recipe *r = NULL;
    ck_assert_int_eq(config_from("policy: {tokenizer: {name: byte}}\n", &cfg, &r), 0);
    // NeMo RL's sft.yaml defaults
    ck_assert(cfg.max_num_steps == 60 && cfg.max_num_epochs == 1 && cfg.val_period == 10 && cfg.val_batches == 8 &&
              cfg.val_global_batch_size == 32 && cfg.val_micro_batch_size == 1 && cfg.val_at_start &&
              cfg.seed == 42);
    ck_assert(cfg.lr_schedule.decay_iters == 60 && cfg.lr_schedule.max_grad_norm == 1.0);
    dsarl_recipe_free(r);
    static const struct {
        const char *yaml, *where;
    } bad[] = {
        {"policy: {tokenizer: {name: byte}}\nsft: {max_num_steps: 0}\n", "bad.yaml:2:22: recipe key sft.max_num_steps"},
        {"policy: {tokenizer: {name: byte}, train_global_batch_size: 10, train_micro_batch_size: 4}\n",
         "recipe key policy.train_micro_batch_size"},
        {"policy: {tokenizer: {name: byte}}\nsft: {answer_format: \"Answer:\"}\n", "recipe key sft.answer_format"},
        {"policy: {tokenizer: {name: byte}}\nsft: {val_global_batch_size: 4, val_micro_batch_size: 8}\n",
         "recipe key sft.val_micro_batch_size"},
        {"policy: {tokenizer: {name: byte}, megatron_cfg: {optimizer: {lr: 1.0e-3, min_lr: 1.0e-2}}}\n",
         "recipe key policy.megatron_cfg.optimizer.min_lr"},
        {"sft: {seed: 1}\n", "recipe key policy.tokenizer.name"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_ne(config_from(bad[i].yaml, &cfg, &r), 0);
        ck_assert_msg(strstr(err.message, bad[i].where), "case %zu: %s", i, err.message);
        dsarl_recipe_free(r);
    }
    size_t n = 0;
    const dsarl_key_spec *keys = NULL;
    ck_assert_int_eq(sft_recipe_keys(&keys, &n, &err), 0);
    int owned = 0, ckpt = 0;
    for (size_t i = 0; i < n; i++) {
        owned += strcmp(keys[i].path, "sft") == 0 && (keys[i].flags & DSARL_KEY_OWNED);
        ckpt += strcmp(keys[i].path, "checkpointing.save_period") == 0;
    }
    ck_assert(owned == 1 && ckpt == 1);
}
END_TEST

static Suite *sft_suite(void)
{
    Suite *s = suite_create("sft");
    TCase *tc = tcase_create("sft");
    tcase_add_test(tc, test_sample_tokens_and_targets);
    tcase_add_test(tc, test_greedy_batched_equals_one_at_a_time);
    tcase_add_test(tc, test_short_run_lowers_loss);
    tcase_add_test(tc, test_sigkill_resume_bit_identical);
    tcase_add_test(tc, test_stop_and_deadline_save_then_stop);
    tcase_add_test(tc, test_recipe_values);
    tcase_set_timeout(tc, 240);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(sft_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
