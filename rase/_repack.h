// rase/_repack.h: weights of the 32-element block types repacked once at load, 8 rows
// interleaved, and the matmul kernels over them (8 rows x up to RASE_NT tokens per call).
//
// Layout: a matrix becomes ceil(rows / 8) groups of 8 rows (rows past the end are zero); a
// group is its row-blocks in order, one r8_<type> per 32 columns. Inside one, slice s (0..7)
// holds elements 4s..4s+3 of every row: byte 4r + i of slice s is element 4s + i of row r, so
// one 32-byte register against a broadcast 4-byte activation slice gives all 8 rows at once,
// each row in its own 32-bit lane. Scales stay f16 as in the file (converted as they are used),
// so a repacked matrix is no larger than the plain one except Q5_0/Q5_1 (a byte per value).
//
// Numerics: llama.cpp's one-token (vec_dot) order, the same in the scalar reference and every
// SIMD kernel, for every tile shape. Per row, slice s has its own f32 accumulator (ggml's
// 8-lane accumulator, lane s): per 32-block b, acc_s = fma(d_w * d_y, (float)isum_{b,s}, acc_s)
// with isum the exact integer sum of the slice's 4 products; the _1 types also add
// summ = summ + m_w * s_y (multiply, then add). The result is ggml's horizontal sum,
// ((acc4 + acc0) + (acc6 + acc2)) + ((acc5 + acc1) + (acc7 + acc3)), plus summ.
#ifndef RASE_REPACK_H
#define RASE_REPACK_H

#include "_dot.h"

#define RASE_R8 8  // rows per group

enum { RASE_LAYOUT_PLAIN = 0, RASE_LAYOUT_R8 = 1 };

typedef struct { uint16_t d[8]; int8_t q[8][32]; } r8_q8_0;           // slices of int8 weights
typedef struct { uint16_t d[8]; uint8_t q[4][32]; } r8_q4_0;          // q[k]: low nibbles slice k, high k + 4
typedef struct { uint16_t d[8], m[8]; uint8_t q[4][32]; } r8_q4_1;
typedef struct { uint16_t d[8]; int8_t q[8][32]; } r8_q5_0;           // q - 16, one int8 per element
typedef struct { uint16_t d[8], m[8]; uint8_t q[8][32]; } r8_q5_1;   // unsigned 5-bit values
_Static_assert(sizeof(r8_q8_0) == 272, "r8_q8_0");
_Static_assert(sizeof(r8_q4_0) == 144, "r8_q4_0");
_Static_assert(sizeof(r8_q4_1) == 160, "r8_q4_1");
_Static_assert(sizeof(r8_q5_0) == 272, "r8_q5_0");
_Static_assert(sizeof(r8_q5_1) == 288, "r8_q5_1");
_Static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20 && sizeof(block_q5_0) == 22 &&
               sizeof(block_q5_1) == 24 && sizeof(block_q8_0) == 34, "ggml block sizes");

// ---------------------------------------------------------------- repack (once, at load)
// Group g of a (rows x n) plain matrix (rows `row_bytes` apart) into dst (n / 32 r8 blocks).

// element values of one plain block as integers: q[j] (Q4_*, Q5_*: unsigned, before the offset)
static void rase_r8_unpack(int type, const uint8_t *blk, int16_t *q, float *d, float *m) {
    *m = 0.0f;
    switch (type) {
        case 8: {
            const block_q8_0 *x = (const block_q8_0 *)blk;
            *d = rase_fp16_to_fp32(x->d);
            for (int j = 0; j < 32; ++j) q[j] = x->qs[j];
            break;
        }
        case 2: case 3: {
            const uint8_t *qs = type == 2 ? ((const block_q4_0 *)blk)->qs : ((const block_q4_1 *)blk)->qs;
            *d = rase_fp16_to_fp32(((const uint16_t *)blk)[0]);
            if (type == 3) *m = rase_fp16_to_fp32(((const block_q4_1 *)blk)->m);
            for (int j = 0; j < 16; ++j) { q[j] = qs[j] & 0xF; q[j + 16] = qs[j] >> 4; }
            break;
        }
        default: {  // 6: q5_0, 7: q5_1
            const uint8_t *qh = type == 6 ? ((const block_q5_0 *)blk)->qh : ((const block_q5_1 *)blk)->qh;
            const uint8_t *qs = type == 6 ? ((const block_q5_0 *)blk)->qs : ((const block_q5_1 *)blk)->qs;
            uint32_t h;
            memcpy(&h, qh, 4);
            *d = rase_fp16_to_fp32(((const uint16_t *)blk)[0]);
            if (type == 7) *m = rase_fp16_to_fp32(((const block_q5_1 *)blk)->m);
            for (int j = 0; j < 16; ++j) {
                q[j] = (int16_t)((qs[j] & 0xF) | (((h >> j) & 1) << 4));
                q[j + 16] = (int16_t)((qs[j] >> 4) | (((h >> (j + 16)) & 1) << 4));
            }
            break;
        }
    }
}

