"""The soak (tests/support/soak.py) at full size against a real `rase serve`: mixed requests from 16
concurrent clients, some dropped mid-stream; no unexpected answer, every KV block free after,
no thread left behind, and RSS flat between the 200th and the last request.
benchmarks/bench_soak.py runs it standalone (any size, any model)."""
from __future__ import annotations

import pytest

from tests.support.servers import rase_serve
from tests.support.soak import soak, warm_up

pytestmark = pytest.mark.needs_model  # every test here runs a real model (tests/conftest.py)

N = 1000  # the full size: about 30 s here


@pytest.fixture(scope="module")
def store(smollm2_store):
    return smollm2_store


def test_soak_mixed_requests_from_16_clients(store):
    with rase_serve(store, "--threads", "2", with_process=True) as (base, proc):
        w = warm_up(base, proc.pid)  # every kind seen, the executor at its full size
        r = soak(base, proc.pid, N, seed=2, rss_at=(200,))
    print(f"\nsoak: {r.requests} requests in {r.seconds:.1f} s, {r.by_kind}, threads {r.threads}, "
          f"after 200/{N}: threads {r.threads_at}, RSS {r.rss_kb} kB, cancelled {r.health['cancelled']}")
    assert r.requests == N and not r.unexpected and not w.unexpected, (r.unexpected + w.unexpected)[:5]
    assert {"chat", "stream", "drop", "complete", "n2", "json", "tokenize", "embed", "bad"} <= set(r.by_kind)
    h = r.health
    assert h["running"] == 0 and h["waiting"] == 0 and h["kv_blocks_used"] == 0, h
    assert all(m["kv_blocks_reserved"] == 0 for m in h["models"].values()), h
    assert h["cancelled"] >= r.by_kind["drop"] // 2  # dropped streams were cancelled, not run out
    # threads: every pool was grown by the warm-up, so a thread more at any count is one left behind
    assert r.threads[1] <= r.threads[0] and r.threads_at[N] <= r.threads_at[200], (r.threads, r.threads_at)
    assert abs(r.rss_kb[N] / r.rss_kb[200] - 1) < 0.05, r.rss_kb
