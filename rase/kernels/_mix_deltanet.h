// rase/kernels/_mix_deltanet.h: Qwen3.5's gated delta net mixer (its delta rule: _deltanet.h).
#ifndef RASE_MIX_DELTANET_H
#define RASE_MIX_DELTANET_H

#include "_mix.h"

// Qwen3.5's gated delta net, h -> o (llama.cpp's build_layer_attn_linear with its fused
// ggml_gated_delta_net). 1. projections: q/k/v channels, z, beta, alpha; 2. the causal conv over
// the channels (rows in (sequence, position) order, threads by channel ranges), then silu; 3. q
// and k L2-normalized per key head; 4. per (sequence, value head), its rows in order: beta =
// sigmoid, g = softplus(alpha + dt) * a, the delta rule (_deltanet.h; value head h reads key head
// h % H_k, as ggml's broadcast); 5. per (row, value head): rmsnorm(o) * w * silu(z); 6. out-proj.
// A layer's state in a slot: the conv's (n_conv - 1, conv_dim), then H_v matrices (S, S).
static void rase_deltanet(rase_model *m, const rase_layer *L, int il, const rase_batch *b, int ith, int nth) {
    (void)il;
    rase_scratch *s = m->s;
    const rase_hparams *hp = &m->w->hp;
    const int T = b->n, Hk = hp->ssm_k_heads, Hv = hp->ssm_v_heads, d = hp->n_conv - 1;
    const int64_t S = hp->ssm_head, key = Hk * S, val = Hv * S, cd = 2 * key + val, ms = s->mix_stride;
    float *beta = s->gates, *alpha = s->gates + (int64_t)s->max_rows * Hv;
    {
        RASE_PROF_START(m, ith);
        const rase_mat *w[4] = {&L->conv_in, &L->ssm_z, &L->ssm_beta, &L->ssm_alpha};
        float *out[4] = {s->g, s->u, beta, alpha};
        rase_matmuls(m, 4, w, s->h, out, T, RASE_EPI_NONE, NULL, ith, nth);
        rase_sync(m, ith);
        RASE_PROF_ADD(m, ith, prof_matmul_ns);
    }
    int64_t c0, c1;
    rase_split(cd / 16, ith, nth, &c0, &c1);  // 16-channel groups: one vector path per element
    for (int i = 0; i < T; ++i) {
        const int t = s->order[i];
        float *src, *dst;
        rase_row_states(m, b, t, L->state_off, &src, &dst);
        RASE_CONV[m->isa](d, s->g + t * cd, cd, L->conv_w, src, dst, s->mix + t * ms, 16 * c0, 16 * c1);
        rase_silu_row(s->mix + t * ms + 16 * c0, 16 * (c1 - c0), m->isa);
    }
    rase_sync(m, ith);
    for (int64_t w = ith; w < (int64_t)T * 2 * Hk; w += nth)  // q heads, then k heads, of each row
        rase_gdn_l2norm(s->mix + w / (2 * Hk) * ms + w % (2 * Hk) * S, S, hp->eps);
    rase_sync(m, ith);
    const int64_t soff = L->state_off + (int64_t)d * cd;  // the layer's matrices in a state slot
    float *delta = rase_work(s, ith);
    for (int64_t w = ith; w < (int64_t)s->n_runs * Hv; w += nth) {
        const int run = (int)(w / Hv), h = (int)(w % Hv);
        for (int i = s->runs[run]; i < s->runs[run + 1]; ++i) {
            const int t = s->order[i];
            float *src, *dst;
            rase_row_states(m, b, t, soff + h * S * S, &src, &dst);
            if (!src) memset(dst, 0, (size_t)(S * S) * sizeof(float));  // position 0: a zero state
            const float *row = s->mix + t * ms;
            const float g = rase_softplus(alpha[t * Hv + h] + L->ssm_dt[h]) * L->ssm_a[h];
            RASE_DELTA[m->isa](S, dst, row + (h % Hk) * S, row + key + (h % Hk) * S, row + 2 * key + h * S, g,
                               rase_sigmoid(beta[t * Hv + h]), delta, s->att + t * val + h * S);
        }
    }
    rase_sync(m, ith);
    for (int64_t w = ith; w < (int64_t)T * Hv; w += nth) {  // rmsnorm(o) * w, times silu(z)
        float *o = s->att + w * S, *z = s->u + w * S;
        rase_rmsnorm(o, L->ssm_norm, o, S, hp->eps);
        rase_silu_row(z, S, m->isa);
        for (int64_t i = 0; i < S; ++i) o[i] *= z[i];
    }
    rase_sync(m, ith);
    RASE_PROF_START(m, ith);
    rase_matmul(m, &L->conv_out, s->att, T, s->o, NULL, ith, nth);
    rase_sync(m, ith);
    RASE_PROF_ADD(m, ith, prof_matmul_ns);
}

// per row: g the q, k, v channels (conv_dim) and mix the same convolved; u the output gate z and
// att the heads' outputs (d_inner), which the out-projection reads; gates beta and alpha per value head
static void rase_deltanet_needs(const rase_hparams *hp, rase_scratch_need *need) {
    const int64_t d_inner = (int64_t)hp->ssm_v_heads * hp->ssm_head;
    const int64_t conv_dim = 2 * (int64_t)hp->ssm_k_heads * hp->ssm_head + d_inner;
    rase_need(&need->g, conv_dim);
    rase_need(&need->mix, conv_dim);
    rase_need(&need->u, d_inner);
    rase_need(&need->att, d_inner);
    rase_need(&need->cols, d_inner);
    rase_need(&need->gates, hp->ssm_v_heads);
}

#endif  // RASE_MIX_DELTANET_H
