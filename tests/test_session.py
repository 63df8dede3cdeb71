"""SessionCache: load once, reuse, reload on change, refuse tampered files, per-model locks."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from rase import BackendUnavailable, IntegrityMismatch, QuantType
from rase.registry import ModelRegistry
from rase.session import SessionCache


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
    assert cache.get_or_load(store, "a").decoder.prefill([1, 2]).shape == (160,)


def test_unavailable_devices(store):
    for device in ("cuda", "metal", "tpu"):
        with pytest.raises(BackendUnavailable, match="CPU"):
            SessionCache().get_or_load(store, "a", device)


def _busy(session, spans, name):
    with session.lock:
        start = time.perf_counter()
        logits = session.decoder.prefill([1, 2, 3])
        for _ in range(30):
            logits = session.decoder.decode(int(np.argmax(logits)))
        spans.append((name, start, time.perf_counter()))


def test_same_model_serializes_different_models_overlap(store):
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
    by = {n: (s, e) for n, s, e in spans}
    (s1, e1), (s2, e2), (sb, eb) = by["a1"], by["a2"], by["b"]
    assert e1 <= s2 or e2 <= s1  # one model: one generation at a time
    first_a = min((s1, e1), (s2, e2))
    assert sb < first_a[1] and first_a[0] < eb  # the other model ran at the same time
