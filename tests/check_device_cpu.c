/* check_device_cpu.c: every CPU device primitive against a naive double-precision formulation written here, and
 * every backward against central finite differences of the forward, on fresh random inputs. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_device.h"
#include "recipe_internal.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

// xorshift64* uniform in [-1, 1)
static float frand(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *rand_array(int64_t n, float scale)
{
    float *a = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        a[i] = frand() * scale;
    return a;
}

static double dot_d(const float *a, const float *b, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

static void assert_close(const float *got, const double *want, int64_t n, double tol, const char *what)
{
    double maxref = 1e-30, maxerr = 0.0;
    for (int64_t i = 0; i < n; i++) {
        maxref = fmax(maxref, fabs(want[i]));
        maxerr = fmax(maxerr, fabs(got[i] - want[i]));
    }
    ck_assert_msg(maxerr <= tol * maxref, "%s: max abs error %.3g vs max |ref| %.3g (tol %.1g)", what, maxerr, maxref,
                  tol);
}

/* A scalar loss L(x) = <forward(x), R>; fd_check perturbs each element of x and compares (L+ - L-)/2h with the
 * analytic gradient. */
typedef double (*loss_fn)(void *ctx);

static void fd_check(loss_fn f, void *ctx, float *x, int64_t n, const float *grad, float h, double tol,
                     const char *what)
{
    double *num = malloc((size_t)n * sizeof(double));
    for (int64_t i = 0; i < n; i++) {
        float saved = x[i];
        x[i] = saved + h;
        double lp = f(ctx);
        x[i] = saved - h;
        double lm = f(ctx);
        x[i] = saved;
        num[i] = (lp - lm) / (2.0 * h);
    }
    assert_close(grad, num, n, tol, what);
    free(num);
}

static dsarl_device *dev;
static dsarl_error err;

static void setup(void)
{
    dsarl_device_config cfg = {.struct_size = sizeof(cfg), .threads = 1};
    ck_assert_int_eq(cpu_create(&cfg, &dev, &err), 0);
}

static void teardown(void) { cpu_destroy(dev); }

/* --- GEMM ------------------------------------------------------------------------------------------------ */

START_TEST(test_gemm_all_transposes)
{
    int64_t m = 7, n = 5, k = 9;
    for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
            float *a = rand_array(m * k, 1), *b = rand_array(k * n, 1), *c = rand_array(m * n, 1);
            double *want = malloc((size_t)(m * n) * sizeof(double));
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) {
                    double s = 0.0;
                    for (int64_t p = 0; p < k; p++)
                        s += (double)(ta ? a[p * m + i] : a[i * k + p]) * (tb ? b[j * k + p] : b[p * n + j]);
                    want[i * n + j] = 0.5 * s + 0.25 * c[i * n + j];
                }
            ck_assert_int_eq(cpu_gemm(dev, ta, tb, m, n, k, 0.5f, a, b, 0.25f, c, &err), 0);
            assert_close(c, want, m * n, 1e-6, "gemm");
            free(a), free(b), free(c), free(want);
        }
    }
}
END_TEST

START_TEST(test_gemm_strided_batched)
{
    int64_t m = 3, n = 4, k = 5, batch = 3;
    float *a = rand_array(batch * m * k, 1), *b = rand_array(batch * k * n, 1), *c = rand_array(batch * m * n, 1);
    double *want = malloc((size_t)(batch * m * n) * sizeof(double));
    for (int64_t z = 0; z < batch; z++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0.0;
                for (int64_t p = 0; p < k; p++)
                    s += (double)a[z * m * k + i * k + p] * b[z * k * n + j * k + p];
                want[z * m * n + i * n + j] = s;
            }
    ck_assert_int_eq(cpu_gemm_strided_batched(dev, false, true, m, n, k, 1.0f, a, m * k, b, k * n, 0.0f, c, m * n,
                                              batch, &err), 0);
    assert_close(c, want, batch * m * n, 1e-6, "gemm_strided_batched");
    free(a), free(b), free(c), free(want);
}
END_TEST

/* --- norms --------------------------------------------------------------------------------------------- */

typedef struct norm_case {
    int64_t T, C;
    float *x, *w, *b, *r, *out, *mean, *rstd;
    int layer; // 1 = LayerNorm, 0 = RMSNorm
} norm_case;

static double norm_loss(void *p)
{
    norm_case *nc = p;
    if (nc->layer)
        cpu_layernorm_forward(dev, nc->out, nc->mean, nc->rstd, nc->x, nc->w, nc->b, nc->T, nc->C, 1e-6f, &err);
    else
        cpu_rmsnorm_forward(dev, nc->out, nc->rstd, nc->x, nc->w, nc->T, nc->C, 1e-5f, &err);
    return dot_d(nc->out, nc->r, nc->T * nc->C);
}

START_TEST(test_rmsnorm)
{
    norm_case nc = {.T = 4, .C = 16, .layer = 0};
    nc.x = rand_array(64, 2), nc.w = rand_array(16, 1), nc.r = rand_array(64, 1);
    nc.out = malloc(64 * sizeof(float)), nc.rstd = malloc(4 * sizeof(float));
    norm_loss(&nc);
    double want[64];
    for (int t = 0; t < 4; t++) {
        double ss = 0;
        for (int c = 0; c < 16; c++)
            ss += (double)nc.x[t * 16 + c] * nc.x[t * 16 + c];
        for (int c = 0; c < 16; c++)
            want[t * 16 + c] = nc.w[c] * nc.x[t * 16 + c] / sqrt(ss / 16 + 1e-5);
    }
    assert_close(nc.out, want, 64, 1e-6, "rmsnorm forward");
    float dx[64], dw[16] = {0};
    ck_assert_int_eq(cpu_rmsnorm_backward(dev, dx, dw, nc.r, nc.x, nc.w, nc.rstd, 4, 16, &err), 0);
    fd_check(norm_loss, &nc, nc.x, 64, dx, 1e-3f, 2e-3, "rmsnorm dinp");
    fd_check(norm_loss, &nc, nc.w, 16, dw, 1e-3f, 2e-3, "rmsnorm dweight");
    free(nc.x), free(nc.w), free(nc.r), free(nc.out), free(nc.rstd);
}
END_TEST

