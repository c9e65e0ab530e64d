/* registry_slots.c: what each kind's ops table must contain, per ABI minor (the loader's half of the contract the
 * ops headers state next to each slot).
 *
 * Every slot carries the minor that defined it and whether it is mandatory:
 *   - a table from a plugin of minor N must be at least as large as the end of the last slot minor N defines;
 *   - a mandatory slot must be non-NULL in a table from a plugin of minor >= the slot's minor;
 *   - a slot the host NEEDS (HOST_NEEDS) must be non-NULL whatever the plugin's minor: this core calls it
 *     unconditionally, so an older plugin without it is refused here instead of crashing mid-run.
 * Slots that are not function pointers (routes, capabilities, device_requires, rank) are optional: 0/NULL has a
 * documented meaning for each. */
#include "registry.h"

#include <stdio.h>
#include <string.h>

#include "dsarl/ops/algorithm.h"
#include "dsarl/ops/device.h"
#include "dsarl/ops/dsa.h"
#include "dsarl/ops/environment.h"
#include "dsarl/ops/generation.h"
#include "dsarl/ops/model.h"

enum { OPTIONAL = 0, MANDATORY = 1, HOST_NEEDS = 2 };

typedef struct slot_rule {
    const char *name;
    size_t offset, size;
    unsigned minor; /* ABI minor that defined the slot */
    int need;       /* OPTIONAL, MANDATORY or HOST_NEEDS */
} slot_rule;

#define SLOT(T, field, minor_, need_) {#field, offsetof(T, field), sizeof(((T *)0)->field), (minor_), (need_)}

#define M(f) SLOT(dsarl_model_ops, f, 0, MANDATORY)
#define MO(f, minor_) SLOT(dsarl_model_ops, f, minor_, OPTIONAL)
static const slot_rule model_rules[] = {
    M(create), M(destroy), M(parameter_count), M(vocab_size), M(forward_logits), M(save), M(forward_logprobs),
    M(backward), M(zero_grad), M(parameter_tensors), M(parameter_info), M(read_parameter), M(write_parameter),
    MO(parameter_count_config, 0), M(grad_norm), M(optimizer_step), M(optimizer_steps), M(optimizer_save),
    M(optimizer_load), M(load_weights),
    MO(cache_create, 0), MO(cache_free, 0), MO(cache_reset, 0), MO(forward_cached, 0), MO(cache_length, 0),
    MO(device, 0),
    MO(accepts, 2), MO(flops, 2), MO(train_forward, 2), MO(train_backward, 2),
    MO(reduce_gradients, 3), MO(plan, 3),
    MO(stage_forward, 4), MO(stage_backward, 4), MO(stage_transfer, 4),
    MO(cache_token_bytes, 5), MO(paged_cache_create, 5), MO(forward_paged, 5), MO(cache_copy_block, 5),
    MO(mtp_loss, 5), MO(routing_shape, 5),
};
#undef M
#undef MO

#define D(f) SLOT(dsarl_device_ops, f, 0, MANDATORY)
static const slot_rule device_rules[] = {
    D(create), D(destroy), D(storage_dtype), D(alloc), D(free), D(copy), D(zero), D(synchronize), D(upload_f32),
    D(download_f32), D(gemm), D(gemm_strided_batched), D(copy_2d), D(add), D(axpy), D(embedding_forward),
    D(embedding_backward), D(rmsnorm_forward), D(rmsnorm_backward), D(layernorm_forward), D(layernorm_backward),
    D(rope_forward), D(rope_backward), D(swiglu_forward), D(swiglu_backward), D(moe_route_forward),
    D(moe_route_backward), D(gather_rows), D(scatter_add_rows), D(scale_rows), D(row_dot), D(logprobs_forward),
    D(logprobs_backward), D(sum_squares), D(scale), D(sample_tokens), D(adamw_update),
    SLOT(dsarl_device_ops, gemm_f32out, 1, HOST_NEEDS), SLOT(dsarl_device_ops, convert, 1, HOST_NEEDS),
    SLOT(dsarl_device_ops, capabilities, 2, OPTIONAL), SLOT(dsarl_device_ops, stream, 2, OPTIONAL),
    /* the collectives are optional as a set: dsarl_session_open refuses a multi-rank layout on a device without
     * them, naming the slot */
    SLOT(dsarl_device_ops, all_reduce, 3, OPTIONAL), SLOT(dsarl_device_ops, all_gather, 3, OPTIONAL),
    SLOT(dsarl_device_ops, reduce_scatter, 3, OPTIONAL), SLOT(dsarl_device_ops, all_to_all, 3, OPTIONAL),
    SLOT(dsarl_device_ops, broadcast, 3, OPTIONAL), SLOT(dsarl_device_ops, send, 3, OPTIONAL),
    SLOT(dsarl_device_ops, recv, 3, OPTIONAL),
    SLOT(dsarl_device_ops, sample_filtered, 5, OPTIONAL),
    SLOT(dsarl_device_ops, profile_scope, 7, OPTIONAL), SLOT(dsarl_device_ops, moe_group_padded, 7, OPTIONAL),
    SLOT(dsarl_device_ops, memory_info, 7, OPTIONAL), SLOT(dsarl_device_ops, gemm_grouped, 7, OPTIONAL),
};
#undef D

