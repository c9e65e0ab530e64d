/* check_optim.c: AdamW (device adamw_update, model optimizer_step) against a hand-written AdamW in double and
 * against torch.optim.AdamW; the global gradient norm; buffers left alone; optimizer state save/load resuming
 * bit-identically; the recipe's optimizer keys and their refusals; the shared learning-rate schedule and clip factor
 * against values derived by hand, its key table, reader and each refusal. */
#include <check.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cpu_device.h"
#include "cpu_model_fixture.h"
#include "dsa_reference.h"
#include "dsarl/optimizer.h"
#include "dsarl/rng.h"
#include "dsarl/safetensors.h"
#include "glm5_ops.h"
#include "recipe_internal.h"

static dsarl_error err;

// The textbook AdamW of Loshchilov & Hutter as torch documents it, in double.
static void adamw_reference(double *p, const double *g, double *m, double *v, int64_t n, double lr, double b1,
                            double b2, double eps, double wd, int64_t step)
{
    for (int64_t i = 0; i < n; i++) {
        p[i] -= lr * wd * p[i];
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        double mhat = m[i] / (1 - pow(b1, (double)step)), vhat = v[i] / (1 - pow(b2, (double)step));
        p[i] -= lr * mhat / (sqrt(vhat) + eps);
    }
}

static void fill_normal(dsarl_rng *rng, float *x, int64_t n, float scale)
{
    dsarl_rng_fill_normal(rng, x, (size_t)n);
    for (int64_t i = 0; i < n; i++)
        x[i] *= scale;
}

START_TEST(test_device_adamw_matches_double_reference)
{
    enum { N = 1000, STEPS = 6 };
    dsarl_rng rng;
    dsarl_rng_init(&rng, 1234, 7);
    float master[N], weight[N], m[N] = {0}, v[N] = {0}, g[N];
    double pd[N], md[N] = {0}, vd[N] = {0}, gd[N];
    fill_normal(&rng, master, N, 1.0f);
    for (int i = 0; i < N; i++)
        pd[i] = master[i];
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, scale = 0.37f;
    for (int64_t s = 1; s <= STEPS; s++) {
        fill_normal(&rng, g, N, 0.5f);
        for (int i = 0; i < N; i++)
            gd[i] = (double)g[i] * scale;
        // a separate storage buffer gets the master written back
        ck_assert_int_eq(cpu_adamw_update(NULL, master, weight, g, m, v, N, lr, b1, b2, eps, wd, scale, s, &err), 0);
        adamw_reference(pd, gd, md, vd, N, lr, b1, b2, eps, wd, s);
    }
    double worst = 0;
    for (int i = 0; i < N; i++) {
        worst = fmax(worst, fabs(master[i] - pd[i]) / (1e-3 + fabs(pd[i])));
        ck_assert_float_eq(weight[i], master[i]);
    }
    ck_assert_msg(worst < 2e-6, "AdamW differs from the double reference by %g (relative)", worst);
    // the update moved every value (a no-op would fail above only by chance)
    ck_assert_int_ne(memcmp(m, (float[N]){0}, sizeof m), 0);
    ck_assert_int_eq(cpu_adamw_update(NULL, master, NULL, g, m, v, N, lr, b1, b2, eps, wd, 1.0f, 0, &err),
                     DSARL_E_INVALID);
}
END_TEST

/* ------------------------------------------------------------------------------------------------------------
 * The model's optimizer on a tiny GLM-5.2. */

static const char *recipe_text =
    "policy:\n"
    "  model_config:\n"
    "    vocab_size: 40\n    hidden_size: 16\n    intermediate_size: 24\n    moe_intermediate_size: 6\n"
    "    num_hidden_layers: 2\n    num_attention_heads: 2\n    num_key_value_heads: 2\n    q_lora_rank: 12\n"
    "    kv_lora_rank: 8\n    qk_nope_head_dim: 4\n    qk_rope_head_dim: 4\n    v_head_dim: 6\n"
    "    n_routed_experts: 4\n    num_experts_per_tok: 2\n    n_group: 2\n    topk_group: 2\n    index_topk: 3\n"
    "    index_head_dim: 8\n    index_n_heads: 2\n    first_k_dense_replace: 1\n"
    "    n_shared_experts: 1\n    initializer_range: 0.2\n"
    "  megatron_cfg:\n    model_overrides:\n      dsa_indexer_loss_coeff: 0.01\n";