START_TEST(test_layernorm)
{
    norm_case nc = {.T = 3, .C = 12, .layer = 1};
    nc.x = rand_array(36, 2), nc.w = rand_array(12, 1), nc.b = rand_array(12, 1), nc.r = rand_array(36, 1);
    nc.out = malloc(36 * sizeof(float)), nc.rstd = malloc(3 * sizeof(float)), nc.mean = malloc(3 * sizeof(float));
    norm_loss(&nc);
    double want[36];
    for (int t = 0; t < 3; t++) {
        double m = 0, v = 0;
        for (int c = 0; c < 12; c++)
            m += nc.x[t * 12 + c] / 12.0;
        for (int c = 0; c < 12; c++)
            v += (nc.x[t * 12 + c] - m) * (nc.x[t * 12 + c] - m) / 12.0;
        for (int c = 0; c < 12; c++)
            want[t * 12 + c] = (nc.x[t * 12 + c] - m) / sqrt(v + 1e-6) * nc.w[c] + nc.b[c];
    }
    assert_close(nc.out, want, 36, 1e-6, "layernorm forward");
    float dx[36], dw[12] = {0}, db[12] = {0};
    ck_assert_int_eq(cpu_layernorm_backward(dev, dx, dw, db, nc.r, nc.x, nc.w, nc.mean, nc.rstd, 3, 12, &err), 0);
    fd_check(norm_loss, &nc, nc.x, 36, dx, 1e-3f, 2e-3, "layernorm dinp");
    fd_check(norm_loss, &nc, nc.w, 12, dw, 1e-3f, 2e-3, "layernorm dweight");
    fd_check(norm_loss, &nc, nc.b, 12, db, 1e-3f, 2e-3, "layernorm dbias");
    free(nc.x), free(nc.w), free(nc.b), free(nc.r), free(nc.out), free(nc.rstd), free(nc.mean);
}
END_TEST

/* --- RoPE ---------------------------------------------------------------------------------------------- */

typedef struct rope_case {
    float *x, *r, *out, *inv_freq;
    int32_t *pos;
} rope_case;

enum { ROPE_T = 3, ROPE_H = 2, ROPE_HS = 10, ROPE_OFF = 2, ROPE_D = 8 }; // rope slice at [2, 10) of 10-wide heads

static double rope_loss(void *p)
{
    rope_case *rc = p;
    memcpy(rc->out, rc->x, ROPE_T * ROPE_H * ROPE_HS * sizeof(float));
    cpu_rope_forward(dev, rc->out + ROPE_OFF, rc->out + ROPE_OFF, rc->pos, rc->inv_freq, 1.0f, ROPE_T, ROPE_H,
                     ROPE_H * ROPE_HS, ROPE_HS, ROPE_D, &err);
    return dot_d(rc->out, rc->r, ROPE_T * ROPE_H * ROPE_HS);
}

START_TEST(test_rope_interleaved)
{
    int n = ROPE_T * ROPE_H * ROPE_HS;
    rope_case rc = {.x = rand_array(n, 1), .r = rand_array(n, 1), .out = malloc((size_t)n * sizeof(float))};
    float inv_freq[ROPE_D / 2];
    for (int i = 0; i < ROPE_D / 2; i++)
        inv_freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / ROPE_D);
    int32_t pos[ROPE_T] = {0, 5, 17};
    rc.inv_freq = inv_freq, rc.pos = pos;
    rope_loss(&rc);
    // reference: complex rotation (x0 + i x1) * e^{i theta}, real parts first then imaginary parts
    double want[ROPE_T * ROPE_H * ROPE_HS];
    for (int i = 0; i < n; i++)
        want[i] = rc.x[i];
    for (int t = 0; t < ROPE_T; t++)
        for (int h = 0; h < ROPE_H; h++) {
            const float *x = rc.x + t * ROPE_H * ROPE_HS + h * ROPE_HS + ROPE_OFF;
            double *y = want + t * ROPE_H * ROPE_HS + h * ROPE_HS + ROPE_OFF;
            for (int i = 0; i < ROPE_D / 2; i++) {
                double th = pos[t] * (double)inv_freq[i];
                y[i] = x[2 * i] * cos(th) - x[2 * i + 1] * sin(th);
                y[i + ROPE_D / 2] = x[2 * i] * sin(th) + x[2 * i + 1] * cos(th);
            }
        }
    assert_close(rc.out, want, n, 1e-5, "rope forward");
    // backward in place on a copy of R restricted to the rope slices
    float *dx = malloc((size_t)n * sizeof(float));
    memcpy(dx, rc.r, (size_t)n * sizeof(float));
    ck_assert_int_eq(cpu_rope_backward(dev, dx + ROPE_OFF, dx + ROPE_OFF, pos, inv_freq, 1.0f, ROPE_T, ROPE_H,
                                       ROPE_H * ROPE_HS, ROPE_HS, ROPE_D, &err), 0);
    fd_check(rope_loss, &rc, rc.x, n, dx, 1e-3f, 2e-3, "rope dinp");
    free(rc.x), free(rc.r), free(rc.out), free(dx);
}
END_TEST