static void rase_r8_repack_group(int type, const uint8_t *src, int64_t row_bytes, int64_t rows, int64_t n,
                                 int64_t g, uint8_t *dst, size_t blk_bytes) {
    const int src_blk = type == 8 ? 34 : type == 2 ? 18 : type == 3 ? 20 : type == 6 ? 22 : 24;
    const int has_min = type == 3 || type == 7, qoff = has_min ? 32 : 16;
    memset(dst, 0, (size_t)(n / 32) * blk_bytes);
    for (int r = 0; r < 8 && g * 8 + r < rows; ++r) {
        const uint8_t *row = src + (g * 8 + r) * row_bytes;
        for (int64_t b = 0; b < n / 32; ++b) {
            uint8_t *o = dst + b * blk_bytes, *qs = o + qoff;
            const uint8_t *x = row + b * src_blk;
            uint16_t *dd = (uint16_t *)o;
            if (type == 8 || type == 2 || type == 3) {  // bytes as stored: 4 at a time per slice
                dd[r] = ((const uint16_t *)x)[0];
                if (type == 3) dd[8 + r] = ((const uint16_t *)x)[1];
                const uint8_t *q = x + (type == 8 ? 2 : type == 2 ? 2 : 4);
                for (int s = 0; s < (type == 8 ? 8 : 4); ++s) memcpy(qs + s * 32 + 4 * r, q + 4 * s, 4);
                continue;
            }
            int16_t q[32];
            float d, mn;
            rase_r8_unpack(type, x, q, &d, &mn);
            dd[r] = ((const uint16_t *)x)[0];  // d (and m) as stored: the first two halves
            if (has_min) dd[8 + r] = ((const uint16_t *)x)[1];
            for (int e = 0; e < 32; ++e)  // q5_0 signed (q - 16), q5_1 unsigned
                qs[(e / 4) * 32 + 4 * r + e % 4] = (uint8_t)(type == 6 ? q[e] - 16 : q[e]);
        }
    }
}

// ---------------------------------------------------------------- the scalar reference
// y[t * ys + r] for rows r < nr of the group at w and tokens t < nt (activation t at
// a + t * astride): the definition every kernel below must equal bit for bit.

typedef void (*rase_r8_fn)(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, float *y,
                           int64_t ys, int nr);

static inline int rase_r8_weight(int type, const uint8_t *qs, int s, int r, int i) {
    const uint8_t b = (type == 2 || type == 3) ? qs[(s & 3) * 32 + 4 * r + i] : qs[s * 32 + 4 * r + i];
    switch (type) {
        case 8: return (int8_t)b;
        case 2: return (s < 4 ? (b & 0xF) : (b >> 4)) - 8;
        case 3: return s < 4 ? (b & 0xF) : (b >> 4);
        case 6: return (int8_t)b;
        default: return b;  // q5_1
    }
}

// ggml's horizontal sum of an 8-lane accumulator (rase_avx2_hsum's order)
static inline float rase_hsum8(const float *a) {
    return ((a[4] + a[0]) + (a[6] + a[2])) + ((a[5] + a[1]) + (a[7] + a[3]));
}

static void rase_r8_ref(int type, int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, float *y,
                        int64_t ys, int nr) {
    const int has_min = type == 3 || type == 7;
    const size_t blk = type == 8 || type == 6 ? 272 : type == 2 ? 144 : type == 3 ? 160 : 288;
    for (int t = 0; t < nt; ++t)
        for (int r = 0; r < nr; ++r) {
            float acc[8] = {0}, summ = 0.0f;
            for (int64_t b = 0; b < n / 32; ++b) {
                const uint8_t *o = w + b * blk;
                const uint16_t *dd = (const uint16_t *)o;
                const uint8_t *qs = o + (has_min ? 32 : 16);
                const int8_t *yq;
                float dy, sy = 0.0f;
                if (has_min) {
                    const act_q8_1 *ya = (const act_q8_1 *)((const char *)a + t * astride) + b;
                    yq = ya->qs, dy = ya->d, sy = ya->s;
                } else {
                    const act_q8_0 *ya = (const act_q8_0 *)((const char *)a + t * astride) + b;
                    yq = ya->qs, dy = ya->d;
                }
                const float scale = rase_fp16_to_fp32(dd[r]) * dy;
                for (int sl = 0; sl < 8; ++sl) {
                    int isum = 0;
                    for (int i = 0; i < 4; ++i) isum += rase_r8_weight(type, qs, sl, r, i) * yq[4 * sl + i];
                    acc[sl] = __builtin_fmaf(scale, (float)isum, acc[sl]);
                }
                if (has_min) {
                    const float mt = rase_fp16_to_fp32(dd[8 + r]) * sy;
                    summ = summ + mt;
                }
            }
            y[t * ys + r] = rase_hsum8(acc) + summ;
        }
}

