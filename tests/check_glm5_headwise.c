/* check_glm5_headwise.c: the glm_moe_dsa model with its attention in the per-head (non-absorbed) form
 * (policy.megatron_cfg.model_overrides.dsa_attention_form: headwise), on the cpu device and the reference backend.
 *
 * - transformers fixtures (tools/glm5_fixtures.py): logits within max relative error 1e-4 and parameter gradients
 *   within 1e-4 of autograd, as check_glm5_hf holds the absorbed form;
 * - the two forms against each other on a tiny recipe model (a dense layer, MoE layers, a full and a shared indexer
 *   layer, top-k smaller than the sequences): every parameter tensor's gradient, the log-probabilities and the
 *   indexer loss (sparse and dense KL) agree to float32 rounding, also under activation recompute and under dense
 *   attention (where the per-head op gets NULL indices);
 * - central finite differences of the LM loss in the per-head form;
 * - the recipe key: headwise forced end to end (the per-head ops run, with the batch's segments on the host; cached
 *   decode stays absorbed and matches the uncached logits), auto following the backend's preferred_form, and a bad
 *   value or a backend without the per-head ops refused with the key's location. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_device.h"
#include "dsa_reference.h"
#include "dsarl/json.h"
#include "dsarl/npy.h"
#include "glm5_cache.h"
#include "glm5_ops.h"
#include "recipe_internal.h"

#define FIXTURES DSARL_SOURCE_DIR "/tests/fixtures/glm5/"

/* ------------------------------------------------------------------------------------------------------------
 * A reference backend that counts which attention ops run and what batches they see. */

static dsarl_dsa_ops counting_ops;
static int n_headwise_fwd, n_headwise_bwd, n_sparse_fwd, n_preferred;
static int segments_ok;          // every headwise call saw host_cu_seqlens consistent with its key ranges
static int decode_host_cu_null;  // every sparse_mla_forward on a cache batch saw host_cu_seqlens NULL
static dsarl_dsa_form preferred = DSARL_DSA_FORM_ABSORBED;

// The host segments must describe the causal key ranges: query t of segment i sees [cu[i], t + 1).
static int segments_match(const dsarl_dsa_batch *b)
{
    if (!b->host_cu_seqlens || b->n_segments < 1 || b->host_cu_seqlens[0] != 0 ||
        b->host_cu_seqlens[b->n_segments] != b->n_queries || b->n_keys != b->n_queries)
        return 0;
    int32_t *ks = malloc((size_t)b->n_queries * sizeof(int32_t)), *ke = malloc((size_t)b->n_queries * sizeof(int32_t));
    memcpy(ks, b->key_start, (size_t)b->n_queries * sizeof(int32_t)); // cpu device: device memory is host memory
    memcpy(ke, b->key_end, (size_t)b->n_queries * sizeof(int32_t));
    int ok = 1;
    for (int32_t i = 0; i < b->n_segments; i++)
        for (int32_t t = b->host_cu_seqlens[i]; t < b->host_cu_seqlens[i + 1]; t++)
            ok &= ks[t] == b->host_cu_seqlens[i] && ke[t] == t + 1;
    free(ks), free(ke);
    return ok;
}

static dsarl_dsa_form counting_preferred(dsarl_dsa_context *ctx, const dsarl_dsa_batch *b, int32_t topk)
{
    n_preferred++;
    segments_ok &= segments_match(b) && topk > 0;
    return preferred;
}

static int counting_headwise_fwd(dsarl_dsa_context *ctx, const dsarl_dsa_batch *b, const dsarl_dsa_headwise_inputs *in,
                                 const int32_t *indices, int32_t topk, void *out, float *lse, dsarl_error *err)
{
    n_headwise_fwd++;
    segments_ok &= segments_match(b);
    return dsa_reference_headwise_attention_forward(ctx, b, in, indices, topk, out, lse, err);
}

static int counting_headwise_bwd(dsarl_dsa_context *ctx, const dsarl_dsa_batch *b, const dsarl_dsa_headwise_inputs *in,
                                 const int32_t *indices, int32_t topk, const void *out, const float *lse,
                                 const void *dout, void *dq, void *dk, void *dv, dsarl_error *err)
{
    n_headwise_bwd++;
    segments_ok &= segments_match(b);
    return dsa_reference_headwise_attention_backward(ctx, b, in, indices, topk, out, lse, dout, dq, dk, dv, err);
}

static int counting_sparse_fwd(dsarl_dsa_context *ctx, const dsarl_dsa_batch *b, const dsarl_dsa_attention_inputs *in,
                               const int32_t *indices, int32_t topk, void *out, float *lse, dsarl_error *err)
{
    n_sparse_fwd++;
    if (b->n_keys != b->n_queries) // a cache batch (decode): no segments on the host
        decode_host_cu_null &= b->host_cu_seqlens == NULL && b->n_segments == 0;
    return dsa_reference_sparse_mla_forward(ctx, b, in, indices, topk, out, lse, err);
}

