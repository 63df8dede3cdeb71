// rase/kernels/_repack_bs.h: Q4_0 and Q5_0 in block-sum numerics, over the 16-row repacked layout
// (_repack.h).
//
// Numerics (the one definition per type, every ISA and tile): per row, per 32-block b in order,
// isum_b = sum over the block's 32 elements of w * y with w = nibble - 8 (Q4_0) or
// (nibble | 16 x fifth bit) - 16 (Q5_0), an exact integer; then
// acc = fma(f32(d_w) * d_y, (float)isum_b, acc) from acc = 0; the result is acc. One FMA per
// block instead of llama.cpp's vec_dot order (8 slice accumulators, one FMA per slice, a tree):
// no llama.cpp path has this order, so these types are held to the KL tolerance against
// llama.cpp (tests/models/test_kl.py), not to its bits. The integer sums make every ISA's result identical.
// Kernels: each slice's products as unsigned u = w + B (B = 8, 16) x signed y (maddubs /
// vpdpbusd), summed in int16 (Q4_0: all 8 slices, at most 8 x 2 x 15 x 128 = 30720; Q5_0: 4 at
// a time, 4 x 2 x 31 x 128 = 31744) or int32, and the -B x sum(y) term from the quantized
// activation block (act_q8_0.m8 = -8 sum(y), doubled for Q5_0).
#ifndef RASE_REPACK_BS_H
#define RASE_REPACK_BS_H

#include "_repack.h"

// type: Q4_0 or Q5_0; the -B sum(y) start of the block's integer sum
static inline int32_t rase_bs_start(int type, const act_q8_0 *ya) { return type == RASE_TYPE_Q5_0 ? 2 * ya->m8 : ya->m8; }

static void rase_bs_ref(int type, int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, float *y,
                        int64_t ys, int nr) {
    const size_t blk = rase_r16_blk(type);
    for (int t = 0; t < nt; ++t)
        for (int r = 0; r < nr; ++r) {
            float acc = 0.0f;
            for (int64_t b = 0; b < n / 32; ++b) {
                const uint8_t *o = w + b * blk;
                const act_q8_0 *ya = (const act_q8_0 *)((const char *)a + t * astride) + b;
                int isum = 0;
                for (int k = 0; k < 32; ++k) isum += rase_r16_weight(type, o, k / 4, r, k % 4) * ya->qs[k];
                acc = __builtin_fmaf(rase_fp16_to_fp32(((const uint16_t *)o)[r]) * ya->d, (float)isum, acc);
            }
            y[t * ys + r] = acc;
        }
}
#define RASE_BS_REF(NAME, TYPE)                                                               \
    static void NAME(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, float *y, \
                     int64_t ys, int nr) { rase_bs_ref(TYPE, n, w, a, astride, nt, y, ys, nr); }
RASE_BS_REF(r16_q4_0_ref, RASE_TYPE_Q4_0)
RASE_BS_REF(r16_q5_0_ref, RASE_TYPE_Q5_0)