#define RASE_R8_REF(NAME, TYPE)                                                               \
    static void NAME(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, float *y, \
                     int64_t ys, int nr) { rase_r8_ref(TYPE, n, w, a, astride, nt, y, ys, nr); }
RASE_R8_REF(r8_q8_0_ref, 8)
RASE_R8_REF(r8_q4_0_ref, 2)
RASE_R8_REF(r8_q4_1_ref, 3)
RASE_R8_REF(r8_q5_0_ref, 6)
RASE_R8_REF(r8_q5_1_ref, 7)

// ---------------------------------------------------------------- AVX2

#if RASE_HAVE_X86
// the 8 activation slices of one 32-block, each 4-byte group broadcast to every lane
RASE_TARGET_AVX2 static RASE_INLINE void rase_r8_yslices(const int8_t *qs, __m256i *ys) {
    const __m256i y0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    const __m256i y1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(qs + 16)));
    ys[0] = _mm256_shuffle_epi32(y0, 0x00); ys[1] = _mm256_shuffle_epi32(y0, 0x55);
    ys[2] = _mm256_shuffle_epi32(y0, 0xaa); ys[3] = _mm256_shuffle_epi32(y0, 0xff);
    ys[4] = _mm256_shuffle_epi32(y1, 0x00); ys[5] = _mm256_shuffle_epi32(y1, 0x55);
    ys[6] = _mm256_shuffle_epi32(y1, 0xaa); ys[7] = _mm256_shuffle_epi32(y1, 0xff);
}

// TYPE (ggml id): 8 q8_0, 2 q4_0, 6 q5_0 (signed weights, ggml's sign trick); 3 q4_1, 7 q5_1
// (unsigned). Weights are unpacked once per block and reused for every token of the tile; per
// token, 8 accumulators (one per slice) whose lanes are the rows.
#define RASE_R8_KERNEL(NAME, TYPE, RT, TARGET, DOT4)                                          \
    TARGET static RASE_INLINE void NAME##_body(int64_t n, const uint8_t *w, const void *a,    \
                                                         size_t astride, const int nt, float *y, \
                                                         int64_t ys, int nr) {                \
        enum { HAS_MIN = TYPE == 3 || TYPE == 7, NIB = TYPE == 2 || TYPE == 3, SIGNED = !HAS_MIN }; \
        __m256 acc[RASE_NT][8], summ[RASE_NT];                                                \
        for (int t = 0; t < nt; ++t) {                                                        \
            summ[t] = _mm256_setzero_ps();                                                    \
            for (int sl = 0; sl < 8; ++sl) acc[t][sl] = _mm256_setzero_ps();                  \
        }                                                                                     \
        const RT *blk = (const RT *)w;                                                        \
        for (int64_t b = 0; b < n / 32; ++b) {                                                \
            RASE_PREFETCH_AHEAD(&blk[b], sizeof(RT));                                            \
            __m256i q[8];                                                                     \
            if (NIB) {                                                                        \
                const __m256i m4 = _mm256_set1_epi8(0xF), eight = _mm256_set1_epi8(8);        \
                for (int k = 0; k < 4; ++k) {                                                 \
                    const __m256i raw = _mm256_loadu_si256((const __m256i *)blk[b].q[k]);     \
                    q[k] = _mm256_and_si256(raw, m4);                                         \
                    q[k + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);               \
                    if (TYPE == 2) { q[k] = _mm256_sub_epi8(q[k], eight); q[k + 4] = _mm256_sub_epi8(q[k + 4], eight); } \
                }                                                                             \
            } else {                                                                          \
                for (int k = 0; k < 8; ++k) q[k] = _mm256_loadu_si256((const __m256i *)blk[b].q[k]); \
            }                                                                                 \
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk[b].d));   \
            for (int t = 0; t < nt; ++t) {                                                    \
                const int8_t *yq;                                                             \
                const float *dy;                                                              \
                if (HAS_MIN) {                                                                \
                    const act_q8_1 *ya = (const act_q8_1 *)((const char *)a + t * astride) + b; \
                    yq = ya->qs, dy = &ya->d;                                                 \
                    summ[t] = _mm256_add_ps(summ[t], _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk[b].d + 1)), \
                                                                   _mm256_broadcast_ss(&ya->s))); \
                } else {                                                                      \
                    const act_q8_0 *ya = (const act_q8_0 *)((const char *)a + t * astride) + b; \
                    yq = ya->qs, dy = &ya->d;                                                 \
                }                                                                             \
                __m256i ysl[8];                                                               \
                rase_r8_yslices(yq, ysl);                                                     \
                const __m256 scale = _mm256_mul_ps(dw, _mm256_broadcast_ss(dy));              \
                for (int sl = 0; sl < 8; ++sl) {  /* signed: |w| x (y with w's sign) */      \
                    const __m256i i32 = SIGNED                                                \
                        ? DOT4(_mm256_sign_epi8(q[sl], q[sl]), _mm256_sign_epi8(ysl[sl], q[sl])) \
                        : DOT4(q[sl], ysl[sl]);                                               \
                    acc[t][sl] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(i32), acc[t][sl]); \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        for (int t = 0; t < nt; ++t) {  /* rase_hsum8, lane by lane */                        \
            const __m256 *A = acc[t];                                                         \
            const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(A[4], A[0]), _mm256_add_ps(A[6], A[2])), \
                                             _mm256_add_ps(_mm256_add_ps(A[5], A[1]), _mm256_add_ps(A[7], A[3]))); \
            rase_r8_store(_mm256_add_ps(sum, summ[t]), y + t * ys, nr);                       \
        }                                                                                     \
    }                                                                                         \
    TARGET static void NAME(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, \
                            float *y, int64_t ys, int nr) {                                   \
        switch (nt) {                                                                         \
            case 1: NAME##_body(n, w, a, astride, 1, y, ys, nr); break;                       \
            case 2: NAME##_body(n, w, a, astride, 2, y, ys, nr); break;                       \
            case 3: NAME##_body(n, w, a, astride, 3, y, ys, nr); break;                       \
            default: NAME##_body(n, w, a, astride, 4, y, ys, nr); break;                      \
        }                                                                                     \
    }

