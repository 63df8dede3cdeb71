"""The runtime probe's tensor smoke test really runs the kernels, and fails when they are wrong."""
from __future__ import annotations

import numpy as np

from rase.kernels import _kernels, smoke

SIMD = _kernels.isa_names()[1]  # avx2, or aarch64's neon


def test_smoke_test_runs_every_supported_path():
    results = smoke.run_smoke_test()
    assert {r.isa for r in results} == set(_kernels.isa_supported()) >= {"scalar", SIMD}
    assert len(results) == 3 * len(_kernels.isa_supported())
    assert all(r.ok for r in results), results


def test_smoke_test_catches_a_wrong_kernel(monkeypatch):
    real = _kernels.vec_dot

    def half_the_blocks(qtype, w, x, isa=None):
        out = real(qtype, w, x, isa)
        return [v * 0.5 for v in out] if isa == SIMD else out  # as if half the blocks were lost

    monkeypatch.setattr(_kernels, "vec_dot", half_the_blocks)
    bad = [r for r in smoke.run_smoke_test() if not r.ok]
    assert bad and {r.isa for r in bad} == {SIMD} and all("matmul" in r.check for r in bad)


def test_smoke_reference_is_independent_of_rase_dequantizers():
    """The numpy side is built from the integers themselves: it agrees with rase's dequantizer
    (so a passing check means the dot kernels agree with both)."""
    from rase.kernels.quants import QuantType

    raw, w = smoke._q4_0(np.random.default_rng(1))
    got = np.empty(w.size, np.float32)
    _kernels.dequantize_into(int(QuantType.Q4_0), np.frombuffer(raw, np.uint8), got)
    assert np.allclose(got.reshape(w.shape), w, rtol=0, atol=1e-6)


def test_probe_command_fails_when_a_check_fails(monkeypatch, capsys):
    from rase.cli import main

    monkeypatch.setattr(smoke, "run_smoke_test", lambda: [smoke.SmokeResult("avx2", "q8_0 matmul", 0.3, False)])
    assert main(["runtime", "probe"]) == 1
    out = capsys.readouterr()
    assert "tensor_smoke_test: FAILED" in out.out and "avx2" in out.out and out.err.startswith("error: ")
