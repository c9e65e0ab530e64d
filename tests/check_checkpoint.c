/* check_checkpoint.c: step_N checkpoints of a tiny GLM-5.2: a bit-exact round trip (weights, AdamW state, trainer
 * state) that resumes training identically; a flipped byte, a truncated file, a deleted manifest and a leftover
 * tmp_step_N each detected, skipped with one log line naming the file and never loaded; keep_top_k by metric;
 * CRC-32 against its check value; save_period, the DD:HH:MM:SS deadline and bad recipe values refused with the
 * key's location. */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cpu_device.h"
#include "cpu_model_fixture.h"
#include "dsa_reference.h"
#include "dsarl/checkpoint.h"
#include "dsarl/fileutil.h"
#include "dsarl/rng.h"
#include "glm5_ops.h"
#include "recipe_internal.h"

static dsarl_error err;

static const char *recipe_text =
    "policy:\n"
    "  model_config:\n"
    "    vocab_size: 40\n    hidden_size: 16\n    intermediate_size: 24\n    moe_intermediate_size: 6\n"
    "    num_hidden_layers: 2\n    num_attention_heads: 2\n    num_key_value_heads: 2\n    q_lora_rank: 12\n"
    "    kv_lora_rank: 8\n    qk_nope_head_dim: 4\n    qk_rope_head_dim: 4\n    v_head_dim: 6\n"
    "    n_routed_experts: 4\n    num_experts_per_tok: 2\n    n_group: 2\n    topk_group: 2\n    index_topk: 3\n"
    "    index_head_dim: 8\n    index_n_heads: 2\n    first_k_dense_replace: 1\n"
    "    n_shared_experts: 1\n    initializer_range: 0.2\n";

typedef cpu_model_fixture fixture;

static const dsarl_model_ops *ops = &glm5_2_model_ops;

static void fixture_open(fixture *f, uint64_t seed)
{
    cpu_model_fixture_open(f, ops, recipe_text, "ckpt.yaml", seed);
}

static void fixture_close(fixture *f) { cpu_model_fixture_close(f); }

// One optimizer step on a random linear function of the log-probs of random tokens from rng.
static void train_step(fixture *f, dsarl_rng *rng)
{
    enum { T = 7 };
    int32_t tokens[T], targets[T], cu[2] = {0, T};
    float dlp[T];
    for (int t = 0; t < T; t++) {
        tokens[t] = (int32_t)dsarl_rng_below(rng, 40);
        targets[t] = (int32_t)dsarl_rng_below(rng, 40);
        dlp[t] = dsarl_rng_uniform(rng) - 0.5f;
    }
    dsarl_token_batch b = {.struct_size = sizeof b, .n_tokens = T, .n_sequences = 1, .tokens = tokens,
                           .cu_seqlens = cu};
    ck_assert_int_eq(ops->zero_grad(f->model, &err), 0);
    ck_assert_msg(ops->backward(f->model, &b, targets, dlp, NULL, &err) == 0, "%s", err.message);
    dsarl_optimizer_params hp = {.struct_size = sizeof hp, .lr = 1e-2, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8,
                                 .weight_decay = 0.01, .grad_scale = 0.7};
    ck_assert_int_eq(ops->optimizer_step(f->model, &hp, &err), 0);
}

// Every parameter and buffer as one flat host array (malloc'd).
static float *flat_weights(fixture *f, int64_t *total)
{
    int64_t n = ops->parameter_tensors(f->model), sum = 0;
    int64_t numel[64];
    ck_assert_int_le(n, 64);
    for (int64_t i = 0; i < n; i++) {
        int32_t ndim;
        int64_t shape[3];
        ck_assert_int_eq(ops->parameter_info(f->model, i, NULL, &ndim, shape, NULL, &err), 0);
        numel[i] = shape[0] * (ndim > 1 ? shape[1] : 1) * (ndim > 2 ? shape[2] : 1);
        sum += numel[i];
    }
    float *all = malloc((size_t)sum * sizeof(float));
    for (int64_t i = 0, off = 0; i < n; off += numel[i], i++)
        ck_assert_int_eq(ops->read_parameter(f->model, i, all + off, NULL, &err), 0);
    *total = sum;
    return all;
}

