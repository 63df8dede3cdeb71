"""rase/kernels/_deltanet.h: Qwen3.5's gated delta rule for one value head over one token. Each ISA equals
the numpy spec (tests/support/reference.py: ggml_vec_dot_f32's x86 order, or the scalar build's double
sums) bit for bit; tokens in turn carry the state, so a prompt's chunks give the one-token bits;
and the helpers around it are llama.cpp's f32 unary ops."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rase.kernels import _kernels
from tests.support.reference import delta_step as spec


def _token(rng, S: int):
    q, k = (rng.standard_normal(S).astype(np.float32) / np.float32(math.sqrt(S)) for _ in range(2))
    v = rng.standard_normal(S).astype(np.float32)
    return q, k, v, float(np.float32(-abs(rng.standard_normal()))), float(np.float32(rng.uniform(0.05, 0.95)))


@pytest.mark.parametrize("isa", _kernels.isa_supported())
@pytest.mark.parametrize("S", [32, 64, 128])
def test_every_isa_equals_the_spec_over_a_sequence(isa, S):
    rng = np.random.default_rng(S)
    state = want = np.zeros((S, S), np.float32)
    for _ in range(6):  # the state each token leaves is the next one's
        q, k, v, g, beta = _token(rng, S)
        o, state = _kernels.delta_step(state, q, k, v, g, beta, isa=isa)
        want_o, want = spec(want, q, k, v, g, beta, simd=isa != "scalar")
        assert o.tobytes() == want_o.tobytes() and state.tobytes() == want.tobytes(), isa


def test_the_state_carries_and_decays():
    rng = np.random.default_rng(0)
    q, k, v, _, beta = _token(rng, 32)
    _, state = _kernels.delta_step(np.zeros((32, 32), np.float32), q, k, v, -0.5, beta)
    kept, _ = _kernels.delta_step(state, q, k, v, -0.5, beta)
    forgot, _ = _kernels.delta_step(state, q, k, v, -200.0, beta)  # exp(g) = 0: nothing carries
    fresh, _ = _kernels.delta_step(np.zeros((32, 32), np.float32), q, k, v, -0.5, beta)
    assert forgot.tobytes() == fresh.tobytes() and not np.array_equal(kept, fresh)


def test_bad_shapes_are_refused():
    q = np.zeros(24, np.float32)
    with pytest.raises(ValueError, match="multiple of 16"):
        _kernels.delta_step(np.zeros((24, 24), np.float32), q, q, q, 0.0, 0.5)
    with pytest.raises(ValueError):
        _kernels.delta_step(np.zeros((32, 16), np.float32), *(np.zeros(32, np.float32),) * 3, 0.0, 0.5)
