// rase/kernels/_kv.h: a sequence's K/V as the attention kernels read them: the paged pool's block
// tables (rase_kv_view), the scratch layout of one attention call, and the constants and
// helpers the grouped kernels (_attend_g.h) share.
#ifndef RASE_KV_H
#define RASE_KV_H

#include "_types.h"

#define RASE_KV_BLOCK 32  // positions per KV block: the unit of allocation, sharing and caching

// A sequence's K/V rows for one layer and KV head. Position j lives in pool block
// table[j / RASE_KV_BLOCK], row j % RASE_KV_BLOCK.
typedef struct {
    const uint16_t *k, *v;  // block 0, row 0 of this layer and head (f16, or blocks in 2-byte units)
    const int32_t *table;   // the sequence's block ids
    int64_t block_stride;   // elements from one pool block to the next
    int64_t row_stride;     // elements from one position to the next inside a block
    int type;               // RASE_TYPE_F16, or the blocks of a quantized pool (Q8_0, Q4_0)
} rase_kv_view;

static inline int64_t rase_kv_off(const rase_kv_view *kv, int j) {
    return (int64_t)kv->table[j / RASE_KV_BLOCK] * kv->block_stride +
           (int64_t)(j % RASE_KV_BLOCK) * kv->row_stride;
}

// floats of scratch one attend call needs for sequences of up to n_ctx positions
static inline int64_t rase_attend_scratch(int64_t n_ctx, int hd) {
    return ((n_ctx + 31 + 64 + 7) & ~7) + 33 * (int64_t)hd;
}

// where a query's 32 P.V partial sums start in its scratch, past the scores of keys up to j1
// (padded to 32); its f16-rounded q follows them (both within rase_attend_scratch(j1, hd))
static inline int64_t rase_attend_partoff(int j1) { return (((j1 + 31) & ~31) + 64 + 7) & ~7; }
static inline int64_t rase_attend_qoff(int j1, int hd) { return rase_attend_partoff(j1) + 32 * (int64_t)hd; }

// sink: the head's learned logit in the softmax denominator (gpt-oss), -INFINITY for none (then
// max and sum are unchanged: expf(-inf) adds an exact 0). As ggml_compute_forward_soft_max_f32:
// max = MAX(max, sink), after the scores' sum sum += (double)expf(sink - max), libm's expf.
static inline double rase_sink_term(float sink, float mx) { return (double)expf(sink - mx); }

// s[j] = cap * tanh(s[j] / cap) for j in [j0, j1) (ggml_scale, ggml_tanh, ggml_scale: Gemma 2's
// soft-capping of attention scores, already scaled, and of logits); returns their new max
static float rase_softcap(float *s, int64_t j0, int64_t j1, float cap) {
    const float inv = 1.0f / cap;
    float mx = -INFINITY;
    for (int64_t j = j0; j < j1; ++j) {
        s[j] = tanhf(s[j] * inv) * cap;
        if (s[j] > mx) mx = s[j];
    }
    return mx;
}

// llama.cpp's one-token (decode) attention, step for step, so logits equal its n_batch = 1
// numerics: q rounded to f16; scores as ggml_vec_dot_f16 computes them (four 8-lane FMA
// accumulators, 32 elements per step); softmax over the length padded to 32 with ggml's exp
// and an f64 sum of 8-lane partial sums; probabilities rounded to f16; P.V in 32 slots by
// position, reduced as ggml reduces its accumulators.
// G query heads that share this KV head are served together: each K/V row is loaded and
// converted once; every query's own operations are those of G = 1. Query h uses scratch
// + h * qstride: scores (n + pad), 32 * hd partial sums, hd floats of q.
#define RASE_ATTN_G 4  // most query heads per call
#define RASE_ROWS(ptr, b, j0, j1, lo, hi)                                                       \
    const int lo = (b) * RASE_KV_BLOCK > (j0) ? (b) * RASE_KV_BLOCK : (j0);                    \
    const int hi = ((b) + 1) * RASE_KV_BLOCK < (j1) ? ((b) + 1) * RASE_KV_BLOCK : (j1);        \
    ptr += (int64_t)kv->table[b] * kv->block_stride + (int64_t)(lo - (b) * RASE_KV_BLOCK) * kv->row_stride

// The K/V rows of one head are row_stride apart inside a block of RASE_KV_BLOCK positions and
// the blocks lie anywhere in the pool (block_stride apart when a sequence's blocks were taken in
// order). The scores loop asks, with each key, for the same row RASE_KV_PF_QK blocks on. P.V
// reads its blocks in groups of RASE_PV_GROUP (256 positions; one group is 32 KiB of V at
// head_dim 64): each pass over a group asks for its rows of the next group, so the next group
// arrives while this one is read, and no pass strides through the whole context (a pass per
// slot pair over every block ran at half the speed of the same reads in cache at 4000
// positions). Prefetches and groups never change a result: each chain keeps its order.
#define RASE_KV_PF_QK 1
#define RASE_PV_GROUP 8
static inline void rase_kv_prefetch_row(const uint16_t *row, int hd) {
    for (int o = 0; o < hd * 2; o += 64) rase_prefetch((const char *)row + o);
}
#if RASE_HAVE_X86
RASE_TARGET_AVX512 static inline __m256 rase_512_hi(__m512 v) {
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}
#endif

#endif  // RASE_KV_H
