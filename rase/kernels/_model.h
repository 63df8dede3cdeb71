// rase/kernels/_model.h: the forward's state, kept apart (llama2.c's split): rase_hparams and
// rase_weights are read-only after load (weight pointers into the mmap) and shared by every
// sequence; rase_kv_pool holds f16 K/V in blocks of RASE_KV_BLOCK positions that sequences own or
// share through block tables; rase_scratch holds one step's activations; rase_batch is one step.
#ifndef RASE_MODEL_H
#define RASE_MODEL_H

#include <stddef.h>
#include <stdlib.h>
#include <time.h>
#include "_traits.h"
#include "_pool.h"
#include "_attention.h"
#include "_sample.h"
#include "_ops.h"
#include "_conv.h"
#include "_deltanet.h"

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
    const float *sinks;                           // (n_head,) attention sink logits (gpt-oss) or NULL
    int qk_norm_full;  // 1: q_norm/k_norm span all heads of a row (olmo2); 0: each head
    int window;     // sliding-window length in positions; 0 = full causal attention
    int rope_slot;  // 0 or 1: which of the model's rope params; -1: no RoPE in this layer (NoPE)
    // mixture of experts (moe = 1): router (n_expert, n_embd) and experts (n_expert,) each
    int moe;
    rase_mat gate_inp;
    const rase_mat *exp_gate, *exp_up, *exp_down;
    const float *gate_inp_b;                     // (n_expert,) router bias or NULL (gpt-oss)
    const float *exp_bgate, *exp_bup, *exp_bdown;  // (n_expert, rows) expert biases or NULL
    // the token mixer: attention (K/V in pool layer kv_layer), LFM2's short convolution or
    // Qwen3.5's gated delta net (their state in a sequence's slot, from state_off floats on)
    int mixer;                   // RASE_MIXER_*
    int kv_layer;                // attention: this layer's index in the KV pool; -1 otherwise
    rase_mat conv_in, conv_out;  // in/out projections: shortconv (3E, E) -> b, c, x and (E, E);
                                 // delta net (conv_dim, E) -> q, k, v channels and (E, d_inner)
    const float *conv_w;         // (n_conv, channels) taps, tap-major (_conv.h)
    int64_t state_off;
    rase_mat ssm_z, ssm_beta, ssm_alpha;  // delta net: (d_inner, E) output gate; (H_v, E) twice
    const float *ssm_dt, *ssm_a, *ssm_norm;  // (H_v,) gate bias, (H_v,) -exp(A_log), (S,) the output norm
} rase_layer;

enum { RASE_MIXER_ATTENTION, RASE_MIXER_SHORTCONV, RASE_MIXER_DELTANET };

enum {  // how a MoE layer weighs its chosen experts (llama.cpp's expert_gating_func)
    RASE_GATING_SOFTMAX,         // softmax over all router logits; the top k probabilities
    RASE_GATING_SOFTMAX_WEIGHT,  // the top k logits; softmax over those k (gpt-oss)
};

// One RoPE as ggml_rope_ext applies it (after llama_context's setup of its parameters):
// theta_i = pos * base^(-2i/n_rot) / factors[i], scaled by freq_scale; YaRN (ext_factor != 0)
// mixes the scaled and unscaled angle by a ramp over dimensions [corr_dims[0], corr_dims[1]];
// cos and sin are multiplied by attn_factor (rase_rope_init).

// The hyper-parameters a plan sets, by name (models/base.py: forward_params, each the field of
// that name of HParams or ModelSpec): I(name) an int, F(name) a float. The struct's fields and
// the table _kernels.Weights copies them through (RASE_HPARAM_FIELDS) are both made from it.
enum { RASE_ROPE_SINGLE = 0, RASE_MROPE = 1, RASE_IMROPE = 2 };  // rase_hparams.rope_multi

