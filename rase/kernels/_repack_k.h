// rase/kernels/_repack_k.h: Q4_K and Q5_K repacked at load, 16 rows interleaved (the layout of _repack.h
// with a 256-column block), and their matmul kernels: 16 rows x a tile of up to 8 tokens per call.
//
// Layout: one r16_q4_k (r16_q5_k) per 16 rows x 256 columns, the size of the 16 plain blocks. d,
// dmin as in the file; sm[i][r] the i-th 32-bit word of row r's 12 packed scale/min bytes (so the
// kmask unpack runs on 16 rows at once); q[p][s] byte 4r + i = qs[32p + 4s + i] of row r: low
// nibble element 64p + 4s + i (sub-block 2p, slice s), high nibble element 64p + 32 + 4s + i
// (2p + 1). Q5_K puts h[2p], h[2p + 1] before each q[p]: byte 4r + i of h[j], bit s = the fifth
// bit of element 32j + 4s + i of row r (Q5_0's one byte per lane: one load serves the sub-block's
// 8 slices), so the kernels read a block front to back (with h after q, the hardware prefetcher
// lost the stream: 9.5 against 27 GB/s from DRAM on one Zen 4 core).
//
// Numerics (llama.cpp's x86 one-token Q4_K, ggml_gemv_q4_K_8x8_q8_K, the t1 fixtures' bits): per row
// and 256-block b, the exact integers S = sum_j sc_j (w_j . y_j) over the 8 sub-blocks of 32 and
// M = sum_j mn_j (bsum_2j + bsum_2j+1); acc = fma((float)S, dx * dy, acc), accm = fma((float)M,
// dmin * dy, accm), block by block; the result is acc - accm. Q5_K keeps the order its row kernels
// had before it was repacked (rase_kdot_ref's): acc = acc + dy * (dx * S - dmin * M) from acc = 0.
// Integers in any order are the same integers, so the scalar reference, AVX2 and AVX-512 VNNI
// kernels give the same bits (tests/kernels/test_kernels.py states both orders in numpy).
#ifndef RASE_REPACK_K_H
#define RASE_REPACK_K_H

#include "_repack.h"

typedef struct { uint16_t d[16], dmin[16]; uint32_t sm[3][16]; } r16_k_head;
typedef struct { r16_k_head hd; uint8_t q[4][8][64]; } r16_q4_k;
typedef struct { r16_k_head hd; struct { uint8_t h[2][64]; uint8_t q[8][64]; } p[4]; } r16_q5_k;
_Static_assert(sizeof(r16_q4_k) == 16 * sizeof(block_q4_K), "r16_q4_k");
_Static_assert(sizeof(r16_q5_k) == 16 * sizeof(block_q5_K), "r16_q5_k");
// bytes of one repacked 256-column block of Q4_K or Q5_K, and of the plain one
static inline size_t rase_r16k_bytes(int type) { return type == RASE_TYPE_Q5_K ? sizeof(r16_q5_k) : sizeof(r16_q4_k); }
static inline size_t rase_k45_bytes(int type) { return type == RASE_TYPE_Q5_K ? sizeof(block_q5_K) : sizeof(block_q4_K); }
// plane q[p][s] and (Q5_K) the fifth bits h[j] of the repacked block at o
static inline __attribute__((always_inline)) uint8_t *rase_r16k_q(int type, const void *o, int p, int s) {
    return type == RASE_TYPE_Q5_K ? ((r16_q5_k *)o)->p[p].q[s] : ((r16_q4_k *)o)->q[p][s];
}
static inline __attribute__((always_inline)) uint8_t *rase_r16k_h(const void *o, int j) {
    return ((r16_q5_k *)o)->p[j / 2].h[j % 2];
}
#define RASE_R16K_PAIR_NT 4  // AVX-512: up to this many tokens, a sub-block pair per pass over its nibbles

// byte s bit j of m to byte j bit s (Hacker's Delight's transpose8, little-endian bytes)
static inline uint64_t rase_transpose8x8(uint64_t m) {
    uint64_t t = (m ^ (m >> 7)) & 0x00AA00AA00AA00AAull;
    m ^= t ^ (t << 7);
    t = (m ^ (m >> 14)) & 0x0000CCCC0000CCCCull;
    m ^= t ^ (t << 14);
    t = (m ^ (m >> 28)) & 0x00000000F0F0F0F0ull;
    return m ^ t ^ (t << 28);
}

