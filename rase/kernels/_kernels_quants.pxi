# rase/kernels/_kernels_quants.pxi: included by _kernels.pyx (one extension module). Dequantization, repacking and the per-type dots and matmuls (rase/kernels/_quants.h, _dot.h, _repack*.h).

# ---------------------------------------------------------------- dequantization

cdef int _check_type(int qtype) except -1:
    if qtype < 0 or qtype >= RASE_GGML_TYPE_COUNT or rase_traits(qtype).name == NULL:
        raise ValueError(f"ggml type {qtype} has no kernels in rase")
    return 0


def dequantize_into(int qtype, const uint8_t[::1] src, float[::1] dst, isa=None):
    """dst[0..n) = the n = len(dst) values stored in src; n a multiple of the type's block size.

    src: (n / blck * size,) bytes of consecutive blocks. isa: name of the path (default: current).
    """
    _check_type(qtype)
    cdef int64_t n = dst.shape[0]
    cdef int blck = rase_traits(qtype).blck, size = rase_traits(qtype).size
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
    return [t for t in range(RASE_GGML_TYPE_COUNT) if rase_traits(t).r16_blk]


def block_sum_types():
    """ggml type ids whose kernels have block-sum numerics (_repack_bs.h) instead of llama.cpp's
    one-token order: a model with any of them matches llama.cpp within tolerance, not bit for bit."""
    return [t for t in range(RASE_GGML_TYPE_COUNT) if rase_traits(t).block_sum]


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
    if not rase_traits(qtype).r16_blk:
        raise ValueError(f"ggml type {qtype} is not repacked")
    cdef int64_t rows = w.shape[0], g0, g1, groups
    if rows < 1 or cols % 32 or w.shape[1] != (cols // rase_traits(qtype).blck) * rase_traits(qtype).size:
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


def unpack_row(int qtype, const uint8_t[::1] packed, int64_t rows, int64_t cols, int64_t row):
    """Row `row` of a repack()ed (rows x cols) matrix as ggml's plain row bytes: how the tied
    token embedding is looked up from the output's repacked copy."""
    _check_type(qtype)
    if not rase_traits(qtype).r16_blk or cols % (256 if rase_traits(qtype).act == ACT_Q8_K else 32) or cols <= 0:
        raise ValueError(f"ggml type {qtype} with {cols} columns is not repacked")
    if packed.shape[0] != rase_r16_bytes(qtype, rows, cols) or not 0 <= row < rows:
        raise ValueError("packed must be repack()'s output for (rows, cols), and 0 <= row < rows")
    out = _np.empty((cols // rase_traits(qtype).blck) * rase_traits(qtype).size, _np.uint8)
    cdef uint8_t[::1] o = out
    cdef int64_t group = (cols // 32) * rase_traits(qtype).r16_blk
    with nogil:
        rase_r16_unpack_row(qtype, &packed[0], group, cols, row, &o[0])
    return out


def matmul(int qtype, const uint8_t[:, ::1] w, const float[:, ::1] x, isa=None):
    """x (T, cols) times the (rows x cols) matrix w of type qtype (rows of ggml blocks) as the
    forward computes it: activations quantized per row, then the type's kernel (repacked 16-row
    groups, or row by row), tiles of up to RASE_NT tokens. Returns (T, rows) float32."""
    _check_type(qtype)
    cdef int64_t rows = w.shape[0], n = x.shape[1], t0, g
    cdef int T = x.shape[0], nt, act = rase_traits(qtype).act, nr
    cdef int blck = rase_traits(qtype).blck, size = rase_traits(qtype).size
    cdef int kblk = 256 if act == ACT_Q8_K else blck
    if n == 0 or n % kblk or T < 1 or rows < 1 or w.shape[1] != (n // blck) * size:
        raise ValueError(f"w (rows, {(n // blck) * size}) and x (T, n) with n a multiple of {kblk} required")
    cdef int path = rase_isa if isa is None else _isa_id(isa)
    cdef size_t row = rase_act_row_stride(act, n)
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
    if rase_traits(qtype).r16_blk:
        packed = repack(qtype, w, n)
        pv = packed
        group = (n // 32) * rase_traits(qtype).r16_blk
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
    cdef int blck = rase_traits(qtype).blck, size = rase_traits(qtype).size
    cdef int act = rase_traits(qtype).act
    cdef int kblk = 256 if act == ACT_Q8_K else blck
    if n == 0 or n % kblk:
        raise ValueError(f"row length {n} must be a positive multiple of {kblk}")
    if not 1 <= nt <= RASE_NT:
        raise ValueError(f"1..{RASE_NT} activation rows, got {nt}")
    if w.shape[0] != (n // blck) * size:
        raise ValueError(f"{n} elements need {(n // blck) * size} bytes, got {w.shape[0]}")
    if rase_traits(qtype).r16_blk:  # one row of a repacked type: a group of 1
        return [float(v) for v in matmul(qtype, _np.asarray(w).reshape(1, -1), x, isa)[:, 0]]
    cdef int path = rase_isa if isa is None else _isa_id(isa)
    cdef size_t row = rase_act_row_stride(act, n)
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


# ---------------------------------------------------------------- weight quantization (_quantize.h)

def can_quantize(int qtype):
    """True if rase writes ggml type qtype (llama.cpp's reference quantizer, byte for byte)."""
    return 0 <= qtype < RASE_GGML_TYPE_COUNT and rase_quantize_for(qtype, 0) != NULL


def quantize_rows(int dst_type, const uint8_t[::1] src, int src_type, int64_t ncols, uint8_t[::1] dst,
                  int n_threads=1, isa=None):
    """dst = src's rows as dst_type blocks, as llama.cpp's quantizer writes them without an imatrix.

    src: nrows * ncols values of src_type (F32, F16 or BF16), as bytes; dst: nrows rows of
    ncols / blck * size bytes. Rows are split over n_threads; the bytes depend on neither it nor
    isa (the path's name, default: the current one).
    """
    if not can_quantize(dst_type):
        raise ValueError(f"ggml type {dst_type} has no quantizer in rase")
    if src_type not in (0, 1, 30):  # F32, F16, BF16
        raise ValueError(f"source type {src_type} is not F32, F16 or BF16")
    cdef int blck = rase_traits(dst_type).blck, size = rase_traits(dst_type).size
    if ncols <= 0 or ncols % blck:
        raise ValueError(f"{ncols} columns is not a positive multiple of the block size {blck}")
    cdef size_t src_row = ncols * (4 if src_type == 0 else 2)
    cdef size_t row_bytes = (ncols // blck) * size
    if <size_t>src.shape[0] % src_row:
        raise ValueError(f"{src.shape[0]} source bytes is not a whole number of {src_row}-byte rows")
    cdef int64_t nrows = <size_t>src.shape[0] // src_row
    if <size_t>dst.shape[0] != nrows * row_bytes:
        raise ValueError(f"{nrows} rows need {nrows * row_bytes} bytes of output, got {dst.shape[0]}")
    if nrows == 0:
        return
    n_threads = max(1, min(n_threads, nrows))
    cdef rase_quantize_fn q = rase_quantize_for(dst_type, rase_isa if isa is None else _isa_id(isa))
    cdef float *scratch = <float *>malloc(n_threads * ncols * sizeof(float))
    if scratch == NULL:
        raise MemoryError()
    with nogil:
        rase_quantize_rows(q, &src[0], src_type, src_row, nrows, ncols, &dst[0], row_bytes, scratch, n_threads)
    free(scratch)
