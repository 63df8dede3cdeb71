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

// where a query's 32 P.V partial sums start in its scratch, past the scores of keys up to j1
// (padded to 32); its f16-rounded q follows them (both within rase_attend_scratch(j1, hd))
static inline int64_t rase_attend_partoff(int j1) { return (((j1 + 31) & ~31) + 64 + 7) & ~7; }
static inline int64_t rase_attend_qoff(int j1, int hd) { return rase_attend_partoff(j1) + 32 * (int64_t)hd; }

// s[j] = cap * tanh(s[j] / cap) for j in [j0, j1) (ggml_scale, ggml_tanh, ggml_scale: Gemma 2's
// soft-capping of attention scores, already scaled, and of logits); returns their new max
static float rase_softcap(float *s, int64_t j0, int64_t j1, float cap) {
    const float inv = 1.0f / cap;
    float mx = -INFINITY;
    for (int64_t j = j0; j < j1; ++j) {
        s[j] = tanhf(s[j] * inv) * cap;
        if (s[j] > mx) mx = s[j];
    }
    return mx;
}

static void attend_ref(const float *q, const rase_kv_view *kv, int j0, int j1, int hd, float scale,
                       float softcap, float *scratch, float *out) {
    float *s = scratch, mx = -INFINITY;
    for (int j = j0; j < j1; ++j) {
        const uint16_t *k = kv->k + rase_kv_off(kv, j);
        float d = 0.0f;
        for (int i = 0; i < hd; ++i) d += q[i] * rase_fp16_to_fp32(k[i]);
        s[j] = d * scale;
        if (s[j] > mx) mx = s[j];
    }
    if (softcap > 0.0f) mx = rase_softcap(s, j0, j1, softcap);
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

// exp(x) for one float: rase_avx2_expf's operations lane by lane (fmaf for each FMA)
static float rase_expf_ref(float x) {
    const float shift = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, shift), n = z - shift;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    uint32_t zi, ki;
    memcpy(&zi, &z, 4);
    const uint32_t e = zi << 23;
    ki = e + 0x3f800000u;
    float k;
    memcpy(&k, &ki, 4);
    const float u = b * b;
    const float hi = fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), lo = fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f);
    const float j = fmaf(fmaf(hi, u, lo), u, 0x1.ffffecp-1f * b);
    if (!(fabsf(n) > 126.0f)) return fmaf(j, k, k);
    const uint32_t g = n <= 0.0f ? 0x82000000u : 0u, s1i = g + 0x7f000000u, s2i = e - g;
    float s1, s2;
    memcpy(&s1, &s1i, 4);
    memcpy(&s2, &s2i, 4);
    return fabsf(n) > 192.0f ? s1 * s1 : fmaf(s2, j, s2) * s1;
}

