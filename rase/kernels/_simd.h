// rase/kernels/_simd.h: the ISA vocabulary. Only this header includes <immintrin.h>.
//
// One build runs on every x86-64 CPU: AVX2/FMA/F16C code is compiled per function with
// RASE_TARGET_AVX2 (no -mavx2 / -march flags), and rase_isa picks the path at import time.
// The scalar path is always compiled and is the reference every fast kernel is tested against.
#ifndef RASE_SIMD_H
#define RASE_SIMD_H

#include <stdint.h>
#include <string.h>
#include <math.h>

#if defined(RASE_EMULATE_SIMD) || (defined(__aarch64__) && defined(RASE_SIMDE))
// SIMDe (Debian's libsimde-dev) supplies every x86 intrinsic the kernels use, with x86's exact
// results. In the test build (rase.kernels._kernels_emu, RASE_EMULATE_SIMD) it is portable C, so the AVX2
// and AVX-512 kernels run, and are checked bit for bit, on any CPU. On aarch64 (RASE_SIMDE) SIMDe
// maps them onto NEON: the AVX2 kernels become the "neon" level, with x86's bits on ARM, and the
// hand-written NEON kernels (the NEON sections of _repack*.h) replace them where they are hot.
// SIMDe's portable FMA is one rounding only where it may call fmaf: FP_FAST_FMAF says it may.
#  define RASE_HAVE_X86 1
#  ifdef RASE_EMULATE_SIMD
#    define RASE_EMULATED 1
#  else
#    define RASE_EMULATED 0
#  endif
#  ifndef FP_FAST_FMAF
#    define FP_FAST_FMAF 1
#  endif
#  define SIMDE_ENABLE_NATIVE_ALIASES
#  include <simde/x86/avx512.h>
#  include <simde/x86/fma.h>
#  include <simde/x86/f16c.h>
#  include "_simd_emu.h"
#  define RASE_TARGET_AVX2
#  define RASE_TARGET_AVX512
#elif defined(__x86_64__) || defined(__i386__)
#  define RASE_HAVE_X86 1
#  define RASE_EMULATED 0
#  include <immintrin.h>
#  include <cpuid.h>
#  define RASE_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#  define RASE_TARGET_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#else
#  define RASE_HAVE_X86 0
#  define RASE_EMULATED 0
#endif

#if defined(__aarch64__) && defined(RASE_SIMDE) && !defined(RASE_EMULATE_SIMD)
#  define RASE_HAVE_NEON 1
#  include <arm_neon.h>
#  include <sys/auxv.h>
#  define RASE_TARGET_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#  define RASE_TARGET_I8MM __attribute__((target("arch=armv8.2-a+dotprod+i8mm")))
#  ifndef HWCAP2_I8MM
#    define HWCAP2_I8MM (1 << 13)  // Linux 5.10's value; older headers lack the name
#  endif
#else
#  define RASE_HAVE_NEON 0
#endif

// Levels, each a superset of the one before: a kernel table's empty entry for a level falls
// back to the level below it (avx512 uses the AVX2 kernels except where it has its own). On
// aarch64 level 1 is NEON (ARMv8.0: the AVX2 kernels through SIMDe, the repacked matmuls' own
// NEON kernels), level 2 adds the dot-product instructions (sdot, ARMv8.2 dotprod) and level 3
// the int8 matrix multiply (smmla, i8mm) where a type's numerics allow it (_traits.h);
// RASE_ISA_AVX512 there is past the last level, so no AVX-512 path is ever taken.
#if RASE_HAVE_NEON
enum { RASE_ISA_SCALAR = 0, RASE_ISA_AVX2 = 1, RASE_ISA_DOTPROD = 2, RASE_ISA_I8MM = 3, RASE_ISA_COUNT = 4,
       RASE_ISA_AVX512 = 4 };
static const char *const RASE_ISA_NAMES[RASE_ISA_COUNT] = {"scalar", "neon", "dotprod", "i8mm"};
#else
enum { RASE_ISA_SCALAR = 0, RASE_ISA_AVX2 = 1, RASE_ISA_AVX512 = 2, RASE_ISA_COUNT = 3 };
static const char *const RASE_ISA_NAMES[RASE_ISA_COUNT] = {"scalar", "avx2", "avx512"};
#endif

