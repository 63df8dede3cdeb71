// rase/_repack_bs.h: Q4_0 in block-sum numerics, over the 16-row repacked layout (_repack.h).
//
// Numerics (the one definition for Q4_0, every ISA and tile): per row, per 32-block b in order,
// isum_b = sum over the block's 32 elements of (nibble - 8) * y, an exact integer; then
// acc = fma(f32(d_w) * d_y, (float)isum_b, acc) from acc = 0; the result is acc. One FMA per
// block instead of llama.cpp's vec_dot order (8 slice accumulators, one FMA per slice, a tree):
// no llama.cpp path has this order, so Q4_0 is held to the KL tolerance against llama.cpp
// (tests/test_kl.py), not to its bits. The integer sums make every ISA's result identical.
// Kernels: each slice's products as unsigned nibble x signed y (maddubs / vpdpbusd), the 8
// slices summed in int16 (at most 8 x 2 x 15 x 127 = 30480) or int32, and the -8 * sum(y) term
// from the quantized activation block (act_q8_0.m8).
#ifndef RASE_REPACK_BS_H
#define RASE_REPACK_BS_H

static void r16_q4_0_ref(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, float *y,
                         int64_t ys, int nr) {
    for (int t = 0; t < nt; ++t)
        for (int r = 0; r < nr; ++r) {
            float acc = 0.0f;
            for (int64_t b = 0; b < n / 32; ++b) {
                const r16_q4_0 *o = (const r16_q4_0 *)w + b;
                const act_q8_0 *ya = (const act_q8_0 *)((const char *)a + t * astride) + b;
                int isum = 0;
                for (int k = 0; k < 32; ++k) {
                    const uint8_t q = o->q[(k / 4) & 3][4 * r + k % 4];
                    isum += ((k < 16 ? q & 0xF : q >> 4) - 8) * ya->qs[k];
                }
                acc = __builtin_fmaf(rase_fp16_to_fp32(o->d[r]) * ya->d, (float)isum, acc);
            }
            y[t * ys + r] = acc;
        }
}

#if RASE_HAVE_X86
// Both halves of the group per chunk of RASE_R16_CHUNK blocks (each prefetching its share of
// the block ahead, so the weight stream never pauses), every token per block: its 8 slice dots
// summed in int16, one madd, the -8 sum(y) start, one convert, one FMA per row.
RASE_TARGET_AVX2 static RASE_INLINE void r16_q4_0_avx2_body(int64_t n, const uint8_t *w, const void *a,
                                                           size_t astride, const int nt, float *y, int64_t ys,
                                                           int nr) {
    const r16_q4_0 *blk = (const r16_q4_0 *)w;
    const int halves = nr > 8 ? 2 : 1, pf = (int)sizeof(r16_q4_0) / halves;
    const __m256i m4 = _mm256_set1_epi8(0xF), ones = _mm256_set1_epi16(1);
    __m256 acc[2][RASE_R16_TILE];
    for (int h = 0; h < halves; ++h)
        for (int t = 0; t < nt; ++t) acc[h][t] = _mm256_setzero_ps();
    for (int64_t c0 = 0; c0 < n / 32; c0 += RASE_R16_CHUNK)
        for (int h = 0; h < halves; ++h)
            for (int64_t b = c0; b < n / 32 && b < c0 + RASE_R16_CHUNK; ++b) {
                RASE_PREFETCH_AHEAD((const char *)&blk[b] + h * pf, pf);
                __m256i q[8];
                for (int k = 0; k < 4; ++k) {
                    const __m256i raw = _mm256_loadu_si256((const __m256i *)(blk[b].q[k] + 32 * h));
                    q[k] = _mm256_and_si256(raw, m4);
                    q[k + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                }
                const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk[b].d + 8 * h)));
                for (int t = 0; t < nt; ++t) {
                    const act_q8_0 *ya = (const act_q8_0 *)((const char *)a + t * astride) + b;
                    __m256i s16 = _mm256_maddubs_epi16(q[0], _mm256_set1_epi32(rase_ld32(ya->qs)));
                    for (int sl = 1; sl < 8; ++sl)
                        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(q[sl], _mm256_set1_epi32(rase_ld32(ya->qs + 4 * sl))));
                    const __m256i i32 = _mm256_add_epi32(_mm256_madd_epi16(s16, ones), _mm256_set1_epi32(ya->m8));
                    acc[h][t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_broadcast_ss(&ya->d)), _mm256_cvtepi32_ps(i32),
                                                acc[h][t]);
                }
            }
    for (int h = 0; h < halves; ++h)
        for (int t = 0; t < nt; ++t) rase_r16_store8(acc[h][t], y + t * ys + 8 * h, nr - 8 * h);
}

// The 16 rows in one zmm; the 8 slices accumulate in int32 from the -8 sum(y) start (vpdpbusd).
RASE_TARGET_AVX512 static RASE_INLINE void r16_q4_0_vnni_body(int64_t n, const uint8_t *w, const void *a,
                                                             size_t astride, const int nt, float *y, int64_t ys,
                                                             int nr) {
    const r16_q4_0 *blk = (const r16_q4_0 *)w;
    const __m512i m4 = _mm512_set1_epi8(0xF);
    __m512 acc[RASE_R16_TILE];
    for (int t = 0; t < nt; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / 32; ++b) {
        RASE_PREFETCH_AHEAD(&blk[b], sizeof(r16_q4_0));
        __m512i u[8];
        for (int k = 0; k < 4; ++k) {
            const __m512i raw = _mm512_loadu_si512((const void *)blk[b].q[k]);
            u[k] = _mm512_and_si512(raw, m4);
            u[k + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk[b].d));
        for (int t = 0; t < nt; ++t) {
            const act_q8_0 *ya = (const act_q8_0 *)((const char *)a + t * astride) + b;
            __m512i i32 = _mm512_set1_epi32(ya->m8);
            for (int sl = 0; sl < 8; ++sl)
                i32 = _mm512_dpbusd_epi32(i32, u[sl], _mm512_set1_epi32(rase_ld32(ya->qs + 4 * sl)));
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(ya->d)), _mm512_cvtepi32_ps(i32), acc[t]);
        }
    }
    for (int t = 0; t < nt; ++t) _mm512_mask_storeu_ps(y + t * ys, (__mmask16)((1u << nr) - 1), acc[t]);
}

// nt (<= RASE_R16_TILE) tokens, the count a constant in the body: _repack_k.h's entry switch
_Static_assert(RASE_R16_TILE == 8, "RASE_R16K_ENTRY's switch covers tiles of 1..8 tokens");
RASE_R16K_ENTRY(r16_q4_0_avx2, RASE_TARGET_AVX2)
RASE_R16K_ENTRY(r16_q4_0_vnni, RASE_TARGET_AVX512)
#endif

#endif  // RASE_REPACK_BS_H
