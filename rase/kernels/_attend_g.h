// rase/kernels/_attend_g.h: the grouped attention kernel, included at the top of _attention.h once per
// width: RASE_ATTN(name) names this width's functions, RASE_ATTN_TARGET its ISA, RASE_ATTN_WIDE 0
// (ymm, AVX2) or 1 (zmm, AVX-512). Both widths run the same FMA chains lane for lane, so they give
// the same bits. RASE_ATTN(_g) is the whole kernel; _scores, _finish and _reduce its phases, which
// threads may split (keys, slots, head elements: RASE_ATTN(_split)); RASE_ATTN() the entry.
#include "_kv.h"

// Scores of keys [ja, jb) for G queries whose f16-rounded q is qf[h]: s[h][j] = scale * (q . k_j),
// per key and query the 8-lane sum x of the four chains, then x's horizontal sum
// (rase_avx2_reduce4's order), 8 keys at a time through rase_avx2_reduce8x (the same adds)
RASE_ATTN_TARGET static inline __attribute__((always_inline)) void RASE_ATTN(_scores)(
        const int G, const float *const *qf, const rase_kv_view *kv, int ja, int jb, int hd, float scale,
        float *const *s) {
    __m256 xs[RASE_ATTN_G][8];
    int nx = 0, jx = ja;  // keys waiting in xs, the first of them
    const int bend = (jb + RASE_KV_BLOCK - 1) / RASE_KV_BLOCK;
    for (int b = ja / RASE_KV_BLOCK; b * RASE_KV_BLOCK < jb; ++b) {  // block by block through the table
        const uint16_t *k = kv->k;
        RASE_ROWS(k, b, ja, jb, lo, hi);
        // the same rows RASE_KV_PF_QK blocks on (none past the last block)
        const int64_t ahead = b + RASE_KV_PF_QK < bend
            ? ((int64_t)kv->table[b + RASE_KV_PF_QK] - kv->table[b]) * kv->block_stride : 0;
        for (int j = lo; j < hi; ++j, k += kv->row_stride) {
            if (ahead) rase_kv_prefetch_row(k + ahead, hd);
#if RASE_ATTN_WIDE  // zmm c2 holds accumulators 2 c2 | 2 c2 + 1: the same four chains
            __m512 acc[RASE_ATTN_G][2];
            for (int h = 0; h < G; ++h) acc[h][0] = acc[h][1] = _mm512_setzero_ps();
            for (int i = 0; i < hd; i += 32)
                for (int c2 = 0; c2 < 2; ++c2) {
                    const __m512 kf = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + i + 16 * c2)));
                    for (int h = 0; h < G; ++h)
                        acc[h][c2] = _mm512_fmadd_ps(kf, _mm512_loadu_ps(qf[h] + i + 16 * c2), acc[h][c2]);
                }
            for (int h = 0; h < G; ++h) {  // (a0 + a2) + (a1 + a3)
                const __m512 z = _mm512_add_ps(acc[h][0], acc[h][1]);
                xs[h][nx] = _mm256_add_ps(_mm512_castps512_ps256(z), rase_512_hi(z));
            }
#else
            __m256 acc[RASE_ATTN_G][4];
            for (int h = 0; h < G; ++h)
                for (int c = 0; c < 4; ++c) acc[h][c] = _mm256_setzero_ps();
            for (int i = 0; i < hd; i += 32)  // accumulator c takes elements 32 m + 8 c .. + 7
                for (int c = 0; c < 4; ++c) {
                    const __m256 kf = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i + 8 * c)));
                    for (int h = 0; h < G; ++h)
                        acc[h][c] = _mm256_fmadd_ps(kf, _mm256_loadu_ps(qf[h] + i + 8 * c), acc[h][c]);
                }
            for (int h = 0; h < G; ++h)
                xs[h][nx] = _mm256_add_ps(_mm256_add_ps(acc[h][0], acc[h][2]), _mm256_add_ps(acc[h][1], acc[h][3]));
#endif
            if (++nx == 8) {
                for (int h = 0; h < G; ++h)
                    _mm256_storeu_ps(s[h] + jx, _mm256_mul_ps(rase_avx2_reduce8x(xs[h]), _mm256_set1_ps(scale)));
                nx = 0, jx = j + 1;
            }
        }
    }
    for (int h = 0; h < G; ++h)
        for (int q = 0; q < nx; ++q) s[h][jx + q] = rase_avx2_reduce_x(xs[h][q]) * scale;
}

