"""SessionCache: load once, reuse, reload on change, refuse tampered files, per-model locks."""
from __future__ import annotations

import os
import threading
import time

import pytest

from rase import BackendUnavailable, IntegrityMismatch, QuantType
from rase.engine.decoder import GGUFDecoder
from rase.store.registry import ModelRegistry
from rase.engine.sampling import GenerationConfig
from rase.session.session import SessionCache
from rase.text.textstate import TextState


@pytest.fixture
def store(tmp_path, tiny_models):
    reg = ModelRegistry(tmp_path / "store")
    for name, arch in (("a", "llama"), ("b", "qwen3")):
        dest = tmp_path / f"{name}.gguf"
        dest.write_bytes(tiny_models(arch, QuantType.Q8_0).read_bytes())
        reg.import_local(name, dest)
    return reg


def test_loads_once_and_reuses(store):
    cache = SessionCache()
    first = cache.get_or_load(store, "a")
    assert cache.get_or_load(store, "a") is first and cache.get_or_load(store, "a", "auto") is first
    assert cache.loads == 1 and cache.loaded() == [("a", "auto")]
    assert cache.get_or_load(store, "a", "cpu") is not first  # another device key
    cache.clear()
    assert cache.loaded() == [] and cache.get_or_load(store, "a") is not first


def test_concurrent_first_loads_load_once(store):
    cache, got = SessionCache(), []
    threads = [threading.Thread(target=lambda: got.append(cache.get_or_load(store, "a"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.loads == 1 and all(s is got[0] for s in got)


def test_manifest_change_reloads(store, tmp_path):
    cache = SessionCache()
    first = cache.get_or_load(store, "a")
    store.import_local("a", first.manifest.weights, chat_template="chatml")
    second = cache.get_or_load(store, "a")
    assert second is not first and second.manifest.chat_template == "chatml" and cache.loads == 2
    from tokenizers import Tokenizer, models, pre_tokenizers

    hf = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 7, "world": 9}, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = tmp_path / "tokenizer.json"
    hf.save(str(tok))
    store.attach_tokenizer("a", tok)
    third = cache.get_or_load(store, "a")
    assert third is not second and cache.loads == 3
    assert third.tokenizer.encode("hello world", add_special_tokens=False) == [7, 9]  # the attached one


def test_file_changed_on_disk_is_reverified(store):
    cache = SessionCache()
    s = cache.get_or_load(store, "a")
    path = s.manifest.weights
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched, same bytes
    assert cache.get_or_load(store, "a") is not s and cache.loads == 2
    with open(path, "rb") as fh:
        data = bytearray(fh.read())
    data[100] ^= 0xFF
    with open(path, "wb") as fh:
        fh.write(data)
    with pytest.raises(IntegrityMismatch):
        cache.get_or_load(store, "a")
    assert cache.loaded() == []  # the tampered session was dropped
    data[100] ^= 0xFF
    with open(path, "wb") as fh:
        fh.write(data)
    assert GGUFDecoder(cache.get_or_load(store, "a").plan).prefill([1, 2]).shape == (160,)


def test_unavailable_devices(store):
    for device in ("cuda", "metal", "tpu"):
        with pytest.raises(BackendUnavailable, match="CPU"):
            SessionCache().get_or_load(store, "a", device)


def _busy(session, spans, name):
    start = time.perf_counter()
    config = GenerationConfig(max_tokens=30, temperature=0.0)
    out = session.worker.submit([1, 2, 3], config, TextState.for_tokenizer(session.tokenizer)).result()
    assert out.completion_tokens == 30
    spans.append((name, start, time.perf_counter(), session.worker))


def test_same_model_shares_its_worker_different_models_overlap(store):
    """Requests for one model are rows of its one worker's steps (never a second forward beside
    it); different models have different workers, which run at the same time."""
    cache = SessionCache()
    a, b = cache.get_or_load(store, "a"), cache.get_or_load(store, "b")
    spans: list = []
    ts = [threading.Thread(target=_busy, args=(a, spans, "a1")),
          threading.Thread(target=_busy, args=(a, spans, "a2")),
          threading.Thread(target=_busy, args=(b, spans, "b"))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    by = {n: (s, e, w) for n, s, e, w in spans}
    (s1, e1, w1), (s2, e2, w2), (sb, eb, wb) = by["a1"], by["a2"], by["b"]
    assert w1 is w2 is a.worker and wb is b.worker and wb is not w1  # one model: one worker
    assert a.worker.counters["requests"] == 2 and b.worker.counters["requests"] == 1
    first_a = min((s1, e1), (s2, e2))
    assert sb < first_a[1] and first_a[0] < eb  # the other model ran at the same time
