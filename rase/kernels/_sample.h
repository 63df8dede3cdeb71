// rase/kernels/_sample.h: token sampling over one logits row, without Python objects.
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
#include <string.h>

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

// candidates the caller's work buffer holds for a vocabulary of n: n kept candidates, then n
// more (the radix sort's second buffer, or the penalized logits as floats)
#define RASE_SAMPLE_WORK(n) (2 * (int64_t)(n))
#define RASE_SAMPLE_BLOCK 32  // elements per scanned block: one word of the allow mask

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

// x[0..len): bit 0 if an element is not finite, bit 1 if one is > thr. Branch-free over the
// block (the compiler vectorizes it), so blocks that cannot change the answer cost a few cycles.
static inline int rase_block_scan(const float *x, int32_t len, float thr) {
    uint32_t bad = 0, hit = 0;
    for (int32_t i = 0; i < len; ++i) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
        hit |= x[i] > thr;
    }
    return (int)(bad | hit << 1);
}

// the block of 32 ids from b0 has no allowed id
static inline int rase_block_masked(const uint32_t *allow, int32_t b0) { return allow && !allow[b0 >> 5]; }

// the first maximum among allowed ids, RASE_SAMPLE_INVALID or RASE_SAMPLE_NONE. A block is
// read element by element only if it holds a value > the best so far (strict: a later equal
// value never wins).
static int32_t rase_sample_greedy(const float *v, int32_t n, const uint32_t *allow) {
    int32_t best = -1;
    float bl = -INFINITY;
    for (int32_t b0 = 0; b0 < n; b0 += RASE_SAMPLE_BLOCK) {
        const int32_t len = n - b0 < RASE_SAMPLE_BLOCK ? n - b0 : RASE_SAMPLE_BLOCK;
        const int f = rase_block_scan(v + b0, len, bl);
        if (f & 1) return RASE_SAMPLE_INVALID;
        if (!(f & 2) || rase_block_masked(allow, b0)) continue;
        for (int32_t i = b0; i < b0 + len; ++i)
            if (rase_allowed(allow, i) && v[i] > bl) { best = i; bl = v[i]; }
    }
    return best < 0 ? RASE_SAMPLE_NONE : best;
}

// work[0..m) = the k first allowed candidates (a heap, unsorted); returns m, or -1 if a value is
// not finite. While the heap is full only blocks holding a value > its root are read element by
// element: ids increase, so an equal value comes after the root and never enters.
static int32_t rase_sample_heap(const float *v, int32_t n, int32_t k, rase_cand *work, const uint32_t *allow) {
    int32_t m = 0;
    for (int32_t b0 = 0; b0 < n; b0 += RASE_SAMPLE_BLOCK) {
        const int32_t len = n - b0 < RASE_SAMPLE_BLOCK ? n - b0 : RASE_SAMPLE_BLOCK;
        const int f = rase_block_scan(v + b0, len, m < k ? -INFINITY : work[0].logit);
        if (f & 1) return -1;
        if (!(f & 2) || rase_block_masked(allow, b0)) continue;
        for (int32_t i = b0; i < b0 + len; ++i) {
            if (!rase_allowed(allow, i)) continue;
            const rase_cand c = {v[i], i};
            if (m < k) {
                work[m++] = c;
                if (m == k)
                    for (int32_t j = k / 2 - 1; j >= 0; --j) rase_heap_down(work, k, j);
            } else if (rase_cand_before(c, work[0])) {
                work[0] = c;
                rase_heap_down(work, k, 0);
            }
        }
    }
    return m;
}

// ascending radix key of -x: the candidate order for finite x, -0 and +0 one key (they tie)
static inline uint32_t rase_desc_key(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u &= -(uint32_t)(u != 0x80000000u);               // -0 -> +0
    u ^= (uint32_t)((int32_t)u >> 31) | 0x80000000u;  // ascending in x (branch-free: signs are random)
    return ~u;
}

