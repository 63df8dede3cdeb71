// rase/kernels/_repack_q.h: the matmul kernels of Q8_0, Q4_1 and Q5_1 over the 16-row repacked layout
// (_repack.h), 16 rows x a tile of tokens per call, in llama.cpp's one-token order (the numerics
// _repack.h states; rase_r16_ref is their definition). Each kernel is one always-inline function
// taking the type (and the tile's token count) as a constant: the entries at the end instantiate
// it per type and ISA.
#ifndef RASE_REPACK_Q_H
#define RASE_REPACK_Q_H

#include "_repack.h"

static void r16_q8_0_ref(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, float *y, int64_t ys,
                         int nr) { rase_r16_ref(RASE_TYPE_Q8_0, n, w, a, astride, nt, y, ys, nr); }
static void r16_q4_1_ref(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, float *y, int64_t ys,
                         int nr) { rase_r16_ref(RASE_TYPE_Q4_1, n, w, a, astride, nt, y, ys, nr); }
static void r16_q5_1_ref(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, float *y, int64_t ys,
                         int nr) { rase_r16_ref(RASE_TYPE_Q5_1, n, w, a, astride, nt, y, ys, nr); }

#if RASE_HAVE_X86
// ---------------------------------------------------------------- AVX2
// type: Q8_0 (signed weights, ggml's sign trick: |w| x (y with w's sign)), Q4_1, Q5_1 (unsigned).

// the 8 lanes (rows 8h .. 8h + 7) of slice sl of the repacked block bk, as unsigned values (Q8_0: signed)
RASE_TARGET_AVX2 static RASE_INLINE __m256i rase_r16q_slice_avx2(const int type, const uint8_t *bk, int sl, int h) {
    const uint8_t *q = bk + rase_r16_qoff(type);
    if (!rase_r16_nib(type)) return _mm256_loadu_si256((const __m256i *)(q + 64 * sl + 32 * h));
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(q + 64 * (sl & 3) + 32 * h));
    __m256i v = _mm256_and_si256(sl < 4 ? raw : _mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0xF));
    if (rase_r16_has_h(type)) {  // the fifth bit: or 16
        const __m256i hb = rase_avx2_bytes_from_bits32(bk + rase_r16_hoff(type) + 8 * sl + 4 * h);
        v = _mm256_or_si256(v, _mm256_and_si256(hb, _mm256_set1_epi8(0x10)));
    }
    return v;
}

// the integer dot of slice sl: q (the weights' lanes) x the token's 4 activation bytes ya
RASE_TARGET_AVX2 static RASE_INLINE __m256i rase_r16q_dot_avx2(const int type, __m256i q, const int8_t *ya) {
    const __m256i ysl = _mm256_set1_epi32(rase_ld32(ya));
    if (rase_r16_has_min(type)) return rase_dot4_avx2(q, ysl);
    return rase_dot4_avx2(_mm256_sign_epi8(q, q), _mm256_sign_epi8(ysl, q));
}

// token t's activation block b: its quantized bytes and scale (act_q8_1 for the _1 types)
static inline __attribute__((always_inline)) const int8_t *rase_r16q_act(const int type, const void *a, size_t astride,
                                                                        int t, int64_t b, const float **d) {
    if (rase_r16_has_min(type)) {
        const act_q8_1 *ya = RASE_ACT(act_q8_1, t, b);
        *d = &ya->d;
        return ya->qs;
    }
    const act_q8_0 *ya = RASE_ACT(act_q8_0, t, b);
    *d = &ya->d;
    return ya->qs;
}

// rase_hsum8 lane by lane, plus summ, stored for the nr - 8h rows of half h
RASE_TARGET_AVX2 static RASE_INLINE void rase_r16q_finish_avx2(const __m256 *A, __m256 summ, float *y, int nr) {
    const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(A[4], A[0]), _mm256_add_ps(A[6], A[2])),
                                     _mm256_add_ps(_mm256_add_ps(A[5], A[1]), _mm256_add_ps(A[7], A[3])));
    rase_r16_store8(_mm256_add_ps(sum, summ), y, nr);
}

