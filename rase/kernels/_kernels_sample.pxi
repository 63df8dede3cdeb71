# rase/kernels/_kernels_sample.pxi: included by _kernels.pyx (one extension module). The sampler: one seeded draw per logits row (rase/kernels/_sample.h).

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

    def skip(self, int draws):
        """Advance the RNG past `draws` draws (each sampled token at temperature > 0 takes one)."""
        if draws < 0:
            raise ValueError("draws must be non-negative")
        cdef int i
        for i in range(draws):
            rase_rng_next(&self.rng)

    def fork(self, int draws, Sampler into=None, tokens=()):
        """A sampler that draws as this one will after `draws` more draws and accepting tokens:
        the same settings and logit_bias (read-only, shared), the penalties' counts with tokens
        added, its own scratch (into, when given, is reused), no mask (the caller sets the
        row's). For the rows of a speculative run, each sampling the position it would have
        sampled one token at a time."""
        cdef Sampler out = into
        if out is None or out.n != self.n:
            out = Sampler(self.n, self.p.temperature, self.p.top_k, self.p.top_p, self.p.min_p,
                          self.p.repeat_penalty, self.p.presence_penalty, self.p.frequency_penalty, 0)
        out.p = self.p          # bias points into self._bias, which out keeps alive
        out._bias = self._bias
        out.rng = self.rng
        out._mask = None
        _np.copyto(out.counts, self.counts)
        for t in tokens:
            out.accept(t)
        out.skip(draws)
        return out

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
