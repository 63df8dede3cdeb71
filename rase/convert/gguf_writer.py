"""A GGUF v3 file written front to back: header, metadata and tensor infos first (every tensor's
type and size is known before its data exists), then each tensor's bytes as they are made, so
nothing is held whole in memory. The SHA-256 of the file is computed from the bytes as written."""
from __future__ import annotations

import hashlib
import struct
from typing import BinaryIO

from ..store.gguf import DEFAULT_ALIGNMENT, MAGIC, MAX_NAME

T_U32, T_I32, T_F32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9


def _string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _scalar(value) -> tuple[int, bytes]:
    """(GGUF value type, bytes): bool, int (u32, as llama.cpp's converter writes counts and ids),
    float (f32), str."""
    if isinstance(value, bool):
        return T_BOOL, struct.pack("<?", value)
    if isinstance(value, int):
        return T_U32, struct.pack("<I", value)
    if isinstance(value, float):
        return T_F32, struct.pack("<f", value)
    if isinstance(value, str):
        return T_STRING, _string(value)
    raise TypeError(f"no GGUF type for {value!r}")


_ARRAY_OF = {bool: (T_BOOL, "<?"), int: (T_I32, "<i"), float: (T_F32, "<f")}  # token types are i32


def _value(value) -> tuple[int, bytes]:
    if not isinstance(value, list):
        return _scalar(value)
    kind = type(value[0]) if value else str
    head = struct.pack("<I", T_STRING if kind is str else _ARRAY_OF[kind][0]) + struct.pack("<Q", len(value))
    if kind is str:
        return T_ARRAY, head + b"".join(_string(s) for s in value)
    return T_ARRAY, head + struct.pack(f"<{len(value)}{_ARRAY_OF[kind][1][1]}", *value)


class GGUFStreamWriter:
    """tensors: [(name, ne (ggml order: columns first), ggml type, nbytes)], in file order; then
    write() each tensor's bytes in that order, end_tensor() after each, and finish()."""

    def __init__(self, fh: BinaryIO, metadata: dict, tensors: list[tuple[str, tuple[int, ...], int, int]]) -> None:
        self.fh, self.sha = fh, hashlib.sha256()
        self.sizes, self.written, self.index, self.pos = [t[3] for t in tensors], 0, 0, 0
        out = [MAGIC, struct.pack("<IQQ", 3, len(tensors), len(metadata))]
        for key, value in metadata.items():
            kind, body = _value(value)
            out += [_string(key), struct.pack("<I", kind), body]
        offset = 0
        for name, ne, ggml_type, nbytes in tensors:
            if len(name.encode()) >= MAX_NAME:
                raise ValueError(f"tensor name {name!r} is longer than ggml allows")
            out += [_string(name), struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, ggml_type, offset)]
            offset += nbytes + (-nbytes % DEFAULT_ALIGNMENT)
        self._put(b"".join(out))
        self._pad()

    def _put(self, data) -> None:
        self.fh.write(data)
        self.sha.update(data)
        self.pos += len(data) if isinstance(data, bytes) else data.nbytes

    def _pad(self) -> None:
        self._put(b"\0" * (-self.pos % DEFAULT_ALIGNMENT))

    def write(self, data) -> None:
        """The next bytes of the current tensor (bytes or a contiguous numpy array)."""
        self._put(data)
        self.written += len(data) if isinstance(data, bytes) else data.nbytes

    def end_tensor(self) -> None:
        if self.written != self.sizes[self.index]:
            raise RuntimeError(f"tensor {self.index}: {self.written} bytes written, {self.sizes[self.index]} declared")
        self.index, self.written = self.index + 1, 0
        self._pad()

    def finish(self) -> str:
        if self.index != len(self.sizes):
            raise RuntimeError(f"{len(self.sizes) - self.index} tensors were not written")
        self.fh.flush()
        return self.sha.hexdigest()
