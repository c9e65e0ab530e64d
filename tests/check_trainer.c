/* check_trainer.c: the trainer services (core/include/dsarl/trainer.h) on a tiny GLM-5.2 on the CPU: the training
 * pass through train_forward/train_backward and through the forward_logprobs + backward fallback give the same
 * log-probs and gradients and are counted as training-pass tokens; the optimizer slice tail equals the hand-written
 * norm -> clip -> step; the one deadline rule; the session opening device -> DSA -> model -> tokenizer (with the
 * vocabulary check and the fallback model plugin), starting the metrics and closing. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "cpu_device.h"
#include "cpu_model_fixture.h"
#include "dsa_reference.h"
#include "dsarl/fileutil.h"
#include "dsarl/rng.h"
#include "dsarl/trainer.h"
#include "glm5_ops.h"
#include "recipe_internal.h"

static dsarl_error err;

#define TINY_MODEL(vocab)                                                                                          \
    "policy:\n"                                                                                                    \
    "  model_config:\n"                                                                                            \
    "    vocab_size: " vocab "\n    hidden_size: 16\n    intermediate_size: 24\n    moe_intermediate_size: 6\n"     \
    "    num_hidden_layers: 2\n    num_attention_heads: 2\n    num_key_value_heads: 2\n    q_lora_rank: 12\n"      \
    "    kv_lora_rank: 8\n    qk_nope_head_dim: 4\n    qk_rope_head_dim: 4\n    v_head_dim: 6\n"                   \
    "    n_routed_experts: 4\n    num_experts_per_tok: 2\n    n_group: 2\n    topk_group: 2\n    index_topk: 3\n"   \
    "    index_head_dim: 8\n    index_n_heads: 2\n    first_k_dense_replace: 1\n"                                   \
    "    n_shared_experts: 1\n    initializer_range: 0.2\n"                                                         \
    "  megatron_cfg:\n    model_overrides:\n      dsa_indexer_loss_coeff: 0.01\n"

static const char *recipe_text = TINY_MODEL("40");

enum { T = 9, V = 40 };
static const int32_t cu[3] = {0, 5, 9};

/* A model with the ABI 1.2 training pass: train_forward keeps the batch, train_backward runs the backward of that
 * pass. Counts the calls so the test sees which path the services took. */
static struct {
    const dsarl_token_batch *batch;
    const int32_t *targets;
    int forwards, backwards;
} pending;

static int two_pass_forward(dsarl_model *m, const dsarl_token_batch *b, const int32_t *targets, float *lp,
                            dsarl_error *e)
{
    pending.batch = b, pending.targets = targets, pending.forwards++;
    return glm5_2_model_ops.forward_logprobs(m, b, targets, lp, e);
}

static int two_pass_backward(dsarl_model *m, const float *dlp, float *indexer_loss, dsarl_error *e)
{
    ck_assert_ptr_nonnull(pending.batch);
    pending.backwards++;
    int rc = glm5_2_model_ops.backward(m, pending.batch, pending.targets, dlp, indexer_loss, e);
    pending.batch = NULL;
    return rc;
}

static void random_batch(dsarl_rng *rng, int32_t *tokens, int32_t *targets, float *dlp)
{
    for (int t = 0; t < T; t++) {
        tokens[t] = (int32_t)dsarl_rng_below(rng, V);
        targets[t] = t == 4 || t == 8 ? -1 : (int32_t)dsarl_rng_below(rng, V);
        dlp[t] = dsarl_rng_uniform(rng) - 0.3f;
    }
}