// The SIMD paths' one-token numerics (below) one float at a time, the reference their bits are
// tested against: q and p rounded to f16; per key four 8-lane FMA chains, (c0 + c2) + (c1 + c3),
// then lanes ((0 + 4) + (1 + 5)) + ((2 + 6) + (3 + 7)); softmax over the length padded to 32,
// its f64 sum of 8-lane sums ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)); P.V as 32 chains by
// slot (position mod 32), reduced per element as (s + s16) + (s8 + s24) for s < 8, then as the
// score lanes. scratch: n + 33 * hd floats (rase_attend_scratch).
static void attend_ggml_ref(const float *q, const rase_kv_view *kv, int j0, int j1, int hd, float scale,
                            float softcap, float *scratch, float *out) {
    const int n = (j1 + 31) & ~31;
    float *s = scratch, *qf = s + n, *part = qf + hd, mx = -INFINITY;
    for (int i = 0; i < hd; ++i) qf[i] = rase_fp16_to_fp32(rase_fp32_to_fp16(q[i]));
    for (int j = 0; j < n; ++j) {
        s[j] = -INFINITY;
        if (j < j0 || j >= j1) continue;
        const uint16_t *k = kv->k + rase_kv_off(kv, j);
        float a[4][8] = {{0.0f}}, x[8];
        for (int m = 0; m < hd; m += 32)
            for (int c = 0; c < 4; ++c)
                for (int l = 0; l < 8; ++l)
                    a[c][l] = fmaf(rase_fp16_to_fp32(k[m + 8 * c + l]), qf[m + 8 * c + l], a[c][l]);
        for (int l = 0; l < 8; ++l) x[l] = (a[0][l] + a[2][l]) + (a[1][l] + a[3][l]);
        s[j] = (((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]))) * scale;
        if (s[j] > mx) mx = s[j];
    }
    if (softcap > 0.0f) mx = rase_softcap(s, j0, j1, softcap);
    double sum = 0.0;
    for (int j = 0; j < n; j += 8) {
        float e[8];
        for (int l = 0; l < 8; ++l) e[l] = s[j + l] = rase_expf_ref(s[j + l] - mx);
        sum += (double)(((e[0] + e[4]) + (e[2] + e[6])) + ((e[1] + e[5]) + (e[3] + e[7])));
    }
    const float inv = (float)(1.0 / sum);
    for (int j = 0; j < n; ++j) s[j] = rase_fp16_to_fp32(rase_fp32_to_fp16(s[j] * inv));
    for (int k = 0; k < 32; ++k)
        for (int i = 0; i < hd; ++i) {
            float acc = 0.0f;
            for (int j = k; j < j1; j += 32)
                if (j >= j0) acc = fmaf(rase_fp16_to_fp32(kv->v[rase_kv_off(kv, j) + i]), s[j], acc);
            part[k * hd + i] = acc;
        }
    for (int i = 0; i < hd; ++i) {
        float z[8];
        for (int l = 0; l < 8; ++l)
            z[l] = (part[l * hd + i] + part[(l + 16) * hd + i]) + (part[(l + 8) * hd + i] + part[(l + 24) * hd + i]);
        out[i] = ((z[0] + z[4]) + (z[1] + z[5])) + ((z[2] + z[6]) + (z[3] + z[7]));
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

// The K/V rows of one head are row_stride apart inside a block of RASE_KV_BLOCK positions and
// the blocks lie anywhere in the pool (block_stride apart when a sequence's blocks were taken in
// order). The scores loop asks, with each key, for the same row RASE_KV_PF_QK blocks on. P.V
// reads its blocks in groups of RASE_PV_GROUP (256 positions; one group is 32 KiB of V at
// head_dim 64): each pass over a group asks for its rows of the next group, so the next group
// arrives while this one is read, and no pass strides through the whole context (a pass per
// slot pair over every block ran at half the speed of the same reads in cache at 4000
// positions). Prefetches and groups never change a result: each chain keeps its order.
#define RASE_KV_PF_QK 1
#define RASE_PV_GROUP 8
static inline void rase_kv_prefetch_row(const uint16_t *row, int hd) {
    for (int o = 0; o < hd * 2; o += 64) rase_prefetch((const char *)row + o);
}

#define RASE_ATTN_NAME attend_avx2_g
#define RASE_ATTN_SCORES attend_avx2_scores
#define RASE_ATTN_FINISH attend_avx2_finish
#define RASE_ATTN_REDUCE attend_avx2_reduce
#define RASE_ATTN_TARGET RASE_TARGET_AVX2
#define RASE_ATTN_WIDE 0
#include "_attend_g.h"
#undef RASE_ATTN_NAME
#undef RASE_ATTN_SCORES
#undef RASE_ATTN_FINISH
#undef RASE_ATTN_REDUCE
#undef RASE_ATTN_TARGET
#undef RASE_ATTN_WIDE

RASE_TARGET_AVX512 static inline __m256 rase_512_hi(__m512 v) {
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}
#define RASE_ATTN_NAME attend_512_g
#define RASE_ATTN_SCORES attend_512_scores
#define RASE_ATTN_FINISH attend_512_finish
#define RASE_ATTN_REDUCE attend_512_reduce
#define RASE_ATTN_TARGET RASE_TARGET_AVX512
#define RASE_ATTN_WIDE 1
#include "_attend_g.h"
#undef RASE_ATTN_NAME
#undef RASE_ATTN_SCORES
#undef RASE_ATTN_FINISH
#undef RASE_ATTN_REDUCE
#undef RASE_ATTN_TARGET
#undef RASE_ATTN_WIDE

#define RASE_ATTEND_FN(NAME, TARGET, BODY)                                                    \
    TARGET static void NAME(int g, const float *const *q, const rase_kv_view *kv, int j0, int j1, int hd, \
                            float scale, float cap, float *scratch, int64_t qstride, float *const *out) { \
        switch (g) { /* G as a constant: the per-query loops unroll */                         \
            case 1: BODY(1, q, kv, j0, j1, hd, scale, cap, scratch, qstride, out); break;           \
            case 2: BODY(2, q, kv, j0, j1, hd, scale, cap, scratch, qstride, out); break;           \
            case 3: BODY(3, q, kv, j0, j1, hd, scale, cap, scratch, qstride, out); break;           \
            default: BODY(4, q, kv, j0, j1, hd, scale, cap, scratch, qstride, out); break;          \
        }                                                                                     \
    }
RASE_ATTEND_FN(attend_avx2, RASE_TARGET_AVX2, attend_avx2_g)
RASE_ATTEND_FN(attend_512, RASE_TARGET_AVX512, attend_512_g)

// the three phases of one group's attention, split over threads (rase_attend_split)
#define RASE_SPLIT_FN(NAME, TARGET, SCORES, FINISH, REDUCE)                                    \
    TARGET static void NAME(int phase, int g, const float *const *q, const rase_kv_view *kv, int j0, int j1, \
                            int hd, float scale, float cap, int lo, int hi, int parts, float *shared,    \
                            float *scratch, int64_t qstride, float *const *out) {                        \
        float *qf[RASE_ATTN_G], *sh[RASE_ATTN_G];                                               \
        float *part = shared + rase_attend_partoff(j1);                                        \
        for (int h = 0; h < g; ++h) {                                                           \
            qf[h] = scratch + h * qstride + rase_attend_qoff(j1, hd);                           \
            sh[h] = shared + h * qstride;                                                       \
        }                                                                                       \
        if (phase == 0)                                                                         \
            for (int h = 0; h < g; ++h)                                                         \
                for (int i = 0; i < hd; i += 8)                                                 \
                    _mm256_storeu_ps(qf[h] + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(q[h] + i), 0))); \
        const int ja = j0 + (int)((int64_t)(j1 - j0) * lo / parts), jb = j0 + (int)((int64_t)(j1 - j0) * hi / parts); \
        const int k0 = 8 * lo / parts * 4, k1 = 8 * hi / parts * 4;                             \
        const int d0 = hd / 8 * lo / parts * 8, d1 = hd / 8 * hi / parts * 8;                  \
        const float *const *cq = (const float *const *)qf, *const *cs = (const float *const *)sh; \
        switch (g * 4 + phase) { /* G as a constant: the per-query loops unroll */              \
            case 4: SCORES(1, cq, kv, ja, jb, hd, scale, sh); break;                            \
            case 8: SCORES(2, cq, kv, ja, jb, hd, scale, sh); break;                            \
            case 12: SCORES(3, cq, kv, ja, jb, hd, scale, sh); break;                           \
            case 16: SCORES(4, cq, kv, ja, jb, hd, scale, sh); break;                           \
            case 5: FINISH(1, cs, kv, j0, j1, hd, k0, k1, cap, scratch, qstride, part); break;  \
            case 9: FINISH(2, cs, kv, j0, j1, hd, k0, k1, cap, scratch, qstride, part); break;  \
            case 13: FINISH(3, cs, kv, j0, j1, hd, k0, k1, cap, scratch, qstride, part); break; \
            case 17: FINISH(4, cs, kv, j0, j1, hd, k0, k1, cap, scratch, qstride, part); break; \
            case 6: REDUCE(1, part, qstride, hd, d0, d1, out); break;                          \
            case 10: REDUCE(2, part, qstride, hd, d0, d1, out); break;                         \
            case 14: REDUCE(3, part, qstride, hd, d0, d1, out); break;                         \
            default: REDUCE(4, part, qstride, hd, d0, d1, out); break;                         \
        }                                                                                       \
    }
