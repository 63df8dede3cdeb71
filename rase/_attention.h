// rase/_attention.h: one query head against a sequence's cached K/V, read through its block
// table from the paged pool.
//
// Numerics (batch invariance): the result for a query depends only on q, its sequence's K/V
// rows j0..j1-1 and j1 itself. Accumulator slots, the 8-lane groups of the softmax sum and the
// padding to 32 are functions of the absolute position j, never of other queries, other
// sequences or which pool blocks hold the rows.
#ifndef RASE_ATTENTION_H
#define RASE_ATTENTION_H

#include "_simd.h"

#define RASE_KV_BLOCK 32  // positions per KV block: the unit of allocation, sharing and caching

// A sequence's K/V rows for one layer and KV head. Position j lives in pool block
// table[j / RASE_KV_BLOCK], row j % RASE_KV_BLOCK.
typedef struct {
    const uint16_t *k, *v;  // f16; block 0, row 0 of this layer and head
    const int32_t *table;   // the sequence's block ids
    int64_t block_stride;   // elements from one pool block to the next
    int64_t row_stride;     // elements from one position to the next inside a block
} rase_kv_view;

static inline int64_t rase_kv_off(const rase_kv_view *kv, int j) {
    return (int64_t)kv->table[j / RASE_KV_BLOCK] * kv->block_stride +
           (int64_t)(j % RASE_KV_BLOCK) * kv->row_stride;
}

// floats of scratch one attend call needs for sequences of up to n_ctx positions
static inline int64_t rase_attend_scratch(int64_t n_ctx, int hd) {
    return ((n_ctx + 31 + 64 + 7) & ~7) + 33 * (int64_t)hd;
}

static void attend_ref(const float *q, const rase_kv_view *kv, int j0, int j1, int hd, float scale,
                       float *scratch, float *out) {
    float *s = scratch, mx = -INFINITY;
    for (int j = j0; j < j1; ++j) {
        const uint16_t *k = kv->k + rase_kv_off(kv, j);
        float d = 0.0f;
        for (int i = 0; i < hd; ++i) d += q[i] * rase_fp16_to_fp32(k[i]);
        s[j] = d * scale;
        if (s[j] > mx) mx = s[j];
    }
    double sum = 0.0;
    for (int j = j0; j < j1; ++j) { s[j] = expf(s[j] - mx); sum += s[j]; }
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < hd; ++i) out[i] = 0.0f;
    for (int j = j0; j < j1; ++j) {
        const float p = s[j] * inv;
        const uint16_t *v = kv->v + rase_kv_off(kv, j);
        for (int i = 0; i < hd; ++i) out[i] += p * rase_fp16_to_fp32(v[i]);
    }
}

#if RASE_HAVE_X86
// llama.cpp's one-token (decode) attention, step for step, so logits equal its n_batch = 1
// numerics: q rounded to f16; scores as ggml_vec_dot_f16 computes them (four 8-lane FMA
// accumulators, 32 elements per step); softmax over the length padded to 32 with ggml's exp
// and an f64 sum of 8-lane partial sums; probabilities rounded to f16; P.V in 32 slots by
// position, reduced as ggml reduces its accumulators.
// G query heads that share this KV head are served together: each K/V row is loaded and
// converted once; every query's own operations are those of G = 1. Query h uses scratch
// + h * qstride: scores (n + pad), 32 * hd partial sums, hd floats of q.
#define RASE_ATTN_G 4  // most query heads per call
#define RASE_ROWS(ptr, b, j0, j1, lo, hi)                                                       \
    const int lo = (b) * RASE_KV_BLOCK > (j0) ? (b) * RASE_KV_BLOCK : (j0);                    \
    const int hi = ((b) + 1) * RASE_KV_BLOCK < (j1) ? ((b) + 1) * RASE_KV_BLOCK : (j1);        \
    ptr += (int64_t)kv->table[b] * kv->block_stride + (int64_t)(lo - (b) * RASE_KV_BLOCK) * kv->row_stride