static inline float rase_desc_value(uint32_t key) {  // rase_desc_key's inverse (-0 comes back +0)
    uint32_t u = ~key;
    u ^= (uint32_t)((int32_t)~u >> 31) | 0x80000000u;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

#define RASE_RADIX_BITS 11  // three passes over a 32-bit key; 3 x 2048 counters stay in L1

// work[0..m) = every allowed candidate in the candidate order: (key << 32 | id) words collected
// in id order, then a stable LSD radix sort on the key keeps ties in id order. The words live
// in work's 2m candidates' space (8 bytes each, in place). Returns m, or -1 if a value is not
// finite.
static int32_t rase_sample_all(const float *v, int32_t n, rase_cand *work, const uint32_t *allow) {
    enum { R = 1 << RASE_RADIX_BITS, PASSES = (32 + RASE_RADIX_BITS - 1) / RASE_RADIX_BITS };
    uint64_t *a = (uint64_t *)work, *b = a + n;  // v may be b's floats: read before b is written
    int32_t m = 0;
    for (int32_t b0 = 0; b0 < n; b0 += RASE_SAMPLE_BLOCK) {
        const int32_t len = n - b0 < RASE_SAMPLE_BLOCK ? n - b0 : RASE_SAMPLE_BLOCK;
        if (rase_block_scan(v + b0, len, INFINITY) & 1) return -1;
        if (rase_block_masked(allow, b0)) continue;
        for (int32_t i = b0; i < b0 + len; ++i)
            if (rase_allowed(allow, i)) a[m++] = (uint64_t)rase_desc_key(v[i]) << 32 | (uint32_t)i;
    }
    uint32_t hist[PASSES][R];  // 24 KiB of stack
    memset(hist, 0, sizeof hist);
    for (int32_t i = 0; i < m; ++i) {
        const uint32_t key = (uint32_t)(a[i] >> 32);
        for (int d = 0; d < PASSES; ++d) ++hist[d][(key >> (RASE_RADIX_BITS * d)) & (R - 1)];
    }
    uint64_t *src = a, *dst = b;
    for (int d = 0; d < PASSES && m > 0; ++d) {
        const int shift = 32 + RASE_RADIX_BITS * d;
        if (hist[d][(src[0] >> shift) & (R - 1)] == (uint32_t)m) continue;  // one digit: nothing moves
        uint32_t sum = 0;
        for (int r = 0; r < R; ++r) { const uint32_t c = hist[d][r]; hist[d][r] = sum; sum += c; }
        for (int32_t i = 0; i < m; ++i) dst[hist[d][(src[i] >> shift) & (R - 1)]++] = src[i];
        uint64_t *t = src; src = dst; dst = t;
    }
    for (int32_t i = 0; i < m; ++i) {  // words back to candidates, in place (same 8 bytes)
        const uint64_t w = src[i];
        work[i] = (rase_cand){rase_desc_value((uint32_t)(w >> 32)), (int32_t)(uint32_t)w};
    }
    return m;
}

// work[0..m) sorted in the candidate order -> the drawn id: temperature, softmax (in double for
// the sums, in sorted order), top-p, min-p, then a walk of the kept prefix
static int32_t rase_sample_draw(rase_cand *work, int32_t m, const rase_sampling *p, rase_rng *rng) {
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

// the values the chain ranks: logits + bias, penalized, written to out (n floats) when a bias or
// a penalty applies, else logits itself
static const float *rase_sample_values(const float *logits, int32_t n, const int32_t *counts, const rase_sampling *p,
                                       float *out) {
    const int penalize = counts && (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f ||
                                    p->frequency_penalty != 0.0f);
    if (!p->bias && !penalize) return logits;
    for (int32_t i = 0; i < n; ++i) out[i] = rase_penalized(logits, counts, p, penalize, i);
    return out;
}

// Returns the sampled id, RASE_SAMPLE_INVALID or RASE_SAMPLE_NONE. logits (n) are only read;
// counts (n) = occurrences so far (or NULL); work holds RASE_SAMPLE_WORK(n) candidates; allow:
// the grammar's bitmask or NULL. Masked ids are never candidates: top-k, top-p, min-p and the
// draw see the allowed ids only (k = min(top_k, allowed)); with allow NULL the bits are those
// of no mask. Order (one definition, whatever path computes it): penalties -> the k first
// candidates (higher value first, ties to the lower id) -> sorted -> the draw above. A top_k
// beyond a quarter of the vocabulary sorts every candidate (radix, ~n) rather than heap them.
static int32_t rase_sample(const float *logits, int32_t n, const int32_t *counts, const rase_sampling *p,
                           rase_rng *rng, rase_cand *work, const uint32_t *allow) {
    const float *v = rase_sample_values(logits, n, counts, p, (float *)(work + n));
    if (p->temperature == 0.0f) return rase_sample_greedy(v, n, allow);
    const int32_t k = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    int32_t m;
    if (k > n / 4) {
        m = rase_sample_all(v, n, work, allow);
        if (m > k) m = k;
    } else {
        m = rase_sample_heap(v, n, k, work, allow);
        if (m > 0) qsort(work, (size_t)m, sizeof(rase_cand), rase_cand_desc);
    }
    if (m < 0) return RASE_SAMPLE_INVALID;
    if (m == 0) return RASE_SAMPLE_NONE;
    return rase_sample_draw(work, m, p, rng);
}

#endif  // RASE_SAMPLE_H