// y[t * ys + r] for r < nr: the 8 lanes of token t's result
RASE_TARGET_AVX2 static RASE_INLINE void rase_r8_store(__m256 v, float *y, int nr) {
    if (nr == 8) { _mm256_storeu_ps(y, v); return; }
    float tmp[8];
    _mm256_storeu_ps(tmp, v);
    memcpy(y, tmp, (size_t)nr * sizeof(float));
}

// u8 x s8, the exact sum of each 4 products in its 32-bit lane (no int16 pair saturates for
// these types: at most 2 * 128 * 127): AVX2 maddubs + madd, or one VNNI vpdpbusd (the same ints)
RASE_TARGET_AVX2 static RASE_INLINE __m256i rase_dot4_avx2(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
RASE_TARGET_AVX512 static RASE_INLINE __m256i rase_dot4_vnni(__m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}

RASE_R8_KERNEL(r8_q8_0_avx2, 8, r8_q8_0, RASE_TARGET_AVX2, rase_dot4_avx2)
RASE_R8_KERNEL(r8_q4_0_avx2, 2, r8_q4_0, RASE_TARGET_AVX2, rase_dot4_avx2)
RASE_R8_KERNEL(r8_q4_1_avx2, 3, r8_q4_1, RASE_TARGET_AVX2, rase_dot4_avx2)
RASE_R8_KERNEL(r8_q5_0_avx2, 6, r8_q5_0, RASE_TARGET_AVX2, rase_dot4_avx2)
RASE_R8_KERNEL(r8_q5_1_avx2, 7, r8_q5_1, RASE_TARGET_AVX2, rase_dot4_avx2)

// AVX-512 VNNI: one zmm holds two slices of the 8 rows (a pair), so a block is 4 vpdpbusd over
// activations laid out once per matmul (act_r8x); the same exact integer per slice, then the
// same FMA per slice and the same hsum as the scalar reference.
// Pairs: Q8_0/Q5_x slices (2k, 2k+1); nibble types (k, k+1) low and (k+4, k+5) high, k = 0, 2.
static const int32_t RASE_R8_PAIR_IDX[2][4][2] = {{{0, 1}, {2, 3}, {4, 5}, {6, 7}},   // bytes
                                                  {{0, 1}, {4, 5}, {2, 3}, {6, 7}}};  // nibbles

// a zmm whose low 8 lanes are lane a of v and high 8 lanes lane b
RASE_TARGET_AVX512 static RASE_INLINE __m512i rase_r8_pair_idx(int a, int b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(a)), _mm256_set1_epi32(b), 1);
}