/* --- SwiGLU, embedding, add ---------------------------------------------------------------------------- */

typedef struct swiglu_case {
    float *x, *r, *out;
} swiglu_case;

static double swiglu_loss(void *p)
{
    swiglu_case *sc = p;
    cpu_swiglu_forward(dev, sc->out, sc->x, 3, 5, &err);
    return dot_d(sc->out, sc->r, 15);
}

START_TEST(test_swiglu)
{
    swiglu_case sc = {.x = rand_array(30, 3), .r = rand_array(15, 1), .out = malloc(15 * sizeof(float))};
    swiglu_loss(&sc);
    double want[15];
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 5; i++) {
            double g = sc.x[t * 10 + i], u = sc.x[t * 10 + 5 + i];
            want[t * 5 + i] = g / (1.0 + exp(-g)) * u;
        }
    assert_close(sc.out, want, 15, 1e-6, "swiglu forward");
    float dx[30];
    ck_assert_int_eq(cpu_swiglu_backward(dev, dx, sc.r, sc.x, 3, 5, &err), 0);
    fd_check(swiglu_loss, &sc, sc.x, 30, dx, 1e-3f, 2e-3, "swiglu dinp");
    free(sc.x), free(sc.r), free(sc.out);
}
END_TEST

START_TEST(test_embedding_add_axpy_copy2d)
{
    float *wte = rand_array(5 * 3, 1), out[4 * 3], dwte[15] = {0}, *d = rand_array(12, 1);
    int32_t tokens[4] = {4, 0, 4, 2};
    ck_assert_int_eq(cpu_embedding_forward(dev, out, tokens, wte, 4, 3, 5, &err), 0);
    for (int t = 0; t < 4; t++)
        for (int c = 0; c < 3; c++)
            ck_assert(out[t * 3 + c] == wte[tokens[t] * 3 + c]);
    int32_t bad[1] = {5};
    ck_assert_int_eq(cpu_embedding_forward(dev, out, bad, wte, 1, 3, 5, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "vocabulary"));
    ck_assert_int_eq(cpu_embedding_backward(dev, dwte, d, tokens, 4, 3, &err), 0);
    for (int c = 0; c < 3; c++) {
        ck_assert_float_eq_tol(dwte[4 * 3 + c], d[0 * 3 + c] + d[2 * 3 + c], 1e-6);
        ck_assert_float_eq_tol(dwte[0 * 3 + c], d[1 * 3 + c], 1e-6);
        ck_assert(dwte[1 * 3 + c] == 0.0f && dwte[3 * 3 + c] == 0.0f);
    }
    float *a = rand_array(12, 1), *b = rand_array(12, 1), sum[12], y[12];
    ck_assert_int_eq(cpu_add(dev, sum, a, b, 12, &err), 0);
    memcpy(y, b, sizeof(y));
    ck_assert_int_eq(cpu_axpy(dev, 12, -2.0f, a, y, &err), 0);
    for (int i = 0; i < 12; i++) {
        ck_assert(sum[i] == a[i] + b[i]);
        ck_assert_float_eq_tol(y[i], b[i] - 2.0f * a[i], 1e-6);
    }
    float dst[2 * 5] = {0};
    ck_assert_int_eq(cpu_copy_2d(dev, dst, 5, a + 1, 4, 2, 3, &err), 0); // rows of 3 from a 4-wide source
    ck_assert(dst[0] == a[1] && dst[2] == a[3] && dst[5] == a[5] && dst[7] == a[7] && dst[3] == 0.0f);
    free(wte), free(d), free(a), free(b);
}
END_TEST

/* --- MoE routing ----------------------------------------------------------------------------------------- */

// Naive router: experts sorted by choice value within the kept groups (groups ranked by top-2 sums).
static void naive_route(const float *logits, const float *bias, int E, int k, int n_group, int topk_group, int norm,
                        float scaling, int32_t *idx, double *w)
{
    int gs = E / n_group;
    double s[64], ch[64], gscore[16];
    for (int e = 0; e < E; e++) {
        s[e] = 1.0 / (1.0 + exp(-(double)logits[e]));
        ch[e] = s[e] + bias[e];
    }
    for (int g = 0; g < n_group; g++) {
        double b1 = -1e30, b2 = -1e30;
        for (int e = g * gs; e < (g + 1) * gs; e++) {
            if (ch[e] > b1)
                b2 = b1, b1 = ch[e];
            else if (ch[e] > b2)
                b2 = ch[e];
        }
        gscore[g] = b1 + b2;
    }
    int kept[16] = {0};
    for (int i = 0; i < topk_group; i++) {
        int best = -1;
        for (int g = 0; g < n_group; g++)
            if (!kept[g] && (best < 0 || gscore[g] > gscore[best]))
                best = g;
        kept[best] = 1;
    }
    int used[64] = {0};
    double sum = 0;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (kept[e / gs] && !used[e] && (best < 0 || ch[e] > ch[best]))
                best = e;
        used[best] = 1;
        idx[j] = best;
        sum += s[best];
    }
    for (int j = 0; j < k; j++)
        w[j] = (norm ? s[idx[j]] / (sum + 1e-20) : s[idx[j]]) * scaling;
}

