// rase/kernels/_mix_attention.h: the attention mixer, h -> o: Q/K/V projections (a gated
// attention's queries with their gates), QK-norms, RoPE, K/V into the pool, attention over the
// row's own sequence (_attention.h), the output projection.
#ifndef RASE_MIX_ATTENTION_H
#define RASE_MIX_ATTENTION_H

#include "_mix.h"

// per (row, head): QK-norm, RoPE (and Gemma's q prescale); K and V go to the row's pool slot.
// Items (row, K heads then Q heads) dealt round-robin: a K head costs more (its K/V stores),
// so leading with them spreads them over the threads.
static void rase_qk_rope_store(rase_model *m, const rase_layer *L, int il, const rase_batch *b, int ith,
                               int nth) {
    const rase_hparams *hp = &m->w->hp;
    rase_scratch *s = m->s;
    const int hd = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv, T = b->n;
    const int64_t nq = (int64_t)nh * hd, nk = (int64_t)nkv * hd, half_rot = hp->n_rot / 2;
    const float *rope = L->rope_slot < 0 ? NULL : s->rope + (size_t)L->rope_slot * s->max_rows * half_rot * 2;
    for (int64_t w = ith; w < (int64_t)T * (nh + nkv); w += nth) {
        const int t = (int)(w / (nh + nkv)), hh = (int)(w % (nh + nkv));
        const float *cs = rope ? rope + (size_t)t * half_rot * 2 : NULL;
        if (hh >= nkv) {
            float *qh = s->q + t * nq + (int64_t)(hh - nkv) * hd;
            if (L->q_norm && !L->qk_norm_full) rase_rmsnorm(qh, L->q_norm, qh, hd, hp->eps);
            if (cs) rase_rope(qh, cs, hp->n_rot, hp->rope_neox, m->isa);
            if (hp->attn_prescale)
                for (int i = 0; i < hd; ++i) qh[i] *= hp->attn_scale;
            if (m->kv->rot_k) rase_fwht_rows(qh, hd, m->kv->rot_k);
        } else {
            const rase_entry e = b->rows[t];
            float *khd = s->k + t * nk + (int64_t)hh * hd;
            const float *vh = s->v + t * nk + (int64_t)hh * hd;
            if (L->k_norm && !L->qk_norm_full) rase_rmsnorm(khd, L->k_norm, khd, hd, hp->eps);
            if (cs) rase_rope(khd, cs, hp->n_rot, hp->rope_neox, m->isa);
            if (!hp->causal) continue;  // an encoder attends to the step's own f32 K/V (rase_attend_f32)
            if (m->kv->rot_k) rase_fwht_rows(khd, hd, m->kv->rot_k);
            if (m->kv->rot_v) rase_fwht_rows(s->v + t * nk + (int64_t)hh * hd, hd, m->kv->rot_v);
            const int64_t slot = rase_kv_at(m->kv, L->kv_layer, hh, b->tables[e.seq * b->table_stride + e.pos / RASE_KV_BLOCK],
                                            e.pos % RASE_KV_BLOCK);
            rase_kv_store_row(m->kv->type, khd, m->kv->k + slot, hd, m->isa);
            rase_kv_store_row(m->kv->type, vh, m->kv->v + slot, hd, m->isa);
        }
    }
}

// the view of row t's sequence for layer il and KV head kh, and its keys [*j0, *j1)
static rase_kv_view rase_row_view(const rase_model *m, const rase_layer *L, int il, const rase_batch *b, int t,
                                  int kh, int *j0, int *j1) {
    const rase_kv_pool *kv = m->kv;
    const rase_entry e = b->rows[t];
    *j0 = L->window > 0 && e.pos - L->window + 1 > 0 ? e.pos - L->window + 1 : 0;
    *j1 = b->key_end ? b->key_end[t] : e.pos + 1;
    const int64_t koff = rase_kv_at(kv, L->kv_layer, kh, 0, 0);
    const rase_kv_view view = {kv->k + koff, kv->v + koff, b->tables + e.seq * b->table_stride,
                               (int64_t)RASE_KV_BLOCK * kv->row_elems, kv->row_elems, kv->type};
    return view;
}

