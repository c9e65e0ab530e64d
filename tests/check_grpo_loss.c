/* check_grpo_loss.c: ClippedPGLoss (algorithms/grpo/grpo_loss.c) against values derived by hand in the comments,
 * and its per-token gradient against central finite differences of the loss itself on fresh random inputs.
 *
 * NeMo's stop-gradients (lp_old = sg(lp) under force_on_policy_ratio, w_kl = exp(lp - sg(lp))) make the autograd
 * gradient differ from the derivative of the loss value; grpo_clipped_pg_loss_detached takes the sg values
 * separately, so the finite differences perturb lp_theta with the sg copy held fixed, which is exactly what
 * autograd differentiates. Tokens within a step of a kink (a clip or clamp boundary) are skipped by the random
 * checks; the hand cases put tokens deliberately inside every clipped region. DSARL_TEST_SEED fixes the seed. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grpo.h"

#define MAX_T 512
#define MAX_S 64

static uint64_t test_seed, rng_state;

static uint32_t next_u32(void) /* xorshift64*: a test-only generator */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1DULL) >> 32);
}

static double uniform(double lo, double hi)
{
    return lo + (hi - lo) * (next_u32() / 4294967296.0);
}

static double normal(void)
{
    double u = uniform(1e-12, 1.0), v = uniform(0.0, 1.0);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static void seed_rng(void)
{
    const char *env = getenv("DSARL_TEST_SEED");
    test_seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
    rng_state = test_seed * 0x9E3779B97F4A7C15ULL + 1;
}

/* A packed batch owned by the test. */
typedef struct batch {
    int64_t T, S;
    int32_t cu[MAX_S + 1];
    float lp[MAX_T], old[MAX_T], gen[MAX_T], ref[MAX_T], tok[MAX_T];
    float sample[MAX_S], adv[MAX_S];
    float tadv[MAX_T], reward[MAX_S]; /* per-token advantages and rewards, passed when use_tadv / use_rewards */
    bool use_tadv, use_rewards;
} batch;

/* Appends a sequence of n tokens with advantage adv; its token values are filled by the caller. */
static int64_t add_seq(batch *b, int64_t n, float adv)
{
    if (b->S == 0)
        b->cu[0] = 0;
    int64_t t0 = b->T;
    b->adv[b->S] = adv;
    b->sample[b->S] = 1.0f;
    b->T += n;
    b->S++;
    b->cu[b->S] = b->T;
    for (int64_t t = t0; t < b->T; t++)
        b->tok[t] = 1.0f;
    return t0;
}

/* Sets token t's ratio r = exp(lp - old) with lp_old = old_lp, and lp_gen = lp_ref = old_lp. */
static void set_ratio(batch *b, int64_t t, double old_lp, double r)
{
    b->old[t] = (float)old_lp;
    b->lp[t] = (float)(old_lp + log(r));
    b->gen[t] = (float)old_lp;
    b->ref[t] = (float)old_lp;
}

static grpo_loss_inputs inputs_of(const batch *b)
{
    grpo_loss_inputs in = {.n_tokens = b->T, .n_seqs = b->S, .cu_seqlens = b->cu, .lp_theta = b->lp,
                           .lp_old = b->old, .lp_gen = b->gen, .lp_ref = b->ref, .token_mask = b->tok,
                           .sample_mask = b->sample, .advantages = b->adv,
                           .token_advantages = b->use_tadv ? b->tadv : NULL, .rewards = b->use_rewards ? b->reward : NULL};
    grpo_count_valid(&in, &in.global_valid_toks, &in.global_valid_seqs);
    in.global_positive_toks = grpo_count_positive_toks(&in);
    return in;
}

/* Plain clipped PG: no KL, no importance sampling. */
static grpo_loss_config plain_config(void)
{
    return (grpo_loss_config){.ratio_clip_min = 0.2, .ratio_clip_max = 0.2, .reference_policy_kl_penalty = 0.0,
                              .kl_type = GRPO_KL_K3, .kl_input_clamp_value = 20.0, .kl_output_clamp_value = 10.0,
                              .truncation_ratio = INFINITY, .token_level_loss = true};
}

static void assert_close(double got, double want, double tol, const char *what)
{
    ck_assert_msg(fabs(got - want) <= tol * (1.0 + fabs(want)), "%s: got %.10g, want %.10g (seed %llu)", what, got,
                  want, (unsigned long long)test_seed);
}

/* ------------------------------------------------------------------------------------------------------------ */

/* Two sequences, A = +1 and A = -1, one token inside the clip range and one outside each:
 *   t0 A=+1 r=1.1: L = -1.1, dL/dlp = -A r = -1.1          t1 A=+1 r=1.5: r_c = 1.2, L = max(-1.5, -1.2) = -1.2, grad 0
 *   t2 A=-1 r=0.5: r_c = 0.8, L = max(0.5, 0.8) = 0.8, 0    t3 A=-1 r=0.9: L = 0.9, grad = -A r = 0.9
 * token level: loss = (-1.1 - 1.2 + 0.8 + 0.9) / 4 = -0.15, grad = [-1.1, 0, 0, 0.9] / 4. */
START_TEST(test_clip_token_level_by_hand)
{
    batch b = {0};
    int64_t t = add_seq(&b, 2, 1.0f);
    set_ratio(&b, t, -1.0, 1.1);
    set_ratio(&b, t + 1, -1.3, 1.5);
    t = add_seq(&b, 2, -1.0f);
    set_ratio(&b, t, -0.7, 0.5);
    set_ratio(&b, t + 1, -2.0, 0.9);
    grpo_loss_inputs in = inputs_of(&b);
    ck_assert(in.global_valid_toks == 4.0 && in.global_valid_seqs == 2.0);
    grpo_loss_config cfg = plain_config();
    double loss;
    float grad[4];
    grpo_loss_metrics m;
    dsarl_error err = {0};
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, &m, &err), 0);
    assert_close(loss, -0.15, 1e-6, "loss");
    const double want[4] = {-1.1 / 4, 0.0, 0.0, 0.9 / 4};
    for (int i = 0; i < 4; i++)
        assert_close(grad[i], want[i], 1e-6, "grad");
    assert_close(m.clip_fraction_high, 0.25, 1e-8, "clip_fraction_high");
    assert_close(m.clip_fraction_low, 0.25, 1e-8, "clip_fraction_low");
    assert_close(m.probs_ratio, (1.1 + 1.5 + 0.5 + 0.9) / 4, 1e-6, "probs_ratio");
    assert_close(m.probs_ratio_clamped, (1.1 + 1.2 + 0.8 + 0.9) / 4, 1e-6, "probs_ratio_clamped");
    assert_close(m.probs_ratio_min, 0.5, 1e-6, "probs_ratio_min");
    assert_close(m.probs_ratio_max, 1.5, 1e-6, "probs_ratio_max");
    assert_close(m.probs_ratio_clamped_min, 0.8, 1e-6, "probs_ratio_clamped_min");
    assert_close(m.probs_ratio_clamped_max, 1.2, 1e-6, "probs_ratio_clamped_max");
    assert_close(m.actor_loss, -0.15, 1e-6, "actor_loss");
    assert_close(m.kl_penalty, 0.0, 0.0, "kl_penalty");
    assert_close(m.num_valid_samples, 2.0, 0.0, "num_valid_samples");

    // Clip-higher (ratio_clip_max 0.6): t1's r = 1.5 is now inside, L = -1.5 with gradient -1.5.
    cfg.ratio_clip_max = 0.6;
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, &m, &err), 0);
    assert_close(loss, (-1.1 - 1.5 + 0.8 + 0.9) / 4, 1e-6, "clip-higher loss");
    assert_close(grad[1], -1.5 / 4, 1e-6, "clip-higher grad");
    assert_close(m.clip_fraction_high, 0.0, 0.0, "clip-higher fraction");
}
END_TEST

