// rase/kernels/_forward.h: the one transformer forward shared by every architecture.
//
// rase_step evaluates a batch of (token, sequence, position) rows (the state: _model.h) inside one
// OpenMP parallel region (ops split work by thread, barriers between them), then samples the rows
// that need a token.
//
// Numerics contract: every output element is computed by one thread, and each row by the same
// arithmetic whatever else is in the step (the one-token kernels, per-row activation
// quantization, per-row norms and RoPE, attention over the row's own sequence). A sequence's
// logits therefore do not depend on the batch, its chunking, the thread count or the pool
// blocks that hold its K/V, and they equal llama.cpp's one-token (n_batch = 1) numerics.
#ifndef RASE_FORWARD_H
#define RASE_FORWARD_H


#include <time.h>
#include "_moe.h"

// ---------------------------------------------------------------- the forward

static inline int64_t rase_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
// thread 0 times the ops between barriers (their wall time) when profiling
#define RASE_PROF_START(m, ith) const int64_t prof_t0 = ((m)->profile && (ith) == 0) ? rase_now_ns() : 0
#define RASE_PROF_ADD(m, ith, field) do { if ((m)->profile && (ith) == 0) (m)->field += rase_now_ns() - prof_t0; } while (0)

// y = the model's norm of x (RMSNorm, or LayerNorm with bias b); y may be x
static inline void rase_norm(const rase_model *m, const float *x, const float *w, const float *b, float *y) {
    if (m->w->hp.layer_norm) rase_layernorm(x, w, b, y, m->w->hp.n_embd, m->w->hp.eps);
    else rase_rmsnorm(x, w, y, m->w->hp.n_embd, m->w->hp.eps);
}

// h[t] = norm ? rmsnorm(x[t]) : x[t] (a block without pre-norms reads the residual itself)
static void rase_prenorm(const rase_model *m, const float *norm, const float *x, float *h) {
    const int E = m->w->hp.n_embd;
    if (norm) rase_rmsnorm(x, norm, h, E, m->w->hp.eps);
    else memcpy(h, x, (size_t)E * sizeof(float));
}

// x[t] += post_norm ? norm(o[t]) : o[t] for this thread's rows (norm_after_add: x[t] =
// norm(x[t] + o[t])), then (next) h[t] = rase_prenorm(next_norm, x[t]); a barrier after.
static void rase_residual(rase_model *m, const float *post_norm, const float *post_norm_b, int next,
                          const float *next_norm, int T, int ith, int nth) {
    const int E = m->w->hp.n_embd, after = m->w->hp.norm_after_add;
    int64_t lo, hi;
    rase_split(T, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; ++t) {
        float *o = m->s->o + t * E, *x = m->s->x + t * E;
        if (post_norm && !after) rase_norm(m, o, post_norm, post_norm_b, o);
        if (m->w->hp.residual_scale != 1.0f)  // ggml_scale, then ggml_add: two roundings
            for (int i = 0; i < E; ++i) o[i] *= m->w->hp.residual_scale;
        for (int i = 0; i < E; ++i) x[i] += o[i];
        if (post_norm && after) rase_norm(m, x, post_norm, post_norm_b, x);
        if (next) rase_prenorm(m, next_norm, x, m->s->h + t * E);
    }
    rase_sync(m, ith);
}

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
    *j1 = e.pos + 1;
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

// the state a row reads (its sequence's slot; NULL at position 0: zeros) and the one it
// writes (the same slot: rows update it in place, in position order), for a layer's share at off
static void rase_row_states(const rase_model *m, const rase_batch *b, int t, int64_t off, float **src, float **dst) {
    const rase_entry e = b->rows[t];
    *dst = rase_state_at(m->kv, b->slots[e.seq]) + off;
    *src = e.pos ? *dst : NULL;
}

