/* check_glm5_mtp.c: multi-token prediction in training (models/glm5/glm5_mtp.c) on a tiny model with two MTP depths
 * (MoE blocks with a full indexer): the backward against central finite differences of the training loss, for the
 * MTP parameters and, with the LM loss off, for every trunk parameter (the MTP loss reaches the trunk only through
 * its final hidden states); the MTP loss against a hand computation; the refusals; saves: the MTP tensors
 * change after training steps with MTP on and stay byte-equal with it off; and routing replay, whose rows cover
 * the trunk's layers only (the depths neither record nor replay). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_device.h"
#include "dsa_reference.h"
#include "glm5_fd.h"
#include "glm5_ops.h"
#include "glm5_pass.h"
#include "recipe_internal.h"

#define RECIPE_MODEL                                                                                                \
    "policy:\n"                                                                                                     \
    "  model_config:\n"                                                                                             \
    "    vocab_size: 48\n    hidden_size: 16\n    intermediate_size: 24\n    moe_intermediate_size: 6\n"            \
    "    num_hidden_layers: 3\n    num_attention_heads: 2\n    num_key_value_heads: 2\n    q_lora_rank: 12\n"      \
    "    kv_lora_rank: 8\n    qk_nope_head_dim: 4\n    qk_rope_head_dim: 4\n    v_head_dim: 6\n"                   \
    "    n_routed_experts: 8\n    num_experts_per_tok: 2\n    n_group: 2\n    topk_group: 2\n    index_topk: 3\n"   \
    "    index_head_dim: 8\n    index_n_heads: 3\n    first_k_dense_replace: 1\n    index_topk_pattern: FSF\n"      \
    "    n_shared_experts: 1\n    initializer_range: 0.35\n    num_nextn_predict_layers: %d\n"                     \
    "  megatron_cfg:\n    mtp_num_layers: %d\n    mtp_loss_scaling_factor: 0.3\n"                                \
    "    model_overrides:\n      dsa_indexer_loss_coeff: 0.0\n"

static dsarl_device *dev;
static dsarl_dsa_context *dsa;
static dsarl_recipe *recipe;
static dsarl_model *model;
static dsarl_error err;
static const dsarl_model_ops *ops = &glm5_2_model_ops;
static char tmp[64];

enum { T = 11, V = 48, C = 16, DEPTHS = 2 };
// MTP keys of a save: per depth 4 + 19 whole tensors and the fused experts as 8 x 3 per-expert keys
enum { N_SAVED_MTP = DEPTHS * (4 + 19 + 8 * 3) };
static int32_t tokens[T] = {5, 17, 3, 40, 22, 9, 31, 2, 47, 11, 26}, cu[3] = {0, 6, 11};
static int32_t targets[T] = {17, 3, 40, 22, 9, -1, 2, 47, 11, 26, -1};
static float dlogprobs[T], zeros[T];
static dsarl_token_batch batch = {.struct_size = sizeof(dsarl_token_batch), .n_tokens = T, .n_sequences = 2,
                                  .tokens = tokens, .cu_seqlens = cu};

static int create(int nextn, int mtp, const char *dir, const dsarl_parallel *par, dsarl_model **out)
{
    char text[2048];
    snprintf(text, sizeof text, RECIPE_MODEL, nextn, mtp);
    if (recipe)
        dsarl_recipe_free(recipe);
    ck_assert_int_eq(dsarl_recipe_load_string(text, "mtp.yaml", &recipe, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(recipe, &err), 0);
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(recipe), .model_dir = dir,
                             .device_ops = &dsarl_cpu_device_ops, .device = dev, .dsa_ops = &dsarl_dsa_reference_ops,
                             .dsa = dsa, .seed = 11, .parallel = par};
    *out = NULL;
    return ops->create(&mc, out, &err);
}

static void setup(void)
{
    dsarl_device_config dc = {.struct_size = sizeof(dc), .threads = 1};
    ck_assert_int_eq(cpu_create(&dc, &dev, &err), 0);
    ck_assert_int_eq(dsarl_dsa_reference_ops.create(&dsarl_cpu_device_ops, dev, NULL, &dsa, &err), 0);
    ck_assert_msg(create(DEPTHS, DEPTHS, NULL, NULL, &model) == 0, "%s", err.message);
    // norm weights away from one, so their gradients are exercised
    for (int64_t i = 0; i < ops->parameter_tensors(model); i++) {
        const glm5_param *p = &model->params[i];
        if (p->ndim != 1 || strstr(p->name, "bias"))
            continue;
        float v[64];
        ck_assert_int_eq(ops->read_parameter(model, i, v, NULL, &err), 0);
        for (int64_t j = 0; j < p->numel; j++)
            v[j] += 0.1f * sinf((float)(7 * i + 3 * j));
        ck_assert_int_eq(ops->write_parameter(model, i, v, &err), 0);
    }
    for (int t = 0; t < T; t++)
        dlogprobs[t] = 0.5f + 0.4f * cosf((float)(3 * t + 1));
    snprintf(tmp, sizeof tmp, "/tmp/check_glm5_mtp_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmp));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    ck_assert_int_eq(system(cmd), 0);
    ops->destroy(model);
    model = NULL;
    dsarl_dsa_reference_ops.destroy(dsa);
    cpu_destroy(dev);
    dsarl_recipe_free(recipe);
    recipe = NULL;
}

// What the MTP loss counts and divides by (the model op mtp_loss between forward and backward); NULL, 0: defaults.
static const float *mtp_mask;
static double mtp_norm;

// One training forward, then the MTP loss's weighing; returns the MTP loss.
static double forward_weighed(float *lp)
{
    ck_assert_msg(ops->train_forward(model, &batch, targets, lp, &err) == 0, "%s", err.message);
    float mtp = -1.0f;
    ck_assert_int_eq(ops->mtp_loss(model, mtp_mask, mtp_norm, &mtp), DEPTHS);
    ck_assert_float_eq(mtp, model->mtp_loss);
    return mtp;
}

// The training loss sum_t dlp[t] logprobs[t] + the MTP loss, from one training forward.
static double train_loss(const float *dlp)
{
    float lp[T];
    double s = forward_weighed(lp);
    glm5_train_release(model);
    for (int t = 0; t < T; t++)
        s += (double)dlp[t] * lp[t];
    return s;
}

static bool is_mtp(const glm5_param *p) { return p->layer >= model->cfg.num_hidden_layers; }

static double fd_loss(void *dlp) { return train_loss(dlp); }

// The gradient of one training pass from dlp (the MTP loss weighed as mtp_mask, mtp_norm say) against central
// differences of train_loss (glm5_fd.h) on `per_tensor` elements of the tensors `pick` selects.
static void fd_check(const float *dlp, bool (*pick)(const glm5_param *), int per_tensor, glm5_fd_stats *st)
{
    ck_assert_int_eq(ops->zero_grad(model, &err), 0);
    float lp0[T];
    forward_weighed(lp0);
    ck_assert_msg(ops->train_backward(model, dlp, NULL, &err) == 0, "%s", err.message);
    float *grads = malloc((size_t)model->n_weights * sizeof(float));
    memcpy(grads, model->grads, (size_t)model->n_weights * sizeof(float)); // float32 storage on the cpu device
    glm5_fd_check(ops, model, grads, pick, per_tensor, fd_loss, (void *)dlp, st);
    free(grads);
}

static bool pick_mtp(const glm5_param *p) { return is_mtp(p); }
static bool pick_all(const glm5_param *p) { (void)p; return true; }

START_TEST(test_mtp_gradients_with_lm_loss)
{
    ck_assert_int_eq(model->cfg.mtp_layers, DEPTHS);
    int n_mtp = 0;
    for (int64_t i = 0; i < model->n_params; i++)
        n_mtp += is_mtp(&model->params[i]);
    // per depth: enorm, hnorm, eh_proj, shared_head.norm and a MoE block with a full indexer (21 tensors)
    ck_assert_int_eq(n_mtp, DEPTHS * (4 + 21));
    double loss = train_loss(zeros);
    ck_assert_msg(loss > 0.3 * 0.5 && loss < 0.3 * 2 * log((double)V), "MTP loss %g", loss);
    glm5_fd_stats st = {0};
    fd_check(dlogprobs, pick_all, 3, &st); // the trunk's too: its LM-head logits are computed again for its backward
    fprintf(stderr, "every parameter (LM + MTP loss): %d checked, %d skipped at kinks, worst %.3g (%s)\n", st.checked,
            st.skipped, st.worst, st.worst_name);
    ck_assert_msg(st.failed == 0, "%d elements disagree; worst %s", st.failed, st.worst_name);
    ck_assert_int_gt(st.checked, 4 * st.skipped);
}
END_TEST

/* The caller's token mask and normalisation (GRPO: the response tokens, divided by the slice's count): the gradient
 * follows the loss they define. */