// A kernel table's row, a kernel per level: x86 {scalar, AVX2, AVX-512}; aarch64 {scalar, NEON, dotprod, i8mm}, where
// a row without NEON kernels of its own runs the AVX2 one (through SIMDe) on every level, and
// i8mm runs the dotprod kernel where the type has none of its own.
#if RASE_HAVE_NEON
#define RASE_ISA_ROW(ref, avx2, avx512) {ref, avx2, avx2, avx2}
#define RASE_ISA_ROW_NEON(ref, avx2, avx512, neon, dotprod) {ref, neon, dotprod, dotprod}
#define RASE_ISA_ROW_I8MM(ref, avx2, avx512, neon, dotprod, i8mm) {ref, neon, dotprod, i8mm}
#elif RASE_HAVE_X86
#define RASE_ISA_ROW(ref, avx2, avx512) {ref, avx2, avx512}
#define RASE_ISA_ROW_NEON(ref, avx2, avx512, neon, dotprod) RASE_ISA_ROW(ref, avx2, avx512)
#define RASE_ISA_ROW_I8MM(ref, avx2, avx512, neon, dotprod, i8mm) RASE_ISA_ROW(ref, avx2, avx512)
#else  // the scalar level only: the other names are never compiled
#define RASE_ISA_ROW(ref, avx2, avx512) {ref, 0, 0}
#define RASE_ISA_ROW_NEON(ref, avx2, avx512, neon, dotprod) {ref, 0, 0}
#define RASE_ISA_ROW_I8MM(ref, avx2, avx512, neon, dotprod, i8mm) {ref, 0, 0}
#endif

// The path in use; written once at import (rase/__init__.py: _select_kernels), read by every dispatcher.
static int rase_isa = RASE_ISA_SCALAR;

static int rase_isa_compiled(int isa) {
    return isa == RASE_ISA_SCALAR || (isa > RASE_ISA_SCALAR && isa < RASE_ISA_COUNT && (RASE_HAVE_X86 || RASE_HAVE_NEON));
}

