from __future__ import annotations

import struct

import gguf  # test extra: the reference GGUF reader/writer
import numpy as np
import pytest

from rase import CorruptModelFile, GGUFFile, ModelFileNotFound, RaseError, UnsupportedFormat
from tests.support.ggufbuild import GGUFSpec, Tensor, small_spec


def parse(spec_or_bytes) -> GGUFFile:
    data = spec_or_bytes.build() if isinstance(spec_or_bytes, GGUFSpec) else spec_or_bytes
    return GGUFFile.from_buffer(data, "test.gguf")


def test_small_file_from_path_and_buffer(tmp_path):
    data = small_spec().build()
    path = tmp_path / "small.gguf"
    path.write_bytes(data)
    for g in (GGUFFile(path), parse(data)):
        assert g.version == 3 and g.alignment == 32 and g.architecture == "llama"
        assert g.metadata["llama.context_length"] == 128 and g.metadata["general.flag"] is True
        assert g.metadata["tokenizer.ggml.tokens"] == ["a", "b", "<s>"]
        np.testing.assert_array_equal(g.metadata["tokenizer.ggml.scores"], [0.0, -1.0, -2.0])
        assert g.value_type_name("tokenizer.ggml.scores") == "ARRAY[FLOAT32]"
        assert g.arch_get("context_length") == 128
        t = g.tensor("w.f32")
        assert t.shape == (2, 4) and t.ne == (4, 2) and t.nbytes == 32 and t.offset % 32 == 0
        np.testing.assert_array_equal(t.data.view(np.float32), np.arange(8))
        assert not t.data.flags.writeable
        assert g.tensor("w.q8").shape == (2, 32) and g.tensor("w.q8").nbytes == 68


def test_copy_reads_the_mapped_files_bytes_even_after_the_path_is_replaced(tmp_path):
    """GGUFFile.copy reads through a file descriptor (no mmap fault); if the path now names
    another file (a model replaced after load), the copy still comes from the mapped one."""
    data = small_spec().build()
    path = tmp_path / "small.gguf"
    path.write_bytes(data)
    g, buf = GGUFFile(path), parse(data)
    t = g.tensor("w.f32")
    want = bytes(t.data)
    assert g.copy(t).tobytes() == want and buf.copy(buf.tensor("w.f32")).tobytes() == want
    copy = g.copy(t)
    assert copy.flags.writeable and copy.ctypes.data != t.data.ctypes.data  # private
    other = bytearray(data)
    other[t.offset:t.offset + t.nbytes] = b"\x55" * t.nbytes
    (tmp_path / "other.gguf").write_bytes(bytes(other))
    (tmp_path / "other.gguf").replace(path)
    assert g.copy(t).tobytes() == want


def test_reads_every_value_type_written_by_gguf_package(tmp_path):
    path = tmp_path / "w.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint8("t.u8", 200); w.add_int8("t.i8", -100); w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000); w.add_uint32("t.u32", 4_000_000_000); w.add_int32("t.i32", -2)
    w.add_float32("t.f32", 1.5); w.add_bool("t.bool", False); w.add_string("t.str", "héllo ✓")
    w.add_uint64("t.u64", 2**63 + 5); w.add_int64("t.i64", -(2**62)); w.add_float64("t.f64", 0.1)
    w.add_array("t.arr_i", [1, 2, 3]); w.add_array("t.arr_s", ["x", "yy", ""])
    w.add_array("t.arr_f", [0.5, 0.25])
    w.add_tensor("a", np.arange(64, dtype=np.float32).reshape(2, 32))
    w.add_tensor("b", np.ones((3, 8), dtype=np.float16))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

    g = GGUFFile(path)
    expect = {"t.u8": 200, "t.i8": -100, "t.u16": 60000, "t.i16": -30000, "t.u32": 4_000_000_000,
              "t.i32": -2, "t.f32": 1.5, "t.bool": False, "t.str": "héllo ✓", "t.u64": 2**63 + 5,
              "t.i64": -(2**62), "t.f64": 0.1, "t.arr_s": ["x", "yy", ""]}
    for k, v in expect.items():
        assert g.metadata[k] == v, k
    assert list(g.metadata["t.arr_i"]) == [1, 2, 3] and list(g.metadata["t.arr_f"]) == [0.5, 0.25]
    assert [g.value_type_name(k) for k in ("t.u8", "t.i64", "t.f64", "t.bool")] == \
        ["UINT8", "INT64", "FLOAT64", "BOOL"]
    np.testing.assert_array_equal(g.tensor("a").data.view(np.float32).reshape(2, 32),
                                  np.arange(64).reshape(2, 32))
    assert g.tensor("b").shape == (3, 8) and g.tensor("b").type_name == "F16"


