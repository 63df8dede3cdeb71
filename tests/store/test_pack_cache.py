"""Repacked weights on disk (rase/store/pack_cache.py): a later load maps them and gets the same
logits; any change to the model file or to the cache file is a miss, never wrong weights."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from rase import QuantType
from rase.engine.decoder import load_gguf_decoder
from rase.store.pack_cache import PackCache
from rase.store.plan import load_plan
from tests.support.packing import wait_for_saves

TOKENS = [1, 5, 9, 33, 77, 100, 3, 4]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "packed"
    monkeypatch.setenv("RASE_PACK_CACHE", str(d))
    return d


def _logits(path) -> np.ndarray:
    return load_gguf_decoder(None, path).prefill(TOKENS, all_logits=True)


@pytest.mark.parametrize("qtype", [QuantType.Q8_0, QuantType.Q4_0, QuantType.Q4_1, QuantType.Q5_0])
def test_a_second_load_maps_the_packed_weights_and_gives_the_same_logits(tmp_path, cache_dir, tiny_models, qtype):
    path = tmp_path / "m.gguf"
    path.write_bytes(tiny_models("qwen3", qtype).read_bytes())
    first = load_plan(path)
    assert first.weights.repacked  # a miss: repacked here
    want = _logits(path)
    wait_for_saves()
    assert list(cache_dir.glob("*.r16")) and list(cache_dir.glob("*.ok"))
    again = load_plan(path)
    assert again.weights.repacked == {}  # every packed matrix came from the file
    assert np.array_equal(_logits(path), want)


def test_a_changed_model_file_or_cache_file_is_a_miss(tmp_path, cache_dir, tiny_models):
    path = tmp_path / "m.gguf"
    path.write_bytes(tiny_models("llama", QuantType.Q8_0).read_bytes())
    want = _logits(path)
    wait_for_saves()
    [r16] = cache_dir.glob("*.r16")
    data = bytearray(r16.read_bytes())
    data[-100:] = b"\x7f" * 100  # tampered weights: the file's size/mtime no longer match
    r16.write_bytes(bytes(data))
    assert PackCache(path).load() is None
    assert load_plan(path).weights.repacked and np.array_equal(_logits(path), want)
    wait_for_saves()
    os.utime(path, ns=(1, 1))  # the model file changed: another key
    assert PackCache(path).load() is None


def test_a_cache_file_with_a_bad_header_is_a_miss_not_a_crash(tmp_path, cache_dir, tiny_models):
    path = tmp_path / "m.gguf"
    path.write_bytes(tiny_models("llama", QuantType.Q4_0).read_bytes())
    load_plan(path)
    wait_for_saves()
    cache = PackCache(path)
    for body in (b"", b"RASEPK01" + b"\xff" * 8, b"RASEPK01" + (5).to_bytes(8, "little") + b"{bad}",
                 b"NOTMAGIC" + b"\0" * 100):
        cache.path.write_bytes(body)
        st = os.stat(cache.path)  # a stamp that matches: only the contents are wrong
        cache.path.with_suffix(".ok").write_text(json.dumps([st.st_size, st.st_mtime_ns, st.st_ino]))
        assert PackCache(path).load() is None
    header = json.dumps({"key": cache.key, "entries": [["output", 4096, 1 << 40]]}).encode()
    cache.path.write_bytes(b"RASEPK01" + len(header).to_bytes(8, "little") + header)
    st = os.stat(cache.path)
    cache.path.with_suffix(".ok").write_text(json.dumps([st.st_size, st.st_mtime_ns, st.st_ino]))
    assert PackCache(path).load() is None  # an entry past the end of the file


def test_disabled_or_unwritable_caches_still_load(tmp_path, monkeypatch, tiny_models):
    path = tiny_models("gemma3", QuantType.Q8_0)
    monkeypatch.setenv("RASE_PACK_CACHE", "off")
    assert not PackCache(path).enabled and load_plan(path).weights.repacked
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("RASE_PACK_CACHE", str(blocked / "sub"))
    assert load_plan(path).weights.repacked
    wait_for_saves()
    assert blocked.read_text() == "not a directory"


def test_the_trim_keeps_the_entry_used_last_not_the_one_written_last(tmp_path, cache_dir, tiny_models, monkeypatch):
    """Over the size cap the least recently *used* entry goes: a model loaded every day keeps
    its pack though it was written before the others."""
    import rase.store.pack_cache as pc

    src = tiny_models("llama", QuantType.Q8_0).read_bytes()
    paths = [tmp_path / f"{name}.gguf" for name in "abc"]
    for p in paths:
        p.write_bytes(src)
    a, b, c = (PackCache(p) for p in paths)
    for p, cache, when in ((paths[0], a, 100), (paths[1], b, 200)):  # written long ago, a first
        load_plan(p)
        wait_for_saves()
        os.utime(cache.path, ns=(when * 10**9,) * 2)
        st = os.stat(cache.path)  # the stamp follows the new mtime: still a valid entry
        cache.path.with_suffix(".ok").write_text(json.dumps([st.st_size, st.st_mtime_ns, st.st_ino]))
        os.utime(cache.path.with_suffix(".ok"), ns=(when * 10**9,) * 2)
    assert load_plan(paths[0]).weights.repacked == {}  # a hit on a: used now
    monkeypatch.setattr(pc, "MAX_BYTES", 2 * os.path.getsize(a.path))
    load_plan(paths[2])  # c written: three entries, room for two
    wait_for_saves()
    assert a.path.exists() and c.path.exists() and not b.path.exists()
    assert not b.path.with_suffix(".ok").exists()
    assert load_plan(paths[0]).weights.repacked == {}


def test_the_file_is_written_in_whole_aligned_windows_with_zeros_between_pieces():
    # windows of 16 bytes: a piece inside one window, one across three, gaps, a short tail
    from rase.store.pack_cache import _windows

    pieces = [(0, memoryview(b"HEAD")), (8, memoryview(bytes(range(1, 41)))), (52, memoryview(b"xyz"))]
    image = bytearray(60)
    for o, data in pieces:
        image[o:o + len(data)] = data
    windows = list(_windows(pieces, 60, window=16))
    assert [len(w) for w in windows] == [16, 16, 16, 12]
    assert b"".join(windows) == bytes(image)


def test_a_saved_cache_file_holds_each_matrix_at_its_header_offset(tmp_path, cache_dir, tiny_models):
    # the file written window by window: every entry's bytes where the header says, zeros between
    path = tmp_path / "m.gguf"
    path.write_bytes(tiny_models("qwen3", QuantType.Q4_1).read_bytes())
    rng = np.random.default_rng(0)  # b crosses a 2 MiB window; no byte is zero
    packed = {n: rng.integers(1, 256, size, dtype=np.uint8) for n, size in (("a", 5000), ("b", 3 << 20), ("c", 3))}
    pc = PackCache(path)
    pc.save(packed)
    got = PackCache(path).load()
    assert set(got) == set(packed)
    for name, arr in packed.items():
        assert np.array_equal(got[name], arr)
    raw = np.frombuffer(pc.path.read_bytes(), np.uint8)
    hlen = int(raw[8:16].view("<u8")[0])
    entries = json.loads(raw[16:16 + hlen].tobytes())["entries"]
    used = np.zeros(raw.size, bool)
    used[:16 + hlen] = True
    for name, off, size in entries:
        assert np.array_equal(raw[off:off + size], packed[name])
        used[off:off + size] = True
    assert raw.size % 4096 == 0 and not raw[~used].any()


def test_dense_models_ask_for_huge_pages_moe_models_do_not(tmp_path, cache_dir, tiny_models, monkeypatch):
    # a dense step reads every page; a MoE step only the chosen experts' (benchmarks/bench_moe.py)
    from pathlib import Path

    asked = []
    real = PackCache.load

    def load(self, huge_pages=False):
        asked.append(huge_pages)
        return real(self, huge_pages)

    monkeypatch.setattr(PackCache, "load", load)
    moe = Path(__file__).parents[1] / "fixtures" / "archs" / "olmoe-tiny-q4_k_m.gguf"
    for src in (tiny_models("qwen3", QuantType.Q4_1), moe):
        path = tmp_path / src.name
        path.write_bytes(src.read_bytes())
        load_plan(path)
        wait_for_saves()
        load_plan(path)  # a hit: mapped with or without huge pages
    assert asked == [True, True, False, False]


def test_prepare_writes_the_cache_so_the_first_load_repacks_nothing(tmp_path, cache_dir, tiny_models):
    from rase.store.plan import prepare

    path = tmp_path / "m.gguf"
    path.write_bytes(tiny_models("qwen3", QuantType.Q4_0).read_bytes())
    packed = prepare(path)
    assert packed > 0 and list(cache_dir.glob("*.r16"))  # written before prepare returned
    assert prepare(path) == 0  # already there
    plan = load_plan(path)
    assert plan.weights.repacked == {} and plan.weights.packed_bytes == packed
    first = _logits(path)
    cold = tmp_path / "cold"
    os.environ["RASE_PACK_CACHE"] = str(cold)  # restored by the cache_dir fixture's monkeypatch
    assert load_plan(path).weights.repacked  # repacked here: the same logits either way
    assert np.array_equal(_logits(path), first)
    wait_for_saves()


def test_prepare_does_nothing_with_the_cache_off(tmp_path, monkeypatch, tiny_models):
    from rase.store.plan import prepare

    monkeypatch.setenv("RASE_PACK_CACHE", "off")
    assert prepare(tiny_models("qwen3", QuantType.Q4_0)) == 0
