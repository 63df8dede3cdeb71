// rase/kernels/_attend_fa.h: attention over quantized K/V (q8_0 or q4_0 blocks in the paged pool) with
// llama.cpp's CPU flash-attention numerics (ggml_compute_forward_flash_attn_ext_f16_one_chunk,
// the path every quantized K takes, one token or a batch alike; llama.cpp quantizes V only with
// flash attention):
//   q is quantized to q8_0 (K's vec_dot_type) as quantize_row_q8_0 does on x86;
//   each key's score is ggml's q8_0 / q4_0 x q8_0 dot (8 lanes of 4-product integer sums, one
//   FMA per block with d = d_k * d_q, the lanes summed as hsum_float_8), times scale
//   (softcap: scale / cap, then cap * tanhf);
//   the softmax is online, key by key in position order, with libm's expf: a new maximum
//   scales the accumulator and the sum by expf(M_old - M), otherwise the key's weight is
//   expf(s - M); V is dequantized to f32 (exact) and accumulated with one FMA per element;
//   a sink logit joins after the last key; the result is the accumulator times 1 / S.
// Every ISA computes these operations in this order, so their bits are the scalar reference's.
#ifndef RASE_ATTEND_FA_H
#define RASE_ATTEND_FA_H

#include "_dot.h"
#include "_kv.h"
#include "_quantize.h"

// uint16 units of one (position, KV head) row of the pool: f16 elements, or 34-byte q8_0 /
// 18-byte q4_0 blocks (hd % 32 == 0 for the block types)
static inline int rase_kv_row_elems(int type, int hd) {
    switch (type) {
        case RASE_TYPE_Q8_0: return hd / 32 * (int)(sizeof(block_q8_0) / 2);
        case RASE_TYPE_Q4_0: return hd / 32 * (int)(sizeof(block_q4_0) / 2);
        default: return hd;
    }
}

// x (n f32) -> q8_0 blocks, as ggml's x86 quantize_row_q8_0: d = amax / 127 stored f16,
// q = nearest-even(x * 127 / amax)
static void rase_kv_quant_q8_0_ref(const float *x, block_q8_0 *y, int64_t n) {
    for (int64_t i = 0; i < n / 32; ++i, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(x[j]));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = rase_fp32_to_fp16(amax / 127.0f);
        for (int j = 0; j < 32; ++j) y[i].qs[j] = (int8_t)nearbyintf(x[j] * id);
    }
}

#if RASE_HAVE_X86
RASE_TARGET_AVX2 static void rase_kv_quant_q8_0_avx2(const float *x, block_q8_0 *y, int64_t n) {
    for (int64_t i = 0; i < n / 32; ++i, x += 32) {
        const float amax = rase_avx2_absmax(x, 32);
        y[i].d = rase_fp32_to_fp16(amax / 127.0f);
        _mm256_storeu_si256((__m256i *)y[i].qs, rase_avx2_quant32(x, amax != 0.0f ? 127.0f / amax : 0.0f));
    }
}
#endif

// ggml_compute_forward_fwht on each n-element part of x (len elements; n a power of 2): llama.cpp's
// Walsh-Hadamard rotation of Q/K and V around a quantized cache. Scaled by 1 / sqrtf(n) first, then
// butterflies of width 1, 2, .. n / 2 (its SIMD passes' u + v * -1 is u - v exactly). Its own
// inverse: applied to the attention output it undoes V's.
static void rase_fwht_rows(float *x, int64_t len, int n) {
    const float scale = 1.0f / sqrtf((float)n);
    for (int64_t o = 0; o + n <= len; o += n) {
        float *y = x + o;
        for (int j = 0; j < n; ++j) y[j] *= scale;
        for (int w = 1; w < n; w <<= 1)
            for (int i = 0; i < n; i += 2 * w)
                for (int j = 0; j < w; ++j) {
                    const float u = y[i + j], v = y[i + w + j];
                    y[i + j] = u + v;
                    y[i + w + j] = u - v;
                }
    }
}

// llama.cpp's rotation sizes for a quantized cache of head size hd (0: none): K (and Q) in parts of
// the largest power of 2 >= 64 dividing hd, V (and the output) in parts of 64; only for hd % 64 == 0
static inline int rase_kv_rot_k(int type, int hd) {
    if (type == RASE_TYPE_F16 || hd % 64) return 0;
    int n = 64;
    while (hd % (2 * n) == 0) n *= 2;
    return n;
}
static inline int rase_kv_rot_v(int type, int hd) { return type == RASE_TYPE_F16 || hd % 64 ? 0 : 64; }