static void reset_counts(void)
{
    n_headwise_fwd = n_headwise_bwd = n_sparse_fwd = n_preferred = 0;
    segments_ok = decode_host_cu_null = 1;
}

/* ------------------------------------------------------------------------------------------------------------
 * Fixture. */

static dsarl_device *dev;
static dsarl_dsa_context *dsa;
static dsarl_error err;

static void setup(void)
{
    dsarl_device_config cfg = {.struct_size = sizeof(cfg), .threads = 1};
    ck_assert_int_eq(cpu_create(&cfg, &dev, &err), 0);
    ck_assert_int_eq(dsarl_dsa_reference_ops.create(&dsarl_cpu_device_ops, dev, NULL, &dsa, &err), 0);
    counting_ops = dsarl_dsa_reference_ops;
    counting_ops.preferred_form = counting_preferred;
    counting_ops.headwise_attention_forward = counting_headwise_fwd;
    counting_ops.headwise_attention_backward = counting_headwise_bwd;
    counting_ops.sparse_mla_forward = counting_sparse_fwd;
    preferred = DSARL_DSA_FORM_ABSORBED;
    reset_counts();
}

static void teardown(void)
{
    dsarl_dsa_reference_ops.destroy(dsa);
    cpu_destroy(dev);
}

static int64_t numel_of(const glm5_param *p) { return p->numel; }

/* ------------------------------------------------------------------------------------------------------------
 * transformers fixtures in the per-head form. */

static dsarl_model *load_fixture(const char *name, char *dir, size_t dir_size)
{
    snprintf(dir, dir_size, FIXTURES "%s", name);
    dsarl_model_config mc = {.struct_size = sizeof(mc), .model_dir = dir, .device_ops = &dsarl_cpu_device_ops,
                             .device = dev, .dsa_ops = &counting_ops, .dsa = dsa};
    dsarl_model *m = NULL;
    ck_assert_msg(glm5_create_family(strstr(name, "5.1") ? GLM5_FAMILY_51 : GLM5_FAMILY_52, &mc, &m, &err) == 0,
                  "load %s: %s", dir, err.message);
    ck_assert_int_eq(m->attention_form, GLM5_FORM_AUTO); // no recipe: auto (absorbed with the reference backend)
    m->attention_form = GLM5_FORM_HEADWISE;
    return m;
}

// The fixture's packed batch (rows back to back) and, when g is set, the targets and weights of grads.json.
typedef struct fixture_batch {
    int32_t B, S, T, *tokens, *cu, *targets;
    float *w;
    dsarl_token_batch batch;
} fixture_batch;

static void fixture_batch_load(fixture_batch *fb, const char *dir, const json_t *g)
{
    char path[600];
    snprintf(path, sizeof path, "%s/input_ids.json", dir);
    json_t *ids = NULL;
    ck_assert_int_eq(dsarl_json_load_file(path, &ids, &err), 0);
    fb->B = (int32_t)json_array_size(ids), fb->S = (int32_t)json_array_size(json_array_get(ids, 0));
    fb->T = fb->B * fb->S;
    fb->tokens = malloc((size_t)fb->T * sizeof(int32_t));
    fb->targets = malloc((size_t)fb->T * sizeof(int32_t));
    fb->w = malloc((size_t)fb->T * sizeof(float));
    fb->cu = malloc((size_t)(fb->B + 1) * sizeof(int32_t));
    for (int32_t b = 0; b <= fb->B; b++)
        fb->cu[b] = b * fb->S;
    for (int32_t t = 0; t < fb->T; t++) {
        fb->tokens[t] = (int32_t)json_integer_value(json_array_get(json_array_get(ids, (size_t)(t / fb->S)),
                                                                   (size_t)(t % fb->S)));
        if (g) {
            fb->targets[t] = (int32_t)json_integer_value(json_array_get(json_object_get(g, "targets"), (size_t)t));
            fb->w[t] = (float)json_real_value(json_array_get(json_object_get(g, "weights"), (size_t)t));
        }
    }
    json_decref(ids);
    fb->batch = (dsarl_token_batch){.struct_size = sizeof(dsarl_token_batch), .n_tokens = fb->T,
                                    .n_sequences = fb->B, .tokens = fb->tokens, .cu_seqlens = fb->cu};
}

static void fixture_batch_free(fixture_batch *fb)
{
    free(fb->tokens), free(fb->cu), free(fb->targets), free(fb->w);
}

