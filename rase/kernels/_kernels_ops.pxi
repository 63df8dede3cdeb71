# rase/kernels/_kernels_ops.pxi: included by _kernels.pyx (one extension module). Single ops exposed for tests: attention, activation quantization, gate, RoPE, f16 rows, expf.

def _pool(const uint16_t[:, ::1] k, const uint16_t[:, ::1] v, blocks):
    """k, v (n, hd) laid into pool blocks: sequence block b in pool block blocks[b] (default: in
    order); returns (table, pool k, pool v)."""
    cdef int n = k.shape[0], nb = (n + RASE_KV_BLOCK - 1) // RASE_KV_BLOCK
    table = _np.arange(nb, dtype=_np.int32) if blocks is None else _np.asarray(blocks, dtype=_np.int32)
    if table.shape != (nb,) or sorted(table.tolist()) != list(range(nb)):
        raise ValueError(f"blocks: a permutation of the {nb} blocks")
    kp = _np.zeros((nb * RASE_KV_BLOCK, k.shape[1]), dtype=_np.uint16)
    vp = _np.zeros_like(kp)
    for b in range(nb):
        rows = slice(b * RASE_KV_BLOCK, min(n, (b + 1) * RASE_KV_BLOCK))
        at = int(table[b]) * RASE_KV_BLOCK
        kp[at:at + rows.stop - rows.start] = _np.asarray(k)[rows]
        vp[at:at + rows.stop - rows.start] = _np.asarray(v)[rows]
    return table, kp, vp


def attention_f32(const float[::1] q, const float[:, ::1] k, const float[:, ::1] v, float scale, isa=None):
    """An encoder's attention (rase_attend_f32): softmax(scale * q . k[j]) . v over every row of
    the f32 k, v (n, hd). isa "scalar" is attend_f32_ref, the operations every path computes."""
    cdef int n = k.shape[0], hd = q.shape[0]
    if n < 1 or k.shape[1] != hd or v.shape[0] != n or v.shape[1] != hd:
        raise ValueError("q (hd,), k and v (n, hd) required")
    cdef int path = rase_isa if isa is None else _isa_id(isa)
    scores = _np.empty(n, dtype=_np.float32)
    out = _np.empty(hd, dtype=_np.float32)
    cdef float[::1] sv = scores, ov = out
    with nogil:
        rase_attend_f32(&q[0], &k[0, 0], &v[0, 0], hd, n, hd, scale, &sv[0], &ov[0], path)
    return out


def attention(const float[:, ::1] q, const uint16_t[:, ::1] k, const uint16_t[:, ::1] v, float scale,
              int j0=0, isa=None, float softcap=0.0, blocks=None, sinks=None):
    """softmax(scale * q[h] . k[j]) . v over rows j0..len(k)-1 for each of 1..ATTN_G query
    heads q (g, hd) sharing one KV head; k, v are f16 bit patterns (n, hd), as in the KV pool
    (in consecutive blocks, or sequence block b in pool block blocks[b]). softcap > 0: scores
    s -> softcap * tanh(s / softcap) before the softmax. sinks (g,): each query's sink logit in
    the softmax denominator (gpt-oss). isa "ggml-ref": attend_ggml_ref, the scalar reference of
    the SIMD paths' numerics, query by query. The kernel the forward uses; returns (g, hd)."""
    cdef int n = k.shape[0], hd = q.shape[1], g = q.shape[0], h
    if n < 1 or k.shape[1] != hd or v.shape[0] != n or v.shape[1] != hd or not 0 <= j0 < n:
        raise ValueError("q (g, hd), k and v (n, hd), 0 <= j0 < n required")
    if not 1 <= g <= RASE_ATTN_G:
        raise ValueError(f"1..{RASE_ATTN_G} query heads per call")
    cdef bint ref = isa == "ggml-ref"
    cdef int path = rase_isa if isa is None or ref else _isa_id(isa)
    cdef int64_t qstride = rase_attend_scratch(n, hd)
    scratch = _np.zeros(g * qstride, dtype=_np.float32)
    out = _np.empty((g, hd), dtype=_np.float32)
    table, kp, vp = _pool(k, v, blocks)
    cdef float[::1] sv = scratch
    cdef float[:, ::1] ov = out
    cdef const int32_t[::1] tv = table
    sink_arr = _np.full(g, -_np.inf, _np.float32) if sinks is None else _np.ascontiguousarray(sinks, _np.float32)
    if sink_arr.shape != (g,):
        raise ValueError(f"sinks: ({g},) expected")
    cdef const float[::1] skv = sink_arr
    cdef const float *sk = NULL if sinks is None else &skv[0]
    cdef const uint16_t[:, ::1] kv_ = kp
    cdef const uint16_t[:, ::1] vv = vp
    cdef rase_kv_view view
    cdef const float *qs[8]
    cdef float *outs[8]
    for h in range(g):
        qs[h] = &q[h, 0]
        outs[h] = &ov[h, 0]
    view.k, view.v, view.table = &kv_[0, 0], &vv[0, 0], &tv[0]
    view.block_stride, view.row_stride, view.type = RASE_KV_BLOCK * hd, hd, 1
    with nogil:
        if ref:
            for h in range(g):
                attend_ggml_ref(qs[h], &view, j0, n, hd, scale, softcap, skv[h], &sv[0], outs[h])
        else:
            rase_attend(g, qs, &view, j0, n, hd, scale, softcap, sk, &sv[0], qstride, outs, path)
    return out


