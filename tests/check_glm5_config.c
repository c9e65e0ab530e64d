/* check_glm5_config.c: glm_moe_dsa config parsing against transformers' GlmMoeDsaConfig derivations, exact
 * parameter counts of the released GLM-5.1 and GLM-5.2 configs, YaRN values computed by transformers, sharding
 * records, refusals, and a model defined inline in a recipe (random init, packed batches). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cpu_device.h"
#include "dsa_reference.h"
#include "glm5_ops.h"
#include "recipe_internal.h"

static dsarl_error err;

static int parse(const char *text, glm5_config *cfg)
{
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    ck_assert_msg(root != NULL, "bad test JSON: %s", jerr.text);
    int rc = glm5_config_from_json(cfg, root, "test/config.json", &err);
    json_decref(root);
    return rc;
}

// The architecture keys of zai-org/GLM-5.1 and GLM-5.2 (docs/conventions.md section 3).
#define GLM5_COMMON                                                                                             \
    "\"model_type\": \"glm_moe_dsa\", \"vocab_size\": 154880, \"hidden_size\": 6144, \"intermediate_size\": "  \
    "12288, \"moe_intermediate_size\": 2048, \"num_hidden_layers\": 78, \"num_attention_heads\": 64, "         \
    "\"num_key_value_heads\": 64, \"q_lora_rank\": 2048, \"kv_lora_rank\": 512, \"qk_nope_head_dim\": 192, "   \
    "\"qk_rope_head_dim\": 64, \"v_head_dim\": 256, \"n_routed_experts\": 256, \"n_shared_experts\": 1, "      \
    "\"num_experts_per_tok\": 8, \"first_k_dense_replace\": 3, \"n_group\": 1, \"topk_group\": 1, "           \
    "\"index_n_heads\": 32, \"index_head_dim\": 128, \"index_topk\": 2048, \"num_nextn_predict_layers\": 1, "  \
    "\"tie_word_embeddings\": false, \"rms_norm_eps\": 1e-05"

START_TEST(test_glm51_parameter_count)
{
    glm5_config cfg;
    ck_assert_int_eq(parse("{" GLM5_COMMON ", \"rope_theta\": 1000000}", &cfg), 0);
    ck_assert_int_eq(glm5_config_full_layers(&cfg), 78);
    int64_t trainable = 0, buffers = 0;
    ck_assert_int_eq(glm5_count_parameters(&cfg, &trainable, &buffers, &err), 0);
    ck_assert_int_eq(trainable, 743911199232LL);
    ck_assert_int_eq(buffers, 75 * 256);
    ck_assert_double_eq_tol(cfg.softmax_scale, 1.0 / 16.0, 1e-15);
}
END_TEST

START_TEST(test_glm52_parameter_count_and_indexshare)
{
    glm5_config cfg;
    ck_assert_int_eq(parse("{" GLM5_COMMON ", \"index_topk_freq\": 4, \"index_skip_topk_offset\": 3, "
                           "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 8000000.0}}", &cfg), 0);
    ck_assert_int_eq(glm5_config_full_layers(&cfg), 21);
    // full layers {0, 1, 2, 6, 10, ..., 74}
    for (int i = 0; i < 78; i++)
        ck_assert_int_eq(cfg.indexer_full[i], i < 3 || (i - 2) % 4 == 0);
    int64_t trainable = 0, buffers = 0;
    ck_assert_int_eq(glm5_count_parameters(&cfg, &trainable, &buffers, &err), 0);
    ck_assert_int_eq(trainable, 743377000704LL);
    ck_assert_int_eq(buffers, 19200);
    ck_assert_double_eq(cfg.rope_theta, 8e6);
    // the same through the plugin's planning entry, from a config.json on disk, without allocating 3 TB
    char dir[] = "/tmp/check_glm5_config.XXXXXX", path[64];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{" GLM5_COMMON ", \"index_topk_freq\": 4, \"index_skip_topk_offset\": 3}", f);
    fclose(f);
    dsarl_model_config mc = {.struct_size = sizeof(mc), .model_dir = dir};
    trainable = buffers = 0;
    ck_assert_int_eq(glm5_2_model_ops.parameter_count_config(&mc, &trainable, &buffers, &err), 0);
    ck_assert_int_eq(trainable, 743377000704LL);
    ck_assert_int_eq(buffers, 19200);
    ck_assert_int_eq(glm5_1_model_ops.parameter_count_config(&mc, &trainable, &buffers, &err), DSARL_E_UNSUPPORTED);
    remove(path);
    rmdir(dir);
}
END_TEST

START_TEST(test_indexer_types_derivations)
{
    glm5_config cfg;
    // transformers test_indexer_types_respect_skip_topk_offset: 8 layers -> F F F S S S F S
    ck_assert_int_eq(parse("{\"num_hidden_layers\": 8, \"index_topk_freq\": 4, \"index_skip_topk_offset\": 3}", &cfg),
                     0);
    const unsigned char want[8] = {1, 1, 1, 0, 0, 0, 1, 0};
    ck_assert_mem_eq(cfg.indexer_full, want, 8);
    // default offset 2 with freq 2: max(i-1,0) % 2 == 0 -> F F S F S F
    ck_assert_int_eq(parse("{\"num_hidden_layers\": 6, \"index_topk_freq\": 2}", &cfg), 0);
    const unsigned char want2[6] = {1, 1, 0, 1, 0, 1};
    ck_assert_mem_eq(cfg.indexer_full, want2, 6);
    // a pattern string, then an explicit list that takes precedence over it
    ck_assert_int_eq(parse("{\"num_hidden_layers\": 4, \"index_topk_pattern\": \"FSSF\"}", &cfg), 0);
    ck_assert(cfg.indexer_full[0] && !cfg.indexer_full[1] && !cfg.indexer_full[2] && cfg.indexer_full[3]);
    ck_assert_int_eq(parse("{\"num_hidden_layers\": 3, \"index_topk_pattern\": \"FSS\", \"indexer_types\": "
                           "[\"full\", \"full\", \"shared\"]}", &cfg), 0);
    ck_assert(cfg.indexer_full[1] && !cfg.indexer_full[2]);
    // mlp_layer_types default from first_k_dense_replace, explicit list wins
    ck_assert_int_eq(parse("{\"num_hidden_layers\": 5, \"first_k_dense_replace\": 2}", &cfg), 0);
    ck_assert(!cfg.mlp_sparse[0] && !cfg.mlp_sparse[1] && cfg.mlp_sparse[2] && cfg.mlp_sparse[4]);
    ck_assert_int_eq(parse("{\"num_hidden_layers\": 3, \"mlp_layer_types\": [\"sparse\", \"dense\", \"sparse\"]}",
                           &cfg), 0);
    ck_assert(cfg.mlp_sparse[0] && !cfg.mlp_sparse[1] && cfg.mlp_sparse[2]);
}
END_TEST

START_TEST(test_refusals)
{
    glm5_config cfg;
    ck_assert_int_eq(parse("{\"num_hidden_layers\": 3, \"index_topk_pattern\": \"SFF\"}", &cfg), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "test/config.json") && strstr(err.message, "layer 0"), "%s", err.message);
    ck_assert_int_eq(parse("{\"num_hidden_layers\": 2, \"indexer_types\": [\"full\", \"sparse\"]}", &cfg),
                     DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "indexer_types[1]") && strstr(err.message, "sparse"), "%s", err.message);
    ck_assert_int_eq(parse("{\"num_hidden_layers\": 2, \"index_topk_pattern\": \"FX\"}", &cfg), DSARL_E_INVALID);
    ck_assert_int_eq(parse("{\"model_type\": \"llama\"}", &cfg), DSARL_E_INVALID);
    ck_assert_int_eq(parse("{\"hidden_size\": \"big\"}", &cfg), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "hidden_size"), "%s", err.message);
    ck_assert_int_eq(parse("{\"n_routed_experts\": 10, \"n_group\": 4}", &cfg), DSARL_E_INVALID);
    ck_assert_int_eq(parse("{\"num_key_value_heads\": 8}", &cfg), DSARL_E_INVALID);
    ck_assert_int_eq(parse("{\"rope_parameters\": {\"rope_type\": \"dynamic\", \"rope_theta\": 1.0}}", &cfg),
                     DSARL_E_UNSUPPORTED);
    ck_assert_msg(strstr(err.message, "dynamic"), "%s", err.message);
    // sizes that would wrap int64 products (the 37-byte v_head_dim config, a 2^62 vocabulary) are refused by name
    ck_assert_int_eq(parse("{ \"v_head_dim\": 9223372036854775807 }", &cfg), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "'v_head_dim'") && strstr(err.message, "more than the 4096"), "%s", err.message);
    ck_assert_int_eq(parse("{\"vocab_size\": 4611686018427387904}", &cfg), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "'vocab_size'"), "%s", err.message);
    ck_assert_int_eq(parse("{\"n_shared_experts\": -3}", &cfg), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "n_shared_experts"), "%s", err.message);
    // each within its bound, but 1024 layers of 2^16 experts x 2^21 x 2^16: the parameter total is refused, not wrapped
    ck_assert_int_eq(parse("{\"num_hidden_layers\": 1024, \"first_k_dense_replace\": 0, \"n_routed_experts\": "
                           "65536, \"moe_intermediate_size\": 1048576, \"hidden_size\": 65536}", &cfg), 0);
    glm5_param *specs = NULL;
    int64_t n_specs = 0, n_elems = 0;
    ck_assert_int_eq(glm5_param_specs(&cfg, NULL, &specs, &n_specs, &n_elems, &err), DSARL_E_INVALID);
    ck_assert_msg(strstr(err.message, "exceed"), "%s", err.message);
    ck_assert_ptr_null(specs);
    // glm5.1 takes only all-full configs and names glm5.2
    ck_assert_int_eq(parse("{\"num_hidden_layers\": 4, \"index_topk_freq\": 2}", &cfg), 0);
    ck_assert_int_eq(glm5_check_family(GLM5_FAMILY_51, &cfg, "x", &err), DSARL_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.message, "glm5.2"));
    ck_assert_int_eq(glm5_check_family(GLM5_FAMILY_52, &cfg, "x", &err), 0);
}
END_TEST

START_TEST(test_yarn_matches_transformers)
{
    glm5_config cfg;
    // DeepSeek-V3.2 rope: values printed by transformers 5.24 GlmMoeDsaRotaryEmbedding / GlmMoeDsaAttention
    ck_assert_int_eq(parse("{\"num_hidden_layers\": 2, \"qk_rope_head_dim\": 64, \"qk_nope_head_dim\": 128, "
                           "\"max_position_embeddings\": 163840, \"rope_parameters\": {\"rope_type\": \"yarn\", "
                           "\"rope_theta\": 10000.0, \"factor\": 40.0, \"original_max_position_embeddings\": 4096, "
                           "\"beta_fast\": 32, \"beta_slow\": 1, \"mscale\": 1.0, \"mscale_all_dim\": 1.0}}", &cfg),
                     0);
    ck_assert_double_eq_tol(cfg.softmax_scale, 0.1352337788608801, 1e-12);
    ck_assert_double_eq_tol(cfg.attention_scaling, 1.0, 1e-12);
    float f[32];
    glm5_rope_inv_freq(&cfg, f);
    const int at[7] = {0, 5, 10, 15, 20, 25, 31};
    const double want[7] = {1.0, 0.23713736236095428, 0.05623412877321243, 0.0083345090970397, 0.0007905694073997438,
                            1.8747354260995053e-05, 3.3338035336782923e-06};
    for (int i = 0; i < 7; i++)
        ck_assert_msg(fabs(f[at[i]] - want[i]) <= 2e-7 * want[i], "inv_freq[%d] %.9g vs %.9g", at[i], f[at[i]],
                      want[i]);
    ck_assert_int_eq(parse("{\"num_hidden_layers\": 2, \"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": "
                           "10000.0, \"factor\": 40.0, \"original_max_position_embeddings\": 4096, \"mscale\": 0.707, "
                           "\"mscale_all_dim\": 1.0}}", &cfg), 0);
    ck_assert_double_eq_tol(cfg.attention_scaling, 0.9210423553163399, 1e-12);
}
END_TEST

START_TEST(test_param_specs_sharding)
{
    glm5_config cfg;
    ck_assert_int_eq(parse("{\"num_hidden_layers\": 3, \"index_topk_pattern\": \"FSF\", \"first_k_dense_replace\": "
                           "1}", &cfg), 0);
    glm5_param *p = NULL;
    int64_t n = 0, total = 0;
    ck_assert_int_eq(glm5_param_specs(&cfg, NULL, &p, &n, &total, &err), 0);
    int found = 0;
    for (int64_t i = 0; i < n; i++) {
        ck_assert_msg(strstr(p[i].name, "layers.1.self_attn.indexer") == NULL, "shared layer has %s", p[i].name);
        ck_assert_int_le(p[i].offset + p[i].numel, total);
        if (!strcmp(p[i].name, "model.layers.0.self_attn.q_b_proj.weight")) {
            found++;
            ck_assert_int_eq(p[i].shard, GLM5_SHARD_COLUMN);
        }
        if (!strcmp(p[i].name, "model.layers.0.self_attn.o_proj.weight")) {
            found++;
            ck_assert_int_eq(p[i].shard, GLM5_SHARD_ROW);
        }
        if (!strcmp(p[i].name, "model.layers.2.mlp.experts.gate_up_proj")) {
            found++;
            ck_assert_int_eq(p[i].shard, GLM5_SHARD_EXPERT);
            ck_assert_int_eq(p[i].shape[1], 2 * 2048);
        }
        if (!strcmp(p[i].name, "model.embed_tokens.weight")) {
            found++;
            ck_assert_int_eq(p[i].shard, GLM5_SHARD_VOCAB);
        }
        if (!strcmp(p[i].name, "model.layers.2.mlp.gate.e_score_correction_bias")) {
            found++;
            ck_assert(!p[i].trainable);
        }
        if (!strcmp(p[i].name, "model.layers.2.self_attn.indexer.k_norm.bias")) {
            found++;
            ck_assert(p[i].trainable);
        }
    }
    ck_assert_int_eq(found, 6);
    // every pair of specs is disjoint in the buffer; gate and up of one MLP are adjacent
    for (int64_t i = 0; i + 1 < n; i++) {
        ck_assert_int_le(p[i].offset + p[i].numel, p[i + 1].offset);
        if (strstr(p[i].name, "gate_proj"))
            ck_assert_int_eq(p[i].offset + p[i].numel, p[i + 1].offset);
    }
    free(p);
}
END_TEST

static const char *tiny_recipe =
    "policy:\n"
    "  model_config:\n"
    "    vocab_size: 64\n    hidden_size: 32\n    intermediate_size: 40\n    moe_intermediate_size: 8\n"
    "    num_hidden_layers: 3\n    num_attention_heads: 2\n    num_key_value_heads: 2\n    q_lora_rank: 16\n"
    "    kv_lora_rank: 16\n    qk_nope_head_dim: 8\n    qk_rope_head_dim: 8\n    v_head_dim: 8\n"
    "    n_routed_experts: 8\n    num_experts_per_tok: 2\n    index_topk: 3\n    index_head_dim: 16\n"
    "    index_n_heads: 2\n    first_k_dense_replace: 1\n    index_topk_pattern: FSF\n    initializer_range: 0.2\n"
    "  hf_config_overrides:\n    n_group: 2\n    topk_group: 1\n";

START_TEST(test_recipe_inline_model_and_packing)
{
    dsarl_recipe *r = NULL;
    ck_assert_msg(dsarl_recipe_load_string(tiny_recipe, "tiny.yaml", &r, &err) == 0, "%s", err.message);
    ck_assert_msg(dsarl_recipe_resolve(r, &err) == 0, "%s", err.message);
    dsarl_device *dev;
    dsarl_dsa_context *dsa;
    dsarl_device_config dc = {.struct_size = sizeof(dc), .threads = 1};
    ck_assert_int_eq(cpu_create(&dc, &dev, &err), 0);
    ck_assert_int_eq(dsarl_dsa_reference_ops.create(&dsarl_cpu_device_ops, dev, NULL, &dsa, &err), 0);
    dsarl_model_config mc = {.struct_size = sizeof(mc), .recipe = dsarl_recipe_root(r),
                             .device_ops = &dsarl_cpu_device_ops, .device = dev, .dsa_ops = &dsarl_dsa_reference_ops,
                             .dsa = dsa, .seed = 7};
    dsarl_model *m = NULL, *m2 = NULL;
    ck_assert_msg(glm5_create_family(GLM5_FAMILY_52, &mc, &m, &err) == 0, "%s", err.message);
    ck_assert_int_eq(m->cfg.n_group, 2); // the override applied on top of model_config
    ck_assert_int_eq(glm5_config_full_layers(&m->cfg), 2);
    ck_assert_int_eq(glm5_create_family(GLM5_FAMILY_51, &mc, &m2, &err), DSARL_E_UNSUPPORTED);
    // two sequences packed (5 + 7 tokens) give the same logits as each alone: no attention across sequences
    int32_t tokens[12] = {3, 9, 60, 1, 22, 5, 41, 7, 7, 30, 12, 63}, cu[3] = {0, 5, 12}, cu1[2] = {0, 5},
            cu2[2] = {0, 7};
    float packed[12 * 64], alone[7 * 64];
    dsarl_token_batch b = {.struct_size = sizeof(b), .n_tokens = 12, .n_sequences = 2, .tokens = tokens,
                           .cu_seqlens = cu};
    ck_assert_msg(glm5_forward_logits(m, &b, packed, &err) == 0, "%s", err.message);
    dsarl_token_batch b1 = {.struct_size = sizeof(b1), .n_tokens = 5, .n_sequences = 1, .tokens = tokens,
                            .cu_seqlens = cu1};
    ck_assert_int_eq(glm5_forward_logits(m, &b1, alone, &err), 0);
    double maxref = 0, maxerr = 0;
    for (int i = 0; i < 5 * 64; i++)
        maxref = fmax(maxref, fabs(alone[i])), maxerr = fmax(maxerr, fabs(alone[i] - packed[i]));
    dsarl_token_batch b2 = {.struct_size = sizeof(b2), .n_tokens = 7, .n_sequences = 1, .tokens = tokens + 5,
                            .cu_seqlens = cu2};
    ck_assert_int_eq(glm5_forward_logits(m, &b2, alone, &err), 0);
    for (int i = 0; i < 7 * 64; i++)
        maxref = fmax(maxref, fabs(alone[i])), maxerr = fmax(maxerr, fabs(alone[i] - packed[5 * 64 + i]));
    ck_assert_msg(maxref > 0.01 && maxerr <= 1e-5 * maxref, "packed vs alone: %.3g of %.3g", maxerr, maxref);
    // same seed, same weights; another seed, other weights
    ck_assert_int_eq(glm5_create_family(GLM5_FAMILY_52, &mc, &m2, &err), 0);
    ck_assert_mem_eq(m->weights, m2->weights, (size_t)m->n_weights * sizeof(float));
    glm5_model_free(m2);
    mc.seed = 8;
    ck_assert_int_eq(glm5_create_family(GLM5_FAMILY_52, &mc, &m2, &err), 0);
    ck_assert(memcmp(m->weights, m2->weights, (size_t)m->n_weights * sizeof(float)) != 0);
    // dense attention (warm-up) = the same weights with a top-k wider than every sequence
    glm5_model_free(m2);
    mc.seed = 7;
    ck_assert_int_eq(glm5_create_family(GLM5_FAMILY_52, &mc, &m2, &err), 0);
    m2->cfg.index_topk = 64;
    float wide[12 * 64];
    ck_assert_int_eq(glm5_forward_logits(m2, &b, wide, &err), 0);
    m->dense_attention = true;
    float dense[12 * 64];
    ck_assert_int_eq(glm5_forward_logits(m, &b, dense, &err), 0);
    m->dense_attention = false;
    double dmax = 0, ddiff = 0, sdiff = 0;
    for (int i = 0; i < 12 * 64; i++) {
        dmax = fmax(dmax, fabs(wide[i]));
        ddiff = fmax(ddiff, fabs(wide[i] - dense[i]));
        sdiff = fmax(sdiff, fabs(wide[i] - packed[i]));
    }
    ck_assert_msg(ddiff <= 1e-6 * dmax, "dense attention vs wide top-k: %g of %g", ddiff, dmax);
    ck_assert_msg(sdiff > 1e-3 * dmax, "top-k 3 should differ from dense attention on 7-token rows");
    // a token outside the vocabulary is refused with its position
    tokens[3] = 64;
    ck_assert_int_eq(glm5_forward_logits(m, &b, packed, &err), DSARL_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.message, "position 3"));
    glm5_model_free(m2);
    glm5_model_free(m);
    dsarl_dsa_reference_ops.destroy(dsa);
    cpu_destroy(dev);
    dsarl_recipe_free(r);
}
END_TEST

static Suite *glm5_config_suite(void)
{
    Suite *s = suite_create("glm5_config");
    TCase *tc = tcase_create("config");
    tcase_add_test(tc, test_glm51_parameter_count);
    tcase_add_test(tc, test_glm52_parameter_count_and_indexshare);
    tcase_add_test(tc, test_indexer_types_derivations);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_yarn_matches_transformers);
    tcase_add_test(tc, test_param_specs_sharding);
    tcase_add_test(tc, test_recipe_inline_model_and_packing);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(glm5_config_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
