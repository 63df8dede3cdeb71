// rase/kernels/_quantize.h: f32 rows -> weight blocks, as llama.cpp's quantizer writes them without an
// importance matrix (ggml-quants.c quantize_row_<type>_ref; ggml.c's fp32 -> f16 / bf16 rows),
// so a file rase converts holds the bytes llama-quantize would write from the same values.
// Arithmetic is kept in ggml's order, unfused (the build sets -ffp-contract=off, as ggml-base is
// built without FMA), so the bytes do not depend on the ISA.
#ifndef RASE_QUANTIZE_H
#define RASE_QUANTIZE_H

#include <float.h>
#ifdef _OPENMP
#  include <omp.h>
#endif
#include <string.h>
#include "_types.h"

// ggml's nearest_int: round half to even via the 1.5 * 2^23 trick (|fval| <= 4194303)
static inline int rase_nearest_int(float fval) {
    float val = fval + 12582912.f;
    int i;
    memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

static inline uint16_t rase_fp32_to_bf16(float s) {  // ggml_compute_fp32_to_bf16: RNE, NaN quieted
    const uint32_t u = rase_fp32_to_bits(s);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

static void quant_row_f32_ref(const float *x, void *y, int64_t k) { memcpy(y, x, (size_t)k * 4); }

static void quant_row_f16_ref(const float *x, void *y, int64_t k) {
    uint16_t *h = (uint16_t *)y;
    for (int64_t i = 0; i < k; ++i) h[i] = rase_fp32_to_fp16(x[i]);
}

static void quant_row_bf16_ref(const float *x, void *y, int64_t k) {
    uint16_t *h = (uint16_t *)y;
    for (int64_t i = 0; i < k; ++i) h[i] = rase_fp32_to_bf16(x[i]);
}

static inline float rase_signed_amax(const float *x) {  // the first of the 32 values of largest magnitude
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j)
        if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
    return max;
}

// the 32 values' min; d = (max - min) / levels and min stored as f16; 1 / d (0 where d is 0)
static inline float rase_min_scale(const float *x, int levels, uint16_t *d16, uint16_t *m16, float *min_out) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < 32; ++j) { if (x[j] < min) min = x[j]; if (x[j] > max) max = x[j]; }
    const float d = (max - min) / levels;
    *d16 = rase_fp32_to_fp16(d);
    *m16 = rase_fp32_to_fp16(min);
    *min_out = min;
    return d ? 1.0f / d : 0.0f;
}

// d = (value of largest magnitude) / -8; q = min(15, trunc(x / d + 8.5)), j < 16 in low nibbles
static void quant_row_q4_0_ref(const float *x, void *vy, int64_t k) {
    block_q4_0 *y = (block_q4_0 *)vy;
    for (int64_t i = 0; i < k / 32; ++i, x += 32) {
        const float d = rase_signed_amax(x) / -8, id = d ? 1.0f / d : 0.0f;
        y[i].d = rase_fp32_to_fp16(d);
        for (int j = 0; j < 16; ++j) {
            const int8_t a = (int8_t)(x[j] * id + 8.5f), b = (int8_t)(x[16 + j] * id + 8.5f);
            y[i].qs[j] = (uint8_t)((a < 15 ? a : 15) | (uint8_t)((b < 15 ? b : 15) << 4));
        }
    }
}

static void quant_row_q4_1_ref(const float *x, void *vy, int64_t k) {  // d = range / 15, m = min
    block_q4_1 *y = (block_q4_1 *)vy;
    for (int64_t i = 0; i < k / 32; ++i, x += 32) {
        float min;
        const float id = rase_min_scale(x, 15, &y[i].d, &y[i].m, &min);
        for (int j = 0; j < 16; ++j) {
            const int8_t a = (int8_t)((x[j] - min) * id + 0.5f), b = (int8_t)((x[16 + j] - min) * id + 0.5f);
            y[i].qs[j] = (uint8_t)((a < 15 ? a : 15) | (uint8_t)((b < 15 ? b : 15) << 4));
        }
    }
}