START_TEST(test_train_pass_paths_agree)
{
    // path 0: a 1.1 model (no training pass: forward_logprobs + backward); path 1: a training pass that counts
    // its calls; path 2: the glm5 model's own single-forward training pass
    dsarl_model_ops legacy = glm5_2_model_ops, with_pass = glm5_2_model_ops;
    legacy.train_forward = NULL;
    legacy.train_backward = NULL;
    with_pass.train_forward = two_pass_forward;
    with_pass.train_backward = two_pass_backward;
    ck_assert(DSARL_MODEL_HAS(&with_pass, train_forward));
    ck_assert(!DSARL_MODEL_HAS(&legacy, train_forward));
    ck_assert(DSARL_MODEL_HAS(&glm5_2_model_ops, train_forward));
    enum { N_PATHS = 3 };
    const dsarl_model_ops *paths[N_PATHS] = {&legacy, &with_pass, &glm5_2_model_ops};
    uint64_t seed = (uint64_t)time(NULL);
    float lp[N_PATHS][T], lp_eval[T];
    double norm[N_PATHS];
    int32_t tokens[T], targets[T];
    float dlp[T];
    dsarl_rng rng;
    dsarl_rng_init(&rng, seed, 7);
    random_batch(&rng, tokens, targets, dlp);
    dsarl_token_batch b = {.struct_size = sizeof b, .n_tokens = T, .n_sequences = 2, .tokens = tokens,
                           .cu_seqlens = cu};
    for (int p = 0; p < N_PATHS; p++) {
        cpu_model_fixture f;
        cpu_model_fixture_open(&f, &glm5_2_model_ops, recipe_text, "trainer.yaml", seed);
        memset(&pending, 0, sizeof pending);
        dsarl_pass_counts counts = {0, 0};
        ck_assert_int_eq(glm5_2_model_ops.zero_grad(f.model, &err), 0);
        ck_assert_msg(dsarl_trainer_train_forward(paths[p], f.model, &b, targets, lp[p], &counts, &err) == 0, "%s",
                      err.message);
        float il = NAN;
        ck_assert_msg(dsarl_trainer_train_backward(paths[p], f.model, &b, targets, dlp, &il, &err) == 0, "%s",
                      err.message);
        ck_assert(isfinite(il));
        ck_assert_int_eq(pending.forwards, p == 1);
        ck_assert_int_eq(pending.backwards, p == 1);
        ck_assert_int_eq(counts.train_pass_tokens, T);
        ck_assert_int_eq(counts.forward_tokens, 0);
        ck_assert_int_eq(glm5_2_model_ops.grad_norm(f.model, &norm[p], &err), 0);
        ck_assert(norm[p] > 0.0);
        ck_assert_int_eq(dsarl_trainer_forward(paths[p], f.model, &b, targets, lp_eval, &counts, &err), 0);
        ck_assert_int_eq(counts.forward_tokens, T);
        ck_assert_int_eq(counts.train_pass_tokens, T);
        ck_assert_int_eq(memcmp(lp_eval, lp[p], sizeof lp_eval), 0); // the weights did not move
        cpu_model_fixture_close(&f);
    }
    for (int p = 1; p < N_PATHS; p++) {
        ck_assert_msg(memcmp(lp[0], lp[p], sizeof lp[0]) == 0, "path %d: log-probs differ", p);
        ck_assert_msg(norm[0] == norm[p], "path %d: grad norms %.17g vs %.17g", p, norm[0], norm[p]);
    }
    for (int t = 0; t < T; t++) // log-probs of real targets (position 4 and 8 end their sequences)
        ck_assert(targets[t] < 0 || (isfinite(lp[0][t]) && lp[0][t] < 0.0f));
}
END_TEST

/* dsarl_trainer_optimizer_step against the steps written out: norm, Megatron's clip factor, AdamW at lr. */
START_TEST(test_optimizer_step_is_norm_clip_step)
{
    uint64_t seed = (uint64_t)time(NULL) + 1;
    int32_t tokens[T], targets[T];
    float dlp[T];
    dsarl_rng rng;
    dsarl_rng_init(&rng, seed, 3);
    random_batch(&rng, tokens, targets, dlp);
    dsarl_token_batch b = {.struct_size = sizeof b, .n_tokens = T, .n_sequences = 2, .tokens = tokens,
                           .cu_seqlens = cu};
    const dsarl_model_ops *ops = &glm5_2_model_ops;
    float after[3][T];
    double norms[3];
    dsarl_optimizer_params adam = {.struct_size = sizeof adam, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                                   .weight_decay = 0.01, .grad_scale = 1.0};
    for (int k = 0; k < 3; k++) { // 0: services, clipped; 1: by hand, clipped; 2: services, no clip
        cpu_model_fixture f;
        cpu_model_fixture_open(&f, ops, recipe_text, "trainer.yaml", seed);
        ck_assert_int_eq(ops->zero_grad(f.model, &err), 0);
        ck_assert_msg(ops->backward(f.model, &b, targets, dlp, NULL, &err) == 0, "%s", err.message);
        double norm;
        ck_assert_int_eq(ops->grad_norm(f.model, &norm, &err), 0);
        double max_norm = k == 2 ? 0.0 : 0.25 * norm; // forces the clip
        if (k == 1) {
            dsarl_optimizer_params op = adam;
            op.lr = 0.05;
            op.grad_scale = max_norm / (norm + 1e-6);
            ck_assert_int_eq(ops->optimizer_step(f.model, &op, &err), 0);
            norms[k] = norm;
        } else {
            ck_assert_msg(dsarl_trainer_optimizer_step(ops, f.model, &adam, 0.05, max_norm, &norms[k], &err) == 0,
                          "%s", err.message);
        }
        ck_assert_int_eq(ops->forward_logprobs(f.model, &b, targets, after[k], &err), 0);
        cpu_model_fixture_close(&f);
    }
    ck_assert(norms[0] == norms[1] && norms[0] == norms[2] && norms[0] > 0.0);
    ck_assert_int_eq(memcmp(after[0], after[1], sizeof after[0]), 0);
    ck_assert_int_ne(memcmp(after[0], after[2], sizeof after[0]), 0); // the clip changed the update
}
END_TEST