def kv_rows(str kv_type, const float[:, ::1] x, isa=None):
    """Rows x (n, hd) as a pool of kv_type stores them (rase_kv_store_row): (n, row bytes) uint8."""
    cdef int n = x.shape[0], hd = x.shape[1], i
    cdef int row = kv_row_bytes(kv_type, hd) // 2, t = KV_TYPES[kv_type]
    cdef int path = rase_isa if isa is None else _isa_id(isa)
    out = _np.zeros((n, row), dtype=_np.uint16)
    cdef uint16_t[:, ::1] o = out
    with nogil:
        for i in range(n):
            rase_kv_store_row(t, &x[i, 0], &o[i, 0], hd, path)
    return out.view(_np.uint8)


def attention_kv(const float[:, ::1] q, const float[:, ::1] k, const float[:, ::1] v, str kv_type, float scale,
                 int j0=0, isa=None, float softcap=0.0, sinks=None):
    """attention() over a pool of kv_type: k, v (n, hd) f32 stored as the forward stores them
    (kv_rows), then rase_attend for 1..ATTN_G query heads q (g, hd). isa "fa-ref": attend_fa_ref,
    the scalar reference of the quantized paths, query by query. Returns (g, hd)."""
    cdef int n = k.shape[0], hd = q.shape[1], g = q.shape[0], h
    if n < 1 or k.shape[1] != hd or v.shape[0] != n or v.shape[1] != hd or not 0 <= j0 < n:
        raise ValueError("q (g, hd), k and v (n, hd), 0 <= j0 < n required")
    if not 1 <= g <= RASE_ATTN_G:
        raise ValueError(f"1..{RASE_ATTN_G} query heads per call")
    cdef bint ref = isa == "fa-ref"
    cdef int path = rase_isa if isa is None or ref else _isa_id(isa)
    cdef int t = KV_TYPES[kv_type]
    cdef int row = kv_row_bytes(kv_type, hd) // 2, nb = (n + RASE_KV_BLOCK - 1) // RASE_KV_BLOCK
    kp = _np.zeros((nb * RASE_KV_BLOCK, row), dtype=_np.uint16)
    vp = _np.zeros_like(kp)
    kp[:n] = kv_rows(kv_type, k, None if ref else isa).view(_np.uint16)
    vp[:n] = kv_rows(kv_type, v, None if ref else isa).view(_np.uint16)
    table = _np.arange(nb, dtype=_np.int32)
    cdef int64_t qstride = rase_attend_scratch(n, hd)
    scratch = _np.zeros(g * qstride, dtype=_np.float32)
    out = _np.empty((g, hd), dtype=_np.float32)
    sink_arr = _np.full(g, -_np.inf, _np.float32) if sinks is None else _np.ascontiguousarray(sinks, _np.float32)
    if sink_arr.shape != (g,):
        raise ValueError(f"sinks: ({g},) expected")
    cdef float[::1] sv = scratch
    cdef float[:, ::1] ov = out
    cdef const int32_t[::1] tv = table
    cdef const float[::1] skv = sink_arr
    cdef const float *sk = NULL if sinks is None else &skv[0]
    cdef const uint16_t[:, ::1] kv_ = kp
    cdef const uint16_t[:, ::1] vv = vp
    cdef rase_kv_view view
    cdef const float *qs[8]
    cdef float *outs[8]
    for h in range(g):
        qs[h] = &q[h, 0]
        outs[h] = &ov[h, 0]
    view.k, view.v, view.table = &kv_[0, 0], &vv[0, 0], &tv[0]
    view.block_stride, view.row_stride, view.type = RASE_KV_BLOCK * row, row, t
    with nogil:
        if ref:
            for h in range(g):
                attend_fa_ref(qs[h], &view, t, j0, n, hd, scale, softcap, skv[h], <block_q8_0 *>&sv[0], outs[h])
        else:
            rase_attend(g, qs, &view, j0, n, hd, scale, softcap, sk, &sv[0], qstride, outs, path)
    return out


