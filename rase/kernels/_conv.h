// rase/kernels/_conv.h: the causal depthwise convolution of the recurrent layers (ggml_ssm_conv over one
// token), with its scalar reference and AVX2 / AVX-512 versions, and LFM2's gated use of it.
//
// Per channel ch: the window is the d previous inputs of the sequence (the state, oldest first;
// zeros before position 0) and this one, x[ch]; y[ch] = the L = d + 1 taps summed in window order
// from 0 as GCC compiles ggml_ssm_conv's `sumf += s * c` for llama.cpp's x86 builds: the first
// 4 * (L / 4) products rounded on their own (its 4-wide vector multiply) and added one by one, the
// rest contracted into FMAs (LFM2's 3 taps: one FMA chain; Qwen3.5's 4: products, then adds;
// checked against GCC 12 -O3 -mavx2 -mfma for L = 2..8). The state becomes the window's last d.
// Every channel is independent and computed
// by the same arithmetic in every path, so the result depends on neither the ISA, the channel
// range nor how a prompt is chunked (a chunk is its tokens one after another, each reading the
// state the one before left).
//
// Layouts (tap-major, so channels are contiguous): w (L, E) taps; a state (d, E). src may equal
// dst (the state updated in place) or be NULL (position 0: a zero state); y may be x.
#ifndef RASE_CONV_H
#define RASE_CONV_H

#include "_simd.h"

#define RASE_CONV_MAX 8  // taps a layer may have (LFM2: 3, Qwen3.5: 4)
#define RASE_CONV_VEC(d) (((d) + 1) / 4 * 4)  // taps whose products are rounded before the add

typedef void (*rase_conv_fn)(int d, const float *x, int64_t E, const float *w, const float *src, float *dst,
                             float *y, int64_t c0, int64_t c1);

static void conv_ref(int d, const float *x, int64_t E, const float *w, const float *src, float *dst, float *y,
                     int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ++ch) {
        float win[RASE_CONV_MAX];
        for (int k = 0; k < d; ++k) win[k] = src ? src[k * E + ch] : 0.0f;
        win[d] = x[ch];
        float sum = 0.0f;
        int k = 0;
        for (; k < RASE_CONV_VEC(d); ++k) sum = sum + win[k] * w[k * E + ch];
        for (; k <= d; ++k) sum = __builtin_fmaf(win[k], w[k * E + ch], sum);
        for (k = 0; k < d; ++k) dst[k * E + ch] = win[k + 1];
        y[ch] = sum;
    }
}

#if RASE_HAVE_X86
RASE_TARGET_AVX2 static void conv_avx2(int d, const float *x, int64_t E, const float *w, const float *src, float *dst,
                                       float *y, int64_t c0, int64_t c1) {
    int64_t ch = c0;
    for (; ch + 8 <= c1; ch += 8) {
        __m256 win[RASE_CONV_MAX];
        for (int k = 0; k < d; ++k) win[k] = src ? _mm256_loadu_ps(src + k * E + ch) : _mm256_setzero_ps();
        win[d] = _mm256_loadu_ps(x + ch);
        __m256 sum = _mm256_setzero_ps();
        int k = 0;
        for (; k < RASE_CONV_VEC(d); ++k) sum = _mm256_add_ps(sum, _mm256_mul_ps(win[k], _mm256_loadu_ps(w + k * E + ch)));
        for (; k <= d; ++k) sum = _mm256_fmadd_ps(win[k], _mm256_loadu_ps(w + k * E + ch), sum);
        for (k = 0; k < d; ++k) _mm256_storeu_ps(dst + k * E + ch, win[k + 1]);
        _mm256_storeu_ps(y + ch, sum);
    }
    conv_ref(d, x, E, w, src, dst, y, ch, c1);  // the tail: the same FMAs, one lane at a time
}

RASE_TARGET_AVX512 static void conv_avx512(int d, const float *x, int64_t E, const float *w, const float *src,
                                           float *dst, float *y, int64_t c0, int64_t c1) {
    int64_t ch = c0;
    for (; ch + 16 <= c1; ch += 16) {
        __m512 win[RASE_CONV_MAX];
        for (int k = 0; k < d; ++k) win[k] = src ? _mm512_loadu_ps(src + k * E + ch) : _mm512_setzero_ps();
        win[d] = _mm512_loadu_ps(x + ch);
        __m512 sum = _mm512_setzero_ps();
        int k = 0;
        for (; k < RASE_CONV_VEC(d); ++k) sum = _mm512_add_ps(sum, _mm512_mul_ps(win[k], _mm512_loadu_ps(w + k * E + ch)));
        for (; k <= d; ++k) sum = _mm512_fmadd_ps(win[k], _mm512_loadu_ps(w + k * E + ch), sum);
        for (k = 0; k < d; ++k) _mm512_storeu_ps(dst + k * E + ch, win[k + 1]);
        _mm512_storeu_ps(y + ch, sum);
    }
    conv_avx2(d, x, E, w, src, dst, y, ch, c1);
}
static const rase_conv_fn RASE_CONV[RASE_ISA_COUNT] = RASE_ISA_ROW(conv_ref, conv_avx2, conv_avx512);
#else
static const rase_conv_fn RASE_CONV[RASE_ISA_COUNT] = {conv_ref, conv_ref, conv_ref};
#endif

// LFM2's gated short convolution of one row, channels [c0, c1): bcx (3E) = the in-projection's
// b, c, x; y (E) = c * conv(b * x) (ggml_mul, ggml_ssm_conv, ggml_mul: each rounded to f32)
static void rase_shortconv_row(int isa, int d, const float *bcx, int64_t E, const float *w, const float *src,
                               float *dst, float *y, int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ++ch) y[ch] = bcx[ch] * bcx[2 * E + ch];
    RASE_CONV[isa](d, y, E, w, src, dst, y, c0, c1);
    for (int64_t ch = c0; ch < c1; ++ch) y[ch] = bcx[E + ch] * y[ch];
}

#endif  // RASE_CONV_H
