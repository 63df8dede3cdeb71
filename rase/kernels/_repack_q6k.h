// rase/kernels/_repack_q6k.h: Q6_K repacked at load, 16 rows interleaved (the layout of _repack.h with a
// 256-column block), and its matmul kernels: 16 rows x up to 2 tokens per pass.
//
// Layout: one r16_q6_k per 16 rows x 256 columns, the size of the 16 plain blocks. d as in the
// file; sc[p][r] row r's scales 2p, 2p + 1 (one i16 pair per row once widened); then for each
// lane L (0..7) and half h (elements 128h ..), in the order the kernels read them (in the other
// order the hardware prefetcher lost the stream: 11 against 27 GB/s from DRAM on a Zen 4 core): hb[4r + i] =
// qh[32h + 4L + i] of row r (bits 0-1, 2-3, 4-5, 6-7: the high bits of vectors 4h .. 4h + 3) and
// q[a][4r + i] = ql[64h + 32a + 4L + i] (low nibble: vector 4h + a, high nibble: 4h + 2 + a).
//
// Numerics: llama.cpp's x86 one-token Q6_K (ggml's AVX2 vec_dot, the t1 fixtures' bits; spelled
// out in numpy in tests/kernels/test_kernels.py). Per row, 8 lanes: lane L of 256-block b is the exact integer
// sum over the 8 vectors v (32 elements each) of sc[2v + L / 4] x (the 4 products of elements
// 32v + 4L .. 32v + 4L + 3, values unsigned 0..63), minus 32 x (sc[2L] bsum[2L] + sc[2L + 1]
// bsum[2L + 1]); acc_L = fma(dy * dx, (float)lane_L, acc_L), block by block; the result is
// ((acc4 + acc0) + (acc6 + acc2)) + ((acc5 + acc1) + (acc7 + acc3)). The scalar reference, AVX2 and
// AVX-512 VNNI kernels compute the same integers, so they give the same bits.
#ifndef RASE_REPACK_Q6K_H
#define RASE_REPACK_Q6K_H

#include "_repack.h"

typedef struct { uint8_t hb[64]; uint8_t q[2][64]; } r16_q6_k_lane;
typedef struct { uint16_t d[16]; int8_t sc[8][16][2]; r16_q6_k_lane lane[8][2]; } r16_q6_k;
_Static_assert(sizeof(r16_q6_k) == 16 * sizeof(block_q6_K), "r16_q6_k");
#define RASE_R16Q6_TILE 2  // tokens per pass (8 accumulators each, beside 8 scales and temporaries)
// pshufb indices: in every 32-bit lane, its i16 0 (RASE_Q6K_DUP[0]) or i16 1 ([1]) in both halves
#define RASE_Q6K_DUP4(a) a, a + 1, a, a + 1
#define RASE_Q6K_DUP16(o) RASE_Q6K_DUP4(o), RASE_Q6K_DUP4(o + 4), RASE_Q6K_DUP4(o + 8), RASE_Q6K_DUP4(o + 12)
static const uint8_t RASE_Q6K_DUP[2][64] = {{RASE_Q6K_DUP16(0), RASE_Q6K_DUP16(0), RASE_Q6K_DUP16(0), RASE_Q6K_DUP16(0)},
                                            {RASE_Q6K_DUP16(2), RASE_Q6K_DUP16(2), RASE_Q6K_DUP16(2), RASE_Q6K_DUP16(2)}};

// Group g of a (rows x n) plain Q6_K matrix into dst (n / 256 blocks); rows past the end are zero.
static void rase_r16_repack_q6_k(const uint8_t *src, int64_t row_bytes, int64_t rows, int64_t n, int64_t g,
                                 uint8_t *dst) {
    r16_q6_k *o = (r16_q6_k *)dst;
    if ((g + 1) * RASE_R16 > rows) memset(dst, 0, (size_t)(n / 256) * sizeof(r16_q6_k));
    for (int r = 0; r < RASE_R16 && g * RASE_R16 + r < rows; ++r) {
        const block_q6_K *x = (const block_q6_K *)(src + (g * RASE_R16 + r) * row_bytes);
        for (int64_t b = 0; b < n / 256; ++b) {
            o[b].d[r] = x[b].d;
            for (int p = 0; p < 8; ++p) o[b].sc[p][r][0] = x[b].scales[2 * p], o[b].sc[p][r][1] = x[b].scales[2 * p + 1];
            for (int h = 0; h < 2; ++h)
                for (int L = 0; L < 8; ++L) {
                    r16_q6_k_lane *ln = &o[b].lane[L][h];
                    memcpy(ln->hb + 4 * r, x[b].qh + 32 * h + 4 * L, 4);
                    for (int a = 0; a < 2; ++a) memcpy(ln->q[a] + 4 * r, x[b].ql + 64 * h + 32 * a + 4 * L, 4);
                }
        }
    }
}

