// rase/kernels/_types.h: the ggml types rase runs, by name; their block layouts (ggml-common.h) with
// sizes asserted; the activation formats their dots read; the kernel signatures; and the shape
// of a type's ONE traits row (the rows themselves: _traits.h, after the kernels they name).
//
// Mirrors rase/kernels/quants.py QUANT_BLOCKS (a test checks they agree). A row of n elements is
// n / blck blocks laid end to end; n is always a multiple of blck.
#ifndef RASE_TYPES_H
#define RASE_TYPES_H

#include "_simd.h"

// ggml_type ids (ggml.h); only these have kernels here
enum rase_type {
    RASE_TYPE_F32 = 0, RASE_TYPE_F16 = 1, RASE_TYPE_Q4_0 = 2, RASE_TYPE_Q4_1 = 3, RASE_TYPE_Q5_0 = 6,
    RASE_TYPE_Q5_1 = 7, RASE_TYPE_Q8_0 = 8, RASE_TYPE_Q2_K = 10, RASE_TYPE_Q3_K = 11, RASE_TYPE_Q4_K = 12,
    RASE_TYPE_Q5_K = 13, RASE_TYPE_Q6_K = 14, RASE_TYPE_BF16 = 30, RASE_TYPE_MXFP4 = 39,
    RASE_GGML_TYPE_COUNT = 40,  // the table's length (ggml's ids stay below it)
};

#if RASE_HAVE_X86
#  define RASE_X86_FN(f) f  // a table entry compiled on x86 builds only
#else
#  define RASE_X86_FN(f) 0
#endif

#define QK_K 256  // elements of a K-quant super-block

// ---------------------------------------------------------------- weight blocks (ggml-common.h)

typedef struct { uint16_t d; uint8_t qs[16]; } block_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[16]; } block_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } block_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } block_q5_1;
typedef struct { uint16_t d; int8_t qs[32]; } block_q8_0;
typedef struct { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; } block_q2_K;
typedef struct { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; } block_q3_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } block_q4_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } block_q5_K;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } block_q6_K;
// OCP MX FP4: an E8M0 shared exponent, 32 E2M1 values (low nibbles: elements 0-15, high: 16-31)
typedef struct { uint8_t e; uint8_t qs[16]; } block_mxfp4;
_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0");
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0");
_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K");
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K");
_Static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4");

// ---------------------------------------------------------------- activation blocks
// q8_0/q8_1 keep ggml's values (d and s rounded to f16) but store them as f32, so kernels do not
// convert them once per weight row; q8_K is ggml's block_q8_K. q8_0 also carries the starts of
// unsigned-weight dot products, computed once per row here instead of once per 16 weight rows
// there: m128[s] = -128 * sum(qs[4s..4s+3]) per slice (the VNNI kernels, _repack_q.h), m8 = -8 *
// sum(qs) over the block (Q4_0's, _repack_bs.h).
typedef struct { float d; int8_t qs[32]; int32_t m128[8], m8; } act_q8_0;
typedef struct { float d, s; int8_t qs[32]; } act_q8_1;  // s = f16(d * sum(qs))
typedef struct { float d; int8_t qs[256]; int16_t bsums[16]; } block_q8_K;
_Static_assert(sizeof(act_q8_0) == 72 && sizeof(act_q8_1) == 40 && sizeof(block_q8_K) == 292, "activation blocks");

// ACT_F32C: f32 in chain-major order, x[k] at (k % 32) * (n / 32) + k / 32 (n % 32 == 0), for
// the F16 GEMM (rase_f16_rows_512), which reads one FMA chain's columns in a row
enum { ACT_F32 = 0, ACT_Q8_0 = 1, ACT_Q8_1 = 2, ACT_Q8_K = 3, ACT_F32C = 4, ACT_COUNT = 5 };

// ---------------------------------------------------------------- kernel signatures

// dst[0..n) = the n values of the blocks at src
typedef void (*rase_quantize_fn)(const float *x, void *y, int64_t k);  // k values -> k / blck blocks
typedef void (*rase_dequant_fn)(const void *src, float *dst, int64_t n);
// x (n floats) -> one activation row of a format (ACT_*)
typedef void (*rase_quant_fn)(const float *x, void *dst, int64_t n);
// out[t] = w . a_t for t < nt <= RASE_NT, a_t = a + t * astride bytes (one plain weight row)
typedef void (*rase_dotn_fn)(int64_t n, const void *w, const void *a, size_t astride, int nt, float *out);
// Y[t * ys + r] for rows [r0, r1) (a chunk of at most RASE_CHUNK_ROWS rows) of a plain matrix
// (rows row_bytes apart) and T tokens of A; work: RASE_CHUNK_ROWS * n floats of the thread's own
typedef void (*rase_rows_fn)(int64_t n, const uint8_t *data, int64_t row_bytes, int64_t r0, int64_t r1,
                             const uint8_t *A, size_t as, int T, float *Y, int64_t ys, float *work);