static void check_fixture_logits(const char *name)
{
    char dir[512], path[600];
    dsarl_model *m = load_fixture(name, dir, sizeof dir);
    fixture_batch fb;
    fixture_batch_load(&fb, dir, NULL);
    int64_t V = m->cfg.vocab_size, n_ref = 0;
    snprintf(path, sizeof path, "%s/logits.npy", dir);
    dsarl_tensor ref_t;
    ck_assert_msg(dsarl_npy_read(path, &ref_t, &err) == 0, "%s", err.message);
    const float *ref = ref_t.data;
    n_ref = dsarl_tensor_numel(&ref_t);
    ck_assert_int_eq(n_ref, (int64_t)fb.T * V);
    float *got = malloc((size_t)n_ref * sizeof(float)), *absorbed = malloc((size_t)n_ref * sizeof(float));
    reset_counts();
    ck_assert_msg(glm5_forward_logits(m, &fb.batch, got, &err) == 0, "%s", err.message);
    ck_assert_int_eq(n_headwise_fwd, m->cfg.num_hidden_layers); // every layer ran the per-head op
    ck_assert_int_eq(n_sparse_fwd, 0);
    ck_assert(segments_ok);
    m->attention_form = GLM5_FORM_ABSORBED;
    ck_assert_msg(glm5_forward_logits(m, &fb.batch, absorbed, &err) == 0, "%s", err.message);
    double maxref = 0, maxerr = 0, maxform = 0;
    for (int64_t i = 0; i < n_ref; i++) {
        maxref = fmax(maxref, fabs(ref[i]));
        maxerr = fmax(maxerr, fabs((double)got[i] - ref[i]));
        maxform = fmax(maxform, fabs((double)got[i] - absorbed[i]));
    }
    fprintf(stderr, "%s headwise: logits max relative error %.3g vs transformers, %.3g vs the absorbed form\n", name,
            maxerr / maxref, maxform / maxref);
    ck_assert_msg(maxref > 0.1, "%s: reference logits are degenerate", name);
    ck_assert_msg(maxerr / maxref < 1e-4, "%s: headwise logits max relative error %.3g", name, maxerr / maxref);
    ck_assert_msg(maxform / maxref < 1e-5, "%s: headwise vs absorbed logits %.3g", name, maxform / maxref);
    free(ref_t.data), free(got), free(absorbed);
    fixture_batch_free(&fb);
    glm5_model_free(m);
}

// Gradients of L = sum_t w_t log p(target_t) in the per-head form against transformers' autograd (grads.json).
static void check_fixture_grads(const char *name)
{
    char dir[512], path[600];
    dsarl_model *m = load_fixture(name, dir, sizeof dir);
    m->indexer_loss_coeff = 0.0f; // LM loss only, as in the reference
    json_t *g = NULL;
    snprintf(path, sizeof path, "%s/grads.json", dir);
    ck_assert_int_eq(dsarl_json_load_file(path, &g, &err), 0);
    fixture_batch fb;
    fixture_batch_load(&fb, dir, g);
    reset_counts();
    ck_assert_int_eq(glm5_zero_grad(m, &err), 0);
    ck_assert_msg(glm5_backward(m, &fb.batch, fb.targets, fb.w, NULL, &err) == 0, "%s", err.message);
    ck_assert_int_eq(n_headwise_bwd, m->cfg.num_hidden_layers);
    json_t *tensors = json_object_get(g, "tensors");
    double worst = 0;
    const char *worst_name = "";
    int n_checked = 0;
    for (int64_t i = 0; i < m->n_params; i++) {
        const glm5_param *p = &m->params[i];
        json_t *ref = json_object_get(tensors, p->name);
        if (!p->trainable)
            continue;
        ck_assert_msg(ref != NULL, "%s: no reference gradient for %s", name, p->name);
        const float *grad = (const float *)m->grads + p->offset;
        double norm = 0, ref_norm = json_real_value(json_object_get(ref, "norm"));
        for (int64_t j = 0; j < numel_of(p); j++)
            norm += (double)grad[j] * grad[j];
        norm = sqrt(norm);
        if (ref_norm == 0.0) {
            ck_assert_msg(norm == 0.0, "%s: %s has gradient norm %g, transformers 0", name, p->name, norm);
            continue;
        }
        double scale = ref_norm / sqrt((double)numel_of(p)), e = fabs(norm - ref_norm) / ref_norm;
        for (int k = 0; k < 8; k++) {
            int64_t j = json_integer_value(json_array_get(json_object_get(ref, "indices"), (size_t)k));
            double want = json_real_value(json_array_get(json_object_get(ref, "values"), (size_t)k));
            e = fmax(e, fabs(grad[j] - want) / scale);
        }
        if (e > worst)
            worst = e, worst_name = p->name;
        n_checked++;
    }
    fprintf(stderr, "%s headwise: gradients of %d tensors vs transformers autograd, worst relative error %.3g (%s)\n",
            name, n_checked, worst, worst_name);
    ck_assert_msg(worst < 1e-4, "%s: headwise gradient of %s differs from transformers (relative %g)", name,
                  worst_name, worst);
    json_decref(g);
    fixture_batch_free(&fb);
    glm5_model_free(m);
}