// Row r of group pg (n / 256 blocks) back in ggml's plain blocks at dst: the repack's inverse
static void rase_r16_unpack_row_q6_k(const uint8_t *pg, int64_t n, int r, uint8_t *dst) {
    const r16_q6_k *o = (const r16_q6_k *)pg;
    block_q6_K *x = (block_q6_K *)dst;
    for (int64_t b = 0; b < n / 256; ++b) {
        x[b].d = o[b].d[r];
        for (int p = 0; p < 8; ++p) x[b].scales[2 * p] = o[b].sc[p][r][0], x[b].scales[2 * p + 1] = o[b].sc[p][r][1];
        for (int h = 0; h < 2; ++h)
            for (int L = 0; L < 8; ++L) {
                const r16_q6_k_lane *ln = &o[b].lane[L][h];
                memcpy(x[b].qh + 32 * h + 4 * L, ln->hb + 4 * r, 4);
                for (int a = 0; a < 2; ++a) memcpy(x[b].ql + 64 * h + 32 * a + 4 * L, ln->q[a] + 4 * r, 4);
            }
    }
}

// element 4 slots of vector k (0..3) of half h, lane L, row r, slot i: the unsigned 6-bit value
static inline int rase_q6k_value(const r16_q6_k_lane *ln, int k, int r, int i) {
    const int nib = (ln->q[k & 1][4 * r + i] >> (4 * (k >> 1))) & 0xF;
    return nib | (((ln->hb[4 * r + i] >> (2 * k)) & 3) << 4);
}

// ---------------------------------------------------------------- the scalar reference

static void r16_q6_k_ref(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, float *y, int64_t ys,
                         int nr) {
    const r16_q6_k *blk = (const r16_q6_k *)w;
    for (int t = 0; t < nt; ++t)
        for (int r = 0; r < nr; ++r) {
            float acc[8] = {0};
            for (int64_t b = 0; b < n / 256; ++b) {
                const r16_q6_k *o = &blk[b];
                const block_q8_K *ya = RASE_ACT(block_q8_K, t, b);
                const float dxy = ya->d * rase_fp16_to_fp32(o->d[r]);
                for (int L = 0; L < 8; ++L) {
                    int lane = 0;
                    for (int v = 0; v < 8; ++v) {
                        const r16_q6_k_lane *ln = &o->lane[L][v / 4];
                        int dot = 0;
                        for (int i = 0; i < 4; ++i) dot += rase_q6k_value(ln, v % 4, r, i) * ya->qs[32 * v + 4 * L + i];
                        lane += o->sc[v][r][L / 4] * dot;
                    }
                    lane -= 32 * (o->sc[L][r][0] * ya->bsums[2 * L] + o->sc[L][r][1] * ya->bsums[2 * L + 1]);
                    acc[L] = __builtin_fmaf(dxy, (float)lane, acc[L]);
                }
            }
            y[t * ys + r] = rase_hsum8(acc);
        }
}

