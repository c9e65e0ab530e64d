/* math_hf_agreement: runs dsarl's hf_math_verify over a JSONL file of {"response", "ground_truth", "label"} pairs
 * labelled by Python math-verify (tools/make_math_verify_fixtures.py) and reports how often the two agree, and
 * how fast the C verifier is on one core.
 *   math_hf_agreement FILE.jsonl [--min-rate R] [--show N] [--repeat K] [--json]
 * Exit status 0 when the agreement rate is at least R (default 0.995), 1 when below, 3 on bad input. */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "math_hf_verify.h"

typedef struct pair {
    char *response, *truth;
    int label;
} pair;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    double min_rate = 0.995;
    int show = 0, repeat = 1, as_json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--min-rate") == 0 && i + 1 < argc)
            min_rate = strtod(argv[++i], NULL);
        else if (strcmp(argv[i], "--show") == 0 && i + 1 < argc)
            show = atoi(argv[++i]);
        else if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc)
            repeat = atoi(argv[++i]);
        else if (strcmp(argv[i], "--json") == 0)
            as_json = 1;
        else if (!path && argv[i][0] != '-')
            path = argv[i];
        else {
            fprintf(stderr, "math_hf_agreement: unknown argument '%s'; usage: math_hf_agreement FILE.jsonl "
                            "[--min-rate R] [--show N] [--repeat K] [--json]\n", argv[i]);
            return 3;
        }
    }
    if (!path || repeat < 1) {
        fprintf(stderr, "math_hf_agreement: usage: math_hf_agreement FILE.jsonl [--min-rate R] [--show N] "
                        "[--repeat K >= 1] [--json]\n");
        return 3;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "math_hf_agreement: cannot open %s\n", path);
        return 3;
    }
    size_t n = 0, cap = 0;
    pair *pairs = NULL;
    char *line = NULL;
    size_t linecap = 0;
    long lineno = 0;
    while (getline(&line, &linecap, f) > 0) {
        lineno++;
        json_error_t jerr;
        json_t *o = json_loads(line, 0, &jerr);
        const char *r = o ? json_string_value(json_object_get(o, "response")) : NULL;
        const char *t = o ? json_string_value(json_object_get(o, "ground_truth")) : NULL;
        json_t *l = o ? json_object_get(o, "label") : NULL;
        if (!r || !t || !json_is_integer(l)) {
            fprintf(stderr, "%s:%ld: expected an object with string response, string ground_truth and integer "
                            "label\n", path, lineno);
            return 3;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            pairs = realloc(pairs, cap * sizeof *pairs);
            if (!pairs)
                return 3;
        }
        pairs[n++] = (pair){strdup(r), strdup(t), (int)json_integer_value(l)};
        json_decref(o);
    }
    free(line);
    fclose(f);
    char err[256];
    math_hf_verifier *v = math_hf_create(err, sizeof err);
    if (!v) {
        fprintf(stderr, "math_hf_agreement: %s\n", err);
        return 3;
    }
    size_t agree = 0, failures = 0, shown = 0, c_correct = 0;
    double t0 = now();
    for (int rep = 0; rep < repeat; rep++) {
        for (size_t i = 0; i < n; i++) {
            const char *why = NULL;
            int rc = math_hf_verify(v, pairs[i].response, pairs[i].truth, &why);
            if (rep > 0)
                continue;
            int c = rc == MATH_HF_CORRECT, py = pairs[i].label == 1;
            failures += rc == MATH_HF_FAILED;
            c_correct += c;
            if (c == py) {
                agree++;
            } else if ((int)shown < show) {
                shown++;
                char *pe = math_hf_extracted(v, pairs[i].response, 0);
                char wrapped[4096];
                snprintf(wrapped, sizeof wrapped, "\\boxed{%s}", pairs[i].truth);
                char *ge = math_hf_extracted(v, wrapped, 1);
                printf("line %zu: python %d, c %d%s%s\n  gold: %s\n  resp: %s\n  c extracted gold [%s] pred [%s]\n",
                       i + 1, py, c, rc == MATH_HF_FAILED ? " (failed: " : "", rc == MATH_HF_FAILED ? why : "",
                       pairs[i].truth, pairs[i].response, ge ? ge : "-", pe ? pe : "-");
                free(pe);
                free(ge);
            }
        }
    }
    double secs = now() - t0;
    double rate = n ? (double)agree / (double)n : 1.0;
    double per_sec = secs > 0 ? (double)n * repeat / secs : 0;
    if (as_json)
        printf("{\"pairs\": %zu, \"agree\": %zu, \"rate\": %.6f, \"c_correct\": %zu, \"verifier_failures\": %zu, "
               "\"answers_per_second\": %.1f}\n", n, agree, rate, c_correct, failures, per_sec);
    else
        printf("%s: %zu pairs, agreement with math-verify %zu/%zu = %.4f%%, %zu correct, %zu verifier failures, "
               "%.0f answers/s on one core\n", path, n, agree, n, 100.0 * rate, c_correct, failures, per_sec);
    math_hf_destroy(v);
    for (size_t i = 0; i < n; i++) {
        free(pairs[i].response);
        free(pairs[i].truth);
    }
    free(pairs);
    return rate + 1e-12 >= min_rate ? 0 : 1;
}
