// rase/_forward.h: the one transformer forward shared by every architecture.
//
// State is kept apart (llama2.c's split): rase_hparams and rase_weights are read-only after load
// (weight pointers into the mmap) and shared by every sequence; rase_kv_pool holds f16 K/V in
// blocks of RASE_KV_BLOCK positions that sequences own or share through block tables;
// rase_scratch holds one step's activations. rase_step evaluates a batch of (token, sequence,
// position) rows inside one OpenMP parallel region (ops split work by thread, barriers between
// them), then samples the rows that need a token.
//
// Numerics contract: every output element is computed by one thread, and each row by the same
// arithmetic whatever else is in the step (the one-token kernels, per-row activation
// quantization, per-row norms and RoPE, attention over the row's own sequence). A sequence's
// logits therefore do not depend on the batch, its chunking, the thread count or the pool
// blocks that hold its K/V, and they equal llama.cpp's one-token (n_batch = 1) numerics.
#ifndef RASE_FORWARD_H
#define RASE_FORWARD_H

#include <stdlib.h>
#include "_dot.h"
#include "_repack.h"
#include "_pool.h"
#include "_attention.h"
#include "_sample.h"


typedef struct {
    const uint8_t *data;  // the plain ggml rows (the mmap)
    int type;             // ggml type id
    int64_t rows, cols;   // rows x cols, cols contiguous (ggml ne[1] x ne[0])
    int64_t row_bytes;
    int layout;           // RASE_LAYOUT_PLAIN: data; RASE_LAYOUT_R16: packed
    const uint8_t *packed;  // (ceil(rows / 16), cols / 32) r16 blocks (_repack.h), or NULL
    int64_t group_bytes;  // bytes of one RASE_R16-row (16) group in packed
} rase_mat;

typedef struct {
    rase_mat wq, wk, wv, wo, wgate, wup, wdown;   // wgate/wup/wdown unused in a MoE layer
    const float *attn_norm, *ffn_norm;            // (n_embd,) or NULL: the sublayer reads x itself
    const float *q_norm, *k_norm;                 // (head_dim,), (n_head[_kv] * head_dim,) when full, or NULL
    const float *post_attn_norm, *post_ffn_norm;  // (n_embd,) or NULL
    const float *post_attn_norm_b, *post_ffn_norm_b;  // LayerNorm biases (n_embd,) or NULL (bert)
    const float *bq, *bk, *bv, *bo;               // projection biases (rows,) or NULL
    const float *bgate, *bup, *bdown;             // FFN biases or NULL; wgate.data NULL: up, act, down
    int qk_norm_full;  // 1: q_norm/k_norm span all heads of a row (olmo2); 0: each head
    int window;     // sliding-window length in positions; 0 = full causal attention
    int rope_slot;  // 0 or 1: which of the model's rope params; -1: no RoPE in this layer (NoPE)
    // mixture of experts (moe = 1): router (n_expert, n_embd) and experts (n_expert,) each
    int moe;
    rase_mat gate_inp;
    const rase_mat *exp_gate, *exp_up, *exp_down;
} rase_layer;

// One RoPE as ggml_rope_ext applies it (after llama_context's setup of its parameters):
// theta_i = pos * base^(-2i/n_rot) / factors[i], scaled by freq_scale; YaRN (ext_factor != 0)
// mixes the scaled and unscaled angle by a ramp over dimensions [corr_dims[0], corr_dims[1]];
// cos and sin are multiplied by attn_factor (rase_rope_init).
typedef struct {
    float base, freq_scale, ext_factor, attn_factor;
    float corr_dims[2];
    const float *factors;  // (n_rot / 2,) frequency divisors (Llama 3 rope_freqs, LongRoPE), or NULL
} rase_rope_params;

typedef struct {
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_rot;
    int n_ctx;          // positions one sequence may reach
    int rope_neox;      // 1: rotate (i, i + n_rot/2) pairs (NeoX); 0: (2i, 2i+1)
    int gelu;           // 1: GELU(tanh) gate, 0: SiLU gate
    int attn_prescale;  // 1: q *= attn_scale before rounding (gemma), scores unscaled
    float eps, embd_scale, attn_scale;
    float attn_softcap, final_softcap;  // > 0: s -> cap * tanh(s / cap) on scores / logits (gemma2)
    float residual_scale;  // != 1: each sublayer's output times this before the residual add (granite)
    float logit_mul;       // != 1: the logits times this (granite's 1 / logit_scale)
    int layer_norm;        // 1: norms are LayerNorm (mean removed) with a bias; 0: RMSNorm
    int norm_after_add;    // 1: x = post_norm(x + sublayer) (BERT's post-LN); 0: x += post_norm(sublayer)
    int causal;            // 0: a row attends to every position its sequence has in the step
    int n_expert, n_expert_used, n_ff_exp;  // MoE layers: experts, chosen per token, width
    int expert_norm;    // 1: the chosen experts' weights renormalized to sum 1
    rase_rope_params rope[2];  // rope[1] unused when its base is 0
} rase_hparams;

typedef struct {  // read-only during a forward
    rase_hparams hp;
    rase_mat tok_embd, output;  // output.data NULL: no LM head (an encoder)
    rase_mat pos_embd;          // learned positions (n_pos, n_embd), or data NULL (bert)
    const float *type_embd;     // (n_embd,) token type 0's row added to every embedding, or NULL
    const float *embd_norm, *embd_norm_b;  // the embeddings' norm (n_embd,) or NULL (bert)
    const float *output_norm;  // (n_embd,) or NULL
    rase_layer *layers;        // (n_layer,)
    uint16_t *gelu_table;      // (65536,) f16 GELU table, GELU models only (owned)
} rase_weights;

typedef struct {
    // (n_layer, n_head_kv, n_blocks, RASE_KV_BLOCK, head_dim) f16; pages touched as written. One
    // head's rows of a layer are contiguous block after block, so a sequence whose blocks were
    // taken in order reads each head's K and V as one stream
    uint16_t *k, *v;
    int32_t n_blocks, n_layer, n_head_kv, head_dim;
} rase_kv_pool;

typedef struct {
    int max_rows, n_threads, n_ctx;
    float *x, *h, *o;      // (max_rows, n_embd)
    float *q, *att;        // (max_rows, n_head * head_dim)
    float *k, *v;          // (max_rows, n_head_kv * head_dim)
    float *g, *u;          // (max_rows, n_ff)
    float *router;         // (max_rows, n_expert) router logits, then probabilities
    int32_t *sel, *pair;   // (max_rows, n_expert_used): chosen experts; their pair slot
    float *wsel;           // (max_rows, n_expert_used): their weights
    int32_t *ptok;         // (max_rows * n_expert_used,): the token of each pair slot
    int32_t *seg, *cursor; // (n_expert + 1,), (n_expert,): expert e's pairs are slots [seg[e], seg[e+1])
    float *pg, *pu, *pd;   // (max_rows * n_expert_used, n_ff_exp | n_ff_exp | n_embd): per pair
    uint8_t *pact;         // (2, max_rows * n_expert_used, act_stride): quantized pair inputs
    float *rope;           // (2, max_rows, n_rot / 2, 2): cos, sin per row and rope slot
    float *scores;         // (n_threads, RASE_ATTN_G, attn_stride): attention scratch per query
    float *shared;         // (n_threads, RASE_ATTN_G, attn_stride): scores of groups split over threads
    int64_t attn_stride;
    uint8_t *act;          // (n_threads, ACT_COUNT, act_stride): one quantized row per thread
    uint8_t *act_rows;     // (ACT_COUNT, max_rows, act_stride): shared quantized rows
    const float **act_src; // (n_threads, 2, ACT_COUNT): which input each buffer holds
    int64_t act_stride;
    rase_job_slot *jobs;   // (n_threads,): each thread's work counter (rase_jobs), reset at barriers
    float *work;           // (n_threads, work_stride): the rows kernels' own (RASE_CHUNK_ROWS x max_cols)
    int64_t work_stride;
    int nonfinite;         // after rase_step: 1 when one of its logits is NaN or +-inf
} rase_scratch;