// Group g of a (rows x n) plain Q4_K or Q5_K matrix into dst (n / 256 blocks);
// rows past the end are zero. The leading fields of the two plain blocks share their layout.
static inline __attribute__((always_inline)) void rase_r16_repack_k(const int type, const uint8_t *src, int64_t row_bytes,
                                                                  int64_t rows, int64_t n, int64_t g, uint8_t *dst) {
    const size_t ob = rase_r16k_bytes(type), xb = rase_k45_bytes(type);
    if ((g + 1) * RASE_R16 > rows) memset(dst, 0, (size_t)(n / 256) * ob);
    for (int r = 0; r < RASE_R16 && g * RASE_R16 + r < rows; ++r) {
        const uint8_t *row = src + (g * RASE_R16 + r) * row_bytes;
        for (int64_t b = 0; b < n / 256; ++b) {
            const block_q4_K *x = (const block_q4_K *)(row + b * xb);  // d, dmin, scales
            const uint8_t *qs = type == RASE_TYPE_Q5_K ? ((const block_q5_K *)x)->qs : x->qs;
            uint8_t *o = dst + b * ob;
            r16_k_head *hd = (r16_k_head *)o;
            hd->d[r] = x->d, hd->dmin[r] = x->dmin;
            for (int i = 0; i < 3; ++i) memcpy(&hd->sm[i][r], x->scales + 4 * i, 4);
            for (int p = 0; p < 4; ++p)
                for (int s = 0; s < 8; ++s) memcpy(rase_r16k_q(type, o, p, s) + 4 * r, qs + 32 * p + 4 * s, 4);
            if (type == RASE_TYPE_Q5_K) {  // bit j of qh[4s + i] to bit s of h[j][4r + i]: an 8 x 8 bit transpose per i
                const uint8_t *qh = ((const block_q5_K *)x)->qh;
                for (int i = 0; i < 4; ++i) {
                    uint64_t m = 0;
                    for (int s = 0; s < 8; ++s) m |= (uint64_t)qh[4 * s + i] << (8 * s);
                    m = rase_transpose8x8(m);
                    for (int j = 0; j < 8; ++j) rase_r16k_h(o, j)[4 * r + i] = (uint8_t)(m >> (8 * j));
                }
            }
        }
    }
}

// Row r of group pg (n / 256 blocks) back in ggml's plain blocks at dst: the repack's inverse
static void rase_r16_unpack_row_k(int type, const uint8_t *pg, int64_t n, int r, uint8_t *dst) {
    const size_t ob = rase_r16k_bytes(type), xb = rase_k45_bytes(type);
    for (int64_t b = 0; b < n / 256; ++b) {
        const uint8_t *o = pg + b * ob;
        const r16_k_head *hd = (const r16_k_head *)o;
        block_q4_K *x = (block_q4_K *)(dst + b * xb);
        uint8_t *qs = type == RASE_TYPE_Q5_K ? ((block_q5_K *)x)->qs : x->qs;
        x->d = hd->d[r], x->dmin = hd->dmin[r];
        for (int i = 0; i < 3; ++i) memcpy(x->scales + 4 * i, &hd->sm[i][r], 4);
        for (int p = 0; p < 4; ++p)
            for (int s = 0; s < 8; ++s) memcpy(qs + 32 * p + 4 * s, rase_r16k_q(type, o, p, s) + 4 * r, 4);
        if (type == RASE_TYPE_Q5_K) {
            uint8_t *qh = ((block_q5_K *)x)->qh;
            memset(qh, 0, 32);
            for (int j = 0; j < 8; ++j)
                for (int l = 0; l < 32; ++l) qh[l] |= (uint8_t)(((rase_r16k_h(o, j)[4 * r + l % 4] >> (l / 4)) & 1) << j);
        }
    }
}

static void r16_repack_q4_k(const uint8_t *src, int64_t row_bytes, int64_t rows, int64_t n, int64_t g, uint8_t *dst) {
    rase_r16_repack_k(RASE_TYPE_Q4_K, src, row_bytes, rows, n, g, dst);
}
static void r16_repack_q5_k(const uint8_t *src, int64_t row_bytes, int64_t rows, int64_t n, int64_t g, uint8_t *dst) {
    rase_r16_repack_k(RASE_TYPE_Q5_K, src, row_bytes, rows, n, g, dst);
}
static void r16_unpack_q4_k(const uint8_t *pg, int64_t n, int r, uint8_t *dst) { rase_r16_unpack_row_k(RASE_TYPE_Q4_K, pg, n, r, dst); }
static void r16_unpack_q5_k(const uint8_t *pg, int64_t n, int r, uint8_t *dst) { rase_r16_unpack_row_k(RASE_TYPE_Q5_K, pg, n, r, dst); }

// ---------------------------------------------------------------- the scalar reference

