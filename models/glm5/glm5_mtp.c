/* glm5_mtp.c: multi-token prediction (DeepSeek-V3's MTP modules; GLM-5's model.layers.78) trained beside the trunk.
 *
 * Depth k = 1..D at position i predicts token t_{i+k+1} from h^{k-1}_i and the embedding of t_{i+k}:
 *   x   = [enorm(embed(t_{i+k})) | hnorm(h^{k-1}_i)] eh_proj^T     (T, 2C) -> (T, C)
 *   x   = block_k(x)                                               a decoder layer like the trunk's (DSA + MoE)
 *   h^k = shared_head.norm(x),  logits_k = h^k lm_head^T            the trunk's embedding and LM head, shared
 * with h^0 = the trunk's final-norm output h_final (the hidden state serving engines feed their MTP draft layer);
 * a checkpoint whose depths have their own embed_tokens / shared_head.head (DeepSeek-V3) trains those instead.
 * The loss, added to the caller's (Megatron's mtp_loss_scaling_factor / mtp_num_layers per depth):
 *   L_mtp = scale / D * sum_k (sum over scored positions i of -log p_k(t_{i+k+1} | i)) / N_k
 * where i is scored when t_{i+k+1} exists inside its sequence, its target is not ignored (targets[i+k] >= 0) and
 * the caller's token mask, when it gives one, counts position i+k (Megatron rolls the loss mask likewise); N_k is
 * the caller's normalisation (its global token count, so that microbatches and data-parallel ranks add up to
 * one mean, as Megatron's per-token loss does) or else depth k's scored positions of the pass.
 * Its gradient reaches the depths' weights, the shared embedding and LM head, and through hnorm h_final and the
 * trunk. A position past its sequence's end reads token 0 and is never scored; attention is causal inside each
 * sequence, so no scored position sees it and its gradient is exactly zero. */
#include <stdlib.h>
#include <string.h>
#include "glm5_pass.h"

struct glm5_mtp {
    int32_t depths;
    int32_t *ids, *targets;             // (D, T) device: t_{i+k} (0 past the end), t_{i+k+1} (-1: not scored)
    int32_t *host_targets;              // host (D, T): the targets of mt->targets
    float *host_lp;                     // host (D, T): the forward's log-probs
    float *weight;                      // host (D, T): d L_mtp / d (-log p_k) of each position (0: not scored)
    float *host_dlp;                    // host (T): one depth's d L_mtp / d log p_k
    float *logprobs;                    // (D, T) device: the forward's log-probs, then the backward's dlogprobs
    void **emb, **cat, **x, **out;      // per depth: (T,C) embedding rows, (T,2C) [enorm | hnorm], (T,C) the
                                        // block's stream (its output after the forward), (T,C) h^k
    float **rstd_e, **rstd_h, **rstd_o; // per depth (T)
    glm5_layer_acts *acts;              // (D)
    void *scratch, *dmain, *dout, *dcarry, *dcat; // (T,C) x 4, (T,2C)
};

#define MTP_KEY "policy.megatron_cfg.mtp_num_layers"

