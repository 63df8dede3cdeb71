from __future__ import annotations

import pytest

from rase import BackendUnavailable
from rase.config import default_store, default_threads, physical_cores


def test_thread_count_from_environment(monkeypatch):
    monkeypatch.setenv("RASE_NUM_THREADS", "3")
    assert default_threads() == 3
    for bad in ("0", "-2", "two"):
        monkeypatch.setenv("RASE_NUM_THREADS", bad)
        with pytest.raises(BackendUnavailable, match="RASE_NUM_THREADS"):
            default_threads()


def test_default_thread_policy(monkeypatch):
    monkeypatch.delenv("RASE_NUM_THREADS", raising=False)
    cores = physical_cores()
    assert default_threads() == (cores - 4 if cores >= 12 else cores)
    monkeypatch.setattr("rase.config.physical_cores", lambda: 16)
    assert default_threads() == 12  # hybrid CPUs: every barrier waits for the slowest core
    monkeypatch.setattr("rase.config.physical_cores", lambda: 8)
    assert default_threads() == 8


def test_store_location(monkeypatch, tmp_path):
    monkeypatch.setenv("RASE_STORE", str(tmp_path / "s"))
    assert default_store() == tmp_path / "s"
    monkeypatch.delenv("RASE_STORE")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_store() == tmp_path / "xdg" / "rase"