#if RASE_HAVE_X86
// Both halves of the group per chunk of RASE_R16_CHUNK blocks (each prefetching its share of
// the block ahead, so the weight stream never pauses), every token per block: its slice dots
// summed in int16, one madd per 4 (Q5_0) or 8 (Q4_0) slices, the -B sum(y) start, one convert,
// one FMA per row.
RASE_TARGET_AVX2 static RASE_INLINE void rase_bs_avx2_body(const int nt, const int type, int64_t n, const uint8_t *w,
                                                          const void *a, size_t astride, float *y,
                                                          int64_t ys, int nr) {
    const size_t bsz = rase_r16_blk(type);
    const int halves = nr > 8 ? 2 : 1, pf = (int)bsz / halves;
    const __m256i m4 = _mm256_set1_epi8(0xF), ones = _mm256_set1_epi16(1), x10 = _mm256_set1_epi8(0x10);
    __m256 acc[2][RASE_R16_TILE];
    for (int h = 0; h < halves; ++h)
        for (int t = 0; t < nt; ++t) acc[h][t] = _mm256_setzero_ps();
    for (int64_t c0 = 0; c0 < n / 32; c0 += RASE_R16_CHUNK)
        for (int h = 0; h < halves; ++h)
            for (int64_t b = c0; b < n / 32 && b < c0 + RASE_R16_CHUNK; ++b) {
                const uint8_t *o = w + b * bsz, *qs = o + rase_r16_qoff(type);
                RASE_PREFETCH_AHEAD(o + h * pf, pf);
                __m256i q[8];
                for (int k = 0; k < 4; ++k) {
                    const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 64 * k + 32 * h));
                    q[k] = _mm256_and_si256(raw, m4);
                    q[k + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                }
                if (type == RASE_TYPE_Q5_0) {  // slice k's fifth bits: bit k of each lane's byte, moved to bit 4
                    const __m256i hv = _mm256_loadu_si256((const __m256i *)(o + rase_r16_hoff(type) + 32 * h));
                    q[0] = _mm256_or_si256(q[0], _mm256_and_si256(_mm256_slli_epi16(hv, 4), x10));
                    q[1] = _mm256_or_si256(q[1], _mm256_and_si256(_mm256_slli_epi16(hv, 3), x10));
                    q[2] = _mm256_or_si256(q[2], _mm256_and_si256(_mm256_slli_epi16(hv, 2), x10));
                    q[3] = _mm256_or_si256(q[3], _mm256_and_si256(_mm256_slli_epi16(hv, 1), x10));
                    q[4] = _mm256_or_si256(q[4], _mm256_and_si256(hv, x10));
                    q[5] = _mm256_or_si256(q[5], _mm256_and_si256(_mm256_srli_epi16(hv, 1), x10));
                    q[6] = _mm256_or_si256(q[6], _mm256_and_si256(_mm256_srli_epi16(hv, 2), x10));
                    q[7] = _mm256_or_si256(q[7], _mm256_and_si256(_mm256_srli_epi16(hv, 3), x10));
                }
                const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)o + 8 * h)));
                for (int t = 0; t < nt; ++t) {
                    const act_q8_0 *ya = (const act_q8_0 *)((const char *)a + t * astride) + b;
#define RASE_BS_DOT(sl) _mm256_maddubs_epi16(q[sl], _mm256_set1_epi32(rase_ld32(ya->qs + 4 * (sl))))
                    __m256i i32;
                    if (type == RASE_TYPE_Q5_0) {
                        const __m256i lo = _mm256_add_epi16(_mm256_add_epi16(RASE_BS_DOT(0), RASE_BS_DOT(1)),
                                                            _mm256_add_epi16(RASE_BS_DOT(2), RASE_BS_DOT(3)));
                        const __m256i hi = _mm256_add_epi16(_mm256_add_epi16(RASE_BS_DOT(4), RASE_BS_DOT(5)),
                                                            _mm256_add_epi16(RASE_BS_DOT(6), RASE_BS_DOT(7)));
                        i32 = _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones));
                    } else {
                        __m256i s16 = RASE_BS_DOT(0);
                        for (int sl = 1; sl < 8; ++sl) s16 = _mm256_add_epi16(s16, RASE_BS_DOT(sl));
                        i32 = _mm256_madd_epi16(s16, ones);
                    }
#undef RASE_BS_DOT
                    i32 = _mm256_add_epi32(i32, _mm256_set1_epi32(rase_bs_start(type, ya)));
                    acc[h][t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_broadcast_ss(&ya->d)), _mm256_cvtepi32_ps(i32),
                                                acc[h][t]);
                }
            }
    for (int h = 0; h < halves; ++h)
        for (int t = 0; t < nt; ++t) rase_r16_store8(acc[h][t], y + t * ys + 8 * h, nr - 8 * h);
}

// The 16 rows in one zmm; the 8 slices accumulate in int32 from the -B sum(y) start (vpdpbusd).
RASE_TARGET_AVX512 static RASE_INLINE void rase_bs_vnni_body(const int nt, const int type, int64_t n, const uint8_t *w,
                                                            const void *a, size_t astride, float *y,
                                                            int64_t ys, int nr) {
    const size_t bsz = rase_r16_blk(type);
    const __m512i m4 = _mm512_set1_epi8(0xF), x10 = _mm512_set1_epi8(0x10);
    __m512 acc[RASE_R16_TILE];
    for (int t = 0; t < nt; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t *o = w + b * bsz, *qs = o + rase_r16_qoff(type);
        RASE_PREFETCH_AHEAD(o, bsz);
        __m512i u[8];
        for (int k = 0; k < 4; ++k) {
            const __m512i raw = _mm512_loadu_si512((const void *)(qs + 64 * k));
            u[k] = _mm512_and_si512(raw, m4);
            u[k + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
        }
        if (type == RASE_TYPE_Q5_0) {  // slice k's fifth bits: bit k of each lane's byte, a byte mask
            const __m512i hv = _mm512_loadu_si512((const void *)(o + rase_r16_hoff(type)));
            for (int k = 0; k < 8; ++k)
                u[k] = _mm512_mask_add_epi8(u[k], _mm512_test_epi8_mask(hv, _mm512_set1_epi8((char)(1 << k))), u[k], x10);
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o));
        for (int t = 0; t < nt; ++t) {
            const act_q8_0 *ya = (const act_q8_0 *)((const char *)a + t * astride) + b;
            __m512i i32 = _mm512_set1_epi32(rase_bs_start(type, ya));
            for (int sl = 0; sl < 8; ++sl)
                i32 = _mm512_dpbusd_epi32(i32, u[sl], _mm512_set1_epi32(rase_ld32(ya->qs + 4 * sl)));
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(ya->d)), _mm512_cvtepi32_ps(i32), acc[t]);
        }
    }
    for (int t = 0; t < nt; ++t) _mm512_mask_storeu_ps(y + t * ys, (__mmask16)((1u << nr) - 1), acc[t]);
}