typedef struct route_case {
    float *logits, *bias, *r, *weights, *probs;
    int32_t *idx;
    int T, E, k, n_group, topk_group, norm;
} route_case;

static double route_loss(void *p)
{
    route_case *rc = p;
    cpu_moe_route_forward(dev, rc->idx, rc->weights, rc->probs, rc->logits, rc->bias, rc->T, rc->E, rc->k,
                          rc->n_group, rc->topk_group, rc->norm, 2.5f, &err);
    return dot_d(rc->weights, rc->r, rc->T * rc->k);
}

START_TEST(test_moe_route)
{
    int configs[3][5] = {{16, 4, 4, 2, 1}, {16, 3, 1, 1, 0}, {12, 2, 3, 2, 1}}; // E, k, n_group, topk_group, norm
    for (int c = 0; c < 3; c++) {
        route_case rc = {.T = 5, .E = configs[c][0], .k = configs[c][1], .n_group = configs[c][2],
                         .topk_group = configs[c][3], .norm = configs[c][4]};
        rc.logits = rand_array(rc.T * rc.E, 3), rc.bias = rand_array(rc.E, 0.3f), rc.r = rand_array(rc.T * rc.k, 1);
        rc.weights = malloc((size_t)(rc.T * rc.k) * sizeof(float));
        rc.probs = malloc((size_t)(rc.T * rc.E) * sizeof(float));
        rc.idx = malloc((size_t)(rc.T * rc.k) * sizeof(int32_t));
        ck_assert_int_eq(cpu_moe_route_forward(dev, rc.idx, rc.weights, rc.probs, rc.logits, rc.bias, rc.T, rc.E, rc.k,
                                               rc.n_group, rc.topk_group, rc.norm, 2.5f, &err), 0);
        for (int t = 0; t < rc.T; t++) {
            int32_t idx[8];
            double w[8];
            naive_route(rc.logits + t * rc.E, rc.bias, rc.E, rc.k, rc.n_group, rc.topk_group, rc.norm, 2.5f, idx, w);
            for (int j = 0; j < rc.k; j++) {
                ck_assert_int_eq(rc.idx[t * rc.k + j], idx[j]);
                ck_assert_float_eq_tol(rc.weights[t * rc.k + j], w[j], 1e-6);
            }
        }
        float *dlogits = malloc((size_t)(rc.T * rc.E) * sizeof(float));
        ck_assert_int_eq(cpu_moe_route_backward(dev, dlogits, rc.r, rc.idx, rc.probs, rc.T, rc.E, rc.k, rc.norm, 2.5f,
                                                &err), 0);
        // small steps keep the (random, well separated) selection fixed
        fd_check(route_loss, &rc, rc.logits, rc.T * rc.E, dlogits, 1e-3f, 3e-3, "moe_route dlogits");
        free(rc.logits), free(rc.bias), free(rc.r), free(rc.weights), free(rc.probs), free(rc.idx), free(dlogits);
    }
    // refusal: topk_group > n_group
    float l[4] = {0.1f, 0.2f, 0.3f, 0.4f}, w[2], pr[4];
    int32_t ix[2];
    ck_assert_int_eq(cpu_moe_route_forward(dev, ix, w, pr, l, NULL, 1, 4, 2, 2, 3, true, 1.0f, &err), DSARL_E_INVALID);
}
END_TEST

/* moe_group_padded's spec written out pair by pair: pair i of expert e takes rank = (pairs j < i of expert e), row
 * e*pad + rank while rank < pad, else no row (slot_inv -1); every other row r is token r mod T at slot N. Quadratic on
 * purpose: it shares no counter with the device's pass. */
static void naive_group(const int32_t *idx, int64_t T, int64_t E, int K, int64_t pad, int32_t *rows, int32_t *slot,
                        int32_t *slot_inv)
{
    int64_t N = T * K;
    for (int64_t r = 0; r < E * pad; r++)
        rows[r] = T > 0 ? (int32_t)(r % T) : 0, slot[r] = (int32_t)N;
    for (int64_t i = 0; i < N; i++) {
        int64_t rank = 0;
        for (int64_t j = 0; j < i; j++)
            rank += idx[j] == idx[i];
        slot_inv[i] = rank < pad ? (int32_t)(idx[i] * pad + rank) : -1;
        if (rank < pad)
            rows[idx[i] * pad + rank] = (int32_t)(i / K), slot[idx[i] * pad + rank] = (int32_t)i;
    }
}

// Token t's K experts: distinct draws, half of them from a hot set of 12 so some groups grow large (GLM-5's routers
// are far from uniform early in training); repeat allows an expert twice in a row.
static void draw_routing(int32_t *idx, int64_t T, int64_t E, int K, bool repeat)
{
    for (int64_t t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int32_t e;
            bool again;
            do {
                double u = 0.5 * (frand() + 1.0);
                e = (int32_t)(frand() > 0.0f ? u * 12 : u * E) % (int32_t)E;
                again = false;
                for (int j = 0; j < k && !repeat; j++)
                    again |= idx[t * K + j] == e;
            } while (again);
            idx[t * K + k] = e;
        }
}

