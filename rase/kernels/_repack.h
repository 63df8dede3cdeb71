// rase/kernels/_repack.h: the common header of the repack family (_repack_q.h, _repack_bs.h,
// _repack_k.h, _repack_q6k.h): the 16-row layout of the 32-element block types, repacked once at
// load, its scalar reference, and what every repacked kernel shares (tiles, stores, panels).
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
// Numerics: Q4_0 and Q5_0 have block-sum numerics (_repack_bs.h). Q8_0, Q4_1 and Q5_1
// (_repack_q.h) have llama.cpp's one-token (vec_dot) order, the same in the scalar reference and
// every SIMD kernel, for every tile shape. Per row, slice s has its own f32 accumulator (ggml's 8-lane accumulator, lane s):
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

// ---------------------------------------------------------------- repack (once, at load)

// Facts of the 32-element types' layouts, as functions of a constant type (they fold)
static inline int rase_r16_nib(int type) { return type != RASE_TYPE_Q8_0; }
static inline int rase_r16_has_min(int type) { return type == RASE_TYPE_Q4_1 || type == RASE_TYPE_Q5_1; }
static inline int rase_r16_has_h(int type) { return type == RASE_TYPE_Q5_0 || type == RASE_TYPE_Q5_1; }
// the fifth bits one byte per lane, bit s for slice s (Q5_0); else one 64-bit mask per slice (Q5_1)
static inline int rase_r16_h_lanes(int type) { return type == RASE_TYPE_Q5_0; }
// bytes of one plain block, and of one repacked block (16 rows x 32 columns: 16 plain ones)
static inline int rase_blk32_bytes(int type) {
    return type == RASE_TYPE_Q8_0 ? (int)sizeof(block_q8_0) : type == RASE_TYPE_Q4_0 ? (int)sizeof(block_q4_0)
         : type == RASE_TYPE_Q4_1 ? (int)sizeof(block_q4_1) : type == RASE_TYPE_Q5_0 ? (int)sizeof(block_q5_0)
         : (int)sizeof(block_q5_1);
}
static inline size_t rase_r16_blk(int type) { return 16 * (size_t)rase_blk32_bytes(type); }
// offsets in a repacked block: the nibble or byte planes, the fifth-bit masks
static inline size_t rase_r16_qoff(int type) { return rase_r16_has_min(type) ? 64 : 32; }
static inline size_t rase_r16_hoff(int type) { return rase_r16_qoff(type) + 256; }