RASE_R16_ENTRY(r16_q4_0_avx2, RASE_TARGET_AVX2, rase_bs_avx2_body, RASE_TYPE_Q4_0)
RASE_R16_ENTRY(r16_q4_0_vnni, RASE_TARGET_AVX512, rase_bs_vnni_body, RASE_TYPE_Q4_0)
RASE_R16_ENTRY(r16_q5_0_avx2, RASE_TARGET_AVX2, rase_bs_avx2_body, RASE_TYPE_Q5_0)
RASE_R16_ENTRY(r16_q5_0_vnni, RASE_TARGET_AVX512, rase_bs_vnni_body, RASE_TYPE_Q5_0)
#endif

#if RASE_HAVE_NEON
// Quarter by quarter (rows 4q .. 4q + 3) within each chunk of RASE_R16_CHUNK blocks: the
// quarter's 8 slices unpacked once per block (the unsigned u = w + B), every token's 8 slice
// dots summed in int32 from the -B sum(y) start, one convert, one FMA per row.
static RASE_INLINE void rase_bs_neon_body(const int nt, const int dp, const int type, int64_t n, const uint8_t *w,
                                          const void *a, size_t astride, float *y, int64_t ys, int nr) {
    const size_t bsz = rase_r16_blk(type);
    const int quarters = (nr + 3) / 4;
    float32x4_t acc[4][RASE_R16_TILE];
    for (int q = 0; q < quarters; ++q)
        for (int t = 0; t < nt; ++t) acc[q][t] = vdupq_n_f32(0.0f);
    for (int64_t c0 = 0; c0 < n / 32; c0 += RASE_R16_CHUNK)
        for (int q = 0; q < quarters; ++q)
            for (int64_t b = c0; b < n / 32 && b < c0 + RASE_R16_CHUNK; ++b) {
                const uint8_t *o = w + b * bsz, *qs = o + rase_r16_qoff(type);
                if (q == 0) RASE_PREFETCH_AHEAD(o, bsz);
                int8x16_t u[8];
                uint8x16_t hv = vdupq_n_u8(0);
                if (type == RASE_TYPE_Q5_0) hv = vld1q_u8(o + rase_r16_hoff(type) + 16 * q);
                for (int k = 0; k < 8; ++k)  // slice k's fifth bits: bit k of each lane's byte
                    u[k] = rase_neon_nibbles(vld1q_u8(qs + 64 * (k & 3) + 16 * q), k >= 4, type == RASE_TYPE_Q5_0, hv, k);
                const float32x4_t dw = rase_neon_h4((const uint16_t *)o + 4 * q);
                for (int t = 0; t < nt; ++t) {
                    const act_q8_0 *ya = (const act_q8_0 *)((const char *)a + t * astride) + b;
                    int32x4_t i32 = vdupq_n_s32(rase_bs_start(type, ya));
                    for (int k = 0; k < 8; ++k) i32 = rase_neon_dot4(dp, i32, u[k], rase_neon_slice(ya->qs + 4 * k));
                    acc[q][t] = vfmaq_f32(acc[q][t], vmulq_n_f32(dw, ya->d), vcvtq_f32_s32(i32));
                }
            }
    for (int q = 0; q < quarters; ++q)
        for (int t = 0; t < nt; ++t) rase_neon_store4(acc[q][t], y + t * ys + 4 * q, nr - 4 * q);
}
RASE_NEON_ENTRIES(r16_q4_0, rase_bs_neon_body, RASE_TYPE_Q4_0)
RASE_NEON_ENTRIES(r16_q5_0, rase_bs_neon_body, RASE_TYPE_Q5_0)

