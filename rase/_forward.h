// rase/_forward.h: the one transformer forward shared by every architecture.
//
// A model is a plan: weight pointers into the mmap, per-layer flags (rase_layer), the
// hyper-parameters, an f16 KV cache and scratch. rase_forward evaluates T tokens at
// positions pos0..pos0+T-1 inside one OpenMP parallel region; ops split work by thread and
// are separated by barriers. Every output element is computed by exactly one thread in a
// fixed order, so results do not depend on the thread count.
#ifndef RASE_FORWARD_H
#define RASE_FORWARD_H

#include <stdlib.h>
#include "_dot.h"
#include "_pool.h"


typedef struct {
    const uint8_t *data;
    int type;             // ggml type id
    int64_t rows, cols;   // rows x cols, cols contiguous (ggml ne[1] x ne[0])
    int64_t row_bytes;
} rase_mat;

typedef struct {
    rase_mat wq, wk, wv, wo, wgate, wup, wdown;
    const float *attn_norm, *ffn_norm;            // (n_embd,)
    const float *q_norm, *k_norm;                 // (head_dim,) or NULL
    const float *post_attn_norm, *post_ffn_norm;  // (n_embd,) or NULL
    int window;     // sliding-window length in positions; 0 = full causal attention
    int rope_slot;  // 0 or 1: which (base, scale) pair
} rase_layer;

typedef struct {
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx, n_rot;
    int rope_neox;  // 1: rotate (i, i + n_rot/2) pairs (NeoX); 0: (2i, 2i+1)
    int gelu;       // 1: GELU(tanh) gate, 0: SiLU gate
    float eps, embd_scale, attn_scale;
    float rope_base[2], rope_freq_scale[2];
    rase_mat tok_embd, output;
    const float *output_norm;
    rase_layer *layers;
    int max_batch, n_threads, isa;
    // owned buffers (rase_model_alloc / rase_model_free)
    uint16_t *k_cache, *v_cache;  // (n_layer, n_ctx, n_head_kv * head_dim), f16
    float *x, *h, *o;             // (max_batch, n_embd)
    float *q, *att;               // (max_batch, n_head * head_dim)
    float *k, *v;                 // (max_batch, n_head_kv * head_dim)
    float *g, *u;                 // (max_batch, n_ff)
    float *rope;                  // (2, max_batch, n_rot / 2, 2): cos, sin
    float *scores;                // (n_threads, attn_stride): attention scratch per thread
    int64_t attn_stride;
    uint16_t *gelu_table;         // (65536,) f16 GELU table, GELU models only
    int attn_prescale;            // 1: q *= attn_scale before rounding (gemma), scores unscaled
    float *trace;                 // NULL, or (n_layer, T, n_embd): residual stream after each layer
    int profile;                  // 1: thread 0 accumulates the ns below (RASE_PROFILE=1)
    int64_t prof_matmul_ns, prof_attn_ns;
    uint8_t *act;                 // (n_threads, ACT_COUNT, act_stride): one quantized row per thread
    uint8_t *act_rows;            // (ACT_COUNT, max_batch, act_stride): shared quantized rows
    const float **act_src;        // (n_threads, 2, ACT_COUNT): which input each buffer holds
    int64_t act_stride;
    rase_barrier barrier;
} rase_model;

static uint16_t *rase_gelu_table_new(void);

static void *rase_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

static void rase_model_free(rase_model *m) {
    void *bufs[] = {m->k_cache, m->v_cache, m->x, m->h, m->o, m->q, m->att, m->k, m->v, m->g,
                    m->u, m->rope, m->scores, m->act, m->act_rows, (void *)m->act_src, m->gelu_table};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); ++i) free(bufs[i]);
    m->k_cache = m->v_cache = NULL;
    m->x = m->h = m->o = m->q = m->att = m->k = m->v = m->g = m->u = m->rope = m->scores = NULL;
    m->act = m->act_rows = NULL;
    m->gelu_table = NULL;
    m->act_src = NULL;
}

