# rase/kernels/_kernels_weights.pxi: included by _kernels.pyx (one extension module). The model's C weights: Weights, hyper-parameters and weight pointers into the GGUF mmap (rase/kernels/_forward.h).

# ---------------------------------------------------------------- the forward



import numpy as _np

KV_BLOCK = RASE_KV_BLOCK  # positions per KV block

_MATS = ("wq", "wk", "wv", "wo", "wgate", "wup", "wdown")
_FFN_MATS = ("wgate", "wup", "wdown")
_VECS = ("attn_norm", "ffn_norm", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm", "bq", "bk", "bv", "bo",
         "post_attn_norm_b", "post_ffn_norm_b", "bgate", "bup", "bdown", "sinks")
_ENUMS = {"expert_gating": {"softmax": RASE_GATING_SOFTMAX, "softmax_weight": RASE_GATING_SOFTMAX_WEIGHT}}
_MIXERS = {"attention": RASE_MIXER_ATTENTION, "shortconv": RASE_MIXER_SHORTCONV, "deltanet": RASE_MIXER_DELTANET}
_ATTN_MATS = ("wq", "wk", "wv", "wo")
_ROWS_READ = ("token_embd", "position_embd")  # read a row at a time: never repacked, not streamed


def hparam_names():
    """The hyper-parameters the C forward takes, by name (_model.h: RASE_HPARAMS)."""
    return [RASE_HPARAM_FIELDS[i].name.decode() for i in range(RASE_HPARAM_COUNT)]