START_TEST(test_deadline_rule)
{
    dsarl_checkpoint_config c = {.enabled = true, .must_save_by_s = 100.0};
    ck_assert(dsarl_trainer_deadline_near(&c, 91.0, 9));  // 91 + 91/9 = 101.1 >= 100
    ck_assert(!dsarl_trainer_deadline_near(&c, 80.0, 8)); // 80 + 10 = 90
    ck_assert(dsarl_trainer_deadline_near(&c, 60.0, 1));  // one step of 60 s would not fit
    ck_assert(!dsarl_trainer_deadline_near(&c, 60.0, 0)); // nothing measured yet in this run
    c.must_save_by_s = -1.0;
    ck_assert(!dsarl_trainer_deadline_near(&c, 1e9, 1)); // no deadline
}
END_TEST

static int refuse_create(const dsarl_model_config *c, dsarl_model **out, dsarl_error *e)
{
    (void)c, (void)out;
    return DSARL_FAIL(e, DSARL_E_UNSUPPORTED, "this plugin does not serve the checkpoint");
}

static void open_session(const char *text, const dsarl_model_ops *ops, const dsarl_model_ops *fallback,
                         dsarl_recipe **recipe, dsarl_session *s, int *rc)
{
    ck_assert_msg(dsarl_recipe_load_string(text, "session.yaml", recipe, &err) == 0, "%s", err.message);
    ck_assert_msg(dsarl_recipe_resolve(*recipe, &err) == 0, "%s", err.message);
    dsarl_session_config sc = {.struct_size = sizeof sc, .recipe = dsarl_recipe_root(*recipe), .seed = 5,
                               .threads = 1, .device_ops = &dsarl_cpu_device_ops,
                               .dsa_ops = &dsarl_dsa_reference_ops, .model_ops = ops, .model_ops_fallback = fallback,
                               .tokenizer = "byte"};
    *rc = dsarl_session_open(&sc, s, &err);
}

