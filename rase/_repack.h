// rase/_repack.h: weights of the 32-element block types repacked once at load, 16 rows
// interleaved, and the matmul kernels over them (16 rows x a tile of tokens per call).
//
// Layout: a matrix becomes ceil(rows / 16) groups of 16 rows (rows past the end are zero); a
// group is its row-blocks in order, one r16_<type> per 32 columns. Inside one, slice s (0..7)
// holds elements 4s..4s+3 of every row: byte 4r + i of slice s is element 4s + i of row r, so
// one 64-byte register (AVX-512) or each 32-byte half (AVX2: rows 0-7, 8-15) against a
// broadcast 4-byte activation slice gives every row at once, each in its own 32-bit lane. The
// nibble types (Q4_*, Q5_*) keep slice k's low nibbles and slice k + 4's high nibbles in one
// 64-byte plane. Q5_1's fifth bits are one 64-bit mask per slice (bit 4r + i: element 4s + i of
// row r), which AVX-512 applies as a byte mask; Q5_0's are one byte per lane (byte 4r + i, bit s),
// so one load serves all 8 slices. Scales stay f16 as in the file (converted as they are used),
// so a repacked matrix is never larger than the plain one.
//
// Numerics: Q4_0 and Q5_0 have block-sum numerics (_repack_bs.h). The others have llama.cpp's
// one-token (vec_dot) order, the same in the scalar reference and every SIMD kernel, for every
// tile shape. Per row, slice s has its own f32 accumulator (ggml's 8-lane accumulator, lane s):
// per 32-block b, acc_s = fma(d_w * d_y, (float)isum_{b,s}, acc_s) with isum the exact integer
// sum of the slice's 4 products; the _1 types also add summ = summ + m_w * s_y (multiply, then
// add). The result is ggml's horizontal sum,
// ((acc4 + acc0) + (acc6 + acc2)) + ((acc5 + acc1) + (acc7 + acc3)), plus summ.
#ifndef RASE_REPACK_H
#define RASE_REPACK_H

#include "_dot.h"

#define RASE_R16 16  // rows per group
enum { RASE_LAYOUT_PLAIN = 0, RASE_LAYOUT_R16 = 1 };

typedef struct { uint16_t d[16]; int8_t q[8][64]; } r16_q8_0;           // slices of int8 weights
typedef struct { uint16_t d[16]; uint8_t q[4][64]; } r16_q4_0;          // q[k]: low nibbles slice k, high k + 4
typedef struct { uint16_t d[16], m[16]; uint8_t q[4][64]; } r16_q4_1;
typedef struct { uint16_t d[16]; uint8_t q[4][64]; uint8_t hb[64]; } r16_q5_0;  // hb[4r + i] bit s: row r's element 4s + i
typedef struct { uint16_t d[16], m[16]; uint8_t q[4][64]; uint64_t h[8]; } r16_q5_1;
_Static_assert(sizeof(r16_q8_0) == 544 && sizeof(r16_q8_0) == 16 * sizeof(block_q8_0), "r16_q8_0");
_Static_assert(sizeof(r16_q4_0) == 288 && sizeof(r16_q4_0) == 16 * sizeof(block_q4_0), "r16_q4_0");
_Static_assert(sizeof(r16_q4_1) == 320 && sizeof(r16_q4_1) == 16 * sizeof(block_q4_1), "r16_q4_1");
_Static_assert(sizeof(r16_q5_0) == 352 && sizeof(r16_q5_0) == 16 * sizeof(block_q5_0), "r16_q5_0");
_Static_assert(sizeof(r16_q5_1) == 384 && sizeof(r16_q5_1) == 16 * sizeof(block_q5_1), "r16_q5_1");
_Static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20 && sizeof(block_q5_0) == 22 &&
               sizeof(block_q5_1) == 24 && sizeof(block_q8_0) == 34, "ggml block sizes");

// ---------------------------------------------------------------- repack (once, at load)

static inline int rase_r16_nib(int type) { return type != 8; }
static inline int rase_r16_has_min(int type) { return type == 3 || type == 7; }
static inline int rase_r16_has_h(int type) { return type == 6 || type == 7; }
// the fifth bits one byte per lane, bit s for slice s (Q5_0); else one 64-bit mask per slice (Q5_1)
static inline int rase_r16_h_lanes(int type) { return type == 6; }
// bytes of one repacked block (16 rows x 32 columns): 16 plain ones (the asserts above)
static inline size_t rase_r16_blk(int type) { return 16 * (size_t)QUANT_TRAITS[type].size; }
// offsets in a repacked block: the nibble or byte planes, the fifth-bit masks
static inline size_t rase_r16_qoff(int type) { return rase_r16_has_min(type) ? 64 : 32; }
static inline size_t rase_r16_hoff(int type) { return rase_r16_qoff(type) + 256; }

