"""Every fast kernel against its scalar reference and against numpy, over awkward shapes."""
from __future__ import annotations

import numpy as np
import pytest

from rase import QuantType, _kernels
from rase.quants import QUANT_BLOCKS
from tests.reference import ACT_FORMAT, quantize_act
from tests.test_quants import random_blocks

gguf = pytest.importorskip("gguf")

if "avx2" not in _kernels.isa_supported():  # this machine kind has AVX2: it must be tested
    pytest.fail("AVX2 expected on this machine kind", pytrace=False)


def _row(qtype: QuantType, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    blck, _ = QUANT_BLOCKS[qtype]
    raw = np.frombuffer(random_blocks(qtype, n // blck, seed), np.uint8).copy()
    deq = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(qtype))).reshape(-1)
    return raw, deq.astype(np.float64)


def _lengths(qtype: QuantType) -> list[int]:
    kblk = 256 if ACT_FORMAT.get(int(qtype)) == "q8_K" else 32
    return [kblk, 3 * kblk, 7 * kblk] if kblk == 32 else [256, 768]


@pytest.mark.parametrize("qtype", list(QuantType), ids=lambda t: t.name)
def test_dot_avx2_matches_scalar_and_numpy(qtype):
    rng = np.random.default_rng(int(qtype))
    for n in _lengths(qtype):
        w, deq = _row(qtype, n, seed=n)
        deq = np.nan_to_num(deq, posinf=0, neginf=0)
        x = rng.standard_normal((4, n)).astype(np.float32)
        scalar = np.array(_kernels.vec_dot(int(qtype), w, x, "scalar"))
        avx2 = np.array(_kernels.vec_dot(int(qtype), w, x, "avx2"))
        spec = quantize_act(x, ACT_FORMAT.get(int(qtype))) @ deq
        scale = np.abs(deq) @ np.abs(x).T  # sum |w x|: the size of rounding errors
        assert np.all(np.abs(avx2 - scalar) <= 1e-5 * scale + 1e-30), (n, avx2, scalar)
        # q8_1 keeps s = d * sum(q) in f16 (its rounding is the 1e-3 below)
        assert np.all(np.abs(avx2 - spec) <= 2e-3 * scale + 1e-30), (n, avx2, spec)


@pytest.mark.parametrize("isa", ["scalar", "avx2"])
@pytest.mark.parametrize("qtype", list(QuantType), ids=lambda t: t.name)
def test_multi_token_dot_equals_single_token_bit_for_bit(qtype, isa):
    n = _lengths(qtype)[-1]
    w, _ = _row(qtype, n, seed=1)
    x = np.random.default_rng(2).standard_normal((4, n)).astype(np.float32)
    together = _kernels.vec_dot(int(qtype), w, x, isa)
    alone = [_kernels.vec_dot(int(qtype), w, x[i:i + 1], isa)[0] for i in range(4)]
    assert np.array(together, np.float32).tobytes() == np.array(alone, np.float32).tobytes()


@pytest.mark.parametrize("qtype", [QuantType.Q8_0, QuantType.Q4_1, QuantType.Q6_K], ids=lambda t: t.name)
def test_activation_quantizers_agree_across_isas(qtype):
    x = np.random.default_rng(3).standard_normal(1024).astype(np.float32) * 7
    x[5] = 0.0
    assert _kernels.quantize_activation(int(qtype), x, "scalar") == \
        _kernels.quantize_activation(int(qtype), x, "avx2")
    zeros = np.zeros(256, np.float32)
    assert set(_kernels.quantize_activation(int(qtype), zeros, "avx2")) <= {0}


def test_dot_shape_checks():
    w = np.zeros(34, np.uint8)
    with pytest.raises(ValueError, match="multiple of 32"):
        _kernels.vec_dot(8, w, np.zeros((1, 31), np.float32))
    with pytest.raises(ValueError, match="1..4 activation rows"):
        _kernels.vec_dot(8, w, np.zeros((5, 32), np.float32))
    with pytest.raises(ValueError, match="need 34 bytes"):
        _kernels.vec_dot(8, w[:30], np.zeros((1, 32), np.float32))


def _attention_spec(q, k, v, scale, j0):
    kf, vf = k.view(np.float16).astype(np.float64), v.view(np.float16).astype(np.float64)
    s = kf[j0:] @ q.astype(np.float64) * scale
    p = np.exp(s - s.max())
    return (p / p.sum()) @ vf[j0:]


@pytest.mark.parametrize("hd", [32, 64, 128, 256, 40])
@pytest.mark.parametrize("n,j0", [(1, 0), (7, 0), (33, 0), (100, 37), (300, 0)])
def test_attention_against_scalar_and_spec(hd, n, j0):
    rng = np.random.default_rng(hd * 1000 + n)
    q = rng.standard_normal(hd).astype(np.float32)
    k = rng.standard_normal((n, hd)).astype(np.float16).view(np.uint16)
    v = rng.standard_normal((n, hd)).astype(np.float16).view(np.uint16)
    scale = np.float32(1 / np.sqrt(hd))
    spec = _attention_spec(q, k, v, scale, j0)
    for isa in ("scalar", "avx2"):
        for single in (False, True):
            got = _kernels.attention(q, k, v, scale, j0, isa, single)
            # the AVX2 path rounds q and the probabilities to f16, as llama.cpp does
            assert np.abs(got - spec).max() <= 4e-3 * np.abs(spec).max() + 1e-6, (isa, single)