static void quant_row_q5_0_ref(const float *x, void *vy, int64_t k) {  // d = max / -16, 5th bits in qh
    block_q5_0 *y = (block_q5_0 *)vy;
    for (int64_t i = 0; i < k / 32; ++i, x += 32) {
        const float d = rase_signed_amax(x) / -16, id = d ? 1.0f / d : 0.0f;
        y[i].d = rase_fp32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            const int8_t a8 = (int8_t)(x[j] * id + 16.5f), b8 = (int8_t)(x[16 + j] * id + 16.5f);
            const uint8_t a = (uint8_t)(a8 < 31 ? a8 : 31), b = (uint8_t)(b8 < 31 ? b8 : 31);
            y[i].qs[j] = (uint8_t)((a & 0x0F) | ((b & 0x0F) << 4));
            qh |= ((a & 0x10u) >> 4) << j;
            qh |= ((b & 0x10u) >> 4) << (j + 16);
        }
        memcpy(y[i].qh, &qh, 4);
    }
}

static void quant_row_q5_1_ref(const float *x, void *vy, int64_t k) {  // d = range / 31, m = min
    block_q5_1 *y = (block_q5_1 *)vy;
    for (int64_t i = 0; i < k / 32; ++i, x += 32) {
        float min;
        const float id = rase_min_scale(x, 31, &y[i].d, &y[i].m, &min);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            const uint8_t a = (uint8_t)((x[j] - min) * id + 0.5f), b = (uint8_t)((x[16 + j] - min) * id + 0.5f);
            y[i].qs[j] = (uint8_t)((a & 0x0F) | ((b & 0x0F) << 4));
            qh |= ((a & 0x10u) >> 4) << j;
            qh |= ((b & 0x10u) >> 4) << (j + 16);
        }
        memcpy(y[i].qh, &qh, 4);
    }
}

static void quant_row_q8_0_ref(const float *x, void *vy, int64_t k) {  // d = amax / 127, q = round(x / d)
    block_q8_0 *y = (block_q8_0 *)vy;
    for (int64_t i = 0; i < k / 32; ++i, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
        const float d = amax / 127, id = d ? 1.0f / d : 0.0f;
        y[i].d = rase_fp32_to_fp16(d);
        for (int j = 0; j < 32; ++j) {  // |q| <= 127 but where 1 / d overflowed (q = inf or NaN):
            const float q = roundf(x[j] * id);  // there x86's conversion gives 0, spelled out here
            y[i].qs[j] = (int8_t)(fabsf(q) <= 127.5f ? (int)q : 0);
        }
    }
}

// ggml's make_qkx2_quants: n values -> levels 0..nmax and a (scale, -min) pair minimizing the
// weighted error over nstep + 1 trial scales
static float rase_make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                                   float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep) {
    float min = x[0], max = x[0], sum_w = weights[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min), scale = 1 / iscale, best_error = 0;
    for (int i = 0; i < n; ++i) {
        const int l = rase_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        const float diff = scale * L[i] + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = rase_nearest_int(iscale * (x[i] - min));
            l = l < 0 ? 0 : l > nmax ? nmax : l;
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                const float diff = this_scale * Laux[i] + this_min - x[i];
                cur_error += weights[i] * (diff * diff);
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; ++i) L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

static inline void rase_k4_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {  // get_scale_min_k4
    if (j < 4) { *d = q[j] & 63; *m = q[j + 4] & 63; }
    else { *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4); }
}

// the 8 sub-blocks' (scale, min) searches of a Q4_K / Q5_K super-block x (256), levels in L
typedef void (*rase_kx_search_fn)(const float *x, int nmax, float rmin, int nstep, uint8_t *L, float *scales,
                                  float *mins);

static void rase_kx_search_ref(const float *x, int nmax, float rmin, int nstep, uint8_t *L, float *scales,
                               float *mins) {
    uint8_t Laux[32];
    float weights[32];
    for (int j = 0; j < 8; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = rase_make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep);
    }
}

