# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Kernels over rase/_simd.h and rase/_quants.h.

Every public function is a `def` shim: it checks types and shapes with the GIL held, then enters
a `noexcept nogil` C core that never touches Python objects.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc


# ---------------------------------------------------------------- ISA selection and build facts

def isa_names():
    """Names of every ISA path this build knows, index = ISA id."""
    return [RASE_ISA_NAMES[i].decode() for i in range(RASE_ISA_COUNT)]


def isa_compiled():
    return [RASE_ISA_NAMES[i].decode() for i in range(RASE_ISA_COUNT) if rase_isa_compiled(i)]


def isa_supported():
    return [RASE_ISA_NAMES[i].decode() for i in range(RASE_ISA_COUNT)
            if rase_isa_compiled(i) and rase_isa_supported(i)]


def isa_best():
    return RASE_ISA_NAMES[rase_isa_best()].decode()


def set_isa(str name):
    """Select the ISA path for every kernel; raises ValueError if it cannot run here."""
    global rase_isa
    rase_isa = _isa_id(name)


cdef int _isa_id(str name) except -1:
    names = isa_names()
    if name not in names:
        raise ValueError(f"unknown ISA {name!r}; known: {', '.join(names)}")
    cdef int isa = names.index(name)
    if not (rase_isa_compiled(isa) and rase_isa_supported(isa)):
        raise ValueError(f"ISA {name!r} is not supported by this CPU or build")
    return isa


def get_isa():
    return RASE_ISA_NAMES[rase_isa].decode()


def compiler_info():
    return {"compiler": RASE_COMPILER.decode(), "openmp": int(RASE_OPENMP),
            "omp_max_threads": rase_omp_max_threads()}


def quant_traits():
    """The C QUANT_TRAITS table: {ggml type id: (name, block size, bytes per block, has_avx2)}."""
    out = {}
    for t in range(RASE_GGML_TYPE_COUNT):
        if QUANT_TRAITS[t].name != NULL:
            out[t] = (QUANT_TRAITS[t].name.decode(), QUANT_TRAITS[t].blck, QUANT_TRAITS[t].size,
                      QUANT_TRAITS[t].dequant[RASE_ISA_AVX2] != NULL)
    return out


# ---------------------------------------------------------------- dequantization

cdef int _check_type(int qtype) except -1:
    if qtype < 0 or qtype >= RASE_GGML_TYPE_COUNT or QUANT_TRAITS[qtype].name == NULL:
        raise ValueError(f"ggml type {qtype} has no kernels in rase")
    return 0