// LFM2's short convolution block, h -> o: b, c, x = in_proj(h); each row's gated convolution
// (_conv.h) over its sequence's previous positions; out_proj. Threads take channel ranges and
// every row in (sequence, position) order (s->order, rase_row_order).
static void rase_shortconv(rase_model *m, const rase_layer *L, int il, const rase_batch *b, int ith, int nth) {
    (void)il;
    rase_scratch *s = m->s;
    const int T = b->n, d = m->w->hp.n_conv - 1;
    const int64_t E = m->w->hp.n_embd;
    {
        RASE_PROF_START(m, ith);
        rase_matmul(m, &L->conv_in, s->h, T, s->g, NULL, ith, nth);
        rase_sync(m, ith);
        RASE_PROF_ADD(m, ith, prof_matmul_ns);
    }
    int64_t c0, c1;
    rase_split(E, ith, nth, &c0, &c1);
    for (int i = 0; i < T; ++i) {
        const int t = s->order[i];
        float *src, *dst;
        rase_row_states(m, b, t, L->state_off, &src, &dst);
        rase_shortconv_row(m->isa, d, s->g + t * 3 * E, E, L->conv_w, src, dst, s->att + t * E, c0, c1);
    }
    rase_sync(m, ith);
    RASE_PROF_START(m, ith);
    rase_matmul(m, &L->conv_out, s->att, T, s->o, NULL, ith, nth);
    rase_sync(m, ith);
    RASE_PROF_ADD(m, ith, prof_matmul_ns);
}

// Qwen3.5's gated delta net, h -> o (llama.cpp's build_layer_attn_linear with its fused
// ggml_gated_delta_net). 1. projections: q/k/v channels, z, beta, alpha; 2. the causal conv over
// the channels (rows in (sequence, position) order, threads by channel ranges), then silu; 3. q
// and k L2-normalized per key head; 4. per (sequence, value head), its rows in order: beta =
// sigmoid, g = softplus(alpha + dt) * a, the delta rule (_deltanet.h; value head h reads key head
// h % H_k, as ggml's broadcast); 5. per (row, value head): rmsnorm(o) * w * silu(z); 6. out-proj.
// A layer's state in a slot: the conv's (n_conv - 1, conv_dim), then H_v matrices (S, S).
static void rase_deltanet(rase_model *m, const rase_layer *L, int il, const rase_batch *b, int ith, int nth) {
    (void)il;
    rase_scratch *s = m->s;
    const rase_hparams *hp = &m->w->hp;
    const int T = b->n, Hk = hp->ssm_k_heads, Hv = hp->ssm_v_heads, d = hp->n_conv - 1;
    const int64_t S = hp->ssm_head, key = Hk * S, val = Hv * S, cd = 2 * key + val, ms = s->mix_stride;
    float *beta = s->gates, *alpha = s->gates + (int64_t)s->max_rows * Hv;
    {
        RASE_PROF_START(m, ith);
        const rase_mat *w[4] = {&L->conv_in, &L->ssm_z, &L->ssm_beta, &L->ssm_alpha};
        float *out[4] = {s->g, s->u, beta, alpha};
        rase_matmuls(m, 4, w, s->h, out, T, RASE_EPI_NONE, NULL, ith, nth);
        rase_sync(m, ith);
        RASE_PROF_ADD(m, ith, prof_matmul_ns);
    }
    int64_t c0, c1;
    rase_split(cd / 16, ith, nth, &c0, &c1);  // 16-channel groups: one vector path per element
    for (int i = 0; i < T; ++i) {
        const int t = s->order[i];
        float *src, *dst;
        rase_row_states(m, b, t, L->state_off, &src, &dst);
        RASE_CONV[m->isa](d, s->g + t * cd, cd, L->conv_w, src, dst, s->mix + t * ms, 16 * c0, 16 * c1);
        rase_silu_row(s->mix + t * ms + 16 * c0, 16 * (c1 - c0), m->isa);
    }
    rase_sync(m, ith);
    for (int64_t w = ith; w < (int64_t)T * 2 * Hk; w += nth)  // q heads, then k heads, of each row
        rase_gdn_l2norm(s->mix + w / (2 * Hk) * ms + w % (2 * Hk) * S, S, hp->eps);
    rase_sync(m, ith);
    const int64_t soff = L->state_off + (int64_t)d * cd;  // the layer's matrices in a state slot
    float *delta = rase_work(s, ith);
    for (int64_t w = ith; w < (int64_t)s->n_runs * Hv; w += nth) {
        const int run = (int)(w / Hv), h = (int)(w % Hv);
        for (int i = s->runs[run]; i < s->runs[run + 1]; ++i) {
            const int t = s->order[i];
            float *src, *dst;
            rase_row_states(m, b, t, soff + h * S * S, &src, &dst);
            if (!src) memset(dst, 0, (size_t)(S * S) * sizeof(float));  // position 0: a zero state
            const float *row = s->mix + t * ms;
            const float g = rase_softplus(alpha[t * Hv + h] + L->ssm_dt[h]) * L->ssm_a[h];
            RASE_DELTA[m->isa](S, dst, row + (h % Hk) * S, row + key + (h % Hk) * S, row + 2 * key + h * S, g,
                               rase_sigmoid(beta[t * Hv + h]), delta, s->att + t * val + h * S);
        }
    }
    rase_sync(m, ith);
    for (int64_t w = ith; w < (int64_t)T * Hv; w += nth) {  // rmsnorm(o) * w, times silu(z)
        float *o = s->att + w * S, *z = s->u + w * S;
        rase_rmsnorm(o, L->ssm_norm, o, S, hp->eps);
        rase_silu_row(z, S, m->isa);
        for (int64_t i = 0; i < S; ++i) o[i] *= z[i];
    }
    rase_sync(m, ith);
    RASE_PROF_START(m, ith);
    rase_matmul(m, &L->conv_out, s->att, T, s->o, NULL, ith, nth);
    rase_sync(m, ith);
    RASE_PROF_ADD(m, ith, prof_matmul_ns);
}