// One grouping against the naive one; returns the pairs left without a row.
static int64_t check_group(const int32_t *idx, int64_t T, int64_t E, int K, int64_t pad)
{
    int64_t N = T * K;
    int32_t *rows = malloc((size_t)(E * pad) * sizeof(int32_t)), *slot = malloc((size_t)(E * pad) * sizeof(int32_t));
    int32_t *inv = malloc((size_t)N * sizeof(int32_t)), *want_rows = malloc((size_t)(E * pad) * sizeof(int32_t));
    int32_t *want_slot = malloc((size_t)(E * pad) * sizeof(int32_t)), *want_inv = malloc((size_t)N * sizeof(int32_t));
    for (int64_t r = 0; r < E * pad; r++)
        rows[r] = slot[r] = 12345; // stale values: every row must be written
    for (int64_t i = 0; i < N; i++)
        inv[i] = 12345;
    const dsarl_device_ops *ops = &dsarl_cpu_device_ops;
    int (*group)(dsarl_device *, int32_t *, int32_t *, int32_t *, const int32_t *, int64_t, int64_t, int32_t, int64_t,
                 dsarl_error *) = DSARL_DEVICE_SLOT(ops, moe_group_padded);
    ck_assert_ptr_nonnull(group);
    ck_assert_msg(group(dev, rows, slot, inv, idx, T, E, K, pad, &err) == 0, "%s", err.message);
    naive_group(idx, T, E, K, pad, want_rows, want_slot, want_inv);
    int64_t dropped = 0;
    for (int64_t r = 0; r < E * pad; r++) {
        ck_assert_msg(rows[r] == want_rows[r] && slot[r] == want_slot[r], "T %lld pad %lld row %lld: token %d slot "
                      "%d, want %d %d", (long long)T, (long long)pad, (long long)r, rows[r], slot[r], want_rows[r],
                      want_slot[r]);
        int32_t pair = slot[r];
        if (pair >= 0 && pair < N)
            ck_assert_int_eq(inv[pair], r); // a used row and its pair point at each other
    }
    for (int64_t i = 0; i < N; i++) {
        ck_assert_msg(inv[i] == want_inv[i], "T %lld pad %lld pair %lld: row %d, want %d", (long long)T,
                      (long long)pad, (long long)i, inv[i], want_inv[i]);
        dropped += inv[i] < 0;
    }
    free(rows), free(slot), free(inv), free(want_rows), free(want_slot), free(want_inv);
    return dropped;
}

START_TEST(test_moe_group_padded)
{
    enum { E = 256, K = 8, T_MAX = 64 }; // GLM-5's routed experts and experts per token; decode batch sizes
    int32_t *idx = malloc((size_t)(T_MAX * K) * sizeof(int32_t));
    int64_t overflowed = 0;
    for (int64_t T = 1; T <= T_MAX; T++) {
        draw_routing(idx, T, E, K, false);
        // pad = T: an expert appears at most once per token, so every pair gets a row
        ck_assert_int_eq(check_group(idx, T, E, K, T), 0);
        int64_t largest = 0, count[E] = {0};
        for (int64_t i = 0; i < T * K; i++)
            largest = ++count[idx[i]] > largest ? count[idx[i]] : largest;
        if (largest > 1) { // a pad below the largest group: its last pairs get no row
            int64_t dropped = check_group(idx, T, E, K, largest / 2);
            ck_assert_int_gt(dropped, 0);
            overflowed += dropped;
        }
    }
    ck_assert_int_gt(overflowed, 0);
    // an expert repeated in a row overflows even at pad = T
    draw_routing(idx, 5, 16, K, true);
    idx[0] = idx[1] = 3;
    check_group(idx, 5, 16, K, 5);
    idx[2] = 3, idx[3] = 3, idx[4] = 3, idx[5] = 3;
    ck_assert_int_gt(check_group(idx, 1, 16, K, 1), 0);
    // no tokens: every row is padding
    ck_assert_int_eq(check_group(idx, 0, 4, K, 3), 0);
    // refusals, each naming the slot
    int32_t rows[64], slot[64], inv[16], bad[2] = {1, 4};
    ck_assert_int_eq(cpu_moe_group_padded(dev, rows, slot, inv, idx, 2, 0, K, 2, &err), DSARL_E_INVALID); // E
    ck_assert_ptr_nonnull(strstr(err.message, "moe_group_padded"));
    ck_assert_int_eq(cpu_moe_group_padded(dev, rows, slot, inv, idx, 2, 4, 0, 2, &err), DSARL_E_INVALID); // top_k
    ck_assert_int_eq(cpu_moe_group_padded(dev, rows, slot, inv, idx, 2, 4, K, 0, &err), DSARL_E_INVALID); // pad
    ck_assert_int_eq(cpu_moe_group_padded(dev, rows, slot, inv, idx, -1, 4, K, 2, &err), DSARL_E_INVALID); // T
    // sizes whose rows or slots do not fit int32 are refused before anything is allocated or written
    ck_assert_int_eq(cpu_moe_group_padded(dev, rows, slot, inv, idx, 2, (int64_t)1 << 40, K, 2, &err),
                     DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "E*pad and T*top_k at most"));
    ck_assert_int_eq(cpu_moe_group_padded(dev, rows, slot, inv, idx, (int64_t)1 << 31, 4, K, 2, &err),
                     DSARL_E_INVALID);
    ck_assert_int_eq(cpu_moe_group_padded(dev, rows, slot, inv, bad, 1, 4, 2, 2, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "moe_group_padded indices[1]") && strstr(err.message, "[0, 4)"), "%s",
                  err.message);
    bad[1] = -1;
    ck_assert_int_eq(cpu_moe_group_padded(dev, rows, slot, inv, bad, 1, 4, 2, 2, &err), DSARL_E_INVALID);
    free(idx);
}
END_TEST