// the Q4_K / Q5_K super-block: 8 sub-blocks of 32, 6-bit scales and mins, levels 0..nmax in L
static void rase_quant_kx_block(const float *x, uint16_t *dd, uint16_t *dmin, uint8_t *sc12, uint8_t *L, int nmax,
                                float rmin, int nstep, rase_kx_search_fn search) {
    float mins[8], scales[8], max_scale = 0, max_min = 0;
    search(x, nmax, rmin, nstep, L, scales, mins);
    for (int j = 0; j < 8; ++j) {
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f, inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    memset(sc12, 0, 12);
    for (int j = 0; j < 8; ++j) {
        uint8_t ls = (uint8_t)rase_nearest_int(inv_scale * scales[j]), lm = (uint8_t)rase_nearest_int(inv_min * mins[j]);
        ls = ls < 63 ? ls : 63;
        lm = lm < 63 ? lm : 63;
        if (j < 4) {
            sc12[j] = ls;
            sc12[j + 4] = lm;
        } else {
            sc12[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            sc12[j - 4] |= (uint8_t)((ls >> 4) << 6);
            sc12[j - 0] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *dd = rase_fp32_to_fp16(max_scale / 63.f);
    *dmin = rase_fp32_to_fp16(max_min / 63.f);
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        rase_k4_scale_min(j, sc12, &sc, &m);
        const float d = rase_fp16_to_fp32(*dd) * sc;
        if (!d) continue;
        const float dm = rase_fp16_to_fp32(*dmin) * m;
        for (int ii = 0; ii < 32; ++ii) {
            const int l = rase_nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        }
    }
}

static void rase_quant_row_q4_k(const float *x, void *vy, int64_t k, rase_kx_search_fn search) {
    block_q4_K *y = (block_q4_K *)vy;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < k / QK_K; ++i, x += QK_K) {
        rase_quant_kx_block(x, &y[i].d, &y[i].dmin, y[i].scales, L, 15, -1.f, 20, search);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

static void rase_quant_row_q5_k(const float *x, void *vy, int64_t k, rase_kx_search_fn search) {
    block_q5_K *y = (block_q5_K *)vy;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < k / QK_K; ++i, x += QK_K) {
        rase_quant_kx_block(x, &y[i].d, &y[i].dmin, y[i].scales, L, 31, -0.5f, 15, search);
        uint8_t *qh = y[i].qh, *ql = y[i].qs, m1 = 1, m2 = 2;
        memset(qh, 0, QK_K / 8);
        for (int n = 0; n < QK_K; n += 64, ql += 32) {
            for (int j = 0; j < 32; ++j) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) { l1 -= 16; qh[j] |= m1; }
                if (l2 > 15) { l2 -= 16; qh[j] |= m2; }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
            m1 <<= 2;
            m2 <<= 2;
        }
    }
}

#define RASE_GROUP_MAX_EPS 1e-15f

// ggml's make_qx_quants with rmse_type 1 and no weights: levels in L (0..2*nmax-1), the scale
static float rase_make_qx_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); max = x[i]; }
    if (amax < RASE_GROUP_MAX_EPS) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = rase_nearest_int(iscale * x[i]);
        l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = rase_nearest_int(iscale * x[i]);
            l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) {
                const int l = rase_nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + (l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

// the 16 sub-blocks' scale searches of a Q6_K super-block x (256), levels in L
typedef void (*rase_q6_search_fn)(const float *x, int8_t *L, float *scales);

static void rase_q6_search_ref(const float *x, int8_t *L, float *scales) {
    for (int ib = 0; ib < QK_K / 16; ++ib) scales[ib] = rase_make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
}

static void rase_quant_row_q6_k(const float *x, void *vy, int64_t k, rase_q6_search_fn search) {
    block_q6_K *y = (block_q6_K *)vy;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < k / QK_K; ++i, x += QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        search(x, L, scales);
        for (int ib = 0; ib < QK_K / 16; ++ib)
            if (fabsf(scales[ib]) > max_abs_scale) { max_abs_scale = fabsf(scales[ib]); max_scale = scales[ib]; }
        if (max_abs_scale < RASE_GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof(block_q6_K));
            y[i].d = rase_fp32_to_fp16(0.f);
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[i].d = rase_fp32_to_fp16(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ++ib) {
            const int s = rase_nearest_int(iscale * scales[ib]);
            y[i].scales[ib] = (int8_t)(s < 127 ? s : 127);
        }
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = rase_fp16_to_fp32(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ++ii) {
                int l = rase_nearest_int(x[16 * j + ii] / d);
                l = l < -32 ? -32 : l > 31 ? 31 : l;
                L[16 * j + ii] = (int8_t)(l + 32);
            }
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; ++l) {
                const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
                const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
                ql[l] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                  ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}

static void quant_row_q4_k_ref(const float *x, void *y, int64_t k) { rase_quant_row_q4_k(x, y, k, rase_kx_search_ref); }
static void quant_row_q5_k_ref(const float *x, void *y, int64_t k) { rase_quant_row_q5_k(x, y, k, rase_kx_search_ref); }
static void quant_row_q6_k_ref(const float *x, void *y, int64_t k) { rase_quant_row_q6_k(x, y, k, rase_q6_search_ref); }

#if RASE_HAVE_X86 || RASE_HAVE_NEON
// The searches 8 sub-blocks at a time, one per f32 lane: every lane runs the reference's
// operations in its order (the sums over a sub-block's elements stay sequential, element by
// element), its branches as blends, so each lane's bits are the reference's. xt: element-major,
// xt[8 i + j] = element i of sub-block j.

RASE_TARGET_AVX2 static inline __m256i rase_avx2_nearest_int(__m256 f) {  // nearest_int per lane
    const __m256i i = _mm256_castps_si256(_mm256_add_ps(f, _mm256_set1_ps(12582912.f)));
    return _mm256_sub_epi32(_mm256_and_si256(i, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x00400000));
}

RASE_TARGET_AVX2 static inline __m256i rase_avx2_clamp_epi32(__m256i v, int lo, int hi) {
    return _mm256_min_epi32(_mm256_max_epi32(v, _mm256_set1_epi32(lo)), _mm256_set1_epi32(hi));
}

RASE_TARGET_AVX2 static inline __m256 rase_avx2_select(__m256 a, __m256 b, __m256 take_b) {
    return _mm256_blendv_ps(a, b, take_b);
}

// make_qkx2_quants on 32 elements x 8 lanes; Lt[i] the levels of element i, lane j
RASE_TARGET_AVX2 static void rase_qkx2_x8(const float *xt, const float *wt, int nmax, float rmin, float rdelta,
                                          int nstep, __m256i *Lt, __m256 *scale_out, __m256 *the_min) {
    const __m256 zero = _mm256_setzero_ps(), fmax_l = _mm256_set1_ps((float)nmax);
    __m256 min = _mm256_loadu_ps(xt), max = min, sum_w = _mm256_loadu_ps(wt), sum_x = _mm256_mul_ps(sum_w, min);
    for (int i = 1; i < 32; ++i) {
        const __m256 x = _mm256_loadu_ps(xt + 8 * i), w = _mm256_loadu_ps(wt + 8 * i);
        min = _mm256_min_ps(x, min);  // x < min ? x : min
        max = _mm256_max_ps(x, max);  // x > max ? x : max
        sum_w = _mm256_add_ps(sum_w, w);
        sum_x = _mm256_add_ps(sum_x, _mm256_mul_ps(w, x));
    }
    min = rase_avx2_select(min, zero, _mm256_cmp_ps(min, zero, _CMP_GT_OQ));
    const __m256 flat = _mm256_cmp_ps(max, min, _CMP_EQ_OQ), min0 = min;
    __m256 iscale = _mm256_div_ps(fmax_l, _mm256_sub_ps(max, min)), scale = _mm256_div_ps(_mm256_set1_ps(1.f), iscale);
    __m256 best_error = zero;
    for (int i = 0; i < 32; ++i) {
        const __m256 x = _mm256_loadu_ps(xt + 8 * i), w = _mm256_loadu_ps(wt + 8 * i);
        Lt[i] = rase_avx2_clamp_epi32(rase_avx2_nearest_int(_mm256_mul_ps(iscale, _mm256_sub_ps(x, min))), 0, nmax);
        const __m256 diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(Lt[i])), min), x);
        best_error = _mm256_add_ps(best_error, _mm256_mul_ps(w, _mm256_mul_ps(diff, diff)));
    }
    __m256i Laux[32];
    for (int is = 0; is <= nstep; ++is) {
        iscale = _mm256_div_ps(_mm256_set1_ps(rmin + rdelta * is + nmax), _mm256_sub_ps(max, min));
        __m256 sum_l = zero, sum_l2 = zero, sum_xl = zero;
        for (int i = 0; i < 32; ++i) {
            const __m256 x = _mm256_loadu_ps(xt + 8 * i), w = _mm256_loadu_ps(wt + 8 * i);
            Laux[i] = rase_avx2_clamp_epi32(rase_avx2_nearest_int(_mm256_mul_ps(iscale, _mm256_sub_ps(x, min))), 0, nmax);
            const __m256 l = _mm256_cvtepi32_ps(Laux[i]), wl = _mm256_mul_ps(w, l);
            sum_l = _mm256_add_ps(sum_l, wl);
            sum_l2 = _mm256_add_ps(sum_l2, _mm256_mul_ps(wl, l));
            sum_xl = _mm256_add_ps(sum_xl, _mm256_mul_ps(wl, x));
        }
        const __m256 D = _mm256_sub_ps(_mm256_mul_ps(sum_w, sum_l2), _mm256_mul_ps(sum_l, sum_l));
        __m256 this_scale = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sum_w, sum_xl), _mm256_mul_ps(sum_x, sum_l)), D);
        __m256 this_min = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sum_l2, sum_x), _mm256_mul_ps(sum_l, sum_xl)), D);
        const __m256 positive = _mm256_cmp_ps(this_min, zero, _CMP_GT_OQ);
        this_min = rase_avx2_select(this_min, zero, positive);
        this_scale = rase_avx2_select(this_scale, _mm256_div_ps(sum_xl, sum_l2), positive);
        __m256 cur_error = zero;
        for (int i = 0; i < 32; ++i) {
            const __m256 x = _mm256_loadu_ps(xt + 8 * i), w = _mm256_loadu_ps(wt + 8 * i);
            const __m256 diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(this_scale, _mm256_cvtepi32_ps(Laux[i])),
                                                            this_min), x);
            cur_error = _mm256_add_ps(cur_error, _mm256_mul_ps(w, _mm256_mul_ps(diff, diff)));
        }
        const __m256 better = _mm256_and_ps(_mm256_cmp_ps(D, zero, _CMP_GT_OQ),
                                            _mm256_cmp_ps(cur_error, best_error, _CMP_LT_OQ));
        for (int i = 0; i < 32; ++i)
            Lt[i] = _mm256_castps_si256(rase_avx2_select(_mm256_castsi256_ps(Lt[i]), _mm256_castsi256_ps(Laux[i]), better));
        best_error = rase_avx2_select(best_error, cur_error, better);
        scale = rase_avx2_select(scale, this_scale, better);
        min = rase_avx2_select(min, this_min, better);
    }
    for (int i = 0; i < 32; ++i)  // max == min: levels 0, scale 0, -min as it was
        Lt[i] = _mm256_andnot_si256(_mm256_castps_si256(flat), Lt[i]);
    *scale_out = rase_avx2_select(scale, zero, flat);
    *the_min = _mm256_sub_ps(zero, rase_avx2_select(min, min0, flat));
}