RASE_SPLIT_FN(attend_avx2_split, RASE_TARGET_AVX2, attend_avx2_scores, attend_avx2_finish, attend_avx2_reduce)
RASE_SPLIT_FN(attend_512_split, RASE_TARGET_AVX512, attend_512_scores, attend_512_finish, attend_512_reduce)
#undef RASE_SPLIT_FN
#undef RASE_ROWS
#endif

// g (1..RASE_ATTN_G) query heads q[h] -> out[h] over one KV head; scratch: g * qstride floats,
// qstride >= rase_attend_scratch(n_ctx, hd). Each query's result does not depend on g.
// softcap > 0: scores capped (rase_softcap) before the softmax.
static void rase_attend(int g, const float *const *q, const rase_kv_view *kv, int j0, int j1, int hd,
                        float scale, float softcap, float *scratch, int64_t qstride, float *const *out, int isa) {
#if RASE_HAVE_X86
    if (isa >= RASE_ISA_AVX512 && hd % 32 == 0) { attend_512(g, q, kv, j0, j1, hd, scale, softcap, scratch, qstride, out); return; }
    if (isa >= RASE_ISA_AVX2 && hd % 32 == 0) { attend_avx2(g, q, kv, j0, j1, hd, scale, softcap, scratch, qstride, out); return; }
#endif
    for (int h = 0; h < g; ++h) attend_ref(q[h], kv, j0, j1, hd, scale, softcap, scratch, out[h]);
}

// 1 when rase_attend_split can serve this ISA and head size (the SIMD paths)
static int rase_attend_splits(int hd, int isa) { return RASE_HAVE_X86 && isa >= RASE_ISA_AVX2 && hd % 32 == 0; }

