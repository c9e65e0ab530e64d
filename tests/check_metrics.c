/* check_metrics.c: the run logger (core/src/metrics*.c): metrics.jsonl content read back with jansson, CRC32C and
 * Event bytes against values computed by hand, the TFRecord framing re-checked with an independent bitwise CRC,
 * exp_NNN numbering, resume truncation (no duplicate steps, torn lines dropped), sample dumps and JSON escaping.
 * `check_metrics --write-fixture DIR` writes a small run for tests/tensorboard_check.py (TensorBoard's own reader). */
#include <check.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsarl/fileutil.h"
#include "dsarl/metrics.h"
#include "dsarl/rng.h"

static char *make_temp_dir(void)
{
    char *tmpl = strdup("/tmp/check_metrics_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpl));
    return tmpl;
}

static void remove_tree(const char *path)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    ck_assert_int_eq(system(cmd), 0);
}

static char *join(const char *a, const char *b)
{
    char *p = dsarl_path_join(a, b);
    ck_assert_ptr_nonnull(p);
    return p;
}

/* Independent CRC32C: bit by bit over the reflected polynomial, no table. */
static uint32_t crc32c_bitwise(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    }
    return ~c;
}

static uint32_t mask(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

static uint32_t le32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* "123456789" is the CRC catalogue's check string: CRC-32C = 0xE3069283; masked (rotate right by 15, add
 * 0xa282ead8, mod 2^32): 0x2507C60D + 0xa282ead8 = 0xC78AB0E5. */
START_TEST(test_crc32c_known_values)
{
    ck_assert_uint_eq(dsarl_crc32c("123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(dsarl_tfrecord_masked_crc32c("123456789", 9), 0xc78ab0e5u);
    ck_assert_uint_eq(dsarl_crc32c("", 0), 0u);
    // random buffers against the bitwise reference
    dsarl_rng rng;
    dsarl_rng_init(&rng, 7, 1);
    uint8_t buf[300];
    for (int trial = 0; trial < 20; trial++) {
        size_t n = dsarl_rng_below(&rng, sizeof buf);
        for (size_t i = 0; i < n; i++)
            buf[i] = (uint8_t)dsarl_rng_next_u32(&rng);
        ck_assert_uint_eq(dsarl_crc32c(buf, n), crc32c_bitwise(buf, n));
        ck_assert_uint_eq(dsarl_tfrecord_masked_crc32c(buf, n), mask(crc32c_bitwise(buf, n)));
    }
}
END_TEST

/* Event{wall_time 1.5, step 3, summary{value{tag "a", simple_value 2.0}}}, encoded by hand:
 *   09 <1.5 as LE double: 00 00 00 00 00 00 f8 3f>   field 1, fixed64
 *   10 03                                             field 2, varint 3
 *   2a 0a                                             field 5, 10 bytes of Summary
 *     0a 08                                           Summary.value, 8 bytes
 *       0a 01 61                                      Value.tag "a"
 *       15 00 00 00 40                                Value.simple_value 2.0f (0x40000000) */
START_TEST(test_event_bytes_by_hand)
{
    static const uint8_t want[] = {0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x10, 0x03, 0x2a, 0x0a, 0x0a, 0x08,
                                   0x0a, 0x01, 0x61, 0x15, 0, 0, 0, 0x40};
    uint8_t buf[64];
    size_t n = dsarl_tb_scalar_event(buf, sizeof buf, 1.5, 3, "a", 2.0f);
    ck_assert_uint_eq(n, sizeof want);
    ck_assert_mem_eq(buf, want, sizeof want);
    // step 300 is a two-byte varint (0xac 0x02); a too-small buffer reports 0
    n = dsarl_tb_scalar_event(buf, sizeof buf, 1.5, 300, "a", 2.0f);
    ck_assert_uint_eq(n, sizeof want + 1);
    ck_assert_uint_eq(buf[9], 0x10);
    ck_assert_uint_eq(buf[10], 0xac);
    ck_assert_uint_eq(buf[11], 0x02);
    ck_assert_uint_eq(dsarl_tb_scalar_event(buf, 10, 1.5, 3, "a", 2.0f), 0);
}
END_TEST

static dsarl_metrics *open_logger(const char *log_dir, int64_t resume_step, bool tb)
{
    dsarl_metrics_config cfg = {.log_dir = log_dir, .tensorboard = tb, .progress = 0, .total_steps = 10,
                                .resume_step = resume_step};
    dsarl_metrics *m = NULL;
    dsarl_error err = {0};
    ck_assert_msg(dsarl_metrics_open(&cfg, &m, &err) == 0, "%s", err.message);
    return m;
}

static void log_step(dsarl_metrics *m, int64_t step, double reward, double other)
{
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_metrics_set(m, "train/reward", reward, &err), 0);
    ck_assert_int_eq(dsarl_metrics_set(m, "train/kl_penalty", other, &err), 0);
    ck_assert_int_eq(dsarl_metrics_set(m, "train/token_mult_prob_error", NAN, &err), 0);
    ck_assert_msg(dsarl_metrics_commit(m, step, &err) == 0, "%s", err.message);
}

/* Reads metrics.jsonl into an array of objects. */
static json_t *read_jsonl(const char *path)
{
    json_t *all = json_array();
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        json_error_t jerr;
        json_t *obj = json_loads(line, 0, &jerr);
        ck_assert_msg(obj != NULL, "bad JSON line '%s': %s", line, jerr.text);
        json_array_append_new(all, obj);
    }
    fclose(f);
    return all;
}

