// rase/kernels/_dot.h: activation quantizers and weight-row x activation dot products.
//
// Decode quantizes an activation vector x (f32, n elements) once per matmul input into the
// format its weights pair with (ggml's vec_dot_type): Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for
// Q4_1/Q5_1, Q8_K for the K-quants, plain f32 for F32/F16/BF16. Each dot has a scalar
// reference `vec_dot_<w>_<a>_ref` and an AVX2 version tested against it.
#ifndef RASE_DOT_H
#define RASE_DOT_H

#include "_quants.h"  // the K-quants' scale unpacking

// bytes of one quantized activation row of n elements
static inline size_t rase_act_bytes(int act, int64_t n) {
    switch (act) {
        case ACT_Q8_0: return (size_t)(n / 32) * sizeof(act_q8_0);
        case ACT_Q8_1: return (size_t)(n / 32) * sizeof(act_q8_1);
        case ACT_Q8_K: return (size_t)(n / 256) * sizeof(block_q8_K);
        default: return (size_t)n * sizeof(float);
    }
}

// bytes from one row to the next where several quantized rows lie in one buffer: a row, plus a
// cache line when the row is a multiple of 2 KiB. The GEMM tiles read 6-12 rows side by side; rows
// 4 KiB apart fall in the same L1 sets and evict one another (F16, n = 4096: 65% -> 91% of FMA peak).
static inline size_t rase_act_row_stride(int act, int64_t n) {
    const size_t b = rase_act_bytes(act, n);
    return b % 2048 == 0 ? b + 64 : b;
}

#define RASE_CHUNK_ROWS 32  // rows per unit of matmul work (2 groups of the repacked layout)

// ---------------------------------------------------------------- activation quantizers
// Rounding is nearest-even in both paths (nearbyintf / _MM_FROUND_TO_NEAREST_INT).

static inline float rase_f16_round(float x) { return rase_fp16_to_fp32(rase_fp32_to_fp16(x)); }

static void act_q8_0_starts(act_q8_0 *y) {
    y->m8 = 0;
    for (int s = 0; s < 8; ++s) {
        const int32_t sum = y->qs[4 * s] + y->qs[4 * s + 1] + y->qs[4 * s + 2] + y->qs[4 * s + 3];
        y->m128[s] = -128 * sum;
        y->m8 += -8 * sum;
    }
}

static void quant_q8_0_ref(const float *x, void *dst, int64_t n) {
    act_q8_0 *y = (act_q8_0 *)dst;
    for (int64_t i = 0; i < n / 32; ++i, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = rase_f16_round(d);
        for (int j = 0; j < 32; ++j) y[i].qs[j] = (int8_t)nearbyintf(x[j] * id);
        act_q8_0_starts(&y[i]);
    }
}

static void quant_q8_1_ref(const float *x, void *dst, int64_t n) {
    act_q8_1 *y = (act_q8_1 *)dst;
    for (int64_t i = 0; i < n / 32; ++i, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; ++j) {
            y[i].qs[j] = (int8_t)nearbyintf(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].d = rase_f16_round(d);
        y[i].s = rase_f16_round((float)sum * d);
    }
}

static void quant_q8_k_ref(const float *x, void *dst, int64_t n) {
    block_q8_K *y = (block_q8_K *)dst;
    for (int64_t i = 0; i < n / 256; ++i, x += 256) {
        float amax = 0.0f;
        for (int j = 0; j < 256; ++j) amax = fmaxf(amax, fabsf(x[j]));
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof(block_q8_K));
            continue;
        }
        const float iscale = 127.0f / amax;
        for (int j = 0; j < 256; ++j) y[i].qs[j] = (int8_t)nearbyintf(iscale * x[j]);
        for (int g = 0; g < 16; ++g) {
            int s = 0;
            for (int l = 0; l < 16; ++l) s += y[i].qs[16 * g + l];
            y[i].bsums[g] = (int16_t)s;
        }
        y[i].d = 1.0f / iscale;
    }
}

static void quant_f32_ref(const float *x, void *dst, int64_t n) { memcpy(dst, x, (size_t)n * 4); }

static void quant_f32c_ref(const float *x, void *dst, int64_t n) {
    float *y = (float *)dst;
    const int64_t S = n / 32;
    for (int64_t s = 0; s < S; ++s)
        for (int j = 0; j < 32; ++j) y[j * S + s] = x[32 * s + j];
}

// ---------------------------------------------------------------- scalar dots (references)


static float vec_dot_f32_f32_ref(int64_t n, const void *w, const void *a) {
    const float *x = (const float *)w, *y = (const float *)a;
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += (double)x[i] * y[i];
    return (float)s;
}

static float vec_dot_f16_f32_ref(int64_t n, const void *w, const void *a) {
    const uint16_t *x = (const uint16_t *)w;
    const float *y = (const float *)a;
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += (double)rase_fp16_to_fp32(x[i]) * y[i];
    return (float)s;
}