// query heads h0 .. h0 + g - 1 of row t: their q rows and attention outputs
static void rase_head_rows(const rase_model *m, int t, int h0, int g, const float **qs, float **outs) {
    const int64_t hd = m->w->hp.head_dim, nq = (int64_t)m->w->hp.n_head * hd;
    for (int i = 0; i < g; ++i) {
        qs[i] = m->s->q + t * nq + (h0 + i) * hd;
        outs[i] = m->s->att + t * nq + (h0 + i) * hd;
    }
}

// queries h0 .. h0 + g - 1 (g <= RASE_ATTN_G, one KV head) of row t, served together
static void rase_attend_heads(rase_model *m, const rase_layer *L, int il, const rase_batch *b, int t, int h0, int g,
                              int ith) {
    const rase_hparams *hp = &m->w->hp;
    rase_scratch *s = m->s;
    const int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    int j0, j1;
    const rase_kv_view view = rase_row_view(m, L, il, b, t, h0 / group, &j0, &j1);
    const float *qs[RASE_ATTN_G];
    float *outs[RASE_ATTN_G];
    rase_head_rows(m, t, h0, g, qs, outs);
    rase_attend(g, qs, &view, j0, j1, hd, hp->attn_prescale ? 1.0f : hp->attn_scale, hp->attn_softcap,
                L->sinks ? L->sinks + h0 : NULL, s->scores + (size_t)ith * RASE_ATTN_G * s->attn_stride, s->attn_stride, outs, m->isa);
    if (m->kv->rot_v)
        for (int i = 0; i < g; ++i) rase_fwht_rows(outs[i], hd, m->kv->rot_v);
}

#define RASE_ATTN_SPLIT_MIN 512  // keys from which decode splits a KV head's group over threads

// Decode with few (row, KV head) items and a long context: items (row, KV head, up to
// RASE_ATTN_G of its query heads) cut into I * nth equal units, thread ith taking units
// [ith I, (ith + 1) I), so every thread reads 1 / nth of the K/V. An item a thread holds whole
// is one rase_attend; an item shared by threads is split with its bits (rase_attend_split):
// each takes its share of the keys, then, past a barrier, of the 32 P.V slots (a contiguous
// part of every K/V block), then of the head's elements. The shared scores and partial sums of
// an item live in the slot of the first thread that holds it. Returns 0 when the
// step does not qualify (the caller's split by query heads then serves it).
static int rase_attention_split(rase_model *m, const rase_layer *L, int il, const rase_batch *b, int ith, int nth) {
    const rase_hparams *hp = &m->w->hp;
    rase_scratch *s = m->s;
    const int hd = hp->head_dim, nkv = hp->n_head_kv, group = hp->n_head / nkv;
    const int nsub = (group + RASE_ATTN_G - 1) / RASE_ATTN_G;
    const int64_t I = (int64_t)b->n * nkv * nsub;
    int longest = 0;
    for (int t = 0; t < b->n; ++t) {
        int j0, j1;
        rase_row_view(m, L, il, b, t, 0, &j0, &j1);
        if (j1 - j0 > longest) longest = j1 - j0;
    }
    if (nth < 2 || longest < RASE_ATTN_SPLIT_MIN || !rase_attend_splits(hd, m->isa) || m->kv->type != RASE_TYPE_F16) return 0;
    const float scale = hp->attn_prescale ? 1.0f : hp->attn_scale;
    float *own = s->scores + (size_t)ith * RASE_ATTN_G * s->attn_stride;
    for (int phase = 0; phase < 3; ++phase) {
        for (int64_t it = ith * I / nth; it < I && it * nth < (ith + 1) * I; ++it) {
            const int64_t lo = (ith * I > it * nth ? ith * I : it * nth) - it * nth;
            const int64_t hi = ((ith + 1) * I < (it + 1) * nth ? (ith + 1) * I : (it + 1) * nth) - it * nth;
            const int t = (int)(it / (nkv * nsub)), kh = (int)(it / nsub % nkv), h0 = kh * group + (int)(it % nsub) * RASE_ATTN_G;
            const int g = group - (h0 - kh * group) < RASE_ATTN_G ? group - (h0 - kh * group) : RASE_ATTN_G;
            if (lo == 0 && hi == nth) {
                if (phase == 0) rase_attend_heads(m, L, il, b, t, h0, g, ith);
                continue;
            }
            int j0, j1;
            const rase_kv_view view = rase_row_view(m, L, il, b, t, kh, &j0, &j1);
            const float *qs[RASE_ATTN_G];
            float *outs[RASE_ATTN_G];
            rase_head_rows(m, t, h0, g, qs, outs);
            const int64_t first = it * nth / I;  // the first thread that holds this item
            rase_attend_split(phase, g, qs, &view, j0, j1, hd, scale, hp->attn_softcap, L->sinks ? L->sinks + h0 : NULL,
                              (int)lo, (int)hi, nth,
                              s->shared + (size_t)first * RASE_ATTN_G * s->attn_stride, own, s->attn_stride, outs, m->isa);
        }
        if (phase < 2) rase_barrier_wait(&m->barrier);
    }
    return 1;
}