// Group g of a (rows x n) plain matrix (rows `row_bytes` apart) into dst (n / 32 blocks).
static inline __attribute__((always_inline)) void rase_r16_repack_group(int type, const uint8_t *src, int64_t row_bytes, int64_t rows, int64_t n,
                                  int64_t g, uint8_t *dst, size_t blk_bytes) {
    const int src_blk = QUANT_TRAITS[type].size;
    const int has_min = rase_r16_has_min(type), has_h = rase_r16_has_h(type);
    const size_t qoff = rase_r16_qoff(type), hoff = rase_r16_hoff(type);
    // ggml's blocks end with their bytes (32) or nibbles (16), Q5_*'s 4 bytes of fifth bits before
    const int qs_at = src_blk - (type == 8 ? 32 : 16), qh_at = qs_at - 4;
    if ((g + 1) * RASE_R16 > rows) memset(dst, 0, (size_t)(n / 32) * blk_bytes);  // a full group writes every byte
    for (int r = 0; r < RASE_R16 && g * RASE_R16 + r < rows; ++r) {
        const uint8_t *row = src + (g * RASE_R16 + r) * row_bytes;
        for (int64_t b = 0; b < n / 32; ++b) {
            uint8_t *o = dst + b * blk_bytes, *qs = o + qoff;
            const uint8_t *x = row + b * src_blk;
            uint16_t *dd = (uint16_t *)o;
            dd[r] = ((const uint16_t *)x)[0];  // d (and m) as stored: the first two halves
            if (has_min) dd[16 + r] = ((const uint16_t *)x)[1];
            for (int sl = 0; sl < (type == 8 ? 8 : 4); ++sl) memcpy(qs + sl * 64 + 4 * r, x + qs_at + 4 * sl, 4);
            if (has_h) {  // bit j of qh is element j's fifth bit: slice j / 4, lane j % 4
                uint32_t qh;
                memcpy(&qh, x + qh_at, 4);
                if (rase_r16_h_lanes(type))
                    for (int i = 0; i < 4; ++i) {
                        uint8_t hb = 0;
                        for (int sl = 0; sl < 8; ++sl) hb |= (uint8_t)(((qh >> (4 * sl + i)) & 1) << sl);
                        o[hoff + 4 * r + i] = hb;
                    }
                else {
                    uint64_t *h = (uint64_t *)(o + hoff);
                    for (int sl = 0; sl < 8; ++sl)
                        h[sl] = (h[sl] & ~(0xFull << (4 * r))) | ((uint64_t)((qh >> (4 * sl)) & 0xF) << (4 * r));
                }
            }
        }
    }
}

// ---------------------------------------------------------------- the scalar reference
// y[t * ys + r] for rows r < nr of the group at w and tokens t < nt (activation t at
// a + t * astride): the definition every kernel below must equal bit for bit.

typedef void (*rase_r16_fn)(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, float *y,
                            int64_t ys, int nr);

// element 4 s + i of row r of the repacked block o, as the integer ggml's dot product uses
static inline int rase_r16_weight(int type, const uint8_t *o, int s, int r, int i) {
    const uint8_t *qs = o + rase_r16_qoff(type);
    if (type == 8) return (int8_t)qs[s * 64 + 4 * r + i];
    const uint8_t b = qs[(s & 3) * 64 + 4 * r + i];
    int v = s < 4 ? (b & 0xF) : (b >> 4);
    if (rase_r16_h_lanes(type)) v |= ((o[rase_r16_hoff(type) + 4 * r + i] >> s) & 1) << 4;
    else if (rase_r16_has_h(type)) {
        uint64_t h;
        memcpy(&h, o + rase_r16_hoff(type) + 8 * s, 8);
        v |= (int)((h >> (4 * r + i)) & 1) << 4;
    }
    return type == 2 ? v - 8 : type == 6 ? v - 16 : v;
}

// ggml's horizontal sum of an 8-lane accumulator (rase_avx2_hsum's order)
static inline float rase_hsum8(const float *a) {
    return ((a[4] + a[0]) + (a[6] + a[2])) + ((a[5] + a[1]) + (a[7] + a[3]));
}

static void rase_r16_ref(int type, int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, float *y,
                         int64_t ys, int nr) {
    const int has_min = rase_r16_has_min(type);
    const size_t blk = rase_r16_blk(type);
    for (int t = 0; t < nt; ++t)
        for (int r = 0; r < nr; ++r) {
            float acc[8] = {0}, summ = 0.0f;
            for (int64_t b = 0; b < n / 32; ++b) {
                const uint8_t *o = w + b * blk;
                const uint16_t *dd = (const uint16_t *)o;
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
                    for (int i = 0; i < 4; ++i) isum += rase_r16_weight(type, o, sl, r, i) * yq[4 * sl + i];
                    acc[sl] = __builtin_fmaf(scale, (float)isum, acc[sl]);
                }
                if (has_min) {
                    const float mt = rase_fp16_to_fp32(dd[16 + r]) * sy;
                    summ = summ + mt;
                }
            }
            y[t * ys + r] = rase_hsum8(acc) + summ;
        }
}

#define RASE_R16_REF(NAME, TYPE)                                                              \
    static void NAME(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, float *y, \
                     int64_t ys, int nr) { rase_r16_ref(TYPE, n, w, a, astride, nt, y, ys, nr); }
RASE_R16_REF(r16_q8_0_ref, 8)
RASE_R16_REF(r16_q4_1_ref, 3)
RASE_R16_REF(r16_q5_1_ref, 7)

// ---------------------------------------------------------------- AVX2

static inline int32_t rase_ld32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}


#if RASE_HAVE_X86
// y[t * ys + r] for r < nr: the 8 lanes of token t's result
RASE_TARGET_AVX2 static RASE_INLINE void rase_r16_store8(__m256 v, float *y, int nr) {
    if (nr >= 8) { _mm256_storeu_ps(y, v); return; }
    float tmp[8];
    _mm256_storeu_ps(tmp, v);
    memcpy(y, tmp, (size_t)nr * sizeof(float));
}