// 0 on success, -1 when out of memory (everything freed)
static int rase_model_alloc(rase_model *m) {
    const int64_t B = m->max_batch, nq = (int64_t)m->n_head * m->head_dim;
    const int64_t nkv = (int64_t)m->n_head_kv * m->head_dim;
    int64_t max_cols = m->n_embd;
    if (nq > max_cols) max_cols = nq;
    if (m->n_ff > max_cols) max_cols = m->n_ff;
    m->act_stride = (int64_t)rase_act_bytes(ACT_F32, max_cols) + 64;
    const size_t kv = (size_t)m->n_layer * m->n_ctx * nkv * sizeof(uint16_t);
    m->k_cache = rase_alloc(kv);  // pages are touched only as positions fill
    m->v_cache = rase_alloc(kv);
    m->x = rase_alloc(B * m->n_embd * 4);
    m->h = rase_alloc(B * m->n_embd * 4);
    m->o = rase_alloc(B * m->n_embd * 4);
    m->q = rase_alloc(B * nq * 4);
    m->att = rase_alloc(B * nq * 4);
    m->k = rase_alloc(B * nkv * 4);
    m->v = rase_alloc(B * nkv * 4);
    m->g = rase_alloc(B * m->n_ff * 4);
    m->u = rase_alloc(B * m->n_ff * 4);
    m->rope = rase_alloc(2 * B * (m->n_rot / 2) * 2 * 4);
    // scores over the KV length padded to 32 (+64 slack, 8-aligned), then partials and q
    m->attn_stride = (((int64_t)m->n_ctx + 31 + 64 + 7) & ~7) + 33 * (int64_t)m->head_dim;
    m->scores = rase_alloc((size_t)m->n_threads * m->attn_stride * 4);
    m->gelu_table = m->gelu ? rase_gelu_table_new() : NULL;
    m->act = rase_alloc((size_t)m->n_threads * ACT_COUNT * m->act_stride);
    m->act_rows = rase_alloc((size_t)ACT_COUNT * B * m->act_stride);
    m->act_src = rase_alloc((size_t)m->n_threads * 2 * ACT_COUNT * sizeof(float *));
    if (!m->k_cache || !m->v_cache || !m->x || !m->h || !m->o || !m->q || !m->att || !m->k ||
        !m->v || !m->g || !m->u || !m->rope || !m->scores || !m->act || !m->act_rows || !m->act_src || (m->gelu && !m->gelu_table)) {
        rase_model_free(m);
        return -1;
    }
    return 0;
}

// ---------------------------------------------------------------- elementwise kernels

static inline float rase_silu(float x) { return x / (1.0f + expf(-x)); }

// ggml's GELU(tanh) in f32; llama.cpp evaluates it through an f16 table (rase_gelu_table)
static inline float rase_gelu(float x) {
    return 0.5f * x * (1.0f + tanhf(0.79788456080286535587989211986876f * x * (1.0f + 0.044715f * x * x)));
}

// table[h] = f16(gelu(f32(h))) for every f16 bit pattern h (ggml_table_gelu_f16)
static uint16_t *rase_gelu_table_new(void) {
    uint16_t *t = (uint16_t *)malloc(65536 * sizeof(uint16_t));
    if (t)
        for (int h = 0; h < 65536; ++h) t[h] = rase_fp32_to_fp16(rase_gelu(rase_fp16_to_fp32((uint16_t)h)));
    return t;
}

static inline float rase_geglu1(float x, const uint16_t *table) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return rase_fp16_to_fp32(table[rase_fp32_to_fp16(x)]);
}

// g = act(g) * u over n elements; GELU through the f16 table, SiLU with ggml's exp
static void gate_ref(float *g, const float *u, int64_t n, const uint16_t *gelu_table) {
    for (int64_t i = 0; i < n; ++i)
        g[i] = (gelu_table ? rase_geglu1(g[i], gelu_table) : rase_silu(g[i])) * u[i];
}

#if RASE_HAVE_X86
RASE_TARGET_AVX2 static void gate_avx2(float *g, const float *u, int64_t n, const uint16_t *gelu_table) {
    if (gelu_table) { gate_ref(g, u, n, gelu_table); return; }
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 e = rase_avx2_expf(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
    gate_ref(g + i, u + i, n - i, NULL);
}
#endif

static void rase_gate(float *g, const float *u, int64_t n, const uint16_t *gelu_table, int isa) {
#if RASE_HAVE_X86
    if (isa == RASE_ISA_AVX2) { gate_avx2(g, u, n, gelu_table); return; }
#endif
    gate_ref(g, u, n, gelu_table);
}

// y = x / rms(x) * w (ggml: mean of squares accumulated in double)
static void rase_rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += (double)(x[i] * x[i]);
    const float scale = 1.0f / sqrtf((float)(sum / (double)n) + eps);
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
}