RASE_TARGET_AVX2 static void rase_kx_search_avx2(const float *x, int nmax, float rmin, int nstep, uint8_t *L,
                                                 float *scales, float *mins) {
    float xt[256], wt[256];
    for (int j = 0; j < 8; ++j)
        for (int i = 0; i < 32; ++i) xt[8 * i + j] = x[32 * j + i];
    __m256 sum_x2 = _mm256_setzero_ps();
    for (int i = 0; i < 32; ++i) {
        const __m256 v = _mm256_loadu_ps(xt + 8 * i);
        sum_x2 = _mm256_add_ps(sum_x2, _mm256_mul_ps(v, v));
    }
    const __m256 av_x = _mm256_sqrt_ps(_mm256_div_ps(sum_x2, _mm256_set1_ps(32.f)));
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < 32; ++i)
        _mm256_storeu_ps(wt + 8 * i, _mm256_add_ps(av_x, _mm256_andnot_ps(sign, _mm256_loadu_ps(xt + 8 * i))));
    __m256i Lt[32];
    __m256 scale, the_min;
    rase_qkx2_x8(xt, wt, nmax, rmin, 0.1f, nstep, Lt, &scale, &the_min);
    _mm256_storeu_ps(scales, scale);
    _mm256_storeu_ps(mins, the_min);
    int32_t lv[32][8];
    for (int i = 0; i < 32; ++i) _mm256_storeu_si256((__m256i *)lv[i], Lt[i]);
    for (int j = 0; j < 8; ++j)
        for (int i = 0; i < 32; ++i) L[32 * j + i] = (uint8_t)lv[i][j];
}