// Attention; each query is computed by the same operations however the queries are grouped.
// Enough rows to keep every thread busy: items (row, KV head) dealt round-robin (rows attend to
// different lengths, so contiguous ranges would leave threads idle), each serving its group in
// calls of up to RASE_ATTN_G. Fewer (decode): long contexts split the K/V reads evenly
// (rase_attention_split); short ones split the (row, query head) pairs into equal contiguous
// shares, consecutive heads of one KV head served together (each K/V row read once per call,
// not once per head). A row reads its own sequence's positions [j0, pos]: the rows of its own
// chunk were stored before the barrier that precedes this.
static void rase_attention(rase_model *m, const rase_layer *L, int il, const rase_batch *b, int ith, int nth) {
    const rase_hparams *hp = &m->w->hp;
    const int nh = hp->n_head, group = hp->n_head / hp->n_head_kv;
    if (!hp->causal) {  // an encoder: (row, head) items round-robin, over the sequence's rows in this step
        const int hd = hp->head_dim;
        const int64_t nq = (int64_t)nh * hd, nk = (int64_t)hp->n_head_kv * hd;
        float *scores = m->s->scores + (size_t)ith * RASE_ATTN_G * m->s->attn_stride;
        for (int64_t w = ith; w < (int64_t)b->n * nh; w += nth) {
            const int t = (int)(w / nh), h = (int)(w % nh), seq = b->rows[t].seq;
            const int64_t first = (int64_t)b->seq_first[seq] * nk + (int64_t)(h / group) * hd;
            rase_attend_f32(m->s->q + t * nq + (int64_t)h * hd, m->s->k + first, m->s->v + first, nk, b->seq_len[seq],
                            hd, hp->attn_prescale ? 1.0f : hp->attn_scale, scores, m->s->att + t * nq + (int64_t)h * hd,
                            m->isa);
        }
        return;
    }
    if ((int64_t)b->n * hp->n_head_kv >= 4 * nth) {
        for (int64_t w = ith; w < (int64_t)b->n * hp->n_head_kv; w += nth)
            for (int i = 0; i < group; i += RASE_ATTN_G) {
                const int h0 = (int)(w % hp->n_head_kv) * group + i;
                rase_attend_heads(m, L, il, b, (int)(w / hp->n_head_kv), h0, group - i < RASE_ATTN_G ? group - i : RASE_ATTN_G, ith);
            }
        return;
    }
    if (rase_attention_split(m, L, il, b, ith, nth)) return;
    int64_t lo, hi;
    rase_split((int64_t)b->n * nh, ith, nth, &lo, &hi);
    for (int64_t w = lo; w < hi;) {
        const int h = (int)(w % nh), end = (h / group + 1) * group;  // the KV head's last query + 1
        int g = end - h < RASE_ATTN_G ? end - h : RASE_ATTN_G;
        if (g > hi - w) g = (int)(hi - w);
        rase_attend_heads(m, L, il, b, (int)(w / nh), h, g, ith);
        w += g;
    }
}