/* Sequence-level normalisation. Seq 0 gets a third token with r = 1 (L = -1, grad -1) and a prompt token with
 * token_mask 0 carrying NaN log-probs, which must not leak. Seq means: (-1.1 - 1.2 - 1.0) / 3 = -1.1 and
 * (0.8 + 0.9) / 2 = 0.85; loss = (-1.1 + 0.85) / 2 = -0.125; grads = per-token grad / (n_tokens_seq * 2).
 * The token-level loss of the same batch is (-1.1 - 1.2 - 1.0 + 0.8 + 0.9) / 5 = -0.32. */
START_TEST(test_sequence_level_by_hand)
{
    batch b = {0};
    int64_t t = add_seq(&b, 4, 1.0f);
    b.tok[t] = 0.0f;
    b.lp[t] = b.old[t] = b.gen[t] = b.ref[t] = NAN;
    set_ratio(&b, t + 1, -1.0, 1.1);
    set_ratio(&b, t + 2, -1.3, 1.5);
    set_ratio(&b, t + 3, -0.4, 1.0);
    t = add_seq(&b, 2, -1.0f);
    set_ratio(&b, t, -0.7, 0.5);
    set_ratio(&b, t + 1, -2.0, 0.9);
    grpo_loss_inputs in = inputs_of(&b);
    grpo_loss_config cfg = plain_config();
    cfg.token_level_loss = false;
    double loss;
    float grad[6];
    dsarl_error err = {0};
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, NULL, &err), 0);
    assert_close(loss, -0.125, 1e-6, "sequence-level loss");
    const double want[6] = {0.0, -1.1 / 6, 0.0, -1.0 / 6, 0.0, 0.9 / 4};
    for (int i = 0; i < 6; i++)
        assert_close(grad[i], want[i], 1e-6, "sequence-level grad");
    cfg.token_level_loss = true;
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, NULL, &err), 0);
    assert_close(loss, -0.32, 1e-6, "token-level loss");

    // A sequence with loss multiplier 0 (overlong filtering) contributes nothing: the batch is seq 1 alone,
    // normalised by the global counts the caller passes (here 2 tokens).
    b.sample[0] = 0.0f;
    in = inputs_of(&b);
    ck_assert(in.global_valid_toks == 2.0 && in.global_valid_seqs == 1.0);
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, NULL, &err), 0);
    assert_close(loss, (0.8 + 0.9) / 2, 1e-6, "filtered loss");
    for (int i = 0; i < 4; i++)
        ck_assert(grad[i] == 0.0f);
}
END_TEST

/* Dual clip c = 3 (A < 0 only):
 *   A=-1 r=5: max(5, 1.2) = 5, then min(5, 3) = 3 -> gradient 0, counted in dual_clip_fraction
 *   A=-1 r=2: max(2, 1.2) = 2 < 3 -> L = 2, grad = -A r = 2
 *   A=+1 r=5: max(-5, -1.2) = -1.2 (upper clip), dual clip does not apply to A > 0
 * loss = (3 + 2 - 1.2) / 3, grads = [0, 2/3, 0]. */
START_TEST(test_dual_clip_by_hand)
{
    batch b = {0};
    int64_t t = add_seq(&b, 2, -1.0f);
    set_ratio(&b, t, -2.0, 5.0);
    set_ratio(&b, t + 1, -2.0, 2.0);
    t = add_seq(&b, 1, 1.0f);
    set_ratio(&b, t, -2.0, 5.0);
    grpo_loss_inputs in = inputs_of(&b);
    grpo_loss_config cfg = plain_config();
    cfg.ratio_clip_c = 3.0;
    double loss;
    float grad[3];
    grpo_loss_metrics m;
    dsarl_error err = {0};
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, &m, &err), 0);
    assert_close(loss, (3.0 + 2.0 - 1.2) / 3, 1e-6, "dual-clip loss");
    assert_close(grad[0], 0.0, 0.0, "dual-clipped grad");
    assert_close(grad[1], 2.0 / 3, 1e-6, "unclipped grad");
    assert_close(grad[2], 0.0, 0.0, "upper-clipped grad");
    assert_close(m.dual_clip_fraction, 1.0 / 3, 1e-8, "dual_clip_fraction");
    // Without the dual clip the first token's loss is 5 with gradient -A r = 5.
    cfg.ratio_clip_c = 0.0;
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, &m, &err), 0);
    assert_close(loss, (5.0 + 2.0 - 1.2) / 3, 1e-6, "no dual clip loss");
    assert_close(grad[0], 5.0 / 3, 1e-6, "no dual clip grad");
}
END_TEST

/* KL to the reference, one token with lp = -1, lp_ref = -1.5, A = 0 (so only the KL term acts), beta = 0.1:
 * logr = lp_ref - lp = -0.5, w_kl = exp(lp - sg(lp)) = 1 with dw/dlp = 1, dlogr/dlp = -1.
 *   k1 = -logr = 0.5;             d(w k)/dlp = k + w * (-1)(-1) = 0.5 + 1 = 1.5
 *   k2 = logr^2 / 2 = 0.125;      = k + logr * (-1) = 0.125 + 0.5 = 0.625
 *   k3 = e^logr - 1 - logr = e^-0.5 - 0.5 = 0.1065306597;   = k3 + (e^logr - 1)(-1) = -logr = 0.5
 * loss = beta * k, grad = beta * d(w k)/dlp, kl_penalty metric = k. */