static inline float *rase_work(const rase_scratch *s, int ith) { return s->work + ith * s->work_stride; }

typedef struct { int32_t token, seq, pos; } rase_entry;

typedef struct {  // one step
    const rase_entry *rows;    // (n,): the rows to evaluate
    int n;
    const int32_t *tables;     // seq s's block table is tables + s * table_stride
    int64_t table_stride;
    const int32_t *out_rows;   // (n_out,): rows whose logits are wanted, in output order
    int n_out;
    float *logits;             // (n_out, n_vocab)
    const int32_t *seq_len;    // an encoder (not read otherwise): seq s attends to its positions
    const int32_t *seq_first;  // [0, seq_len[s]), rows seq_first[s] + p of the step
    const int32_t *embd_rows;  // (n_embd,): rows whose final hidden state is wanted (embeddings)
    int n_embd;
    float *embd;               // (n_embd, n_embd floats): after the final norm when the model has one
} rase_batch;

typedef struct {  // one row's sampler state (owned by its request); p NULL: the row is read, not sampled
    const rase_sampling *p;
    rase_rng *rng;
    rase_cand *work;           // RASE_SAMPLE_WORK(n_vocab) candidates
    const int32_t *counts;     // (n_vocab,) or NULL
    const uint32_t *allow;     // (ceil(n_vocab / 32),) the grammar's bitmask, or NULL
} rase_sampler_ref;

typedef struct {
    const rase_weights *w;
    rase_kv_pool *kv;
    rase_scratch *s;
    int isa;
    float *trace;              // NULL, or (n_layer, n, n_embd): residual stream after each layer
    int profile;               // 1: thread 0 accumulates the ns below (RASE_PROFILE=1)
    int64_t prof_matmul_ns, prof_attn_ns;
    int64_t step_ns;           // wall ns spent in rase_step since creation (always counted)
    rase_barrier barrier;
} rase_model;

static uint16_t *rase_gelu_table_new(void);

static void *rase_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

static void rase_weights_free(rase_weights *w) {
    free(w->gelu_table);
    w->gelu_table = NULL;
}

static int rase_weights_init(rase_weights *w) {
    w->gelu_table = w->hp.gelu ? rase_gelu_table_new() : NULL;
    return w->hp.gelu && !w->gelu_table ? -1 : 0;
}

static void rase_kv_pool_free(rase_kv_pool *kv) {
    free(kv->k);
    free(kv->v);
    kv->k = kv->v = NULL;
}

// 0 on success, -1 when out of memory
static int rase_kv_pool_alloc(rase_kv_pool *kv, const rase_hparams *hp, int32_t n_blocks) {
    kv->n_blocks = n_blocks;
    kv->n_layer = hp->n_layer;
    kv->n_head_kv = hp->n_head_kv;
    kv->head_dim = hp->head_dim;
    const size_t bytes = (size_t)n_blocks * hp->n_layer * hp->n_head_kv * RASE_KV_BLOCK * hp->head_dim * sizeof(uint16_t);
    kv->k = rase_alloc(bytes);  // never written here: pages are touched as positions fill
    kv->v = rase_alloc(bytes);
    if (!kv->k || !kv->v) { rase_kv_pool_free(kv); return -1; }
    return 0;
}

// pool offset (elements) of row `row` of block `blk`, layer il, KV head h
static inline int64_t rase_kv_at(const rase_kv_pool *kv, int il, int h, int64_t blk, int row) {
    return ((((int64_t)il * kv->n_head_kv + h) * kv->n_blocks + blk) * RASE_KV_BLOCK + row) * kv->head_dim;
}

// rows [0, n) of block src copied into block dst, every layer, K and V (a cached block's
// leading positions reused by a sequence that shares only them)
static void rase_kv_copy_rows(rase_kv_pool *kv, int32_t src, int32_t dst, int n) {
    const size_t bytes = (size_t)n * kv->head_dim * sizeof(uint16_t);
    for (int il = 0; il < kv->n_layer; ++il)
        for (int h = 0; h < kv->n_head_kv; ++h) {
            const int64_t s = rase_kv_at(kv, il, h, src, 0), d = rase_kv_at(kv, il, h, dst, 0);
            memcpy(kv->k + d, kv->k + s, bytes);
            memcpy(kv->v + d, kv->v + s, bytes);
        }
}

static void rase_scratch_free(rase_scratch *s) {
    void *bufs[] = {s->x, s->h, s->o, s->q, s->att, s->k, s->v, s->g, s->u, s->rope, s->scores, s->shared,
                    s->act, s->act_rows, (void *)s->act_src, s->router, s->sel, s->pair, s->wsel,
                    s->ptok, s->seg, s->cursor, s->pg, s->pu, s->pd, s->pact, s->jobs, s->work};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); ++i) free(bufs[i]);
    memset(s, 0, sizeof(*s));
}

// scratch for steps of up to max_rows rows over sequences of up to n_ctx positions
static int rase_scratch_alloc(rase_scratch *s, const rase_hparams *hp, int max_rows, int n_threads) {
    memset(s, 0, sizeof(*s));
    s->max_rows = max_rows;
    s->n_threads = n_threads;
    s->n_ctx = hp->n_ctx;
    const int64_t B = max_rows, nq = (int64_t)hp->n_head * hp->head_dim;
    const int64_t nkv = (int64_t)hp->n_head_kv * hp->head_dim;
    int64_t max_cols = hp->n_embd;
    if (nq > max_cols) max_cols = nq;
    if (hp->n_ff > max_cols) max_cols = hp->n_ff;
    if (hp->n_ff_exp > max_cols) max_cols = hp->n_ff_exp;
    s->act_stride = (int64_t)rase_act_bytes(ACT_F32, max_cols) + 64;
    s->x = rase_alloc(B * hp->n_embd * 4);
    s->h = rase_alloc(B * hp->n_embd * 4);
    s->o = rase_alloc(B * hp->n_embd * 4);
    s->q = rase_alloc(B * nq * 4);
    s->att = rase_alloc(B * nq * 4);
    s->k = rase_alloc(B * nkv * 4);
    s->v = rase_alloc(B * nkv * 4);
    s->g = rase_alloc(B * hp->n_ff * 4);
    s->u = rase_alloc(B * hp->n_ff * 4);
    s->rope = rase_alloc(2 * B * (hp->n_rot / 2) * 2 * 4);
    s->attn_stride = rase_attend_scratch(hp->n_ctx, hp->head_dim);
    s->scores = rase_alloc((size_t)n_threads * RASE_ATTN_G * s->attn_stride * 4);
    s->shared = rase_alloc((size_t)n_threads * RASE_ATTN_G * s->attn_stride * 4);  // touched by long decodes only
    s->act = rase_alloc((size_t)n_threads * ACT_COUNT * s->act_stride);
    s->act_rows = rase_alloc((size_t)ACT_COUNT * B * s->act_stride);
    s->act_src = rase_alloc((size_t)n_threads * 2 * ACT_COUNT * sizeof(float *));
    s->jobs = rase_alloc((size_t)n_threads * sizeof(rase_job_slot));
    s->work_stride = (RASE_CHUNK_ROWS * max_cols + 15) / 16 * 16;  // pages touched only by a GEMM that uses them
    s->work = rase_alloc((size_t)n_threads * s->work_stride * sizeof(float));
    if (hp->n_expert > 0) {
        const int64_t P = B * hp->n_expert_used;
        s->router = rase_alloc(B * hp->n_expert * 4);
        s->sel = rase_alloc(P * 4);
        s->pair = rase_alloc(P * 4);
        s->wsel = rase_alloc(P * 4);
        s->ptok = rase_alloc(P * 4);
        s->seg = rase_alloc((hp->n_expert + 1) * 4);
        s->cursor = rase_alloc(hp->n_expert * 4);
        s->pg = rase_alloc(P * hp->n_ff_exp * 4);
        s->pu = rase_alloc(P * hp->n_ff_exp * 4);
        s->pd = rase_alloc(P * hp->n_embd * 4);
        s->pact = rase_alloc((size_t)2 * P * s->act_stride);
        if (!s->router || !s->sel || !s->pair || !s->wsel || !s->ptok || !s->seg || !s->cursor || !s->pg || !s->pu ||
            !s->pd || !s->pact) {
            rase_scratch_free(s);
            return -1;
        }
    }
    if (!s->x || !s->h || !s->o || !s->q || !s->att || !s->k || !s->v || !s->g || !s->u || !s->rope ||
        !s->scores || !s->shared || !s->act || !s->act_rows || !s->act_src || !s->jobs || !s->work) {
        rase_scratch_free(s);
        return -1;
    }
    return 0;
}