typedef void (*rase_mixer_fn)(rase_model *m, const rase_layer *L, int il, const rase_batch *b, int ith, int nth);
static const rase_mixer_fn RASE_MIXERS[] = {[RASE_MIXER_ATTENTION] = rase_attention_block,
                                           [RASE_MIXER_SHORTCONV] = rase_shortconv,
                                           [RASE_MIXER_DELTANET] = rase_deltanet};

// One layer; on entry h holds rase_prenorm(L->attn_norm, x) (1. attention norm: the previous
// layer's last op, or rase_embed's); next: the layer after (its attention norm is this layer's
// last op), or NULL.
static void rase_layer_forward(rase_model *m, const rase_layer *L, const rase_layer *next, int il,
                               const rase_batch *b, int ith, int nth) {
    rase_scratch *s = m->s;
    const int T = b->n;
    RASE_MIXERS[L->mixer](m, L, il, b, ith, nth);
    // 6. (post-attention norm), residual, (FFN norm)
    rase_residual(m, L->post_attn_norm, L->post_attn_norm_b, 1, L->ffn_norm, T, ith, nth);
    // 7. gate and up over the same rows, then act(gate) * up on those rows; 8. down projection
    //    (a MoE layer: the chosen experts' FFNs, weighted, rase_moe_ffn)
    {
        RASE_PROF_START(m, ith);
        if (L->moe) {
            rase_moe_ffn(m, L, T, ith, nth);
        } else {
            const int gated = L->wgate.data != NULL;
            const rase_mat *gu[2] = {gated ? &L->wgate : &L->wup, &L->wup};
            float *out[2] = {s->g, s->u};
            const float *bias[2] = {gated ? L->bgate : L->bup, L->bup};
            rase_matmuls(m, gated ? 2 : 1, gu, s->h, out, T, gated ? RASE_EPI_GATE : RASE_EPI_ACT, bias, ith, nth);
            rase_sync(m, ith);
            rase_matmul(m, &L->wdown, s->g, T, s->o, L->bdown, ith, nth);
            rase_sync(m, ith);
        }
        RASE_PROF_ADD(m, ith, prof_matmul_ns);
    }
    // 9. (post-FFN norm), residual, (the next layer's attention norm)
    rase_residual(m, L->post_ffn_norm, L->post_ffn_norm_b, next != NULL, next ? next->attn_norm : NULL, T, ith, nth);
}