// u8 x s8, the exact sum of each 4 products in its 32-bit lane (no int16 pair saturates for
// these types: at most 2 * 128 * 127)
RASE_TARGET_AVX2 static RASE_INLINE __m256i rase_dot4_avx2(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

#ifndef RASE_R16_CHUNK
#define RASE_R16_CHUNK 8  // 32-blocks per chunk: both halves of a chunk in turn, from L1
#endif

// TYPE (ggml id): 8 q8_0 (signed weights, ggml's sign trick); 3 q4_1, 7 q5_1
// (unsigned). Few tokens (decode, memory-bound): each half of the group (rows 8 h .. 8 h + 7) in
// turn, block by block, all 8 slices unpacked at once; per token 8 accumulators whose lanes are rows.
#define RASE_R16_BLOCKS_AVX2(NAME, TYPE, RT)                                                  \
    RASE_TARGET_AVX2 static RASE_INLINE void NAME##_blocks(int64_t n, const uint8_t *w, const void *a, \
                                                         size_t astride, const int nt, float *y, \
                                                         int64_t ys, int nr) {                \
        enum { HAS_MIN = TYPE == 3 || TYPE == 7, NIB = TYPE != 8, HAS_H = TYPE == 7, \
               SIGNED = !HAS_MIN };                                                   \
        const RT *blk = (const RT *)w;                                                        \
        const int halves = nr > 8 ? 2 : 1, pf = (int)sizeof(RT) / halves;                     \
        __m256 acc_h[2][4][8], summ_h[2][4];                                                  \
        for (int h = 0; h < halves; ++h)                                                      \
            for (int t = 0; t < nt; ++t) {                                                    \
                summ_h[h][t] = _mm256_setzero_ps();                                           \
                for (int sl = 0; sl < 8; ++sl) acc_h[h][t][sl] = _mm256_setzero_ps();         \
            }                                                                                 \
        for (int64_t c0 = 0; c0 < n / 32; c0 += RASE_R16_CHUNK)                               \
        for (int h = 0; h < halves; ++h) {                                                    \
            __m256 (*acc)[8] = acc_h[h], *summ = summ_h[h];                                   \
            for (int64_t b = c0; b < n / 32 && b < c0 + RASE_R16_CHUNK; ++b) {                \
                RASE_PREFETCH_AHEAD((const char *)&blk[b] + h * pf, pf);  /* each half its share: one stream */ \
                __m256i q[8];                                                                 \
                if (NIB) {                                                                    \
                    const __m256i m4 = _mm256_set1_epi8(0xF);                                \
                    for (int k = 0; k < 4; ++k) {                                             \
                        const __m256i raw = _mm256_loadu_si256((const __m256i *)(blk[b].q[k] + 32 * h)); \
                        q[k] = _mm256_and_si256(raw, m4);                                     \
                        q[k + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);           \
                    }                                                                         \
                    if (HAS_H)  /* the fifth bit: or 16 */                                    \
                        for (int k = 0; k < 8; ++k) {                                         \
                            const __m256i hb = rase_avx2_bytes_from_bits32((const uint8_t *)&blk[b] + rase_r16_hoff(TYPE) + 8 * k + 4 * h); \
                            q[k] = _mm256_or_si256(q[k], _mm256_and_si256(hb, _mm256_set1_epi8(0x10))); \
                        }                                                                     \
                } else {                                                                      \
                    for (int k = 0; k < 8; ++k) q[k] = _mm256_loadu_si256((const __m256i *)(blk[b].q[k] + 32 * h)); \
                }                                                                             \
                const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk[b].d + 8 * h))); \
                for (int t = 0; t < nt; ++t) {                                                \
                    const int8_t *yq;                                                         \
                    const float *dy;                                                          \
                    if (HAS_MIN) {                                                            \
                        const act_q8_1 *ya = (const act_q8_1 *)((const char *)a + t * astride) + b; \
                        yq = ya->qs, dy = &ya->d;                                             \
                        summ[t] = _mm256_add_ps(summ[t], _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk[b].d + 16 + 8 * h))), \
                                                                       _mm256_broadcast_ss(&ya->s))); \
                    } else {                                                                  \
                        const act_q8_0 *ya = (const act_q8_0 *)((const char *)a + t * astride) + b; \
                        yq = ya->qs, dy = &ya->d;                                             \
                    }                                                                         \
                    const __m256 scale = _mm256_mul_ps(dw, _mm256_broadcast_ss(dy));          \
                    for (int sl = 0; sl < 8; ++sl) {  /* signed: |w| x (y with w's sign) */  \
                        const __m256i ysl = _mm256_set1_epi32(rase_ld32(yq + 4 * sl));       \
                        const __m256i i32 = SIGNED                                            \
                            ? rase_dot4_avx2(_mm256_sign_epi8(q[sl], q[sl]), _mm256_sign_epi8(ysl, q[sl])) \
                            : rase_dot4_avx2(q[sl], ysl);                                     \
                        acc[t][sl] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(i32), acc[t][sl]); \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        for (int h = 0; h < halves; ++h)                                                      \
            for (int t = 0; t < nt; ++t) {  /* rase_hsum8, lane by lane */                    \
                const __m256 *A = acc_h[h][t];                                                \
                const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(A[4], A[0]), _mm256_add_ps(A[6], A[2])), \
                                                 _mm256_add_ps(_mm256_add_ps(A[5], A[1]), _mm256_add_ps(A[7], A[3]))); \
                rase_r16_store8(_mm256_add_ps(sum, summ_h[h][t]), y + t * ys + 8 * h, nr - 8 * h); \
            }                                                                                 \
    }