// Tiles of many tokens (prefill): the activation side of each pair is built in registers per
// block and token (Q4_0 keeps u = nibble and starts from -8 * the slice sums).
#define RASE_R8_KERNEL_512(NAME, TYPE, RT)                                                    \
    RASE_TARGET_AVX512 static RASE_INLINE void NAME##_body(int64_t n, const uint8_t *w, const void *a, \
                                                           size_t astride, const int nt, float *y, \
                                                           int64_t ys, int nr) {              \
        enum { HAS_MIN = TYPE == 3 || TYPE == 7, NIB = TYPE == 2 || TYPE == 3,                \
               FLIP = TYPE == 8 || TYPE == 6, BIAS_SHIFT = FLIP ? 7 : TYPE == 2 ? 3 : 0 };    \
        __m512 acc[RASE_NT][4];                                                               \
        __m256 summ[RASE_NT];                                                                 \
        __m512i idx[4];                                                                       \
        for (int k = 0; k < 4; ++k)                                                           \
            idx[k] = rase_r8_pair_idx(RASE_R8_PAIR_IDX[NIB][k][0], RASE_R8_PAIR_IDX[NIB][k][1]); \
        for (int t = 0; t < nt; ++t) {                                                        \
            summ[t] = _mm256_setzero_ps();                                                    \
            for (int k = 0; k < 4; ++k) acc[t][k] = _mm512_setzero_ps();                      \
        }                                                                                     \
        const __m512i m4 = _mm512_set1_epi8(0xF), flip = _mm512_set1_epi8((char)0x80);        \
        const __m256i ones = _mm256_set1_epi8(1);                                             \
        const RT *blk = (const RT *)w;                                                        \
        for (int64_t b = 0; b < n / 32; ++b) {                                                \
            RASE_PREFETCH_AHEAD(&blk[b], sizeof(RT));                                            \
            __m512i u[4];                                                                     \
            if (NIB) {                                                                        \
                for (int h = 0; h < 2; ++h) {                                                 \
                    const __m512i raw = _mm512_loadu_si512((const void *)blk[b].q[2 * h]);    \
                    u[2 * h] = _mm512_and_si512(raw, m4);                                     \
                    u[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);           \
                }                                                                             \
            } else {                                                                          \
                for (int k = 0; k < 4; ++k) {                                                 \
                    u[k] = _mm512_loadu_si512((const void *)blk[b].q[2 * k]);                 \
                    if (FLIP) u[k] = _mm512_xor_si512(u[k], flip);                            \
                }                                                                             \
            }                                                                                 \
            const __m512 dw = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk[b].d))))); \
            for (int t = 0; t < nt; ++t) {                                                    \
                const int8_t *yq;                                                             \
                const float *dy;                                                              \
                if (HAS_MIN) {                                                                \
                    const act_q8_1 *ya = (const act_q8_1 *)((const char *)a + t * astride) + b; \
                    yq = ya->qs, dy = &ya->d;                                                 \
                    summ[t] = _mm256_add_ps(summ[t], _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk[b].d + 1)), \
                                                                   _mm256_broadcast_ss(&ya->s))); \
                } else {                                                                      \
                    const act_q8_0 *ya = (const act_q8_0 *)((const char *)a + t * astride) + b; \
                    yq = ya->qs, dy = &ya->d;                                                 \
                }                                                                             \
                const __m256i yv = _mm256_loadu_si256((const __m256i *)yq);                   \
                const __m512i yz = _mm512_castsi256_si512(yv);                                \
                __m512i nb = _mm512_setzero_si512();                                          \
                if (BIAS_SHIFT) /* -B * slice sums, lane s */                                 \
                    nb = _mm512_castsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(),     \
                        _mm256_slli_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, yv), BIAS_SHIFT))); \
                const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(*dy));                  \
                for (int k = 0; k < 4; ++k) {                                                 \
                    const __m512i i0 = BIAS_SHIFT ? _mm512_permutexvar_epi32(idx[k], nb) : nb; \
                    const __m512i i32 = _mm512_dpbusd_epi32(i0, u[k], _mm512_permutexvar_epi32(idx[k], yz)); \
                    acc[t][k] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(i32), acc[t][k]);   \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        for (int t = 0; t < nt; ++t) { /* pairs p0..p3 = slices (a | b); ggml's hsum order */ \
            const __m512 *A = acc[t];                                                         \
            const __m512 s4 = NIB ? _mm512_add_ps(_mm512_add_ps(A[1], A[0]), _mm512_add_ps(A[3], A[2])) \
                                  : _mm512_add_ps(_mm512_add_ps(A[2], A[0]), _mm512_add_ps(A[3], A[1])); \
            const __m256 sum = _mm256_add_ps(_mm512_castps512_ps256(s4), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s4), 1))); \
            rase_r8_store(_mm256_add_ps(sum, summ[t]), y + t * ys, nr);                       \
        }                                                                                     \
    }                                                                                         \
    RASE_TARGET_AVX512 static void NAME(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, \
                                        float *y, int64_t ys, int nr) {                       \
        switch (nt) {                                                                         \
            case 1: NAME##_body(n, w, a, astride, 1, y, ys, nr); break;                       \
            case 2: NAME##_body(n, w, a, astride, 2, y, ys, nr); break;                       \
            case 3: NAME##_body(n, w, a, astride, 3, y, ys, nr); break;                       \
            default: NAME##_body(n, w, a, astride, 4, y, ys, nr); break;                      \
        }                                                                                     \
    }