int glm5_mtp_configure(glm5_config *cfg, const dsarl_node *recipe, const dsarl_parallel *par, const char *model_dir,
                       float *scale, dsarl_error *err)
{
    const char *where = model_dir ? model_dir : "policy.model_config";
    int64_t layers = 0;
    double factor = 0.1; // Megatron's default
    *scale = 0.0f;
    if (!recipe)
        return DSARL_OK;
    DSARL_TRY(dsarl_recipe_int_or(recipe, MTP_KEY, 0, &layers, err));
    if (layers == 0)
        return DSARL_OK;
    if (layers < 0)
        return dsarl_recipe_fail(recipe, MTP_KEY, err, DSARL_E_INVALID, "must be >= 0 (0 or null: MTP off), got %lld",
                                 (long long)layers);
    DSARL_TRY(dsarl_recipe_double_or(recipe, "policy.megatron_cfg.mtp_loss_scaling_factor", 0.1, &factor, err));
    if (!(factor >= 0.0 && factor <= 1e6))
        return dsarl_recipe_fail(recipe, "policy.megatron_cfg.mtp_loss_scaling_factor", err, DSARL_E_INVALID,
                                 "must be in [0, 1e6] (the MTP loss's weight beside the main loss), got %g", factor);
    // expert parallelism runs the depths' MoE blocks as the trunk's; the row splits of tp/cp and the stages of pp
    // would need the depths' own (not written)
    struct { const char *key; int32_t size; } layout[] = {
        {"tensor_model_parallel_size", par ? par->tp_size : 1}, {"pipeline_model_parallel_size", par ? par->pp_size : 1},
        {"context_parallel_size", par ? par->cp_size : 1}};
    for (size_t i = 0; i < sizeof layout / sizeof layout[0]; i++)
        if (layout[i].size > 1)
            return dsarl_recipe_fail(recipe, MTP_KEY, err, DSARL_E_INVALID, "trains MTP under data and expert "
                                     "parallelism only, but policy.megatron_cfg.%s is %d; set it to 1 or "
                                     "mtp_num_layers to 0", layout[i].key, layout[i].size);
    // what the checkpoint has, named with the key's place in the recipe (glm5_config_enable_mtp checks it again)
    if (cfg->num_nextn_predict_layers == 0)
        return dsarl_recipe_fail(recipe, MTP_KEY, err, DSARL_E_INVALID, "is %lld, but %s has no MTP layer "
                                 "(num_nextn_predict_layers 0); set it to 0", (long long)layers, where);
    if (layers > cfg->num_nextn_predict_layers)
        return dsarl_recipe_fail(recipe, MTP_KEY, err, DSARL_E_INVALID, "is %lld, but %s has only %d MTP layer(s) "
                                 "(num_nextn_predict_layers); pick 1..%d", (long long)layers, where,
                                 cfg->num_nextn_predict_layers, cfg->num_nextn_predict_layers);
    DSARL_TRY(glm5_config_enable_mtp(cfg, layers, where, err));
    *scale = (float)factor;
    // DeepSeek-V3 releases give each depth copies of the embedding and LM head (trained as its own); GLM-5 shares
    char key[96];
    for (int pass = 0; model_dir && pass < 2; pass++) {
        snprintf(key, sizeof key, "model.layers.%d.%s", cfg->num_hidden_layers,
                 pass ? "shared_head.head.weight" : "embed_tokens.weight");
        DSARL_TRY(glm5_hf_has_key(model_dir, key, pass ? &cfg->mtp_own_head : &cfg->mtp_own_embed, err));
    }
    return DSARL_OK;
}

// Allocates one pointer table of depths entries per field and the depth's buffers of bytes each.
static int per_depth(glm5_pass *p, int32_t depths, void ***table, size_t bytes, dsarl_error *err)
{
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)depths * sizeof(void *), (void **)table, err));
    for (int32_t k = 0; k < depths; k++)
        DSARL_TRY(glm5_pass_alloc(p, bytes, &(*table)[k], err));
    return DSARL_OK;
}

// The depths' token ids and targets, built on the host from the batch's tokens (downloaded) and the caller's targets.
static int upload_shifted(glm5_pass *p, struct glm5_mtp *mt, const int32_t *targets, dsarl_error *err)
{
    dsarl_model *m = p->m;
    int64_t T = p->T, D = mt->depths;
    int32_t *tokens, *host;
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)T * sizeof(int32_t), (void **)&tokens, err));
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(2 * D * T) * sizeof(int32_t), (void **)&host, err));
    mt->host_targets = host + D * T;
    DSARL_TRY(m->dev_ops->copy(m->dev, tokens, p->tokens, (size_t)T * sizeof(int32_t), DSARL_COPY_DEVICE_TO_HOST,
                               err));
    const int32_t *cu = p->batch.host_cu_seqlens;
    for (int32_t s = 0; s < p->batch.n_segments; s++)
        for (int32_t i = cu[s]; i < cu[s + 1]; i++)
            for (int64_t k = 0; k < D; k++) {
                int64_t j = i + k + 1; // depth k + 1 reads t_j and predicts targets[j] = t_{j+1}
                bool inside = j < cu[s + 1];
                host[k * T + i] = inside ? tokens[j] : 0;
                host[(D + k) * T + i] = inside ? targets[j] : -1;
            }
    return m->dev_ops->copy(m->dev, mt->ids, host, (size_t)(2 * D * T) * sizeof(int32_t), DSARL_COPY_HOST_TO_DEVICE,
                            err);
}

// The LM head (the depth's own copy, if it has one) on h (T,C), no logit factor (the MTP loss is a plain cross
// entropy), in the pass's logits buffer (the trunk's backward computes its logits again, glm5_backward.c): the
// swapped fields, restored by head_end.
typedef struct head_swap {
    void *h_final, *lm_head;
    float logit_scale;
} head_swap;