// ---------------------------------------------------------------- elementwise kernels

static inline float rase_silu(float x) { return x / (1.0f + expf(-x)); }

// ggml's GELU(tanh) in f32, as compiled into llama.cpp's x86 builds: GCC contracts the inner
// 1 + a*x*x into an FMA there (its default -ffp-contract=fast; rase builds with it off, so the FMA
// is written out). It changes one entry of the f16 table (h = 0xBFFF, x = -1.999), which Gemma3
// meets on real text. llama.cpp evaluates GELU through that table (rase_gelu_table).
static inline float rase_gelu(float x) {
    return 0.5f * x * (1.0f + tanhf(0.79788456080286535587989211986876f * x * fmaf(0.044715f * x, x, 1.0f)));
}

// table[h] = f16(gelu(f32(h))) for every f16 bit pattern h (ggml_table_gelu_f16)
static uint16_t *rase_gelu_table_new(void) {
    uint16_t *t = (uint16_t *)malloc(65536 * sizeof(uint16_t));
    if (t)
        for (int h = 0; h < 65536; ++h) t[h] = rase_fp32_to_fp16(rase_gelu(rase_fp16_to_fp32((uint16_t)h)));
    return t;
}

static inline float rase_geglu1(float x, const uint16_t *table) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return rase_fp16_to_fp32(table[rase_fp32_to_fp16(x)]);
}

// g = act(g) * u over n elements; GELU through the f16 table, SiLU with ggml's exp
static void gate_ref(float *g, const float *u, int64_t n, const uint16_t *gelu_table) {
    for (int64_t i = 0; i < n; ++i)
        g[i] = (gelu_table ? rase_geglu1(g[i], gelu_table) : rase_silu(g[i])) * u[i];
}

#if RASE_HAVE_X86
RASE_TARGET_AVX2 static inline __m256 rase_avx2_silu_mul(__m256 x, __m256 u) {
    const __m256 e = rase_avx2_expf(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

// rase_geglu1 on 8 lanes: the f16 rounding of x (vcvtps2ph rounds to nearest even, as
// rase_fp32_to_fp16 does) indexes the table; lanes outside (-10, 10) read entry 0 and are
// replaced (0 below, x above; NaN stays NaN), so no read leaves the table.
RASE_TARGET_AVX2 static inline __m256 rase_avx2_geglu_mul(__m256 x, __m256 u, const uint16_t *table) {
    const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
    const __m256 in = _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_GT_OQ), _mm256_cmp_ps(x, hi, _CMP_LT_OQ));
    const __m256i h = _mm256_and_si256(_mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, 0)), _mm256_castps_si256(in));
    const __m256i e = _mm256_i32gather_epi32((const int *)table, h, 2);  // low half: table[h]
    const __m256i e16 = _mm256_permute4x64_epi64(
        _mm256_shuffle_epi8(e, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                                0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1)), 0x08);
    const __m256 t = _mm256_cvtph_ps(_mm256_castsi256_si128(e16));
    const __m256 above = _mm256_cmp_ps(x, hi, _CMP_NLT_UQ);  // x >= 10 or NaN: x
    const __m256 act = _mm256_blendv_ps(_mm256_and_ps(t, in), x, above);
    return _mm256_mul_ps(act, u);
}

// every element through the vector path, the tail too: a thread's range may start anywhere, so
// an element's arithmetic must not depend on where its 8-lane group begins
RASE_TARGET_AVX2 static void gate_avx2(float *g, const float *u, int64_t n, const uint16_t *gelu_table) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i), y = _mm256_loadu_ps(u + i);
        _mm256_storeu_ps(g + i, gelu_table ? rase_avx2_geglu_mul(x, y, gelu_table) : rase_avx2_silu_mul(x, y));
    }
    if (i < n) {
        float xg[8] = {0}, xu[8] = {0};
        memcpy(xg, g + i, (size_t)(n - i) * sizeof(float));
        memcpy(xu, u + i, (size_t)(n - i) * sizeof(float));
        const __m256 x = _mm256_loadu_ps(xg), y = _mm256_loadu_ps(xu);
        _mm256_storeu_ps(xg, gelu_table ? rase_avx2_geglu_mul(x, y, gelu_table) : rase_avx2_silu_mul(x, y));
        memcpy(g + i, xg, (size_t)(n - i) * sizeof(float));
    }
}
#endif

static void rase_gate(float *g, const float *u, int64_t n, const uint16_t *gelu_table, int isa) {
#if RASE_HAVE_X86
    if (isa >= RASE_ISA_AVX2) { gate_avx2(g, u, n, gelu_table); return; }
#endif
    gate_ref(g, u, n, gelu_table);
}

// y = x / rms(x) * w (ggml: mean of squares accumulated in double)
static void rase_rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += (double)(x[i] * x[i]);
    const float scale = 1.0f / sqrtf((float)(sum / (double)n) + eps);
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
}

// y = (x - mean) / sqrt(var + eps) * w + b, as llama.cpp's AVX2 build computes ggml_norm then
// ggml_mul and ggml_add: the mean summed in double; the squares in float groups of 8 (the lanes'
// tree) added to a double sum, the tail one by one. y may be x.
static void rase_layernorm(const float *x, const float *w, const float *b, float *y, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += (double)x[i];
    const float mean = (float)sum / (float)n;
    double sq = 0.0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float a[8];
        for (int j = 0; j < 8; ++j) { y[i + j] = x[i + j] - mean; a[j] = y[i + j] * y[i + j]; }
        sq += (double)(((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])));
    }
    for (; i < n; ++i) { y[i] = x[i] - mean; sq += (double)(y[i] * y[i]); }
    const float scale = 1.0f / sqrtf((float)(sq / (double)n) + eps);
    for (i = 0; i < n; ++i) y[i] = (y[i] * scale) * w[i] + (b ? b[i] : 0.0f);
}

