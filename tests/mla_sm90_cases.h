/* mla_sm90_cases.h: the cases the two sm_90 sparse MLA suites share (check_dsa_mla_sm90 forward,
 * check_dsa_mla_bwd_sm90 backward, which defines MLA_CASE_BACKWARD first for its dO, dQ, dKV buffers): one case is
 * a batch at GLM-5 dims (D_QK, D_V), bf16-rounded random q and kv, index rows and their device copies; packed
 * causal THD batches with ragged sequences and holes, and decode-style windows into a longer key array. Draws come
 * from the suite's `stream` in a fixed order, so a seed gives each suite the same inputs as before the header.
 * Included after the suite's `gpu`, `stream`, D_QK and D_V. */
#ifndef DSARL_TEST_MLA_SM90_CASES_H
#define DSARL_TEST_MLA_SM90_CASES_H

/* --- one case: a batch, inputs, indices ------------------------------------------------------------------- */

typedef struct mla_case {
    int64_t Tq, Tk;
    int H;
    int32_t topk;
    int32_t *start, *end, *idx;     /* host (Tq), (Tq), (Tq, topk) */
    float *q, *kv;                  /* host, bf16-rounded */
    dsarl_dsa_batch hbatch, dbatch; /* host / device ranges */
    dsarl_dsa_attention_inputs hin, din;
    int32_t *g_idx;
    void *g_out;                    /* (Tq, H, d_v) bf16: the forward's output, input of the backward */
    float *g_lse;                   /* (Tq, H) */
#ifdef MLA_CASE_BACKWARD
    float *out, *lse, *dout;        /* host copies (out and dout bf16-rounded) */
    void *g_dout, *g_dq, *g_dkv;    /* (Tq, H, d_v), (Tq, H, d_qk), (Tk, d_qk) bf16 */
    float *g_acc;                   /* (Tk, d_qk) fp32 key-gradient accumulator for direct kernel calls */
#endif
} mla_case;

static void case_inputs(mla_case *c)
{
    int32_t max = 0;
    for (int64_t t = 0; t < c->Tq; t++)
        max = c->end[t] - c->start[t] > max ? c->end[t] - c->start[t] : max;
    c->hbatch = (dsarl_dsa_batch){.struct_size = sizeof(dsarl_dsa_batch), .n_queries = c->Tq, .n_keys = c->Tk,
                                  .key_start = c->start, .key_end = c->end, .max_keys_per_query = max};
    c->dbatch = c->hbatch;
    c->dbatch.key_start = to_gpu_i32(gpu, c->start, c->Tq);
    c->dbatch.key_end = to_gpu_i32(gpu, c->end, c->Tq);
    c->q = rand_bf16(&stream, c->Tq * c->H * D_QK, 1.0f);
    c->kv = rand_bf16(&stream, c->Tk * D_QK, 1.0f);
    /* scale 1/16 as GLM-5 (1/sqrt(256)) times 4 so that the softmax is far from uniform */
    c->hin = (dsarl_dsa_attention_inputs){.struct_size = sizeof(c->hin), .q = c->q, .kv = c->kv, .n_heads = c->H,
                                          .d_qk = D_QK, .d_v = D_V, .softmax_scale = 0.25f};
    c->din = c->hin;
    c->din.q = to_gpu_bf16(gpu, c->q, c->Tq * c->H * D_QK);
    c->din.kv = to_gpu_bf16(gpu, c->kv, c->Tk * D_QK);
    c->g_idx = to_gpu_i32(gpu, c->idx, c->Tq * c->topk);
    c->g_out = dev_alloc(gpu, (size_t)(c->Tq * c->H * D_V) * 2);
    c->g_lse = dev_alloc(gpu, (size_t)(c->Tq * c->H) * 4);
#ifdef MLA_CASE_BACKWARD
    c->dout = rand_bf16(&stream, c->Tq * c->H * D_V, 1.0f);
    c->g_dout = to_gpu_bf16(gpu, c->dout, c->Tq * c->H * D_V);
    c->g_dq = dev_alloc(gpu, (size_t)(c->Tq * c->H * D_QK) * 2);
    c->g_dkv = dev_alloc(gpu, (size_t)(c->Tk * D_QK) * 2);
    c->g_acc = dev_alloc(gpu, (size_t)(c->Tk * D_QK) * 4);
    c->out = c->lse = NULL;
#endif
}

static void case_free(mla_case *c)
{
    cuda_free(gpu, (void *)c->dbatch.key_start), cuda_free(gpu, (void *)c->dbatch.key_end);
    cuda_free(gpu, (void *)c->din.q), cuda_free(gpu, (void *)c->din.kv), cuda_free(gpu, c->g_idx);
    cuda_free(gpu, c->g_out), cuda_free(gpu, c->g_lse);
    free(c->start), free(c->end), free(c->idx), free(c->q), free(c->kv);
#ifdef MLA_CASE_BACKWARD
    cuda_free(gpu, c->g_dout), cuda_free(gpu, c->g_dq), cuda_free(gpu, c->g_dkv), cuda_free(gpu, c->g_acc);
    free(c->out), free(c->lse), free(c->dout);
#endif
}