def quantize_activation(int qtype, const float[::1] x, isa=None, bint gemm=False):
    """x quantized to the activation format weights of type qtype pair with (the bytes the
    matmul kernels read): q8_0/q8_1/q8_K blocks, or x itself for float weights. gemm: the
    format of the type's many-token GEMM instead, where it has one (F16: ACT_F32C)."""
    _check_type(qtype)
    cdef int act = rase_traits(qtype).rows_act if gemm and rase_traits(qtype).rows_act else rase_traits(qtype).act
    cdef int64_t n = x.shape[0]
    cdef int kblk = 256 if act == ACT_Q8_K else (32 if act else 1)
    if n == 0 or n % kblk:
        raise ValueError(f"length {n} must be a positive multiple of {kblk}")
    cdef int path = rase_isa if isa is None else _isa_id(isa)
    out = bytearray(rase_act_bytes(act, n))
    cdef unsigned char[::1] o = out
    cdef rase_quant_fn quant = rase_act_quant_for(act, path)
    with nogil:
        quant(&x[0], &o[0], n)
    return bytes(out)


def swiglu_oai(const float[::1] g, const float[::1] u, float alpha, float limit):
    """gpt-oss's clamped SwiGLU of its experts (rase_swiglu_oai), as ggml_swiglu_oai."""
    if g.shape[0] != u.shape[0]:
        raise ValueError("g and u must have the same length")
    out = _np.array(g, dtype=_np.float32)
    cdef float[::1] o = out
    with nogil:
        rase_swiglu_oai(&o[0], &u[0], o.shape[0], alpha, limit)
    return out


def shortconv(const float[:, ::1] bcx, const float[:, ::1] w, state=None, isa=None, int c0=0, c1=None):
    """LFM2's gated short convolution over the rows of bcx (T, 3 E) = (b, c, x), one sequence's
    next T positions in order, channels [c0, c1): taps w (L, E) tap-major; state (L - 1, E)
    float32, the inputs before the first row (None: position 0, zeros). Returns (y (T, E), the
    state after the last row); channels outside [c0, c1) are 0 in both."""
    cdef int T = bcx.shape[0], L = w.shape[0], t
    cdef int64_t E = w.shape[1], lo = c0, hi = E if c1 is None else c1
    cdef int path = rase_isa if isa is None else _isa_id(isa)
    if bcx.shape[1] != 3 * E or not 2 <= L <= RASE_CONV_MAX or not 0 <= lo <= hi <= E:
        raise ValueError(f"bcx must be (T, 3 E) and w (L, E) with 2 <= L <= {RASE_CONV_MAX}; 0 <= c0 <= c1 <= E")
    st = _np.zeros((L - 1, E), _np.float32)
    if state is not None:
        given = _np.ascontiguousarray(state, dtype=_np.float32)
        if given.shape != st.shape:
            raise ValueError(f"state must be ({L - 1}, {E})")
        st[:, lo:hi] = given[:, lo:hi]
    y = _np.zeros((T, E), _np.float32)
    cdef float[:, ::1] sv = st, yv = y
    cdef const float *src = &sv[0, 0] if state is not None else NULL
    with nogil:
        for t in range(T):
            rase_shortconv_row(path, L - 1, &bcx[t, 0], E, &w[0, 0], src, &sv[0, 0], &yv[t, 0], lo, hi)
            src = &sv[0, 0]
    return y, st


def causal_conv(const float[:, ::1] x, const float[:, ::1] w, state=None, isa=None):
    """The recurrent layers' depthwise causal convolution (rase/kernels/_conv.h) over the rows of x
    (T, E), one sequence's next T positions in order: taps w (L, E) tap-major, state (L - 1, E)
    the inputs before the first row (None: zeros). Returns (y (T, E), the state after)."""
    cdef int T = x.shape[0], L = w.shape[0], t
    cdef int64_t E = w.shape[1]
    cdef int path = rase_isa if isa is None else _isa_id(isa)
    if x.shape[1] != E or not 2 <= L <= RASE_CONV_MAX:
        raise ValueError(f"x must be (T, E) and w (L, E) with 2 <= L <= {RASE_CONV_MAX}")
    st = _np.zeros((L - 1, E), _np.float32) if state is None else _np.array(state, dtype=_np.float32, order="C")
    if st.shape != (L - 1, E):
        raise ValueError(f"state must be ({L - 1}, {E})")
    y = _np.zeros((T, E), _np.float32)
    cdef float[:, ::1] sv = st, yv = y
    cdef const float *src = &sv[0, 0] if state is not None else NULL
    with nogil:
        for t in range(T):
            RASE_CONV[path](L - 1, &x[t, 0], E, &w[0, 0], src, &sv[0, 0], &yv[t, 0], 0, E)
            src = &sv[0, 0]
    return y, st


