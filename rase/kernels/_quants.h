// rase/kernels/_quants.h: row dequantizers of every type (scalar reference + AVX2), the `dequant`
// entries of its traits row (_traits.h). Block layouts: _types.h.
#ifndef RASE_QUANTS_H
#define RASE_QUANTS_H

#include "_types.h"

// ---------------------------------------------------------------- scalar references

// MXFP4: the E2M1 values doubled, as ggml's kvalues_mxfp4, and the E8M0 exponent halved to match
// (ggml_e8m0_to_fp32_half: 2^(e - 128), the two smallest as denormals)
static const int8_t rase_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
static inline float rase_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void dequant_row_f32_ref(const void *src, float *y, int64_t n) { memcpy(y, src, (size_t)n * 4); }

static void dequant_row_f16_ref(const void *src, float *y, int64_t n) {
    const uint16_t *x = (const uint16_t *)src;
    for (int64_t i = 0; i < n; ++i) y[i] = rase_fp16_to_fp32(x[i]);
}

static void dequant_row_bf16_ref(const void *src, float *y, int64_t n) {
    const uint16_t *x = (const uint16_t *)src;
    for (int64_t i = 0; i < n; ++i) y[i] = rase_bf16_to_fp32(x[i]);
}

static void dequant_row_q4_0_ref(const void *src, float *y, int64_t n) {
    const block_q4_0 *x = (const block_q4_0 *)src;
    for (int64_t i = 0; i < n / 32; ++i, y += 32) {
        const float d = rase_fp16_to_fp32(x[i].d);
        for (int j = 0; j < 16; ++j) {
            y[j] = d * (float)((x[i].qs[j] & 0x0F) - 8);
            y[j + 16] = d * (float)((x[i].qs[j] >> 4) - 8);
        }
    }
}

static void dequant_row_q4_1_ref(const void *src, float *y, int64_t n) {
    const block_q4_1 *x = (const block_q4_1 *)src;
    for (int64_t i = 0; i < n / 32; ++i, y += 32) {
        const float d = rase_fp16_to_fp32(x[i].d), m = rase_fp16_to_fp32(x[i].m);
        for (int j = 0; j < 16; ++j) {
            y[j] = d * (float)(x[i].qs[j] & 0x0F) + m;
            y[j + 16] = d * (float)(x[i].qs[j] >> 4) + m;
        }
    }
}

static void dequant_row_q5_0_ref(const void *src, float *y, int64_t n) {
    const block_q5_0 *x = (const block_q5_0 *)src;
    for (int64_t i = 0; i < n / 32; ++i, y += 32) {
        const float d = rase_fp16_to_fp32(x[i].d);
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < 16; ++j) {
            const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            y[j] = d * (float)(((x[i].qs[j] & 0x0F) | h0) - 16);
            y[j + 16] = d * (float)(((x[i].qs[j] >> 4) | h1) - 16);
        }
    }
}

static void dequant_row_q5_1_ref(const void *src, float *y, int64_t n) {
    const block_q5_1 *x = (const block_q5_1 *)src;
    for (int64_t i = 0; i < n / 32; ++i, y += 32) {
        const float d = rase_fp16_to_fp32(x[i].d), m = rase_fp16_to_fp32(x[i].m);
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < 16; ++j) {
            const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            y[j] = d * (float)((x[i].qs[j] & 0x0F) | h0) + m;
            y[j + 16] = d * (float)((x[i].qs[j] >> 4) | h1) + m;
        }
    }
}

static void dequant_row_q8_0_ref(const void *src, float *y, int64_t n) {
    const block_q8_0 *x = (const block_q8_0 *)src;
    for (int64_t i = 0; i < n / 32; ++i, y += 32) {
        const float d = rase_fp16_to_fp32(x[i].d);
        for (int j = 0; j < 32; ++j) y[j] = d * (float)x[i].qs[j];
    }
}

static void dequant_row_q2_k_ref(const void *src, float *y, int64_t n) {
    const block_q2_K *x = (const block_q2_K *)src;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = rase_fp16_to_fp32(x[i].d), dmin = rase_fp16_to_fp32(x[i].dmin);
        const uint8_t *q = x[i].qs;
        int is = 0;
        for (int half = 0; half < 2; ++half, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int part = 0; part < 2; ++part, y += 16) {
                    const uint8_t sc = x[i].scales[is++];
                    const float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
                    for (int l = 0; l < 16; ++l) y[l] = dl * (float)((q[l + 16 * part] >> shift) & 3) - ml;
                }
            }
        }
    }
}