// Many tokens (prefill, compute-bound): each half of the group in turn, its blocks in chunks of
// RASE_R16_CHUNK; per chunk one slice at a time over the chunk's blocks, that slice's weights
// unpacked once per block for every token of the tile, so only one accumulator per token is
// live (8 per token would spill). Each (row, slice) accumulator still sees its blocks in order:
// the scalar reference's FMAs exactly. Scales dw * dy are made once per chunk.
#define RASE_R16_NT_AVX2 8  // tokens per tile (the accumulators, weight and temporaries fit 16 ymm)
#ifndef RASE_R16_FEW_AVX2
#define RASE_R16_FEW_AVX2 4  // up to this many tokens block by block
#endif
#define RASE_R16_KERNEL_AVX2(NAME, TYPE, RT)                                                  \
    RASE_R16_BLOCKS_AVX2(NAME, TYPE, RT)                                                      \
    RASE_TARGET_AVX2 static RASE_INLINE void NAME##_body(int64_t n, const uint8_t *w, const void *a, \
                                                         size_t astride, const int nt, float *y, \
                                                         int64_t ys, int nr) {                \
        enum { HAS_MIN = TYPE == 3 || TYPE == 7, NIB = TYPE != 8, HAS_H = TYPE == 7, \
               SIGNED = !HAS_MIN, ASZ = HAS_MIN ? sizeof(act_q8_1) : sizeof(act_q8_0) };      \
        const RT *blk = (const RT *)w;                                                        \
        const int64_t nb = n / 32;                                                            \
        __m256 sc[RASE_R16_NT_AVX2][RASE_R16_CHUNK];                                          \
        for (int h = 0; h < 2 && 8 * h < nr; ++h) {                                           \
            __m256 acc[RASE_R16_NT_AVX2][8], summ[RASE_R16_NT_AVX2];                          \
            for (int t = 0; t < nt; ++t) {                                                    \
                summ[t] = _mm256_setzero_ps();                                                \
                for (int sl = 0; sl < 8; ++sl) acc[t][sl] = _mm256_setzero_ps();              \
            }                                                                                 \
            for (int64_t c0 = 0; c0 < nb; c0 += RASE_R16_CHUNK) {                             \
                const int cb = nb - c0 < RASE_R16_CHUNK ? (int)(nb - c0) : RASE_R16_CHUNK;    \
                for (int j = 0; j < cb; ++j) {  /* dw * dy; the _1 types' summ in block order */ \
                    const RT *bk = &blk[c0 + j];                                              \
                    if (h == 0) RASE_PREFETCH_AHEAD(bk, sizeof(RT));                          \
                    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(bk->d + 8 * h))); \
                    for (int t = 0; t < nt; ++t) {                                            \
                        const char *ya = (const char *)a + t * astride + (c0 + j) * ASZ;      \
                        sc[t][j] = _mm256_mul_ps(dw, _mm256_broadcast_ss((const float *)ya)); \
                        if (HAS_MIN)                                                          \
                            summ[t] = _mm256_add_ps(summ[t], _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(bk->d + 16 + 8 * h))), \
                                                                           _mm256_broadcast_ss(&((const act_q8_1 *)ya)->s))); \
                    }                                                                         \
                }                                                                             \
                for (int sl = 0; sl < 8; ++sl) {                                              \
                    __m256 ac[RASE_R16_NT_AVX2];                                              \
                    for (int t = 0; t < nt; ++t) ac[t] = acc[t][sl];                          \
                    for (int j = 0; j < cb; ++j) {                                            \
                        const RT *bk = &blk[c0 + j];                                          \
                        __m256i q;                                                            \
                        if (NIB) {                                                            \
                            const __m256i raw = _mm256_loadu_si256((const __m256i *)(bk->q[sl & 3] + 32 * h)); \
                            q = _mm256_and_si256(sl < 4 ? raw : _mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0xF)); \
                            if (HAS_H) {  /* the fifth bit: or 16 */                          \
                                const __m256i hb = rase_avx2_bytes_from_bits32((const uint8_t *)bk + rase_r16_hoff(TYPE) + 8 * sl + 4 * h); \
                                q = _mm256_or_si256(q, _mm256_and_si256(hb, _mm256_set1_epi8(0x10))); \
                            }                                                                 \
                        } else {                                                              \
                            q = _mm256_loadu_si256((const __m256i *)(bk->q[sl] + 32 * h));   \
                        }                                                                     \
                        const __m256i u = SIGNED ? _mm256_sign_epi8(q, q) : q;                \
                        for (int t = 0; t < nt; ++t) {                                        \
                            const int8_t *yq = (const int8_t *)a + t * astride + (c0 + j) * ASZ + (HAS_MIN ? offsetof(act_q8_1, qs) : offsetof(act_q8_0, qs)); \
                            const __m256i ysl = _mm256_set1_epi32(rase_ld32(yq + 4 * sl));   \
                            const __m256i i32 = rase_dot4_avx2(u, SIGNED ? _mm256_sign_epi8(ysl, q) : ysl); \
                            ac[t] = _mm256_fmadd_ps(sc[t][j], _mm256_cvtepi32_ps(i32), ac[t]); \
                        }                                                                     \
                    }                                                                         \
                    for (int t = 0; t < nt; ++t) acc[t][sl] = ac[t];                          \
                }                                                                             \
            }                                                                                 \
            for (int t = 0; t < nt; ++t) {  /* rase_hsum8, lane by lane */                    \
                const __m256 *A = acc[t];                                                     \
                const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(A[4], A[0]), _mm256_add_ps(A[6], A[2])), \
                                                 _mm256_add_ps(_mm256_add_ps(A[5], A[1]), _mm256_add_ps(A[7], A[3]))); \
                rase_r16_store8(_mm256_add_ps(sum, summ[t]), y + t * ys + 8 * h, nr - 8 * h);  \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    /* up to RASE_R16_FEW_AVX2 tokens block by block (tiles of 4; Q4_1 2: its 4 tokens' 32 */  \
    /* accumulators spill more than unpacking twice costs, measured on Zen 3), more slice by slice */ \
    RASE_TARGET_AVX2 static void NAME(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, \
                                      float *y, int64_t ys, int nr) {                         \
        enum { NTB = TYPE == 3 ? 2 : 4 };                                                     \
        for (int t0 = 0; t0 < nt;) {                                                          \
            const void *at = (const char *)a + t0 * astride;                                  \
            float *yt = y + t0 * ys;                                                          \
            const int left = nt - t0, k = left <= RASE_R16_FEW_AVX2 ? (left < NTB ? left : NTB) \
                                                                    : (left < RASE_R16_NT_AVX2 ? left : RASE_R16_NT_AVX2); \
            if (left <= RASE_R16_FEW_AVX2) switch (k) {                                       \
                case 1: NAME##_blocks(n, w, at, astride, 1, yt, ys, nr); break;               \
                case 2: NAME##_blocks(n, w, at, astride, 2, yt, ys, nr); break;               \
                case 3: NAME##_blocks(n, w, at, astride, 3, yt, ys, nr); break;               \
                default: NAME##_blocks(n, w, at, astride, 4, yt, ys, nr); break;              \
            } else switch (k) {                                                               \
                case 1: NAME##_body(n, w, at, astride, 1, yt, ys, nr); break;                 \
                case 2: NAME##_body(n, w, at, astride, 2, yt, ys, nr); break;                 \
                case 3: NAME##_body(n, w, at, astride, 3, yt, ys, nr); break;                 \
                case 4: NAME##_body(n, w, at, astride, 4, yt, ys, nr); break;                 \
                case 5: NAME##_body(n, w, at, astride, 5, yt, ys, nr); break;                 \
                case 6: NAME##_body(n, w, at, astride, 6, yt, ys, nr); break;                 \
                case 7: NAME##_body(n, w, at, astride, 7, yt, ys, nr); break;                 \
                default: NAME##_body(n, w, at, astride, 8, yt, ys, nr); break;                \
            }                                                                                 \
            t0 += k;                                                                          \
        }                                                                                     \
    }

