"""Coverage-guided fuzzing of the GGUF reader (tests/support/fuzz_gguf.py, atheris) for a bounded time in
CI, and every input it ever crashed on (tests/fixtures/gguf-crashes/) as a regression test."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fuzz_gguf import exercise, seeds

ROOT = Path(__file__).resolve().parents[2]
CRASHES = sorted((ROOT / "tests" / "fixtures" / "gguf-crashes").iterdir())
SECONDS = 60


def _peak_rss_mb() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


@pytest.mark.parametrize("path", CRASHES, ids=[p.name[:16] for p in CRASHES])
def test_inputs_that_once_crashed_the_reader_are_typed_errors_now(path):
    exercise(path.read_bytes())  # only RaseErrors, handled inside: anything else fails here


def test_fuzzing_the_reader_finds_no_crash(tmp_path):
    corpus, artifacts = tmp_path / "corpus", tmp_path / "artifacts"
    corpus.mkdir()
    artifacts.mkdir()
    for i, data in enumerate(seeds()):
        (corpus / f"seed{i}.gguf").write_bytes(data)
    for p in CRASHES:
        (corpus / p.name).write_bytes(p.read_bytes())
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "support" / "fuzz_gguf.py"), str(corpus),
                          f"-max_total_time={SECONDS}", "-seed=1", f"-artifact_prefix={artifacts}/",
                          # libFuzzer's RSS is getrusage's peak, which Linux carries over exec from
                          # this (large) pytest process: the limit counts from there
                          f"-rss_limit_mb={_peak_rss_mb() + 2048}", "-malloc_limit_mb=2048",
                          "-print_final_stats=1"], capture_output=True, text=True, timeout=SECONDS + 120)
    found = sorted(artifacts.iterdir())
    assert out.returncode == 0 and not found, (
        f"the fuzzer found {[p.name for p in found]}: add them to tests/fixtures/gguf-crashes/\n{out.stderr[-4000:]}")
    runs = int(re.search(r"Done (\d+) runs", out.stderr)[1])
    print(f"\natheris: {runs} executions in {SECONDS} s, no crash, corpus {len(list(corpus.iterdir()))} inputs")
    assert runs > 20_000
