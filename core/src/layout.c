/* layout.c: Megatron's parallel layout from recipe keys.
 *
 * Two rank grids share the world (Megatron's RankGenerator with order tp-cp-ep-dp-pp, the leftmost axis fastest):
 *   dense (attention, dense MLP, embedding): rank = tp + TP*(cp + CP*(dp + DP*pp)), DP = W / (TP*PP*CP);
 *   expert (routed experts, expert TP 1):    rank = ep + EP*(edp + EDP*pp),        EDP = W / (EP*PP).
 * Both grids put pp slowest, so a pipeline stage is the same set of ranks in both. EP need not divide DP: it folds
 * over TP, CP and DP (MoE parallel folding); it only has to divide TP*CP*DP. */
#include "layout.h"

#include <stdio.h>
#include <string.h>

#include "dsarl/pipeline.h"

#define MCFG "policy.megatron_cfg."

const dsarl_key_spec dsarl_layout_keys[] = {
    {MCFG "tensor_model_parallel_size", DSARL_KEY_INT, "1", "tensor-parallel ranks (attention heads, MLP, vocab)", 0},
    {MCFG "pipeline_model_parallel_size", DSARL_KEY_INT, "1", "pipeline stages (layers split across ranks)", 0},
    {MCFG "context_parallel_size", DSARL_KEY_INT, "1", "context-parallel ranks (each sequence split)", 0},
    {MCFG "expert_model_parallel_size", DSARL_KEY_INT, "1", "expert-parallel ranks (routed experts split)", 0},
    {MCFG "expert_tensor_parallel_size", DSARL_KEY_INT, "1", "tensor parallelism inside an expert (1 only)",
     DSARL_KEY_NULLABLE},
    {MCFG "sequence_parallel", DSARL_KEY_BOOL, "false",
     "split the sequence over TP in norms and residuals (required when TP > 1, as Megatron's MLA)", 0},
    {MCFG "distributed_data_parallel_config.use_distributed_optimizer", DSARL_KEY_BOOL, "true",
     "shard fp32 master weights and AdamW moments over data-parallel ranks", 0},
    {MCFG "distributed_data_parallel_config.overlap_grad_reduce", DSARL_KEY_BOOL, "false",
     "reduce gradient buckets as the backward produces them", 0},
    {MCFG "distributed_data_parallel_config.bucket_size", DSARL_KEY_INT, NULL,
     "gradient bucket size in parameters (null: max(4e7, 1e6 x data-parallel size))", DSARL_KEY_NULLABLE},
    {"cluster.num_nodes", DSARL_KEY_INT, "1", "nodes (hosts); num_nodes x gpus_per_node = processes", 0},
    {"cluster.gpus_per_node", DSARL_KEY_INT, "1", "processes per node (one per GPU, or per CPU slot)", 0},
    {"runtime.log_all_ranks", DSARL_KEY_BOOL, "false",
     "every rank logs at the chosen level (by default ranks other than 0 log warnings and errors only)", 0},
    {"runtime.collective_timeout_s", DSARL_KEY_FLOAT, "600",
     "a collective that has not completed after this many seconds ends the job, naming the rank", 0},
};
const size_t dsarl_layout_n_keys = sizeof dsarl_layout_keys / sizeof dsarl_layout_keys[0];

static int positive(const dsarl_node *root, const char *key, int64_t v, int32_t *out, dsarl_error *err)
{
    if (v < 1 || v > 1 << 20) {
        if (root)
            return dsarl_recipe_fail(root, key, err, DSARL_E_INVALID, "must be an integer in [1, 1048576], got %lld",
                                     (long long)v);
        return DSARL_FAIL(err, DSARL_E_INVALID, "%s must be in [1, 1048576], got %lld", key, (long long)v);
    }
    *out = (int32_t)v;
    return DSARL_OK;
}

