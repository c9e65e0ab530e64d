/* glm5_head.c: the LM head and its log-softmax over row chunks (policy.logprob_chunk_size), so that a long pass never
 * holds its whole (T, V) float32 logits: at 131072 tokens and GLM-5's vocabulary of 154880 they are 81 GB, and the
 * backward's dlogits as much again. A chunked pass keeps only the final norm's output h_final (T, C) and computes
 * chunk x V logits at a time: once for the log-probs, once more in the backward (a recompute of one GEMM per chunk,
 * 2 T C V FLOPs in all). The lm_head gradient accumulates over chunks; every row's input gradient is written once.
 * Tensor parallelism (vocab-parallel logits) keeps the whole-pass path (glm5_backward.c). */
#include "glm5_pass.h"

int64_t glm5_head_rows(const dsarl_model *m, int64_t T)
{
    if (m->shards.tp_size > 1 || m->logprob_chunk <= 0 || m->logprob_chunk >= T)
        return T;
    return m->logprob_chunk;
}

int glm5_head_chunk_logits(glm5_pass *p, int64_t r0, int64_t n, dsarl_error *err)
{
    dsarl_model *m = p->m;
    int64_t C = m->cfg.hidden_size, V = glm5_local_vocab(m);
    // (n, C) x (V, C)^T -> (n, V) float32, times the batch's logit factor
    return m->dev_ops->gemm_f32out(m->dev, false, true, n, V, C, p->logit_scale, glm5_at(m, p->h_final, r0 * C),
                                   m->lm_head, 0.0f, p->logits, err);
}

int glm5_head_logprobs(glm5_pass *p, float *logprobs, const int32_t *targets, dsarl_error *err)
{
    dsarl_model *m = p->m;
    int64_t T = p->T, V = m->cfg.vocab_size;
    glm5_scope(m, "lm_head");
    if (p->head_rows >= T) // the pass computed every row's logits already (glm5_pass_forward)
        return m->dev_ops->logprobs_forward(m->dev, logprobs, p->logits, targets, T, V, err);
    for (int64_t r0 = 0; r0 < T; r0 += p->head_rows) {
        int64_t n = T - r0 < p->head_rows ? T - r0 : p->head_rows;
        DSARL_TRY(glm5_head_chunk_logits(p, r0, n, err));
        DSARL_TRY(m->dev_ops->logprobs_forward(m->dev, logprobs + r0, p->logits, targets + r0, n, V, err));
    }
    return DSARL_OK;
}

int glm5_head_backward(glm5_pass *p, glm5_grad_bufs *g, void *dh, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    int64_t T = p->T, C = m->cfg.hidden_size, V = glm5_local_vocab(m), rows = p->head_rows;
    glm5_scope(m, "lm_head.bwd");
    for (int64_t r0 = 0; r0 < T; r0 += rows) {
        int64_t n = T - r0 < rows ? T - r0 : rows;
        if (rows < T) // chunked: this chunk's logits again (the forward's were overwritten by the next chunk)
            DSARL_TRY(glm5_head_chunk_logits(p, r0, n, err));
        // dlogits (n, V) float32 from dlogprobs and the logits of rows [r0, r0 + n)
        DSARL_TRY(d->logprobs_backward(m->dev, g->dlogits, g->dlogprobs + r0, p->logits, g->targets + r0, n, V, err));
        if (p->logit_scale != 1.0f) // logits = scale * h W^T: the factor carries into dlogits of the product
            DSARL_TRY(d->convert(m->dev, g->dlogits, DSARL_DTYPE_F32, g->dlogits, DSARL_DTYPE_F32, n * V,
                                 p->logit_scale, err));
        int rc = 0;
        const void *dlogits = glm5_storage_operand(m, g->dlogits, g->dlogits_s, n * V, err, &rc);
        DSARL_TRY(rc);
        const void *h = glm5_at(m, p->h_final, r0 * C);
        DSARL_TRY(glm5_linear_dweight(m, m->lm_head, dlogits, h, n, C, V, err));
        DSARL_TRY(glm5_linear_dinput(m, glm5_at(m, dh, r0 * C), dlogits, m->lm_head, n, C, V, 0.0f, err));
    }
    return DSARL_OK;
}