#if RASE_HAVE_X86
// ---------------------------------------------------------------- AVX2
// Rows 8h2 .. 8h2 + 7 (a row per 32-bit lane of a ymm) per pass; per (v, L): maddubs(values,
// broadcast activation) then madd with sc[2v + L / 4] in both i16 halves (at most 2 x 63 x 128
// per pair: no saturation), added into the lane's integer sum.
RASE_TARGET_AVX2 static RASE_INLINE void r16_q6_k_avx2_body(int64_t n, const uint8_t *w, const void *a, size_t astride,
                                                          const int nt, float *y, int64_t ys, int nr) {
    const r16_q6_k *blk = (const r16_q6_k *)w;
    const __m256i m4 = _mm256_set1_epi8(0xF), m30 = _mm256_set1_epi8(0x30);
    const __m256i dup_lo = _mm256_loadu_si256((const __m256i *)RASE_Q6K_DUP[0]);
    const __m256i dup_hi = _mm256_loadu_si256((const __m256i *)RASE_Q6K_DUP[1]);
    for (int h2 = 0; h2 < (nr > 8 ? 2 : 1); ++h2) {
        __m256 acc[RASE_R16Q6_TILE][8];
        for (int t = 0; t < nt; ++t)
            for (int L = 0; L < 8; ++L) acc[t][L] = _mm256_setzero_ps();
        for (int64_t b = 0; b < n / 256; ++b) {
            const r16_q6_k *o = &blk[b];
            RASE_PREFETCH_AHEAD(o, sizeof(r16_q6_k));
            __m256i P[8];  // row's (sc[2p], sc[2p + 1]) as i16
            for (int p = 0; p < 8; ++p) P[p] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(o->sc[p][8 * h2])));
            const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o->d + 8 * h2)));
            for (int L = 0; L < 8; ++L) {
                __m256i lane[RASE_R16Q6_TILE];
                for (int t = 0; t < nt; ++t)  // -32 (sc[2L] bsum[2L] + sc[2L + 1] bsum[2L + 1])
                    lane[t] = _mm256_slli_epi32(_mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(P[L],
                        _mm256_set1_epi32(rase_ld32(RASE_ACT(block_q8_K, t, b)->bsums + 2 * L)))), 5);
                for (int h = 0; h < 2; ++h) {
                    const r16_q6_k_lane *ln = &o->lane[L][h];
                    const __m256i A0 = _mm256_loadu_si256((const __m256i *)(ln->q[0] + 32 * h2));
                    const __m256i A1 = _mm256_loadu_si256((const __m256i *)(ln->q[1] + 32 * h2));
                    const __m256i H = _mm256_loadu_si256((const __m256i *)(ln->hb + 32 * h2));
                    __m256i u[4];
                    u[0] = _mm256_or_si256(_mm256_and_si256(A0, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
                    u[1] = _mm256_or_si256(_mm256_and_si256(A1, m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
                    u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A0, 4), m4), _mm256_and_si256(H, m30));
                    u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
                    for (int k = 0; k < 4; ++k) {
                        const int v = 4 * h + k;
                        const __m256i sc = _mm256_shuffle_epi8(P[v], L < 4 ? dup_lo : dup_hi);
                        for (int t = 0; t < nt; ++t) {
                            const __m256i ya = _mm256_set1_epi32(rase_ld32(RASE_ACT(block_q8_K, t, b)->qs + 32 * v + 4 * L));
                            lane[t] = _mm256_add_epi32(lane[t], _mm256_madd_epi16(_mm256_maddubs_epi16(u[k], ya), sc));
                        }
                    }
                }
                for (int t = 0; t < nt; ++t)
                    acc[t][L] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(RASE_ACT(block_q8_K, t, b)->d), dx),
                                                _mm256_cvtepi32_ps(lane[t]), acc[t][L]);
            }
        }
        for (int t = 0; t < nt; ++t) {
            const __m256 *A = acc[t];
            const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(A[4], A[0]), _mm256_add_ps(A[6], A[2])),
                                             _mm256_add_ps(_mm256_add_ps(A[5], A[1]), _mm256_add_ps(A[7], A[3])));
            rase_r16_store8(sum, y + t * ys + 8 * h2, nr - 8 * h2);
        }
    }
}

// ---------------------------------------------------------------- AVX-512 VNNI
// All 16 rows per zmm: per (v, L) maddubs then vpdpwssd with the scale pair; the value's two
// parts are merged with one ternary-logic op (low nibble from A, bits 4-5 from the masked H).
// Many tokens: the group's values unpacked once into a panel in the thread's work buffer (per
// block: u[L][v] 64 bytes each, the 8 widened scale pairs, dx as f32), which every pair of tokens
// then reads instead of unpacking each block again. Same integers, same bits.
#define RASE_Q6K_PANEL (64 * 64 + 8 * 64 + 64)  // panel bytes per 256-block
_Static_assert(RASE_Q6K_PANEL / 256 <= RASE_CHUNK_ROWS * sizeof(float), "a Q6_K panel fits the work buffer");