START_TEST(test_kl_by_hand)
{
    batch b = {0};
    int64_t t = add_seq(&b, 1, 0.0f);
    set_ratio(&b, t, -1.0, 1.0);
    b.ref[t] = -1.5f;
    grpo_loss_inputs in = inputs_of(&b);
    grpo_loss_config cfg = plain_config();
    cfg.reference_policy_kl_penalty = 0.1;
    const struct { grpo_kl_type type; double k, dk; } cases[] = {
        {GRPO_KL_K1, 0.5, 1.5}, {GRPO_KL_K2, 0.125, 0.625}, {GRPO_KL_K3, 0.1065306597126334, 0.5}};
    for (size_t i = 0; i < 3; i++) {
        cfg.kl_type = cases[i].type;
        double loss;
        float grad[1];
        grpo_loss_metrics m;
        dsarl_error err = {0};
        ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, &m, &err), 0);
        assert_close(loss, 0.1 * cases[i].k, 1e-7, "kl loss");
        assert_close(grad[0], 0.1 * cases[i].dk, 1e-6, "kl grad");
        assert_close(m.kl_penalty, cases[i].k, 1e-7, "kl_penalty");
    }
    cfg.kl_type = GRPO_KL_K3;
    double loss;
    float grad[1];
    dsarl_error err = {0};

    // Input clamp 0.3 < |logr| = 0.5: logr = -0.3, k3 = e^-0.3 - 0.7 = 0.0408182207; logr and w_kl both detached.
    cfg.kl_input_clamp_value = 0.3;
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, NULL, &err), 0);
    assert_close(loss, 0.1 * 0.04081822068171788, 1e-7, "input-clamped kl");
    ck_assert(grad[0] == 0.0f);

    // Output clamp 0.05 < k3 = 0.1065: the term is 0.05 and has no gradient.
    cfg.kl_input_clamp_value = 20.0;
    cfg.kl_output_clamp_value = 0.05;
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, NULL, &err), 0);
    assert_close(loss, 0.1 * 0.05, 1e-9, "output-clamped kl");
    ck_assert(grad[0] == 0.0f);

    // On-policy approximation with lp_gen = -0.8: w_kl = exp(lp - lp_gen) = e^-0.2 = 0.8187307531 (dw/dlp = w);
    // loss = beta w k3, grad = beta (w k3 + w (1 - e^logr)) = beta w (-logr) = 0.1 * 0.8187307531 * 0.5.
    cfg.kl_output_clamp_value = 10.0;
    cfg.use_on_policy_kl_approximation = true;
    b.gen[t] = -0.8f;
    in = inputs_of(&b);
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, NULL, &err), 0);
    assert_close(loss, 0.1 * 0.8187307530779818 * 0.1065306597126334, 1e-6, "on-policy kl loss");
    assert_close(grad[0], 0.1 * 0.8187307530779818 * 0.5, 1e-6, "on-policy kl grad");

    // beta = 0: no reference needed at all.
    cfg.reference_policy_kl_penalty = 0.0;
    in.lp_ref = NULL;
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, NULL, &err), 0);
    ck_assert(loss == 0.0 && grad[0] == 0.0f);
    // ... but with beta > 0 a missing reference is an error, not a silent zero.
    cfg.reference_policy_kl_penalty = 0.1;
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, NULL, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "reference_policy_kl_penalty"));
}
END_TEST

/* Importance-sampling correction with r = 1 and A = +1 on every token, so L = -1 and dL/dlp = -1 per token and
 * the loss is -sum(w) / N. Log IS ratios lp_old - lp_gen = [0.1, 0.6, -0.2, nan, +inf]:
 *   raw w = [1.1051709181, 1.8221188004, 0.8187307531, 0 (nan -> 0), 0 (inf -> 0)]
 *   tis [0, 1.5]:     [1.1051709181, 1.5, 0.8187307531, 0, 0], oob 1 of 5
 *   tis [0.9, 1.5]:   [1.1051709181, 1.5, 0.9, 0.9, 0.9] (the zeroed weights are clamped up too), oob 4 of 5
 *   icepop [0.9, 1.5]: [1.1051709181, 0, 0, 0, 0], oob 4 of 5 */
START_TEST(test_importance_sampling_by_hand)
{
    batch b = {0};
    int64_t t = add_seq(&b, 5, 1.0f);
    const double log_is[5] = {0.1, 0.6, -0.2, NAN, INFINITY};
    for (int i = 0; i < 5; i++) {
        set_ratio(&b, t + i, -1.0, 1.0);
        b.gen[t + i] = isnan(log_is[i]) ? NAN : (float)(-1.0 - log_is[i]);
    }
    grpo_loss_inputs in = inputs_of(&b);
    const double e01 = 1.1051709180756477, e06 = 1.8221188003905089, em02 = 0.8187307530779818;
    const struct {
        grpo_truncation type;
        double lo, hi;
        double w[5], oob;
    } cases[] = {
        {GRPO_TRUNCATION_NONE, 0.0, INFINITY, {e01, e06, em02, 0, 0}, 0.0},
        {GRPO_TRUNCATION_TIS, 0.0, 1.5, {e01, 1.5, em02, 0, 0}, 1.0 / 5},
        {GRPO_TRUNCATION_TIS, 0.9, 1.5, {e01, 1.5, 0.9, 0.9, 0.9}, 4.0 / 5},
        {GRPO_TRUNCATION_ICEPOP, 0.9, 1.5, {e01, 0, 0, 0, 0}, 4.0 / 5},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        grpo_loss_config cfg = plain_config();
        cfg.use_importance_sampling_correction = true;
        cfg.truncation = cases[c].type;
        cfg.truncation_ratio_min = cases[c].lo;
        cfg.truncation_ratio = cases[c].hi;
        double loss, sum_w = 0.0;
        float grad[5];
        grpo_loss_metrics m;
        dsarl_error err = {0};
        ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, &m, &err), 0);
        for (int i = 0; i < 5; i++) {
            sum_w += cases[c].w[i];
            assert_close(grad[i], -cases[c].w[i] / 5, 1e-6, "IS grad");
        }
        assert_close(loss, -sum_w / 5, 1e-6, "IS loss");
        assert_close(m.sampling_importance_ratio, sum_w / 5, 1e-6, "sampling_importance_ratio");
        assert_close(m.is_oob_ratio, cases[c].oob, 1e-8, "is_oob_ratio");
        // Without the correction the weights are still reported but the loss is the plain -1 per token.
        cfg.use_importance_sampling_correction = false;
        ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, &m, &err), 0);
        assert_close(loss, -1.0, 1e-6, "uncorrected loss");
        assert_close(m.sampling_importance_ratio, sum_w / 5, 1e-6, "uncorrected sampling_importance_ratio");
    }
}
END_TEST