START_TEST(test_jsonl_round_trip)
{
    char *dir = make_temp_dir();
    dsarl_metrics *m = open_logger(dir, -1, false);
    char *want_dir = join(dir, "exp_001");
    ck_assert_str_eq(dsarl_metrics_dir(m), want_dir);
    dsarl_rng rng;
    dsarl_rng_init(&rng, 11, 0);
    double rewards[5], kls[5];
    for (int s = 0; s < 5; s++) {
        rewards[s] = dsarl_rng_uniform(&rng) * 3.0 - 1.0 + 1e-7 * dsarl_rng_normal(&rng);
        kls[s] = exp(20.0 * dsarl_rng_normal(&rng)); // wide exponent range: %.17g must still round-trip
        log_step(m, s + 1, rewards[s], kls[s]);
    }
    dsarl_error err = {0};
    ck_assert_int_eq(dsarl_metrics_set(m, "step", 1.0, &err), DSARL_E_INVALID);
    // the file is complete before close: a killed run keeps it
    char *path = join(want_dir, "metrics.jsonl");
    json_t *all = read_jsonl(path);
    ck_assert_uint_eq(json_array_size(all), 5);
    for (int s = 0; s < 5; s++) {
        json_t *o = json_array_get(all, (size_t)s);
        ck_assert_int_eq(json_integer_value(json_object_get(o, "step")), s + 1);
        ck_assert(json_number_value(json_object_get(o, "train/reward")) == rewards[s]);
        ck_assert(json_number_value(json_object_get(o, "train/kl_penalty")) == kls[s]);
        ck_assert(json_is_null(json_object_get(o, "train/token_mult_prob_error")));
    }
    // "step" is the first key of each line
    FILE *f = fopen(path, "r");
    char head[16] = {0};
    ck_assert_uint_eq(fread(head, 1, 9, f), 9);
    fclose(f);
    ck_assert_str_eq(head, "{\"step\": ");
    json_decref(all);
    dsarl_metrics_close(m);
    // a second fresh run gets the next experiment directory, a resume reuses the newest
    m = open_logger(dir, -1, false);
    char *second = join(dir, "exp_002");
    ck_assert_str_eq(dsarl_metrics_dir(m), second);
    dsarl_metrics_close(m);
    m = open_logger(dir, 0, false);
    ck_assert_str_eq(dsarl_metrics_dir(m), second);
    dsarl_metrics_close(m);
    free(second);
    free(path);
    free(want_dir);
    remove_tree(dir);
    free(dir);
}
END_TEST

/* Reads every TFRecord of an event file, checking both masked CRCs with the bitwise reference; returns the number
 * of records whose payload holds a summary (field 5) and stores their steps. */