START_TEST(test_glm51_logits) { check_fixture_logits("glm5.1-tiny"); }
END_TEST
START_TEST(test_glm52_indexshare_logits) { check_fixture_logits("glm5.2-tiny"); }
END_TEST
START_TEST(test_groups_bf16_logits) { check_fixture_logits("glm5-groups-bf16"); }
END_TEST
START_TEST(test_glm51_grads) { check_fixture_grads("glm5.1-tiny"); }
END_TEST
START_TEST(test_glm52_grads) { check_fixture_grads("glm5.2-tiny"); }
END_TEST
START_TEST(test_groups_grads) { check_fixture_grads("glm5-groups-bf16"); }
END_TEST

/* ------------------------------------------------------------------------------------------------------------
 * A tiny recipe model: both forms against each other, finite differences, the recipe key. */

static const char *recipe_head =
    "policy:\n"
    "  model_config:\n"
    "    vocab_size: 48\n    hidden_size: 16\n    intermediate_size: 24\n    moe_intermediate_size: 6\n"
    "    num_hidden_layers: 3\n    num_attention_heads: 2\n    num_key_value_heads: 2\n    q_lora_rank: 12\n"
    "    kv_lora_rank: 8\n    qk_nope_head_dim: 4\n    qk_rope_head_dim: 4\n    v_head_dim: 6\n"
    "    n_routed_experts: 8\n    num_experts_per_tok: 2\n    n_group: 2\n    topk_group: 2\n    index_topk: 3\n"
    "    index_head_dim: 8\n    index_n_heads: 3\n    first_k_dense_replace: 1\n    index_topk_pattern: FSF\n"
    "    n_shared_experts: 1\n    initializer_range: 0.35\n"
    "  megatron_cfg:\n    model_overrides:\n      dsa_indexer_loss_coeff: 0.25\n";

enum { T = 11, VOCAB = 48 };
static int32_t tokens[T] = {5, 17, 3, 40, 22, 9, 31, 2, 47, 11, 26}, cu[3] = {0, 6, 11};
static int32_t targets[T] = {17, 3, 40, 22, 9, -1, 2, 47, 11, 26, 0};
static dsarl_token_batch batch = {.struct_size = sizeof(dsarl_token_batch), .n_tokens = T, .n_sequences = 2,
                                  .tokens = tokens, .cu_seqlens = cu};

// The tiny model with `extra` appended under model_overrides (e.g. "      dsa_attention_form: headwise\n");
// returns the create status (the recipe is freed by the caller through *recipe).
static int create_recipe_model(const char *extra, const dsarl_dsa_ops *ops, dsarl_recipe **recipe, dsarl_model **m)
{
    char text[4096];
    snprintf(text, sizeof text, "%s%s", recipe_head, extra);
    ck_assert_int_eq(dsarl_recipe_load_string(text, "headwise.yaml", recipe, &err), 0);
    ck_assert_int_eq(dsarl_recipe_resolve(*recipe, &err), 0);
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(*recipe),
                             .device_ops = &dsarl_cpu_device_ops, .device = dev, .dsa_ops = ops, .dsa = dsa,
                             .seed = 11};
    *m = NULL;
    return glm5_create_family(GLM5_FAMILY_52, &mc, m, &err);
}

static dsarl_model *recipe_model(const char *extra, dsarl_recipe **recipe)
{
    dsarl_model *m = NULL;
    ck_assert_msg(create_recipe_model(extra, &counting_ops, recipe, &m) == 0, "%s", err.message);
    // non-unit norm weights and non-zero router biases, so their roles are exercised
    for (int64_t i = 0; i < m->n_params; i++) {
        const glm5_param *p = &m->params[i];
        if (p->ndim != 1)
            continue;
        float v[64];
        ck_assert_int_eq(glm5_1_model_ops.read_parameter(m, i, v, NULL, &err), 0);
        for (int64_t j = 0; j < p->shape[0]; j++)
            v[j] += 0.1f * sinf((float)(7 * i + 3 * j));
        ck_assert_int_eq(glm5_1_model_ops.write_parameter(m, i, v, &err), 0);
    }
    return m;
}

static void dlogprobs_fill(float *d)
{
    for (int t = 0; t < T; t++)
        d[t] = 0.5f + 0.4f * cosf((float)(3 * t + 1));
}

// One backward in `form`: returns a copy of every gradient and the indexer loss.
static float *grads_in_form(dsarl_model *m, glm5_attention_form form, float *indexer_loss)
{
    float d[T];
    dlogprobs_fill(d);
    m->attention_form = form;
    ck_assert_int_eq(glm5_zero_grad(m, &err), 0);
    ck_assert_msg(glm5_backward(m, &batch, targets, d, indexer_loss, &err) == 0, "%s", err.message);
    float *copy = malloc((size_t)m->n_weights * sizeof(float));
    memcpy(copy, m->grads, (size_t)m->n_weights * sizeof(float));
    return copy;
}

