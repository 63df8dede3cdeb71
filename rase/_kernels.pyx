# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Kernels over rase/_simd.h and rase/_quants.h.

Every public function is a `def` shim: it checks types and shapes with the GIL held, then enters
a `noexcept nogil` C core that never touches Python objects.
"""
from libc.stdint cimport uint8_t, int64_t

cdef extern from "_simd.h" nogil:
    int RASE_ISA_SCALAR
    int RASE_ISA_AVX2
    int RASE_ISA_COUNT
    const char *RASE_ISA_NAMES[]
    int rase_isa
    int rase_isa_compiled(int isa)
    int rase_isa_supported(int isa)
    int rase_isa_best()

cdef extern from *:
    """
    #ifdef _OPENMP
    #  include <omp.h>
    #  define RASE_OPENMP _OPENMP
    static int rase_omp_max_threads(void) { return omp_get_max_threads(); }
    #else
    #  define RASE_OPENMP 0
    static int rase_omp_max_threads(void) { return 1; }
    #endif
    #ifdef __clang__
    #  define RASE_COMPILER "clang " __clang_version__
    #elif defined(__GNUC__)
    #  define RASE_COMPILER "gcc " __VERSION__
    #else
    #  define RASE_COMPILER "unknown"
    #endif
    """
    int RASE_OPENMP
    const char *RASE_COMPILER
    int rase_omp_max_threads() nogil

cdef extern from "_quants.h" nogil:
    ctypedef void (*rase_dequant_fn)(const void *src, float *dst, int64_t n) noexcept nogil
    ctypedef struct rase_quant_traits:
        const char *name
        int blck
        int size
        rase_dequant_fn dequant[2]
    int RASE_GGML_TYPE_COUNT
    const rase_quant_traits QUANT_TRAITS[]
    rase_dequant_fn rase_dequant_for(int qtype, int isa)


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

cdef extern from "_dot.h" nogil:
    ctypedef void (*rase_dotn_fn)(int64_t n, const void *w, const void *a, size_t astride,
                                  int nt, float *out) noexcept nogil
    ctypedef void (*rase_quant_fn)(const float *x, void *dst, int64_t n) noexcept nogil
    ctypedef struct rase_dot_traits:
        int act
        rase_dotn_fn dotn[2]
    int RASE_NT
    const rase_dot_traits DOT_TRAITS[]
    size_t rase_act_bytes(int act, int64_t n)
    rase_dotn_fn rase_dotn_for(int qtype, int isa)
    rase_quant_fn rase_act_quant_for(int act, int isa)


def vec_dot(int qtype, const uint8_t[::1] w, const float[:, ::1] x, isa=None):
    """w (one row of x.shape[1] elements of type qtype) . x[t] for each of up to RASE_NT rows of
    x, each quantized to the activation format the type pairs with (exactly as the forward)."""
    _check_type(qtype)
    cdef int64_t n = x.shape[1]
    cdef int nt = x.shape[0], t
    cdef int blck = QUANT_TRAITS[qtype].blck, size = QUANT_TRAITS[qtype].size
    cdef int act = DOT_TRAITS[qtype].act
    cdef int kblk = 256 if act == 3 else blck
    if n == 0 or n % kblk:
        raise ValueError(f"row length {n} must be a positive multiple of {kblk}")
    if not 1 <= nt <= RASE_NT:
        raise ValueError(f"1..{RASE_NT} activation rows, got {nt}")
    if w.shape[0] != (n // blck) * size:
        raise ValueError(f"{n} elements need {(n // blck) * size} bytes, got {w.shape[0]}")
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

from libc.stdint cimport int32_t, uint16_t
from libc.stdlib cimport calloc, free

cdef extern from "_forward.h" nogil:
    ctypedef struct rase_mat:
        const uint8_t *data
        int type
        int64_t rows, cols, row_bytes
    ctypedef struct rase_layer:
        rase_mat wq, wk, wv, wo, wgate, wup, wdown
        const float *attn_norm
        const float *ffn_norm
        const float *q_norm
        const float *k_norm
        const float *post_attn_norm
        const float *post_ffn_norm
        int window, rope_slot
    ctypedef struct rase_model:
        int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx, n_rot
        int rope_neox, gelu, attn_prescale
        float eps, embd_scale, attn_scale
        float rope_base[2]
        float rope_freq_scale[2]
        rase_mat tok_embd, output
        const float *output_norm
        rase_layer *layers
        int max_batch, n_threads, isa
        float *trace
        int profile
        int64_t prof_matmul_ns, prof_attn_ns
    int rase_model_alloc(rase_model *m)
    void rase_model_free(rase_model *m)
    void rase_forward(rase_model *m, const int32_t *tokens, int T, int pos0, float *logits, int n_out)

import numpy as _np

_MATS = ("wq", "wk", "wv", "wo", "wgate", "wup", "wdown")
_NORMS = ("attn_norm", "ffn_norm", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm")


cdef class Forward:
    """A model plan over weights that stay in the caller's buffers (the GGUF mmap), an f16 KV
    cache of n_ctx positions and scratch for max_batch tokens. Not thread-safe: one caller
    at a time (sessions hold a lock)."""
    cdef rase_model m
    cdef rase_layer *layers
    cdef list _keep  # owners of every buffer the plan points into

    def __cinit__(self):
        self.layers = NULL

    def __init__(self, dict hp, dict tensors, list layers, int n_threads, int max_batch):
        """hp: hyper-parameters; tensors: tok_embd, output (matrices), output_norm (vector);
        layers: one dict per layer with the _MATS matrices, _NORMS vectors (None = absent),
        window and rope_slot. A matrix is (data uint8, ggml type, rows, cols)."""
        self._keep = []
        m = &self.m
        m.n_layer, m.n_embd, m.n_head = hp["n_layer"], hp["n_embd"], hp["n_head"]
        m.n_head_kv, m.head_dim, m.n_ff = hp["n_head_kv"], hp["head_dim"], hp["n_ff"]
        m.n_vocab, m.n_ctx, m.n_rot = hp["n_vocab"], hp["n_ctx"], hp["n_rot"]
        m.rope_neox, m.gelu = hp["rope_neox"], hp["gelu"]
        m.attn_prescale = hp.get("attn_prescale", 0)
        m.eps, m.embd_scale, m.attn_scale = hp["eps"], hp["embd_scale"], hp["attn_scale"]
        for s in range(2):
            m.rope_base[s] = hp["rope_base"][s]
            m.rope_freq_scale[s] = hp["rope_freq_scale"][s]
        if min(m.n_layer, m.n_embd, m.n_head, m.n_head_kv, m.head_dim, m.n_ff, m.n_vocab,
               m.n_ctx, n_threads, max_batch) <= 0 or m.n_head % m.n_head_kv:
            raise ValueError("invalid hyper-parameters")
        if m.n_rot <= 0 or m.n_rot > m.head_dim or m.n_rot % 2:
            raise ValueError(f"rope dimension {m.n_rot} invalid for head_dim {m.head_dim}")
        m.n_threads, m.max_batch = n_threads, max_batch
        nq, nkv = m.n_head * m.head_dim, m.n_head_kv * m.head_dim
        self._mat(&m.tok_embd, tensors["tok_embd"], m.n_vocab, m.n_embd, "token_embd")
        self._mat(&m.output, tensors["output"], m.n_vocab, m.n_embd, "output")
        m.output_norm = self._vec(tensors["output_norm"], m.n_embd, "output_norm")
        if len(layers) != m.n_layer:
            raise ValueError(f"{len(layers)} layer plans for {m.n_layer} layers")
        self.layers = <rase_layer *>calloc(m.n_layer, sizeof(rase_layer))
        if self.layers == NULL:
            raise MemoryError()
        m.layers = self.layers
        shapes = {"wq": (nq, m.n_embd), "wk": (nkv, m.n_embd), "wv": (nkv, m.n_embd),
                  "wo": (m.n_embd, nq), "wgate": (m.n_ff, m.n_embd), "wup": (m.n_ff, m.n_embd),
                  "wdown": (m.n_embd, m.n_ff)}
        lens = {"attn_norm": m.n_embd, "ffn_norm": m.n_embd, "q_norm": m.head_dim,
                "k_norm": m.head_dim, "post_attn_norm": m.n_embd, "post_ffn_norm": m.n_embd}
        cdef rase_layer *L
        cdef rase_mat *mats[7]
        cdef const float **norms[6]
        for il, spec in enumerate(layers):
            L = &self.layers[il]
            mats[:] = [&L.wq, &L.wk, &L.wv, &L.wo, &L.wgate, &L.wup, &L.wdown]
            norms[:] = [&L.attn_norm, &L.ffn_norm, &L.q_norm, &L.k_norm, &L.post_attn_norm, &L.post_ffn_norm]
            for j, name in enumerate(_MATS):
                self._mat(mats[j], spec[name], shapes[name][0], shapes[name][1], f"blk.{il}.{name}")
            for j, name in enumerate(_NORMS):
                if spec.get(name) is None:
                    if name in ("attn_norm", "ffn_norm"):
                        raise ValueError(f"layer {il} needs {name}")
                    norms[j][0] = NULL
                else:
                    norms[j][0] = self._vec(spec[name], lens[name], f"blk.{il}.{name}")
            L.window, L.rope_slot = spec.get("window", 0), spec.get("rope_slot", 0)
            if L.rope_slot not in (0, 1) or (L.rope_slot == 1 and m.rope_base[1] <= 0) or L.window < 0:
                raise ValueError(f"layer {il}: bad window/rope slot")
        if rase_model_alloc(m) != 0:
            raise MemoryError(f"cannot allocate the KV cache and scratch for n_ctx={m.n_ctx}")

    cdef int _mat(self, rase_mat *out, tuple spec, int64_t rows, int64_t cols, str name) except -1:
        data, qtype, r, c = spec
        if (r, c) != (rows, cols):
            raise ValueError(f"{name}: shape ({r}, {c}), expected ({rows}, {cols})")
        _check_type(qtype)
        if DOT_TRAITS[qtype].dotn[0] == NULL:
            raise ValueError(f"{name}: no dot kernel for type {qtype}")
        cdef int blck = QUANT_TRAITS[qtype].blck
        cdef int kblk = 256 if DOT_TRAITS[qtype].act == 3 else blck
        if cols % kblk:
            raise ValueError(f"{name}: row length {cols} is not a multiple of {kblk}")
        cdef const uint8_t[::1] view = data
        cdef int64_t row_bytes = (cols // blck) * QUANT_TRAITS[qtype].size
        if view.shape[0] != rows * row_bytes:
            raise ValueError(f"{name}: {view.shape[0]} bytes, expected {rows * row_bytes}")
        out.data = &view[0]
        out.type, out.rows, out.cols, out.row_bytes = qtype, rows, cols, row_bytes
        self._keep.append(data)
        return 0

    cdef const float *_vec(self, object arr, int64_t n, str name) except NULL:
        a = _np.ascontiguousarray(arr, dtype=_np.float32)
        if a.ndim != 1 or a.shape[0] != n:
            raise ValueError(f"{name}: expected ({n},) float32, got {a.shape}")
        cdef const float[::1] view = a
        self._keep.append(a)
        return &view[0]

    def __dealloc__(self):
        rase_model_free(&self.m)
        free(self.layers)

    @property
    def n_ctx(self):
        return self.m.n_ctx

    @property
    def n_vocab(self):
        return self.m.n_vocab

    @property
    def max_batch(self):
        return self.m.max_batch

    @property
    def n_threads(self):
        return self.m.n_threads

    def take_profile(self):
        """(matmul ns, attention ns) accumulated since the last call; profiling on from now."""
        out = (self.m.prof_matmul_ns, self.m.prof_attn_ns)
        self.m.profile = 1
        self.m.prof_matmul_ns = self.m.prof_attn_ns = 0
        return out

    def run(self, const int32_t[::1] tokens, int pos0, int n_out=1, trace=None):
        """Evaluate tokens at positions pos0.. (writing the KV cache); returns float32 logits
        (n_out, n_vocab) for the last n_out tokens. GIL released for the whole forward.
        trace: optional float32 (n_layer, T, n_embd) array receiving each layer's output."""
        cdef int T = tokens.shape[0], i
        cdef rase_model *m = &self.m
        if T < 1 or T > m.max_batch:
            raise ValueError(f"batch of {T} tokens; 1..{m.max_batch} allowed")
        if pos0 < 0 or pos0 + T > m.n_ctx:
            raise ValueError(f"positions {pos0}..{pos0 + T - 1} outside the context of {m.n_ctx}")
        if n_out < 1 or n_out > T:
            raise ValueError(f"n_out={n_out} must be in 1..{T}")
        for i in range(T):
            if tokens[i] < 0 or tokens[i] >= m.n_vocab:
                raise ValueError(f"token id {tokens[i]} outside the vocabulary of {m.n_vocab}")
        out = _np.empty((n_out, m.n_vocab), dtype=_np.float32)
        cdef float[:, ::1] lv = out
        cdef float[:, :, ::1] tv
        m.trace = NULL
        if trace is not None:
            tv = trace
            if (tv.shape[0], tv.shape[1], tv.shape[2]) != (m.n_layer, T, m.n_embd):
                raise ValueError(f"trace must be ({m.n_layer}, {T}, {m.n_embd}) float32")
            m.trace = &tv[0, 0, 0]
        m.isa = rase_isa
        with nogil:
            rase_forward(m, &tokens[0], T, pos0, &lv[0, 0], n_out)
        m.trace = NULL
        return out