// one trial scale of make_qx_quants, 16 elements x 8 lanes: levels + nmax in Lt, and the
// x^2-weighted sums of x l and l^2 element by element
RASE_TARGET_AVX2 static inline void rase_qx_levels_x8(const float *xt, __m256 iscale, int nmax, __m256i *Lt,
                                                      __m256 *sumlx, __m256 *suml2) {
    __m256 lx = _mm256_setzero_ps(), l2 = _mm256_setzero_ps();
    for (int i = 0; i < 16; ++i) {
        const __m256 x = _mm256_loadu_ps(xt + 8 * i);
        const __m256i l = rase_avx2_clamp_epi32(rase_avx2_nearest_int(_mm256_mul_ps(iscale, x)), -nmax, nmax - 1);
        Lt[i] = _mm256_add_epi32(l, _mm256_set1_epi32(nmax));
        const __m256 lf = _mm256_cvtepi32_ps(l), w = _mm256_mul_ps(x, x);
        lx = _mm256_add_ps(lx, _mm256_mul_ps(_mm256_mul_ps(w, x), lf));
        l2 = _mm256_add_ps(l2, _mm256_mul_ps(_mm256_mul_ps(w, lf), lf));
    }
    *sumlx = lx;
    *suml2 = l2;
}

// make_qx_quants (rmse_type 1, no weights) on 16 elements x 8 lanes; levels L + nmax in Lt
RASE_TARGET_AVX2 static __m256 rase_qx_x8(const float *xt, int nmax, __m256i *Lt) {
    const __m256 zero = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
    __m256 max = zero, amax = zero;
    for (int i = 0; i < 16; ++i) {
        const __m256 x = _mm256_loadu_ps(xt + 8 * i), ax = _mm256_andnot_ps(sign, x);
        const __m256 more = _mm256_cmp_ps(ax, amax, _CMP_GT_OQ);
        amax = rase_avx2_select(amax, ax, more);
        max = rase_avx2_select(max, x, more);
    }
    const __m256 tiny = _mm256_cmp_ps(amax, _mm256_set1_ps(RASE_GROUP_MAX_EPS), _CMP_LT_OQ);
    if (_mm256_movemask_ps(tiny) == 0xFF) {  // all 8 sub-blocks are zeros: levels 0, scale 0
        for (int i = 0; i < 16; ++i) Lt[i] = _mm256_setzero_si256();
        return zero;
    }
    __m256 sumlx, suml2;
    rase_qx_levels_x8(xt, _mm256_div_ps(_mm256_set1_ps((float)-nmax), max), nmax, Lt, &sumlx, &suml2);
    __m256 scale = rase_avx2_select(_mm256_div_ps(sumlx, suml2), zero, _mm256_cmp_ps(suml2, zero, _CMP_EQ_OQ));
    __m256 best = _mm256_mul_ps(scale, sumlx);
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        __m256i Laux[16];
        rase_qx_levels_x8(xt, _mm256_div_ps(_mm256_set1_ps(-(nmax + 0.1f * is)), max), nmax, Laux, &sumlx, &suml2);
        const __m256 better = _mm256_and_ps(_mm256_cmp_ps(suml2, zero, _CMP_GT_OQ),
                                            _mm256_cmp_ps(_mm256_mul_ps(sumlx, sumlx), _mm256_mul_ps(best, suml2),
                                                          _CMP_GT_OQ));
        for (int i = 0; i < 16; ++i)
            Lt[i] = _mm256_castps_si256(rase_avx2_select(_mm256_castsi256_ps(Lt[i]), _mm256_castsi256_ps(Laux[i]), better));
        scale = rase_avx2_select(scale, _mm256_div_ps(sumlx, suml2), better);
        best = rase_avx2_select(best, _mm256_mul_ps(scale, sumlx), better);
    }
    for (int i = 0; i < 16; ++i) Lt[i] = _mm256_andnot_si256(_mm256_castps_si256(tiny), Lt[i]);
    return rase_avx2_select(scale, zero, tiny);
}

