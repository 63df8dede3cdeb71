// rase/kernels/_simd_emu.h: the few intrinsics the kernels use that SIMDe 0.7 does not provide, in the
// same portable C (included by _simd.h only in the emulated test build, after SIMDe).
#ifndef RASE_SIMD_EMU_H
#define RASE_SIMD_EMU_H

#define __mmask16 simde__mmask16
#define __mmask64 simde__mmask64
#define _MM_FROUND_TO_NEAREST_INT SIMDE_MM_FROUND_TO_NEAREST_INT
#define _MM_FROUND_NO_EXC SIMDE_MM_FROUND_NO_EXC
#define _mm512_shuffle_f32x4(a, b, imm8) simde_mm512_shuffle_f32x4(a, b, imm8)  // no alias in 0.7

static inline float rase_emu_cvtsh_ss(uint16_t h) {
    return simde_mm_cvtss_f32(simde_mm_cvtph_ps(simde_mm_cvtsi32_si128(h)));
}
#define _cvtsh_ss(h) rase_emu_cvtsh_ss(h)

// 16 int32 -> 16 f32, each rounded as the 8-lane conversion rounds it
static inline simde__m512 rase_emu_mm512_cvtepi32_ps(simde__m512i v) {
    const simde__m256 lo = simde_mm256_cvtepi32_ps(simde_mm512_castsi512_si256(v));
    const simde__m256 hi = simde_mm256_cvtepi32_ps(simde_mm512_extracti64x4_epi64(v, 1));
    return simde_mm512_castpd_ps(simde_mm512_insertf64x4(simde_mm512_castps_pd(simde_mm512_castps256_ps512(lo)),
                                                         simde_mm256_castps_pd(hi), 1));
}
#define _mm512_cvtepi32_ps(v) rase_emu_mm512_cvtepi32_ps(v)

// 16 f16 -> 16 f32 (exact: the two 8-lane F16C conversions)
static inline simde__m512 rase_emu_mm512_cvtph_ps(simde__m256i h) {
    simde__m512 r = simde_mm512_castps256_ps512(simde_mm256_cvtph_ps(simde_mm256_castsi256_si128(h)));
    const simde__m256 hi = simde_mm256_cvtph_ps(simde_mm256_extracti128_si256(h, 1));
    return simde_mm512_castpd_ps(simde_mm512_insertf64x4(simde_mm512_castps_pd(r), simde_mm256_castps_pd(hi), 1));
}
#define _mm512_cvtph_ps(h) rase_emu_mm512_cvtph_ps(h)

// lane i of v stored to p[i] where bit i of k is set
static inline void rase_emu_mm512_mask_storeu_ps(void *p, simde__mmask16 k, simde__m512 v) {
    float t[16];
    simde_mm512_storeu_ps(t, v);
    for (int i = 0; i < 16; ++i)
        if ((k >> i) & 1) ((float *)p)[i] = t[i];
}
#define _mm512_mask_storeu_ps(p, k, v) rase_emu_mm512_mask_storeu_ps(p, k, v)

static inline int rase_emu_mm512_reduce_add_epi32(simde__m512i v) {
    int32_t t[16];
    simde_mm512_storeu_si512(t, v);
    uint32_t s = 0;  // wraps as the instruction does
    for (int i = 0; i < 16; ++i) s += (uint32_t)t[i];
    return (int)s;
}
#define _mm512_reduce_add_epi32(v) rase_emu_mm512_reduce_add_epi32(v)

static inline simde__mmask64 rase_emu_load_mask64(const simde__mmask64 *p) {
    simde__mmask64 k;
    memcpy(&k, p, sizeof k);
    return k;
}
#define _load_mask64(p) rase_emu_load_mask64((const simde__mmask64 *)(p))

#endif  // RASE_SIMD_EMU_H