static int read_event_file(const char *path, int64_t *steps, int max_steps)
{
    void *data;
    size_t size;
    dsarl_error err = {0};
    ck_assert_msg(dsarl_read_file(path, &data, &size, &err) == 0, "%s", err.message);
    const uint8_t *p = data;
    size_t at = 0;
    int n_records = 0, n_scalars = 0;
    while (at < size) {
        ck_assert(at + 12 <= size);
        uint64_t len = 0;
        for (int i = 0; i < 8; i++)
            len |= (uint64_t)p[at + i] << (8 * i);
        ck_assert_uint_eq(le32(p + at + 8), mask(crc32c_bitwise(p + at, 8)));
        ck_assert(at + 12 + len + 4 <= size);
        const uint8_t *payload = p + at + 12;
        ck_assert_uint_eq(le32(payload + len), mask(crc32c_bitwise(payload, len)));
        if (n_records == 0) {
            ck_assert_uint_eq(payload[9], 0x1a); // file_version right after wall_time
            ck_assert_int_eq(memcmp(payload + 11, "brain.Event:2", 13), 0);
        } else {
            ck_assert_uint_eq(payload[0], 0x09);
            int64_t step = 0;
            size_t q = 9;
            if (payload[q] == 0x10) {
                q++;
                for (int shift = 0;; shift += 7) {
                    step |= (int64_t)(payload[q] & 0x7f) << shift;
                    if (!(payload[q++] & 0x80))
                        break;
                }
            }
            ck_assert_uint_eq(payload[q], 0x2a);
            if (n_scalars < max_steps)
                steps[n_scalars] = step;
            n_scalars++;
        }
        n_records++;
        at += 12 + len + 4;
    }
    free(data);
    return n_scalars;
}

static char *find_event_file(const char *exp_dir, int *count)
{
    char *tb = join(exp_dir, "tensorboard");
    DIR *d = opendir(tb);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    char *found = NULL;
    *count = 0;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "events.out.tfevents.", 20) == 0) {
            (*count)++;
            free(found);
            found = join(tb, e->d_name);
        }
    }
    closedir(d);
    free(tb);
    ck_assert_ptr_nonnull(found);
    return found;
}

START_TEST(test_resume_truncates_later_steps)
{
    char *dir = make_temp_dir();
    dsarl_metrics *m = open_logger(dir, -1, true);
    char *exp = strdup(dsarl_metrics_dir(m));
    dsarl_error err = {0};
    for (int s = 1; s <= 5; s++) {
        log_step(m, s, 0.1 * s, 0.01 * s);
        dsarl_metrics_sample sample = {"What is 1+1?", "Answer: 2", 1.0, 0.5};
        ck_assert_int_eq(dsarl_metrics_write_samples(m, "train", s, &sample, 1, &err), 0);
    }
    ck_assert_int_eq(dsarl_metrics_write_samples(m, "val", 5, NULL, 0, &err), 0);
    dsarl_metrics_close(m);
    // a kill tears the last line
    char *path = join(exp, "metrics.jsonl");
    FILE *f = fopen(path, "a");
    fputs("{\"step\": 6, \"train/rew", f);
    fclose(f);

    m = open_logger(dir, 3, true); // resume after step 3
    ck_assert_str_eq(dsarl_metrics_dir(m), exp);
    json_t *all = read_jsonl(path);
    ck_assert_uint_eq(json_array_size(all), 3);
    json_decref(all);
    char name[64];
    for (int s = 1; s <= 5; s++) {
        snprintf(name, sizeof name, "train_data_step%d.jsonl", s);
        char *p = join(exp, name);
        ck_assert_int_eq(dsarl_path_exists(p), s <= 3);
        free(p);
    }
    char *val5 = join(exp, "val_data_step5.jsonl");
    ck_assert_int_eq(dsarl_path_exists(val5), 0);
    free(val5);
    for (int s = 4; s <= 6; s++)
        log_step(m, s, 0.2 * s, 0.02 * s);
    dsarl_metrics_close(m);
    all = read_jsonl(path);
    ck_assert_uint_eq(json_array_size(all), 6);
    for (size_t i = 0; i < 6; i++) {
        json_t *o = json_array_get(all, i);
        ck_assert_int_eq(json_integer_value(json_object_get(o, "step")), (json_int_t)i + 1);
        double want = i < 3 ? 0.1 * (double)(i + 1) : 0.2 * (double)(i + 1);
        ck_assert(json_number_value(json_object_get(o, "train/reward")) == want);
    }
    json_decref(all);
    // one event file, with the 3 kept steps replayed and 3 new ones, 2 finite scalars each (NaN is skipped)
    int n_files;
    char *events = find_event_file(exp, &n_files);
    ck_assert_int_eq(n_files, 1);
    int64_t steps[32];
    int n = read_event_file(events, steps, 32);
    ck_assert_int_eq(n, 12);
    for (int i = 0; i < 12; i++)
        ck_assert_int_eq(steps[i], i / 2 + 1);
    free(events);
    free(path);
    free(exp);
    remove_tree(dir);
    free(dir);
}
END_TEST

