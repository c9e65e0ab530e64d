/* glm5_heads.c: the per-head products of the attention (W_UK into the latent, W_UV out of it, their backward) as
 * one batched GEMM over heads instead of a loop of H copies and GEMMs.
 *
 * A batched GEMM wants each head's operand as a matrix with its own leading dimension, so the token-major tensors
 * (T, H, d) are moved to head-major (H, T, d) and back by gather_rows. The gather's rows are "units" of u elements,
 * u the gcd of every head width, so one gather moves (or assembles from two parts) a whole tensor: unit i of the
 * output is unit map[i] of the source. The maps depend only on T and the config: the model keeps them for the last
 * T, built and uploaded in one copy before a pass's first layer when T changes (a host-to-device copy waits for
 * queued work on the GPU). */
#include <stdlib.h>
#include "glm5_pass.h"

// Where one slice of every (token, head) pair lies in a source, in units: base + t*token_stride + h*head_stride.
typedef struct head_slice {
    int64_t base, token_stride, head_stride, width;
} head_slice;

// Each map: its output is head-major (h, t) or token-major (t, h); each pair's slices are laid out one after another.
typedef struct map_plan {
    bool head_major;
    int n_slices;
    head_slice slices[2];
} map_plan;

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        int64_t r = a % b;
        a = b, b = r;
    }
    return a;
}

int64_t glm5_head_unit(const glm5_config *c)
{
    return gcd64(gcd64(c->qk_nope_head_dim, c->qk_rope_head_dim), gcd64(c->kv_lora_rank, c->v_head_dim));
}

// Source layouts in units: token-major (T, H, W) at column off; head-major (H, T, W); one row (T, W) for all heads.
static head_slice token_major(int64_t H, int64_t W, int64_t off, int64_t width, int64_t base)
{
    return (head_slice){base + off, H * W, W, width};
}

static head_slice head_major(int64_t T, int64_t W, int64_t base)
{
    return (head_slice){base, W, T * W, W};
}

static head_slice broadcast(int64_t W, int64_t off, int64_t width, int64_t base)
{
    return (head_slice){base + off, W, 0, width};
}

// The plans of every map over H heads (this rank's), in units (see glm5_head_map in glm5_pass.h for what each moves).
static void plans(const glm5_config *c, int64_t T, int64_t H, int64_t u, map_plan *out)
{
    int64_t nope = c->qk_nope_head_dim / u, rope = c->qk_rope_head_dim / u;
    int64_t kvr = c->kv_lora_rank / u, v = c->v_head_dim / u, qk = nope + rope, dqk = kvr + rope, nv = nope + v;
    out[GLM5_MAP_Q_NOPE_HM] = (map_plan){true, 1, {token_major(H, qk, 0, nope, 0)}};
    out[GLM5_MAP_Q_ABS] = (map_plan){false, 2, {head_major(T, kvr, 0), token_major(H, rope, 0, rope, H * T * kvr)}};
    out[GLM5_MAP_LATENT_HM] = (map_plan){true, 1, {token_major(H, kvr, 0, kvr, 0)}};
    out[GLM5_MAP_LATENT_TM] = (map_plan){false, 1, {head_major(T, kvr, 0)}};
    out[GLM5_MAP_V_HM] = (map_plan){true, 1, {token_major(H, v, 0, v, 0)}};
    out[GLM5_MAP_V_TM] = (map_plan){false, 1, {head_major(T, v, 0)}};
    out[GLM5_MAP_DQ_ABS_HM] = (map_plan){true, 1, {token_major(H, dqk, 0, kvr, 0)}};
    out[GLM5_MAP_DQ] = (map_plan){false, 2, {head_major(T, nope, 0), token_major(H, rope, 0, rope, H * T * nope)}};
    out[GLM5_MAP_K_HEADS] = (map_plan){false, 2, {token_major(H, nv, 0, nope, 0), broadcast(rope, 0, rope,
                                                                                            T * H * nv)}};
}

static int64_t map_units(const map_plan *pl, int64_t T, int64_t H)
{
    int64_t w = 0;
    for (int s = 0; s < pl->n_slices; s++)
        w += pl->slices[s].width;
    return T * H * w;
}

static void fill_map(const map_plan *pl, int64_t T, int64_t H, int32_t *out)
{
    int64_t i = 0;
    for (int64_t outer = 0; outer < (pl->head_major ? H : T); outer++)
        for (int64_t inner = 0; inner < (pl->head_major ? T : H); inner++) {
            int64_t t = pl->head_major ? inner : outer, h = pl->head_major ? outer : inner;
            for (int s = 0; s < pl->n_slices; s++) {
                const head_slice *sl = &pl->slices[s];
                for (int64_t j = 0; j < sl->width; j++)
                    out[i++] = (int32_t)(sl->base + t * sl->token_stride + h * sl->head_stride + j);
            }
        }
}

// Every map for one token count, in one device block (kept by the model: the maps depend only on T and the config,
// and a training step's passes, or a run of decode steps, share T).
struct glm5_head_maps {
    int64_t T;
    int32_t *dev;
    int64_t at[GLM5_MAP_COUNT];
};

void glm5_head_maps_free(dsarl_model *m)
{
    if (!m->head_maps)
        return;
    m->dev_ops->free(m->dev, m->head_maps->dev);
    free(m->head_maps);
    m->head_maps = NULL;
}

