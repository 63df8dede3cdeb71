"""`rase model convert` against llama.cpp's quantizer at a real model's shape: a random-weight BF16
checkpoint of Qwen3-1.7B's shape (28 layers, 2048 hidden, 16/8 heads x 128, FFN 6144, 151,936
vocabulary, tied; 3.4 GB of safetensors in 2 shards) converted to --type by rase, and the same
weights as a BF16 GGUF quantized by llama-quantize, both on --threads; wall time and peak RSS of
each (a subprocess each, getrusage's ru_maxrss), and whether the tensors are byte-identical.

usage: python benchmarks/bench_convert.py LLAMA_QUANTIZE [--dir /tmp/bench-convert] [--type Q4_K_M]
       [--threads 2] [--shape qwen3-1.7b]
LLAMA_QUANTIZE: a llama.cpp build's llama-quantize (b11434: ../shared/tools/build-anchors.sh's tree)
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.hf_checkpoints import SHAPES, write_sized_checkpoint  # noqa: E402
def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of a child process."""
    code = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "r = subprocess.run(sys.argv[1:]); w = time.perf_counter() - t; "
            "print(w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024); sys.exit(r.returncode)")
    out = subprocess.run([sys.executable, "-c", code, *cmd], check=True, capture_output=True, text=True)
    wall, rss = out.stdout.split()[-2:]
    return float(wall), float(rss)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("llama_quantize")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/bench-convert"))
    ap.add_argument("--type", default="Q4_K_M")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shape", default="qwen3-1.7b", choices=SHAPES)
    a = ap.parse_args()
    src, store = a.dir / a.shape, a.dir / "store"
    if not (src / "model.safetensors.index.json").exists():
        t = time.perf_counter()
        write_sized_checkpoint(src, SHAPES[a.shape])
        print(f"wrote {src} in {time.perf_counter() - t:.0f} s")
    size = sum(f.stat().st_size for f in src.glob("*.safetensors"))
    rase = [sys.executable, "-m", "rase", "model", "convert", str(src), "--store", str(store), "-t", str(a.threads)]
    subprocess.run(rase + ["--id", "bench-bf16", "--type", "BF16"], check=True, capture_output=True)
    bf16 = _weights(store, "bench-bf16")
    for f in src.glob("*.safetensors"):  # both runs start from warm caches of their inputs
        f.read_bytes()
    lq_out = a.dir / f"llama-{a.type}.gguf"
    lq_wall, lq_rss = timed([a.llama_quantize, str(bf16), str(lq_out), a.type, str(a.threads)])
    rase_wall, rase_rss = timed(rase + ["--id", f"bench-{a.type.lower()}", "--type", a.type])
    ours = _weights(store, f"bench-{a.type.lower()}")
    print(f"{a.shape} {size / 1e9:.2f} GB BF16 safetensors -> {a.type}, {a.threads} threads")
    print(f"  llama-quantize (from the BF16 GGUF): {lq_wall:6.1f} s, peak RSS {lq_rss:6.0f} MiB")
    print(f"  rase model convert (from safetensors, registered and verified): {rase_wall:6.1f} s, "
          f"peak RSS {rase_rss:6.0f} MiB")
    print(f"  speed ratio (llama-quantize time / rase time): {lq_wall / rase_wall:.2f}x")
    print(f"  tensors byte-identical: {_same_tensors(ours, lq_out)}")


def _weights(store: Path, model_id: str) -> Path:
    from rase.store.registry import ModelRegistry

    return Path(ModelRegistry(store).get(model_id).weights)


def _same_tensors(a: Path, b: Path) -> bool:
    from rase.store.gguf import GGUFFile

    x, y = GGUFFile(a), GGUFFile(b)
    return x.tensors.keys() == y.tensors.keys() and all(
        x.tensors[n].qtype == y.tensors[n].qtype and bytes(x.tensors[n].data) == bytes(y.tensors[n].data)
        for n in x.tensors)


if __name__ == "__main__":
    main()
