/* check_glm5_hf_mpi.c: Hugging Face directories across ranks, under `mpirun -np N check_glm5_hf_mpi TP EP`.
 *
 * Rank 0 saves a tiny GLM-5.2 model (random init, seed 7) from one process, then re-shards that directory into an
 * index and three files: the dense tensors, the experts of the lower half, the experts of the upper half. Every
 * rank then loads it under the TP/EP layout: each local parameter must equal glm5_param_take_shard of the whole
 * tensor, each rank must read exactly its own slices' bytes (replicated tensors included) and open only the files
 * that hold them. The sharded model saves collectively; one process loads that save and gets the original back,
 * byte for byte in the file. A truncated or missing file fails every rank with one sentence naming the file. A
 * bfloat16 fixture with fused 3-D expert keys loads sliced too.
 * Each rank also builds the single-process model from the same seed, so it knows every whole tensor itself. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm_internal.h"
#include "cpu_device.h"
#include "dsa_reference.h"
#include "dsarl/fileutil.h"
#include "dsarl/json.h"
#include "dsarl/safetensors.h"
#include "glm5_ops.h"

static dsarl_comm *comm;
static dsarl_parallel par;
static dsarl_device *dev;
static dsarl_dsa_context *dsa;
static dsarl_error err;
static char tmp[256];
static int32_t tp = 1, ep = 1;
static glm5_config cfg;

#define OK(call) ck_assert_msg((call) == DSARL_OK, "%s: %s", #call, err.message)

// A GLM-5.2 (IndexShare) config whose heads, vocabulary, MLP widths and experts divide by 2 and 4, with %d routed
// experts of width %d: a rank reads under 3/4 of the model only when what its layout splits is most of it, so a
// layout with TP gets 8 narrow experts (the vocabulary and attention/MLP widths dominate) and EP alone gets 32 wide
// ones (as in GLM-5 itself, where the experts are nearly all of the model).
static const char *config_format =
    "{\"architectures\": [\"GlmMoeDsaForCausalLM\"], \"model_type\": \"glm_moe_dsa\", \"vocab_size\": 256,"
    " \"hidden_size\": 32, \"intermediate_size\": 32, \"moe_intermediate_size\": %d, \"n_shared_experts\": 1,"
    " \"n_routed_experts\": %d, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 4, \"num_attention_heads\": 2,"
    " \"num_key_value_heads\": 2, \"q_lora_rank\": 16, \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8,"
    " \"qk_rope_head_dim\": 8, \"qk_head_dim\": 16, \"head_dim\": 8, \"v_head_dim\": 8, \"index_head_dim\": 16,"
    " \"index_n_heads\": 4, \"index_topk\": 4, \"first_k_dense_replace\": 2,"
    " \"mlp_layer_types\": [\"dense\", \"dense\", \"sparse\", \"sparse\"],"
    " \"indexer_types\": [\"full\", \"full\", \"shared\", \"full\"], \"n_group\": 1, \"topk_group\": 1,"
    " \"norm_topk_prob\": true, \"routed_scaling_factor\": 2.5, \"rms_norm_eps\": 1e-05,"
    " \"max_position_embeddings\": 256, \"rope_parameters\": {\"rope_theta\": 10000.0, \"rope_type\": \"default\"},"
    " \"tie_word_embeddings\": false, \"dtype\": \"float32\"}";

static char *in_tmp(const char *name)
{
    char *p = dsarl_path_join(tmp, name);
    ck_assert_ptr_nonnull(p);
    return p;
}

static dsarl_model *single_model(void)
{
    dsarl_model *m = NULL;
    OK(glm5_model_alloc(&cfg, &dsarl_cpu_device_ops, dev, &dsarl_dsa_reference_ops, dsa, NULL, &m, &err));
    OK(glm5_model_init_random(m, 7, 0.02, &err));
    return m;
}

// Builds a model from dir through the plugin's create path: one process (layout NULL) or this run's layout.
static int load_dir(const char *dir, const dsarl_parallel *layout, dsarl_model **out)
{
    dsarl_model_config mc = {.struct_size = sizeof(mc), .model_dir = dir, .device_ops = &dsarl_cpu_device_ops,
                             .device = dev, .dsa_ops = &dsarl_dsa_reference_ops, .dsa = dsa, .parallel = layout};
    *out = NULL;
    return glm5_create_family(GLM5_FAMILY_52, &mc, out, &err);
}

static float *read_param(dsarl_model *m, int64_t i)
{
    float *v = malloc((size_t)m->params[i].numel * sizeof(float));
    ck_assert_ptr_nonnull(v);
    OK(glm5_2_model_ops.read_parameter(m, i, v, NULL, &err));
    return v;
}

// Every local parameter of m equals this rank's shard of the whole tensor of the single-process model ref.
static void expect_shards_of(dsarl_model *m, dsarl_model *ref, const char *what)
{
    ck_assert_int_eq(m->n_params, ref->n_params);
    for (int64_t i = 0; i < m->n_params; i++) {
        const glm5_param *p = &m->params[i];
        ck_assert_str_eq(p->name, ref->params[i].name);
        ck_assert_int_eq(p->full_numel, ref->params[i].numel);
        float *full = read_param(ref, i), *got = read_param(m, i), *want = malloc((size_t)p->numel * sizeof(float));
        glm5_param_take_shard(p, full, want);
        ck_assert_msg(memcmp(got, want, (size_t)p->numel * sizeof(float)) == 0, "%s: rank %d (tp %d, ep %d): %s "
                      "differs from its shard of the whole tensor", what, par.world_rank, par.tp_rank, par.ep_rank,
                      p->name);
        free(full), free(got), free(want);
    }
}

// Rank 0: the single-process save, and its re-sharding into an index + 3 files; then every rank may read them.
static void prepare_dirs(void)
{
    if (par.world_rank == 0) {
        char *single = in_tmp("single"), *index = in_tmp("index");
        dsarl_model *m = single_model();
        OK(glm5_save_hf(m, single, &err));
        glm5_model_free(m);
        OK(dsarl_mkdir_p(index, &err));
        char *from = dsarl_path_join(single, "model.safetensors"), *cfg_from = dsarl_path_join(single, "config.json");
        char *cfg_to = dsarl_path_join(index, "config.json");
        void *text;
        size_t n_text;
        OK(dsarl_read_file(cfg_from, &text, &n_text, &err));
        OK(dsarl_write_file_atomic(cfg_to, text, n_text, &err));
        free(text);
        dsarl_safetensors_file *f = NULL;
        OK(dsarl_safetensors_open(from, &f, &err));
        size_t n = dsarl_safetensors_count(f), k[3] = {0, 0, 0};
        dsarl_safetensors_entry *e[3];
        json_t *map = json_object();
        static const char *names[3] = {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                       "model-00003-of-00003.safetensors"};
        for (int s = 0; s < 3; s++)
            e[s] = calloc(n, sizeof(dsarl_safetensors_entry));
        for (size_t i = 0; i < n; i++) {
            const char *name = dsarl_safetensors_name(f, i);
            int layer, expert, s = 0;
            if (sscanf(name, "model.layers.%d.mlp.experts.%d.", &layer, &expert) == 2)
                s = expert < cfg.n_routed_experts / 2 ? 1 : 2;
            e[s][k[s]].name = name;
            OK(dsarl_safetensors_get(f, name, &e[s][k[s]].tensor, &err));
            k[s]++;
            json_object_set_new(map, name, json_string(names[s]));
        }
        for (int s = 0; s < 3; s++) {
            char *path = dsarl_path_join(index, names[s]);
            OK(dsarl_safetensors_write(path, e[s], k[s], NULL, 0, &err));
            free(path), free(e[s]);
        }
        json_t *root = json_pack("{s:{}, s:o}", "metadata", "weight_map", map);
        char *idx = dsarl_path_join(index, "model.safetensors.index.json");
        OK(dsarl_json_write_file_atomic(idx, root, JSON_INDENT(1), &err));
        json_decref(root);
        dsarl_safetensors_close(f);
        free(idx), free(from), free(cfg_from), free(cfg_to), free(single), free(index);
    }
    OK(dsarl_group_barrier(par.world, &err));
}

START_TEST(test_sharded_load_reads_only_its_slices)
{
    prepare_dirs();
    dsarl_model *ref = single_model(), *m = NULL;
    char *index = in_tmp("index"), *single = in_tmp("single");
    OK(load_dir(index, &par, &m));
    expect_shards_of(m, ref, "index + 3 files");
    // the bytes of this rank's slices exactly (the files are float32), replicated tensors included
    int64_t share = 0, total = 0, expert_bytes = 0;
    for (int64_t i = 0; i < m->n_params; i++) {
        share += m->params[i].numel * 4, total += m->params[i].full_numel * 4;
        if (m->params[i].shard == GLM5_SHARD_EXPERT)
            expert_bytes += m->params[i].full_numel * 4;
    }
    const glm5_hf_read *r = &m->hf_read;
    int64_t stats[5] = {r->data_bytes, r->header_bytes, r->files_opened, share, r->files_listed}, all[5 * 16];
    ck_assert_int_le(par.world_size, 16);
    OK(dsarl_group_all_gather_host(par.world, all, stats, 5, DSARL_DTYPE_I64, &err));
    if (par.world_rank == 0)
        for (int32_t w = 0; w < par.world_size; w++)
            fprintf(stderr, "glm5_hf_mpi tp%d ep%d: rank %d read %lld tensor bytes (its share %lld, %.3f of the "
                    "model's %lld) + %lld header bytes from %lld of %lld files\n", tp, ep, (int)w,
                    (long long)all[5 * w], (long long)all[5 * w + 3], (double)all[5 * w] / (double)total,
                    (long long)total, (long long)all[5 * w + 1], (long long)all[5 * w + 2], (long long)all[5 * w + 4]);
    ck_assert_int_eq(r->data_bytes, share);
    ck_assert_int_lt(r->data_bytes, total);
    ck_assert_msg((double)r->data_bytes < 0.75 * (double)total, "rank %d read %lld of %lld bytes", par.world_rank,
                  (long long)r->data_bytes, (long long)total);
    if (ep > 1) // an EP rank skips the file of the other half's experts and reads only its own experts
        ck_assert_int_le(r->data_bytes, total - expert_bytes / ep * (ep - 1));
    ck_assert_int_eq(r->files_listed, 3);
    ck_assert_int_eq(r->files_opened, ep > 1 ? 2 : 3);
    ck_assert_int_gt(r->header_bytes, 0);
    glm5_model_free(m);
    // a single model.safetensors (one process's save) loads into the layout too
    OK(load_dir(single, &par, &m));
    expect_shards_of(m, ref, "model.safetensors");
    ck_assert_int_eq(m->hf_read.data_bytes, share);
    ck_assert_int_eq(m->hf_read.files_opened, 1);
    glm5_model_free(m);
    glm5_model_free(ref);
    free(index), free(single);
}
END_TEST

// Rank 0 loads dir in one process: every tensor equals the original's.
static void expect_original_in_one_process(const char *dir, const char *what)
{
    if (par.world_rank != 0)
        return;
    dsarl_model *ref = single_model(), *one = NULL;
    OK(load_dir(dir, NULL, &one));
    ck_assert_int_eq(one->n_weights, ref->n_weights);
    for (int64_t i = 0; i < one->n_params; i++) {
        float *a = read_param(one, i), *b = read_param(ref, i);
        ck_assert_msg(memcmp(a, b, (size_t)one->params[i].numel * sizeof(float)) == 0, "%s: %s differs after the "
                      "tp%d/ep%d save", what, one->params[i].name, tp, ep);
        free(a), free(b);
    }
    glm5_model_free(one), glm5_model_free(ref);
}

// The number of entries of dir (every rank sees the same shared directory).
static int entries_in(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "exit $(ls -A '%s' | wc -l)", dir);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

START_TEST(test_sharded_save_loads_in_one_process)
{
    dsarl_model *m = NULL, *back = NULL, *ref = single_model();
    char *index = in_tmp("index"), *saved = in_tmp("saved_sharded");
    OK(load_dir(index, &par, &m));
    OK(glm5_save_hf(m, saved, &err));
    expect_original_in_one_process(saved, "model.safetensors");
    if (par.world_rank == 0) { // the gathered save is the single-process save, byte for byte
        char *x = dsarl_path_join(saved, "model.safetensors"), *y = in_tmp("single/model.safetensors");
        void *dx, *dy;
        size_t nx, ny;
        OK(dsarl_read_file(x, &dx, &nx, &err));
        OK(dsarl_read_file(y, &dy, &ny, &err));
        ck_assert_int_eq(nx, ny);
        ck_assert_msg(memcmp(dx, dy, nx) == 0, "the tp%d/ep%d save differs from the single-process save", tp, ep);
        free(dx), free(dy), free(x), free(y);
    }
    ck_assert_int_eq(entries_in(saved), 2); // model.safetensors + config.json: no temp file left behind
    OK(dsarl_group_barrier(par.world, &err)); // every rank has looked before rank 0 rewrites the directory
    // the same directory saved again as files of at most 64 KiB + an index: the earlier model.safetensors, which
    // would shadow the index, is gone; one process and this layout both load it
    OK(glm5_save_hf_files(m, saved, 64 << 10, &err));
    char *idx = dsarl_path_join(saved, "model.safetensors.index.json"), *one = dsarl_path_join(saved,
                                                                                                "model.safetensors");
    ck_assert(dsarl_path_exists(idx));
    ck_assert(!dsarl_path_exists(one));
    json_t *root = NULL;
    OK(dsarl_json_load_file(idx, &root, &err));
    int64_t files = entries_in(saved) - 2; // minus config.json and the index
    ck_assert_int_ge(files, 3);
    char last[64];
    snprintf(last, sizeof last, "model-%05lld-of-%05lld.safetensors", (long long)files, (long long)files);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(root, "weight_map"), "lm_head.weight")), last);
    json_decref(root);
    expect_original_in_one_process(saved, "index + files");
    OK(load_dir(saved, &par, &back));
    expect_shards_of(back, ref, "the layout's own index + files");
    ck_assert_int_eq(back->hf_read.files_listed, files);
    glm5_model_free(back);
    // and back to one file: the index of the earlier save is removed with it
    OK(glm5_save_hf(m, saved, &err));
    ck_assert(dsarl_path_exists(one));
    ck_assert(!dsarl_path_exists(idx));
    expect_original_in_one_process(saved, "model.safetensors over an index");
    OK(dsarl_group_barrier(par.world, &err));
    glm5_model_free(m), glm5_model_free(ref);
    free(index), free(saved), free(idx), free(one);
}
END_TEST

START_TEST(test_bf16_fused_experts_fixture)
{
    // a transformers-made directory: bfloat16, fused 3-D expert keys (an EP rank takes a block of their expert
    // dimension), grouped routing; each rank's slices equal those of the one-process load of it
    const char *dir = DSARL_SOURCE_DIR "/tests/fixtures/glm5/glm5-groups-bf16";
    dsarl_model *ref = NULL, *m = NULL;
    OK(load_dir(dir, NULL, &ref));
    OK(load_dir(dir, &par, &m));
    expect_shards_of(m, ref, "glm5-groups-bf16");
    int64_t share = 0;
    for (int64_t i = 0; i < m->n_params; i++)
        share += m->params[i].numel * 2;
    ck_assert_int_eq(m->hf_read.data_bytes, share);
    glm5_model_free(m), glm5_model_free(ref);
}
END_TEST

// Every rank fails to load dir with one sentence naming `file`, even a rank that does not need that file.
static void expect_failure_naming(const char *dir, const char *file)
{
    dsarl_model *m = NULL;
    ck_assert_int_ne(load_dir(dir, &par, &m), DSARL_OK);
    ck_assert_ptr_null(m);
    ck_assert_msg(strchr(err.message, '\n') == NULL, "multi-line error: %s", err.message);
    ck_assert_msg(strstr(err.message, file) != NULL, "rank %d: error '%s' should name %s", par.world_rank,
                  err.message, file);
}

START_TEST(test_truncated_or_missing_file_fails_every_rank)
{
    const char *last = "model-00003-of-00003.safetensors";
    if (par.world_rank == 0) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "cp -r '%s/index' '%s/truncated' && cp -r '%s/index' '%s/missing' && "
                 "truncate -s -100 '%s/truncated/%s' && rm '%s/missing/%s'", tmp, tmp, tmp, tmp, tmp, last, tmp,
                 last);
        ck_assert_int_eq(system(cmd), 0);
    }
    OK(dsarl_group_barrier(par.world, &err));
    char *truncated = in_tmp("truncated"), *missing = in_tmp("missing");
    expect_failure_naming(truncated, last);
    ck_assert_ptr_nonnull(strstr(err.message, "truncated"));
    expect_failure_naming(missing, last);
    free(truncated), free(missing);
}
END_TEST

int main(int argc, char **argv)
{
    dsarl_error_clear(&err);
    if (!dsarl_comm_launched()) {
        fprintf(stderr, "check_glm5_hf_mpi runs under mpirun (-np 2 or 4) with arguments TP EP\n");
        return 77;
    }
    if (argc == 3)
        tp = atoi(argv[1]), ep = atoi(argv[2]);
    if (dsarl_comm_init(&comm, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return EXIT_FAILURE;
    }
    dsarl_layout l;
    int rc = dsarl_layout_make(dsarl_comm_world_size(comm), tp, 1, 1, ep, &l, &err);
    l.collective_timeout_s = 60; // a failed assertion on one rank leaves its peers waiting: end the run quickly
    if (rc < 0 || dsarl_comm_build(comm, &l, &par, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return EXIT_FAILURE;
    }
    char config_json[2048];
    bool wide_experts = tp == 1 && ep > 1;
    snprintf(config_json, sizeof config_json, config_format, wide_experts ? 16 : 8, wide_experts ? 32 : 8);
    json_t *cj = json_loads(config_json, 0, NULL);
    dsarl_device_config dc = {.struct_size = sizeof dc, .threads = 1};
    if (!cj || glm5_config_from_json(&cfg, cj, "check_glm5_hf_mpi", &err) < 0 || cpu_create(&dc, &dev, &err) < 0 ||
        dsarl_dsa_reference_ops.create(&dsarl_cpu_device_ops, dev, NULL, &dsa, &err) < 0) {
        fprintf(stderr, "setup: %s\n", err.message);
        return EXIT_FAILURE;
    }
    json_decref(cj);
    // one directory for the run, made by rank 0 and named to the others
    if (par.world_rank == 0) {
        snprintf(tmp, sizeof tmp, "/tmp/check_glm5_hf_mpi.XXXXXX");
        if (!mkdtemp(tmp)) {
            perror("mkdtemp");
            return EXIT_FAILURE;
        }
    }
    if (dsarl_group_broadcast_host(par.world, tmp, sizeof tmp, DSARL_DTYPE_U8, 0, &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return EXIT_FAILURE;
    }
    Suite *s = suite_create("glm5_hf_mpi");
    TCase *tc = tcase_create("checkpoints_across_ranks");
    tcase_add_test(tc, test_sharded_load_reads_only_its_slices);
    tcase_add_test(tc, test_sharded_save_loads_in_one_process);
    tcase_add_test(tc, test_truncated_or_missing_file_fails_every_rank);
    tcase_add_test(tc, test_bf16_fused_experts_fixture);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, par.world_rank == 0 ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    // every rank's verdict decides the exit: one failing rank fails the test
    int32_t any = failed;
    dsarl_group_all_reduce_host(par.world, &any, 1, DSARL_DTYPE_I32, DSARL_REDUCE_MAX, &err);
    if (par.world_rank == 0 && !getenv("KEEP_TMP")) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0)
            fprintf(stderr, "check_glm5_hf_mpi: could not remove %s\n", tmp);
    }
    dsarl_dsa_reference_ops.destroy(dsa);
    cpu_destroy(dev);
    dsarl_comm_finalize(comm);
    return any ? EXIT_FAILURE : EXIT_SUCCESS;
}