/* seq-mask-tis with bounds [0.999, 1.002], r = 1, A = +1, two sequences of two tokens:
 *   seq 0 log IS ratios [0.001, 0.001]: geometric mean e^0.001 = 1.0010005 inside -> kept with raw token weights
 *   seq 1 log IS ratios [0.01, -0.002]: mean 0.004, e^0.004 = 1.004008 > 1.002 -> whole sequence zeroed
 * loss = -(2 e^0.001) / 4, grads = [-e^0.001/4, -e^0.001/4, 0, 0], is_oob_ratio = 1 of 2 sequences. The token
 * weights are not truncated: a token with IS weight e^0.01 would be outside a token-level [0.999, 1.002]. */
START_TEST(test_seq_mask_tis_by_hand)
{
    batch b = {0};
    const double log_is[4] = {0.001, 0.001, 0.01, -0.002};
    add_seq(&b, 2, 1.0f);
    add_seq(&b, 2, 1.0f);
    for (int i = 0; i < 4; i++) {
        set_ratio(&b, i, -1.0, 1.0);
        b.gen[i] = (float)(-1.0 - log_is[i]);
    }
    grpo_loss_inputs in = inputs_of(&b);
    grpo_loss_config cfg = plain_config();
    cfg.use_importance_sampling_correction = true;
    cfg.truncation = GRPO_TRUNCATION_SEQ_MASK;
    cfg.truncation_ratio_min = 0.999;
    cfg.truncation_ratio = 1.002;
    double loss;
    float grad[4];
    grpo_loss_metrics m;
    dsarl_error err = {0};
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, &m, &err), 0);
    const double e = 1.0010005001667084;
    assert_close(loss, -2.0 * e / 4, 1e-6, "seq-mask-tis loss");
    assert_close(grad[0], -e / 4, 1e-6, "kept grad");
    assert_close(grad[1], -e / 4, 1e-6, "kept grad");
    ck_assert(grad[2] == 0.0f && grad[3] == 0.0f);
    assert_close(m.is_oob_ratio, 0.5, 1e-7, "seq is_oob_ratio");  // / (2 + 1e-8)
}
END_TEST

/* force_on_policy_ratio: lp_old is not needed (NULL) and the ratio is exp(lp - sg(lp)) = 1 with d/dlp = 1, so
 * L = -A and dL/dlp = -A even where a real lp_old would clip. With the IS correction the weight is
 * exp(sg(lp) - lp_gen): lp = -1, lp_gen = -1.2 -> w = e^0.2 = 1.2214027582, a constant.
 * A = [+2, -1]: loss = (-2 w + 1 w) / 2 = -w / 2, grads = [-2 w / 2, +w / 2]. */
START_TEST(test_force_on_policy_by_hand)
{
    batch b = {0};
    add_seq(&b, 1, 2.0f);
    add_seq(&b, 1, -1.0f);
    for (int i = 0; i < 2; i++) {
        b.lp[i] = -1.0f;
        b.gen[i] = -1.2f;
        b.ref[i] = -1.0f;
    }
    grpo_loss_inputs in = inputs_of(&b);
    in.lp_old = NULL;
    grpo_loss_config cfg = plain_config();
    cfg.force_on_policy_ratio = true;
    double loss;
    float grad[2];
    grpo_loss_metrics m;
    dsarl_error err = {0};
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, &m, &err), 0);
    assert_close(loss, (-2.0 + 1.0) / 2, 1e-7, "on-policy loss");
    assert_close(grad[0], -1.0, 1e-7, "on-policy grad A=+2");
    assert_close(grad[1], 0.5, 1e-7, "on-policy grad A=-1");
    assert_close(m.probs_ratio, 1.0, 1e-7, "on-policy ratio");
    cfg.use_importance_sampling_correction = true;
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, &m, &err), 0);
    const double w = 1.2214027581601699;
    assert_close(loss, -w / 2, 1e-6, "on-policy IS loss");
    assert_close(grad[0], -w, 1e-6, "on-policy IS grad");
    assert_close(grad[1], w / 2, 1e-6, "on-policy IS grad");
    // The diagnostics compare generation with sg(lp): exp(|-1.2 - -1|) = e^0.2.
    assert_close(m.token_mult_prob_error, w, 1e-6, "on-policy token_mult_prob_error");
    // Without force_on_policy_ratio a NULL lp_old is refused.
    cfg.force_on_policy_ratio = false;
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, &m, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "force_on_policy_ratio"));
}
END_TEST

/* Diagnostics of section 3.4 on two tokens with lp_old = [-1, -2], lp_gen = [-1.1, -1.8], lp = lp_old + [0.05,
 * -0.1], k3 estimators, against the formulas written out with probabilities (not log-sum-exp):
 *   token_mult_prob_error = mean e^|gen - old|; gen_kl = mean k3(old - gen); policy_kl = mean k3(gen - old)
 *   js = mean of 0.5 KL(p_old || M) + 0.5 KL(p_gen || M) (k3 form), M = (p_old + p_gen) / 2
 *   approx_entropy = -mean e^(lp - gen) lp */
START_TEST(test_diagnostics_by_hand)
{
    batch b = {0};
    add_seq(&b, 2, 0.5f);
    const double old[2] = {-1.0, -2.0}, gen[2] = {-1.1, -1.8}, dl[2] = {0.05, -0.1};
    for (int i = 0; i < 2; i++) {
        b.old[i] = (float)old[i];
        b.gen[i] = (float)gen[i];
        b.lp[i] = (float)(old[i] + dl[i]);
        b.ref[i] = b.old[i];
    }
    grpo_loss_inputs in = inputs_of(&b);
    grpo_loss_config cfg = plain_config();
    double loss;
    grpo_loss_metrics m;
    dsarl_error err = {0};
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, NULL, &m, &err), 0);
    double mult = 0, gkl = 0, pkl = 0, js = 0, ent = 0;
    for (int i = 0; i < 2; i++) {
        double o = b.old[i], g = b.gen[i], lp = b.lp[i];
        mult += exp(fabs(g - o)) / 2;
        gkl += (exp(o - g) - 1 - (o - g)) / 2;
        pkl += (exp(g - o) - 1 - (g - o)) / 2;
        double po = exp(o), pg = exp(g), pm = 0.5 * (po + pg);
        double kl_o = po / pm - 1 - log(po / pm), kl_g = pg / pm - 1 - log(pg / pm);
        js += (0.5 * kl_o + 0.5 * kl_g) / 2;
        ent -= exp(lp - g) * lp / 2;
    }
    // Token means divide by global_valid_toks + 1e-8 (NeMo's masked_mean), hence 1e-7 and not 1e-12.
    assert_close(m.token_mult_prob_error, mult, 1e-7, "token_mult_prob_error");
    assert_close(m.gen_kl_error, gkl, 1e-7, "gen_kl_error");
    assert_close(m.policy_kl_error, pkl, 1e-7, "policy_kl_error");
    assert_close(m.js_divergence_error, js, 1e-7, "js_divergence_error");
    assert_close(m.approx_entropy, ent, 1e-7, "approx_entropy");
    // Identical generation and training log-probs: the error metric is exactly 1, the KLs exactly 0.
    for (int i = 0; i < 2; i++)
        b.gen[i] = b.old[i];
    in = inputs_of(&b);
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, NULL, &m, &err), 0);
    assert_close(m.token_mult_prob_error, 1.0, 1e-8, "identical token_mult_prob_error");
    ck_assert(m.gen_kl_error == 0.0 && m.policy_kl_error == 0.0);
}
END_TEST