typedef cpu_model_fixture fixture;

static const dsarl_model_ops *ops = &glm5_2_model_ops;

static void fixture_open(fixture *f, uint64_t seed)
{
    cpu_model_fixture_open(f, ops, recipe_text, "optim.yaml", seed);
}

static void fixture_close(fixture *f) { cpu_model_fixture_close(f); }

enum { T = 9 };
static const int32_t cu[3] = {0, 5, 9};

// Accumulates gradients of a random linear function of the log-probs on random tokens drawn from rng.
static void random_backward(fixture *f, dsarl_rng *rng)
{
    int32_t tokens[T], targets[T];
    float dlp[T];
    for (int t = 0; t < T; t++) {
        tokens[t] = (int32_t)dsarl_rng_below(rng, 40);
        targets[t] = (int32_t)dsarl_rng_below(rng, 40);
        dlp[t] = dsarl_rng_uniform(rng) - 0.3f;
    }
    dsarl_token_batch b = {.struct_size = sizeof b, .n_tokens = T, .n_sequences = 2, .tokens = tokens,
                           .cu_seqlens = cu};
    ck_assert_int_eq(ops->zero_grad(f->model, &err), 0);
    ck_assert_msg(ops->backward(f->model, &b, targets, dlp, NULL, &err) == 0, "%s", err.message);
}

typedef struct host_copy {
    int64_t n;
    float *values[64], *grads[64];
    int64_t numel[64];
    int trainable[64];
} host_copy;

static void host_copy_read(fixture *f, host_copy *h)
{
    h->n = ops->parameter_tensors(f->model);
    ck_assert_int_le(h->n, 64);
    for (int64_t i = 0; i < h->n; i++) {
        int32_t ndim;
        int64_t shape[3];
        ck_assert_int_eq(ops->parameter_info(f->model, i, NULL, &ndim, shape, &h->trainable[i], &err), 0);
        h->numel[i] = shape[0] * (ndim > 1 ? shape[1] : 1) * (ndim > 2 ? shape[2] : 1);
        h->values[i] = malloc((size_t)h->numel[i] * sizeof(float));
        h->grads[i] = malloc((size_t)h->numel[i] * sizeof(float));
        ck_assert_int_eq(ops->read_parameter(f->model, i, h->values[i], h->grads[i], &err), 0);
    }
}

static void host_copy_free(host_copy *h)
{
    for (int64_t i = 0; i < h->n; i++)
        free(h->values[i]), free(h->grads[i]);
}

START_TEST(test_model_step_norm_and_buffers)
{
    fixture f;
    fixture_open(&f, 5);
    dsarl_rng rng;
    dsarl_rng_init(&rng, 99, 0);
    ck_assert_int_eq(ops->optimizer_steps(f.model), 0);
    // reference state per tensor, in double
    host_copy start;
    random_backward(&f, &rng);
    host_copy_read(&f, &start);
    double *p[64], *m[64], *v[64];
    for (int64_t i = 0; i < start.n; i++) {
        p[i] = calloc((size_t)start.numel[i], sizeof(double));
        m[i] = calloc((size_t)start.numel[i], sizeof(double));
        v[i] = calloc((size_t)start.numel[i], sizeof(double));
        for (int64_t j = 0; j < start.numel[i]; j++)
            p[i][j] = start.values[i][j];
    }
    int buffers = 0;
    dsarl_optimizer_params hp = {.struct_size = sizeof hp, .lr = 2e-3, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8,
                                 .weight_decay = 0.05};
    for (int64_t s = 1; s <= 3; s++) {
        if (s > 1)
            random_backward(&f, &rng);
        host_copy now;
        host_copy_read(&f, &now);
        // the norm over trainable gradients only, from the host copies in double
        double sq = 0;
        for (int64_t i = 0; i < now.n; i++)
            for (int64_t j = 0; now.trainable[i] && j < now.numel[i]; j++)
                sq += (double)now.grads[i][j] * now.grads[i][j];
        double norm = 0;
        ck_assert_int_eq(ops->grad_norm(f.model, &norm, &err), 0);
        ck_assert_msg(norm > 0 && fabs(norm - sqrt(sq)) <= 1e-6 * sqrt(sq), "grad_norm %g, expected %g", norm,
                      sqrt(sq));
        hp.grad_scale = fmin(1.0, 0.5 / (norm + 1e-6)); // clipping to 0.5
        ck_assert_int_eq(ops->optimizer_step(f.model, &hp, &err), 0);
        for (int64_t i = 0; i < now.n; i++) {
            if (!now.trainable[i])
                continue;
            double *g = malloc((size_t)now.numel[i] * sizeof(double));
            for (int64_t j = 0; j < now.numel[i]; j++)
                g[j] = (double)now.grads[i][j] * (float)hp.grad_scale;
            adamw_reference(p[i], g, m[i], v[i], now.numel[i], hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay,
                            s);
            free(g);
        }
        host_copy_free(&now);
    }
    ck_assert_int_eq(ops->optimizer_steps(f.model), 3);
    host_copy end;
    host_copy_read(&f, &end);
    double worst = 0;
    for (int64_t i = 0; i < end.n; i++) {
        if (!end.trainable[i]) {
            buffers++;
            ck_assert_int_eq(memcmp(end.values[i], start.values[i], (size_t)end.numel[i] * sizeof(float)), 0);
            continue;
        }
        for (int64_t j = 0; j < end.numel[i]; j++)
            worst = fmax(worst, fabs(end.values[i][j] - p[i][j]) / (1e-2 + fabs(p[i][j])));
    }
    ck_assert_int_gt(buffers, 0); // the MoE layer's e_score_correction_bias is a buffer
    ck_assert_msg(worst < 1e-5, "model AdamW differs from the double reference by %g (relative)", worst);
    for (int64_t i = 0; i < start.n; i++)
        free(p[i]), free(m[i]), free(v[i]);
    host_copy_free(&start);
    host_copy_free(&end);
    // bad hyper-parameters are refused before anything moves
    hp.beta1 = 1.0;
    ck_assert_int_eq(ops->optimizer_step(f.model, &hp, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "betas"));
    fixture_close(&f);
}
END_TEST