static float vec_dot_bf16_f32_ref(int64_t n, const void *w, const void *a) {
    const uint16_t *x = (const uint16_t *)w;
    const float *y = (const float *)a;
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += (double)rase_bf16_to_fp32(x[i]) * y[i];
    return (float)s;
}

// K-quant references: unpack one super-block into integer values q[256], per-16 integer
// scales sc[16] and mins mn[16] plus float d/dmin, so that value = d*sc*q - dmin*mn.
typedef struct { int8_t q[256]; int sc[16], mn[16]; float d, dmin; } rase_kblock;

static void kunpack_q2_k(const void *w, int64_t i, rase_kblock *b) {
    const block_q2_K *x = (const block_q2_K *)w + i;
    b->d = rase_fp16_to_fp32(x->d);
    b->dmin = rase_fp16_to_fp32(x->dmin);
    for (int g = 0; g < 16; ++g) { b->sc[g] = x->scales[g] & 0xF; b->mn[g] = x->scales[g] >> 4; }
    for (int half = 0; half < 2; ++half)
        for (int s = 0; s < 4; ++s)
            for (int l = 0; l < 32; ++l)
                b->q[128 * half + 32 * s + l] = (int8_t)((x->qs[32 * half + l] >> (2 * s)) & 3);
}

static void kunpack_q3_k(const void *w, int64_t i, rase_kblock *b) {
    const block_q3_K *x = (const block_q3_K *)w + i;
    int8_t sc[16];
    rase_q3_k_scales(x->scales, sc);
    b->d = rase_fp16_to_fp32(x->d);
    b->dmin = 0.0f;
    for (int g = 0; g < 16; ++g) { b->sc[g] = sc[g] - 32; b->mn[g] = 0; }
    for (int half = 0; half < 2; ++half)
        for (int s = 0; s < 4; ++s)
            for (int l = 0; l < 32; ++l) {
                const int lo = (x->qs[32 * half + l] >> (2 * s)) & 3;
                const int hi = (x->hmask[l] >> (4 * half + s)) & 1;
                b->q[128 * half + 32 * s + l] = (int8_t)(lo - (hi ? 0 : 4));
            }
}

typedef void (*rase_kunpack_fn)(const void *w, int64_t i, rase_kblock *b);

static inline float rase_kdot_ref(rase_kunpack_fn unpack, int64_t n, const void *w, const void *a) {
    const block_q8_K *y = (const block_q8_K *)a;
    float s = 0.0f;
    rase_kblock b;
    for (int64_t i = 0; i < n / 256; ++i) {
        unpack(w, i, &b);
        int sumi = 0, summ = 0;
        for (int g = 0; g < 16; ++g) {
            int dot = 0;
            for (int l = 0; l < 16; ++l) dot += b.q[16 * g + l] * y[i].qs[16 * g + l];
            sumi += b.sc[g] * dot;
            summ += b.mn[g] * y[i].bsums[g];
        }
        s += y[i].d * (b.d * (float)sumi - b.dmin * (float)summ);
    }
    return s;
}

static float vec_dot_q2_k_q8_k_ref(int64_t n, const void *w, const void *a) { return rase_kdot_ref(kunpack_q2_k, n, w, a); }
static float vec_dot_q3_k_q8_k_ref(int64_t n, const void *w, const void *a) { return rase_kdot_ref(kunpack_q3_k, n, w, a); }

// multi-token dots take up to RASE_NT tokens (every ISA); RASE_ACT: token t's activation block b
#define RASE_NT 8
#define RASE_INLINE __attribute__((always_inline)) inline
#define RASE_ACT(T, t, b) ((const T *)((const char *)a + (size_t)(t) * astride) + (b))

// ---------------------------------------------------------------- AVX2
#if RASE_HAVE_X86


RASE_TARGET_AVX2 static inline int rase_avx2_hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

// signed x signed int8 -> 8 int32 partial sums (lanes 0-3: elements 0-15, 4-7: 16-31)
RASE_TARGET_AVX2 static inline __m256i rase_avx2_dot_i8(__m256i x, __m256i y) {
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

// unsigned (0..63) x signed int8 -> 8 int32 partial sums
RASE_TARGET_AVX2 static inline __m256i rase_avx2_dot_u8(__m256i xu, __m256i y) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(xu, y), _mm256_set1_epi16(1));
}

RASE_TARGET_AVX2 static inline float rase_h2f(uint16_t h) { return _cvtsh_ss(h); }

// -- quantizers

RASE_TARGET_AVX2 static inline __m256i rase_avx2_quant32(const float *x, float id) {
    const __m256 mul = _mm256_set1_ps(id);
    __m256i i[4];
    for (int k = 0; k < 4; ++k)
        i[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), mul),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    // pack to int8 in element order
    const __m256i p16a = _mm256_packs_epi32(i[0], i[1]), p16b = _mm256_packs_epi32(i[2], i[3]);
    const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    return _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