static void dequant_row_mxfp4_ref(const void *src, float *y, int64_t n) {
    const block_mxfp4 *x = (const block_mxfp4 *)src;
    for (int64_t i = 0; i < n / 32; ++i, y += 32) {
        const float d = rase_e8m0_half(x[i].e);
        for (int j = 0; j < 16; ++j) {
            y[j] = (float)rase_kvalues_mxfp4[x[i].qs[j] & 0x0F] * d;
            y[j + 16] = (float)rase_kvalues_mxfp4[x[i].qs[j] >> 4] * d;
        }
    }
}

// Q3_K/Q4_K/Q5_K pack 6-bit scales into 12 bytes; these unpack them.
static inline void rase_q3_k_scales(const uint8_t *packed, int8_t out[16]) {
    const uint32_t kmask1 = 0x03030303u, kmask2 = 0x0f0f0f0fu;
    uint32_t aux[4];
    memcpy(aux, packed, 12);
    const uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    memcpy(out, aux, 16);
}

static inline void rase_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void dequant_row_q3_k_ref(const void *src, float *y, int64_t n) {
    const block_q3_K *x = (const block_q3_K *)src;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d_all = rase_fp16_to_fp32(x[i].d);
        int8_t scales[16];
        rase_q3_k_scales(x[i].scales, scales);
        const uint8_t *q = x[i].qs, *hm = x[i].hmask;
        uint8_t m = 1;
        int is = 0;
        for (int half = 0; half < 2; ++half, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
                for (int part = 0; part < 2; ++part, y += 16) {
                    const float dl = d_all * (float)(scales[is++] - 32);
                    for (int l = 0; l < 16; ++l) {
                        const int k = l + 16 * part;
                        y[l] = dl * (float)(((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4));
                    }
                }
            }
        }
    }
}

static void dequant_row_q4_k_ref(const void *src, float *y, int64_t n) {
    const block_q4_K *x = (const block_q4_K *)src;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = rase_fp16_to_fp32(x[i].d), dmin = rase_fp16_to_fp32(x[i].dmin);
        const uint8_t *q = x[i].qs;
        for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
            uint8_t sc, m;
            rase_scale_min_k4(j, x[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            rase_scale_min_k4(j + 1, x[i].scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; ++l) y[l] = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; ++l) y[l + 32] = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

static void dequant_row_q5_k_ref(const void *src, float *y, int64_t n) {
    const block_q5_K *x = (const block_q5_K *)src;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = rase_fp16_to_fp32(x[i].d), dmin = rase_fp16_to_fp32(x[i].dmin);
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0; j < 8; j += 2, ql += 32, y += 64, u1 <<= 2, u2 <<= 2) {
            uint8_t sc, m;
            rase_scale_min_k4(j, x[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            rase_scale_min_k4(j + 1, x[i].scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; ++l) y[l] = d1 * (float)((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l) y[l + 32] = d2 * (float)((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
        }
    }
}

static void dequant_row_q6_k_ref(const void *src, float *y, int64_t n) {
    const block_q6_K *x = (const block_q6_K *)src;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = rase_fp16_to_fp32(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; ++l) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = (d * (float)sc[is + 0]) * (float)q1;
                y[l + 32] = (d * (float)sc[is + 2]) * (float)q2;
                y[l + 64] = (d * (float)sc[is + 4]) * (float)q3;
                y[l + 96] = (d * (float)sc[is + 6]) * (float)q4;
            }
        }
    }
}

// ---------------------------------------------------------------- AVX2 (same results, bit for bit)
#if RASE_HAVE_X86

RASE_TARGET_AVX2 static void dequant_row_f16_avx2(const void *src, float *y, int64_t n) {
    const uint16_t *x = (const uint16_t *)src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; ++i) y[i] = rase_fp16_to_fp32(x[i]);
}

RASE_TARGET_AVX2 static void dequant_row_bf16_avx2(const void *src, float *y, int64_t n) {
    const uint16_t *x = (const uint16_t *)src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; ++i) y[i] = rase_bf16_to_fp32(x[i]);
}

RASE_TARGET_AVX2 static void dequant_row_q4_0_avx2(const void *src, float *y, int64_t n) {
    const block_q4_0 *x = (const block_q4_0 *)src;
    for (int64_t i = 0; i < n / 32; ++i, y += 32) {
        const float d = rase_fp16_to_fp32(x[i].d);
        const __m256i q = _mm256_sub_epi8(rase_avx2_nibbles16(x[i].qs), _mm256_set1_epi8(8));
        rase_avx2_store_i8x32(y, q, d, d, 0.0f, 0.0f);
    }
}