@pytest.mark.needs_model
def test_real_models_agree_with_gguf_package(real_model_path):
    g, r = GGUFFile(real_model_path), gguf.GGUFReader(str(real_model_path))
    assert len(g.tensors) == len(r.tensors)
    for rt in r.tensors:
        t = g.tensors[rt.name]
        assert t.ggml_type == int(rt.tensor_type) and t.offset == rt.data_offset
        assert t.ne == tuple(int(x) for x in rt.shape) and t.nbytes == rt.n_bytes
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        ours = g.metadata[key]
        theirs = field.contents()
        if isinstance(ours, np.ndarray):
            np.testing.assert_array_equal(ours, np.asarray(theirs, dtype=ours.dtype))
        else:
            assert ours == theirs, key


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ModelFileNotFound):
        GGUFFile(tmp_path / "nope.gguf")
    with pytest.raises(ModelFileNotFound):
        GGUFFile(tmp_path)


def test_empty_file(tmp_path):
    (tmp_path / "e.gguf").write_bytes(b"")
    with pytest.raises(CorruptModelFile, match="empty"):
        GGUFFile(tmp_path / "e.gguf")


def test_every_truncation_is_reported():
    data = small_spec().build()
    g = parse(data)
    last_byte_needed = max(t.offset + t.nbytes for t in g.tensors.values())
    for n in range(last_byte_needed):
        with pytest.raises(CorruptModelFile) as info:
            parse(data[:n])
        assert "test.gguf" in str(info.value)


def _bad(mutate) -> GGUFSpec:
    spec = small_spec()
    mutate(spec)
    return spec


def _set(**kw):
    def f(spec):
        for k, v in kw.items():
            setattr(spec, k, v)
    return f


def _patch(offset: int, raw: bytes):
    def f(data: bytes) -> bytes:
        return data[:offset] + raw + data[offset + len(raw):]
    return f