RASE_TARGET_AVX2 static inline float rase_avx2_absmax(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < n; k += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

RASE_TARGET_AVX2 static void quant_q8_0_avx2(const float *x, void *dst, int64_t n) {
    act_q8_0 *y = (act_q8_0 *)dst;
    for (int64_t i = 0; i < n / 32; ++i, x += 32) {
        const float amax = rase_avx2_absmax(x, 32);
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = rase_f16_round(d);
        const __m256i q = rase_avx2_quant32(x, id);
        _mm256_storeu_si256((__m256i *)y[i].qs, q);
        const __m256i sum = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
        _mm256_storeu_si256((__m256i *)y[i].m128, _mm256_mullo_epi32(sum, _mm256_set1_epi32(-128)));
        y[i].m8 = -8 * rase_avx2_hsum_i32(sum);
    }
}

RASE_TARGET_AVX2 static void quant_q8_1_avx2(const float *x, void *dst, int64_t n) {
    act_q8_1 *y = (act_q8_1 *)dst;
    for (int64_t i = 0; i < n / 32; ++i, x += 32) {
        const float amax = rase_avx2_absmax(x, 32);
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const __m256i q = rase_avx2_quant32(x, id);
        _mm256_storeu_si256((__m256i *)y[i].qs, q);
        const int sum = rase_avx2_hsum_i32(_mm256_madd_epi16(
            _mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1)));
        y[i].d = rase_f16_round(d);
        y[i].s = rase_f16_round((float)sum * d);
    }
}

RASE_TARGET_AVX2 static void quant_q8_k_avx2(const float *x, void *dst, int64_t n) {
    block_q8_K *y = (block_q8_K *)dst;
    for (int64_t i = 0; i < n / 256; ++i, x += 256) {
        const float amax = rase_avx2_absmax(x, 256);
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof(block_q8_K));
            continue;
        }
        const float iscale = 127.0f / amax;
        for (int k = 0; k < 8; ++k) {
            const __m256i q = rase_avx2_quant32(x + 32 * k, iscale);
            _mm256_storeu_si256((__m256i *)(y[i].qs + 32 * k), q);
            // sums of 16: maddubs with ones gives pair sums, madd gives quads
            const __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q),
                                                 _mm256_set1_epi16(1));
            int32_t t[8];
            _mm256_storeu_si256((__m256i *)t, s4);
            y[i].bsums[2 * k] = (int16_t)(t[0] + t[1] + t[2] + t[3]);
            y[i].bsums[2 * k + 1] = (int16_t)(t[4] + t[5] + t[6] + t[7]);
        }
        y[i].d = 1.0f / iscale;
    }
}

// -- float weights

// ggml_vec_dot_f32 on AVX2, step for step (llama.cpp's one-token F32 matmul, e.g. MoE routers):
// 4 accumulators over 32-element steps, ggml's reduction (rase_avx2_reduce4), the remaining
// n % 32 products added one by one in f64, rounded to f32 once
RASE_TARGET_AVX2 static float vec_dot_f32_f32_avx2(int64_t n, const void *w, const void *a) {
    const float *x = (const float *)w, *y = (const float *)a;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; ++k)
            acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * k), _mm256_loadu_ps(y + i + 8 * k), acc[k]);
    double s = (double)rase_avx2_reduce4(acc[0], acc[1], acc[2], acc[3]);
    for (; i < n; ++i) s += (double)(x[i] * y[i]);
    return (float)s;
}

RASE_TARGET_AVX2 static float vec_dot_f16_f32_avx2(int64_t n, const void *w, const void *a) {
    const uint16_t *x = (const uint16_t *)w;
    const float *y = (const float *)a;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; ++k)
            acc[k] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i + 8 * k))),
                                     _mm256_loadu_ps(y + i + 8 * k), acc[k]);
    for (; i + 8 <= n; i += 8)
        acc[0] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))), _mm256_loadu_ps(y + i), acc[0]);
    float s = rase_avx2_hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; ++i) s += rase_fp16_to_fp32(x[i]) * y[i];
    return s;
}

RASE_TARGET_AVX2 static float vec_dot_bf16_f32_avx2(int64_t n, const void *w, const void *a) {
    const uint16_t *x = (const uint16_t *)w;
    const float *y = (const float *)a;
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 2; ++k) {
            const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i + 8 * k)));
            acc[k] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), _mm256_loadu_ps(y + i + 8 * k), acc[k]);
        }
    float s = rase_avx2_hsum(_mm256_add_ps(acc[0], acc[1]));
    for (; i < n; ++i) s += rase_bf16_to_fp32(x[i]) * y[i];
    return s;
}

// -- multi-token dots: out[t] = w . a_t for t < nt <= RASE_NT, a_t = a + t * astride bytes.
// Each weight block is unpacked once and reused for every token; per token the arithmetic is
// identical for every nt (so prefill, chunked prefill and decode give the same bits).