RASE_R16_KERNEL_AVX2(r16_q8_0_avx2, 8, r16_q8_0)
RASE_R16_KERNEL_AVX2(r16_q4_1_avx2, 3, r16_q4_1)
RASE_R16_KERNEL_AVX2(r16_q5_1_avx2, 7, r16_q5_1)

// ---------------------------------------------------------------- AVX-512 VNNI
// One zmm per slice holds all 16 rows, so the activation slice is a plain 4-byte broadcast.
// Q8_0's signed weights become unsigned, u = w + 128 (the sign bit flipped), with each
// slice's dot starting from -128 * the slice's activation sum (precomputed with the activation
// row, act_q8_0): the exact integer sum of the reference, then the same FMA per slice and hsum.
// Tiles of up to 2 tokens keep the 8 unpacked weight registers live beside 16 accumulators.
#define RASE_R16_TILE_512 2

// Many tokens: a group's weights unpacked once into a panel (per 32-block: the 8 slice registers,
// then d and m as f32; RASE_R16_PANEL bytes, in the thread's work buffer) that every pair of
// tokens then reads, instead of unpacking each block again for every pair. Same integers, same
// FMAs, same bits.
#define RASE_R16_PANEL 640     // panel bytes per 32-block: 8 x 64 slices, 16 d, 16 m (f32)
#define RASE_R16_PANEL_MIN 4   // tokens from which the panel pays
_Static_assert(RASE_R16_PANEL / 32 <= RASE_CHUNK_ROWS * sizeof(float), "a panel fits the rows kernels' work buffer");

// u[8], dw, dm of block b: unpacked from the repacked block, or read from the panel
#define RASE_R16_UNPACK_512(TYPE, RT, blk, b, panel, u, dw, dm)                              \
    do {                                                                                      \
        enum { NIB_ = TYPE != 8, HAS_H_ = TYPE == 7, HAS_MIN_ = TYPE == 3 || TYPE == 7 }; \
        if (panel) {                                                                          \
            const uint8_t *pb = (panel) + (b) * RASE_R16_PANEL;                               \
            for (int k = 0; k < 8; ++k) u[k] = _mm512_loadu_si512((const void *)(pb + 64 * k)); \
            dw = _mm512_loadu_ps((const float *)(pb + 512));                                   \
            dm = _mm512_loadu_ps((const float *)(pb + 576));                                   \
            break;                                                                            \
        }                                                                                     \
        const __m512i m4 = _mm512_set1_epi8(0xF), flip = _mm512_set1_epi8((char)0x80);         \
        const __m512i sixteen = _mm512_set1_epi8(0x10);                                      \
        RASE_PREFETCH_AHEAD(&blk[b], sizeof(RT));                                             \
        if (NIB_) {  /* the nibble, + 16 where Q5_1's fifth bit is set */                   \
            for (int k = 0; k < 4; ++k) {                                                     \
                const __m512i raw = _mm512_loadu_si512((const void *)blk[b].q[k]);            \
                u[k] = _mm512_and_si512(raw, m4);                                             \
                u[k + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);                   \
            }                                                                                 \
            if (HAS_H_)                                                                       \
                for (int k = 0; k < 8; ++k) u[k] = _mm512_mask_add_epi8(u[k], _load_mask64((__mmask64 *)((const uint8_t *)&blk[b] + rase_r16_hoff(TYPE)) + k), u[k], sixteen); \
        } else {                                                                              \
            for (int k = 0; k < 8; ++k) u[k] = _mm512_xor_si512(_mm512_loadu_si512((const void *)blk[b].q[k]), flip); \
        }                                                                                     \
        dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk[b].d));                  \
        dm = HAS_MIN_ ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)blk[b].d + 16))) : _mm512_setzero_ps(); \
    } while (0)

