"""The GIL is released for the forward: a Python thread keeps ticking while a model generates."""
from __future__ import annotations

import threading
import time

import numpy as np

from rase.decoder import load_gguf_decoder


def _tick_rate(seconds: float, stop: threading.Event | None = None) -> float:
    """Ticks per second of a loop sleeping 1 ms, measured for `seconds` (or until stop)."""
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds and not (stop and stop.is_set()):
        time.sleep(0.001)
        n += 1
    return n / (time.perf_counter() - start)


def test_ticker_keeps_its_rate_while_generating(smollm2_path):
    dec = load_gguf_decoder(None, smollm2_path)
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
