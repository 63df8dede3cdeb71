// rase/kernels/_traits.h: ONE row per ggml type (rase_type_traits, _types.h): its layout, activation
// format and every kernel it runs, per ISA; then what reads the rows: the lookups and the
// matrix-level drivers of the repacked layout. Adding a type: its blocks in _types.h, its
// kernels in their header, its row here, its tests (docs/adding-a-quant-type.md).
#ifndef RASE_TRAITS_H
#define RASE_TRAITS_H

#include "_quants.h"
#include "_dot.h"
#include "_repack_q.h"
#include "_repack_bs.h"
#include "_repack_k.h"
#include "_repack_q6k.h"
#include "_repack_mxfp4.h"
#include "_quantize.h"


// A panel only where unpacking a block costs more than reading it back (Q5_1: the fifth-bit
// masks; Q6_K: two planes and the high bits per value; measured slower for Q4_1, Q8_0 at 6-16 tokens).
static const rase_type_traits rase_type_traits_table[RASE_GGML_TYPE_COUNT] = {
    [RASE_TYPE_F32] = {"F32", 1, 4, ACT_F32, {dequant_row_f32_ref, dequant_row_f32_ref},
                       .dotn = RASE_ISA_ROW(dotn_f32_ref, dotn_f32_avx2, 0),
                       .quantize = RASE_ISA_ROW(quant_row_f32_ref, 0, 0)},
    [RASE_TYPE_F16] = {"F16", 1, 2, ACT_F32, RASE_ISA_ROW(dequant_row_f16_ref, dequant_row_f16_avx2, 0),
                       .dotn = RASE_ISA_ROW(dotn_f16_ref, dotn_f16_avx2, dotn_f16_512),
                       .rows = RASE_ISA_ROW(0, rase_f16_rows_avx2, rase_f16_rows_512), .rows_act = ACT_F32C,
                       .rows_min = 16,
                       .quantize = RASE_ISA_ROW(quant_row_f16_ref, quant_row_f16_avx2, 0)},
    [RASE_TYPE_BF16] = {"BF16", 1, 2, ACT_F32, RASE_ISA_ROW(dequant_row_bf16_ref, dequant_row_bf16_avx2, 0),
                        .dotn = RASE_ISA_ROW(dotn_bf16_ref, dotn_bf16_avx2, 0),
                        .quantize = RASE_ISA_ROW(quant_row_bf16_ref, 0, 0)},
    [RASE_TYPE_Q4_0] = {"Q4_0", 32, 18, ACT_Q8_0, RASE_ISA_ROW(dequant_row_q4_0_ref, dequant_row_q4_0_avx2, 0),
                        .r16_blk = sizeof(r16_q4_0), .r16_repack = r16_repack_q4_0, .r16_unpack = r16_unpack_q4_0,
                        .r16 = RASE_ISA_ROW_I8MM(r16_q4_0_ref, r16_q4_0_avx2, r16_q4_0_vnni, r16_q4_0_neon, r16_q4_0_sdot,
                                                 r16_q4_0_mmla), .r16_tile = RASE_R16_TILE,
                        .block_sum = 1,
                        .quantize = RASE_ISA_ROW(quant_row_q4_0_ref, 0, 0)},
    [RASE_TYPE_Q4_1] = {"Q4_1", 32, 20, ACT_Q8_1, RASE_ISA_ROW(dequant_row_q4_1_ref, dequant_row_q4_1_avx2, 0),
                        .r16_blk = sizeof(r16_q4_1), .r16_repack = r16_repack_q4_1, .r16_unpack = r16_unpack_q4_1,
                        .r16 = RASE_ISA_ROW_NEON(r16_q4_1_ref, r16_q4_1_avx2, r16_q4_1_vnni, r16_q4_1_neon, r16_q4_1_sdot), .r16_tile = RASE_R16_TILE,
                        .quantize = RASE_ISA_ROW(quant_row_q4_1_ref, 0, 0)},
    [RASE_TYPE_Q5_0] = {"Q5_0", 32, 22, ACT_Q8_0, RASE_ISA_ROW(dequant_row_q5_0_ref, dequant_row_q5_0_avx2, 0),
                        .r16_blk = sizeof(r16_q5_0), .r16_repack = r16_repack_q5_0, .r16_unpack = r16_unpack_q5_0,
                        .r16 = RASE_ISA_ROW_I8MM(r16_q5_0_ref, r16_q5_0_avx2, r16_q5_0_vnni, r16_q5_0_neon, r16_q5_0_sdot,
                                                 r16_q5_0_mmla), .r16_tile = RASE_R16_TILE,
                        .block_sum = 1,
                        .quantize = RASE_ISA_ROW(quant_row_q5_0_ref, 0, 0)},
    [RASE_TYPE_Q5_1] = {"Q5_1", 32, 24, ACT_Q8_1, RASE_ISA_ROW(dequant_row_q5_1_ref, dequant_row_q5_1_avx2, 0),
                        .r16_blk = sizeof(r16_q5_1), .r16_repack = r16_repack_q5_1, .r16_unpack = r16_unpack_q5_1,
                        .r16 = RASE_ISA_ROW_NEON(r16_q5_1_ref, r16_q5_1_avx2, r16_q5_1_vnni, r16_q5_1_neon, r16_q5_1_sdot), .r16_tile = RASE_R16_TILE,
                        .r16_panel = RASE_ISA_ROW(0, 0, r16_q5_1_vnni_panel),
                        .quantize = RASE_ISA_ROW(quant_row_q5_1_ref, 0, 0)},
    [RASE_TYPE_Q8_0] = {"Q8_0", 32, 34, ACT_Q8_0, RASE_ISA_ROW(dequant_row_q8_0_ref, dequant_row_q8_0_avx2, 0),
                        .r16_blk = sizeof(r16_q8_0), .r16_repack = r16_repack_q8_0, .r16_unpack = r16_unpack_q8_0,
                        .r16 = RASE_ISA_ROW_NEON(r16_q8_0_ref, r16_q8_0_avx2, r16_q8_0_vnni, r16_q8_0_neon, r16_q8_0_sdot), .r16_tile = RASE_R16_TILE,
                        .quantize = RASE_ISA_ROW(quant_row_q8_0_ref, quant_row_q8_0_avx2, 0)},
    [RASE_TYPE_Q2_K] = {"Q2_K", 256, 84, ACT_Q8_K, RASE_ISA_ROW(dequant_row_q2_k_ref, dequant_row_q2_k_avx2, 0),
                        .dotn = RASE_ISA_ROW(dotn_q2_k_ref, dotn_q2_k_avx2, 0)},
    [RASE_TYPE_Q3_K] = {"Q3_K", 256, 110, ACT_Q8_K, RASE_ISA_ROW(dequant_row_q3_k_ref, dequant_row_q3_k_avx2, 0),
                        .dotn = RASE_ISA_ROW(dotn_q3_k_ref, dotn_q3_k_avx2, 0)},
    [RASE_TYPE_Q4_K] = {"Q4_K", 256, 144, ACT_Q8_K, RASE_ISA_ROW(dequant_row_q4_k_ref, dequant_row_q4_k_avx2, 0),
                        .r16_blk = sizeof(r16_q4_k) / 8, .r16_repack = r16_repack_q4_k, .r16_unpack = r16_unpack_q4_k,
                        .r16 = RASE_ISA_ROW_I8MM(r16_q4_k_ref, r16_q4_k_avx2, r16_q4_k_vnni, r16_q4_k_neon, r16_q4_k_sdot,
                                                 r16_q4_k_mmla), .r16_tile = RASE_R16_TILE,
                        .quantize = RASE_ISA_ROW(quant_row_q4_k_ref, quant_row_q4_k_avx2, 0)},
    [RASE_TYPE_Q5_K] = {"Q5_K", 256, 176, ACT_Q8_K, RASE_ISA_ROW(dequant_row_q5_k_ref, dequant_row_q5_k_avx2, 0),
                        .r16_blk = sizeof(r16_q5_k) / 8, .r16_repack = r16_repack_q5_k, .r16_unpack = r16_unpack_q5_k,
                        .r16 = RASE_ISA_ROW_I8MM(r16_q5_k_ref, r16_q5_k_avx2, r16_q5_k_vnni, r16_q5_k_neon, r16_q5_k_sdot,
                                                 r16_q5_k_mmla), .r16_tile = RASE_R16_TILE,
                        .quantize = RASE_ISA_ROW(quant_row_q5_k_ref, quant_row_q5_k_avx2, 0)},
    [RASE_TYPE_Q6_K] = {"Q6_K", 256, 210, ACT_Q8_K, RASE_ISA_ROW(dequant_row_q6_k_ref, dequant_row_q6_k_avx2, 0),
                        .r16_blk = sizeof(r16_q6_k) / 8, .r16_repack = rase_r16_repack_q6_k,
                        .r16_unpack = rase_r16_unpack_row_q6_k,
                        .r16 = RASE_ISA_ROW_NEON(r16_q6_k_ref, r16_q6_k_avx2, r16_q6_k_vnni, r16_q6_k_neon, r16_q6_k_sdot), .r16_tile = RASE_R16_TILE,
                        .r16_panel = RASE_ISA_ROW(0, 0, r16_q6_k_vnni_panel),
                        .r16_panel_min = 12,  // measured: 168 vs 165 GOPS from 12 tokens; 4: 128 vs 165
                        .quantize = RASE_ISA_ROW(quant_row_q6_k_ref, quant_row_q6_k_avx2, 0)},
    [RASE_TYPE_MXFP4] = {"MXFP4", 32, 17, ACT_Q8_0, RASE_ISA_ROW(dequant_row_mxfp4_ref, dequant_row_mxfp4_avx2, 0),
                         .r16_blk = sizeof(r16_mxfp4), .r16_repack = r16_repack_mxfp4, .r16_unpack = r16_unpack_mxfp4,
                         .r16 = RASE_ISA_ROW(r16_mxfp4_ref, r16_mxfp4_avx2, r16_mxfp4_vnni), .r16_tile = RASE_R16_TILE},
};