#if RASE_ATTN_WIDE
#  define RASE_PV_VEC __m512
#  define RASE_PV_W 16  // elements of the head per register: two 8-element chains side by side
#  define RASE_PV_ZERO _mm512_setzero_ps
#  define RASE_PV_LOAD(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#  define RASE_PV_FMA(v, p, acc) _mm512_fmadd_ps(v, _mm512_set1_ps(p), acc)
#  define RASE_PV_STORE _mm512_storeu_ps
#  define RASE_PV_LOADF _mm512_loadu_ps
#  define RASE_PV_REGS 24  // of 32 zmm
#else
#  define RASE_PV_VEC __m256
#  define RASE_PV_W 8
#  define RASE_PV_ZERO _mm256_setzero_ps
#  define RASE_PV_LOAD(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#  define RASE_PV_FMA(v, p, acc) _mm256_fmadd_ps(v, _mm256_set1_ps(p), acc)
#  define RASE_PV_STORE _mm256_storeu_ps
#  define RASE_PV_LOADF _mm256_loadu_ps
#  define RASE_PV_REGS 12  // of 16 ymm
#endif

// One P.V pass: slots s0 .. s0 + SG - 1 x ICC register chunks of the head from element i, over
// the blocks [g0, g1) of a group (asking for its rows of the next group, [g1, g2)); accumulators
// loaded from and stored to the partial sums at part (zero at the first group, b0).
RASE_ATTN_TARGET static inline __attribute__((always_inline)) void RASE_ATTN(_pv)(
        const int G, const int SG, const int ICC, const rase_kv_view *kv, int j0, int j1, int hd, int b0, int g0,
        int g1, int g2, int s0, int i, const float *scratch, int64_t qstride, float *part) {
    RASE_PV_VEC acc[RASE_ATTN_G][4][4];
    for (int h = 0; h < G; ++h)
        for (int k = 0; k < SG; ++k)
            for (int c = 0; c < ICC; ++c)
                acc[h][k][c] = g0 == b0 ? RASE_PV_ZERO()
                    : RASE_PV_LOADF(part + h * qstride + (int64_t)(s0 + k) * hd + i + c * RASE_PV_W);
    for (int b = g1; b < g2; ++b)
        for (int k = 0; k < SG; ++k)
            rase_kv_prefetch_row(kv->v + (int64_t)kv->table[b] * kv->block_stride + i +
                                 (int64_t)(s0 + k) * kv->row_stride, ICC * RASE_PV_W);
    for (int b = g0; b < g1; ++b) {
        const uint16_t *v = kv->v + (int64_t)kv->table[b] * kv->block_stride + i;
        for (int k = 0; k < SG; ++k) {
            const int j = b * RASE_KV_BLOCK + s0 + k;
            if (j < j0 || j >= j1) continue;
            const uint16_t *vr = v + (int64_t)(s0 + k) * kv->row_stride;
            for (int c = 0; c < ICC; ++c) {
                const RASE_PV_VEC vf = RASE_PV_LOAD(vr + c * RASE_PV_W);
                for (int h = 0; h < G; ++h) acc[h][k][c] = RASE_PV_FMA(vf, scratch[h * qstride + j], acc[h][k][c]);
            }
        }
    }
    for (int h = 0; h < G; ++h)
        for (int k = 0; k < SG; ++k)
            for (int c = 0; c < ICC; ++c)
                RASE_PV_STORE(part + h * qstride + (int64_t)(s0 + k) * hd + i + c * RASE_PV_W, acc[h][k][c]);
}