// Per tensor: max |headwise - absorbed| / max |absorbed| < tol (a zero absorbed gradient must stay exactly zero).
static void compare_forms(const char *what, dsarl_model *m, double tol)
{
    float il_hw = -1, il_abs = -1;
    reset_counts();
    float *hw = grads_in_form(m, GLM5_FORM_HEADWISE, &il_hw);
    ck_assert_msg(n_headwise_fwd >= m->cfg.num_hidden_layers && n_headwise_bwd == m->cfg.num_hidden_layers &&
                  n_sparse_fwd == 0, "%s: the per-head ops did not serve the pass (fwd %d, bwd %d, absorbed %d)", what,
                  n_headwise_fwd, n_headwise_bwd, n_sparse_fwd);
    ck_assert(segments_ok);
    float *ab = grads_in_form(m, GLM5_FORM_ABSORBED, &il_abs);
    double worst = 0;
    const char *worst_name = "";
    for (int64_t i = 0; i < m->n_params; i++) {
        const glm5_param *p = &m->params[i];
        double ref = 0, diff = 0;
        for (int64_t j = 0; j < p->numel; j++) {
            ref = fmax(ref, fabs(ab[p->offset + j]));
            diff = fmax(diff, fabs((double)hw[p->offset + j] - ab[p->offset + j]));
        }
        if (ref == 0.0) {
            ck_assert_msg(diff == 0.0, "%s: %s has no absorbed gradient but a headwise one (%g)", what, p->name, diff);
            continue;
        }
        if (diff / ref > worst)
            worst = diff / ref, worst_name = p->name;
    }
    double il_gap = fabs((double)il_hw - il_abs) / fabs((double)il_abs);
    fprintf(stderr, "%s: headwise vs absorbed gradients, worst tensor %.3g (%s); indexer loss %.7g vs %.7g (%.3g)\n",
            what, worst, worst_name, (double)il_hw, (double)il_abs, il_gap);
    ck_assert_msg(worst < tol, "%s: gradient of %s differs between forms by %.3g (relative)", what, worst_name, worst);
    ck_assert_msg(il_abs > 0.0f && il_gap < tol, "%s: indexer loss %g (headwise) vs %g (absorbed)", what,
                  (double)il_hw, (double)il_abs);
    free(hw), free(ab);
}

START_TEST(test_forms_agree_sparse_indexer_loss)
{
    dsarl_recipe *recipe;
    dsarl_model *m = recipe_model("", &recipe);
    ck_assert(m->indexer_sparse_loss && m->indexer_loss_coeff == 0.25f);
    compare_forms("top-k 3, sparse indexer loss", m, 1e-5);
    // the log-probabilities too
    float lp_hw[T], lp_abs[T];
    m->attention_form = GLM5_FORM_HEADWISE;
    ck_assert_int_eq(glm5_forward_logprobs(m, &batch, targets, lp_hw, &err), 0);
    m->attention_form = GLM5_FORM_ABSORBED;
    ck_assert_int_eq(glm5_forward_logprobs(m, &batch, targets, lp_abs, &err), 0);
    for (int t = 0; t < T; t++)
        ck_assert_msg(fabsf(lp_hw[t] - lp_abs[t]) < 1e-5f, "token %d: log-prob %g (headwise) vs %g", t, lp_hw[t],
                      lp_abs[t]);
    glm5_model_free(m);
    dsarl_recipe_free(recipe);
}
END_TEST

START_TEST(test_forms_agree_dense_indexer_loss_recompute)
{
    dsarl_recipe *recipe;
    dsarl_model *m = recipe_model("      dsa_indexer_use_sparse_loss: false\n", &recipe);
    ck_assert(!m->indexer_sparse_loss);
    compare_forms("top-k 3, dense indexer loss", m, 1e-5);
    m->activation_recompute = true;
    compare_forms("top-k 3, dense indexer loss, activation recompute", m, 1e-5);
    // recompute reruns the same per-head layer: bit-identical to keeping activations
    float il_saved = 0, il_recomputed = 0;
    m->activation_recompute = false;
    float *saved = grads_in_form(m, GLM5_FORM_HEADWISE, &il_saved);
    m->activation_recompute = true;
    float *recomputed = grads_in_form(m, GLM5_FORM_HEADWISE, &il_recomputed);
    ck_assert(il_saved > 0.0f && il_saved == il_recomputed);
    ck_assert_mem_eq(saved, recomputed, (size_t)m->n_weights * sizeof(float));
    free(saved), free(recomputed);
    glm5_model_free(m);
    dsarl_recipe_free(recipe);
}
END_TEST