def delta_step(state, const float[::1] q, const float[::1] k, const float[::1] v, float g, float beta, isa=None):
    """One token of Qwen3.5's gated delta rule for one value head (rase/kernels/_deltanet.h): state
    (S, S) float32 as ggml stores it (row j = column j of the rule's matrix), S a multiple of 16.
    Returns (o (S,), the state after)."""
    st = _np.array(state, dtype=_np.float32, order="C")
    cdef int64_t S = q.shape[0]
    cdef int path = rase_isa if isa is None else _isa_id(isa)
    if st.shape != (S, S) or k.shape[0] != S or v.shape[0] != S or S % 16:
        raise ValueError("state must be (S, S) and q, k, v (S,), S a multiple of 16")
    o = _np.zeros(S, _np.float32)
    delta = _np.zeros(S, _np.float32)
    cdef float[:, ::1] sv = st
    cdef float[::1] ov = o, dv = delta
    with nogil:
        RASE_DELTA[path](S, &sv[0, 0], &q[0], &k[0], &v[0], g, beta, &dv[0], &ov[0])
    return o, st


def gate(const float[::1] g, const float[::1] u, bint gelu, isa=None):
    """act(g) * u (SiLU, or GELU through llama.cpp's f16 table), as the FFN computes it."""
    if g.shape[0] != u.shape[0]:
        raise ValueError("g and u must have the same length")
    cdef int path = rase_isa if isa is None else _isa_id(isa)
    out = _np.array(g, dtype=_np.float32)
    cdef float[::1] o = out
    cdef uint16_t *table = rase_gelu_table_new() if gelu else NULL
    if gelu and table == NULL:
        raise MemoryError()
    with nogil:
        rase_gate(&o[0], &u[0], o.shape[0], table, path)
    free(table)
    return out


def rope(const float[::1] x, int pos, float base, int n_rot=0, bint neox=False, isa=None, float freq_scale=1.0,
         factors=None, bint yarn=False, float attn_factor=1.0, int n_ctx_orig=0):
    """x rotated for position pos (theta_i = pos * base^(-2i/n_rot) / factors[i], ggml's f32
    recurrence; freq_scale, YaRN and attn_factor as rase_rope_init sets them up)."""
    cdef int n = x.shape[0]
    if n_rot == 0:
        n_rot = n
    if n_rot < 2 or n_rot % 2 or n_rot > n:
        raise ValueError(f"n_rot={n_rot} invalid for {n} dims")
    cdef int path = rase_isa if isa is None else _isa_id(isa)
    out = _np.array(x, dtype=_np.float32)
    cs = _np.empty(n_rot, dtype=_np.float32)
    cdef float[::1] o = out, c = cs
    cdef const float[::1] fv
    cdef const float *fp = NULL
    if factors is not None:
        fv = _np.ascontiguousarray(factors, dtype=_np.float32)
        if fv.shape[0] != n_rot // 2:
            raise ValueError(f"{fv.shape[0]} factors for {n_rot // 2} frequencies")
        fp = &fv[0]
    cdef rase_rope_params r
    rase_rope_init(&r, n_rot, base, freq_scale, yarn, attn_factor, n_ctx_orig, fp)
    with nogil:
        rase_rope_table(&c[0], pos, n_rot, &r)
        rase_rope(&o[0], &c[0], n_rot, neox, path)
    return out


def fp16_row(const float[::1] x, isa=None):
    """x rounded to f16 bit patterns as K and V rows are stored in the KV pool."""
    cdef int path = rase_isa if isa is None else _isa_id(isa)
    out = _np.empty(x.shape[0], dtype=_np.uint16)
    cdef uint16_t[::1] o = out
    if x.shape[0]:
        with nogil:
            rase_fp32_to_fp16_row(&x[0], &o[0], x.shape[0], path)
    return out


def expf_avx2(const float[::1] x):
    """The AVX2 exp used by softmax and SiLU (aarch64: its NEON translation), over len(x) (a
    multiple of 8) inputs."""
    if x.shape[0] % 8 or isa_names()[RASE_ISA_AVX2] not in isa_supported():
        raise ValueError("length must be a multiple of 8, and AVX2 (aarch64: NEON) available")
    out = _np.empty(x.shape[0], dtype=_np.float32)
    cdef float[::1] o = out
    with nogil:
        rase_expf_avx2_n(&x[0], &o[0], x.shape[0])
    return out