#define RASE_R16_KERNEL_512(NAME, TYPE, RT)                                                   \
    RASE_TARGET_AVX512 static RASE_INLINE void NAME##_body(int64_t n, const uint8_t *w, const uint8_t *panel, \
                                                           const void *a, size_t astride, const int nt, float *y, \
                                                           int64_t ys, int nr) {              \
        enum { HAS_MIN = TYPE == 3 || TYPE == 7, SIGNED = !HAS_MIN };                         \
        __m512 acc[RASE_R16_TILE_512][8], summ[RASE_R16_TILE_512];                            \
        for (int t = 0; t < nt; ++t) {                                                        \
            summ[t] = _mm512_setzero_ps();                                                    \
            for (int sl = 0; sl < 8; ++sl) acc[t][sl] = _mm512_setzero_ps();                  \
        }                                                                                     \
        const RT *blk = (const RT *)w;                                                        \
        for (int64_t b = 0; b < n / 32; ++b) {                                                \
            __m512i u[8];                                                                     \
            __m512 dw, dm;                                                                    \
            RASE_R16_UNPACK_512(TYPE, RT, blk, b, panel, u, dw, dm);                          \
            for (int t = 0; t < nt; ++t) {                                                    \
                const int8_t *yb;  /* slices and starts broadcast from memory */              \
                const int32_t *nbp = 0;                                                       \
                float dy;                                                                     \
                if (HAS_MIN) {                                                                \
                    const act_q8_1 *ya = (const act_q8_1 *)((const char *)a + t * astride) + b; \
                    yb = ya->qs, dy = ya->d;                                                  \
                    summ[t] = _mm512_add_ps(summ[t], _mm512_mul_ps(dm, _mm512_set1_ps(ya->s))); \
                } else {  /* the activation's own -B x slice-sum starts */                    \
                    const act_q8_0 *ya = (const act_q8_0 *)((const char *)a + t * astride) + b; \
                    yb = ya->qs, dy = ya->d, nbp = ya->m128;                                 \
                }                                                                             \
                const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(dy));                   \
                for (int sl = 0; sl < 8; ++sl) {                                              \
                    const __m512i i0 = SIGNED ? _mm512_set1_epi32(nbp[sl]) : _mm512_setzero_si512(); \
                    const __m512i i32 = _mm512_dpbusd_epi32(i0, u[sl], _mm512_set1_epi32(rase_ld32(yb + 4 * sl))); \
                    acc[t][sl] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(i32), acc[t][sl]); \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        for (int t = 0; t < nt; ++t) {  /* rase_hsum8, lane by lane */                        \
            const __m512 *A = acc[t];                                                         \
            const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(A[4], A[0]), _mm512_add_ps(A[6], A[2])), \
                                             _mm512_add_ps(_mm512_add_ps(A[5], A[1]), _mm512_add_ps(A[7], A[3]))); \
            _mm512_mask_storeu_ps(y + t * ys, (__mmask16)((1u << nr) - 1), _mm512_add_ps(sum, summ[t])); \
        }                                                                                     \
    }                                                                                         \
    /* tokens in pairs over the repacked blocks (panel NULL) or over the group's panel */      \
    RASE_TARGET_AVX512 static RASE_INLINE void NAME##_pairs(int64_t n, const uint8_t *w, const uint8_t *panel, const void *a, \
                                                size_t astride, int nt, float *y, int64_t ys, int nr) { \
        for (int t0 = 0; t0 < nt; t0 += RASE_R16_TILE_512) {                                  \
            if (nt - t0 >= 2) NAME##_body(n, w, panel, (const char *)a + t0 * astride, astride, 2, y + t0 * ys, ys, nr); \
            else NAME##_body(n, w, panel, (const char *)a + t0 * astride, astride, 1, y + t0 * ys, ys, nr); \
        }                                                                                     \
    }                                                                                         \
    RASE_TARGET_AVX512 static void NAME(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, \
                                        float *y, int64_t ys, int nr) {                       \
        NAME##_pairs(n, w, 0, a, astride, nt, y, ys, nr);                                     \
    }

// all T tokens of one group through a panel unpacked into work (n / 32 * RASE_R16_PANEL bytes);
// only for the types whose unpacking costs more than reading it back (the table below)
#define RASE_R16_PANEL_512(NAME, TYPE, RT)                                                    \
    RASE_TARGET_AVX512 static void NAME##_panel(int64_t n, const uint8_t *w, const void *a, size_t astride, int T, \
                                                float *y, int64_t ys, int nr, uint8_t *work) {  \
        const RT *blk = (const RT *)w;                                                        \
        for (int64_t b = 0; b < n / 32; ++b) {                                                \
            __m512i u[8];                                                                     \
            __m512 dw, dm;                                                                    \
            RASE_R16_UNPACK_512(TYPE, RT, blk, b, (const uint8_t *)0, u, dw, dm);             \
            uint8_t *pb = work + b * RASE_R16_PANEL;                                          \
            for (int k = 0; k < 8; ++k) _mm512_storeu_si512((void *)(pb + 64 * k), u[k]);     \
            _mm512_storeu_ps((float *)(pb + 512), dw);                                         \
            _mm512_storeu_ps((float *)(pb + 576), dm);                                         \
        }                                                                                     \
        NAME##_pairs(n, w, work, a, astride, T, y, ys, nr);                                   \
    }