// Few tokens (nt <= 4; decode, memory-bound): each half of the group (rows 8 h .. 8 h + 7) in
// turn, block by block, all 8 slices unpacked at once; per token 8 accumulators whose lanes are rows.
RASE_TARGET_AVX2 static RASE_INLINE void rase_r16q_blocks_avx2(const int nt, const int type, int64_t n, const uint8_t *w,
                                                             const void *a, size_t astride, float *y, int64_t ys,
                                                             int nr) {
    const size_t blk = rase_r16_blk(type);
    const int halves = nr > 8 ? 2 : 1, pf = (int)blk / halves;
    __m256 acc_h[2][4][8], summ_h[2][4];
    for (int h = 0; h < halves; ++h)
        for (int t = 0; t < nt; ++t) {
            summ_h[h][t] = _mm256_setzero_ps();
            for (int sl = 0; sl < 8; ++sl) acc_h[h][t][sl] = _mm256_setzero_ps();
        }
    for (int64_t c0 = 0; c0 < n / 32; c0 += RASE_R16_CHUNK)
        for (int h = 0; h < halves; ++h)
            for (int64_t b = c0; b < n / 32 && b < c0 + RASE_R16_CHUNK; ++b) {
                const uint8_t *bk = w + b * blk;
                RASE_PREFETCH_AHEAD(bk + h * pf, pf);  // each half its share: one stream
                __m256i q[8];
                for (int sl = 0; sl < 8; ++sl) q[sl] = rase_r16q_slice_avx2(type, bk, sl, h);
                const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)bk + 8 * h)));
                for (int t = 0; t < nt; ++t) {
                    const float *dy;
                    const int8_t *yq = rase_r16q_act(type, a, astride, t, b, &dy);
                    if (rase_r16_has_min(type)) {
                        const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)bk + 16 + 8 * h)));
                        summ_h[h][t] = _mm256_add_ps(summ_h[h][t], _mm256_mul_ps(m, _mm256_broadcast_ss(dy + 1)));
                    }
                    const __m256 scale = _mm256_mul_ps(dw, _mm256_broadcast_ss(dy));
                    for (int sl = 0; sl < 8; ++sl)
                        acc_h[h][t][sl] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(rase_r16q_dot_avx2(type, q[sl], yq + 4 * sl)),
                                                          acc_h[h][t][sl]);
                }
            }
    for (int h = 0; h < halves; ++h)
        for (int t = 0; t < nt; ++t) rase_r16q_finish_avx2(acc_h[h][t], summ_h[h][t], y + t * ys + 8 * h, nr - 8 * h);
}

// Many tokens (prefill, compute-bound): each half of the group in turn, its blocks in chunks of
// RASE_R16_CHUNK; per chunk one slice at a time over the chunk's blocks, that slice's weights
// unpacked once per block for every token of the tile, so only one accumulator per token is
// live (8 per token would spill). Each (row, slice) accumulator still sees its blocks in order:
// the scalar reference's FMAs exactly. Scales dw * dy are made once per chunk.
RASE_TARGET_AVX2 static RASE_INLINE void rase_r16q_slices_avx2(const int nt, const int type, int64_t n, const uint8_t *w,
                                                             const void *a, size_t astride, float *y, int64_t ys,
                                                             int nr) {
    const size_t blk = rase_r16_blk(type);
    const int64_t nb = n / 32;
    __m256 sc[RASE_R16_NT_AVX2][RASE_R16_CHUNK];
    for (int h = 0; h < 2 && 8 * h < nr; ++h) {
        __m256 acc[RASE_R16_NT_AVX2][8], summ[RASE_R16_NT_AVX2];
        for (int t = 0; t < nt; ++t) {
            summ[t] = _mm256_setzero_ps();
            for (int sl = 0; sl < 8; ++sl) acc[t][sl] = _mm256_setzero_ps();
        }
        for (int64_t c0 = 0; c0 < nb; c0 += RASE_R16_CHUNK) {
            const int cb = nb - c0 < RASE_R16_CHUNK ? (int)(nb - c0) : RASE_R16_CHUNK;
            for (int j = 0; j < cb; ++j) {  // dw * dy; the _1 types' summ in block order
                const uint8_t *bk = w + (c0 + j) * blk;
                if (h == 0) RASE_PREFETCH_AHEAD(bk, blk);
                const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)bk + 8 * h)));
                for (int t = 0; t < nt; ++t) {
                    const float *dy;
                    rase_r16q_act(type, a, astride, t, c0 + j, &dy);
                    sc[t][j] = _mm256_mul_ps(dw, _mm256_broadcast_ss(dy));
                    if (rase_r16_has_min(type)) {
                        const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)bk + 16 + 8 * h)));
                        summ[t] = _mm256_add_ps(summ[t], _mm256_mul_ps(m, _mm256_broadcast_ss(dy + 1)));
                    }
                }
            }
            for (int sl = 0; sl < 8; ++sl) {
                __m256 ac[RASE_R16_NT_AVX2];
                for (int t = 0; t < nt; ++t) ac[t] = acc[t][sl];
                for (int j = 0; j < cb; ++j) {
                    const __m256i q = rase_r16q_slice_avx2(type, w + (c0 + j) * blk, sl, h);
                    for (int t = 0; t < nt; ++t) {
                        const float *dy;
                        const int8_t *yq = rase_r16q_act(type, a, astride, t, c0 + j, &dy);
                        ac[t] = _mm256_fmadd_ps(sc[t][j], _mm256_cvtepi32_ps(rase_r16q_dot_avx2(type, q, yq + 4 * sl)), ac[t]);
                    }
                }
                for (int t = 0; t < nt; ++t) acc[t][sl] = ac[t];
            }
        }
        for (int t = 0; t < nt; ++t) rase_r16q_finish_avx2(acc[t], summ[t], y + t * ys + 8 * h, nr - 8 * h);
    }
}