static inline __attribute__((always_inline)) void rase_r16k_ref(const int type, int64_t n, const uint8_t *w,
                                                               const void *a, size_t astride, int nt, float *y,
                                                               int64_t ys, int nr) {
    const size_t ob = rase_r16k_bytes(type);
    for (int t = 0; t < nt; ++t)
        for (int r = 0; r < nr; ++r) {
            float acc = 0.0f, accm = 0.0f;
            for (int64_t b = 0; b < n / 256; ++b) {
                const uint8_t *o = w + b * ob;
                const r16_k_head *hd = (const r16_k_head *)o;
                const block_q8_K *ya = RASE_ACT(block_q8_K, t, b);
                uint8_t packed[12];
                for (int i = 0; i < 3; ++i) memcpy(packed + 4 * i, &hd->sm[i][r], 4);
                int S = 0, M = 0;
                for (int j = 0; j < 8; ++j) {
                    uint8_t sc, mn;
                    rase_scale_min_k4(j, packed, &sc, &mn);
                    int dot = 0;
                    for (int l = 0; l < 32; ++l) {
                        const uint8_t q = rase_r16k_q(type, o, j / 2, l / 4)[4 * r + l % 4];
                        const int fifth = type == RASE_TYPE_Q5_K ? ((rase_r16k_h(o, j)[4 * r + l % 4] >> (l / 4)) & 1) << 4 : 0;
                        dot += ((j & 1 ? q >> 4 : q & 0xF) | fifth) * ya->qs[32 * j + l];
                    }
                    S += sc * dot;
                    M += mn * (ya->bsums[2 * j] + ya->bsums[2 * j + 1]);
                }
                const float dy = ya->d, dx = rase_fp16_to_fp32(hd->d[r]), dm = rase_fp16_to_fp32(hd->dmin[r]);
                if (type == RASE_TYPE_Q5_K) {
                    acc = acc + dy * (dx * (float)S - dm * (float)M);
                } else {
                    acc = __builtin_fmaf((float)S, dx * dy, acc);
                    accm = __builtin_fmaf((float)M, dm * dy, accm);
                }
            }
            y[t * ys + r] = acc - accm;  // Q5_K: accm = 0, acc - 0 = acc
        }
}
static void r16_q4_k_ref(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, float *y, int64_t ys,
                         int nr) { rase_r16k_ref(RASE_TYPE_Q4_K, n, w, a, astride, nt, y, ys, nr); }
static void r16_q5_k_ref(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, float *y, int64_t ys,
                         int nr) { rase_r16k_ref(RASE_TYPE_Q5_K, n, w, a, astride, nt, y, ys, nr); }

#if RASE_HAVE_X86
// ---------------------------------------------------------------- AVX2
// Both halves of the group (rows 8h .. 8h + 7) per block, a row per 32-bit lane: per slice
// maddubs(nibbles, broadcast activation) then madd with the sub-block's scale in both 16-bit
// halves of the lane gives sc * (4 products) exactly (at most 2 * 15 * 127 per pair), added into S.

// 8 rows' [scale 0..3], [scale 4..7], [min 0..3], [min 4..7] bytes from their 3 packed words
// (ggml's kmask shuffle on 8 rows at once: rase_scale_min_k4's values, per lane)
#define RASE_K4_LANES(V, SI, u0, u1, u2, sc4, sc8, mn4, mn8, km1, km2, km3)                        \
    do {                                                                                      \
        sc4 = V##and_##SI(u0, km1);                                                                \
        mn4 = V##and_##SI(u1, km1);                                                                \
        sc8 = V##or_##SI(V##and_##SI(u2, km2), V##slli_epi32(V##and_##SI(V##srli_epi32(u0, 6), km3), 4));    \
        mn8 = V##or_##SI(V##and_##SI(V##srli_epi32(u2, 4), km2), V##slli_epi32(V##and_##SI(V##srli_epi32(u1, 6), km3), 4)); \
    } while (0)

// slice s's fifth bits (bit s of each byte of hv) at bit 4: Q5_0's AVX2 shifts
RASE_TARGET_AVX2 static RASE_INLINE __m256i rase_k5_fifth_avx2(__m256i hv, int s, __m256i x10) {
    const __m256i at4 = s < 4 ? _mm256_slli_epi16(hv, 4 - s) : s > 4 ? _mm256_srli_epi16(hv, s - 4) : hv;
    return _mm256_and_si256(at4, x10);
}

