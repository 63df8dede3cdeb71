from __future__ import annotations

import gguf  # test extra: the independent dequantizer we check against
import numpy as np
import pytest

from rase import GGUFFile, QuantType, UnsupportedQuantType, dequantize
from rase.kernels import _kernels
from rase.store.gguf import _OTHER_BLOCKS
from rase.kernels.quants import QUANT_BLOCKS
from tests.support.ggufbuild import GGUFSpec, Tensor
from tests.support.quant_blocks import random_blocks


ISAS = _kernels.isa_supported()

def test_c_and_python_tables_agree():
    c_table = _kernels.quant_traits()
    assert set(c_table) == {int(t) for t in QuantType}
    for t, (blck, size) in QUANT_BLOCKS.items():
        name, c_blck, c_size, _has_avx2 = c_table[int(t)]
        assert (name, c_blck, c_size) == (t.name, blck, size)


def test_tables_agree_with_ggml_sizes():
    sizes = gguf.constants.GGML_QUANT_SIZES
    for t, blk in QUANT_BLOCKS.items():
        assert sizes[gguf.GGMLQuantizationType(int(t))] == tuple(blk), t.name
    for t, blk in _OTHER_BLOCKS.items():
        if t == 9:  # gguf-py lists Q8_1 with f32 d/s (40 B); ggml's block_q8_1 holds f16 d/s (36 B)
            continue
        assert sizes[gguf.GGMLQuantizationType(t)] == blk, t


def test_every_type_has_an_avx2_dequantizer():
    assert all(has_avx2 for (_n, _b, _s, has_avx2) in _kernels.quant_traits().values())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", list(QuantType), ids=lambda t: t.name)
def test_dequant_random_blocks_match_gguf(qtype, isa):
    blck, _size = QUANT_BLOCKS[qtype]
    for seed, n_blocks in enumerate((1, 3, 64)):
        n = n_blocks * blck if blck > 1 else n_blocks * 37  # odd lengths for F16/BF16 tails
        data = random_blocks(qtype, n // blck, seed)
        expect = gguf.quants.dequantize(np.frombuffer(data, np.uint8),
                                        gguf.GGMLQuantizationType(int(qtype))).reshape(-1)
        out = np.empty(n, np.float32)
        _kernels.dequantize_into(int(qtype), np.frombuffer(data, np.uint8), out, isa)
        assert np.isfinite(out).all()
        np.testing.assert_array_equal(out, expect.astype(np.float32))


@pytest.mark.parametrize("qtype", list(QuantType), ids=lambda t: t.name)
def test_simd_dequantizer_equals_scalar_bit_for_bit(qtype):
    simd = _kernels.isa_names()[1]  # avx2, or aarch64's neon
    if simd not in ISAS:
        pytest.fail(f"every machine kind rase is tested on has {simd}: it must be tested here")
    blck, _ = QUANT_BLOCKS[qtype]
    data = np.frombuffer(random_blocks(qtype, 200, 7), np.uint8)
    n = 200 * blck
    a, b = np.empty(n, np.float32), np.empty(n, np.float32)
    _kernels.dequantize_into(int(qtype), data, a, "scalar")
    _kernels.dequantize_into(int(qtype), data, b, simd)
    assert a.view(np.uint32).tolist() == b.view(np.uint32).tolist()


@pytest.mark.needs_model
def test_every_tensor_of_the_real_models_matches_gguf(real_model_path):
    r = gguf.GGUFReader(str(real_model_path))
    g = GGUFFile(real_model_path)
    seen = set()
    for rt in r.tensors:
        t = g.tensors[rt.name]
        expect = gguf.quants.dequantize(rt.data, rt.tensor_type).astype(np.float32)
        for isa in ISAS:
            out = np.empty(t.n_elements, np.float32)
            _kernels.dequantize_into(t.ggml_type, t.data, out, isa)
            np.testing.assert_array_equal(out, expect.reshape(-1), err_msg=f"{rt.name} {isa}")
        seen.add(t.type_name)
    assert dequantize(t).shape == t.shape
    assert len(seen) >= 3


def test_dequantize_shape_checks():
    data = np.zeros(34, np.uint8)
    with pytest.raises(ValueError, match="multiple of the block size"):
        _kernels.dequantize_into(8, data, np.empty(31, np.float32))
    with pytest.raises(ValueError, match="need 68 bytes"):
        _kernels.dequantize_into(8, data, np.empty(64, np.float32))
    with pytest.raises(ValueError, match="no kernels"):
        _kernels.dequantize_into(16, data, np.empty(32, np.float32))
    with pytest.raises(ValueError, match="unknown ISA"):
        _kernels.dequantize_into(8, data, np.empty(32, np.float32), "neon9")


def test_unsupported_type_raises_typed_error():
    spec = GGUFSpec(tensors=[Tensor("iq", (256,), 23, b"\0" * 136)])  # IQ4_XS
    t = GGUFFile.from_buffer(spec.build()).tensor("iq")
    assert t.type_name == "IQ4_XS"
    with pytest.raises(UnsupportedQuantType, match="IQ4_XS"):
        dequantize(t)