// Instantiate NAME(n, w, a, astride, nt, out) for TARGET from NAME##_body specialised for
// nt = 1..RASE_NT (AVX2 kernels: RASE_DOTN, AVX-512 ones: RASE_DOTN512).
#define RASE_DOTN_FOR(NAME, TARGET)                                                           \
    TARGET static void NAME(int64_t n, const void *w, const void *a, size_t astride, int nt, float *out) { \
        RASE_CONST_NT(RASE_NT, nt, NAME##_body, n, w, a, astride, out);                       \
    }
#define RASE_DOTN(NAME) RASE_DOTN_FOR(NAME, RASE_TARGET_AVX2)

// -- K-quants: per 256-block the weights are unpacked to 8 vectors of unsigned values with
// per-16 integer scales; the per-block integer sum folds scales in with madd.

// unsigned q (32 x u8 <= 63) . y (32 x i8), group scales s_lo (elements 0-15), s_hi (16-31)
RASE_TARGET_AVX2 static inline __m256i rase_avx2_kdot(__m256i q, const int8_t *y, int s_lo, int s_hi) {
    const __m256i p16 = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)y));
    const __m256i sc = _mm256_set_m128i(_mm_set1_epi16((short)s_hi), _mm_set1_epi16((short)s_lo));
    return _mm256_madd_epi16(p16, sc);
}

// An unpacked K block: value[32 v + l] = u[v][l] - off, u unsigned; scale per 16 elements;
// result = y.d * (dx * (sum sc*u.y - off * sum sc*bsum) - dmin * sum mn*bsum).
typedef struct { __m256i u[8]; int sc[16], mn[16]; int off; float dx, dmin; } rase_kblock_avx2;

RASE_TARGET_AVX2 static RASE_INLINE void rase_kdotn(const rase_kblock_avx2 *kb, const block_q8_K *y,
                                                     float *acc) {
    __m256i sumi = _mm256_setzero_si256();
    for (int v = 0; v < 8; ++v)
        sumi = _mm256_add_epi32(sumi, rase_avx2_kdot(kb->u[v], y->qs + 32 * v, kb->sc[2 * v], kb->sc[2 * v + 1]));
    int offs = 0, mins = 0;
    for (int g = 0; g < 16; ++g) { offs += kb->sc[g] * y->bsums[g]; mins += kb->mn[g] * y->bsums[g]; }
    *acc += y->d * (kb->dx * (float)(rase_avx2_hsum_i32(sumi) - kb->off * offs) - kb->dmin * (float)mins);
}

#define RASE_KDOT_BODY(NAME, XT, UNPACK)                                                      \
    RASE_TARGET_AVX2 static RASE_INLINE void NAME##_body(const int nt, int64_t n, const void *w, const void *a, \
                                                         size_t astride, float *out) {        \
        const XT *x = (const XT *)w;                                                          \
        float acc[RASE_NT];                                                                   \
        for (int t = 0; t < nt; ++t) acc[t] = 0.0f;                                           \
        rase_kblock_avx2 kb;                                                                  \
        for (int64_t b = 0; b < n / 256; ++b) {                                               \
            RASE_PREFETCH_AHEAD(&x[b], sizeof(XT));                                           \
            UNPACK(&x[b], &kb);                                                               \
            for (int t = 0; t < nt; ++t) rase_kdotn(&kb, RASE_ACT(block_q8_K, t, b), &acc[t]); \
        }                                                                                     \
        for (int t = 0; t < nt; ++t) out[t] = acc[t];                                         \
    }                                                                                         \
    RASE_DOTN(NAME)

RASE_TARGET_AVX2 static RASE_INLINE void kunpack_q2_k_avx2(const block_q2_K *x, rase_kblock_avx2 *kb) {
    for (int g = 0; g < 16; ++g) { kb->sc[g] = x->scales[g] & 0xF; kb->mn[g] = x->scales[g] >> 4; }
    for (int half = 0; half < 2; ++half) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * half));
        for (int k = 0; k < 4; ++k) kb->u[4 * half + k] = rase_avx2_bits(q, 2 * k, 3);
    }
    kb->off = 0;
    kb->dx = rase_h2f(x->d);
    kb->dmin = rase_h2f(x->dmin);
}

RASE_TARGET_AVX2 static RASE_INLINE void kunpack_q3_k_avx2(const block_q3_K *x, rase_kblock_avx2 *kb) {
    int8_t sc[16];
    rase_q3_k_scales(x->scales, sc);
    for (int g = 0; g < 16; ++g) { kb->sc[g] = sc[g] - 32; kb->mn[g] = 0; }
    const __m256i hm = _mm256_loadu_si256((const __m256i *)x->hmask);
    for (int half = 0; half < 2; ++half) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * half));
        for (int k = 0; k < 4; ++k)  // u = low 2 bits + 4 * high bit, value = u - 4
            kb->u[4 * half + k] = _mm256_or_si256(rase_avx2_bits(q, 2 * k, 3),
                                                  _mm256_slli_epi16(rase_avx2_bits(hm, 4 * half + k, 1), 2));
    }
    kb->off = 4;
    kb->dx = rase_h2f(x->d);
    kb->dmin = 0.0f;
}

RASE_KDOT_BODY(dotn_q2_k_avx2, block_q2_K, kunpack_q2_k_avx2)
RASE_KDOT_BODY(dotn_q3_k_avx2, block_q3_K, kunpack_q3_k_avx2)

