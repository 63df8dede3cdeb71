"""How long models stay loaded: durations, the keep-alive reaper, Engine.load / unload / status,
and, against a real `rase serve` with SmolLM2 under two ids, loading and unloading one model
while the other answers (its latency, the memory given back, /api/ps and /v1/models)."""
from __future__ import annotations

import statistics
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

from rase import InvalidRequest, QuantType
from rase.api import Engine
from rase.errors import ModelUnloaded
from rase.engine.config import parse_duration
from rase.session.lifecycle import KeepAlive
from rase.store.registry import ModelRegistry
from tests.support.servers import rase_serve

ASK = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize("given,seconds", [(0, 0.0), (30, 30.0), (-1, None), ("-1", None), ("5m", 300.0),
                                           ("1h30m", 5400.0), ("250ms", 0.25), ("1.5h", 5400.0), ("12", 12.0),
                                           ("", False)])  # "": as it was
def test_durations_read_as_ollama_writes_them(given, seconds):
    assert parse_duration(given) == seconds


@pytest.mark.parametrize("bad", ["5x", "m5", "1h 2m", "-", True, None, [1]])
def test_a_bad_duration_is_refused_by_name(bad):
    with pytest.raises(InvalidRequest, match="keep_alive"):
        parse_duration(bad)


@pytest.fixture
def store(tmp_path, tiny_models):
    reg = ModelRegistry(tmp_path / "store")
    for model in ("a", "b"):
        reg.import_local(model, tiny_models("llama", QuantType.Q8_0))
    return tmp_path / "store"


def _wait(predicate, timeout=5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_an_idle_model_unloads_after_its_keep_alive_and_loads_again(store):
    with Engine(store, keep_alive="300ms") as engine:
        assert engine.status("a") == "unloaded"
        engine.chat("a", ASK, max_tokens=4)
        engine.load("b", keep_alive=-1)  # b stays
        assert engine.status("a") == engine.status("b") == "loaded"
        assert _wait(lambda: engine.status("a") == "unloaded")
        time.sleep(0.6)
        assert engine.status("b") == "loaded" and engine.lifecycle.expires("b", time.monotonic()) is None
        loads = engine.sessions.loads
        assert engine.chat("a", ASK, max_tokens=4).completion_tokens == 4
        assert engine.sessions.loads == loads + 1
        engine.load("a", keep_alive=0)  # as soon as it is idle
        assert _wait(lambda: engine.status("a") == "unloaded", 2.0)


class _Sessions:
    """A SessionCache stand-in: models whose workers are busy or not."""

    def __init__(self, **busy):
        self.busy, self.unloaded = busy, []

    def sessions(self):
        return [((m, "auto"), SimpleNamespace(worker=SimpleNamespace(busy=b))) for m, b in self.busy.items()]

    def unload(self, model):
        self.unloaded.append(model)
        del self.busy[model]


def test_the_reaper_counts_idle_time_only():
    sessions = _Sessions(a=True, b=False, c=False)
    keeper = KeepAlive(sessions, default=10.0)
    keeper.keep("c", None)  # c stays
    assert keeper.tick(100.0) == [] and keeper.expires("b", 100.0) == 110.0
    assert keeper.expires("a", 105.0) == 115.0  # busy: its idle time has not started
    assert keeper.tick(109.9) == []
    assert keeper.tick(110.0) == ["b"]
    sessions.busy["a"] = False
    assert keeper.tick(111.0) == [] and keeper.tick(120.9) == [] and keeper.tick(121.0) == ["a"]
    assert keeper.tick(10_000.0) == [] and sessions.unloaded == ["b", "a"]
    keeper.close()


def test_a_request_racing_an_unload_is_served_by_a_fresh_load(store):
    with Engine(store) as engine:
        stale = engine.session("a")
        stale.worker.close()  # what an unload does to the session a request already holds
        with pytest.raises(ModelUnloaded):
            stale.worker.submit([1, 2, 3], __import__("rase.engine.sampling", fromlist=["GenerationConfig"]).GenerationConfig(max_tokens=2), None)
        assert engine.chat("a", ASK, max_tokens=3).completion_tokens == 3
        assert engine.session("a") is not stale


# ---------------------------------------------------------------- a real server

def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def _ask(base: str, model: str, max_tokens: int = 16) -> None:
    r = httpx.post(f"{base}/v1/chat/completions", json={"model": model, "messages": ASK, "max_tokens": max_tokens,
                                                         "temperature": 0}, timeout=120)
    assert r.status_code == 200, r.text


def _gaps(base: str, model: str, stop: threading.Event, out: list) -> None:
    """Seconds between streamed tokens of model's answers, answer after answer, until stop."""
    while not stop.is_set():
        body = {"model": model, "messages": ASK, "max_tokens": 120, "temperature": 0.8, "stream": True}
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=120) as r:
            last = None
            for line in r.iter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    now = time.perf_counter()
                    if last is not None:
                        out.append((last, now))
                    last = now