RASE_TARGET_AVX2 static void dequant_row_q4_1_avx2(const void *src, float *y, int64_t n) {
    const block_q4_1 *x = (const block_q4_1 *)src;
    for (int64_t i = 0; i < n / 32; ++i, y += 32) {
        const float d = rase_fp16_to_fp32(x[i].d), m = rase_fp16_to_fp32(x[i].m);
        rase_avx2_store_i8x32(y, rase_avx2_nibbles16(x[i].qs), d, d, -m, -m);
    }
}

RASE_TARGET_AVX2 static void dequant_row_q5_0_avx2(const void *src, float *y, int64_t n) {
    const block_q5_0 *x = (const block_q5_0 *)src;
    for (int64_t i = 0; i < n / 32; ++i, y += 32) {
        const float d = rase_fp16_to_fp32(x[i].d);
        const __m256i hi = _mm256_and_si256(rase_avx2_bytes_from_bits32(x[i].qh), _mm256_set1_epi8(0x10));
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(rase_avx2_nibbles16(x[i].qs), hi), _mm256_set1_epi8(16));
        rase_avx2_store_i8x32(y, q, d, d, 0.0f, 0.0f);
    }
}

RASE_TARGET_AVX2 static void dequant_row_q5_1_avx2(const void *src, float *y, int64_t n) {
    const block_q5_1 *x = (const block_q5_1 *)src;
    for (int64_t i = 0; i < n / 32; ++i, y += 32) {
        const float d = rase_fp16_to_fp32(x[i].d), m = rase_fp16_to_fp32(x[i].m);
        const __m256i hi = _mm256_and_si256(rase_avx2_bytes_from_bits32(x[i].qh), _mm256_set1_epi8(0x10));
        rase_avx2_store_i8x32(y, _mm256_or_si256(rase_avx2_nibbles16(x[i].qs), hi), d, d, -m, -m);
    }
}

RASE_TARGET_AVX2 static void dequant_row_q8_0_avx2(const void *src, float *y, int64_t n) {
    const block_q8_0 *x = (const block_q8_0 *)src;
    for (int64_t i = 0; i < n / 32; ++i, y += 32) {
        const float d = rase_fp16_to_fp32(x[i].d);
        rase_avx2_store_i8x32(y, _mm256_loadu_si256((const __m256i *)x[i].qs), d, d, 0.0f, 0.0f);
    }
}

RASE_TARGET_AVX2 static void dequant_row_mxfp4_avx2(const void *src, float *y, int64_t n) {
    const block_mxfp4 *x = (const block_mxfp4 *)src;
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)rase_kvalues_mxfp4));
    for (int64_t i = 0; i < n / 32; ++i, y += 32) {
        const float d = rase_e8m0_half(x[i].e);
        rase_avx2_store_i8x32(y, _mm256_shuffle_epi8(lut, rase_avx2_nibbles16(x[i].qs)), d, d, 0.0f, 0.0f);
    }
}

RASE_TARGET_AVX2 static void dequant_row_q2_k_avx2(const void *src, float *y, int64_t n) {
    const block_q2_K *x = (const block_q2_K *)src;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = rase_fp16_to_fp32(x[i].d), dmin = rase_fp16_to_fp32(x[i].dmin);
        const uint8_t *sc = x[i].scales;
        for (int half = 0; half < 2; ++half) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * half));
            for (int shift = 0; shift < 8; shift += 2, sc += 2, y += 32) {
                rase_avx2_store_i8x32(y, rase_avx2_bits(q, shift, 3), d * (float)(sc[0] & 0xF),
                                      d * (float)(sc[1] & 0xF), dmin * (float)(sc[0] >> 4),
                                      dmin * (float)(sc[1] >> 4));
            }
        }
    }
}

RASE_TARGET_AVX2 static void dequant_row_q3_k_avx2(const void *src, float *y, int64_t n) {
    const block_q3_K *x = (const block_q3_K *)src;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d_all = rase_fp16_to_fp32(x[i].d);
        int8_t scales[16];
        rase_q3_k_scales(x[i].scales, scales);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        int is = 0, bit = 0;
        for (int half = 0; half < 2; ++half) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * half));
            for (int shift = 0; shift < 8; shift += 2, ++bit, is += 2, y += 32) {
                // subtract 4 where the high bit is clear
                const __m256i nohi = _mm256_xor_si256(rase_avx2_bits(hm, bit, 1), _mm256_set1_epi8(1));
                const __m256i v = _mm256_sub_epi8(rase_avx2_bits(q, shift, 3), _mm256_slli_epi16(nohi, 2));
                rase_avx2_store_i8x32(y, v, d_all * (float)(scales[is] - 32),
                                      d_all * (float)(scales[is + 1] - 32), 0.0f, 0.0f);
            }
        }
    }
}