// s->order = the step's rows by (sequence, position): a recurrent layer runs each sequence's
// rows in position order whatever order the step lists them in. Insertion sort: a scheduler's
// steps come in that order already (linear), and no sort state is shared between models.
static void rase_row_order(rase_model *m, const rase_batch *b) {
    int32_t *o = m->s->order, *runs = m->s->runs;
    for (int t = 0; t < b->n; ++t) {
        const rase_entry e = b->rows[t];
        int i = t;
        for (; i > 0; --i) {
            const rase_entry p = b->rows[o[i - 1]];
            if (p.seq < e.seq || (p.seq == e.seq && p.pos < e.pos)) break;
            o[i] = o[i - 1];
        }
        o[i] = t;
    }
    int n = 0;  // runs: where each sequence's rows begin in order, then the end
    for (int i = 0; i < b->n; ++i)
        if (i == 0 || b->rows[o[i]].seq != b->rows[o[i - 1]].seq) runs[n++] = i;
    runs[n] = b->n;
    m->s->n_runs = n;
}

// embeddings, the first layer's attention norm and RoPE tables of this thread's rows, from
// each row's own token and position
static void rase_embed(rase_model *m, const rase_batch *b, int ith, int nth) {
    const rase_weights *w = m->w;
    const rase_hparams *hp = &w->hp;
    const int E = hp->n_embd, nslots = hp->rope[1].base > 0.0f ? 2 : 1;
    const int64_t half_rot = hp->n_rot / 2;
    const rase_dequant_fn deq = rase_dequant_for(w->tok_embd.type, m->isa);
    int64_t lo, hi;
    rase_split(b->n, ith, nth, &lo, &hi);
    const rase_mat *te = &w->tok_embd;
    uint8_t *plain = (uint8_t *)rase_work(m->s, ith);  // one row of ggml blocks (row_bytes <= 4 x E)
    for (int64_t t = lo; t < hi; ++t) {
        float *x = m->s->x + t * E;
        const int64_t tok = b->rows[t].token;
        if (te->layout == RASE_LAYOUT_R16) {  // tied: the output's repacked copy, the same bytes
            rase_r16_unpack_row(te->type, te->packed, te->group_bytes, E, tok, plain);
            deq(plain, x, E);
        } else
            deq(te->data + tok * te->row_bytes, x, E);
        if (hp->embd_scale != 1.0f)
            for (int i = 0; i < E; ++i) x[i] *= hp->embd_scale;
        if (w->type_embd)  // bert: token type 0 ("sentence A"), then the learned position
            for (int i = 0; i < E; ++i) x[i] += w->type_embd[i];
        if (w->pos_embd.data) {
            float *p = m->s->o + t * E;
            rase_dequant_for(w->pos_embd.type, m->isa)(w->pos_embd.data + b->rows[t].pos * w->pos_embd.row_bytes, p, E);
            for (int i = 0; i < E; ++i) x[i] = p[i] + x[i];
        }
        if (w->embd_norm) rase_norm(m, x, w->embd_norm, w->embd_norm_b, x);
        rase_prenorm(m, w->layers[0].attn_norm, x, m->s->h + t * E);
        for (int sl = 0; sl < nslots; ++sl)
            rase_rope_table(m->s->rope + ((size_t)sl * m->s->max_rows + t) * half_rot * 2, b->rows[t].pos,
                            hp->n_rot, &hp->rope[sl]);
    }
}

