/* glm5_params.c: the parameter list of a glm_moe_dsa config, in buffer order, with TP/EP sharding recorded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "glm5_model.h"

const char *glm5_shard_name(glm5_shard shard)
{
    static const char *names[] = {"replicated", "column", "row", "expert", "vocab"};
    return (unsigned)shard < sizeof names / sizeof names[0] ? names[shard] : "unknown";
}

#define GLM5_MAX_ELEMENTS ((int64_t)1 << 42)

typedef struct spec_list {
    glm5_param *items;
    int64_t n, cap, offset;
} spec_list;

// The split dimension and the number of parts of a shard kind under shards.
static void split_of(glm5_shard shard, const glm5_shards *s, int32_t *dim, int32_t *parts, int32_t *index)
{
    *dim = -1, *parts = 1, *index = 0;
    switch (shard) {
    case GLM5_SHARD_COLUMN:
    case GLM5_SHARD_VOCAB: *dim = 0, *parts = s->tp_size, *index = s->tp_rank; break;
    case GLM5_SHARD_ROW: *dim = 1, *parts = s->tp_size, *index = s->tp_rank; break;
    case GLM5_SHARD_EXPERT: *dim = 0, *parts = s->ep_size, *index = s->ep_rank; break;
    default: break;
    }
    if (*parts <= 1)
        *dim = -1, *parts = 1, *index = 0;
}

static int add(spec_list *l, const glm5_shards *shards, int32_t layer, const char *name, glm5_shard shard,
               bool trainable, int32_t ndim, int64_t d0, int64_t d1, int64_t d2, dsarl_error *err)
{
    if (l->n == l->cap) {
        int64_t cap = l->cap ? l->cap * 2 : 256;
        glm5_param *p = realloc(l->items, (size_t)cap * sizeof(*p));
        if (!p)
            return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of memory listing parameters");
        l->items = p, l->cap = cap;
    }
    glm5_param *p = &l->items[l->n++];
    memset(p, 0, sizeof(*p));
    if (layer >= 0)
        snprintf(p->name, sizeof p->name, "model.layers.%d.%s", layer, name);
    else
        snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim;
    p->full_shape[0] = d0, p->full_shape[1] = d1, p->full_shape[2] = d2;
    p->full_numel = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
    int32_t dim, parts, index;
    split_of(shard, shards, &dim, &parts, &index);
    memcpy(p->shape, p->full_shape, sizeof p->shape);
    p->shard_dim = dim;
    p->shard_start = 0;
    if (dim >= 0) { // glm5_check_layout made every split exact
        p->shape[dim] = p->full_shape[dim] / parts;
        p->shard_start = p->shape[dim] * index;
    }
    p->numel = p->shape[0] * (ndim > 1 ? p->shape[1] : 1) * (ndim > 2 ? p->shape[2] : 1);
    p->offset = l->offset;
    p->shard = shard;
    p->trainable = trainable;
    p->layer = layer;
    p->spec_index = l->n - 1;
    // keep every tensor 64-element aligned so device kernels can vectorise; the config's bounds keep each tensor
    // small enough, the sum is checked (a model past 2^42 elements is refused rather than wrapped)
    int64_t padded = (p->numel + 63) / 64 * 64;
    if (__builtin_add_overflow(l->offset, padded, &l->offset) || l->offset > GLM5_MAX_ELEMENTS)
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: the model's parameters exceed %lld elements at %s; the config's "
                          "sizes are too large", (long long)GLM5_MAX_ELEMENTS, p->name);
    return DSARL_OK;
}

int glm5_param_specs(const glm5_config *c, const glm5_shards *shards, glm5_param **out, int64_t *n_params,
                     int64_t *n_weights, dsarl_error *err)
{
    spec_list l = {0};
    const glm5_shards whole = GLM5_SHARDS_SINGLE;
    if (!shards)
        shards = &whole;
    int64_t C = c->hidden_size, H = c->num_attention_heads, E = c->n_routed_experts;
    int rc = add(&l, shards, -1, "model.embed_tokens.weight", GLM5_SHARD_VOCAB, true, 2, c->vocab_size, C, 0, err);
    for (int32_t i = 0; i < glm5_built_layers(c) && rc == 0; i++) {
        if (i == c->num_hidden_layers) { // the trunk's head first: the MTP depths' tensors come last
            rc |= add(&l, shards, -1, "model.norm.weight", GLM5_SHARD_REPLICATED, true, 1, C, 0, 0, err);
            if (!c->tie_word_embeddings)
                rc |= add(&l, shards, -1, "lm_head.weight", GLM5_SHARD_VOCAB, true, 2, c->vocab_size, C, 0, err);
        }
        if (i >= c->num_hidden_layers) { // an MTP depth: [enorm(embedding) | hnorm(hidden)] eh_proj^T, its block,
            // and shared_head.norm before the trunk's LM head (glm5_mtp.c)
            rc |= add(&l, shards, i, "enorm.weight", GLM5_SHARD_REPLICATED, true, 1, C, 0, 0, err);
            rc |= add(&l, shards, i, "hnorm.weight", GLM5_SHARD_REPLICATED, true, 1, C, 0, 0, err);
            rc |= add(&l, shards, i, "eh_proj.weight", GLM5_SHARD_REPLICATED, true, 2, C, 2 * C, 0, err);
            rc |= add(&l, shards, i, "shared_head.norm.weight", GLM5_SHARD_REPLICATED, true, 1, C, 0, 0, err);
            if (c->mtp_own_embed)
                rc |= add(&l, shards, i, "embed_tokens.weight", GLM5_SHARD_VOCAB, true, 2, c->vocab_size, C, 0, err);
            if (c->mtp_own_head)
                rc |= add(&l, shards, i, "shared_head.head.weight", GLM5_SHARD_VOCAB, true, 2, c->vocab_size, C, 0,
                          err);
        }
        rc |= add(&l, shards, i, "input_layernorm.weight", GLM5_SHARD_REPLICATED, true, 1, C, 0, 0, err);
        rc |= add(&l, shards, i, "self_attn.q_a_proj.weight", GLM5_SHARD_REPLICATED, true, 2, c->q_lora_rank, C, 0, err);
        rc |= add(&l, shards, i, "self_attn.q_a_layernorm.weight", GLM5_SHARD_REPLICATED, true, 1, c->q_lora_rank, 0, 0, err);
        rc |= add(&l, shards, i, "self_attn.q_b_proj.weight", GLM5_SHARD_COLUMN, true, 2, H * c->qk_head_dim, c->q_lora_rank,
                  0, err);
        rc |= add(&l, shards, i, "self_attn.kv_a_proj_with_mqa.weight", GLM5_SHARD_REPLICATED, true, 2,
                  c->kv_lora_rank + c->qk_rope_head_dim, C, 0, err);
        rc |= add(&l, shards, i, "self_attn.kv_a_layernorm.weight", GLM5_SHARD_REPLICATED, true, 1, c->kv_lora_rank, 0, 0,
                  err);
        rc |= add(&l, shards, i, "self_attn.kv_b_proj.weight", GLM5_SHARD_COLUMN, true, 2,
                  H * (c->qk_nope_head_dim + c->v_head_dim), c->kv_lora_rank, 0, err);
        rc |= add(&l, shards, i, "self_attn.o_proj.weight", GLM5_SHARD_ROW, true, 2, C, H * c->v_head_dim, 0, err);
        if (c->indexer_full[i]) {
            rc |= add(&l, shards, i, "self_attn.indexer.wq_b.weight", GLM5_SHARD_REPLICATED, true, 2,
                      (int64_t)c->index_n_heads * c->index_head_dim, c->q_lora_rank, 0, err);
            rc |= add(&l, shards, i, "self_attn.indexer.wk.weight", GLM5_SHARD_REPLICATED, true, 2, c->index_head_dim, C, 0,
                      err);
            rc |= add(&l, shards, i, "self_attn.indexer.k_norm.weight", GLM5_SHARD_REPLICATED, true, 1, c->index_head_dim, 0,
                      0, err);
            rc |= add(&l, shards, i, "self_attn.indexer.k_norm.bias", GLM5_SHARD_REPLICATED, true, 1, c->index_head_dim, 0, 0,
                      err);
            rc |= add(&l, shards, i, "self_attn.indexer.weights_proj.weight", GLM5_SHARD_REPLICATED, true, 2,
                      c->index_n_heads, C, 0, err);
        }
        rc |= add(&l, shards, i, "post_attention_layernorm.weight", GLM5_SHARD_REPLICATED, true, 1, C, 0, 0, err);
        const char *mlp = c->mlp_sparse[i] ? "mlp.shared_experts" : "mlp";
        int64_t inner = c->mlp_sparse[i] ? c->moe_intermediate_size * c->n_shared_experts : c->intermediate_size;
        char name[96];
        if (c->mlp_sparse[i]) {
            rc |= add(&l, shards, i, "mlp.gate.weight", GLM5_SHARD_REPLICATED, true, 2, E, C, 0, err);
            rc |= add(&l, shards, i, "mlp.gate.e_score_correction_bias", GLM5_SHARD_REPLICATED, false, 1, E, 0, 0, err);
            rc |= add(&l, shards, i, "mlp.experts.gate_up_proj", GLM5_SHARD_EXPERT, true, 3, E,
                      2 * c->moe_intermediate_size, C, err);
            rc |= add(&l, shards, i, "mlp.experts.down_proj", GLM5_SHARD_EXPERT, true, 3, E, C, c->moe_intermediate_size,
                      err);
        }
        if (inner > 0) { // n_shared_experts = 0 means no shared expert
            // gate and up are listed back to back with no padding so they form one (2*inner, C) matrix
            snprintf(name, sizeof name, "%s.gate_proj.weight", mlp);
            rc |= add(&l, shards, i, name, GLM5_SHARD_COLUMN, true, 2, inner, C, 0, err);
            l.offset = l.items[l.n - 1].offset + l.items[l.n - 1].numel;
            snprintf(name, sizeof name, "%s.up_proj.weight", mlp);
            rc |= add(&l, shards, i, name, GLM5_SHARD_COLUMN, true, 2, inner, C, 0, err);
            snprintf(name, sizeof name, "%s.down_proj.weight", mlp);
            rc |= add(&l, shards, i, name, GLM5_SHARD_ROW, true, 2, C, inner, 0, err);
        }
    }
    if (rc == 0 && c->mtp_layers == 0)
        rc |= add(&l, shards, -1, "model.norm.weight", GLM5_SHARD_REPLICATED, true, 1, C, 0, 0, err);
    if (rc == 0 && c->mtp_layers == 0 && !c->tie_word_embeddings)
        rc |= add(&l, shards, -1, "lm_head.weight", GLM5_SHARD_VOCAB, true, 2, c->vocab_size, C, 0, err);
    if (rc) {
        free(l.items);
        return err ? err->code : DSARL_E_NOMEM;
    }
    *out = l.items;
    *n_params = l.n;
    *n_weights = l.offset;
    return DSARL_OK;
}

int glm5_count_parameters(const glm5_config *cfg, int64_t *trainable, int64_t *buffers, dsarl_error *err)
{
    glm5_param *p = NULL;
    int64_t n = 0, total = 0;
    DSARL_TRY(glm5_param_specs(cfg, NULL, &p, &n, &total, err));
    int64_t t = 0, b = 0;
    for (int64_t i = 0; i < n; i++) {
        if (p[i].trainable)
            t += p[i].numel;
        else
            b += p[i].numel;
    }
    free(p);
    *trainable = t;
    *buffers = b;
    return DSARL_OK;
}

int glm5_check_layout(const glm5_config *c, const dsarl_parallel *par, dsarl_error *err)
{
    int32_t tp = par ? par->tp_size : 1, ep = par ? par->ep_size : 1;
    struct { const char *what; int64_t n; int32_t by; const char *key; } rules[] = {
        {"attention heads (num_attention_heads)", c->num_attention_heads, tp, "tensor_model_parallel_size"},
        {"the vocabulary (vocab_size)", c->vocab_size, tp, "tensor_model_parallel_size"},
        {"the dense MLP width (intermediate_size)", c->intermediate_size, tp, "tensor_model_parallel_size"},
        {"the shared-expert width (moe_intermediate_size x n_shared_experts)",
         c->moe_intermediate_size * c->n_shared_experts, tp, "tensor_model_parallel_size"},
        {"routed experts (n_routed_experts)", c->n_routed_experts, ep, "expert_model_parallel_size"},
    };
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        if (rules[i].by > 1 && rules[i].n % rules[i].by != 0)
            return DSARL_FAIL(err, DSARL_E_INVALID,
                              "glm5: %s = %lld is not divisible by policy.megatron_cfg.%s = %d; every rank holds an "
                              "equal share, so pick a divisor of %lld", rules[i].what, (long long)rules[i].n,
                              rules[i].key, rules[i].by, (long long)rules[i].n);
    return DSARL_OK;
}

void glm5_param_take_shard(const glm5_param *p, const float *full, float *local)
{
    if (p->shard_dim < 0) {
        memcpy(local, full, (size_t)p->numel * sizeof(float));
        return;
    }
    // the elements after the split dimension form one contiguous row of `inner` values per index
    int64_t outer = 1, inner = 1;
    for (int32_t d = 0; d < p->shard_dim; d++)
        outer *= p->full_shape[d];
    for (int32_t d = p->shard_dim + 1; d < p->ndim; d++)
        inner *= p->full_shape[d];
    int64_t full_span = p->full_shape[p->shard_dim] * inner, span = p->shape[p->shard_dim] * inner;
    for (int64_t o = 0; o < outer; o++)
        memcpy(local + o * span, full + o * full_span + p->shard_start * inner, (size_t)span * sizeof(float));
}

const dsarl_group *glm5_param_dp_group(const dsarl_model *m, const glm5_param *p)
{
    if (!DSARL_PARALLEL_HAS_GROUPS(&m->parallel))
        return NULL;
    return p->shard == GLM5_SHARD_EXPERT ? m->parallel.edp : m->parallel.dp_cp;
}

bool glm5_param_counts_in_norm(const dsarl_model *m, const glm5_param *p)
{
    const dsarl_parallel *par = &m->parallel;
    if (p->shard == GLM5_SHARD_EXPERT) // one copy per expert shard: the first replica of each
        return par->edp_rank == 0;
    if (p->layer < 0 && m->cfg.tie_word_embeddings && m->stage.size > 1 && !glm5_stage_is_first(m) &&
        !strcmp(p->name, "model.embed_tokens.weight"))
        return false; // the last stage's copy of a tied embedding: the first stage counts it
    // dense parameters: the first data-parallel replica; a tensor-parallel shard on every tp rank, a tensor that
    // every tp rank holds whole on the first of them
    bool first_replica = par->dp_rank == 0 && par->cp_rank == 0;
    return first_replica && (p->shard_dim >= 0 || par->tp_rank == 0);
}