#define RASE_HPARAMS(I, F) \
    I(n_layer) I(n_embd) I(n_head) I(n_head_kv) I(head_dim) I(n_ff) I(n_vocab) I(n_rot) \
    I(n_ctx)           /* positions one sequence may reach */ \
    I(rope_neox)       /* 1: rotate (i, i + n_rot/2) pairs (NeoX), 0: (2i, 2i+1) */ \
    I(gelu)            /* 1: GELU(tanh) gate, 0: SiLU gate */ \
    I(attn_prescale)   /* 1: q *= attn_scale before rounding (gemma), scores unscaled */ \
    F(eps) F(embd_scale) F(attn_scale) \
    F(attn_softcap) F(final_softcap)  /* > 0: s -> cap * tanh(s / cap) on scores / logits (gemma2) */ \
    F(residual_scale)  /* != 1: each sublayer's output times this before the residual add (granite) */ \
    F(logit_mul)       /* != 1: the logits times this (granite's 1 / logit_scale) */ \
    I(layer_norm)      /* 1: norms are LayerNorm (mean removed) with a bias, 0: RMSNorm */ \
    I(norm_after_add)  /* 1: x = post_norm(x + sublayer) (BERT's post-LN), 0: x += post_norm(sublayer) */ \
    I(causal)          /* 0: a row attends to every position its sequence has in the step */ \
    I(n_expert) I(n_expert_used) I(n_ff_exp)  /* MoE layers: experts, chosen per token, width */ \
    I(expert_norm)     /* 1: the chosen experts' weights renormalized to sum 1 */ \
    I(expert_gating)   /* RASE_GATING_* */ \
    F(swiglu_limit) F(swiglu_alpha)  /* limit > 0: experts' act is gpt-oss's (rase_swiglu_oai) */ \
    I(n_conv)          /* taps of the recurrent layers' convolution (LFM2's l_cache, Qwen3.5's d_conv), 0 without */ \
    I(ssm_head) I(ssm_k_heads) I(ssm_v_heads)  /* delta net: head size S, key heads, value heads (H_v) */ \
    I(attn_gate)       /* 1: attn_q holds each head's query then its output gate (Qwen3.5): out *= sigmoid(gate) */ \
    I(rope_multi)      /* M-RoPE of rows given (t, h, w, e) positions: RASE_MROPE (sections in order) or RASE_IMROPE */ \
    I(rope_sect_t) I(rope_sect_h) I(rope_sect_w) I(rope_sect_e)  /* pairs per section (rope.dimension_sections) */

#define RASE_HPARAM_INT(name) int name;
#define RASE_HPARAM_FLOAT(name) float name;
typedef struct {
    RASE_HPARAMS(RASE_HPARAM_INT, RASE_HPARAM_FLOAT)
    rase_rope_params rope[2];  // rope[1] unused when its base is 0 (set by rase_rope_init, not by name)
    int n_kv_layer;        // layers with K/V in the pool (the attention layers), counted at load
    int64_t state_floats;  // floats of one sequence's recurrent state (every recurrent layer's), counted at load
} rase_hparams;

typedef struct { const char *name; int offset, is_float; } rase_hparam_field;
#define RASE_HPARAM_INT_ROW(name) {#name, (int)offsetof(rase_hparams, name), 0},
#define RASE_HPARAM_FLOAT_ROW(name) {#name, (int)offsetof(rase_hparams, name), 1},
static const rase_hparam_field RASE_HPARAM_FIELDS[] = {RASE_HPARAMS(RASE_HPARAM_INT_ROW, RASE_HPARAM_FLOAT_ROW)};
#define RASE_HPARAM_COUNT ((int)(sizeof(RASE_HPARAM_FIELDS) / sizeof(RASE_HPARAM_FIELDS[0])))

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
    // (n_layer, n_head_kv, n_blocks, RASE_KV_BLOCK, row_elems) uint16: f16 elements or q8_0 / q4_0
    // blocks (rase_kv_row_elems); pages touched as written. One
    // head's rows of a layer are contiguous block after block, so a sequence whose blocks were
    // taken in order reads each head's K and V as one stream
    uint16_t *k, *v;
    int32_t n_blocks, n_layer, n_head_kv, head_dim;  // n_layer: the attention layers
    int32_t type, row_elems;  // RASE_TYPE_F16 / Q8_0 / Q4_0; uint16 units of one (position, head) row
    int32_t rot_k, rot_v;     // a quantized pool's Walsh-Hadamard part sizes (rase_kv_rot_k/v), 0: none
    // (n_slots, state_floats) f32: recurrent state slots. A running sequence's is updated in place
    // by its rows; the others are checkpoints (copies at a position the prefix cache keeps)
    float *state;
    int64_t state_floats;
    int32_t n_slots;
} rase_kv_pool;

// A step's scratch widths per row (floats) beyond the embedding's: the FFN's and each token
// mixer's (_mix.h: rase_scratch_base below, then each mixer a model uses raises its own)
typedef struct {
    int64_t g, u;    // the FFN's gate and up (a mixer's projections also land here)
    int64_t att;     // the attention heads' outputs, or another mixer's output
    int64_t mix;     // a mixer's second buffer (mix_stride): a gated attention's q + gate, a delta net's channels
    int64_t gates;   // per value head: a delta net's beta and alpha
    int64_t cols;    // the widest input a matmul quantizes (the activation and work buffers)
} rase_scratch_need;