// Group g of a (rows x n) plain matrix (rows `row_bytes` apart) into dst (n / 32 blocks).
static inline __attribute__((always_inline)) void rase_r16_repack_group(int type, const uint8_t *src, int64_t row_bytes,
                                                                      int64_t rows, int64_t n, int64_t g, uint8_t *dst) {
    const int src_blk = rase_blk32_bytes(type);
    const size_t blk_bytes = rase_r16_blk(type);
    const int has_min = rase_r16_has_min(type), has_h = rase_r16_has_h(type);
    const size_t qoff = rase_r16_qoff(type), hoff = rase_r16_hoff(type);
    // ggml's blocks end with their bytes (32) or nibbles (16), Q5_*'s 4 bytes of fifth bits before
    const int qs_at = src_blk - (type == RASE_TYPE_Q8_0 ? 32 : 16), qh_at = qs_at - 4;
    if ((g + 1) * RASE_R16 > rows) memset(dst, 0, (size_t)(n / 32) * blk_bytes);  // a full group writes every byte
    for (int r = 0; r < RASE_R16 && g * RASE_R16 + r < rows; ++r) {
        const uint8_t *row = src + (g * RASE_R16 + r) * row_bytes;
        for (int64_t b = 0; b < n / 32; ++b) {
            uint8_t *o = dst + b * blk_bytes, *qs = o + qoff;
            const uint8_t *x = row + b * src_blk;
            uint16_t *dd = (uint16_t *)o;
            dd[r] = ((const uint16_t *)x)[0];  // d (and m) as stored: the first two halves
            if (has_min) dd[16 + r] = ((const uint16_t *)x)[1];
            for (int sl = 0; sl < (type == RASE_TYPE_Q8_0 ? 8 : 4); ++sl) memcpy(qs + sl * 64 + 4 * r, x + qs_at + 4 * sl, 4);
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


// element 4 s + i of row r of the repacked block o, as the integer ggml's dot product uses
static inline int rase_r16_weight(int type, const uint8_t *o, int s, int r, int i) {
    const uint8_t *qs = o + rase_r16_qoff(type);
    if (type == RASE_TYPE_Q8_0) return (int8_t)qs[s * 64 + 4 * r + i];
    const uint8_t b = qs[(s & 3) * 64 + 4 * r + i];
    int v = s < 4 ? (b & 0xF) : (b >> 4);
    if (rase_r16_h_lanes(type)) v |= ((o[rase_r16_hoff(type) + 4 * r + i] >> s) & 1) << 4;
    else if (rase_r16_has_h(type)) {
        uint64_t h;
        memcpy(&h, o + rase_r16_hoff(type) + 8 * s, 8);
        v |= (int)((h >> (4 * r + i)) & 1) << 4;
    }
    return type == RASE_TYPE_Q4_0 ? v - 8 : type == RASE_TYPE_Q5_0 ? v - 16 : v;
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

// ---------------------------------------------------------------- shared by the kernels

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

#endif

#if RASE_HAVE_NEON
// The NEON kernels' vocabulary. A group's 16 rows are 4 quarters (rows 4q .. 4q + 3); the 16
// bytes of slice s for quarter q are one register, 4 rows x their 4 elements, so a broadcast
// 4-byte activation slice gives each row's 4-product sum in its own 32-bit lane.

// acc + per lane k: sum_i w[4k + i] * y[4k + i] (y: the activation slice in every lane), exact.
// dp: the dot-product instruction (sdot, only in RASE_TARGET_DOTPROD functions: written as asm,
// since GCC will not inline the intrinsic into a body shared with the plain NEON entries), else
// widening multiplies (|w y| <= 128 x 128 fits int16) and pairwise adds.
static RASE_INLINE int32x4_t rase_neon_dot4(const int dp, int32x4_t acc, int8x16_t w, int8x16_t y) {
    if (dp) {
        __asm__(".arch_extension dotprod\n\tsdot %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(w), "w"(y));
        return acc;
    }
    const int16x8_t p0 = vmull_s8(vget_low_s8(w), vget_low_s8(y)), p1 = vmull_high_s8(w, y);
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1)));
}

// acc (2 x 2 int32: [r0 t0, r0 t1, r1 t0, r1 t1]) + a . b^T, a: rows r0, r1 (8 int8 each), b:
// tokens t0, t1 (8 int8 each), exact (smmla, i8mm; asm for the reason above)
static RASE_INLINE int32x4_t rase_neon_mmla(int32x4_t acc, int8x16_t a, int8x16_t b) {
    __asm__(".arch_extension i8mm\n\tsmmla %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(a), "w"(b));
    return acc;
}

// the row pairs of a quarter's slices s0 (elements 0..3 of rows 4q..4q+3) and s1 (4..7):
// pr[0] = rows 4q, 4q+1, pr[1] = rows 4q+2, 4q+3, 8 elements each (smmla's a)
static RASE_INLINE void rase_neon_row_pairs(int8x16_t s0, int8x16_t s1, int8x16_t pr[2]) {
    pr[0] = vreinterpretq_s8_s32(vzip1q_s32(vreinterpretq_s32_s8(s0), vreinterpretq_s32_s8(s1)));
    pr[1] = vreinterpretq_s8_s32(vzip2q_s32(vreinterpretq_s32_s8(s0), vreinterpretq_s32_s8(s1)));
}

// the 2 x 2 lanes of a row pair (rows r, r + 1 < r + nr) and tokens t0, t0 + 1 stored to y
static RASE_INLINE void rase_neon_store22(float32x4_t v, float *y, int64_t ys, int nr) {
    float tmp[4];
    vst1q_f32(tmp, v);
    y[0] = tmp[0], y[ys] = tmp[1];
    if (nr > 1) y[1] = tmp[2], y[ys + 1] = tmp[3];
}

// the 4 activation bytes at y in every 32-bit lane
static RASE_INLINE int8x16_t rase_neon_slice(const int8_t *y) { return vreinterpretq_s8_s32(vdupq_n_s32(rase_ld32(y))); }

// 4 f16 at h -> f32 (exact)
static RASE_INLINE float32x4_t rase_neon_h4(const uint16_t *h) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h))); }