// i8mm: np pairs of tokens; per block the quarter's slices zipped into row pairs (smmla's 2 x 8
// operands: slices 2k, 2k + 1), each pair of tokens' 8 bytes k against them: 4 smmla give a row
// pair x token pair's 32-element sums, from the -B sum(y) start, one convert, one FMA per lane.
static RASE_INLINE void rase_bs_mmla_body(const int np, const int type, int64_t n, const uint8_t *w, const void *a,
                                          size_t astride, float *y, int64_t ys, int nr) {
    const size_t bsz = rase_r16_blk(type);
    const int quarters = (nr + 3) / 4;
    float32x4_t acc[4][2][RASE_R16_TILE / 2];  // [quarter][row pair][token pair]: r0 t0, r0 t1, r1 t0, r1 t1
    for (int q = 0; q < quarters; ++q)
        for (int rp = 0; rp < 2; ++rp)
            for (int p = 0; p < np; ++p) acc[q][rp][p] = vdupq_n_f32(0.0f);
    for (int64_t c0 = 0; c0 < n / 32; c0 += RASE_R16_CHUNK)
        for (int q = 0; q < quarters; ++q)
            for (int64_t b = c0; b < n / 32 && b < c0 + RASE_R16_CHUNK; ++b) {
                const uint8_t *o = w + b * bsz, *qs = o + rase_r16_qoff(type);
                if (q == 0) RASE_PREFETCH_AHEAD(o, bsz);
                int8x16_t u[8], A[4][2];
                uint8x16_t hv = vdupq_n_u8(0);
                if (type == RASE_TYPE_Q5_0) hv = vld1q_u8(o + rase_r16_hoff(type) + 16 * q);
                for (int k = 0; k < 8; ++k)
                    u[k] = rase_neon_nibbles(vld1q_u8(qs + 64 * (k & 3) + 16 * q), k >= 4, type == RASE_TYPE_Q5_0, hv, k);
                for (int k = 0; k < 4; ++k) rase_neon_row_pairs(u[2 * k], u[2 * k + 1], A[k]);
                const float32x4_t dw = rase_neon_h4((const uint16_t *)o + 4 * q);
                const float32x4_t dwp[2] = {vzip1q_f32(dw, dw), vzip2q_f32(dw, dw)};  // [d0 d0 d1 d1], [d2 d2 d3 d3]
                for (int p = 0; p < np; ++p) {
                    const act_q8_0 *y0 = (const act_q8_0 *)((const char *)a + (2 * p) * astride) + b;
                    const act_q8_0 *y1 = (const act_q8_0 *)((const char *)a + (2 * p + 1) * astride) + b;
                    int8x16_t B[4];
                    for (int k = 0; k < 4; ++k) B[k] = vcombine_s8(vld1_s8(y0->qs + 8 * k), vld1_s8(y1->qs + 8 * k));
                    const int32_t st[4] = {rase_bs_start(type, y0), rase_bs_start(type, y1), rase_bs_start(type, y0),
                                           rase_bs_start(type, y1)};
                    const float dyv[4] = {y0->d, y1->d, y0->d, y1->d};
                    const float32x4_t dy = vld1q_f32(dyv);
                    for (int rp = 0; rp < 2; ++rp) {
                        int32x4_t i32 = vld1q_s32(st);
                        for (int k = 0; k < 4; ++k) i32 = rase_neon_mmla(i32, A[k][rp], B[k]);
                        acc[q][rp][p] = vfmaq_f32(acc[q][rp][p], vmulq_f32(dwp[rp], dy), vcvtq_f32_s32(i32));
                    }
                }
            }
    for (int q = 0; q < quarters; ++q)
        for (int rp = 0; rp < 2 && 4 * q + 2 * rp < nr; ++rp)
            for (int p = 0; p < np; ++p)
                rase_neon_store22(acc[q][rp][p], y + 2 * p * ys + 4 * q + 2 * rp, ys, nr - 4 * q - 2 * rp);
}
RASE_MMLA_ENTRY(r16_q4_0, rase_bs_mmla_body, rase_bs_neon_body, RASE_TYPE_Q4_0)
RASE_MMLA_ENTRY(r16_q5_0, rase_bs_mmla_body, rase_bs_neon_body, RASE_TYPE_Q5_0)
#endif

#endif  // RASE_REPACK_BS_H
