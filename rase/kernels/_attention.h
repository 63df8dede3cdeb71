// rase/kernels/_attention.h: one query head against a sequence's cached K/V, read through its block
// table from the paged pool.
//
// Numerics (batch invariance): the result for a query depends only on q, its sequence's K/V
// rows j0..j1-1 and j1 itself. Accumulator slots, the 8-lane groups of the softmax sum and the
// padding to 32 are functions of the absolute position j, never of other queries, other
// sequences or which pool blocks hold the rows.
#ifndef RASE_ATTENTION_H
#define RASE_ATTENTION_H

#include "_kv.h"
#include "_attend_fa.h"  // a quantized pool's attention

#if RASE_HAVE_X86  // the grouped kernel once per width (_attend_g.h)
#  define RASE_ATTN_WIDE 0
#  define RASE_ATTN_TARGET RASE_TARGET_AVX2
#  define RASE_ATTN(name) attend_avx2##name
#  include "_attend_g.h"
#  undef RASE_ATTN_WIDE
#  undef RASE_ATTN_TARGET
#  undef RASE_ATTN
#  define RASE_ATTN_WIDE 1
#  define RASE_ATTN_TARGET RASE_TARGET_AVX512
#  define RASE_ATTN(name) attend_512##name
#  include "_attend_g.h"
#  undef RASE_ATTN_WIDE
#  undef RASE_ATTN_TARGET
#  undef RASE_ATTN
#endif

static void attend_ref(const float *q, const rase_kv_view *kv, int j0, int j1, int hd, float scale,
                       float softcap, float sink, float *scratch, float *out) {
    float *s = scratch, mx = -INFINITY;
    for (int j = j0; j < j1; ++j) {
        const uint16_t *k = kv->k + rase_kv_off(kv, j);
        float d = 0.0f;
        for (int i = 0; i < hd; ++i) d += q[i] * rase_fp16_to_fp32(k[i]);
        s[j] = d * scale;
        if (s[j] > mx) mx = s[j];
    }
    if (softcap > 0.0f) mx = rase_softcap(s, j0, j1, softcap);
    mx = mx > sink ? mx : sink;
    double sum = 0.0;
    for (int j = j0; j < j1; ++j) { s[j] = expf(s[j] - mx); sum += s[j]; }
    sum += rase_sink_term(sink, mx);
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
                            float softcap, float sink, float *scratch, float *out) {
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
    mx = mx > sink ? mx : sink;
    double sum = 0.0;
    for (int j = 0; j < n; j += 8) {
        float e[8];
        for (int l = 0; l < 8; ++l) e[l] = s[j + l] = rase_expf_ref(s[j + l] - mx);
        sum += (double)(((e[0] + e[4]) + (e[2] + e[6])) + ((e[1] + e[5]) + (e[3] + e[7])));
    }
    sum += rase_sink_term(sink, mx);
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

// g (1..RASE_ATTN_G) query heads q[h] -> out[h] over one KV head; scratch: g * qstride floats,
// qstride >= rase_attend_scratch(n_ctx, hd). Each query's result does not depend on g.
// softcap > 0: scores capped (rase_softcap) before the softmax. sinks: (g,) the queries' sink
// logits, or NULL.
static void rase_attend(int g, const float *const *q, const rase_kv_view *kv, int j0, int j1, int hd,
                        float scale, float softcap, const float *sinks, float *scratch, int64_t qstride,
                        float *const *out, int isa) {
    if (kv->type != RASE_TYPE_F16) {
        rase_attend_fa(g, q, kv, kv->type, j0, j1, hd, scale, softcap, sinks, scratch, qstride, out, isa);
        return;
    }
#if RASE_HAVE_X86
    if (isa >= RASE_ISA_AVX512 && hd % 32 == 0) { attend_512(g, q, kv, j0, j1, hd, scale, softcap, sinks, scratch, qstride, out); return; }
    if (isa >= RASE_ISA_AVX2 && hd % 32 == 0) { attend_avx2(g, q, kv, j0, j1, hd, scale, softcap, sinks, scratch, qstride, out); return; }
#endif
    for (int h = 0; h < g; ++h)
        attend_ref(q[h], kv, j0, j1, hd, scale, softcap, sinks ? sinks[h] : -INFINITY, scratch, out[h]);
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
                              int hd, float scale, float softcap, const float *sinks, int lo, int hi, int parts,
                              float *shared, float *scratch, int64_t qstride, float *const *out, int isa) {
#if RASE_HAVE_X86
    if (isa >= RASE_ISA_AVX512) attend_512_split(phase, g, q, kv, j0, j1, hd, scale, softcap, sinks, lo, hi, parts, shared, scratch, qstride, out);
    else attend_avx2_split(phase, g, q, kv, j0, j1, hd, scale, softcap, sinks, lo, hi, parts, shared, scratch, qstride, out);
#else
    (void)phase, (void)g, (void)q, (void)kv, (void)j0, (void)j1, (void)hd, (void)scale, (void)softcap, (void)sinks, (void)lo;
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