// a quarter's slice from its nibble plane raw: the low (hi = 0) or high nibbles, or-ed with 16
// where bit s of hv's byte is set when fifth (Q5_0, Q5_K: one byte of fifth bits per lane)
static RASE_INLINE int8x16_t rase_neon_nibbles(uint8x16_t raw, int hi, int fifth, uint8x16_t hv, int s) {
    uint8x16_t v = hi ? vshrq_n_u8(raw, 4) : vandq_u8(raw, vdupq_n_u8(0xF));
    if (fifth) v = vorrq_u8(v, vandq_u8(vshlq_u8(hv, vdupq_n_s8((int8_t)(4 - s))), vdupq_n_u8(0x10)));
    return vreinterpretq_s8_u8(v);
}

// 16 bits (little endian) -> 16 bytes, 0xFF where the bit is set; lane j <- bit j
static RASE_INLINE uint8x16_t rase_neon_bytes_from_bits16(const uint8_t *x) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t v = vcombine_u8(vdup_n_u8(x[0]), vdup_n_u8(x[1]));
    return vtstq_u8(v, vld1q_u8(bit));
}

// y[i] = v[i] for i < nr (<= 4)
static RASE_INLINE void rase_neon_store4(float32x4_t v, float *y, int nr) {
    if (nr >= 4) { vst1q_f32(y, v); return; }
    float tmp[4];
    vst1q_f32(tmp, v);
    memcpy(y, tmp, (size_t)nr * sizeof(float));
}

// The traits-row entries of BODY(nt, dp, type, n, w, a, astride, y, ys, nr) for TYPE: NAME_neon
// and NAME_sdot (the dot-product instruction), the tile's token count a constant in each
#define RASE_NEON_ENTRIES(NAME, BODY, TYPE)                                                                    \
    static void NAME##_neon(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, float *y,        \
                            int64_t ys, int nr) {                                                                \
        RASE_CONST_NT(RASE_R16_TILE, nt, BODY, 0, TYPE, n, w, a, astride, y, ys, nr);                            \
    }                                                                                                            \
    RASE_TARGET_DOTPROD static void NAME##_sdot(int64_t n, const uint8_t *w, const void *a, size_t astride,      \
                                                int nt, float *y, int64_t ys, int nr) {                          \
        RASE_CONST_NT(RASE_R16_TILE, nt, BODY, 1, TYPE, n, w, a, astride, y, ys, nr);                            \
    }

// The i8mm entry NAME_mmla: MMLA(np, type, ...) for the tile's token pairs (np a constant), then
// BODY's dotprod instance for an odd last token
#define RASE_MMLA_ENTRY(NAME, MMLA, BODY, TYPE)                                                                 \
    RASE_TARGET_I8MM static void NAME##_mmla(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, \
                                             float *y, int64_t ys, int nr) {                                     \
        if (nt >= 2) RASE_CONST_NT(RASE_R16_TILE / 2, nt / 2, MMLA, TYPE, n, w, a, astride, y, ys, nr);          \
        if (nt % 2)                                                                                              \
            BODY(1, 1, TYPE, n, w, (const char *)a + (size_t)(nt - 1) * astride, astride, y + (nt - 1) * ys, ys, nr); \
    }
#endif

#ifndef RASE_R16_CHUNK
#define RASE_R16_CHUNK 8  // 32-blocks per chunk: both halves of a chunk in turn, from L1
#endif