// u[4] (vectors 4h .. 4h + 3) of lane L: unpacked from the block o, or read from its panel block pb
RASE_TARGET_AVX512 static RASE_INLINE void rase_q6k_unpack_512(const r16_q6_k *o, const uint8_t *pb, int L, int h,
                                                             __m512i u[4]) {
    if (pb) {
        for (int k = 0; k < 4; ++k) u[k] = _mm512_loadu_si512((const void *)(pb + 64 * (8 * L + 4 * h + k)));
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30);
    const r16_q6_k_lane *ln = &o->lane[L][h];
    const __m512i A0 = _mm512_loadu_si512((const void *)ln->q[0]);
    const __m512i A1 = _mm512_loadu_si512((const void *)ln->q[1]);
    const __m512i H = _mm512_loadu_si512((const void *)ln->hb);
    // (A & 0xF) | Hm: ternlog 0xEC = (a & c) | b with c = 0x0F
    u[0] = _mm512_ternarylogic_epi32(A0, _mm512_and_si512(_mm512_slli_epi16(H, 4), m30), m4, 0xEC);
    u[1] = _mm512_ternarylogic_epi32(A1, _mm512_and_si512(_mm512_slli_epi16(H, 2), m30), m4, 0xEC);
    u[2] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(A0, 4), _mm512_and_si512(H, m30), m4, 0xEC);
    u[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(A1, 4), _mm512_and_si512(_mm512_srli_epi16(H, 2), m30), m4, 0xEC);
}

RASE_TARGET_AVX512 static RASE_INLINE void r16_q6_k_vnni_body(int64_t n, const uint8_t *w, const uint8_t *panel,
                                                            const void *a, size_t astride, const int nt, float *y,
                                                            int64_t ys, int nr) {
    const r16_q6_k *blk = (const r16_q6_k *)w;
    const __m512i dup_lo = _mm512_loadu_si512((const void *)RASE_Q6K_DUP[0]);
    const __m512i dup_hi = _mm512_loadu_si512((const void *)RASE_Q6K_DUP[1]);
    __m512 acc[RASE_R16Q6_TILE][8];
    for (int t = 0; t < nt; ++t)
        for (int L = 0; L < 8; ++L) acc[t][L] = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / 256; ++b) {
        const r16_q6_k *o = &blk[b];
        const uint8_t *pb = panel ? panel + b * RASE_Q6K_PANEL : 0;
        __m512i P[8];
        __m512 dx;
        if (pb) {
            for (int p = 0; p < 8; ++p) P[p] = _mm512_loadu_si512((const void *)(pb + 4096 + 64 * p));
            dx = _mm512_loadu_ps((const float *)(pb + 4608));
        } else {
            RASE_PREFETCH_AHEAD(o, sizeof(r16_q6_k));
            for (int p = 0; p < 8; ++p) P[p] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)o->sc[p]));
            dx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o->d));
        }
        for (int L = 0; L < 8; ++L) {
            __m512i lane[RASE_R16Q6_TILE];
            for (int t = 0; t < nt; ++t)
                lane[t] = _mm512_slli_epi32(_mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                    P[L], _mm512_set1_epi32(rase_ld32(RASE_ACT(block_q8_K, t, b)->bsums + 2 * L)))), 5);
            for (int h = 0; h < 2; ++h) {
                __m512i u[4];
                rase_q6k_unpack_512(o, pb, L, h, u);
                for (int k = 0; k < 4; ++k) {
                    const int v = 4 * h + k;
                    const __m512i sc = _mm512_shuffle_epi8(P[v], L < 4 ? dup_lo : dup_hi);
                    for (int t = 0; t < nt; ++t) {
                        const __m512i ya = _mm512_set1_epi32(rase_ld32(RASE_ACT(block_q8_K, t, b)->qs + 32 * v + 4 * L));
                        lane[t] = _mm512_dpwssd_epi32(lane[t], _mm512_maddubs_epi16(u[k], ya), sc);
                    }
                }
            }
            for (int t = 0; t < nt; ++t)
                acc[t][L] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(RASE_ACT(block_q8_K, t, b)->d), dx),
                                            _mm512_cvtepi32_ps(lane[t]), acc[t][L]);
        }
    }
    for (int t = 0; t < nt; ++t) {
        const __m512 *A = acc[t];
        const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(A[4], A[0]), _mm512_add_ps(A[6], A[2])),
                                         _mm512_add_ps(_mm512_add_ps(A[5], A[1]), _mm512_add_ps(A[7], A[3])));
        _mm512_mask_storeu_ps(y + t * ys, (__mmask16)((1u << nr) - 1), sum);
    }
}