static void make_temp_dir(char *dir, size_t size)
{
    snprintf(dir, size, "/tmp/dsarl_ckpt_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void remove_dir(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static dsarl_checkpoint_config config_for(const char *dir)
{
    dsarl_checkpoint_config c = {.enabled = true, .checkpoint_dir = dir, .save_period = 1, .keep_top_k = -1,
                                 .metric_name = NULL, .higher_is_better = true, .save_optimizer = true,
                                 .must_save_by_s = -1};
    return c;
}

static dsarl_trainer_state sample_state(int64_t step)
{
    dsarl_trainer_state st;
    memset(&st, 0, sizeof st);
    st.step = step;
    st.consumed_samples = 64 * step + 3;
    st.total_train_time_s = 12.345678901234567 * (double)step;
    dsarl_rng r;
    dsarl_rng_init(&r, 0xFFFFFFFFFFFFFFF1ull, 7); // a seed above INT64_MAX must survive JSON
    dsarl_rng_skip(&r, 1000003 + (uint64_t)step);
    ck_assert_int_eq(dsarl_trainer_state_set_rng(&st, "sampling", dsarl_rng_get_state(&r), &err), 0);
    dsarl_rng_init(&r, 42, 0);
    ck_assert_int_eq(dsarl_trainer_state_set_rng(&st, "data", dsarl_rng_get_state(&r), &err), 0);
    dsarl_dataloader_state ls = {.epoch = 2, .cursor = 17 + step};
    ck_assert_int_eq(dsarl_trainer_state_set_loader(&st, "train", ls, &err), 0);
    ck_assert_int_eq(dsarl_trainer_state_set_metric(&st, "train:loss", 1.0 / 3.0 + (double)step, &err), 0);
    ck_assert_int_eq(dsarl_trainer_state_set_metric(&st, "val:accuracy", 0.1 * (double)step, &err), 0);
    return st;
}

static void assert_state_equal(const dsarl_trainer_state *a, const dsarl_trainer_state *b)
{
    ck_assert_int_eq(a->step, b->step);
    ck_assert_int_eq(a->consumed_samples, b->consumed_samples);
    ck_assert(a->total_train_time_s == b->total_train_time_s);
    ck_assert_int_eq(a->n_rngs, b->n_rngs);
    ck_assert_int_eq(a->n_loaders, b->n_loaders);
    ck_assert_int_eq(a->n_metrics, b->n_metrics);
    for (int i = 0; i < a->n_rngs; i++) {
        dsarl_rng_state s;
        ck_assert_int_eq(dsarl_trainer_state_get_rng(b, a->rngs[i].name, &s, &err), 0);
        ck_assert(s.seed == a->rngs[i].state.seed && s.stream == a->rngs[i].state.stream &&
                  s.offset == a->rngs[i].state.offset);
    }
    for (int i = 0; i < a->n_loaders; i++) {
        dsarl_dataloader_state s;
        ck_assert_int_eq(dsarl_trainer_state_get_loader(b, a->loaders[i].name, &s, &err), 0);
        ck_assert(s.epoch == a->loaders[i].state.epoch && s.cursor == a->loaders[i].state.cursor);
    }
    for (int i = 0; i < a->n_metrics; i++) {
        double v;
        ck_assert_int_eq(dsarl_trainer_state_get_metric(b, a->metrics[i].name, &v, &err), 0);
        ck_assert(v == a->metrics[i].value);
    }
}

START_TEST(test_round_trip_bit_exact_and_resume)
{
    char dir[64];
    make_temp_dir(dir, sizeof dir);
    dsarl_checkpoint_config cfg = config_for(dir);
    fixture a, b;
    fixture_open(&a, 31);
    dsarl_rng rng;
    dsarl_rng_init(&rng, 8, 0);
    for (int s = 0; s < 3; s++)
        train_step(&a, &rng);
    dsarl_trainer_state st = sample_state(3);
    char saved[512];
    ck_assert_msg(dsarl_checkpoint_save(&cfg, ops, a.model, &st, dsarl_recipe_root(a.recipe), saved, sizeof saved,
                                        &err) == 0, "%s", err.message);
    char want[128];
    snprintf(want, sizeof want, "%s/step_3", dir);
    ck_assert_str_eq(saved, want);
    char path[600];
    static const char *const files[] = {"policy/weights/config.json", "policy/weights/model.safetensors",
                                        "policy/optimizer/optimizer.safetensors", "training_info.json",
                                        "config.yaml", "manifest.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", saved, files[i]);
        ck_assert_msg(dsarl_path_exists(path), "%s missing", path);
    }
    snprintf(path, sizeof path, "%s/tmp_step_3", dir);
    ck_assert(!dsarl_path_exists(path));

    char found[512];
    int64_t step = 0;
    ck_assert_int_eq(dsarl_checkpoint_find_latest(dir, found, sizeof found, &step, &err), 0);
    ck_assert_int_eq(step, 3);
    ck_assert_str_eq(found, saved);
    fixture_open(&b, 77); // another init: everything must come from the checkpoint
    dsarl_trainer_state loaded;
    ck_assert_msg(dsarl_checkpoint_load(found, ops, b.model, &loaded, &err) == 0, "%s", err.message);
    assert_state_equal(&st, &loaded);
    ck_assert_int_eq(ops->optimizer_steps(b.model), 3);
    int64_t na, nb;
    float *wa = flat_weights(&a, &na), *wb = flat_weights(&b, &nb);
    ck_assert_int_eq(na, nb);
    ck_assert_msg(memcmp(wa, wb, (size_t)na * sizeof(float)) == 0, "loaded weights differ from the saved ones");
    free(wa), free(wb);
    // both continue identically
    dsarl_rng rng_b = rng;
    for (int s = 0; s < 2; s++) {
        train_step(&a, &rng);
        train_step(&b, &rng_b);
    }
    wa = flat_weights(&a, &na), wb = flat_weights(&b, &nb);
    ck_assert_msg(memcmp(wa, wb, (size_t)na * sizeof(float)) == 0, "resumed training differs");
    free(wa), free(wb);
    fixture_close(&a);
    fixture_close(&b);
    remove_dir(dir);
}
END_TEST

// Runs find_latest with stderr captured into log (size bytes).
static int64_t find_latest_logged(const char *dir, char *log, size_t size)
{
    char logpath[] = "/tmp/dsarl_ckpt_log_XXXXXX";
    int fd = mkstemp(logpath);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    char found[512];
    int64_t step = -2;
    int rc = dsarl_checkpoint_find_latest(dir, found, sizeof found, &step, &err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ck_assert_int_eq(rc, 0);
    lseek(fd, 0, SEEK_SET);
    ssize_t got = read(fd, log, size - 1);
    log[got > 0 ? got : 0] = '\0';
    close(fd);
    unlink(logpath);
    return step;
}

static void flip_byte(const char *path, long offset)
{
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, offset, SEEK_SET), 0);
    int c = fgetc(f);
    ck_assert_int_ne(c, EOF);
    ck_assert_int_eq(fseek(f, offset, SEEK_SET), 0);
    fputc(c ^ 0x20, f);
    fclose(f);
}