START_TEST(test_mtp_gradients_with_caller_mask_and_norm)
{
    static const float mask[T] = {0, 1, 1, 0, 1, 1, 0, 0, 1, 1, 1};
    mtp_mask = mask, mtp_norm = 23.0;
    glm5_fd_stats st = {0};
    fd_check(dlogprobs, pick_mtp, 2, &st);
    fprintf(stderr, "MTP parameters (mask, norm 23): %d checked, %d skipped at kinks, worst %.3g (%s)\n", st.checked,
            st.skipped, st.worst, st.worst_name);
    mtp_mask = NULL, mtp_norm = 0.0;
    ck_assert_msg(st.failed == 0, "%d elements disagree; worst %s", st.failed, st.worst_name);
    ck_assert_int_gt(st.checked, 4 * st.skipped);
}
END_TEST

/* With the LM loss off, the MTP loss alone trains the trunk, through hnorm(h_final): every trunk parameter's gradient
 * (embedding, layers, final norm, LM head) matches the differences of the MTP loss. */
START_TEST(test_mtp_gradients_reach_trunk_through_hidden_states)
{
    glm5_fd_stats st = {0};
    fd_check(zeros, pick_all, 2, &st);
    fprintf(stderr, "every parameter (MTP loss only): %d checked, %d skipped at kinks, worst %.3g (%s)\n", st.checked,
            st.skipped, st.worst, st.worst_name);
    ck_assert_msg(st.failed == 0, "%d elements disagree; worst %s", st.failed, st.worst_name);
    ck_assert_int_gt(st.checked, 4 * st.skipped);
    // the trunk's layers got a gradient from the MTP loss alone (their only path is the final hidden states)
    ck_assert_int_eq(ops->zero_grad(model, &err), 0);
    ck_assert_int_eq(ops->backward(model, &batch, targets, zeros, NULL, &err), 0);
    const glm5_param *q = glm5_model_find_param(model, "model.layers.0.self_attn.q_b_proj.weight");
    double mx = 0;
    for (int64_t j = 0; j < q->numel; j++)
        mx = fmax(mx, fabs(((float *)model->grads)[q->offset + j]));
    ck_assert_msg(mx > 0.0, "the trunk got no MTP gradient");
}
END_TEST

