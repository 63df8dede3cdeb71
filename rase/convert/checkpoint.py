"""A Hugging Face checkpoint folder: config.json and .safetensors shards, read one tensor (or a
band of its rows) at a time with pread, so memory holds a few bands, never the model.

safetensors: an 8-byte little-endian header length, a JSON header {name: {dtype, shape,
data_offsets: [begin, end)}} (offsets from the end of the header), then the raw little-endian
data. Pickle checkpoints (.bin, .pt, ...) are refused unread: loading one runs code from the file.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CorruptModelFile, UnsafeCheckpoint, UnsupportedFormat
from ..store.sources import sha256_file

# safetensors dtype -> (ggml type id, bytes per value); what a GGUF tensor can be converted from
DTYPES = {"F32": (0, 4), "F16": (1, 2), "BF16": (30, 2)}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header
TO_SAFETENSORS = (
    "python -c \"from transformers import AutoModelForCausalLM as M; "
    "M.from_pretrained('{src}').save_pretrained('{src}-safetensors', safe_serialization=True)\"")


@dataclass(frozen=True)
class SourceTensor:
    name: str
    dtype: str                 # a DTYPES key
    shape: tuple[int, ...]     # PyTorch order: rows last-but-one, columns last
    path: Path
    offset: int                # absolute byte offset of the data in path
    nbytes: int

    @property
    def ggml_type(self) -> int:
        return DTYPES[self.dtype][0]

    @property
    def row_bytes(self) -> int:
        return (self.shape[-1] if self.shape else 1) * DTYPES[self.dtype][1]


def _pickle_refusal(folder: Path, files: list[Path]) -> UnsafeCheckpoint:
    names = ", ".join(f.name for f in files)
    return UnsafeCheckpoint(
        f"{folder} holds pickle weights ({names}) and no .safetensors: loading a pickle runs code from the "
        f"file, so rase does not open it. Where you trust the file, convert it to safetensors with "
        f"transformers, then convert that folder: {TO_SAFETENSORS.format(src=folder)}")


def _header(path: Path) -> dict[str, SourceTensor]:
    size = path.stat().st_size
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise CorruptModelFile(str(path), "shorter than a safetensors header", 0)
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER or 8 + n > size:
            raise CorruptModelFile(str(path), f"safetensors header length {n} does not fit the file", 0)
        try:
            header = json.loads(fh.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptModelFile(str(path), f"safetensors header is not JSON ({exc})", 8) from None
    if not isinstance(header, dict):
        raise CorruptModelFile(str(path), "safetensors header is not a JSON object", 8)
    header.pop("__metadata__", None)
    base, out = 8 + n, {}
    for name, info in header.items():
        out[name] = _entry(path, name, info, base, size)
    return out


def _entry(path: Path, name: str, info, base: int, size: int) -> SourceTensor:
    try:
        dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        ok = all(isinstance(d, int) and d >= 0 for d in (*shape, begin, end)) and begin <= end
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise CorruptModelFile(str(path), f"tensor {name!r} has a malformed header entry {info!r}", 8)
    if dtype not in DTYPES:
        raise UnsupportedFormat(
            f"tensor {name!r} in {path.name} is {dtype}; rase converts F32, F16 and BF16 weights. Dequantize the "
            f"checkpoint to BF16 first (a quantized or FP8 checkpoint is not a source llama.cpp converts either)")
    nbytes = math.prod(shape) * DTYPES[dtype][1]
    if end - begin != nbytes or base + end > size:
        raise CorruptModelFile(str(path), f"tensor {name!r}: {end - begin} bytes at {base + begin} for shape {shape} "
                               f"{dtype} (the file has {size})", base + begin)
    return SourceTensor(name, dtype, shape, path, base + begin, nbytes)


class Checkpoint:
    """config (config.json), tensors {name: SourceTensor} over every shard, files (the folder's
    files that go into the GGUF: shards, config, tokenizer files)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder).expanduser()
        if not self.folder.is_dir():
            raise UnsupportedFormat(f"{self.folder} is not a folder; rase model convert takes a Hugging Face "
                                    "checkpoint folder (config.json, *.safetensors, tokenizer.json)")
        shards = self._shards()
        if not shards:
            pickles = sorted(f for f in self.folder.iterdir() if f.suffix.lower() in PICKLE_SUFFIXES)
            if pickles:
                raise _pickle_refusal(self.folder, pickles)
            raise UnsupportedFormat(f"{self.folder} has no .safetensors weights")
        config = self.folder / "config.json"
        if not config.is_file():
            raise UnsupportedFormat(f"{self.folder} has no config.json; it is needed to know the architecture")
        try:
            self.config = json.loads(config.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UnsupportedFormat(f"{config} is not valid JSON ({exc})") from None
        if not isinstance(self.config, dict):
            raise UnsupportedFormat(f"{config} is not a JSON object")
        self.tensors: dict[str, SourceTensor] = {}
        for shard in shards:
            for name, t in _header(shard).items():
                if name in self.tensors:
                    raise CorruptModelFile(str(shard), f"tensor {name!r} is also in {self.tensors[name].path.name}")
                self.tensors[name] = t
        self._fds: dict[Path, int] = {}
        self._hashes: dict[Path, _ShardHash] = {}
        extra = [self.folder / n for n in ("config.json", "tokenizer.json", "tokenizer_config.json",
                                           "generation_config.json")]
        self.files = shards + [f for f in extra if f.is_file()]

    def _shards(self) -> list[Path]:
        """The index's shards when there is one (Mistral repos also hold consolidated.safetensors,
        the same weights under other names), else every .safetensors file."""
        index = self.folder / "model.safetensors.index.json"
        if not index.is_file():
            return sorted(self.folder.glob("*.safetensors"))
        try:
            names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise UnsupportedFormat(f"{index} is not a safetensors index ({exc!r})") from None
        shards = [self.folder / n for n in names]
        missing = [n for n, p in zip(names, shards) if "/" in n or not p.is_file()]
        if missing:
            raise UnsupportedFormat(f"{index} names shards that are not in the folder: {', '.join(missing)}")
        return shards

    def read(self, t: SourceTensor, row0: int = 0, row1: int | None = None) -> np.ndarray:
        """Rows [row0, row1) of t (all leading dimensions flattened), as its raw bytes (uint8); the
        bytes also go into their shard's hash."""
        rows = t.nbytes // t.row_bytes if t.row_bytes else 0
        row1 = rows if row1 is None else row1
        n, offset = (row1 - row0) * t.row_bytes, t.offset + row0 * t.row_bytes
        buf = np.empty(n, np.uint8)
        fd = self._fd(t.path)
        got = os.preadv(fd, [memoryview(buf)], offset) if n else 0
        if got != n:
            raise CorruptModelFile(str(t.path), f"tensor {t.name!r} ends early", offset + got)
        self._hashes[t.path].feed(fd, offset, buf)
        return buf

    def _fd(self, path: Path) -> int:
        if path not in self._fds:
            self._fds[path] = os.open(path, os.O_RDONLY)
            self._hashes[path] = _ShardHash(path)
        return self._fds[path]

    def file_hashes(self) -> dict[str, str]:
        """{file name: SHA-256} of self.files: shards from the bytes read (the rest read now)."""
        out = {}
        for f in self.files:
            h = self._hashes.get(f)
            out[f.name] = h.digest(self._fds[f]) if h is not None else sha256_file(f)
        return out

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class _ShardHash:
    """A shard's SHA-256, fed by the conversion's own reads while they come in file order (a gap,
    like the header, is read to fill it); reads out of order hash the shard anew at the end."""

    def __init__(self, path: Path) -> None:
        self.path, self.sha, self.pos, self.in_order = path, hashlib.sha256(), 0, True

    def feed(self, fd: int, offset: int, data: np.ndarray) -> None:
        if not self.in_order or offset < self.pos:
            self.in_order = False
            return
        self._fill(fd, offset)
        self.sha.update(data)
        self.pos = offset + data.nbytes

    def _fill(self, fd: int, end: int) -> None:
        while self.pos < end:
            chunk = os.pread(fd, min(end - self.pos, 8 << 20), self.pos)
            if not chunk:
                raise CorruptModelFile(str(self.path), "ends early", self.pos)
            self.sha.update(chunk)
            self.pos += len(chunk)

    def digest(self, fd: int) -> str:
        if not self.in_order:
            return sha256_file(self.path)
        self._fill(fd, os.fstat(fd).st_size)
        return self.sha.hexdigest()