// Model weights as one flat host array.
static float *flat_weights(fixture *f, int64_t *total)
{
    int64_t n = ops->parameter_tensors(f->model), sum = 0;
    float *all = NULL;
    for (int pass = 0; pass < 2; pass++) {
        int64_t off = 0;
        for (int64_t i = 0; i < n; i++) {
            int32_t ndim;
            int64_t shape[3];
            ck_assert_int_eq(ops->parameter_info(f->model, i, NULL, &ndim, shape, NULL, &err), 0);
            int64_t numel = shape[0] * (ndim > 1 ? shape[1] : 1) * (ndim > 2 ? shape[2] : 1);
            if (pass == 1)
                ck_assert_int_eq(ops->read_parameter(f->model, i, all + off, NULL, &err), 0);
            off += numel;
        }
        if (pass == 0) {
            sum = off;
            all = malloc((size_t)sum * sizeof(float));
        }
    }
    *total = sum;
    return all;
}

START_TEST(test_optimizer_state_round_trip_bit_identical)
{
    char dir[] = "/tmp/dsarl_optim_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char weights[256], state[256];
    snprintf(weights, sizeof weights, "%s/weights", dir);
    snprintf(state, sizeof state, "%s/optimizer.safetensors", dir);
    dsarl_optimizer_params hp = {.struct_size = sizeof hp, .lr = 1e-2, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6,
                                 .weight_decay = 0.1, .grad_scale = 1.0};
    fixture a, b;
    fixture_open(&a, 21);
    dsarl_rng rng;
    dsarl_rng_init(&rng, 3, 1);
    for (int s = 0; s < 2; s++) {
        random_backward(&a, &rng);
        ck_assert_int_eq(ops->optimizer_step(a.model, &hp, &err), 0);
    }
    ck_assert_msg(ops->save(a.model, weights, &err) == 0, "%s", err.message);
    ck_assert_msg(ops->optimizer_save(a.model, state, &err) == 0, "%s", err.message);
    // b starts from a different random init and takes the saved state
    fixture_open(&b, 22);
    ck_assert_msg(ops->load_weights(b.model, weights, &err) == 0, "%s", err.message);
    ck_assert_msg(ops->optimizer_load(b.model, state, &err) == 0, "%s", err.message);
    ck_assert_int_eq(ops->optimizer_steps(b.model), 2);
    dsarl_rng rng_b = rng;
    for (int s = 0; s < 2; s++) {
        random_backward(&a, &rng);
        ck_assert_int_eq(ops->optimizer_step(a.model, &hp, &err), 0);
        random_backward(&b, &rng_b);
        ck_assert_int_eq(ops->optimizer_step(b.model, &hp, &err), 0);
    }
    int64_t na, nb;
    float *wa = flat_weights(&a, &na), *wb = flat_weights(&b, &nb);
    ck_assert_int_eq(na, nb);
    ck_assert_msg(memcmp(wa, wb, (size_t)na * sizeof(float)) == 0, "resumed weights differ from the uninterrupted run");
    free(wa), free(wb);
    // a state file of another shape is refused naming the tensor, and the loaded state is kept
    dsarl_tensor t;
    float one = 1;
    int64_t shape1 = 1;
    ck_assert_int_eq(dsarl_tensor_init(&t, &one, DSARL_DTYPE_F32, 1, &shape1, DSARL_DEVICE_CPU, &err), 0);
    dsarl_safetensors_entry e = {.name = "exp_avg.model.embed_tokens.weight", .tensor = t};
    char bad[256];
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    ck_assert_int_eq(dsarl_safetensors_write(bad, &e, 1, NULL, 0, &err), 0);
    ck_assert_int_ne(ops->optimizer_load(b.model, bad, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.message, "bad.safetensors"));
    ck_assert_int_eq(ops->optimizer_steps(b.model), 4);
    fixture_close(&a);
    fixture_close(&b);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* ------------------------------------------------------------------------------------------------------------
 * torch.optim.AdamW, when torch is importable. */

static const char *torch_script =
    "import sys, numpy as np, torch\n"
    "d, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])\n"
    "lr, b1, b2, eps, wd = map(float, sys.argv[4:9])\n"
    "p = torch.nn.Parameter(torch.from_numpy(np.fromfile(d + '/p0.bin', dtype=np.float32)))\n"
    "g = np.fromfile(d + '/g.bin', dtype=np.float32).reshape(steps, n)\n"
    "opt = torch.optim.AdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, foreach=False)\n"
    "for s in range(steps):\n"
    "    p.grad = torch.from_numpy(g[s].copy())\n"
    "    opt.step()\n"
    "p.detach().numpy().tofile(d + '/p_torch.bin')\n";

START_TEST(test_device_adamw_matches_torch)
{
    if (system("python3 -c 'import torch, numpy' >/dev/null 2>&1") != 0) {
        fprintf(stderr, "check_optim: torch not importable, torch.optim.AdamW comparison skipped\n");
        return;
    }
    enum { N = 777, STEPS = 5 };
    char dir[] = "/tmp/dsarl_torch_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    dsarl_rng rng;
    dsarl_rng_init(&rng, 2024, 3);
    static float p[N], m[N], v[N], g[STEPS][N], pt[N];
    memset(m, 0, sizeof m), memset(v, 0, sizeof v);
    fill_normal(&rng, p, N, 1.0f);
    for (int s = 0; s < STEPS; s++)
        fill_normal(&rng, g[s], N, 0.1f);
    char path[300];
    snprintf(path, sizeof path, "%s/p0.bin", dir);
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    ck_assert_int_eq(fwrite(p, sizeof p, 1, fp), 1);
    fclose(fp);
    snprintf(path, sizeof path, "%s/g.bin", dir);
    fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    ck_assert_int_eq(fwrite(g, sizeof g, 1, fp), 1);
    fclose(fp);
    snprintf(path, sizeof path, "%s/adamw.py", dir);
    fp = fopen(path, "w");
    ck_assert_ptr_nonnull(fp);
    fputs(torch_script, fp);
    fclose(fp);
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "python3 %s %s %d %d %.9g %.9g %.9g %.9g %.9g", path, dir, N, STEPS, lr, b1, b2, eps,
             wd);
    ck_assert_int_eq(system(cmd), 0);
    for (int s = 0; s < STEPS; s++)
        ck_assert_int_eq(cpu_adamw_update(NULL, p, p, g[s], m, v, N, lr, b1, b2, eps, wd, 1.0f, s + 1, &err), 0);
    snprintf(path, sizeof path, "%s/p_torch.bin", dir);
    fp = fopen(path, "rb");
    ck_assert_ptr_nonnull(fp);
    ck_assert_int_eq(fread(pt, sizeof pt, 1, fp), 1);
    fclose(fp);
    double worst = 0;
    for (int i = 0; i < N; i++)
        worst = fmax(worst, fabs((double)p[i] - pt[i]));
    ck_assert_msg(worst < 1e-6, "AdamW differs from torch.optim.AdamW by %g", worst);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* ------------------------------------------------------------------------------------------------------------
 * Recipe keys. */

static int params_from(const char *yaml, dsarl_optimizer_params *p)
{
    dsarl_recipe *r = NULL;
    ck_assert_int_eq(dsarl_recipe_load_string(yaml, "opt.yaml", &r, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(r, &err), 0);
    int rc = dsarl_optimizer_params_from_recipe(dsarl_recipe_root(r), p, &err);
    dsarl_recipe_free(r);
    return rc;
}

START_TEST(test_recipe_keys)
{
    dsarl_optimizer_params p;
    ck_assert_int_eq(params_from("policy: {megatron_cfg: {optimizer: {lr: 0.25, adam_beta2: 0.95, weight_decay: 0.1, "
                                 "adam_eps: 1.0e-6}}}\n", &p), 0);
    ck_assert(p.lr == 0.25 && p.beta1 == 0.9 && p.beta2 == 0.95 && p.weight_decay == 0.1 && p.eps == 1e-6 &&
              p.grad_scale == 1.0);
    ck_assert_int_eq(params_from("a: 1\n", &p), 0);
    ck_assert(p.lr == 5e-6 && p.weight_decay == 0.01 && p.beta2 == 0.999 && p.eps == 1e-8);
    static const struct {
        const char *yaml, *key;
    } bad[] = {
        {"policy: {megatron_cfg: {optimizer: {adam_beta1: 1.0}}}\n", "adam_beta1"},
        {"policy: {megatron_cfg: {optimizer: {adam_beta2: -0.1}}}\n", "adam_beta2"},
        {"policy: {megatron_cfg: {optimizer: {adam_eps: 0}}}\n", "adam_eps"},
        {"policy: {megatron_cfg: {optimizer: {weight_decay: -1}}}\n", "weight_decay"},
        {"policy: {megatron_cfg: {optimizer: {optimizer: sgd}}}\n", "optimizer.optimizer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_ne(params_from(bad[i].yaml, &p), 0);
        ck_assert_msg(strstr(err.message, bad[i].key) && strstr(err.message, "opt.yaml:1"), "%s", err.message);
    }
    size_t n = 0;
    const dsarl_key_spec *keys = dsarl_optimizer_keys(&n);
    ck_assert_int_eq(n, 6);
    ck_assert_str_eq(keys[1].path, "policy.megatron_cfg.optimizer.weight_decay");
    bool guard_key = false; // the non-finite step guard is read with the optimizer's keys
    for (size_t i = 0; i < n; i++)
        guard_key |= strcmp(keys[i].path, "policy.max_consecutive_nonfinite_steps") == 0;
    ck_assert(guard_key);
}
END_TEST

/* ------------------------------------------------------------------------------------------------------------
 * Learning-rate schedule and gradient clip (dsarl_lr_schedule). */

static void assert_lr(const dsarl_lr_schedule *s, int64_t step, double want)
{
    double got = dsarl_lr_at(s, step);
    ck_assert_msg(fabs(got - want) <= 1e-12 + 1e-9 * want, "lr at step %lld: got %.12g want %.12g", (long long)step,
                  got, want);
}

/* lr 1e-3, min 1e-4, warm-up from 0 over 10 steps, decay to step 110:
 *   warm-up: step 0 -> 0, 5 -> 5e-4, 10 -> 1e-3 (the last warm-up step reaches the peak)
 *   linear: step 60 is half way ((60 - 10) / 100) -> 1e-4 + 0.5 * 9e-4 = 5.5e-4; step 35 (a quarter) ->
 *           1e-4 + 0.75 * 9e-4 = 7.75e-4; step 110 -> 1e-4; after -> 1e-4 (the min_lr floor)
 *   cosine: step 60 -> coeff 0.5 (cos(pi/2) + 1) = 0.5 -> 5.5e-4; step 35 (a quarter) -> coeff
 *           0.5 (cos(pi/4) + 1) = 0.8535533906 -> 1e-4 + 0.8535533906 * 9e-4 = 8.682e-4
 *   constant: the peak after warm-up, forever. */
START_TEST(test_lr_schedule_by_hand)
{
    dsarl_lr_schedule s = {.struct_size = sizeof s, .lr = 1e-3, .min_lr = 1e-4, .warmup_init = 0.0,
                           .warmup_iters = 10, .decay_iters = 110, .decay_style = DSARL_LR_LINEAR};
    assert_lr(&s, 0, 0.0);
    assert_lr(&s, 5, 5e-4);
    assert_lr(&s, 10, 1e-3);
    assert_lr(&s, 35, 7.75e-4);
    assert_lr(&s, 60, 5.5e-4);
    assert_lr(&s, 110, 1e-4);
    assert_lr(&s, 500, 1e-4);
    s.decay_style = DSARL_LR_COSINE;
    assert_lr(&s, 60, 5.5e-4);
    assert_lr(&s, 35, 1e-4 + 0.8535533905932737 * 9e-4);
    assert_lr(&s, 110, 1e-4);
    assert_lr(&s, 111, 1e-4);
    s.decay_style = DSARL_LR_CONSTANT;
    assert_lr(&s, 11, 1e-3);
    assert_lr(&s, 100000, 1e-3);
    // Warm-up from lr_warmup_init (the tiny recipes: 1e-4 -> 1e-3 over 2 steps): 1e-4, 5.5e-4, 1e-3.
    dsarl_lr_schedule tiny = {.struct_size = sizeof tiny, .lr = 1e-3, .min_lr = 1e-3, .warmup_init = 1e-4,
                              .warmup_iters = 2, .decay_iters = 1000, .decay_style = DSARL_LR_CONSTANT};
    assert_lr(&tiny, 0, 1e-4);
    assert_lr(&tiny, 1, 5.5e-4);
    assert_lr(&tiny, 2, 1e-3);
    // No warm-up: linear decay starts at the peak.
    dsarl_lr_schedule nowarm = {.struct_size = sizeof nowarm, .lr = 2.0, .min_lr = 0.0, .warmup_iters = 0,
                                .decay_iters = 4, .decay_style = DSARL_LR_LINEAR};
    assert_lr(&nowarm, 0, 2.0);
    assert_lr(&nowarm, 1, 1.5);
    assert_lr(&nowarm, 4, 0.0);
}
END_TEST

/* clip factor = min(1, max_norm / (norm + 1e-6)): norm 2, max 1 -> 1 / 2.000001; norm 0.5 -> 1; max 0 -> off. */
START_TEST(test_grad_clip_by_hand)
{
    double scale;
    ck_assert_int_eq(dsarl_grad_clip_scale(2.0, 1.0, &scale, &err), 0);
    ck_assert(fabs(scale - 1.0 / 2.000001) < 1e-15);
    ck_assert_int_eq(dsarl_grad_clip_scale(3.0, 0.3, &scale, &err), 0);
    ck_assert(fabs(scale - 0.3 / 3.000001) < 1e-15);
    ck_assert_int_eq(dsarl_grad_clip_scale(0.5, 1.0, &scale, &err), 0);
    ck_assert(scale == 1.0);
    ck_assert_int_eq(dsarl_grad_clip_scale(1e9, 0.0, &scale, &err), 0);
    ck_assert(scale == 1.0);
    ck_assert_int_eq(dsarl_grad_clip_scale(NAN, 1.0, &scale, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "gradient norm"));
    ck_assert_int_eq(dsarl_grad_clip_scale(INFINITY, 1.0, &scale, &err), DSARL_E_INVALID);
}
END_TEST

static const dsarl_lr_schedule test_defaults = {.struct_size = sizeof(dsarl_lr_schedule), .lr = 5.0e-6,
                                                .min_lr = 5.0e-7, .warmup_init = 5.0e-7, .warmup_iters = 13,
                                                .decay_iters = 1, .decay_style = DSARL_LR_CONSTANT,
                                                .max_grad_norm = 1.0};

/* Reads (and, when validate, checks) a schedule from yaml with test_defaults and 100 steps. */
static int schedule_from(const char *yaml, bool validate, dsarl_lr_schedule *s)
{
    dsarl_recipe *r = NULL;
    ck_assert_int_eq(dsarl_recipe_load_string(yaml, "sched.yaml", &r, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(r, &err), 0);
    int rc = dsarl_lr_schedule_from_recipe(dsarl_recipe_root(r), &test_defaults, 100, s, &err);
    if (rc == 0 && validate)
        rc = dsarl_lr_schedule_validate(dsarl_recipe_root(r), s, "algo.max_num_steps", &err);
    dsarl_recipe_free(r);
    return rc;
}

START_TEST(test_lr_schedule_recipe)
{
    dsarl_lr_schedule s;
    // Absent keys: the caller's defaults, decay over the caller's step count, clip = policy.max_grad_norm default.
    ck_assert_int_eq(schedule_from("a: 1\n", true, &s), 0);
    ck_assert(s.struct_size == sizeof s && s.lr == 5e-6 && s.min_lr == 5e-7 && s.warmup_init == 5e-7);
    ck_assert(s.warmup_iters == 13 && s.decay_iters == 100 && s.decay_style == DSARL_LR_CONSTANT);
    ck_assert(s.max_grad_norm == 1.0);
    ck_assert_int_eq(schedule_from("policy: {max_grad_norm: 0.5, megatron_cfg: {optimizer: {lr: 3.0e-4, "
                                   "min_lr: 1.0e-5}, scheduler: {lr_decay_style: cosine, lr_decay_iters: 200, "
                                   "lr_warmup_iters: 10, lr_warmup_init: 0.0}}}\n", true, &s), 0);
    ck_assert(s.lr == 3e-4 && s.min_lr == 1e-5 && s.warmup_init == 0.0 && s.warmup_iters == 10);
    ck_assert(s.decay_iters == 200 && s.decay_style == DSARL_LR_COSINE && s.max_grad_norm == 0.5);
    // clip_grad wins over policy.max_grad_norm; a null max_grad_norm turns clipping off; null decay = the steps.
    ck_assert_int_eq(schedule_from("policy: {max_grad_norm: 0.5, megatron_cfg: {optimizer: {clip_grad: 2.0}, "
                                   "scheduler: {lr_decay_style: linear}}}\n", true, &s), 0);
    ck_assert(s.max_grad_norm == 2.0 && s.decay_style == DSARL_LR_LINEAR);
    ck_assert_int_eq(schedule_from("policy: {max_grad_norm: null, megatron_cfg: {scheduler: {lr_decay_iters: null}}}"
                                   "\n", true, &s), 0);
    ck_assert(s.max_grad_norm == 0.0 && s.decay_iters == 100);

    static const struct {
        const char *yaml, *key, *words;
        int code;
    } bad[] = {
        {"policy: {megatron_cfg: {scheduler: {lr_decay_style: WSD}}}\n", "scheduler.lr_decay_style",
         "'WSD' is not supported yet; use constant, linear or cosine", DSARL_E_UNSUPPORTED},
        {"policy: {megatron_cfg: {scheduler: {lr_decay_style: step}}}\n", "scheduler.lr_decay_style",
         "must be constant, linear, cosine, inverse-square-root or WSD, got 'step'", DSARL_E_INVALID},
        {"policy: {max_grad_norm: -1.0}\n", "policy.max_grad_norm", "must be >= 0 or null (no clipping), got -1",
         DSARL_E_INVALID},
        {"policy: {megatron_cfg: {optimizer: {clip_grad: -2.0}}}\n", "optimizer.clip_grad",
         "must be >= 0 or null (no clipping), got -2", DSARL_E_INVALID},
        {"policy: {megatron_cfg: {optimizer: {lr: 0.0}}}\n", "optimizer.lr", "must be a finite number > 0, got 0",
         DSARL_E_INVALID},
        {"policy: {megatron_cfg: {optimizer: {lr: .inf}}}\n", "optimizer.lr", "must be a finite number > 0, got inf",
         DSARL_E_INVALID},
        {"policy: {megatron_cfg: {optimizer: {min_lr: 1.0e-5}}}\n", "optimizer.min_lr",
         "must be in [0, lr = 5e-06], got 1e-05", DSARL_E_INVALID},
        {"policy: {megatron_cfg: {optimizer: {min_lr: -1.0}}}\n", "optimizer.min_lr", "must be in [0, lr = 5e-06]",
         DSARL_E_INVALID},
        {"policy: {megatron_cfg: {scheduler: {lr_warmup_init: 1.0}}}\n", "scheduler.lr_warmup_init",
         "must be in [0, lr = 5e-06], got 1", DSARL_E_INVALID},
        {"policy: {megatron_cfg: {scheduler: {lr_warmup_iters: -1}}}\n", "scheduler.lr_warmup_iters",
         "must be >= 0, got -1", DSARL_E_INVALID},
        {"policy: {megatron_cfg: {scheduler: {lr_decay_iters: 0}}}\n", "scheduler.lr_decay_iters",
         "must be > 0 (lr_decay_iters), got 0", DSARL_E_INVALID},
        {"policy: {megatron_cfg: {scheduler: {lr_warmup_iters: 100}}}\n", "scheduler.lr_warmup_iters",
         "(100) must be smaller than the decay length 100 (Megatron's scheduler requires it)", DSARL_E_INVALID},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(schedule_from(bad[i].yaml, true, &s), bad[i].code);
        ck_assert_msg(strstr(err.message, bad[i].key) && strstr(err.message, bad[i].words) &&
                          strstr(err.message, "sched.yaml:1"),
                      "case %zu: %s", i, err.message);
    }
    // A decay length of 0 that comes from the step count names the step-count key the caller gave.
    dsarl_recipe *r = NULL;
    ck_assert_int_eq(dsarl_recipe_load_string("a: 1\n", "sched.yaml", &r, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(r, &err), 0);
    dsarl_lr_schedule no_warmup = test_defaults;
    no_warmup.warmup_iters = 0;
    ck_assert_int_eq(dsarl_lr_schedule_from_recipe(dsarl_recipe_root(r), &no_warmup, 0, &s, &err), 0);
    ck_assert_int_eq(dsarl_lr_schedule_validate(dsarl_recipe_root(r), &s, "algo.max_num_steps", &err),
                     DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "algo.max_num_steps") && strstr(err.message, "must be > 0"), "%s", err.message);
    dsarl_recipe_free(r);
}
END_TEST

/* The key table writes its default strings from the caller's defaults, as the hand-written tables spelt them. */
START_TEST(test_lr_schedule_keys)
{
    dsarl_lr_schedule_key_table table;
    size_t n = 0;
    dsarl_lr_schedule d = test_defaults;
    d.decay_style = DSARL_LR_COSINE;
    const dsarl_key_spec *k = dsarl_lr_schedule_keys(&d, "algo.max_num_steps", &table, &n);
    ck_assert_int_eq(n, DSARL_LR_SCHEDULE_N_KEYS);
    static const char *const want[][2] = {
        {"policy.max_grad_norm", "1.0"},
        {"policy.megatron_cfg.optimizer.lr", "5.0e-6"},
        {"policy.megatron_cfg.optimizer.min_lr", "5.0e-7"},
        {"policy.megatron_cfg.optimizer.clip_grad", "null"},
        {"policy.megatron_cfg.scheduler.lr_decay_style", "cosine"},
        {"policy.megatron_cfg.scheduler.lr_decay_iters", "null"},
        {"policy.megatron_cfg.scheduler.lr_warmup_iters", "13"},
        {"policy.megatron_cfg.scheduler.lr_warmup_init", "5.0e-7"},
    };
    for (size_t i = 0; i < n; i++) {
        ck_assert_str_eq(k[i].path, want[i][0]);
        ck_assert_str_eq(k[i].default_value, want[i][1]);
        ck_assert(k[i].doc && k[i].doc[0]);
    }
    ck_assert_ptr_nonnull(strstr(k[5].doc, "null = algo.max_num_steps"));
    d.warmup_init = 0.0;
    d.lr = 3.0e-4;
    d.max_grad_norm = 0.25;
    k = dsarl_lr_schedule_keys(&d, "x", &table, &n);
    ck_assert_str_eq(k[7].default_value, "0.0");
    ck_assert_str_eq(k[1].default_value, "0.0003");
    ck_assert_str_eq(k[0].default_value, "0.25");
}
END_TEST

static Suite *optim_suite(void)
{
    Suite *s = suite_create("optim");
    TCase *tc = tcase_create("adamw");
    tcase_add_test(tc, test_device_adamw_matches_double_reference);
    tcase_add_test(tc, test_model_step_norm_and_buffers);
    tcase_add_test(tc, test_optimizer_state_round_trip_bit_identical);
    tcase_add_test(tc, test_device_adamw_matches_torch);
    tcase_add_test(tc, test_recipe_keys);
    tcase_add_test(tc, test_lr_schedule_by_hand);
    tcase_add_test(tc, test_grad_clip_by_hand);
    tcase_add_test(tc, test_lr_schedule_recipe);
    tcase_add_test(tc, test_lr_schedule_keys);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(optim_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