// Host float32 copy of parameter name.
static float *param(const char *name)
{
    const glm5_param *p = glm5_model_find_param(model, name);
    ck_assert_msg(p != NULL, "no parameter %s", name);
    float *v = malloc((size_t)p->numel * sizeof(float));
    ck_assert_int_eq(ops->read_parameter(model, p - model->params, v, NULL, &err), 0);
    return v;
}

static void set_param(const char *name, float *v)
{
    const glm5_param *p = glm5_model_find_param(model, name);
    ck_assert_int_eq(ops->write_parameter(model, p - model->params, v, &err), 0);
}

static void rmsnorm(double *y, const double *x, const float *w, double eps)
{
    double ss = 0;
    for (int c = 0; c < C; c++)
        ss += x[c] * x[c];
    double r = 1.0 / sqrt(ss / C + eps);
    for (int c = 0; c < C; c++)
        y[c] = w[c] * x[c] * r;
}

/* The MTP loss by hand, from five tensors (see test_mtp_loss_by_hand): 0.3 / 2 * sum over depths of the cross
 * entropy summed over the counted positions, divided by norm (0: by their count). */
static double loss_by_hand(const float *mask, double norm)
{
    char name[96];
    float *embed = param("model.embed_tokens.weight"), *head = param("lm_head.weight");
    double eps = model->cfg.rms_norm_eps, want = 0;
    for (int k = 0; k < DEPTHS; k++) {
        snprintf(name, sizeof name, "model.layers.%d.enorm.weight", 3 + k);
        float *enorm = param(name);
        snprintf(name, sizeof name, "model.layers.%d.shared_head.norm.weight", 3 + k);
        float *hnorm = param(name);
        snprintf(name, sizeof name, "model.layers.%d.eh_proj.weight", 3 + k);
        float *eh = param(name);
        double sum = 0;
        int scored = 0;
        for (int s = 0; s < 2; s++)
            for (int i = cu[s]; i < cu[s + 1]; i++) {
                int j = i + k + 1; // depth k + 1 reads t_j and predicts t_{j+1} = targets[j]
                if (j >= cu[s + 1] || targets[j] < 0 || (mask && mask[j] == 0.0f))
                    continue;
                double e[C], en[C], x[C], h[C], z[V];
                for (int c = 0; c < C; c++)
                    e[c] = embed[tokens[j] * C + c];
                rmsnorm(en, e, enorm, eps);
                for (int r = 0; r < C; r++) {
                    x[r] = 0;
                    for (int c = 0; c < C; c++)
                        x[r] += (double)eh[r * 2 * C + c] * en[c];
                }
                rmsnorm(h, x, hnorm, eps);
                double top = -INFINITY, lse = 0;
                for (int v = 0; v < V; v++) {
                    z[v] = 0;
                    for (int c = 0; c < C; c++)
                        z[v] += (double)head[v * C + c] * h[c];
                    top = fmax(top, z[v]);
                }
                for (int v = 0; v < V; v++)
                    lse += exp(z[v] - top);
                sum += top + log(lse) - z[targets[j]];
                scored++;
            }
        if (!mask) // each sequence's last target is ignored
            ck_assert_int_eq(scored, k == 0 ? 7 : 5);
        want += 0.3 / DEPTHS * sum / (norm > 0 ? norm : scored);
        free(enorm), free(hnorm), free(eh);
    }
    free(embed), free(head);
    return want;
}

