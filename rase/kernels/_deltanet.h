// rase/kernels/_deltanet.h: Qwen3.5's gated delta rule, one value head over one token, as llama.cpp's CPU
// ggml_gated_delta_net computes it, with its scalar reference and AVX2 version; and the
// elementwise ops around it (llama.cpp's f32 unary ops: libm's expf, logf).
//
// llama.cpp runs the same fused op for one token and for a whole prompt (every token in turn), so
// the chunked and one-token forms are one arithmetic: rase's chunk is its tokens one after
// another, each reading the state the one before left.
//
// State (S, S) f32 per head, stored as ggml does: row j holds column j of the rule's matrix M.
// Per token: M *= exp(g); delta_j = (v_j - M_j . k) * beta; M_j += k * delta_j (an FMA per
// element); o_j = (M_j . q) * (1 / sqrt(S)). The scale and the FMAs are per element in every path;
// the dots are ggml_vec_dot_f32's: its AVX2 order (4 x 8 lanes over 32-element steps) on x86,
// double sums in the scalar build (vec_dot_f32_f32_ref).
#ifndef RASE_DELTANET_H
#define RASE_DELTANET_H

#include "_dot.h"

typedef void (*rase_delta_fn)(int64_t S, float *st, const float *q, const float *k, const float *v, float g,
                              float beta, float *delta, float *o);

static void delta_step_ref(int64_t S, float *st, const float *q, const float *k, const float *v, float g, float beta,
                           float *delta, float *o) {
    const float eg = expf(g), scale = 1.0f / sqrtf((float)S);
    for (int64_t i = 0; i < S * S; ++i) st[i] *= eg;
    for (int64_t j = 0; j < S; ++j) delta[j] = (v[j] - vec_dot_f32_f32_ref(S, st + j * S, k)) * beta;
    for (int64_t j = 0; j < S; ++j)
        for (int64_t i = 0; i < S; ++i) st[j * S + i] = __builtin_fmaf(k[i], delta[j], st[j * S + i]);
    for (int64_t j = 0; j < S; ++j) o[j] = vec_dot_f32_f32_ref(S, st + j * S, q) * scale;
}

#if RASE_HAVE_X86
// S % 8 == 0 (the model plan checks it)
RASE_TARGET_AVX2 static void delta_step_avx2(int64_t S, float *st, const float *q, const float *k, const float *v,
                                             float g, float beta, float *delta, float *o) {
    const float scale = 1.0f / sqrtf((float)S);
    const __m256 eg = _mm256_set1_ps(expf(g));
    for (int64_t i = 0; i < S * S; i += 8) _mm256_storeu_ps(st + i, _mm256_mul_ps(_mm256_loadu_ps(st + i), eg));
    for (int64_t j = 0; j < S; ++j) delta[j] = (v[j] - vec_dot_f32_f32_avx2(S, st + j * S, k)) * beta;
    for (int64_t j = 0; j < S; ++j) {
        const __m256 dj = _mm256_set1_ps(delta[j]);
        float *row = st + j * S;
        for (int64_t i = 0; i < S; i += 8)
            _mm256_storeu_ps(row + i, _mm256_fmadd_ps(_mm256_loadu_ps(k + i), dj, _mm256_loadu_ps(row + i)));
    }
    for (int64_t j = 0; j < S; ++j) o[j] = vec_dot_f32_f32_avx2(S, st + j * S, q) * scale;
}
static const rase_delta_fn RASE_DELTA[RASE_ISA_COUNT] = RASE_ISA_ROW(delta_step_ref, delta_step_avx2, delta_step_avx2);
#else
static const rase_delta_fn RASE_DELTA[RASE_ISA_COUNT] = {delta_step_ref, delta_step_ref, delta_step_ref};
#endif

// llama.cpp's unary ops on f32 (unary-ops.cpp), element by element with libm
static inline float rase_softplus(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }
static inline float rase_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// x (n) L2-normalized as Qwen3.5's build_gdn_l2_norm: ggml_rms_norm with eps / n, then ggml_scale
// by 1 / sqrt(n): the sum of squares in double, each element scaled twice (two roundings)
static void rase_gdn_l2norm(float *x, int64_t n, float eps) {
    const float fn = (float)n, e = eps / fn, s2 = 1.0f / sqrtf(fn);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += (double)(x[i] * x[i]);
    const float scale = 1.0f / sqrtf((float)(sum / (double)n) + e);
    for (int64_t i = 0; i < n; ++i) x[i] = (x[i] * scale) * s2;
}

#endif  // RASE_DELTANET_H