// the attention block, h -> o: 2.-5. below
static void rase_attention_block(rase_model *m, const rase_layer *L, int il, const rase_batch *b, int ith, int nth) {
    rase_scratch *s = m->s;
    const int T = b->n;
    int64_t lo, hi;
    rase_split(T, ith, nth, &lo, &hi);
    // 2. Q, K, V projections share the normed input (plus their biases); a gated attention's
    //    (Qwen3.5) Q rows hold each head's query then its gate: queries to q, gates stay in mix
    const int64_t nq = (int64_t)m->w->hp.n_head * m->w->hp.head_dim;
    {
        RASE_PROF_START(m, ith);
        const rase_mat *qkv[3] = {&L->wq, &L->wk, &L->wv};
        float *out[3] = {m->w->hp.attn_gate ? s->mix : s->q, s->k, s->v};
        const float *bias[3] = {L->bq, L->bk, L->bv};
        rase_matmuls(m, 3, qkv, s->h, out, T, RASE_EPI_NONE, bias, ith, nth);
        rase_sync(m, ith);
        RASE_PROF_ADD(m, ith, prof_matmul_ns);
    }
    if (m->w->hp.attn_gate) {
        const int hd = m->w->hp.head_dim;
        for (int64_t t = lo; t < hi; ++t)
            for (int h = 0; h < m->w->hp.n_head; ++h)
                memcpy(s->q + t * nq + (int64_t)h * hd, s->mix + t * s->mix_stride + (int64_t)h * 2 * hd, hd * sizeof(float));
        rase_sync(m, ith);
    }
    // 3. (full-width QK-norm), QK-norm per head, RoPE, K/V to the pool; 4. attention
    if (L->qk_norm_full) {
        const int64_t nq = (int64_t)m->w->hp.n_head * m->w->hp.head_dim, nk = (int64_t)m->w->hp.n_head_kv * m->w->hp.head_dim;
        for (int64_t t = lo; t < hi; ++t) {
            rase_rmsnorm(s->q + t * nq, L->q_norm, s->q + t * nq, nq, m->w->hp.eps);
            rase_rmsnorm(s->k + t * nk, L->k_norm, s->k + t * nk, nk, m->w->hp.eps);
        }
        rase_sync(m, ith);
    }
    rase_qk_rope_store(m, L, il, b, ith, nth);
    rase_sync(m, ith);
    {
        RASE_PROF_START(m, ith);
        rase_attention(m, L, il, b, ith, nth);
        rase_sync(m, ith);
        RASE_PROF_ADD(m, ith, prof_attn_ns);
    }
    if (m->w->hp.attn_gate) {  // ggml_mul by ggml_sigmoid(gate), element by element
        const int hd = m->w->hp.head_dim;
        for (int64_t t = lo; t < hi; ++t)
            for (int64_t i = 0; i < nq; ++i)
                s->att[t * nq + i] *= rase_sigmoid(s->mix[t * s->mix_stride + i / hd * 2 * hd + hd + i % hd]);
        rase_sync(m, ith);
    }
    // 5. output projection
    {
        RASE_PROF_START(m, ith);
        rase_matmul(m, &L->wo, s->att, T, s->o, L->bo, ith, nth);
        rase_sync(m, ith);
        RASE_PROF_ADD(m, ith, prof_matmul_ns);
    }
}

// att: the heads' outputs (n_head * head_dim per row), which the output projection reads as its
// input; a gated attention's (Qwen3.5) Q rows with their gates in mix (2 n_head * head_dim)
static void rase_attention_needs(const rase_hparams *hp, rase_scratch_need *need) {
    const int64_t nq = (int64_t)hp->n_head * hp->head_dim;
    rase_need(&need->att, nq);
    rase_need(&need->cols, nq);
    if (hp->attn_gate) rase_need(&need->mix, 2 * nq);
}

#endif  // RASE_MIX_ATTENTION_H