START_TEST(test_samples_and_escaping)
{
    char *dir = make_temp_dir();
    dsarl_metrics *m = open_logger(dir, -1, false);
    dsarl_error err = {0};
    // invalid UTF-8 (a lone 0xC3, an overlong 0xC0 0xAF, a surrogate), quotes, control characters, valid UTF-8
    const char *response = "a\"b\\c\n\x01 \xC3 \xC0\xAF \xED\xA0\x80 \xC3\xA9 \xF0\x9F\x98\x80";
    dsarl_metrics_sample s[2] = {{"What is 2+3?", response, 1.0, 0.75}, {"p", "r", 0.0, NAN}};
    ck_assert_int_eq(dsarl_metrics_write_samples(m, "val", 7, s, 2, &err), 0);
    char *path = join(dsarl_metrics_dir(m), "val_data_step7.jsonl");
    json_t *all = read_jsonl(path);
    ck_assert_uint_eq(json_array_size(all), 2);
    json_t *o = json_array_get(all, 0);
    ck_assert_str_eq(json_string_value(json_object_get(o, "prompt")), "What is 2+3?");
    ck_assert_str_eq(json_string_value(json_object_get(o, "response")),
                     "a\"b\\c\n\x01 \xEF\xBF\xBD \xEF\xBF\xBD\xEF\xBF\xBD \xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD "
                     "\xC3\xA9 \xF0\x9F\x98\x80");
    ck_assert(json_number_value(json_object_get(o, "reward")) == 1.0);
    ck_assert(json_number_value(json_object_get(o, "advantage")) == 0.75);
    ck_assert(json_is_null(json_object_get(json_array_get(all, 1), "advantage")));
    json_decref(all);
    free(path);
    dsarl_metrics_close(m);
    remove_tree(dir);
    free(dir);
}
END_TEST

START_TEST(test_recipe_keys_declared)
{
    size_t n;
    const dsarl_key_spec *keys = dsarl_metrics_keys(&n);
    int found_dir = 0, owned = 0, wandb_ignored = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(keys[i].path, "logger.log_dir") == 0)
            found_dir = 1;
        if (strcmp(keys[i].path, "logger") == 0 && (keys[i].flags & DSARL_KEY_OWNED))
            owned = 1;
        if (strcmp(keys[i].path, "logger.wandb_enabled") == 0 && (keys[i].flags & DSARL_KEY_IGNORED))
            wandb_ignored = 1;
    }
    ck_assert(found_dir && owned && wandb_ignored);
}
END_TEST

/* The fixture for tests/tensorboard_check.py: 4 steps with 3 scalars, exp dir = DIR. */
static int write_fixture(const char *dir)
{
    dsarl_metrics_config cfg = {.exp_dir = dir, .tensorboard = true, .progress = 0, .resume_step = -1};
    dsarl_metrics *m;
    dsarl_error err = {0};
    if (dsarl_metrics_open(&cfg, &m, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    for (int s = 1; s <= 4; s++) {
        dsarl_metrics_set(m, "train/reward", 0.25 * s, &err);
        dsarl_metrics_set(m, "val/accuracy", 1.0 / (s + 1), &err);
        dsarl_metrics_set(m, "timing/train/total_step_time", 0.5 + s, &err);
        if (dsarl_metrics_commit(m, s, &err) < 0) {
            fprintf(stderr, "%s\n", err.message);
            return 1;
        }
    }
    dsarl_metrics_close(m);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write-fixture") == 0)
        return write_fixture(argv[2]);
    Suite *s = suite_create("metrics");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_crc32c_known_values);
    tcase_add_test(tc, test_event_bytes_by_hand);
    tcase_add_test(tc, test_jsonl_round_trip);
    tcase_add_test(tc, test_resume_truncates_later_steps);
    tcase_add_test(tc, test_samples_and_escaping);
    tcase_add_test(tc, test_recipe_keys_declared);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