// One group's rase_attend shared by `parts` threads with its bits, this thread taking share
// [lo, hi) of `parts`: phase 0 computes the scores of its share of keys into shared (qstride
// floats a query, laid out as scratch: scores, then 32 partial sums); phase 1 redoes the softmax
// over all keys from shared and computes its share of the 32 P.V slots into shared; phase 2
// reduces its share of head elements into out. A barrier between phases. scratch: the
// thread's own, as rase_attend's.
static void rase_attend_split(int phase, int g, const float *const *q, const rase_kv_view *kv, int j0, int j1,
                              int hd, float scale, float softcap, int lo, int hi, int parts, float *shared,
                              float *scratch, int64_t qstride, float *const *out, int isa) {
#if RASE_HAVE_X86
    if (isa >= RASE_ISA_AVX512) attend_512_split(phase, g, q, kv, j0, j1, hd, scale, softcap, lo, hi, parts, shared, scratch, qstride, out);
    else attend_avx2_split(phase, g, q, kv, j0, j1, hd, scale, softcap, lo, hi, parts, shared, scratch, qstride, out);
#else
    (void)phase, (void)g, (void)q, (void)kv, (void)j0, (void)j1, (void)hd, (void)scale, (void)softcap, (void)lo;
    (void)hi, (void)parts, (void)shared, (void)scratch, (void)qstride, (void)out, (void)isa;
#endif
}

// ---------------------------------------------------------------- an encoder's attention

// An encoder's query against the f32 K/V rows of its own input (llama.cpp's no-cache path keeps
// them f32; f16 rows moved a random encoder's Q8_0 embeddings by ~1%): keys k + j * ks and
// values v + j * ks for j in [0, n). Scores as 8 lane chains of FMAs over the head, reduced
// ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)); exp as rase_avx2_expf; the softmax sum in f64,
// key by key; P.V one FMA chain per element, key by key. s: n floats. Every ISA path computes
// these same operations (tested bit for bit).
static void attend_f32_ref(const float *q, const float *k, const float *v, int64_t ks, int n, int hd, float scale,
                           float *s, float *out) {
    float mx = -INFINITY;
    for (int j = 0; j < n; ++j) {
        float a[8] = {0.0f};
        for (int i = 0; i < hd; ++i) a[i % 8] = fmaf(q[i], k[j * ks + i], a[i % 8]);
        s[j] = ((((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])))) * scale;
        if (s[j] > mx) mx = s[j];
    }
    double sum = 0.0;
    for (int j = 0; j < n; ++j) { s[j] = rase_expf_ref(s[j] - mx); sum += (double)s[j]; }
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < hd; ++i) out[i] = 0.0f;
    for (int j = 0; j < n; ++j) {
        const float p = s[j] * inv;
        for (int i = 0; i < hd; ++i) out[i] = fmaf(p, v[j * ks + i], out[i]);
    }
}

#if RASE_HAVE_X86
RASE_TARGET_AVX2 static void attend_f32_avx2(const float *q, const float *k, const float *v, int64_t ks, int n,
                                             int hd, float scale, float *s, float *out) {
    float mx = -INFINITY;
    for (int j = 0; j < n; ++j) {
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < hd; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + j * ks + i), acc);
        float a[8];
        _mm256_storeu_ps(a, acc);
        s[j] = ((((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])))) * scale;
        if (s[j] > mx) mx = s[j];
    }
    double sum = 0.0;
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        _mm256_storeu_ps(s + j, rase_avx2_expf(_mm256_sub_ps(_mm256_loadu_ps(s + j), _mm256_set1_ps(mx))));
        for (int l = 0; l < 8; ++l) sum += (double)s[j + l];
    }
    for (; j < n; ++j) { s[j] = rase_expf_ref(s[j] - mx); sum += (double)s[j]; }
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < hd; i += 8) {
        __m256 o = _mm256_setzero_ps();
        for (int t = 0; t < n; ++t) o = _mm256_fmadd_ps(_mm256_set1_ps(s[t] * inv), _mm256_loadu_ps(v + t * ks + i), o);
        _mm256_storeu_ps(out + i, o);
    }
}
#endif

static void rase_attend_f32(const float *q, const float *k, const float *v, int64_t ks, int n, int hd, float scale,
                            float *s, float *out, int isa) {
#if RASE_HAVE_X86
    if (isa >= RASE_ISA_AVX2 && hd % 8 == 0) { attend_f32_avx2(q, k, v, ks, n, hd, scale, s, out); return; }
#endif
    (void)isa;
    attend_f32_ref(q, k, v, ks, n, hd, scale, s, out);
}

#endif  // RASE_ATTENTION_H