// -- AVX-512: the F16 row dot and GEMM (the K-quants with AVX-512 kernels run repacked)
#define RASE_DOTN512(NAME) RASE_DOTN_FOR(NAME, RASE_TARGET_AVX512)

// F16 on AVX-512: zmm 0 holds ggml's accumulators 0 | 1, zmm 1 holds 2 | 3, so each lane runs the
// chain of vec_dot_f16_f32_avx2 (the same bits); one conversion of the weights serves every token.
RASE_TARGET_AVX512 static RASE_INLINE void dotn_f16_512_body(const int nt, int64_t n, const void *w, const void *a,
                                                           size_t astride, float *out) {
    const uint16_t *x = (const uint16_t *)w;
    __m512 z0[RASE_NT], z1[RASE_NT];
    for (int t = 0; t < nt; ++t) z0[t] = z1[t] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        RASE_PREFETCH_AHEAD(x + i, 64);
        const __m512 w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i)));
        const __m512 w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i + 16)));
        for (int t = 0; t < nt; ++t) {
            const float *y = (const float *)((const char *)a + (size_t)t * astride);
            z0[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(y + i), z0[t]);
            z1[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(y + i + 16), z1[t]);
        }
    }
    for (int t = 0; t < nt; ++t) {
        const float *y = (const float *)((const char *)a + (size_t)t * astride);
        __m256 a0 = _mm512_castps512_ps256(z0[t]), a2 = _mm512_castps512_ps256(z1[t]);
        const __m256 a1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(z0[t]), 1));
        const __m256 a3 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(z1[t]), 1));
        int64_t j = i;
        for (; j + 8 <= n; j += 8)
            a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + j))), _mm256_loadu_ps(y + j), a0);
        float s = rase_avx2_hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        for (; j < n; ++j) s += rase_fp16_to_fp32(x[j]) * y[j];
        out[t] = s;
    }
}
RASE_DOTN512(dotn_f16_512)

// F16 GEMM, chain by chain. vec_dot_f16_f32_avx2 is 32 FMA chains per output, chain j over
// the columns 32s + j (s = 0 .. n/32 - 1), then a fixed tree over the chains. Here a zmm lane
// holds one row's chain j instead: 16 rows x 1 chain per register, so 2 row registers x 6 tokens
// make 12 outputs per 12 accumulators (AVX-512 runs two chains at once: 24), where holding every
// chain of an output in registers (2 zmm each) made 12 outputs per 2 x 2 x 6. Weights: the
// 32-row chunk's panel in f32, chain-major (work[(j * S + s) * 32 + r], built here);
// activations: ACT_F32C rows, chain-major (y[j * S + s]). Same fma order per chain, same tree:
// the same bits as vec_dot_f16_f32_avx2. Needs n % 32 == 0 (rase_rows_for).
#define RASE_F16_TT 6  // tokens per tile
// t[j] lane i = r[i] lane j (16 x 16 f32): 32-bit, 64-bit, then 128-bit interleaves
RASE_TARGET_AVX512 static RASE_INLINE void rase_transpose16_512(const __m512 *r, __m512 *t) {
    __m512 a[16], b[16];
    for (int i = 0; i < 8; ++i) {  // a[2i], a[2i+1] lane L: r[2i], r[2i+1] at 4L, 4L+1 | 4L+2, 4L+3
        a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i)  // b[4i + c] lane L: r[4i .. 4i + 3] at column 4L + c
        for (int h = 0; h < 2; ++h) {
            const __m512d x = _mm512_castps_pd(a[4 * i + h]), y = _mm512_castps_pd(a[4 * i + 2 + h]);
            b[4 * i + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(x, y));
            b[4 * i + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x, y));
        }
    for (int c = 0; c < 4; ++c) {  // t[4L + c] = lanes L of b[c], b[4 + c], b[8 + c], b[12 + c]
        const __m512 d0 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x88), d1 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xdd);
        const __m512 d2 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x88);
        const __m512 d3 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xdd);
        t[c] = _mm512_shuffle_f32x4(d0, d2, 0x88);
        t[8 + c] = _mm512_shuffle_f32x4(d0, d2, 0xdd);
        t[4 + c] = _mm512_shuffle_f32x4(d1, d3, 0x88);
        t[12 + c] = _mm512_shuffle_f32x4(d1, d3, 0xdd);
    }
}

// P[(j * S + s) * 32 + r] = f32(row r0 + r at column 32s + j): 16 x 16 blocks transposed
RASE_TARGET_AVX512 static void rase_f16_panel_512(int64_t n, const uint8_t *data, int64_t row_bytes, int64_t r0,
                                                  int R, float *P) {
    const int64_t S = n / 32;
    const uint16_t *x[32];
    for (int r = 0; r < 32; ++r)  // rows past R repeat row r0: computed, never stored
        x[r] = (const uint16_t *)(data + (r0 + (r < R ? r : 0)) * row_bytes);
    for (int64_t s = 0; s < S; ++s)
        for (int rb = 0; rb < 32; rb += 16)
            for (int jb = 0; jb < 32; jb += 16) {
                __m512 v[16], t[16];
                for (int i = 0; i < 16; ++i)
                    v[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x[rb + i] + 32 * s + jb)));
                rase_transpose16_512(v, t);
                for (int j = 0; j < 16; ++j) _mm512_storeu_ps(P + ((jb + j) * S + s) * 32 + rb, t[j]);
            }
}