/* dsarl_device_gemm_grouped on a table without the slot (the CPU device's): one gemm per expert row group, against
 * float64 sums written out here, in both forms and with empty groups; and a table of ABI 1.6's size reads the 1.7
 * slots as NULL whatever bytes lie past its end (the helper then loops, the profile scope is a no-op). */
START_TEST(test_gemm_grouped_fallback)
{
    const dsarl_device_ops *ops = &dsarl_cpu_device_ops;
    ck_assert_ptr_null(DSARL_DEVICE_SLOT(ops, gemm_grouped));
    enum { G = 5 };
    const int64_t rows_of[G] = {3, 0, 7, 1, 0};
    int64_t first[G + 1] = {0};
    for (int g = 0; g < G; g++)
        first[g + 1] = first[g] + rows_of[g];
    int64_t R = first[G], m = 6, n = 5, k = 4;
    for (int tb = 0; tb <= 1; tb++) { // rows: C rows of g (r_g, n) = 0.5 A rows of g (r_g, k) op(B_g) + 0.25 C
        float *a = rand_array(R * k, 1), *b = rand_array(G * k * n, 1), *c = rand_array(R * n, 1);
        double *want = malloc((size_t)(R * n) * sizeof(double));
        for (int g = 0; g < G; g++)
            for (int64_t r = first[g]; r < first[g + 1]; r++)
                for (int64_t j = 0; j < n; j++) {
                    double sum = 0.0;
                    for (int64_t q = 0; q < k; q++)
                        sum += (double)a[r * k + q] * b[g * k * n + (tb ? j * k + q : q * n + j)];
                    want[r * n + j] = 0.5 * sum + 0.25 * c[r * n + j];
                }
        ck_assert_int_eq(dsarl_device_gemm_grouped(ops, dev, false, tb, G, first, 0, n, k, 0.5f, a, b, k * n, 0.25f,
                                                   c, 0, &err), 0);
        assert_close(c, want, R * n, 1e-6, tb ? "gemm_grouped rows, B transposed" : "gemm_grouped rows");
        free(a), free(b), free(c), free(want);
    }
    for (int accumulate = 0; accumulate <= 1; accumulate++) { // inner: C_g (m, n) = A_g^T B_g + beta C_g
        float beta = accumulate ? 1.0f : 0.5f;
        float *a = rand_array(R * m, 1), *b = rand_array(R * n, 1), *c = rand_array(G * m * n, 1);
        double *want = malloc((size_t)(G * m * n) * sizeof(double));
        for (int g = 0; g < G; g++)
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) {
                    double sum = 0.0;
                    for (int64_t r = first[g]; r < first[g + 1]; r++)
                        sum += (double)a[r * m + i] * b[r * n + j];
                    want[(g * m + i) * n + j] = sum + beta * c[(g * m + i) * n + j]; // empty groups: beta C_g
                }
        ck_assert_int_eq(dsarl_device_gemm_grouped(ops, dev, true, false, G, first, m, n, 0, 1.0f, a, b, 0, beta, c,
                                                   m * n, &err), 0);
        assert_close(c, want, G * m * n, 1e-6, accumulate ? "gemm_grouped inner, beta 1" : "gemm_grouped inner");
        free(a), free(b), free(c), free(want);
    }
    // a 1.6 table: its struct_size ends at recv; the bytes after it (here all ones) are not slots
    dsarl_device_ops old;
    memset(&old, 0xff, sizeof old);
    memcpy(&old, ops, offsetof(dsarl_device_ops, memory_info));
    old.common.struct_size = (uint32_t)offsetof(dsarl_device_ops, memory_info);
    ck_assert_ptr_null(DSARL_DEVICE_SLOT(&old, memory_info));
    ck_assert_ptr_null(DSARL_DEVICE_SLOT(&old, gemm_grouped));
    dsarl_device_profile_scope(&old, dev, "attention"); // no slot: nothing to call
    float a[4] = {1, 2, 3, 4}, b[4] = {10, 100, 1000, 10000}, c[2] = {0};
    const int64_t two[3] = {0, 1, 2}; // two groups of one row: (1, 2) x B_g (2, 1), B_g = b + 2 g
    ck_assert_int_eq(dsarl_device_gemm_grouped(&old, dev, false, false, 2, two, 0, 1, 2, 1.0f, a, b, 2, 0.0f, c, 0,
                                               &err), 0);
    ck_assert_float_eq(c[0], 1 * 10 + 2 * 100);
    ck_assert_float_eq(c[1], 3 * 1000 + 4 * 10000);
}
END_TEST

START_TEST(test_gather_scatter_rowdot)
{
    float *x = rand_array(4 * 3, 1), g[3 * 3], out[4 * 3] = {0}, scale[3] = {0.5f, -1.0f, 2.0f}, dots[3];
    int32_t rows[3] = {2, 0, 2};
    ck_assert_int_eq(cpu_gather_rows(dev, g, x, rows, 3, 3, &err), 0);
    ck_assert(g[0] == x[6] && g[3] == x[0] && g[8] == x[8]);
    ck_assert_int_eq(cpu_scatter_add_rows(dev, out, g, rows, scale, 3, 3, &err), 0);
    for (int c = 0; c < 3; c++) {
        ck_assert_float_eq_tol(out[2 * 3 + c], 2.5f * x[2 * 3 + c], 1e-6);
        ck_assert_float_eq_tol(out[0 * 3 + c], -x[c], 1e-6);
        ck_assert(out[3 + c] == 0.0f);
    }
    ck_assert_int_eq(cpu_row_dot(dev, dots, g, g, 3, 3, &err), 0);
    float before = g[4];
    ck_assert_int_eq(cpu_scale_rows(dev, g, scale, 3, 3, &err), 0);
    ck_assert(g[4] == -before && g[0] == 0.5f * x[6]);
    ck_assert_float_eq_tol(dots[1], x[0] * x[0] + x[1] * x[1] + x[2] * x[2], 1e-6);
    free(x);
}
END_TEST