// Softmax, then the P.V partial sums of slots [k0, k1) (multiples of 4) into part + h * qstride
// (32 x hd floats a query): the scores of keys [j0, j1) come from src[h] (the query's own
// scratch, or a buffer another thread filled); scratch + h * qstride holds them padded to 32
// with -inf, then p. sinks: (G,) sink logits (rase_sink_term) or NULL.
RASE_ATTN_TARGET static inline __attribute__((always_inline)) void RASE_ATTN(_finish)(
        const int G, const float *const *src, const rase_kv_view *kv, int j0, int j1, int hd, int k0, int k1,
        float softcap, const float *sinks, float *scratch, int64_t qstride, float *part) {
    const int n = (j1 + 31) & ~31;
    float mx[RASE_ATTN_G];
    for (int h = 0; h < G; ++h) {
        float *s = scratch + h * qstride;
        if (src[h] != s) memcpy(s + j0, src[h] + j0, (size_t)(j1 - j0) * sizeof(float));
        for (int j = 0; j < j0; ++j) s[j] = -INFINITY;
        for (int j = j1; j < n; ++j) s[j] = -INFINITY;
        __m256 mxv = _mm256_set1_ps(-INFINITY);
        for (int j = 0; j < n; j += 8) mxv = _mm256_max_ps(_mm256_loadu_ps(s + j), mxv);  // a NaN score is never the max
        float m8[8];
        _mm256_storeu_ps(m8, mxv);
        mx[h] = -INFINITY;
        for (int l = 0; l < 8; ++l)
            if (m8[l] > mx[h]) mx[h] = m8[l];
    }
    if (softcap > 0.0f)
        for (int h = 0; h < G; ++h) mx[h] = rase_softcap(scratch + h * qstride, j0, j1, softcap);
    for (int h = 0; h < G; ++h) {
        float *s = scratch + h * qstride;
        const float sink = sinks ? sinks[h] : -INFINITY;
        mx[h] = mx[h] > sink ? mx[h] : sink;
        double sum = 0.0;
        for (int j = 0; j < n; j += 8) {
            const __m256 e = rase_avx2_expf(_mm256_sub_ps(_mm256_loadu_ps(s + j), _mm256_set1_ps(mx[h])));
            _mm256_storeu_ps(s + j, e);
            sum += (double)rase_avx2_hsum(e);
        }
        sum += rase_sink_term(sink, mx[h]);
        const __m256 inv = _mm256_set1_ps((float)(1.0 / sum));
        for (int j = 0; j < n; j += 8)  // p rounded to f16, kept as f32 values
            _mm256_storeu_ps(s + j, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(s + j), inv), 0)));
    }
    // P.V: partial sums per slot (position mod 32 = row of a block), each a sequential FMA chain
    // over the valid positions of that slot in order. The blocks go in groups of RASE_PV_GROUP; in a
    // group, passes of SG slots x IC chunks of the head (x G queries) in registers, loaded from
    // and stored to the partial sums (zero for the first group), so each V row is read once and
    // the reads stay inside one group while each pass asks for its rows of the next group.
    const int SG = G >= 3 ? 2 : 4;
    const int b0 = j0 / RASE_KV_BLOCK, b1 = (j1 + RASE_KV_BLOCK - 1) / RASE_KV_BLOCK;
    // IC register-blocked chunks of the head per pass: each V row is read once per pass, not
    // once per chunk
    const int nchunk = hd / RASE_PV_W;
    const int IC = G * SG * 4 <= RASE_PV_REGS && nchunk % 4 == 0 ? 4 : G * SG * 2 <= RASE_PV_REGS && nchunk % 2 == 0 ? 2 : 1;
    for (int g0 = b0; g0 < b1; g0 += RASE_PV_GROUP) {
        const int g1 = g0 + RASE_PV_GROUP < b1 ? g0 + RASE_PV_GROUP : b1;
        const int g2 = g1 + RASE_PV_GROUP < b1 ? g1 + RASE_PV_GROUP : b1;
        for (int s0 = k0; s0 < k1; s0 += SG)
            for (int i = 0; i < hd; i += RASE_PV_W * IC) {
                if (IC == 4) RASE_ATTN(_pv)(G, SG, 4, kv, j0, j1, hd, b0, g0, g1, g2, s0, i, scratch, qstride, part);
                else if (IC == 2) RASE_ATTN(_pv)(G, SG, 2, kv, j0, j1, hd, b0, g0, g1, g2, s0, i, scratch, qstride, part);
                else RASE_ATTN(_pv)(G, SG, 1, kv, j0, j1, hd, b0, g0, g1, g2, s0, i, scratch, qstride, part);
            }
    }
}

// out[h] elements [d0, d1) (multiples of 8) from the 32 partial sums at part + h * qstride
RASE_ATTN_TARGET static inline __attribute__((always_inline)) void RASE_ATTN(_reduce)(
        const int G, const float *part0, int64_t qstride, int hd, int d0, int d1, float *const *out) {
    for (int h = 0; h < G; ++h) {
        const float *part = part0 + h * qstride;
        for (int i = d0; i < d1; i += 8) {  // lane l of accumulator c holds slot 8c + l; reduce as ggml
            __m256 z[8];
            for (int l = 0; l < 8; ++l) {
                const float *pl = part + l * hd + i;
                z[l] = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(pl), _mm256_loadu_ps(pl + 16 * hd)),
                                     _mm256_add_ps(_mm256_loadu_ps(pl + 8 * hd), _mm256_loadu_ps(pl + 24 * hd)));
            }
            // 128-bit halves, then two hadds: (z0+z4 + z1+z5) + (z2+z6 + z3+z7)
            const __m256 r = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(z[0], z[4]), _mm256_add_ps(z[1], z[5])),
                                           _mm256_add_ps(_mm256_add_ps(z[2], z[6]), _mm256_add_ps(z[3], z[7])));
            _mm256_storeu_ps(out[h] + i, r);
        }
    }
}