// Up to RASE_R16_FEW_AVX2 tokens block by block (tiles of 4; Q4_1 2: its 4 tokens' 32
// accumulators spill more than unpacking twice costs, measured on Zen 3), more slice by slice.
RASE_TARGET_AVX2 static RASE_INLINE void rase_r16q_avx2(const int type, int64_t n, const uint8_t *w, const void *a,
                                                      size_t astride, int nt, float *y, int64_t ys, int nr) {
    const int ntb = type == RASE_TYPE_Q4_1 ? 2 : 4;
    for (int t0 = 0; t0 < nt;) {
        const void *at = (const char *)a + t0 * astride;
        float *yt = y + t0 * ys;
        const int left = nt - t0, k = left <= RASE_R16_FEW_AVX2 ? (left < ntb ? left : ntb)
                                                                : (left < RASE_R16_NT_AVX2 ? left : RASE_R16_NT_AVX2);
        if (left <= RASE_R16_FEW_AVX2) RASE_CONST_NT(4, k, rase_r16q_blocks_avx2, type, n, w, at, astride, yt, ys, nr);
        else RASE_CONST_NT(RASE_R16_NT_AVX2, k, rase_r16q_slices_avx2, type, n, w, at, astride, yt, ys, nr);
        t0 += k;
    }
}

// ---------------------------------------------------------------- AVX-512 VNNI
// One zmm per slice holds all 16 rows, so the activation slice is a plain 4-byte broadcast.
// Q8_0's signed weights become unsigned, u = w + 128 (the sign bit flipped), with each
// slice's dot starting from -128 * the slice's activation sum (precomputed with the activation
// row, act_q8_0): the exact integer sum of the reference, then the same FMA per slice and hsum.
// Tiles of up to 2 tokens keep the 8 unpacked weight registers live beside 16 accumulators.
// Many tokens: a group's weights unpacked once into a panel (per 32-block: the 8 slice registers,
// then d and m as f32; RASE_R16_PANEL bytes, in the thread's work buffer) that every pair of
// tokens then reads, instead of unpacking each block again for every pair. Same integers, same
// FMAs, same bits.