def dequantize_into(int qtype, const uint8_t[::1] src, float[::1] dst, isa=None):
    """dst[0..n) = the n = len(dst) values stored in src; n a multiple of the type's block size.

    src: (n / blck * size,) bytes of consecutive blocks. isa: name of the path (default: current).
    """
    _check_type(qtype)
    cdef int64_t n = dst.shape[0]
    cdef int blck = QUANT_TRAITS[qtype].blck, size = QUANT_TRAITS[qtype].size
    if n % blck:
        raise ValueError(f"{n} elements is not a multiple of the block size {blck}")
    if src.shape[0] != (n // blck) * size:
        raise ValueError(f"{n} elements need {(n // blck) * size} bytes, got {src.shape[0]}")
    cdef int path = rase_isa if isa is None else _isa_id(isa)
    cdef rase_dequant_fn fn = rase_dequant_for(qtype, path)
    if n == 0:
        return
    with nogil:
        fn(&src[0], &dst[0], n)


# ---------------------------------------------------------------- dots (exposed for tests)


def repacked_types():
    """ggml type ids whose weights run repacked, 16 rows interleaved (_repack.h)."""
    return [t for t in range(RASE_GGML_TYPE_COUNT) if R16_TRAITS[t].blk_bytes]


def block_sum_types():
    """ggml type ids whose kernels have block-sum numerics (_repack_bs.h) instead of llama.cpp's
    one-token order: a model with any of them matches llama.cpp within tolerance, not bit for bit."""
    return [t for t in range(RASE_GGML_TYPE_COUNT) if R16_TRAITS[t].block_sum]


cdef object _aligned(size_t nbytes):
    """A uint8 array of nbytes whose data starts on a 64-byte boundary."""
    raw = _np.empty(nbytes + 64, dtype=_np.uint8)
    cdef size_t off = (64 - (<size_t>raw.ctypes.data) % 64) % 64
    return raw[off:off + nbytes]


REPACK_CHUNK_ROWS = 8192  # rows repacked between two calls of on_chunk


def repack(int qtype, const uint8_t[:, ::1] w, int64_t cols, int n_threads=1, on_chunk=None):
    """The (rows x cols) matrix w (rows of ggml blocks) in the 16-row layout (uint8 array).
    on_chunk(first_row, end_row, copied): called before (copied=False) and after (True) each
    chunk of rows is copied."""
    _check_type(qtype)
    if not R16_TRAITS[qtype].blk_bytes:
        raise ValueError(f"ggml type {qtype} is not repacked")
    cdef int64_t rows = w.shape[0], g0, g1, groups
    if rows < 1 or cols % 32 or w.shape[1] != (cols // QUANT_TRAITS[qtype].blck) * QUANT_TRAITS[qtype].size:
        raise ValueError("w must be (rows, row_bytes) of blocks for cols columns")
    out = _aligned(rase_r16_bytes(qtype, rows, cols))
    cdef uint8_t[::1] o = out
    groups = (rows + RASE_R16 - 1) // RASE_R16
    for g0 in range(0, groups, REPACK_CHUNK_ROWS // RASE_R16):
        g1 = min(groups, g0 + REPACK_CHUNK_ROWS // RASE_R16)
        if on_chunk is not None:
            on_chunk(g0 * RASE_R16, min(rows, g1 * RASE_R16), False)
        with nogil:
            rase_r16_repack(qtype, &w[0, 0], w.shape[1], rows, cols, &o[0], g0, g1, n_threads)
        if on_chunk is not None:
            on_chunk(g0 * RASE_R16, min(rows, g1 * RASE_R16), True)
    return out


def matmul(int qtype, const uint8_t[:, ::1] w, const float[:, ::1] x, isa=None):
    """x (T, cols) times the (rows x cols) matrix w of type qtype (rows of ggml blocks) as the
    forward computes it: activations quantized per row, then the type's kernel (repacked 16-row
    groups, or row by row), tiles of up to RASE_NT tokens. Returns (T, rows) float32."""
    _check_type(qtype)
    cdef int64_t rows = w.shape[0], n = x.shape[1], t0, g
    cdef int T = x.shape[0], nt, act = DOT_TRAITS[qtype].act, nr
    cdef int blck = QUANT_TRAITS[qtype].blck, size = QUANT_TRAITS[qtype].size
    cdef int kblk = 256 if act == ACT_Q8_K else blck
    if n == 0 or n % kblk or T < 1 or rows < 1 or w.shape[1] != (n // blck) * size:
        raise ValueError(f"w (rows, {(n // blck) * size}) and x (T, n) with n a multiple of {kblk} required")
    cdef int path = rase_isa if isa is None else _isa_id(isa)
    cdef size_t row = rase_act_bytes(act, n)
    abuf = bytearray(row * T + 64)
    cdef unsigned char[::1] a = abuf
    out = _np.zeros((T, rows), dtype=_np.float32)
    cdef float[:, ::1] ov = out
    cdef rase_quant_fn quant = rase_act_quant_for(act, path)
    cdef rase_dotn_fn dotn
    cdef const uint8_t[::1] pv
    cdef unsigned char[::1] wv
    cdef int64_t group
    cdef float tmp[8]
    cdef int j
    for t0 in range(T):
        quant(&x[t0, 0], &a[t0 * row], n)
    if R16_TRAITS[qtype].blk_bytes:
        packed = repack(qtype, w, n)
        pv = packed
        group = (n // 32) * R16_TRAITS[qtype].blk_bytes
        work = bytearray(n * RASE_CHUNK_ROWS * sizeof(float))  # the forward's per-thread work buffer
        wv = work
        with nogil:  # the forward's path: rows in chunks of 32, each chunk's groups over tiles of tokens
            for g in range(0, rows, 32):
                rase_r16_rows(path, qtype, &pv[0], group, n, &a[0], row, T, &ov[0, 0], rows, g, min(rows, g + 32),
                              &wv[0])
        return out
    dotn = rase_dotn_for(qtype, path)
    with nogil:
        for g in range(rows):
            for t0 in range(0, T, 4):
                nt = 4 if T - t0 >= 4 else T - t0
                dotn(n, &w[g, 0], &a[t0 * row], row, nt, tmp)
                for j in range(nt):
                    ov[t0 + j, g] = tmp[j]
    return out


def vec_dot(int qtype, const uint8_t[::1] w, const float[:, ::1] x, isa=None):
    """w (one row of x.shape[1] elements of type qtype) . x[t] for each of up to RASE_NT rows of
    x, each quantized to the activation format the type pairs with (exactly as the forward)."""
    _check_type(qtype)
    cdef int64_t n = x.shape[1]
    cdef int nt = x.shape[0], t
    cdef int blck = QUANT_TRAITS[qtype].blck, size = QUANT_TRAITS[qtype].size
    cdef int act = DOT_TRAITS[qtype].act
    cdef int kblk = 256 if act == ACT_Q8_K else blck
    if n == 0 or n % kblk:
        raise ValueError(f"row length {n} must be a positive multiple of {kblk}")
    if not 1 <= nt <= RASE_NT:
        raise ValueError(f"1..{RASE_NT} activation rows, got {nt}")
    if w.shape[0] != (n // blck) * size:
        raise ValueError(f"{n} elements need {(n // blck) * size} bytes, got {w.shape[0]}")
    if R16_TRAITS[qtype].blk_bytes:  # one row of a repacked type: a group of 1
        return [float(v) for v in matmul(qtype, _np.asarray(w).reshape(1, -1), x, isa)[:, 0]]
    cdef int path = rase_isa if isa is None else _isa_id(isa)
    cdef size_t row = rase_act_bytes(act, n)
    buf = bytearray(row * nt + 64)
    cdef unsigned char[::1] a = buf
    cdef float out[8]
    cdef rase_quant_fn quant = rase_act_quant_for(act, path)
    cdef rase_dotn_fn dotn = rase_dotn_for(qtype, path)
    with nogil:
        for t in range(nt):
            quant(&x[t, 0], &a[t * row], n)
        dotn(n, &w[0], &a[0], row, nt, out)
    return [out[t] for t in range(nt)]


# ---------------------------------------------------------------- the forward



import numpy as _np

KV_BLOCK = RASE_KV_BLOCK  # positions per KV block

_MATS = ("wq", "wk", "wv", "wo", "wgate", "wup", "wdown")
_FFN_MATS = ("wgate", "wup", "wdown")
_VECS = ("attn_norm", "ffn_norm", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm", "bq", "bk", "bv", "bo")


cdef class Weights:
    """The read-only plan of one model: hyper-parameters and weight pointers into the caller's
    buffers (the GGUF mmap), shared by every Forward over it."""
    cdef rase_weights w
    cdef rase_layer *layers
    cdef rase_mat *experts  # (n_layer, 3, n_expert): the MoE layers' expert matrices
    cdef list _keep  # owners of every buffer the plan points into
    cdef readonly int64_t packed_bytes  # private copies made at load (repacked weights)
    cdef int _threads
    cdef int _isa    # the kernel path every Forward over this plan runs, fixed here at load
    cdef object _on_packed
    cdef dict _cached     # name -> packed bytes given at load (a cache), or None
    cdef readonly dict repacked  # name -> packed bytes this load made (for the cache)
    cdef readonly list streamed  # data of the matrices read in place, whole, every forward

    def __cinit__(self):
        self.layers = NULL
        self.experts = NULL

    def __init__(self, plan, int n_threads=1, on_packed=None, isa=None, packed=None):
        """plan: a rase.models.base.ForwardPlan (hyper-parameters, n_ctx = positions one
        sequence may reach, tok_embd/output Matrix, output_norm, one LayerPlan per layer).
        isa: the kernel path (an isa_names() entry; default: the one selected now), fixed for
        the plan's life: set_isa later changes new plans only.
        Matrices of the repacked types are copied into the 16-row layout (n_threads at a time);
        on_packed(data, start, end, copied) is called before (copied=False) and after bytes
        [start, end) of a matrix's data are copied (after that they are not read again)."""
        self._keep = []
        self._threads, self._on_packed = n_threads, on_packed
        self._isa = rase_isa if isa is None else _isa_id(isa)
        self._cached, self.repacked, self.streamed = packed, {}, []
        cdef rase_hparams *h = &self.w.hp
        h.n_layer, h.n_embd, h.n_head = plan.n_layer, plan.n_embd, plan.n_head
        h.n_head_kv, h.head_dim, h.n_ff = plan.n_head_kv, plan.head_dim, plan.n_ff
        h.n_vocab, h.n_ctx, h.n_rot = plan.n_vocab, plan.n_ctx, plan.n_rot
        h.rope_neox, h.gelu, h.attn_prescale = bool(plan.rope_neox), bool(plan.gelu), bool(plan.attn_prescale)
        h.eps, h.embd_scale, h.attn_scale = plan.eps, plan.embd_scale, plan.attn_scale
        h.attn_softcap, h.final_softcap = plan.attn_softcap, plan.final_softcap
        h.n_expert, h.n_expert_used, h.n_ff_exp = plan.n_expert, plan.n_expert_used, plan.n_ff_exp
        h.expert_norm = bool(plan.expert_norm)
        if h.n_expert and not 0 < h.n_expert_used <= h.n_expert <= 256 or h.n_expert < 0 or \
                (h.n_expert and h.n_ff_exp <= 0) or h.attn_softcap < 0 or h.final_softcap < 0:
            raise ValueError("invalid expert or soft-capping hyper-parameters")
        for s in range(2):
            h.rope_base[s] = plan.rope_base[s]
            h.rope_freq_scale[s] = plan.rope_freq_scale[s]
        if min(h.n_layer, h.n_embd, h.n_head, h.n_head_kv, h.head_dim, h.n_ff, h.n_vocab,
               h.n_ctx) <= 0 or h.n_head % h.n_head_kv:
            raise ValueError("invalid hyper-parameters")
        if h.n_rot <= 0 or h.n_rot > h.head_dim or h.n_rot % 2:
            raise ValueError(f"rope dimension {h.n_rot} invalid for head_dim {h.head_dim}")
        self._mat(&self.w.tok_embd, plan.tok_embd, h.n_vocab, h.n_embd, "token_embd")
        self._mat(&self.w.output, plan.output, h.n_vocab, h.n_embd, "output")
        self.w.output_norm = self._vec(plan.output_norm, h.n_embd, "output_norm")
        layers = plan.layers
        if len(layers) != h.n_layer:
            raise ValueError(f"{len(layers)} layer plans for {h.n_layer} layers")
        self.layers = <rase_layer *>calloc(h.n_layer, sizeof(rase_layer))
        if self.layers == NULL:
            raise MemoryError()
        self.w.layers = self.layers
        if h.n_expert:
            self.experts = <rase_mat *>calloc(h.n_layer * 3 * h.n_expert, sizeof(rase_mat))
            if self.experts == NULL:
                raise MemoryError()
        for il, spec in enumerate(layers):
            self._layer(&self.layers[il], il, spec)
        if rase_weights_init(&self.w) != 0:
            raise MemoryError()

    cdef int _layer(self, rase_layer *L, int il, object spec) except -1:
        cdef rase_hparams *h = &self.w.hp
        nq, nkv = h.n_head * h.head_dim, h.n_head_kv * h.head_dim
        shapes = {"wq": (nq, h.n_embd), "wk": (nkv, h.n_embd), "wv": (nkv, h.n_embd),
                  "wo": (h.n_embd, nq), "wgate": (h.n_ff, h.n_embd), "wup": (h.n_ff, h.n_embd),
                  "wdown": (h.n_embd, h.n_ff)}
        L.qk_norm_full = bool(spec.qk_norm_full)
        lens = {"attn_norm": h.n_embd, "ffn_norm": h.n_embd, "q_norm": nq if L.qk_norm_full else h.head_dim,
                "k_norm": nkv if L.qk_norm_full else h.head_dim, "post_attn_norm": h.n_embd,
                "post_ffn_norm": h.n_embd, "bq": nq, "bk": nkv, "bv": nkv, "bo": h.n_embd}
        cdef rase_mat *mats[7]
        cdef const float **vecs[10]
        mats[:] = [&L.wq, &L.wk, &L.wv, &L.wo, &L.wgate, &L.wup, &L.wdown]
        vecs[:] = [&L.attn_norm, &L.ffn_norm, &L.q_norm, &L.k_norm, &L.post_attn_norm, &L.post_ffn_norm,
                   &L.bq, &L.bk, &L.bv, &L.bo]
        experts = spec.experts
        for j, name in enumerate(_MATS):
            if experts is None or name not in _FFN_MATS:  # a MoE layer's FFN is its experts
                self._mat(mats[j], getattr(spec, name), shapes[name][0], shapes[name][1], f"blk.{il}.{name}")
        if experts is not None:
            self._experts(L, il, experts)
        for j, name in enumerate(_VECS):
            vec = getattr(spec, name)
            if vec is None:  # not a conditional expression: Cython typed its temporary non-const
                vecs[j][0] = NULL
            else:
                vecs[j][0] = self._vec(vec, lens[name], f"blk.{il}.{name}")
        if L.qk_norm_full and (L.q_norm == NULL or L.k_norm == NULL):
            raise ValueError(f"layer {il}: full-width QK norms need q_norm and k_norm")
        L.window, L.rope_slot = spec.window, spec.rope_slot
        if L.rope_slot not in (0, 1) or (L.rope_slot == 1 and h.rope_base[1] <= 0) or L.window < 0:
            raise ValueError(f"layer {il}: bad window/rope slot")
        return 0

    cdef int _experts(self, rase_layer *L, int il, object ex) except -1:
        cdef rase_hparams *h = &self.w.hp
        if h.n_expert == 0:
            raise ValueError(f"layer {il} has experts but n_expert is 0")
        self._mat(&L.gate_inp, ex.gate_inp, h.n_expert, h.n_embd, f"blk.{il}.gate_inp")
        cdef rase_mat *base = self.experts + il * 3 * h.n_expert
        cdef int j, e
        shapes = ((h.n_ff_exp, h.n_embd), (h.n_ff_exp, h.n_embd), (h.n_embd, h.n_ff_exp))
        for j, (name, mats) in enumerate((("gate", ex.gate), ("up", ex.up), ("down", ex.down))):
            if len(mats) != h.n_expert:
                raise ValueError(f"layer {il}: {len(mats)} {name} experts, expected {h.n_expert}")
            for e, mat in enumerate(mats):
                self._mat(base + j * h.n_expert + e, mat, shapes[j][0], shapes[j][1], f"blk.{il}.exp{e}.{name}")
        L.moe = 1
        L.exp_gate = base
        L.exp_up = base + h.n_expert
        L.exp_down = base + 2 * h.n_expert
        return 0

    cdef int _mat(self, rase_mat *out, object m, int64_t rows, int64_t cols, str name) except -1:
        data, qtype, r, c = m.data, m.ggml_type, m.rows, m.cols
        if (r, c) != (rows, cols):
            raise ValueError(f"{name}: shape ({r}, {c}), expected ({rows}, {cols})")
        _check_type(qtype)
        if DOT_TRAITS[qtype].dotn[0] == NULL and not R16_TRAITS[qtype].blk_bytes:
            raise ValueError(f"{name}: no dot kernel for type {qtype}")
        cdef int blck = QUANT_TRAITS[qtype].blck
        cdef int kblk = 256 if DOT_TRAITS[qtype].act == ACT_Q8_K else blck
        if cols % kblk:
            raise ValueError(f"{name}: row length {cols} is not a multiple of {kblk}")
        cdef const uint8_t[::1] view = data
        cdef int64_t row_bytes = (cols // blck) * QUANT_TRAITS[qtype].size
        if view.shape[0] != rows * row_bytes:
            raise ValueError(f"{name}: {view.shape[0]} bytes, expected {rows * row_bytes}")
        out.data = &view[0]
        out.type, out.rows, out.cols, out.row_bytes = qtype, rows, cols, row_bytes
        out.layout, out.packed, out.group_bytes = 0, NULL, 0
        self._keep.append(data)
        cdef const uint8_t[::1] pv
        if R16_TRAITS[qtype].blk_bytes and name != "token_embd":  # the embedding is read row by row
            packed = None if self._cached is None else self._cached.get(name)
            if packed is None or packed.nbytes != rase_r16_bytes(qtype, rows, cols) or packed.ctypes.data % 64:
                chunk = None if self._on_packed is None else (
                    lambda r0, r1, copied: self._on_packed(data, r0 * row_bytes, r1 * row_bytes, copied))
                packed = repack(qtype, _np.asarray(view).reshape(rows, row_bytes), cols, self._threads, chunk)
                self.repacked[name] = packed
            pv = packed
            out.layout, out.packed = RASE_LAYOUT_R16, &pv[0]
            out.group_bytes = (cols // 32) * R16_TRAITS[qtype].blk_bytes
            self._keep.append(packed)
            self.packed_bytes += packed.shape[0]
        elif name != "token_embd":
            self.streamed.append(data)
        return 0

    cdef const float *_vec(self, object arr, int64_t n, str name) except NULL:
        a = _np.ascontiguousarray(arr, dtype=_np.float32)
        if a.ndim != 1 or a.shape[0] != n:
            raise ValueError(f"{name}: expected ({n},) float32, got {a.shape}")
        cdef const float[::1] view = a
        self._keep.append(a)
        return &view[0]

    def __dealloc__(self):
        rase_weights_free(&self.w)
        free(self.layers)
        free(self.experts)

    @property
    def n_ctx(self):
        return self.w.hp.n_ctx

    @property
    def n_vocab(self):
        return self.w.hp.n_vocab

    @property
    def isa(self):
        return RASE_ISA_NAMES[self._isa].decode()

    @property
    def kv_bytes_per_token(self):
        """f16 K and V of one position, all layers."""
        return 2 * 2 * self.w.hp.n_layer * self.w.hp.n_head_kv * self.w.hp.head_dim


SAMPLE_INVALID = RASE_SAMPLE_INVALID  # sample()/step() token: the logits are not finite
SAMPLE_NONE = RASE_SAMPLE_NONE        # the mask allowed no token


cdef class Sampler:
    """Samples token ids from logits rows with an explicit seeded RNG; counts of the tokens
    accepted so far feed the repeat/presence/frequency penalties; an optional bitmask (a
    grammar's allowed tokens) restricts the candidates. The GIL is released while it runs
    (alone, or inside Forward.step)."""
    cdef rase_sampling p
    cdef rase_rng rng
    cdef rase_cand *work
    cdef int32_t n
    cdef object counts  # int32 (n,)
    cdef object _mask   # int32 (ceil(n / 32),) or None: the allowed tokens of the next draw
    cdef object _bias   # float32 (n,) or None: added to every row's logits

    def __cinit__(self):
        self.work = NULL

    def __init__(self, int n_vocab, float temperature, int top_k, float top_p, float min_p,
                 float repeat_penalty, float presence_penalty, float frequency_penalty,
                 unsigned long long seed, bias=None):
        """bias: {token id: value added to its logit} (OpenAI's logit_bias), or None."""
        if n_vocab < 1:
            raise ValueError("vocabulary must not be empty")
        cdef float[::1] bv
        self._bias = None
        self.p.bias = NULL
        if bias:
            self._bias = _np.zeros(n_vocab, dtype=_np.float32)
            for tid, value in bias.items():
                if not 0 <= tid < n_vocab:
                    raise ValueError(f"logit_bias token {tid} is outside the vocabulary of {n_vocab}")
                self._bias[tid] = value
            bv = self._bias
            self.p.bias = &bv[0]
        self.n = n_vocab
        self.p.temperature, self.p.top_k, self.p.top_p, self.p.min_p = temperature, top_k, top_p, min_p
        self.p.repeat_penalty = repeat_penalty
        self.p.presence_penalty, self.p.frequency_penalty = presence_penalty, frequency_penalty
        rase_rng_seed(&self.rng, seed)
        self.work = <rase_cand *>malloc(RASE_SAMPLE_WORK(n_vocab) * sizeof(rase_cand))
        if self.work == NULL:
            raise MemoryError()
        self.counts = _np.zeros(n_vocab, dtype=_np.int32)
        self._mask = None

    def __dealloc__(self):
        free(self.work)

    cdef const int32_t *counts_ptr(self):
        cdef int32_t[::1] cv = self.counts
        return &cv[0]

    cdef const uint32_t *allow_ptr(self):
        cdef int32_t[::1] mv
        if self._mask is None:
            return NULL
        mv = self._mask
        return <const uint32_t *>&mv[0]

    @property
    def mask_words(self):
        return (self.n + 31) // 32

    @property
    def mask(self):
        """The bitmask the next draws use (bit i of word i // 32: token i allowed), or None."""
        return self._mask

    @mask.setter
    def mask(self, value):
        if value is not None and not (isinstance(value, _np.ndarray) and value.dtype == _np.int32
                                      and value.shape == (self.mask_words,) and value.flags.c_contiguous):
            raise ValueError(f"mask must be a C-contiguous int32 array of {self.mask_words} words, or None")
        self._mask = value

    def accept(self, int token):
        """Record a token as part of the history the penalties see (prompt or generated)."""
        if 0 <= token < self.n:
            self.counts[token] += 1

    def sample(self, logits, allow=None):
        """One token id from a (n_vocab,) float32 row: SAMPLE_INVALID if the logits are not
        finite, SAMPLE_NONE if nothing is allowed. allow: a bitmask for this draw (default:
        the sampler's mask)."""
        row = _np.ascontiguousarray(logits, dtype=_np.float32)
        if row.ndim != 1 or row.shape[0] != self.n:
            raise ValueError(f"logits must be ({self.n},) float32")
        saved = self._mask
        if allow is not None:
            self.mask = allow
        cdef const float[::1] lv = row
        cdef const int32_t *cp = self.counts_ptr()
        cdef const uint32_t *ap = self.allow_ptr()
        cdef int32_t out
        try:
            with nogil:
                out = rase_sample(&lv[0], self.n, cp, &self.p, &self.rng, self.work, ap)
        finally:
            self._mask = saved
        return out


cdef class Forward:
    """Runs steps over a Weights plan: owns a KV pool of n_blocks blocks (RASE_KV_BLOCK
    positions each, every layer) and scratch for steps of up to max_rows rows. One caller at a
    time (a session's decoder, or a model's worker thread)."""
    cdef rase_model m
    cdef rase_kv_pool kv
    cdef rase_scratch s
    cdef readonly Weights weights
    cdef object _identity  # int32 (1, n_blocks): the single-sequence block table
    cdef object _logits    # float32 (rows, n_vocab): step() output, grown on demand
    cdef rase_sampler_ref *_refs
    cdef int _n_refs

    def __cinit__(self):
        self._refs = NULL
        self._n_refs = 0

    def __init__(self, Weights weights, int n_blocks, int max_rows, int n_threads):
        if n_blocks < 1 or max_rows < 1 or n_threads < 1:
            raise ValueError("n_blocks, max_rows and n_threads must be positive")
        self.weights = weights
        self.m.w = &weights.w
        self.m.kv = &self.kv
        self.m.s = &self.s
        self.m.isa = weights._isa
        if rase_kv_pool_alloc(&self.kv, &weights.w.hp, n_blocks) != 0:
            raise MemoryError(f"cannot allocate a KV pool of {n_blocks} blocks")
        if rase_scratch_alloc(&self.s, &weights.w.hp, max_rows, n_threads) != 0:
            raise MemoryError(f"cannot allocate scratch for {max_rows} rows")
        self._identity = _np.arange(n_blocks, dtype=_np.int32).reshape(1, -1)
        self._logits = _np.empty((0, weights.w.hp.n_vocab), dtype=_np.float32)

    def __dealloc__(self):
        rase_kv_pool_free(&self.kv)
        rase_scratch_free(&self.s)
        free(self._refs)

    @property
    def n_ctx(self):
        return self.weights.w.hp.n_ctx

    @property
    def n_vocab(self):
        return self.weights.w.hp.n_vocab

    @property
    def max_rows(self):
        return self.s.max_rows

    @property
    def n_threads(self):
        return self.s.n_threads

    @property
    def n_blocks(self):
        return self.kv.n_blocks

    @property
    def logits_finite(self):
        """Whether every logit of the last run or step was finite (checked in the step, by the
        thread that computed it, while in its cache)."""
        return self.s.nonfinite == 0

    def copy_rows(self, int src, int dst, int n):
        """Positions [0, n) of pool block src copied to block dst (every layer, K and V)."""
        if not (0 <= src < self.kv.n_blocks and 0 <= dst < self.kv.n_blocks and src != dst):
            raise ValueError(f"blocks {src} -> {dst} outside the pool of {self.kv.n_blocks} or equal")
        if not 0 < n <= RASE_KV_BLOCK:
            raise ValueError(f"1..{RASE_KV_BLOCK} rows, got {n}")
        with nogil:
            rase_kv_copy_rows(&self.kv, src, dst, n)

    @property
    def step_ns(self):
        """Wall ns spent inside the forward steps (the nogil C core) since this Forward was
        made: a caller's time minus this is its Python path."""
        return self.m.step_ns

    def take_profile(self):
        """(matmul ns, attention ns) accumulated since the last call; profiling on from now."""
        out = (self.m.prof_matmul_ns, self.m.prof_attn_ns)
        self.m.profile = 1
        self.m.prof_matmul_ns = self.m.prof_attn_ns = 0
        return out

    def run(self, const int32_t[::1] tokens, int pos0, int n_out=1, trace=None):
        """One sequence whose position p lives in block p // KV_BLOCK (the identity table):
        evaluate tokens at positions pos0.. (writing its KV); returns float32 logits
        (n_out, n_vocab) for the last n_out tokens. trace: optional float32 (n_layer, T,
        n_embd) array receiving each layer's output. Checked here without numpy: this is the
        per-token path of single-stream decoding."""
        cdef int T = tokens.shape[0], i
        cdef int V = self.weights.w.hp.n_vocab
        if T < 1 or T > self.s.max_rows:
            raise ValueError(f"batch of {T} tokens; 1..{self.s.max_rows} allowed")
        if n_out < 1 or n_out > T:
            raise ValueError(f"n_out={n_out} must be in 1..{T}")
        if pos0 < 0 or pos0 + T > min(self.weights.w.hp.n_ctx, self.kv.n_blocks * RASE_KV_BLOCK):
            raise ValueError(f"positions {pos0}..{pos0 + T - 1} outside the context")
        for i in range(T):
            if tokens[i] < 0 or tokens[i] >= V:
                raise ValueError(f"token id {tokens[i]} outside the vocabulary of {V}")
        cdef rase_entry *rows = <rase_entry *>malloc(T * sizeof(rase_entry))
        cdef int32_t *out_rows = <int32_t *>malloc(n_out * sizeof(int32_t))
        if rows == NULL or out_rows == NULL:
            free(rows)
            free(out_rows)
            raise MemoryError()
        for i in range(T):
            rows[i].token, rows[i].seq, rows[i].pos = tokens[i], 0, pos0 + i
        for i in range(n_out):
            out_rows[i] = T - n_out + i
        out = _np.empty((n_out, V), dtype=_np.float32)
        cdef float[:, ::1] lv = out
        cdef const int32_t[:, ::1] table = self._identity
        cdef rase_batch b
        b.rows, b.n, b.tables, b.table_stride = rows, T, &table[0, 0], table.shape[1]
        b.out_rows, b.n_out, b.logits = out_rows, n_out, &lv[0, 0]
        try:
            self._set_trace(trace, T)
            with nogil:
                rase_step(&self.m, &b, NULL, NULL)
        finally:
            self.m.trace = NULL
            free(rows)
            free(out_rows)
        return out

    def step(self, const int32_t[:, ::1] rows, const int32_t[:, ::1] tables, const int32_t[::1] out_rows,
             list samplers=None, trace=None):
        """Evaluate rows (n, 3) of (token, seq, pos): row i's K/V go to position pos of
        sequence seq, whose block table is tables[seq]; it attends to that sequence's
        positions up to pos (the rows of one step may extend a sequence by several positions).
        Returns (tokens, logits): logits (n_out, n_vocab) of the out_rows, a view valid until
        the next step; tokens (n_out,) int32 sampled by samplers[j] from row j (-1: logits not
        finite), or None without samplers. Forward and sampling run with the GIL released."""
        self._check_step(rows, tables, out_rows)
        cdef int n = rows.shape[0], n_out = out_rows.shape[0], j
        cdef int V = self.weights.w.hp.n_vocab
        if self._logits.shape[0] < n_out:
            self._logits = _np.empty((max(n_out, 2 * self._logits.shape[0]), V), dtype=_np.float32)
        cdef float[:, ::1] lv = self._logits
        tokens = None
        cdef int32_t[::1] tv
        cdef int32_t *tp = NULL
        cdef rase_sampler_ref *refs = NULL
        if samplers is not None:
            refs = self._sampler_refs(samplers, n_out)
            tokens = _np.empty(n_out, dtype=_np.int32)
            tv = tokens
            tp = &tv[0] if n_out else NULL
        cdef rase_batch b
        b.rows = <const rase_entry *>&rows[0, 0]
        b.n = n
        b.tables = &tables[0, 0]
        b.table_stride = tables.shape[1]
        b.out_rows = &out_rows[0] if n_out else NULL
        b.n_out = n_out
        b.logits = &lv[0, 0]
        self._set_trace(trace, n)
        with nogil:
            rase_step(&self.m, &b, refs, tp)
        self.m.trace = NULL
        return tokens, self._logits[:n_out]

    cdef int _check_step(self, const int32_t[:, ::1] rows, const int32_t[:, ::1] tables,
                         const int32_t[::1] out_rows) except -1:
        cdef int n = rows.shape[0]
        if rows.shape[1] != 3 or not 1 <= n <= self.s.max_rows:
            raise ValueError(f"rows must be (n, 3) with 1 <= n <= {self.s.max_rows}")
        r = _np.asarray(rows)
        t = _np.asarray(tables)
        if t.shape[0] < 1 or t.shape[1] < 1:
            raise ValueError("tables must be (n_seq, max_blocks) with at least one block each")
        tok, seq, pos = r[:, 0], r[:, 1], r[:, 2]
        if tok.min() < 0 or tok.max() >= self.weights.w.hp.n_vocab:
            raise ValueError(f"token id outside the vocabulary of {self.weights.w.hp.n_vocab}")
        if seq.min() < 0 or seq.max() >= t.shape[0]:
            raise ValueError(f"sequence index outside the {t.shape[0]} block tables")
        limit = min(self.weights.w.hp.n_ctx, t.shape[1] * RASE_KV_BLOCK)
        if pos.min() < 0 or pos.max() >= limit:
            raise ValueError(f"position outside 0..{limit - 1}")
        used = _np.zeros(t.shape, dtype=bool)  # every block a row writes or attends to
        last = _np.full(t.shape[0], -1)
        _np.maximum.at(last, seq, pos // RASE_KV_BLOCK)
        used[_np.arange(t.shape[1])[None, :] <= last[:, None]] = True
        blocks = t[used]
        if blocks.size and (blocks.min() < 0 or blocks.max() >= self.kv.n_blocks):
            raise ValueError(f"block id outside the pool of {self.kv.n_blocks} blocks")
        o = _np.asarray(out_rows)
        if o.size and (o.min() < 0 or o.max() >= n):
            raise ValueError(f"out_rows must index the {n} rows")
        return 0

    cdef rase_sampler_ref *_sampler_refs(self, list samplers, int n_out) except NULL:
        if len(samplers) != n_out:
            raise ValueError(f"{len(samplers)} samplers for {n_out} rows")
        if self._n_refs < n_out or self._refs == NULL:
            free(self._refs)
            self._refs = <rase_sampler_ref *>malloc(max(1, n_out) * sizeof(rase_sampler_ref))
            if self._refs == NULL:
                self._n_refs = 0
                raise MemoryError()
            self._n_refs = n_out
        cdef int j
        for j in range(n_out):
            self._fill_ref(&self._refs[j], samplers[j])
        return self._refs

    cdef int _fill_ref(self, rase_sampler_ref *r, Sampler sp) except -1:
        if sp.n != self.weights.w.hp.n_vocab:
            raise ValueError("sampler vocabulary differs from the model's")
        r.p, r.rng, r.work = &sp.p, &sp.rng, sp.work
        r.counts, r.allow = sp.counts_ptr(), sp.allow_ptr()
        return 0

    def decode_sampled(self, int token, int pos, Sampler sampler not None):
        """The generation loop's per-token call: token at position pos of the single sequence
        (the identity table), then sampler draws from its logits inside the same nogil step
        (its mask applies). Returns the drawn id, or SAMPLE_INVALID / SAMPLE_NONE; the logits
        row stays in last_logits until the next step. One crossing, no per-token arrays."""
        cdef int V = self.weights.w.hp.n_vocab
        if token < 0 or token >= V:
            raise ValueError(f"token id {token} outside the vocabulary of {V}")
        if pos < 0 or pos >= min(self.weights.w.hp.n_ctx, self.kv.n_blocks * RASE_KV_BLOCK):
            raise ValueError(f"position {pos} outside the context")
        if self._logits.shape[0] < 1:
            self._logits = _np.empty((2, V), dtype=_np.float32)
        cdef float[:, ::1] lv = self._logits
        cdef const int32_t[:, ::1] table = self._identity
        cdef rase_sampler_ref ref
        self._fill_ref(&ref, sampler)
        cdef rase_entry row
        row.token, row.seq, row.pos = token, 0, pos
        cdef int32_t out_row = 0, drawn = 0
        cdef rase_batch b
        b.rows, b.n, b.tables, b.table_stride = &row, 1, &table[0, 0], table.shape[1]
        b.out_rows, b.n_out, b.logits = &out_row, 1, &lv[0, 0]
        self.m.trace = NULL
        with nogil:
            rase_step(&self.m, &b, &ref, &drawn)
        return drawn

    @property
    def last_logits(self):
        """float32 (n_vocab,): the logits of decode_sampled's (or step()'s first) row, a view
        valid until the next step."""
        return self._logits[0]

    cdef int _set_trace(self, trace, int n) except -1:
        cdef float[:, :, ::1] tv
        self.m.trace = NULL
        if trace is not None:
            tv = trace
            if (tv.shape[0], tv.shape[1], tv.shape[2]) != (self.weights.w.hp.n_layer, n, self.weights.w.hp.n_embd):
                raise ValueError(f"trace must be (n_layer, {n}, n_embd) float32")
            self.m.trace = &tv[0, 0, 0]
        return 0


def attention(const float[:, ::1] q, const uint16_t[:, ::1] k, const uint16_t[:, ::1] v, float scale,
              int j0=0, isa=None, float softcap=0.0):
    """softmax(scale * q[h] . k[j]) . v over rows j0..len(k)-1 for each of 1..ATTN_G query
    heads q (g, hd) sharing one KV head; k, v are f16 bit patterns (n, hd), as in the KV pool
    (read here as consecutive blocks). softcap > 0: scores s -> softcap * tanh(s / softcap)
    before the softmax. The kernel the forward uses; returns (g, hd)."""
    cdef int n = k.shape[0], hd = q.shape[1], g = q.shape[0], h
    if n < 1 or k.shape[1] != hd or v.shape[0] != n or v.shape[1] != hd or not 0 <= j0 < n:
        raise ValueError("q (g, hd), k and v (n, hd), 0 <= j0 < n required")
    if not 1 <= g <= RASE_ATTN_G:
        raise ValueError(f"1..{RASE_ATTN_G} query heads per call")
    cdef int path = rase_isa if isa is None else _isa_id(isa)
    cdef int64_t qstride = rase_attend_scratch(n, hd)
    scratch = _np.zeros(g * qstride, dtype=_np.float32)
    out = _np.empty((g, hd), dtype=_np.float32)
    table = _np.arange((n + RASE_KV_BLOCK - 1) // RASE_KV_BLOCK, dtype=_np.int32)
    cdef float[::1] sv = scratch
    cdef float[:, ::1] ov = out
    cdef const int32_t[::1] tv = table
    cdef rase_kv_view view
    cdef const float *qs[8]
    cdef float *outs[8]
    for h in range(g):
        qs[h] = &q[h, 0]
        outs[h] = &ov[h, 0]
    view.k, view.v, view.table = &k[0, 0], &v[0, 0], &tv[0]
    view.block_stride, view.row_stride = RASE_KV_BLOCK * hd, hd
    with nogil:
        rase_attend(g, qs, &view, j0, n, hd, scale, softcap, &sv[0], qstride, outs, path)
    return out


def quantize_activation(int qtype, const float[::1] x, isa=None):
    """x quantized to the activation format weights of type qtype pair with (the bytes the
    matmul kernels read): q8_0/q8_1/q8_K blocks, or x itself for float weights."""
    _check_type(qtype)
    cdef int act = DOT_TRAITS[qtype].act
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


def rope(const float[::1] x, int pos, float base, int n_rot=0, bint neox=False, isa=None):
    """x rotated for position pos (theta_i = pos * base^(-2i/n_rot), ggml's f32 recurrence)."""
    cdef int n = x.shape[0]
    if n_rot == 0:
        n_rot = n
    if n_rot < 2 or n_rot % 2 or n_rot > n:
        raise ValueError(f"n_rot={n_rot} invalid for {n} dims")
    cdef int path = rase_isa if isa is None else _isa_id(isa)
    out = _np.array(x, dtype=_np.float32)
    cs = _np.empty(n_rot, dtype=_np.float32)
    cdef float[::1] o = out, c = cs
    with nogil:
        rase_rope_table(&c[0], pos, n_rot, base, 1.0)
        rase_rope(&o[0], &c[0], n_rot, neox, path)
    return out


def expf_avx2(const float[::1] x):
    """The AVX2 exp used by softmax and SiLU, over len(x) (a multiple of 8) inputs."""
    if x.shape[0] % 8 or "avx2" not in isa_supported():
        raise ValueError("length must be a multiple of 8, and AVX2 available")
    out = _np.empty(x.shape[0], dtype=_np.float32)
    cdef float[::1] o = out
    with nogil:
        rase_expf_avx2_n(&x[0], &o[0], x.shape[0])
    return out


# ---------------------------------------------------------------- kernel benchmarks


def bench_read_bandwidth(const uint8_t[::1] buf, int n_threads=1, int reps=3):
    """Bytes per second of a plain streaming read of buf on n_threads (each its own half), the
    best of reps: the bandwidth the matmul kernels are measured against."""
    if buf.shape[0] < 4096 or n_threads < 1 or reps < 1:
        raise ValueError("a buffer of at least 4 KiB, n_threads and reps >= 1")
    cdef int64_t best = 0, ns, sink = 0
    cdef int r
    for r in range(reps):
        with nogil:
            ns = rase_bench_read(&buf[0], buf.shape[0], n_threads, 1, &sink)
        if best == 0 or ns < best:
            best = ns
    return buf.shape[0] / (best / 1e9)


cdef class BenchMatrix:
    """One (rows x cols) matrix of type qtype prepared as a model load prepares it (repacked
    where the type is), multiplied through the forward's matmul loop (32-row chunks from a
    shared counter over n_threads) by matmul()."""
    cdef rase_mat mat
    cdef object w, packed
    cdef int act, path

    def __init__(self, int qtype, const uint8_t[:, ::1] w, int64_t cols, isa=None, int n_threads=1):
        _check_type(qtype)
        cdef int blck = QUANT_TRAITS[qtype].blck, size = QUANT_TRAITS[qtype].size
        self.act = DOT_TRAITS[qtype].act
        cdef int kblk = 256 if self.act == ACT_Q8_K else blck
        if cols == 0 or cols % kblk or w.shape[0] < 1 or w.shape[1] != (cols // blck) * size:
            raise ValueError(f"w (rows, {(cols // blck) * size}) for cols a multiple of {kblk} required")
        if DOT_TRAITS[qtype].dotn[0] == NULL and not R16_TRAITS[qtype].blk_bytes:
            raise ValueError(f"ggml type {qtype} has no matmul kernel")
        self.path = rase_isa if isa is None else _isa_id(isa)
        self.w = w
        self.mat.data, self.mat.type, self.mat.rows, self.mat.cols = &w[0, 0], qtype, w.shape[0], cols
        self.mat.row_bytes, self.mat.layout, self.mat.packed, self.mat.group_bytes = w.shape[1], 0, NULL, 0
        cdef const uint8_t[::1] pv
        if R16_TRAITS[qtype].blk_bytes:
            self.packed = repack(qtype, w, cols, n_threads)
            pv = self.packed
            self.mat.layout, self.mat.packed = RASE_LAYOUT_R16, &pv[0]
            self.mat.group_bytes = (cols // 32) * R16_TRAITS[qtype].blk_bytes

    @property
    def nbytes(self):
        """Bytes of weights one product reads (the repacked copy where there is one)."""
        return len(self.packed) if self.packed is not None else self.mat.rows * self.mat.row_bytes

    def matmul(self, const float[:, ::1] x, int n_threads=1, int reps=1):
        """(y, seconds per product): y (T, rows) float32 = x (T, cols) quantized as the forward
        quantizes it, times the matrix; the product is timed without the quantization."""
        if x.shape[1] != self.mat.cols or x.shape[0] < 1 or n_threads < 1 or reps < 1:
            raise ValueError(f"x (T, {self.mat.cols}), n_threads and reps >= 1 required")
        cdef int T = x.shape[0], t
        cdef int64_t n = self.mat.cols, ns
        cdef int act = rase_act_for(self.mat.type, self.path, T, n)  # as the forward's matmuls
        cdef size_t row = rase_act_bytes(act, n)
        abuf = bytearray(row * T + 64)
        cdef unsigned char[::1] a = abuf
        cdef rase_quant_fn quant = rase_act_quant_for(act, self.path)
        for t in range(T):
            quant(&x[t, 0], &a[t * row], n)
        out = _np.zeros((T, self.mat.rows), dtype=_np.float32)
        cdef float[:, ::1] ov = out
        with nogil:
            ns = rase_bench_matmul(self.path, &self.mat, &a[0], row, T, &ov[0, 0], n_threads, reps)
        if ns < 0:
            raise MemoryError("bench_matmul: no memory for the work counters")
        return out, ns / reps / 1e9


# ---------------------------------------------------------------- the GGUF reader's hot loop

from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memcpy


def gguf_strings(const uint8_t[::1] buf, int64_t pos, int64_t count):
    """count GGUF strings (little-endian u64 length, then UTF-8 bytes) from buf[pos:]: (list of
    str, end offset). IndexError(i): string i runs past the end of buf; ValueError(i, reason):
    string i is not valid UTF-8. Vocabularies hold 50k-260k of them (rase.gguf)."""
    cdef int64_t end = buf.shape[0], i
    cdef uint64_t n
    if pos < 0 or count < 0 or pos > end:
        raise ValueError("pos within buf and count >= 0 required")
    out = [None] * count
    for i in range(count):
        if end - pos < 8:
            raise IndexError(i)
        memcpy(&n, &buf[pos], 8)
        pos += 8
        if n > <uint64_t>(end - pos):
            raise IndexError(i)
        if n == 0:
            out[i] = ""
            continue
        try:
            out[i] = PyUnicode_DecodeUTF8(<const char *>&buf[pos], <Py_ssize_t>n, NULL)
        except UnicodeDecodeError as exc:
            raise ValueError(i, exc.reason) from None
        pos += n
    return out, pos