RASE_TARGET_AVX2 static RASE_INLINE void rase_r16k_avx2_body(const int nt, const int type, int64_t n, const uint8_t *w, const void *a,
                                                           size_t astride, float *y, int64_t ys, int nr) {
    const size_t ob = rase_r16k_bytes(type);
    const __m256i m4 = _mm256_set1_epi8(0xF), lo8 = _mm256_set1_epi32(0xFF), x10 = _mm256_set1_epi8(0x10);
    const __m256i km1 = _mm256_set1_epi32(0x3f3f3f3f), km2 = _mm256_set1_epi32(0x0f0f0f0f), km3 = _mm256_set1_epi32(0x03030303);
    const int halves = nr > 8 ? 2 : 1, pf = (int)ob / halves;
    __m256 acc_h[2][RASE_R16_TILE], accm_h[2][RASE_R16_TILE];
    for (int h = 0; h < halves; ++h)
        for (int t = 0; t < nt; ++t) acc_h[h][t] = accm_h[h][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / 256; ++b)
        for (int h = 0; h < halves; ++h) {  // both halves per block: one weight stream
            __m256 *acc = acc_h[h], *accm = accm_h[h];
            const uint8_t *o = w + b * ob;
            const r16_k_head *hd = (const r16_k_head *)o;
            RASE_PREFETCH_AHEAD(o + h * pf, pf);
            __m256i sc4, sc8, mn4, mn8;
            RASE_K4_LANES(_mm256_, si256, _mm256_loadu_si256((const __m256i *)(hd->sm[0] + 8 * h)),
                          _mm256_loadu_si256((const __m256i *)(hd->sm[1] + 8 * h)),
                          _mm256_loadu_si256((const __m256i *)(hd->sm[2] + 8 * h)), sc4, sc8, mn4, mn8, km1, km2, km3);
            __m256i S[RASE_R16_TILE], M[RASE_R16_TILE];
            for (int t = 0; t < nt; ++t) S[t] = M[t] = _mm256_setzero_si256();
            for (int j = 0; j < 8; ++j) {
                const __m256i sc = _mm256_and_si256(_mm256_srli_epi32(j < 4 ? sc4 : sc8, 8 * (j % 4)), lo8);
                const __m256i sc2 = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));  // sc in both i16 halves
                const __m256i hv = type == RASE_TYPE_Q5_K ? _mm256_loadu_si256((const __m256i *)(rase_r16k_h(o, j) + 32 * h)) : m4;
                for (int s = 0; s < 8; ++s) {
                    const __m256i raw = _mm256_loadu_si256((const __m256i *)(rase_r16k_q(type, o, j / 2, s) + 32 * h));
                    __m256i q = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(raw, 4) : raw, m4);
                    if (type == RASE_TYPE_Q5_K) q = _mm256_or_si256(q, rase_k5_fifth_avx2(hv, s, x10));
                    for (int t = 0; t < nt; ++t) {  // at most 2 x 31 x 127 per i16 pair
                        const __m256i ya = _mm256_set1_epi32(rase_ld32(RASE_ACT(block_q8_K, t, b)->qs + 32 * j + 4 * s));
                        S[t] = _mm256_add_epi32(S[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q, ya), sc2));
                    }
                }
                const __m256i mn = _mm256_and_si256(_mm256_srli_epi32(j < 4 ? mn4 : mn8, 8 * (j % 4)), lo8);
                const __m256i mn2 = _mm256_or_si256(mn, _mm256_slli_epi32(mn, 16));
                for (int t = 0; t < nt; ++t)  // mn (bsum_2j + bsum_2j+1)
                    M[t] = _mm256_add_epi32(M[t], _mm256_madd_epi16(mn2, _mm256_set1_epi32(rase_ld32(RASE_ACT(block_q8_K, t, b)->bsums + 2 * j))));
            }
            const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hd->d + 8 * h)));
            const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hd->dmin + 8 * h)));
            for (int t = 0; t < nt; ++t) {
                const __m256 dy = _mm256_broadcast_ss(&RASE_ACT(block_q8_K, t, b)->d);
                if (type == RASE_TYPE_Q5_K) {  // acc + dy * (dx * S - dmin * M)
                    const __m256 f = _mm256_sub_ps(_mm256_mul_ps(dx, _mm256_cvtepi32_ps(S[t])), _mm256_mul_ps(dm, _mm256_cvtepi32_ps(M[t])));
                    acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(dy, f));
                } else {
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S[t]), _mm256_mul_ps(dx, dy), acc[t]);
                    accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(M[t]), _mm256_mul_ps(dm, dy), accm[t]);
                }
            }
        }
    for (int h = 0; h < halves; ++h)
        for (int t = 0; t < nt; ++t)
            rase_r16_store8(_mm256_sub_ps(acc_h[h][t], accm_h[h][t]), y + t * ys + 8 * h, nr - 8 * h);
}