static int rase_isa_supported(int isa) {
    if (isa == RASE_ISA_SCALAR) return 1;
#if RASE_EMULATED
    return isa == RASE_ISA_AVX2 || isa == RASE_ISA_AVX512;  // every instruction is C code
#elif RASE_HAVE_NEON
    if (isa == RASE_ISA_AVX2) return 1;  // Advanced SIMD is part of every aarch64 CPU (ARMv8-A)
    const int dotprod = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
    if (isa == RASE_ISA_DOTPROD) return dotprod;
    if (isa == RASE_ISA_I8MM) return dotprod && (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0;
#elif RASE_HAVE_X86
    if (isa == RASE_ISA_AVX2 || isa == RASE_ISA_AVX512) {
        __builtin_cpu_init();  // checks OS YMM / ZMM state support too (xgetbv)
        const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
        if (isa == RASE_ISA_AVX2) return avx2;
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    }
#endif
    return 0;
}
static int rase_isa_best(void) {
    for (int isa = RASE_ISA_COUNT - 1; isa > 0; --isa)
        if (rase_isa_supported(isa)) return isa;
    return RASE_ISA_SCALAR;
}

// --- half-precision conversions (bit exact, no ISA needed) ---

static inline float rase_fp32_from_bits(uint32_t w) { float f; memcpy(&f, &w, 4); return f; }
static inline uint32_t rase_fp32_to_bits(float f) { uint32_t w; memcpy(&w, &f, 4); return w; }

// IEEE binary16 -> binary32, exact for all inputs (normals, subnormals, inf, NaN); ggml's method.
static inline float rase_fp16_to_fp32(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const uint32_t exp_offset = 0xE0u << 23;
    const float exp_scale = rase_fp32_from_bits(0x7800000u);  // 2^-112
    const float normalized = rase_fp32_from_bits((two_w >> 4) + exp_offset) * exp_scale;
    const uint32_t magic_mask = 126u << 23;
    const float magic_bias = 0.5f;
    const float denormalized = rase_fp32_from_bits((two_w >> 17) | magic_mask) - magic_bias;
    const uint32_t denorm_cutoff = 1u << 27;
    const uint32_t result = sign | (two_w < denorm_cutoff ? rase_fp32_to_bits(denormalized)
                                                          : rase_fp32_to_bits(normalized));
    return rase_fp32_from_bits(result);
}

// binary32 -> binary16, round to nearest even; ggml's method.
static inline uint16_t rase_fp32_to_fp16(float f) {
    const float scale_to_inf = rase_fp32_from_bits(0x77800000u);
    const float scale_to_zero = rase_fp32_from_bits(0x08800000u);
    float base = (fabsf(f) * scale_to_inf) * scale_to_zero;
    const uint32_t w = rase_fp32_to_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = rase_fp32_from_bits((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = rase_fp32_to_bits(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

#if RASE_HAVE_X86
RASE_TARGET_AVX2 static void rase_fp32_to_fp16_row_f16c(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) y[i] = rase_fp32_to_fp16(x[i]);
}
#endif

// y[i] = rase_fp32_to_fp16(x[i]); F16C's conversion rounds to nearest even as it does (NaN
// payloads aside: both give a NaN)
static inline void rase_fp32_to_fp16_row(const float *x, uint16_t *y, int64_t n, int isa) {
#if RASE_HAVE_X86
    if (isa >= RASE_ISA_AVX2) { rase_fp32_to_fp16_row_f16c(x, y, n); return; }
#endif
    for (int64_t i = 0; i < n; ++i) y[i] = rase_fp32_to_fp16(x[i]);
}

static inline void rase_prefetch(const void *p) { __builtin_prefetch(p, 0, 3); }  // t0: prefetchnta stalls on Intel server cores

// Weights are streamed once per step: each block a kernel reads asks for the lines
// rase_prefetch_bytes ahead of it (0: none), spread one block at a time (a burst of a whole
// group's prefetches stalls on the fill buffers). Prefetches never change a result.
// Written once at import (rase/__init__.py: _select_kernels; RASE_PREFETCH overrides), like rase_isa.
static int rase_prefetch_bytes = 4096;
#define RASE_PREFETCH_AHEAD(p, bytes)                                                                  \
    do {                                                                                               \
        if (rase_prefetch_bytes)                                                                       \
            for (int pf_o = 0; pf_o < (int)(bytes); pf_o += 64)                                        \
                rase_prefetch((const char *)(p) + rase_prefetch_bytes + pf_o);                         \
    } while (0)

// The default distance by CPU vendor (cpuid leaf 0), decode on 2 threads: an Intel Xeon
// (2026-12-01) 5% faster with 4 KiB; AMD, 4 KiB as well: on a Zen 5 EPYC (2026-12-05) decode ran
// 14% (SmolLM2 Q4_1), 20% (Gemma3 Q4_K_M) and 36% (a Llama-3.2-1B-shape Q4_K_M, 800 MB) faster
// with it, and the Q4_K/Q6_K matvec from DRAM went from 77%/69% of the read bandwidth to 99%/98%
// (alternated, 2-3 rounds): its L2 streamers keep up with the light kernels, not with Q4_K/Q6_K's.
// A Zen 4 (2026-12-04) had measured 7-14% faster with none on the small models. Unlisted: 4 KiB.
typedef struct { char vendor[13]; int bytes; } rase_prefetch_rule;
static const rase_prefetch_rule RASE_PREFETCH_RULES[] = {{"AuthenticAMD", 4096}, {"GenuineIntel", 4096}};
#define RASE_PREFETCH_FALLBACK 4096

// the CPU's 12-character vendor string, "" where there is no cpuid (or in the emulated build)
static void rase_cpu_vendor(char out[13]) {
    memset(out, 0, 13);
#if RASE_HAVE_X86 && !RASE_EMULATED && !RASE_HAVE_NEON
    unsigned int a, b, c, d;
    if (__get_cpuid(0, &a, &b, &c, &d)) {
        memcpy(out, &b, 4);
        memcpy(out + 4, &d, 4);
        memcpy(out + 8, &c, 4);
    }
#endif
}

static int rase_prefetch_default(void) {
    char vendor[13];
    rase_cpu_vendor(vendor);
    for (size_t i = 0; i < sizeof RASE_PREFETCH_RULES / sizeof RASE_PREFETCH_RULES[0]; ++i)
        if (!strcmp(vendor, RASE_PREFETCH_RULES[i].vendor)) return RASE_PREFETCH_RULES[i].bytes;
    return RASE_PREFETCH_FALLBACK;
}

static inline float rase_bf16_to_fp32(uint16_t h) { return rase_fp32_from_bits((uint32_t)h << 16); }

#if RASE_HAVE_X86
// --- AVX2 vocabulary ---

// 32 int8 lanes -> y[0..32) = d * q - m, with (d, m) = (d_lo, m_lo) for lanes 0..15 and
// (d_hi, m_hi) for 16..31. Multiply then subtract (no FMA) so results equal the scalar path.
RASE_TARGET_AVX2 static inline void rase_avx2_store_i8x32(float *y, __m256i q, float d_lo,
                                                          float d_hi, float m_lo, float m_hi) {
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; ++k) {
        const __m256 d = _mm256_set1_ps(k < 2 ? d_lo : d_hi);
        const __m256 m = _mm256_set1_ps(k < 2 ? m_lo : m_hi);
        const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[k]));
        _mm256_storeu_ps(y + 8 * k, _mm256_sub_ps(_mm256_mul_ps(d, f), m));
    }
}

// 32 bits (little endian) -> 32 bytes, 0xFF where the bit is set; lane j <- bit j.
RASE_TARGET_AVX2 static inline __m256i rase_avx2_bytes_from_bits32(const uint8_t *x) {
    uint32_t x32;
    memcpy(&x32, x, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                           0x0101010101010101LL, 0x0000000000000000LL);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x32), shuf);
    bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL));
    return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