// The divisibility rules shared by recipe and programmatic layouts; sizes already positive.
static int check(const dsarl_node *root, dsarl_layout *l, dsarl_error *err)
{
    int64_t model = (int64_t)l->tp * l->pp * l->cp;
    if (l->world % model != 0)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "%stensor (%d) x pipeline (%d) x context (%d) parallel sizes = %lld ranks per model replica, "
                          "which does not divide the %d processes of this run; launch a multiple of %lld processes "
                          "(mpirun -np N) or lower " MCFG "tensor_model_parallel_size / pipeline_ / context_",
                          root ? "" : "layout: ", l->tp, l->pp, l->cp, (long long)model, l->world, (long long)model);
    l->dp = (int32_t)(l->world / model);
    int64_t span = (int64_t)l->tp * l->cp * l->dp; // ranks of one pipeline stage
    if (span % l->ep != 0)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          MCFG "expert_model_parallel_size %d does not divide the %lld ranks of one pipeline stage "
                          "(tensor %d x context %d x data %d); use a divisor of %lld",
                          l->ep, (long long)span, l->tp, l->cp, l->dp, (long long)span);
    l->edp = (int32_t)(span / l->ep);
    if (l->tp > 1 && !l->sequence_parallel)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          MCFG "sequence_parallel is false with tensor_model_parallel_size %d: MLA under tensor "
                          "parallelism runs its norms and residuals sequence-parallel (as Megatron requires); set "
                          MCFG "sequence_parallel=true", l->tp);
    return DSARL_OK;
}

int dsarl_layout_make(int32_t world, int32_t tp, int32_t pp, int32_t cp, int32_t ep, dsarl_layout *out,
                      dsarl_error *err)
{
    memset(out, 0, sizeof *out);
    DSARL_TRY(positive(NULL, "world size", world, &out->world, err));
    DSARL_TRY(positive(NULL, "tensor_model_parallel_size", tp, &out->tp, err));
    DSARL_TRY(positive(NULL, "pipeline_model_parallel_size", pp, &out->pp, err));
    DSARL_TRY(positive(NULL, "context_parallel_size", cp, &out->cp, err));
    DSARL_TRY(positive(NULL, "expert_model_parallel_size", ep, &out->ep, err));
    out->vpp = 1;
    out->sequence_parallel = tp > 1;
    out->distributed_optimizer = true;
    out->num_nodes = 1, out->gpus_per_node = world;
    out->collective_timeout_s = 600;
    return check(NULL, out, err);
}

#define GEN "policy.generation."

/* Non-colocated generation in a job of several processes: the last resources.num_nodes x resources.gpus_per_node
 * processes generate, the others train. One process keeps its generation copy inside (no split). The generation
 * side is one rank without model parallelism, and the refit sends whole tensors from training rank 0, which holds
 * them only when the training side has no model parallelism either: the other layouts are refused here. */
