# rase/kernels/_kernels_forward.pxi: included by _kernels.pyx (one extension module). The forward: KV pool, scratch and steps over a Weights plan (rase/kernels/_forward.h).

# the KV pool's element types (llama.cpp's -ctk / -ctv names) -> ggml type ids; quantized pools
# attend with llama.cpp's flash-attention numerics (_attend_fa.h)
KV_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}


def kv_row_bytes(str kv_type, int head_dim):
    """Bytes of one position's K (or V) row of one KV head in a pool of kv_type."""
    if kv_type not in KV_TYPES:
        raise ValueError(f"KV type {kv_type!r}: one of {', '.join(KV_TYPES)}")
    if kv_type != "f16" and head_dim % 32:
        raise ValueError(f"KV type {kv_type} needs a head size divisible by 32; this model's is {head_dim}")
    return 2 * rase_kv_row_elems(KV_TYPES[kv_type], head_dim)


cdef class Forward:
    """Runs steps over a Weights plan: owns a KV pool of n_blocks blocks (RASE_KV_BLOCK
    positions each, every attention layer), n_slots recurrent-state slots (a model with
    recurrent layers: one per running sequence, the rest checkpoints) and scratch for steps of
    up to max_rows rows. kv_type: the pool's K/V elements (KV_TYPES); a quantized pool rotates
    Q/K and V by Walsh-Hadamard transforms as llama.cpp does unless kv_rotate is False (llama.cpp's
    LLAMA_ATTN_ROT_DISABLE=1). One caller at a time (a session's decoder, or a model's worker thread)."""
    cdef rase_model m
    cdef rase_kv_pool kv
    cdef rase_scratch s
    cdef readonly Weights weights
    cdef readonly str kv_type
    cdef object _identity  # int32 (1, n_blocks): the single-sequence block table
    cdef object _logits    # float32 (rows, n_vocab): step() output, grown on demand
    cdef object _hidden    # float32 (rows, n_embd): step()'s embd_rows output, grown on demand
    cdef readonly object hidden  # the last step's embd_rows hidden states (a view of _hidden)
    cdef rase_sampler_ref *_refs
    cdef int _n_refs

    def __cinit__(self):
        self._refs = NULL
        self._n_refs = 0

    def __init__(self, Weights weights, int n_blocks, int max_rows, int n_threads, int n_slots=1, str kv_type="f16",
                 bint kv_rotate=True):
        if n_blocks < 1 or max_rows < 1 or n_threads < 1 or n_slots < 1:
            raise ValueError("n_blocks, max_rows, n_threads and n_slots must be positive")
        kv_row_bytes(kv_type, weights.w.hp.head_dim)
        self.kv_type = kv_type
        self.weights = weights
        self.m.w = &weights.w
        self.m.kv = &self.kv
        self.m.s = &self.s
        self.m.isa = weights._isa
        if rase_kv_pool_alloc(&self.kv, &weights.w.hp, n_blocks, n_slots, KV_TYPES[kv_type], kv_rotate) != 0:
            raise MemoryError(f"cannot allocate a KV pool of {n_blocks} blocks and {n_slots} state slots")
        cdef rase_scratch_need need = rase_forward_needs(&weights.w)
        if rase_scratch_alloc(&self.s, &weights.w.hp, &need, max_rows, n_threads) != 0:
            raise MemoryError(f"cannot allocate scratch for {max_rows} rows")
        self._identity = _np.arange(n_blocks, dtype=_np.int32).reshape(1, -1)
        self._logits = _np.empty((0, weights.w.hp.n_vocab), dtype=_np.float32)
        self._hidden = _np.empty((0, weights.w.hp.n_embd), dtype=_np.float32)
        self.hidden = self._hidden

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
    def n_slots(self):
        return self.kv.n_slots

    def copy_state(self, int src, int dst):
        """Recurrent-state slot src copied to slot dst (a checkpoint taken or restored)."""
        if not self.kv.state_floats:
            raise ValueError("this model has no recurrent state")
        if not (0 <= src < self.kv.n_slots and 0 <= dst < self.kv.n_slots and src != dst):
            raise ValueError(f"slots {src} -> {dst} outside the {self.kv.n_slots} slots or equal")
        with nogil:
            rase_state_copy(&self.kv, src, dst)

    @property
    def logits_finite(self):
        """Whether every logit of the last run or step was finite (checked in the step, by the
        thread that computed it, while in its cache)."""
        return self.s.nonfinite == 0

    def copy_rows(self, int src, int dst, int n):
        """Positions [0, n) of pool block src copied to block dst (every attention layer, K and V)."""
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
        self._check_logits(n_out)
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
        cdef int32_t seq_len = pos0 + T, seq_first = -pos0  # a non-causal model: the sequence is [0, pos0 + T)
        cdef int32_t slot0 = 0  # the single sequence's recurrent state
        if not self.weights.w.hp.causal and pos0:
            raise ValueError("an encoder's input is evaluated whole, from position 0")
        b.rows, b.n, b.tables, b.table_stride = rows, T, &table[0, 0], table.shape[1]
        b.out_rows, b.n_out, b.logits = out_rows, n_out, &lv[0, 0]
        b.seq_len, b.seq_first, b.embd_rows, b.n_embd, b.embd = &seq_len, &seq_first, NULL, 0, NULL
        b.in_embd, b.in_row, b.key_end, b.rope_pos = NULL, NULL, NULL, NULL
        b.slots = &slot0
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
             list samplers=None, trace=None, embd_rows=None, slots=None, in_embd=None, in_row=None, key_end=None,
             rope_pos=None):
        """Evaluate rows (n, 3) of (token, seq, pos): row i's K/V go to position pos of
        sequence seq, whose block table is tables[seq]; it attends to that sequence's
        positions up to pos (the rows of one step may extend a sequence by several positions;
        an encoder's row: to all of them, and a sequence must then be whole in the step).
        Returns (tokens, logits): logits (n_out, n_vocab) of the out_rows, a view valid until
        the next step; tokens (n_out,) int32 sampled by samplers[j] from row j (-1: logits not
        finite; SAMPLE_NONE where samplers[j] is None: a row read, not sampled), or None without
        samplers. embd_rows (int32 indices of rows): their final
        hidden states (after the final norm when the model has one) in .hidden, (len, n_embd),
        a view valid until the next step. slots (n_seq,) int32, a model with recurrent layers:
        sequence s's state slot, read and updated in place by its rows (position 0 starts from
        zeros); distinct slots for distinct sequences. Forward and sampling run with the GIL
        released. in_embd (m, n_embd) float32 with in_row (n,) int32: row i with in_row[i] >= 0
        enters as in_embd[in_row[i]] (an image's row: its token is not read). key_end (n,) int32:
        row i attends to its sequence's keys < key_end[i] (a non-causal span: > pos, the span's
        rows all in this step) instead of <= pos. rope_pos (n, 4) int32, an M-RoPE model: each row's
        (t, h, w, e) positions, which its RoPE takes instead of its cell pos."""
        self._check_step(rows, tables, out_rows)
        cdef const float[:, ::1] iev
        cdef const int32_t[::1] irv, kev
        cdef const int32_t[:, ::1] rpv
        inputs = self._check_inputs(rows, tables, in_embd, in_row, key_end)
        rp = self._check_rope_pos(rope_pos, rows.shape[0])
        cdef const int32_t[::1] slv = self._check_slots(slots, tables.shape[0])
        cdef int n = rows.shape[0], n_out = out_rows.shape[0], j
        cdef int V = self.weights.w.hp.n_vocab
        cdef const int32_t[::1] ev, sv, fv
        seq_len, seq_first = self._seq_len(rows, tables.shape[0])
        sv, fv = seq_len, seq_first
        e = _np.zeros(0, _np.int32) if embd_rows is None else _np.ascontiguousarray(embd_rows, dtype=_np.int32)
        if e.ndim != 1 or (e.size and (e.min() < 0 or e.max() >= n)):
            raise ValueError(f"embd_rows must index the {n} rows")
        if self._hidden.shape[0] < e.size:
            self._hidden = _np.empty((max(e.size, 2 * self._hidden.shape[0]), self.weights.w.hp.n_embd), _np.float32)
        ev = e
        cdef float[:, ::1] hv = self._hidden
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
        b.seq_len, b.seq_first = &sv[0], &fv[0]
        b.embd_rows, b.n_embd = (&ev[0] if e.size else NULL), e.size
        b.embd = &hv[0, 0] if hv.shape[0] else NULL
        b.slots = &slv[0]
        b.in_embd, b.in_row, b.key_end, b.rope_pos = NULL, NULL, NULL, NULL
        if inputs[0] is not None:
            iev, irv = inputs[0], inputs[1]
            b.in_embd, b.in_row = &iev[0, 0], &irv[0]
        if inputs[2] is not None:
            kev = inputs[2]
            b.key_end = &kev[0]
        if rp is not None:
            rpv = rp
            b.rope_pos = &rpv[0, 0]
        self._set_trace(trace, n)
        with nogil:
            rase_step(&self.m, &b, refs, tp)
        self.m.trace = NULL
        self.hidden = self._hidden[:e.size]
        return tokens, self._logits[:n_out]

    def _check_inputs(self, rows, tables, in_embd, in_row, key_end):
        """(in_embd, in_row, key_end) checked: input rows of the model's width indexed by
        in_row (-1: the row's token); key ends past each row's position and inside the pool."""
        cdef int n = rows.shape[0]
        e = r = k = None
        if (in_embd is None) != (in_row is None):
            raise ValueError("in_embd and in_row come together")
        if in_embd is not None:
            e = _np.ascontiguousarray(in_embd, dtype=_np.float32)
            r = _np.ascontiguousarray(in_row, dtype=_np.int32)
            if e.ndim != 2 or e.shape[1] != self.weights.w.hp.n_embd or e.shape[0] < 1:
                raise ValueError(f"in_embd must be (m, {self.weights.w.hp.n_embd}) float32")
            if r.shape != (n,) or r.min() < -1 or r.max() >= e.shape[0]:
                raise ValueError(f"in_row must be ({n},) indices of in_embd rows or -1")
        if key_end is not None:
            k = _np.ascontiguousarray(key_end, dtype=_np.int32)
            pos = _np.asarray(rows)[:, 2]
            limit = min(self.weights.w.hp.n_ctx, _np.asarray(tables).shape[1] * RASE_KV_BLOCK)
            if not self.weights.w.hp.causal or k.shape != (n,) or _np.any(k <= pos) or k.max() > limit:
                raise ValueError("key_end must be (n,) ends past each row's position inside its block table "
                                 "(a decoder's rows)")
        return e, r, k

    def _check_rope_pos(self, rope_pos, int n):
        if rope_pos is None:
            return None
        if not self.weights.w.hp.rope_multi:
            raise ValueError("rope_pos: this model's RoPE takes one position per row")
        r = _np.ascontiguousarray(rope_pos, dtype=_np.int32)
        if r.shape != (n, 4) or r.min() < 0 or r.max() >= self.weights.w.hp.n_ctx:
            raise ValueError(f"rope_pos must be ({n}, 4) positions in 0..{self.weights.w.hp.n_ctx - 1}")
        return r

    def _check_slots(self, slots, int n_seq):
        """int32 (n_seq,): the step's state slots (zeros for a model without recurrent state)."""
        if not self.kv.state_floats:
            return _np.zeros(max(n_seq, 1), _np.int32)
        if slots is None:
            raise ValueError("a model with recurrent layers needs each sequence's state slot")
        s = _np.ascontiguousarray(slots, dtype=_np.int32)
        if s.shape != (n_seq,) or (s.size and (s.min() < 0 or s.max() >= self.kv.n_slots)) or \
                _np.unique(s).size != s.size:
            raise ValueError(f"slots must be {n_seq} distinct state slots of the {self.kv.n_slots}")
        return s

    def _seq_len(self, rows, int n_seq):
        """int32 (n_seq,) twice: positions each sequence spans in the step and its first row (an
        encoder's keys). An encoder's sequence must be whole in its step: rows first .. first +
        len - 1 holding positions 0 .. len - 1 in order."""
        out, first = _np.zeros(max(n_seq, 1), _np.int32), _np.zeros(max(n_seq, 1), _np.int32)
        if self.weights.w.hp.causal:  # not read: no work in a decoder's steps
            return out, first
        r = _np.asarray(rows)
        _np.maximum.at(out, r[:, 1], r[:, 2] + 1)
        idx = _np.arange(r.shape[0])
        first[r[::-1, 1]] = idx[::-1]  # each sequence's first row
        if _np.any(r[:, 2] != idx - first[r[:, 1]]) or _np.any(_np.bincount(r[:, 1], minlength=out.size) != out):
            raise ValueError("an encoder's input must be whole in its step: its rows in position order 0..n-1")
        return out, first

    cdef int _check_logits(self, int n_out) except -1:
        if n_out and self.weights.w.output.data == NULL:
            raise ValueError("this model has no LM head (an encoder): ask for hidden states, not logits")
        return 0

    cdef int _check_step(self, const int32_t[:, ::1] rows, const int32_t[:, ::1] tables,
                         const int32_t[::1] out_rows) except -1:
        cdef int n = rows.shape[0]
        self._check_logits(out_rows.shape[0])
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
        if not self.weights.w.hp.causal:  # an encoder's K/V never reach the pool: no block is read
            if pos.min() < 0 or pos.max() >= self.weights.w.hp.n_ctx:
                raise ValueError(f"position outside 0..{self.weights.w.hp.n_ctx - 1}")
            return 0
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
        if self.kv.state_floats:  # a recurrent layer reads the state position pos - 1 left
            order = _np.lexsort((pos, seq))
            ss, ps = seq[order], pos[order]
            if _np.any((ss[1:] == ss[:-1]) & (ps[1:] != ps[:-1] + 1)):
                raise ValueError("a recurrent model's sequence advances without gaps: its rows in a step are "
                                 "consecutive positions")
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
            if samplers[j] is None:
                memset(&self._refs[j], 0, sizeof(rase_sampler_ref))  # p NULL: the row is not sampled
            else:
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
        self._check_logits(1)
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
        cdef int32_t seq_len = pos + 1, slot0 = 0
        b.rows, b.n, b.tables, b.table_stride = &row, 1, &table[0, 0], table.shape[1]
        b.slots = &slot0
        b.out_rows, b.n_out, b.logits = &out_row, 1, &lv[0, 0]
        b.seq_len, b.embd_rows, b.n_embd, b.embd = &seq_len, NULL, 0, NULL
        b.in_embd, b.in_row, b.key_end, b.rope_pos = NULL, NULL, NULL, NULL
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
