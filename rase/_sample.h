// rase/_sample.h: token sampling over one logits row, without Python objects.
//
// Order (llama.cpp's default chain, minus what is not configured): logit bias -> penalties -> top-k ->
// temperature -> softmax -> top-p -> min-p -> draw. temperature == 0 is greedy (lowest index
// among equal maxima). The RNG is explicit (xoshiro256**, seeded by splitmix64) so the same
// seed gives the same tokens.
#ifndef RASE_SAMPLE_H
#define RASE_SAMPLE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct { uint64_t s[4]; } rase_rng;

static inline uint64_t rase_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline void rase_rng_seed(rase_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; ++i) r->s[i] = rase_splitmix64(&seed);
}

static inline uint64_t rase_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t rase_rng_next(rase_rng *r) {
    uint64_t *s = r->s;
    const uint64_t result = rase_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rase_rotl(s[3], 45);
    return result;
}

static inline double rase_rng_uniform(rase_rng *r) { return (double)(rase_rng_next(r) >> 11) * 0x1.0p-53; }

typedef struct {
    float temperature;       // 0: greedy
    int top_k;               // <= 0: whole vocabulary
    float top_p;             // 1: off
    float min_p;             // 0: off
    float repeat_penalty;    // 1: off; divides positive / multiplies negative logits of seen tokens
    float presence_penalty;  // subtracted once from seen tokens
    float frequency_penalty; // subtracted per occurrence
    const float *bias;       // (n) added to the logits first (OpenAI's logit_bias), or NULL
} rase_sampling;

typedef struct { float logit; int32_t id; } rase_cand;

static int rase_cand_desc(const void *a, const void *b) {
    const rase_cand *x = (const rase_cand *)a, *y = (const rase_cand *)b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id - y->id;  // ties: lower id first (deterministic)
}

// candidate order: higher logit first, ties to the lower id (a total order: sets and sorts are
// deterministic)
static inline int rase_cand_before(rase_cand a, rase_cand b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// heap[0..k) is a min-heap in that order (heap[0] the last of the k kept); restore from i down
static inline void rase_heap_down(rase_cand *heap, int32_t k, int32_t i) {
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= k) return;
        if (c + 1 < k && rase_cand_before(heap[c], heap[c + 1])) ++c;  // the later of the two children
        if (!rase_cand_before(heap[i], heap[c])) return;
        const rase_cand t = heap[i]; heap[i] = heap[c]; heap[c] = t;
        i = c;
    }
}

static inline float rase_penalized(const float *logits, const int32_t *counts, const rase_sampling *p, int penalize,
                                   int32_t i) {
    float l = p->bias ? logits[i] + p->bias[i] : logits[i];
    if (penalize && counts[i] > 0) {
        if (p->repeat_penalty != 1.0f) l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
        l = l - p->presence_penalty - p->frequency_penalty * (float)counts[i];
    }
    return l;
}

#define RASE_SAMPLE_INVALID (-1)  // a logit is NaN/inf after the penalties
#define RASE_SAMPLE_NONE (-2)     // the mask allows no token

// token i allowed by the bitmask (ceil(n / 32) words, llguidance's layout; NULL: every token)
static inline int rase_allowed(const uint32_t *allow, int32_t i) {
    return !allow || (allow[i >> 5] >> (i & 31)) & 1u;
}

// Returns the sampled id, RASE_SAMPLE_INVALID or RASE_SAMPLE_NONE. logits (n) are only read;
// counts (n) = occurrences so far (or NULL); work holds n candidates; allow: the grammar's
// bitmask or NULL. Masked ids are never candidates: top-k, top-p, min-p and the draw see the
// allowed ids only (k = min(top_k, allowed)); with allow NULL the bits are those of no mask.
// One pass applies the penalties, checks finiteness and keeps the top_k best (a heap), so the
// cost is ~n compares, not a copy and selection of the whole vocabulary.
static int32_t rase_sample(const float *logits, int32_t n, const int32_t *counts, const rase_sampling *p,
                           rase_rng *rng, rase_cand *work, const uint32_t *allow) {
    const int penalize = counts && (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f ||
                                    p->frequency_penalty != 0.0f);
    if (p->temperature == 0.0f) {  // greedy: the first maximum
        int32_t best = -1;
        float bl = -INFINITY;
        for (int32_t i = 0; i < n; ++i) {
            const float l = rase_penalized(logits, counts, p, penalize, i);
            if (!isfinite(l)) return RASE_SAMPLE_INVALID;
            if (rase_allowed(allow, i) && (best < 0 || l > bl)) { best = i; bl = l; }
        }
        return best < 0 ? RASE_SAMPLE_NONE : best;
    }
    // top-k: the k first candidates in rase_cand_before order, then sorted
    const int32_t k = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    int32_t m = 0;
    for (int32_t i = 0; i < n; ++i) {
        const rase_cand c = {rase_penalized(logits, counts, p, penalize, i), i};
        if (!isfinite(c.logit)) return RASE_SAMPLE_INVALID;
        if (!rase_allowed(allow, i)) continue;
        if (m < k) {
            work[m++] = c;
            if (m == k)
                for (int32_t j = k / 2 - 1; j >= 0; --j) rase_heap_down(work, k, j);
        } else if (rase_cand_before(c, work[0])) {
            work[0] = c;
            rase_heap_down(work, k, 0);
        }
    }
    if (m == 0) return RASE_SAMPLE_NONE;
    qsort(work, (size_t)m, sizeof(rase_cand), rase_cand_desc);
    // temperature and softmax (in double for the sums)
    const double t = p->temperature, peak = work[0].logit / t;
    double total = 0.0;
    for (int32_t i = 0; i < m; ++i) {
        const double w = exp(work[i].logit / t - peak);
        work[i].logit = (float)w;
        total += w;
    }
    if (!(total > 0.0) || !isfinite(total)) return RASE_SAMPLE_INVALID;
    // top-p: the smallest prefix whose mass reaches p; min-p: relative to the most likely
    int32_t keep = m;
    if (p->top_p < 1.0f) {
        double cum = 0.0;
        for (int32_t i = 0; i < m; ++i) {
            cum += work[i].logit / total;
            if (cum >= p->top_p) { keep = i + 1; break; }
        }
    }
    if (p->min_p > 0.0f) {
        const double floor_w = p->min_p * (double)work[0].logit;
        int32_t j = 1;
        while (j < keep && work[j].logit >= floor_w) ++j;
        keep = j;
    }
    double mass = 0.0;
    for (int32_t i = 0; i < keep; ++i) mass += work[i].logit;
    double r = rase_rng_uniform(rng) * mass;
    for (int32_t i = 0; i < keep; ++i) {
        r -= work[i].logit;
        if (r < 0.0) return work[i].id;
    }
    return work[keep - 1].id;
}

#endif  // RASE_SAMPLE_H