/* The MTP loss by hand: with o_proj and every down projection of the MTP blocks zeroed, each block is the identity
 * (both residual branches add 0), and with eh_proj's hidden half zeroed, depth k's logits at position i are
 * shared_head.norm(eh_proj[:, :C] enorm(embed(t_{i+k}))) lm_head^T. By default each depth's mean over the positions
 * with a target at i + k; with the caller's mask and count, their weighing. */
START_TEST(test_mtp_loss_by_hand)
{
    char name[96];
    for (int k = 0; k < DEPTHS; k++) {
        const char *zeroed[] = {"self_attn.o_proj.weight", "mlp.experts.down_proj", "mlp.shared_experts.down_proj.weight"};
        for (size_t z = 0; z < 3; z++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", 3 + k, zeroed[z]);
            const glm5_param *p = glm5_model_find_param(model, name);
            ck_assert_ptr_nonnull(p);
            float *v = calloc((size_t)p->numel, sizeof(float));
            set_param(name, v);
            free(v);
        }
        snprintf(name, sizeof name, "model.layers.%d.eh_proj.weight", 3 + k);
        float *eh = param(name);
        for (int r = 0; r < C; r++)
            for (int c = C; c < 2 * C; c++)
                eh[r * 2 * C + c] = 0.0f;
        set_param(name, eh);
        free(eh);
    }
    double got = train_loss(zeros), want = loss_by_hand(NULL, 0.0);
    fprintf(stderr, "MTP loss %.7g, by hand %.7g\n", got, want);
    ck_assert_msg(fabs(got - want) <= 1e-5 * fabs(want), "MTP loss %.7g, by hand %.7g", got, want);
    static const float mask[T] = {1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1};
    mtp_mask = mask, mtp_norm = 17.0;
    got = train_loss(zeros), want = loss_by_hand(mask, 17.0);
    mtp_mask = NULL, mtp_norm = 0.0;
    fprintf(stderr, "MTP loss (mask, norm 17) %.7g, by hand %.7g\n", got, want);
    ck_assert_msg(fabs(got - want) <= 1e-5 * fabs(want), "MTP loss %.7g, by hand %.7g", got, want);
}
END_TEST

static void expect_refusal(int nextn, int mtp, const dsarl_parallel *par, int code, const char *text)
{
    dsarl_model *m = NULL;
    ck_assert_int_ne(create(nextn, mtp, NULL, par, &m), 0);
    ck_assert_ptr_null(m);
    ck_assert_int_eq(err.code, code);
    ck_assert_msg(strstr(err.message, text) != NULL, "message: %s", err.message);
    ck_assert_msg(strstr(err.message, "mtp.yaml:") && strstr(err.message, "policy.megatron_cfg.mtp_num_layers"),
                  "the key's place: %s", err.message);
    fprintf(stderr, "refused: %s\n", err.message);
}

START_TEST(test_mtp_refusals)
{
    expect_refusal(0, 1, NULL, DSARL_E_INVALID, "has no MTP layer (num_nextn_predict_layers 0)");
    expect_refusal(2, 3, NULL, DSARL_E_INVALID, "has only 2 MTP layer(s)");
    expect_refusal(2, -1, NULL, DSARL_E_INVALID, "mtp_num_layers must be >= 0");
    dsarl_parallel par = DSARL_PARALLEL_SINGLE;
    par.tp_size = 2;
    expect_refusal(2, 1, &par, DSARL_E_INVALID, "policy.megatron_cfg.tensor_model_parallel_size is 2");
    par = (dsarl_parallel)DSARL_PARALLEL_SINGLE;
    par.cp_size = 2;
    expect_refusal(2, 1, &par, DSARL_E_INVALID, "policy.megatron_cfg.context_parallel_size is 2");
    par = (dsarl_parallel)DSARL_PARALLEL_SINGLE;
    par.pp_size = 2;
    expect_refusal(2, 1, &par, DSARL_E_INVALID, "policy.megatron_cfg.pipeline_model_parallel_size is 2");
    // off by default: a checkpoint with MTP layers builds none of them
    dsarl_model *m = NULL;
    ck_assert_int_eq(create(2, 0, NULL, NULL, &m), 0);
    ck_assert_int_eq(m->cfg.mtp_layers, 0);
    for (int64_t i = 0; i < m->n_params; i++)
        ck_assert_int_lt(m->params[i].layer, 3);
    ops->destroy(m);
}
END_TEST

