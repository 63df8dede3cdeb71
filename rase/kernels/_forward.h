// rase/kernels/_forward.h: the one transformer forward shared by every architecture.
//
// rase_step evaluates a batch of (token, sequence, position) rows (the state: _model.h) inside one
// OpenMP parallel region (ops split work by thread, barriers between them), then samples the rows
// that need a token.
//
// Numerics contract: every output element is computed by one thread, and each row by the same
// arithmetic whatever else is in the step (the one-token kernels, per-row activation
// quantization, per-row norms and RoPE, attention over the row's own sequence). A sequence's
// logits therefore do not depend on the batch, its chunking, the thread count or the pool
// blocks that hold its K/V, and they equal llama.cpp's one-token (n_batch = 1) numerics.
#ifndef RASE_FORWARD_H
#define RASE_FORWARD_H


#include "_mix_attention.h"
#include "_mix_shortconv.h"
#include "_mix_deltanet.h"
#include "_moe.h"

// ---------------------------------------------------------------- the forward

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

// the token mixers by RASE_MIXER_* (a layer's mixer): its block and its scratch needs
static const rase_mixer RASE_MIXERS[] = {
    [RASE_MIXER_ATTENTION] = {rase_attention_block, rase_attention_needs},
    [RASE_MIXER_SHORTCONV] = {rase_shortconv, rase_shortconv_needs},
    [RASE_MIXER_DELTANET] = {rase_deltanet, rase_deltanet_needs},
};

// the scratch widths a step of this model needs (rase_scratch_alloc): the embeddings' and the
// FFN's (rase_scratch_base), then those of each mixer its layers use
static rase_scratch_need rase_forward_needs(const rase_weights *w) {
    rase_scratch_need need = rase_scratch_base(&w->hp);
    unsigned seen = 0;
    for (int il = 0; il < w->hp.n_layer; ++il) {
        const int mixer = w->layers[il].mixer;
        if (!(seen >> mixer & 1u)) RASE_MIXERS[mixer].needs(&w->hp, &need);
        seen |= 1u << mixer;
    }
    return need;
}

// One layer; on entry h holds rase_prenorm(L->attn_norm, x) (1. attention norm: the previous
// layer's last op, or rase_embed's); next: the layer after (its attention norm is this layer's
// last op), or NULL.
static void rase_layer_forward(rase_model *m, const rase_layer *L, const rase_layer *next, int il,
                               const rase_batch *b, int ith, int nth) {
    rase_scratch *s = m->s;
    const int T = b->n;
    RASE_MIXERS[L->mixer].block(m, L, il, b, ith, nth);
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

// s->order = the step's rows by (sequence, position): a recurrent layer runs each sequence's
// rows in position order whatever order the step lists them in. Insertion sort: a scheduler's
// steps come in that order already (linear), and no sort state is shared between models.
static void rase_row_order(rase_model *m, const rase_batch *b) {
    int32_t *o = m->s->order, *runs = m->s->runs;
    for (int t = 0; t < b->n; ++t) {
        const rase_entry e = b->rows[t];
        int i = t;
        for (; i > 0; --i) {
            const rase_entry p = b->rows[o[i - 1]];
            if (p.seq < e.seq || (p.seq == e.seq && p.pos < e.pos)) break;
            o[i] = o[i - 1];
        }
        o[i] = t;
    }
    int n = 0;  // runs: where each sequence's rows begin in order, then the end
    for (int i = 0; i < b->n; ++i)
        if (i == 0 || b->rows[o[i]].seq != b->rows[o[i - 1]].seq) runs[n++] = i;
    runs[n] = b->n;
    m->s->n_runs = n;
}

// row t's RoPE table for slot sl: its position's, or its M-RoPE positions' (rope_pos)
static void rase_row_rope(const rase_model *m, const rase_batch *b, int64_t t, int sl) {
    const rase_hparams *hp = &m->w->hp;
    float *cs = m->s->rope + ((size_t)sl * m->s->max_rows + t) * (hp->n_rot / 2) * 2;
    if (b->rope_pos) {
        const int sect[4] = {hp->rope_sect_t, hp->rope_sect_h, hp->rope_sect_w, hp->rope_sect_e};
        rase_mrope_table(cs, b->rope_pos + 4 * t, hp->n_rot, &hp->rope[sl], sect, hp->rope_multi == RASE_IMROPE);
    } else
        rase_rope_table(cs, b->rows[t].pos, hp->n_rot, &hp->rope[sl]);
}

// embeddings, the first layer's attention norm and RoPE tables of this thread's rows, from
// each row's own token and position
static void rase_embed(rase_model *m, const rase_batch *b, int ith, int nth) {
    const rase_weights *w = m->w;
    const rase_hparams *hp = &w->hp;
    const int E = hp->n_embd, nslots = hp->rope[1].base > 0.0f ? 2 : 1;
    const rase_dequant_fn deq = rase_dequant_for(w->tok_embd.type, m->isa);
    int64_t lo, hi;
    rase_split(b->n, ith, nth, &lo, &hi);
    const rase_mat *te = &w->tok_embd;
    uint8_t *plain = (uint8_t *)rase_work(m->s, ith);  // one row of ggml blocks (row_bytes <= 4 x E)
    for (int64_t t = lo; t < hi; ++t) {
        float *x = m->s->x + t * E;
        const int64_t tok = b->rows[t].token;
        if (b->in_row && b->in_row[t] >= 0) {  // an input row (an image's): as given, never scaled
            memcpy(x, b->in_embd + (int64_t)b->in_row[t] * E, (size_t)E * sizeof(float));
            rase_prenorm(m, w->layers[0].attn_norm, x, m->s->h + t * E);
            for (int sl = 0; sl < nslots; ++sl) rase_row_rope(m, b, t, sl);
            continue;
        }
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
        for (int sl = 0; sl < nslots; ++sl) rase_row_rope(m, b, t, sl);
    }
}

// The LM head (a matmul too: 72% of Gemma3's bytes per token): logits of the n_out gathered rows
// (in h), each checked for NaN and +-inf (s->nonfinite): chunk by chunk as the matmul writes them,
// or after a logit multiplier and soft-cap (granite, gemma2) once those are applied.
static void rase_lm_head(rase_model *m, const rase_batch *b, int ith, int nth) {
    const rase_hparams *hp = &m->w->hp;
    const rase_mat *w = &m->w->output;
    const int after = hp->final_softcap > 0.0f || hp->logit_mul != 1.0f;
    {
        RASE_PROF_START(m, ith);
        rase_matmuls(m, 1, &w, m->s->h, &b->logits, b->n_out, after ? RASE_EPI_NONE : RASE_EPI_FINITE, NULL, ith, nth);
        RASE_PROF_ADD(m, ith, prof_matmul_ns);
    }
    if (!after) return;
    rase_sync(m, ith);
    int64_t lo, hi;
    rase_split((int64_t)b->n_out * hp->n_vocab, ith, nth, &lo, &hi);
    if (hp->logit_mul != 1.0f)
        for (int64_t i = lo; i < hi; ++i) b->logits[i] *= hp->logit_mul;
    if (hp->final_softcap > 0.0f) rase_softcap(b->logits, lo, hi, hp->final_softcap);
    if (rase_any_nonfinite(b->logits + lo, hi - lo, 1, 0, hi - lo)) __atomic_store_n(&m->s->nonfinite, 1, __ATOMIC_RELAXED);
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
            if (m->w->hp.state_floats) rase_row_order(m, b);
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
        if (b->n_out > 0 && m->w->output.data) rase_lm_head(m, b, ith, nth);
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
