// rase/kernels/_mix.h: what a token mixer is (a layer's attention or recurrent block, h -> o,
// _mix_attention.h, _mix_shortconv.h, _mix_deltanet.h): its block, and what it needs of a step's
// scratch as widths per row (rase_scratch_need, _model.h), one row of RASE_MIXERS (_forward.h)
// each, so a new mixer adds a row and a header; and the recurrent mixers' state rows.
#ifndef RASE_MIX_H
#define RASE_MIX_H

#include "_matmul.h"

typedef void (*rase_mixer_fn)(rase_model *m, const rase_layer *L, int il, const rase_batch *b, int ith, int nth);
typedef void (*rase_mixer_needs_fn)(const rase_hparams *hp, rase_scratch_need *need);
typedef struct {
    rase_mixer_fn block;        // h -> o for the step's rows, between barriers
    rase_mixer_needs_fn needs;  // raises the scratch widths its block uses (rase_need)
} rase_mixer;

static inline void rase_need(int64_t *width, int64_t at_least) {
    if (at_least > *width) *width = at_least;
}

// the state a row reads (its sequence's slot; NULL at position 0: zeros) and the one it
// writes (the same slot: rows update it in place, in position order), for a layer's share at off
static void rase_row_states(const rase_model *m, const rase_batch *b, int t, int64_t off, float **src, float **dst) {
    const rase_entry e = b->rows[t];
    *dst = rase_state_at(m->kv, b->slots[e.seq]) + off;
    *src = e.pos ? *dst : NULL;
}

#endif  // RASE_MIX_H