// Model FLOPs of the training pass over the batch with `mtp` depths trained (the config only, nothing built).
static dsarl_model_flops flops_with(int mtp)
{
    char text[2048];
    snprintf(text, sizeof text, RECIPE_MODEL, DEPTHS, mtp);
    dsarl_recipe *r = NULL;
    ck_assert_int_eq(dsarl_recipe_load_string(text, "flops.yaml", &r, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(r, &err), 0);
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(r)};
    dsarl_model_flops f = {.struct_size = sizeof f};
    ck_assert_msg(ops->flops(&mc, &batch, &f, &err) == 0, "%s", err.message);
    dsarl_recipe_free(r);
    return f;
}

/* Each trained depth adds the same FLOPs (a block, eh_proj and an LM-head pass): at least eh_proj's and the head's
 * 2 x (2C x C + V x C) per token forward, and no more than the whole one-process model's. */
START_TEST(test_mtp_flops)
{
    dsarl_model_flops off = flops_with(0), one = flops_with(1), two = flops_with(2);
    double d1 = one.forward - off.forward, d2 = two.forward - off.forward;
    ck_assert_msg(fabs(d2 - 2 * d1) <= 1e-9 * d2, "depth FLOPs %g and %g", d1, d2);
    ck_assert_double_ge(d1, 2.0 * T * (2.0 * C * C + (double)V * C));
    ck_assert_double_lt(d1, off.forward);
    ck_assert_double_gt(two.backward - off.backward, 0.0);
    ck_assert_ptr_nonnull(strstr(two.summary, "MTP"));
}
END_TEST

// Two optimizer steps of the LM + MTP loss on m, then a save into dir.
static void train_and_save(dsarl_model *m, const char *dir)
{
    dsarl_optimizer_params adam = {.struct_size = sizeof(adam), .lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999,
                                   .eps = 1e-8, .weight_decay = 0.0, .grad_scale = 1.0};
    for (int step = 0; step < 2; step++) {
        ck_assert_int_eq(ops->zero_grad(m, &err), 0);
        ck_assert_msg(ops->backward(m, &batch, targets, dlogprobs, NULL, &err) == 0, "%s", err.message);
        ck_assert_int_eq(ops->optimizer_step(m, &adam, &err), 0);
    }
    ck_assert_msg(glm5_save_hf(m, dir, &err) == 0, "%s", err.message);
}

// Compares every MTP tensor (keys of layers >= 3) of two saved directories: equal bytes, or (differ) every
// trainable one changed. Returns how many there are.
static int compare_mtp(const char *a_dir, const char *b_dir, bool differ)
{
    char pa[160], pb[160];
    snprintf(pa, sizeof pa, "%s/model.safetensors", a_dir);
    snprintf(pb, sizeof pb, "%s/model.safetensors", b_dir);
    dsarl_safetensors_file *a = NULL, *b = NULL;
    ck_assert_msg(dsarl_safetensors_open(pa, &a, &err) == 0, "%s", err.message);
    ck_assert_msg(dsarl_safetensors_open(pb, &b, &err) == 0, "%s", err.message);
    int n = 0, trunk_changed = 0, experts = 0, experts_changed = 0;
    for (size_t i = 0; i < dsarl_safetensors_count(a); i++) {
        const char *name = dsarl_safetensors_name(a, i);
        int layer = -1;
        dsarl_tensor ta, tb;
        ck_assert_int_eq(dsarl_safetensors_get(a, name, &ta, &err), 0);
        ck_assert_msg(dsarl_safetensors_get(b, name, &tb, &err) == 0, "%s lacks %s", b_dir, name);
        ck_assert_uint_eq(dsarl_tensor_nbytes(&ta), dsarl_tensor_nbytes(&tb));
        bool same = memcmp(ta.data, tb.data, dsarl_tensor_nbytes(&ta)) == 0;
        if (sscanf(name, "model.layers.%d.", &layer) != 1 || layer < 3) {
            trunk_changed += !same;
            continue;
        }
        n++;
        if (!differ) {
            ck_assert_msg(same, "MTP tensor %s changed with MTP off", name);
        } else if (strstr(name, ".mlp.experts.")) { // an expert no token was routed to keeps its weights
            experts++, experts_changed += !same;
        } else if (!strstr(name, "e_score_correction_bias") && !strstr(name, ".indexer.")) { // (no indexer loss)
            ck_assert_msg(!same, "MTP tensor %s did not change with MTP on", name);
        }
    }
    ck_assert_int_ge(2 * experts_changed, experts);
    ck_assert_int_gt(trunk_changed, 10); // both runs trained the trunk
    dsarl_safetensors_close(a), dsarl_safetensors_close(b);
    return n;
}