// u[8], dw, dm of the repacked block bk, or read from its panel block pb (when not NULL)
RASE_TARGET_AVX512 static RASE_INLINE void rase_r16q_unpack_512(const int type, const uint8_t *bk, const uint8_t *pb,
                                                              __m512i u[8], __m512 *dw, __m512 *dm) {
    if (pb) {
        for (int k = 0; k < 8; ++k) u[k] = _mm512_loadu_si512((const void *)(pb + 64 * k));
        *dw = _mm512_loadu_ps((const float *)(pb + 512));
        *dm = _mm512_loadu_ps((const float *)(pb + 576));
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0xF), flip = _mm512_set1_epi8((char)0x80), sixteen = _mm512_set1_epi8(0x10);
    const uint8_t *q = bk + rase_r16_qoff(type);
    RASE_PREFETCH_AHEAD(bk, rase_r16_blk(type));
    if (rase_r16_nib(type)) {  // the nibble, + 16 where Q5_1's fifth bit is set
        for (int k = 0; k < 4; ++k) {
            const __m512i raw = _mm512_loadu_si512((const void *)(q + 64 * k));
            u[k] = _mm512_and_si512(raw, m4);
            u[k + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
        }
        if (rase_r16_has_h(type))
            for (int k = 0; k < 8; ++k)
                u[k] = _mm512_mask_add_epi8(u[k], _load_mask64((__mmask64 *)(bk + rase_r16_hoff(type)) + k), u[k], sixteen);
    } else {
        for (int k = 0; k < 8; ++k) u[k] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(q + 64 * k)), flip);
    }
    *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)bk));
    *dm = rase_r16_has_min(type) ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)bk + 16)))
                                 : _mm512_setzero_ps();
}

// nt (1, 2) tokens over the repacked blocks (panel NULL) or over the group's panel
RASE_TARGET_AVX512 static RASE_INLINE void rase_r16q_512(const int nt, const int type, int64_t n, const uint8_t *w,
                                                       const uint8_t *panel, const void *a, size_t astride, float *y,
                                                       int64_t ys, int nr) {
    const size_t blk = rase_r16_blk(type);
    __m512 acc[RASE_R16_TILE_512][8], summ[RASE_R16_TILE_512];
    for (int t = 0; t < nt; ++t) {
        summ[t] = _mm512_setzero_ps();
        for (int sl = 0; sl < 8; ++sl) acc[t][sl] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < n / 32; ++b) {
        __m512i u[8];
        __m512 dw, dm;
        rase_r16q_unpack_512(type, w + b * blk, panel ? panel + b * RASE_R16_PANEL : 0, u, &dw, &dm);
        for (int t = 0; t < nt; ++t) {
            const float *dy;
            const int8_t *yb = rase_r16q_act(type, a, astride, t, b, &dy);  // slices broadcast from memory
            if (rase_r16_has_min(type)) summ[t] = _mm512_add_ps(summ[t], _mm512_mul_ps(dm, _mm512_set1_ps(dy[1])));
            const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(*dy));
            for (int sl = 0; sl < 8; ++sl) {  // Q8_0: from the activation's own -128 x slice-sum starts
                const __m512i i0 = rase_r16_has_min(type) ? _mm512_setzero_si512()
                                                          : _mm512_set1_epi32(RASE_ACT(act_q8_0, t, b)->m128[sl]);
                const __m512i i32 = _mm512_dpbusd_epi32(i0, u[sl], _mm512_set1_epi32(rase_ld32(yb + 4 * sl)));
                acc[t][sl] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(i32), acc[t][sl]);
            }
        }
    }
    for (int t = 0; t < nt; ++t) {  // rase_hsum8, lane by lane
        const __m512 *A = acc[t];
        const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(A[4], A[0]), _mm512_add_ps(A[6], A[2])),
                                         _mm512_add_ps(_mm512_add_ps(A[5], A[1]), _mm512_add_ps(A[7], A[3])));
        _mm512_mask_storeu_ps(y + t * ys, (__mmask16)((1u << nr) - 1), _mm512_add_ps(sum, summ[t]));
    }
}

// tokens in pairs
RASE_TARGET_AVX512 static RASE_INLINE void rase_r16q_pairs_512(const int type, int64_t n, const uint8_t *w,
                                                             const uint8_t *panel, const void *a, size_t astride,
                                                             int nt, float *y, int64_t ys, int nr) {
    for (int t0 = 0; t0 < nt; t0 += RASE_R16_TILE_512) {
        const void *at = (const char *)a + t0 * astride;
        if (nt - t0 >= 2) rase_r16q_512(2, type, n, w, panel, at, astride, y + t0 * ys, ys, nr);
        else rase_r16q_512(1, type, n, w, panel, at, astride, y + t0 * ys, ys, nr);
    }
}

