# rase/kernels/_kernels_gguf.pxi: included by _kernels.pyx (one extension module). The GGUF reader's hot loop: string tables.

# ---------------------------------------------------------------- the GGUF reader's hot loop

from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memcpy, memset


def gguf_strings(const uint8_t[::1] buf, int64_t pos, int64_t count):
    """count GGUF strings (little-endian u64 length, then UTF-8 bytes) from buf[pos:]: (list of
    str, end offset). IndexError(i): string i runs past the end of buf; ValueError(i, reason):
    string i is not valid UTF-8. Vocabularies hold 50k-260k of them (rase.store.gguf)."""
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