// o0[2t + h], o1[2t + h] = chains j and j + 8 of rows 16h .. 16h + 15 for token t: each an fma
// chain over s in order, from 0. Two chains per pass (24 of 32 zmm accumulating): a pass's
// fixed cost (drain, stores, loop exit) is spread over twice the FMAs.
RASE_TARGET_AVX512 static RASE_INLINE void rase_f16_chain2_512(const int nt, int64_t S, const float *Pj,
                                                             const float *const *y, __m512 *o0, __m512 *o1) {
    const float *Pk = Pj + 8 * S * 32;  // chain j + 8's panel
    const int64_t yk = 8 * S;           // and its activations, from chain j's
    __m512 a0[RASE_F16_TT], a1[RASE_F16_TT], b0[RASE_F16_TT], b1[RASE_F16_TT];
    for (int t = 0; t < nt; ++t) a0[t] = a1[t] = b0[t] = b1[t] = _mm512_setzero_ps();
    for (int64_t s = 0; s < S; ++s) {
        const __m512 w0 = _mm512_loadu_ps(Pj + s * 32), w1 = _mm512_loadu_ps(Pj + s * 32 + 16);
        const __m512 x0 = _mm512_loadu_ps(Pk + s * 32), x1 = _mm512_loadu_ps(Pk + s * 32 + 16);
        for (int t = 0; t < nt; ++t) {
            const __m512 ya = _mm512_set1_ps(y[t][s]), yb = _mm512_set1_ps(y[t][yk + s]);
            a0[t] = _mm512_fmadd_ps(w0, ya, a0[t]);
            a1[t] = _mm512_fmadd_ps(w1, ya, a1[t]);
            b0[t] = _mm512_fmadd_ps(x0, yb, b0[t]);
            b1[t] = _mm512_fmadd_ps(x1, yb, b1[t]);
        }
    }
    for (int t = 0; t < nt; ++t) o0[2 * t] = a0[t], o0[2 * t + 1] = a1[t], o1[2 * t] = b0[t], o1[2 * t + 1] = b1[t];
}

// nt tokens (y[t]: ACT_F32C rows) x the chunk's R rows into Y[t * ys + r0 ..]: the 32 chains
// in the order of the tree, (c_l + c_l+8) + (c_l+16 + c_l+24) = lane l of ggml's 4-accumulator
// sum, then rase_avx2_hsum's ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))
RASE_TARGET_AVX512 static RASE_INLINE void rase_f16_tile_512(const int nt, int64_t S, const float *P,
                                                           const float *const *y, float *Y, int64_t ys, int R) {
    __m512 v[8][2 * RASE_F16_TT], c[2 * RASE_F16_TT], d[2 * RASE_F16_TT];
    const float *yj[RASE_F16_TT];
    for (int l = 0; l < 8; ++l) {
        for (int q = 0; q < 4; q += 2) {  // chains l + 8q and l + 8q + 8
            const int j = l + 8 * q;
            for (int t = 0; t < nt; ++t) yj[t] = y[t] + j * S;
            rase_f16_chain2_512(nt, S, P + j * S * 32, yj, c, d);
            if (q == 0)
                for (int i = 0; i < 2 * nt; ++i) v[l][i] = _mm512_add_ps(c[i], d[i]);
            else
                for (int i = 0; i < 2 * nt; ++i) v[l][i] = _mm512_add_ps(v[l][i], _mm512_add_ps(c[i], d[i]));
        }
    }
    for (int i = 0; i < 2 * nt; ++i) {
        const int rem = R - 16 * (i & 1);
        if (rem <= 0) continue;
        const __m512 o = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(v[0][i], v[4][i]), _mm512_add_ps(v[2][i], v[6][i])),
                                       _mm512_add_ps(_mm512_add_ps(v[1][i], v[5][i]), _mm512_add_ps(v[3][i], v[7][i])));
        _mm512_mask_storeu_ps(Y + (int64_t)(i >> 1) * ys + 16 * (i & 1), rem >= 16 ? 0xFFFF : (__mmask16)((1u << rem) - 1), o);
    }
}

