"""benchmarks/bench_decode.py keeps working: the rase worker's figures (decode after a depth
included) and the report's path without llama.cpp, on the real demo model."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_decode  # noqa: E402

pytestmark = pytest.mark.needs_model  # every test here runs a real model (tests/conftest.py)


def test_rase_worker_measures_decode_at_depth(smollm2_path, monkeypatch):
    monkeypatch.setattr(bench_decode, "PP", 64)
    monkeypatch.setattr(bench_decode, "TG", 16)
    out = bench_decode.worker_rase(str(smollm2_path), 2, depth=300)
    assert set(out) == {"load", "ttft", "pp", "tg", "rss_mb", "tg_depth"}
    assert all(out[k] > 0 for k in out)


def test_report_without_llamacpp_says_so(smollm2_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_decode, "PP", 32)
    monkeypatch.setattr(bench_decode, "TG", 8)
    bench_decode.bench(str(smollm2_path), 1, 1, "/nonexistent/python", [], depth=40)
    text = capsys.readouterr().out
    assert "rase " in text and "roofline:" in text and "llama.cpp: absent" in text
