"""Seeded mutation loop over the real GGUF files: every mutant parses or raises a RaseError.

A crash (segfault) kills the run, any other exception fails it, and every mutant that parses
has some tensors dequantized, so bad offsets/types also reach the C kernels.
"""
from __future__ import annotations

import struct
import time

import numpy as np
import pytest

from rase import GGUFFile, RaseError, dequantize

pytestmark = pytest.mark.needs_model  # every test here runs a real model (tests/conftest.py)

EXTREMES = [0, 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]


def _mutate(rng: np.random.Generator, buf: bytearray, header_end: int):
    """Mutate buf in place; returns (undo list, truncation length or None, description)."""
    kind = rng.integers(0, 5)
    pos = int(rng.integers(0, header_end))
    if kind == 4:
        cut = int(rng.integers(0, header_end))
        return [], cut, f"truncate at {cut}"
    if kind == 0:
        raw = bytes([int(rng.integers(0, 256))])
    elif kind == 1:
        raw = struct.pack("<Q", EXTREMES[int(rng.integers(0, len(EXTREMES)))])
    elif kind == 2:
        raw = struct.pack("<I", int(rng.integers(0, 64)))  # small ints: types, dims
    else:
        n = int(rng.integers(1, 4))
        raw = bytes(int(b) ^ (1 << int(rng.integers(0, 8))) for b in buf[pos:pos + n])
    raw = raw[: len(buf) - pos]
    undo = [(pos, bytes(buf[pos:pos + len(raw)]))]
    buf[pos:pos + len(raw)] = raw
    return undo, None, f"kind {kind} at {pos}"


def _exercise(data) -> bool:
    """True if the mutant parsed."""
    try:
        g = GGUFFile.from_buffer(data, "mutant.gguf")
    except RaseError:
        return False
    # a mutant that parses: touch every tensor type through the kernels (small tensors whole)
    for t in list(g.tensors.values())[:12]:
        try:
            if t.nbytes <= 4 << 20:
                dequantize(t)
        except RaseError:
            pass
    return True


@pytest.mark.parametrize("n_mutants", [300])
def test_mutants_of_real_models_never_crash(real_model_path, n_mutants):
    original = real_model_path.read_bytes()
    header_end = GGUFFile(real_model_path).data_offset
    buf = bytearray(original)
    rng = np.random.default_rng(20261129)
    view = memoryview(buf)
    parsed = 0
    for i in range(n_mutants):
        undo, cut, what = _mutate(rng, buf, header_end)
        t0 = time.monotonic()
        try:
            parsed += _exercise(view[:cut] if cut is not None else view)
        except Exception as exc:  # not a RaseError: a bug
            pytest.fail(f"mutant {i} ({what}) raised {type(exc).__name__}: {exc}")
        assert time.monotonic() - t0 < 10, f"mutant {i} ({what}) took too long"
        for pos, old in undo:
            buf[pos:pos + len(old)] = old
    assert bytes(buf) == original  # undo worked: every mutant differed from the original by one edit
    # both outcomes are exercised: most mutants are rejected, some still parse (e.g. a changed
    # token string) and reach the kernels
    assert n_mutants // 3 < n_mutants - parsed and parsed > 0


def test_mutants_through_mmap(tmp_path, smollm2_path):
    head = smollm2_path.read_bytes()[:4096]
    rng = np.random.default_rng(7)
    for i in range(40):
        data = bytearray(head)
        data[int(rng.integers(0, 64))] = int(rng.integers(0, 256))
        p = tmp_path / f"m{i}.gguf"
        p.write_bytes(bytes(data[: int(rng.integers(1, len(data)))]))
        with pytest.raises(RaseError):
            GGUFFile(p)