RASE_R8_KERNEL_512(r8_q8_0_vnni, 8, r8_q8_0)
RASE_R8_KERNEL_512(r8_q4_0_vnni, 2, r8_q4_0)
RASE_R8_KERNEL_512(r8_q4_1_vnni, 3, r8_q4_1)
RASE_R8_KERNEL_512(r8_q5_0_vnni, 6, r8_q5_0)
RASE_R8_KERNEL_512(r8_q5_1_vnni, 7, r8_q5_1)

// The activation side of a pair is the same for every group of rows, so it is laid out once
// per token and block (rase_r8x_expand) and read with plain loads: yp[k] the activation bytes
// of pair k's two slices, each 4-byte group in its 8 lanes; nb[k] -128 * the slice sums.
typedef struct {
    int8_t yp[4][64];
    int32_t nb[4][16];
    float d, s;  // the activation block's scale (and, for Q8_1, its s)
    uint8_t pad[56];
} act_r8x;
_Static_assert(sizeof(act_r8x) == 576, "act_r8x: a multiple of 64 bytes");

// tokens t < nt of A (q8_0 or, q81, q8_1 rows `as` bytes apart; nblk blocks each) to dst[t * nblk + b]
RASE_TARGET_AVX512 static void rase_r8x_expand(const uint8_t *A, size_t as, int nt, int64_t nblk, int q81, int nib,
                                               act_r8x *dst) {
    __m512i idx[4];
    for (int k = 0; k < 4; ++k) idx[k] = rase_r8_pair_idx(RASE_R8_PAIR_IDX[nib][k][0], RASE_R8_PAIR_IDX[nib][k][1]);
    const __m256i ones = _mm256_set1_epi8(1);
    for (int t = 0; t < nt; ++t)
        for (int64_t b = 0; b < nblk; ++b) {
            act_r8x *o = dst + t * nblk + b;
            const int8_t *yq;
            if (q81) {
                const act_q8_1 *ya = (const act_q8_1 *)(A + t * as) + b;
                yq = ya->qs, o->d = ya->d, o->s = ya->s;
            } else {
                const act_q8_0 *ya = (const act_q8_0 *)(A + t * as) + b;
                yq = ya->qs, o->d = ya->d, o->s = 0.0f;
            }
            const __m256i yv = _mm256_loadu_si256((const __m256i *)yq);
            const __m512i nb = _mm512_castsi256_si512(_mm256_sub_epi32(
                _mm256_setzero_si256(), _mm256_slli_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, yv), 7)));
            for (int k = 0; k < 4; ++k) {
                _mm512_storeu_si512((void *)o->yp[k], _mm512_permutexvar_epi32(idx[k], _mm512_castsi256_si512(yv)));
                _mm512_storeu_si512((void *)o->nb[k], _mm512_permutexvar_epi32(idx[k], nb));
            }
        }
}