START_TEST(test_session)
{
    dsarl_recipe *recipe;
    dsarl_session s;
    int rc;
    // the byte tokenizer's 260 ids do not fit a 40-token vocabulary
    open_session(recipe_text, &glm5_2_model_ops, NULL, &recipe, &s, &rc);
    ck_assert_int_eq(rc, DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "vocab_size") && strstr(err.message, "260"), "%s", err.message);
    dsarl_session_close(&s);
    dsarl_recipe_free(recipe);

    // a plugin that refuses the checkpoint hands over to the fallback
    dsarl_model_ops refuser = glm5_2_model_ops;
    refuser.create = refuse_create;
    open_session(TINY_MODEL("260"), &refuser, &glm5_2_model_ops, &recipe, &s, &rc);
    ck_assert_msg(rc == 0, "%s", err.message);
    ck_assert_ptr_eq(s.model_ops, &glm5_2_model_ops);
    ck_assert_ptr_nonnull(s.device);
    ck_assert_ptr_nonnull(s.dsa);
    ck_assert_ptr_nonnull(s.model);
    ck_assert_ptr_nonnull(s.tokenizer);
    ck_assert_int_eq(s.model_ops->vocab_size(s.model), 260);
    // a second model from the same configuration starts from the same weights
    dsarl_model *twin;
    ck_assert_msg(dsarl_session_create_model(&s, &twin, &err) == 0, "%s", err.message);
    int32_t tokens[T] = {3, 200, 17, 41, 99, 250, 8, 1, 130}, targets[T] = {200, 17, 41, 99, -1, 8, 1, 130, -1};
    float a[T], b2[T];
    dsarl_token_batch b = {.struct_size = sizeof b, .n_tokens = T, .n_sequences = 2, .tokens = tokens,
                           .cu_seqlens = cu};
    ck_assert_int_eq(s.model_ops->forward_logprobs(s.model, &b, targets, a, &err), 0);
    ck_assert_int_eq(s.model_ops->forward_logprobs(twin, &b, targets, b2, &err), 0);
    ck_assert_int_eq(memcmp(a, b2, sizeof a), 0);
    s.model_ops->destroy(twin);
    // start without checkpointing: nothing resumed, a fresh experiment directory
    char work[] = "/tmp/check_trainer_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(work));
    dsarl_checkpoint_config ck = {.enabled = false, .must_save_by_s = -1};
    dsarl_metrics_config mc = {.log_dir = work, .resume_step = 7};
    dsarl_trainer_state st;
    ck_assert_msg(dsarl_session_start(&s, &ck, NULL, &mc, &st, &err) == 0, "%s", err.message);
    ck_assert_int_eq(st.step, -1);
    ck_assert_int_eq(mc.resume_step, -1);
    ck_assert_ptr_nonnull(s.log);
    ck_assert(dsarl_path_exists(dsarl_metrics_dir(s.log)));
    ck_assert_ptr_eq(strstr(dsarl_metrics_dir(s.log), work), dsarl_metrics_dir(s.log));
    dsarl_session_close(&s);
    ck_assert_ptr_null(s.model);
    dsarl_session_close(&s); // closing twice is harmless
    dsarl_recipe_free(recipe);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", work);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

// Every parameter value and gradient of the model, concatenated: *n floats each into *values and *grads (NULL, or
// the buffers of an earlier snapshot, which are reused).
static void snapshot(const dsarl_model_ops *ops, dsarl_model *m, float **values, float **grads, size_t *n)
{
    size_t total = 0;
    for (int64_t i = 0; i < ops->parameter_tensors(m); i++) {
        const char *name;
        int32_t ndim;
        int64_t shape[DSARL_TENSOR_MAX_DIMS];
        int trainable;
        ck_assert_int_eq(ops->parameter_info(m, i, &name, &ndim, shape, &trainable, &err), 0);
        size_t numel = 1;
        for (int32_t d = 0; d < ndim; d++)
            numel *= (size_t)shape[d];
        *values = realloc(*values, (total + numel) * sizeof(float)); // a buffer of an earlier snapshot is reused
        *grads = realloc(*grads, (total + numel) * sizeof(float));
        ck_assert(*values && *grads);
        ck_assert_int_eq(ops->read_parameter(m, i, *values + total, *grads + total, &err), 0);
        total += numel;
    }
    *n = total;
}

/* The non-finite guard: a NaN reaching the gradients (through d loss / d logp, as a diverging loss would) skips
 * the update, leaves every weight as it was and zeroes the gradients; a finite step after it updates; a NaN loss
 * is skipped without looking at the gradients; the second non-finite step in a row (the recipe's limit 2) fails,
 * naming the first gradient tensor that is not finite and the key. */
