"""rase/kernels/_quantize.h: f32 / f16 / bf16 rows -> weight blocks as llama.cpp's reference quantizers
write them. Every ISA's quantizer (the Q4_K, Q5_K, Q6_K searches run 8 sub-blocks per vector)
writes the scalar reference's bytes, whatever the thread count; the 32-block types and the float
types equal gguf-py's quantizers (written to ggml's reference); that the K-quants equal
llama.cpp's own is tests/convert/test_convert.py's (llama_model_quantize, same values, same bytes)."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from rase.kernels import _kernels
from rase.kernels.quants import QuantType, row_bytes

TYPES = [QuantType(t) for t in range(40) if _kernels.can_quantize(t)]
K_TYPES = [QuantType.Q4_K, QuantType.Q5_K, QuantType.Q6_K]


def _values(kind: str, rows: int = 48, cols: int = 512) -> np.ndarray:
    rng = np.random.default_rng(len(kind))
    x = {"normal": lambda: rng.standard_normal((rows, cols)) * 0.02,
         "heavy": lambda: rng.standard_t(2, (rows, cols)),
         "small": lambda: rng.standard_normal((rows, cols)) * 1e-20,      # near GROUP_MAX_EPS, subnormal squares
         "levels": lambda: rng.integers(-3, 4, (rows, cols)).astype(float),  # ties: flat and repeated sub-blocks
         }[kind]().astype(np.float32)
    x[0, :256] = 0.0           # an all-zero super-block
    x[1, :32] = 5.0            # a constant sub-block (max == min)
    x[2, 32:64] = -x[2, 32:64] ** 2  # an all-negative one
    return x


def _quantize(qtype, x: np.ndarray, isa=None, threads=1, src_type=0) -> bytes:
    rows, cols = x.shape
    out = np.zeros(rows * row_bytes(qtype, cols), np.uint8)
    src = {0: x, 1: x.astype("<f2"), 30: _bf16(x)}[src_type]
    _kernels.quantize_rows(int(qtype), src.view(np.uint8).reshape(-1), src_type, cols, out, threads, isa)
    return out.tobytes()


def _bf16(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float32).view(np.uint32) >> 16).astype("<u2")  # truncated: any bf16 values


def test_rase_writes_the_float_types_the_32_element_types_and_the_k_quants():
    assert set(TYPES) == {QuantType.F32, QuantType.F16, QuantType.BF16, QuantType.Q4_0, QuantType.Q4_1,
                          QuantType.Q5_0, QuantType.Q5_1, QuantType.Q8_0, *K_TYPES}


@pytest.mark.parametrize("kind", ["normal", "heavy", "small", "levels"])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_isa_and_thread_count_writes_the_scalar_references_bytes(qtype, kind):
    x = _values(kind)
    ref = _quantize(qtype, x, "scalar")
    for isa in _kernels.isa_supported():
        for threads in (1, 2, 3):
            assert _quantize(qtype, x, isa, threads) == ref, (isa, threads)


@pytest.mark.parametrize("qtype", [t for t in TYPES if t not in K_TYPES], ids=lambda t: t.name)
def test_the_other_types_equal_gguf_pys_reference_quantizers(qtype):
    x = _values("normal")
    ours = _quantize(qtype, x)
    theirs = gguf.quants.quantize(x, gguf.GGMLQuantizationType(int(qtype)))
    assert ours == np.ascontiguousarray(theirs).tobytes()


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_k_quants_dequantize_close_to_their_input(qtype):
    """A sanity bar beside the byte tests: the blocks decode to the values they came from."""
    x = _values("normal")
    deq = gguf.quants.dequantize(np.frombuffer(_quantize(qtype, x), np.uint8).reshape(x.shape[0], -1),
                                 gguf.GGMLQuantizationType(int(qtype)))
    err = np.abs(deq - x).max() / np.abs(x).max()
    assert err < {QuantType.Q4_K: 0.08, QuantType.Q5_K: 0.04, QuantType.Q6_K: 0.02}[qtype]


@pytest.mark.parametrize("src_type", [1, 30], ids=["F16", "BF16"])
def test_a_half_precision_source_quantizes_as_its_f32_values(src_type):
    x = _values("normal")
    exact = x.astype("<f2").astype(np.float32) if src_type == 1 else \
        (_bf16(x).astype(np.uint32) << 16).view(np.float32)
    for qtype in (QuantType.Q8_0, QuantType.Q4_K, QuantType.F16):
        assert _quantize(qtype, x, src_type=src_type) == _quantize(qtype, exact)


def test_shapes_and_types_are_checked():
    x = np.zeros((2, 256), np.float32)
    out = np.zeros(2 * row_bytes(QuantType.Q4_K, 256), np.uint8)
    with pytest.raises(ValueError, match="no quantizer"):
        _kernels.quantize_rows(int(QuantType.Q2_K), x.view(np.uint8).reshape(-1), 0, 256, out)
    with pytest.raises(ValueError, match="multiple of the block size"):
        _kernels.quantize_rows(int(QuantType.Q4_K), x.view(np.uint8).reshape(-1), 0, 128, out)
    with pytest.raises(ValueError, match="bytes of output"):
        _kernels.quantize_rows(int(QuantType.Q4_K), x.view(np.uint8).reshape(-1), 0, 256, out[:-1])
    with pytest.raises(ValueError, match="not F32, F16 or BF16"):
        _kernels.quantize_rows(int(QuantType.Q4_K), x.view(np.uint8).reshape(-1), 8, 256, out)