// Dense warm-up: top-k as wide as the longest sequence, so the per-head op gets NULL indices (every causal key).
static int n_null_indices;
static int null_counting_fwd(dsarl_dsa_context *ctx, const dsarl_dsa_batch *b, const dsarl_dsa_headwise_inputs *in,
                             const int32_t *indices, int32_t topk, void *out, float *lse, dsarl_error *e)
{
    n_null_indices += indices == NULL;
    return counting_headwise_fwd(ctx, b, in, indices, topk, out, lse, e);
}

START_TEST(test_forms_agree_dense_attention)
{
    dsarl_recipe *recipe;
    counting_ops.headwise_attention_forward = null_counting_fwd;
    n_null_indices = 0;
    dsarl_model *m = recipe_model("      dsa_dense_attention: true\n", &recipe);
    ck_assert(m->dense_attention);
    compare_forms("dense attention (NULL indices), sparse indexer loss", m, 1e-5);
    ck_assert_int_gt(n_null_indices, 0);
    ck_assert_int_eq(n_null_indices, n_headwise_fwd);
    glm5_model_free(m);
    dsarl_recipe_free(recipe);
}
END_TEST

// Central differences of L = sum_t dlogprobs[t] logprobs[t] in the per-head form, every trainable tensor.
START_TEST(test_headwise_finite_differences)
{
    dsarl_recipe *recipe;
    dsarl_model *m = recipe_model("      dsa_attention_form: headwise\n", &recipe);
    ck_assert_int_eq(m->attention_form, GLM5_FORM_HEADWISE);
    m->indexer_loss_coeff = 0.0f; // the LM loss alone (the indexer loss has its own checks in check_glm5_grad)
    float d[T];
    dlogprobs_fill(d);
    ck_assert_int_eq(glm5_zero_grad(m, &err), 0);
    ck_assert_int_eq(glm5_backward(m, &batch, targets, d, NULL, &err), 0);
    float *grad = malloc((size_t)m->n_weights * sizeof(float));
    memcpy(grad, m->grads, (size_t)m->n_weights * sizeof(float));
    int checked = 0, skipped = 0, failed = 0;
    double worst = 0;
    char worst_name[160] = "";
    for (int64_t i = 0; i < m->n_params; i++) {
        const glm5_param *p = &m->params[i];
        if (!p->trainable || strstr(p->name, ".indexer.")) // the LM loss never reaches the indexer
            continue;
        float *w = malloc((size_t)p->numel * sizeof(float));
        ck_assert_int_eq(glm5_1_model_ops.read_parameter(m, i, w, NULL, &err), 0);
        double gmax = 1e-3;
        for (int64_t j = 0; j < p->numel; j++)
            gmax = fmax(gmax, fabs(grad[p->offset + j]));
        for (int s = 0; s < 4 && s < p->numel; s++) {
            int64_t j = (int64_t)((uint64_t)(s * 2654435761u + (uint64_t)i * 40503u) % (uint64_t)p->numel);
            float saved = w[j];
            double fd[2];
            for (int k = 0; k < 2; k++) {
                float h = k ? 5e-3f : 1e-2f;
                double l[2];
                for (int sign = 0; sign < 2; sign++) {
                    w[j] = saved + (sign ? -h : h);
                    ck_assert_int_eq(glm5_1_model_ops.write_parameter(m, i, w, &err), 0);
                    float lp[T];
                    ck_assert_int_eq(glm5_forward_logprobs(m, &batch, targets, lp, &err), 0);
                    l[sign] = 0;
                    for (int t = 0; t < T; t++)
                        l[sign] += (double)d[t] * lp[t];
                }
                fd[k] = (l[0] - l[1]) / (2.0 * h);
            }
            w[j] = saved;
            ck_assert_int_eq(glm5_1_model_ops.write_parameter(m, i, w, &err), 0);
            if (fabs(fd[0] - fd[1]) > 0.05 * gmax) { // a top-k or routing choice flipped inside the step
                skipped++;
                continue;
            }
            double e = fabs(fd[1] - grad[p->offset + j]) / gmax;
            checked++;
            if (e > worst) {
                worst = e;
                snprintf(worst_name, sizeof worst_name, "%s[%lld] fd %.5g analytic %.5g", p->name, (long long)j, fd[1],
                         grad[p->offset + j]);
            }
            failed += e > 2e-2;
        }
        free(w);
    }
    fprintf(stderr, "headwise LM loss: %d elements against finite differences, %d skipped at kinks, worst %.3g (%s)\n",
            checked, skipped, worst, worst_name);
    ck_assert_msg(failed == 0, "%d elements disagree; worst %s", failed, worst_name);
    ck_assert_int_gt(checked, 4 * skipped);
    free(grad);
    glm5_model_free(m);
    dsarl_recipe_free(recipe);
}
END_TEST

/* ------------------------------------------------------------------------------------------------------------
 * The recipe key. */