// One step. The caller checks: 1 <= n <= max_rows; n_out <= max_rows; tokens < n_vocab;
// 0 <= pos < n_ctx; every (seq, pos) row has a block in its table; out_rows in [0, n).
// samplers (n_out) or NULL: when given, tokens[j] = the token sampled from logits row j (or
// rase_sample's RASE_SAMPLE_INVALID / RASE_SAMPLE_NONE), rows split across threads (each sampler has its own RNG).
static void rase_step(rase_model *m, const rase_batch *b, const rase_sampler_ref *samplers, int32_t *tokens) {
    const int E = m->w->hp.n_embd, V = m->w->hp.n_vocab;
    const int64_t t_step = rase_now_ns();  // two clock reads a step: the Python path's yardstick
#pragma omp parallel num_threads(m->s->n_threads)
    {
        int ith = 0, nth = 1;
#ifdef _OPENMP
        ith = omp_get_thread_num();
        nth = omp_get_num_threads();
#endif
#pragma omp single
        {
            m->barrier.n = nth;
            m->barrier.count = 0;
            m->s->nonfinite = 0;
            for (int i = 0; i < nth; ++i) m->s->jobs[i].next = 0;
            if (m->w->hp.state_floats) rase_row_order(m, b);
        }  // implicit barrier: every thread sees n
        for (int a = 0; a < 2 * ACT_COUNT; ++a) m->s->act_src[ith * 2 * ACT_COUNT + a] = NULL;
        rase_embed(m, b, ith, nth);
        rase_sync(m, ith);
        for (int il = 0; il < m->w->hp.n_layer; ++il) {
            rase_layer_forward(m, &m->w->layers[il], il + 1 < m->w->hp.n_layer ? &m->w->layers[il + 1] : NULL, il,
                               b, ith, nth);
            if (m->trace && ith == 0) memcpy(m->trace + (size_t)il * b->n * E, m->s->x, (size_t)b->n * E * sizeof(float));
        }
        // hidden states of the embedding rows, after the final norm when the model has one
        int64_t lo, hi;
        rase_split(b->n_embd, ith, nth, &lo, &hi);
        for (int64_t j = lo; j < hi; ++j) {
            const float *x = m->s->x + (int64_t)b->embd_rows[j] * E;
            if (m->w->output_norm) rase_rmsnorm(x, m->w->output_norm, b->embd + j * E, E, m->w->hp.eps);
            else memcpy(b->embd + j * E, x, (size_t)E * sizeof(float));
        }
        // final norm of the wanted rows, gathered in output order, then the LM head
        rase_split(b->n_out, ith, nth, &lo, &hi);
        for (int64_t j = lo; j < hi; ++j)
            rase_rmsnorm(m->s->x + (int64_t)b->out_rows[j] * E, m->w->output_norm, m->s->h + j * E, E, m->w->hp.eps);
        rase_sync(m, ith);
        if (b->n_out > 0 && m->w->output.data) {  /* the LM head is a matmul too (72% of Gemma3's bytes per token) */
            RASE_PROF_START(m, ith);
            rase_matmul(m, &m->w->output, m->s->h, b->n_out, b->logits, NULL, ith, nth);
            RASE_PROF_ADD(m, ith, prof_matmul_ns);
        }
        if (m->w->hp.final_softcap > 0.0f || m->w->hp.logit_mul != 1.0f) {  // gemma2, granite
            rase_sync(m, ith);
            rase_split((int64_t)b->n_out * V, ith, nth, &lo, &hi);
            if (m->w->hp.logit_mul != 1.0f)
                for (int64_t i = lo; i < hi; ++i) b->logits[i] *= m->w->hp.logit_mul;
            if (m->w->hp.final_softcap > 0.0f) rase_softcap(b->logits, lo, hi, m->w->hp.final_softcap);
            if (rase_any_nonfinite(b->logits + lo, hi - lo, 1, 0, hi - lo))
                __atomic_store_n(&m->s->nonfinite, 1, __ATOMIC_RELAXED);
        }
        if (samplers) {
            rase_sync(m, ith);
            for (int j = ith; j < b->n_out; j += nth) {
                const rase_sampler_ref *r = &samplers[j];
                if (!r->p) { tokens[j] = RASE_SAMPLE_NONE; continue; }  // a row read, not sampled
                tokens[j] = rase_sample(b->logits + (int64_t)j * V, V, r->counts, r->p, r->rng, r->work, r->allow);
            }
        }
    }
    m->step_ns += rase_now_ns() - t_step;
}

#endif  // RASE_FORWARD_H