RASE_TARGET_AVX2 static void dequant_row_q4_k_avx2(const void *src, float *y, int64_t n) {
    const block_q4_K *x = (const block_q4_K *)src;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = rase_fp16_to_fp32(x[i].d), dmin = rase_fp16_to_fp32(x[i].dmin);
        for (int j = 0; j < 8; j += 2, y += 64) {
            uint8_t sc1, m1, sc2, m2;
            rase_scale_min_k4(j, x[i].scales, &sc1, &m1);
            rase_scale_min_k4(j + 1, x[i].scales, &sc2, &m2);
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(x[i].qs + 16 * j));
            const float d1 = d * (float)sc1, d2 = d * (float)sc2;
            const float mm1 = dmin * (float)m1, mm2 = dmin * (float)m2;
            rase_avx2_store_i8x32(y, rase_avx2_bits(raw, 0, 0xF), d1, d1, mm1, mm1);
            rase_avx2_store_i8x32(y + 32, rase_avx2_bits(raw, 4, 0xF), d2, d2, mm2, mm2);
        }
    }
}

RASE_TARGET_AVX2 static void dequant_row_q5_k_avx2(const void *src, float *y, int64_t n) {
    const block_q5_K *x = (const block_q5_K *)src;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = rase_fp16_to_fp32(x[i].d), dmin = rase_fp16_to_fp32(x[i].dmin);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)x[i].qh);
        for (int j = 0; j < 8; j += 2, y += 64) {
            uint8_t sc1, m1, sc2, m2;
            rase_scale_min_k4(j, x[i].scales, &sc1, &m1);
            rase_scale_min_k4(j + 1, x[i].scales, &sc2, &m2);
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(x[i].qs + 16 * j));
            const __m256i h1 = _mm256_slli_epi16(rase_avx2_bits(qh, j, 1), 4);
            const __m256i h2 = _mm256_slli_epi16(rase_avx2_bits(qh, j + 1, 1), 4);
            const float d1 = d * (float)sc1, d2 = d * (float)sc2;
            const float mm1 = dmin * (float)m1, mm2 = dmin * (float)m2;
            rase_avx2_store_i8x32(y, _mm256_or_si256(rase_avx2_bits(raw, 0, 0xF), h1), d1, d1, mm1, mm1);
            rase_avx2_store_i8x32(y + 32, _mm256_or_si256(rase_avx2_bits(raw, 4, 0xF), h2), d2, d2, mm2, mm2);
        }
    }
}

RASE_TARGET_AVX2 static void dequant_row_q6_k_avx2(const void *src, float *y, int64_t n) {
    const block_q6_K *x = (const block_q6_K *)src;
    const __m256i m32 = _mm256_set1_epi8(32);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = rase_fp16_to_fp32(x[i].d);
        for (int half = 0; half < 2; ++half, y += 128) {
            const uint8_t *ql = x[i].ql + 64 * half;
            const int8_t *sc = x[i].scales + 8 * half;
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * half));
            const __m256i q[4] = {
                _mm256_or_si256(rase_avx2_bits(l0, 0, 0xF), _mm256_slli_epi16(rase_avx2_bits(h, 0, 3), 4)),
                _mm256_or_si256(rase_avx2_bits(l1, 0, 0xF), _mm256_slli_epi16(rase_avx2_bits(h, 2, 3), 4)),
                _mm256_or_si256(rase_avx2_bits(l0, 4, 0xF), _mm256_slli_epi16(rase_avx2_bits(h, 4, 3), 4)),
                _mm256_or_si256(rase_avx2_bits(l1, 4, 0xF), _mm256_slli_epi16(rase_avx2_bits(h, 6, 3), 4)),
            };
            for (int k = 0; k < 4; ++k)
                rase_avx2_store_i8x32(y + 32 * k, _mm256_sub_epi8(q[k], m32), d * (float)sc[2 * k],
                                      d * (float)sc[2 * k + 1], 0.0f, 0.0f);
        }
    }
}
#endif

#endif  // RASE_QUANTS_H