START_TEST(test_recipe_headwise_end_to_end_decode_stays_absorbed)
{
    dsarl_recipe *recipe;
    dsarl_model *m = recipe_model("      dsa_attention_form: headwise\n", &recipe);
    ck_assert_int_eq(m->attention_form, GLM5_FORM_HEADWISE);
    // a training step: forward + backward with the indexer loss, per-head ops only, segments on the host
    reset_counts();
    float d[T], il = 0;
    dlogprobs_fill(d);
    ck_assert_int_eq(glm5_zero_grad(m, &err), 0);
    ck_assert_msg(glm5_backward(m, &batch, targets, d, &il, &err) == 0, "%s", err.message);
    ck_assert_int_eq(n_headwise_fwd, 3);
    ck_assert_int_eq(n_headwise_bwd, 3);
    ck_assert_int_eq(n_sparse_fwd, 0);
    ck_assert_int_eq(n_preferred, 0); // forced: the backend is not asked
    ck_assert(segments_ok && il > 0.0f && isfinite(il));
    // cached prefill of both sequences: the absorbed form over the latent cache, the same last-token logits
    float uncached[T * VOCAB], cached[2 * VOCAB];
    ck_assert_int_eq(glm5_forward_logits(m, &batch, uncached, &err), 0);
    dsarl_model_cache *cache = NULL;
    ck_assert_int_eq(glm5_cache_create(m, 2, 8, &cache, &err), 0);
    int32_t slots[2] = {1, 0};
    reset_counts();
    ck_assert_msg(glm5_forward_cached(m, cache, &batch, slots, cached, &err) == 0, "%s", err.message);
    ck_assert_int_eq(n_headwise_fwd, 0);
    ck_assert_int_eq(n_sparse_fwd, 3);
    ck_assert(decode_host_cu_null);
    double gap = 0;
    for (int v = 0; v < VOCAB; v++) {
        gap = fmax(gap, fabs((double)cached[v] - uncached[5 * VOCAB + v]));
        gap = fmax(gap, fabs((double)cached[VOCAB + v] - uncached[10 * VOCAB + v]));
    }
    // one decode step per sequence
    int32_t next[2] = {7, 30}, cu_next[3] = {0, 1, 2};
    dsarl_token_batch step = {.struct_size = sizeof(step), .n_tokens = 2, .n_sequences = 2, .tokens = next,
                              .cu_seqlens = cu_next};
    ck_assert_int_eq(glm5_forward_cached(m, cache, &step, slots, cached, &err), 0);
    ck_assert(decode_host_cu_null && n_headwise_fwd == 0);
    int32_t longer[T + 2] = {5, 17, 3, 40, 22, 9, 7, 31, 2, 47, 11, 26, 30}, cu_longer[3] = {0, 7, 13};
    dsarl_token_batch both = {.struct_size = sizeof(both), .n_tokens = T + 2, .n_sequences = 2, .tokens = longer,
                              .cu_seqlens = cu_longer};
    float *full = malloc((size_t)(T + 2) * VOCAB * sizeof(float));
    ck_assert_int_eq(glm5_forward_logits(m, &both, full, &err), 0); // headwise, uncached
    for (int v = 0; v < VOCAB; v++) {
        gap = fmax(gap, fabs((double)cached[v] - full[6 * VOCAB + v]));
        gap = fmax(gap, fabs((double)cached[VOCAB + v] - full[12 * VOCAB + v]));
    }
    fprintf(stderr, "cached (absorbed) vs uncached headwise logits: max abs difference %.3g\n", gap);
    ck_assert_msg(gap < 1e-4, "cached absorbed decode differs from uncached headwise logits by %g", gap);
    free(full);
    glm5_cache_free(cache);
    glm5_model_free(m);
    dsarl_recipe_free(recipe);
}
END_TEST

START_TEST(test_recipe_auto_follows_backend)
{
    dsarl_recipe *recipe;
    dsarl_model *m = recipe_model("      dsa_attention_form: auto\n", &recipe);
    ck_assert_int_eq(m->attention_form, GLM5_FORM_AUTO);
    float logits_abs[T * VOCAB], logits_hw[T * VOCAB];
    reset_counts();
    ck_assert_int_eq(glm5_forward_logits(m, &batch, logits_abs, &err), 0); // the reference prefers absorbed
    ck_assert(n_preferred == 1 && n_headwise_fwd == 0 && n_sparse_fwd == 3 && segments_ok);
    preferred = DSARL_DSA_FORM_HEADWISE; // a backend that prefers the per-head form gets it
    reset_counts();
    ck_assert_int_eq(glm5_forward_logits(m, &batch, logits_hw, &err), 0);
    ck_assert(n_preferred == 1 && n_headwise_fwd == 3 && n_sparse_fwd == 0 && segments_ok);
    for (int i = 0; i < T * VOCAB; i++)
        ck_assert_msg(fabsf(logits_hw[i] - logits_abs[i]) < 1e-5f, "logit %d: %g vs %g", i, logits_hw[i],
                      logits_abs[i]);
    // a backend that prefers the per-head form it cannot serve is refused, naming it
    counting_ops.headwise_attention_backward = NULL;
    ck_assert_int_eq(glm5_forward_logits(m, &batch, logits_hw, &err), DSARL_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.message, "reference") && strstr(err.message, "headwise"), "%s", err.message);
    // no preferred_form at all (an ABI 1.0 table): absorbed
    counting_ops.preferred_form = NULL;
    reset_counts();
    ck_assert_int_eq(glm5_forward_logits(m, &batch, logits_hw, &err), 0);
    ck_assert(n_preferred == 0 && n_headwise_fwd == 0 && n_sparse_fwd == 3);
    glm5_model_free(m);
    dsarl_recipe_free(recipe);
}
END_TEST