/* dsarl_checkpoint_resume: nothing to resume in an empty directory (step -1, loader untouched); after a save, the
 * newest step's weights, trainer state and "train" loader position come back. */
START_TEST(test_resume_restores_model_state_and_loader)
{
    char dir[64], step_dir[512], want[128];
    make_temp_dir(dir, sizeof dir);
    dsarl_checkpoint_config cfg = config_for(dir);
    dsarl_arithmetic_config ac;
    dsarl_arithmetic_config_default(&ac);
    dsarl_dataset *ds;
    ck_assert_msg(dsarl_dataset_arithmetic(&ac, DSARL_SPLIT_TRAIN, &ds, &err) == 0, "%s", err.message);
    dsarl_dataloader *dl;
    ck_assert_int_eq(dsarl_dataloader_create(ds, 4, 1, 1, 5, &dl, &err), 0);
    fixture a, b;
    fixture_open(&a, 31);
    fixture_open(&b, 77);
    dsarl_trainer_state got;
    ck_assert_msg(dsarl_checkpoint_resume(dir, ops, b.model, dl, &got, step_dir, sizeof step_dir, &err) == 0, "%s",
                  err.message);
    ck_assert_int_eq(got.step, -1);
    ck_assert_int_eq(dsarl_dataloader_get_state(dl).epoch, 0);
    ck_assert_int_eq(dsarl_dataloader_get_state(dl).cursor, 0);

    dsarl_rng rng;
    dsarl_rng_init(&rng, 8, 0);
    train_step(&a, &rng);
    dsarl_trainer_state st = sample_state(1);
    ck_assert_int_eq(dsarl_checkpoint_save(&cfg, ops, a.model, &st, NULL, NULL, 0, &err), 0);
    ck_assert_msg(dsarl_checkpoint_resume(dir, ops, b.model, dl, &got, step_dir, sizeof step_dir, &err) == 0, "%s",
                  err.message);
    snprintf(want, sizeof want, "%s/step_1", dir);
    ck_assert_str_eq(step_dir, want);
    assert_state_equal(&st, &got);
    dsarl_dataloader_state pos = dsarl_dataloader_get_state(dl);
    ck_assert_int_eq(pos.epoch, 2);
    ck_assert_int_eq(pos.cursor, 18);
    int64_t na, nb;
    float *wa = flat_weights(&a, &na), *wb = flat_weights(&b, &nb);
    ck_assert_int_eq(na, nb);
    ck_assert_msg(memcmp(wa, wb, (size_t)na * sizeof(float)) == 0, "resumed weights differ from the saved ones");
    free(wa), free(wb);
    fixture_close(&a);
    fixture_close(&b);
    dsarl_dataloader_free(dl);
    dsarl_dataset_free(ds);
    remove_dir(dir);
}
END_TEST

