"""A byte-level GGUF builder for tests: writes exactly what it is told, including bad files."""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

TYPE_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}


def gguf_string(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def gguf_value(vtype: int, value) -> bytes:
    if vtype == 8:
        return gguf_string(value)
    if vtype == 9:
        itype, items = value
        body = b"".join(gguf_value(itype, v) for v in items)
        return struct.pack("<IQ", itype, len(items)) + body
    if vtype not in TYPE_FMT:  # an invalid type id: write nothing after it
        return b""
    return struct.pack(TYPE_FMT[vtype], value)


@dataclass
class Tensor:
    name: str
    ne: tuple[int, ...]
    ggml_type: int
    data: bytes
    offset: int | None = None  # relative; None = packed after the previous one


@dataclass
class GGUFSpec:
    kvs: list[tuple[str, int, object]] = field(default_factory=list)
    tensors: list[Tensor] = field(default_factory=list)
    version: int = 3
    alignment: int = 32
    magic: bytes = b"GGUF"

    def build(self) -> bytes:
        out = bytearray(self.magic + struct.pack("<IQQ", self.version, len(self.tensors), len(self.kvs)))
        for key, vtype, value in self.kvs:
            out += gguf_string(key) + struct.pack("<I", vtype) + gguf_value(vtype, value)
        offsets, pos = [], 0
        for t in self.tensors:
            off = pos if t.offset is None else t.offset
            offsets.append(off)
            pos = -(-(off + len(t.data)) // self.alignment) * self.alignment
        for t, off in zip(self.tensors, offsets):
            out += gguf_string(t.name) + struct.pack("<I", len(t.ne))
            out += b"".join(struct.pack("<Q", d) for d in t.ne)
            out += struct.pack("<IQ", t.ggml_type, off)
        out += b"\0" * (-len(out) % self.alignment)
        data_start = len(out)
        for t, off in zip(self.tensors, offsets):
            if not t.data:  # a tensor whose bytes are missing from the file
                continue
            end = data_start + off
            if len(out) < end:
                out += b"\0" * (end - len(out))
            out[end:end + len(t.data)] = t.data
        return bytes(out)


def small_spec() -> GGUFSpec:
    """A valid little file: a few metadata types and two tensors (F32 and Q8_0)."""
    import numpy as np

    rng = np.random.default_rng(0)
    q8 = bytearray()
    for _ in range(2):
        q8 += struct.pack("<e", 0.5) + rng.integers(-128, 128, 32, dtype=np.int8).tobytes()
    return GGUFSpec(
        kvs=[("general.architecture", 8, "llama"), ("general.name", 8, "tiny"),
             ("llama.context_length", 4, 128), ("general.flag", 7, True),
             ("tokenizer.ggml.tokens", 9, (8, ["a", "b", "<s>"])),
             ("tokenizer.ggml.scores", 9, (6, [0.0, -1.0, -2.0]))],
        tensors=[Tensor("w.f32", (4, 2), 0, np.arange(8, dtype=np.float32).tobytes()),
                 Tensor("w.q8", (32, 2), 8, bytes(q8))],
    )


def rewrite_gguf(src, dst, set_strings: dict | None = None, add_tensors: dict | None = None):
    """A copy of the GGUF file src at dst (through the gguf package) with some string metadata
    replaced and some F32 tensors added; returns dst."""
    import gguf

    set_strings, add_tensors = set_strings or {}, add_tensors or {}
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for f in reader.fields.values():
        if f.name in set_strings:
            w.add_string(f.name, set_strings[f.name])
        elif not f.name.startswith("GGUF.") and f.name != "general.architecture":
            sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(f.name, f.contents(), f.types[0], sub)
    for t in reader.tensors:
        w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    for name, data in add_tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return dst
