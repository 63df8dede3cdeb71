"""GGUF v2/v3 reader: memory-mapped, validated eagerly, zero-copy tensor views.

Every malformed input raises CorruptModelFile (naming what and the byte offset) or
UnsupportedFormat; no count or length read from the file is trusted before it is checked
against the bytes that remain, so a hostile file cannot make this allocate unbounded memory.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import CorruptModelFile, ModelFileNotFound, UnsupportedFormat
from ..kernels._kernels import gguf_strings
from ..kernels.quants import KNOWN_UNSUPPORTED, QUANT_BLOCKS, QuantType

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 64  # GGML_MAX_NAME, including the terminating NUL

# GGUF metadata value types: id -> (name, struct format or None for string/array)
T_STRING, T_ARRAY = 8, 9
VALUE_TYPES: dict[int, tuple[str, str | None]] = {
    0: ("UINT8", "<B"), 1: ("INT8", "<b"), 2: ("UINT16", "<H"), 3: ("INT16", "<h"),
    4: ("UINT32", "<I"), 5: ("INT32", "<i"), 6: ("FLOAT32", "<f"), 7: ("BOOL", "<?"),
    8: ("STRING", None), 9: ("ARRAY", None), 10: ("UINT64", "<Q"), 11: ("INT64", "<q"),
    12: ("FLOAT64", "<d"),
}
_NUMPY_OF = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
             10: "<u8", 11: "<i8", 12: "<f8"}

# (block size, bytes per block) of ggml types rase parses but has no kernels for (so that
# inspect can read any file); the executable ones come from quants.QUANT_BLOCKS.
_OTHER_BLOCKS: dict[int, tuple[int, int]] = {
    9: (32, 36), 15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50),
    20: (32, 18), 21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2),
    26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 34: (256, 54), 35: (256, 66),
}


def type_block(ggml_type: int) -> tuple[int, int] | None:
    """(block size, bytes per block) of any ggml type, or None if the id is not a ggml type."""
    if ggml_type in QuantType._value2member_map_:
        return tuple(QUANT_BLOCKS[QuantType(ggml_type)])
    return _OTHER_BLOCKS.get(ggml_type)


def type_name(ggml_type: int) -> str:
    if ggml_type in QuantType._value2member_map_:
        return QuantType(ggml_type).name
    return KNOWN_UNSUPPORTED.get(ggml_type, f"type#{ggml_type}").split(" ")[0]


MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux's value; Python may not name it


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the contiguous (row) dimension
    ggml_type: int
    offset: int  # absolute byte offset in the file
    nbytes: int
    data: np.ndarray = field(repr=False)  # (nbytes,) uint8, read-only view of the mmap

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy order: (..., rows, row length)."""
        return tuple(reversed(self.ne))

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.ne, dtype=np.int64)) if self.ne else 1

    @property
    def type_name(self) -> str:
        return type_name(self.ggml_type)

    @property
    def qtype(self) -> QuantType | None:
        return QuantType(self.ggml_type) if self.ggml_type in QuantType._value2member_map_ else None