// ---------------------------------------------------------------- AVX-512 VNNI
// A zmm per slice holds all 16 rows; vpdpbusd gives each slice's 4 products exactly (nibbles are
// unsigned as stored), summed over the sub-block's 8 slices, then times the sub-block's scale.
RASE_TARGET_AVX512 static RASE_INLINE void rase_r16k_vnni_body(const int nt, const int type, int64_t n, const uint8_t *w, const void *a,
                                                             size_t astride, float *y, int64_t ys, int nr) {
    const size_t ob = rase_r16k_bytes(type);
    const __m512i m4 = _mm512_set1_epi8(0xF), lo8 = _mm512_set1_epi32(0xFF), x10 = _mm512_set1_epi8(0x10);
    const __m512i km1 = _mm512_set1_epi32(0x3f3f3f3f), km2 = _mm512_set1_epi32(0x0f0f0f0f), km3 = _mm512_set1_epi32(0x03030303);
    __m512 acc[RASE_R16_TILE], accm[RASE_R16_TILE];
    for (int t = 0; t < nt; ++t) acc[t] = accm[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / 256; ++b) {
        const uint8_t *o = w + b * ob;
        const r16_k_head *hd = (const r16_k_head *)o;
        RASE_PREFETCH_AHEAD(o, ob);
        __m512i sc4, sc8, mn4, mn8;
        RASE_K4_LANES(_mm512_, si512, _mm512_loadu_si512((const void *)hd->sm[0]), _mm512_loadu_si512((const void *)hd->sm[1]),
                      _mm512_loadu_si512((const void *)hd->sm[2]), sc4, sc8, mn4, mn8, km1, km2, km3);
        __m512i S[RASE_R16_TILE], M[RASE_R16_TILE];
        for (int t = 0; t < nt; ++t) S[t] = M[t] = _mm512_setzero_si512();
        if (nt <= RASE_R16K_PAIR_NT) {
            for (int p = 0; p < 4; ++p) {  // sub-blocks 2p (low nibbles) and 2p + 1 (high) from one pass over q[p]
                __m512i D[2][RASE_R16_TILE];
                for (int t = 0; t < nt; ++t) D[0][t] = D[1][t] = _mm512_setzero_si512();
                const __m512i hv0 = type == RASE_TYPE_Q5_K ? _mm512_loadu_si512((const void *)rase_r16k_h(o, 2 * p)) : m4;
                const __m512i hv1 = type == RASE_TYPE_Q5_K ? _mm512_loadu_si512((const void *)rase_r16k_h(o, 2 * p + 1)) : m4;
                for (int s = 0; s < 8; ++s) {
                    const __m512i raw = _mm512_loadu_si512((const void *)rase_r16k_q(type, o, p, s));
                    __m512i q0 = _mm512_and_si512(raw, m4), q1 = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
                    if (type == RASE_TYPE_Q5_K) {  // the fifth bit: bit s of each byte of hv, a byte mask
                        const __m512i bit = _mm512_set1_epi8((char)(1 << s));
                        q0 = _mm512_mask_add_epi8(q0, _mm512_test_epi8_mask(hv0, bit), q0, x10);
                        q1 = _mm512_mask_add_epi8(q1, _mm512_test_epi8_mask(hv1, bit), q1, x10);
                    }
                    for (int t = 0; t < nt; ++t) {
                        const int8_t *yq = RASE_ACT(block_q8_K, t, b)->qs + 64 * p + 4 * s;
                        D[0][t] = _mm512_dpbusd_epi32(D[0][t], q0, _mm512_set1_epi32(rase_ld32(yq)));
                        D[1][t] = _mm512_dpbusd_epi32(D[1][t], q1, _mm512_set1_epi32(rase_ld32(yq + 32)));
                    }
                }
                for (int h = 0; h < 2; ++h) {
                    const int j = 2 * p + h;
                    const __m512i sc = _mm512_and_si512(_mm512_srli_epi32(j < 4 ? sc4 : sc8, 8 * (j % 4)), lo8);
                    const __m512i mn = _mm512_and_si512(_mm512_srli_epi32(j < 4 ? mn4 : mn8, 8 * (j % 4)), lo8);
                    const __m512i mn2 = _mm512_or_si512(mn, _mm512_slli_epi32(mn, 16));  // mn in both i16 halves
                    for (int t = 0; t < nt; ++t) {
                        S[t] = _mm512_add_epi32(S[t], _mm512_mullo_epi32(D[h][t], sc));
                        M[t] = _mm512_dpwssd_epi32(M[t], mn2, _mm512_set1_epi32(rase_ld32(RASE_ACT(block_q8_K, t, b)->bsums + 2 * j)));
                    }
                }
            }
        } else {  // more tokens: one sub-block at a time (the pairs' accumulators would spill)
            for (int j = 0; j < 8; ++j) {
                __m512i D[RASE_R16_TILE];
                for (int t = 0; t < nt; ++t) D[t] = _mm512_setzero_si512();
                const __m512i hv = type == RASE_TYPE_Q5_K ? _mm512_loadu_si512((const void *)rase_r16k_h(o, j)) : m4;
                for (int s = 0; s < 8; ++s) {
                    const __m512i raw = _mm512_loadu_si512((const void *)rase_r16k_q(type, o, j / 2, s));
                    __m512i q = _mm512_and_si512(j & 1 ? _mm512_srli_epi16(raw, 4) : raw, m4);
                    if (type == RASE_TYPE_Q5_K)  // the fifth bit: bit s of each byte of hv, a byte mask
                        q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(hv, _mm512_set1_epi8((char)(1 << s))), q, x10);
                    for (int t = 0; t < nt; ++t)
                        D[t] = _mm512_dpbusd_epi32(D[t], q, _mm512_set1_epi32(rase_ld32(RASE_ACT(block_q8_K, t, b)->qs + 32 * j + 4 * s)));
                }
                const __m512i sc = _mm512_and_si512(_mm512_srli_epi32(j < 4 ? sc4 : sc8, 8 * (j % 4)), lo8);
                const __m512i mn = _mm512_and_si512(_mm512_srli_epi32(j < 4 ? mn4 : mn8, 8 * (j % 4)), lo8);
                const __m512i mn2 = _mm512_or_si512(mn, _mm512_slli_epi32(mn, 16));  // mn in both i16 halves
                for (int t = 0; t < nt; ++t) {
                    S[t] = _mm512_add_epi32(S[t], _mm512_mullo_epi32(D[t], sc));
                    M[t] = _mm512_dpwssd_epi32(M[t], mn2, _mm512_set1_epi32(rase_ld32(RASE_ACT(block_q8_K, t, b)->bsums + 2 * j)));
                }
            }
        }
        const __m512 dx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)hd->d));
        const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)hd->dmin));
        for (int t = 0; t < nt; ++t) {
            const __m512 dy = _mm512_set1_ps(RASE_ACT(block_q8_K, t, b)->d);
            if (type == RASE_TYPE_Q5_K) {  // acc + dy * (dx * S - dmin * M)
                const __m512 f = _mm512_sub_ps(_mm512_mul_ps(dx, _mm512_cvtepi32_ps(S[t])), _mm512_mul_ps(dm, _mm512_cvtepi32_ps(M[t])));
                acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(dy, f));
            } else {
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[t]), _mm512_mul_ps(dx, dy), acc[t]);
                accm[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(M[t]), _mm512_mul_ps(dm, dy), accm[t]);
            }
        }
    }
    for (int t = 0; t < nt; ++t)
        _mm512_mask_storeu_ps(y + t * ys, (__mmask16)((1u << nr) - 1), _mm512_sub_ps(acc[t], accm[t]));
}