START_TEST(test_damaged_checkpoints_skipped)
{
    char dir[64];
    make_temp_dir(dir, sizeof dir);
    dsarl_checkpoint_config cfg = config_for(dir);
    fixture a;
    fixture_open(&a, 3);
    dsarl_rng rng;
    dsarl_rng_init(&rng, 1, 0);
    for (int64_t s = 1; s <= 4; s++) {
        train_step(&a, &rng);
        dsarl_trainer_state st = sample_state(s);
        ck_assert_msg(dsarl_checkpoint_save(&cfg, ops, a.model, &st, NULL, NULL, 0, &err) == 0, "%s", err.message);
    }
    char path[600], log[4096];
    // a leftover tmp_step_5 (a save killed before its rename) is never taken
    snprintf(path, sizeof path, "%s/tmp_step_5", dir);
    ck_assert_int_eq(dsarl_mkdir_p(path, &err), 0);
    ck_assert_int_eq(find_latest_logged(dir, log, sizeof log), 4);
    ck_assert_msg(strstr(log, "tmp_step_5") && strstr(log, "unfinished"), "log: %s", log);

    // step 4: one byte of the weights flipped deep in the data
    snprintf(path, sizeof path, "%s/step_4/policy/weights/model.safetensors", dir);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    flip_byte(path, (long)sb.st_size - 5);
    ck_assert_int_eq(find_latest_logged(dir, log, sizeof log), 3);
    ck_assert_msg(strstr(log, "step_4/policy/weights/model.safetensors") && strstr(log, "CRC-32"), "log: %s", log);
    // and loading it directly is refused before anything is touched
    int64_t n0, n1;
    float *before = flat_weights(&a, &n0);
    snprintf(path, sizeof path, "%s/step_4", dir);
    dsarl_trainer_state st;
    ck_assert_int_ne(dsarl_checkpoint_load(path, ops, a.model, &st, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.message, "corrupt"));
    float *after = flat_weights(&a, &n1);
    ck_assert_int_eq(memcmp(before, after, (size_t)n0 * sizeof(float)), 0);
    free(before), free(after);

    // step 3: the optimizer state truncated
    snprintf(path, sizeof path, "%s/step_3/policy/optimizer/optimizer.safetensors", dir);
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_int_eq(truncate(path, sb.st_size / 2), 0);
    ck_assert_int_eq(find_latest_logged(dir, log, sizeof log), 2);
    ck_assert_msg(strstr(log, "step_3/policy/optimizer/optimizer.safetensors") && strstr(log, "truncated"), "log: %s",
                  log);

    // step 2: no manifest (the save died before its last file)
    snprintf(path, sizeof path, "%s/step_2/manifest.json", dir);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(find_latest_logged(dir, log, sizeof log), 1);
    ck_assert_msg(strstr(log, "step_2/manifest.json") && strstr(log, "missing"), "log: %s", log);

    // step 1: a listed file deleted
    snprintf(path, sizeof path, "%s/step_1/training_info.json", dir);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(find_latest_logged(dir, log, sizeof log), -1);
    ck_assert_msg(strstr(log, "step_1/training_info.json") && strstr(log, "missing"), "log: %s", log);

    // no directory at all: nothing to resume, not an error
    char found[64];
    int64_t step = 0;
    ck_assert_int_eq(dsarl_checkpoint_find_latest("/tmp/dsarl_no_such_dir_xyz", found, sizeof found, &step, &err), 0);
    ck_assert_int_eq(step, -1);
    // a re-save of a step replaces the damaged one and the stale tmp_step
    dsarl_trainer_state st5 = sample_state(5);
    ck_assert_int_eq(dsarl_checkpoint_save(&cfg, ops, a.model, &st5, NULL, NULL, 0, &err), 0);
    snprintf(path, sizeof path, "%s/tmp_step_5", dir);
    ck_assert(!dsarl_path_exists(path));
    ck_assert_int_eq(find_latest_logged(dir, log, sizeof log), 5);
    fixture_close(&a);
    remove_dir(dir);
}
END_TEST

