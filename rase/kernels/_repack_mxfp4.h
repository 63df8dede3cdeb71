// rase/kernels/_repack_mxfp4.h: MXFP4 (gpt-oss's expert weights) repacked at load into the 16-row layout of
// _repack.h, and its matmul kernels.
//
// Layout: one r16_mxfp4 per 16 rows x 32 columns, the size of the 16 plain blocks: the rows' E8M0
// exponents, then Q4_0's nibble planes (plane k: slice k's low nibbles, slice k + 4's high).
//
// Numerics: llama.cpp's x86 one-token MXFP4 (ggml_vec_dot_mxfp4_q8_0, AVX2), activations in Q8_0.
// Per row, two sets of 8 slice accumulators, the even blocks of each pair in the first and the odd
// in the second: acc[b % 2][s] = fma(f32(d_y) * e8m0_half(e), (float)isum_{b,s}, acc[b % 2][s]) with
// isum the exact integer sum of the slice's 4 products (weights: kvalues_mxfp4, -12..12); then
// ggml's horizontal sum of acc[0] + acc[1] (lane by lane); a last unpaired block (n / 32 odd) adds
// fma(its scale, (float)(its whole integer sum), sum): ggml's scalar tail as the portable build
// contracts it (a native build may round it unfused; no gpt-oss matrix has an odd block count).
// The scalar reference, AVX2 and AVX-512 kernels compute the same integers and floats.
#ifndef RASE_REPACK_MXFP4_H
#define RASE_REPACK_MXFP4_H

#include "_repack.h"

typedef struct { uint8_t e[16]; uint8_t q[4][64]; } r16_mxfp4;
_Static_assert(sizeof(r16_mxfp4) == 16 * sizeof(block_mxfp4), "r16_mxfp4");

// kvalues_mxfp4 + 128: the weights unsigned for vpdpbusd, whose sums start at -128 x slice sum (act_q8_0.m128)
static const uint8_t RASE_MXFP4_U[16] = {128, 129, 130, 131, 132, 134, 136, 140, 128, 127, 126, 125, 124, 122, 120, 116};

static void r16_repack_mxfp4(const uint8_t *src, int64_t row_bytes, int64_t rows, int64_t n, int64_t g, uint8_t *dst) {
    r16_mxfp4 *o = (r16_mxfp4 *)dst;
    if ((g + 1) * RASE_R16 > rows) memset(dst, 0, (size_t)(n / 32) * sizeof(r16_mxfp4));
    for (int r = 0; r < RASE_R16 && g * RASE_R16 + r < rows; ++r) {
        const block_mxfp4 *x = (const block_mxfp4 *)(src + (g * RASE_R16 + r) * row_bytes);
        for (int64_t b = 0; b < n / 32; ++b) {
            o[b].e[r] = x[b].e;
            for (int k = 0; k < 4; ++k) memcpy(o[b].q[k] + 4 * r, x[b].qs + 4 * k, 4);
        }
    }
}

static void r16_unpack_mxfp4(const uint8_t *pg, int64_t n, int r, uint8_t *dst) {
    const r16_mxfp4 *o = (const r16_mxfp4 *)pg;
    block_mxfp4 *x = (block_mxfp4 *)dst;
    for (int64_t b = 0; b < n / 32; ++b) {
        x[b].e = o[b].e[r];
        for (int k = 0; k < 4; ++k) memcpy(x[b].qs + 4 * k, o[b].q[k] + 4 * r, 4);
    }
}

// slice s's exact integer sum for row r of block o (slice s < 4: low nibbles of plane s, else high
// of s - 4) and the activation block ya
static inline int rase_mxfp4_isum(const r16_mxfp4 *o, int s, int r, const act_q8_0 *ya) {
    int isum = 0;
    for (int i = 0; i < 4; ++i) {
        const uint8_t b = o->q[s & 3][4 * r + i];
        isum += rase_kvalues_mxfp4[s < 4 ? b & 0xF : b >> 4] * ya->qs[4 * s + i];
    }
    return isum;
}

static void r16_mxfp4_ref(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, float *y, int64_t ys,
                          int nr) {
    const r16_mxfp4 *blk = (const r16_mxfp4 *)w;
    const int64_t nb = n / 32;
    for (int t = 0; t < nt; ++t)
        for (int r = 0; r < nr; ++r) {
            float acc[2][8] = {{0}}, sum;
            int64_t b = 0;
            for (; b < nb; ++b) {
                if (b + 1 == nb && nb % 2) break;  // the unpaired last block: after the sum
                const act_q8_0 *ya = RASE_ACT(act_q8_0, t, b);
                const float scale = ya->d * rase_e8m0_half(blk[b].e[r]);
                for (int s = 0; s < 8; ++s)
                    acc[b % 2][s] = __builtin_fmaf(scale, (float)rase_mxfp4_isum(&blk[b], s, r, ya), acc[b % 2][s]);
            }
            float lanes[8];
            for (int s = 0; s < 8; ++s) lanes[s] = acc[0][s] + acc[1][s];
            sum = rase_hsum8(lanes);
            if (b < nb) {
                const act_q8_0 *ya = RASE_ACT(act_q8_0, t, b);
                int isum = 0;
                for (int s = 0; s < 8; ++s) isum += rase_mxfp4_isum(&blk[b], s, r, ya);
                sum = __builtin_fmaf(ya->d * rase_e8m0_half(blk[b].e[r]), (float)isum, sum);
            }
            y[t * ys + r] = sum;
        }
}

