"""The C sampler (_sample.h) against a plain Python statement of the same chain: penalties,
top-k (higher logit first, ties to the lower id), temperature, softmax in double, top-p,
min-p, and the draw from the same seeded xoshiro256** stream."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rase.kernels._kernels import SAMPLE_INVALID, Sampler

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


def reference(logits, counts, temp, top_k, top_p, min_p, rp, pp, fp, rng: Rng, allowed=None, bias=None) -> int:
    """allowed: bool (n,) or None (every id); bias: float32 (n,) added first, or None."""
    f32 = np.float32
    l = logits.astype(np.float32).copy()
    if bias is not None:
        l = (l + bias).astype(np.float32)
    for i in np.flatnonzero(counts):
        v = l[i]
        if rp != 1.0:
            v = f32(v / f32(rp)) if v > 0 else f32(v * f32(rp))
        l[i] = f32(f32(v - f32(pp)) - f32(f32(fp) * f32(counts[i])))
    if not np.isfinite(l).all():
        return -1  # SAMPLE_INVALID, whatever the mask
    ids = range(len(l)) if allowed is None else np.flatnonzero(allowed).tolist()
    if not ids:
        return -2  # SAMPLE_NONE
    if temp == 0.0:
        return max(ids, key=lambda i: (float(l[i]), -i))
    order = sorted(ids, key=lambda i: (-float(l[i]), i))
    keep = order[:top_k] if 0 < top_k < len(order) else order
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


def _mask(bits: np.ndarray) -> np.ndarray:
    return np.packbits(np.concatenate([bits, np.zeros(-len(bits) % 32, bool)]), bitorder="little").view(np.int32).copy()


@pytest.mark.parametrize("case", range(24))
def test_the_block_scans_and_the_radix_sort_keep_the_definition_at_vocabulary_size(case):
    """Vocabulary-sized rows, where the sampler skips 32-id blocks that cannot change the
    answer (greedy, the top-k heap) and sorts every candidate by radix (top_k unset or above a
    quarter of the vocabulary): ties across blocks, -0 against +0, masks with empty words,
    a bias, penalties, and a NaN in a block no comparison would read."""
    rng = np.random.default_rng(1000 + case)
    n = int(rng.choice([4097, 49152, 70001]))
    logits = (rng.standard_normal(n) * rng.uniform(1, 6)).astype(np.float32)
    top = logits.max()
    logits[rng.integers(0, n, 3)] = top  # ties at the top, in different blocks
    logits[rng.integers(0, n, 200)] = np.float32(rng.choice([0.0, -0.0]))  # ties between the signed zeros
    temp = [0.0, 0.8, 1.0, 1.7][case % 4]
    top_k = [0, 40, n // 3, n // 5, 1, 0][case % 6]
    top_p, min_p = [(1.0, 0.0), (0.95, 0.05), (0.5, 0.0)][case % 3]
    allowed = None
    if case % 5 == 1:  # sparse, whole words empty
        allowed = rng.random(n) < 0.01
    elif case % 5 == 3:  # dense, with a run of empty words
        allowed = rng.random(n) < 0.9
        allowed[n // 4: n // 2] = False
    bias = None
    if case % 7 == 2:
        bias = np.zeros(n, np.float32)
        bias[rng.integers(0, n, 20)] = rng.uniform(-100, 100, 20).astype(np.float32)
    rp, pp, fp = (1.3, 0.4, 0.2) if case % 4 == 3 else (1.0, 0.0, 0.0)
    seed = int(rng.integers(0, 2**63))
    s = Sampler(n, temp, top_k, top_p, min_p, rp, pp, fp, seed,
                None if bias is None else {int(i): float(bias[i]) for i in np.flatnonzero(bias)})
    counts = np.zeros(n, np.int64)
    for t in rng.integers(0, n, 8):
        s.accept(int(t))
        counts[t] += 1
    ref_rng, mask = Rng(seed), None if allowed is None else _mask(allowed)
    for _ in range(3):
        want = reference(logits, counts, temp, top_k, top_p, min_p, rp, pp, fp, ref_rng, allowed, bias)
        assert s.sample(logits, mask) == want
    bad = logits.copy()
    bad[-1] = np.nan  # the last block: below every threshold
    assert s.sample(bad, mask) == SAMPLE_INVALID


def test_signed_zeros_tie_and_keep_id_order_in_the_full_sort():
    """-0 == +0, so among the zeros the lower id comes first (as in qsort's comparator), even
    though their bits differ: the radix key folds -0 onto +0. The zeros are the top values
    here, so the draws land among them and their order decides the id."""
    rng = np.random.default_rng(7)
    n = 5000
    logits = (-np.abs(rng.standard_normal(n)) * 5 - 1).astype(np.float32)
    zeros = rng.choice(n, 300, replace=False)
    logits[zeros] = np.where(rng.random(300) < 0.5, np.float32(0.0), np.float32(-0.0))
    s, ref_rng = Sampler(n, 1.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0, 99), Rng(99)
    got = [s.sample(logits) for _ in range(50)]
    want = [reference(logits, np.zeros(n), 1.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0, ref_rng) for _ in range(50)]
    assert got == want and len(set(got) & set(zeros.tolist())) > 10


def test_a_fork_draws_as_its_sampler_will_after_as_many_draws():
    """Speculation's rows: fork(i) samples as the sampler itself does i draws later, and skip(m)
    brings the sampler there."""
    rng = np.random.default_rng(5)
    rows = [rng.standard_normal(300).astype(np.float32) for _ in range(6)]
    alone = Sampler(300, 0.9, 40, 0.95, 0.0, 1.0, 0.0, 0.0, 21)
    expected = [alone.sample(r) for r in rows]
    s = Sampler(300, 0.9, 40, 0.95, 0.0, 1.0, 0.0, 0.0, 21)
    forks = [s.fork(i) for i in range(1, 6)]
    assert [s.sample(rows[0])] + [f.sample(r) for f, r in zip(forks, rows[1:])] == expected
    again = Sampler(300, 0.9, 40, 0.95, 0.0, 1.0, 0.0, 0.0, 21)
    again.sample(rows[0])
    again.skip(2)
    assert again.sample(rows[3]) == expected[3]
    reused = s.fork(3, forks[0])
    assert reused is forks[0]
    # penalties and a bias carry over, the fork's counts with the tokens it is told were accepted
    p = Sampler(300, 0.9, 40, 0.95, 0.0, 1.3, 0.2, 0.1, 8, {3: 1.0})
    q = Sampler(300, 0.9, 40, 0.95, 0.0, 1.3, 0.2, 0.1, 8, {3: 1.0})
    for t in (5, 7, 7):
        p.accept(t)
        q.accept(t)
    first = q.sample(rows[0])
    q.accept(first)
    assert p.fork(1, None, [first]).sample(rows[1]) == q.sample(rows[1])