class _Cursor:
    """Bounds-checked little-endian reads over a buffer; every failure names the offset."""

    def __init__(self, buf: memoryview, path: str) -> None:
        self.buf, self.path, self.pos, self.end = buf, path, 0, len(buf)

    def fail(self, what: str, offset: int | None = None) -> CorruptModelFile:
        return CorruptModelFile(self.path, what, self.pos if offset is None else offset)

    def need(self, n: int, what: str) -> None:
        if n < 0 or n > self.end - self.pos:
            raise self.fail(f"truncated: {what} needs {n} bytes, {self.end - self.pos} remain")

    def scalar(self, fmt: str, what: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def u32(self, what: str) -> int:
        return self.scalar("<I", what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", what)

    def string(self, what: str) -> str:
        start = self.pos
        n = self.u64(f"length of {what}")
        self.need(n, f"{what} ({n} bytes)")
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not valid UTF-8 ({exc.reason})", start) from None


class GGUFFile:
    """A parsed GGUF file. Tensor data stays in the mmap; `tensors[name].data` is a view.

    Use `GGUFFile(path)` for files, `GGUFFile.from_buffer(data)` for bytes already in memory.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        try:
            with open(self.path, "rb") as fh:
                st = os.fstat(fh.fileno())
                if st.st_size == 0:
                    raise CorruptModelFile(self.path, "the file is empty", 0)
                self._mmap: mmap.mmap | None = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
                self._identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            raise ModelFileNotFound(f"model file does not exist: {self.path}") from None
        except IsADirectoryError:
            raise ModelFileNotFound(f"expected a GGUF file, got a directory: {self.path}") from None
        self._parse(memoryview(self._mmap), np.frombuffer(self._mmap, dtype=np.uint8))

    @classmethod
    def from_buffer(cls, data: bytes | bytearray | memoryview, name: str = "<buffer>") -> "GGUFFile":
        self = cls.__new__(cls)
        self.path, self._mmap, self._identity = name, None, None
        view = memoryview(data).cast("B")
        if len(view) == 0:
            raise CorruptModelFile(name, "the file is empty", 0)
        self._parse(view, np.frombuffer(view, dtype=np.uint8))
        return self

    # ------------------------------------------------------------------ parsing

    def _parse(self, buf: memoryview, array: np.ndarray) -> None:
        cur = _Cursor(buf, self.path)
        self.file_size = len(buf)
        self._parse_header(cur)
        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, int | tuple[int, int]] = {}
        for i in range(self._n_kv):
            self._parse_kv(cur, i)
        self.alignment = self._alignment(cur)
        infos = [self._parse_tensor_info(cur, i) for i in range(self._n_tensors)]
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, ne, gtype, rel, nbytes, at in infos:
            if name in self.tensors:
                raise cur.fail(f"duplicate tensor name {name!r}", at)
            self.tensors[name] = self._tensor(cur, array, name, ne, gtype, rel, nbytes, at)
        self._check_overlap(cur)

    def _parse_header(self, cur: _Cursor) -> None:
        cur.need(4, "magic")
        magic = bytes(cur.buf[0:4])
        if magic != MAGIC:
            raise UnsupportedFormat(
                f"{self.path} is not a GGUF file (magic {magic!r}, expected b'GGUF'); "
                "convert the model to GGUF with llama.cpp's convert_hf_to_gguf.py"
            )
        cur.pos = 4
        self.version = cur.u32("version")
        if self.version not in SUPPORTED_VERSIONS:
            hint = ("it looks big-endian, which rase does not read"
                    if self.version & 0xFFFF == 0 else "re-convert it with a current llama.cpp")
            raise UnsupportedFormat(
                f"{self.path}: GGUF version {self.version} is not supported (expected 2 or 3); {hint}"
            )
        self._n_tensors = cur.u64("tensor count")
        self._n_kv = cur.u64("metadata count")
        remain = cur.end - cur.pos
        if self._n_kv > remain // 13:  # a key/value pair takes at least 13 bytes
            raise cur.fail(f"absurd metadata count {self._n_kv} for a {self.file_size}-byte file", 16)
        if self._n_tensors > remain // 32:  # a tensor info takes at least 32 bytes
            raise cur.fail(f"absurd tensor count {self._n_tensors} for a {self.file_size}-byte file", 8)

    def _parse_kv(self, cur: _Cursor, index: int) -> None:
        at = cur.pos
        key = cur.string(f"metadata key #{index}")
        if not key:
            raise cur.fail(f"metadata key #{index} is empty", at)
        if key in self.metadata:
            raise cur.fail(f"duplicate metadata key {key!r}", at)
        vtype = cur.u32(f"value type of {key!r}")
        if vtype == T_ARRAY:
            value, vtypes = self._parse_array(cur, key)
        else:
            value, vtypes = self._parse_value(cur, key, vtype), vtype
        self.metadata[key], self.metadata_types[key] = value, vtypes

    def _parse_value(self, cur: _Cursor, key: str, vtype: int) -> Any:
        if vtype not in VALUE_TYPES or vtype == T_ARRAY:
            raise cur.fail(f"unknown value type {vtype} for {key!r}", cur.pos - 4)
        if vtype == T_STRING:
            return cur.string(f"value of {key!r}")
        return cur.scalar(VALUE_TYPES[vtype][1], f"value of {key!r}")

    def _parse_array(self, cur: _Cursor, key: str) -> tuple[Any, tuple[int, int]]:
        at = cur.pos
        itype = cur.u32(f"array item type of {key!r}")
        count = cur.u64(f"array length of {key!r}")
        if itype not in VALUE_TYPES or itype == T_ARRAY:
            raise cur.fail(f"unsupported array item type {itype} for {key!r}", at)
        if itype == T_STRING:
            cur.need(count * 8, f"{count} strings of {key!r}")  # each string has an 8-byte length
            return self._parse_strings(cur, key, count), (T_ARRAY, itype)
        dtype = np.dtype(_NUMPY_OF[itype])
        cur.need(count * dtype.itemsize, f"{count} items of {key!r}")
        arr = np.frombuffer(cur.buf, dtype=dtype, count=count, offset=cur.pos).copy()
        cur.pos += count * dtype.itemsize
        return (arr.astype(bool) if itype == 7 else arr), (T_ARRAY, itype)

    @staticmethod
    def _parse_strings(cur: _Cursor, key: str, count: int) -> list[str]:
        # hot for vocabularies (262k strings): a compiled loop, the checks of _Cursor.string
        try:
            out, cur.pos = gguf_strings(cur.buf, cur.pos, count)
        except IndexError as exc:
            raise cur.fail(f"truncated: {key!r}[{exc.args[0]}] runs past the end of the file") from None
        except ValueError as exc:
            raise cur.fail(f"{key!r}[{exc.args[0]}] is not valid UTF-8 ({exc.args[1]})") from None
        return out

    def _alignment(self, cur: _Cursor) -> int:
        align = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if self.metadata_types.get("general.alignment", 4) != 4 or not isinstance(align, int) \
                or align <= 0 or align & (align - 1):
            raise cur.fail(f"general.alignment must be a power-of-two u32, got {align!r}", None)
        return align

    def _parse_tensor_info(self, cur: _Cursor, index: int) -> tuple:
        at = cur.pos
        name = cur.string(f"name of tensor #{index}")
        if len(name.encode()) >= MAX_NAME:
            raise cur.fail(f"tensor name {name[:80]!r} is longer than {MAX_NAME - 1} bytes", at)
        n_dims = cur.u32(f"dimension count of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cur.fail(f"tensor {name!r} has {n_dims} dimensions (1..{MAX_DIMS} allowed)", cur.pos - 4)
        ne = tuple(cur.u64(f"dimension {d} of {name!r}") for d in range(n_dims))
        gtype = cur.u32(f"type of {name!r}")
        rel = cur.u64(f"data offset of {name!r}")
        block = type_block(gtype)
        if block is None:
            raise cur.fail(f"tensor {name!r} has unknown ggml type {gtype}", cur.pos - 12)
        n_elements = 1
        for d in ne:
            n_elements *= d
        if not all(1 <= d < 1 << 60 for d in ne) or n_elements >= 1 << 60:  # (0 would hide a huge other dim)
            raise cur.fail(f"tensor {name!r} has absurd shape {ne}", at)
        if ne[0] % block[0]:
            raise cur.fail(
                f"tensor {name!r} row length {ne[0]} is not a multiple of the "
                f"{type_name(gtype)} block size {block[0]}", at)
        return name, ne, gtype, rel, n_elements // block[0] * block[1], at

    def _tensor(self, cur: _Cursor, array: np.ndarray, name: str, ne: tuple[int, ...],
                gtype: int, rel: int, nbytes: int, at: int) -> TensorInfo:
        if rel % self.alignment:
            raise cur.fail(f"tensor {name!r} data offset {rel} is not {self.alignment}-byte aligned", at)
        start = self.data_offset + rel
        if start + nbytes > self.file_size:
            raise cur.fail(
                f"tensor {name!r} data [{start}, {start + nbytes}) runs past the end of the "
                f"file ({self.file_size} bytes)", at)
        view = array[start:start + nbytes]
        view.flags.writeable = False
        return TensorInfo(name, ne, gtype, start, nbytes, view)

    def _check_overlap(self, cur: _Cursor) -> None:
        spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in self.tensors.values())
        for (s0, e0, n0), (s1, _e1, n1) in zip(spans, spans[1:]):
            if s1 < e0:
                raise cur.fail(f"tensors {n0!r} and {n1!r} overlap", s1)

    # ------------------------------------------------------------------ access

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """Metadata `<architecture>.<suffix>`, e.g. arch_get("context_length")."""
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise CorruptModelFile(self.path, f"required tensor {name!r} is missing") from None

    def value_type_name(self, key: str) -> str:
        t = self.metadata_types[key]
        if isinstance(t, tuple):
            return f"ARRAY[{VALUE_TYPES[t[1]][0]}]"
        return VALUE_TYPES[t][0]

    def _page_range(self, tensor: "TensorInfo", start: int, end: int | None, inner: bool) -> tuple[int, int]:
        page = mmap.PAGESIZE
        lo = tensor.offset + max(0, start)
        hi = tensor.offset + (tensor.nbytes if end is None else min(end, tensor.nbytes))
        if inner:
            return -(-lo // page) * page, hi // page * page
        return lo // page * page, -(-hi // page) * page

    def populate(self, tensor: "TensorInfo", start: int = 0, end: int | None = None) -> None:
        """Map bytes [start, end) of a tensor's data in one call (MADV_POPULATE_READ, Linux >=
        5.14) before reading all of it: ~10x faster than a page fault per page. A no-op where
        the kernel does not have it."""
        if self._mmap is None or not hasattr(self._mmap, "madvise"):
            return
        lo, hi = self._page_range(tensor, start, end, inner=False)
        try:
            self._mmap.madvise(MADV_POPULATE_READ, lo, min(hi, len(self._mmap)) - lo)
        except OSError:
            pass

    def copy(self, tensor: "TensorInfo") -> np.ndarray:
        """A private copy of a tensor's bytes, (nbytes,) uint8, read through a file descriptor
        (pread) rather than the mmap: a fault in the mmap maps the whole page-cache folio around
        it (up to 2 MiB on Linux 6.18 for a file just written or read ahead), so reading small
        vectors through it mapped the weights around them too (~60 MB of SmolLM2's repacked
        tensors counted in RSS after a fresh download). Falls back to the mmap if the path no
        longer names the mapped file."""
        out = np.empty(tensor.nbytes, np.uint8)
        if self._identity is not None:
            try:
                fd = os.open(self.path, os.O_RDONLY)
                try:
                    st = os.fstat(fd)
                    if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == self._identity:
                        view, done = memoryview(out), 0
                        while done < tensor.nbytes:
                            n = os.preadv(fd, [view[done:]], tensor.offset + done)
                            if n <= 0:
                                break
                            done += n
                        if done == tensor.nbytes:
                            return out
                finally:
                    os.close(fd)
            except OSError:
                pass
        out[:] = tensor.data
        return out

    def release(self, tensor: "TensorInfo", start: int = 0, end: int | None = None) -> None:
        """Give bytes [start, end) of a tensor's data back to the OS (MADV_DONTNEED on the
        whole pages inside): for data copied elsewhere at load. It stays readable; a later
        access reads it from the file again."""
        if self._mmap is None or not hasattr(self._mmap, "madvise"):
            return
        lo, hi = self._page_range(tensor, start, end, inner=True)
        if hi > lo:
            self._mmap.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def close(self) -> None:
        """Drop the mapping; views handed out earlier keep it alive until they are freed."""
        self.tensors = {}
        self._mmap = None

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GGUFFile({self.path!r}, v{self.version}, arch={self.architecture!r}, "
                f"{len(self.tensors)} tensors, {len(self.metadata)} keys)")