START_TEST(test_mtp_saves)
{
    char src[128], on[128], off[128];
    snprintf(src, sizeof src, "%s/src", tmp);
    snprintf(on, sizeof on, "%s/on", tmp);
    snprintf(off, sizeof off, "%s/off", tmp);
    ck_assert_msg(glm5_save_hf(model, src, &err) == 0, "%s", err.message);
    dsarl_model *m = NULL;
    ck_assert_msg(create(DEPTHS, DEPTHS, src, NULL, &m) == 0, "%s", err.message);
    ck_assert_int_eq(m->cfg.mtp_layers, DEPTHS);
    ck_assert_int_eq((int)m->extra.n, 0); // every MTP tensor is built
    train_and_save(m, on);
    ck_assert_float_gt(m->mtp_loss, 0.0f);
    ops->destroy(m);
    ck_assert_int_eq(compare_mtp(src, on, true), N_SAVED_MTP);
    // MTP off: the same tensors are carried through the save untouched
    ck_assert_msg(create(DEPTHS, 0, src, NULL, &m) == 0, "%s", err.message);
    ck_assert_int_eq((int)m->extra.n, N_SAVED_MTP);
    train_and_save(m, off);
    ck_assert_float_eq(m->mtp_loss, 0.0f);
    ops->destroy(m);
    ck_assert_int_eq(compare_mtp(src, off, false), N_SAVED_MTP);
}
END_TEST

/* The LM head in chunks of rows (policy.logprob_chunk_size), activation recompute and the headwise attention form
 * change how the pass computes, not what: the MTP loss and every gradient equal the default pass's. */
START_TEST(test_mtp_same_under_chunks_recompute_and_headwise)
{
    float lp[T];
    size_t bytes = (size_t)model->n_weights * sizeof(float);
    float *want = malloc(bytes);
    double want_loss = 0;
    for (int variant = 0; variant < 4; variant++) {
        model->logprob_chunk = variant == 1 ? 4 : 0;
        model->activation_recompute = variant == 2;
        model->attention_form = variant == 3 ? GLM5_FORM_HEADWISE : GLM5_FORM_AUTO;
        ck_assert_int_eq(ops->zero_grad(model, &err), 0);
        ck_assert_msg(ops->train_forward(model, &batch, targets, lp, &err) == 0, "%s", err.message);
        ck_assert_msg(ops->train_backward(model, dlogprobs, NULL, &err) == 0, "%s", err.message);
        if (variant == 0) {
            memcpy(want, model->grads, bytes), want_loss = model->mtp_loss;
            continue;
        }
        ck_assert_msg(fabs(model->mtp_loss - want_loss) <= 1e-6 * want_loss, "variant %d: MTP loss %.8g, want %.8g",
                      variant, (double)model->mtp_loss, want_loss);
        for (int64_t i = 0; i < model->n_params; i++) {
            const glm5_param *p = &model->params[i];
            const float *g = (const float *)model->grads + p->offset, *w = want + p->offset;
            double mx = 0, worst = 0;
            for (int64_t j = 0; j < p->numel; j++)
                mx = fmax(mx, fabs(w[j])), worst = fmax(worst, fabs(g[j] - w[j]));
            ck_assert_msg(worst <= 1e-4 * mx + 1e-7, "variant %d: %s differs by %g (of %g)", variant, p->name, worst,
                          mx);
        }
    }
    free(want);
}
END_TEST

// The gradient (float32 storage on the cpu device) of parameter name of m.
static const float *grad_of(const dsarl_model *m, const char *name)
{
    const glm5_param *p = glm5_model_find_param(m, name);
    ck_assert_msg(p != NULL, "no parameter %s", name);
    return (const float *)m->grads + p->offset;
}

/* A checkpoint whose depths carry their own embed_tokens / shared_head.head (as DeepSeek-V3 releases do), here
 * copies of the trunk's: the depths train the copies, with the loss of the shared layout; the copies' gradients are
 * the shares the shared tensors got from the depths (the LM loss off, the trunk's LM head gets none). */