RASE_TARGET_AVX2 static void rase_q6_search_avx2(const float *x, int8_t *L, float *scales) {
    for (int half = 0; half < 2; ++half) {  // sub-blocks 8 half .. 8 half + 7
        const float *xs = x + 128 * half;
        float xt[128];
        for (int j = 0; j < 8; ++j)
            for (int i = 0; i < 16; ++i) xt[8 * i + j] = xs[16 * j + i];
        __m256i Lt[16];
        _mm256_storeu_ps(scales + 8 * half, rase_qx_x8(xt, 32, Lt));
        int32_t lv[16][8];
        for (int i = 0; i < 16; ++i) _mm256_storeu_si256((__m256i *)lv[i], Lt[i]);
        for (int j = 0; j < 8; ++j)
            for (int i = 0; i < 16; ++i) L[128 * half + 16 * j + i] = (int8_t)lv[i][j];
    }
}

// quantize_row_q8_0_ref with roundf (half away from zero) as trunc + a step where |frac| >= 0.5:
// the same integers; amax by max_ps (order-free); d and 1 / d in scalar as the reference
RASE_TARGET_AVX2 static void quant_row_q8_0_avx2(const float *x, void *vy, int64_t k) {
    block_q8_0 *y = (block_q8_0 *)vy;
    const __m256 sign = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    for (int64_t i = 0; i < k / 32; ++i, x += 32) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int j = 0; j < 4; ++j) {
            v[j] = _mm256_loadu_ps(x + 8 * j);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[j]));
        }
        float lanes[8], amax = 0.0f;
        _mm256_storeu_ps(lanes, m);
        for (int j = 0; j < 8; ++j) amax = amax > lanes[j] ? amax : lanes[j];
        const float d = amax / 127, id = d ? 1.0f / d : 0.0f;
        y[i].d = rase_fp32_to_fp16(d);
        __m256i q[4];
        for (int j = 0; j < 4; ++j) {
            const __m256 p = _mm256_mul_ps(v[j], _mm256_set1_ps(id));
            const __m256 t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            const __m256 up = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(p, t)), half, _CMP_GE_OQ);
            const __m256 step = _mm256_and_ps(up, _mm256_or_ps(_mm256_and_ps(p, sign), one));
            // the low byte of the int32: 0 for inf / NaN (cvtps gives 0x80000000), as the reference;
            // a saturating pack would give -128
            q[j] = _mm256_and_si256(_mm256_cvtps_epi32(_mm256_add_ps(t, step)), _mm256_set1_epi32(0xFF));
        }
        const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(q[0], q[1]), _mm256_packus_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)y[i].qs, _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
}