typedef struct {
    int max_rows, n_threads, n_ctx;
    float *x, *h, *o;      // (max_rows, n_embd)
    float *q, *att;        // (max_rows, n_head * head_dim), (max_rows, rase_scratch_need.att)
    float *k, *v;          // (max_rows, n_head_kv * head_dim)
    float *g, *u;          // (max_rows, rase_scratch_need.g | .u): the FFN's gate and up, a mixer's projections
    float *router;         // (max_rows, n_expert) router logits, then probabilities
    int32_t *sel, *pair;   // (max_rows, n_expert_used): chosen experts; their pair slot
    float *wsel;           // (max_rows, n_expert_used): their weights
    int32_t *ptok;         // (max_rows * n_expert_used,): the token of each pair slot
    int32_t *seg, *cursor; // (n_expert + 1,), (n_expert,): expert e's pairs are slots [seg[e], seg[e+1])
    int32_t *order;        // (max_rows,): the step's rows by (sequence, position), for recurrent layers
    int32_t *runs;         // (max_rows + 1,): order[runs[i] .. runs[i + 1]) are one sequence's rows
    int n_runs;
    float *mix;            // (max_rows, mix_stride): a delta net's convolved q, k, v; a gated attention's q + gate
    float *gates;          // (2, max_rows, rase_scratch_need.gates): a delta net's beta, then alpha, per value head
    int64_t mix_stride;
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
    const int32_t *slots;      // a model with recurrent layers: seq s's state is in slot slots[s]
    const int32_t *embd_rows;  // (n_embd,): rows whose final hidden state is wanted (embeddings)
    int n_embd;
    float *embd;               // (n_embd, n_embd floats): after the final norm when the model has one
    const float *in_embd;      // NULL, or (*, n_embd) input rows: row t with in_row[t] >= 0 enters as
    const int32_t *in_row;     //   in_embd[in_row[t]] (an image's row, unscaled) instead of its token's
    const int32_t *key_end;    // NULL, or (n,): row t attends to its sequence's keys < key_end[t] (> pos:
                               //   a non-causal span, every row of it in this step); else keys <= pos
    const int32_t *rope_pos;   // NULL, or (n, 4): row t's M-RoPE positions (t, h, w, e), apart from its
                               //   cell pos (an image's rows; a Qwen-VL prompt's text after one)
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

static inline int64_t rase_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
// thread 0 times the ops between barriers (their wall time) when profiling
#define RASE_PROF_START(m, ith) const int64_t prof_t0 = ((m)->profile && (ith) == 0) ? rase_now_ns() : 0
#define RASE_PROF_ADD(m, ith, field) do { if ((m)->profile && (ith) == 0) (m)->field += rase_now_ns() - prof_t0; } while (0)

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
    free(kv->state);
    kv->k = kv->v = NULL;
    kv->state = NULL;
}

// 0 on success, -1 when out of memory
static int rase_kv_pool_alloc(rase_kv_pool *kv, const rase_hparams *hp, int32_t n_blocks, int32_t n_slots, int type,
                              int rotate) {
    kv->n_blocks = n_blocks;
    kv->n_layer = hp->n_kv_layer;
    kv->n_head_kv = hp->n_head_kv;
    kv->head_dim = hp->head_dim;
    kv->type = type;
    kv->row_elems = rase_kv_row_elems(type, hp->head_dim);
    kv->rot_k = rotate && hp->causal ? rase_kv_rot_k(type, hp->head_dim) : 0;
    kv->rot_v = rotate && hp->causal ? rase_kv_rot_v(type, hp->head_dim) : 0;
    kv->state_floats = hp->state_floats;
    kv->n_slots = n_slots;
    const size_t bytes = (size_t)n_blocks * hp->n_kv_layer * hp->n_head_kv * RASE_KV_BLOCK * kv->row_elems * sizeof(uint16_t);
    kv->k = rase_alloc(bytes);  // never written here: pages are touched as positions fill
    kv->v = rase_alloc(bytes);
    kv->state = hp->state_floats ? rase_alloc((size_t)n_slots * hp->state_floats * sizeof(float)) : NULL;
    if (!kv->k || !kv->v || (hp->state_floats && !kv->state)) { rase_kv_pool_free(kv); return -1; }
    return 0;
}

// pool offset (elements) of row `row` of block `blk`, layer il, KV head h
// slot's recurrent state (state_floats floats)
static inline float *rase_state_at(const rase_kv_pool *kv, int64_t slot) { return kv->state + slot * kv->state_floats; }

