"""benchmarks/bench_moe.py measures, from the page cache, the weight bytes one MoE decode step
reads: the chosen experts' share, not all of them, and the dense part whole."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_moe  # noqa: E402


@pytest.mark.parametrize("name", bench_moe.MOE_FILES)
def test_tiny_moe_files_read_the_routed_share(name):
    steps, used, n_expert = bench_moe.measure(bench_moe.FIXTURES / f"{name}.gguf", n_tokens=4)
    for s in steps:  # 2 of 4 experts; 9-13 pages per expert matrix, so page spill adds a few %
        assert used / n_expert <= s.expert_share <= used / n_expert + 0.07, s
        assert s.dense_share >= 0.95, s


def test_large_moe_file_reads_the_routed_share():
    import tempfile

    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:  # on disk (tmpfs pages cannot be dropped)
        steps, used, n_expert = bench_moe.measure(bench_moe.large_file(Path(tmp)), n_tokens=4)
    print(bench_moe.report("olmoe-large-q4_k", steps, used, n_expert))
    for s in steps:  # 2 of 8 experts of 144 pages each
        assert abs(s.expert_share - used / n_expert) <= 0.01, s
        assert s.dense_share >= 0.95, s