// rotate one head (n_rot leading dims) with the table row cs = (cos, sin) x n_rot/2
static void rope_ref(float *x, const float *cs, int n_rot, int neox) {
    const int half = n_rot / 2;
    for (int i = 0; i < half; ++i) {
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float c = cs[2 * i], s = cs[2 * i + 1], x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

#if RASE_HAVE_X86
// the same rotation with the FMA contraction ggml's compiled rope has: x0*c - (x1*s) fused
RASE_TARGET_AVX2 static void rope_avx2(float *x, const float *cs, int n_rot, int neox) {
    const int half = n_rot / 2;
    for (int i = 0; i < half; ++i) {
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float c = cs[2 * i], s = cs[2 * i + 1], x0 = x[a], x1 = x[b];
        x[a] = __builtin_fmaf(x0, c, -(x1 * s));
        x[b] = __builtin_fmaf(x0, s, x1 * c);
    }
}
#endif

static void rase_rope(float *x, const float *cs, int n_rot, int neox, int isa) {
#if RASE_HAVE_X86
    if (isa >= RASE_ISA_AVX2) { rope_avx2(x, cs, n_rot, neox); return; }
#endif
    rope_ref(x, cs, n_rot, neox);
}

// llama.cpp's YaRN parameters, in its float steps (llama_context's setup and ggml.c's
// ggml_rope_yarn_corr_dims, both compiled without FMA): yarn = 0 leaves ext_factor 0 and the
// cos/sin multiplier the file's attn_factor (Phi-3's LongRoPE factor, else 1).
static void rase_rope_init(rase_rope_params *r, int n_rot, float base, float freq_scale, int yarn, float attn_factor,
                           int n_ctx_orig, const float *factors) {
    r->base = base;
    r->freq_scale = freq_scale;
    r->factors = factors;
    r->ext_factor = yarn ? 1.0f : 0.0f;
    r->attn_factor = 1.0f;
    r->corr_dims[0] = r->corr_dims[1] = 0.0f;
    if (yarn) {
        const float factor = 1.0f / freq_scale, beta[2] = {32.0f, 1.0f};  // yarn_beta_fast, yarn_beta_slow
        r->attn_factor = factor <= 1.0f ? 1.0f : 0.1f * logf(factor) + 1.0f;
        r->attn_factor *= 1.0f / (1.0f + 0.1f * logf(factor));  // the kernel's own mscale cancelled
        for (int i = 0; i < 2; ++i) {
            const float d = (float)n_rot * logf((float)n_ctx_orig / (beta[i] * 2 * (float)M_PI)) / (2 * logf(base));
            r->corr_dims[i] = i == 0 ? fmaxf(0.0f, floorf(d)) : fminf((float)(n_rot - 1), ceilf(d));
        }
    }
    r->attn_factor *= attn_factor;
}

// cs = (cos, sin) x n_rot/2 at position pos: ggml_rope_cache_init as llama.cpp's x86 builds
// compile it (theta by repeated multiplication in f32; GCC contracts the YaRN mix and the
// mscale term into the two FMAs written out here)
static void rase_rope_table(float *cs, int pos, int n_rot, const rase_rope_params *r) {
    const float theta_scale = powf(r->base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    for (int i = 0; i < n_rot / 2; ++i) {
        const float extrap = r->factors ? theta / r->factors[i] : theta;
        float t = r->freq_scale * extrap, mscale = r->attn_factor;
        if (r->ext_factor != 0.0f) {
            const float y = ((float)i - r->corr_dims[0]) / fmaxf(0.001f, r->corr_dims[1] - r->corr_dims[0]);
            const float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * r->ext_factor;
            t = fmaf(t, 1.0f - mix, extrap * mix);
            mscale *= fmaf(0.1f, logf(1.0f / r->freq_scale), 1.0f);
        }
        cs[2 * i] = cosf(t) * mscale;
        cs[2 * i + 1] = sinf(t) * mscale;
        theta *= theta_scale;
    }
}

// ---------------------------------------------------------------- matmul over quantized activations

static void rase_sync(rase_model *m, int ith) {
    rase_barrier_wait_reset(&m->barrier, m->s->jobs);
    for (int a = 0; a < 2 * ACT_COUNT; ++a) m->s->act_src[ith * 2 * ACT_COUNT + a] = NULL;
}

// X (T, cols) quantized to activation format `act`, as rows `*astride` bytes apart; each row
// on its own (no statistics across rows). One row: each thread quantizes it into its own buffer
// (no barrier). Several rows: the threads split them into a shared buffer, then meet at a
// barrier. Each thread remembers what its buffers hold, so matmuls sharing an input (Q/K/V,
// gate/up) quantize it once; rase_sync forgets.
static const uint8_t *rase_quantize_input(rase_model *m, int act, const float *X, int T, int64_t cols,
                                          int ith, int nth, size_t *astride) {
    rase_scratch *s = m->s;
    const rase_quant_fn quant = rase_act_quant_for(act, m->isa);
    const size_t row = rase_act_row_stride(act, cols);  // fits: act_stride is an f32 row + 64
    *astride = row;
    const float **src = s->act_src + ith * 2 * ACT_COUNT;
    if (T == 1) {
        uint8_t *buf = s->act + ((size_t)ith * ACT_COUNT + act) * s->act_stride;
        if (src[act] != X) { quant(X, buf, cols); src[act] = X; }
        return buf;
    }
    uint8_t *buf = s->act_rows + (size_t)act * s->max_rows * s->act_stride;
    if (src[ACT_COUNT + act] != X) {
        int64_t lo, hi;
        rase_split(T, ith, nth, &lo, &hi);
        for (int64_t t = lo; t < hi; ++t) quant(X + t * cols, buf + t * row, cols);
        rase_barrier_wait(&m->barrier);
        src[ACT_COUNT + act] = X;
    }
    return buf;
}

// 1 when one of Y[t][r], r in [r0, r1), t < T, is NaN or +-inf (exponent bits all ones)
static int rase_any_nonfinite(const float *Y, int64_t rows, int T, int64_t r0, int64_t r1) {
    uint32_t all = 0;
    for (int t = 0; t < T; ++t)
        for (int64_t r = r0; r < r1; ++r) {
            uint32_t u;
            memcpy(&u, Y + (int64_t)t * rows + r, 4);
            all |= (u & 0x7f800000u) == 0x7f800000u;
        }
    return (int)all;
}

// Y[t][r] += b[r] for rows [r0, r1) of T rows of `rows` outputs
static void rase_add_bias(float *Y, int64_t rows, const float *b, int T, int64_t r0, int64_t r1) {
    for (int t = 0; t < T; ++t)
        for (int64_t r = r0; r < r1; ++r) Y[(int64_t)t * rows + r] += b[r];
}

// Y[t][r] = X[t] . w[r] for rows [r0, r1) (r0 a multiple of 16) and T tokens, A = X quantized
// to format act (rase_act_for's, or the type's own; rows `as` bytes apart); work: the thread's
// rase_work. Tiles change with T (tokens per call, rows per group); the arithmetic of each
// output element does not.
static void rase_mm_rows(const rase_model *m, const rase_mat *w, const uint8_t *A, int act, size_t as, int T,
                         float *Y, int64_t r0, int64_t r1, float *work) {
    if (w->layout == RASE_LAYOUT_R16) {
        rase_r16_rows(m->isa, w->type, w->packed, w->group_bytes, w->cols, A, as, T, Y, w->rows, r0, r1, (uint8_t *)work);
        return;
    }
    const rase_rows_fn rows = rase_rows_for(w->type, m->isa, T, w->cols);
    if (rows && act == DOT_TRAITS[w->type].rows_act) {  // the same bits as dotn
        rows(w->cols, w->data, w->row_bytes, r0, r1, A, as, T, Y, w->rows, work);
        return;
    }
    const rase_dotn_fn dotn = rase_dotn_for(w->type, m->isa);
    float out[RASE_NT];
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t *wr = w->data + r * w->row_bytes;
        for (int t0 = 0; t0 < T; t0 += RASE_NT) {
            const int nt = T - t0 < RASE_NT ? T - t0 : RASE_NT;
            dotn(w->cols, wr, A + (size_t)t0 * as, as, nt, out);
            for (int j = 0; j < nt; ++j) Y[(int64_t)(t0 + j) * w->rows + r] = out[j];
        }
    }
}

enum { RASE_EPI_NONE, RASE_EPI_GATE, RASE_EPI_ACT };  // what rase_matmuls does to a chunk it computed

// g = act(g) over n elements (an FFN without a gate: bert's GELU). The same scalar steps on
// every ISA: the GELU is the f16 table lookup, which the vector path also does lane by lane.
static void rase_act(float *g, int64_t n, const uint16_t *gelu_table) {
    for (int64_t i = 0; i < n; ++i) g[i] = gelu_table ? rase_geglu1(g[i], gelu_table) : rase_silu(g[i]);
}

// Y[i] (T, rows_i) = X (T, cols) w[i]^T for n matrices sharing their input (Q/K/V), their
// chunks of RASE_CHUNK_ROWS rows in one list split by rase_jobs (counters reset by the barrier
// that precedes every call). epi RASE_EPI_GATE: the matrices are (gate, up) of an FFN; a chunk
// computes both and then act(gate) * up on its rows, written into Y[0]; RASE_EPI_ACT: one
// matrix (up), act on its chunk. bias (n pointers) or NULL: b[i] (rows_i,) or NULL is added to
// Y[i] (ggml_add after the matmul, before the activation).
static void rase_matmuls(rase_model *m, int n, const rase_mat *const *w, const float *X, float *const *Y, int T,
                         int epi, const float *const *bias, int ith, int nth) {
    const int gate_u = epi == RASE_EPI_GATE;
    const uint8_t *A[3];
    size_t as[3];
    int act[3];
    for (int i = 0; i < n; ++i) {  // shared formats are quantized once (rase_quantize_input)
        act[i] = rase_act_for(w[i]->type, m->isa, T, w[i]->cols);
        A[i] = rase_quantize_input(m, act[i], X, T, w[i]->cols, ith, nth, &as[i]);
    }
    int64_t total = 0, first[4];
    for (int i = 0; i < (gate_u ? 1 : n); ++i) {
        first[i] = total;
        total += (w[i]->rows + RASE_CHUNK_ROWS - 1) / RASE_CHUNK_ROWS;
    }
    rase_jobs jobs = rase_jobs_start(m->s->jobs, total, ith, nth);
    for (int64_t c = rase_jobs_next(&jobs); c < total; c = rase_jobs_next(&jobs)) {
        int i = 0;
        while (i + 1 < (gate_u ? 1 : n) && c >= first[i + 1]) ++i;
        const int64_t r0 = (c - first[i]) * RASE_CHUNK_ROWS;
        const int64_t r1 = r0 + RASE_CHUNK_ROWS < w[i]->rows ? r0 + RASE_CHUNK_ROWS : w[i]->rows;
        rase_mm_rows(m, w[i], A[i], act[i], as[i], T, Y[i], r0, r1, rase_work(m->s, ith));
        if (bias && bias[i]) rase_add_bias(Y[i], w[i]->rows, bias[i], T, r0, r1);
        if (w[i] == &m->w->output && m->w->hp.final_softcap <= 0.0f && m->w->hp.logit_mul == 1.0f &&  // in this core's cache
            rase_any_nonfinite(Y[i], w[i]->rows, T, r0, r1))
            __atomic_store_n(&m->s->nonfinite, 1, __ATOMIC_RELAXED);
        if (gate_u) {
            rase_mm_rows(m, w[1], A[1], act[1], as[1], T, Y[1], r0, r1, rase_work(m->s, ith));
            if (bias && bias[1]) rase_add_bias(Y[1], w[1]->rows, bias[1], T, r0, r1);
            for (int t = 0; t < T; ++t)
                rase_gate(Y[0] + (int64_t)t * w[0]->rows + r0, Y[1] + (int64_t)t * w[1]->rows + r0, r1 - r0,
                          m->w->gelu_table, m->isa);
        } else if (epi == RASE_EPI_ACT) {
            for (int t = 0; t < T; ++t) rase_act(Y[0] + (int64_t)t * w[0]->rows + r0, r1 - r0, m->w->gelu_table);
        }
    }
}

static void rase_matmul(rase_model *m, const rase_mat *w, const float *X, int T, float *Y, const float *bias,
                        int ith, int nth) {
    rase_matmuls(m, 1, &w, X, &Y, T, RASE_EPI_NONE, bias ? &bias : NULL, ith, nth);
}

#include "_moe.h"

// ---------------------------------------------------------------- the forward

#include <time.h>
static inline int64_t rase_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
// thread 0 times the ops between barriers (their wall time) when profiling
#define RASE_PROF_START(m, ith) const int64_t prof_t0 = ((m)->profile && (ith) == 0) ? rase_now_ns() : 0
#define RASE_PROF_ADD(m, ith, field) do { if ((m)->profile && (ith) == 0) (m)->field += rase_now_ns() - prof_t0; } while (0)

// y = the model's norm of x (RMSNorm, or LayerNorm with bias b); y may be x
static inline void rase_norm(const rase_model *m, const float *x, const float *w, const float *b, float *y) {
    if (m->w->hp.layer_norm) rase_layernorm(x, w, b, y, m->w->hp.n_embd, m->w->hp.eps);
    else rase_rmsnorm(x, w, y, m->w->hp.n_embd, m->w->hp.eps);
}

// h[t] = norm ? rmsnorm(x[t]) : x[t] (a block without pre-norms reads the residual itself)
static void rase_prenorm(const rase_model *m, const float *norm, const float *x, float *h) {
    const int E = m->w->hp.n_embd;
    if (norm) rase_rmsnorm(x, norm, h, E, m->w->hp.eps);
    else memcpy(h, x, (size_t)E * sizeof(float));
}

// x[t] += post_norm ? norm(o[t]) : o[t] for this thread's rows (norm_after_add: x[t] =
// norm(x[t] + o[t])), then (next) h[t] = rase_prenorm(next_norm, x[t]); a barrier after.
static void rase_residual(rase_model *m, const float *post_norm, const float *post_norm_b, int next,
                          const float *next_norm, int T, int ith, int nth) {
    const int E = m->w->hp.n_embd, after = m->w->hp.norm_after_add;
    int64_t lo, hi;
    rase_split(T, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; ++t) {
        float *o = m->s->o + t * E, *x = m->s->x + t * E;
        if (post_norm && !after) rase_norm(m, o, post_norm, post_norm_b, o);
        if (m->w->hp.residual_scale != 1.0f)  // ggml_scale, then ggml_add: two roundings
            for (int i = 0; i < E; ++i) o[i] *= m->w->hp.residual_scale;
        for (int i = 0; i < E; ++i) x[i] += o[i];
        if (post_norm && after) rase_norm(m, x, post_norm, post_norm_b, x);
        if (next) rase_prenorm(m, next_norm, x, m->s->h + t * E);
    }
    rase_sync(m, ith);
}

// per (row, head): QK-norm, RoPE (and Gemma's q prescale); K and V go to the row's pool slot.
// Items (row, K heads then Q heads) dealt round-robin: a K head costs more (its K/V stores),
// so leading with them spreads them over the threads.
static void rase_qk_rope_store(rase_model *m, const rase_layer *L, int il, const rase_batch *b, int ith,
                               int nth) {
    const rase_hparams *hp = &m->w->hp;
    rase_scratch *s = m->s;
    const int hd = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv, T = b->n;
    const int64_t nq = (int64_t)nh * hd, nk = (int64_t)nkv * hd, half_rot = hp->n_rot / 2;
    const float *rope = L->rope_slot < 0 ? NULL : s->rope + (size_t)L->rope_slot * s->max_rows * half_rot * 2;
    for (int64_t w = ith; w < (int64_t)T * (nh + nkv); w += nth) {
        const int t = (int)(w / (nh + nkv)), hh = (int)(w % (nh + nkv));
        const float *cs = rope ? rope + (size_t)t * half_rot * 2 : NULL;
        if (hh >= nkv) {
            float *qh = s->q + t * nq + (int64_t)(hh - nkv) * hd;
            if (L->q_norm && !L->qk_norm_full) rase_rmsnorm(qh, L->q_norm, qh, hd, hp->eps);
            if (cs) rase_rope(qh, cs, hp->n_rot, hp->rope_neox, m->isa);
            if (hp->attn_prescale)
                for (int i = 0; i < hd; ++i) qh[i] *= hp->attn_scale;
        } else {
            const rase_entry e = b->rows[t];
            float *khd = s->k + t * nk + (int64_t)hh * hd;
            const float *vh = s->v + t * nk + (int64_t)hh * hd;
            if (L->k_norm && !L->qk_norm_full) rase_rmsnorm(khd, L->k_norm, khd, hd, hp->eps);
            if (cs) rase_rope(khd, cs, hp->n_rot, hp->rope_neox, m->isa);
            if (!hp->causal) continue;  // an encoder attends to the step's own f32 K/V (rase_attend_f32)
            const int64_t slot = rase_kv_at(m->kv, il, hh, b->tables[e.seq * b->table_stride + e.pos / RASE_KV_BLOCK],
                                            e.pos % RASE_KV_BLOCK);
            rase_fp32_to_fp16_row(khd, m->kv->k + slot, hd, m->isa);
            rase_fp32_to_fp16_row(vh, m->kv->v + slot, hd, m->isa);
        }
    }
}

// the view of row t's sequence for layer il and KV head kh, and its keys [*j0, *j1)
static rase_kv_view rase_row_view(const rase_model *m, const rase_layer *L, int il, const rase_batch *b, int t,
                                  int kh, int *j0, int *j1) {
    const rase_kv_pool *kv = m->kv;
    const rase_entry e = b->rows[t];
    *j0 = L->window > 0 && e.pos - L->window + 1 > 0 ? e.pos - L->window + 1 : 0;
    *j1 = e.pos + 1;
    const int64_t koff = rase_kv_at(kv, il, kh, 0, 0);
    const rase_kv_view view = {kv->k + koff, kv->v + koff, b->tables + e.seq * b->table_stride,
                               (int64_t)RASE_KV_BLOCK * kv->head_dim, kv->head_dim};
    return view;
}

// query heads h0 .. h0 + g - 1 of row t: their q rows and attention outputs
static void rase_head_rows(const rase_model *m, int t, int h0, int g, const float **qs, float **outs) {
    const int64_t hd = m->w->hp.head_dim, nq = (int64_t)m->w->hp.n_head * hd;
    for (int i = 0; i < g; ++i) {
        qs[i] = m->s->q + t * nq + (h0 + i) * hd;
        outs[i] = m->s->att + t * nq + (h0 + i) * hd;
    }
}

// queries h0 .. h0 + g - 1 (g <= RASE_ATTN_G, one KV head) of row t, served together
static void rase_attend_heads(rase_model *m, const rase_layer *L, int il, const rase_batch *b, int t, int h0, int g,
                              int ith) {
    const rase_hparams *hp = &m->w->hp;
    rase_scratch *s = m->s;
    const int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    int j0, j1;
    const rase_kv_view view = rase_row_view(m, L, il, b, t, h0 / group, &j0, &j1);
    const float *qs[RASE_ATTN_G];
    float *outs[RASE_ATTN_G];
    rase_head_rows(m, t, h0, g, qs, outs);
    rase_attend(g, qs, &view, j0, j1, hd, hp->attn_prescale ? 1.0f : hp->attn_scale, hp->attn_softcap,
                s->scores + (size_t)ith * RASE_ATTN_G * s->attn_stride, s->attn_stride, outs, m->isa);
}

#define RASE_ATTN_SPLIT_MIN 512  // keys from which decode splits a KV head's group over threads

// Decode with few (row, KV head) items and a long context: items (row, KV head, up to
// RASE_ATTN_G of its query heads) cut into I * nth equal units, thread ith taking units
// [ith I, (ith + 1) I), so every thread reads 1 / nth of the K/V. An item a thread holds whole
// is one rase_attend; an item shared by threads is split with its bits (rase_attend_split):
// each takes its share of the keys, then, past a barrier, of the 32 P.V slots (a contiguous
// part of every K/V block), then of the head's elements. The shared scores and partial sums of
// an item live in the slot of the first thread that holds it. Returns 0 when the
// step does not qualify (the caller's split by query heads then serves it).
static int rase_attention_split(rase_model *m, const rase_layer *L, int il, const rase_batch *b, int ith, int nth) {
    const rase_hparams *hp = &m->w->hp;
    rase_scratch *s = m->s;
    const int hd = hp->head_dim, nkv = hp->n_head_kv, group = hp->n_head / nkv;
    const int nsub = (group + RASE_ATTN_G - 1) / RASE_ATTN_G;
    const int64_t I = (int64_t)b->n * nkv * nsub;
    int longest = 0;
    for (int t = 0; t < b->n; ++t) {
        int j0, j1;
        rase_row_view(m, L, il, b, t, 0, &j0, &j1);
        if (j1 - j0 > longest) longest = j1 - j0;
    }
    if (nth < 2 || longest < RASE_ATTN_SPLIT_MIN || !rase_attend_splits(hd, m->isa)) return 0;
    const float scale = hp->attn_prescale ? 1.0f : hp->attn_scale;
    float *own = s->scores + (size_t)ith * RASE_ATTN_G * s->attn_stride;
    for (int phase = 0; phase < 3; ++phase) {
        for (int64_t it = ith * I / nth; it < I && it * nth < (ith + 1) * I; ++it) {
            const int64_t lo = (ith * I > it * nth ? ith * I : it * nth) - it * nth;
            const int64_t hi = ((ith + 1) * I < (it + 1) * nth ? (ith + 1) * I : (it + 1) * nth) - it * nth;
            const int t = (int)(it / (nkv * nsub)), kh = (int)(it / nsub % nkv), h0 = kh * group + (int)(it % nsub) * RASE_ATTN_G;
            const int g = group - (h0 - kh * group) < RASE_ATTN_G ? group - (h0 - kh * group) : RASE_ATTN_G;
            if (lo == 0 && hi == nth) {
                if (phase == 0) rase_attend_heads(m, L, il, b, t, h0, g, ith);
                continue;
            }
            int j0, j1;
            const rase_kv_view view = rase_row_view(m, L, il, b, t, kh, &j0, &j1);
            const float *qs[RASE_ATTN_G];
            float *outs[RASE_ATTN_G];
            rase_head_rows(m, t, h0, g, qs, outs);
            const int64_t first = it * nth / I;  // the first thread that holds this item
            rase_attend_split(phase, g, qs, &view, j0, j1, hd, scale, hp->attn_softcap, (int)lo, (int)hi, nth,
                              s->shared + (size_t)first * RASE_ATTN_G * s->attn_stride, own, s->attn_stride, outs, m->isa);
        }
        if (phase < 2) rase_barrier_wait(&m->barrier);
    }
    return 1;
}

// Attention; each query is computed by the same operations however the queries are grouped.
// Enough rows to keep every thread busy: items (row, KV head) dealt round-robin (rows attend to
// different lengths, so contiguous ranges would leave threads idle), each serving its group in
// calls of up to RASE_ATTN_G. Fewer (decode): long contexts split the K/V reads evenly
// (rase_attention_split); short ones split the (row, query head) pairs into equal contiguous
// shares, consecutive heads of one KV head served together (each K/V row read once per call,
// not once per head). A row reads its own sequence's positions [j0, pos]: the rows of its own
// chunk were stored before the barrier that precedes this.
static void rase_attention(rase_model *m, const rase_layer *L, int il, const rase_batch *b, int ith, int nth) {
    const rase_hparams *hp = &m->w->hp;
    const int nh = hp->n_head, group = hp->n_head / hp->n_head_kv;
    if (!hp->causal) {  // an encoder: (row, head) items round-robin, over the sequence's rows in this step
        const int hd = hp->head_dim;
        const int64_t nq = (int64_t)nh * hd, nk = (int64_t)hp->n_head_kv * hd;
        float *scores = m->s->scores + (size_t)ith * RASE_ATTN_G * m->s->attn_stride;
        for (int64_t w = ith; w < (int64_t)b->n * nh; w += nth) {
            const int t = (int)(w / nh), h = (int)(w % nh), seq = b->rows[t].seq;
            const int64_t first = (int64_t)b->seq_first[seq] * nk + (int64_t)(h / group) * hd;
            rase_attend_f32(m->s->q + t * nq + (int64_t)h * hd, m->s->k + first, m->s->v + first, nk, b->seq_len[seq],
                            hd, hp->attn_prescale ? 1.0f : hp->attn_scale, scores, m->s->att + t * nq + (int64_t)h * hd,
                            m->isa);
        }
        return;
    }
    if ((int64_t)b->n * hp->n_head_kv >= 4 * nth) {
        for (int64_t w = ith; w < (int64_t)b->n * hp->n_head_kv; w += nth)
            for (int i = 0; i < group; i += RASE_ATTN_G) {
                const int h0 = (int)(w % hp->n_head_kv) * group + i;
                rase_attend_heads(m, L, il, b, (int)(w / hp->n_head_kv), h0, group - i < RASE_ATTN_G ? group - i : RASE_ATTN_G, ith);
            }
        return;
    }
    if (rase_attention_split(m, L, il, b, ith, nth)) return;
    int64_t lo, hi;
    rase_split((int64_t)b->n * nh, ith, nth, &lo, &hi);
    for (int64_t w = lo; w < hi;) {
        const int h = (int)(w % nh), end = (h / group + 1) * group;  // the KV head's last query + 1
        int g = end - h < RASE_ATTN_G ? end - h : RASE_ATTN_G;
        if (g > hi - w) g = (int)(hi - w);
        rase_attend_heads(m, L, il, b, (int)(w / nh), h, g, ith);
        w += g;
    }
}

// One layer; on entry h holds rase_prenorm(L->attn_norm, x) (1. attention norm: the previous
// layer's last op, or rase_embed's); next: the layer after (its attention norm is this layer's
// last op), or NULL.
static void rase_layer_forward(rase_model *m, const rase_layer *L, const rase_layer *next, int il,
                               const rase_batch *b, int ith, int nth) {
    rase_scratch *s = m->s;
    const int T = b->n;
    int64_t lo, hi;
    rase_split(T, ith, nth, &lo, &hi);
    // 2. Q, K, V projections share the normed input (plus their biases)
    {
        RASE_PROF_START(m, ith);
        const rase_mat *qkv[3] = {&L->wq, &L->wk, &L->wv};
        float *out[3] = {s->q, s->k, s->v};
        const float *bias[3] = {L->bq, L->bk, L->bv};
        rase_matmuls(m, 3, qkv, s->h, out, T, RASE_EPI_NONE, bias, ith, nth);
        rase_sync(m, ith);
        RASE_PROF_ADD(m, ith, prof_matmul_ns);
    }
    // 3. (full-width QK-norm), QK-norm per head, RoPE, K/V to the pool; 4. attention
    if (L->qk_norm_full) {
        const int64_t nq = (int64_t)m->w->hp.n_head * m->w->hp.head_dim, nk = (int64_t)m->w->hp.n_head_kv * m->w->hp.head_dim;
        for (int64_t t = lo; t < hi; ++t) {
            rase_rmsnorm(s->q + t * nq, L->q_norm, s->q + t * nq, nq, m->w->hp.eps);
            rase_rmsnorm(s->k + t * nk, L->k_norm, s->k + t * nk, nk, m->w->hp.eps);
        }
        rase_sync(m, ith);
    }
    rase_qk_rope_store(m, L, il, b, ith, nth);
    rase_sync(m, ith);
    {
        RASE_PROF_START(m, ith);
        rase_attention(m, L, il, b, ith, nth);
        rase_sync(m, ith);
        RASE_PROF_ADD(m, ith, prof_attn_ns);
    }
    // 5. output projection
    {
        RASE_PROF_START(m, ith);
        rase_matmul(m, &L->wo, s->att, T, s->o, L->bo, ith, nth);
        rase_sync(m, ith);
        RASE_PROF_ADD(m, ith, prof_matmul_ns);
    }
    // 6. (post-attention norm), residual, (FFN norm)
    rase_residual(m, L->post_attn_norm, L->post_attn_norm_b, 1, L->ffn_norm, T, ith, nth);
    // 7. gate and up over the same rows, then act(gate) * up on those rows; 8. down projection
    //    (a MoE layer: the chosen experts' FFNs, weighted, rase_moe_ffn)
    {
        RASE_PROF_START(m, ith);
        if (L->moe) {
            rase_moe_ffn(m, L, T, ith, nth);
        } else {
            const int gated = L->wgate.data != NULL;
            const rase_mat *gu[2] = {gated ? &L->wgate : &L->wup, &L->wup};
            float *out[2] = {s->g, s->u};
            const float *bias[2] = {gated ? L->bgate : L->bup, L->bup};
            rase_matmuls(m, gated ? 2 : 1, gu, s->h, out, T, gated ? RASE_EPI_GATE : RASE_EPI_ACT, bias, ith, nth);
            rase_sync(m, ith);
            rase_matmul(m, &L->wdown, s->g, T, s->o, L->bdown, ith, nth);
            rase_sync(m, ith);
        }
        RASE_PROF_ADD(m, ith, prof_matmul_ns);
    }
    // 9. (post-FFN norm), residual, (the next layer's attention norm)
    rase_residual(m, L->post_ffn_norm, L->post_ffn_norm_b, next != NULL, next ? next->attn_norm : NULL, T, ith, nth);
}

// embeddings, the first layer's attention norm and RoPE tables of this thread's rows, from
// each row's own token and position
static void rase_embed(rase_model *m, const rase_batch *b, int ith, int nth) {
    const rase_weights *w = m->w;
    const rase_hparams *hp = &w->hp;
    const int E = hp->n_embd, nslots = hp->rope[1].base > 0.0f ? 2 : 1;
    const int64_t half_rot = hp->n_rot / 2;
    const rase_dequant_fn deq = rase_dequant_for(w->tok_embd.type, m->isa);
    int64_t lo, hi;
    rase_split(b->n, ith, nth, &lo, &hi);
    const rase_mat *te = &w->tok_embd;
    uint8_t *plain = (uint8_t *)rase_work(m->s, ith);  // one row of ggml blocks (row_bytes <= 4 x E)
    for (int64_t t = lo; t < hi; ++t) {
        float *x = m->s->x + t * E;
        const int64_t tok = b->rows[t].token;
        if (te->layout == RASE_LAYOUT_R16) {  // tied: the output's repacked copy, the same bytes
            rase_r16_unpack_row(te->type, te->packed, te->group_bytes, E, tok, plain);
            deq(plain, x, E);
        } else
            deq(te->data + tok * te->row_bytes, x, E);
        if (hp->embd_scale != 1.0f)
            for (int i = 0; i < E; ++i) x[i] *= hp->embd_scale;
        if (w->type_embd)  // bert: token type 0 ("sentence A"), then the learned position
            for (int i = 0; i < E; ++i) x[i] += w->type_embd[i];
        if (w->pos_embd.data) {
            float *p = m->s->o + t * E;
            rase_dequant_for(w->pos_embd.type, m->isa)(w->pos_embd.data + b->rows[t].pos * w->pos_embd.row_bytes, p, E);
            for (int i = 0; i < E; ++i) x[i] = p[i] + x[i];
        }
        if (w->embd_norm) rase_norm(m, x, w->embd_norm, w->embd_norm_b, x);
        rase_prenorm(m, w->layers[0].attn_norm, x, m->s->h + t * E);
        for (int sl = 0; sl < nslots; ++sl)
            rase_rope_table(m->s->rope + ((size_t)sl * m->s->max_rows + t) * half_rot * 2, b->rows[t].pos,
                            hp->n_rot, &hp->rope[sl]);
    }
}

// One step. The caller checks: 1 <= n <= max_rows; n_out <= max_rows; tokens < n_vocab;
// 0 <= pos < n_ctx; every (seq, pos) row has a block in its table; out_rows in [0, n).
// samplers (n_out) or NULL: when given, tokens[j] = the token sampled from logits row j (or
// rase_sample's RASE_SAMPLE_INVALID / RASE_SAMPLE_NONE), rows split across threads (each sampler has its own RNG).
static void rase_step(rase_model *m, const rase_batch *b, const rase_sampler_ref *samplers, int32_t *tokens) {
    const int E = m->w->hp.n_embd, V = m->w->hp.n_vocab;
    const int64_t t_step = rase_now_ns();  // two clock reads a step: the Python path's yardstick
#pragma omp parallel num_threads(m->s->n_threads)
    {
        int ith = 0, nth = 1;
#ifdef _OPENMP
        ith = omp_get_thread_num();
        nth = omp_get_num_threads();
#endif
#pragma omp single
        {
            m->barrier.n = nth;
            m->barrier.count = 0;
            m->s->nonfinite = 0;
            for (int i = 0; i < nth; ++i) m->s->jobs[i].next = 0;
        }  // implicit barrier: every thread sees n
        for (int a = 0; a < 2 * ACT_COUNT; ++a) m->s->act_src[ith * 2 * ACT_COUNT + a] = NULL;
        rase_embed(m, b, ith, nth);
        rase_sync(m, ith);
        for (int il = 0; il < m->w->hp.n_layer; ++il) {
            rase_layer_forward(m, &m->w->layers[il], il + 1 < m->w->hp.n_layer ? &m->w->layers[il + 1] : NULL, il,
                               b, ith, nth);
            if (m->trace && ith == 0) memcpy(m->trace + (size_t)il * b->n * E, m->s->x, (size_t)b->n * E * sizeof(float));
        }
        // hidden states of the embedding rows, after the final norm when the model has one
        int64_t lo, hi;
        rase_split(b->n_embd, ith, nth, &lo, &hi);
        for (int64_t j = lo; j < hi; ++j) {
            const float *x = m->s->x + (int64_t)b->embd_rows[j] * E;
            if (m->w->output_norm) rase_rmsnorm(x, m->w->output_norm, b->embd + j * E, E, m->w->hp.eps);
            else memcpy(b->embd + j * E, x, (size_t)E * sizeof(float));
        }
        // final norm of the wanted rows, gathered in output order, then the LM head
        rase_split(b->n_out, ith, nth, &lo, &hi);
        for (int64_t j = lo; j < hi; ++j)
            rase_rmsnorm(m->s->x + (int64_t)b->out_rows[j] * E, m->w->output_norm, m->s->h + j * E, E, m->w->hp.eps);
        rase_sync(m, ith);
        if (b->n_out > 0 && m->w->output.data) {  /* the LM head is a matmul too (72% of Gemma3's bytes per token) */
            RASE_PROF_START(m, ith);
            rase_matmul(m, &m->w->output, m->s->h, b->n_out, b->logits, NULL, ith, nth);
            RASE_PROF_ADD(m, ith, prof_matmul_ns);
        }
        if (m->w->hp.final_softcap > 0.0f || m->w->hp.logit_mul != 1.0f) {  // gemma2, granite
            rase_sync(m, ith);
            rase_split((int64_t)b->n_out * V, ith, nth, &lo, &hi);
            if (m->w->hp.logit_mul != 1.0f)
                for (int64_t i = lo; i < hi; ++i) b->logits[i] *= m->w->hp.logit_mul;
            if (m->w->hp.final_softcap > 0.0f) rase_softcap(b->logits, lo, hi, m->w->hp.final_softcap);
            if (rase_any_nonfinite(b->logits + lo, hi - lo, 1, 0, hi - lo))
                __atomic_store_n(&m->s->nonfinite, 1, __ATOMIC_RELAXED);
        }
        if (samplers) {
            rase_sync(m, ith);
            for (int j = ith; j < b->n_out; j += nth) {
                const rase_sampler_ref *r = &samplers[j];
                if (!r->p) { tokens[j] = RASE_SAMPLE_NONE; continue; }  // a row read, not sampled
                tokens[j] = rase_sample(b->logits + (int64_t)j * V, V, r->counts, r->p, r->rng, r->work, r->allow);
            }
        }
    }
    m->step_ns += rase_now_ns() - t_step;
}

#endif  // RASE_FORWARD_H
