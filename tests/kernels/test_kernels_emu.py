"""The AVX-512 kernels checked on every CPU: rase.kernels._kernels_emu is rase.kernels._kernels compiled with
every intrinsic in portable C (SIMDe, setup.py), so its "avx512" path runs here whether or not
this CPU has AVX-512, and must give the native AVX2 path's bits (the numerics contract: one
order per output, whatever the ISA). The emulated AVX2 path is checked against the native one
first: that is what says the emulation itself is faithful."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

from rase import QuantType
from rase.kernels import _kernels
from rase.engine.decoder import load_gguf_decoder
from tests.support.quant_blocks import lengths, row_and_values
from tests.support.tinymodels import TOKENS

NATIVE = "avx2"
pytestmark = pytest.mark.skipif("avx2" not in _kernels.isa_supported(),
                                reason="the native reference path needs an AVX2 CPU")


@pytest.fixture(scope="module")
def emu():
    try:
        return importlib.import_module("rase.kernels._kernels_emu")
    except ImportError as exc:  # a build without SIMDe's headers: say how to get them, never skip
        pytest.fail(f"rase.kernels._kernels_emu was not built ({exc}): install SIMDe's headers "
                    "(tools/install-test-deps.sh, Debian's libsimde-dev) and reinstall rase")


def _same(a, b) -> bool:
    return np.asarray(a, np.float32).tobytes() == np.asarray(b, np.float32).tobytes()


@pytest.mark.parametrize("qtype", list(QuantType), ids=lambda t: t.name)
def test_dot_emulated_avx512_and_avx2_give_the_native_avx2_bits(emu, qtype):
    assert emu.isa_supported() == ["scalar", "avx2", "avx512"]
    rng = np.random.default_rng(int(qtype) + 300)
    floats = qtype in (QuantType.F32, QuantType.F16, QuantType.BF16)
    for n in lengths(qtype) + ([107] if floats else []):
        w, _ = row_and_values(qtype, n, seed=n + 11)
        for nt in range(1, 9):
            x = (rng.standard_normal((nt, n)) * rng.uniform(0.01, 30)).astype(np.float32)
            native = _kernels.vec_dot(int(qtype), w, x, NATIVE)
            assert _same(emu.vec_dot(int(qtype), w, x, "avx2"), native), (n, nt)
            assert _same(emu.vec_dot(int(qtype), w, x, "avx512"), native), (n, nt)


# the matmul loop's kernels: repacked 16-row groups (Q4_0..Q8_0, Q4_K), the F16 GEMM, dotn tiles
MATMUL_TYPES = [QuantType.F16, QuantType.Q4_0, QuantType.Q4_1, QuantType.Q5_0, QuantType.Q5_1,
                QuantType.Q8_0, QuantType.Q4_K, QuantType.Q5_K, QuantType.Q6_K]


@pytest.mark.parametrize("qtype", MATMUL_TYPES, ids=lambda t: t.name)
def test_matmul_emulated_avx512_gives_the_native_avx2_bits(emu, qtype):
    """Every token-tile shape the forward uses (1..9 tokens, then 17 and 40: the GEMM and panel
    paths), rows not a multiple of 16, two threads."""
    cols = 512
    rows = 40
    w = np.stack([row_and_values(qtype, cols, seed=r + 1)[0] for r in range(rows)])
    rng = np.random.default_rng(int(qtype))
    for T in list(range(1, 10)) + [17, 40]:
        x = rng.standard_normal((T, cols)).astype(np.float32)
        native, _ = _kernels.BenchMatrix(int(qtype), w, cols, NATIVE, 2).matmul(x, 2)
        wide, _ = emu.BenchMatrix(int(qtype), w, cols, "avx512", 2).matmul(x, 2)
        assert _same(wide, native), T


@pytest.mark.parametrize("hd", [64, 256, 40])
@pytest.mark.parametrize("n,j0", [(1, 0), (33, 0), (100, 37)])
@pytest.mark.parametrize("softcap", [0.0, 2.0])
def test_attention_emulated_avx512_gives_the_native_avx2_bits(emu, hd, n, j0, softcap):
    rng = np.random.default_rng(hd + n + int(softcap))
    k = rng.standard_normal((n, hd)).astype(np.float16).view(np.uint16)
    v = rng.standard_normal((n, hd)).astype(np.float16).view(np.uint16)
    for g in (1, 3, 4):
        q = (rng.standard_normal((g, hd)) * 2).astype(np.float32)
        native = _kernels.attention(q, k, v, 0.125, j0, NATIVE, softcap=softcap)
        assert _same(emu.attention(q, k, v, 0.125, j0, "avx512", softcap=softcap), native), g


@pytest.mark.parametrize("qtype", [QuantType.Q4_K, QuantType.Q5_0, QuantType.Q8_0, QuantType.F16],
                         ids=lambda t: t.name)
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_forward_emulated_avx512_gives_the_native_avx2_logits(emu, monkeypatch, tiny_models, arch, qtype):
    """A whole prefill (every position's logits) through the emulated module's AVX-512 plan,
    against the native module's AVX2 plan on the same file."""
    import rase.engine.decoder
    import rase.store.plan

    path = tiny_models(arch, qtype)
    previous = _kernels.get_isa()
    _kernels.set_isa(NATIVE)
    try:
        native = load_gguf_decoder(None, path).prefill(TOKENS, all_logits=True)
    finally:
        _kernels.set_isa(previous)
    monkeypatch.setattr(rase.store.plan, "_kernels", emu)
    monkeypatch.setattr(rase.engine.decoder, "_kernels", emu)
    emu.set_isa("avx512")
    dec = load_gguf_decoder(None, path)
    assert dec.plan.weights.isa == "avx512" and type(dec._fwd).__module__ == "rase.kernels._kernels_emu"
    assert _same(dec.prefill(TOKENS, all_logits=True), native)