RASE_R16_KERNEL_512(r16_q8_0_vnni, 8, r16_q8_0)
RASE_R16_KERNEL_512(r16_q4_1_vnni, 3, r16_q4_1)
RASE_R16_KERNEL_512(r16_q5_1_vnni, 7, r16_q5_1)
RASE_R16_PANEL_512(r16_q5_1_vnni, 7, r16_q5_1)
#  define RASE_R16_X86_FN(f) f
#  define RASE_R16_PANEL_FN(f) f##_panel
#else
#  define RASE_R16_X86_FN(f) 0
#  define RASE_R16_PANEL_FN(f) 0
#endif

#include "_repack_k.h"
#include "_repack_q6k.h"

#define RASE_R16_TILE 8  // tokens per call of a 32-block type's kernel (the AVX-512 ones split it in 2s)
#include "_repack_bs.h"  // Q4_0, Q5_0: block-sum numerics

// ---------------------------------------------------------------- the table, by ggml type id

// y[t * ys + r] for rows r < nr of the group at w and all T tokens, the group's weights unpacked
// once into work (n / 32 * RASE_R16_PANEL bytes)
typedef void (*rase_r16_panel_fn)(int64_t n, const uint8_t *w, const void *a, size_t astride, int T, float *y,
                                  int64_t ys, int nr, uint8_t *work);

typedef struct {
    size_t blk_bytes;                   // bytes per 16 rows x 32 columns (a K block is 8 of these); 0 = not repacked
    rase_r16_fn kern[RASE_ISA_COUNT];   // [scalar reference, AVX2, AVX-512 VNNI]: the same bits
    int tile;                           // tokens per kernel call
    rase_r16_panel_fn panel[RASE_ISA_COUNT];  // optional: a group's T tokens over a panel (the same bits)
    int block_sum;                      // 1: block-sum numerics (_repack_bs.h), not llama.cpp's order
    int panel_min;                      // tokens from which the panel pays (0: RASE_R16_PANEL_MIN)
} rase_r16_traits;

// a panel only where unpacking a block costs more than reading it back (Q5_1: the fifth-bit
// masks; Q6_K: two planes and the high bits per value; measured slower for Q4_1, Q8_0 at 6-16 tokens)
static const rase_r16_traits R16_TRAITS[RASE_GGML_TYPE_COUNT] = {
    [2] = {sizeof(r16_q4_0), {r16_q4_0_ref, RASE_R16_X86_FN(r16_q4_0_avx2), RASE_R16_X86_FN(r16_q4_0_vnni)}, RASE_R16_TILE,
           {0}, 1},
    [3] = {sizeof(r16_q4_1), {r16_q4_1_ref, RASE_R16_X86_FN(r16_q4_1_avx2), RASE_R16_X86_FN(r16_q4_1_vnni)}, RASE_R16_TILE},
    [6] = {sizeof(r16_q5_0), {r16_q5_0_ref, RASE_R16_X86_FN(r16_q5_0_avx2), RASE_R16_X86_FN(r16_q5_0_vnni)}, RASE_R16_TILE,
           {0}, 1},
    [7] = {sizeof(r16_q5_1), {r16_q5_1_ref, RASE_R16_X86_FN(r16_q5_1_avx2), RASE_R16_X86_FN(r16_q5_1_vnni)}, RASE_R16_TILE,
           {0, 0, RASE_R16_PANEL_FN(r16_q5_1_vnni)}},
    [8] = {sizeof(r16_q8_0), {r16_q8_0_ref, RASE_R16_X86_FN(r16_q8_0_avx2), RASE_R16_X86_FN(r16_q8_0_vnni)}, RASE_R16_TILE},
    [12] = {sizeof(r16_q4_k) / 8, {r16_q4_k_ref, RASE_R16_X86_FN(r16_q4_k_avx2), RASE_R16_X86_FN(r16_q4_k_vnni)}, RASE_R16K_TILE},
    [13] = {sizeof(r16_q5_k) / 8, {r16_q5_k_ref, RASE_R16_X86_FN(r16_q5_k_avx2), RASE_R16_X86_FN(r16_q5_k_vnni)}, RASE_R16K_TILE},
    [14] = {sizeof(r16_q6_k) / 8, {r16_q6_k_ref, RASE_R16_X86_FN(r16_q6_k_avx2), RASE_R16_X86_FN(r16_q6_k_vnni)}, RASE_R16K_TILE,
            {0, 0, RASE_R16_PANEL_FN(r16_q6_k_vnni)}, 0, 12},  // the panel from 12 tokens (measured: 168 vs 165 GOPS; 4: 128 vs 165)
};

static inline rase_r16_fn rase_r16_for(int type, int isa) {
    for (int i = isa; i > 0; --i)
        if (R16_TRAITS[type].kern[i]) return R16_TRAITS[type].kern[i];
    return R16_TRAITS[type].kern[RASE_ISA_SCALAR];
}