// one f32 row (hd) into the pool as `type` (F16, Q8_0 or Q4_0)
static void rase_kv_store_row(int type, const float *x, uint16_t *dst, int hd, int isa) {
    switch (type) {
        case RASE_TYPE_Q8_0:
#if RASE_HAVE_X86
            if (isa >= RASE_ISA_AVX2) { rase_kv_quant_q8_0_avx2(x, (block_q8_0 *)dst, hd); return; }
#endif
            rase_kv_quant_q8_0_ref(x, (block_q8_0 *)dst, hd);
            return;
        case RASE_TYPE_Q4_0: quant_row_q4_0_ref(x, dst, hd); return;  // quantize_row_q4_0_ref, as llama.cpp
        default: rase_fp32_to_fp16_row(x, dst, hd, isa);
    }
}

// block b of a K/V row as 32 signed values and its scale
static inline float rase_kv_block(int type, const uint16_t *row, int b, int8_t *v) {
    if (type == RASE_TYPE_Q8_0) {
        const block_q8_0 *x = (const block_q8_0 *)row + b;
        memcpy(v, x->qs, 32);
        return rase_fp16_to_fp32(x->d);
    }
    const block_q4_0 *x = (const block_q4_0 *)row + b;
    for (int j = 0; j < 16; ++j) {
        v[j] = (int8_t)((x->qs[j] & 15) - 8);
        v[16 + j] = (int8_t)((x->qs[j] >> 4) - 8);
    }
    return rase_fp16_to_fp32(x->d);
}