cdef class Weights:
    """The read-only C weights of one model: hyper-parameters and weight pointers into the caller's
    buffers (the GGUF mmap), shared by every Forward over it."""
    cdef rase_weights w
    cdef rase_layer *layers
    cdef rase_mat *experts  # (n_layer, 3, n_expert): the MoE layers' expert matrices
    cdef list _keep  # owners of every buffer the weights point into
    cdef readonly int64_t packed_bytes  # private copies made at load (repacked weights)
    cdef int _threads
    cdef int _isa    # the kernel path every Forward over these weights runs, fixed here at load
    cdef object _on_packed
    cdef dict _cached     # name -> packed bytes given at load (a cache), or None
    cdef readonly dict repacked  # name -> packed bytes this load made (for the cache)
    cdef readonly list streamed  # data of the matrices read in place, whole, every forward

    def __cinit__(self):
        self.layers = NULL
        self.experts = NULL

    def __init__(self, layout, int n_threads=1, on_packed=None, isa=None, packed=None):
        """layout: a rase.models.base.ForwardLayout (params: the hyper-parameters by name, n_ctx =
        positions one sequence may reach; tok_embd/output Matrix, output_norm, one LayerLayout per
        layer).
        isa: the kernel path (an isa_names() entry; default: the one selected now), fixed for
        the weights' life: set_isa later changes new Weights only.
        Matrices of the repacked types are copied into the 16-row layout (n_threads at a time);
        on_packed(data, start, end, copied) is called before (copied=False) and after bytes
        [start, end) of a matrix's data are copied (after that they are not read again)."""
        self._keep = []
        self._threads, self._on_packed = n_threads, on_packed
        self._isa = rase_isa if isa is None else _isa_id(isa)
        self._cached, self.repacked, self.streamed = packed, {}, []
        cdef rase_hparams *h = &self.w.hp
        self._hparams(layout.params)
        if h.n_conv and not 2 <= h.n_conv <= RASE_CONV_MAX:
            raise ValueError(f"short convolutions of {h.n_conv} taps; 2..{RASE_CONV_MAX} supported")
        if h.ssm_v_heads and (h.ssm_head <= 0 or h.ssm_head % 16 or h.ssm_k_heads <= 0 or h.ssm_v_heads % h.ssm_k_heads):
            raise ValueError(f"delta nets of {h.ssm_k_heads} key and {h.ssm_v_heads} value heads of {h.ssm_head}: "
                             "heads a multiple of 16, value heads a multiple of key heads")
        if h.n_expert and not 0 < h.n_expert_used <= h.n_expert <= 256 or h.n_expert < 0 or \
                (h.n_expert and h.n_ff_exp <= 0) or h.attn_softcap < 0 or h.final_softcap < 0:
            raise ValueError("invalid expert or soft-capping hyper-parameters")
        if min(h.n_layer, h.n_embd, h.n_head, h.n_head_kv, h.head_dim, h.n_ff, h.n_vocab,
               h.n_ctx) <= 0 or h.n_head % h.n_head_kv:
            raise ValueError("invalid hyper-parameters")
        if h.n_rot <= 0 or h.n_rot > h.head_dim or h.n_rot % 2:
            raise ValueError(f"rope dimension {h.n_rot} invalid for head_dim {h.head_dim}")
        for s, r in enumerate(layout.rope):
            self._rope(&h.rope[s], r, s)
        self._mat(&self.w.tok_embd, layout.tok_embd, h.n_vocab, h.n_embd, "token_embd")
        if layout.output is not None:  # an encoder has no LM head
            self._mat(&self.w.output, layout.output, h.n_vocab, h.n_embd, "output")
        if layout.pos_embd is not None:
            self._mat(&self.w.pos_embd, layout.pos_embd, layout.pos_embd.rows, h.n_embd, "position_embd")
            if layout.pos_embd.rows < h.n_ctx:
                raise ValueError(f"{layout.pos_embd.rows} learned positions for a context of {h.n_ctx}")
        self.w.type_embd = self._opt_vec(layout.type_embd, h.n_embd, "token_types")
        self.w.embd_norm = self._opt_vec(layout.embd_norm, h.n_embd, "token_embd_norm")
        self.w.embd_norm_b = self._opt_vec(layout.embd_norm_b, h.n_embd, "token_embd_norm.bias")
        if self.w.output.layout == RASE_LAYOUT_R16 and self.w.output.data == self.w.tok_embd.data:
            # tied and repacked: rows are looked up in the output's copy (rase_embed), so the file's
            # embedding is never read after load and its pages are not mapped by lookups
            self.w.tok_embd.layout, self.w.tok_embd.packed = RASE_LAYOUT_R16, self.w.output.packed
            self.w.tok_embd.group_bytes = self.w.output.group_bytes
        self.w.output_norm = self._opt_vec(layout.output_norm, h.n_embd, "output_norm")
        layers = layout.layers
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
        h.n_kv_layer, h.state_floats = 0, 0
        for il, spec in enumerate(layers):
            self._layer(&self.layers[il], il, spec)
        if rase_weights_init(&self.w) != 0:
            raise MemoryError()

    cdef int _hparams(self, object params) except -1:
        """Every field of _model.h's RASE_HPARAMS from params[name] (models/base.py:
        forward_params); an enum's from its name (_ENUMS)."""
        cdef char *h = <char *>&self.w.hp
        cdef const rase_hparam_field *f
        cdef int i
        for i in range(RASE_HPARAM_COUNT):
            f = &RASE_HPARAM_FIELDS[i]
            name = f.name.decode()
            if name not in params:
                raise ValueError(f"hyper-parameter {name} is missing")
            value = params[name]
            if name in _ENUMS:
                if value not in _ENUMS[name]:
                    raise ValueError(f"{name} {value!r}, one of {sorted(_ENUMS[name])} expected")
                value = _ENUMS[name][value]
            if f.is_float:
                (<float *>(h + f.offset))[0] = value
            else:
                (<int *>(h + f.offset))[0] = value
        return 0

    cdef int _layer(self, rase_layer *L, int il, object spec) except -1:
        cdef rase_hparams *h = &self.w.hp
        nq, nkv = h.n_head * h.head_dim, h.n_head_kv * h.head_dim
        shapes = {"wq": ((2 if h.attn_gate else 1) * nq, h.n_embd), "wk": (nkv, h.n_embd), "wv": (nkv, h.n_embd),
                  "wo": (h.n_embd, nq), "wgate": (h.n_ff, h.n_embd), "wup": (h.n_ff, h.n_embd),
                  "wdown": (h.n_embd, h.n_ff)}
        L.qk_norm_full = bool(spec.qk_norm_full)
        lens = {"attn_norm": h.n_embd, "ffn_norm": h.n_embd, "q_norm": nq if L.qk_norm_full else h.head_dim,
                "k_norm": nkv if L.qk_norm_full else h.head_dim, "post_attn_norm": h.n_embd,
                "post_ffn_norm": h.n_embd, "bq": nq, "bk": nkv, "bv": nkv, "bo": h.n_embd,
                "post_attn_norm_b": h.n_embd, "post_ffn_norm_b": h.n_embd, "bgate": h.n_ff, "bup": h.n_ff,
                "bdown": h.n_embd, "sinks": h.n_head}
        cdef rase_mat *mats[7]
        cdef const float **vecs[16]
        mats[:] = [&L.wq, &L.wk, &L.wv, &L.wo, &L.wgate, &L.wup, &L.wdown]
        vecs[:] = [&L.attn_norm, &L.ffn_norm, &L.q_norm, &L.k_norm, &L.post_attn_norm, &L.post_ffn_norm,
                   &L.bq, &L.bk, &L.bv, &L.bo, &L.post_attn_norm_b, &L.post_ffn_norm_b, &L.bgate, &L.bup, &L.bdown, &L.sinks]
        experts = spec.experts
        if spec.mixer not in _MIXERS:
            raise ValueError(f"layer {il}: token mixer {spec.mixer!r}, one of {sorted(_MIXERS)} expected")
        L.mixer, L.kv_layer = _MIXERS[spec.mixer], -1
        if L.mixer == RASE_MIXER_SHORTCONV:
            self._shortconv(L, il, spec)
        elif L.mixer == RASE_MIXER_DELTANET:
            self._deltanet(L, il, spec)
        else:
            L.kv_layer, h.n_kv_layer = h.n_kv_layer, h.n_kv_layer + 1
        for j, name in enumerate(_MATS):
            if name == "wgate" and experts is None and spec.wgate is None:
                continue  # an FFN without a gate (bert): up, act, down
            if name in _ATTN_MATS and L.mixer != RASE_MIXER_ATTENTION:
                continue
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
        if L.rope_slot not in (-1, 0, 1) or (L.rope_slot == 1 and h.rope[1].base <= 0) or L.window < 0:
            raise ValueError(f"layer {il}: bad window/rope slot")
        return 0

    cdef int _shortconv(self, rase_layer *L, int il, object spec) except -1:
        """LFM2's conv block: in/out projections, the taps (n_conv, n_embd) tap-major, and this
        layer's (n_conv - 1, n_embd) share of a state slot."""
        cdef rase_hparams *h = &self.w.hp
        if not h.n_conv:
            raise ValueError(f"layer {il}: a short convolution in a model without n_conv")
        self._mat(&L.conv_in, spec.conv_in, 3 * h.n_embd, h.n_embd, f"blk.{il}.shortconv.in_proj")
        self._mat(&L.conv_out, spec.conv_out, h.n_embd, h.n_embd, f"blk.{il}.shortconv.out_proj")
        L.conv_w = self._vec(_np.asarray(spec.conv_w).reshape(-1), h.n_conv * h.n_embd, f"blk.{il}.shortconv.conv")
        L.state_off = h.state_floats
        h.state_floats += (h.n_conv - 1) * h.n_embd
        return 0

    cdef int _deltanet(self, rase_layer *L, int il, object spec) except -1:
        """Qwen3.5's delta net: its five projections, the conv taps (n_conv, channels) tap-major,
        the gates' vectors, the output norm, and this layer's share of a state slot: the conv's
        (n_conv - 1, channels), then H_v matrices (S, S)."""
        cdef rase_hparams *h = &self.w.hp
        cdef int64_t S = h.ssm_head, val = h.ssm_v_heads * h.ssm_head
        cdef int64_t cd = 2 * h.ssm_k_heads * S + val
        if not h.n_conv or not h.ssm_v_heads:
            raise ValueError(f"layer {il}: a delta net in a model without n_conv and delta-net heads")
        p = f"blk.{il}."
        self._mat(&L.conv_in, spec.conv_in, cd, h.n_embd, p + "attn_qkv")
        self._mat(&L.ssm_z, spec.ssm_z, val, h.n_embd, p + "attn_gate")
        self._mat(&L.ssm_beta, spec.ssm_beta, h.ssm_v_heads, h.n_embd, p + "ssm_beta")
        self._mat(&L.ssm_alpha, spec.ssm_alpha, h.ssm_v_heads, h.n_embd, p + "ssm_alpha")
        self._mat(&L.conv_out, spec.conv_out, h.n_embd, val, p + "ssm_out")
        L.conv_w = self._vec(_np.asarray(spec.conv_w).reshape(-1), h.n_conv * cd, p + "ssm_conv1d")
        L.ssm_dt = self._vec(spec.ssm_dt, h.ssm_v_heads, p + "ssm_dt")
        L.ssm_a = self._vec(spec.ssm_a, h.ssm_v_heads, p + "ssm_a")
        L.ssm_norm = self._vec(spec.ssm_norm, S, p + "ssm_norm")
        L.state_off = h.state_floats
        h.state_floats += (h.n_conv - 1) * cd + h.ssm_v_heads * S * S
        return 0

    cdef int _rope(self, rase_rope_params *out, object r, int slot) except -1:
        cdef const float *factors = NULL
        if r.base < 0 or (slot == 0 and r.base <= 0) or not r.freq_scale > 0 or not r.attn_factor > 0 \
                or (r.yarn and r.n_ctx_orig <= 0):
            raise ValueError(f"rope slot {slot}: invalid base, scale, attention factor or original context")
        if r.factors is not None:
            factors = self._vec(r.factors, self.w.hp.n_rot // 2, f"rope slot {slot} factors")
        rase_rope_init(out, self.w.hp.n_rot, r.base, r.freq_scale, r.yarn, r.attn_factor, r.n_ctx_orig, factors)
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
        L.gate_inp_b = self._opt_vec(ex.gate_inp_b, h.n_expert, f"blk.{il}.gate_inp_b")
        L.exp_bgate = self._opt_vec(ex.bgate, h.n_expert * h.n_ff_exp, f"blk.{il}.exp_bgate")
        L.exp_bup = self._opt_vec(ex.bup, h.n_expert * h.n_ff_exp, f"blk.{il}.exp_bup")
        L.exp_bdown = self._opt_vec(ex.bdown, h.n_expert * h.n_embd, f"blk.{il}.exp_bdown")
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
        if rase_traits(qtype).dotn[0] == NULL and not rase_traits(qtype).r16_blk:
            raise ValueError(f"{name}: no dot kernel for type {qtype}")
        cdef int blck = rase_traits(qtype).blck
        cdef int kblk = 256 if rase_traits(qtype).act == ACT_Q8_K else blck
        if cols % kblk:
            raise ValueError(f"{name}: row length {cols} is not a multiple of {kblk}")
        cdef const uint8_t[::1] view = data
        cdef int64_t row_bytes = (cols // blck) * rase_traits(qtype).size
        if view.shape[0] != rows * row_bytes:
            raise ValueError(f"{name}: {view.shape[0]} bytes, expected {rows * row_bytes}")
        out.data = &view[0]
        out.type, out.rows, out.cols, out.row_bytes = qtype, rows, cols, row_bytes
        out.layout, out.packed, out.group_bytes = 0, NULL, 0
        self._keep.append(data)
        cdef const uint8_t[::1] pv
        if rase_traits(qtype).r16_blk and name not in _ROWS_READ:
            packed = None if self._cached is None else self._cached.get(name)
            if packed is None or packed.nbytes != rase_r16_bytes(qtype, rows, cols) or packed.ctypes.data % 64:
                chunk = None if self._on_packed is None else (
                    lambda r0, r1, copied: self._on_packed(data, r0 * row_bytes, r1 * row_bytes, copied))
                packed = repack(qtype, _np.asarray(view).reshape(rows, row_bytes), cols, self._threads, chunk)
                self.repacked[name] = packed
            pv = packed
            out.layout, out.packed = RASE_LAYOUT_R16, &pv[0]
            out.group_bytes = (cols // 32) * rase_traits(qtype).r16_blk
            self._keep.append(packed)
            self.packed_bytes += packed.shape[0]
        elif name not in _ROWS_READ:
            self.streamed.append(data)
        return 0

    cdef const float *_opt_vec(self, object arr, int64_t n, str name) except? NULL:
        if arr is None:  # not a conditional expression: Cython types its temporary non-const
            return NULL
        return self._vec(arr, n, name)

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
    def params(self):
        """The hyper-parameters as the C forward holds them, by name (_model.h: RASE_HPARAMS)."""
        cdef char *h = <char *>&self.w.hp
        cdef const rase_hparam_field *f
        cdef int i
        out = {}
        for i in range(RASE_HPARAM_COUNT):
            f = &RASE_HPARAM_FIELDS[i]
            out[f.name.decode()] = (<float *>(h + f.offset))[0] if f.is_float else (<int *>(h + f.offset))[0]
        return out

    @property
    def n_ctx(self):
        return self.w.hp.n_ctx

    @property
    def n_vocab(self):
        return self.w.hp.n_vocab

    @property
    def causal(self):
        return bool(self.w.hp.causal)

    @property
    def has_lm_head(self):
        """False for an encoder: it gives hidden states, no logits."""
        return self.w.output.data != NULL

    @property
    def isa(self):
        return RASE_ISA_NAMES[self._isa].decode()

    @property
    def kv_bytes_per_token(self):
        """f16 K and V of one position, every attention layer."""
        return self.kv_bytes("f16")

    def kv_bytes(self, str kv_type):
        """K and V of one position, every attention layer, in a pool of kv_type (KV_TYPES)."""
        return 2 * self.w.hp.n_kv_layer * self.w.hp.n_head_kv * kv_row_bytes(kv_type, self.w.hp.head_dim)

    @property
    def state_bytes(self):
        """f32 recurrent state of one sequence (every recurrent layer's); 0 without."""
        return self.w.hp.state_floats * 4


SAMPLE_INVALID = RASE_SAMPLE_INVALID  # sample()/step() token: the logits are not finite
SAMPLE_NONE = RASE_SAMPLE_NONE        # the mask allowed no token