static int generation_split(const dsarl_node *root, dsarl_layout *l, dsarl_error *err)
{
    bool colocated;
    DSARL_TRY(dsarl_recipe_bool_or(root, GEN "colocated.enabled", true, &colocated, err));
    l->generation = 0;
    if (colocated || l->world == 1)
        return DSARL_OK;
    int64_t nodes, per_node, gen_tp, gen_pp;
    DSARL_TRY(dsarl_recipe_int_or(root, GEN "colocated.resources.num_nodes", 1, &nodes, err));
    DSARL_TRY(dsarl_recipe_int_or(root, GEN "colocated.resources.gpus_per_node", l->gpus_per_node, &per_node, err));
    DSARL_TRY(dsarl_recipe_int_or(root, GEN "tensor_parallel_size", 1, &gen_tp, err));
    DSARL_TRY(dsarl_recipe_int_or(root, GEN "pipeline_parallel_size", 1, &gen_pp, err));
    if (nodes < 1 || per_node < 1 || nodes * per_node != 1)
        return dsarl_recipe_fail(root, GEN "colocated.resources.gpus_per_node", err, DSARL_E_UNSUPPORTED,
                                 "asks for %lld x %lld generation processes in a job of %d, but a non-colocated job of "
                                 "several processes supports exactly one dedicated generation rank (its last "
                                 "process); set resources.num_nodes: 1 and resources.gpus_per_node: 1",
                                 (long long)nodes, (long long)per_node, l->world);
    if (gen_tp != 1 || gen_pp != 1)
        return dsarl_recipe_fail(root, GEN "tensor_parallel_size", err, DSARL_E_UNSUPPORTED,
                                 "is %lld (pipeline_parallel_size %lld) with a dedicated generation rank, which "
                                 "generates alone on its one process; use 1 and 1", (long long)gen_tp,
                                 (long long)gen_pp);
    if (l->tp * l->pp * l->cp * l->ep != 1)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED,
                          GEN "colocated.enabled is false with tensor %d x pipeline %d x context %d x expert %d "
                          "parallel training, but the refit to the dedicated generation rank sends whole tensors "
                          "from training rank 0, which holds them only under data parallelism alone; set "
                          MCFG "*_parallel_size to 1 or generate colocated", l->tp, l->pp, l->cp, l->ep);
    l->generation = 1;
    l->world -= 1;
    return DSARL_OK;
}

static int layout_from_recipe(const dsarl_node *root, int32_t world, bool split_generation, dsarl_layout *out,
                              dsarl_error *err)
{
    memset(out, 0, sizeof *out);
    out->world = world;
    struct { const char *key; int32_t *dst; } sizes[] = {
        {MCFG "tensor_model_parallel_size", &out->tp}, {MCFG "pipeline_model_parallel_size", &out->pp},
        {MCFG "context_parallel_size", &out->cp}, {MCFG "expert_model_parallel_size", &out->ep},
        {"cluster.num_nodes", &out->num_nodes}, {"cluster.gpus_per_node", &out->gpus_per_node},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int64_t v;
        DSARL_TRY(dsarl_recipe_int_or(root, sizes[i].key, 1, &v, err));
        DSARL_TRY(positive(root, sizes[i].key, v, sizes[i].dst, err));
    }
    DSARL_TRY(dsarl_pipeline_virtual_stages(root, out->pp, &out->vpp, err));
    int64_t etp;
    DSARL_TRY(dsarl_recipe_int_or(root, MCFG "expert_tensor_parallel_size", 1, &etp, err));
    if (etp != 1)
        return dsarl_recipe_fail(root, MCFG "expert_tensor_parallel_size", err, DSARL_E_UNSUPPORTED,
                                 "is %lld; experts are split whole across expert-parallel ranks (1 is the only value, "
                                 "NeMo RL's default)", (long long)etp);
    DSARL_TRY(dsarl_recipe_bool_or(root, MCFG "sequence_parallel", false, &out->sequence_parallel, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, MCFG "distributed_data_parallel_config.use_distributed_optimizer", true,
                                   &out->distributed_optimizer, err));
    DSARL_TRY(dsarl_recipe_bool_or(root, MCFG "distributed_data_parallel_config.overlap_grad_reduce", false,
                                   &out->overlap_grad_reduce, err));
    DSARL_TRY(dsarl_recipe_int_or(root, MCFG "distributed_data_parallel_config.bucket_size", 0, &out->bucket_elements,
                                  err));
    if (out->bucket_elements < 0)
        return dsarl_recipe_fail(root, MCFG "distributed_data_parallel_config.bucket_size", err, DSARL_E_INVALID,
                                 "must be >= 0 (0 or null: the default), got %lld", (long long)out->bucket_elements);
    DSARL_TRY(dsarl_recipe_double_or(root, "runtime.collective_timeout_s", 600, &out->collective_timeout_s, err));
    if (!(out->collective_timeout_s > 0))
        return dsarl_recipe_fail(root, "runtime.collective_timeout_s", err, DSARL_E_INVALID, "must be > 0, got %g",
                                 out->collective_timeout_s);
    int64_t cluster = (int64_t)out->num_nodes * out->gpus_per_node;
    if (cluster != world)
        return DSARL_FAIL(err, DSARL_E_INVALID,
                          "cluster.num_nodes (%d) x cluster.gpus_per_node (%d) = %lld processes, but this run has %d "
                          "(%s); set cluster.* to the processes launched, or launch %lld (mpirun -np %lld / srun -n "
                          "%lld)", out->num_nodes, out->gpus_per_node, (long long)cluster, world,
                          world == 1 ? "a plain `dsarl run` is one process" : "mpirun -np / srun -n", (long long)cluster,
                          (long long)cluster, (long long)cluster);
    if (split_generation)
        DSARL_TRY(generation_split(root, out, err));
    DSARL_TRY(check(root, out, err));
    if (out->bucket_elements == 0) // Megatron's default: max(4e7, 1e6 x the data-parallel (with context) size)
        out->bucket_elements = out->overlap_grad_reduce
                                   ? (int64_t)(4e7 > 1e6 * out->dp * out->cp ? 4e7 : 1e6 * out->dp * out->cp)
                                   : 0;
    int64_t divisor;
    DSARL_TRY(dsarl_recipe_int_or(root, "policy.make_sequence_length_divisible_by", 1, &divisor, err));
    int64_t need = (out->sequence_parallel ? out->tp : 1) * (out->cp > 1 ? 2 * out->cp : 1);
    if (divisor < 1 || divisor % need != 0)
        return dsarl_recipe_fail(root, "policy.make_sequence_length_divisible_by", err, DSARL_E_INVALID,
                                 "is %lld, not a multiple of %lld (%s%s): every packed sequence is split evenly across "
                                 "those ranks", (long long)divisor, (long long)need,
                                 out->sequence_parallel && out->tp > 1 ? "tensor parallel with sequence parallelism" : "",
                                 out->cp > 1 ? " x 2 x context parallel" : "");
    return DSARL_OK;
}