RASE_TARGET_AVX2 static void quant_row_f16_avx2(const float *x, void *y, int64_t k) {
    rase_fp32_to_fp16_row_f16c(x, (uint16_t *)y, k);  // F16C rounds to nearest even, as the reference
}

static void quant_row_q4_k_avx2(const float *x, void *y, int64_t k) { rase_quant_row_q4_k(x, y, k, rase_kx_search_avx2); }
static void quant_row_q5_k_avx2(const float *x, void *y, int64_t k) { rase_quant_row_q5_k(x, y, k, rase_kx_search_avx2); }
static void quant_row_q6_k_avx2(const float *x, void *y, int64_t k) { rase_quant_row_q6_k(x, y, k, rase_q6_search_avx2); }
#endif


// a source row (F32, F16 or BF16 values, n of them) -> f32; exact
static void rase_source_row_f32(const void *src, int src_type, float *dst, int64_t n) {
    if (src_type == RASE_TYPE_F32) { memcpy(dst, src, (size_t)n * 4); return; }
    const uint16_t *h = (const uint16_t *)src;
    if (src_type == RASE_TYPE_F16) for (int64_t i = 0; i < n; ++i) dst[i] = rase_fp16_to_fp32(h[i]);
    else for (int64_t i = 0; i < n; ++i) dst[i] = rase_fp32_from_bits((uint32_t)h[i] << 16);
}

// rows [0, nrows) of ncols source values (src_row bytes each) -> rows of row_bytes by q (a
// traits row's quantizer), split by rows over nthreads; every row is quantized alone, so the
// bytes do not depend on it. scratch: nthreads * ncols floats.
static void rase_quantize_rows(rase_quantize_fn q, const uint8_t *src, int src_type, size_t src_row, int64_t nrows,
                               int64_t ncols, uint8_t *dst, size_t row_bytes, float *scratch, int nthreads) {
    #pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t r = 0; r < nrows; ++r) {
#ifdef _OPENMP
        float *row = scratch + (size_t)omp_get_thread_num() * (size_t)ncols;
#else
        float *row = scratch;
#endif
        rase_source_row_f32(src + (size_t)r * src_row, src_type, row, ncols);
        q(row, dst + (size_t)r * row_bytes, ncols);
    }
}

#endif  // RASE_QUANTIZE_H