#if RASE_HAVE_X86
// ---------------------------------------------------------------- AVX2: 8 rows per ymm, a token at a time

// rase_e8m0_half of 8 exponents (bytes at e) as f32 lanes: 2^(e - 128), e < 2 as denormals
RASE_TARGET_AVX2 static RASE_INLINE __m256 rase_e8m0_half_avx2(const uint8_t *e) {
    const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)e));
    const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), x);
    const __m256i norm = _mm256_slli_epi32(_mm256_sub_epi32(x, _mm256_set1_epi32(1)), 23);
    const __m256i den = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), x);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(norm, den, small));
}

// the 8 slices' integer sums of block bk for rows 8h .. 8h + 7 and one token's activation block
RASE_TARGET_AVX2 static RASE_INLINE void rase_mxfp4_isums_avx2(const r16_mxfp4 *bk, int h, const act_q8_0 *ya, __m256i out[8]) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)rase_kvalues_mxfp4));
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int s = 0; s < 8; ++s) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(bk->q[s & 3] + 32 * h));
        const __m256i q = _mm256_shuffle_epi8(lut, _mm256_and_si256(s < 4 ? raw : _mm256_srli_epi16(raw, 4), m4));
        const __m256i ysl = _mm256_set1_epi32(rase_ld32(ya->qs + 4 * s));
        out[s] = rase_dot4_avx2(_mm256_sign_epi8(q, q), _mm256_sign_epi8(ysl, q));
    }
}

RASE_TARGET_AVX2 static RASE_INLINE void rase_r16_mxfp4_avx2_token(int64_t n, const r16_mxfp4 *blk, const void *a, int t,
                                                                 size_t astride, float *y, int nr) {
    const int64_t nb = n / 32, paired = nb - nb % 2;
    for (int h = 0; h < 2 && 8 * h < nr; ++h) {
        __m256 acc0[8], acc1[8];  // the even and the odd block of each pair
        for (int s = 0; s < 8; ++s) acc0[s] = acc1[s] = _mm256_setzero_ps();
        for (int64_t b = 0; b < paired; b += 2) {
            const act_q8_0 *y0 = RASE_ACT(act_q8_0, t, b), *y1 = RASE_ACT(act_q8_0, t, b + 1);
            if (h == 0) RASE_PREFETCH_AHEAD(&blk[b], 2 * sizeof(r16_mxfp4));
            const __m256 sc0 = _mm256_mul_ps(_mm256_set1_ps(y0->d), rase_e8m0_half_avx2(blk[b].e + 8 * h));
            const __m256 sc1 = _mm256_mul_ps(_mm256_set1_ps(y1->d), rase_e8m0_half_avx2(blk[b + 1].e + 8 * h));
            __m256i i0[8], i1[8];
            rase_mxfp4_isums_avx2(&blk[b], h, y0, i0);
            for (int s = 0; s < 8; ++s) acc0[s] = _mm256_fmadd_ps(sc0, _mm256_cvtepi32_ps(i0[s]), acc0[s]);
            rase_mxfp4_isums_avx2(&blk[b + 1], h, y1, i1);
            for (int s = 0; s < 8; ++s) acc1[s] = _mm256_fmadd_ps(sc1, _mm256_cvtepi32_ps(i1[s]), acc1[s]);
        }
        __m256 l[8];
        for (int s = 0; s < 8; ++s) l[s] = _mm256_add_ps(acc0[s], acc1[s]);
        __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(l[4], l[0]), _mm256_add_ps(l[6], l[2])),
                                   _mm256_add_ps(_mm256_add_ps(l[5], l[1]), _mm256_add_ps(l[7], l[3])));
        if (paired < nb) {  // the unpaired last block: its whole integer sum, one lane per row
            const act_q8_0 *ya = RASE_ACT(act_q8_0, t, paired);
            __m256i i0[8];
            rase_mxfp4_isums_avx2(&blk[paired], h, ya, i0);
            __m256i tail = i0[0];
            for (int s = 1; s < 8; ++s) tail = _mm256_add_epi32(tail, i0[s]);
            const __m256 sc = _mm256_mul_ps(_mm256_set1_ps(ya->d), rase_e8m0_half_avx2(blk[paired].e + 8 * h));
            sum = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(tail), sum);
        }
        rase_r16_store8(sum, y + 8 * h, nr - 8 * h);
    }
}

RASE_TARGET_AVX2 static void r16_mxfp4_avx2(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt,
                                            float *y, int64_t ys, int nr) {
    for (int t = 0; t < nt; ++t) rase_r16_mxfp4_avx2_token(n, (const r16_mxfp4 *)w, a, t, astride, y + t * ys, nr);
}

