"""MoE decode: bytes of weights one decode step reads, measured from the page cache.

For each decode step the model file's pages are dropped (MADV_DONTNEED on rase's mapping, then
POSIX_FADV_DONTNEED, readahead off with MADV_RANDOM), one token is decoded, and mincore() says
which pages the step brought back: the bytes of each tensor lying in those pages are what it
read. The expert tensors' share should be close to n_expert_used / n_expert (plus the spill of
pages shared with a neighbouring expert); the dense part should be read whole.

Files: the three Q4_K_M MoE files llama.cpp's quantizer made (tests/fixtures/archs; Q4_K and
Q6_K are read in place, so their reads show in the page cache; repacked types would not), and a
larger synthetic olmoe file (8 experts of 1024 x 1024, 2 chosen) where pages spill little.

    python benchmarks/bench_moe.py [--tokens N]
"""
from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rase import QuantType  # noqa: E402
from rase.decoder import load_gguf_decoder  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "archs"
MOE_FILES = ["llama-moe-tiny-q4_k_m", "qwen3moe-tiny-q4_k_m", "olmoe-tiny-q4_k_m"]
LARGE = dict(n_embd=1024, n_head=8, n_head_kv=8, head_dim=128, n_ff=1024, n_expert=8, n_expert_used=2,
             n_ff_exp=1024)


@dataclass
class StepReads:
    expert_bytes: int      # bytes of expert tensors in pages the step read
    expert_total: int
    dense_bytes: int       # the same for every other tensor but the embedding table
    dense_total: int
    seconds: float

    @property
    def expert_share(self) -> float:
        return self.expert_bytes / self.expert_total

    @property
    def dense_share(self) -> float:
        return self.dense_bytes / self.dense_total


class PageProbe:
    """Which pages of a decoder's GGUF mapping are in the page cache, and dropping them."""

    def __init__(self, dec) -> None:
        self.g, self.mm = dec.gguf, dec.gguf._mmap
        self.base = np.frombuffer(self.mm, dtype=np.uint8).ctypes.data
        self.size, self.page = len(self.mm), mmap.PAGESIZE
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.mm.madvise(mmap.MADV_RANDOM)  # a fault reads its page only (no read-around)

    def drop(self) -> None:
        self.mm.madvise(mmap.MADV_DONTNEED, 0, self.size)
        fd = os.open(self.g.path, os.O_RDONLY)
        try:
            os.fsync(fd)  # a file just written has dirty pages, which fadvise leaves cached
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        if self.resident().any():
            raise RuntimeError("the file's pages stayed cached (another process maps it?)")

    def resident(self) -> np.ndarray:
        n = -(-self.size // self.page)
        vec = (ctypes.c_ubyte * n)()
        if self.libc.mincore(ctypes.c_void_p(self.base), ctypes.c_size_t(self.size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return np.frombuffer(vec, np.uint8) & 1

    def bytes_read(self, res: np.ndarray, data: np.ndarray) -> int:
        """Bytes of `data` (a view into the mapping) lying in resident pages."""
        off, P = data.ctypes.data - self.base, self.page
        pages = np.arange(off // P, -(-(off + data.size) // P))
        lo, hi = np.maximum(pages * P, off), np.minimum((pages + 1) * P, off + data.size)
        return int(((hi - lo) * res[pages]).sum())


def measure(path: Path, n_tokens: int = 8) -> tuple[list[StepReads], int, int]:
    """Per decode step the bytes read; also (n_expert_used, n_expert)."""
    dec = load_gguf_decoder(None, path, n_threads=1)
    probe = PageProbe(dec)
    tensors = {n: t for n, t in dec.gguf.tensors.items() if n != "token_embd.weight"}
    experts = [t for n, t in tensors.items() if "_exps." in n]
    dense = [t for n, t in tensors.items() if "_exps." not in n]
    if not experts:
        raise SystemExit(f"{path.name} has no expert tensors")
    tok = int(np.argmax(dec.prefill([5, 9, 33, 77, 100, 3, 4])))
    steps = []
    for _ in range(n_tokens):
        probe.drop()
        t0 = time.perf_counter()
        tok = int(np.argmax(dec.decode(tok)))
        seconds = time.perf_counter() - t0
        res = probe.resident()
        steps.append(StepReads(sum(probe.bytes_read(res, t.data) for t in experts), sum(t.data.size for t in experts),
                               sum(probe.bytes_read(res, t.data) for t in dense), sum(t.data.size for t in dense),
                               seconds))
    return steps, dec.hparams.n_expert_used, dec.hparams.n_expert


def large_file(directory: Path) -> Path:
    from tests.tinymodels import write_tiny_model

    return write_tiny_model(directory / "olmoe-large-q4_k.gguf", "olmoe", QuantType.Q4_K, hp=LARGE)


def report(name: str, steps: list[StepReads], used: int, n_expert: int) -> str:
    share = np.array([s.expert_share for s in steps])
    return (f"{name:28s} experts {used}/{n_expert} (routed share {used / n_expert:.3f}): expert bytes read "
            f"{share.mean():.3f} of {steps[0].expert_total / 1e6:.2f} MB (min {share.min():.3f}, max "
            f"{share.max():.3f}); dense part {np.mean([s.dense_share for s in steps]):.3f} of "
            f"{steps[0].dense_total / 1e6:.2f} MB; per token {np.mean([s.expert_bytes + s.dense_bytes for s in steps]) / 1e6:.2f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:  # on disk: tmpfs pages cannot be dropped
        for name, path in [(n, FIXTURES / f"{n}.gguf") for n in MOE_FILES] + [("olmoe-large-q4_k (synthetic)", large_file(Path(tmp)))]:
            print(report(name, *measure(path, args.tokens)))


if __name__ == "__main__":
    main()