CORRUPT = {
    # name: (spec mutation or byte patch, expected class, message fragment)
    "bad magic": (_set(magic=b"GGML"), UnsupportedFormat, "not a GGUF file"),
    "version 1": (_set(version=1), UnsupportedFormat, "version 1"),
    "big endian": (_set(version=3 << 24), UnsupportedFormat, "big-endian"),
    "absurd tensor count": (_patch(8, struct.pack("<Q", 2**40)), CorruptModelFile, "absurd tensor count"),
    "absurd kv count": (_patch(16, struct.pack("<Q", 2**62)), CorruptModelFile, "absurd metadata count"),
    "huge key length": (_patch(24, struct.pack("<Q", 2**63)), CorruptModelFile, "truncated"),
    "duplicate key": (lambda s: s.kvs.append(("general.name", 8, "again")), CorruptModelFile, "duplicate metadata key"),
    "empty key": (lambda s: s.kvs.append(("", 4, 1)), CorruptModelFile, "is empty"),
    "unknown value type": (lambda s: s.kvs.append(("x.y", 13, None)), CorruptModelFile, "unknown value type 13"),
    "nested array": (lambda s: s.kvs.append(("x.y", 9, (9, []))), CorruptModelFile, "array item type 9"),
    "non utf8 key": (lambda s: s.kvs.append((b"\xff\xfe", 4, 1)), CorruptModelFile, "UTF-8"),
    "non utf8 token": (lambda s: s.kvs.append(("x.toks", 9, (8, [b"ok", b"\xc3"]))), CorruptModelFile, "UTF-8"),
    "bad alignment": (lambda s: s.kvs.append(("general.alignment", 4, 24)), CorruptModelFile, "power-of-two"),
    "zero alignment": (lambda s: s.kvs.append(("general.alignment", 4, 0)), CorruptModelFile, "power-of-two"),
    "alignment wrong type": (lambda s: s.kvs.append(("general.alignment", 8, "32")), CorruptModelFile, "power-of-two"),
    "duplicate tensor": (lambda s: s.tensors.append(Tensor("w.f32", (4,), 0, b"\0" * 16)), CorruptModelFile, "duplicate tensor name"),
    "unknown tensor type": (lambda s: s.tensors.append(Tensor("t", (4,), 77, b"\0" * 16)), CorruptModelFile, "unknown ggml type 77"),
    "too many dims": (lambda s: s.tensors.append(Tensor("t", (1, 1, 1, 1, 1), 0, b"\0" * 4)), CorruptModelFile, "5 dimensions"),
    "zero dims": (lambda s: s.tensors.append(Tensor("t", (), 0, b"")), CorruptModelFile, "0 dimensions"),
    "row not whole blocks": (lambda s: s.tensors.append(Tensor("t", (33,), 8, b"\0" * 68)), CorruptModelFile, "multiple of the Q8_0 block size"),
    "misaligned data": (lambda s: s.tensors.append(Tensor("t", (4,), 0, b"\0" * 16, offset=100)), CorruptModelFile, "aligned"),
    "data past end": (lambda s: s.tensors.append(Tensor("t", (4,), 0, b"", offset=1 << 20)), CorruptModelFile, "past the end"),
    "absurd shape": (lambda s: s.tensors.append(Tensor("t", (2**32, 2**32), 0, b"")), CorruptModelFile, "absurd shape"),
    "overlap": (lambda s: s.tensors.append(Tensor("t", (4,), 0, b"\0" * 16, offset=0)), CorruptModelFile, "overlap"),
    "long name": (lambda s: s.tensors.append(Tensor("n" * 64, (4,), 0, b"\0" * 16)), CorruptModelFile, "longer than 63"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_files_raise_typed_errors(case):
    mutate, cls, fragment = CORRUPT[case]
    if mutate.__name__ == "f" and mutate.__code__.co_varnames[:1] == ("data",):
        data = mutate(small_spec().build())
    else:
        data = _bad(mutate).build()
    with pytest.raises(cls, match=fragment) as info:
        parse(data)
    assert isinstance(info.value, RaseError)
    if isinstance(info.value, CorruptModelFile):
        assert info.value.offset is not None and "test.gguf" in str(info.value)


def test_compiled_string_loop_reads_and_refuses_like_the_format_says():
    from rase.kernels._kernels import gguf_strings

    def enc(*items: bytes) -> bytes:
        return b"".join(len(b).to_bytes(8, "little") + b for b in items)

    buf = b"xx" + enc(b"ab", b"", "é".encode(), b"\xe2\x96\x81tok")
    assert gguf_strings(buf, 2, 4) == (["ab", "", "é", "\u2581tok"], len(buf))
    with pytest.raises(IndexError) as e:  # the last string's bytes run past the end
        gguf_strings(buf[:-1], 2, 4)
    assert e.value.args == (3,)
    with pytest.raises(IndexError) as e:  # not even a length for a fifth string
        gguf_strings(buf, 2, 5)
    assert e.value.args == (4,)
    with pytest.raises(ValueError) as e:
        gguf_strings(enc(b"ok", b"\xc3"), 0, 2)
    assert e.value.args[0] == 1