#define S(f) SLOT(dsarl_dsa_ops, f, 0, MANDATORY)
static const slot_rule dsa_rules[] = {
    S(create), S(destroy), S(indexer_topk), S(sparse_mla_forward), S(sparse_mla_backward),
    S(indexer_loss_forward), S(indexer_loss_backward),
    SLOT(dsarl_dsa_ops, preferred_form, 1, OPTIONAL), SLOT(dsarl_dsa_ops, headwise_attention_forward, 1, OPTIONAL),
    SLOT(dsarl_dsa_ops, headwise_attention_backward, 1, OPTIONAL), SLOT(dsarl_dsa_ops, routes, 1, OPTIONAL),
    SLOT(dsarl_dsa_ops, device_requires, 2, OPTIONAL),
};
#undef S

static const slot_rule generation_rules[] = {
    SLOT(dsarl_generation_ops, create, 0, MANDATORY),
    SLOT(dsarl_generation_ops, destroy, 0, MANDATORY),
    SLOT(dsarl_generation_ops, generate, 0, MANDATORY),
};

static const slot_rule algorithm_rules[] = {
    SLOT(dsarl_algorithm_ops, run, 0, MANDATORY),
};

static const slot_rule environment_rules[] = {
    SLOT(dsarl_environment_ops, create, 0, MANDATORY),
    SLOT(dsarl_environment_ops, destroy, 0, MANDATORY),
    SLOT(dsarl_environment_ops, score, 0, MANDATORY),
    SLOT(dsarl_environment_ops, reward_components, 4, OPTIONAL),
    SLOT(dsarl_environment_ops, score_components, 4, OPTIONAL),
    SLOT(dsarl_environment_ops, step, 4, OPTIONAL),
};

static const slot_rule *rules_of(dsarl_kind kind, size_t *n)
{
#define RULES(a) (*n = sizeof(a) / sizeof((a)[0]), (a))
    switch (kind) {
    case DSARL_KIND_MODEL: return RULES(model_rules);
    case DSARL_KIND_DEVICE: return RULES(device_rules);
    case DSARL_KIND_DSA: return RULES(dsa_rules);
    case DSARL_KIND_GENERATION: return RULES(generation_rules);
    case DSARL_KIND_ALGORITHM: return RULES(algorithm_rules);
    case DSARL_KIND_ENVIRONMENT: return RULES(environment_rules);
    default: *n = 0; return NULL;
    }
#undef RULES
}

size_t dsarl_registry_minimum_ops_size(dsarl_kind kind, unsigned minor)
{
    /* The head's 1.2 slot (rank) took reserved space, so the head is the same size in every minor: the floor. */
    size_t n = 0, size = sizeof(dsarl_ops_common);
    const slot_rule *rules = rules_of(kind, &n);
    for (size_t i = 0; i < n; i++)
        if (rules[i].minor <= minor && rules[i].offset + rules[i].size > size)
            size = rules[i].offset + rules[i].size;
    return size;
}

int dsarl_registry_check_slots(dsarl_kind kind, const dsarl_ops_common *ops, unsigned minor, char *why,
                               size_t why_size)
{
    size_t n = 0;
    const slot_rule *rules = rules_of(kind, &n);
    size_t need = dsarl_registry_minimum_ops_size(kind, minor);
    if (ops->struct_size < need) {
        snprintf(why, why_size, "is %u bytes, smaller than the %zu every ABI 1.%u %s table has (built against an "
                 "older dsarl SDK, or struct_size is wrong?)", ops->struct_size, need, minor, dsarl_kind_name(kind));
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const slot_rule *r = &rules[i];
        if (r->need == OPTIONAL) /* data slots (routes, capabilities, device_requires) are all optional */
            continue;
        if (r->need == MANDATORY && minor < r->minor)
            continue;
        void (*fn)(void) = NULL;
        if (r->offset + r->size <= ops->struct_size)
            memcpy(&fn, (const char *)ops + r->offset, sizeof fn);
        if (fn)
            continue;
        if (minor < r->minor)
            snprintf(why, why_size, "has no '%s' slot (added in ABI 1.%u; the plugin was built for 1.%u), which this "
                     "host calls unconditionally: rebuild the plugin against this dsarl and fill it", r->name, r->minor,
                     minor);
        else
            snprintf(why, why_size, "leaves the mandatory slot '%s' NULL (mandatory since ABI 1.%u)", r->name,
                     r->minor);
        return -1;
    }
    return 0;
}