// rows [r0, r1) (r1 - r0 <= 32) x T tokens of ACT_F32C rows A; work: 32 * n floats. One driver
// per ISA: the chunk's panel once, then tiles of RASE_F16_TT tokens (nt a constant for the chains).
#define RASE_F16_ROWS(NAME, TARGET, PANEL, TILE)                                                    \
    TARGET static void NAME(int64_t n, const uint8_t *data, int64_t row_bytes, int64_t r0, int64_t r1,  \
                            const uint8_t *A, size_t as, int T, float *Y, int64_t ys, float *work) {    \
        const int R = (int)(r1 - r0);                                                                \
        PANEL(n, data, row_bytes, r0, R, work);                                                      \
        for (int t0 = 0; t0 < T; t0 += RASE_F16_TT) {                                                \
            const int nt = T - t0 < RASE_F16_TT ? T - t0 : RASE_F16_TT;                              \
            const float *y[RASE_F16_TT];                                                             \
            for (int t = 0; t < nt; ++t) y[t] = (const float *)(A + (size_t)(t0 + t) * as);          \
            RASE_CONST_NT(RASE_F16_TT, nt, TILE, n / 32, work, y, Y + (int64_t)t0 * ys + r0, ys, R);   \
        }                                                                                            \
    }
_Static_assert(RASE_CHUNK_ROWS == 32, "the F16 panel holds one 32-row chunk");
RASE_F16_ROWS(rase_f16_rows_512, RASE_TARGET_AVX512, rase_f16_panel_512, rase_f16_tile_512)

// The same GEMM on AVX2: a ymm lane per row, 16 rows (2 ymm) x 6 tokens per chain pass (12 of
// 16 ymm), the chunk's two 16-row halves one after the other; the same panel, chains and tree.
RASE_TARGET_AVX2 static RASE_INLINE void rase_transpose8_avx2(const __m256 *r, __m256 *t) {
    __m256 a[8], b[8];
    for (int i = 0; i < 4; ++i) {
        a[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i)
        for (int h = 0; h < 2; ++h) {
            b[4 * i + 2 * h] = _mm256_shuffle_ps(a[4 * i + h], a[4 * i + 2 + h], 0x44);
            b[4 * i + 2 * h + 1] = _mm256_shuffle_ps(a[4 * i + h], a[4 * i + 2 + h], 0xEE);
        }
    for (int c = 0; c < 4; ++c) {
        t[c] = _mm256_permute2f128_ps(b[c], b[4 + c], 0x20);
        t[4 + c] = _mm256_permute2f128_ps(b[c], b[4 + c], 0x31);
    }
}

RASE_TARGET_AVX2 static void rase_f16_panel_avx2(int64_t n, const uint8_t *data, int64_t row_bytes, int64_t r0,
                                                 int R, float *P) {
    const int64_t S = n / 32;
    const uint16_t *x[32];
    for (int r = 0; r < 32; ++r) x[r] = (const uint16_t *)(data + (r0 + (r < R ? r : 0)) * row_bytes);
    for (int64_t s = 0; s < S; ++s)
        for (int rb = 0; rb < 32; rb += 8)
            for (int jb = 0; jb < 32; jb += 8) {
                __m256 v[8], t[8];
                for (int i = 0; i < 8; ++i)
                    v[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x[rb + i] + 32 * s + jb)));
                rase_transpose8_avx2(v, t);
                for (int j = 0; j < 8; ++j) _mm256_storeu_ps(P + ((jb + j) * S + s) * 32 + rb, t[j]);
            }
}

// out[4t + 2h + e] = chain j of rows 16h + 8e .. + 7 for token t (Pj: the chain's panel at half h)
RASE_TARGET_AVX2 static RASE_INLINE void rase_f16_chain_avx2(const int nt, int64_t S, const float *Pj,
                                                           const float *const *y, int h, __m256 *out) {
    __m256 a0[RASE_F16_TT], a1[RASE_F16_TT];
    for (int t = 0; t < nt; ++t) a0[t] = a1[t] = _mm256_setzero_ps();
    for (int64_t s = 0; s < S; ++s) {
        const __m256 w0 = _mm256_loadu_ps(Pj + s * 32), w1 = _mm256_loadu_ps(Pj + s * 32 + 8);
        for (int t = 0; t < nt; ++t) {
            const __m256 yb = _mm256_broadcast_ss(y[t] + s);
            a0[t] = _mm256_fmadd_ps(w0, yb, a0[t]);
            a1[t] = _mm256_fmadd_ps(w1, yb, a1[t]);
        }
    }
    for (int t = 0; t < nt; ++t) out[4 * t + 2 * h] = a0[t], out[4 * t + 2 * h + 1] = a1[t];
}

RASE_TARGET_AVX2 static RASE_INLINE void rase_f16_tile_avx2(const int nt, int64_t S, const float *P,
                                                          const float *const *y, float *Y, int64_t ys, int R) {
    __m256 v[8][4 * RASE_F16_TT], c[4 * RASE_F16_TT], d[4 * RASE_F16_TT];
    const float *yj[RASE_F16_TT];
    for (int l = 0; l < 8; ++l) {
        for (int q = 0; q < 4; ++q) {
            const int j = l + 8 * q;
            for (int t = 0; t < nt; ++t) yj[t] = y[t] + j * S;
            __m256 *o = q == 0 ? c : q == 2 ? v[l] : d;
            for (int h = 0; h < 2; ++h) rase_f16_chain_avx2(nt, S, P + j * S * 32 + 16 * h, yj, h, o);
            if (q == 1)
                for (int i = 0; i < 4 * nt; ++i) c[i] = _mm256_add_ps(c[i], d[i]);
            if (q == 3)
                for (int i = 0; i < 4 * nt; ++i) v[l][i] = _mm256_add_ps(c[i], _mm256_add_ps(v[l][i], d[i]));
        }
    }
    for (int i = 0; i < 4 * nt; ++i) {
        const int r = 8 * (i & 3);
        if (r >= R) continue;
        const __m256 o = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v[0][i], v[4][i]), _mm256_add_ps(v[2][i], v[6][i])),
                                       _mm256_add_ps(_mm256_add_ps(v[1][i], v[5][i]), _mm256_add_ps(v[3][i], v[7][i])));
        float *dst = Y + (int64_t)(i >> 2) * ys + r;
        if (R - r >= 8) {
            _mm256_storeu_ps(dst, o);
        } else {
            float tmp[8];
            _mm256_storeu_ps(tmp, o);
            for (int e = 0; e < R - r; ++e) dst[e] = tmp[e];
        }
    }
}