START_TEST(test_recipe_refuses_bad_form_and_missing_ops)
{
    dsarl_recipe *recipe;
    dsarl_model *m = NULL;
    ck_assert_int_eq(create_recipe_model("      dsa_attention_form: fused\n", &counting_ops, &recipe, &m),
                     DSARL_E_INVALID);
    ck_assert_ptr_null(m);
    fprintf(stderr, "bad value: %s\n", err.message);
    ck_assert_msg(strstr(err.message, "policy.megatron_cfg.model_overrides.dsa_attention_form") &&
                  strstr(err.message, "headwise.yaml") && strstr(err.message, "auto, absorbed or headwise") &&
                  strstr(err.message, "fused"), "%s", err.message);
    dsarl_recipe_free(recipe);
    // a backend without the per-head ops (an absorbed-only table) cannot be forced into them
    dsarl_dsa_ops absorbed_only = dsarl_dsa_reference_ops;
    absorbed_only.common.name = "absorbed-only";
    absorbed_only.headwise_attention_forward = NULL;
    absorbed_only.headwise_attention_backward = NULL;
    ck_assert_int_eq(create_recipe_model("      dsa_attention_form: headwise\n", &absorbed_only, &recipe, &m),
                     DSARL_E_UNSUPPORTED);
    fprintf(stderr, "missing ops: %s\n", err.message);
    ck_assert_msg(strstr(err.message, "dsa_attention_form") && strstr(err.message, "absorbed-only") &&
                  strstr(err.message, "headwise.yaml"), "%s", err.message);
    dsarl_recipe_free(recipe);
    // ... but auto and absorbed work with it
    ck_assert_int_eq(create_recipe_model("      dsa_attention_form: absorbed\n", &absorbed_only, &recipe, &m), 0);
    ck_assert_int_eq(m->attention_form, GLM5_FORM_ABSORBED);
    glm5_model_free(m);
    dsarl_recipe_free(recipe);
    // a wrong type is refused by the recipe lookup, naming the key
    ck_assert_int_ne(create_recipe_model("      dsa_attention_form: [headwise]\n", &counting_ops, &recipe, &m), 0);
    ck_assert_msg(strstr(err.message, "dsa_attention_form"), "%s", err.message);
    dsarl_recipe_free(recipe);
}
END_TEST

START_TEST(test_key_declared)
{
    const dsarl_ops_common *c = &glm5_2_model_ops.common;
    int found = 0;
    for (size_t i = 0; i < c->n_keys; i++)
        if (!strcmp(c->keys[i].path, "policy.megatron_cfg.model_overrides.dsa_attention_form")) {
            found = 1;
            ck_assert_int_eq(c->keys[i].type, DSARL_KEY_STRING);
            ck_assert_str_eq(c->keys[i].default_value, "auto");
        }
    ck_assert(found);
}
END_TEST

static Suite *glm5_headwise_suite(void)
{
    Suite *s = suite_create("glm5_headwise");
    TCase *tc = tcase_create("headwise");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_glm51_logits);
    tcase_add_test(tc, test_glm52_indexshare_logits);
    tcase_add_test(tc, test_groups_bf16_logits);
    tcase_add_test(tc, test_glm51_grads);
    tcase_add_test(tc, test_glm52_grads);
    tcase_add_test(tc, test_groups_grads);
    tcase_add_test(tc, test_forms_agree_sparse_indexer_loss);
    tcase_add_test(tc, test_forms_agree_dense_indexer_loss_recompute);
    tcase_add_test(tc, test_forms_agree_dense_attention);
    tcase_add_test(tc, test_headwise_finite_differences);
    tcase_add_test(tc, test_recipe_headwise_end_to_end_decode_stays_absorbed);
    tcase_add_test(tc, test_recipe_auto_follows_backend);
    tcase_add_test(tc, test_recipe_refuses_bad_form_and_missing_ops);
    tcase_add_test(tc, test_key_declared);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(glm5_headwise_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