// Tiles of a few tokens (decode): the activations laid out once (act_r8x) serve every group.
// Signed weights become unsigned u = w + 128 (Q8_0, Q5_0: the sign bit flipped; Q4_0: the nibble
// + 120), and each dot starts from nb: the exact integer per slice of the sign trick.
#define RASE_R8_KERNEL_512X(NAME, TYPE, RT)                                                    \
    RASE_TARGET_AVX512 static RASE_INLINE void NAME##_body(int64_t n, const uint8_t *w, const void *a, \
                                                           size_t astride, const int nt, float *y, \
                                                           int64_t ys, int nr) {              \
        enum { HAS_MIN = TYPE == 3 || TYPE == 7, NIB = TYPE == 2 || TYPE == 3, FLIP = TYPE == 8 || TYPE == 6, \
               SIGNED = !HAS_MIN };                                                           \
        __m512 acc[RASE_NT][4];                                                               \
        __m256 summ[RASE_NT];                                                                 \
        for (int t = 0; t < nt; ++t) {                                                        \
            summ[t] = _mm256_setzero_ps();                                                    \
            for (int k = 0; k < 4; ++k) acc[t][k] = _mm512_setzero_ps();                      \
        }                                                                                     \
        const __m512i m4 = _mm512_set1_epi8(0xF), flip = _mm512_set1_epi8((char)0x80), o120 = _mm512_set1_epi8(120); \
        const RT *blk = (const RT *)w;                                                        \
        for (int64_t b = 0; b < n / 32; ++b) {                                                \
            RASE_PREFETCH_AHEAD(&blk[b], sizeof(RT));                                         \
            __m512i u[4];                                                                     \
            if (NIB) {                                                                        \
                for (int h = 0; h < 2; ++h) {                                                 \
                    const __m512i raw = _mm512_loadu_si512((const void *)blk[b].q[2 * h]);    \
                    u[2 * h] = _mm512_and_si512(raw, m4);                                     \
                    u[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);           \
                    if (TYPE == 2) {                                                          \
                        u[2 * h] = _mm512_add_epi8(u[2 * h], o120);                           \
                        u[2 * h + 1] = _mm512_add_epi8(u[2 * h + 1], o120);                   \
                    }                                                                         \
                }                                                                             \
            } else {                                                                          \
                for (int k = 0; k < 4; ++k) {                                                 \
                    u[k] = _mm512_loadu_si512((const void *)blk[b].q[2 * k]);                 \
                    if (FLIP) u[k] = _mm512_xor_si512(u[k], flip);                            \
                }                                                                             \
            }                                                                                 \
            const __m512 dw = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(       \
                _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk[b].d)))));               \
            for (int t = 0; t < nt; ++t) {                                                    \
                const act_r8x *ya = (const act_r8x *)((const char *)a + t * astride) + b;     \
                if (HAS_MIN)                                                                  \
                    summ[t] = _mm256_add_ps(summ[t], _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk[b].d + 1)), \
                                                                   _mm256_set1_ps(ya->s)));   \
                const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(ya->d));                \
                for (int k = 0; k < 4; ++k) {                                                 \
                    const __m512i i0 = SIGNED ? _mm512_loadu_si512((const void *)ya->nb[k]) : _mm512_setzero_si512(); \
                    const __m512i i32 = _mm512_dpbusd_epi32(i0, u[k], _mm512_loadu_si512((const void *)ya->yp[k])); \
                    acc[t][k] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(i32), acc[t][k]);   \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        for (int t = 0; t < nt; ++t) { /* pairs p0..p3 = slices (a | b); ggml's hsum order */ \
            const __m512 *A = acc[t];                                                         \
            const __m512 s4 = NIB ? _mm512_add_ps(_mm512_add_ps(A[1], A[0]), _mm512_add_ps(A[3], A[2])) \
                                  : _mm512_add_ps(_mm512_add_ps(A[2], A[0]), _mm512_add_ps(A[3], A[1])); \
            const __m256 sum = _mm256_add_ps(_mm512_castps512_ps256(s4),                      \
                                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s4), 1))); \
            rase_r8_store(_mm256_add_ps(sum, summ[t]), y + t * ys, nr);                       \
        }                                                                                     \
    }                                                                                         \
    RASE_TARGET_AVX512 static void NAME(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, \
                                        float *y, int64_t ys, int nr) {                       \
        switch (nt) {                                                                         \
            case 1: NAME##_body(n, w, a, astride, 1, y, ys, nr); break;                       \
            case 2: NAME##_body(n, w, a, astride, 2, y, ys, nr); break;                       \
            case 3: NAME##_body(n, w, a, astride, 3, y, ys, nr); break;                       \
            default: NAME##_body(n, w, a, astride, 4, y, ys, nr); break;                      \
        }                                                                                     \
    }
RASE_R8_KERNEL_512X(r8_q8_0_vnnix, 8, r8_q8_0)
RASE_R8_KERNEL_512X(r8_q4_0_vnnix, 2, r8_q4_0)
RASE_R8_KERNEL_512X(r8_q4_1_vnnix, 3, r8_q4_1)
RASE_R8_KERNEL_512X(r8_q5_0_vnnix, 6, r8_q5_0)
RASE_R8_KERNEL_512X(r8_q5_1_vnnix, 7, r8_q5_1)
#  define RASE_R8_X86_FN(f) f
#else
#  define RASE_R8_X86_FN(f) 0
#endif

// ---------------------------------------------------------------- the table, by ggml type id

typedef struct {
    size_t blk_bytes;                   // one r8 block: 8 rows x 32 columns; 0 = not repacked
    rase_r8_fn kern[RASE_ISA_COUNT];    // [scalar reference, AVX2, AVX-512 VNNI]: the same bits
    rase_r8_fn kern_x;                  // AVX-512 VNNI over laid-out activations (act_r8x): the same bits
} rase_r8_traits;

static const rase_r8_traits R8_TRAITS[RASE_GGML_TYPE_COUNT] = {
    [2] = {sizeof(r8_q4_0), {r8_q4_0_ref, RASE_R8_X86_FN(r8_q4_0_avx2), RASE_R8_X86_FN(r8_q4_0_vnni)}, RASE_R8_X86_FN(r8_q4_0_vnnix)},
    [3] = {sizeof(r8_q4_1), {r8_q4_1_ref, RASE_R8_X86_FN(r8_q4_1_avx2), RASE_R8_X86_FN(r8_q4_1_vnni)}, RASE_R8_X86_FN(r8_q4_1_vnnix)},
    [6] = {sizeof(r8_q5_0), {r8_q5_0_ref, RASE_R8_X86_FN(r8_q5_0_avx2), RASE_R8_X86_FN(r8_q5_0_vnni)}, RASE_R8_X86_FN(r8_q5_0_vnnix)},
    [7] = {sizeof(r8_q5_1), {r8_q5_1_ref, RASE_R8_X86_FN(r8_q5_1_avx2), RASE_R8_X86_FN(r8_q5_1_vnni)}, RASE_R8_X86_FN(r8_q5_1_vnnix)},
    [8] = {sizeof(r8_q8_0), {r8_q8_0_ref, RASE_R8_X86_FN(r8_q8_0_avx2), RASE_R8_X86_FN(r8_q8_0_vnni)}, RASE_R8_X86_FN(r8_q8_0_vnnix)},
};