// tokens in passes of up to 2, each with its count a constant; panel: NULL or the group's panel
RASE_TARGET_AVX512 static RASE_INLINE void r16_q6_k_vnni_pairs(int64_t n, const uint8_t *w, const uint8_t *panel,
                                                             const void *a, size_t astride, int nt, float *y, int64_t ys,
                                                             int nr) {
    for (int t0 = 0; t0 < nt; t0 += RASE_R16Q6_TILE) {
        const void *at = (const char *)a + (size_t)t0 * astride;
        if (nt - t0 >= 2) r16_q6_k_vnni_body(n, w, panel, at, astride, 2, y + t0 * ys, ys, nr);
        else r16_q6_k_vnni_body(n, w, panel, at, astride, 1, y + t0 * ys, ys, nr);
    }
}
RASE_TARGET_AVX512 static void r16_q6_k_vnni(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt,
                                            float *y, int64_t ys, int nr) {
    r16_q6_k_vnni_pairs(n, w, 0, a, astride, nt, y, ys, nr);
}
RASE_TARGET_AVX2 static void r16_q6_k_avx2(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt,
                                          float *y, int64_t ys, int nr) {
    for (int t0 = 0; t0 < nt; t0 += RASE_R16Q6_TILE) {
        const void *at = (const char *)a + (size_t)t0 * astride;
        if (nt - t0 >= 2) r16_q6_k_avx2_body(n, w, at, astride, 2, y + t0 * ys, ys, nr);
        else r16_q6_k_avx2_body(n, w, at, astride, 1, y + t0 * ys, ys, nr);
    }
}

// all T tokens of one group through a panel unpacked into work (n / 256 * RASE_Q6K_PANEL bytes)
RASE_TARGET_AVX512 static void r16_q6_k_vnni_panel(int64_t n, const uint8_t *w, const void *a, size_t astride, int T,
                                                  float *y, int64_t ys, int nr, uint8_t *work) {
    const r16_q6_k *blk = (const r16_q6_k *)w;
    for (int64_t b = 0; b < n / 256; ++b) {
        uint8_t *pb = work + b * RASE_Q6K_PANEL;
        for (int L = 0; L < 8; ++L)
            for (int h = 0; h < 2; ++h) {
                __m512i u[4];
                rase_q6k_unpack_512(&blk[b], 0, L, h, u);
                for (int k = 0; k < 4; ++k) _mm512_storeu_si512((void *)(pb + 64 * (8 * L + 4 * h + k)), u[k]);
            }
        for (int p = 0; p < 8; ++p)
            _mm512_storeu_si512((void *)(pb + 4096 + 64 * p), _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)blk[b].sc[p])));
        _mm512_storeu_ps((float *)(pb + 4608), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk[b].d)));
    }
    r16_q6_k_vnni_pairs(n, w, work, a, astride, T, y, ys, nr);
}
#endif

