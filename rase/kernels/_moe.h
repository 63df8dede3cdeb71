// rase/kernels/_moe.h: the routed FFN of a mixture-of-experts layer (on the model's scratch and matmuls).
//
// llama.cpp's build_moe_ffn, per token: router logits = gate_inp . h (+ bias); the experts and
// their weights (rase_moe_route), divided by their f64 sum when expert_norm; out = (w_0 * down_0)
// + (w_1 * down_1) + ... in that order, down_e = down_e(act(gate_e(h) + bg_e, up_e(h) + bu_e))
// + bd_e, each bias added when the file has it (gpt-oss).
//
// Numerics: a step's (token, expert) pairs are grouped by expert so each chosen expert's rows are
// read once per step; every pair is computed by the one-token kernels (the tile never changes an
// element's arithmetic) and the weighted sum is per token in slot order, so a token's output does
// not depend on the other tokens of the step or which experts they chose.
#ifndef RASE_MOE_H
#define RASE_MOE_H

#include "_matmul.h"

#if RASE_HAVE_X86
// ggml_vec_soft_max_f32's 8-lane step: p = exp(p - mx) with ggml's exp, *sum += their sum
RASE_TARGET_AVX2 static void rase_moe_exp8(float *p, float mx, double *sum) {
    const __m256 e = rase_avx2_expf(_mm256_sub_ps(_mm256_loadu_ps(p), _mm256_set1_ps(mx)));
    _mm256_storeu_ps(p, e);
    *sum += (double)rase_avx2_hsum(e);
}
#endif

// p (n,) = softmax(p) as ggml_soft_max: f64 sum, ggml's exp in 8-lane groups, the scalar exp
// for the rest
static void rase_moe_softmax(float *p, int n, int isa) {
    float mx = -INFINITY;
    for (int i = 0; i < n; ++i)
        if (p[i] > mx) mx = p[i];
    double sum = 0.0;
    int i = 0;
#if RASE_HAVE_X86
    if (isa >= RASE_ISA_AVX2)
        for (; i + 8 <= n; i += 8) rase_moe_exp8(p + i, mx, &sum);
#else
    (void)isa;
#endif
    for (; i < n; ++i) {
        p[i] = expf(p[i] - mx);
        sum += (double)p[i];
    }
    const float inv = (float)(1.0 / sum);
    for (i = 0; i < n; ++i) p[i] *= inv;
}

// p (n_expert,) router logits -> sel/w (n_expert_used,): the chosen and their weights. SOFTMAX:
// p becomes probabilities, the k most probable are chosen, their probabilities the weights;
// SOFTMAX_WEIGHT: the k largest logits are chosen, the weights their softmax
static void rase_moe_route(const rase_hparams *hp, float *p, int32_t *sel, float *w, int isa) {
    const int ne = hp->n_expert, k = hp->n_expert_used;
    if (hp->expert_gating == RASE_GATING_SOFTMAX) rase_moe_softmax(p, ne, isa);
    uint64_t taken[4] = {0};  // n_expert <= 256 (checked at load)
    for (int j = 0; j < k; ++j) {  // the largest first; ties: the lower id
        int best = -1;
        for (int i = 0; i < ne; ++i)
            if (!(taken[i >> 6] >> (i & 63) & 1) && (best < 0 || p[i] > p[best])) best = i;
        taken[best >> 6] |= (uint64_t)1 << (best & 63);
        sel[j] = best;
        w[j] = p[best];
    }
    if (hp->expert_gating == RASE_GATING_SOFTMAX_WEIGHT) rase_moe_softmax(w, k, isa);
    if (hp->expert_norm) {  // ggml_sum_rows (f64), ggml_div
        double ws = 0.0;
        for (int j = 0; j < k; ++j) ws += (double)w[j];
        const float fs = (float)ws;
        for (int j = 0; j < k; ++j) w[j] = w[j] / fs;
    }
}

