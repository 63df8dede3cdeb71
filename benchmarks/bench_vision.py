"""Image encoding speed at a realistic shape, beside llama.cpp's llama-mtmd-cli on the same files
and threads, in the same run: rase's encoder (ImageEncoder.embed: preprocessing included) and
llama.cpp's "mtmd batch encoding done in" figure (flash attention as it chooses: auto, on for CPU).

    python benchmarks/bench_vision.py --mtmd-cli PATH/llama-mtmd-cli [--shape gemma3-4b] [-t 2]

The files (benchmarks/vision_shape.py) are written once under --dir. Prints both times and the
ratio (llama.cpp / rase: above 1, rase is faster).
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import time
from pathlib import Path

from vision_shape import SHAPES, write_mmproj, write_text

IMAGE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "vision" / "tall.png"


def rase_encode(mmproj: Path, rounds: int) -> list[float]:
    """Seconds per encoding (numpy's BLAS takes the machine's cores: run with -t the core count)."""
    from rase.media.image import decode_image
    from rase.models.vision import load_encoder
    from rase.store.gguf import GGUFFile

    with GGUFFile(mmproj) as g:
        _, enc = load_encoder(g)
    image = decode_image(IMAGE.read_bytes())
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        enc.embed(image)
        out.append(time.perf_counter() - t)
    return out


def llamacpp_encode(cli: str, text: Path, mmproj: Path, threads: int, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        run = subprocess.run([cli, "-m", str(text), "--mmproj", str(mmproj), "--image", str(IMAGE), "-p", "Describe it.",
                              "-n", "1", "-t", str(threads), "--temp", "0", "--no-warmup", "--chat-template", "gemma"],
                             capture_output=True, text=True, timeout=3600)
        m = re.search(r"encoding done in (\d+) ms", run.stdout + run.stderr)
        if run.returncode or not m:
            raise SystemExit(f"llama-mtmd-cli failed: {(run.stdout + run.stderr)[-2000:]}")
        out.append(int(m.group(1)) / 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mtmd-cli", required=True)
    ap.add_argument("--shape", default="gemma3-4b", choices=SHAPES)
    ap.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "rase" / "vision-shapes")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    mmproj, text = a.dir / f"{a.shape}-mmproj.gguf", a.dir / f"{a.shape}-text.gguf"
    if not mmproj.exists():
        write_mmproj(mmproj, SHAPES[a.shape])
    if not text.exists():
        write_text(text, SHAPES[a.shape]["text"])
    ours, theirs = [], []
    for _ in range(a.rounds):  # alternating, so drift on a shared machine hits both
        ours += rase_encode(mmproj, 1)
        theirs += llamacpp_encode(a.mtmd_cli, text, mmproj, a.threads, 1)
    r, l = statistics.median(ours), statistics.median(theirs)
    print(f"{a.shape} encode, {a.threads} threads: rase {r:.1f} s, llama.cpp {l:.1f} s, ratio {l / r:.2f}")


if __name__ == "__main__":
    main()
