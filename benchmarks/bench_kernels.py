"""Kernel suite on pytest-benchmark: each quant type's matmul through the forward's own loop
(repacked where the type is, 32-row chunks over the threads), against this machine's read
bandwidth measured in the same run.

    python -m pytest benchmarks/bench_kernels.py -s [-k Q4_K] [--benchmark-json out.json]

- decode: one token times a matrix of RASE_BENCH_MB (default 512, past the L3 of the machine
  kinds we run on), reported in GB/s of weights streamed and as a share of the read bandwidth
  (the decode roofline);
- prefill: 64 tokens times a 2048 x 4096 matrix (cache-resident: compute-bound), in GOPS
  (2 x rows x cols x tokens per second).
Every product is also checked bit for bit against the single-threaded reference path
(`_kernels.matmul`) on its first rows, so a faster number is never a different result.
RASE_BENCH_THREADS sets the threads (default 2). tests/benchmarks/test_bench_kernels.py runs this suite
once with small matrices so it cannot rot.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from rase.kernels import _kernels
from rase.kernels.quants import QUANT_BLOCKS, QuantType

TYPES = [QuantType.F16, QuantType.Q4_0, QuantType.Q4_1, QuantType.Q5_0, QuantType.Q5_1, QuantType.Q8_0,
         QuantType.Q4_K, QuantType.Q5_K, QuantType.Q6_K, QuantType.MXFP4]
# byte offsets of each block's f16 scale fields (kept finite and normal so timing is honest)
F16_FIELDS = {QuantType.Q4_0: [0], QuantType.Q4_1: [0, 2], QuantType.Q5_0: [0], QuantType.Q5_1: [0, 2],
              QuantType.Q8_0: [0], QuantType.Q4_K: [0, 2], QuantType.Q5_K: [0, 2], QuantType.Q6_K: [208]}
MB = int(os.environ.get("RASE_BENCH_MB", "512"))
THREADS = int(os.environ.get("RASE_BENCH_THREADS", "2"))
COLS = 4096
PREFILL_ROWS, PREFILL_T = int(os.environ.get("RASE_BENCH_GEMM_ROWS", "2048")), 64


def _matrix(qtype: QuantType, rows: int, seed: int) -> np.ndarray:
    """(rows, row_bytes) of random blocks whose scales are normal f16 values near 1/64."""
    blck, size = QUANT_BLOCKS[qtype]
    rng = np.random.default_rng(seed)
    if qtype == QuantType.F16:
        return rng.standard_normal((rows, COLS)).astype(np.float16).view(np.uint8).reshape(rows, -1)
    raw = rng.integers(0, 256, (rows * COLS // blck, size), dtype=np.uint8)
    if qtype == QuantType.MXFP4:  # its E8M0 exponent byte: 2^-6 .. 2^-3
        raw[:, 0] = rng.integers(121, 125, raw.shape[0], dtype=np.uint8)
    for off in F16_FIELDS.get(qtype, []):
        h = (rng.uniform(0.5, 2.0, raw.shape[0]) / 64).astype(np.float16)
        raw[:, off:off + 2] = h.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


def _check_against_reference(qtype: QuantType, w: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    ref = _kernels.matmul(int(qtype), np.ascontiguousarray(w[:64]), x)
    assert ref.view(np.uint32).tobytes() == np.ascontiguousarray(y[:, :64]).view(np.uint32).tobytes()


def _seconds(benchmark, measured: float) -> float:
    # pytest-benchmark's best round when it timed; our own timer when run with --benchmark-disable
    return benchmark.stats.stats.min if benchmark.stats is not None else measured


@pytest.fixture(scope="module")
def read_bandwidth() -> float:
    buf = np.ones(MB << 20, np.uint8)
    return _kernels.bench_read_bandwidth(buf, THREADS, 5)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_decode_matvec(benchmark, qtype, read_bandwidth):
    blck, size = QUANT_BLOCKS[qtype]
    rows = max(64, (MB << 20) // (COLS // blck * size) // 32 * 32)
    w = _matrix(qtype, rows, seed=int(qtype))
    m = _kernels.BenchMatrix(int(qtype), w, COLS, n_threads=THREADS)
    x = np.random.default_rng(1).standard_normal((1, COLS)).astype(np.float32)
    y, measured = benchmark.pedantic(m.matmul, args=(x, THREADS), rounds=5, warmup_rounds=1)
    _check_against_reference(qtype, w, x, y)
    gbs = m.nbytes / _seconds(benchmark, measured) / 1e9
    share = gbs / (read_bandwidth / 1e9)
    benchmark.extra_info.update(gb_per_s=round(gbs, 2), read_bandwidth_share=round(share, 3))
    print(f"\n  decode {qtype.name:5} {m.nbytes / 2**20:6.0f} MiB  {gbs:6.1f} GB/s = {share:5.1%} of "
          f"{read_bandwidth / 1e9:.1f} GB/s read ({THREADS} threads)")


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_prefill_gemm(benchmark, qtype):
    w = _matrix(qtype, PREFILL_ROWS, seed=int(qtype) + 1)
    m = _kernels.BenchMatrix(int(qtype), w, COLS, n_threads=THREADS)
    x = np.random.default_rng(2).standard_normal((PREFILL_T, COLS)).astype(np.float32)
    y, measured = benchmark.pedantic(m.matmul, args=(x, THREADS), rounds=5, warmup_rounds=1)
    _check_against_reference(qtype, w, x, y)
    gops = 2 * PREFILL_ROWS * COLS * PREFILL_T / _seconds(benchmark, measured) / 1e9
    benchmark.extra_info.update(gops=round(gops, 1))
    print(f"\n  prefill {qtype.name:5} {PREFILL_ROWS} x {COLS} x {PREFILL_T} tokens  {gops:6.1f} GOPS "
          f"({THREADS} threads)")