START_TEST(test_mtp_own_embedding_and_head)
{
    char src[128], own[128], path[192], cmd[512];
    snprintf(src, sizeof src, "%s/src", tmp);
    snprintf(own, sizeof own, "%s/own", tmp);
    ck_assert_msg(glm5_save_hf(model, src, &err) == 0, "%s", err.message);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s/config.json' '%s/'", own, src, own);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    dsarl_safetensors_file *f = NULL;
    ck_assert_int_eq(dsarl_safetensors_open(path, &f, &err), 0);
    size_t n = dsarl_safetensors_count(f);
    dsarl_safetensors_entry *e = calloc(n + 2 * DEPTHS, sizeof *e);
    char names[2 * DEPTHS][96];
    for (size_t i = 0; i < n; i++) {
        e[i].name = dsarl_safetensors_name(f, i);
        ck_assert_int_eq(dsarl_safetensors_get(f, e[i].name, &e[i].tensor, &err), 0);
    }
    for (int k = 0; k < 2 * DEPTHS; k++) {
        snprintf(names[k], sizeof names[k], "model.layers.%d.%s", 3 + k / 2,
                 k % 2 ? "shared_head.head.weight" : "embed_tokens.weight");
        e[n + k].name = names[k];
        ck_assert_int_eq(dsarl_safetensors_get(f, k % 2 ? "lm_head.weight" : "model.embed_tokens.weight",
                                               &e[n + k].tensor, &err), 0);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", own);
    ck_assert_msg(dsarl_safetensors_write(path, e, n + 2 * DEPTHS, NULL, 0, &err) == 0, "%s", err.message);
    free(e);
    dsarl_safetensors_close(f);
    dsarl_model *shared = NULL, *copies = NULL;
    ck_assert_msg(create(DEPTHS, DEPTHS, src, NULL, &shared) == 0, "%s", err.message);
    ck_assert_msg(create(DEPTHS, DEPTHS, own, NULL, &copies) == 0, "%s", err.message);
    ck_assert(!shared->cfg.mtp_own_head && copies->cfg.mtp_own_head && copies->cfg.mtp_own_embed);
    ck_assert_int_eq(copies->n_params, shared->n_params + 2 * DEPTHS);
    ck_assert_int_eq((int)copies->extra.n, 0);
    float lp[T];
    dsarl_model *both[2] = {shared, copies};
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(ops->zero_grad(both[i], &err), 0);
        ck_assert_msg(ops->train_forward(both[i], &batch, targets, lp, &err) == 0, "%s", err.message);
        ck_assert_msg(ops->train_backward(both[i], zeros, NULL, &err) == 0, "%s", err.message);
    }
    ck_assert_float_eq_tol(copies->mtp_loss, shared->mtp_loss, 1e-6f * shared->mtp_loss);
    const char *trunk[2] = {"lm_head.weight", "model.embed_tokens.weight"};
    for (int kind = 0; kind < 2; kind++) {
        const float *want = grad_of(shared, trunk[kind]), *rest = grad_of(copies, trunk[kind]);
        const float *g3 = grad_of(copies, names[1 - kind]), *g4 = grad_of(copies, names[3 - kind]);
        double mx = 0, worst = 0;
        for (int64_t j = 0; j < V * C; j++) {
            mx = fmax(mx, fabs(want[j]));
            worst = fmax(worst, fabs((double)rest[j] + g3[j] + g4[j] - want[j]));
            if (kind == 0)
                ck_assert_msg(rest[j] == 0.0f, "the trunk's LM head got an MTP gradient");
        }
        ck_assert_double_gt(mx, 0.0);
        ck_assert_msg(worst <= 1e-5 * mx, "%s: the copies' gradients differ from the shared one by %g (of %g)",
                      trunk[kind], worst, mx);
    }
    ops->destroy(shared);
    ops->destroy(copies);
}
END_TEST

/* Routing replay with MTP depths: the rows cover the trunk's layers only (no cached pass runs a depth, so the engine
 * has no choice of a depth's to record). A training pass that records writes the trunk's rows and nothing past them
 * (a depth's MoE and indexer layers come after the trunk's, so indexing them as one more layer would write into the
 * next token's row, and past the array at the last token); replaying those rows gives the trunk's log-probs, the
 * MTP loss and every gradient of the pass that routes by its own scores, the depths routing by theirs. */