/* ------------------------------------------------------------------------------------------------------------
 * Random inputs: finite differences, microbatch additivity, argument checks. */

/* GSPO, sequence-level loss. Seq 0 (A = +1): token ratios 1.1 and 1.0, so r_seq = exp((log 1.1 + 0) / 2) =
 * sqrt(1.1), inside the clip: L = -r_seq on both tokens, seq mean -r_seq, d/dlp_t = -r_seq / 2 (each token carries
 * half the mean log-ratio). Seq 1 (A = +1): ratios 2 and 2, r_seq = 2 > 1.2: L = -1.2, no gradient, both tokens
 * clipped. loss = (-sqrt(1.1) - 1.2) / 2; grads [-sqrt(1.1) / 4, same, 0, 0]. With lp_gen = lp_old - 0.1 on seq 0's
 * tokens and the IS correction, seq 0's weight is exp(0.2) (one per sequence), seq 1's is 1. */
START_TEST(test_gspo_by_hand)
{
    batch b = {0};
    int64_t t = add_seq(&b, 2, 1.0f);
    set_ratio(&b, t, -1.0, 1.1);
    set_ratio(&b, t + 1, -2.0, 1.0);
    t = add_seq(&b, 2, 1.0f);
    set_ratio(&b, t, -0.5, 2.0);
    set_ratio(&b, t + 1, -1.5, 2.0);
    grpo_loss_config cfg = plain_config();
    cfg.sequence_level_importance_ratios = true;
    cfg.token_level_loss = false;
    grpo_loss_inputs in = inputs_of(&b);
    double loss;
    float grad[4];
    grpo_loss_metrics m;
    dsarl_error err = {0};
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, &m, &err), 0);
    const double r0 = sqrt(1.1);
    assert_close(loss, (-r0 - 1.2) / 2, 1e-6, "gspo loss");
    const double want[4] = {-r0 / 4, -r0 / 4, 0.0, 0.0};
    for (int i = 0; i < 4; i++)
        assert_close(grad[i], want[i], 1e-6, "gspo grad");
    assert_close(m.probs_ratio, (2 * r0 + 2 * 2.0) / 4, 1e-6, "gspo probs_ratio (sequence ratio on every token)");
    assert_close(m.probs_ratio_clamped, (2 * r0 + 2 * 1.2) / 4, 1e-6, "gspo probs_ratio_clamped");
    assert_close(m.clip_fraction_high, 0.5, 1e-8, "gspo clip_fraction_high");

    b.gen[0] = b.old[0] - 0.1f;
    b.gen[1] = b.old[1] - 0.1f;
    cfg.use_importance_sampling_correction = true;
    in = inputs_of(&b);
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, &m, &err), 0);
    const double w0 = exp((double)(b.old[0] - b.gen[0]) + (double)(b.old[1] - b.gen[1]));
    assert_close(w0, exp(0.2), 1e-5, "gspo weight");
    assert_close(loss, (-w0 * r0 - 1.2) / 2, 1e-6, "gspo loss with IS");
    assert_close(grad[0], -w0 * r0 / 4, 1e-6, "gspo grad with IS");
    assert_close(m.sampling_importance_ratio, (w0 + 1.0) / 2, 1e-6, "gspo sampling_importance_ratio per sequence");
}
END_TEST

/* CISPO: t0 A = +1, r = 1.5 (clamp 1.2), lp = -1: L = -A sg(r_c) lp = 1.2, d/dlp = -1.2; t1 A = -1, r = 0.9, lp = -2:
 * L = 0.9 * -2 = -1.8, d/dlp = 0.9. Token mean: loss -0.3, grads [-0.6, 0.45]; t0 counts as clipped high. */
START_TEST(test_cispo_by_hand)
{
    batch b = {0};
    int64_t t = add_seq(&b, 1, 1.0f);
    set_ratio(&b, t, -1.0 - log(1.5), 1.5);
    t = add_seq(&b, 1, -1.0f);
    set_ratio(&b, t, -2.0 - log(0.9), 0.9);
    grpo_loss_config cfg = plain_config();
    cfg.use_cispo = true;
    grpo_loss_inputs in = inputs_of(&b);
    double loss;
    float grad[2];
    grpo_loss_metrics m;
    dsarl_error err = {0};
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, &m, &err), 0);
    assert_close(loss, -0.3, 1e-6, "cispo loss");
    assert_close(grad[0], -0.6, 1e-6, "cispo grad 0");
    assert_close(grad[1], 0.45, 1e-6, "cispo grad 1");
    assert_close(m.clip_fraction_high, 0.5, 1e-8, "cispo clip_fraction_high");
    assert_close(m.clip_fraction_low, 0.0, 0.0, "cispo clip_fraction_low");
}
END_TEST

/* REINFORCE (disable_ppo_ratio): lp -1 with A = +1 and lp -2 with A = -1: L = -A lp = 1 and -2, loss -0.5, grads
 * [-0.5, 0.5]; NeMo's probs_ratio metric is then the mean lp, -1.5. lp_old still feeds the IS weight only. */
