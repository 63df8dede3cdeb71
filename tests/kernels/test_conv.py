"""rase/kernels/_conv.h: the recurrent layers' causal convolution and LFM2's gated use of it. Every ISA
equals the scalar C reference and the numpy spec (tests/support/reference.py) bit for bit, for any channel
range (a thread's share) and however a sequence's positions are split into calls (a prompt's
chunks: the state carries them)."""
from __future__ import annotations

import numpy as np
import pytest

from rase.kernels import _kernels
from tests.support.reference import causal_conv as conv_spec
from tests.support.reference import shortconv as spec

E = 72  # not a multiple of 16 or 8: every vector path has a tail


def _inputs(seed: int, T: int, L: int = 3):
    rng = np.random.default_rng(seed)
    bcx = rng.standard_normal((T, 3 * E)).astype(np.float32)
    w = rng.standard_normal((L, E)).astype(np.float32)
    return bcx, w


@pytest.mark.parametrize("isa", _kernels.isa_supported())
@pytest.mark.parametrize("L", [2, 3, 4])
def test_every_isa_equals_the_spec(isa, L):
    bcx, w = _inputs(L, 9, L)
    state = np.random.default_rng(7).standard_normal((L - 1, E)).astype(np.float32)
    for given in (None, state):
        y, after = _kernels.shortconv(bcx, w, given, isa=isa)
        want_y, want_after = spec(bcx, w, given)
        assert y.tobytes() == want_y.tobytes() and after.tobytes() == want_after.tobytes(), (isa, L, given is None)
        ref_y, ref_after = _kernels.shortconv(bcx, w, given, isa="scalar")
        assert y.tobytes() == ref_y.tobytes() and after.tobytes() == ref_after.tobytes()


@pytest.mark.parametrize("isa", _kernels.isa_supported())
@pytest.mark.parametrize("L", [2, 4, 8])
def test_the_plain_convolution_equals_the_spec(isa, L):
    rng = np.random.default_rng(L)
    x, w = rng.standard_normal((7, E)).astype(np.float32), rng.standard_normal((L, E)).astype(np.float32)
    state = rng.standard_normal((L - 1, E)).astype(np.float32)
    for given in (None, state):
        y, after = _kernels.causal_conv(x, w, given, isa=isa)
        want_y, want_after = conv_spec(x, w, given)
        assert y.tobytes() == want_y.tobytes() and after.tobytes() == want_after.tobytes(), (isa, L)
        head, mid = _kernels.causal_conv(x[:3], w, given, isa=isa)  # a chunk, then the rest from its state
        tail, end = _kernels.causal_conv(x[3:], w, mid, isa=isa)
        assert np.concatenate([head, tail]).tobytes() == y.tobytes() and end.tobytes() == after.tobytes()


@pytest.mark.parametrize("isa", _kernels.isa_supported())
def test_channel_ranges_and_chunks_change_no_bit(isa):
    bcx, w = _inputs(11, 12)
    whole, end = _kernels.shortconv(bcx, w, isa=isa)
    parts = [_kernels.shortconv(bcx, w, isa=isa, c0=a, c1=b) for a, b in ((0, 5), (5, 37), (37, E))]
    assert np.sum([p[0] for p in parts], axis=0).tobytes() == whole.tobytes()
    state, ys = None, []
    for lo, hi in ((0, 1), (1, 5), (5, 6), (6, 12)):  # a prompt in chunks: each starts from the state before
        y, state = _kernels.shortconv(bcx[lo:hi], w, state, isa=isa)
        ys.append(y)
    assert np.concatenate(ys).tobytes() == whole.tobytes() and state.tobytes() == end.tobytes()


def test_the_state_is_the_last_inputs_and_binds():
    bcx, w = _inputs(3, 4)
    y, after = _kernels.shortconv(bcx, w)
    bx = bcx[:, :E] * bcx[:, 2 * E:]
    assert after.tobytes() == bx[-2:].tobytes()
    moved, _ = _kernels.shortconv(bcx, w, np.ones((2, E), np.float32))
    assert not np.array_equal(moved[0], y[0]) and np.array_equal(moved[2:], y[2:])  # the window is 3 positions


def test_bad_shapes_are_refused():
    bcx, w = _inputs(0, 2)
    with pytest.raises(ValueError):
        _kernels.shortconv(bcx[:, :-1], w)
    with pytest.raises(ValueError):
        _kernels.shortconv(bcx, w, np.zeros((3, E), np.float32))
    with pytest.raises(ValueError):
        _kernels.shortconv(bcx, np.zeros((12, E), np.float32).reshape(12, E)[:, :E])
