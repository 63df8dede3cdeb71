// rase/kernels/_matmul.h: the forward's matrix products: activations quantized once per input row
// (shared by the products that read the same input), rows split over threads in chunks, each
// chunk through its type's kernel (the traits row: repacked groups, a GEMM, or dot rows).
#ifndef RASE_MATMUL_H
#define RASE_MATMUL_H

#include "_model.h"

static void rase_sync(rase_model *m, int ith) {
    rase_barrier_wait_reset(&m->barrier, m->s->jobs);
    for (int a = 0; a < 2 * ACT_COUNT; ++a) m->s->act_src[ith * 2 * ACT_COUNT + a] = NULL;
}

// X (T, cols) quantized to activation format `act`, as rows `*astride` bytes apart; each row
// on its own (no statistics across rows). One row: each thread quantizes it into its own buffer
// (no barrier). Several rows: the threads split them into a shared buffer, then meet at a
// barrier. Each thread remembers what its buffers hold, so matmuls sharing an input (Q/K/V,
// gate/up) quantize it once; rase_sync forgets.
static const uint8_t *rase_quantize_input(rase_model *m, int act, const float *X, int T, int64_t cols,
                                          int ith, int nth, size_t *astride) {
    rase_scratch *s = m->s;
    const rase_quant_fn quant = rase_act_quant_for(act, m->isa);
    const size_t row = rase_act_row_stride(act, cols);  // fits: act_stride is an f32 row + 64
    *astride = row;
    const float **src = s->act_src + ith * 2 * ACT_COUNT;
    if (T == 1) {
        uint8_t *buf = s->act + ((size_t)ith * ACT_COUNT + act) * s->act_stride;
        if (src[act] != X) { quant(X, buf, cols); src[act] = X; }
        return buf;
    }
    uint8_t *buf = s->act_rows + (size_t)act * s->max_rows * s->act_stride;
    if (src[ACT_COUNT + act] != X) {
        int64_t lo, hi;
        rase_split(T, ith, nth, &lo, &hi);
        for (int64_t t = lo; t < hi; ++t) quant(X + t * cols, buf + t * row, cols);
        rase_barrier_wait(&m->barrier);
        src[ACT_COUNT + act] = X;
    }
    return buf;
}

// 1 when one of Y[t][r], r in [r0, r1), t < T, is NaN or +-inf (exponent bits all ones)
static int rase_any_nonfinite(const float *Y, int64_t rows, int T, int64_t r0, int64_t r1) {
    uint32_t all = 0;
    for (int t = 0; t < T; ++t)
        for (int64_t r = r0; r < r1; ++r) {
            uint32_t u;
            memcpy(&u, Y + (int64_t)t * rows + r, 4);
            all |= (u & 0x7f800000u) == 0x7f800000u;
        }
    return (int)all;
}

// Y[t][r] += b[r] for rows [r0, r1) of T rows of `rows` outputs
static void rase_add_bias(float *Y, int64_t rows, const float *b, int T, int64_t r0, int64_t r1) {
    for (int t = 0; t < T; ++t)
        for (int64_t r = r0; r < r1; ++r) Y[(int64_t)t * rows + r] += b[r];
}

// Y[t][r] = X[t] . w[r] for rows [r0, r1) (r0 a multiple of 16) and T tokens, A = X quantized
// to format act (rase_act_for's, or the type's own; rows `as` bytes apart); work: the thread's
// rase_work. Tiles change with T (tokens per call, rows per group); the arithmetic of each
// output element does not.
static void rase_mm_rows(const rase_model *m, const rase_mat *w, const uint8_t *A, int act, size_t as, int T,
                         float *Y, int64_t r0, int64_t r1, float *work) {
    if (w->layout == RASE_LAYOUT_R16) {
        rase_r16_rows(m->isa, w->type, w->packed, w->group_bytes, w->cols, A, as, T, Y, w->rows, r0, r1, (uint8_t *)work);
        return;
    }
    const rase_rows_fn rows = rase_rows_for(w->type, m->isa, T, w->cols);
    if (rows && act == rase_traits(w->type)->rows_act) {  // the same bits as dotn
        rows(w->cols, w->data, w->row_bytes, r0, r1, A, as, T, Y, w->rows, work);
        return;
    }
    const rase_dotn_fn dotn = rase_dotn_for(w->type, m->isa);
    float out[RASE_NT];
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t *wr = w->data + r * w->row_bytes;
        for (int t0 = 0; t0 < T; t0 += RASE_NT) {
            const int nt = T - t0 < RASE_NT ? T - t0 : RASE_NT;
            dotn(w->cols, wr, A + (size_t)t0 * as, as, nt, out);
            for (int j = 0; j < nt; ++j) Y[(int64_t)(t0 + j) * w->rows + r] = out[j];
        }
    }
}