// Builds every map for T tokens and uploads them in one copy (a host-to-device copy waits for the device).
static int build_maps(dsarl_model *m, int64_t T, dsarl_error *err)
{
    const glm5_config *c = &m->cfg;
    int64_t H = glm5_local_heads(m), u = glm5_head_unit(c);
    // sources are at most (T, H, kv_lora + v + nope + rope) plus a rope part: every unit index fits when this does
    int64_t widest = c->kv_lora_rank + c->qk_nope_head_dim + c->qk_rope_head_dim + c->v_head_dim;
    if (T * H * (widest + c->qk_rope_head_dim) / u > INT32_MAX)
        return DSARL_FAIL(err, DSARL_E_UNSUPPORTED, "glm5: %lld tokens x %lld heads is too large for the int32 rows "
                          "of the head-layout gathers", (long long)T, (long long)H);
    map_plan pl[GLM5_MAP_COUNT];
    plans(c, T, H, u, pl);
    struct glm5_head_maps *hm = calloc(1, sizeof *hm);
    if (!hm)
        return DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of host memory for the head-layout maps");
    int64_t total = 0;
    for (int k = 0; k < GLM5_MAP_COUNT; k++)
        hm->at[k] = total, total += map_units(&pl[k], T, H);
    int32_t *host = malloc((size_t)total * sizeof(int32_t));
    int rc = host ? DSARL_OK : DSARL_FAIL(err, DSARL_E_NOMEM, "glm5: out of host memory for the head-layout maps");
    for (int k = 0; rc == 0 && k < GLM5_MAP_COUNT; k++)
        fill_map(&pl[k], T, H, host + hm->at[k]);
    if (rc == 0)
        rc = m->dev_ops->alloc(m->dev, (size_t)total * sizeof(int32_t), (void **)&hm->dev, err);
    if (rc == 0)
        rc = m->dev_ops->copy(m->dev, hm->dev, host, (size_t)total * sizeof(int32_t), DSARL_COPY_HOST_TO_DEVICE, err);
    free(host);
    if (rc) {
        if (hm->dev)
            m->dev_ops->free(m->dev, hm->dev);
        free(hm);
        return rc;
    }
    glm5_head_maps_free(m);
    hm->T = T;
    m->head_maps = hm;
    return DSARL_OK;
}

int glm5_head_maps_prepare(glm5_pass *p, dsarl_error *err)
{
    dsarl_model *m = p->m;
    if (!m->head_maps || m->head_maps->T != p->T)
        DSARL_TRY(build_maps(m, p->T, err));
    for (int k = 0; k < GLM5_MAP_COUNT; k++)
        p->head_maps[k] = m->head_maps->dev + m->head_maps->at[k];
    return DSARL_OK;
}

int glm5_head_gather(glm5_pass *p, glm5_head_map k, void *out, const void *src, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const glm5_config *c = &m->cfg;
    if (!p->head_maps[k])
        return DSARL_FAIL(err, DSARL_E_INVALID, "glm5: head-layout map %d was not prepared for this pass", (int)k);
    if (p->staged) // a pipeline stage keeps several passes in flight: another one's token count may have rebuilt them
        DSARL_TRY(glm5_head_maps_prepare(p, err));
    int64_t u = glm5_head_unit(c);
    map_plan pl[GLM5_MAP_COUNT];
    plans(c, p->T, glm5_local_heads(m), u, pl);
    return m->dev_ops->gather_rows(m->dev, out, src, p->head_maps[k], map_units(&pl[k], p->T, glm5_local_heads(m)),
                                   u, err);
}

int glm5_absorb_queries(glm5_pass *p, const glm5_layer *L, const void *q, void *q_abs, void *stage_in,
                        void *stage_out, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const dsarl_device_ops *d = m->dev_ops;
    const glm5_config *c = &m->cfg;
    int64_t T = p->T, H = glm5_local_heads(m), nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    int64_t qk = c->qk_head_dim, kvr = c->kv_lora_rank, v = c->v_head_dim;
    // stage_in (H, T, nope) = q_nope; stage_out (H, T, kv_lora) = q_nope_h W_UK_h, W_UK_h the first nope rows of
    // head h in kv_b_proj (nope, kv_lora); then the rope parts (T, H, rope) after it, the second source of q_abs
    DSARL_TRY(glm5_head_gather(p, GLM5_MAP_Q_NOPE_HM, stage_in, q, err));
    DSARL_TRY(d->gemm_strided_batched(m->dev, false, false, T, kvr, nope, 1.0f, stage_in, T * nope, L->kv_b_proj,
                                      (nope + v) * kvr, 0.0f, stage_out, T * kvr, H, err));
    DSARL_TRY(d->copy_2d(m->dev, glm5_at(m, stage_out, H * T * kvr), rope, glm5_at(m, q, nope), qk, T * H, rope, err));
    return glm5_head_gather(p, GLM5_MAP_Q_ABS, q_abs, stage_out, err);
}

int glm5_values_from_latent(glm5_pass *p, const glm5_layer *L, const void *out_latent, void *attn, void *stage_in,
                            void *stage_out, dsarl_error *err)
{
    dsarl_model *m = p->m;
    const glm5_config *c = &m->cfg;
    int64_t T = p->T, H = glm5_local_heads(m), nope = c->qk_nope_head_dim;
    int64_t kvr = c->kv_lora_rank, v = c->v_head_dim;
    // (H, T, kv_lora) latent outputs times W_UV_h^T, W_UV_h the last v rows of head h in kv_b_proj (v, kv_lora)
    DSARL_TRY(glm5_head_gather(p, GLM5_MAP_LATENT_HM, stage_in, out_latent, err));
    DSARL_TRY(m->dev_ops->gemm_strided_batched(m->dev, false, true, T, v, kvr, 1.0f, stage_in, T * kvr,
                                               glm5_at(m, L->kv_b_proj, nope * kvr), (nope + v) * kvr, 0.0f,
                                               stage_out, T * v, H, err));
    return glm5_head_gather(p, GLM5_MAP_V_TM, attn, stage_out, err);
}