cdef extern from "_forward.h" nogil:
    void rase_attend(const float *q, const uint16_t *kc, const uint16_t *vc, int64_t stride, int j0,
                     int j1, int hd, float scale, float *scratch, float *out, int isa, int single)


def attention(const float[::1] q, const uint16_t[:, ::1] k, const uint16_t[:, ::1] v, float scale,
              int j0=0, isa=None, bint single=False):
    """softmax(scale * q . k[j]) . v over rows j0..len(k)-1; k, v are f16 bit patterns
    (n, head_dim), as in the KV cache. The kernel the forward uses for one query head."""
    cdef int n = k.shape[0], hd = q.shape[0]
    if n < 1 or k.shape[1] != hd or v.shape[0] != n or v.shape[1] != hd or not 0 <= j0 < n:
        raise ValueError("q (hd,), k and v (n, hd), 0 <= j0 < n required")
    cdef int path = rase_isa if isa is None else _isa_id(isa)
    scratch = _np.zeros(n + 128 + 33 * hd, dtype=_np.float32)
    out = _np.empty(hd, dtype=_np.float32)
    cdef float[::1] sv = scratch, ov = out
    with nogil:
        rase_attend(&q[0], &k[0, 0], &v[0, 0], hd, j0, n, hd, scale, &sv[0], &ov[0], path, single)
    return out