// ggml_vec_dot_{q8_0,q4_0}_q8_0 on x86: lane l of block b adds d * (sum of products 4l..4l+3)
static float rase_fa_dot_ref(int type, const uint16_t *k, const block_q8_0 *q, int nb) {
    float acc[8] = {0.0f};
    for (int b = 0; b < nb; ++b) {
        int8_t kx[32];
        const float d = rase_kv_block(type, k, b, kx) * rase_fp16_to_fp32(q[b].d);
        for (int l = 0; l < 8; ++l) {
            int s = 0;
            for (int i = 4 * l; i < 4 * l + 4; ++i) s += kx[i] * q[b].qs[i];
            acc[l] = fmaf(d, (float)s, acc[l]);
        }
    }
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// the online softmax's step for score s: returns the accumulator's factor ms, sets *vs
static inline float rase_fa_step(float s, float *M, float *S, float *vs) {
    const float Mold = *M;
    float ms = 1.0f;
    *vs = 1.0f;
    if (s > *M) {
        *M = s;
        ms = expf(Mold - s);
    } else {
        *vs = expf(s - *M);
    }
    *S = fmaf(*S, ms, *vs);  // one rounding: the x86 build contracts S = S * ms + vs into an FMA
    return ms;
}

// the end of a query: a sink logit joins the softmax after the last key (as ggml: a new maximum
// scales the accumulator), then out (hd) is divided by the sum
static void rase_fa_finish(float sink, float M, float S, float *out, int hd) {
    if (sink > -INFINITY) {
        float ms = 1.0f, vs = 1.0f;
        if (sink > M) ms = expf(M - sink); else vs = expf(sink - M);
        if (ms != 1.0f)
            for (int i = 0; i < hd; ++i) out[i] *= ms;
        S = fmaf(S, ms, vs);
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int i = 0; i < hd; ++i) out[i] *= inv;
}

// scale as ggml passes it to the score: divided by the cap when scores are capped
static inline float rase_fa_score(float dot, float scale, float softcap) {
    float s = dot * scale;
    if (softcap > 0.0f) s = softcap * tanhf(s);
    return s + 0.0f;  // the mask's 0 for a visible key
}

// one query head: q (hd) against keys [j0, j1) of a quantized view -> out (hd).
// qq: hd / 32 blocks of scratch for the quantized q.
static void attend_fa_ref(const float *q, const rase_kv_view *kv, int type, int j0, int j1, int hd, float scale,
                          float softcap, float sink, block_q8_0 *qq, float *out) {
    const int nb = hd / 32;
    rase_kv_quant_q8_0_ref(q, qq, hd);
    if (softcap > 0.0f) scale /= softcap;
    float S = 0.0f, M = -INFINITY;
    for (int i = 0; i < hd; ++i) out[i] = 0.0f;
    for (int j = j0; j < j1; ++j) {
        const int64_t off = rase_kv_off(kv, j);
        float vs;
        const float ms = rase_fa_step(rase_fa_score(rase_fa_dot_ref(type, kv->k + off, qq, nb), scale, softcap), &M, &S, &vs);
        if (ms != 1.0f)
            for (int i = 0; i < hd; ++i) out[i] *= ms;
        for (int b = 0; b < nb; ++b) {
            int8_t vx[32];
            const float d = rase_kv_block(type, kv->v + off, b, vx);
            for (int i = 0; i < 32; ++i) out[32 * b + i] = fmaf((float)vx[i] * d, vs, out[32 * b + i]);
        }
    }
    rase_fa_finish(sink, M, S, out, hd);
}

#if RASE_HAVE_X86
// block b of a K/V row as 32 signed bytes and its scale
RASE_TARGET_AVX2 static inline __m256i rase_kv_block_avx2(int type, const uint16_t *row, int b, float *d) {
    if (type == RASE_TYPE_Q8_0) {
        const block_q8_0 *x = (const block_q8_0 *)row + b;
        *d = rase_h2f(x->d);
        return _mm256_loadu_si256((const __m256i *)x->qs);
    }
    const block_q4_0 *x = (const block_q4_0 *)row + b;
    *d = rase_h2f(x->d);
    return _mm256_sub_epi8(rase_avx2_nibbles16(x->qs), _mm256_set1_epi8(8));
}

// attend_fa_ref for g (<= RASE_ATTN_G) query heads of one KV head: each K/V block is loaded and
// widened once for all of them; each query's operations are the reference's
RASE_TARGET_AVX2 static void attend_fa_avx2(int g, const float *const *q, const rase_kv_view *kv, int type, int j0,
                                            int j1, int hd, float scale, float softcap, const float *sinks,
                                            float *scratch, int64_t qstride, float *const *out) {
    const int nb = hd / 32;
    block_q8_0 *qq[RASE_ATTN_G];
    float S[RASE_ATTN_G], M[RASE_ATTN_G], qd[RASE_ATTN_G][8];  // qd: the q blocks' scales (hd <= 256)
    if (softcap > 0.0f) scale /= softcap;
    for (int h = 0; h < g; ++h) {
        qq[h] = (block_q8_0 *)(scratch + h * qstride);
        rase_kv_quant_q8_0_avx2(q[h], qq[h], hd);
        for (int b = 0; b < nb; ++b) qd[h][b] = rase_h2f(qq[h][b].d);
        S[h] = 0.0f, M[h] = -INFINITY;
        for (int i = 0; i < hd; ++i) out[h][i] = 0.0f;
    }
    for (int j = j0; j < j1; ++j) {
        const int64_t off = rase_kv_off(kv, j);
        __m256 acc[RASE_ATTN_G];
        for (int h = 0; h < g; ++h) acc[h] = _mm256_setzero_ps();
        for (int b = 0; b < nb; ++b) {
            float dk;
            const __m256i kx = rase_kv_block_avx2(type, kv->k + off, b, &dk);
            for (int h = 0; h < g; ++h) {
                const __m256 p = _mm256_cvtepi32_ps(rase_avx2_dot_i8(kx, _mm256_loadu_si256((const __m256i *)qq[h][b].qs)));
                acc[h] = _mm256_fmadd_ps(_mm256_set1_ps(dk * qd[h][b]), p, acc[h]);
            }
        }
        float ms[RASE_ATTN_G], vs[RASE_ATTN_G];
        for (int h = 0; h < g; ++h) ms[h] = rase_fa_step(rase_fa_score(rase_avx2_hsum(acc[h]), scale, softcap), &M[h], &S[h], &vs[h]);
        for (int b = 0; b < nb; ++b) {
            float dv;
            const __m256i vx = rase_kv_block_avx2(type, kv->v + off, b, &dv);
            const __m128i lo = _mm256_castsi256_si128(vx), hi = _mm256_extracti128_si256(vx, 1);
            const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
            for (int c = 0; c < 4; ++c) {
                const __m256 v8 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[c])), _mm256_set1_ps(dv));
                for (int h = 0; h < g; ++h) {
                    float *o = out[h] + 32 * b + 8 * c;
                    __m256 a = _mm256_loadu_ps(o);
                    if (ms[h] != 1.0f) a = _mm256_mul_ps(a, _mm256_set1_ps(ms[h]));
                    _mm256_storeu_ps(o, _mm256_fmadd_ps(v8, _mm256_set1_ps(vs[h]), a));
                }
            }
        }
    }
    for (int h = 0; h < g; ++h) rase_fa_finish(sinks ? sinks[h] : -INFINITY, M[h], S[h], out[h], hd);
}
#endif

// g query heads over one quantized KV head (rase_attend's contract); scratch: g * qstride floats
static void rase_attend_fa(int g, const float *const *q, const rase_kv_view *kv, int type, int j0, int j1, int hd,
                           float scale, float softcap, const float *sinks, float *scratch, int64_t qstride,
                           float *const *out, int isa) {
#if RASE_HAVE_X86
    if (isa >= RASE_ISA_AVX2 && hd <= 256) { attend_fa_avx2(g, q, kv, type, j0, j1, hd, scale, softcap, sinks, scratch, qstride, out); return; }
#endif
    (void)isa;
    for (int h = 0; h < g; ++h)
        attend_fa_ref(q[h], kv, type, j0, j1, hd, scale, softcap, sinks ? sinks[h] : -INFINITY,
                      (block_q8_0 *)(scratch + h * qstride), out[h]);
}

#endif  // RASE_ATTEND_FA_H