// ---------------------------------------------------------------- AVX-512 VNNI: 16 rows per zmm

// rase_e8m0_half of the 16 exponents at e as f32 lanes
RASE_TARGET_AVX512 static RASE_INLINE __m512 rase_e8m0_half_512(const uint8_t *e) {
    const __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)e))),
                                         _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(e + 8))), 1);
    const __mmask16 small = _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(2), x);
    const __m512i norm = _mm512_slli_epi32(_mm512_sub_epi32(x, _mm512_set1_epi32(1)), 23);
    const __m512i den = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), x);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, norm, den));
}

// the 8 unsigned weight slices of block bk (16 rows): kvalues + 128
RASE_TARGET_AVX512 static RASE_INLINE void rase_mxfp4_unpack_512(const r16_mxfp4 *bk, __m512i u[8]) {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)RASE_MXFP4_U));
    const __m512i m4 = _mm512_set1_epi8(0xF);
    for (int s = 0; s < 8; ++s) {
        const __m512i raw = _mm512_loadu_si512((const void *)bk->q[s & 3]);
        u[s] = _mm512_shuffle_epi8(lut, _mm512_and_si512(s < 4 ? raw : _mm512_srli_epi16(raw, 4), m4));
    }
}

// slice s's exact integer sum for one token: from its -128 x slice-sum start (act_q8_0.m128)
RASE_TARGET_AVX512 static RASE_INLINE __m512i rase_mxfp4_isum_512(__m512i u, const act_q8_0 *ya, int s) {
    return _mm512_dpbusd_epi32(_mm512_set1_epi32(ya->m128[s]), u, _mm512_set1_epi32(rase_ld32(ya->qs + 4 * s)));
}

// nt (1 or 2) tokens over the whole row: each block's weights unpacked once for the tile
RASE_TARGET_AVX512 static RASE_INLINE void rase_r16_mxfp4_512(const int nt, int64_t n, const r16_mxfp4 *blk, const void *a,
                                                            size_t astride, float *y, int64_t ys, int nr) {
    const int64_t nb = n / 32, paired = nb - nb % 2;
    __m512 acc[2][2][8];  // [token][block parity][slice]
    for (int t = 0; t < nt; ++t)
        for (int s = 0; s < 8; ++s) acc[t][0][s] = acc[t][1][s] = _mm512_setzero_ps();
    for (int64_t b = 0; b < paired; b += 2) {
        RASE_PREFETCH_AHEAD(&blk[b], 2 * sizeof(r16_mxfp4));
        for (int p = 0; p < 2; ++p) {
            __m512i u[8];
            rase_mxfp4_unpack_512(&blk[b + p], u);
            const __m512 e = rase_e8m0_half_512(blk[b + p].e);
            for (int t = 0; t < nt; ++t) {
                const act_q8_0 *ya = RASE_ACT(act_q8_0, t, b + p);
                const __m512 sc = _mm512_mul_ps(_mm512_set1_ps(ya->d), e);
                for (int s = 0; s < 8; ++s)
                    acc[t][p][s] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(rase_mxfp4_isum_512(u[s], ya, s)), acc[t][p][s]);
            }
        }
    }
    for (int t = 0; t < nt; ++t) {
        __m512 l[8];
        for (int s = 0; s < 8; ++s) l[s] = _mm512_add_ps(acc[t][0][s], acc[t][1][s]);
        __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(l[4], l[0]), _mm512_add_ps(l[6], l[2])),
                                   _mm512_add_ps(_mm512_add_ps(l[5], l[1]), _mm512_add_ps(l[7], l[3])));
        if (paired < nb) {  // the unpaired last block: its whole integer sum, after the sum
            const act_q8_0 *ya = RASE_ACT(act_q8_0, t, paired);
            __m512i u[8];
            rase_mxfp4_unpack_512(&blk[paired], u);
            __m512i tail = rase_mxfp4_isum_512(u[0], ya, 0);
            for (int s = 1; s < 8; ++s) tail = _mm512_add_epi32(tail, rase_mxfp4_isum_512(u[s], ya, s));
            sum = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(ya->d), rase_e8m0_half_512(blk[paired].e)),
                                  _mm512_cvtepi32_ps(tail), sum);
        }
        _mm512_mask_storeu_ps(y + t * ys, (__mmask16)((1u << nr) - 1), sum);
    }
}

RASE_TARGET_AVX512 static void r16_mxfp4_vnni(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt,
                                              float *y, int64_t ys, int nr) {
    for (int t0 = 0; t0 < nt; t0 += 2) {  // pairs of tokens share each block's unpacked weights
        const void *at = (const char *)a + (size_t)t0 * astride;
        if (nt - t0 >= 2) rase_r16_mxfp4_512(2, n, (const r16_mxfp4 *)w, at, astride, y + t0 * ys, ys, nr);
        else rase_r16_mxfp4_512(1, n, (const r16_mxfp4 *)w, at, astride, y + t0 * ys, ys, nr);
    }
}
#endif

#endif  // RASE_REPACK_MXFP4_H