START_TEST(test_mtp_routing_replay)
{
    dsarl_routing_shape sh = {.struct_size = sizeof sh};
    ck_assert_msg(ops->routing_shape(model, &sh, &err) == 0, "%s", err.message);
    ck_assert_int_eq(sh.moe_layers, 2);  // trunk layers 1, 2 (layer 0 dense); not the depths' 3, 4
    ck_assert_int_eq(sh.index_layers, 2); // F S F
    int64_t we = (int64_t)sh.moe_layers * sh.experts_per_token, wi = (int64_t)sh.index_layers * sh.index_topk;
    enum { GUARD = 64, SENTINEL = -7 };
    int32_t *rec_e = malloc(sizeof(int32_t) * (size_t)(T * we + GUARD));
    int32_t *rec_i = malloc(sizeof(int32_t) * (size_t)(T * wi + GUARD));
    int32_t *own_e = malloc(sizeof(int32_t) * (size_t)(T * we)), *own_i = malloc(sizeof(int32_t) * (size_t)(T * wi));
    for (int64_t i = 0; i < T * we + GUARD; i++)
        rec_e[i] = SENTINEL;
    for (int64_t i = 0; i < T * wi + GUARD; i++)
        rec_i[i] = SENTINEL;
    // the trunk's own choices: a log-prob pass runs no depth
    float lp[T], lp_replay[T];
    dsarl_token_batch b = batch;
    b.record_experts = own_e, b.record_indices = own_i;
    ck_assert_msg(ops->forward_logprobs(model, &b, targets, lp, &err) == 0, "%s", err.message);
    // a training pass runs both depths (MoE blocks with a full indexer) after the trunk, recording
    b.record_experts = rec_e, b.record_indices = rec_i;
    ck_assert_msg(ops->train_forward(model, &b, targets, lp, &err) == 0, "%s", err.message);
    glm5_train_release(model);
    for (int64_t i = 0; i < GUARD; i++) {
        ck_assert_msg(rec_e[T * we + i] == SENTINEL, "an expert row was written %lld ints past the last token's",
                      (long long)i);
        ck_assert_msg(rec_i[T * wi + i] == SENTINEL, "an index row was written %lld ints past the last token's",
                      (long long)i);
    }
    for (int64_t i = 0; i < T * we; i++)
        ck_assert_msg(rec_e[i] == own_e[i], "token %lld: recorded expert %d, the trunk routed to %d",
                      (long long)(i / we), rec_e[i], own_e[i]);
    for (int64_t i = 0; i < T * wi; i++)
        ck_assert_msg(rec_i[i] == own_i[i], "token %lld: recorded key %d, the trunk selected %d", (long long)(i / wi),
                      rec_i[i], own_i[i]);
    // the same pass and backward routing by its own scores, then replaying the recording
    size_t bytes = (size_t)model->n_weights * sizeof(float);
    float *want = malloc(bytes);
    double want_mtp = 0;
    for (int replay = 0; replay < 2; replay++) {
        b = batch;
        if (replay)
            b.replay_experts = rec_e, b.replay_indices = rec_i;
        ck_assert_int_eq(ops->zero_grad(model, &err), 0);
        ck_assert_msg(ops->train_forward(model, &b, targets, replay ? lp_replay : lp, &err) == 0, "%s", err.message);
        ck_assert_msg(ops->train_backward(model, dlogprobs, NULL, &err) == 0, "%s", err.message);
        if (!replay) {
            memcpy(want, model->grads, bytes), want_mtp = model->mtp_loss;
            continue;
        }
        for (int t = 0; t < T; t++)
            ck_assert_msg(fabsf(lp_replay[t] - lp[t]) <= 1e-6f, "position %d: replayed log-prob %.8g, own %.8g", t,
                          lp_replay[t], lp[t]);
        ck_assert_msg(fabs(model->mtp_loss - want_mtp) <= 1e-6 * want_mtp, "replayed MTP loss %.8g, own %.8g",
                      (double)model->mtp_loss, want_mtp);
        for (int64_t i = 0; i < model->n_params; i++) {
            const glm5_param *p = &model->params[i];
            const float *g = (const float *)model->grads + p->offset, *w = want + p->offset;
            double mx = 0, worst = 0;
            for (int64_t j = 0; j < p->numel; j++)
                mx = fmax(mx, fabs(w[j])), worst = fmax(worst, fabs(g[j] - w[j]));
            ck_assert_msg(worst <= 1e-5 * mx + 1e-8, "replayed: %s differs by %g (of %g)", p->name, worst, mx);
        }
    }
    fprintf(stderr, "MTP with replay: MTP loss %.7g, recorded rows stop at the trunk's %lld + %lld ints per token\n",
            want_mtp, (long long)we, (long long)wi);
    free(want), free(rec_e), free(rec_i), free(own_e), free(own_i);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("glm5_mtp");
    TCase *tc = tcase_create("mtp");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_mtp_gradients_with_lm_loss);
    tcase_add_test(tc, test_mtp_gradients_with_caller_mask_and_norm);
    tcase_add_test(tc, test_mtp_gradients_reach_trunk_through_hidden_states);
    tcase_add_test(tc, test_mtp_loss_by_hand);
    tcase_add_test(tc, test_mtp_refusals);
    tcase_add_test(tc, test_mtp_same_under_chunks_recompute_and_headwise);
    tcase_add_test(tc, test_mtp_saves);
    tcase_add_test(tc, test_mtp_own_embedding_and_head);
    tcase_add_test(tc, test_mtp_flops);
    tcase_add_test(tc, test_mtp_routing_replay);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
