// rase/kernels/_ops.h: the forward's elementwise kernels: gates (SiLU, GELU through llama.cpp's f16
// table), RMSNorm and LayerNorm, RoPE (its parameters and cos/sin tables), each with its scalar
// reference and AVX2 version.
#ifndef RASE_OPS_H
#define RASE_OPS_H

#include "_simd.h"

typedef struct {
    float base, freq_scale, ext_factor, attn_factor;
    float corr_dims[2];
    const float *factors;  // (n_rot / 2,) frequency divisors (Llama 3 rope_freqs, LongRoPE), or NULL
} rase_rope_params;

// ---------------------------------------------------------------- elementwise kernels

static inline float rase_silu(float x) { return x / (1.0f + expf(-x)); }

// ggml's GELU(tanh) in f32, as compiled into llama.cpp's x86 builds: GCC contracts the inner
// 1 + a*x*x into an FMA there (its default -ffp-contract=fast; rase builds with it off, so the FMA
// is written out). It changes one entry of the f16 table (h = 0xBFFF, x = -1.999), which Gemma3
// meets on real text. llama.cpp evaluates GELU through that table (rase_gelu_table).
static inline float rase_gelu(float x) {
    return 0.5f * x * (1.0f + tanhf(0.79788456080286535587989211986876f * x * fmaf(0.044715f * x, x, 1.0f)));
}

// table[h] = f16(gelu(f32(h))) for every f16 bit pattern h (ggml_table_gelu_f16)
static uint16_t *rase_gelu_table_new(void) {
    uint16_t *t = (uint16_t *)malloc(65536 * sizeof(uint16_t));
    if (t)
        for (int h = 0; h < 65536; ++h) t[h] = rase_fp32_to_fp16(rase_gelu(rase_fp16_to_fp32((uint16_t)h)));
    return t;
}

static inline float rase_geglu1(float x, const uint16_t *table) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return rase_fp16_to_fp32(table[rase_fp32_to_fp16(x)]);
}

// g = act(g) * u over n elements; GELU through the f16 table, SiLU with ggml's exp
static void gate_ref(float *g, const float *u, int64_t n, const uint16_t *gelu_table) {
    for (int64_t i = 0; i < n; ++i)
        g[i] = (gelu_table ? rase_geglu1(g[i], gelu_table) : rase_silu(g[i])) * u[i];
}

#if RASE_HAVE_X86
RASE_TARGET_AVX2 static inline __m256 rase_avx2_silu_mul(__m256 x, __m256 u) {
    const __m256 e = rase_avx2_expf(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

// rase_geglu1 on 8 lanes: the f16 rounding of x (vcvtps2ph rounds to nearest even, as
// rase_fp32_to_fp16 does) indexes the table; lanes outside (-10, 10) read entry 0 and are
// replaced (0 below, x above; NaN stays NaN), so no read leaves the table.
RASE_TARGET_AVX2 static inline __m256 rase_avx2_geglu_mul(__m256 x, __m256 u, const uint16_t *table) {
    const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
    const __m256 in = _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_GT_OQ), _mm256_cmp_ps(x, hi, _CMP_LT_OQ));
    const __m256i h = _mm256_and_si256(_mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, 0)), _mm256_castps_si256(in));
    const __m256i e = _mm256_i32gather_epi32((const int *)table, h, 2);  // low half: table[h]
    const __m256i e16 = _mm256_permute4x64_epi64(
        _mm256_shuffle_epi8(e, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                                0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1)), 0x08);
    const __m256 t = _mm256_cvtph_ps(_mm256_castsi256_si128(e16));
    const __m256 above = _mm256_cmp_ps(x, hi, _CMP_NLT_UQ);  // x >= 10 or NaN: x
    const __m256 act = _mm256_blendv_ps(_mm256_and_ps(t, in), x, above);
    return _mm256_mul_ps(act, u);
}

// every element through the vector path, the tail too: a thread's range may start anywhere, so
// an element's arithmetic must not depend on where its 8-lane group begins
RASE_TARGET_AVX2 static void gate_avx2(float *g, const float *u, int64_t n, const uint16_t *gelu_table) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i), y = _mm256_loadu_ps(u + i);
        _mm256_storeu_ps(g + i, gelu_table ? rase_avx2_geglu_mul(x, y, gelu_table) : rase_avx2_silu_mul(x, y));
    }
    if (i < n) {
        float xg[8] = {0}, xu[8] = {0};
        memcpy(xg, g + i, (size_t)(n - i) * sizeof(float));
        memcpy(xu, u + i, (size_t)(n - i) * sizeof(float));
        const __m256 x = _mm256_loadu_ps(xg), y = _mm256_loadu_ps(xu);
        _mm256_storeu_ps(xg, gelu_table ? rase_avx2_geglu_mul(x, y, gelu_table) : rase_avx2_silu_mul(x, y));
        memcpy(g + i, xg, (size_t)(n - i) * sizeof(float));
    }
}
#endif

