"""MoE decode: bytes of weights one decode step reads, measured from the page cache.

Weights live in two files: the GGUF (tensors read in place) and the pack cache (the repacked
16-row copies, rase/store/pack_cache.py, mapped by every load after the first; each load here is such
a second load). For each decode step both files' pages are dropped (MADV_DONTNEED on every
mapping of them in this process, found in /proc/self/maps, then POSIX_FADV_DONTNEED; readahead
off with MADV_RANDOM), one token is decoded, and mincore() says which pages the step brought
back: the bytes of each matrix lying in those pages are what it read. The expert matrices' share
should be close to n_expert_used / n_expert (plus the spill of pages shared with a neighbouring
expert); the dense part should be read whole.

Files: the MoE files llama.cpp's quantizer made (tests/fixtures/archs: three Q4_K_M, gpt-oss's
MXFP4), a larger synthetic olmoe file (8 experts of 1024 x 1024, 2 chosen) where pages spill
little, and any file given (benchmarks/gpt_oss_shape.py's gpt-oss-20b shape: 32 experts of
2880 x 2880, 4 chosen).

    python benchmarks/bench_moe.py [FILE.gguf ...] [--tokens N]
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
from rase.config import PACK_CACHE_ENV  # noqa: E402
from rase.engine.decoder import load_gguf_decoder  # noqa: E402
from rase.store.pack_cache import PackCache  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "archs"
MOE_FILES = ["llama-moe-tiny-q4_k_m", "qwen3moe-tiny-q4_k_m", "olmoe-tiny-q4_k_m", "gpt-oss-tiny-mxfp4"]
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


class FileProbe:
    """Which pages of one file are in the page cache (through a mapping of our own), and dropping
    them from every mapping this process has of it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path).resolve()
        with open(self.path, "rb") as f:
            self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.base = np.frombuffer(self.mm, dtype=np.uint8).ctypes.data
        self.size, self.page = len(self.mm), mmap.PAGESIZE
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    def _mappings(self) -> list[tuple[int, int]]:
        with open("/proc/self/maps") as f:
            rows = [line.split(maxsplit=5) for line in f]
        return [tuple(int(x, 16) for x in r[0].split("-")) for r in rows
                if len(r) == 6 and r[5].strip() == str(self.path)]

    def drop(self) -> None:
        for lo, hi in self._mappings():
            self.libc.madvise(lo, hi - lo, mmap.MADV_RANDOM)  # a fault reads its page only
            if self.libc.madvise(lo, hi - lo, mmap.MADV_DONTNEED) != 0:
                raise OSError(ctypes.get_errno(), "madvise failed")
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)  # a file just written has dirty pages, which fadvise leaves cached
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        if self.resident().any():
            raise RuntimeError(f"{self.path.name}'s pages stayed cached (another process maps it?)")

    def resident(self) -> np.ndarray:
        n = -(-self.size // self.page)
        vec = (ctypes.c_ubyte * n)()
        if self.libc.mincore(ctypes.c_void_p(self.base), ctypes.c_size_t(self.size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return np.frombuffer(vec, np.uint8) & 1

    def bytes_read(self, res: np.ndarray, off: int, size: int) -> int:
        """Bytes of [off, off + size) of the file lying in resident pages."""
        P = self.page
        pages = np.arange(off // P, -(-(off + size) // P))
        lo, hi = np.maximum(pages * P, off), np.minimum((pages + 1) * P, off + size)
        return int(((hi - lo) * res[pages]).sum())


def _offset(view: np.ndarray, mapping: mmap.mmap) -> int:
    return view.ctypes.data - np.frombuffer(mapping, dtype=np.uint8).ctypes.data


def measure(path: Path, n_tokens: int = 8) -> tuple[list[StepReads], int, int]:
    """Per decode step the bytes read; also (n_expert_used, n_expert). Loads twice with a
    private pack cache so the second load maps the repacked matrices, as later loads do."""
    with tempfile.TemporaryDirectory(dir=ROOT) as cache_dir:  # on disk: tmpfs pages cannot be dropped
        old = os.environ.get(PACK_CACHE_ENV)
        os.environ[PACK_CACHE_ENV] = cache_dir
        try:
            return _measure(path, n_tokens)
        finally:
            os.environ.pop(PACK_CACHE_ENV) if old is None else os.environ.__setitem__(PACK_CACHE_ENV, old)


def _measure(path: Path, n_tokens: int) -> tuple[list[StepReads], int, int]:
    first = load_gguf_decoder(None, path, n_threads=1)
    cache = PackCache(first.gguf.path)
    deadline = time.monotonic() + 600  # a 20B file's 10 GB of repacked experts take ~20 s
    while (packed := cache.load()) is None:  # the first load writes it in the background
        if time.monotonic() > deadline:
            raise RuntimeError("the pack cache was not written")
        time.sleep(0.05)
    del first
    dec = load_gguf_decoder(None, path, n_threads=1)
    gprobe, cprobe = FileProbe(dec.gguf.path), FileProbe(cache.path)
    # (probe, offset, bytes, is_expert) of every matrix: repacked ones in the cache, the rest in place
    gbase = np.frombuffer(dec.gguf._mmap, dtype=np.uint8).ctypes.data
    exps = [(t.data.ctypes.data - gbase, t.data.size) for n, t in dec.gguf.tensors.items() if "_exps." in n]
    mats = [(cprobe, _offset(a, cache._mmap), a.size, ".exp" in n) for n, a in packed.items()]
    for d in dec.plan.weights.streamed:  # matrices read in place from the GGUF (row views of it)
        off = d.ctypes.data - gbase
        mats.append((gprobe, off, d.size, any(lo <= off < lo + size for lo, size in exps)))
    if not any(m[3] for m in mats):
        raise SystemExit(f"{path.name} has no expert tensors")
    tok = int(np.argmax(dec.prefill([5, 9, 33, 77, 100, 3, 4])))
    steps = []
    for _ in range(n_tokens):
        gprobe.drop(), cprobe.drop()
        t0 = time.perf_counter()
        tok = int(np.argmax(dec.decode(tok)))
        seconds = time.perf_counter() - t0
        res = {gprobe: gprobe.resident(), cprobe: cprobe.resident()}
        read = [(p.bytes_read(res[p], off, size), size, e) for p, off, size, e in mats]
        steps.append(StepReads(sum(r for r, _, e in read if e), sum(s for _, s, e in read if e),
                               sum(r for r, _, e in read if not e), sum(s for _, s, e in read if not e), seconds))
    return steps, dec.hparams.n_expert_used, dec.hparams.n_expert


def large_file(directory: Path) -> Path:
    from tests.support.tinymodels import write_tiny_model

    return write_tiny_model(directory / "olmoe-large-q4_k.gguf", "olmoe", QuantType.Q4_K, hp=LARGE)


def report(name: str, steps: list[StepReads], used: int, n_expert: int) -> str:
    share = np.array([s.expert_share for s in steps])
    return (f"{name:28s} experts {used}/{n_expert} (routed share {used / n_expert:.3f}): expert bytes read "
            f"{share.mean():.3f} of {steps[0].expert_total / 1e6:.2f} MB (min {share.min():.3f}, max "
            f"{share.max():.3f}); dense part {np.mean([s.dense_share for s in steps]):.3f} of "
            f"{steps[0].dense_total / 1e6:.2f} MB; per token {np.mean([s.expert_bytes + s.dense_bytes for s in steps]) / 1e6:.2f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--tokens", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:  # on disk: tmpfs pages cannot be dropped
        files = [(n, FIXTURES / f"{n}.gguf") for n in MOE_FILES] + \
            [("olmoe-large-q4_k (synthetic)", large_file(Path(tmp)))] + [(Path(f).stem, Path(f)) for f in args.files]
        for name, path in files:
            print(report(name, *measure(path, args.tokens)), flush=True)


if __name__ == "__main__":
    main()