static inline const rase_type_traits *rase_traits(int type) { return &rase_type_traits_table[type]; }

// a kernel of an ISA row: the level's own, else the nearest level below (the scalar reference last)
#define RASE_FOR_ISA(row, isa)                                                                     \
    ({ int i_ = (isa); while (i_ > 0 && !(row)[i_]) --i_; (row)[i_]; })

static inline rase_dequant_fn rase_dequant_for(int type, int isa) { return RASE_FOR_ISA(rase_traits(type)->dequant, isa); }
static inline rase_dotn_fn rase_dotn_for(int type, int isa) { return RASE_FOR_ISA(rase_traits(type)->dotn, isa); }
static inline rase_r16_fn rase_r16_for(int type, int isa) { return RASE_FOR_ISA(rase_traits(type)->r16, isa); }
static inline rase_quantize_fn rase_quantize_for(int type, int isa) { return RASE_FOR_ISA(rase_traits(type)->quantize, isa); }

// the GEMM for T tokens of a plain (rows x n) matrix of `type`, or NULL (then dotn row by row).
// A kernel may be chosen by the number of tokens (the F16 GEMM from rows_min); the invariant is
// that every choice gives the same bits (tests/kernels/test_kernels.py)
static inline rase_rows_fn rase_rows_for(int type, int isa, int T, int64_t n) {
    const rase_type_traits *tr = rase_traits(type);
    return T >= tr->rows_min && T > 1 && n % 32 == 0 ? tr->rows[isa] : 0;
}