RASE_R16_ENTRY(r16_q4_k_avx2, RASE_TARGET_AVX2, rase_r16k_avx2_body, RASE_TYPE_Q4_K)
RASE_R16_ENTRY(r16_q4_k_vnni, RASE_TARGET_AVX512, rase_r16k_vnni_body, RASE_TYPE_Q4_K)
RASE_R16_ENTRY(r16_q5_k_avx2, RASE_TARGET_AVX2, rase_r16k_avx2_body, RASE_TYPE_Q5_K)
RASE_R16_ENTRY(r16_q5_k_vnni, RASE_TARGET_AVX512, rase_r16k_vnni_body, RASE_TYPE_Q5_K)
#endif

#if RASE_HAVE_NEON
// ---------------------------------------------------------------- NEON (ARMv8.0; sdot with dotprod)
// Block by block, quarter by quarter (rows 4q .. 4q + 3, a row per 32-bit lane): the kmask
// unpack of the quarter's scales and mins (RASE_K4_LANES), then per sub-block the 8 slice dots
// of every token summed in int32 and times the sub-block's scale into S: the reference's integers.
// the quarter's [scale 0..3], [scale 4..7], [min 0..3], [min 4..7] bytes, a row per lane, from
// its 3 packed words (RASE_K4_LANES' kmask unpack)
static RASE_INLINE void rase_k4_lanes_neon(const r16_k_head *hd, int q, uint32x4_t out[4]) {
    const uint32x4_t km1 = vdupq_n_u32(0x3f3f3f3f), km2 = vdupq_n_u32(0x0f0f0f0f), km3 = vdupq_n_u32(0x03030303);
    const uint32x4_t u0 = vld1q_u32(hd->sm[0] + 4 * q), u1 = vld1q_u32(hd->sm[1] + 4 * q), u2 = vld1q_u32(hd->sm[2] + 4 * q);
    out[0] = vandq_u32(u0, km1);
    out[1] = vorrq_u32(vandq_u32(u2, km2), vshlq_n_u32(vandq_u32(vshrq_n_u32(u0, 6), km3), 4));
    out[2] = vandq_u32(u1, km1);
    out[3] = vorrq_u32(vandq_u32(vshrq_n_u32(u2, 4), km2), vshlq_n_u32(vandq_u32(vshrq_n_u32(u1, 6), km3), 4));
}

// sub-block j's byte of each lane of v (its 4-scale word)
static RASE_INLINE int32x4_t rase_k4_byte_neon(uint32x4_t v, int j) {
    return vreinterpretq_s32_u32(vandq_u32(vshlq_u32(v, vdupq_n_s32(-8 * (j % 4))), vdupq_n_u32(0xFF)));
}

// block b of a group (ob bytes each) for quarter q: prefetched ahead once per block, the
// quarter's scale and min words in scm
static RASE_INLINE const uint8_t *rase_r16k_neon_block(const uint8_t *w, int64_t b, size_t ob, int q, uint32x4_t *scm) {
    const uint8_t *o = w + b * ob;
    if (q == 0) RASE_PREFETCH_AHEAD(o, ob);
    rase_k4_lanes_neon((const r16_k_head *)o, q, scm);
    return o;
}

