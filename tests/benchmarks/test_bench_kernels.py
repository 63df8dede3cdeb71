"""The kernel suite (benchmarks/bench_kernels.py) runs, once per test, on small matrices: every
type's product through the forward's matmul loop equals the reference path bit for bit, and
the read-bandwidth probe reads what it is given."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rase.kernels import _kernels

ROOT = Path(__file__).resolve().parents[2]


def test_kernel_suite_runs_and_checks_every_type():
    env = dict(os.environ, RASE_BENCH_MB="4", RASE_BENCH_GEMM_ROWS="96")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                           "--benchmark-disable", str(ROOT / "benchmarks" / "bench_kernels.py")],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "20 passed" in proc.stdout
    for kind in ("decode", "prefill"):
        for name in ("F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "MXFP4"):
            assert f"{kind} {name}" in proc.stdout


def test_bench_matrix_refuses_what_it_cannot_run():
    w = np.zeros((8, 34), np.uint8)
    with pytest.raises(ValueError, match="cols a multiple of 32"):
        _kernels.BenchMatrix(8, w, 31)
    m = _kernels.BenchMatrix(8, w, 32)
    with pytest.raises(ValueError, match=r"x \(T, 32\)"):
        m.matmul(np.zeros((1, 64), np.float32))
    with pytest.raises(ValueError, match="4 KiB"):
        _kernels.bench_read_bandwidth(np.zeros(100, np.uint8))


def test_read_bandwidth_is_a_rate():
    assert _kernels.bench_read_bandwidth(np.ones(1 << 20, np.uint8), 2, 2) > 1e8


@pytest.mark.parametrize("n", [576, 1000, 2085, 4096, 40])
def test_f16_gemm_gives_the_row_by_row_bits(n):
    """From 16 tokens an F16 matrix with n % 32 == 0 runs the chain-major GEMM (a lane per row, one
    FMA chain at a time, tiles of 6 tokens, the last chunk's 5 rows masked), AVX2 and AVX-512; below 16
    tokens, and for other n, the one-row kernel over several tokens. Every (row, token) gets the
    bits of the one-row kernel."""
    rng = np.random.default_rng(n)
    w = rng.standard_normal((37, n)).astype(np.float16).view(np.uint8).reshape(37, -1)
    for isa in set(_kernels.isa_supported()) - {"scalar"}:
        m = _kernels.BenchMatrix(1, w, n, isa)
        for T in (2, 5, 7, 15, 16, 17, 22, 48, 49, 101):
            x = rng.standard_normal((T, n)).astype(np.float32)
            y, _ = m.matmul(x, 2)
            assert y.tobytes() == _kernels.matmul(1, w, x, isa).tobytes(), (isa, T)