// The whole attention of G queries (up to RASE_ATTN_G) over keys [j0, j1): q rounded to f16
// into scratch, then the scores and the finish above, all head elements.
RASE_ATTN_TARGET static inline __attribute__((always_inline)) void RASE_ATTN(_g)(
        const int G, const float *const *q, const rase_kv_view *kv, int j0, int j1, int hd, float scale,
        float softcap, const float *sinks, float *scratch, int64_t qstride, float *const *out) {
    const int64_t qoff = rase_attend_qoff(j1, hd);
    float *s[RASE_ATTN_G], *qf[RASE_ATTN_G];
    for (int h = 0; h < G; ++h) {
        s[h] = scratch + h * qstride, qf[h] = s[h] + qoff;
        for (int i = 0; i < hd; i += 8)
            _mm256_storeu_ps(qf[h] + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(q[h] + i), 0)));
    }
    RASE_ATTN(_scores)(G, (const float *const *)qf, kv, j0, j1, hd, scale, s);
    float *part = scratch + rase_attend_partoff(j1);
    RASE_ATTN(_finish)(G, (const float *const *)s, kv, j0, j1, hd, 0, 32, softcap, sinks, scratch, qstride, part);
    RASE_ATTN(_reduce)(G, part, qstride, hd, 0, hd, out);
}

// the entry: g (1..RASE_ATTN_G) queries, g a constant in each instance (the per-query loops unroll)
RASE_ATTN_TARGET static void RASE_ATTN()(int g, const float *const *q, const rase_kv_view *kv, int j0, int j1, int hd,
                                        float scale, float cap, const float *sinks, float *scratch, int64_t qstride,
                                        float *const *out) {
    RASE_CONST_NT(RASE_ATTN_G, g, RASE_ATTN(_g), q, kv, j0, j1, hd, scale, cap, sinks, scratch, qstride, out);
}

// the three phases of one group's attention, split over threads (rase_attend_split)
RASE_ATTN_TARGET static void RASE_ATTN(_split)(int phase, int g, const float *const *q, const rase_kv_view *kv, int j0,
                                              int j1, int hd, float scale, float cap, const float *sinks, int lo,
                                              int hi, int parts, float *shared, float *scratch, int64_t qstride,
                                              float *const *out) {
    float *qf[RASE_ATTN_G], *sh[RASE_ATTN_G];
    float *part = shared + rase_attend_partoff(j1);
    for (int h = 0; h < g; ++h) {
        qf[h] = scratch + h * qstride + rase_attend_qoff(j1, hd);
        sh[h] = shared + h * qstride;
    }
    const int ja = j0 + (int)((int64_t)(j1 - j0) * lo / parts), jb = j0 + (int)((int64_t)(j1 - j0) * hi / parts);
    const int k0 = 8 * lo / parts * 4, k1 = 8 * hi / parts * 4;
    const int d0 = hd / 8 * lo / parts * 8, d1 = hd / 8 * hi / parts * 8;
    const float *const *cq = (const float *const *)qf, *const *cs = (const float *const *)sh;
    if (phase == 0) {
        for (int h = 0; h < g; ++h)
            for (int i = 0; i < hd; i += 8)
                _mm256_storeu_ps(qf[h] + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(q[h] + i), 0)));
        RASE_CONST_NT(RASE_ATTN_G, g, RASE_ATTN(_scores), cq, kv, ja, jb, hd, scale, sh);
    } else if (phase == 1) {
        RASE_CONST_NT(RASE_ATTN_G, g, RASE_ATTN(_finish), cs, kv, j0, j1, hd, k0, k1, cap, sinks, scratch, qstride, part);
    } else {
        RASE_CONST_NT(RASE_ATTN_G, g, RASE_ATTN(_reduce), part, qstride, hd, d0, d1, out);
    }
}

#undef RASE_PV_VEC
#undef RASE_PV_W
#undef RASE_PV_ZERO
#undef RASE_PV_LOAD
#undef RASE_PV_LOADF
#undef RASE_PV_FMA
#undef RASE_PV_STORE
#undef RASE_PV_REGS