// The steps present under dir, as a bit set.
static unsigned steps_present(const char *dir)
{
    unsigned mask = 0;
    char path[600];
    for (int s = 0; s < 16; s++) {
        snprintf(path, sizeof path, "%s/step_%d", dir, s);
        if (dsarl_path_exists(path))
            mask |= 1u << s;
    }
    return mask;
}

START_TEST(test_keep_top_k)
{
    fixture a;
    fixture_open(&a, 4);
    static const double accuracy[6] = {0, 0.5, 0.9, 0.1, 0.7, 0.2};
    static const struct {
        const char *metric;
        bool higher;
        unsigned expect; /* steps kept after saving 1..5 */
    } cases[] = {
        {"val:accuracy", true, (1u << 2) | (1u << 4) | (1u << 5)}, // best two plus the newest
        {"val:accuracy", false, (1u << 3) | (1u << 5)},            // 0.1 and 0.2: the newest is one of them
        {NULL, true, (1u << 4) | (1u << 5)},                       // no metric: the newest two
        {"train:loss", true, (1u << 4) | (1u << 5)},               // a metric no step has: by step
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char dir[64];
        make_temp_dir(dir, sizeof dir);
        dsarl_checkpoint_config cfg = config_for(dir);
        cfg.keep_top_k = 2;
        cfg.metric_name = cases[c].metric;
        cfg.higher_is_better = cases[c].higher;
        for (int64_t s = 1; s <= 5; s++) {
            dsarl_trainer_state st;
            memset(&st, 0, sizeof st);
            st.step = s;
            ck_assert_int_eq(dsarl_trainer_state_set_metric(&st, "val:accuracy", accuracy[s], &err), 0);
            ck_assert_msg(dsarl_checkpoint_save(&cfg, ops, a.model, &st, NULL, NULL, 0, &err) == 0, "%s",
                          err.message);
        }
        ck_assert_msg(steps_present(dir) == cases[c].expect, "case %zu: kept 0x%x, expected 0x%x", c,
                      steps_present(dir), cases[c].expect);
        remove_dir(dir);
    }
    fixture_close(&a);
}
END_TEST

