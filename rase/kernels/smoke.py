"""A tensor smoke test for `rase runtime probe`: a small quantized matmul and one attention
head through every kernel path this CPU can run, checked against numpy computed from the same
integers (not through rase's own dequantizers)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _kernels

ROWS, COLS = 48, 256


@dataclass(frozen=True)
class SmokeResult:
    isa: str
    check: str
    max_rel_err: float
    ok: bool


def _q8_0(rng) -> tuple[bytes, np.ndarray]:
    """ROWS x COLS Q8_0 blocks (f16 scale + 32 int8) and the exact values they hold."""
    d = rng.uniform(0.001, 0.01, (ROWS, COLS // 32)).astype(np.float16)
    q = rng.integers(-127, 128, (ROWS, COLS // 32, 32), dtype=np.int8)
    raw = np.concatenate([d.view(np.uint8).reshape(ROWS, -1, 2), q.view(np.uint8)], axis=2)
    return raw.tobytes(), (d.astype(np.float64)[..., None] * q).reshape(ROWS, COLS)


def _q4_0(rng) -> tuple[bytes, np.ndarray]:
    d = rng.uniform(0.001, 0.01, (ROWS, COLS // 32)).astype(np.float16)
    lo = rng.integers(0, 16, (ROWS, COLS // 32, 16), dtype=np.uint8)
    hi = rng.integers(0, 16, (ROWS, COLS // 32, 16), dtype=np.uint8)
    raw = np.concatenate([d.view(np.uint8).reshape(ROWS, -1, 2), lo | (hi << 4)], axis=2)
    vals = np.concatenate([lo, hi], axis=2).astype(np.float64) - 8
    return raw.tobytes(), (d.astype(np.float64)[..., None] * vals).reshape(ROWS, COLS)


MATRICES = {"q8_0": (8, _q8_0), "q4_0": (2, _q4_0)}  # name -> (ggml type id, builder)


def _matmul(isa: str, name: str, rng) -> SmokeResult:
    qtype, build = MATRICES[name]
    raw, w = build(rng)
    x = rng.standard_normal((4, COLS)).astype(np.float32)
    row = len(raw) // ROWS
    got = np.array([_kernels.vec_dot(qtype, np.frombuffer(raw[r * row:(r + 1) * row], np.uint8), x, isa)
                    for r in range(ROWS)])
    want = w @ x.astype(np.float64).T
    scale = np.abs(w) @ np.abs(x.astype(np.float64)).T  # 8-bit activations: errors ~1% of this
    err = float((np.abs(got - want) / scale).max())
    return SmokeResult(isa, f"{name} matmul {ROWS}x{COLS} x 4", err, err < 1e-2)


def _attention(isa: str, rng) -> SmokeResult:
    hd, n = 64, 77
    q = rng.standard_normal((2, hd)).astype(np.float32)
    k, v = (rng.standard_normal((n, hd)).astype(np.float16) for _ in range(2))
    got = _kernels.attention(q, k.view(np.uint16), v.view(np.uint16), 0.125, 0, isa)
    s = q.astype(np.float64) @ k.astype(np.float64).T * 0.125
    p = np.exp(s - s.max(axis=1, keepdims=True))
    want = (p / p.sum(axis=1, keepdims=True)) @ v.astype(np.float64)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    return SmokeResult(isa, f"attention {n} positions x 2 heads", err, err < 1e-2)


def run_smoke_test(seed: int = 0) -> list[SmokeResult]:
    """Every check on every ISA this CPU supports."""
    out = []
    for isa in _kernels.isa_supported():
        rng = np.random.default_rng(seed)
        out += [_matmul(isa, name, rng) for name in MATRICES] + [_attention(isa, rng)]
    return out