int dsarl_layout_from_recipe(const dsarl_node *root, int32_t world, dsarl_layout *out, dsarl_error *err)
{
    return layout_from_recipe(root, world, false, out, err);
}

int dsarl_layout_for_job(const dsarl_node *root, int32_t processes, dsarl_layout *out, dsarl_error *err)
{
    return layout_from_recipe(root, processes, true, out, err);
}

int32_t dsarl_layout_dense_rank(const dsarl_layout *l, int32_t tp, int32_t cp, int32_t dp, int32_t pp)
{
    return tp + l->tp * (cp + l->cp * (dp + l->dp * pp));
}

int32_t dsarl_layout_expert_rank(const dsarl_layout *l, int32_t ep, int32_t edp, int32_t pp)
{
    return ep + l->ep * (edp + l->edp * pp);
}

void dsarl_layout_coords(const dsarl_layout *l, int32_t rank, dsarl_parallel *p)
{
    dsarl_parallel single = DSARL_PARALLEL_SINGLE;
    *p = single;
    p->world_rank = rank, p->world_size = l->world;
    p->tp_size = l->tp, p->pp_size = l->pp, p->cp_size = l->cp, p->dp_size = l->dp, p->ep_size = l->ep;
    p->edp_size = l->edp;
    p->vpp_size = l->vpp > 1 ? l->vpp : 1;
    p->tp_rank = rank % l->tp;
    p->cp_rank = rank / l->tp % l->cp;
    p->dp_rank = rank / (l->tp * l->cp) % l->dp;
    p->pp_rank = rank / (l->tp * l->cp * l->dp);
    p->ep_rank = rank % l->ep;
    p->edp_rank = rank / l->ep % l->edp;
    p->sequence_parallel = l->sequence_parallel && l->tp > 1;
    p->distributed_optimizer = l->distributed_optimizer && l->dp * l->cp > 1;
    p->overlap_grad_reduce = l->overlap_grad_reduce;
    p->grad_bucket_elements = l->bucket_elements;
}