START_TEST(test_reinforce_by_hand)
{
    batch b = {0};
    int64_t t = add_seq(&b, 1, 1.0f);
    set_ratio(&b, t, -1.3, exp(-1.0 + 1.3));
    t = add_seq(&b, 1, -1.0f);
    set_ratio(&b, t, -2.2, exp(-2.0 + 2.2));
    grpo_loss_config cfg = plain_config();
    cfg.disable_ppo_ratio = true;
    grpo_loss_inputs in = inputs_of(&b);
    double loss;
    float grad[2];
    grpo_loss_metrics m;
    dsarl_error err = {0};
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, &m, &err), 0);
    assert_close(loss, -0.5, 1e-6, "reinforce loss");
    assert_close(grad[0], -0.5, 1e-6, "reinforce grad 0");
    assert_close(grad[1], 0.5, 1e-6, "reinforce grad 1");
    assert_close(m.probs_ratio, -1.5, 1e-6, "reinforce probs_ratio = mean lp");
    assert_close(m.clip_fraction_low + m.clip_fraction_high, 0.0, 0.0, "reinforce never clips");
}
END_TEST

/* VAPO: seq 0 (reward 1, A = +1, r = 1) has tokens lp -1 and -3, seq 1 (reward 0, A = 0) one token. Actor: L = -1
 * on seq 0's tokens, 0 on seq 1's: -2/3, grads -1/3. NLL over the positive sample's tokens: (1 + 3) / 2 = 2, weight
 * 0.5 adds 1.0 to the loss and -0.5 / 2 to each of its tokens' gradients. */
START_TEST(test_vapo_nll_by_hand)
{
    batch b = {0};
    int64_t t = add_seq(&b, 2, 1.0f);
    set_ratio(&b, t, -1.0, 1.0);
    set_ratio(&b, t + 1, -3.0, 1.0);
    t = add_seq(&b, 1, 0.0f);
    set_ratio(&b, t, -0.5, 1.0);
    b.use_rewards = true;
    b.reward[0] = 1.0f;
    b.reward[1] = 0.0f;
    grpo_loss_config cfg = plain_config();
    cfg.positive_example_nll_weight = 0.5;
    grpo_loss_inputs in = inputs_of(&b);
    ck_assert(in.global_positive_toks == 2.0);
    double loss;
    float grad[3];
    grpo_loss_metrics m;
    dsarl_error err = {0};
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, &m, &err), 0);
    assert_close(m.actor_loss, -2.0 / 3, 1e-6, "vapo actor");
    assert_close(m.positive_nll_loss, 2.0, 1e-6, "positive_nll_loss");
    assert_close(loss, -2.0 / 3 + 0.5 * 2.0, 1e-6, "vapo loss");
    assert_close(grad[0], -1.0 / 3 - 0.25, 1e-6, "vapo grad 0");
    assert_close(grad[1], -1.0 / 3 - 0.25, 1e-6, "vapo grad 1");
    assert_close(grad[2], 0.0, 0.0, "vapo grad of the unrewarded sample");
    // no rewards given: refused, not silently dropped
    b.use_rewards = false;
    in = inputs_of(&b);
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, grad, &m, &err), DSARL_E_INVALID);
}
END_TEST

/* A random batch: S sequences of 3..12 tokens, the first 1..2 of each a prompt (token_mask 0), some sequences with
 * sample_mask 0, advantages N(0, 1), lp_theta in [-3, -0.05], lp_old = lp + N(0, spread), lp_gen and lp_ref
 * near them. */
static void random_batch(batch *b, int64_t S, double spread)
{
    memset(b, 0, sizeof *b);
    for (int64_t s = 0; s < S; s++) {
        int64_t n = 3 + (int64_t)(next_u32() % 10);
        int64_t t0 = add_seq(b, n, (float)normal());
        b->sample[s] = (next_u32() % 5 == 0) ? 0.0f : 1.0f;
        int64_t prompt = 1 + next_u32() % 2;
        for (int64_t t = t0; t < t0 + n; t++) {
            b->tok[t] = t < t0 + prompt ? 0.0f : 1.0f;
            b->lp[t] = (float)uniform(-3.0, -0.05);
            b->old[t] = (float)(b->lp[t] + spread * normal());
            b->gen[t] = (float)(b->old[t] + 0.1 * normal());
            b->ref[t] = (float)(b->lp[t] + 0.4 * normal());
        }
    }
}

/* Which smooth piece of the loss token t is on at lp_theta = lp (sg value lp_sg): any change of these between
 * lp - h and lp + h means a kink lies in between and the central difference is not comparable. */
static int piece_of(const grpo_loss_config *cfg, const batch *b, int64_t s, int64_t t, double lp, double lp_sg)
{
    double old = cfg->force_on_policy_ratio ? lp_sg : b->old[t];
    double r = cfg->force_on_policy_ratio ? exp(lp - lp_sg) : exp(lp - old);
    if (cfg->sequence_level_importance_ratios && !cfg->force_on_policy_ratio && !cfg->disable_ppo_ratio) {
        // GSPO: the sequence's ratio, with token t at lp
        double sum = 0.0, n = 0.0;
        for (int64_t u = b->cu[s]; u < b->cu[s + 1]; u++) {
            sum += b->tok[u] * ((u == t ? lp : b->lp[u]) - b->old[u]);
            n += b->tok[u];
        }
        r = exp(sum / (n + 1e-8));
    }
    if (cfg->disable_ppo_ratio && !cfg->force_on_policy_ratio)
        return 0;  // REINFORCE: -A lp, smooth
    double adv = b->use_tadv ? b->tadv[t] : b->adv[s];
    int piece = 0;
    piece |= (r < 1.0 - cfg->ratio_clip_min) << 0;
    piece |= (r > 1.0 + cfg->ratio_clip_max) << 1;
    double rc = fmin(fmax(r, 1.0 - cfg->ratio_clip_min), 1.0 + cfg->ratio_clip_max);
    if (cfg->force_on_policy_ratio)
        rc = r;
    double clip = fmax(-adv * r, -adv * rc);
    piece |= (cfg->ratio_clip_c > 0 && adv < 0 && -adv * cfg->ratio_clip_c < clip) << 2;
    if (cfg->reference_policy_kl_penalty != 0.0) {
        double logr = b->ref[t] - lp;
        piece |= (fabs(logr) > cfg->kl_input_clamp_value) << 3;
        double lr = fmin(fmax(logr, -cfg->kl_input_clamp_value), cfg->kl_input_clamp_value);
        double k = cfg->kl_type == GRPO_KL_K1 ? -lr : cfg->kl_type == GRPO_KL_K2 ? 0.5 * lr * lr : exp(lr) - 1 - lr;
        double w = cfg->use_on_policy_kl_approximation ? exp(lp - b->gen[t]) : exp(lp - lp_sg);
        piece |= (fabs(w * k) > cfg->kl_output_clamp_value) << 4;
    }
    return piece;
}