// the activation format a plain matrix's T-token product reads
static inline int rase_act_for(int type, int isa, int T, int64_t n) {
    return rase_rows_for(type, isa, T, n) ? rase_traits(type)->rows_act : rase_traits(type)->act;
}

// ---------------------------------------------------------------- repacked matrices

// bytes of a repacked (rows x n) matrix
static inline size_t rase_r16_bytes(int type, int64_t rows, int64_t n) {
    return (size_t)((rows + RASE_R16 - 1) / RASE_R16) * (size_t)(n / 32) * rase_traits(type)->r16_blk;
}

// Y[t * ys + r] for rows [r0, r1) (r0 a multiple of 16) of a repacked (rows x n) matrix and T
// tokens of A (rows `as` bytes apart), group by group: through the ISA's panel kernel from the
// type's panel_min tokens (work: the thread's, or NULL), else tiles of the type's tile of tokens.
static void rase_r16_rows(int isa, int type, const uint8_t *packed, int64_t group_bytes, int64_t n, const uint8_t *A,
                          size_t as, int T, float *Y, int64_t ys, int64_t r0, int64_t r1, uint8_t *work) {
    const rase_type_traits *tr = rase_traits(type);
    const rase_r16_fn kern = rase_r16_for(type, isa);
    const int panel_min = tr->r16_panel_min ? tr->r16_panel_min : RASE_R16_PANEL_MIN;
    const rase_r16_panel_fn panel = T >= panel_min && work ? tr->r16_panel[isa] : 0;
    for (int64_t g = r0 / RASE_R16; g * RASE_R16 < r1; ++g) {
        const uint8_t *pg = packed + g * group_bytes;
        const int nr = r1 - g * RASE_R16 < RASE_R16 ? (int)(r1 - g * RASE_R16) : RASE_R16;
        if (panel) {
            panel(n, pg, A, as, T, Y + g * RASE_R16, ys, nr, work);
            continue;
        }
        for (int t0 = 0; t0 < T; t0 += tr->r16_tile) {
            const int nt = T - t0 < tr->r16_tile ? T - t0 : tr->r16_tile;
            kern(n, pg, A + (size_t)t0 * as, as, nt, Y + (int64_t)t0 * ys + g * RASE_R16, ys, nr);
        }
    }
}

// groups [g0, g1) of the matrix, split over n_threads (at load, outside any forward)
static void rase_r16_repack(int type, const uint8_t *src, int64_t row_bytes, int64_t rows, int64_t n, uint8_t *dst,
                            int64_t g0, int64_t g1, int n_threads) {
    const rase_r16_repack_fn repack = rase_traits(type)->r16_repack;
    const size_t group = (size_t)(n / 32) * rase_traits(type)->r16_blk;
    (void)n_threads;  // used by the pragma
#pragma omp parallel for num_threads(n_threads) schedule(static) if (g1 - g0 >= 64)
    for (int64_t g = g0; g < g1; ++g) repack(src, row_bytes, rows, n, g, dst + g * group);
}

// Row `row` of a repacked (rows x n) matrix back in ggml's plain blocks (dst: n / blck blocks),
// the inverse of the repack (a permutation of the same bytes): the tied token embedding is looked
// up from the output matrix's repacked copy, so the file's rows are never read after load.
static void rase_r16_unpack_row(int type, const uint8_t *packed, int64_t group_bytes, int64_t n, int64_t row,
                                uint8_t *dst) {
    rase_traits(type)->r16_unpack(packed + (row / RASE_R16) * group_bytes, n, (int)(row % RASE_R16), dst);
}

#endif  // RASE_TRAITS_H