RASE_F16_ROWS(rase_f16_rows_avx2, RASE_TARGET_AVX2, rase_f16_panel_avx2, rase_f16_tile_avx2)
#undef RASE_F16_ROWS

// ACT_F32C rows: quant_f32c_ref's permutation (y[j * S + s] = x[32 s + j]) as 8 x 8 transposes
// of x seen as S rows of 32 columns; 4.5-5.6x the scalar moves, which cost ~2% of an F16 prefill
// (AVX-512's 16 x 16 blocks were slower: S is 18 or 48 rows here, and zmm shuffles count twice)
RASE_TARGET_AVX2 static void quant_f32c_avx2(const float *x, void *dst, int64_t n) {
    float *y = (float *)dst;
    const int64_t S = n / 32;
    int64_t s0 = 0;
    for (; s0 + 8 <= S; s0 += 8)
        for (int j0 = 0; j0 < 32; j0 += 8) {
            __m256 v[8], t[8];
            for (int i = 0; i < 8; ++i) v[i] = _mm256_loadu_ps(x + 32 * (s0 + i) + j0);
            rase_transpose8_avx2(v, t);
            for (int j = 0; j < 8; ++j) _mm256_storeu_ps(y + (j0 + j) * S + s0, t[j]);
        }
    for (; s0 < S; ++s0)
        for (int j = 0; j < 32; ++j) y[j * S + s0] = x[32 * s0 + j];
}

// -- float weights: the row stays in L1 across tokens
#define RASE_FLOAT_DOTN(NAME, SINGLE)                                                          \
    RASE_TARGET_AVX2 static void NAME(int64_t n, const void *w, const void *a, size_t astride, \
                                      int nt, float *out) {                                   \
        for (int t = 0; t < nt; ++t) out[t] = SINGLE(n, w, (const char *)a + (size_t)t * astride); \
    }
RASE_FLOAT_DOTN(dotn_f32_avx2, vec_dot_f32_f32_avx2)
RASE_FLOAT_DOTN(dotn_f16_avx2, vec_dot_f16_f32_avx2)
RASE_FLOAT_DOTN(dotn_bf16_avx2, vec_dot_bf16_f32_avx2)
#endif

// ---------------------------------------------------------------- scalar multi-token dots

#define RASE_REF_DOTN(NAME, SINGLE)                                                            \
    static void NAME(int64_t n, const void *w, const void *a, size_t astride, int nt, float *out) { \
        for (int t = 0; t < nt; ++t) out[t] = SINGLE(n, w, (const char *)a + (size_t)t * astride); \
    }
RASE_REF_DOTN(dotn_f32_ref, vec_dot_f32_f32_ref)
RASE_REF_DOTN(dotn_f16_ref, vec_dot_f16_f32_ref)
RASE_REF_DOTN(dotn_bf16_ref, vec_dot_bf16_f32_ref)
RASE_REF_DOTN(dotn_q2_k_ref, vec_dot_q2_k_q8_k_ref)
RASE_REF_DOTN(dotn_q3_k_ref, vec_dot_q3_k_q8_k_ref)

// ---------------------------------------------------------------- activation quantizers, by format

static const rase_quant_fn ACT_QUANT[ACT_COUNT][RASE_ISA_COUNT] = {
    [ACT_F32] = {quant_f32_ref, quant_f32_ref},
    [ACT_F32C] = {quant_f32c_ref, RASE_X86_FN(quant_f32c_avx2)},
    [ACT_Q8_0] = {quant_q8_0_ref, RASE_X86_FN(quant_q8_0_avx2)},
    [ACT_Q8_1] = {quant_q8_1_ref, RASE_X86_FN(quant_q8_1_avx2)},
    [ACT_Q8_K] = {quant_q8_k_ref, RASE_X86_FN(quant_q8_k_avx2)},
};

static inline rase_quant_fn rase_act_quant_for(int act, int isa) {
    for (; isa > 0; --isa)
        if (ACT_QUANT[act][isa]) return ACT_QUANT[act][isa];
    return ACT_QUANT[act][RASE_ISA_SCALAR];
}

#endif  // RASE_DOT_H