// what rase_matmuls does to a chunk it computed: nothing; act(gate) * up; act; check it for NaN and
// +-inf while it is in this core's cache (s->nonfinite: the LM head's logits)
enum { RASE_EPI_NONE, RASE_EPI_GATE, RASE_EPI_ACT, RASE_EPI_FINITE };

// g = act(g) over n elements (an FFN without a gate: bert's GELU). The same scalar steps on
// every ISA: the GELU is the f16 table lookup, which the vector path also does lane by lane.
static void rase_act(float *g, int64_t n, const uint16_t *gelu_table) {
    for (int64_t i = 0; i < n; ++i) g[i] = gelu_table ? rase_geglu1(g[i], gelu_table) : rase_silu(g[i]);
}

// Y[i] (T, rows_i) = X (T, cols) w[i]^T for n matrices sharing their input (Q/K/V), their
// chunks of RASE_CHUNK_ROWS rows in one list split by rase_jobs (counters reset by the barrier
// that precedes every call). epi RASE_EPI_GATE: the matrices are (gate, up) of an FFN; a chunk
// computes both and then act(gate) * up on its rows, written into Y[0]; RASE_EPI_ACT: one
// matrix (up), act on its chunk. bias (n pointers) or NULL: b[i] (rows_i,) or NULL is added to
// Y[i] (ggml_add after the matmul, before the activation).
static void rase_matmuls(rase_model *m, int n, const rase_mat *const *w, const float *X, float *const *Y, int T,
                         int epi, const float *const *bias, int ith, int nth) {
    const int gate_u = epi == RASE_EPI_GATE;
    const uint8_t *A[4];  // n <= 4 (a delta net's four in-projections)
    size_t as[4];
    int act[4];
    for (int i = 0; i < n; ++i) {  // shared formats are quantized once (rase_quantize_input)
        act[i] = rase_act_for(w[i]->type, m->isa, T, w[i]->cols);
        A[i] = rase_quantize_input(m, act[i], X, T, w[i]->cols, ith, nth, &as[i]);
    }
    int64_t total = 0, first[4];
    for (int i = 0; i < (gate_u ? 1 : n); ++i) {
        first[i] = total;
        total += (w[i]->rows + RASE_CHUNK_ROWS - 1) / RASE_CHUNK_ROWS;
    }
    rase_jobs jobs = rase_jobs_start(m->s->jobs, total, ith, nth);
    for (int64_t c = rase_jobs_next(&jobs); c < total; c = rase_jobs_next(&jobs)) {
        int i = 0;
        while (i + 1 < (gate_u ? 1 : n) && c >= first[i + 1]) ++i;
        const int64_t r0 = (c - first[i]) * RASE_CHUNK_ROWS;
        const int64_t r1 = r0 + RASE_CHUNK_ROWS < w[i]->rows ? r0 + RASE_CHUNK_ROWS : w[i]->rows;
        rase_mm_rows(m, w[i], A[i], act[i], as[i], T, Y[i], r0, r1, rase_work(m->s, ith));
        if (bias && bias[i]) rase_add_bias(Y[i], w[i]->rows, bias[i], T, r0, r1);
        if (epi == RASE_EPI_FINITE && rase_any_nonfinite(Y[i], w[i]->rows, T, r0, r1))
            __atomic_store_n(&m->s->nonfinite, 1, __ATOMIC_RELAXED);
        if (gate_u) {
            rase_mm_rows(m, w[1], A[1], act[1], as[1], T, Y[1], r0, r1, rase_work(m->s, ith));
            if (bias && bias[1]) rase_add_bias(Y[1], w[1]->rows, bias[1], T, r0, r1);
            for (int t = 0; t < T; ++t)
                rase_gate(Y[0] + (int64_t)t * w[0]->rows + r0, Y[1] + (int64_t)t * w[1]->rows + r0, r1 - r0,
                          m->w->gelu_table, m->isa);
        } else if (epi == RASE_EPI_ACT) {
            for (int t = 0; t < T; ++t) rase_act(Y[0] + (int64_t)t * w[0]->rows + r0, r1 - r0, m->w->gelu_table);
        }
    }
}

static void rase_matmul(rase_model *m, const rase_mat *w, const float *X, int T, float *Y, const float *bias,
                        int ith, int nth) {
    rase_matmuls(m, 1, &w, X, &Y, T, RASE_EPI_NONE, bias ? &bias : NULL, ith, nth);
}

#endif  // RASE_MATMUL_H