def quantize_activation(int qtype, const float[::1] x, isa=None):
    """x quantized to the activation format weights of type qtype pair with (the bytes the
    matmul kernels read): q8_0/q8_1/q8_K blocks, or x itself for float weights."""
    _check_type(qtype)
    cdef int act = DOT_TRAITS[qtype].act
    cdef int64_t n = x.shape[0]
    cdef int kblk = 256 if act == 3 else (32 if act else 1)
    if n == 0 or n % kblk:
        raise ValueError(f"length {n} must be a positive multiple of {kblk}")
    cdef int path = rase_isa if isa is None else _isa_id(isa)
    out = bytearray(rase_act_bytes(act, n))
    cdef unsigned char[::1] o = out
    cdef rase_quant_fn quant = rase_act_quant_for(act, path)
    with nogil:
        quant(&x[0], &o[0], n)
    return bytes(out)


cdef extern from "_forward.h" nogil:
    void rase_gate(float *g, const float *u, int64_t n, const uint16_t *gelu_table, int isa)
    void rase_rope(float *x, const float *cs, int n_rot, int neox, int isa)
    void rase_rope_table(float *cs, int pos, int n_rot, float base, float freq_scale)
    uint16_t *rase_gelu_table_new()

cdef extern from "_simd.h" nogil:
    """
    #if RASE_HAVE_X86
    RASE_TARGET_AVX2 static void rase_expf_avx2_n(const float *x, float *y, int64_t n) {
        for (int64_t i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, rase_avx2_expf(_mm256_loadu_ps(x + i)));
    }
    #else
    static void rase_expf_avx2_n(const float *x, float *y, int64_t n) { (void)x; (void)y; (void)n; }
    #endif
    """
    void rase_expf_avx2_n(const float *x, float *y, int64_t n)


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