// x = silu(x) over n elements, as llama.cpp's ggml_silu computes a row of a multiple of 8:
// ggml_v_silu on x86 (the same 8-lane arithmetic as gate_avx2 times 1), libm's expf otherwise
static void rase_silu_row(float *x, int64_t n, int isa) {
#if RASE_HAVE_X86
    if (isa >= RASE_ISA_AVX2) {
        float ones[64];
        for (int i = 0; i < 64; ++i) ones[i] = 1.0f;
        for (int64_t i = 0; i < n; i += 64) gate_avx2(x + i, ones, n - i < 64 ? n - i : 64, NULL);
        return;
    }
#endif
    for (int64_t i = 0; i < n; ++i) x[i] = rase_silu(x[i]);
}

static void rase_gate(float *g, const float *u, int64_t n, const uint16_t *gelu_table, int isa) {
#if RASE_HAVE_X86
    if (isa >= RASE_ISA_AVX2) { gate_avx2(g, u, n, gelu_table); return; }
#endif
    gate_ref(g, u, n, gelu_table);
}

// gpt-oss's experts (ggml_compute_forward_swiglu_oai_f32, libm's expf): x = min(g, limit),
// y = clamp(u, -limit, limit), g = x / (1 + expf(alpha * -x)) * (y + 1); std::min/clamp's
// comparisons, so a NaN g stays NaN
static void rase_swiglu_oai(float *g, const float *u, int64_t n, float alpha, float limit) {
    for (int64_t i = 0; i < n; ++i) {
        const float x = limit < g[i] ? limit : g[i];
        const float y = u[i] < -limit ? -limit : limit < u[i] ? limit : u[i];
        g[i] = x / (1.0f + expf(alpha * (-x))) * (y + 1.0f);
    }
}

// y = x / rms(x) * w (ggml: mean of squares accumulated in double)
static void rase_rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += (double)(x[i] * x[i]);
    const float scale = 1.0f / sqrtf((float)(sum / (double)n) + eps);
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
}

// y = (x - mean) / sqrt(var + eps) * w + b, as llama.cpp's AVX2 build computes ggml_norm then
// ggml_mul and ggml_add: the mean summed in double; the squares in float groups of 8 (the lanes'
// tree) added to a double sum, the tail one by one. y may be x.
static void rase_layernorm(const float *x, const float *w, const float *b, float *y, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += (double)x[i];
    const float mean = (float)sum / (float)n;
    double sq = 0.0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float a[8];
        for (int j = 0; j < 8; ++j) { y[i + j] = x[i + j] - mean; a[j] = y[i + j] * y[i + j]; }
        sq += (double)(((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])));
    }
    for (; i < n; ++i) { y[i] = x[i] - mean; sq += (double)(y[i] * y[i]); }
    const float scale = 1.0f / sqrtf((float)(sq / (double)n) + eps);
    for (i = 0; i < n; ++i) y[i] = (y[i] * scale) * w[i] + (b ? b[i] : 0.0f);
}