static void rase_state_copy(rase_kv_pool *kv, int32_t src, int32_t dst) {
    memcpy(rase_state_at(kv, dst), rase_state_at(kv, src), (size_t)kv->state_floats * sizeof(float));
}

static inline int64_t rase_kv_at(const rase_kv_pool *kv, int il, int h, int64_t blk, int row) {
    return ((((int64_t)il * kv->n_head_kv + h) * kv->n_blocks + blk) * RASE_KV_BLOCK + row) * kv->row_elems;
}

// rows [0, n) of block src copied into block dst, every attention layer, K and V (a cached
// block's leading positions reused by a sequence that shares only them)
static void rase_kv_copy_rows(rase_kv_pool *kv, int32_t src, int32_t dst, int n) {
    const size_t bytes = (size_t)n * kv->row_elems * sizeof(uint16_t);
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
                    s->ptok, s->seg, s->cursor, s->pg, s->pu, s->pd, s->pact, s->jobs, s->work, s->order,
                    s->runs, s->mix, s->gates};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); ++i) free(bufs[i]);
    memset(s, 0, sizeof(*s));
}

static rase_scratch_need rase_scratch_base(const rase_hparams *hp) {
    int64_t cols = hp->n_embd > hp->n_ff ? hp->n_embd : hp->n_ff;
    if (hp->n_ff_exp > cols) cols = hp->n_ff_exp;
    const rase_scratch_need need = {hp->n_ff, hp->n_ff, hp->n_embd, 0, 1, cols};
    return need;
}

// scratch for steps of up to max_rows rows over sequences of up to n_ctx positions, as wide as
// need says (_forward.h: rase_forward_needs)
static int rase_scratch_alloc(rase_scratch *s, const rase_hparams *hp, const rase_scratch_need *need, int max_rows,
                              int n_threads) {
    memset(s, 0, sizeof(*s));
    s->max_rows = max_rows;
    s->n_threads = n_threads;
    s->n_ctx = hp->n_ctx;
    const int64_t B = max_rows, nq = (int64_t)hp->n_head * hp->head_dim;
    const int64_t nkv = (int64_t)hp->n_head_kv * hp->head_dim;
    s->mix_stride = need->mix;
    s->act_stride = (int64_t)rase_act_bytes(ACT_F32, need->cols) + 64;
    s->x = rase_alloc(B * hp->n_embd * 4);
    s->h = rase_alloc(B * hp->n_embd * 4);
    s->o = rase_alloc(B * hp->n_embd * 4);
    s->q = rase_alloc(B * nq * 4);
    s->att = rase_alloc(B * need->att * 4);
    s->k = rase_alloc(B * nkv * 4);
    s->v = rase_alloc(B * nkv * 4);
    s->g = rase_alloc(B * need->g * 4);
    s->u = rase_alloc(B * need->u * 4);
    s->rope = rase_alloc(2 * B * (hp->n_rot / 2) * 2 * 4);
    s->attn_stride = rase_attend_scratch(hp->n_ctx, hp->head_dim);
    s->scores = rase_alloc((size_t)n_threads * RASE_ATTN_G * s->attn_stride * 4);
    s->shared = rase_alloc((size_t)n_threads * RASE_ATTN_G * s->attn_stride * 4);  // touched by long decodes only
    s->act = rase_alloc((size_t)n_threads * ACT_COUNT * s->act_stride);
    s->act_rows = rase_alloc((size_t)ACT_COUNT * B * s->act_stride);
    s->act_src = rase_alloc((size_t)n_threads * 2 * ACT_COUNT * sizeof(float *));
    s->jobs = rase_alloc((size_t)n_threads * sizeof(rase_job_slot));
    s->order = rase_alloc((size_t)B * sizeof(int32_t));
    s->runs = rase_alloc((size_t)(B + 1) * sizeof(int32_t));
    s->mix = rase_alloc((size_t)B * s->mix_stride * 4);
    s->gates = rase_alloc((size_t)2 * B * need->gates * 4);
    s->work_stride = (RASE_CHUNK_ROWS * need->cols + 15) / 16 * 16;  // pages touched only by a GEMM that uses them
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
        !s->scores || !s->shared || !s->act || !s->act_rows || !s->act_src || !s->jobs || !s->work || !s->order ||
        !s->runs || !s->mix || !s->gates) {
        rase_scratch_free(s);
        return -1;
    }
    return 0;
}

#endif  // RASE_MODEL_H