// one thread: pair slots grouped by expert (token order inside an expert): pair[t * k + j] is the
// slot of (t, sel[t * k + j]), ptok[slot] its token, seg[e] .. seg[e + 1] the slots of expert e
static void rase_moe_group(const rase_hparams *hp, rase_scratch *s, int T) {
    const int ne = hp->n_expert, P = T * hp->n_expert_used;
    for (int e = 0; e <= ne; ++e) s->seg[e] = 0;
    for (int p = 0; p < P; ++p) s->seg[s->sel[p] + 1]++;
    for (int e = 0; e < ne; ++e) s->seg[e + 1] += s->seg[e];
    for (int e = 0; e < ne; ++e) s->cursor[e] = s->seg[e];
    for (int p = 0; p < P; ++p) {
        s->pair[p] = s->cursor[s->sel[p]]++;
        s->ptok[s->pair[p]] = p / hp->n_expert_used;
    }
}

// rows [r0, r1) of expert matrices w[e] over their pairs: A (slots, as bytes) -> Y (slots, rows)
typedef struct {
    const rase_mat *w;   // (n_expert,)
    const uint8_t *A;    // in the type's own activation format (an expert's pairs may be 1 or many)
    size_t as;
    float *Y;
    const float *bias;   // (n_expert, rows) added to each pair's rows (ggml_add_id), or NULL
} rase_moe_mm;

// act(gate) * up of one pair's rows [r0, r1) into gate: SiLU / GELU, or gpt-oss's clamped SwiGLU
static void rase_moe_act(const rase_model *m, float *g, const float *u, int64_t n) {
    const rase_hparams *hp = &m->w->hp;
    if (hp->swiglu_limit > 0.0f) rase_swiglu_oai(g, u, n, hp->swiglu_alpha, hp->swiglu_limit);
    else rase_gate(g, u, n, m->w->gelu_table, m->isa);
}

// n (1 or 2: gate and up, then act(gate) * up into mm[0].Y) expert matmuls over every expert
// with pairs, chunks of RASE_CHUNK_ROWS rows split by rase_jobs; a barrier after
static void rase_moe_matmuls(rase_model *m, const rase_moe_mm *mm, int n, int ith, int nth) {
    const rase_scratch *s = m->s;
    const int ne = m->w->hp.n_expert;
    const int64_t rows = mm[0].w[0].rows, per = (rows + RASE_CHUNK_ROWS - 1) / RASE_CHUNK_ROWS;
    int64_t total = 0;
    for (int x = 0; x < ne; ++x) total += s->seg[x + 1] > s->seg[x] ? per : 0;
    int e = 0;
    int64_t first = 0;  // the first job of expert e
    rase_jobs jobs = rase_jobs_start(s->jobs, total, ith, nth);
    for (int64_t c = rase_jobs_next(&jobs); c < total; c = rase_jobs_next(&jobs)) {
        if (c < first) e = 0, first = 0;  // helping a thread whose share comes earlier
        while (e < ne && c >= first + (s->seg[e + 1] > s->seg[e] ? per : 0)) {
            first += s->seg[e + 1] > s->seg[e] ? per : 0;
            ++e;
        }
        if (e >= ne) break;
        const int n_e = s->seg[e + 1] - s->seg[e], p0 = s->seg[e];
        const int64_t r0 = (c - first) * RASE_CHUNK_ROWS, r1 = r0 + RASE_CHUNK_ROWS < rows ? r0 + RASE_CHUNK_ROWS : rows;
        for (int i = 0; i < n; ++i) {
            rase_mm_rows(m, &mm[i].w[e], mm[i].A + (size_t)p0 * mm[i].as, rase_type_traits_table[mm[i].w[e].type].act, mm[i].as,
                         n_e, mm[i].Y + (int64_t)p0 * rows, r0, r1, rase_work(s, ith));
            if (mm[i].bias) rase_add_bias(mm[i].Y + (int64_t)p0 * rows, rows, mm[i].bias + (int64_t)e * rows, n_e, r0, r1);
        }
        if (n == 2)
            for (int p = p0; p < p0 + n_e; ++p)
                rase_moe_act(m, mm[0].Y + (int64_t)p * rows + r0, mm[1].Y + (int64_t)p * rows + r0, r1 - r0);
    }
    rase_sync(m, ith);
}