static head_swap head_begin(glm5_pass *p, const glm5_layer *L, void *h)
{
    head_swap s = {p->h_final, p->m->lm_head, p->logit_scale};
    p->h_final = h, p->logit_scale = 1.0f;
    if (L->mtp_head)
        p->m->lm_head = L->mtp_head;
    return s;
}

static void head_end(glm5_pass *p, head_swap s)
{
    p->h_final = s.h_final, p->m->lm_head = s.lm_head, p->logit_scale = s.logit_scale;
}

// The embedding depth L reads: its own copy, or the trunk's.
static void *depth_embed(const dsarl_model *m, const glm5_layer *L)
{
    return L->mtp_embed ? L->mtp_embed : m->embed;
}

// y (T,C) = rmsnorm(x) written into the (T, 2C) concatenation at column `col`, through scratch.
static int norm_into_cat(dsarl_model *m, struct glm5_mtp *mt, void *cat, int64_t col, float *rstd, const void *x,
                         const void *w, int64_t T, dsarl_error *err)
{
    int64_t C = m->cfg.hidden_size;
    DSARL_TRY(m->dev_ops->rmsnorm_forward(m->dev, mt->scratch, rstd, x, w, T, C, (float)m->cfg.rms_norm_eps, err));
    return m->dev_ops->copy_2d(m->dev, glm5_at(m, cat, col), 2 * C, mt->scratch, C, T, C, err);
}

static int depth_forward(glm5_pass *p, struct glm5_mtp *mt, int32_t k, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    int64_t T = p->T, C = m->cfg.hidden_size;
    int32_t layer = m->cfg.num_hidden_layers + k;
    const glm5_layer *L = &m->layers[layer];
    const void *h_prev = k == 0 ? p->h_final : mt->out[k - 1];
    glm5_scope(m, "mtp");
    DSARL_TRY(d->embedding_forward(m->dev, mt->emb[k], mt->ids + k * T, depth_embed(m, L), T, C, m->cfg.vocab_size,
                                   err));
    DSARL_TRY(norm_into_cat(m, mt, mt->cat[k], 0, mt->rstd_e[k], mt->emb[k], L->enorm, T, err));
    DSARL_TRY(norm_into_cat(m, mt, mt->cat[k], C, mt->rstd_h[k], h_prev, L->hnorm, T, err));
    DSARL_TRY(glm5_linear(m, mt->x[k], mt->cat[k], L->eh_proj, T, 2 * C, C, err));
    // the block runs on the pass's stream field; h_final is its MLP's scratch there, so both point at ours
    void *x = p->x, *h_final = p->h_final;
    p->x = mt->x[k], p->h_final = mt->scratch;
    int rc = glm5_layer_forward(p, &mt->acts[k], layer, NULL, err);
    p->x = x, p->h_final = h_final;
    DSARL_TRY(rc);
    glm5_scope(m, "mtp");
    DSARL_TRY(d->rmsnorm_forward(m->dev, mt->out[k], mt->rstd_o[k], mt->x[k], L->head_norm, T, C,
                                 (float)m->cfg.rms_norm_eps, err));
    float *lp = mt->logprobs + k * T;
    glm5_scope(m, "lm_head");
    head_swap s = head_begin(p, L, mt->out[k]);
    rc = p->head_rows >= T ? glm5_head_chunk_logits(p, 0, T, err) : DSARL_OK;
    if (rc == 0)
        rc = glm5_head_logprobs(p, lp, mt->targets + k * T, err);
    head_end(p, s);
    DSARL_TRY(rc);
    return d->copy(m->dev, mt->host_lp + k * T, lp, (size_t)T * sizeof(float), DSARL_COPY_DEVICE_TO_HOST, err);
}

