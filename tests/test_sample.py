"""The C sampler (_sample.h) against a plain Python statement of the same chain: penalties,
top-k (higher logit first, ties to the lower id), temperature, softmax in double, top-p,
min-p, and the draw from the same seeded xoshiro256** stream."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rase._kernels import Sampler

MASK = (1 << 64) - 1


class Rng:
    """splitmix64-seeded xoshiro256**, as _sample.h."""

    def __init__(self, seed: int) -> None:
        self.s, x = [], seed
        for _ in range(4):
            x = (x + 0x9E3779B97F4A7C15) & MASK
            z = x
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
            self.s.append(z ^ (z >> 31))

    def uniform(self) -> float:
        s = self.s
        rotl = lambda v, k: ((v << k) | (v >> (64 - k))) & MASK
        result = (rotl((s[1] * 5) & MASK, 7) * 9) & MASK
        t = (s[1] << 17) & MASK
        s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45)
        return (result >> 11) * 2.0 ** -53


def reference(logits, counts, temp, top_k, top_p, min_p, rp, pp, fp, rng: Rng) -> int:
    f32 = np.float32
    l = logits.astype(np.float32).copy()
    for i in np.flatnonzero(counts):
        v = l[i]
        if rp != 1.0:
            v = f32(v / f32(rp)) if v > 0 else f32(v * f32(rp))
        l[i] = f32(f32(v - f32(pp)) - f32(f32(fp) * f32(counts[i])))
    if temp == 0.0:
        return int(np.argmax(l))
    order = sorted(range(len(l)), key=lambda i: (-float(l[i]), i))
    keep = order[:top_k] if 0 < top_k < len(l) else order
    t = float(f32(temp))
    peak = float(l[keep[0]]) / t
    w = [float(f32(math.exp(float(l[i]) / t - peak))) for i in keep]
    total = sum(math.exp(float(l[i]) / t - peak) for i in keep)
    m = len(keep)
    if top_p < 1.0:
        cum = 0.0
        for j in range(m):
            cum += w[j] / total
            if cum >= float(f32(top_p)):
                m = j + 1
                break
    if min_p > 0.0:
        floor_w, j = float(f32(min_p)) * w[0], 1
        while j < m and w[j] >= floor_w:
            j += 1
        m = j
    r = rng.uniform() * sum(w[:m])
    for j in range(m):
        r -= w[j]
        if r < 0.0:
            return keep[j]
    return keep[m - 1]


@pytest.mark.parametrize("case", range(40))
def test_c_sampler_equals_the_reference(case):
    rng = np.random.default_rng(case)
    n = int(rng.choice([5, 60, 3000]))
    logits = (rng.standard_normal(n) * rng.uniform(0.5, 4)).astype(np.float32)
    if case % 4 == 0:
        logits[rng.integers(0, n, 4)] = logits.max()  # ties at the top
    cfg = dict(temperature=float(rng.choice([0.0, 0.4, 1.0])), top_k=int(rng.choice([0, 1, 3, 40])),
               top_p=float(rng.choice([1.0, 0.8])), min_p=float(rng.choice([0.0, 0.1])),
               repeat_penalty=float(rng.choice([1.0, 1.2])), presence_penalty=float(rng.choice([0.0, 0.4])),
               frequency_penalty=float(rng.choice([0.0, 0.3])))
    seed = int(rng.integers(0, 2**63))
    s = Sampler(n, seed=seed, **cfg)
    counts = np.zeros(n, np.int64)
    for t in rng.integers(0, n, 6):
        s.accept(int(t))
        counts[t] += 1
    ref_rng = Rng(seed)
    for _ in range(4):
        want = reference(logits, counts, cfg["temperature"], cfg["top_k"], cfg["top_p"], cfg["min_p"],
                         cfg["repeat_penalty"], cfg["presence_penalty"], cfg["frequency_penalty"], ref_rng)
        assert s.sample(logits) == want