// pair rows X[ptok[p]] (X_by_token) or X[p] quantized for act into A, split across threads; a barrier after
static size_t rase_moe_quantize(rase_model *m, int act, const float *X, int64_t cols, int by_token, uint8_t *A,
                                int P, int ith, int nth) {
    const rase_quant_fn quant = rase_act_quant_for(act, m->isa);
    const size_t row = rase_act_row_stride(act, cols);
    int64_t lo, hi;
    rase_split(P, ith, nth, &lo, &hi);
    for (int64_t p = lo; p < hi; ++p) quant(X + (by_token ? m->s->ptok[p] : p) * cols, A + p * row, cols);
    rase_sync(m, ith);
    return row;
}

// s->o (T, n_embd) = the layer's routed FFN of s->h; a barrier after
static void rase_moe_ffn(rase_model *m, const rase_layer *L, int T, int ith, int nth) {
    const rase_hparams *hp = &m->w->hp;
    rase_scratch *s = m->s;
    const int E = hp->n_embd, F = hp->n_ff_exp, ne = hp->n_expert, k = hp->n_expert_used, P = T * k;
    int64_t lo, hi;
    // 1. router logits, 2. routing per token, 3. pairs grouped by expert
    rase_matmul(m, &L->gate_inp, s->h, T, s->router, L->gate_inp_b, ith, nth);
    rase_sync(m, ith);
    rase_split(T, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; ++t) rase_moe_route(hp, s->router + t * ne, s->sel + t * k, s->wsel + t * k, m->isa);
    rase_sync(m, ith);
    if (ith == 0) rase_moe_group(hp, s, T);
    rase_sync(m, ith);
    // 4. gate and up of every pair (inputs quantized per pair, in each matrix's format), the gate
    uint8_t *A1 = s->pact + (size_t)P * s->act_stride;
    const int act_g = rase_type_traits_table[L->exp_gate[0].type].act, act_u = rase_type_traits_table[L->exp_up[0].type].act;
    const size_t rg = rase_moe_quantize(m, act_g, s->h, E, 1, s->pact, P, ith, nth);
    const size_t ru = act_u == act_g ? rg : rase_moe_quantize(m, act_u, s->h, E, 1, A1, P, ith, nth);
    const rase_moe_mm gu[2] = {{L->exp_gate, s->pact, rg, s->pg, L->exp_bgate},
                               {L->exp_up, act_u == act_g ? s->pact : A1, ru, s->pu, L->exp_bup}};
    rase_moe_matmuls(m, gu, 2, ith, nth);
    // 5. down of every pair
    const size_t rd = rase_moe_quantize(m, rase_type_traits_table[L->exp_down[0].type].act, s->pg, F, 0, s->pact, P, ith, nth);
    const rase_moe_mm dn = {L->exp_down, s->pact, rd, s->pd, L->exp_bdown};
    rase_moe_matmuls(m, &dn, 1, ith, nth);
    // 6. weighted sum per token in slot order (ggml_mul, then ggml_add expert by expert)
    for (int64_t t = lo; t < hi; ++t) {
        float *o = s->o + t * E;
        for (int j = 0; j < k; ++j) {
            const float w = s->wsel[t * k + j], *d = s->pd + (int64_t)s->pair[t * k + j] * E;
            if (j == 0)
                for (int i = 0; i < E; ++i) o[i] = d[i] * w;
            else
                for (int i = 0; i < E; ++i) o[i] = o[i] + d[i] * w;
        }
    }
    rase_sync(m, ith);
}

#endif  // RASE_MOE_H