/* --- log-probabilities ----------------------------------------------------------------------------------- */

typedef struct lp_case {
    float *logits, *r, *lp;
    int32_t *targets;
} lp_case;

static double lp_loss(void *p)
{
    lp_case *c = p;
    cpu_logprobs_forward(dev, c->lp, c->logits, c->targets, 4, 11, &err);
    return dot_d(c->lp, c->r, 4);
}

START_TEST(test_logprobs)
{
    int32_t targets[4] = {3, 10, -1, 0};
    lp_case c = {.logits = rand_array(44, 4), .r = rand_array(4, 1), .lp = malloc(4 * sizeof(float)),
                 .targets = targets};
    lp_loss(&c);
    for (int t = 0; t < 4; t++) {
        double z = 0;
        for (int v = 0; v < 11; v++)
            z += exp((double)c.logits[t * 11 + v]);
        double want = targets[t] < 0 ? 0.0 : c.logits[t * 11 + targets[t]] - log(z);
        ck_assert_double_eq_tol(c.lp[t], want, 1e-6);
    }
    float dl[44];
    ck_assert_int_eq(cpu_logprobs_backward(dev, dl, c.r, c.logits, targets, 4, 11, &err), 0);
    fd_check(lp_loss, &c, c.logits, 44, dl, 1e-3f, 2e-3, "logprobs dlogits");
    free(c.logits), free(c.r), free(c.lp);
}
END_TEST

START_TEST(test_ops_table_complete)
{
    // every 1.0 and 1.1 slot is implemented; of the 1.2 ones the host device has capabilities and needs neither a
    // stream (it runs each call at once) nor an availability probe (it runs wherever it loads)
    const dsarl_device_ops *ops = &dsarl_cpu_device_ops;
    ck_assert_int_eq(ops->common.struct_size, sizeof(dsarl_device_ops));
    ck_assert_str_eq(ops->common.name, "cpu");
    const char *first = (const char *)&ops->create, *end = (const char *)&ops->capabilities;
    ck_assert_uint_eq(dsarl_device_capabilities(ops), DSARL_DEVICE_CAP_HOST_MEMORY);
    ck_assert_ptr_null(ops->stream);
    ck_assert_ptr_null(ops->available);
    for (const char *p = first; p < end; p += sizeof(void (*)(void))) {
        void (*slot)(void);
        memcpy(&slot, p, sizeof slot);
        ck_assert_msg(slot != NULL, "device cpu: slot at byte %td is NULL", p - (const char *)ops);
    }
    ck_assert_int_eq(ops->storage_dtype(dev), DSARL_DTYPE_F32);
    void *buf = NULL;
    ck_assert_int_eq(ops->alloc(dev, 1000, &buf, &err), 0);
    ck_assert_int_eq((uintptr_t)buf % 256, 0);
    ops->free(dev, buf);
}
END_TEST