// ---------------------------------------------------------------- attention
// One query head against cached K/V rows j0..j1-1 (rows `stride` f16 apart).
// Scratch: (n_ctx + 64) scores, then 32 * hd partial sums, then hd floats for q.

static void attend_ref(const float *q, const uint16_t *kc, const uint16_t *vc, int64_t stride, int j0,
                       int j1, int hd, float scale, float *scratch, float *out) {
    float *s = scratch, mx = -INFINITY;
    for (int j = j0; j < j1; ++j) {
        float d = 0.0f;
        for (int i = 0; i < hd; ++i) d += q[i] * rase_fp16_to_fp32(kc[(int64_t)j * stride + i]);
        s[j] = d * scale;
        if (s[j] > mx) mx = s[j];
    }
    double sum = 0.0;
    for (int j = j0; j < j1; ++j) { s[j] = expf(s[j] - mx); sum += s[j]; }
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < hd; ++i) out[i] = 0.0f;
    for (int j = j0; j < j1; ++j) {
        const float p = s[j] * inv;
        for (int i = 0; i < hd; ++i) out[i] += p * rase_fp16_to_fp32(vc[(int64_t)j * stride + i]);
    }
}

#if RASE_HAVE_X86
// llama.cpp's non-flash attention, step for step so logits match its own: q rounded to f16;
// softmax over the KV length padded to 32 with ggml's exp and an f64 sum of 8-lane partial
// sums; probabilities rounded to f16. The two products are dot products of f16 rows whose
// summation order depends on how llama.cpp multiplies: a batch (tinyBLAS: one 8-lane FMA
// accumulator) or a single token (ggml_vec_dot_f16: four 8-lane accumulators, 32 per step).
RASE_TARGET_AVX2 static void attend_avx2(const float *q, const uint16_t *kc, const uint16_t *vc, int64_t stride,
                                         int j0, int j1, int hd, float scale, float *scratch, float *out,
                                         int single) {
    const int n = (j1 + 31) & ~31, slots = single ? 32 : 8;
    float *s = scratch, *part = scratch + ((n + 64 + 7) & ~7);
    float *qf = part + 32 * hd;  // q rounded to f16, held as f32
    for (int i = 0; i < hd; i += 8)
        _mm256_storeu_ps(qf + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(q + i), 0)));
    float mx = -INFINITY;
    for (int j = 0; j < n; ++j) {
        if (j < j0 || j >= j1) { s[j] = -INFINITY; continue; }
        const uint16_t *k = kc + (int64_t)j * stride;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int i = 0; i < hd; i += 8) {
            const int c = single ? (i >> 3) & 3 : 0;
            acc[c] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i))),
                                     _mm256_loadu_ps(qf + i), acc[c]);
        }
        s[j] = (single ? rase_avx2_reduce4(acc[0], acc[1], acc[2], acc[3]) : rase_avx2_hsum(acc[0])) * scale;
        if (s[j] > mx) mx = s[j];
    }
    double sum = 0.0;
    for (int j = 0; j < n; j += 8) {
        const __m256 e = rase_avx2_expf(_mm256_sub_ps(_mm256_loadu_ps(s + j), _mm256_set1_ps(mx)));
        _mm256_storeu_ps(s + j, e);
        sum += (double)rase_avx2_hsum(e);
    }
    const __m256 inv = _mm256_set1_ps((float)(1.0 / sum));
    for (int j = 0; j < n; j += 8)  // p rounded to f16, kept as f32 values
        _mm256_storeu_ps(s + j, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(s + j), inv), 0)));
    // P.V: partial sums per accumulator slot (position mod `slots`), each a sequential FMA chain
    for (int i = 0; i < slots * hd; i += 8) _mm256_storeu_ps(part + i, _mm256_setzero_ps());
    for (int j = j0; j < j1; ++j) {  // outside [j0, j1) p is 0 and adds nothing
        const __m256 p = _mm256_set1_ps(s[j]);
        const uint16_t *v = vc + (int64_t)j * stride;
        float *acc = part + (j & (slots - 1)) * hd;
        for (int i = 0; i < hd; i += 8)
            _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i))), p,
                                                      _mm256_loadu_ps(acc + i)));
    }
    for (int i = 0; i < hd; i += 8) {  // lane l of accumulator c holds slot 8c + l; reduce as ggml
        __m256 z[8];
        for (int l = 0; l < 8; ++l) {
            const float *pl = part + l * hd + i;
            z[l] = single ? _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(pl), _mm256_loadu_ps(pl + 16 * hd)),
                                          _mm256_add_ps(_mm256_loadu_ps(pl + 8 * hd), _mm256_loadu_ps(pl + 24 * hd)))
                          : _mm256_loadu_ps(pl);
        }
        __m256 r;
        if (single) {  // 128-bit halves, then two hadds: (z0+z4 + z1+z5) + (z2+z6 + z3+z7)
            r = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(z[0], z[4]), _mm256_add_ps(z[1], z[5])),
                              _mm256_add_ps(_mm256_add_ps(z[2], z[6]), _mm256_add_ps(z[3], z[7])));
        } else {       // hi+lo halves, movehl, movehdup: ((z4+z0) + (z6+z2)) + ((z5+z1) + (z7+z3))
            r = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(z[4], z[0]), _mm256_add_ps(z[6], z[2])),
                              _mm256_add_ps(_mm256_add_ps(z[5], z[1]), _mm256_add_ps(z[7], z[3])));
        }
        _mm256_storeu_ps(out + i, r);
    }
}
#endif