#define RASE_R16_NT_AVX2 8  // tokens per tile of the AVX2 slice kernels (accumulators, weight, temporaries: 16 ymm)
#ifndef RASE_R16_FEW_AVX2
#define RASE_R16_FEW_AVX2 4  // up to this many tokens the AVX2 kernels go block by block
#endif
#define RASE_R16_TILE_512 2  // tokens per pass of the AVX-512 kernels
#define RASE_R16_TILE 8      // tokens per call of a 32-block type's kernel (the AVX-512 ones split it in 2s)

// Many tokens: a group's weights unpacked once into a panel that every tile of tokens then reads
#define RASE_R16_PANEL 640     // panel bytes per 32-block: 8 x 64 slices, 16 d, 16 m (f32)
#define RASE_R16_PANEL_MIN 4   // tokens from which the panel pays
_Static_assert(RASE_R16_PANEL / 32 <= RASE_CHUNK_ROWS * sizeof(float), "a panel fits the rows kernels' work buffer");

// The traits-row entry NAME(n, w, a, astride, nt, y, ys, nr) of BODY(nt, type, n, w, a, astride, y,
// ys, nr) for TYPE on TARGET, the tile's token count (1..RASE_R16_TILE) a constant in each instance
#define RASE_R16_ENTRY(NAME, TARGET, BODY, TYPE)                                                          \
    TARGET static void NAME(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, float *y, \
                            int64_t ys, int nr) {                                                         \
        RASE_CONST_NT(RASE_R16_TILE, nt, BODY, TYPE, n, w, a, astride, y, ys, nr);                         \
    }


// Row r (< 16) of the repacked group pg back in ggml's plain blocks (dst: n / 32 blocks), the
// inverse of the repack (a permutation of the same bytes)
static inline __attribute__((always_inline)) void rase_r16_unpack_group_row(int type, const uint8_t *pg, int64_t n, int r,
                                                                          uint8_t *dst) {
    const int dst_blk = rase_blk32_bytes(type), has_min = rase_r16_has_min(type);
    const size_t blk_bytes = rase_r16_blk(type), qoff = rase_r16_qoff(type), hoff = rase_r16_hoff(type);
    const int qs_at = dst_blk - (type == RASE_TYPE_Q8_0 ? 32 : 16), qh_at = qs_at - 4;
    for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t *o = pg + b * blk_bytes, *qs = o + qoff;
        uint8_t *x = dst + b * dst_blk;
        const uint16_t *dd = (const uint16_t *)o;
        memcpy(x, &dd[r], 2);
        if (has_min) memcpy(x + 2, &dd[16 + r], 2);
        for (int sl = 0; sl < (type == RASE_TYPE_Q8_0 ? 8 : 4); ++sl) memcpy(x + qs_at + 4 * sl, qs + sl * 64 + 4 * r, 4);
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

// The layout entries of a 32-element type's traits row: its repack and its row unpack
#define RASE_R16_LAYOUT(NAME, TYPE)                                                                       \
    static void r16_repack_##NAME(const uint8_t *src, int64_t row_bytes, int64_t rows, int64_t n, int64_t g, \
                                  uint8_t *dst) { rase_r16_repack_group(TYPE, src, row_bytes, rows, n, g, dst); } \
    static void r16_unpack_##NAME(const uint8_t *pg, int64_t n, int r, uint8_t *dst) {                      \
        rase_r16_unpack_group_row(TYPE, pg, n, r, dst);                                                   \
    }
RASE_R16_LAYOUT(q8_0, RASE_TYPE_Q8_0)
RASE_R16_LAYOUT(q4_0, RASE_TYPE_Q4_0)
RASE_R16_LAYOUT(q4_1, RASE_TYPE_Q4_1)
RASE_R16_LAYOUT(q5_0, RASE_TYPE_Q5_0)
RASE_R16_LAYOUT(q5_1, RASE_TYPE_Q5_1)

#endif  // RASE_REPACK_H