// Y[t * ys + r] for rows [r0, r1) (r0 a multiple of 16) of a repacked (rows x n) matrix and T
// tokens of A (rows `as` bytes apart), group by group: through the ISA's panel kernel from
// RASE_R16_PANEL_MIN tokens (work: the thread's, or NULL), else tiles of the type's tile of tokens.
static void rase_r16_rows(int isa, int type, const uint8_t *packed, int64_t group_bytes, int64_t n, const uint8_t *A,
                          size_t as, int T, float *Y, int64_t ys, int64_t r0, int64_t r1, uint8_t *work) {
    const rase_r16_fn kern = rase_r16_for(type, isa);
    const int panel_min = R16_TRAITS[type].panel_min ? R16_TRAITS[type].panel_min : RASE_R16_PANEL_MIN;
    const rase_r16_panel_fn panel = T >= panel_min && work ? R16_TRAITS[type].panel[isa] : 0;
    const int tile = R16_TRAITS[type].tile;
    for (int64_t g = r0 / RASE_R16; g * RASE_R16 < r1; ++g) {
        const uint8_t *pg = packed + g * group_bytes;
        const int nr = r1 - g * RASE_R16 < RASE_R16 ? (int)(r1 - g * RASE_R16) : RASE_R16;
        if (panel) {
            panel(n, pg, A, as, T, Y + g * RASE_R16, ys, nr, work);
            continue;
        }
        for (int t0 = 0; t0 < T; t0 += tile) {
            const int nt = T - t0 < tile ? T - t0 : tile;
            kern(n, pg, A + (size_t)t0 * as, as, nt, Y + (int64_t)t0 * ys + g * RASE_R16, ys, nr);
        }
    }
}

// bytes of a repacked (rows x n) matrix
static inline size_t rase_r16_bytes(int type, int64_t rows, int64_t n) {
    return (size_t)((rows + RASE_R16 - 1) / RASE_R16) * (size_t)(n / 32) * R16_TRAITS[type].blk_bytes;
}

// groups [g0, g1) of the matrix, split over n_threads (at load, outside any forward); one loop
// per type so each is compiled with its type a constant
#define RASE_R16_REPACK_LOOP(T)                                                                        \
    _Pragma("omp parallel for num_threads(n_threads) schedule(static) if (g1 - g0 >= 64)")             \
    for (int64_t g = g0; g < g1; ++g)                                                                  \
        T == 14 ? rase_r16_repack_q6_k(src, row_bytes, rows, n, g, dst + g * group)                     \
        : T >= 12 ? rase_r16_repack_k(T, src, row_bytes, rows, n, g, dst + g * group)                  \
                : rase_r16_repack_group(T, src, row_bytes, rows, n, g, dst + g * group, R16_TRAITS[T].blk_bytes)

static void rase_r16_repack(int type, const uint8_t *src, int64_t row_bytes, int64_t rows, int64_t n, uint8_t *dst,
                            int64_t g0, int64_t g1, int n_threads) {
    const size_t group = (size_t)(n / 32) * R16_TRAITS[type].blk_bytes;
    (void)n_threads;  // used by the pragma
    switch (type) {
        case 2: RASE_R16_REPACK_LOOP(2); break;
        case 3: RASE_R16_REPACK_LOOP(3); break;
        case 6: RASE_R16_REPACK_LOOP(6); break;
        case 7: RASE_R16_REPACK_LOOP(7); break;
        case 12: RASE_R16_REPACK_LOOP(12); break;
        case 13: RASE_R16_REPACK_LOOP(13); break;
        case 14: RASE_R16_REPACK_LOOP(14); break;
        default: RASE_R16_REPACK_LOOP(8); break;
    }
}

// Row `row` of a repacked (rows x n) matrix back in ggml's plain blocks (dst: n / blck blocks),
// the inverse of the repack (a permutation of the same bytes): the tied token embedding is looked
// up from the output matrix's repacked copy, so the file's rows are never read after load.
static void rase_r16_unpack_row(int type, const uint8_t *packed, int64_t group_bytes, int64_t n, int64_t row,
                                uint8_t *dst) {
    const uint8_t *pg = packed + (row / RASE_R16) * group_bytes;
    const int r = (int)(row % RASE_R16);
    if (type == 12 || type == 13) {
        rase_r16_unpack_row_k(type, pg, n, r, dst);
        return;
    }
    if (type == 14) {
        rase_r16_unpack_row_q6_k(pg, n, r, dst);
        return;
    }
    const int dst_blk = QUANT_TRAITS[type].size, has_min = rase_r16_has_min(type);
    const size_t blk_bytes = R16_TRAITS[type].blk_bytes, qoff = rase_r16_qoff(type), hoff = rase_r16_hoff(type);
    const int qs_at = dst_blk - (type == 8 ? 32 : 16), qh_at = qs_at - 4;
    for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t *o = pg + b * blk_bytes, *qs = o + qoff;
        uint8_t *x = dst + b * dst_blk;
        const uint16_t *dd = (const uint16_t *)o;
        memcpy(x, &dd[r], 2);
        if (has_min) memcpy(x + 2, &dd[16 + r], 2);
        for (int sl = 0; sl < (type == 8 ? 8 : 4); ++sl) memcpy(x + qs_at + 4 * sl, qs + sl * 64 + 4 * r, 4);
        if (rase_r16_has_h(type)) {  // bit j of qh: element j's fifth bit (slice j / 4, lane j % 4)
            uint32_t qh = 0;
            for (int j = 0; j < 32; ++j) {
                const int sl = j / 4, i = j % 4;
                uint32_t bit;
                if (rase_r16_h_lanes(type)) bit = (o[hoff + 4 * r + i] >> sl) & 1;
                else {
                    uint64_t h;
                    memcpy(&h, o + hoff + 8 * sl, 8);
                    bit = (uint32_t)(h >> (4 * r + i)) & 1;
                }
                qh |= bit << j;
            }
            memcpy(x + qh_at, &qh, 4);
        }
    }
}

#endif  // RASE_REPACK_H