from libc.stdint cimport uint64_t

cdef extern from "_sample.h" nogil:
    ctypedef struct rase_rng:
        uint64_t s[4]
    ctypedef struct rase_sampling:
        float temperature
        int top_k
        float top_p
        float min_p
        float repeat_penalty
        float presence_penalty
        float frequency_penalty
    ctypedef struct rase_cand:
        float logit
        int32_t id
    void rase_rng_seed(rase_rng *r, uint64_t seed)
    int32_t rase_sample(float *logits, int32_t n, const int32_t *counts, const rase_sampling *p,
                        rase_rng *rng, rase_cand *work)

from libc.stdlib cimport malloc


cdef class Sampler:
    """Samples token ids from logits rows with an explicit seeded RNG; counts of the tokens
    sampled so far feed the repeat/presence/frequency penalties. The GIL is released while it
    runs."""
    cdef rase_sampling p
    cdef rase_rng rng
    cdef rase_cand *work
    cdef int32_t n
    cdef object counts  # int32 (n,)

    def __cinit__(self):
        self.work = NULL

    def __init__(self, int n_vocab, float temperature, int top_k, float top_p, float min_p,
                 float repeat_penalty, float presence_penalty, float frequency_penalty,
                 unsigned long long seed):
        if n_vocab < 1:
            raise ValueError("vocabulary must not be empty")
        self.n = n_vocab
        self.p.temperature, self.p.top_k, self.p.top_p, self.p.min_p = temperature, top_k, top_p, min_p
        self.p.repeat_penalty = repeat_penalty
        self.p.presence_penalty, self.p.frequency_penalty = presence_penalty, frequency_penalty
        rase_rng_seed(&self.rng, seed)
        self.work = <rase_cand *>malloc(n_vocab * sizeof(rase_cand))
        if self.work == NULL:
            raise MemoryError()
        self.counts = _np.zeros(n_vocab, dtype=_np.int32)

    def __dealloc__(self):
        free(self.work)

    def accept(self, int token):
        """Record a token as part of the history the penalties see (prompt or generated)."""
        if 0 <= token < self.n:
            self.counts[token] += 1

    def sample(self, logits):
        """One token id from a (n_vocab,) float32 row; -1 if the logits are not finite."""
        row = _np.array(logits, dtype=_np.float32, copy=True)
        if row.ndim != 1 or row.shape[0] != self.n:
            raise ValueError(f"logits must be ({self.n},) float32")
        cdef float[::1] lv = row
        cdef int32_t[::1] cv = self.counts
        cdef int32_t out
        with nogil:
            out = rase_sample(&lv[0], self.n, &cv[0], &self.p, &self.rng, self.work)
        return out