int glm5_mtp_weigh(glm5_pass *p, const float *mask, double norm_tokens, float *loss)
{
    struct glm5_mtp *mt = p->mtp;
    int64_t T = p->T;
    double total = 0.0, per_depth = p->m->mtp_loss_scale / (double)mt->depths;
    for (int32_t k = 0; k < mt->depths; k++) {
        const int32_t *tgt = mt->host_targets + k * T;
        float *w = mt->weight + k * T;
        int64_t scored = 0;
        for (int64_t i = 0; i < T; i++) { // the target tgt[i] is the caller's at position i + k + 1 (glm5_pass.h)
            w[i] = tgt[i] >= 0 && (!mask || mask[i + k + 1] > 0.0f) ? 1.0f : 0.0f;
            scored += w[i] > 0.0f;
        }
        double n = norm_tokens > 0.0 ? norm_tokens : (double)scored, sum = 0.0;
        for (int64_t i = 0; i < T && n > 0.0; i++) {
            w[i] = (float)(w[i] * per_depth / n);
            sum -= (double)w[i] * mt->host_lp[k * T + i];
        }
        total += sum;
    }
    p->m->mtp_loss = (float)total;
    if (loss)
        *loss = (float)total;
    return mt->depths;
}

int glm5_mtp_forward(glm5_pass *p, const int32_t *targets, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const glm5_config *c = &m->cfg;
    int32_t D = c->mtp_layers;
    int64_t T = p->T, C = c->hidden_size;
    size_t e = m->elem, f = sizeof(float);
    if (p->cp || p->sp || p->T != p->T_real || m->stage.size > 1)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "glm5: MTP training runs under data and expert parallelism "
                          "only (no tp, pp or cp)");
    struct glm5_mtp *mt;
    glm5_scope(m, "mtp");
    DSARL_TRY(glm5_pass_host_alloc(p, sizeof *mt, (void **)&mt, err));
    mt->depths = D;
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(D * T) * f, (void **)&mt->host_lp, err));
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)(D * T) * f, (void **)&mt->weight, err));
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)T * f, (void **)&mt->host_dlp, err));
    DSARL_TRY(glm5_pass_alloc(p, (size_t)(2 * D * T) * sizeof(int32_t), (void **)&mt->ids, err));
    mt->targets = mt->ids + D * T;
    DSARL_TRY(glm5_pass_alloc(p, (size_t)(D * T) * f, (void **)&mt->logprobs, err));
    DSARL_TRY(per_depth(p, D, &mt->emb, (size_t)(T * C) * e, err));
    DSARL_TRY(per_depth(p, D, &mt->cat, (size_t)(2 * T * C) * e, err));
    DSARL_TRY(per_depth(p, D, &mt->x, (size_t)(T * C) * e, err));
    DSARL_TRY(per_depth(p, D, &mt->out, (size_t)(T * C) * e, err));
    DSARL_TRY(per_depth(p, D, (void ***)&mt->rstd_e, (size_t)T * f, err));
    DSARL_TRY(per_depth(p, D, (void ***)&mt->rstd_h, (size_t)T * f, err));
    DSARL_TRY(per_depth(p, D, (void ***)&mt->rstd_o, (size_t)T * f, err));
    void **bufs[] = {&mt->scratch, &mt->dmain, &mt->dout, &mt->dcarry};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        DSARL_TRY(glm5_pass_alloc(p, (size_t)(T * C) * e, bufs[i], err));
    DSARL_TRY(glm5_pass_alloc(p, (size_t)(2 * T * C) * e, &mt->dcat, err));
    DSARL_TRY(glm5_pass_host_alloc(p, (size_t)D * sizeof(glm5_layer_acts), (void **)&mt->acts, err));
    for (int32_t k = 0; k < D; k++)
        DSARL_TRY(glm5_layer_acts_alloc(p, &mt->acts[k], err));
    DSARL_TRY(upload_shifted(p, mt, targets, err));
    p->mtp = mt;
    for (int32_t k = 0; k < D; k++)
        DSARL_TRY(depth_forward(p, mt, k, err));
    glm5_mtp_weigh(p, NULL, 0.0, NULL); // each depth's own mean until the caller says otherwise
    return DSARL_OK;
}

// d L_mtp / d logprobs of depth k (minus its weights) into its log-prob row.
static int upload_dlogprobs(glm5_pass *p, struct glm5_mtp *mt, int32_t k, dsarl_error *err)
{
    int64_t T = p->T;
    for (int64_t i = 0; i < T; i++)
        mt->host_dlp[i] = -mt->weight[k * T + i];
    return p->m->dev_ops->copy(p->m->dev, mt->logprobs + k * T, mt->host_dlp, (size_t)T * sizeof(float),
                               DSARL_COPY_HOST_TO_DEVICE, err);
}

