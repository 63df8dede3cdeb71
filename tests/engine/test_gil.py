"""The GIL is released for the forward: a Python thread keeps ticking while a model generates."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from rase.engine.decoder import load_gguf_decoder
from tests.support.models import QWEN3_TINY

pytestmark = pytest.mark.needs_model  # every test here runs a real model (tests/conftest.py)


def _tick_rate(seconds: float, stop: threading.Event | None = None) -> float:
    """Ticks per second of a loop sleeping 1 ms, measured for `seconds` (or until stop)."""
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds and not (stop and stop.is_set()):
        time.sleep(0.001)
        n += 1
    return n / (time.perf_counter() - start)


# The forwards below run on one thread so that a core stays free for the ticker: on a 2-core
# machine a 2-thread forward takes both cores and the ticker would measure CPU share, not the GIL.
def test_ticker_keeps_its_rate_while_generating(smollm2_path):
    dec = load_gguf_decoder(None, smollm2_path, n_threads=1)
    dec.prefill([1, 2, 3])  # warm up: first-touch page faults out of the measurement
    unloaded = _tick_rate(1.0)
    done = threading.Event()
    rates: list[float] = []

    def ticker() -> None:
        rates.append(_tick_rate(60.0, done))

    t = threading.Thread(target=ticker)
    t.start()
    time.sleep(0.05)
    started = time.perf_counter()
    logits = dec.prefill([504, 3575, 282, 4649, 314])
    for _ in range(64):
        logits = dec.decode(int(np.argmax(logits)))
    generating = time.perf_counter() - started
    done.set()
    t.join()
    print(f"unloaded {unloaded:.0f}/s, while generating {rates[0]:.0f}/s over {generating:.2f}s")
    assert generating > 0.1  # the generation really overlapped the measurement
    assert rates[0] >= 0.8 * unloaded


def test_generation_survives_an_oversubscribed_machine(smollm2_path):
    """Barrier waits spin briefly, then yield: with every core busy elsewhere a 2-thread
    forward slows down in proportion, instead of spinning through its time slices."""
    import subprocess
    import sys

    dec = load_gguf_decoder(None, smollm2_path, n_threads=2)

    def run() -> float:
        start = time.perf_counter()
        logits = dec.prefill([504, 3575, 282, 4649, 314])
        for _ in range(16):
            logits = dec.decode(int(np.argmax(logits)))
        return time.perf_counter() - start

    run()
    quiet = min(run() for _ in range(3))
    # the neighbours are other 2-thread forward loops: barrier waits on both sides
    hog = ("import sys; sys.path.insert(0, %r)\n"
           "from rase.engine.decoder import load_gguf_decoder\n"
           "d = load_gguf_decoder(None, %r, n_threads=2)\n"
           "d.prefill([1, 2, 3, 4, 5, 6, 7, 8]); print('ready', flush=True)\n"
           "while True: d.prefill([1, 2, 3, 4, 5, 6, 7, 8])\n") % (str(QWEN3_TINY.parent.parent.parent),
                                                                 str(QWEN3_TINY / "qwen3-tiny-q8_0.gguf"))

    def median_with_neighbours() -> float:
        hogs = [subprocess.Popen([sys.executable, "-c", hog], stdout=subprocess.PIPE, text=True)
                for _ in range(2)]
        try:
            assert [h.stdout.readline() for h in hogs] == ["ready\n"] * 2
            return sorted(run() for _ in range(5))[2]
        finally:
            for h in hogs:
                h.kill()
                h.wait()
                h.stdout.close()

    # fair share is ~3x (6 runnable threads on 2 cores). Medians of 5 measured on a 2-core Zen 5:
    # 1.3-4.2x with yielding barriers, but ~1 set in 10 lands in a host-scheduler regime at
    # ~35x that lasts seconds; 9.5-16x every time when barriers spin without end. So up to
    # three fresh sets of neighbours, and the bar between the two.
    medians = []
    for _ in range(3):
        medians.append(median_with_neighbours() / quiet)
        if medians[-1] < 7:
            break
    print(f"quiet {quiet:.3f}s; medians with 2 busy processes " + " ".join(f"{m:.1f}x" for m in medians))
    assert medians[-1] < 7


def test_ticker_keeps_its_rate_while_four_requests_are_served_together(smollm2_path, tmp_path):
    """Whole batched steps (forward and sampling of every row) run without the GIL: a Python
    ticker keeps its rate while the worker decodes 4 streams at once."""
    from rase.api import Engine
    from rase.store.registry import ModelRegistry

    ModelRegistry(tmp_path).import_local("smollm2", smollm2_path)
    engine = Engine(tmp_path, max_batch=4, n_threads=1)
    engine.chat("smollm2", [{"role": "user", "content": "Hi"}], max_tokens=2)  # load and warm up
    unloaded = _tick_rate(1.0)
    handles = [engine.submit_chat("smollm2", [{"role": "user", "content": f"Tell me a story about {w}."}],
                                  temperature=0.8, seed=i, max_tokens=96)
               for i, w in enumerate(("cats", "ships", "rain", "bread"))]
    worker = engine.session("smollm2").worker
    deadline = time.monotonic() + 60
    while worker.scheduler.stats()["running"] < 4:  # measure only while all four decode
        assert time.monotonic() < deadline, "four requests never ran together"
        time.sleep(0.001)
    rates: list[float] = []
    done = threading.Event()
    t = threading.Thread(target=lambda: rates.append(_tick_rate(60.0, done)))
    started = time.perf_counter()
    t.start()
    while worker.scheduler.stats()["running"] == 4 and time.perf_counter() - started < 2.0:
        time.sleep(0.01)
    done.set()
    t.join()
    overlapped = time.perf_counter() - started
    outs = [h.result(timeout=120) for h in handles]
    print(f"unloaded {unloaded:.0f}/s, while serving 4 {rates[0]:.0f}/s over {overlapped:.2f}s")
    assert overlapped > 0.2 and all(o.completion_tokens > 0 for o in outs)
    assert rates[0] >= 0.8 * unloaded