#if RASE_HAVE_NEON
// ---------------------------------------------------------------- NEON (ARMv8.0; sdot with dotprod)
// Quarter by quarter (rows 4q .. 4q + 3, a row per 32-bit lane), block by block: the quarter's
// scale pairs widened to i32 (SC[p][0]: sc[2p], SC[p][1]: sc[2p + 1] of each row), then per
// (L, v) the 4-product dots of every token times sc[2v + L / 4], added into the lane's integer.
static RASE_INLINE void r16_q6_k_neon_body(const int nt, const int dp, const int type, int64_t n, const uint8_t *w,
                                           const void *a, size_t astride, float *y, int64_t ys, int nr) {
    (void)type;
    const r16_q6_k *blk = (const r16_q6_k *)w;
    const uint8x16_t m4 = vdupq_n_u8(0xF), m30 = vdupq_n_u8(0x30);
    for (int q = 0; 4 * q < nr; ++q) {
        float32x4_t acc[RASE_R16_TILE][8];
        for (int t = 0; t < nt; ++t)
            for (int L = 0; L < 8; ++L) acc[t][L] = vdupq_n_f32(0.0f);
        for (int64_t b = 0; b < n / 256; ++b) {
            const r16_q6_k *o = &blk[b];
            if (q == 0) RASE_PREFETCH_AHEAD(o, sizeof(r16_q6_k));
            int32x4_t SC[8][2];
            for (int p = 0; p < 8; ++p) {
                const int16x8_t s16 = vmovl_s8(vld1_s8(o->sc[p][4 * q]));  // (sc[2p], sc[2p + 1]) of 4 rows
                SC[p][0] = vmovl_s16(vget_low_s16(vuzp1q_s16(s16, s16)));
                SC[p][1] = vmovl_s16(vget_low_s16(vuzp2q_s16(s16, s16)));
            }
            const float32x4_t dx = rase_neon_h4(o->d + 4 * q);
            for (int L = 0; L < 8; ++L) {
                int32x4_t lane[RASE_R16_TILE];
                for (int t = 0; t < nt; ++t) {  // -32 (sc[2L] bsum[2L] + sc[2L + 1] bsum[2L + 1])
                    const int16_t *bs = RASE_ACT(block_q8_K, t, b)->bsums + 2 * L;
                    lane[t] = vmulq_n_s32(vmlaq_n_s32(vmulq_n_s32(SC[L][0], bs[0]), SC[L][1], bs[1]), -32);
                }
                for (int h = 0; h < 2; ++h) {
                    const r16_q6_k_lane *ln = &o->lane[L][h];
                    const uint8x16_t A0 = vld1q_u8(ln->q[0] + 16 * q), A1 = vld1q_u8(ln->q[1] + 16 * q);
                    const uint8x16_t H = vld1q_u8(ln->hb + 16 * q);
                    int8x16_t u[4];
                    u[0] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(A0, m4), vandq_u8(vshlq_n_u8(H, 4), m30)));
                    u[1] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(A1, m4), vandq_u8(vshlq_n_u8(H, 2), m30)));
                    u[2] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(A0, 4), vandq_u8(H, m30)));
                    u[3] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(A1, 4), vandq_u8(vshrq_n_u8(H, 2), m30)));
                    for (int k = 0; k < 4; ++k) {
                        const int v = 4 * h + k;
                        for (int t = 0; t < nt; ++t) {
                            const int32x4_t d = rase_neon_dot4(dp, vdupq_n_s32(0), u[k],
                                                               rase_neon_slice(RASE_ACT(block_q8_K, t, b)->qs + 32 * v + 4 * L));
                            lane[t] = vmlaq_s32(lane[t], SC[v][L / 4], d);
                        }
                    }
                }
                for (int t = 0; t < nt; ++t)
                    acc[t][L] = vfmaq_f32(acc[t][L], vmulq_n_f32(dx, RASE_ACT(block_q8_K, t, b)->d), vcvtq_f32_s32(lane[t]));
            }
        }
        for (int t = 0; t < nt; ++t) {
            const float32x4_t *A = acc[t];
            const float32x4_t sum = vaddq_f32(vaddq_f32(vaddq_f32(A[4], A[0]), vaddq_f32(A[6], A[2])),
                                              vaddq_f32(vaddq_f32(A[5], A[1]), vaddq_f32(A[7], A[3])));
            rase_neon_store4(sum, y + t * ys + 4 * q, nr - 4 * q);
        }
    }
}
RASE_NEON_ENTRIES(r16_q6_k, r16_q6_k_neon_body, RASE_TYPE_Q6_K)
#endif

#endif  // RASE_REPACK_Q6K_H