// single: the query is evaluated alone (decode), not as part of a batch (see attend_avx2)
static void rase_attend(const float *q, const uint16_t *kc, const uint16_t *vc, int64_t stride, int j0,
                        int j1, int hd, float scale, float *scratch, float *out, int isa, int single) {
#if RASE_HAVE_X86
    if (isa == RASE_ISA_AVX2 && hd % 32 == 0) { attend_avx2(q, kc, vc, stride, j0, j1, hd, scale, scratch, out, single); return; }
#endif
    attend_ref(q, kc, vc, stride, j0, j1, hd, scale, scratch, out);
}

// rotate one head (n_rot leading dims) with the table row cs = (cos, sin) x n_rot/2
static void rope_ref(float *x, const float *cs, int n_rot, int neox) {
    const int half = n_rot / 2;
    for (int i = 0; i < half; ++i) {
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float c = cs[2 * i], s = cs[2 * i + 1], x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

#if RASE_HAVE_X86
// the same rotation with the FMA contraction ggml's compiled rope has: x0*c - (x1*s) fused
RASE_TARGET_AVX2 static void rope_avx2(float *x, const float *cs, int n_rot, int neox) {
    const int half = n_rot / 2;
    for (int i = 0; i < half; ++i) {
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float c = cs[2 * i], s = cs[2 * i + 1], x0 = x[a], x1 = x[b];
        x[a] = __builtin_fmaf(x0, c, -(x1 * s));
        x[b] = __builtin_fmaf(x0, s, x1 * c);
    }
}
#endif

static void rase_rope(float *x, const float *cs, int n_rot, int neox, int isa) {
#if RASE_HAVE_X86
    if (isa == RASE_ISA_AVX2) { rope_avx2(x, cs, n_rot, neox); return; }
#endif
    rope_ref(x, cs, n_rot, neox);
}

// ggml's theta: theta_i = pos * base^(-2i/n_rot), built by repeated multiplication in f32
static void rase_rope_table(float *cs, int pos, int n_rot, float base, float freq_scale) {
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    for (int i = 0; i < n_rot / 2; ++i) {
        const float t = freq_scale * theta;
        cs[2 * i] = cosf(t);
        cs[2 * i + 1] = sinf(t);
        theta *= theta_scale;
    }
}

// ---------------------------------------------------------------- matmul over quantized activations

static void rase_sync(rase_model *m, int ith) {
    rase_barrier_wait(&m->barrier);
    for (int a = 0; a < 2 * ACT_COUNT; ++a) m->act_src[ith * 2 * ACT_COUNT + a] = NULL;
}

// X (T, cols) quantized to activation format `act`, as rows `*astride` bytes apart. One row:
// each thread quantizes it into its own buffer (no barrier). Several rows: the threads split
// them into a shared buffer, then meet at a barrier. Each thread remembers what its buffers
// hold, so matmuls sharing an input (Q/K/V, gate/up) quantize it once; rase_sync forgets.
static const uint8_t *rase_quantize_input(rase_model *m, int act, const float *X, int T, int64_t cols,
                                          int ith, int nth, size_t *astride) {
    const rase_quant_fn quant = rase_act_quant_for(act, m->isa);
    const size_t row = rase_act_bytes(act, cols);
    *astride = row;
    const float **src = m->act_src + ith * 2 * ACT_COUNT;
    if (T == 1) {
        uint8_t *buf = m->act + ((size_t)ith * ACT_COUNT + act) * m->act_stride;
        if (src[act] != X) { quant(X, buf, cols); src[act] = X; }
        return buf;
    }
    uint8_t *buf = m->act_rows + (size_t)act * m->max_batch * m->act_stride;
    if (src[ACT_COUNT + act] != X) {
        int64_t lo, hi;
        rase_split(T, ith, nth, &lo, &hi);
        for (int64_t t = lo; t < hi; ++t) quant(X + t * cols, buf + t * row, cols);
        rase_barrier_wait(&m->barrier);
        src[ACT_COUNT + act] = X;
    }
    return buf;
}

#ifndef RASE_PREFETCH_GROUPS
#define RASE_PREFETCH_GROUPS 4  // row groups ahead that decode prefetches (2 and 4 measured alike here)
#endif

// Y (T, rows) = X (T, cols) w^T for this thread's rows [lo, hi). Each weight row is read once
// and dotted with up to RASE_NT tokens at a time; per token the arithmetic does not depend on T.
static void rase_matmul(rase_model *m, const rase_mat *w, const float *X, int T, float *Y, int ith,
                        int nth, int64_t *lo, int64_t *hi) {
    size_t as;
    const uint8_t *A = rase_quantize_input(m, DOT_TRAITS[w->type].act, X, T, w->cols, ith, nth, &as);
    rase_dotn_fn dotn_full, dotn_tail;
    rase_dotn_plan(w->type, m->isa, w->rows, T, &dotn_full, &dotn_tail);
    rase_split(w->rows, ith, nth, lo, hi);
    float out[RASE_NT];
    const rase_dotr_fn dotr = m->isa == RASE_ISA_AVX2 ? DOT_TRAITS[w->type].dotr : 0;
    if (T == 1 && dotr) {  // decode: RASE_NR rows at a time keep several FMA chains in flight
        const int64_t group = RASE_NR * w->row_bytes;
        for (int64_t r = *lo; r < *hi; r += RASE_NR) {
            const int nr = *hi - r < RASE_NR ? (int)(*hi - r) : RASE_NR;
            const uint8_t *g = w->data + r * w->row_bytes;
            if (r + RASE_PREFETCH_GROUPS * RASE_NR < *hi)  // hide DRAM latency behind this group
                for (int64_t off = 0; off < group; off += 64) rase_prefetch(g + RASE_PREFETCH_GROUPS * group + off);
            dotr(w->cols, g, w->row_bytes, nr, A, Y + r);
        }
        return;
    }
    for (int64_t r = *lo; r < *hi; ++r) {
        const uint8_t *wr = w->data + r * w->row_bytes;
        for (int t0 = 0; t0 < T; t0 += RASE_NT) {
            const int nt = T - t0 < RASE_NT ? T - t0 : RASE_NT;
            (nt == RASE_NT ? dotn_full : dotn_tail)(w->cols, wr, A + (size_t)t0 * as, as, nt, out);
            for (int j = 0; j < nt; ++j) Y[(int64_t)(t0 + j) * w->rows + r] = out[j];
        }
    }
}

// ---------------------------------------------------------------- the forward

#include <time.h>
static inline int64_t rase_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
// thread 0 times the ops between barriers (their wall time) when profiling
#define RASE_PROF_START(m, ith) const int64_t prof_t0 = ((m)->profile && (ith) == 0) ? rase_now_ns() : 0
#define RASE_PROF_ADD(m, ith, field) do { if ((m)->profile && (ith) == 0) (m)->field += rase_now_ns() - prof_t0; } while (0)

// x[t] += post_norm ? rmsnorm(o[t]) : o[t] for this thread's tokens, then (next_norm) h[t] =
// rmsnorm(x[t]); a barrier after.
static void rase_residual(rase_model *m, const float *post_norm, const float *next_norm, int T, int ith,
                          int nth) {
    const int E = m->n_embd;
    int64_t lo, hi;
    rase_split(T, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; ++t) {
        float *o = m->o + t * E, *x = m->x + t * E;
        if (post_norm) rase_rmsnorm(o, post_norm, o, E, m->eps);
        for (int i = 0; i < E; ++i) x[i] += o[i];
        if (next_norm) rase_rmsnorm(x, next_norm, m->h + t * E, E, m->eps);
    }
    rase_sync(m, ith);
}

static void rase_layer_forward(rase_model *m, const rase_layer *L, int il, int T, int pos0, int ith,
                               int nth) {
    const int E = m->n_embd, hd = m->head_dim, nh = m->n_head, nkv = m->n_head_kv;
    const int64_t nq = (int64_t)nh * hd, nk = (int64_t)nkv * hd;
    const int64_t half_rot = m->n_rot / 2;
    int64_t lo, hi;
    // 1. attention norm, rows split by token
    rase_split(T, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; ++t) rase_rmsnorm(m->x + t * E, L->attn_norm, m->h + t * E, E, m->eps);
    rase_sync(m, ith);
    // 2. Q, K, V projections share the normed input
    {
        RASE_PROF_START(m, ith);
        rase_matmul(m, &L->wq, m->h, T, m->q, ith, nth, &lo, &hi);
        rase_matmul(m, &L->wk, m->h, T, m->k, ith, nth, &lo, &hi);
        rase_matmul(m, &L->wv, m->h, T, m->v, ith, nth, &lo, &hi);
        rase_sync(m, ith);
        RASE_PROF_ADD(m, ith, prof_matmul_ns);
    }
    // 3. per (token, head): QK-norm, RoPE; K and V go to the f16 cache
    uint16_t *kc = m->k_cache + (size_t)il * m->n_ctx * nk, *vc = m->v_cache + (size_t)il * m->n_ctx * nk;
    const float *rope = m->rope + (size_t)L->rope_slot * m->max_batch * half_rot * 2;
    rase_split((int64_t)T * (nh + nkv), ith, nth, &lo, &hi);
    for (int64_t w = lo; w < hi; ++w) {
        const int t = (int)(w / (nh + nkv)), hh = (int)(w % (nh + nkv));
        const float *cs = rope + (size_t)t * half_rot * 2;
        if (hh < nh) {
            float *qh = m->q + t * nq + (int64_t)hh * hd;
            if (L->q_norm) rase_rmsnorm(qh, L->q_norm, qh, hd, m->eps);
            rase_rope(qh, cs, m->n_rot, m->rope_neox, m->isa);
            if (m->attn_prescale)
                for (int i = 0; i < hd; ++i) qh[i] *= m->attn_scale;
        } else {
            const int kh = hh - nh;
            float *khd = m->k + t * nk + (int64_t)kh * hd;
            const float *vh = m->v + t * nk + (int64_t)kh * hd;
            if (L->k_norm) rase_rmsnorm(khd, L->k_norm, khd, hd, m->eps);
            rase_rope(khd, cs, m->n_rot, m->rope_neox, m->isa);
            uint16_t *kd = kc + (size_t)(pos0 + t) * nk + (int64_t)kh * hd;
            uint16_t *vd = vc + (size_t)(pos0 + t) * nk + (int64_t)kh * hd;
            for (int i = 0; i < hd; ++i) { kd[i] = rase_fp32_to_fp16(khd[i]); vd[i] = rase_fp32_to_fp16(vh[i]); }
        }
    }
    rase_sync(m, ith);
    // 4. attention per (token, query head), dealt round-robin: later tokens attend to more
    // positions, so contiguous ranges would leave the first thread idle
    const int group = nh / nkv;
    {
    RASE_PROF_START(m, ith);
    for (int64_t w = ith; w < (int64_t)T * nh; w += nth) {
        const int t = (int)(w / nh), hh = (int)(w % nh), p = pos0 + t;
        const int j0 = L->window > 0 && p - L->window + 1 > 0 ? p - L->window + 1 : 0;
        const int64_t koff = (int64_t)(hh / group) * hd;
        rase_attend(m->q + t * nq + (int64_t)hh * hd, kc + koff, vc + koff, nk, j0, p + 1, hd,
                    m->attn_prescale ? 1.0f : m->attn_scale, m->scores + (size_t)ith * m->attn_stride,
                    m->att + t * nq + (int64_t)hh * hd, m->isa, T == 1);
    }
    rase_sync(m, ith);
    RASE_PROF_ADD(m, ith, prof_attn_ns);
    }
    // 5. output projection
    {
        RASE_PROF_START(m, ith);
        rase_matmul(m, &L->wo, m->att, T, m->o, ith, nth, &lo, &hi);
        rase_sync(m, ith);
        RASE_PROF_ADD(m, ith, prof_matmul_ns);
    }
    // 6. (post-attention norm), residual, FFN norm
    rase_residual(m, L->post_attn_norm, L->ffn_norm, T, ith, nth);
    // 7. gate and up over the same rows, then act(gate) * up on those rows
    {
    RASE_PROF_START(m, ith);
    rase_matmul(m, &L->wgate, m->h, T, m->g, ith, nth, &lo, &hi);
    rase_matmul(m, &L->wup, m->h, T, m->u, ith, nth, &lo, &hi);
    for (int t = 0; t < T; ++t)
        rase_gate(m->g + (int64_t)t * m->n_ff + lo, m->u + (int64_t)t * m->n_ff + lo, hi - lo, m->gelu_table, m->isa);
    rase_sync(m, ith);
    // 8. down projection
    rase_matmul(m, &L->wdown, m->g, T, m->o, ith, nth, &lo, &hi);
    rase_sync(m, ith);
    RASE_PROF_ADD(m, ith, prof_matmul_ns);
    }
    // 9. (post-FFN norm), residual
    rase_residual(m, L->post_ffn_norm, 0, T, ith, nth);
}

// Evaluate tokens[0..T) at positions pos0..; T <= max_batch, pos0 + T <= n_ctx and every
// token < n_vocab (the caller checks). logits: (n_out, n_vocab) for the last n_out tokens.
static void rase_forward(rase_model *m, const int32_t *tokens, int T, int pos0, float *logits, int n_out) {
    const int E = m->n_embd;
    const int64_t half_rot = m->n_rot / 2;
    const int nslots = m->rope_base[1] > 0.0f ? 2 : 1;
#pragma omp parallel num_threads(m->n_threads)
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
        }  // implicit barrier: every thread sees n
        for (int a = 0; a < 2 * ACT_COUNT; ++a) m->act_src[ith * 2 * ACT_COUNT + a] = NULL;
        int64_t lo, hi;
        rase_split(T, ith, nth, &lo, &hi);
        const rase_dequant_fn deq = rase_dequant_for(m->tok_embd.type, m->isa);
        for (int64_t t = lo; t < hi; ++t) {
            float *x = m->x + t * E;
            deq(m->tok_embd.data + (int64_t)tokens[t] * m->tok_embd.row_bytes, x, E);
            if (m->embd_scale != 1.0f)
                for (int i = 0; i < E; ++i) x[i] *= m->embd_scale;
            for (int s = 0; s < nslots; ++s)
                rase_rope_table(m->rope + ((size_t)s * m->max_batch + t) * half_rot * 2, pos0 + (int)t,
                                m->n_rot, m->rope_base[s], m->rope_freq_scale[s]);
        }
        rase_sync(m, ith);
        for (int il = 0; il < m->n_layer; ++il) {
            rase_layer_forward(m, &m->layers[il], il, T, pos0, ith, nth);
            if (m->trace && ith == 0) memcpy(m->trace + (size_t)il * T * E, m->x, (size_t)T * E * sizeof(float));
        }
        // final norm and LM head for the last n_out tokens (matvec: one row of logits each)
        rase_split(n_out, ith, nth, &lo, &hi);
        for (int64_t j = lo; j < hi; ++j) {
            const int64_t t = T - n_out + j;
            rase_rmsnorm(m->x + t * E, m->output_norm, m->h + t * E, E, m->eps);
        }
        rase_sync(m, ith);
        rase_matmul(m, &m->output, m->h + (int64_t)(T - n_out) * E, n_out, logits, ith, nth, &lo, &hi);
    }
}

#endif  // RASE_FORWARD_H