START_TEST(test_threads_from_recipe)
{
    dsarl_recipe *r = NULL;
    ck_assert_int_eq(dsarl_recipe_load_string("runtime:\n  threads: 2\n", "t.yaml", &r, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(r, &err), 0);
    dsarl_device_config cfg = {.struct_size = sizeof(cfg), .recipe = dsarl_recipe_root(r)};
    dsarl_device *d2 = NULL;
    ck_assert_int_eq(cpu_create(&cfg, &d2, &err), 0);
    ck_assert_int_eq(d2->threads, 2);
    cpu_destroy(d2);
    cfg.threads = 1; // an explicit count wins over the recipe
    ck_assert_int_eq(cpu_create(&cfg, &d2, &err), 0);
    ck_assert_int_eq(d2->threads, 1);
    cpu_destroy(d2);
    dsarl_recipe_free(r);
    ck_assert_int_eq(dsarl_recipe_load_string("runtime:\n  threads: -3\n", "t.yaml", &r, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(r, &err), 0);
    cfg = (dsarl_device_config){.struct_size = sizeof(cfg), .recipe = dsarl_recipe_root(r)};
    ck_assert_int_eq(cpu_create(&cfg, &d2, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "runtime.threads") && strstr(err.message, "t.yaml"), "%s", err.message);
    dsarl_recipe_free(r);
}
END_TEST

START_TEST(test_adamw_scale_sum_squares)
{
    // two AdamW steps against the formula evaluated in double (torch.optim.AdamW, decoupled weight decay)
    float p[5] = {0.5f, -1.0f, 2.0f, 0.0f, 3.0f}, g1[5] = {0.1f, -0.2f, 0.3f, 0.0f, -1.0f},
          g2[5] = {-0.3f, 0.1f, 0.2f, 0.5f, 0.0f}, m[5] = {0}, v[5] = {0};
    double pd[5], md[5] = {0}, vd[5] = {0}, lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    for (int i = 0; i < 5; i++)
        pd[i] = p[i];
    for (int step = 1; step <= 2; step++) {
        const float *g = step == 1 ? g1 : g2;
        ck_assert_int_eq(cpu_adamw_update(dev, p, p, g, m, v, 5, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step, &err), 0);
        for (int i = 0; i < 5; i++) {
            pd[i] -= lr * wd * pd[i];
            md[i] = b1 * md[i] + (1 - b1) * g[i];
            vd[i] = b2 * vd[i] + (1 - b2) * (double)g[i] * g[i];
            pd[i] -= lr * (md[i] / (1 - pow(b1, step))) / (sqrt(vd[i] / (1 - pow(b2, step))) + eps);
        }
    }
    for (int i = 0; i < 5; i++)
        ck_assert_double_eq_tol(p[i], pd[i], 1e-6);
    ck_assert_int_eq(cpu_adamw_update(dev, p, p, g1, m, v, 5, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 0, &err), DSARL_E_INVALID);
    float *x = rand_array(100, 2), ss = 0;
    double want = 0;
    for (int i = 0; i < 100; i++)
        want += (double)x[i] * x[i];
    ck_assert_int_eq(cpu_sum_squares(dev, &ss, x, 100, &err), 0);
    ck_assert_double_eq_tol(ss, want, 1e-5 * want);
    float x0 = x[7];
    ck_assert_int_eq(cpu_scale(dev, x, -0.5f, 100, &err), 0);
    ck_assert(x[7] == -0.5f * x0);
    free(x);
}
END_TEST

START_TEST(test_sample_tokens)
{
    enum { V = 4, N = 20000 };
    float logits[N * V];
    for (int t = 0; t < N; t++) {
        logits[t * V + 0] = 0.0f, logits[t * V + 1] = 1.0f, logits[t * V + 2] = -1.0f, logits[t * V + 3] = 0.5f;
    }
    int32_t *tok = malloc(N * sizeof(int32_t)), *again = malloc(N * sizeof(int32_t));
    ck_assert_int_eq(cpu_sample_tokens(dev, tok, logits, N, V, 0.0f, 1, 0, &err), 0);
    ck_assert_int_eq(tok[0], 1); // greedy
    ck_assert_int_eq(cpu_sample_tokens(dev, tok, logits, N, V, 2.0f, 42, 7, &err), 0);
    ck_assert_int_eq(cpu_sample_tokens(dev, again, logits, N, V, 2.0f, 42, 7, &err), 0);
    ck_assert_mem_eq(tok, again, N * sizeof(int32_t)); // reproducible from (seed, stream)
    int count[V] = {0};
    for (int t = 0; t < N; t++)
        count[tok[t]]++;
    double z = 0, p[V];
    for (int v = 0; v < V; v++)
        z += exp(logits[v] / 2.0);
    for (int v = 0; v < V; v++) {
        p[v] = exp(logits[v] / 2.0) / z;
        double sd = sqrt(N * p[v] * (1 - p[v]));
        ck_assert_msg(fabs(count[v] - N * p[v]) < 5 * sd, "token %d drawn %d times, expected %.0f", v, count[v],
                      N * p[v]);
    }
    free(tok), free(again);
}
END_TEST

// memory_info (ABI 1.7): total = the machine's physical memory, free = /proc/meminfo's MemAvailable, both read
// here independently from /proc/meminfo (MemTotal is the kernel's count of the same pages sysconf reports).
static long long meminfo_kib(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    ck_assert_ptr_nonnull(f);
    char name[64];
    long long v = -1, x;
    while (v < 0 && fscanf(f, "%63s %lld kB", name, &x) == 2)
        if (strcmp(name, key) == 0)
            v = x;
    fclose(f);
    return v;
}

START_TEST(test_memory_info)
{
    int (*info)(dsarl_device *, size_t *, size_t *, dsarl_error *) =
        DSARL_DEVICE_SLOT(&dsarl_cpu_device_ops, memory_info);
    ck_assert_ptr_nonnull(info);
    size_t free_bytes = 0, total = 0;
    ck_assert_msg(info(dev, &free_bytes, &total, &err) == 0, "%s", err.message);
    long long mem_total = meminfo_kib("MemTotal:"), available = meminfo_kib("MemAvailable:");
    ck_assert(mem_total > 0);
    ck_assert_msg((long long)(total / 1024) == mem_total, "total %zu bytes, /proc/meminfo MemTotal %lld kB", total,
                  mem_total);
    ck_assert(free_bytes > 0 && free_bytes <= total);
    if (available >= 0) // the machine's other processes move it between the two readings, not by 1 GiB
        ck_assert_msg(llabs((long long)(free_bytes / 1024) - available) < (1ll << 20), "free %zu bytes, "
                      "MemAvailable %lld kB", free_bytes, available);
}
END_TEST

static Suite *device_cpu_suite(void)
{
    Suite *s = suite_create("device_cpu");
    TCase *tc = tcase_create("primitives");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_gemm_all_transposes);
    tcase_add_test(tc, test_gemm_strided_batched);
    tcase_add_test(tc, test_rmsnorm);
    tcase_add_test(tc, test_layernorm);
    tcase_add_test(tc, test_rope_interleaved);
    tcase_add_test(tc, test_swiglu);
    tcase_add_test(tc, test_embedding_add_axpy_copy2d);
    tcase_add_test(tc, test_moe_route);
    tcase_add_test(tc, test_moe_group_padded);
    tcase_add_test(tc, test_gemm_grouped_fallback);
    tcase_add_test(tc, test_gather_scatter_rowdot);
    tcase_add_test(tc, test_logprobs);
    tcase_add_test(tc, test_ops_table_complete);
    tcase_add_test(tc, test_threads_from_recipe);
    tcase_add_test(tc, test_adamw_scale_sum_squares);
    tcase_add_test(tc, test_sample_tokens);
    tcase_add_test(tc, test_memory_info);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(device_cpu_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
