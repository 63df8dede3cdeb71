# rase/kernels/_kernels_bench.pxi: included by _kernels.pyx (one extension module). Kernel benchmarks (rase/kernels/_bench.h): read bandwidth and timed matmuls.

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
        cdef int blck = rase_traits(qtype).blck, size = rase_traits(qtype).size
        self.act = rase_traits(qtype).act
        cdef int kblk = 256 if self.act == ACT_Q8_K else blck
        if cols == 0 or cols % kblk or w.shape[0] < 1 or w.shape[1] != (cols // blck) * size:
            raise ValueError(f"w (rows, {(cols // blck) * size}) for cols a multiple of {kblk} required")
        if rase_traits(qtype).dotn[0] == NULL and not rase_traits(qtype).r16_blk:
            raise ValueError(f"ggml type {qtype} has no matmul kernel")
        self.path = rase_isa if isa is None else _isa_id(isa)
        self.w = w
        self.mat.data, self.mat.type, self.mat.rows, self.mat.cols = &w[0, 0], qtype, w.shape[0], cols
        self.mat.row_bytes, self.mat.layout, self.mat.packed, self.mat.group_bytes = w.shape[1], 0, NULL, 0
        cdef const uint8_t[::1] pv
        if rase_traits(qtype).r16_blk:
            self.packed = repack(qtype, w, cols, n_threads)
            pv = self.packed
            self.mat.layout, self.mat.packed = RASE_LAYOUT_R16, &pv[0]
            self.mat.group_bytes = (cols // 32) * rase_traits(qtype).r16_blk

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
        cdef size_t row = rase_act_row_stride(act, n)
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