START_TEST(test_nonfinite_guard)
{
    dsarl_recipe *recipe;
    dsarl_session s;
    int rc;
    open_session(TINY_MODEL("260") "  max_consecutive_nonfinite_steps: 2\n", &glm5_2_model_ops, NULL, &recipe, &s,
                 &rc);
    ck_assert_msg(rc == 0, "%s", err.message);
    ck_assert_int_eq(s.guard.max_consecutive, 2);
    const dsarl_model_ops *ops = s.model_ops;
    uint64_t seed = (uint64_t)time(NULL) + 11;
    int32_t tokens[T], targets[T];
    float dlp[T];
    dsarl_rng rng;
    dsarl_rng_init(&rng, seed, 5);
    random_batch(&rng, tokens, targets, dlp);
    dsarl_token_batch b = {.struct_size = sizeof b, .n_tokens = T, .n_sequences = 2, .tokens = tokens,
                           .cu_seqlens = cu};
    dsarl_optimizer_params adam = {.struct_size = sizeof adam, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                                   .grad_scale = 1.0};
    float poisoned[T];
    memcpy(poisoned, dlp, sizeof dlp);
    poisoned[1] = NAN;
    float *v0 = NULL, *g0 = NULL, *v1 = NULL, *g1 = NULL;
    size_t n0, n1;
    double norm;
    bool skipped;
    // 1. a NaN gradient: skipped, weights untouched, gradients zeroed
    snapshot(ops, s.model, &v0, &g0, &n0);
    ck_assert_int_eq(ops->zero_grad(s.model, &err), 0);
    ck_assert_int_eq(ops->backward(s.model, &b, targets, poisoned, NULL, &err), 0);
    ck_assert_msg(dsarl_session_optimizer_step(&s, &adam, 0.05, 1.0, "train/loss", 1.5, &norm, &skipped, &err) == 0,
                  "%s", err.message);
    ck_assert(skipped && !isfinite(norm));
    snapshot(ops, s.model, &v1, &g1, &n1);
    ck_assert_uint_eq(n0, n1);
    ck_assert_int_eq(memcmp(v0, v1, n0 * sizeof(float)), 0);
    for (size_t i = 0; i < n1; i++)
        ck_assert(g1[i] == 0.0f);
    ck_assert_int_eq(ops->optimizer_steps(s.model), 0);
    // 2. a finite step updates and resets the count
    ck_assert_int_eq(ops->backward(s.model, &b, targets, dlp, NULL, &err), 0);
    ck_assert_int_eq(dsarl_session_optimizer_step(&s, &adam, 0.05, 1.0, "train/loss", 1.5, &norm, &skipped, &err), 0);
    ck_assert(!skipped && isfinite(norm) && norm > 0.0);
    ck_assert_int_eq(s.guard.consecutive, 0);
    snapshot(ops, s.model, &v1, &g1, &n1);
    ck_assert_int_ne(memcmp(v0, v1, n0 * sizeof(float)), 0);
    ck_assert_int_eq(ops->optimizer_steps(s.model), 1);
    // 3. a NaN loss: skipped with finite gradients in place
    ck_assert_int_eq(ops->zero_grad(s.model, &err), 0);
    ck_assert_int_eq(ops->backward(s.model, &b, targets, dlp, NULL, &err), 0);
    memcpy(v0, v1, n1 * sizeof(float));
    ck_assert_int_eq(dsarl_session_optimizer_step(&s, &adam, 0.05, 1.0, "train/loss", NAN, &norm, &skipped, &err), 0);
    ck_assert(skipped);
    snapshot(ops, s.model, &v1, &g1, &n1);
    ck_assert_int_eq(memcmp(v0, v1, n1 * sizeof(float)), 0);
    // 4. a second one in a row ends the run, naming the tensor, the step and the key
    ck_assert_int_eq(ops->backward(s.model, &b, targets, poisoned, NULL, &err), 0);
    rc = dsarl_session_optimizer_step(&s, &adam, 0.05, 1.0, "train/loss", 0.5, &norm, &skipped, &err);
    ck_assert_int_eq(rc, DSARL_E_INTERNAL);
    ck_assert_msg(strstr(err.message, "optimizer step 2 (update 4 of this process)") &&
                  strstr(err.message, "first non-finite gradient: model.") &&
                  strstr(err.message, "2 non-finite steps in a row reached policy.max_consecutive_nonfinite_steps=2"),
                  "%s", err.message);
    ck_assert_int_eq(s.guard.skipped, 3);
    free(v0), free(g0), free(v1), free(g1);
    dsarl_session_close(&s);
    dsarl_recipe_free(recipe);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("trainer");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_train_pass_paths_agree);
    tcase_add_test(tc, test_optimizer_step_is_norm_clip_step);
    tcase_add_test(tc, test_deadline_rule);
    tcase_add_test(tc, test_session);
    tcase_add_test(tc, test_nonfinite_guard);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