/* Checks grpo_clipped_pg_loss_detached's gradient against central differences on every valid token that is not
 * next to a kink or inside the KL input clamp (where NeMo detaches w_kl on purpose); returns tokens checked. */
static int check_gradient(const grpo_loss_config *cfg, batch *b, const char *name)
{
    grpo_loss_inputs in = inputs_of(b);
    if (cfg->force_on_policy_ratio)
        in.lp_old = NULL;
    if (cfg->reference_policy_kl_penalty == 0.0)
        in.lp_ref = NULL;
    static float sg[MAX_T], grad[MAX_T];
    memcpy(sg, b->lp, sizeof(float) * (size_t)b->T);
    double loss, lp_plus, lp_minus;
    dsarl_error err = {0};
    ck_assert_int_eq(grpo_clipped_pg_loss_detached(cfg, &in, sg, &loss, grad, NULL, &err), 0);
    ck_assert_msg(isfinite(loss), "%s: loss not finite (seed %llu)", name, (unsigned long long)test_seed);
    const float h = 0x1p-10f;  // exact in float for |lp| in [0.05, 3]: lp +- h is representable
    int checked = 0;
    for (int64_t s = 0; s < b->S; s++)
        for (int64_t t = b->cu[s]; t < b->cu[s + 1]; t++) {
            if (b->tok[t] == 0.0f || b->sample[s] == 0.0f) {
                ck_assert_msg(grad[t] == 0.0f, "%s: masked token %lld has gradient %g", name, (long long)t,
                              (double)grad[t]);
                continue;
            }
            float lp = b->lp[t];
            int here = piece_of(cfg, b, s, t, lp, sg[t]);
            if (here != piece_of(cfg, b, s, t, lp + h, sg[t]) || here != piece_of(cfg, b, s, t, lp - h, sg[t]) ||
                (here & (1 << 3)))
                continue;
            b->lp[t] = lp + h;
            ck_assert_int_eq(grpo_clipped_pg_loss_detached(cfg, &in, sg, &lp_plus, NULL, NULL, &err), 0);
            b->lp[t] = lp - h;
            ck_assert_int_eq(grpo_clipped_pg_loss_detached(cfg, &in, sg, &lp_minus, NULL, NULL, &err), 0);
            b->lp[t] = lp;
            double fd = (lp_plus - lp_minus) / (2.0 * h);
            double scale = 1.0 / in.global_valid_toks + fabs(fd);
            ck_assert_msg(fabs(fd - grad[t]) <= 2e-4 * scale,
                          "%s: token %lld: analytic %.9g vs finite difference %.9g (seed %llu)", name, (long long)t,
                          (double)grad[t], fd, (unsigned long long)test_seed);
            checked++;
        }
    return checked;
}

START_TEST(test_gradient_finite_differences)
{
    grpo_loss_config base = plain_config();
    base.reference_policy_kl_penalty = 0.05;
    struct { const char *name; grpo_loss_config cfg; double spread; int extra; } variants[32];
    int n = 0;
#define VARIANT(name_, spread_, ...)                                          \
    do {                                                                      \
        variants[n].name = name_;                                             \
        variants[n].cfg = base;                                               \
        variants[n].spread = spread_;                                         \
        variants[n].extra = 0;                                                \
        grpo_loss_config *c = &variants[n].cfg;                               \
        __VA_ARGS__;                                                          \
        n++;                                                                  \
    } while (0)
    VARIANT("token-level k3", 0.2, (void)c);
    VARIANT("sequence-level", 0.2, c->token_level_loss = false);
    VARIANT("k1", 0.2, c->kl_type = GRPO_KL_K1);
    VARIANT("k2", 0.2, c->kl_type = GRPO_KL_K2);
    VARIANT("on-policy kl", 0.2, c->use_on_policy_kl_approximation = true);
    VARIANT("kl clamps", 0.2, c->kl_input_clamp_value = 0.5; c->kl_output_clamp_value = 0.02);
    VARIANT("clip-higher", 0.2, c->ratio_clip_max = 0.28);
    VARIANT("dual clip", 0.8, c->ratio_clip_c = 2.0);
    VARIANT("no kl", 0.2, c->reference_policy_kl_penalty = 0.0);
    VARIANT("is correction", 0.2, c->use_importance_sampling_correction = true);
    VARIANT("tis", 0.2, c->use_importance_sampling_correction = true; c->truncation = GRPO_TRUNCATION_TIS;
            c->truncation_ratio = 1.05; c->truncation_ratio_min = 0.0);
    VARIANT("icepop", 0.2, c->use_importance_sampling_correction = true; c->truncation = GRPO_TRUNCATION_ICEPOP;
            c->truncation_ratio = 1.1; c->truncation_ratio_min = 0.9);
    VARIANT("seq-mask-tis", 0.2, c->use_importance_sampling_correction = true;
            c->truncation = GRPO_TRUNCATION_SEQ_MASK; c->truncation_ratio = 1.03; c->truncation_ratio_min = 0.97;
            c->token_level_loss = false);
    VARIANT("force on-policy", 0.2, c->force_on_policy_ratio = true; c->use_importance_sampling_correction = true);
    VARIANT("force on-policy sequence on-policy-kl", 0.2, c->force_on_policy_ratio = true;
            c->token_level_loss = false; c->use_on_policy_kl_approximation = true);
    // NeMo RL's variants (the GSPO ones use a small spread so that some sequence ratios fall inside the clip)
    VARIANT("gspo", 0.03, c->sequence_level_importance_ratios = true; c->token_level_loss = false);
    VARIANT("gspo is tis", 0.03, c->sequence_level_importance_ratios = true; c->token_level_loss = false;
            c->use_importance_sampling_correction = true; c->truncation = GRPO_TRUNCATION_TIS;
            c->truncation_ratio = 1.5; c->truncation_ratio_min = 0.0);
    VARIANT("gspo dual clip", 0.2, c->sequence_level_importance_ratios = true; c->token_level_loss = false;
            c->ratio_clip_c = 1.1);
    VARIANT("cispo", 0.2, c->use_cispo = true);
    VARIANT("cispo is icepop", 0.2, c->use_cispo = true; c->use_importance_sampling_correction = true;
            c->truncation = GRPO_TRUNCATION_ICEPOP; c->truncation_ratio = 1.1; c->truncation_ratio_min = 0.9);
    VARIANT("reinforce", 0.2, c->disable_ppo_ratio = true);
    VARIANT("reinforce sequence-level is", 0.2, c->disable_ppo_ratio = true; c->token_level_loss = false;
            c->use_importance_sampling_correction = true);
    VARIANT("vapo nll", 0.2, c->positive_example_nll_weight = 0.3; variants[n].extra = 1);
    VARIANT("vapo nll sequence-level", 0.2, c->positive_example_nll_weight = 0.3; c->token_level_loss = false;
            variants[n].extra = 1);
    VARIANT("token advantages, kl in reward", 0.2, c->use_kl_in_reward = true; variants[n].extra = 2);
#undef VARIANT
    static batch b;
    for (int v = 0; v < n; v++) {
        int checked = 0;
        for (int rep = 0; rep < 3; rep++) {
            random_batch(&b, 12, variants[v].spread);
            // extra 1: rewards of both signs (VAPO); 2: per-token advantages
            b.use_rewards = variants[v].extra == 1;
            b.use_tadv = variants[v].extra == 2;
            for (int64_t s = 0; s < b.S; s++)
                b.reward[s] = (float)normal();
            for (int64_t t = 0; t < b.T; t++)
                b.tadv[t] = (float)normal();
            checked += check_gradient(&variants[v].cfg, &b, variants[v].name);
        }
        ck_assert_msg(checked >= 60, "%s: only %d tokens away from kinks (seed %llu)", variants[v].name, checked,
                      (unsigned long long)test_seed);
    }
}
END_TEST

