"""benchmarks/bench_vision.py and benchmarks/vision_shape.py keep working: the shape writer makes an mmproj
and text pair that rase loads and encodes with (a small shape here; the real one is 850 MB)."""
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_vision  # noqa: E402
import vision_shape  # noqa: E402

SMALL = dict(S=56, P=14, D=32, L=2, H=2, F=64, text=256, pool=2)


def test_the_shape_writer_makes_a_pair_rase_encodes_with(tmp_path):
    mmproj, text = tmp_path / "mm.gguf", tmp_path / "text.gguf"
    vision_shape.write_mmproj(mmproj, SMALL)
    vision_shape.write_text(text, SMALL["text"])
    from rase.store.registry import check_mmproj_pair

    check_mmproj_pair(text, mmproj, "small")  # the text model takes the projector's width
    times = bench_vision.rase_encode(mmproj, 2)
    assert len(times) == 2 and min(times) > 0
    from rase.models.vision import load_encoder
    from rase.store.gguf import GGUFFile

    with GGUFFile(mmproj) as g:
        _, enc = load_encoder(g)
    from rase.media.image import decode_image

    rows = enc.embed(decode_image(bench_vision.IMAGE.read_bytes()))
    assert rows.shape == ((56 // 14 // 2) ** 2, 256) and np.isfinite(rows).all()