START_TEST(test_crc32_and_schedule)
{
    ck_assert_uint_eq(dsarl_crc32(0, "123456789", 9), 0xCBF43926u); // the CRC-32 check value
    ck_assert_uint_eq(dsarl_crc32(0, "", 0), 0u);
    unsigned char buf[1000];
    dsarl_rng rng;
    dsarl_rng_init(&rng, 5, 5);
    for (int i = 0; i < 1000; i++)
        buf[i] = (unsigned char)dsarl_rng_below(&rng, 256);
    ck_assert_uint_eq(dsarl_crc32(dsarl_crc32(0, buf, 377), buf + 377, 623), dsarl_crc32(0, buf, 1000));
    // bitwise definition, one bit at a time
    uint32_t c = 0xFFFFFFFFu;
    for (int i = 0; i < 1000; i++) {
        c ^= buf[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    ck_assert_uint_eq(dsarl_crc32(0, buf, 1000), ~c);

    dsarl_checkpoint_config cfg = config_for("x");
    cfg.save_period = 3;
    ck_assert(!dsarl_checkpoint_due(&cfg, 1, false) && !dsarl_checkpoint_due(&cfg, 2, false));
    ck_assert(dsarl_checkpoint_due(&cfg, 3, false) && dsarl_checkpoint_due(&cfg, 6, false));
    ck_assert(dsarl_checkpoint_due(&cfg, 7, true));
    cfg.enabled = false;
    ck_assert(!dsarl_checkpoint_due(&cfg, 3, true));
    ck_assert(!dsarl_checkpoint_deadline_near(&cfg, 1e9, 1e9)); // no deadline
    cfg.must_save_by_s = 100;
    ck_assert(!dsarl_checkpoint_deadline_near(&cfg, 80, 19.5));
    ck_assert(dsarl_checkpoint_deadline_near(&cfg, 80, 20.5));
}
END_TEST

static dsarl_recipe *last_recipe; // the config borrows its strings: freed at the next call

static int config_from(const char *yaml, dsarl_checkpoint_config *cfg)
{
    dsarl_recipe_free(last_recipe);
    last_recipe = NULL;
    ck_assert_int_eq(dsarl_recipe_load_string(yaml, "ck.yaml", &last_recipe, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(last_recipe, &err), 0);
    return dsarl_checkpoint_config_from_recipe(dsarl_recipe_root(last_recipe), cfg, &err);
}

START_TEST(test_deadline_and_recipe_values)
{
    double s = 0;
    ck_assert_int_eq(dsarl_parse_duration("00:03:45:00", "x", &s, &err), 0);
    ck_assert(s == 3 * 3600 + 45 * 60);
    ck_assert_int_eq(dsarl_parse_duration("2:23:59:59", "x", &s, &err), 0);
    ck_assert(s == 2 * 86400 + 23 * 3600 + 59 * 60 + 59);
    static const char *const bad[] = {"03:45:00", "00:24:00:00", "00:00:60:00", "00:00:00:60", "a:b:c:d",
                                      "00:00:00:00", "", "1:2:3:4:5", "-1:00:00:00", "00:01:00:00 "};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(dsarl_parse_duration(bad[i], "x", &s, &err) != 0, "\"%s\" accepted", bad[i]);
        ck_assert_ptr_nonnull(strstr(err.message, "DD:HH:MM:SS"));
    }
    dsarl_checkpoint_config cfg;
    ck_assert_int_eq(config_from("checkpointing:\n  checkpoint_dir: out/ck\n  keep_top_k: 2\n  save_period: 5\n"
                                 "  metric_name: \"train:loss\"\n  higher_is_better: false\n"
                                 "  checkpoint_must_save_by: \"00:01:00:30\"\n", &cfg), 0);
    ck_assert_str_eq(cfg.checkpoint_dir, "out/ck");
    ck_assert(cfg.keep_top_k == 2 && cfg.save_period == 5 && !cfg.higher_is_better && cfg.must_save_by_s == 3630);
    ck_assert_str_eq(cfg.metric_name, "train:loss");
    ck_assert_int_eq(config_from("checkpointing:\n  keep_top_k: null\n", &cfg), 0);
    ck_assert(cfg.keep_top_k == -1 && cfg.must_save_by_s < 0 && cfg.enabled && cfg.save_optimizer);
    static const struct {
        const char *yaml, *key;
    } refused[] = {
        {"checkpointing:\n  checkpoint_must_save_by: \"3:45:00\"\n", "ck.yaml:2:28: recipe key "
                                                                     "checkpointing.checkpoint_must_save_by"},
        {"checkpointing:\n  keep_top_k: 0\n", "ck.yaml:2:15: recipe key checkpointing.keep_top_k"},
        {"checkpointing:\n  save_period: -2\n", "ck.yaml:2:16: recipe key checkpointing.save_period"},
        {"checkpointing:\n  metric_name: accuracy\n", "ck.yaml:2:16: recipe key checkpointing.metric_name"},
        {"checkpointing:\n  model_save_format: torch_save\n", "checkpointing.model_save_format"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        ck_assert_int_ne(config_from(refused[i].yaml, &cfg), 0);
        ck_assert_msg(strstr(err.message, refused[i].key), "got: %s", err.message);
    }
    size_t n = 0;
    const dsarl_key_spec *keys = dsarl_checkpoint_keys(&n);
    ck_assert_int_gt(n, 8);
    ck_assert_str_eq(keys[0].path, "checkpointing");
    dsarl_recipe_free(last_recipe);
    last_recipe = NULL;
}
END_TEST

// Entries of dir whose name starts with prefix.
static int count_prefixed(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

/* checkpointing.on_corrupt: a corrupt newest with an older good one stops under fail (naming it and why, nothing
 * moved), falls back under fallback (moved aside to step_N.corrupt-<time> only when asked to move, never removed);
 * with none good, fallback stops naming each and restart starts over with every corrupt one moved aside. */
START_TEST(test_on_corrupt_policies)
{
    char dir[64];
    make_temp_dir(dir, sizeof dir);
    dsarl_checkpoint_config cfg = config_for(dir);
    fixture a;
    fixture_open(&a, 5);
    dsarl_rng rng;
    dsarl_rng_init(&rng, 2, 0);
    for (int64_t s = 1; s <= 3; s++) {
        train_step(&a, &rng);
        dsarl_trainer_state st = sample_state(s);
        ck_assert_msg(dsarl_checkpoint_save(&cfg, ops, a.model, &st, NULL, NULL, 0, &err) == 0, "%s", err.message);
    }
    fixture_close(&a);
    char path[600], found[600];
    int64_t step = 0;
    struct stat sb;
    snprintf(path, sizeof path, "%s/step_3/policy/weights/model.safetensors", dir);
    ck_assert_int_eq(stat(path, &sb), 0);
    flip_byte(path, (long)sb.st_size / 2);
    ck_assert_int_eq(dsarl_checkpoint_choose(dir, DSARL_CHECKPOINT_ON_CORRUPT_FAIL, true, found, sizeof found, &step,
                                             &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "step_3: ") && strstr(err.message, "CRC-32") &&
                  strstr(err.message, "on_corrupt=fallback"), "%s", err.message);
    ck_assert_int_eq(count_prefixed(dir, "step_3"), 1);
    ck_assert_int_eq(dsarl_checkpoint_choose(dir, DSARL_CHECKPOINT_ON_CORRUPT_FALLBACK, false, found, sizeof found,
                                             &step, &err), 0);
    ck_assert_int_eq(step, 2);
    ck_assert_int_eq(count_prefixed(dir, "step_3.corrupt-"), 0); // another rank: it chooses, rank 0 moves
    ck_assert_int_eq(dsarl_checkpoint_choose(dir, DSARL_CHECKPOINT_ON_CORRUPT_FALLBACK, true, found, sizeof found,
                                             &step, &err), 0);
    ck_assert_int_eq(step, 2);
    snprintf(path, sizeof path, "%s/step_2", dir);
    ck_assert_str_eq(found, path);
    ck_assert_int_eq(count_prefixed(dir, "step_3.corrupt-"), 1);
    snprintf(path, sizeof path, "%s/step_3", dir);
    ck_assert(!dsarl_path_exists(path));
    // none good: the two left lose their manifests
    for (int s = 1; s <= 2; s++) {
        snprintf(path, sizeof path, "%s/step_%d/manifest.json", dir, s);
        ck_assert_int_eq(unlink(path), 0);
    }
    ck_assert_int_eq(dsarl_checkpoint_choose(dir, DSARL_CHECKPOINT_ON_CORRUPT_FALLBACK, true, found, sizeof found,
                                             &step, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "none of its 2 checkpoints verifies") && strstr(err.message, "step_2: ") &&
                  strstr(err.message, "step_1: ") && strstr(err.message, "on_corrupt=restart"), "%s", err.message);
    ck_assert_int_eq(count_prefixed(dir, "step_2"), 1);
    ck_assert_int_eq(dsarl_checkpoint_choose(dir, DSARL_CHECKPOINT_ON_CORRUPT_RESTART, true, found, sizeof found,
                                             &step, &err), 0);
    ck_assert_int_eq(step, -1);
    ck_assert_int_eq(count_prefixed(dir, "step_1.corrupt-") + count_prefixed(dir, "step_2.corrupt-"), 2);
    ck_assert_int_eq(count_prefixed(dir, "step_") - count_prefixed(dir, "step_1.") - count_prefixed(dir, "step_2.") -
                     count_prefixed(dir, "step_3."), 0);
    remove_dir(dir);
}
END_TEST


static Suite *checkpoint_suite(void)
{
    Suite *s = suite_create("checkpoint");
    TCase *tc = tcase_create("checkpoint");
    tcase_add_test(tc, test_round_trip_bit_exact_and_resume);
    tcase_add_test(tc, test_resume_restores_model_state_and_loader);
    tcase_add_test(tc, test_damaged_checkpoints_skipped);
    tcase_add_test(tc, test_on_corrupt_policies);
    tcase_add_test(tc, test_keep_top_k);
    tcase_add_test(tc, test_crc32_and_schedule);
    tcase_add_test(tc, test_deadline_and_recipe_values);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(checkpoint_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
