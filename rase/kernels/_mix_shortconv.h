// rase/kernels/_mix_shortconv.h: LFM2's gated short convolution mixer (its kernel: _conv.h).
#ifndef RASE_MIX_SHORTCONV_H
#define RASE_MIX_SHORTCONV_H

#include "_mix.h"

// LFM2's short convolution block, h -> o: b, c, x = in_proj(h); each row's gated convolution
// (_conv.h) over its sequence's previous positions; out_proj. Threads take channel ranges and
// every row in (sequence, position) order (s->order, rase_row_order).
static void rase_shortconv(rase_model *m, const rase_layer *L, int il, const rase_batch *b, int ith, int nth) {
    (void)il;
    rase_scratch *s = m->s;
    const int T = b->n, d = m->w->hp.n_conv - 1;
    const int64_t E = m->w->hp.n_embd;
    {
        RASE_PROF_START(m, ith);
        rase_matmul(m, &L->conv_in, s->h, T, s->g, NULL, ith, nth);
        rase_sync(m, ith);
        RASE_PROF_ADD(m, ith, prof_matmul_ns);
    }
    int64_t c0, c1;
    rase_split(E, ith, nth, &c0, &c1);
    for (int i = 0; i < T; ++i) {
        const int t = s->order[i];
        float *src, *dst;
        rase_row_states(m, b, t, L->state_off, &src, &dst);
        rase_shortconv_row(m->isa, d, s->g + t * 3 * E, E, L->conv_w, src, dst, s->att + t * E, c0, c1);
    }
    rase_sync(m, ith);
    RASE_PROF_START(m, ith);
    rase_matmul(m, &L->conv_out, s->att, T, s->o, NULL, ith, nth);
    rase_sync(m, ith);
    RASE_PROF_ADD(m, ith, prof_matmul_ns);
}

// g: in_proj's b, c, x (3 n_embd per row); att: the convolution's output (n_embd)
static void rase_shortconv_needs(const rase_hparams *hp, rase_scratch_need *need) {
    rase_need(&need->g, 3 * (int64_t)hp->n_embd);
    rase_need(&need->att, hp->n_embd);
}

#endif  // RASE_MIX_SHORTCONV_H