@pytest.mark.needs_model
def test_loading_and_unloading_one_model_while_another_answers(smollm2_path, tmp_path):
    reg = ModelRegistry(tmp_path / "store")
    for model in ("chat", "other"):
        reg.import_local(model, smollm2_path)
    with rase_serve(tmp_path / "store", "--threads", "2", "-np", "2", with_process=True) as (base, proc):
        assert httpx.post(f"{base}/models/load", json={"model": "chat"}, timeout=120).json() == {"success": True}
        alone, stop = [], threading.Event()
        streamer = threading.Thread(target=_gaps, args=(base, "chat", stop, alone))
        streamer.start()
        time.sleep(2.0)
        stop.set()
        streamer.join()
        during, loads, rss, stop = [], [], [], threading.Event()
        streamer = threading.Thread(target=_gaps, args=(base, "chat", stop, during))
        streamer.start()
        try:
            time.sleep(0.3)
            for _ in range(3):
                before = _rss_mb(proc.pid)
                t0 = time.perf_counter()
                assert httpx.post(f"{base}/models/load", json={"model": "other"}, timeout=120).status_code == 200
                loads.append((t0, time.perf_counter()))
                _ask(base, "other")
                ps = {m["name"] for m in httpx.get(f"{base}/api/ps").json()["models"]}
                cards = {m["id"]: m["status"]["value"] for m in httpx.get(f"{base}/v1/models").json()["data"]}
                assert ps == {"chat", "other"} and cards == {"chat": "loaded", "other": "loaded"}
                loaded = _rss_mb(proc.pid)
                assert httpx.post(f"{base}/models/unload", json={"model": "other"}).json() == {"success": True}
                assert _wait(lambda: _rss_mb(proc.pid) < loaded - 50, 10.0), (before, loaded, _rss_mb(proc.pid))
                rss.append((before, loaded, _rss_mb(proc.pid)))
                assert {m["name"] for m in httpx.get(f"{base}/api/ps").json()["models"]} == {"chat"}
                assert {m["id"]: m["status"]["value"] for m in httpx.get(f"{base}/v1/models").json()["data"]} == \
                    {"chat": "loaded", "other": "unloaded"}
        finally:
            stop.set()
            streamer.join()
        r = httpx.post(f"{base}/models/unload", json={"model": "other"})
        assert r.status_code == 409 and "not loaded" in r.json()["error"]["message"]
    # the gaps between 'chat' tokens that overlap a load of 'other'
    overlapping = [b - a for a, b in during if any(a < t1 and b > t0 for t0, t1 in loads)]
    load_s = statistics.median(t1 - t0 for t0, t1 in loads)
    typical = statistics.median(b - a for a, b in alone)
    print(f"\n'chat' token gaps: median {typical * 1e3:.1f} ms alone; while 'other' loads ({load_s * 1e3:.0f} ms "
          f"each, 3 times): {len(overlapping)} gaps, median {statistics.median(overlapping) * 1e3:.1f} ms, max "
          f"{max(overlapping) * 1e3:.1f} ms; RSS MB before / loaded / after unload: {rss}")
    # the two cores are shared with the load, so gaps widen; a request that waited for the load
    # would show one gap as long as the load itself
    assert len(overlapping) >= 10 and max(overlapping) < load_s / 2