static int depth_backward(glm5_pass *p, glm5_grad_bufs *g, struct glm5_mtp *mt, int32_t k, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    int64_t T = p->T, C = m->cfg.hidden_size;
    int32_t layer = m->cfg.num_hidden_layers + k;
    const glm5_layer *L = &m->layers[layer];
    // the head: dout = d L_mtp / d h^k (lm_head's gradient accumulates); g's targets and dlogprobs swapped to ours
    glm5_scope(m, "lm_head.bwd");
    DSARL_TRY(upload_dlogprobs(p, mt, k, err));
    int32_t *targets = g->targets;
    float *dlogprobs = g->dlogprobs;
    g->targets = mt->targets + k * T, g->dlogprobs = mt->logprobs + k * T;
    head_swap s = head_begin(p, L, mt->out[k]);
    // the depth's logits again (a chunked head computes its own chunks)
    int rc = p->head_rows >= T ? glm5_head_chunk_logits(p, 0, T, err) : DSARL_OK;
    if (rc == 0)
        rc = glm5_head_backward(p, g, mt->dout, err);
    head_end(p, s);
    g->targets = targets, g->dlogprobs = dlogprobs;
    DSARL_TRY(rc);
    glm5_scope(m, "mtp.bwd");
    if (k + 1 < mt->depths) // h^k also fed depth k + 2
        DSARL_TRY(d->add(m->dev, mt->dout, mt->dout, mt->dcarry, T * C, err));
    // shared_head.norm, then the block from its output's gradient (g->dx) to its input's
    DSARL_TRY(d->rmsnorm_backward(m->dev, g->dx, glm5_grad_of(m, L->head_norm), mt->dout, mt->x[k], L->head_norm,
                                  mt->rstd_o[k], T, C, err));
    DSARL_TRY(glm5_layer_backward(p, g, &mt->acts[k], layer, err));
    // eh_proj over the concatenation, then each half through its norm
    glm5_scope(m, "mtp.bwd");
    DSARL_TRY(glm5_linear_dweight(m, L->eh_proj, g->dx, mt->cat[k], T, 2 * C, C, err));
    DSARL_TRY(glm5_linear_dinput(m, mt->dcat, g->dx, L->eh_proj, T, 2 * C, C, 0.0f, err));
    DSARL_TRY(d->copy_2d(m->dev, mt->dout, C, mt->dcat, 2 * C, T, C, err));
    DSARL_TRY(d->rmsnorm_backward(m->dev, g->dtmp, glm5_grad_of(m, L->enorm), mt->dout, mt->emb[k], L->enorm,
                                  mt->rstd_e[k], T, C, err));
    DSARL_TRY(d->embedding_backward(m->dev, glm5_grad_of(m, depth_embed(m, L)), g->dtmp, mt->ids + k * T, T, C, err));
    DSARL_TRY(d->copy_2d(m->dev, mt->dout, C, glm5_at(m, mt->dcat, C), 2 * C, T, C, err));
    const void *h_prev = k == 0 ? p->h_final : mt->out[k - 1];
    DSARL_TRY(d->rmsnorm_backward(m->dev, g->dtmp, glm5_grad_of(m, L->hnorm), mt->dout, h_prev, L->hnorm,
                                  mt->rstd_h[k], T, C, err));
    if (k == 0)
        return d->add(m->dev, mt->dmain, mt->dmain, g->dtmp, T * C, err);
    return d->copy(m->dev, mt->dcarry, g->dtmp, (size_t)(T * C) * m->elem, DSARL_COPY_DEVICE_TO_DEVICE, err);
}

int glm5_mtp_backward(glm5_pass *p, glm5_grad_bufs *g, dsarl_error *err)
{
    dsarl_model *m = p->m;
    struct glm5_mtp *mt = p->mtp;
    size_t bytes = (size_t)(p->T * m->cfg.hidden_size) * m->elem;
    // the depths use g's residual-stream buffers: h_final's gradient from the LM head waits in dmain meanwhile
    glm5_scope(m, "mtp.bwd");
    DSARL_TRY(m->dev_ops->copy(m->dev, mt->dmain, g->dh, bytes, DSARL_COPY_DEVICE_TO_DEVICE, err));
    for (int32_t k = mt->depths - 1; k >= 0; k--)
        DSARL_TRY(depth_backward(p, g, mt, k, err));
    return m->dev_ops->copy(m->dev, g->dh, mt->dmain, bytes, DSARL_COPY_DEVICE_TO_DEVICE, err);
}