// all T tokens of one group through a panel unpacked into work (n / 32 * RASE_R16_PANEL bytes);
// only for the types whose unpacking costs more than reading it back (their traits rows)
RASE_TARGET_AVX512 static RASE_INLINE void rase_r16q_panel_512(const int type, int64_t n, const uint8_t *w, const void *a,
                                                             size_t astride, int T, float *y, int64_t ys, int nr,
                                                             uint8_t *work) {
    for (int64_t b = 0; b < n / 32; ++b) {
        __m512i u[8];
        __m512 dw, dm;
        rase_r16q_unpack_512(type, w + b * rase_r16_blk(type), 0, u, &dw, &dm);
        uint8_t *pb = work + b * RASE_R16_PANEL;
        for (int k = 0; k < 8; ++k) _mm512_storeu_si512((void *)(pb + 64 * k), u[k]);
        _mm512_storeu_ps((float *)(pb + 512), dw);
        _mm512_storeu_ps((float *)(pb + 576), dm);
    }
    rase_r16q_pairs_512(type, n, w, work, a, astride, T, y, ys, nr);
}

// ---------------------------------------------------------------- the entries (traits rows)
RASE_TARGET_AVX2 static void r16_q8_0_avx2(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt,
                                           float *y, int64_t ys, int nr) {
    rase_r16q_avx2(RASE_TYPE_Q8_0, n, w, a, astride, nt, y, ys, nr);
}
RASE_TARGET_AVX2 static void r16_q4_1_avx2(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt,
                                           float *y, int64_t ys, int nr) {
    rase_r16q_avx2(RASE_TYPE_Q4_1, n, w, a, astride, nt, y, ys, nr);
}
RASE_TARGET_AVX2 static void r16_q5_1_avx2(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt,
                                           float *y, int64_t ys, int nr) {
    rase_r16q_avx2(RASE_TYPE_Q5_1, n, w, a, astride, nt, y, ys, nr);
}
RASE_TARGET_AVX512 static void r16_q8_0_vnni(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt,
                                             float *y, int64_t ys, int nr) {
    rase_r16q_pairs_512(RASE_TYPE_Q8_0, n, w, 0, a, astride, nt, y, ys, nr);
}
RASE_TARGET_AVX512 static void r16_q4_1_vnni(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt,
                                             float *y, int64_t ys, int nr) {
    rase_r16q_pairs_512(RASE_TYPE_Q4_1, n, w, 0, a, astride, nt, y, ys, nr);
}
RASE_TARGET_AVX512 static void r16_q5_1_vnni(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt,
                                             float *y, int64_t ys, int nr) {
    rase_r16q_pairs_512(RASE_TYPE_Q5_1, n, w, 0, a, astride, nt, y, ys, nr);
}
RASE_TARGET_AVX512 static void r16_q5_1_vnni_panel(int64_t n, const uint8_t *w, const void *a, size_t astride, int T,
                                                   float *y, int64_t ys, int nr, uint8_t *work) {
    rase_r16q_panel_512(RASE_TYPE_Q5_1, n, w, a, astride, T, y, ys, nr, work);
}
#endif

#if RASE_HAVE_NEON
// ---------------------------------------------------------------- NEON (ARMv8.0; sdot with dotprod)
// Quarter by quarter (rows 4q .. 4q + 3, one f32 lane each), chunk by chunk of RASE_R16_CHUNK
// blocks (the chunk's weights stay in L1 for the 4 quarters); per chunk the scales dw * dy of
// every block and token first (and the _1 types' summ, in block order), then one slice at a time
// over the chunk's blocks for every token of the tile: each (row, slice) accumulator sees its
// blocks in order, the reference's FMAs exactly.

