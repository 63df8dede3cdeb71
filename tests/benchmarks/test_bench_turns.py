"""benchmarks/bench_turns.py runs (small, rase only) so it cannot rot: the turns after the first
resume from the cache, and a hit answers as the cold run does (the script asserts it)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_turns_benchmark_runs_on_a_hybrid():
    spec = importlib.util.spec_from_file_location("bench_turns", ROOT / "benchmarks" / "bench_turns.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    history, news = bench._conversation(512, 100, 3)
    rows = bench.rase_turns(ROOT / "tests" / "fixtures" / "archs" / "qwen35-tiny-q8_0.gguf", history, news, 1)
    assert [r["prompt"] for r in rows] == [124, 164, 204]
    assert rows[0]["cached"] == 0 and all(r["cached"] == prev["prompt"] + bench.ANSWER - 1
                                           for r, prev in zip(rows[1:], rows))