void dsarl_layout_describe(const dsarl_layout *l, char *buf, size_t size)
{
    char vpp[48] = "";
    if (l->vpp > 1)
        snprintf(vpp, sizeof vpp, " (%d interleaved model chunks each)", l->vpp);
    char gen[64] = "";
    if (l->generation > 0)
        snprintf(gen, sizeof gen, ", and %d dedicated generation rank%s", l->generation, l->generation > 1 ? "s" : "");
    snprintf(buf, size, "%d %sprocesses: TP%d x CP%d x DP%d x PP%d%s, experts EP%d x EDP%d%s%s%s", l->world,
             l->generation > 0 ? "training " : "", l->tp,
             l->cp, l->dp, l->pp, vpp, l->ep, l->edp, l->sequence_parallel && l->tp > 1 ? ", sequence parallel" : "",
             l->distributed_optimizer && l->dp * l->cp > 1 ? ", distributed optimizer" : "", gen);
}

const char *dsarl_axis_name(dsarl_axis axis)
{
    static const char *const names[DSARL_AXIS_COUNT] = {"world", "tp", "pp", "cp", "dp", "dp_cp", "ep", "edp",
                                                        "tp_dp_cp"};
    return axis >= 0 && axis < DSARL_AXIS_COUNT ? names[axis] : "?";
}

int32_t dsarl_layout_group_members(const dsarl_layout *l, int32_t rank, dsarl_axis axis, int32_t *members)
{
    dsarl_parallel c;
    dsarl_layout_coords(l, rank, &c);
    int32_t n = 0;
    switch (axis) {
    case DSARL_AXIS_WORLD:
        for (int32_t r = 0; r < l->world; r++)
            members[n++] = r;
        break;
    case DSARL_AXIS_TP:
        for (int32_t t = 0; t < l->tp; t++)
            members[n++] = dsarl_layout_dense_rank(l, t, c.cp_rank, c.dp_rank, c.pp_rank);
        break;
    case DSARL_AXIS_PP:
        for (int32_t p = 0; p < l->pp; p++)
            members[n++] = dsarl_layout_dense_rank(l, c.tp_rank, c.cp_rank, c.dp_rank, p);
        break;
    case DSARL_AXIS_CP:
        for (int32_t x = 0; x < l->cp; x++)
            members[n++] = dsarl_layout_dense_rank(l, c.tp_rank, x, c.dp_rank, c.pp_rank);
        break;
    case DSARL_AXIS_DP:
        for (int32_t d = 0; d < l->dp; d++)
            members[n++] = dsarl_layout_dense_rank(l, c.tp_rank, c.cp_rank, d, c.pp_rank);
        break;
    case DSARL_AXIS_DP_CP:
        for (int32_t d = 0; d < l->dp; d++)
            for (int32_t x = 0; x < l->cp; x++)
                members[n++] = dsarl_layout_dense_rank(l, c.tp_rank, x, d, c.pp_rank);
        break;
    case DSARL_AXIS_EP:
        for (int32_t e = 0; e < l->ep; e++)
            members[n++] = dsarl_layout_expert_rank(l, e, c.edp_rank, c.pp_rank);
        break;
    case DSARL_AXIS_EDP:
        for (int32_t d = 0; d < l->edp; d++)
            members[n++] = dsarl_layout_expert_rank(l, c.ep_rank, d, c.pp_rank);
        break;
    case DSARL_AXIS_TP_DP_CP:
        for (int32_t r = 0; r < l->tp * l->cp * l->dp; r++)
            members[n++] = c.pp_rank * l->tp * l->cp * l->dp + r;
        break;
    default:
        break;
    }
    return n;
}