// y[t * ys + r] for rows r < nr of one repacked 16-row group at w and tokens t < nt
typedef void (*rase_r16_fn)(int64_t n, const uint8_t *w, const void *a, size_t astride, int nt, float *y,
                            int64_t ys, int nr);
// the same for all T tokens, the group's weights unpacked once into work (n / 32 * RASE_R16_PANEL bytes)
typedef void (*rase_r16_panel_fn)(int64_t n, const uint8_t *w, const void *a, size_t astride, int T, float *y,
                                  int64_t ys, int nr, uint8_t *work);
// group g of a plain (rows x n) matrix (rows row_bytes apart) into its repacked bytes at dst
typedef void (*rase_r16_repack_fn)(const uint8_t *src, int64_t row_bytes, int64_t rows, int64_t n, int64_t g,
                                   uint8_t *dst);
// row r (< 16) of the repacked group at pg back in ggml's plain blocks (n / blck of them at dst)
typedef void (*rase_r16_unpack_fn)(const uint8_t *pg, int64_t n, int r, uint8_t *dst);

// fn(NT, args...) with NT = min(nt, max) a compile-time constant (1..max, max <= 8): the one place
// a run-time token count becomes the constant a kernel's register tile is sized by
#define RASE_CONST_NT(max, nt, fn, ...)                                                  \
    do {                                                                                 \
        switch ((nt) < (max) ? (nt) : (max)) {                                           \
            case 1: fn(1, __VA_ARGS__); break;                                           \
            case 2: if (2 <= (max)) fn(2, __VA_ARGS__); break;                           \
            case 3: if (3 <= (max)) fn(3, __VA_ARGS__); break;                           \
            case 4: if (4 <= (max)) fn(4, __VA_ARGS__); break;                           \
            case 5: if (5 <= (max)) fn(5, __VA_ARGS__); break;                           \
            case 6: if (6 <= (max)) fn(6, __VA_ARGS__); break;                           \
            case 7: if (7 <= (max)) fn(7, __VA_ARGS__); break;                           \
            default: if (8 <= (max)) fn(8, __VA_ARGS__); break;                          \
        }                                                                                \
    } while (0)

// ---------------------------------------------------------------- one row per type
// Kernels per ISA are [scalar reference, AVX2, AVX-512]; 0 = the nearest level below. Every
// level gives the same bits as the reference (block-sum types: their own reference, _repack_bs.h).
typedef struct {
    const char *name;
    int blck, size;                          // elements and bytes per block; a 0 row: no kernels
    int act;                                 // ACT_* its dots read (ggml's vec_dot_type)
    rase_dequant_fn dequant[RASE_ISA_COUNT]; // a row of blocks to f32 (embedding lookups, tests)
    // plain layout (the matrix read in place)
    rase_dotn_fn dotn[RASE_ISA_COUNT];       // row by row, up to RASE_NT tokens; 0: repacked only
    rase_rows_fn rows[RASE_ISA_COUNT];       // optional GEMM for n % 32 == 0 (the same bits as dotn)
    int rows_act;                            // the activation format the rows kernels read
    int rows_min;                            // tokens from which they pay
    // 16-row repacked layout (_repack.h), copied once at load; r16_blk 0: the type runs plain
    size_t r16_blk;                          // bytes per 16 rows x 32 columns (a K block: 8 of these)
    rase_r16_repack_fn r16_repack;
    rase_r16_unpack_fn r16_unpack;
    rase_r16_fn r16[RASE_ISA_COUNT];         // a group x a tile of tokens
    int r16_tile;                            // tokens per r16 call
    rase_r16_panel_fn r16_panel[RASE_ISA_COUNT];  // optional: a group's T tokens over a panel
    int r16_panel_min;                       // tokens from which the panel pays (0: RASE_R16_PANEL_MIN)
    int block_sum;                           // 1: block-sum numerics (_repack_bs.h), not llama.cpp's order
    rase_quantize_fn quantize[RASE_ISA_COUNT];  // f32 rows -> blocks, llama.cpp's quantizer's bytes (_quantize.h)
} rase_type_traits;

#endif  // RASE_TYPES_H