static RASE_INLINE void rase_r16k_neon_body(const int nt, const int dp, const int type, int64_t n, const uint8_t *w,
                                            const void *a, size_t astride, float *y, int64_t ys, int nr) {
    const size_t ob = rase_r16k_bytes(type);
    const int quarters = (nr + 3) / 4;
    float32x4_t acc[4][RASE_R16_TILE], accm[4][RASE_R16_TILE];
    for (int q = 0; q < quarters; ++q)
        for (int t = 0; t < nt; ++t) acc[q][t] = accm[q][t] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < n / 256; ++b)
        for (int q = 0; q < quarters; ++q) {
            uint32x4_t scm[4];
            const uint8_t *o = rase_r16k_neon_block(w, b, ob, q, scm);
            const r16_k_head *hd = (const r16_k_head *)o;
            int32x4_t S[RASE_R16_TILE], M[RASE_R16_TILE];
            for (int t = 0; t < nt; ++t) S[t] = M[t] = vdupq_n_s32(0);
            for (int j = 0; j < 8; ++j) {
                const int32x4_t sc = rase_k4_byte_neon(scm[0 + j / 4], j);
                const int32x4_t mn = rase_k4_byte_neon(scm[2 + j / 4], j);
                const uint8x16_t hv = type == RASE_TYPE_Q5_K ? vld1q_u8(rase_r16k_h(o, j) + 16 * q) : vdupq_n_u8(0);
                int32x4_t D[RASE_R16_TILE];
                for (int t = 0; t < nt; ++t) D[t] = vdupq_n_s32(0);
                for (int s = 0; s < 8; ++s) {
                    const int8x16_t wq = rase_neon_nibbles(vld1q_u8(rase_r16k_q(type, o, j / 2, s) + 16 * q), j & 1,
                                                           type == RASE_TYPE_Q5_K, hv, s);
                    for (int t = 0; t < nt; ++t)
                        D[t] = rase_neon_dot4(dp, D[t], wq, rase_neon_slice(RASE_ACT(block_q8_K, t, b)->qs + 32 * j + 4 * s));
                }
                for (int t = 0; t < nt; ++t) {
                    const int16_t *bs = RASE_ACT(block_q8_K, t, b)->bsums + 2 * j;
                    S[t] = vmlaq_s32(S[t], sc, D[t]);
                    M[t] = vmlaq_n_s32(M[t], mn, (int32_t)bs[0] + bs[1]);
                }
            }
            const float32x4_t dx = rase_neon_h4(hd->d + 4 * q), dm = rase_neon_h4(hd->dmin + 4 * q);
            for (int t = 0; t < nt; ++t) {
                const float dy = RASE_ACT(block_q8_K, t, b)->d;
                if (type == RASE_TYPE_Q5_K) {  // acc + dy * (dx * S - dmin * M)
                    const float32x4_t f = vsubq_f32(vmulq_f32(dx, vcvtq_f32_s32(S[t])), vmulq_f32(dm, vcvtq_f32_s32(M[t])));
                    acc[q][t] = vaddq_f32(acc[q][t], vmulq_n_f32(f, dy));
                } else {
                    acc[q][t] = vfmaq_f32(acc[q][t], vcvtq_f32_s32(S[t]), vmulq_n_f32(dx, dy));
                    accm[q][t] = vfmaq_f32(accm[q][t], vcvtq_f32_s32(M[t]), vmulq_n_f32(dm, dy));
                }
            }
        }
    for (int q = 0; q < quarters; ++q)
        for (int t = 0; t < nt; ++t) rase_neon_store4(vsubq_f32(acc[q][t], accm[q][t]), y + t * ys + 4 * q, nr - 4 * q);
}
RASE_NEON_ENTRIES(r16_q4_k, rase_r16k_neon_body, RASE_TYPE_Q4_K)
RASE_NEON_ENTRIES(r16_q5_k, rase_r16k_neon_body, RASE_TYPE_Q5_K)