RASE_TARGET_AVX2 static inline __attribute__((always_inline)) void attend_avx2_g(
        const int G, const float *const *q, const rase_kv_view *kv, int j0, int j1, int hd, float scale,
        float *scratch, int64_t qstride, float *const *out) {
    const int n = (j1 + 31) & ~31;
    const int64_t poff = (n + 64 + 7) & ~7, qoff = poff + 32 * (int64_t)hd;
    float mx[RASE_ATTN_G];
    for (int h = 0; h < G; ++h) {
        float *s = scratch + h * qstride, *qf = s + qoff;
        for (int i = 0; i < hd; i += 8)
            _mm256_storeu_ps(qf + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(q[h] + i), 0)));
        for (int j = 0; j < j0; ++j) s[j] = -INFINITY;
        for (int j = j1; j < n; ++j) s[j] = -INFINITY;
        mx[h] = -INFINITY;
    }
    for (int b = j0 / RASE_KV_BLOCK; b * RASE_KV_BLOCK < j1; ++b) {  // block by block through the table
        const uint16_t *k = kv->k;
        RASE_ROWS(k, b, j0, j1, lo, hi);
        for (int j = lo; j < hi; ++j, k += kv->row_stride) {
            __m256 acc[RASE_ATTN_G][4];
            for (int h = 0; h < G; ++h)
                for (int c = 0; c < 4; ++c) acc[h][c] = _mm256_setzero_ps();
            for (int i = 0; i < hd; i += 32)  // accumulator c takes elements 32 m + 8 c .. + 7
                for (int c = 0; c < 4; ++c) {
                    const __m256 kf = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i + 8 * c)));
                    for (int h = 0; h < G; ++h)
                        acc[h][c] = _mm256_fmadd_ps(kf, _mm256_loadu_ps(scratch + h * qstride + qoff + i + 8 * c), acc[h][c]);
                }
            for (int h = 0; h < G; ++h) {
                float *s = scratch + h * qstride;
                s[j] = rase_avx2_reduce4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]) * scale;
                if (s[j] > mx[h]) mx[h] = s[j];
            }
        }
    }
    for (int h = 0; h < G; ++h) {
        float *s = scratch + h * qstride;
        double sum = 0.0;
        for (int j = 0; j < n; j += 8) {
            const __m256 e = rase_avx2_expf(_mm256_sub_ps(_mm256_loadu_ps(s + j), _mm256_set1_ps(mx[h])));
            _mm256_storeu_ps(s + j, e);
            sum += (double)rase_avx2_hsum(e);
        }
        const __m256 inv = _mm256_set1_ps((float)(1.0 / sum));
        for (int j = 0; j < n; j += 8)  // p rounded to f16, kept as f32 values
            _mm256_storeu_ps(s + j, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(s + j), inv), 0)));
    }
    // P.V: partial sums per slot (position mod 32), each a sequential FMA chain over the valid
    // positions of that slot in order; a chain lives in a register for 8 elements of the head
    // and is stored once (the chains of SG slots x G queries run side by side)
    const int SG = G >= 3 ? 2 : 4;
    const int b0 = j0 / RASE_KV_BLOCK, b1 = (j1 + RASE_KV_BLOCK - 1) / RASE_KV_BLOCK;
    for (int s0 = 0; s0 < 32; s0 += SG)
        for (int i = 0; i < hd; i += 8) {
            __m256 acc[RASE_ATTN_G][4];
            for (int h = 0; h < G; ++h)
                for (int k = 0; k < SG; ++k) acc[h][k] = _mm256_setzero_ps();
            for (int b = b0; b < b1; ++b) {
                const uint16_t *v = kv->v + (int64_t)kv->table[b] * kv->block_stride + i;
                for (int k = 0; k < SG; ++k) {
                    const int j = b * RASE_KV_BLOCK + s0 + k;
                    if (j < j0 || j >= j1) continue;
                    const __m256 vf = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + (int64_t)(s0 + k) * kv->row_stride)));
                    for (int h = 0; h < G; ++h)
                        acc[h][k] = _mm256_fmadd_ps(vf, _mm256_set1_ps(scratch[h * qstride + j]), acc[h][k]);
                }
            }
            for (int h = 0; h < G; ++h)
                for (int k = 0; k < SG; ++k)
                    _mm256_storeu_ps(scratch + h * qstride + poff + (int64_t)(s0 + k) * hd + i, acc[h][k]);
        }
    for (int h = 0; h < G; ++h) {
        const float *part = scratch + h * qstride + poff;
        for (int i = 0; i < hd; i += 8) {  // lane l of accumulator c holds slot 8c + l; reduce as ggml
            __m256 z[8];
            for (int l = 0; l < 8; ++l) {
                const float *pl = part + l * hd + i;
                z[l] = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(pl), _mm256_loadu_ps(pl + 16 * hd)),
                                     _mm256_add_ps(_mm256_loadu_ps(pl + 8 * hd), _mm256_loadu_ps(pl + 24 * hd)));
            }
            // 128-bit halves, then two hadds: (z0+z4 + z1+z5) + (z2+z6 + z3+z7)
            const __m256 r = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(z[0], z[4]), _mm256_add_ps(z[1], z[5])),
                                           _mm256_add_ps(_mm256_add_ps(z[2], z[6]), _mm256_add_ps(z[3], z[7])));
            _mm256_storeu_ps(out[h] + i, r);
        }
    }
}

RASE_TARGET_AVX2 static void attend_avx2(int g, const float *const *q, const rase_kv_view *kv, int j0, int j1,
                                         int hd, float scale, float *scratch, int64_t qstride, float *const *out) {
    switch (g) {  // G as a constant: the per-query loops unroll
        case 1: attend_avx2_g(1, q, kv, j0, j1, hd, scale, scratch, qstride, out); break;
        case 2: attend_avx2_g(2, q, kv, j0, j1, hd, scale, scratch, qstride, out); break;
        case 3: attend_avx2_g(3, q, kv, j0, j1, hd, scale, scratch, qstride, out); break;
        default: attend_avx2_g(4, q, kv, j0, j1, hd, scale, scratch, qstride, out); break;
    }
}
#undef RASE_ROWS
#endif

// g (1..RASE_ATTN_G) query heads q[h] -> out[h] over one KV head; scratch: g * qstride floats,
// qstride >= rase_attend_scratch(n_ctx, hd). Each query's result does not depend on g.
static void rase_attend(int g, const float *const *q, const rase_kv_view *kv, int j0, int j1, int hd,
                        float scale, float *scratch, int64_t qstride, float *const *out, int isa) {
#if RASE_HAVE_X86
    if (isa >= RASE_ISA_AVX2 && hd % 32 == 0) { attend_avx2(g, q, kv, j0, j1, hd, scale, scratch, qstride, out); return; }
#endif
    for (int h = 0; h < g; ++h) attend_ref(q[h], kv, j0, j1, hd, scale, scratch, out[h]);
}

#endif  // RASE_ATTENTION_H