/* Splitting the global batch into microbatches (each given the GLOBAL counts) gives losses, gradients and metrics
 * that add up to the whole batch's, for token- and sequence-level normalisation. */
START_TEST(test_microbatches_sum_to_global)
{
    static batch whole, part;
    for (int level = 0; level < 2; level++) {
        random_batch(&whole, 10, 0.3);
        grpo_loss_config cfg = plain_config();
        cfg.reference_policy_kl_penalty = 0.02;
        cfg.use_importance_sampling_correction = true;
        cfg.truncation = GRPO_TRUNCATION_TIS;
        cfg.truncation_ratio = 1.1;
        cfg.token_level_loss = level == 0;
        grpo_loss_inputs in = inputs_of(&whole);
        static float grad_whole[MAX_T], grad_part[MAX_T];
        double loss_whole, loss_sum = 0.0;
        grpo_loss_metrics m_whole, m_sum, m_part;
        grpo_loss_metrics_init(&m_sum);
        dsarl_error err = {0};
        ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss_whole, grad_whole, &m_whole, &err), 0);
        for (int64_t s0 = 0; s0 < whole.S; s0 += 4) {
            int64_t s1 = s0 + 4 < whole.S ? s0 + 4 : whole.S;
            memset(&part, 0, sizeof part);
            for (int64_t s = s0; s < s1; s++) {
                int64_t n = whole.cu[s + 1] - whole.cu[s], t0 = add_seq(&part, n, whole.adv[s]);
                part.sample[part.S - 1] = whole.sample[s];
                for (int64_t i = 0; i < n; i++) {
                    int64_t t = whole.cu[s] + i;
                    part.lp[t0 + i] = whole.lp[t];
                    part.old[t0 + i] = whole.old[t];
                    part.gen[t0 + i] = whole.gen[t];
                    part.ref[t0 + i] = whole.ref[t];
                    part.tok[t0 + i] = whole.tok[t];
                }
            }
            grpo_loss_inputs pin = inputs_of(&part);
            pin.global_valid_toks = in.global_valid_toks;
            pin.global_valid_seqs = in.global_valid_seqs;
            double loss_part;
            ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &pin, &loss_part, grad_part, &m_part, &err), 0);
            loss_sum += loss_part;
            grpo_loss_metrics_add(&m_sum, &m_part);
            for (int64_t t = 0; t < part.T; t++)
                ck_assert(grad_part[t] == grad_whole[whole.cu[s0] + t]);
        }
        assert_close(loss_sum, loss_whole, 1e-12, "microbatch loss sum");
        assert_close(m_sum.token_mult_prob_error, m_whole.token_mult_prob_error, 1e-12, "metric sum");
        assert_close(m_sum.sampling_importance_ratio, m_whole.sampling_importance_ratio, 1e-12, "metric sum");
        assert_close(m_sum.kl_penalty, m_whole.kl_penalty, 1e-12, "kl_penalty sum");
        assert_close(m_sum.is_oob_ratio, m_whole.is_oob_ratio, 1e-12, "is_oob sum");
        ck_assert(m_sum.probs_ratio_min == m_whole.probs_ratio_min && m_sum.probs_ratio_max == m_whole.probs_ratio_max);
        assert_close(m_sum.num_valid_samples, m_whole.num_valid_samples, 0.0, "num_valid_samples");
    }
}
END_TEST

START_TEST(test_bad_arguments_refused)
{
    batch b = {0};
    add_seq(&b, 2, 1.0f);
    grpo_loss_inputs in = inputs_of(&b);
    grpo_loss_config cfg = plain_config();
    double loss;
    dsarl_error err = {0};
    int32_t bad_cu[2] = {0, 3};  // ends past n_tokens
    in.cu_seqlens = bad_cu;
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, NULL, NULL, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "cu_seqlens"));
    in = inputs_of(&b);
    in.lp_gen = NULL;
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, NULL, NULL, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "lp_gen"));
    in = inputs_of(&b);
    in.global_valid_toks = -1.0;
    ck_assert_int_eq(grpo_clipped_pg_loss(&cfg, &in, &loss, NULL, NULL, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "global_valid_toks"));
}
END_TEST

static Suite *grpo_loss_suite(void)
{
    Suite *s = suite_create("grpo_loss");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_clip_token_level_by_hand);
    tcase_add_test(tc, test_sequence_level_by_hand);
    tcase_add_test(tc, test_dual_clip_by_hand);
    tcase_add_test(tc, test_kl_by_hand);
    tcase_add_test(tc, test_importance_sampling_by_hand);
    tcase_add_test(tc, test_seq_mask_tis_by_hand);
    tcase_add_test(tc, test_force_on_policy_by_hand);
    tcase_add_test(tc, test_diagnostics_by_hand);
    tcase_add_test(tc, test_gspo_by_hand);
    tcase_add_test(tc, test_cispo_by_hand);
    tcase_add_test(tc, test_reinforce_by_hand);
    tcase_add_test(tc, test_vapo_nll_by_hand);
    tcase_add_test(tc, test_gradient_finite_differences);
    tcase_add_test(tc, test_microbatches_sum_to_global);
    tcase_add_test(tc, test_bad_arguments_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    seed_rng();
    printf("check_grpo_loss: seed %llu (set DSARL_TEST_SEED to repeat)\n", (unsigned long long)test_seed);
    SRunner *sr = srunner_create(grpo_loss_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