// i8mm: np pairs of tokens. Per sub-block the quarter's 8 slices zipped into row pairs (slices
// 2k, 2k + 1: smmla's 2 x 8 operands); 4 smmla give a row pair x token pair's 32-element dots,
// times the rows' scales into S; the mins times the tokens' bsums into M. Lanes: r0 t0, r0 t1,
// r1 t0, r1 t1; the same integers, then the same float operations per lane.
static RASE_INLINE void rase_r16k_mmla_body(const int np, const int type, int64_t n, const uint8_t *w, const void *a,
                                            size_t astride, float *y, int64_t ys, int nr) {
    const size_t ob = rase_r16k_bytes(type);
    const int quarters = (nr + 3) / 4;
    float32x4_t acc[4][2][RASE_R16_TILE / 2], accm[4][2][RASE_R16_TILE / 2];
    for (int q = 0; q < quarters; ++q)
        for (int rp = 0; rp < 2; ++rp)
            for (int p = 0; p < np; ++p) acc[q][rp][p] = accm[q][rp][p] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < n / 256; ++b)
        for (int q = 0; q < quarters; ++q) {
            uint32x4_t scm[4];
            const uint8_t *o = rase_r16k_neon_block(w, b, ob, q, scm);
            const r16_k_head *hd = (const r16_k_head *)o;
            int32x4_t S[2][RASE_R16_TILE / 2], M[2][RASE_R16_TILE / 2];
            for (int rp = 0; rp < 2; ++rp)
                for (int p = 0; p < np; ++p) S[rp][p] = M[rp][p] = vdupq_n_s32(0);
            for (int j = 0; j < 8; ++j) {
                const int32x4_t sc = rase_k4_byte_neon(scm[0 + j / 4], j);
                const int32x4_t mn = rase_k4_byte_neon(scm[2 + j / 4], j);
                const int32x4_t scp[2] = {vzip1q_s32(sc, sc), vzip2q_s32(sc, sc)}, mnp[2] = {vzip1q_s32(mn, mn), vzip2q_s32(mn, mn)};
                const uint8x16_t hv = type == RASE_TYPE_Q5_K ? vld1q_u8(rase_r16k_h(o, j) + 16 * q) : vdupq_n_u8(0);
                int8x16_t A[4][2];
                for (int k = 0; k < 4; ++k) {
                    int8x16_t sl[2];
                    for (int e = 0; e < 2; ++e) {
                        const int s = 2 * k + e;
                        sl[e] = rase_neon_nibbles(vld1q_u8(rase_r16k_q(type, o, j / 2, s) + 16 * q), j & 1,
                                                  type == RASE_TYPE_Q5_K, hv, s);
                    }
                    rase_neon_row_pairs(sl[0], sl[1], A[k]);
                }
                for (int p = 0; p < np; ++p) {
                    const block_q8_K *y0 = RASE_ACT(block_q8_K, 2 * p, b), *y1 = RASE_ACT(block_q8_K, 2 * p + 1, b);
                    int8x16_t B[4];
                    for (int k = 0; k < 4; ++k) B[k] = vcombine_s8(vld1_s8(y0->qs + 32 * j + 8 * k), vld1_s8(y1->qs + 32 * j + 8 * k));
                    const int32_t b0 = (int32_t)y0->bsums[2 * j] + y0->bsums[2 * j + 1];
                    const int32_t b1 = (int32_t)y1->bsums[2 * j] + y1->bsums[2 * j + 1];
                    const int32_t bsv[4] = {b0, b1, b0, b1};
                    const int32x4_t bs = vld1q_s32(bsv);
                    for (int rp = 0; rp < 2; ++rp) {
                        int32x4_t D = vdupq_n_s32(0);
                        for (int k = 0; k < 4; ++k) D = rase_neon_mmla(D, A[k][rp], B[k]);
                        S[rp][p] = vmlaq_s32(S[rp][p], scp[rp], D);
                        M[rp][p] = vmlaq_s32(M[rp][p], mnp[rp], bs);
                    }
                }
            }
            const float32x4_t dx = rase_neon_h4(hd->d + 4 * q), dm = rase_neon_h4(hd->dmin + 4 * q);
            const float32x4_t dxp[2] = {vzip1q_f32(dx, dx), vzip2q_f32(dx, dx)}, dmp[2] = {vzip1q_f32(dm, dm), vzip2q_f32(dm, dm)};
            for (int p = 0; p < np; ++p) {
                const float dyv[4] = {RASE_ACT(block_q8_K, 2 * p, b)->d, RASE_ACT(block_q8_K, 2 * p + 1, b)->d,
                                      RASE_ACT(block_q8_K, 2 * p, b)->d, RASE_ACT(block_q8_K, 2 * p + 1, b)->d};
                const float32x4_t dy = vld1q_f32(dyv);
                for (int rp = 0; rp < 2; ++rp) {
                    if (type == RASE_TYPE_Q5_K) {  // acc + dy * (dx * S - dmin * M)
                        const float32x4_t f = vsubq_f32(vmulq_f32(dxp[rp], vcvtq_f32_s32(S[rp][p])),
                                                        vmulq_f32(dmp[rp], vcvtq_f32_s32(M[rp][p])));
                        acc[q][rp][p] = vaddq_f32(acc[q][rp][p], vmulq_f32(dy, f));
                    } else {
                        acc[q][rp][p] = vfmaq_f32(acc[q][rp][p], vcvtq_f32_s32(S[rp][p]), vmulq_f32(dxp[rp], dy));
                        accm[q][rp][p] = vfmaq_f32(accm[q][rp][p], vcvtq_f32_s32(M[rp][p]), vmulq_f32(dmp[rp], dy));
                    }
                }
            }
        }
    for (int q = 0; q < quarters; ++q)
        for (int rp = 0; rp < 2 && 4 * q + 2 * rp < nr; ++rp)
            for (int p = 0; p < np; ++p)
                rase_neon_store22(vsubq_f32(acc[q][rp][p], accm[q][rp][p]), y + 2 * p * ys + 4 * q + 2 * rp, ys,
                                  nr - 4 * q - 2 * rp);
}
RASE_MMLA_ENTRY(r16_q4_k, rase_r16k_mmla_body, rase_r16k_neon_body, RASE_TYPE_Q4_K)
RASE_MMLA_ENTRY(r16_q5_k, rase_r16k_mmla_body, rase_r16k_neon_body, RASE_TYPE_Q5_K)
#endif

#endif  // RASE_REPACK_K_H