static inline rase_r8_fn rase_r8_for(int type, int isa) {
    for (int i = isa; i > 0; --i)
        if (R8_TRAITS[type].kern[i]) return R8_TRAITS[type].kern[i];
    return R8_TRAITS[type].kern[RASE_ISA_SCALAR];
}

// A thread's laid-out activations (act_r8x) for one tile: which quantized rows they came from,
// so the groups of every chunk of one product reuse them. Forget (src = NULL) whenever the
// quantized rows may have been rewritten.
typedef struct {
    act_r8x *buf;       // RASE_R8_TILE x max_blocks
    int64_t max_blocks;
    const uint8_t *src;
    int nt, nib;
} rase_r8x_ws;
#define RASE_R8_TILE 4  // tokens per repacked-kernel call (1..RASE_NT)

// Y[t * ys + r] for rows [r0, r1) (r0 a multiple of 8) of a repacked (rows x n) matrix and T
// tokens of A (rows `as` bytes apart). ws: the thread's workspace. With AVX-512, a product of up
// to RASE_R8_TILE tokens lays its activations out once for all groups; more tokens build them in
// registers (the laid-out tiles would be read back from L2 for every group).
static void rase_r8_rows(int isa, int type, const uint8_t *packed, int64_t group_bytes, int64_t n, const uint8_t *A,
                         size_t as, int T, float *Y, int64_t ys, int64_t r0, int64_t r1, rase_r8x_ws *ws) {
    const rase_r8_fn kern = rase_r8_for(type, isa);
#if RASE_HAVE_X86
    if (isa >= RASE_ISA_AVX512 && R8_TRAITS[type].kern_x && T <= RASE_R8_TILE) {
        const rase_r8_fn kx = R8_TRAITS[type].kern_x;
        const int nib = type == 2 || type == 3, q81 = type == 3 || type == 7;
        const int64_t nblk = n / 32;
        for (int t0 = 0; t0 < T; t0 += RASE_R8_TILE) {
            const int nt = T - t0 < RASE_R8_TILE ? T - t0 : RASE_R8_TILE;
            const uint8_t *src = A + (size_t)t0 * as;
            if (ws->src != src || ws->nt != nt || ws->nib != nib) {
                rase_r8x_expand(src, as, nt, nblk, q81, nib, ws->buf);
                ws->src = src, ws->nt = nt, ws->nib = nib;
            }
            for (int64_t g = r0 / RASE_R8; g * RASE_R8 < r1; ++g) {
                const int nr = r1 - g * RASE_R8 < RASE_R8 ? (int)(r1 - g * RASE_R8) : RASE_R8;
                kx(n, packed + g * group_bytes, ws->buf, (size_t)nblk * sizeof(act_r8x), nt,
                     Y + (int64_t)t0 * ys + g * RASE_R8, ys, nr);
            }
        }
        return;
    }
#endif
    (void)ws;
    for (int64_t g = r0 / RASE_R8; g * RASE_R8 < r1; ++g) {
        const uint8_t *pg = packed + g * group_bytes;
        const int nr = r1 - g * RASE_R8 < RASE_R8 ? (int)(r1 - g * RASE_R8) : RASE_R8;
        for (int t0 = 0; t0 < T; t0 += RASE_R8_TILE) {
            const int nt = T - t0 < RASE_R8_TILE ? T - t0 : RASE_R8_TILE;
            kern(n, pg, A + (size_t)t0 * as, as, nt, Y + (int64_t)t0 * ys + g * RASE_R8, ys, nr);
        }
    }
}

// bytes of a repacked (rows x n) matrix
static inline size_t rase_r8_bytes(int type, int64_t rows, int64_t n) {
    return (size_t)((rows + 7) / 8) * (size_t)(n / 32) * R8_TRAITS[type].blk_bytes;
}

// groups [g0, g1) of the matrix, split over n_threads (at load, outside any forward)
static void rase_r8_repack(int type, const uint8_t *src, int64_t row_bytes, int64_t rows, int64_t n, uint8_t *dst,
                           int64_t g0, int64_t g1, int n_threads) {
    const size_t group = (size_t)(n / 32) * R8_TRAITS[type].blk_bytes;
    (void)n_threads;
#pragma omp parallel for num_threads(n_threads) schedule(static) if (g1 - g0 >= 64)
    for (int64_t g = g0; g < g1; ++g)
        rase_r8_repack_group(type, src, row_bytes, rows, n, g, dst + g * group, R8_TRAITS[type].blk_bytes);
}

#endif  // RASE_REPACK_H
