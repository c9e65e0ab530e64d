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

typedef struct spec_list {
    glm5_param *items;
    int64_t n, cap, offset;
} spec_list;

static int add(spec_list *l, int32_t layer, const char *name, glm5_shard shard, bool trainable, int32_t ndim,
               int64_t d0, int64_t d1, int64_t d2, dsarl_error *err)
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
    p->shape[0] = d0, p->shape[1] = d1, p->shape[2] = d2;
    p->numel = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
    p->offset = l->offset;
    p->shard = shard;
    p->trainable = trainable;
    p->layer = layer;
    // keep every tensor 64-element aligned so device kernels can vectorise
    l->offset += (p->numel + 63) / 64 * 64;
    return DSARL_OK;
}

int glm5_param_specs(const glm5_config *c, glm5_param **out, int64_t *n_params, int64_t *n_weights,
                     dsarl_error *err)
{
    spec_list l = {0};
    int64_t C = c->hidden_size, H = c->num_attention_heads, E = c->n_routed_experts;
    int rc = add(&l, -1, "model.embed_tokens.weight", GLM5_SHARD_VOCAB, true, 2, c->vocab_size, C, 0, err);
    for (int32_t i = 0; i < c->num_hidden_layers && rc == 0; i++) {
        rc |= add(&l, i, "input_layernorm.weight", GLM5_SHARD_REPLICATED, true, 1, C, 0, 0, err);
        rc |= add(&l, i, "self_attn.q_a_proj.weight", GLM5_SHARD_REPLICATED, true, 2, c->q_lora_rank, C, 0, err);
        rc |= add(&l, i, "self_attn.q_a_layernorm.weight", GLM5_SHARD_REPLICATED, true, 1, c->q_lora_rank, 0, 0, err);
        rc |= add(&l, i, "self_attn.q_b_proj.weight", GLM5_SHARD_COLUMN, true, 2, H * c->qk_head_dim, c->q_lora_rank,
                  0, err);
        rc |= add(&l, i, "self_attn.kv_a_proj_with_mqa.weight", GLM5_SHARD_REPLICATED, true, 2,
                  c->kv_lora_rank + c->qk_rope_head_dim, C, 0, err);
        rc |= add(&l, i, "self_attn.kv_a_layernorm.weight", GLM5_SHARD_REPLICATED, true, 1, c->kv_lora_rank, 0, 0,
                  err);
        rc |= add(&l, i, "self_attn.kv_b_proj.weight", GLM5_SHARD_COLUMN, true, 2,
                  H * (c->qk_nope_head_dim + c->v_head_dim), c->kv_lora_rank, 0, err);
        rc |= add(&l, i, "self_attn.o_proj.weight", GLM5_SHARD_ROW, true, 2, C, H * c->v_head_dim, 0, err);
        if (c->indexer_full[i]) {
            rc |= add(&l, i, "self_attn.indexer.wq_b.weight", GLM5_SHARD_REPLICATED, true, 2,
                      (int64_t)c->index_n_heads * c->index_head_dim, c->q_lora_rank, 0, err);
            rc |= add(&l, i, "self_attn.indexer.wk.weight", GLM5_SHARD_REPLICATED, true, 2, c->index_head_dim, C, 0,
                      err);
            rc |= add(&l, i, "self_attn.indexer.k_norm.weight", GLM5_SHARD_REPLICATED, true, 1, c->index_head_dim, 0,
                      0, err);
            rc |= add(&l, i, "self_attn.indexer.k_norm.bias", GLM5_SHARD_REPLICATED, true, 1, c->index_head_dim, 0, 0,
                      err);
            rc |= add(&l, i, "self_attn.indexer.weights_proj.weight", GLM5_SHARD_REPLICATED, true, 2,
                      c->index_n_heads, C, 0, err);
        }
        rc |= add(&l, i, "post_attention_layernorm.weight", GLM5_SHARD_REPLICATED, true, 1, C, 0, 0, err);
        const char *mlp = c->mlp_sparse[i] ? "mlp.shared_experts" : "mlp";
        int64_t inner = c->mlp_sparse[i] ? c->moe_intermediate_size * c->n_shared_experts : c->intermediate_size;
        char name[96];
        if (c->mlp_sparse[i]) {
            rc |= add(&l, i, "mlp.gate.weight", GLM5_SHARD_REPLICATED, true, 2, E, C, 0, err);
            rc |= add(&l, i, "mlp.gate.e_score_correction_bias", GLM5_SHARD_REPLICATED, false, 1, E, 0, 0, err);
            rc |= add(&l, i, "mlp.experts.gate_up_proj", GLM5_SHARD_EXPERT, true, 3, E,
                      2 * c->moe_intermediate_size, C, err);
            rc |= add(&l, i, "mlp.experts.down_proj", GLM5_SHARD_EXPERT, true, 3, E, C, c->moe_intermediate_size,
                      err);
        }
        if (inner > 0) { // n_shared_experts = 0 means no shared expert
            // gate and up are listed back to back with no padding so they form one (2*inner, C) matrix
            snprintf(name, sizeof name, "%s.gate_proj.weight", mlp);
            rc |= add(&l, i, name, GLM5_SHARD_COLUMN, true, 2, inner, C, 0, err);
            l.offset = l.items[l.n - 1].offset + inner * C;
            snprintf(name, sizeof name, "%s.up_proj.weight", mlp);
            rc |= add(&l, i, name, GLM5_SHARD_COLUMN, true, 2, inner, C, 0, err);
            snprintf(name, sizeof name, "%s.down_proj.weight", mlp);
            rc |= add(&l, i, name, GLM5_SHARD_ROW, true, 2, C, inner, 0, err);
        }
    }
    if (rc == 0)
        rc |= add(&l, -1, "model.norm.weight", GLM5_SHARD_REPLICATED, true, 1, C, 0, 0, err);
    if (rc == 0 && !c->tie_word_embeddings)
        rc |= add(&l, -1, "lm_head.weight", GLM5_SHARD_VOCAB, true, 2, c->vocab_size, C, 0, err);
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
    DSARL_TRY(glm5_param_specs(cfg, &p, &n, &total, err));
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