// Causal packed THD with ragged sequences; row t gets min(eligible, topk) keys minus ~10% holes, unsorted, and
// with repeats every seventh row also repeats some of its keys in other slots.
static void case_packed_rows(mla_case *c, const int32_t *lengths, int n_seq, int H, int32_t topk, int repeats)
{
    int64_t T = 0;
    for (int i = 0; i < n_seq; i++)
        T += lengths[i];
    c->Tq = c->Tk = T, c->H = H, c->topk = topk;
    c->start = malloc((size_t)T * 4), c->end = malloc((size_t)T * 4), c->idx = malloc((size_t)(T * topk) * 4);
    int32_t off = 0;
    for (int i = 0; i < n_seq; i++) {
        for (int32_t j = 0; j < lengths[i]; j++) {
            int64_t t = off + j;
            c->start[t] = off, c->end[t] = off + j + 1;
            int32_t eligible = j + 1, want = eligible < topk ? eligible : topk;
            if (want > 4)
                want -= rng_below(&stream, want / 10 + 1);
            fill_index_row(&stream, c->idx + t * topk, topk, c->start[t], c->end[t], want, repeats && t % 7 == 3);
        }
        off += lengths[i];
    }
    fill_index_row(&stream, c->idx + (T - 1) * topk, topk, 0, 0, 0, 0); /* the last row has no valid slot */
    case_inputs(c);
}

static void case_packed(mla_case *c, const int32_t *lengths, int n_seq, int H, int32_t topk)
{
    case_packed_rows(c, lengths, n_seq, H, topk, 1);
}

// Decode-style: every query sees a random window of a longer key array; one window empty, one row with 3 keys.
static void case_decode(mla_case *c, int64_t Tq, int64_t Tk, int H, int32_t topk)
{
    c->Tq = Tq, c->Tk = Tk, c->H = H, c->topk = topk;
    c->start = malloc((size_t)Tq * 4), c->end = malloc((size_t)Tq * 4), c->idx = malloc((size_t)(Tq * topk) * 4);
    for (int64_t t = 0; t < Tq; t++) {
        int32_t a = rng_below(&stream, (int32_t)Tk), b = rng_below(&stream, (int32_t)Tk);
        c->start[t] = a < b ? a : b, c->end[t] = (a < b ? b : a) + 1;
        if (t == Tq / 2)
            c->end[t] = c->start[t];
        int32_t n = c->end[t] - c->start[t];
        int32_t want = t == 1 ? 3 : (n < topk ? n : topk) - rng_below(&stream, topk / 8 + 1);
        fill_index_row(&stream, c->idx + t * topk, topk, c->start[t], c->end[t], want > 0 ? want : 0, t % 5 == 2);
    }
    case_inputs(c);
}


// `dsarl bench dsa`'s index pattern: every query selects topk distinct keys spread over all Tk (i * 2654435761 +
// t * 40503 mod Tk, distinct when Tk is a power of two), the ranges [0, Tk).
static void case_spread(mla_case *c, int64_t Tq, int64_t Tk, int H, int32_t topk)
{
    *c = (mla_case){.Tq = Tq, .Tk = Tk, .H = H, .topk = topk};
    c->start = malloc((size_t)Tq * 4), c->end = malloc((size_t)Tq * 4), c->idx = malloc((size_t)(Tq * topk) * 4);
    for (int64_t t = 0; t < Tq; t++) {
        c->start[t] = 0, c->end[t] = (int32_t)Tk;
        for (int32_t i = 0; i < topk; i++)
            c->idx[t * topk + i] = (int32_t)(((int64_t)i * 2654435761ll + t * 40503ll) % Tk);
    }
    case_inputs(c);
}

/* --- query groups: the cases both suites run at 8, 16 and 32 heads ----------------------------------------- */

/* Query groups (64 / H queries per block over the union of their keys) at 8, 16 and 32 heads, each case through
 * check: ragged packs whose sequences and last group end inside a group, rows with repeated keys (their groups take
 * the slot-order list) and without, decode-style windows that barely overlap, topk 64 to 2048. */
static void query_group_cases(void (*check)(mla_case *c, const char *what))
{
    mla_case c;
    const int32_t lengths[] = {1, 17, 64, 90, 5};
    case_packed(&c, lengths, 5, 16, 64);
    check(&c, "groups: pack 1/17/64/90/5 H16 k64");
    case_free(&c);
    const int32_t lengths2[] = {33, 120, 2};
    case_packed(&c, lengths2, 3, 32, 100);
    check(&c, "groups: pack 33/120/2 H32 k100");
    case_free(&c);
    const int32_t lengths3[] = {41, 90, 3};
    case_packed_rows(&c, lengths3, 3, 8, 256, 0);
    check(&c, "groups: pack 41/90/3 H8 k256 (no repeats)");
    case_free(&c);
    case_packed(&c, lengths3, 3, 8, 256);
    check(&c, "groups: pack 41/90/3 H8 k256");
    case_free(&c);
    const int32_t one[] = {300};
    case_packed_rows(&c, one, 1, 16, 256, 0);
    check(&c, "groups: causal T300 H16 k256 (no repeats)");
    case_free(&c);
    case_decode(&c, 21, 3000, 16, 2048);
    check(&c, "groups: decode Tq21 Tk3000 H16 k2048");
    case_free(&c);
    case_decode(&c, 13, 2600, 8, 2048);
    check(&c, "groups: decode Tq13 Tk2600 H8 k2048");
    case_free(&c);
}

#endif /* DSARL_TEST_MLA_SM90_CASES_H */