// slice sl of quarter q of the repacked block bk, as the signed weights of the reference
static RASE_INLINE int8x16_t rase_r16q_slice_neon(const int type, const uint8_t *bk, int sl, int q) {
    const uint8_t *p = bk + rase_r16_qoff(type);
    if (!rase_r16_nib(type)) return vld1q_s8((const int8_t *)(p + 64 * sl + 16 * q));
    const int8x16_t v = rase_neon_nibbles(vld1q_u8(p + 64 * (sl & 3) + 16 * q), sl >= 4, 0, vdupq_n_u8(0), 0);
    if (!rase_r16_has_h(type)) return v;
    // Q5_1: bits 16q .. 16q + 15 of the slice's mask, + 16
    const uint8x16_t h = vandq_u8(rase_neon_bytes_from_bits16(bk + rase_r16_hoff(type) + 8 * sl + 2 * q), vdupq_n_u8(0x10));
    return vreinterpretq_s8_u8(vorrq_u8(vreinterpretq_u8_s8(v), h));
}

static RASE_INLINE void rase_r16q_neon(const int nt, const int dp, const int type, int64_t n, const uint8_t *w,
                                       const void *a, size_t astride, float *y, int64_t ys, int nr) {
    const size_t blk = rase_r16_blk(type);
    const int64_t nb = n / 32;
    for (int q = 0; 4 * q < nr; ++q) {
        float32x4_t acc[RASE_R16_TILE][8], summ[RASE_R16_TILE], sc[RASE_R16_TILE][RASE_R16_CHUNK];
        for (int t = 0; t < nt; ++t) {
            summ[t] = vdupq_n_f32(0.0f);
            for (int sl = 0; sl < 8; ++sl) acc[t][sl] = vdupq_n_f32(0.0f);
        }
        for (int64_t c0 = 0; c0 < nb; c0 += RASE_R16_CHUNK) {
            const int cb = nb - c0 < RASE_R16_CHUNK ? (int)(nb - c0) : RASE_R16_CHUNK;
            for (int j = 0; j < cb; ++j) {
                const uint8_t *bk = w + (c0 + j) * blk;
                if (q == 0) RASE_PREFETCH_AHEAD(bk, blk);
                const float32x4_t dw = rase_neon_h4((const uint16_t *)bk + 4 * q);
                for (int t = 0; t < nt; ++t) {
                    const float *dy;
                    rase_r16q_act(type, a, astride, t, c0 + j, &dy);
                    sc[t][j] = vmulq_n_f32(dw, dy[0]);
                    if (rase_r16_has_min(type))
                        summ[t] = vaddq_f32(summ[t], vmulq_n_f32(rase_neon_h4((const uint16_t *)bk + 16 + 4 * q), dy[1]));
                }
            }
            for (int sl = 0; sl < 8; ++sl) {
                float32x4_t ac[RASE_R16_TILE];
                for (int t = 0; t < nt; ++t) ac[t] = acc[t][sl];
                for (int j = 0; j < cb; ++j) {
                    const int8x16_t wq = rase_r16q_slice_neon(type, w + (c0 + j) * blk, sl, q);
                    for (int t = 0; t < nt; ++t) {
                        const float *dy;
                        const int8_t *yq = rase_r16q_act(type, a, astride, t, c0 + j, &dy);
                        const int32x4_t isum = rase_neon_dot4(dp, vdupq_n_s32(0), wq, rase_neon_slice(yq + 4 * sl));
                        ac[t] = vfmaq_f32(ac[t], sc[t][j], vcvtq_f32_s32(isum));
                    }
                }
                for (int t = 0; t < nt; ++t) acc[t][sl] = ac[t];
            }
        }
        for (int t = 0; t < nt; ++t) {  // rase_hsum8, lane by lane, plus summ
            const float32x4_t *A = acc[t];
            const float32x4_t sum = vaddq_f32(vaddq_f32(vaddq_f32(A[4], A[0]), vaddq_f32(A[6], A[2])),
                                              vaddq_f32(vaddq_f32(A[5], A[1]), vaddq_f32(A[7], A[3])));
            rase_neon_store4(vaddq_f32(sum, summ[t]), y + t * ys + 4 * q, nr - 4 * q);
        }
    }
}
RASE_NEON_ENTRIES(r16_q8_0, rase_r16q_neon, RASE_TYPE_Q8_0)
RASE_NEON_ENTRIES(r16_q4_1, rase_r16q_neon, RASE_TYPE_Q4_1)
RASE_NEON_ENTRIES(r16_q5_1, rase_r16q_neon, RASE_TYPE_Q5_1)
#endif

#endif  // RASE_REPACK_Q_H