// 16 packed nibble bytes -> 32 bytes: lanes 0..15 low nibbles, 16..31 high nibbles.
RASE_TARGET_AVX2 static inline __m256i rase_avx2_nibbles16(const uint8_t *x) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)x);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
}

// per byte: (x >> s) & mask, for 0 <= s < 8 (16-bit shifts never leak across the mask).
RASE_TARGET_AVX2 static inline __m256i rase_avx2_bits(__m256i x, int s, int mask) {
    return _mm256_and_si256(_mm256_srli_epi16(x, s), _mm256_set1_epi8((char)mask));
}

// exp(x) for 8 lanes, the same arithmetic as ggml's AVX2 ggml_v_expf (ARM optimized-routines
// algorithm: 2^n * (1 + poly(b)), max error ~1.5 ulp), so softmax and SiLU round like llama.cpp.
RASE_TARGET_AVX2 static inline __m256 rase_avx2_expf(__m256 x) {
    const __m256 shift = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shift);
    const __m256 n = _mm256_sub_ps(z, shift);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0f))));
    const __m256 absn = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 big = _mm256_cmp_ps(absn, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 hi = _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f));
    const __m256 lo = _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f));
    const __m256 j = _mm256_fmadd_ps(_mm256_fmadd_ps(hi, u, lo), u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    if (!_mm256_movemask_ps(big)) return _mm256_fmadd_ps(j, k, k);
    // |n| > 126: scale in two steps (overflow to inf, underflow to 0 beyond |n| > 192)
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 huge = _mm256_cmp_ps(absn, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    const __m256 mid = _mm256_blendv_ps(_mm256_fmadd_ps(k, j, k), _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1), big);
    return _mm256_blendv_ps(mid, _mm256_mul_ps(s1, s1), huge);
}

// sum of 8 lanes in ggml's order: (hi + lo) halves, then movehl, then movehdup
RASE_TARGET_AVX2 static inline float rase_avx2_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// ggml_vec_dot_f16's reduction of 4 accumulators: (a0 + a2) + (a1 + a3), halves, two hadds
// the horizontal sum of x: (x0 + x4) + (x1 + x5), (x2 + x6) + (x3 + x7), then those two
RASE_TARGET_AVX2 static inline float rase_avx2_reduce_x(__m256 x) {
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
}

RASE_TARGET_AVX2 static inline float rase_avx2_reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    return rase_avx2_reduce_x(_mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3)));
}

// lane k = rase_avx2_reduce_x(x[k]) for 8 vectors at once (the same adds in the same order)
RASE_TARGET_AVX2 static inline __m256 rase_avx2_reduce8x(const __m256 *x) {
    __m256 u[4];  // u[p] = [lo + hi of x[2p] | lo + hi of x[2p + 1]]
    for (int p = 0; p < 4; ++p)
        u[p] = _mm256_add_ps(_mm256_permute2f128_ps(x[2 * p], x[2 * p + 1], 0x20),
                             _mm256_permute2f128_ps(x[2 * p], x[2 * p + 1], 0x31));
    // hadd pairs within each 128-bit lane: [k0 01, k0 23, k2 01, k2 23 | k1 01, k1 23, k3 01, k3 23]
    const __m256 h01 = _mm256_hadd_ps(u[0], u[1]), h23 = _mm256_hadd_ps(u[2], u[3]);
    const __m256 r = _mm256_hadd_ps(h01, h23);  // [k0, k2, k4, k6 | k1, k3, k5, k7]
    return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
#endif

#endif  // RASE_SIMD_H