// rotate one head (n_rot leading dims) with the table row cs = (cos, sin) x n_rot/2
static void rope_ref(float *x, const float *cs, int n_rot, int neox) {
    const int half = n_rot / 2;
    for (int i = 0; i < half; ++i) {
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float c = cs[2 * i], s = cs[2 * i + 1], x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

#if RASE_HAVE_X86
// the same rotation with the FMA contraction ggml's compiled rope has: x0*c - (x1*s) fused
RASE_TARGET_AVX2 static void rope_avx2(float *x, const float *cs, int n_rot, int neox) {
    const int half = n_rot / 2;
    for (int i = 0; i < half; ++i) {
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float c = cs[2 * i], s = cs[2 * i + 1], x0 = x[a], x1 = x[b];
        x[a] = __builtin_fmaf(x0, c, -(x1 * s));
        x[b] = __builtin_fmaf(x0, s, x1 * c);
    }
}
#endif

static void rase_rope(float *x, const float *cs, int n_rot, int neox, int isa) {
#if RASE_HAVE_X86
    if (isa >= RASE_ISA_AVX2) { rope_avx2(x, cs, n_rot, neox); return; }
#endif
    rope_ref(x, cs, n_rot, neox);
}

// llama.cpp's YaRN parameters, in its float steps (llama_context's setup and ggml.c's
// ggml_rope_yarn_corr_dims, both compiled without FMA): yarn = 0 leaves ext_factor 0 and the
// cos/sin multiplier the file's attn_factor (Phi-3's LongRoPE factor, else 1).
static void rase_rope_init(rase_rope_params *r, int n_rot, float base, float freq_scale, int yarn, float attn_factor,
                           int n_ctx_orig, const float *factors) {
    r->base = base;
    r->freq_scale = freq_scale;
    r->factors = factors;
    r->ext_factor = yarn ? 1.0f : 0.0f;
    r->attn_factor = 1.0f;
    r->corr_dims[0] = r->corr_dims[1] = 0.0f;
    if (yarn) {
        const float factor = 1.0f / freq_scale, beta[2] = {32.0f, 1.0f};  // yarn_beta_fast, yarn_beta_slow
        r->attn_factor = factor <= 1.0f ? 1.0f : 0.1f * logf(factor) + 1.0f;
        r->attn_factor *= 1.0f / (1.0f + 0.1f * logf(factor));  // the kernel's own mscale cancelled
        for (int i = 0; i < 2; ++i) {
            const float d = (float)n_rot * logf((float)n_ctx_orig / (beta[i] * 2 * (float)M_PI)) / (2 * logf(base));
            r->corr_dims[i] = i == 0 ? fmaxf(0.0f, floorf(d)) : fminf((float)(n_rot - 1), ceilf(d));
        }
    }
    r->attn_factor *= attn_factor;
}

// cs = (cos, sin) x n_rot/2 at position pos: ggml_rope_cache_init as llama.cpp's x86 builds
// compile it (theta by repeated multiplication in f32; GCC contracts the YaRN mix and the
// mscale term into the two FMAs written out here)
static void rase_rope_table(float *cs, int pos, int n_rot, const rase_rope_params *r) {
    const float theta_scale = powf(r->base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    for (int i = 0; i < n_rot / 2; ++i) {
        const float extrap = r->factors ? theta / r->factors[i] : theta;
        float t = r->freq_scale * extrap, mscale = r->attn_factor;
        if (r->ext_factor != 0.0f) {
            const float y = ((float)i - r->corr_dims[0]) / fmaxf(0.001f, r->corr_dims[1] - r->corr_dims[0]);
            const float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * r->ext_factor;
            t = fmaf(t, 1.0f - mix, extrap * mix);
            mscale *= fmaf(0.1f, logf(1.0f / r->freq_scale), 1.0f);
        }
        cs[2 * i] = cosf(t) * mscale;
        cs[2 * i + 1] = sinf(t) * mscale;
        theta *= theta_scale;
    }
}

#define RASE_MROPE_MAX_ROT 512

// the RoPE table of a row at M-RoPE positions p (t, h, w, e), ggml_mrope_cache_init's: each pair
// takes its angle from the component its sector names (sections in order, or interleaved t h w
// for IMROPE), each component's angle the running product of the single-position table
static void rase_mrope_table(float *cs, const int32_t *p, int n_rot, const rase_rope_params *r, const int *sect,
                             int imrope) {
    float tables[4][RASE_MROPE_MAX_ROT];
    for (int c = 0; c < 4; ++c) rase_rope_table(tables[c], p[c], n_rot, r);
    const int dims = sect[0] + sect[1] + sect[2] + sect[3], sec_w = sect[0] + sect[1];
    for (int i = 0; i < n_rot / 2; ++i) {
        const int s = dims > 0 ? i % dims : 0;
        int c = 0;
        if (imrope)
            c = (s % 3 == 1 && s < 3 * sect[1]) ? 1 : (s % 3 == 2 && s < 3 * sect[2]) ? 2
                : (s % 3 == 0 && s < 3 * sect[0]) ? 0 : 3;
        else
            c = s < sect[0] ? 0 : s < sec_w ? 1 : s < sec_w + sect[2] ? 2 : 3;
        cs[2 * i] = tables[c][2 * i];
        cs[2 * i + 1] = tables[c][2 * i + 1];
    }
}

#endif  // RASE_OPS_H
